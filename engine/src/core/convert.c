/* convert.c: element loads and stores for every dtype, with f16/bf16 rounded to nearest even. */
#include <math.h>
#include <string.h>
#include "core/core.h"

uint16_t ur__f32_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40); /* quiet NaN */
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

float ur__bf16_to_f32(uint16_t h) {
  uint32_t x = (uint32_t)h << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}

uint16_t ur__f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to inf */
  if (ax < 0x38800000u) {                                     /* subnormal or zero in f16 */
    float a;
    memcpy(&a, &ax, 4);
    /* Scaling by 2^24 puts the f16 subnormal unit at 1; rint rounds half to even. */
    return (uint16_t)(sign | (uint32_t)rintf(a * 16777216.0f));
  }
  uint32_t m = ax + 0xc8000fffu + ((ax >> 13) & 1u); /* rebias exponent and round */
  return (uint16_t)(sign | (m >> 13));
}

float ur__f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
  if (e == 0) {
    float f = (float)m * (1.0f / 16777216.0f);
    return sign ? -f : f;
  }
  if (e == 31) x = sign | 0x7f800000u | (m << 13);
  else x = sign | ((e + 112u) << 23) | (m << 13);
  float f;
  memcpy(&f, &x, 4);
  return f;
}

double ur__load(const void *base, ur_dtype d, size_t i) {
  switch (d) {
    case UR_DTYPE_F32: return ((const float *)base)[i];
    case UR_DTYPE_BF16: return ur__bf16_to_f32(((const uint16_t *)base)[i]);
    case UR_DTYPE_F16: return ur__f16_to_f32(((const uint16_t *)base)[i]);
    case UR_DTYPE_I8: return ((const int8_t *)base)[i];
    case UR_DTYPE_U8: return ((const uint8_t *)base)[i];
    case UR_DTYPE_I32: return ((const int32_t *)base)[i];
    case UR_DTYPE_I64: return (double)((const int64_t *)base)[i];
    case UR_DTYPE_F64: return ((const double *)base)[i];
    default: return 0;
  }
}

/* Integers take the floor of v, as the random generators do; callers range-check. */
void ur__store(void *base, ur_dtype d, size_t i, double v) {
  switch (d) {
    case UR_DTYPE_F32: ((float *)base)[i] = (float)v; break;
    case UR_DTYPE_BF16: ((uint16_t *)base)[i] = ur__f32_to_bf16((float)v); break;
    case UR_DTYPE_F16: ((uint16_t *)base)[i] = ur__f32_to_f16((float)v); break;
    case UR_DTYPE_I8: ((int8_t *)base)[i] = (int8_t)floor(v); break;
    case UR_DTYPE_U8: ((uint8_t *)base)[i] = (uint8_t)floor(v); break;
    case UR_DTYPE_I32: ((int32_t *)base)[i] = (int32_t)floor(v); break;
    case UR_DTYPE_I64: ((int64_t *)base)[i] = (int64_t)floor(v); break;
    case UR_DTYPE_F64: ((double *)base)[i] = v; break;
    default: break;
  }
}

uint64_t ur__bits_of(ur_dtype d, double v) {
  uint64_t bits = 0;
  unsigned char tmp[8];
  ur__store(tmp, d, 0, v);
  memcpy(&bits, tmp, ur_dtype_size(d));
  return bits;
}
