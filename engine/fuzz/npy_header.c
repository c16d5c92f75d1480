/* npy_header.c: libFuzzer target for the .npy header parser.  An accepted header must lie
 * inside the input, name a supported dtype and a shape of at most 4 dimensions whose byte
 * size does not overflow; anything else must be a FORMAT error with a message. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "uvmrec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  void *buf = malloc(size ? size : 1);
  if (!buf) return 0;
  memcpy(buf, data, size);
  ur_npy_info info;
  ur_status st = ur_npy_parse_header(buf, size, "fuzz.npy", &info);
  if (st == UR_STATUS_OK) {
    if (info.header_bytes > size || info.ndim < 0 || info.ndim > 4) abort();
    if (info.item_bytes != 4 && info.item_bytes != 8) abort();
    if (strcmp(info.descr, "<f4") && strcmp(info.descr, "<i4") && strcmp(info.descr, "<u4") &&
        strcmp(info.descr, "<i8"))
      abort();
    uint64_t bytes = info.item_bytes;
    for (int i = 0; i < info.ndim; i++) {
      if (info.shape[i] < 0) abort();
      if (__builtin_mul_overflow(bytes, (uint64_t)info.shape[i], &bytes)) abort();
    }
  } else if (st != UR_STATUS_FORMAT || !ur_last_error()[0]) {
    abort();
  }
  free(buf);
  return 0;
}
