/* qtbe.c: quantized embedding collections (uvmrec.h section 10): rows in a serving format
 * (f32, f16, int8, int4, int2), converting rows to and from those formats, the collection's
 * construction and checks, and its forward, dispatched to the backend chosen once when it is
 * made (q->be->qtbe: qtbe_cpu.c or kernels/qtbe.cu).  A forward shares nothing with another
 * one but the rows: each call borrows a flags buffer from a small pool, so many threads may
 * serve from one collection. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "embedding/qtbe.h"
#include "embedding/table.h"

#define MAX_FLAG_SLOTS 256

struct ur_qtbe {
  ur_qtbe_config cfg;
  ur_place home;            /* device memory of its GPU, or host memory */
  const ur_backend *be;
  ur__tbe_names names;      /* T, F, the names and the features (table.c) */
  int32_t max_dim;
  ur_qtbe_table_config *tc; /* each name is names.tnames' */
  ur__qtbe_table *tables;   /* host descriptors */
  ur_tensor **rows;         /* per table, in its placement */
  ur_tensor **perm;         /* per table, at home, or NULL */
  ur_tensor *desc;          /* descriptors and features in device memory (GPU home) */
  int64_t skipped;          /* atomic */
  pthread_mutex_t lock;     /* the flags pool */
  ur_tensor *free_flags[MAX_FLAG_SLOTS];
  int32_t nfree;
};

size_t ur_sizeof_qerror(void) { return sizeof(ur_qerror); }
size_t ur_sizeof_qtbe_table_config(void) { return sizeof(ur_qtbe_table_config); }
size_t ur_sizeof_qtbe_config(void) { return sizeof(ur_qtbe_config); }

static const char *format_names[UR_QFORMAT_COUNT] = {"f32", "fp16", "int8", "int4", "int2"};

const char *ur_qformat_name(ur_qformat f) {
  return (unsigned)f < UR_QFORMAT_COUNT ? format_names[f] : "?";
}

ur_status ur_qformat_parse(const char *s, ur_qformat *out) {
  UR__ARGS(s, out);
  int f = ur__name_index(format_names, UR_QFORMAT_COUNT, s);
  if (f < 0 && !strcmp(s, "f16")) f = UR_QFORMAT_F16; /* the dtype's name for fp16 */
  if (f >= 0) {
    *out = (ur_qformat)f;
    return UR_STATUS_OK;
  }
  return ur__error(UR_STATUS_INVALID, "table format '%s'; expected f32, fp16, int8, int4 or int2",
                   s ? s : "(null)");
}

int64_t ur_qformat_row_bytes(ur_qformat f, int32_t dim) { return ur__qtbe_row_bytes(f, dim); }

/* ---- rows to and from the formats ---- */

/* The f16 nearest to x that is not above it (below: -1 flips the sign, up). */
static uint16_t f16_toward(float x, int up) {
  uint16_t h = ur__f32_to_f16(x);
  float v = ur__f16_to_f32(h);
  if (up ? v >= x : v <= x) return h;
  /* one step: away from zero when moving out from the value's sign, toward it otherwise */
  int neg = (h & 0x8000u) != 0, mag = h & 0x7fff;
  if (up == neg) return (uint16_t)(mag ? h - 1 : (up ? 0x0001 : 0x8001));
  return (uint16_t)(h + 1);
}

/* The shape a format's rows take: u8 [rows, row bytes], or [rows, dim] of f16 / f32. */
static ur_dtype format_dtype(ur_qformat f) {
  return f == UR_QFORMAT_F32 ? UR_DTYPE_F32 : f == UR_QFORMAT_F16 ? UR_DTYPE_F16 : UR_DTYPE_U8;
}

static ur_status check_rows(const char *op, const ur_tensor *t, const char *what, int host) {
  ur_place p = ur_tensor_place(t);
  if (ur_tensor_ndim(t) != 2)
    return ur__error(UR_STATUS_INVALID, "%s: %s has %d dimensions; expected 2 [rows, ...]", op,
                     what, (int)ur_tensor_ndim(t));
  if (host && p == UR_PLACE_DEVICE)
    return ur__error(UR_STATUS_INVALID,
                     "%s: %s is in device memory; this conversion runs on the CPU (host, pinned or "
                     "managed memory)",
                     op, what);
  return UR_STATUS_OK;
}

/* A conversion's format and its two tensors' common checks. */
static ur_status check_pair(const char *op, const ur_tensor *src, const ur_tensor *dst,
                            ur_qformat f) {
  ur_status st;
  if ((unsigned)f >= UR_QFORMAT_COUNT)
    return ur__error(UR_STATUS_INVALID, "%s: format %d is not f32, fp16, int8, int4 or int2", op,
                     (int)f);
  if ((st = check_rows(op, src, "src", 1)) || (st = check_rows(op, dst, "dst", 1))) return st;
  return UR_STATUS_OK;
}

/* t (the conversion's `what` side) holds rows of dim elements in format f (rb bytes a row):
 * format_dtype(f) [rows, dim] for f32 and fp16, u8 [rows, rb] for the others.  `verb` joins
 * the message ("need" for a destination, "are" for a source). */
static ur_status check_stored(const char *op, const ur_tensor *t, const char *what,
                              const char *verb, ur_qformat f, int64_t rows, int64_t dim,
                              int64_t rb) {
  int64_t cols = f == UR_QFORMAT_F32 || f == UR_QFORMAT_F16 ? dim : rb;
  if (ur_tensor_dtype(t) != format_dtype(f) || ur_tensor_dim(t, 0) != rows ||
      ur_tensor_dim(t, 1) != cols)
    return ur__error(UR_STATUS_INVALID, "%s: %s is %s [%lld, %lld]; %s rows of %lld %s %s [%lld, %lld]",
                     op, what, ur_dtype_name(ur_tensor_dtype(t)), (long long)ur_tensor_dim(t, 0),
                     (long long)ur_tensor_dim(t, 1), format_names[f], (long long)dim, verb,
                     ur_dtype_name(format_dtype(f)), (long long)rows, (long long)cols);
  return UR_STATUS_OK;
}

typedef struct quant_job {
  const ur_tensor *src;
  uint8_t *dst;
  ur_qformat f;
  int32_t dim;
  int64_t row_bytes;
  double *max_abs, *sum_sq, *ref_sq, *ratio; /* per thread slot */
  int64_t *bad_row;                          /* the first row that cannot be stored */
  size_t per;
} quant_job;

/* Quantizes one row of floats x into dst; accumulates its error. */
static int quantize_row(const float *x, int32_t dim, ur_qformat f, uint8_t *dst, double *max_abs,
                        double *sum_sq, double *ref_sq, double *ratio) {
  float lo = x[0], hi = x[0], amax = 0;
  for (int32_t c = 0; c < dim; c++) {
    if (!isfinite(x[c])) return 0;
    lo = x[c] < lo ? x[c] : lo;
    hi = x[c] > hi ? x[c] : hi;
    amax = fabsf(x[c]) > amax ? fabsf(x[c]) : amax;
  }
  float deq[UR_TBE_MAX_DIM];
  double bound;
  if (f == UR_QFORMAT_F32) {
    memcpy(dst, x, sizeof(float) * (size_t)dim);
    memcpy(deq, x, sizeof(float) * (size_t)dim);
    bound = 0;
  } else if (f == UR_QFORMAT_F16) {
    if (amax > 65504.0f) return 0;
    uint16_t *h = (uint16_t *)dst;
    for (int32_t c = 0; c < dim; c++) {
      h[c] = ur__f32_to_f16(x[c]);
      deq[c] = ur__f16_to_f32(h[c]);
    }
    bound = fmax((double)amax * 0x1p-11, 0x1p-25);
  } else {
    if (amax > 32768.0f) return 0; /* the bias and a scale of the range must be f16 */
    int32_t levels = (1 << ur__qtbe_bits(f)) - 1;
    uint16_t hb = f16_toward(lo, 0);
    float bias = ur__f16_to_f32(hb);
    uint16_t hs = f16_toward((hi - bias) / (float)levels, 1);
    float scale = ur__f16_to_f32(hs);
    int64_t rb = ur__qtbe_row_bytes(f, dim);
    if (rb > 0) memset(dst, 0, (size_t)rb);
    memcpy(dst, &hs, 2);
    memcpy(dst + 2, &hb, 2);
    uint8_t *codes = dst + UR_QTBE_HEADER;
    int32_t bits = ur__qtbe_bits(f), per_byte = 8 / bits;
    for (int32_t c = 0; c < dim; c++) {
      int32_t q = scale > 0 ? (int32_t)floorf((x[c] - bias) / scale + 0.5f) : 0;
      q = q < 0 ? 0 : q > levels ? levels : q;
      codes[c / per_byte] |= (uint8_t)(q << (bits * (c % per_byte)));
    }
    for (int32_t c4 = 0; c4 < dim / 4; c4++) ur__qtbe_load4(dst, f, c4, deq + 4 * c4);
    bound = (double)scale / 2 + 0x1p-22 * (double)amax;
  }
  for (int32_t c = 0; c < dim; c++) {
    double e = fabs((double)x[c] - (double)deq[c]);
    *max_abs = e > *max_abs ? e : *max_abs;
    *sum_sq += e * e;
    *ref_sq += (double)x[c] * (double)x[c];
    double r = bound > 0 ? e / bound : 0;
    *ratio = r > *ratio ? r : *ratio;
  }
  return 1;
}

static void quant_range(void *ctx, size_t r0, size_t r1) {
  quant_job *j = ctx;
  size_t slot = r0 / j->per;
  float buf[UR_TBE_MAX_DIM];
  const char *base = ur_tensor_data(j->src);
  ur_dtype d = ur_tensor_dtype(j->src);
  size_t row = (size_t)j->dim * ur_dtype_size(d);
  for (size_t r = r0; r < r1; r++) {
    const float *x = ur__load_f32(base + r * row, d, (size_t)j->dim, buf); /* f32 or halves */
    if (!quantize_row(x, j->dim, j->f, j->dst + r * (size_t)j->row_bytes, &j->max_abs[slot],
                      &j->sum_sq[slot], &j->ref_sq[slot], &j->ratio[slot])) {
      ur__atomic_min(j->bad_row, (int64_t)r);
    }
  }
}

ur_status ur_rows_quantize(const ur_tensor *src, ur_tensor *dst, ur_qerror *err, ur_qformat f) {
  UR__ARGS(src, dst);
  const char *op = "rows quantize";
  ur_status st;
  if ((st = check_pair(op, src, dst, f))) return st;
  ur_dtype sd = ur_tensor_dtype(src);
  if (sd != UR_DTYPE_F32 && sd != UR_DTYPE_F16 && sd != UR_DTYPE_BF16)
    return ur__error(UR_STATUS_INVALID, "%s: src is %s; expected f32, f16 or bf16", op,
                     ur_dtype_name(sd));
  int64_t rows = ur_tensor_dim(src, 0), dim = ur_tensor_dim(src, 1);
  int64_t rb = ur__qtbe_row_bytes(f, (int32_t)(dim > UR_TBE_MAX_DIM ? 0 : dim));
  if (rb < 0)
    return ur__error(UR_STATUS_INVALID,
                     "%s: rows of %lld elements; expected a multiple of 4 from 4 to %d", op,
                     (long long)dim, UR_TBE_MAX_DIM);
  if ((st = check_stored(op, dst, "dst", "need", f, rows, dim, rb))) return st;
  if ((st = ur_device_sync())) return st;
  int nt = ur__threads();
  size_t per = ((size_t)rows + (size_t)nt - 1) / (size_t)nt;
  if (per < 1024) per = 1024;
  size_t slots = ((size_t)rows + per - 1) / per + 1;
  double *acc = calloc(4 * slots, sizeof(double));
  if (!acc) return ur__error(UR_STATUS_OOM, "%s: out of host memory", op);
  int64_t bad = INT64_MAX;
  quant_job j = {src, ur_tensor_data(dst), f, (int32_t)dim, rb, acc, acc + slots,
                 acc + 2 * slots, acc + 3 * slots, &bad, per};
  /* Ranges of `per` rows, so each range's sums go to its own slot. */
  ur__parallel_for((size_t)rows, per, quant_range, &j);
  ur_qerror e = {0, 0, 0, 0, rows * dim};
  for (size_t k = 0; k < slots; k++) {
    e.max_abs = fmax(e.max_abs, j.max_abs[k]);
    e.sum_sq += j.sum_sq[k];
    e.ref_sum_sq += j.ref_sq[k];
    e.max_ratio = fmax(e.max_ratio, j.ratio[k]);
  }
  free(acc);
  if (bad != INT64_MAX && f == UR_QFORMAT_F32) /* it stores any finite value */
    return ur__error(UR_STATUS_INVALID, "%s: row %lld holds a value that is not finite", op,
                     (long long)bad);
  if (bad != INT64_MAX)
    return ur__error(UR_STATUS_INVALID,
                     "%s: row %lld holds a value that is not finite or beyond what %s stores "
                     "(|x| up to %s)",
                     op, (long long)bad, format_names[f],
                     f == UR_QFORMAT_F16 ? "65504" : "32768");
  if (err) *err = e;
  return UR_STATUS_OK;
}

typedef struct dequant_job {
  const uint8_t *src;
  float *dst;
  ur_qformat f;
  int32_t dim;
  int64_t row_bytes;
} dequant_job;

static void dequant_range(void *ctx, size_t r0, size_t r1) {
  dequant_job *j = ctx;
  for (size_t r = r0; r < r1; r++)
    for (int32_t c4 = 0; c4 < j->dim / 4; c4++)
      ur__qtbe_load4(j->src + r * (size_t)j->row_bytes, j->f, c4,
                     j->dst + r * (size_t)j->dim + 4 * (size_t)c4);
}

ur_status ur_rows_dequantize(const ur_tensor *src, ur_tensor *dst, ur_qformat f) {
  UR__ARGS(src, dst);
  const char *op = "rows dequantize";
  ur_status st;
  if ((st = check_pair(op, src, dst, f))) return st;
  int64_t rows = ur_tensor_dim(dst, 0), dim = ur_tensor_dim(dst, 1);
  int64_t rb = ur__qtbe_row_bytes(f, (int32_t)(dim > UR_TBE_MAX_DIM ? 0 : dim));
  if (ur_tensor_dtype(dst) != UR_DTYPE_F32 || rb < 0)
    return ur__error(UR_STATUS_INVALID,
                     "%s: dst is %s [%lld, %lld]; expected f32 rows of a multiple of 4 from 4 to %d",
                     op, ur_dtype_name(ur_tensor_dtype(dst)), (long long)rows, (long long)dim,
                     UR_TBE_MAX_DIM);
  if ((st = check_stored(op, src, "src", "are", f, rows, dim, rb))) return st;
  if ((st = ur_device_sync())) return st;
  dequant_job j = {ur_tensor_data(src), ur_tensor_data(dst), f, (int32_t)dim, rb};
  ur__parallel_for((size_t)rows, 1024, dequant_range, &j);
  return UR_STATUS_OK;
}

/* ---- the collection ---- */

static ur_status check_table(const ur_qtbe_config *c, const ur_qtbe_table_config *tc,
                             const char *name) {
  ur_status st = ur__tbe_check_table("qtbe", name, tc->rows, tc->dim, tc->pooling);
  if (st) return st;
  if ((unsigned)tc->format >= UR_QFORMAT_COUNT)
    return ur__error(UR_STATUS_INVALID,
                     "qtbe: table '%s' format %d is not f32, fp16, int8, int4 or int2", name,
                     (int)tc->format);
  if ((st = ur__tbe_check_place("qtbe", name, "placement", tc->place, c->device))) return st;
  if (tc->modulo < 0)
    return ur__error(UR_STATUS_INVALID, "qtbe: table '%s' modulo %lld; expected 0 (none) or more",
                     name, (long long)tc->modulo);
  if ((uint64_t)tc->rows > ((uint64_t)1 << 50) / (uint64_t)ur__qtbe_row_bytes(tc->format, tc->dim))
    return ur__error(UR_STATUS_INVALID, "qtbe: table '%s' of %lld rows x %d is too large", name,
                     (long long)tc->rows, (int)tc->dim);
  return UR_STATUS_OK;
}

/* A tensor at the collection's home. */
static ur_status home_tensor(const ur_qtbe *q, ur_tensor **out, ur_dtype dtype, int64_t n) {
  return ur_tensor_new(out, dtype, 1, &n, q->home,
                       q->home == UR_PLACE_DEVICE ? q->cfg.device : UR_LOC_CPU);
}

/* Host tables are pinned when a GPU runs the collection: it reads them in place. */
static ur_status alloc_rows(ur_qtbe *q, int32_t i) {
  const ur_qtbe_table_config *c = &q->tc[i];
  ur_place p = c->place;
  if (p == UR_PLACE_HOST || p == UR_PLACE_PINNED)
    p = q->home == UR_PLACE_DEVICE ? UR_PLACE_PINNED : UR_PLACE_HOST;
  int32_t dev = p == UR_PLACE_HOST || p == UR_PLACE_PINNED ? UR_LOC_CPU
                : q->home == UR_PLACE_DEVICE ? q->cfg.device : UR_LOC_CPU;
  int64_t rb = ur__qtbe_row_bytes(c->format, c->dim);
  int64_t shape[2] = {c->rows, c->format == UR_QFORMAT_F32 ? c->dim
                               : c->format == UR_QFORMAT_F16 ? c->dim : rb};
  ur_status st = ur_tensor_new(&q->rows[i], format_dtype(c->format), 2, shape, p, dev);
  if (st) /* the allocator names the bytes alone */
    return ur__error_cause(st, "qtbe: table '%s' (%lld rows, %s, %lld bytes in %s memory)",
                           q->names.tnames[i], (long long)c->rows, ur_qformat_name(c->format),
                           (long long)(shape[0] * shape[1] * (int64_t)ur_dtype_size(format_dtype(c->format))),
                           ur_place_name(p));
  if ((st = ur_tensor_fill(NULL, q->rows[i], 0))) return st;
  ur__qtbe_table *d = &q->tables[i];
  d->rows = ur_tensor_data(q->rows[i]);
  d->perm = NULL;
  d->nrows = c->rows;
  d->modulo = c->modulo;
  d->row_bytes = rb;
  d->dim = c->dim;
  d->format = c->format;
  d->pooling = c->pooling;
  d->index = i;
  return UR_STATUS_OK;
}

static size_t desc_bytes(const ur_qtbe *q, size_t *features_at) {
  *features_at = ur__tbe_names_features_at(&q->names, sizeof(ur__qtbe_table));
  return *features_at + sizeof(ur__qtbe_feature) * (size_t)q->names.F;
}

/* The descriptors where the GPU reads them (nothing on a host home). */
static ur_status upload_desc(ur_qtbe *q) {
  if (q->home != UR_PLACE_DEVICE) return UR_STATUS_OK;
  size_t fat, n = desc_bytes(q, &fat);
  ur_status st = UR_STATUS_OK;
  if (!q->desc) st = home_tensor(q, &q->desc, UR_DTYPE_U8, (int64_t)n);
  if (!st) st = ur_device_sync();
  if (!st)
    st = q->be->copy(NULL, ur_tensor_data(q->desc), q->tables,
                     sizeof(ur__qtbe_table) * (size_t)q->names.T);
  if (!st)
    st = q->be->copy(NULL, (char *)ur_tensor_data(q->desc) + fat, q->names.features,
                     sizeof(ur__qtbe_feature) * (size_t)q->names.F);
  if (!st) st = q->be->stream_sync(NULL);
  return st;
}

ur_status ur_qtbe_new(ur_qtbe **out, const ur_qtbe_config *config, int32_t num_tables,
                      const ur_qtbe_table_config *tables, int32_t num_features,
                      const int32_t *feature_table, const char *const *feature_names) {
  UR__ARGS(out, config, tables, feature_table);
  *out = NULL;
  ur_status st = ur__tbe_check_engine("qtbe", config->device, config->bounds, config->out_dtype);
  if (!st) st = ur__tbe_check_counts("qtbe", num_tables, num_features);
  if (st) return st;
  ur_qtbe *q = calloc(1, sizeof *q);
  if (!q) return ur__error(UR_STATUS_OOM, "qtbe: out of host memory");
  pthread_mutex_init(&q->lock, NULL);
  q->cfg = *config;
  q->home = config->device >= 0 ? UR_PLACE_DEVICE : UR_PLACE_HOST;
  q->be = ur__backend_for(q->home);
  ur__tbe_names *n = &q->names;
  st = ur__tbe_names_init(n, "qtbe", num_tables, num_features);
  q->tc = calloc((size_t)num_tables, sizeof *q->tc);
  q->tables = calloc((size_t)num_tables, sizeof *q->tables);
  q->rows = calloc((size_t)num_tables, sizeof *q->rows);
  q->perm = calloc((size_t)num_tables, sizeof *q->perm);
  if (st || !q->tc || !q->tables || !q->rows || !q->perm) {
    ur_qtbe_free(q);
    return ur__error(UR_STATUS_OOM, "qtbe: out of host memory");
  }
  for (int32_t i = 0; i < num_tables && !st; i++)
    if (!(st = ur__tbe_names_table(n, i, tables[i].name, "t"))) {
      q->tc[i] = tables[i];
      q->tc[i].name = n->tnames[i];
      if (tables[i].dim > q->max_dim) q->max_dim = tables[i].dim;
    }
  for (int32_t i = 0; i < num_tables && !st; i++)
    if (!(st = check_table(config, &tables[i], n->tnames[i])))
      st = ur__tbe_names_check(n, i, tables[i].dim, tables[i].pooling);
  if (!st) st = ur__tbe_names_features(n, feature_table, feature_names, "f");
  for (int32_t i = 0; i < num_tables && !st; i++) st = alloc_rows(q, i);
  if (!st) st = upload_desc(q);
  if (st) {
    ur_qtbe_free(q);
    return st;
  }
  *out = q;
  return UR_STATUS_OK;
}

void ur_qtbe_free(ur_qtbe *q) {
  if (!q) return;
  for (int32_t i = 0; i < q->names.T; i++) {
    if (q->rows) ur_tensor_free(q->rows[i]);
    if (q->perm) ur_tensor_free(q->perm[i]);
  }
  for (int32_t k = 0; k < q->nfree; k++) ur_tensor_free(q->free_flags[k]);
  ur_tensor_free(q->desc);
  pthread_mutex_destroy(&q->lock);
  ur__tbe_names_free(&q->names);
  free(q->tc);
  free(q->tables);
  free(q->rows);
  free(q->perm);
  free(q);
}

int32_t ur_qtbe_num_tables(const ur_qtbe *q) {
  UR__ARGS_OR(-1, q);
  return q->names.T;
}
int32_t ur_qtbe_num_features(const ur_qtbe *q) {
  UR__ARGS_OR(-1, q);
  return q->names.F;
}
int32_t ur_qtbe_device(const ur_qtbe *q) {
  UR__ARGS_OR(-1, q);
  return q->cfg.device;
}
ur_status ur_qtbe_set_out_dtype(ur_qtbe *q, ur_dtype dtype) {
  UR__ARGS(q);
  ur_status st = ur__tbe_check_engine("qtbe", q->cfg.device, q->cfg.bounds, dtype);
  if (!st) q->cfg.out_dtype = dtype;
  return st;
}

int64_t ur_qtbe_out_dim(const ur_qtbe *q) {
  UR__ARGS_OR(-1, q);
  return q->names.out_dim;
}
int64_t ur_qtbe_skipped(const ur_qtbe *q) {
  UR__ARGS_OR(-1, q);
  return __atomic_load_n(&q->skipped, __ATOMIC_RELAXED);
}

int64_t ur_qtbe_feature_col(const ur_qtbe *q, int32_t f) {
  UR__ARGS_OR(-1, q);
  return ur__tbe_names_fcol(&q->names, f);
}

const char *ur_qtbe_table_name(const ur_qtbe *q, int32_t i) {
  UR__ARGS_OR(NULL, q);
  return ur__tbe_names_tname(&q->names, i);
}

const char *ur_qtbe_feature_name(const ur_qtbe *q, int32_t f) {
  UR__ARGS_OR(NULL, q);
  return ur__tbe_names_fname(&q->names, f);
}

int32_t ur_qtbe_feature_table(const ur_qtbe *q, int32_t f) {
  UR__ARGS_OR(-1, q);
  return ur__tbe_names_ftable(&q->names, f);
}

uint64_t ur_qtbe_bytes(const ur_qtbe *q) {
  UR__ARGS_OR(0, q);
  uint64_t n = 0;
  for (int32_t i = 0; i < q->names.T; i++) n += ur_tensor_nbytes(q->rows[i]);
  return n;
}

ur_status ur_qtbe_table(const ur_qtbe *q, int32_t i, ur_tensor **out) {
  UR__ARGS(q, out);
  *out = NULL;
  ur_status st = ur__tbe_names_index(&q->names, i);
  return st ? st : ur_tensor_view(q->rows[i], out, 0, q->tc[i].rows);
}

ur_status ur_qtbe_set_permutation(ur_qtbe *q, int32_t i, const ur_tensor *perm) {
  UR__ARGS(q);
  ur_status st = ur__tbe_names_index(&q->names, i);
  if (st) return st;
  const ur_qtbe_table_config *c = &q->tc[i];
  if (!perm) {
    ur_tensor_free(q->perm[i]);
    q->perm[i] = NULL;
    q->tables[i].perm = NULL;
    return upload_desc(q);
  }
  if (ur_tensor_dtype(perm) != UR_DTYPE_I64 || ur_tensor_numel(perm) != c->rows)
    return ur__error(UR_STATUS_INVALID,
                     "qtbe: table '%s' permutation is %s of %lld elements; expected i64 [%lld]",
                     c->name, ur_dtype_name(ur_tensor_dtype(perm)),
                     (long long)ur_tensor_numel(perm), (long long)c->rows);
  int64_t *h = malloc(sizeof(int64_t) * (size_t)c->rows);
  uint8_t *seen = calloc((size_t)c->rows, 1);
  if (!h || !seen) {
    free(h);
    free(seen);
    return ur__error(UR_STATUS_OOM, "qtbe: out of host memory for table '%s' permutation", c->name);
  }
  st = ur_tensor_read(perm, 0, c->rows, h);
  for (int64_t r = 0; r < c->rows && !st; r++) {
    if (h[r] < 0 || h[r] >= c->rows || seen[h[r]])
      st = ur__error(UR_STATUS_INVALID,
                     "qtbe: table '%s' permutation sends row id %lld to row %lld, %s", c->name,
                     (long long)r, (long long)h[r],
                     h[r] < 0 || h[r] >= c->rows ? "outside the table" : "which another id has");
    else seen[h[r]] = 1;
  }
  free(seen);
  ur_tensor *p = NULL;
  if (!st) st = home_tensor(q, &p, UR_DTYPE_I64, c->rows);
  if (!st) st = ur_tensor_write(p, 0, c->rows, h);
  free(h);
  if (st) {
    ur_tensor_free(p);
    return st;
  }
  ur_tensor_free(q->perm[i]);
  q->perm[i] = p;
  q->tables[i].perm = ur_tensor_data(p);
  return upload_desc(q);
}

/* ---- forward ---- */

static int reachable(const ur_qtbe *q, const ur_tensor *x) {
  ur_place p = ur_tensor_place(x);
  if (q->home == UR_PLACE_DEVICE)
    return p != UR_PLACE_HOST && (p != UR_PLACE_DEVICE || ur_tensor_device(x) == q->cfg.device);
  return p != UR_PLACE_DEVICE;
}

static ur_status check_tensor(const ur_qtbe *q, const ur_tensor *x, const char *what, ur_dtype d) {
  if (ur_tensor_dtype(x) != d)
    return ur__error(UR_STATUS_INVALID, "qtbe: %s is %s; expected %s", what,
                     ur_dtype_name(ur_tensor_dtype(x)), ur_dtype_name(d));
  if (!reachable(q, x))
    return ur__error(UR_STATUS_INVALID,
                     "qtbe: %s is in %s memory%s, which the collection's %s cannot read", what,
                     ur_place_name(ur_tensor_place(x)),
                     ur_tensor_place(x) == UR_PLACE_DEVICE ? " of another GPU" : "",
                     q->home == UR_PLACE_DEVICE ? "GPU" : "CPU");
  return UR_STATUS_OK;
}

/* A flags buffer at home, from the pool or new. */
static ur_status take_flags(ur_qtbe *q, ur_tensor **out) {
  pthread_mutex_lock(&q->lock);
  *out = q->nfree ? q->free_flags[--q->nfree] : NULL;
  pthread_mutex_unlock(&q->lock);
  return *out ? UR_STATUS_OK : home_tensor(q, out, UR_DTYPE_I64, 2);
}

static void give_flags(ur_qtbe *q, ur_tensor *f) {
  pthread_mutex_lock(&q->lock);
  if (q->nfree < MAX_FLAG_SLOTS) {
    q->free_flags[q->nfree++] = f;
    f = NULL;
  }
  pthread_mutex_unlock(&q->lock);
  ur_tensor_free(f);
}

/* The error for the first id outside its table, at value index i (told as the caller's when
 * value_at says where each feature's values start there). */
static ur_status bad_id(const ur_qtbe *q, const ur__qtbe_args *a, const ur_tensor *values,
                        const ur_tensor *offsets, int64_t i, const int64_t *value_at) {
  int64_t lo = 0, hi = a->bags, o = 0, id = 0; /* the last bag with offsets[bag] <= i */
  ur_status st = UR_STATUS_OK;
  while (hi - lo > 1 && !st) {
    int64_t mid = lo + (hi - lo) / 2;
    if (!(st = ur_tensor_read(offsets, mid, 1, &o))) {
      if (o <= i) lo = mid;
      else hi = mid;
    }
  }
  if (!st) st = ur_tensor_read(values, i, 1, &id);
  if (st) return st;
  int32_t f = (int32_t)(lo / a->batch);
  int64_t at = i, first = 0;
  if (value_at) {
    if ((st = ur_tensor_read(offsets, (int64_t)f * a->batch, 1, &first))) return st;
    at = i - first + value_at[f];
  }
  const ur_qtbe_table_config *tc = &q->tc[q->names.features[f].table];
  return ur__tbe_bad_id(q->names.who, tc->name, q->names.fnames[f], lo - (int64_t)f * a->batch, at,
                        id, tc->modulo, tc->rows);
}

ur_status ur_qtbe_forward(ur_stream *s, ur_qtbe *q, const ur_tensor *values,
                          const ur_tensor *offsets, const ur_tensor *weights, ur_tensor *out) {
  UR__ARGS(q, values, offsets, out);
  return ur__qtbe_forward_at(s, q, values, offsets, weights, out, NULL);
}

ur_status ur__qtbe_forward_at(ur_stream *s, ur_qtbe *q, const ur_tensor *values,
                              const ur_tensor *offsets, const ur_tensor *weights, ur_tensor *out,
                              const int64_t *value_at) {
  ur_status st;
  if ((st = check_tensor(q, values, "values", UR_DTYPE_I64)) ||
      (st = check_tensor(q, offsets, "offsets", UR_DTYPE_I64)) ||
      (weights && (st = check_tensor(q, weights, "weights", UR_DTYPE_F32))) ||
      (st = check_tensor(q, out, "out", q->cfg.out_dtype)))
    return st;
  ur__qtbe_args a;
  memset(&a, 0, sizeof a);
  a.n = ur_tensor_numel(values);
  a.bags = ur_tensor_numel(offsets) - 1;
  if (a.bags < 0)
    return ur__error(UR_STATUS_INVALID, "qtbe: offsets is empty; expected bags + 1 entries");
  if (a.bags % q->names.F)
    return ur__error(UR_STATUS_INVALID,
                     "qtbe: %lld offsets hold %lld bags, which do not split evenly over %d "
                     "features",
                     (long long)ur_tensor_numel(offsets), (long long)a.bags, (int)q->names.F);
  if (weights && ur_tensor_numel(weights) != a.n)
    return ur__error(UR_STATUS_INVALID, "qtbe: %lld weight%s for %lld value%s; expected one each",
                     (long long)ur_tensor_numel(weights), ur__s(ur_tensor_numel(weights)),
                     (long long)a.n, ur__s(a.n));
  if (q->home == UR_PLACE_DEVICE && (a.n >= INT32_MAX || a.bags >= INT32_MAX))
    return ur__error(UR_STATUS_INVALID,
                     "qtbe: %lld values in %lld bags; the GPU path takes fewer than 2^31 of each",
                     (long long)a.n, (long long)a.bags);
  a.batch = a.bags / q->names.F;
  int64_t rows = q->names.pooled ? a.batch : a.n, cols = q->names.out_dim;
  if (ur_tensor_ndim(out) != 2 || ur_tensor_dim(out, 0) != rows || ur_tensor_dim(out, 1) != cols) {
    int64_t shape[UR_MAX_DIMS];
    int32_t nd = ur_tensor_ndim(out);
    char got[128];
    for (int32_t d = 0; d < nd && d < UR_MAX_DIMS; d++) shape[d] = ur_tensor_dim(out, d);
    ur__shape_text(nd < UR_MAX_DIMS ? nd : UR_MAX_DIMS, shape, got, sizeof got);
    return ur__error(UR_STATUS_INVALID, "qtbe: out has shape %s; expected [%lld, %lld]", got,
                     (long long)rows, (long long)cols);
  }
  if ((st = UR__NEED(q->be, qtbe, forward))) return st;
  a.num_tables = q->names.T;
  a.num_features = q->names.F;
  a.bounds = q->cfg.bounds;
  a.pooled = q->names.pooled;
  a.out_dtype = q->cfg.out_dtype;
  a.max_dim = q->max_dim;
  a.values = ur_tensor_data(values);
  a.offsets = ur_tensor_data(offsets);
  a.weights = weights ? ur_tensor_data(weights) : NULL;
  a.out_stride = cols;
  a.out = ur_tensor_data(out);
  if (q->home == UR_PLACE_DEVICE) {
    size_t fat;
    desc_bytes(q, &fat);
    a.tables = (const ur__qtbe_table *)ur_tensor_data(q->desc);
    a.features = (const ur__qtbe_feature *)((const char *)ur_tensor_data(q->desc) + fat);
  } else {
    a.tables = q->tables;
    a.features = q->names.features;
    /* The CPU reads these in place: after any GPU work on them. */
    if ((st = ur_device_sync()) ||
        (st = ur__tbe_check_offsets(&q->names, a.offsets, a.bags, a.n, NULL, a.batch)))
      return st;
  }
  if (a.bags == 0) return UR_STATUS_OK;
  ur_tensor *flags = NULL;
  int64_t host_flags[2] = {UR_TBE_NO_BAD, 0};
  void *sh = s ? s->handle : NULL;
  int32_t prev = UR_LOC_CPU;
  if ((st = take_flags(q, &flags))) return st;
  if (!(st = ur__device_enter(q->be, q->cfg.device, &prev))) {
    a.flags = ur_tensor_data(flags);
    /* Set on the SMs: a copy from the host would queue behind other uploads on the copy engine. */
    st = q->be->fill(sh, a.flags, 1, sizeof host_flags[0], (uint64_t)host_flags[0]);
    if (!st) st = q->be->fill(sh, a.flags + 1, 1, sizeof host_flags[1], (uint64_t)host_flags[1]);
    if (!st) st = q->be->qtbe->forward(sh, &a);
    if (!st && a.bounds != UR_TBE_BOUNDS_OFF)
      st = q->be->read(sh, host_flags, a.flags, sizeof host_flags);
    st = ur__device_leave(q->be, q->cfg.device, prev, st);
  }
  give_flags(q, flags);
  if (st) return st;
  if (a.bounds == UR_TBE_BOUNDS_WARN && host_flags[1])
    __atomic_add_fetch(&q->skipped, host_flags[1], __ATOMIC_RELAXED);
  if (a.bounds == UR_TBE_BOUNDS_FATAL && host_flags[0] != UR_TBE_NO_BAD)
    return bad_id(q, &a, values, offsets, host_flags[0], value_at);
  return UR_STATUS_OK;
}
