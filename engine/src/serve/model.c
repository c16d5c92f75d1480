/* model.c: exported models served from C (uvmrec.h section 10): opening a model file (its
 * description checked against its tensors before anything is placed), DLRM's forward pass from
 * the engine's ops (linear, the dot interaction or DCNv2's cross layers, the quantized
 * collection, the sigmoid), and a pool of contexts (a stream and buffers each) so that callers
 * on many threads predict at once.  A request is checked whole before any work, and a failed
 * call gives its context back: the model goes on serving. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "core/nonfinite.h"
#include "data/kjt.h"
#include "embedding/qtbe.h"

#define MAX_LAYERS 64
#define ALIGN_ELEMS 64 /* each activation starts 256 bytes (f32) after the one before */

typedef struct layer {
  ur_tensor *w, *b;         /* w [out, in] (or U [out, rank] with v), b [out] */
  ur_tensor *v;             /* DCNv2 low rank: V [rank, in]; NULL at full rank */
  int64_t in, out, rank;
  int32_t pad;              /* the last pad columns of w (and of its input) are zero padding */
  ur_act act;
} layer;

/* One caller's stream and buffers, sized for cap samples and nvals values. */
typedef struct ctx {
  ur_stream *stream;
  int64_t cap, nvals;
  ur_tensor *act;           /* every activation of a batch, in the compute dtype */
  ur_tensor *f32;           /* dense input, logits and probabilities in f32 */
  ur_tensor *values, *offsets, *weights; /* the request's ids where the GPU reads them */
  struct ctx *next;
} ctx;

struct ur_model {
  ur_safetensors *file;     /* kept open: metadata strings point into it */
  ur_model_options opts;
  ur_model_props props;
  const ur_backend *be;
  ur_place place;           /* of the dense weights and buffers: device, or host */
  ur_dtype dt;              /* f32 or bf16 */
  int32_t dcn, self_inter, nb, nt, nc, F, T, dim, num_dense;
  layer bottom[MAX_LAYERS], top[MAX_LAYERS], cross[MAX_LAYERS];
  int64_t width;            /* of the interaction's output */
  int64_t per_row;          /* activation elements per sample, with alignment */
  ur_qtbe *qtbe;
  char **features;
  int64_t *modulo;          /* per feature: its table's */
  uint8_t *weighted;        /* per feature: its table was trained with per-id weights */
  int32_t nweighted;        /* features so trained */
  pthread_mutex_t lock;
  pthread_cond_t freed;
  ctx *idle;
  int32_t made;
};

size_t ur_sizeof_model_options(void) { return sizeof(ur_model_options); }
size_t ur_sizeof_model_props(void) { return sizeof(ur_model_props); }

void ur_model_options_init(ur_model_options *o) {
  if (!o) return;
  memset(o, 0, sizeof *o);
  o->device = -1;
  if (ur_device_count() > 0 && ur_device_get(&o->device)) o->device = 0;
  o->table_place = -1;
  o->bounds = UR_TBE_BOUNDS_FATAL;
  o->max_callers = 0;
  o->hot_fraction = 0.2;
}

/* ---- the description ---- */

static ur_json *member(const ur_json *o, const char *key) {
  if (!o || ur_json_typeof(o) != UR_JSON_OBJECT) return NULL;
  for (void *it = ur_json_iter(o); it; it = ur_json_iter_next(o, it)) {
    size_t n;
    const char *k = ur_json_iter_key(it, &n);
    if (n == strlen(key) && !memcmp(k, key, n)) return ur_json_iter_value(it);
  }
  return NULL;
}

static const char *str_of(const ur_json *v) {
  size_t n;
  return v ? ur_json_string(v, &n) : NULL;
}

/* The file being read, and the tensors its description named so far. */
typedef struct reader {
  const char *path;
  ur_safetensors *f;
  uint8_t *named;           /* per entry of the file */
  int values;               /* want() also reads the values (the check pass) */
} reader;

static ur_status bad(const reader *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static ur_status bad(const reader *r, const char *fmt, ...) {
  char what[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  return ur__error(UR_STATUS_FORMAT, "model file %s: %s", r->path, what);
}

static ur_status get_int(const reader *r, const ur_json *o, const char *key, const char *where,
                         int64_t lo, int64_t hi, int64_t *out) {
  ur_json *v = member(o, key);
  if (!v || ur_json_typeof(v) != UR_JSON_INTEGER || ur_json_integer(v) < lo || ur_json_integer(v) > hi)
    return bad(r, "the description's %s%s%s is missing or not a whole number in %lld..%lld", where,
               *where ? "." : "", key, (long long)lo, (long long)hi);
  *out = ur_json_integer(v);
  return UR_STATUS_OK;
}

static ur_status get_str(const reader *r, const ur_json *o, const char *key, const char *where,
                         const char **out) {
  *out = str_of(member(o, key));
  if (!*out) return bad(r, "the description's %s%s%s is missing or not a string", where, *where ? "." : "", key);
  return UR_STATUS_OK;
}

/* A tensor's bytes against the checksum export wrote with them (ur_safetensors_verify), and
 * the first element no export writes: NaN or infinity in f32, bf16 or f16 values (found in the
 * same read, as checkpoints are checked), or in the f16 scale or bias heading each row of u8
 * quantized rows.  A file whose bytes changed after export is refused rather than served. */
static ur_status check_finite(const reader *r, const char *name, int32_t i, const ur_safetensors_entry *e) {
  int64_t at = -1, cols = e->ndim == 2 ? e->shape[1] : 1;
  ur_status st;
  if (e->dtype == UR_DTYPE_U8 && e->ndim == 2) {
    if ((st = ur_safetensors_verify(r->f, i, NULL))) return st;
    ur_tensor *v = NULL;
    if ((st = ur_safetensors_view(r->f, i, &v))) return st;
    const uint8_t *p = ur_tensor_data(v);
    for (int64_t row = 0; row < e->shape[0] && at < 0; row++) {
      uint16_t h[2];
      memcpy(h, p + row * cols, 4);
      if (ur__nonfinite_f16(h[0]) || ur__nonfinite_f16(h[1])) at = row;
    }
    ur_tensor_free(v);
    if (at < 0) return UR_STATUS_OK;
    return bad(r, "tensor '%s' holds a non-finite f16 scale or bias at row %lld (a file changed after export?)",
               name, (long long)at);
  }
  if ((st = ur_safetensors_verify(r->f, i, &at)) || at < 0) return st;
  if (e->ndim == 2)
    return bad(r, "tensor '%s' holds a non-finite value at row %lld, column %lld (a file changed after export?)",
               name, (long long)(at / cols), (long long)(at % cols));
  return bad(r, "tensor '%s' holds a non-finite value at element %lld (a file changed after export?)", name,
             (long long)at);
}

/* The tensor `name` of the file, which must be dtype [d0, d1] (d1 < 0: 1-D [d0]); d0 < 0: a
 * tensor that is no matrix, whose rows the message calls rows_name (a layer's outputs). */
static ur_status want_rows(const reader *r, const char *name, ur_dtype dtype, int64_t d0, int64_t d1,
                           const char *what, const char *rows_name) {
  int32_t i = ur_safetensors_find(r->f, name);
  if (i < 0) return bad(r, "no tensor '%s' (%s)", name, what);
  r->named[i] = 1;
  ur_safetensors_entry e;
  ur_status st = ur_safetensors_entry_get(r->f, i, &e);
  if (st) return st;
  int ndim = d1 < 0 ? 1 : 2;
  if (e.dtype != (int32_t)dtype || e.ndim != ndim || e.shape[0] != d0 || (ndim == 2 && e.shape[1] != d1)) {
    char got[64], need[64];
    if (e.ndim == 1) snprintf(got, sizeof got, "[%lld]", (long long)e.shape[0]);
    else if (e.ndim == 2) snprintf(got, sizeof got, "[%lld, %lld]", (long long)e.shape[0], (long long)e.shape[1]);
    else snprintf(got, sizeof got, "of %d dimensions", (int)e.ndim);
    if (ndim == 1) snprintf(need, sizeof need, "[%lld]", (long long)d0);
    else if (d0 < 0) snprintf(need, sizeof need, "[%s, %lld]", rows_name ? rows_name : "rows", (long long)d1);
    else snprintf(need, sizeof need, "[%lld, %lld]", (long long)d0, (long long)d1);
    return bad(r, "tensor '%s' is %s %s; %s needs %s %s", name,
               (unsigned)e.dtype < UR_DTYPE_COUNT ? ur_dtype_name((ur_dtype)e.dtype) : "?", got,
               what, ur_dtype_name(dtype), need);
  }
  if (r->values) return check_finite(r, name, i, &e);
  return UR_STATUS_OK;
}

static ur_status want(const reader *r, const char *name, ur_dtype dtype, int64_t d0, int64_t d1,
                      const char *what) {
  return want_rows(r, name, dtype, d0, d1, what, NULL);
}

/* A dense tensor of the file into a new one where the model runs. */
static ur_status load_dense(ur_model *m, const reader *r, const char *name, ur_tensor **out) {
  int32_t i = ur_safetensors_find(r->f, name);
  ur_safetensors_entry e;
  ur_status st = ur_safetensors_entry_get(r->f, i, &e);
  if (st) return st;
  if ((st = ur_tensor_new(out, (ur_dtype)e.dtype, e.ndim, e.shape, m->place,
                          m->place == UR_PLACE_DEVICE ? m->opts.device : UR_LOC_CPU))) {
    char shape[128];
    ur__shape_text(e.ndim, e.shape, shape, sizeof shape);
    return ur__error_cause(st, "model file %s: tensor '%s' (%s %s, %llu bytes)", r->path, name,
                           ur_dtype_name((ur_dtype)e.dtype), shape, (unsigned long long)(e.end - e.begin));
  }
  st = ur_safetensors_load(NULL, r->f, 1, &name, out, 0);
  if (!st) m->props.dense_bytes += ur_tensor_nbytes(*out);
  return st;
}

/* A list of Linear layers ({weight, bias, act}) from width `in`; *out_width its last width.
 * The first layer's weight may instead have padded_in columns (> in), the rest zero padding:
 * a training run's top MLP reads the dot interaction's output padded to a multiple of 8
 * (models/dlrm.lua), and serving keeps that layout, so its products are the training run's. */
static ur_status read_mlp(ur_model *m, const reader *r, const ur_json *list, const char *what,
                          layer *ls, int32_t *n, int64_t in, int64_t padded_in, int64_t *out_width) {
  if (!list || ur_json_typeof(list) != UR_JSON_ARRAY || !ur_json_size(list) ||
      ur_json_size(list) > MAX_LAYERS)
    return bad(r, "the description's %s is not a list of 1 to %d layers", what, MAX_LAYERS);
  *n = (int32_t)ur_json_size(list);
  for (int32_t k = 0; k < *n; k++) {
    const ur_json *l = ur_json_item(list, (size_t)k);
    char where[64];
    snprintf(where, sizeof where, "%s[%d]", what, (int)k + 1);
    const char *wn, *bn, *act;
    ur_status st;
    if ((st = get_str(r, l, "weight", where, &wn)) || (st = get_str(r, l, "bias", where, &bn)) ||
        (st = get_str(r, l, "act", where, &act)))
      return st;
    if (strcmp(act, "relu") && strcmp(act, "none"))
      return bad(r, "the description's %s.act is '%s'; expected relu or none", where, act);
    int32_t i = ur_safetensors_find(r->f, wn);
    ur_safetensors_entry e;
    if (i < 0) return bad(r, "no tensor '%s' (%s's weight)", wn, where);
    if ((st = ur_safetensors_entry_get(r->f, i, &e))) return st;
    int64_t out = e.ndim == 2 ? e.shape[0] : -1;
    if (out == 0) return bad(r, "'%s' (%s's weight) has no rows: a layer of 0 outputs", wn, where);
    int64_t in_w = k == 0 && padded_in > in && e.ndim == 2 && e.shape[1] == padded_in ? padded_in : in;
    if (in_w - in > UR_DENSE_PAD_MAX)
      return bad(r, "'%s' pads %lld columns; at most %d are padding", wn, (long long)(in_w - in),
                 UR_DENSE_PAD_MAX);
    if ((st = want_rows(r, wn, m->dt, out, in_w, where, "outputs")) || (st = want(r, bn, m->dt, out, -1, where)))
      return st;
    layer *L = &ls[k];
    L->in = in_w;
    L->pad = (int32_t)(in_w - in);
    L->out = out;
    L->act = strcmp(act, "relu") ? UR_ACT_NONE : UR_ACT_RELU;
    if (m->place != UR_PLACE_COUNT && ((st = load_dense(m, r, wn, &L->w)) || (st = load_dense(m, r, bn, &L->b))))
      return st;
    in = out;
  }
  *out_width = in;
  return UR_STATUS_OK;
}

/* DCNv2's cross layers over width d: {weight, bias} or {V, U, bias}. */
static ur_status read_cross(ur_model *m, const reader *r, const ur_json *list, int64_t d) {
  if (!list || ur_json_typeof(list) != UR_JSON_ARRAY || !ur_json_size(list) ||
      ur_json_size(list) > MAX_LAYERS)
    return bad(r, "the description's cross is not a list of 1 to %d layers", MAX_LAYERS);
  m->nc = (int32_t)ur_json_size(list);
  for (int32_t k = 0; k < m->nc; k++) {
    const ur_json *l = ur_json_item(list, (size_t)k);
    char where[64];
    snprintf(where, sizeof where, "cross[%d]", (int)k + 1);
    layer *L = &m->cross[k];
    L->in = L->out = d;
    const char *bn, *wn = str_of(member(l, "weight")), *vn = str_of(member(l, "V")),
                    *un = str_of(member(l, "U"));
    ur_status st = get_str(r, l, "bias", where, &bn);
    if (!st && !wn && !(vn && un)) st = bad(r, "the description's %s has neither weight nor V and U", where);
    if (!st) st = want(r, bn, m->dt, d, -1, where);
    if (!st && wn) st = want(r, wn, m->dt, d, d, where);
    if (!st && !wn) {
      int32_t i = ur_safetensors_find(r->f, vn);
      ur_safetensors_entry e;
      if (i < 0) return bad(r, "no tensor '%s' (%s's V)", vn, where);
      if ((st = ur_safetensors_entry_get(r->f, i, &e))) return st;
      L->rank = e.ndim == 2 ? e.shape[0] : -1;
      if (L->rank == 0) return bad(r, "'%s' (%s's V) has no rows: a rank of 0", vn, where);
      if (!(st = want_rows(r, vn, m->dt, L->rank, d, where, "rank")))
        st = want(r, un, m->dt, d, L->rank, where);
    }
    if (st) return st;
    if (m->place == UR_PLACE_COUNT) continue;
    if ((st = load_dense(m, r, bn, &L->b))) return st;
    if (wn) st = load_dense(m, r, wn, &L->w);
    else if (!(st = load_dense(m, r, vn, &L->v))) st = load_dense(m, r, un, &L->w);
    if (st) return st;
  }
  return UR_STATUS_OK;
}

static int cmp_name_at(const void *a, const void *b) {
  const char *const *x = a, *const *y = b;
  int c = strcmp(x[0], y[0]);
  return c ? c : (x[1] < y[1] ? -1 : x[1] > y[1]);
}

/* Whether names[0..n-1] (of r's description: `what`) repeat one: *i < *j the first two places
 * of a repeated name (in name order).  O(n log n): a model of thousands of tables is checked as
 * fast as one of ten. */
static ur_status first_repeat(const reader *r, const char *what, const char *const *names, int32_t n, int32_t *i,
                              int32_t *j, int *found) {
  *found = 0;
  size_t bytes = sizeof(char *) * 2 * (size_t)(n ? n : 1);
  const char **pairs = malloc(bytes); /* (name, its place) */
  if (!pairs) return ur__no_memory("model file ", r->path, bytes, "sorting the %d %s' names", (int)n, what);
  for (int32_t k = 0; k < n; k++) {
    pairs[2 * k] = names[k];
    pairs[2 * k + 1] = (const char *)(intptr_t)k;
  }
  qsort(pairs, (size_t)n, 2 * sizeof(char *), cmp_name_at);
  for (int32_t k = 1; k < n && !*found; k++)
    if (!strcmp(pairs[2 * k - 2], pairs[2 * k])) {
      *i = (int32_t)(intptr_t)pairs[2 * k - 1];
      *j = (int32_t)(intptr_t)pairs[2 * k + 1];
      *found = 1;
    }
  free(pairs);
  return UR_STATUS_OK;
}

/* The tables: checked (place == UR_PLACE_COUNT), or made and loaded. */
static ur_status read_tables(ur_model *m, const reader *r, const ur_json *desc) {
  const ur_json *tl = member(desc, "tables"), *fl = member(desc, "features");
  if (!tl || ur_json_typeof(tl) != UR_JSON_ARRAY || !ur_json_size(tl) || ur_json_size(tl) > 4096)
    return bad(r, "the description's tables is not a list of 1 to 4096 tables");
  if (!fl || ur_json_typeof(fl) != UR_JSON_ARRAY || !ur_json_size(fl) || ur_json_size(fl) > 4096)
    return bad(r, "the description's features is not a list of 1 to 4096 names");
  int32_t T = (int32_t)ur_json_size(tl), F = (int32_t)ur_json_size(fl);
  ur_qtbe_table_config *tc = calloc((size_t)T, sizeof *tc);
  uint8_t *tw = calloc((size_t)T, 1);
  int32_t *ft = malloc(sizeof(int32_t) * (size_t)F);
  const char **fn = calloc((size_t)F, sizeof *fn);
  uint64_t lists = (uint64_t)T * (sizeof *tc + 1) + (uint64_t)F * (sizeof(int32_t) + sizeof *fn);
  ur_status st = !tc || !tw || !ft || !fn ? ur__no_memory("model file ", r->path, lists,
                                                          "the description's %d tables and %d features", (int)T, (int)F)
                                          : UR_STATUS_OK;
  for (int32_t f = 0; f < F && !st; f++) {
    fn[f] = str_of(ur_json_item(fl, (size_t)f));
    ft[f] = -1;
    if (!fn[f]) st = bad(r, "the description's features[%d] is not a string", (int)f + 1);
  }
  int32_t ri = 0, rj = 0;
  int rep = 0;
  if (!st) st = first_repeat(r, "features", fn, F, &ri, &rj, &rep);
  if (!st && rep)
    st = bad(r, "the description's features[%d] '%s' repeats features[%d]", (int)rj + 1, fn[rj], (int)ri + 1);
  for (int32_t t = 0; t < T && !st; t++) {
    const ur_json *d = ur_json_item(tl, (size_t)t);
    char where[64];
    snprintf(where, sizeof where, "tables[%d]", (int)t + 1);
    const char *fmt, *pool, *wn;
    int64_t rows, dim, modulo;
    if ((st = get_str(r, d, "name", where, &tc[t].name)) || (st = get_str(r, d, "format", where, &fmt)) ||
        (st = get_str(r, d, "pooling", where, &pool)) || (st = get_str(r, d, "weights", where, &wn)) ||
        (st = get_int(r, d, "rows", where, 1, (int64_t)1 << 50, &rows)) ||
        (st = get_int(r, d, "dim", where, 4, 1024, &dim)) ||
        (st = get_int(r, d, "modulo", where, 0, INT64_MAX, &modulo)))
      break;
    ur_qformat qf;
    if (ur_qformat_parse(fmt, &qf)) {
      st = bad(r, "the description's %s.format is '%s'; expected f32, fp16, int8, int4 or int2", where, fmt);
      break;
    }
    if (strcmp(pool, "sum") && strcmp(pool, "mean")) {
      st = bad(r, "the description's %s.pooling is '%s'; expected sum or mean", where, pool);
      break;
    }
    /* Whether training's batches gave this table's ids weights (absent: no, as in files that
     * predate the key): a request must carry them exactly when some table was. */
    const ur_json *wt = member(d, "weighted");
    if (wt && ur_json_typeof(wt) != UR_JSON_TRUE && ur_json_typeof(wt) != UR_JSON_FALSE) {
      st = bad(r, "the description's %s.weighted is not true or false", where);
      break;
    }
    tw[t] = wt && ur_json_typeof(wt) == UR_JSON_TRUE;
    const ur_json *coll = member(d, "collisions");
    if (coll && ur_json_typeof(coll) != UR_JSON_NULL) {
      st = bad(r, "table '%s' maps its ids through a managed-collision map, which this engine "
                  "does not serve yet", tc[t].name);
      break;
    }
    tc[t].rows = rows;
    tc[t].dim = (int32_t)dim;
    tc[t].format = qf;
    tc[t].pooling = strcmp(pool, "sum") ? UR_POOLING_MEAN : UR_POOLING_SUM;
    tc[t].modulo = modulo;
    if (modulo > rows) { /* ids from rows up to the modulo would all be bad ones */
      st = bad(r, "table '%s' takes ids modulo %lld, but has %lld rows; expected a modulo of at most its rows "
                  "(0: ids as they come)", tc[t].name, (long long)modulo, (long long)rows);
      break;
    }
    if (dim != m->dim) {
      st = bad(r, "table '%s' has dim %lld; the model's is %d", tc[t].name, (long long)dim, (int)m->dim);
      break;
    }
    int64_t rb = ur_qformat_row_bytes(qf, (int32_t)dim);
    if (qf == UR_QFORMAT_F32) st = want(r, wn, UR_DTYPE_F32, rows, dim, tc[t].name);
    else if (qf == UR_QFORMAT_F16) st = want(r, wn, UR_DTYPE_F16, rows, dim, tc[t].name);
    else st = want(r, wn, UR_DTYPE_U8, rows, rb, tc[t].name);
    const char *pn = str_of(member(d, "permutation"));
    if (!st && pn) st = want(r, pn, UR_DTYPE_I64, rows, -1, tc[t].name);
    const ur_json *tf = member(d, "features");
    if (!st && (!tf || ur_json_typeof(tf) != UR_JSON_ARRAY))
      st = bad(r, "the description's %s.features is not a list of names", where);
    for (size_t k = 0; !st && k < ur_json_size(tf); k++) {
      const char *name = str_of(ur_json_item(tf, k));
      int32_t f = 0;
      while (name && f < F && strcmp(fn[f], name)) f++;
      if (!name || f == F) st = bad(r, "table '%s' serves feature '%s', which features does not list",
                                    tc[t].name, name ? name : "?");
      else if (ft[f] >= 0) st = bad(r, "feature '%s' is on two tables", name);
      else ft[f] = t;
    }
  }
  for (int32_t f = 0; f < F && !st; f++)
    if (ft[f] < 0) st = bad(r, "feature '%s' is on no table", fn[f]);
  if (!st) {
    const char **tn = malloc(sizeof(char *) * (size_t)T);
    if (!tn) st = ur__no_memory("model file ", r->path, sizeof(char *) * (size_t)T, "the %d tables' names", (int)T);
    for (int32_t t = 0; t < T && !st; t++) tn[t] = tc[t].name;
    if (!st) st = first_repeat(r, "tables", tn, T, &ri, &rj, &rep);
    if (!st && rep)
      st = bad(r, "the description's tables[%d] and tables[%d] are both named '%s'", (int)ri + 1,
               (int)rj + 1, tn[ri]);
    free(tn);
  }
  if (!st) {
    m->F = F;
    m->T = T;
  }
  if (!st && m->place != UR_PLACE_COUNT) {
    int32_t tp = m->opts.table_place >= 0 ? m->opts.table_place
                 : m->opts.device >= 0 ? UR_PLACE_DEVICE : UR_PLACE_HOST;
    for (int32_t t = 0; t < T; t++) tc[t].place = (ur_place)tp;
    ur_qtbe_config qc = {m->opts.device, (ur_tbe_bounds)m->opts.bounds, m->dt};
    /* a table it could not place (memory, the device) names the file; a placement the options
     * cannot have (device tables on the CPU) is the caller's misuse, named as the option */
    if ((st = ur_qtbe_new(&m->qtbe, &qc, T, tc, F, ft, fn)) && st != UR_STATUS_INVALID)
      st = ur__error_cause(st, "model file %s", r->path);
    m->features = calloc((size_t)F, sizeof(char *));
    m->modulo = calloc((size_t)F, sizeof(int64_t));
    m->weighted = calloc((size_t)F, 1);
    if (!st && (!m->features || !m->modulo || !m->weighted))
      st = ur__no_memory("model file ", r->path, (uint64_t)F * (sizeof(char *) + sizeof(int64_t) + 1),
                     "the %d features' names, modulos and weights", (int)F);
    for (int32_t f = 0; f < F && !st; f++) {
      m->features[f] = strdup(fn[f]);
      m->modulo[f] = tc[ft[f]].modulo;
      m->weighted[f] = tw[ft[f]];
      m->nweighted += tw[ft[f]];
      if (!m->features[f]) st = ur__no_memory("model file ", r->path, strlen(fn[f]) + 1, "feature '%s''s name", fn[f]);
    }
    for (int32_t t = 0; t < T && !st; t++) {
      const ur_json *d = ur_json_item(tl, (size_t)t);
      const char *wn = str_of(member(d, "weights")), *pn = str_of(member(d, "permutation"));
      ur_tensor *view = NULL, *perm = NULL;
      if ((st = ur_qtbe_table(m->qtbe, t, &view)))
        st = ur__error_cause(st, "model file %s: table '%s''s rows", r->path, tc[t].name);
      if (!st) st = ur_safetensors_load(NULL, r->f, 1, &wn, &view, 0);
      if (!st && pn) {
        st = ur_safetensors_view(r->f, ur_safetensors_find(r->f, pn), &perm);
        if (!st) st = ur_qtbe_set_permutation(m->qtbe, t, perm);
        /* what only the table's own check finds (a permutation that is none) names the file */
        if (st == UR_STATUS_INVALID) st = ur__error_cause(UR_STATUS_FORMAT, "model file %s", r->path);
      }
      ur_tensor_free(view);
      ur_tensor_free(perm);
      m->props.rows += tc[t].rows;
    }
    if (!st) {
      m->props.table_bytes = ur_qtbe_bytes(m->qtbe);
      m->props.table_place = tp;
    }
  }
  free(tc);
  free(tw);
  free(ft);
  free(fn);
  return st;
}

/* The hot_prefix policy's split on every managed table: its leading rows preferred on the GPU
 * and prefetched there, the rest preferred on the host and read in place by the GPU.  A model
 * served by the CPU takes none: its managed tables are host memory. */
static ur_status place_hints(ur_model *m) {
  if (m->props.table_place != UR_PLACE_MANAGED || m->opts.hot_fraction < 0 || m->opts.device < 0)
    return UR_STATUS_OK;
  int32_t gpu = m->opts.device;
  ur_status st = UR_STATUS_OK;
  for (int32_t t = 0; t < m->T && !st; t++) {
    ur_tensor *v = NULL;
    if ((st = ur_qtbe_table(m->qtbe, t, &v))) break;
    int64_t rows = ur_tensor_dim(v, 0), per = ur_tensor_numel(v) / rows;
    int64_t k = (int64_t)floor(m->opts.hot_fraction * (double)rows);
    k = k < 0 ? 0 : k > rows ? rows : k;
    ur_range rg;
    if (k > 0 && !(st = ur_tensor_advise(v, 0, k * per, &rg, UR_ADVICE_PREFERRED_LOCATION, gpu)) &&
        !(st = ur_tensor_advise(v, 0, k * per, &rg, UR_ADVICE_ACCESSED_BY, gpu)))
      st = ur_tensor_prefetch(NULL, v, 0, k * per, &rg, gpu);
    if (!st && k < rows &&
        !(st = ur_tensor_advise(v, k * per, (rows - k) * per, &rg, UR_ADVICE_PREFERRED_LOCATION,
                                UR_LOC_CPU)))
      st = ur_tensor_advise(v, k * per, (rows - k) * per, &rg, UR_ADVICE_ACCESSED_BY, gpu);
    ur_tensor_free(v);
  }
  return st;
}

static void free_layers(layer *ls, int32_t n) {
  for (int32_t k = 0; k < n; k++) {
    ur_tensor_free(ls[k].w);
    ur_tensor_free(ls[k].b);
    ur_tensor_free(ls[k].v);
  }
}

static void free_ctx(ctx *c) {
  ur_stream_free(c->stream);
  ur_tensor_free(c->act);
  ur_tensor_free(c->f32);
  ur_tensor_free(c->values);
  ur_tensor_free(c->offsets);
  ur_tensor_free(c->weights);
  free(c);
}

void ur_model_close(ur_model *m) {
  if (!m) return;
  while (m->idle) {
    ctx *c = m->idle;
    m->idle = c->next;
    free_ctx(c);
  }
  free_layers(m->bottom, m->nb);
  free_layers(m->top, m->nt);
  free_layers(m->cross, m->nc);
  ur_qtbe_free(m->qtbe);
  for (int32_t f = 0; f < m->F && m->features; f++) free(m->features[f]);
  free(m->features);
  free(m->modulo);
  free(m->weighted);
  ur_safetensors_close(m->file);
  pthread_mutex_destroy(&m->lock);
  pthread_cond_destroy(&m->freed);
  free(m);
}

/* Reads the description; with m->place UR_PLACE_COUNT it only checks the file against it,
 * else it also places the weights and the tables. */
static ur_status read_model(ur_model *m, const reader *r, const ur_json *desc) {
  const char *arch, *inter, *dtype;
  int64_t nd;
  ur_status st;
  const ur_json *ver = member(desc, "version");
  if (!ver || ur_json_typeof(ver) != UR_JSON_INTEGER)
    return bad(r, "the description's version is missing or not a whole number; this engine serves version %d",
               UR_MODEL_VERSION);
  if (ur_json_integer(ver) != UR_MODEL_VERSION)
    return bad(r, "its description is of version %lld; this engine serves version %d",
               (long long)ur_json_integer(ver), UR_MODEL_VERSION);
  if ((st = get_str(r, desc, "arch", "", &arch))) return st;
  if (strcmp(arch, "dlrm"))
    return bad(r, "its architecture is '%s'; the serving API serves DLRM (dot or dcnv2 interaction)", arch);
  if ((st = get_str(r, desc, "interaction", "", &inter)) || (st = get_str(r, desc, "dense_dtype", "", &dtype)) ||
      (st = get_int(r, desc, "dense_features", "", 1, 4096, &nd)))
    return st;
  if (strcmp(inter, "dot") && strcmp(inter, "dcnv2"))
    return bad(r, "its interaction is '%s'; expected dot or dcnv2", inter);
  if (strcmp(dtype, "f32") && strcmp(dtype, "bf16"))
    return bad(r, "its dense_dtype is '%s'; expected f32 or bf16", dtype);
  /* the transform the training data had (absent: synthetic, as files before the key) */
  const ur_json *input = member(desc, "input");
  if (input && !str_of(input)) return bad(r, "the description's input is not a string");
  if (input && strcmp(str_of(input), "criteo") && strcmp(str_of(input), "synthetic"))
    return bad(r, "its input is '%s'; expected criteo or synthetic", str_of(input));
  m->dt = strcmp(dtype, "f32") ? UR_DTYPE_BF16 : UR_DTYPE_F32;
  m->dcn = !strcmp(inter, "dcnv2");
  const ur_json *si = member(desc, "self_interaction");
  if (si && ur_json_typeof(si) != UR_JSON_TRUE && ur_json_typeof(si) != UR_JSON_FALSE)
    return bad(r, "the description's self_interaction is not true or false");
  m->self_inter = si && ur_json_typeof(si) == UR_JSON_TRUE;
  m->num_dense = (int32_t)nd;
  int64_t dim;
  if ((st = get_int(r, desc, "dim", "", 4, 1024, &dim))) return st;
  if (dim % 4) return bad(r, "its dim is %lld; expected a multiple of 4 (the tables' rows)", (long long)dim);
  m->dim = (int32_t)dim;
  int64_t bw, tw;
  if ((st = read_mlp(m, r, member(desc, "bottom"), "bottom", m->bottom, &m->nb, nd, nd, &bw)) ||
      (st = read_tables(m, r, desc)))
    return st;
  if (m->dcn) {
    m->width = bw + (int64_t)m->F * m->dim;
    if ((st = read_cross(m, r, member(desc, "cross"), m->width))) return st;
  } else {
    if (bw != m->dim)
      return bad(r, "the bottom MLP ends at %lld, but the dot interaction needs the tables' dim %d",
                 (long long)bw, (int)m->dim);
    int64_t t = m->F;
    m->width = bw + (m->self_inter ? t * (t + 1) / 2 + t + 1 : t * (t + 1) / 2);
  }
  if ((st = read_mlp(m, r, member(desc, "top"), "top", m->top, &m->nt, m->width,
                      m->dcn ? m->width : ur_interaction_cols(m->F, m->dim, m->self_inter, 1), &tw))) return st;
  if (tw != 1) return bad(r, "the top MLP ends at %lld; it must give one logit", (long long)tw);
  if (m->top[m->nt - 1].act != UR_ACT_NONE)
    return bad(r, "the top MLP's last layer has act relu; the logit takes none");
  /* Every tensor must be one the description names: anything else means they disagree. */
  for (int32_t i = 0; i < ur_safetensors_count(r->f); i++) {
    ur_safetensors_entry e;
    if ((st = ur_safetensors_entry_get(r->f, i, &e))) return st;
    if (!r->named[i]) return bad(r, "it holds tensor '%s', which its description does not name", e.name);
  }
  return UR_STATUS_OK;
}

ur_status ur_model_open(ur_model **out, const char *path, const ur_model_options *opts) {
  UR__ARGS(out, path);
  *out = NULL;
  ur_model *m = calloc(1, sizeof *m);
  if (!m) return ur__no_memory("model file ", path, sizeof *m, "the model");
  pthread_mutex_init(&m->lock, NULL);
  pthread_cond_init(&m->freed, NULL);
  if (opts) m->opts = *opts;
  else ur_model_options_init(&m->opts);
  const ur_model_options *o = &m->opts;
  ur_status st = UR_STATUS_OK;
  if (o->device >= 0 && o->device >= ur_device_count())
    st = ur__error(ur_device_count() ? UR_STATUS_INVALID : UR_STATUS_UNSUPPORTED,
                   "model: device %d asked, but %d GPUs are in use%s%s", (int)o->device,
                   ur_device_count(), ur_device_count() ? "" : ": ", ur_cuda_error());
  else if (o->device < -1)
    st = ur__error(UR_STATUS_INVALID, "model: device %d; expected -1 (the CPU) or a GPU", (int)o->device);
  else if (o->table_place != -1 && o->table_place != UR_PLACE_DEVICE &&
           o->table_place != UR_PLACE_MANAGED && o->table_place != UR_PLACE_HOST)
    st = ur__error(UR_STATUS_INVALID,
                   "model: table placement %s (%d); expected device, managed, host or -1 (where it runs)",
                   ur_place_name(o->table_place), (int)o->table_place);
  else if ((unsigned)o->bounds >= UR_TBE_BOUNDS_COUNT)
    st = ur__error(UR_STATUS_INVALID, "model: bounds %d; expected fatal, warn or off", (int)o->bounds);
  else if (o->max_callers < 0)
    st = ur__error(UR_STATUS_INVALID, "model: max_callers %d; expected 0 (no limit) or more",
                   (int)o->max_callers);
  else if (!(o->hot_fraction <= 1))
    st = ur__error(UR_STATUS_INVALID, "model: hot_fraction %g; expected at most 1 (< 0: no hints)",
                   o->hot_fraction);
  if (!st) st = ur_safetensors_open(&m->file, path);
  reader r = {path, m->file, NULL, 0};
  if (!st && !(r.named = calloc((size_t)ur_safetensors_count(m->file) + 1, 1)))
    st = ur__no_memory("model file ", path, (uint64_t)ur_safetensors_count(m->file) + 1,
                       "marking which of its %d tensors the description names", (int)ur_safetensors_count(m->file));
  const char *fmt = st ? NULL : ur_safetensors_meta_get(m->file, "uvmrec.format");
  const char *text = st ? NULL : ur_safetensors_meta_get(m->file, "uvmrec.model");
  if (!st && !fmt)
    st = bad(&r, "not a uvmrec model: its metadata has no uvmrec.format");
  else if (!st && strcmp(fmt, "model"))
    st = bad(&r, "uvmrec.format is '%s', not 'model'%s", fmt,
             strcmp(fmt, "1") ? "" : " (a training checkpoint: `uvmrec export` makes a model of it)");
  else if (!st && !text)
    st = bad(&r, "its metadata has no uvmrec.model (the description)");
  ur_json *desc = NULL;
  if (!st && ur_json_parse(&desc, text, strlen(text)))
    st = bad(&r, "uvmrec.model is not JSON: %s", ur_last_error());
  if (!st) {
    /* Checked whole first, then placed: a bad file costs no device memory. */
    m->place = UR_PLACE_COUNT;
    r.values = 1;
    st = read_model(m, &r, desc);
    r.values = 0;
  }
  if (!st) {
    m->place = o->device >= 0 ? UR_PLACE_DEVICE : UR_PLACE_HOST;
    m->be = ur__backend_for(m->place);
    m->props.dense_bytes = 0;
    m->props.rows = 0;
    st = read_model(m, &r, desc);
  }
  if (!st) st = place_hints(m);
  if (!st) st = ur_device_sync();
  if (!st) {
    ur_model_props *p = &m->props;
    snprintf(p->interaction, sizeof p->interaction, "%s", m->dcn ? "dcnv2" : "dot");
    const char *in = str_of(member(desc, "input"));
    snprintf(p->input, sizeof p->input, "%s", in ? in : "synthetic");
    p->num_dense = m->num_dense;
    p->num_features = m->F;
    p->num_tables = m->T;
    p->dim = m->dim;
    p->device = o->device;
    p->dense_dtype = m->dt;
    p->file_bytes = ur_safetensors_bytes(m->file);
    /* Activations per sample, as run() lays them out (each view starts ALIGN_ELEMS-aligned):
     * the input in bf16, the bottom MLP, the embeddings, the interaction (DCNv2: x0, W x + b,
     * two x_l and the low-rank middle), the top MLP. */
    int64_t per = m->num_dense + ALIGN_ELEMS, rk = 0;
    for (int32_t k = 0; k < m->nb; k++) per += m->bottom[k].out + ALIGN_ELEMS;
    per += (int64_t)m->F * m->dim + ALIGN_ELEMS;
    per += m->dcn ? 4 * (m->width + ALIGN_ELEMS) : m->top[0].in + ALIGN_ELEMS; /* padded */
    for (int32_t k = 0; k < m->nc; k++) rk = m->cross[k].rank > rk ? m->cross[k].rank : rk;
    per += rk + ALIGN_ELEMS;
    for (int32_t k = 0; k < m->nt; k++) per += m->top[k].out + ALIGN_ELEMS;
    m->per_row = per;
  }
  ur_json_free(desc);
  free(r.named);
  if (st) {
    ur_model_close(m);
    return st;
  }
  *out = m;
  return UR_STATUS_OK;
}

ur_status ur_model_info(const ur_model *m, ur_model_props *out) {
  UR__ARGS(m, out);
  pthread_mutex_lock((pthread_mutex_t *)&m->lock);
  *out = m->props;
  out->contexts = m->made;
  pthread_mutex_unlock((pthread_mutex_t *)&m->lock);
  return UR_STATUS_OK;
}

const char *ur_model_feature_name(const ur_model *m, int32_t f) {
  UR__ARGS_OR(NULL, m);
  if (f >= 0 && f < m->F) return m->features[f];
  (void)ur__error(UR_STATUS_INVALID, "model: feature %d; expected 0..%d", (int)f, (int)m->F - 1);
  return NULL;
}

int64_t ur_model_table_modulo(const ur_model *m, int32_t f) {
  UR__ARGS_OR(-1, m);
  if (f >= 0 && f < m->F) return m->modulo[f];
  (void)ur__error(UR_STATUS_INVALID, "model: feature %d; expected 0..%d", (int)f, (int)m->F - 1);
  return -1;
}

const char *ur_model_meta(const ur_model *m, const char *key) {
  UR__ARGS_OR(NULL, m, key);
  return ur_safetensors_meta_get(m->file, key);
}

ur_qtbe *ur_model_tables(const ur_model *m) {
  UR__ARGS_OR(NULL, m);
  return m->qtbe;
}

/* ---- contexts ---- */

static ur_status take_ctx(ur_model *m, ctx **out) {
  pthread_mutex_lock(&m->lock);
  while (!m->idle && m->opts.max_callers > 0 && m->made >= m->opts.max_callers)
    pthread_cond_wait(&m->freed, &m->lock);
  ctx *c = m->idle;
  if (c) m->idle = c->next;
  else m->made++;
  pthread_mutex_unlock(&m->lock);
  if (c) {
    *out = c;
    return UR_STATUS_OK;
  }
  /* named by the file in ur_model_predict, as every refusal for memory there */
  c = calloc(1, sizeof *c);
  ur_status st = c ? ur_stream_new(&c->stream, 0)
                   : ur__error(UR_STATUS_OOM, "out of host memory for a context (%zu bytes)", sizeof *c);
  if (c && st) st = ur__error_cause(st, "a context's stream");
  if (st) {
    free(c);
    pthread_mutex_lock(&m->lock);
    m->made--;
    pthread_cond_signal(&m->freed);
    pthread_mutex_unlock(&m->lock);
    return st;
  }
  *out = c;
  return UR_STATUS_OK;
}

static void give_ctx(ur_model *m, ctx *c) {
  pthread_mutex_lock(&m->lock);
  c->next = m->idle;
  m->idle = c;
  pthread_cond_signal(&m->freed);
  pthread_mutex_unlock(&m->lock);
}

/* The buffers of a context, for messages. */
static const char *const BUFFER_NAMES[] = {"activations", "f32 buffer", "offsets", "ids", "weights"};
enum { BUF_ACT, BUF_F32, BUF_OFFSETS, BUF_IDS, BUF_WEIGHTS };

/* *t replaced by a buffer of n elements; when that cannot be had, *t is kept as it was, so a
 * growth that fails leaves the context's buffers as valid as before (for the while of a growth
 * the old buffer and the new are both held).  A failure names the buffer, its bytes and the
 * batch that asked for it (and ur_model_predict the model file). */
static ur_status new_buffer(const ur_model *m, ur_tensor **t, ur_dtype dtype, int64_t n, int which,
                            int64_t batch) {
  ur_tensor *fresh = NULL;
  ur_status st = ur_tensor_new(&fresh, dtype, 1, &n, m->place,
                               m->place == UR_PLACE_DEVICE ? m->opts.device : UR_LOC_CPU);
  if (st)
    return ur__error_cause(st, "a context's %s (%lld bytes) for a batch of %lld samples", BUFFER_NAMES[which],
                           (long long)(n * (int64_t)ur_dtype_size(dtype)), (long long)batch);
  ur_tensor_free(*t);
  *t = fresh;
  return UR_STATUS_OK;
}

/* *t, when it holds fewer than n elements (a growth that failed may have left it larger than
 * the context's cap says), replaced by a buffer of n. */
static ur_status at_least(const ur_model *m, ur_tensor **t, ur_dtype dtype, int64_t n, int which,
                          int64_t batch) {
  return *t && ur_tensor_numel(*t) >= n ? UR_STATUS_OK : new_buffer(m, t, dtype, n, which, batch);
}

/* c's buffers for cap samples, cap its new size when each is had. */
static ur_status samples_cap(const ur_model *m, ctx *c, int64_t cap, int64_t batch) {
  ur_status st;
  if (!(st = at_least(m, &c->act, m->dt, cap * m->per_row, BUF_ACT, batch)) &&
      !(st = at_least(m, &c->f32, UR_DTYPE_F32, cap * (m->num_dense + 2) + 3 * ALIGN_ELEMS, BUF_F32, batch)))
    c->cap = cap;
  return st;
}

/* c's buffers for cap ids, nvals its new size when each is had; one at least: a request of no
 * ids has views of both too. */
static ur_status ids_cap(const ur_model *m, ctx *c, int64_t cap, int64_t batch) {
  ur_status st;
  if (cap < 1) cap = 1;
  if (!(st = at_least(m, &c->values, UR_DTYPE_I64, cap, BUF_IDS, batch)) &&
      !(st = at_least(m, &c->weights, UR_DTYPE_F32, cap, BUF_WEIGHTS, batch)))
    c->nvals = cap;
  return st;
}

/* c's buffers for batch samples and nvals ids.  Each grows to twice its last size (a batch that
 * grows a little at a time takes few growths) or, where that much cannot be had, to the
 * request's own: a context is never refused what a fresh one would be given.  cap and nvals
 * only grow with every buffer they size: a growth that failed for memory left each buffer at
 * least as large as they say, so a later request that fits them (an empty one too) runs, and
 * one that does not tries again.  A retry that succeeds clears the message of the growth that
 * failed (ur__error_clear). */
static ur_status ensure(const ur_model *m, ctx *c, int64_t batch, int64_t nvals, int need_ids) {
  ur_status st = UR_STATUS_OK;
  if (batch > c->cap) {
    int64_t cap = batch > 2 * c->cap ? batch : 2 * c->cap;
    st = samples_cap(m, c, cap, batch);
    if (st == UR_STATUS_OOM && cap > batch && !(st = samples_cap(m, c, batch, batch))) ur__error_clear();
  }
  if (!st && need_ids && (!c->offsets || ur_tensor_numel(c->offsets) < batch * m->F + 1)) {
    st = new_buffer(m, &c->offsets, UR_DTYPE_I64, c->cap * m->F + 1, BUF_OFFSETS, batch);
    if (st == UR_STATUS_OOM && c->cap > batch &&
        !(st = new_buffer(m, &c->offsets, UR_DTYPE_I64, batch * m->F + 1, BUF_OFFSETS, batch)))
      ur__error_clear();
  }
  if (!st && need_ids && (nvals > c->nvals || !c->values || !c->weights)) {
    int64_t cap = nvals > 2 * c->nvals ? nvals : 2 * c->nvals;
    st = ids_cap(m, c, cap, batch);
    if (st == UR_STATUS_OOM && cap > nvals && !(st = ids_cap(m, c, nvals, batch))) ur__error_clear();
  }
  return st;
}

/* ---- predict ---- */

/* The views one call makes; freed at its end. */
typedef struct views {
  ur_tensor *v[4 * MAX_LAYERS + 16];
  int n;
} views;

static ur_status view2(views *vs, ur_tensor *base, int64_t *at, int64_t rows, int64_t cols,
                       ur_tensor **out) {
  int64_t shape[2] = {rows, cols};
  ur_status st = ur_tensor_view_as(base, out, *at, 2, shape);
  if (st) return st;
  vs->v[vs->n++] = *out;
  *at += (rows * cols + ALIGN_ELEMS - 1) / ALIGN_ELEMS * ALIGN_ELEMS;
  return UR_STATUS_OK;
}

/* Memory the host reads in place. */
static int host_readable(const ur_tensor *t) {
  ur_place p = ur_tensor_place(t);
  return p == UR_PLACE_HOST || p == UR_PLACE_PINNED || p == UR_PLACE_MANAGED;
}

/* The feature's table, for messages. */
static const char *table_of(const ur_model *m, int32_t k) {
  return ur_qtbe_table_name(m->qtbe, ur_qtbe_feature_table(m->qtbe, k));
}

/* Per-id weights scale the rows a bag sums, so a request carries them exactly when training's
 * batches did: weighted tables' ids with their weights, the others' with 1, as training gave
 * them (checked where the request is in host memory; on the GPU it is the caller's to keep).
 * order[k] is model feature k's key in the request, b its batch. */
static ur_status check_weights(const ur_model *m, const ur_kjt *sparse, const int32_t *order) {
  const ur_tensor *w = ur_kjt_weights(sparse);
  if (!w && m->nweighted) {
    int32_t k = 0;
    while (!m->weighted[k]) k++;
    return ur__error(UR_STATUS_INVALID,
                     "model: table '%s' (feature '%s') was trained with per-id weights; the request "
                     "carries none (its KJT's weights are NULL)", table_of(m, k), m->features[k]);
  }
  if (w && !m->nweighted)
    return ur__error(UR_STATUS_INVALID,
                     "model: the request carries per-id weights, but no table of the model was trained "
                     "with them (table '%s' serves feature '%s' unweighted): send its KJT without weights",
                     table_of(m, 0), m->features[0]);
  if (!w || m->nweighted == m->F || !host_readable(w)) return UR_STATUS_OK;
  const float *wv = ur_tensor_data(w);
  for (int32_t k = 0; k < m->F; k++) {
    if (m->weighted[k]) continue;
    int64_t b0, b1, v0, v1; /* ur__kjt_need_checked kept them within the values */
    ur_status st = ur_kjt_key_span(sparse, order[k], &b0, &b1, &v0, &v1);
    if (st) return st;
    for (int64_t i = v0; i < v1; i++)
      if (wv[i] != 1.0f)
        return ur__error(UR_STATUS_INVALID,
                         "model: feature '%s' (table '%s', trained without per-id weights) has weight %g "
                         "at value %lld; expected 1, as training gave its ids",
                         m->features[k], table_of(m, k), (double)wv[i], (long long)i);
  }
  return UR_STATUS_OK;
}

static ur_status check_request(const ur_model *m, const ur_tensor *dense, const ur_kjt *sparse,
                               const ur_tensor *scores, int32_t *order, int *reorder) {
  if (!dense || !sparse || !scores)
    return ur__error(UR_STATUS_INVALID, "model: predict needs dense, sparse and scores");
  int32_t nd = ur_tensor_ndim(dense);
  int64_t b = nd == 2 ? ur_tensor_dim(dense, 0) : -1;
  if (ur_tensor_dtype(dense) != UR_DTYPE_F32 || nd != 2 || ur_tensor_dim(dense, 1) != m->num_dense) {
    char cols[48] = ""; /* columns only where there are rows and columns */
    if (nd == 2) snprintf(cols, sizeof cols, " (%lld column%s)", (long long)ur_tensor_dim(dense, 1), ur__s(ur_tensor_dim(dense, 1)));
    return ur__error(UR_STATUS_INVALID,
                     "model: dense is %s with %d dimension%s%s; expected f32 [batch, %d]",
                     ur_dtype_name(ur_tensor_dtype(dense)), (int)nd, ur__s(nd), cols,
                     (int)m->num_dense);
  }
  int32_t nk = ur_kjt_num_keys(sparse);
  if (nk != m->F)
    return ur__error(UR_STATUS_INVALID,
                     "model: the request has %d sparse features; the model takes %d (%s .. %s)",
                     (int)nk, (int)m->F, m->features[0], m->features[m->F - 1]);
  if (ur_kjt_variable_stride(sparse))
    return ur__error(UR_STATUS_INVALID,
                     "model: the request's KJT has a variable batch per feature; expand it first");
  if (ur_kjt_stride(sparse) != b)
    return ur__error(UR_STATUS_INVALID, "model: the sparse features hold %lld samples, dense %lld",
                     (long long)ur_kjt_stride(sparse), (long long)b);
  if (ur_tensor_dtype(scores) != UR_DTYPE_F32 || ur_tensor_numel(scores) != b)
    return ur__error(UR_STATUS_INVALID, "model: scores is %s of %lld elements; expected f32 of %lld",
                     ur_dtype_name(ur_tensor_dtype(scores)), (long long)ur_tensor_numel(scores),
                     (long long)b);
  /* A model the CPU serves reads the request in place, which it cannot where the request is in
   * device memory: refused here, naming it (the ops refused it later naming an op, "linear
   * forward: x is device memory but w is host memory", or "qtbe: values is in device memory"). */
  if (m->place == UR_PLACE_HOST) {
    const ur_tensor *ts[4] = {dense, ur_kjt_values(sparse), ur_kjt_offsets(sparse), ur_kjt_weights(sparse)};
    static const char *const names[4] = {"dense", "the sparse features' values",
                                         "the sparse features' offsets", "the sparse features' weights"};
    for (int k = 0; k < 4; k++)
      if (ts[k] && ur_tensor_place(ts[k]) == UR_PLACE_DEVICE)
        return ur__error(UR_STATUS_INVALID,
                         "model: %s is in device memory (GPU %d), but the model is served by the CPU; "
                         "expected host, pinned or managed memory", names[k], (int)ur_tensor_device(ts[k]));
  }
  /* the keys first (names only, on the host): a request wrong by name is named so, without the
   * bags' check, which waits for the device where the KJT is there */
  int32_t missing;
  ur_status st = ur__kjt_key_order(sparse, (const char *const *)m->features, m->F, order, &missing);
  if (st) return st;
  if (missing >= 0)
    return ur__error(UR_STATUS_INVALID,
                     "model: the request has no feature '%s' (its key %d is '%s')",
                     m->features[missing], (int)missing + 1, ur_kjt_key(sparse, missing));
  /* a KJT not known checked (made unchecked, or an op's result of one) is checked here, once:
   * each key's span, which the weights' check and the reordering read through, and its bags,
   * which the collection reads through its offsets (a GPU's kernels trust them) */
  st = ur__kjt_need_checked(sparse, "model");
  if (st) return st;
  *reorder = 0;
  for (int32_t k = 0; k < nk; k++)
    if (order[k] != k) *reorder = 1;
  return check_weights(m, sparse, order);
}

/* Whether the GPU serving the model reads t in place: the collection reads pinned memory too,
 * the dense ops only device and managed memory. */
static int on_device(const ur_model *m, const ur_tensor *t, int pinned_ok) {
  ur_place p = ur_tensor_place(t);
  return p == UR_PLACE_MANAGED || (pinned_ok && p == UR_PLACE_PINNED) ||
         (p == UR_PLACE_DEVICE && ur_tensor_device(t) == m->opts.device);
}

/* value_at: where each model feature's values start in the caller's request, when kjt is that
 * request with its keys reordered (NULL: kjt is the request). */
static ur_status run(ur_model *m, ctx *c, const ur_tensor *dense, const ur_kjt *kjt,
                     const int64_t *value_at, ur_tensor *scores, views *vs) {
  ur_stream *s = c->stream;
  int gpu = m->place == UR_PLACE_DEVICE;
  int64_t b = ur_tensor_dim(dense, 0);
  const ur_tensor *values = ur_kjt_values(kjt), *offsets = ur_kjt_offsets(kjt),
                  *weights = ur_kjt_weights(kjt);
  int copy_ids = gpu && !(on_device(m, values, 1) && on_device(m, offsets, 1) &&
                          (!weights || on_device(m, weights, 1)));
  ur_status st = ensure(m, c, b, ur_tensor_numel(values), copy_ids);
  if (st) return st;
  ur_tensor *x = NULL, *y = NULL, *tmp = NULL;
  int64_t at = 0, at32 = 0, nv = ur_tensor_numel(values);
  /* The ids where the collection reads them. */
  if (copy_ids) {
    ur_tensor *dv, *dof, *dw = NULL;
    if ((st = ur_tensor_view(c->values, &dv, 0, nv))) return st;
    vs->v[vs->n++] = dv;
    if ((st = ur_tensor_view(c->offsets, &dof, 0, ur_tensor_numel(offsets)))) return st;
    vs->v[vs->n++] = dof;
    if ((st = ur_tensor_copy(s, values, dv)) || (st = ur_tensor_copy(s, offsets, dof))) return st;
    if (weights) {
      if ((st = ur_tensor_view(c->weights, &dw, 0, nv))) return st;
      vs->v[vs->n++] = dw;
      if ((st = ur_tensor_copy(s, weights, dw))) return st;
    }
    values = dv;
    offsets = dof;
    weights = dw;
  }
  /* The dense input in the compute dtype, where the model runs. */
  const ur_tensor *xin = dense;
  if (gpu && !on_device(m, dense, 0)) {
    if ((st = view2(vs, c->f32, &at32, b, m->num_dense, &tmp)) || (st = ur_tensor_copy(s, dense, tmp)))
      return st;
    xin = tmp;
  }
  if (m->dt != UR_DTYPE_F32) {
    if ((st = view2(vs, c->act, &at, b, m->num_dense, &tmp)) || (st = ur_dense_cast(s, xin, tmp)))
      return st;
    xin = tmp;
  }
  /* Bottom MLP. */
  x = (ur_tensor *)xin;
  for (int32_t k = 0; k < m->nb; k++) {
    const layer *L = &m->bottom[k];
    if ((st = view2(vs, c->act, &at, b, L->out, &y)) ||
        (st = ur_linear_forward(s, x, L->w, L->b, y, NULL, L->act, 0)))
      return st;
    x = y;
  }
  /* Embeddings. */
  ur_tensor *emb;
  if ((st = view2(vs, c->act, &at, b, (int64_t)m->F * m->dim, &emb)) ||
      (st = ur__qtbe_forward_at(s, m->qtbe, values, offsets, weights, emb, value_at)))
    return st;
  /* Interaction. */
  ur_tensor *z;
  if ((st = view2(vs, c->act, &at, b, m->dcn ? m->width : m->top[0].in, &z))) return st;
  if (!m->dcn) {
    if ((st = ur_interaction_forward(s, x, emb, z, m->self_inter, 0))) return st;
  } else {
    const ur_tensor *parts[2] = {x, emb};
    ur_tensor *x0 = z, *pre, *xa, *xb, *t = NULL;
    if ((st = ur_features_concat(s, parts, 2, x0)) ||
        (st = view2(vs, c->act, &at, b, m->width, &pre)) ||
        (st = view2(vs, c->act, &at, b, m->width, &xa)) ||
        (st = view2(vs, c->act, &at, b, m->width, &xb)))
      return st;
    ur_tensor *xl = x0;
    for (int32_t k = 0; k < m->nc; k++) {
      const layer *L = &m->cross[k];
      if (L->v) {
        int64_t save = at;
        if ((st = view2(vs, c->act, &at, b, L->rank, &t)) ||
            (st = ur_linear_forward(s, xl, L->v, NULL, t, NULL, UR_ACT_NONE, 0)) ||
            (st = ur_linear_forward(s, t, L->w, L->b, pre, NULL, UR_ACT_NONE, 0)))
          return st;
        at = save;
      } else if ((st = ur_linear_forward(s, xl, L->w, L->b, pre, NULL, UR_ACT_NONE, 0))) {
        return st;
      }
      ur_tensor *next = xl == xa ? xb : xa;
      if ((st = ur_cross_forward(s, x0, pre, xl, next))) return st;
      xl = next;
    }
    z = xl;
  }
  /* Top MLP to the logit, then the probability in f32. */
  x = z;
  for (int32_t k = 0; k < m->nt; k++) {
    const layer *L = &m->top[k];
    if ((st = view2(vs, c->act, &at, b, L->out, &y)) ||
        (st = ur_linear_forward(s, x, L->w, L->b, y, NULL, L->act, (uint32_t)L->pad << UR_DENSE_PAD_SHIFT)))
      return st;
    x = y;
  }
  if (m->dt != UR_DTYPE_F32) {
    if ((st = view2(vs, c->f32, &at32, b, 1, &tmp)) || (st = ur_dense_cast(s, x, tmp))) return st;
    x = tmp;
  }
  ur_tensor *p;
  if ((st = view2(vs, c->f32, &at32, b, 1, &p)) || (st = ur_act_forward(s, x, p, UR_ACT_SIGMOID)) ||
      (st = ur_tensor_copy(s, p, scores)))
    return st;
  return ur_stream_sync(s);
}

ur_status ur_model_predict(ur_model *m, const ur_tensor *dense, const ur_kjt *sparse,
                           ur_tensor *scores) {
  UR__ARGS(m, dense, sparse, scores);
  int32_t order[4096];
  int reorder = 0;
  ur_status st = check_request(m, dense, sparse, scores, order, &reorder);
  ur_kjt *kjt = NULL;
  int64_t *value_at = NULL; /* a bad id is named where the caller's request holds it */
  if (!st && reorder) {
    st = ur_kjt_permute(sparse, order, m->F, &kjt);
    if (!st && !(value_at = malloc(sizeof(int64_t) * (size_t)m->F)))
      st = ur__error(UR_STATUS_OOM, "out of host memory for the request's feature order (%zu bytes)",
                     sizeof(int64_t) * (size_t)m->F);
    for (int32_t k = 0; k < m->F && !st; k++) {
      int64_t b0, b1, v1;
      st = ur_kjt_key_span(sparse, order[k], &b0, &b1, &value_at[k], &v1);
    }
  }
  ctx *c = NULL;
  if (!st) st = take_ctx(m, &c);
  if (!st) {
    int32_t prev = UR_LOC_CPU;
    views vs;
    vs.n = 0;
    if (!(st = ur__device_enter(m->be, m->opts.device, &prev))) {
      if (ur_tensor_dim(dense, 0) > 0) st = run(m, c, dense, kjt ? kjt : sparse, value_at, scores, &vs);
      st = ur__device_leave(m->be, m->opts.device, prev, st);
    }
    for (int k = 0; k < vs.n; k++) ur_tensor_free(vs.v[k]);
    give_ctx(m, c);
  }
  ur_kjt_free(kjt);
  free(value_at);
  /* memory it could not have (a context, its stream, its buffers, an op's scratch) and a device
   * that failed name the model's file, as the refusals of ur_model_open do; a bad request is
   * named as the request */
  if (st == UR_STATUS_OOM || st == UR_STATUS_DEVICE)
    st = ur__error_cause(st, "model file %s", ur_safetensors_path(m->file));
  pthread_mutex_lock(&m->lock);
  m->props.calls++;
  if (st) m->props.failed++;
  else m->props.samples += ur_tensor_dim(dense, 0);
  pthread_mutex_unlock(&m->lock);
  return st;
}
