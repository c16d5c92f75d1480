/* dense_kernels.h: launchers of the dense kernels (kernels/linear.cu, elementwise.cu,
 * interaction.cu, loss.cu, optim.cu), called by engine/src/cuda/dense.cu.  Each enqueues on
 * `stream` on the current device and returns the launch's cudaError_t; the glue has checked
 * every argument.
 * dtypes are UR_DTYPE_F32 or UR_DTYPE_BF16; matrices row-major; counts 64-bit. */
#ifndef UR_KERNELS_DENSE_KERNELS_H
#define UR_KERNELS_DENSE_KERNELS_H

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "uvmrec.h"

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
