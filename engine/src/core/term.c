/* term.c: a monotonic clock and the terminal's width, for the trainer's progress output. */
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>
#include "core/core.h"

double ur_clock_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int32_t ur_term_columns(int32_t fd) {
  if (fd < 0 || !isatty(fd)) return 0;
  struct winsize w;
  /* A pseudo-terminal made without a size (script(1) run from a pipe) reports 0 columns. */
  if (ioctl(fd, TIOCGWINSZ, &w) != 0 || w.ws_col == 0) return 80;
  return w.ws_col;
}
