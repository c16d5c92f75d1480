/* act.h: the activations' arithmetic, compiled for the CPU backend (dense/linear.c) and the
 * GPU's own kernels (kernels/linear.cu): one ReLU and one mask predicate for both (the sigmoid
 * takes each one's expf, a few units in the last place apart).  ReLU passes NaN on, as
 * PyTorch's relu does: a non-finite input reaches the loss, where a guard sees it, instead of
 * turning into a zero that hides it.  (cuBLASLt's ReLU epilogues, which the GPU's products use,
 * pass it on in some of their kernels and give 0 in others: spec/dense_cuda_spec.lua.)  The
 * sigmoid takes exp of a non-positive number only, so that large |v| neither overflows nor
 * loses 1. */
#ifndef UR_ACT_H
#define UR_ACT_H

#include "core/philox.h" /* UR_HD */

/* Whether a ReLU output (or input) lets its gradient through: its mask bit.  NaN passes, as
 * cuBLASLt's RELU_AUX epilogues set its bit (seen on the H200: 255 for a row of NaN), so that
 * the engine's own kernels' masks and masked gradients agree with the CPU's and with those. */
UR_HD int ur__relu_passes(float v) { return !(v <= 0.0f); }

UR_HD float ur__relu(float v) { return ur__relu_passes(v) ? v : 0.0f; }

UR_HD float ur__sigmoid(float v) {
  if (v >= 0.0f) return 1.0f / (1.0f + expf(-v));
  float e = expf(v);
  return e / (1.0f + e);
}

#endif
