/* tsv_line.c: libFuzzer target for the Criteo TSV line parser.  The first byte picks
 * --pad-missing-fields; the rest is one line.  A parsed line must hold a 0/1 label and
 * finite, non-negative dense values; anything else must be a FORMAT error with a message. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "uvmrec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  int pad = data[0] & 1;
  /* A copy of exactly the line's bytes, so reading past them is caught. */
  char *line = malloc(size - 1 ? size - 1 : 1);
  if (!line) return 0;
  memcpy(line, data + 1, size - 1);
  int32_t label = -1, padded = -1;
  float dense[13];
  uint32_t cats[26];
  ur_status st = ur_criteo_parse_line(line, size - 1, pad, &label, dense, cats, &padded);
  if (st == UR_STATUS_OK) {
    if (label != 0 && label != 1) abort();
    if (padded && !pad) abort();
    for (int i = 0; i < 13; i++)
      if (!(dense[i] >= 0.0f) || !isfinite(dense[i])) abort();
  } else if (st != UR_STATUS_FORMAT || !ur_last_error()[0]) {
    abort();
  }
  free(line);
  return 0;
}
