/* tbe.c: the embedding collection's calls: forward, backward (fused with the optimizer step),
 * the sparse gradient and the plain row gather; the checks of each call, whose errors name the
 * table, feature and sample; and their dispatch to the collection's backend (t->be->tbe:
 * tbe_cpu.c or kernels/tbe.cu).  The tables themselves (storage, descriptors) are table.c's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "embedding/table.h"

/* flags[0] = no bad id yet (read after a forward under bounds fatal). */
static ur_status reset_flags(ur_tbe *t, ur_stream *s) {
  return t->be->fill(s ? s->handle : NULL, ur_tensor_data(t->flags), 1, 8,
                     (uint64_t)UR_TBE_NO_BAD);
}

double ur_tbe_lr(const ur_tbe *t) {
  UR__ARGS_OR(NAN, t);
  return t->cfg.optim.lr;
}
int64_t ur_tbe_step(const ur_tbe *t) {
  UR__ARGS_OR(-1, t);
  return t->step;
}

ur_status ur_tbe_set_lr(ur_tbe *t, double lr) {
  UR__ARGS(t);
  if (!(isfinite(lr) && lr >= 0))
    return ur__error(UR_STATUS_INVALID, "tbe: lr %g; expected a finite value >= 0", lr);
  t->cfg.optim.lr = lr;
  return UR_STATUS_OK;
}

ur_status ur_tbe_set_out_dtype(ur_tbe *t, ur_dtype dtype) {
  UR__ARGS(t);
  ur_status st = ur__tbe_check_engine("tbe", t->cfg.device, t->cfg.bounds, dtype);
  if (!st) t->cfg.out_dtype = dtype;
  return st;
}

ur_status ur_tbe_set_step(ur_tbe *t, int64_t step) {
  UR__ARGS(t);
  if (step < 0)
    return ur__error(UR_STATUS_INVALID, "tbe: step %lld; expected >= 0", (long long)step);
  t->step = step;
  return UR_STATUS_OK;
}

ur_status ur_tbe_skipped(ur_tbe *t, int64_t *out) {
  UR__ARGS(t, out);
  /* after every stream's work: the forwards that count may have run on any */
  ur_status st = t->be->device_sync();
  return st ? st : ur_tensor_read(t->flags, 1, 1, out);
}

/* ---- checking a call ---- */

/* One call's arguments, and the host arrays they point into. */
typedef struct call {
  ur__tbe_args a;
  int64_t *vbe;             /* host: bag_start [F + 1], out_base [F], flat_base [F] */
  const ur_tensor *values, *offsets;
  int64_t vbe_rows;         /* VBE: sum of batch_f * dim_f */
} call;

static int reachable(const ur_tbe *t, const ur_tensor *x) {
  ur_place p = ur_tensor_place(x);
  if (t->home == UR_PLACE_DEVICE) return p != UR_PLACE_HOST && (p != UR_PLACE_DEVICE || ur_tensor_device(x) == t->cfg.device);
  return p != UR_PLACE_DEVICE;
}

static ur_status check_tensor(const ur_tbe *t, const ur_tensor *x, const char *what, ur_dtype d,
                              int32_t ndim) {
  if (ur_tensor_dtype(x) != d || ur_tensor_ndim(x) != ndim)
    return ur__error(UR_STATUS_INVALID, "tbe: %s is %s with %d dimensions; expected %s with %d",
                     what, ur_dtype_name(ur_tensor_dtype(x)), (int)ur_tensor_ndim(x),
                     ur_dtype_name(d), (int)ndim);
  if (!reachable(t, x))
    return ur__error(UR_STATUS_INVALID,
                     "tbe: %s is in %s memory%s, which the collection's %s cannot read; move it "
                     "with :to()",
                     what, ur_place_name(ur_tensor_place(x)),
                     ur_tensor_place(x) == UR_PLACE_DEVICE ? " of another GPU" : "",
                     t->home == UR_PLACE_DEVICE ? "GPU" : "CPU");
  return UR_STATUS_OK;
}

static ur_status check_shape2(const ur_tensor *x, const char *what, int64_t r, int64_t c) {
  if (ur_tensor_ndim(x) != 2 || ur_tensor_dim(x, 0) != r || ur_tensor_dim(x, 1) != c)
    return ur__error(UR_STATUS_INVALID, "tbe: %s has shape [%lld%s%lld]; expected [%lld, %lld]",
                     what, (long long)ur_tensor_dim(x, 0), ur_tensor_ndim(x) > 1 ? ", " : " ",
                     (long long)(ur_tensor_ndim(x) > 1 ? ur_tensor_dim(x, 1) : 0), (long long)r,
                     (long long)c);
  return UR_STATUS_OK;
}

static void fill_host_info(const ur_tbe *t, ur__tbe_args *a) {
  a->host_tables = t->tables;
  for (int32_t i = 0; i < t->names.T; i++) {
    if (t->tables[i].dim > a->max_dim) a->max_dim = t->tables[i].dim;
    if (t->tables[i].dtype != UR_DTYPE_F32) a->halves = 1;
  }
}

/* The checks and arguments forward and backward share; `o` is the output or its gradient. */
static ur_status prepare(ur_tbe *t, call *c, const ur_tensor *values, const ur_tensor *offsets,
                         const ur_tensor *weights, const int64_t *spk, const ur_tensor *inverse,
                         const ur_tensor *o, const char *oname) {
  memset(c, 0, sizeof *c);
  ur__tbe_args *a = &c->a;
  fill_host_info(t, a);
  ur_status st;
  if (!values || !offsets || (oname && !o))
    return ur__error(UR_STATUS_INVALID, "tbe: values, offsets%s%s are required",
                     oname ? " and " : "", oname ? oname : "");
  if ((st = ur__tbe_check_lost(t, -1, "tbe"))) return st;
  if ((st = check_tensor(t, values, "values", UR_DTYPE_I64, 1)) ||
      (st = check_tensor(t, offsets, "offsets", UR_DTYPE_I64, 1)) ||
      (weights && (st = check_tensor(t, weights, "weights", UR_DTYPE_F32, 1))) ||
      (inverse &&
       (st = check_tensor(t, inverse, "inverse_indices", UR_DTYPE_I64, ur_tensor_ndim(inverse)))))
    return st;
  if (oname && (st = check_tensor(t, o, oname, t->cfg.out_dtype, ur_tensor_ndim(o)))) return st;
  if (oname && t->home == UR_PLACE_DEVICE && (uintptr_t)ur_tensor_data(o) % 16)
    return ur__error(UR_STATUS_INVALID,
                     "tbe: %s starts %zu bytes past a 16-byte boundary (a view at an odd offset); "
                     "the GPU kernels move rows 16 bytes at a time",
                     oname, (size_t)((uintptr_t)ur_tensor_data(o) % 16));
  a->n = ur_tensor_numel(values);
  a->bags = ur_tensor_numel(offsets) - 1;
  if (a->bags < 0)
    return ur__error(UR_STATUS_INVALID, "tbe: offsets is empty; expected bags + 1 entries");
  if (weights && ur_tensor_numel(weights) != a->n)
    return ur__error(UR_STATUS_INVALID, "tbe: %lld weight%s for %lld value%s; expected one each",
                     (long long)ur_tensor_numel(weights), ur__s(ur_tensor_numel(weights)),
                     (long long)a->n, ur__s(a->n));
  /* the backward's windows step 32 values at a time in int32 (kernels/tbe.cu's seg_kernel) */
  if (t->home == UR_PLACE_DEVICE && (a->n > INT32_MAX - 64 || a->bags >= INT32_MAX))
    return ur__error(UR_STATUS_INVALID,
                     "tbe: %lld values in %lld bags; the GPU path takes at most 2^31 - 65 values "
                     "and fewer than 2^31 bags",
                     (long long)a->n, (long long)a->bags);
  c->values = values;
  c->offsets = offsets;
  a->num_tables = t->names.T;
  a->num_features = t->names.F;
  a->bounds = t->cfg.bounds;
  a->pooled = t->names.pooled;
  a->dim = t->names.dim;
  a->out_dtype = t->cfg.out_dtype;
  a->total_keys = t->total_keys;
  a->key_bits = t->key_bits;
  a->values = ur_tensor_data(values);
  a->offsets = ur_tensor_data(offsets);
  a->weights = weights ? ur_tensor_data(weights) : NULL;
  a->flags = ur_tensor_data(t->flags);
  a->out_stride = t->names.out_dim;
  if (inverse && !spk)
    return ur__error(UR_STATUS_INVALID,
                     "tbe: inverse_indices given without stride_per_key_per_rank (VBE needs both)");
  if (inverse && !t->names.pooled)
    return ur__error(UR_STATUS_INVALID, "tbe: pooling none takes no inverse indices");
  if (spk) {
    c->vbe = malloc(sizeof(int64_t) * (3 * (size_t)t->names.F + 1));
    if (!c->vbe) return ur__error(UR_STATUS_OOM, "tbe: out of host memory");
    int64_t *bs = c->vbe, *ob = c->vbe + t->names.F + 1;
    bs[0] = 0;
    for (int32_t f = 0; f < t->names.F; f++) {
      if (spk[f] < 0)
        return ur__error(UR_STATUS_INVALID, "tbe: feature '%s' has batch %lld; expected >= 0",
                         t->names.fnames[f], (long long)spk[f]);
      bs[f + 1] = bs[f] + spk[f];
      ob[f] = c->vbe_rows;
      c->vbe_rows += spk[f] * t->names.features[f].dim;
    }
    if (bs[t->names.F] != a->bags)
      return ur__error(UR_STATUS_INVALID,
                       "tbe: stride_per_key_per_rank sums to %lld bags but offsets hold %lld",
                       (long long)bs[t->names.F], (long long)a->bags);
    memcpy(ob + t->names.F, ob, sizeof(int64_t) * (size_t)t->names.F);
    a->bag_start = bs;
  } else {
    if (a->bags % t->names.F)
      return ur__error(UR_STATUS_INVALID,
                       "tbe: %lld bags do not split evenly over %d features; pass "
                       "stride_per_key_per_rank for a variable batch",
                       (long long)a->bags, (int)t->names.F);
    a->batch = a->bags / t->names.F;
  }
  if (!oname) return UR_STATUS_OK; /* ids only (ur_tbe_far_prefetch) */
  if (!t->names.pooled) return check_shape2(o, oname, a->n, t->names.dim);
  if (inverse) {
    int64_t m = ur_tensor_numel(inverse);
    if (m % t->names.F)
      return ur__error(UR_STATUS_INVALID,
                       "tbe: %lld inverse indices do not split evenly over %d features",
                       (long long)m, (int)t->names.F);
    a->full_batch = m / t->names.F;
    a->inverse = ur_tensor_data(inverse);
    a->flat_base = c->vbe + 2 * t->names.F + 1;
    a->flat_numel = c->vbe_rows;
    return check_shape2(o, oname, a->full_batch, t->names.out_dim);
  }
  if (spk) {
    a->out_base = c->vbe + t->names.F + 1;
    if (ur_tensor_ndim(o) != 1 || ur_tensor_numel(o) != c->vbe_rows)
      return ur__error(UR_STATUS_INVALID,
                       "tbe: %s holds %lld elements in %d dimensions; a VBE batch without "
                       "inverse indices gives a flat [%lld]",
                       oname, (long long)ur_tensor_numel(o), (int)ur_tensor_ndim(o),
                       (long long)c->vbe_rows);
    return UR_STATUS_OK;
  }
  return check_shape2(o, oname, a->batch, t->names.out_dim);
}

static void release(call *c) { free(c->vbe); }

/* The offsets (table.c checks them for both kinds of collection), then VBE's inverse indices;
 * where the CPU can read them. */
static ur_status check_offsets(const ur_tbe *t, const call *c) {
  ur_status st = ur__tbe_check_offsets(&t->names, c->a.offsets, c->a.bags, c->a.n,
                                       c->a.bag_start, c->a.batch);
  if (st) return st;
  if (c->a.inverse)
    for (int32_t f = 0; f < t->names.F; f++) {
      int64_t nb = c->a.bag_start[f + 1] - c->a.bag_start[f];
      for (int64_t b = 0; b < c->a.full_batch; b++) {
        int64_t j = c->a.inverse[(int64_t)f * c->a.full_batch + b];
        if (j < 0 || j >= nb)
          return ur__error(UR_STATUS_INVALID,
                           "tbe: feature '%s' sample %lld has inverse index %lld; expected "
                           "0..%lld",
                           t->names.fnames[f], (long long)b, (long long)j, (long long)nb - 1);
      }
    }
  return UR_STATUS_OK;
}


/* The error for the first id out of bounds, at value index i: names table, feature, sample and
 * id.  Reads single elements, since on the GPU they are in device memory (an error path). */
static ur_status bad_id(const ur_tbe *t, const call *c, int64_t i) {
  int64_t lo = 0, hi = c->a.bags, o = 0, id = 0; /* the last bag with offsets[bag] <= i */
  ur_status st = UR_STATUS_OK;
  while (hi - lo > 1 && !st) {
    int64_t mid = lo + (hi - lo) / 2;
    if (!(st = ur_tensor_read(c->offsets, mid, 1, &o))) {
      if (o <= i) lo = mid;
      else hi = mid;
    }
  }
  if (!st) st = ur_tensor_read(c->values, i, 1, &id);
  if (st) return st;
  int32_t f = 0;
  int64_t first = 0;
  if (c->vbe) {
    while (f + 1 < t->names.F && c->vbe[f + 1] <= lo) f++;
    first = c->vbe[f];
  } else {
    f = (int32_t)(lo / c->a.batch);
    first = (int64_t)f * c->a.batch;
  }
  const ur_tbe_table_config *tc = &t->tc[t->names.features[f].table];
  return ur__tbe_bad_id(t->names.who, tc->name, t->names.fnames[f], lo - first, i, id, 0, tc->rows);
}

/* ---- calls ---- */

/* Points the call at the descriptors and VBE arrays where the backend reads them: their device
 * copies when the collection's home is the GPU's memory (the VBE arrays in the first half of
 * callbuf, an early copies' call in its second), else the host arrays themselves. */
static ur_status call_args(ur_tbe *t, ur_stream *s, call *c, int early) {
  ur__tbe_args *a = &c->a;
  if (!t->desc) {
    a->tables = t->tables;
    a->features = t->names.features;
    return UR_STATUS_OK;
  }
  char *d = ur_tensor_data(t->desc);
  a->tables = (const ur__tbe_table *)d;
  a->features =
      (const ur__tbe_feature *)(d + ur__tbe_names_features_at(&t->names, sizeof(ur__tbe_table)));
  if (!c->vbe) return UR_STATUS_OK;
  int64_t *dv = (int64_t *)ur_tensor_data(t->callbuf) + (early ? 3 * (t->names.F + 1) : 0);
  ur_status st = t->be->copy(s ? s->handle : NULL, dv, c->vbe,
                             sizeof(int64_t) * (3 * (size_t)t->names.F + 1));
  if (st) return st;
  if (a->bag_start) a->bag_start = dv;
  if (a->out_base) a->out_base = dv + t->names.F + 1;
  if (a->flat_base) a->flat_base = dv + 2 * t->names.F + 1;
  return UR_STATUS_OK;
}

/* The backend's workspace for the call, grown on demand (NULL when it needs none). */
static ur_status call_work(ur_tbe *t, const ur__tbe_args *a, int backward, void **out) {
  size_t need = 0;
  *out = NULL;
  ur_status st = t->be->tbe->work_bytes(a, backward, &need);
  if (st || !need) return st;
  if (!t->work || (size_t)ur_tensor_numel(t->work) < need) {
    ur_tensor_free(t->work);
    t->work = NULL;
    int64_t grow = (int64_t)(need + need / 4 + 4096);
    if ((st = ur__tbe_home_tensor(t, &t->work, UR_DTYPE_U8, grow))) return st;
  }
  *out = ur_tensor_data(t->work);
  return UR_STATUS_OK;
}

/* Whether a forward reads its bad-id flag back under bounds fatal (a wait for the GPU, which
 * ends the overlap of the prefetch pipeline's streams): not where a table is cached, since the
 * values are then ur_cache_prepare's (slot ids for the cached tables, the ids themselves for the
 * others), and the prepare checked every feature's ids (failing the batch there, naming table,
 * feature, sample and id). */
static int reads_bad_ids(const ur_tbe *t) {
  if (t->cfg.bounds != UR_TBE_BOUNDS_FATAL) return 0;
  for (int32_t i = 0; i < t->names.T; i++)
    if (t->owner[i]) return 0;
  return 1;
}

/* What a call does before its backend runs: the host checks offsets where it can read them
 * (host home: after any GPU work on that memory), then the arguments and the workspace. */
static ur_status call_setup(ur_tbe *t, ur_stream *s, call *c, int backward, void **work) {
  ur_status st = UR_STATUS_OK;
  if (t->home == UR_PLACE_HOST && ((st = ur_device_sync()) || (st = check_offsets(t, c))))
    return st;
  if ((st = call_args(t, s, c, 0))) return st;
  if (!backward && reads_bad_ids(t) && (st = reset_flags(t, s))) return st;
  return call_work(t, &c->a, backward, work);
}

ur_status ur_tbe_forward(ur_stream *s, ur_tbe *t, const ur_tensor *values,
                         const ur_tensor *offsets, const ur_tensor *weights,
                         const int64_t *stride_per_key_per_rank, const ur_tensor *inverse_indices,
                         ur_tensor *out) {
  UR__ARGS(t, values, offsets, out);
  call c;
  ur_status st = prepare(t, &c, values, offsets, weights, stride_per_key_per_rank, inverse_indices,
                         out, "out");
  if (!st) st = UR__NEED(t->be, tbe, forward);
  if (st) {
    release(&c);
    return st;
  }
  c.a.out = ur_tensor_data(out);
  void *work = NULL;
  if (!(st = call_setup(t, s, &c, 0, &work)) && !(st = ur__tbe_far_forward(t, s, &c.a)))
    st = t->be->tbe->forward(s ? s->handle : NULL, &c.a, work);
  t->far_made = t->far_ready = !st && c.a.far.fill;
  if (!st && c.a.far.fill) st = ur__tbe_far_forward_done(t, s, values);
  if (!st && reads_bad_ids(t)) {
    /* on the forward's stream: after its kernels, wherever they ran */
    int64_t bad = UR_TBE_NO_BAD;
    if (!(st = t->be->read(s ? s->handle : NULL, &bad, ur_tensor_data(t->flags), sizeof bad)) &&
        bad != UR_TBE_NO_BAD)
      st = bad_id(t, &c, bad);
  }
  release(&c);
  return st;
}

ur_status ur_tbe_far_prefetch(ur_stream *s, ur_tbe *t, const ur_tensor *values,
                              const ur_tensor *offsets, const int64_t *stride_per_key_per_rank) {
  UR__ARGS(t, values, offsets);
  call c;
  ur_status st = prepare(t, &c, values, offsets, NULL, stride_per_key_per_rank, NULL, NULL, NULL);
  if (!st) st = ur__tbe_far_refuse_early(t);
  /* the CPU makes no copies, nor a collection without room */
  if (!st && t->home == UR_PLACE_DEVICE && t->far[0] && c.a.bags > 0 &&
      !(st = UR__NEED(t->be, tbe, far_prefetch)) && !(st = call_args(t, s, &c, 1)))
    st = ur__tbe_far_prefetch(t, s, &c.a);
  release(&c);
  return st;
}

static void hyper_of(ur_tbe *t, ur__tbe_hyper *h) {
  const ur_tbe_config *c = &t->cfg;
  memset(h, 0, sizeof *h);
  h->k = ur__optim_consts_of(&c->optim, t->step);
  h->sr = c->stochastic_rounding != 0;
  h->sr_seed = c->seed;
  h->k.gate = t->gate;
}

ur_status ur_tbe_set_gate(ur_tbe *t, const ur_tensor *gate) {
  UR__ARGS(t);
  if (gate && (ur_tensor_dtype(gate) != UR_DTYPE_I32 || ur_tensor_numel(gate) < UR_NONFINITE_HEAD))
    return ur__error(UR_STATUS_INVALID, "tbe set_gate: the gate is %s of %lld elements; expected "
                     "i32 flags of at least %d (ur_nonfinite_check)", ur_dtype_name(ur_tensor_dtype(gate)),
                     (long long)ur_tensor_numel(gate), (int)UR_NONFINITE_HEAD);
  if (gate && ur__tensor_backend(gate) != t->be)
    return ur__error(UR_STATUS_INVALID, "tbe set_gate: the gate is in %s memory, which the "
                     "collection's backend (%s) does not read", ur_place_name(ur_tensor_place(gate)),
                     t->be->name);
  t->gate = gate ? ur_tensor_data(gate) : NULL;
  return UR_STATUS_OK;
}

/* The fused backward (sums_only 0: a step) or its first half (1: the row sums' partial sums,
 * ur_tbe_row_sums): one call of the backend's backward either way. */
static ur_status backward_call(ur_stream *s, ur_tbe *t, const ur_tensor *grad_out,
                               const ur_tensor *values, const ur_tensor *offsets,
                               const ur_tensor *weights, const int64_t *stride_per_key_per_rank,
                               const ur_tensor *inverse_indices, int32_t sums_only) {
  call c;
  ur_status st = prepare(t, &c, values, offsets, weights, stride_per_key_per_rank, inverse_indices,
                         grad_out, "grad_out");
  if (!st) st = UR__NEED(t->be, tbe, backward);
  if (st) {
    release(&c);
    return st;
  }
  c.a.grad = ur_tensor_data(grad_out);
  /* the atomic step adds each value's -lr g: exact in distribution only for plain SGD on f32
   * rows (weight decay and clipping act on a row's whole gradient, halves round per row) */
  const ur_tbe_config *cf = &t->cfg;
  c.a.atomic = !sums_only && cf->nondeterministic && cf->optim.kind == UR_OPTIM_KIND_SGD &&
               cf->optim.weight_decay == 0 && cf->optim.max_grad <= 0 && !c.a.halves;
  void *sh = s ? s->handle : NULL;
  /* rows the call does not read keep 0 in the row sums */
  for (int32_t i = 0; i < t->names.T && sums_only && !st; i++)
    if (t->tables[i].row_sums)
      st = t->be->fill(sh, t->tables[i].row_sums, (size_t)t->tc[i].rows, 4, 0);
  if (!sums_only) t->step++;
  ur__tbe_hyper h;
  hyper_of(t, &h);
  h.sums_only = sums_only;
  void *work = NULL;
  /* the last forward's far rows, as it read them */
  if (!st) st = ur__tbe_far_backward(t, s, &c.a, values);
  h.far_behind = c.a.far.behind;
  if (!st && !(st = call_setup(t, s, &c, 1, &work)))
    st = t->be->tbe->backward(sh, &c.a, &h, work);
  /* the step wrote the rows and their copies (not by atomics); a failed one, who knows */
  if (st) {
    (void)ur__tbe_far_drop(t);
    if (!sums_only) t->step--;
  } else {
    st = ur__tbe_far_backward_done(t, s, &c.a, !sums_only); /* the step is taken either way */
  }
  release(&c);
  return st;
}

ur_status ur_tbe_backward(ur_stream *s, ur_tbe *t, const ur_tensor *grad_out,
                          const ur_tensor *values, const ur_tensor *offsets,
                          const ur_tensor *weights, const int64_t *stride_per_key_per_rank,
                          const ur_tensor *inverse_indices) {
  UR__ARGS(t, grad_out, values, offsets);
  return backward_call(s, t, grad_out, values, offsets, weights, stride_per_key_per_rank,
                       inverse_indices, 0);
}

ur_status ur_tbe_set_row_sums(ur_tbe *t, int32_t table, ur_tensor *sums) {
  UR__ARGS(t);
  if (table < 0 || table >= t->names.T)
    return ur__error(UR_STATUS_INVALID, "tbe set_row_sums: table %d does not exist; expected 0..%d",
                     (int)table, (int)t->names.T - 1);
  const ur_tbe_table_config *tc = &t->tc[table];
  if (sums) {
    static const char *const kinds[] = {"sgd", "adagrad", "adam", "adamw", "rowwise_adagrad"};
    int32_t k = t->cfg.optim.kind;
    if (k != UR_OPTIM_KIND_ROWWISE_ADAGRAD)
      return ur__error(UR_STATUS_INVALID, "tbe set_row_sums: table '%s': row sums are rowwise "
                       "Adagrad's, and the collection's optimizer is %s", tc->name,
                       k >= 0 && k < UR_OPTIM_KIND_COUNT ? kinds[k] : "?");
    if (ur_tensor_dtype(sums) != UR_DTYPE_F32 || ur_tensor_numel(sums) != tc->rows)
      return ur__error(UR_STATUS_INVALID, "tbe set_row_sums: table '%s': the sums are %s of %lld "
                       "elements; expected f32 of %lld (one per row)", tc->name,
                       ur_dtype_name(ur_tensor_dtype(sums)), (long long)ur_tensor_numel(sums),
                       (long long)tc->rows);
    if (ur__tensor_backend(sums) != t->be)
      return ur__error(UR_STATUS_INVALID, "tbe set_row_sums: table '%s': the sums are in %s "
                       "memory, which the collection's backend (%s) does not read", tc->name,
                       ur_place_name(ur_tensor_place(sums)), t->be->name);
    const char *lo = ur_tensor_data(sums), *hi = lo + 4 * (size_t)tc->rows;
    for (int32_t i = 0; i < t->names.T; i++) {
      const char *o = (const char *)t->tables[i].row_sums;
      if (i != table && o && o < hi && lo < o + 4 * (size_t)t->tc[i].rows)
        return ur__error(UR_STATUS_INVALID, "tbe set_row_sums: table '%s': the sums overlap table "
                         "'%s''s; each table needs its own", tc->name, t->tc[i].name);
    }
  }
  t->tables[table].row_sums = sums ? ur_tensor_data(sums) : NULL;
  t->tables[table].row_dim = tc->logical_rows ? tc->logical_dim : tc->dim;
  return ur__tbe_sync_desc(t);
}

ur_status ur_tbe_row_sums(ur_stream *s, ur_tbe *t, const ur_tensor *grad_out,
                          const ur_tensor *values, const ur_tensor *offsets,
                          const ur_tensor *weights, const int64_t *stride_per_key_per_rank,
                          const ur_tensor *inverse_indices) {
  UR__ARGS(t, grad_out, values, offsets);
  int32_t any = 0;
  for (int32_t i = 0; i < t->names.T; i++) any |= t->tables[i].row_sums != NULL;
  if (!any)
    return ur__error(UR_STATUS_INVALID, "tbe row_sums: no table of the collection has row sums "
                     "(ur_tbe_set_row_sums)");
  return backward_call(s, t, grad_out, values, offsets, weights, stride_per_key_per_rank,
                       inverse_indices, 1);
}

/* The sparse gradient's outputs at the collection's home: rows [U], grads [sum of U_t dim_t]. */
static ur_status sparse_outputs(ur_tbe *t, const int64_t *counts, ur_tensor **rows,
                                ur_tensor **grads) {
  int64_t u = 0, g = 0;
  for (int32_t i = 0; i < t->names.T; i++) {
    u += counts[i];
    g += counts[i] * t->tc[i].dim;
  }
  ur_status st = ur__tbe_home_tensor(t, rows, UR_DTYPE_I64, u);
  if (!st) st = ur__tbe_home_tensor(t, grads, UR_DTYPE_F32, g);
  return st;
}

ur_status ur_tbe_sparse_grad(ur_stream *s, ur_tbe *t, const ur_tensor *grad_out,
                             const ur_tensor *values, const ur_tensor *offsets,
                             const ur_tensor *weights, const int64_t *stride_per_key_per_rank,
                             const ur_tensor *inverse_indices, ur_tensor **rows, ur_tensor **grads,
                             int64_t *counts) {
  UR__ARGS(t, grad_out, values, offsets, rows, grads, counts);
  *rows = *grads = NULL;
  call c;
  ur_status st = prepare(t, &c, values, offsets, weights, stride_per_key_per_rank, inverse_indices,
                         grad_out, "grad_out");
  if (!st && !(st = UR__NEED(t->be, tbe, sparse_count))) st = UR__NEED(t->be, tbe, sparse_write);
  if (st) {
    release(&c);
    return st;
  }
  c.a.grad = ur_tensor_data(grad_out);
  void *work = NULL, *sh = s ? s->handle : NULL;
  if (!(st = call_setup(t, s, &c, 1, &work)) &&
      !(st = t->be->tbe->sparse_count(sh, &c.a, work, counts)) &&
      !(st = sparse_outputs(t, counts, rows, grads)))
    st = t->be->tbe->sparse_write(sh, &c.a, work, counts, ur_tensor_data(*rows),
                                  ur_tensor_data(*grads));
  if (!st) st = t->be->stream_sync(sh);
  if (st) {
    ur_tensor_free(*rows);
    ur_tensor_free(*grads);
    *rows = *grads = NULL;
  }
  release(&c);
  return st;
}

/* ---- the plain gather ---- */

/* By the GPU when a tensor is in device memory (every tensor must then be one it reads), else
 * by the CPU, after any GPU work on that memory. */
ur_status ur_tensor_gather_rows(ur_stream *s, const ur_tensor *src, const ur_tensor *ids,
                                ur_tensor *out) {
  UR__ARGS(src, ids, out);
  if (ur_tensor_ndim(src) != 2 || ur_tensor_dtype(ids) != UR_DTYPE_I64 ||
      ur_tensor_ndim(ids) != 1 || ur_tensor_ndim(out) != 2 ||
      ur_tensor_dtype(out) != ur_tensor_dtype(src) || ur_tensor_dim(out, 1) != ur_tensor_dim(src, 1) ||
      ur_tensor_dim(out, 0) != ur_tensor_numel(ids))
    return ur__error(UR_STATUS_INVALID,
                     "gather_rows: expected src [rows, dim], ids i64 [n] and out [n, dim] of "
                     "src's dtype");
  ur_place ps = ur_tensor_place(src), pi = ur_tensor_place(ids), po = ur_tensor_place(out);
  int dev = ps == UR_PLACE_DEVICE || pi == UR_PLACE_DEVICE || po == UR_PLACE_DEVICE;
  if (dev && (ps == UR_PLACE_HOST || pi == UR_PLACE_HOST || po == UR_PLACE_HOST))
    return ur__error(UR_STATUS_INVALID,
                     "gather_rows: device and plain host tensors mixed; the GPU reads device, "
                     "managed and pinned memory");
  const ur_backend *b = ur__backend_for(dev ? UR_PLACE_DEVICE : UR_PLACE_HOST);
  ur_status st = UR__NEED(b, tbe, gather_rows);
  if (!st && !dev) st = ur_device_sync();
  if (st) return st;
  size_t row_bytes = (size_t)ur_tensor_dim(src, 1) * ur_dtype_size(ur_tensor_dtype(src));
  return b->tbe->gather_rows(s ? s->handle : NULL, ur_tensor_data(src), ur_tensor_dim(src, 0),
                             row_bytes, ur_tensor_data(ids), ur_tensor_numel(ids),
                             ur_tensor_data(out));
}
