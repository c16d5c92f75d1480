/* kjt.cu: keyed-jagged-tensor kernels: offsets and their checks, validation, segment copies,
 * bag gathers (expand, dedup's compaction, permuted rows) and dedup's hashing and runs.
 * Grid-stride loops throughout; first bad positions come from 64-bit atomicMin. */
#include <cuda_runtime.h>
#include <stdint.h>

#include "kjt_kernels.h"

#define UR_KJT_THREADS 256
#define UR_KJT_MAX_BLOCKS (1 << 20)

static unsigned ur_kjt_blocks(int64_t n, int64_t per_block) {
  int64_t b = (n + per_block - 1) / per_block;
  if (b < 1) b = 1;
  if (b > UR_KJT_MAX_BLOCKS) b = UR_KJT_MAX_BLOCKS;
  return (unsigned)b;
}

#define UR_KJT_LOOP(i, n)                                                             \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);             \
       i += (int64_t)gridDim.x * blockDim.x)

/* The key of bag b: the last k with bag0[k] <= b (bag0 ascending, nkeys + 1 entries). */
__device__ static int32_t ur_kjt_key_of(const int64_t *bag0, int32_t nkeys, int64_t b) {
  int32_t lo = 0, hi = nkeys; /* bag0[lo] <= b < bag0[hi] */
  while (hi - lo > 1) {
    int32_t mid = lo + (hi - lo) / 2;
    if (bag0[mid] <= b) lo = mid;
    else hi = mid;
  }
  return lo;
}

__global__ void ur_kjt_widen_kernel(const int32_t *len, int64_t nb, int64_t *off,
                                    unsigned long long *neg) {
  if (blockIdx.x == 0 && threadIdx.x == 0) off[0] = 0;
  UR_KJT_LOOP(b, nb) {
    int32_t l = len[b];
    off[b + 1] = l;
    if (neg && l < 0) atomicMin(neg, (unsigned long long)b);
  }
}

cudaError_t ur__cuda_kjt_widen(cudaStream_t s, const int32_t *len, int64_t nb, int64_t *off,
                               unsigned long long *neg) {
  ur_kjt_widen_kernel<<<ur_kjt_blocks(nb, UR_KJT_THREADS), UR_KJT_THREADS, 0, s>>>(len, nb, off,
                                                                                   neg);
  return cudaGetLastError();
}

__global__ void ur_kjt_over_kernel(const int64_t *off, int64_t nb, int64_t nv,
                                   unsigned long long *over) {
  UR_KJT_LOOP(b, nb) {
    if (off[b + 1] > nv) atomicMin(over, (unsigned long long)b);
  }
}

cudaError_t ur__cuda_kjt_over(cudaStream_t s, const int64_t *off, int64_t nb, int64_t nv,
                              unsigned long long *over) {
  if (nb <= 0) return cudaSuccess;
  ur_kjt_over_kernel<<<ur_kjt_blocks(nb, UR_KJT_THREADS), UR_KJT_THREADS, 0, s>>>(off, nb, nv,
                                                                                  over);
  return cudaGetLastError();
}

__global__ void ur_kjt_gather_i64_kernel(const int64_t *src, const int64_t *idx, int64_t step,
                                         int64_t n, int64_t *out) {
  UR_KJT_LOOP(i, n) { out[i] = src[idx ? idx[i] : i * step]; }
}

cudaError_t ur__cuda_kjt_gather_i64(cudaStream_t s, const int64_t *src, const int64_t *idx,
                                    int64_t step, int64_t n, int64_t *out) {
  if (n <= 0) return cudaSuccess;
  ur_kjt_gather_i64_kernel<<<ur_kjt_blocks(n, UR_KJT_THREADS), UR_KJT_THREADS, 0, s>>>(
      src, idx, step, n, out);
  return cudaGetLastError();
}

__global__ void ur_kjt_validate_bags_kernel(const int32_t *len, const int64_t *off,
                                            const int64_t *val, int64_t nb, int64_t nv,
                                            const int64_t *bag0, int32_t nkeys,
                                            const int64_t *rows, unsigned long long *bad_bag,
                                            unsigned long long *bad_id) {
  UR_KJT_LOOP(b, nb) {
    int32_t l = len[b];
    int64_t o0 = off[b], o1 = off[b + 1];
    if (l < 0 || o1 - o0 != l || o0 < 0 || o1 > nv) {
      atomicMin(bad_bag, (unsigned long long)b);
      continue;
    }
    if (!rows) continue;
    int64_t r = rows[ur_kjt_key_of(bag0, nkeys, b)];
    if (r <= 0) continue;
    for (int64_t v = o0; v < o1; v++) {
      int64_t x = val[v];
      if (x < 0 || x >= r) {
        atomicMin(bad_id, (unsigned long long)b);
        break;
      }
    }
  }
}

cudaError_t ur__cuda_kjt_validate_bags(cudaStream_t s, const int32_t *len, const int64_t *off,
                                       const int64_t *val, int64_t nb, int64_t nv,
                                       const int64_t *bag0, int32_t nkeys, const int64_t *rows,
                                       unsigned long long *bad_bag, unsigned long long *bad_id) {
  if (nb <= 0) return cudaSuccess;
  ur_kjt_validate_bags_kernel<<<ur_kjt_blocks(nb, UR_KJT_THREADS), UR_KJT_THREADS, 0, s>>>(
      len, off, val, nb, nv, bag0, nkeys, rows, bad_bag, bad_id);
  return cudaGetLastError();
}

__global__ void ur_kjt_validate_inverse_kernel(const int64_t *inv, int64_t n, int64_t stride,
                                               const int64_t *spk, unsigned long long *bad) {
  UR_KJT_LOOP(i, n) {
    int64_t x = inv[i];
    if (x < 0 || x >= spk[i / stride]) atomicMin(bad, (unsigned long long)i);
  }
}

cudaError_t ur__cuda_kjt_validate_inverse(cudaStream_t s, const int64_t *inv, int32_t nkeys,
                                          int64_t stride, const int64_t *spk,
                                          unsigned long long *bad) {
  int64_t n = (int64_t)nkeys * stride;
  if (n <= 0) return cudaSuccess;
  ur_kjt_validate_inverse_kernel<<<ur_kjt_blocks(n, UR_KJT_THREADS), UR_KJT_THREADS, 0, s>>>(
      inv, n, stride, spk, bad);
  return cudaGetLastError();
}

/* One block per chunk of UR__KJT_CHUNK elements of one segment, so a long segment is spread
 * over many blocks and many short ones cost a block each. */
template <typename T>
__global__ void ur_kjt_segments_kernel(T *dst, const ur__kjt_seg *segs, const int64_t *block0,
                                       int64_t nseg, int64_t nblocks) {
  for (int64_t blk = blockIdx.x; blk < nblocks; blk += gridDim.x) {
    int64_t lo = 0, hi = nseg; /* block0[lo] <= blk < block0[hi] */
    while (hi - lo > 1) {
      int64_t mid = lo + (hi - lo) / 2;
      if (block0[mid] <= blk) lo = mid;
      else hi = mid;
    }
    ur__kjt_seg g = segs[lo];
    int64_t e0 = (blk - block0[lo]) * UR__KJT_CHUNK, e1 = e0 + UR__KJT_CHUNK;
    if (e1 > g.n) e1 = g.n;
    const T *src = (const T *)g.src;
    for (int64_t e = e0 + threadIdx.x; e < e1; e += blockDim.x) dst[g.dst + e] = src[e];
  }
}

cudaError_t ur__cuda_kjt_segments(cudaStream_t s, void *dst, size_t elem_bytes,
                                  const ur__kjt_seg *segs, const int64_t *block0, int64_t nseg,
                                  int64_t nblocks) {
  if (nblocks <= 0) return cudaSuccess;
  unsigned grid = ur_kjt_blocks(nblocks, 1);
  if (elem_bytes == 8)
    ur_kjt_segments_kernel<uint64_t><<<grid, UR_KJT_THREADS, 0, s>>>((uint64_t *)dst, segs, block0,
                                                                      nseg, nblocks);
  else if (elem_bytes == 4)
    ur_kjt_segments_kernel<uint32_t><<<grid, UR_KJT_THREADS, 0, s>>>((uint32_t *)dst, segs, block0,
                                                                      nseg, nblocks);
  else
    return cudaErrorInvalidValue;
  return cudaGetLastError();
}

__global__ void ur_kjt_expand_map_kernel(const int64_t *inv, const int64_t *bag0, int64_t stride,
                                         int64_t n, int64_t *map) {
  UR_KJT_LOOP(i, n) {
    int64_t k = i / stride;
    map[i] = bag0[k] + (inv ? inv[i] : i - k * stride);
  }
}

cudaError_t ur__cuda_kjt_expand_map(cudaStream_t s, const int64_t *inv, const int64_t *bag0,
                                    int32_t nkeys, int64_t stride, int64_t *map) {
  int64_t n = (int64_t)nkeys * stride;
  if (n <= 0) return cudaSuccess;
  ur_kjt_expand_map_kernel<<<ur_kjt_blocks(n, UR_KJT_THREADS), UR_KJT_THREADS, 0, s>>>(
      inv, bag0, stride, n, map);
  return cudaGetLastError();
}

__global__ void ur_kjt_bag_lengths_kernel(const int32_t *len, const int64_t *map, int64_t n,
                                          int32_t *len_out, int64_t *off) {
  if (blockIdx.x == 0 && threadIdx.x == 0) off[0] = 0;
  UR_KJT_LOOP(i, n) {
    int32_t l = len[map[i]];
    len_out[i] = l;
    off[i + 1] = l;
  }
}

cudaError_t ur__cuda_kjt_bag_lengths(cudaStream_t s, const int32_t *len, const int64_t *map,
                                     int64_t n, int32_t *len_out, int64_t *off) {
  ur_kjt_bag_lengths_kernel<<<ur_kjt_blocks(n, UR_KJT_THREADS), UR_KJT_THREADS, 0, s>>>(
      len, map, n, len_out, off);
  return cudaGetLastError();
}

/* A warp per bag: bags are short (pooling factors of 1 to a few hundred), so the lanes of a
 * warp copy one bag's consecutive ids together. */
__global__ void ur_kjt_bag_copy_kernel(const int64_t *off, const int64_t *val, const float *w,
                                       const int64_t *map, int64_t n, const int64_t *off_out,
                                       int64_t *val_out, float *w_out) {
  int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
  int lane = threadIdx.x & 31;
  for (int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; i < n; i += warps) {
    int64_t b = map[i], o0 = off[b], m = off[b + 1] - o0, d = off_out[i];
    for (int64_t e = lane; e < m; e += 32) {
      val_out[d + e] = val[o0 + e];
      if (w) w_out[d + e] = w[o0 + e];
    }
  }
}

cudaError_t ur__cuda_kjt_bag_copy(cudaStream_t s, const int64_t *off, const int64_t *val,
                                  const float *w, const int64_t *map, int64_t n,
                                  const int64_t *off_out, int64_t *val_out, float *w_out) {
  if (n <= 0) return cudaSuccess;
  ur_kjt_bag_copy_kernel<<<ur_kjt_blocks(n, UR_KJT_THREADS / 32), UR_KJT_THREADS, 0, s>>>(
      off, val, w, map, n, off_out, val_out, w_out);
  return cudaGetLastError();
}

__device__ static uint64_t ur_kjt_mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

__global__ void ur_kjt_dedup_hash_kernel(const int64_t *off, const int64_t *val, const float *w,
                                         int64_t nb, int64_t stride, int kbits, uint64_t *keys,
                                         int64_t *idx) {
  UR_KJT_LOOP(b, nb) {
    int64_t o0 = off[b], m = off[b + 1] - o0;
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (uint64_t)m;
    for (int64_t e = 0; e < m; e++) {
      h = ur_kjt_mix64(h ^ (uint64_t)val[o0 + e]);
      if (w) h = ur_kjt_mix64(h ^ (uint64_t)__float_as_uint(w[o0 + e]));
    }
    uint64_t key = (uint64_t)(b / stride);
    keys[b] = kbits ? key << (64 - kbits) | h >> kbits : h;
    idx[b] = b;
  }
}

cudaError_t ur__cuda_kjt_dedup_hash(cudaStream_t s, const int64_t *off, const int64_t *val,
                                    const float *w, int64_t nb, int64_t stride, int kbits,
                                    uint64_t *keys, int64_t *idx) {
  if (nb <= 0) return cudaSuccess;
  ur_kjt_dedup_hash_kernel<<<ur_kjt_blocks(nb, UR_KJT_THREADS), UR_KJT_THREADS, 0, s>>>(
      off, val, w, nb, stride, kbits, keys, idx);
  return cudaGetLastError();
}

__global__ void ur_kjt_run_heads_kernel(const uint64_t *keys, int64_t n, int64_t *rs) {
  UR_KJT_LOOP(i, n) { rs[i] = i == 0 || keys[i] != keys[i - 1] ? i : 0; }
}

cudaError_t ur__cuda_kjt_run_heads(cudaStream_t s, const uint64_t *keys, int64_t n, int64_t *rs) {
  if (n <= 0) return cudaSuccess;
  ur_kjt_run_heads_kernel<<<ur_kjt_blocks(n, UR_KJT_THREADS), UR_KJT_THREADS, 0, s>>>(keys, n, rs);
  return cudaGetLastError();
}

__device__ static bool ur_kjt_bag_same(const int64_t *off, const int64_t *val, const float *w,
                                       int64_t a, int64_t b) {
  int64_t m = off[a + 1] - off[a];
  if (m != off[b + 1] - off[b]) return false;
  const int64_t *va = val + off[a], *vb = val + off[b];
  for (int64_t e = 0; e < m; e++)
    if (va[e] != vb[e]) return false;
  if (w) {
    const float *wa = w + off[a], *wb = w + off[b];
    for (int64_t e = 0; e < m; e++)
      if (__float_as_uint(wa[e]) != __float_as_uint(wb[e])) return false;
  }
  return true;
}

/* Within a run (equal key and hash, bags ascending: the sort is stable) the run's first bag is
 * almost always the match; a hash collision walks on to the first equal bag, never past i. */
__global__ void ur_kjt_dedup_rep_kernel(const int64_t *sidx, const int64_t *rs, int64_t n,
                                        const int64_t *off, const int64_t *val, const float *w,
                                        int64_t *rep) {
  UR_KJT_LOOP(i, n) {
    int64_t b = sidx[i], r = b;
    for (int64_t j = rs[i]; j < i; j++)
      if (ur_kjt_bag_same(off, val, w, sidx[j], b)) {
        r = sidx[j];
        break;
      }
    rep[b] = r;
  }
}

cudaError_t ur__cuda_kjt_dedup_rep(cudaStream_t s, const int64_t *sidx, const int64_t *rs,
                                   int64_t n, const int64_t *off, const int64_t *val,
                                   const float *w, int64_t *rep) {
  if (n <= 0) return cudaSuccess;
  ur_kjt_dedup_rep_kernel<<<ur_kjt_blocks(n, UR_KJT_THREADS), UR_KJT_THREADS, 0, s>>>(
      sidx, rs, n, off, val, w, rep);
  return cudaGetLastError();
}

__global__ void ur_kjt_dedup_flags_kernel(const int64_t *rep, const int32_t *len, int64_t nb,
                                          int64_t *a, int64_t *c) {
  if (blockIdx.x == 0 && threadIdx.x == 0) a[0] = c[0] = 0;
  UR_KJT_LOOP(b, nb) {
    int64_t f = rep[b] == b;
    a[b + 1] = f;
    c[b + 1] = f ? len[b] : 0;
  }
}

cudaError_t ur__cuda_kjt_dedup_flags(cudaStream_t s, const int64_t *rep, const int32_t *len,
                                     int64_t nb, int64_t *a, int64_t *c) {
  ur_kjt_dedup_flags_kernel<<<ur_kjt_blocks(nb, UR_KJT_THREADS), UR_KJT_THREADS, 0, s>>>(
      rep, len, nb, a, c);
  return cudaGetLastError();
}

__global__ void ur_kjt_dedup_scatter_kernel(const int64_t *rep, const int64_t *a, int64_t nb,
                                            int64_t stride, int64_t *map, int64_t *inv) {
  UR_KJT_LOOP(b, nb) {
    int64_t r = rep[b];
    if (r == b) map[a[b]] = b;
    inv[b] = a[r] - a[b / stride * stride];
  }
}

cudaError_t ur__cuda_kjt_dedup_scatter(cudaStream_t s, const int64_t *rep, const int64_t *a,
                                       int64_t nb, int64_t stride, int64_t *map, int64_t *inv) {
  if (nb <= 0) return cudaSuccess;
  ur_kjt_dedup_scatter_kernel<<<ur_kjt_blocks(nb, UR_KJT_THREADS), UR_KJT_THREADS, 0, s>>>(
      rep, a, nb, stride, map, inv);
  return cudaGetLastError();
}

template <typename T>
__global__ void ur_kjt_gather_rows_kernel(const T *src, int64_t row, const int64_t *map, int64_t n,
                                          T *dst) {
  UR_KJT_LOOP(i, n * row) {
    int64_t r = i / row;
    dst[i] = src[map[r] * row + (i - r * row)];
  }
}

cudaError_t ur__cuda_kjt_gather_rows(cudaStream_t s, const void *src, size_t row_bytes,
                                     const int64_t *map, int64_t n, void *dst) {
  if (n <= 0 || row_bytes == 0) return cudaSuccess;
  /* The widest element that divides the row and both bases' alignment. */
  uintptr_t a = (uintptr_t)src | (uintptr_t)dst | (uintptr_t)row_bytes;
  size_t e = a % 8 == 0 ? 8 : a % 4 == 0 ? 4 : a % 2 == 0 ? 2 : 1;
  int64_t row = (int64_t)(row_bytes / e);
  unsigned grid = ur_kjt_blocks(n * row, UR_KJT_THREADS);
  switch (e) {
  case 8:
    ur_kjt_gather_rows_kernel<<<grid, UR_KJT_THREADS, 0, s>>>((const uint64_t *)src, row, map, n,
                                                             (uint64_t *)dst);
    break;
  case 4:
    ur_kjt_gather_rows_kernel<<<grid, UR_KJT_THREADS, 0, s>>>((const uint32_t *)src, row, map, n,
                                                             (uint32_t *)dst);
    break;
  case 2:
    ur_kjt_gather_rows_kernel<<<grid, UR_KJT_THREADS, 0, s>>>((const uint16_t *)src, row, map, n,
                                                             (uint16_t *)dst);
    break;
  default:
    ur_kjt_gather_rows_kernel<<<grid, UR_KJT_THREADS, 0, s>>>((const uint8_t *)src, row, map, n,
                                                             (uint8_t *)dst);
  }
  return cudaGetLastError();
}
