/* table.h: the embedding collection's tables, the lowest module of the embedding room: the
 * per-table descriptors the kernels read, the storage of rows and optimizer state behind them,
 * redirecting a table to other rows (a cache's slots), the counter and permutation slots, the
 * descriptors' copy on the device, and hooks run when the collection is freed.
 *
 * The room's files, lower to upper; each calls only files listed before it (and core/), so no
 * two call each other:
 *   tbe_cpu.c    the CPU reference of the tbe ops (tbe.h's table; tbe_plan.h's arithmetic)
 *   cache_cpu.c  the CPU reference of the cache ops (cache.h's table; cache_sets.h)
 *   table.c      this header: construction, storage, descriptors, redirects, slots, hooks
 *   counters.c   per-row access counters
 *   layout.c     ranking rows by count, row permutations and relayout
 *   pages.c      page prefetch of managed tables
 *   tbe.c        the checks of a call; forward, backward, the sparse gradient, the row gather
 *   cache.c      the software cache
 * The five after table.c call table.c and no other.  Managed collisions (mc.c, mc_cpu.c, mc.h)
 * map raw ids to rows before any of this and call none of it: the rows they give to other ids
 * are reset through ur_tbe_reset_rows (table.c) and ur_cache_drop (cache.c) by their caller.  The
 * quantized collection (qtbe_cpu.c, its CPU reference, then qtbe.c) is a family of its own beside
 * them: of these files it calls only table.c's names and features (ur__tbe_names).  The
 * collection reaches its kernels only through t->be->tbe (tbe_cpu.c or kernels/tbe.cu), a cache
 * through c->be->cache (cache_cpu.c or kernels/cache.cu); a freed collection lets its cache and
 * its page state go through hooks. */
#ifndef UR_TABLE_H
#define UR_TABLE_H

#include "core/core.h"
#include "embedding/tbe.h"

#define UR__TBE_NDT 3 /* storage dtypes: f32, bf16, f16 (their enum values 0..2) */
/* The far rows' maps (far.c): the current one, the next batch's early copies, and the last
 * step's, whose copies may still be going home (early copies take their rows from it). */
#define UR__FAR_MAPS 3

/* Run when the collection is freed, before its storage goes: what was lent it (a cache's
 * redirect, the page prefetch state) lets go.  ctx is the hook's own. */
typedef void (*ur__tbe_hook_fn)(void *ctx);
typedef struct ur__tbe_hook {
  ur__tbe_hook_fn fn;
  void *ctx;
} ur__tbe_hook;

/* A collection's tables and features by name, as both kinds of collection hold them (ur_tbe;
 * ur_qtbe in qtbe.c): the names (given, or a prefix and the index), each feature's table, dim
 * and first output column, and whether the tables pool (all of them, sum or mean) or none does
 * (then every table has one dim).  Filled in three steps: ur__tbe_names_init, then
 * ur__tbe_names_table for every table, then for each table (after the collection has checked the
 * rest of it under that name) ur__tbe_names_check, then ur__tbe_names_features. */
typedef struct ur__tbe_names {
  const char *who;          /* the start of messages: "tbe", "qtbe" */
  int32_t T, F;
  char **tnames, **fnames;  /* owned */
  int32_t *tdims, pooling0; /* each table's dim; table 0's pooling */
  int32_t *tfirst;          /* the first table of each table's name (ur__tbe_names_check) */
  ur__tbe_feature *features;
  int32_t pooled, dim;      /* dim: table 0's, the one dim of pooling none */
  int64_t out_dim;          /* pooled: the features' dims added up; none: dim */
} ur__tbe_names;

/* Room for T tables and F features; "<who>: out of host memory" when there is none. */
UR__HIDDEN ur_status ur__tbe_names_init(ur__tbe_names *n, const char *who, int32_t T, int32_t F);
/* Names table i: name, or prefix and i when NULL. */
UR__HIDDEN ur_status ur__tbe_names_table(ur__tbe_names *n, int32_t i, const char *name,
                                         const char *prefix);
/* Table i of that dim and pooling (a valid one): its name is no earlier table's, and it pools
 * as table 0 does, with table 0's dim under pooling none.  Every table is named before table 0's
 * check, which sorts the names once (n log n: a model may have a thousand tables). */
UR__HIDDEN ur_status ur__tbe_names_check(ur__tbe_names *n, int32_t i, int32_t dim,
                                         int32_t pooling);
/* Names the features (feature_names NULL: prefix and the index), checks that each is on a table
 * and that no two share a name, and lays them out. */
UR__HIDDEN ur_status ur__tbe_names_features(ur__tbe_names *n, const int32_t *feature_table,
                                            const char *const *feature_names, const char *prefix);
UR__HIDDEN void ur__tbe_names_free(ur__tbe_names *n);
/* A device descriptor block holds the T table descriptors (table_bytes each), then the F
 * feature descriptors from the next 16-byte boundary: where they start. */
UR__HIDDEN size_t ur__tbe_names_features_at(const ur__tbe_names *n, size_t table_bytes);

/* The checks both kinds of collection make of their options (who starts the messages): the
 * engine's (device, bounds, output dtype), at least one table and one feature, a table's rows,
 * dim and pooling, and a placement of it (what: "placement", "its optimizer state") on a
 * collection of that device. */
UR__HIDDEN ur_status ur__tbe_check_engine(const char *who, int32_t device, int32_t bounds,
                                          ur_dtype out_dtype);
UR__HIDDEN ur_status ur__tbe_check_counts(const char *who, int32_t num_tables, int32_t num_features);
UR__HIDDEN ur_status ur__tbe_check_table(const char *who, const char *name, int64_t rows,
                                         int32_t dim, int32_t pooling);
UR__HIDDEN ur_status ur__tbe_check_place(const char *who, const char *name, const char *what,
                                         int32_t place, int32_t device);
/* Offsets o[0..bags] of a call's values start at 0, never decrease and end at values; the
 * first break is named by its feature and sample, the bags laid out as ur__tbe_bag_of counts
 * (bag_start NULL: batch bags a feature).  Where the CPU can read them. */
UR__HIDDEN ur_status ur__tbe_check_offsets(const ur__tbe_names *n, const int64_t *o, int64_t bags,
                                           int64_t values, const int64_t *bag_start,
                                           int64_t batch);
/* The error of an id its table has no row for, one wording for the collections, their cache and
 * the quantized ones: "<who>: table 'T' (feature 'F', sample s, value v) has no row <id>[ (m
 * after modulo M)]; ids run 0..<rows - 1>" (modulo 0: none; the note only for an id >= 0). */
UR__HIDDEN ur_status ur__tbe_bad_id(const char *who, const char *table, const char *feature,
                                    int64_t sample, int64_t value, int64_t id, int64_t modulo,
                                    int64_t rows);
/* "<who>: table i does not exist" unless 0 <= i < T. */
UR__HIDDEN ur_status ur__tbe_names_index(const ur__tbe_names *n, int32_t i);
/* The public accessors' answers: NULL or -1 out of range. */
UR__HIDDEN const char *ur__tbe_names_tname(const ur__tbe_names *n, int32_t i);
UR__HIDDEN const char *ur__tbe_names_fname(const ur__tbe_names *n, int32_t f);
UR__HIDDEN int32_t ur__tbe_names_ftable(const ur__tbe_names *n, int32_t f);
UR__HIDDEN int64_t ur__tbe_names_fcol(const ur__tbe_names *n, int32_t f);

struct ur_tbe {
  ur_tbe_config cfg;
  /* Where the collection's own arrays (descriptors, counters, permutations, workspaces, a
   * cache's slots) live: device memory of its GPU, or host memory; its backend is the one of
   * that memory, taken once here. */
  ur_place home;
  const ur_backend *be;
  ur__tbe_names names;      /* T, F, the names and the features */
  ur_tbe_table_config *tc;  /* each name is names.tnames' */
  ur__tbe_table *tables;    /* with pointers into the storages (or a cache's slots) */
  ur_tensor *wstore[UR_PLACE_COUNT][UR__TBE_NDT];
  ur_tensor *sstore[UR_PLACE_COUNT];
  int64_t *woff, *soff;     /* element offsets of each table and of its state */
  int32_t *splace;
  int32_t nstate;           /* state tensors per table */
  int64_t total_keys;
  int32_t key_bits;
  int64_t step;
  ur_tensor *desc;          /* the descriptors and features in device memory (home device) */
  ur_tensor *callbuf;       /* one call's VBE arrays in device memory (home device) */
  ur_tensor *work;          /* the backend's workspace, grown on demand (tbe.c) */
  ur_tensor *flags;         /* i64 [2] at home: first bad value index, ids skipped */
  const int32_t *gate;      /* a guard's flags (ur_tbe_set_gate), the caller's, or NULL */
  const void **owner;       /* per table: who its rows are redirected to (a cache), or NULL */
  /* per table: why the rows a cache held were lost (ur__tbe_rows_lost: a cache freed or grown
   * that could not keep them), its own rows and state stale, until init_table writes them; NULL
   * for a table whose rows are its own */
  char **lost;
  /* per table, NULL until used (counters.c, layout.c): access counters i32 [rows] and the
   * row permutation i64 [rows], at home */
  ur_tensor **counts, **perm;
  uint64_t *perm_gen;       /* per table: bumped whenever its permutation changes */
  ur_tensor *swapbuf;       /* i64 at home: the ids of the last row swaps (layout.c), kept so
                               that nothing is freed (and waited for) while the swaps run */
  struct ur__pages *pages;  /* page prefetch state (pages.c, freed by its hook), or NULL */
  /* far rows' copies (far.c): room for far_rows of them at home (GPU), in UR__FAR_MAPS maps
   * taken in turn.  far[far_cur] holds the current map and copies, the next in turn the early
   * copies' (made by ur_tbe_far_prefetch, each map on its first use), the one after it the
   * last step's, which may still be going home.  far_made: the last forward made copies;
   * far_ready: no write but the backward's (which writes them too) has overtaken them since;
   * far_early: the next map holds early copies for the next forward; far_captured: a forward
   * was captured into a graph (early copies are refused from then on).  far_ev: events after
   * the last forward and after the early copies.  far_values, far_n: the last forward's
   * values, which its backward must be given for early copies to stay current; far_open: that
   * forward made copies and its backward has not stepped yet.  far_kept: bit k while map k's
   * copies are its rows' newest values but where a later map has a copy (stepped with the
   * forward's values, not cleared or dropped since): early copies take such rows from there.
   * Write-behind (far_behind set): far_bwd_ev after a
   * backward that stepped copies only, far_stream writing that map's copies home, far_home_ev[k]
   * after map k's went (far_home_pending: bit k while the host has not seen it done; the stream
   * writes in order, so the last one's covers every earlier); far_homing: the index + 1 of the
   * map whose copies are still the rows while they go, 0 when none is or they are no longer
   * current; far_graphed: a forward was ever captured, whose replays wait for nothing, so
   * write-behind stays off.  far_dma: the ways (ur_far_dma) rows cross through the copy
   * engines and host threads (far.c's far_dma_*), far_host[k] map k's pinned staging (made when
   * the ways or the room are set) and far_jobs[k][home] what the host threads are given for it,
   * far_dma_done[home] what they did each way (ur_tbe_far_dma_stats). */
  int64_t far_rows;
  ur_tensor *far[UR__FAR_MAPS];
  int32_t far_cur, far_made, far_ready, far_early, far_captured, far_open, far_kept;
  void *far_ev[2];
  int32_t far_behind, far_homing, far_home_pending, far_home_last, far_graphed;
  void *far_stream, *far_bwd_ev, *far_home_ev[UR__FAR_MAPS];
  const void *far_values;
  int64_t far_n;
  int32_t far_dma;
  ur_tensor *far_host[UR__FAR_MAPS];
  struct ur__far_job {
    char *base;               /* far_host[k]'s: the counts, the list, the rows */
    int64_t cap, list, rows;  /* copies; the list's and the rows' offsets in base */
    int32_t row_bytes, home;  /* 1: written home (homes), 0: gathered (loads) */
    int64_t seen;             /* the copies its last call found made (-1: none yet) */
    struct ur__far_done *done; /* far_dma_done[home] */
  } far_jobs[UR__FAR_MAPS][2];
  struct ur__far_done {
    int64_t rows, calls, ns;  /* added to by the host calls */
  } far_dma_done[2];
  ur__tbe_hook *hooks;
  int32_t nhooks, cap_hooks;
};

/* A 1-D tensor of n elements at the collection's home. */
UR__HIDDEN ur_status ur__tbe_home_tensor(const ur_tbe *t, ur_tensor **out, ur_dtype dtype,
                                         int64_t n);

/* Table i's own storage (its rows and state), whatever its kernels use now; place is where that
 * storage lives. */
UR__HIDDEN ur_status ur__tbe_backing(const ur_tbe *t, int32_t i, ur__tbe_table *out,
                                     int32_t *place);
/* Points table i's kernels at other rows (weights, state, the row id each holds, rows) lent by
 * owner, and re-keys the collection; owner NULL points it back at its own storage. */
UR__HIDDEN ur_status ur__tbe_redirect(ur_tbe *t, int32_t i, const void *owner, void *weights,
                                      float *state1, float *state2, const int64_t *row_ids,
                                      int64_t rows);

/* Table i points at its own storage again after a cache that held its rows lost them (freed
 * after a failed flush, or a growth that lost its slots; why says how): its rows are marked
 * lost.  The host's descriptors change even where the GPU cannot be reached (init_table uploads
 * them again): the collection refuses a lost table's rows and state, and every forward and
 * backward, until init_table writes them (ur__tbe_check_lost). */
UR__HIDDEN void ur__tbe_rows_lost(ur_tbe *t, int32_t i, const char *why);
/* UR_STATUS_INVALID for `who` naming table i's lost rows (i -1: the first lost table's), or OK. */
UR__HIDDEN ur_status ur__tbe_check_lost(const ur_tbe *t, int32_t i, const char *who);

/* A table's permutation changed (set, relaid out or removed): host mirrors of it are stale. */
UR__HIDDEN ur_status ur__tbe_perm_changed(ur_tbe *t, int32_t i);
/* Waits for the device, then copies the descriptors there (nothing when they live on the host). */
UR__HIDDEN ur_status ur__tbe_sync_desc(ur_tbe *t);

/* Far rows (table.c): table i's first far physical row, from where its rows live now;
 * far_settle waits on the host for the copies written home behind the last step (write-behind:
 * every call that reads rows through a view, or writes them, first); far_drop settles and
 * forgets the copies of far rows, early ones too (every call that writes rows but the
 * backward, which writes the copies too).  The copies (far.c): far_forward points a forward at
 * them when it should make some (the early copies, when there are some), far_forward_done marks
 * its end on its stream; far_backward points the backward at them when the last forward made
 * them, and far_backward_done says whether the step kept them current (a step by atomics does
 * not) and, written behind, sends them home.  table.c frees the rooms, stream and events with
 * the collection. */
UR__HIDDEN int64_t ur__tbe_far_from(const ur_tbe *t, int32_t i);
UR__HIDDEN ur_status ur__tbe_far_settle(const ur_tbe *t);
UR__HIDDEN ur_status ur__tbe_far_drop(ur_tbe *t);
UR__HIDDEN ur_status ur__tbe_far_forward(ur_tbe *t, ur_stream *s, ur__tbe_args *a);
UR__HIDDEN ur_status ur__tbe_far_forward_done(ur_tbe *t, ur_stream *s, const ur_tensor *values);
UR__HIDDEN ur_status ur__tbe_far_backward(ur_tbe *t, ur_stream *s, ur__tbe_args *a,
                                          const ur_tensor *values);
UR__HIDDEN ur_status ur__tbe_far_backward_done(ur_tbe *t, ur_stream *s, const ur__tbe_args *a,
                                               int32_t stepped);
/* ur_tbe_far_prefetch's half here: whether early copies are refused now (a graph capture), and
 * the early copies of a's batch (its arguments where the GPU reads them) made on s. */
UR__HIDDEN ur_status ur__tbe_far_refuse_early(const ur_tbe *t);
UR__HIDDEN ur_status ur__tbe_far_prefetch(ur_tbe *t, ur_stream *s, ur__tbe_args *a);

/* fn(ctx) runs when t is freed; unhook removes it (the owner went first). */
UR__HIDDEN ur_status ur__tbe_hook_add(ur_tbe *t, ur__tbe_hook_fn fn, void *ctx);
UR__HIDDEN void ur__tbe_hook_remove(ur_tbe *t, ur__tbe_hook_fn fn, void *ctx);

#endif
