/* loss.cu: binary cross-entropy on logits (engine/src/dense/loss.c) on the GPU.  Per-sample
 * terms in double, dense/bce.h's as on the CPU; a reduction runs in one block in a fixed order (strided per
 * thread, then ur_block_sum's fixed tree), so the result is the same on every run. */
#include "common.cuh"
#include "dense.cuh"
#include "dense/bce.h"

template <typename T>
__global__ void ur_bce_sum_kernel(const T *x, const float *t, const float *w, float *loss,
                                  int64_t n, double scale) {
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    double l = ur__bce_term(ur_ld(x, i), t[i]);
    s += w ? l * w[i] : l;
  }
  s = ur_block_sum(s);
  if (threadIdx.x == 0) loss[0] = (float)(s * scale);
}

template <typename T>
__global__ void ur_bce_each_kernel(const T *x, const float *t, const float *w, float *loss,
                                   int64_t n) {
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    double l = ur__bce_term(ur_ld(x, i), t[i]);
    loss[i] = (float)(w ? l * w[i] : l);
  }
}

template <typename T>
__global__ void ur_bce_grad_kernel(const T *x, const float *t, const float *w, T *g, int64_t n,
                                   double k) {
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    double v = k * (ur__bce_sigmoid(ur_ld(x, i)) - t[i]);
    if (w) v *= w[i];
    ur_st(g, i, (float)v);
  }
}

static cudaError_t ur_bce_fwd_launch(cudaStream_t stream, const void *logits,
                                     const float *targets, const float *weights, float *loss,
                                     int64_t n, ur_dtype dtype, int reduction) {
  if (reduction == UR_REDUCTION_NONE) {
    int sms = 0;
    cudaError_t e = ur__cuda_sms(&sms);
    if (e != cudaSuccess) return e;
    if (n == 0) return cudaSuccess;
    UR_DENSE_DISPATCH(dtype, T,
      ur_bce_each_kernel<T><<<ur_dense_blocks(n, 256, sms), 256, 0, stream>>>(
          (const T *)logits, targets, weights, loss, n));
  } else {
    double scale = reduction == UR_REDUCTION_MEAN ? 1.0 / (double)n : 1.0;
    UR_DENSE_DISPATCH(dtype, T,
      ur_bce_sum_kernel<T><<<1, UR_SUM_THREADS, 0, stream>>>((const T *)logits, targets, weights,
                                                             loss, n, scale));
  }
  return cudaGetLastError();
}

static cudaError_t ur_bce_bwd_launch(cudaStream_t stream, const void *logits,
                                     const float *targets, const float *weights, void *glogits,
                                     int64_t n, ur_dtype dtype, double k) {
  int sms = 0;
  cudaError_t e = ur__cuda_sms(&sms);
  if (e != cudaSuccess) return e;
  UR_DENSE_DISPATCH(dtype, T,
    ur_bce_grad_kernel<T><<<ur_dense_blocks(n, 256, sms), 256, 0, stream>>>(
        (const T *)logits, targets, weights, (T *)glogits, n, k));
  return cudaGetLastError();
}

ur_status ur__cuda_bce_forward(void *stream, const void *logits, const float *targets,
                               const float *weights, float *loss, int64_t n, ur_dtype dtype,
                               ur_reduction reduction) {
  UR_CUDA_CHECK(ur_bce_fwd_launch((cudaStream_t)stream, logits, targets, weights, loss, n, dtype,
                                  reduction),
                "bce kernel (%lld samples)", (long long)n);
  return UR_STATUS_OK;
}

ur_status ur__cuda_bce_backward(void *stream, const void *logits, const float *targets,
                                const float *weights, void *glogits, int64_t n, ur_dtype dtype,
                                ur_reduction reduction, double scale) {
  double k = reduction == UR_REDUCTION_MEAN ? scale / (double)n : scale;
  UR_CUDA_CHECK(ur_bce_bwd_launch((cudaStream_t)stream, logits, targets, weights, glogits, n,
                                  dtype, k),
                "bce gradient kernel (%lld samples)", (long long)n);
  return UR_STATUS_OK;
}
