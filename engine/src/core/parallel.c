/* parallel.c: a parallel loop on plain pthreads for the CPU backend.  Not OpenMP: libgomp
 * crashes its worker threads when it arrives through dlopen (as under plain luajit), and the
 * engine must work there.  Threads are started per call, only for loops big enough to repay it. */
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>
#include "core/core.h"

typedef struct job {
  ur__range_fn fn;
  void *ctx;
  size_t begin, end;
} job;

static void *run(void *p) {
  job *j = p;
  j->fn(j->ctx, j->begin, j->end);
  return NULL;
}

int ur__threads(void) {
  static int n;
  if (!n) {
    const char *env = getenv("UR_NUM_THREADS");
    int v = env ? atoi(env) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    n = v < 1 ? 1 : v > 256 ? 256 : v;
  }
  return n;
}

void ur__parallel_for(size_t n, size_t grain, ur__range_fn fn, void *ctx) {
  int t = ur__threads();
  if (grain < 1) grain = 1;
  if ((size_t)t > n / grain) t = (int)(n / grain);
  if (t <= 1) {
    fn(ctx, 0, n);
    return;
  }
  job jobs[256];
  pthread_t tid[256];
  int started[256] = {0};
  size_t per = (n + (size_t)t - 1) / (size_t)t;
  /* No empty ranges: 26 items over 16 threads is 13 ranges of 2, not 16 with 3 empty ones
   * (a range [n, n) would still be called, and callers may index item t0). */
  t = (int)((n + per - 1) / per);
  for (int i = 0; i < t; i++) {
    jobs[i] = (job){fn, ctx, (size_t)i * per, (size_t)(i + 1) * per < n ? (size_t)(i + 1) * per : n};
    if (i > 0) started[i] = !pthread_create(&tid[i], NULL, run, &jobs[i]);
  }
  run(&jobs[0]);
  for (int i = 1; i < t; i++) {
    if (started[i]) pthread_join(tid[i], NULL);
    else run(&jobs[i]); /* no thread to be had: do its share here */
  }
}

void ur__atomic_min(int64_t *p, int64_t v) {
  int64_t cur = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (v < cur &&
         !__atomic_compare_exchange_n(p, &cur, v, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
}
