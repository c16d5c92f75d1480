/* cache.cu: the software cache on the GPU (the CUDA backend's cache table).  Its decisions,
 * made the way the CPU reference (engine/src/embedding/cache_cpu.c) makes them, and its row
 * mover.
 *
 * One batch, in three calls on one stream:
 *   lookup  each value of a cached table becomes a key (the table's first key plus the row);
 *           when some features' tables are not cached (d.partial), the cached features'
 *           values are gathered first, so that only they are sorted (the host waits for their
 *           count); the keys are sorted (32-bit while every key fits, else 64-bit) and
 *           deduplicated, each distinct key is given its set (a hash of (table, row)), the
 *           host waits for the number of distinct keys U, and those U are put in (set, key)
 *           order by a stable sort on the set; the runs of one set are the groups.
 *   decide  a warp per set, a lane per way: the set's hits first (a ballot on the tags), then
 *           its misses in key order, each taking the lowest empty way, else the way that is
 *           least (count, stamp, way) among those no batch in flight holds, else nothing (a
 *           conflict miss).  Then an exclusive scan counts write-backs, fills and conflicts
 *           in key order, and a tally gives each table its counts.
 *   place   the move lists in key order (write-backs, fills, staged loads), the batch's slot
 *           list, and the slot id of every value; then the write-backs sorted by the row they
 *           write (they come in the order of the keys that evict them): a warp reading or
 *           writing host rows in ascending order moves them 3.5 times as fast as in random
 *           order (H200, 24 GiB of pinned rows: 51.7 against 14.6 GB/s).
 * Under bounds fatal the lookup also checks the ids of features whose tables are not cached
 * (check_others), so that the collection's forward reads no bad-id flag back.
 * The row mover: warps copy rows (and their optimizer state) between host memory (pinned or
 * managed, read and written in place over the host link) and the slot storage in HBM, in
 * 16-byte words where both ends allow it, four rows a warp at once, on few SMs (mover_blocks).
 * A batch's write-backs and fills cross the link in opposite directions, and one kernel moving
 * both carries them together: sorted rows of a 6 GiB pinned table, 1 M each way, 12.1 ms in one
 * kernel against 19.7 ms one after the other (84 against 52 GB/s: H200,
 * scripts/bench/zero_copy_probe.py --both).  At a batch's 40-60 k rows each way neither
 * direction fills the link (50 k: 1.50 ms in one kernel, 1.38 for the two alone added, 2.09
 * with one direction right behind the other, as the moves ran before): B4's cached step gained
 * 0.2 ms (docs/results.md, sixteenth session).  A fill may take the slot of a row being written
 * back, so the write-backs are first copied from their slots into the scratch (HBM to HBM, as
 * many as it holds; the rest go home directly before), then one kernel moves them home from
 * there beside the fills. */
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <cub/device/device_select.cuh>
#include <cooperative_groups.h>
#include <thrust/iterator/counting_iterator.h>

#include "common.cuh"
#include "embedding/cache.h"

namespace {

namespace cg = cooperative_groups;

constexpr int kWarpsPerBlock = 8;
constexpr int kThreads = 256;
constexpr uint64_t kEmpty = ~(uint64_t)0;
constexpr int64_t kHit = (int64_t)1 << 62;
constexpr int kWays = 32;

/* ---- the row mover ---- */

/* Which way a warp moves an entry's row: host rows into the slot (a fill), the slot's row
 * home (a write-back), the slot's row into its staging place, or from there home. */
enum Way { kFill, kWriteBack, kStage, kStagedHome };

/* Bytes one staged entry takes: its row, then each optimizer state, each 16-byte aligned. */
__host__ __device__ int64_t round16(int64_t b) { return (b + 15) / 16 * 16; }
__host__ __device__ int64_t stage_stride(const ur__cache_io &io) {
  return round16(io.row_bytes) + io.nstate * round16((int64_t)io.state_per_row * 4);
}

/* Entries a warp moves at once: their loads are issued before their stores, so a warp pays
 * the host link's latency (microseconds) once for the group, and a capped mover on few SMs
 * keeps as many rows in flight as a warp a row on all of them. */
constexpr int kRowsInFlight = 4;

/* Part `part` (0: the row; 1, 2: the optimizer states) of entry e of a list going way w: where
 * it is read and written (stage: the staging buffer, whose e-th place the entry has). */
__device__ void part_ends(const ur__cache_io &io, const int64_t *entries, int64_t e, Way w, char *stage,
                          int part, const char **src, char **dst) {
  uint64_t p = (uint64_t)entries[2 * e];
  int32_t ct = (int32_t)(p >> UR__CACHE_ROW_BITS);
  int64_t row = (int64_t)(p & UR__CACHE_ROW_MASK), slot = entries[2 * e + 1];
  char *host, *mine, *g = stage ? stage + e * stage_stride(io) : nullptr;
  if (part == 0) {
    host = (char *)io.host_w[ct] + row * io.row_bytes;
    mine = (char *)io.slot_w + slot * io.row_bytes;
  } else {
    int64_t per = io.state_per_row;
    host = (char *)((part == 2 ? io.host_s2[ct] : io.host_s1[ct]) + row * per);
    mine = (char *)((part == 2 ? io.slot_s2 : io.slot_s1) + slot * per);
    if (g) g += round16(io.row_bytes) + (part - 1) * round16(per * 4);
  }
  switch (w) {
    case kFill: *src = host; *dst = mine; break;
    case kWriteBack: *src = mine; *dst = host; break;
    case kStage: *src = mine; *dst = g; break;
    case kStagedHome: *src = g; *dst = host; break;
  }
}

/* dst[k] <- src[k] for the group's r entries, bytes each, in words of W: all loads, then all
 * stores. */
template <typename W>
__device__ void copy_group(char *const *dst, const char *const *src, int r, int64_t bytes, int lane) {
  for (int64_t i = lane; i < bytes / (int64_t)sizeof(W); i += 32) {
    W v[kRowsInFlight];
#pragma unroll
    for (int k = 0; k < kRowsInFlight; k++)
      if (k < r) v[k] = reinterpret_cast<const W *>(src[k])[i];
#pragma unroll
    for (int k = 0; k < kRowsInFlight; k++)
      if (k < r) reinterpret_cast<W *>(dst[k])[i] = v[k];
  }
}

/* One list's entries going one way. */
struct Moves {
  const int64_t *entries;
  Way w;
};

/* A group of r entries (at most kRowsInFlight) of list a, or of a and b (move_lists):
 * entry k is at[k] of b where bit k of in_b is set, else of a.  Each part in 16-byte words
 * where every end allows it, else in 4-byte ones (rows are whole 4-byte words: dim is a
 * multiple of 4). */
__device__ void move_group(const ur__cache_io &io, Moves a, Moves b, const int64_t *at, unsigned in_b,
                           char *stage, int r, int lane) {
  for (int part = 0; part <= io.nstate; part++) {
    const char *src[kRowsInFlight];
    char *dst[kRowsInFlight];
    int64_t bytes = part ? (int64_t)io.state_per_row * 4 : io.row_bytes;
    uintptr_t any = (uintptr_t)bytes;
#pragma unroll
    for (int k = 0; k < kRowsInFlight; k++)
      if (k < r) {
        Moves m = (in_b >> k) & 1 ? b : a;
        part_ends(io, m.entries, at[k], m.w, stage, part, &src[k], &dst[k]);
        any |= reinterpret_cast<uintptr_t>(src[k]) | reinterpret_cast<uintptr_t>(dst[k]);
      }
    if ((any & 15) == 0) copy_group<uint4>(dst, src, r, bytes, lane);
    else copy_group<uint32_t>(dst, src, r, bytes, lane);
  }
}

/* The row mover runs in blocks of a whole SM's worth of warps, so that a capped mover
 * (io.mover_warps) takes few SMs and leaves the others to the compute stream's kernels, which
 * it runs beside under the prefetch pipeline.  Of the grid's G warps, warp g moves entries
 * g, g + G, g + 2G, ..., kRowsInFlight at a time: uncapped, a warp per entry.  Capped
 * (io.mover_warps, rounded up to whole blocks) while the warps have at most io.mover_rows
 * entries each, the cache's policy (cache.c, MOVER_ROWS). */
constexpr int kMoverWarps = 32;
constexpr int kMoverThreads = 32 * kMoverWarps;

/* Blocks for n entries of io's mover: its capped warps, or a warp each; at least one block. */
unsigned mover_blocks(int64_t n, const ur__cache_io &io) {
  int64_t cap = ((int64_t)io.mover_warps + kMoverWarps - 1) / kMoverWarps * kMoverWarps;
  int64_t warps = cap > 0 && n > cap && n <= cap * io.mover_rows ? cap : n;
  int64_t b = (warps + kMoverWarps - 1) / kMoverWarps;
  return b > 0 ? (unsigned)b : 1u;
}

/* The entries of list a (na) and of list b (nb) in one grid: while both last, even places of
 * the walk are a's and odd ones b's (a's staged write-backs home and b's fills: both
 * directions of the link busy), then the longer list's rest; nb 0 for one list.  The
 * write-backs on 2 or 4 blocks of their own beside the fills' 8 (as the far rows' write home
 * runs) made B4's cached step 6.47 and 5.33 ms against 4.72 on an H100: the moves must end
 * within the step that uses the batch's slots. */
__global__ void __launch_bounds__(kMoverThreads)
move_lists(ur__cache_io io, Moves a, int64_t na, Moves b, int64_t nb, char *stage) {
  int64_t both = na < nb ? na : nb, G = (int64_t)gridDim.x * kMoverWarps, n = na + nb;
  int64_t at[kRowsInFlight];
  for (int64_t t0 = (int64_t)blockIdx.x * kMoverWarps + threadIdx.x / 32; t0 < n; t0 += G * kRowsInFlight) {
    int r = 0;
    unsigned in_b = 0;
    for (; r < kRowsInFlight && t0 + r * G < n; r++) {
      int64_t t = t0 + r * G;
      in_b |= (unsigned)(t < 2 * both ? (int)(t & 1) : nb > na) << r;
      at[r] = t < 2 * both ? t / 2 : t - both;
    }
    move_group(io, a, b, at, in_b, stage, r, threadIdx.x % 32);
  }
}

/* ---- keys, sets and counts: engine/src/embedding/cache_sets.h, as the CPU reference computes them ---- */

__device__ int32_t table_of_key(const ur__cache_dev &d, uint64_t key) {
  return ur__cache_table_of(d.kbase, d.nt, key);
}

__device__ uint32_t set_of(const ur__cache_dev &d, uint64_t key, int32_t ct) {
  return (uint32_t)ur__cache_set_of(d.kbase, d.set_base, d.set_count, key, ct);
}

__device__ uint64_t pair_of(const ur__cache_dev &d, uint64_t key) {
  return ur__cache_pair_of(d.kbase, d.nt, key);
}

__device__ uint32_t freq_now(uint32_t f, uint32_t epoch) { return ur__cache_freq_now(f, epoch); }

/* The first index in a[0..n) whose value is not below x. */
template <typename T>
__device__ int64_t lower_bound(const T *a, int64_t n, T x) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (a[mid] < x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* The feature of value v: the last f whose first value is at or before v (a[0] <= v; with
 * the cached values' places as a, the feature of the v-th of them). */
__device__ int32_t feature_of(const int64_t *fvb, int32_t F, int64_t v) {
  int32_t lo = 0, hi = F;
  while (hi - lo > 1) {
    int32_t mid = (lo + hi) / 2;
    if (fvb[mid] <= v) lo = mid;
    else hi = mid;
  }
  return lo;
}

__device__ int64_t *table_info(const ur__cache_job &j, int32_t ct) {
  return j.info + UR__CI_TABLES + (int64_t)ct * UR__CT_COUNT;
}

/* Write-backs, fills and conflicts counted together by one scan. */
struct Tri {
  long long wb, fill, conf;
};
struct TriSum {
  __host__ __device__ Tri operator()(const Tri &a, const Tri &b) const {
    return Tri{a.wb + b.wb, a.fill + b.fill, a.conf + b.conf};
  }
};

/* The bits of a (cache table, row) pair (UR__CACHE_ROW_BITS of row, the table's above). */
int pair_bits(const ur__cache_dev &d) {
  int b = UR__CACHE_ROW_BITS;
  while (b < 64 && ((int64_t)1 << (b - UR__CACHE_ROW_BITS)) <= d.nt) b++;
  return b;
}

/* The scratch of one batch of n values (the same carving for each of the three calls). */
struct Layout {
  uint64_t *ka, *kb;            /* keys, as distinct_of's K (32 or 64 bits), sorted into ka; the
                                 * write-backs' sort reuses both as 64-bit pairs */
  int64_t *va, *vb;             /* their value indices as int32 (a batch holds fewer than 2^31
                                 * values); the write-backs' sort reuses both as 64-bit slots */
  int64_t *uid;                 /* per sorted key: distinct keys up to it (inclusive) */
  uint64_t *ukeys;              /* the distinct keys, ascending */
  uint32_t *sa, *sb;            /* per distinct key its set, sorted into sa */
  int64_t *oa, *ob;             /* the distinct keys' indices in (set, key) order, into oa */
  int64_t *grp;                 /* [n + 1] each set's first place in oa, then U */
  int64_t *res, *evict;         /* per distinct key: slot (hits: | kHit) or -1; evicted key */
  Tri *flags, *pre;             /* [n + 1] */
  int64_t *fvb, *bag;           /* [F + 1] each feature's first value; bag starts */
  int64_t *clen, *cpos;         /* [F + 1] partial: each feature's cached values (0 for other
                                 * tables'), and their exclusive sum: its first place among the
                                 * cached values, then their count */
  void *cub;
  size_t cub_bytes, total;
};

cudaError_t carve(const ur__cache_dev &d, int64_t n, char *base, Layout *L) {
  ur__carver cv{base, 0};
  int64_t m = n > 0 ? n : 1;
  L->ka = (uint64_t *)cv.take((size_t)m * 8);
  L->kb = (uint64_t *)cv.take((size_t)m * 8);
  L->va = (int64_t *)cv.take((size_t)m * 8);
  L->vb = (int64_t *)cv.take((size_t)m * 8);
  L->uid = (int64_t *)cv.take((size_t)m * 8);
  L->ukeys = (uint64_t *)cv.take((size_t)m * 8);
  L->sa = (uint32_t *)cv.take((size_t)m * 4);
  L->sb = (uint32_t *)cv.take((size_t)m * 4);
  L->oa = (int64_t *)cv.take((size_t)m * 8);
  L->ob = (int64_t *)cv.take((size_t)m * 8);
  L->grp = (int64_t *)cv.take((size_t)(m + 1) * 8);
  L->res = (int64_t *)cv.take((size_t)m * 8);
  L->evict = (int64_t *)cv.take((size_t)m * 8);
  L->flags = (Tri *)cv.take((size_t)(m + 1) * sizeof(Tri));
  L->pre = (Tri *)cv.take((size_t)(m + 1) * sizeof(Tri));
  L->fvb = (int64_t *)cv.take((size_t)(d.F + 1) * 8);
  L->bag = (int64_t *)cv.take((size_t)(d.F + 1) * 8);
  L->clen = (int64_t *)cv.take((size_t)(d.F + 1) * 8);
  L->cpos = (int64_t *)cv.take((size_t)(d.F + 1) * 8);
  size_t c = 0, best = 0;
  cudaError_t e;
  {
    cub::DoubleBuffer<uint32_t> k32(nullptr, nullptr);
    cub::DoubleBuffer<uint64_t> k(nullptr, nullptr);
    cub::DoubleBuffer<int32_t> v32(nullptr, nullptr);
    cub::DoubleBuffer<int64_t> v(nullptr, nullptr);
    /* the first sort (distinct_of): 32- or 64-bit keys, int32 places */
    if ((e = cub::DeviceRadixSort::SortPairs(nullptr, c, k32, v32, (int)m, 0, d.key_bits, (cudaStream_t)0)))
      return e;
    best = c;
    if ((e = cub::DeviceRadixSort::SortPairs(nullptr, c, k, v32, (int)m, 0, d.key_bits, (cudaStream_t)0)))
      return e;
    best = c > best ? c : best;
    /* the write-backs' sort, on (table, row) pairs */
    if ((e = cub::DeviceRadixSort::SortPairs(nullptr, c, k, v, (int)m, 0, pair_bits(d), (cudaStream_t)0)))
      return e;
    best = c > best ? c : best;
  }
  {
    cub::DoubleBuffer<uint32_t> k(nullptr, nullptr);
    cub::DoubleBuffer<int64_t> v(nullptr, nullptr);
    if ((e = cub::DeviceRadixSort::SortPairs(nullptr, c, k, v, (int)m, 0, d.set_bits, (cudaStream_t)0)))
      return e;
    best = c > best ? c : best;
  }
  if ((e = cub::DeviceScan::InclusiveSum(nullptr, c, (const int64_t *)nullptr, (int64_t *)nullptr, (int)m,
                                         (cudaStream_t)0)))
    return e;
  best = c > best ? c : best;
  if ((e = cub::DeviceScan::ExclusiveSum(nullptr, c, (const int64_t *)nullptr, (int64_t *)nullptr, d.F + 1,
                                         (cudaStream_t)0)))
    return e;
  best = c > best ? c : best;
  if ((e = cub::DeviceSelect::Flagged(nullptr, c, thrust::counting_iterator<int64_t>(0),
                                      (const int64_t *)nullptr, (int64_t *)nullptr, (int64_t *)nullptr,
                                      (int)m, (cudaStream_t)0)))
    return e;
  best = c > best ? c : best;
  if ((e = cub::DeviceScan::ExclusiveScan(nullptr, c, (const Tri *)nullptr, (Tri *)nullptr, TriSum(),
                                          Tri{0, 0, 0}, (int)(m + 1), (cudaStream_t)0)))
    return e;
  best = c > best ? c : best;
  L->cub_bytes = best;
  L->cub = cv.take(best);
  L->total = cv.at;
  return cudaSuccess;
}

unsigned blocks_for(int64_t n) { return (unsigned)((n + kThreads - 1) / kThreads > 0 ? (n + kThreads - 1) / kThreads : 1); }

/* ---- lookup ---- */

__global__ void init_info(ur__cache_job j) {
  j.info[UR__CI_BAD_V] = INT64_MAX;
  j.info[UR__CI_BAD_F] = INT64_MAX;
}

/* Each feature's first value; every feature's span checked (the bad-id checks read the ids by
 * it), the cached tables' features counted and (partial) their values' count kept for the
 * gather. */
__global__ void feature_bounds(ur__cache_dev d, ur__cache_job j, Layout L) {
  int32_t f = blockIdx.x * blockDim.x + threadIdx.x;
  if (f > d.F) return;
  int64_t b0 = ur__tbe_bag_of(j.bag_start ? L.bag : NULL, j.batch, f);
  int64_t v0 = j.offs[b0];
  L.fvb[f] = v0;
  L.clen[f] = 0;
  if (f == d.F) {
    if (j.offs[0] != 0 || v0 != j.n) atomicMin((long long *)&j.info[UR__CI_BAD_F], (long long)d.F);
    return;
  }
  int32_t ct = d.feat_ct[f];
  int64_t b1 = ur__tbe_bag_of(j.bag_start ? L.bag : NULL, j.batch, f + 1);
  int64_t v1 = j.offs[b1];
  if (v0 < 0 || v1 < v0 || v1 > j.n) {
    atomicMin((long long *)&j.info[UR__CI_BAD_F], (long long)f);
    return;
  }
  if (ct < 0) return;
  L.clen[f] = v1 - v0;
  atomicAdd((unsigned long long *)&table_info(j, ct)[UR__CT_LOOKUPS], (unsigned long long)(v1 - v0));
}

/* Under bounds fatal, the values of the features whose tables are not cached, checked against
 * their tables' rows (make_keys checks the cached ones), so that the collection's forward,
 * which takes these ids as they are, need not read its own bad-id flag back. */
__global__ void check_others(ur__cache_dev d, ur__cache_job j, Layout L) {
  int64_t v = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (v >= j.n) return;
  int32_t f = feature_of(L.fvb, d.F, v);
  if (d.feat_ct[f] >= 0) return;
  int64_t id = j.vals[v];
  if (id < 0 || id >= d.feat_rows[f]) atomicMin((long long *)&j.info[UR__CI_BAD_V], (long long)v);
}

/* The key of the i-th of the m values sorted (the sentinel, total keys, for other tables'
 * values and bad ids): value i itself, or (partial) the i-th value of the cached features. */
template <typename K>
__global__ void make_keys(ur__cache_dev d, ur__cache_job j, Layout L, int64_t m) {
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= m) return;
  int64_t v = i;
  int32_t f;
  if (d.partial) {
    f = feature_of(L.cpos, d.F, i);
    v = L.fvb[f] + (i - L.cpos[f]);
  } else {
    f = feature_of(L.fvb, d.F, v);
  }
  uint64_t sent = (uint64_t)d.kbase[d.nt], key = sent;
  int32_t ct = d.feat_ct[f];
  if (ct >= 0) {
    int64_t id = j.vals[v], rows = d.kbase[ct + 1] - d.kbase[ct];
    if (id >= 0 && id < rows) key = (uint64_t)d.kbase[ct] + (uint64_t)id;
    else if (j.bounds_fatal) atomicMin((long long *)&j.info[UR__CI_BAD_V], (long long)v);
  }
  ((K *)L.ka)[i] = (K)key;
  ((int32_t *)L.va)[i] = (int32_t)v;
}

/* Heads of runs of equal valid keys (into res, scratch here); the count of valid keys. */
template <typename K>
__global__ void mark_heads(ur__cache_dev d, ur__cache_job j, Layout L) {
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= j.n) return;
  const K *ka = (const K *)L.ka;
  uint64_t sent = (uint64_t)d.kbase[d.nt], k = ka[i];
  bool valid = k < sent;
  L.res[i] = valid && (i == 0 || ka[i - 1] != k);
  if (i == 0 && !valid) j.info[UR__CI_NVALID] = 0;
  if (valid && (i + 1 == j.n || ka[i + 1] >= sent)) j.info[UR__CI_NVALID] = i + 1;
}

/* The distinct keys, their sets and the identity order (sorted by set next, the U of them). */
template <typename K>
__global__ void distinct_keys(ur__cache_dev d, ur__cache_job j, Layout L) {
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= j.n) return;
  if (i == 0) j.info[UR__CI_U] = L.uid[j.n - 1];
  if (L.res[i]) {
    int64_t u = L.uid[i] - 1;
    uint64_t k = ((const K *)L.ka)[i];
    L.ukeys[u] = k;
    L.sa[u] = set_of(d, k, table_of_key(d, k));
    L.oa[u] = u;
  }
}

/* Heads of each set's run in (set, key) order (into res), over the U distinct keys. */
__global__ void mark_sets(Layout L, int64_t U) {
  int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (q < U) L.res[q] = q == 0 || L.sa[q] != L.sa[q - 1];
}

/* The end of the last group, and which flights' staged rows this batch meets. */
__global__ void finish_lookup(ur__cache_dev d, ur__cache_job j, Layout L) {
  int64_t u = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  int64_t U = j.n > 0 ? L.uid[j.n - 1] : 0;
  if (u == 0) {
    L.grp[j.info[UR__CI_NG]] = U;
    if (j.info[UR__CI_BAD_V] == INT64_MAX) j.info[UR__CI_BAD_V] = -1;
    if (j.info[UR__CI_BAD_F] == INT64_MAX) j.info[UR__CI_BAD_F] = -1;
  }
  if (u >= U) return;
  uint64_t p = pair_of(d, L.ukeys[u]);
  for (int r = 0; r < UR__CACHE_RING; r++) {
    const int64_t *s = j.staged[r];
    int64_t lo = 0, hi = j.nstaged[r];
    if (!s) continue;
    while (lo < hi) {
      int64_t mid = lo + (hi - lo) / 2;
      if ((uint64_t)s[2 * mid] < p) lo = mid + 1;
      else hi = mid;
    }
    if (lo < j.nstaged[r] && (uint64_t)s[2 * lo] == p) j.info[UR__CI_MEET + r] = 1;
  }
}

/* ---- decide ---- */

__global__ void count_lfu(ur__cache_dev d, ur__cache_job j, Layout L) {
  int64_t u = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (u >= j.U) return;
  uint32_t *f = &d.freq[L.ukeys[u]];
  uint32_t x = freq_now(*f, j.epoch) + 1;
  *f = (j.epoch << 16) | (x > 0xffffu ? 0xffffu : x);
}

/* Every key's count re-based to the batch's epoch (the host asks at least every
 * UR__CACHE_REBASE_EPOCHS epochs: the counts' epochs have 16 bits). */
__global__ void rebase_lfu(uint32_t *freq, int64_t n, uint32_t epoch) {
  for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < n; k += (int64_t)gridDim.x * blockDim.x)
    freq[k] = ur__cache_freq_rebase(freq[k], epoch);
}

/* A warp per set, a lane per way: the set's hits, then its misses in key order. */
__global__ void decide_sets(ur__cache_dev d, ur__cache_job j, Layout L) {
  int64_t g = (int64_t)blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (g >= j.ng) return;
  int64_t b = L.grp[g], e = L.grp[g + 1];
  int64_t base = (int64_t)L.sa[b] * kWays, slot = base + lane;
  uint64_t tag = d.tag[slot];
  int64_t stamp = d.stamp[slot];
  uint32_t fr = j.lfu && tag != kEmpty ? freq_now(d.freq[tag], j.epoch) : 0;
  for (int64_t q = b; q < e; q++) {
    int64_t u = L.oa[q];
    unsigned m = __ballot_sync(0xffffffffu, tag == L.ukeys[u]);
    int64_t r = -1;
    if (m) {
      int w = __ffs(m) - 1;
      if (lane == w) stamp = j.ticket;
      r = (base + w) | kHit;
    }
    if (lane == 0) {
      L.res[u] = r;
      L.evict[u] = (int64_t)kEmpty;
    }
  }
  __syncwarp();
  for (int64_t q = b; q < e; q++) {
    int64_t u = L.oa[q];
    if (L.res[u] >= 0) continue;
    unsigned em = __ballot_sync(0xffffffffu, tag == kEmpty);
    int w;
    if (em) {
      w = __ffs(em) - 1;
    } else {
      /* (count, stamp, way), least first; stamps below 2^43 */
      uint64_t best = stamp < j.floor ? ((uint64_t)fr << 48) | ((uint64_t)stamp << 5) | (uint64_t)lane : ~0ull;
      for (int o = 16; o > 0; o /= 2) {
        uint64_t x = __shfl_xor_sync(0xffffffffu, best, o);
        best = x < best ? x : best;
      }
      if (best == ~0ull) continue; /* a conflict miss */
      w = (int)(best & 31);
    }
    if (lane == w) {
      uint64_t key = L.ukeys[u];
      /* the victim is in no batch in flight, so no retire marks it while this runs */
      L.evict[u] = tag == kEmpty ? (int64_t)kEmpty
                                 : (int64_t)(tag | (d.dirty[slot] ? (uint64_t)1 << 63 : 0));
      d.dirty[slot] = 0;
      tag = key;
      stamp = j.ticket;
      fr = j.lfu ? freq_now(d.freq[key], j.epoch) : 0;
      L.res[u] = slot;
    }
    __syncwarp();
  }
  d.tag[slot] = tag;
  d.stamp[slot] = stamp;
}

/* Each distinct key's flags for the scan (and the end's zeros); evictions counted to the
 * evicted row's table. */
__global__ void classify(ur__cache_dev d, ur__cache_job j, Layout L) {
  int64_t u = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (u > j.U) return;
  if (u == j.U) {
    L.flags[u] = Tri{0, 0, 0};
    return;
  }
  int64_t r = L.res[u], ev = L.evict[u];
  bool wb = ev != (int64_t)kEmpty && ((uint64_t)ev >> 63);
  L.flags[u] = Tri{wb ? 1 : 0, r >= 0 && !(r & kHit) ? 1 : 0, r < 0 ? 1 : 0};
  if (ev != (int64_t)kEmpty) {
    /* one atomic a table for the warp's evictions (its keys are sorted and, with sets per
     * table, a victim is of its evicting key's table: most share one) */
    int32_t ct = table_of_key(d, (uint64_t)ev & ~((uint64_t)1 << 63));
    cg::coalesced_group same = cg::labeled_partition(cg::coalesced_threads(), ct);
    unsigned wbs = __popc(same.ballot(wb));
    if (same.thread_rank() == 0) {
      int64_t *t = table_info(j, ct);
      atomicAdd((unsigned long long *)&t[UR__CT_EVICTIONS], (unsigned long long)same.size());
      if (wbs) atomicAdd((unsigned long long *)&t[UR__CT_WRITEBACKS], (unsigned long long)wbs);
    }
  }
}

/* Per table, its distinct keys' counts (from the scan at its first and past its last). */
__global__ void tally(ur__cache_dev d, ur__cache_job j, Layout L) {
  int32_t ct = blockIdx.x * blockDim.x + threadIdx.x;
  if (ct == 0) {
    j.info[UR__CI_NWB] = L.pre[j.U].wb;
    j.info[UR__CI_NFILL] = L.pre[j.U].fill;
    j.info[UR__CI_NCONF] = L.pre[j.U].conf;
  }
  if (ct >= d.nt) return;
  int64_t u0 = lower_bound<uint64_t>(L.ukeys, j.U, (uint64_t)d.kbase[ct]);
  int64_t u1 = lower_bound<uint64_t>(L.ukeys, j.U, (uint64_t)d.kbase[ct + 1]);
  int64_t *t = table_info(j, ct);
  int64_t conf = L.pre[u1].conf - L.pre[u0].conf, fill = L.pre[u1].fill - L.pre[u0].fill;
  t[UR__CT_UNIQUE] = u1 - u0;
  t[UR__CT_CONFLICTS] = conf;
  t[UR__CT_MISSES] = fill;
  t[UR__CT_HITS] = u1 - u0 - conf - fill;
}

/* ---- place ---- */

__global__ void place_lists(ur__cache_dev d, ur__cache_job j, Layout L) {
  int64_t u = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (u >= j.U) return;
  Tri p = L.pre[u];
  int64_t r = L.res[u], ev = L.evict[u];
  uint64_t pair = pair_of(d, L.ukeys[u]);
  if (ev != (int64_t)kEmpty && ((uint64_t)ev >> 63)) {
    j.lists[2 * p.wb] = (int64_t)pair_of(d, (uint64_t)ev & ~((uint64_t)1 << 63));
    j.lists[2 * p.wb + 1] = r;
  }
  int64_t row = (int64_t)(pair & UR__CACHE_ROW_MASK);
  if (r < 0) {
    int64_t at = 2 * (j.nwb + j.nfill + p.conf);
    j.lists[at] = (int64_t)pair;
    j.lists[at + 1] = j.sbase + p.conf;
    j.row_ids[j.sbase + p.conf] = row;
    return;
  }
  if (!(r & kHit)) {
    j.lists[2 * (j.nwb + p.fill)] = (int64_t)pair;
    j.lists[2 * (j.nwb + p.fill) + 1] = r;
    j.row_ids[r] = row;
  }
  j.lists[2 * (j.nwb + j.nfill + j.nconf) + (u - p.conf)] = r & ~kHit;
}

/* Every value's id: other tables' as they are, bad ids -1 ... */
__global__ void place_other(ur__cache_dev d, ur__cache_job j, Layout L) {
  int64_t v = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (v >= j.n) return;
  j.out[v] = d.feat_ct[feature_of(L.fvb, d.F, v)] < 0 ? j.vals[v] : -1;
}

/* ... and the valid ones their slot or staging row. */
__global__ void place_ids(ur__cache_job j, Layout L) {
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= j.nvalid) return;
  int64_t u = L.uid[i] - 1, r = L.res[u];
  j.out[((const int32_t *)L.va)[i]] = r < 0 ? j.sbase + L.pre[u].conf : r & ~kHit;
}

/* The write-backs' (pair, slot) entries apart for their sort, and back in pair order. */
__global__ void split_writebacks(ur__cache_job j, uint64_t *pairs, int64_t *slots) {
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= j.nwb) return;
  pairs[i] = (uint64_t)j.lists[2 * i];
  slots[i] = j.lists[2 * i + 1];
}

__global__ void join_writebacks(ur__cache_job j, const uint64_t *pairs, const int64_t *slots) {
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= j.nwb) return;
  j.lists[2 * i] = (int64_t)pairs[i];
  j.lists[2 * i + 1] = slots[i];
}

__global__ void mark_dirty(uint8_t *dirty, const int64_t *slots, int64_t n) {
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dirty[slots[i]] = 1;
}

#define TRY(x)                       \
  do {                               \
    cudaError_t e_ = (x);            \
    if (e_ != cudaSuccess) return e_; \
  } while (0)

cudaError_t layout_of(const ur__cache_dev *d, const ur__cache_job *j, Layout *L) {
  TRY(carve(*d, j->n, (char *)j->scratch, L));
  if (L->total > j->scratch_bytes) return cudaErrorInvalidValue;
  return cudaSuccess;
}

cudaError_t copy_info(cudaStream_t s, const ur__cache_dev *d, const ur__cache_job *j) {
  size_t words = UR__CI_TABLES + (size_t)d->nt * UR__CT_COUNT;
  return cudaMemcpyAsync(j->info_host, j->info, words * 8, cudaMemcpyDeviceToHost, s);
}

/* The jm.n values' keys sorted with their places, and the distinct keys: the keys as K, 32
 * bits while the sentinel fits (half the bytes the sort moves of 64), the places as int32. */
template <typename K>
cudaError_t distinct_of(cudaStream_t s, const ur__cache_dev &d, const ur__cache_job &j, const ur__cache_job &jm,
                        const Layout &L) {
  int64_t m = jm.n;
  make_keys<K><<<blocks_for(m), kThreads, 0, s>>>(d, j, L, m);
  K *ka = (K *)L.ka;
  int32_t *va = (int32_t *)L.va;
  cub::DoubleBuffer<K> k(ka, (K *)L.kb);
  cub::DoubleBuffer<int32_t> v(va, (int32_t *)L.vb);
  size_t tb = L.cub_bytes;
  TRY(cub::DeviceRadixSort::SortPairs(L.cub, tb, k, v, (int)m, 0, d.key_bits, s));
  if (k.Current() != ka) TRY(cudaMemcpyAsync(ka, k.Current(), (size_t)m * sizeof(K), cudaMemcpyDeviceToDevice, s));
  if (v.Current() != va) TRY(cudaMemcpyAsync(va, v.Current(), (size_t)m * 4, cudaMemcpyDeviceToDevice, s));
  mark_heads<K><<<blocks_for(m), kThreads, 0, s>>>(d, jm, L);
  tb = L.cub_bytes;
  TRY(cub::DeviceScan::InclusiveSum(L.cub, tb, (const int64_t *)L.res, L.uid, (int)m, s));
  distinct_keys<K><<<blocks_for(m), kThreads, 0, s>>>(d, jm, L);
  return cudaGetLastError();
}

}  // namespace

/* The write-backs the scratch does not hold go home first; the rest are staged, then go home
 * beside the fills. */
static cudaError_t ur__cuda_cache_move(cudaStream_t s, const ur__cache_io *io, const int64_t *out,
                                       int64_t n_out, const int64_t *in, int64_t n_in, void *scratch,
                                       size_t scratch_bytes) {
  int64_t room = n_in > 0 && scratch ? (int64_t)(scratch_bytes / (size_t)stage_stride(*io)) : 0;
  int64_t staged = n_out < room ? n_out : room, direct = n_out - staged;
  char *stage = (char *)scratch;
  const int64_t *later = out + 2 * direct;
  Moves none = {nullptr, kFill};
  if (direct > 0)
    move_lists<<<mover_blocks(direct, *io), kMoverThreads, 0, s>>>(*io, {out, kWriteBack}, direct, none, 0,
                                                                    nullptr);
  if (staged > 0)
    move_lists<<<mover_blocks(staged, *io), kMoverThreads, 0, s>>>(*io, {later, kStage}, staged, none, 0, stage);
  if (staged + n_in > 0)
    move_lists<<<mover_blocks(staged + n_in, *io), kMoverThreads, 0, s>>>(*io, {later, kStagedHome}, staged,
                                                                          {in, kFill}, n_in, stage);
  return cudaGetLastError();
}

static cudaError_t ur__cuda_cache_scratch(const ur__cache_dev *d, int64_t n, size_t *bytes) {
  Layout L;
  TRY(carve(*d, n, nullptr, &L));
  *bytes = L.total;
  return cudaSuccess;
}

static cudaError_t ur__cuda_cache_lookup(cudaStream_t s, const ur__cache_dev *d, const ur__cache_job *j) {
  Layout L;
  TRY(layout_of(d, j, &L));
  size_t words = UR__CI_TABLES + (size_t)d->nt * UR__CT_COUNT;
  int64_t n = j->n;
  TRY(cudaMemsetAsync(j->info, 0, words * 8, s));
  init_info<<<1, 1, 0, s>>>(*j);
  if (j->bag_start) TRY(cudaMemcpyAsync(L.bag, j->bag_start, (size_t)(d->F + 1) * 8, cudaMemcpyHostToDevice, s));
  feature_bounds<<<blocks_for(d->F + 1), kThreads, 0, s>>>(*d, *j, L);
  if (j->bounds_fatal && d->partial && n > 0) check_others<<<blocks_for(n), kThreads, 0, s>>>(*d, *j, L);
  /* the values sorted: all n, or (partial) the m of cached tables' features, counted on the
   * GPU and read here (none when the offsets are bad: the caller reports them) */
  int64_t m = n;
  if (d->partial && n > 0) {
    size_t tb = L.cub_bytes;
    TRY(cub::DeviceScan::ExclusiveSum(L.cub, tb, (const int64_t *)L.clen, L.cpos, d->F + 1, s));
    TRY(cudaMemcpyAsync(j->info + UR__CI_CACHED, L.cpos + d->F, 8, cudaMemcpyDeviceToDevice, s));
    TRY(copy_info(s, d, j));
    TRY(cudaStreamSynchronize(s));
    m = j->info_host[UR__CI_BAD_F] != INT64_MAX ? 0 : j->info_host[UR__CI_CACHED];
    if (m < 0 || m > n) return cudaErrorInvalidValue;
  }
  ur__cache_job jm = *j; /* the sorting kernels' job: its n values are the m sorted */
  jm.n = m;
  if (m > 0) {
    if (d->key_bits <= 32) TRY(distinct_of<uint32_t>(s, *d, *j, jm, L));
    else TRY(distinct_of<uint64_t>(s, *d, *j, jm, L));
    /* the distinct keys' count read here (one word: cache.c counts it over the link), so that
     * the set sort and what follows take the U of them, a fraction of the m values; under the
     * prefetch pipeline the host waits on the prefetch stream, not the step's */
    TRY(cudaMemcpyAsync(j->info_host + UR__CI_U, j->info + UR__CI_U, 8, cudaMemcpyDeviceToHost, s));
    TRY(cudaStreamSynchronize(s));
    int64_t U = j->info_host[UR__CI_U];
    if (U < 0 || U > m) return cudaErrorInvalidValue; /* an internal invariant (U counts sorted keys) */
    if (U > 0) {
      cub::DoubleBuffer<uint32_t> sk(L.sa, L.sb);
      cub::DoubleBuffer<int64_t> so(L.oa, L.ob);
      size_t tb = L.cub_bytes;
      TRY(cub::DeviceRadixSort::SortPairs(L.cub, tb, sk, so, (int)U, 0, d->set_bits, s));
      if (sk.Current() != L.sa) TRY(cudaMemcpyAsync(L.sa, sk.Current(), (size_t)U * 4, cudaMemcpyDeviceToDevice, s));
      if (so.Current() != L.oa) TRY(cudaMemcpyAsync(L.oa, so.Current(), (size_t)U * 8, cudaMemcpyDeviceToDevice, s));
      mark_sets<<<blocks_for(U), kThreads, 0, s>>>(L, U);
      tb = L.cub_bytes;
      TRY(cub::DeviceSelect::Flagged(L.cub, tb, thrust::counting_iterator<int64_t>(0), (const int64_t *)L.res,
                                     L.grp, j->info + UR__CI_NG, (int)U, s));
    }
    finish_lookup<<<blocks_for(U), kThreads, 0, s>>>(*d, jm, L);
  } else {
    finish_lookup<<<1, kThreads, 0, s>>>(*d, jm, L);
  }
  TRY(cudaGetLastError());
  return copy_info(s, d, j);
}

static cudaError_t ur__cuda_cache_decide(cudaStream_t s, const ur__cache_dev *d, const ur__cache_job *j) {
  Layout L;
  TRY(layout_of(d, j, &L));
  if (j->lfu && j->rebase && d->keys > 0) {
    unsigned blocks = blocks_for(d->keys);
    rebase_lfu<<<blocks < 65536u ? blocks : 65536u, kThreads, 0, s>>>(d->freq, d->keys, j->epoch);
  }
  if (j->lfu && j->U > 0) count_lfu<<<blocks_for(j->U), kThreads, 0, s>>>(*d, *j, L);
  if (j->ng > 0) {
    int64_t blocks = (j->ng + kWarpsPerBlock - 1) / kWarpsPerBlock;
    decide_sets<<<(unsigned)blocks, 32 * kWarpsPerBlock, 0, s>>>(*d, *j, L);
  }
  classify<<<blocks_for(j->U + 1), kThreads, 0, s>>>(*d, *j, L);
  size_t tb = L.cub_bytes;
  TRY(cub::DeviceScan::ExclusiveScan(L.cub, tb, (const Tri *)L.flags, L.pre, TriSum(), Tri{0, 0, 0},
                                     (int)(j->U + 1), s));
  tally<<<blocks_for(d->nt), kThreads, 0, s>>>(*d, *j, L);
  TRY(cudaGetLastError());
  return copy_info(s, d, j);
}

static cudaError_t ur__cuda_cache_place(cudaStream_t s, const ur__cache_dev *d, const ur__cache_job *j) {
  Layout L;
  TRY(layout_of(d, j, &L));
  if (j->U > 0) place_lists<<<blocks_for(j->U), kThreads, 0, s>>>(*d, *j, L);
  if (j->n > 0) place_other<<<blocks_for(j->n), kThreads, 0, s>>>(*d, *j, L);
  if (j->nvalid > 0) place_ids<<<blocks_for(j->nvalid), kThreads, 0, s>>>(*j, L);
  if (j->nwb > 1) { /* the keys' buffers are free once place_ids has run (nwb <= U <= n) */
    split_writebacks<<<blocks_for(j->nwb), kThreads, 0, s>>>(*j, L.kb, L.vb);
    cub::DoubleBuffer<uint64_t> k(L.kb, L.ka);
    cub::DoubleBuffer<int64_t> v(L.vb, L.va);
    size_t tb = L.cub_bytes;
    TRY(cub::DeviceRadixSort::SortPairs(L.cub, tb, k, v, (int)j->nwb, 0, pair_bits(*d), s));
    join_writebacks<<<blocks_for(j->nwb), kThreads, 0, s>>>(*j, k.Current(), v.Current());
  }
  return cudaGetLastError();
}

static cudaError_t ur__cuda_cache_mark(cudaStream_t s, uint8_t *dirty, const int64_t *slots, int64_t n) {
  if (n <= 0) return cudaSuccess;
  mark_dirty<<<blocks_for(n), kThreads, 0, s>>>(dirty, slots, n);
  return cudaGetLastError();
}

/* ---- the backend's cache table ---- */

static ur_status cache_move(void *stream, const ur__cache_io *io, const int64_t *out, int64_t n_out,
                            const int64_t *in, int64_t n_in, void *scratch, size_t scratch_bytes) {
  UR_CUDA_CHECK(ur__cuda_cache_move((cudaStream_t)stream, io, out, n_out, in, n_in, scratch,
                                    scratch_bytes),
                "cache row moves (%lld write-backs, %lld fills)", (long long)n_out, (long long)n_in);
  return UR_STATUS_OK;
}

static ur_status cache_scratch(const ur__cache_dev *d, int64_t n, size_t *bytes) {
  UR_CUDA_CHECK(ur__cuda_cache_scratch(d, n, bytes), "cache scratch sizing");
  return UR_STATUS_OK;
}

static ur_status cache_lookup(void *stream, const ur__cache_dev *d, const ur__cache_job *j) {
  UR_CUDA_CHECK(ur__cuda_cache_lookup((cudaStream_t)stream, d, j), "cache lookup");
  return UR_STATUS_OK;
}

static ur_status cache_decide(void *stream, const ur__cache_dev *d, const ur__cache_job *j) {
  UR_CUDA_CHECK(ur__cuda_cache_decide((cudaStream_t)stream, d, j), "cache decisions");
  return UR_STATUS_OK;
}

static ur_status cache_place(void *stream, const ur__cache_dev *d, const ur__cache_job *j) {
  UR_CUDA_CHECK(ur__cuda_cache_place((cudaStream_t)stream, d, j), "cache placement");
  return UR_STATUS_OK;
}

static ur_status cache_mark(void *stream, uint8_t *dirty, const int64_t *slots, int64_t n) {
  UR_CUDA_CHECK(ur__cuda_cache_mark((cudaStream_t)stream, dirty, slots, n), "cache dirty marks");
  return UR_STATUS_OK;
}

const ur_cache_ops ur__cuda_cache_ops = {
    .move = cache_move,
    .scratch = cache_scratch,
    .lookup = cache_lookup,
    .decide = cache_decide,
    .place = cache_place,
    .mark = cache_mark,
};
