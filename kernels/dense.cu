/* dense.cu: what the dense family's files share, and its table.  cuBLAS and cuBLASLt are
 * opened with dlopen on first use, so libuvmrec_cuda.so loads (and runs everything else)
 * without them; each device's state (SM count, shared-memory opt-in, cuBLAS handles) is made
 * once; each (device, stream) has its own workspace, grown when a larger one is needed, kept
 * until its stream is freed, and counted against the HBM budget.  The two ops that belong to no
 * layer live here, as in engine/src/dense/dense.c: the f32 <-> bf16 cast and the mean.  The table takes each file's entries (kernels/dense.cuh). */
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "common.cuh"
#include "dense.cuh"
#include "dense/dense.h"

#define UR_WORKSPACES 64

/* ---- cuBLAS and cuBLASLt, opened on first use ---- */

ur_blas_api ur__cuda_blas;
static pthread_once_t g_blas_once = PTHREAD_ONCE_INIT;
static char g_blas_why[512]; /* empty once loaded */

static void *ur_blas_open(const char *const *names) {
  void *h = NULL;
  for (int i = 0; names[i] && !h; i++) h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  return h;
}

/* The libraries stay loaded for the life of the process, as the handles made from them do. */
static void ur_blas_load_once(void) {
  static const char *const lt_names[] = {"libcublasLt.so.13", "libcublasLt.so", NULL};
  static const char *const blas_names[] = {"libcublas.so.13", "libcublas.so", NULL};
  /* Named as the libraries' short names, for the messages of UR_BLAS_LOAD. */
  void *cublasLt = ur_blas_open(lt_names), *cublas = cublasLt ? ur_blas_open(blas_names) : NULL;
  if (!cublasLt || !cublas) {
    snprintf(g_blas_why, sizeof g_blas_why, "%s not found: %s",
             cublasLt ? "libcublas.so.13" : "libcublasLt.so.13", dlerror());
    return;
  }
#define UR_BLAS_LOAD(lib, name, type)                                                              \
  if (!(ur__cuda_blas.name = (type)dlsym(lib, #name))) {                                           \
    snprintf(g_blas_why, sizeof g_blas_why, "lib%s has no %s", #lib, #name);                       \
    return;                                                                                        \
  }
  UR_BLAS_FNS(UR_BLAS_LOAD)
#undef UR_BLAS_LOAD
  g_blas_why[0] = 0;
}

static ur_status ur_blas_ready(void) {
  pthread_once(&g_blas_once, ur_blas_load_once);
  if (!g_blas_why[0]) return UR_STATUS_OK;
  return ur__cuda_core->set_error(UR_STATUS_UNSUPPORTED, "cuda: matrix products need cuBLAS: %s",
                                  g_blas_why);
}

ur_status ur__cuda_blas_fail(cublasStatus_t s, const char *what) {
  return ur__cuda_core->set_error(
      s == CUBLAS_STATUS_ALLOC_FAILED ? UR_STATUS_OOM : UR_STATUS_DEVICE,
      "cuda: %s failed: %s (%s)", what, ur__cuda_blas.cublasGetStatusName(s),
      ur__cuda_blas.cublasGetStatusString(s));
}

/* ---- per-device state ---- */

/* Guards the devices' state and the workspaces. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static ur_dense_dev g_dev[UR_MAX_GPUS + 1];

ur_status ur__cuda_dense_device(ur_dense_dev **out, int *device) {
  int dev = 0;
  UR_CUDA_CHECK(cudaGetDevice(&dev), "cudaGetDevice");
  if (dev < 0 || dev > UR_MAX_GPUS)
    return ur__cuda_core->set_error(UR_STATUS_UNSUPPORTED,
                                    "cuda: dense: GPU %d is beyond the %d supported", dev,
                                    UR_MAX_GPUS + 1);
  ur_status st = ur_blas_ready();
  if (st) return st;
  ur_dense_dev *d = &g_dev[dev];
  *device = dev;
  pthread_mutex_lock(&g_lock);
  if (!d->ready) {
    int sms = 0, optin = 0;
    cudaError_t e = ur__cuda_sms(&sms);
    if (e == cudaSuccess)
      e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (e != cudaSuccess) {
      st = ur__cuda_fail(e, "cudaDeviceGetAttribute on GPU %d", dev);
    } else {
      cublasStatus_t bs = ur__cuda_blas.cublasLtCreate(&d->lt);
      if (bs != CUBLAS_STATUS_SUCCESS) {
        st = ur__cuda_blas_fail(bs, "cublasLtCreate");
      } else if ((bs = ur__cuda_blas.cublasCreate_v2(&d->blas)) != CUBLAS_STATUS_SUCCESS) {
        ur__cuda_blas.cublasLtDestroy(d->lt);
        st = ur__cuda_blas_fail(bs, "cublasCreate");
      } else {
        d->sms = sms;
        d->smem_optin = (size_t)optin;
        d->ready = 1;
      }
    }
  }
  pthread_mutex_unlock(&g_lock);
  *out = d;
  return st;
}

/* ---- workspaces, one per (device, stream) ---- */

/* Each workspace's bytes count against the HBM budget (ur_core_api's workspace_take and
 * workspace_give, in ur_memory_stats' workspace): the budget stands for the whole GPU. */
typedef struct ur_dense_ws {
  int dev = 0;
  cudaStream_t stream;
  void *p;
  size_t bytes;
} ur_dense_ws;

static ur_dense_ws g_ws[UR_WORKSPACES];
static int g_nws;

/* Growing takes the added bytes from the budget first, so a workspace the budget does not hold
 * fails with its error and the old one stays as it was; then it waits for the stream's earlier
 * work, which may still be reading the old one, and replaces it. */
ur_status ur__cuda_dense_workspace(int dev, cudaStream_t stream, size_t bytes, void **out) {
  pthread_mutex_lock(&g_lock);
  ur_dense_ws *w = NULL;
  for (int i = 0; i < g_nws && !w; i++)
    if (g_ws[i].dev == dev && g_ws[i].stream == stream) w = &g_ws[i];
  if (!w && g_nws < UR_WORKSPACES) {
    w = &g_ws[g_nws++];
    w->dev = dev;
    w->stream = stream;
    w->p = NULL;
    w->bytes = 0;
  }
  ur_status st = UR_STATUS_OK;
  if (!w) {
    st = ur__cuda_core->set_error(UR_STATUS_UNSUPPORTED,
                                  "cuda: dense ops ran on more than %d streams; each keeps a "
                                  "workspace",
                                  UR_WORKSPACES);
  } else if (w->bytes < bytes) {
    size_t old = w->bytes;
    char what[160];
    snprintf(what, sizeof what,
             "the dense ops' workspace of stream %p on GPU %d (growing from %zu to %zu bytes)",
             (void *)stream, dev, old, bytes);
    st = ur__cuda_core->workspace_take(bytes - old, what);
    if (!st) {
      void *p = NULL;
      cudaError_t e = w->p ? cudaStreamSynchronize(stream) : cudaSuccess;
      if (e == cudaSuccess && w->p) e = cudaFree(w->p);
      if (e == cudaSuccess) w->p = NULL;
      if (e == cudaSuccess) e = cudaMalloc(&p, bytes);
      if (e == cudaSuccess) {
        w->p = p;
        w->bytes = bytes;
      } else {
        /* The wait or the free failed (a device error, which the runtime keeps), or the
         * allocation: the old workspace is dropped too, and both parts' bytes given back. */
        if (w->p) ur__cuda_drop(cudaFree(w->p));
        w->p = NULL;
        ur__cuda_core->workspace_give(bytes);
        w->bytes = 0;
        st = ur__cuda_fail(e, "replacing a %zu-byte dense workspace by one of %zu bytes on GPU %d",
                           old, bytes, dev);
      }
    }
  }
  if (!st) *out = w->p;
  pthread_mutex_unlock(&g_lock);
  return st;
}

void ur__cuda_dense_workspace_free(cudaStream_t stream) {
  pthread_mutex_lock(&g_lock);
  for (int i = 0; i < g_nws;) {
    ur_dense_ws *w = &g_ws[i];
    if (w->stream != stream) {
      i++;
      continue;
    }
    if (w->p) {
      int prev = 0;
      int back = cudaGetDevice(&prev) == cudaSuccess && prev != w->dev;
      if (back) ur__cuda_drop(cudaSetDevice(w->dev));
      ur__cuda_drop(cudaStreamSynchronize(stream));
      ur__cuda_drop(cudaFree(w->p));
      if (back) ur__cuda_drop(cudaSetDevice(prev));
      ur__cuda_core->workspace_give(w->bytes);
    }
    *w = g_ws[--g_nws];
  }
  pthread_mutex_unlock(&g_lock);
}

/* The entries of the freed stream (and of its side stream) go, so the tables never fill with
 * streams that are gone. */
void ur__cuda_dense_stream_gone(cudaStream_t stream) {
  ur__cuda_linear_stream_gone(stream);
  ur__cuda_dense_workspace_free(stream);
}

/* ---- cast ---- */

template <typename S, typename D>
__global__ void ur_cast_kernel(const S *src, D *dst, int64_t n) {
  UR_GRID_STRIDE(i, n) ur_st(dst, i, ur_ld(src, i));
}

static cudaError_t ur_cast_launch(cudaStream_t stream, const void *src, ur_dtype sd, void *dst,
                                  ur_dtype dd, int64_t n) {
  int sms = 0;
  cudaError_t e = ur__cuda_sms(&sms);
  if (e != cudaSuccess) return e;
  unsigned blocks = ur_dense_blocks(n, 256, sms);
  UR_DENSE_DISPATCH(sd, S,
    UR_DENSE_DISPATCH(dd, D,
      ur_cast_kernel<S, D><<<blocks, 256, 0, stream>>>((const S *)src, (D *)dst, n)));
  return cudaGetLastError();
}

static ur_status ur_cuda_cast(void *stream, const void *src, ur_dtype sd, void *dst, ur_dtype dd,
                              int64_t n) {
  if (sd == dd) {
    UR_CUDA_CHECK(cudaMemcpyAsync(dst, src, (size_t)n * ur_dense_esize(sd), cudaMemcpyDefault,
                                  (cudaStream_t)stream),
                  "cudaMemcpyAsync");
    return UR_STATUS_OK;
  }
  UR_CUDA_CHECK(ur_cast_launch((cudaStream_t)stream, src, sd, dst, dd, n),
                "cast kernel (%lld elements)", (long long)n);
  return UR_STATUS_OK;
}

/* ---- mean: one block, in double, in a fixed order ---- */

template <typename T>
__global__ void ur_mean_kernel(const T *x, float *out, int64_t n) {
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += ur_ld(x, i);
  s = ur_block_sum(s);
  if (threadIdx.x == 0) out[0] = (float)(s / (double)n);
}

static ur_status ur_cuda_mean(void *stream, const void *x, float *out, int64_t n, ur_dtype dtype) {
  UR_DENSE_DISPATCH(dtype, T,
    ur_mean_kernel<T><<<1, UR_SUM_THREADS, 0, (cudaStream_t)stream>>>((const T *)x, out, n));
  UR_CUDA_CHECK(cudaGetLastError(), "mean kernel (%lld elements)", (long long)n);
  return UR_STATUS_OK;
}

const ur_dense_ops ur__cuda_dense_ops = {
    .linear_forward = ur__cuda_linear_forward,
    .linear_backward = ur__cuda_linear_backward,
    .join = ur__cuda_dense_join,
    .act_forward = ur__cuda_act_forward,
    .act_backward = ur__cuda_act_backward,
    .interaction_forward = ur__cuda_interaction_forward,
    .interaction_backward = ur__cuda_interaction_backward,
    .cross_forward = ur__cuda_cross_forward,
    .cross_backward = ur__cuda_cross_backward,
    .copy_2d = ur__cuda_copy_2d,
    .bce_forward = ur__cuda_bce_forward,
    .bce_backward = ur__cuda_bce_backward,
    .mean = ur_cuda_mean,
    .cast = ur_cuda_cast,
    .optim_step = ur__cuda_optim_step,
    .optim_sumsq = ur__cuda_optim_sumsq,
    .optim_clip_factor = ur__cuda_optim_clip_factor,
};
