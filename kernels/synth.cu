/* synth.cu: the synthetic data generator on the GPU (the CUDA backend's synth table), one
 * thread per sample.  The sample is engine/src/data/synth.h's, compiled here without fused
 * multiply-adds (see the Makefile), so the GPU gives bit for bit the CPU's samples for a seed.
 * The spec travels as a kernel parameter and its tables (88 bytes each, up to 65536 of them:
 * more than a parameter block or shared memory holds) as a copy in device memory, read
 * through the caches by every thread. */
#include <cuda_runtime.h>
#include <stdint.h>

#include "common.cuh"
#include "data/synth.h"

#define UR_SYNTH_THREADS 128

__global__ void ur_synth_kernel(const ur__synth x, int64_t first, int64_t n, float *dense,
                                float *labels, int64_t *ids, float *weights, int32_t *lengths,
                                int64_t *groups, float *probs) {
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    ur__synth_row(&x, first + i, dense + i * x.D, labels + i, ids + i * x.H,
                  weights ? weights + i * x.H : NULL, lengths + i * x.T, groups ? groups + i : NULL,
                  probs ? probs + i : NULL);
  }
}

static cudaError_t ur__cuda_synth(cudaStream_t stream, const ur__synth *x, int64_t first, int64_t n,
                           void *dense, void *labels, void *ids, void *weights, void *lengths,
                           void *groups, void *probs) {
  if (n <= 0) return cudaSuccess;
  int sms = 0;
  cudaError_t e = ur__cuda_sms(&sms);
  if (e != cudaSuccess) return e;
  int64_t want = (n + UR_SYNTH_THREADS - 1) / UR_SYNTH_THREADS, cap = (int64_t)sms * 16;
  unsigned blocks = (unsigned)(want < cap ? want : cap);
  ur_synth_kernel<<<blocks, UR_SYNTH_THREADS, 0, stream>>>(
      *x, first, n, (float *)dense, (float *)labels, (int64_t *)ids, (float *)weights,
      (int32_t *)lengths, (int64_t *)groups, (float *)probs);
  return cudaGetLastError();
}

/* The tables copied in stream order, freed in stream order after the kernel; their bytes
 * taken from the HBM budget for the call. */
static ur_status synth_generate(void *stream, const ur__synth *x, int64_t first, int64_t n,
                                void *dense, void *labels, void *ids, void *weights,
                                void *lengths, void *groups, void *probs) {
  cudaStream_t s = (cudaStream_t)stream;
  ur__synth dx = *x;
  size_t bytes = sizeof(ur__synth_tab) * (size_t)(x->T > 0 ? x->T : 0);
  dx.t = NULL;
  if (bytes) {
    ur_status st = ur__cuda_core->workspace_take(bytes, "the synthetic generator's tables");
    if (st) return st;
    cudaError_t e = cudaMallocAsync((void **)&dx.t, bytes, s);
    if (e == cudaSuccess) e = cudaMemcpyAsync(dx.t, x->t, bytes, cudaMemcpyHostToDevice, s);
    if (e != cudaSuccess) {
      if (dx.t) ur__cuda_drop(cudaFreeAsync(dx.t, s));
      ur__cuda_core->workspace_give(bytes);
      return ur__cuda_fail(e, "synthetic generator: copying %d tables (%zu bytes) to the GPU",
                           (int)x->T, bytes);
    }
  }
  cudaError_t e = ur__cuda_synth(s, &dx, first, n, dense, labels, ids, weights, lengths, groups,
                                 probs);
  cudaError_t f = dx.t ? cudaFreeAsync(dx.t, s) : cudaSuccess;
  if (bytes) ur__cuda_core->workspace_give(bytes);
  UR_CUDA_CHECK(e, "synthetic samples %lld..%lld", (long long)first, (long long)(first + n - 1));
  UR_CUDA_CHECK(f, "synthetic generator: freeing the copy of its %d tables", (int)x->T);
  return UR_STATUS_OK;
}

const ur_synth_ops ur__cuda_synth_ops = {.generate = synth_generate};
