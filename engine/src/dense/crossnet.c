/* crossnet.c: the elementwise part of a DCNv2 cross layer, x_{l+1} = x0 * (W x_l + b) + x_l:
 * public entry points and the CPU backend's versions.  The product W x_l + b (or the
 * low-rank U (V x_l) + b) is ur_linear_forward's; the Lua CrossNet composes the two. */
#include "dense/dense.h"

typedef struct cross_job {
  const void *x0, *z, *xl, *gy;
  void *y, *gz, *gx0, *gxl;
  ur_dtype d;
  int acc;
} cross_job;

static void cross_fwd_range(void *ctx, size_t i0, size_t i1) {
  cross_job *j = ctx;
  for (size_t i = i0; i < i1; i++)
    ur__dense_st(j->y, j->d, i,
                 ur__dense_ld(j->x0, j->d, i) * ur__dense_ld(j->z, j->d, i) +
                     ur__dense_ld(j->xl, j->d, i));
}

static void cross_bwd_range(void *ctx, size_t i0, size_t i1) {
  cross_job *j = ctx;
  for (size_t i = i0; i < i1; i++) {
    float gy = ur__dense_ld(j->gy, j->d, i);
    float g0 = gy * ur__dense_ld(j->z, j->d, i);
    if (!j->gxl) g0 += gy;
    if (j->acc) g0 += ur__dense_ld(j->gx0, j->d, i);
    ur__dense_st(j->gz, j->d, i, gy * ur__dense_ld(j->x0, j->d, i));
    ur__dense_st(j->gx0, j->d, i, g0);
    if (j->gxl) ur__dense_st(j->gxl, j->d, i, gy);
  }
}

ur_status ur__cpu_cross_forward(void *stream, const void *x0, const void *z, const void *xl,
                                void *y, int64_t n, ur_dtype dtype) {
  (void)stream;
  cross_job j = {x0, z, xl, NULL, y, NULL, NULL, NULL, dtype, 0};
  ur__parallel_for((size_t)n, (size_t)1 << 16, cross_fwd_range, &j);
  return UR_STATUS_OK;
}

ur_status ur__cpu_cross_backward(void *stream, const void *x0, const void *z, const void *gy,
                                 void *gz, void *gx0, void *gxl, int64_t n, ur_dtype dtype,
                                 uint32_t flags) {
  (void)stream;
  cross_job j = {x0, z, NULL, gy, NULL, gz, gx0, gxl, dtype, (flags & UR_DENSE_ACCUMULATE) != 0};
  ur__parallel_for((size_t)n, (size_t)1 << 16, cross_bwd_range, &j);
  return UR_STATUS_OK;
}

/* Every tensor named is x0's shape and dtype; *b is the backend that runs them. */
static ur_status check_like(const char *op, int n, const ur_tensor *const *ts,
                            const char *const *names, const ur_backend **b) {
  ur_status st = ur__dense_check(op, names[0], ts[0], 1, -1, -1);
  for (int i = 1; !st && i < n; i++) {
    if (!ts[i]) continue;
    st = ur__dense_check(op, names[i], ts[i], 1, ts[0]->shape[0], ts[0]->shape[1]);
    if (!st && ts[i]->dtype != ts[0]->dtype)
      st = ur__error(UR_STATUS_INVALID, "%s: %s is %s but %s is %s; all take one dtype", op,
                     names[i], ur_dtype_name(ts[i]->dtype), names[0],
                     ur_dtype_name(ts[0]->dtype));
  }
  return st ? st : ur__dense_backend(op, n, ts, names, b);
}

ur_status ur_cross_forward(ur_stream *s, const ur_tensor *x0, const ur_tensor *z,
                           const ur_tensor *xl, ur_tensor *y) {
  UR__ARGS(x0, z, xl, y);
  const char *op = "cross forward";
  const ur_tensor *ts[] = {x0, z, xl, y};
  const char *names[] = {"x0", "z", "xl", "y"};
  const ur_backend *b;
  ur_status st = check_like(op, 4, ts, names, &b);
  if (st || (st = UR__NEED(b, dense, cross_forward)) || !x0->numel) return st;
  return b->dense->cross_forward(ur__dense_stream(s), ur_tensor_data(x0), ur_tensor_data(z),
                                 ur_tensor_data(xl), ur_tensor_data(y), x0->numel, x0->dtype);
}

ur_status ur_cross_backward(ur_stream *s, const ur_tensor *x0, const ur_tensor *z,
                            const ur_tensor *gy, ur_tensor *gz, ur_tensor *gx0, ur_tensor *gxl,
                            uint32_t flags) {
  UR__ARGS(x0, z, gy, gz, gx0);
  const char *op = "cross backward";
  const ur_tensor *ts[] = {x0, z, gy, gz, gx0, gxl};
  const char *names[] = {"x0", "z", "gy", "gz", "gx0", "gxl"};
  if (flags & ~(uint32_t)UR_DENSE_ACCUMULATE)
    return ur__error(UR_STATUS_INVALID, "%s: flags 0x%x include bits other than ACCUMULATE (0x%x)",
                     op, (unsigned)flags, (unsigned)UR_DENSE_ACCUMULATE);
  const ur_backend *b;
  ur_status st = check_like(op, 6, ts, names, &b);
  if (st || (st = UR__NEED(b, dense, cross_backward)) || !x0->numel) return st;
  return b->dense->cross_backward(ur__dense_stream(s), ur_tensor_data(x0), ur_tensor_data(z),
                                  ur_tensor_data(gy), ur_tensor_data(gz), ur_tensor_data(gx0),
                                  gxl ? ur_tensor_data(gxl) : NULL, x0->numel, x0->dtype, flags);
}
