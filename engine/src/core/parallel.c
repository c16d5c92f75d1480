/* parallel.c: a parallel loop on plain pthreads for the CPU backend and the host threads of the
 * far rows' copies.  Not OpenMP: libgomp crashes its worker threads when it arrives through
 * dlopen (as under plain luajit), and the engine must work there.  Loops big enough to repay it
 * run on a pool of ur__threads() - 1 threads started by the first such loop (a thread started
 * per range cost about 30 us a range here); a loop that finds the pool in use by another
 * (another thread's loop, or one inside a range) starts threads of its own for its ranges, as
 * every loop did before the pool. */
#include <dlfcn.h>
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

/* One loop on the pool: ranges [i * per, min((i + 1) * per, n)) for i below ranges, each taken
 * by whoever comes first (the caller too).  `users` counts the pool's threads inside it, so the
 * caller returns (and its loop's memory goes) only once none can touch it. */
typedef struct loop {
  ur__range_fn fn;
  void *ctx;
  size_t n, per, ranges;
  size_t next, finished; /* atomic */
  int users;             /* under the pool's lock */
} loop;

static struct {
  pthread_mutex_t use;   /* held by the caller whose loop the pool runs */
  pthread_mutex_t lock;  /* the rest */
  pthread_cond_t go, done;
  loop *cur;             /* the loop being run, or NULL */
  uint64_t gen;          /* loops given to the pool so far */
  int started;           /* threads started */
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
          PTHREAD_COND_INITIALIZER, NULL, 0, 0};

static void take_ranges(loop *l) {
  for (;;) {
    size_t i = __atomic_fetch_add(&l->next, 1, __ATOMIC_RELAXED);
    if (i >= l->ranges) return;
    size_t b = i * l->per, e = b + l->per < l->n ? b + l->per : l->n;
    l->fn(l->ctx, b, e);
    __atomic_fetch_add(&l->finished, 1, __ATOMIC_RELEASE);
  }
}

static void *pool_thread(void *unused) {
  (void)unused;
  uint64_t seen = 0;
  pthread_mutex_lock(&pool.lock);
  for (;;) {
    while (!pool.cur || pool.gen == seen) pthread_cond_wait(&pool.go, &pool.lock);
    seen = pool.gen;
    loop *l = pool.cur;
    l->users++;
    pthread_mutex_unlock(&pool.lock);
    take_ranges(l);
    pthread_mutex_lock(&pool.lock);
    if (--l->users == 0) pthread_cond_signal(&pool.done);
  }
  return NULL;
}

/* A child of fork() has none of the pool's threads, and maybe its locks held: a fresh pool. */
static void pool_forked(void) {
  pthread_mutex_init(&pool.use, NULL);
  pthread_mutex_init(&pool.lock, NULL);
  pthread_cond_init(&pool.go, NULL);
  pthread_cond_init(&pool.done, NULL);
  pool.cur = NULL;
  pool.started = 0;
}

/* Starts the pool's threads (once; under pool.use): how many run.  The library is kept loaded
 * from then on: a dlclose (LuaJIT undoes ffi.load when its state closes) would unmap the code
 * they wait in. */
static int pool_start(int want) {
  static int hooked;
  if (!hooked) {
    Dl_info self;
    if (dladdr((void *)pool_thread, &self) && self.dli_fname)
      (void)dlopen(self.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
    hooked = !pthread_atfork(NULL, NULL, pool_forked);
  }
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  while (pool.started < want) {
    pthread_t tid;
    if (pthread_create(&tid, &attr, pool_thread, NULL)) break;
    pool.started++;
  }
  pthread_attr_destroy(&attr);
  return pool.started;
}

/* The loop on the pool, or 0 where the pool is in use or has no thread. */
static int pool_run(size_t n, size_t per, size_t ranges, ur__range_fn fn, void *ctx) {
  if (pthread_mutex_trylock(&pool.use)) return 0;
  if (pool_start(ur__threads() - 1) == 0) {
    pthread_mutex_unlock(&pool.use);
    return 0;
  }
  loop l = {fn, ctx, n, per, ranges, 0, 0, 0};
  pthread_mutex_lock(&pool.lock);
  pool.cur = &l;
  pool.gen++;
  pthread_cond_broadcast(&pool.go);
  pthread_mutex_unlock(&pool.lock);
  take_ranges(&l);
  pthread_mutex_lock(&pool.lock);
  while (__atomic_load_n(&l.finished, __ATOMIC_ACQUIRE) < ranges || l.users > 0)
    pthread_cond_wait(&pool.done, &pool.lock);
  pool.cur = NULL;
  pthread_mutex_unlock(&pool.lock);
  pthread_mutex_unlock(&pool.use);
  return 1;
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
  if (pool_run(n, per, (size_t)t, fn, ctx)) return;
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
