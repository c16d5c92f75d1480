/* metrics.cu (backend): the CUDA backend's metrics entries, which run a job (metrics_job.h)
 * through the launchers of kernels/metrics.cu and turn CUDA's errors into messages. */
#include <cuda_runtime.h>
#include <stdint.h>

#include "backend.h"
#include "metrics.h"

static const ur_core_api *g_core;

static ur_status ur_cuda_metrics_fail(cudaError_t err, const char *what, const ur__metrics_job *j) {
  (void)cudaGetLastError(); /* so that the next launch check reports only itself */
  return g_core->set_error(err == cudaErrorMemoryAllocation ? UR_STATUS_OOM : UR_STATUS_DEVICE,
                           "cuda: metrics %s (%lld samples, %d tasks) failed: %s (%s)", what,
                           (long long)j->n, (int)j->tasks, cudaGetErrorName(err),
                           cudaGetErrorString(err));
}

static ur_status ur_cuda_metrics_update(void *stream, const ur__metrics_job *j) {
  cudaError_t e = ur__cuda_metrics_update((cudaStream_t)stream, j);
  return e == cudaSuccess ? UR_STATUS_OK : ur_cuda_metrics_fail(e, "update", j);
}

static ur_status ur_cuda_metrics_scratch(const ur__metrics_job *j, size_t *bytes) {
  cudaError_t e = ur__cuda_metrics_scratch(j, bytes);
  return e == cudaSuccess ? UR_STATUS_OK : ur_cuda_metrics_fail(e, "sort storage query", j);
}

static ur_status ur_cuda_metrics_window(void *stream, const ur__metrics_job *j) {
  size_t need = 0;
  if ((j->auc || j->grouped) && j->n > 0) {
    ur_status st = ur_cuda_metrics_scratch(j, &need);
    if (st != UR_STATUS_OK) return st;
    if (!j->scratch || need > j->scratch_bytes)
      return g_core->set_error(UR_STATUS_INVALID,
                               "cuda: metrics window: %zu bytes of scratch given for %lld "
                               "samples; the sorts need %zu",
                               j->scratch_bytes, (long long)j->n, need);
  }
  cudaError_t e = ur__cuda_metrics_window((cudaStream_t)stream, j);
  return e == cudaSuccess ? UR_STATUS_OK : ur_cuda_metrics_fail(e, "window", j);
}

static ur_status ur_cuda_metrics_lifetime(void *stream, const ur__metrics_job *j) {
  cudaError_t e = ur__cuda_metrics_lifetime((cudaStream_t)stream, j);
  return e == cudaSuccess ? UR_STATUS_OK : ur_cuda_metrics_fail(e, "lifetime", j);
}

void ur__cuda_metrics_install(ur_backend *b, const ur_core_api *core) {
  g_core = core;
  b->metrics_update = ur_cuda_metrics_update;
  b->metrics_window = ur_cuda_metrics_window;
  b->metrics_lifetime = ur_cuda_metrics_lifetime;
  b->metrics_scratch = ur_cuda_metrics_scratch;
}
