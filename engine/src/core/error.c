/* error.c: the thread-local error message and status names. */
#include <stdio.h>
#include <string.h>
#include "core/core.h"

static _Thread_local char last_error[1024];

ur_status ur__errorv(ur_status status, const char *fmt, va_list ap) {
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  return status;
}

ur_status ur__error(ur_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  ur__errorv(status, fmt, ap);
  va_end(ap);
  return status;
}

/* "what: the error before it": context put in front of the message a failed call left (cut
 * at the buffer's end). */
ur_status ur__error_cause(ur_status status, const char *fmt, ...) {
  char cause[sizeof last_error];
  memcpy(cause, last_error, sizeof cause);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  size_t at = strlen(last_error);
  if (at + 2 < sizeof last_error) {
    memcpy(last_error + at, ": ", 2);
    at += 2;
    size_t m = strnlen(cause, sizeof last_error - 1 - at);
    memcpy(last_error + at, cause, m);
    last_error[at + m] = 0;
  }
  return status;
}

ur_status ur__no_memory(const char *who, const char *path, uint64_t bytes, const char *fmt, ...) {
  char what[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  return ur__error(UR_STATUS_OOM, "%s%s: out of host memory for %s (%llu bytes)", who, path, what,
                   (unsigned long long)bytes);
}

const char *ur_last_error(void) { return last_error; }

void ur__error_clear(void) { last_error[0] = 0; }

ur_status ur__null(const char *fn, const char *arg) {
  return ur__error(UR_STATUS_INVALID, "%s: argument '%s' is NULL", fn, arg);
}

/* names is the macro's argument list as written: "t, out". */
ur_status ur__null_args(const char *fn, const char *names, const void *const *ptrs, int n) {
  for (int i = 0; i < n; i++) {
    if (ptrs[i]) continue;
    const char *p = names;
    for (int k = 0; k < i && p; k++) {
      p = strchr(p, ',');
      if (p) p++;
    }
    if (!p) return ur__error(UR_STATUS_INVALID, "%s: argument %d is NULL", fn, i + 1);
    while (*p == ' ') p++;
    size_t len = strcspn(p, ", ");
    return ur__error(UR_STATUS_INVALID, "%s: argument '%.*s' is NULL", fn, (int)len, p);
  }
  return UR_STATUS_OK;
}

const char *ur_status_name(ur_status s) {
  switch (s) {
    case UR_STATUS_OK: return "ok";
    case UR_STATUS_INVALID: return "invalid";
    case UR_STATUS_OOM: return "out of memory";
    case UR_STATUS_DEVICE: return "device error";
    case UR_STATUS_IO: return "io error";
    case UR_STATUS_UNSUPPORTED: return "unsupported";
    case UR_STATUS_INTERRUPTED: return "interrupted";
    case UR_STATUS_FORMAT: return "malformed input";
    default: return "unknown status";
  }
}

void ur__format_bytes(uint64_t b, char *buf, size_t len) {
  static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)b;
  int u = 0;
  while (v >= 1024.0 && u < 4) { v /= 1024.0; u++; }
  if (u == 0) snprintf(buf, len, "%llu B", (unsigned long long)b);
  else snprintf(buf, len, "%.1f %s", v, unit[u]);
}

size_t ur_sizeof_range(void) { return sizeof(ur_range); }
size_t ur_sizeof_advised(void) { return sizeof(ur_advised); }
size_t ur_sizeof_hint_record(void) { return sizeof(ur_hint_record); }
size_t ur_sizeof_device_props(void) { return sizeof(ur_device_props); }
size_t ur_sizeof_memory_stats(void) { return sizeof(ur_memory_stats); }
size_t ur_sizeof_migration_stats(void) { return sizeof(ur_migration_stats); }
size_t ur_sizeof_residency(void) { return sizeof(ur_residency); }
const char *ur_version(void) { return UR_VERSION; }
