/* optim.cu: the dense optimizers (engine/src/dense/optim.c) on the GPU, as one launch over up
 * to UR__OPTIM_GROUP tensors (the pointers travel in the kernel's parameters, read in place as
 * __grid_constant__).  Block b finds its tensor among the tensors' first blocks and updates
 * one chunk of it with the CPU's element step (core/optim_plan.h) and constants.  Gradient
 * clipping's norm: UR_OPTIM_CLIP_PARTS blocks, each summing the squares of a fixed stride of
 * every tensor in f64 into its partial (the same order every run), then one thread forms the
 * norm and the factor (ur__optim_clip_factor), which the update reads: no wait, capturable. */
#include "common.cuh"
#include "dense.cuh"
#include "dense/dense.h"

#define UR_OPTIM_CHUNK 4096
#define UR_OPTIM_THREADS 256

struct ur_optim_pack {
  float *p[UR__OPTIM_GROUP], *g[UR__OPTIM_GROUP];
  float *s1[UR__OPTIM_GROUP], *s2[UR__OPTIM_GROUP];
  ur_bf16 *h[UR__OPTIM_GROUP];
  int64_t n[UR__OPTIM_GROUP];
  int64_t first[UR__OPTIM_GROUP + 1]; /* first block of each tensor; first[count] = all */
  int count;
};

__global__ void __launch_bounds__(UR_OPTIM_THREADS)
ur_optim_kernel(const __grid_constant__ ur__optim_consts k0,
                const __grid_constant__ ur_optim_pack pk) {
  const ur__optim_consts k = ur__optim_now(&k0); /* Adam's true update number under a guard */
  int64_t b = blockIdx.x;
  int t = 0;
  while (t + 1 < pk.count && pk.first[t + 1] <= b) t++;
  int64_t i0 = (b - pk.first[t]) * UR_OPTIM_CHUNK;
  int64_t i1 = i0 + UR_OPTIM_CHUNK < pk.n[t] ? i0 + UR_OPTIM_CHUNK : pk.n[t];
  float *P = pk.p[t], *Gr = pk.g[t], *S1 = pk.s1[t], *S2 = pk.s2[t];
  ur_bf16 *H = pk.h[t];
  if (ur__optim_gated(&k)) { /* held back: the gradient is spent all the same */
    if (k.zero_grad)
      for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) Gr[i] = 0.0f;
    return;
  }
  float clip = k.clip ? (float)*k.clip : 1.0f;
  for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
    float g = Gr[i];
    if (k.clip) {
      g = __fmul_rn(g, clip);
      if (!k.zero_grad) Gr[i] = g;
    }
    float p = ur__optim_dense_elem(&k, P[i], g, S1 ? S1 + i : nullptr, S2 ? S2 + i : nullptr);
    P[i] = p;
    if (H) H[i] = __float2bfloat16_rn(p);
    if (k.zero_grad) Gr[i] = 0.0f;
  }
}

static cudaError_t ur_optim_launch(cudaStream_t stream, const ur__optim_consts *k, int n,
                                  float *const *params, float *const *grads, float *const *s1,
                                  float *const *s2, void *const *halves, const int64_t *numel) {
  if (n < 1 || n > UR__OPTIM_GROUP) return cudaErrorInvalidValue;
  ur_optim_pack pk;
  int64_t blocks = 0;
  for (int t = 0; t < n; t++) {
    pk.p[t] = params[t];
    pk.g[t] = grads[t];
    pk.s1[t] = s1[t];
    pk.s2[t] = s2[t];
    pk.h[t] = (ur_bf16 *)halves[t];
    pk.n[t] = numel[t];
    pk.first[t] = blocks;
    blocks += (numel[t] + UR_OPTIM_CHUNK - 1) / UR_OPTIM_CHUNK;
  }
  pk.first[n] = blocks;
  pk.count = n;
  if (blocks == 0) return cudaSuccess;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  ur_optim_kernel<<<(unsigned)blocks, UR_OPTIM_THREADS, 0, stream>>>(*k, pk);
  return cudaGetLastError();
}

ur_status ur__cuda_optim_step(void *stream, const ur__optim_consts *k, int32_t n,
                              float *const *params, float *const *grads, float *const *s1,
                              float *const *s2, void *const *halves, const int64_t *numel) {
  for (int32_t i = 0; i < n; i += UR__OPTIM_GROUP) {
    int m = n - i < UR__OPTIM_GROUP ? (int)(n - i) : UR__OPTIM_GROUP;
    UR_CUDA_CHECK(ur_optim_launch((cudaStream_t)stream, k, m, params + i, grads + i, s1 + i,
                                  s2 + i, halves + i, numel + i),
                  "optimizer kernel (%d tensors)", m);
  }
  return UR_STATUS_OK;
}

/* Block b adds the squares of elements b * threads + t, stepping by the whole grid, of every
 * tensor, then the block's sum (a tree in shared memory) into partial b. */
__global__ void __launch_bounds__(UR_OPTIM_THREADS)
ur_optim_sumsq_kernel(const __grid_constant__ ur_optim_pack pk, double *work, int first) {
  __shared__ double part[UR_OPTIM_THREADS];
  double acc = 0.0;
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int t = 0; t < pk.count; t++) {
    const float *G = pk.g[t];
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < pk.n[t]; i += stride) {
      double g = (double)G[i];
      acc = __dadd_rn(acc, __dmul_rn(g, g));
    }
  }
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int w = UR_OPTIM_THREADS / 2; w > 0; w /= 2) {
    if ((int)threadIdx.x < w) part[threadIdx.x] = __dadd_rn(part[threadIdx.x], part[threadIdx.x + w]);
    __syncthreads();
  }
  if (threadIdx.x == 0) work[2 + blockIdx.x] = first ? part[0] : __dadd_rn(work[2 + blockIdx.x], part[0]);
}

__global__ void ur_optim_clip_factor_kernel(double *work, double clip) {
  if (threadIdx.x == 0 && blockIdx.x == 0) ur__optim_clip_factor(work, clip);
}

ur_status ur__cuda_optim_sumsq(void *stream, int32_t n, float *const *grads, const int64_t *numel,
                               double *work, int32_t first) {
  for (int32_t i = 0; i < n || (i == 0 && first); i += UR__OPTIM_GROUP) {
    int m = n - i < UR__OPTIM_GROUP ? (int)(n - i) : UR__OPTIM_GROUP;
    ur_optim_pack pk;
    memset(&pk, 0, sizeof pk);
    for (int t = 0; t < m; t++) {
      pk.g[t] = grads[i + t];
      pk.n[t] = numel[i + t];
    }
    pk.count = m;
    ur_optim_sumsq_kernel<<<UR_OPTIM_CLIP_PARTS, UR_OPTIM_THREADS, 0, (cudaStream_t)stream>>>(
        pk, work, first && i == 0);
    UR_CUDA_CHECK(cudaGetLastError(), "gradient norm kernel (%d tensors)", m);
  }
  return UR_STATUS_OK;
}

ur_status ur__cuda_optim_clip_factor(void *stream, double *work, double clip_norm) {
  ur_optim_clip_factor_kernel<<<1, 32, 0, (cudaStream_t)stream>>>(work, clip_norm);
  UR_CUDA_CHECK(cudaGetLastError(), "gradient clipping factor kernel");
  return UR_STATUS_OK;
}
