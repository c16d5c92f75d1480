/* interaction.cu: DLRM's dot interaction (engine/src/dense/interaction.c) on the GPU, and the
 * copies of feature concat and split.  Two paths each way:
 *  - tensor cores, for bf16 inputs (bf16 products) or f32 inputs under TF32, when the T+1
 *    vectors fit 32 and d is a multiple of 16: a warp per row at a time, its vectors in shared
 *    memory as a 32 x d matrix X (rows past T padded with zeros, each row padded by 16 bytes so
 *    fragment loads miss no bank).  Forward: X X^T by 16x16 MMA tiles, only the three tiles of
 *    the lower triangle, the pairs leaving the accumulators for the output row (dense part,
 *    pairs, zero padding; staged in shared memory); the
 *    32 x 32 product is never written to memory.  Backward: the symmetric matrix G of the
 *    pairs' gradients (a diagonal pair counts twice) built in shared memory, then G X as one
 *    product, 16 columns at a time, the results written over the columns of X they no longer
 *    need and stored as whole rows.  f32 accumulation, sums in the tensor cores' order.  The
 *    bf16 kernels are mma.sync on fragments from ldmatrix (ur_inter_mma16_fwd_kernel,
 *    ur_inter_mma16_bwd_kernel: rows in by cp.async, no f32 scratch, so more warps fit; G
 *    filled through a table of the pairs' places); TF32 keeps wmma.
 *  - a scalar kernel for everything else (f32 exact, dtype mixes, more than 31 tables): a block
 *    per row, the vectors in shared memory as floats (rows padded by one word), each thread
 *    computing pairs (forward) or elements of the vectors' gradients (backward), sums in f32.
 * Inputs and outputs f32 or bf16; the output may be padded past d + P (zeros written, the
 * gradient's padding ignored). */
#include <mma.h>

#include "common.cuh"
#include "dense.cuh"
#include "dense/dense.h"

#define UR_INTER_THREADS 128
#define UR_MMA_WARPS 4 /* warps per block of the tensor-core kernels, a row each at a time */

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
    for (int p = threadIdx.x; p < ocols - d; p += blockDim.x) {
      float s = 0.0f;
      if (p < pairs) {
        int i, j;
        ur_pair(p, self, &i, &j);
        const float *a = z + i * ld, *b = z + j * ld;
        for (int k = 0; k < d; k++) s = fmaf(a[k], b[k], s);
      }
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

/* Shared memory the scalar kernels take per block: one row of T+1 vectors of d floats,
 * padded, and for the backward the pairs' gradients. */
static size_t ur_inter_smem(int tables, int dim, int backward) {
  size_t T1 = (size_t)tables + 1;
  return sizeof(float) * (T1 * ((size_t)dim + 1) + (backward ? T1 * T1 : 0));
}

/* ---- the tensor-core path ---- */

namespace wmma = nvcuda::wmma;

#define UR_MMA_VECS 32   /* the vectors of a row, padded: two 16-row tiles */
#define UR_MMA_ZLD 36    /* floats per row of a warp's product scratch (32 + 4: no bank repeats) */
#define UR_MMA_BATCH 16  /* 16-byte loads a lane has in flight before it stores them */

/* What the element type E of the inputs fixes: the fragments' type, k per product, and the
 * padding of a shared-memory row (16 bytes). */
template <typename E> struct ur_mma_t;
template <> struct ur_mma_t<ur_bf16> {
  typedef ur_bf16 frag;
  enum { K = 16, PAD = 8 };
  __device__ static ur_bf16 of(float v) { return __float2bfloat16_rn(v); }
};
template <> struct ur_mma_t<float> {
  typedef wmma::precision::tf32 frag;
  enum { K = 8, PAD = 4 };
  __device__ static float of(float v) { return v; }
};

/* tf32 fragments are loaded as f32 and rounded here (to nearest, ties away); bf16 ones are
 * the inputs' bits. */
template <typename Frag> __device__ __forceinline__ void ur_mma_round(Frag &f, float) {
#pragma unroll
  for (int i = 0; i < f.num_elements; i++) f.x[i] = wmma::__float_to_tf32(f.x[i]);
}
template <typename Frag> __device__ __forceinline__ void ur_mma_round(Frag &, ur_bf16) {}

/* Bytes of a warp's shared memory: X (32 rows of d + PAD elements), G (32 rows of 32 + PAD,
 * backward only) and an f32 scratch of 32 x UR_MMA_ZLD.  Every part is a multiple of 32
 * bytes, so fragment pointers stay 256-bit aligned. */
__host__ __device__ static size_t ur_mma_warp_bytes(int dim, size_t esize, int backward) {
  size_t pad = 16 / esize;
  size_t x = UR_MMA_VECS * ((size_t)dim + pad) * esize;
  size_t g = backward ? UR_MMA_VECS * (UR_MMA_VECS + pad) * esize : 0;
  return x + g + UR_MMA_VECS * UR_MMA_ZLD * sizeof(float);
}

/* Row r's T+1 vectors into X (row i at X + i * ld), 16 bytes a lane at a time, UR_MMA_BATCH
 * loads in flight before the first store.  d is a multiple of 16 and the rows 16-byte aligned
 * (the launcher checks). */
template <typename E>
__device__ __forceinline__ void ur_mma_load(E *X, int ld, const E *dr, const E *er, int T1, int d,
                                            int lane) {
  const int V = 16 / (int)sizeof(E), per = d / V, n = T1 * per;
  for (int c0 = 0; c0 < n; c0 += 32 * UR_MMA_BATCH) {
    uint4 v[UR_MMA_BATCH];
#pragma unroll
    for (int u = 0; u < UR_MMA_BATCH; u++) {
      int c = c0 + u * 32 + lane;
      if (c < n) {
        int i = c / per, q = c - i * per;
        const E *src = i == 0 ? dr + q * V : er + (int64_t)(i - 1) * d + q * V;
        v[u] = __ldg(reinterpret_cast<const uint4 *>(src));
      }
    }
#pragma unroll
    for (int u = 0; u < UR_MMA_BATCH; u++) {
      int c = c0 + u * 32 + lane;
      if (c < n) {
        int i = c / per, q = c - i * per;
        *reinterpret_cast<uint4 *>(X + i * ld + q * V) = v[u];
      }
    }
  }
}

/* X's rows 0..T1-1 out: row 0 to dr, the others to er, 16 bytes a lane (piece c of the row is
 * vector i's q-th, walked by steps of 32 pieces without a division). */
template <typename E>
__device__ __forceinline__ void ur_mma_store(const E *X, int ld, E *dr, E *er, int T1, int d,
                                             int lane) {
  const int V = 16 / (int)sizeof(E), per = d / V, n = T1 * per;
  for (int c = lane, i = lane / per, q = lane % per; c < n; c += 32) {
    E *dst = i == 0 ? dr + q * V : er + (int64_t)(i - 1) * d + q * V;
    *reinterpret_cast<uint4 *>(dst) = *reinterpret_cast<const uint4 *>(X + i * ld + q * V);
    for (q += 32; q >= per; q -= per) i++;
  }
}

/* Rows T1.. of X (and, backward, all of G) start zero and are never written again. */
template <typename E>
__device__ __forceinline__ void ur_mma_zero(E *p, int n, int lane) {
  for (int e = lane; e < n; e += 32) p[e] = ur_mma_t<E>::of(0.0f);
}

template <typename E, typename TO>
__global__ void __launch_bounds__(UR_MMA_WARPS * 32)
ur_inter_mma_fwd_kernel(const E *dense, const E *emb, TO *out, int64_t rows, int T1, int d,
                        int self, int64_t ocols, int pairs) {
  typedef typename ur_mma_t<E>::frag F;
  const int K = ur_mma_t<E>::K, ld = d + ur_mma_t<E>::PAD;
  extern __shared__ __align__(128) unsigned char ur_mma_smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  unsigned char *mine = ur_mma_smem + warp * ur_mma_warp_bytes(d, sizeof(E), 0);
  E *X = reinterpret_cast<E *>(mine);
  float *Z = reinterpret_cast<float *>(mine + UR_MMA_VECS * ld * sizeof(E));
  ur_mma_zero(X + T1 * ld, (UR_MMA_VECS - T1) * ld, lane);
  for (int64_t r = (int64_t)blockIdx.x * UR_MMA_WARPS + warp; r < rows;
       r += (int64_t)gridDim.x * UR_MMA_WARPS) {
    ur_mma_load(X, ld, dense + r * d, emb + r * (int64_t)(T1 - 1) * d, T1, d, lane);
    __syncwarp();
    /* Z = X X^T: B(k, n) = X[n][k] is X read column-major.  Tile (0, 1) is the upper
     * triangle's and is not needed. */
    wmma::fragment<wmma::accumulator, 16, 16, ur_mma_t<E>::K, float> z00, z10, z11;
    wmma::fill_fragment(z00, 0.0f);
    wmma::fill_fragment(z10, 0.0f);
    wmma::fill_fragment(z11, 0.0f);
    for (int k = 0; k < d; k += K) {
      wmma::fragment<wmma::matrix_a, 16, 16, ur_mma_t<E>::K, F, wmma::row_major> a0, a1;
      wmma::fragment<wmma::matrix_b, 16, 16, ur_mma_t<E>::K, F, wmma::col_major> b0, b1;
      wmma::load_matrix_sync(a0, X + k, ld);
      wmma::load_matrix_sync(a1, X + 16 * ld + k, ld);
      wmma::load_matrix_sync(b0, X + k, ld);
      wmma::load_matrix_sync(b1, X + 16 * ld + k, ld);
      ur_mma_round(a0, E());
      ur_mma_round(a1, E());
      ur_mma_round(b0, E());
      ur_mma_round(b1, E());
      wmma::mma_sync(z00, a0, b0, z00);
      wmma::mma_sync(z10, a1, b0, z10);
      wmma::mma_sync(z11, a1, b1, z11);
    }
    wmma::store_matrix_sync(Z, z00, UR_MMA_ZLD, wmma::mem_row_major);
    wmma::store_matrix_sync(Z + 16 * UR_MMA_ZLD, z10, UR_MMA_ZLD, wmma::mem_row_major);
    wmma::store_matrix_sync(Z + 16 * UR_MMA_ZLD + 16, z11, UR_MMA_ZLD, wmma::mem_row_major);
    __syncwarp();
    TO *o = out + r * ocols;
    for (int k = lane; k < d; k += 32) ur_st(o, k, ur_ld(X, k));
    for (int p = lane; p < ocols - d; p += 32) {
      float v = 0.0f;
      if (p < pairs) {
        int i, j;
        ur_pair(p, self, &i, &j);
        v = Z[i * UR_MMA_ZLD + j];
      }
      ur_st(o, d + p, v);
    }
    __syncwarp(); /* X and Z are the next row's */
  }
}

/* gdense = gout's dense part + (G X)[0], gemb = (G X)[1..T], G the pairs' gradients as a
 * symmetric matrix (diagonal: twice the pair's, with self-interaction). */
template <typename E, typename TO>
__global__ void __launch_bounds__(UR_MMA_WARPS * 32)
ur_inter_mma_bwd_kernel(const E *dense, const E *emb, const TO *gout, E *gdense, E *gemb,
                        int64_t rows, int T1, int d, int self, int64_t ocols, int pairs) {
  typedef typename ur_mma_t<E>::frag F;
  const int K = ur_mma_t<E>::K, ld = d + ur_mma_t<E>::PAD;
  const int gld = UR_MMA_VECS + ur_mma_t<E>::PAD;
  extern __shared__ __align__(128) unsigned char ur_mma_smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  unsigned char *mine = ur_mma_smem + warp * ur_mma_warp_bytes(d, sizeof(E), 1);
  E *X = reinterpret_cast<E *>(mine);
  E *G = X + UR_MMA_VECS * ld;
  float *S = reinterpret_cast<float *>(G + UR_MMA_VECS * gld);
  ur_mma_zero(X + T1 * ld, (UR_MMA_VECS - T1) * ld, lane);
  ur_mma_zero(G, UR_MMA_VECS * gld, lane);
  __syncwarp(); /* the zeros land before any lane writes a pair's gradient into G (racecheck) */
  for (int64_t r = (int64_t)blockIdx.x * UR_MMA_WARPS + warp; r < rows;
       r += (int64_t)gridDim.x * UR_MMA_WARPS) {
    ur_mma_load(X, ld, dense + r * d, emb + r * (int64_t)(T1 - 1) * d, T1, d, lane);
    const TO *go = gout + r * ocols;
    /* every pair's entries are written for every row; the rest of G stays zero */
    for (int p = lane; p < pairs; p += 32) {
      int i, j;
      ur_pair(p, self, &i, &j);
      float g = ur_ld(go, d + p);
      if (i == j) {
        G[i * gld + i] = ur_mma_t<E>::of(2.0f * g);
      } else {
        G[i * gld + j] = ur_mma_t<E>::of(g);
        G[j * gld + i] = ur_mma_t<E>::of(g);
      }
    }
    __syncwarp();
    for (int n0 = 0; n0 < d; n0 += 16) {
      wmma::fragment<wmma::accumulator, 16, 16, ur_mma_t<E>::K, float> c0, c1;
      wmma::fill_fragment(c0, 0.0f);
      wmma::fill_fragment(c1, 0.0f);
#pragma unroll
      for (int k = 0; k < UR_MMA_VECS; k += K) {
        wmma::fragment<wmma::matrix_a, 16, 16, ur_mma_t<E>::K, F, wmma::row_major> a0, a1;
        wmma::fragment<wmma::matrix_b, 16, 16, ur_mma_t<E>::K, F, wmma::row_major> b;
        wmma::load_matrix_sync(a0, G + k, gld);
        wmma::load_matrix_sync(a1, G + 16 * gld + k, gld);
        wmma::load_matrix_sync(b, X + k * ld + n0, ld);
        ur_mma_round(a0, E());
        ur_mma_round(a1, E());
        ur_mma_round(b, E());
        wmma::mma_sync(c0, a0, b, c0);
        wmma::mma_sync(c1, a1, b, c1);
      }
      wmma::store_matrix_sync(S, c0, UR_MMA_ZLD, wmma::mem_row_major);
      wmma::store_matrix_sync(S + 16 * UR_MMA_ZLD, c1, UR_MMA_ZLD, wmma::mem_row_major);
      __syncwarp();
      /* columns n0.. of X are read by no later tile: the gradients go there */
      for (int e = lane; e < T1 * 16; e += 32) {
        int i = e >> 4, c = e & 15;
        float v = S[i * UR_MMA_ZLD + c];
        if (i == 0) v = ur_ld(go, n0 + c) + v;
        X[i * ld + n0 + c] = ur_mma_t<E>::of(v);
      }
      __syncwarp();
    }
    ur_mma_store(X, ld, gdense + r * d, gemb + r * (int64_t)(T1 - 1) * d, T1, d, lane);
    __syncwarp(); /* X is the next row's */
  }
}

/* ---- the bf16 kernels: mma.sync on registers ---- */

/* The instructions the bf16 kernels are made of (PTX ISA: cp.async from common.cuh, ldmatrix,
 * mma.sync m16n8k16 with its fragment layouts). */
/* Row r's T+1 bf16 vectors into X (row i at X + i * ld) by cp.async, 16 bytes a lane, nothing
 * held in registers; the lane waits (ur_cp_wait) and the warp syncs before X is read. */
__device__ __forceinline__ void ur_mma16_fetch(ur_bf16 *X, int ld, const ur_bf16 *dr,
                                               const ur_bf16 *er, int T1, int d, int lane) {
  const int per = d / 8, n = T1 * per;
  for (int c = lane, i = lane / per, q = lane % per; c < n; c += 32) {
    ur_cp16(X + i * ld + q * 8, i == 0 ? dr + q * 8 : er + (int64_t)(i - 1) * d + q * 8);
    for (q += 32; q >= per; q -= per) i++;
  }
}
/* Four 8x8 b16 matrices; lane l gives the address of row l % 8 of matrix l / 8. */
__device__ __forceinline__ void ur_ldsm4(unsigned (&r)[4], const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(ur_smem(p)) : "memory");
}
__device__ __forceinline__ void ur_ldsm4_t(unsigned (&r)[4], const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(ur_smem(p)) : "memory");
}
/* c (16x8 f32) += a (16x16 bf16, row-major) b (16x8 bf16): lane l holds c at rows l / 4 and
 * l / 4 + 8, columns 2 (l % 4) and the next. */
__device__ __forceinline__ void ur_mma16816(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                            unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
               "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

#define UR_GLD (UR_MMA_VECS + 8) /* bf16 per row of G: 80 bytes, so ldmatrix's rows miss no bank */

/* Bytes of the bf16 backward's shared memory: the block's pair table (two G offsets a pair),
 * then per warp X (32 rows of d + 8), G (32 rows of UR_GLD) and gout's dense part (d floats). */
__host__ __device__ static size_t ur_mma16_table_bytes(int pairs) {
  return ((size_t)pairs * 4 + 127) / 128 * 128;
}
__host__ __device__ static size_t ur_mma16_warp_bytes(int dim) {
  return UR_MMA_VECS * ((size_t)dim + 8) * 2 + UR_MMA_VECS * UR_GLD * 2 + (size_t)dim * 4;
}

/* The bf16 backward, a warp a row: X's rows come in by cp.async (no registers held), the pairs'
 * gradients go into G through a table of their two places (made once a block), G's fragments
 * are loaded once a row, and G X runs 16 columns at a time as mma.sync on fragments from
 * ldmatrix; each result leaves its accumulator as bf16 pairs into X's columns that no later
 * product reads (row 0 plus gout's dense part), and the rows go out 16 bytes a lane.  f32 sums
 * of bf16 products in the tensor cores' order, as the wmma kernel's. */
__global__ void __launch_bounds__(UR_MMA_WARPS * 32)
ur_inter_mma16_bwd_kernel(const ur_bf16 *dense, const ur_bf16 *emb, const ur_bf16 *gout,
                          ur_bf16 *gdense, ur_bf16 *gemb, int64_t rows, int T1, int d, int self,
                          int64_t ocols, int pairs) {
  extern __shared__ __align__(128) unsigned char ur_mma_smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, ld = d + 8;
  uint32_t *tab = reinterpret_cast<uint32_t *>(ur_mma_smem);
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
    int i, j;
    ur_pair(p, self, &i, &j);
    tab[p] = (uint32_t)(i * UR_GLD + j) | (uint32_t)(j * UR_GLD + i) << 16;
  }
  unsigned char *mine = ur_mma_smem + ur_mma16_table_bytes(pairs) + warp * ur_mma16_warp_bytes(d);
  ur_bf16 *X = reinterpret_cast<ur_bf16 *>(mine);
  ur_bf16 *G = X + UR_MMA_VECS * ld;
  float *gd = reinterpret_cast<float *>(G + UR_MMA_VECS * UR_GLD);
  ur_mma_zero(X + T1 * ld, (UR_MMA_VECS - T1) * ld, lane);
  ur_mma_zero(G, UR_MMA_VECS * UR_GLD, lane);
  __syncthreads(); /* the table and the zeros land before any lane reads them (racecheck) */
  const int g = lane >> 2, t = lane & 3;
  for (int64_t r = (int64_t)blockIdx.x * UR_MMA_WARPS + warp; r < rows;
       r += (int64_t)gridDim.x * UR_MMA_WARPS) {
    ur_mma16_fetch(X, ld, dense + r * d, emb + r * (int64_t)(T1 - 1) * d, T1, d, lane);
    const ur_bf16 *go = gout + r * ocols;
    for (int k = lane; k < d; k += 32) gd[k] = __bfloat162float(go[k]);
    for (int p = lane; p < pairs; p += 32) {
      uint32_t at = tab[p];
      ur_bf16 v = go[d + p];
      if ((at & 0xffff) == at >> 16) v = __float2bfloat16_rn(2.0f * __bfloat162float(v));
      G[at & 0xffff] = v;
      G[at >> 16] = v;
    }
    ur_cp_wait();
    __syncwarp();
    unsigned a[2][2][4]; /* G's fragments: [rows 16 m..][columns 16 k..] */
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
      for (int k = 0; k < 2; k++)
        ur_ldsm4(a[m][k], G + (16 * m + (lane & 15)) * UR_GLD + 16 * k + (lane >> 4) * 8);
    for (int n0 = 0; n0 < d; n0 += 16) {
      float c[2][2][4] = {}; /* [rows 16 m..][columns n0 + 8 h..] */
#pragma unroll
      for (int k = 0; k < 2; k++) {
        unsigned b[4]; /* X's rows 16 k.. at columns n0.. (b[0], b[1]) and n0 + 8.. (b[2], b[3]) */
        ur_ldsm4_t(b, X + (16 * k + (lane & 15)) * ld + n0 + (lane >> 4) * 8);
#pragma unroll
        for (int m = 0; m < 2; m++) {
          ur_mma16816(c[m][0], a[m][k], b[0], b[1]);
          ur_mma16816(c[m][1], a[m][k], b[2], b[3]);
        }
      }
      __syncwarp(); /* every lane's reads of columns n0.. are done: the results go there */
#pragma unroll
      for (int m = 0; m < 2; m++)
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
          for (int half = 0; half < 2; half++) {
            int row = 16 * m + g + 8 * half, col = n0 + 8 * h + 2 * t;
            if (row >= T1) continue;
            float lo = c[m][h][2 * half], hi = c[m][h][2 * half + 1];
            if (row == 0) lo = gd[col] + lo, hi = gd[col + 1] + hi;
            *reinterpret_cast<__nv_bfloat162 *>(X + row * ld + col) = __floats2bfloat162_rn(lo, hi);
          }
    }
    __syncwarp();
    ur_mma_store(X, ld, gdense + r * d, gemb + r * (int64_t)(T1 - 1) * d, T1, d, lane);
    __syncwarp(); /* X, G and gd are the next row's */
  }
}

/* Calls BODY with TD, TE, TO bound to the element types of dd, ed, od. */
#define UR_INTER_DISPATCH(dd, ed, od, ...)                                         \
  UR_DENSE_DISPATCH(dd, TD, UR_DENSE_DISPATCH(ed, TE, UR_DENSE_DISPATCH(od, TO, __VA_ARGS__)))

/* Bytes a warp of the bf16 forward takes: X (32 rows of d + 8) and its output row (ocols of
 * TO, whole 16-byte words). */
__host__ __device__ static size_t ur_mma16_fwd_warp_bytes(int dim, int64_t ocols, size_t osize) {
  return UR_MMA_VECS * ((size_t)dim + 8) * 2 + ((size_t)ocols * osize + 15) / 16 * 16;
}

/* The bf16 forward, a warp a row: X's rows come in by cp.async, the three 16 x 16 tiles of the
 * lower triangle of X X^T run d / 16 steps of mma.sync on fragments from ldmatrix (X is both
 * operands: rows as A, rows as B's columns), each pair's sum leaves its accumulator for its
 * place in the output row in shared memory (dense part, pairs, zero padding written once), and
 * the row goes out 16 bytes a lane where its rows are aligned. */
template <typename TO>
__global__ void __launch_bounds__(UR_MMA_WARPS * 32)
ur_inter_mma16_fwd_kernel(const ur_bf16 *dense, const ur_bf16 *emb, TO *out, int64_t rows, int T1,
                          int d, int self, int64_t ocols, int pairs) {
  extern __shared__ __align__(128) unsigned char ur_mma_smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, ld = d + 8;
  unsigned char *mine = ur_mma_smem + warp * ur_mma16_fwd_warp_bytes(d, ocols, sizeof(TO));
  ur_bf16 *X = reinterpret_cast<ur_bf16 *>(mine);
  TO *O = reinterpret_cast<TO *>(X + UR_MMA_VECS * ld);
  ur_mma_zero(X + T1 * ld, (UR_MMA_VECS - T1) * ld, lane);
  for (int64_t k = d + pairs + lane; k < ocols; k += 32) ur_st(O, k, 0.0f);
  const int g = lane >> 2, t = lane & 3;
  const bool wide = ocols * (int64_t)sizeof(TO) % 16 == 0 && (uintptr_t)out % 16 == 0;
  const int ochunks = (int)(ocols * (int64_t)sizeof(TO) / 16);
  for (int64_t r = (int64_t)blockIdx.x * UR_MMA_WARPS + warp; r < rows;
       r += (int64_t)gridDim.x * UR_MMA_WARPS) {
    ur_mma16_fetch(X, ld, dense + r * d, emb + r * (int64_t)(T1 - 1) * d, T1, d, lane);
    ur_cp_wait();
    __syncwarp();
    float c[3][2][4] = {}; /* tiles (rows 0.., cols 0..), (16.., 0..), (16.., 16..); 8 columns h */
    for (int k0 = 0; k0 < d; k0 += 16) {
      unsigned a[2][4], b[2][4]; /* X's rows 16 m.. at columns k0.. as A, as B's columns */
#pragma unroll
      for (int m = 0; m < 2; m++) {
        ur_ldsm4(a[m], X + (16 * m + (lane & 15)) * ld + k0 + (lane >> 4) * 8);
        ur_ldsm4(b[m], X + (16 * m + (lane & 7) + (lane >> 4) * 8) * ld + k0 + ((lane >> 3) & 1) * 8);
      }
#pragma unroll
      for (int h = 0; h < 2; h++) {
        ur_mma16816(c[0][h], a[0], b[0][2 * h], b[0][2 * h + 1]);
        ur_mma16816(c[1][h], a[1], b[0][2 * h], b[0][2 * h + 1]);
        ur_mma16816(c[2][h], a[1], b[1][2 * h], b[1][2 * h + 1]);
      }
    }
#pragma unroll
    for (int tile = 0; tile < 3; tile++)
#pragma unroll
      for (int h = 0; h < 2; h++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          int i = 16 * (tile > 0) + g + 8 * (e >> 1), j = 16 * (tile == 2) + 8 * h + 2 * t + (e & 1);
          if (i < T1 && (self ? j <= i : j < i)) ur_st(O, d + ur_pair_base(i, self) + j, c[tile][h][e]);
        }
    for (int k = lane; k < d; k += 32) ur_st(O, k, ur_ld(X, k));
    __syncwarp();
    TO *o = out + r * ocols;
    if (wide)
      for (int c16 = lane; c16 < ochunks; c16 += 32)
        reinterpret_cast<uint4 *>(o)[c16] = reinterpret_cast<const uint4 *>(O)[c16];
    else
      for (int64_t k = lane; k < ocols; k += 32) o[k] = O[k];
    __syncwarp(); /* X and O are the next row's */
  }
}

/* Shared memory of a block of the tensor-core kernels (the table sized for self-interaction). */
static size_t ur_mma_block_bytes(int tables, int dim, ur_dtype dd, ur_dtype od, int64_t ocols,
                                 int backward) {
  if (!backward && dd == UR_DTYPE_BF16)
    return UR_MMA_WARPS * ur_mma16_fwd_warp_bytes(dim, ocols, ur_dense_esize(od));
  if (backward && dd == UR_DTYPE_BF16)
    return ur_mma16_table_bytes((int)ur__inter_pairs(tables + 1, 1)) +
           UR_MMA_WARPS * ur_mma16_warp_bytes(dim);
  return UR_MMA_WARPS * ur_mma_warp_bytes(dim, ur_dense_esize(dd), backward);
}

/* Which path runs: the tensor cores (1) when the inputs share a dtype that has them (bf16, or
 * f32 under TF32; a bf16 backward also needs a bf16 gout, which G keeps exactly), the vectors
 * fit 32, d is a multiple of 16, every row is 16-byte aligned and a warp's shared memory fits;
 * else the scalar kernels (0). */
static int ur_inter_use_mma(const ur_dense_dev *dv, int backward, int tables, int dim,
                            int64_t ocols, ur_dtype dd, ur_dtype ed, ur_dtype od, uint32_t flags,
                            const void *const *ptrs, int nptrs) {
  if (dd != ed || tables + 1 > UR_MMA_VECS || dim % 16) return 0;
  if (dd == UR_DTYPE_F32 ? !(flags & UR_DENSE_TF32) : backward && od != UR_DTYPE_BF16) return 0;
  for (int i = 0; i < nptrs; i++)
    if ((uintptr_t)ptrs[i] % 16) return 0;
  return ur_mma_block_bytes(tables, dim, dd, od, ocols, backward) <= dv->smem_optin;
}

/* A pass's launch (backward 0 or 1): a grid-stride loop over rows takes at most 16 blocks
 * (scalar) or 8 (tensor cores) per multiprocessor, as shared memory allows several of either. */
struct ur_inter_geom {
  unsigned blocks, threads;
  size_t smem;
};

static ur_inter_geom ur_inter_geometry(int64_t rows, int64_t ocols, int tables, int dim,
                                       ur_dtype dd, ur_dtype od, int backward, int mma, int sms) {
  ur_inter_geom g;
  if (mma) {
    g.smem = ur_mma_block_bytes(tables, dim, dd, od, ocols, backward);
    g.blocks = ur_grid_blocks(rows, UR_MMA_WARPS, 8, sms);
    g.threads = UR_MMA_WARPS * 32;
  } else {
    g.smem = ur_inter_smem(tables, dim, backward);
    g.blocks = ur_grid_blocks(rows, 1, 16, sms);
    g.threads = UR_INTER_THREADS;
  }
  return g;
}

static cudaError_t ur_inter_fwd_launch(cudaStream_t stream, const void *dense, const void *emb,
                                       void *out, int64_t rows, int64_t ocols, int tables,
                                       int dim, int self, ur_dtype dd, ur_dtype ed, ur_dtype od,
                                       int mma, int sms) {
  int T1 = tables + 1, pairs = (int)ur__inter_pairs(T1, self);
  ur_inter_geom g = ur_inter_geometry(rows, ocols, tables, dim, dd, od, 0, mma, sms);
  cudaError_t e = cudaSuccess;
  if (mma && dd == UR_DTYPE_BF16) {
    UR_DENSE_DISPATCH(od, TO,
      e = ur_launch_smem(ur_inter_mma16_fwd_kernel<TO>, g.blocks, g.threads, g.smem, stream,
                          (const ur_bf16 *)dense, (const ur_bf16 *)emb, (TO *)out, rows, T1, dim,
                          self, ocols, pairs));
    return e;
  }
  if (mma) { /* TF32 */
    UR_DENSE_DISPATCH(od, TO,
      e = ur_launch_smem(ur_inter_mma_fwd_kernel<float, TO>, g.blocks, g.threads, g.smem, stream,
                          (const float *)dense, (const float *)emb, (TO *)out, rows, T1, dim,
                          self, ocols, pairs));
    return e;
  }
  UR_INTER_DISPATCH(dd, ed, od,
    e = ur_launch_smem(ur_inter_fwd_kernel<TD, TE, TO>, g.blocks, g.threads, g.smem, stream,
                        (const TD *)dense, (const TE *)emb, (TO *)out, rows, T1, dim, self, ocols,
                        pairs));
  return e;
}

static cudaError_t ur_inter_bwd_launch(cudaStream_t stream, const void *dense, const void *emb,
                                       const void *gout, void *gdense, void *gemb, int64_t rows,
                                       int64_t ocols, int tables, int dim, int self, ur_dtype dd,
                                       ur_dtype ed, ur_dtype od, int mma, int sms) {
  int T1 = tables + 1, pairs = (int)ur__inter_pairs(T1, self);
  ur_inter_geom g = ur_inter_geometry(rows, ocols, tables, dim, dd, od, 1, mma, sms);
  cudaError_t e = cudaSuccess;
  if (mma && dd == UR_DTYPE_BF16) /* gout is bf16 too (ur_inter_use_mma) */
    return ur_launch_smem(ur_inter_mma16_bwd_kernel, g.blocks, g.threads, g.smem, stream,
                           (const ur_bf16 *)dense, (const ur_bf16 *)emb, (const ur_bf16 *)gout,
                           (ur_bf16 *)gdense, (ur_bf16 *)gemb, rows, T1, dim, self, ocols, pairs);
  if (mma) { /* TF32 */
    UR_DENSE_DISPATCH(od, TO,
      e = ur_launch_smem(ur_inter_mma_bwd_kernel<float, TO>, g.blocks, g.threads, g.smem, stream,
                          (const float *)dense, (const float *)emb, (const TO *)gout,
                          (float *)gdense, (float *)gemb, rows, T1, dim, self, ocols, pairs));
    return e;
  }
  UR_INTER_DISPATCH(dd, ed, od,
    e = ur_launch_smem(ur_inter_bwd_kernel<TD, TE, TO>, g.blocks, g.threads, g.smem, stream,
                        (const TD *)dense, (const TE *)emb, (const TO *)gout, (TD *)gdense,
                        (TE *)gemb, rows, T1, dim, self, ocols, pairs));
  return e;
}

/* The scalar kernels keep one row in a block's shared memory: check it fits. */
static ur_status ur_inter_fits(ur_dense_dev *dv, int tables, int dim) {
  size_t need = ur_inter_smem(tables, dim, 1);
  if (need <= dv->smem_optin) return UR_STATUS_OK;
  return ur__cuda_core->set_error(UR_STATUS_UNSUPPORTED,
                                  "cuda: interaction of %d tables of width %d needs %zu bytes "
                                  "of shared memory per block; this GPU has %zu",
                                  tables, dim, need, dv->smem_optin);
}

ur_status ur__cuda_interaction_forward(void *stream, const void *dense, const void *emb,
                                       void *out, int64_t rows, int64_t ocols, int32_t tables,
                                       int32_t dim, int32_t self, ur_dtype dd, ur_dtype ed,
                                       ur_dtype od, uint32_t flags) {
  ur_dense_dev *dv = NULL;
  int dev = 0;
  ur_status st = ur__cuda_dense_device(&dv, &dev);
  if (st) return st;
  const void *ptrs[2] = {dense, emb};
  int mma = ur_inter_use_mma(dv, 0, tables, dim, ocols, dd, ed, od, flags, ptrs, 2);
  if (!mma && (st = ur_inter_fits(dv, tables, dim))) return st;
  UR_CUDA_CHECK(ur_inter_fwd_launch((cudaStream_t)stream, dense, emb, out, rows, ocols, tables,
                                    dim, self, dd, ed, od, mma, dv->sms),
                "interaction kernel (%lld rows, %d tables of %d%s)", (long long)rows, (int)tables,
                (int)dim, mma ? ", tensor cores" : "");
  return UR_STATUS_OK;
}

ur_status ur__cuda_interaction_backward(void *stream, const void *dense, const void *emb,
                                        const void *gout, void *gdense, void *gemb, int64_t rows,
                                        int64_t ocols, int32_t tables, int32_t dim, int32_t self,
                                        ur_dtype dd, ur_dtype ed, ur_dtype od, uint32_t flags) {
  ur_dense_dev *dv = NULL;
  int dev = 0;
  ur_status st = ur__cuda_dense_device(&dv, &dev);
  if (st) return st;
  const void *ptrs[4] = {dense, emb, gdense, gemb};
  int mma = ur_inter_use_mma(dv, 1, tables, dim, ocols, dd, ed, od, flags, ptrs, 4);
  if (!mma && (st = ur_inter_fits(dv, tables, dim))) return st;
  UR_CUDA_CHECK(ur_inter_bwd_launch((cudaStream_t)stream, dense, emb, gout, gdense, gemb, rows,
                                    ocols, tables, dim, self, dd, ed, od, mma, dv->sms),
                "interaction gradient kernel (%lld rows, %d tables of %d%s)", (long long)rows,
                (int)tables, (int)dim, mma ? ", tensor cores" : "");
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
