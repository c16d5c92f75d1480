/* synth_cpu.c: the CPU's synth table: the generator on every core, a sample at a time
 * (synth.h), the reference kernels/synth.cu equals bit for bit. */
#include "data/synth.h"

typedef struct gen_job {
  const ur__synth *x;
  int64_t first;
  float *dense, *labels, *weights, *probs;
  int64_t *ids, *groups;
  int32_t *lengths;
} gen_job;

static void gen_range(void *ctx, size_t i0, size_t i1) {
  const gen_job *j = ctx;
  const ur__synth *x = j->x;
  for (size_t i = i0; i < i1; i++) {
    ur__synth_row(x, j->first + (int64_t)i, j->dense + i * (size_t)x->D, j->labels + i,
                  j->ids + i * (size_t)x->H, j->weights ? j->weights + i * (size_t)x->H : NULL,
                  j->lengths + i * (size_t)x->T, j->groups ? j->groups + i : NULL,
                  j->probs ? j->probs + i : NULL);
  }
}

static ur_status cpu_generate(void *stream, const ur__synth *x, int64_t first, int64_t n,
                              void *dense, void *labels, void *ids, void *weights, void *lengths,
                              void *groups, void *probs) {
  (void)stream;
  gen_job j = {x, first, dense, labels, weights, probs, ids, groups, lengths};
  ur__parallel_for((size_t)n, 256, gen_range, &j);
  return UR_STATUS_OK;
}

const ur_synth_ops ur__cpu_synth_ops = {.generate = cpu_generate};
