/* names.c: the names of dtypes, placements, advice and locations, both ways, and the order by
 * which lists of names are sorted (ur__named_cmp). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"

static const char *dtype_names[UR_DTYPE_COUNT] = {"f32", "bf16", "f16", "i8", "u8", "i32", "i64", "f64"};
static const size_t dtype_sizes[UR_DTYPE_COUNT] = {4, 2, 2, 1, 1, 4, 8, 8};
static const char *place_names[UR_PLACE_COUNT] = {"host", "pinned", "device", "managed"};
static const char *advice_names[UR_ADVICE_COUNT] = {
    "preferred_location", "unset_preferred_location", "accessed_by",
    "unset_accessed_by",  "read_mostly",              "unset_read_mostly"};
/* CUDA's own names are accepted too, so code ported from CUDA reads the same. */
static const char *advice_cuda_names[UR_ADVICE_COUNT] = {
    "cudaMemAdviseSetPreferredLocation", "cudaMemAdviseUnsetPreferredLocation",
    "cudaMemAdviseSetAccessedBy",        "cudaMemAdviseUnsetAccessedBy",
    "cudaMemAdviseSetReadMostly",        "cudaMemAdviseUnsetReadMostly"};

int ur__name_index(const char *const *names, int n, const char *s) {
  for (int i = 0; s && i < n; i++)
    if (!strcmp(s, names[i])) return i;
  return -1;
}

int ur__named_cmp(const void *a, const void *b) {
  const ur__named *x = a, *y = b;
  int c = strcmp(x->name, y->name);
  return c ? c : (x->at > y->at) - (x->at < y->at);
}

ur_status ur__names_repeat(const char *const *names, int32_t n, const char *who, int32_t *a,
                           int32_t *b) {
  *a = *b = -1;
  if (n < 2) return UR_STATUS_OK;
  ur__named *v = malloc(sizeof *v * (size_t)n);
  if (!v) return ur__error(UR_STATUS_OOM, "%s: out of host memory", who);
  int32_t m = 0;
  for (int32_t i = 0; i < n; i++)
    if (names[i]) v[m++] = (ur__named){names[i], i};
  qsort(v, (size_t)m, sizeof *v, ur__named_cmp);
  for (int32_t i = 1; i < m && *a < 0; i++)
    if (!strcmp(v[i - 1].name, v[i].name)) *a = v[i - 1].at, *b = v[i].at;
  free(v);
  return UR_STATUS_OK;
}

const char *ur_dtype_name(ur_dtype d) {
  return (unsigned)d < UR_DTYPE_COUNT ? dtype_names[d] : "?";
}

size_t ur_dtype_size(ur_dtype d) { return (unsigned)d < UR_DTYPE_COUNT ? dtype_sizes[d] : 0; }

ur_status ur_dtype_parse(const char *s, ur_dtype *out) {
  UR__ARGS(s, out);
  int i = ur__name_index(dtype_names, UR_DTYPE_COUNT, s);
  if (i >= 0) { *out = (ur_dtype)i; return UR_STATUS_OK; }
  return ur__error(UR_STATUS_INVALID,
                   "dtype: '%s' is not a dtype; expected f32, bf16, f16, i8, u8, i32, i64 or f64",
                   s ? s : "(null)");
}

const char *ur_place_name(ur_place p) {
  return (unsigned)p < UR_PLACE_COUNT ? place_names[p] : "?";
}

ur_status ur_place_parse(const char *s, ur_place *out) {
  UR__ARGS(s, out);
  int i = ur__name_index(place_names, UR_PLACE_COUNT, s);
  if (i >= 0) { *out = (ur_place)i; return UR_STATUS_OK; }
  return ur__error(UR_STATUS_INVALID,
                   "placement: '%s' is not a placement; expected host, pinned, device or managed",
                   s);
}

const char *ur_advice_name(ur_advice a) {
  return (unsigned)a < UR_ADVICE_COUNT ? advice_names[a] : "?";
}

ur_status ur_advice_parse(const char *s, ur_advice *out) {
  UR__ARGS(s, out);
  int i = ur__name_index(advice_names, UR_ADVICE_COUNT, s);
  if (i < 0) i = ur__name_index(advice_cuda_names, UR_ADVICE_COUNT, s);
  if (i >= 0) { *out = (ur_advice)i; return UR_STATUS_OK; }
  return ur__error(UR_STATUS_INVALID,
                   "advice: '%s' is not a memory advice; expected preferred_location, "
                   "unset_preferred_location, accessed_by, unset_accessed_by, read_mostly or "
                   "unset_read_mostly (or CUDA's cudaMemAdvise* names)",
                   s);
}

static int parse_int(const char *s, long *out) {
  char *end;
  if (!*s) return 0;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || *end) return 0;
  *out = v;
  return 1;
}

ur_status ur_location_parse(const char *s, int32_t *out) {
  UR__ARGS(s, out);
  long n;
  if (!strcmp(s, "cpu") || !strcmp(s, "host")) { *out = UR_LOC_CPU; return UR_STATUS_OK; }
  if (!strcmp(s, "gpu") || !strcmp(s, "cuda")) { *out = UR_LOC_CURRENT_GPU; return UR_STATUS_OK; }
  if ((!strncmp(s, "cuda:", 5) && parse_int(s + 5, &n) && n >= 0 && n <= UR_MAX_GPUS) ||
      (parse_int(s, &n) && n >= -1 && n <= UR_MAX_GPUS)) {
    *out = (int32_t)n;
    return UR_STATUS_OK;
  }
  return ur__error(UR_STATUS_INVALID,
                   "location: '%s' is not a location; expected cpu, gpu, cuda:N or a device "
                   "number (-1 for the CPU, 0..%d for a GPU)",
                   s, UR_MAX_GPUS);
}

ur_status ur_location_format(int32_t loc, char *buf, size_t len) {
  if (len && !buf) return ur__null(__func__, "buf");
  switch (loc) {
    case UR_LOC_CPU: snprintf(buf, len, "cpu"); break;
    case UR_LOC_CURRENT_GPU: snprintf(buf, len, "gpu"); break;
    case UR_LOC_NONE: snprintf(buf, len, "none"); break;
    case UR_LOC_MIXED: snprintf(buf, len, "mixed"); break;
    default:
      if (loc < 0 || loc > UR_MAX_GPUS)
        return ur__error(UR_STATUS_INVALID, "location: %d is not a location", (int)loc);
      snprintf(buf, len, "cuda:%d", (int)loc);
  }
  return UR_STATUS_OK;
}
