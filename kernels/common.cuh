/* common.cuh: what every file of the CUDA backend shares: the core's services, the one mapping
 * from CUDA's errors to statuses, and the checks built on it. */
#ifndef UR_KERNELS_COMMON_CUH
#define UR_KERNELS_COMMON_CUH

#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include "core/backend.h"

/* The core's services (errors, the interrupt flag), set by ur_cuda_backend_init. */
extern const ur_core_api *ur__cuda_core;

/* The op families' tables, one in each kernels/<family>.cu, which kernels/backend.cu hands
 * the core. */
extern const struct ur_dense_ops ur__cuda_dense_ops;
extern const struct ur_tbe_ops ur__cuda_tbe_ops;
extern const struct ur_cache_ops ur__cuda_cache_ops;
extern const struct ur_kjt_ops ur__cuda_kjt_ops;
extern const struct ur_synth_ops ur__cuda_synth_ops;
extern const struct ur_metrics_ops ur__cuda_metrics_ops;
extern const struct ur_qtbe_ops ur__cuda_qtbe_ops;
extern const struct ur_mc_ops ur__cuda_mc_ops;
extern const struct ur_comm_ops ur__cuda_comm_ops;

/* Reports a failed CUDA call as "cuda: <what> failed: <name> (<message>)": out of memory is
 * UR_STATUS_OOM, anything else UR_STATUS_DEVICE.  The runtime keeps the error as its "last
 * error" too; it is cleared so that the next launch check reports only itself. */
static inline ur_status ur__cuda_fail(cudaError_t err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static inline ur_status ur__cuda_fail(cudaError_t err, const char *fmt, ...) {
  char what[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  (void)cudaGetLastError();
  ur_status status = err == cudaErrorMemoryAllocation ? UR_STATUS_OOM : UR_STATUS_DEVICE;
  return ur__cuda_core->set_error(status, "cuda: %s failed: %s (%s)", what, cudaGetErrorName(err),
                                  cudaGetErrorString(err));
}

/* Returns from the calling function with the status of a failed CUDA call. */
#define UR_CUDA_CHECK(call, ...)                                             \
  do {                                                                       \
    cudaError_t ur_err_ = (call);                                            \
    if (ur_err_ != cudaSuccess) return ur__cuda_fail(ur_err_, __VA_ARGS__); \
  } while (0)

/* For void functions (free, destroy) on cleanup paths: a failure there must not replace the
 * error the caller is about to report, so it is dropped, and cleared from the runtime. */
static inline void ur__cuda_drop(cudaError_t err) {
  if (err != cudaSuccess) (void)cudaGetLastError();
}

/* The multiprocessors of the current device (kernels/backend.cu), cached per device: the
 * attribute query is a driver call, and launchers size their grids by it on every launch. */
cudaError_t ur__cuda_sms(int *sms);

/* kernels/dense.cu: before a stream is destroyed, the dense ops' workspaces kept for it (and
 * for its weight gradients' side stream) are freed and given back to the HBM budget. */
void ur__cuda_dense_stream_gone(cudaStream_t stream);

/* Blocks of per_block items each for `work` items, at most per_sm per multiprocessor (the
 * kernels' grid-stride loops do the rest), at least one. */
static inline unsigned ur_grid_blocks(int64_t work, int64_t per_block, int per_sm, int sms) {
  int64_t want = (work + per_block - 1) / per_block;
  int64_t cap = (int64_t)(sms > 0 ? sms : 1) * per_sm;
  return (unsigned)(want < 1 ? 1 : want < cap ? want : cap);
}

/* Copies from global into shared memory without registers (PTX ISA: cp.async): ur_cp16 (16
 * bytes, past L1) and ur_cp8 (8 bytes, through L1: 4 bf16 elements, a lane's slice of a half
 * row); a lane's copies are done after ur_cp_wait, the warp's after a __syncwarp that follows
 * it (where lanes read what other lanes copied). */
__device__ __forceinline__ unsigned ur_smem(const void *p) {
  return (unsigned)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void ur_cp16(void *dst, const void *src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(ur_smem(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void ur_cp8(void *dst, const void *src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(ur_smem(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void ur_cp_wait() { asm volatile("cp.async.wait_all;" ::: "memory"); }

/* Launches kernel k with smem bytes of dynamic shared memory, first raising its limit when it
 * needs more than the default 48 KiB. */
template <typename... P, typename... A>
static cudaError_t ur_launch_smem(void (*k)(P...), unsigned blocks, unsigned threads, size_t smem,
                                  cudaStream_t stream, A... args) {
  if (smem > 48u << 10) {
    cudaError_t e =
        cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
  }
  k<<<blocks, threads, smem, stream>>>(args...);
  return cudaGetLastError();
}

/* A workspace carved into 256-byte aligned pieces: take(bytes) is the next one, or nullptr when
 * base is (only measuring); at counts the bytes carved so far. */
struct ur__carver {
  char *base;
  size_t at;
  void *take(size_t bytes) {
    void *p = base ? base + at : nullptr;
    at += (bytes + 255) & ~(size_t)255;
    return p;
  }
};

#endif
