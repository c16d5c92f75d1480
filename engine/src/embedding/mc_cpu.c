/* mc_cpu.c: the CPU's managed-collisions table (mc.h), the reference kernels/mc.cu follows: a
 * batch's lookups on every core (the index read-only, counts and candidates by atomic integer
 * adds, so the result is the same whatever the threads do), and a round in plain C: the
 * candidates ranked best first, the residents that could lose their rows selected worst first
 * by a heap, admissions and evictions, the index updated in place (deletion by backward
 * shifting, so no tombstones build up). */
#include <stdlib.h>
#include <string.h>
#include "embedding/mc.h"

/* ---- a batch ---- */

typedef struct remap_job {
  const ur__mc_batch *b;
} remap_job;

/* Adds mult lookups of a non-resident id to the candidates (room was checked: admit). */
static void cand_add(const ur__mc_table *t, int64_t id, int32_t mult, int64_t step) {
  uint64_t s = ur__mc_hash(t, id) & (uint64_t)t->qmask;
  for (;;) {
    int64_t k = __atomic_load_n(&t->ckeys[s], __ATOMIC_ACQUIRE);
    if (k == UR__MC_EMPTY) {
      int64_t expected = UR__MC_EMPTY;
      if (__atomic_compare_exchange_n(&t->ckeys[s], &expected, id, 0, __ATOMIC_ACQ_REL,
                                      __ATOMIC_ACQUIRE)) {
        __atomic_fetch_add(&t->info[UR__MI_CAND], 1, __ATOMIC_RELAXED);
        k = id;
      } else {
        k = expected;
      }
    }
    if (k == id) {
      __atomic_fetch_add(&t->ccount[s], mult, __ATOMIC_RELAXED);
      __atomic_store_n(&t->clast[s], step, __ATOMIC_RELAXED); /* every writer stores this step */
      return;
    }
    s = (s + 1) & (uint64_t)t->qmask;
  }
}

static void remap_range(void *ctx, size_t b0, size_t b1) {
  const ur__mc_batch *b = ((const remap_job *)ctx)->b;
  int32_t f = 0;
  while (f + 1 < b->F && b->bag_start[f + 1] <= (int64_t)b0) f++;
  for (int64_t bag = (int64_t)b0; bag < (int64_t)b1; bag++) {
    while (bag >= b->bag_start[f + 1]) f++;
    int32_t ti = b->feat_table[f];
    int64_t o0 = b->offsets[bag], o1 = b->offsets[bag + 1];
    if (ti < 0) {
      for (int64_t v = o0; v < o1; v++) b->out[v] = b->values[v];
      continue;
    }
    const ur__mc_table *t = &b->tables[ti];
    int32_t mult = b->mult ? b->mult[bag] : 1;
    int count = b->update && mult > 0;
    int admit = count && *t->admit;
    int64_t res = 0, fb = 0;
    for (int64_t v = o0; v < o1; v++) {
      int64_t id = b->values[v];
      int64_t row = id == UR__MC_EMPTY ? -1 : ur__mc_find(t, id);
      if (row >= 0) {
        b->out[v] = row;
        if (count) {
          __atomic_fetch_add(&t->window[row], mult, __ATOMIC_RELAXED);
          __atomic_store_n(&t->last[row], b->step, __ATOMIC_RELAXED);
          res += mult;
        }
      } else {
        b->out[v] = ur__mc_fallback_row(t, id);
        if (count) fb += mult;
        if (admit && id != UR__MC_EMPTY) cand_add(t, id, mult, b->step);
      }
    }
    if (count && (res || fb)) {
      __atomic_fetch_add(&t->info[UR__MI_LOOKUPS], res + fb, __ATOMIC_RELAXED);
      __atomic_fetch_add(&t->info[UR__MI_RESIDENT], res, __ATOMIC_RELAXED);
      __atomic_fetch_add(&t->info[UR__MI_FALLBACK], fb, __ATOMIC_RELAXED);
    }
  }
}

/* Asks for no memory: the rounds of an updating batch ran before it (mc.c), so a failure here
 * would fail a batch that had changed the map.  Each table's ids this batch are summed into its
 * info[NVALS], which the table keeps, not into an array of the batch's own. */
static ur_status cpu_remap(void *stream, const ur__mc_batch *b) {
  (void)stream;
  if (b->update) {
    for (int32_t t = 0; t < b->T; t++) b->tables[t].info[UR__MI_NVALS] = 0;
    for (int32_t f = 0; f < b->F; f++)
      if (b->feat_table[f] >= 0)
        b->tables[b->feat_table[f]].info[UR__MI_NVALS] +=
            b->offsets[b->bag_start[f + 1]] - b->offsets[b->bag_start[f]];
    for (int32_t t = 0; t < b->T; t++) {
      const ur__mc_table *tb = &b->tables[t];
      *tb->admit = tb->info[UR__MI_CAND] + tb->info[UR__MI_NVALS] <= (tb->qmask + 1) / 2;
      if (!*tb->admit) tb->info[UR__MI_SKIPPED]++;
    }
  }
  if (b->mult) {
    memset(b->mult, 0, sizeof(int32_t) * (size_t)b->bags);
    for (int32_t f = 0; f < b->F; f++)
      for (int64_t j = 0; j < b->batch; j++)
        b->mult[b->bag_start[f] + b->inverse[(int64_t)f * b->batch + j]]++;
  }
  remap_job j = {b};
  /* Threads start per call: only batches whose lookups outweigh that (thousands of cache
   * misses each) are split. */
  ur__parallel_for((size_t)b->bags, 8192, remap_range, &j);
  return UR_STATUS_OK;
}

static ur_status cpu_lookup(void *stream, const ur__mc_table *t, const int64_t *ids, int64_t n,
                            int64_t *rows, int32_t *resident) {
  (void)stream;
  for (int64_t i = 0; i < n; i++) {
    int64_t row = ids[i] == UR__MC_EMPTY ? -1 : ur__mc_find(t, ids[i]);
    rows[i] = row >= 0 ? row : ur__mc_fallback_row(t, ids[i]);
    if (resident) resident[i] = row >= 0;
  }
  return UR_STATUS_OK;
}

/* ---- the index ---- */

static void index_insert(const ur__mc_table *t, int64_t row) {
  uint64_t s = ur__mc_hash(t, t->ids[row]) & (uint64_t)t->pmask;
  while (t->index[s]) s = (s + 1) & (uint64_t)t->pmask;
  t->index[s] = (uint32_t)(row + 1);
}

/* Removes id (resident) by shifting back the entries after it that may move. */
static void index_delete(const ur__mc_table *t, int64_t id) {
  uint64_t mask = (uint64_t)t->pmask, s = ur__mc_hash(t, id) & mask;
  while (t->ids[t->index[s] - 1] != id) s = (s + 1) & mask;
  t->index[s] = 0;
  for (uint64_t j = (s + 1) & mask; t->index[j]; j = (j + 1) & mask) {
    uint64_t home = ur__mc_hash(t, t->ids[t->index[j] - 1]) & mask;
    /* the entry at j may fill the hole at s unless its home lies cyclically in (s, j] */
    int stays = s <= j ? (home > s && home <= j) : (home > s || home <= j);
    if (!stays) {
      t->index[s] = t->index[j];
      t->index[j] = 0;
      s = j;
    }
  }
}

static ur_status cpu_reindex(void *stream, const ur__mc_table *t, int64_t occupied) {
  (void)stream;
  for (int64_t r = 0; r < occupied; r++) index_insert(t, r);
  return UR_STATUS_OK;
}

/* ---- a round ---- */

typedef struct entry {
  double score;
  int64_t id, row;               /* row: a resident's; a candidate's slot */
} entry;

static int better(const entry *a, const entry *b) { return ur__mc_better(a->score, a->id, b->score, b->id); }

static int cmp_best_first(const void *x, const void *y) {
  const entry *a = x, *b = y;
  return better(a, b) ? -1 : better(b, a) ? 1 : 0;
}

static int cmp_worst_first(const void *x, const void *y) { return -cmp_best_first(x, y); }

static int cmp_row(const void *x, const void *y) {
  int64_t a = ((const entry *)x)->row, b = ((const entry *)y)->row;
  return a < b ? -1 : a > b;
}

/* A heap of the m worst residents seen: its top is the best of them. */
static void sift_down(entry *h, int64_t n, int64_t i) {
  for (;;) {
    int64_t l = 2 * i + 1, r = l + 1, top = i;
    if (l < n && better(&h[l], &h[top])) top = l;
    if (r < n && better(&h[r], &h[top])) top = r;
    if (top == i) return;
    entry x = h[i];
    h[i] = h[top];
    h[top] = x;
    i = top;
  }
}

static void sift_up(entry *h, int64_t i) {
  while (i > 0) {
    int64_t p = (i - 1) / 2;
    if (!better(&h[i], &h[p])) return;
    entry x = h[i];
    h[i] = h[p];
    h[p] = x;
    i = p;
  }
}

typedef struct kept_cand {
  int64_t id, last, count;
} kept_cand;

/* The worst residents a round may compare: no more than the rows, nor than the candidates. */
static size_t worst_max(const ur__mc_table *t) {
  size_t q = (size_t)t->qmask + 1, cap = (size_t)t->cap;
  return q < cap ? q : cap;
}

/* A round's scratch, taken before the round so that it fails, if at all, before any map
 * changes: the candidates ranked (at most a slot each), the worst residents (worst_max), the
 * candidates a fill leaves. */
static ur_status cpu_round_scratch(const ur__mc_table *t, size_t *bytes) {
  size_t q = (size_t)t->qmask + 1;
  *bytes = q * sizeof(entry) + worst_max(t) * sizeof(entry) + q * sizeof(kept_cand);
  return UR_STATUS_OK;
}

static void cand_clear(const ur__mc_table *t) {
  size_t q = (size_t)t->qmask + 1;
  for (size_t i = 0; i < q; i++) t->ckeys[i] = UR__MC_EMPTY;
  memset(t->ccount, 0, q * sizeof(int64_t));
  memset(t->clast, 0, q * sizeof(int64_t));
}

static ur_status cpu_round(void *stream, const ur__mc_table *t, ur__mc_round *r) {
  (void)stream;
  int64_t q = t->qmask + 1, nc = 0;
  for (int64_t s = 0; s < q; s++) nc += t->ckeys[s] != UR__MC_EMPTY;
  int64_t occ = r->occupied, empty = t->cap - occ;
  int64_t ep = nc < empty ? nc : empty;
  int64_t m = r->evict && nc > ep ? (nc - ep < occ ? nc - ep : occ) : 0;
  entry *c = r->scratch, *w = c + q;
  kept_cand *kept = (kept_cand *)(w + worst_max(t));
  int64_t k = 0;
  for (int64_t s = 0; s < q; s++)
    if (t->ckeys[s] != UR__MC_EMPTY) {
      c[k].id = t->ckeys[s];
      c[k].row = s;
      c[k].score = ur__mc_score(r->policy, 0, t->ccount[s], t->clast[s], r->now, r->power);
      k++;
    }
  qsort(c, (size_t)nc, sizeof(entry), cmp_best_first);
  /* the m worst residents, worst first */
  int64_t hn = 0;
  for (int64_t row = 0; row < occ && m > 0; row++) {
    entry x = {ur__mc_score(r->policy, t->counts[row], t->window[row], t->last[row], r->now,
                            r->power),
               t->ids[row], row};
    if (hn < m) {
      w[hn] = x;
      sift_up(w, hn++);
    } else if (better(&w[0], &x)) {
      w[0] = x;
      sift_down(w, hn, 0);
    }
  }
  qsort(w, (size_t)hn, sizeof(entry), cmp_worst_first);
  int64_t ev = 0;
  while (ev < hn && better(&c[ep + ev], &w[ev])) ev++;
  int64_t adm = ep + ev;
  /* freed rows ascending, then the free rows: the best candidate takes the lowest */
  qsort(w, (size_t)ev, sizeof(entry), cmp_row);
  for (int64_t j = 0; j < ev; j++) index_delete(t, t->ids[w[j].row]);
  if (r->evict)
    for (int64_t row = 0; row < occ; row++) {
      t->counts[row] = ur__mc_decayed(t->counts[row], t->window[row], r->decay);
      t->window[row] = 0;
    }
  for (int64_t j = 0; j < adm; j++) {
    int64_t row = j < ev ? w[j].row : occ + (j - ev), s = c[j].row;
    t->ids[row] = c[j].id;
    /* an eviction round folds the lookups; a fill keeps them as lookups since the last
     * eviction round, which lru's ties read */
    t->counts[row] = r->evict ? ur__mc_decayed(0, t->ccount[s], r->decay) : 0;
    t->window[row] = r->evict ? 0 : t->ccount[s];
    t->last[row] = t->clast[s];
    index_insert(t, row);
  }
  /* the candidates: forgotten after an eviction round; after a fill, those left stay */
  int64_t left = r->evict ? 0 : nc - adm;
  for (int64_t j = 0; j < left; j++) {
    int64_t s = c[adm + j].row;
    kept[j].id = t->ckeys[s];
    kept[j].count = t->ccount[s];
    kept[j].last = t->clast[s];
  }
  cand_clear(t);
  for (int64_t j = 0; j < left; j++) {
    uint64_t s = ur__mc_hash(t, kept[j].id) & (uint64_t)t->qmask;
    while (t->ckeys[s] != UR__MC_EMPTY) s = (s + 1) & (uint64_t)t->qmask;
    t->ckeys[s] = kept[j].id;
    t->ccount[s] = kept[j].count;
    t->clast[s] = kept[j].last;
  }
  t->info[UR__MI_CAND] = left;
  for (int64_t j = 0; j < ev; j++) r->rows[j] = w[j].row;
  r->admitted = adm;
  r->evicted = ev;
  r->candidates = nc;
  return UR_STATUS_OK;
}

static ur_status cpu_rehash(void *stream, const ur__mc_table *from, const ur__mc_table *to) {
  (void)stream;
  for (int64_t s = 0; s <= from->qmask; s++) {
    int64_t id = from->ckeys[s];
    if (id == UR__MC_EMPTY) continue;
    uint64_t d = ur__mc_hash(to, id) & (uint64_t)to->qmask;
    while (to->ckeys[d] != UR__MC_EMPTY) d = (d + 1) & (uint64_t)to->qmask;
    to->ckeys[d] = id;
    to->ccount[d] = from->ccount[s];
    to->clast[d] = from->clast[s];
  }
  return UR_STATUS_OK;
}

const ur_mc_ops ur__cpu_mc_ops = {
    .remap = cpu_remap,
    .lookup = cpu_lookup,
    .round_scratch = cpu_round_scratch,
    .round = cpu_round,
    .rehash = cpu_rehash,
    .reindex = cpu_reindex,
};
