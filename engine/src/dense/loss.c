/* loss.c: binary cross-entropy on logits (DLRM's loss): public entry points and the CPU
 * backend's versions.  Each sample's loss is w times dense/bce.h's term; values and sums are in
 * double, in row order. */
#include <math.h>
#include "dense/bce.h"
#include "dense/dense.h"

ur_status ur__cpu_bce_forward(void *stream, const void *logits, const float *targets,
                              const float *weights, float *loss, int64_t n, ur_dtype dtype,
                              ur_reduction reduction) {
  (void)stream;
  double sum = 0;
  for (int64_t i = 0; i < n; i++) {
    double l = ur__bce_term(ur__dense_ld(logits, dtype, (size_t)i), targets[i]);
    if (weights) l *= weights[i];
    if (reduction == UR_REDUCTION_NONE) loss[i] = (float)l;
    else sum += l;
  }
  if (reduction == UR_REDUCTION_MEAN) loss[0] = (float)(sum / (double)n);
  else if (reduction == UR_REDUCTION_SUM) loss[0] = (float)sum;
  return UR_STATUS_OK;
}

ur_status ur__cpu_bce_backward(void *stream, const void *logits, const float *targets,
                               const float *weights, void *glogits, int64_t n, ur_dtype dtype,
                               ur_reduction reduction, double scale) {
  (void)stream;
  double k = reduction == UR_REDUCTION_MEAN ? scale / (double)n : scale;
  for (int64_t i = 0; i < n; i++) {
    double g = k * (ur__bce_sigmoid(ur__dense_ld(logits, dtype, (size_t)i)) - targets[i]);
    if (weights) g *= weights[i];
    ur__dense_st(glogits, dtype, (size_t)i, (float)g);
  }
  return UR_STATUS_OK;
}

/* logits [n] or [n, 1]; targets and weights f32 of n elements. */
static ur_status bce_check(const char *op, const ur_tensor *logits, const ur_tensor *targets,
                           const ur_tensor *weights, ur_reduction reduction) {
  if (!logits) return ur__error(UR_STATUS_INVALID, "%s: logits is missing (NULL)", op);
  int64_t n = logits->shape[0];
  ur_status st = UR_STATUS_OK;
  if (logits->ndim > 2 || (logits->ndim == 2 && logits->shape[1] != 1))
    return ur__error(UR_STATUS_INVALID, "%s: logits has %d dimensions of which the second is "
                     "%lld; expected [rows] or [rows, 1]", op, (int)logits->ndim,
                     logits->ndim > 1 ? (long long)logits->shape[1] : 0LL);
  if ((st = ur__dense_check_numel(op, "logits", logits, 1, n)) ||
      (st = ur__dense_check_numel(op, "targets", targets, 0, n)) ||
      (weights && (st = ur__dense_check_numel(op, "weights", weights, 0, n))))
    return st;
  if ((unsigned)reduction >= UR_REDUCTION_COUNT)
    return ur__error(UR_STATUS_INVALID, "%s: reduction %d is not mean (0), sum (1) or none (2)",
                     op, (int)reduction);
  if (n == 0 && reduction == UR_REDUCTION_MEAN)
    return ur__error(UR_STATUS_INVALID, "%s: the mean of no samples is undefined (logits has 0 "
                     "rows)", op);
  return UR_STATUS_OK;
}

ur_status ur_bce_forward(ur_stream *s, const ur_tensor *logits, const ur_tensor *targets,
                         const ur_tensor *weights, ur_tensor *loss, ur_reduction reduction) {
  UR__ARGS(logits, targets, loss);
  const char *op = "bce forward";
  ur_status st = bce_check(op, logits, targets, weights, reduction);
  if (st) return st;
  int64_t n = logits->shape[0];
  if ((st = ur__dense_check_numel(op, "loss", loss, 0, reduction == UR_REDUCTION_NONE ? n : 1)))
    return st;
  const ur_tensor *ts[] = {logits, targets, weights, loss};
  const char *names[] = {"logits", "targets", "weights", "loss"};
  const ur_backend *b;
  if ((st = ur__dense_backend(op, 4, ts, names, &b)) || (st = UR__NEED(b, dense, bce_forward)))
    return st;
  return b->dense->bce_forward(ur__dense_stream(s), ur_tensor_data(logits), ur_tensor_data(targets),
                               weights ? ur_tensor_data(weights) : NULL, ur_tensor_data(loss), n,
                               logits->dtype, reduction);
}

ur_status ur_bce_backward(ur_stream *s, const ur_tensor *logits, const ur_tensor *targets,
                          const ur_tensor *weights, ur_tensor *glogits, ur_reduction reduction,
                          double scale) {
  UR__ARGS(logits, targets, glogits);
  const char *op = "bce backward";
  ur_status st = bce_check(op, logits, targets, weights, reduction);
  if (st) return st;
  int64_t n = logits->shape[0];
  if ((st = ur__dense_check_numel(op, "glogits", glogits, 1, n))) return st;
  if (glogits->dtype != logits->dtype)
    return ur__error(UR_STATUS_INVALID, "%s: glogits is %s but logits is %s; expected the same",
                     op, ur_dtype_name(glogits->dtype), ur_dtype_name(logits->dtype));
  if (!isfinite(scale))
    return ur__error(UR_STATUS_INVALID, "%s: scale %g is not finite", op, scale);
  const ur_tensor *ts[] = {logits, targets, weights, glogits};
  const char *names[] = {"logits", "targets", "weights", "glogits"};
  const ur_backend *b;
  if ((st = ur__dense_backend(op, 4, ts, names, &b)) || (st = UR__NEED(b, dense, bce_backward)) ||
      !n)
    return st;
  return b->dense->bce_backward(ur__dense_stream(s), ur_tensor_data(logits),
                                ur_tensor_data(targets), weights ? ur_tensor_data(weights) : NULL,
                                ur_tensor_data(glogits), n, logits->dtype, reduction, scale);
}
