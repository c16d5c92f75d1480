/* dense.cuh: what the dense kernels share (f32/bf16 element access as float, grid sizes, the
 * dispatch from a runtime dtype to a template) and the launchers of kernels/linear.cu,
 * elementwise.cu, interaction.cu, loss.cu and optim.cu, called by the dense table
 * (kernels/dense.cu).  Each launcher enqueues on `stream` on the current device and returns
 * the launch's cudaError_t; the core has checked every argument.  dtypes are UR_DTYPE_F32 or
 * UR_DTYPE_BF16; matrices row-major; counts 64-bit. */
#ifndef UR_KERNELS_DENSE_CUH
#define UR_KERNELS_DENSE_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stddef.h>
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



/* y[rows, cols] = act(y + b[cols]) (b may be NULL): the epilogue when cuBLAS runs the product. */
cudaError_t ur__cuda_bias_act(cudaStream_t stream, void *y, const void *b, int64_t rows,
                              int64_t cols, ur_dtype dtype, int act);

/* Rows a chunk of the bias-gradient reduction covers, and how many chunks there are: the
 * glue sizes its workspace (chunks * cols floats) with these. */
int64_t ur__cuda_bgrad_chunks(int64_t rows, int64_t cols, int sms);

/* g = gy masked by y > 0 (when y is not NULL; g then must be given) and gb[cols] += column sums
 * of g (when gb is not NULL), deterministically: fixed chunks of rows summed into partial
 * (chunks * cols floats), then the chunks in order. */
cudaError_t ur__cuda_relu_bgrad(cudaStream_t stream, const void *gy, const void *y, void *g,
                                float *gb, float *partial, int64_t rows, int64_t cols,
                                ur_dtype dtype, int sms);

cudaError_t ur__cuda_act_forward(cudaStream_t stream, const void *x, void *y, int64_t n,
                                 ur_dtype dtype, int act);
cudaError_t ur__cuda_act_backward(cudaStream_t stream, const void *y, const void *gy, void *gx,
                                  int64_t n, ur_dtype dtype, int act);
cudaError_t ur__cuda_cross_forward(cudaStream_t stream, const void *x0, const void *z,
                                   const void *xl, void *y, int64_t n, ur_dtype dtype);
cudaError_t ur__cuda_cross_backward(cudaStream_t stream, const void *x0, const void *z,
                                    const void *gy, void *gz, void *gx0, void *gxl, int64_t n,
                                    ur_dtype dtype, int accumulate);
cudaError_t ur__cuda_cast(cudaStream_t stream, const void *src, ur_dtype sd, void *dst,
                          ur_dtype dd, int64_t n);

/* Shared memory the interaction kernels take per block (one row of T+1 vectors of d floats,
 * padded, and for the backward the pairs' gradients); the glue checks it against the device. */
size_t ur__cuda_interaction_smem(int tables, int dim, int backward);
/* Raises the kernels' dynamic shared-memory limit to bytes (once per size class). */
cudaError_t ur__cuda_interaction_prepare(size_t bytes, ur_dtype dd, ur_dtype ed, ur_dtype od);
cudaError_t ur__cuda_interaction_forward(cudaStream_t stream, const void *dense, const void *emb,
                                         void *out, int64_t rows, int tables, int dim, int self,
                                         ur_dtype dd, ur_dtype ed, ur_dtype od, int sms);
cudaError_t ur__cuda_interaction_backward(cudaStream_t stream, const void *dense, const void *emb,
                                          const void *gout, void *gdense, void *gemb,
                                          int64_t rows, int tables, int dim, int self,
                                          ur_dtype dd, ur_dtype ed, ur_dtype od, int sms);

/* Sums in double over one block, in a fixed order (deterministic).  bce: per-sample losses of
 * logits against targets (weights may be NULL); reduction as ur_reduction; mean: of x. */
cudaError_t ur__cuda_bce_forward(cudaStream_t stream, const void *logits, const float *targets,
                                 const float *weights, float *loss, int64_t n, ur_dtype dtype,
                                 int reduction);
cudaError_t ur__cuda_bce_backward(cudaStream_t stream, const void *logits, const float *targets,
                                  const float *weights, void *glogits, int64_t n,
                                  ur_dtype dtype, double k);
cudaError_t ur__cuda_mean(cudaStream_t stream, const void *x, float *out, int64_t n,
                          ur_dtype dtype);

/* An optimizer step over up to UR__CUDA_OPTIM_MAX tensors in one launch. */
#define UR__CUDA_OPTIM_MAX 48
typedef struct ur__cuda_optim_consts {
  int kind, nesterov, first, zero;
  float lr, wd, mom, b1, b2, eps, step_size, bc2_sqrt, decay;
} ur__cuda_optim_consts;
cudaError_t ur__cuda_optim_step(cudaStream_t stream, const ur__cuda_optim_consts *k, int n,
                                float *const *params, float *const *grads, float *const *s1,
                                float *const *s2, void *const *halves, const int64_t *numel,
                                int sms);

#endif
