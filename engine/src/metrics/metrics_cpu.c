/* metrics_cpu.c: the CPU backend's metrics table, the reference: the jobs of metrics.h, as
 * kernels/metrics.cu runs them on the GPU, with sums in double in sample order.  The window's
 * exact AUC sorts each task's samples by (group, prediction) with qsort, in host memory it
 * takes per compute, so it asks for no scratch. */
#include <stdlib.h>
#include <string.h>
#include "metrics/metrics.h"

static double weight_of(const ur__metrics_job *j, int64_t i, int32_t t) {
  if (!j->weights) return 1.0;
  return j->weights_per_task ? j->weights[i * j->tasks + t] : j->weights[i];
}

/* Adds job's samples into sums (task t at sums + t * stride) and, when hist is given, into
 * the histograms. */
static void cpu_sums(const ur__metrics_job *j, double *sums, int64_t stride, double *hist) {
  for (int32_t t = 0; t < j->tasks; t++) {
    double acc[UR__M_SUMS] = {0}, v[UR__M_SUMS];
    double *hpos = hist ? hist + (size_t)t * 2 * (size_t)j->bins : NULL;
    for (int64_t i = 0; i < j->n; i++) {
      double p = j->preds[i * j->tasks + t], y = j->labels[i * j->tasks + t];
      ur__metrics_terms(p, y, weight_of(j, i, t), j->threshold, j->eta, v);
      for (int k = 0; k < UR__M_COUNT; k++) acc[k] += v[k];
      if (hpos) {
        int64_t b = ur__metrics_bin(p, j->bins);
        hpos[b] += v[UR__M_POS];
        hpos[j->bins + b] += v[UR__M_NEG];
      }
    }
    acc[UR__M_COUNT] = (double)j->n;
    for (int k = 0; k < UR__M_SUMS; k++) sums[t * stride + k] += acc[k];
  }
}

static void cpu_ring(const ur__metrics_job *j) {
  int64_t first = j->n > j->window ? j->n - j->window : 0;
  for (int64_t b = first; b < j->n; b++) {
    int64_t slot = (j->at + b) % j->window;
    for (int32_t t = 0; t < j->tasks; t++) {
      j->ring_preds[slot * j->tasks + t] = j->preds[b * j->tasks + t];
      j->ring_labels[slot * j->tasks + t] = j->labels[b * j->tasks + t];
      j->ring_weights[slot * j->tasks + t] = (float)weight_of(j, b, t);
    }
    if (j->ring_groups) j->ring_groups[slot] = j->groups[b];
  }
}

static ur_status cpu_update(void *stream, const ur__metrics_job *j) {
  (void)stream;
  cpu_sums(j, j->state, UR__M_SUMS, j->bins ? j->state + (size_t)j->tasks * UR__M_SUMS : NULL);
  if (j->window) cpu_ring(j);
  return UR_STATUS_OK;
}

typedef struct sort_entry {
  uint64_t group;
  uint32_t key, index;
} sort_entry;

static int entry_cmp(const void *a, const void *b) {
  const sort_entry *x = a, *y = b;
  if (x->group != y->group) return x->group < y->group ? -1 : 1;
  return x->key < y->key ? -1 : x->key > y->key;
}

/* Sorts task t's samples by (group, prediction) and walks the runs of equal predictions:
 * each run's positives beat the negatives below it and tie (half) with its own. */
static void cpu_auc_terms(const ur__metrics_job *j, int32_t t, int grouped, sort_entry *e,
                          double *raw) {
  for (int64_t i = 0; i < j->n; i++) {
    e[i].group = grouped ? (uint64_t)j->groups[i] ^ 0x8000000000000000ull : 0;
    e[i].key = ur__metrics_pred_key(j->preds[i * j->tasks + t]);
    e[i].index = (uint32_t)i;
  }
  qsort(e, (size_t)j->n, sizeof *e, entry_cmp);
  double num = 0, below = 0, gp = 0, gn = 0;
  for (int64_t r = 0; r < j->n;) {
    double pos = 0, neg = 0;
    int64_t s = r;
    for (; s < j->n && e[s].group == e[r].group && e[s].key == e[r].key; s++) {
      uint32_t i = e[s].index;
      double w = weight_of(j, i, t), y = j->labels[(int64_t)i * j->tasks + t];
      pos += w * y;
      neg += w * (1.0 - y);
    }
    num += pos * (below + 0.5 * neg);
    below += neg;
    gp += pos;
    gn += neg;
    r = s;
    if (r == j->n || e[r].group != e[s - 1].group) {
      if (!grouped) {
        raw[UR__M_AUC_NUM] += num;
      } else if (gp > 0 && gn > 0 && gp * gn > 0) {
        raw[UR__M_GAUC_SUM] += num / (gp * gn);
        raw[UR__M_GAUC_GROUPS] += 1;
      }
      num = below = gp = gn = 0;
    }
  }
}

static ur_status cpu_window(void *stream, const ur__metrics_job *j) {
  (void)stream;
  memset(j->raw, 0, sizeof(double) * (size_t)j->tasks * UR__M_RAW);
  if (!j->n) return UR_STATUS_OK;
  cpu_sums(j, j->raw, UR__M_RAW, NULL);
  if (!j->auc && !j->grouped) return UR_STATUS_OK;
  sort_entry *e = malloc(sizeof *e * (size_t)j->n);
  if (!e)
    return ur__error(UR_STATUS_OOM, "metrics: out of host memory sorting %lld samples",
                     (long long)j->n);
  for (int32_t t = 0; t < j->tasks; t++) {
    if (j->auc) cpu_auc_terms(j, t, 0, e, j->raw + (size_t)t * UR__M_RAW);
    if (j->grouped) cpu_auc_terms(j, t, 1, e, j->raw + (size_t)t * UR__M_RAW);
  }
  free(e);
  return UR_STATUS_OK;
}

/* Bins are in prediction order, so only pairs sharing a bin are not ordered: they count as
 * ties, which is where the error bound comes from. */
static ur_status cpu_lifetime(void *stream, const ur__metrics_job *j) {
  (void)stream;
  for (int32_t t = 0; t < j->tasks; t++) {
    double *raw = j->raw + (size_t)t * UR__M_RAW;
    memset(raw, 0, sizeof(double) * UR__M_RAW);
    memcpy(raw, j->state + (size_t)t * UR__M_SUMS, sizeof(double) * UR__M_SUMS);
    if (!j->bins) continue;
    const double *pos = j->state + (size_t)j->tasks * UR__M_SUMS + (size_t)t * 2 * (size_t)j->bins;
    const double *neg = pos + j->bins;
    double num = 0, ties = 0, below = 0;
    for (int32_t b = 0; b < j->bins; b++) {
      num += pos[b] * (below + 0.5 * neg[b]);
      ties += pos[b] * neg[b];
      below += neg[b];
    }
    raw[UR__M_AUC_NUM] = num;
    raw[UR__M_AUC_TIES] = ties;
  }
  return UR_STATUS_OK;
}

static ur_status cpu_scratch(const ur__metrics_job *j, size_t *bytes) {
  (void)j;
  *bytes = 0;
  return UR_STATUS_OK;
}

const ur_metrics_ops ur__cpu_metrics_ops = {
    .update = cpu_update,
    .window = cpu_window,
    .lifetime = cpu_lifetime,
    .scratch = cpu_scratch,
};
