/* linear_plan.h: how the GPU's linear backward (kernels/linear.cu) sizes its work, for the
 * launchers there and for ur_linear_backward_workspace (dense/linear.c), which the planner
 * prices a step's dense workspaces with (uvmrec.planner.cost): one copy of the rules, plain C
 * for gcc and nvcc alike.  Each stream that runs a matrix product keeps one workspace
 * (kernels/dense.cu): cuBLASLt's UR_LT_WORKSPACE bytes and after them the partial sums of a
 * call, the parts below (the loss's few partials, kernels/loss.cu, borrow the workspace's start
 * between products). */
#ifndef UR_LINEAR_PLAN_H
#define UR_LINEAR_PLAN_H

#include <stddef.h>
#include <stdint.h>

#define UR_LT_WORKSPACE (32u << 20) /* cuBLASLt's workspace per stream, as NVIDIA advises */
/* Columns per block the chunk count assumes (bf16: 32 lanes of 16 bytes); f32 rows (128) and
 * unaligned rows (32) run 2x and 8x the blocks over the same chunks, so the partials' size stays
 * one formula. */
#define UR_BGRAD_COLS 256
#define UR_BGRAD_ROWS 8   /* warps per block, each on every 8th row of the chunk */

/* Chunks of rows the bias-gradient reduction sums into partials (a block per chunk and
 * UR_BGRAD_COLS columns): enough to fill the GPU's sms multiprocessors four times over, each
 * over UR_BGRAD_ROWS rows at least, at most a grid's 65535. */
static inline int64_t ur__bgrad_chunks(int64_t rows, int64_t cols, int sms) {
  int64_t tiles = (cols + UR_BGRAD_COLS - 1) / UR_BGRAD_COLS;
  int64_t want = ((int64_t)(sms > 0 ? sms : 1) * 4 + tiles - 1) / tiles;
  int64_t most = (rows + UR_BGRAD_ROWS - 1) / UR_BGRAD_ROWS;
  if (want > most) want = most;
  if (want > 65535) want = 65535;
  return want < 1 ? 1 : want;
}

/* Bytes of those partials: chunks x cols floats. */
static inline size_t ur__bgrad_part(int64_t rows, int64_t cols, int sms) {
  return (size_t)(ur__bgrad_chunks(rows, cols, sms) * cols) * sizeof(float);
}

/* Blocks of the one-output backward, each over *per rows (rows > 0): enough to fill the GPU,
 * each over 32 rows at least; the count is what `per` rows a block leave, so none is empty. */
static inline int64_t ur__gemv_blocks(int64_t rows, int sms, int64_t *per) {
  int64_t want = (rows + 31) / 32, cap = (int64_t)(sms > 0 ? sms : 1) * 4;
  int64_t blocks = want < 1 ? 1 : want < cap ? want : cap;
  *per = (rows + blocks - 1) / blocks;
  return (rows + *per - 1) / *per;
}

/* Bytes of the one-output backward's partials over `in` columns: a block's weight gradient and
 * its input's bias gradient (in floats each) for every block, then a float a block for the
 * bias gradient. */
static inline size_t ur__gemv_part(int64_t rows, int64_t in, int sms) {
  int64_t per, blocks = ur__gemv_blocks(rows, sms, &per);
  return (size_t)(blocks * in * 2 + blocks) * sizeof(float);
}

#endif
