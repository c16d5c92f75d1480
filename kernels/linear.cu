/* linear.cu: the Linear layer and the activations (engine/src/dense/linear.c) on the GPU.
 * Matrix products go through cuBLASLt with their elementwise work in the epilogue: forward the
 * bias and the ReLU (RELU_AUX_BIAS also writes the ReLU mask, a bit per output); backward the
 * input gradient masked by the layer below's ReLU mask with that layer's bias gradient
 * (DRELU_BGRAD, where a caller passes the mask's bits; X_RELU masks by x in a pass after the
 * bare product, which ran faster on an H200), and the bias gradient of an unmasked layer in
 * its weight-gradient product (BGRADB).  Where cuBLASLt offers no algorithm for a shape and
 * epilogue, cuBLAS runs the product and kernels here do the epilogue.  Plans (descriptors and the chosen algorithm) are
 * made once per shape and kept.  The weight gradient may go to a side stream of the caller's
 * (WGRAD_ASYNC), forked and joined by events.  A forward whose input is narrow and unaligned
 * (DLRM's first layer: 13 features) skips cuBLASLt, whose kernels for it ran 5x slower than
 * its output's bytes allow: rows staged in shared memory, a thread holds 4 outputs' weights,
 * in f32 (TF32 or not).  A layer
 * of one output (DLRM's last) skips the matrix products: a warp a row forward, and one pass
 * backward that writes the input gradient and sums the weight and bias gradients into
 * per-block partials.  The ReLU mask and bias gradient kernel (16 bytes of a row a lane) sums
 * fixed chunks of rows into partials; one column-sum kernel adds any partials in a fixed order,
 * so every sum is the same on every run.  Activations (ReLU, sigmoid) and their gradients from
 * the output are grid-stride loops with math in f32, as on the CPU. */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <string.h>

#include "common.cuh"
#include "dense.cuh"
#include "dense/act.h"
#include "dense/dense.h"
#include "dense/linear_plan.h" /* the workspace's parts, the bias gradient's chunks */

#define UR_PLANS 512

template <typename T>
__global__ void ur_bias_act_kernel(T *y, const T *b, int64_t rows, int64_t cols, int act) {
  int64_t n = rows * cols, stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    float v = ur_ld(y, i);
    if (b) v += ur_ld(b, i % cols);
    if (act == UR_ACT_RELU) v = ur__relu(v);
    ur_st(y, i, v);
  }
}

/* y[rows, cols] = act(y + b[cols]) (b may be NULL): the epilogue when cuBLAS runs the product. */
static cudaError_t ur_bias_act_launch(cudaStream_t stream, void *y, const void *b, int64_t rows,
                                      int64_t cols, ur_dtype dtype, int act) {
  int sms = 0;
  cudaError_t e = ur__cuda_sms(&sms);
  if (e != cudaSuccess) return e;
  UR_DENSE_DISPATCH(dtype, T,
    ur_bias_act_kernel<T><<<ur_dense_blocks(rows * cols, 256, sms), 256, 0, stream>>>(
        (T *)y, (const T *)b, rows, cols, act));
  return cudaGetLastError();
}

/* V elements of a row loaded or stored as one (16 bytes where the launcher chose V so). */
template <typename T, int V>
struct alignas(sizeof(T) * V) ur_pack {
  T v[V];
};

#define UR_BGRAD_UNROLL 4 /* rows a lane has loaded before it uses the first */

/* Block (32, UR_BGRAD_ROWS): a lane takes V consecutive columns, warp y the chunk's rows y,
 * y + UR_BGRAD_ROWS, ..., UR_BGRAD_UNROLL of them loaded before any is used; each column sums
 * its rows in that order, then the warps' sums in warp order into the chunk's partial.  g may
 * be gy (the mask applied in place): a lane reads an element before it writes it. */
template <typename T, int V>
__global__ void __launch_bounds__(32 * UR_BGRAD_ROWS)
ur_relu_bgrad_kernel(const T *gy, const T *y, T *g, float *partial, int64_t rows, int64_t cols,
                     int64_t per_chunk) {
  typedef ur_pack<T, V> P;
  __shared__ float acc[UR_BGRAD_ROWS][V][33];
  int64_t c0 = ((int64_t)blockIdx.x * 32 + threadIdx.x) * V; /* cols is a multiple of V */
  int64_t r0 = (int64_t)blockIdx.y * per_chunk;
  int64_t r1 = r0 + per_chunk < rows ? r0 + per_chunk : rows;
  float s[V];
#pragma unroll
  for (int e = 0; e < V; e++) s[e] = 0.0f;
  if (c0 < cols) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += UR_BGRAD_UNROLL * UR_BGRAD_ROWS) {
      P v[UR_BGRAD_UNROLL], m[UR_BGRAD_UNROLL];
#pragma unroll
      for (int u = 0; u < UR_BGRAD_UNROLL; u++) {
        int64_t ru = r + u * UR_BGRAD_ROWS;
        if (ru < r1) {
          v[u] = *reinterpret_cast<const P *>(gy + ru * cols + c0);
          if (y) m[u] = *reinterpret_cast<const P *>(y + ru * cols + c0);
        }
      }
#pragma unroll
      for (int u = 0; u < UR_BGRAD_UNROLL; u++) {
        int64_t ru = r + u * UR_BGRAD_ROWS;
        if (ru >= r1) break;
        if (y) {
#pragma unroll
          for (int e = 0; e < V; e++)
            if (!ur__relu_passes((float)m[u].v[e])) v[u].v[e] = T(0.0f);
          *reinterpret_cast<P *>(g + ru * cols + c0) = v[u];
        }
#pragma unroll
        for (int e = 0; e < V; e++) s[e] += (float)v[u].v[e];
      }
    }
  }
#pragma unroll
  for (int e = 0; e < V; e++) acc[threadIdx.y][e][threadIdx.x] = s[e];
  __syncthreads();
  int t = threadIdx.y * 32 + threadIdx.x; /* the block's column t: lane t / V's element t % V */
  int64_t col = (int64_t)blockIdx.x * 32 * V + t;
  if (partial && t < 32 * V && col < cols) {
    float sum = 0.0f;
    for (int k = 0; k < UR_BGRAD_ROWS; k++) sum += acc[k][t % V][t / V];
    partial[(int64_t)blockIdx.y * cols + col] = sum;
  }
}

#define UR_COLSUM_WAYS 32 /* threads summing one column's partials, each every 32nd */

/* out[c] += sum over k < n of part[k * cols + c], for c < cols: block (32, UR_COLSUM_WAYS), a
 * column a lane, thread y summing k = y, y + UR_COLSUM_WAYS, ... in order, then the ways in
 * order, so every sum is the same on every run. */
__global__ void __launch_bounds__(32 * UR_COLSUM_WAYS)
ur_colsum_kernel(const float *part, float *out, int64_t n, int64_t cols) {
  __shared__ float acc[UR_COLSUM_WAYS][33];
  int64_t c = (int64_t)blockIdx.x * 32 + threadIdx.x;
  float s = 0.0f;
  if (c < cols)
    for (int64_t k = threadIdx.y; k < n; k += UR_COLSUM_WAYS) s += part[k * cols + c];
  acc[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float t = 0.0f;
    for (int k = 0; k < UR_COLSUM_WAYS; k++) t += acc[k][threadIdx.x];
    out[c] += t;
  }
}

/* out[cols] += the column sums of part [n, cols] (f32), in a fixed order (ur_colsum_kernel). */
static cudaError_t ur_colsum(cudaStream_t stream, const float *part, float *out, int64_t n,
                             int64_t cols) {
  dim3 block(32, UR_COLSUM_WAYS);
  ur_colsum_kernel<<<(unsigned)((cols + 31) / 32), block, 0, stream>>>(part, out, n, cols);
  return cudaGetLastError();
}

template <typename T, int V>
static void ur_relu_bgrad_run(cudaStream_t stream, const T *gy, const T *y, T *g,
                              float *partial, int64_t rows, int64_t cols, int64_t chunks) {
  int64_t per = (rows + chunks - 1) / chunks;
  dim3 grid((unsigned)((cols + 32 * V - 1) / (32 * V)), (unsigned)chunks);
  dim3 block(32, UR_BGRAD_ROWS);
  ur_relu_bgrad_kernel<T, V><<<grid, block, 0, stream>>>(gy, y, g, partial, rows, cols, per);
}

/* g = gy masked by ur__relu_passes(y) (when y is not NULL; g then must be given) and gb[cols] +=
 * column sums of g (when gb is not NULL), deterministically: fixed chunks of rows summed into
 * partial (chunks * cols floats), then the chunks in a fixed order (ur_colsum).  A lane moves
 * 16 bytes of a row at a time where every row starts 16-byte aligned, else one element. */
static cudaError_t ur_relu_bgrad_launch(cudaStream_t stream, const void *gy, const void *y,
                                        void *g, float *gb, float *partial, int64_t rows,
                                        int64_t cols, ur_dtype dtype, int sms) {
  int64_t chunks = ur__bgrad_chunks(rows, cols, sms);
  float *part = gb ? partial : NULL;
  const int64_t vec = 16 / (int64_t)ur_dense_esize(dtype);
  int wide = cols % vec == 0 && (uintptr_t)gy % 16 == 0 && (uintptr_t)y % 16 == 0 &&
             (uintptr_t)g % 16 == 0;
  UR_DENSE_DISPATCH(dtype, T, {
    if (wide)
      ur_relu_bgrad_run<T, 16 / sizeof(T)>(stream, (const T *)gy, (const T *)y, (T *)g, part,
                                           rows, cols, chunks);
    else
      ur_relu_bgrad_run<T, 1>(stream, (const T *)gy, (const T *)y, (T *)g, part, rows, cols,
                              chunks);
  });
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess || !gb) return e;
  return ur_colsum(stream, partial, gb, chunks, cols);
}

/* The ReLU mask of y [rows, cols] as bits (uvmrec.h: bit j % 8 of byte j / 8 of a row of
 * mcols bytes), a thread per byte: what the forward writes when cuBLAS ran the product. */
template <typename T>
__global__ void ur_mask_kernel(const T *y, uint8_t *mask, int64_t rows, int64_t cols,
                               int64_t mcols) {
  UR_GRID_STRIDE(i, rows * mcols) {
    int64_t r = i / mcols, c0 = (i - r * mcols) * 8;
    unsigned bits = 0;
    for (int k = 0; k < 8; k++)
      if (c0 + k < cols && ur__relu_passes(ur_ld(y, r * cols + c0 + k))) bits |= 1u << k;
    mask[i] = (uint8_t)bits;
  }
}

static cudaError_t ur_mask_launch(cudaStream_t stream, const void *y, uint8_t *mask, int64_t rows,
                                  int64_t cols, ur_dtype dtype, int sms) {
  int64_t mcols = ur__mask_cols(cols);
  UR_DENSE_DISPATCH(dtype, T,
    ur_mask_kernel<T><<<ur_dense_blocks(rows * mcols, 256, sms), 256, 0, stream>>>(
        (const T *)y, mask, rows, cols, mcols));
  return cudaGetLastError();
}

__global__ void ur_vec_add_kernel(float *dst, const float *src, int64_t n) {
  UR_GRID_STRIDE(i, n) dst[i] += src[i];
}

/* dst[n] += src[n]: the bias gradients an epilogue wrote, added to the accumulated ones. */
static cudaError_t ur_vec_add(cudaStream_t stream, float *dst, const float *src, int64_t n) {
  ur_vec_add_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(dst, src, n);
  return cudaGetLastError();
}

/* ---- matrix products ---- */

/* D (m x n, column-major, ldd) = alpha op(A) op(B) + beta C, with C = D, as cuBLAS sees it, and
 * the epilogue: its kind, the bias type when it is f32 under a bf16 D, the ReLU mask's leading
 * dimension in bits, and the alignments cuBLASLt chooses kernels by. */
typedef struct ur_mm_key {
  int dev, ta, tb, epi;
  int64_t m, n, k, lda, ldb, ldd;
  cudaDataType_t ab, cd;
  cublasComputeType_t compute;
  unsigned align_a, align_b, align_d, align_bias, align_aux;
  int bias_f32;
  int64_t aux_ld;
} ur_mm_key;

typedef struct ur_mm_plan {
  ur_mm_key key;
  int usable;               /* 0: cuBLASLt has no algorithm: cuBLAS runs it, kernels the epilogue */
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t a, b, d;
  cublasLtMatmulAlgo_t algo;
} ur_mm_plan;

/* One product's epilogue and its vectors. */
typedef struct ur_mm_epi {
  int epi;                  /* cublasLtEpilogue_t */
  const void *bias;         /* BIAS: added (cd's type); BGRAD*: written (f32 when bias_f32) */
  void *aux;                /* RELU_AUX: the mask written; DRELU: the mask read */
  int64_t aux_ld;           /* bits between the mask's columns of D */
  int bias_f32;
} ur_mm_epi;

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

/* The epilogue's pointers on the shared descriptor (the heuristic reads their alignment). */
static cublasStatus_t ur_plan_pointers(ur_mm_plan *p, const ur_mm_epi *e) {
  const void *bias = e->bias;
  void *aux = e->aux;
  cublasStatus_t s = ur__cuda_blas.cublasLtMatmulDescSetAttribute(
      p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
  if (!s && (p->key.epi & 128))
    s = ur__cuda_blas.cublasLtMatmulDescSetAttribute(
        p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux);
  return s;
}

/* Call with g_plan_lock held. */
static ur_status ur_plan_make(ur_dense_dev *dv, const ur_mm_key *k, const ur_mm_epi *e,
                              ur_mm_plan *p) {
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
  if (!s && k->bias_f32) {
    int32_t bt = CUDA_R_32F;
    s = ur__cuda_blas.cublasLtMatmulDescSetAttribute(dd, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt,
                                                     sizeof bt);
  }
  if (!s && (k->epi & 128))
    s = ur__cuda_blas.cublasLtMatmulDescSetAttribute(dd, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                     &k->aux_ld, sizeof k->aux_ld);
  if (!s) s = ur_plan_pointers(p, e);
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
    /* An epilogue this cuBLASLt does not know is no error: cuBLAS and the kernels take it. */
    if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE) {
      memset(p, 0, sizeof *p);
      p->key = *k;
      return UR_STATUS_OK;
    }
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

static ur_status ur_plan_get(ur_dense_dev *dv, const ur_mm_key *k, const ur_mm_epi *e,
                             ur_mm_plan **out) {
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
  ur_status st = ur_plan_make(dv, k, e, &g_plans[g_nplans]);
  if (st) return st;
  *out = &g_plans[g_nplans++];
  return UR_STATUS_OK;
}

static cudaDataType_t ur_cuda_type(ur_dtype d) {
  return d == UR_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

/* Runs one product (the key's) with epilogue e (NULL: none).  *plain says cuBLAS ran it without
 * any epilogue (no cuBLASLt algorithm): the caller then does the epilogue's work itself. */
static ur_status ur_matmul(ur_dense_dev *dv, int dev, cudaStream_t stream, ur_mm_key *k,
                           const void *A, const void *B, void *D, const ur_mm_epi *e, float beta,
                           int *plain) {
  static const ur_mm_epi none = {CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, 0, 0};
  if (!e) e = &none;
  k->dev = dev;
  k->epi = e->epi;
  k->align_a = ur_align(A);
  k->align_b = ur_align(B);
  k->align_d = ur_align(D);
  k->align_bias = e->bias ? ur_align(e->bias) : 0;
  k->align_aux = e->aux ? ur_align(e->aux) : 0;
  k->bias_f32 = e->bias_f32;
  k->aux_ld = e->aux_ld;
  *plain = 0;
  void *ws = NULL;
  ur_status st = ur__cuda_dense_workspace(dev, stream, UR_LT_WORKSPACE, &ws);
  if (st) return st;
  float alpha = 1.0f;
  pthread_mutex_lock(&g_plan_lock);
  ur_mm_plan *p = NULL;
  st = ur_plan_get(dv, k, e, &p);
  int fallback = !st && !p->usable;
  if (!st && p->usable) {
    /* The descriptor is shared by every call of this shape: set and use it under the lock. */
    cublasStatus_t s = ur_plan_pointers(p, e);
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
    /* cuBLAS works in the stream's workspace too (setting the stream resets it to cuBLAS's
     * own pool, which the HBM budget would not see) */
    cublasStatus_t s = ur__cuda_blas.cublasSetStream_v2(dv->blas, stream);
    if (!s) s = ur__cuda_blas.cublasSetWorkspace_v2(dv->blas, ws, UR_LT_WORKSPACE);
    if (!s)
      s = ur__cuda_blas.cublasGemmEx(dv->blas, k->ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                     k->tb ? CUBLAS_OP_T : CUBLAS_OP_N, (int)k->m, (int)k->n,
                                     (int)k->k, &alpha, A, k->ab, (int)k->lda, B, k->ab,
                                     (int)k->ldb, &beta, D, k->cd, (int)k->ldd, k->compute,
                                     CUBLAS_GEMM_DEFAULT);
    if (s) st = ur__cuda_blas_fail(s, "cublasGemmEx");
    else *plain = 1;
  }
  pthread_mutex_unlock(&g_plan_lock);
  return st;
}

static cublasComputeType_t ur_compute(ur_dtype d, uint32_t flags) {
  return d == UR_DTYPE_F32 && (flags & UR_DENSE_TF32) ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                      : CUBLAS_COMPUTE_32F;
}

/* The key of D (m x n, packed: ldd = m) = op(A) op(B) over k, A and B of dtype (ta, tb: each
 * transposed), D of cd. */
static ur_mm_key ur_mm_key_of(int ta, int tb, int64_t m, int64_t n, int64_t k, int64_t lda,
                              int64_t ldb, ur_dtype dtype, cudaDataType_t cd, uint32_t flags) {
  ur_mm_key key;
  memset(&key, 0, sizeof key);
  key.ta = ta;
  key.tb = tb;
  key.m = m;
  key.n = n;
  key.k = k;
  key.lda = lda;
  key.ldb = ldb;
  key.ldd = m;
  key.ab = ur_cuda_type(dtype);
  key.cd = cd;
  key.compute = ur_compute(dtype, flags);
  return key;
}

/* ---- side streams for the weight gradients ---- */

#define UR_SIDES 64

/* Per caller's stream: the side stream its weight gradients go to, the event that forks them
 * (recorded on the caller's stream) and the one that joins them (recorded on the side). */
typedef struct ur_side {
  int dev;
  cudaStream_t main, side;
  cudaEvent_t fork, done;
  int pending;
} ur_side;

static pthread_mutex_t g_side_lock = PTHREAD_MUTEX_INITIALIZER;
static ur_side g_sides[UR_SIDES];
static int g_nsides;

/* The side of (dev, stream), made on first use; NULL when the table is full (the caller then
 * stays on its own stream).  Call with g_side_lock held. */
static ur_status ur_side_of(int dev, cudaStream_t stream, ur_side **out) {
  *out = NULL;
  for (int i = 0; i < g_nsides; i++)
    if (g_sides[i].dev == dev && g_sides[i].main == stream) {
      *out = &g_sides[i];
      return UR_STATUS_OK;
    }
  if (g_nsides == UR_SIDES) return UR_STATUS_OK;
  ur_side *sd = &g_sides[g_nsides];
  memset(sd, 0, sizeof *sd);
  sd->dev = dev;
  sd->main = stream;
  cudaError_t e = cudaStreamCreateWithFlags(&sd->side, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&sd->fork, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&sd->done, cudaEventDisableTiming);
  if (e != cudaSuccess) {
    if (sd->fork) cudaEventDestroy(sd->fork);
    if (sd->side) cudaStreamDestroy(sd->side);
    return ur__cuda_fail(e, "a side stream for weight gradients");
  }
  g_nsides++;
  *out = sd;
  return UR_STATUS_OK;
}

/* The stream the weight gradient of a backward on `stream` runs on, forked from `stream` at this
 * point (its inputs are ready there), or `stream` itself without WGRAD_ASYNC. */
static ur_status ur_wgrad_stream(int dev, cudaStream_t stream, uint32_t flags, cudaStream_t *out,
                                 ur_side **sd) {
  *out = stream;
  *sd = NULL;
  if (!(flags & UR_DENSE_WGRAD_ASYNC)) return UR_STATUS_OK;
  pthread_mutex_lock(&g_side_lock);
  ur_status st = ur_side_of(dev, stream, sd);
  cudaError_t e = cudaSuccess;
  if (!st && *sd) {
    e = cudaEventRecord((*sd)->fork, stream);
    if (e == cudaSuccess) e = cudaStreamWaitEvent((*sd)->side, (*sd)->fork, 0);
    if (e == cudaSuccess) *out = (*sd)->side;
  }
  pthread_mutex_unlock(&g_side_lock);
  if (e != cudaSuccess) st = ur__cuda_fail(e, "forking the weight gradient's stream");
  return st;
}

/* After the side's work: marks it for the next join. */
static ur_status ur_wgrad_done(ur_side *sd) {
  if (!sd) return UR_STATUS_OK;
  pthread_mutex_lock(&g_side_lock);
  cudaError_t e = cudaEventRecord(sd->done, sd->side);
  if (e == cudaSuccess) sd->pending = 1;
  pthread_mutex_unlock(&g_side_lock);
  if (e != cudaSuccess) return ur__cuda_fail(e, "recording the weight gradient's event");
  return UR_STATUS_OK;
}

ur_status ur__cuda_dense_join(void *stream) {
  int dev = 0;
  UR_CUDA_CHECK(cudaGetDevice(&dev), "cudaGetDevice");
  cudaStream_t s = (cudaStream_t)stream;
  cudaError_t e = cudaSuccess;
  pthread_mutex_lock(&g_side_lock);
  for (int i = 0; i < g_nsides && e == cudaSuccess; i++) {
    ur_side *sd = &g_sides[i];
    if (sd->dev != dev || sd->main != s || !sd->pending) continue;
    e = cudaStreamWaitEvent(s, sd->done, 0);
    if (e == cudaSuccess) sd->pending = 0;
  }
  pthread_mutex_unlock(&g_side_lock);
  UR_CUDA_CHECK(e, "joining the weight gradients' side stream");
  return UR_STATUS_OK;
}

void ur__cuda_linear_stream_gone(cudaStream_t stream) {
  pthread_mutex_lock(&g_side_lock);
  for (int i = 0; i < g_nsides;) {
    ur_side *sd = &g_sides[i];
    if (sd->main != stream) {
      i++;
      continue;
    }
    ur__cuda_dense_workspace_free(sd->side); /* after the side's work */
    ur__cuda_drop(cudaEventDestroy(sd->fork));
    ur__cuda_drop(cudaEventDestroy(sd->done));
    ur__cuda_drop(cudaStreamDestroy(sd->side));
    *sd = g_sides[--g_nsides];
  }
  pthread_mutex_unlock(&g_side_lock);
}

/* ---- a layer of one output ---- */

#define UR_GEMV_THREADS 256

/* y[r] = act(x[r] . w + b), a warp a row (lanes over the columns, then a fixed shuffle tree),
 * and, with a mask, its row of mcols bytes (bit 0 of byte 0: ur__relu_passes(y), the rest zero). */
template <typename T>
__global__ void ur_gemv_fwd_kernel(const T *x, const T *w, const T *b, T *y, uint8_t *mask,
                                   int64_t rows, int64_t in, int act) {
  int lane = threadIdx.x & 31;
  int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
  for (int64_t r = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; r < rows;
       r += warps) {
    const T *xr = x + r * in;
    float s = 0.0f;
    for (int64_t k = lane; k < in; k += 32) s = fmaf(ur_ld(xr, k), ur_ld(w, k), s);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (b) s += ur_ld(b, 0);
    if (act == UR_ACT_RELU) s = ur__relu(s);
    if (lane == 0) ur_st(y, r, s);
    if (mask && lane < 16) {
      float stored = lane == 0 ? ur_ld(y, r) : 0.0f;
      mask[r * 16 + lane] = (uint8_t)(lane == 0 && ur__relu_passes(stored));
    }
  }
}

#define UR_GEMV_UNROLL 8 /* rows a thread has loaded before it uses the first */

/* The backward of a layer of one output over a chunk of rows per block: g = gy (masked by
 * ur__relu_passes(y) under relu), gx = g w (masked by x > 0 when the layer below's mask is asked
 * for: x is that layer's ReLU output, which says the same), and the block's sums of g x (gw) and
 * of gx as stored (gb_x) into partials, each thread owning columns and summing its rows in order
 * (UR_GEMV_UNROLL rows loaded at a time), and of g (gb): the threads over the rows, then a fixed
 * tree, writing the masked gradient itself (work) on the way. */
template <typename T>
__global__ void __launch_bounds__(UR_GEMV_THREADS)
ur_gemv_bwd_kernel(const T *x, const T *w, const T *y, const T *gy, T *gx, T *work,
                   float *part_gw, float *part_gbx, float *part_gb, int64_t rows, int64_t in,
                   int64_t per, int relu, int mask_x, int acc) {
  __shared__ float gsum[UR_GEMV_THREADS];
  int64_t r0 = (int64_t)blockIdx.x * per, r1 = r0 + per < rows ? r0 + per : rows;
  for (int64_t c = threadIdx.x; c < in; c += blockDim.x) {
    float wc = ur_ld(w, c), sgw = 0.0f, sgbx = 0.0f;
    for (int64_t r = r0; r < r1; r += UR_GEMV_UNROLL) {
      float g[UR_GEMV_UNROLL], xv[UR_GEMV_UNROLL], old[UR_GEMV_UNROLL];
#pragma unroll
      for (int u = 0; u < UR_GEMV_UNROLL; u++) {
        int64_t ru = r + u;
        if (ru >= r1) break;
        g[u] = ur_ld(gy, ru);
        if (relu && !ur__relu_passes(ur_ld(y, ru))) g[u] = 0.0f;
        xv[u] = ur_ld(x, ru * in + c);
        old[u] = gx && acc ? ur_ld(gx, ru * in + c) : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < UR_GEMV_UNROLL; u++) {
        int64_t ru = r + u;
        if (ru >= r1) break;
        if (gx) {
          float v = (mask_x && !ur__relu_passes(xv[u])) ? 0.0f : g[u] * wc;
          if (acc) v += old[u];
          T stored = T(v); /* as ur_st rounds it */
          gx[ru * in + c] = stored;
          sgbx += (float)stored;
        }
        if (part_gw) sgw = fmaf(g[u], xv[u], sgw);
      }
    }
    if (part_gw) part_gw[(int64_t)blockIdx.x * in + c] = sgw;
    if (part_gbx) part_gbx[(int64_t)blockIdx.x * in + c] = sgbx;
  }
  if (part_gb || work) { /* the same for every thread: the barriers below are safe */
    float s = 0.0f;
    for (int64_t r = r0 + threadIdx.x; r < r1; r += blockDim.x) {
      T gv = gy[r];
      if (relu && !ur__relu_passes(ur_ld(y, r))) gv = T(0.0f);
      if (work) work[r] = gv;
      s += (float)gv;
    }
    gsum[threadIdx.x] = s;
    __syncthreads();
    for (int o = UR_GEMV_THREADS / 2; o > 0; o >>= 1) {
      if (threadIdx.x < o) gsum[threadIdx.x] += gsum[threadIdx.x + o];
      __syncthreads();
    }
    if (part_gb && threadIdx.x == 0) part_gb[blockIdx.x] = gsum[0];
  }
}

static ur_status ur_gemv_backward(ur_dense_dev *dv, int dev, cudaStream_t s, const void *x,
                                  const void *w, const void *y, const void *gy, void *gx,
                                  void *work, float *gw, float *gb, float *gb_x, int64_t rows,
                                  int64_t in, ur_dtype dtype, int relu, int mask_x, int acc) {
  int64_t per, blocks = ur__gemv_blocks(rows, dv->sms, &per);
  void *ws = NULL;
  ur_status st =
      ur__cuda_dense_workspace(dev, s, UR_LT_WORKSPACE + ur__gemv_part(rows, in, dv->sms), &ws);
  if (st) return st;
  float *part_gw = (float *)((char *)ws + UR_LT_WORKSPACE), *part_gbx = part_gw + blocks * in;
  float *part_gb = part_gbx + blocks * in;
  UR_DENSE_DISPATCH(dtype, T,
    ur_gemv_bwd_kernel<T><<<(unsigned)blocks, UR_GEMV_THREADS, 0, s>>>(
        (const T *)x, (const T *)w, (const T *)y, (const T *)gy, (T *)gx, (T *)work,
        gw ? part_gw : NULL,
        gb_x ? part_gbx : NULL, gb ? part_gb : NULL, rows, in, per, relu, mask_x, acc));
  UR_CUDA_CHECK(cudaGetLastError(), "one-output linear gradient kernel (%lld x %lld)",
                (long long)rows, (long long)in);
  /* the blocks' partials added in a fixed order (ur_colsum) */
  if (gw)
    UR_CUDA_CHECK(ur_colsum(s, part_gw, gw, blocks, in),
                  "one-output linear weight gradient sums (%lld blocks x %lld columns)",
                  (long long)blocks, (long long)in);
  if (gb_x)
    UR_CUDA_CHECK(ur_colsum(s, part_gbx, gb_x, blocks, in),
                  "one-output linear input bias gradient sums (%lld blocks x %lld columns)",
                  (long long)blocks, (long long)in);
  if (gb)
    UR_CUDA_CHECK(ur_colsum(s, part_gb, gb, blocks, 1), "one-output linear bias gradient sum");
  return UR_STATUS_OK;
}

/* ---- a narrow input ---- */

#define UR_NARROW_IN 16       /* inputs this narrow whose rows are not 16-byte aligned: below */
#define UR_NARROW_THREADS 256
#define UR_NARROW_ROWS 64     /* rows of x a block brings into shared memory at a time */

/* y[rows, out] = act(x[rows, in] w[out, in]^T + b) for in <= UR_NARROW_IN, where cuBLASLt
 * would take unaligned rows with a slow kernel and a separate epilogue pass (DLRM's first
 * bottom layer: 13 features).  A block brings UR_NARROW_ROWS rows of x into shared memory at
 * once (one wait on memory for them all); a thread keeps 4 outputs' weights and biases in
 * registers and walks those rows: in products in input order (f32), then the bias and the
 * ReLU; the even thread of a pair writes their 8 columns' mask byte (a row's last byte also
 * zeroes the row's padding bytes).  span (even) threads cover a row's out / 4 column groups,
 * rpb rows at a time; grid.y tiles the groups when a block holds fewer than a row's. */
template <typename T>
__global__ void __launch_bounds__(UR_NARROW_THREADS)
ur_narrow_fwd_kernel(const T *x, const T *w, const T *b, T *y, uint8_t *mask, int64_t rows,
                     int in, int64_t out, int64_t mcols, int relu, int span, int rpb) {
  __shared__ float xs[UR_NARROW_ROWS][UR_NARROW_IN];
  int t = threadIdx.x, rsub = t / span;
  int64_t g = (int64_t)blockIdx.y * span + t % span, j0 = 4 * g;
  float wr[4][UR_NARROW_IN], br[4];
#pragma unroll
  for (int c = 0; c < 4; c++) {
    int64_t j = j0 + c;
#pragma unroll
    for (int k = 0; k < UR_NARROW_IN; k++) wr[c][k] = j < out && k < in ? ur_ld(w, j * in + k) : 0.0f;
    br[c] = b && j < out ? ur_ld(b, j) : 0.0f;
  }
  int64_t nbytes = (out + 7) / 8;
  for (int64_t r0 = (int64_t)blockIdx.x * UR_NARROW_ROWS; r0 < rows;
       r0 += (int64_t)gridDim.x * UR_NARROW_ROWS) {
    int nr = rows - r0 < UR_NARROW_ROWS ? (int)(rows - r0) : UR_NARROW_ROWS;
    __syncthreads(); /* the last rows' reads are done */
    for (int e = t; e < nr * in; e += UR_NARROW_THREADS) xs[e / in][e % in] = ur_ld(x, r0 * in + e);
    __syncthreads();
    for (int rb = 0; rb < nr; rb += rpb) { /* the same trip count in every lane: the shuffle */
      int rr = rb + rsub;
      bool live = rsub < rpb && rr < nr && j0 < out;
      unsigned nib = 0;
      if (live) {
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int k = 0; k < UR_NARROW_IN; k++) {
          if (k >= in) break;
#pragma unroll
          for (int c = 0; c < 4; c++) acc[c] = fmaf(xs[rr][k], wr[c][k], acc[c]);
        }
        int64_t r = r0 + rr;
#pragma unroll
        for (int c = 0; c < 4; c++) {
          if (j0 + c >= out) break;
          float v = acc[c] + br[c];
          /* as ur_st rounds it: the mask bit is the stored value's */
          T stored = T(relu ? ur__relu(v) : v);
          y[r * out + j0 + c] = stored;
          if (ur__relu_passes((float)stored)) nib |= 1u << c;
        }
      }
      unsigned hi = __shfl_down_sync(0xffffffffu, nib, 1); /* span is even: pairs share a warp */
      if (mask && live && g % 2 == 0) {
        uint8_t *mr = mask + (r0 + rr) * mcols;
        mr[g / 2] = (uint8_t)(nib | hi << 4);
        if (g / 2 == nbytes - 1)
          for (int64_t q = nbytes; q < mcols; q++) mr[q] = 0;
      }
    }
  }
}

static cudaError_t ur_narrow_fwd_launch(cudaStream_t stream, const void *x, const void *w,
                                        const void *b, void *y, uint8_t *mask, int64_t rows,
                                        int64_t in, int64_t out, ur_dtype dtype, int relu,
                                        int sms) {
  if (rows == 0) return cudaSuccess;
  int64_t groups = (out + 3) / 4 + ((out + 3) / 4) % 2; /* even: a mask byte's pair together */
  int span = groups < UR_NARROW_THREADS ? (int)groups : UR_NARROW_THREADS;
  int rpb = UR_NARROW_THREADS / span;
  int64_t tiles = (groups + span - 1) / span;
  int64_t want = (rows + UR_NARROW_ROWS - 1) / UR_NARROW_ROWS, cap = (int64_t)sms * 8;
  dim3 grid((unsigned)(want < cap ? want : cap), (unsigned)tiles);
  UR_DENSE_DISPATCH(dtype, T,
    ur_narrow_fwd_kernel<T><<<grid, UR_NARROW_THREADS, 0, stream>>>(
        (const T *)x, (const T *)w, (const T *)b, (T *)y, mask, rows, (int)in, out,
        mask ? ur__mask_cols(out) : 0, relu, span, rpb));
  return cudaGetLastError();
}

/* ---- the layer ---- */

/* Row-major y[rows, out] = x[rows, in] w[out, in]^T is, column-major, y^T = w^T' x^T: cuBLAS's
 * D (out x rows) = op(A = w as in x out, transposed) B (x as in x rows).  The padding columns
 * of x and w are zero and multiplied like the rest: the rows stay aligned. */
ur_status ur__cuda_linear_forward(void *stream, const void *x, const void *w, const void *b,
                                  void *y, uint8_t *mask, int64_t rows, int64_t in, int64_t out,
                                  ur_dtype dtype, ur_act act, uint32_t flags) {
  ur_dense_dev *dv = NULL;
  int dev = 0;
  ur_status st = ur__cuda_dense_device(&dv, &dev);
  if (st) return st;
  cudaStream_t s = (cudaStream_t)stream;
  int relu = act == UR_ACT_RELU;
  if (in == 0) {
    UR_CUDA_CHECK(cudaMemsetAsync(y, 0, (size_t)(rows * out) * ur_dense_esize(dtype), s),
                  "cudaMemsetAsync");
    UR_CUDA_CHECK(ur_bias_act_launch(s, y, b, rows, out, dtype, act), "bias/activation kernel");
    if (mask) UR_CUDA_CHECK(ur_mask_launch(s, y, mask, rows, out, dtype, dv->sms), "mask kernel");
    return UR_STATUS_OK;
  }
  if (out == 1) {
    UR_DENSE_DISPATCH(dtype, T,
      ur_gemv_fwd_kernel<T><<<ur_dense_blocks(rows * 32, UR_GEMV_THREADS, dv->sms),
                              UR_GEMV_THREADS, 0, s>>>((const T *)x, (const T *)w, (const T *)b,
                                                       (T *)y, mask, rows, in, act));
    UR_CUDA_CHECK(cudaGetLastError(), "one-output linear kernel (%lld x %lld)", (long long)rows,
                  (long long)in);
    return UR_STATUS_OK;
  }
  if (in <= UR_NARROW_IN && (in * (int64_t)ur_dense_esize(dtype)) % 16) {
    UR_CUDA_CHECK(ur_narrow_fwd_launch(s, x, w, b, y, relu ? mask : NULL, rows, in, out, dtype,
                                       relu, dv->sms),
                  "narrow-input linear kernel (%lld x %lld x %lld)", (long long)rows,
                  (long long)in, (long long)out);
    return UR_STATUS_OK;
  }
  ur_mm_key k = ur_mm_key_of(1, 0, out, rows, in, in, in, dtype, ur_cuda_type(dtype), flags);
  ur_mm_epi e = {CUBLASLT_EPILOGUE_DEFAULT, b, NULL, 0, 0};
  if (relu && mask) {
    e.epi = b ? CUBLASLT_EPILOGUE_RELU_AUX_BIAS : CUBLASLT_EPILOGUE_RELU_AUX;
    e.aux = mask;
    e.aux_ld = ur__mask_cols(out) * 8;
  } else {
    e.epi = b ? (relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS)
              : (relu ? CUBLASLT_EPILOGUE_RELU : CUBLASLT_EPILOGUE_DEFAULT);
  }
  int plain = 0;
  if ((st = ur_matmul(dv, dev, s, &k, w, x, y, &e, 0.0f, &plain))) return st;
  if (plain && (b || relu))
    UR_CUDA_CHECK(ur_bias_act_launch(s, y, b, rows, out, dtype, act),
                  "bias/activation kernel (%lld x %lld)", (long long)rows, (long long)out);
  if (plain && relu && mask)
    UR_CUDA_CHECK(ur_mask_launch(s, y, mask, rows, out, dtype, dv->sms),
                  "ReLU mask kernel (%lld x %lld)", (long long)rows, (long long)out);
  return UR_STATUS_OK;
}

ur_status ur__cuda_linear_backward(void *stream, const void *x, const void *w, const void *y,
                                   const void *gy, const uint8_t *x_mask, void *gx, float *gw,
                                   float *gb, float *gb_x, void *work, int64_t rows, int64_t in,
                                   int64_t out, ur_dtype dtype, ur_act act, uint32_t flags) {
  ur_dense_dev *dv = NULL;
  int dev = 0;
  ur_status st = ur__cuda_dense_device(&dv, &dev);
  if (st) return st;
  cudaStream_t s = (cudaStream_t)stream;
  int relu = act == UR_ACT_RELU; /* the core passes NONE under GY_MASKED */
  int acc = (flags & UR_DENSE_ACCUMULATE) != 0;
  int x_relu = (flags & UR_DENSE_X_RELU) != 0;
  if (out == 1 && in > 0) /* its pass reads x: the mask is x > 0 either way */
    return ur_gemv_backward(dv, dev, s, x, w, y, gy, gx, relu ? work : NULL, gw, gb, gb_x, rows,
                            in, dtype, relu, x_mask != NULL || x_relu, acc);
  const void *g = gy;
  int gb_done = 0;
  if (relu && out > 0) {
    /* g = gy masked by ur__relu_passes(y), and gb's partial sums in the same pass; they sit after
     * cuBLASLt's part of the stream's workspace */
    void *ws = NULL;
    size_t part = gb ? ur__bgrad_part(rows, out, dv->sms) : 0;
    if ((st = ur__cuda_dense_workspace(dev, s, UR_LT_WORKSPACE + part, &ws))) return st;
    float *partial = (float *)((char *)ws + UR_LT_WORKSPACE);
    UR_CUDA_CHECK(ur_relu_bgrad_launch(s, gy, y, work, gb, partial, rows, out, dtype, dv->sms),
                  "relu mask / bias gradient kernel (%lld x %lld)", (long long)rows,
                  (long long)out);
    g = work;
    gb_done = 1;
  }
  /* The weight gradient's stream forks here, where g is ready, so that it runs beside the
   * input gradient's product. */
  int wgrad = (gw && in > 0 && out > 0) || (gb && !gb_done && out > 0);
  cudaStream_t ws_stream = s;
  ur_side *sd = NULL;
  if (wgrad && (st = ur_wgrad_stream(dev, s, flags, &ws_stream, &sd))) return st;
  ur_mm_key k;
  int plain = 0;
  if (gx && in > 0) {
    if (out == 0) {
      if (!acc)
        UR_CUDA_CHECK(cudaMemsetAsync(gx, 0, (size_t)(rows * in) * ur_dense_esize(dtype), s),
                      "cudaMemsetAsync");
    } else {
      /* gx^T (in x rows) = w^T (as stored: in x out) g^T (out x rows); with the layer below's
       * mask, DRELU_BGRAD masks it and sums the layer below's bias gradient over the rows into
       * an f32 vector after the workspace's cuBLASLt part; under X_RELU the product runs bare
       * and the mask pass after it does both (on the H200 cuBLASLt's DRELU kernels took 2-4x
       * the bare product's time, and it takes no f32 bias gradient under bf16) */
      k = ur_mm_key_of(0, 0, in, rows, out, in, out, dtype, ur_cuda_type(dtype), flags);
      ur_mm_epi e = {CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, 0, 0};
      float *tmp = NULL;
      if (x_mask) {
        void *ws = NULL;
        if ((st = ur__cuda_dense_workspace(dev, s, UR_LT_WORKSPACE + (size_t)in * sizeof(float),
                                           &ws)))
          return st;
        tmp = (float *)((char *)ws + UR_LT_WORKSPACE);
        e.epi = gb_x ? CUBLASLT_EPILOGUE_DRELU_BGRAD : CUBLASLT_EPILOGUE_DRELU;
        e.bias = gb_x ? tmp : NULL;
        e.aux = (void *)x_mask;
        e.aux_ld = ur__mask_cols(in) * 8;
        e.bias_f32 = gb_x && dtype != UR_DTYPE_F32;
      }
      if ((st = ur_matmul(dv, dev, s, &k, w, g, gx, &e, acc ? 1.0f : 0.0f, &plain))) return st;
      if ((x_mask && plain) || x_relu) {
        /* the product ran bare (X_RELU, or no cuBLASLt algorithm for DRELU): x > 0 is the layer
         * below's mask (x is its ReLU output) */
        void *ws = NULL;
        size_t part = gb_x ? ur__bgrad_part(rows, in, dv->sms) : 0;
        if ((st = ur__cuda_dense_workspace(dev, s, UR_LT_WORKSPACE + part, &ws))) return st;
        UR_CUDA_CHECK(ur_relu_bgrad_launch(s, gx, x, gx, gb_x, (float *)((char *)ws + UR_LT_WORKSPACE),
                                           rows, in, dtype, dv->sms),
                      "input gradient mask kernel (%lld x %lld)", (long long)rows, (long long)in);
      } else if (gb_x) {
        UR_CUDA_CHECK(ur_vec_add(s, gb_x, tmp, in), "bias gradient add (%lld)", (long long)in);
      }
    }
  }
  if (wgrad) {
    if (gw && in > 0 && out > 0) {
      /* gw^T (in x out) += x^T (in x rows) op(g^T (out x rows)) with op a transpose; the bias
       * gradient of an unmasked layer is the sum of B over k (BGRADB), into an f32 vector */
      k = ur_mm_key_of(0, 1, in, out, rows, in, out, dtype, CUDA_R_32F, flags);
      ur_mm_epi e = {CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, 0, 0};
      float *tmp = NULL;
      if (gb && !gb_done) {
        void *ws = NULL;
        if ((st = ur__cuda_dense_workspace(dev, ws_stream,
                                           UR_LT_WORKSPACE + (size_t)out * sizeof(float), &ws)))
          return st;
        tmp = (float *)((char *)ws + UR_LT_WORKSPACE);
        e.epi = CUBLASLT_EPILOGUE_BGRADB;
        e.bias = tmp;
      }
      if ((st = ur_matmul(dv, dev, ws_stream, &k, x, g, gw, &e, 1.0f, &plain))) return st;
      if (tmp && !plain) {
        UR_CUDA_CHECK(ur_vec_add(ws_stream, gb, tmp, out), "bias gradient add (%lld)",
                      (long long)out);
        gb_done = 1;
      }
    }
    if (gb && !gb_done && out > 0) {
      void *ws = NULL;
      if ((st = ur__cuda_dense_workspace(dev, ws_stream,
                                         UR_LT_WORKSPACE + ur__bgrad_part(rows, out, dv->sms),
                                         &ws)))
        return st;
      UR_CUDA_CHECK(ur_relu_bgrad_launch(ws_stream, g, NULL, NULL, gb,
                                         (float *)((char *)ws + UR_LT_WORKSPACE), rows, out, dtype,
                                         dv->sms),
                    "bias gradient kernel (%lld x %lld)", (long long)rows, (long long)out);
    }
    if ((st = ur_wgrad_done(sd))) return st;
  }
  return UR_STATUS_OK;
}

/* ---- activations ---- */

template <typename T>
__global__ void ur_act_fwd_kernel(const T *x, T *y, int64_t n, int act) {
  UR_GRID_STRIDE(i, n) {
    float v = ur_ld(x, i);
    ur_st(y, i, act == UR_ACT_RELU ? ur__relu(v) : ur__sigmoid(v));
  }
}

template <typename T>
__global__ void ur_act_bwd_kernel(const T *y, const T *gy, T *gx, int64_t n, int act) {
  UR_GRID_STRIDE(i, n) {
    float v = ur_ld(y, i), g = ur_ld(gy, i);
    ur_st(gx, i, act == UR_ACT_RELU ? (ur__relu_passes(v) ? g : 0.0f) : g * v * (1.0f - v));
  }
}

static cudaError_t ur_act_fwd_launch(cudaStream_t stream, const void *x, void *y, int64_t n,
                                     ur_dtype dtype, int act) {
  int sms = 0;
  cudaError_t e = ur__cuda_sms(&sms);
  if (e != cudaSuccess) return e;
  UR_DENSE_DISPATCH(dtype, T,
    ur_act_fwd_kernel<T><<<ur_dense_blocks(n, 256, sms), 256, 0, stream>>>((const T *)x, (T *)y,
                                                                           n, act));
  return cudaGetLastError();
}

static cudaError_t ur_act_bwd_launch(cudaStream_t stream, const void *y, const void *gy,
                                     void *gx, int64_t n, ur_dtype dtype, int act) {
  int sms = 0;
  cudaError_t e = ur__cuda_sms(&sms);
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
