/* bench_cuda.h: what the standalone CUDA benchmark programs of scripts/bench (lt_epilogues.cu,
 * link_interference.cu) share: CK(call), which ends the program with the file, line, call and
 * the runtime's message when a CUDA runtime call fails. */
#ifndef UVMREC_BENCH_CUDA_H
#define UVMREC_BENCH_CUDA_H
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x)                                                                             \
  do {                                                                                    \
    cudaError_t e_ = (x);                                                                 \
    if (e_ != cudaSuccess) {                                                              \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                            \
    }                                                                                     \
  } while (0)

#endif
