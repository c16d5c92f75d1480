/* dense.cu: the CUDA backend's dense table.  Matrix products go through cuBLASLt, with the
 * bias and ReLU fused into the epilogue; where cuBLASLt offers no algorithm for a shape,
 * cuBLAS runs the product and a kernel the epilogue.  Both libraries are opened with dlopen
 * on the first product, so libuvmrec_cuda.so loads (and runs everything else) without them.
 * Plans (descriptors and the chosen algorithm) are made once per shape and kept; each
 * (device, stream) has its own workspace, grown when a larger one is needed and kept, so a
 * steady training step allocates nothing.
 * The rest are the kernels of kernels/dense.cuh. */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common.cuh"
#include "dense.cuh"
#include "dense/dense.h"

#define UR_LT_WORKSPACE (32u << 20) /* cuBLASLt's workspace per stream, as NVIDIA advises */
#define UR_PLANS 512
#define UR_WORKSPACES 64


/* ---- cuBLAS and cuBLASLt, opened on first use ---- */

/* cublasGemmEx is overloaded in C++ (its compute type also as a cudaDataType): take this one. */
typedef cublasStatus_t (*ur_gemm_ex_fn)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int,
                                        int, int, const void *, const void *, cudaDataType, int,
                                        const void *, cudaDataType, int, const void *, void *,
                                        cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
#define UR_FN(name) decltype(&::name)

#define UR_BLAS_FNS(X)                                                                             \
  X(cublasLt, cublasLtCreate, UR_FN(cublasLtCreate))                                               \
  X(cublasLt, cublasLtDestroy, UR_FN(cublasLtDestroy))                                             \
  X(cublasLt, cublasLtMatmulDescCreate, UR_FN(cublasLtMatmulDescCreate))                           \
  X(cublasLt, cublasLtMatmulDescDestroy, UR_FN(cublasLtMatmulDescDestroy))                         \
  X(cublasLt, cublasLtMatmulDescSetAttribute, UR_FN(cublasLtMatmulDescSetAttribute))               \
  X(cublasLt, cublasLtMatrixLayoutCreate, UR_FN(cublasLtMatrixLayoutCreate))                       \
  X(cublasLt, cublasLtMatrixLayoutDestroy, UR_FN(cublasLtMatrixLayoutDestroy))                     \
  X(cublasLt, cublasLtMatmulPreferenceCreate, UR_FN(cublasLtMatmulPreferenceCreate))               \
  X(cublasLt, cublasLtMatmulPreferenceDestroy, UR_FN(cublasLtMatmulPreferenceDestroy))             \
  X(cublasLt, cublasLtMatmulPreferenceSetAttribute, UR_FN(cublasLtMatmulPreferenceSetAttribute))   \
  X(cublasLt, cublasLtMatmulAlgoGetHeuristic, UR_FN(cublasLtMatmulAlgoGetHeuristic))               \
  X(cublasLt, cublasLtMatmul, UR_FN(cublasLtMatmul))                                               \
  X(cublas, cublasCreate_v2, UR_FN(cublasCreate_v2))                                               \
  X(cublas, cublasSetStream_v2, UR_FN(cublasSetStream_v2))                                         \
  X(cublas, cublasGemmEx, ur_gemm_ex_fn)                                                           \
  X(cublas, cublasGetStatusName, UR_FN(cublasGetStatusName))                                       \
  X(cublas, cublasGetStatusString, UR_FN(cublasGetStatusString))

typedef struct ur_blas_api {
#define UR_BLAS_FIELD(lib, name, type) type name;
  UR_BLAS_FNS(UR_BLAS_FIELD)
#undef UR_BLAS_FIELD
} ur_blas_api;

static ur_blas_api g_blas;
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
  if (!(g_blas.name = (type)dlsym(lib, #name))) {                                                  \
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

/* ---- errors ---- */

static ur_status ur_blas_fail(cublasStatus_t s, const char *what) {
  return ur__cuda_core->set_error(s == CUBLAS_STATUS_ALLOC_FAILED ? UR_STATUS_OOM : UR_STATUS_DEVICE,
                           "cuda: %s failed: %s (%s)", what, g_blas.cublasGetStatusName(s),
                           g_blas.cublasGetStatusString(s));
}


/* ---- per-device state ---- */

typedef struct ur_dense_dev {
  int ready;
  int sms;
  size_t smem_optin;        /* shared memory a block may opt into */
  cublasLtHandle_t lt;
  cublasHandle_t blas;
} ur_dense_dev;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static ur_dense_dev g_dev[UR_MAX_GPUS + 1];

static ur_status ur_dense_device(ur_dense_dev **out, int *device) {
  int dev = 0;
  UR_CUDA_CHECK(cudaGetDevice(&dev), "cudaGetDevice");
  if (dev < 0 || dev > UR_MAX_GPUS)
    return ur__cuda_core->set_error(UR_STATUS_UNSUPPORTED,
                             "cuda: dense: GPU %d is beyond the %d supported",
                             dev, UR_MAX_GPUS + 1);
  ur_status st = ur_blas_ready();
  if (st) return st;
  ur_dense_dev *d = &g_dev[dev];
  *device = dev;
  pthread_mutex_lock(&g_lock);
  if (!d->ready) {
    int sms = 0, optin = 0;
    cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e == cudaSuccess)
      e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (e != cudaSuccess) {
      st = ur__cuda_fail(e, "cudaDeviceGetAttribute on GPU %d", dev);
    } else {
      cublasStatus_t bs = g_blas.cublasLtCreate(&d->lt);
      if (bs != CUBLAS_STATUS_SUCCESS) {
        st = ur_blas_fail(bs, "cublasLtCreate");
      } else if ((bs = g_blas.cublasCreate_v2(&d->blas)) != CUBLAS_STATUS_SUCCESS) {
        g_blas.cublasLtDestroy(d->lt);
        st = ur_blas_fail(bs, "cublasCreate");
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

typedef struct ur_dense_ws {
  int dev = 0;
  cudaStream_t stream;
  void *p;
  size_t bytes;
} ur_dense_ws;

static ur_dense_ws g_ws[UR_WORKSPACES];
static int g_nws;

/* A workspace of at least `bytes` for work on `stream`; work on one stream is ordered, so it
 * is never used twice at once.  Growing waits for the stream's earlier work, which may still
 * be reading the old one. */
static ur_status ur_dense_workspace(int dev, cudaStream_t stream, size_t bytes, void **out) {
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
                           "cuda: dense ops ran on more than %d streams; each keeps a workspace",
                           UR_WORKSPACES);
  } else if (w->bytes < bytes) {
    cudaError_t e = w->p ? cudaStreamSynchronize(stream) : cudaSuccess;
    if (e == cudaSuccess && w->p) e = cudaFree(w->p);
    w->p = NULL;
    w->bytes = 0;
    if (e == cudaSuccess) e = cudaMalloc(&w->p, bytes);
    if (e != cudaSuccess) st = ur__cuda_fail(e, "cudaMalloc of a %zu-byte dense workspace", bytes);
    else w->bytes = bytes;
  }
  if (!st) *out = w->p;
  pthread_mutex_unlock(&g_lock);
  return st;
}

/* ---- matrix products ---- */

/* D (m x n, column-major, ldd) = alpha op(A) op(B) + beta C, with C = D, as cuBLAS sees it. */
typedef struct ur_mm_key {
  int dev, ta, tb, epi;
  int64_t m, n, k, lda, ldb, ldd;
  cudaDataType_t ab, cd;
  cublasComputeType_t compute;
  unsigned align_a, align_b, align_d;
} ur_mm_key;

typedef struct ur_mm_plan {
  ur_mm_key key;
  int usable;               /* 0: cuBLASLt has no algorithm: cuBLAS runs it */
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t a, b, d;
  cublasLtMatmulAlgo_t algo;
} ur_mm_plan;

static ur_mm_plan g_plans[UR_PLANS];
static int g_nplans;

static unsigned ur_align(const void *p) {
  uintptr_t v = (uintptr_t)p;
  unsigned a = 256;
  while (a > 1 && v % a) a >>= 1;
  return a;
}

static void ur_plan_destroy(ur_mm_plan *p) {
  if (p->a) g_blas.cublasLtMatrixLayoutDestroy(p->a);
  if (p->b) g_blas.cublasLtMatrixLayoutDestroy(p->b);
  if (p->d) g_blas.cublasLtMatrixLayoutDestroy(p->d);
  if (p->desc) g_blas.cublasLtMatmulDescDestroy(p->desc);
}

/* Call with g_lock held. */
static ur_status ur_plan_make(ur_dense_dev *dv, const ur_mm_key *k, ur_mm_plan *p) {
  memset(p, 0, sizeof *p);
  p->key = *k;
  cublasOperation_t ta = k->ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = k->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasLtEpilogue_t epi = (cublasLtEpilogue_t)k->epi;
  cublasStatus_t s = g_blas.cublasLtMatmulDescCreate(&p->desc, k->compute, CUDA_R_32F);
  cublasLtMatmulDesc_t dd = p->desc;
  const cublasLtMatmulDescAttributes_t dwhat[3] = {
      CUBLASLT_MATMUL_DESC_TRANSA, CUBLASLT_MATMUL_DESC_TRANSB, CUBLASLT_MATMUL_DESC_EPILOGUE};
  const void *dval[3] = {&ta, &tb, &epi};
  const size_t dlen[3] = {sizeof ta, sizeof tb, sizeof epi};
  for (int i = 0; i < 3 && !s; i++)
    s = g_blas.cublasLtMatmulDescSetAttribute(dd, dwhat[i], dval[i], dlen[i]);
  /* Layouts describe the matrices as stored: op(A) is m x k, so A is k x m when transposed. */
  uint64_t ar = k->ta ? k->k : k->m, ac = k->ta ? k->m : k->k;
  uint64_t br = k->tb ? k->n : k->k, bc = k->tb ? k->k : k->n;
  if (!s) s = g_blas.cublasLtMatrixLayoutCreate(&p->a, k->ab, ar, ac, k->lda);
  if (!s) s = g_blas.cublasLtMatrixLayoutCreate(&p->b, k->ab, br, bc, k->ldb);
  if (!s) s = g_blas.cublasLtMatrixLayoutCreate(&p->d, k->cd, k->m, k->n, k->ldd);
  cublasLtMatmulPreference_t pref = NULL;
  if (!s) s = g_blas.cublasLtMatmulPreferenceCreate(&pref);
  uint64_t ws = UR_LT_WORKSPACE;
  uint32_t al[3] = {k->align_a, k->align_b, k->align_d};
  const cublasLtMatmulPreferenceAttributes_t what[5] = {
      CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  const void *val[5] = {&ws, &al[0], &al[1], &al[2], &al[2]};
  const size_t len[5] = {sizeof ws, sizeof al[0], sizeof al[1], sizeof al[2], sizeof al[2]};
  for (int i = 0; i < 5 && !s; i++)
    s = g_blas.cublasLtMatmulPreferenceSetAttribute(pref, what[i], val[i], len[i]);
  if (s) {
    if (pref) g_blas.cublasLtMatmulPreferenceDestroy(pref);
    ur_plan_destroy(p);
    return ur_blas_fail(s, "cuBLASLt descriptor setup");
  }
  cublasLtMatmulHeuristicResult_t res;
  int found = 0;
  s = g_blas.cublasLtMatmulAlgoGetHeuristic(dv->lt, p->desc, p->a, p->b, p->d, p->d, pref, 1, &res,
                                            &found);
  g_blas.cublasLtMatmulPreferenceDestroy(pref);
  /* No algorithm (NOT_SUPPORTED, or none found) is not an error: cuBLAS takes the shape. */
  p->usable = s == CUBLAS_STATUS_SUCCESS && found > 0;
  if (p->usable) p->algo = res.algo;
  return UR_STATUS_OK;
}

static ur_status ur_plan_get(ur_dense_dev *dv, const ur_mm_key *k, ur_mm_plan **out) {
  for (int i = 0; i < g_nplans; i++)
    if (!memcmp(&g_plans[i].key, k, sizeof *k)) {
      *out = &g_plans[i];
      return UR_STATUS_OK;
    }
  /* A full cache is emptied: shapes come back, and plans are cheap to make again. */
  if (g_nplans == UR_PLANS) {
    for (int i = 0; i < g_nplans; i++) ur_plan_destroy(&g_plans[i]);
    g_nplans = 0;
  }
  ur_status st = ur_plan_make(dv, k, &g_plans[g_nplans]);
  if (st) return st;
  *out = &g_plans[g_nplans++];
  return UR_STATUS_OK;
}

static cudaDataType_t ur_cuda_type(ur_dtype d) {
  return d == UR_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

/* Element bytes of a dense dtype (this library links nothing of the core's). */
static size_t ur_esize(ur_dtype d) { return d == UR_DTYPE_BF16 ? 2 : 4; }

/* Runs one product (the key's); bias (m values of cd's type) and relu make the epilogue. */
static ur_status ur_matmul(ur_dense_dev *dv, int dev, cudaStream_t stream, ur_mm_key *k,
                           const void *A, const void *B, void *D, const void *bias, int relu,
                           float beta) {
  k->dev = dev;
  k->epi = bias ? (relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS)
                : (relu ? CUBLASLT_EPILOGUE_RELU : CUBLASLT_EPILOGUE_DEFAULT);
  k->align_a = ur_align(A);
  k->align_b = ur_align(B);
  k->align_d = ur_align(D);
  void *ws = NULL;
  ur_status st = ur_dense_workspace(dev, stream, UR_LT_WORKSPACE, &ws);
  if (st) return st;
  float alpha = 1.0f;
  pthread_mutex_lock(&g_lock);
  ur_mm_plan *p = NULL;
  st = ur_plan_get(dv, k, &p);
  int fallback = !st && !p->usable;
  if (!st && p->usable) {
    /* The descriptor is shared by every call of this shape: set and use it under the lock. */
    cublasStatus_t s = g_blas.cublasLtMatmulDescSetAttribute(
        p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
    if (!s)
      s = g_blas.cublasLtMatmul(dv->lt, p->desc, &alpha, A, p->a, B, p->b, &beta, D, p->d, D, p->d,
                         &p->algo, ws, UR_LT_WORKSPACE, stream);
    if (s == CUBLAS_STATUS_NOT_SUPPORTED) {
      p->usable = 0;
      fallback = 1;
    } else if (s) {
      st = ur_blas_fail(s, "cublasLtMatmul");
    }
  }
  if (fallback) {
    cublasStatus_t s = g_blas.cublasSetStream_v2(dv->blas, stream);
    if (!s)
      s = g_blas.cublasGemmEx(dv->blas, k->ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                              k->tb ? CUBLAS_OP_T : CUBLAS_OP_N, (int)k->m, (int)k->n, (int)k->k,
                              &alpha, A, k->ab, (int)k->lda, B, k->ab, (int)k->ldb, &beta, D,
                              k->cd, (int)k->ldd, k->compute, CUBLAS_GEMM_DEFAULT);
    if (s) st = ur_blas_fail(s, "cublasGemmEx");
  }
  pthread_mutex_unlock(&g_lock);
  if (!st && fallback && (bias || relu))
    UR_CUDA_CHECK(ur__cuda_bias_act(stream, D, bias, k->n, k->m,
                                k->cd == CUDA_R_16BF ? UR_DTYPE_BF16 : UR_DTYPE_F32,
                                relu ? UR_ACT_RELU : UR_ACT_NONE),
              "bias/activation kernel (%lld x %lld)", (long long)k->n, (long long)k->m);
  return st;
}

static cublasComputeType_t ur_compute(ur_dtype d, uint32_t flags) {
  return d == UR_DTYPE_F32 && (flags & UR_DENSE_TF32) ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                      : CUBLAS_COMPUTE_32F;
}

/* Row-major y[rows, out] = x[rows, in] w[out, in]^T is, column-major, y^T = w^T' x^T: cuBLAS's
 * D (out x rows) = op(A = w as in x out, transposed) B (x as in x rows). */
static ur_status ur_cuda_linear_forward(void *stream, const void *x, const void *w, const void *b,
                                        void *y, int64_t rows, int64_t in, int64_t out,
                                        ur_dtype dtype, ur_act act, uint32_t flags) {
  ur_dense_dev *dv = NULL;
  int dev = 0;
  ur_status st = ur_dense_device(&dv, &dev);
  if (st) return st;
  cudaStream_t s = (cudaStream_t)stream;
  if (in == 0) {
    UR_CUDA_CHECK(cudaMemsetAsync(y, 0, (size_t)(rows * out) * ur_esize(dtype), s), "cudaMemsetAsync");
    UR_CUDA_CHECK(ur__cuda_bias_act(s, y, b, rows, out, dtype, act), "bias/activation kernel");
    return UR_STATUS_OK;
  }
  ur_mm_key k;
  memset(&k, 0, sizeof k);
  k.ta = 1;
  k.tb = 0;
  k.m = out;
  k.n = rows;
  k.k = in;
  k.lda = in;
  k.ldb = in;
  k.ldd = out;
  k.ab = k.cd = ur_cuda_type(dtype);
  k.compute = ur_compute(dtype, flags);
  return ur_matmul(dv, dev, s, &k, w, x, y, b, act == UR_ACT_RELU, 0.0f);
}

static ur_status ur_cuda_linear_backward(void *stream, const void *x, const void *w,
                                         const void *y, const void *gy, void *gx, float *gw,
                                         float *gb, void *work, int64_t rows, int64_t in,
                                         int64_t out, ur_dtype dtype, ur_act act,
                                         uint32_t flags) {
  ur_dense_dev *dv = NULL;
  int dev = 0;
  ur_status st = ur_dense_device(&dv, &dev);
  if (st) return st;
  cudaStream_t s = (cudaStream_t)stream;
  int relu = act == UR_ACT_RELU;
  const void *g = gy;
  if ((relu || gb) && out > 0) {
    /* The partial sums sit after cuBLASLt's part of the stream's workspace. */
    int64_t chunks = ur__cuda_bgrad_chunks(rows, out, dv->sms);
    void *ws = NULL;
    size_t part = gb ? (size_t)(chunks * out) * sizeof(float) : 0;
    if ((st = ur_dense_workspace(dev, s, UR_LT_WORKSPACE + part, &ws))) return st;
    float *partial = (float *)((char *)ws + UR_LT_WORKSPACE);
    UR_CUDA_CHECK(ur__cuda_relu_bgrad(s, gy, relu ? y : NULL, relu ? work : NULL, gb, partial, rows,
                                  out, dtype, dv->sms),
              "relu mask / bias gradient kernel (%lld x %lld)", (long long)rows, (long long)out);
    if (relu) g = work;
  }
  int acc = (flags & UR_DENSE_ACCUMULATE) != 0;
  ur_mm_key k;
  if (gx && in > 0) {
    if (out == 0) {
      if (!acc)
        UR_CUDA_CHECK(cudaMemsetAsync(gx, 0, (size_t)(rows * in) * ur_esize(dtype), s),
                  "cudaMemsetAsync");
    } else {
      /* gx^T (in x rows) = w^T (as stored: in x out) g^T (out x rows). */
      memset(&k, 0, sizeof k);
      k.m = in;
      k.n = rows;
      k.k = out;
      k.lda = in;
      k.ldb = out;
      k.ldd = in;
      k.ab = k.cd = ur_cuda_type(dtype);
      k.compute = ur_compute(dtype, flags);
      if ((st = ur_matmul(dv, dev, s, &k, w, g, gx, NULL, 0, acc ? 1.0f : 0.0f))) return st;
    }
  }
  if (gw && in > 0 && out > 0) {
    /* gw^T (in x out) += x^T (in x rows) op(g^T (out x rows)) with op a transpose. */
    memset(&k, 0, sizeof k);
    k.tb = 1;
    k.m = in;
    k.n = out;
    k.k = rows;
    k.lda = in;
    k.ldb = out;
    k.ldd = in;
    k.ab = ur_cuda_type(dtype);
    k.cd = CUDA_R_32F;
    k.compute = ur_compute(dtype, flags);
    if ((st = ur_matmul(dv, dev, s, &k, x, g, gw, NULL, 0, 1.0f))) return st;
  }
  return UR_STATUS_OK;
}

/* ---- the rest ---- */

static ur_status ur_cuda_act_forward(void *stream, const void *x, void *y, int64_t n,
                                     ur_dtype dtype, ur_act act) {
  UR_CUDA_CHECK(ur__cuda_act_forward((cudaStream_t)stream, x, y, n, dtype, act),
            "activation kernel (%lld elements)", (long long)n);
  return UR_STATUS_OK;
}

static ur_status ur_cuda_act_backward(void *stream, const void *y, const void *gy, void *gx,
                                      int64_t n, ur_dtype dtype, ur_act act) {
  UR_CUDA_CHECK(ur__cuda_act_backward((cudaStream_t)stream, y, gy, gx, n, dtype, act),
            "activation gradient kernel (%lld elements)", (long long)n);
  return UR_STATUS_OK;
}

/* The interaction kernels keep one row in shared memory: check it fits, and raise the
 * kernels' limit past the default 48 KiB when it must. */
static ur_status ur_inter_ready(ur_dense_dev *dv, int tables, int dim, ur_dtype dd, ur_dtype ed,
                                ur_dtype od) {
  size_t need = ur__cuda_interaction_smem(tables, dim, 1);
  if (need > dv->smem_optin)
    return ur__cuda_core->set_error(UR_STATUS_UNSUPPORTED,
                             "cuda: interaction of %d tables of width %d needs %zu bytes of "
                             "shared memory per block; this GPU has %zu",
                             tables, dim, need, dv->smem_optin);
  if (need <= 48u << 10) return UR_STATUS_OK;
  UR_CUDA_CHECK(ur__cuda_interaction_prepare(need, dd, ed, od),
            "cudaFuncSetAttribute(MaxDynamicSharedMemorySize %zu) for the interaction", need);
  return UR_STATUS_OK;
}

static ur_status ur_cuda_interaction_forward(void *stream, const void *dense, const void *emb,
                                             void *out, int64_t rows, int32_t tables, int32_t dim,
                                             int32_t self, ur_dtype dd, ur_dtype ed, ur_dtype od) {
  ur_dense_dev *dv = NULL;
  int dev = 0;
  ur_status st = ur_dense_device(&dv, &dev);
  if (!st) st = ur_inter_ready(dv, tables, dim, dd, ed, od);
  if (st) return st;
  UR_CUDA_CHECK(ur__cuda_interaction_forward((cudaStream_t)stream, dense, emb, out, rows, tables, dim,
                                         self, dd, ed, od, dv->sms),
            "interaction kernel (%lld rows, %d tables of %d)", (long long)rows, (int)tables,
            (int)dim);
  return UR_STATUS_OK;
}

static ur_status ur_cuda_interaction_backward(void *stream, const void *dense, const void *emb,
                                              const void *gout, void *gdense, void *gemb,
                                              int64_t rows, int32_t tables, int32_t dim,
                                              int32_t self, ur_dtype dd, ur_dtype ed,
                                              ur_dtype od) {
  ur_dense_dev *dv = NULL;
  int dev = 0;
  ur_status st = ur_dense_device(&dv, &dev);
  if (!st) st = ur_inter_ready(dv, tables, dim, dd, ed, od);
  if (st) return st;
  UR_CUDA_CHECK(ur__cuda_interaction_backward((cudaStream_t)stream, dense, emb, gout, gdense, gemb,
                                          rows, tables, dim, self, dd, ed, od, dv->sms),
            "interaction gradient kernel (%lld rows, %d tables of %d)", (long long)rows,
            (int)tables, (int)dim);
  return UR_STATUS_OK;
}

static ur_status ur_cuda_cross_forward(void *stream, const void *x0, const void *z,
                                       const void *xl, void *y, int64_t n, ur_dtype dtype) {
  UR_CUDA_CHECK(ur__cuda_cross_forward((cudaStream_t)stream, x0, z, xl, y, n, dtype),
            "cross kernel (%lld elements)", (long long)n);
  return UR_STATUS_OK;
}

static ur_status ur_cuda_cross_backward(void *stream, const void *x0, const void *z,
                                        const void *gy, void *gz, void *gx0, void *gxl, int64_t n,
                                        ur_dtype dtype, uint32_t flags) {
  UR_CUDA_CHECK(ur__cuda_cross_backward((cudaStream_t)stream, x0, z, gy, gz, gx0, gxl, n, dtype,
                                    (flags & UR_DENSE_ACCUMULATE) != 0),
            "cross gradient kernel (%lld elements)", (long long)n);
  return UR_STATUS_OK;
}

static ur_status ur_cuda_copy_2d(void *stream, void *dst, size_t dpitch, const void *src,
                                 size_t spitch, size_t width, size_t rows) {
  UR_CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDefault,
                              (cudaStream_t)stream),
            "cudaMemcpy2DAsync (%zu rows of %zu bytes)", rows, width);
  return UR_STATUS_OK;
}

static ur_status ur_cuda_bce_forward(void *stream, const void *logits, const float *targets,
                                     const float *weights, float *loss, int64_t n, ur_dtype dtype,
                                     ur_reduction reduction) {
  UR_CUDA_CHECK(ur__cuda_bce_forward((cudaStream_t)stream, logits, targets, weights, loss, n, dtype,
                                 reduction),
            "bce kernel (%lld samples)", (long long)n);
  return UR_STATUS_OK;
}

static ur_status ur_cuda_bce_backward(void *stream, const void *logits, const float *targets,
                                      const float *weights, void *glogits, int64_t n,
                                      ur_dtype dtype, ur_reduction reduction, double scale) {
  double k = reduction == UR_REDUCTION_MEAN ? scale / (double)n : scale;
  UR_CUDA_CHECK(ur__cuda_bce_backward((cudaStream_t)stream, logits, targets, weights, glogits, n,
                                  dtype, k),
            "bce gradient kernel (%lld samples)", (long long)n);
  return UR_STATUS_OK;
}

static ur_status ur_cuda_mean(void *stream, const void *x, float *out, int64_t n, ur_dtype dtype) {
  UR_CUDA_CHECK(ur__cuda_mean((cudaStream_t)stream, x, out, n, dtype), "mean kernel (%lld elements)",
            (long long)n);
  return UR_STATUS_OK;
}

static ur_status ur_cuda_cast(void *stream, const void *src, ur_dtype sd, void *dst, ur_dtype dd,
                              int64_t n) {
  if (sd == dd) {
    UR_CUDA_CHECK(cudaMemcpyAsync(dst, src, (size_t)n * ur_esize(sd), cudaMemcpyDefault,
                              (cudaStream_t)stream),
              "cudaMemcpyAsync");
    return UR_STATUS_OK;
  }
  UR_CUDA_CHECK(ur__cuda_cast((cudaStream_t)stream, src, sd, dst, dd, n), "cast kernel (%lld elements)",
            (long long)n);
  return UR_STATUS_OK;
}

/* The same constants as engine/src/optim.c computes for the CPU. */
static ur_status ur_cuda_optim_step(void *stream, const ur_optim_cfg *c, int32_t n,
                                    float *const *params, float *const *grads, float *const *s1,
                                    float *const *s2, void *const *halves, const int64_t *numel) {
  ur__cuda_optim_consts k;
  k.kind = c->kind;
  k.nesterov = c->nesterov;
  k.first = c->step == 1;
  k.zero = c->zero_grad;
  k.lr = (float)c->lr;
  k.wd = (float)c->weight_decay;
  k.mom = (float)c->momentum;
  k.b1 = (float)c->beta1;
  k.b2 = (float)c->beta2;
  k.eps = (float)c->eps;
  double t = (double)c->step;
  k.step_size = (float)(c->lr / (1.0 - pow(c->beta1, t)));
  k.bc2_sqrt = (float)sqrt(1.0 - pow(c->beta2, t));
  k.decay = (float)(1.0 - c->lr * c->weight_decay);
  for (int32_t i = 0; i < n; i += UR__CUDA_OPTIM_MAX) {
    int m = n - i < UR__CUDA_OPTIM_MAX ? (int)(n - i) : UR__CUDA_OPTIM_MAX;
    UR_CUDA_CHECK(ur__cuda_optim_step((cudaStream_t)stream, &k, m, params + i, grads + i, s1 + i,
                                  s2 + i, halves + i, numel + i, 0),
              "optimizer kernel (%d tensors)", m);
  }
  return UR_STATUS_OK;
}

const ur_dense_ops ur__cuda_dense_ops = {
    .linear_forward = ur_cuda_linear_forward,
    .linear_backward = ur_cuda_linear_backward,
    .act_forward = ur_cuda_act_forward,
    .act_backward = ur_cuda_act_backward,
    .interaction_forward = ur_cuda_interaction_forward,
    .interaction_backward = ur_cuda_interaction_backward,
    .cross_forward = ur_cuda_cross_forward,
    .cross_backward = ur_cuda_cross_backward,
    .copy_2d = ur_cuda_copy_2d,
    .bce_forward = ur_cuda_bce_forward,
    .bce_backward = ur_cuda_bce_backward,
    .mean = ur_cuda_mean,
    .cast = ur_cuda_cast,
    .optim_step = ur_cuda_optim_step,
};
