/* cache.cu (kernels): the software cache's row mover.  A warp per entry copies one row (and
 * its optimizer state) between host memory (pinned or managed, read and written in place over
 * the host link) and the slot storage in HBM, in 16-byte words where both ends allow it. */
#include "cache_kernels.h"

namespace {

constexpr int kWarpsPerBlock = 8;

__device__ void copy_bytes(char *dst, const char *src, int64_t bytes, int lane) {
  if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | bytes) & 15) == 0) {
    int64_t words = bytes / 16;
    for (int64_t i = lane; i < words; i += 32)
      reinterpret_cast<uint4 *>(dst)[i] = reinterpret_cast<const uint4 *>(src)[i];
    return;
  }
  int64_t words = bytes / 4; /* rows are whole 4-byte words: dim is a multiple of 4 */
  for (int64_t i = lane; i < words; i += 32)
    reinterpret_cast<uint32_t *>(dst)[i] = reinterpret_cast<const uint32_t *>(src)[i];
}

__global__ void move_rows(ur__cache_io io, const int64_t *entries, int64_t n, int to_host) {
  int64_t e = (int64_t)blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (e >= n) return;
  uint64_t p = (uint64_t)entries[2 * e];
  int32_t ct = (int32_t)(p >> UR__CACHE_ROW_BITS);
  int64_t row = (int64_t)(p & UR__CACHE_ROW_MASK), slot = entries[2 * e + 1];
  char *h = (char *)io.host_w[ct] + row * io.row_bytes;
  char *s = (char *)io.slot_w + slot * io.row_bytes;
  if (to_host) copy_bytes(h, s, io.row_bytes, lane);
  else copy_bytes(s, h, io.row_bytes, lane);
  int64_t sb = (int64_t)io.state_per_row * 4;
  for (int k = 0; k < io.nstate; k++) {
    float *hb = k ? io.host_s2[ct] : io.host_s1[ct];
    float *ss = k ? io.slot_s2 : io.slot_s1;
    char *hs = (char *)(hb + row * io.state_per_row), *sl = (char *)(ss + slot * io.state_per_row);
    if (to_host) copy_bytes(hs, sl, sb, lane);
    else copy_bytes(sl, hs, sb, lane);
  }
}

}  // namespace

cudaError_t ur__cuda_cache_move(cudaStream_t s, const ur__cache_io *io, const int64_t *entries,
                                int64_t n, int to_host) {
  if (n <= 0) return cudaSuccess;
  int64_t blocks = (n + kWarpsPerBlock - 1) / kWarpsPerBlock;
  move_rows<<<(unsigned)blocks, 32 * kWarpsPerBlock, 0, s>>>(*io, entries, n, to_host);
  return cudaGetLastError();
}
