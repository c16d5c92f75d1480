/* convert.c: element loads and stores for every dtype, with f16/bf16 rounded to nearest even
 * (core/half.h). */
#include <math.h>
#include <string.h>
#include "core/core.h"

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

const float *ur__load_f32(const void *src, ur_dtype d, size_t n, float *buf) {
  const uint16_t *h = src;
  switch (d) {
    case UR_DTYPE_F32: return src;
    case UR_DTYPE_BF16:
      for (size_t i = 0; i < n; i++) buf[i] = ur__bf16_to_f32(h[i]);
      return buf;
    case UR_DTYPE_F16:
      for (size_t i = 0; i < n; i++) buf[i] = ur__f16_to_f32(h[i]);
      return buf;
    default:
      for (size_t i = 0; i < n; i++) buf[i] = (float)ur__load(src, d, i);
      return buf;
  }
}

void ur__store_f32(void *dst, ur_dtype d, size_t n, const float *src) {
  uint16_t *h = dst;
  switch (d) {
    case UR_DTYPE_F32: memmove(dst, src, n * sizeof *src); break;
    case UR_DTYPE_BF16:
      for (size_t i = 0; i < n; i++) h[i] = ur__f32_to_bf16(src[i]);
      break;
    case UR_DTYPE_F16:
      for (size_t i = 0; i < n; i++) h[i] = ur__f32_to_f16(src[i]);
      break;
    default:
      for (size_t i = 0; i < n; i++) ur__store(dst, d, i, src[i]);
      break;
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
