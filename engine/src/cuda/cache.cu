/* cache.cu (glue): the CUDA backend's software-cache entries (the decisions, the row mover and
 * a stream's wait for an event), turning cudaError_t into ur_status with CUDA's message. */
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

static ur_status ur_cuda_cache_scratch(const ur__cache_dev *d, int64_t n, size_t *bytes) {
  return ur_cuda_cache_status(ur__cuda_cache_scratch(d, n, bytes), "scratch sizing");
}

static ur_status ur_cuda_cache_lookup(void *stream, const ur__cache_dev *d, const ur__cache_job *j) {
  return ur_cuda_cache_status(ur__cuda_cache_lookup((cudaStream_t)stream, d, j), "lookup");
}

static ur_status ur_cuda_cache_decide(void *stream, const ur__cache_dev *d, const ur__cache_job *j) {
  return ur_cuda_cache_status(ur__cuda_cache_decide((cudaStream_t)stream, d, j), "decisions");
}

static ur_status ur_cuda_cache_place(void *stream, const ur__cache_dev *d, const ur__cache_job *j) {
  return ur_cuda_cache_status(ur__cuda_cache_place((cudaStream_t)stream, d, j), "placement");
}

static ur_status ur_cuda_cache_mark(void *stream, uint8_t *dirty, const int64_t *slots, int64_t n) {
  return ur_cuda_cache_status(ur__cuda_cache_mark((cudaStream_t)stream, dirty, slots, n),
                              "dirty marks");
}

void ur__cuda_cache_install(ur_backend *b, const ur_core_api *core) {
  g_cache_core = core;
  b->cache_move = ur_cuda_cache_move;
  b->stream_wait = ur_cuda_stream_wait;
  b->cache_scratch = ur_cuda_cache_scratch;
  b->cache_lookup = ur_cuda_cache_lookup;
  b->cache_decide = ur_cuda_cache_decide;
  b->cache_place = ur_cuda_cache_place;
  b->cache_mark = ur_cuda_cache_mark;
}
