/* read_threads.c: small reads from threads that come and go, on a GPU (spec/tensor_spec.lua runs
 * it).  Each round queues 40 fills of 1 GiB on a stream of its own, then starts a thread that
 * reads 4 floats of another GPU tensor (through its pinned page) and ends.  The thread must give
 * the right values and end long before the fills do: a thread's end must not wait for the GPU's
 * other work (cudaFreeHost of its page would).  Exit 0 when all hold; 77 without a GPU.
 * Usage: read_threads [ROUNDS [values]]: with "values", the values are checked, not the times
 * (under compute-sanitizer). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "uvmrec.h"

enum { BIG = 1 << 28 }; /* f32 elements: 1 GiB, a fill of ~0.4 ms at 3 TB/s */

typedef struct job {
  ur_tensor *small;
  float got[4];
  ur_status st;
} job;

static int fail(const char *what) {
  fprintf(stderr, "read_threads: %s: %s\n", what, ur_last_error());
  return 1;
}

static void *reader(void *arg) {
  job *j = arg;
  j->st = ur_tensor_read(j->small, 0, 4, j->got);
  return NULL;
}

/* Starts a reader thread and waits for it to end; the seconds that took, or -1. */
static double read_in_thread(ur_tensor *small, int round) {
  job j = {small, {0}, UR_STATUS_OK};
  pthread_t tid;
  double t0 = ur_clock_seconds();
  if (pthread_create(&tid, NULL, reader, &j)) return -1;
  pthread_join(tid, NULL);
  double dt = ur_clock_seconds() - t0;
  if (j.st) return fail("the thread's read"), -1;
  for (int k = 0; k < 4; k++)
    if (j.got[k] != 2.5f) {
      fprintf(stderr, "read_threads: round %d: element %d read %g, expected 2.5\n", round, k, j.got[k]);
      return -1;
    }
  return dt;
}

int main(int argc, char **argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 4, times = !(argc > 2 && !strcmp(argv[2], "values"));
  if (ur_device_count() < 1) {
    printf("read_threads: no GPU\n");
    return 77;
  }
  int64_t big_n = BIG, small_n = 4;
  ur_tensor *big = NULL, *small = NULL;
  ur_stream *s = NULL;
  if (ur_tensor_new(&big, UR_DTYPE_F32, 1, &big_n, UR_PLACE_DEVICE, 0) ||
      ur_tensor_new(&small, UR_DTYPE_F32, 1, &small_n, UR_PLACE_DEVICE, 0) ||
      ur_stream_new(&s, 0))
    return fail("tensors and stream");
  if (ur_tensor_fill(NULL, small, 2.5) || ur_device_sync()) return fail("the small tensor's fill");
  /* the first thread's page is made here, outside the timed rounds */
  if (read_in_thread(small, 0) < 0) return 1;
  /* how long the fills take alone */
  double t0 = ur_clock_seconds();
  for (int k = 0; k < 40; k++)
    if (ur_tensor_fill(s, big, k)) return fail("fill");
  if (ur_stream_sync(s)) return fail("sync");
  double fills = ur_clock_seconds() - t0;
  int slow = 0;
  for (int r = 1; r <= rounds; r++) {
    for (int k = 0; k < 40; k++)
      if (ur_tensor_fill(s, big, k)) return fail("fill");
    double dt = read_in_thread(small, r);
    if (dt < 0) return 1;
    t0 = ur_clock_seconds();
    if (ur_stream_sync(s)) return fail("sync");
    double rest = ur_clock_seconds() - t0;
    printf("read_threads: round %d: the thread took %.3f ms; the fills %.3f ms after it (%.3f alone)\n", r,
           dt * 1e3, rest * 1e3, fills * 1e3);
    /* a thread that waited for the fills took about all of them and left nothing after */
    if (dt > fills / 2) slow++;
  }
  ur_stream_free(s);
  ur_tensor_free(big);
  ur_tensor_free(small);
  if (slow && times) {
    printf("read_threads: %d of %d threads waited for the other stream's fills\n", slow, rounds);
    return 1;
  }
  printf("read_threads: ok\n");
  return 0;
}
