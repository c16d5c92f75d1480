/* c_api.c: the engine from C alone: a managed tensor, memory hints on two parts of it (hot rows
 * preferred on the GPU, the rest on the host and read in place), what the engine recorded, and
 * the tensor freed.  Runs without a GPU: hints are then validated and recorded.
 *
 *   cc c_api.c $(pkg-config --cflags --libs uvmrec) -o c_api && ./c_api
 *
 * Exit status: 0 done, 1 an engine call failed (its message from ur_last_error()). */
#include <stdio.h>

#include "uvmrec.h"

static int fail(const char *what) {
  fprintf(stderr, "c_api: %s: %s\n", what, ur_last_error());
  return 1;
}

int main(void) {
  const int64_t shape[2] = {4096, 64}; /* 1 MiB of f32 */
  const int64_t hot = 512 * 64;        /* the first 512 rows, in elements */
  const int64_t numel = shape[0] * shape[1];
  ur_tensor *t;
  ur_range r;
  ur_advised a;
  char desc[256], where[32];
  int gpu = ur_device_count() > 0;
  int32_t loc = gpu ? 0 : UR_LOC_CPU;

  if (ur_tensor_new(&t, UR_DTYPE_F32, 2, shape, UR_PLACE_MANAGED, gpu ? 0 : UR_LOC_CPU))
    return fail("tensor_new");
  if (ur_tensor_rand(NULL, t, UR_DIST_UNIFORM, -0.05, 0.05, 7)) goto failed;
  if (ur_tensor_advise(t, 0, hot, &r, UR_ADVICE_PREFERRED_LOCATION, gpu ? 0 : UR_LOC_CPU))
    goto failed;
  printf("hot rows: bytes %llu..%llu (page %llu, rounded %d)\n", (unsigned long long)r.byte_begin,
         (unsigned long long)r.byte_end, (unsigned long long)r.page_bytes, (int)r.rounded);
  if (ur_tensor_advise(t, hot, numel - hot, &r, UR_ADVICE_PREFERRED_LOCATION, UR_LOC_CPU))
    goto failed;
  if (gpu && ur_tensor_advise(t, hot, numel - hot, &r, UR_ADVICE_ACCESSED_BY, loc)) goto failed;
  if (ur_tensor_prefetch(NULL, t, 0, hot, &r, loc)) goto failed;
  if (ur_tensor_advised(t, hot, numel - hot, &a)) goto failed;
  ur_location_format(a.preferred_location, where, sizeof where);
  printf("cold rows: preferred %s (%s)\n", where, a.from_driver ? "driver" : "engine record");
  ur_tensor_describe(t, desc, sizeof desc);
  printf("%s\n", desc);
  printf("hint log: %llu records\n", (unsigned long long)ur_hint_log_total());
  ur_tensor_free(t);
  return 0;

failed:
  fail("hints");
  ur_tensor_free(t);
  return 1;
}
