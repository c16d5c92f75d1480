/* signals.c: the interrupt flag, and SIGINT and SIGTERM as a request to stop at the next step
 * boundary.  While caught, a signal only raises the interrupt flag (which long engine calls and
 * the training loop poll) and is remembered; the trainer then saves a checkpoint and exits.
 * Everything the handler does is async-signal-safe: two stores to volatile sig_atomic_t. */
#include <errno.h>
#include <signal.h>
#include <string.h>
#include "core/core.h"

static volatile sig_atomic_t interrupt_flag;

ur_status ur_interrupt_set(int32_t on) {
  interrupt_flag = on ? 1 : 0;
  return UR_STATUS_OK;
}

int32_t ur_interrupt_get(void) { return interrupt_flag != 0; }

static const int caught_signals[2] = {SIGINT, SIGTERM};
static struct sigaction previous[2];
static int installed[2];
static volatile sig_atomic_t last_signal;

static void on_signal(int sig) {
  last_signal = sig;
  ur_interrupt_set(1);
}

ur_status ur_signals_catch(int32_t on) {
  ur_status s = UR_STATUS_OK;
  for (int i = 0; i < 2; i++) {
    if (installed[i]) {
      sigaction(caught_signals[i], &previous[i], NULL);
      installed[i] = 0;
    }
  }
  ur_interrupt_set(0);
  if (!on) return UR_STATUS_OK; /* last_signal kept: read after the handlers are back */
  last_signal = 0;
  for (int i = 0; i < 2 && !s; i++) {
    struct sigaction old, sa;
    if (sigaction(caught_signals[i], NULL, &old)) {
      s = ur__error(UR_STATUS_INVALID, "signals: cannot read the handler of signal %d: %s",
                    caught_signals[i], strerror(errno));
      break;
    }
    /* A signal the parent ignores (a background job of a shell, nohup) stays ignored. */
    if (!(old.sa_flags & SA_SIGINFO) && old.sa_handler == SIG_IGN) continue;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    /* One-shot: a second signal ends the process, as it would without us (a save in
     * progress then leaves the previous checkpoint as it was: saves are atomic). */
    sa.sa_flags = SA_RESETHAND | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(caught_signals[i], &sa, NULL)) {
      s = ur__error(UR_STATUS_INVALID, "signals: cannot catch signal %d: %s", caught_signals[i],
                    strerror(errno));
      break;
    }
    previous[i] = old;
    installed[i] = 1;
  }
  if (s) ur_signals_catch(0);
  return s;
}

int32_t ur_signals_caught(void) { return last_signal; }
