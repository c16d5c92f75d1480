/* link_interference.cu: what moving rows over the host link costs the products computed beside
 * it.  B4's early copies and write-behind (docs/uvm.md, "Early copies") move a step's far rows
 * between host memory and HBM on a few SMs while the step's dense layers run, and the dense
 * layers slow by more than those SMs' share.  This times a bf16 product pair shaped like the top
 * MLP's backward (65536 x 1024 x 1024: an input and a weight gradient), alone and beside a
 * kernel or copy that runs through the whole pair:
 *
 *   - spin: blocks that hold their SMs and touch no memory (the SMs alone);
 *   - rows read or written, 512 bytes each at random over a range (GiB, the first argument: 6 by
 *     default, about a large table's host part), as far_move_kernel moves them: 8 warps a block,
 *     8 rows in flight a warp, 8 bytes a lane; from HBM, pinned host memory, or managed memory
 *     kept on the host (preferred location the CPU, accessed by the GPU), over the whole range or
 *     64 MiB of it (few pages: the GPU's page translations stay cached);
 *   - the same rows moved by bulk copies (cp.async.bulk, sm_90 on): a lane a row through shared
 *     memory, 4 warps a block, 3 rounds of 32 rows in flight a warp;
 *   - copy engines: 32 MiB contiguous copies between pinned host memory and HBM, one way or both;
 *   - the products told to use fewer SMs (cublasSetSmCountTarget) beside spinning blocks.
 *
 * Each interferer is first run alone for its rate, then started before the products and sized to
 * outlast them ("covered": it did).  The bulk reads are checked against the host's bytes first
 * (one round of one block; the other moves are not checked).  The products run on zeros: they
 * draw less power than on real data, and every case runs them so.
 *
 *   make dist (dist/bin/link_interference where CUDA is built), or
 *   nvcc -O3 -arch=sm_90 -o link_interference scripts/bench/link_interference.cu -lcublas
 *   ./link_interference [GiB] */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "bench_cuda.h"

#define CB(x)                                                                          \
  do {                                                                                 \
    cublasStatus_t s_ = (x);                                                           \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                 \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cublasGetStatusString(s_)); \
      exit(1);                                                                         \
    }                                                                                  \
  } while (0)

enum { ROW = 512, RING = 65536 }; /* row bytes; rows of the HBM ring the moves go to or from */
enum { SPIN, READ, WRITE, BULK_READ, BULK_WRITE, DMA_H2D, DMA_D2H, DMA_BOTH, ALONE };
enum { BULK_WARPS = 4, BULK_STAGES = 3 };
enum { ROWS_WARPS = 8, ROWS_IN_FLIGHT = 8 }; /* rows_kernel's, as far_move_kernel's in kernels/tbe.cu */

/* The row a warp's k-th move of round j takes (the same on the host, for the check). */
static __host__ __device__ inline uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}
static __host__ __device__ inline int64_t row_of(int64_t warp, int64_t j, int k, int per, int64_t rows) {
  return (int64_t)(mix((uint64_t)warp * 0x9E3779B97F4A7C15ULL + (uint64_t)(j * per + k)) % (uint64_t)rows);
}

/* SPIN, READ (rows -> ring) or WRITE (ring -> rows) for `rounds` rounds, as far_move_kernel. */
__global__ void __launch_bounds__(ROWS_WARPS * 32)
    rows_kernel(char *rows, char *ring, int64_t nrows, int64_t rounds, int mode, unsigned long long *sink) {
  const int R = ROWS_IN_FLIGHT;
  int lane = threadIdx.x & 31;
  int64_t warp = (int64_t)blockIdx.x * ROWS_WARPS + threadIdx.x / 32;
  unsigned long long acc = 0;
  for (int64_t j = 0; j < rounds; j++) {
    if (mode == SPIN) {
      for (int k = 0; k < 64; k++) acc = acc * 6364136223846793005ULL + 1442695040888963407ULL + k;
      continue;
    }
    const char *from[R];
    char *to[R];
#pragma unroll
    for (int k = 0; k < R; k++) {
      char *r = rows + row_of(warp, j, k, R, nrows) * ROW, *g = ring + ((warp * R + k) % RING) * ROW;
      from[k] = mode == READ ? r : g;
      to[k] = mode == READ ? g : r;
    }
    for (int o = lane * 8; o < ROW; o += 32 * 8) {
      uint2 v[R];
#pragma unroll
      for (int k = 0; k < R; k++) v[k] = *reinterpret_cast<const uint2 *>(from[k] + o);
#pragma unroll
      for (int k = 0; k < R; k++) *reinterpret_cast<uint2 *>(to[k] + o) = v[k];
    }
  }
  if (acc == 42) *sink = acc; /* keeps the spin */
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
static __device__ inline unsigned smem_at(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }

/* BULK_READ or BULK_WRITE for `rounds` rounds: lane l of a warp moves row (warp, j, l) of round
 * j through its slot of the round's stage; a stage's loads complete on its mbarrier. */
__global__ void __launch_bounds__(BULK_WARPS * 32) bulk_kernel(char *rows, char *ring, int64_t nrows, int64_t rounds,
                                                               int write) {
  extern __shared__ __align__(128) char slots[];
  __shared__ uint64_t bars[BULK_WARPS][BULK_STAGES];
  int lane = threadIdx.x & 31, w = threadIdx.x / 32;
  int64_t warp = (int64_t)blockIdx.x * BULK_WARPS + w;
  char *mine = slots + (size_t)w * BULK_STAGES * 32 * ROW;
  if (lane == 0)
    for (int k = 0; k < BULK_STAGES; k++)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 32;" ::"r"(smem_at(&bars[w][k])) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  __syncwarp();
  auto ends = [&](int64_t j, const char **from, char **to) {
    char *r = rows + row_of(warp, j, lane, 32, nrows) * ROW, *g = ring + ((warp * 32 + lane) % RING) * ROW;
    *from = write ? g : r;
    *to = write ? r : g;
  };
  auto load = [&](int64_t j) {
    const char *from;
    char *to;
    ends(j, &from, &to);
    unsigned bar = smem_at(&bars[w][j % BULK_STAGES]);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"((int)ROW) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(smem_at(mine + ((j % BULK_STAGES) * 32 + lane) * ROW)), "l"(from), "r"((int)ROW), "r"(bar)
                 : "memory");
  };
  for (int64_t j = 0; j < BULK_STAGES && j < rounds; j++) load(j);
  for (int64_t j = 0; j < rounds; j++) {
    int k = (int)(j % BULK_STAGES);
    unsigned done = 0;
    while (!done)
      asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                   " selp.u32 %0, 1, 0, p;\n}"
                   : "=r"(done)
                   : "r"(smem_at(&bars[w][k])), "r"((int)((j / BULK_STAGES) & 1))
                   : "memory");
    const char *from;
    char *to;
    ends(j, &from, &to);
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(to),
                 "r"(smem_at(mine + (k * 32 + lane) * ROW)), "r"((int)ROW) : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    /* the slot is read out before the next load into it */
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
    if (j + BULK_STAGES < rounds) load(j + BULK_STAGES);
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}
#else
__global__ void bulk_kernel(char *, char *, int64_t, int64_t, int) {}
#endif

struct Case {
  const char *what;
  int mode, blocks;
  char *rows;
  int64_t nrows;
  int sm_target; /* the products' SM count target, 0: all */
};

struct Bench {
  cublasHandle_t blas;
  cudaStream_t sg, si, si2; /* the products'; the interferer's (highest priority), its second way */
  __nv_bfloat16 *x, *w, *y;
  char *ring, *hbm, *pinned;
  unsigned long long *sink;
  cudaEvent_t p0, p1, i0, i1, other; /* other: the second way's copies done */
  size_t bulk_smem;

  /* input and weight gradients of a 65536 x 1024 x 1024 layer, column-major as cuBLAS sees them */
  void pair() {
    const int M = 65536, N = 1024, K = 1024;
    float one = 1.f, zero = 0.f;
    CB(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &one, w, CUDA_R_16BF, N, x, CUDA_R_16BF, K, &zero, y,
                    CUDA_R_16BF, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    CB(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_T, N, K, M, &one, y, CUDA_R_16BF, N, x, CUDA_R_16BF, K, &zero, w,
                    CUDA_R_16BF, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  /* ms a pair, over 20 */
  float pairs() {
    CK(cudaEventRecord(p0, sg));
    for (int r = 0; r < 20; r++) pair();
    CK(cudaEventRecord(p1, sg));
    CK(cudaEventSynchronize(p1));
    float ms;
    CK(cudaEventElapsedTime(&ms, p0, p1));
    return ms / 20;
  }
  /* the interferer's rounds (or 32 MiB copies) on si; returns the bytes each moves */
  double launch(const Case &c, int64_t rounds) {
    const size_t chunk = 32u << 20;
    switch (c.mode) {
      case SPIN: case READ: case WRITE:
        rows_kernel<<<c.blocks, ROWS_WARPS * 32, 0, si>>>(c.rows, ring, c.nrows, rounds, c.mode, sink);
        CK(cudaGetLastError());
        return (double)c.blocks * ROWS_WARPS * ROWS_IN_FLIGHT * ROW;
      case BULK_READ: case BULK_WRITE:
        bulk_kernel<<<c.blocks, BULK_WARPS * 32, bulk_smem, si>>>(c.rows, ring, c.nrows, rounds, c.mode == BULK_WRITE);
        CK(cudaGetLastError());
        return (double)c.blocks * BULK_WARPS * 32 * ROW;
      default:
        for (int64_t j = 0; j < rounds; j++) {
          if (c.mode != DMA_D2H) CK(cudaMemcpyAsync(ring, pinned, chunk, cudaMemcpyHostToDevice, si));
          if (c.mode != DMA_H2D) CK(cudaMemcpyAsync(pinned + chunk, hbm, chunk, cudaMemcpyDeviceToHost,
                                                    c.mode == DMA_BOTH ? si2 : si));
        }
        if (c.mode == DMA_BOTH) { /* si's end event waits for both ways */
          CK(cudaEventRecord(other, si2));
          CK(cudaStreamWaitEvent(si, other, 0));
        }
        return (double)chunk * (c.mode == DMA_BOTH ? 2 : 1);
    }
  }
};

int main(int argc, char **argv) {
  double gib = argc > 1 ? atof(argv[1]) : 6.0;
  if (!(gib >= 0.125) || argc > 2) {
    /* the 64 MiB range and the copy engines' two 32 MiB copies lie inside the rows */
    fprintf(stderr, "link_interference: %s: expected one argument, the GiB of rows to move at random (at least "
            "0.125; 6 by default)\n", argc > 2 ? "too many arguments" : argc > 1 ? argv[1] : "?");
    return 2;
  }
  int64_t range = (int64_t)(gib * (1 << 30)) / ROW * ROW;
  int dev = 0, sms = 0, major = 0, lo = 0, hi = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  Bench b;
  CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  CK(cudaStreamCreateWithPriority(&b.sg, cudaStreamNonBlocking, lo));
  CK(cudaStreamCreateWithPriority(&b.si, cudaStreamNonBlocking, hi));
  CK(cudaStreamCreateWithPriority(&b.si2, cudaStreamNonBlocking, hi));
  CB(cublasCreate(&b.blas));
  CB(cublasSetStream(b.blas, b.sg));
  CK(cudaMalloc(&b.x, (size_t)65536 * 1024 * 2));
  CK(cudaMalloc(&b.w, (size_t)1024 * 1024 * 2));
  CK(cudaMalloc(&b.y, (size_t)65536 * 1024 * 2));
  CK(cudaMemset(b.x, 0, (size_t)65536 * 1024 * 2));
  CK(cudaMemset(b.w, 0, (size_t)1024 * 1024 * 2));
  CK(cudaMalloc(&b.ring, (size_t)RING * ROW));
  CK(cudaMalloc(&b.sink, 8));
  CK(cudaEventCreate(&b.p0));
  CK(cudaEventCreate(&b.p1));
  CK(cudaEventCreate(&b.i0));
  CK(cudaEventCreate(&b.i1));
  CK(cudaEventCreate(&b.other));
  char *hbm, *pinned, *pinned_dev, *managed;
  CK(cudaMalloc(&hbm, range));
  CK(cudaMemset(hbm, 1, range));
  b.hbm = hbm;
  CK(cudaHostAlloc(&pinned, range, cudaHostAllocMapped));
  memset(pinned, 1, range);
  CK(cudaHostGetDevicePointer((void **)&pinned_dev, pinned, 0));
  b.pinned = pinned;
  CK(cudaMallocManaged(&managed, range));
  cudaMemLocation cpu = {cudaMemLocationTypeHost, 0}, gpu = {cudaMemLocationTypeDevice, dev};
  CK(cudaMemAdvise(managed, range, cudaMemAdviseSetPreferredLocation, cpu));
  CK(cudaMemAdvise(managed, range, cudaMemAdviseSetAccessedBy, gpu));
  memset(managed, 1, range);
  b.bulk_smem = (size_t)BULK_WARPS * BULK_STAGES * 32 * ROW;
  bool bulk = major >= 9;
  if (bulk) {
    CK(cudaFuncSetAttribute(bulk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)b.bulk_smem));
    /* one round of one block from 2048 distinct host rows: each lane's row where it belongs */
    std::vector<char> h((size_t)2048 * ROW), out((size_t)BULK_WARPS * 32 * ROW);
    for (size_t i = 0; i < h.size(); i++) h[i] = (char)(i * 7 + i / ROW);
    memcpy(managed, h.data(), h.size());
    CK(cudaMemset(b.ring, 0, out.size()));
    bulk_kernel<<<1, BULK_WARPS * 32, b.bulk_smem>>>(managed, b.ring, 2048, 1, 0);
    CK(cudaGetLastError());
    CK(cudaMemcpy(out.data(), b.ring, out.size(), cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int w = 0; w < BULK_WARPS; w++)
      for (int l = 0; l < 32; l++)
        bad += memcmp(out.data() + (size_t)(w * 32 + l) * ROW, h.data() + row_of(w, 0, l, 32, 2048) * ROW, ROW) != 0;
    if (bad) {
      fprintf(stderr, "link_interference: the bulk copies put %d of %d rows wrong\n", bad, BULK_WARPS * 32);
      return 1;
    }
    memset(managed, 1, h.size());
  }
  int64_t all = range / ROW, few = (64 << 20) / ROW;
  int per16 = sms / 16 + 1; /* far_move_kernel's grid (kernels/tbe.cu, far_move_blocks) */
  std::vector<Case> cases = {
      {"none", ALONE, 0, nullptr, 0, 0},
      {"spin", SPIN, 1, nullptr, 1, 0},
      {"spin", SPIN, per16, nullptr, 1, 0},
      {"spin", SPIN, 2 * per16, nullptr, 1, 0},
      {"none, products on fewer SMs", ALONE, 0, nullptr, 0, sms - per16},
      {"spin, products on fewer SMs", SPIN, per16, nullptr, 1, sms - per16},
      {"read HBM rows", READ, per16, hbm, all, 0},
      {"read pinned host rows", READ, per16, pinned_dev, all, 0},
      {"read pinned host rows, 64 MiB", READ, per16, pinned_dev, few, 0},
      {"read managed host rows, 64 MiB", READ, per16, managed, few, 0},
      {"write pinned host rows", WRITE, per16, pinned_dev, all, 0},
  };
  for (int n : {1, 2, 4, per16}) {
    cases.push_back({"read managed host rows", READ, n, managed, all, 0});
    cases.push_back({"write managed host rows", WRITE, n, managed, all, 0});
    if (bulk) {
      cases.push_back({"bulk-read managed host rows", BULK_READ, n, managed, all, 0});
      cases.push_back({"bulk-write managed host rows", BULK_WRITE, n, managed, all, 0});
    }
  }
  cases.push_back({"copy engine, host to HBM", DMA_H2D, 0, nullptr, 0, 0});
  cases.push_back({"copy engine, HBM to host", DMA_D2H, 0, nullptr, 0, 0});
  cases.push_back({"copy engines, both ways", DMA_BOTH, 0, nullptr, 0, 0});
  cases.push_back({"none", ALONE, 0, nullptr, 0, 0});

  printf("link_interference: %s, %d SMs; products: bf16 65536 x 1024 x 1024 pairs; rows of %d bytes over %.1f "
         "GiB%s\n", prop.name, sms, ROW, range / (double)(1 << 30), bulk ? "" : " (no bulk copies before sm_90)");
  printf("| interferer | blocks | products' SMs | pair (ms) | x alone | interferer alone (GB/s) | GB/s a block "
         "| covered |\n");
  printf("| --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (int r = 0; r < 3; r++) b.pair();
  float alone = 0;
  for (const Case &c : cases) {
    CK(cudaDeviceSynchronize());
    CB(cublasSetSmCountTarget(b.blas, c.sm_target));
    for (int r = 0; r < 3; r++) b.pair(); /* a new target's first products pick their kernels */
    CK(cudaStreamSynchronize(b.sg));
    char smtext[16];
    snprintf(smtext, sizeof smtext, "%d", c.sm_target ? c.sm_target : sms);
    if (c.mode == ALONE) {
      float ms = b.pairs();
      if (alone == 0) alone = ms;
      printf("| %s | - | %s | %.4f | %.3f | - | - | - |\n", c.what, smtext, ms, ms / alone);
      continue;
    }
    /* alone: its rate, and how many rounds outlast 20 pairs eight times over */
    int64_t probe = c.mode == SPIN ? 50000 : c.mode >= DMA_H2D ? 4 : 400;
    CK(cudaEventRecord(b.i0, b.si));
    double bytes = b.launch(c, probe);
    CK(cudaEventRecord(b.i1, b.si));
    CK(cudaEventSynchronize(b.i1));
    float pms;
    CK(cudaEventElapsedTime(&pms, b.i0, b.i1));
    double gbs = c.mode == SPIN ? 0 : bytes * probe / (pms * 1e-3) / 1e9;
    int64_t rounds = (int64_t)(probe * (8.0 * alone * 20) / pms) + 1;
    CK(cudaEventRecord(b.i0, b.si));
    b.launch(c, rounds);
    CK(cudaEventRecord(b.i1, b.si));
    CK(cudaStreamWaitEvent(b.sg, b.i0, 0)); /* the products start once it has */
    float ms = b.pairs();
    CK(cudaEventSynchronize(b.i1));
    float tail;
    CK(cudaEventElapsedTime(&tail, b.p1, b.i1));
    char blocks[16] = "-", per[16] = "-", rate[16] = "-";
    if (c.blocks) snprintf(blocks, sizeof blocks, "%d", c.blocks);
    if (c.mode != SPIN) snprintf(rate, sizeof rate, "%.1f", gbs);
    if (c.mode != SPIN && c.blocks) snprintf(per, sizeof per, "%.2f", gbs / c.blocks);
    printf("| %s | %s | %s | %.4f | %.3f | %s | %s | %s |\n", c.what, blocks, smtext, ms, ms / alone, rate, per,
           tail > 0 ? "yes" : "NO");
  }
  CK(cudaDeviceSynchronize());
  return 0;
}
