/* metrics.c: streaming metrics of binary predictions (AUC exact over a window, lifetime AUC
 * from a histogram, grouped AUC, NE and log loss, accuracy, calibration, CTR) for many tasks
 * at once: the object, which takes its backend once, from its placement; the checks; and the
 * host-side arithmetic that turns the backend's raw sums into values.  The work itself is the
 * backend's metrics table (metrics_cpu.c, kernels/metrics.cu). */
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include "core/core.h"
#include "metrics/metrics.h"

#define UR_METRICS_MAX_TASKS 1024
#define UR_METRICS_MAX_BINS (1 << 24)
#define UR_METRICS_MAX_WINDOW 2147483647LL /* sorts index samples with 32 bits */

struct ur_metrics {
  ur_metrics_opts o;
  ur_place place;
  int32_t device;
  const ur_backend *b;     /* runs it: ur__backend_for(place), taken at ur_metrics_new */
  int gpu;                 /* b is the GPU's */
  int64_t seen;            /* samples since the last reset */
  uint64_t state_count;    /* doubles in state: tasks * (UR__M_SUMS + 2 * bins) */
  ur_tensor *state, *snap; /* f64 [state_count] */
  ur_tensor *ring_preds, *ring_labels, *ring_weights; /* f32 [window, tasks] */
  ur_tensor *ring_groups;  /* i64 [window], grouped only */
  ur_tensor *raw;          /* u8: [2][tasks][UR__M_RAW] doubles where the work runs */
  ur_tensor *raw_host;     /* pinned copy of raw (GPU only) */
  ur_tensor *scratch;      /* u8, for the GPU's sorts */
  size_t scratch_bytes;
};

size_t ur_sizeof_metrics_opts(void) { return sizeof(ur_metrics_opts); }
size_t ur_sizeof_metric_values(void) { return sizeof(ur_metric_values); }

/* ---- raw sums to values (host) ---- */

static double at_least(double v, double eta) { return v > eta ? v : eta; }

static void finish(const double *r, double eta, int has_auc, int has_gauc, ur_metric_values *v) {
  memset(v, 0, sizeof *v);
  double w = r[UR__M_WEIGHT], pos = r[UR__M_POS], neg = r[UR__M_NEG];
  v->weight = w;
  v->positive = pos;
  v->negative = neg;
  v->samples = (int64_t)r[UR__M_COUNT];
  v->ctr = pos / at_least(w, eta);
  v->calibration = r[UR__M_WPRED] / at_least(pos, eta);
  v->accuracy = r[UR__M_RIGHT] / at_least(w, eta);
  v->logloss = r[UR__M_CE] / at_least(w, eta);
  double base = pos / at_least(w, eta);
  base = base < eta ? eta : base > 1.0 - eta ? 1.0 - eta : base;
  double entropy = -(pos * log(base) + neg * log1p(-base));
  v->ne = r[UR__M_CE] / at_least(entropy, eta);
  int both = pos > 0 && neg > 0 && pos * neg > 0;
  if (has_auc) {
    double a = both ? r[UR__M_AUC_NUM] / (pos * neg) : 0.5;
    v->auc = a < 0 ? 0 : a > 1 ? 1 : a;
    v->auc_error = both ? 0.5 * r[UR__M_AUC_TIES] / (pos * neg) : 0;
  }
  if (has_gauc) {
    v->groups = (int64_t)r[UR__M_GAUC_GROUPS];
    v->grouped_auc = v->groups ? r[UR__M_GAUC_SUM] / (double)v->groups : 0.5;
  }
}

/* ---- checks ---- */

static void shape_str(const ur_tensor *t, char *buf, size_t len) {
  int n = snprintf(buf, len, "%s [", ur_dtype_name(ur_tensor_dtype(t)));
  for (int32_t i = 0; i < ur_tensor_ndim(t) && n > 0 && (size_t)n < len; i++)
    n += snprintf(buf + n, len - (size_t)n, "%s%lld", i ? ", " : "", (long long)ur_tensor_dim(t, i));
  if (n > 0 && (size_t)n < len) snprintf(buf + n, len - (size_t)n, "]");
}

static const char *where(const ur_metrics *m, char *buf, size_t len) {
  if (m->gpu) snprintf(buf, len, "%s memory of cuda:%d, run by the GPU", ur_place_name(m->place),
                       (int)m->device);
  else snprintf(buf, len, "%s memory, run by the CPU", ur_place_name(m->place));
  return buf;
}

/* The GPU reads device, managed and pinned memory; the CPU host, pinned and managed. */
static ur_status check_reach(const ur_metrics *m, const ur_tensor *t, const char *what) {
  ur_place p = ur_tensor_place(t);
  char buf[96];
  if (m->gpu && p == UR_PLACE_HOST)
    return ur__error(UR_STATUS_INVALID,
                     "metrics: %s are in host memory, which the GPU cannot read; the metric's "
                     "state is in %s (give device, managed or pinned tensors)",
                     what, where(m, buf, sizeof buf));
  if (m->gpu && p == UR_PLACE_DEVICE && m->place == UR_PLACE_DEVICE &&
      ur_tensor_device(t) != m->device)
    return ur__error(UR_STATUS_INVALID,
                     "metrics: %s are on cuda:%d but the metric's state is in %s", what,
                     (int)ur_tensor_device(t), where(m, buf, sizeof buf));
  if (!m->gpu && p == UR_PLACE_DEVICE)
    return ur__error(UR_STATUS_INVALID,
                     "metrics: %s are in device memory but the metric's state is in %s (build "
                     "the metric with placement 'device', or copy them)",
                     what, where(m, buf, sizeof buf));
  return UR_STATUS_OK;
}

/* Fills job's samples from the tensors: predictions and labels f32 [n] (one task) or
 * [n, tasks], weights f32 [n] or like predictions, groups i64 [n]. */
static ur_status check_inputs(const ur_metrics *m, const ur_tensor *p, const ur_tensor *l,
                              const ur_tensor *w, const ur_tensor *g, const char *call,
                              ur__metrics_job *j) {
  char a[96], b[96];
  int32_t T = m->o.tasks;
  if (!p || !l)
    return ur__error(UR_STATUS_INVALID, "metrics %s: predictions and labels are required", call);
  int64_t n = ur_tensor_dim(p, 0);
  int pd = ur_tensor_ndim(p);
  int shaped = ur_tensor_dtype(p) == UR_DTYPE_F32 &&
               ((pd == 1 && T == 1) || (pd == 2 && ur_tensor_dim(p, 1) == T));
  if (!shaped) {
    shape_str(p, a, sizeof a);
    return ur__error(UR_STATUS_INVALID,
                     "metrics %s: predictions are %s but the metric has %d task%s; expected f32 "
                     "[n, %d]%s",
                     call, a, (int)T, ur__s(T), (int)T, T == 1 ? " or [n]" : "");
  }
  if (ur_tensor_dtype(l) != UR_DTYPE_F32 || ur_tensor_numel(l) != ur_tensor_numel(p) ||
      ur_tensor_dim(l, 0) != n) {
    shape_str(l, a, sizeof a);
    shape_str(p, b, sizeof b);
    return ur__error(UR_STATUS_INVALID,
                     "metrics %s: labels are %s but predictions are %s; expected the same shape",
                     call, a, b);
  }
  int per_task = 0;
  if (w) {
    int64_t wn = ur_tensor_numel(w);
    per_task = T > 1 && wn == n * T;
    if (ur_tensor_dtype(w) != UR_DTYPE_F32 || ur_tensor_dim(w, 0) != n ||
        (wn != n && wn != n * T) || ur_tensor_ndim(w) > 2) {
      shape_str(w, a, sizeof a);
      return ur__error(UR_STATUS_INVALID,
                       "metrics %s: weights are %s; expected f32 [%lld] or [%lld, %d]", call, a,
                       (long long)n, (long long)n, (int)T);
    }
  }
  if (g && (ur_tensor_dtype(g) != UR_DTYPE_I64 || ur_tensor_ndim(g) != 1 ||
            ur_tensor_dim(g, 0) != n)) {
    shape_str(g, a, sizeof a);
    return ur__error(UR_STATUS_INVALID, "metrics %s: grouping keys are %s; expected i64 [%lld]",
                     call, a, (long long)n);
  }
  if (!g && m->o.grouped_auc)
    return ur__error(UR_STATUS_INVALID,
                     "metrics %s: grouped AUC needs grouping keys (i64 [%lld]), and none were "
                     "given", call, (long long)n);
  ur_status st;
  if ((st = check_reach(m, p, "predictions")) || (st = check_reach(m, l, "labels")) ||
      (w && (st = check_reach(m, w, "weights"))) ||
      (g && m->o.grouped_auc && (st = check_reach(m, g, "grouping keys"))))
    return st;
  j->n = n;
  j->preds = ur_tensor_data(p);
  j->labels = ur_tensor_data(l);
  j->weights = w ? ur_tensor_data(w) : NULL;
  j->weights_per_task = per_task;
  j->groups = g && m->o.grouped_auc ? ur_tensor_data(g) : NULL;
  return UR_STATUS_OK;
}

/* CPU work on memory the GPU may still be writing (pinned, managed) waits for it first; one
 * wait covers every tensor. */
static ur_status host_wait(const ur_metrics *m, const ur_tensor *const *ts, int n) {
  for (int i = 0; i < n; i++)
    if (ts[i] && ur_tensor_place(ts[i]) != UR_PLACE_HOST) return ur__tensor_ready(m->b, ts[i]);
  return UR_STATUS_OK;
}

/* ---- the object ---- */

static ur_tensor *bytes_tensor(ur_status *st, uint64_t bytes, ur_place place, int32_t device) {
  ur_tensor *t = NULL;
  int64_t shape[1] = {(int64_t)bytes};
  if (!*st) *st = ur_tensor_new(&t, UR_DTYPE_U8, 1, shape, place, device);
  return t;
}

static ur_tensor *ring_tensor(ur_status *st, ur_dtype dtype, int64_t rows, int64_t cols,
                              ur_place place, int32_t device) {
  ur_tensor *t = NULL;
  int64_t shape[2] = {rows, cols};
  if (!*st) *st = ur_tensor_new(&t, dtype, cols ? 2 : 1, shape, place, device);
  return t;
}

static ur__metrics_job base_job(const ur_metrics *m) {
  ur__metrics_job j;
  memset(&j, 0, sizeof j);
  j.tasks = m->o.tasks;
  j.threshold = m->o.threshold;
  j.eta = m->o.eta;
  j.bins = m->o.bins;
  j.state = ur_tensor_data(m->state);
  j.auc = m->o.auc;
  j.grouped = m->o.grouped_auc;
  return j;
}

/* The backend has every entry the object calls. */
static ur_status need_entries(const ur_backend *b) {
  ur_status st;
  if ((st = UR__NEED(b, metrics, update)) || (st = UR__NEED(b, metrics, window)) ||
      (st = UR__NEED(b, metrics, lifetime)))
    return st;
  return UR__NEED(b, metrics, scratch);
}

/* The scratch the backend's sorts need for n samples (none on the CPU), grown (never per
 * update) when short. */
static ur_status ensure_scratch(ur_metrics *m, ur__metrics_job *j) {
  size_t bytes = 0;
  ur_status st = m->b->metrics->scratch(j, &bytes);
  if (st || bytes <= m->scratch_bytes) return st;
  ur_tensor_free(m->scratch);
  m->scratch = bytes_tensor(&st, bytes, m->place, m->device);
  m->scratch_bytes = st ? 0 : bytes;
  return st;
}

static ur_status check_opts(const ur_metrics_opts *o) {
  if (!o) return ur__error(UR_STATUS_INVALID, "metrics: options are required");
  if (o->tasks < 1 || o->tasks > UR_METRICS_MAX_TASKS)
    return ur__error(UR_STATUS_INVALID, "metrics: %d tasks; expected 1 to %d", (int)o->tasks,
                     UR_METRICS_MAX_TASKS);
  if (o->window < 0 || o->window > UR_METRICS_MAX_WINDOW)
    return ur__error(UR_STATUS_INVALID, "metrics: a window of %lld samples; expected 0 to %lld",
                     (long long)o->window, UR_METRICS_MAX_WINDOW);
  if (o->bins < 0 || o->bins > UR_METRICS_MAX_BINS)
    return ur__error(UR_STATUS_INVALID,
                     "metrics: %d histogram bins; expected 0 (no lifetime AUC) to %d",
                     (int)o->bins, UR_METRICS_MAX_BINS);
  if ((o->auc || o->grouped_auc) && !o->window)
    return ur__error(UR_STATUS_INVALID, "metrics: %s AUC is computed over the window, and the "
                     "window is 0 samples", o->grouped_auc ? "grouped" : "exact");
  if (!isfinite(o->threshold))
    return ur__error(UR_STATUS_INVALID, "metrics: accuracy threshold %g is not finite",
                     o->threshold);
  if (!(o->eta > 0 && o->eta < 0.5))
    return ur__error(UR_STATUS_INVALID, "metrics: eta %g is outside (0, 0.5)", o->eta);
  return UR_STATUS_OK;
}

ur_status ur_metrics_new(ur_metrics **out, const ur_metrics_opts *opts, ur_place place,
                         int32_t device) {
  UR__ARGS(out, opts);
  *out = NULL;
  ur_status st = check_opts(opts);
  if (st) return st;
  ur_metrics *m = calloc(1, sizeof *m);
  if (!m) return ur__error(UR_STATUS_OOM, "metrics: out of host memory");
  m->o = *opts;
  m->o.auc = opts->auc != 0;
  m->o.grouped_auc = opts->grouped_auc != 0;
  m->place = place;
  m->device = device;
  m->b = ur__backend_for(place);
  m->gpu = m->b != ur__cpu();
  st = need_entries(m->b);
  int64_t T = opts->tasks, W = opts->window;
  m->state_count = (uint64_t)T * (UR__M_SUMS + 2 * (uint64_t)opts->bins);
  m->state = ring_tensor(&st, UR_DTYPE_F64, (int64_t)m->state_count, 0, place, device);
  m->snap = ring_tensor(&st, UR_DTYPE_F64, (int64_t)m->state_count, 0, place, device);
  if (W) {
    m->ring_preds = ring_tensor(&st, UR_DTYPE_F32, W, T, place, device);
    m->ring_labels = ring_tensor(&st, UR_DTYPE_F32, W, T, place, device);
    m->ring_weights = ring_tensor(&st, UR_DTYPE_F32, W, T, place, device);
    if (opts->grouped_auc) m->ring_groups = ring_tensor(&st, UR_DTYPE_I64, W, 0, place, device);
  }
  uint64_t raw_bytes = 2 * (uint64_t)T * UR__M_RAW * sizeof(double);
  m->raw = bytes_tensor(&st, raw_bytes, place, device);
  /* The GPU's results come back through pinned memory. */
  if (m->gpu) m->raw_host = bytes_tensor(&st, raw_bytes, UR_PLACE_PINNED, UR_LOC_CPU);
  if (!st) st = ur_metrics_reset(NULL, m);
  if (!st && W && (opts->auc || opts->grouped_auc)) {
    ur__metrics_job j = base_job(m);
    j.n = W;
    st = ensure_scratch(m, &j);
  }
  if (!st) st = m->b->stream_sync(NULL);
  if (st) {
    ur_metrics_free(m);
    return st;
  }
  *out = m;
  return UR_STATUS_OK;
}

void ur_metrics_free(ur_metrics *m) {
  if (!m) return;
  ur_tensor *ts[] = {m->state, m->snap, m->ring_preds, m->ring_labels, m->ring_weights,
                     m->ring_groups, m->raw, m->raw_host, m->scratch};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) ur_tensor_free(ts[i]);
  free(m);
}

ur_status ur_metrics_update(ur_stream *s, ur_metrics *m, const ur_tensor *predictions,
                            const ur_tensor *labels, const ur_tensor *weights,
                            const ur_tensor *groups) {
  UR__ARGS(m, predictions, labels);
  ur__metrics_job j = base_job(m);
  ur_status st = check_inputs(m, predictions, labels, weights, groups, "update", &j);
  if (st || !j.n) return st;
  if (m->o.window) {
    j.window = m->o.window;
    j.at = m->seen % m->o.window;
    j.ring_preds = ur_tensor_data(m->ring_preds);
    j.ring_labels = ur_tensor_data(m->ring_labels);
    j.ring_weights = ur_tensor_data(m->ring_weights);
    j.ring_groups = m->ring_groups ? ur_tensor_data(m->ring_groups) : NULL;
  }
  const ur_tensor *ts[] = {predictions, labels, weights, groups, m->state};
  if (!(st = host_wait(m, ts, 5))) st = m->b->metrics->update(s ? s->handle : NULL, &j);
  if (!st) m->seen += j.n;
  return st;
}

ur_status ur_metrics_reset(ur_stream *s, ur_metrics *m) {
  UR__ARGS(m);
  ur_status st = ur_tensor_fill(s, m->state, 0);
  if (!st) m->seen = 0;
  return st;
}

int64_t ur_metrics_seen(const ur_metrics *m) {
  UR__ARGS_OR(-1, m);
  return m->seen;
}
int32_t ur_metrics_on_gpu(const ur_metrics *m) {
  UR__ARGS_OR(-1, m);
  return m->gpu;
}

ur_status ur_metrics_snapshot(ur_stream *s, ur_metrics *m, double **state, uint64_t *count) {
  UR__ARGS(m, state, count);
  ur_status st = ur_tensor_copy(s, m->state, m->snap);
  *state = st ? NULL : ur_tensor_data(m->snap);
  *count = st ? 0 : m->state_count;
  return st;
}

ur_status ur_metrics_snapshot_tensor(ur_stream *s, ur_metrics *m, ur_tensor **out) {
  UR__ARGS(m, out);
  *out = NULL;
  ur_status st = ur_tensor_copy(s, m->state, m->snap);
  return st ? st : ur_tensor_view(m->snap, out, 0, (int64_t)m->state_count);
}

ur_status ur_metrics_window(const ur_metrics *m, ur_tensor **predictions, ur_tensor **labels,
                            ur_tensor **weights, ur_tensor **groups) {
  UR__ARGS(m, predictions, labels, weights, groups);
  *predictions = *labels = *weights = *groups = NULL;
  if (!m->o.window)
    return ur__error(UR_STATUS_INVALID, "metrics window: the metric keeps no window (0 samples)");
  int64_t n = m->seen < m->o.window ? m->seen : m->o.window;
  ur_status st = ur_tensor_view(m->ring_preds, predictions, 0, n);
  if (!st) st = ur_tensor_view(m->ring_labels, labels, 0, n);
  if (!st) st = ur_tensor_view(m->ring_weights, weights, 0, n);
  if (!st && m->ring_groups) st = ur_tensor_view(m->ring_groups, groups, 0, n);
  if (st) {
    ur_tensor_free(*predictions);
    ur_tensor_free(*labels);
    ur_tensor_free(*weights);
    *predictions = *labels = *weights = NULL;
  }
  return st;
}

ur_status ur_metrics_compute(ur_stream *s, ur_metrics *m, int32_t from_snapshot,
                             const ur_tensor *predictions, const ur_tensor *labels,
                             const ur_tensor *weights, const ur_tensor *groups,
                             ur_metric_values *window, ur_metric_values *lifetime) {
  UR__ARGS(m, window, lifetime);
  int32_t T = m->o.tasks;
  ur__metrics_job wj = base_job(m), lj = base_job(m);
  ur_status st = UR_STATUS_OK;
  if (predictions) {
    if ((st = check_inputs(m, predictions, labels, weights, groups, "compute", &wj))) return st;
    if (wj.n > UR_METRICS_MAX_WINDOW)
      return ur__error(UR_STATUS_INVALID, "metrics compute: %lld samples; at most %lld at once",
                       (long long)wj.n, UR_METRICS_MAX_WINDOW);
  } else if (m->o.window) {
    wj.n = m->seen < m->o.window ? m->seen : m->o.window;
    wj.preds = ur_tensor_data(m->ring_preds);
    wj.labels = ur_tensor_data(m->ring_labels);
    wj.weights = ur_tensor_data(m->ring_weights);
    wj.weights_per_task = 1;
    wj.groups = m->ring_groups ? ur_tensor_data(m->ring_groups) : NULL;
  }
  wj.auc = m->o.auc && wj.n > 0;
  wj.grouped = m->o.grouped_auc && wj.n > 0;
  double *raw = ur_tensor_data(m->raw);
  wj.raw = raw;
  lj.raw = raw + (size_t)T * UR__M_RAW;
  if (from_snapshot) lj.state = ur_tensor_data(m->snap);
  const ur_backend *b = m->b;
  void *sh = s ? s->handle : NULL;
  const ur_tensor *ts[] = {predictions, labels, weights, groups, m->state};
  st = host_wait(m, ts, 5);
  if (!st && (wj.auc || wj.grouped)) st = ensure_scratch(m, &wj);
  wj.scratch = m->scratch ? ur_tensor_data(m->scratch) : NULL;
  wj.scratch_bytes = m->scratch_bytes;
  if (!st) st = b->metrics->window(sh, &wj);
  if (!st) st = b->metrics->lifetime(sh, &lj);
  const double *host_raw = raw;
  if (!st && m->raw_host) {
    st = b->copy(sh, ur_tensor_data(m->raw_host), raw, ur_tensor_nbytes(m->raw));
    host_raw = ur_tensor_data(m->raw_host);
  }
  if (!st) st = b->stream_sync(sh);
  if (st) return st;
  for (int32_t t = 0; t < T; t++) {
    double in_window = host_raw[(size_t)t * UR__M_RAW + UR__M_BAD];
    double in_lifetime = host_raw[(size_t)(T + t) * UR__M_RAW + UR__M_BAD];
    if (in_window > 0 || in_lifetime > 0)
      return ur__error(UR_STATUS_INVALID,
                       "metrics compute: task %d (of %d, from 0) holds samples with a label outside "
                       "[0, 1], a weight below 0, or a prediction, label or weight that is not finite: "
                       "%.0f in the lifetime since reset, %.0f in the window; expected labels in [0, 1], "
                       "weights of 0 or more and finite predictions (the state is kept; reset() drops it)",
                       (int)t, (int)T, in_lifetime, in_window);
  }
  for (int32_t t = 0; t < T; t++) {
    finish(host_raw + (size_t)t * UR__M_RAW, m->o.eta, m->o.auc && m->o.window, m->o.grouped_auc,
           &window[t]);
    finish(host_raw + (size_t)(T + t) * UR__M_RAW, m->o.eta, m->o.bins > 0, 0, &lifetime[t]);
  }
  return UR_STATUS_OK;
}
