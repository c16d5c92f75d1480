/* dense.cuh: what the dense family's files share (kernels/dense.cu holds it): f32/bf16 element
 * access as float, grid sizes, the dispatch from a runtime dtype to a template, the
 * deterministic block sum, cuBLAS and cuBLASLt opened at run time, the per-device state and
 * per-stream workspaces; and the backend entries each file gives the dense table (assembled in
 * kernels/dense.cu).  The files mirror engine/src/dense/: linear.cu (matrix products,
 * activations), interaction.cu (dot interaction, feature concat/split), crossnet.cu, loss.cu,
 * optim.cu.  Entries take the arguments of ur_dense_ops (engine/src/dense/dense.h), enqueue on
 * `stream` on the current device, and name the failing step in their error; dtypes are
 * UR_DTYPE_F32 or UR_DTYPE_BF16, matrices row-major, counts 64-bit. */
#ifndef UR_KERNELS_DENSE_CUH
#define UR_KERNELS_DENSE_CUH

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "common.cuh"
#include "core/optim_plan.h"
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

/* Element bytes of a dense dtype (this library links nothing of the core's). */
static inline size_t ur_dense_esize(ur_dtype d) { return d == UR_DTYPE_BF16 ? 2 : 4; }

/* Blocks of `threads` for `work` items, at most 8 per multiprocessor. */
static inline unsigned ur_dense_blocks(int64_t work, int threads, int sms) {
  return ur_grid_blocks(work, threads, 8, sms);
}

/* A grid-stride loop over 64-bit indices. */
#define UR_GRID_STRIDE(i, n)                                                              \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x,                        \
               ur_stride_ = (int64_t)gridDim.x * blockDim.x;                              \
       i < (n); i += ur_stride_)

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

/* The block's total of v, valid in thread 0, for blocks of at most UR_SUM_THREADS: each warp
 * sums by shuffles, then warp 0 sums the warps' totals, always in the same order, so the loss
 * and the mean are the same on every run. */
#define UR_SUM_THREADS 1024
__device__ __forceinline__ double ur_block_sum(double v) {
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

/* ---- cuBLAS and cuBLASLt, opened with dlopen on the first use of the per-device state ---- */

/* cublasGemmEx is overloaded in C++ (its compute type also as a cudaDataType): take this one. */
typedef cublasStatus_t (*ur_gemm_ex_fn)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int,
                                        int, int, const void *, const void *, cudaDataType, int,
                                        const void *, cudaDataType, int, const void *, void *,
                                        cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
#define UR_FN(name) decltype(&::name)

#define UR_BLAS_FNS(X)                                                                             \
  X(cublasLt, cublasLtCreate, UR_FN(cublasLtCreate))                                               \
  X(cublasLt, cublasLtDestroy, UR_FN(cublasLtDestroy))                                             \
  X(cublasLt, cublasLtMatmulDescCreate, UR_FN(cublasLtMatmulDescCreate))                           \
  X(cublasLt, cublasLtMatmulDescDestroy, UR_FN(cublasLtMatmulDescDestroy))                         \
  X(cublasLt, cublasLtMatmulDescSetAttribute, UR_FN(cublasLtMatmulDescSetAttribute))               \
  X(cublasLt, cublasLtMatrixLayoutCreate, UR_FN(cublasLtMatrixLayoutCreate))                       \
  X(cublasLt, cublasLtMatrixLayoutDestroy, UR_FN(cublasLtMatrixLayoutDestroy))                     \
  X(cublasLt, cublasLtMatmulPreferenceCreate, UR_FN(cublasLtMatmulPreferenceCreate))               \
  X(cublasLt, cublasLtMatmulPreferenceDestroy, UR_FN(cublasLtMatmulPreferenceDestroy))             \
  X(cublasLt, cublasLtMatmulPreferenceSetAttribute, UR_FN(cublasLtMatmulPreferenceSetAttribute))   \
  X(cublasLt, cublasLtMatmulAlgoGetHeuristic, UR_FN(cublasLtMatmulAlgoGetHeuristic))               \
  X(cublasLt, cublasLtMatmul, UR_FN(cublasLtMatmul))                                               \
  X(cublas, cublasCreate_v2, UR_FN(cublasCreate_v2))                                               \
  X(cublas, cublasSetStream_v2, UR_FN(cublasSetStream_v2))                                         \
  X(cublas, cublasSetWorkspace_v2, UR_FN(cublasSetWorkspace_v2))                                   \
  X(cublas, cublasGemmEx, ur_gemm_ex_fn)                                                           \
  X(cublas, cublasGetStatusName, UR_FN(cublasGetStatusName))                                       \
  X(cublas, cublasGetStatusString, UR_FN(cublasGetStatusString))

typedef struct ur_blas_api {
#define UR_BLAS_FIELD(lib, name, type) type name;
  UR_BLAS_FNS(UR_BLAS_FIELD)
#undef UR_BLAS_FIELD
} ur_blas_api;

/* Filled once ur__cuda_dense_device has succeeded on any GPU. */
extern ur_blas_api ur__cuda_blas;

/* Reports a failed cuBLAS call as "cuda: <what> failed: <name> (<message>)": allocation
 * failures are UR_STATUS_OOM, anything else UR_STATUS_DEVICE. */
ur_status ur__cuda_blas_fail(cublasStatus_t s, const char *what);

/* ---- per-device state and per-stream workspaces ---- */

typedef struct ur_dense_dev {
  int ready;
  int sms;
  size_t smem_optin;        /* shared memory a block may opt into */
  cublasLtHandle_t lt;
  cublasHandle_t blas;
} ur_dense_dev;

/* The current device's state (and its ordinal), made on first use: SM count, shared-memory
 * opt-in and cuBLAS handles.  Needs cuBLAS, and says so when it is missing. */
ur_status ur__cuda_dense_device(ur_dense_dev **out, int *device);

/* A workspace of at least `bytes` for work on `stream` of device dev, kept and grown (never
 * shrunk), so a steady training step allocates nothing.  Work on one stream is ordered, so a
 * workspace is never used twice at once.  Its bytes count against the HBM budget: one that
 * does not fit fails with the budget's error and leaves the stream's old one as it was; the
 * stream's freeing gives them back (ur__cuda_dense_stream_gone, common.cuh). */
ur_status ur__cuda_dense_workspace(int dev, cudaStream_t stream, size_t bytes, void **out);
/* Frees the workspaces of stream (on any device) after its work, and gives their bytes back. */
void ur__cuda_dense_workspace_free(cudaStream_t stream);

/* linear.cu: the side stream of a freed main stream goes, with its workspace. */
void ur__cuda_linear_stream_gone(cudaStream_t stream);

/* ---- the entries of the dense table, by file ---- */

/* linear.cu */
ur_status ur__cuda_linear_forward(void *stream, const void *x, const void *w, const void *b,
                                  void *y, uint8_t *mask, int64_t rows, int64_t in, int64_t out,
                                  ur_dtype dtype, ur_act act, uint32_t flags);
ur_status ur__cuda_linear_backward(void *stream, const void *x, const void *w, const void *y,
                                   const void *gy, const uint8_t *x_mask, void *gx, float *gw,
                                   float *gb, float *gb_x, void *work, int64_t rows, int64_t in,
                                   int64_t out, ur_dtype dtype, ur_act act, uint32_t flags);
ur_status ur__cuda_dense_join(void *stream);
ur_status ur__cuda_act_forward(void *stream, const void *x, void *y, int64_t n, ur_dtype dtype,
                               ur_act act);
ur_status ur__cuda_act_backward(void *stream, const void *y, const void *gy, void *gx, int64_t n,
                                ur_dtype dtype, ur_act act);

/* interaction.cu */
ur_status ur__cuda_interaction_forward(void *stream, const void *dense, const void *emb,
                                       void *out, int64_t rows, int64_t ocols, int32_t tables,
                                       int32_t dim, int32_t self, ur_dtype dd, ur_dtype ed,
                                       ur_dtype od, uint32_t flags);
ur_status ur__cuda_interaction_backward(void *stream, const void *dense, const void *emb,
                                        const void *gout, void *gdense, void *gemb, int64_t rows,
                                        int64_t ocols, int32_t tables, int32_t dim, int32_t self,
                                        ur_dtype dd, ur_dtype ed, ur_dtype od, uint32_t flags);
ur_status ur__cuda_copy_2d(void *stream, void *dst, size_t dpitch, const void *src,
                           size_t spitch, size_t width, size_t rows);

/* crossnet.cu */
ur_status ur__cuda_cross_forward(void *stream, const void *x0, const void *z, const void *xl,
                                 void *y, int64_t n, ur_dtype dtype);
ur_status ur__cuda_cross_backward(void *stream, const void *x0, const void *z, const void *gy,
                                  void *gz, void *gx0, void *gxl, int64_t n, ur_dtype dtype,
                                  uint32_t flags);

/* loss.cu */
ur_status ur__cuda_bce_forward(void *stream, const void *logits, const float *targets,
                               const float *weights, float *loss, int64_t n, ur_dtype dtype,
                               ur_reduction reduction);
ur_status ur__cuda_bce_backward(void *stream, const void *logits, const float *targets,
                                const float *weights, void *glogits, int64_t n, ur_dtype dtype,
                                ur_reduction reduction, double scale);

/* optim.cu */
ur_status ur__cuda_optim_step(void *stream, const ur__optim_consts *k, int32_t n,
                              float *const *params, float *const *grads, float *const *s1,
                              float *const *s2, void *const *halves, const int64_t *numel);
ur_status ur__cuda_optim_sumsq(void *stream, int32_t n, float *const *grads, const int64_t *numel,
                               double *work, int32_t first);
ur_status ur__cuda_optim_clip_factor(void *stream, double *work, double clip_norm);

#endif
