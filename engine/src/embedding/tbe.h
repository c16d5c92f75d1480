/* tbe.h: the embedding collection's ops table, filled by the CPU reference
 * (engine/src/embedding/tbe_cpu.c) and by the CUDA backend (kernels/tbe.cu).  tbe_plan.h holds
 * the argument structs; tbe.c has checked every tensor before an entry runs. */
#ifndef UR_TBE_H
#define UR_TBE_H

#include <stddef.h>
#include <stdint.h>
#include "core/core.h"
#include "embedding/tbe_plan.h"
#include "uvmrec.h"

/* Row swaps of a table's layout (layout.c): pair k trades the physical rows of ids ids[k] and
 * ids[n + k] (no id twice among the 2n), in every tensor (rows of row_bytes[j], a multiple of
 * 4, at base[j]: the weights and the optimizer state), and their entries of perm.  ids and perm
 * are memory the backend reads. */
typedef struct ur__tbe_swap {
  int64_t *perm;
  const int64_t *ids;
  int64_t n;
  int32_t ntensors;
  char *base[3];
  uint64_t row_bytes[3];
} ur__tbe_swap;

/* work is memory of the bytes work_bytes gives (NULL when it gives 0), where the backend runs:
 * device memory for the GPU, host memory for the CPU. */
typedef struct ur_tbe_ops {
  ur_status (*work_bytes)(const struct ur__tbe_args *a, int backward, size_t *out);
  ur_status (*forward)(void *stream, const struct ur__tbe_args *a, void *work);
  /* Sorts, sums each distinct row's gradient and steps the optimizer, all on the stream; with
   * a->atomic (plain SGD on f32 rows, asked for) a backend may instead add each value's update
   * by atomics without sorting (the GPU does; the CPU steps as usual: its reference). */
  ur_status (*backward)(void *stream, const struct ur__tbe_args *a,
                            const struct ur__tbe_hyper *h, void *work);
  /* The deduplicated gradient in two calls with the same arguments and work: count
   * (synchronous, fills counts[num_tables] in host memory), then write rows i64 [U] and grads
   * f32.  Write may read what count left in work (the CPU's does; the GPU sorts again). */
  ur_status (*sparse_count)(void *stream, const struct ur__tbe_args *a, void *work,
                                int64_t *counts);
  ur_status (*sparse_write)(void *stream, const struct ur__tbe_args *a, void *work,
                                const int64_t *counts, int64_t *rows, float *grads);
  /* out[i] = src[ids[i]], rows of row_bytes (a multiple of 4); src holds src_rows rows.  The
   * CPU checks the ids against src_rows (an error names the first bad one); the GPU trusts
   * them. */
  ur_status (*gather_rows)(void *stream, const void *src, int64_t src_rows, size_t row_bytes,
                           const int64_t *ids, int64_t n, void *out);
  /* Far rows' early copies (far.c; GPU only, the CPU makes no copies): far_prefetch claims
   * a's batch's far rows in a->far (cleared), each row of cur's map (when cur->use) left as a
   * pair for far_patch, each other one of a->prior's map (when a->prior.use, the last step's)
   * as a pair from there, and each other one as a load, and sets a->far.taken[2] to the copies
   * claimed; far_patch copies f's pairs from src's copies (prior 0: cur's, prior 1: the last
   * step's map's); far_move moves f's rows over the link
   * in a kernel: its loads into the copies (to_home 0), or every copy home (1, write-behind: to
   * where f->homes says); far_spill moves the copies in slots [from, the copies made) between
   * HBM and `host` (pinned, f->rows' shape: 1 to it, 0 from it), which far.c's copy engines
   * left.  All on the stream. */
  ur_status (*far_prefetch)(void *stream, const struct ur__tbe_args *a,
                            const struct ur__tbe_far *cur);
  ur_status (*far_patch)(void *stream, const struct ur__tbe_far *f, const struct ur__tbe_far *src,
                         int32_t prior);
  ur_status (*far_move)(void *stream, const struct ur__tbe_far *f, int32_t to_home);
  ur_status (*far_spill)(void *stream, const struct ur__tbe_far *f, char *host, int64_t from,
                         int32_t to_host);
  /* Access counters (counters.c): c[i] = floor(c[i] * factor), n of them. */
  ur_status (*decay_counts)(void *stream, int32_t *c, int64_t n, double factor);
  /* The swaps of s, on the stream (the GPU: a warp a pair, nothing waits). */
  ur_status (*swap_rows)(void *stream, const ur__tbe_swap *s);
  /* Counters ranked where they live (layout.c's ur_counts_rank; the CPU has no entry, its
   * reference is there): c, n of them (0 < n < 2^31), in the backend's memory; writes to host
   * memory order[r] = the id of rank r (highest count first, ties by id, as the CPU's sort),
   * cumsum[r] = the counts (below 0 as 0) of ranks 0..r summed and by_id[id] = max(c[id], 0)
   * (cumsum and by_id where not NULL), computed where the counters are, and returns once they
   * are there.  work: the bytes rank_work_bytes gives, in the backend's memory. */
  ur_status (*rank_work_bytes)(int64_t n, size_t *out);
  ur_status (*rank_counts)(void *stream, const int32_t *c, int64_t n, void *work, int64_t *order,
                           int64_t *cumsum, int32_t *by_id);
} ur_tbe_ops;

/* The CPU backend's table (tbe_cpu.c), the reference. */
UR__HIDDEN extern const ur_tbe_ops ur__cpu_tbe_ops;

#endif
