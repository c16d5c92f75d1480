/* cache.h: the software cache's ops table and the structs its entries take, shared by the
 * cache (cache.c), the CPU reference (cache_cpu.c) and the CUDA backend (kernels/cache.cu). */
#ifndef UR_CACHE_H
#define UR_CACHE_H

#include <stdint.h>
#include "core/core.h"
#include "embedding/cache_sets.h"
#include "embedding/tbe_plan.h"
#include "uvmrec.h"

struct ur_cache;

/* A move list entry packs (cache table << UR__CACHE_ROW_BITS | row) in its first word and
 * the row of the slot storage (a slot or a staging row) in its second. */

/* What a move needs: where each cached table's rows live in host memory, and the slot
 * storage.  Pointer arrays are in memory the backend reads. */
typedef struct ur__cache_io {
  void *const *host_w;           /* [tables] the rows of each cached table */
  float *const *host_s1;         /* [tables] optimizer state 1, or NULL arrays when none */
  float *const *host_s2;
  void *slot_w;                  /* [slot rows, dim] */
  float *slot_s1, *slot_s2;      /* [slot rows, state_per_row] */
  int64_t row_bytes;             /* dim * element size */
  int32_t state_per_row;         /* floats of each state per row: dim, 1 (rowwise) or 0 */
  int32_t nstate;
  int32_t mover_warps;           /* the GPU's mover: warps, rounded up to blocks of 32 (0: a
                                 * warp per entry) ... */
  int32_t mover_rows;            /* ... while they have at most this many entries each */
} ur__cache_io;

/* The first of values v0..v1-1 whose id is outside 0..rows-1, or -1: one feature's ids against
 * its table (its offsets checked before). */
static inline int64_t ur__cache_first_bad(const int64_t *vals, int64_t v0, int64_t v1, int64_t rows) {
  for (int64_t v = v0; v < v1; v++)
    if (vals[v] < 0 || vals[v] >= rows) return v;
  return -1;
}

/* ---- the decisions (cache_cpu.c, the reference, and kernels/cache.cu) ---- */

#define UR__CACHE_RING 4        /* batches prepared and not yet released */

/* The cache's geometry and state, in memory where the backend runs (device memory for the GPU,
 * host memory for the CPU). */
typedef struct ur__cache_dev {
  const int64_t *kbase;         /* [nt + 1]: each cache table's first key, then the total */
  const int64_t *set_base, *set_count;  /* [nt] */
  const int32_t *feat_ct;       /* [F]: the cache table of each feature, or -1 */
  const int64_t *feat_rows;     /* [F]: the rows of each feature's table: under bounds fatal the
                                 * lookup checks every feature's ids, cached or not */
  uint64_t *tag;                /* [S]: key, or all ones when empty */
  int64_t *stamp;               /* [S]: ticket of the last batch that used the slot */
  uint8_t *dirty;               /* [S] */
  uint32_t *freq;               /* LFU: [total keys] count (low 16 bits), epoch (high 16); or NULL */
  int32_t nt, F, key_bits, set_bits;
  int32_t partial;              /* some feature's table is not cached: the GPU's lookup
                                 * gathers the cached tables' values before it sorts */
  int64_t S, nsets;
  int64_t keys;                 /* the tables' rows together: freq's length */
} ur__cache_dev;

/* What the decisions tell the host (int64 words of info), set by each call. */
enum {
  UR__CI_U,                     /* lookup: distinct keys */
  UR__CI_NG,                    /* lookup: sets they fall in */
  UR__CI_NVALID,                /* lookup: values of cached tables with a valid id */
  UR__CI_BAD_V,                 /* lookup: a value with a bad id (bounds fatal), or -1 */
  UR__CI_BAD_F,                 /* lookup: first feature whose values run backwards (F: the
                                 * offsets as a whole), or -1 */
  UR__CI_NWB,                   /* decide: dirty evictions (write-backs) */
  UR__CI_NFILL,                 /* decide: misses given a slot */
  UR__CI_NCONF,                 /* decide: conflict misses (staged) */
  UR__CI_CACHED,                /* lookup (GPU, partial): values of cached tables' features */
  UR__CI_MEET,                  /* lookup: [UR__CACHE_RING] 1 where a flight's staged rows meet */
  UR__CI_TABLES = UR__CI_MEET + UR__CACHE_RING, /* [nt][UR__CT_COUNT] per cache table */
};
enum { UR__CT_LOOKUPS, UR__CT_UNIQUE, UR__CT_HITS, UR__CT_MISSES, UR__CT_CONFLICTS,
       UR__CT_EVICTIONS, UR__CT_WRITEBACKS, UR__CT_COUNT };

/* One batch's decisions, in three calls on one stream sharing the scratch (lookup; the host
 * reads info and decides what to wait for; decide; the host reads info and makes room for
 * staged rows; place). */
typedef struct ur__cache_job {
  const int64_t *vals, *offs;   /* [n], [bags + 1] */
  int64_t n, bags, batch;       /* batch: bags per feature when bag_start is NULL */
  const int64_t *bag_start;     /* [F + 1] in host memory (pinned for the GPU), or NULL */
  int32_t bounds_fatal;
  const int64_t *staged[UR__CACHE_RING];  /* lookup: flights' staged (pair, row)s, pairs
                                           * ascending, or NULL */
  int64_t nstaged[UR__CACHE_RING];
  int64_t U, ng, nvalid;        /* decide and place: from lookup's info */
  int64_t ticket, floor;        /* slots stamped below floor are evictable */
  uint32_t epoch;               /* LFU: the decay epoch of ticket */
  int32_t lfu;
  int32_t rebase;               /* LFU: decide re-bases every key's count to epoch first
                                 * (ur__cache_freq_rebase), as the host asks at least every
                                 * UR__CACHE_REBASE_EPOCHS epochs */
  int64_t nwb, nfill, nconf;    /* place: from decide's info */
  int64_t sbase;                /* place: the first staging row of this batch */
  int64_t *lists;               /* place: [2 nwb | 2 nfill | 2 nconf | U - nconf slots]; the
                                 * write-backs in key order of the keys that evict them (the
                                 * CPU) or sorted by the row they write (the GPU, for its moves) */
  int64_t *row_ids;             /* place: [slot storage rows] the row each holds (set for loads) */
  int64_t *out;                 /* place: [n] slot ids, or the ids of other tables' features */
  void *scratch;                /* of scratch_bytes (the backend's scratch entry), kept from
                                 * lookup to place */
  size_t scratch_bytes;
  int64_t *info;                /* where the backend runs, UR__CI_TABLES + nt * UR__CT_COUNT words */
  int64_t *info_host;           /* host (pinned for the GPU): where each call copies info;
                                 * the same memory as info when that is host memory */
} ur__cache_job;

/* The cache's ops table, filled by the CPU reference (cache_cpu.c) and by the CUDA backend
 * (kernels/cache.cu).  Pointers (entries, lists, dirty, slots) are in memory the backend
 * reads. */
typedef struct ur_cache_ops {
  /* Rows between host memory and the slot storage, entries as pairs: the n_out of out go
   * from their slots to host memory (write-backs), then the n_in of in from host memory to
   * their slots (fills), as if in that order: a slot in both lists sends its row home before
   * the new one arrives.  scratch (scratch_bytes, or NULL) is device memory the backend may use
   * meanwhile: the GPU stages write-backs there to move them beside the fills. */
  ur_status (*move)(void *stream, const struct ur__cache_io *io, const int64_t *out,
                    int64_t n_out, const int64_t *in, int64_t n_in, void *scratch,
                    size_t scratch_bytes);
  /* The decisions: scratch bytes for a batch of n values; then one
   * batch's lookup, decide and place on stream (each copies the job's info to info_host,
   * which the caller reads after a stream sync; the GPU's lookup also waits for the stream
   * inside, for the number of distinct keys and, partial, the cached values' count first);
   * mark sets dirty[slots[0..n-1]] = 1. */
  ur_status (*scratch)(const struct ur__cache_dev *d, int64_t n, size_t *bytes);
  ur_status (*lookup)(void *stream, const struct ur__cache_dev *d,
                            const struct ur__cache_job *j);
  ur_status (*decide)(void *stream, const struct ur__cache_dev *d,
                            const struct ur__cache_job *j);
  ur_status (*place)(void *stream, const struct ur__cache_dev *d,
                           const struct ur__cache_job *j);
  ur_status (*mark)(void *stream, uint8_t *dirty, const int64_t *slots, int64_t n);
} ur_cache_ops;

/* The CPU backend's table (cache_cpu.c), the reference. */
UR__HIDDEN extern const ur_cache_ops ur__cpu_cache_ops;

#endif
