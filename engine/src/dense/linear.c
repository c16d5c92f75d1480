/* linear.c: the Linear layer (y = act(x w^T + b)) and the elementwise activations: the public
 * entry points, and the CPU backend's versions on OpenBLAS, which are the reference.  bf16 is
 * computed as the GPU does it: bf16 inputs widened exactly to f32, f32 products and sums,
 * bias and activation in f32, one rounding of the result.  A row of the output depends on its
 * row of the input alone (blocks of ROW_BLOCK rows, see gemm_rows), so a batch split over ranks
 * computes each sample as the whole batch does. */
#include <cblas.h>
#include <limits.h>
#include <pthread.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dense/act.h"
#include "dense/dense.h"
#include "dense/linear_plan.h"

/* ---- CPU helpers ---- */

/* OpenBLAS gives a row of C bits that depend on where the row falls: rows past the last whole
 * block of its micro-kernel, and rows at its threads' boundaries, are summed by other code.  So
 * every product whose rows are samples is made in blocks of exactly ROW_BLOCK rows (a multiple
 * of every kernel's height), the last block padded with zeros, each block a single-threaded
 * call, the blocks spread over the engine's threads: each row is then computed the same way
 * wherever it is, in a batch of any size. */
enum { ROW_BLOCK = 64 };

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static void blas_single(void) { openblas_set_num_threads(1); }

typedef struct gemm_job {
  int transa, transb, pad, phase;
  int64_t m, n, k;
  const float *a, *b;
  int lda, ldb, ldc;
  float beta;
  float *c;
  int oom;
} gemm_job;

static void gemm_blocks(void *ctx, size_t b0, size_t b1) {
  gemm_job *j = ctx;
  enum CBLAS_TRANSPOSE ta = j->transa ? CblasTrans : CblasNoTrans;
  enum CBLAS_TRANSPOSE tb = j->transb ? CblasTrans : CblasNoTrans;
  for (size_t blk = b0; blk < b1; blk++) {
    /* the block's rows of C, and where they sit in it (phase: the first row's place) */
    int64_t v0 = (int64_t)blk * ROW_BLOCK - j->phase, r0 = v0 > 0 ? v0 : 0;
    int64_t r1 = v0 + ROW_BLOCK < j->m ? v0 + ROW_BLOCK : j->m, m = r1 - r0, at = r0 - v0;
    const float *a = j->transa ? j->a + r0 : j->a + r0 * j->lda;
    float *c = j->c + r0 * j->ldc;
    if (m == ROW_BLOCK || !j->pad) {
      cblas_sgemm(CblasRowMajor, ta, tb, (int)m, (int)j->n, (int)j->k, 1.0f, a, j->lda, j->b,
                  j->ldb, j->beta, c, j->ldc);
      continue;
    }
    /* a part of a block, padded with zero rows to a whole one (A is not transposed where rows
     * are samples) */
    float *pa = calloc((size_t)ROW_BLOCK * (size_t)j->k + 1, sizeof(float));
    float *pc = calloc((size_t)ROW_BLOCK * (size_t)j->n + 1, sizeof(float));
    if (!pa || !pc) {
      free(pa);
      free(pc);
      __atomic_store_n(&j->oom, 1, __ATOMIC_RELAXED);
      continue;
    }
    for (int64_t r = 0; r < m; r++) {
      memcpy(pa + (at + r) * j->k, a + r * j->lda, (size_t)j->k * sizeof(float));
      if (j->beta != 0.0f)
        memcpy(pc + (at + r) * j->n, c + r * j->ldc, (size_t)j->n * sizeof(float));
    }
    cblas_sgemm(CblasRowMajor, ta, tb, ROW_BLOCK, (int)j->n, (int)j->k, 1.0f, pa, (int)j->k,
                j->b, j->ldb, j->beta, pc, (int)j->n);
    for (int64_t r = 0; r < m; r++)
      memcpy(c + r * j->ldc, pc + (at + r) * j->n, (size_t)j->n * sizeof(float));
    free(pa);
    free(pc);
  }
}

/* C [m, n] = op(A) op(B) + beta C, row-major, in blocks of ROW_BLOCK rows of C.  With pad (A
 * not transposed), blocks that C's rows fill only in part are padded to whole ones, and C's
 * first row sits at place phase (0..ROW_BLOCK-1) of the first block, as that row of a larger
 * batch would: each row of C then depends on its row of A and its place alone.  Returns 0, or
 * -1 out of host memory. */
static int gemm_rows(int transa, int transb, int pad, int phase, int64_t m, int64_t n,
                     int64_t k, const float *a, int lda, const float *b, int ldb, float beta,
                     float *c, int ldc) {
  pthread_once(&blas_once, blas_single);
  if (!pad) phase = 0;
  gemm_job j = {transa, transb, pad, phase, m, n, k, a, b, lda, ldb, ldc, beta, c, 0};
  ur__parallel_for((size_t)((phase + m + ROW_BLOCK - 1) / ROW_BLOCK), 1, gemm_blocks, &j);
  return j.oom ? -1 : 0;
}

static int row_phase(uint32_t flags) {
  return (int)((flags >> UR_DENSE_ROW0_SHIFT) & 255) % ROW_BLOCK;
}

/* f32 of p's n elements: p itself when it is f32, else a new buffer (*owned, for free()). */
static const float *as_f32(const void *p, ur_dtype d, size_t n, float **owned) {
  *owned = NULL;
  if (d == UR_DTYPE_F32) return p;
  float *buf = malloc((n ? n : 1) * sizeof(float));
  if (!buf) return NULL;
  ur__cpu_cast(NULL, p, d, buf, UR_DTYPE_F32, (int64_t)n);
  *owned = buf;
  return buf;
}

static ur_status cpu_oom(const char *op, size_t n) {
  return ur__error(UR_STATUS_OOM, "%s: out of host memory for %zu f32 elements of scratch", op, n);
}

static inline float act_apply(float v, ur_act act) {
  return act == UR_ACT_RELU ? ur__relu(v) : act == UR_ACT_SIGMOID ? ur__sigmoid(v) : v;
}

/* ---- linear, CPU ---- */

/* The zero columns that end x and w (UR_DENSE_PAD_SHIFT). */
static int64_t pad_of(uint32_t flags) {
  return (int64_t)((flags >> UR_DENSE_PAD_SHIFT) & UR_DENSE_PAD_MAX);
}

int64_t ur_linear_mask_cols(int64_t out) { return ur__mask_cols(out); }

static int mask_bit(const uint8_t *m, int64_t mcols, size_t r, int64_t c) {
  return (m[r * (size_t)mcols + (size_t)(c >> 3)] >> (c & 7)) & 1;
}

typedef struct bias_job {
  const float *acc;   /* [rows, out] products */
  const void *b;      /* [out] or NULL */
  void *y;
  uint8_t *mask;      /* or NULL */
  ur_dtype d;
  int64_t out;
  ur_act act;
} bias_job;

/* An f32 row in place (the products are y): the bias, the activation, then the mask from the
 * stored values a byte of columns at a time; loops the compiler vectorizes, the same bits as
 * the general loop below. */
static void bias_row_f32(const bias_job *j, float *y, uint8_t *m) {
  const float *b = j->b;
  int64_t out = j->out;
  if (b)
    for (int64_t c = 0; c < out; c++) y[c] += b[c];
  if (j->act == UR_ACT_RELU)
    for (int64_t c = 0; c < out; c++) y[c] = ur__relu(y[c]);
  else if (j->act == UR_ACT_SIGMOID)
    for (int64_t c = 0; c < out; c++) y[c] = ur__sigmoid(y[c]);
  if (!m) return;
  for (int64_t c0 = 0; c0 < out; c0 += 8) {
    int n = out - c0 < 8 ? (int)(out - c0) : 8;
    unsigned bits = 0;
    for (int k = 0; k < n; k++) bits |= (unsigned)ur__relu_passes(y[c0 + k]) << k;
    m[c0 >> 3] = (uint8_t)bits;
  }
}

static void bias_range(void *ctx, size_t r0, size_t r1) {
  bias_job *j = ctx;
  int64_t mcols = ur_linear_mask_cols(j->out);
  for (size_t r = r0; r < r1; r++) {
    uint8_t *m = j->mask ? j->mask + r * (size_t)mcols : NULL;
    if (m) memset(m, 0, (size_t)mcols);
    if (j->d == UR_DTYPE_F32 && (const void *)j->acc == j->y) {
      bias_row_f32(j, (float *)j->y + r * (size_t)j->out, m);
      continue;
    }
    for (int64_t c = 0; c < j->out; c++) {
      size_t i = r * (size_t)j->out + (size_t)c;
      float v = j->acc[i];
      if (j->b) v += ur__dense_ld(j->b, j->d, (size_t)c);
      ur__dense_st(j->y, j->d, i, act_apply(v, j->act));
      /* the mask says what the backward of y's reader sees: y as stored */
      if (m && ur__relu_passes(ur__dense_ld(j->y, j->d, i))) m[c >> 3] |= (uint8_t)(1u << (c & 7));
    }
  }
}

/* The CPU skips the padding columns of x and w (their products are zero), so a padded layer
 * gives the unpadded one's bits: the BLAS is called with the unpadded sizes and the padded
 * leading dimensions. */
ur_status ur__cpu_linear_forward(void *stream, const void *x, const void *w, const void *b,
                                 void *y, uint8_t *mask, int64_t rows, int64_t in, int64_t out,
                                 ur_dtype dtype, ur_act act, uint32_t flags) {
  (void)stream;
  const char *op = "linear forward";
  int64_t k = in - pad_of(flags);
  size_t ny = (size_t)rows * (size_t)out;
  float *xo, *wo, *yo = NULL;
  const float *xf = as_f32(x, dtype, (size_t)rows * (size_t)in, &xo);
  const float *wf = as_f32(w, dtype, (size_t)out * (size_t)in, &wo);
  float *acc = dtype == UR_DTYPE_F32 ? y : (yo = malloc((ny ? ny : 1) * sizeof(float)));
  ur_status st = UR_STATUS_OK;
  if (!xf || !wf || !acc) st = cpu_oom(op, ny);
  else if (k == 0) memset(acc, 0, ny * sizeof(float));
  else if (gemm_rows(0, 1, 1, row_phase(flags), rows, out, k, xf, (int)in, wf, (int)in, 0.0f, acc,
                     (int)out))
    st = cpu_oom(op, ny);
  if (!st) {
    bias_job j = {acc, b, y, act == UR_ACT_RELU ? mask : NULL, dtype, out, act};
    ur__parallel_for((size_t)rows, 256, bias_range, &j);
  }
  free(xo);
  free(wo);
  free(yo);
  return st;
}

typedef struct mask_job {
  const void *gy, *y;
  void *g;
  ur_dtype d;
} mask_job;

/* g = gy where ur__relu_passes(y) (y > 0 or NaN), else 0; bf16 elements are copied bit for bit. */
static void mask_range(void *ctx, size_t i0, size_t i1) {
  mask_job *j = ctx;
  if (j->d == UR_DTYPE_F32) {
    const float *gy = j->gy, *y = j->y;
    float *g = j->g;
    for (size_t i = i0; i < i1; i++) g[i] = ur__relu_passes(y[i]) ? gy[i] : 0.0f;
  } else {
    const uint16_t *gy = j->gy, *y = j->y;
    uint16_t *g = j->g;
    for (size_t i = i0; i < i1; i++) g[i] = ur__relu_passes(ur__bf16_to_f32(y[i])) ? gy[i] : 0;
  }
}

typedef struct colsum_job {
  const float *g;
  float *gb;
  int64_t rows, out;
} colsum_job;

/* Column sums in double, over all rows, for a range of columns. */
static void colsum_range(void *ctx, size_t c0, size_t c1) {
  colsum_job *j = ctx;
  double acc[64];
  for (size_t cb = c0; cb < c1; cb += 64) {
    size_t ce = cb + 64 < c1 ? cb + 64 : c1;
    for (size_t c = cb; c < ce; c++) acc[c - cb] = 0;
    for (int64_t r = 0; r < j->rows; r++) {
      const float *row = j->g + (size_t)r * (size_t)j->out;
      for (size_t c = cb; c < ce; c++) acc[c - cb] += row[c];
    }
    for (size_t c = cb; c < ce; c++) j->gb[c] = (float)((double)j->gb[c] + acc[c - cb]);
  }
}

/* gx's padding columns zeroed, and gx masked by x_mask, or by x itself (X_RELU: x is a ReLU's
 * stored output, whose forward wrote the same bits as a mask): rows of an f32 [rows, in]. */
typedef struct gx_job {
  float *gx;
  const uint8_t *mask;
  const void *x; /* X_RELU, else NULL */
  ur_dtype d;
  int64_t in, k;
} gx_job;

static void gx_range(void *ctx, size_t r0, size_t r1) {
  gx_job *j = ctx;
  int64_t mcols = ur_linear_mask_cols(j->in);
  for (size_t r = r0; r < r1; r++) {
    float *row = j->gx + r * (size_t)j->in;
    for (int64_t c = j->k; c < j->in; c++) row[c] = 0.0f;
    if (j->mask)
      for (int64_t c = 0; c < j->k; c++)
        if (!mask_bit(j->mask, mcols, r, c)) row[c] = 0.0f;
    if (j->x)
      for (int64_t c = 0; c < j->k; c++)
        if (!ur__relu_passes(ur__dense_ld(j->x, j->d, r * (size_t)j->in + (size_t)c)))
          row[c] = 0.0f;
  }
}

ur_status ur__cpu_dense_join(void *stream) {
  (void)stream;
  return UR_STATUS_OK;
}

ur_status ur__cpu_linear_backward(void *stream, const void *x, const void *w, const void *y,
                                  const void *gy, const uint8_t *x_mask, void *gx, float *gw,
                                  float *gb, float *gb_x, void *work, int64_t rows, int64_t in,
                                  int64_t out, ur_dtype dtype, ur_act act, uint32_t flags) {
  (void)stream;
  const char *op = "linear backward";
  size_t ng = (size_t)rows * (size_t)out, nx = (size_t)rows * (size_t)in;
  int64_t k = in - pad_of(flags);
  const void *g = gy;
  if (act == UR_ACT_RELU && !(flags & UR_DENSE_GY_MASKED)) {
    mask_job mj = {gy, y, work, dtype};
    ur__parallel_for(ng, (size_t)1 << 16, mask_range, &mj);
    g = work;
  }
  float *go = NULL, *wo = NULL, *xo = NULL, *gxo = NULL, *gxw = NULL;
  ur_status st = UR_STATUS_OK;
  const float *gf = as_f32(g, dtype, ng, &go);
  if (!gf) return cpu_oom(op, ng);
  if (gx && rows > 0 && in > 0) {
    const float *wf = as_f32(w, dtype, (size_t)out * (size_t)in, &wo);
    int acc = (flags & UR_DENSE_ACCUMULATE) != 0;
    float *dst = gx;
    if (dtype != UR_DTYPE_F32) {
      if (acc) dst = (float *)as_f32(gx, dtype, nx, &gxo);
      else dst = gxo = malloc(nx * sizeof(float));
    }
    if (!wf || !dst) {
      st = cpu_oom(op, nx);
      goto done;
    }
    if (out == 0 || k == 0) {
      if (!acc) memset(dst, 0, nx * sizeof(float));
    } else if (gemm_rows(0, 0, 1, row_phase(flags), rows, k, out, gf, (int)out, wf, (int)in,
                         acc ? 1.0f : 0.0f, dst, (int)in)) {
      st = cpu_oom(op, nx);
      goto done;
    }
    /* the padding's gradient is zero (left as it was when accumulating; x_mask and X_RELU
     * exclude that); the mask as the layer below's backward would have applied it: zeros,
     * exactly */
    int x_relu = (flags & UR_DENSE_X_RELU) != 0;
    if ((k < in && !acc) || x_mask || x_relu) {
      gx_job xj = {dst, x_mask, x_relu ? x : NULL, dtype, in, k};
      ur__parallel_for((size_t)rows, 256, gx_range, &xj);
    }
    if (dtype != UR_DTYPE_F32) ur__cpu_cast(NULL, dst, UR_DTYPE_F32, gx, dtype, (int64_t)nx);
    if (gb_x) {
      /* summed as the layer below sums its masked gradient: the stored values, in double */
      const float *sf = as_f32(gx, dtype, nx, &gxw);
      if (!sf) {
        st = cpu_oom(op, nx);
        goto done;
      }
      colsum_job cj = {sf, gb_x, rows, in};
      ur__parallel_for((size_t)in, 64, colsum_range, &cj);
    }
  }
  if (gw && rows > 0 && out > 0 && k > 0) {
    const float *xf = as_f32(x, dtype, nx, &xo);
    if (!xf) {
      st = cpu_oom(op, nx);
      goto done;
    }
    /* a sum over the samples: blocks of the output's rows, unpadded */
    if (gemm_rows(1, 0, 0, 0, out, k, rows, gf, (int)out, xf, (int)in, 1.0f, gw, (int)in)) {
      st = cpu_oom(op, (size_t)out * (size_t)in);
      goto done;
    }
  }
  if (gb && rows > 0) {
    colsum_job cj = {gf, gb, rows, out};
    ur__parallel_for((size_t)out, 64, colsum_range, &cj);
  }
done:
  free(go);
  free(wo);
  free(xo);
  free(gxo);
  free(gxw);
  return st;
}

/* ---- activations, CPU ---- */

typedef struct act_job {
  const void *x, *gy;
  void *y;
  ur_dtype d;
  ur_act act;
} act_job;

static void act_fwd_range(void *ctx, size_t i0, size_t i1) {
  act_job *j = ctx;
  for (size_t i = i0; i < i1; i++)
    ur__dense_st(j->y, j->d, i, act_apply(ur__dense_ld(j->x, j->d, i), j->act));
}

/* x holds the forward's output here: both derivatives are functions of it. */
static void act_bwd_range(void *ctx, size_t i0, size_t i1) {
  act_job *j = ctx;
  for (size_t i = i0; i < i1; i++) {
    float y = ur__dense_ld(j->x, j->d, i), g = ur__dense_ld(j->gy, j->d, i);
    float v = j->act == UR_ACT_RELU ? (ur__relu_passes(y) ? g : 0.0f) : g * y * (1.0f - y);
    ur__dense_st(j->y, j->d, i, v);
  }
}

ur_status ur__cpu_act_forward(void *stream, const void *x, void *y, int64_t n, ur_dtype dtype,
                              ur_act act) {
  (void)stream;
  act_job j = {x, NULL, y, dtype, act};
  ur__parallel_for((size_t)n, (size_t)1 << 16, act_fwd_range, &j);
  return UR_STATUS_OK;
}

ur_status ur__cpu_act_backward(void *stream, const void *y, const void *gy, void *gx, int64_t n,
                               ur_dtype dtype, ur_act act) {
  (void)stream;
  act_job j = {y, gy, gx, dtype, act};
  ur__parallel_for((size_t)n, (size_t)1 << 16, act_bwd_range, &j);
  return UR_STATUS_OK;
}

/* ---- public entry points ---- */

/* t (if any) has ref's dtype; ref is the first tensor named in group. */
static ur_status same_dtype(const char *op, const char *name, const ur_tensor *t,
                            const ur_tensor *ref, const char *group) {
  if (!t || t->dtype == ref->dtype) return UR_STATUS_OK;
  char first[16];
  size_t k = strcspn(group, ", ");
  snprintf(first, sizeof first, "%.*s", (int)(k < 15 ? k : 15), group);
  return ur__error(UR_STATUS_INVALID, "%s: %s is %s but %s is %s; %s take one dtype", op, name,
                   ur_dtype_name(t->dtype), first, ur_dtype_name(ref->dtype), group);
}

static ur_status check_dims(const char *op, int64_t rows, int64_t in, int64_t out) {
  if (rows <= INT_MAX && in <= INT_MAX && out <= INT_MAX) return UR_STATUS_OK;
  return ur__error(UR_STATUS_INVALID,
                   "%s: [%lld, %lld] x [%lld, %lld]^T has a size over 2^31 - 1, which the BLAS "
                   "libraries take",
                   op, (long long)rows, (long long)in, (long long)out, (long long)in);
}

/* Outputs of a matrix product cannot share memory with its inputs. */
static ur_status no_overlap(const char *op, const char *a, const ur_tensor *ta, const char *b,
                            const ur_tensor *tb) {
  if (!ta || !tb || ta->st != tb->st) return UR_STATUS_OK;
  size_t ea = ur_dtype_size(ta->dtype), eb = ur_dtype_size(tb->dtype);
  uint64_t a0 = (uint64_t)ta->offset * ea, a1 = a0 + (uint64_t)ta->numel * ea;
  uint64_t b0 = (uint64_t)tb->offset * eb, b1 = b0 + (uint64_t)tb->numel * eb;
  if (a0 < b1 && b0 < a1)
    return ur__error(UR_STATUS_INVALID, "%s: %s and %s overlap in storage #%llu", op, a, b,
                     (unsigned long long)ta->st->id);
  return UR_STATUS_OK;
}

static ur_status check_flags(const char *op, uint32_t flags, uint32_t allowed) {
  if (!(flags & ~allowed)) return UR_STATUS_OK;
  return ur__error(UR_STATUS_INVALID, "%s: flags 0x%x include bits other than 0x%x", op,
                   (unsigned)flags, (unsigned)allowed);
}

/* A ReLU mask of rows x cols elements: u8 [rows, ur_linear_mask_cols(cols)]. */
static ur_status check_mask(const char *op, const char *name, const ur_tensor *m, int64_t rows,
                            int64_t cols) {
  int64_t mc = ur_linear_mask_cols(cols);
  if (m->dtype == UR_DTYPE_U8 && m->ndim == 2 && m->shape[0] == rows && m->shape[1] == mc)
    return UR_STATUS_OK;
  return ur__error(UR_STATUS_INVALID,
                   "%s: %s is %s of %lld elements; expected u8 [%lld, %lld] (the ReLU mask of "
                   "%lld columns)",
                   op, name, ur_dtype_name(m->dtype), (long long)m->numel, (long long)rows,
                   (long long)mc, (long long)cols);
}

/* The padding that flags declare fits in the input's columns. */
static ur_status check_pad(const char *op, uint32_t flags, int64_t in) {
  if (pad_of(flags) <= in) return UR_STATUS_OK;
  return ur__error(UR_STATUS_INVALID, "%s: %lld padding columns but the input has %lld", op,
                   (long long)pad_of(flags), (long long)in);
}

ur_status ur_linear_forward(ur_stream *s, const ur_tensor *x, const ur_tensor *w,
                            const ur_tensor *b, ur_tensor *y, ur_tensor *mask, ur_act act,
                            uint32_t flags) {
  UR__ARGS(x, w, y);
  const char *op = "linear forward";
  ur_status st = ur__dense_check(op, "x", x, 1, -1, -1);
  if (st) return st;
  int64_t rows = x->shape[0], in = x->shape[1];
  if ((st = ur__dense_check(op, "w", w, 1, -1, in))) return st;
  int64_t out = w->shape[0];
  if ((b && (st = ur__dense_check_numel(op, "b", b, 1, out))) ||
      (st = ur__dense_check(op, "y", y, 1, rows, out)))
    return st;
  const char *group = "x, w, b and y";
  if ((st = same_dtype(op, "w", w, x, group)) || (st = same_dtype(op, "b", b, x, group)) ||
      (st = same_dtype(op, "y", y, x, group)))
    return st;
  if (act != UR_ACT_NONE && act != UR_ACT_RELU)
    return ur__error(UR_STATUS_INVALID, "%s: activation %d is not none (0) or relu (1)", op,
                     (int)act);
  if (mask && act != UR_ACT_RELU)
    return ur__error(UR_STATUS_INVALID, "%s: a mask is written only under relu (activation %d)",
                     op, (int)act);
  if ((st = check_flags(op, flags, UR_DENSE_TF32 | (255u << UR_DENSE_ROW0_SHIFT) |
                                       ((uint32_t)UR_DENSE_PAD_MAX << UR_DENSE_PAD_SHIFT))) ||
      (st = check_pad(op, flags, in)) || (st = check_dims(op, rows, in, out)) ||
      (mask && (st = check_mask(op, "mask", mask, rows, out))) ||
      (st = no_overlap(op, "y", y, "x", x)) || (st = no_overlap(op, "y", y, "w", w)) ||
      (st = no_overlap(op, "y", y, "b", b)))
    return st;
  const ur_tensor *ts[] = {x, w, b, y, mask};
  const char *names[] = {"x", "w", "b", "y", "mask"};
  const ur_backend *be;
  if ((st = ur__dense_backend(op, 5, ts, names, &be)) ||
      (st = UR__NEED(be, dense, linear_forward)))
    return st;
  if (!rows || !out) return UR_STATUS_OK;
  return be->dense->linear_forward(ur__dense_stream(s), ur_tensor_data(x), ur_tensor_data(w),
                                   b ? ur_tensor_data(b) : NULL, ur_tensor_data(y),
                                   mask ? ur_tensor_data(mask) : NULL, rows, in, out, x->dtype,
                                   act, flags);
}

/* What a backward call must satisfy beyond its tensors' shapes and dtypes: the activation,
 * the optional arguments that go together (given or not), the flags and the sizes. */
static ur_status check_backward(const char *op, int64_t rows, int64_t in, int64_t out, int gx,
                                int gb, int x_mask, int gb_x, ur_act act, uint32_t flags) {
  if (act != UR_ACT_NONE && act != UR_ACT_RELU)
    return ur__error(UR_STATUS_INVALID, "%s: activation %d is not none (0) or relu (1)", op,
                     (int)act);
  int x_relu = (flags & UR_DENSE_X_RELU) != 0;
  const char *masker = x_relu ? "X_RELU" : "x_mask";
  if (x_relu && x_mask)
    return ur__error(UR_STATUS_INVALID,
                     "%s: x_mask and X_RELU both mask gx (from the mask's bits, from x): give "
                     "one", op);
  if ((x_mask || x_relu || gb_x) && !gx)
    return ur__error(UR_STATUS_INVALID, "%s: %s%s%s act%s on gx, which is NULL", op,
                     x_mask || x_relu ? masker : "", (x_mask || x_relu) && gb_x ? " and " : "",
                     gb_x ? "gb_x" : "", (x_mask || x_relu) && gb_x ? "" : "s");
  if (gb_x && !x_mask && !x_relu)
    return ur__error(UR_STATUS_INVALID,
                     "%s: gb_x is the masked gradient's sum: it needs x_mask or X_RELU", op);
  if ((x_mask || x_relu) && (flags & UR_DENSE_ACCUMULATE))
    return ur__error(UR_STATUS_INVALID, "%s: %s cannot mask an accumulated gx", op, masker);
  if (gb && (flags & UR_DENSE_GY_MASKED))
    return ur__error(UR_STATUS_INVALID,
                     "%s: under GY_MASKED the layer above took the bias gradient: gb must be "
                     "NULL", op);
  uint32_t allowed = UR_DENSE_TF32 | UR_DENSE_ACCUMULATE | UR_DENSE_GY_MASKED |
                     UR_DENSE_WGRAD_ASYNC | UR_DENSE_X_RELU | (255u << UR_DENSE_ROW0_SHIFT) |
                     ((uint32_t)UR_DENSE_PAD_MAX << UR_DENSE_PAD_SHIFT);
  ur_status st;
  if ((st = check_flags(op, flags, allowed)) || (st = check_pad(op, flags, in)) ||
      (st = check_dims(op, rows, in, out)))
    return st;
  return UR_STATUS_OK;
}

ur_status ur_linear_backward(ur_stream *s, const ur_tensor *x, const ur_tensor *w,
                             const ur_tensor *y, const ur_tensor *gy, const ur_tensor *x_mask,
                             ur_tensor *gx, ur_tensor *gw, ur_tensor *gb, ur_tensor *gb_x,
                             ur_tensor *work, ur_act act, uint32_t flags) {
  UR__ARGS(x, w, gy);
  const char *op = "linear backward";
  ur_status st = ur__dense_check(op, "x", x, 1, -1, -1);
  if (st) return st;
  int64_t rows = x->shape[0], in = x->shape[1];
  if ((st = ur__dense_check(op, "w", w, 1, -1, in))) return st;
  int64_t out = w->shape[0];
  if ((st = ur__dense_check(op, "gy", gy, 1, rows, out)) ||
      (st = check_backward(op, rows, in, out, gx != NULL, gb != NULL, x_mask != NULL,
                           gb_x != NULL, act, flags)))
    return st;
  int masking = act == UR_ACT_RELU && !(flags & UR_DENSE_GY_MASKED);
  if (masking && ((st = ur__dense_check(op, "y (relu needs it)", y, 1, rows, out)) ||
                  (st = ur__dense_check(op, "work (relu needs it)", work, 1, rows, out))))
    return st;
  if ((gx && (st = ur__dense_check(op, "gx", gx, 1, rows, in))) ||
      (gw && (st = ur__dense_check(op, "gw", gw, 0, out, in))) ||
      (gb && (st = ur__dense_check_numel(op, "gb", gb, 0, out))) ||
      (gb_x && (st = ur__dense_check_numel(op, "gb_x", gb_x, 0, in))) ||
      (x_mask && (st = check_mask(op, "x_mask", x_mask, rows, in))))
    return st;
  const char *group = "x, w, y, gy, gx and work";
  if ((st = same_dtype(op, "w", w, x, group)) || (st = same_dtype(op, "gy", gy, x, group)) ||
      (masking && ((st = same_dtype(op, "y", y, x, group)) ||
                   (st = same_dtype(op, "work", work, x, group)))) ||
      (st = same_dtype(op, "gx", gx, x, group)))
    return st;
  if ((st = no_overlap(op, "gx", gx, "gy", gy)) ||
      (st = no_overlap(op, "gx", gx, "w", w)) || (st = no_overlap(op, "gw", gw, "x", x)) ||
      (st = no_overlap(op, "gw", gw, "gy", gy)) || (st = no_overlap(op, "gx", gx, "x", x)))
    return st;
  if (masking && ((st = no_overlap(op, "work", work, "x", x)) ||
                  (st = no_overlap(op, "work", work, "w", w)) ||
                  (st = no_overlap(op, "work", work, "gx", gx))))
    return st;
  if (!masking) y = work = NULL;
  if (act == UR_ACT_RELU && !masking) act = UR_ACT_NONE; /* g is gy */
  const ur_tensor *ts[] = {x, w, y, gy, gx, gw, gb, work, x_mask, gb_x};
  const char *names[] = {"x", "w", "y", "gy", "gx", "gw", "gb", "work", "x_mask", "gb_x"};
  const ur_backend *be;
  if ((st = ur__dense_backend(op, 10, ts, names, &be)) ||
      (st = UR__NEED(be, dense, linear_backward)))
    return st;
  if (!rows) return UR_STATUS_OK;
  return be->dense->linear_backward(ur__dense_stream(s), ur_tensor_data(x), ur_tensor_data(w),
                                    y ? ur_tensor_data(y) : NULL, ur_tensor_data(gy),
                                    x_mask ? ur_tensor_data(x_mask) : NULL,
                                    gx ? ur_tensor_data(gx) : NULL, gw ? ur_tensor_data(gw) : NULL,
                                    gb ? ur_tensor_data(gb) : NULL,
                                    gb_x ? ur_tensor_data(gb_x) : NULL,
                                    work ? ur_tensor_data(work) : NULL, rows, in, out, x->dtype,
                                    act, flags);
}

/* What kernels/linear.cu's ur__cuda_linear_backward asks of its streams' workspaces, when
 * cuBLASLt runs its products: the parts by linear_plan.h's rules, on the stream of the part's
 * step (the weight gradient's may be the side stream).  spec/dense_cuda_spec.lua holds the two
 * to the same bytes on a GPU. */
ur_status ur_linear_backward_workspace(int64_t rows, int64_t in, int64_t out, int32_t gx,
                                       int32_t gw, int32_t gb, int32_t x_mask,
                                       uint64_t *main_bytes, uint64_t *side_bytes, ur_act act,
                                       uint32_t flags, int32_t sms) {
  UR__ARGS(main_bytes, side_bytes);
  const char *op = "linear backward workspace";
  if (rows < 0 || in < 0 || out < 0)
    return ur__error(UR_STATUS_INVALID,
                     "%s: rows %lld, in %lld, out %lld; expected sizes of 0 or more", op,
                     (long long)rows, (long long)in, (long long)out);
  const int32_t given[] = {gx, gw, gb, x_mask};
  const char *names[] = {"gx", "gw", "gb", "x_mask"};
  for (int i = 0; i < 4; i++)
    if (given[i] != 0 && given[i] != 1)
      return ur__error(UR_STATUS_INVALID, "%s: %s is %d; expected 1 (given) or 0 (NULL)", op,
                       names[i], (int)given[i]);
  if (sms < 1)
    return ur__error(UR_STATUS_INVALID,
                     "%s: sms is %d; expected the GPU's multiprocessors, 1 or more", op,
                     (int)sms);
  ur_status st = check_backward(op, rows, in, out, gx, gb, x_mask, 0, act, flags);
  if (st) return st;
  *main_bytes = *side_bytes = 0;
  if (!rows) return UR_STATUS_OK; /* ur_linear_backward does nothing */
  if (out == 1 && in > 0) {
    *main_bytes = UR_LT_WORKSPACE + ur__gemv_part(rows, in, sms);
    return UR_STATUS_OK;
  }
  int relu = act == UR_ACT_RELU && !(flags & UR_DENSE_GY_MASKED) && out > 0;
  int on_main = 0;
  size_t part = 0;
  if (relu) { /* the ReLU's gradient, with the bias gradient's partials */
    on_main = 1;
    if (gb) part = ur__bgrad_part(rows, out, sms);
  }
  if (gx && in > 0 && out > 0) { /* the input gradient's product, then gb_x's sum: x_mask's
                                   in the epilogue, X_RELU's by chunks of rows in the mask pass */
    on_main = 1;
    size_t gbx = (flags & UR_DENSE_X_RELU) ? ur__bgrad_part(rows, in, sms)
                 : x_mask                  ? (size_t)in * sizeof(float)
                                           : 0;
    if (gbx > part) part = gbx;
  }
  /* the weight gradient's product with an unmasked layer's bias gradient in its epilogue, or
   * that bias gradient alone by chunks of rows */
  int wgrad = gw && in > 0 && out > 0, gb_left = gb && !relu && out > 0;
  if (wgrad || gb_left) {
    size_t wpart = !gb_left ? 0 : wgrad ? (size_t)out * sizeof(float)
                                         : ur__bgrad_part(rows, out, sms);
    if (flags & UR_DENSE_WGRAD_ASYNC) {
      *side_bytes = UR_LT_WORKSPACE + wpart;
    } else {
      on_main = 1;
      if (wpart > part) part = wpart;
    }
  }
  if (on_main) *main_bytes = UR_LT_WORKSPACE + part;
  return UR_STATUS_OK;
}

ur_status ur_dense_join(ur_stream *s) {
  const ur_backend *be = ur__gpu();
  if (!be || !be->dense || !be->dense->join) return UR_STATUS_OK;
  return be->dense->join(ur__dense_stream(s));
}

static ur_status check_act(const char *op, ur_act act) {
  if (act == UR_ACT_RELU || act == UR_ACT_SIGMOID) return UR_STATUS_OK;
  return ur__error(UR_STATUS_INVALID, "%s: activation %d is not relu (1) or sigmoid (2)", op,
                   (int)act);
}

ur_status ur_act_forward(ur_stream *s, const ur_tensor *x, ur_tensor *y, ur_act act) {
  UR__ARGS(x, y);
  const char *op = "activation forward";
  ur_status st = ur__dense_check_numel(op, "x", x, 1, x ? x->numel : 0);
  if (!st) st = ur__dense_check_numel(op, "y", y, 1, x->numel);
  if (!st) st = same_dtype(op, "y", y, x, "x and y");
  if (!st) st = check_act(op, act);
  if (st) return st;
  const ur_tensor *ts[] = {x, y};
  const char *names[] = {"x", "y"};
  const ur_backend *be;
  if ((st = ur__dense_backend(op, 2, ts, names, &be)) || (st = UR__NEED(be, dense, act_forward)) ||
      !x->numel)
    return st;
  return be->dense->act_forward(ur__dense_stream(s), ur_tensor_data(x), ur_tensor_data(y), x->numel,
                                x->dtype, act);
}

ur_status ur_act_backward(ur_stream *s, const ur_tensor *y, const ur_tensor *gy, ur_tensor *gx,
                          ur_act act) {
  UR__ARGS(y, gy, gx);
  const char *op = "activation backward";
  ur_status st = ur__dense_check_numel(op, "y", y, 1, y ? y->numel : 0);
  if (!st) st = ur__dense_check_numel(op, "gy", gy, 1, y->numel);
  if (!st) st = ur__dense_check_numel(op, "gx", gx, 1, y->numel);
  if (!st) st = same_dtype(op, "gy", gy, y, "y, gy and gx");
  if (!st) st = same_dtype(op, "gx", gx, y, "y, gy and gx");
  if (!st) st = check_act(op, act);
  if (st) return st;
  const ur_tensor *ts[] = {y, gy, gx};
  const char *names[] = {"y", "gy", "gx"};
  const ur_backend *be;
  if ((st = ur__dense_backend(op, 3, ts, names, &be)) || (st = UR__NEED(be, dense, act_backward)) ||
      !y->numel)
    return st;
  return be->dense->act_backward(ur__dense_stream(s), ur_tensor_data(y), ur_tensor_data(gy),
                                 ur_tensor_data(gx), y->numel, y->dtype, act);
}
