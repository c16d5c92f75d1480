/* sort.c: the CPU backend's radix sort (the tbe's and the cache's sorts of row keys, the page
 * prefetch's sort of rows): LSD, 11 bits a pass, stable; and the bits such keys need, which
 * the GPU's sorts are given too. */
#include <string.h>
#include "core/core.h"

int ur__key_bits(uint64_t max) {
  int bits = 1;
  while (bits < 63 && ((uint64_t)1 << bits) <= max) bits++;
  return bits;
}

void ur__radix_sort(uint64_t **k, int64_t **v, uint64_t **tk, int64_t **tv, int64_t n, int bits) {
  enum { RB = 11, RN = 1 << RB };
  size_t cnt[RN];
  for (int shift = 0; shift < bits; shift += RB) {
    memset(cnt, 0, sizeof cnt);
    uint64_t *ks = *k, *kd = *tk;
    for (int64_t i = 0; i < n; i++) cnt[(ks[i] >> shift) & (RN - 1)]++;
    size_t sum = 0;
    for (int d = 0; d < RN; d++) {
      size_t c = cnt[d];
      cnt[d] = sum;
      sum += c;
    }
    if (v) {
      int64_t *vs = *v, *vd = *tv;
      for (int64_t i = 0; i < n; i++) {
        size_t p = cnt[(ks[i] >> shift) & (RN - 1)]++;
        kd[p] = ks[i];
        vd[p] = vs[i];
      }
      *tv = vs;
      *v = vd;
    } else {
      for (int64_t i = 0; i < n; i++) kd[cnt[(ks[i] >> shift) & (RN - 1)]++] = ks[i];
    }
    *tk = ks;
    *k = kd;
  }
}
