/* nonfinite.h: "is this element NaN or +-Inf", by its bits, for the CPU reference
 * (core/nonfinite.c) and the GPU (kernels/tensor.cu) alike: an all-ones exponent. */
#ifndef UR_NONFINITE_H
#define UR_NONFINITE_H

#include <stdint.h>
#include "core/philox.h" /* UR_HD */

UR_HD int ur__nonfinite_f32(uint32_t bits) { return (bits & 0x7f800000u) == 0x7f800000u; }
UR_HD int ur__nonfinite_bf16(uint16_t bits) { return (bits & 0x7f80u) == 0x7f80u; }
UR_HD int ur__nonfinite_f16(uint16_t bits) { return (bits & 0x7c00u) == 0x7c00u; }
UR_HD int ur__nonfinite_f64(uint64_t bits) {
  return (bits & 0x7ff0000000000000ull) == 0x7ff0000000000000ull;
}

#endif
