/* optim.c: dense optimizers (SGD with momentum, Adagrad, Adam, AdamW) with PyTorch's formulas,
 * in f32, and gradient clipping by the global norm (PyTorch's clip_grad_norm_): the public entry
 * point, which checks the settings, computes the update's constants once and walks the
 * parameters in groups of UR__OPTIM_GROUP (one GPU launch each; a pass for the norm first when
 * clipping), and the CPU backend's version (the element step is core/optim_plan.h's, the GPU's
 * too). */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "dense/dense.h"

typedef struct optim_job {
  const ur__optim_consts *k;
  float *p, *g, *s1, *s2;
  uint16_t *h;
} optim_job;

static void step_range(void *ctx, size_t i0, size_t i1) {
  optim_job *j = ctx;
  const ur__optim_consts *k = j->k;
  if (ur__optim_gated(k)) { /* held back: the gradient is spent all the same */
    if (k->zero_grad) memset(j->g + i0, 0, sizeof(float) * (i1 - i0));
    return;
  }
  float clip = k->clip ? (float)*k->clip : 1.0f;
  for (size_t i = i0; i < i1; i++) {
    float g = j->g[i];
    if (k->clip) {
      g = g * clip;
      if (!k->zero_grad) j->g[i] = g;
    }
    float p = ur__optim_dense_elem(k, j->p[i], g, j->s1 ? j->s1 + i : NULL,
                                   j->s2 ? j->s2 + i : NULL);
    j->p[i] = p;
    if (j->h) j->h[i] = ur__f32_to_bf16(p);
    if (k->zero_grad) j->g[i] = 0.0f;
  }
}

ur_status ur__cpu_optim_step(void *stream, const ur__optim_consts *k, int32_t n,
                             float *const *params, float *const *grads, float *const *s1,
                             float *const *s2, void *const *halves, const int64_t *numel) {
  (void)stream;
  optim_job j;
  ur__optim_consts now = ur__optim_now(k); /* read where the update runs, as the GPU does */
  j.k = &now;
  for (int32_t t = 0; t < n; t++) {
    j.p = params[t];
    j.g = grads[t];
    j.s1 = s1[t];
    j.s2 = s2[t];
    j.h = halves[t];
    ur__parallel_for((size_t)numel[t], (size_t)1 << 15, step_range, &j);
  }
  return UR_STATUS_OK;
}

/* The CPU's sum of squares: one partial, tensor by tensor, element by element, in f64. */
ur_status ur__cpu_optim_sumsq(void *stream, int32_t n, float *const *grads,
                              const int64_t *numel, double *work, int32_t first) {
  (void)stream;
  if (first) memset(work + 2, 0, sizeof(double) * UR_OPTIM_CLIP_PARTS);
  double sum = work[2];
  for (int32_t t = 0; t < n; t++)
    for (int64_t i = 0; i < numel[t]; i++) sum += (double)grads[t][i] * grads[t][i];
  work[2] = sum;
  return UR_STATUS_OK;
}

ur_status ur__cpu_optim_clip_factor(void *stream, double *work, double clip_norm) {
  (void)stream;
  ur__optim_clip_factor(work, clip_norm);
  return UR_STATUS_OK;
}

ur_status ur_optim_step(ur_stream *s, const ur_optim_config *cfg, int32_t n,
                        ur_tensor *const *params, ur_tensor *const *grads,
                        ur_tensor *const *state1, ur_tensor *const *state2,
                        ur_tensor *const *halves, const ur_tensor *gate, ur_tensor *clip_work) {
  UR__ARGS(cfg);
  if (n > 0 && !params) return ur__null(__func__, "params");
  if (n > 0 && !grads) return ur__null(__func__, "grads");
  const char *op = "optim step";
  ur_status st = ur__optim_check(op, cfg, 0);
  if (st) return st;
  if (cfg->step < 1)
    return ur__error(UR_STATUS_INVALID, "%s: step %lld; expected >= 1 (the update's number)", op,
                     (long long)cfg->step);
  ur__optim_consts k = ur__optim_consts_of(cfg, cfg->step);
  if (gate && (gate->dtype != UR_DTYPE_I32 || gate->numel < UR_NONFINITE_HEAD))
    return ur__error(UR_STATUS_INVALID, "%s: the gate is %s of %lld elements; expected i32 flags "
                     "of at least %d (ur_nonfinite_check)", op, ur_dtype_name(gate->dtype),
                     (long long)gate->numel, (int)UR_NONFINITE_HEAD);
  int clip = cfg->clip_norm > 0;
  if (clip && (!clip_work || clip_work->dtype != UR_DTYPE_F64 ||
               clip_work->numel < UR_OPTIM_CLIP_WORK))
    return ur__error(UR_STATUS_INVALID, "%s: clip_norm %g needs clip_work, f64 of at least %d "
                     "elements; got %s", op, cfg->clip_norm, (int)UR_OPTIM_CLIP_WORK,
                     clip_work ? ur_dtype_name(clip_work->dtype) : "none");
  if (n < 0 || (n > 0 && (!params || !grads)))
    return ur__error(UR_STATUS_INVALID, "%s: %d parameters, params or grads missing", op, (int)n);
  int need1 = cfg->kind != UR_OPTIM_KIND_SGD || cfg->momentum > 0;
  int need2 = cfg->kind == UR_OPTIM_KIND_ADAM || cfg->kind == UR_OPTIM_KIND_ADAMW;
  float *p[UR__OPTIM_GROUP], *g[UR__OPTIM_GROUP], *a[UR__OPTIM_GROUP], *b[UR__OPTIM_GROUP];
  void *h[UR__OPTIM_GROUP];
  int64_t num[UR__OPTIM_GROUP];
  const ur_backend *be = NULL;
  /* pass 0 (clipping): every gradient's squares into the norm; pass 1: the update */
  int fresh = 1;
  for (int pass = clip ? 0 : 1; pass < 2; pass++) {
    if (pass == 1 && clip && be) {
      if ((st = UR__NEED(be, dense, optim_clip_factor)) ||
          (st = be->dense->optim_clip_factor(ur__dense_stream(s), ur_tensor_data(clip_work),
                                             cfg->clip_norm)))
        return st;
      k.clip = (const double *)ur_tensor_data(clip_work) + 1;
    }
    for (int32_t g0 = 0; g0 < n; g0 += UR__OPTIM_GROUP) {
      int32_t m = n - g0 < UR__OPTIM_GROUP ? n - g0 : UR__OPTIM_GROUP;
      int32_t live = 0;
      for (int32_t i = 0; i < m; i++) {
        int32_t t = g0 + i;
        char pn[48], gn[48], an[48], bn[48], hn[48];
        snprintf(pn, sizeof pn, "parameter %d", (int)t + 1);
        snprintf(gn, sizeof gn, "gradient %d", (int)t + 1);
        snprintf(an, sizeof an, "state1 %d", (int)t + 1);
        snprintf(bn, sizeof bn, "state2 %d", (int)t + 1);
        snprintf(hn, sizeof hn, "half %d", (int)t + 1);
        const ur_tensor *pt = params[t];
        const ur_tensor *s1t = need1 && state1 ? state1[t] : NULL;
        const ur_tensor *s2t = need2 && state2 ? state2[t] : NULL;
        const ur_tensor *ht = halves ? halves[t] : NULL;
        if ((st = ur__dense_check_numel(op, pn, pt, 0, pt ? pt->numel : 0)) ||
            (st = ur__dense_check_numel(op, gn, grads[t], 0, pt->numel)) ||
            (need1 && (st = ur__dense_check_numel(op, an, s1t, 0, pt->numel))) ||
            (need2 && (st = ur__dense_check_numel(op, bn, s2t, 0, pt->numel))))
          return st;
        if (ht && (ht->dtype != UR_DTYPE_BF16 || ht->numel != pt->numel))
          return ur__error(UR_STATUS_INVALID, "%s: %s is %s of %lld elements; expected bf16 of %lld",
                           op, hn, ur_dtype_name(ht->dtype), (long long)ht->numel,
                           (long long)pt->numel);
        const ur_tensor *ts[] = {pt, grads[t], s1t, s2t, ht};
        const char *names[] = {pn, gn, an, bn, hn};
        const ur_backend *bi;
        if ((st = ur__dense_backend(op, 5, ts, names, &bi))) return st;
        if (be && bi != be)
          return ur__error(UR_STATUS_INVALID, "%s: %s is not on parameter 1's side (GPU or host)",
                           op, pn);
        be = bi;
        if (gate && ur__tensor_backend(gate) != be)
          return ur__error(UR_STATUS_INVALID, "%s: the gate is in %s memory, which %s does not "
                           "run on with the parameters", op, ur_place_name(ur_tensor_place(gate)),
                           be->name);
        if (clip && ur__tensor_backend(clip_work) != be)
          return ur__error(UR_STATUS_INVALID, "%s: clip_work is in %s memory, which %s does not "
                           "run on with the parameters", op,
                           ur_place_name(ur_tensor_place(clip_work)), be->name);
        if (!pt->numel) continue;
        p[live] = ur_tensor_data(pt);
        g[live] = ur_tensor_data(grads[t]);
        a[live] = s1t ? ur_tensor_data(s1t) : NULL;
        b[live] = s2t ? ur_tensor_data(s2t) : NULL;
        h[live] = ht ? ur_tensor_data(ht) : NULL;
        num[live] = pt->numel;
        live++;
      }
      if (live && gate && ((st = ur__tensor_ready(be, gate)))) return st;
      if (live && clip && ((st = ur__tensor_ready(be, clip_work)))) return st;
      k.gate = gate ? ur_tensor_data(gate) : NULL;
      if (live && pass == 0) {
        if ((st = UR__NEED(be, dense, optim_sumsq)) ||
            (st = be->dense->optim_sumsq(ur__dense_stream(s), live, g, num,
                                         ur_tensor_data(clip_work), fresh)))
          return st;
        fresh = 0;
      }
      if (live && pass == 1 &&
          ((st = UR__NEED(be, dense, optim_step)) ||
           (st = be->dense->optim_step(ur__dense_stream(s), &k, live, p, g, a, b, h, num))))
        return st;
    }
    /* every gradient empty: the norm is 0 */
    if (pass == 0 && fresh && be) {
      if ((st = ur__tensor_ready(be, clip_work)) ||
          (st = UR__NEED(be, dense, optim_sumsq)) ||
          (st = be->dense->optim_sumsq(ur__dense_stream(s), 0, g, num, ur_tensor_data(clip_work), 1)))
        return st;
    }
  }
  return UR_STATUS_OK;
}
