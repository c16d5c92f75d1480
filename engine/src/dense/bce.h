/* bce.h: binary cross-entropy's per-sample arithmetic on logits, compiled for the CPU backend
 * (dense/loss.c) and the GPU's (kernels/loss.cu), in double, so the two give one answer.  A
 * sample's loss is max(x, 0) - x y + log1p(e^-|x|), which never overflows and loses nothing at
 * large |x|; its gradient is sigmoid(x) - y, the sigmoid taken on the side that cannot
 * overflow. */
#ifndef UR_BCE_H
#define UR_BCE_H

#include "core/philox.h" /* UR_HD */

UR_HD double ur__bce_term(double x, double y) {
  return (x > 0.0 ? x : 0.0) - x * y + log1p(exp(-fabs(x)));
}

UR_HD double ur__bce_sigmoid(double x) {
  if (x >= 0.0) return 1.0 / (1.0 + exp(-x));
  double e = exp(x);
  return e / (1.0 + e);
}

#endif
