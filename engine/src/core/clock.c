/* clock.c: the monotonic clock of rates, ETAs and timings. */
#include <time.h>
#include "core/core.h"

double ur_clock_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
