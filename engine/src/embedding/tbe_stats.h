/* tbe_stats.h: what the embedding collection (tbe.c) lends its access counters and row
 * permutations (tbe_stats.c): the descriptors, the per-table slots, and the re-upload of the
 * descriptors to the GPU after a slot changed. */
#ifndef UR_TBE_STATS_H
#define UR_TBE_STATS_H

#include "core/core.h"
#include "embedding/tbe.h"

UR__HIDDEN ur__tbe_table *ur__tbe_desc(ur_tbe *t, int32_t table);
UR__HIDDEN ur_tensor **ur__tbe_counts_slot(ur_tbe *t, int32_t table);
UR__HIDDEN ur_tensor **ur__tbe_perm_slot(ur_tbe *t, int32_t table);
/* A table's permutation changed (set, relaid out or removed): host mirrors of it are stale.
 * The generation counts the changes. */
UR__HIDDEN void ur__tbe_perm_changed(ur_tbe *t, int32_t table);
UR__HIDDEN uint64_t ur__tbe_perm_gen(const ur_tbe *t, int32_t table);
/* 1 when a software cache serves the table (cache.c): its rows live in the cache's slots. */
UR__HIDDEN int ur__tbe_is_cached(const ur_tbe *t, int32_t table);
/* The page prefetch state of the collection's managed tables (tbe_pages.c): made on first use,
 * freed with the collection. */
struct ur__tbe_pages;
UR__HIDDEN struct ur__tbe_pages **ur__tbe_pages_slot(ur_tbe *t);
UR__HIDDEN void ur__tbe_pages_free(struct ur__tbe_pages *p);
/* Waits for the GPU, then copies the descriptors there (nothing on the CPU backend). */
UR__HIDDEN ur_status ur__tbe_sync_desc(ur_tbe *t);

#endif
