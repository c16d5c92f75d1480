/* safetensors_header.c: libFuzzer target for the safetensors reader (the header length, the
 * JSON header, the layout checks).  The input is a whole file, opened through a memfd as
 * ur_safetensors_open opens any file.  An accepted file must give entries whose bytes lie in
 * the file, match dtype x shape, have every dimension bounded (those other than 0 making at most
 * the largest tensor's bytes, a 0 among them or not) and tile the data; every name must be found
 * again and every tensor viewed, verified (its checksum, where the file has them: a match or a
 * FORMAT error) and loaded; anything else must be a FORMAT error with a message, or UNSUPPORTED
 * (more dimensions than a tensor has). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "uvmrec.h"

static int fd = -1;
static char path[64];

static void check_file(ur_safetensors *f, size_t size) {
  int32_t n = ur_safetensors_count(f);
  uint64_t start = ur_safetensors_data_start(f), at = 0;
  if (ur_safetensors_bytes(f) != size || start < 8 || start > size) abort();
  for (int32_t i = 0; i < n; i++) {
    ur_safetensors_entry e;
    if (ur_safetensors_entry_get(f, i, &e)) abort();
    if (e.begin != at || e.end < e.begin || e.file_offset != start + e.begin) abort();
    if (e.file_offset + (e.end - e.begin) > size) abort();
    if (e.dtype < 0 || e.dtype >= UR_DTYPE_COUNT || e.ndim < 0 || e.ndim > UR_MAX_DIMS) abort();
    uint64_t bytes = ur_dtype_size((ur_dtype)e.dtype), bound = bytes;
    for (int d = 0; d < e.ndim; d++) {
      if (e.shape[d] < 0 || __builtin_mul_overflow(bytes, (uint64_t)e.shape[d], &bytes)) abort();
      if (e.shape[d] && (__builtin_mul_overflow(bound, (uint64_t)e.shape[d], &bound) ||
                         bound > (1ull << UR_TENSOR_MAX_BYTES_LOG2)))
        abort();
    }
    if (bytes != e.end - e.begin) abort();
    ur_status vs = ur_safetensors_verify(f, i, NULL);
    if (vs != UR_STATUS_OK && (vs != UR_STATUS_FORMAT || !ur_last_error()[0])) abort();
    if (ur_safetensors_find(f, e.name) != i) abort();
    at = e.end;
    ur_tensor *v = NULL;
    if (ur_safetensors_view(f, i, &v)) abort();
    if (ur_tensor_nbytes(v) != bytes) abort();
    /* Loading copies every byte of the entry into a tensor of its own. */
    int64_t shape[UR_MAX_DIMS];
    int32_t nd = ur_tensor_ndim(v);
    for (int d = 0; d < nd; d++) shape[d] = ur_tensor_dim(v, d);
    ur_tensor *dst = NULL;
    if (ur_tensor_new(&dst, (ur_dtype)e.dtype, nd, shape, UR_PLACE_HOST, UR_LOC_CPU) == UR_STATUS_OK) {
      ur_tensor *const dsts[1] = {dst};
      const char *names[1] = {e.name};
      if (ur_safetensors_load(NULL, f, 1, names, dsts, 0)) abort();
      if (bytes && memcmp(ur_tensor_data(dst), ur_tensor_data(v), bytes)) abort();
      ur_tensor_free(dst);
    }
    ur_tensor_free(v);
  }
  if (start + at != size) abort();
  for (int32_t i = 0; i < ur_safetensors_meta_count(f); i++) {
    const char *k = ur_safetensors_meta_key(f, i);
    if (!k || !ur_safetensors_meta_get(f, k)) abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (fd < 0) {
    fd = memfd_create("fuzz.safetensors", 0);
    if (fd < 0) abort();
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  }
  if (ftruncate(fd, 0) || (size && pwrite(fd, data, size, 0) != (ssize_t)size)) abort();
  ur_safetensors *f = NULL;
  ur_status st = ur_safetensors_open(&f, path);
  if (st == UR_STATUS_OK) {
    check_file(f, size);
    ur_safetensors_close(f);
  } else if ((st != UR_STATUS_FORMAT && st != UR_STATUS_UNSUPPORTED) || !ur_last_error()[0] || f) {
    abort();
  }
  return 0;
}
