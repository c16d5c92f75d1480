/* backend_cpu.c: the CPU backend's core table, the reference.  Always built; runs everything on host memory.
 * Without a GPU, pinned and managed storage are page-aligned host memory, streams order
 * nothing (work is synchronous) and events keep wall-clock times. */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "core/core.h"
#include "core/philox.h"
#include "data/kjt.h"
#include "data/synth.h"
#include "dist/comm.h"
#include "dense/dense.h"
#include "embedding/cache.h"
#include "embedding/qtbe.h"
#include "embedding/mc.h"
#include "embedding/tbe.h"
#include "metrics/metrics.h"

static int cpu_device_count(void) { return 0; }

/* The core says why no GPU is in use where it knows (ur_cuda_error); this backend only knows
 * that it has none. */
static ur_status no_gpu(const char *what) {
  return ur__error(UR_STATUS_UNSUPPORTED, "%s: needs a GPU; the CPU backend has none", what);
}

static ur_status cpu_device_set(int32_t device) {
  (void)device;
  return no_gpu("device_set");
}

static ur_status cpu_device_get(int32_t *out) {
  *out = UR_LOC_CPU;
  return UR_STATUS_OK;
}

static ur_status cpu_device_props(int32_t device, ur_device_props *out) {
  (void)device;
  (void)out;
  return no_gpu("device_props");
}

static ur_status cpu_device_sync(void) { return UR_STATUS_OK; }

static ur_status cpu_alloc(ur_place place, int32_t device, size_t bytes, void **out) {
  (void)device;
  if (place == UR_PLACE_DEVICE) return no_gpu("tensor: placement 'device'");
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
#ifdef UR__ASAN
  /* To the byte: ASan's redzone then starts where the storage ends; in the rest of the last
   * page a read past a tensor's end went unseen. */
  size_t n = bytes;
#else
  size_t n = (bytes + page - 1) / page * page;
#endif
  if (posix_memalign(out, page, n ? n : page))
    return ur__error(UR_STATUS_OOM, "tensor: host allocation of %zu bytes failed", bytes);
  return UR_STATUS_OK;
}

static void cpu_free(ur_place place, void *p) {
  (void)place;
  free(p);
}

static ur_status cpu_copy(void *stream, void *dst, const void *src, size_t bytes) {
  (void)stream;
  memmove(dst, src, bytes);
  return UR_STATUS_OK;
}

static ur_status cpu_read(void *stream, void *out, const void *src, size_t bytes) {
  return cpu_copy(stream, out, src, bytes);
}

typedef struct fill_job {
  char *dst;
  size_t elem;
  unsigned char pat[8];
} fill_job;

static void fill_range(void *ctx, size_t i0, size_t i1) {
  fill_job *j = ctx;
  for (size_t i = i0; i < i1; i++) memcpy(j->dst + i * j->elem, j->pat, j->elem);
}

static ur_status cpu_fill(void *stream, void *dst, size_t n, size_t elem, uint64_t value) {
  (void)stream;
  fill_job j = {dst, elem, {0}};
  memcpy(j.pat, &value, 8);
  int same = 1;
  for (size_t b = 1; b < elem; b++) same &= j.pat[b] == j.pat[0];
  if (same) memset(dst, j.pat[0], n * elem);
  else ur__parallel_for(n, (size_t)1 << 18, fill_range, &j);
  return UR_STATUS_OK;
}

typedef struct rand_job {
  void *dst;
  ur_dtype dtype;
  uint64_t first, seed, pitch;
  size_t cols;
  int normal;
  double a, b;
  size_t base;
} rand_job;

/* Half types round from the float value, as the GPU's __float2half_rn does.  Uniform f32, what
 * embedding tables are drawn with, has a loop of its own: ur_philox_value's numbers without
 * the call per element (tens of GiB go through it when a large model is built). */
static void rand_range(void *ctx, size_t i0, size_t i1) {
  rand_job *j = ctx;
  if (j->pitch != j->cols) { /* a shard's columns of its logical table: a counter per element */
    for (size_t i = j->base + i0; i < j->base + i1; i++) {
      uint64_t counter = j->first + (i / j->cols) * j->pitch + i % j->cols;
      ur__store(j->dst, j->dtype, i, ur_philox_value(counter, j->seed, j->normal, j->a, j->b));
    }
    return;
  }
  if (!j->normal && j->dtype == UR_DTYPE_F32) {
    float *d = j->dst;
    double a = j->a, w = j->b - j->a;
    for (size_t i = j->base + i0; i < j->base + i1; i++)
      d[i] = (float)(a + w * (1.0 - (double)ur_u01(ur_philox(j->first + i, j->seed).v[0])));
    return;
  }
  for (size_t i = j->base + i0; i < j->base + i1; i++)
    ur__store(j->dst, j->dtype, i, ur_philox_value(j->first + i, j->seed, j->normal, j->a, j->b));
}

/* Polls the interrupt flag every chunk, so a huge initialisation can be stopped. */
static ur_status cpu_rand(void *stream, void *dst, ur_dtype dtype, size_t n, uint64_t first,
                          size_t cols, uint64_t pitch, ur_dist dist, double a, double b,
                          uint64_t seed) {
  (void)stream;
  const size_t chunk = (size_t)1 << 24;
  rand_job j = {dst, dtype, first, seed, pitch, cols ? cols : 1, dist == UR_DIST_NORMAL, a, b, 0};
  for (size_t c0 = 0; c0 < n; c0 += chunk) {
    if (ur_interrupt_get())
      return ur__error(UR_STATUS_INTERRUPTED, "tensor: random init interrupted at element %zu",
                       c0);
    j.base = c0;
    ur__parallel_for((c0 + chunk < n ? c0 + chunk : n) - c0, (size_t)1 << 16, rand_range, &j);
  }
  return UR_STATUS_OK;
}

typedef struct rows_job {
  void *dst;
  ur_dtype dtype;
  size_t row;                     /* elements (rand_rows) or bytes (zero_rows) a row */
  const int64_t *phys, *ids;
  double a, b;
  uint64_t seed;
} rows_job;

static void rand_rows_range(void *ctx, size_t j0, size_t j1) {
  const rows_job *j = ctx;
  for (size_t k = j0; k < j1; k++) {
    size_t at = (size_t)j->phys[k] * j->row, from = (size_t)j->ids[k] * j->row;
    for (size_t c = 0; c < j->row; c++)
      ur__store(j->dst, j->dtype, at + c, ur_philox_value(from + c, j->seed, 0, j->a, j->b));
  }
}

static ur_status cpu_rand_rows(void *stream, void *dst, ur_dtype dtype, size_t row_elems,
                               const int64_t *phys, const int64_t *ids, size_t n, double a,
                               double b, uint64_t seed) {
  (void)stream;
  rows_job j = {dst, dtype, row_elems, phys, ids, a, b, seed};
  ur__parallel_for(n, 256, rand_rows_range, &j);
  return UR_STATUS_OK;
}

static ur_status cpu_zero_rows(void *stream, void *dst, size_t row_bytes, const int64_t *rows,
                               size_t n) {
  (void)stream;
  for (size_t k = 0; k < n; k++) memset((char *)dst + (size_t)rows[k] * row_bytes, 0, row_bytes);
  return UR_STATUS_OK;
}

static ur_status cpu_stream_new(int32_t priority, void **out) {
  (void)priority;
  *out = NULL;
  return UR_STATUS_OK;
}

static void cpu_stream_free(void *s) { (void)s; }
static ur_status cpu_stream_sync(void *s) {
  (void)s;
  return UR_STATUS_OK;
}

static ur_status cpu_event_new(void **out) {
  *out = NULL;
  return UR_STATUS_OK;
}

static void cpu_event_free(void *e) { (void)e; }

const ur_backend *ur__cpu(void) {
  static const ur_backend cpu = {
      .abi = UR_BACKEND_ABI,
      .name = "cpu",
      .archs = "",
      .device_count = cpu_device_count,
      .device_set = cpu_device_set,
      .device_get = cpu_device_get,
      .device_props = cpu_device_props,
      .device_sync = cpu_device_sync,
      .alloc = cpu_alloc,
      .free = cpu_free,
      .copy = cpu_copy,
      .read = cpu_read,
      .fill = cpu_fill,
      .rand = cpu_rand,
      .rand_rows = cpu_rand_rows,
      .zero_rows = cpu_zero_rows,
      .stream_new = cpu_stream_new,
      .stream_free = cpu_stream_free,
      .stream_sync = cpu_stream_sync,
      .event_new = cpu_event_new,
      .event_free = cpu_event_free,
      .nonfinite_check = ur__cpu_nonfinite_check,
      .nonfinite_end = ur__cpu_nonfinite_end,
      .dense = &ur__cpu_dense_ops,
      .tbe = &ur__cpu_tbe_ops,
      .cache = &ur__cpu_cache_ops,
      .kjt = &ur__cpu_kjt_ops,
      .synth = &ur__cpu_synth_ops,
      .metrics = &ur__cpu_metrics_ops,
      .qtbe = &ur__cpu_qtbe_ops,
      .mc = &ur__cpu_mc_ops,
      .comm = &ur__cpu_comm_ops,
      /* Events, hints, probes and the monitor have no CPU form: the core handles NULL. */
  };
  return &cpu;
}
