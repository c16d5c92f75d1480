/* uvm_migration.c: moves a managed tensor between host and GPU with memory hints and prints,
 * step by step, what the driver was told (advice) beside what CUPTI measured moving, so one
 * can see whether the migration counters can be trusted on this machine.  Public API only.
 *
 *   uvm_migration [GiB]      (default 4; never more than the GPU has free)
 *
 * Exit status: 0 done, 1 engine error (message from ur_last_error()), 2 refused or usage. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "uvmrec.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

typedef struct demo {
  ur_tensor *t;
  ur_stream *s;
  int64_t numel;
  uint64_t bytes;
  int monitor;           /* 1 when the migration monitor runs */
  char monitor_why[512]; /* why it does not */
} demo;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int engine_error(const char *what) {
  fprintf(stderr, "uvm_migration: %s: %s\n", what, ur_last_error());
  return 1;
}

static const char *loc_str(int32_t loc, char *buf, size_t len) {
  if (loc >= 0) snprintf(buf, len, "cuda:%d", (int)loc);
  else if (loc == UR_LOC_CPU) snprintf(buf, len, "cpu");
  else if (loc == UR_LOC_NONE) snprintf(buf, len, "none");
  else if (loc == UR_LOC_MIXED) snprintf(buf, len, "mixed");
  else snprintf(buf, len, "%d", (int)loc);
  return buf;
}

/* "cpu,cuda:0", "cpu(some),cuda:1", or "-" */
static const char *accessed_str(const ur_advised *a, char *buf, size_t len) {
  size_t n = 0;
  buf[0] = '\0';
  if (a->accessed_by_cpu != 0)
    n += (size_t)snprintf(buf, len, "%s", a->accessed_by_cpu > 0 ? "cpu" : "cpu(some)");
  for (int g = 0; g < 64 && n < len; g++) {
    if (!(a->accessed_by_gpus >> g & 1)) continue;
    n += (size_t)snprintf(buf + n, len - n, "%scuda:%d", n ? "," : "", g);
  }
  if (!buf[0]) snprintf(buf, len, "-");
  return buf;
}

/* Prints one step: the advice the driver reports, what moved since the last step, the wall
 * time, and a rate (range bytes per second for a prefetch, the probe's own for a probe).
 * Returns 0, or 1 after reporting an engine error; *moved gets the monitor's reading. */
static int report(demo *d, const char *step, double seconds, double gbps, const char *extra,
                  ur_migration_stats *moved) {
  ur_advised adv;
  char pref[16], last[16], acc[128];
  memset(moved, 0, sizeof *moved);
  if (ur_tensor_advised(d->t, 0, d->numel, &adv) != UR_STATUS_OK)
    return engine_error("reading the advised state");
  if (d->monitor && ur_monitor_read(moved, 1) != UR_STATUS_OK)
    return engine_error("reading the migration monitor");
  printf("%-28s preferred=%-5s last_prefetch=%-6s accessed_by=%-12s (%s) | ", step,
         loc_str(adv.preferred_location, pref, sizeof pref),
         loc_str(adv.last_prefetch_location, last, sizeof last),
         accessed_str(&adv, acc, sizeof acc), adv.from_driver ? "driver" : "recorded");
  if (d->monitor)
    printf("htod %9.1f MB  dtoh %9.1f MB  gpu faults %6llu | ", moved->bytes_htod / 1e6,
           moved->bytes_dtoh / 1e6, (unsigned long long)moved->gpu_page_faults);
  else
    printf("htod         -     dtoh         -     gpu faults      - | ");
  printf("%9.3f ms", seconds * 1e3);
  if (gbps > 0) printf("  %7.2f GB/s", gbps);
  if (extra) printf("  %s", extra);
  printf("\n");
  return 0;
}

static int step_advise(demo *d, const char *step, ur_advice advice, int32_t location) {
  ur_range r;
  ur_migration_stats moved;
  double t0 = now_s();
  if (ur_tensor_advise(d->t, 0, d->numel, &r, advice, location) != UR_STATUS_OK)
    return engine_error(step);
  return report(d, step, now_s() - t0, 0, NULL, &moved);
}

static int step_prefetch(demo *d, const char *step, int32_t location, ur_migration_stats *moved) {
  ur_range r;
  double t0 = now_s();
  if (ur_tensor_prefetch(d->s, d->t, 0, d->numel, &r, location) != UR_STATUS_OK)
    return engine_error(step);
  if (ur_stream_sync(d->s) != UR_STATUS_OK) return engine_error(step);
  double secs = now_s() - t0;
  double gbps = secs > 0 ? (double)(r.byte_end - r.byte_begin) / secs / 1e9 : 0;
  return report(d, step, secs, gbps, NULL, moved);
}

static int step_probe(demo *d, const char *step) {
  ur_residency res;
  ur_migration_stats moved;
  double t0 = now_s();
  if (ur_tensor_residency(d->s, d->t, 0, d->numel, &res) != UR_STATUS_OK)
    return engine_error(step);
  return report(d, step, now_s() - t0, res.gbps, res.fast ? "(reads at HBM speed)"
                                                          : "(reads at host-link speed)",
                &moved);
}

static int run(demo *d) {
  ur_range r;
  ur_migration_stats moved, to_gpu;

  if (ur_stream_new(&d->s, 0) != UR_STATUS_OK) return engine_error("creating a stream");
  /* CUPTI counts migrations only of managed memory allocated after its counters are on (on the
   * H200, a monitor started after the allocation read 0 bytes for a 4 GiB prefetch). */
  ur_status st = ur_monitor_start();
  if (st == UR_STATUS_OK) {
    d->monitor = 1;
    if (ur_monitor_read(&moved, 1) != UR_STATUS_OK) /* zero the counters */
      return engine_error("reading the migration monitor");
  } else if (st == UR_STATUS_UNSUPPORTED) {
    snprintf(d->monitor_why, sizeof d->monitor_why, "%s", ur_last_error());
    printf("migration monitor unsupported, continuing without it: %s\n", d->monitor_why);
  } else {
    return engine_error("starting the migration monitor");
  }

  if (ur_tensor_new(&d->t, UR_DTYPE_F32, 1, &d->numel, UR_PLACE_MANAGED, 0) != UR_STATUS_OK)
    return engine_error("allocating the managed tensor");
  if (ur_tensor_fill(d->s, d->t, 1.0) != UR_STATUS_OK) return engine_error("filling the tensor");
  /* Start from every page on the host, wherever the fill ran, so that the GPU prefetch
   * below has the whole tensor to move. */
  if (ur_tensor_prefetch(d->s, d->t, 0, d->numel, &r, UR_LOC_CPU) != UR_STATUS_OK ||
      ur_stream_sync(d->s) != UR_STATUS_OK)
    return engine_error("placing the tensor on the host");

  if (step_advise(d, "advise preferred=cpu", UR_ADVICE_PREFERRED_LOCATION, UR_LOC_CPU) ||
      step_advise(d, "advise accessed_by=cuda:0", UR_ADVICE_ACCESSED_BY, 0) ||
      step_prefetch(d, "prefetch -> cuda:0", 0, &to_gpu) ||
      step_probe(d, "residency after gpu prefetch") ||
      step_prefetch(d, "prefetch -> cpu", UR_LOC_CPU, &moved) ||
      step_probe(d, "residency after cpu prefetch"))
    return 1;

  if (!d->monitor) {
    printf("verdict: CUPTI counters unavailable (%s); only the timings above are measured\n",
           d->monitor_why);
    return 0;
  }
  double ratio = (double)to_gpu.bytes_htod / (double)d->bytes;
  printf("verdict: CUPTI counters %s: the GPU prefetch measured %.1f MB host->device for a "
         "%.1f MB tensor (%.3f of it; within 5%% is trusted)\n",
         ratio > 0.95 && ratio < 1.05 ? "work" : "do NOT match", to_gpu.bytes_htod / 1e6,
         d->bytes / 1e6, ratio);
  return 0;
}

int main(int argc, char **argv) {
  demo d;
  memset(&d, 0, sizeof d);
  double gib = 4.0;
  if (argc > 2) {
    fprintf(stderr, "usage: %s [GiB]\n", argv[0]);
    return 2;
  }
  if (argc == 2) {
    char *end = NULL;
    gib = strtod(argv[1], &end);
    if (end == argv[1] || *end != '\0' || !(gib > 0) || gib > 1e6) {
      fprintf(stderr, "uvm_migration: size '%s' is not a positive number of GiB\n", argv[1]);
      return 2;
    }
  }
  d.bytes = (uint64_t)(gib * GIB) / 4 * 4;
  d.numel = (int64_t)(d.bytes / 4);
  if (d.numel == 0) {
    fprintf(stderr, "uvm_migration: %g GiB holds no f32 element\n", gib);
    return 2;
  }

  if (ur_device_count() <= 0) {
    fprintf(stderr, "uvm_migration: no GPU: %s\n", ur_cuda_error());
    return 2;
  }
  ur_device_props p;
  if (ur_device_props_get(0, &p) != UR_STATUS_OK) return engine_error("reading GPU 0");
  if (!p.managed_memory || !p.concurrent_managed_access) {
    fprintf(stderr, "uvm_migration: GPU 0 (%s) lacks concurrent managed access, which "
                    "prefetching to it needs\n", p.name);
    return 2;
  }
  /* Oversubscribing managed memory can hang a shared GPU: never ask for more than is free. */
  if (d.bytes > p.free_bytes) {
    fprintf(stderr, "uvm_migration: refusing %.2f GiB: GPU 0 (%s) has %.2f GiB free, and "
                    "managed memory must never be oversubscribed\n",
            d.bytes / GIB, p.name, p.free_bytes / GIB);
    return 2;
  }
  if (ur_device_set(0) != UR_STATUS_OK) return engine_error("selecting GPU 0");
  printf("uvm_migration: %.2f GiB f32 managed tensor on GPU 0 (%s, sm_%d%d, %.1f of %.1f GiB "
         "free), hint pages of %llu bytes\n",
         d.bytes / GIB, p.name, (int)p.major, (int)p.minor, p.free_bytes / GIB,
         p.total_bytes / GIB, (unsigned long long)ur_hint_page_bytes_get());

  int rc = run(&d);
  if (d.monitor && ur_monitor_stop() != UR_STATUS_OK && rc == 0)
    rc = engine_error("stopping the migration monitor");
  if (d.t) ur_tensor_free(d.t);
  if (d.s) ur_stream_free(d.s);
  return rc;
}
