/* loss.cu: binary cross-entropy on logits and the mean.  Per-sample terms in double, as on the
 * CPU; the sums run in one block in a fixed order (strided per thread, then a fixed tree), so
 * the result is the same on every run. */
#include "dense.cuh"

#define UR_SUM_THREADS 1024

__device__ __forceinline__ double ur_bce_term(double x, double y) {
  return (x > 0.0 ? x : 0.0) - x * y + log1p(exp(-fabs(x)));
}

__device__ __forceinline__ double ur_dsigmoid(double x) {
  if (x >= 0.0) return 1.0 / (1.0 + exp(-x));
  double e = exp(x);
  return e / (1.0 + e);
}

/* The block's total of v, valid in thread 0. */
__device__ double ur_block_sum(double v) {
  __shared__ double warp_sums[UR_SUM_THREADS / 32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  v = 0.0;
  if (warp == 0) {
    int nw = blockDim.x >> 5;
    v = lane < nw ? warp_sums[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  }
  return v;
}

template <typename T>
__global__ void ur_bce_sum_kernel(const T *x, const float *t, const float *w, float *loss,
                                  int64_t n, double scale) {
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    double l = ur_bce_term(ur_ld(x, i), t[i]);
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
    double l = ur_bce_term(ur_ld(x, i), t[i]);
    loss[i] = (float)(w ? l * w[i] : l);
  }
}

template <typename T>
__global__ void ur_bce_grad_kernel(const T *x, const float *t, const float *w, T *g, int64_t n,
                                   double k) {
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    double v = k * (ur_dsigmoid(ur_ld(x, i)) - t[i]);
    if (w) v *= w[i];
    ur_st(g, i, (float)v);
  }
}

static cudaError_t ur_loss_sms(int *sms) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  return e == cudaSuccess ? cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, dev) : e;
}

cudaError_t ur__cuda_bce_forward(cudaStream_t stream, const void *logits, const float *targets,
                                 const float *weights, float *loss, int64_t n, ur_dtype dtype,
                                 int reduction) {
  if (reduction == UR_REDUCTION_NONE) {
    int sms = 0;
    cudaError_t e = ur_loss_sms(&sms);
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

cudaError_t ur__cuda_bce_backward(cudaStream_t stream, const void *logits, const float *targets,
                                  const float *weights, void *glogits, int64_t n, ur_dtype dtype,
                                  double k) {
  int sms = 0;
  cudaError_t e = ur_loss_sms(&sms);
  if (e != cudaSuccess) return e;
  UR_DENSE_DISPATCH(dtype, T,
    ur_bce_grad_kernel<T><<<ur_dense_blocks(n, 256, sms), 256, 0, stream>>>(
        (const T *)logits, targets, weights, (T *)glogits, n, k));
  return cudaGetLastError();
}

template <typename T>
__global__ void ur_mean_kernel(const T *x, float *out, int64_t n) {
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += ur_ld(x, i);
  s = ur_block_sum(s);
  if (threadIdx.x == 0) out[0] = (float)(s / (double)n);
}

cudaError_t ur__cuda_mean(cudaStream_t stream, const void *x, float *out, int64_t n,
                          ur_dtype dtype) {
  UR_DENSE_DISPATCH(dtype, T,
    ur_mean_kernel<T><<<1, UR_SUM_THREADS, 0, stream>>>((const T *)x, out, n));
  return cudaGetLastError();
}
