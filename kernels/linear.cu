/* linear.cu: the Linear layer's kernels besides the matrix products (cuBLASLt's): the
 * bias-and-activation epilogue for when cuBLAS runs the product, and the backward's ReLU mask
 * fused with the bias gradient, a column sum made deterministic by summing fixed chunks of
 * rows into partials and then the partials in order. */
#include "dense.cuh"

#define UR_BGRAD_COLS 32 /* columns per block: one warp across them */
#define UR_BGRAD_ROWS 8  /* warps per block, each on every 8th row of the chunk */

template <typename T>
__global__ void ur_bias_act_kernel(T *y, const T *b, int64_t rows, int64_t cols, int act) {
  int64_t n = rows * cols, stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    float v = ur_ld(y, i);
    if (b) v += ur_ld(b, i % cols);
    if (act == UR_ACT_RELU) v = v > 0.0f ? v : 0.0f;
    ur_st(y, i, v);
  }
}

cudaError_t ur__cuda_bias_act(cudaStream_t stream, void *y, const void *b, int64_t rows,
                              int64_t cols, ur_dtype dtype, int act) {
  int dev = 0, sms = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (e != cudaSuccess) return e;
  UR_DENSE_DISPATCH(dtype, T,
    ur_bias_act_kernel<T><<<ur_dense_blocks(rows * cols, 256, sms), 256, 0, stream>>>(
        (T *)y, (const T *)b, rows, cols, act));
  return cudaGetLastError();
}

int64_t ur__cuda_bgrad_chunks(int64_t rows, int64_t cols, int sms) {
  int64_t tiles = (cols + UR_BGRAD_COLS - 1) / UR_BGRAD_COLS;
  int64_t want = ((int64_t)(sms > 0 ? sms : 1) * 4 + tiles - 1) / tiles;
  int64_t most = (rows + UR_BGRAD_ROWS - 1) / UR_BGRAD_ROWS;
  if (want > most) want = most;
  if (want > 65535) want = 65535;
  return want < 1 ? 1 : want;
}

/* Block (32, 8): x walks columns (coalesced), y rows; blockIdx.y is the chunk of rows. */
template <typename T>
__global__ void ur_relu_bgrad_kernel(const T *gy, const T *y, T *g, float *partial, int64_t rows,
                                     int64_t cols, int64_t per_chunk) {
  __shared__ float acc[UR_BGRAD_ROWS][UR_BGRAD_COLS + 1];
  int64_t col = (int64_t)blockIdx.x * UR_BGRAD_COLS + threadIdx.x;
  int64_t r0 = (int64_t)blockIdx.y * per_chunk;
  int64_t r1 = r0 + per_chunk < rows ? r0 + per_chunk : rows;
  float s = 0.0f;
  if (col < cols) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += UR_BGRAD_ROWS) {
      int64_t i = r * cols + col;
      T v = gy[i];
      if (y) {
        if (!(ur_ld(y, i) > 0.0f)) v = T(0.0f);
        g[i] = v;
      }
      s += (float)v;
    }
  }
  acc[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (partial && threadIdx.y == 0 && col < cols) {
    float t = 0.0f;
    for (int k = 0; k < UR_BGRAD_ROWS; k++) t += acc[k][threadIdx.x];
    partial[(int64_t)blockIdx.y * cols + col] = t;
  }
}

__global__ void ur_bgrad_sum_kernel(const float *partial, float *gb, int64_t chunks,
                                    int64_t cols) {
  int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  float s = 0.0f;
  for (int64_t c = 0; c < chunks; c++) s += partial[c * cols + col];
  gb[col] += s;
}

cudaError_t ur__cuda_relu_bgrad(cudaStream_t stream, const void *gy, const void *y, void *g,
                                float *gb, float *partial, int64_t rows, int64_t cols,
                                ur_dtype dtype, int sms) {
  int64_t chunks = ur__cuda_bgrad_chunks(rows, cols, sms);
  int64_t per = (rows + chunks - 1) / chunks;
  dim3 grid((unsigned)((cols + UR_BGRAD_COLS - 1) / UR_BGRAD_COLS), (unsigned)chunks);
  dim3 block(UR_BGRAD_COLS, UR_BGRAD_ROWS);
  UR_DENSE_DISPATCH(dtype, T,
    ur_relu_bgrad_kernel<T><<<grid, block, 0, stream>>>((const T *)gy, (const T *)y, (T *)g,
                                                        gb ? partial : NULL, rows, cols, per));
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess || !gb) return e;
  ur_bgrad_sum_kernel<<<(unsigned)((cols + 255) / 256), 256, 0, stream>>>(partial, gb, chunks,
                                                                          cols);
  return cudaGetLastError();
}
