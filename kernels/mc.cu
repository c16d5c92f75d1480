/* mc.cu: managed collisions on the GPU (the CUDA backend's mc table), following the CPU
 * reference (engine/src/embedding/mc_cpu.c) decision for decision.
 *
 * A batch: a small kernel sums each table's ids and decides whether its candidates fit the
 * map (all or none); with VBE, a histogram of the inverse indices gives each bag the samples
 * that read it; then a thread per bag looks its ids up in the index (read-only), and counts
 * them: window counts, last steps and the candidates' map by atomics, integer only, so the
 * outcome does not depend on the order of the threads; the lookups a warp counted for one
 * table are summed before one atomic add.
 *
 * A round: the candidates compacted and ranked best first, the residents ranked worst first
 * (two stable radix sorts each: by id, then by score), the admissions counted by a reduction
 * (the comparisons are monotone), the rows freed sorted, then decay, assignment, the index
 * rebuilt and the candidates cleared or re-inserted.  Built without fused multiply-adds (the
 * Makefile), the scores equal the CPU's bit for bit. */
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_reduce.cuh>
#include <cub/device/device_select.cuh>
#include <thrust/iterator/counting_iterator.h>

#include "common.cuh"
#include "embedding/mc.h"

namespace {

constexpr int kThreads = 256;

#define TRY(x)                        \
  do {                                \
    cudaError_t e_ = (x);             \
    if (e_ != cudaSuccess) return e_; \
  } while (0)

unsigned blocks_for(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  if (b < 1) b = 1;
  return (unsigned)(b < 65536 ? b : 65536);
}

typedef unsigned long long ull;

__device__ void add_i64(int64_t *p, int64_t v) { atomicAdd(reinterpret_cast<ull *>(p), (ull)v); }

/* ---- a batch ---- */

/* One block: each table's ids this batch, and whether its candidates fit. */
__global__ void prepare(ur__mc_batch b) {
  for (int t = threadIdx.x; t < b.T; t += blockDim.x) b.tables[t].info[UR__MI_NVALS] = 0;
  __syncthreads();
  for (int f = threadIdx.x; f < b.F; f += blockDim.x) {
    int t = b.feat_table[f];
    if (t >= 0)
      add_i64(&b.tables[t].info[UR__MI_NVALS],
              b.offsets[b.bag_start[f + 1]] - b.offsets[b.bag_start[f]]);
  }
  __syncthreads();
  for (int t = threadIdx.x; t < b.T; t += blockDim.x) {
    const ur__mc_table &tb = b.tables[t];
    int fits = tb.info[UR__MI_CAND] + tb.info[UR__MI_NVALS] <= (tb.qmask + 1) / 2;
    *tb.admit = fits;
    if (!fits) tb.info[UR__MI_SKIPPED]++;
  }
}

__global__ void histogram(ur__mc_batch b) {
  int64_t total = (int64_t)b.F * b.batch;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t f = i / b.batch, v = b.inverse[i];
    if (v >= 0 && v < b.bag_start[f + 1] - b.bag_start[f]) atomicAdd(&b.mult[b.bag_start[f] + v], 1);
  }
}

__device__ void cand_add(const ur__mc_table &t, int64_t id, int32_t mult, int64_t step) {
  ull s = ur__mc_hash(&t, id) & (ull)t.qmask;
  for (;;) {
    int64_t k = *(volatile int64_t *)&t.ckeys[s];
    if (k == UR__MC_EMPTY) {
      ull old = atomicCAS(reinterpret_cast<ull *>(&t.ckeys[s]), (ull)UR__MC_EMPTY, (ull)id);
      if (old == (ull)UR__MC_EMPTY) {
        add_i64(&t.info[UR__MI_CAND], 1);
        k = id;
      } else {
        k = (int64_t)old;
      }
    }
    if (k == id) {
      add_i64(&t.ccount[s], mult);
      atomicExch(reinterpret_cast<ull *>(&t.clast[s]), (ull)step);
      return;
    }
    s = (s + 1) & (ull)t.qmask;
  }
}

/* The feature of a bag: the last f whose first bag is at or before it. */
__device__ int feature_of(const int64_t *bag_start, int F, int64_t bag) {
  int lo = 0, hi = F - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (bag_start[mid] <= bag) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

/* A thread per bag; every lane of a warp runs the same number of iterations, so the warp can
 * sum its counts per table: in 32 bits, which 32 lanes' counts below 2^26 cannot overflow; a
 * lane that counted more (a VBE bag of many ids read by many samples) adds its own. */
__global__ void remap(ur__mc_batch b) {
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t base = (int64_t)blockIdx.x * blockDim.x; base < b.bags; base += stride) {
    int64_t bag = base + threadIdx.x;
    int key = -1;
    int64_t res = 0, fb = 0;
    if (bag < b.bags) {
      int f = feature_of(b.bag_start, b.F, bag);
      int ti = b.feat_table[f];
      int64_t o0 = b.offsets[bag], o1 = b.offsets[bag + 1];
      if (ti < 0) {
        for (int64_t v = o0; v < o1; v++) b.out[v] = b.values[v];
      } else {
        const ur__mc_table &t = b.tables[ti];
        int32_t mult = b.mult ? b.mult[bag] : 1;
        int count = b.update && mult > 0;
        int admit = count && *t.admit;
        for (int64_t v = o0; v < o1; v++) {
          int64_t id = b.values[v];
          int64_t row = id == UR__MC_EMPTY ? -1 : ur__mc_find(&t, id);
          if (row >= 0) {
            b.out[v] = row;
            if (count) {
              add_i64(&t.window[row], mult);
              atomicExch(reinterpret_cast<ull *>(&t.last[row]), (ull)b.step);
              res += mult;
            }
          } else {
            b.out[v] = ur__mc_fallback_row(&t, id);
            if (count) fb += mult;
            if (admit && id != UR__MC_EMPTY) cand_add(t, id, mult, b.step);
          }
        }
        if (count && (res || fb)) key = ti;
      }
    }
    const int64_t kLane = (int64_t)1 << 26;
    if (key >= 0 && (res >= kLane || fb >= kLane)) {
      const ur__mc_table &t = b.tables[key];
      add_i64(&t.info[UR__MI_LOOKUPS], res + fb);
      add_i64(&t.info[UR__MI_RESIDENT], res);
      add_i64(&t.info[UR__MI_FALLBACK], fb);
      res = fb = 0;
    }
    unsigned group = __match_any_sync(0xffffffffu, key);
    unsigned rsum = __reduce_add_sync(group, (unsigned)res), fsum = __reduce_add_sync(group, (unsigned)fb);
    if (key >= 0 && (rsum || fsum) && (threadIdx.x & 31) == __ffs(group) - 1) {
      const ur__mc_table &t = b.tables[key];
      add_i64(&t.info[UR__MI_LOOKUPS], (int64_t)rsum + (int64_t)fsum);
      add_i64(&t.info[UR__MI_RESIDENT], (int64_t)rsum);
      add_i64(&t.info[UR__MI_FALLBACK], (int64_t)fsum);
    }
  }
}

__global__ void lookup_ids(ur__mc_table t, const int64_t *ids, int64_t n, int64_t *rows,
                           int32_t *resident) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t id = ids[i];
    int64_t row = id == UR__MC_EMPTY ? -1 : ur__mc_find(&t, id);
    rows[i] = row >= 0 ? row : ur__mc_fallback_row(&t, id);
    if (resident) resident[i] = row >= 0;
  }
}

/* ---- the index and the candidates' map ---- */

__global__ void reindex_rows(ur__mc_table t, int64_t occupied) {
  for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < occupied;
       r += (int64_t)gridDim.x * blockDim.x) {
    ull s = ur__mc_hash(&t, t.ids[r]) & (ull)t.pmask;
    while (atomicCAS(&t.index[s], 0u, (uint32_t)(r + 1)) != 0u) s = (s + 1) & (ull)t.pmask;
  }
}

/* Inserts n distinct candidates (ids, counts, lasts) into t's map, empty of them. */
__global__ void cand_insert(ur__mc_table t, const int64_t *ids, const int64_t *cnt,
                            const int64_t *last, int64_t n) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    ull s = ur__mc_hash(&t, ids[i]) & (ull)t.qmask;
    while (atomicCAS(reinterpret_cast<ull *>(&t.ckeys[s]), (ull)UR__MC_EMPTY, (ull)ids[i]) !=
           (ull)UR__MC_EMPTY)
      s = (s + 1) & (ull)t.qmask;
    t.ccount[s] = cnt[i];
    t.clast[s] = last[i];
  }
}

__global__ void rehash_map(ur__mc_table from, ur__mc_table to) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i <= from.qmask;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t id = from.ckeys[i];
    if (id == UR__MC_EMPTY) continue;
    ull s = ur__mc_hash(&to, id) & (ull)to.qmask;
    while (atomicCAS(reinterpret_cast<ull *>(&to.ckeys[s]), (ull)UR__MC_EMPTY, (ull)id) !=
           (ull)UR__MC_EMPTY)
      s = (s + 1) & (ull)to.qmask;
    to.ccount[s] = from.ccount[i];
    to.clast[s] = from.clast[i];
  }
}

/* ---- a round ---- */

struct Occupied {
  const int64_t *keys;
  __host__ __device__ bool operator()(int64_t s) const { return keys[s] != UR__MC_EMPTY; }
};

/* keys[i] = the candidate's id (by = 0) or score key (by = 1) of slot slots[i]. */
__global__ void cand_keys(ur__mc_table t, const int64_t *slots, int64_t n, uint64_t *keys, int by,
                          ur__mc_round r) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t s = slots[i];
    keys[i] = by ? ur__mc_score_key(ur__mc_score(r.policy, 0, t.ccount[s], t.clast[s], r.now, r.power))
                 : (uint64_t)t.ckeys[s];
  }
}

__global__ void row_keys(ur__mc_table t, const int64_t *rows, int64_t n, uint64_t *keys, int by,
                         ur__mc_round r, int iota) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t row = iota ? i : rows[i];
    keys[i] = by ? ur__mc_score_key(ur__mc_score(r.policy, t.counts[row], t.window[row], t.last[row],
                                                 r.now, r.power))
                 : (uint64_t)t.ids[row];
  }
}

__global__ void iota(int64_t *x, int64_t n) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    x[i] = i;
}

/* flags[j] = 1 when candidate ep + j ranks before resident j (worst first). */
__global__ void better_flags(ur__mc_table t, const int64_t *cslots, const int64_t *rows, int64_t ep,
                             int64_t m, int32_t *flags, ur__mc_round r) {
  for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < m;
       j += (int64_t)gridDim.x * blockDim.x) {
    int64_t s = cslots[ep + j], row = rows[j];
    double cs = ur__mc_score(r.policy, 0, t.ccount[s], t.clast[s], r.now, r.power);
    double rs = ur__mc_score(r.policy, t.counts[row], t.window[row], t.last[row], r.now, r.power);
    flags[j] = ur__mc_better(cs, t.ckeys[s], rs, t.ids[row]);
  }
}

__global__ void fold(ur__mc_table t, int64_t occupied, double decay) {
  for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < occupied;
       r += (int64_t)gridDim.x * blockDim.x) {
    t.counts[r] = ur__mc_decayed(t.counts[r], t.window[r], decay);
    t.window[r] = 0;
  }
}

/* Candidate j (best first) takes freed row j (ascending) or, past them, a free row. */
__global__ void assign(ur__mc_table t, const int64_t *cslots, const int64_t *freed, int64_t ev,
                       int64_t adm, int64_t occupied, int evict, double decay) {
  for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < adm;
       j += (int64_t)gridDim.x * blockDim.x) {
    int64_t row = j < ev ? freed[j] : occupied + (j - ev), s = cslots[j];
    t.ids[row] = t.ckeys[s];
    /* as the CPU: an eviction round folds the lookups, a fill keeps them in the window */
    t.counts[row] = evict ? ur__mc_decayed(0, t.ccount[s], decay) : 0;
    t.window[row] = evict ? 0 : t.ccount[s];
    t.last[row] = t.clast[s];
  }
}

/* The candidates ranked from `from` on, copied aside before the map is cleared. */
__global__ void keep_left(ur__mc_table t, const int64_t *cslots, int64_t from, int64_t n,
                          int64_t *ids, int64_t *cnt, int64_t *last) {
  for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < n;
       j += (int64_t)gridDim.x * blockDim.x) {
    int64_t s = cslots[from + j];
    ids[j] = t.ckeys[s];
    cnt[j] = t.ccount[s];
    last[j] = t.clast[s];
  }
}

/* The scratch of a round of t, carved the same way for sizing and for use. */
struct Layout {
  int64_t *cslot;               /* [Q] occupied slots, then ranked best first */
  uint64_t *ka, *kb;            /* [M] sort keys */
  int64_t *va, *vb;             /* [M] sort values (slots or rows) */
  int64_t *freed;               /* [M] the rows freed, ascending */
  int64_t *kid, *kcnt, *klast;  /* [Q] candidates kept after a fill */
  int32_t *flags;               /* [M] */
  int64_t *small;               /* [4] counts from the device */
  void *cub;
  size_t cub_bytes, total;
};

cudaError_t carve(const ur__mc_table &t, char *base, Layout *L) {
  int64_t q = t.qmask + 1, mm = q > t.cap ? q : t.cap;
  ur__carver cv{base, 0};
  L->cslot = (int64_t *)cv.take((size_t)q * 8);
  L->ka = (uint64_t *)cv.take((size_t)mm * 8);
  L->kb = (uint64_t *)cv.take((size_t)mm * 8);
  L->va = (int64_t *)cv.take((size_t)mm * 8);
  L->vb = (int64_t *)cv.take((size_t)mm * 8);
  L->freed = (int64_t *)cv.take((size_t)mm * 8);
  L->kid = (int64_t *)cv.take((size_t)q * 8);
  L->klast = (int64_t *)cv.take((size_t)q * 8);
  L->kcnt = (int64_t *)cv.take((size_t)q * 8);
  L->flags = (int32_t *)cv.take((size_t)mm * 4);
  L->small = (int64_t *)cv.take(4 * 8);
  size_t c = 0, best = 0;
  int n = (int)mm;
  {
    cub::DoubleBuffer<uint64_t> k(nullptr, nullptr);
    cub::DoubleBuffer<int64_t> v(nullptr, nullptr);
    TRY(cub::DeviceRadixSort::SortPairs(nullptr, c, k, v, n, 0, 64, (cudaStream_t)0));
    best = c > best ? c : best;
    TRY(cub::DeviceRadixSort::SortPairsDescending(nullptr, c, k, v, n, 0, 64, (cudaStream_t)0));
    best = c > best ? c : best;
  }
  {
    cub::DoubleBuffer<int64_t> k(nullptr, nullptr);
    TRY(cub::DeviceRadixSort::SortKeys(nullptr, c, k, n, 0, 64, (cudaStream_t)0));
    best = c > best ? c : best;
  }
  TRY(cub::DeviceSelect::If(nullptr, c, thrust::counting_iterator<int64_t>(0), (int64_t *)nullptr,
                            (int64_t *)nullptr, (int)q, Occupied{nullptr}, (cudaStream_t)0));
  best = c > best ? c : best;
  TRY(cub::DeviceReduce::Sum(nullptr, c, (const int32_t *)nullptr, (int64_t *)nullptr, n,
                             (cudaStream_t)0));
  best = c > best ? c : best;
  L->cub_bytes = best;
  L->cub = cv.take(best);
  L->total = cv.at;
  return cudaSuccess;
}

/* Sorts n (key, value) pairs by key (descending or not), stably; keys and values end in the
 * buffers *kout / *vout point at. */
cudaError_t sort_pairs(const Layout &L, cudaStream_t s, int64_t n, int desc, uint64_t **kout,
                       int64_t **vout) {
  cub::DoubleBuffer<uint64_t> k(*kout, *kout == L.ka ? L.kb : L.ka);
  cub::DoubleBuffer<int64_t> v(*vout, *vout == L.va ? L.vb : L.va);
  size_t c = L.cub_bytes;
  if (desc) TRY(cub::DeviceRadixSort::SortPairsDescending(L.cub, c, k, v, (int)n, 0, 64, s));
  else TRY(cub::DeviceRadixSort::SortPairs(L.cub, c, k, v, (int)n, 0, 64, s));
  *kout = k.Current();
  *vout = v.Current();
  return cudaSuccess;
}

/* Ids sort as signed numbers: flip the sign bit so that unsigned radix order is theirs. */
__global__ void signed_order(uint64_t *k, int64_t n) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    k[i] ^= (uint64_t)1 << 63;
}

cudaError_t round_run(cudaStream_t s, const ur__mc_table &t, ur__mc_round *r) {
  Layout L;
  TRY(carve(t, (char *)r->scratch, &L));
  int64_t q = t.qmask + 1, occ = r->occupied;
  /* the candidates, best first: by id ascending, then (stably) by score descending */
  {
    size_t c = L.cub_bytes;
    TRY(cub::DeviceSelect::If(L.cub, c, thrust::counting_iterator<int64_t>(0), L.cslot, L.small,
                              (int)q, Occupied{t.ckeys}, s));
  }
  int64_t nc = 0;
  TRY(cudaMemcpyAsync(&nc, L.small, 8, cudaMemcpyDeviceToHost, s));
  TRY(cudaStreamSynchronize(s));
  int64_t empty = t.cap - occ, ep = nc < empty ? nc : empty;
  int64_t m = r->evict && nc > ep ? (nc - ep < occ ? nc - ep : occ) : 0;
  const int64_t *cranked = L.cslot;
  if (nc > 0) {
    uint64_t *k = L.ka;
    int64_t *v = L.va;
    cand_keys<<<blocks_for(nc), kThreads, 0, s>>>(t, L.cslot, nc, k, 0, *r);
    signed_order<<<blocks_for(nc), kThreads, 0, s>>>(k, nc);
    TRY(cudaMemcpyAsync(v, L.cslot, (size_t)nc * 8, cudaMemcpyDeviceToDevice, s));
    TRY(sort_pairs(L, s, nc, 0, &k, &v));
    cand_keys<<<blocks_for(nc), kThreads, 0, s>>>(t, v, nc, k, 1, *r);
    TRY(sort_pairs(L, s, nc, 1, &k, &v));
    TRY(cudaMemcpyAsync(L.cslot, v, (size_t)nc * 8, cudaMemcpyDeviceToDevice, s));
  }
  /* the residents, worst first: by id descending, then (stably) by score ascending */
  int64_t ev = 0;
  if (m > 0) {
    uint64_t *k = L.ka;
    int64_t *v = L.va;
    iota<<<blocks_for(occ), kThreads, 0, s>>>(v, occ);
    row_keys<<<blocks_for(occ), kThreads, 0, s>>>(t, nullptr, occ, k, 0, *r, 1);
    signed_order<<<blocks_for(occ), kThreads, 0, s>>>(k, occ);
    TRY(sort_pairs(L, s, occ, 1, &k, &v));
    row_keys<<<blocks_for(occ), kThreads, 0, s>>>(t, v, occ, k, 1, *r, 0);
    TRY(sort_pairs(L, s, occ, 0, &k, &v));
    better_flags<<<blocks_for(m), kThreads, 0, s>>>(t, cranked, v, ep, m, L.flags, *r);
    size_t c = L.cub_bytes;
    TRY(cub::DeviceReduce::Sum(L.cub, c, L.flags, L.small + 1, (int)m, s));
    TRY(cudaMemcpyAsync(&ev, L.small + 1, 8, cudaMemcpyDeviceToHost, s));
    TRY(cudaStreamSynchronize(s));
    if (ev > 0) {
      /* the rows freed, ascending */
      TRY(cudaMemcpyAsync(L.freed, v, (size_t)ev * 8, cudaMemcpyDeviceToDevice, s));
      cub::DoubleBuffer<int64_t> fk(L.freed, L.vb == v ? L.va : L.vb);
      size_t c2 = L.cub_bytes;
      TRY(cub::DeviceRadixSort::SortKeys(L.cub, c2, fk, (int)ev, 0, 64, s));
      if (fk.Current() != L.freed)
        TRY(cudaMemcpyAsync(L.freed, fk.Current(), (size_t)ev * 8, cudaMemcpyDeviceToDevice, s));
    }
  }
  int64_t adm = ep + ev;
  if (r->evict && occ > 0) fold<<<blocks_for(occ), kThreads, 0, s>>>(t, occ, r->decay);
  if (adm > 0)
    assign<<<blocks_for(adm), kThreads, 0, s>>>(t, cranked, L.freed, ev, adm, occ, r->evict, r->decay);
  /* the index, rebuilt over the rows now held */
  TRY(cudaMemsetAsync(t.index, 0, (size_t)(t.pmask + 1) * 4, s));
  if (occ + ep > 0) reindex_rows<<<blocks_for(occ + ep), kThreads, 0, s>>>(t, occ + ep);
  /* the candidates: forgotten after an eviction round; after a fill, those left stay */
  int64_t left = r->evict ? 0 : nc - adm;
  if (left > 0)
    keep_left<<<blocks_for(left), kThreads, 0, s>>>(t, cranked, adm, left, L.kid, L.kcnt, L.klast);
  TRY(cudaMemsetAsync(t.ckeys, 0xFF, (size_t)q * 8, s));
  TRY(cudaMemsetAsync(t.ccount, 0, (size_t)q * 8, s));
  TRY(cudaMemsetAsync(t.clast, 0, (size_t)q * 8, s));
  if (left > 0) cand_insert<<<blocks_for(left), kThreads, 0, s>>>(t, L.kid, L.kcnt, L.klast, left);
  TRY(cudaMemcpyAsync(&t.info[UR__MI_CAND], &left, 8, cudaMemcpyHostToDevice, s));
  if (ev > 0) TRY(cudaMemcpyAsync(r->rows, L.freed, (size_t)ev * 8, cudaMemcpyDeviceToHost, s));
  TRY(cudaGetLastError());
  TRY(cudaStreamSynchronize(s));
  r->admitted = adm;
  r->evicted = ev;
  r->candidates = nc;
  return cudaSuccess;
}

}  // namespace

/* ---- the backend's mc table ---- */

static ur_status mc_remap(void *stream, const ur__mc_batch *b) {
  cudaStream_t s = (cudaStream_t)stream;
  if (b->update) {
    prepare<<<1, kThreads, 0, s>>>(*b);
    UR_CUDA_CHECK(cudaGetLastError(), "managed collisions: sizing a batch of %lld ids", (long long)b->n);
  }
  if (b->mult) {
    UR_CUDA_CHECK(cudaMemsetAsync(b->mult, 0, (size_t)b->bags * 4, s), "managed collisions: clearing counts");
    if (b->batch > 0) histogram<<<blocks_for((int64_t)b->F * b->batch), kThreads, 0, s>>>(*b);
    UR_CUDA_CHECK(cudaGetLastError(), "managed collisions: the samples of each bag");
  }
  if (b->bags > 0) remap<<<blocks_for(b->bags), kThreads, 0, s>>>(*b);
  UR_CUDA_CHECK(cudaGetLastError(), "managed collisions: remap of %lld ids", (long long)b->n);
  return UR_STATUS_OK;
}

static ur_status mc_lookup(void *stream, const ur__mc_table *t, const int64_t *ids, int64_t n,
                           int64_t *rows, int32_t *resident) {
  if (n > 0) lookup_ids<<<blocks_for(n), kThreads, 0, (cudaStream_t)stream>>>(*t, ids, n, rows, resident);
  UR_CUDA_CHECK(cudaGetLastError(), "managed collisions: lookup of %lld ids", (long long)n);
  return UR_STATUS_OK;
}

static ur_status mc_round_scratch(const ur__mc_table *t, size_t *bytes) {
  if (t->qmask + 1 > INT32_MAX || t->cap > INT32_MAX)
    return ur__cuda_core->set_error(UR_STATUS_UNSUPPORTED,
                                    "cuda: managed collisions: a round of %lld rows and %lld candidate "
                                    "slots; the GPU's rounds sort at most 2^31 - 1",
                                    (long long)t->cap, (long long)(t->qmask + 1));
  Layout L;
  UR_CUDA_CHECK(carve(*t, nullptr, &L), "managed collisions: sizing a round's scratch");
  *bytes = L.total;
  return UR_STATUS_OK;
}

static ur_status mc_round(void *stream, const ur__mc_table *t, ur__mc_round *r) {
  UR_CUDA_CHECK(round_run((cudaStream_t)stream, *t, r), "managed collisions: a round of %lld rows",
                (long long)t->cap);
  return UR_STATUS_OK;
}

static ur_status mc_rehash(void *stream, const ur__mc_table *from, const ur__mc_table *to) {
  rehash_map<<<blocks_for(from->qmask + 1), kThreads, 0, (cudaStream_t)stream>>>(*from, *to);
  UR_CUDA_CHECK(cudaGetLastError(), "managed collisions: growing a candidates' map to %lld slots",
                (long long)(to->qmask + 1));
  return UR_STATUS_OK;
}

static ur_status mc_reindex(void *stream, const ur__mc_table *t, int64_t occupied) {
  if (occupied > 0) reindex_rows<<<blocks_for(occupied), kThreads, 0, (cudaStream_t)stream>>>(*t, occupied);
  UR_CUDA_CHECK(cudaGetLastError(), "managed collisions: indexing %lld rows", (long long)occupied);
  return UR_STATUS_OK;
}

const ur_mc_ops ur__cuda_mc_ops = {
    .remap = mc_remap,
    .lookup = mc_lookup,
    .round_scratch = mc_round_scratch,
    .round = mc_round,
    .rehash = mc_rehash,
    .reindex = mc_reindex,
};
