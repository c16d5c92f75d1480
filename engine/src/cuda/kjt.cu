/* kjt.cu (glue): the CUDA backend's keyed-jagged-tensor entries.  It sequences the kernels of
 * kernels/kjt.cu with cub's scans (offsets, dedup's counts, run starts) and radix sort (dedup),
 * takes each call's scratch from the stream-ordered pool (cudaMallocAsync, freed on the same
 * stream, so nothing waits for it), and turns CUDA's errors into messages naming the step.
 * Only the entries that hand sizes back to the host wait for the stream. */
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include "backend.h"
#include "kjt_kernels.h"

static const ur_core_api *g_kjt_core;

/* The step that failed, for the message. */
#define UR_KJT_TRY(call, step)          \
  do {                                  \
    cudaError_t e_ = (call);            \
    if (e_ != cudaSuccess) {            \
      *what = (step);                   \
      return e_;                        \
    }                                   \
  } while (0)

static ur_status ur_kjt_status(cudaError_t err, const char *op, const char *what) {
  if (err == cudaSuccess) return UR_STATUS_OK;
  (void)cudaGetLastError();
  ur_status status = err == cudaErrorMemoryAllocation ? UR_STATUS_OOM : UR_STATUS_DEVICE;
  return g_kjt_core->set_error(status, "cuda: kjt %s (%s) failed: %s (%s)", op, what,
                               cudaGetErrorName(err), cudaGetErrorString(err));
}

/* One allocation per call, carved into aligned parts; freed in stream order. */
struct ur_kjt_scratch {
  cudaStream_t s;
  char *base;
  size_t used, cap;
  explicit ur_kjt_scratch(cudaStream_t st) : s(st), base(nullptr), used(0), cap(0) {}
  ~ur_kjt_scratch() {
    if (base && cudaFreeAsync(base, s) != cudaSuccess) (void)cudaGetLastError();
  }
  static size_t up(size_t b) { return (b + 255) & ~(size_t)255; }
  cudaError_t alloc(size_t bytes) {
    cap = bytes ? bytes : 256;
    return cudaMallocAsync((void **)&base, cap, s);
  }
  template <typename T> T *take(size_t n) {
    T *p = (T *)(base + used);
    used += up(n * sizeof(T));
    return p;
  }
};

/* ---- offsets ---- */

static cudaError_t ur_kjt_offsets_run(cudaStream_t s, const int32_t *len, int64_t nb, int64_t *off,
                                      const int64_t *bag0, int32_t nkeys, int64_t nv,
                                      int64_t *val0, int64_t *bad, const char **what) {
  size_t cub_bytes = 0;
  UR_KJT_TRY(cub::DeviceScan::InclusiveSum(nullptr, cub_bytes, off + 1, off + 1, nb, s),
             "scan size");
  ur_kjt_scratch w(s);
  size_t n1 = (size_t)nkeys + 1;
  UR_KJT_TRY(w.alloc(w.up(cub_bytes) + 2 * w.up(n1 * 8) + w.up(2 * 8)), "scratch");
  void *tmp = w.take<char>(cub_bytes);
  int64_t *d_bag0 = w.take<int64_t>(n1), *d_val0 = w.take<int64_t>(n1);
  unsigned long long *d_bad = w.take<unsigned long long>(2);
  if (val0) UR_KJT_TRY(cudaMemsetAsync(d_bad, 0xff, 2 * 8, s), "clear");
  UR_KJT_TRY(ur__cuda_kjt_widen(s, len, nb, off, val0 ? d_bad : nullptr), "lengths");
  if (nb > 0)
    UR_KJT_TRY(cub::DeviceScan::InclusiveSum(tmp, cub_bytes, off + 1, off + 1, nb, s), "scan");
  if (!val0) return cudaSuccess;
  UR_KJT_TRY(ur__cuda_kjt_over(s, off, nb, nv, d_bad + 1), "sum check");
  UR_KJT_TRY(cudaMemcpyAsync(d_bag0, bag0, n1 * 8, cudaMemcpyHostToDevice, s), "key spans up");
  UR_KJT_TRY(ur__cuda_kjt_gather_i64(s, off, d_bag0, 0, (int64_t)n1, d_val0), "key spans");
  unsigned long long hb[2];
  UR_KJT_TRY(cudaMemcpyAsync(val0, d_val0, n1 * 8, cudaMemcpyDeviceToHost, s), "key spans down");
  UR_KJT_TRY(cudaMemcpyAsync(hb, d_bad, sizeof hb, cudaMemcpyDeviceToHost, s), "checks down");
  UR_KJT_TRY(cudaStreamSynchronize(s), "wait");
  for (int i = 0; i < 2; i++) bad[i] = hb[i] == ~0ull ? -1 : (int64_t)hb[i];
  return cudaSuccess;
}

static ur_status ur_cuda_kjt_offsets(void *stream, const int32_t *len, int64_t nb, int64_t *off,
                                     const int64_t *bag0, int32_t nkeys, int64_t nv,
                                     int64_t *val0, int64_t *bad) {
  const char *what = "";
  cudaError_t e = ur_kjt_offsets_run((cudaStream_t)stream, len, nb, off, bag0, nkeys, nv, val0,
                                     bad, &what);
  return ur_kjt_status(e, "offsets", what);
}

/* ---- validate ---- */

static cudaError_t ur_kjt_validate_run(cudaStream_t s, const int32_t *len, const int64_t *off,
                                       const int64_t *val, const int64_t *inv, int64_t nv,
                                       int32_t nkeys, int64_t stride, const int64_t *bag0,
                                       const int64_t *spk, const int64_t *rows, int64_t *bad,
                                       const char **what) {
  size_t n1 = (size_t)nkeys + 1;
  int64_t nb = bag0[nkeys];
  ur_kjt_scratch w(s);
  UR_KJT_TRY(w.alloc(3 * w.up(n1 * 8) + w.up(3 * 8)), "scratch");
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
  return cudaSuccess;
}

static ur_status ur_cuda_kjt_validate(void *stream, const int32_t *len, const int64_t *off,
                                      const int64_t *val, const int64_t *inv, int64_t nv,
                                      int32_t nkeys, int64_t stride, const int64_t *bag0,
                                      const int64_t *spk, const int64_t *rows, int64_t *bad) {
  const char *what = "";
  cudaError_t e = ur_kjt_validate_run((cudaStream_t)stream, len, off, val, inv, nv, nkeys, stride,
                                      bag0, spk, rows, bad, &what);
  return ur_kjt_status(e, "validate", what);
}

/* ---- segment copies ---- */

static cudaError_t ur_kjt_segments_run(cudaStream_t s, void *dst, size_t elem_bytes,
                                       const ur__kjt_seg *segs, int64_t nseg, const char **what) {
  if (nseg <= 0) return cudaSuccess;
  int64_t *block0 = (int64_t *)malloc(sizeof(int64_t) * (size_t)(nseg + 1));
  if (!block0) {
    *what = "host memory";
    return cudaErrorMemoryAllocation;
  }
  block0[0] = 0;
  for (int64_t i = 0; i < nseg; i++)
    block0[i + 1] = block0[i] + (segs[i].n + UR__KJT_CHUNK - 1) / UR__KJT_CHUNK;
  int64_t nblocks = block0[nseg];
  ur_kjt_scratch w(s);
  cudaError_t e = w.alloc(w.up((size_t)nseg * sizeof(ur__kjt_seg)) + w.up((size_t)(nseg + 1) * 8));
  ur__kjt_seg *d_segs = nullptr;
  int64_t *d_block0 = nullptr;
  if (e == cudaSuccess) {
    d_segs = w.take<ur__kjt_seg>((size_t)nseg);
    d_block0 = w.take<int64_t>((size_t)nseg + 1);
    /* From pageable memory the copies are staged before they return, so the arrays can go. */
    e = cudaMemcpyAsync(d_segs, segs, (size_t)nseg * sizeof(ur__kjt_seg), cudaMemcpyHostToDevice,
                        s);
    if (e == cudaSuccess)
      e = cudaMemcpyAsync(d_block0, block0, (size_t)(nseg + 1) * 8, cudaMemcpyHostToDevice, s);
    if (e != cudaSuccess) *what = "segments up";
  } else {
    *what = "scratch";
  }
  free(block0);
  UR_KJT_TRY(e, *what);
  UR_KJT_TRY(ur__cuda_kjt_segments(s, dst, elem_bytes, d_segs, d_block0, nseg, nblocks), "copy");
  return cudaSuccess;
}

static ur_status ur_cuda_kjt_segments(void *stream, void *dst, size_t elem_bytes,
                                      const ur__kjt_seg *segs, int64_t nseg) {
  const char *what = "";
  cudaError_t e = ur_kjt_segments_run((cudaStream_t)stream, dst, elem_bytes, segs, nseg, &what);
  return ur_kjt_status(e, "segment copy", what);
}

/* ---- bag gathers: expand, dedup's compaction ---- */

static cudaError_t ur_kjt_expand_map_run(cudaStream_t s, const int64_t *inv, const int64_t *bag0,
                                         int32_t nkeys, int64_t stride, int64_t *map,
                                         const char **what) {
  if ((int64_t)nkeys * stride <= 0) return cudaSuccess;
  ur_kjt_scratch w(s);
  size_t n1 = (size_t)nkeys + 1;
  UR_KJT_TRY(w.alloc(w.up(n1 * 8)), "scratch");
  int64_t *d_bag0 = w.take<int64_t>(n1);
  UR_KJT_TRY(cudaMemcpyAsync(d_bag0, bag0, n1 * 8, cudaMemcpyHostToDevice, s), "key spans up");
  UR_KJT_TRY(ur__cuda_kjt_expand_map(s, inv, d_bag0, nkeys, stride, map), "map");
  return cudaSuccess;
}

static ur_status ur_cuda_kjt_expand_map(void *stream, const int64_t *inv, const int64_t *bag0,
                                        int32_t nkeys, int64_t stride, int64_t *map) {
  const char *what = "";
  cudaError_t e = ur_kjt_expand_map_run((cudaStream_t)stream, inv, bag0, nkeys, stride, map, &what);
  return ur_kjt_status(e, "expand", what);
}

static cudaError_t ur_kjt_bag_lengths_run(cudaStream_t s, const int32_t *len, const int64_t *map,
                                          int64_t n, int32_t *len_out, int64_t *off_out,
                                          int64_t step, int32_t nat, int64_t *at_out,
                                          const char **what) {
  size_t cub_bytes = 0;
  UR_KJT_TRY(cub::DeviceScan::InclusiveSum(nullptr, cub_bytes, off_out + 1, off_out + 1, n, s),
             "scan size");
  ur_kjt_scratch w(s);
  UR_KJT_TRY(w.alloc(w.up(cub_bytes) + w.up((size_t)(nat > 0 ? nat : 1) * 8)), "scratch");
  void *tmp = w.take<char>(cub_bytes);
  int64_t *d_at = w.take<int64_t>((size_t)(nat > 0 ? nat : 1));
  UR_KJT_TRY(ur__cuda_kjt_bag_lengths(s, len, map, n, len_out, off_out), "lengths");
  if (n > 0)
    UR_KJT_TRY(cub::DeviceScan::InclusiveSum(tmp, cub_bytes, off_out + 1, off_out + 1, n, s),
               "scan");
  if (nat <= 0) return cudaSuccess;
  UR_KJT_TRY(ur__cuda_kjt_gather_i64(s, off_out, nullptr, step, nat, d_at), "key spans");
  UR_KJT_TRY(cudaMemcpyAsync(at_out, d_at, (size_t)nat * 8, cudaMemcpyDeviceToHost, s),
             "key spans down");
  UR_KJT_TRY(cudaStreamSynchronize(s), "wait");
  return cudaSuccess;
}

static ur_status ur_cuda_kjt_bag_lengths(void *stream, const int32_t *len, const int64_t *map,
                                         int64_t n, int32_t *len_out, int64_t *off_out,
                                         int64_t step, int32_t nat, int64_t *at_out) {
  const char *what = "";
  cudaError_t e = ur_kjt_bag_lengths_run((cudaStream_t)stream, len, map, n, len_out, off_out, step,
                                         nat, at_out, &what);
  return ur_kjt_status(e, "bag lengths", what);
}

static ur_status ur_cuda_kjt_bag_copy(void *stream, const int64_t *off, const int64_t *val,
                                      const float *w, const int64_t *map, int64_t n,
                                      const int64_t *off_out, int64_t *val_out, float *w_out) {
  cudaError_t e =
      ur__cuda_kjt_bag_copy((cudaStream_t)stream, off, val, w, map, n, off_out, val_out, w_out);
  return ur_kjt_status(e, "bag copy", "copy");
}

static cudaError_t ur_kjt_expand_rows_run(cudaStream_t s, const void *src, size_t row_bytes,
                                          const int64_t *inv, const int64_t *bag0, int32_t nkeys,
                                          int64_t stride, void *dst, const char **what) {
  int64_t n = (int64_t)nkeys * stride;
  if (n <= 0 || row_bytes == 0) return cudaSuccess;
  ur_kjt_scratch w(s);
  size_t n1 = (size_t)nkeys + 1;
  UR_KJT_TRY(w.alloc(w.up(n1 * 8) + w.up((size_t)n * 8)), "scratch");
  int64_t *d_bag0 = w.take<int64_t>(n1), *map = w.take<int64_t>((size_t)n);
  UR_KJT_TRY(cudaMemcpyAsync(d_bag0, bag0, n1 * 8, cudaMemcpyHostToDevice, s), "key spans up");
  UR_KJT_TRY(ur__cuda_kjt_expand_map(s, inv, d_bag0, nkeys, stride, map), "map");
  UR_KJT_TRY(ur__cuda_kjt_gather_rows(s, src, row_bytes, map, n, dst), "gather");
  return cudaSuccess;
}

static ur_status ur_cuda_kjt_expand_rows(void *stream, const void *src, size_t row_bytes,
                                         const int64_t *inv, const int64_t *bag0, int32_t nkeys,
                                         int64_t stride, void *dst) {
  const char *what = "";
  cudaError_t e = ur_kjt_expand_rows_run((cudaStream_t)stream, src, row_bytes, inv, bag0, nkeys,
                                         stride, dst, &what);
  return ur_kjt_status(e, "expand rows", what);
}

/* ---- dedup ---- */

struct ur_kjt_max {
  __host__ __device__ int64_t operator()(int64_t a, int64_t b) const { return a > b ? a : b; }
};

static cudaError_t ur_kjt_dedup_run(cudaStream_t s, const int64_t *off, const int64_t *val,
                                    const float *wt, const int32_t *len, int32_t nkeys,
                                    int64_t stride, int64_t *map, int64_t *inv, int64_t *spk,
                                    int64_t *val0, const char **what) {
  int64_t nb = (int64_t)nkeys * stride;
  size_t n1 = (size_t)nkeys + 1;
  if (nb <= 0) {
    memset(spk, 0, (size_t)nkeys * 8);
    memset(val0, 0, n1 * 8);
    return cudaSuccess;
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
  UR_KJT_TRY(w.alloc(w.up(cub_bytes) + 6 * w.up(nbz * 8) + 2 * w.up((nbz + 1) * 8) +
                     w.up(2 * n1 * 8)),
             "scratch");
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
  if (!h) {
    *what = "host memory";
    return cudaErrorMemoryAllocation;
  }
  cudaError_t e = cudaMemcpyAsync(h, at, 2 * n1 * 8, cudaMemcpyDeviceToHost, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  if (e == cudaSuccess) {
    for (int32_t k = 0; k < nkeys; k++) spk[k] = h[k + 1] - h[k];
    memcpy(val0, h + n1, n1 * 8);
  }
  free(h);
  UR_KJT_TRY(e, "counts down");
  return cudaSuccess;
}

static ur_status ur_cuda_kjt_dedup(void *stream, const int64_t *off, const int64_t *val,
                                   const float *w, const int32_t *len, int32_t nkeys,
                                   int64_t stride, int64_t *map, int64_t *inv, int64_t *spk,
                                   int64_t *val0) {
  const char *what = "";
  cudaError_t e = ur_kjt_dedup_run((cudaStream_t)stream, off, val, w, len, nkeys, stride, map, inv,
                                   spk, val0, &what);
  return ur_kjt_status(e, "dedup", what);
}

void ur__cuda_kjt_install(ur_backend *b, const ur_core_api *core) {
  g_kjt_core = core;
  b->kjt_offsets = ur_cuda_kjt_offsets;
  b->kjt_validate = ur_cuda_kjt_validate;
  b->kjt_segments = ur_cuda_kjt_segments;
  b->kjt_expand_map = ur_cuda_kjt_expand_map;
  b->kjt_bag_lengths = ur_cuda_kjt_bag_lengths;
  b->kjt_bag_copy = ur_cuda_kjt_bag_copy;
  b->kjt_expand_rows = ur_cuda_kjt_expand_rows;
  b->kjt_dedup = ur_cuda_kjt_dedup;
}
