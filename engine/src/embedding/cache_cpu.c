/* cache_cpu.c: the CPU backend's cache table (cache.h), the reference the GPU's decisions
 * (kernels/cache.cu) match: the same three calls over the same state and job structs, the
 * host's way.
 *
 *   lookup  each cached table's values form a block of (row, value index) pairs, table-major;
 *           the blocks are gathered, sorted and deduplicated in parallel, one table per task,
 *           and their concatenation is in ascending key order (a key is the table's base plus
 *           the row).  The distinct keys are then put in (set, key) order; the runs of one set
 *           are the groups.
 *   decide  sets are decided in parallel, each on its own keys in ascending order: hits first
 *           (they lock their ways), then misses, which take an empty way, else the policy's
 *           victim among the ways no batch in flight holds, else nothing (a conflict miss).
 *   place   in key order: the move lists (write-backs, fills, staged loads), the batch's slot
 *           list, and the slot id of every value.
 * What one call leaves for the next lives in the scratch, carved the same way by each. */
#include <stdlib.h>
#include <string.h>
#include "embedding/cache.h"

#define EMPTY ((uint64_t)-1)
#define HIT_BIT ((int64_t)1 << 62)

/* ---- the scratch ---- */

typedef struct scratch {
  uint64_t *keys, *tkeys;       /* [n + 1] per cached value: row, then the sort's scratch */
  int64_t *vidx, *tvidx;        /* [n + 1] its value index */
  int64_t *uniq_of;             /* [n + 1] its distinct key */
  uint64_t *ukeys;              /* [n + 1] the distinct keys, ascending */
  int64_t *order;               /* [n + 1] the distinct keys in (set, key) order */
  int64_t *res;                 /* [n + 1] per distinct key: slot, or -1 (conflict); hits | HIT_BIT */
  int64_t *evict;               /* [n + 1] per distinct key: evicted key (EMPTY: none), dirty in bit 63 */
  int64_t *grp;                 /* [n + 2] group g covers order[grp[g] .. grp[g + 1]) */
  int64_t *bstart, *bvalid, *bunique; /* [nt + 1] per table: its block, valid entries, first distinct */
  int64_t *fpos, *fv0, *fv1;    /* [F] per feature: its place in its block, its values */
  size_t total;
} scratch;

static void carve(const ur__cache_dev *d, int64_t n, char *base, scratch *s) {
  size_t at = 0, m = (size_t)n + 1, t = (size_t)d->nt + 1, f = (size_t)d->F;
  s->keys = ur__carve(base, &at, 8 * m);
  s->tkeys = ur__carve(base, &at, 8 * m);
  s->vidx = ur__carve(base, &at, 8 * m);
  s->tvidx = ur__carve(base, &at, 8 * m);
  s->uniq_of = ur__carve(base, &at, 8 * m);
  s->ukeys = ur__carve(base, &at, 8 * m);
  s->order = ur__carve(base, &at, 8 * m);
  s->res = ur__carve(base, &at, 8 * m);
  s->evict = ur__carve(base, &at, 8 * m);
  s->grp = ur__carve(base, &at, 8 * (m + 1));
  s->bstart = ur__carve(base, &at, 8 * t);
  s->bvalid = ur__carve(base, &at, 8 * t);
  s->bunique = ur__carve(base, &at, 8 * t);
  s->fpos = ur__carve(base, &at, 8 * f);
  s->fv0 = ur__carve(base, &at, 8 * f);
  s->fv1 = ur__carve(base, &at, 8 * f);
  s->total = at;
}

static ur_status cpu_scratch(const ur__cache_dev *d, int64_t n, size_t *bytes) {
  scratch s;
  carve(d, n, NULL, &s);
  *bytes = s.total;
  return UR_STATUS_OK;
}

static size_t info_words(const ur__cache_dev *d) {
  return (size_t)UR__CI_TABLES + (size_t)d->nt * UR__CT_COUNT;
}

static int64_t *table_info(const ur__cache_job *j, int32_t ct) {
  return j->info + UR__CI_TABLES + (size_t)ct * UR__CT_COUNT;
}

/* The caller reads info_host (the same memory as info here, unless it asked for a copy). */
static void copy_info(const ur__cache_dev *d, const ur__cache_job *j) {
  if (j->info_host != j->info) memcpy(j->info_host, j->info, info_words(d) * 8);
}

/* ---- lookup ---- */

/* What each parallel range of one call reads: the cache's arrays, the call, its scratch. */
typedef struct pass {
  const ur__cache_dev *d;
  const ur__cache_job *j;
  const scratch *s;
} pass;

/* A feature's values into its place in its table's block: the row, or the table's row count
 * for an id out of range (it sorts last in the block and is dropped). */
static void gather_range(void *ctx, size_t f0, size_t f1) {
  const pass *p = ctx;
  const scratch *s = p->s;
  for (size_t f = f0; f < f1; f++) {
    int32_t ct = p->d->feat_ct[f];
    if (ct < 0) continue;
    int64_t rows = p->d->kbase[ct + 1] - p->d->kbase[ct], at = s->fpos[f];
    for (int64_t v = s->fv0[f]; v < s->fv1[f]; v++, at++) {
      int64_t id = p->j->vals[v];
      s->keys[at] = id < 0 || id >= rows ? (uint64_t)rows : (uint64_t)id;
      s->vidx[at] = v;
    }
  }
}

/* Sorts each table's block by row (stable: value order within a row), back into keys/vidx;
 * counts its valid entries and its distinct rows. */
static void sort_range(void *ctx, size_t t0, size_t t1) {
  const pass *p = ctx;
  const scratch *s = p->s;
  for (size_t ct = t0; ct < t1; ct++) {
    int64_t b = s->bstart[ct], n = s->bstart[ct + 1] - b;
    uint64_t rows = (uint64_t)(p->d->kbase[ct + 1] - p->d->kbase[ct]);
    uint64_t *k = s->keys + b, *tk = s->tkeys + b;
    int64_t *v = s->vidx + b, *tv = s->tvidx + b;
    ur__radix_sort(&k, &v, &tk, &tv, n, ur__key_bits(rows)); /* rows: an id out of range */
    if (k != s->keys + b) {
      memcpy(s->keys + b, k, sizeof(uint64_t) * (size_t)n);
      memcpy(s->vidx + b, v, sizeof(int64_t) * (size_t)n);
    }
    k = s->keys + b;
    int64_t valid = 0, uniq = 0;
    while (valid < n && k[valid] < rows) {
      if (valid == 0 || k[valid] != k[valid - 1]) uniq++;
      valid++;
    }
    s->bvalid[ct] = valid;
    s->bunique[ct] = uniq;
  }
}

/* The distinct keys of each block at its table's first distinct key; each entry's index. */
static void unique_range(void *ctx, size_t t0, size_t t1) {
  const pass *p = ctx;
  const scratch *s = p->s;
  for (size_t ct = t0; ct < t1; ct++) {
    int64_t b = s->bstart[ct], u = s->bunique[ct] - 1;
    const uint64_t *k = s->keys + b;
    uint64_t base = (uint64_t)p->d->kbase[ct];
    for (int64_t i = 0; i < s->bvalid[ct]; i++) {
      if (i == 0 || k[i] != k[i - 1]) s->ukeys[++u] = base + k[i];
      s->uniq_of[b + i] = u;
    }
  }
}

typedef struct setsort_job {
  pass p;
  int64_t U;
  int64_t *setv;
  int per_table;
} setsort_job;

/* The distinct keys of tables [t0, t1) (or all, shared) in (set, key) order into order.  keys,
 * tkeys and tvidx are free by now, each of at least U entries. */
static void setsort_range(void *ctx, size_t t0, size_t t1) {
  const setsort_job *j = ctx;
  const ur__cache_dev *d = j->p.d;
  const scratch *s = j->p.s;
  if (t0 >= t1) return;
  int64_t u0 = j->per_table ? s->bunique[t0] : 0;
  int64_t u1 = j->per_table && (int32_t)t1 < d->nt ? s->bunique[t1] : j->U;
  int64_t base = j->per_table ? d->set_base[t0] : 0, span = 0;
  for (size_t ct = t0; ct < t1 && j->per_table; ct++) span += d->set_count[ct];
  if (!j->per_table) span = d->nsets;
  uint64_t *sk = s->keys + u0, *stk = s->tkeys + u0;
  int64_t *sv = s->order + u0, *stv = s->tvidx + u0;
  for (int64_t u = u0, ct = j->per_table ? (int64_t)t0 : 0; u < u1; u++) {
    while (ct + 1 < d->nt && u >= s->bunique[ct + 1]) ct++;
    j->setv[u] = ur__cache_set_of(d->kbase, d->set_base, d->set_count, s->ukeys[u], (int32_t)ct);
    sk[u - u0] = (uint64_t)(j->setv[u] - base);
    sv[u - u0] = u;
  }
  /* the keys are sets less base, 0 to span - 1 (every table has a set: span >= 1) */
  ur__radix_sort(&sk, &sv, &stk, &stv, u1 - u0, ur__key_bits((uint64_t)span - 1));
  if (sv != s->order + u0) memcpy(s->order + u0, sv, sizeof(int64_t) * (size_t)(u1 - u0));
}

/* Whether the distinct keys (ascending) meet a flight's staged pairs (ascending). */
static int staged_meet(const ur__cache_dev *d, const uint64_t *ukeys, int64_t U,
                       const int64_t *staged, int64_t ns) {
  int64_t i = 0, k = 0;
  while (i < U && k < ns) {
    uint64_t p = ur__cache_pair_of(d->kbase, d->nt, ukeys[i]), q = (uint64_t)staged[2 * k];
    if (p == q) return 1;
    if (p < q) i++;
    else k++;
  }
  return 0;
}

/* Under bounds fatal, the ids of the features whose tables are not cached: the first bad value
 * into info (their ids pass through to the collection, whose forward then need not read its
 * own bad-id flag back).  Nonzero when there is one. */
static int other_ids_bad(const ur__cache_dev *d, const ur__cache_job *j, int64_t *info) {
  for (int32_t f = 0; f < d->F; f++) {
    if (d->feat_ct[f] >= 0) continue;
    int64_t v = ur__cache_first_bad(j->vals, j->offs[ur__tbe_bag_of(j->bag_start, j->batch, f)],
                                    j->offs[ur__tbe_bag_of(j->bag_start, j->batch, f + 1)], d->feat_rows[f]);
    if (v >= 0) {
      info[UR__CI_BAD_V] = v;
      return 1;
    }
  }
  return 0;
}

/* The offsets are checked first as a whole, then per feature (the first bad one is reported);
 * under bounds fatal, any bad id stops the lookup too, cached or not. */
static ur_status cpu_lookup(void *stream, const ur__cache_dev *d, const ur__cache_job *j) {
  scratch s;
  carve(d, j->n, j->scratch, &s);
  int64_t *info = j->info, n = j->n;
  const int64_t *offs = j->offs;
  memset(info, 0, info_words(d) * 8);
  info[UR__CI_BAD_V] = -1;
  info[UR__CI_BAD_F] = -1;
  if (offs[0] != 0 || offs[j->bags] != n) {
    info[UR__CI_BAD_F] = d->F;
    copy_info(d, j);
    return UR_STATUS_OK;
  }
  memset(s.bstart, 0, sizeof(int64_t) * ((size_t)d->nt + 1));
  for (int32_t f = 0; f < d->F; f++) {
    int32_t ct = d->feat_ct[f];
    int64_t fb0 = ur__tbe_bag_of(j->bag_start, j->batch, f);
    int64_t fb1 = ur__tbe_bag_of(j->bag_start, j->batch, f + 1);
    int64_t v0 = offs[fb0], v1 = offs[fb1];
    if (v0 < 0 || v1 < v0 || v1 > n) {
      info[UR__CI_BAD_F] = f;
      copy_info(d, j);
      return UR_STATUS_OK;
    }
    if (ct < 0) continue;
    s.fv0[f] = v0;
    s.fv1[f] = v1;
    s.fpos[f] = s.bstart[ct + 1]; /* within its table's block, for now */
    s.bstart[ct + 1] += v1 - v0;
    table_info(j, ct)[UR__CT_LOOKUPS] += v1 - v0;
  }
  for (int32_t ct = 0; ct < d->nt; ct++) s.bstart[ct + 1] += s.bstart[ct];
  for (int32_t f = 0; f < d->F; f++)
    if (d->feat_ct[f] >= 0) s.fpos[f] += s.bstart[d->feat_ct[f]];
  pass p = {d, j, &s};
  ur__parallel_for((size_t)d->F, 1, gather_range, &p);
  if (j->bounds_fatal && other_ids_bad(d, j, info)) {
    copy_info(d, j);
    return UR_STATUS_OK;
  }
  if (j->bounds_fatal)
    for (int32_t f = 0; f < d->F; f++) {
      int32_t ct = d->feat_ct[f];
      if (ct < 0) continue;
      uint64_t rows = (uint64_t)(d->kbase[ct + 1] - d->kbase[ct]);
      for (int64_t k = s.fpos[f]; k < s.fpos[f] + (s.fv1[f] - s.fv0[f]); k++)
        if (s.keys[k] >= rows) {
          info[UR__CI_BAD_V] = s.vidx[k];
          copy_info(d, j);
          return UR_STATUS_OK;
        }
    }
  ur__parallel_for((size_t)d->nt, 1, sort_range, &p);
  int64_t m = 0, U = 0;
  for (int32_t ct = 0; ct < d->nt; ct++) {
    m += s.bvalid[ct];
    int64_t u = s.bunique[ct];
    s.bunique[ct] = U; /* now the table's first distinct key */
    U += u;
  }
  ur__parallel_for((size_t)d->nt, 1, unique_range, &p);
  for (int r = 0; r < UR__CACHE_RING; r++)
    if (j->staged[r]) info[UR__CI_MEET + r] = staged_meet(d, s.ukeys, U, j->staged[r], j->nstaged[r]);
  /* (set, key) order: a stable radix sort on the set (the keys are ascending).  Tables with
   * sets of their own (their ranges follow the table order) are sorted each on its own, in
   * parallel; a shared pool of sets as one range. */
  int per_table = d->nt > 1 && d->set_base[d->nt - 1] != 0;
  int64_t *setv = s.evict; /* scratch: the set of each distinct key, until the decisions */
  setsort_job sj = {p, U, setv, per_table};
  ur__parallel_for(per_table ? (size_t)d->nt : 1, 1, setsort_range, &sj);
  int64_t ng = 0;
  for (int64_t q = 0; q < U; q++)
    if (q == 0 || setv[s.order[q]] != setv[s.order[q - 1]]) s.grp[ng++] = q;
  s.grp[ng] = U;
  info[UR__CI_U] = U;
  info[UR__CI_NG] = ng;
  info[UR__CI_NVALID] = m;
  copy_info(d, j);
  return UR_STATUS_OK;
}

/* ---- decide ---- */

static void decide_range(void *ctx, size_t g0, size_t g1) {
  const pass *p = ctx;
  const ur__cache_dev *d = p->d;
  const ur__cache_job *j = p->j;
  const scratch *s = p->s;
  const uint32_t *freq = j->lfu ? d->freq : NULL; /* LFU: the counts; NULL for LRU */
  for (size_t g = g0; g < g1; g++) {
    int64_t b = s->grp[g], e = s->grp[g + 1];
    uint64_t k0 = s->ukeys[s->order[b]];
    int64_t set = ur__cache_set_of(d->kbase, d->set_base, d->set_count, k0,
                                   ur__cache_table_of(d->kbase, d->nt, k0));
    int64_t base = set * UR_CACHE_WAYS;
    /* hits first: they lock their ways before any miss looks for a victim */
    for (int64_t q = b; q < e; q++) {
      int64_t u = s->order[q];
      uint64_t key = s->ukeys[u];
      s->res[u] = -1;
      s->evict[u] = (int64_t)EMPTY;
      for (int w = 0; w < UR_CACHE_WAYS; w++)
        if (d->tag[base + w] == key) {
          d->stamp[base + w] = j->ticket;
          s->res[u] = (base + w) | HIT_BIT;
          break;
        }
    }
    for (int64_t q = b; q < e; q++) {
      int64_t u = s->order[q];
      if (s->res[u] >= 0) continue;
      int best = -1;
      for (int w = 0; w < UR_CACHE_WAYS; w++) {
        int64_t sl = base + w;
        if (d->tag[sl] == EMPTY) {
          best = w;
          break;
        }
        if (d->stamp[sl] >= j->floor) continue;
        if (best < 0) {
          best = w;
          continue;
        }
        int64_t sb = base + best;
        if (freq) {
          uint32_t fs = ur__cache_freq_now(freq[d->tag[sl]], j->epoch);
          uint32_t fb = ur__cache_freq_now(freq[d->tag[sb]], j->epoch);
          if (fs < fb || (fs == fb && d->stamp[sl] < d->stamp[sb])) best = w;
        } else if (d->stamp[sl] < d->stamp[sb]) {
          best = w;
        }
      }
      if (best < 0) continue; /* conflict: staged */
      int64_t sl = base + best;
      if (d->tag[sl] != EMPTY)
        s->evict[u] = (int64_t)(d->tag[sl] | (d->dirty[sl] ? (uint64_t)1 << 63 : 0));
      d->tag[sl] = s->ukeys[u];
      d->stamp[sl] = j->ticket;
      d->dirty[sl] = 0;
      s->res[u] = sl;
    }
  }
}

static void rebase_range(void *ctx, size_t k0, size_t k1) {
  const pass *p = ctx;
  uint32_t *freq = p->d->freq, epoch = p->j->epoch;
  for (size_t k = k0; k < k1; k++) freq[k] = ur__cache_freq_rebase(freq[k], epoch);
}

/* LFU counts first (halved once per decay period, lazily, see cache_sets.h; every key's
 * re-based first when the host asks), then the sets;
 * then the counts of the batch, each distinct key's to its table, each eviction's to the
 * evicted row's table. */
static ur_status cpu_decide(void *stream, const ur__cache_dev *d, const ur__cache_job *j) {
  scratch s;
  carve(d, j->n, j->scratch, &s);
  pass p = {d, j, &s};
  if (j->lfu && j->rebase) ur__parallel_for((size_t)d->keys, 1 << 16, rebase_range, &p);
  if (j->lfu)
    for (int64_t u = 0; u < j->U; u++) {
      uint32_t *f = &d->freq[s.ukeys[u]];
      uint32_t x = ur__cache_freq_now(*f, j->epoch) + 1;
      *f = (j->epoch << 16) | (x > 0xffffu ? 0xffffu : x);
    }
  ur__parallel_for((size_t)j->ng, 64, decide_range, &p);
  int64_t nwb = 0, nfill = 0, nconf = 0;
  for (int32_t ct = 0; ct < d->nt; ct++) {
    int64_t *t = table_info(j, ct);
    t[UR__CT_UNIQUE] = t[UR__CT_HITS] = t[UR__CT_MISSES] = t[UR__CT_CONFLICTS] = 0;
    t[UR__CT_EVICTIONS] = t[UR__CT_WRITEBACKS] = 0;
  }
  for (int64_t u = 0, ct = 0; u < j->U; u++) {
    while (ct + 1 < d->nt && u >= s.bunique[ct + 1]) ct++;
    int64_t *t = table_info(j, (int32_t)ct), r = s.res[u], ev = s.evict[u];
    t[UR__CT_UNIQUE]++;
    if (r < 0) {
      nconf++;
      t[UR__CT_CONFLICTS]++;
    } else if (r & HIT_BIT) {
      t[UR__CT_HITS]++;
    } else {
      nfill++;
      t[UR__CT_MISSES]++;
    }
    if (ev != (int64_t)EMPTY) {
      int64_t *et = table_info(j, ur__cache_table_of(d->kbase, d->nt, (uint64_t)ev & ~((uint64_t)1 << 63)));
      et[UR__CT_EVICTIONS]++;
      if ((uint64_t)ev >> 63) {
        nwb++;
        et[UR__CT_WRITEBACKS]++;
      }
    }
  }
  j->info[UR__CI_NWB] = nwb;
  j->info[UR__CI_NFILL] = nfill;
  j->info[UR__CI_NCONF] = nconf;
  copy_info(d, j);
  return UR_STATUS_OK;
}

/* ---- place ---- */

static void map_range(void *ctx, size_t t0, size_t t1) {
  const pass *p = ctx;
  const scratch *s = p->s;
  for (size_t ct = t0; ct < t1; ct++)
    for (int64_t i = s->bstart[ct]; i < s->bstart[ct] + s->bvalid[ct]; i++)
      p->j->out[s->vidx[i]] = s->res[s->uniq_of[i]];
}

static ur_status cpu_place(void *stream, const ur__cache_dev *d, const ur__cache_job *j) {
  scratch s;
  carve(d, j->n, j->scratch, &s);
  int64_t *lists = j->lists, *row_ids = j->row_ids;
  int64_t iw = 0, il = 2 * j->nwb, is = 2 * (j->nwb + j->nfill);
  int64_t isl = 2 * (j->nwb + j->nfill + j->nconf), conf = 0;
  /* in key order (u ascending: table by table), which is also the staging rows' order */
  for (int64_t u = 0, ct = 0; u < j->U; u++) {
    while (ct + 1 < d->nt && u >= s.bunique[ct + 1]) ct++;
    uint64_t key = s.ukeys[u];
    uint64_t pair = ((uint64_t)ct << UR__CACHE_ROW_BITS) | (key - (uint64_t)d->kbase[ct]);
    int64_t ev = s.evict[u];
    if (ev != (int64_t)EMPTY && ((uint64_t)ev >> 63)) {
      lists[iw++] = (int64_t)ur__cache_pair_of(d->kbase, d->nt, (uint64_t)ev & ~((uint64_t)1 << 63));
      lists[iw++] = s.res[u];
    }
    if (s.res[u] < 0) {
      int64_t r = j->sbase + conf++;
      lists[is++] = (int64_t)pair;
      lists[is++] = r;
      row_ids[r] = (int64_t)(pair & UR__CACHE_ROW_MASK);
      s.res[u] = r;
    } else if (s.res[u] & HIT_BIT) {
      s.res[u] &= ~HIT_BIT;
      lists[isl++] = s.res[u];
    } else {
      lists[il++] = (int64_t)pair;
      lists[il++] = s.res[u];
      row_ids[s.res[u]] = (int64_t)(pair & UR__CACHE_ROW_MASK);
      lists[isl++] = s.res[u];
    }
  }
  /* slot ids of every value: the cached ones from their key, the others as they are */
  for (int64_t v = 0; v < j->n; v++) j->out[v] = j->vals[v];
  for (int32_t f = 0; f < d->F; f++)
    if (d->feat_ct[f] >= 0)
      for (int64_t v = s.fv0[f]; v < s.fv1[f]; v++) j->out[v] = -1; /* bad ids stay -1 */
  pass p = {d, j, &s};
  ur__parallel_for((size_t)d->nt, 1, map_range, &p);
  return UR_STATUS_OK;
}

/* ---- rows and marks ---- */

static void cpu_rows(const ur__cache_io *io, const int64_t *e, int64_t n, int to_host) {
  size_t rb = (size_t)io->row_bytes, sb = (size_t)io->state_per_row * 4;
  for (int64_t i = 0; i < n; i++) {
    uint64_t p = (uint64_t)e[2 * i];
    int32_t ct = (int32_t)(p >> UR__CACHE_ROW_BITS);
    int64_t row = (int64_t)(p & UR__CACHE_ROW_MASK), r = e[2 * i + 1];
    char *hw = (char *)io->host_w[ct] + (size_t)row * rb;
    char *sw = (char *)io->slot_w + (size_t)r * rb;
    if (to_host) memcpy(hw, sw, rb);
    else memcpy(sw, hw, rb);
    float *hs[2] = {io->host_s1[ct], io->host_s2[ct]}, *ss[2] = {io->slot_s1, io->slot_s2};
    for (int k = 0; k < io->nstate; k++) {
      char *h = (char *)(hs[k] + (size_t)row * (size_t)io->state_per_row);
      char *sl = (char *)(ss[k] + (size_t)r * (size_t)io->state_per_row);
      if (to_host) memcpy(h, sl, sb);
      else memcpy(sl, h, sb);
    }
  }
}

/* Write-backs, then fills, in place: the spare scratch is not needed. */
static ur_status cpu_move(void *stream, const ur__cache_io *io, const int64_t *out, int64_t n_out,
                          const int64_t *in, int64_t n_in, void *spare, size_t spare_bytes) {
  cpu_rows(io, out, n_out, 1);
  cpu_rows(io, in, n_in, 0);
  return UR_STATUS_OK;
}

static ur_status cpu_mark(void *stream, uint8_t *dirty, const int64_t *slots, int64_t n) {
  for (int64_t i = 0; i < n; i++) dirty[slots[i]] = 1;
  return UR_STATUS_OK;
}

const ur_cache_ops ur__cpu_cache_ops = {
    .move = cpu_move,
    .scratch = cpu_scratch,
    .lookup = cpu_lookup,
    .decide = cpu_decide,
    .place = cpu_place,
    .mark = cpu_mark,
};
