/* loss.cu: binary cross-entropy on logits (engine/src/dense/loss.c) on the GPU.  Per-sample
 * terms in double, dense/bce.h's as on the CPU.  A reduction sums fixed ranges of samples, a
 * block each, into partials in double (strided per thread, then ur_block_sum's fixed tree), and
 * one block adds the partials the same way, so the result is the same on every run; the
 * partials (8 bytes a block, at most UR_BCE_BLOCKS_PER_SM blocks a multiprocessor) borrow the
 * start of the stream's dense workspace, idle between products on the stream, or a workspace of
 * their size where the stream has none. */
#include "common.cuh"
#include "dense.cuh"
#include "dense/bce.h"

#define UR_BCE_PER_BLOCK 2048 /* samples a block sums, at least */
#define UR_BCE_THREADS 256

template <typename T>
__global__ void __launch_bounds__(UR_BCE_THREADS)
ur_bce_part_kernel(const T *x, const float *t, const float *w, double *part, int64_t n,
                   int64_t per) {
  int64_t i0 = (int64_t)blockIdx.x * per, i1 = i0 + per < n ? i0 + per : n;
  double s = 0.0;
  for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
    double l = ur__bce_term(ur_ld(x, i), t[i]);
    s += w ? l * w[i] : l;
  }
  s = ur_block_sum(s);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

__global__ void __launch_bounds__(UR_SUM_THREADS)
ur_bce_total_kernel(const double *part, int64_t blocks, float *loss, double scale) {
  double s = 0.0;
  for (int64_t k = threadIdx.x; k < blocks; k += blockDim.x) s += part[k];
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

#define UR_BCE_BLOCKS_PER_SM 2

/* Blocks of a reduction's sum over n samples on sms multiprocessors (the partials it needs). */
static int64_t ur_bce_blocks(int64_t n, int sms) {
  int64_t want = (n + UR_BCE_PER_BLOCK - 1) / UR_BCE_PER_BLOCK;
  int64_t cap = (int64_t)(sms > 0 ? sms : 1) * UR_BCE_BLOCKS_PER_SM;
  return want < 1 ? 1 : want < cap ? want : cap;
}

static cudaError_t ur_bce_fwd_launch(cudaStream_t stream, const void *logits,
                                     const float *targets, const float *weights, float *loss,
                                     double *part, int64_t n, ur_dtype dtype, int reduction,
                                     int sms) {
  if (reduction == UR_REDUCTION_NONE) {
    if (n == 0) return cudaSuccess;
    UR_DENSE_DISPATCH(dtype, T,
      ur_bce_each_kernel<T><<<ur_dense_blocks(n, 256, sms), 256, 0, stream>>>(
          (const T *)logits, targets, weights, loss, n));
  } else {
    double scale = reduction == UR_REDUCTION_MEAN ? 1.0 / (double)n : 1.0;
    int64_t blocks = ur_bce_blocks(n, sms), per = (n + blocks - 1) / blocks;
    UR_DENSE_DISPATCH(dtype, T,
      ur_bce_part_kernel<T><<<(unsigned)blocks, UR_BCE_THREADS, 0, stream>>>(
          (const T *)logits, targets, weights, part, n, per));
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    ur_bce_total_kernel<<<1, UR_SUM_THREADS, 0, stream>>>(part, blocks, loss, scale);
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
  int sms = 0, dev = 0;
  UR_CUDA_CHECK(ur__cuda_sms(&sms), "bce: the GPU's multiprocessors");
  void *ws = NULL;
  if (reduction != UR_REDUCTION_NONE) { /* the partials, in the stream's dense workspace */
    UR_CUDA_CHECK(cudaGetDevice(&dev), "bce: cudaGetDevice");
    size_t bytes = (size_t)ur_bce_blocks(n, sms) * sizeof(double);
    ur_status st = ur__cuda_dense_workspace(dev, (cudaStream_t)stream, bytes, &ws);
    if (st) return st;
  }
  UR_CUDA_CHECK(ur_bce_fwd_launch((cudaStream_t)stream, logits, targets, weights, loss,
                                  (double *)ws, n, dtype, reduction, sms),
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
