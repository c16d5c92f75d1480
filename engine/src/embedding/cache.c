/* cache.c: the software HBM cache of `cached` embedding tables.  The decisions (lookup,
 * victims, locks, staging) are made here on the host for the CPU backend, which is the
 * reference; on a GPU the same decisions are made by the CUDA backend's kernels
 * (kernels/cache.cu: a warp scans a set) over the cache's state in device memory, driven from
 * prepare_gpu below, and the host keeps the bookkeeping of batches in flight.  Rows move by
 * memcpy on the CPU and by the cache_move kernel on the GPU, ordered on streams with events.
 *
 * One batch: its cached ids become keys (a cumulative row space over the cache's tables),
 * sorted and deduplicated; each distinct key is hashed to a set; sets are decided in parallel,
 * each on its own keys in ascending order: hits first (they lock their ways), then misses,
 * which take an empty way, else the policy's victim among the ways no batch in flight holds,
 * else a staging row (a conflict miss).  Dirty victims are written back before the fills
 * land.  Staging rows come in two halves used by alternate batches, so a batch in flight keeps
 * its staged rows while the next one is prepared. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "embedding/cache.h"
#include "core/core.h"

#define RING UR__CACHE_RING
#define EMPTY ((uint64_t)-1)

typedef struct flight {
  int64_t ticket;               /* 0: the entry is free */
  int retired, trained;
  ur_stream *stream;            /* where it was retired */
  void *event;                  /* GPU: recorded at retire */
  int64_t *slots, nslots, cap_slots;     /* distinct slots it uses */
  int64_t *staged, nstaged, cap_staged;  /* (table<<48|row, staging row) pairs */
  uint64_t *staged_keys;                 /* ascending, for the hazard check */
  int64_t list_at;              /* GPU: where the staged pairs sit in dev */
  int64_t slots_at;             /* GPU: where its slot list sits in dev */
  int64_t *tconf;               /* GPU: [tables] its conflict misses per table */
  void *span[8];                /* GPU: events around its lookup, decisions, placement (span[5]:
                                 * after its prepare's moves), retire */
  int timed_p, timed_r;         /* GPU: spans recorded and not yet added to gpu_seconds */
  ur_tensor *dev;               /* GPU: its move lists and slot list */
} flight;

typedef struct counters {
  int64_t batches, lookups, unique, hits, misses, conflicts, evictions, writebacks, waits;
  uint64_t bytes_in, bytes_out, bytes_ids;
} counters;

struct ur_cache {
  ur_tbe *tbe;
  int32_t bound;                /* tables pointed at the slots so far */
  int per_table;                /* each table has sets of its own */
  ur_cache_config cfg;
  int32_t nt, T, F;
  int32_t *tidx, *ct_of;        /* cache table -> collection table; collection -> cache or -1 */
  int64_t *rows, *kbase;        /* per cache table */
  int64_t *set_base, *set_count; /* per cache table: its sets (all of them when shared) */
  uint64_t total_keys;
  int32_t key_bits;
  ur__tbe_table *back;          /* per cache table: its own storage */
  int32_t dim, dtype, nstate, state_per_row, gpu, device, bounds;
  size_t row_bytes;
  int64_t S, nsets, M, R;       /* slots, sets, staging rows per half, slot storage rows */
  uint64_t *tag;                /* [S] key or EMPTY */
  int64_t *stamp;               /* [S] ticket of the last batch that used it */
  uint8_t *dirty;               /* [S] */
  uint32_t *freq;               /* LFU: [total_keys] count (low 16 bits) and epoch (high 16) */
  ur_tensor *sw, *ss1, *ss2;    /* slot storage */
  ur_tensor *srow;              /* [slot storage rows] the row id each holds (rounding draws) */
  ur_tensor *ptrs;              /* GPU: the host pointer arrays of the io */
  ur__cache_io io;              /* as the running backend reads it */
  flight ring[RING];
  int64_t next_ticket;
  void *last_ready;             /* GPU: the last prepare's event, after its copies */
  counters *stats;              /* [nt + 1]: per table, then the total */
  double seconds, gpu_seconds;
  /* scratch of one prepare, grown on demand */
  uint64_t *keys, *tkeys;
  int64_t *vidx, *tvidx, *uniq_of, *order, *res, *evict, *grp;
  uint64_t *ukeys;
  int64_t cap_n, cap_u, cap_g;
  int64_t *hvals, *hoffs;
  int64_t cap_hv, cap_ho;
  /* GPU: the state and geometry in device memory, and the decisions' scratch */
  ur__cache_dev dev;
  ur_tensor *dmeta, *dtag, *dstamp, *ddirty, *dfreq;
  ur_tensor *scratch, *info_dev, *info_host;
  size_t scratch_bytes;
};

static ur_status gpu_state_new(ur_cache *c);
static ur_status settle(ur_cache *c, ur_stream *s, const flight *B, int64_t tk, int64_t U,
                        const int *meet, int64_t *floor);

size_t ur_sizeof_cache_config(void) { return sizeof(ur_cache_config); }
size_t ur_sizeof_cache_stats(void) { return sizeof(ur_cache_stats); }

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The set, table and (table, row) pair of a key (cache_sets.h, shared with the GPU). */
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

/* ---- slot storage ---- */

static ur_status new_slot_tensor(ur_cache *c, ur_tensor **out, ur_dtype d, int64_t rows,
                                 int64_t cols) {
  int64_t shape[2] = {rows, cols};
  return ur_tensor_new(out, d, 2, shape, c->gpu ? UR_PLACE_DEVICE : UR_PLACE_HOST,
                       c->gpu ? c->device : UR_LOC_CPU);
}

/* Slot storage of R rows; the first keep rows of the old storage are kept. */
static ur_status alloc_slots(ur_cache *c, int64_t R, int64_t keep) {
  ur_tensor *w = NULL, *s1 = NULL, *s2 = NULL, *ids = NULL;
  ur_status st = new_slot_tensor(c, &w, (ur_dtype)c->dtype, R, c->dim);
  if (!st) st = new_slot_tensor(c, &ids, UR_DTYPE_I64, R, 1);
  if (!st) st = ur_tensor_fill(NULL, ids, 0);
  if (!st && c->nstate > 0) st = new_slot_tensor(c, &s1, UR_DTYPE_F32, R, c->state_per_row);
  if (!st && c->nstate > 1) st = new_slot_tensor(c, &s2, UR_DTYPE_F32, R, c->state_per_row);
  if (!st && s1) st = ur_tensor_fill(NULL, s1, 0);
  if (!st && s2) st = ur_tensor_fill(NULL, s2, 0);
  const ur_backend *b = c->gpu ? ur__gpu() : ur__cpu();
  size_t sb = (size_t)c->state_per_row * 4;
  if (!st && keep > 0 && c->sw) {
    st = b->copy(NULL, ur_tensor_data(w), ur_tensor_data(c->sw), (size_t)keep * c->row_bytes);
    if (!st && s1) st = b->copy(NULL, ur_tensor_data(s1), ur_tensor_data(c->ss1), (size_t)keep * sb);
    if (!st && s2) st = b->copy(NULL, ur_tensor_data(s2), ur_tensor_data(c->ss2), (size_t)keep * sb);
    if (!st) st = b->copy(NULL, ur_tensor_data(ids), ur_tensor_data(c->srow), (size_t)keep * 8);
    if (!st && c->gpu) st = b->stream_sync(NULL);
  }
  if (st) {
    ur_tensor_free(w);
    ur_tensor_free(s1);
    ur_tensor_free(s2);
    ur_tensor_free(ids);
    return st;
  }
  ur_tensor_free(c->sw);
  ur_tensor_free(c->ss1);
  ur_tensor_free(c->ss2);
  ur_tensor_free(c->srow);
  c->sw = w;
  c->ss1 = s1;
  c->ss2 = s2;
  c->srow = ids;
  c->R = R;
  c->io.slot_w = ur_tensor_data(w);
  c->io.slot_s1 = s1 ? ur_tensor_data(s1) : NULL;
  c->io.slot_s2 = s2 ? ur_tensor_data(s2) : NULL;
  for (int32_t i = 0; i < c->nt && !st; i++) {
    st = ur__tbe_redirect(c->tbe, c->tidx[i], c, c->io.slot_w, c->io.slot_s1, c->io.slot_s2,
                          ur_tensor_data(c->srow), R);
    if (!st && c->bound <= i) c->bound = i + 1;
  }
  return st;
}

/* ---- moving rows ---- */

static void cpu_move(const ur_cache *c, const int64_t *e, int64_t n, int to_host) {
  size_t sb = (size_t)c->state_per_row * 4;
  for (int64_t i = 0; i < n; i++) {
    uint64_t p = (uint64_t)e[2 * i];
    int32_t ct = (int32_t)(p >> UR__CACHE_ROW_BITS);
    int64_t row = (int64_t)(p & UR__CACHE_ROW_MASK), r = e[2 * i + 1];
    const ur__tbe_table *b = &c->back[ct];
    char *hw = (char *)b->weights + (size_t)row * c->row_bytes;
    char *sw = (char *)c->io.slot_w + (size_t)r * c->row_bytes;
    if (to_host) memcpy(hw, sw, c->row_bytes);
    else memcpy(sw, hw, c->row_bytes);
    float *hs[2] = {b->state1, b->state2}, *ss[2] = {c->io.slot_s1, c->io.slot_s2};
    for (int k = 0; k < c->nstate; k++) {
      char *h = (char *)(hs[k] + (size_t)row * (size_t)c->state_per_row);
      char *s = (char *)(ss[k] + (size_t)r * (size_t)c->state_per_row);
      if (to_host) memcpy(h, s, sb);
      else memcpy(s, h, sb);
    }
  }
}

/* Bytes one row moves, with its optimizer state. */
static uint64_t row_moves(const ur_cache *c) {
  return (uint64_t)c->row_bytes + (uint64_t)c->nstate * (uint64_t)c->state_per_row * 4;
}

/* entries: host pairs (CPU) or device pairs (GPU). */
static ur_status move(ur_cache *c, void *stream, const int64_t *e, int64_t n, int to_host) {
  if (n <= 0) return UR_STATUS_OK;
  if (!c->gpu) {
    cpu_move(c, e, n, to_host);
    return UR_STATUS_OK;
  }
  if (!ur__gpu()->cache->move)
    return ur__error(UR_STATUS_UNSUPPORTED, "cache: the CUDA backend has no cache kernels (%s)",
                     ur_cuda_error());
  return ur__gpu()->cache->move(stream, &c->io, e, n, to_host);
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
  if (cfg->staging_rows < 0)
    return ur__error(UR_STATUS_INVALID, "cache: staging_rows %lld; expected >= 0",
                     (long long)cfg->staging_rows);
  return UR_STATUS_OK;
}

ur_status ur_cache_new(ur_cache **out, ur_tbe *t, int32_t num_tables, const int32_t *tables,
                       const ur_cache_config *config) {
  *out = NULL;
  ur_status st = check_config(config);
  if (st) return st;
  int32_t T = ur_tbe_num_tables(t);
  if (num_tables < 1 || num_tables > T)
    return ur__error(UR_STATUS_INVALID, "cache: %d tables; expected 1..%d (the collection's)",
                     (int)num_tables, (int)T);
  if (num_tables >= (1 << 15))
    return ur__error(UR_STATUS_INVALID, "cache: %d tables; one cache takes fewer than 32768",
                     (int)num_tables);
  ur_cache *c = calloc(1, sizeof *c);
  if (!c) return ur__error(UR_STATUS_OOM, "cache: out of host memory");
  c->tbe = t;
  c->cfg = *config;
  c->nt = num_tables;
  c->T = T;
  c->F = ur_tbe_num_features(t);
  const ur_tbe_config *tc = ur__tbe_config(t);
  c->gpu = tc->device >= 0;
  c->device = tc->device;
  c->bounds = tc->bounds;
  c->nstate = ur_tbe_state_count(t);
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
    const char *name = ur_tbe_table_name(t, ti);
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
                     ur_tbe_table_name(t, tables[0]), (int)c->dim, ur_dtype_name((ur_dtype)c->dtype));
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
  c->key_bits = 1;
  while (c->key_bits < 63 && ((uint64_t)1 << c->key_bits) <= key) c->key_bits++;
  c->row_bytes = (size_t)c->dim * ur_dtype_size((ur_dtype)c->dtype);
  c->state_per_row = c->nstate == 0 ? 0 : tc->optim == UR_TBE_OPTIM_ROWWISE_ADAGRAD ? 1 : c->dim;
  c->nsets = 0;
  c->per_table = config->table_slots != NULL;
  c->cfg.table_slots = NULL; /* the caller's array: not kept */
  for (int32_t i = 0; i < num_tables; i++) {
    int64_t want = config->table_slots ? config->table_slots[i] : config->slots;
    if (want < 1) {
      c->tbe = NULL;
      ur_cache_free(c);
      return ur__error(UR_STATUS_INVALID, "cache: table '%s' is given %lld slots; expected 1 or more",
                       ur_tbe_table_name(t, tables[i]), (long long)want);
    }
    c->set_count[i] = (want + UR_CACHE_WAYS - 1) / UR_CACHE_WAYS;
    c->set_base[i] = config->table_slots ? c->nsets : 0;
    if (config->table_slots || i == 0) c->nsets += c->set_count[i];
  }
  c->S = c->nsets * UR_CACHE_WAYS;
  c->M = config->staging_rows > 0 ? config->staging_rows : 256;
  c->next_ticket = 1;
  c->tag = malloc(sizeof *c->tag * (size_t)c->S);
  c->stamp = calloc((size_t)c->S, sizeof *c->stamp);
  c->dirty = calloc((size_t)c->S, 1);
  /* LFU counts live where the decisions are made */
  int host_lfu = config->policy == UR_CACHE_LFU && !c->gpu;
  if (host_lfu) c->freq = calloc((size_t)key ? (size_t)key : 1, sizeof *c->freq);
  if (!c->tag || !c->stamp || !c->dirty || (host_lfu && !c->freq)) {
    c->tbe = NULL;
    ur_cache_free(c);
    return ur__error(UR_STATUS_OOM, "cache: out of host memory for %lld slots",
                     (long long)c->S);
  }
  for (int64_t i = 0; i < c->S; i++) c->tag[i] = EMPTY;
  c->io.row_bytes = (int64_t)c->row_bytes;
  c->io.state_per_row = c->state_per_row;
  c->io.nstate = c->nstate;
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
    if (c->gpu) {
      st = ur_tensor_new(&c->ptrs, UR_DTYPE_U8, 1, &bytes, UR_PLACE_DEVICE, c->device);
      if (!st) st = ur__gpu()->copy(NULL, ur_tensor_data(c->ptrs), hp, (size_t)bytes);
      if (!st) st = ur__gpu()->stream_sync(NULL);
    } else {
      st = ur_tensor_new(&c->ptrs, UR_DTYPE_U8, 1, &bytes, UR_PLACE_HOST, UR_LOC_CPU);
      if (!st) memcpy(ur_tensor_data(c->ptrs), hp, (size_t)bytes);
    }
  }
  free(hp);
  if (!st) {
    void **p = ur_tensor_data(c->ptrs);
    c->io.host_w = p;
    c->io.host_s1 = (float *const *)(p + num_tables);
    c->io.host_s2 = (float *const *)(p + 2 * num_tables);
    st = alloc_slots(c, c->S + 2 * c->M, 0);
  }
  if (!st && c->gpu) st = gpu_state_new(c);
  if (st) {
    ur_cache_free(c);
    return st;
  }
  *out = c;
  return UR_STATUS_OK;
}

static void free_batch(flight *b) {
  for (int k = 0; k < 8; k++)
    if (b->span[k]) ur__gpu()->event_free(b->span[k]);
  if (b->event) ur__gpu()->event_free(b->event);
  free(b->slots);
  free(b->staged);
  free(b->staged_keys);
  free(b->tconf);
  ur_tensor_free(b->dev);
  memset(b, 0, sizeof *b);
}

void ur__cache_orphan(ur_cache *c, ur_tbe *t) {
  if (c->tbe == t) c->tbe = NULL;
}

void ur_cache_free(ur_cache *c) {
  if (!c) return;
  if (c->tbe && c->sw) {
    /* best effort: the rows go home, and the collection reads its own storage again */
    if (ur_cache_flush(c) == UR_STATUS_OK) {
      for (int32_t i = 0; i < c->bound; i++)
        ur__tbe_redirect(c->tbe, c->tidx[i], NULL, NULL, NULL, NULL, NULL, 0);
    }
  } else if (c->gpu && ur__gpu()) {
    ur__gpu()->device_sync();
  }
  for (int r = 0; r < RING; r++) free_batch(&c->ring[r]);
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
  free(c->tag);
  free(c->stamp);
  free(c->dirty);
  free(c->freq);
  free(c->keys);
  free(c->tkeys);
  free(c->vidx);
  free(c->tvidx);
  free(c->uniq_of);
  free(c->order);
  free(c->res);
  free(c->evict);
  free(c->grp);
  free(c->ukeys);
  free(c->hvals);
  free(c->hoffs);
  free(c);
}

int64_t ur_cache_slots(const ur_cache *c) { return c->S; }
int64_t ur_cache_staging_rows(const ur_cache *c) { return c->M; }
int32_t ur_cache_num_tables(const ur_cache *c) { return c->nt; }
int32_t ur_cache_table(const ur_cache *c, int32_t i) { return i >= 0 && i < c->nt ? c->tidx[i] : -1; }
uint64_t ur_cache_bytes(const ur_cache *c) {
  return (uint64_t)c->R * row_moves(c);
}
int32_t ur_cache_in_flight(const ur_cache *c) {
  int32_t n = 0;
  for (int r = 0; r < RING; r++) n += c->ring[r].ticket && !c->ring[r].retired;
  return n;
}

static ur_status check_alive(const ur_cache *c) {
  if (!c->tbe)
    return ur__error(UR_STATUS_INVALID, "cache: its embedding collection was freed");
  return UR_STATUS_OK;
}

/* ---- LFU counts: halved once per decay period, lazily when a row is next read ---- */

static uint32_t freq_epoch(const ur_cache *c, int64_t ticket) {
  return c->cfg.decay_batches > 0 ? (uint32_t)(ticket / c->cfg.decay_batches) & 0xffffu : 0;
}

static uint32_t freq_now(uint32_t f, uint32_t epoch) { return ur__cache_freq_now(f, epoch); }

/* ---- one batch ---- */

/* LSD radix sort of (key, value index) by key; stable.  Results in *k, *v. */
static void radix_sort(uint64_t **k, int64_t **v, uint64_t **tk, int64_t **tv, int64_t n,
                       int bits) {
  enum { RB = 11, RN = 1 << RB };
  size_t cnt[RN];
  for (int shift = 0; shift < bits; shift += RB) {
    memset(cnt, 0, sizeof cnt);
    uint64_t *ks = *k, *kd = *tk;
    int64_t *vs = *v, *vd = *tv;
    for (int64_t i = 0; i < n; i++) cnt[(ks[i] >> shift) & (RN - 1)]++;
    size_t sum = 0;
    for (int d = 0; d < RN; d++) {
      size_t x = cnt[d];
      cnt[d] = sum;
      sum += x;
    }
    for (int64_t i = 0; i < n; i++) {
      size_t p = cnt[(ks[i] >> shift) & (RN - 1)]++;
      kd[p] = ks[i];
      vd[p] = vs[i];
    }
    *tk = ks;
    *tv = vs;
    *k = kd;
    *v = vd;
  }
}

typedef struct decide_job {
  ur_cache *c;
  int64_t ticket, floor;        /* slots stamped below floor are evictable */
  const int64_t *order;         /* unique indices in (set, key) order */
  const int64_t *grp;           /* group g covers order[grp[g] .. grp[g+1]) */
  const uint64_t *ukeys;
  int64_t *res;                 /* per unique: slot, or -1 (conflict); hits marked by bit 62 */
  int64_t *evict;               /* per unique: evicted key (EMPTY: none); dirty in bit 63 */
} decide_job;

#define HIT_BIT ((int64_t)1 << 62)

static void decide_range(void *ctx, size_t g0, size_t g1) {
  decide_job *j = ctx;
  ur_cache *c = j->c;
  uint32_t epoch = freq_epoch(c, j->ticket);
  for (size_t g = g0; g < g1; g++) {
    int64_t b = j->grp[g], e = j->grp[g + 1];
    uint64_t k0 = j->ukeys[j->order[b]];
    int64_t set = set_of(c, k0, table_of_key(c, k0));
    int64_t base = set * UR_CACHE_WAYS;
    /* hits first: they lock their ways before any miss looks for a victim */
    for (int64_t q = b; q < e; q++) {
      int64_t u = j->order[q];
      uint64_t key = j->ukeys[u];
      j->res[u] = -1;
      j->evict[u] = (int64_t)EMPTY;
      for (int w = 0; w < UR_CACHE_WAYS; w++)
        if (c->tag[base + w] == key) {
          c->stamp[base + w] = j->ticket;
          j->res[u] = (base + w) | HIT_BIT;
          break;
        }
    }
    for (int64_t q = b; q < e; q++) {
      int64_t u = j->order[q];
      if (j->res[u] >= 0) continue;
      int best = -1;
      for (int w = 0; w < UR_CACHE_WAYS; w++) {
        int64_t s = base + w;
        if (c->tag[s] == EMPTY) {
          best = w;
          break;
        }
        if (c->stamp[s] >= j->floor) continue;
        if (best < 0) {
          best = w;
          continue;
        }
        int64_t sb = base + best;
        if (c->freq) {
          uint32_t fs = freq_now(c->freq[c->tag[s]], epoch), fb = freq_now(c->freq[c->tag[sb]], epoch);
          if (fs < fb || (fs == fb && c->stamp[s] < c->stamp[sb])) best = w;
        } else if (c->stamp[s] < c->stamp[sb]) {
          best = w;
        }
      }
      if (best < 0) continue; /* conflict: staged */
      int64_t s = base + best;
      if (c->tag[s] != EMPTY)
        j->evict[u] = (int64_t)(c->tag[s] | (c->dirty[s] ? (uint64_t)1 << 63 : 0));
      c->tag[s] = j->ukeys[u];
      c->stamp[s] = j->ticket;
      c->dirty[s] = 0;
      j->res[u] = s;
    }
  }
}

static flight *ring_find(ur_cache *c, int64_t ticket) {
  for (int r = 0; r < RING; r++)
    if (c->ring[r].ticket == ticket) return &c->ring[r];
  return NULL;
}

/* The stream s waits for batch b's retire (its backward and staged write-backs). */
static ur_status wait_retired(ur_cache *c, ur_stream *s, flight *b) {
  if (c->gpu && b->event) {
    if (!ur__gpu()->stream_wait)
      return ur__error(UR_STATUS_UNSUPPORTED, "cache: the CUDA backend has no stream waits (%s)",
                       ur_cuda_error());
    return ur__gpu()->stream_wait(s ? s->handle : NULL, b->event);
  }
  return UR_STATUS_OK;
}

static int keys_meet(const uint64_t *a, int64_t na, const uint64_t *b, int64_t nb) {
  int64_t i = 0, k = 0;
  while (i < na && k < nb) {
    if (a[i] == b[k]) return 1;
    if (a[i] < b[k]) i++;
    else k++;
  }
  return 0;
}

/* Host copies of values and offsets when they live on the device. */
static ur_status host_ids(ur_cache *c, ur_stream *s, const ur_tensor *x, int64_t **buf,
                          int64_t *cap, const int64_t **out) {
  if (ur_tensor_place(x) != UR_PLACE_DEVICE) {
    if (c->gpu && ur_tensor_place(x) == UR_PLACE_MANAGED) {
      ur_status st = ur__gpu()->device_sync();
      if (st) return st;
    }
    *out = ur_tensor_data(x);
    return UR_STATUS_OK;
  }
  int64_t n = ur_tensor_numel(x);
  ur_status st = grow((void **)buf, cap, n + 1, sizeof(int64_t));
  if (!st) st = ur__gpu()->copy(s ? s->handle : NULL, *buf, ur_tensor_data(x), (size_t)n * 8);
  if (!st) st = ur__gpu()->stream_sync(s ? s->handle : NULL);
  *out = *buf;
  return st;
}

static ur_status check_ids_tensor(const ur_cache *c, const ur_tensor *x, const char *what) {
  if (ur_tensor_dtype(x) != UR_DTYPE_I64 || ur_tensor_ndim(x) != 1)
    return ur__error(UR_STATUS_INVALID, "cache: %s is %s with %d dimensions; expected i64 with 1",
                     what, ur_dtype_name(ur_tensor_dtype(x)), (int)ur_tensor_ndim(x));
  if (ur_tensor_place(x) == UR_PLACE_DEVICE && !c->gpu)
    return ur__error(UR_STATUS_INVALID, "cache: %s is in device memory but the collection runs "
                                        "on the CPU", what);
  return UR_STATUS_OK;
}

/* Makes room for staging rows: waits for the GPU, releases retired batches, and grows the
 * slot storage (the slots are kept; staged rows of no batch are live then). */
static ur_status grow_staging(ur_cache *c, int64_t need) {
  for (int r = 0; r < RING; r++)
    if (c->ring[r].ticket && !c->ring[r].retired && c->ring[r].nstaged)
      return ur__error(UR_STATUS_INVALID,
                       "cache: a batch needs %lld staging rows (the cache holds %lld) while batch "
                       "%lld, not yet retired, holds staged rows; retire it first",
                       (long long)need, (long long)c->M, (long long)c->ring[r].ticket);
  ur_status st = c->gpu ? ur__gpu()->device_sync() : UR_STATUS_OK;
  if (st) return st;
  int64_t M = c->M;
  while (M < need) M *= 2;
  if ((st = alloc_slots(c, c->S + 2 * M, c->S))) return st;
  c->M = M;
  return UR_STATUS_OK;
}

static ur_status bad_value(ur_cache *c, int64_t v, int64_t id, int32_t f, const int64_t *offs,
                           const int64_t *bag_start, int64_t batch) {
  int32_t ti = ur_tbe_feature_table(c->tbe, f);
  int64_t b0 = bag_start ? bag_start[f] : (int64_t)f * batch;
  int64_t b1 = bag_start ? bag_start[f + 1] : (int64_t)(f + 1) * batch, lo = b0;
  while (b1 - lo > 1) { /* the last bag of f starting at or before v */
    int64_t mid = lo + (b1 - lo) / 2;
    if (offs[mid] <= v) lo = mid;
    else b1 = mid;
  }
  return ur__error(UR_STATUS_INVALID,
                   "cache: table '%s' (feature '%s', sample %lld, value %lld) has no row %lld; "
                   "ids run 0..%lld",
                   ur_tbe_table_name(c->tbe, ti), ur_tbe_feature_name(c->tbe, f),
                   (long long)(lo - b0), (long long)v, (long long)id,
                   (long long)c->rows[c->ct_of[ti]] - 1);
}

/* ---- the parallel parts of a prepare ---- */

typedef struct gather_job {
  const ur_cache *c;
  const int64_t *vals;
  const ur__tbe_feature *feats;
  const int64_t *fpos, *fv0, *fv1;
  uint64_t *keys;
  int64_t *vidx;
} gather_job;

/* A feature's values into its place in its table's block: the row, or the table's row count
 * for an id out of range (it sorts last in the block and is dropped). */
static void gather_range(void *ctx, size_t f0, size_t f1) {
  const gather_job *j = ctx;
  for (size_t f = f0; f < f1; f++) {
    int32_t ct = j->c->ct_of[j->feats[f].table];
    if (ct < 0) continue;
    int64_t rows = j->c->rows[ct], at = j->fpos[f];
    for (int64_t v = j->fv0[f]; v < j->fv1[f]; v++, at++) {
      int64_t id = j->vals[v];
      j->keys[at] = id < 0 || id >= rows ? (uint64_t)rows : (uint64_t)id;
      j->vidx[at] = v;
    }
  }
}

typedef struct sort_job {
  const ur_cache *c;
  const int64_t *bstart;
  int64_t *bvalid, *bunique;
  uint64_t *keys;
  int64_t *vidx;
  uint64_t *tkeys;
  int64_t *tvidx;
  uint64_t *ukeys;      /* unique_range: the output */
  int64_t *uniq_of;
  int64_t *unused;
} sort_job;

/* Sorts each table's block by row (stable: value order within a row), back into keys/vidx;
 * counts its valid entries and its distinct rows. */
static void sort_range(void *ctx, size_t t0, size_t t1) {
  const sort_job *j = ctx;
  for (size_t ct = t0; ct < t1; ct++) {
    int64_t b = j->bstart[ct], n = j->bstart[ct + 1] - b;
    uint64_t rows = (uint64_t)j->c->rows[ct];
    int bits = 1;
    while (bits < 63 && ((uint64_t)1 << bits) <= rows) bits++;
    uint64_t *k = j->keys + b, *tk = j->tkeys + b;
    int64_t *v = j->vidx + b, *tv = j->tvidx + b;
    radix_sort(&k, &v, &tk, &tv, n, bits);
    if (k != j->keys + b) {
      memcpy(j->keys + b, k, sizeof(uint64_t) * (size_t)n);
      memcpy(j->vidx + b, v, sizeof(int64_t) * (size_t)n);
    }
    k = j->keys + b;
    int64_t valid = 0, uniq = 0;
    while (valid < n && k[valid] < rows) {
      if (valid == 0 || k[valid] != k[valid - 1]) uniq++;
      valid++;
    }
    j->bvalid[ct] = valid;
    j->bunique[ct] = uniq;
  }
}

/* The distinct keys of each block at its table's first unique; each entry's unique index. */
static void unique_range(void *ctx, size_t t0, size_t t1) {
  const sort_job *j = ctx;
  for (size_t ct = t0; ct < t1; ct++) {
    int64_t b = j->bstart[ct], u = j->bunique[ct] - 1;
    const uint64_t *k = j->keys + b;
    uint64_t base = (uint64_t)j->c->kbase[ct];
    for (int64_t i = 0; i < j->bvalid[ct]; i++) {
      if (i == 0 || k[i] != k[i - 1]) j->ukeys[++u] = base + k[i];
      j->uniq_of[b + i] = u;
    }
  }
}

typedef struct setsort_job {
  const ur_cache *c;
  const int64_t *bunique;       /* each table's first unique */
  int64_t U;
  const uint64_t *ukeys;
  int64_t *setv;
  uint64_t *sk, *stk;
  int64_t *order, *stv;
  int per_table;
} setsort_job;

/* The uniques of tables [t0, t1) (or all, shared) in (set, key) order into order. */
static void setsort_range(void *ctx, size_t t0, size_t t1) {
  const setsort_job *j = ctx;
  const ur_cache *c = j->c;
  if (t0 >= t1) return;
  int64_t u0 = j->per_table ? j->bunique[t0] : 0;
  int64_t u1 = j->per_table && (int32_t)t1 < c->nt ? j->bunique[t1] : j->U;
  int64_t base = j->per_table ? c->set_base[t0] : 0, span = 0;
  for (size_t ct = t0; ct < t1 && j->per_table; ct++) span += c->set_count[ct];
  if (!j->per_table) span = c->nsets;
  uint64_t *sk = j->sk + u0, *stk = j->stk + u0;
  int64_t *sv = j->order + u0, *stv = j->stv + u0;
  for (int64_t u = u0, ct = j->per_table ? (int64_t)t0 : 0; u < u1; u++) {
    while (ct + 1 < c->nt && u >= j->bunique[ct + 1]) ct++;
    j->setv[u] = set_of(c, j->ukeys[u], (int32_t)ct);
    sk[u - u0] = (uint64_t)(j->setv[u] - base);
    sv[u - u0] = u;
  }
  int bits = 1;
  while (bits < 63 && ((int64_t)1 << bits) < span) bits++;
  radix_sort(&sk, &sv, &stk, &stv, u1 - u0, bits);
  if (sv != j->order + u0) memcpy(j->order + u0, sv, sizeof(int64_t) * (size_t)(u1 - u0));
}

typedef struct map_job {
  const ur_cache *c;
  const int64_t *bstart, *bvalid, *vidx, *uniq_of, *res;
  int64_t *outv;
} map_job;

static void map_range(void *ctx, size_t t0, size_t t1) {
  const map_job *j = ctx;
  for (size_t ct = t0; ct < t1; ct++)
    for (int64_t i = j->bstart[ct]; i < j->bstart[ct] + j->bvalid[ct]; i++)
      j->outv[j->vidx[i]] = j->res[j->uniq_of[i]];
}

/* ---- the GPU's state and decisions ---- */

/* Records span event k of batch b on the stream. */
static ur_status span_mark(flight *b, int k, void *stream) {
  const ur_backend *g = ur__gpu();
  ur_status st = b->span[k] ? UR_STATUS_OK : g->event_new(&b->span[k]);
  return st ? st : g->event_record(b->span[k], stream);
}

/* Adds batch b's recorded spans to gpu_seconds (waiting for them to finish). */
static void account_gpu(ur_cache *c, flight *b) {
  const ur_backend *g = ur__gpu();
  double ms = 0;
  for (int part = 0; part < 2; part++) {
    int *timed = part ? &b->timed_r : &b->timed_p;
    if (!*timed) continue;
    *timed = 0;
    int k0 = part ? 6 : 0, k1 = part ? 8 : 6;
    if (g->event_sync(b->span[k1 - 1])) continue;
    for (int k = k0; k < k1; k += 2)
      if (!g->event_elapsed(b->span[k], b->span[k + 1], &ms)) c->gpu_seconds += 1e-3 * ms;
  }
}

static size_t info_words(const ur_cache *c) {
  return (size_t)UR__CI_TABLES + (size_t)c->nt * UR__CT_COUNT;
}

static ur_status dev_tensor(ur_cache *c, ur_tensor **out, ur_dtype d, int64_t n) {
  int64_t m = n > 0 ? n : 1;
  return ur_tensor_new(out, d, 1, &m, UR_PLACE_DEVICE, c->device);
}

/* The state (empty), the geometry and the info words in device memory. */
static ur_status gpu_state_new(ur_cache *c) {
  const ur_backend *g = ur__gpu();
  if (!g->cache->lookup)
    return ur__error(UR_STATUS_UNSUPPORTED, "cache: the CUDA backend has no cache kernels (%s)",
                     ur_cuda_error());
  int64_t nmeta = 3 * (int64_t)c->nt + 1 + (c->F + 1) / 2 + 1;
  int64_t *meta = calloc((size_t)nmeta, sizeof *meta);
  if (!meta) return ur__error(UR_STATUS_OOM, "cache: out of host memory");
  for (int32_t i = 0; i < c->nt; i++) {
    meta[i] = c->kbase[i];
    meta[c->nt + 1 + i] = c->set_base[i];
    meta[2 * c->nt + 1 + i] = c->set_count[i];
  }
  meta[c->nt] = (int64_t)c->total_keys;
  int32_t *fct = (int32_t *)(meta + 3 * c->nt + 1);
  const ur__tbe_feature *feats = ur__tbe_features(c->tbe);
  for (int32_t f = 0; f < c->F; f++) fct[f] = c->ct_of[feats[f].table];
  int64_t words = (int64_t)info_words(c) + c->F + 1;
  ur_status st = dev_tensor(c, &c->dmeta, UR_DTYPE_I64, nmeta);
  if (!st) st = dev_tensor(c, &c->dtag, UR_DTYPE_I64, c->S);
  if (!st) st = dev_tensor(c, &c->dstamp, UR_DTYPE_I64, c->S);
  if (!st) st = dev_tensor(c, &c->ddirty, UR_DTYPE_U8, c->S);
  if (!st && c->cfg.policy == UR_CACHE_LFU) st = dev_tensor(c, &c->dfreq, UR_DTYPE_I32, (int64_t)c->total_keys);
  if (!st) st = dev_tensor(c, &c->info_dev, UR_DTYPE_I64, (int64_t)info_words(c));
  if (!st) st = ur_tensor_new(&c->info_host, UR_DTYPE_I64, 1, &words, UR_PLACE_PINNED, UR_LOC_CPU);
  if (!st) st = g->copy(NULL, ur_tensor_data(c->dmeta), meta, (size_t)nmeta * 8);
  if (!st) st = g->fill(NULL, ur_tensor_data(c->dtag), (size_t)c->S, 8, (uint64_t)EMPTY);
  if (!st) st = g->fill(NULL, ur_tensor_data(c->dstamp), (size_t)c->S, 8, 0);
  if (!st) st = g->fill(NULL, ur_tensor_data(c->ddirty), (size_t)c->S, 1, 0);
  if (!st && c->dfreq) st = g->fill(NULL, ur_tensor_data(c->dfreq), (size_t)c->total_keys, 4, 0);
  if (!st) st = g->stream_sync(NULL);
  free(meta);
  if (st) return st;
  int64_t *dm = ur_tensor_data(c->dmeta);
  ur__cache_dev *d = &c->dev;
  d->kbase = dm;
  d->set_base = dm + c->nt + 1;
  d->set_count = dm + 2 * c->nt + 1;
  d->feat_ct = (const int32_t *)(dm + 3 * c->nt + 1);
  d->tag = ur_tensor_data(c->dtag);
  d->stamp = ur_tensor_data(c->dstamp);
  d->dirty = ur_tensor_data(c->ddirty);
  d->freq = c->dfreq ? ur_tensor_data(c->dfreq) : NULL;
  d->nt = c->nt;
  d->F = c->F;
  d->key_bits = c->key_bits;
  d->S = c->S;
  d->nsets = c->nsets;
  d->set_bits = 1;
  while (((int64_t)1 << d->set_bits) <= c->nsets) d->set_bits++;
  return UR_STATUS_OK;
}

/* The host copies of the tags (and dirty marks) from the device, after its work. */
static ur_status pull_state(ur_cache *c, int dirty) {
  const ur_backend *g = ur__gpu();
  ur_status st = g->device_sync();
  if (!st) st = g->copy(NULL, c->tag, c->dev.tag, (size_t)c->S * 8);
  if (!st && dirty) st = g->copy(NULL, c->dirty, c->dev.dirty, (size_t)c->S);
  if (!st) st = g->stream_sync(NULL);
  return st;
}

/* The first feature of a cached table whose values hold value v (for messages). */
static int32_t feature_at(const ur_cache *c, int64_t v, const int64_t *offs,
                          const int64_t *bag_start, int64_t batch) {
  const ur__tbe_feature *feats = ur__tbe_features(c->tbe);
  for (int32_t f = 0; f < c->F; f++) {
    int64_t fb0 = bag_start ? bag_start[f] : (int64_t)f * batch;
    int64_t fb1 = bag_start ? bag_start[f + 1] : (int64_t)(f + 1) * batch;
    if (c->ct_of[feats[f].table] >= 0 && offs[fb0] <= v && v < offs[fb1]) return f;
  }
  return 0;
}

/* The message of what lookup found wrong: the CPU's, from host copies of the ids. */
static ur_status lookup_error(ur_cache *c, ur_stream *s, const ur_tensor *values,
                              const ur_tensor *offsets, int64_t bags, const int64_t *bag_start,
                              int64_t batch, int64_t bad_v, int64_t bad_f) {
  const int64_t *vals = NULL, *offs = NULL;
  ur_status st = host_ids(c, s, values, &c->hvals, &c->cap_hv, &vals);
  if (!st) st = host_ids(c, s, offsets, &c->hoffs, &c->cap_ho, &offs);
  if (st) return st;
  int64_t n = ur_tensor_numel(values);
  if (bad_f == c->F || (bad_f < 0 && bad_v < 0))
    return ur__error(UR_STATUS_INVALID, "cache: offsets run from %lld to %lld; expected 0 to %lld "
                                        "(the values)", (long long)offs[0], (long long)offs[bags],
                     (long long)n);
  if (bad_f >= 0) {
    int64_t fb0 = bag_start ? bag_start[bad_f] : (int64_t)bad_f * batch;
    int64_t fb1 = bag_start ? bag_start[bad_f + 1] : (int64_t)(bad_f + 1) * batch;
    return ur__error(UR_STATUS_INVALID, "cache: feature '%s' spans values %lld..%lld of %lld; "
                                        "offsets must not decrease",
                     ur_tbe_feature_name(c->tbe, (int32_t)bad_f), (long long)offs[fb0],
                     (long long)offs[fb1], (long long)n);
  }
  return bad_value(c, bad_v, vals[bad_v], feature_at(c, bad_v, offs, bag_start, batch), offs,
                   bag_start, batch);
}

static ur_status decide_gpu(ur_cache *c, ur_stream *s, flight *B, int64_t tk,
                            const ur_tensor *values, const ur_tensor *offsets, int64_t bags,
                            const int64_t *bag_start, int64_t batch, ur_tensor *out);

/* Batch tk (ring entry B) decided by the GPU: lookup, settle the flights, decide, make room
 * for staged rows, place, move.  The host waits twice for s (after lookup and decide). */
static ur_status prepare_gpu(ur_cache *c, ur_stream *s, flight *B, int64_t tk,
                             const ur_tensor *values, const ur_tensor *offsets, int64_t bags,
                             const int64_t *bag_start, int64_t batch, ur_tensor *out) {
  const ur_backend *g = ur__gpu();
  void *sh = s ? s->handle : NULL;
  int64_t n = ur_tensor_numel(values);
  if (n >= INT32_MAX)
    return ur__error(UR_STATUS_INVALID, "cache: a batch of %lld values; the GPU's cache takes "
                                        "fewer than 2^31", (long long)n);
  if (!g->cache->lookup)
    return ur__error(UR_STATUS_UNSUPPORTED, "cache: the CUDA backend has no cache kernels (%s)",
                     ur_cuda_error());
  size_t need = 0;
  ur_status st = g->cache->scratch(&c->dev, n, &need);
  if (st) return st;
  if (need > c->scratch_bytes) {
    ur_tensor *t = NULL;
    int64_t want = (int64_t)(need + need / 4);
    if ((st = dev_tensor(c, &t, UR_DTYPE_U8, want))) return st;
    ur_tensor_free(c->scratch); /* a free waits for the device: no earlier prepare uses it */
    c->scratch = t;
    c->scratch_bytes = (size_t)want;
  }
  /* ids in pageable host memory: device copies, for this batch */
  ur_tensor *tmp[2] = {NULL, NULL};
  const ur_tensor *in[2] = {values, offsets};
  for (int k = 0; k < 2 && !st; k++)
    if (ur_tensor_place(in[k]) == UR_PLACE_HOST) {
      st = dev_tensor(c, &tmp[k], UR_DTYPE_I64, ur_tensor_numel(in[k]));
      if (!st) st = g->copy(sh, ur_tensor_data(tmp[k]), ur_tensor_data(in[k]), (size_t)ur_tensor_numel(in[k]) * 8);
      if (!st) in[k] = tmp[k];
    }
  if (!st) st = decide_gpu(c, s, B, tk, in[0], in[1], bags, bag_start, batch, out);
  if (tmp[0] || tmp[1]) {
    ur_status st2 = g->stream_sync(sh);
    if (!st) st = st2;
  }
  ur_tensor_free(tmp[0]);
  ur_tensor_free(tmp[1]);
  return st;
}

static ur_status decide_gpu(ur_cache *c, ur_stream *s, flight *B, int64_t tk,
                            const ur_tensor *values, const ur_tensor *offsets, int64_t bags,
                            const int64_t *bag_start, int64_t batch, ur_tensor *out) {
  const ur_backend *g = ur__gpu();
  void *sh = s ? s->handle : NULL;
  int64_t n = ur_tensor_numel(values);
  ur_status st = UR_STATUS_OK;
  int64_t *info = ur_tensor_data(c->info_host);
  ur__cache_job j;
  memset(&j, 0, sizeof j);
  j.vals = ur_tensor_data(values);
  j.offs = ur_tensor_data(offsets);
  j.n = n;
  j.bags = bags;
  j.batch = batch;
  if (bag_start) {
    int64_t *hb = info + info_words(c);
    memcpy(hb, bag_start, sizeof(int64_t) * ((size_t)c->F + 1));
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
  j.info = ur_tensor_data(c->info_dev);
  j.info_host = info;
  account_gpu(c, B); /* its last batch's spans, before they are recorded again */
  /* 1. lookup */
  if ((st = span_mark(B, 0, sh)) || (st = g->cache->lookup(sh, &c->dev, &j)) ||
      (st = span_mark(B, 1, sh)) || (st = g->stream_sync(sh)))
    return st;
  c->stats[c->nt].bytes_ids += 8 * (uint64_t)info_words(c) + (bag_start ? 8 * ((uint64_t)c->F + 1) : 0);
  if (info[UR__CI_BAD_F] >= 0 || (info[UR__CI_BAD_V] >= 0 && j.bounds_fatal))
    return lookup_error(c, s, values, offsets, bags, bag_start, batch, info[UR__CI_BAD_V],
                        info[UR__CI_BAD_F]);
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
  if ((st = span_mark(B, 2, sh)) || (st = g->cache->decide(sh, &c->dev, &j)) ||
      (st = span_mark(B, 3, sh)) || (st = g->stream_sync(sh)))
    return st;
  c->stats[c->nt].bytes_ids += 8 * (uint64_t)info_words(c);
  j.nwb = info[UR__CI_NWB];
  j.nfill = info[UR__CI_NFILL];
  j.nconf = info[UR__CI_NCONF];
  if (!B->tconf && !(B->tconf = calloc((size_t)c->nt, sizeof *B->tconf)))
    return ur__error(UR_STATUS_OOM, "cache: out of host memory");
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
  /* Growing was checked possible before the decisions; failing now (memory, the device)
   * leaves the cache unusable, as any failed device step would. */
  if (j.nconf > c->M && (st = grow_staging(c, j.nconf))) return st;
  /* 3. place and move */
  int64_t words = 2 * (j.nwb + j.nfill + j.nconf) + (j.U - j.nconf);
  if (!B->dev || ur_tensor_numel(B->dev) < words) {
    ur_tensor_free(B->dev);
    B->dev = NULL;
    if ((st = dev_tensor(c, &B->dev, UR_DTYPE_I64, words + words / 2 + 1024))) return st;
  }
  j.lists = ur_tensor_data(B->dev);
  j.row_ids = ur_tensor_data(c->srow);
  j.sbase = c->S + (tk & 1) * c->M;
  j.out = ur_tensor_data(out);
  if ((st = span_mark(B, 4, sh)) || (st = g->cache->place(sh, &c->dev, &j))) return st;
  if ((st = move(c, sh, j.lists, j.nwb, 1))) return st;
  if ((st = move(c, sh, j.lists + 2 * j.nwb, j.nfill + j.nconf, 0))) return st;
  if ((st = span_mark(B, 5, sh))) return st;
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
                           const ur_tensor *offsets, const int64_t *bpf, ur_tensor *out,
                           int64_t *ticket) {
  *ticket = 0;
  ur_status st = check_alive(c);
  if (st) return st;
  if (!values || !offsets || !out)
    return ur__error(UR_STATUS_INVALID, "cache: values, offsets and out are required");
  if ((st = check_ids_tensor(c, values, "values")) || (st = check_ids_tensor(c, offsets, "offsets")) ||
      (st = check_ids_tensor(c, out, "out")))
    return st;
  int64_t n = ur_tensor_numel(values), bags = ur_tensor_numel(offsets) - 1;
  if (ur_tensor_numel(out) != n)
    return ur__error(UR_STATUS_INVALID, "cache: out holds %lld ids for %lld values; expected one each",
                     (long long)ur_tensor_numel(out), (long long)n);
  if (ur_tensor_place(out) == UR_PLACE_HOST && c->gpu)
    return ur__error(UR_STATUS_INVALID, "cache: out is in host memory, which the collection's GPU "
                                        "cannot read");
  if (bags < 0) return ur__error(UR_STATUS_INVALID, "cache: offsets is empty; expected bags + 1");
  int64_t *bag_start = NULL, batch = 0;
  if (bpf) {
    bag_start = malloc(sizeof(int64_t) * ((size_t)c->F + 1));
    if (!bag_start) return ur__error(UR_STATUS_OOM, "cache: out of host memory");
    bag_start[0] = 0;
    for (int32_t f = 0; f < c->F; f++) {
      if (bpf[f] < 0) {
        free(bag_start);
        return ur__error(UR_STATUS_INVALID, "cache: feature '%s' has batch %lld; expected >= 0",
                         ur_tbe_feature_name(c->tbe, f), (long long)bpf[f]);
      }
      bag_start[f + 1] = bag_start[f] + bpf[f];
    }
    if (bag_start[c->F] != bags) {
      int64_t sum = bag_start[c->F];
      free(bag_start);
      return ur__error(UR_STATUS_INVALID,
                       "cache: batch_per_feature sums to %lld bags but offsets hold %lld",
                       (long long)sum, (long long)bags);
    }
  } else if (bags % c->F) {
    return ur__error(UR_STATUS_INVALID, "cache: %lld bags do not split evenly over %d features",
                     (long long)bags, (int)c->F);
  } else {
    batch = bags / c->F;
  }
  double t0 = now_s();
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
  const int64_t *vals = NULL, *offs = NULL;
  /* after the previous prepare's copies, whatever stream that ran on (write-backs of rows this
   * one may load, and the scratch); through the cache's own event: that stream may be gone */
  if (!st && c->gpu && c->last_ready && ur__gpu()->stream_wait)
    st = ur__gpu()->stream_wait(s ? s->handle : NULL, c->last_ready);
  if (!st && c->gpu) {
    int64_t tk = c->next_ticket;
    st = prepare_gpu(c, s, B, tk, values, offsets, bags, bag_start, batch, out);
    free(bag_start);
    c->seconds += now_s() - t0;
    if (st) return st;
    *ticket = tk;
    return UR_STATUS_OK;
  }
  if (!st) st = host_ids(c, s, values, &c->hvals, &c->cap_hv, &vals);
  if (!st) st = host_ids(c, s, offsets, &c->hoffs, &c->cap_ho, &offs);
  if (!st && (offs[0] != 0 || offs[bags] != n))
    st = ur__error(UR_STATUS_INVALID, "cache: offsets run from %lld to %lld; expected 0 to %lld "
                                      "(the values)", (long long)offs[0], (long long)offs[bags],
                   (long long)n);
  if (st) {
    free(bag_start);
    return st;
  }
  int64_t tk = c->next_ticket;
  /* 1. keys of the cached values */
  if ((st = grow((void **)&c->keys, &c->cap_n, n + 1, 8))) {
    free(bag_start);
    return st;
  }
  {
    int64_t cap = c->cap_n;
    void *p;
    if (!(p = realloc(c->tkeys, (size_t)cap * 8)) || !(c->tkeys = p) ||
        !(p = realloc(c->vidx, (size_t)cap * 8)) || !(c->vidx = p) ||
        !(p = realloc(c->tvidx, (size_t)cap * 8)) || !(c->tvidx = p) ||
        !(p = realloc(c->uniq_of, (size_t)cap * 8)) || !(c->uniq_of = p)) {
      free(bag_start);
      return ur__error(UR_STATUS_OOM, "cache: out of host memory for %lld ids", (long long)n);
    }
  }
  /* Each cached table's values form a block of (row, value index) pairs, table-major; the
   * blocks are gathered, sorted and deduplicated in parallel, one table per task, and their
   * concatenation is in ascending key order (a key is the table's base plus the row). */
  const ur__tbe_feature *feats = ur__tbe_features(c->tbe);
  int64_t *blk = calloc(4 * (size_t)c->nt + 4 + 3 * (size_t)c->F, sizeof(int64_t));
  if (!blk) {
    free(blk);
    free(bag_start);
    return ur__error(UR_STATUS_OOM, "cache: out of host memory");
  }
  int64_t *bstart = blk, *bvalid = blk + c->nt + 1, *bunique = blk + 2 * c->nt + 2;
  int64_t *fpos = blk + 4 * c->nt + 4, *fv0 = fpos + c->F, *fv1 = fv0 + c->F;
  for (int32_t f = 0; f < c->F && !st; f++) {
    int32_t ct = c->ct_of[feats[f].table];
    if (ct < 0) continue;
    int64_t fb0 = bag_start ? bag_start[f] : (int64_t)f * batch;
    int64_t fb1 = bag_start ? bag_start[f + 1] : (int64_t)(f + 1) * batch;
    int64_t v0 = offs[fb0], v1 = offs[fb1];
    if (v0 < 0 || v1 < v0 || v1 > n) {
      st = ur__error(UR_STATUS_INVALID, "cache: feature '%s' spans values %lld..%lld of %lld; "
                                        "offsets must not decrease",
                     ur_tbe_feature_name(c->tbe, f), (long long)v0, (long long)v1, (long long)n);
      break;
    }
    fv0[f] = v0;
    fv1[f] = v1;
    fpos[f] = bstart[ct + 1]; /* within its table's block, for now */
    bstart[ct + 1] += v1 - v0;
  }
  if (st) {
    free(blk);
    free(bag_start);
    return st;
  }
  for (int32_t ct = 0; ct < c->nt; ct++) bstart[ct + 1] += bstart[ct];
  for (int32_t f = 0; f < c->F; f++) {
    int32_t ct = c->ct_of[feats[f].table];
    if (ct >= 0) fpos[f] += bstart[ct];
  }
  gather_job gj = {c, vals, feats, fpos, fv0, fv1, c->keys, c->vidx};
  ur__parallel_for((size_t)c->F, 1, gather_range, &gj);
  if (c->bounds == UR_TBE_BOUNDS_FATAL) {
    /* the first bad id in value order (features are key-major, so feature order) */
    for (int32_t f = 0; f < c->F && !st; f++) {
      int32_t ct = c->ct_of[feats[f].table];
      if (ct < 0) continue;
      for (int64_t j = fpos[f]; j < fpos[f] + (fv1[f] - fv0[f]); j++)
        if (c->keys[j] >= (uint64_t)c->rows[ct]) {
          st = bad_value(c, c->vidx[j], vals[c->vidx[j]], f, offs, bag_start, batch);
          break;
        }
    }
    if (st) {
      free(blk);
      free(bag_start);
      return st;
    }
  }
  sort_job sj = {c, bstart, bvalid, bunique, c->keys, c->vidx, c->tkeys, c->tvidx, NULL, NULL, NULL};
  ur__parallel_for((size_t)c->nt, 1, sort_range, &sj);
  int64_t m = 0, U = 0;
  for (int32_t ct = 0; ct < c->nt; ct++) {
    m += bvalid[ct];
    int64_t u = bunique[ct];
    bunique[ct] = U; /* now the table's first unique */
    U += u;
  }
  uint64_t *k = c->keys, *tkk = c->tkeys;
  int64_t *vi = c->vidx, *tv = c->tvidx;
  if ((st = grow((void **)&c->ukeys, &c->cap_u, U + 1, 8))) {
    free(blk);
    free(bag_start);
    return st;
  }
  {
    int64_t cap = c->cap_u;
    void *p;
    if (!(p = realloc(c->order, (size_t)cap * 8)) || !(c->order = p) ||
        !(p = realloc(c->res, (size_t)cap * 8)) || !(c->res = p) ||
        !(p = realloc(c->evict, (size_t)cap * 8)) || !(c->evict = p)) {
      free(blk);
      free(bag_start);
      return ur__error(UR_STATUS_OOM, "cache: out of host memory");
    }
  }
  sj.ukeys = c->ukeys;
  sj.uniq_of = c->uniq_of;
  ur__parallel_for((size_t)c->nt, 1, unique_range, &sj);
  /* scratch for the set order below: keys and tkeys, tvidx (each holds n + 1 >= U) */
  tkk = c->tkeys;
  tv = c->tvidx;
  (void)m;
  /* 3. locks: which earlier batches still hold their rows */
  int meet[RING];
  for (int r = 0; r < RING; r++) {
    const flight *b = &c->ring[r];
    meet[r] = b->ticket && b != B && b->nstaged && keys_meet(c->ukeys, U, b->staged_keys, b->nstaged);
  }
  int64_t floor = 0;
  if ((st = settle(c, s, B, tk, U, meet, &floor))) {
    free(blk);
    free(bag_start);
    return st;
  }
  for (int32_t f = 0; f < c->F; f++)
    if (c->ct_of[feats[f].table] >= 0) c->stats[c->ct_of[feats[f].table]].lookups += fv1[f] - fv0[f];
  /* LFU counts */
  if (c->freq) {
    uint32_t ep = freq_epoch(c, tk);
    for (int64_t u = 0; u < U; u++) {
      uint32_t *f = &c->freq[c->ukeys[u]];
      uint32_t x = freq_now(*f, ep) + 1;
      *f = (ep << 16) | (x > 0xffffu ? 0xffffu : x);
    }
  }
  /* 4. (set, key) order: a stable radix sort on the set (the keys are ascending) */
  int64_t *setv = c->evict; /* scratch: the set of each unique, until the decisions */
  int64_t ng = 0;
  {
    /* k, tkk and tv are free now, each of at least m >= U entries.  Tables with sets of their
     * own are sorted each on its own (in parallel; their set ranges follow the table order);
     * a shared pool of sets as one range. */
    setsort_job sj2 = {c, bunique, U, c->ukeys, setv, k, tkk, c->order, tv, c->per_table};
    ur__parallel_for(c->per_table ? (size_t)c->nt : 1, 1, setsort_range, &sj2);
    for (int64_t q = 0; q < U; q++)
      if (q == 0 || setv[c->order[q]] != setv[c->order[q - 1]]) ng++;
  }
  if ((st = grow((void **)&c->grp, &c->cap_g, ng + 2, 8))) {
    free(blk);
    free(bag_start);
    return st;
  }
  ng = 0;
  for (int64_t q = 0; q < U; q++)
    if (q == 0 || setv[c->order[q]] != setv[c->order[q - 1]]) c->grp[ng++] = q;
  c->grp[ng] = U;
  decide_job dj = {c, tk, floor, c->order, c->grp, c->ukeys, c->res, c->evict};
  ur__parallel_for((size_t)ng, 64, decide_range, &dj);
  /* 5. staging rows, in (set, key) order */
  int64_t nconf = 0, nfill = 0, nwb = 0;
  for (int64_t u = 0; u < U; u++) {
    if (c->res[u] < 0) nconf++;
    else if (!(c->res[u] & HIT_BIT)) nfill++;
    if (c->evict[u] != (int64_t)EMPTY && ((uint64_t)c->evict[u] >> 63)) nwb++;
  }
  /* Growing was checked possible before the decisions; failing now (memory, the device)
   * leaves the cache unusable, as any failed device step would. */
  if (nconf > c->M && (st = grow_staging(c, nconf))) {
    free(blk);
    free(bag_start);
    return st;
  }
  int half = (int)(tk & 1);
  int64_t sbase = c->S + (int64_t)half * c->M;
  /* lists: write-backs, then fills and staging loads */
  int64_t nload = nfill + nconf, nlist = 2 * (nwb + nload);
  int64_t *outv = ur_tensor_data(out);
  int64_t *lists = malloc(sizeof(int64_t) * (size_t)(nlist ? nlist : 1));
  if (!lists) {
    st = ur__error(UR_STATUS_OOM, "cache: out of host memory");
    goto fail;
  }
  if ((st = grow((void **)&B->slots, &B->cap_slots, U - nconf + 1, 8)) ||
      (st = grow((void **)&B->staged, &B->cap_staged, 2 * nconf + 2, 8))) {
    free(lists);
    goto fail;
  }
  {
    void *p = realloc(B->staged_keys, sizeof(uint64_t) * (size_t)(nconf + 1));
    if (!p) {
      free(lists);
      st = ur__error(UR_STATUS_OOM, "cache: out of host memory");
      goto fail;
    }
    B->staged_keys = p;
  }
  int64_t iw = 0, il = 2 * nwb, is = 2 * (nwb + nfill), ns = 0, nsl = 0, conf = 0;
  int64_t *srow = ur_tensor_data(c->srow);
  /* in key order (u ascending: table by table), which is also the staging rows' order */
  for (int64_t u = 0, ct = 0; u < U; u++) {
    while (ct + 1 < c->nt && u >= bunique[ct + 1]) ct++;
    uint64_t key = c->ukeys[u];
    counters *cs = &c->stats[ct];
    uint64_t pair = ((uint64_t)ct << UR__CACHE_ROW_BITS) | (key - (uint64_t)c->kbase[ct]);
    cs->unique++;
    if (c->evict[u] != (int64_t)EMPTY) {
      uint64_t ek = (uint64_t)c->evict[u] & ~((uint64_t)1 << 63);
      int32_t ect = table_of_key(c, ek);
      c->stats[ect].evictions++;
      if ((uint64_t)c->evict[u] >> 63) {
        c->stats[ect].writebacks++;
        c->stats[ect].bytes_out += row_moves(c);
        lists[iw++] = (int64_t)pair_of(c, ek);
        lists[iw++] = c->res[u];
      }
    }
    if (c->res[u] < 0) {
      int64_t r = sbase + conf++;
      cs->conflicts++;
      cs->bytes_in += row_moves(c);
      lists[is++] = (int64_t)pair;
      lists[is++] = r;
      srow[r] = (int64_t)(pair & UR__CACHE_ROW_MASK);
      B->staged[2 * ns] = (int64_t)pair;
      B->staged[2 * ns + 1] = r;
      ns++;
      c->res[u] = r;
    } else if (c->res[u] & HIT_BIT) {
      c->res[u] &= ~HIT_BIT;
      cs->hits++;
      B->slots[nsl++] = c->res[u];
    } else {
      cs->misses++;
      cs->bytes_in += row_moves(c);
      lists[il++] = (int64_t)pair;
      lists[il++] = c->res[u];
      srow[c->res[u]] = (int64_t)(pair & UR__CACHE_ROW_MASK);
      B->slots[nsl++] = c->res[u];
    }
  }
  /* staged keys ascending, for later batches' hazard checks */
  {
    int64_t w = 0;
    for (int64_t u = 0; u < U; u++)
      if (c->res[u] >= c->S) B->staged_keys[w++] = c->ukeys[u];
  }
  /* slot ids of every value: the cached ones from their key, the others as they are */
  for (int64_t v = 0; v < n; v++) outv[v] = vals[v];
  for (int32_t f = 0; f < c->F; f++) {
    if (c->ct_of[feats[f].table] < 0) continue;
    int64_t fb0 = bag_start ? bag_start[f] : (int64_t)f * batch;
    int64_t fb1 = bag_start ? bag_start[f + 1] : (int64_t)(f + 1) * batch;
    for (int64_t v = offs[fb0]; v < offs[fb1]; v++) outv[v] = -1; /* bad ids stay -1 */
  }
  map_job mj = {c, bstart, bvalid, vi, c->uniq_of, c->res, outv};
  ur__parallel_for((size_t)c->nt, 1, map_range, &mj);
  for (int32_t ct = 0; ct < c->nt; ct++) c->stats[ct].batches++;
  c->stats[c->nt].batches++;
  B->ticket = tk;
  B->retired = B->trained = 0;
  B->stream = NULL;
  B->nslots = nsl;
  B->nstaged = ns;
  c->next_ticket++;
  /* 6. the moves: write-backs, then loads */
  move(c, NULL, lists, nwb, 1);
  move(c, NULL, lists + 2 * nwb, nload, 0);
  free(lists);
  c->seconds += now_s() - t0;
  free(blk);
  free(bag_start);
  *ticket = tk;
  return UR_STATUS_OK;
fail:
  free(blk);
  free(bag_start);
  return st;
}

ur_status ur_cache_retire(ur_stream *s, ur_cache *c, int64_t ticket, int32_t trained) {
  ur_status st = check_alive(c);
  if (st) return st;
  flight *b = ticket > 0 ? ring_find(c, ticket) : NULL;
  if (!b || b->retired)
    return ur__error(UR_STATUS_INVALID, "cache: batch %lld is not prepared and in flight%s",
                     (long long)ticket, b ? " (retired already)" : "");
  double t0 = now_s();
  if (trained && !c->gpu) {
    for (int64_t i = 0; i < b->nslots; i++) c->dirty[b->slots[i]] = 1;
    for (int64_t i = 0; i < b->nstaged; i++) {
      int32_t ct = (int32_t)((uint64_t)b->staged[2 * i] >> UR__CACHE_ROW_BITS);
      c->stats[ct].bytes_out += row_moves(c);
    }
    move(c, NULL, b->staged, b->nstaged, 1);
  } else if (trained) {
    int64_t *dev = ur_tensor_data(b->dev);
    void *sh = s ? s->handle : NULL;
    for (int32_t ct = 0; ct < c->nt; ct++) c->stats[ct].bytes_out += (uint64_t)b->tconf[ct] * row_moves(c);
    st = span_mark(b, 6, sh);
    if (!st) st = ur__gpu()->cache->mark(sh, c->dev.dirty, dev + b->slots_at, b->nslots);
    if (!st) st = move(c, sh, dev + b->list_at, b->nstaged, 1);
    if (!st) st = span_mark(b, 7, sh);
    if (!st) b->timed_r = 1;
  }
  if (!st && c->gpu) {
    if (!b->event) st = ur__gpu()->event_new(&b->event);
    if (!st) st = ur__gpu()->event_record(b->event, s ? s->handle : NULL);
  }
  if (st) return st;
  b->retired = 1;
  b->trained = trained != 0;
  b->stream = s;
  c->seconds += now_s() - t0;
  return UR_STATUS_OK;
}

ur_status ur_cache_flush(ur_cache *c) {
  ur_status st = check_alive(c);
  if (st) return st;
  double t0 = now_s();
  if (c->gpu && (st = pull_state(c, 1))) return st;
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
    if (!c->gpu) {
      cpu_move(c, e, nd, 1);
    } else {
      ur_tensor *d = NULL;
      int64_t words = 2 * nd;
      st = ur_tensor_new(&d, UR_DTYPE_I64, 1, &words, UR_PLACE_DEVICE, c->device);
      if (!st) st = ur__gpu()->copy(NULL, ur_tensor_data(d), e, (size_t)words * 8);
      if (!st) st = move(c, NULL, ur_tensor_data(d), nd, 1);
      if (!st) st = ur__gpu()->device_sync();
      ur_tensor_free(d);
    }
    free(e);
    if (!st && c->gpu) st = ur__gpu()->fill(NULL, c->dev.dirty, (size_t)c->S, 1, 0);
    if (!st && c->gpu) st = ur__gpu()->stream_sync(NULL);
    if (st) return st;
    for (int64_t i = 0; i < c->S; i++) c->dirty[i] = 0;
  }
  c->seconds += now_s() - t0;
  return UR_STATUS_OK;
}

ur_status ur_cache_invalidate(ur_cache *c) {
  ur_status st = check_alive(c);
  if (st) return st;
  if (ur_cache_in_flight(c))
    return ur__error(UR_STATUS_INVALID, "cache: %d batches are in flight; retire them before "
                                        "emptying the cache", (int)ur_cache_in_flight(c));
  if ((st = ur_cache_flush(c))) return st;
  for (int r = 0; r < RING; r++) c->ring[r].ticket = 0;
  for (int64_t i = 0; i < c->S; i++) {
    c->tag[i] = EMPTY;
    c->stamp[i] = 0;
  }
  if (c->freq) memset(c->freq, 0, sizeof *c->freq * (size_t)(c->total_keys ? c->total_keys : 1));
  if (c->gpu) {
    const ur_backend *g = ur__gpu();
    st = g->fill(NULL, c->dev.tag, (size_t)c->S, 8, (uint64_t)EMPTY);
    if (!st) st = g->fill(NULL, c->dev.stamp, (size_t)c->S, 8, 0);
    if (!st && c->dev.freq) st = g->fill(NULL, c->dev.freq, (size_t)c->total_keys, 4, 0);
    if (!st) st = g->stream_sync(NULL);
  }
  return st;
}

ur_status ur_cache_stats_get(const ur_cache *c, int32_t table, ur_cache_stats *out) {
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
  out->bytes_ids = t->bytes_ids;
  out->seconds = c->seconds;
  if (c->gpu) {
    for (int r = 0; r < RING; r++) account_gpu((ur_cache *)c, (flight *)&c->ring[r]);
    out->gpu_seconds = c->gpu_seconds;
  }
  return UR_STATUS_OK;
}

void ur_cache_reset_stats(ur_cache *c) {
  memset(c->stats, 0, sizeof *c->stats * ((size_t)c->nt + 1));
  c->seconds = c->gpu_seconds = 0;
  for (int r = 0; r < RING; r++) c->ring[r].timed_p = c->ring[r].timed_r = 0;
}

ur_status ur_cache_contains(const ur_cache *c, int32_t table, const int64_t *ids, int64_t n,
                            int64_t *slots) {
  if (table < 0 || table >= c->nt)
    return ur__error(UR_STATUS_INVALID, "cache: table %d; expected 0..%d", (int)table,
                     (int)c->nt - 1);
  if (c->gpu) {
    /* the tags are the device's: the host's copy, refreshed (not part of the cache's state) */
    ur_status st = pull_state((ur_cache *)c, 0);
    if (st) return st;
  }
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
  if (!e) return ur__error(UR_STATUS_INVALID, "stream_wait_event: no event");
  if (!ur__gpu() || !e->handle || !e->recorded) return UR_STATUS_OK;
  if (!ur__gpu()->stream_wait)
    return ur__error(UR_STATUS_UNSUPPORTED, "stream_wait_event: the CUDA backend has no stream "
                                            "waits (%s)", ur_cuda_error());
  return ur__gpu()->stream_wait(s ? s->handle : NULL, e->handle);
}
