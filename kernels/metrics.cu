/* metrics.cu: the metrics kernels.  Updates add a batch into f64 sums and histograms with
 * atomics and copy its last samples into the window ring; a compute sorts each task's window
 * with cub (by group, then prediction), reduces runs of equal predictions and scans them,
 * which gives the Mann-Whitney AUC with ties counted half, per group or for all; the
 * lifetime AUC is one block per task scanning its histogram.  64-bit sample indices where
 * batches are read; the window's sorts index with 32 bits (it holds under 2^31 samples). */
#include <cub/cub.cuh>
#include <cuda_runtime.h>
#include <stdint.h>

#include "common.cuh"
#include "metrics/metrics.h"
#include "uvmrec.h"

#define UR_M_THREADS 256
#define UR_M_BLOCKS_PER_SM 8
/* Pads arrays in the scratch so that every one starts on a 256-byte boundary, as cub wants. */
#define UR_M_ALIGN 256

/* Blocks for `work` items, capped at UR_M_BLOCKS_PER_SM per SM of the current device shared
 * among `ways` grid rows. */
static cudaError_t ur_m_blocks(int64_t work, int ways, unsigned *out) {
  int sms = 0;
  cudaError_t e = ur__cuda_sms(&sms);
  if (e != cudaSuccess) return e;
  int64_t cap = (int64_t)sms * UR_M_BLOCKS_PER_SM / (ways > 0 ? ways : 1);
  int64_t want = (work + UR_M_THREADS - 1) / UR_M_THREADS;
  if (cap < 1) cap = 1;
  if (want < 1) want = 1;
  *out = (unsigned)(want < cap ? want : cap);
  return cudaSuccess;
}

__device__ __forceinline__ double ur_m_weight(const ur__metrics_job &j, int64_t i, int t) {
  if (!j.weights) return 1.0;
  return j.weights_per_task ? (double)j.weights[i * j.tasks + t] : (double)j.weights[i];
}

/* ---- update ---- */

/* Grid rows are tasks.  Histogram atomics are skipped for zero weight, which adds nothing. */
__global__ void __launch_bounds__(UR_M_THREADS)
ur_metrics_sums_kernel(ur__metrics_job j, double *sums, int64_t stride, double *hist) {
  typedef cub::BlockReduce<double, UR_M_THREADS> Reduce;
  __shared__ typename Reduce::TempStorage tmp;
  const int t = blockIdx.y;
  double acc[UR__M_COUNT] = {0}, v[UR__M_SUMS];
  double *hpos = hist ? hist + (size_t)t * 2 * (size_t)j.bins : nullptr;
  const int64_t step = (int64_t)gridDim.x * UR_M_THREADS;
  for (int64_t i = (int64_t)blockIdx.x * UR_M_THREADS + threadIdx.x; i < j.n; i += step) {
    double p = j.preds[i * j.tasks + t], y = j.labels[i * j.tasks + t];
    ur__metrics_terms(p, y, ur_m_weight(j, i, t), j.threshold, j.eta, v);
#pragma unroll
    for (int k = 0; k < UR__M_COUNT; k++) acc[k] += v[k];
    if (hpos) {
      int64_t b = ur__metrics_bin(p, j.bins);
      if (v[UR__M_POS] != 0) atomicAdd(hpos + b, v[UR__M_POS]);
      if (v[UR__M_NEG] != 0) atomicAdd(hpos + j.bins + b, v[UR__M_NEG]);
    }
  }
  double *out = sums + (size_t)t * (size_t)stride;
#pragma unroll
  for (int k = 0; k < UR__M_COUNT; k++) {
    double s = Reduce(tmp).Sum(acc[k]);
    __syncthreads();
    if (threadIdx.x == 0 && s != 0) atomicAdd(out + k, s);
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) atomicAdd(out + UR__M_COUNT, (double)j.n);
}

__global__ void ur_metrics_ring_kernel(ur__metrics_job j, int64_t first) {
  const int64_t total = (j.n - first) * j.tasks, step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step) {
    int64_t b = first + e / j.tasks;
    int t = (int)(e % j.tasks);
    int64_t slot = (j.at + b) % j.window;
    j.ring_preds[slot * j.tasks + t] = j.preds[b * j.tasks + t];
    j.ring_labels[slot * j.tasks + t] = j.labels[b * j.tasks + t];
    j.ring_weights[slot * j.tasks + t] = (float)ur_m_weight(j, b, t);
    if (t == 0 && j.ring_groups) j.ring_groups[slot] = j.groups[b];
  }
}

static cudaError_t ur_m_sums(cudaStream_t s, const ur__metrics_job *j, double *sums,
                             int64_t stride, double *hist) {
  unsigned bx = 0;
  cudaError_t e = ur_m_blocks(j->n, j->tasks, &bx);
  if (e != cudaSuccess) return e;
  ur_metrics_sums_kernel<<<dim3(bx, (unsigned)j->tasks), UR_M_THREADS, 0, s>>>(*j, sums, stride,
                                                                             hist);
  return cudaGetLastError();
}

static cudaError_t ur__cuda_metrics_update(cudaStream_t s, const ur__metrics_job *j) {
  if (j->n <= 0) return cudaSuccess;
  (void)cudaGetLastError(); /* report this call's launches only (see kernels/tensor.cu) */
  cudaError_t e = ur_m_sums(s, j, j->state, UR__M_SUMS,
                            j->bins ? j->state + (size_t)j->tasks * UR__M_SUMS : nullptr);
  if (e != cudaSuccess || !j->window) return e;
  int64_t first = j->n > j->window ? j->n - j->window : 0;
  unsigned bx = 0;
  if ((e = ur_m_blocks((j->n - first) * j->tasks, 1, &bx)) != cudaSuccess) return e;
  ur_metrics_ring_kernel<<<bx, UR_M_THREADS, 0, s>>>(*j, first);
  return cudaGetLastError();
}

/* ---- lifetime: the histogram's AUC ---- */

/* One block per task walks the bins in tiles: an exclusive scan of the negative weight gives
 * what lies below each bin; pairs within a bin count half, and their weight is the bound. */
__global__ void __launch_bounds__(UR_M_THREADS) ur_metrics_lifetime_kernel(ur__metrics_job j) {
  typedef cub::BlockScan<double, UR_M_THREADS> Scan;
  typedef cub::BlockReduce<double, UR_M_THREADS> Reduce;
  __shared__ union {
    typename Scan::TempStorage scan;
    typename Reduce::TempStorage reduce;
  } tmp;
  __shared__ double carry;
  const int t = blockIdx.x;
  double *raw = j.raw + (size_t)t * UR__M_RAW;
  if (threadIdx.x < UR__M_SUMS) raw[threadIdx.x] = j.state[(size_t)t * UR__M_SUMS + threadIdx.x];
  else if (threadIdx.x < UR__M_RAW) raw[threadIdx.x] = 0;
  if (!j.bins) return;
  const double *pos = j.state + (size_t)j.tasks * UR__M_SUMS + (size_t)t * 2 * (size_t)j.bins;
  const double *neg = pos + j.bins;
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  double num = 0, ties = 0;
  for (int64_t base = 0; base < j.bins; base += UR_M_THREADS) {
    int64_t b = base + threadIdx.x;
    double pb = b < j.bins ? pos[b] : 0, nb = b < j.bins ? neg[b] : 0, below = 0, tile = 0;
    Scan(tmp.scan).ExclusiveSum(nb, below, tile);
    below += carry;
    num += pb * (below + 0.5 * nb);
    ties += pb * nb;
    __syncthreads(); /* every thread has read carry and is done with tmp */
    if (threadIdx.x == 0) carry += tile;
    __syncthreads();
  }
  double num_all = Reduce(tmp.reduce).Sum(num);
  __syncthreads();
  double ties_all = Reduce(tmp.reduce).Sum(ties);
  if (threadIdx.x == 0) {
    raw[UR__M_AUC_NUM] = num_all;
    raw[UR__M_AUC_TIES] = ties_all;
  }
}

static cudaError_t ur__cuda_metrics_lifetime(cudaStream_t s, const ur__metrics_job *j) {
  (void)cudaGetLastError();
  ur_metrics_lifetime_kernel<<<(unsigned)j->tasks, UR_M_THREADS, 0, s>>>(*j);
  return cudaGetLastError();
}

/* ---- window: exact AUC by sorting ---- */

/* A sorted sample's (group, prediction) key; runs of equal keys are ties. */
struct ur_m_key {
  unsigned long long g;
  unsigned int p, pad; /* pad written too, so no byte of a key is left unset */
  __host__ __device__ bool operator==(const ur_m_key &o) const { return g == o.g && p == o.p; }
};

struct ur_m_same_group {
  __host__ __device__ bool operator()(const ur_m_key &a, const ur_m_key &b) const {
    return a.g == b.g;
  }
};

/* A run's or a group's AUC numerator, positive and negative weight. */
struct ur_m_d3 {
  double num, pos, neg;
};

struct ur_m_add {
  __host__ __device__ double2 operator()(const double2 &a, const double2 &b) const {
    return make_double2(a.x + b.x, a.y + b.y);
  }
  __host__ __device__ ur_m_d3 operator()(const ur_m_d3 &a, const ur_m_d3 &b) const {
    return ur_m_d3{a.num + b.num, a.pos + b.pos, a.neg + b.neg};
  }
};

/* Where each array lives in the scratch.  Three arenas are reused as the steps go: A holds
 * the sort's keys and indices, then the scan, run groups and group keys; B the packed keys
 * and weights, then the run terms; C the runs, then the groups. */
struct ur_m_layout {
  size_t a, b, c, counts, temp, temp_bytes, total;
  size_t keys1, idx0, idx1, gk0, gk1;   /* in A, from a */
  size_t rg, ug;                         /* in A, from a (below at a) */
  size_t vals;                           /* in B, from b (ck at b, t3 at b) */
  size_t aggr;                           /* in C, from c (uck at c, gagg at c) */
};

static size_t ur_m_pad(size_t x) { return (x + UR_M_ALIGN - 1) / UR_M_ALIGN * UR_M_ALIGN; }

static size_t ur_m_max(size_t x, size_t y) { return x > y ? x : y; }

static ur_m_layout ur_m_layout_for(size_t n, size_t temp_bytes) {
  ur_m_layout L;
  size_t k4 = ur_m_pad(4 * n), k8 = ur_m_pad(8 * n), k16 = ur_m_pad(16 * n);
  size_t k24 = ur_m_pad(24 * n);
  L.keys1 = k4;
  L.idx0 = 2 * k4;
  L.idx1 = 3 * k4;
  L.gk0 = 4 * k4;
  L.gk1 = 4 * k4 + k8;
  L.rg = k16;
  L.ug = k16 + k8;
  L.vals = k16;
  L.aggr = k16;
  size_t a = ur_m_max(4 * k4 + 2 * k8, k16 + 2 * k8);
  size_t b = ur_m_max(2 * k16, k24), c = ur_m_max(2 * k16, k24);
  L.a = 0;
  L.b = a;
  L.c = a + b;
  L.counts = a + b + c;
  L.temp = L.counts + UR_M_ALIGN;
  L.temp_bytes = temp_bytes;
  L.total = L.temp + ur_m_pad(temp_bytes);
  return L;
}

/* The largest temporary storage any cub call of the window needs for n items. */
static cudaError_t ur_m_temp_bytes(int n, size_t *out) {
  size_t need[5] = {0, 0, 0, 0, 0};
  cudaError_t e;
  if ((e = cub::DeviceRadixSort::SortPairs(nullptr, need[0], (const unsigned *)nullptr,
                                           (unsigned *)nullptr, (const unsigned *)nullptr,
                                           (unsigned *)nullptr, n)) != cudaSuccess)
    return e;
  if ((e = cub::DeviceRadixSort::SortPairs(nullptr, need[1], (const unsigned long long *)nullptr,
                                           (unsigned long long *)nullptr,
                                           (const unsigned *)nullptr, (unsigned *)nullptr, n)) !=
      cudaSuccess)
    return e;
  if ((e = cub::DeviceReduce::ReduceByKey(nullptr, need[2], (const ur_m_key *)nullptr,
                                          (ur_m_key *)nullptr, (const double2 *)nullptr,
                                          (double2 *)nullptr, (int *)nullptr, ur_m_add(), n)) !=
      cudaSuccess)
    return e;
  if ((e = cub::DeviceScan::ExclusiveScanByKey(nullptr, need[3], (const ur_m_key *)nullptr,
                                               (const double2 *)nullptr, (double2 *)nullptr,
                                               ur_m_add(), make_double2(0, 0), n,
                                               ur_m_same_group())) != cudaSuccess)
    return e;
  if ((e = cub::DeviceReduce::ReduceByKey(nullptr, need[4], (const unsigned long long *)nullptr,
                                          (unsigned long long *)nullptr,
                                          (const ur_m_d3 *)nullptr, (ur_m_d3 *)nullptr,
                                          (int *)nullptr, ur_m_add(), n)) != cudaSuccess)
    return e;
  size_t m = 0;
  for (int i = 0; i < 5; i++) m = ur_m_max(m, need[i]);
  *out = m;
  return cudaSuccess;
}

static cudaError_t ur__cuda_metrics_scratch(const ur__metrics_job *j, size_t *bytes) {
  size_t temp = 0;
  cudaError_t e = ur_m_temp_bytes((int)j->n, &temp);
  if (e != cudaSuccess) return e;
  *bytes = ur_m_layout_for((size_t)j->n, temp).total;
  return cudaSuccess;
}

__global__ void ur_m_prep_kernel(ur__metrics_job j, int t, unsigned *keys, unsigned *idx) {
  const int64_t step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < j.n; i += step) {
    keys[i] = ur__metrics_pred_key(j.preds[i * j.tasks + t]);
    idx[i] = (unsigned)i;
  }
}

__global__ void ur_m_group_keys_kernel(ur__metrics_job j, const unsigned *idx,
                                       unsigned long long *gk) {
  const int64_t step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < j.n; i += step)
    gk[i] = (unsigned long long)j.groups[idx[i]] ^ 0x8000000000000000ull;
}

/* Sample order[i]'s key and its positive and negative weight, in sorted order. */
__global__ void ur_m_pack_kernel(ur__metrics_job j, int t, const unsigned *order,
                                 const unsigned long long *gk, ur_m_key *ck, double2 *vals) {
  const int64_t step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < j.n; i += step) {
    int64_t s = order[i];
    double w = ur_m_weight(j, s, t), y = j.labels[s * j.tasks + t];
    ck[i] = ur_m_key{gk ? gk[i] : 0ull, ur__metrics_pred_key(j.preds[s * j.tasks + t]), 0u};
    vals[i] = make_double2(w * y, w * (1.0 - y));
  }
}

/* A run's term: its positives beat the negatives below it in its group and tie with its own.
 * Entries past the runs become zero terms under a key no run uses, so that the group
 * reduction can run over n items without the run count leaving the device. */
__global__ void ur_m_terms_kernel(int64_t n, const int *runs, const ur_m_key *uck,
                                  const double2 *aggr, const double2 *below,
                                  unsigned long long *rg, ur_m_d3 *t3) {
  const int64_t step = (int64_t)gridDim.x * blockDim.x, m = *runs;
  for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < n; r += step) {
    if (r < m) {
      double2 a = aggr[r];
      rg[r] = uck[r].g;
      t3[r] = ur_m_d3{a.x * (below[r].y + 0.5 * a.y), a.x, a.y};
    } else {
      rg[r] = ~0ull;
      t3[r] = ur_m_d3{0, 0, 0};
    }
  }
}

/* Sums the numerators (one group: the AUC's), or the AUCs of the groups holding both classes
 * and their count, into raw. */
__global__ void __launch_bounds__(UR_M_THREADS)
ur_m_final_kernel(int64_t n, const int *groups, const ur_m_d3 *gagg, int grouped, double *raw) {
  typedef cub::BlockReduce<double, UR_M_THREADS> Reduce;
  __shared__ typename Reduce::TempStorage tmp;
  const int64_t step = (int64_t)gridDim.x * UR_M_THREADS, m = *groups < n ? *groups : n;
  double sum = 0, count = 0;
  for (int64_t g = (int64_t)blockIdx.x * UR_M_THREADS + threadIdx.x; g < m; g += step) {
    ur_m_d3 v = gagg[g];
    if (!grouped) {
      sum += v.num;
    } else if (v.pos > 0 && v.neg > 0 && v.pos * v.neg > 0) {
      sum += v.num / (v.pos * v.neg);
      count += 1;
    }
  }
  double s = Reduce(tmp).Sum(sum);
  __syncthreads();
  double c = Reduce(tmp).Sum(count);
  if (threadIdx.x == 0) {
    if (!grouped && s != 0) atomicAdd(raw + UR__M_AUC_NUM, s);
    if (grouped && c != 0) {
      atomicAdd(raw + UR__M_GAUC_SUM, s);
      atomicAdd(raw + UR__M_GAUC_GROUPS, c);
    }
  }
}

#define UR_M_TRY(call)                      \
  do {                                      \
    cudaError_t ur_m_e_ = (call);           \
    if (ur_m_e_ != cudaSuccess) return ur_m_e_; \
  } while (0)

static cudaError_t ur_m_auc(cudaStream_t s, const ur__metrics_job *j, int t, int grouped,
                            const ur_m_layout &L, unsigned blocks) {
  char *base = (char *)j->scratch;
  const int n = (int)j->n;
  const size_t un = (size_t)j->n;
  unsigned *keys0 = (unsigned *)(base + L.a), *keys1 = (unsigned *)(base + L.a + L.keys1);
  unsigned *idx0 = (unsigned *)(base + L.a + L.idx0), *idx1 = (unsigned *)(base + L.a + L.idx1);
  unsigned long long *gk0 = (unsigned long long *)(base + L.a + L.gk0);
  unsigned long long *gk1 = (unsigned long long *)(base + L.a + L.gk1);
  double2 *below = (double2 *)(base + L.a);
  unsigned long long *rg = (unsigned long long *)(base + L.a + L.rg);
  unsigned long long *ug = (unsigned long long *)(base + L.a + L.ug);
  ur_m_key *ck = (ur_m_key *)(base + L.b);
  double2 *vals = (double2 *)(base + L.b + L.vals);
  ur_m_d3 *t3 = (ur_m_d3 *)(base + L.b);
  ur_m_key *uck = (ur_m_key *)(base + L.c);
  double2 *aggr = (double2 *)(base + L.c + L.aggr);
  ur_m_d3 *gagg = (ur_m_d3 *)(base + L.c);
  int *runs = (int *)(base + L.counts), *ngroups = runs + 1;
  void *temp = base + L.temp;
  size_t tb = L.temp_bytes;

  ur_m_prep_kernel<<<blocks, UR_M_THREADS, 0, s>>>(*j, t, keys0, idx0);
  UR_M_TRY(cudaGetLastError());
  UR_M_TRY(cub::DeviceRadixSort::SortPairs(temp, tb, keys0, keys1, idx0, idx1, n, 0, 32, s));
  const unsigned *order = idx1;
  if (grouped) {
    /* Radix sort is stable: sorting the prediction order by group leaves each group in
     * prediction order. */
    ur_m_group_keys_kernel<<<blocks, UR_M_THREADS, 0, s>>>(*j, idx1, gk0);
    UR_M_TRY(cudaGetLastError());
    tb = L.temp_bytes;
    UR_M_TRY(cub::DeviceRadixSort::SortPairs(temp, tb, gk0, gk1, idx1, idx0, n, 0, 64, s));
    order = idx0;
  }
  ur_m_pack_kernel<<<blocks, UR_M_THREADS, 0, s>>>(*j, t, order, grouped ? gk1 : nullptr, ck,
                                                   vals);
  UR_M_TRY(cudaGetLastError());
  /* Entries past the runs are read by the scan (and dropped): zeroed, so none is unset. */
  UR_M_TRY(cudaMemsetAsync(uck, 0, ur_m_pad(16 * un), s));
  UR_M_TRY(cudaMemsetAsync(aggr, 0, ur_m_pad(16 * un), s));
  tb = L.temp_bytes;
  /* The const pointers make these the instantiations ur_m_temp_bytes sized. */
  UR_M_TRY(cub::DeviceReduce::ReduceByKey(temp, tb, (const ur_m_key *)ck, uck,
                                          (const double2 *)vals, aggr, runs, ur_m_add(), n, s));
  tb = L.temp_bytes;
  UR_M_TRY(cub::DeviceScan::ExclusiveScanByKey(temp, tb, (const ur_m_key *)uck,
                                               (const double2 *)aggr, below, ur_m_add(),
                                               make_double2(0, 0), n, ur_m_same_group(), s));
  ur_m_terms_kernel<<<blocks, UR_M_THREADS, 0, s>>>(j->n, runs, uck, aggr, below, rg, t3);
  UR_M_TRY(cudaGetLastError());
  UR_M_TRY(cudaMemsetAsync(gagg, 0, ur_m_pad(24 * un), s));
  tb = L.temp_bytes;
  UR_M_TRY(cub::DeviceReduce::ReduceByKey(temp, tb, (const unsigned long long *)rg, ug,
                                          (const ur_m_d3 *)t3, gagg, ngroups, ur_m_add(), n, s));
  ur_m_final_kernel<<<blocks, UR_M_THREADS, 0, s>>>(j->n, ngroups, gagg, grouped,
                                                    j->raw + (size_t)t * UR__M_RAW);
  return cudaGetLastError();
}

static cudaError_t ur__cuda_metrics_window(cudaStream_t s, const ur__metrics_job *j) {
  (void)cudaGetLastError();
  UR_M_TRY(cudaMemsetAsync(j->raw, 0, sizeof(double) * (size_t)j->tasks * UR__M_RAW, s));
  if (j->n <= 0) return cudaSuccess;
  UR_M_TRY(ur_m_sums(s, j, j->raw, UR__M_RAW, nullptr));
  if (!j->auc && !j->grouped) return cudaSuccess;
  size_t temp = 0;
  UR_M_TRY(ur_m_temp_bytes((int)j->n, &temp));
  ur_m_layout L = ur_m_layout_for((size_t)j->n, temp);
  if (L.total > j->scratch_bytes) return cudaErrorInvalidValue;
  unsigned blocks = 0;
  UR_M_TRY(ur_m_blocks(j->n, 1, &blocks));
  for (int t = 0; t < j->tasks; t++) {
    if (j->auc) UR_M_TRY(ur_m_auc(s, j, t, 0, L, blocks));
    if (j->grouped) UR_M_TRY(ur_m_auc(s, j, t, 1, L, blocks));
  }
  return cudaSuccess;
}

/* ---- the backend's metrics table ---- */

/* Names the step and the job's size in a failure. */
#define UR_METRICS_CHECK(call, step, j)                                            \
  UR_CUDA_CHECK(call, "metrics %s (%lld samples, %d tasks)", step, (long long)(j)->n, \
                (int)(j)->tasks)

static ur_status ur_cuda_metrics_update(void *stream, const ur__metrics_job *j) {
  UR_METRICS_CHECK(ur__cuda_metrics_update((cudaStream_t)stream, j), "update", j);
  return UR_STATUS_OK;
}

static ur_status ur_cuda_metrics_scratch(const ur__metrics_job *j, size_t *bytes) {
  UR_METRICS_CHECK(ur__cuda_metrics_scratch(j, bytes), "sort storage query", j);
  return UR_STATUS_OK;
}

static ur_status ur_cuda_metrics_window(void *stream, const ur__metrics_job *j) {
  size_t need = 0;
  if ((j->auc || j->grouped) && j->n > 0) {
    ur_status st = ur_cuda_metrics_scratch(j, &need);
    if (st != UR_STATUS_OK) return st;
    if (!j->scratch || need > j->scratch_bytes)
      return ur__cuda_core->set_error(UR_STATUS_INVALID,
                               "cuda: metrics window: %zu bytes of scratch given for %lld "
                               "samples; the sorts need %zu",
                               j->scratch_bytes, (long long)j->n, need);
  }
  UR_METRICS_CHECK(ur__cuda_metrics_window((cudaStream_t)stream, j), "window", j);
  return UR_STATUS_OK;
}

static ur_status ur_cuda_metrics_lifetime(void *stream, const ur__metrics_job *j) {
  UR_METRICS_CHECK(ur__cuda_metrics_lifetime((cudaStream_t)stream, j), "lifetime", j);
  return UR_STATUS_OK;
}

const ur_metrics_ops ur__cuda_metrics_ops = {
    .update = ur_cuda_metrics_update,
    .window = ur_cuda_metrics_window,
    .lifetime = ur_cuda_metrics_lifetime,
    .scratch = ur_cuda_metrics_scratch,
};
