/* linear.cu: the Linear layer and the activations (engine/src/dense/linear.c) on the GPU.
 * Matrix products go through cuBLASLt, with the bias and ReLU fused into the epilogue; where
 * cuBLASLt offers no algorithm for a shape, cuBLAS runs the product and a kernel the epilogue.
 * Plans (descriptors and the chosen algorithm) are made once per shape and kept.  The
 * backward's ReLU mask is fused with the bias gradient, a column sum made deterministic by
 * summing fixed chunks of rows into partials and then the partials in order.  Activations
 * (ReLU, sigmoid) and their gradients from the output are grid-stride loops with math in f32,
 * as on the CPU. */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <string.h>

#include "common.cuh"
#include "dense.cuh"

#define UR_LT_WORKSPACE (32u << 20) /* cuBLASLt's workspace per stream, as NVIDIA advises */
#define UR_PLANS 512
#define UR_BGRAD_COLS 32 /* columns per block: one warp across them */
#define UR_BGRAD_ROWS 8  /* warps per block, each on every 8th row of the chunk */

template <typename T>
__global__ void ur_bias_act_kernel(T *y, const T *b, int64_t rows, int64_t cols, int act) {
  int64_t n = rows * cols, stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    float v = ur_ld(y, i);
    if (b) v += ur_ld(b, i % cols);
    if (act == UR_ACT_RELU) v = v > 0.0f ? v : 0.0f;
    ur_st(y, i, v);
  }
}

/* y[rows, cols] = act(y + b[cols]) (b may be NULL): the epilogue when cuBLAS runs the product. */
static cudaError_t ur_bias_act_launch(cudaStream_t stream, void *y, const void *b, int64_t rows,
                                      int64_t cols, ur_dtype dtype, int act) {
  int sms = 0;
  cudaError_t e = ur__cuda_dense_sms(&sms);
  if (e != cudaSuccess) return e;
  UR_DENSE_DISPATCH(dtype, T,
    ur_bias_act_kernel<T><<<ur_dense_blocks(rows * cols, 256, sms), 256, 0, stream>>>(
        (T *)y, (const T *)b, rows, cols, act));
  return cudaGetLastError();
}

/* Rows a chunk of the bias-gradient reduction covers, and how many chunks there are: the
 * backward sizes its workspace (chunks * cols floats) with these. */
static int64_t ur_bgrad_chunks(int64_t rows, int64_t cols, int sms) {
  int64_t tiles = (cols + UR_BGRAD_COLS - 1) / UR_BGRAD_COLS;
  int64_t want = ((int64_t)(sms > 0 ? sms : 1) * 4 + tiles - 1) / tiles;
  int64_t most = (rows + UR_BGRAD_ROWS - 1) / UR_BGRAD_ROWS;
  if (want > most) want = most;
  if (want > 65535) want = 65535;
  return want < 1 ? 1 : want;
}

/* Block (32, 8): x walks columns (coalesced), y rows; blockIdx.y is the chunk of rows. */
template <typename T>
__global__ void ur_relu_bgrad_kernel(const T *gy, const T *y, T *g, float *partial, int64_t rows,
                                     int64_t cols, int64_t per_chunk) {
  __shared__ float acc[UR_BGRAD_ROWS][UR_BGRAD_COLS + 1];
  int64_t col = (int64_t)blockIdx.x * UR_BGRAD_COLS + threadIdx.x;
  int64_t r0 = (int64_t)blockIdx.y * per_chunk;
  int64_t r1 = r0 + per_chunk < rows ? r0 + per_chunk : rows;
  float s = 0.0f;
  if (col < cols) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += UR_BGRAD_ROWS) {
      int64_t i = r * cols + col;
      T v = gy[i];
      if (y) {
        if (!(ur_ld(y, i) > 0.0f)) v = T(0.0f);
        g[i] = v;
      }
      s += (float)v;
    }
  }
  acc[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (partial && threadIdx.y == 0 && col < cols) {
    float t = 0.0f;
    for (int k = 0; k < UR_BGRAD_ROWS; k++) t += acc[k][threadIdx.x];
    partial[(int64_t)blockIdx.y * cols + col] = t;
  }
}

__global__ void ur_bgrad_sum_kernel(const float *partial, float *gb, int64_t chunks,
                                    int64_t cols) {
  int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  float s = 0.0f;
  for (int64_t c = 0; c < chunks; c++) s += partial[c * cols + col];
  gb[col] += s;
}

/* g = gy masked by y > 0 (when y is not NULL; g then must be given) and gb[cols] += column sums
 * of g (when gb is not NULL), deterministically: fixed chunks of rows summed into partial
 * (chunks * cols floats), then the chunks in order. */
static cudaError_t ur_relu_bgrad_launch(cudaStream_t stream, const void *gy, const void *y,
                                        void *g, float *gb, float *partial, int64_t rows,
                                        int64_t cols, ur_dtype dtype, int sms) {
  int64_t chunks = ur_bgrad_chunks(rows, cols, sms);
  int64_t per = (rows + chunks - 1) / chunks;
  dim3 grid((unsigned)((cols + UR_BGRAD_COLS - 1) / UR_BGRAD_COLS), (unsigned)chunks);
  dim3 block(UR_BGRAD_COLS, UR_BGRAD_ROWS);
  UR_DENSE_DISPATCH(dtype, T,
    ur_relu_bgrad_kernel<T><<<grid, block, 0, stream>>>((const T *)gy, (const T *)y, (T *)g,
                                                        gb ? partial : NULL, rows, cols, per));
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess || !gb) return e;
  ur_bgrad_sum_kernel<<<(unsigned)((cols + 255) / 256), 256, 0, stream>>>(partial, gb, chunks,
                                                                          cols);
  return cudaGetLastError();
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

/* Guards the plans, and each descriptor while a product uses it. */
static pthread_mutex_t g_plan_lock = PTHREAD_MUTEX_INITIALIZER;
static ur_mm_plan g_plans[UR_PLANS];
static int g_nplans;

static unsigned ur_align(const void *p) {
  uintptr_t v = (uintptr_t)p;
  unsigned a = 256;
  while (a > 1 && v % a) a >>= 1;
  return a;
}

static void ur_plan_destroy(ur_mm_plan *p) {
  if (p->a) ur__cuda_blas.cublasLtMatrixLayoutDestroy(p->a);
  if (p->b) ur__cuda_blas.cublasLtMatrixLayoutDestroy(p->b);
  if (p->d) ur__cuda_blas.cublasLtMatrixLayoutDestroy(p->d);
  if (p->desc) ur__cuda_blas.cublasLtMatmulDescDestroy(p->desc);
}

/* Call with g_plan_lock held. */
static ur_status ur_plan_make(ur_dense_dev *dv, const ur_mm_key *k, ur_mm_plan *p) {
  memset(p, 0, sizeof *p);
  p->key = *k;
  cublasOperation_t ta = k->ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = k->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasLtEpilogue_t epi = (cublasLtEpilogue_t)k->epi;
  cublasStatus_t s = ur__cuda_blas.cublasLtMatmulDescCreate(&p->desc, k->compute, CUDA_R_32F);
  cublasLtMatmulDesc_t dd = p->desc;
  const cublasLtMatmulDescAttributes_t dwhat[3] = {
      CUBLASLT_MATMUL_DESC_TRANSA, CUBLASLT_MATMUL_DESC_TRANSB, CUBLASLT_MATMUL_DESC_EPILOGUE};
  const void *dval[3] = {&ta, &tb, &epi};
  const size_t dlen[3] = {sizeof ta, sizeof tb, sizeof epi};
  for (int i = 0; i < 3 && !s; i++)
    s = ur__cuda_blas.cublasLtMatmulDescSetAttribute(dd, dwhat[i], dval[i], dlen[i]);
  /* Layouts describe the matrices as stored: op(A) is m x k, so A is k x m when transposed. */
  uint64_t ar = k->ta ? k->k : k->m, ac = k->ta ? k->m : k->k;
  uint64_t br = k->tb ? k->n : k->k, bc = k->tb ? k->k : k->n;
  if (!s) s = ur__cuda_blas.cublasLtMatrixLayoutCreate(&p->a, k->ab, ar, ac, k->lda);
  if (!s) s = ur__cuda_blas.cublasLtMatrixLayoutCreate(&p->b, k->ab, br, bc, k->ldb);
  if (!s) s = ur__cuda_blas.cublasLtMatrixLayoutCreate(&p->d, k->cd, k->m, k->n, k->ldd);
  cublasLtMatmulPreference_t pref = NULL;
  if (!s) s = ur__cuda_blas.cublasLtMatmulPreferenceCreate(&pref);
  uint64_t ws = UR_LT_WORKSPACE;
  uint32_t al[3] = {k->align_a, k->align_b, k->align_d};
  const cublasLtMatmulPreferenceAttributes_t what[5] = {
      CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  const void *val[5] = {&ws, &al[0], &al[1], &al[2], &al[2]};
  const size_t len[5] = {sizeof ws, sizeof al[0], sizeof al[1], sizeof al[2], sizeof al[2]};
  for (int i = 0; i < 5 && !s; i++)
    s = ur__cuda_blas.cublasLtMatmulPreferenceSetAttribute(pref, what[i], val[i], len[i]);
  if (s) {
    if (pref) ur__cuda_blas.cublasLtMatmulPreferenceDestroy(pref);
    ur_plan_destroy(p);
    return ur__cuda_blas_fail(s, "cuBLASLt descriptor setup");
  }
  cublasLtMatmulHeuristicResult_t res;
  int found = 0;
  s = ur__cuda_blas.cublasLtMatmulAlgoGetHeuristic(dv->lt, p->desc, p->a, p->b, p->d, p->d, pref,
                                                   1, &res, &found);
  ur__cuda_blas.cublasLtMatmulPreferenceDestroy(pref);
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
  ur_status st = ur__cuda_dense_workspace(dev, stream, UR_LT_WORKSPACE, &ws);
  if (st) return st;
  float alpha = 1.0f;
  pthread_mutex_lock(&g_plan_lock);
  ur_mm_plan *p = NULL;
  st = ur_plan_get(dv, k, &p);
  int fallback = !st && !p->usable;
  if (!st && p->usable) {
    /* The descriptor is shared by every call of this shape: set and use it under the lock. */
    cublasStatus_t s = ur__cuda_blas.cublasLtMatmulDescSetAttribute(
        p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
    if (!s)
      s = ur__cuda_blas.cublasLtMatmul(dv->lt, p->desc, &alpha, A, p->a, B, p->b, &beta, D, p->d,
                                       D, p->d, &p->algo, ws, UR_LT_WORKSPACE, stream);
    if (s == CUBLAS_STATUS_NOT_SUPPORTED) {
      p->usable = 0;
      fallback = 1;
    } else if (s) {
      st = ur__cuda_blas_fail(s, "cublasLtMatmul");
    }
  }
  if (fallback) {
    cublasStatus_t s = ur__cuda_blas.cublasSetStream_v2(dv->blas, stream);
    if (!s)
      s = ur__cuda_blas.cublasGemmEx(dv->blas, k->ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                     k->tb ? CUBLAS_OP_T : CUBLAS_OP_N, (int)k->m, (int)k->n,
                                     (int)k->k, &alpha, A, k->ab, (int)k->lda, B, k->ab,
                                     (int)k->ldb, &beta, D, k->cd, (int)k->ldd, k->compute,
                                     CUBLAS_GEMM_DEFAULT);
    if (s) st = ur__cuda_blas_fail(s, "cublasGemmEx");
  }
  pthread_mutex_unlock(&g_plan_lock);
  if (!st && fallback && (bias || relu))
    UR_CUDA_CHECK(ur_bias_act_launch(stream, D, bias, k->n, k->m,
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
ur_status ur__cuda_linear_forward(void *stream, const void *x, const void *w, const void *b,
                                  void *y, int64_t rows, int64_t in, int64_t out, ur_dtype dtype,
                                  ur_act act, uint32_t flags) {
  ur_dense_dev *dv = NULL;
  int dev = 0;
  ur_status st = ur__cuda_dense_device(&dv, &dev);
  if (st) return st;
  cudaStream_t s = (cudaStream_t)stream;
  if (in == 0) {
    UR_CUDA_CHECK(cudaMemsetAsync(y, 0, (size_t)(rows * out) * ur_dense_esize(dtype), s),
                  "cudaMemsetAsync");
    UR_CUDA_CHECK(ur_bias_act_launch(s, y, b, rows, out, dtype, act), "bias/activation kernel");
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

ur_status ur__cuda_linear_backward(void *stream, const void *x, const void *w, const void *y,
                                   const void *gy, void *gx, float *gw, float *gb, void *work,
                                   int64_t rows, int64_t in, int64_t out, ur_dtype dtype,
                                   ur_act act, uint32_t flags) {
  ur_dense_dev *dv = NULL;
  int dev = 0;
  ur_status st = ur__cuda_dense_device(&dv, &dev);
  if (st) return st;
  cudaStream_t s = (cudaStream_t)stream;
  int relu = act == UR_ACT_RELU;
  const void *g = gy;
  if ((relu || gb) && out > 0) {
    /* The partial sums sit after cuBLASLt's part of the stream's workspace. */
    int64_t chunks = ur_bgrad_chunks(rows, out, dv->sms);
    void *ws = NULL;
    size_t part = gb ? (size_t)(chunks * out) * sizeof(float) : 0;
    if ((st = ur__cuda_dense_workspace(dev, s, UR_LT_WORKSPACE + part, &ws))) return st;
    float *partial = (float *)((char *)ws + UR_LT_WORKSPACE);
    UR_CUDA_CHECK(ur_relu_bgrad_launch(s, gy, relu ? y : NULL, relu ? work : NULL, gb, partial,
                                       rows, out, dtype, dv->sms),
                  "relu mask / bias gradient kernel (%lld x %lld)", (long long)rows,
                  (long long)out);
    if (relu) g = work;
  }
  int acc = (flags & UR_DENSE_ACCUMULATE) != 0;
  ur_mm_key k;
  if (gx && in > 0) {
    if (out == 0) {
      if (!acc)
        UR_CUDA_CHECK(cudaMemsetAsync(gx, 0, (size_t)(rows * in) * ur_dense_esize(dtype), s),
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

/* ---- activations ---- */

__device__ __forceinline__ float ur_sigmoid(float v) {
  if (v >= 0.0f) return 1.0f / (1.0f + expf(-v));
  float e = expf(v);
  return e / (1.0f + e);
}

template <typename T>
__global__ void ur_act_fwd_kernel(const T *x, T *y, int64_t n, int act) {
  UR_GRID_STRIDE(i, n) {
    float v = ur_ld(x, i);
    ur_st(y, i, act == UR_ACT_RELU ? (v > 0.0f ? v : 0.0f) : ur_sigmoid(v));
  }
}

template <typename T>
__global__ void ur_act_bwd_kernel(const T *y, const T *gy, T *gx, int64_t n, int act) {
  UR_GRID_STRIDE(i, n) {
    float v = ur_ld(y, i), g = ur_ld(gy, i);
    ur_st(gx, i, act == UR_ACT_RELU ? (v > 0.0f ? g : 0.0f) : g * v * (1.0f - v));
  }
}

static cudaError_t ur_act_fwd_launch(cudaStream_t stream, const void *x, void *y, int64_t n,
                                     ur_dtype dtype, int act) {
  int sms = 0;
  cudaError_t e = ur__cuda_dense_sms(&sms);
  if (e != cudaSuccess) return e;
  UR_DENSE_DISPATCH(dtype, T,
    ur_act_fwd_kernel<T><<<ur_dense_blocks(n, 256, sms), 256, 0, stream>>>((const T *)x, (T *)y,
                                                                           n, act));
  return cudaGetLastError();
}

static cudaError_t ur_act_bwd_launch(cudaStream_t stream, const void *y, const void *gy,
                                     void *gx, int64_t n, ur_dtype dtype, int act) {
  int sms = 0;
  cudaError_t e = ur__cuda_dense_sms(&sms);
  if (e != cudaSuccess) return e;
  UR_DENSE_DISPATCH(dtype, T,
    ur_act_bwd_kernel<T><<<ur_dense_blocks(n, 256, sms), 256, 0, stream>>>(
        (const T *)y, (const T *)gy, (T *)gx, n, act));
  return cudaGetLastError();
}

ur_status ur__cuda_act_forward(void *stream, const void *x, void *y, int64_t n, ur_dtype dtype,
                               ur_act act) {
  UR_CUDA_CHECK(ur_act_fwd_launch((cudaStream_t)stream, x, y, n, dtype, act),
                "activation kernel (%lld elements)", (long long)n);
  return UR_STATUS_OK;
}

ur_status ur__cuda_act_backward(void *stream, const void *y, const void *gy, void *gx, int64_t n,
                                ur_dtype dtype, ur_act act) {
  UR_CUDA_CHECK(ur_act_bwd_launch((cudaStream_t)stream, y, gy, gx, n, dtype, act),
                "activation gradient kernel (%lld elements)", (long long)n);
  return UR_STATUS_OK;
}
