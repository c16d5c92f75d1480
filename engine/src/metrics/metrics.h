/* metrics.h: the job the metrics' backend entries run (built by metrics.c, run by the CPU
 * reference in metrics_cpu.c and by kernels/metrics.cu), the per-element rules both share, so
 * that the CPU and the GPU bin, key and weigh every sample alike, and the metrics' ops table. */
#ifndef UR_METRICS_H
#define UR_METRICS_H

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "core/core.h"

#if defined(__CUDACC__)
#define UR__MHD __host__ __device__ __forceinline__
#else
#define UR__MHD static inline
#endif

/* Per-task raw values: the sums first (the lifetime state holds these per task, then the
 * histograms), then the AUC terms a compute adds. */
enum {
  UR__M_WEIGHT = 0, /* sum of w */
  UR__M_POS,        /* sum of w * y */
  UR__M_NEG,        /* sum of w * (1 - y) */
  UR__M_WPRED,      /* sum of w * p */
  UR__M_CE,         /* sum of w-weighted cross-entropy, p clamped to [eta, 1 - eta] */
  UR__M_RIGHT,      /* sum of w * (p >= threshold ? y : 1 - y) */
  UR__M_BAD,        /* samples outside the definitions (ur__metrics_bad): compute fails on any */
  UR__M_COUNT,      /* samples */
  UR__M_SUMS,       /* = 8 sums */
  UR__M_AUC_NUM = UR__M_SUMS, /* sum over runs of equal predictions: pos * (neg below + neg / 2) */
  UR__M_AUC_TIES,   /* histogram: sum over bins of pos * neg */
  UR__M_GAUC_SUM,   /* sum of the AUCs of groups holding both classes */
  UR__M_GAUC_GROUPS,/* how many */
  UR__M_RAW         /* = 12 */
};

typedef struct ur__metrics_job {
  int32_t tasks;
  /* Samples: a batch or a window. preds, labels [n, tasks]; weights NULL, [n] or
   * [n, tasks] (weights_per_task); groups NULL or [n]. */
  int64_t n;
  const float *preds, *labels, *weights;
  int32_t weights_per_task;
  const int64_t *groups;
  double threshold, eta;
  /* Lifetime state: sums [tasks, UR__M_SUMS], then histograms [tasks, 2, bins] (positive
   * then negative weight per bin). */
  double *state;
  int32_t bins;
  /* The window ring: [window, tasks] each, groups [window] (NULL unless grouped); the
   * batch's sample b lands in slot (at + b) % window, for its last min(n, window) samples. */
  float *ring_preds, *ring_labels, *ring_weights;
  int64_t *ring_groups;
  int64_t window, at;
  /* Compute: which AUCs, raw [tasks, UR__M_RAW] out, scratch for the sorts. */
  int32_t auc, grouped;
  double *raw;
  void *scratch;
  size_t scratch_bytes;
} ur__metrics_job;

/* A sort key whose unsigned order is the float order, with -0 and +0 one key (a tie). */
UR__MHD uint32_t ur__metrics_pred_key(float p) {
  uint32_t u;
  memcpy(&u, &p, sizeof u);
  if ((u << 1) == 0) u = 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* The histogram bin of a prediction: [0, 1] cut in bins equal parts, outside values into the
 * end bins (NaN into the first).  One multiply and a truncation, exact on both sides. */
UR__MHD int64_t ur__metrics_bin(double p, int32_t bins) {
  if (!(p > 0.0)) return 0;
  if (p >= 1.0) return bins - 1;
  int64_t b = (int64_t)(p * (double)bins);
  return b < bins ? b : bins - 1;
}

/* A sample the metrics' definitions do not cover: a label outside [0, 1], a weight below 0,
 * or a prediction, label or weight that is not finite (NaN or infinite).  Its sums would be
 * wrong (a negative weight of positives, a NaN ranked above every prediction), so it is
 * counted, and compute fails on a count above 0 instead of returning them. */
UR__MHD int ur__metrics_bad(double p, double y, double w) {
  return !(y >= 0.0 && y <= 1.0 && w >= 0.0 && w <= DBL_MAX && p >= -DBL_MAX && p <= DBL_MAX);
}

/* The per-sample terms of the sums (all but the count), in double. */
UR__MHD void ur__metrics_terms(double p, double y, double w, double threshold, double eta,
                               double *v) {
  double pos = w * y, neg = w * (1.0 - y);
  v[UR__M_BAD] = ur__metrics_bad(p, y, w) ? 1.0 : 0.0;
  double pc = p < eta ? eta : p > 1.0 - eta ? 1.0 - eta : p;
  v[UR__M_WEIGHT] = w;
  v[UR__M_POS] = pos;
  v[UR__M_NEG] = neg;
  v[UR__M_WPRED] = w * p;
  v[UR__M_CE] = -(pos * log(pc) + neg * log1p(-pc));
  v[UR__M_RIGHT] = p >= threshold ? pos : neg;
}

/* The metrics' ops table, filled by the CPU reference (metrics_cpu.c) and by the CUDA backend
 * (kernels/metrics.cu); metrics.c has checked every tensor.  update adds a batch to
 * job->state and job's ring; window puts the raw values of job's samples into job->raw (AUC
 * terms included as job->auc and job->grouped ask); lifetime puts those of job->state into
 * job->raw; scratch says what window needs. */
typedef struct ur_metrics_ops {
  ur_status (*update)(void *stream, const struct ur__metrics_job *job);
  ur_status (*window)(void *stream, const struct ur__metrics_job *job);
  ur_status (*lifetime)(void *stream, const struct ur__metrics_job *job);
  ur_status (*scratch)(const struct ur__metrics_job *job, size_t *bytes);
} ur_metrics_ops;

/* The CPU backend's metrics table (metrics_cpu.c), the reference. */
UR__HIDDEN extern const ur_metrics_ops ur__cpu_metrics_ops;

#endif
