/* tensor.cu: whole-tensor kernels (fill, counter-based random numbers, scattered rows drawn
 * again or zeroed, timed read probe)
 * and their launch wrappers.  Grid-stride loops with 64-bit indices, since one managed
 * table can pass 100 GB. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "common.cuh"
#include "tensor.cuh"
#include "core/philox.h"
#include "core/backend.h"
#include "core/nonfinite.h"

#define UR_THREADS 256
/* Enough blocks to fill every SM several times over; beyond that a grid-stride loop does
 * the same work with less launch overhead. */
#define UR_BLOCKS_PER_SM 32

/* The probe's only store target, written only if a read sums to the caller's magic.  It has
 * external linkage so that the compiler must keep the store, and with it the loads. */
__device__ unsigned long long ur__probe_sink;

/* Blocks for `work` items of one thread each, capped at UR_BLOCKS_PER_SM per SM of the
 * current device. */
static cudaError_t ur_grid_size(size_t work, unsigned *blocks) {
  int sms = 0;
  cudaError_t e = ur__cuda_sms(&sms);
  if (e != cudaSuccess) return e;
  *blocks = ur_grid_blocks((int64_t)work, UR_THREADS, UR_BLOCKS_PER_SM, sms);
  return cudaSuccess;
}

/* ---- fill ---- */

/* The 16-byte aligned middle is written as uint4 holding the pattern repeated; head and
 * tail (fewer than 16 / sizeof(T) elements each) take scalar stores. */
template <typename T>
__global__ void ur_fill_kernel(T *dst, size_t n, T value, uint4 pattern, size_t head,
                               size_t nvec) {
  size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  size_t stride = (size_t)gridDim.x * blockDim.x;
  uint4 *body = reinterpret_cast<uint4 *>(dst + head);
  for (size_t i = tid; i < nvec; i += stride) body[i] = pattern;
  size_t tail0 = head + nvec * (16 / sizeof(T));
  /* head and tail are under 16 elements, and one block has more threads than that */
  if (tid < head) dst[tid] = value;
  if (tid < n - tail0) dst[tail0 + tid] = value;
}

template <typename T>
static cudaError_t ur_fill_launch(cudaStream_t stream, void *dst, size_t n, uint64_t value) {
  uintptr_t addr = (uintptr_t)dst;
  if (addr % sizeof(T) != 0) return cudaErrorMisalignedAddress;
  const size_t per = 16 / sizeof(T);
  size_t head = ((16 - (addr & 15)) & 15) / sizeof(T);
  if (head > n) head = n;
  size_t nvec = (n - head) / per;
  /* Replicate the element to 8 bytes, then to 16. */
  uint64_t v = value;
  for (size_t w = sizeof(T); w < 8; w *= 2) {
    v &= (w == 1) ? 0xFFull : (w == 2) ? 0xFFFFull : 0xFFFFFFFFull;
    v |= v << (8 * w);
  }
  uint4 pattern = make_uint4((unsigned)v, (unsigned)(v >> 32), (unsigned)v, (unsigned)(v >> 32));
  unsigned blocks = 0;
  cudaError_t e = ur_grid_size(nvec, &blocks);
  if (e != cudaSuccess) return e;
  ur_fill_kernel<T><<<blocks, UR_THREADS, 0, stream>>>((T *)dst, n, (T)value, pattern, head,
                                                       nvec);
  return cudaGetLastError();
}

cudaError_t ur__cuda_fill(cudaStream_t stream, void *dst, size_t n, size_t elem_bytes,
                          uint64_t value) {
  if (n == 0) return cudaSuccess;
  /* Clear an error left by an earlier, already reported call so that the launch check
   * below reports this launch only (sticky errors come back regardless). */
  (void)cudaGetLastError();
  switch (elem_bytes) {
  case 1: return ur_fill_launch<uint8_t>(stream, dst, n, value);
  case 2: return ur_fill_launch<uint16_t>(stream, dst, n, value);
  case 4: return ur_fill_launch<uint32_t>(stream, dst, n, value);
  case 8: return ur_fill_launch<unsigned long long>(stream, dst, n, value);
  default: return cudaErrorInvalidValue;
  }
}

/* ---- read ---- */

/* Whole 8-byte words where both ends allow, bytes else: one store a word over the link. */
__global__ void ur_read_kernel(unsigned char *dst, const unsigned char *src, size_t bytes) {
  if ((((uintptr_t)dst | (uintptr_t)src | bytes) & 7) == 0) {
    for (size_t i = threadIdx.x; i < bytes / 8; i += blockDim.x)
      ((unsigned long long *)dst)[i] = ((const unsigned long long *)src)[i];
  } else {
    for (size_t i = threadIdx.x; i < bytes; i += blockDim.x) dst[i] = src[i];
  }
}

cudaError_t ur__cuda_read_small(cudaStream_t stream, void *dst, const void *src, size_t bytes) {
  if (bytes == 0) return cudaSuccess;
  if (bytes > UR_CUDA_READ_SMALL) return cudaErrorInvalidValue;
  (void)cudaGetLastError(); /* see ur__cuda_fill */
  ur_read_kernel<<<1, 256, 0, stream>>>((unsigned char *)dst, (const unsigned char *)src, bytes);
  return cudaGetLastError();
}

/* ---- rand ---- */

/* The uniform branch repeats philox.h's a + (b - a) * (1 - u) with explicitly unfused
 * operations: nvcc would contract it into an fma, whose single rounding can differ from
 * the CPU's two and so break exact CPU/GPU parity (floor() for integer dtypes makes that
 * visible).  The normal branch only promises 1 ulp of float, so it calls philox.h as is. */
__device__ __forceinline__ double ur_rand_value(uint64_t counter, uint64_t seed, int normal,
                                                double a, double b) {
  if (normal) return ur_philox_value(counter, seed, 1, a, b);
  ur_philox4 r = ur_philox(counter, seed);
  double u = (double)ur_u01(r.v[0]);
  return __dadd_rn(a, __dmul_rn(b - a, 1.0 - u));
}

__device__ __forceinline__ void ur_rand_store(float *p, double v) { *p = (float)v; }
__device__ __forceinline__ void ur_rand_store(__half *p, double v) {
  *p = __float2half_rn((float)v);
}
__device__ __forceinline__ void ur_rand_store(__nv_bfloat16 *p, double v) {
  *p = __float2bfloat16_rn((float)v);
}
__device__ __forceinline__ void ur_rand_store(int8_t *p, double v) { *p = (int8_t)floor(v); }
__device__ __forceinline__ void ur_rand_store(uint8_t *p, double v) { *p = (uint8_t)floor(v); }
__device__ __forceinline__ void ur_rand_store(int32_t *p, double v) { *p = (int32_t)floor(v); }
__device__ __forceinline__ void ur_rand_store(int64_t *p, double v) { *p = (int64_t)floor(v); }
__device__ __forceinline__ void ur_rand_store(double *p, double v) { *p = v; }

template <typename T>
__global__ void ur_rand_kernel(T *dst, size_t n, uint64_t first, size_t cols, uint64_t pitch,
                               int normal, double a, double b, uint64_t seed) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    uint64_t counter = pitch == cols ? first + i : first + (i / cols) * pitch + i % cols;
    ur_rand_store(dst + i, ur_rand_value(counter, seed, normal, a, b));
  }
}

template <typename T>
static cudaError_t ur_rand_launch(cudaStream_t stream, void *dst, size_t n, uint64_t first,
                                  size_t cols, uint64_t pitch, int normal, double a, double b,
                                  uint64_t seed) {
  unsigned blocks = 0;
  cudaError_t e = ur_grid_size(n, &blocks);
  if (e != cudaSuccess) return e;
  ur_rand_kernel<T><<<blocks, UR_THREADS, 0, stream>>>((T *)dst, n, first, cols, pitch, normal, a,
                                                       b, seed);
  return cudaGetLastError();
}

cudaError_t ur__cuda_rand(cudaStream_t stream, void *dst, ur_dtype dtype, size_t n,
                          uint64_t first, size_t cols, uint64_t pitch, ur_dist dist, double a,
                          double b, uint64_t seed) {
  if (n == 0) return cudaSuccess;
  (void)cudaGetLastError(); /* see ur__cuda_fill */
  int normal = dist == UR_DIST_NORMAL;
#define UR_RAND(T) ur_rand_launch<T>(stream, dst, n, first, cols, pitch, normal, a, b, seed)
  switch (dtype) {
  case UR_DTYPE_F32: return UR_RAND(float);
  case UR_DTYPE_BF16: return UR_RAND(__nv_bfloat16);
  case UR_DTYPE_F16: return UR_RAND(__half);
  case UR_DTYPE_I8: return UR_RAND(int8_t);
  case UR_DTYPE_U8: return UR_RAND(uint8_t);
  case UR_DTYPE_I32: return UR_RAND(int32_t);
  case UR_DTYPE_I64: return UR_RAND(int64_t);
  case UR_DTYPE_F64: return UR_RAND(double);
  default: return cudaErrorInvalidValue;
  }
#undef UR_RAND
}

/* ---- rows: re-initialising and zeroing scattered rows ---- */

template <typename T>
__global__ void ur_rand_rows_kernel(T *dst, size_t row_elems, const int64_t *phys,
                                    const int64_t *ids, size_t n, double a, double b,
                                    uint64_t seed) {
  size_t total = n * row_elems, stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
    size_t j = i / row_elems, c = i % row_elems;
    ur_rand_store(dst + (size_t)phys[j] * row_elems + c,
                  ur_rand_value((size_t)ids[j] * row_elems + c, seed, 0, a, b));
  }
}

template <typename T>
static cudaError_t ur_rand_rows_launch(cudaStream_t stream, void *dst, size_t row_elems,
                                       const int64_t *phys, const int64_t *ids, size_t n,
                                       double a, double b, uint64_t seed) {
  unsigned blocks = 0;
  cudaError_t e = ur_grid_size(n * row_elems, &blocks);
  if (e != cudaSuccess) return e;
  ur_rand_rows_kernel<T><<<blocks, UR_THREADS, 0, stream>>>((T *)dst, row_elems, phys, ids, n,
                                                            a, b, seed);
  return cudaGetLastError();
}

cudaError_t ur__cuda_rand_rows(cudaStream_t stream, void *dst, ur_dtype dtype, size_t row_elems,
                               const int64_t *phys, const int64_t *ids, size_t n, double a,
                               double b, uint64_t seed) {
  if (n == 0 || row_elems == 0) return cudaSuccess;
  (void)cudaGetLastError(); /* see ur__cuda_fill */
  switch (dtype) {
  case UR_DTYPE_F32: return ur_rand_rows_launch<float>(stream, dst, row_elems, phys, ids, n, a, b, seed);
  case UR_DTYPE_BF16:
    return ur_rand_rows_launch<__nv_bfloat16>(stream, dst, row_elems, phys, ids, n, a, b, seed);
  case UR_DTYPE_F16: return ur_rand_rows_launch<__half>(stream, dst, row_elems, phys, ids, n, a, b, seed);
  default: return cudaErrorInvalidValue;
  }
}

__global__ void ur_zero_rows_kernel(uint32_t *dst, size_t row_words, const int64_t *rows, size_t n) {
  size_t total = n * row_words, stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride)
    dst[(size_t)rows[i / row_words] * row_words + i % row_words] = 0;
}

cudaError_t ur__cuda_zero_rows(cudaStream_t stream, void *dst, size_t row_bytes,
                               const int64_t *rows, size_t n) {
  if (n == 0 || row_bytes == 0) return cudaSuccess;
  if (row_bytes % 4 || (uintptr_t)dst % 4) return cudaErrorMisalignedAddress;
  (void)cudaGetLastError(); /* see ur__cuda_fill */
  unsigned blocks = 0;
  cudaError_t e = ur_grid_size(n * (row_bytes / 4), &blocks);
  if (e != cudaSuccess) return e;
  ur_zero_rows_kernel<<<blocks, UR_THREADS, 0, stream>>>((uint32_t *)dst, row_bytes / 4, rows, n);
  return cudaGetLastError();
}

/* ---- probe ---- */

/* Four independent 16-byte loads in flight per thread and iteration, so that the read
 * runs near the memory's bandwidth rather than at the latency of one load. */
__global__ void ur_probe_kernel(const uint4 *body, size_t nvec, const unsigned char *head,
                                size_t nhead, const unsigned char *tail, size_t ntail,
                                unsigned long long magic) {
  size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  size_t stride = (size_t)gridDim.x * blockDim.x;
  unsigned long long sum = 0;
  size_t i = tid;
  for (; i + 3 * stride < nvec; i += 4 * stride) {
    uint4 x0 = body[i], x1 = body[i + stride], x2 = body[i + 2 * stride];
    uint4 x3 = body[i + 3 * stride];
    sum += (unsigned long long)x0.x + x0.y + x0.z + x0.w + x1.x + x1.y + x1.z + x1.w;
    sum += (unsigned long long)x2.x + x2.y + x2.z + x2.w + x3.x + x3.y + x3.z + x3.w;
  }
  for (; i < nvec; i += stride) {
    uint4 x = body[i];
    sum += (unsigned long long)x.x + x.y + x.z + x.w;
  }
  if (tid < nhead) sum += head[tid];
  if (tid < ntail) sum += tail[tid];
  if (sum == magic) ur__probe_sink = sum;
}

cudaError_t ur__cuda_probe_prepare(void) {
  cudaFuncAttributes attr;
  return cudaFuncGetAttributes(&attr, ur_probe_kernel);
}

cudaError_t ur__cuda_probe(cudaStream_t stream, const void *src, size_t bytes, uint64_t magic) {
  if (bytes == 0) return cudaSuccess;
  (void)cudaGetLastError(); /* see ur__cuda_fill */
  const unsigned char *p = (const unsigned char *)src;
  size_t nhead = (16 - ((uintptr_t)p & 15)) & 15;
  if (nhead > bytes) nhead = bytes;
  size_t nvec = (bytes - nhead) / 16;
  size_t ntail = bytes - nhead - nvec * 16;
  unsigned blocks = 0;
  cudaError_t e = ur_grid_size(nvec, &blocks);
  if (e != cudaSuccess) return e;
  ur_probe_kernel<<<blocks, UR_THREADS, 0, stream>>>(
      (const uint4 *)(p + nhead), nvec, p, nhead, p + nhead + nvec * 16, ntail,
      (unsigned long long)magic);
  return cudaGetLastError();
}

/* ---- non-finite check (train.nonfinite's guard; core/nonfinite.c is the reference) ---- */

struct ur_nonfinite_pack {
  const void *x[UR__NONFINITE_GROUP];
  int64_t n[UR__NONFINITE_GROUP];
  int32_t dtype[UR__NONFINITE_GROUP];
  int count;
};

__device__ __forceinline__ int ur_nonfinite_at(const void *x, int32_t dtype, int64_t i) {
  switch (dtype) {
  case UR_DTYPE_F32: return ur__nonfinite_f32(((const uint32_t *)x)[i]);
  case UR_DTYPE_BF16: return ur__nonfinite_bf16(((const uint16_t *)x)[i]);
  case UR_DTYPE_F16: return ur__nonfinite_f16(((const uint16_t *)x)[i]);
  default: return ur__nonfinite_f64(((const unsigned long long *)x)[i]);
  }
}

/* blockIdx.y is the tensor; a grid-stride loop over its elements in x.  A warp that saw a bad
 * element raises the step's flag and, the first time, the tensor's (the step it is in).  Only
 * a bad element writes: a finite step costs the reads. */
__global__ void ur_nonfinite_kernel(const __grid_constant__ ur_nonfinite_pack pk, int32_t *flags,
                                    int32_t slot0) {
  int t = blockIdx.y;
  const void *x = pk.x[t];
  int64_t n = pk.n[t];
  int32_t dt = pk.dtype[t];
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  int bad = 0;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n && !bad; i += stride)
    bad = ur_nonfinite_at(x, dt, i);
  if (__any_sync(0xffffffffu, bad) && (threadIdx.x & 31) == 0) {
    atomicOr(&flags[0], 1);
    atomicCAS(&flags[UR_NONFINITE_HEAD + slot0 + t], 0, flags[1] + 1);
  }
}

cudaError_t ur__cuda_nonfinite_check(cudaStream_t stream, int n, const void *const *xs,
                                     const ur_dtype *dtypes, const int64_t *counts,
                                     int32_t *flags, int32_t slot0) {
  if (n < 1) return cudaSuccess;
  if (n > UR__NONFINITE_GROUP) return cudaErrorInvalidValue;
  (void)cudaGetLastError(); /* see ur__cuda_fill */
  ur_nonfinite_pack pk;
  int64_t most = 0;
  for (int i = 0; i < n; i++) {
    pk.x[i] = xs[i];
    pk.n[i] = counts[i];
    pk.dtype[i] = dtypes[i];
    if (counts[i] > most) most = counts[i];
  }
  pk.count = n;
  if (most == 0) return cudaSuccess;
  unsigned blocks = 0;
  cudaError_t e = ur_grid_size((size_t)most, &blocks);
  if (e != cudaSuccess) return e;
  /* the grid covers the largest tensor; divide it among the tensors so the whole check is
   * about one pass over the bytes, not n passes of the largest's grid */
  unsigned per = (unsigned)((blocks + n - 1) / n);
  dim3 grid(per > 0 ? per : 1, (unsigned)n);
  ur_nonfinite_kernel<<<grid, UR_THREADS, 0, stream>>>(pk, flags, slot0);
  return cudaGetLastError();
}

__global__ void ur_nonfinite_end_kernel(int32_t *flags, int32_t sticky) {
  flags[1] += 1;
  flags[2] += flags[0] != 0;
  if (!sticky) flags[0] = 0;
}

cudaError_t ur__cuda_nonfinite_end(cudaStream_t stream, int32_t *flags, int32_t sticky) {
  (void)cudaGetLastError(); /* see ur__cuda_fill */
  ur_nonfinite_end_kernel<<<1, 1, 0, stream>>>(flags, sticky);
  return cudaGetLastError();
}
