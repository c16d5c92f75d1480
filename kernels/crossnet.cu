/* crossnet.cu: the elementwise part of a DCNv2 cross layer (engine/src/dense/crossnet.c) on
 * the GPU, x0 * z + xl, and its gradients.  Grid-stride loops over 64-bit indices; math in f32
 * as on the CPU. */
#include "common.cuh"
#include "dense.cuh"

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

static cudaError_t ur_cross_fwd_launch(cudaStream_t stream, const void *x0, const void *z,
                                       const void *xl, void *y, int64_t n, ur_dtype dtype) {
  int sms = 0;
  cudaError_t e = ur__cuda_sms(&sms);
  if (e != cudaSuccess) return e;
  UR_DENSE_DISPATCH(dtype, T,
    ur_cross_fwd_kernel<T><<<ur_dense_blocks(n, 256, sms), 256, 0, stream>>>(
        (const T *)x0, (const T *)z, (const T *)xl, (T *)y, n));
  return cudaGetLastError();
}

static cudaError_t ur_cross_bwd_launch(cudaStream_t stream, const void *x0, const void *z,
                                       const void *gy, void *gz, void *gx0, void *gxl, int64_t n,
                                       ur_dtype dtype, int accumulate) {
  int sms = 0;
  cudaError_t e = ur__cuda_sms(&sms);
  if (e != cudaSuccess) return e;
  UR_DENSE_DISPATCH(dtype, T,
    ur_cross_bwd_kernel<T><<<ur_dense_blocks(n, 256, sms), 256, 0, stream>>>(
        (const T *)x0, (const T *)z, (const T *)gy, (T *)gz, (T *)gx0, (T *)gxl, n, accumulate));
  return cudaGetLastError();
}

ur_status ur__cuda_cross_forward(void *stream, const void *x0, const void *z, const void *xl,
                                 void *y, int64_t n, ur_dtype dtype) {
  UR_CUDA_CHECK(ur_cross_fwd_launch((cudaStream_t)stream, x0, z, xl, y, n, dtype),
                "cross kernel (%lld elements)", (long long)n);
  return UR_STATUS_OK;
}

ur_status ur__cuda_cross_backward(void *stream, const void *x0, const void *z, const void *gy,
                                  void *gz, void *gx0, void *gxl, int64_t n, ur_dtype dtype,
                                  uint32_t flags) {
  UR_CUDA_CHECK(ur_cross_bwd_launch((cudaStream_t)stream, x0, z, gy, gz, gx0, gxl, n, dtype,
                                    (flags & UR_DENSE_ACCUMULATE) != 0),
                "cross gradient kernel (%lld elements)", (long long)n);
  return UR_STATUS_OK;
}
