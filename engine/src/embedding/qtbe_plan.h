/* qtbe_plan.h: the quantized collection's plan, shared by qtbe.c, the CPU reference
 * (qtbe_cpu.c) and the kernels (kernels/qtbe.cu): the row formats' arithmetic (uvmrec.h's
 * section 10 states it), the descriptors and the arguments of one call.  Dequantizing is written
 * once here with UR_F* (no fused multiply-add on either side), so both backends give the same
 * bits; quantizing runs on the host only. */
#ifndef UR_QTBE_PLAN_H
#define UR_QTBE_PLAN_H

#include <stdint.h>
#include "embedding/tbe_plan.h"
#include "uvmrec.h"

#define UR_QTBE_HEADER 4 /* bytes of f16 scale and f16 bias in front of an int row */

/* One table as the kernels see it. */
typedef struct ur__qtbe_table {
  const uint8_t *rows;     /* rows x row_bytes */
  const int64_t *perm;     /* row id -> stored row, or NULL */
  int64_t nrows, modulo, row_bytes;
  int32_t dim, format, pooling, index;
} ur__qtbe_table;

/* A feature as the kernels see it: the plain collection's (both lay features out alike, through
 * table.c's ur__tbe_names). */
typedef ur__tbe_feature ur__qtbe_feature;

/* One call, in memory the running backend reads. */
typedef struct ur__qtbe_args {
  const ur__qtbe_table *tables;
  const ur__qtbe_feature *features;
  int32_t num_tables, num_features;
  int32_t bounds, pooled, out_dtype;
  int32_t max_dim;         /* the widest table (launch decisions) */
  const int64_t *values, *offsets;
  const float *weights;    /* NULL: every weight is 1 */
  int64_t n, bags, batch;  /* batch: bags per feature */
  int64_t out_stride;      /* pooled: out_dim; none: dim */
  void *out;
  int64_t *flags;          /* [2]: the first bad value index (UR_TBE_NO_BAD), ids skipped */
} ur__qtbe_args;

/* Bytes of a stored row, or -1. */
UR_HD int64_t ur__qtbe_row_bytes(int32_t format, int32_t dim) {
  if (dim < 4 || dim > UR_TBE_MAX_DIM || dim % 4) return -1;
  switch (format) {
  case UR_QFORMAT_F32: return 4 * (int64_t)dim;
  case UR_QFORMAT_F16: return 2 * (int64_t)dim;
  case UR_QFORMAT_INT8: return UR_QTBE_HEADER + dim;
  case UR_QFORMAT_INT4: return (UR_QTBE_HEADER + dim / 2 + 3) / 4 * 4;
  case UR_QFORMAT_INT2: return (UR_QTBE_HEADER + dim / 4 + 3) / 4 * 4;
  default: return -1;
  }
}

UR_HD int32_t ur__qtbe_bits(int32_t format) {
  return format == UR_QFORMAT_INT8 ? 8 : format == UR_QFORMAT_INT4 ? 4 : 2;
}

/* The stored row of an id, or -1 when the id maps outside the table. */
UR_HD int64_t ur__qtbe_map(const ur__qtbe_table *tb, int64_t id) {
  if (id < 0) return -1;
  if (tb->modulo > 0) id %= tb->modulo;
  if (id >= tb->nrows) return -1;
  return tb->perm ? tb->perm[id] : id;
}

/* Elements 4 c4 .. 4 c4 + 3 of a stored row, as f32.  The row's alignment serves each load: an
 * f32 row's 16 bytes, an f16 row's 8, an int8 row's 4 codes, int4's 2 bytes, int2's 1. */
UR_HD void ur__qtbe_load4(const uint8_t *row, int32_t format, int32_t c4, float v[4]) {
  if (format == UR_QFORMAT_F32) {
    const float *p = (const float *)row + 4 * c4;
    for (int k = 0; k < 4; k++) v[k] = p[k];
    return;
  }
  if (format == UR_QFORMAT_F16) {
    const uint16_t *p = (const uint16_t *)row + 4 * c4;
    for (int k = 0; k < 4; k++) v[k] = ur__f16_to_f32(p[k]);
    return;
  }
  const uint16_t *h = (const uint16_t *)row;
  float scale = ur__f16_to_f32(h[0]), bias = ur__f16_to_f32(h[1]);
  const uint8_t *codes = row + UR_QTBE_HEADER;
  uint32_t q[4];
  if (format == UR_QFORMAT_INT8) {
    for (int k = 0; k < 4; k++) q[k] = codes[4 * c4 + k];
  } else if (format == UR_QFORMAT_INT4) {
    uint32_t b0 = codes[2 * c4], b1 = codes[2 * c4 + 1];
    q[0] = b0 & 15u;
    q[1] = b0 >> 4;
    q[2] = b1 & 15u;
    q[3] = b1 >> 4;
  } else {
    uint32_t b = codes[c4];
    for (int k = 0; k < 4; k++) q[k] = (b >> (2 * k)) & 3u;
  }
  for (int k = 0; k < 4; k++) v[k] = UR_FADD(UR_FMUL((float)q[k], scale), bias);
}

/* A whole stored row as f32, element for element what ur__qtbe_load4 gives (the CPU decodes a
 * row once; the GPU's lanes take 4 elements each). */
UR_HD void ur__qtbe_load_row(const uint8_t *row, int32_t format, int32_t dim, float *out) {
  if (format == UR_QFORMAT_F32) {
    const float *p = (const float *)row;
    for (int32_t c = 0; c < dim; c++) out[c] = p[c];
    return;
  }
  if (format == UR_QFORMAT_F16) {
    const uint16_t *p = (const uint16_t *)row;
    for (int32_t c = 0; c < dim; c++) out[c] = ur__f16_to_f32(p[c]);
    return;
  }
  const uint16_t *h = (const uint16_t *)row;
  float scale = ur__f16_to_f32(h[0]), bias = ur__f16_to_f32(h[1]);
  const uint8_t *codes = row + UR_QTBE_HEADER;
  if (format == UR_QFORMAT_INT8) {
    for (int32_t c = 0; c < dim; c++) out[c] = UR_FADD(UR_FMUL((float)codes[c], scale), bias);
  } else if (format == UR_QFORMAT_INT4) {
    for (int32_t c = 0; c < dim; c++)
      out[c] = UR_FADD(UR_FMUL((float)((codes[c >> 1] >> (4 * (c & 1))) & 15u), scale), bias);
  } else {
    for (int32_t c = 0; c < dim; c++)
      out[c] = UR_FADD(UR_FMUL((float)((codes[c >> 2] >> (2 * (c & 3))) & 3u), scale), bias);
  }
}

#endif
