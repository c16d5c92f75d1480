/* dense_util.cuh: what the dense kernels share: f32/bf16 element access as float, grid
 * sizes, and the dispatch from a runtime dtype to a template. */
#ifndef UR_KERNELS_DENSE_UTIL_CUH
#define UR_KERNELS_DENSE_UTIL_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "uvmrec.h"

typedef __nv_bfloat16 ur_bf16;

__device__ __forceinline__ float ur_ld(const float *p, int64_t i) { return p[i]; }
__device__ __forceinline__ float ur_ld(const ur_bf16 *p, int64_t i) {
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ void ur_st(float *p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void ur_st(ur_bf16 *p, int64_t i, float v) {
  p[i] = __float2bfloat16_rn(v);
}

/* Blocks of `threads` for `work` items, at most 8 per multiprocessor (grid-stride loops do
 * the rest), at least one. */
static inline unsigned ur_dense_blocks(int64_t work, int threads, int sms) {
  int64_t want = (work + threads - 1) / threads;
  int64_t cap = (int64_t)(sms > 0 ? sms : 1) * 8;
  if (want > cap) want = cap;
  return (unsigned)(want < 1 ? 1 : want);
}

/* Calls BODY with T bound to the element type of dtype d (f32 or bf16). */
#define UR_DENSE_DISPATCH(d, T, ...)   \
  do {                                 \
    if ((d) == UR_DTYPE_F32) {         \
      typedef float T;                 \
      __VA_ARGS__;                     \
    } else {                           \
      typedef ur_bf16 T;               \
      __VA_ARGS__;                     \
    }                                  \
  } while (0)

#endif
