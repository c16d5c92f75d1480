/* tbe.cu (glue): the CUDA backend's embedding collection entries.  It turns the kernels'
 * cudaError_t into ur_status with CUDA's message, naming the step that failed. */
#include <cuda_runtime.h>
#include <stdio.h>

#include "backend.h"
#include "tbe.h"

static const ur_core_api *g_tbe_core;

static ur_status ur_cuda_tbe_fail(cudaError_t err, const char *what) {
  (void)cudaGetLastError();
  ur_status status = err == cudaErrorMemoryAllocation ? UR_STATUS_OOM : UR_STATUS_DEVICE;
  return g_tbe_core->set_error(status, "cuda: tbe %s failed: %s (%s)", what, cudaGetErrorName(err),
                               cudaGetErrorString(err));
}

static ur_status ur_cuda_tbe_status(cudaError_t err, const char *what) {
  return err == cudaSuccess ? UR_STATUS_OK : ur_cuda_tbe_fail(err, what);
}

static ur_status ur_cuda_tbe_work_bytes(const ur__tbe_args *a, int backward, size_t *out) {
  return ur_cuda_tbe_status(ur__cuda_tbe_work_bytes(a, backward, out), "workspace query");
}

static ur_status ur_cuda_tbe_forward(void *stream, const ur__tbe_args *a, void *work) {
  return ur_cuda_tbe_status(ur__cuda_tbe_forward((cudaStream_t)stream, a, work), "forward");
}

static ur_status ur_cuda_tbe_backward(void *stream, const ur__tbe_args *a, const ur__tbe_hyper *h,
                                      void *work) {
  return ur_cuda_tbe_status(ur__cuda_tbe_backward((cudaStream_t)stream, a, h, work), "backward");
}

static ur_status ur_cuda_tbe_sparse_count(void *stream, const ur__tbe_args *a, void *work,
                                          int64_t *counts) {
  return ur_cuda_tbe_status(ur__cuda_tbe_sparse_count((cudaStream_t)stream, a, work, counts),
                            "sparse gradient (count)");
}

static ur_status ur_cuda_tbe_sparse_write(void *stream, const ur__tbe_args *a, void *work,
                                          const int64_t *counts, int64_t *rows, float *grads) {
  return ur_cuda_tbe_status(
      ur__cuda_tbe_sparse_write((cudaStream_t)stream, a, work, counts, rows, grads),
      "sparse gradient (write)");
}

static ur_status ur_cuda_gather_rows(void *stream, const void *src, size_t row_bytes,
                                     const int64_t *ids, int64_t n, void *out) {
  return ur_cuda_tbe_status(ur__cuda_gather_rows((cudaStream_t)stream, src, row_bytes, ids, n, out),
                            "gather_rows");
}

static ur_status ur_cuda_tbe_decay_counts(void *stream, int32_t *c, int64_t n, double factor) {
  return ur_cuda_tbe_status(ur__cuda_tbe_decay_counts((cudaStream_t)stream, c, n, factor),
                            "counter decay");
}

void ur__cuda_tbe_install(ur_backend *b, const ur_core_api *core) {
  g_tbe_core = core;
  b->tbe_work_bytes = ur_cuda_tbe_work_bytes;
  b->tbe_forward = ur_cuda_tbe_forward;
  b->tbe_backward = ur_cuda_tbe_backward;
  b->tbe_sparse_count = ur_cuda_tbe_sparse_count;
  b->tbe_sparse_write = ur_cuda_tbe_sparse_write;
  b->gather_rows = ur_cuda_gather_rows;
  b->tbe_decay_counts = ur_cuda_tbe_decay_counts;
}
