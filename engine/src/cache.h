/* cache.h: the software cache's internals (engine/src/cache.c), shared with the collection
 * (engine/src/tbe.c, which lends its tables to a cache), the CUDA glue
 * (engine/src/cuda/cache.cu) and the kernels (kernels/cache.cu). */
#ifndef UR_CACHE_H
#define UR_CACHE_H

#include <stdint.h>
#include "tbe_plan.h"
#include "uvmrec.h"

struct ur_cache;

/* A move list entry packs (cache table << UR__CACHE_ROW_BITS | row) in its first word and
 * the row of the slot storage (a slot or a staging row) in its second. */
#define UR__CACHE_ROW_BITS 48
#define UR__CACHE_ROW_MASK ((((uint64_t)1) << UR__CACHE_ROW_BITS) - 1)

/* What a move needs: where each cached table's rows live in host memory, and the slot
 * storage.  Pointer arrays are in memory the running backend reads. */
typedef struct ur__cache_io {
  void *const *host_w;           /* [tables] the rows of each cached table */
  float *const *host_s1;         /* [tables] optimizer state 1, or NULL arrays when none */
  float *const *host_s2;
  void *slot_w;                  /* [slot rows, dim] */
  float *slot_s1, *slot_s2;      /* [slot rows, state_per_row] */
  int64_t row_bytes;             /* dim * element size */
  int32_t state_per_row;         /* floats of each state per row: dim, 1 (rowwise) or 0 */
  int32_t nstate;
} ur__cache_io;

/* The collection's side (engine/src/tbe.c). */
/* Table i's own storage (its rows and state in host memory), whatever its kernels use now;
 * place is where that storage lives. */
ur_status ur__tbe_backing(const ur_tbe *t, int32_t i, ur__tbe_table *out, int32_t *place);
/* Points table i's kernels at other rows (a cache's slots: weights, state, rows) and
 * re-keys the collection; owner NULL points it back at its own storage. */
ur_status ur__tbe_redirect(ur_tbe *t, int32_t i, struct ur_cache *owner, void *weights,
                           float *state1, float *state2, int64_t rows);
const ur_tbe_config *ur__tbe_config(const ur_tbe *t);
const ur__tbe_feature *ur__tbe_features(const ur_tbe *t);
/* The collection is being freed: the cache must not touch it any more. */
void ur__cache_orphan(struct ur_cache *c, ur_tbe *t);

#endif
