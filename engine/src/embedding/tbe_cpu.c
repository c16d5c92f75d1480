/* tbe_cpu.c: the CPU backend's tbe table (tbe.h), the reference the CUDA kernels
 * (kernels/tbe.cu) match bit for bit: forward pooling, the fused backward with its optimizer
 * step, the deduplicated sparse gradient, the plain row gather and the decay of access counters.
 * Arguments are the same structs the kernels take (tbe_plan.h), in host memory; tbe.c has
 * checked them.  The GPU's atomic SGD step (args.atomic, ur_tbe_config.nondeterministic) has
 * this sorted step as its reference: the CPU ignores the flag.  The workspace (work_bytes) holds the VBE bags and the sort of a backward, so
 * the sparse gradient's second call finds the first one's sort there. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "embedding/tbe.h"
#include "core/core.h"

/* Row `row` of a table as floats: the f32 storage itself (inline: the lookups' hot path), or
 * the halves converted into buf. */
static const float *load_row(const ur__tbe_table *tb, int64_t row, float *buf) {
  size_t base = (size_t)row * (size_t)tb->dim;
  if (tb->dtype == UR_DTYPE_F32) return (const float *)tb->weights + base;
  return ur__load_f32((const uint16_t *)tb->weights + base, tb->dtype, (size_t)tb->dim, buf);
}

/* dim elements of the output (or its gradient), f32 or bf16, from element at. */
static const float *load_out(const void *g, int32_t dtype, int64_t at, float *buf, int32_t dim) {
  if (dtype == UR_DTYPE_F32) return (const float *)g + at;
  return ur__load_f32((const uint16_t *)g + at, dtype, (size_t)dim, buf);
}

/* One more read of a row; counters stop at UR_TBE_COUNT_MAX (a racy check: at worst a few
 * adds past it). */
static void count_add(int32_t *c, int32_t n) {
  if (__atomic_load_n(c, __ATOMIC_RELAXED) < UR_TBE_COUNT_MAX) __atomic_fetch_add(c, n, __ATOMIC_RELAXED);
}

/* Rows are scattered over tables far larger than the caches, so one at a time the loop waits on
 * memory for each: ask for rows a few values ahead (assuming the same table, the usual case). */
#define PREFETCH_AHEAD 8

static void prefetch_row(const ur__tbe_table *tb, int64_t id) {
  if (id < 0 || id >= tb->rows) return;
  size_t es = tb->dtype == UR_DTYPE_F32 ? 4 : 2, bytes = (size_t)tb->dim * es;
  const char *p = (const char *)tb->weights + (size_t)ur__tbe_phys(tb, id) * bytes;
  for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(p + o);
}

static void cpu_forward_range(void *ctx, size_t b0, size_t b1) {
  const ur__tbe_args *a = ctx;
  float acc[UR_TBE_MAX_DIM], row[UR_TBE_MAX_DIM], tmp[UR_TBE_MAX_DIM];
  for (int64_t bag = (int64_t)b0; bag < (int64_t)b1; bag++) {
    int32_t f = ur__tbe_feature_of(a, bag);
    const ur__tbe_feature *ft = &a->features[f];
    const ur__tbe_table *tb = &a->tables[ft->table];
    int32_t dim = tb->dim;
    int64_t s, e;
    ur__tbe_bag_span(a->offsets, a->n, bag, &s, &e);
    if (a->pooled) memset(acc, 0, sizeof(float) * (size_t)dim);
    for (int64_t i = s; i < e; i++) {
      if (i + PREFETCH_AHEAD < a->n) prefetch_row(tb, a->values[i + PREFETCH_AHEAD]);
      int64_t id = a->values[i];
      float w = a->weights ? a->weights[i] : 1.0f;
      /* Checked even when off: a bad id would crash the process rather than one kernel. */
      if (id < 0 || id >= tb->rows) {
        if (a->bounds != UR_TBE_BOUNDS_OFF) ur__tbe_note_bad(a->flags, i);
        if (!a->pooled) {
          memset(tmp, 0, sizeof(float) * (size_t)dim);
          ur__tbe_store_out(a->out, a->out_dtype, i * dim, tmp, dim);
        }
        continue;
      }
      if (tb->counts) count_add(tb->counts + id, 1);
      const float *r = load_row(tb, ur__tbe_phys(tb, id), row);
      if (a->pooled) {
        for (int32_t c = 0; c < dim; c++) acc[c] = UR_FADD(acc[c], UR_FMUL(w, r[c]));
      } else {
        for (int32_t c = 0; c < dim; c++) tmp[c] = UR_FMUL(w, r[c]);
        ur__tbe_store_out(a->out, a->out_dtype, i * dim, tmp, dim);
      }
    }
    if (!a->pooled) continue;
    if (tb->pooling == UR_POOLING_MEAN && e > s) {
      float inv = UR_FDIV(1.0f, (float)(e - s));
      for (int32_t c = 0; c < dim; c++) acc[c] = UR_FMUL(acc[c], inv);
    }
    int64_t at = ur__tbe_out_at(a->out_base, a->out_stride, f, ft, bag - ur__tbe_first_bag(a, f));
    ur__tbe_store_out(a->out, a->out_dtype, at, acc, dim);
  }
}

/* VBE: the full batch's rows from the pooled bags (sample b of feature f reads its bag
 * inverse[f * B + b]), one feature per chunk. */
typedef struct expand_job {
  const ur__tbe_args *a;
  const float *flat;
  float *flat_grad;
} expand_job;

static void cpu_expand_range(void *ctx, size_t f0, size_t f1) {
  const expand_job *j = ctx;
  const ur__tbe_args *a = j->a;
  for (int32_t f = (int32_t)f0; f < (int32_t)f1; f++) {
    const ur__tbe_feature *ft = &a->features[f];
    for (int64_t b = 0; b < a->full_batch; b++) {
      int64_t src = a->flat_base[f] + a->inverse[(int64_t)f * a->full_batch + b] * ft->dim;
      ur__tbe_store_out(a->out, a->out_dtype, b * a->out_stride + ft->col, j->flat + src, ft->dim);
    }
  }
}

/* The reverse: each bag's gradient sums its samples' rows in sample order. */
static void cpu_collapse_range(void *ctx, size_t f0, size_t f1) {
  const expand_job *j = ctx;
  const ur__tbe_args *a = j->a;
  float buf[UR_TBE_MAX_DIM];
  for (int32_t f = (int32_t)f0; f < (int32_t)f1; f++) {
    const ur__tbe_feature *ft = &a->features[f];
    for (int64_t b = 0; b < a->full_batch; b++) {
      float *d = j->flat_grad + a->flat_base[f] + a->inverse[(int64_t)f * a->full_batch + b] * ft->dim;
      const float *g = load_out(a->grad, a->out_dtype, b * a->out_stride + ft->col, buf, ft->dim);
      for (int32_t c = 0; c < ft->dim; c++) d[c] = UR_FADD(d[c], g[c]);
    }
  }
}

typedef struct bwd_job {
  const ur__tbe_args *a;
  const ur__tbe_hyper *h;
  uint64_t *keys;
  int64_t *idx, *bag_of, *seg;
  int64_t nseg;
  /* sparse output instead of a step */
  int64_t *rows;
  float *grads;
  const int64_t *ustart, *gbase; /* per table: first segment, first gradient element */
} bwd_job;

static void cpu_keys_range(void *ctx, size_t b0, size_t b1) {
  bwd_job *j = ctx;
  const ur__tbe_args *a = j->a;
  for (int64_t bag = (int64_t)b0; bag < (int64_t)b1; bag++) {
    const ur__tbe_table *tb = &a->tables[a->features[ur__tbe_feature_of(a, bag)].table];
    int64_t s, e;
    ur__tbe_bag_span(a->offsets, a->n, bag, &s, &e);
    for (int64_t i = s; i < e; i++) {
      int64_t id = a->values[i];
      j->keys[i] = id < 0 || id >= tb->rows ? (uint64_t)a->total_keys : (uint64_t)(tb->key_base + id);
      j->idx[i] = i;
      j->bag_of[i] = bag;
    }
  }
}

static int32_t table_of_key(const ur__tbe_args *a, uint64_t key) {
  int32_t lo = 0, hi = a->num_tables;
  while (hi - lo > 1) {
    int32_t mid = (lo + hi) / 2;
    if ((uint64_t)a->tables[mid].key_base <= key) lo = mid;
    else hi = mid;
  }
  return lo;
}

/* The optimizer step of row id, given its summed gradient.  It lives at its physical row;
 * stochastic rounding draws by id, so a relayout leaves the numbers unchanged.  With
 * h->sums_only the row's sum of squared gradients goes to its table's row sums instead. */
static void cpu_step_row(const ur__tbe_hyper *h, const ur__tbe_table *tb, int64_t id,
                         const float *acc) {
  float w[UR_TBE_MAX_DIM], g[UR_TBE_MAX_DIM];
  int32_t dim = tb->dim;
  int64_t row = ur__tbe_phys(tb, id);
  int64_t sid = tb->row_ids ? tb->row_ids[id] : id;
  size_t base = (size_t)row * (size_t)dim;
  size_t lbase = (size_t)(tb->sr_row0 + sid) * (size_t)tb->sr_pitch + (size_t)tb->sr_col0;
  const float *wr = load_row(tb, row, w);
  for (int32_t c = 0; c < dim; c++) {
    w[c] = wr[c];
    g[c] = ur__tbe_grad_adjust(h, acc[c], w[c]);
  }
  float rs = 0; /* rowwise Adagrad: the row's state, then its multiplier */
  if (h->k.kind == UR_OPTIM_KIND_ROWWISE_ADAGRAD) {
    float sq = 0;
    for (int32_t c = 0; c < dim; c++) sq = UR_FADD(sq, UR_FMUL(g[c], g[c]));
    if (h->sums_only) {
      tb->row_sums[sid] = sq;
      return;
    }
    rs = ur__tbe_rowwise_state(tb, sid, tb->state1[row], sq);
    tb->state1[row] = rs;
    rs = ur__tbe_rowwise_mult(h, rs);
  }
  uint64_t key = ur__tbe_sr_key(h->sr_key, tb->index);
  ur_philox4 r = {{0, 0, 0, 0}};
  for (int32_t c = 0; c < dim; c++) {
    size_t e = base + (size_t)c;
    float *s1 = h->k.kind == UR_OPTIM_KIND_ROWWISE_ADAGRAD ? &rs : tb->state1 ? tb->state1 + e : NULL;
    float *s2 = tb->state2 ? tb->state2 + e : NULL;
    float nw = ur__tbe_step_elem(h, w[c], g[c], s1, s2);
    if (tb->dtype == UR_DTYPE_F32) {
      ((float *)tb->weights)[e] = nw;
      continue;
    }
    uint16_t *hp = (uint16_t *)tb->weights + e;
    if (h->sr) {
      if ((c & 3) == 0) r = ur_philox((lbase + (size_t)c) >> 2, key);
      *hp = ur__tbe_round_sr(nw, tb->dtype, r.v[c & 3]);
    } else {
      *hp = tb->dtype == UR_DTYPE_BF16 ? ur__f32_to_bf16(nw) : ur__f32_to_f16(nw);
    }
  }
}

/* Where value i's gradient row starts in a->grad (its bag's output row, or its own). */
static int64_t grad_at(const ur__tbe_args *a, int64_t i, int64_t bag, int32_t dim) {
  if (!a->pooled) return i * dim;
  int32_t f = ur__tbe_feature_of(a, bag);
  return ur__tbe_out_at(a->out_base, a->out_stride, f, &a->features[f], bag - ur__tbe_first_bag(a, f));
}

/* Each distinct row sums its values' gradient rows in value order, then steps (or is written
 * out).  Gradient rows are scattered, so those a few entries ahead are prefetched. */
static void cpu_reduce_range(void *ctx, size_t s0, size_t s1) {
  bwd_job *j = ctx;
  const ur__tbe_args *a = j->a;
  float acc[UR_TBE_MAX_DIM], buf[UR_TBE_MAX_DIM];
  size_t gsize = a->out_dtype == UR_DTYPE_F32 ? 4 : 2;
  int64_t end = j->seg[j->nseg];
  for (int64_t s = (int64_t)s0; s < (int64_t)s1; s++) {
    uint64_t key = j->keys[j->seg[s]];
    int32_t t = table_of_key(a, key);
    const ur__tbe_table *tb = &a->tables[t];
    if (j->h && j->h->sums_only && !tb->row_sums) continue;
    int32_t dim = tb->dim;
    memset(acc, 0, sizeof(float) * (size_t)dim);
    for (int64_t k = j->seg[s]; k < j->seg[s + 1]; k++) {
      if (k + PREFETCH_AHEAD < end) {
        int64_t pi = j->idx[k + PREFETCH_AHEAD];
        const char *p = (const char *)a->grad + (size_t)grad_at(a, pi, j->bag_of[pi], dim) * gsize;
        for (size_t o = 0; o < (size_t)dim * gsize; o += 64) __builtin_prefetch(p + o);
      }
      int64_t i = j->idx[k], bag = j->bag_of[i];
      float c = a->weights ? a->weights[i] : 1.0f;
      if (a->pooled && tb->pooling == UR_POOLING_MEAN) {
        int64_t b, e;
        ur__tbe_bag_span(a->offsets, a->n, bag, &b, &e);
        c = UR_FMUL(c, UR_FDIV(1.0f, (float)(e - b)));
      }
      const float *g = load_out(a->grad, a->out_dtype, grad_at(a, i, bag, dim), buf, dim);
      for (int32_t d = 0; d < dim; d++) acc[d] = UR_FADD(acc[d], UR_FMUL(c, g[d]));
    }
    int64_t row = (int64_t)key - tb->key_base;
    if (!j->rows) {
      cpu_step_row(j->h, tb, row, acc);
      continue;
    }
    j->rows[s] = row;
    memcpy(j->grads + j->gbase[t] + (s - j->ustart[t]) * dim, acc, sizeof(float) * (size_t)dim);
  }
}

/* ---- the workspace ---- */

/* What a sort left for the next call on the same workspace. */
typedef struct sort_head {
  int64_t nseg;
  int32_t second;           /* 1: the sorted keys and indices are in tk and tv */
} sort_head;

typedef struct cpu_work {
  sort_head *head;
  float *flat;              /* VBE: the flat bags (forward) or their gradient (backward) */
  uint64_t *k, *tk;         /* backward: (key, value index) pairs and the sort's scratch */
  int64_t *v, *tv, *bag_of, *seg;
  size_t total;
} cpu_work;

/* The workspace's parts for a call (base NULL: only their total). */
static void carve(const ur__tbe_args *a, int backward, char *base, cpu_work *w) {
  size_t at = 0, n = (size_t)a->n;
  memset(w, 0, sizeof *w);
  if (backward) w->head = ur__carve(base, &at, sizeof(sort_head));
  if (a->inverse) w->flat = ur__carve(base, &at, sizeof(float) * (size_t)a->flat_numel);
  if (backward) {
    w->k = ur__carve(base, &at, sizeof(uint64_t) * n);
    w->tk = ur__carve(base, &at, sizeof(uint64_t) * n);
    w->v = ur__carve(base, &at, sizeof(int64_t) * n);
    w->tv = ur__carve(base, &at, sizeof(int64_t) * n);
    w->bag_of = ur__carve(base, &at, sizeof(int64_t) * n);
    w->seg = ur__carve(base, &at, sizeof(int64_t) * (n + 1));
  }
  w->total = at;
}

static ur_status cpu_work_bytes(const ur__tbe_args *a, int backward, size_t *out) {
  cpu_work w;
  carve(a, backward, NULL, &w);
  *out = w.total;
  return UR_STATUS_OK;
}

/* ---- forward ---- */

static ur_status cpu_forward(void *stream, const ur__tbe_args *a, void *work) {
  if (!a->inverse) {
    ur__parallel_for((size_t)a->bags, 256, cpu_forward_range, (void *)a);
    return UR_STATUS_OK;
  }
  cpu_work w;
  carve(a, 0, work, &w);
  ur__tbe_args in = *a;
  in.out = w.flat;
  in.out_base = a->flat_base;
  in.out_dtype = UR_DTYPE_F32;
  in.inverse = NULL;
  ur__parallel_for((size_t)a->bags, 256, cpu_forward_range, &in);
  expand_job j = {a, w.flat, NULL};
  ur__parallel_for((size_t)a->num_features, 1, cpu_expand_range, &j);
  return UR_STATUS_OK;
}

/* ---- backward ---- */

/* The arguments the sort and the reduction read: the VBE gradient collapsed to the flat bags
 * first, when there is one (collapse 0: it is in the workspace already). */
static void flat_args(const ur__tbe_args *a, const cpu_work *w, int collapse, ur__tbe_args *in) {
  *in = *a;
  if (!a->inverse) return;
  if (collapse) {
    memset(w->flat, 0, sizeof(float) * (size_t)a->flat_numel);
    expand_job ej = {a, NULL, w->flat};
    ur__parallel_for((size_t)a->num_features, 1, cpu_collapse_range, &ej);
  }
  in->grad = w->flat;
  in->out_base = a->flat_base;
  in->out_dtype = UR_DTYPE_F32;
  in->inverse = NULL;
}

/* Sorted keys and their segments (distinct rows; skipped ids, keyed total_keys, are left out). */
static void cpu_segments(bwd_job *j, cpu_work *w) {
  const ur__tbe_args *a = j->a;
  uint64_t *k = w->k, *tk = w->tk;
  int64_t *v = w->v, *tv = w->tv;
  j->bag_of = w->bag_of;
  j->seg = w->seg;
  j->keys = k;
  j->idx = v;
  ur__parallel_for((size_t)a->bags, 256, cpu_keys_range, j);
  ur__radix_sort(&k, &v, &tk, &tv, a->n, a->key_bits);
  j->keys = k;
  j->idx = v;
  int64_t ns = 0;
  for (int64_t i = 0; i < a->n && k[i] != (uint64_t)a->total_keys; i++)
    if (i == 0 || k[i] != k[i - 1]) j->seg[ns++] = i;
  int64_t end = 0;
  while (end < a->n && k[end] != (uint64_t)a->total_keys) end++;
  j->seg[ns] = end;
  j->nseg = ns;
  w->head->nseg = ns;
  w->head->second = k != w->k;
}

/* The first half of a backward, the step's and the sparse gradient's: the workspace carved,
 * the gradient collapsed to flat bags, the keys sorted into segments.  j reads in. */
static void cpu_sort(const ur__tbe_args *a, const ur__tbe_hyper *h, void *work, cpu_work *w,
                     ur__tbe_args *in, bwd_job *j) {
  carve(a, 1, work, w);
  flat_args(a, w, 1, in);
  *j = (bwd_job){.a = in, .h = h};
  cpu_segments(j, w);
}

static ur_status cpu_backward(void *stream, const ur__tbe_args *a, const ur__tbe_hyper *h,
                              void *work) {
  /* a guard holds the step back; the row sums (ur_tbe_row_sums) are written all the same, for
   * the other ranks' column shards add them */
  if (!h->sums_only && ur__optim_gated(&h->k)) return UR_STATUS_OK;
  ur__tbe_hyper now = ur__tbe_hyper_now(h);
  cpu_work w;
  ur__tbe_args in;
  bwd_job j;
  cpu_sort(a, &now, work, &w, &in, &j);
  ur__parallel_for((size_t)j.nseg, 64, cpu_reduce_range, &j);
  return UR_STATUS_OK;
}

static ur_status cpu_sparse_count(void *stream, const ur__tbe_args *a, void *work,
                                  int64_t *counts) {
  cpu_work w;
  ur__tbe_args in;
  bwd_job j;
  cpu_sort(a, NULL, work, &w, &in, &j);
  memset(counts, 0, sizeof(int64_t) * (size_t)a->num_tables);
  for (int64_t k = 0; k < j.nseg; k++) counts[table_of_key(&in, j.keys[j.seg[k]])]++;
  return UR_STATUS_OK;
}

/* Reads the sort sparse_count left in the workspace. */
static ur_status cpu_sparse_write(void *stream, const ur__tbe_args *a, void *work,
                                  const int64_t *counts, int64_t *rows, float *grads) {
  cpu_work w;
  carve(a, 1, work, &w);
  int32_t T = a->num_tables;
  int64_t *ustart = malloc(sizeof(int64_t) * 2 * (size_t)T);
  if (!ustart) return ur__error(UR_STATUS_OOM, "tbe: out of host memory");
  int64_t *gbase = ustart + T, u = 0, g = 0;
  for (int32_t t = 0; t < T; t++) {
    ustart[t] = u;
    gbase[t] = g;
    u += counts[t];
    g += counts[t] * a->tables[t].dim;
  }
  ur__tbe_args in;
  flat_args(a, &w, 0, &in);
  bwd_job j = {&in, NULL, w.head->second ? w.tk : w.k, w.head->second ? w.tv : w.v, w.bag_of,
               w.seg, w.head->nseg, rows, grads, ustart, gbase};
  ur__parallel_for((size_t)j.nseg, 64, cpu_reduce_range, &j);
  free(ustart);
  return UR_STATUS_OK;
}

/* ---- the plain gather ---- */

typedef struct gather_job {
  const char *src;
  const int64_t *ids;
  char *out;
  size_t row_bytes;
  int64_t rows;
  int64_t bad;
} gather_job;

static void gather_range(void *ctx, size_t i0, size_t i1) {
  gather_job *j = ctx;
  for (size_t i = i0; i < i1; i++) {
    int64_t id = j->ids[i];
    if (id < 0 || id >= j->rows) {
      __atomic_store_n(&j->bad, (int64_t)i, __ATOMIC_RELAXED);
      continue;
    }
    memcpy(j->out + i * j->row_bytes, j->src + (size_t)id * j->row_bytes, j->row_bytes);
  }
}

static ur_status cpu_gather_rows(void *stream, const void *src, int64_t src_rows,
                                 size_t row_bytes, const int64_t *ids, int64_t n, void *out) {
  gather_job j = {src, ids, out, row_bytes, src_rows, -1};
  ur__parallel_for((size_t)n, 1024, gather_range, &j);
  if (j.bad >= 0)
    return ur__error(UR_STATUS_INVALID, "gather_rows: ids[%lld] = %lld; expected 0..%lld",
                     (long long)j.bad, (long long)ids[j.bad], (long long)src_rows - 1);
  return UR_STATUS_OK;
}

/* ---- access counters ---- */

typedef struct decay_job {
  int32_t *c;
  double factor;
} decay_job;

static void decay_range(void *ctx, size_t i0, size_t i1) {
  decay_job *j = ctx;
  for (size_t i = i0; i < i1; i++) j->c[i] = (int32_t)floor((double)j->c[i] * j->factor);
}

static ur_status cpu_decay_counts(void *stream, int32_t *c, int64_t n, double factor) {
  decay_job j = {c, factor};
  ur__parallel_for((size_t)n, 65536, decay_range, &j);
  return UR_STATUS_OK;
}

/* ---- row swaps ---- */

static void swap_range(void *ctx, size_t k0, size_t k1) {
  const ur__tbe_swap *s = ctx;
  for (size_t k = k0; k < k1; k++) {
    int64_t x = s->ids[k], y = s->ids[s->n + (int64_t)k], px = s->perm[x], py = s->perm[y];
    for (int32_t j = 0; j < s->ntensors; j++) {
      size_t rb = s->row_bytes[j];
      uint32_t *a = (uint32_t *)(s->base[j] + (size_t)px * rb), *b = (uint32_t *)(s->base[j] + (size_t)py * rb);
      for (size_t w = 0; w < rb / 4; w++) {
        uint32_t tmp = a[w];
        a[w] = b[w];
        b[w] = tmp;
      }
    }
    s->perm[x] = py;
    s->perm[y] = px;
  }
}

static ur_status cpu_swap_rows(void *stream, const ur__tbe_swap *s) {
  (void)stream;
  ur__parallel_for((size_t)s->n, 256, swap_range, (void *)s); /* pairs share no row */
  return UR_STATUS_OK;
}

const ur_tbe_ops ur__cpu_tbe_ops = {
    .work_bytes = cpu_work_bytes,
    .forward = cpu_forward,
    .backward = cpu_backward,
    .sparse_count = cpu_sparse_count,
    .sparse_write = cpu_sparse_write,
    .gather_rows = cpu_gather_rows,
    .decay_counts = cpu_decay_counts,
    .swap_rows = cpu_swap_rows,
};
