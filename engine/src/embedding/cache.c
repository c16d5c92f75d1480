/* cache.c: the software HBM cache of `cached` embedding tables: its construction over a
 * collection's tables, the bookkeeping of batches in flight (tickets, locks, staging, retire),
 * flush, invalidate and statistics.  The decisions of a batch (lookup, victims, staging) and
 * the moves of rows are the cache's backend's (c->be->cache: cache_cpu.c, the reference, or
 * kernels/cache.cu, a warp per set), over the cache's state where that backend runs; the host
 * reads what each call tells it (info) and drives one path for both, ordered on streams with
 * events where the backend has them.
 *
 * One batch: its cached ids become keys (a cumulative row space over the cache's tables),
 * sorted and deduplicated; each distinct key is hashed to a set; each set takes its hits first
 * (they lock their ways), then its misses, which take an empty way, else the policy's victim
 * among the ways no batch in flight holds, else a staging row (a conflict miss).  Dirty victims
 * are written back before the fills land.  Staging rows come in two halves used by alternate
 * batches, so a batch in flight keeps its staged rows while the next one is prepared. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "embedding/cache.h"
#include "embedding/table.h"

#define RING UR__CACHE_RING
#define EMPTY ((uint64_t)-1)
/* c->lost's reasons: staging could not grow, or storage of its old size be had again; a batch
 * failed once its placement was decided (the tags moved) */
#define LOST_GROWN "a growth of its staging failed"
#define LOST_PLACED "a batch failed once its placement was decided"
#define MAX_STAGING_ROWS ((int64_t)1 << 40) /* slots + 2 x this rows neither overflow nor fit */

typedef struct flight {
  int64_t ticket;               /* 0: the entry is free */
  int retired, trained;
  ur_stream *stream;            /* where it was retired */
  void *event;                  /* recorded at retire (backends with events) */
  int64_t nslots, nstaged;      /* distinct slots it uses; rows it stages */
  int64_t list_at;              /* where its staged (pair, staging row)s sit in dev */
  int64_t slots_at;             /* where its slot list sits in dev */
  int64_t *tconf;               /* [tables] its conflict misses per table */
  void *span[8];                /* events around its lookup, decisions, placement (span[5]:
                                 * after its prepare's moves), retire */
  int timed_p, timed_r;         /* spans recorded and not yet added to gpu_seconds */
  ur_tensor *dev;               /* its move lists and slot list, where the backend runs */
} flight;

typedef struct counters {
  int64_t batches, lookups, unique, hits, misses, conflicts, evictions, writebacks, waits;
  int64_t staging_grows, staging_grows_via_host; /* the total's only: the cache's */
  uint64_t bytes_in, bytes_out, bytes_ids;
} counters;

struct ur_cache {
  ur_tbe *tbe;
  /* Where the cache's state and slot storage live (the collection's home: device memory of
   * its GPU, or host memory); its backend is the one of that memory, taken once here. */
  ur_place home;
  const ur_backend *be;
  int32_t device;
  int32_t bound;                /* tables pointed at the slots so far */
  ur_cache_config cfg;
  int32_t nt, T, F;
  int32_t *tidx, *ct_of;        /* cache table -> collection table; collection -> cache or -1 */
  int64_t *rows, *kbase;        /* per cache table */
  int64_t *set_base, *set_count; /* per cache table: its sets (all of them when shared) */
  uint64_t total_keys;
  int32_t key_bits;
  ur__tbe_table *back;          /* per cache table: its own storage */
  int32_t dim, dtype, nstate, state_per_row, bounds;
  size_t row_bytes;
  int64_t S, nsets, M, R;       /* slots, sets, staging rows per half, slot storage rows */
  ur_tensor *sw, *ss1, *ss2;    /* slot storage */
  ur_tensor *srow;              /* [slot storage rows] the row id each holds (rounding draws) */
  ur_tensor *ptrs;              /* the host pointer arrays of the io */
  ur__cache_io io;              /* as the backend reads it */
  flight ring[RING];
  int64_t next_ticket;
  int64_t rebased;              /* LFU: the decay period (ticket / decay_batches, whole) of the
                                 * counts' last re-base (cache_sets.h) */
  int filled;                   /* a row has been moved into a slot (growth keeps the slots) */
  const char *lost;             /* why the slots no longer hold what the tags say, or NULL */
  void *last_ready;             /* the last prepare's event, after its copies (or NULL) */
  counters *stats;              /* [nt + 1]: per table, then the total */
  double seconds, gpu_seconds, gpu_phase[4]; /* gpu_phase: ur_cache_stats.gpu_phase_seconds */
  /* The state and geometry where the backend runs, and the decisions' scratch and info. */
  ur__cache_dev dev;
  ur_tensor *dmeta, *dtag, *dstamp, *ddirty, *dfreq;
  ur_tensor *scratch, *info_dev, *info_host;
  size_t scratch_bytes;
  /* The host's view of the tags and dirty marks (flush, contains): the state itself when it
   * is in host memory, else a copy refreshed by pull_state. */
  uint64_t *tag;
  uint8_t *dirty;
  int64_t *hvals, *hoffs;       /* host copies of device ids, for error messages */
  int64_t cap_hv, cap_ho;
};

static ur_status settle(ur_cache *c, ur_stream *s, const flight *B, int64_t tk, int64_t U,
                        const int *meet, int64_t *floor);

size_t ur_sizeof_cache_config(void) { return sizeof(ur_cache_config); }
size_t ur_sizeof_cache_stats(void) { return sizeof(ur_cache_stats); }

/* The set, table and (table, row) pair of a key (cache_sets.h, shared with the backends). */
static int64_t set_of(const ur_cache *c, uint64_t key, int32_t ct) {
  return ur__cache_set_of(c->kbase, c->set_base, c->set_count, key, ct);
}

static int32_t table_of_key(const ur_cache *c, uint64_t key) {
  return ur__cache_table_of(c->kbase, c->nt, key);
}

static uint64_t pair_of(const ur_cache *c, uint64_t key) {
  return ur__cache_pair_of(c->kbase, c->nt, key);
}

static ur_status grow(void **p, int64_t *cap, int64_t need, size_t elem) {
  if (need <= *cap) return UR_STATUS_OK;
  int64_t n = need + need / 2 + 64;
  void *q = realloc(*p, (size_t)n * elem);
  if (!q) return ur__error(UR_STATUS_OOM, "cache: out of host memory (%lld entries)", (long long)n);
  *p = q;
  *cap = n;
  return UR_STATUS_OK;
}

/* A tensor where the backend runs (at least one element). */
static ur_status home_tensor(ur_cache *c, ur_tensor **out, ur_dtype d, int64_t rows, int64_t cols) {
  int64_t shape[2] = {rows > 0 ? rows : 1, cols};
  return ur_tensor_new(out, d, cols ? 2 : 1, shape, c->home,
                       c->home == UR_PLACE_DEVICE ? c->device : UR_LOC_CPU);
}

/* ---- slot storage ---- */

/* Slot storage: rows, optimizer state (s1, s2: NULL without) and the row id each holds. */
typedef struct slot_store {
  ur_tensor *w, *s1, *s2, *ids;
} slot_store;

/* The cache's slot storage now. */
static slot_store slots_of(const ur_cache *c) {
  slot_store n = {c->sw, c->ss1, c->ss2, c->srow};
  return n;
}

static void slots_free(slot_store *n) {
  ur_tensor_free(n->w);
  ur_tensor_free(n->s1);
  ur_tensor_free(n->s2);
  ur_tensor_free(n->ids);
  memset(n, 0, sizeof *n);
}

/* The bytes a slot takes in each part of the storage (rows, s1, s2, ids). */
static void part_bytes(const ur_cache *c, size_t per[4]) {
  size_t sb = (size_t)c->state_per_row * 4;
  per[0] = c->row_bytes;
  per[1] = c->nstate > 0 ? sb : 0;
  per[2] = c->nstate > 1 ? sb : 0;
  per[3] = 8;
}

/* Slot storage in bytes of R rows. */
static uint64_t slots_bytes(const ur_cache *c, int64_t R) {
  size_t per[4];
  part_bytes(c, per);
  return (uint64_t)R * (per[0] + per[1] + per[2] + per[3]);
}

/* Zeroed slot storage of R rows where the backend runs. */
static ur_status slots_new(ur_cache *c, int64_t R, slot_store *n) {
  memset(n, 0, sizeof *n);
  ur_status st = home_tensor(c, &n->w, (ur_dtype)c->dtype, R, c->dim);
  if (!st) st = home_tensor(c, &n->ids, UR_DTYPE_I64, R, 1);
  if (!st) st = ur_tensor_fill(NULL, n->ids, 0);
  if (!st && c->nstate > 0) st = home_tensor(c, &n->s1, UR_DTYPE_F32, R, c->state_per_row);
  if (!st && c->nstate > 1) st = home_tensor(c, &n->s2, UR_DTYPE_F32, R, c->state_per_row);
  if (!st && n->s1) st = ur_tensor_fill(NULL, n->s1, 0);
  if (!st && n->s2) st = ur_tensor_fill(NULL, n->s2, 0);
  if (st) slots_free(n);
  return st;
}

static void slots_parts(const slot_store *n, void *p[4]) {
  p[0] = ur_tensor_data(n->w);
  p[1] = n->s1 ? ur_tensor_data(n->s1) : NULL;
  p[2] = n->s2 ? ur_tensor_data(n->s2) : NULL;
  p[3] = ur_tensor_data(n->ids);
}

/* Copies the first rows slots of each part from src to dst, and waits for the copies. */
static ur_status copy_parts(const ur_cache *c, void *const dst[4], void *const src[4],
                            int64_t rows) {
  size_t per[4];
  part_bytes(c, per);
  ur_status st = UR_STATUS_OK;
  for (int k = 0; k < 4 && !st && rows > 0; k++)
    if (per[k]) st = c->be->copy(NULL, dst[k], src[k], (size_t)rows * per[k]);
  if (!st && rows > 0) st = c->be->stream_sync(NULL);
  return st;
}

/* Makes n the cache's slot storage of R rows (the old one is freed) and points the tables at
 * it. */
static ur_status slots_install(ur_cache *c, slot_store *n, int64_t R) {
  slot_store old = slots_of(c);
  slots_free(&old);
  c->sw = n->w;
  c->ss1 = n->s1;
  c->ss2 = n->s2;
  c->srow = n->ids;
  memset(n, 0, sizeof *n);
  c->R = R;
  c->io.slot_w = ur_tensor_data(c->sw);
  c->io.slot_s1 = c->ss1 ? ur_tensor_data(c->ss1) : NULL;
  c->io.slot_s2 = c->ss2 ? ur_tensor_data(c->ss2) : NULL;
  ur_status st = UR_STATUS_OK;
  for (int32_t i = 0; i < c->nt && !st; i++) {
    st = ur__tbe_redirect(c->tbe, c->tidx[i], c, c->io.slot_w, c->io.slot_s1, c->io.slot_s2,
                          ur_tensor_data(c->srow), R);
    if (!st && c->bound <= i) c->bound = i + 1;
  }
  return st;
}

/* Slot storage of R rows; the first keep rows of the old storage are kept.  The new storage
 * is allocated beside the old, and the kept rows copied over (the fast way). */
static ur_status alloc_slots(ur_cache *c, int64_t R, int64_t keep) {
  slot_store n, old = slots_of(c);
  ur_status st = slots_new(c, R, &n);
  if (!st && keep > 0 && c->sw) {
    void *dst[4], *src[4];
    slots_parts(&n, dst);
    slots_parts(&old, src);
    st = copy_parts(c, dst, src, keep);
  }
  if (st) {
    slots_free(&n);
    return st;
  }
  return slots_install(c, &n, R);
}

/* ---- moving rows ---- */

/* Bytes one row moves, with its optimizer state. */
static uint64_t row_moves(const ur_cache *c) {
  return (uint64_t)c->row_bytes + (uint64_t)c->nstate * (uint64_t)c->state_per_row * 4;
}

/* Write-backs (out), then fills (in): pairs where the backend runs.  with_scratch: the
 * decisions' scratch is free for the backend to stage rows in (a prepare's moves, after its
 * placement and before the next prepare, which waits for them). */
static ur_status move(ur_cache *c, void *stream, const int64_t *out, int64_t n_out,
                      const int64_t *in, int64_t n_in, int with_scratch) {
  if (n_out == 0 && n_in == 0) return UR_STATUS_OK;
  void *scratch = with_scratch && c->scratch ? ur_tensor_data(c->scratch) : NULL;
  return c->be->cache->move(stream, &c->io, out, n_out, in, n_in, scratch,
                            scratch ? c->scratch_bytes : 0);
}

/* ---- construction ---- */

static ur_status check_config(const ur_cache_config *cfg) {
  if (cfg->slots < 1 && !cfg->table_slots)
    return ur__error(UR_STATUS_INVALID, "cache: %lld slots; expected 1 or more",
                     (long long)cfg->slots);
  if ((unsigned)cfg->policy >= UR_CACHE_POLICY_COUNT)
    return ur__error(UR_STATUS_INVALID, "cache: policy %d is not lru (0) or lfu (1)",
                     (int)cfg->policy);
  if (cfg->decay_batches < 0)
    return ur__error(UR_STATUS_INVALID, "cache: decay_batches %d; expected >= 0 (0: no decay)",
                     (int)cfg->decay_batches);
  if (cfg->staging_rows < 0 || cfg->staging_rows > MAX_STAGING_ROWS)
    return ur__error(UR_STATUS_INVALID, "cache: staging_rows %lld; expected 0 .. %lld (2^40)",
                     (long long)cfg->staging_rows, (long long)MAX_STAGING_ROWS);
  if (cfg->mover_warps < 0)
    return ur__error(UR_STATUS_INVALID, "cache: mover_warps %d; expected >= 0 (0: a warp a row)",
                     (int)cfg->mover_warps);
  return UR_STATUS_OK;
}

/* Every entry the cache calls, so that a backend without one fails here, not mid-batch. */
static ur_status check_backend(const ur_backend *b) {
  ur_status st;
  if ((st = UR__NEED(b, cache, move)) || (st = UR__NEED(b, cache, scratch)) ||
      (st = UR__NEED(b, cache, lookup)) || (st = UR__NEED(b, cache, decide)) ||
      (st = UR__NEED(b, cache, place)) || (st = UR__NEED(b, cache, mark)))
    return st;
  return UR_STATUS_OK;
}

static size_t info_words(const ur_cache *c) {
  return (size_t)UR__CI_TABLES + (size_t)c->nt * UR__CT_COUNT;
}

/* A capped mover's warps (cache_config.mover_warps) move a launch's rows while they have at most
 * this many each; a larger launch gets a warp a row, every SM.  The capped mover's 8 SMs move
 * about 4 GB/s each of zero-copy rows (H200: B4's 100 k rows of 512 bytes in about 1.5 ms, beside
 * the step's kernels); moves much larger outlast the step they would hide behind, and only
 * every SM keeps the link busy (DCNv2 cached in 16 GiB, 2.3 M rows a step: 47 ms on 256 warps,
 * 42 on a warp per 512 rows, 27 on a warp a row, at the link's ceiling). */
#define MOVER_ROWS 512

/* The rows of collection table ti, the bound of its ids: a cached table's backing rows, or
 * the table's own. */
static int64_t rows_of(const ur_cache *c, int32_t ti) {
  int32_t ct = c->ct_of[ti];
  return ct >= 0 ? c->rows[ct] : c->tbe->tc[ti].rows;
}

/* The state (empty), the geometry and the info words where the backend runs, and the host's
 * view of the tags and dirty marks. */
static ur_status state_new(ur_cache *c) {
  const ur_backend *b = c->be;
  int64_t at_rows = 3 * (int64_t)c->nt + 1 + (c->F + 1) / 2 + 1, nmeta = at_rows + c->F;
  int64_t *meta = calloc((size_t)nmeta, sizeof *meta);
  if (!meta) return ur__error(UR_STATUS_OOM, "cache: out of host memory");
  for (int32_t i = 0; i < c->nt; i++) {
    meta[i] = c->kbase[i];
    meta[c->nt + 1 + i] = c->set_base[i];
    meta[2 * c->nt + 1 + i] = c->set_count[i];
  }
  meta[c->nt] = (int64_t)c->total_keys;
  int32_t *fct = (int32_t *)(meta + 3 * c->nt + 1), partial = 0;
  for (int32_t f = 0; f < c->F; f++) {
    int32_t ti = c->tbe->names.features[f].table;
    fct[f] = c->ct_of[ti];
    partial |= fct[f] < 0;
    meta[at_rows + f] = rows_of(c, ti);
  }
  /* info where the decisions run, and where the host reads it (with room for bag_start after
   * it): pinned memory for the GPU, the same host memory for the CPU */
  int64_t words = (int64_t)info_words(c) + c->F + 1;
  ur_status st = home_tensor(c, &c->dmeta, UR_DTYPE_I64, nmeta, 0);
  if (!st) st = home_tensor(c, &c->dtag, UR_DTYPE_I64, c->S, 0);
  if (!st) st = home_tensor(c, &c->dstamp, UR_DTYPE_I64, c->S, 0);
  if (!st) st = home_tensor(c, &c->ddirty, UR_DTYPE_U8, c->S, 0);
  if (!st && c->cfg.policy == UR_CACHE_LFU)
    st = home_tensor(c, &c->dfreq, UR_DTYPE_I32, (int64_t)c->total_keys, 0);
  if (!st && c->home == UR_PLACE_DEVICE)
    st = home_tensor(c, &c->info_dev, UR_DTYPE_I64, (int64_t)info_words(c), 0);
  if (!st)
    st = ur_tensor_new(&c->info_host, UR_DTYPE_I64, 1, &words,
                       c->home == UR_PLACE_DEVICE ? UR_PLACE_PINNED : UR_PLACE_HOST, UR_LOC_CPU);
  if (!st) st = b->copy(NULL, ur_tensor_data(c->dmeta), meta, (size_t)nmeta * 8);
  if (!st) st = b->fill(NULL, ur_tensor_data(c->dtag), (size_t)c->S, 8, (uint64_t)EMPTY);
  if (!st) st = b->fill(NULL, ur_tensor_data(c->dstamp), (size_t)c->S, 8, 0);
  if (!st) st = b->fill(NULL, ur_tensor_data(c->ddirty), (size_t)c->S, 1, 0);
  if (!st && c->dfreq) st = b->fill(NULL, ur_tensor_data(c->dfreq), (size_t)c->total_keys, 4, 0);
  if (!st) st = b->stream_sync(NULL);
  free(meta);
  if (st) return st;
  int64_t *dm = ur_tensor_data(c->dmeta);
  ur__cache_dev *d = &c->dev;
  d->kbase = dm;
  d->set_base = dm + c->nt + 1;
  d->set_count = dm + 2 * c->nt + 1;
  d->feat_ct = (const int32_t *)(dm + 3 * c->nt + 1);
  d->feat_rows = dm + at_rows;
  d->tag = ur_tensor_data(c->dtag);
  d->stamp = ur_tensor_data(c->dstamp);
  d->dirty = ur_tensor_data(c->ddirty);
  d->freq = c->dfreq ? ur_tensor_data(c->dfreq) : NULL;
  d->nt = c->nt;
  d->F = c->F;
  d->partial = partial;
  d->key_bits = c->key_bits;
  d->S = c->S;
  d->nsets = c->nsets;
  d->keys = (int64_t)c->total_keys;
  d->set_bits = ur__key_bits((uint64_t)c->nsets);
  if (ur_tensor_place(c->dtag) == UR_PLACE_HOST) {
    c->tag = d->tag;
    c->dirty = d->dirty;
    return UR_STATUS_OK;
  }
  c->tag = malloc(sizeof *c->tag * (size_t)c->S);
  c->dirty = calloc((size_t)c->S, 1);
  if (!c->tag || !c->dirty)
    return ur__error(UR_STATUS_OOM, "cache: out of host memory for %lld slots", (long long)c->S);
  for (int64_t i = 0; i < c->S; i++) c->tag[i] = EMPTY;
  return UR_STATUS_OK;
}

/* The collection's hook: it is being freed, and the cache must not touch it any more. */
static void orphan(void *ctx) {
  ur_cache *c = ctx;
  c->tbe = NULL;
}

ur_status ur_cache_new(ur_cache **out, ur_tbe *t, int32_t num_tables, const int32_t *tables,
                       const ur_cache_config *config) {
  UR__ARGS(out, t, config);
  if (num_tables > 0 && !tables) return ur__null(__func__, "tables");
  *out = NULL;
  ur_status st = check_config(config);
  if (st) return st;
  int32_t T = t->names.T;
  if (num_tables < 1 || num_tables > T)
    return ur__error(UR_STATUS_INVALID, "cache: %d tables; expected 1..%d (the collection's)",
                     (int)num_tables, (int)T);
  if (num_tables >= (1 << 15))
    return ur__error(UR_STATUS_INVALID, "cache: %d tables; one cache takes fewer than 32768",
                     (int)num_tables);
  /* one cache a collection: its prepare's ids are the collection's whole input (slot ids for
   * its tables, the ids themselves for the others, all checked under bounds fatal) */
  for (int32_t i = 0; i < T; i++)
    if (t->owner[i])
      return ur__error(UR_STATUS_INVALID, "cache: table '%s' of the collection is cached already; a "
                                          "collection takes one cache (free it first)",
                       t->tc[i].name);
  const ur_backend *be = ur__backend_for(t->home);
  if ((st = check_backend(be))) return st;
  ur_cache *c = calloc(1, sizeof *c);
  if (!c) return ur__error(UR_STATUS_OOM, "cache: out of host memory");
  c->tbe = t;
  c->home = t->home;
  c->be = be;
  c->cfg = *config;
  c->nt = num_tables;
  c->T = T;
  c->F = t->names.F;
  const ur_tbe_config *tc = &t->cfg;
  c->device = tc->device;
  c->bounds = tc->bounds;
  c->nstate = t->nstate;
  c->tidx = calloc((size_t)num_tables, sizeof *c->tidx);
  c->ct_of = malloc(sizeof *c->ct_of * (size_t)T);
  c->rows = calloc((size_t)num_tables, sizeof *c->rows);
  c->kbase = calloc((size_t)num_tables, sizeof *c->kbase);
  c->back = calloc((size_t)num_tables, sizeof *c->back);
  c->set_base = calloc((size_t)num_tables, sizeof *c->set_base);
  c->set_count = calloc((size_t)num_tables, sizeof *c->set_count);
  c->stats = calloc((size_t)num_tables + 1, sizeof *c->stats);
  if (!c->tidx || !c->ct_of || !c->rows || !c->kbase || !c->back || !c->stats || !c->set_base || !c->set_count) {
    c->tbe = NULL;
    ur_cache_free(c);
    return ur__error(UR_STATUS_OOM, "cache: out of host memory");
  }
  for (int32_t i = 0; i < T; i++) c->ct_of[i] = -1;
  uint64_t key = 0;
  for (int32_t i = 0; i < num_tables && !st; i++) {
    int32_t ti = tables[i], place = 0;
    if (ti < 0 || ti >= T) {
      st = ur__error(UR_STATUS_INVALID, "cache: table %d does not exist; expected 0..%d",
                     (int)ti, (int)T - 1);
      break;
    }
    const char *name = t->tc[ti].name;
    if (c->ct_of[ti] >= 0) {
      st = ur__error(UR_STATUS_INVALID, "cache: table '%s' is listed twice", name);
      break;
    }
    if ((st = ur__tbe_backing(t, ti, &c->back[i], &place))) break;
    if (place == UR_PLACE_DEVICE) {
      st = ur__error(UR_STATUS_INVALID,
                     "cache: table '%s' is in device memory; a cached table keeps its rows in "
                     "host, pinned or managed memory",
                     name);
      break;
    }
    if (i > 0 && (c->back[i].dim != c->dim || c->back[i].dtype != c->dtype)) {
      st = ur__error(UR_STATUS_INVALID,
                     "cache: table '%s' has dim %d and dtype %s but '%s' has dim %d and dtype %s; "
                     "tables sharing a cache have one dim and dtype",
                     name, (int)c->back[i].dim, ur_dtype_name((ur_dtype)c->back[i].dtype),
                     t->tc[tables[0]].name, (int)c->dim, ur_dtype_name((ur_dtype)c->dtype));
      break;
    }
    c->dim = c->back[i].dim;
    c->dtype = c->back[i].dtype;
    c->tidx[i] = ti;
    c->ct_of[ti] = i;
    c->rows[i] = c->back[i].rows;
    c->kbase[i] = (int64_t)key;
    key += (uint64_t)c->rows[i];
  }
  if (st) {
    c->tbe = NULL;
    ur_cache_free(c);
    return st;
  }
  c->total_keys = key;
  c->key_bits = ur__key_bits(key);
  c->row_bytes = (size_t)c->dim * ur_dtype_size((ur_dtype)c->dtype);
  c->state_per_row = c->nstate == 0 ? 0 : tc->optim.kind == UR_OPTIM_KIND_ROWWISE_ADAGRAD ? 1 : c->dim;
  c->nsets = 0;
  c->cfg.table_slots = NULL; /* the caller's array: not kept */
  for (int32_t i = 0; i < num_tables; i++) {
    int64_t want = config->table_slots ? config->table_slots[i] : config->slots;
    if (want < 1) {
      c->tbe = NULL;
      ur_cache_free(c);
      return ur__error(UR_STATUS_INVALID, "cache: table '%s' is given %lld slots; expected 1 or more",
                       t->tc[tables[i]].name, (long long)want);
    }
    c->set_count[i] = (want + UR_CACHE_WAYS - 1) / UR_CACHE_WAYS;
    c->set_base[i] = config->table_slots ? c->nsets : 0;
    if (config->table_slots || i == 0) c->nsets += c->set_count[i];
  }
  c->S = c->nsets * UR_CACHE_WAYS;
  c->M = config->staging_rows > 0 ? config->staging_rows : 256;
  c->next_ticket = 1;
  if ((st = state_new(c)) || (st = ur__tbe_hook_add(t, orphan, c))) {
    c->tbe = NULL;
    ur_cache_free(c);
    return st;
  }
  c->io.row_bytes = (int64_t)c->row_bytes;
  c->io.state_per_row = c->state_per_row;
  c->io.nstate = c->nstate;
  c->io.mover_warps = config->mover_warps;
  c->io.mover_rows = MOVER_ROWS;
  /* the host pointers, as arrays the backend reads */
  int64_t np = 3 * (int64_t)num_tables;
  void **hp = malloc(sizeof(void *) * (size_t)np);
  if (!hp) st = ur__error(UR_STATUS_OOM, "cache: out of host memory");
  for (int32_t i = 0; i < num_tables && !st; i++) {
    hp[i] = c->back[i].weights;
    hp[num_tables + i] = c->back[i].state1;
    hp[2 * num_tables + i] = c->back[i].state2;
  }
  if (!st) {
    int64_t bytes = np * (int64_t)sizeof(void *);
    st = home_tensor(c, &c->ptrs, UR_DTYPE_U8, bytes, 0);
    if (!st) st = c->be->copy(NULL, ur_tensor_data(c->ptrs), hp, (size_t)bytes);
    if (!st) st = c->be->stream_sync(NULL);
  }
  free(hp);
  if (!st) {
    void **p = ur_tensor_data(c->ptrs);
    c->io.host_w = p;
    c->io.host_s1 = (float *const *)(p + num_tables);
    c->io.host_s2 = (float *const *)(p + 2 * num_tables);
    st = alloc_slots(c, c->S + 2 * c->M, 0);
  }
  if (st) {
    ur_cache_free(c);
    return st;
  }
  *out = c;
  return UR_STATUS_OK;
}

static void free_batch(const ur_cache *c, flight *b) {
  for (int k = 0; k < 8; k++)
    if (b->span[k]) c->be->event_free(b->span[k]);
  if (b->event) c->be->event_free(b->event);
  free(b->tconf);
  ur_tensor_free(b->dev);
  memset(b, 0, sizeof *b);
}

/* The cached tables back on their own storage, their rows marked lost (why): the slots that
 * held their dirty rows are gone, or about to be. */
static void tables_lost(ur_cache *c, const char *why) {
  for (int32_t i = 0; i < c->bound; i++) ur__tbe_rows_lost(c->tbe, c->tidx[i], why);
  c->bound = 0;
}

void ur_cache_free(ur_cache *c) {
  if (!c) return;
  /* the free returns nothing and fails at nothing: it leaves ur_last_error() as the caller had
   * it, whatever its flush, syncs and frees said on the way */
  char kept[1024];
  snprintf(kept, sizeof kept, "%s", ur_last_error());
  if (c->tbe && c->sw) {
    /* the rows go home, and the collection reads its own storage again; where they cannot
     * (a lost cache, no memory for the list, a GPU fault), the tables still leave the slots
     * about to be freed, their rows marked lost: the collection refuses them, never reads
     * stale rows or freed slots.  Each table keeps why (the flush's message stayed in
     * ur_last_error(), "cache: out of host memory" after a free that had done all it does). */
    char why[400];
    if (ur_cache_flush(c)) {
      /* a lost cache's own message says to make it again, which a lost table refuses */
      snprintf(why, sizeof why, "the cache was freed and could not write its dirty rows home: %s",
               c->lost ? c->lost : ur_last_error());
      tables_lost(c, why);
    }
    /* a table that cannot be pointed home (the GPU) must not keep the slots freed below */
    for (int32_t i = 0; i < c->bound; i++)
      if (ur__tbe_redirect(c->tbe, c->tidx[i], NULL, NULL, NULL, NULL, NULL, 0)) {
        snprintf(why, sizeof why, "the cache was freed and the table could not be pointed at its "
                 "own storage: %s", ur_last_error());
        ur__tbe_rows_lost(c->tbe, c->tidx[i], why);
      }
  } else if (c->be) {
    c->be->device_sync();
  }
  if (c->tbe) ur__tbe_hook_remove(c->tbe, orphan, c);
  for (int r = 0; r < RING; r++) free_batch(c, &c->ring[r]);
  if (c->tag != c->dev.tag) free(c->tag);
  if (c->dirty != c->dev.dirty) free(c->dirty);
  ur_tensor_free(c->sw);
  ur_tensor_free(c->ss1);
  ur_tensor_free(c->ss2);
  ur_tensor_free(c->srow);
  ur_tensor_free(c->ptrs);
  ur_tensor_free(c->dmeta);
  ur_tensor_free(c->dtag);
  ur_tensor_free(c->dstamp);
  ur_tensor_free(c->ddirty);
  ur_tensor_free(c->dfreq);
  ur_tensor_free(c->scratch);
  ur_tensor_free(c->info_dev);
  ur_tensor_free(c->info_host);
  free(c->tidx);
  free(c->ct_of);
  free(c->rows);
  free(c->kbase);
  free(c->back);
  free(c->set_base);
  free(c->set_count);
  free(c->stats);
  free(c->hvals);
  free(c->hoffs);
  free(c);
  ur__error(UR_STATUS_OK, "%s", kept);
}

int64_t ur_cache_slots(const ur_cache *c) {
  UR__ARGS_OR(-1, c);
  return c->S;
}
int64_t ur_cache_staging_rows(const ur_cache *c) {
  UR__ARGS_OR(-1, c);
  return c->M;
}
int32_t ur_cache_num_tables(const ur_cache *c) {
  UR__ARGS_OR(-1, c);
  return c->nt;
}
int32_t ur_cache_table(const ur_cache *c, int32_t i) {
  UR__ARGS_OR(-1, c);
  return i >= 0 && i < c->nt ? c->tidx[i] : -1;
}
uint64_t ur_cache_bytes(const ur_cache *c) {
  UR__ARGS_OR(0, c);
  return (uint64_t)c->R * row_moves(c);
}
int32_t ur_cache_in_flight(const ur_cache *c) {
  UR__ARGS_OR(-1, c);
  int32_t n = 0;
  for (int r = 0; r < RING; r++) n += c->ring[r].ticket && !c->ring[r].retired;
  return n;
}

static ur_status check_alive(const ur_cache *c) {
  if (!c->tbe)
    return ur__error(UR_STATUS_INVALID, "cache: its embedding collection was freed");
  if (c->lost)
    return ur__error(UR_STATUS_INVALID, "cache: %s, and its rows in HBM are no longer where its "
                     "tags say; free it (cache:free()), then init_table each table it held and "
                     "load a checkpoint", c->lost);
  return UR_STATUS_OK;
}

/* LFU counts are halved once per decay period, lazily when a row is next read (cache_sets.h):
 * the period of a batch. */
static int64_t decay_period(const ur_cache *c, int64_t ticket) {
  return c->cfg.decay_batches > 0 ? ticket / c->cfg.decay_batches : 0;
}

static uint32_t freq_epoch(const ur_cache *c, int64_t ticket) {
  return (uint32_t)decay_period(c, ticket) & 0xffffu;
}

/* ---- events: a backend without them (the CPU's) works synchronously, so nothing is recorded,
 * waited for or timed ---- */

/* Records span event k of batch b on the stream. */
static ur_status span_mark(ur_cache *c, flight *b, int k, void *stream) {
  const ur_backend *g = c->be;
  if (!g->event_record) return UR_STATUS_OK;
  ur_status st = b->span[k] ? UR_STATUS_OK : g->event_new(&b->span[k]);
  return st ? st : g->event_record(b->span[k], stream);
}

/* Adds batch b's recorded spans to gpu_seconds and their phases (waiting for them to finish):
 * span pair k / 2 is phase k / 2 (lookup, decisions, placement and moves, retire). */
static void account_gpu(ur_cache *c, flight *b) {
  const ur_backend *g = c->be;
  double ms = 0;
  for (int part = 0; part < 2; part++) {
    int *timed = part ? &b->timed_r : &b->timed_p;
    if (!*timed) continue;
    *timed = 0;
    int k0 = part ? 6 : 0, k1 = part ? 8 : 6;
    if (!b->span[k1 - 1] || g->event_sync(b->span[k1 - 1])) continue;
    for (int k = k0; k < k1; k += 2)
      if (!g->event_elapsed(b->span[k], b->span[k + 1], &ms)) {
        c->gpu_seconds += 1e-3 * ms;
        c->gpu_phase[k / 2] += 1e-3 * ms;
      }
  }
}

/* The stream s waits for batch b's retire (its backward and staged write-backs). */
static ur_status wait_retired(ur_cache *c, ur_stream *s, flight *b) {
  if (!b->event) return UR_STATUS_OK;
  if (!c->be->stream_wait)
    return ur__error(UR_STATUS_UNSUPPORTED, "cache: the %s backend has no stream waits",
                     c->be->name);
  return c->be->stream_wait(s ? s->handle : NULL, b->event);
}

/* ---- one batch ---- */

static flight *ring_find(ur_cache *c, int64_t ticket) {
  for (int r = 0; r < RING; r++)
    if (c->ring[r].ticket == ticket) return &c->ring[r];
  return NULL;
}

/* Host pointers to ids: their memory when the host reads it in place (after the device's
 * work on managed memory), else copies. */
static ur_status host_ids(ur_cache *c, ur_stream *s, const ur_tensor *x, int64_t **buf,
                          int64_t *cap, const int64_t **out) {
  if (ur_tensor_place(x) != UR_PLACE_DEVICE) {
    if (ur_tensor_place(x) == UR_PLACE_MANAGED) {
      ur_status st = c->be->device_sync();
      if (st) return st;
    }
    *out = ur_tensor_data(x);
    return UR_STATUS_OK;
  }
  int64_t n = ur_tensor_numel(x);
  ur_status st = grow((void **)buf, cap, n + 1, sizeof(int64_t));
  if (!st) st = c->be->copy(s ? s->handle : NULL, *buf, ur_tensor_data(x), (size_t)n * 8);
  if (!st) st = c->be->stream_sync(s ? s->handle : NULL);
  *out = *buf;
  return st;
}

static ur_status check_ids_tensor(const ur_cache *c, const ur_tensor *x, const char *what) {
  if (ur_tensor_dtype(x) != UR_DTYPE_I64 || ur_tensor_ndim(x) != 1)
    return ur__error(UR_STATUS_INVALID, "cache: %s is %s with %d dimensions; expected i64 with 1",
                     what, ur_dtype_name(ur_tensor_dtype(x)), (int)ur_tensor_ndim(x));
  if (ur_tensor_place(x) == UR_PLACE_DEVICE && c->home != UR_PLACE_DEVICE)
    return ur__error(UR_STATUS_INVALID, "cache: %s is in device memory but the collection runs "
                                        "on the CPU", what);
  return UR_STATUS_OK;
}

/* The cache's name in messages: its tables. */
static void cache_name(const ur_cache *c, char *buf, size_t len) {
  const ur_tbe_table_config *tc = c->tbe->tc;
  if (c->nt == 1) snprintf(buf, len, "cache of table '%s'", tc[c->tidx[0]].name);
  else if (c->nt == 2)
    snprintf(buf, len, "cache of tables '%s' and '%s'", tc[c->tidx[0]].name, tc[c->tidx[1]].name);
  else
    snprintf(buf, len, "cache of tables '%s', '%s' and %d more", tc[c->tidx[0]].name,
             tc[c->tidx[1]].name, (int)c->nt - 2);
}

/* Slot storage of R rows keeping the first keep rows, freeing the old storage before the new
 * is allocated: the kept rows wait in host memory meanwhile (pinned when it can be had, else
 * pageable).  When the new storage cannot be had either, storage of the old size is allocated
 * again and the kept rows put back, so the slot storage is as it was: UR_STATUS_OOM with *restored
 * set, and why (at most 400 bytes) says what refused the new storage.  Should even
 * that fail, the cache has lost its rows: its tables read their own storage again and every
 * later call on the cache fails (c->lost). */
static ur_status regrow_via_host(ur_cache *c, int64_t R, int64_t keep, int *restored,
                                 char why[400]) {
  *restored = 0;
  size_t per[4];
  part_bytes(c, per);
  int64_t hb = (int64_t)slots_bytes(c, keep);
  ur_tensor *h = NULL;
  ur_status st = UR_STATUS_OK;
  void *hp[4] = {NULL, NULL, NULL, NULL}, *p[4];
  slot_store old = slots_of(c), n;
  if (keep > 0) {
    if (ur_tensor_new(&h, UR_DTYPE_U8, 1, &hb, UR_PLACE_PINNED, UR_LOC_CPU) &&
        (st = ur_tensor_new(&h, UR_DTYPE_U8, 1, &hb, UR_PLACE_HOST, UR_LOC_CPU)))
      return st;
    char *at = ur_tensor_data(h);
    for (int k = 0; k < 4; k++) {
      hp[k] = per[k] ? at : NULL;
      at += (size_t)keep * per[k];
    }
    slots_parts(&old, p);
    if ((st = copy_parts(c, hp, p, keep))) {
      ur_tensor_free(h);
      return st;
    }
  }
  int64_t R0 = c->R;
  slots_free(&old);
  c->sw = c->ss1 = c->ss2 = c->srow = NULL;
  st = slots_new(c, R, &n);
  if (st == UR_STATUS_OOM) {
    snprintf(why, 400, "%s", ur_last_error());
    *restored = 1;
    R = R0;
    st = slots_new(c, R, &n);
  }
  if (!st) {
    slots_parts(&n, p);
    st = copy_parts(c, p, hp, keep);
    if (st) slots_free(&n);
  }
  ur_tensor_free(h);
  if (st) {
    *restored = 0;
    c->lost = LOST_GROWN;
    char err[400], lost[480];
    snprintf(err, sizeof err, "%s", ur_last_error());
    snprintf(lost, sizeof lost, "%s: %s", LOST_GROWN, err);
    tables_lost(c, lost);
    return ur__error(st, "%s", err); /* the failure's message, whatever marking them said */
  }
  st = slots_install(c, &n, R);
  return !st && *restored ? UR_STATUS_OOM : st;
}

/* Makes room for staging rows: waits for the device, releases retired batches, and grows the
 * slot storage (the slots are kept; staged rows of no batch are live then).  The new storage
 * is allocated beside the old when memory allows (the fast way), else through host memory
 * (regrow_via_host); before any row has been moved into a slot nothing is kept, and the old
 * storage is freed first. */
static ur_status grow_staging(ur_cache *c, int64_t need) {
  for (int r = 0; r < RING; r++)
    if (c->ring[r].ticket && !c->ring[r].retired && c->ring[r].nstaged)
      return ur__error(UR_STATUS_INVALID,
                       "cache: a batch needs %lld staging rows (the cache holds %lld) while batch "
                       "%lld, not yet retired, holds staged rows; retire it first",
                       (long long)need, (long long)c->M, (long long)c->ring[r].ticket);
  ur_status st = c->be->device_sync();
  if (st) return st;
  int64_t M = c->M;
  while (M < need) M *= 2;
  int64_t R = c->S + 2 * M, keep = c->filled ? c->S : 0;
  char beside[400] = "", cause[400];
  int restored = 0;
  if (keep > 0) {
    st = alloc_slots(c, R, keep);
    if (st != UR_STATUS_OOM) goto done;
    snprintf(beside, sizeof beside, "%s", ur_last_error());
  }
  st = regrow_via_host(c, R, keep, &restored, cause);
  if (!st && keep > 0) c->stats[c->nt].staging_grows_via_host++;
done:
  if (!st) {
    c->M = M;
    c->stats[c->nt].staging_grows++;
    return UR_STATUS_OK;
  }
  char name[160], need_b[32], keep_b[32];
  if (!restored) snprintf(cause, sizeof cause, "%s", ur_last_error());
  cache_name(c, name, sizeof name);
  ur__format_bytes(slots_bytes(c, R), need_b, sizeof need_b);
  ur__format_bytes(slots_bytes(c, keep), keep_b, sizeof keep_b);
  if (restored)
    return ur__error(st, "%s: growing staging from %lld to %lld rows a half asks for slot storage "
                     "of %lld rows (%s, %llu bytes), which fits neither beside the slots (%s "
                     "kept: %s) nor in their place with the kept rows waiting in host memory "
                     "(%s); the slot storage is as it was, with %lld staging rows a half, but this batch's "
                     "placement was decided: the cache cannot be used again; make it anew",
                     name, (long long)c->M, (long long)M, (long long)R, need_b,
                     (unsigned long long)slots_bytes(c, R), keep_b,
                     keep > 0 ? beside : "not tried, no slot holds a row yet", cause,
                     (long long)c->M);
  if (c->lost)
    return ur__error(st, "%s: growing staging from %lld to %lld rows a half (slot storage of %lld "
                     "rows, %s, %llu bytes) failed after the old storage was freed, and storage "
                     "of the old size could not be had again (%s): the cache's rows in HBM are "
                     "lost, and its tables read their own storage again",
                     name, (long long)c->M, (long long)M, (long long)R, need_b,
                     (unsigned long long)slots_bytes(c, R), cause);
  return ur__error(st, "%s: growing staging from %lld to %lld rows a half (slot storage of %lld "
                   "rows, %s, %llu bytes; %s kept) failed (%s); the slot storage is as it was, but this "
                   "batch's placement was decided: the cache cannot be used again; make it anew",
                   name, (long long)c->M, (long long)M, (long long)R, need_b,
                   (unsigned long long)slots_bytes(c, R), keep_b, cause);
}

static ur_status bad_value(ur_cache *c, int64_t v, int64_t id, int32_t f, const int64_t *offs,
                           const int64_t *bag_start, int64_t batch) {
  int32_t ti = c->tbe->names.features[f].table;
  int64_t b0 = ur__tbe_bag_of(bag_start, batch, f);
  int64_t b1 = ur__tbe_bag_of(bag_start, batch, f + 1), lo = b0;
  while (b1 - lo > 1) { /* the last bag of f starting at or before v */
    int64_t mid = lo + (b1 - lo) / 2;
    if (offs[mid] <= v) lo = mid;
    else b1 = mid;
  }
  return ur__tbe_bad_id("cache", c->tbe->tc[ti].name, c->tbe->names.fnames[f], lo - b0, v, id, 0,
                        rows_of(c, ti));
}

/* The first feature whose values hold value v (for messages). */
static int32_t feature_at(const ur_cache *c, int64_t v, const int64_t *offs,
                          const int64_t *bag_start, int64_t batch) {
  for (int32_t f = 0; f < c->F; f++) {
    int64_t fb0 = ur__tbe_bag_of(bag_start, batch, f);
    int64_t fb1 = ur__tbe_bag_of(bag_start, batch, f + 1);
    if (offs[fb0] <= v && v < offs[fb1]) return f;
  }
  return 0;
}

/* One batch's ids as ur_cache_prepare takes them: the values, the offsets of its bags and where
 * each feature's bags start (bag_start under a variable batch, else f * batch); out gets each
 * value's slot id. */
typedef struct batch_ids {
  const ur_tensor *values, *offsets;
  int64_t bags, batch;
  const int64_t *bag_start;
  ur_tensor *out;
} batch_ids;

/* The message of what lookup found wrong, from host copies of the ids.  A bad id is named as
 * the host reference finds it: the first in feature order (features are key-major, so value
 * order); the backend's own bad value when that finds none. */
static ur_status lookup_error(ur_cache *c, ur_stream *s, const batch_ids *x, int64_t bad_v,
                              int64_t bad_f) {
  const int64_t *vals = NULL, *offs = NULL, *bag_start = x->bag_start;
  int64_t bags = x->bags, batch = x->batch;
  ur_status st = host_ids(c, s, x->values, &c->hvals, &c->cap_hv, &vals);
  if (!st) st = host_ids(c, s, x->offsets, &c->hoffs, &c->cap_ho, &offs);
  if (st) return st;
  int64_t n = ur_tensor_numel(x->values);
  if (bad_f == c->F || (bad_f < 0 && bad_v < 0))
    return ur__error(UR_STATUS_INVALID, "cache: offsets run from %lld to %lld; expected 0 to %lld "
                                        "(the values)", (long long)offs[0], (long long)offs[bags],
                     (long long)n);
  if (bad_f >= 0) {
    int64_t fb0 = ur__tbe_bag_of(bag_start, batch, (int32_t)bad_f);
    int64_t fb1 = ur__tbe_bag_of(bag_start, batch, (int32_t)bad_f + 1);
    return ur__error(UR_STATUS_INVALID, "cache: feature '%s' spans values %lld..%lld of %lld; "
                                        "offsets must not decrease",
                     c->tbe->names.fnames[bad_f], (long long)offs[fb0], (long long)offs[fb1],
                     (long long)n);
  }
  for (int32_t f = 0; f < c->F; f++) {
    int64_t rows = rows_of(c, c->tbe->names.features[f].table);
    int64_t v = ur__cache_first_bad(vals, offs[ur__tbe_bag_of(bag_start, batch, f)],
                                    offs[ur__tbe_bag_of(bag_start, batch, f + 1)], rows);
    if (v >= 0) return bad_value(c, v, vals[v], f, offs, bag_start, batch);
  }
  return bad_value(c, bad_v, vals[bad_v], feature_at(c, bad_v, offs, bag_start, batch), offs,
                   bag_start, batch);
}

/* Batch tk (ring entry B) decided by the backend: lookup, settle the flights, decide, make room
 * for staged rows, place, move.  The host waits for s after the lookup and after the decisions
 * (the GPU's lookup waits inside too: docs/cache.md). */
static ur_status decide(ur_cache *c, ur_stream *s, flight *B, int64_t tk, const batch_ids *x) {
  const ur_backend *g = c->be;
  void *sh = s ? s->handle : NULL;
  int64_t n = ur_tensor_numel(x->values);
  ur_status st = UR_STATUS_OK;
  int64_t *info = ur_tensor_data(c->info_host);
  ur__cache_job j;
  memset(&j, 0, sizeof j);
  j.vals = ur_tensor_data(x->values);
  j.offs = ur_tensor_data(x->offsets);
  j.n = n;
  j.bags = x->bags;
  j.batch = x->batch;
  if (x->bag_start) {
    int64_t *hb = info + info_words(c);
    memcpy(hb, x->bag_start, sizeof(int64_t) * ((size_t)c->F + 1));
    j.bag_start = hb;
  }
  j.bounds_fatal = c->bounds == UR_TBE_BOUNDS_FATAL;
  for (int r = 0; r < RING; r++) {
    const flight *b = &c->ring[r];
    if (b->ticket && b != B && b->nstaged) {
      j.staged[r] = (const int64_t *)ur_tensor_data(b->dev) + b->list_at;
      j.nstaged[r] = b->nstaged;
    }
  }
  j.scratch = ur_tensor_data(c->scratch);
  j.scratch_bytes = c->scratch_bytes;
  j.info = c->info_dev ? ur_tensor_data(c->info_dev) : info;
  j.info_host = info;
  /* the ids of the info copied over the host link, when it crosses one */
  uint64_t link = j.info != j.info_host ? 8 * (uint64_t)info_words(c) : 0;
  account_gpu(c, B); /* its last batch's spans, before they are recorded again */
  /* 1. lookup */
  if ((st = span_mark(c, B, 0, sh)) || (st = g->cache->lookup(sh, &c->dev, &j)) ||
      (st = span_mark(c, B, 1, sh)) || (st = g->stream_sync(sh)))
    return st;
  /* the info once more when the GPU's lookup waited for the count of the cached values, and
   * one word when it read the number of distinct keys (it does when it sorted any value) */
  int64_t sorted = info[UR__CI_BAD_F] >= 0 ? 0 : c->dev.partial ? info[UR__CI_CACHED] : n;
  c->stats[c->nt].bytes_ids += link * (c->dev.partial && n > 0 ? 2 : 1) + (link && sorted > 0 ? 8 : 0)
                               + (link && x->bag_start ? 8 * ((uint64_t)c->F + 1) : 0);
  if (info[UR__CI_BAD_F] >= 0 || (info[UR__CI_BAD_V] >= 0 && j.bounds_fatal))
    return lookup_error(c, s, x, info[UR__CI_BAD_V], info[UR__CI_BAD_F]);
  j.U = info[UR__CI_U];
  j.ng = info[UR__CI_NG];
  j.nvalid = info[UR__CI_NVALID];
  int meet[RING];
  for (int r = 0; r < RING; r++) meet[r] = j.staged[r] && info[UR__CI_MEET + r];
  /* 2. the flights; the decisions */
  if ((st = settle(c, s, B, tk, j.U, meet, &j.floor))) return st;
  for (int32_t ct = 0; ct < c->nt; ct++)
    c->stats[ct].lookups += info[UR__CI_TABLES + (size_t)ct * UR__CT_COUNT + UR__CT_LOOKUPS];
  j.ticket = tk;
  j.epoch = freq_epoch(c, tk);
  j.lfu = c->cfg.policy == UR_CACHE_LFU;
  /* the counts' epochs have 16 bits: re-based often enough that none read is 65536 old */
  j.rebase = j.lfu && decay_period(c, tk) - c->rebased >= UR__CACHE_REBASE_EPOCHS;
  if ((st = span_mark(c, B, 2, sh)) || (st = g->cache->decide(sh, &c->dev, &j)))
    return st;
  if ((st = span_mark(c, B, 3, sh)) || (st = g->stream_sync(sh))) { /* decide was queued */
    c->lost = LOST_PLACED;
    return st;
  }
  if (j.rebase) c->rebased = decay_period(c, tk);
  c->stats[c->nt].bytes_ids += link;
  j.nwb = info[UR__CI_NWB];
  j.nfill = info[UR__CI_NFILL];
  j.nconf = info[UR__CI_NCONF];
  if (!B->tconf && !(B->tconf = calloc((size_t)c->nt, sizeof *B->tconf))) {
    c->lost = LOST_PLACED; /* the decisions are taken: as below */
    return ur__error(UR_STATUS_OOM, "cache: out of host memory");
  }
  for (int32_t ct = 0; ct < c->nt; ct++) {
    const int64_t *t = info + UR__CI_TABLES + (size_t)ct * UR__CT_COUNT;
    counters *cs = &c->stats[ct];
    cs->unique += (uint64_t)t[UR__CT_UNIQUE];
    cs->hits += (uint64_t)t[UR__CT_HITS];
    cs->misses += (uint64_t)t[UR__CT_MISSES];
    cs->conflicts += (uint64_t)t[UR__CT_CONFLICTS];
    cs->evictions += (uint64_t)t[UR__CT_EVICTIONS];
    cs->writebacks += (uint64_t)t[UR__CT_WRITEBACKS];
    cs->bytes_in += (uint64_t)(t[UR__CT_MISSES] + t[UR__CT_CONFLICTS]) * row_moves(c);
    cs->bytes_out += (uint64_t)t[UR__CT_WRITEBACKS] * row_moves(c);
    B->tconf[ct] = t[UR__CT_CONFLICTS];
  }
  /* Growing was checked possible before the decisions (settle).  Failing now for memory
   * leaves the slot storage as it was (grow_staging), but this batch's decisions are taken
   * (tags moved, dirty rows evicted without their write-back): the cache is unusable, and
   * every later call says so (c->lost); so for any failure from here on (a retry would train
   * on slots tagged for rows never loaded). */
  if (j.nconf > c->M && (st = grow_staging(c, j.nconf))) {
    c->lost = LOST_GROWN;
    return st;
  }
  /* 3. place and move */
  int64_t words = 2 * (j.nwb + j.nfill + j.nconf) + (j.U - j.nconf);
  if (!B->dev || ur_tensor_numel(B->dev) < words) {
    ur_tensor_free(B->dev);
    B->dev = NULL;
    if ((st = home_tensor(c, &B->dev, UR_DTYPE_I64, words + words / 2 + 1024, 0))) {
      c->lost = LOST_PLACED;
      return st;
    }
  }
  j.lists = ur_tensor_data(B->dev);
  j.row_ids = ur_tensor_data(c->srow);
  j.sbase = c->S + (tk & 1) * c->M;
  j.out = ur_tensor_data(x->out);
  if ((st = span_mark(c, B, 4, sh)) || (st = g->cache->place(sh, &c->dev, &j))) {
    c->lost = LOST_PLACED;
    return st;
  }
  c->filled = 1;
  if ((st = move(c, sh, j.lists, j.nwb, j.lists + 2 * j.nwb, j.nfill + j.nconf, 1))) {
    c->lost = LOST_PLACED;
    return st;
  }
  if ((st = span_mark(c, B, 5, sh))) {
    c->lost = LOST_PLACED;
    return st;
  }
  B->timed_p = 1;
  c->last_ready = B->span[5];
  for (int32_t ct = 0; ct < c->nt; ct++) c->stats[ct].batches++;
  c->stats[c->nt].batches++;
  B->ticket = tk;
  B->retired = B->trained = 0;
  B->stream = NULL;
  B->nslots = j.U - j.nconf;
  B->nstaged = j.nconf;
  B->list_at = 2 * (j.nwb + j.nfill);
  B->slots_at = 2 * (j.nwb + j.nfill + j.nconf);
  c->next_ticket++;
  return UR_STATUS_OK;
}

/* The scratch for n values, and the ids where the backend reads them: ids in pageable host
 * memory get device copies for this batch when the decisions run on the GPU (whose kernels
 * also take fewer than 2^31 values). */
static ur_status prepare_batch(ur_cache *c, ur_stream *s, flight *B, int64_t tk,
                               const batch_ids *x) {
  const ur_backend *g = c->be;
  void *sh = s ? s->handle : NULL;
  int64_t n = ur_tensor_numel(x->values);
  int dev = c->home == UR_PLACE_DEVICE;
  if (dev && n >= INT32_MAX)
    return ur__error(UR_STATUS_INVALID, "cache: a batch of %lld values; the GPU's cache takes "
                                        "fewer than 2^31", (long long)n);
  size_t need = 0;
  ur_status st = g->cache->scratch(&c->dev, n, &need);
  if (st) return st;
  if (need > c->scratch_bytes) {
    ur_tensor *t = NULL;
    int64_t want = (int64_t)(need + need / 4);
    if ((st = home_tensor(c, &t, UR_DTYPE_U8, want, 0))) return st;
    ur_tensor_free(c->scratch); /* a free waits for the device: no earlier prepare uses it */
    c->scratch = t;
    c->scratch_bytes = (size_t)want;
  }
  ur_tensor *tmp[2] = {NULL, NULL};
  batch_ids there = *x; /* the ids where the backend reads them */
  const ur_tensor **in[2] = {&there.values, &there.offsets};
  for (int k = 0; k < 2 && !st && dev; k++)
    if (ur_tensor_place(*in[k]) == UR_PLACE_HOST) {
      int64_t m = ur_tensor_numel(*in[k]);
      st = home_tensor(c, &tmp[k], UR_DTYPE_I64, m, 0);
      if (!st) st = g->copy(sh, ur_tensor_data(tmp[k]), ur_tensor_data(*in[k]), (size_t)m * 8);
      if (!st) *in[k] = tmp[k];
    }
  if (!st) st = decide(c, s, B, tk, &there);
  if (tmp[0] || tmp[1]) {
    ur_status st2 = g->stream_sync(sh);
    if (!st) st = st2;
  }
  ur_tensor_free(tmp[0]);
  ur_tensor_free(tmp[1]);
  return st;
}

/* Which earlier batches still hold their rows, for batch tk (in flight entry B) of U distinct
 * rows, meet[r] saying whether it needs rows that flight r serves from staging: a retired
 * batch is released (its rows unlocked, after s waits for its retire) when it ran on s, is two
 * batches old, or staged rows tk needs; one not retired must not have.  Checks that staging
 * could grow if it must, before any decision; *floor: the oldest ticket still holding rows. */
static ur_status settle(ur_cache *c, ur_stream *s, const flight *B, int64_t tk, int64_t U,
                        const int *meet, int64_t *floor) {
  ur_status st = UR_STATUS_OK;
  for (int r = 0; r < RING && !st; r++) {
    flight *b = &c->ring[r];
    if (!b->ticket || b == B) continue;
    if (!b->retired) {
      if (meet[r])
        st = ur__error(UR_STATUS_INVALID,
                       "cache: batch %lld needs rows that batch %lld (not yet retired) serves "
                       "from staging; retire it before preparing the next",
                       (long long)tk, (long long)b->ticket);
      /* staging has two halves, a batch's by its ticket's parity: batch tk would write its
       * staged rows over those of batch tk - 2 (its forward would read tk's rows, and its
       * backward write them into its own) */
      else if (b->nstaged && (b->ticket & 1) == (tk & 1))
        st = ur__error(UR_STATUS_INVALID,
                       "cache: batch %lld would stage its rows where batch %lld, not yet retired, "
                       "holds %lld staged rows (two batches stage at a time); retire it first",
                       (long long)tk, (long long)b->ticket, (long long)b->nstaged);
      continue;
    }
    int release = b->stream == s || b->ticket <= tk - 2;
    if (!release && meet[r]) {
      release = 1;
      c->stats[c->nt].waits++;
    }
    if (release) {
      /* waited for on the GPU even on the same stream: a stream is compared by address only,
       * and one freed since may share it */
      if ((st = wait_retired(c, s, b))) break;
      b->ticket = 0;
    }
  }
  if (st) return st;
  /* Staging may have to grow, which needs no batch in flight to hold staged rows: say so
   * before any decision is made. */
  for (int r = 0; r < RING; r++)
    if (U > c->M && c->ring[r].ticket && !c->ring[r].retired && c->ring[r].nstaged && &c->ring[r] != B)
      return ur__error(UR_STATUS_INVALID,
                       "cache: batch %lld has %lld distinct rows, more than the %lld staging rows, "
                       "while batch %lld, not yet retired, holds staged rows; retire it first",
                       (long long)tk, (long long)U, (long long)c->M, (long long)c->ring[r].ticket);
  *floor = tk;
  for (int r = 0; r < RING; r++)
    if (c->ring[r].ticket && c->ring[r].ticket < *floor) *floor = c->ring[r].ticket;
  return UR_STATUS_OK;
}

ur_status ur_cache_prepare(ur_stream *s, ur_cache *c, const ur_tensor *values,
                           const ur_tensor *offsets, const int64_t *spk, ur_tensor *out,
                           int64_t *ticket) {
  UR__ARGS(c, values, offsets, out, ticket);
  *ticket = 0;
  ur_status st = check_alive(c);
  if (st) return st;
  if ((st = check_ids_tensor(c, values, "values")) || (st = check_ids_tensor(c, offsets, "offsets")) ||
      (st = check_ids_tensor(c, out, "out")))
    return st;
  int64_t n = ur_tensor_numel(values), bags = ur_tensor_numel(offsets) - 1;
  if (ur_tensor_numel(out) != n)
    return ur__error(UR_STATUS_INVALID, "cache: out holds %lld id%s for %lld value%s; expected one each",
                     (long long)ur_tensor_numel(out), ur__s(ur_tensor_numel(out)), (long long)n, ur__s(n));
  if (ur_tensor_place(out) == UR_PLACE_HOST && c->home == UR_PLACE_DEVICE)
    return ur__error(UR_STATUS_INVALID, "cache: out is in host memory, which the collection's GPU "
                                        "cannot read");
  if (bags < 0) return ur__error(UR_STATUS_INVALID, "cache: offsets is empty; expected bags + 1");
  int64_t *bag_start = NULL, batch = 0;
  if (spk) {
    bag_start = malloc(sizeof(int64_t) * ((size_t)c->F + 1));
    if (!bag_start) return ur__error(UR_STATUS_OOM, "cache: out of host memory");
    bag_start[0] = 0;
    for (int32_t f = 0; f < c->F; f++) {
      if (spk[f] < 0) {
        free(bag_start);
        return ur__error(UR_STATUS_INVALID, "cache: feature '%s' has batch %lld; expected >= 0",
                         c->tbe->names.fnames[f], (long long)spk[f]);
      }
      bag_start[f + 1] = bag_start[f] + spk[f];
    }
    if (bag_start[c->F] != bags) {
      int64_t sum = bag_start[c->F];
      free(bag_start);
      return ur__error(UR_STATUS_INVALID,
                       "cache: stride_per_key_per_rank sums to %lld bags but offsets hold %lld",
                       (long long)sum, (long long)bags);
    }
  } else if (bags % c->F) {
    return ur__error(UR_STATUS_INVALID, "cache: %lld bags do not split evenly over %d features",
                     (long long)bags, (int)c->F);
  } else {
    batch = bags / c->F;
  }
  double t0 = ur_clock_seconds();
  /* a free ring entry */
  flight *B = NULL;
  for (int r = 0; r < RING && !B; r++)
    if (!c->ring[r].ticket) B = &c->ring[r];
  if (!B) {
    /* release retired batches whose retire this stream can wait for */
    for (int r = 0; r < RING && !B; r++)
      if (c->ring[r].retired) {
        if ((st = wait_retired(c, s, &c->ring[r]))) break;
        c->ring[r].ticket = 0;
        B = &c->ring[r];
      }
    if (!B && !st)
      st = ur__error(UR_STATUS_INVALID, "cache: %d batches are prepared and not retired; retire "
                                        "one (ur_cache_retire) before preparing another", RING);
  }
  /* after the previous prepare's copies, whatever stream that ran on (write-backs of rows this
   * one may load, and the scratch); through the cache's own event: that stream may be gone */
  if (!st && c->last_ready && c->be->stream_wait)
    st = c->be->stream_wait(s ? s->handle : NULL, c->last_ready);
  int64_t tk = c->next_ticket;
  batch_ids x = {values, offsets, bags, batch, bag_start, out};
  if (!st) st = prepare_batch(c, s, B, tk, &x);
  free(bag_start);
  c->seconds += ur_clock_seconds() - t0;
  if (st) return st;
  *ticket = tk;
  return UR_STATUS_OK;
}

ur_status ur_cache_retire(ur_stream *s, ur_cache *c, int64_t ticket, int32_t trained) {
  UR__ARGS(c);
  ur_status st = check_alive(c);
  if (st) return st;
  flight *b = ticket > 0 ? ring_find(c, ticket) : NULL;
  if (!b || b->retired)
    return ur__error(UR_STATUS_INVALID, "cache: batch %lld is not prepared and in flight%s",
                     (long long)ticket, b ? " (retired already)" : "");
  double t0 = ur_clock_seconds();
  void *sh = s ? s->handle : NULL;
  if (trained) {
    /* its slots are dirty now, and its staged rows go home */
    int64_t *dev = ur_tensor_data(b->dev);
    for (int32_t ct = 0; ct < c->nt; ct++) {
      c->stats[ct].writebacks += b->tconf[ct];
      c->stats[ct].bytes_out += (uint64_t)b->tconf[ct] * row_moves(c);
    }
    st = span_mark(c, b, 6, sh);
    if (!st) st = c->be->cache->mark(sh, c->dev.dirty, dev + b->slots_at, b->nslots);
    if (!st) st = move(c, sh, dev + b->list_at, b->nstaged, NULL, 0, 0);
    if (!st) st = span_mark(c, b, 7, sh);
    if (!st) b->timed_r = 1;
  }
  if (!st && c->be->event_record) {
    if (!b->event) st = c->be->event_new(&b->event);
    if (!st) st = c->be->event_record(b->event, sh);
  }
  if (st) return st;
  b->retired = 1;
  b->trained = trained != 0;
  b->stream = s;
  c->seconds += ur_clock_seconds() - t0;
  return UR_STATUS_OK;
}

/* The host's view of the tags (and dirty marks) after the backend's work: nothing to copy when
 * the state is the host's own. */
static ur_status pull_state(ur_cache *c, int dirty) {
  if (c->tag == c->dev.tag) return UR_STATUS_OK;
  const ur_backend *g = c->be;
  ur_status st = g->device_sync();
  if (!st) st = g->copy(NULL, c->tag, c->dev.tag, (size_t)c->S * 8);
  if (!st && dirty) st = g->copy(NULL, c->dirty, c->dev.dirty, (size_t)c->S);
  if (!st) st = g->stream_sync(NULL);
  return st;
}

ur_status ur_cache_flush(ur_cache *c) {
  UR__ARGS(c);
  ur_status st = check_alive(c);
  if (st) return st;
  double t0 = ur_clock_seconds();
  if ((st = pull_state(c, 1))) return st;
  int64_t nd = 0;
  for (int64_t i = 0; i < c->S; i++) nd += c->dirty[i] && c->tag[i] != EMPTY;
  if (nd) {
    int64_t *e = malloc(sizeof(int64_t) * 2 * (size_t)nd), k = 0;
    if (!e) return ur__error(UR_STATUS_OOM, "cache: out of host memory");
    for (int64_t i = 0; i < c->S; i++)
      if (c->dirty[i] && c->tag[i] != EMPTY) {
        e[2 * k] = (int64_t)pair_of(c, c->tag[i]);
        e[2 * k + 1] = i;
        k++;
        c->stats[table_of_key(c, c->tag[i])].writebacks++;
        c->stats[table_of_key(c, c->tag[i])].bytes_out += row_moves(c);
      }
    const ur_backend *g = c->be;
    ur_tensor *d = NULL;
    st = home_tensor(c, &d, UR_DTYPE_I64, 2 * nd, 0);
    if (!st) st = g->copy(NULL, ur_tensor_data(d), e, (size_t)(2 * nd) * 8);
    if (!st) st = move(c, NULL, ur_tensor_data(d), nd, NULL, 0, 0);
    if (!st) st = g->device_sync();
    ur_tensor_free(d);
    free(e);
    if (!st) st = g->fill(NULL, c->dev.dirty, (size_t)c->S, 1, 0);
    if (!st) st = g->stream_sync(NULL);
    if (st) return st;
    for (int64_t i = 0; i < c->S; i++) c->dirty[i] = 0;
  }
  c->seconds += ur_clock_seconds() - t0;
  return UR_STATUS_OK;
}

ur_status ur_cache_invalidate(ur_cache *c) {
  UR__ARGS(c);
  ur_status st = check_alive(c);
  if (st) return st;
  if (ur_cache_in_flight(c))
    return ur__error(UR_STATUS_INVALID, "cache: %d batches are in flight; retire them before "
                                        "emptying the cache", (int)ur_cache_in_flight(c));
  if ((st = ur_cache_flush(c))) return st;
  for (int r = 0; r < RING; r++) c->ring[r].ticket = 0;
  const ur_backend *g = c->be;
  st = g->fill(NULL, c->dev.tag, (size_t)c->S, 8, (uint64_t)EMPTY);
  if (!st) st = g->fill(NULL, c->dev.stamp, (size_t)c->S, 8, 0);
  if (!st && c->dev.freq) st = g->fill(NULL, c->dev.freq, (size_t)c->total_keys, 4, 0);
  if (!st) st = g->stream_sync(NULL);
  if (c->tag != c->dev.tag)
    for (int64_t i = 0; i < c->S; i++) c->tag[i] = EMPTY;
  return st;
}

ur_status ur_cache_drop(ur_cache *c, int32_t table, const int64_t *ids, int64_t n,
                       int64_t *dropped) {
  UR__ARGS(c, ids);
  if (dropped) *dropped = 0;
  ur_status st = check_alive(c);
  if (st) return st;
  if (table < 0 || table >= c->nt)
    return ur__error(UR_STATUS_INVALID, "cache: drop: table %d; expected 0..%d", (int)table,
                     (int)c->nt - 1);
  if (ur_cache_in_flight(c))
    return ur__error(UR_STATUS_INVALID, "cache: %d batches are in flight; retire them before "
                                        "dropping rows", (int)ur_cache_in_flight(c));
  for (int64_t i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= c->rows[table])
      return ur__error(UR_STATUS_INVALID, "cache: drop: ids[%lld] = %lld is outside the table's "
                       "%lld rows", (long long)i, (long long)ids[i], (long long)c->rows[table]);
  double t0 = ur_clock_seconds();
  if ((st = pull_state(c, 1))) return st;
  const ur_backend *g = c->be;
  /* the rows' LFU counts belong to the ids that leave: reset in one call for all of them, before
   * a tag changes, so that a failure here (the keys' memory) leaves the cache as it was */
  ur_tensor *keys = NULL;
  if (c->dev.freq && n > 0) {
    st = g->zero_rows ? home_tensor(c, &keys, UR_DTYPE_I64, n, 0) : ur__missing(g, "core", "zero_rows");
    int64_t *hk = st ? NULL : malloc(sizeof(int64_t) * (size_t)n);
    if (!st && !hk) st = ur__error(UR_STATUS_OOM, "cache: out of host memory");
    for (int64_t i = 0; !st && i < n; i++) hk[i] = c->kbase[table] + ids[i];
    if (!st) st = g->copy(NULL, ur_tensor_data(keys), hk, sizeof(int64_t) * (size_t)n);
    if (!st) st = g->zero_rows(NULL, c->dev.freq, 4, ur_tensor_data(keys), (size_t)n);
    if (!st) st = g->stream_sync(NULL); /* hk and keys must outlive the copy and the kernel */
    free(hk);
  }
  ur_tensor_free(keys);
  if (st) {
    c->seconds += ur_clock_seconds() - t0;
    return st;
  }
  int64_t k = 0;
  for (int64_t i = 0; i < n; i++) {
    uint64_t key = (uint64_t)(c->kbase[table] + ids[i]);
    int64_t base = set_of(c, key, table) * UR_CACHE_WAYS;
    for (int w = 0; w < UR_CACHE_WAYS; w++)
      if (c->tag[base + w] == key) {
        c->tag[base + w] = EMPTY;
        c->dirty[base + w] = 0;
        k++;
        break;
      }
  }
  if (!st && k && c->tag != c->dev.tag) {
    st = g->copy(NULL, c->dev.tag, c->tag, (size_t)c->S * 8);
    if (!st) st = g->copy(NULL, c->dev.dirty, c->dirty, (size_t)c->S);
  }
  if (!st) st = g->stream_sync(NULL);
  if (!st && dropped) *dropped = k;
  c->seconds += ur_clock_seconds() - t0;
  return st;
}

ur_status ur_cache_stats_get(const ur_cache *c, int32_t table, ur_cache_stats *out) {
  UR__ARGS(c, out);
  memset(out, 0, sizeof *out);
  if (table < -1 || table >= c->nt)
    return ur__error(UR_STATUS_INVALID, "cache: table %d; expected -1 (the total) or 0..%d",
                     (int)table, (int)c->nt - 1);
  int32_t lo = table < 0 ? 0 : table, hi = table < 0 ? c->nt : table + 1;
  for (int32_t i = lo; i < hi; i++) {
    const counters *k = &c->stats[i];
    out->lookups += k->lookups;
    out->unique += k->unique;
    out->hits += k->hits;
    out->misses += k->misses;
    out->conflicts += k->conflicts;
    out->evictions += k->evictions;
    out->writebacks += k->writebacks;
    out->bytes_in += k->bytes_in;
    out->bytes_out += k->bytes_out;
  }
  const counters *t = &c->stats[c->nt];
  out->batches = table < 0 ? t->batches : c->stats[table].batches;
  out->waits = t->waits;
  out->staging_grows = t->staging_grows;
  out->staging_grows_via_host = t->staging_grows_via_host;
  out->bytes_ids = t->bytes_ids;
  out->seconds = c->seconds;
  for (int r = 0; r < RING; r++) account_gpu((ur_cache *)c, (flight *)&c->ring[r]);
  out->gpu_seconds = c->gpu_seconds;
  memcpy(out->gpu_phase_seconds, c->gpu_phase, sizeof c->gpu_phase);
  return UR_STATUS_OK;
}

void ur_cache_reset_stats(ur_cache *c) {
  if (!c) return;
  memset(c->stats, 0, sizeof *c->stats * ((size_t)c->nt + 1));
  c->seconds = c->gpu_seconds = 0;
  memset(c->gpu_phase, 0, sizeof c->gpu_phase);
  for (int r = 0; r < RING; r++) c->ring[r].timed_p = c->ring[r].timed_r = 0;
}

ur_status ur_cache_contains(const ur_cache *c, int32_t table, const int64_t *ids, int64_t n,
                            int64_t *slots) {
  UR__ARGS(c);
  if (n > 0 && !ids) return ur__null(__func__, "ids");
  if (n > 0 && !slots) return ur__null(__func__, "slots");
  if (table < 0 || table >= c->nt)
    return ur__error(UR_STATUS_INVALID, "cache: table %d; expected 0..%d", (int)table,
                     (int)c->nt - 1);
  /* the host's view of the tags, refreshed (not part of the cache's state) */
  ur_status st = pull_state((ur_cache *)c, 0);
  if (st) return st;
  for (int64_t i = 0; i < n; i++) {
    slots[i] = -1;
    if (ids[i] < 0 || ids[i] >= c->rows[table]) continue;
    uint64_t key = (uint64_t)(c->kbase[table] + ids[i]);
    int64_t base = set_of(c, key, table) * UR_CACHE_WAYS;
    for (int w = 0; w < UR_CACHE_WAYS; w++)
      if (c->tag[base + w] == key) {
        slots[i] = base + w;
        break;
      }
  }
  return UR_STATUS_OK;
}

ur_status ur_stream_wait_event(ur_stream *s, ur_event *e) {
  UR__ARGS(e);
  if (!ur__gpu() || !e->handle || !e->recorded) return UR_STATUS_OK;
  if (!ur__gpu()->stream_wait)
    return ur__error(UR_STATUS_UNSUPPORTED, "stream_wait_event: the CUDA backend has no stream "
                                            "waits (%s)", ur_cuda_error());
  return ur__gpu()->stream_wait(s ? s->handle : NULL, e->handle);
}
