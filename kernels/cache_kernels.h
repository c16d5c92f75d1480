/* cache_kernels.h: launch wrappers of the software cache's decisions and row mover in
 * kernels/cache.cu, called by engine/src/cuda/cache.cu (engine/src/cache.c drives them). */
#ifndef UR_CACHE_KERNELS_H
#define UR_CACHE_KERNELS_H

#include <cuda_runtime.h>
#include <stdint.h>

#include "cache.h"

/* For each of n entries (pairs in device memory: table << 48 | row, slot storage row), the
 * row and its optimizer state from host memory to the slot (to_host 0) or back (1). */
cudaError_t ur__cuda_cache_move(cudaStream_t s, const ur__cache_io *io, const int64_t *entries,
                                int64_t n, int to_host);
/* Scratch bytes of one batch of n values. */
cudaError_t ur__cuda_cache_scratch(const ur__cache_dev *d, int64_t n, size_t *bytes);
/* One batch's decisions (see kernels/cache.cu); each copies info to j->info_host on s. */
cudaError_t ur__cuda_cache_lookup(cudaStream_t s, const ur__cache_dev *d, const ur__cache_job *j);
cudaError_t ur__cuda_cache_decide(cudaStream_t s, const ur__cache_dev *d, const ur__cache_job *j);
cudaError_t ur__cuda_cache_place(cudaStream_t s, const ur__cache_dev *d, const ur__cache_job *j);
/* dirty[slots[i]] = 1 for i < n. */
cudaError_t ur__cuda_cache_mark(cudaStream_t s, uint8_t *dirty, const int64_t *slots, int64_t n);

#endif
