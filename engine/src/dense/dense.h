/* dense.h: internals of the dense ops (linear.c, interaction.c, crossnet.c, loss.c, optim.c,
 * dense.c): the CPU backend's implementations, which are the reference, and the dispatch that
 * picks a backend for a set of tensors. */
#ifndef UR_DENSE_H
#define UR_DENSE_H

#include <math.h>
#include "core/core.h"
#include "core/optim_plan.h"

/* The backend that runs an op, by the one rule (core.h): each tensor's backend is its
 * memory's (ur__tensor_backend: the GPU's for device and managed memory when a GPU is in use,
 * else the CPU's), and an op's tensors must agree.  Managed memory is the one exception, as
 * the CPU reaches it too: an op mixing managed with host or pinned memory runs on the CPU.
 * Device memory with host or pinned memory is an error naming both.  When the CPU runs an op
 * on pinned or managed memory while a GPU is in use, it first waits for the GPU, which may
 * still be writing it (ur__tensor_ready).  NULL entries of ts are skipped; `op` and `names`
 * (one per tensor) go into error messages.  Call after the checks of uvmrec.h's dense
 * section, and reach an entry only through UR__NEED(b, dense, <entry>). */
UR__HIDDEN ur_status ur__dense_backend(const char *op, int n, const ur_tensor *const *ts,
                                       const char *const *names, const ur_backend **out);
/* The stream handle a backend takes. */
UR__HIDDEN void *ur__dense_stream(const ur_stream *s);
/* Checks a tensor's dtype against f32 / bf16 (`allow_bf16`), and its shape:
 * 2-D [rows, cols] (rows or cols < 0: any), or any shape of numel elements (ndim 0). */
UR__HIDDEN ur_status ur__dense_check(const char *op, const char *name, const ur_tensor *t,
                                     int allow_bf16, int64_t rows, int64_t cols);
UR__HIDDEN ur_status ur__dense_check_numel(const char *op, const char *name, const ur_tensor *t,
                                           int allow_bf16, int64_t numel);

/* A float of a dense dtype (f32 or bf16), for the CPU reference. */
static inline float ur__dense_ld(const void *p, ur_dtype d, size_t i) {
  if (d == UR_DTYPE_F32) return ((const float *)p)[i];
  return ur__bf16_to_f32(((const uint16_t *)p)[i]);
}

static inline void ur__dense_st(void *p, ur_dtype d, size_t i, float v) {
  if (d == UR_DTYPE_F32) ((float *)p)[i] = v;
  else ((uint16_t *)p)[i] = ur__f32_to_bf16(v);
}

/* Bytes a row of a ReLU mask of n columns takes (ur_linear_mask_cols): whole 16-byte words, so
 * the mask is cuBLASLt's bit mask with a leading dimension of 128-bit multiples. */
static inline int64_t ur__mask_cols(int64_t n) { return n <= 0 ? 0 : (n + 127) / 128 * 16; }

/* The dot interaction's pairs of T1 vectors (the dense one and the tables'): each two once,
 * and each with itself too under self-interaction.  The CPU reference and the GPU's
 * launchers (kernels/interaction.cu) count them here. */
static inline int64_t ur__inter_pairs(int64_t T1, int self) { return T1 * (T1 - 1) / 2 + (self ? T1 : 0); }

/* Parameters per optimizer call of a backend (for the GPU, one launch). */
#define UR__OPTIM_GROUP 48

/* The dense ops' table, filled by the CPU reference below and by the CUDA backend, each entry
 * in the file of its op's name: linear.c (linear, act), interaction.c (interaction, copy_2d),
 * crossnet.c, loss.c (bce), optim.c, dense.c (mean, cast), and kernels/ the same names in .cu.
 * The core has checked every shape and dtype; matrices are row-major and contiguous; counts
 * are elements; the C files say what each computes. */
typedef struct ur_dense_ops {
  /* mask, x_mask: ReLU masks of ur_linear_mask_cols bytes a row (of out, of in), or NULL. */
  ur_status (*linear_forward)(void *stream, const void *x, const void *w, const void *b, void *y,
                              uint8_t *mask, int64_t rows, int64_t in, int64_t out,
                              ur_dtype dtype, ur_act act, uint32_t flags);
  ur_status (*linear_backward)(void *stream, const void *x, const void *w, const void *y,
                               const void *gy, const uint8_t *x_mask, void *gx, float *gw,
                               float *gb, float *gb_x, void *work, int64_t rows, int64_t in,
                               int64_t out, ur_dtype dtype, ur_act act, uint32_t flags);
  /* Orders stream after the side-stream work of WGRAD_ASYNC backward calls on it. */
  ur_status (*join)(void *stream);
  ur_status (*act_forward)(void *stream, const void *x, void *y, int64_t n, ur_dtype dtype,
                           ur_act act);
  ur_status (*act_backward)(void *stream, const void *y, const void *gy, void *gx, int64_t n,
                            ur_dtype dtype, ur_act act);
  /* out and gout have ocols columns: d + P, or padded beyond it (zeros, ignored). */
  ur_status (*interaction_forward)(void *stream, const void *dense, const void *emb, void *out,
                                   int64_t rows, int64_t ocols, int32_t tables, int32_t dim,
                                   int32_t self, ur_dtype dense_dtype, ur_dtype emb_dtype,
                                   ur_dtype out_dtype, uint32_t flags);
  ur_status (*interaction_backward)(void *stream, const void *dense, const void *emb,
                                    const void *gout, void *gdense, void *gemb, int64_t rows,
                                    int64_t ocols, int32_t tables, int32_t dim, int32_t self,
                                    ur_dtype dense_dtype, ur_dtype emb_dtype, ur_dtype out_dtype,
                                    uint32_t flags);
  ur_status (*cross_forward)(void *stream, const void *x0, const void *z, const void *xl, void *y,
                             int64_t n, ur_dtype dtype);
  ur_status (*cross_backward)(void *stream, const void *x0, const void *z, const void *gy,
                              void *gz, void *gx0, void *gxl, int64_t n, ur_dtype dtype,
                              uint32_t flags);
  /* rows rows of width bytes, from src (pitch spitch bytes) to dst (pitch dpitch). */
  ur_status (*copy_2d)(void *stream, void *dst, size_t dpitch, const void *src, size_t spitch,
                       size_t width, size_t rows);
  ur_status (*bce_forward)(void *stream, const void *logits, const float *targets,
                           const float *weights, float *loss, int64_t n, ur_dtype dtype,
                           ur_reduction reduction);
  ur_status (*bce_backward)(void *stream, const void *logits, const float *targets,
                            const float *weights, void *glogits, int64_t n, ur_dtype dtype,
                            ur_reduction reduction, double scale);
  ur_status (*mean)(void *stream, const void *x, float *out, int64_t n, ur_dtype dtype);
  ur_status (*cast)(void *stream, const void *src, ur_dtype src_dtype, void *dst,
                    ur_dtype dst_dtype, int64_t n);
  /* One update with the constants k (core/optim_plan.h); entries of s1, s2 and halves may be
   * NULL where the rule or the caller needs none. */
  ur_status (*optim_step)(void *stream, const ur__optim_consts *k, int32_t n, float *const *params,
                          float *const *grads, float *const *s1, float *const *s2,
                          void *const *halves, const int64_t *numel);
  /* Gradient clipping's norm (ur_optim_step's clip_work): the squares of n gradients' elements
   * added into work's partial sums (work + 2, UR_OPTIM_CLIP_PARTS; first: set instead of
   * added to), in an order of the backend's own that does not change from run to run; then
   * clip_factor: ur__optim_clip_factor where the work lives. */
  ur_status (*optim_sumsq)(void *stream, int32_t n, float *const *grads, const int64_t *numel,
                           double *work, int32_t first);
  ur_status (*optim_clip_factor)(void *stream, double *work, double clip_norm);
} ur_dense_ops;

/* The CPU backend's dense table (dense.c), the reference. */
UR__HIDDEN extern const ur_dense_ops ur__cpu_dense_ops;

/* The CPU reference's entries. */
UR__HIDDEN ur_status ur__cpu_linear_forward(void *stream, const void *x, const void *w,
                                            const void *b, void *y, uint8_t *mask, int64_t rows,
                                            int64_t in, int64_t out, ur_dtype dtype, ur_act act,
                                            uint32_t flags);
UR__HIDDEN ur_status ur__cpu_linear_backward(void *stream, const void *x, const void *w,
                                             const void *y, const void *gy,
                                             const uint8_t *x_mask, void *gx, float *gw,
                                             float *gb, float *gb_x, void *work, int64_t rows,
                                             int64_t in, int64_t out, ur_dtype dtype, ur_act act,
                                             uint32_t flags);
UR__HIDDEN ur_status ur__cpu_dense_join(void *stream);
UR__HIDDEN ur_status ur__cpu_act_forward(void *stream, const void *x, void *y, int64_t n,
                                         ur_dtype dtype, ur_act act);
UR__HIDDEN ur_status ur__cpu_act_backward(void *stream, const void *y, const void *gy, void *gx,
                                          int64_t n, ur_dtype dtype, ur_act act);
UR__HIDDEN ur_status ur__cpu_interaction_forward(void *stream, const void *dense, const void *emb,
                                                 void *out, int64_t rows, int64_t ocols,
                                                 int32_t tables, int32_t dim, int32_t self,
                                                 ur_dtype dense_dtype, ur_dtype emb_dtype,
                                                 ur_dtype out_dtype, uint32_t flags);
UR__HIDDEN ur_status ur__cpu_interaction_backward(void *stream, const void *dense,
                                                  const void *emb, const void *gout, void *gdense,
                                                  void *gemb, int64_t rows, int64_t ocols,
                                                  int32_t tables, int32_t dim, int32_t self,
                                                  ur_dtype dense_dtype, ur_dtype emb_dtype,
                                                  ur_dtype out_dtype, uint32_t flags);
UR__HIDDEN ur_status ur__cpu_cross_forward(void *stream, const void *x0, const void *z,
                                           const void *xl, void *y, int64_t n, ur_dtype dtype);
UR__HIDDEN ur_status ur__cpu_cross_backward(void *stream, const void *x0, const void *z,
                                            const void *gy, void *gz, void *gx0, void *gxl,
                                            int64_t n, ur_dtype dtype, uint32_t flags);
UR__HIDDEN ur_status ur__cpu_copy_2d(void *stream, void *dst, size_t dpitch, const void *src,
                                     size_t spitch, size_t width, size_t rows);
UR__HIDDEN ur_status ur__cpu_bce_forward(void *stream, const void *logits, const float *targets,
                                         const float *weights, float *loss, int64_t n,
                                         ur_dtype dtype, ur_reduction reduction);
UR__HIDDEN ur_status ur__cpu_bce_backward(void *stream, const void *logits, const float *targets,
                                          const float *weights, void *glogits, int64_t n,
                                          ur_dtype dtype, ur_reduction reduction, double scale);
UR__HIDDEN ur_status ur__cpu_mean(void *stream, const void *x, float *out, int64_t n,
                                  ur_dtype dtype);
UR__HIDDEN ur_status ur__cpu_cast(void *stream, const void *src, ur_dtype src_dtype, void *dst,
                                  ur_dtype dst_dtype, int64_t n);
UR__HIDDEN ur_status ur__cpu_optim_step(void *stream, const ur__optim_consts *k, int32_t n,
                                        float *const *params, float *const *grads,
                                        float *const *s1, float *const *s2, void *const *halves,
                                        const int64_t *numel);
UR__HIDDEN ur_status ur__cpu_optim_sumsq(void *stream, int32_t n, float *const *grads,
                                         const int64_t *numel, double *work, int32_t first);
UR__HIDDEN ur_status ur__cpu_optim_clip_factor(void *stream, double *work, double clip_norm);

#endif
