/* bags.cuh: what the embedding collections' kernels (tbe.cu, qtbe.cu) share about the bags
 * they read: a bag's span of values and the record of an id out of range. */
#ifndef UR_KERNELS_BAGS_CUH
#define UR_KERNELS_BAGS_CUH

#include <stdint.h>

/* Bag `bag`'s values [s, e) from offsets, clamped to [0, n]: offsets are trusted on the GPU
 * (the CPU checks them), but never followed outside the values. */
__device__ __forceinline__ void ur_bag_span(const int64_t *offsets, int64_t n, int64_t bag,
                                            int64_t &s, int64_t &e) {
  int64_t x = offsets[bag], y = offsets[bag + 1];
  x = x < 0 ? 0 : x > n ? n : x;
  y = y < x ? x : y > n ? n : y;
  s = x;
  e = y;
}

/* An id out of its table's range at value i: flags[0] keeps the first such value, flags[1]
 * counts them (the bounds check's record, read back after the call). */
__device__ __forceinline__ void ur_note_bad(int64_t *flags, int64_t i) {
  atomicMin(reinterpret_cast<unsigned long long *>(flags), (unsigned long long)i);
  atomicAdd(reinterpret_cast<unsigned long long *>(flags + 1), 1ull);
}

#endif
