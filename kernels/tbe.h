/* tbe.h (kernels): launch wrappers for the embedding collection's kernels in kernels/tbe.cu,
 * called by engine/src/cuda/tbe.cu.  Each enqueues on the current device and stream and
 * returns the first CUDA error; the arguments were checked by engine/src/tbe.c, and the
 * argument structs are engine/src/tbe_plan.h's. */
#ifndef UR_KERNELS_TBE_H
#define UR_KERNELS_TBE_H

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "tbe_plan.h"

/* Device workspace a call needs (cub's scratch included). */
cudaError_t ur__cuda_tbe_work_bytes(const ur__tbe_args *a, int backward, size_t *out);

/* Pooled (or per-value) rows into a->out; VBE with inverse goes through a flat buffer in work.
 * Bad ids are skipped and noted in a->flags unless a->bounds is off. */
cudaError_t ur__cuda_tbe_forward(cudaStream_t s, const ur__tbe_args *a, void *work);

/* Sort, segment, sum each distinct row's gradient and step it. */
cudaError_t ur__cuda_tbe_backward(cudaStream_t s, const ur__tbe_args *a, const ur__tbe_hyper *h,
                                  void *work);

/* The deduplicated gradient: count sorts and segments, then waits and copies the number of
 * distinct rows per table into counts (host); write then fills rows and grads from the same
 * work (table t's block of grads starts after the blocks of tables before it). */
cudaError_t ur__cuda_tbe_sparse_count(cudaStream_t s, const ur__tbe_args *a, void *work,
                                      int64_t *counts);
cudaError_t ur__cuda_tbe_sparse_write(cudaStream_t s, const ur__tbe_args *a, void *work,
                                      const int64_t *counts, int64_t *rows, float *grads);

/* out[i] = src[ids[i]] for rows of row_bytes (a multiple of 4): the plain gather. */
cudaError_t ur__cuda_gather_rows(cudaStream_t s, const void *src, size_t row_bytes,
                                 const int64_t *ids, int64_t n, void *out);

/* Access counters: c[i] = floor(c[i] * factor) (the forward counts when a table has counters). */
cudaError_t ur__cuda_tbe_decay_counts(cudaStream_t s, int32_t *c, int64_t n, double factor);

#endif
