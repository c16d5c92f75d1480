/* kjt.h: what engine/src/kjt.c hands the CUDA backend's keyed-jagged-tensor entries
 * (engine/src/cuda/kjt.cu, kernels/kjt.cu). */
#ifndef UR_KJT_H
#define UR_KJT_H

#include <stdint.h>

/* One run of a segment copy: n elements from src (GPU-visible) to element dst of the output. */
typedef struct ur__kjt_seg {
  const void *src;
  int64_t dst, n;
} ur__kjt_seg;

#endif
