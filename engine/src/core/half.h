/* half.h: f32 to and from bf16 and f16, rounded to nearest even, for the CPU (core/convert.c,
 * the CPU references) and the kernels alike (through tbe_plan.h and qtbe_plan.h), so that both
 * store the same bits.  NaN stays a quiet NaN; f32 beyond f16's range becomes infinity. */
#ifndef UR_HALF_H
#define UR_HALF_H

#include <stdint.h>
#include "core/philox.h" /* UR_HD, and math.h on the host */

UR_HD float ur__f32_from_bits(uint32_t x) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(x);
#else
  union { uint32_t u; float f; } v;
  v.u = x;
  return v.f;
#endif
}

UR_HD uint32_t ur__f32_bits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  union { uint32_t u; float f; } v;
  v.f = f;
  return v.u;
#endif
}

UR_HD float ur__bf16_to_f32(uint16_t h) { return ur__f32_from_bits((uint32_t)h << 16); }

UR_HD float ur__f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    float f = (float)m * (1.0f / 16777216.0f);
    return sign ? -f : f;
  }
  if (e == 31) return ur__f32_from_bits(sign | 0x7f800000u | (m << 13));
  return ur__f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
}

UR_HD uint16_t ur__f32_to_bf16(float f) {
  uint32_t x = ur__f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40); /* quiet NaN */
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

UR_HD uint16_t ur__f32_to_f16(float f) {
  uint32_t x = ur__f32_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to inf */
  if (ax < 0x38800000u) {
    /* subnormal in f16: 2^24 scales its unit to 1, and rintf rounds half to even */
    return (uint16_t)(sign | (uint32_t)rintf(ur__f32_from_bits(ax) * 16777216.0f));
  }
  uint32_t m = ax + 0xc8000fffu + ((ax >> 13) & 1u); /* rebias the exponent and round */
  return (uint16_t)(sign | (m >> 13));
}

#endif
