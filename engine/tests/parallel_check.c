/* parallel_check: ur__parallel_for (engine/src/core/parallel.c, compiled in here) on its pool and
 * off it.  Every index is visited once and the ranges are the loop's fixed partition, for sizes
 * and grains around the edges; four threads' loops at once (one has the pool, the others start
 * threads of their own); loops inside a range; a loop in a child of fork() after the pool has
 * started.  Then the time a loop of 4 ranges takes on the pool and with threads started for it
 * (inside another loop's range, where the pool is in use).  Prints "parallel_check: ok, N loops"
 * and the times, or the first failure.  Built (header-only) and run by
 * spec/engine_parallel_spec.lua through the specs' h.run_c_check, with UR_NUM_THREADS=4. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/parallel.c"

#define MAXN (1 << 20)

typedef struct visit {
  unsigned char *seen; /* per index: times visited */
  size_t nr, cap;      /* the ranges called */
  size_t (*r)[2];
  pthread_mutex_t m;
} visit;

static void mark(void *ctx, size_t b, size_t e) {
  visit *v = ctx;
  for (size_t i = b; i < e; i++) __atomic_fetch_add(&v->seen[i], 1, __ATOMIC_RELAXED);
  pthread_mutex_lock(&v->m);
  if (v->nr < v->cap) {
    v->r[v->nr][0] = b;
    v->r[v->nr][1] = e;
  }
  v->nr++;
  pthread_mutex_unlock(&v->m);
}

static int cmp_range(const void *a, const void *b) {
  const size_t *x = a, *y = b;
  return (x[0] > y[0]) - (x[0] < y[0]);
}

static long g_loops;

/* One loop of n in grains of g, checked; 0 or 1 (printed). */
static int check_loop(size_t n, size_t grain, const char *who) {
  static __thread visit v;
  static __thread unsigned char *seen;
  static __thread size_t (*ranges)[2];
  if (!seen) {
    seen = calloc(MAXN, 1);
    ranges = calloc(512, sizeof *ranges);
    pthread_mutex_init(&v.m, NULL);
  }
  memset(seen, 0, n);
  v.seen = seen, v.r = ranges, v.nr = 0, v.cap = 512;
  ur__parallel_for(n, grain, mark, &v);
  __atomic_fetch_add(&g_loops, 1, __ATOMIC_RELAXED);
  for (size_t i = 0; i < n; i++)
    if (seen[i] != 1) {
      printf("parallel_check: FAILED (%s) n %zu grain %zu: index %zu visited %d times\n", who, n,
             grain, i, seen[i]);
      return 1;
    }
  /* the partition: threads t = min(ur__threads(), n / grain) (at least 1), per = ceil(n / t),
   * ranges [k per, min((k + 1) per, n)) */
  size_t t = (size_t)ur__threads(), g = grain < 1 ? 1 : grain;
  if (t > n / g) t = n / g;
  if (t < 1) t = 1;
  size_t per = (n + t - 1) / t, want = n ? (n + per - 1) / per : 1;
  if (t <= 1) want = 1, per = n;
  qsort(ranges, v.nr, sizeof *ranges, cmp_range);
  if (v.nr != want) {
    printf("parallel_check: FAILED (%s) n %zu grain %zu: %zu ranges, expected %zu\n", who, n, grain,
           v.nr, want);
    return 1;
  }
  for (size_t k = 0; k < v.nr; k++) {
    size_t b = k * per, e = b + per < n ? b + per : n;
    if (t > 1 && (ranges[k][0] != b || ranges[k][1] != e)) {
      printf("parallel_check: FAILED (%s) n %zu grain %zu: range %zu is [%zu, %zu), expected [%zu, %zu)\n",
             who, n, grain, k, ranges[k][0], ranges[k][1], b, e);
      return 1;
    }
  }
  return 0;
}

static const size_t SIZES[] = {0, 1, 2, 3, 4, 5, 255, 256, 257, 1000, 10007, 65536, MAXN};
static const size_t GRAINS[] = {0, 1, 7, 256, 4096};

static int sweep(const char *who) {
  for (size_t a = 0; a < sizeof SIZES / sizeof *SIZES; a++)
    for (size_t b = 0; b < sizeof GRAINS / sizeof *GRAINS; b++)
      if (check_loop(SIZES[a], GRAINS[b], who)) return 1;
  return 0;
}

static int g_failed;

static void *caller(void *p) {
  for (int r = 0; r < 20 && !g_failed; r++)
    if (sweep((const char *)p)) g_failed = 1;
  return NULL;
}

/* Loops inside each range of an outer loop (the pool is the outer's: the inner ones start
 * threads), checked. */
static void inner(void *ctx, size_t b, size_t e) {
  (void)ctx;
  for (size_t i = b; i < e && !g_failed; i++)
    if (check_loop(1000 + i, 16, "inside a range")) g_failed = 1;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A range's work in the timed loops: about 20 us of arithmetic a range. */
static void work(void *ctx, size_t b, size_t e) {
  volatile double x = 1;
  for (size_t i = b; i < e; i++)
    for (int k = 0; k < 20000; k++) x = x * 1.0000001 + 1e-9;
  (void)ctx;
}

static double g_spawn_us;

/* The time of a loop of 4 ranges with threads started for it: timed inside a range of an
 * outer loop, which holds the pool (the outer loop's other range does nothing). */
static void time_spawned(void *ctx, size_t b, size_t e) {
  (void)ctx;
  if (b != 0 || e == 0) return;
  int loops = 500;
  double t0 = now();
  for (int r = 0; r < loops; r++) ur__parallel_for(4, 1, work, NULL);
  g_spawn_us = (now() - t0) / loops * 1e6;
}

int main(void) {
  if (ur__threads() != 4) {
    printf("parallel_check: FAILED: run with UR_NUM_THREADS=4 (ur__threads() is %d)\n", ur__threads());
    return 1;
  }
  if (sweep("one caller")) return 1;
  pthread_t th[4];
  for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, caller, "four callers at once");
  for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
  if (g_failed) return 1;
  ur__parallel_for(8, 1, inner, NULL);
  if (g_failed) return 1;
  if (!pool.started) {
    printf("parallel_check: FAILED: the pool never started\n");
    return 1;
  }
  fflush(stdout);
  pid_t child = fork();
  if (child == 0) _exit(sweep("in a child of fork()") ? 1 : 0);
  int ws = 0;
  if (child < 0 || waitpid(child, &ws, 0) != child || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
    printf("parallel_check: FAILED: the loops in a child of fork() (status %d)\n", ws);
    return 1;
  }
  int loops = 500;
  double t0 = now();
  for (int r = 0; r < loops; r++) ur__parallel_for(4, 1, work, NULL);
  double pool_us = (now() - t0) / loops * 1e6;
  ur__parallel_for(2, 1, time_spawned, NULL);
  printf("parallel_check: ok, %ld loops\n", g_loops);
  t0 = now();
  for (int r = 0; r < loops; r++) work(NULL, 0, 4);
  printf("parallel_check: a loop of 4 ranges of about %.0f us each: %.1f us on the pool, %.1f us with "
         "threads started for it\n", (now() - t0) / loops / 4 * 1e6, pool_us, g_spawn_us);
  return 0;
}
