/* tbe.c: embedding collections (table-batched embeddings).  Construction and the batched
 * storage with its per-table views, the checks of every call, the CPU backend's forward and
 * backward (the reference the CUDA kernels match), and the dispatch to the CUDA backend.
 *
 * Tables of one placement and dtype share one storage (one allocation), each at an aligned
 * element offset; optimizer state (always f32) likewise per placement.  The kernels see
 * every table through a descriptor array, so one launch serves all of them.  Backward sorts
 * (row key, value index) pairs: each distinct row then sums its contributions in value order
 * and is stepped once, which makes updates exact and the result the same on every run. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "embedding/tbe.h"
#include "embedding/cache.h"
#include "embedding/tbe_stats.h"

#define ALIGN_BYTES 256 /* each table and state block starts on this boundary */
#define NDT 3           /* storage dtypes: f32, bf16, f16 (their enum values 0..2) */

struct ur_tbe {
  ur_tbe_config cfg;
  int32_t T, F;
  ur_tbe_table_config *tc;  /* names owned */
  char **fnames;
  ur__tbe_table *tables;    /* with pointers into the storages */
  ur__tbe_feature *features;
  ur_tensor *wstore[UR_PLACE_COUNT][NDT];
  ur_tensor *sstore[UR_PLACE_COUNT];
  int64_t *woff, *soff;     /* element offsets of each table and of its state */
  int32_t *splace;
  int32_t nstate;           /* state tensors per table */
  int64_t out_dim, total_keys;
  int32_t pooled, dim, key_bits, gpu;
  int64_t step;
  ur_tensor *desc;          /* GPU: the descriptors in device memory */
  ur_tensor *callbuf;       /* GPU: one call's VBE arrays */
  ur_tensor *work;          /* GPU: workspace, grown on demand */
  ur_tensor *flags;         /* i64 [2]: first bad value index, ids skipped */
  struct ur_cache **cache_of; /* per table: the software cache serving it, or NULL (cache.c) */
  /* per table, NULL until used (engine/src/tbe_stats.c): access counters i32 [rows] and the
   * row permutation i64 [rows], where the collection runs */
  ur_tensor **counts, **perm;
  uint64_t *perm_gen;       /* per table: bumped whenever its permutation changes */
  struct ur__tbe_pages *pages; /* page prefetch state of managed tables (tbe_pages.c), or NULL */
};

static const char *state_names[UR_TBE_OPTIM_COUNT][2] = {
    {NULL, NULL}, {"sum", NULL}, {"sum", NULL}, {"exp_avg", "exp_avg_sq"}};

size_t ur_sizeof_tbe_table_config(void) { return sizeof(ur_tbe_table_config); }
size_t ur_sizeof_tbe_config(void) { return sizeof(ur_tbe_config); }

static const char *pooling_name(int32_t p) {
  return p == UR_POOLING_SUM ? "sum" : p == UR_POOLING_MEAN ? "mean" : "none";
}

static char *dup(const char *s, const char *fallback, int i) {
  char buf[32];
  if (!s) {
    snprintf(buf, sizeof buf, "%s%d", fallback, i);
    s = buf;
  }
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

static int64_t align_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

/* ---- construction ---- */

static ur_status check_config(const ur_tbe_config *c) {
  if (c->device >= 0 && c->device >= ur_device_count())
    return ur__error(ur_device_count() ? UR_STATUS_INVALID : UR_STATUS_UNSUPPORTED,
                     "tbe: device %d asked, but %d GPUs are in use%s%s", (int)c->device,
                     ur_device_count(), ur_device_count() ? "" : ": ", ur_cuda_error());
  if (c->device < -1)
    return ur__error(UR_STATUS_INVALID, "tbe: device %d; expected -1 (the CPU) or a GPU",
                     (int)c->device);
  if ((unsigned)c->optim >= UR_TBE_OPTIM_COUNT)
    return ur__error(UR_STATUS_INVALID, "tbe: optimizer %d is not sgd, rowwise_adagrad, "
                                        "adagrad or adam", (int)c->optim);
  if ((unsigned)c->bounds >= UR_TBE_BOUNDS_COUNT)
    return ur__error(UR_STATUS_INVALID, "tbe: bounds check %d is not fatal, warn or off",
                     (int)c->bounds);
  if (!(isfinite(c->lr) && c->lr >= 0))
    return ur__error(UR_STATUS_INVALID, "tbe: learning rate %g; expected a finite value >= 0", c->lr);
  if (!(isfinite(c->weight_decay) && c->weight_decay >= 0))
    return ur__error(UR_STATUS_INVALID, "tbe: weight decay %g; expected a finite value >= 0",
                     c->weight_decay);
  if (!(isfinite(c->max_grad) && c->max_grad >= 0))
    return ur__error(UR_STATUS_INVALID,
                     "tbe: max_grad %g; expected a finite value >= 0 (0: no clipping)", c->max_grad);
  if (c->optim != UR_TBE_OPTIM_SGD && !(isfinite(c->eps) && c->eps > 0))
    return ur__error(UR_STATUS_INVALID, "tbe: eps %g; expected a finite value > 0", c->eps);
  if (c->optim == UR_TBE_OPTIM_ADAM &&
      !(c->beta1 >= 0 && c->beta1 < 1 && c->beta2 >= 0 && c->beta2 < 1))
    return ur__error(UR_STATUS_INVALID, "tbe: Adam betas %g, %g; expected each in [0, 1)",
                     c->beta1, c->beta2);
  if (c->out_dtype != UR_DTYPE_F32 && c->out_dtype != UR_DTYPE_BF16)
    return ur__error(UR_STATUS_INVALID, "tbe: output dtype '%s'; expected f32 or bf16",
                     (unsigned)c->out_dtype < UR_DTYPE_COUNT ? ur_dtype_name(c->out_dtype) : "?");
  return UR_STATUS_OK;
}

static ur_status check_table(const ur_tbe_config *c, const ur_tbe_table_config *tc,
                             const char *name) {
  if (tc->rows < 1)
    return ur__error(UR_STATUS_INVALID, "tbe: table '%s' has %lld rows; expected 1 or more",
                     name, (long long)tc->rows);
  if (tc->dim < 4 || tc->dim > UR_TBE_MAX_DIM || tc->dim % 4)
    return ur__error(UR_STATUS_INVALID,
                     "tbe: table '%s' has dim %d; expected a multiple of 4 from 4 to %d", name,
                     (int)tc->dim, UR_TBE_MAX_DIM);
  if (tc->dtype != UR_DTYPE_F32 && tc->dtype != UR_DTYPE_F16 && tc->dtype != UR_DTYPE_BF16)
    return ur__error(UR_STATUS_INVALID, "tbe: table '%s' stores '%s'; expected f32, f16 or bf16",
                     name, (unsigned)tc->dtype < UR_DTYPE_COUNT ? ur_dtype_name(tc->dtype) : "?");
  if ((unsigned)tc->pooling >= UR_POOLING_COUNT)
    return ur__error(UR_STATUS_INVALID, "tbe: table '%s' pooling %d is not sum, mean or none",
                     name, (int)tc->pooling);
  int32_t places[2] = {tc->place, tc->state_place < 0 ? (int32_t)tc->place : tc->state_place};
  for (int k = 0; k < 2; k++) {
    const char *what = k ? "its optimizer state" : "placement";
    if (places[k] != UR_PLACE_DEVICE && places[k] != UR_PLACE_MANAGED &&
        places[k] != UR_PLACE_HOST && places[k] != UR_PLACE_PINNED)
      return ur__error(UR_STATUS_INVALID,
                       "tbe: table '%s' %s %d is not device, managed or host", name, what,
                       (int)places[k]);
    if (places[k] == UR_PLACE_DEVICE && c->device < 0)
      return ur__error(UR_STATUS_INVALID,
                       "tbe: table '%s' %s 'device' needs the collection on a GPU, and it runs "
                       "on the CPU (device -1)",
                       name, what);
  }
  if ((uint64_t)tc->rows > ((uint64_t)1 << 50) / (uint64_t)tc->dim)
    return ur__error(UR_STATUS_INVALID, "tbe: table '%s' of %lld rows x %d is too large", name,
                     (long long)tc->rows, (int)tc->dim);
  return UR_STATUS_OK;
}

/* Host tables live in pinned memory when a GPU runs the collection: it reads them in place. */
static ur_place storage_place(const ur_tbe *t, int32_t place) {
  if (place == UR_PLACE_HOST || place == UR_PLACE_PINNED)
    return t->gpu ? UR_PLACE_PINNED : UR_PLACE_HOST;
  return (ur_place)place;
}

static int32_t storage_device(const ur_tbe *t, ur_place place) {
  if (place == UR_PLACE_HOST || place == UR_PLACE_PINNED) return UR_LOC_CPU;
  return t->gpu ? t->cfg.device : (place == UR_PLACE_MANAGED ? UR_LOC_CPU : 0);
}

static ur_status alloc_storages(ur_tbe *t) {
  int64_t wsize[UR_PLACE_COUNT][NDT] = {{0}}, ssize[UR_PLACE_COUNT] = {0};
  int32_t mult = t->cfg.optim == UR_TBE_OPTIM_ADAM ? 2 : 1;
  for (int32_t i = 0; i < t->T; i++) {
    const ur_tbe_table_config *c = &t->tc[i];
    ur_place wp = storage_place(t, c->place);
    ur_place sp = storage_place(t, c->state_place < 0 ? (int32_t)c->place : c->state_place);
    t->splace[i] = sp;
    int64_t es = (int64_t)ur_dtype_size(c->dtype);
    t->woff[i] = wsize[wp][c->dtype];
    wsize[wp][c->dtype] = align_up(t->woff[i] + c->rows * c->dim, ALIGN_BYTES / es);
    t->soff[i] = ssize[sp];
    int64_t per = t->cfg.optim == UR_TBE_OPTIM_ROWWISE_ADAGRAD ? c->rows : c->rows * c->dim;
    if (t->nstate) ssize[sp] = align_up(t->soff[i] + mult * align_up(per, ALIGN_BYTES / 4),
                                        ALIGN_BYTES / 4);
  }
  ur_status st;
  for (int p = 0; p < UR_PLACE_COUNT; p++) {
    for (int d = 0; d < NDT; d++) {
      if (!wsize[p][d]) continue;
      if ((st = ur_tensor_new(&t->wstore[p][d], (ur_dtype)d, 1, &wsize[p][d], (ur_place)p,
                              storage_device(t, (ur_place)p))))
        return st;
    }
    if (ssize[p]) {
      if ((st = ur_tensor_new(&t->sstore[p], UR_DTYPE_F32, 1, &ssize[p], (ur_place)p,
                              storage_device(t, (ur_place)p))) ||
          (st = ur_tensor_fill(NULL, t->sstore[p], 0)))
        return st;
    }
  }
  int64_t key = 0;
  for (int32_t i = 0; i < t->T; i++) {
    const ur_tbe_table_config *c = &t->tc[i];
    ur__tbe_table *d = &t->tables[i];
    ur_tensor *w = t->wstore[storage_place(t, c->place)][c->dtype];
    d->weights = (char *)ur_tensor_data(w) + (size_t)t->woff[i] * ur_dtype_size(c->dtype);
    if (t->nstate) {
      float *s = (float *)ur_tensor_data(t->sstore[t->splace[i]]) + t->soff[i];
      int64_t per = t->cfg.optim == UR_TBE_OPTIM_ROWWISE_ADAGRAD ? c->rows : c->rows * c->dim;
      d->state1 = s;
      d->state2 = t->nstate > 1 ? s + align_up(per, ALIGN_BYTES / 4) : NULL;
    }
    d->rows = c->rows;
    d->key_base = key;
    key += c->rows;
    d->dim = c->dim;
    d->dtype = c->dtype;
    d->pooling = c->pooling;
    d->index = i;
  }
  t->total_keys = key;
  t->key_bits = 1;
  while (t->key_bits < 63 && ((uint64_t)1 << t->key_bits) <= (uint64_t)key) t->key_bits++;
  return UR_STATUS_OK;
}

/* Per-table seeds, so a table's numbers depend on neither its placement nor its neighbours. */
static uint64_t table_seed(uint64_t seed, int32_t table) {
  return seed ^ ((uint64_t)(table + 1) * 0xD1B54A32D192ED03ull);
}

static ur_status draw(ur_stream *s, ur_tbe *t, int32_t i, double lo, double hi, uint64_t seed) {
  const ur_tbe_table_config *c = &t->tc[i];
  ur_tensor *w = t->wstore[storage_place(t, c->place)][c->dtype];
  size_t n = (size_t)c->rows * (size_t)c->dim;
  uint64_t ts = table_seed(seed, i);
  void *dst = (char *)ur_tensor_data(w) + (size_t)t->woff[i] * ur_dtype_size(c->dtype);
  if (w->st->place == UR_PLACE_DEVICE)
    return ur__gpu()->rand(s ? s->handle : NULL, dst, c->dtype, n, 0,
                           UR_DIST_UNIFORM, lo, hi, ts);
  /* Managed tables are drawn on the host, so their pages start there (tensor.c does the same). */
  if (ur__gpu() && w->st->place != UR_PLACE_HOST) {
    ur_status st = ur__gpu()->device_sync();
    if (st) return st;
  }
  return ur__cpu()->rand(NULL, dst, c->dtype, n, 0, UR_DIST_UNIFORM, lo, hi, ts);
}

static ur_status upload(ur_tensor *dst, const void *src, size_t bytes) {
  return bytes ? ur__gpu()->copy(NULL, ur_tensor_data(dst), src, bytes) : UR_STATUS_OK;
}

static ur_status new_device_bytes(ur_tbe *t, ur_tensor **out, int64_t bytes) {
  return ur_tensor_new(out, UR_DTYPE_U8, 1, &bytes, UR_PLACE_DEVICE, t->cfg.device);
}

static ur_status prepare_device(ur_tbe *t) {
  size_t tb = sizeof(ur__tbe_table) * (size_t)t->T, fb = sizeof(ur__tbe_feature) * (size_t)t->F;
  ur_status st;
  if ((st = new_device_bytes(t, &t->desc, (int64_t)(align_up((int64_t)tb, 16) + fb))) ||
      (st = new_device_bytes(t, &t->callbuf, (int64_t)(3 * sizeof(int64_t) * (size_t)(t->F + 1)))))
    return st;
  if ((st = upload(t->desc, t->tables, tb))) return st;
  st = ur__gpu()->copy(NULL, (char *)ur_tensor_data(t->desc) + align_up((int64_t)tb, 16),
                       t->features, fb);
  if (!st) st = ur__gpu()->stream_sync(NULL);
  return st;
}

/* flags[0] = no bad id yet; with both, flags[1] (ids skipped) = 0 too. */
static ur_status reset_flags(ur_tbe *t, ur_stream *s, int both) {
  int64_t *f = ur_tensor_data(t->flags);
  if (!t->gpu) {
    f[0] = UR_TBE_NO_BAD;
    if (both) f[1] = 0;
    return UR_STATUS_OK;
  }
  void *sh = s ? s->handle : NULL;
  ur_status st = ur__gpu()->fill(sh, f, 1, 8, (uint64_t)UR_TBE_NO_BAD);
  if (!st && both) st = ur__gpu()->fill(sh, f + 1, 1, 8, 0);
  return st;
}

ur_status ur_tbe_new(ur_tbe **out, const ur_tbe_config *config, int32_t num_tables,
                     const ur_tbe_table_config *tables, int32_t num_features,
                     const int32_t *feature_table, const char *const *feature_names) {
  *out = NULL;
  ur_status st = check_config(config);
  if (st) return st;
  if (num_tables < 1 || num_features < 1)
    return ur__error(UR_STATUS_INVALID, "tbe: %d tables and %d features; expected at least one "
                                        "of each", (int)num_tables, (int)num_features);
  ur_tbe *t = calloc(1, sizeof *t);
  if (!t) return ur__error(UR_STATUS_OOM, "tbe: out of host memory");
  t->cfg = *config;
  t->T = num_tables;
  t->F = num_features;
  t->gpu = config->device >= 0;
  t->nstate = config->optim == UR_TBE_OPTIM_SGD ? 0 : config->optim == UR_TBE_OPTIM_ADAM ? 2 : 1;
  t->tc = calloc((size_t)num_tables, sizeof *t->tc);
  t->fnames = calloc((size_t)num_features, sizeof *t->fnames);
  t->tables = calloc((size_t)num_tables, sizeof *t->tables);
  t->features = calloc((size_t)num_features, sizeof *t->features);
  t->woff = calloc((size_t)num_tables, sizeof *t->woff);
  t->soff = calloc((size_t)num_tables, sizeof *t->soff);
  t->splace = calloc((size_t)num_tables, sizeof *t->splace);
  t->cache_of = calloc((size_t)num_tables, sizeof *t->cache_of);
  t->counts = calloc((size_t)num_tables, sizeof *t->counts);
  t->perm = calloc((size_t)num_tables, sizeof *t->perm);
  t->perm_gen = calloc((size_t)num_tables, sizeof *t->perm_gen);
  if (!t->tc || !t->fnames || !t->tables || !t->features || !t->woff || !t->soff || !t->splace ||
      !t->cache_of ||
      !t->counts || !t->perm || !t->perm_gen) {
    ur_tbe_free(t);
    return ur__error(UR_STATUS_OOM, "tbe: out of host memory");
  }
  for (int32_t i = 0; i < num_tables; i++) {
    t->tc[i] = tables[i];
    if (!(t->tc[i].name = dup(tables[i].name, "table", i))) {
      ur_tbe_free(t);
      return ur__error(UR_STATUS_OOM, "tbe: out of host memory");
    }
  }
  for (int32_t i = 0; i < num_tables && !st; i++) {
    st = check_table(config, &tables[i], t->tc[i].name);
    for (int32_t j = 0; j < i && !st; j++)
      if (!strcmp(t->tc[i].name, t->tc[j].name))
        st = ur__error(UR_STATUS_INVALID, "tbe: tables %d and %d are both named '%s'", (int)j,
                       (int)i, t->tc[i].name);
    if (!st && (tables[i].pooling == UR_POOLING_NONE) != (tables[0].pooling == UR_POOLING_NONE))
      st = ur__error(UR_STATUS_INVALID,
                     "tbe: table '%s' pools by %s but table '%s' by %s; a collection pools "
                     "all its tables (sum or mean) or none",
                     t->tc[i].name, pooling_name(tables[i].pooling), t->tc[0].name,
                     pooling_name(tables[0].pooling));
    if (!st && tables[0].pooling == UR_POOLING_NONE && tables[i].dim != tables[0].dim)
      st = ur__error(UR_STATUS_INVALID,
                     "tbe: pooling none needs one dim for all tables; '%s' has %d but '%s' has %d",
                     t->tc[i].name, (int)tables[i].dim, t->tc[0].name, (int)tables[0].dim);
  }
  for (int32_t f = 0; f < num_features && !st; f++) {
    if (!(t->fnames[f] = dup(feature_names ? feature_names[f] : NULL, "feature", f)))
      st = ur__error(UR_STATUS_OOM, "tbe: out of host memory");
    else if (feature_table[f] < 0 || feature_table[f] >= num_tables)
      st = ur__error(UR_STATUS_INVALID, "tbe: feature %d ('%s') maps to table %d; expected 0..%d",
                     (int)f, t->fnames[f], (int)feature_table[f], (int)num_tables - 1);
    for (int32_t g = 0; g < f && !st; g++)
      if (!strcmp(t->fnames[f], t->fnames[g]))
        st = ur__error(UR_STATUS_INVALID, "tbe: features %d and %d are both named '%s'", (int)g,
                       (int)f, t->fnames[f]);
  }
  if (st) {
    ur_tbe_free(t);
    return st;
  }
  t->pooled = tables[0].pooling != UR_POOLING_NONE;
  t->dim = tables[0].dim;
  for (int32_t f = 0; f < num_features; f++) {
    t->features[f].table = feature_table[f];
    t->features[f].dim = tables[feature_table[f]].dim;
    t->features[f].col = t->out_dim;
    t->out_dim += t->pooled ? tables[feature_table[f]].dim : 0;
  }
  if (!t->pooled) t->out_dim = t->dim;
  int64_t two = 2;
  if ((st = alloc_storages(t)) ||
      (st = ur_tensor_new(&t->flags, UR_DTYPE_I64, 1, &two,
                          t->gpu ? UR_PLACE_DEVICE : UR_PLACE_HOST,
                          t->gpu ? config->device : UR_LOC_CPU)) ||
      (st = reset_flags(t, NULL, 1))) {
    ur_tbe_free(t);
    return st;
  }
  for (int32_t i = 0; i < num_tables && !st; i++) {
    double b = 1.0 / sqrt((double)tables[i].rows);
    st = draw(NULL, t, i, -b, b, config->seed);
  }
  if (!st && t->gpu) st = prepare_device(t);
  if (st) {
    ur_tbe_free(t);
    return st;
  }
  *out = t;
  return UR_STATUS_OK;
}

void ur_tbe_free(ur_tbe *t) {
  if (!t) return;
  ur__tbe_pages_free(t->pages);
  for (int32_t i = 0; t->cache_of && i < t->T; i++)
    if (t->cache_of[i]) ur__cache_orphan(t->cache_of[i], t);
  free(t->cache_of);
  for (int p = 0; p < UR_PLACE_COUNT; p++) {
    for (int d = 0; d < NDT; d++) ur_tensor_free(t->wstore[p][d]);
    ur_tensor_free(t->sstore[p]);
  }
  ur_tensor_free(t->desc);
  ur_tensor_free(t->callbuf);
  ur_tensor_free(t->work);
  ur_tensor_free(t->flags);
  for (int32_t i = 0; t->counts && i < t->T; i++) ur_tensor_free(t->counts[i]);
  for (int32_t i = 0; t->perm && i < t->T; i++) ur_tensor_free(t->perm[i]);
  free(t->counts);
  free(t->perm);
  free(t->perm_gen);
  for (int32_t i = 0; t->tc && i < t->T; i++) free((char *)t->tc[i].name);
  for (int32_t f = 0; t->fnames && f < t->F; f++) free(t->fnames[f]);
  free(t->tc);
  free(t->fnames);
  free(t->tables);
  free(t->features);
  free(t->woff);
  free(t->soff);
  free(t->splace);
  free(t);
}

/* ---- accessors ---- */

int32_t ur_tbe_num_tables(const ur_tbe *t) { return t->T; }
int32_t ur_tbe_num_features(const ur_tbe *t) { return t->F; }
int32_t ur_tbe_device(const ur_tbe *t) { return t->cfg.device; }
int64_t ur_tbe_out_dim(const ur_tbe *t) { return t->out_dim; }
int64_t ur_tbe_feature_col(const ur_tbe *t, int32_t f) {
  return f >= 0 && f < t->F ? t->features[f].col : -1;
}
const char *ur_tbe_table_name(const ur_tbe *t, int32_t i) {
  return i >= 0 && i < t->T ? t->tc[i].name : NULL;
}
const char *ur_tbe_feature_name(const ur_tbe *t, int32_t f) {
  return f >= 0 && f < t->F ? t->fnames[f] : NULL;
}
int32_t ur_tbe_feature_table(const ur_tbe *t, int32_t f) {
  return f >= 0 && f < t->F ? t->features[f].table : -1;
}
int32_t ur_tbe_state_count(const ur_tbe *t) { return t->nstate; }
const char *ur_tbe_state_name(const ur_tbe *t, int32_t which) {
  return which >= 0 && which < t->nstate ? state_names[t->cfg.optim][which] : NULL;
}
double ur_tbe_lr(const ur_tbe *t) { return t->cfg.lr; }
int64_t ur_tbe_step(const ur_tbe *t) { return t->step; }

static ur_status check_table_index(const ur_tbe *t, int32_t i) {
  if (i < 0 || i >= t->T)
    return ur__error(UR_STATUS_INVALID, "tbe: table %d does not exist; expected 0..%d", (int)i,
                     (int)t->T - 1);
  return UR_STATUS_OK;
}

ur_status ur_tbe_table(const ur_tbe *t, int32_t i, ur_tensor **out) {
  *out = NULL;
  ur_status st = check_table_index(t, i);
  if (st) return st;
  const ur_tbe_table_config *c = &t->tc[i];
  int64_t shape[2] = {c->rows, c->dim};
  return ur_tensor_view_as(t->wstore[storage_place(t, c->place)][c->dtype], out, t->woff[i], 2,
                           shape);
}

ur_status ur_tbe_state(const ur_tbe *t, int32_t i, int32_t which, ur_tensor **out) {
  *out = NULL;
  ur_status st = check_table_index(t, i);
  if (st) return st;
  if (which < 0 || which >= t->nstate)
    return ur__error(UR_STATUS_INVALID, "tbe: optimizer state %d does not exist; this "
                                        "optimizer keeps %d per table", (int)which, (int)t->nstate);
  const ur_tbe_table_config *c = &t->tc[i];
  int rowwise = t->cfg.optim == UR_TBE_OPTIM_ROWWISE_ADAGRAD;
  int64_t shape[2] = {c->rows, c->dim};
  float *base = (float *)ur_tensor_data(t->sstore[t->splace[i]]);
  float *p = base + t->soff[i];
  if (which) p += align_up(rowwise ? c->rows : c->rows * c->dim, ALIGN_BYTES / 4);
  return ur_tensor_view_as(t->sstore[t->splace[i]], out, p - base, rowwise ? 1 : 2, shape);
}

ur_status ur_tbe_init_table(ur_stream *s, ur_tbe *t, int32_t i, double lo, double hi,
                            uint64_t seed) {
  ur_status st = check_table_index(t, i);
  if (st) return st;
  if (!isfinite(lo) || !isfinite(hi) || lo > hi)
    return ur__error(UR_STATUS_INVALID,
                     "tbe: init bounds [%g, %g) are not finite with low <= high", lo, hi);
  return draw(s, t, i, lo, hi, seed);
}

ur_status ur_tbe_set_lr(ur_tbe *t, double lr) {
  if (!(isfinite(lr) && lr >= 0))
    return ur__error(UR_STATUS_INVALID, "tbe: learning rate %g; expected a finite value >= 0", lr);
  t->cfg.lr = lr;
  return UR_STATUS_OK;
}

ur_status ur_tbe_set_out_dtype(ur_tbe *t, ur_dtype dtype) {
  if (dtype != UR_DTYPE_F32 && dtype != UR_DTYPE_BF16)
    return ur__error(UR_STATUS_INVALID, "tbe: output dtype '%s'; expected f32 or bf16",
                     (unsigned)dtype < UR_DTYPE_COUNT ? ur_dtype_name(dtype) : "?");
  t->cfg.out_dtype = dtype;
  return UR_STATUS_OK;
}

ur_status ur_tbe_set_step(ur_tbe *t, int64_t step) {
  if (step < 0)
    return ur__error(UR_STATUS_INVALID, "tbe: step %lld; expected >= 0", (long long)step);
  t->step = step;
  return UR_STATUS_OK;
}

ur_status ur_tbe_skipped(ur_tbe *t, int64_t *out) {
  return ur_tensor_read(t->flags, 1, 1, out);
}

/* ---- what tbe_stats.c reaches (tbe_stats.h) ---- */

ur__tbe_table *ur__tbe_desc(ur_tbe *t, int32_t i) { return &t->tables[i]; }
ur_tensor **ur__tbe_counts_slot(ur_tbe *t, int32_t i) { return &t->counts[i]; }
ur_tensor **ur__tbe_perm_slot(ur_tbe *t, int32_t i) { return &t->perm[i]; }
void ur__tbe_perm_changed(ur_tbe *t, int32_t i) { t->perm_gen[i]++; }
uint64_t ur__tbe_perm_gen(const ur_tbe *t, int32_t i) { return t->perm_gen[i]; }
int ur__tbe_is_cached(const ur_tbe *t, int32_t i) { return t->cache_of[i] != NULL; }
struct ur__tbe_pages **ur__tbe_pages_slot(ur_tbe *t) { return &t->pages; }

ur_status ur__tbe_sync_desc(ur_tbe *t) {
  if (!t->gpu) return UR_STATUS_OK;
  /* kernels in flight on any stream may be reading the descriptors */
  ur_status st = ur__gpu()->device_sync();
  if (!st) st = upload(t->desc, t->tables, sizeof(ur__tbe_table) * (size_t)t->T);
  return st ? st : ur__gpu()->stream_sync(NULL);
}

/* ---- software caches (engine/src/cache.c; cache.h says what each does) ---- */

ur_status ur__tbe_backing(const ur_tbe *t, int32_t i, ur__tbe_table *out, int32_t *place) {
  ur_status st = check_table_index(t, i);
  if (st) return st;
  const ur_tbe_table_config *c = &t->tc[i];
  ur_tensor *w = t->wstore[storage_place(t, c->place)][c->dtype];
  *out = t->tables[i];
  out->weights = (char *)ur_tensor_data(w) + (size_t)t->woff[i] * ur_dtype_size(c->dtype);
  out->rows = c->rows;
  out->state1 = out->state2 = NULL;
  if (t->nstate) {
    int64_t per = t->cfg.optim == UR_TBE_OPTIM_ROWWISE_ADAGRAD ? c->rows : c->rows * c->dim;
    out->state1 = (float *)ur_tensor_data(t->sstore[t->splace[i]]) + t->soff[i];
    out->state2 = t->nstate > 1 ? out->state1 + align_up(per, ALIGN_BYTES / 4) : NULL;
  }
  *place = storage_place(t, c->place);
  return UR_STATUS_OK;
}

ur_status ur__tbe_redirect(ur_tbe *t, int32_t i, struct ur_cache *owner, void *weights,
                           float *state1, float *state2, const int64_t *row_ids, int64_t rows) {
  ur_status st = check_table_index(t, i);
  if (st) return st;
  if (owner && t->cache_of[i] && t->cache_of[i] != owner)
    return ur__error(UR_STATUS_INVALID, "cache: table '%s' is already cached by another cache",
                     t->tc[i].name);
  if (owner && (t->tables[i].perm || t->tables[i].counts))
    return ur__error(UR_STATUS_INVALID,
                     "cache: table '%s' has a row permutation or access counters; a cached table "
                     "takes neither (the cache chooses where its rows live)",
                     t->tc[i].name);
  ur__tbe_table b;
  int32_t place;
  if (!owner) {
    ur__tbe_backing(t, i, &b, &place);
    weights = b.weights;
    state1 = b.state1;
    state2 = b.state2;
    rows = b.rows;
    row_ids = NULL;
  }
  /* kernels in flight may read the descriptors or the rows */
  if (t->gpu && (st = ur__gpu()->device_sync())) return st;
  t->cache_of[i] = owner;
  t->tables[i].weights = weights;
  t->tables[i].state1 = state1;
  t->tables[i].state2 = state2;
  t->tables[i].row_ids = row_ids;
  t->tables[i].rows = rows;
  int64_t key = 0;
  for (int32_t k = 0; k < t->T; k++) {
    t->tables[k].key_base = key;
    key += t->tables[k].rows;
  }
  t->total_keys = key;
  t->key_bits = 1;
  while (t->key_bits < 63 && ((uint64_t)1 << t->key_bits) <= (uint64_t)key) t->key_bits++;
  if (!t->gpu) return UR_STATUS_OK;
  if (!(st = upload(t->desc, t->tables, sizeof(ur__tbe_table) * (size_t)t->T)))
    st = ur__gpu()->stream_sync(NULL);
  return st;
}

const ur_tbe_config *ur__tbe_config(const ur_tbe *t) { return &t->cfg; }
const ur__tbe_feature *ur__tbe_features(const ur_tbe *t) { return t->features; }

/* ---- checking a call ---- */

/* One call's arguments, and the host arrays they point into. */
typedef struct call {
  ur__tbe_args a;
  int64_t *vbe;             /* host: bag_start [F + 1], out_base [F], flat_base [F] */
  const ur_tensor *values, *offsets;
  int64_t vbe_rows;         /* VBE: sum of batch_f * dim_f */
} call;

static int reachable(const ur_tbe *t, const ur_tensor *x) {
  ur_place p = ur_tensor_place(x);
  if (t->gpu) return p != UR_PLACE_HOST && (p != UR_PLACE_DEVICE || ur_tensor_device(x) == t->cfg.device);
  return p != UR_PLACE_DEVICE;
}

static ur_status check_tensor(const ur_tbe *t, const ur_tensor *x, const char *what, ur_dtype d,
                              int32_t ndim) {
  if (ur_tensor_dtype(x) != d || ur_tensor_ndim(x) != ndim)
    return ur__error(UR_STATUS_INVALID, "tbe: %s is %s with %d dimensions; expected %s with %d",
                     what, ur_dtype_name(ur_tensor_dtype(x)), (int)ur_tensor_ndim(x),
                     ur_dtype_name(d), (int)ndim);
  if (!reachable(t, x))
    return ur__error(UR_STATUS_INVALID,
                     "tbe: %s is in %s memory%s, which the collection's %s cannot read; move it "
                     "with :to()",
                     what, ur_place_name(ur_tensor_place(x)),
                     ur_tensor_place(x) == UR_PLACE_DEVICE ? " of another GPU" : "",
                     t->gpu ? "GPU" : "CPU");
  return UR_STATUS_OK;
}

static ur_status check_shape2(const ur_tensor *x, const char *what, int64_t r, int64_t c) {
  if (ur_tensor_ndim(x) != 2 || ur_tensor_dim(x, 0) != r || ur_tensor_dim(x, 1) != c)
    return ur__error(UR_STATUS_INVALID, "tbe: %s has shape [%lld%s%lld]; expected [%lld, %lld]",
                     what, (long long)ur_tensor_dim(x, 0), ur_tensor_ndim(x) > 1 ? ", " : " ",
                     (long long)(ur_tensor_ndim(x) > 1 ? ur_tensor_dim(x, 1) : 0), (long long)r,
                     (long long)c);
  return UR_STATUS_OK;
}

/* The checks forward and backward share; `o` is the output or its gradient. */
static ur_status prepare(ur_tbe *t, call *c, const ur_tensor *values, const ur_tensor *offsets,
                         const ur_tensor *weights, const int64_t *bpf, const ur_tensor *inverse,
                         const ur_tensor *o, const char *oname) {
  memset(c, 0, sizeof *c);
  ur__tbe_args *a = &c->a;
  ur_status st;
  if (!values || !offsets || !o)
    return ur__error(UR_STATUS_INVALID, "tbe: values, offsets and %s are required", oname);
  if ((st = check_tensor(t, values, "values", UR_DTYPE_I64, 1)) ||
      (st = check_tensor(t, offsets, "offsets", UR_DTYPE_I64, 1)) ||
      (weights && (st = check_tensor(t, weights, "weights", UR_DTYPE_F32, 1))) ||
      (inverse && (st = check_tensor(t, inverse, "inverse", UR_DTYPE_I64, ur_tensor_ndim(inverse)))))
    return st;
  if ((st = check_tensor(t, o, oname, t->cfg.out_dtype, ur_tensor_ndim(o)))) return st;
  if (t->gpu && (uintptr_t)ur_tensor_data(o) % 16)
    return ur__error(UR_STATUS_INVALID,
                     "tbe: %s starts %zu bytes past a 16-byte boundary (a view at an odd offset); "
                     "the GPU kernels move rows 16 bytes at a time",
                     oname, (size_t)((uintptr_t)ur_tensor_data(o) % 16));
  a->n = ur_tensor_numel(values);
  a->bags = ur_tensor_numel(offsets) - 1;
  if (a->bags < 0)
    return ur__error(UR_STATUS_INVALID, "tbe: offsets is empty; expected bags + 1 entries");
  if (weights && ur_tensor_numel(weights) != a->n)
    return ur__error(UR_STATUS_INVALID, "tbe: %lld weights for %lld values; expected one each",
                     (long long)ur_tensor_numel(weights), (long long)a->n);
  if (t->gpu && (a->n >= INT32_MAX || a->bags >= INT32_MAX))
    return ur__error(UR_STATUS_INVALID,
                     "tbe: %lld values in %lld bags; the GPU path takes fewer than 2^31 of each",
                     (long long)a->n, (long long)a->bags);
  c->values = values;
  c->offsets = offsets;
  a->num_tables = t->T;
  a->num_features = t->F;
  a->bounds = t->cfg.bounds;
  a->pooled = t->pooled;
  a->dim = t->dim;
  a->out_dtype = t->cfg.out_dtype;
  a->total_keys = t->total_keys;
  a->key_bits = t->key_bits;
  a->values = ur_tensor_data(values);
  a->offsets = ur_tensor_data(offsets);
  a->weights = weights ? ur_tensor_data(weights) : NULL;
  a->flags = ur_tensor_data(t->flags);
  a->out_stride = t->out_dim;
  if (inverse && !bpf)
    return ur__error(UR_STATUS_INVALID,
                     "tbe: inverse indices given without batch_per_feature (VBE needs both)");
  if (inverse && !t->pooled)
    return ur__error(UR_STATUS_INVALID, "tbe: pooling none takes no inverse indices");
  if (bpf) {
    c->vbe = malloc(sizeof(int64_t) * (3 * (size_t)t->F + 1));
    if (!c->vbe) return ur__error(UR_STATUS_OOM, "tbe: out of host memory");
    int64_t *bs = c->vbe, *ob = c->vbe + t->F + 1;
    bs[0] = 0;
    for (int32_t f = 0; f < t->F; f++) {
      if (bpf[f] < 0)
        return ur__error(UR_STATUS_INVALID, "tbe: feature '%s' has batch %lld; expected >= 0",
                         t->fnames[f], (long long)bpf[f]);
      bs[f + 1] = bs[f] + bpf[f];
      ob[f] = c->vbe_rows;
      c->vbe_rows += bpf[f] * t->features[f].dim;
    }
    if (bs[t->F] != a->bags)
      return ur__error(UR_STATUS_INVALID,
                       "tbe: batch_per_feature sums to %lld bags but offsets hold %lld",
                       (long long)bs[t->F], (long long)a->bags);
    memcpy(ob + t->F, ob, sizeof(int64_t) * (size_t)t->F);
    a->bag_start = bs;
  } else {
    if (a->bags % t->F)
      return ur__error(UR_STATUS_INVALID,
                       "tbe: %lld bags do not split evenly over %d features; pass "
                       "batch_per_feature for a variable batch",
                       (long long)a->bags, (int)t->F);
    a->batch = a->bags / t->F;
  }
  if (!t->pooled) return check_shape2(o, oname, a->n, t->dim);
  if (inverse) {
    int64_t m = ur_tensor_numel(inverse);
    if (m % t->F)
      return ur__error(UR_STATUS_INVALID,
                       "tbe: %lld inverse indices do not split evenly over %d features",
                       (long long)m, (int)t->F);
    a->full_batch = m / t->F;
    a->inverse = ur_tensor_data(inverse);
    a->flat_base = c->vbe + 2 * t->F + 1;
    a->flat_numel = c->vbe_rows;
    return check_shape2(o, oname, a->full_batch, t->out_dim);
  }
  if (bpf) {
    a->out_base = c->vbe + t->F + 1;
    if (ur_tensor_ndim(o) != 1 || ur_tensor_numel(o) != c->vbe_rows)
      return ur__error(UR_STATUS_INVALID,
                       "tbe: %s holds %lld elements in %d dimensions; a VBE batch without "
                       "inverse indices gives a flat [%lld]",
                       oname, (long long)ur_tensor_numel(o), (int)ur_tensor_ndim(o),
                       (long long)c->vbe_rows);
    return UR_STATUS_OK;
  }
  return check_shape2(o, oname, a->batch, t->out_dim);
}

static void release(call *c) { free(c->vbe); }

/* Offsets must start at 0, never decrease and end at n; checked where the CPU can read them. */
static ur_status check_offsets(const ur_tbe *t, const call *c) {
  const int64_t *o = c->a.offsets;
  if (o[0] != 0)
    return ur__error(UR_STATUS_INVALID, "tbe: offsets[0] is %lld; expected 0", (long long)o[0]);
  for (int64_t b = 0; b < c->a.bags; b++)
    if (o[b + 1] < o[b]) {
      int32_t f = ur__tbe_feature_of(&c->a, b);
      return ur__error(UR_STATUS_INVALID,
                       "tbe: offsets[%lld] = %lld is below offsets[%lld] = %lld (feature '%s', "
                       "sample %lld); offsets must not decrease",
                       (long long)(b + 1), (long long)o[b + 1], (long long)b, (long long)o[b],
                       t->fnames[f], (long long)(b - ur__tbe_first_bag(&c->a, f)));
    }
  if (o[c->a.bags] != c->a.n)
    return ur__error(UR_STATUS_INVALID, "tbe: offsets end at %lld but there are %lld values",
                     (long long)o[c->a.bags], (long long)c->a.n);
  if (c->a.inverse)
    for (int32_t f = 0; f < t->F; f++) {
      int64_t nb = c->a.bag_start[f + 1] - c->a.bag_start[f];
      for (int64_t b = 0; b < c->a.full_batch; b++) {
        int64_t j = c->a.inverse[(int64_t)f * c->a.full_batch + b];
        if (j < 0 || j >= nb)
          return ur__error(UR_STATUS_INVALID,
                           "tbe: feature '%s' sample %lld has inverse index %lld; expected "
                           "0..%lld",
                           t->fnames[f], (long long)b, (long long)j, (long long)nb - 1);
      }
    }
  return UR_STATUS_OK;
}


/* The error for the first id out of bounds, at value index i: names table, feature, sample and
 * id.  Reads single elements, since on the GPU they are in device memory (an error path). */
static ur_status bad_id(const ur_tbe *t, const call *c, int64_t i) {
  int64_t lo = 0, hi = c->a.bags, o = 0, id = 0; /* the last bag with offsets[bag] <= i */
  ur_status st = UR_STATUS_OK;
  while (hi - lo > 1 && !st) {
    int64_t mid = lo + (hi - lo) / 2;
    if (!(st = ur_tensor_read(c->offsets, mid, 1, &o))) {
      if (o <= i) lo = mid;
      else hi = mid;
    }
  }
  if (!st) st = ur_tensor_read(c->values, i, 1, &id);
  if (st) return st;
  int32_t f = 0;
  int64_t first = 0;
  if (c->vbe) {
    while (f + 1 < t->F && c->vbe[f + 1] <= lo) f++;
    first = c->vbe[f];
  } else {
    f = (int32_t)(lo / c->a.batch);
    first = (int64_t)f * c->a.batch;
  }
  const ur_tbe_table_config *tc = &t->tc[t->features[f].table];
  return ur__error(UR_STATUS_INVALID,
                   "tbe: table '%s' (feature '%s', sample %lld, value %lld) has no row %lld; "
                   "ids run 0..%lld",
                   tc->name, t->fnames[f], (long long)(lo - first), (long long)i, (long long)id,
                   (long long)tc->rows - 1);
}

/* ---- the CPU backend ---- */

static void note_bad(int64_t *flags, int64_t i) {
  int64_t cur = __atomic_load_n(&flags[0], __ATOMIC_RELAXED);
  while (i < cur &&
         !__atomic_compare_exchange_n(&flags[0], &cur, i, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  __atomic_add_fetch(&flags[1], 1, __ATOMIC_RELAXED);
}

/* Row `row` of a table as floats: the f32 storage itself, or converted into buf. */
static const float *load_row(const ur__tbe_table *tb, int64_t row, float *buf) {
  size_t base = (size_t)row * (size_t)tb->dim;
  if (tb->dtype == UR_DTYPE_F32) return (const float *)tb->weights + base;
  const uint16_t *h = (const uint16_t *)tb->weights + base;
  if (tb->dtype == UR_DTYPE_BF16)
    for (int32_t c = 0; c < tb->dim; c++) buf[c] = ur__tbe_bf16_f32(h[c]);
  else
    for (int32_t c = 0; c < tb->dim; c++) buf[c] = ur__tbe_f16_f32(h[c]);
  return buf;
}

static void store_out(void *out, int32_t dtype, int64_t at, const float *v, int32_t dim) {
  if (dtype == UR_DTYPE_F32) {
    memcpy((float *)out + at, v, sizeof(float) * (size_t)dim);
    return;
  }
  uint16_t *o = (uint16_t *)out + at;
  for (int32_t c = 0; c < dim; c++) o[c] = ur__tbe_f32_bf16(v[c]);
}

static const float *load_out(const void *g, int32_t dtype, int64_t at, float *buf, int32_t dim) {
  if (dtype == UR_DTYPE_F32) return (const float *)g + at;
  const uint16_t *h = (const uint16_t *)g + at;
  for (int32_t c = 0; c < dim; c++) buf[c] = ur__tbe_bf16_f32(h[c]);
  return buf;
}

/* One more read of a row; counters stop at UR_TBE_COUNT_MAX (a racy check: at worst a few
 * adds past it). */
static void count_add(int32_t *c, int32_t n) {
  if (__atomic_load_n(c, __ATOMIC_RELAXED) < UR_TBE_COUNT_MAX) __atomic_fetch_add(c, n, __ATOMIC_RELAXED);
}

/* Rows are scattered over tables far larger than the caches, so one at a time the loop waits on
 * memory for each: ask for rows a few values ahead (assuming the same table, the usual case). */
#define PREFETCH_AHEAD 8

static void prefetch_row(const ur__tbe_table *tb, int64_t id) {
  if (id < 0 || id >= tb->rows) return;
  size_t es = tb->dtype == UR_DTYPE_F32 ? 4 : 2, bytes = (size_t)tb->dim * es;
  const char *p = (const char *)tb->weights + (size_t)ur__tbe_phys(tb, id) * bytes;
  for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(p + o);
}

static void cpu_forward_range(void *ctx, size_t b0, size_t b1) {
  const ur__tbe_args *a = ctx;
  float acc[UR_TBE_MAX_DIM], row[UR_TBE_MAX_DIM], tmp[UR_TBE_MAX_DIM];
  for (int64_t bag = (int64_t)b0; bag < (int64_t)b1; bag++) {
    int32_t f = ur__tbe_feature_of(a, bag);
    const ur__tbe_feature *ft = &a->features[f];
    const ur__tbe_table *tb = &a->tables[ft->table];
    int32_t dim = tb->dim;
    int64_t s, e;
    ur__tbe_bag_span(a, bag, &s, &e);
    if (a->pooled) memset(acc, 0, sizeof(float) * (size_t)dim);
    for (int64_t i = s; i < e; i++) {
      if (i + PREFETCH_AHEAD < a->n) prefetch_row(tb, a->values[i + PREFETCH_AHEAD]);
      int64_t id = a->values[i];
      float w = a->weights ? a->weights[i] : 1.0f;
      /* Checked even when off: a bad id would crash the process rather than one kernel. */
      if (id < 0 || id >= tb->rows) {
        if (a->bounds != UR_TBE_BOUNDS_OFF) note_bad(a->flags, i);
        if (!a->pooled) {
          memset(tmp, 0, sizeof(float) * (size_t)dim);
          store_out(a->out, a->out_dtype, i * dim, tmp, dim);
        }
        continue;
      }
      if (tb->counts) count_add(tb->counts + id, 1);
      const float *r = load_row(tb, ur__tbe_phys(tb, id), row);
      if (a->pooled) {
        for (int32_t c = 0; c < dim; c++) acc[c] = UR_FADD(acc[c], UR_FMUL(w, r[c]));
      } else {
        for (int32_t c = 0; c < dim; c++) tmp[c] = UR_FMUL(w, r[c]);
        store_out(a->out, a->out_dtype, i * dim, tmp, dim);
      }
    }
    if (!a->pooled) continue;
    if (tb->pooling == UR_POOLING_MEAN && e > s) {
      float inv = UR_FDIV(1.0f, (float)(e - s));
      for (int32_t c = 0; c < dim; c++) acc[c] = UR_FMUL(acc[c], inv);
    }
    int64_t at = ur__tbe_out_at(a->out_base, a->out_stride, f, ft, bag - ur__tbe_first_bag(a, f));
    store_out(a->out, a->out_dtype, at, acc, dim);
  }
}

/* VBE: the full batch's rows from the pooled bags (sample b of feature f reads its bag
 * inverse[f * B + b]), one feature per chunk. */
typedef struct expand_job {
  const ur__tbe_args *a;
  const float *flat;
  float *flat_grad;
} expand_job;

static void cpu_expand_range(void *ctx, size_t f0, size_t f1) {
  const expand_job *j = ctx;
  const ur__tbe_args *a = j->a;
  for (int32_t f = (int32_t)f0; f < (int32_t)f1; f++) {
    const ur__tbe_feature *ft = &a->features[f];
    for (int64_t b = 0; b < a->full_batch; b++) {
      int64_t src = a->flat_base[f] + a->inverse[(int64_t)f * a->full_batch + b] * ft->dim;
      store_out(a->out, a->out_dtype, b * a->out_stride + ft->col, j->flat + src, ft->dim);
    }
  }
}

/* The reverse: each bag's gradient sums its samples' rows in sample order. */
static void cpu_collapse_range(void *ctx, size_t f0, size_t f1) {
  const expand_job *j = ctx;
  const ur__tbe_args *a = j->a;
  float buf[UR_TBE_MAX_DIM];
  for (int32_t f = (int32_t)f0; f < (int32_t)f1; f++) {
    const ur__tbe_feature *ft = &a->features[f];
    for (int64_t b = 0; b < a->full_batch; b++) {
      float *d = j->flat_grad + a->flat_base[f] + a->inverse[(int64_t)f * a->full_batch + b] * ft->dim;
      const float *g = load_out(a->grad, a->out_dtype, b * a->out_stride + ft->col, buf, ft->dim);
      for (int32_t c = 0; c < ft->dim; c++) d[c] = UR_FADD(d[c], g[c]);
    }
  }
}

static ur_status cpu_forward(const ur__tbe_args *a) {
  if (!a->inverse) {
    ur__parallel_for((size_t)a->bags, 256, cpu_forward_range, (void *)a);
    return UR_STATUS_OK;
  }
  float *flat = malloc(sizeof(float) * (size_t)(a->flat_numel ? a->flat_numel : 1));
  if (!flat) return ur__error(UR_STATUS_OOM, "tbe: out of host memory for the VBE bags");
  ur__tbe_args in = *a;
  in.out = flat;
  in.out_base = a->flat_base;
  in.out_dtype = UR_DTYPE_F32;
  in.inverse = NULL;
  ur__parallel_for((size_t)a->bags, 256, cpu_forward_range, &in);
  expand_job j = {a, flat, NULL};
  ur__parallel_for((size_t)a->num_features, 1, cpu_expand_range, &j);
  free(flat);
  return UR_STATUS_OK;
}

/* Sorts (key, value index) pairs by key, keeping value order within a key (LSD radix sort,
 * stable); returns the arrays that hold the result (the inputs or the scratch). */
static void radix_sort(uint64_t **k, int64_t **v, uint64_t **tk, int64_t **tv, int64_t n,
                       int bits) {
  enum { RB = 11, RN = 1 << RB };
  size_t cnt[RN];
  for (int shift = 0; shift < bits; shift += RB) {
    memset(cnt, 0, sizeof(size_t) * RN);
    uint64_t *ks = *k, *kd = *tk;
    int64_t *vs = *v, *vd = *tv;
    for (int64_t i = 0; i < n; i++) cnt[(ks[i] >> shift) & (RN - 1)]++;
    size_t sum = 0;
    for (int d = 0; d < RN; d++) {
      size_t c = cnt[d];
      cnt[d] = sum;
      sum += c;
    }
    for (int64_t i = 0; i < n; i++) {
      size_t p = cnt[(ks[i] >> shift) & (RN - 1)]++;
      kd[p] = ks[i];
      vd[p] = vs[i];
    }
    *tk = ks;
    *tv = vs;
    *k = kd;
    *v = vd;
  }
}

typedef struct bwd_job {
  const ur__tbe_args *a;
  const ur__tbe_hyper *h;
  uint64_t *keys;
  int64_t *idx, *bag_of, *seg;
  int64_t nseg;
  /* sparse output instead of a step */
  int64_t *rows;
  float *grads;
  const int64_t *ustart, *gbase; /* per table: first segment, first gradient element */
} bwd_job;

static void cpu_keys_range(void *ctx, size_t b0, size_t b1) {
  bwd_job *j = ctx;
  const ur__tbe_args *a = j->a;
  for (int64_t bag = (int64_t)b0; bag < (int64_t)b1; bag++) {
    const ur__tbe_table *tb = &a->tables[a->features[ur__tbe_feature_of(a, bag)].table];
    int64_t s, e;
    ur__tbe_bag_span(a, bag, &s, &e);
    for (int64_t i = s; i < e; i++) {
      int64_t id = a->values[i];
      j->keys[i] = id < 0 || id >= tb->rows ? (uint64_t)a->total_keys : (uint64_t)(tb->key_base + id);
      j->idx[i] = i;
      j->bag_of[i] = bag;
    }
  }
}

static int32_t table_of_key(const ur__tbe_args *a, uint64_t key) {
  int32_t lo = 0, hi = a->num_tables;
  while (hi - lo > 1) {
    int32_t mid = (lo + hi) / 2;
    if ((uint64_t)a->tables[mid].key_base <= key) lo = mid;
    else hi = mid;
  }
  return lo;
}

/* The optimizer step of row id, given its summed gradient.  It lives at its physical row;
 * stochastic rounding draws by id, so a relayout leaves the numbers unchanged. */
static void cpu_step_row(const ur__tbe_hyper *h, const ur__tbe_table *tb, int64_t id,
                         const float *acc) {
  float w[UR_TBE_MAX_DIM], g[UR_TBE_MAX_DIM];
  int32_t dim = tb->dim;
  int64_t row = ur__tbe_phys(tb, id);
  int64_t sid = tb->row_ids ? tb->row_ids[id] : id;
  size_t base = (size_t)row * (size_t)dim, lbase = (size_t)sid * (size_t)dim;
  const float *wr = load_row(tb, row, w);
  for (int32_t c = 0; c < dim; c++) {
    w[c] = wr[c];
    g[c] = ur__tbe_grad_adjust(h, acc[c], w[c]);
  }
  float rs = 0;
  if (h->optim == UR_TBE_OPTIM_ROWWISE_ADAGRAD) {
    float sq = 0;
    for (int32_t c = 0; c < dim; c++) sq = UR_FADD(sq, UR_FMUL(g[c], g[c]));
    rs = UR_FADD(tb->state1[row], UR_FDIV(sq, (float)dim));
    tb->state1[row] = rs;
  }
  uint64_t key = ur__tbe_sr_key(h->sr_key, tb->index);
  ur_philox4 r = {{0, 0, 0, 0}};
  for (int32_t c = 0; c < dim; c++) {
    size_t e = base + (size_t)c;
    float *s1 = h->optim == UR_TBE_OPTIM_ROWWISE_ADAGRAD ? &rs : tb->state1 ? tb->state1 + e : NULL;
    float *s2 = tb->state2 ? tb->state2 + e : NULL;
    float nw = ur__tbe_step_elem(h, w[c], g[c], s1, s2);
    if (tb->dtype == UR_DTYPE_F32) {
      ((float *)tb->weights)[e] = nw;
      continue;
    }
    uint16_t *hp = (uint16_t *)tb->weights + e;
    if (h->sr) {
      if ((c & 3) == 0) r = ur_philox((lbase + (size_t)c) >> 2, key);
      *hp = ur__tbe_round_sr(nw, tb->dtype, r.v[c & 3]);
    } else {
      *hp = tb->dtype == UR_DTYPE_BF16 ? ur__tbe_f32_bf16(nw) : ur__tbe_f32_f16(nw);
    }
  }
}

/* Where value i's gradient row starts in a->grad (its bag's output row, or its own). */
static int64_t grad_at(const ur__tbe_args *a, int64_t i, int64_t bag, int32_t dim) {
  if (!a->pooled) return i * dim;
  int32_t f = ur__tbe_feature_of(a, bag);
  return ur__tbe_out_at(a->out_base, a->out_stride, f, &a->features[f], bag - ur__tbe_first_bag(a, f));
}

/* Each distinct row sums its values' gradient rows in value order, then steps (or is written
 * out).  Gradient rows are scattered, so those a few entries ahead are prefetched. */
static void cpu_reduce_range(void *ctx, size_t s0, size_t s1) {
  bwd_job *j = ctx;
  const ur__tbe_args *a = j->a;
  float acc[UR_TBE_MAX_DIM], buf[UR_TBE_MAX_DIM];
  size_t gsize = a->out_dtype == UR_DTYPE_F32 ? 4 : 2;
  int64_t end = j->seg[j->nseg];
  for (int64_t s = (int64_t)s0; s < (int64_t)s1; s++) {
    uint64_t key = j->keys[j->seg[s]];
    int32_t t = table_of_key(a, key);
    const ur__tbe_table *tb = &a->tables[t];
    int32_t dim = tb->dim;
    memset(acc, 0, sizeof(float) * (size_t)dim);
    for (int64_t k = j->seg[s]; k < j->seg[s + 1]; k++) {
      if (k + PREFETCH_AHEAD < end) {
        int64_t pi = j->idx[k + PREFETCH_AHEAD];
        const char *p = (const char *)a->grad + (size_t)grad_at(a, pi, j->bag_of[pi], dim) * gsize;
        for (size_t o = 0; o < (size_t)dim * gsize; o += 64) __builtin_prefetch(p + o);
      }
      int64_t i = j->idx[k], bag = j->bag_of[i];
      float c = a->weights ? a->weights[i] : 1.0f;
      if (a->pooled && tb->pooling == UR_POOLING_MEAN) {
        int64_t b, e;
        ur__tbe_bag_span(a, bag, &b, &e);
        c = UR_FMUL(c, UR_FDIV(1.0f, (float)(e - b)));
      }
      const float *g = load_out(a->grad, a->out_dtype, grad_at(a, i, bag, dim), buf, dim);
      for (int32_t d = 0; d < dim; d++) acc[d] = UR_FADD(acc[d], UR_FMUL(c, g[d]));
    }
    int64_t row = (int64_t)key - tb->key_base;
    if (!j->rows) {
      cpu_step_row(j->h, tb, row, acc);
      continue;
    }
    j->rows[s] = row;
    memcpy(j->grads + j->gbase[t] + (s - j->ustart[t]) * dim, acc, sizeof(float) * (size_t)dim);
  }
}

/* Sorted keys and their segments (distinct rows; skipped ids, keyed total_keys, are left out). */
static ur_status cpu_segments(bwd_job *j, void **mem) {
  const ur__tbe_args *a = j->a;
  size_t n = (size_t)a->n;
  char *m = malloc((n ? n : 1) * (5 * 8) + 8 * (n + 1));
  *mem = m;
  if (!m) return ur__error(UR_STATUS_OOM, "tbe: out of host memory sorting %zu ids", n);
  uint64_t *k = (uint64_t *)m, *tk = k + n;
  int64_t *v = (int64_t *)(tk + n), *tv = v + n;
  j->bag_of = tv + n;
  j->seg = j->bag_of + n;
  j->keys = k;
  j->idx = v;
  ur__parallel_for((size_t)a->bags, 256, cpu_keys_range, j);
  radix_sort(&k, &v, &tk, &tv, a->n, a->key_bits);
  j->keys = k;
  j->idx = v;
  int64_t ns = 0;
  for (int64_t i = 0; i < a->n && k[i] != (uint64_t)a->total_keys; i++)
    if (i == 0 || k[i] != k[i - 1]) j->seg[ns++] = i;
  int64_t end = 0;
  while (end < a->n && k[end] != (uint64_t)a->total_keys) end++;
  j->seg[ns] = end;
  j->nseg = ns;
  return UR_STATUS_OK;
}

/* The VBE collapse first, when there is one: the rest then runs on the flat bags. */
static ur_status cpu_flat_grad(const ur__tbe_args *a, ur__tbe_args *in, float **flat) {
  *in = *a;
  *flat = NULL;
  if (!a->inverse) return UR_STATUS_OK;
  *flat = calloc((size_t)(a->flat_numel ? a->flat_numel : 1), sizeof(float));
  if (!*flat) return ur__error(UR_STATUS_OOM, "tbe: out of host memory for the VBE gradient");
  expand_job ej = {a, NULL, *flat};
  ur__parallel_for((size_t)a->num_features, 1, cpu_collapse_range, &ej);
  in->grad = *flat;
  in->out_base = a->flat_base;
  in->out_dtype = UR_DTYPE_F32;
  in->inverse = NULL;
  return UR_STATUS_OK;
}

static ur_status cpu_backward(const ur__tbe_args *a, const ur__tbe_hyper *h) {
  ur__tbe_args in;
  float *flat;
  void *mem = NULL;
  ur_status st = cpu_flat_grad(a, &in, &flat);
  bwd_job j = {&in, h, NULL, NULL, NULL, NULL, 0, NULL, NULL, NULL, NULL};
  if (!st) st = cpu_segments(&j, &mem);
  if (!st) ur__parallel_for((size_t)j.nseg, 64, cpu_reduce_range, &j);
  free(mem);
  free(flat);
  return st;
}

/* ---- calls ---- */

static ur_status sync_for_cpu(const ur_tbe *t) {
  return !t->gpu && ur__gpu() ? ur__gpu()->device_sync() : UR_STATUS_OK;
}

static void fill_host_info(const ur_tbe *t, ur__tbe_args *a) {
  a->host_tables = t->tables;
  for (int32_t i = 0; i < t->T; i++) {
    if (t->tables[i].dim > a->max_dim) a->max_dim = t->tables[i].dim;
    if (t->tables[i].dtype != UR_DTYPE_F32) a->halves = 1;
  }
}

/* Points the call at device copies of the descriptors and of its VBE arrays. */
static ur_status gpu_args(ur_tbe *t, ur_stream *s, call *c) {
  ur__tbe_args *a = &c->a;
  char *d = ur_tensor_data(t->desc);
  a->tables = (const ur__tbe_table *)d;
  a->features = (const ur__tbe_feature *)(d + align_up((int64_t)(sizeof(ur__tbe_table) * (size_t)t->T), 16));
  if (!c->vbe) return UR_STATUS_OK;
  int64_t *dv = ur_tensor_data(t->callbuf);
  ur_status st = ur__gpu()->copy(s ? s->handle : NULL, dv, c->vbe,
                                 sizeof(int64_t) * (3 * (size_t)t->F + 1));
  if (st) return st;
  if (a->bag_start) a->bag_start = dv;
  if (a->out_base) a->out_base = dv + t->F + 1;
  if (a->flat_base) a->flat_base = dv + 2 * t->F + 1;
  return UR_STATUS_OK;
}

static ur_status gpu_work(ur_tbe *t, const ur__tbe_args *a, int backward, void **out) {
  size_t need = 0;
  ur_status st = ur__gpu()->tbe->work_bytes(a, backward, &need);
  if (st) return st;
  if (!t->work || (size_t)ur_tensor_numel(t->work) < need) {
    ur_tensor_free(t->work);
    t->work = NULL;
    int64_t grow = (int64_t)(need + need / 4 + 4096);
    if ((st = new_device_bytes(t, &t->work, grow))) return st;
  }
  *out = ur_tensor_data(t->work);
  return UR_STATUS_OK;
}

static ur_status gpu_missing(const char *what) {
  return ur__error(UR_STATUS_UNSUPPORTED, "tbe: the CUDA backend has no %s (%s)", what,
                   ur_cuda_error());
}

ur_status ur_tbe_forward(ur_stream *s, ur_tbe *t, const ur_tensor *values,
                         const ur_tensor *offsets, const ur_tensor *weights,
                         const int64_t *batch_per_feature, const ur_tensor *inverse,
                         ur_tensor *out) {
  call c;
  ur_status st = prepare(t, &c, values, offsets, weights, batch_per_feature, inverse, out, "out");
  if (st) {
    release(&c);
    return st;
  }
  fill_host_info(t, &c.a);
  c.a.out = ur_tensor_data(out);
  int fatal = t->cfg.bounds == UR_TBE_BOUNDS_FATAL;
  if (!t->gpu) {
    c.a.tables = t->tables;
    c.a.features = t->features;
    if (!(st = sync_for_cpu(t)) && !(st = check_offsets(t, &c)) && !(st = reset_flags(t, s, 0)))
      st = cpu_forward(&c.a);
  } else if (!ur__gpu()->tbe->forward) {
    st = gpu_missing("embedding kernels");
  } else {
    void *work = NULL;
    if (!(st = gpu_args(t, s, &c)) && !(fatal && (st = reset_flags(t, s, 0))) &&
        !(st = gpu_work(t, &c.a, 0, &work)))
      st = ur__gpu()->tbe->forward(s ? s->handle : NULL, &c.a, work);
  }
  if (!st && fatal) {
    int64_t bad = UR_TBE_NO_BAD;
    if (!(st = ur_tensor_read(t->flags, 0, 1, &bad)) && bad != UR_TBE_NO_BAD) st = bad_id(t, &c, bad);
  }
  release(&c);
  return st;
}

static void hyper_of(ur_tbe *t, ur__tbe_hyper *h) {
  const ur_tbe_config *c = &t->cfg;
  memset(h, 0, sizeof *h);
  h->optim = c->optim;
  h->sr = c->stochastic_rounding != 0;
  h->lr = (float)c->lr;
  h->eps = (float)c->eps;
  h->weight_decay = (float)c->weight_decay;
  h->max_grad = (float)c->max_grad;
  h->beta1 = (float)c->beta1;
  h->beta2 = (float)c->beta2;
  h->one_minus_beta1 = (float)(1.0 - c->beta1);
  h->one_minus_beta2 = (float)(1.0 - c->beta2);
  h->bias1 = (float)(1.0 - pow(c->beta1, (double)t->step));
  h->bias2 = (float)(1.0 - pow(c->beta2, (double)t->step));
  h->sr_key = c->seed ^ ((uint64_t)t->step * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull);
}

ur_status ur_tbe_backward(ur_stream *s, ur_tbe *t, const ur_tensor *grad_out,
                          const ur_tensor *values, const ur_tensor *offsets,
                          const ur_tensor *weights, const int64_t *batch_per_feature,
                          const ur_tensor *inverse) {
  call c;
  ur_status st = prepare(t, &c, values, offsets, weights, batch_per_feature, inverse, grad_out,
                         "grad_out");
  if (st) {
    release(&c);
    return st;
  }
  fill_host_info(t, &c.a);
  c.a.grad = ur_tensor_data(grad_out);
  t->step++;
  ur__tbe_hyper h;
  hyper_of(t, &h);
  if (!t->gpu) {
    c.a.tables = t->tables;
    c.a.features = t->features;
    if (!(st = sync_for_cpu(t)) && !(st = check_offsets(t, &c))) st = cpu_backward(&c.a, &h);
  } else if (!ur__gpu()->tbe->backward) {
    st = gpu_missing("embedding kernels");
  } else {
    void *work = NULL;
    if (!(st = gpu_args(t, s, &c)) && !(st = gpu_work(t, &c.a, 1, &work)))
      st = ur__gpu()->tbe->backward(s ? s->handle : NULL, &c.a, &h, work);
  }
  if (st) t->step--;
  release(&c);
  return st;
}

static ur_status sparse_outputs(const ur_tbe *t, const int64_t *counts, ur_tensor **rows,
                                ur_tensor **grads, int64_t *ustart, int64_t *gbase) {
  int64_t u = 0, g = 0;
  for (int32_t i = 0; i < t->T; i++) {
    ustart[i] = u;
    gbase[i] = g;
    u += counts[i];
    g += counts[i] * t->tc[i].dim;
  }
  ur_place p = t->gpu ? UR_PLACE_DEVICE : UR_PLACE_HOST;
  int32_t d = t->gpu ? t->cfg.device : UR_LOC_CPU;
  ur_status st = ur_tensor_new(rows, UR_DTYPE_I64, 1, &u, p, d);
  if (!st) st = ur_tensor_new(grads, UR_DTYPE_F32, 1, &g, p, d);
  return st;
}

ur_status ur_tbe_sparse_grad(ur_stream *s, ur_tbe *t, const ur_tensor *grad_out,
                             const ur_tensor *values, const ur_tensor *offsets,
                             const ur_tensor *weights, const int64_t *batch_per_feature,
                             const ur_tensor *inverse, ur_tensor **rows, ur_tensor **grads,
                             int64_t *counts) {
  *rows = *grads = NULL;
  call c;
  ur_status st = prepare(t, &c, values, offsets, weights, batch_per_feature, inverse, grad_out,
                         "grad_out");
  int64_t *ustart = calloc(2 * (size_t)t->T, sizeof(int64_t));
  if (!st && !ustart) st = ur__error(UR_STATUS_OOM, "tbe: out of host memory");
  if (st) {
    free(ustart);
    release(&c);
    return st;
  }
  fill_host_info(t, &c.a);
  c.a.grad = ur_tensor_data(grad_out);
  int64_t *gbase = ustart + t->T;
  if (!t->gpu) {
    c.a.tables = t->tables;
    c.a.features = t->features;
    ur__tbe_args in;
    float *flat = NULL;
    void *mem = NULL;
    bwd_job j = {&in, NULL, NULL, NULL, NULL, NULL, 0, NULL, NULL, ustart, gbase};
    if (!(st = sync_for_cpu(t)) && !(st = check_offsets(t, &c)) &&
        !(st = cpu_flat_grad(&c.a, &in, &flat)) && !(st = cpu_segments(&j, &mem))) {
      memset(counts, 0, sizeof(int64_t) * (size_t)t->T);
      for (int64_t k = 0; k < j.nseg; k++) counts[table_of_key(&in, j.keys[j.seg[k]])]++;
      if (!(st = sparse_outputs(t, counts, rows, grads, ustart, gbase))) {
        j.rows = ur_tensor_data(*rows);
        j.grads = ur_tensor_data(*grads);
        ur__parallel_for((size_t)j.nseg, 64, cpu_reduce_range, &j);
      }
    }
    free(mem);
    free(flat);
  } else if (!ur__gpu()->tbe->sparse_count) {
    st = gpu_missing("embedding kernels");
  } else {
    void *work = NULL;
    void *sh = s ? s->handle : NULL;
    if (!(st = gpu_args(t, s, &c)) && !(st = gpu_work(t, &c.a, 1, &work)) &&
        !(st = ur__gpu()->tbe->sparse_count(sh, &c.a, work, counts)) &&
        !(st = sparse_outputs(t, counts, rows, grads, ustart, gbase)))
      st = ur__gpu()->tbe->sparse_write(sh, &c.a, work, counts, ur_tensor_data(*rows),
                                        ur_tensor_data(*grads));
    if (!st) st = ur__gpu()->stream_sync(sh);
  }
  if (st) {
    ur_tensor_free(*rows);
    ur_tensor_free(*grads);
    *rows = *grads = NULL;
  }
  free(ustart);
  release(&c);
  return st;
}

/* ---- the plain gather ---- */

typedef struct gather_job {
  const char *src;
  const int64_t *ids;
  char *out;
  size_t row_bytes;
  int64_t rows;
  int64_t bad;
} gather_job;

static void gather_range(void *ctx, size_t i0, size_t i1) {
  gather_job *j = ctx;
  for (size_t i = i0; i < i1; i++) {
    int64_t id = j->ids[i];
    if (id < 0 || id >= j->rows) {
      __atomic_store_n(&j->bad, (int64_t)i, __ATOMIC_RELAXED);
      continue;
    }
    memcpy(j->out + i * j->row_bytes, j->src + (size_t)id * j->row_bytes, j->row_bytes);
  }
}

ur_status ur_tensor_gather_rows(ur_stream *s, const ur_tensor *src, const ur_tensor *ids,
                                ur_tensor *out) {
  if (ur_tensor_ndim(src) != 2 || ur_tensor_dtype(ids) != UR_DTYPE_I64 ||
      ur_tensor_ndim(ids) != 1 || ur_tensor_ndim(out) != 2 ||
      ur_tensor_dtype(out) != ur_tensor_dtype(src) || ur_tensor_dim(out, 1) != ur_tensor_dim(src, 1) ||
      ur_tensor_dim(out, 0) != ur_tensor_numel(ids))
    return ur__error(UR_STATUS_INVALID,
                     "gather_rows: expected src [rows, dim], ids i64 [n] and out [n, dim] of "
                     "src's dtype");
  ur_place ps = ur_tensor_place(src), pi = ur_tensor_place(ids), po = ur_tensor_place(out);
  int gpu = ps == UR_PLACE_DEVICE || pi == UR_PLACE_DEVICE || po == UR_PLACE_DEVICE;
  size_t row_bytes = (size_t)ur_tensor_dim(src, 1) * ur_dtype_size(ur_tensor_dtype(src));
  int64_t n = ur_tensor_numel(ids);
  if (gpu) {
    if (ps == UR_PLACE_HOST || pi == UR_PLACE_HOST || po == UR_PLACE_HOST)
      return ur__error(UR_STATUS_INVALID,
                       "gather_rows: device and plain host tensors mixed; the GPU reads device, "
                       "managed and pinned memory");
    if (!ur__gpu()->tbe->gather_rows) return gpu_missing("gather kernel");
    return ur__gpu()->tbe->gather_rows(s ? s->handle : NULL, ur_tensor_data(src), row_bytes,
                                  ur_tensor_data(ids), n, ur_tensor_data(out));
  }
  if (ur__gpu()) {
    ur_status st = ur__gpu()->device_sync();
    if (st) return st;
  }
  gather_job j = {ur_tensor_data(src), ur_tensor_data(ids), ur_tensor_data(out), row_bytes,
                  ur_tensor_dim(src, 0), -1};
  ur__parallel_for((size_t)n, 1024, gather_range, &j);
  if (j.bad >= 0)
    return ur__error(UR_STATUS_INVALID, "gather_rows: ids[%lld] = %lld; expected 0..%lld",
                     (long long)j.bad, (long long)j.ids[j.bad], (long long)ur_tensor_dim(src, 0) - 1);
  return UR_STATUS_OK;
}
