/* cache_drop.c: the backend calls ur_cache_drop (engine/src/embedding/cache.c) makes to reset the
 * LFU counts of the rows it drops, counted by linking the engine with ur__cpu wrapped
 * (-Wl,--wrap=ur__cpu): the engine gets a copy of the CPU backend whose fill and zero_rows count
 * their calls.  A host collection of one table under an LFU cache drops n ids;
 * spec/cache_spec.lua reads the line "drop N fills F zero_rows Z dropped D".
 *   cache_drop [n]   (default 1000) */
#include <stdio.h>
#include <stdlib.h>
#include "uvmrec.h"
#include "core/backend.h"

const ur_backend *__real_ur__cpu(void);
static ur_backend counted;
static long long fills, zero_rows;
static ur_status (*real_fill)(void *, void *, size_t, size_t, uint64_t);
static ur_status (*real_zero_rows)(void *, void *, size_t, const int64_t *, size_t);

static ur_status count_fill(void *s, void *dst, size_t n, size_t elem_bytes, uint64_t value) {
  fills++;
  return real_fill(s, dst, n, elem_bytes, value);
}

static ur_status count_zero_rows(void *s, void *dst, size_t row_bytes, const int64_t *rows,
                                 size_t n) {
  zero_rows++;
  return real_zero_rows(s, dst, row_bytes, rows, n);
}

const ur_backend *__wrap_ur__cpu(void) {
  if (!real_fill) {
    counted = *__real_ur__cpu();
    real_fill = counted.fill;
    real_zero_rows = counted.zero_rows;
    counted.fill = count_fill;
    counted.zero_rows = count_zero_rows;
  }
  return &counted;
}

int main(int argc, char **argv) {
  int64_t n = argc > 1 ? atoll(argv[1]) : 1000;
  if (n < 1) return 2;
  ur_tbe_table_config tc = {0};
  tc.name = "a";
  tc.rows = 4 * n;
  tc.dim = 4;
  tc.dtype = UR_DTYPE_F32;
  tc.pooling = UR_POOLING_SUM;
  tc.place = UR_PLACE_HOST;
  tc.state_place = -1;
  ur_tbe_config cfg = {0};
  cfg.device = -1;
  cfg.optim.kind = UR_OPTIM_KIND_SGD;
  cfg.optim.lr = 0.1;
  cfg.out_dtype = UR_DTYPE_F32;
  int32_t feature_table = 0, table = 0;
  ur_tbe *t = NULL;
  ur_cache *c = NULL;
  ur_cache_config cc = {0};
  cc.slots = 64;
  cc.policy = UR_CACHE_LFU;
  cc.staging_rows = 16;
  if (ur_tbe_new(&t, &cfg, 1, &tc, 1, &feature_table, NULL) || ur_cache_new(&c, t, 1, &table, &cc)) {
    fprintf(stderr, "cache_drop: %s\n", ur_last_error());
    return 1;
  }
  int64_t *ids = malloc(sizeof *ids * (size_t)n), dropped = -1;
  for (int64_t i = 0; i < n; i++) ids[i] = 3 * i; /* scattered */
  fills = zero_rows = 0;
  if (ur_cache_drop(c, 0, ids, n, &dropped)) {
    fprintf(stderr, "cache_drop: %s\n", ur_last_error());
    return 1;
  }
  printf("drop %lld fills %lld zero_rows %lld dropped %lld\n", (long long)n, fills, zero_rows,
         (long long)dropped);
  free(ids);
  ur_cache_free(c);
  ur_tbe_free(t);
  return 0;
}
