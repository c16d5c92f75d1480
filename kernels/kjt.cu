/* kjt.cu: the CUDA backend's keyed-jagged-tensor table.  Kernels for offsets and their checks,
 * validation, segment copies, bag gathers (expand, dedup's compaction, permuted rows) and
 * dedup's hashing and runs (grid-stride loops; first bad positions from 64-bit atomicMin),
 * sequenced with cub's scans (offsets, dedup's counts, run starts) and radix sort (dedup).
 * Each call's scratch comes from the stream-ordered pool (cudaMallocAsync, freed on the same
 * stream, so nothing waits for it), and counts against the HBM budget while the call holds it;
 * only the entries that hand sizes back to the host wait for the stream. */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include "common.cuh"
#include "data/kjt.h"

#define UR_KJT_THREADS 256
#define UR__KJT_CHUNK 4096 /* elements a block of a segment copy takes */
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

/* off[0] = 0, off[b + 1] = len[b] (the input of an in-place inclusive scan); with neg, the
 * first b whose length is negative. */
static cudaError_t ur__cuda_kjt_widen(cudaStream_t s, const int32_t *len, int64_t nb, int64_t *off,
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

/* The first b whose bag ends past nv values: off[b + 1] > nv (off the inclusive scan). */
static cudaError_t ur__cuda_kjt_over(cudaStream_t s, const int64_t *off, int64_t nb, int64_t nv,
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

/* out[i] = src[idx[i]]; with idx NULL, out[i] = src[i * step]. */
static cudaError_t ur__cuda_kjt_gather_i64(cudaStream_t s, const int64_t *src, const int64_t *idx,
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
    int64_t o0 = off[b], o1 = off[b + 1];
    if (!ur__kjt_bag_sound(len[b], o0, o1, nv)) {
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

/* validate: bad_bag, the first bag with a negative length or offsets that disagree with it
 * (or pass nv); bad_id, the first sound bag of a key with rows[key] > 0 holding an id outside
 * [0, rows[key]) (rows NULL: none checked).  bag0 [nkeys + 1] in device memory. */
static cudaError_t ur__cuda_kjt_validate_bags(cudaStream_t s, const int32_t *len, const int64_t *off,
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

/* The first i of inverse [nkeys * stride] outside 0..spk[i / stride] - 1. */
static cudaError_t ur__cuda_kjt_validate_inverse(cudaStream_t s, const int64_t *inv, int32_t nkeys,
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

static cudaError_t ur__cuda_kjt_segments(cudaStream_t s, void *dst, size_t elem_bytes,
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

/* map[k * stride + j] = bag0[k] + (inv ? inv[k * stride + j] : j); bag0 in device memory. */
static cudaError_t ur__cuda_kjt_expand_map(cudaStream_t s, const int64_t *inv, const int64_t *bag0,
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

/* len_out[i] = len[map[i]], off[0] = 0, off[i + 1] = len[map[i]] (to be scanned). */
static cudaError_t ur__cuda_kjt_bag_lengths(cudaStream_t s, const int32_t *len, const int64_t *map,
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

/* Values (and weights) of bag map[i] to off_out[i]..: one warp per bag. */
static cudaError_t ur__cuda_kjt_bag_copy(cudaStream_t s, const int64_t *off, const int64_t *val,
                                  const float *w, const int64_t *map, int64_t n,
                                  const int64_t *off_out, int64_t *val_out, float *w_out) {
  if (n <= 0) return cudaSuccess;
  ur_kjt_bag_copy_kernel<<<ur_kjt_blocks(n, UR_KJT_THREADS / 32), UR_KJT_THREADS, 0, s>>>(
      off, val, w, map, n, off_out, val_out, w_out);
  return cudaGetLastError();
}

__global__ void ur_kjt_dedup_hash_kernel(const int64_t *off, const int64_t *val, const float *w,
                                         int64_t nb, int64_t stride, int kbits, uint64_t *keys,
                                         int64_t *idx) {
  UR_KJT_LOOP(b, nb) {
    int64_t o0 = off[b], m = off[b + 1] - o0;
    uint64_t h = ur__kjt_bag_hash(val + o0, w ? w + o0 : nullptr, m);
    uint64_t key = (uint64_t)(b / stride);
    keys[b] = kbits ? key << (64 - kbits) | h >> kbits : h;
    idx[b] = b;
  }
}

/* dedup, for nb = nkeys * stride bags: keys[b] = key << (64 - kbits) | hash of the bag's ids
 * (and weights) >> kbits, idx[b] = b. */
static cudaError_t ur__cuda_kjt_dedup_hash(cudaStream_t s, const int64_t *off, const int64_t *val,
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

/* rs[i] = i where sorted keys[i] starts a run, else 0 (a max-scan makes it the run's start). */
static cudaError_t ur__cuda_kjt_run_heads(cudaStream_t s, const uint64_t *keys, int64_t n, int64_t *rs) {
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

/* rep[sidx[i]] = the first bag of i's run (sorted by bag within it) with the same ids and
 * weights as bag sidx[i]: its first appearance in the key. */
static cudaError_t ur__cuda_kjt_dedup_rep(cudaStream_t s, const int64_t *sidx, const int64_t *rs,
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

/* a[0] = c[0] = 0, a[b + 1] = (rep[b] == b), c[b + 1] = that times len[b] (to be scanned). */
static cudaError_t ur__cuda_kjt_dedup_flags(cudaStream_t s, const int64_t *rep, const int32_t *len,
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

/* After the scans: map[a[b]] = b for first appearances, inv[b] = a[rep[b]] - a[key's first]. */
static cudaError_t ur__cuda_kjt_dedup_scatter(cudaStream_t s, const int64_t *rep, const int64_t *a,
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

/* dst row i = src row map[i], rows of row_bytes. */
static cudaError_t ur__cuda_kjt_gather_rows(cudaStream_t s, const void *src, size_t row_bytes,
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

/* ---- the backend's kjt table ---- */

/* Returns a failed CUDA call's status (common.cuh's mapping) from a function whose `op` names
 * its entry: "cuda: kjt <op> (<step>) failed: ...". */
#define UR_KJT_TRY(call, step) UR_CUDA_CHECK((call), "kjt %s (%s)", op, (step))

/* A host allocation of the entry `op` failed: out of memory, worded as kjt.c words its own. */
static ur_status ur_kjt_host_oom(const char *op) {
  return ur__cuda_core->set_error(UR_STATUS_OOM, "kjt %s: out of host memory", op);
}

/* One allocation per call, carved into aligned parts; freed in stream order, its bytes taken
 * from the HBM budget for the call (ur_core_api's workspace_take) and given back with it. */
struct ur_kjt_scratch {
  cudaStream_t s;
  char *base;
  size_t used, cap;
  explicit ur_kjt_scratch(cudaStream_t st) : s(st), base(nullptr), used(0), cap(0) {}
  ~ur_kjt_scratch() {
    if (base && cudaFreeAsync(base, s) != cudaSuccess) (void)cudaGetLastError();
    if (cap) ur__cuda_core->workspace_give(cap);
  }
  static size_t up(size_t b) { return (b + 255) & ~(size_t)255; }
  /* The budget's refusal as it is (its message names the bytes and the budget), the op named
   * in it as other consumers name themselves; a failed allocation as the op's CUDA failure. */
  ur_status alloc(size_t bytes, const char *op) {
    size_t want = bytes ? bytes : 256;
    char what[64];
    snprintf(what, sizeof what, "the scratch of kjt %s", op);
    ur_status st = ur__cuda_core->workspace_take(want, what);
    if (st) return st;
    cap = want;
    cudaError_t e = cudaMallocAsync((void **)&base, cap, s);
    if (e != cudaSuccess) base = nullptr;
    UR_KJT_TRY(e, "scratch");
    return UR_STATUS_OK;
  }
  template <typename T> T *take(size_t n) {
    T *p = (T *)(base + used);
    used += up(n * sizeof(T));
    return p;
  }
};

/* ---- offsets ---- */

/* op names the entry in CUDA failures: offsets, or from rows, which scans its lengths here. */
static ur_status ur_kjt_offsets_run(cudaStream_t s, const int32_t *len, int64_t nb, int64_t *off,
                                    const int64_t *bag0, int32_t nkeys, int64_t nv,
                                    int64_t *val0, int64_t *bad, const char *op) {
  size_t cub_bytes = 0;
  UR_KJT_TRY(cub::DeviceScan::InclusiveSum(nullptr, cub_bytes, off + 1, off + 1, nb, s),
             "scan size");
  ur_kjt_scratch w(s);
  size_t n1 = (size_t)nkeys + 1;
  ur_status st = w.alloc(w.up(cub_bytes) + 2 * w.up(n1 * 8) + w.up(2 * 8), op);
  if (st) return st;
  void *tmp = w.take<char>(cub_bytes);
  int64_t *d_bag0 = w.take<int64_t>(n1), *d_val0 = w.take<int64_t>(n1);
  unsigned long long *d_bad = w.take<unsigned long long>(2);
  if (val0) UR_KJT_TRY(cudaMemsetAsync(d_bad, 0xff, 2 * 8, s), "clear");
  UR_KJT_TRY(ur__cuda_kjt_widen(s, len, nb, off, val0 ? d_bad : nullptr), "lengths");
  if (nb > 0)
    UR_KJT_TRY(cub::DeviceScan::InclusiveSum(tmp, cub_bytes, off + 1, off + 1, nb, s), "scan");
  if (!val0) return UR_STATUS_OK;
  UR_KJT_TRY(ur__cuda_kjt_over(s, off, nb, nv, d_bad + 1), "sum check");
  UR_KJT_TRY(cudaMemcpyAsync(d_bag0, bag0, n1 * 8, cudaMemcpyHostToDevice, s), "key spans up");
  UR_KJT_TRY(ur__cuda_kjt_gather_i64(s, off, d_bag0, 0, (int64_t)n1, d_val0), "key spans");
  unsigned long long hb[2];
  UR_KJT_TRY(cudaMemcpyAsync(val0, d_val0, n1 * 8, cudaMemcpyDeviceToHost, s), "key spans down");
  UR_KJT_TRY(cudaMemcpyAsync(hb, d_bad, sizeof hb, cudaMemcpyDeviceToHost, s), "checks down");
  UR_KJT_TRY(cudaStreamSynchronize(s), "wait");
  for (int i = 0; i < 2; i++) bad[i] = hb[i] == ~0ull ? -1 : (int64_t)hb[i];
  return UR_STATUS_OK;
}

static ur_status ur_cuda_kjt_offsets(void *stream, const int32_t *len, int64_t nb, int64_t *off,
                                     const int64_t *bag0, int32_t nkeys, int64_t nv,
                                     int64_t *val0, int64_t *bad) {
  return ur_kjt_offsets_run((cudaStream_t)stream, len, nb, off, bag0, nkeys, nv, val0, bad,
                            "offsets");
}

/* ---- validate ---- */

static ur_status ur_cuda_kjt_validate(void *stream, const int32_t *len, const int64_t *off,
                                      const int64_t *val, const int64_t *inv, int64_t nv,
                                      int32_t nkeys, int64_t stride, const int64_t *bag0,
                                      const int64_t *spk, const int64_t *rows, int64_t *bad) {
  cudaStream_t s = (cudaStream_t)stream;
  const char *op = "validate";
  size_t n1 = (size_t)nkeys + 1;
  int64_t nb = bag0[nkeys];
  ur_kjt_scratch w(s);
  ur_status st = w.alloc(3 * w.up(n1 * 8) + w.up(3 * 8), op);
  if (st) return st;
  int64_t *d_bag0 = w.take<int64_t>(n1), *d_spk = w.take<int64_t>(n1),
          *d_rows = w.take<int64_t>(n1);
  unsigned long long *d_bad = w.take<unsigned long long>(3);
  UR_KJT_TRY(cudaMemsetAsync(d_bad, 0xff, 3 * 8, s), "clear");
  UR_KJT_TRY(cudaMemcpyAsync(d_bag0, bag0, n1 * 8, cudaMemcpyHostToDevice, s), "key spans up");
  if (rows && nkeys)
    UR_KJT_TRY(cudaMemcpyAsync(d_rows, rows, (size_t)nkeys * 8, cudaMemcpyHostToDevice, s),
               "rows up");
  UR_KJT_TRY(ur__cuda_kjt_validate_bags(s, len, off, val, nb, nv, d_bag0, nkeys,
                                        rows ? d_rows : nullptr, d_bad, d_bad + 1),
             "bags");
  if (inv && nkeys) {
    UR_KJT_TRY(cudaMemcpyAsync(d_spk, spk, (size_t)nkeys * 8, cudaMemcpyHostToDevice, s),
               "strides up");
    UR_KJT_TRY(ur__cuda_kjt_validate_inverse(s, inv, nkeys, stride, d_spk, d_bad + 2),
               "inverse indices");
  }
  unsigned long long hb[3];
  UR_KJT_TRY(cudaMemcpyAsync(hb, d_bad, sizeof hb, cudaMemcpyDeviceToHost, s), "checks down");
  UR_KJT_TRY(cudaStreamSynchronize(s), "wait");
  for (int i = 0; i < 3; i++) bad[i] = hb[i] == ~0ull ? -1 : (int64_t)hb[i];
  return UR_STATUS_OK;
}

/* ---- segment copies ---- */

static ur_status ur_cuda_kjt_segments(void *stream, void *dst, size_t elem_bytes,
                                      const ur__kjt_seg *segs, int64_t nseg) {
  cudaStream_t s = (cudaStream_t)stream;
  const char *op = "segment copy";
  if (nseg <= 0) return UR_STATUS_OK;
  int64_t *block0 = (int64_t *)malloc(sizeof(int64_t) * (size_t)(nseg + 1));
  if (!block0) return ur_kjt_host_oom(op);
  block0[0] = 0;
  for (int64_t i = 0; i < nseg; i++)
    block0[i + 1] = block0[i] + (segs[i].n + UR__KJT_CHUNK - 1) / UR__KJT_CHUNK;
  int64_t nblocks = block0[nseg];
  ur_kjt_scratch w(s);
  ur_status st = w.alloc(w.up((size_t)nseg * sizeof(ur__kjt_seg)) + w.up((size_t)(nseg + 1) * 8),
                         op);
  if (st) {
    free(block0);
    return st;
  }
  ur__kjt_seg *d_segs = w.take<ur__kjt_seg>((size_t)nseg);
  int64_t *d_block0 = w.take<int64_t>((size_t)nseg + 1);
  /* From pageable memory the copies are staged before they return, so the arrays can go. */
  cudaError_t e = cudaMemcpyAsync(d_segs, segs, (size_t)nseg * sizeof(ur__kjt_seg),
                                  cudaMemcpyHostToDevice, s);
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(d_block0, block0, (size_t)(nseg + 1) * 8, cudaMemcpyHostToDevice, s);
  free(block0);
  UR_KJT_TRY(e, "segments up");
  UR_KJT_TRY(ur__cuda_kjt_segments(s, dst, elem_bytes, d_segs, d_block0, nseg, nblocks), "copy");
  return UR_STATUS_OK;
}

/* ---- bag gathers: expand, dedup's compaction ---- */

static ur_status ur_cuda_kjt_expand_map(void *stream, const int64_t *inv, const int64_t *bag0,
                                        int32_t nkeys, int64_t stride, int64_t *map) {
  cudaStream_t s = (cudaStream_t)stream;
  const char *op = "expand";
  if ((int64_t)nkeys * stride <= 0) return UR_STATUS_OK;
  ur_kjt_scratch w(s);
  size_t n1 = (size_t)nkeys + 1;
  ur_status st = w.alloc(w.up(n1 * 8), op);
  if (st) return st;
  int64_t *d_bag0 = w.take<int64_t>(n1);
  UR_KJT_TRY(cudaMemcpyAsync(d_bag0, bag0, n1 * 8, cudaMemcpyHostToDevice, s), "key spans up");
  UR_KJT_TRY(ur__cuda_kjt_expand_map(s, inv, d_bag0, nkeys, stride, map), "map");
  return UR_STATUS_OK;
}

static ur_status ur_cuda_kjt_bag_lengths(void *stream, const int32_t *len, const int64_t *map,
                                         int64_t n, int32_t *len_out, int64_t *off_out,
                                         int64_t step, int32_t nat, int64_t *at_out) {
  cudaStream_t s = (cudaStream_t)stream;
  const char *op = "bag lengths";
  size_t cub_bytes = 0;
  UR_KJT_TRY(cub::DeviceScan::InclusiveSum(nullptr, cub_bytes, off_out + 1, off_out + 1, n, s),
             "scan size");
  ur_kjt_scratch w(s);
  ur_status st = w.alloc(w.up(cub_bytes) + w.up((size_t)(nat > 0 ? nat : 1) * 8), op);
  if (st) return st;
  void *tmp = w.take<char>(cub_bytes);
  int64_t *d_at = w.take<int64_t>((size_t)(nat > 0 ? nat : 1));
  UR_KJT_TRY(ur__cuda_kjt_bag_lengths(s, len, map, n, len_out, off_out), "lengths");
  if (n > 0)
    UR_KJT_TRY(cub::DeviceScan::InclusiveSum(tmp, cub_bytes, off_out + 1, off_out + 1, n, s),
               "scan");
  if (nat <= 0) return UR_STATUS_OK;
  UR_KJT_TRY(ur__cuda_kjt_gather_i64(s, off_out, nullptr, step, nat, d_at), "key spans");
  UR_KJT_TRY(cudaMemcpyAsync(at_out, d_at, (size_t)nat * 8, cudaMemcpyDeviceToHost, s),
             "key spans down");
  UR_KJT_TRY(cudaStreamSynchronize(s), "wait");
  return UR_STATUS_OK;
}

static ur_status ur_cuda_kjt_bag_copy(void *stream, const int64_t *off, const int64_t *val,
                                      const float *w, const int64_t *map, int64_t n,
                                      const int64_t *off_out, int64_t *val_out, float *w_out) {
  const char *op = "bag copy";
  UR_KJT_TRY(
      ur__cuda_kjt_bag_copy((cudaStream_t)stream, off, val, w, map, n, off_out, val_out, w_out),
      "copy");
  return UR_STATUS_OK;
}

static ur_status ur_cuda_kjt_expand_rows(void *stream, const void *src, size_t row_bytes,
                                         const int64_t *inv, const int64_t *bag0, int32_t nkeys,
                                         int64_t stride, void *dst) {
  cudaStream_t s = (cudaStream_t)stream;
  const char *op = "expand rows";
  int64_t n = (int64_t)nkeys * stride;
  if (n <= 0 || row_bytes == 0) return UR_STATUS_OK;
  ur_kjt_scratch w(s);
  size_t n1 = (size_t)nkeys + 1;
  ur_status st = w.alloc(w.up(n1 * 8) + w.up((size_t)n * 8), op);
  if (st) return st;
  int64_t *d_bag0 = w.take<int64_t>(n1), *map = w.take<int64_t>((size_t)n);
  UR_KJT_TRY(cudaMemcpyAsync(d_bag0, bag0, n1 * 8, cudaMemcpyHostToDevice, s), "key spans up");
  UR_KJT_TRY(ur__cuda_kjt_expand_map(s, inv, d_bag0, nkeys, stride, map), "map");
  UR_KJT_TRY(ur__cuda_kjt_gather_rows(s, src, row_bytes, map, n, dst), "gather");
  return UR_STATUS_OK;
}

/* ---- dedup ---- */

struct ur_kjt_max {
  __host__ __device__ int64_t operator()(int64_t a, int64_t b) const { return a > b ? a : b; }
};

static ur_status ur_cuda_kjt_dedup(void *stream, const int64_t *off, const int64_t *val,
                                   const float *wt, const int32_t *len, int32_t nkeys,
                                   int64_t stride, int64_t *map, int64_t *inv, int64_t *spk,
                                   int64_t *val0) {
  cudaStream_t s = (cudaStream_t)stream;
  const char *op = "dedup";
  int64_t nb = (int64_t)nkeys * stride;
  size_t n1 = (size_t)nkeys + 1;
  if (nb <= 0) {
    memset(spk, 0, (size_t)nkeys * 8);
    memset(val0, 0, n1 * 8);
    return UR_STATUS_OK;
  }
  int kbits = 0;
  while (kbits < 31 && ((int64_t)1 << kbits) < nkeys) kbits++;
  size_t sort_bytes = 0, max_bytes = 0, sum_bytes = 0;
  cub::DoubleBuffer<uint64_t> kb(nullptr, nullptr);
  cub::DoubleBuffer<int64_t> vb(nullptr, nullptr);
  UR_KJT_TRY(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, kb, vb, nb, 0, 64, s),
             "sort size");
  UR_KJT_TRY(cub::DeviceScan::InclusiveScan(nullptr, max_bytes, (int64_t *)nullptr,
                                            (int64_t *)nullptr, ur_kjt_max(), nb, s),
             "scan size");
  UR_KJT_TRY(cub::DeviceScan::InclusiveSum(nullptr, sum_bytes, (int64_t *)nullptr,
                                           (int64_t *)nullptr, nb, s),
             "scan size");
  size_t cub_bytes = sort_bytes > max_bytes ? sort_bytes : max_bytes;
  if (sum_bytes > cub_bytes) cub_bytes = sum_bytes;
  size_t nbz = (size_t)nb;
  ur_kjt_scratch w(s);
  ur_status st = w.alloc(w.up(cub_bytes) + 6 * w.up(nbz * 8) + 2 * w.up((nbz + 1) * 8) +
                             w.up(2 * n1 * 8),
                         op);
  if (st) return st;
  void *tmp = w.take<char>(cub_bytes);
  uint64_t *k0 = w.take<uint64_t>(nbz), *k1 = w.take<uint64_t>(nbz);
  int64_t *i0 = w.take<int64_t>(nbz), *i1 = w.take<int64_t>(nbz);
  int64_t *rs = w.take<int64_t>(nbz), *rep = w.take<int64_t>(nbz);
  int64_t *a = w.take<int64_t>(nbz + 1), *c = w.take<int64_t>(nbz + 1);
  int64_t *at = w.take<int64_t>(2 * n1);

  /* Bags of a key sorted by their hash, bag order kept among equals (the sort is stable). */
  UR_KJT_TRY(ur__cuda_kjt_dedup_hash(s, off, val, wt, nb, stride, kbits, k0, i0), "hash");
  kb = cub::DoubleBuffer<uint64_t>(k0, k1);
  vb = cub::DoubleBuffer<int64_t>(i0, i1);
  UR_KJT_TRY(cub::DeviceRadixSort::SortPairs(tmp, sort_bytes, kb, vb, nb, 0, 64, s), "sort");
  UR_KJT_TRY(ur__cuda_kjt_run_heads(s, kb.Current(), nb, rs), "runs");
  UR_KJT_TRY(cub::DeviceScan::InclusiveScan(tmp, max_bytes, rs, rs, ur_kjt_max(), nb, s),
             "run starts");
  UR_KJT_TRY(ur__cuda_kjt_dedup_rep(s, vb.Current(), rs, nb, off, val, wt, rep), "compare");
  /* a: distinct bags before b (its bag in the result); c: their values (its first value). */
  UR_KJT_TRY(ur__cuda_kjt_dedup_flags(s, rep, len, nb, a, c), "flags");
  UR_KJT_TRY(cub::DeviceScan::InclusiveSum(tmp, sum_bytes, a + 1, a + 1, nb, s), "count scan");
  UR_KJT_TRY(cub::DeviceScan::InclusiveSum(tmp, sum_bytes, c + 1, c + 1, nb, s), "value scan");
  UR_KJT_TRY(ur__cuda_kjt_dedup_scatter(s, rep, a, nb, stride, map, inv), "inverse");
  UR_KJT_TRY(ur__cuda_kjt_gather_i64(s, a, nullptr, stride, (int64_t)n1, at), "key counts");
  UR_KJT_TRY(ur__cuda_kjt_gather_i64(s, c, nullptr, stride, (int64_t)n1, at + n1), "key values");
  int64_t *h = (int64_t *)malloc(2 * n1 * 8);
  if (!h) return ur_kjt_host_oom(op);
  cudaError_t e = cudaMemcpyAsync(h, at, 2 * n1 * 8, cudaMemcpyDeviceToHost, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  if (e == cudaSuccess) {
    for (int32_t k = 0; k < nkeys; k++) spk[k] = h[k + 1] - h[k];
    memcpy(val0, h + n1, n1 * 8);
  }
  free(h);
  UR_KJT_TRY(e, "counts down");
  return UR_STATUS_OK;
}

/* ---- from sample-major rows ---- */

/* Bag b = k * n + i: its length (hot[k] without len; a bad one is flagged and left empty). */
__global__ void ur_kjt_rows_len_kernel(const int32_t *len, int64_t n, int32_t nkeys,
                                       const int32_t *hot, int32_t *len_out,
                                       unsigned long long *bad) {
  UR_KJT_LOOP(b, (int64_t)nkeys * n) {
    int32_t k = (int32_t)(b / n);
    int64_t i = b - (int64_t)k * n;
    int32_t l = len ? len[i * nkeys + k] : hot[k];
    if (l < 0 || l > hot[k]) {
      if (bad) atomicMin(bad, (unsigned long long)b);
      l = 0;
    }
    len_out[b] = l;
  }
}

/* Offsets when every bag is full: bag (k, i) ends at n * col0[k] + (i + 1) * hot[k]. */
__global__ void ur_kjt_rows_full_off_kernel(int64_t n, int32_t nkeys, const int64_t *col0,
                                            const int32_t *hot, int64_t *off) {
  UR_KJT_LOOP(b, (int64_t)nkeys * n) {
    int32_t k = (int32_t)(b / n);
    int64_t i = b - (int64_t)k * n;
    off[b + 1] = n * col0[k] + (i + 1) * hot[k];
    if (b == 0) off[0] = 0;
  }
}

__global__ void ur_kjt_rows_copy_kernel(const int64_t *ids, const float *w, int64_t n,
                                        int32_t nkeys, int64_t H, const int64_t *col0,
                                        const int32_t *len, const int64_t *off, int64_t *val,
                                        float *w_out) {
  UR_KJT_LOOP(b, (int64_t)nkeys * n) {
    int32_t k = (int32_t)(b / n);
    int64_t i = b - (int64_t)k * n, o = off[b], src = i * H + col0[k];
    for (int32_t q = 0; q < len[b]; q++) {
      val[o + q] = ids[src + q];
      if (w_out) w_out[o + q] = w[src + q];
    }
  }
}

static ur_status ur_cuda_kjt_from_rows(void *stream, const int64_t *ids, const float *w,
                                       const int32_t *len, int64_t n, int32_t nkeys, int64_t H,
                                       const int64_t *col0, const int32_t *hot, int32_t *len_out,
                                       int64_t *off_out, int64_t *val_out, float *w_out,
                                       int64_t *val0, int64_t *bad) {
  cudaStream_t s = (cudaStream_t)stream;
  const char *op = "from rows";
  int64_t nb = (int64_t)nkeys * n;
  size_t n1 = (size_t)nkeys + 1;
  ur_kjt_scratch sc(s);
  ur_status st = sc.alloc(sc.up(n1 * 8) + sc.up(n1 * 4) + sc.up(8), op);
  if (st) return st;
  int64_t *d_col0 = sc.take<int64_t>(n1);
  int32_t *d_hot = sc.take<int32_t>(n1);
  unsigned long long *d_bad = sc.take<unsigned long long>(1);
  /* from pageable memory: the copies are staged before they return, so the caller's arrays
   * may go */
  UR_KJT_TRY(cudaMemcpyAsync(d_col0, col0, (size_t)nkeys * 8, cudaMemcpyHostToDevice, s), "columns up");
  UR_KJT_TRY(cudaMemcpyAsync(d_hot, hot, (size_t)nkeys * 4, cudaMemcpyHostToDevice, s), "widths up");
  if (len) UR_KJT_TRY(cudaMemsetAsync(d_bad, 0xff, 8, s), "clear");
  unsigned grid = ur_kjt_blocks(nb, UR_KJT_THREADS);
  if (nb > 0) {
    ur_kjt_rows_len_kernel<<<grid, UR_KJT_THREADS, 0, s>>>(len, n, nkeys, d_hot, len_out,
                                                          len ? d_bad : nullptr);
    UR_KJT_TRY(cudaGetLastError(), "lengths");
  }
  if (len) {
    int64_t *bag0 = (int64_t *)malloc(n1 * 8), neg[2];
    if (!bag0) return ur_kjt_host_oom(op);
    for (size_t k = 0; k < n1; k++) bag0[k] = (int64_t)k * n;
    st = ur_kjt_offsets_run(s, len_out, nb, off_out, bag0, nkeys, INT64_MAX, val0, neg, op);
    free(bag0);
    if (st) return st;
  } else {
    if (nb > 0) {
      ur_kjt_rows_full_off_kernel<<<grid, UR_KJT_THREADS, 0, s>>>(n, nkeys, d_col0, d_hot, off_out);
      UR_KJT_TRY(cudaGetLastError(), "offsets");
    } else {
      UR_KJT_TRY(cudaMemsetAsync(off_out, 0, 8, s), "offsets");
    }
  }
  if (nb > 0) {
    ur_kjt_rows_copy_kernel<<<grid, UR_KJT_THREADS, 0, s>>>(ids, w, n, nkeys, H, d_col0, len_out,
                                                           off_out, val_out, w_out);
    UR_KJT_TRY(cudaGetLastError(), "copy");
  }
  if (!len) return UR_STATUS_OK;
  unsigned long long hb = ~0ull;
  UR_KJT_TRY(cudaMemcpyAsync(&hb, d_bad, 8, cudaMemcpyDeviceToHost, s), "check down");
  UR_KJT_TRY(cudaStreamSynchronize(s), "wait");
  *bad = hb == ~0ull ? -1 : (int64_t)hb;
  return UR_STATUS_OK;
}

/* ---- row-wise bucketing ---- */

/* A thread per bag: bags are short, and each bag's counts are its own thread's. */
__global__ void ur_kjt_bucket_count_kernel(const int64_t *off, const int64_t *val, int64_t nb,
                                           int64_t block, int64_t rows, int32_t buckets,
                                           int32_t *cnt, unsigned long long *bad) {
  UR_KJT_LOOP(j, nb) {
    for (int32_t b = 0; b < buckets; b++) cnt[(int64_t)b * nb + j] = 0;
    for (int64_t v = off[j]; v < off[j + 1]; v++) {
      int64_t id = val[v];
      if (id < 0 || id >= rows) {
        atomicMin(bad, (unsigned long long)v);
        continue;
      }
      cnt[(id / block) * nb + j]++;
    }
  }
}

static ur_status ur_cuda_kjt_bucket_count(void *stream, const int64_t *off, const int64_t *val,
                                          int64_t nb, int64_t block, int64_t rows,
                                          int32_t buckets, int32_t *cnt, int64_t *bad) {
  cudaStream_t s = (cudaStream_t)stream;
  const char *op = "bucket count";
  ur_kjt_scratch w(s);
  ur_status st = w.alloc(w.up(8), op);
  if (st) return st;
  unsigned long long *d_bad = w.take<unsigned long long>(1), h_bad = 0;
  UR_KJT_TRY(cudaMemsetAsync(d_bad, 0xff, 8, s), "flag");
  if (nb > 0) {
    ur_kjt_bucket_count_kernel<<<ur_kjt_blocks(nb, UR_KJT_THREADS), UR_KJT_THREADS, 0, s>>>(
        off, val, nb, block, rows, buckets, cnt, d_bad);
    UR_KJT_TRY(cudaGetLastError(), "count");
  }
  UR_KJT_TRY(cudaMemcpyAsync(&h_bad, d_bad, 8, cudaMemcpyDeviceToHost, s), "flag down");
  UR_KJT_TRY(cudaStreamSynchronize(s), "wait");
  *bad = h_bad == ~0ull ? -1 : (int64_t)h_bad;
  return UR_STATUS_OK;
}

/* A thread per bag, each bucket in turn, so each output bag is filled in the input's order. */
__global__ void ur_kjt_bucket_fill_kernel(const int64_t *off, const int64_t *val, const float *w,
                                          int64_t nb, int64_t block, int32_t buckets,
                                          const int64_t *off_out, int64_t *val_out,
                                          float *w_out) {
  UR_KJT_LOOP(j, nb) {
    for (int32_t b = 0; b < buckets; b++) {
      int64_t d = off_out[(int64_t)b * nb + j];
      for (int64_t v = off[j]; v < off[j + 1]; v++)
        if (val[v] / block == b) {
          val_out[d] = val[v] - (int64_t)b * block;
          if (w) w_out[d] = w[v];
          d++;
        }
    }
  }
}

static ur_status ur_cuda_kjt_bucket_fill(void *stream, const int64_t *off, const int64_t *val,
                                         const float *w, int64_t nb, int64_t block,
                                         int32_t buckets, const int64_t *off_out,
                                         int64_t *val_out, float *w_out) {
  const char *op = "bucket fill";
  if (nb > 0)
    ur_kjt_bucket_fill_kernel<<<ur_kjt_blocks(nb, UR_KJT_THREADS), UR_KJT_THREADS, 0,
                                (cudaStream_t)stream>>>(off, val, w, nb, block, buckets, off_out,
                                                        val_out, w_out);
  UR_KJT_TRY(cudaGetLastError(), "fill");
  return UR_STATUS_OK;
}

const ur_kjt_ops ur__cuda_kjt_ops = {
    .offsets = ur_cuda_kjt_offsets,
    .validate = ur_cuda_kjt_validate,
    .segments = ur_cuda_kjt_segments,
    .expand_map = ur_cuda_kjt_expand_map,
    .bag_lengths = ur_cuda_kjt_bag_lengths,
    .bag_copy = ur_cuda_kjt_bag_copy,
    .expand_rows = ur_cuda_kjt_expand_rows,
    .dedup = ur_cuda_kjt_dedup,
    .from_rows = ur_cuda_kjt_from_rows,
    .bucket_count = ur_cuda_kjt_bucket_count,
    .bucket_fill = ur_cuda_kjt_bucket_fill,
};
