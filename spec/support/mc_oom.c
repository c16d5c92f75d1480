/* mc_oom.c: whether an updating ur_mc_remap on the CPU asks for memory once its rounds ran
 * (engine/src/embedding/mc.c: "nothing may fail for memory once schedule's rounds ran"),
 * found by linking the engine with ur__cpu, malloc and calloc wrapped: the CPU backend's mc
 * round, once it returns, makes every allocation of the engine fail until the batch's remap
 * returns.  One table, a round every batch: batch 1 makes ids 100..102 candidates, batch 2's
 * round admits them.  spec/mc_spec.lua reads the lines
 * "batch 2: STATUS MESSAGE", "refused N allocations", "steps S rounds R resident 100: X".
 *   mc_oom */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "uvmrec.h"
#include "core/backend.h"
#include "embedding/mc.h"

const ur_backend *__real_ur__cpu(void);
void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);

static ur_backend counted;
static ur_mc_ops ops;
static int armed;
static long long refused;

void *__wrap_malloc(size_t n) {
  if (armed) {
    refused++;
    return NULL;
  }
  return __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t size) {
  if (armed) {
    refused++;
    return NULL;
  }
  return __real_calloc(n, size);
}

static ur_status armed_round(void *s, const ur__mc_table *t, ur__mc_round *r) {
  ur_status st = ur__cpu_mc_ops.round(s, t, r);
  armed = 1; /* until the batch's remap returns */
  return st;
}

static ur_status disarming_remap(void *s, const ur__mc_batch *b) {
  ur_status st = ur__cpu_mc_ops.remap(s, b);
  armed = 0;
  return st;
}

const ur_backend *__wrap_ur__cpu(void) {
  if (!counted.mc) {
    counted = *__real_ur__cpu();
    ops = *counted.mc;
    ops.round = armed_round;
    ops.remap = disarming_remap;
    counted.mc = &ops;
  }
  return &counted;
}

static ur_status batch(ur_mc *m, const int64_t *ids, int64_t n) {
  int64_t nb = 1, no = 2;
  ur_tensor *values = NULL, *offsets = NULL, *out = NULL;
  ur_status st = ur_tensor_new(&values, UR_DTYPE_I64, 1, &n, UR_PLACE_HOST, -1);
  if (!st) st = ur_tensor_new(&offsets, UR_DTYPE_I64, 1, &no, UR_PLACE_HOST, -1);
  if (!st) st = ur_tensor_new(&out, UR_DTYPE_I64, 1, &n, UR_PLACE_HOST, -1);
  if (!st) {
    memcpy(ur_tensor_data(values), ids, sizeof(int64_t) * (size_t)n);
    int64_t *o = ur_tensor_data(offsets);
    o[0] = 0;
    o[nb] = n;
    st = ur_mc_remap(NULL, m, values, offsets, NULL, NULL, out, 1);
  }
  armed = 0; /* a remap refused before the backend's: nothing was armed, or the round's */
  ur_tensor_free(values);
  ur_tensor_free(offsets);
  ur_tensor_free(out);
  return st;
}

int main(void) {
  ur_mc_table_config tc;
  memset(&tc, 0, sizeof tc);
  tc.name = "t";
  tc.rows = 16;
  tc.fallback_rows = 1;
  tc.policy = UR_MC_LFU;
  tc.evict_every = 1;
  tc.max_candidates = 1000;
  tc.decay = 1;
  tc.distance_power = 1;
  tc.fill = 0;
  ur_mc_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.device = -1;
  int32_t ft = 0;
  ur_mc *m = NULL;
  if (ur_mc_new(&m, &cfg, 1, &tc, 1, &ft)) {
    fprintf(stderr, "mc_oom: %s\n", ur_last_error());
    return 1;
  }
  int64_t first[3] = {100, 101, 102}, second[1] = {103};
  if (batch(m, first, 3)) {
    fprintf(stderr, "mc_oom: batch 1: %s\n", ur_last_error());
    return 1;
  }
  ur_status st = batch(m, second, 1);
  printf("batch 2: %d %s\n", (int)st, st ? ur_last_error() : "ok");
  printf("refused %lld allocations\n", refused);
  ur_mc_stats stats;
  int64_t id = 100, row = -1;
  int32_t resident = -1;
  if (ur_mc_stats_get(m, 0, &stats) || ur_mc_lookup(m, 0, &id, 1, &row, &resident)) {
    fprintf(stderr, "mc_oom: %s\n", ur_last_error());
    return 1;
  }
  printf("rounds %lld admissions %lld resident 100: %d\n", (long long)stats.rounds,
         (long long)stats.admissions, (int)resident);
  ur_mc_free(m);
  return 0;
}
