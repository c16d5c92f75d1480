/* round_sr_check: ur__tbe_round_sr (tbe_plan.h), whose normal values take integer steps, gives
 * the bits of ur__tbe_round_sr_float, the float path every value can take, for f16 and bf16:
 * every exponent's truncations at the edges of the dropped bits with random words at and around
 * the threshold (r >> 19 = k for f16, r >> 16 = k for bf16), the ranges' edges, and random
 * values over every bit pattern.  Prints "round_sr_check: ok, N compared" or the first
 * mismatch.  Built (header-only, the engine's float flags) and run by spec/tbe_spec.lua
 * through the specs' h.run_c_check. */
#include <stdio.h>
#include <stdlib.h>

#include "embedding/tbe_plan.h"

static uint64_t g_state = 0x9E3779B97F4A7C15ull;

static uint32_t next32(void) { /* splitmix64 */
  uint64_t z = (g_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return (uint32_t)((z ^ (z >> 31)) >> 32);
}

static long g_compared;

static int check(uint32_t bits, int32_t dtype, uint32_t r) {
  float x = ur__f32_from_bits(bits);
  uint16_t fast = ur__tbe_round_sr(x, dtype, r), slow = ur__tbe_round_sr_float(x, dtype, r);
  g_compared++;
  if (fast == slow) return 0;
  printf("round_sr_check: MISMATCH %s x bits 0x%08x r 0x%08x: 0x%04x, the float path 0x%04x\n",
         dtype == UR_DTYPE_BF16 ? "bf16" : "f16", bits, r, fast, slow);
  return 1;
}

/* x's of every exponent from e0 to e1 with dropped bits (the low `drop` bits) 0, 1, 2, a random
 * value, top - 1 and top, each with words whose compared bits are k - 1, k and k + 1 (low bits
 * 0, all ones and random) and random words. */
static int edges(int32_t dtype, uint32_t e0, uint32_t e1, int drop) {
  uint32_t top = (1u << drop) - 1;
  for (uint32_t e = e0; e <= e1; e++)
    for (int sign = 0; sign < 2; sign++)
      for (int kept = 0; kept < 4; kept++) {
        uint32_t mant_hi = kept == 0 ? 0 : kept == 1 ? (0x7fffffu >> drop) : next32() & (0x7fffffu >> drop);
        uint32_t ks[6] = {0, 1, 2, next32() & top, top - 1, top};
        for (int i = 0; i < 6; i++) {
          uint32_t bits = (uint32_t)sign << 31 | e << 23 | mant_hi << drop | ks[i];
          for (int dk = -1; dk <= 1; dk++)
            for (int lowbits = 0; lowbits < 3; lowbits++) {
              uint32_t k = ks[i] + (uint32_t)dk, rest = (1u << (32 - drop)) - 1; /* r's other bits */
              uint32_t low = lowbits == 0 ? 0 : lowbits == 1 ? rest : next32() & rest;
              if (check(bits, dtype, k << (32 - drop) | low)) return 1;
            }
          for (int j = 0; j < 8; j++)
            if (check(bits, dtype, next32())) return 1;
        }
      }
  return 0;
}

int main(void) {
  /* f16: 13 dropped bits, normals 2^-14 .. 65504 (exponents 113 to 142), and around them */
  if (edges(UR_DTYPE_F16, 100, 150, 13)) return 1;
  /* bf16: 16 dropped bits, every exponent */
  if (edges(UR_DTYPE_BF16, 0, 255, 16)) return 1;
  /* random values over every bit pattern, and random values near the ranges' ends */
  for (long i = 0; i < 20000000; i++) {
    uint32_t r = next32(), b = next32();
    if (check(b, UR_DTYPE_F16, r) || check(b, UR_DTYPE_BF16, r)) return 1;
    uint32_t near[4] = {0x38800000u, 0x477fe000u, 0x00800000u, 0x7f7f0000u};
    uint32_t nb = (near[i & 3] + (next32() & 0x3ffffu) - 0x20000u) | (next32() & 0x80000000u);
    if (check(nb, (i & 3) < 2 ? UR_DTYPE_F16 : UR_DTYPE_BF16, r)) return 1;
  }
  printf("round_sr_check: ok, %ld compared\n", g_compared);
  return 0;
}
