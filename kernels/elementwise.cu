/* elementwise.cu: the dense family's elementwise kernels: activations (ReLU, sigmoid) and their
 * gradients from the output, the DCNv2 cross layer's x0 * z + xl and its gradients, and the
 * f32 <-> bf16 cast.  Grid-stride loops over 64-bit indices; math in f32 as on the CPU. */
#include "dense.cuh"

static cudaError_t ur_sms(int *sms) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  return e == cudaSuccess ? cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, dev) : e;
}

#define UR_GRID_STRIDE(i, n)                                                              \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x,                        \
               ur_stride_ = (int64_t)gridDim.x * blockDim.x;                              \
       i < (n); i += ur_stride_)

__device__ __forceinline__ float ur_sigmoid(float v) {
  if (v >= 0.0f) return 1.0f / (1.0f + expf(-v));
  float e = expf(v);
  return e / (1.0f + e);
}

template <typename T>
__global__ void ur_act_fwd_kernel(const T *x, T *y, int64_t n, int act) {
  UR_GRID_STRIDE(i, n) {
    float v = ur_ld(x, i);
    ur_st(y, i, act == UR_ACT_RELU ? (v > 0.0f ? v : 0.0f) : ur_sigmoid(v));
  }
}

template <typename T>
__global__ void ur_act_bwd_kernel(const T *y, const T *gy, T *gx, int64_t n, int act) {
  UR_GRID_STRIDE(i, n) {
    float v = ur_ld(y, i), g = ur_ld(gy, i);
    ur_st(gx, i, act == UR_ACT_RELU ? (v > 0.0f ? g : 0.0f) : g * v * (1.0f - v));
  }
}

cudaError_t ur__cuda_act_forward(cudaStream_t stream, const void *x, void *y, int64_t n,
                                 ur_dtype dtype, int act) {
  int sms = 0;
  cudaError_t e = ur_sms(&sms);
  if (e != cudaSuccess) return e;
  UR_DENSE_DISPATCH(dtype, T,
    ur_act_fwd_kernel<T><<<ur_dense_blocks(n, 256, sms), 256, 0, stream>>>((const T *)x, (T *)y,
                                                                           n, act));
  return cudaGetLastError();
}

cudaError_t ur__cuda_act_backward(cudaStream_t stream, const void *y, const void *gy, void *gx,
                                  int64_t n, ur_dtype dtype, int act) {
  int sms = 0;
  cudaError_t e = ur_sms(&sms);
  if (e != cudaSuccess) return e;
  UR_DENSE_DISPATCH(dtype, T,
    ur_act_bwd_kernel<T><<<ur_dense_blocks(n, 256, sms), 256, 0, stream>>>(
        (const T *)y, (const T *)gy, (T *)gx, n, act));
  return cudaGetLastError();
}

template <typename T>
__global__ void ur_cross_fwd_kernel(const T *x0, const T *z, const T *xl, T *y, int64_t n) {
  UR_GRID_STRIDE(i, n) ur_st(y, i, ur_ld(x0, i) * ur_ld(z, i) + ur_ld(xl, i));
}

/* Each element is read before any of this thread's writes, so gz may alias gy. */
template <typename T>
__global__ void ur_cross_bwd_kernel(const T *x0, const T *z, const T *gy, T *gz, T *gx0, T *gxl,
                                    int64_t n, int accumulate) {
  UR_GRID_STRIDE(i, n) {
    float g = ur_ld(gy, i);
    float g0 = g * ur_ld(z, i);
    if (!gxl) g0 += g;
    if (accumulate) g0 += ur_ld(gx0, i);
    ur_st(gz, i, g * ur_ld(x0, i));
    ur_st(gx0, i, g0);
    if (gxl) ur_st(gxl, i, g);
  }
}

cudaError_t ur__cuda_cross_forward(cudaStream_t stream, const void *x0, const void *z,
                                   const void *xl, void *y, int64_t n, ur_dtype dtype) {
  int sms = 0;
  cudaError_t e = ur_sms(&sms);
  if (e != cudaSuccess) return e;
  UR_DENSE_DISPATCH(dtype, T,
    ur_cross_fwd_kernel<T><<<ur_dense_blocks(n, 256, sms), 256, 0, stream>>>(
        (const T *)x0, (const T *)z, (const T *)xl, (T *)y, n));
  return cudaGetLastError();
}

cudaError_t ur__cuda_cross_backward(cudaStream_t stream, const void *x0, const void *z,
                                    const void *gy, void *gz, void *gx0, void *gxl, int64_t n,
                                    ur_dtype dtype, int accumulate) {
  int sms = 0;
  cudaError_t e = ur_sms(&sms);
  if (e != cudaSuccess) return e;
  UR_DENSE_DISPATCH(dtype, T,
    ur_cross_bwd_kernel<T><<<ur_dense_blocks(n, 256, sms), 256, 0, stream>>>(
        (const T *)x0, (const T *)z, (const T *)gy, (T *)gz, (T *)gx0, (T *)gxl, n, accumulate));
  return cudaGetLastError();
}

template <typename S, typename D>
__global__ void ur_cast_kernel(const S *src, D *dst, int64_t n) {
  UR_GRID_STRIDE(i, n) ur_st(dst, i, ur_ld(src, i));
}

cudaError_t ur__cuda_cast(cudaStream_t stream, const void *src, ur_dtype sd, void *dst,
                          ur_dtype dd, int64_t n) {
  int sms = 0;
  cudaError_t e = ur_sms(&sms);
  if (e != cudaSuccess) return e;
  unsigned blocks = ur_dense_blocks(n, 256, sms);
  UR_DENSE_DISPATCH(sd, S,
    UR_DENSE_DISPATCH(dd, D,
      ur_cast_kernel<S, D><<<blocks, 256, 0, stream>>>((const S *)src, (D *)dst, n)));
  return cudaGetLastError();
}
