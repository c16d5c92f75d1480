/* cache.cu (glue): the CUDA backend's software-cache entries (the row mover and a stream's
 * wait for an event), turning cudaError_t into ur_status with CUDA's message. */
#include <cuda_runtime.h>

#include "backend.h"
#include "cache_kernels.h"

static const ur_core_api *g_cache_core;

static ur_status ur_cuda_cache_status(cudaError_t err, const char *what) {
  if (err == cudaSuccess) return UR_STATUS_OK;
  (void)cudaGetLastError();
  return g_cache_core->set_error(UR_STATUS_DEVICE, "cuda: cache %s failed: %s (%s)", what,
                                 cudaGetErrorName(err), cudaGetErrorString(err));
}

static ur_status ur_cuda_cache_move(void *stream, const ur__cache_io *io, const int64_t *entries,
                                    int64_t n, int32_t to_host) {
  return ur_cuda_cache_status(
      ur__cuda_cache_move((cudaStream_t)stream, io, entries, n, to_host),
      to_host ? "write-back of rows" : "fill of rows");
}

static ur_status ur_cuda_stream_wait(void *stream, void *event) {
  return ur_cuda_cache_status(cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)event, 0),
                              "stream wait");
}

void ur__cuda_cache_install(ur_backend *b, const ur_core_api *core) {
  g_cache_core = core;
  b->cache_move = ur_cuda_cache_move;
  b->stream_wait = ur_cuda_stream_wait;
}
