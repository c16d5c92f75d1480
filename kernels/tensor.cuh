/* tensor.cuh: launch wrappers for the kernels in kernels/tensor.cu, called by the backend
 * table (kernels/backend.cu).  Each enqueues on the current device and returns the launch's cudaError_t;
 * checking arguments and turning errors into messages is the caller's job. */
#ifndef UR_KERNELS_TENSOR_CUH
#define UR_KERNELS_TENSOR_CUH

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "uvmrec.h"

/* n elements of elem_bytes (1, 2, 4 or 8) take the low elem_bytes bytes of value;
 * dst must be aligned to elem_bytes. */
cudaError_t ur__cuda_fill(cudaStream_t stream, void *dst, size_t n, size_t elem_bytes,
                          uint64_t value);

/* bytes (at most UR_CUDA_READ_SMALL) of src copied by one block into dst, memory the GPU
 * writes (pinned host memory). */
#define UR_CUDA_READ_SMALL 4096
cudaError_t ur__cuda_read_small(cudaStream_t stream, void *dst, const void *src, size_t bytes);

/* Element i (row i / cols, column i % cols) takes ur_philox_value(first + row * pitch + column,
 * seed, ...) (philox.h) converted to dtype. */
cudaError_t ur__cuda_rand(cudaStream_t stream, void *dst, ur_dtype dtype, size_t n,
                          uint64_t first, size_t cols, uint64_t pitch, ur_dist dist, double a,
                          double b, uint64_t seed);

/* Row phys[j] of dst (row_elems elements of f32, f16 or bf16) takes the uniform numbers of
 * elements ids[j] * row_elems + c of a whole-tensor draw from first 0; n rows. */
cudaError_t ur__cuda_rand_rows(cudaStream_t stream, void *dst, ur_dtype dtype, size_t row_elems,
                               const int64_t *phys, const int64_t *ids, size_t n, double a,
                               double b, uint64_t seed);

/* Rows rows[j] of dst (row_bytes each, a multiple of 4) set to zero; n rows. */
cudaError_t ur__cuda_zero_rows(cudaStream_t stream, void *dst, size_t row_bytes,
                               const int64_t *rows, size_t n);

/* Loads the probe kernel on the current device, so that a timed probe does not time the
 * module load (lazy loading defers it to the first launch). */
cudaError_t ur__cuda_probe_prepare(void);

/* Reads every byte of [src, src + bytes) once; writes nothing unless the sum of what it
 * read equals magic, which keeps the loads from being optimised away. */
cudaError_t ur__cuda_probe(cudaStream_t stream, const void *src, size_t bytes, uint64_t magic);

/* ORs "an element is NaN or +-Inf" of n <= UR__NONFINITE_GROUP arrays into a guard's flags
 * (uvmrec.h's ur_nonfinite_check), one launch; and the end of a step. */
cudaError_t ur__cuda_nonfinite_check(cudaStream_t stream, int n, const void *const *xs,
                                     const ur_dtype *dtypes, const int64_t *counts,
                                     int32_t *flags, int32_t slot0);
cudaError_t ur__cuda_nonfinite_end(cudaStream_t stream, int32_t *flags, int32_t sticky);

#endif
