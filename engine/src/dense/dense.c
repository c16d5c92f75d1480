/* dense.c: what the dense ops share: choosing the backend for a set of tensors, dtype and
 * shape checks; and the two small ops that belong to no layer, the cast and the mean. */
#include <stdio.h>
#include <string.h>
#include "dense/dense.h"

size_t ur_sizeof_arena_stats(void) { return sizeof(ur_arena_stats); }

void *ur__dense_stream(const ur_stream *s) { return s ? s->handle : NULL; }

ur_status ur__dense_backend(const char *op, int n, const ur_tensor *const *ts,
                            const char *const *names, const ur_backend **out) {
  const ur_backend *cpu = ur__cpu(), *gpu = ur__gpu(), *b = NULL;
  int dev = -1, host = -1, shared = -1;
  for (int i = 0; i < n; i++) {
    if (!ts[i]) continue;
    const ur_backend *bi = ur__tensor_backend(ts[i]);
    ur_place p = ts[i]->st->place;
    /* Tensors that disagree meet on the CPU, which reaches managed memory but not device. */
    b = !b || bi == b ? bi : cpu;
    if (bi == cpu) {
      if (host < 0) host = i;
    } else if (p == UR_PLACE_DEVICE && dev < 0) {
      dev = i;
    }
    if (p != UR_PLACE_HOST && shared < 0) shared = i;
  }
  if (dev >= 0 && host >= 0)
    return ur__error(UR_STATUS_INVALID,
                     "%s: %s is device memory but %s is %s memory; an op's tensors must all be on "
                     "the GPU (device or managed) or all in host memory",
                     op, names[dev], names[host], ur_place_name(ts[host]->st->place));
  /* No tensor at all (the checks before rule it out) goes where a GPU op would. */
  if (!b) b = gpu ? gpu : cpu;
  *out = b;
  /* The CPU may be about to read memory the GPU is still writing: one wait covers them all. */
  return shared >= 0 ? ur__tensor_ready(b, ts[shared]) : UR_STATUS_OK;
}

static void shape_str(const ur_tensor *t, char *buf, size_t len) {
  size_t k = (size_t)snprintf(buf, len, "[");
  for (int i = 0; i < t->ndim && k < len; i++)
    k += (size_t)snprintf(buf + k, len - k, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
  if (k < len) snprintf(buf + k, len - k, "]");
}

static int dtype_ok(const ur_tensor *t, int allow_bf16) {
  return t->dtype == UR_DTYPE_F32 || (allow_bf16 && t->dtype == UR_DTYPE_BF16);
}

ur_status ur__dense_check(const char *op, const char *name, const ur_tensor *t, int allow_bf16,
                          int64_t rows, int64_t cols) {
  char got[128], want[64];
  if (!t) return ur__error(UR_STATUS_INVALID, "%s: %s is missing (NULL)", op, name);
  if (dtype_ok(t, allow_bf16) && t->ndim == 2 && (rows < 0 || t->shape[0] == rows) &&
      (cols < 0 || t->shape[1] == cols))
    return UR_STATUS_OK;
  shape_str(t, got, sizeof got);
  char r[24] = "rows", c[24] = "cols";
  if (rows >= 0) snprintf(r, sizeof r, "%lld", (long long)rows);
  if (cols >= 0) snprintf(c, sizeof c, "%lld", (long long)cols);
  snprintf(want, sizeof want, "[%s, %s]", r, c);
  return ur__error(UR_STATUS_INVALID, "%s: %s is %s %s; expected %s %s", op, name,
                   ur_dtype_name(t->dtype), got, allow_bf16 ? "f32 or bf16" : "f32", want);
}

ur_status ur__dense_check_numel(const char *op, const char *name, const ur_tensor *t,
                                int allow_bf16, int64_t numel) {
  char got[128];
  if (!t) return ur__error(UR_STATUS_INVALID, "%s: %s is missing (NULL)", op, name);
  if (dtype_ok(t, allow_bf16) && t->numel == numel) return UR_STATUS_OK;
  shape_str(t, got, sizeof got);
  return ur__error(UR_STATUS_INVALID, "%s: %s is %s %s; expected %s of %lld elements", op, name,
                   ur_dtype_name(t->dtype), got, allow_bf16 ? "f32 or bf16" : "f32",
                   (long long)numel);
}

/* ---- cast ---- */

typedef struct cast_job {
  const void *src;
  void *dst;
  ur_dtype sd, dd;
} cast_job;

static void cast_range(void *ctx, size_t i0, size_t i1) {
  cast_job *j = ctx;
  for (size_t i = i0; i < i1; i++) ur__dense_st(j->dst, j->dd, i, ur__dense_ld(j->src, j->sd, i));
}

ur_status ur__cpu_cast(void *stream, const void *src, ur_dtype src_dtype, void *dst,
                       ur_dtype dst_dtype, int64_t n) {
  (void)stream;
  if (src_dtype == dst_dtype) {
    memmove(dst, src, (size_t)n * ur_dtype_size(src_dtype));
    return UR_STATUS_OK;
  }
  cast_job j = {src, dst, src_dtype, dst_dtype};
  ur__parallel_for((size_t)n, (size_t)1 << 16, cast_range, &j);
  return UR_STATUS_OK;
}

ur_status ur_dense_cast(ur_stream *s, const ur_tensor *src, ur_tensor *dst) {
  UR__ARGS(src, dst);
  const char *op = "dense cast";
  ur_status st = ur__dense_check_numel(op, "src", src, 1, src ? src->numel : 0);
  if (!st) st = ur__dense_check_numel(op, "dst", dst, 1, src->numel);
  if (st) return st;
  const ur_tensor *ts[] = {src, dst};
  const char *names[] = {"src", "dst"};
  const ur_backend *b;
  if ((st = ur__dense_backend(op, 2, ts, names, &b)) || (st = UR__NEED(b, dense, cast)))
    return st;
  if (!src->numel) return UR_STATUS_OK;
  return b->dense->cast(ur__dense_stream(s), ur_tensor_data(src), src->dtype, ur_tensor_data(dst),
                        dst->dtype, src->numel);
}

/* ---- mean ---- */

ur_status ur__cpu_mean(void *stream, const void *x, float *out, int64_t n, ur_dtype dtype) {
  (void)stream;
  double sum = 0;
  for (int64_t i = 0; i < n; i++) sum += ur__dense_ld(x, dtype, (size_t)i);
  *out = (float)(sum / (double)n);
  return UR_STATUS_OK;
}

ur_status ur_dense_mean(ur_stream *s, const ur_tensor *x, ur_tensor *out) {
  UR__ARGS(x, out);
  const char *op = "dense mean";
  ur_status st = ur__dense_check_numel(op, "x", x, 1, x ? x->numel : 0);
  if (!st) st = ur__dense_check_numel(op, "out", out, 0, 1);
  if (st) return st;
  if (!x->numel) return ur__error(UR_STATUS_INVALID, "%s: x has no elements", op);
  const ur_tensor *ts[] = {x, out};
  const char *names[] = {"x", "out"};
  const ur_backend *b;
  if ((st = ur__dense_backend(op, 2, ts, names, &b)) || (st = UR__NEED(b, dense, mean)))
    return st;
  return b->dense->mean(ur__dense_stream(s), ur_tensor_data(x), ur_tensor_data(out), x->numel,
                        x->dtype);
}

const ur_dense_ops ur__cpu_dense_ops = {
    .linear_forward = ur__cpu_linear_forward,
    .linear_backward = ur__cpu_linear_backward,
    .join = ur__cpu_dense_join,
    .act_forward = ur__cpu_act_forward,
    .act_backward = ur__cpu_act_backward,
    .interaction_forward = ur__cpu_interaction_forward,
    .interaction_backward = ur__cpu_interaction_backward,
    .cross_forward = ur__cpu_cross_forward,
    .cross_backward = ur__cpu_cross_backward,
    .copy_2d = ur__cpu_copy_2d,
    .bce_forward = ur__cpu_bce_forward,
    .bce_backward = ur__cpu_bce_backward,
    .mean = ur__cpu_mean,
    .cast = ur__cpu_cast,
    .optim_step = ur__cpu_optim_step,
    .optim_sumsq = ur__cpu_optim_sumsq,
    .optim_clip_factor = ur__cpu_optim_clip_factor,
};
