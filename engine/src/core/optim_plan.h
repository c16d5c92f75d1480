/* optim_plan.h: the optimizers' arithmetic, written once for the dense parameters (dense/optim.c
 * and kernels/optim.cu) and the embedding tables' fused step (embedding/tbe_cpu.c and
 * kernels/tbe.cu, through tbe_plan.h): the constants of one update, computed on the host from
 * a ur_optim_config and the update's number, and the dense parameters' element step.  Compiled
 * for host and device, so that both backends read the same constants and do the same
 * operations in the same order (the CPU build has -ffp-contract=off). */
#ifndef UR_OPTIM_PLAN_H
#define UR_OPTIM_PLAN_H

#include <math.h>
#include <stdint.h>
#include "core/philox.h"
#include "uvmrec.h"

/* One update's constants, as floats. */
typedef struct ur__optim_consts {
  int32_t kind;             /* ur_optim_kind */
  int32_t nesterov, first;  /* dense SGD: Nesterov momentum; first: step 1 (the buffer starts at g) */
  int32_t zero_grad;        /* dense: zero the gradient once read */
  float lr, eps, weight_decay, momentum, max_grad;
  float beta1, beta2;
  float one_minus_beta1, one_minus_beta2; /* tables' Adam: 1 - beta, rounded once */
  float bias1, bias2;       /* tables' Adam: 1 - beta^step */
  float step_size;          /* dense Adam (PyTorch's): lr / (1 - beta1^step) */
  float bias2_sqrt;         /* dense Adam: sqrt(1 - beta2^step) */
  float decay;              /* AdamW: 1 - lr weight_decay */
  double lr_d, beta1_d, beta2_d; /* the settings the bias terms are formed from */
  int64_t step;             /* the update's number as the caller counts it, from 1 */
  /* A guard's flags (ur_nonfinite_check) or NULL: while gate[0] is set, the update leaves
   * parameters, rows and state as they are; gate[2] counts skipped steps the caller's step
   * count does not leave out yet (read where the update runs). */
  const int32_t *gate;
  /* clip_grad_norm_'s factor (ur__optim_clip_factor), read where the update runs, or NULL */
  const double *clip;
} ur__optim_consts;

/* Whether the gate holds this update back. */
UR_HD int ur__optim_gated(const ur__optim_consts *k) { return k->gate && *k->gate != 0; }

/* Double arithmetic rounded as IEEE says on host and device alike (no fused multiply-add), so
 * that the bias terms formed where the update runs are the host's to the bit. */
#ifdef __CUDA_ARCH__
#define UR_DMUL(a, b) __dmul_rn((a), (b))
#define UR_DSUB(a, b) __dsub_rn((a), (b))
#define UR_DDIV(a, b) __ddiv_rn((a), (b))
#define UR_DSQRT(a) __dsqrt_rn(a)
#define UR_DADD(a, b) __dadd_rn((a), (b))
#else
#define UR_DMUL(a, b) ((a) * (b))
#define UR_DSUB(a, b) ((a) - (b))
#define UR_DDIV(a, b) ((a) / (b))
#define UR_DSQRT(a) sqrt(a)
#define UR_DADD(a, b) ((a) + (b))
#endif

/* b^t for t >= 0 by squaring: the same bits on host and device (pow's are not). */
UR_HD double ur__optim_pow(double b, int64_t t) {
  double r = 1.0;
  for (; t > 0; t >>= 1) {
    if (t & 1) r = UR_DMUL(r, b);
    b = UR_DMUL(b, b);
  }
  return r;
}

/* Adam's bias terms of update number `step` (from 1), into k. */
UR_HD void ur__optim_bias_at(ur__optim_consts *k, int64_t step) {
  double p1 = ur__optim_pow(k->beta1_d, step), p2 = ur__optim_pow(k->beta2_d, step);
  k->bias1 = (float)UR_DSUB(1.0, p1);
  k->bias2 = (float)UR_DSUB(1.0, p2);
  k->step_size = (float)UR_DDIV(k->lr_d, UR_DSUB(1.0, p1));
  k->bias2_sqrt = (float)UR_DSQRT(UR_DSUB(1.0, p2));
}

/* k as the update runs: under a guard, skipped steps whose gate[2] still counts are not
 * updates made, so Adam's bias terms are those of the update's true number (a skip is read by
 * the host only every few steps; the number is corrected here meanwhile, without a wait). */
UR_HD ur__optim_consts ur__optim_now(const ur__optim_consts *k) {
  ur__optim_consts r = *k;
  if (k->gate && (k->kind == UR_OPTIM_KIND_ADAM || k->kind == UR_OPTIM_KIND_ADAMW) && k->gate[2] > 0) {
    int64_t t = k->step - k->gate[2];
    ur__optim_bias_at(&r, t > 1 ? t : 1);
  }
  return r;
}

/* Gradient clipping by the global norm (PyTorch's clip_grad_norm_): from the partial sums of
 * squares (UR_OPTIM_CLIP_PARTS of them, added in order), work[0] = the norm and work[1] = the
 * factor min(1, clip / (norm + 1e-6)); a NaN norm gives a NaN factor, as PyTorch's clamp. */
UR_HD void ur__optim_clip_factor(double *work, double clip) {
  double sum = 0.0;
  for (int i = 0; i < UR_OPTIM_CLIP_PARTS; i++) sum = UR_DADD(sum, work[2 + i]);
  double norm = UR_DSQRT(sum);
  double f = UR_DDIV(clip, UR_DADD(norm, 1e-6));
  work[0] = norm;
  work[1] = f > 1.0 ? 1.0 : f;
}

/* The constants of update number `step` (from 1) of c's rule. */
static inline ur__optim_consts ur__optim_consts_of(const ur_optim_config *c, int64_t step) {
  ur__optim_consts k;
  k.kind = c->kind;
  k.nesterov = c->nesterov;
  k.first = step == 1;
  k.zero_grad = c->zero_grad;
  k.lr = (float)c->lr;
  k.eps = (float)c->eps;
  k.weight_decay = (float)c->weight_decay;
  k.momentum = (float)c->momentum;
  k.max_grad = (float)c->max_grad;
  k.beta1 = (float)c->beta1;
  k.beta2 = (float)c->beta2;
  k.one_minus_beta1 = (float)(1.0 - c->beta1);
  k.one_minus_beta2 = (float)(1.0 - c->beta2);
  k.lr_d = c->lr;
  k.beta1_d = c->beta1;
  k.beta2_d = c->beta2;
  k.step = step;
  ur__optim_bias_at(&k, step);
  k.decay = (float)(1.0 - c->lr * c->weight_decay);
  k.gate = 0;
  k.clip = 0;
  return k;
}

/* One dense element's update with PyTorch's formulas: the new value of p from its gradient g;
 * s1 and s2 point at its state (SGD's momentum buffer; Adagrad's sum; Adam's exp_avg and
 * exp_avg_sq), NULL where the rule keeps none. */
UR_HD float ur__optim_dense_elem(const ur__optim_consts *k, float p, float g, float *s1,
                                 float *s2) {
  switch (k->kind) {
  case UR_OPTIM_KIND_SGD:
    g += k->weight_decay * p;
    if (k->momentum != 0.0f) {
      float b = k->first ? g : k->momentum * *s1 + g;
      *s1 = b;
      g = k->nesterov ? g + k->momentum * b : b;
    }
    return p - k->lr * g;
  case UR_OPTIM_KIND_ADAGRAD: {
    g += k->weight_decay * p;
    float s = *s1 + g * g;
    *s1 = s;
    return p - k->lr * g / (sqrtf(s) + k->eps);
  }
  default: { /* Adam, AdamW */
    if (k->kind == UR_OPTIM_KIND_ADAMW) p *= k->decay;
    else g += k->weight_decay * p;
    float m = k->beta1 * *s1 + (1.0f - k->beta1) * g;
    float v = k->beta2 * *s2 + (1.0f - k->beta2) * g * g;
    *s1 = m;
    *s2 = v;
    return p - k->step_size * m / (sqrtf(v) / k->bias2_sqrt + k->eps);
  }
  }
}

#endif
