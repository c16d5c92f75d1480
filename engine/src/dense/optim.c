/* optim.c: dense optimizers (SGD with momentum, Adagrad, Adam, AdamW) with PyTorch's formulas,
 * in f32: the public entry point, which walks the parameters in groups of UR__OPTIM_GROUP (one
 * GPU launch each), and the CPU backend's version. */
#include <math.h>
#include <stdio.h>
#include "dense/dense.h"

typedef struct optim_job {
  ur__optim_consts k;
  float *p, *g, *s1, *s2;
  uint16_t *h;
} optim_job;

static void step_range(void *ctx, size_t i0, size_t i1) {
  optim_job *j = ctx;
  const ur__optim_consts *k = &j->k;
  for (size_t i = i0; i < i1; i++) {
    float p = j->p[i], g = j->g[i];
    switch (k->kind) {
    case UR_OPTIM_KIND_SGD:
      g += k->wd * p;
      if (k->mom != 0.0f) {
        float b = k->first ? g : k->mom * j->s1[i] + g;
        j->s1[i] = b;
        g = k->nesterov ? g + k->mom * b : b;
      }
      p -= k->lr * g;
      break;
    case UR_OPTIM_KIND_ADAGRAD: {
      g += k->wd * p;
      float s = j->s1[i] + g * g;
      j->s1[i] = s;
      p -= k->lr * g / (sqrtf(s) + k->eps);
      break;
    }
    default: { /* Adam, AdamW */
      if (k->kind == UR_OPTIM_KIND_ADAMW) p *= k->decay;
      else g += k->wd * p;
      float m = k->b1 * j->s1[i] + (1.0f - k->b1) * g;
      float v = k->b2 * j->s2[i] + (1.0f - k->b2) * g * g;
      j->s1[i] = m;
      j->s2[i] = v;
      p -= k->step_size * m / (sqrtf(v) / k->bc2_sqrt + k->eps);
      break;
    }
    }
    j->p[i] = p;
    if (j->h) j->h[i] = ur__f32_to_bf16(p);
    if (k->zero) j->g[i] = 0.0f;
  }
}

ur_status ur__cpu_optim_step(void *stream, const ur_optim_cfg *cfg, int32_t n,
                             float *const *params, float *const *grads, float *const *s1,
                             float *const *s2, void *const *halves, const int64_t *numel) {
  (void)stream;
  optim_job j;
  j.k = ur__optim_consts_of(cfg);
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

static ur_status check_cfg(const char *op, const ur_optim_cfg *c) {
  if (!c) return ur__error(UR_STATUS_INVALID, "%s: cfg is missing (NULL)", op);
  if ((unsigned)c->kind >= UR_OPTIM_KIND_COUNT)
    return ur__error(UR_STATUS_INVALID, "%s: kind %d is not sgd (0), adagrad (1), adam (2) or "
                     "adamw (3)", op, (int)c->kind);
  if (c->step < 1)
    return ur__error(UR_STATUS_INVALID, "%s: step %lld; expected >= 1 (the update's number)", op,
                     (long long)c->step);
  if (!isfinite(c->lr) || c->lr < 0 || !isfinite(c->weight_decay) || c->weight_decay < 0)
    return ur__error(UR_STATUS_INVALID, "%s: lr %g and weight_decay %g must be finite and >= 0",
                     op, c->lr, c->weight_decay);
  if (c->kind == UR_OPTIM_KIND_SGD && (!isfinite(c->momentum) || c->momentum < 0))
    return ur__error(UR_STATUS_INVALID, "%s: momentum %g must be finite and >= 0", op,
                     c->momentum);
  if (c->kind == UR_OPTIM_KIND_SGD && c->nesterov && c->momentum <= 0)
    return ur__error(UR_STATUS_INVALID, "%s: nesterov needs momentum > 0", op);
  if (c->kind >= UR_OPTIM_KIND_ADAM &&
      !(c->beta1 >= 0 && c->beta1 < 1 && c->beta2 >= 0 && c->beta2 < 1))
    return ur__error(UR_STATUS_INVALID, "%s: beta1 %g and beta2 %g must be in [0, 1)", op,
                     c->beta1, c->beta2);
  if (c->kind != UR_OPTIM_KIND_SGD && !(c->eps > 0 && isfinite(c->eps)))
    return ur__error(UR_STATUS_INVALID, "%s: eps %g must be finite and > 0", op, c->eps);
  return UR_STATUS_OK;
}

ur_status ur_optim_step(ur_stream *s, const ur_optim_cfg *cfg, int32_t n,
                        ur_tensor *const *params, ur_tensor *const *grads,
                        ur_tensor *const *state1, ur_tensor *const *state2,
                        ur_tensor *const *halves) {
  UR__ARGS(cfg);
  if (n > 0 && !params) return ur__null(__func__, "params");
  if (n > 0 && !grads) return ur__null(__func__, "grads");
  const char *op = "optim step";
  ur_status st = check_cfg(op, cfg);
  if (st) return st;
  if (n < 0 || (n > 0 && (!params || !grads)))
    return ur__error(UR_STATUS_INVALID, "%s: %d parameters, params or grads missing", op, (int)n);
  int need1 = cfg->kind != UR_OPTIM_KIND_SGD || cfg->momentum > 0;
  int need2 = cfg->kind >= UR_OPTIM_KIND_ADAM;
  float *p[UR__OPTIM_GROUP], *g[UR__OPTIM_GROUP], *a[UR__OPTIM_GROUP], *b[UR__OPTIM_GROUP];
  void *h[UR__OPTIM_GROUP];
  int64_t num[UR__OPTIM_GROUP];
  const ur_backend *be = NULL;
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
      if (!pt->numel) continue;
      p[live] = ur_tensor_data(pt);
      g[live] = ur_tensor_data(grads[t]);
      a[live] = s1t ? ur_tensor_data(s1t) : NULL;
      b[live] = s2t ? ur_tensor_data(s2t) : NULL;
      h[live] = ht ? ur_tensor_data(ht) : NULL;
      num[live] = pt->numel;
      live++;
    }
    if (live && ((st = UR__NEED(be, dense, optim_step)) ||
                 (st = be->dense->optim_step(ur__dense_stream(s), cfg, live, p, g, a, b, h, num))))
      return st;
  }
  return UR_STATUS_OK;
}
