/* philox.h: the counter-based generator (Philox4x32-10, Salmon et al. 2011) shared by the CPU
 * and CUDA backends, so the same seed gives the same numbers on both.  Element i of a draw
 * uses counter (i, 0, 0, 0) and key (seed low, seed high); its first output word makes a
 * uniform, and a normal takes words 0 and 1 through Box-Muller.  Beside it, ur__mix64, the
 * 64-bit mixer the engine's hashed maps share. */
#ifndef UR_PHILOX_H
#define UR_PHILOX_H

#include <stdint.h>
#ifndef __CUDACC__
#include <math.h>
#endif

#ifdef __CUDACC__
#define UR_HD __host__ __device__ __forceinline__
#else
#define UR_HD static inline
#endif

typedef struct ur_philox4 { uint32_t v[4]; } ur_philox4;

/* splitmix64's finaliser: a 64-bit key spread over every bit, for the open-addressed maps of
 * managed collisions (mc.h), the cache's sets (cache_sets.h), the far rows' copies (tbe_plan.h)
 * and dedup's bag hash (data/kjt.h). */
UR_HD uint64_t ur__mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

UR_HD uint32_t ur_mulhilo(uint32_t a, uint32_t b, uint32_t *hi) {
  uint64_t p = (uint64_t)a * b;
  *hi = (uint32_t)(p >> 32);
  return (uint32_t)p;
}

/* The generator at a 128-bit counter: lo its low 64 bits, hi its high 64 (ur_philox's counter
 * is lo with hi 0), for a stream whose counters outgrow 64 bits or must stay apart past them. */
UR_HD ur_philox4 ur_philox128(uint64_t lo, uint64_t hi, uint64_t seed) {
  uint32_t c0 = (uint32_t)lo, c1 = (uint32_t)(lo >> 32), c2 = (uint32_t)hi, c3 = (uint32_t)(hi >> 32);
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  for (int r = 0; r < 10; r++) {
    uint32_t hi0, hi1;
    uint32_t lo0 = ur_mulhilo(0xD2511F53u, c0, &hi0);
    uint32_t lo1 = ur_mulhilo(0xCD9E8D57u, c2, &hi1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  ur_philox4 r;
  r.v[0] = c0; r.v[1] = c1; r.v[2] = c2; r.v[3] = c3;
  return r;
}

UR_HD ur_philox4 ur_philox(uint64_t counter, uint64_t seed) { return ur_philox128(counter, 0, seed); }

/* A uniform in (0, 1]: 24 bits, exact in float, never 0 so log() is safe. */
UR_HD float ur_u01(uint32_t w) { return (float)((w >> 8) + 1u) * (1.0f / 16777216.0f); }

/* The value of element `counter`: uniform on [a, b), or normal with mean a and stddev b.
 * Computed in double so that CPU and GPU libm differences stay below float rounding. */
UR_HD double ur_philox_value(uint64_t counter, uint64_t seed, int normal, double a, double b) {
  ur_philox4 r = ur_philox(counter, seed);
  double u = (double)ur_u01(r.v[0]);
  if (!normal) return a + (b - a) * (1.0 - u);
  double u2 = (double)ur_u01(r.v[1]);
  double rad = sqrt(-2.0 * log(u));
  return a + b * rad * cos(6.283185307179586 * u2);
}

#endif
