/* qtbe_cpu.c: the CPU backend's qtbe table (qtbe.h), the reference the CUDA kernels
 * (kernels/qtbe.cu) match bit for bit: each output element sums weight * dequantized element
 * over its bag's values in value order (qtbe_plan.h's arithmetic), then a mean divides by the
 * bag's length as the embedding collection does.  Bags (pooling none: values) are spread over
 * the threads; nothing here is shared between calls, so calls may run at once. */
#include <string.h>
#include "embedding/qtbe.h"

/* The stored row of value i, or NULL after noting it when it maps outside its table. */
static const uint8_t *row_of(const ur__qtbe_args *a, const ur__qtbe_table *tb, int64_t i) {
  int64_t r = ur__qtbe_map(tb, a->values[i]);
  if (r < 0) {
    if (a->bounds != UR_TBE_BOUNDS_OFF) ur__tbe_note_bad(a->flags, i);
    return NULL;
  }
  return tb->rows + r * tb->row_bytes;
}

/* Rows of big tables are far apart in memory: ask for the row a few bags ahead (of the same
 * feature, the usual case) while this one is summed. */
#define PREFETCH_AHEAD 4

static void prefetch(const ur__qtbe_args *a, const ur__qtbe_table *tb, int64_t i) {
  if (i >= a->n) return;
  int64_t id = a->values[i];
  if (id < 0 || (tb->modulo == 0 && id >= tb->nrows)) return;
  int64_t r = ur__qtbe_map(tb, id);
  if (r < 0) return;
  const uint8_t *p = tb->rows + r * tb->row_bytes;
  for (int64_t o = 0; o < tb->row_bytes; o += 64) __builtin_prefetch(p + o);
}

static void pooled_range(void *ctx, size_t b0, size_t b1) {
  const ur__qtbe_args *a = ctx;
  float acc[UR_TBE_MAX_DIM], v[UR_TBE_MAX_DIM];
  for (int64_t bag = (int64_t)b0; bag < (int64_t)b1; bag++) {
    int32_t f = (int32_t)(bag / a->batch);
    const ur__qtbe_feature *ft = &a->features[f];
    const ur__qtbe_table *tb = &a->tables[ft->table];
    int32_t dim = tb->dim;
    int64_t s, e;
    ur__tbe_bag_span(a->offsets, a->n, bag, &s, &e);
    memset(acc, 0, sizeof(float) * (size_t)dim);
    for (int64_t i = s; i < e; i++) {
      prefetch(a, tb, i + PREFETCH_AHEAD);
      const uint8_t *row = row_of(a, tb, i);
      if (!row) continue;
      ur__qtbe_load_row(row, tb->format, dim, v);
      /* w * v is v itself when w is 1: the GPU's product gives the same bits */
      if (a->weights) {
        float w = a->weights[i];
        for (int32_t c = 0; c < dim; c++) acc[c] = UR_FADD(acc[c], UR_FMUL(w, v[c]));
      } else {
        for (int32_t c = 0; c < dim; c++) acc[c] = UR_FADD(acc[c], v[c]);
      }
    }
    if (tb->pooling == UR_POOLING_MEAN && e > s) {
      float inv = UR_FDIV(1.0f, (float)(e - s));
      for (int32_t c = 0; c < dim; c++) acc[c] = UR_FMUL(acc[c], inv);
    }
    ur__tbe_store_out(a->out, a->out_dtype,
                      (bag - (int64_t)f * a->batch) * a->out_stride + ft->col, acc, dim);
  }
}

/* Pooling none: value i's row, times its weight, is output row i (zeros for a bad id). */
static void rows_range(void *ctx, size_t b0, size_t b1) {
  const ur__qtbe_args *a = ctx;
  float out[UR_TBE_MAX_DIM];
  for (int64_t bag = (int64_t)b0; bag < (int64_t)b1; bag++) {
    const ur__qtbe_table *tb = &a->tables[a->features[bag / a->batch].table];
    int64_t s, e;
    ur__tbe_bag_span(a->offsets, a->n, bag, &s, &e);
    for (int64_t i = s; i < e; i++) {
      prefetch(a, tb, i + PREFETCH_AHEAD);
      const uint8_t *row = row_of(a, tb, i);
      if (row) {
        ur__qtbe_load_row(row, tb->format, tb->dim, out);
        float w = a->weights ? a->weights[i] : 1.0f;
        for (int32_t c = 0; c < tb->dim; c++) out[c] = UR_FMUL(w, out[c]);
      } else {
        memset(out, 0, sizeof(float) * (size_t)tb->dim);
      }
      ur__tbe_store_out(a->out, a->out_dtype, i * a->out_stride, out, tb->dim);
    }
  }
}

static ur_status cpu_forward(void *stream, const ur__qtbe_args *a) {
  (void)stream;
  ur__parallel_for((size_t)a->bags, 256, a->pooled ? pooled_range : rows_range, (void *)a);
  return UR_STATUS_OK;
}

const ur_qtbe_ops ur__cpu_qtbe_ops = {
    .forward = cpu_forward,
};
