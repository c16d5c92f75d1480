/* table.c: the embedding collection's tables (table.h): the names and features both kinds of
 * collection lay out alike (ur__tbe_names, which qtbe.c uses too), construction and its checks, the
 * batched storage with its per-table views, the descriptors the kernels read and their copy on
 * the device, redirects to a cache's slots, and the hooks run when the collection is freed.
 *
 * Tables of one placement and dtype share one storage (one allocation), each at an aligned
 * element offset; optimizer state (always f32) likewise per placement.  The kernels see every
 * table through a descriptor array, so one launch serves all of them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "embedding/table.h"

#define ALIGN_BYTES 256 /* each table and state block starts on this boundary */

static const char *state_names[UR_OPTIM_KIND_COUNT][2] = {
    [UR_OPTIM_KIND_ROWWISE_ADAGRAD] = {"sum", NULL},
    [UR_OPTIM_KIND_ADAGRAD] = {"sum", NULL},
    [UR_OPTIM_KIND_ADAM] = {"exp_avg", "exp_avg_sq"}};

size_t ur_sizeof_tbe_table_config(void) { return sizeof(ur_tbe_table_config); }
size_t ur_sizeof_tbe_config(void) { return sizeof(ur_tbe_config); }

static const char *pooling_name(int32_t p) {
  return p == UR_POOLING_SUM ? "sum" : p == UR_POOLING_MEAN ? "mean" : "none";
}

/* ---- names and features (ur__tbe_names, both kinds of collection) ---- */

static char *dup(const char *s, const char *prefix, int32_t i) {
  char buf[32];
  if (!s) {
    snprintf(buf, sizeof buf, "%s%d", prefix, (int)i);
    s = buf;
  }
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

ur_status ur__tbe_names_init(ur__tbe_names *n, const char *who, int32_t T, int32_t F) {
  *n = (ur__tbe_names){.who = who, .T = T, .F = F};
  n->tnames = calloc((size_t)T, sizeof *n->tnames);
  n->fnames = calloc((size_t)F, sizeof *n->fnames);
  n->tdims = calloc((size_t)T, sizeof *n->tdims);
  n->tfirst = calloc((size_t)T, sizeof *n->tfirst);
  n->features = calloc((size_t)F, sizeof *n->features);
  if (!n->tnames || !n->fnames || !n->tdims || !n->tfirst || !n->features)
    return ur__error(UR_STATUS_OOM, "%s: out of host memory", who);
  return UR_STATUS_OK;
}

size_t ur__tbe_names_features_at(const ur__tbe_names *n, size_t table_bytes) {
  return (table_bytes * (size_t)n->T + 15) / 16 * 16;
}

ur_status ur__tbe_names_table(ur__tbe_names *n, int32_t i, const char *name, const char *prefix) {
  if (!(n->tnames[i] = dup(name, prefix, i)))
    return ur__error(UR_STATUS_OOM, "%s: out of host memory", n->who);
  return UR_STATUS_OK;
}

/* first[i] = the first of the k names that equals names[i] (i itself when none before it does):
 * by sorting, as a collection may have a thousand tables and many more features. */
static ur_status first_of_name(const char *who, char *const *names, int32_t k, int32_t *first) {
  ur__named *s = malloc(sizeof *s * (size_t)(k > 0 ? k : 1));
  if (!s) return ur__error(UR_STATUS_OOM, "%s: out of host memory", who);
  for (int32_t i = 0; i < k; i++) s[i] = (ur__named){names[i], i};
  qsort(s, (size_t)k, sizeof *s, ur__named_cmp);
  for (int32_t i = 0; i < k; i++)
    first[s[i].at] = i > 0 && !strcmp(s[i].name, s[i - 1].name) ? first[s[i - 1].at] : s[i].at;
  free(s);
  return UR_STATUS_OK;
}

ur_status ur__tbe_names_check(ur__tbe_names *n, int32_t i, int32_t dim, int32_t pooling) {
  char *const *tn = n->tnames;
  if (i == 0) {
    ur_status st = first_of_name(n->who, tn, n->T, n->tfirst);
    if (st) return st;
  }
  if (n->tfirst[i] != i)
    return ur__error(UR_STATUS_INVALID, "%s: tables %d and %d are both named '%s'", n->who,
                     (int)n->tfirst[i], (int)i, tn[i]);
  n->tdims[i] = dim;
  if (i == 0) {
    n->pooling0 = pooling;
    n->pooled = pooling != UR_POOLING_NONE;
    n->dim = dim;
  }
  if ((pooling == UR_POOLING_NONE) != (n->pooling0 == UR_POOLING_NONE))
    return ur__error(UR_STATUS_INVALID,
                     "%s: table '%s' pools by %s but table '%s' by %s; a collection pools "
                     "all its tables (sum or mean) or none",
                     n->who, tn[i], pooling_name(pooling), tn[0], pooling_name(n->pooling0));
  if (!n->pooled && dim != n->dim)
    return ur__error(UR_STATUS_INVALID,
                     "%s: pooling none needs one dim for all tables; '%s' has %d but '%s' has %d",
                     n->who, tn[i], (int)dim, tn[0], (int)n->dim);
  return UR_STATUS_OK;
}

ur_status ur__tbe_names_features(ur__tbe_names *n, const int32_t *feature_table,
                                 const char *const *feature_names, const char *prefix) {
  for (int32_t f = 0; f < n->F; f++)
    if (!(n->fnames[f] = dup(feature_names ? feature_names[f] : NULL, prefix, f)))
      return ur__error(UR_STATUS_OOM, "%s: out of host memory", n->who);
  int32_t *first = malloc(sizeof *first * (size_t)n->F);
  ur_status st = first ? first_of_name(n->who, n->fnames, n->F, first)
                       : ur__error(UR_STATUS_OOM, "%s: out of host memory", n->who);
  for (int32_t f = 0; f < n->F && !st; f++) {
    if (feature_table[f] < 0 || feature_table[f] >= n->T)
      st = ur__error(UR_STATUS_INVALID, "%s: feature %d ('%s') maps to table %d; expected 0..%d",
                     n->who, (int)f, n->fnames[f], (int)feature_table[f], (int)n->T - 1);
    else if (first[f] != f)
      st = ur__error(UR_STATUS_INVALID, "%s: features %d and %d are both named '%s'", n->who,
                     (int)first[f], (int)f, n->fnames[f]);
  }
  free(first);
  if (st) return st;
  n->out_dim = 0;
  for (int32_t f = 0; f < n->F; f++) {
    n->features[f].table = feature_table[f];
    n->features[f].dim = n->tdims[feature_table[f]];
    n->features[f].col = n->pooled ? n->out_dim : 0;
    if (n->pooled) n->out_dim += n->features[f].dim;
  }
  if (!n->pooled) n->out_dim = n->dim;
  return UR_STATUS_OK;
}

void ur__tbe_names_free(ur__tbe_names *n) {
  for (int32_t i = 0; n->tnames && i < n->T; i++) free(n->tnames[i]);
  for (int32_t f = 0; n->fnames && f < n->F; f++) free(n->fnames[f]);
  free(n->tnames);
  free(n->fnames);
  free(n->tdims);
  free(n->tfirst);
  free(n->features);
  *n = (ur__tbe_names){0};
}

ur_status ur__tbe_check_offsets(const ur__tbe_names *n, const int64_t *o, int64_t bags,
                                int64_t values, const int64_t *bag_start, int64_t batch) {
  if (o[0] != 0)
    return ur__error(UR_STATUS_INVALID, "%s: offsets[0] is %lld; expected 0", n->who,
                     (long long)o[0]);
  for (int64_t b = 0; b < bags; b++)
    if (o[b + 1] < o[b]) {
      int32_t f = ur__tbe_feature_at(bag_start, batch, n->F, b);
      return ur__error(UR_STATUS_INVALID,
                       "%s: offsets[%lld] = %lld is below offsets[%lld] = %lld (feature '%s', "
                       "sample %lld); offsets must not decrease",
                       n->who, (long long)(b + 1), (long long)o[b + 1], (long long)b,
                       (long long)o[b], n->fnames[f],
                       (long long)(b - ur__tbe_bag_of(bag_start, batch, f)));
    }
  if (o[bags] != values)
    return ur__error(UR_STATUS_INVALID, "%s: offsets end at %lld for %lld value%s",
                     n->who, (long long)o[bags], (long long)values, ur__s(values));
  return UR_STATUS_OK;
}

ur_status ur__tbe_bad_id(const char *who, const char *table, const char *feature,
                         int64_t sample, int64_t value, int64_t id, int64_t modulo,
                         int64_t rows) {
  char mapped[96] = "";
  if (modulo > 0 && id >= 0)
    snprintf(mapped, sizeof mapped, " (%lld after modulo %lld)", (long long)(id % modulo),
             (long long)modulo);
  return ur__error(UR_STATUS_INVALID,
                   "%s: table '%s' (feature '%s', sample %lld, value %lld) has no row %lld%s; "
                   "ids run 0..%lld",
                   who, table, feature, (long long)sample, (long long)value, (long long)id, mapped,
                   (long long)rows - 1);
}

ur_status ur__tbe_names_index(const ur__tbe_names *n, int32_t i) {
  if (i < 0 || i >= n->T)
    return ur__error(UR_STATUS_INVALID, "%s: table %d does not exist; expected 0..%d", n->who,
                     (int)i, (int)n->T - 1);
  return UR_STATUS_OK;
}

const char *ur__tbe_names_tname(const ur__tbe_names *n, int32_t i) {
  return i >= 0 && i < n->T ? n->tnames[i] : NULL;
}
const char *ur__tbe_names_fname(const ur__tbe_names *n, int32_t f) {
  return f >= 0 && f < n->F ? n->fnames[f] : NULL;
}
int32_t ur__tbe_names_ftable(const ur__tbe_names *n, int32_t f) {
  return f >= 0 && f < n->F ? n->features[f].table : -1;
}
int64_t ur__tbe_names_fcol(const ur__tbe_names *n, int32_t f) {
  return f >= 0 && f < n->F ? n->features[f].col : -1;
}

static int64_t align_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

/* ---- construction ---- */

ur_status ur__tbe_check_engine(const char *who, int32_t device, int32_t bounds,
                               ur_dtype out_dtype) {
  if (device >= 0 && device >= ur_device_count())
    return ur__error(ur_device_count() ? UR_STATUS_INVALID : UR_STATUS_UNSUPPORTED,
                     "%s: device %d asked, but %d GPUs are in use%s%s", who, (int)device,
                     ur_device_count(), ur_device_count() ? "" : ": ", ur_cuda_error());
  if (device < -1)
    return ur__error(UR_STATUS_INVALID, "%s: device %d; expected -1 (the CPU) or a GPU", who,
                     (int)device);
  if ((unsigned)bounds >= UR_TBE_BOUNDS_COUNT)
    return ur__error(UR_STATUS_INVALID, "%s: bounds check %d is not fatal, warn or off", who,
                     (int)bounds);
  if (out_dtype != UR_DTYPE_F32 && out_dtype != UR_DTYPE_BF16)
    return ur__error(UR_STATUS_INVALID, "%s: output dtype '%s'; expected f32 or bf16", who,
                     (unsigned)out_dtype < UR_DTYPE_COUNT ? ur_dtype_name(out_dtype) : "?");
  return UR_STATUS_OK;
}

ur_status ur__tbe_check_counts(const char *who, int32_t num_tables, int32_t num_features) {
  if (num_tables < 1 || num_features < 1)
    return ur__error(UR_STATUS_INVALID,
                     "%s: %d tables and %d features; expected at least one of each", who,
                     (int)num_tables, (int)num_features);
  return UR_STATUS_OK;
}

ur_status ur__tbe_check_table(const char *who, const char *name, int64_t rows, int32_t dim,
                              int32_t pooling) {
  if (rows < 1)
    return ur__error(UR_STATUS_INVALID, "%s: table '%s' has %lld rows; expected 1 or more", who,
                     name, (long long)rows);
  if (dim < 4 || dim > UR_TBE_MAX_DIM || dim % 4)
    return ur__error(UR_STATUS_INVALID,
                     "%s: table '%s' has dim %d; expected a multiple of 4 from 4 to %d", who, name,
                     (int)dim, UR_TBE_MAX_DIM);
  if ((unsigned)pooling >= UR_POOLING_COUNT)
    return ur__error(UR_STATUS_INVALID, "%s: table '%s' pooling %d is not sum, mean or none", who,
                     name, (int)pooling);
  return UR_STATUS_OK;
}

ur_status ur__tbe_check_place(const char *who, const char *name, const char *what, int32_t place,
                              int32_t device) {
  if (place != UR_PLACE_DEVICE && place != UR_PLACE_MANAGED && place != UR_PLACE_HOST &&
      place != UR_PLACE_PINNED)
    return ur__error(UR_STATUS_INVALID, "%s: table '%s' %s %d is not device, managed or host", who,
                     name, what, (int)place);
  if (place == UR_PLACE_DEVICE && device < 0)
    return ur__error(UR_STATUS_INVALID,
                     "%s: table '%s' %s 'device' needs the collection on a GPU, and it runs on "
                     "the CPU (device -1)",
                     who, name, what);
  return UR_STATUS_OK;
}

static ur_status check_config(const ur_tbe_config *c) {
  ur_status st = ur__tbe_check_engine("tbe", c->device, c->bounds, c->out_dtype);
  return st ? st : ur__optim_check("tbe", &c->optim, 1);
}

static ur_status check_table(const ur_tbe_config *c, const ur_tbe_table_config *tc,
                             const char *name) {
  ur_status st = ur__tbe_check_table("tbe", name, tc->rows, tc->dim, tc->pooling);
  if (st) return st;
  if (tc->dtype != UR_DTYPE_F32 && tc->dtype != UR_DTYPE_F16 && tc->dtype != UR_DTYPE_BF16)
    return ur__error(UR_STATUS_INVALID, "tbe: table '%s' stores '%s'; expected f32, f16 or bf16",
                     name, (unsigned)tc->dtype < UR_DTYPE_COUNT ? ur_dtype_name(tc->dtype) : "?");
  if ((st = ur__tbe_check_place("tbe", name, "placement", tc->place, c->device)) ||
      (st = ur__tbe_check_place("tbe", name, "its optimizer state",
                                tc->state_place < 0 ? (int32_t)tc->place : tc->state_place,
                                c->device)))
    return st;
  if ((uint64_t)tc->rows > ((uint64_t)1 << 50) / (uint64_t)tc->dim)
    return ur__error(UR_STATUS_INVALID, "tbe: table '%s' of %lld rows x %d is too large", name,
                     (long long)tc->rows, (int)tc->dim);
  if (tc->logical_rows &&
      (tc->logical < 0 || tc->logical_rows < 0 || tc->row0 < 0 ||
       tc->row0 > tc->logical_rows - tc->rows || tc->col0 < 0 || tc->logical_dim < tc->dim ||
       tc->col0 > tc->logical_dim - tc->dim))
    return ur__error(UR_STATUS_INVALID,
                     "tbe: table '%s' is rows [%lld, %lld) and columns [%d, %d) of logical table "
                     "%d of %lld x %d; expected a block inside it and a logical index >= 0",
                     name, (long long)tc->row0, (long long)(tc->row0 + tc->rows), (int)tc->col0,
                     (int)(tc->col0 + tc->dim), (int)tc->logical, (long long)tc->logical_rows,
                     (int)tc->logical_dim);
  return UR_STATUS_OK;
}

/* Host tables live in pinned memory when a GPU runs the collection: it reads them in place. */
static ur_place storage_place(const ur_tbe *t, int32_t place) {
  if (place == UR_PLACE_HOST || place == UR_PLACE_PINNED)
    return t->home == UR_PLACE_DEVICE ? UR_PLACE_PINNED : UR_PLACE_HOST;
  return (ur_place)place;
}

static int32_t storage_device(const ur_tbe *t, ur_place place) {
  if (place == UR_PLACE_HOST || place == UR_PLACE_PINNED) return UR_LOC_CPU;
  return t->home == UR_PLACE_DEVICE ? t->cfg.device : (place == UR_PLACE_MANAGED ? UR_LOC_CPU : 0);
}

/* Elements of one optimizer state of table i. */
static int64_t state_elems(const ur_tbe *t, int32_t i) {
  const ur_tbe_table_config *c = &t->tc[i];
  return t->cfg.optim.kind == UR_OPTIM_KIND_ROWWISE_ADAGRAD ? c->rows : c->rows * c->dim;
}

/* A lost table whose reason could not be kept (no memory for it). */
static const char lost_unsaid[] = "its reason could not be kept: out of host memory";

/* The key space: each table's rows follow the previous table's. */
static void rekey(ur_tbe *t) {
  int64_t key = 0;
  for (int32_t k = 0; k < t->names.T; k++) {
    t->tables[k].key_base = key;
    key += t->tables[k].rows;
  }
  t->total_keys = key;
  t->key_bits = ur__key_bits((uint64_t)key);
}

static ur_status alloc_storages(ur_tbe *t) {
  int64_t wsize[UR_PLACE_COUNT][UR__TBE_NDT] = {{0}}, ssize[UR_PLACE_COUNT] = {0};
  int32_t mult = t->cfg.optim.kind == UR_OPTIM_KIND_ADAM ? 2 : 1;
  for (int32_t i = 0; i < t->names.T; i++) {
    const ur_tbe_table_config *c = &t->tc[i];
    ur_place wp = storage_place(t, c->place);
    ur_place sp = storage_place(t, c->state_place < 0 ? (int32_t)c->place : c->state_place);
    t->splace[i] = sp;
    int64_t es = (int64_t)ur_dtype_size(c->dtype);
    t->woff[i] = wsize[wp][c->dtype];
    wsize[wp][c->dtype] = align_up(t->woff[i] + c->rows * c->dim, ALIGN_BYTES / es);
    t->soff[i] = ssize[sp];
    if (t->nstate) ssize[sp] = align_up(t->soff[i] + mult * align_up(state_elems(t, i), ALIGN_BYTES / 4),
                                        ALIGN_BYTES / 4);
  }
  ur_status st;
  for (int p = 0; p < UR_PLACE_COUNT; p++) {
    for (int d = 0; d < UR__TBE_NDT; d++) {
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
  for (int32_t i = 0; i < t->names.T; i++) {
    const ur_tbe_table_config *c = &t->tc[i];
    ur__tbe_table *d = &t->tables[i];
    int32_t place;
    ur__tbe_backing(t, i, d, &place);
    d->dim = c->dim;
    d->dtype = c->dtype;
    d->pooling = c->pooling;
    int shard = c->logical_rows != 0;
    d->index = shard ? c->logical : i;
    d->sr_row0 = shard ? c->row0 : 0;
    d->sr_col0 = shard ? c->col0 : 0;
    d->sr_pitch = shard ? c->logical_dim : c->dim;
    d->far_from = ur__tbe_far_from(t, i);
  }
  rekey(t);
  return UR_STATUS_OK;
}

/* Per-table seeds, so a table's numbers depend on neither its placement nor its neighbours;
 * a shard draws with its logical table's seed, at that table's counters. */
static uint64_t table_seed(uint64_t seed, int32_t table) {
  return seed ^ ((uint64_t)(table + 1) * 0xD1B54A32D192ED03ull);
}

/* Bytes of device memory a host table is drawn through (streamed_draw). */
#define DRAW_CHUNK_BYTES ((size_t)256 << 20)

/* A pinned host table of a GPU collection drawn by the GPU a chunk at a time and copied down
 * on one stream (the draw of a chunk is ~50x faster than its copy, so the copy engine sets the
 * pace: the host link's speed, not the host cores').  The rand kernel makes the CPU's numbers
 * counter for counter (a #cuda spec), so a table is the same wherever it was drawn. */
static ur_status streamed_draw(ur_stream *s, ur_tbe *t, void *dst, ur_dtype dt, size_t n,
                               uint64_t first, size_t cols, uint64_t pitch, double lo, double hi,
                               uint64_t seed) {
  size_t es = ur_dtype_size(dt), per = DRAW_CHUNK_BYTES / es / cols * cols; /* whole rows */
  if (per < cols) per = cols;
  if (per > n) per = n;
  void *sh = s ? s->handle : NULL;
  ur_tensor *scratch = NULL;
  ur_status st = ur__tbe_home_tensor(t, &scratch, UR_DTYPE_U8, (int64_t)(per * es));
  for (size_t c0 = 0; c0 < n && !st; c0 += per) {
    size_t m = n - c0 < per ? n - c0 : per;
    uint64_t f = first + (uint64_t)(c0 / cols) * pitch; /* a shard's rows lie pitch apart */
    if (!(st = t->be->rand(sh, ur_tensor_data(scratch), dt, m, f, cols, pitch, UR_DIST_UNIFORM, lo,
                           hi, seed)))
      st = t->be->copy(sh, (char *)dst + c0 * es, ur_tensor_data(scratch), m * es);
    if (!st && ur_interrupt_get())
      st = ur__error(UR_STATUS_INTERRUPTED, "tbe: drawing a table interrupted at element %zu", c0);
  }
  ur_status sync = t->be->stream_sync(sh); /* the scratch is freed only once the copies are done */
  if (!st) st = sync;
  ur_tensor_free(scratch);
  return st;
}

/* The rows of the table, or of its logical table for a shard (the initial bound's). */
static int64_t logical_rows(const ur_tbe_table_config *c) {
  return c->logical_rows ? c->logical_rows : c->rows;
}

static ur_status draw(ur_stream *s, ur_tbe *t, int32_t i, double lo, double hi, uint64_t seed) {
  const ur_tbe_table_config *c = &t->tc[i];
  ur_tensor *w = t->wstore[storage_place(t, c->place)][c->dtype];
  size_t n = (size_t)c->rows * (size_t)c->dim;
  int shard = c->logical_rows != 0;
  uint64_t ts = table_seed(seed, shard ? c->logical : i);
  uint64_t pitch = shard ? (uint64_t)c->logical_dim : (uint64_t)c->dim;
  uint64_t first = shard ? (uint64_t)c->row0 * pitch + (uint64_t)c->col0 : 0;
  void *dst = (char *)ur_tensor_data(w) + (size_t)t->woff[i] * ur_dtype_size(c->dtype);
  if (w->st->place == UR_PLACE_DEVICE)
    return t->be->rand(s ? s->handle : NULL, dst, c->dtype, n, first, (size_t)c->dim, pitch,
                       UR_DIST_UNIFORM, lo, hi, ts);
  if (w->st->place == UR_PLACE_PINNED && t->home == UR_PLACE_DEVICE)
    return streamed_draw(s, t, dst, c->dtype, n, first, (size_t)c->dim, pitch, lo, hi, ts);
  /* Managed tables are drawn on the host, so their pages start there (tensor.c does the same),
   * on every core (the CPU backend's rand); so are all tables of a CPU collection. */
  if (w->st->place != UR_PLACE_HOST) {
    ur_status st = ur_device_sync();
    if (st) return st;
  }
  return ur__cpu()->rand(NULL, dst, c->dtype, n, first, (size_t)c->dim, pitch, UR_DIST_UNIFORM,
                         lo, hi, ts);
}

static ur_status upload_desc(ur_tbe *t) {
  if (!t->desc) return UR_STATUS_OK;
  ur_status st = t->be->copy(NULL, ur_tensor_data(t->desc), t->tables,
                             sizeof(ur__tbe_table) * (size_t)t->names.T);
  return st ? st : t->be->stream_sync(NULL);
}

/* The descriptors (and features) in device memory, and room for one call's VBE arrays. */
static ur_status prepare_device(ur_tbe *t) {
  size_t tb = sizeof(ur__tbe_table) * (size_t)t->names.T;
  size_t fb = sizeof(ur__tbe_feature) * (size_t)t->names.F;
  size_t fat = ur__tbe_names_features_at(&t->names, sizeof(ur__tbe_table));
  int64_t db = (int64_t)(fat + fb);
  /* a call's VBE arrays, then the early copies' (tbe.c's call_args): on their own streams */
  int64_t cb = 2 * 3 * (int64_t)sizeof(int64_t) * (t->names.F + 1);
  ur_status st;
  if ((st = ur__tbe_home_tensor(t, &t->desc, UR_DTYPE_U8, db)) ||
      (st = ur__tbe_home_tensor(t, &t->callbuf, UR_DTYPE_U8, cb)))
    return st;
  if ((st = t->be->copy(NULL, ur_tensor_data(t->desc), t->tables, tb))) return st;
  st = t->be->copy(NULL, (char *)ur_tensor_data(t->desc) + fat, t->names.features, fb);
  if (!st) st = t->be->stream_sync(NULL);
  return st;
}

ur_status ur_tbe_new(ur_tbe **out, const ur_tbe_config *config, int32_t num_tables,
                     const ur_tbe_table_config *tables, int32_t num_features,
                     const int32_t *feature_table, const char *const *feature_names) {
  UR__ARGS(out, config, tables, feature_table);
  *out = NULL;
  ur_status st = check_config(config);
  if (!st) st = ur__tbe_check_counts("tbe", num_tables, num_features);
  if (st) return st;
  ur_tbe *t = calloc(1, sizeof *t);
  if (!t) return ur__error(UR_STATUS_OOM, "tbe: out of host memory");
  t->cfg = *config;
  t->home = config->device >= 0 ? UR_PLACE_DEVICE : UR_PLACE_HOST;
  t->be = ur__backend_for(t->home);
  t->nstate = config->optim.kind == UR_OPTIM_KIND_SGD    ? 0
              : config->optim.kind == UR_OPTIM_KIND_ADAM ? 2
                                                          : 1;
  ur__tbe_names *n = &t->names;
  st = ur__tbe_names_init(n, "tbe", num_tables, num_features);
  t->tc = calloc((size_t)num_tables, sizeof *t->tc);
  t->tables = calloc((size_t)num_tables, sizeof *t->tables);
  t->woff = calloc((size_t)num_tables, sizeof *t->woff);
  t->soff = calloc((size_t)num_tables, sizeof *t->soff);
  t->splace = calloc((size_t)num_tables, sizeof *t->splace);
  t->owner = calloc((size_t)num_tables, sizeof *t->owner);
  t->lost = calloc((size_t)num_tables, sizeof *t->lost);
  t->counts = calloc((size_t)num_tables, sizeof *t->counts);
  t->perm = calloc((size_t)num_tables, sizeof *t->perm);
  t->perm_gen = calloc((size_t)num_tables, sizeof *t->perm_gen);
  if (st || !t->tc || !t->tables || !t->woff || !t->soff || !t->splace || !t->owner || !t->lost ||
      !t->counts || !t->perm || !t->perm_gen) {
    ur_tbe_free(t);
    return ur__error(UR_STATUS_OOM, "tbe: out of host memory");
  }
  for (int32_t i = 0; i < num_tables && !st; i++)
    if (!(st = ur__tbe_names_table(n, i, tables[i].name, "table"))) {
      t->tc[i] = tables[i];
      t->tc[i].name = n->tnames[i];
    }
  for (int32_t i = 0; i < num_tables && !st; i++)
    if (!(st = check_table(config, &tables[i], n->tnames[i])))
      st = ur__tbe_names_check(n, i, tables[i].dim, tables[i].pooling);
  if (!st) st = ur__tbe_names_features(n, feature_table, feature_names, "feature");
  if (st) {
    ur_tbe_free(t);
    return st;
  }
  if ((st = alloc_storages(t)) || (st = ur__tbe_home_tensor(t, &t->flags, UR_DTYPE_I64, 2)) ||
      (st = t->be->fill(NULL, ur_tensor_data(t->flags), 1, 8, (uint64_t)UR_TBE_NO_BAD)) ||
      (st = t->be->fill(NULL, (int64_t *)ur_tensor_data(t->flags) + 1, 1, 8, 0))) {
    ur_tbe_free(t);
    return st;
  }
  for (int32_t i = 0; i < num_tables && !st; i++) {
    double b = 1.0 / sqrt((double)logical_rows(&tables[i]));
    st = draw(NULL, t, i, -b, b, config->seed);
  }
  if (!st && t->home == UR_PLACE_DEVICE) st = prepare_device(t);
  if (st) {
    ur_tbe_free(t);
    return st;
  }
  *out = t;
  return UR_STATUS_OK;
}

void ur_tbe_free(ur_tbe *t) {
  if (!t) return;
  /* copies still going home write rows about to be freed, and host calls of early copies may
   * still read them (nothing to tell of a failure here) */
  (void)ur__tbe_far_settle(t);
  if (t->far_host[0] || t->far_host[1]) (void)t->be->device_sync();
  /* last in, first out: a hook may lean on what an earlier one lent */
  for (int32_t k = t->nhooks - 1; k >= 0; k--) t->hooks[k].fn(t->hooks[k].ctx);
  free(t->hooks);
  free(t->owner);
  for (int32_t i = 0; t->lost && i < t->names.T; i++)
    if (t->lost[i] != lost_unsaid) free(t->lost[i]);
  free(t->lost);
  for (int p = 0; p < UR_PLACE_COUNT; p++) {
    for (int d = 0; d < UR__TBE_NDT; d++) ur_tensor_free(t->wstore[p][d]);
    ur_tensor_free(t->sstore[p]);
  }
  ur_tensor_free(t->desc);
  ur_tensor_free(t->callbuf);
  ur_tensor_free(t->work);
  for (int k = 0; k < UR__FAR_MAPS; k++) { /* the far rows' copies (far.c) */
    ur_tensor_free(t->far[k]);
    ur_tensor_free(t->far_host[k]); /* waits for the device: its host calls read it */
    if (t->far_home_ev[k]) t->be->event_free(t->far_home_ev[k]);
  }
  for (int k = 0; k < 2; k++)
    if (t->far_ev[k]) t->be->event_free(t->far_ev[k]);
  if (t->far_bwd_ev) t->be->event_free(t->far_bwd_ev);
  if (t->far_stream) t->be->stream_free(t->far_stream);
  ur_tensor_free(t->swapbuf);
  ur_tensor_free(t->flags);
  for (int32_t i = 0; t->counts && i < t->names.T; i++) ur_tensor_free(t->counts[i]);
  for (int32_t i = 0; t->perm && i < t->names.T; i++) ur_tensor_free(t->perm[i]);
  free(t->counts);
  free(t->perm);
  free(t->perm_gen);
  ur__tbe_names_free(&t->names);
  free(t->tc);
  free(t->tables);
  free(t->woff);
  free(t->soff);
  free(t->splace);
  free(t);
}

ur_status ur__tbe_hook_add(ur_tbe *t, ur__tbe_hook_fn fn, void *ctx) {
  if (t->nhooks == t->cap_hooks) {
    int32_t n = t->cap_hooks ? 2 * t->cap_hooks : 4;
    ur__tbe_hook *h = realloc(t->hooks, sizeof *h * (size_t)n);
    if (!h) return ur__error(UR_STATUS_OOM, "tbe: out of host memory");
    t->hooks = h;
    t->cap_hooks = n;
  }
  t->hooks[t->nhooks++] = (ur__tbe_hook){fn, ctx};
  return UR_STATUS_OK;
}

void ur__tbe_hook_remove(ur_tbe *t, ur__tbe_hook_fn fn, void *ctx) {
  for (int32_t k = 0; k < t->nhooks; k++)
    if (t->hooks[k].fn == fn && t->hooks[k].ctx == ctx) {
      memmove(t->hooks + k, t->hooks + k + 1, sizeof *t->hooks * (size_t)(t->nhooks - k - 1));
      t->nhooks--;
      return;
    }
}

/* ---- accessors ---- */

int32_t ur_tbe_num_tables(const ur_tbe *t) {
  UR__ARGS_OR(-1, t);
  return t->names.T;
}
int32_t ur_tbe_num_features(const ur_tbe *t) {
  UR__ARGS_OR(-1, t);
  return t->names.F;
}
int32_t ur_tbe_device(const ur_tbe *t) {
  UR__ARGS_OR(-1, t);
  return t->cfg.device;
}
int64_t ur_tbe_out_dim(const ur_tbe *t) {
  UR__ARGS_OR(-1, t);
  return t->names.out_dim;
}
int64_t ur_tbe_feature_col(const ur_tbe *t, int32_t f) {
  UR__ARGS_OR(-1, t);
  return ur__tbe_names_fcol(&t->names, f);
}
const char *ur_tbe_table_name(const ur_tbe *t, int32_t i) {
  UR__ARGS_OR(NULL, t);
  return ur__tbe_names_tname(&t->names, i);
}
const char *ur_tbe_feature_name(const ur_tbe *t, int32_t f) {
  UR__ARGS_OR(NULL, t);
  return ur__tbe_names_fname(&t->names, f);
}
int32_t ur_tbe_feature_table(const ur_tbe *t, int32_t f) {
  UR__ARGS_OR(-1, t);
  return ur__tbe_names_ftable(&t->names, f);
}
int32_t ur_tbe_state_count(const ur_tbe *t) {
  UR__ARGS_OR(-1, t);
  return t->nstate;
}
const char *ur_tbe_state_name(const ur_tbe *t, int32_t which) {
  UR__ARGS_OR(NULL, t);
  return which >= 0 && which < t->nstate ? state_names[t->cfg.optim.kind][which] : NULL;
}

ur_status ur_tbe_table(const ur_tbe *t, int32_t i, ur_tensor **out) {
  UR__ARGS(t, out);
  *out = NULL;
  ur_status st = ur__tbe_names_index(&t->names, i);
  if (!st) st = ur__tbe_check_lost(t, i, "tbe table");
  if (st) return st;
  /* a view reads and writes the rows: those written behind the last step are home first */
  if ((st = ur__tbe_far_settle(t))) return st;
  const ur_tbe_table_config *c = &t->tc[i];
  int64_t shape[2] = {c->rows, c->dim};
  return ur_tensor_view_as(t->wstore[storage_place(t, c->place)][c->dtype], out, t->woff[i], 2,
                           shape);
}

ur_status ur_tbe_state(const ur_tbe *t, int32_t i, int32_t which, ur_tensor **out) {
  UR__ARGS(t, out);
  *out = NULL;
  ur_status st = ur__tbe_names_index(&t->names, i);
  if (!st) st = ur__tbe_check_lost(t, i, "tbe state");
  if (st) return st;
  if (which < 0 || which >= t->nstate)
    return ur__error(UR_STATUS_INVALID, "tbe: optimizer state %d does not exist; this "
                                        "optimizer keeps %d per table", (int)which, (int)t->nstate);
  const ur_tbe_table_config *c = &t->tc[i];
  int rowwise = t->cfg.optim.kind == UR_OPTIM_KIND_ROWWISE_ADAGRAD;
  int64_t shape[2] = {c->rows, c->dim};
  float *base = (float *)ur_tensor_data(t->sstore[t->splace[i]]);
  float *p = base + t->soff[i];
  if (which) p += align_up(state_elems(t, i), ALIGN_BYTES / 4);
  return ur_tensor_view_as(t->sstore[t->splace[i]], out, p - base, rowwise ? 1 : 2, shape);
}

static const ur_backend *writer_of(const ur_tbe *t, ur_place p);

/* Table i's optimizer state all zeros, as a new table's (init_table after its rows were lost). */
static ur_status zero_state(ur_stream *s, ur_tbe *t, int32_t i) {
  if (!t->nstate) return UR_STATUS_OK;
  ur__tbe_table d;
  int32_t place;
  ur_status st = ur__tbe_backing(t, i, &d, &place);
  const ur_backend *w = writer_of(t, (ur_place)t->splace[i]);
  int on_gpu = w != ur__cpu();
  if (!st && !on_gpu && t->home == UR_PLACE_DEVICE) st = ur_device_sync();
  size_t n = (size_t)state_elems(t, i);
  void *sh = on_gpu && s ? s->handle : NULL;
  if (!st) st = w->fill(sh, d.state1, n, 4, 0);
  if (!st && d.state2) st = w->fill(sh, d.state2, n, 4, 0);
  if (!st && on_gpu) st = w->stream_sync(sh);
  return st;
}

ur_status ur_tbe_init_table(ur_stream *s, ur_tbe *t, int32_t i, double lo, double hi,
                            uint64_t seed) {
  UR__ARGS(t);
  ur_status st = ur__tbe_names_index(&t->names, i);
  if (st) return st;
  if (!isfinite(lo) || !isfinite(hi) || lo > hi)
    return ur__error(UR_STATUS_INVALID,
                     "tbe: init bounds [%g, %g) are not finite with low <= high", lo, hi);
  if ((st = ur__tbe_far_drop(t))) return st;
  if ((st = draw(s, t, i, lo, hi, seed))) return st;
  /* rows a cache lost: its state too is written (zeros), its descriptor uploaded again */
  if (t->lost[i] && !(st = zero_state(s, t, i)) && !(st = upload_desc(t))) {
    if (t->lost[i] != lost_unsaid) free(t->lost[i]);
    t->lost[i] = NULL;
  }
  return st;
}

/* The backend that writes memory of placement p: the collection's GPU for device memory, and
 * for managed memory when the collection runs on a GPU (its rows may sit in HBM); else the
 * CPU, after the device is done with it. */
static const ur_backend *writer_of(const ur_tbe *t, ur_place p) {
  if (p == UR_PLACE_DEVICE || (p == UR_PLACE_MANAGED && t->home == UR_PLACE_DEVICE)) return t->be;
  return ur__cpu();
}

/* One array a reset writes: its rows indexed by physical row (weights, state) or by id
 * (access counters). */
typedef struct reset_part {
  void *base;
  ur_place place;
  size_t row_bytes;
  int by_id, is_weights;
} reset_part;

ur_status ur_tbe_reset_rows(ur_stream *s, ur_tbe *t, int32_t i, const int64_t *ids, int64_t n) {
  UR__ARGS(t, ids);
  ur_status st = ur__tbe_names_index(&t->names, i);
  if (!st) st = ur__tbe_check_lost(t, i, "tbe reset_rows");
  if (st) return st;
  const ur_tbe_table_config *c = &t->tc[i];
  if (n < 0) return ur__error(UR_STATUS_INVALID, "tbe: reset_rows of %lld rows", (long long)n);
  if ((st = ur__tbe_far_drop(t))) return st;
  /* a shard's rows are drawn at its logical table's counters, which rand_rows does not take */
  if (c->logical_rows != 0)
    return ur__error(UR_STATUS_INVALID,
                     "tbe: reset_rows: table '%s' is a shard of logical table %d; rows of sharded "
                     "tables cannot be reset (managed collisions need unsharded tables)",
                     c->name, (int)c->logical);
  for (int64_t k = 0; k < n; k++)
    if (ids[k] < 0 || ids[k] >= c->rows)
      return ur__error(UR_STATUS_INVALID,
                       "tbe: reset_rows: ids[%lld] = %lld is outside table '%s' (rows 0..%lld)",
                       (long long)k, (long long)ids[k], c->name, (long long)c->rows - 1);
  if (!n) return UR_STATUS_OK;
  ur__tbe_table d;
  int32_t wplace;
  if ((st = ur__tbe_backing(t, i, &d, &wplace))) return st;
  void *sh = s ? s->handle : NULL;
  /* The ids and their physical rows in host memory, and (when the GPU writes) on the device. */
  int64_t *hphys = malloc(sizeof(int64_t) * (size_t)n);
  if (!hphys) return ur__error(UR_STATUS_OOM, "tbe: out of host memory");
  ur_tensor *dev = NULL;
  int64_t *dids = NULL, *dphys = NULL;
  ur_tensor *perm = t->perm[i];
  if (t->home == UR_PLACE_DEVICE) {
    st = ur__tbe_home_tensor(t, &dev, UR_DTYPE_I64, 2 * n);
    if (!st) {
      dids = ur_tensor_data(dev);
      dphys = dids + n;
      st = t->be->copy(sh, dids, ids, sizeof(int64_t) * (size_t)n);
    }
    if (!st && perm) {
      if (!(st = UR__NEED(t->be, tbe, gather_rows)))
        st = t->be->tbe->gather_rows(sh, ur_tensor_data(perm), c->rows, 8, dids, n, dphys);
      if (!st) st = t->be->copy(sh, hphys, dphys, sizeof(int64_t) * (size_t)n);
      if (!st) st = t->be->stream_sync(sh);
    } else if (!st) {
      memcpy(hphys, ids, sizeof(int64_t) * (size_t)n);
      st = t->be->copy(sh, dphys, ids, sizeof(int64_t) * (size_t)n);
    }
  } else {
    const int64_t *p = perm ? ur_tensor_data(perm) : NULL;
    for (int64_t k = 0; k < n; k++) hphys[k] = p ? p[ids[k]] : ids[k];
  }
  /* Every array the reset writes, and the rows it is indexed by. */
  reset_part parts[4];
  int np = 0;
  parts[np++] = (reset_part){d.weights, (ur_place)wplace, 0, 0, 1};
  int rowwise = t->cfg.optim.kind == UR_OPTIM_KIND_ROWWISE_ADAGRAD;
  size_t srow = (size_t)(rowwise ? 1 : c->dim) * 4;
  if (d.state1) parts[np++] = (reset_part){d.state1, (ur_place)t->splace[i], srow, 0, 0};
  if (d.state2) parts[np++] = (reset_part){d.state2, (ur_place)t->splace[i], srow, 0, 0};
  if (t->counts[i]) parts[np++] = (reset_part){ur_tensor_data(t->counts[i]), t->home, 4, 1, 0};
  double b = 1.0 / sqrt((double)c->rows);
  uint64_t seed = table_seed(t->cfg.seed, i);
  int synced = 0;
  for (int k = 0; k < np && !st; k++) {
    const ur_backend *w = writer_of(t, parts[k].place);
    int on_gpu = w != ur__cpu();
    const int64_t *rows = parts[k].by_id ? (on_gpu ? dids : ids) : (on_gpu ? dphys : hphys);
    const int64_t *from = on_gpu ? dids : ids;
    if (!on_gpu && !synced && t->home == UR_PLACE_DEVICE) {
      st = ur_device_sync();
      synced = 1;
      if (st) break;
    }
    if (parts[k].is_weights ? !w->rand_rows : !w->zero_rows) {
      st = ur__missing(w, "core", parts[k].is_weights ? "rand_rows" : "zero_rows");
    } else if (parts[k].is_weights) {
      st = w->rand_rows(on_gpu ? sh : NULL, parts[k].base, c->dtype, (size_t)c->dim, rows, from,
                        (size_t)n, -b, b, seed);
    } else {
      st = w->zero_rows(on_gpu ? sh : NULL, parts[k].base, parts[k].row_bytes, rows, (size_t)n);
    }
  }
  /* the device copies of ids and rows must outlive the kernels that read them */
  if (dev) {
    ur_status st2 = t->be->stream_sync(sh);
    if (!st) st = st2;
  }
  ur_tensor_free(dev);
  free(hphys);
  return st;
}

/* ---- what the rest of the room reaches (table.h) ---- */

ur_status ur__tbe_home_tensor(const ur_tbe *t, ur_tensor **out, ur_dtype dtype, int64_t n) {
  return ur_tensor_new(out, dtype, 1, &n, t->home,
                       t->home == UR_PLACE_DEVICE ? t->cfg.device : UR_LOC_CPU);
}

/* A new layout (set_permutation gives ids other rows' values without moving them): the far
 * rows' copies, keyed by id, go with it. */
ur_status ur__tbe_perm_changed(ur_tbe *t, int32_t i) {
  t->perm_gen[i]++;
  return ur__tbe_far_drop(t);
}

ur_status ur__tbe_sync_desc(ur_tbe *t) {
  if (!t->desc) return UR_STATUS_OK;
  /* kernels in flight on any stream may be reading the descriptors */
  ur_status st = t->be->device_sync();
  return st ? st : upload_desc(t);
}

ur_status ur__tbe_backing(const ur_tbe *t, int32_t i, ur__tbe_table *out, int32_t *place) {
  ur_status st = ur__tbe_names_index(&t->names, i);
  if (st) return st;
  const ur_tbe_table_config *c = &t->tc[i];
  ur_tensor *w = t->wstore[storage_place(t, c->place)][c->dtype];
  *out = t->tables[i];
  out->weights = (char *)ur_tensor_data(w) + (size_t)t->woff[i] * ur_dtype_size(c->dtype);
  out->rows = c->rows;
  out->state1 = out->state2 = NULL;
  if (t->nstate) {
    out->state1 = (float *)ur_tensor_data(t->sstore[t->splace[i]]) + t->soff[i];
    out->state2 = t->nstate > 1 ? out->state1 + align_up(state_elems(t, i), ALIGN_BYTES / 4) : NULL;
  }
  *place = storage_place(t, c->place);
  return UR_STATUS_OK;
}

/* A CPU collection's managed tables answer as their recorded hints say (the CPU emulates
 * managed memory so); its host tables have no link to be far across. */
int64_t ur__tbe_far_from(const ur_tbe *t, int32_t i) {
  int64_t rows = t->tables[i].rows;
  if (t->owner[i]) return rows; /* a cache's slots are in HBM */
  ur__tbe_table b;
  int32_t place = 0;
  if (ur__tbe_backing(t, i, &b, &place)) return rows;
  if (place == UR_PLACE_PINNED) return 0;
  if (place != UR_PLACE_MANAGED) return rows;
  const ur_tbe_table_config *c = &t->tc[i];
  ur_tensor *w = t->wstore[place][c->dtype];
  int64_t per = (int64_t)c->dim;
  uint64_t run = ur__hint_gpu_run(w, t->woff[i], c->rows * per);
  return (int64_t)(run / ((uint64_t)per * ur_dtype_size(c->dtype)));
}

ur_status ur__tbe_far_settle(const ur_tbe *t) {
  /* the stream writes them in order: the last map's done is every one's */
  return t->far_home_pending ? t->be->event_sync(t->far_home_ev[t->far_home_last]) : UR_STATUS_OK;
}

ur_status ur__tbe_far_drop(ur_tbe *t) {
  ur_status st = ur__tbe_far_settle(t);
  if (!st) t->far_home_pending = 0;
  t->far_ready = t->far_early = t->far_homing = t->far_kept = 0;
  return st;
}

/* Table i's descriptor on the host pointed at rows lent by owner (NULL: its own storage). */
static void point_at(ur_tbe *t, int32_t i, const void *owner, void *weights, float *state1,
                     float *state2, const int64_t *row_ids, int64_t rows) {
  if (!owner) {
    ur__tbe_table b;
    int32_t place;
    ur__tbe_backing(t, i, &b, &place);
    weights = b.weights;
    state1 = b.state1;
    state2 = b.state2;
    rows = b.rows;
    row_ids = NULL;
  }
  t->owner[i] = owner;
  t->tables[i].weights = weights;
  t->tables[i].state1 = state1;
  t->tables[i].state2 = state2;
  t->tables[i].row_ids = row_ids;
  t->tables[i].rows = rows;
  t->tables[i].far_from = ur__tbe_far_from(t, i);
}

ur_status ur__tbe_redirect(ur_tbe *t, int32_t i, const void *owner, void *weights,
                           float *state1, float *state2, const int64_t *row_ids, int64_t rows) {
  ur_status st = ur__tbe_names_index(&t->names, i);
  if (st) return st;
  if (owner && (st = ur__tbe_check_lost(t, i, "cache"))) return st;
  if (owner && t->owner[i] && t->owner[i] != owner)
    return ur__error(UR_STATUS_INVALID, "cache: table '%s' is already cached by another cache",
                     t->tc[i].name);
  if (owner && (t->tables[i].perm || t->tables[i].counts))
    return ur__error(UR_STATUS_INVALID,
                     "cache: table '%s' has a row permutation or access counters; a cached table "
                     "takes neither (the cache chooses where its rows live)",
                     t->tc[i].name);
  /* kernels in flight may read the descriptors or the rows */
  if ((st = t->be->device_sync())) return st;
  point_at(t, i, owner, weights, state1, state2, row_ids, rows);
  if ((st = ur__tbe_far_drop(t))) return st;
  rekey(t);
  return upload_desc(t);
}

void ur__tbe_rows_lost(ur_tbe *t, int32_t i, const char *why) {
  if (i < 0 || i >= t->names.T) return;
  /* kernels in flight may read the descriptors; where the GPU cannot be reached, the host's
   * view alone, which every launch checks first, and init_table uploads */
  (void)t->be->device_sync();
  point_at(t, i, NULL, NULL, NULL, NULL, NULL, 0);
  (void)ur__tbe_far_drop(t);
  rekey(t);
  (void)upload_desc(t);
  if (!t->lost[i]) t->lost[i] = strdup(why && *why ? why : "no reason kept");
  if (!t->lost[i]) t->lost[i] = (char *)lost_unsaid;
}

ur_status ur__tbe_check_lost(const ur_tbe *t, int32_t i, const char *who) {
  int32_t lo = i < 0 ? 0 : i, hi = i < 0 ? t->names.T : i + 1;
  for (int32_t k = lo; k < hi; k++)
    if (t->lost[k])
      return ur__error(UR_STATUS_INVALID, "%s: table '%s' lost the rows its cache held (%s); its rows "
                       "and optimizer state at home are stale: init_table it (its state is zeroed), "
                       "then load a checkpoint, to use it again",
                       who, t->tc[k].name, t->lost[k]);
  return UR_STATUS_OK;
}
