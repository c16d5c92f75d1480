/* cache_sets.h: the software cache's arithmetic shared by the host reference
 * (engine/src/embedding/cache_cpu.c) and the GPU's decisions (kernels/cache.cu), so both map a row to the
 * same set and age LFU counts the same way.  Keys are a cumulative row space over the cache's
 * tables: kbase[ct] is table ct's first key, kbase[nt] the total. */
#ifndef UR_CACHE_SETS_H
#define UR_CACHE_SETS_H

#include <stdint.h>
#include "core/philox.h" /* ur__mix64 */

#ifdef __CUDACC__
#define UR_CS __host__ __device__ __forceinline__
#else
#define UR_CS static inline
#endif

/* The move lists' entries pack the cache table above UR__CACHE_ROW_BITS and the row below. */
#define UR__CACHE_ROW_BITS 48
#define UR__CACHE_ROW_MASK ((((uint64_t)1) << UR__CACHE_ROW_BITS) - 1)

/* The cache table of a key: the last one whose first key is at or below it. */
UR_CS int32_t ur__cache_table_of(const int64_t *kbase, int32_t nt, uint64_t key) {
  int32_t lo = 0, hi = nt;
  while (hi - lo > 1) {
    int32_t mid = (lo + hi) / 2;
    if ((uint64_t)kbase[mid] <= key) lo = mid;
    else hi = mid;
  }
  return lo;
}

/* The set of a key of table ct: a hash of (table, row), not of the key, so a table's rows land
 * in the same sets whichever tables share the cache. */
UR_CS int64_t ur__cache_set_of(const int64_t *kbase, const int64_t *set_base,
                               const int64_t *set_count, uint64_t key, int32_t ct) {
  uint64_t row = key - (uint64_t)kbase[ct];
  uint64_t h = ur__mix64(((uint64_t)ct << UR__CACHE_ROW_BITS) ^ row ^ 0x5851F42D4C957F2Dull);
  return set_base[ct] + (int64_t)(h % (uint64_t)set_count[ct]);
}

/* (table << 48 | row) of a key. */
UR_CS uint64_t ur__cache_pair_of(const int64_t *kbase, int32_t nt, uint64_t key) {
  int32_t ct = ur__cache_table_of(kbase, nt, key);
  return ((uint64_t)ct << UR__CACHE_ROW_BITS) | (key - (uint64_t)kbase[ct]);
}

/* An LFU count (low 16 bits) seen in decay epoch `epoch`: halved once per epoch since it was
 * last counted (its epoch in the high 16 bits). */
UR_CS uint32_t ur__cache_freq_now(uint32_t f, uint32_t epoch) {
  uint32_t d = (epoch - (f >> 16)) & 0xffffu;
  return d >= 16 ? 0 : (f & 0xffffu) >> d;
}

/* The epoch has 16 bits, so a count last seen 65536 epochs ago would read as seen now (and
 * 65537 ago as halved once): the cache re-bases every count at least this often, in epochs, so
 * that none it reads is older than 65536. */
#define UR__CACHE_REBASE_EPOCHS 32768

/* An LFU count re-based to epoch `epoch`: its value now, seen now (0 once halved away). */
UR_CS uint32_t ur__cache_freq_rebase(uint32_t f, uint32_t epoch) {
  uint32_t x = ur__cache_freq_now(f, epoch);
  return x ? (epoch << 16) | x : 0;
}

#endif
