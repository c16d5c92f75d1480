/* interaction.cu: DLRM's dot interaction (engine/src/dense/interaction.c) on the GPU, one fused
 * kernel each way, and the copies of feature concat and split.  A block takes one row at
 * a time: its T+1 vectors of d values go to shared memory as floats (rows padded by one word,
 * so threads reading the same element of different vectors hit different banks), then each
 * thread computes pairs (forward) or elements of the vectors' gradients (backward).  Sums are
 * in f32; inputs and outputs f32 or bf16 in any mix. */
#include "common.cuh"
#include "dense.cuh"

#define UR_INTER_THREADS 128

/* The pair number p's vectors (i, j): the pairs of vector i start at i(i-1)/2, or i(i+1)/2
 * with self-interaction; the float square root guesses i and integer steps make it exact. */
__device__ __forceinline__ int ur_pair_base(int i, int self) {
  return self ? i * (i + 1) / 2 : i * (i - 1) / 2;
}

__device__ __forceinline__ void ur_pair(int p, int self, int *i, int *j) {
  float r = sqrtf(8.0f * (float)p + 1.0f);
  int a = self ? (int)((r - 1.0f) * 0.5f) : (int)((r + 1.0f) * 0.5f);
  while (a > 0 && ur_pair_base(a, self) > p) a--;
  while (ur_pair_base(a + 1, self) <= p) a++;
  *i = a;
  *j = p - ur_pair_base(a, self);
}

template <typename TD, typename TE>
__device__ __forceinline__ void ur_inter_load(const TD *dense, const TE *emb, int64_t r, int T1,
                                              int d, float *z) {
  const int ld = d + 1;
  const TD *dr = dense + r * d;
  const TE *er = emb + r * (int64_t)(T1 - 1) * d;
  for (int k = threadIdx.x; k < d; k += blockDim.x) z[k] = ur_ld(dr, k);
  for (int e = threadIdx.x; e < (T1 - 1) * d; e += blockDim.x) {
    int i = e / d;
    z[(i + 1) * ld + (e - i * d)] = ur_ld(er, e);
  }
}

template <typename TD, typename TE, typename TO>
__global__ void __launch_bounds__(UR_INTER_THREADS)
ur_inter_fwd_kernel(const TD *dense, const TE *emb, TO *out, int64_t rows, int T1, int d,
                    int self, int64_t ocols, int pairs) {
  extern __shared__ float z[];
  const int ld = d + 1;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    ur_inter_load(dense, emb, r, T1, d, z);
    __syncthreads();
    TO *o = out + r * ocols;
    for (int k = threadIdx.x; k < d; k += blockDim.x) ur_st(o, k, z[k]);
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
      int i, j;
      ur_pair(p, self, &i, &j);
      const float *a = z + i * ld, *b = z + j * ld;
      float s = 0.0f;
      for (int k = 0; k < d; k++) s = fmaf(a[k], b[k], s);
      ur_st(o, d + p, s);
    }
    __syncthreads(); /* z is reloaded for the next row */
  }
}

/* G is the symmetric matrix of the pairs' gradients (a diagonal pair counts twice), and the
 * gradient of vector i is sum_j G_ij z_j. */
template <typename TD, typename TE, typename TO>
__global__ void __launch_bounds__(UR_INTER_THREADS)
ur_inter_bwd_kernel(const TD *dense, const TE *emb, const TO *gout, TD *gdense, TE *gemb,
                    int64_t rows, int T1, int d, int self, int64_t ocols, int pairs) {
  extern __shared__ float z[];
  const int ld = d + 1;
  float *G = z + T1 * ld;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    ur_inter_load(dense, emb, r, T1, d, z);
    for (int e = threadIdx.x; e < T1 * T1; e += blockDim.x) G[e] = 0.0f;
    __syncthreads();
    const TO *go = gout + r * ocols;
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
      int i, j;
      ur_pair(p, self, &i, &j);
      float g = ur_ld(go, d + p);
      if (i == j) {
        G[i * T1 + i] = 2.0f * g;
      } else {
        G[i * T1 + j] = g;
        G[j * T1 + i] = g;
      }
    }
    __syncthreads();
    TD *gd = gdense + r * d;
    TE *ge = gemb + r * (int64_t)(T1 - 1) * d;
    for (int e = threadIdx.x; e < T1 * d; e += blockDim.x) {
      int i = e / d, k = e - i * d;
      const float *gi = G + i * T1;
      float s = 0.0f;
      for (int j = 0; j < T1; j++) s = fmaf(gi[j], z[j * ld + k], s);
      if (i == 0) ur_st(gd, k, s + ur_ld(go, k));
      else ur_st(ge, e - d, s);
    }
    __syncthreads();
  }
}

/* Shared memory the kernels take per block: one row of T+1 vectors of d floats, padded, and
 * for the backward the pairs' gradients. */
static size_t ur_inter_smem(int tables, int dim, int backward) {
  size_t T1 = (size_t)tables + 1;
  return sizeof(float) * (T1 * ((size_t)dim + 1) + (backward ? T1 * T1 : 0));
}

/* Calls BODY with TD, TE, TO bound to the element types of dd, ed, od. */
#define UR_INTER_DISPATCH(dd, ed, od, ...)                                         \
  UR_DENSE_DISPATCH(dd, TD, UR_DENSE_DISPATCH(ed, TE, UR_DENSE_DISPATCH(od, TO, __VA_ARGS__)))

/* Raises the kernels' dynamic shared-memory limit to bytes. */
static cudaError_t ur_inter_prepare(size_t bytes, ur_dtype dd, ur_dtype ed, ur_dtype od) {
  cudaError_t e = cudaSuccess;
  UR_INTER_DISPATCH(dd, ed, od,
    e = cudaFuncSetAttribute(ur_inter_fwd_kernel<TD, TE, TO>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (e == cudaSuccess)
      e = cudaFuncSetAttribute(ur_inter_bwd_kernel<TD, TE, TO>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
  return e;
}

static unsigned ur_inter_blocks(int64_t rows, int sms) {
  int64_t cap = (int64_t)(sms > 0 ? sms : 1) * 16;
  return (unsigned)(rows < cap ? (rows < 1 ? 1 : rows) : cap);
}

static cudaError_t ur_inter_fwd_launch(cudaStream_t stream, const void *dense, const void *emb,
                                       void *out, int64_t rows, int tables, int dim, int self,
                                       ur_dtype dd, ur_dtype ed, ur_dtype od, int sms) {
  int T1 = tables + 1, pairs = T1 * (T1 - 1) / 2 + (self ? T1 : 0);
  size_t smem = ur_inter_smem(tables, dim, 0);
  UR_INTER_DISPATCH(dd, ed, od,
    ur_inter_fwd_kernel<TD, TE, TO><<<ur_inter_blocks(rows, sms), UR_INTER_THREADS, smem, stream>>>(
        (const TD *)dense, (const TE *)emb, (TO *)out, rows, T1, dim, self,
        (int64_t)dim + pairs, pairs));
  return cudaGetLastError();
}

static cudaError_t ur_inter_bwd_launch(cudaStream_t stream, const void *dense, const void *emb,
                                       const void *gout, void *gdense, void *gemb, int64_t rows,
                                       int tables, int dim, int self, ur_dtype dd, ur_dtype ed,
                                       ur_dtype od, int sms) {
  int T1 = tables + 1, pairs = T1 * (T1 - 1) / 2 + (self ? T1 : 0);
  size_t smem = ur_inter_smem(tables, dim, 1);
  UR_INTER_DISPATCH(dd, ed, od,
    ur_inter_bwd_kernel<TD, TE, TO><<<ur_inter_blocks(rows, sms), UR_INTER_THREADS, smem, stream>>>(
        (const TD *)dense, (const TE *)emb, (const TO *)gout, (TD *)gdense, (TE *)gemb, rows, T1,
        dim, self, (int64_t)dim + pairs, pairs));
  return cudaGetLastError();
}

/* The interaction kernels keep one row in shared memory: check it fits, and raise the
 * kernels' limit past the default 48 KiB when it must. */
static ur_status ur_inter_ready(ur_dense_dev *dv, int tables, int dim, ur_dtype dd, ur_dtype ed,
                                ur_dtype od) {
  size_t need = ur_inter_smem(tables, dim, 1);
  if (need > dv->smem_optin)
    return ur__cuda_core->set_error(UR_STATUS_UNSUPPORTED,
                                    "cuda: interaction of %d tables of width %d needs %zu bytes "
                                    "of shared memory per block; this GPU has %zu",
                                    tables, dim, need, dv->smem_optin);
  if (need <= 48u << 10) return UR_STATUS_OK;
  UR_CUDA_CHECK(ur_inter_prepare(need, dd, ed, od),
                "cudaFuncSetAttribute(MaxDynamicSharedMemorySize %zu) for the interaction", need);
  return UR_STATUS_OK;
}

ur_status ur__cuda_interaction_forward(void *stream, const void *dense, const void *emb,
                                       void *out, int64_t rows, int32_t tables, int32_t dim,
                                       int32_t self, ur_dtype dd, ur_dtype ed, ur_dtype od) {
  ur_dense_dev *dv = NULL;
  int dev = 0;
  ur_status st = ur__cuda_dense_device(&dv, &dev);
  if (!st) st = ur_inter_ready(dv, tables, dim, dd, ed, od);
  if (st) return st;
  UR_CUDA_CHECK(ur_inter_fwd_launch((cudaStream_t)stream, dense, emb, out, rows, tables, dim,
                                    self, dd, ed, od, dv->sms),
                "interaction kernel (%lld rows, %d tables of %d)", (long long)rows, (int)tables,
                (int)dim);
  return UR_STATUS_OK;
}

ur_status ur__cuda_interaction_backward(void *stream, const void *dense, const void *emb,
                                        const void *gout, void *gdense, void *gemb, int64_t rows,
                                        int32_t tables, int32_t dim, int32_t self, ur_dtype dd,
                                        ur_dtype ed, ur_dtype od) {
  ur_dense_dev *dv = NULL;
  int dev = 0;
  ur_status st = ur__cuda_dense_device(&dv, &dev);
  if (!st) st = ur_inter_ready(dv, tables, dim, dd, ed, od);
  if (st) return st;
  UR_CUDA_CHECK(ur_inter_bwd_launch((cudaStream_t)stream, dense, emb, gout, gdense, gemb, rows,
                                    tables, dim, self, dd, ed, od, dv->sms),
                "interaction gradient kernel (%lld rows, %d tables of %d)", (long long)rows,
                (int)tables, (int)dim);
  return UR_STATUS_OK;
}

/* ---- feature concat and split (engine/src/dense/interaction.c) ---- */

/* rows rows of width bytes between any two placements, in one call. */
ur_status ur__cuda_copy_2d(void *stream, void *dst, size_t dpitch, const void *src,
                           size_t spitch, size_t width, size_t rows) {
  UR_CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDefault,
                                  (cudaStream_t)stream),
                "cudaMemcpy2DAsync (%zu rows of %zu bytes)", rows, width);
  return UR_STATUS_OK;
}
