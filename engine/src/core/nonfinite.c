/* nonfinite.c: NaN and infinities: the training guard's check and step end (public entry
 * points, and the CPU backend's reference, kernels/tensor.cu the GPU's) and the first
 * non-finite element of a tensor, which a checkpoint's load looks for. */
#include <string.h>
#include "core/core.h"
#include "core/nonfinite.h"

static int float_dtype(ur_dtype d) {
  return d == UR_DTYPE_F32 || d == UR_DTYPE_BF16 || d == UR_DTYPE_F16 || d == UR_DTYPE_F64;
}

/* The first non-finite element of [i0, i1) of x, or i1. */
static int64_t first_bad(const void *x, ur_dtype d, int64_t i0, int64_t i1) {
  int64_t i = i0;
  switch (d) {
  case UR_DTYPE_F32: {
    const uint32_t *p = x;
    while (i < i1 && !ur__nonfinite_f32(p[i])) i++;
    break;
  }
  case UR_DTYPE_BF16: {
    const uint16_t *p = x;
    while (i < i1 && !ur__nonfinite_bf16(p[i])) i++;
    break;
  }
  case UR_DTYPE_F16: {
    const uint16_t *p = x;
    while (i < i1 && !ur__nonfinite_f16(p[i])) i++;
    break;
  }
  default: {
    const uint64_t *p = x;
    while (i < i1 && !ur__nonfinite_f64(p[i])) i++;
    break;
  }
  }
  return i;
}

typedef struct scan_job {
  const void *x;
  ur_dtype dtype;
  int64_t chunk;
  int64_t n;
  int64_t *firsts; /* per chunk: its first bad element, or n */
} scan_job;

static void scan_range(void *ctx, size_t c0, size_t c1) {
  scan_job *j = ctx;
  for (size_t c = c0; c < c1; c++) {
    int64_t i0 = (int64_t)c * j->chunk, i1 = i0 + j->chunk < j->n ? i0 + j->chunk : j->n;
    j->firsts[c] = first_bad(j->x, j->dtype, i0, i1);
  }
}

/* The first bad element of n, in chunks over the threads; n when none. */
int64_t ur__nonfinite_first(const void *x, ur_dtype d, int64_t n) {
  enum { CHUNKS = 64 };
  int64_t firsts[CHUNKS];
  int64_t chunk = n / CHUNKS + 1;
  if (chunk < (1 << 16)) return first_bad(x, d, 0, n);
  scan_job j = {x, d, chunk, n, firsts};
  size_t nc = (size_t)((n + chunk - 1) / chunk);
  ur__parallel_for(nc, 1, scan_range, &j);
  for (size_t c = 0; c < nc; c++) {
    int64_t end = (int64_t)(c + 1) * chunk < n ? (int64_t)(c + 1) * chunk : n;
    if (firsts[c] < end) return firsts[c];
  }
  return n;
}

ur_status ur__cpu_nonfinite_check(void *stream, int32_t n, const void *const *xs,
                                  const ur_dtype *dtypes, const int64_t *counts, int32_t *flags,
                                  int32_t slot0) {
  (void)stream;
  for (int32_t i = 0; i < n; i++) {
    if (ur__nonfinite_first(xs[i], dtypes[i], counts[i]) == counts[i]) continue;
    flags[0] = 1;
    if (flags[UR_NONFINITE_HEAD + slot0 + i] == 0) flags[UR_NONFINITE_HEAD + slot0 + i] = flags[1] + 1;
  }
  return UR_STATUS_OK;
}

ur_status ur__cpu_nonfinite_end(void *stream, int32_t *flags, int32_t sticky) {
  (void)stream;
  flags[1] += 1;
  flags[2] += flags[0] != 0;
  if (!sticky) flags[0] = 0;
  return UR_STATUS_OK;
}

static ur_status check_flags(const char *op, const ur_tensor *flags, int64_t slots) {
  if (flags->dtype != UR_DTYPE_I32 || flags->numel < UR_NONFINITE_HEAD + slots)
    return ur__error(UR_STATUS_INVALID,
                     "%s: flags are %s of %lld elements; expected i32 of at least %lld (%d + the "
                     "slots)",
                     op, ur_dtype_name(flags->dtype), (long long)flags->numel,
                     (long long)(UR_NONFINITE_HEAD + slots), UR_NONFINITE_HEAD);
  return UR_STATUS_OK;
}

ur_status ur_nonfinite_check(ur_stream *s, int32_t n, const ur_tensor *const *xs,
                             ur_tensor *flags, int32_t first_slot) {
  UR__ARGS(flags);
  if (n > 0 && !xs) return ur__null(__func__, "xs");
  const char *op = "nonfinite check";
  if (n < 0 || first_slot < 0)
    return ur__error(UR_STATUS_INVALID, "%s: %d tensors from slot %d; expected both >= 0", op,
                     (int)n, (int)first_slot);
  ur_status st = check_flags(op, flags, (int64_t)first_slot + n);
  if (st) return st;
  const ur_backend *b = ur__tensor_backend(flags);
  const void *ptrs[UR__NONFINITE_GROUP];
  ur_dtype dts[UR__NONFINITE_GROUP];
  int64_t counts[UR__NONFINITE_GROUP];
  for (int32_t g0 = 0; g0 < n; g0 += UR__NONFINITE_GROUP) {
    int32_t m = n - g0 < UR__NONFINITE_GROUP ? n - g0 : UR__NONFINITE_GROUP;
    for (int32_t i = 0; i < m; i++) {
      const ur_tensor *x = xs[g0 + i];
      if (!x)
        return ur__error(UR_STATUS_INVALID, "%s: tensor %d (slot %d) is NULL", op, (int)(g0 + i),
                         (int)(first_slot + g0 + i));
      if (!float_dtype(x->dtype))
        return ur__error(UR_STATUS_INVALID, "%s: tensor %d (slot %d) is %s; expected f32, bf16, "
                         "f16 or f64", op, (int)(g0 + i), (int)(first_slot + g0 + i),
                         ur_dtype_name(x->dtype));
      if (ur__tensor_backend(x) != b)
        return ur__error(UR_STATUS_INVALID, "%s: tensor %d (slot %d) is in %s memory, the flags "
                         "in %s memory: both must be where one backend (%s) reads them",
                         op, (int)(g0 + i), (int)(first_slot + g0 + i), ur_place_name(x->st->place),
                         ur_place_name(flags->st->place), b->name);
      if ((st = ur__tensor_ready(b, x))) return st;
      ptrs[i] = ur_tensor_data(x);
      dts[i] = x->dtype;
      counts[i] = x->numel;
    }
    if ((st = ur__tensor_ready(b, flags))) return st;
    if (!b->nonfinite_check) return ur__missing(b, "tensor", "nonfinite_check");
    if ((st = b->nonfinite_check(s ? s->handle : NULL, m, ptrs, dts, counts,
                                 ur_tensor_data(flags), first_slot + g0)))
      return st;
  }
  return UR_STATUS_OK;
}

ur_status ur_nonfinite_end_step(ur_stream *s, ur_tensor *flags, int32_t sticky) {
  UR__ARGS(flags);
  ur_status st = check_flags("nonfinite end_step", flags, 0);
  if (st) return st;
  const ur_backend *b = ur__tensor_backend(flags);
  if ((st = ur__tensor_ready(b, flags))) return st;
  if (!b->nonfinite_end) return ur__missing(b, "tensor", "nonfinite_end");
  return b->nonfinite_end(s ? s->handle : NULL, ur_tensor_data(flags), sticky != 0);
}

ur_status ur_tensor_find_nonfinite(const ur_tensor *x, int64_t *out) {
  UR__ARGS(x, out);
  *out = -1;
  if (!float_dtype(x->dtype))
    return ur__error(UR_STATUS_INVALID, "tensor find_nonfinite: the tensor is %s; expected f32, "
                     "bf16, f16 or f64", ur_dtype_name(x->dtype));
  if (x->st->place == UR_PLACE_DEVICE && ur__gpu())
    return ur__error(UR_STATUS_INVALID, "tensor find_nonfinite: the tensor is in device memory; "
                     "expected memory the CPU reads (host, pinned, managed)");
  ur_status st = ur__tensor_ready(ur__cpu(), x);
  if (st) return st;
  int64_t i = ur__nonfinite_first(ur_tensor_data(x), x->dtype, x->numel);
  if (i < x->numel) *out = i;
  return UR_STATUS_OK;
}
