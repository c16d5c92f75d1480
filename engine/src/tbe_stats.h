/* tbe_stats.h: what the embedding collection (tbe.c) lends its access counters and row
 * permutations (tbe_stats.c): the descriptors, the per-table slots, and the re-upload of the
 * descriptors to the GPU after a slot changed. */
#ifndef UR_TBE_STATS_H
#define UR_TBE_STATS_H

#include "core.h"
#include "tbe_plan.h"

UR__HIDDEN ur__tbe_table *ur__tbe_desc(ur_tbe *t, int32_t table);
UR__HIDDEN ur_tensor **ur__tbe_counts_slot(ur_tbe *t, int32_t table);
UR__HIDDEN ur_tensor **ur__tbe_perm_slot(ur_tbe *t, int32_t table);
/* Waits for the GPU, then copies the descriptors there (nothing on the CPU backend). */
UR__HIDDEN ur_status ur__tbe_sync_desc(ur_tbe *t);

#endif
