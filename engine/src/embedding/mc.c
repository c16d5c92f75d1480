/* mc.c: managed collisions, raw ids to rows: the maps' construction and checks, the host's
 * schedule of rounds (which run before a batch, decided from what the device said after the
 * previous one), the sizing of the candidates' maps, the rows a round reassigned, statistics,
 * and the state for checkpoints.  The work of a batch and of a round is the backend's
 * (m->be->mc: mc_cpu.c, the reference, or kernels/mc.cu), on the maps where they live; the
 * host follows one path for both, so both make the same decisions.
 *
 * Between batches the host needs each table's candidate count: the device copies its counters
 * to pinned memory after every batch, and the next batch waits for that copy only (not for the
 * training work queued after it).  A candidates' map is sized for the candidates counted so
 * far plus twice the most ids one batch of the table held; a batch whose ids could overfill it
 * is not counted as candidates at all (the backend decides that before counting), so the count
 * never depends on the order of concurrent inserts.  The first batch's ids per table are read
 * exactly (one wait) to size the maps. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "embedding/mc.h"

#define MIN_HEADROOM 1024 /* candidate slots a table keeps free beyond its counted candidates */
/* The bound of a restored state's batch_max (its slots are bounded by what that and max_candidates
 * can need, most_slots): a corrupted one fails by name, not as a huge allocation. */
#define MAX_BATCH_IDS ((int64_t)1 << 40)

typedef struct mc_tab {
  ur_tensor *ids, *counts, *window, *last, *index, *ckeys, *ccount, *clast;
  int64_t occupied;       /* rows 0..occupied-1 hold ids */
  int64_t nmax;           /* the most ids of this table one batch held */
  int sized;              /* nmax was read exactly at least once */
  int64_t info[UR__MI_COUNT]; /* as the device said after the last batch or round */
  int64_t base[UR__MI_COUNT]; /* info at the last stats reset */
  int64_t *re, nre, cap_re;   /* rows reassigned by the last remap's or round's round */
  int64_t rounds, fills, admissions, evictions;
  double seconds, round_seconds;
} mc_tab;

struct ur_mc {
  ur_mc_config cfg;
  /* Where the maps live (device memory of the GPU, or host memory) and the backend of that
   * memory, taken once here. */
  ur_place home;
  const ur_backend *be;
  int32_t T, F;
  ur_mc_table_config *tc; /* names owned */
  mc_tab *tb;
  ur__mc_table *desc;     /* host: the descriptors as the backend reads them */
  ur_tensor *ddesc;       /* GPU: their copy in device memory */
  int32_t *feat_table;    /* host [F] */
  int64_t *hbag;          /* host [F + 1]: one call's bag starts */
  ur_tensor *dfeat, *dbag, *mult, *info, *info_host, *admit;
  void *event;            /* recorded after the counters' copy (GPU) */
  int copied;             /* a copy of the counters is on its way to info_host */
  int64_t step;
};

size_t ur_sizeof_mc_table_config(void) { return sizeof(ur_mc_table_config); }
size_t ur_sizeof_mc_config(void) { return sizeof(ur_mc_config); }
size_t ur_sizeof_mc_stats(void) { return sizeof(ur_mc_stats); }
size_t ur_sizeof_mc_state(void) { return sizeof(ur_mc_state); }

static const char *policy_names[UR_MC_POLICY_COUNT] = {"lfu", "lru", "distance_lfu"};

const char *ur_mc_policy_name(ur_mc_policy p) {
  return (unsigned)p < UR_MC_POLICY_COUNT ? policy_names[p] : "?";
}

ur_status ur_mc_policy_parse(const char *s, ur_mc_policy *out) {
  UR__ARGS(s, out);
  int i = ur__name_index(policy_names, UR_MC_POLICY_COUNT, s);
  if (i >= 0) {
    *out = (ur_mc_policy)i;
    return UR_STATUS_OK;
  }
  return ur__error(UR_STATUS_INVALID, "mc: policy '%s'; expected lfu, lru or distance_lfu",
                   s ? s : "(null)");
}

/* The candidate slots a table keeps beyond its candidates: twice its largest batch's ids. */
static int64_t headroom(int64_t nmax) { return 2 * nmax > MIN_HEADROOM ? 2 * nmax : MIN_HEADROOM; }

static int64_t pow2_at_least(int64_t n) {
  int64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

static ur_status home_tensor(const ur_mc *m, ur_tensor **out, ur_dtype d, int64_t n) {
  return ur_tensor_new(out, d, 1, &n, m->home, m->home == UR_PLACE_DEVICE ? m->cfg.device : UR_LOC_CPU);
}

static const char *tname(const ur_mc *m, int32_t t) { return m->tc[t].name; }

static ur_status check_table_index(const ur_mc *m, int32_t t, int all_ok, const char *what) {
  if ((all_ok && t == -1) || (t >= 0 && t < m->T)) return UR_STATUS_OK;
  return ur__error(UR_STATUS_INVALID, "mc: %s: table %d does not exist; expected 0..%d%s", what,
                   (int)t, (int)m->T - 1, all_ok ? " or -1 (every table)" : "");
}

/* ---- construction ---- */

static ur_status check_table(const ur_mc_table_config *c, const char *name) {
  if (c->rows < 2 || c->rows > ((int64_t)1 << 32))
    return ur__error(UR_STATUS_INVALID, "mc: table '%s' has %lld rows; expected 2 .. 2^32", name,
                     (long long)c->rows);
  if (c->fallback_rows < 1 || c->fallback_rows >= c->rows)
    return ur__error(UR_STATUS_INVALID,
                     "mc: table '%s' has %lld fallback rows; expected 1 .. %lld (rows - 1)", name,
                     (long long)c->fallback_rows, (long long)c->rows - 1);
  if ((unsigned)c->policy >= UR_MC_POLICY_COUNT)
    return ur__error(UR_STATUS_INVALID, "mc: table '%s' policy %d is not lfu, lru or distance_lfu",
                     name, (int)c->policy);
  if (c->evict_every < 1)
    return ur__error(UR_STATUS_INVALID, "mc: table '%s' evict_every %lld; expected >= 1", name,
                     (long long)c->evict_every);
  if (c->max_candidates < 1)
    return ur__error(UR_STATUS_INVALID, "mc: table '%s' max_candidates %lld; expected >= 1", name,
                     (long long)c->max_candidates);
  if (!(c->decay > 0 && c->decay <= 1))
    return ur__error(UR_STATUS_INVALID, "mc: table '%s' decay %g; expected a value in (0, 1]",
                     name, c->decay);
  if (!(c->distance_power > 0 && c->distance_power <= 16))
    return ur__error(UR_STATUS_INVALID,
                     "mc: table '%s' distance_power %g; expected a value in (0, 16]", name,
                     c->distance_power);
  if (c->fill != 0 && c->fill != 1)
    return ur__error(UR_STATUS_INVALID, "mc: table '%s' fill %d; expected 0 or 1", name,
                     (int)c->fill);
  return UR_STATUS_OK;
}

static void set_desc(ur_mc *m, int32_t t) {
  mc_tab *b = &m->tb[t];
  ur__mc_table *d = &m->desc[t];
  d->ids = ur_tensor_data(b->ids);
  d->counts = ur_tensor_data(b->counts);
  d->window = ur_tensor_data(b->window);
  d->last = ur_tensor_data(b->last);
  d->index = ur_tensor_data(b->index);
  d->ckeys = ur_tensor_data(b->ckeys);
  d->ccount = ur_tensor_data(b->ccount);
  d->clast = ur_tensor_data(b->clast);
  d->info = (int64_t *)ur_tensor_data(m->info) + (size_t)t * UR__MI_COUNT;
  d->admit = (int32_t *)ur_tensor_data(m->admit) + t;
  d->cap = m->tc[t].rows - m->tc[t].fallback_rows;
  d->fallback = m->tc[t].fallback_rows;
  d->pmask = ur_tensor_numel(b->index) - 1;
  d->qmask = ur_tensor_numel(b->ckeys) - 1;
  d->seed = m->cfg.seed ^ ((uint64_t)(t + 1) * 0xD1B54A32D192ED03ull);
}

/* The descriptors where the backend reads them (GPU: copied, ordered on s). */
static ur_status push_desc(ur_mc *m, ur_stream *s) {
  if (!m->ddesc) return UR_STATUS_OK;
  return m->be->copy(s ? s->handle : NULL, ur_tensor_data(m->ddesc), m->desc,
                     sizeof(ur__mc_table) * (size_t)m->T);
}

/* An empty candidates' map of q slots into the tensors of table t. */
static ur_status new_cand_map(ur_mc *m, int64_t q, ur_tensor **keys, ur_tensor **cnt,
                              ur_tensor **last) {
  ur_status st = home_tensor(m, keys, UR_DTYPE_I64, q);
  if (!st) st = home_tensor(m, cnt, UR_DTYPE_I64, q);
  if (!st) st = home_tensor(m, last, UR_DTYPE_I64, q);
  if (!st) st = m->be->fill(NULL, ur_tensor_data(*keys), (size_t)q, 8, (uint64_t)UR__MC_EMPTY);
  if (!st) st = m->be->fill(NULL, ur_tensor_data(*cnt), (size_t)q, 8, 0);
  if (!st) st = m->be->fill(NULL, ur_tensor_data(*last), (size_t)q, 8, 0);
  return st;
}

/* Table t's candidates now live in the map *keys, *cnt, *last (taken: the caller's pointers
 * become NULL); the old map is freed. */
static void take_cand_map(ur_mc *m, int32_t t, ur_tensor **keys, ur_tensor **cnt,
                          ur_tensor **last) {
  mc_tab *b = &m->tb[t];
  ur_tensor_free(b->ckeys);
  ur_tensor_free(b->ccount);
  ur_tensor_free(b->clast);
  b->ckeys = *keys;
  b->ccount = *cnt;
  b->clast = *last;
  *keys = *cnt = *last = NULL;
  set_desc(m, t);
}

static ur_status alloc_table(ur_mc *m, int32_t t) {
  mc_tab *b = &m->tb[t];
  int64_t cap = m->tc[t].rows - m->tc[t].fallback_rows;
  int64_t p = pow2_at_least(2 * cap), q = pow2_at_least(2 * MIN_HEADROOM);
  const ur_backend *g = m->be;
  ur_status st = home_tensor(m, &b->ids, UR_DTYPE_I64, cap);
  if (!st) st = home_tensor(m, &b->counts, UR_DTYPE_I64, cap);
  if (!st) st = home_tensor(m, &b->window, UR_DTYPE_I64, cap);
  if (!st) st = home_tensor(m, &b->last, UR_DTYPE_I64, cap);
  if (!st) st = home_tensor(m, &b->index, UR_DTYPE_I32, p);
  if (!st) st = g->fill(NULL, ur_tensor_data(b->ids), (size_t)cap, 8, (uint64_t)UR__MC_EMPTY);
  if (!st) st = g->fill(NULL, ur_tensor_data(b->counts), (size_t)cap, 8, 0);
  if (!st) st = g->fill(NULL, ur_tensor_data(b->window), (size_t)cap, 8, 0);
  if (!st) st = g->fill(NULL, ur_tensor_data(b->last), (size_t)cap, 8, 0);
  if (!st) st = g->fill(NULL, ur_tensor_data(b->index), (size_t)p, 4, 0);
  if (!st) st = new_cand_map(m, q, &b->ckeys, &b->ccount, &b->clast);
  return st;
}

ur_status ur_mc_new(ur_mc **out, const ur_mc_config *config, int32_t num_tables,
                    const ur_mc_table_config *tables, int32_t num_features,
                    const int32_t *feature_table) {
  UR__ARGS(out, config, tables, feature_table);
  *out = NULL;
  if (config->device < -1)
    return ur__error(UR_STATUS_INVALID, "mc: device %d; expected -1 (the CPU) or a GPU",
                     (int)config->device);
  if (config->device >= 0 && config->device >= ur_device_count())
    return ur__error(ur_device_count() ? UR_STATUS_INVALID : UR_STATUS_UNSUPPORTED,
                     "mc: device %d asked, but %d GPUs are in use%s%s", (int)config->device,
                     ur_device_count(), ur_device_count() ? "" : ": ", ur_cuda_error());
  if (num_tables < 1 || num_tables > 4096)
    return ur__error(UR_STATUS_INVALID, "mc: %d tables; expected 1 .. 4096", (int)num_tables);
  if (num_features < 1 || num_features > 65536)
    return ur__error(UR_STATUS_INVALID, "mc: %d features; expected 1 .. 65536", (int)num_features);
  ur_status st;
  for (int32_t t = 0; t < num_tables; t++) {
    char buf[32];
    snprintf(buf, sizeof buf, "table %d", (int)t);
    if ((st = check_table(&tables[t], tables[t].name ? tables[t].name : buf))) return st;
  }
  for (int32_t f = 0; f < num_features; f++)
    if (feature_table[f] < -1 || feature_table[f] >= num_tables)
      return ur__error(UR_STATUS_INVALID,
                       "mc: feature %d has table %d; expected -1 (ids pass through) or 0..%d",
                       (int)f, (int)feature_table[f], (int)num_tables - 1);
  ur_mc *m = calloc(1, sizeof *m);
  if (!m) return ur__error(UR_STATUS_OOM, "mc: out of host memory");
  m->cfg = *config;
  m->home = config->device >= 0 ? UR_PLACE_DEVICE : UR_PLACE_HOST;
  m->be = ur__backend_for(m->home);
  m->T = num_tables;
  m->F = num_features;
  m->tc = calloc((size_t)num_tables, sizeof *m->tc);
  m->tb = calloc((size_t)num_tables, sizeof *m->tb);
  m->desc = calloc((size_t)num_tables, sizeof *m->desc);
  m->feat_table = malloc(sizeof(int32_t) * (size_t)num_features);
  m->hbag = malloc(sizeof(int64_t) * ((size_t)num_features + 1));
  if (!m->tc || !m->tb || !m->desc || !m->feat_table || !m->hbag) {
    ur_mc_free(m);
    return ur__error(UR_STATUS_OOM, "mc: out of host memory");
  }
  memcpy(m->feat_table, feature_table, sizeof(int32_t) * (size_t)num_features);
  for (int32_t t = 0; t < num_tables; t++) {
    m->tc[t] = tables[t];
    m->tc[t].name = NULL; /* the copy's, below: ur_mc_free frees it, never the caller's */
    char buf[32];
    snprintf(buf, sizeof buf, "table %d", (int)t);
    const char *nm = tables[t].name ? tables[t].name : buf;
    char *copy = malloc(strlen(nm) + 1);
    if (!copy) {
      ur_mc_free(m);
      return ur__error(UR_STATUS_OOM, "mc: out of host memory");
    }
    strcpy(copy, nm);
    m->tc[t].name = copy;
  }
  if ((st = UR__NEED(m->be, mc, remap)) || (st = UR__NEED(m->be, mc, round))) {
    ur_mc_free(m);
    return st;
  }
  int32_t prev = 0;
  if ((st = ur__device_enter(m->be, config->device, &prev))) {
    ur_mc_free(m);
    return st;
  }
  int64_t words = (int64_t)num_tables * UR__MI_COUNT;
  st = home_tensor(m, &m->info, UR_DTYPE_I64, words);
  if (!st) st = m->be->fill(NULL, ur_tensor_data(m->info), (size_t)words, 8, 0);
  if (!st) st = home_tensor(m, &m->admit, UR_DTYPE_I32, num_tables);
  if (!st && m->home == UR_PLACE_DEVICE) {
    st = ur_tensor_new(&m->info_host, UR_DTYPE_I64, 1, &words, UR_PLACE_PINNED, UR_LOC_CPU);
    int64_t nd = (int64_t)(sizeof(ur__mc_table) * (size_t)num_tables);
    int64_t nb = num_features + 1;
    if (!st) st = ur_tensor_new(&m->ddesc, UR_DTYPE_U8, 1, &nd, UR_PLACE_DEVICE, config->device);
    if (!st) st = home_tensor(m, &m->dfeat, UR_DTYPE_I32, num_features);
    if (!st) st = home_tensor(m, &m->dbag, UR_DTYPE_I64, nb);
    if (!st) st = m->be->copy(NULL, ur_tensor_data(m->dfeat), feature_table,
                              sizeof(int32_t) * (size_t)num_features);
    if (!st && m->be->event_new) st = m->be->event_new(&m->event);
  }
  for (int32_t t = 0; t < num_tables && !st; t++) {
    st = alloc_table(m, t);
    if (!st) set_desc(m, t);
  }
  if (!st) st = push_desc(m, NULL);
  if (!st) st = m->be->stream_sync(NULL);
  st = ur__device_leave(m->be, config->device, prev, st);
  if (st) {
    ur_mc_free(m);
    return st;
  }
  *out = m;
  return UR_STATUS_OK;
}

static void free_tab(mc_tab *b) {
  ur_tensor *ts[8] = {b->ids, b->counts, b->window, b->last, b->index, b->ckeys, b->ccount, b->clast};
  for (int i = 0; i < 8; i++) ur_tensor_free(ts[i]);
  free(b->re);
}

void ur_mc_free(ur_mc *m) {
  if (!m) return;
  if (m->event && m->be->event_free) {
    if (m->be->event_sync) (void)m->be->event_sync(m->event);
    m->be->event_free(m->event);
  }
  for (int32_t t = 0; m->tb && t < m->T; t++) free_tab(&m->tb[t]);
  for (int32_t t = 0; m->tc && t < m->T; t++) free((char *)m->tc[t].name);
  ur_tensor *ts[7] = {m->ddesc, m->dfeat, m->dbag, m->mult, m->info, m->info_host, m->admit};
  for (int i = 0; i < 7; i++) ur_tensor_free(ts[i]);
  free(m->tc);
  free(m->tb);
  free(m->desc);
  free(m->feat_table);
  free(m->hbag);
  free(m);
}

int32_t ur_mc_num_tables(const ur_mc *m) {
  UR__ARGS_OR(-1, m);
  return m->T;
}
int32_t ur_mc_device(const ur_mc *m) {
  UR__ARGS_OR(-1, m);
  return m->cfg.device;
}
int64_t ur_mc_step(const ur_mc *m) {
  UR__ARGS_OR(-1, m);
  return m->step;
}

ur_status ur_mc_set_step(ur_mc *m, int64_t step) {
  UR__ARGS(m);
  if (step < 0) return ur__error(UR_STATUS_INVALID, "mc: step %lld; expected >= 0", (long long)step);
  m->step = step;
  return UR_STATUS_OK;
}

/* ---- what the device said ---- */

/* The counters after the last batch: waits for their copy (GPU), not for later work. */
static ur_status read_info(ur_mc *m) {
  const int64_t *src;
  if (m->info_host) {
    if (!m->copied) return UR_STATUS_OK;
    ur_status st = m->event ? m->be->event_sync(m->event) : m->be->device_sync();
    if (st) return st;
    m->copied = 0;
    src = ur_tensor_data(m->info_host);
  } else {
    src = ur_tensor_data(m->info);
  }
  for (int32_t t = 0; t < m->T; t++) {
    mc_tab *b = &m->tb[t];
    memcpy(b->info, src + (size_t)t * UR__MI_COUNT, sizeof b->info);
    if (b->info[UR__MI_NVALS] > b->nmax) b->nmax = b->info[UR__MI_NVALS];
  }
  return UR_STATUS_OK;
}

/* Sets one counter where the map lives (and in the host's view). */
static ur_status put_info(ur_mc *m, int32_t t, int k, int64_t v) {
  m->tb[t].info[k] = v;
  int64_t *p = (int64_t *)ur_tensor_data(m->info) + (size_t)t * UR__MI_COUNT + k;
  return m->be->copy(NULL, p, &v, 8);
}

/* ---- rounds ---- */

static ur_status grow_re(mc_tab *b, int64_t need) {
  if (need <= b->cap_re) return UR_STATUS_OK;
  int64_t *p = realloc(b->re, sizeof(int64_t) * (size_t)need);
  if (!p) return ur__error(UR_STATUS_OOM, "mc: out of host memory for %lld rows", (long long)need);
  b->re = p;
  b->cap_re = need;
  return UR_STATUS_OK;
}

/* The scratch a round of table t needs where the backend runs, in bytes (*bytes at least that:
 * rounds run one at a time, so one scratch serves the largest), and room on the host for the
 * rows it may reassign. */
static ur_status round_needs(ur_mc *m, int32_t t, size_t *bytes) {
  size_t sb = 0;
  ur_status st = UR__NEED(m->be, mc, round_scratch);
  if (!st) st = m->be->mc->round_scratch(&m->desc[t], &sb);
  if (!st) st = grow_re(&m->tb[t], m->desc[t].qmask + 1);
  if (!st && sb > *bytes) *bytes = sb;
  return st;
}

static ur_status scratch_alloc(ur_mc *m, size_t bytes, ur_tensor **scratch) {
  *scratch = NULL;
  return bytes ? home_tensor(m, scratch, UR_DTYPE_U8, (int64_t)bytes) : UR_STATUS_OK;
}

/* A round of table t in scratch of round_needs' bytes; allocates nothing (the backend's round
 * works in the scratch, and fails, if at all, before it changes the map). */
static ur_status run_round(ur_mc *m, ur_stream *s, int32_t t, int evict, ur_tensor *scratch) {
  double t0 = ur_clock_seconds();
  mc_tab *b = &m->tb[t];
  const ur_mc_table_config *c = &m->tc[t];
  ur__mc_round r;
  memset(&r, 0, sizeof r);
  r.now = m->step;
  r.occupied = b->occupied;
  r.policy = c->policy;
  r.evict = evict;
  r.decay = c->decay;
  r.power = c->distance_power;
  r.scratch = scratch ? ur_tensor_data(scratch) : NULL;
  r.rows = b->re;
  ur_status st = m->be->mc->round(s ? s->handle : NULL, &m->desc[t], &r);
  if (st) return st;
  b->nre = r.evicted;
  b->occupied += r.admitted - r.evicted;
  b->admissions += r.admitted;
  b->evictions += r.evicted;
  b->info[UR__MI_CAND] = evict ? 0 : r.candidates - r.admitted;
  if (evict) b->rounds++;
  else b->fills++;
  b->round_seconds += ur_clock_seconds() - t0;
  return UR_STATUS_OK;
}

/* Slots for need candidates at half load: the map's own when they fit, else the next map's. */
static int64_t cand_slots(const ur_mc *m, int32_t t, int64_t need) {
  int64_t q = m->desc[t].qmask + 1;
  return q / 2 >= need ? q : pow2_at_least(2 * need);
}

/* Table t's candidates moved into the empty map *k, *n, *l of q slots, which it takes. */
static ur_status grow_into(ur_mc *m, ur_stream *s, int32_t t, ur_tensor **k, ur_tensor **n,
                           ur_tensor **l) {
  ur__mc_table to = m->desc[t];
  to.ckeys = ur_tensor_data(*k);
  to.ccount = ur_tensor_data(*n);
  to.clast = ur_tensor_data(*l);
  to.qmask = ur_tensor_numel(*k) - 1;
  ur_status st = UR__NEED(m->be, mc, rehash);
  if (!st) st = m->be->mc->rehash(s ? s->handle : NULL, &m->desc[t], &to);
  if (!st) st = m->be->stream_sync(s ? s->handle : NULL);
  if (!st) take_cand_map(m, t, k, n, l);
  return st;
}

/* The candidates' map of table t with room for need candidates at half load. */
static ur_status size_cand_map(ur_mc *m, ur_stream *s, int32_t t, int64_t need) {
  int64_t q = cand_slots(m, t, need);
  if (q == m->desc[t].qmask + 1) return UR_STATUS_OK;
  ur_tensor *k = NULL, *n = NULL, *l = NULL;
  ur_status st = new_cand_map(m, q, &k, &n, &l);
  if (!st) st = grow_into(m, s, t, &k, &n, &l);
  ur_tensor_free(k);
  ur_tensor_free(n);
  ur_tensor_free(l);
  return st;
}

ur_status ur_mc_round(ur_stream *s, ur_mc *m, int32_t table) {
  UR__ARGS(m);
  ur_status st = check_table_index(m, table, 0, "round");
  if (st) return st;
  double t0 = ur_clock_seconds();
  int32_t prev = 0;
  if ((st = ur__device_enter(m->be, m->cfg.device, &prev))) return st;
  ur_tensor *scratch = NULL;
  size_t sb = 0;
  st = read_info(m);
  if (!st) st = round_needs(m, table, &sb);
  if (!st) st = scratch_alloc(m, sb, &scratch);
  if (!st) {
    m->tb[table].nre = 0;
    st = run_round(m, s, table, 1, scratch);
  }
  ur_tensor_free(scratch);
  st = ur__device_leave(m->be, m->cfg.device, prev, st);
  m->tb[table].seconds += ur_clock_seconds() - t0;
  return st;
}

const int64_t *ur_mc_reassigned(const ur_mc *m, int32_t table, int64_t *count) {
  UR__ARGS_OR(NULL, m, count);
  if (check_table_index(m, table, 0, "reassigned")) {
    *count = 0;
    return NULL;
  }
  *count = m->tb[table].nre;
  return m->tb[table].re;
}

/* ---- a batch ---- */

static ur_status check_i64(const ur_mc *m, const ur_tensor *x, const char *what) {
  if (ur_tensor_dtype(x) != UR_DTYPE_I64 || ur_tensor_ndim(x) != 1)
    return ur__error(UR_STATUS_INVALID, "mc: %s is %s with %d dimensions; expected i64 [n]", what,
                     ur_dtype_name(ur_tensor_dtype(x)), (int)ur_tensor_ndim(x));
  if (ur__tensor_backend(x) != m->be ||
      (m->home == UR_PLACE_DEVICE && ur_tensor_device(x) != m->cfg.device))
    return ur__error(UR_STATUS_INVALID,
                     "mc: %s is in %s memory; the map runs on %s, which needs %s", what,
                     ur_place_name(ur_tensor_place(x)),
                     m->home == UR_PLACE_DEVICE ? "a GPU" : "the CPU",
                     m->home == UR_PLACE_DEVICE ? "device or managed memory of its GPU"
                                                : "host, pinned or managed memory");
  return UR_STATUS_OK;
}

/* Each feature's first bag into m->hbag; the full batch for inverse indices. */
static ur_status bag_starts(ur_mc *m, int64_t bags, const int64_t *bpf, const ur_tensor *inverse,
                            int64_t *batch) {
  m->hbag[0] = 0;
  if (!bpf) {
    if (inverse)
      return ur__error(UR_STATUS_INVALID, "mc: inverse indices need batch_per_feature (VBE)");
    if (bags % m->F)
      return ur__error(UR_STATUS_INVALID, "mc: %lld bags for %d features; expected a multiple "
                       "(or batch_per_feature)", (long long)bags, (int)m->F);
    for (int32_t f = 0; f < m->F; f++) m->hbag[f + 1] = (f + 1) * (bags / m->F);
    *batch = bags / m->F;
    return UR_STATUS_OK;
  }
  for (int32_t f = 0; f < m->F; f++) {
    if (bpf[f] < 0 || bpf[f] > bags - m->hbag[f])
      return bpf[f] < 0
                 ? ur__error(UR_STATUS_INVALID, "mc: batch_per_feature[%d] = %lld; expected >= 0",
                             (int)f, (long long)bpf[f])
                 : ur__error(UR_STATUS_INVALID, "mc: batch_per_feature sums to more than the %lld "
                             "bags offsets hold (%lld at feature %d, after %lld)", (long long)bags,
                             (long long)bpf[f], (int)f, (long long)m->hbag[f]);
    m->hbag[f + 1] = m->hbag[f] + bpf[f];
  }
  if (m->hbag[m->F] != bags)
    return ur__error(UR_STATUS_INVALID, "mc: batch_per_feature sums to %lld, but offsets hold %lld "
                     "bags", (long long)m->hbag[m->F], (long long)bags);
  *batch = 0;
  if (inverse) {
    int64_t ni = ur_tensor_numel(inverse);
    if (ni % m->F)
      return ur__error(UR_STATUS_INVALID, "mc: inverse has %lld entries for %d features; "
                       "expected features x batch", (long long)ni, (int)m->F);
    *batch = ni / m->F;
  }
  return UR_STATUS_OK;
}

/* Ids per table in this batch, read exactly (the first batch: sizes the candidates' maps). */
static ur_status exact_counts(ur_mc *m, ur_stream *s, const ur_tensor *offsets, int64_t *per) {
  int64_t *off = malloc(sizeof(int64_t) * ((size_t)m->F + 1));
  if (!off) return ur__error(UR_STATUS_OOM, "mc: out of host memory");
  const int64_t *src = ur_tensor_data(offsets);
  ur_status st = UR_STATUS_OK;
  if (m->home == UR_PLACE_DEVICE) {
    for (int32_t f = 0; f <= m->F && !st; f++)
      st = m->be->copy(s ? s->handle : NULL, &off[f], src + m->hbag[f], 8);
    if (!st) st = m->be->stream_sync(s ? s->handle : NULL);
  } else {
    for (int32_t f = 0; f <= m->F; f++) off[f] = src[m->hbag[f]];
  }
  for (int32_t t = 0; t < m->T; t++) per[t] = 0;
  for (int32_t f = 0; f < m->F && !st; f++)
    if (m->feat_table[f] >= 0) per[m->feat_table[f]] += off[f + 1] - off[f];
  free(off);
  return st;
}

/* What schedule made ready for one table before any round ran. */
typedef struct table_plan {
  int round;                    /* 0: none; 1: an eviction round; 2: a fill round */
  ur_tensor *k, *n, *l;         /* the candidates' next map, or NULL: the map has room */
} table_plan;

static void free_plan(table_plan *p) {
  ur_tensor *ts[3] = {p->k, p->n, p->l};
  for (int i = 0; i < 3; i++) ur_tensor_free(ts[i]);
}

/* Before an updating batch of n ids: the rounds due, and room in every candidates' map.  Every
 * allocation comes first, the rounds after: a batch refused for want of memory leaves each map
 * as it was (no round run whose reassigned rows the caller would never see, no step counted
 * twice).  A round's candidates left are known before it runs (an eviction round keeps none;
 * a fill admits min(candidates, free rows)), so the next map is sized then. */
static ur_status schedule(ur_mc *m, ur_stream *s, const ur_tensor *offsets) {
  ur_status st = read_info(m);
  int need_exact = 0;
  for (int32_t t = 0; t < m->T; t++) {
    m->tb[t].nre = 0; /* a batch refused runs no round: none reassigned */
    need_exact |= !m->tb[t].sized;
  }
  if (!st && need_exact) {
    int64_t *per = malloc(sizeof(int64_t) * (size_t)m->T);
    if (!per) return ur__error(UR_STATUS_OOM, "mc: out of host memory");
    st = exact_counts(m, s, offsets, per);
    for (int32_t t = 0; t < m->T && !st; t++) {
      if (per[t] > m->tb[t].nmax) m->tb[t].nmax = per[t];
      m->tb[t].sized = 1;
    }
    free(per);
  }
  if (st) return st;
  table_plan *plan = calloc((size_t)m->T, sizeof *plan);
  if (!plan) return ur__error(UR_STATUS_OOM, "mc: out of host memory");
  size_t sb = 0;
  ur_tensor *scratch = NULL;
  for (int32_t t = 0; t < m->T && !st; t++) {
    mc_tab *b = &m->tb[t];
    const ur_mc_table_config *c = &m->tc[t];
    table_plan *p = &plan[t];
    int64_t ncand = b->info[UR__MI_CAND], room = m->desc[t].cap - b->occupied, left = ncand;
    if ((m->step > 0 && m->step % c->evict_every == 0) || ncand >= c->max_candidates) {
      p->round = 1;
      left = 0;
    } else if (c->fill && room > 0 && ncand > 0) {
      p->round = 2;
      left = ncand > room ? ncand - room : 0;
    }
    int64_t head = headroom(b->nmax);
    int64_t q = cand_slots(m, t, left + head);
    if (q != m->desc[t].qmask + 1) st = new_cand_map(m, q, &p->k, &p->n, &p->l);
    if (!st && p->round) st = round_needs(m, t, &sb);
  }
  if (!st) st = scratch_alloc(m, sb, &scratch);
  int changed = 0;
  for (int32_t t = 0; t < m->T && !st; t++) {
    mc_tab *b = &m->tb[t];
    table_plan *p = &plan[t];
    if (p->round) st = run_round(m, s, t, p->round == 1, scratch);
    int64_t q0 = m->desc[t].qmask;
    if (!st && p->k) st = grow_into(m, s, t, &p->k, &p->n, &p->l);
    /* the candidates left as foreseen: a no-op (else sized as they are) */
    int64_t head = headroom(b->nmax);
    if (!st) st = size_cand_map(m, s, t, b->info[UR__MI_CAND] + head);
    changed |= m->desc[t].qmask != q0;
  }
  for (int32_t t = 0; t < m->T; t++) free_plan(&plan[t]);
  free(plan);
  ur_tensor_free(scratch);
  if (!st && changed) st = push_desc(m, s);
  return st;
}

ur_status ur_mc_remap(ur_stream *s, ur_mc *m, const ur_tensor *values, const ur_tensor *offsets,
                      const int64_t *batch_per_feature, const ur_tensor *inverse, ur_tensor *out,
                      int32_t update) {
  UR__ARGS(m, values, offsets, out);
  double t0 = ur_clock_seconds();
  ur_status st = check_i64(m, values, "values");
  if (!st) st = check_i64(m, offsets, "offsets");
  if (!st) st = check_i64(m, out, "out");
  if (!st && inverse) st = check_i64(m, inverse, "inverse");
  if (st) return st;
  int64_t n = ur_tensor_numel(values), bags = ur_tensor_numel(offsets) - 1, batch = 0;
  if (bags < 0)
    return ur__error(UR_STATUS_INVALID, "mc: offsets is empty; expected bags + 1 entries");
  if (ur_tensor_numel(out) != n)
    return ur__error(UR_STATUS_INVALID, "mc: out has %lld entr%s for %lld value%s",
                     (long long)ur_tensor_numel(out), ur_tensor_numel(out) == 1 ? "y" : "ies",
                     (long long)n, ur__s(n));
  if ((st = bag_starts(m, bags, batch_per_feature, inverse, &batch))) return st;
  if ((st = ur__tensor_ready(m->be, values)) || (st = ur__tensor_ready(m->be, offsets)) ||
      (inverse && (st = ur__tensor_ready(m->be, inverse))))
    return st;
  if (m->home != UR_PLACE_DEVICE) {
    /* The reference checks what the GPU trusts (the KJT checked it): offsets in order. */
    const int64_t *o = ur_tensor_data(offsets);
    if (o[0] != 0 || o[bags] != n)
      return ur__error(UR_STATUS_INVALID, "mc: offsets run from %lld to %lld; expected 0 to %lld "
                       "(the values)", (long long)o[0], (long long)o[bags], (long long)n);
    for (int64_t i = 1; i <= bags; i++)
      if (o[i] < o[i - 1])
        return ur__error(UR_STATUS_INVALID, "mc: offsets[%lld] = %lld is below offsets[%lld] = "
                         "%lld; offsets must not decrease", (long long)i, (long long)o[i],
                         (long long)i - 1, (long long)o[i - 1]);
    if (inverse) {
      const int64_t *inv = ur_tensor_data(inverse);
      for (int32_t f = 0; f < m->F; f++)
        for (int64_t j = 0; j < batch; j++) {
          int64_t v = inv[(size_t)f * (size_t)batch + (size_t)j];
          if (v < 0 || v >= m->hbag[f + 1] - m->hbag[f])
            return ur__error(UR_STATUS_INVALID, "mc: inverse[%lld] = %lld for feature %d, which "
                             "has %lld bags", (long long)((int64_t)f * batch + j), (long long)v,
                             (int)f, (long long)(m->hbag[f + 1] - m->hbag[f]));
        }
    }
  }
  int32_t prev = 0;
  if ((st = ur__device_enter(m->be, m->cfg.device, &prev))) return st;
  void *sh = s ? s->handle : NULL;
  /* the VBE counts' room first: nothing may fail for memory once schedule's rounds ran */
  if (inverse && (!m->mult || ur_tensor_numel(m->mult) < bags)) {
    ur_tensor_free(m->mult);
    m->mult = NULL;
    st = home_tensor(m, &m->mult, UR_DTYPE_I32, bags > 0 ? bags : 1);
  }
  if (!st && update) st = schedule(m, s, offsets);
  if (!st && m->dbag) st = m->be->copy(sh, ur_tensor_data(m->dbag), m->hbag,
                                       sizeof(int64_t) * ((size_t)m->F + 1));
  if (!st) {
    ur__mc_batch b;
    memset(&b, 0, sizeof b);
    b.tables = m->ddesc ? ur_tensor_data(m->ddesc) : m->desc;
    b.feat_table = m->dfeat ? ur_tensor_data(m->dfeat) : m->feat_table;
    b.bag_start = m->dbag ? ur_tensor_data(m->dbag) : m->hbag;
    b.values = ur_tensor_data(values);
    b.offsets = ur_tensor_data(offsets);
    b.inverse = inverse ? ur_tensor_data(inverse) : NULL;
    b.mult = inverse ? ur_tensor_data(m->mult) : NULL;
    b.out = ur_tensor_data(out);
    b.n = n;
    b.bags = bags;
    b.batch = batch;
    b.step = m->step + 1;
    b.T = m->T;
    b.F = m->F;
    b.update = update != 0;
    st = m->be->mc->remap(sh, &b);
  }
  if (!st && update) {
    m->step++;
    if (m->info_host) {
      st = m->be->copy(sh, ur_tensor_data(m->info_host), ur_tensor_data(m->info),
                       sizeof(int64_t) * (size_t)m->T * UR__MI_COUNT);
      if (!st && m->event) st = m->be->event_record(m->event, sh);
      if (!st) m->copied = 1;
    }
  }
  st = ur__device_leave(m->be, m->cfg.device, prev, st);
  double dt = ur_clock_seconds() - t0;
  for (int32_t t = 0; t < m->T; t++) m->tb[t].seconds += dt / m->T;
  return st;
}

ur_status ur_mc_lookup(ur_mc *m, int32_t table, const int64_t *ids, int64_t n, int64_t *rows,
                       int32_t *resident) {
  UR__ARGS(m, ids, rows);
  ur_status st = check_table_index(m, table, 0, "lookup");
  if (st) return st;
  if (n < 0) return ur__error(UR_STATUS_INVALID, "mc: lookup of %lld ids", (long long)n);
  if (!n) return UR_STATUS_OK;
  if ((st = UR__NEED(m->be, mc, lookup))) return st;
  int32_t prev = 0;
  if ((st = ur__device_enter(m->be, m->cfg.device, &prev))) return st;
  if (m->home != UR_PLACE_DEVICE) {
    st = m->be->mc->lookup(NULL, &m->desc[table], ids, n, rows, resident);
  } else {
    ur_tensor *d = NULL;
    /* after the map's remaps and rounds, on whatever stream they ran: the engine's streams do
     * not wait for the NULL stream's work, nor it for theirs */
    st = m->be->device_sync();
    if (!st) st = home_tensor(m, &d, UR_DTYPE_I64, 3 * n);
    int64_t *di = d ? ur_tensor_data(d) : NULL;
    if (!st) st = m->be->copy(NULL, di, ids, sizeof(int64_t) * (size_t)n);
    if (!st) st = m->be->mc->lookup(NULL, &m->desc[table], di, n, di + n, (int32_t *)(di + 2 * n));
    if (!st) st = m->be->copy(NULL, rows, di + n, sizeof(int64_t) * (size_t)n);
    if (!st && resident) st = m->be->copy(NULL, resident, di + 2 * n, sizeof(int32_t) * (size_t)n);
    if (!st) st = m->be->stream_sync(NULL);
    ur_tensor_free(d);
  }
  return ur__device_leave(m->be, m->cfg.device, prev, st);
}

/* ---- statistics ---- */

ur_status ur_mc_stats_get(ur_mc *m, int32_t table, ur_mc_stats *out) {
  UR__ARGS(m, out);
  memset(out, 0, sizeof *out);
  ur_status st = check_table_index(m, table, 1, "stats");
  if (!st) st = read_info(m);
  if (st) return st;
  int32_t lo = table < 0 ? 0 : table, hi = table < 0 ? m->T : table + 1;
  for (int32_t t = lo; t < hi; t++) {
    const mc_tab *b = &m->tb[t];
    out->capacity += m->desc[t].cap;
    out->resident += b->occupied;
    out->candidates += b->info[UR__MI_CAND];
    out->lookups += b->info[UR__MI_LOOKUPS] - b->base[UR__MI_LOOKUPS];
    out->resident_lookups += b->info[UR__MI_RESIDENT] - b->base[UR__MI_RESIDENT];
    out->fallback_lookups += b->info[UR__MI_FALLBACK] - b->base[UR__MI_FALLBACK];
    out->rounds += b->rounds;
    out->fills += b->fills;
    out->admissions += b->admissions;
    out->evictions += b->evictions;
    out->skipped += b->info[UR__MI_SKIPPED] - b->base[UR__MI_SKIPPED];
    out->seconds += b->seconds;
    out->round_seconds += b->round_seconds;
  }
  return UR_STATUS_OK;
}

void ur_mc_reset_stats(ur_mc *m) {
  if (!m) return;
  if (read_info(m)) return;
  for (int32_t t = 0; t < m->T; t++) {
    mc_tab *b = &m->tb[t];
    memcpy(b->base, b->info, sizeof b->base);
    b->rounds = b->fills = b->admissions = b->evictions = 0;
    b->seconds = b->round_seconds = 0;
  }
}

/* ---- state ---- */

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

/* A host tensor of n elements (dtype), its data into *p. */
static ur_status host_tensor(ur_tensor **out, ur_dtype d, int64_t n, void **p) {
  ur_status st = ur_tensor_new(out, d, 1, &n, UR_PLACE_HOST, UR_LOC_CPU);
  *p = st ? NULL : ur_tensor_data(*out);
  return st;
}

ur_status ur_mc_state_get(ur_mc *m, int32_t table, ur_mc_state *out) {
  UR__ARGS(m, out);
  memset(out, 0, sizeof *out);
  ur_status st = check_table_index(m, table, 0, "state_get");
  if (!st) st = read_info(m);
  if (!st) st = m->be->device_sync();
  if (st) return st;
  mc_tab *b = &m->tb[table];
  int64_t q = m->desc[table].qmask + 1;
  int64_t *keys = malloc(sizeof(int64_t) * (size_t)q), *last = malloc(sizeof(int64_t) * (size_t)q);
  int64_t *cnt = malloc(sizeof(int64_t) * (size_t)q);
  int64_t *pairs = malloc(sizeof(int64_t) * 2 * (size_t)q); /* (id, slot) */
  if (!keys || !last || !cnt || !pairs) st = ur__error(UR_STATUS_OOM, "mc: out of host memory");
  if (!st) st = ur_tensor_to(NULL, b->ids, &out->ids, UR_PLACE_HOST, UR_LOC_CPU);
  if (!st) st = ur_tensor_to(NULL, b->counts, &out->counts, UR_PLACE_HOST, UR_LOC_CPU);
  if (!st) st = ur_tensor_to(NULL, b->window, &out->window, UR_PLACE_HOST, UR_LOC_CPU);
  if (!st) st = ur_tensor_to(NULL, b->last, &out->last, UR_PLACE_HOST, UR_LOC_CPU);
  if (!st) st = ur_tensor_read(b->ckeys, 0, q, keys);
  if (!st) st = ur_tensor_read(b->ccount, 0, q, cnt);
  if (!st) st = ur_tensor_read(b->clast, 0, q, last);
  if (!st) {
    /* the candidates by id: an order that does not depend on where the map put them */
    int64_t k = 0;
    for (int64_t i = 0; i < q; i++)
      if (keys[i] != UR__MC_EMPTY) {
        pairs[2 * k] = keys[i];
        pairs[2 * k + 1] = i;
        k++;
      }
    qsort(pairs, (size_t)k, 16, cmp_i64); /* ids are distinct: the first word decides */
    void *pi, *pc, *pl;
    st = host_tensor(&out->cand_ids, UR_DTYPE_I64, k, &pi);
    if (!st) st = host_tensor(&out->cand_counts, UR_DTYPE_I64, k, &pc);
    if (!st) st = host_tensor(&out->cand_last, UR_DTYPE_I64, k, &pl);
    for (int64_t i = 0; i < k && !st; i++) {
      int64_t slot = pairs[2 * i + 1];
      ((int64_t *)pi)[i] = keys[slot];
      ((int64_t *)pc)[i] = cnt[slot];
      ((int64_t *)pl)[i] = last[slot];
    }
  }
  free(keys);
  free(last);
  free(cnt);
  free(pairs);
  if (st) {
    ur_tensor *ts[7] = {out->ids, out->counts, out->window, out->last, out->cand_ids,
                        out->cand_counts, out->cand_last};
    for (int i = 0; i < 7; i++) ur_tensor_free(ts[i]);
    memset(out, 0, sizeof *out);
    return st;
  }
  /* the counts as ur_mc_stats_get gives them (since the last reset_stats, as rounds are), so
   * that the restored map's stats are the saved one's */
  out->lookups = b->info[UR__MI_LOOKUPS] - b->base[UR__MI_LOOKUPS];
  out->resident_lookups = b->info[UR__MI_RESIDENT] - b->base[UR__MI_RESIDENT];
  out->fallback_lookups = b->info[UR__MI_FALLBACK] - b->base[UR__MI_FALLBACK];
  out->rounds = b->rounds;
  out->fills = b->fills;
  out->admissions = b->admissions;
  out->evictions = b->evictions;
  out->skipped = b->info[UR__MI_SKIPPED] - b->base[UR__MI_SKIPPED];
  out->batch_max = b->sized ? b->nmax : -1;
  out->slots = q;
  return UR_STATUS_OK;
}

/* x is a tensor of n elements (n < 0: any number) of dtype d, or, where wide is set, of i32
 * (a state saved before the lookup counts had 64 bits). */
static ur_status check_state_tensor(const ur_mc *m, int32_t t, const ur_tensor *x, const char *what,
                                    ur_dtype d, int64_t n, int wide) {
  if (!x)
    return ur__error(UR_STATUS_INVALID, "mc: state of table '%s' has no %s", tname(m, t), what);
  ur_dtype xd = ur_tensor_dtype(x);
  if ((xd != d && !(wide && xd == UR_DTYPE_I32)) || (n >= 0 && ur_tensor_numel(x) != n)) {
    char size[32];
    if (n >= 0) snprintf(size, sizeof size, "%lld", (long long)n);
    else snprintf(size, sizeof size, "any length");
    return ur__error(UR_STATUS_INVALID, "mc: state of table '%s': %s is %s [%lld]; expected %s%s [%s]",
                     tname(m, t), what, ur_dtype_name(xd), (long long)ur_tensor_numel(x),
                     ur_dtype_name(d), wide ? " (or i32)" : "", size);
  }
  return UR_STATUS_OK;
}

/* A tensor of i64 (or i32, widened) of any placement into a new host buffer of int64. */
static ur_status to_host(const ur_tensor *x, int64_t **out) {
  int64_t n = ur_tensor_numel(x);
  *out = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
  if (!*out) return ur__error(UR_STATUS_OOM, "mc: out of host memory for a state of %lld entries",
                              (long long)n);
  ur_status st = ur_tensor_place(x) == UR_PLACE_HOST ? UR_STATUS_OK : ur_device_sync();
  if (!st) st = ur_tensor_read(x, 0, n, *out);
  if (!st && ur_tensor_dtype(x) == UR_DTYPE_I32) /* widened in place, from the end */
    for (int64_t i = n - 1; i >= 0; i--) (*out)[i] = ((const int32_t *)*out)[i];
  return st;
}

/* Every value of x (i64 or i32) is >= 0 (and <= most, if most >= 0): read a chunk at a time. */
static ur_status check_values(const ur_mc *m, int32_t t, const ur_tensor *x, const char *what,
                              int64_t most) {
  enum { CHUNK = 4096 }; /* 32 KiB of stack */
  int64_t buf[CHUNK], n = ur_tensor_numel(x);
  int wide = ur_tensor_dtype(x) == UR_DTYPE_I32;
  ur_status st = ur_tensor_place(x) == UR_PLACE_HOST ? UR_STATUS_OK : ur_device_sync();
  for (int64_t i0 = 0; i0 < n && !st; i0 += CHUNK) {
    int64_t c = n - i0 < CHUNK ? n - i0 : CHUNK;
    if ((st = ur_tensor_read(x, i0, c, buf))) break;
    for (int64_t i = 0; i < c; i++) {
      int64_t v = wide ? ((const int32_t *)buf)[i] : buf[i];
      if (v < 0 || (most >= 0 && v > most))
        return ur__error(UR_STATUS_INVALID, "mc: state of table '%s': %s[%lld] = %lld; expected 0 .. "
                         "%lld", tname(m, t), what, (long long)(i0 + i), (long long)v,
                         (long long)(most >= 0 ? most : INT64_MAX));
    }
  }
  return st;
}

/* A state's host copies, read and checked by state_read (int64 throughout). */
typedef struct state_host {
  int64_t *ids, *ci, *cc, *cl;
  int64_t occ, k;
} state_host;

static void state_host_free(state_host *h) {
  free(h->ids);
  free(h->ci);
  free(h->cc);
  free(h->cl);
  memset(h, 0, sizeof *h);
}

/* The slots of a candidates' map the engine could have made for k candidates and batches of
 * batch_max ids (-1: none counted): rounds keep the candidates below max_candidates between
 * batches, and a map is sized for those plus twice the largest batch. */
static int64_t most_slots(const ur_mc *m, int32_t t, int64_t k, int64_t batch_max) {
  int64_t c = m->tc[t].max_candidates > k ? m->tc[t].max_candidates : k;
  int64_t head = headroom(batch_max);
  return pow2_at_least(2 * (c + head));
}

/* Checks in against table t and reads what a restore needs into h (freed on failure). */
static ur_status state_read(const ur_mc *m, int32_t table, const ur_mc_state *in, state_host *h) {
  memset(h, 0, sizeof *h);
  ur_status st = check_table_index(m, table, 0, "state");
  if (st) return st;
  int64_t cap = m->desc[table].cap;
  const char *nm = tname(m, table);
  if ((st = check_state_tensor(m, table, in->ids, "ids", UR_DTYPE_I64, cap, 0)) ||
      (st = check_state_tensor(m, table, in->counts, "counts", UR_DTYPE_I64, cap, 0)) ||
      (st = check_state_tensor(m, table, in->window, "window", UR_DTYPE_I64, cap, 1)) ||
      (st = check_state_tensor(m, table, in->last, "last", UR_DTYPE_I64, cap, 0)) ||
      (st = check_state_tensor(m, table, in->cand_ids, "cand_ids", UR_DTYPE_I64, -1, 0)))
    return st;
  int64_t k = ur_tensor_numel(in->cand_ids);
  if ((st = check_state_tensor(m, table, in->cand_counts, "cand_counts", UR_DTYPE_I64, k, 1)) ||
      (st = check_state_tensor(m, table, in->cand_last, "cand_last", UR_DTYPE_I64, k, 0)))
    return st;
  if (in->batch_max < -1 || in->batch_max > MAX_BATCH_IDS)
    return ur__error(UR_STATUS_INVALID, "mc: state of table '%s': batch_max %lld; expected -1 "
                     "(no batch counted) .. %lld", nm, (long long)in->batch_max,
                     (long long)MAX_BATCH_IDS);
  int64_t most = most_slots(m, table, k, in->batch_max);
  if (in->slots && (in->slots < 2 * MIN_HEADROOM || in->slots > most ||
                    (in->slots & (in->slots - 1)) || in->slots < 2 * k))
    return ur__error(UR_STATUS_INVALID, "mc: state of table '%s': slots %lld; expected 0 or a "
                     "power of 2 from %lld to %lld, at least twice its %lld candidates (at most "
                     "what max_candidates %lld and batch_max %lld can need)", nm,
                     (long long)in->slots, (long long)(2 * MIN_HEADROOM), (long long)most,
                     (long long)k, (long long)m->tc[table].max_candidates,
                     (long long)in->batch_max);
  int64_t counts[8] = {in->lookups, in->resident_lookups, in->fallback_lookups, in->rounds,
                       in->fills, in->admissions, in->evictions, in->skipped};
  static const char *const count_names[8] = {"lookups", "resident_lookups", "fallback_lookups",
                                             "rounds", "fills", "admissions", "evictions",
                                             "skipped"};
  for (int i = 0; i < 8; i++)
    if (counts[i] < 0)
      return ur__error(UR_STATUS_INVALID, "mc: state of table '%s': %s %lld; expected >= 0", nm,
                       count_names[i], (long long)counts[i]);
  /* the counts and steps a round ranks by: negative ones would rank as no real map's do */
  if ((st = check_values(m, table, in->counts, "counts", UR__MC_COUNT_MAX)) ||
      (st = check_values(m, table, in->window, "window", -1)) ||
      (st = check_values(m, table, in->last, "last", -1)) ||
      (st = check_values(m, table, in->cand_counts, "cand_counts", -1)) ||
      (st = check_values(m, table, in->cand_last, "cand_last", -1)))
    return st;
  int64_t *sorted = NULL;
  st = to_host(in->ids, &h->ids);
  if (!st) st = to_host(in->cand_ids, &h->ci);
  if (!st) st = to_host(in->cand_counts, &h->cc);
  if (!st) st = to_host(in->cand_last, &h->cl);
  int64_t occ = 0;
  if (!st) {
    const int64_t *ids = h->ids;
    while (occ < cap && ids[occ] != UR__MC_EMPTY) occ++;
    for (int64_t r = occ; r < cap && !st; r++)
      if (ids[r] != UR__MC_EMPTY)
        st = ur__error(UR_STATUS_INVALID, "mc: state of table '%s': row %lld is free but row %lld "
                       "holds id %lld; resident rows come first", nm, (long long)occ,
                       (long long)r, (long long)ids[r]);
  }
  if (!st) {
    sorted = malloc(sizeof(int64_t) * (size_t)(occ + k + 1));
    if (!sorted) st = ur__error(UR_STATUS_OOM, "mc: out of host memory");
  }
  if (!st) {
    memcpy(sorted, h->ids, sizeof(int64_t) * (size_t)occ);
    memcpy(sorted + occ, h->ci, sizeof(int64_t) * (size_t)k);
    qsort(sorted, (size_t)(occ + k), 8, cmp_i64);
    for (int64_t i = 1; i < occ + k && !st; i++)
      if (sorted[i] == sorted[i - 1])
        st = ur__error(UR_STATUS_INVALID, "mc: state of table '%s': id %lld appears twice among "
                       "the residents and candidates", nm, (long long)sorted[i]);
    for (int64_t i = 0; i < k && !st; i++)
      if (h->ci[i] == UR__MC_EMPTY)
        st = ur__error(UR_STATUS_INVALID, "mc: state of table '%s': candidate %lld is the id -1, "
                       "which is never counted", nm, (long long)i);
  }
  free(sorted);
  if (st) {
    state_host_free(h);
    return st;
  }
  h->occ = occ;
  h->k = k;
  return UR_STATUS_OK;
}

ur_status ur_mc_state_check(const ur_mc *m, int32_t table, const ur_mc_state *in) {
  UR__ARGS(m, in);
  state_host h;
  ur_status st = state_read(m, table, in, &h);
  state_host_free(&h);
  return st;
}

/* Everything a restore of a table allocates is made before it writes any of the map: the
 * candidates' map (laid out on the host with the backends' hash, then copied into new tensors)
 * and, for a state of i32 windows, their widening; then the map is written, which fails, if at
 * all, as the GPU does. */
ur_status ur_mc_state_set(ur_mc *m, int32_t table, const ur_mc_state *in) {
  UR__ARGS(m, in);
  state_host h;
  ur_status st = state_read(m, table, in, &h);
  if (st) return st;
  int64_t occ = h.occ, k = h.k;
  int32_t prev = UR_LOC_CPU;
  st = ur__device_enter(m->be, m->cfg.device, &prev);
  if (st) {
    state_host_free(&h);
    return st;
  }
  mc_tab *b = &m->tb[table];
  int64_t nmax = in->batch_max > 0 ? in->batch_max : 0;
  int64_t head = headroom(nmax);
  int64_t q = in->slots ? in->slots : pow2_at_least(2 * (k + head));
  int64_t *hk = NULL, *hl = NULL, *hc = NULL, *win = NULL;
  ur_tensor *nk = NULL, *nc = NULL, *nl = NULL;
  st = read_info(m);
  if (!st) st = m->be->device_sync();
  if (!st) st = UR__NEED(m->be, mc, reindex);
  if (!st) {
    hk = malloc(sizeof(int64_t) * (size_t)q);
    hl = calloc((size_t)q, sizeof(int64_t));
    hc = calloc((size_t)q, sizeof(int64_t));
    if (!hk || !hl || !hc)
      st = ur__error(UR_STATUS_OOM, "mc: out of host memory for the %lld candidate slots of table "
                     "'%s'", (long long)q, tname(m, table));
  }
  if (!st && ur_tensor_dtype(in->window) != UR_DTYPE_I64) st = to_host(in->window, &win);
  if (!st) {
    ur__mc_table lay = m->desc[table];
    lay.qmask = q - 1;
    for (int64_t i = 0; i < q; i++) hk[i] = UR__MC_EMPTY;
    for (int64_t i = 0; i < k; i++) {
      uint64_t s = ur__mc_hash(&lay, h.ci[i]) & (uint64_t)lay.qmask;
      while (hk[s] != UR__MC_EMPTY) s = (s + 1) & (uint64_t)lay.qmask;
      hk[s] = h.ci[i];
      hc[s] = h.cc[i];
      hl[s] = h.cl[i];
    }
    st = new_cand_map(m, q, &nk, &nc, &nl);
    if (!st) st = ur_tensor_write(nk, 0, q, hk);
    if (!st) st = ur_tensor_write(nc, 0, q, hc);
    if (!st) st = ur_tensor_write(nl, 0, q, hl);
  }
  /* nothing written to the map before here */
  if (!st) st = ur_tensor_copy(NULL, in->ids, b->ids);
  if (!st) st = ur_tensor_copy(NULL, in->counts, b->counts);
  if (!st) st = win ? ur_tensor_write(b->window, 0, m->desc[table].cap, win)
                    : ur_tensor_copy(NULL, in->window, b->window);
  if (!st) st = ur_tensor_copy(NULL, in->last, b->last);
  if (!st) st = m->be->fill(NULL, m->desc[table].index, (size_t)(m->desc[table].pmask + 1), 4, 0);
  if (!st) st = m->be->mc->reindex(NULL, &m->desc[table], occ);
  if (!st) {
    take_cand_map(m, table, &nk, &nc, &nl);
    b->occupied = occ;
    b->nmax = nmax;
    b->sized = in->batch_max >= 0;
    b->nre = 0;
    b->rounds = in->rounds;
    b->fills = in->fills;
    b->admissions = in->admissions;
    b->evictions = in->evictions;
    memset(b->base, 0, sizeof b->base);
    st = put_info(m, table, UR__MI_CAND, k);
    if (!st) st = put_info(m, table, UR__MI_LOOKUPS, in->lookups);
    if (!st) st = put_info(m, table, UR__MI_RESIDENT, in->resident_lookups);
    if (!st) st = put_info(m, table, UR__MI_FALLBACK, in->fallback_lookups);
    if (!st) st = put_info(m, table, UR__MI_SKIPPED, in->skipped);
    /* the ids of this map's last batch, which read_info would take into nmax: the saved map's
     * are in batch_max already */
    if (!st) st = put_info(m, table, UR__MI_NVALS, nmax);
    if (!st) st = push_desc(m, NULL);
    if (!st) st = m->be->stream_sync(NULL);
  }
  ur_tensor_free(nk);
  ur_tensor_free(nc);
  ur_tensor_free(nl);
  free(hk);
  free(hl);
  free(hc);
  free(win);
  state_host_free(&h);
  return ur__device_leave(m->be, m->cfg.device, prev, st);
}
