/* pages.c: page prefetch for the `managed` tables of an embedding collection.  The prefetch
 * pipeline knows batch i+1's ids while batch i trains; this turns them into the runs of pages
 * those rows live on (through the permutation in force), skips what the hint policy already
 * keeps on the GPU, and asks the driver to move the rest ahead of the forward pass.
 *
 * Per batch: the ids of each managed table's features are gathered as physical rows (in
 * parallel over features), each table's rows are sorted by a radix sort and deduplicated (in
 * parallel over tables), and the ascending rows become ascending pages, coalesced into runs
 * as they come: O(ids + pages touched), no per-page search and no bitmap to clear. */
#include <stdlib.h>
#include <string.h>
#include "embedding/table.h"

#define MAX_TENSORS 3    /* weights and up to two optimizer states */
#define SMALL_SORT 256   /* fewer rows than this: qsort beats the radix passes' counts */

typedef struct page_tensor {
  ur_tensor *x;          /* a view: the table's weights or one optimizer state */
  int32_t which;         /* 0 weights, k: state k - 1 */
  uint64_t base;         /* byte of row 0 in the storage */
  uint64_t row_bytes;
} page_tensor;

typedef struct page_table {
  int managed;           /* managed weights and no cache */
  int64_t rows;
  page_tensor tens[MAX_TENSORS];
  int32_t ntens;
  /* the permutation as the host reads it: the collection's own array when that is in host
   * memory, else a mirror read again when its generation moves */
  const int64_t *perm;
  int64_t *mirror;
  uint64_t mirror_gen;
  int mirror_valid;
  /* this batch */
  int64_t first, count;  /* its ids' slice of the key arrays */
  int64_t uniq, pages, skipped;
  ur_page_run *runs;
  size_t nruns, cap;
  int oom;
} page_table;

struct ur__pages {
  int32_t T, F;
  page_table *tab;
  int64_t *fpos;         /* per feature: first slot of its ids in the key arrays */
  int64_t *fbad;         /* per feature: first bad value index, or -1 */
  int64_t *fskip;        /* per feature: ids skipped */
  uint64_t *keys, *tmp;
  size_t kcap, tcap;
  int64_t *hv, *ho;      /* host copies of device values / offsets */
  size_t hvcap, hocap;
  ur_page_run *all;
  size_t nall, allcap;
  uint64_t page;         /* the page size the tensors' views were set up for */
};

size_t ur_sizeof_page_run(void) { return sizeof(ur_page_run); }
size_t ur_sizeof_page_stats(void) { return sizeof(ur_page_stats); }

/* The collection's hook: its state goes with it. */
static void pages_free(void *ctx) {
  struct ur__pages *p = ctx;
  for (int32_t i = 0; p->tab && i < p->T; i++) {
    page_table *pt = &p->tab[i];
    for (int32_t k = 0; k < pt->ntens; k++) ur_tensor_free(pt->tens[k].x);
    free(pt->mirror);
    free(pt->runs);
  }
  free(p->tab);
  free(p->fpos);
  free(p->fbad);
  free(p->fskip);
  free(p->keys);
  free(p->tmp);
  free(p->hv);
  free(p->ho);
  free(p->all);
  free(p);
}

static ur_status oom(const char *what) {
  return ur__error(UR_STATUS_OOM, "tbe: prefetch_pages: out of host memory for %s", what);
}

static ur_status grow(void **buf, size_t *cap, size_t need, size_t elem, const char *what) {
  if (need <= *cap) return UR_STATUS_OK;
  size_t n = need + need / 2 + 16;
  void *b = realloc(*buf, n * elem);
  if (!b) return oom(what);
  *buf = b;
  *cap = n;
  return UR_STATUS_OK;
}

/* The tables' views, made once: a table's storage and its cache don't change after the cache
 * is made (ur_cache_new redirects before any batch; a cached table is left out). */
static ur_status pages_state(ur_tbe *t, struct ur__pages **out) {
  if (t->pages) {
    *out = t->pages;
    return UR_STATUS_OK;
  }
  struct ur__pages *p = calloc(1, sizeof *p);
  if (!p) return oom("its state");
  p->T = ur_tbe_num_tables(t);
  p->F = ur_tbe_num_features(t);
  p->tab = calloc((size_t)p->T, sizeof *p->tab);
  p->fpos = calloc((size_t)p->F, sizeof *p->fpos);
  p->fbad = calloc((size_t)p->F, sizeof *p->fbad);
  p->fskip = calloc((size_t)p->F, sizeof *p->fskip);
  ur_status st = !p->tab || !p->fpos || !p->fbad || !p->fskip ? oom("its state") : UR_STATUS_OK;
  for (int32_t i = 0; i < p->T && !st; i++) {
    page_table *pt = &p->tab[i];
    ur_tensor *w = NULL;
    if ((st = ur_tbe_table(t, i, &w))) break;
    pt->rows = ur_tensor_dim(w, 0);
    pt->managed = ur_tensor_place(w) == UR_PLACE_MANAGED && !t->owner[i];
    if (!pt->managed) {
      ur_tensor_free(w);
      continue;
    }
    pt->tens[pt->ntens++] = (page_tensor){w, 0, 0, 0};
    for (int32_t k = 0; k < ur_tbe_state_count(t) && !st; k++) {
      ur_tensor *s = NULL;
      if ((st = ur_tbe_state(t, i, k, &s))) break;
      if (ur_tensor_place(s) == UR_PLACE_MANAGED) pt->tens[pt->ntens++] = (page_tensor){s, k + 1, 0, 0};
      else ur_tensor_free(s);
    }
    for (int32_t k = 0; k < pt->ntens; k++) {
      page_tensor *pg = &pt->tens[k];
      uint64_t es = ur_dtype_size(ur_tensor_dtype(pg->x));
      pg->base = (uint64_t)ur_tensor_offset(pg->x) * es;
      pg->row_bytes = ur_tensor_nbytes(pg->x) / (uint64_t)pt->rows;
    }
  }
  if (!st) st = ur__tbe_hook_add(t, pages_free, p);
  if (st) {
    pages_free(p);
    return st;
  }
  t->pages = p;
  *out = p;
  return UR_STATUS_OK;
}

/* The permutation of table i as the host can read it (NULL: the identity). */
static ur_status host_perm(ur_tbe *t, page_table *pt, int32_t i) {
  const ur_tensor *perm = t->perm[i];
  ur_status st = UR_STATUS_OK;
  pt->perm = NULL;
  if (!perm) {
    pt->mirror_valid = 0;
    return UR_STATUS_OK;
  }
  if (ur_tensor_place(perm) != UR_PLACE_DEVICE) {
    pt->perm = ur_tensor_data(perm);
    return UR_STATUS_OK;
  }
  uint64_t gen = t->perm_gen[i];
  if (!pt->mirror_valid || pt->mirror_gen != gen) {
    if (!pt->mirror && !(pt->mirror = malloc(sizeof(int64_t) * (size_t)pt->rows)))
      st = oom("a permutation's mirror");
    if (!st) st = ur_tensor_read(perm, 0, pt->rows, pt->mirror);
    pt->mirror_valid = !st;
    pt->mirror_gen = gen;
  }
  if (!st) pt->perm = pt->mirror;
  return st;
}

/* Host pointers to a tensor's i64 elements: its memory when the CPU may read it in place, else
 * a copy (device memory; managed memory a GPU may be writing through another stream). */
static ur_status host_i64(const ur_tensor *x, int64_t **buf, size_t *cap, const int64_t **out,
                          const char *what) {
  ur_place pl = ur_tensor_place(x);
  if (pl == UR_PLACE_HOST || pl == UR_PLACE_PINNED || !ur__gpu()) {
    *out = ur_tensor_data(x);
    return UR_STATUS_OK;
  }
  size_t n = (size_t)ur_tensor_numel(x);
  ur_status st = grow((void **)buf, cap, n ? n : 1, sizeof(int64_t), what);
  if (!st) st = ur_tensor_read(x, 0, (int64_t)n, *buf);
  if (!st) *out = *buf;
  return st;
}

/* ---- one batch ---- */

typedef struct job {
  ur_tbe *t;
  struct ur__pages *p;
  const int64_t *v, *o, *bag_start; /* bag_start: [F + 1] */
  int fatal;
  uint64_t page;
} job;

/* Feature f's ids as physical rows into its slice; bad ids become `rows` (sorted last). */
static void gather_range(void *ctx, size_t f0, size_t f1) {
  const job *j = ctx;
  for (int32_t f = (int32_t)f0; f < (int32_t)f1; f++) {
    const page_table *pt = &j->p->tab[ur_tbe_feature_table(j->t, f)];
    j->p->fbad[f] = -1;
    j->p->fskip[f] = 0;
    if (!pt->managed) continue;
    int64_t s = j->o[j->bag_start[f]], e = j->o[j->bag_start[f + 1]], skip = 0;
    uint64_t *k = j->p->keys + j->p->fpos[f];
    for (int64_t i = s; i < e; i++) {
      int64_t id = j->v[i];
      if (id < 0 || id >= pt->rows) {
        if (j->p->fbad[f] < 0) j->p->fbad[f] = i;
        skip++;
        k[i - s] = (uint64_t)pt->rows;
        continue;
      }
      k[i - s] = (uint64_t)(pt->perm ? pt->perm[id] : id);
    }
    j->p->fskip[f] = skip;
  }
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* Sorts k[0..n) (keys below 2^bits) with tmp as scratch; the result ends in k. */
static void sort_keys(uint64_t *k, uint64_t *tmp, int64_t n, int bits) {
  if (n < SMALL_SORT) {
    qsort(k, (size_t)n, sizeof *k, cmp_u64);
    return;
  }
  uint64_t *src = k, *dst = tmp;
  ur__radix_sort(&src, NULL, &dst, NULL, n, bits);
  if (src != k) memcpy(k, src, sizeof *k * (size_t)n);
}

static int add_run(page_table *pt, int32_t table, int32_t which, uint64_t b, uint64_t e) {
  if (pt->nruns == pt->cap) {
    size_t n = pt->cap ? 2 * pt->cap : 16;
    ur_page_run *r = realloc(pt->runs, n * sizeof *r);
    if (!r) return 0;
    pt->runs = r;
    pt->cap = n;
  }
  pt->runs[pt->nruns++] = (ur_page_run){table, which, b, e, 0};
  return 1;
}

/* Table i: its rows sorted and deduplicated (in place), then per tensor the runs of pages. */
static void table_range(void *ctx, size_t i0, size_t i1) {
  const job *j = ctx;
  for (int32_t i = (int32_t)i0; i < (int32_t)i1; i++) {
    page_table *pt = &j->p->tab[i];
    pt->nruns = 0;
    pt->uniq = pt->pages = 0;
    pt->oom = 0;
    if (!pt->managed || !pt->count) continue;
    uint64_t *k = j->p->keys + pt->first;
    sort_keys(k, j->p->tmp + pt->first, pt->count, ur__key_bits((uint64_t)pt->rows));
    int64_t u = 0;
    for (int64_t a = 0; a < pt->count && k[a] < (uint64_t)pt->rows; a++)
      if (!u || k[a] != k[u - 1]) k[u++] = k[a];
    pt->uniq = u;
    if (!u) continue;
    uint64_t P = j->page;
    for (int32_t x = 0; x < pt->ntens; x++) {
      const page_tensor *pg = &pt->tens[x];
      uint64_t alloc = pg->x->st->alloc_bytes;
      uint64_t rb = pg->base + k[0] * pg->row_bytes;
      uint64_t run0 = rb / P, run1 = (rb + pg->row_bytes - 1) / P; /* inclusive pages */
      pt->pages += (int64_t)(run1 - run0 + 1);
      for (int64_t a = 1; a < u; a++) {
        uint64_t b = pg->base + k[a] * pg->row_bytes;
        uint64_t p0 = b / P, p1 = (b + pg->row_bytes - 1) / P;
        if (p0 <= run1 + 1) {
          if (p1 > run1) {
            pt->pages += (int64_t)(p1 - (p0 > run1 ? p0 : run1 + 1) + 1);
            run1 = p1;
          }
          continue;
        }
        uint64_t e = (run1 + 1) * P;
        if (!add_run(pt, i, pg->which, run0 * P, e < alloc ? e : alloc)) pt->oom = 1;
        pt->pages += (int64_t)(p1 - p0 + 1);
        run0 = p0;
        run1 = p1;
      }
      uint64_t e = (run1 + 1) * P;
      if (!add_run(pt, i, pg->which, run0 * P, e < alloc ? e : alloc)) pt->oom = 1;
    }
  }
}

/* Marks the runs of one tensor that lie wholly in segments preferred on or prefetched to loc.
 * Runs ascend, so one walk over the segment map serves them all (call with ur__lock held). */
static void mark_skipped(const ur__segmap *m, ur_page_run *r, size_t n, int32_t loc) {
  size_t s = 0;
  for (size_t k = 0; k < n; k++) {
    while (s + 1 < m->n && m->v[s].end <= r[k].byte_begin) s++;
    int all = 1;
    for (size_t q = s; q < m->n && m->v[q].begin < r[k].byte_end && all; q++)
      all = m->v[q].preferred == loc || m->v[q].prefetched == loc;
    r[k].skipped = all;
  }
}

static ur_status check_ids_tensor(const ur_tensor *x, const char *what) {
  if (!x) return ur__error(UR_STATUS_INVALID, "tbe: prefetch_pages: %s is required", what);
  if (ur_tensor_dtype(x) != UR_DTYPE_I64 || ur_tensor_ndim(x) != 1)
    return ur__error(UR_STATUS_INVALID,
                     "tbe: prefetch_pages: %s is %s with %d dimensions; expected i64 with 1",
                     what, ur_dtype_name(ur_tensor_dtype(x)), (int)ur_tensor_ndim(x));
  return UR_STATUS_OK;
}

/* The error of the first bad id: the forward's (table, feature, sample, value, id). */
static ur_status bad_id(const ur_tbe *t, const job *j, int32_t f, int64_t i) {
  int64_t lo = j->bag_start[f], hi = j->bag_start[f + 1]; /* the last bag with o[bag] <= i */
  while (hi - lo > 1) {
    int64_t mid = lo + (hi - lo) / 2;
    if (j->o[mid] <= i) lo = mid;
    else hi = mid;
  }
  int32_t tb = ur_tbe_feature_table(t, f);
  return ur__tbe_bad_id(t->names.who, ur_tbe_table_name(t, tb), ur_tbe_feature_name(t, f),
                        lo - j->bag_start[f], i, j->v[i], 0, j->p->tab[tb].rows);
}

static ur_status compute(ur_tbe *t, const ur_tensor *values, const ur_tensor *offsets,
                         const int64_t *spk, int32_t location, ur_page_stats *out,
                         struct ur__pages **pp) {
  memset(out, 0, sizeof *out);
  ur_status st;
  int32_t loc;
  if ((st = check_ids_tensor(values, "values")) || (st = check_ids_tensor(offsets, "offsets")) ||
      (st = ur__hint_location(location, ur_tbe_device(t), "tbe: prefetch_pages",
                                  "the collection's gpu", &loc)))
    return st;
  out->location = loc;
  struct ur__pages *p = NULL;
  if ((st = pages_state(t, &p))) return st;
  *pp = p;
  p->nall = 0;
  int32_t F = p->F;
  int64_t n = ur_tensor_numel(values), bags = ur_tensor_numel(offsets) - 1;
  if (bags < 0)
    return ur__error(UR_STATUS_INVALID, "tbe: prefetch_pages: offsets is empty; expected bags + 1 entries");
  int64_t *bag_start = malloc(sizeof(int64_t) * ((size_t)F + 1));
  if (!bag_start) return oom("the bags");
  bag_start[0] = 0;
  for (int32_t f = 0; f < F && !st; f++) {
    if (spk && spk[f] < 0)
      st = ur__error(UR_STATUS_INVALID, "tbe: prefetch_pages: feature '%s' has batch %lld; expected >= 0",
                     ur_tbe_feature_name(t, f), (long long)spk[f]);
    bag_start[f + 1] = bag_start[f] + (spk ? spk[f] : bags / F);
  }
  if (!st && spk && bag_start[F] != bags)
    st = ur__error(UR_STATUS_INVALID,
                   "tbe: prefetch_pages: stride_per_key_per_rank sums to %lld bags but offsets hold %lld",
                   (long long)bag_start[F], (long long)bags);
  if (!st && !spk && bags % F)
    st = ur__error(UR_STATUS_INVALID,
                   "tbe: prefetch_pages: %lld bags do not split evenly over %d features; pass "
                   "stride_per_key_per_rank for a variable batch", (long long)bags, (int)F);
  const int64_t *v = NULL, *o = NULL;
  if (!st) st = host_i64(offsets, &p->ho, &p->hocap, &o, "offsets");
  if (!st && o[0] != 0)
    st = ur__error(UR_STATUS_INVALID, "tbe: prefetch_pages: offsets[0] is %lld; expected 0", (long long)o[0]);
  for (int64_t b = 0; b < bags && !st; b++)
    if (o[b + 1] < o[b])
      st = ur__error(UR_STATUS_INVALID,
                     "tbe: prefetch_pages: offsets[%lld] = %lld is below offsets[%lld] = %lld; "
                     "offsets must not decrease",
                     (long long)(b + 1), (long long)o[b + 1], (long long)b, (long long)o[b]);
  if (!st && o[bags] != n)
    st = ur__error(UR_STATUS_INVALID, "tbe: prefetch_pages: offsets end at %lld for %lld value%s",
                   (long long)o[bags], (long long)n, ur__s(n));
  if (!st) st = host_i64(values, &p->hv, &p->hvcap, &v, "values");
  /* each managed table's slice of the key arrays, its features' ids one after the other */
  int64_t total = 0;
  for (int32_t i = 0; i < p->T && !st; i++) {
    page_table *pt = &p->tab[i];
    pt->first = total;
    pt->count = 0;
    if (!pt->managed) continue;
    for (int32_t f = 0; f < F; f++) {
      if (ur_tbe_feature_table(t, f) != i) continue;
      p->fpos[f] = total + pt->count;
      pt->count += o[bag_start[f + 1]] - o[bag_start[f]];
    }
    total += pt->count;
    st = host_perm(t, pt, i);
  }
  if (!st) st = grow((void **)&p->keys, &p->kcap, (size_t)(total ? total : 1), sizeof(uint64_t), "the ids");
  if (!st) st = grow((void **)&p->tmp, &p->tcap, p->kcap, sizeof(uint64_t), "the ids");
  if (st) {
    free(bag_start);
    return st;
  }
  uint64_t page = ur_hint_page_bytes_get();
  job j = {t, p, v, o, bag_start, t->cfg.bounds == UR_TBE_BOUNDS_FATAL, page};
  ur__parallel_for((size_t)F, 1, gather_range, &j);
  int32_t bf = -1;
  for (int32_t f = 0; f < F; f++) {
    out->skipped_ids += p->fskip[f];
    if (p->fbad[f] >= 0 && (bf < 0 || p->fbad[f] < p->fbad[bf])) bf = f;
  }
  out->ids = total;
  if (j.fatal && bf >= 0) {
    st = bad_id(t, &j, bf, p->fbad[bf]);
    free(bag_start);
    return st;
  }
  ur__parallel_for((size_t)p->T, 1, table_range, &j);
  free(bag_start);
  size_t nall = 0;
  for (int32_t i = 0; i < p->T; i++) {
    if (p->tab[i].oom) return oom("the runs");
    nall += p->tab[i].nruns;
  }
  if ((st = grow((void **)&p->all, &p->allcap, nall ? nall : 1, sizeof(ur_page_run), "the runs"))) return st;
  pthread_mutex_lock(&ur__lock);
  for (int32_t i = 0; i < p->T; i++) {
    page_table *pt = &p->tab[i];
    out->rows += pt->uniq;
    out->pages += pt->pages;
    /* a table's runs are grouped by tensor, each group ascending */
    for (size_t a = 0; a < pt->nruns;) {
      size_t b = a;
      while (b < pt->nruns && pt->runs[b].tensor == pt->runs[a].tensor) b++;
      const page_tensor *pg = NULL;
      for (int32_t x = 0; x < pt->ntens; x++)
        if (pt->tens[x].which == pt->runs[a].tensor) pg = &pt->tens[x];
      mark_skipped(&pg->x->st->hints, pt->runs + a, b - a, loc);
      a = b;
    }
    if (pt->nruns) memcpy(p->all + p->nall, pt->runs, pt->nruns * sizeof *pt->runs);
    p->nall += pt->nruns;
  }
  pthread_mutex_unlock(&ur__lock);
  for (size_t k = 0; k < p->nall; k++) {
    uint64_t b = p->all[k].byte_end - p->all[k].byte_begin;
    out->runs++;
    if (p->all[k].skipped) {
      out->runs_skipped++;
      out->bytes_skipped += b;
    } else {
      out->bytes += b;
    }
  }
  return UR_STATUS_OK;
}

ur_status ur_tbe_page_runs(ur_tbe *t, const ur_tensor *values, const ur_tensor *offsets,
                           const int64_t *stride_per_key_per_rank, ur_page_stats *out, int32_t location) {
  UR__ARGS(t, values, offsets, out);
  struct ur__pages *p = NULL;
  ur_status st = compute(t, values, offsets, stride_per_key_per_rank, location, out, &p);
  if (st && p) p->nall = 0;
  return st;
}

ur_status ur_tbe_prefetch_pages(ur_stream *s, ur_tbe *t, const ur_tensor *values,
                                const ur_tensor *offsets, const int64_t *stride_per_key_per_rank,
                                ur_page_stats *out, int32_t location) {
  UR__ARGS(t, values, offsets, out);
  struct ur__pages *p = NULL;
  ur_status st = compute(t, values, offsets, stride_per_key_per_rank, location, out, &p);
  if (st) {
    if (p) p->nall = 0;
    return st;
  }
  /* a backend without prefetches (the CPU's) reads managed pages where they are: nothing to move */
  if (!t->be->prefetch) return UR_STATUS_OK;
  for (size_t k = 0; k < p->nall && !st; k++) {
    const ur_page_run *r = &p->all[k];
    if (r->skipped) continue;
    const page_table *pt = &p->tab[r->table];
    const ur__storage *sto = NULL;
    for (int32_t x = 0; x < pt->ntens; x++)
      if (pt->tens[x].which == r->tensor) sto = pt->tens[x].x->st;
    st = t->be->prefetch(s ? s->handle : NULL, (char *)sto->data + r->byte_begin,
                     (size_t)(r->byte_end - r->byte_begin), out->location);
  }
  out->issued = 1;
  return st;
}

const ur_page_run *ur_tbe_last_page_runs(const ur_tbe *t, int64_t *count) {
  UR__ARGS_OR(NULL, t, count);
  const struct ur__pages *p = t->pages;
  *count = p ? (int64_t)p->nall : 0;
  return p ? p->all : NULL;
}
