/* ktrace.c: a kernel timeline where no Nsight Systems is installed (the GPU machines have CUPTI
 * and ncu, not nsys).  Built as dist/lib/libktrace.so where CUDA is built; loaded by the driver
 * into any CUDA program through CUDA's injection hook, it writes every kernel's and copy's start
 * and end (ns, GPU clock), stream, grid and name to a CSV, one record a line:
 *
 *   K,start,end,stream,blocks,threads_a_block,name       (a kernel; name as compiled, mangled)
 *   M,start,end,stream,bytes,copy_kind,memcpy            (a copy; kind as CUpti_ActivityMemcpyKind)
 *
 *   KTRACE_OUT=trace.csv CUDA_INJECTION64_PATH=$PWD/lib/libktrace.so bin/uvmrec scripts/bench/uvm.lua ...
 *   python3 scripts/bench/ktrace_overlap.py trace.csv --ref 100:140 --run 160:200
 *
 * Kernels are traced as CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, which keeps them concurrent.  The
 * uvmrec migration monitor (ur.monitor) registers CUPTI's activity buffers too, and the last to
 * register gets every record: leave the monitor off in a traced run (the uvm bench prints that it
 * has none, and measures no migration).  Records are written when CUPTI hands back a full buffer
 * and at exit. */
#include <cupti.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KTRACE_BUFFER_BYTES ((size_t)16 << 20)

static FILE *g_out;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static void CUPTIAPI ktrace_buffer(uint8_t **buffer, size_t *size, size_t *max_records) {
  void *p = NULL;
  /* declining (NULL) makes CUPTI drop records, not fail */
  if (posix_memalign(&p, 8, KTRACE_BUFFER_BYTES) != 0) p = NULL;
  *buffer = (uint8_t *)p;
  *size = p ? KTRACE_BUFFER_BYTES : 0;
  *max_records = 0;
}

static void CUPTIAPI ktrace_done(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
  (void)ctx;
  (void)stream;
  (void)size;
  CUpti_Activity *r = NULL;
  pthread_mutex_lock(&g_lock);
  /* a buffer handed back after the file was closed at exit (a context torn down late) is dropped */
  while (g_out && cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS) {
    if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
      const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)r;
      fprintf(g_out, "K,%llu,%llu,%u,%lld,%d,%s\n", (unsigned long long)k->start, (unsigned long long)k->end,
              k->streamId, (long long)k->gridX * k->gridY * k->gridZ, k->blockX * k->blockY * k->blockZ, k->name);
    } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)r;
      fprintf(g_out, "M,%llu,%llu,%u,%llu,%d,memcpy\n", (unsigned long long)m->start, (unsigned long long)m->end,
              m->streamId, (unsigned long long)m->bytes, (int)m->copyKind);
    }
  }
  size_t dropped = 0;
  if (cuptiActivityGetNumDroppedRecords(NULL, 0, &dropped) == CUPTI_SUCCESS && dropped)
    fprintf(stderr, "ktrace: CUPTI dropped %zu records\n", dropped);
  pthread_mutex_unlock(&g_lock);
  free(buffer);
}

static void ktrace_flush(void) {
  cuptiActivityFlushAll(1);
  pthread_mutex_lock(&g_lock);
  if (g_out) fclose(g_out);
  g_out = NULL;
  pthread_mutex_unlock(&g_lock);
}

/* Called by the CUDA driver when it initialises (CUDA_INJECTION64_PATH); 1: loaded. */
int InitializeInjection(void) {
  const char *path = getenv("KTRACE_OUT");
  if (!path || !*path) {
    fprintf(stderr, "ktrace: KTRACE_OUT is not set; expected the path of the CSV to write\n");
    return 0;
  }
  g_out = fopen(path, "w");
  if (!g_out) {
    fprintf(stderr, "ktrace: KTRACE_OUT=%s: %s; expected a file it can write\n", path, strerror(errno));
    return 0;
  }
  CUptiResult r = cuptiActivityRegisterCallbacks(ktrace_buffer, ktrace_done);
  if (r == CUPTI_SUCCESS) r = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  if (r == CUPTI_SUCCESS) r = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
  if (r != CUPTI_SUCCESS) {
    const char *s = "unknown";
    cuptiGetResultString(r, &s);
    fprintf(stderr, "ktrace: CUPTI refused the activity trace: %s\n", s);
    fclose(g_out);
    g_out = NULL;
    return 0;
  }
  atexit(ktrace_flush);
  return 1;
}
