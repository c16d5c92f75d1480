/* qtbe.cu: the quantized embedding collection's forward on the GPU and the CUDA backend's qtbe
 * table.  A group of G lanes (a power of two, up to a warp, from the widest table: a lane per 4
 * elements) takes a bag; each lane keeps the sums of its NC 4-element chunks and walks the bag's
 * values in order, dequantizing with qtbe_plan.h's arithmetic, so every output element is the
 * CPU reference's (engine/src/embedding/qtbe_cpu.c) bit for bit.  Pooling none writes each
 * value's row instead of a sum. */
#include <cuda_runtime.h>
#include <stdint.h>

#include "common.cuh"
#include "embedding/qtbe.h"

#define UR_QTBE_THREADS 256

namespace {

__device__ __forceinline__ void store4(const ur__qtbe_args &a, int64_t at, const float v[4]) {
  if (a.out_dtype == UR_DTYPE_F32) {
    float *o = (float *)a.out + at;
    for (int k = 0; k < 4; k++) o[k] = v[k];
  } else {
    uint16_t *o = (uint16_t *)a.out + at;
    for (int k = 0; k < 4; k++) o[k] = ur__f32_to_bf16(v[k]);
  }
}

/* The stored row of value i, or NULL (noted once by the group's first lane) when it maps
 * outside its table. */
__device__ __forceinline__ const uint8_t *row_of(const ur__qtbe_args &a, const ur__qtbe_table &tb,
                                                 int64_t i, int lane) {
  int64_t r = ur__qtbe_map(&tb, a.values[i]);
  if (r < 0) {
    if (lane == 0 && a.bounds != UR_TBE_BOUNDS_OFF) ur__tbe_note_bad(a.flags, i);
    return NULL;
  }
  return tb.rows + r * tb.row_bytes;
}

template <int G, int NC>
__global__ void __launch_bounds__(UR_QTBE_THREADS) pooled_kernel(const ur__qtbe_args a) {
  const int lane = threadIdx.x % G;
  const int64_t groups = (int64_t)gridDim.x * (blockDim.x / G);
  for (int64_t bag = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / G; bag < a.bags;
       bag += groups) {
    const int32_t f = (int32_t)(bag / a.batch);
    const ur__qtbe_feature ft = a.features[f];
    const ur__qtbe_table tb = a.tables[ft.table];
    const int32_t d4 = tb.dim / 4;
    float acc[NC][4];
#pragma unroll
    for (int k = 0; k < NC; k++)
      for (int j = 0; j < 4; j++) acc[k][j] = 0.0f;
    int64_t s, e;
    ur__tbe_bag_span(a.offsets, a.n, bag, &s, &e);
    for (int64_t i = s; i < e; i++) {
      const uint8_t *row = row_of(a, tb, i, lane);
      if (!row) continue;
      const float w = a.weights ? a.weights[i] : 1.0f;
#pragma unroll
      for (int k = 0; k < NC; k++) {
        const int c4 = lane + k * G;
        if (c4 < d4) {
          float v[4];
          ur__qtbe_load4(row, tb.format, c4, v);
          for (int j = 0; j < 4; j++) acc[k][j] = UR_FADD(acc[k][j], UR_FMUL(w, v[j]));
        }
      }
    }
    if (tb.pooling == UR_POOLING_MEAN && e > s) {
      const float inv = UR_FDIV(1.0f, (float)(e - s));
#pragma unroll
      for (int k = 0; k < NC; k++)
        for (int j = 0; j < 4; j++) acc[k][j] = UR_FMUL(acc[k][j], inv);
    }
    const int64_t at = (bag - (int64_t)f * a.batch) * a.out_stride + ft.col;
#pragma unroll
    for (int k = 0; k < NC; k++) {
      const int c4 = lane + k * G;
      if (c4 < d4) store4(a, at + 4 * c4, acc[k]);
    }
  }
}

template <int G, int NC>
__global__ void __launch_bounds__(UR_QTBE_THREADS) rows_kernel(const ur__qtbe_args a) {
  const int lane = threadIdx.x % G;
  const int64_t groups = (int64_t)gridDim.x * (blockDim.x / G);
  for (int64_t bag = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / G; bag < a.bags;
       bag += groups) {
    const ur__qtbe_table tb = a.tables[a.features[bag / a.batch].table];
    const int32_t d4 = tb.dim / 4;
    int64_t s, e;
    ur__tbe_bag_span(a.offsets, a.n, bag, &s, &e);
    for (int64_t i = s; i < e; i++) {
      const uint8_t *row = row_of(a, tb, i, lane);
      const float w = a.weights ? a.weights[i] : 1.0f;
#pragma unroll
      for (int k = 0; k < NC; k++) {
        const int c4 = lane + k * G;
        if (c4 >= d4) continue;
        float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (row) {
          ur__qtbe_load4(row, tb.format, c4, v);
          for (int j = 0; j < 4; j++) v[j] = UR_FMUL(w, v[j]);
        }
        store4(a, i * a.out_stride + 4 * c4, v);
      }
    }
  }
}

template <int G, int NC>
cudaError_t launch(cudaStream_t st, const ur__qtbe_args &a, int sms) {
  int64_t want = (a.bags * G + UR_QTBE_THREADS - 1) / UR_QTBE_THREADS;
  int64_t cap = (int64_t)sms * 16;
  unsigned blocks = (unsigned)(want < cap ? want : cap);
  if (a.pooled) pooled_kernel<G, NC><<<blocks, UR_QTBE_THREADS, 0, st>>>(a);
  else rows_kernel<G, NC><<<blocks, UR_QTBE_THREADS, 0, st>>>(a);
  return cudaGetLastError();
}

/* A lane per 4 elements of the widest table, up to a warp; a warp's lanes then take NC chunks
 * each (1, 2, 4 or 8: dims up to 1024). */
cudaError_t forward_launch(cudaStream_t st, const ur__qtbe_args &a) {
  int sms = 0;
  cudaError_t e = ur__cuda_sms(&sms);
  if (e != cudaSuccess) return e;
  int d4 = a.max_dim / 4, g = 1;
  while (g < d4 && g < 32) g *= 2;
  int nc = (d4 + g - 1) / g;
  switch (g) {
  case 1: return launch<1, 1>(st, a, sms);
  case 2: return launch<2, 1>(st, a, sms);
  case 4: return launch<4, 1>(st, a, sms);
  case 8: return launch<8, 1>(st, a, sms);
  case 16: return launch<16, 1>(st, a, sms);
  default: break;
  }
  if (nc <= 1) return launch<32, 1>(st, a, sms);
  if (nc <= 2) return launch<32, 2>(st, a, sms);
  if (nc <= 4) return launch<32, 4>(st, a, sms);
  return launch<32, 8>(st, a, sms);
}

} // namespace

static ur_status qtbe_forward(void *stream, const ur__qtbe_args *a) {
  UR_CUDA_CHECK(forward_launch((cudaStream_t)stream, *a), "qtbe forward kernel (%lld bags)",
                (long long)a->bags);
  return UR_STATUS_OK;
}

const ur_qtbe_ops ur__cuda_qtbe_ops = {
    /* .forward = */ qtbe_forward,
};
