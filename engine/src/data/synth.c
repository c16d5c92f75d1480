/* synth.c: the synthetic data generator: the spec's checks and expansion, and the dispatch
 * to the outputs' backend (synth_cpu.c, kernels/synth.cu).  The per-sample work is synth.h. */
#include <stdlib.h>
#include <string.h>
#include "data/data.h"
#include "data/synth.h"

size_t ur_sizeof_synth_table(void) { return sizeof(ur_synth_table); }
size_t ur_sizeof_synth_spec(void) { return sizeof(ur_synth_spec); }

ur_status ur_synth_check(const ur_synth_spec *s) {
  if (!s) return ur__null(__func__, "spec");
  if (s->num_tables < 0 || s->num_tables > UR_SYNTH_MAX_TABLES)
    return ur__error(UR_STATUS_INVALID, "synthetic: %d tables; expected 0..%d (UR_SYNTH_MAX_TABLES)",
                     (int)s->num_tables, UR_SYNTH_MAX_TABLES);
  if (s->num_tables > 0 && !s->tables)
    return ur__error(UR_STATUS_INVALID, "synthetic: %d tables but no tables array", (int)s->num_tables);
  if (s->num_dense < 0 || s->num_dense > 4096)
    return ur__error(UR_STATUS_INVALID, "synthetic: %d dense features; expected 0..4096",
                     (int)s->num_dense);
  int64_t h = 0;
  for (int t = 0; t < s->num_tables; t++) {
    const ur_synth_table *tb = &s->tables[t];
    if (tb->rows < 1 || tb->rows > (1ll << 40))
      return ur__error(UR_STATUS_INVALID, "synthetic: table %d has %lld rows; expected 1..2^40",
                       t + 1, (long long)tb->rows);
    if (!(tb->zipf >= 0 && tb->zipf <= 10))
      return ur__error(UR_STATUS_INVALID,
                       "synthetic: table %d has skew %g; expected a Zipf exponent in (0, 10] or 0 "
                       "(uniform)",
                       t + 1, tb->zipf);
    if (tb->hot_min < 0 || tb->hot_max < tb->hot_min || tb->hot_max > 4096 || tb->hot_max < 1)
      return ur__error(UR_STATUS_INVALID,
                       "synthetic: table %d has ids per sample %d..%d; expected 0 <= min <= max, "
                       "1 <= max <= 4096",
                       t + 1, (int)tb->hot_min, (int)tb->hot_max);
    if (tb->id_space < 0 || tb->id_space > (1ll << 40))
      return ur__error(UR_STATUS_INVALID,
                       "synthetic: table %d has an id space of %lld; expected 1..2^40, or 0 (its "
                       "rows)", t + 1, (long long)tb->id_space);
    if (!(tb->signal >= 0 && tb->signal < 100))
      return ur__error(UR_STATUS_INVALID, "synthetic: table %d has signal %g; expected 0..100",
                       t + 1, (double)tb->signal);
    h += tb->hot_max;
  }
  if (h > 1 << 20)
    return ur__error(UR_STATUS_INVALID, "synthetic: %lld ids per sample at most; expected <= 2^20",
                     (long long)h);
  if (!(s->drift >= 0 && s->drift <= 1e6))
    return ur__error(UR_STATUS_INVALID, "synthetic: drift %g; expected 0 (none) to 1e6 ranks a sample",
                     s->drift);
  if (s->groups < 0)
    return ur__error(UR_STATUS_INVALID, "synthetic: groups %lld; expected >= 0",
                     (long long)s->groups);
  return UR_STATUS_OK;
}

static uint64_t gcd(uint64_t a, uint64_t b) {
  while (b) {
    uint64_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}

ur_status ur__synth_expand(const ur_synth_spec *s, ur__synth *x) {
  memset(x, 0, sizeof *x);
  ur_status st = ur_synth_check(s);
  if (st) return st;
  x->T = s->num_tables;
  x->D = s->num_dense;
  x->seed = s->seed;
  x->dense_signal = s->dense_signal;
  x->bias = s->bias;
  x->groups = s->groups;
  x->drift = s->drift;
  if (s->num_tables > 0 && !(x->t = calloc((size_t)s->num_tables, sizeof *x->t)))
    return ur__error(UR_STATUS_OOM, "synthetic: out of host memory for %d tables", (int)s->num_tables);
  for (int j = 0; j < 64; j++) x->dw[j] = ur__unorm(ur_philox((uint64_t)j, ur__skey(s->seed, UR__S_DW, 0)));
  for (int t = 0; t < s->num_tables; t++) {
    const ur_synth_table *in = &s->tables[t];
    ur__synth_tab *o = &x->t[t];
    o->rows = in->id_space > 0 ? in->id_space : in->rows; /* the range ids are drawn from */
    o->col0 = x->H;
    o->hot_min = in->hot_min;
    o->hot_max = in->hot_max;
    o->weighted = in->weighted;
    o->signal = in->signal;
    o->zipf = in->zipf > 0;
    o->s = in->zipf;
    if (o->zipf) {
      o->hx1 = ur__zH(o->s, 1.5) - 1.0;
      o->hn = ur__zH(o->s, (double)o->rows + 0.5);
      o->sv = 2.0 - ur__zHinv(o->s, ur__zH(o->s, 2.5) - ur__zh(o->s, 2.0));
    }
    /* A multiplier coprime to rows scatters the hot ranks over the table. */
    uint64_t rows = (uint64_t)o->rows, a = 0x9E3779B1ull % rows;
    if (a == 0) a = 1;
    while (gcd(a, rows) != 1) a++;
    o->pa = rows == 1 ? 0 : a;
    o->pb = ur_philox((uint64_t)t, ur__skey(s->seed, 99, 0)).v[0] % rows;
    x->H += in->hot_max;
  }
  return UR_STATUS_OK;
}

void ur__synth_release(ur__synth *x) {
  if (!x) return;
  free(x->t);
  x->t = NULL;
}

static ur_status check_out(const ur_tensor *t, const char *what, ur_dtype dt, int64_t n,
                           int64_t inner, const ur_tensor *ref) {
  if (!t) return UR_STATUS_OK;
  if (ur_tensor_dtype(t) != dt || ur_tensor_numel(t) != n * inner || ur_tensor_dim(t, 0) != n)
    return ur__error(UR_STATUS_INVALID,
                     "synthetic: %s must be %s with %lld rows of %lld; got %s with %lld elements",
                     what, ur_dtype_name(dt), (long long)n, (long long)inner,
                     ur_dtype_name(ur_tensor_dtype(t)), (long long)ur_tensor_numel(t));
  if (ref && (ur_tensor_place(t) != ur_tensor_place(ref) || ur_tensor_device(t) != ur_tensor_device(ref)))
    return ur__error(UR_STATUS_INVALID, "synthetic: %s is in another placement than dense", what);
  return UR_STATUS_OK;
}

ur_status ur_synth_generate(ur_stream *s, const ur_synth_spec *spec, int64_t first, int64_t n,
                            ur_tensor *dense, ur_tensor *labels, ur_tensor *ids,
                            ur_tensor *weights, ur_tensor *lengths, ur_tensor *groups,
                            ur_tensor *probs) {
  UR__ARGS(spec, dense, labels, ids, lengths);
  ur__synth *x = malloc(sizeof *x);
  if (!x) return ur__error(UR_STATUS_OOM, "synthetic: out of host memory");
  ur_status st = ur__synth_expand(spec, x);
  if (!st && (first < 0 || n < 0 || first > (1ll << 51) - n))
    st = ur__error(UR_STATUS_INVALID, "synthetic: samples %lld.. (%lld) outside 0..2^51",
                   (long long)first, (long long)n);
  if (!st && (!dense || !labels || !ids || !lengths))
    st = ur__error(UR_STATUS_INVALID, "synthetic: dense, labels, ids and lengths are required");
  if (!st) st = check_out(dense, "dense", UR_DTYPE_F32, n, x->D, NULL);
  if (!st) st = check_out(labels, "labels", UR_DTYPE_F32, n, 1, dense);
  if (!st) st = check_out(ids, "ids", UR_DTYPE_I64, n, x->H, dense);
  if (!st) st = check_out(weights, "weights", UR_DTYPE_F32, n, x->H, dense);
  if (!st) st = check_out(lengths, "lengths", UR_DTYPE_I32, n, x->T, dense);
  if (!st) st = check_out(groups, "groups", UR_DTYPE_I64, n, 1, dense);
  if (!st) st = check_out(probs, "probs", UR_DTYPE_F32, n, 1, dense);
  if (st || !n) {
    ur__synth_release(x);
    free(x);
    return st;
  }
  /* The outputs share a placement (checked), and with it a backend. */
  const ur_backend *b = ur__tensor_backend(dense);
  int32_t dev = ur_tensor_device(dense), prev = 0;
  if (!(st = UR__NEED(b, synth, generate)) && !(st = ur__tensor_ready(b, dense)) &&
      !(st = ur__device_enter(b, dev, &prev))) {
    st = b->synth->generate(s ? s->handle : NULL, x, first, n, ur_tensor_data(dense),
                            ur_tensor_data(labels), ur_tensor_data(ids),
                            weights ? ur_tensor_data(weights) : NULL, ur_tensor_data(lengths),
                            groups ? ur_tensor_data(groups) : NULL,
                            probs ? ur_tensor_data(probs) : NULL);
    st = ur__device_leave(b, dev, prev, st);
  }
  ur__synth_release(x);
  free(x);
  return st;
}
