/* tbe_plan.h: the embedding collection's plan, shared by the collection (table.c, tbe.c), the
 * CPU reference (tbe_cpu.c) and the kernels (kernels/tbe.cu): the descriptors the core lays
 * out once, the arguments of one call, and the arithmetic both backends must do the same way
 * (the tables' optimizer steps on core/optim_plan.h's constants, stochastic rounding), written
 * once so they cannot drift apart.
 *
 * Every float operation here is spelled with UR_F* so that nvcc cannot fuse a multiply and an
 * add into one fma (the CPU build has -ffp-contract=off): with the same summation order the
 * two backends then give the same bits. */
#ifndef UR_TBE_PLAN_H
#define UR_TBE_PLAN_H

#include <stdint.h>
#include <string.h>
#include "core/half.h"
#include "core/optim_plan.h"
#include "core/philox.h"
#include "uvmrec.h"

#ifdef __CUDA_ARCH__
#define UR_FADD(a, b) __fadd_rn((a), (b))
#define UR_FSUB(a, b) __fsub_rn((a), (b))
#define UR_FMUL(a, b) __fmul_rn((a), (b))
#define UR_FDIV(a, b) __fdiv_rn((a), (b))
#define UR_FSQRT(a) __fsqrt_rn(a)
#else
#define UR_FADD(a, b) ((a) + (b))
#define UR_FSUB(a, b) ((a) - (b))
#define UR_FMUL(a, b) ((a) * (b))
#define UR_FDIV(a, b) ((a) / (b))
#define UR_FSQRT(a) sqrtf(a)
#endif

#define UR_TBE_MAX_DIM 1024
#define UR_TBE_NO_BAD INT64_MAX /* flags[0] when no id was out of bounds */

/* One table as the kernels see it. */
typedef struct ur__tbe_table {
  void *weights;           /* rows x dim elements of dtype */
  float *state1, *state2;  /* optimizer state, NULL when the optimizer has none */
  int64_t rows;
  int64_t key_base;        /* the key of row 0 in the collection's row-key space */
  int32_t dim, dtype, pooling;
  /* Stochastic rounding draws by the table's index and each element's place in it: a shard
   * by its logical table's, so that it rounds as the unsharded table would (element (r, c)
   * at sr_row0 + r, sr_col0 + c of rows of sr_pitch). */
  int32_t index, sr_pitch, sr_col0;
  int64_t sr_row0;
  /* Access statistics and layout (counters.c, layout.c); NULL: off, and the kernels take
   * the plain path.  perm[id] is the physical row holding row id; counts[id] counts reads. */
  const int64_t *perm;
  int32_t *counts;
  /* A cached table (cache.c): the row id each slot storage row holds, which
   * stochastic rounding draws by (so cached rows round as the table's own would); or NULL. */
  const int64_t *row_ids;
  /* Rowwise Adagrad over column shards (ur_tbe_set_row_sums): the whole row's sum of squared
   * gradients, f32 by row id (as stochastic rounding counts them), which the step reads instead
   * of its own columns' sum and divides by row_dim, the whole row's columns; or NULL. */
  float *row_sums;
  int32_t row_dim;
  /* Physical rows at or past it are far: a managed table's rows outside the leading run its
   * hints keep on the GPU, every row of a host table (0), none of an HBM table's (rows).  Only
   * the far rows' copies (ur__tbe_far) look at it; it never changes a result. */
  int64_t far_from;
} ur__tbe_table;

/* The far rows' copies (ur_tbe_set_far_rows, far.c): a forward that fills them copies each far
 * row it reads, the first time, into rows (up to cap of them, row_bytes apart), keyed by the
 * row's key (key_base + id) in an open-addressed map of mask + 1 slots; the backward that uses
 * them steps a far row from its copy instead of reading it over the host link again, and writes
 * the stepped row to its copy as well as to the row.  The copies are the rows as that forward
 * read them, and nothing writes a row between it and the backward but the backward (the
 * collection's calls that write rows or change a layout drop them: table.c, tbe.c), so a step
 * from a copy is the step from the row: the same bits.
 *
 * Early copies (ur_tbe_far_prefetch): the next batch's far rows copied into another such map
 * while the current step computes.  A row the current forward read (in `cur`'s map) may still be
 * stepped by its backward, so it is not read then: its pair (where it goes here, where its copy
 * is in cur) waits in pairs, and the forward that takes these copies first copies each pair's
 * row from cur's copy, stepped by then (far_patch, tbe.h).  A row of the last step's map
 * (`prior`, while its copies may still be going home) is copied from there, its pair at the
 * top of pairs (the cap - 1 - q-th).  taken[2] is how many copies were made before that
 * forward (they are complete: the forward reads them instead of the rows).
 *
 * Write-behind (ur_tbe_set_far_behind): the backward writes a stepped row that has a copy to
 * the copy only, and far.c writes every copy home (homes[at]: where its row is) on a stream of
 * its own behind the step.  Until that is done the copies are the rows: the next forward reads a far
 * row it finds no copy of in its own map from the last backward's map (`prior`), and every
 * other reader or writer of the rows waits for it (far.c). */
typedef struct ur__tbe_far {
  unsigned long long *keys; /* [mask + 1]: a copied row's key + 1, 0 where free */
  int32_t *at;              /* [mask + 1]: where its copy is in rows, -1 when none had room */
  char *rows;               /* [cap] copies */
  int32_t *taken;           /* [UR__FAR_COUNTS]: the counts below */
  int32_t *pairs;           /* [2 cap]: (at here, at in cur) of the rows copied from cur, from
                             * the bottom; (at here, at in prior) from the top */
  int64_t *loads;           /* [2 cap]: (at here | bytes << 32, the row's address at home) of
                             * the rows an early copy reads over the link */
  int64_t *homes;           /* [2 cap]: each copy's (bytes, address at home), where its row is
                             * written home from (ur_tbe_set_far_behind) */
  int64_t mask;
  int32_t cap, row_bytes;
  int32_t fill, use;        /* 1: the forward fills them; the backward reads them */
  int32_t behind;           /* backward: rows with a copy are stepped there only; far.c writes
                             * the copies home behind the step */
} ur__tbe_far;

#define UR_TBE_FAR_PROBES 32 /* slots a key is looked for in before it goes uncopied */

/* ur__tbe_far's counts: taken[k]. */
enum {
  UR__FAR_ASKED,       /* copies asked for (past cap: not made) */
  UR__FAR_UNPLACED,    /* lookups that found no free slot in UR_TBE_FAR_PROBES */
  UR__FAR_EARLY,       /* copies made before the forward (early ones) */
  UR__FAR_PAIRS,       /* pairs waiting, from cur (the bottom of pairs) */
  UR__FAR_LOADS,       /* loads waiting */
  UR__FAR_PRIOR_PAIRS, /* pairs from prior (the top of pairs) */
  UR__FAR_COUNTS
};

/* The map's first slot for a key. */
UR_HD uint64_t ur__tbe_far_slot(const ur__tbe_far *f, uint64_t key) {
  return ur__mix64(key) & (uint64_t)f->mask;
}

typedef struct ur__tbe_feature {
  int32_t table, dim;
  int64_t col;             /* first output column, pooled collections */
} ur__tbe_feature;

/* The optimizer step: the update's constants (core/optim_plan.h, computed once on the host)
 * and its stochastic rounding. */
typedef struct ur__tbe_hyper {
  ur__optim_consts k;
  int32_t sr;              /* 1: stochastic rounding of f16/bf16 rows */
  uint64_t sr_seed;        /* the collection's seed */
  uint64_t sr_key;         /* the step's Philox key, from the seed and the update's number
                            * (ur__tbe_hyper_now); each table mixes in its index */
  /* 1: no step (ur_tbe_row_sums): each table with row sums writes there, for every row the
   * call reads, the sum over its columns of the squared gradient its step would take (clipped,
   * with weight decay); rows, state and the other tables are left alone. */
  int32_t sums_only;
  int32_t far_behind;      /* 1: a row with a far copy is written to its copy only (far.behind) */
} ur__tbe_hyper;

/* h as the step runs where it runs: under a guard, the update's number is the collection's
 * count less the skipped steps its gate still counts, for Adam's bias terms (ur__optim_now) and
 * stochastic rounding's key alike, so that a run that skipped a batch steps and rounds as one
 * that never saw it. */
UR_HD ur__tbe_hyper ur__tbe_hyper_now(const ur__tbe_hyper *h) {
  ur__tbe_hyper r = *h;
  r.k = ur__optim_now(&h->k);
  int64_t step = h->k.step;
  if (h->k.gate && h->k.gate[2] > 0) step -= h->k.gate[2];
  r.sr_key = h->sr_seed ^ ((uint64_t)step * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull);
  return r;
}

/* One call.  Pointers are in memory the running backend can read (device or host). */
typedef struct ur__tbe_args {
  const ur__tbe_table *tables;
  const ur__tbe_feature *features;
  int32_t num_tables, num_features;
  int32_t bounds;          /* ur_tbe_bounds */
  int32_t pooled;          /* 0: pooling none (one output row per value) */
  const int64_t *values, *offsets;
  const float *weights;    /* NULL: every weight is 1 */
  int64_t n, bags;
  int64_t batch;           /* bags per feature; 0 under VBE */
  const int64_t *bag_start;  /* VBE: [F + 1], feature f's first bag; NULL: f * batch */
  const int64_t *out_base;   /* VBE flat output: [F], feature f's first element; NULL: col */
  int64_t out_stride;      /* elements from one sample's output row to the next */
  int32_t out_dtype;       /* of out and grad: f32 or bf16 */
  int32_t dim;             /* pooling none: the common dim */
  void *out;               /* forward output */
  const void *grad;        /* backward: the gradient of the output, in out's layout */
  /* VBE expanded to the full batch: out / grad are [full_batch, out_stride] and the pooled
   * bags go through flat, laid out as with out_base. */
  const int64_t *inverse;  /* [F * full_batch] */
  int64_t full_batch;
  const int64_t *flat_base;  /* [F] as out_base, for the flat buffer */
  int64_t flat_numel;
  int64_t *flags;          /* [2]: first out-of-bounds value index, ids skipped */
  const ur__tbe_table *host_tables; /* the descriptors in host memory, for launch decisions */
  int32_t max_dim;         /* the widest table */
  int32_t halves;          /* 1: some table stores f16 or bf16 */
  int64_t total_keys;      /* keys of valid rows are below it; it marks a skipped id */
  int32_t key_bits;        /* bits that hold total_keys */
  int32_t atomic;          /* backward: SGD by atomic adds, no sort (tbe.c says when it may) */
  ur__tbe_far far;         /* the far rows' copies (GPU only; fill and use 0: none) */
  /* forward: the last backward's copies while they are written home behind it (use 1): a far
   * row the forward reads from home is read from its copy there instead.  far_prefetch: the
   * last step's map, whose copies early copies take (the current map's aside) */
  ur__tbe_far prior;
} ur__tbe_args;

/* ---- layout ---- */

/* The feature that bag belongs to, of num_features laid out as ur__tbe_bag_of counts. */
UR_HD int32_t ur__tbe_feature_at(const int64_t *bag_start, int64_t batch, int32_t num_features,
                                 int64_t bag) {
  if (!bag_start) return (int32_t)(bag / batch);
  int32_t lo = 0, hi = num_features; /* bag_start[lo] <= bag < bag_start[hi] */
  while (hi - lo > 1) {
    int32_t mid = (lo + hi) / 2;
    if (bag_start[mid] <= bag) lo = mid;
    else hi = mid;
  }
  return lo;
}

UR_HD int32_t ur__tbe_feature_of(const ur__tbe_args *a, int64_t bag) {
  return ur__tbe_feature_at(a->bag_start, a->batch, a->num_features, bag);
}

/* Feature f's first bag (f = F: the end of the last): bag_start[f] when the batch varies per
 * feature (VBE), else f * batch.  The cache's lookup counts the same way. */
UR_HD int64_t ur__tbe_bag_of(const int64_t *bag_start, int64_t batch, int32_t f) {
  return bag_start ? bag_start[f] : (int64_t)f * batch;
}

UR_HD int64_t ur__tbe_first_bag(const ur__tbe_args *a, int32_t f) {
  return ur__tbe_bag_of(a->bag_start, a->batch, f);
}

/* The element of the output (or of its gradient) where bag's pooled row begins. */
UR_HD int64_t ur__tbe_out_at(const int64_t *base, int64_t stride, int32_t f,
                             const ur__tbe_feature *feat, int64_t sample) {
  return base ? base[f] + sample * feat->dim : sample * stride + feat->col;
}

/* Bag `bag`'s values [*b, *e) from offsets, clamped to [0, n] so that bad offsets cannot make
 * a kernel read outside the values (offsets are validated on the CPU, trusted on the GPU).
 * Both collections (tbe, qtbe) read their bags through it, on both backends. */
UR_HD void ur__tbe_bag_span(const int64_t *offsets, int64_t n, int64_t bag, int64_t *b,
                            int64_t *e) {
  int64_t s = offsets[bag], t = offsets[bag + 1];
  s = s < 0 ? 0 : s > n ? n : s;
  t = t < s ? s : t > n ? n : t;
  *b = s;
  *e = t;
}

/* An id out of its table's range at value i (both collections, both backends): flags[0] keeps
 * the first such value (it starts at UR_TBE_NO_BAD), flags[1] counts them; the bounds check
 * reads them back after the call. */
UR_HD void ur__tbe_note_bad(int64_t *flags, int64_t i) {
#ifdef __CUDA_ARCH__
  atomicMin((unsigned long long *)flags, (unsigned long long)i);
  atomicAdd((unsigned long long *)(flags + 1), 1ull);
#else
  int64_t cur = __atomic_load_n(&flags[0], __ATOMIC_RELAXED);
  while (i < cur &&
         !__atomic_compare_exchange_n(&flags[0], &cur, i, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  __atomic_add_fetch(&flags[1], 1, __ATOMIC_RELAXED);
#endif
}

/* Floats v[0, dim) into an output of dtype (f32 or bf16) from element at: the CPU references'
 * store of a pooled or gathered row (the kernels store E elements at a time). */
UR_HD void ur__tbe_store_out(void *out, int32_t dtype, int64_t at, const float *v, int32_t dim) {
  if (dtype == UR_DTYPE_F32) {
    memcpy((float *)out + at, v, sizeof(float) * (size_t)dim);
    return;
  }
  uint16_t *o = (uint16_t *)out + at;
  for (int32_t c = 0; c < dim; c++) o[c] = ur__f32_to_bf16(v[c]);
}

/* The physical row of row id (ids are checked by the caller). */
UR_HD int64_t ur__tbe_phys(const ur__tbe_table *tb, int64_t id) {
  return tb->perm ? tb->perm[id] : id;
}

#define UR_TBE_COUNT_MAX 0x40000000 /* counters stop growing here (decay keeps them below) */

/* ---- numbers (the conversions themselves are core/half.h's) ---- */

UR_HD float ur__tbe_half_f32(uint16_t h, int32_t dtype) {
  return dtype == UR_DTYPE_BF16 ? ur__bf16_to_f32(h) : ur__f16_to_f32(h);
}

/* The float path of ur__tbe_round_sr (below): every x, through the neighbours' values. */
UR_HD uint16_t ur__tbe_round_sr_float(float x, int32_t dtype, uint32_t r) {
  uint16_t q = dtype == UR_DTYPE_BF16 ? ur__f32_to_bf16(x) : ur__f32_to_f16(x);
  float ax = x < 0 ? -x : x;
  if (!(ax == ax)) return q;
  uint16_t sign = (uint16_t)(q & 0x8000u), m = (uint16_t)(q & 0x7fffu);
  float a = ur__tbe_half_f32(m, dtype);
  if (a == ax) return q;
  uint16_t lo = a < ax ? m : (uint16_t)(m - 1), hi = (uint16_t)(lo + 1);
  float flo = ur__tbe_half_f32(lo, dtype), fhi = ur__tbe_half_f32(hi, dtype);
  float p = UR_FDIV(UR_FSUB(ax, flo), UR_FSUB(fhi, flo)); /* inf - flo gives p = 0 */
  float u = (float)(r >> 8) * (1.0f / 16777216.0f);
  return (uint16_t)(sign | (u < p ? hi : lo));
}

/* Stochastic rounding of x to f16 or bf16 with the random word r: rounds away from zero with
 * probability (|x| - lo) / (hi - lo), where lo and hi are the neighbours around |x|, so the
 * stored value is x in expectation.  NaN and exactly representable values round as usual.
 * Normal x whose neighbours are both finite take integer steps: lo is x's bits truncated, hi the
 * next, and p is exactly the dropped bits over their range, so u < p (u = (r >> 8) / 2^24) is
 * (r >> 19) < k for f16's 13 dropped bits k, (r >> 16) < k for bf16's 16: the float path's bits
 * (spec/tbe_spec.lua compares the two), without its conversions and division. */
UR_HD uint16_t ur__tbe_round_sr(float x, int32_t dtype, uint32_t r) {
  uint32_t bits = ur__f32_bits(x), ax = bits & 0x7fffffffu, sgn = (bits >> 16) & 0x8000u;
  /* bf16: f32's least normal up to bf16's largest finite (0x7f7f << 16), whose next is inf;
   * f16: 2^-14 (its least normal) up to 65504 (its largest finite), and 0x38000000 is the
   * exponents' bias difference, (127 - 15) << 23 */
  if (dtype == UR_DTYPE_BF16) {
    if (ax >= 0x00800000u && ax < 0x7f7f0000u)
      return (uint16_t)(sgn | ((ax >> 16) + ((r >> 16) < (ax & 0xffffu))));
  } else if (ax >= 0x38800000u && ax < 0x477fe000u) {
    return (uint16_t)(sgn | (((ax - 0x38000000u) >> 13) + ((r >> 19) < (ax & 0x1fffu))));
  }
  return ur__tbe_round_sr_float(x, dtype, r);
}

UR_HD uint64_t ur__tbe_sr_key(uint64_t step_key, int32_t table) {
  return step_key + (uint64_t)(table + 1) * 0x9E3779B97F4A7C15ull;
}

/* ---- the optimizers ---- */

/* Clipping, then L2 weight decay. */
UR_HD float ur__tbe_grad_adjust(const ur__tbe_hyper *h, float g, float w) {
  const ur__optim_consts *k = &h->k;
  if (k->max_grad > 0) g = g > k->max_grad ? k->max_grad : g < -k->max_grad ? -k->max_grad : g;
  if (k->weight_decay != 0) g = UR_FADD(g, UR_FMUL(k->weight_decay, w));
  return g;
}

/* Rowwise Adagrad's new row state from the old one and sq, the sum of the squared gradient
 * over the table's own columns; for a table with row sums (a column shard) the whole row's sum
 * there (row sid) replaces sq and the mean is over the whole row.  Both backends step a row
 * through here, and ur_tbe_row_sums writes the sq it would take. */
UR_HD float ur__tbe_rowwise_state(const ur__tbe_table *tb, int64_t sid, float state, float sq) {
  float n = (float)tb->dim;
  if (tb->row_sums) {
    sq = tb->row_sums[sid];
    n = (float)tb->row_dim;
  }
  return UR_FADD(state, UR_FDIV(sq, n));
}

/* Rowwise Adagrad's step multiplier for a row whose (updated) state is rs: lr / (sqrt(rs) + eps),
 * formed once a row (as FBGEMM's kernels do) rather than a division an element. */
UR_HD float ur__tbe_rowwise_mult(const ur__tbe_hyper *h, float rs) {
  return UR_FDIV(h->k.lr, UR_FADD(UR_FSQRT(rs), h->k.eps));
}

/* One element's step.  s1 / s2 point at its state (rowwise Adagrad: s1 is the row's multiplier
 * from ur__tbe_rowwise_mult, and is not written here). */
UR_HD float ur__tbe_step_elem(const ur__tbe_hyper *h, float w, float g, float *s1, float *s2) {
  const ur__optim_consts *k = &h->k;
  switch (k->kind) {
  case UR_OPTIM_KIND_SGD: return UR_FSUB(w, UR_FMUL(k->lr, g));
  case UR_OPTIM_KIND_ROWWISE_ADAGRAD:
    return UR_FSUB(w, UR_FMUL(*s1, g));
  case UR_OPTIM_KIND_ADAGRAD: {
    float s = UR_FADD(*s1, UR_FMUL(g, g));
    *s1 = s;
    return UR_FSUB(w, UR_FDIV(UR_FMUL(k->lr, g), UR_FADD(UR_FSQRT(s), k->eps)));
  }
  default: {
    float m = UR_FADD(UR_FMUL(k->beta1, *s1), UR_FMUL(k->one_minus_beta1, g));
    float v = UR_FADD(UR_FMUL(k->beta2, *s2), UR_FMUL(k->one_minus_beta2, UR_FMUL(g, g)));
    *s1 = m;
    *s2 = v;
    float mh = UR_FDIV(m, k->bias1), vh = UR_FDIV(v, k->bias2);
    return UR_FSUB(w, UR_FDIV(UR_FMUL(k->lr, mh), UR_FADD(UR_FSQRT(vh), k->eps)));
  }
  }
}

#endif
