/* hints.c: memory hints on managed tensors.  Ranges are rounded outward to whole pages and the
 * rounding reported; every advise and prefetch is recorded (a per-storage map of the advice in
 * force, and a log), so hint policies run and are tested without a GPU, and HBM accounting
 * knows which managed bytes were placed on a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "core/core.h"

#define LOG_CAP 4096

static ur_hint_record log_ring[LOG_CAP];
static uint64_t log_total;

/* ---- segment maps: sorted, non-overlapping, covering [0, alloc_bytes) ---- */

static ur_status segmap_copy(ur__segmap *dst, const ur__segmap *src) {
  dst->v = malloc((src->n + 2) * sizeof *dst->v);
  if (!dst->v) return ur__error(UR_STATUS_OOM, "hints: out of host memory");
  memcpy(dst->v, src->v, src->n * sizeof *dst->v);
  dst->n = src->n;
  dst->cap = src->n + 2;
  return UR_STATUS_OK;
}

/* The index of the segment holding byte pos. */
static size_t seg_find(const ur__segmap *m, uint64_t pos) {
  size_t lo = 0, hi = m->n;
  while (hi - lo > 1) {
    size_t mid = (lo + hi) / 2;
    if (m->v[mid].begin <= pos) lo = mid;
    else hi = mid;
  }
  return lo;
}

/* Makes pos a segment boundary; the map has room (cap >= n + 2 for two splits). */
static void seg_split(ur__segmap *m, uint64_t pos) {
  size_t i = seg_find(m, pos);
  if (m->v[i].begin == pos || pos >= m->v[i].end) return;
  memmove(&m->v[i + 2], &m->v[i + 1], (m->n - i - 1) * sizeof *m->v);
  m->v[i + 1] = m->v[i];
  m->v[i].end = pos;
  m->v[i + 1].begin = pos;
  m->n++;
}

static int seg_same(const ur__seg *a, const ur__seg *b) {
  return a->preferred == b->preferred && a->prefetched == b->prefetched &&
         a->read_mostly == b->read_mostly && a->accessed_by_cpu == b->accessed_by_cpu &&
         a->accessed_by_gpus == b->accessed_by_gpus;
}

static void seg_merge(ur__segmap *m) {
  size_t k = 0;
  for (size_t i = 1; i < m->n; i++) {
    if (seg_same(&m->v[k], &m->v[i])) m->v[k].end = m->v[i].end;
    else m->v[++k] = m->v[i];
  }
  m->n = k + 1;
}

/* advice < 0: a prefetch to loc. */
static void seg_apply(ur__segmap *m, uint64_t begin, uint64_t end, int advice, int32_t loc) {
  seg_split(m, begin);
  seg_split(m, end);
  for (size_t i = seg_find(m, begin); i < m->n && m->v[i].begin < end; i++) {
    ur__seg *s = &m->v[i];
    switch (advice) {
      case UR_ADVICE_PREFERRED_LOCATION: s->preferred = loc; break;
      case UR_ADVICE_UNSET_PREFERRED_LOCATION: s->preferred = UR_LOC_NONE; break;
      case UR_ADVICE_ACCESSED_BY:
        if (loc == UR_LOC_CPU) s->accessed_by_cpu = 1;
        else s->accessed_by_gpus |= 1ull << loc;
        break;
      case UR_ADVICE_UNSET_ACCESSED_BY:
        if (loc == UR_LOC_CPU) s->accessed_by_cpu = 0;
        else s->accessed_by_gpus &= ~(1ull << loc);
        break;
      case UR_ADVICE_READ_MOSTLY: s->read_mostly = 1; break;
      case UR_ADVICE_UNSET_READ_MOSTLY: s->read_mostly = 0; break;
      default: s->prefetched = loc; break;
    }
  }
  seg_merge(m);
}

/* A segment a GPU holds or is asked to hold: preferred there, or prefetched there. */
static int seg_gpu(const ur__seg *g) { return g->preferred >= 0 || g->prefetched >= 0; }

static uint64_t seg_on_gpu(const ur__segmap *m) {
  uint64_t b = 0;
  for (size_t i = 0; i < m->n; i++)
    if (seg_gpu(&m->v[i])) b += m->v[i].end - m->v[i].begin;
  return b;
}

uint64_t ur__hint_gpu_run(const ur_tensor *t, int64_t first, int64_t numel) {
  const ur__storage *st = t->st;
  if (st->place != UR_PLACE_MANAGED || numel <= 0) return 0;
  uint64_t es = ur_dtype_size(t->dtype);
  uint64_t begin = (uint64_t)(t->offset + first) * es, end = begin + (uint64_t)numel * es;
  uint64_t at = begin;
  pthread_mutex_lock(&ur__lock);
  const ur__segmap *m = &st->hints;
  for (size_t i = m->n ? seg_find(m, begin) : 0; i < m->n && at < end; i++) {
    const ur__seg *g = &m->v[i];
    if (g->begin > at || !seg_gpu(g)) break;
    at = g->end;
  }
  pthread_mutex_unlock(&ur__lock);
  return (at < end ? at : end) - begin;
}

/* ---- ranges ---- */

static ur_status hint_range(const ur_tensor *t, int64_t offset, int64_t numel, const char *what,
                            ur_range *r) {
  char desc[256];
  if (t->st->place != UR_PLACE_MANAGED) {
    ur_tensor_describe(t, desc, sizeof desc);
    return ur__error(UR_STATUS_INVALID, "%s: memory hints need a managed tensor; got %s", what,
                     desc);
  }
  if (offset < 0 || numel < 1 || offset > t->numel - numel)
    return ur__error(UR_STATUS_INVALID,
                     "%s: range offset %lld, numel %lld is outside the tensor's %lld elements; "
                     "expected 0 <= offset, 1 <= numel, offset + numel <= %lld",
                     what, (long long)offset, (long long)numel, (long long)t->numel,
                     (long long)t->numel);
  uint64_t es = ur_dtype_size(t->dtype), pg = ur_hint_page_bytes_get();
  uint64_t b = (uint64_t)(t->offset + offset) * es, e = b + (uint64_t)numel * es;
  r->offset = offset;
  r->numel = numel;
  r->page_bytes = pg;
  r->byte_begin = b / pg * pg;
  r->byte_end = (e + pg - 1) / pg * pg;
  if (r->byte_end > t->st->alloc_bytes) r->byte_end = t->st->alloc_bytes;
  r->rounded = r->byte_begin != b || r->byte_end != e;
  return UR_STATUS_OK;
}

ur_status ur__hint_location(int32_t loc, int32_t gpu, const char *what, const char *current,
                            int32_t *out) {
  int n = ur_device_count();
  if (loc == UR_LOC_CURRENT_GPU) {
    if (gpu >= 0) {
      *out = gpu;
      return UR_STATUS_OK;
    }
    if (!n) {
      *out = 0; /* without a GPU, "gpu" is recorded as the first one */
      return UR_STATUS_OK;
    }
    return ur_device_get(out);
  }
  if (loc == UR_LOC_CPU || (loc >= 0 && loc <= UR_MAX_GPUS && (!n || loc < n))) {
    *out = loc;
    return UR_STATUS_OK;
  }
  if (loc >= 0 && loc <= UR_MAX_GPUS)
    return ur__error(UR_STATUS_INVALID, "%s: location cuda:%d does not exist; this machine has %d GPU%s",
                     what, (int)loc, n, ur__s(n));
  return ur__error(UR_STATUS_INVALID,
                   "%s: location %d is not a location; expected -1 (cpu), -2 (%s) or a GPU number",
                   what, (int)loc, current);
}

static void log_add(const ur_tensor *t, int advice, int32_t loc, int applied, const ur_range *r) {
  ur_hint_record *rec = &log_ring[log_total % LOG_CAP];
  rec->seq = ++log_total;
  rec->tensor_id = t->st->id;
  rec->is_prefetch = advice < 0;
  rec->advice = advice;
  rec->location = loc;
  rec->applied = applied;
  rec->range = *r;
}

/* Applies one hint to the record, the budget and (with a GPU) the driver, or none of them. */
static ur_status apply_hint(ur_stream *s, ur_tensor *t, int advice, int32_t loc, const ur_range *r,
                            const char *what) {
  ur__storage *st = t->st;
  ur__segmap next;
  pthread_mutex_lock(&ur__lock);
  ur_status rc = segmap_copy(&next, &st->hints);
  if (rc) goto out;
  seg_apply(&next, r->byte_begin, r->byte_end, advice, loc);
  uint64_t before = st->on_gpu, after = seg_on_gpu(&next);
  if (after > before) {
    char what_bytes[160];
    snprintf(what_bytes, sizeof what_bytes, "%s on managed tensor #%llu", what,
             (unsigned long long)st->id);
    if ((rc = ur__hbm_reserve(after - before, what_bytes))) {
      ur__segmap_free(&next);
      goto out;
    }
  }
  const ur_backend *g = ur__gpu();
  if (g) {
    void *p = (char *)st->data + r->byte_begin;
    size_t n = (size_t)(r->byte_end - r->byte_begin);
    rc = advice < 0 ? g->prefetch(s ? s->handle : NULL, p, n, loc)
                    : g->advise(p, n, (ur_advice)advice, loc);
    if (rc) {
      if (after > before) ur__hbm_release(after - before);
      ur__segmap_free(&next);
      goto out;
    }
  }
  if (after < before) ur__hbm_release(before - after);
  ur__managed_gpu_add((int64_t)after - (int64_t)before);
  st->on_gpu = after;
  ur__segmap_free(&st->hints);
  st->hints = next;
  log_add(t, advice, loc, g != NULL, r);
out:
  pthread_mutex_unlock(&ur__lock);
  return rc;
}

ur_status ur_tensor_advise(ur_tensor *t, int64_t offset, int64_t numel, ur_range *out,
                           ur_advice advice, int32_t location) {
  UR__ARGS(t);
  ur_range r;
  int32_t loc;
  if ((unsigned)advice >= UR_ADVICE_COUNT)
    return ur__error(UR_STATUS_INVALID, "advise: advice %d is not a memory advice", (int)advice);
  ur_status s = hint_range(t, offset, numel, "advise", &r);
  if (!s) s = ur__hint_location(location, -1, "advise", "current gpu", &loc);
  if (!s) s = apply_hint(NULL, t, (int)advice, loc, &r, ur_advice_name(advice));
  if (!s && out) *out = r;
  return s;
}

ur_status ur_tensor_prefetch(ur_stream *str, ur_tensor *t, int64_t offset, int64_t numel,
                             ur_range *out, int32_t location) {
  UR__ARGS(t);
  ur_range r;
  int32_t loc;
  ur_status s = hint_range(t, offset, numel, "prefetch", &r);
  if (!s) s = ur__hint_location(location, -1, "prefetch", "current gpu", &loc);
  if (!s) s = apply_hint(str, t, -1, loc, &r, "prefetch");
  if (!s && out) *out = r;
  return s;
}

static void recorded_advice(const ur_tensor *t, const ur_range *rp, ur_advised *out);

static int32_t agree(int32_t acc, int32_t v, int first) {
  return first ? v : (acc == v ? acc : UR_LOC_MIXED);
}

ur_status ur_tensor_advised(const ur_tensor *t, int64_t offset, int64_t numel, ur_advised *out) {
  UR__ARGS(t, out);
  ur_range r;
  ur_status s = hint_range(t, offset, numel, "advised", &r);
  if (s) return s;
  memset(out, 0, sizeof *out);
  out->range = r;
  const ur_backend *g = ur__gpu();
  if (g && g->range_attrs) {
    ur_advised rec;
    s = g->range_attrs((char *)t->st->data + r.byte_begin, (size_t)(r.byte_end - r.byte_begin), out);
    if (s) return s;
    /* The driver answers a location only when every page agrees, and the same "invalid" for
     * "none set" and "pages differ".  The engine's record tells those two apart; where it
     * names a location the driver did not confirm, the honest answer is mixed. */
    recorded_advice(t, &r, &rec);
    if (out->preferred_location < 0)
      out->preferred_location = rec.preferred_location < 0 ? rec.preferred_location : UR_LOC_MIXED;
    if (out->last_prefetch_location < 0)
      out->last_prefetch_location =
          rec.last_prefetch_location < 0 ? rec.last_prefetch_location : UR_LOC_MIXED;
    out->range = r;
    out->from_driver = 1;
    return UR_STATUS_OK;
  }
  recorded_advice(t, &r, out);
  return UR_STATUS_OK;
}

/* The advice in force over a range as the engine recorded it (cpu, a GPU, none or mixed). */
static void recorded_advice(const ur_tensor *t, const ur_range *rp, ur_advised *out) {
  ur_range r = *rp;
  memset(out, 0, sizeof *out);
  out->range = r;
  pthread_mutex_lock(&ur__lock);
  const ur__segmap *m = &t->st->hints;
  int first = 1;
  uint64_t gpus = ~0ull;
  int32_t rm = 0, cpu = 0;
  for (size_t i = seg_find(m, r.byte_begin); i < m->n && m->v[i].begin < r.byte_end; i++) {
    const ur__seg *g2 = &m->v[i];
    out->preferred_location = agree(out->preferred_location, g2->preferred, first);
    out->last_prefetch_location = agree(out->last_prefetch_location, g2->prefetched, first);
    rm = first ? g2->read_mostly : (rm == g2->read_mostly ? rm : -1);
    cpu = first ? g2->accessed_by_cpu : (cpu == g2->accessed_by_cpu ? cpu : -1);
    gpus &= g2->accessed_by_gpus;
    first = 0;
  }
  pthread_mutex_unlock(&ur__lock);
  out->read_mostly = rm;
  out->accessed_by_cpu = cpu;
  out->accessed_by_gpus = gpus;
  out->from_driver = 0;
}

/* The device must read this many times as fast as pinned host memory for a verdict. */
#define UR_RESIDENCY_APART 4.0

/* GB/s of a probe read of `bytes` from a fresh tensor at `place`, filled first.  A device tensor
 * gets `evict` more bytes, filled after the ones read, so those are read from HBM (as the range's
 * are) rather than from the L2 that the fill left them in. */
static ur_status reference_gbps(const ur_backend *g, ur_stream *s, ur_place place, int32_t dev,
                                size_t bytes, size_t evict, double *out) {
  int64_t shape[1] = {(int64_t)(bytes + evict)};
  ur_tensor *t = NULL;
  ur_status st = ur_tensor_new(&t, UR_DTYPE_U8, 1, shape, place, dev);
  if (st) return st;
  double sec = 0;
  if (!(st = ur_tensor_fill(s, t, 0)) && !(st = ur_stream_sync(s)) &&
      !(st = g->probe_read(s ? s->handle : NULL, ur_tensor_data(t), bytes, &sec)))
    *out = sec > 0 ? bytes / sec / 1e9 : 0;
  ur_tensor_free(t);
  return st;
}

/* Times a read of the range, then reads of the same size (up to 64 MiB) from device memory and
 * from pinned host memory.  The range counts as fast when it reads at the two speeds' geometric
 * mean or better (nearer the device than the host link).  When the device reads under 4 times
 * as fast as the host (small reads, which are all launch latency: under about 1 MiB on an
 * H200), no speed tells the two apart and the verdict is -1.  Reading pages that sit on the
 * host and are not accessed-by the GPU migrates them: the probe can move what it measures. */
ur_status ur_tensor_residency(ur_stream *s, const ur_tensor *t, int64_t offset, int64_t numel,
                              ur_residency *out) {
  UR__ARGS(t, out);
  ur_range r;
  ur_status st = hint_range(t, offset, numel, "residency", &r);
  if (st) return st;
  const ur_backend *g = ur__gpu();
  if (!g || !g->probe_read)
    return ur__error(UR_STATUS_UNSUPPORTED,
                     "residency: measuring where pages are needs a GPU (%s); advised() reports "
                     "the advice recorded",
                     ur_cuda_error());
  uint64_t es = ur_dtype_size(t->dtype);
  size_t bytes = (size_t)numel * es;
  const char *p = (const char *)ur_tensor_data(t) + (uint64_t)offset * es;
  memset(out, 0, sizeof *out);
  out->range = r;
  if ((st = g->probe_read(s ? s->handle : NULL, p, bytes, &out->seconds))) return st;
  out->gbps = out->seconds > 0 ? bytes / out->seconds / 1e9 : 0;
  int32_t dev = t->st->device >= 0 ? t->st->device : 0;
  ur_device_props props;
  if ((st = ur_device_props_get(dev, &props))) return st;
  size_t cal = bytes < ((size_t)64 << 20) ? bytes : ((size_t)64 << 20);
  if ((st = reference_gbps(g, s, UR_PLACE_DEVICE, dev, cal, 2 * (size_t)props.l2_bytes,
                           &out->device_gbps)))
    return ur__error_cause(st, "residency: the device reference read of %zu bytes (and %llu to "
                           "evict them from L2)", cal, (unsigned long long)(2 * props.l2_bytes));
  if ((st = reference_gbps(g, s, UR_PLACE_PINNED, -1, cal, 0, &out->host_gbps)))
    return ur__error_cause(st, "residency: the pinned host reference read of %zu bytes", cal);
  if (out->device_gbps < UR_RESIDENCY_APART * out->host_gbps)
    out->fast = -1;
  else
    out->fast = out->gbps >= sqrt(out->device_gbps * out->host_gbps);
  return UR_STATUS_OK;
}

uint64_t ur_hint_log_total(void) {
  pthread_mutex_lock(&ur__lock);
  uint64_t n = log_total;
  pthread_mutex_unlock(&ur__lock);
  return n;
}

uint64_t ur_hint_log_capacity(void) { return LOG_CAP; }

ur_status ur_hint_log_get(uint64_t seq, ur_hint_record *out) {
  UR__ARGS(out);
  ur_status s = UR_STATUS_OK;
  pthread_mutex_lock(&ur__lock);
  if (seq < 1 || seq > log_total)
    s = ur__error(UR_STATUS_INVALID, "hint log: record %llu does not exist; %llu were written",
                  (unsigned long long)seq, (unsigned long long)log_total);
  else if (log_total - seq >= LOG_CAP)
    s = ur__error(UR_STATUS_INVALID,
                  "hint log: record %llu is gone; the log keeps the newest %d of %llu",
                  (unsigned long long)seq, LOG_CAP, (unsigned long long)log_total);
  else *out = log_ring[(seq - 1) % LOG_CAP];
  pthread_mutex_unlock(&ur__lock);
  return s;
}

void ur_hint_log_clear(void) {
  pthread_mutex_lock(&ur__lock);
  log_total = 0;
  pthread_mutex_unlock(&ur__lock);
}

static ur_status monitor_missing(void) {
  return ur__error(UR_STATUS_UNSUPPORTED,
                   "monitor: measuring migration needs a GPU and CUPTI (%s)", ur_cuda_error());
}

ur_status ur_monitor_start(void) {
  const ur_backend *g = ur__gpu();
  return g && g->monitor_start ? g->monitor_start() : monitor_missing();
}

ur_status ur_monitor_read(ur_migration_stats *out, int32_t reset) {
  UR__ARGS(out);
  const ur_backend *g = ur__gpu();
  memset(out, 0, sizeof *out);
  return g && g->monitor_read ? g->monitor_read(out, reset) : monitor_missing();
}

ur_status ur_monitor_stop(void) {
  const ur_backend *g = ur__gpu();
  return g && g->monitor_stop ? g->monitor_stop() : monitor_missing();
}
