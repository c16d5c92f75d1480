/* tbe.cu: the embedding collection's kernels and the CUDA backend's tbe table.  Forward: one
 * warp per 32 consecutive bags; the warp walks their values as one stream, each lane loading a
 * 16-byte slice (8 bytes for half tables among f32 ones) of U rows before it adds any, so many
 * rows are in flight whatever the bag sizes.
 * Backward: only what must be sorted is: (row key, payload) pairs, keys of table and row bits
 * just wide enough for the collection's rows (32-bit keys up to 2^32 rows), 4-byte payloads
 * pointing back into the output's gradient (the bag, or the value when weights or pooling
 * none need it), never gradient rows, sorted by cub's radix sort (stable: a row's values stay
 * in value order).  The sorted keys' runs are the segments (a run starts where the key
 * changes).  A warp takes 32 short segments (UR_TBE_SHORT entries or fewer), a few at a time (a
 * window: its gradient rows two at a time in flight, each added into its segment's sum in
 * shared memory, its rows prefetched into L2), or one middling segment (a list of them: up to
 * UR_TBE_HOT entries), sums each one's gradient rows in that order and steps the optimizer once
 * a row, the same sum as the CPU reference's
 * (tbe_plan.h's arithmetic, unfused); segments of more than UR_TBE_HOT entries are cut into
 * chunks of UR_TBE_CHUNK, a CTA each, whose partial sums a warp per segment adds in chunk
 * order.  No atomics touch floats, so a run is bit-identical to the next.  The one exception,
 * asked for (nondeterministic, SGD on f32 rows): no sort, every value adds its update to its
 * row with a vector atomic.
 * Far rows (tbe_plan.h's ur__tbe_far: rows of managed or host tables outside the GPU's part,
 * read over the host link): a forward that fills the copies writes each far row it reads, the
 * first lookup of it, into HBM beside a map from its key; the backward's step reads a far row
 * from its copy (and prefetches the copy, not the row) and writes the stepped row to both, so
 * the link carries each far row once a step in each direction instead of twice in.  Early
 * copies (ur_tbe_far_prefetch): the next batch's far rows copied into the next map (far.c's maps
 * are taken in turn) on another stream while this step computes (far_prefetch_kernel), the
 * forward that takes them reading its far rows from HBM.  Written behind
 * (ur_tbe_set_far_behind): the step writes the copy only, and far_move_kernel writes the copies
 * home on another stream behind it.
 * Indices are 64-bit where they address tables (100 GB tables have more than 2^31 elements);
 * values and bags are fewer than 2^31 (tbe.c checks). */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <cub/device/device_select.cuh>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>

#include "common.cuh"
#include "embedding/tbe.h"

#define UR_TBE_WARPS 8      /* warps per block */
#define UR_TBE_SHORT 8      /* rows read this often or less: summed a window at a time, 32 a warp */
#define UR_TBE_HOT 256      /* a row read more often than this is summed in chunks */
#define UR_TBE_CHUNK 256    /* entries a CTA sums into one partial (a multiple of UR_TBE_WARPS) */
#define UR_TBE_ALIGN 256
#define UR_TBE_STAGE 8192   /* bytes of gradient rows a warp of mid_kernel or chunk_kernel stages */

namespace {

const unsigned kFull = 0xffffffffu;

/* ---- small helpers ---- */

/* Bags are fewer than 2^31 on the GPU (tbe.c checks), so a 32-bit division does. */
__device__ __forceinline__ int32_t feature_of(const ur__tbe_args &a, int64_t bag) {
  if (!a.bag_start) return (int32_t)((uint32_t)bag / (uint32_t)a.batch);
  int32_t lo = 0, hi = a.num_features;
  while (hi - lo > 1) {
    int32_t mid = (lo + hi) / 2;
    if (a.bag_start[mid] <= bag) lo = mid;
    else hi = mid;
  }
  return lo;
}

__device__ __forceinline__ int esize(int32_t dtype) { return dtype == UR_DTYPE_F32 ? 4 : 2; }

__device__ __forceinline__ const void *shfl_ptr(const void *p, int src) {
  return (const void *)__shfl_sync(kFull, (long long)p, src);
}

/* E consecutive elements at p (f32, or f16/bf16 bits) as raw bits: one 16-byte load, or 8 for
 * E = 4 halves.  The caller's address is aligned to the load (tables and outputs are). */
template <int E>
__device__ __forceinline__ uint4 load_raw(const void *p, int32_t dtype) {
  if (dtype == UR_DTYPE_F32) {
    if (E == 4) return __ldg(reinterpret_cast<const uint4 *>(p));
    return make_uint4(0, 0, 0, 0); /* E = 8 is only chosen when every table is a half */
  }
  if (E == 8) return __ldg(reinterpret_cast<const uint4 *>(p));
  uint2 h = __ldg(reinterpret_cast<const uint2 *>(p));
  return make_uint4(h.x, h.y, 0, 0);
}

/* The same through the coherent path, for rows this kernel also writes. */
template <int E>
__device__ __forceinline__ uint4 load_raw_rw(const void *p, int32_t dtype) {
  if (dtype == UR_DTYPE_F32 || E == 8) return *reinterpret_cast<const uint4 *>(p);
  uint2 h = *reinterpret_cast<const uint2 *>(p);
  return make_uint4(h.x, h.y, 0, 0);
}

/* E raw elements to p, as load_raw read them. */
template <int E>
__device__ __forceinline__ void store_raw(void *p, int32_t dtype, uint4 r) {
  if (dtype == UR_DTYPE_F32 || E == 8) *reinterpret_cast<uint4 *>(p) = r;
  else *reinterpret_cast<uint2 *>(p) = make_uint2(r.x, r.y);
}

/* The table whose keys (key_base + id) hold key. */
__device__ __forceinline__ int32_t table_of_key(const ur__tbe_args &a, uint64_t key) {
  int32_t lo = 0, hi = a.num_tables;
  while (hi - lo > 1) {
    int32_t mid = (lo + hi) / 2;
    if ((uint64_t)a.tables[mid].key_base <= key) lo = mid;
    else hi = mid;
  }
  return lo;
}

/* ---- far rows' copies (ur__tbe_far) ---- */

#define UR_TBE_FAR_UNPLACED (-2) /* far_claim found no free slot where it looked */

/* The slot of `key` in f's map, or -1 where it holds none. */
__device__ __forceinline__ int64_t far_find(const ur__tbe_far &f, uint64_t key) {
  unsigned long long k = key + 1;
  uint64_t s = ur__tbe_far_slot(&f, key);
  for (int p = 0; p < UR_TBE_FAR_PROBES; p++, s = (s + 1) & (uint64_t)f.mask) {
    unsigned long long v = f.keys[s];
    if (v == k) return (int64_t)s;
    if (v == 0ull) return -1;
  }
  return -1;
}

/* The forward's claim on the copy of far row `key`: where in f.rows to write it, or -1 (an
 * earlier lookup of the row claimed it, or no copy had room: the row stays uncopied), or
 * UR_TBE_FAR_UNPLACED (uncopied and uncounted: the forward counts these lookups, a warp's at a
 * time, for far_taken).  Where an early copy of the row is there (made before this kernel:
 * below pre), *early points at it. */
__device__ __forceinline__ int32_t far_claim(const ur__tbe_far &f, uint64_t key, int32_t pre,
                                             const char **early) {
  unsigned long long k = key + 1;
  uint64_t s = ur__tbe_far_slot(&f, key);
  for (int p = 0; p < UR_TBE_FAR_PROBES; p++, s = (s + 1) & (uint64_t)f.mask) {
    unsigned long long old = atomicCAS(f.keys + s, 0ull, k);
    if (old == k) {
      /* at is -1 until its claim writes it (early copies clear it): only those below pre are
       * early, and complete */
      int32_t at = pre > 0 ? f.at[s] : -1;
      if (at >= 0 && at < pre) *early = f.rows + (int64_t)at * f.row_bytes;
      return -1;
    }
    if (old == 0ull) {
      int32_t at = atomicAdd(f.taken + UR__FAR_ASKED, 1);
      at = at < f.cap ? at : -1;
      f.at[s] = at;
      return at;
    }
  }
  return UR_TBE_FAR_UNPLACED;
}

/* Copy `at`'s home: where its row is and how many bytes (what writes it home reads). */
__device__ __forceinline__ void far_home_of(const ur__tbe_far &f, int32_t at, const char *home,
                                            int32_t bytes) {
  f.homes[2 * at] = bytes;
  f.homes[2 * at + 1] = (int64_t)home;
}

/* Where a forward reads far row `key` whose home is `home` while the last backward's copies
 * (prior) are written home behind it: its copy there, where it has one. */
__device__ __forceinline__ const char *far_prior(const ur__tbe_far &prior, uint64_t key,
                                                 const char *home) {
  int64_t s = far_find(prior, key);
  int32_t at = s >= 0 ? prior.at[s] : -1;
  return at >= 0 ? prior.rows + (int64_t)at * prior.row_bytes : home;
}

/* The backward's copy of row id of table t, or nullptr (not far, not copied, or no copies): it
 * steps the row from there and writes the stepped row back there too. */
__device__ __forceinline__ char *far_row(const ur__tbe_args &a, int32_t t, int64_t id) {
  if (!a.far.use) return nullptr;
  const ur__tbe_table &tb = a.tables[t];
  if (tb.far_from >= tb.rows || (tb.perm ? tb.perm[id] : id) < tb.far_from) return nullptr;
  int64_t s = far_find(a.far, (uint64_t)(tb.key_base + id));
  int32_t at = s >= 0 ? a.far.at[s] : -1;
  return at >= 0 ? a.far.rows + (int64_t)at * a.far.row_bytes : nullptr;
}

template <int E>
__device__ __forceinline__ void unpack(uint4 r, int32_t dtype, float *v) {
  if (dtype == UR_DTYPE_F32) {
    v[0] = __uint_as_float(r.x);
    v[1] = __uint_as_float(r.y);
    v[2] = __uint_as_float(r.z);
    v[3] = __uint_as_float(r.w);
    return;
  }
  unsigned w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
  for (int k = 0; k < E; k++) {
    uint16_t h = (uint16_t)(w[k / 2] >> (16 * (k & 1)));
    v[k] = dtype == UR_DTYPE_BF16 ? __uint_as_float((unsigned)h << 16)
                                  : __half2float(__ushort_as_half(h));
  }
}

/* Same for the output and its gradient, which are f32 or bf16 (round to nearest even). */
template <int E>
__device__ __forceinline__ void store_out(void *out, int32_t dtype, int64_t at, const float *v) {
  if (dtype == UR_DTYPE_F32) {
    float4 *p = reinterpret_cast<float4 *>((float *)out + at);
#pragma unroll
    for (int k = 0; k < E / 4; k++) p[k] = make_float4(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
    return;
  }
  unsigned w[4];
#pragma unroll
  for (int k = 0; k < E / 2; k++)
    w[k] = (unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(v[2 * k])) |
           ((unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(v[2 * k + 1])) << 16);
  uint16_t *o = (uint16_t *)out + at;
  if (E == 8) *reinterpret_cast<uint4 *>(o) = make_uint4(w[0], w[1], w[2], w[3]);
  else *reinterpret_cast<uint2 *>(o) = make_uint2(w[0], w[1]);
}

template <int E>
__device__ __forceinline__ void load_out(const void *g, int32_t dtype, int64_t at, float *v) {
  if (dtype == UR_DTYPE_F32) {
    const float4 *p = reinterpret_cast<const float4 *>((const float *)g + at);
#pragma unroll
    for (int k = 0; k < E / 4; k++) {
      float4 x = __ldg(p + k);
      v[4 * k] = x.x;
      v[4 * k + 1] = x.y;
      v[4 * k + 2] = x.z;
      v[4 * k + 3] = x.w;
    }
    return;
  }
  unpack<E>(load_raw<E>((const uint16_t *)g + at, UR_DTYPE_BF16), UR_DTYPE_BF16, v);
}

/* ---- far rows' early copies ---- */

/* Early copies of a batch's far rows into a.far (cleared, at -1), a warp per 32 bags, each lane
 * its bag's values in turn.  A row of the current map (cur.use: the last forward's, whose
 * backward may still step it) is not read here: where cur has its copy, the pair waits for
 * far_patch_kernel; where it has none, the row is left to the forward.  A row the last step's
 * map has a copy of (a.prior.use; its copies may still be going home) is copied from there
 * (far_patch_kernel with prior, after the loads), the pair at the top of a.far.pairs.  Where the
 * current forward found no slot for some far row (UR__FAR_UNPLACED), its far rows are not all
 * known, and nothing is copied early. */
__global__ void __launch_bounds__(UR_TBE_WARPS * 32)
    far_prefetch_kernel(const ur__tbe_args a, const ur__tbe_far cur) {
  if (cur.use && cur.taken[UR__FAR_UNPLACED] > 0) return;
  int lane = threadIdx.x & 31;
  int64_t bag0 = ((int64_t)blockIdx.x * UR_TBE_WARPS + threadIdx.x / 32) * 32;
  if (bag0 >= a.bags) return;
  int64_t bag = bag0 + lane, s = 0, e = 0;
  const ur__tbe_table *tb = nullptr;
  if (bag < a.bags) {
    ur__tbe_bag_span(a.offsets, a.n, bag, &s, &e);
    tb = a.tables + a.features[feature_of(a, bag)].table;
  }
  int64_t most = e - s;
#pragma unroll
  for (int o = 16; o; o >>= 1) most = max(most, __shfl_xor_sync(kFull, most, o));
  for (int64_t k = 0; k < most; k++) {
    int32_t at = -1;
    if (s + k < e) {
      int64_t id = a.values[s + k];
      int64_t pr = id >= 0 && id < tb->rows ? (tb->perm ? tb->perm[id] : id) : -1;
      if (pr >= 0 && pr >= tb->far_from) {
        uint64_t key = (uint64_t)(tb->key_base + id);
        int64_t cs = cur.use ? far_find(cur, key) : -1;
        int32_t ca = cs >= 0 ? cur.at[cs] : -1;
        int64_t ps = cs < 0 && a.prior.use ? far_find(a.prior, key) : -1;
        int32_t pa = ps >= 0 ? a.prior.at[ps] : -1;
        if (cs < 0 || ca >= 0) at = far_claim(a.far, key, 0, nullptr);
        if (at == UR_TBE_FAR_UNPLACED) atomicAdd(a.far.taken + UR__FAR_UNPLACED, 1);
        int32_t bytes = tb->dim * esize(tb->dtype);
        char *home = (char *)tb->weights + pr * bytes;
        if (at >= 0) far_home_of(a.far, at, home, bytes);
        if (at >= 0 && cs >= 0) { /* from cur's copy, once the backward has stepped it */
          int32_t q = atomicAdd(a.far.taken + UR__FAR_PAIRS, 1);
          a.far.pairs[2 * q] = at;
          a.far.pairs[2 * q + 1] = ca;
          at = -1;
        } else if (at >= 0 && pa >= 0) { /* from the last step's copy, the newest */
          int32_t q = a.far.cap - 1 - atomicAdd(a.far.taken + UR__FAR_PRIOR_PAIRS, 1);
          a.far.pairs[2 * q] = at;
          a.far.pairs[2 * q + 1] = pa;
        } else if (at >= 0) { /* read by far_move_kernel or far.c's copy engines */
          int32_t q = atomicAdd(a.far.taken + UR__FAR_LOADS, 1);
          a.far.loads[2 * q] = (int64_t)at | (int64_t)bytes << 32;
          a.far.loads[2 * q + 1] = (int64_t)home;
        }
      }
    }
  }
}

/* Rows moved between their homes and a.far's copies over the host link: a few warps, each with
 * UR_TBE_FAR_LOADS rows in flight at a time, 8 bytes a lane a row per round, so that the
 * link's latency is covered without holding the SMs the step computes on.  TO_HOME false: the
 * early copies' reads (far_prefetch_kernel's loads); true: every copy written home behind the
 * step (ur_tbe_set_far_behind), to where homes says.  (far.c moves them through the copy
 * engines instead with ur_tbe_set_far_dma.) */
#define UR_TBE_FAR_LOADS 8
template <bool TO_HOME>
__global__ void __launch_bounds__(UR_TBE_WARPS * 32)
    far_move_kernel(const ur__tbe_far f) {
  int lane = threadIdx.x & 31;
  int32_t n = TO_HOME ? min(f.taken[UR__FAR_ASKED], f.cap) : f.taken[UR__FAR_LOADS];
  int64_t warps = (int64_t)gridDim.x * UR_TBE_WARPS;
  for (int64_t q0 = ((int64_t)blockIdx.x * UR_TBE_WARPS + threadIdx.x / 32) * UR_TBE_FAR_LOADS; q0 < n;
       q0 += warps * UR_TBE_FAR_LOADS) {
    const char *from[UR_TBE_FAR_LOADS];
    char *to[UR_TBE_FAR_LOADS];
    int32_t bytes[UR_TBE_FAR_LOADS], most = 0;
#pragma unroll
    for (int k = 0; k < UR_TBE_FAR_LOADS; k++) {
      bytes[k] = 0;
      if (q0 + k >= n) continue;
      const int64_t *e = (TO_HOME ? f.homes : f.loads) + 2 * (q0 + k);
      int64_t at = TO_HOME ? q0 + k : (e[0] & 0xffffffff);
      bytes[k] = (int32_t)(TO_HOME ? e[0] : e[0] >> 32);
      char *home = (char *)e[1], *copy = f.rows + at * f.row_bytes;
      from[k] = TO_HOME ? copy : home;
      to[k] = TO_HOME ? home : copy;
      most = max(most, bytes[k]);
    }
    for (int32_t o = lane * 8; o < most; o += 32 * 8) {
      uint2 v[UR_TBE_FAR_LOADS];
#pragma unroll
      for (int k = 0; k < UR_TBE_FAR_LOADS; k++)
        if (o < bytes[k]) v[k] = *reinterpret_cast<const uint2 *>(from[k] + o);
#pragma unroll
      for (int k = 0; k < UR_TBE_FAR_LOADS; k++)
        if (o < bytes[k]) *reinterpret_cast<uint2 *>(to[k] + o) = v[k];
    }
  }
}

/* The copies in slots [from, the copies made) moved between HBM and the same slots of pinned
 * host memory, 16 bytes a thread: the rows set_far_dma's copy engines left (far.c moves a
 * batch's copies before the GPU has counted them, as many as the last batches had). */
__global__ void __launch_bounds__(UR_TBE_WARPS * 32)
    far_spill_kernel(const ur__tbe_far f, char *host, int64_t from, bool to_host) {
  int64_t made = min(f.taken[UR__FAR_ASKED], f.cap);
  int64_t lo = from * f.row_bytes / 16, hi = made * f.row_bytes / 16;
  uint4 *dev = reinterpret_cast<uint4 *>(f.rows), *pin = reinterpret_cast<uint4 *>(host);
  for (int64_t i = lo + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < hi; i += (int64_t)gridDim.x * blockDim.x) {
    if (to_host) pin[i] = dev[i];
    else dev[i] = pin[i];
  }
}

/* The pairs of early copies (far_prefetch_kernel's), a warp each, from src's copies: the rows
 * cur's backward stepped (PRIOR false: from the bottom of f.pairs), or the rows of the last
 * step's map (true: from the top). */
template <bool PRIOR>
__global__ void __launch_bounds__(UR_TBE_WARPS * 32)
    far_patch_kernel(const ur__tbe_far f, const ur__tbe_far src) {
  int lane = threadIdx.x & 31;
  int32_t n = f.taken[PRIOR ? UR__FAR_PRIOR_PAIRS : UR__FAR_PAIRS];
  int64_t warps = (int64_t)gridDim.x * UR_TBE_WARPS;
  /* the copies' slots are row_bytes apart, a multiple of 16 (far.c), and so is each copy */
  for (int64_t q = (int64_t)blockIdx.x * UR_TBE_WARPS + threadIdx.x / 32; q < n; q += warps) {
    const int32_t *p = f.pairs + 2 * (PRIOR ? f.cap - 1 - q : q);
    char *to = f.rows + (int64_t)p[0] * f.row_bytes;
    const char *from = src.rows + (int64_t)src.row_bytes * p[1];
    for (int32_t o = lane * 16; o < f.row_bytes; o += 32 * 16)
      *reinterpret_cast<uint4 *>(to + o) = *reinterpret_cast<const uint4 *>(from + o);
  }
}

/* ---- the warp's bags ---- */

/* A warp's group of up to 32 bags from bag0: lane j holds bag bag0 + j's span, and P, the
 * values of the bags before it; T is the group's value count. */
struct Group {
  int64_t s, len, P, T;
  int nb;
};

__device__ __forceinline__ Group group_of(const ur__tbe_args &a, int64_t bag0, int lane) {
  Group g;
  int64_t bag = bag0 + lane, s = 0, e = 0;
  if (bag < a.bags) ur__tbe_bag_span(a.offsets, a.n, bag, &s, &e);
  g.s = s;
  g.len = e - s;
  int64_t incl = g.len;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    int64_t y = __shfl_up_sync(kFull, incl, o);
    if (lane >= o) incl += y;
  }
  g.P = incl - g.len;
  g.T = __shfl_sync(kFull, incl, 31);
  int64_t left = a.bags - bag0;
  g.nb = left < 32 ? (int)left : 32;
  return g;
}

/* Which of the group's bags holds stream position p (each lane its own p): the last j with
 * P_j <= p, which is never an empty bag. */
__device__ __forceinline__ int bag_at(const Group &g, int64_t p) {
  int j = 0;
#pragma unroll
  for (int step = 16; step; step >>= 1) {
    int64_t pc = __shfl_sync(kFull, g.P, j + step);
    if (pc <= p) j += step;
  }
  return j;
}

/* ---- forward ---- */

/* Per bag of the group (lane j): where its row goes and how to scale it. */
struct BagInfo {
  const char *w;     /* its table's rows */
  int64_t rows, out;
  int32_t row_bytes, dim, dtype;
  float scale;       /* 1 / length under mean, else 1 */
  const int64_t *perm; /* id -> physical row, or NULL */
  int64_t far_from, key_base; /* read only where the forward copies far rows */
};

__device__ __forceinline__ BagInfo bag_info(const ur__tbe_args &a, int64_t bag, int64_t len) {
  BagInfo b = {nullptr, 0, 0, 0, 0, UR_DTYPE_F32, 1.0f, nullptr, 0, 0};
  if (bag >= a.bags) return b;
  int32_t f = feature_of(a, bag);
  const ur__tbe_feature ft = a.features[f];
  const ur__tbe_table &tb = a.tables[ft.table];
  b.w = (const char *)tb.weights;
  b.perm = tb.perm;
  b.rows = tb.rows;
  b.dim = tb.dim;
  b.dtype = tb.dtype;
  b.row_bytes = tb.dim * esize(tb.dtype);
  b.far_from = tb.far_from;
  b.key_base = tb.key_base;
  b.out = ur__tbe_out_at(a.out_base, a.out_stride, f, &ft, bag - ur__tbe_first_bag(&a, f));
  if (tb.pooling == UR_POOLING_MEAN && len > 0) b.scale = UR_FDIV(1.0f, (float)len);
  return b;
}

/* What the group's bags share, when they do (the usual case: 32 bags of one feature), so that
 * the per-value loop need not ask each bag's lane.  All fields are warp-uniform. */
struct Common {
  bool same;     /* one dim and dtype for every bag of the group */
  bool scaled;   /* some bag pools by mean */
  int dim, dtype;
};

__device__ __forceinline__ Common common_of(const ur__tbe_args &a, int64_t bag0, const BagInfo &mine,
                                            int lane) {
  Common c;
  c.dim = __shfl_sync(kFull, mine.dim, 0);
  c.dtype = __shfl_sync(kFull, mine.dtype, 0);
  bool mine_ok = bag0 + lane >= a.bags || (mine.dim == c.dim && mine.dtype == c.dtype);
  c.same = __all_sync(kFull, mine_ok);
  c.scaled = __any_sync(kFull, mine.scale != 1.0f);
  return c;
}

__device__ __forceinline__ int dim_of(const Common &c, const BagInfo &mine, int j) {
  return c.same ? c.dim : __shfl_sync(kFull, mine.dim, j);
}

__device__ __forceinline__ int dtype_of(const Common &c, const BagInfo &mine, int j) {
  return c.same ? c.dtype : __shfl_sync(kFull, mine.dtype, j);
}

/* Writes the group's bag j (acc scaled as its pooling says), then zeros for the empty bags up
 * to (not including) next. */
template <int NV, int E>
__device__ __forceinline__ void flush(const ur__tbe_args &a, const BagInfo &mine, const Common &cm,
                                      int j, int next, float (&acc)[NV][E], int lane) {
  for (int b = j; b < next; b++) {
    int64_t out = __shfl_sync(kFull, mine.out, b);
    int dim = dim_of(cm, mine, b);
    float scale = cm.scaled ? __shfl_sync(kFull, mine.scale, b) : 1.0f;
#pragma unroll
    for (int v = 0; v < NV; v++) {
      int col = (v * 32 + lane) * E;
      if (col >= dim) continue;
      float o[E];
#pragma unroll
      for (int k = 0; k < E; k++) o[k] = b == j ? (scale == 1.0f ? acc[v][k] : UR_FMUL(acc[v][k], scale)) : 0.0f;
      store_out<E>(a.out, a.out_dtype, out + col, o);
    }
  }
}

/* A lane's sums of NV * E columns, set to zero. */
template <int NV, int E>
__device__ __forceinline__ void zero_acc(float (&acc)[NV][E]) {
#pragma unroll
  for (int v = 0; v < NV; v++)
#pragma unroll
    for (int e = 0; e < E; e++) acc[v][e] = 0.0f;
}

template <int NV, int E, int U, bool POOLED, bool FAR>
__global__ void __launch_bounds__(UR_TBE_WARPS * 32)
    fwd_kernel(const ur__tbe_args a) {
  int lane = threadIdx.x & 31;
  int64_t bag0 = ((int64_t)blockIdx.x * UR_TBE_WARPS + threadIdx.x / 32) * 32;
  if (bag0 >= a.bags) return;
  Group g = group_of(a, bag0, lane);
  BagInfo mine = bag_info(a, bag0 + lane, g.len);
  Common cm = common_of(a, bag0, mine, lane);
  /* the early copies: made before this kernel */
  const int32_t pre = FAR ? a.far.taken[UR__FAR_EARLY] : 0;
  float acc[NV][E];
  zero_acc(acc);
  int cj = 0;
  for (int64_t base = 0; base < g.T; base += 32) {
    /* Each lane resolves one value of the stream: its row's address and weight. */
    int64_t p = base + lane;
    int j = bag_at(g, p);
    int64_t i = __shfl_sync(kFull, g.s, j) + (p - __shfl_sync(kFull, g.P, j));
    const char *tw = (const char *)shfl_ptr(mine.w, j);
    const int64_t *pm = (const int64_t *)shfl_ptr(mine.perm, j);
    int64_t rows = __shfl_sync(kFull, mine.rows, j);
    int rb = __shfl_sync(kFull, mine.row_bytes, j);
    int64_t ff = FAR ? __shfl_sync(kFull, mine.far_from, j) : 0;
    int64_t kb = FAR ? __shfl_sync(kFull, mine.key_base, j) : 0;
    const char *row = nullptr;
    float w = 1.0f;
    int32_t copy = -1; /* where this lane's far row is copied to, or -1 */
    if (p < g.T) {
      int64_t id = a.values[i];
      bool valid = id >= 0 && id < rows;
      if (a.bounds == UR_TBE_BOUNDS_OFF || valid) {
        int64_t pr = pm ? __ldg(pm + id) : id;
        row = tw + pr * rb;
        /* an id out of bounds (bounds off) has no key of its own: it is never copied */
        /* an early copy is read in HBM instead (row points at it) */
        if (FAR && valid && pr >= ff) {
          copy = far_claim(a.far, (uint64_t)(kb + id), pre, &row);
          if (copy >= 0) far_home_of(a.far, copy, tw + pr * rb, rb);
          /* written behind the last step: its copy there is the row until it is home */
          if (a.prior.use && row == tw + pr * rb) row = far_prior(a.prior, (uint64_t)(kb + id), row);
        }
      } else ur__tbe_note_bad(a.flags, i);
      if (a.weights) w = a.weights[i];
    }
    if (FAR) { /* one atomic a warp: a room too small has many such lookups */
      unsigned lost = __ballot_sync(kFull, copy == UR_TBE_FAR_UNPLACED);
      if (lost && lane == 0) atomicAdd(a.far.taken + UR__FAR_UNPLACED, __popc(lost));
      if (copy == UR_TBE_FAR_UNPLACED) copy = -1;
    }
    int cnt = g.T - base < 32 ? (int)(g.T - base) : 32;
    for (int u = 0; u < cnt; u += U) {
      const char *rp[U];
      float wk[U];
      int jk[U];
      int64_t ik[U];
      int32_t ck[U];
      uint4 raw[U][NV];
#pragma unroll
      for (int k = 0; k < U; k++) {
        int src = (u + k) & 31;
        rp[k] = (const char *)shfl_ptr(row, src);
        wk[k] = __shfl_sync(kFull, w, src);
        jk[k] = __shfl_sync(kFull, j, src);
        ik[k] = __shfl_sync(kFull, i, src);
        ck[k] = FAR ? __shfl_sync(kFull, copy, src) : -1;
        if (u + k >= cnt) rp[k] = nullptr, ck[k] = -1;
      }
#pragma unroll
      for (int k = 0; k < U; k++) {
        int dim = dim_of(cm, mine, jk[k]);
        int dt = dtype_of(cm, mine, jk[k]);
#pragma unroll
        for (int v = 0; v < NV; v++) {
          int col = (v * 32 + lane) * E;
          raw[k][v] = rp[k] && col < dim ? load_raw<E>(rp[k] + col * esize(dt), dt) : make_uint4(0, 0, 0, 0);
        }
      }
      if (FAR) /* the far rows' copies (ck[k] is the warp's: every lane takes its slices) */
#pragma unroll
        for (int k = 0; k < U; k++) {
          int dim = dim_of(cm, mine, jk[k]);
          int dt = dtype_of(cm, mine, jk[k]);
          if (ck[k] < 0) continue;
          char *to = a.far.rows + (int64_t)ck[k] * a.far.row_bytes;
#pragma unroll
          for (int v = 0; v < NV; v++) {
            int col = (v * 32 + lane) * E;
            if (col < dim) store_raw<E>(to + col * esize(dt), dt, raw[k][v]);
          }
        }
#pragma unroll
      for (int k = 0; k < U; k++) {
        if (u + k >= cnt) break;
        int dt = dtype_of(cm, mine, jk[k]);
        if (POOLED) {
          if (jk[k] != cj) {
            flush<NV, E>(a, mine, cm, cj, jk[k], acc, lane);
            zero_acc(acc);
            cj = jk[k];
          }
          if (!rp[k]) continue;
#pragma unroll
          for (int v = 0; v < NV; v++) {
            float x[E];
            unpack<E>(raw[k][v], dt, x);
#pragma unroll
            for (int e = 0; e < E; e++) acc[v][e] = UR_FADD(acc[v][e], UR_FMUL(wk[k], x[e]));
          }
        } else {
          int dim = dim_of(cm, mine, jk[k]);
#pragma unroll
          for (int v = 0; v < NV; v++) {
            int col = (v * 32 + lane) * E;
            if (col >= dim) continue;
            float x[E];
            unpack<E>(raw[k][v], dt, x);
#pragma unroll
            for (int e = 0; e < E; e++) x[e] = rp[k] ? UR_FMUL(wk[k], x[e]) : 0.0f;
            store_out<E>(a.out, a.out_dtype, ik[k] * dim + col, x);
          }
        }
      }
    }
  }
  if (POOLED) flush<NV, E>(a, mine, cm, cj, g.nb, acc, lane);
}

/* VBE: row b of feature f of the full batch is the pooled bag inverse[f * B + b]. */
template <int E>
__global__ void expand_kernel(const ur__tbe_args a, const float *flat) {
  int lane = threadIdx.x & 31;
  int64_t r = (int64_t)blockIdx.x * UR_TBE_WARPS + threadIdx.x / 32;
  if (r >= (int64_t)a.num_features * a.full_batch) return;
  int32_t f = (int32_t)(r / a.full_batch);
  int64_t b = r - (int64_t)f * a.full_batch;
  const ur__tbe_feature ft = a.features[f];
  int64_t j = a.inverse[r];
  int64_t nb = a.bag_start[f + 1] - a.bag_start[f];
  bool ok = j >= 0 && j < nb;
  for (int col = lane * E; col < ft.dim; col += 32 * E) {
    float v[E];
#pragma unroll
    for (int k = 0; k < E; k++) v[k] = ok ? flat[a.flat_base[f] + j * ft.dim + col + k] : 0.0f;
    store_out<E>(a.out, a.out_dtype, b * a.out_stride + ft.col + col, v);
  }
}

/* ---- backward ---- */

/* Keys of every value: its row's key (table bits and row bits, key_bits wide: 32-bit keys when
 * every row's key fits), or total_keys for an id outside its table.  The payload that rides
 * along through the sort points back into the output's gradient, 4 bytes: the value's bag
 * when the bags are pooled without weights (its gradient row is the bag's), else the value
 * itself (pooling none: its own row; weighted: its weight, and its bag from vbag). */
template <typename K>
__global__ void __launch_bounds__(UR_TBE_WARPS * 32)
    keys_kernel(const ur__tbe_args a, K *keys, int32_t *pay, int32_t *vbag, int32_t *scal) {
  int lane = threadIdx.x & 31;
  int64_t bag0 = ((int64_t)blockIdx.x * UR_TBE_WARPS + threadIdx.x / 32) * 32;
  if (bag0 == 0 && lane == 0) scal[2] = (int32_t)a.n; /* n_valid until a skipped key says less */
  if (bag0 >= a.bags) return;
  Group g = group_of(a, bag0, lane);
  int64_t bag = bag0 + lane;
  int64_t rows = 0, kb = 0;
  if (bag < a.bags) {
    const ur__tbe_table &tb = a.tables[a.features[feature_of(a, bag)].table];
    rows = tb.rows;
    kb = tb.key_base;
  }
  bool by_bag = a.pooled && !a.weights;
  for (int64_t base = 0; base < g.T; base += 32) {
    int64_t p = base + lane;
    int j = bag_at(g, p);
    int64_t i = __shfl_sync(kFull, g.s, j) + (p - __shfl_sync(kFull, g.P, j));
    int64_t r = __shfl_sync(kFull, rows, j), k0 = __shfl_sync(kFull, kb, j);
    if (p >= g.T) continue;
    int64_t id = a.values[i];
    keys[i] = (K)(id >= 0 && id < r ? k0 + id : a.total_keys);
    pay[i] = (int32_t)(by_bag ? bag0 + j : i);
    if (vbag) vbag[i] = (int32_t)(bag0 + j);
  }
}

/* A segment starts where the sorted key changes (the run-length encoding of the sorted keys).
 * Keys from total_keys up are skipped: bad ids (total_keys), and values no bag covers (left
 * all ones), which bad offsets could leave; their low key_bits bits, which alone are sorted,
 * are all >= total_keys, so they sort last. */
template <typename K>
struct IsStart {
  const K *k;
  K skip;
  __device__ bool operator()(int j) const { return k[j] < skip && (j == 0 || k[j] != k[j - 1]); }
};

/* n_valid: the position of the first skipped key. */
template <typename K>
__global__ void valid_kernel(const K *k, int64_t n, K skip, int32_t *n_valid) {
  int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (j < n && k[j] >= skip && (j == 0 || k[j - 1] < skip)) *n_valid = (int32_t)j;
}

/* A long segment: more than UR_TBE_HOT entries, summed in chunks by many CTAs. */
struct IsHot {
  const int32_t *starts, *scal;
  __device__ bool operator()(int s) const {
    int ns = scal[0];
    if (s >= ns) return false;
    int end = s + 1 < ns ? starts[s + 1] : scal[2];
    return end - starts[s] > UR_TBE_HOT;
  }
};

/* A middling segment: more than UR_TBE_SHORT entries, UR_TBE_HOT or fewer (a warp each). */
struct IsMid {
  const int32_t *starts, *scal;
  __device__ bool operator()(int s) const {
    int ns = scal[0];
    if (s >= ns) return false;
    int len = (s + 1 < ns ? starts[s + 1] : scal[2]) - starts[s];
    return len > UR_TBE_SHORT && len <= UR_TBE_HOT;
  }
};

/* The sorted pairs and their segments.  scal: [0] segments, [1] long segments, [2] valid
 * entries, [3] middling segments; hot: the long segments; cend: after each long segment, the
 * chunks so far; mid: the middling segments. */
struct Sorted {
  const uint32_t *k32;
  const uint64_t *k64; /* one of the two, by key_bits */
  const int32_t *pay, *vbag, *starts, *scal, *hot, *cend, *mid;
  float *part;         /* chunk partial sums, max_dim floats apart */
};

__device__ __forceinline__ uint64_t key_at(const Sorted &s, int64_t j) {
  return s.k64 ? s.k64[j] : (uint64_t)s.k32[j];
}

/* Where segment seg's entries end: where the next one's start, the last one's where the entries
 * end (ns segments, nv entries). */
__device__ __forceinline__ int32_t seg_end(const int32_t *starts, int64_t seg, int ns, int nv) {
  return seg + 1 < ns ? starts[seg + 1] : nv;
}

/* Chunks of a long segment of len entries. */
__device__ __forceinline__ int32_t chunks_of(int64_t len) {
  return (int32_t)((len + UR_TBE_CHUNK - 1) / UR_TBE_CHUNK);
}

/* The chunks of long segment h (0 past the list's end), for the scan that places them. */
struct ChunksOf {
  const int32_t *starts, *scal, *hot;
  __device__ int32_t operator()(int h) const {
    if (h >= scal[1]) return 0;
    int s = hot[h];
    return chunks_of(seg_end(starts, s, scal[0], scal[2]) - starts[s]);
  }
};

/* Where payload p's gradient row starts (*at) and the factor it enters with (*c): the weight,
 * over the bag's length under mean pooling, as the CPU reference computes them. */
__device__ __forceinline__ void resolve(const ur__tbe_args &a, const Sorted &s, int32_t p,
                                        int32_t dim, int64_t *at, float *c) {
  if (!a.pooled) {
    *at = (int64_t)p * dim;
    *c = a.weights ? a.weights[p] : 1.0f;
    return;
  }
  int64_t bag = a.weights ? s.vbag[p] : p;
  float w = a.weights ? a.weights[p] : 1.0f;
  int32_t f = feature_of(a, bag);
  const ur__tbe_feature ft = a.features[f];
  *at = ur__tbe_out_at(a.out_base, a.out_stride, f, &ft, bag - ur__tbe_first_bag(&a, f));
  if (a.tables[ft.table].pooling == UR_POOLING_MEAN) {
    int64_t b, e;
    ur__tbe_bag_span(a.offsets, a.n, bag, &b, &e);
    w = UR_FMUL(w, UR_FDIV(1.0f, (float)(e - b)));
  }
  *c = w;
}

/* The gradient rows of entries u .. u + U - 1 of the lanes' 32, all loaded before any is added,
 * each with its factor, its segment k (k < 0: left out, as entries past cnt are) and that
 * segment's width.  Lane l resolved entry l: its factor c, its gradient row's start at, its
 * segment k and that segment's width dim. */
template <int NV, int E, int U>
struct GradRows {
  float c[U], g[U][NV][E];
  int k[U], dim[U];
};

template <int NV, int E, int U>
__device__ __forceinline__ void load_rows(const ur__tbe_args &a, float c, int64_t at, int k, int dim,
                                          int u, int cnt, int lane, GradRows<NV, E, U> &r) {
  int64_t ak[U];
#pragma unroll
  for (int q = 0; q < U; q++) {
    int src = (u + q) & 31;
    r.c[q] = __shfl_sync(kFull, c, src);
    ak[q] = __shfl_sync(kFull, at, src);
    r.k[q] = __shfl_sync(kFull, k, src);
    r.dim[q] = __shfl_sync(kFull, dim, src);
    if (u + q >= cnt) r.k[q] = -1;
  }
#pragma unroll
  for (int q = 0; q < U; q++)
#pragma unroll
    for (int v = 0; v < NV; v++) {
      int col = (v * 32 + lane) * E;
      if (r.k[q] >= 0 && col < r.dim[q]) load_out<E>(a.grad, a.out_dtype, ak[q] + col, r.g[q][v]);
    }
}

/* Adds the U rows of entries u .. u + U - 1 (load_rows) into one segment's sum acc, in order. */
template <int NV, int E, int U>
__device__ __forceinline__ void add_rows(const ur__tbe_args &a, float c, int64_t at, int dim, int u,
                                         int cnt, float (&acc)[NV][E], int lane) {
  GradRows<NV, E, U> r;
  load_rows<NV, E, U>(a, c, at, 0, dim, u, cnt, lane, r);
#pragma unroll
  for (int q = 0; q < U; q++)
#pragma unroll
    for (int v = 0; v < NV; v++)
      if (r.k[q] >= 0 && (v * 32 + lane) * E < r.dim[q])
#pragma unroll
        for (int e = 0; e < E; e++) acc[v][e] = UR_FADD(acc[v][e], UR_FMUL(r.c[q], r.g[q][v][e]));
}

/* The same for a window's segments, each row into its own segment's sum sums[k], in shared
 * memory: a lane's slice of a sum, indexed by the entry's segment, read, added to and written
 * back.  (In registers, a window's sums were either indexed by a value, which put them in local
 * memory, or took each row by a select over the window's W sums, W times the arithmetic:
 * docs/results.md, nineteenth and twentieth sessions.) */
template <int NV, int E, int U>
__device__ __forceinline__ void add_rows_into(const ur__tbe_args &a, float c, int64_t at, int k,
                                              int dim, int u, int cnt, float (*sums)[NV * 32 * E],
                                              int lane) {
  static_assert(E == 4, "a lane's slice of a sum is one float4");
  GradRows<NV, E, U> r;
  load_rows<NV, E, U>(a, c, at, k, dim, u, cnt, lane, r);
#pragma unroll
  for (int q = 0; q < U; q++) {
    if (r.k[q] < 0) continue;
#pragma unroll
    for (int v = 0; v < NV; v++) {
      int col = (v * 32 + lane) * E;
      if (col >= r.dim[q]) continue;
      float4 *p = reinterpret_cast<float4 *>(sums[r.k[q]] + col);
      float4 x = *p;
      x.x = UR_FADD(x.x, UR_FMUL(r.c[q], r.g[q][v][0]));
      x.y = UR_FADD(x.y, UR_FMUL(r.c[q], r.g[q][v][1]));
      x.z = UR_FADD(x.z, UR_FMUL(r.c[q], r.g[q][v][2]));
      x.w = UR_FADD(x.w, UR_FMUL(r.c[q], r.g[q][v][3]));
      *p = x;
    }
  }
}

/* Adds entries [j0, j1) of one segment into acc, in order: the lanes resolve 32 payloads at a
 * time.  Then, with a stage (bf16 gradients: staged()), the warp copies as many of their
 * gradient rows as the stage holds (UR_TBE_STAGE bytes of shared memory: 32 bf16 rows of dim
 * 128, 4 of 1024) by cp.async, all in flight at once and no registers held for them, and adds
 * them from there in order, add_rows' arithmetic, the same bits; without one (f32 gradients), U
 * rows at a time in registers.  On the H200 the stage took 85-118 us off a bf16 DLRM step's
 * 0.805 ms backward; staging f32 rows too (16 a stage) made f32 1-hot Zipf 3-4% slower, so f32
 * stays in registers (docs/results.md, twelfth session).  Each lane reads back only the slices
 * it copied, so its wait is the fence; the warp's syncs keep its lanes together. */
template <int NV, int E, int U>
__device__ __forceinline__ void sum_entries(const ur__tbe_args &a, const Sorted &s, int dim,
                                            int64_t j0, int64_t j1, float (&acc)[NV][E],
                                            char *stage, int lane) {
  static_assert(E == 4, "the backward takes 4 elements a lane (shape_of(a, false))");
  const int piece = E * 2, slot = 32 * piece; /* a lane's E bf16 elements; a warp's */
  const int rows = UR_TBE_STAGE / (NV * slot); /* 4 or more: NV <= 8 */
  for (int64_t base = j0; base < j1; base += 32) {
    int64_t j = base + lane;
    float c = 0.0f;
    int64_t at = 0;
    if (j < j1) resolve(a, s, s.pay[j], dim, &at, &c);
    int cnt = j1 - base < 32 ? (int)(j1 - base) : 32;
    if (!stage) {
      for (int u = 0; u < cnt; u += U) add_rows<NV, E, U>(a, c, at, dim, u, cnt, acc, lane);
      continue;
    }
    for (int u = 0; u < cnt; u += rows) {
      int n = cnt - u < rows ? cnt - u : rows;
      for (int q = 0; q < n; q++) {
        int64_t aq = __shfl_sync(kFull, at, u + q);
#pragma unroll
        for (int v = 0; v < NV; v++) {
          int col = (v * 32 + lane) * E;
          if (col >= dim) continue;
          ur_cp8(stage + (q * NV + v) * slot + lane * piece, (const uint16_t *)a.grad + aq + col);
        }
      }
      ur_cp_wait();
      __syncwarp();
      for (int q = 0; q < n; q++) {
        float ck = __shfl_sync(kFull, c, u + q);
#pragma unroll
        for (int v = 0; v < NV; v++) {
          int col = (v * 32 + lane) * E;
          if (col >= dim) continue;
          uint2 h = *reinterpret_cast<const uint2 *>(stage + (q * NV + v) * slot + lane * piece);
          float g[E];
          unpack<E>(make_uint4(h.x, h.y, 0, 0), UR_DTYPE_BF16, g);
#pragma unroll
          for (int e = 0; e < E; e++) acc[v][e] = UR_FADD(acc[v][e], UR_FMUL(ck, g[e]));
        }
      }
      __syncwarp();
    }
  }
}

/* Whether mid_kernel and chunk_kernel stage gradient rows in shared memory (sum_entries). */
__host__ __device__ __forceinline__ bool staged(const ur__tbe_args &a) {
  return a.out_dtype != UR_DTYPE_F32;
}

/* A warp's stage in the kernel's dynamic shared memory (UR_TBE_STAGE bytes a warp), or none. */
__device__ __forceinline__ char *warp_stage(const ur__tbe_args &a) {
  extern __shared__ __align__(16) char ur_tbe_stage[];
  return staged(a) ? ur_tbe_stage + (threadIdx.x / 32) * UR_TBE_STAGE : nullptr;
}

/* Sparse output: the segment's row id and its summed gradient. */
struct SparseOut {
  int64_t *rows;
  float *grads;
  const int64_t *ustart, *gbase; /* per table, device */
};

/* The optimizer step of one row (or the sparse write, or with h.sums_only the row's sum of
 * squared gradients into its table's row sums), by one warp, from its summed gradient,
 * which each lane left in acc[(v * 32 + lane) * E + e] (shared memory).  Inlined only where
 * a kernel's rows are short (seg_kernel's windows); elsewhere through step_row. */
template <int NV, int E>
__device__ __forceinline__ void step_row_in(const ur__tbe_hyper &h, const SparseOut &sp,
                                            const ur__tbe_table *tbp, int32_t t, int64_t seg,
                                            int64_t row, const float *acc, char *copy,
                                            int lane) {
  const ur__tbe_table tb = *tbp;
  int dim = tb.dim;
  if (sp.rows) {
    if (lane == 0) sp.rows[seg] = row;
    float *g = sp.grads + sp.gbase[t] + (seg - sp.ustart[t]) * dim;
#pragma unroll
    for (int v = 0; v < NV; v++) {
      int col = (v * 32 + lane) * E;
      if (col < dim)
#pragma unroll
        for (int e = 0; e < E; e++) g[col + e] = acc[col + e];
    }
    return;
  }
  /* row is the id: the rows and state are read at its physical row (a far row from its copy,
   * when the forward made one), stochastic rounding draws by id (so a relayout changes no
   * number) */
  int64_t prow = tb.perm ? tb.perm[row] : row;
  int64_t base = prow * dim;
  const char *from = copy ? copy : (const char *)tb.weights + base * esize(tb.dtype);
  int64_t sid = tb.row_ids ? tb.row_ids[row] : row;
  int64_t lbase = (tb.sr_row0 + sid) * tb.sr_pitch + tb.sr_col0;
  float w[NV][E], gg[NV][E];
  float sq = 0.0f;
#pragma unroll
  for (int v = 0; v < NV; v++) {
    int col = (v * 32 + lane) * E;
    if (col >= dim) continue;
    unpack<E>(load_raw_rw<E>(from + col * esize(tb.dtype), tb.dtype), tb.dtype, w[v]);
#pragma unroll
    for (int e = 0; e < E; e++) {
      gg[v][e] = ur__tbe_grad_adjust(&h, acc[col + e], w[v][e]);
      sq = UR_FADD(sq, UR_FMUL(gg[v][e], gg[v][e]));
    }
  }
  float rs = 0.0f; /* rowwise Adagrad: the row's state, then its multiplier */
  if (h.k.kind == UR_OPTIM_KIND_ROWWISE_ADAGRAD) {
#pragma unroll
    for (int o = 16; o; o >>= 1) sq = UR_FADD(sq, __shfl_xor_sync(kFull, sq, o));
    if (h.sums_only) { /* ur_tbe_row_sums: the row's partial sum, no step */
      if (lane == 0) tb.row_sums[sid] = sq;
      return;
    }
    rs = ur__tbe_rowwise_state(&tb, sid, tb.state1[prow], sq);
    __syncwarp();
    if (lane == 0) tb.state1[prow] = rs;
    rs = ur__tbe_rowwise_mult(&h, rs);
  }
  uint64_t key = ur__tbe_sr_key(h.sr_key, tb.index);
#pragma unroll
  for (int v = 0; v < NV; v++) {
    int col = (v * 32 + lane) * E;
    if (col >= dim) continue;
    float nw[E];
#pragma unroll
    for (int e = 0; e < E; e++) {
      int64_t el = base + col + e;
      float *s1 = h.k.kind == UR_OPTIM_KIND_ROWWISE_ADAGRAD ? &rs : tb.state1 ? tb.state1 + el : nullptr;
      float *s2 = tb.state2 ? tb.state2 + el : nullptr;
      nw[e] = ur__tbe_step_elem(&h, w[v][e], gg[v][e], s1, s2);
    }
    unsigned bits[4] = {0, 0, 0, 0};
    if (tb.dtype != UR_DTYPE_F32) {
#pragma unroll
      for (int q = 0; q < E / 4; q++) {
        ur_philox4 r = {{0, 0, 0, 0}};
        if (h.sr) r = ur_philox((uint64_t)(lbase + col + 4 * q) >> 2, key);
#pragma unroll
        for (int e = 0; e < 4; e++) {
          float x = nw[4 * q + e];
          uint16_t hb = h.sr ? ur__tbe_round_sr(x, tb.dtype, r.v[e])
                             : tb.dtype == UR_DTYPE_BF16 ? __bfloat16_as_ushort(__float2bfloat16_rn(x))
                                                         : __half_as_ushort(__float2half_rn(x));
          bits[(4 * q + e) / 2] |= (unsigned)hb << (16 * (e & 1));
        }
      }
    }
    /* the row, and its copy where it has one (the copy stays the row); written behind, the
     * copy only.  One loop over the two places for every dtype: as two conditional f32 stores
     * (the row's unless behind, then the copy's if any), nvcc 13.0's seg_kernel<8, 4> wrote
     * the copy's to address 0 on an H100 (memcheck, tbe.cu's line of `if (c) c[k] = v`),
     * though its SASS tests the pointer first; not explained. */
    int es = esize(tb.dtype);
    for (int w = copy && h.far_behind ? 1 : 0; w < (copy ? 2 : 1); w++) {
      char *o = w ? copy + col * es : (char *)tb.weights + (base + col) * es;
      if (tb.dtype == UR_DTYPE_F32) {
#pragma unroll
        for (int k = 0; k < E / 4; k++)
          reinterpret_cast<float4 *>(o)[k] = make_float4(nw[4 * k], nw[4 * k + 1], nw[4 * k + 2], nw[4 * k + 3]);
      } else if (E == 8) {
        *reinterpret_cast<uint4 *>(o) = make_uint4(bits[0], bits[1], bits[2], bits[3]);
      } else {
        *reinterpret_cast<uint2 *>(o) = make_uint2(bits[0], bits[1]);
      }
    }
  }
}

/* step_row_in, not inlined: it is called from several places of the loops and is large;
 * inlined everywhere, ptxas spilled mid_kernel 2.5 times as much and seg_kernel's one-row
 * windows 10 times. */
template <int NV, int E>
__device__ __noinline__ void step_row(const ur__tbe_hyper h, const SparseOut sp,
                                      const ur__tbe_table *tbp, int32_t t, int64_t seg,
                                      int64_t row, const float *acc, char *copy, int lane) {
  step_row_in<NV, E>(h, sp, tbp, t, seg, row, acc, copy, lane);
}

/* Leaves acc in this warp's slot of shared memory and steps the row from there. */
template <int NV, int E>
__device__ __forceinline__ void finish(const ur__tbe_args &a, const ur__tbe_hyper &h,
                                       const SparseOut &sp, float *slot, int32_t t, int64_t seg,
                                       int64_t row, const float (&acc)[NV][E], char *copy,
                                       int lane) {
#pragma unroll
  for (int v = 0; v < NV; v++)
#pragma unroll
    for (int e = 0; e < E; e++) slot[(v * 32 + lane) * E + e] = acc[v][e];
  step_row<NV, E>(h, sp, a.tables + t, t, seg, row, slot, copy, lane);
}


/* Pulls a row's lines into L2: of `lanes` lanes, lane `from` takes every lanes-th line. */
__device__ __forceinline__ void prefetch_row(const void *p, int bytes, int from, int lanes) {
  for (int o = from * 128; o < bytes; o += lanes * 128)
    asm volatile("prefetch.global.L2 [%0];" ::"l"((const char *)p + o));
}

/* The segment's row (its copy, when it has one) and its state on their way to L2 while its
 * gradient is summed: by a warp (from = lane, lanes = 32) or by one lane alone (0, 1). */
__device__ __forceinline__ void prefetch_step(const ur__tbe_hyper &h, const ur__tbe_table &tb,
                                              int64_t row, const char *copy, int from, int lanes) {
  int es = esize(tb.dtype);
  int64_t pr = tb.perm ? tb.perm[row] : row;
  prefetch_row(copy ? copy : (const char *)tb.weights + pr * tb.dim * es, tb.dim * es, from, lanes);
  if (h.k.kind == UR_OPTIM_KIND_ROWWISE_ADAGRAD) {
    if (from == 0) prefetch_row(tb.state1 + pr, 4, 0, 1);
  } else if (tb.state1) {
    prefetch_row(tb.state1 + pr * tb.dim, tb.dim * 4, from, lanes);
  }
  if (tb.state2) prefetch_row(tb.state2 + pr * tb.dim, tb.dim * 4, from, lanes);
}

/* One segment as the lane that reads it sees it.  mode: 0 none (past the last segment, or its
 * table sits out ur_tbe_row_sums), 1 short (seg_kernel steps it), 2 longer (mid_kernel or
 * long_kernel does). */
struct SegOf {
  int64_t row;
  int32_t j0, j1, t, dim, mode; /* entries: at most 2^31 - 65 (tbe.c checks) */
};

__device__ __forceinline__ SegOf seg_of(const ur__tbe_args &a, const ur__tbe_hyper &h,
                                        const Sorted &s, int64_t seg, int ns, int nv) {
  SegOf g = {0, nv, nv, 0, 0, 0}; /* past the end: empty, where the entries end */
  if (seg >= ns) return g;
  g.j0 = s.starts[seg];
  g.j1 = seg_end(s.starts, seg, ns, nv);
  if (g.j1 - g.j0 > UR_TBE_SHORT) {
    g.mode = 2;
    return g;
  }
  uint64_t key = key_at(s, g.j0);
  g.t = table_of_key(a, key);
  const ur__tbe_table &tb = a.tables[g.t];
  g.row = (int64_t)key - tb.key_base;
  g.dim = tb.dim;
  g.mode = h.sums_only && !tb.row_sums ? 0 : 1;
  return g;
}

/* Short segments (UR_TBE_SHORT entries or fewer), 32 consecutive ones a warp: each lane reads one
 * segment's bounds, key and table at once, then the warp takes them W at a time, a window.  A
 * window's entries lie together in sorted order, so the lanes resolve 32 of them at a time and
 * U gradient rows are in flight at once whichever segment they belong to; each is added into
 * its own segment's sum, in order: the same sum, in the same order and rounding, as the CPU
 * reference's.  Then each row is stepped once (or written out, sparse).  Entries of longer
 * segments (mid_kernel's, chunk_kernel's and long_kernel's) are passed over: 32 of them would
 * keep one warp long after the others are done (rows read hundreds of times lie together in
 * small tables).  Segments are numbered on the device, hence the grid-stride loop.  Entries are
 * int32: tbe.c takes at most 2^31 - 65 values on the GPU, so base + 32 does not overflow.
 * Rows of up to 128 values take 4 blocks an SM (64 registers, 32 warps), the window's sums being
 * in shared memory: every B2 case 5-10% faster than at 3 blocks (80 registers); wider rows keep
 * 3 blocks (two segments a window) or 2 (one). */
template <int NV, int E, int U, int W>
__global__ void __launch_bounds__(UR_TBE_WARPS * 32, NV == 1 ? 4 : W > 1 ? 3 : 2)
    seg_kernel(const ur__tbe_args a, const ur__tbe_hyper h0, const Sorted s, const SparseOut sp) {
  static_assert(32 % W == 0, "a warp's 32 segments split into whole windows");
  /* a guard holds the step back; the row sums (ur_tbe_row_sums) are written all the same, for the
   * other ranks' column shards add them */
  if (!sp.rows && !h0.sums_only && ur__optim_gated(&h0.k)) return;
  const ur__tbe_hyper h = ur__tbe_hyper_now(&h0); /* Adam's true update number under a guard */
  __shared__ __align__(16) float slots[UR_TBE_WARPS][W][NV * 32 * E]; /* the window's sums */
  int lane = threadIdx.x & 31;
  float(*slot)[NV * 32 * E] = slots[threadIdx.x / 32];
  int ns = s.scal[0], nv = s.scal[2];
  int64_t warps = (int64_t)gridDim.x * UR_TBE_WARPS;
  for (int64_t g0 = ((int64_t)blockIdx.x * UR_TBE_WARPS + threadIdx.x / 32) * 32; g0 < ns;
       g0 += warps * 32) {
    const SegOf me = seg_of(a, h, s, g0 + lane, ns, nv);
    for (int w0 = 0; w0 < 32; w0 += W) {
      int m[W], sd[W];
      int32_t sj0[W];
      bool any = false;
#pragma unroll
      for (int k = 0; k < W; k++) {
        m[k] = __shfl_sync(kFull, me.mode, w0 + k);
        sd[k] = __shfl_sync(kFull, me.dim, w0 + k);
        sj0[k] = __shfl_sync(kFull, me.j0, w0 + k);
        any |= m[k] == 1;
      }
      int32_t J1 = __shfl_sync(kFull, me.j1, w0 + W - 1);
      if (!any) continue;
      /* the window's rows and their state on their way to L2 while its gradients are summed,
       * each by the lane that read its segment */
      if (!sp.rows && me.mode == 1 && lane >= w0 && lane < w0 + W)
        prefetch_step(h, a.tables[me.t], me.row, far_row(a, me.t, me.row), 0, 1);
      /* a lane's slices of the window's sums: only it adds to them and steps from them */
#pragma unroll
      for (int k = 0; k < W; k++)
#pragma unroll
        for (int v = 0; v < NV; v++)
          *reinterpret_cast<float4 *>(slot[k] + (v * 32 + lane) * E) = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int32_t base = sj0[0]; base < J1;) {
        int32_t j = base + lane;
        int mk = m[0], dk = sd[0], sk = 0;
#pragma unroll
        for (int k = 1; k < W; k++)
          if (j >= sj0[k]) mk = m[k], dk = sd[k], sk = k;
        float c = 0.0f;
        int64_t at = 0;
        if (j < J1 && mk == 1) resolve(a, s, s.pay[j], dk, &at, &c);
        else sk = -1;
        int cnt = J1 - base < 32 ? J1 - base : 32;
        for (int u = 0; u < cnt; u += U) add_rows_into<NV, E, U>(a, c, at, sk, dk, u, cnt, slot, lane);
        /* over a longer segment's entries at one step */
        base += 32;
#pragma unroll
        for (int k = 0; k < W; k++) {
          int32_t end = k + 1 < W ? sj0[k + 1] : J1;
          if (m[k] == 2 && base >= sj0[k] && base < end) base = end;
        }
      }
#pragma unroll 1
      for (int k = 0; k < W; k++) { /* one site for the step: it is large */
        int32_t t = __shfl_sync(kFull, me.t, w0 + k);
        int64_t row = __shfl_sync(kFull, me.row, w0 + k);
        if (__shfl_sync(kFull, me.mode, w0 + k) != 1) continue;
        char *copy = sp.rows ? nullptr : far_row(a, t, row);
        /* inlined for short rows (B2's 1-hot rowwise Adagrad 2.18 -> 1.89 ms; 1.78 with the
         * prefetch; SGD 1.75 -> 1.66) */
        if constexpr (W > 1)
          step_row_in<NV, E>(h, sp, a.tables + t, t, g0 + w0 + k, row, slot[k], copy, lane);
        else
          step_row<NV, E>(h, sp, a.tables + t, t, g0 + w0 + k, row, slot[k], copy, lane);
      }
    }
  }
}

/* A longer segment's row as its warp (mid_kernel's or long_kernel's) steps it: its table, row
 * and far copy (none for the sparse gradient), the row's step state prefetched.  False where its
 * table sits out ur_tbe_row_sums. */
struct SegRow {
  const ur__tbe_table *tb;
  int64_t row;
  char *copy;
  int32_t t;
};

__device__ __forceinline__ bool seg_row(const ur__tbe_args &a, const ur__tbe_hyper &h,
                                        const Sorted &s, const SparseOut &sp, int64_t j0,
                                        int lane, SegRow *r) {
  uint64_t key = key_at(s, j0);
  r->t = table_of_key(a, key);
  r->tb = a.tables + r->t;
  if (h.sums_only && !r->tb->row_sums) return false;
  r->row = (int64_t)key - r->tb->key_base;
  r->copy = sp.rows ? nullptr : far_row(a, r->t, r->row);
  if (!sp.rows) prefetch_step(h, *r->tb, r->row, r->copy, lane, 32);
  return true;
}

/* A warp per middling segment (mid lists them): its entries summed in order, a stage of
 * gradient rows (or U) in flight at a time, then its row stepped once (or written out, sparse). */
template <int NV, int E, int U>
__global__ void __launch_bounds__(UR_TBE_WARPS * 32, NV * E <= 8 ? 4 : 2)
    mid_kernel(const ur__tbe_args a, const ur__tbe_hyper h0, const Sorted s, const SparseOut sp) {
  if (!sp.rows && !h0.sums_only && ur__optim_gated(&h0.k)) return;
  const ur__tbe_hyper h = ur__tbe_hyper_now(&h0); /* Adam's true update number under a guard */
  __shared__ float slots[UR_TBE_WARPS][NV * 32 * E];
  int lane = threadIdx.x & 31;
  float *slot = slots[threadIdx.x / 32];
  int nm = s.scal[3], ns = s.scal[0], nv = s.scal[2];
  int64_t warps = (int64_t)gridDim.x * UR_TBE_WARPS;
  for (int64_t k = (int64_t)blockIdx.x * UR_TBE_WARPS + threadIdx.x / 32; k < nm; k += warps) {
    int64_t seg = s.mid[k];
    int64_t j0 = s.starts[seg], j1 = seg_end(s.starts, seg, ns, nv);
    SegRow r;
    if (!seg_row(a, h, s, sp, j0, lane, &r)) continue;
    float acc[NV][E];
    zero_acc(acc);
    sum_entries<NV, E, U>(a, s, r.tb->dim, j0, j1, acc, warp_stage(a), lane);
    finish<NV, E>(a, h, sp, slot, r.t, seg, r.row, acc, r.copy, lane);
  }
}

/* The long segments' chunks (UR_TBE_CHUNK entries, the last one shorter), a CTA each: warp w
 * sums the w-th UR_TBE_CHUNK / UR_TBE_WARPS entries in order, warp 0 adds the warps' sums in
 * order into the chunk's partial.  Chunk q belongs to the first long segment h with
 * cend[h] > q.  Deterministic: the split depends only on the segment's length. */
template <int NV, int E, int U>
__global__ void __launch_bounds__(UR_TBE_WARPS * 32)
    chunk_kernel(const ur__tbe_args a, const Sorted s) {
  __shared__ float part[UR_TBE_WARPS][NV * 32 * E];
  const int sub = UR_TBE_CHUNK / UR_TBE_WARPS;
  int lane = threadIdx.x & 31, w = threadIdx.x / 32;
  int nh = s.scal[1], ns = s.scal[0], nv = s.scal[2];
  int total = nh > 0 ? s.cend[nh - 1] : 0;
  for (int q = blockIdx.x; q < total; q += gridDim.x) {
    int lo = 0, hi = nh - 1;
    while (lo < hi) {
      int mid = (lo + hi) / 2;
      if (s.cend[mid] > q) hi = mid;
      else lo = mid + 1;
    }
    int64_t seg = s.hot[lo];
    int64_t j0 = s.starts[seg], j1 = seg_end(s.starts, seg, ns, nv);
    int c = q - (s.cend[lo] - chunks_of(j1 - j0));
    int64_t c0 = j0 + (int64_t)c * UR_TBE_CHUNK;
    int64_t c1 = c0 + UR_TBE_CHUNK < j1 ? c0 + UR_TBE_CHUNK : j1;
    int dim = a.tables[table_of_key(a, key_at(s, j0))].dim;
    int64_t w0 = c0 + (int64_t)w * sub, w1 = w0 + sub < c1 ? w0 + sub : c1;
    float acc[NV][E];
    zero_acc(acc);
    if (w0 < w1) sum_entries<NV, E, U>(a, s, dim, w0, w1, acc, warp_stage(a), lane);
#pragma unroll
    for (int v = 0; v < NV; v++)
#pragma unroll
      for (int e = 0; e < E; e++) part[w][(v * 32 + lane) * E + e] = acc[v][e];
    __syncthreads();
    if (w == 0) {
      float *out = s.part + (int64_t)q * a.max_dim;
#pragma unroll
      for (int v = 0; v < NV; v++) {
        int col = (v * 32 + lane) * E;
        if (col >= dim) continue;
#pragma unroll
        for (int e = 0; e < E; e++) {
          float x = 0.0f;
          for (int k = 0; k < UR_TBE_WARPS; k++) x = UR_FADD(x, part[k][col + e]);
          out[col + e] = x;
        }
      }
    }
    __syncthreads();
  }
}

/* A warp per long segment: its chunks' partials added in chunk order (U rows in flight), then
 * its row stepped once (or written out, sparse). */
template <int NV, int E, int U>
__global__ void __launch_bounds__(UR_TBE_WARPS * 32)
    long_kernel(const ur__tbe_args a, const ur__tbe_hyper h0, const Sorted s, const SparseOut sp) {
  if (!sp.rows && !h0.sums_only && ur__optim_gated(&h0.k)) return;
  const ur__tbe_hyper h = ur__tbe_hyper_now(&h0); /* Adam's true update number under a guard */
  __shared__ float slots[UR_TBE_WARPS][NV * 32 * E];
  int lane = threadIdx.x & 31;
  float *slot = slots[threadIdx.x / 32];
  int nh = s.scal[1], ns = s.scal[0], nv = s.scal[2];
  int64_t warps = (int64_t)gridDim.x * UR_TBE_WARPS;
  for (int64_t k = (int64_t)blockIdx.x * UR_TBE_WARPS + threadIdx.x / 32; k < nh; k += warps) {
    int64_t seg = s.hot[k];
    int64_t j0 = s.starts[seg], j1 = seg_end(s.starts, seg, ns, nv);
    SegRow r;
    if (!seg_row(a, h, s, sp, j0, lane, &r)) continue;
    int dim = r.tb->dim;
    int q1 = s.cend[k], q0 = q1 - chunks_of(j1 - j0);
    float acc[NV][E];
    zero_acc(acc);
    for (int q = q0; q < q1; q += U) {
      float x[U][NV][E];
#pragma unroll
      for (int u = 0; u < U; u++)
#pragma unroll
        for (int v = 0; v < NV; v++) {
          int col = (v * 32 + lane) * E;
#pragma unroll
          for (int e = 0; e < E; e++)
            x[u][v][e] = q + u < q1 && col < dim ? s.part[(int64_t)(q + u) * a.max_dim + col + e] : 0.0f;
        }
#pragma unroll
      for (int u = 0; u < U; u++) {
        if (q + u >= q1) break;
#pragma unroll
        for (int v = 0; v < NV; v++)
#pragma unroll
          for (int e = 0; e < E; e++) acc[v][e] = UR_FADD(acc[v][e], x[u][v][e]);
      }
    }
    finish<NV, E>(a, h, sp, slot, r.t, seg, r.row, acc, r.copy, lane);
  }
}

/* Distinct rows per table, for the sparse gradient (integer atomics: order does not matter). */
__global__ void count_kernel(const ur__tbe_args a, const Sorted s, unsigned long long *counts) {
  int64_t seg = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (seg < s.scal[0]) atomicAdd(&counts[table_of_key(a, key_at(s, s.starts[seg]))], 1ull);
}

/* The non-deterministic SGD step (args.atomic: f32 rows, no weight decay or clipping): no
 * sort, each value adds -lr * its factor * its gradient row to its row, 16 bytes a lane in one
 * vector atomic.  A warp per 32 bags, the values walked as forward walks them, U gradient
 * rows loaded before their adds.  The adds of a row's values land in any order: the result
 * differs from the sorted step's within rounding, and from run to run. */
template <int NV, int U>
__global__ void __launch_bounds__(UR_TBE_WARPS * 32)
    atomic_sgd_kernel(const ur__tbe_args a, float neg_lr, const int32_t *gate) {
  if (gate && *gate) return; /* a guard holds the step back */
  int lane = threadIdx.x & 31;
  int64_t bag0 = ((int64_t)blockIdx.x * UR_TBE_WARPS + threadIdx.x / 32) * 32;
  if (bag0 >= a.bags) return;
  Group g = group_of(a, bag0, lane);
  int64_t bag = bag0 + lane, rows = 0, at = 0;
  float *wt = nullptr;
  const int64_t *perm = nullptr;
  int32_t dim = 0;
  float scale = 1.0f;
  if (bag < a.bags) {
    int32_t f = feature_of(a, bag);
    const ur__tbe_feature ft = a.features[f];
    const ur__tbe_table &tb = a.tables[ft.table];
    rows = tb.rows;
    wt = (float *)tb.weights;
    perm = tb.perm;
    dim = tb.dim;
    if (a.pooled) {
      at = ur__tbe_out_at(a.out_base, a.out_stride, f, &ft, bag - ur__tbe_first_bag(&a, f));
      if (tb.pooling == UR_POOLING_MEAN && g.len > 0) scale = UR_FDIV(1.0f, (float)g.len);
    }
  }
  for (int64_t base = 0; base < g.T; base += 32) {
    int64_t p = base + lane;
    int j = bag_at(g, p);
    int64_t i = __shfl_sync(kFull, g.s, j) + (p - __shfl_sync(kFull, g.P, j));
    int64_t r = __shfl_sync(kFull, rows, j), jat = __shfl_sync(kFull, at, j);
    float *jw = (float *)shfl_ptr(wt, j);
    const int64_t *jp = (const int64_t *)shfl_ptr(perm, j);
    int jdim = __shfl_sync(kFull, dim, j);
    float jscale = __shfl_sync(kFull, scale, j);
    float *rp = nullptr, c = 0.0f;
    int64_t gat = 0;
    if (p < g.T) {
      int64_t id = a.values[i];
      if (id >= 0 && id < r) rp = jw + (jp ? jp[id] : id) * jdim;
      gat = a.pooled ? jat : i * jdim;
      float w = a.weights ? a.weights[i] : 1.0f;
      c = jscale == 1.0f ? w : UR_FMUL(w, jscale);
    }
    int cnt = g.T - base < 32 ? (int)(g.T - base) : 32;
    for (int u = 0; u < cnt; u += U) {
      float *rk[U], ck[U], gk[U][NV][4];
      int dk[U];
#pragma unroll
      for (int k = 0; k < U; k++) {
        int src = (u + k) & 31;
        rk[k] = (float *)shfl_ptr(rp, src);
        ck[k] = __shfl_sync(kFull, c, src);
        int64_t ak = __shfl_sync(kFull, gat, src);
        dk[k] = __shfl_sync(kFull, jdim, src);
        if (u + k >= cnt) rk[k] = nullptr;
#pragma unroll
        for (int v = 0; v < NV; v++) {
          int col = (v * 32 + lane) * 4;
          if (rk[k] && col < dk[k]) load_out<4>(a.grad, a.out_dtype, ak + col, gk[k][v]);
        }
      }
#pragma unroll
      for (int k = 0; k < U; k++) {
        if (!rk[k]) continue;
#pragma unroll
        for (int v = 0; v < NV; v++) {
          int col = (v * 32 + lane) * 4;
          if (col >= dk[k]) continue;
          float d[4];
#pragma unroll
          for (int e = 0; e < 4; e++) d[e] = UR_FMUL(neg_lr, UR_FMUL(ck[k], gk[k][v][e]));
#if __CUDA_ARCH__ >= 900
          atomicAdd(reinterpret_cast<float4 *>(rk[k] + col), make_float4(d[0], d[1], d[2], d[3]));
#else
#pragma unroll
          for (int e = 0; e < 4; e++) atomicAdd(rk[k] + col + e, d[e]);
#endif
        }
      }
    }
  }
}

/* VBE backward: bag keys (bag_start[f] + inverse) of every sample of the full batch. */
__global__ void vbe_keys_kernel(const ur__tbe_args a, uint32_t *keys, int32_t *pos, int32_t *scal) {
  int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  int64_t m = (int64_t)a.num_features * a.full_batch;
  if (r == 0) scal[2] = (int32_t)m;
  if (r >= m) return;
  int32_t f = (int32_t)(r / a.full_batch);
  int64_t j = a.inverse[r], nb = a.bag_start[f + 1] - a.bag_start[f];
  keys[r] = j >= 0 && j < nb ? (uint32_t)(a.bag_start[f] + j) : (uint32_t)a.bags;
  pos[r] = (int32_t)r;
}

struct IsStart32 {
  const uint32_t *k;
  uint32_t skip;
  __device__ bool operator()(int j) const { return k[j] != skip && (j == 0 || k[j] != k[j - 1]); }
};

__global__ void valid32_kernel(const uint32_t *k, int64_t n, uint32_t skip, int32_t *n_valid) {
  int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (j < n && k[j] == skip && (j == 0 || k[j - 1] != skip)) *n_valid = (int32_t)j;
}

/* Each read bag's gradient: the sum, in sample order, of the rows of the samples that read it. */
template <int E>
__global__ void collapse_kernel(const ur__tbe_args a, const uint32_t *keys, const int32_t *pos,
                                const int32_t *starts, const int32_t *scal, float *flat) {
  int lane = threadIdx.x & 31;
  int ns = scal[0], nv = scal[2];
  int64_t warps = (int64_t)gridDim.x * UR_TBE_WARPS;
  for (int64_t seg = (int64_t)blockIdx.x * UR_TBE_WARPS + threadIdx.x / 32; seg < ns; seg += warps) {
    int64_t j0 = starts[seg], j1 = seg_end(starts, seg, ns, nv);
    int64_t bag = keys[j0];
    int32_t f = feature_of(a, bag);
    const ur__tbe_feature ft = a.features[f];
    float *dst = flat + a.flat_base[f] + (bag - a.bag_start[f]) * ft.dim;
    for (int col = lane * E; col < ft.dim; col += 32 * E) {
      float acc[E];
#pragma unroll
      for (int e = 0; e < E; e++) acc[e] = 0.0f;
      for (int64_t j = j0; j < j1; j++) {
        int64_t b = pos[j] - (int64_t)f * a.full_batch;
        float g[E];
        load_out<E>(a.grad, a.out_dtype, b * a.out_stride + ft.col + col, g);
#pragma unroll
        for (int e = 0; e < E; e++) acc[e] = UR_FADD(acc[e], g[e]);
      }
#pragma unroll
      for (int e = 0; e < E; e++) dst[col + e] = acc[e];
    }
  }
}

/* ---- the plain gather ---- */

/* A warp per four rows, each lane copying its slices of all four before the next: four rows in
 * flight per warp, every access coalesced. */
template <typename V>
__global__ void gather_kernel(const V *src, const int64_t *ids, V *out, int64_t n, int per) {
  int lane = threadIdx.x & 31;
  int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
  for (int64_t r0 = ((int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * 4; r0 < n;
       r0 += warps * 4) {
    int64_t id[4];
#pragma unroll
    for (int k = 0; k < 4; k++) id[k] = r0 + k < n ? __ldg(ids + r0 + k) : 0;
    for (int c = lane; c < per; c += 32) {
      V x[4];
#pragma unroll
      for (int k = 0; k < 4; k++)
        if (r0 + k < n) x[k] = __ldg(src + id[k] * per + c);
#pragma unroll
      for (int k = 0; k < 4; k++)
        if (r0 + k < n) out[(r0 + k) * per + c] = x[k];
    }
  }
}

/* ---- access counters ---- */

/* A thread per bag adds one to the counter of each row its values read; lanes of a warp that
 * read the same row in the same round add together (one atomic for all of them), which is
 * what keeps hot rows of a skewed stream cheap.  Integer adds: the counts are exact, the same
 * as the CPU's whatever the order. */
__global__ void access_count_kernel(const ur__tbe_args a) {
  int lane = threadIdx.x & 31;
  int64_t bag = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  int64_t s = 0, e = 0, rows = 0, kb = 0;
  int32_t *cnt = nullptr;
  if (bag < a.bags) {
    const ur__tbe_table &tb = a.tables[a.features[feature_of(a, bag)].table];
    cnt = tb.counts;
    if (cnt) ur__tbe_bag_span(a.offsets, a.n, bag, &s, &e);
    rows = tb.rows;
    kb = tb.key_base;
  }
  int64_t len = e - s, most = len;
#pragma unroll
  for (int o = 16; o; o >>= 1) {
    int64_t y = __shfl_xor_sync(kFull, most, o);
    most = y > most ? y : most;
  }
  for (int64_t k = 0; k < most; k++) {
    uint64_t key = ~0ull;
    int64_t id = 0;
    if (k < len) {
      id = a.values[s + k];
      if (id >= 0 && id < rows) key = (uint64_t)(kb + id);
    }
    unsigned same = __match_any_sync(kFull, key);
    if (key != ~0ull && lane == __ffs(same) - 1) {
      int32_t *p = cnt + id;
      if (*(volatile int32_t *)p < UR_TBE_COUNT_MAX) atomicAdd(p, (int)__popc(same));
    }
  }
}

__global__ void decay_kernel(int32_t *c, int64_t n, double factor) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    c[i] = (int32_t)floor(__dmul_rn((double)c[i], factor));
}

/* ---- launch plumbing ---- */

struct Layout {
  size_t keys0, keys1, pay0, pay1, vbag, starts, hot, cend, mid, part, scal, tabs, cub, flat;
  size_t vkeys0, vkeys1, vpos0, vpos1, vstarts, vscal, total, cub_bytes;
};

size_t up(size_t v) { return (v + UR_TBE_ALIGN - 1) / UR_TBE_ALIGN * UR_TBE_ALIGN; }

/* Keys fit 32 bits when every row's key (and total_keys, the skipped ones') does. */
bool keys32(const ur__tbe_args *a) { return a->key_bits <= 32; }

/* Long segments a backward can have at most, and their chunks. */
size_t max_long(size_t n) { return n / (UR_TBE_HOT + 1) + 1; }
size_t max_chunks(size_t n) { return n / UR_TBE_CHUNK + max_long(n); }
/* Middling segments a backward can have at most. */
size_t max_mid(size_t n) { return n / (UR_TBE_SHORT + 1) + 1; }

/* cub's scratch for one sort of keys of type K with the selections that follow it. */
template <typename K>
cudaError_t sort_scratch(const ur__tbe_args *a, size_t n, size_t *best) {
  size_t c = 0;
  int items = (int)(n ? n : 1);
  cub::DoubleBuffer<K> kb(nullptr, nullptr);
  cub::DoubleBuffer<int32_t> v32(nullptr, nullptr);
  cudaError_t e = cub::DeviceRadixSort::SortPairs(nullptr, c, kb, v32, items, 0, a->key_bits,
                                                  (cudaStream_t)0);
  if (e != cudaSuccess) return e;
  *best = c > *best ? c : *best;
  e = cub::DeviceSelect::If(nullptr, c, thrust::counting_iterator<int>(0), (int32_t *)nullptr,
                            (int32_t *)nullptr, items, IsStart<K>{nullptr, 0}, (cudaStream_t)0);
  if (e != cudaSuccess) return e;
  *best = c > *best ? c : *best;
  e = cub::DeviceSelect::If(nullptr, c, thrust::counting_iterator<int>(0), (int32_t *)nullptr,
                            (int32_t *)nullptr, items, IsHot{nullptr, nullptr}, (cudaStream_t)0);
  if (e != cudaSuccess) return e;
  *best = c > *best ? c : *best;
  e = cub::DeviceSelect::If(nullptr, c, thrust::counting_iterator<int>(0), (int32_t *)nullptr,
                            (int32_t *)nullptr, items, IsMid{nullptr, nullptr}, (cudaStream_t)0);
  if (e != cudaSuccess) return e;
  *best = c > *best ? c : *best;
  auto chunks = thrust::make_transform_iterator(thrust::counting_iterator<int>(0),
                                                ChunksOf{nullptr, nullptr, nullptr});
  e = cub::DeviceScan::InclusiveSum(nullptr, c, chunks, (int32_t *)nullptr, (int)max_long(n),
                                    (cudaStream_t)0);
  if (e != cudaSuccess) return e;
  *best = c > *best ? c : *best;
  return cudaSuccess;
}

cudaError_t layout_of(const ur__tbe_args *a, int backward, Layout *L) {
  size_t n = (size_t)a->n, m = a->inverse ? (size_t)a->num_features * (size_t)a->full_batch : 0;
  size_t at = 0;
  *L = Layout();
  auto take = [&](size_t bytes) {
    size_t here = at;
    at += up(bytes ? bytes : 1);
    return here;
  };
  L->scal = take(8 * sizeof(int32_t));
  L->flat = take(a->inverse ? (size_t)a->flat_numel * sizeof(float) : 0);
  if (!backward) {
    L->total = at;
    return cudaSuccess;
  }
  L->tabs = take(3 * (size_t)a->num_tables * 8);
  L->vkeys0 = take(m * 4);
  L->vkeys1 = take(m * 4);
  L->vpos0 = take(m * 4);
  L->vpos1 = take(m * 4);
  L->vstarts = take(m * 4);
  L->vscal = take(8 * sizeof(int32_t));
  size_t best = 0;
  cudaError_t e = cudaSuccess;
  if (m) {
    size_t c = 0;
    cub::DoubleBuffer<uint32_t> k32(nullptr, nullptr);
    cub::DoubleBuffer<int32_t> v32(nullptr, nullptr);
    e = cub::DeviceRadixSort::SortPairs(nullptr, c, k32, v32, (int)m, 0, 32, (cudaStream_t)0);
    if (e != cudaSuccess) return e;
    best = c > best ? c : best;
    e = cub::DeviceSelect::If(nullptr, c, thrust::counting_iterator<int>(0), (int32_t *)nullptr,
                              (int32_t *)nullptr, (int)m, IsStart32{nullptr, 0}, (cudaStream_t)0);
    if (e != cudaSuccess) return e;
    best = c > best ? c : best;
  }
  /* the atomic step sorts nothing */
  if (!a->atomic) {
    size_t ks = keys32(a) ? 4 : 8;
    L->keys0 = take(n * ks);
    L->keys1 = take(n * ks);
    L->pay0 = take(n * 4);
    L->pay1 = take(n * 4);
    L->vbag = take(a->pooled && a->weights ? n * 4 : 0);
    L->starts = take(n * 4);
    L->hot = take(max_long(n) * 4);
    L->cend = take(max_long(n) * 4);
    L->mid = take(max_mid(n) * 4);
    L->part = take(max_chunks(n) * (size_t)a->max_dim * sizeof(float));
    e = keys32(a) ? sort_scratch<uint32_t>(a, n, &best) : sort_scratch<uint64_t>(a, n, &best);
    if (e != cudaSuccess) return e;
  }
  L->cub_bytes = best;
  L->cub = take(best);
  L->total = at;
  return cudaSuccess;
}

/* Launch shape: E elements per lane and slot (the forward's: 8 when every table is a half with
 * dims that are multiples of 8, 16-byte loads; else, and always in the backward, 4: 16 bytes of
 * f32, 8 of a half), NV slots per lane. */
struct Shape {
  int e, nv;
};

/* E = 8 (16-byte slices of half rows) where every table is half and takes them whole, when
 * halves8; else E = 4.  The backward passes halves8 = false: at E = 8 a dim-128 half row keeps
 * half of a warp idle while the other half does twice the optimizer's work a lane (stochastic
 * rounding included), with half as many gradient rows in flight. */
Shape shape_of(const ur__tbe_args *a, bool halves8 = true) {
  bool all_half8 = halves8;
  for (int32_t t = 0; t < a->num_tables; t++) {
    const ur__tbe_table &tb = a->host_tables[t];
    if (tb.dtype == UR_DTYPE_F32 || tb.dim % 8) all_half8 = false;
  }
  Shape s;
  s.e = all_half8 ? 8 : 4;
  int need = (a->max_dim + 32 * s.e - 1) / (32 * s.e);
  s.nv = need <= 1 ? 1 : need <= 2 ? 2 : need <= 4 ? 4 : 8;
  return s;
}

int sm_count(void) {
  int sms = 0;
  if (ur__cuda_sms(&sms) != cudaSuccess) return 132;
  return sms > 0 ? sms : 1;
}

unsigned blocks_for(int64_t groups) {
  int64_t b = (groups + UR_TBE_WARPS - 1) / UR_TBE_WARPS;
  return (unsigned)(b > 0 ? b : 1);
}

template <int NV, int E>
cudaError_t launch_fwd(cudaStream_t st, const ur__tbe_args &a) {
  const int U = NV >= 8 ? 1 : 8 / NV;
  unsigned blocks = blocks_for((a.bags + 31) / 32);
  if (a.far.fill) {
    if (a.pooled) fwd_kernel<NV, E, U, true, true><<<blocks, UR_TBE_WARPS * 32, 0, st>>>(a);
    else fwd_kernel<NV, E, U, false, true><<<blocks, UR_TBE_WARPS * 32, 0, st>>>(a);
  } else if (a.pooled) fwd_kernel<NV, E, U, true, false><<<blocks, UR_TBE_WARPS * 32, 0, st>>>(a);
  else fwd_kernel<NV, E, U, false, false><<<blocks, UR_TBE_WARPS * 32, 0, st>>>(a);
  return cudaGetLastError();
}

/* E = 8 needs at most 4 slots (dims stop at 1024), so NV = 8 is instantiated for E = 4 only. */
template <int E>
cudaError_t fwd_e(cudaStream_t st, const ur__tbe_args &a, int nv) {
  switch (nv) {
  case 1: return launch_fwd<1, E>(st, a);
  case 2: return launch_fwd<2, E>(st, a);
  case 4: return launch_fwd<4, E>(st, a);
  default: return launch_fwd<E == 8 ? 4 : 8, E>(st, a);
  }
}

cudaError_t forward_into(cudaStream_t st, const ur__tbe_args &a) {
  if (a.bags == 0) return cudaSuccess;
  Shape sh = shape_of(&a);
  return sh.e == 8 ? fwd_e<8>(st, a, sh.nv) : fwd_e<4>(st, a, sh.nv);
}

template <int NV, int E>
cudaError_t launch_reduce(cudaStream_t st, const ur__tbe_args &a, const ur__tbe_hyper &h,
                          const Sorted &s, const SparseOut &sp) {
  /* Gradient rows a lane has in flight at once, in every kernel of the backward: two.  Four
   * (rows of 4 values a lane) spilled seg_kernel at the 80 registers of three blocks an SM:
   * B2's 1-hot forward + SGD 1.634 ms against 1.503 with two; one, 1.586 (nineteenth session);
   * with the sums in shared memory four gave 1.566 against 1.496 (twentieth). */
  const int U = 2;
  int sms = sm_count();
  /* Segments a window, for rows of up to 8 values a lane: 16 values a lane in all. */
  const int W = NV * E <= 8 ? 16 / (NV * E) : 1;
  int64_t want = blocks_for((a.n + 31) / 32); /* 32 segments a warp, at most a.n segments */
  unsigned blocks = (unsigned)(want < (int64_t)sms * 32 ? want : (int64_t)sms * 32);
  seg_kernel<NV, E, U, W><<<blocks, UR_TBE_WARPS * 32, 0, st>>>(a, h, s, sp);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  /* mid_kernel's and chunk_kernel's stages (bf16 gradients) */
  const size_t stage = staged(a) ? UR_TBE_WARPS * UR_TBE_STAGE : 0;
  int64_t mids = blocks_for((int64_t)max_mid((size_t)a.n));
  unsigned mb = (unsigned)(mids < (int64_t)sms * 32 ? mids : (int64_t)sms * 32);
  if ((e = ur_launch_smem(mid_kernel<NV, E, U>, mb, UR_TBE_WARPS * 32, stage, st, a, h, s, sp)))
    return e;
  int64_t chunks = (int64_t)max_chunks((size_t)a.n);
  unsigned cb = (unsigned)(chunks < (int64_t)sms * 16 ? chunks : (int64_t)sms * 16);
  if ((e = ur_launch_smem(chunk_kernel<NV, E, U>, cb, UR_TBE_WARPS * 32, stage, st, a, s)))
    return e;
  int64_t longs = blocks_for((int64_t)max_long((size_t)a.n));
  unsigned lb = (unsigned)(longs < (int64_t)sms * 4 ? longs : (int64_t)sms * 4);
  long_kernel<NV, E, U><<<lb, UR_TBE_WARPS * 32, 0, st>>>(a, h, s, sp);
  return cudaGetLastError();
}

/* The backward's kernels, 4 elements a lane whatever the dtype (shape_of(a, false)), nv slots. */
cudaError_t reduce_rows(cudaStream_t st, const ur__tbe_args &a, const ur__tbe_hyper &h,
                        const Sorted &s, const SparseOut &sp, int nv) {
  switch (nv) {
  case 1: return launch_reduce<1, 4>(st, a, h, s, sp);
  case 2: return launch_reduce<2, 4>(st, a, h, s, sp);
  case 4: return launch_reduce<4, 4>(st, a, h, s, sp);
  default: return launch_reduce<8, 4>(st, a, h, s, sp);
  }
}

/* The atomic SGD step (f32 rows only, so E = 4). */
cudaError_t atomic_sgd(cudaStream_t st, const ur__tbe_args &a, float lr, const int32_t *gate,
                       int nv) {
  unsigned blocks = blocks_for((a.bags + 31) / 32);
  float neg = -lr;
  switch (nv) {
  case 1: atomic_sgd_kernel<1, 8><<<blocks, UR_TBE_WARPS * 32, 0, st>>>(a, neg, gate); break;
  case 2: atomic_sgd_kernel<2, 4><<<blocks, UR_TBE_WARPS * 32, 0, st>>>(a, neg, gate); break;
  case 4: atomic_sgd_kernel<4, 2><<<blocks, UR_TBE_WARPS * 32, 0, st>>>(a, neg, gate); break;
  default: atomic_sgd_kernel<8, 1><<<blocks, UR_TBE_WARPS * 32, 0, st>>>(a, neg, gate); break;
  }
  return cudaGetLastError();
}

#define UR_TRY(call)                        \
  do {                                      \
    cudaError_t e_ = (call);                \
    if (e_ != cudaSuccess) return e_;       \
  } while (0)

/* The VBE collapse: a->grad [B, out_dim] into flat bags (f32) in work; `in` then points at them. */
cudaError_t collapse(cudaStream_t st, const ur__tbe_args *a, char *work, const Layout &L,
                     ur__tbe_args *in) {
  *in = *a;
  if (!a->inverse) return cudaSuccess;
  int64_t m = (int64_t)a->num_features * a->full_batch;
  float *flat = (float *)(work + L.flat);
  int32_t *scal = (int32_t *)(work + L.vscal);
  UR_TRY(cudaMemsetAsync(flat, 0, (size_t)a->flat_numel * sizeof(float), st));
  UR_TRY(cudaMemsetAsync(scal, 0, 8 * sizeof(int32_t), st));
  if (m > 0) {
    uint32_t *k0 = (uint32_t *)(work + L.vkeys0), *k1 = (uint32_t *)(work + L.vkeys1);
    int32_t *p0 = (int32_t *)(work + L.vpos0), *p1 = (int32_t *)(work + L.vpos1);
    int32_t *starts = (int32_t *)(work + L.vstarts);
    vbe_keys_kernel<<<(unsigned)((m + 255) / 256), 256, 0, st>>>(*a, k0, p0, scal);
    UR_TRY(cudaGetLastError());
    int bits = 1;
    while (bits < 32 && ((uint64_t)1 << bits) <= (uint64_t)a->bags) bits++;
    cub::DoubleBuffer<uint32_t> kb(k0, k1);
    cub::DoubleBuffer<int32_t> pb(p0, p1);
    size_t cb = L.cub_bytes;
    UR_TRY(cub::DeviceRadixSort::SortPairs(work + L.cub, cb, kb, pb, (int)m, 0, bits, st));
    valid32_kernel<<<(unsigned)((m + 255) / 256), 256, 0, st>>>(kb.Current(), m, (uint32_t)a->bags,
                                                                  scal + 2);
    UR_TRY(cudaGetLastError());
    cb = L.cub_bytes;
    UR_TRY(cub::DeviceSelect::If(work + L.cub, cb, thrust::counting_iterator<int>(0), starts, scal,
                                 (int)m, IsStart32{kb.Current(), (uint32_t)a->bags}, st));
    Shape sh = shape_of(a);
    unsigned blocks = blocks_for(m < (int64_t)sm_count() * 64 ? m : (int64_t)sm_count() * 64);
    if (sh.e == 8)
      collapse_kernel<8><<<blocks, UR_TBE_WARPS * 32, 0, st>>>(*a, kb.Current(), pb.Current(), starts, scal, flat);
    else
      collapse_kernel<4><<<blocks, UR_TBE_WARPS * 32, 0, st>>>(*a, kb.Current(), pb.Current(), starts, scal, flat);
    UR_TRY(cudaGetLastError());
  }
  in->grad = flat;
  in->out_base = a->flat_base;
  in->out_dtype = UR_DTYPE_F32;
  in->inverse = nullptr;
  return cudaSuccess;
}

/* Keys, sort, segments, the long ones and their chunks; fills s.  K: the keys' type. */
template <typename K>
cudaError_t sort_segments(cudaStream_t st, const ur__tbe_args &a, char *work, const Layout &L,
                          Sorted *s) {
  int32_t *scal = (int32_t *)(work + L.scal);
  UR_TRY(cudaMemsetAsync(scal, 0, 8 * sizeof(int32_t), st));
  K *k0 = (K *)(work + L.keys0), *k1 = (K *)(work + L.keys1);
  int32_t *p0 = (int32_t *)(work + L.pay0), *p1 = (int32_t *)(work + L.pay1);
  int32_t *vbag = a.pooled && a.weights ? (int32_t *)(work + L.vbag) : nullptr;
  int32_t *starts = (int32_t *)(work + L.starts), *hot = (int32_t *)(work + L.hot);
  int32_t *cend = (int32_t *)(work + L.cend), *mid = (int32_t *)(work + L.mid);
  *s = Sorted();
  s->starts = starts;
  s->scal = scal;
  s->hot = hot;
  s->cend = cend;
  s->mid = mid;
  s->part = (float *)(work + L.part);
  s->vbag = vbag;
  s->pay = p0;
  if (sizeof(K) == 4) s->k32 = (const uint32_t *)k0;
  else s->k64 = (const uint64_t *)k0;
  if (a.n == 0) return cudaSuccess;
  UR_TRY(cudaMemsetAsync(k0, 0xff, (size_t)a.n * sizeof(K), st));
  keys_kernel<K><<<blocks_for((a.bags + 31) / 32), UR_TBE_WARPS * 32, 0, st>>>(a, k0, p0, vbag, scal);
  UR_TRY(cudaGetLastError());
  cub::DoubleBuffer<K> kb(k0, k1);
  cub::DoubleBuffer<int32_t> pb(p0, p1);
  size_t cb = L.cub_bytes;
  UR_TRY(cub::DeviceRadixSort::SortPairs(work + L.cub, cb, kb, pb, (int)a.n, 0, a.key_bits, st));
  const K *keys = kb.Current();
  if (sizeof(K) == 4) s->k32 = (const uint32_t *)keys;
  else s->k64 = (const uint64_t *)keys;
  s->pay = pb.Current();
  unsigned vb = (unsigned)((a.n + 255) / 256);
  valid_kernel<K><<<vb, 256, 0, st>>>(keys, a.n, (K)a.total_keys, scal + 2);
  UR_TRY(cudaGetLastError());
  cb = L.cub_bytes;
  UR_TRY(cub::DeviceSelect::If(work + L.cub, cb, thrust::counting_iterator<int>(0), starts, scal,
                               (int)a.n, IsStart<K>{keys, (K)a.total_keys}, st));
  cb = L.cub_bytes;
  UR_TRY(cub::DeviceSelect::If(work + L.cub, cb, thrust::counting_iterator<int>(0), hot, scal + 1,
                               (int)a.n, IsHot{starts, scal}, st));
  cb = L.cub_bytes;
  UR_TRY(cub::DeviceSelect::If(work + L.cub, cb, thrust::counting_iterator<int>(0), mid, scal + 3,
                               (int)a.n, IsMid{starts, scal}, st));
  cb = L.cub_bytes;
  auto chunks = thrust::make_transform_iterator(thrust::counting_iterator<int>(0),
                                                ChunksOf{starts, scal, hot});
  UR_TRY(cub::DeviceScan::InclusiveSum(work + L.cub, cb, chunks, cend,
                                       (int)max_long((size_t)a.n), st));
  return cudaSuccess;
}

} // namespace

static cudaError_t ur__cuda_tbe_work_bytes(const ur__tbe_args *a, int backward, size_t *out) {
  Layout L;
  cudaError_t e = layout_of(a, backward, &L);
  *out = L.total;
  return e;
}

static cudaError_t count_accesses(cudaStream_t st, const ur__tbe_args *a) {
  bool any = false;
  for (int32_t t = 0; t < a->num_tables; t++) any |= a->host_tables[t].counts != nullptr;
  if (!any || a->bags == 0) return cudaSuccess;
  access_count_kernel<<<(unsigned)((a->bags + 255) / 256), 256, 0, st>>>(*a);
  return cudaGetLastError();
}

static cudaError_t ur__cuda_tbe_decay_counts(cudaStream_t st, int32_t *c, int64_t n, double factor) {
  (void)cudaGetLastError();
  if (n == 0) return cudaSuccess;
  int64_t want = (n + 255) / 256;
  unsigned blocks = (unsigned)(want < (int64_t)sm_count() * 32 ? want : (int64_t)sm_count() * 32);
  decay_kernel<<<blocks, 256, 0, st>>>(c, n, factor);
  return cudaGetLastError();
}

/* ---- access counters ranked (layout.c's ur_counts_rank on device counters) ---- */

namespace {

/* keys[i] = UINT32_MAX - max(c[i], 0) (ascending keys: highest count first), ids[i] = i. */
__global__ void rank_keys_kernel(const int32_t *c, int64_t n, uint32_t *keys, uint32_t *ids) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    int32_t v = c[i];
    keys[i] = UINT32_MAX - (uint32_t)(v < 0 ? 0 : v);
    ids[i] = (uint32_t)i;
  }
}

/* order[r] = ids[r], widened. */
__global__ void rank_order_kernel(const uint32_t *ids, int64_t n, int64_t *order) {
  for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r < n;
       r += (int64_t)gridDim.x * blockDim.x)
    order[r] = ids[r];
}

/* by[ids[r]] = the count of rank r, read back from its key (the counters are not read twice). */
__global__ void rank_by_id_kernel(const uint32_t *keys, const uint32_t *ids, int64_t n, int32_t *by) {
  for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r < n;
       r += (int64_t)gridDim.x * blockDim.x)
    by[ids[r]] = (int32_t)(UINT32_MAX - keys[r]);
}

/* A sorted key's count, as the sums add it (i64: 2^31 rows of 2^31 - 1 overflow 32 bits). */
struct CountOfKey {
  __host__ __device__ int64_t operator()(uint32_t k) const { return (int64_t)(UINT32_MAX - k); }
};

/* work: two pairs of key and id buffers (cub's double buffer; pair k is key[k] then id[k], 8
 * bytes a row together), then cub's own storage, for the sort or the scan (one after the
 * other).  After the sort the pair it left free holds each output in turn (order and sums as
 * i64, the counts by id as i32), copied out before the next is written: 16 bytes a row in all. */
struct RankLayout {
  size_t key[2], id[2], cub, cub_bytes, total;
};

cudaError_t rank_layout(int64_t n, RankLayout *L) {
  size_t b = up((size_t)n * 4), off = 0;
  for (int k = 0; k < 2; k++) {
    L->key[k] = off;
    off += b;
    L->id[k] = off;
    off += b;
  }
  cub::DoubleBuffer<uint32_t> keys(nullptr, nullptr), ids(nullptr, nullptr);
  size_t sort_bytes = 0, scan_bytes = 0;
  UR_TRY(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, keys, ids, (int)n, 0, 32,
                                         (cudaStream_t)0));
  auto counts = thrust::make_transform_iterator((const uint32_t *)nullptr, CountOfKey{});
  UR_TRY(cub::DeviceScan::InclusiveSum(nullptr, scan_bytes, counts, (int64_t *)nullptr, (int)n,
                                       (cudaStream_t)0));
  L->cub_bytes = sort_bytes > scan_bytes ? sort_bytes : scan_bytes;
  L->cub = off;
  L->total = off + up(L->cub_bytes);
  return cudaSuccess;
}

} // namespace

static cudaError_t ur__cuda_rank_counts(cudaStream_t st, const int32_t *c, int64_t n, void *work,
                                        int64_t *order, int64_t *cumsum, int32_t *by_id) {
  (void)cudaGetLastError();
  if (n == 0) return cudaSuccess;
  RankLayout L;
  UR_TRY(rank_layout(n, &L));
  char *w = (char *)work;
  cub::DoubleBuffer<uint32_t> keys((uint32_t *)(w + L.key[0]), (uint32_t *)(w + L.key[1]));
  cub::DoubleBuffer<uint32_t> ids((uint32_t *)(w + L.id[0]), (uint32_t *)(w + L.id[1]));
  int64_t want = (n + 255) / 256;
  unsigned blocks = (unsigned)(want < (int64_t)sm_count() * 32 ? want : (int64_t)sm_count() * 32);
  rank_keys_kernel<<<blocks, 256, 0, st>>>(c, n, keys.Current(), ids.Current());
  UR_TRY(cudaGetLastError());
  size_t cb = L.cub_bytes;
  /* stable: equal counts keep id order, as the CPU's radix sort does */
  UR_TRY(cub::DeviceRadixSort::SortPairs(w + L.cub, cb, keys, ids, (int)n, 0, 32, st));
  /* cub flips the two buffers' selectors together: the pair not current is whole and free */
  if (keys.selector != ids.selector) return cudaErrorNotSupported;
  void *out = w + L.key[keys.selector ^ 1];
  const uint32_t *k = keys.Current(), *id = ids.Current();
  /* each output written into the free pair once the last one left it (stream order), and
   * copied straight into the caller's arrays: no keys or ids on the host.  The arrays may be
   * pageable, pinned or managed memory (ur_counts_rank takes any but device): the copies' kind
   * is the pointers' (cudaMemcpyDefault) */
  rank_order_kernel<<<blocks, 256, 0, st>>>(id, n, (int64_t *)out);
  UR_TRY(cudaGetLastError());
  UR_TRY(cudaMemcpyAsync(order, out, (size_t)n * 8, cudaMemcpyDefault, st));
  if (cumsum) {
    auto counts = thrust::make_transform_iterator(k, CountOfKey{});
    cb = L.cub_bytes;
    UR_TRY(cub::DeviceScan::InclusiveSum(w + L.cub, cb, counts, (int64_t *)out, (int)n, st));
    UR_TRY(cudaMemcpyAsync(cumsum, out, (size_t)n * 8, cudaMemcpyDefault, st));
  }
  if (by_id) {
    rank_by_id_kernel<<<blocks, 256, 0, st>>>(k, id, n, (int32_t *)out);
    UR_TRY(cudaGetLastError());
    UR_TRY(cudaMemcpyAsync(by_id, out, (size_t)n * 4, cudaMemcpyDefault, st));
  }
  return cudaStreamSynchronize(st);
}

static cudaError_t ur__cuda_tbe_forward(cudaStream_t st, const ur__tbe_args *a, void *work) {
  (void)cudaGetLastError(); /* report this call's errors only (sticky ones come back anyway) */
  UR_TRY(count_accesses(st, a));
  if (!a->inverse) return forward_into(st, *a);
  Layout L;
  UR_TRY(layout_of(a, 0, &L));
  float *flat = (float *)((char *)work + L.flat);
  ur__tbe_args in = *a;
  in.out = flat;
  in.out_base = a->flat_base;
  in.out_dtype = UR_DTYPE_F32;
  in.inverse = nullptr;
  UR_TRY(forward_into(st, in));
  int64_t rows = (int64_t)a->num_features * a->full_batch;
  if (rows == 0) return cudaSuccess;
  if (shape_of(a).e == 8) expand_kernel<8><<<blocks_for(rows), UR_TBE_WARPS * 32, 0, st>>>(*a, flat);
  else expand_kernel<4><<<blocks_for(rows), UR_TBE_WARPS * 32, 0, st>>>(*a, flat);
  return cudaGetLastError();
}

static cudaError_t backward_common(cudaStream_t st, const ur__tbe_args *a, const ur__tbe_hyper *h,
                                   void *work, const SparseOut &sp, int count_only,
                                   int64_t *counts) {
  (void)cudaGetLastError();
  Layout L;
  UR_TRY(layout_of(a, 1, &L));
  char *w = (char *)work;
  ur__tbe_args in;
  UR_TRY(collapse(st, a, w, L, &in));
  if (a->atomic && h && !sp.rows && !count_only)
    return a->n > 0 ? atomic_sgd(st, in, h->k.lr, h->k.gate, shape_of(a).nv) : cudaSuccess;
  Sorted s;
  UR_TRY(keys32(a) ? sort_segments<uint32_t>(st, in, w, L, &s) : sort_segments<uint64_t>(st, in, w, L, &s));
  if (count_only) {
    unsigned long long *c = (unsigned long long *)(w + L.tabs);
    UR_TRY(cudaMemsetAsync(c, 0, (size_t)a->num_tables * 8, st));
    if (a->n > 0) {
      count_kernel<<<(unsigned)((a->n + 255) / 256), 256, 0, st>>>(in, s, c);
      UR_TRY(cudaGetLastError());
    }
    UR_TRY(cudaMemcpyAsync(counts, c, (size_t)a->num_tables * 8, cudaMemcpyDeviceToHost, st));
    return cudaStreamSynchronize(st);
  }
  if (a->n == 0) return cudaSuccess;
  ur__tbe_hyper hh;
  if (h) hh = *h;
  else memset(&hh, 0, sizeof hh);
  return reduce_rows(st, in, hh, s, sp, shape_of(a, false).nv);
}

static cudaError_t ur__cuda_tbe_backward(cudaStream_t st, const ur__tbe_args *a, const ur__tbe_hyper *h,
                                  void *work) {
  SparseOut sp = {nullptr, nullptr, nullptr, nullptr};
  return backward_common(st, a, h, work, sp, 0, nullptr);
}

static cudaError_t ur__cuda_tbe_sparse_count(cudaStream_t st, const ur__tbe_args *a, void *work,
                                      int64_t *counts) {
  SparseOut sp = {nullptr, nullptr, nullptr, nullptr};
  return backward_common(st, a, nullptr, work, sp, 1, counts);
}

/* Sorts again rather than keeping the count's state: simpler, and this path is for tests and
 * custom optimizers, not for speed. */
static cudaError_t ur__cuda_tbe_sparse_write(cudaStream_t st, const ur__tbe_args *a, void *work,
                                      const int64_t *counts, int64_t *rows, float *grads) {
  Layout L;
  UR_TRY(layout_of(a, 1, &L));
  int64_t *tabs = (int64_t *)((char *)work + L.tabs);
  int32_t T = a->num_tables;
  int64_t *host = (int64_t *)malloc(sizeof(int64_t) * 2 * (size_t)T);
  if (!host) return cudaErrorMemoryAllocation;
  int64_t u = 0, g = 0;
  for (int32_t t = 0; t < T; t++) {
    host[t] = u;
    host[T + t] = g;
    u += counts[t];
    g += counts[t] * a->host_tables[t].dim;
  }
  cudaError_t e = cudaMemcpyAsync(tabs + T, host, sizeof(int64_t) * 2 * (size_t)T,
                                  cudaMemcpyHostToDevice, st);
  if (e == cudaSuccess) e = cudaStreamSynchronize(st);
  free(host);
  if (e != cudaSuccess) return e;
  SparseOut sp = {rows, grads, tabs + T, tabs + 2 * T};
  return backward_common(st, a, nullptr, work, sp, 0, nullptr);
}

static cudaError_t ur__cuda_gather_rows(cudaStream_t st, const void *src, size_t row_bytes,
                                 const int64_t *ids, int64_t n, void *out) {
  (void)cudaGetLastError();
  if (n == 0) return cudaSuccess;
  int sms = sm_count();
  bool v16 = row_bytes % 16 == 0 && (uintptr_t)src % 16 == 0 && (uintptr_t)out % 16 == 0;
  int per = (int)(row_bytes / (v16 ? 16 : 4));
  int64_t want = (n + 31) / 32; /* 8 warps of 4 rows per block */
  unsigned blocks = (unsigned)(want < (int64_t)sms * 64 ? want : (int64_t)sms * 64);
  if (v16)
    gather_kernel<uint4><<<blocks, 256, 0, st>>>((const uint4 *)src, ids, (uint4 *)out, n, per);
  else
    gather_kernel<unsigned><<<blocks, 256, 0, st>>>((const unsigned *)src, ids, (unsigned *)out, n, per);
  return cudaGetLastError();
}

/* ---- row swaps ---- */

/* A warp a pair: the two physical rows trade places in every tensor (16 bytes a lane where the
 * rows allow, else 4), then their permutation entries.  Pairs share no row (checked by the
 * caller), so no two warps touch the same bytes. */
__global__ void swap_rows_kernel(const ur__tbe_swap s) {
  int lane = threadIdx.x & 31;
  int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  int64_t warps = ((int64_t)gridDim.x * blockDim.x) >> 5;
  for (int64_t k = warp; k < s.n; k += warps) {
    int64_t x = s.ids[k], y = s.ids[s.n + k], px = s.perm[x], py = s.perm[y];
    for (int j = 0; j < s.ntensors; j++) {
      size_t rb = (size_t)s.row_bytes[j];
      char *a = s.base[j] + (size_t)px * rb, *b = s.base[j] + (size_t)py * rb;
      if (rb % 16 == 0 && (uintptr_t)s.base[j] % 16 == 0) {
        for (size_t w = (size_t)lane; w < rb / 16; w += 32) {
          uint4 t = ((uint4 *)a)[w];
          ((uint4 *)a)[w] = ((uint4 *)b)[w];
          ((uint4 *)b)[w] = t;
        }
      } else {
        for (size_t w = (size_t)lane; w < rb / 4; w += 32) {
          unsigned t = ((unsigned *)a)[w];
          ((unsigned *)a)[w] = ((unsigned *)b)[w];
          ((unsigned *)b)[w] = t;
        }
      }
    }
    if (lane == 0) {
      s.perm[x] = py;
      s.perm[y] = px;
    }
  }
}

static cudaError_t ur__cuda_swap_rows(cudaStream_t st, const ur__tbe_swap *s) {
  (void)cudaGetLastError();
  if (s->n == 0) return cudaSuccess;
  int64_t want = (s->n + 7) / 8; /* 8 warps a block */
  int64_t cap = (int64_t)sm_count() * 32;
  swap_rows_kernel<<<(unsigned)(want < cap ? want : cap), 256, 0, st>>>(*s);
  return cudaGetLastError();
}

/* ---- the backend's tbe table ---- */

static ur_status tbe_work_bytes(const ur__tbe_args *a, int backward, size_t *out) {
  UR_CUDA_CHECK(ur__cuda_tbe_work_bytes(a, backward, out), "tbe workspace query");
  return UR_STATUS_OK;
}

static ur_status tbe_forward(void *stream, const ur__tbe_args *a, void *work) {
  UR_CUDA_CHECK(ur__cuda_tbe_forward((cudaStream_t)stream, a, work), "tbe forward");
  return UR_STATUS_OK;
}

static ur_status tbe_backward(void *stream, const ur__tbe_args *a, const ur__tbe_hyper *h,
                              void *work) {
  UR_CUDA_CHECK(ur__cuda_tbe_backward((cudaStream_t)stream, a, h, work), "tbe backward");
  return UR_STATUS_OK;
}

static ur_status tbe_sparse_count(void *stream, const ur__tbe_args *a, void *work,
                                  int64_t *counts) {
  UR_CUDA_CHECK(ur__cuda_tbe_sparse_count((cudaStream_t)stream, a, work, counts),
                "tbe sparse gradient (count)");
  return UR_STATUS_OK;
}

static ur_status tbe_sparse_write(void *stream, const ur__tbe_args *a, void *work,
                                  const int64_t *counts, int64_t *rows, float *grads) {
  UR_CUDA_CHECK(ur__cuda_tbe_sparse_write((cudaStream_t)stream, a, work, counts, rows, grads),
                "tbe sparse gradient (write)");
  return UR_STATUS_OK;
}

static ur_status tbe_gather_rows(void *stream, const void *src, int64_t src_rows,
                                 size_t row_bytes, const int64_t *ids, int64_t n, void *out) {
  (void)src_rows; /* the ids are trusted here (tbe.h) */
  UR_CUDA_CHECK(ur__cuda_gather_rows((cudaStream_t)stream, src, row_bytes, ids, n, out),
                "tbe gather_rows");
  return UR_STATUS_OK;
}

/* far_move_kernel's grid (and far_spill_kernel's, the few rows past set_far_dma's copies, by the
 * same rule each way; not measured apart).  Reading rows over the link (the early copies): a
 * block per 16 SMs (9 on an H100 or H200): 72 warps, 147 KB of rows in flight, about twice what
 * the link (about 35 GB/s at 2 us) needs.  Its blocks hold SMs beside the step's dense kernels: B4 at 20% with early copies written behind, on an H200,
 * 4.32-4.35 ms a step with a block per 8 SMs, 4.09-4.10 per 16, 4.29 per 32 (the copies then
 * slower than the step) against 3.7 all in HBM.  16 bytes a lane and 16 rows a warp were slower
 * (4.25 ms per 32 SMs, the copies slower; 4.16 per 16, the dense kernels slower).
 * Writing rows over the link (the write home): FAR_HOME_BLOCKS, whatever the SMs.  Writes queued
 * faster than the link drains them slow every kernel beside them, and a block writes faster since
 * the homes' list holds each row's address (it searched the tables and read the permutation, about
 * 3.5 GB/s a block): with 9, the bottom MLP's forward took 0.50 ms (0.18 with 2).  B4 with early
 * copies written behind, on an H100 (4.04-4.10 ms all in HBM), at 20% and 5%: 9 blocks 0.84 and
 * 0.79 of all in HBM, 6 0.85 and 0.81, 4 0.86-0.88 and 0.85-0.86, 3 0.90 and 0.86, 2 0.90 and
 * 0.86 (4.48 and 4.67 ms; the next backward did not wait for them). */
#define FAR_HOME_BLOCKS 2
static unsigned far_move_blocks(bool to_home) {
  return to_home ? FAR_HOME_BLOCKS : (unsigned)(sm_count() / 16 + 1);
}

static ur_status tbe_far_prefetch(void *stream, const ur__tbe_args *a, const ur__tbe_far *cur) {
  cudaStream_t st = (cudaStream_t)stream;
  if (a->bags > 0) far_prefetch_kernel<<<blocks_for((a->bags + 31) / 32), UR_TBE_WARPS * 32, 0, st>>>(*a, *cur);
  UR_CUDA_CHECK(cudaGetLastError(), "tbe far_prefetch");
  /* the copies made so far are the early ones */
  UR_CUDA_CHECK(cudaMemcpyAsync(a->far.taken + UR__FAR_EARLY, a->far.taken + UR__FAR_ASKED, 4,
                                cudaMemcpyDeviceToDevice, st),
                "tbe far_prefetch (count)");
  return UR_STATUS_OK;
}

static ur_status tbe_far_patch(void *stream, const ur__tbe_far *f, const ur__tbe_far *src,
                               int32_t prior) {
  unsigned blocks = (unsigned)(sm_count() * 4);
  cudaStream_t st = (cudaStream_t)stream;
  if (prior) far_patch_kernel<true><<<blocks, UR_TBE_WARPS * 32, 0, st>>>(*f, *src);
  else far_patch_kernel<false><<<blocks, UR_TBE_WARPS * 32, 0, st>>>(*f, *src);
  UR_CUDA_CHECK(cudaGetLastError(), "tbe far_patch");
  return UR_STATUS_OK;
}

static ur_status tbe_far_move(void *stream, const ur__tbe_far *f, int32_t to_home) {
  cudaStream_t st = (cudaStream_t)stream;
  if (to_home) far_move_kernel<true><<<far_move_blocks(true), UR_TBE_WARPS * 32, 0, st>>>(*f);
  else far_move_kernel<false><<<far_move_blocks(false), UR_TBE_WARPS * 32, 0, st>>>(*f);
  UR_CUDA_CHECK(cudaGetLastError(), to_home ? "tbe far rows home" : "tbe far rows' early copies");
  return UR_STATUS_OK;
}

static ur_status tbe_far_spill(void *stream, const ur__tbe_far *f, char *host, int64_t from,
                               int32_t to_host) {
  far_spill_kernel<<<far_move_blocks(to_host != 0), UR_TBE_WARPS * 32, 0, (cudaStream_t)stream>>>(
      *f, host, from, to_host != 0);
  UR_CUDA_CHECK(cudaGetLastError(), "tbe far_spill");
  return UR_STATUS_OK;
}

static ur_status tbe_swap_rows(void *stream, const ur__tbe_swap *s) {
  UR_CUDA_CHECK(ur__cuda_swap_rows((cudaStream_t)stream, s), "tbe row swaps");
  return UR_STATUS_OK;
}

static ur_status tbe_decay_counts(void *stream, int32_t *c, int64_t n, double factor) {
  UR_CUDA_CHECK(ur__cuda_tbe_decay_counts((cudaStream_t)stream, c, n, factor),
                "tbe counter decay");
  return UR_STATUS_OK;
}

static ur_status tbe_rank_work_bytes(int64_t n, size_t *out) {
  RankLayout L;
  UR_CUDA_CHECK(rank_layout(n, &L), "tbe counts rank (work size)");
  *out = L.total;
  return UR_STATUS_OK;
}

static ur_status tbe_rank_counts(void *stream, const int32_t *c, int64_t n, void *work,
                                 int64_t *order, int64_t *cumsum, int32_t *by_id) {
  UR_CUDA_CHECK(ur__cuda_rank_counts((cudaStream_t)stream, c, n, work, order, cumsum, by_id),
                "tbe counts rank");
  return UR_STATUS_OK;
}

const ur_tbe_ops ur__cuda_tbe_ops = {
    .work_bytes = tbe_work_bytes,
    .forward = tbe_forward,
    .backward = tbe_backward,
    .sparse_count = tbe_sparse_count,
    .sparse_write = tbe_sparse_write,
    .gather_rows = tbe_gather_rows,
    .far_prefetch = tbe_far_prefetch,
    .far_patch = tbe_far_patch,
    .far_move = tbe_far_move,
    .far_spill = tbe_far_spill,
    .decay_counts = tbe_decay_counts,
    .swap_rows = tbe_swap_rows,
    .rank_work_bytes = tbe_rank_work_bytes,
    .rank_counts = tbe_rank_counts,
};
