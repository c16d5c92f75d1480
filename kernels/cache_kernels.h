/* cache_kernels.h: launch wrapper of the software cache's row mover in kernels/cache.cu,
 * called by engine/src/cuda/cache.cu.  engine/src/cache.c made every decision; this moves. */
#ifndef UR_CACHE_KERNELS_H
#define UR_CACHE_KERNELS_H

#include <cuda_runtime.h>
#include <stdint.h>

#include "cache.h"

/* For each of n entries (pairs in device memory: table << 48 | row, slot storage row), the
 * row and its optimizer state from host memory to the slot (to_host 0) or back (1). */
cudaError_t ur__cuda_cache_move(cudaStream_t s, const ur__cache_io *io, const int64_t *entries,
                                int64_t n, int to_host);

#endif
