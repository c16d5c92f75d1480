/* data.cu (backend): the CUDA backend's data entries: the synthetic generator of
 * kernels/data.cu, with CUDA's errors turned into messages. */
#include <cuda_runtime.h>
#include <stdint.h>

#include "backend.h"
#include "synth.h"

cudaError_t ur__cuda_synth(cudaStream_t stream, const ur__synth *x, int64_t first, int64_t n,
                           void *dense, void *labels, void *ids, void *weights, void *lengths,
                           void *groups, void *probs);

static const ur_core_api *g_core;

static ur_status ur_cuda_synth(void *stream, const ur__synth *x, int64_t first, int64_t n,
                               void *dense, void *labels, void *ids, void *weights, void *lengths,
                               void *groups, void *probs) {
  cudaError_t e = ur__cuda_synth((cudaStream_t)stream, x, first, n, dense, labels, ids, weights,
                                 lengths, groups, probs);
  if (e == cudaSuccess) return UR_STATUS_OK;
  (void)cudaGetLastError();
  return g_core->set_error(UR_STATUS_DEVICE, "cuda: synthetic samples %lld..%lld failed: %s (%s)",
                           (long long)first, (long long)(first + n - 1), cudaGetErrorName(e),
                           cudaGetErrorString(e));
}

void ur__cuda_data_install(struct ur_backend *b, const ur_core_api *core) {
  g_core = core;
  b->synth = ur_cuda_synth;
}
