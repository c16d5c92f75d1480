/* layout.c: row layout of embedding tables.  Ranking of rows by their access counts
 * (counters.c), and row permutations: a table may keep row id at physical row perm[id], so that
 * its hottest rows sit together at the front, where memory hints (which act on whole pages) can
 * place them.  Relayout moves rows and their optimizer state together and reports its cost; ids
 * are never remapped by the caller, the kernels look the permutation up. */
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include "embedding/table.h"

#define DEFAULT_CHUNK_ROWS ((int64_t)1 << 20)

size_t ur_sizeof_tbe_relayout_stats(void) { return sizeof(ur_tbe_relayout_stats); }

static ur_status check_index(const ur_tbe *t, int32_t i, const char *what) {
  if (i >= 0 && i < t->names.T) return UR_STATUS_OK;
  return ur__error(UR_STATUS_INVALID, "tbe: %s: table %d does not exist; expected 0..%d", what,
                   (int)i, (int)t->names.T - 1);
}

/* ---- ranking ---- */

/* Ids by count, highest first, ties by id: an LSD radix sort (stable) of ids 0..n-1 on
 * UINT32_MAX - count, 11 bits a digit.  The key sorts beside its id (the counts are read once,
 * not at every pass through the id), and a digit that every key shares is skipped: a pass of a
 * stable sort on it moves nothing (counts below 2^22, the usual case, share the top digit).
 * order and tmp hold n pairs of 32-bit key and id each (8 bytes, an i64's), so n < 2^32; cs
 * (optional) gets the counts' running sum from the sorted keys. */
typedef struct {
  uint32_t key, id;
} rank_pair;

static void rank_ids(const int32_t *c, int64_t n, int64_t *order, int64_t *cs, int64_t *tmp) {
  enum { RB = 11, RN = 1 << RB, PASSES = 3 };
  rank_pair *src = (rank_pair *)(void *)tmp, *dst = (rank_pair *)(void *)order;
  uint32_t cnt[PASSES][RN];
  memset(cnt, 0, sizeof cnt);
  for (int64_t i = 0; i < n; i++) {
    uint32_t k = UINT32_MAX - (uint32_t)(c[i] < 0 ? 0 : c[i]);
    src[i].key = k;
    src[i].id = (uint32_t)i;
    for (int p = 0; p < PASSES; p++) cnt[p][(k >> (RB * p)) & (RN - 1)]++;
  }
  for (int p = 0; p < PASSES && n > 0; p++) {
    uint32_t *h = cnt[p];
    if (h[(src[0].key >> (RB * p)) & (RN - 1)] == (uint32_t)n) continue;
    uint32_t sum = 0;
    for (int d = 0; d < RN; d++) {
      uint32_t x = h[d];
      h[d] = sum;
      sum += x;
    }
    for (int64_t i = 0; i < n; i++) dst[h[(src[i].key >> (RB * p)) & (RN - 1)]++] = src[i];
    rank_pair *x = src;
    src = dst;
    dst = x;
  }
  /* src is tmp or order itself: pair r is read before order[r], the same 8 bytes, is written */
  int64_t sum = 0;
  for (int64_t r = 0; r < n; r++) {
    rank_pair q = src[r];
    if (cs) {
      sum += (int64_t)(UINT32_MAX - q.key);
      cs[r] = sum;
    }
    order[r] = q.id;
  }
}

/* rank_ids for 2^32 rows or more, whose ids a pair cannot hold: ids alone, the count read
 * through the id at each pass. */
static void rank_ids_wide(const int32_t *c, int64_t n, int64_t *order, int64_t *tmp) {
  enum { RB = 11, RN = 1 << RB };
  static const int shifts[3] = {0, 11, 22};
  int64_t *src = tmp, *dst = order;
  for (int64_t i = 0; i < n; i++) src[i] = i;
  size_t cnt[RN];
  for (int p = 0; p < 3; p++) {
    memset(cnt, 0, sizeof cnt);
    for (int64_t i = 0; i < n; i++) {
      uint32_t k = UINT32_MAX - (uint32_t)(c[src[i]] < 0 ? 0 : c[src[i]]);
      cnt[(k >> shifts[p]) & (RN - 1)]++;
    }
    size_t sum = 0;
    for (int d = 0; d < RN; d++) {
      size_t x = cnt[d];
      cnt[d] = sum;
      sum += x;
    }
    for (int64_t i = 0; i < n; i++) {
      uint32_t k = UINT32_MAX - (uint32_t)(c[src[i]] < 0 ? 0 : c[src[i]]);
      dst[cnt[(k >> shifts[p]) & (RN - 1)]++] = src[i];
    }
    int64_t *x = src;
    src = dst;
    dst = x;
  }
  /* three passes: the result is in src, which is tmp */
  memcpy(order, src, sizeof(int64_t) * (size_t)n);
}

static ur_status check_host(const ur_tensor *x, ur_dtype dt, int64_t n, const char *what) {
  if (ur_tensor_dtype(x) != dt || ur_tensor_ndim(x) != 1 || ur_tensor_numel(x) != n ||
      ur_tensor_place(x) == UR_PLACE_DEVICE)
    return ur__error(UR_STATUS_INVALID,
                     "%s: expected an %s [%lld] tensor in host memory; got %s [%lld] in %s memory",
                     what, ur_dtype_name(dt), (long long)n, ur_dtype_name(ur_tensor_dtype(x)),
                     (long long)ur_tensor_numel(x), ur_place_name(ur_tensor_place(x)));
  return UR_STATUS_OK;
}

static ur_status check_host_i64(const ur_tensor *x, int64_t n, const char *what) {
  return check_host(x, UR_DTYPE_I64, n, what);
}

/* cs[r] = the counts of ranks 0..r summed, c[o[r]] (a negative one as 0). */
static void cumsum_of(int64_t *cs, int64_t n, const int32_t *c, const int64_t *o) {
  int64_t sum = 0;
  for (int64_t r = 0; r < n; r++) {
    int64_t v = c[o[r]];
    sum += v < 0 ? 0 : v;
    cs[r] = sum;
  }
}

/* Device counters ranked by their backend (tbe.h's rank_counts: a radix sort there, 16 bytes of
 * HBM a row for its duration), which also sums them and scatters the counts by id there, and
 * copies each output straight into the host arrays o, cs and by (the counters are not read
 * twice; the host only receives, 20 bytes a row with both).
 * UR_STATUS_UNSUPPORTED where it cannot (host counters, no room in the HBM budget, 2^31 rows or
 * more): the CPU's sort then ranks, to the same order, sums and counts. */
static ur_status rank_on_device(const ur_tensor *counts, int64_t n, int64_t *o, int64_t *cs,
                                int32_t *by) {
  const ur_backend *b = ur__tensor_backend(counts);
  if (ur_tensor_place(counts) != UR_PLACE_DEVICE || b == ur__cpu() || !b->tbe ||
      !b->tbe->rank_counts || n <= 0 || n >= INT32_MAX)
    return UR_STATUS_UNSUPPORTED;
  int32_t dev = ur_tensor_device(counts), prev = -1;
  ur_status st = ur__device_enter(b, dev, &prev);
  if (st) return st;
  size_t wb = 0;
  ur_tensor *work = NULL;
  st = b->tbe->rank_work_bytes(n, &wb);
  if (!st) {
    int64_t nb = (int64_t)(wb ? wb : 1);
    /* HBM for the sort and the outputs (rank_work_bytes'): where the budget has none, the CPU
     * ranks instead */
    st = ur_tensor_new(&work, UR_DTYPE_U8, 1, &nb, UR_PLACE_DEVICE, dev);
    if (st == UR_STATUS_OOM) {
      /* the budget's refusal is no error of this call, whose CPU ranking sets its own if any */
      ur__error_clear();
      st = UR_STATUS_UNSUPPORTED;
    }
  }
  if (!st) st = b->tbe->rank_counts(NULL, ur_tensor_data(counts), n, ur_tensor_data(work), o, cs, by);
  ur_tensor_free(work);
  return ur__device_leave(b, dev, prev, st);
}

ur_status ur_counts_rank(const ur_tensor *counts, ur_tensor *order, ur_tensor *cumsum,
                         ur_tensor *by_id, int32_t *on_device) {
  UR__ARGS(counts, order);
  if (on_device) *on_device = 0;
  if (ur_tensor_dtype(counts) != UR_DTYPE_I32 || ur_tensor_ndim(counts) != 1)
    return ur__error(UR_STATUS_INVALID, "counts_rank: counts is %s with %d dimensions; expected "
                     "i32 [n]", ur_dtype_name(ur_tensor_dtype(counts)), (int)ur_tensor_ndim(counts));
  int64_t n = ur_tensor_numel(counts);
  ur_status st = check_host_i64(order, n, "counts_rank: order");
  if (!st && cumsum) st = check_host_i64(cumsum, n, "counts_rank: cumsum");
  if (!st && by_id) st = check_host(by_id, UR_DTYPE_I32, n, "counts_rank: by_id");
  if (st) return st;
  /* the counters' writers, and anything still using pinned or managed outputs, on any stream */
  if (ur_tensor_place(counts) != UR_PLACE_HOST || ur_tensor_place(order) != UR_PLACE_HOST ||
      (cumsum && ur_tensor_place(cumsum) != UR_PLACE_HOST) ||
      (by_id && ur_tensor_place(by_id) != UR_PLACE_HOST))
    st = ur_device_sync();
  if (st) return st;
  int64_t *o = ur_tensor_data(order), *cs = cumsum ? ur_tensor_data(cumsum) : NULL;
  int32_t *by = by_id ? ur_tensor_data(by_id) : NULL;
  st = rank_on_device(counts, n, o, cs, by);
  if (!st && on_device) *on_device = 1;
  if (st != UR_STATUS_UNSUPPORTED) return st;
  st = UR_STATUS_OK;
  /* host counters are ranked where they are; others are read once, into by_id where asked */
  int host = ur_tensor_place(counts) == UR_PLACE_HOST;
  int32_t *copy = host ? NULL : by ? by : malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
  const int32_t *c = host ? ur_tensor_data(counts) : copy;
  int64_t *tmp = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
  if (!c || !tmp) {
    if (copy != by) free(copy);
    free(tmp);
    return ur__error(UR_STATUS_OOM, "counts_rank: out of host memory for %lld rows", (long long)n);
  }
  if (copy) st = ur_tensor_read(counts, 0, n, copy);
  if (!st) {
    if (n < ((int64_t)1 << 32)) {
      rank_ids(c, n, o, cs, tmp);
    } else {
      rank_ids_wide(c, n, o, tmp);
      if (cs) cumsum_of(cs, n, c, o);
    }
    if (by)
      for (int64_t i = 0; i < n; i++) by[i] = c[i] < 0 ? 0 : c[i];
  }
  if (copy != by) free(copy);
  free(tmp);
  return st;
}

/* i64 [n] in host memory (check_host_i64), or NULL when allowed: its data. */
static ur_status host_i64_or_null(const ur_tensor *x, int64_t n, const char *what,
                                  const int64_t **out) {
  *out = NULL;
  if (!x) return UR_STATUS_OK;
  ur_status st = check_host_i64(x, n, what);
  if (!st) *out = ur_tensor_data(x);
  return st;
}

/* ur_counts_prefix's sum in up to PREFIX_CHUNKS parts of at least PREFIX_GRAIN ids, one a range
 * of ur__parallel_for's (integers: the same sum in any order). */
enum { PREFIX_CHUNKS = 256, PREFIX_GRAIN = 1 << 16 };
typedef struct prefix_job {
  const int32_t *c;
  const int64_t *p; /* NULL: the identity, the ids below n */
  int64_t k, n, chunks;
  int64_t part[PREFIX_CHUNKS];
} prefix_job;

static void prefix_range(void *ctx, size_t c0, size_t c1) {
  prefix_job *j = ctx;
  for (size_t ci = c0; ci < c1; ci++) {
    int64_t lo = j->n * (int64_t)ci / j->chunks, hi = j->n * ((int64_t)ci + 1) / j->chunks, sum = 0;
    if (!j->p) {
      for (int64_t id = lo; id < hi; id++) sum += j->c[id] < 0 ? 0 : j->c[id];
    } else { /* branch-free: which ids sit in the prefix follows no pattern */
      for (int64_t id = lo; id < hi; id++) {
        int64_t v = j->c[id] < 0 ? 0 : j->c[id];
        sum += j->p[id] < j->k ? v : 0;
      }
    }
    j->part[ci] = sum;
  }
}

ur_status ur_counts_prefix(const ur_tensor *counts, const ur_tensor *perm, int64_t k, int64_t *out) {
  UR__ARGS(counts, out);
  *out = 0;
  int64_t n = ur_tensor_numel(counts);
  if (ur_tensor_dtype(counts) != UR_DTYPE_I32 || ur_tensor_ndim(counts) != 1 ||
      ur_tensor_place(counts) == UR_PLACE_DEVICE)
    return ur__error(UR_STATUS_INVALID, "counts_prefix: counts is %s [%lld] in %s memory; expected "
                     "i32 [n] in host memory", ur_dtype_name(ur_tensor_dtype(counts)), (long long)n,
                     ur_place_name(ur_tensor_place(counts)));
  const int64_t *p;
  ur_status st = host_i64_or_null(perm, n, "counts_prefix: perm", &p);
  if (st) return st;
  prefix_job j;
  memset(&j, 0, sizeof j);
  j.c = ur_tensor_data(counts);
  j.p = p;
  j.k = k;
  j.n = p ? n : k < 0 ? 0 : k < n ? k : n;
  j.chunks = (j.n + PREFIX_GRAIN - 1) / PREFIX_GRAIN;
  if (j.chunks > PREFIX_CHUNKS) j.chunks = PREFIX_CHUNKS;
  ur__parallel_for((size_t)j.chunks, 1, prefix_range, &j); /* a pass over 12 bytes a row: threads */
  int64_t sum = 0;
  for (int64_t i = 0; i < j.chunks; i++) sum += j.part[i];
  *out = sum;
  return UR_STATUS_OK;
}

/* in[id] = 1 where id sits in the prefix [0, k) of the layout p (NULL: the identity). */
typedef struct side_job {
  const int64_t *p;
  int64_t k;
  uint8_t *in;
} side_job;

static void side_range(void *ctx, size_t i0, size_t i1) {
  const side_job *j = ctx;
  for (int64_t id = (int64_t)i0; id < (int64_t)i1; id++) j->in[id] = (j->p ? j->p[id] : id) < j->k;
}

ur_status ur_counts_swap_pairs(const ur_tensor *order, const ur_tensor *cumsum, const ur_tensor *perm,
                               int64_t k, double band, ur_tensor *a, ur_tensor *b, int64_t *n_out,
                               int64_t *gain) {
  UR__ARGS(order, cumsum, a, b, n_out);
  *n_out = 0;
  if (gain) *gain = 0;
  int64_t rows = ur_tensor_numel(order), room = ur_tensor_numel(a);
  const int64_t *p;
  ur_status st = check_host_i64(order, rows, "counts_swap_pairs: order");
  if (!st) st = check_host_i64(cumsum, rows, "counts_swap_pairs: cumsum");
  if (!st) st = host_i64_or_null(perm, rows, "counts_swap_pairs: perm", &p);
  if (!st) st = check_host_i64(a, room, "counts_swap_pairs: a");
  if (!st) st = check_host_i64(b, room, "counts_swap_pairs: b");
  if (st) return st;
  if (!(band >= 0))
    return ur__error(UR_STATUS_INVALID, "counts_swap_pairs: band is %g; expected a number >= 0", band);
  if (k <= 0 || k >= rows) return UR_STATUS_OK;
  const int64_t *o = ur_tensor_data(order), *cs = ur_tensor_data(cumsum);
  /* Which side of k each id is on, a byte an id: the scans below look ids up in rank order, at
   * random, and rows bytes stay in the caches where the layout's 8 a row did not */
  uint8_t *in = malloc((size_t)(rows > 0 ? rows : 1));
  if (!in)
    return ur__error(UR_STATUS_OOM, "counts_swap_pairs: out of host memory (%lld bytes)",
                     (long long)rows);
  side_job sj = {p, k, in};
  ur__parallel_for((size_t)rows, 1 << 16, side_range, &sj);
#define COUNT_AT(r) ((r) == 0 ? cs[0] : cs[(r)] - cs[(r) - 1])
#define BAD_ID(r) ((uint64_t)o[r] >= (uint64_t)rows) /* checked before it indexes the flags */
  /* The coldest inside first: no id outside read (1 + band) times as often or less enters, so the
   * scan of the hottest outside stops there.  A pair never looks at an id paired before it (those
   * inside are colder than every later one taken, those outside hotter), so the layout as ranked
   * (perm) says which side every id it looks at is on. */
  int64_t r = rows - 1, n = 0, bad = -1, g = 0;
  for (; r >= 0 && bad < 0; r--)
    if (BAD_ID(r)) bad = r;
    else if (in[o[r]]) break;
  int64_t *A = ur_tensor_data(a), *B = ur_tensor_data(b);
  for (int64_t e = 0; bad < 0 && r >= 0 && e < rows && n < room && n < k; e++) {
    int64_t c = COUNT_AT(e);
    if (c == 0) break;
    if (BAD_ID(e)) {
      bad = e;
      break;
    }
    int64_t x = o[e];
    if (in[x]) continue;
    for (; r >= 0; r--)
      if (BAD_ID(r)) {
        bad = r;
        break;
      } else if (in[o[r]]) break;
    if (bad >= 0 || r < 0 || (double)c <= (1 + band) * (double)COUNT_AT(r)) break;
    A[n] = x;
    B[n] = o[r];
    g += c - COUNT_AT(r);
    n++;
    r--;
  }
#undef COUNT_AT
#undef BAD_ID
  free(in);
  if (bad >= 0)
    return ur__error(UR_STATUS_INVALID, "counts_swap_pairs: order[%lld] is %lld; expected 0..%lld",
                     (long long)bad, (long long)o[bad], (long long)rows - 1);
  if (gain) *gain = g;
  *n_out = n;
  return UR_STATUS_OK;
}

/* inv[p[i]] = i, checking that p is a permutation of 0..n-1 (errors start with ctx, and call
 * the array name). */
static ur_status invert(const int64_t *p, int64_t n, int64_t *inv, const char *ctx,
                        const char *name) {
  for (int64_t i = 0; i < n; i++) inv[i] = -1;
  for (int64_t i = 0; i < n; i++) {
    int64_t v = p[i];
    if (v < 0 || v >= n)
      return ur__error(UR_STATUS_INVALID, "%s: %s[%lld] = %lld; expected 0..%lld (a permutation)",
                       ctx, name, (long long)i, (long long)v, (long long)n - 1);
    if (inv[v] >= 0)
      return ur__error(UR_STATUS_INVALID,
                       "%s: %s[%lld] = %lld repeats %s[%lld]; a permutation holds each of 0..%lld "
                       "once", ctx, name, (long long)i, (long long)v, name, (long long)inv[v],
                       (long long)n - 1);
    inv[v] = i;
  }
  return UR_STATUS_OK;
}

ur_status ur_perm_from_order(const ur_tensor *order, ur_tensor *perm) {
  UR__ARGS(order, perm);
  if (ur_tensor_dtype(order) != UR_DTYPE_I64 || ur_tensor_ndim(order) != 1)
    return ur__error(UR_STATUS_INVALID, "perm_from_order: order is %s with %d dimensions; "
                     "expected i64 [n]", ur_dtype_name(ur_tensor_dtype(order)),
                     (int)ur_tensor_ndim(order));
  int64_t n = ur_tensor_numel(order);
  ur_status st = check_host_i64(perm, n, "perm_from_order: perm");
  if (st) return st;
  int64_t *o = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
  if (!o) return ur__error(UR_STATUS_OOM, "perm_from_order: out of host memory");
  if (ur_tensor_place(perm) != UR_PLACE_HOST) st = ur_device_sync();
  if (!st) st = ur_tensor_read(order, 0, n, o);
  if (!st) st = invert(o, n, ur_tensor_data(perm), "perm_from_order", "order");
  free(o);
  return st;
}

/* ---- permutations and relayout ---- */

ur_status ur_tbe_permutation(const ur_tbe *t, int32_t table, ur_tensor **out) {
  UR__ARGS(t, out);
  *out = NULL;
  ur_status st = check_index(t, table, "permutation");
  if (st) return st;
  ur_tensor *p = t->perm[table];
  if (!p) return UR_STATUS_OK;
  int64_t n = ur_tensor_numel(p);
  return ur_tensor_view_as(p, out, 0, 1, &n);
}

ur_status ur_tbe_permutation_gen(const ur_tbe *t, int32_t table, uint64_t *out) {
  UR__ARGS(t, out);
  *out = 0;
  ur_status st = check_index(t, table, "permutation_gen");
  if (!st) *out = t->perm_gen[table];
  return st;
}

typedef struct move_job {
  char *data, *buf;
  const int64_t *from, *moved; /* moved[k]: the k-th row that changes */
  size_t row_bytes;
} move_job;

static void gather_moved(void *ctx, size_t k0, size_t k1) {
  const move_job *j = ctx;
  for (size_t k = k0; k < k1; k++)
    memcpy(j->buf + k * j->row_bytes, j->data + (size_t)j->from[j->moved[k]] * j->row_bytes,
           j->row_bytes);
}

static void scatter_moved(void *ctx, size_t k0, size_t k1) {
  const move_job *j = ctx;
  for (size_t k = k0; k < k1; k++)
    memcpy(j->data + (size_t)j->moved[k] * j->row_bytes, j->buf + k * j->row_bytes, j->row_bytes);
}

/* Physical row r of x takes the row at from[r].  By the GPU when x is in device memory (from_dev:
 * from on the device): x is copied aside, then gathered back in chunks.  Else by the CPU: the
 * rows that move are copied aside, then written to their places (managed pages they touch come
 * to the host for it; hint policies place them again afterwards). */
static ur_status move_rows(ur_stream *s, ur_tbe *t, ur_tensor *x, int64_t rows, const int64_t *from,
                           const int64_t *from_dev, int64_t chunk, ur_tbe_relayout_stats *out) {
  size_t bytes = (size_t)ur_tensor_nbytes(x), row_bytes = bytes / (size_t)rows;
  char *data = ur_tensor_data(x);
  ur_status st = UR_STATUS_OK;
  if (ur_tensor_place(x) == UR_PLACE_DEVICE) {
    out->bytes += bytes;
    void *sh = s ? s->handle : NULL;
    ur_tensor *scratch = NULL;
    int64_t nb = (int64_t)bytes;
    if ((st = UR__NEED(t->be, tbe, gather_rows)) ||
        (st = ur__tbe_home_tensor(t, &scratch, UR_DTYPE_U8, nb)))
      return st;
    st = t->be->copy(sh, ur_tensor_data(scratch), data, bytes);
    for (int64_t r0 = 0; r0 < rows && !st; r0 += chunk) {
      int64_t n = rows - r0 < chunk ? rows - r0 : chunk;
      st = t->be->tbe->gather_rows(sh, ur_tensor_data(scratch), rows, row_bytes, from_dev + r0, n,
                                   data + (size_t)r0 * row_bytes);
      out->chunks++;
    }
    if (!st) st = t->be->stream_sync(sh);
    ur_tensor_free(scratch);
    out->on_gpu = 1;
    return st;
  }
  /* The CPU copies only the rows that move (and touches only their pages: managed pages
   * elsewhere stay where they are), chunk_rows of them at a time. */
  if ((st = ur_device_sync())) return st;
  int64_t n = 0;
  for (int64_t r = 0; r < rows; r++) n += from[r] != r;
  int64_t *moved = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
  char *buf = malloc((size_t)(n ? n : 1) * row_bytes);
  if (!moved || !buf) {
    free(moved);
    free(buf);
    return ur__error(UR_STATUS_OOM, "tbe: relayout: out of host memory for %lld rows of %zu bytes",
                     (long long)n, row_bytes);
  }
  n = 0;
  for (int64_t r = 0; r < rows; r++)
    if (from[r] != r) moved[n++] = r;
  out->bytes += (uint64_t)n * row_bytes;
  move_job j = {data, buf, from, moved, row_bytes};
  ur__parallel_for((size_t)n, 1024, gather_moved, &j); /* every source read before any write */
  for (int64_t k0 = 0; k0 < n; k0 += chunk) {
    int64_t m = n - k0 < chunk ? n - k0 : chunk;
    move_job jc = {data, buf + (size_t)k0 * row_bytes, from, moved + k0, row_bytes};
    ur__parallel_for((size_t)m, 1024, scatter_moved, &jc);
    out->chunks++;
  }
  free(moved);
  free(buf);
  return UR_STATUS_OK;
}

/* The tensors whose rows move with the table's: its weights and optimizer state. */
static ur_status table_tensors(ur_tbe *t, int32_t table, ur_tensor **xs, int *nx) {
  *nx = 0;
  ur_status st = ur_tbe_table(t, table, &xs[(*nx)++]);
  for (int32_t k = 0; k < t->nstate && !st; k++) st = ur_tbe_state(t, table, k, &xs[(*nx)++]);
  if (st && !xs[*nx - 1]) (*nx)--;
  return st;
}

/* A cached table's kernels read the cache's slots, where no row layout applies (the
 * identity, NULL, is allowed: a checkpoint's layout registry installs it on every table). */
static ur_status check_not_cached(const ur_tbe *t, int32_t table, const char *what) {
  if (!t->owner[table]) return UR_STATUS_OK;
  return ur__error(UR_STATUS_INVALID,
                   "tbe: %s of table '%s': the table is cached (its kernels read the cache's "
                   "slots); row layouts are for device, managed and host tables",
                   what, t->tc[table].name);
}

ur_status ur_tbe_relayout(ur_stream *s, ur_tbe *t, int32_t table, const ur_tensor *perm,
                          ur_tbe_relayout_stats *out, int64_t chunk_rows) {
  UR__ARGS(t, out);
  memset(out, 0, sizeof *out);
  ur_status st = check_index(t, table, "relayout");
  if (!st) st = ur__tbe_check_lost(t, table, "tbe relayout");
  if (!st && perm) st = check_not_cached(t, table, "relayout");
  if (st) return st;
  ur__tbe_table *d = &t->tables[table];
  const char *name = t->tc[table].name;
  int64_t rows = d->rows;
  if (perm && (ur_tensor_dtype(perm) != UR_DTYPE_I64 || ur_tensor_ndim(perm) != 1 ||
               ur_tensor_numel(perm) != rows))
    return ur__error(UR_STATUS_INVALID,
                     "tbe: relayout of table '%s': perm is %s [%lld]; expected i64 [%lld] (row id "
                     "-> physical row)", name, ur_dtype_name(ur_tensor_dtype(perm)),
                     (long long)ur_tensor_numel(perm), (long long)rows);
  if (chunk_rows < 0)
    return ur__error(UR_STATUS_INVALID, "tbe: relayout: chunk_rows %lld; expected > 0 (0: default)",
                     (long long)chunk_rows);
  double t0 = ur_clock_seconds();
  size_t nb = sizeof(int64_t) * (size_t)rows;
  int64_t *q = malloc(nb), *qinv = malloc(nb), *from = malloc(nb);
  ur_tensor *from_dev = NULL, *xs[3] = {NULL, NULL, NULL};
  ur_tensor **slot = &t->perm[table];
  int nx = 0, identity = 1;
  if (!q || !qinv || !from) {
    st = ur__error(UR_STATUS_OOM, "tbe: relayout of table '%s': out of host memory", name);
    goto done;
  }
  if (perm) {
    if (ur_tensor_place(perm) != UR_PLACE_HOST && (st = ur_device_sync())) goto done;
    if ((st = ur_tensor_read(perm, 0, rows, q))) goto done;
  } else {
    for (int64_t i = 0; i < rows; i++) q[i] = i;
  }
  char what[300];
  snprintf(what, sizeof what, "tbe: relayout of table '%s'", name);
  if ((st = invert(q, rows, qinv, what, "perm"))) goto done;
  /* from[r]: where the row that belongs at r is now (the old permutation, or the identity) */
  if (*slot) {
    if ((st = ur_tensor_read(*slot, 0, rows, from))) goto done;
  } else {
    for (int64_t i = 0; i < rows; i++) from[i] = i;
  }
  for (int64_t r = 0; r < rows; r++) {
    qinv[r] = from[qinv[r]];
    if (qinv[r] != r) out->rows_moved++;
    if (q[r] != r) identity = 0;
  }
  int64_t chunk = chunk_rows ? chunk_rows : DEFAULT_CHUNK_ROWS;
  if (out->rows_moved) {
    if ((st = table_tensors(t, table, xs, &nx))) goto done;
    int dev = 0;
    for (int k = 0; k < nx; k++) dev |= ur_tensor_place(xs[k]) == UR_PLACE_DEVICE;
    if (dev) {
      if ((st = ur__tbe_home_tensor(t, &from_dev, UR_DTYPE_I64, rows)) ||
          (st = ur_tensor_write(from_dev, 0, rows, qinv)))
        goto done;
    }
    for (int k = 0; k < nx && !st; k++)
      st = move_rows(s, t, xs[k], rows, qinv, from_dev ? ur_tensor_data(from_dev) : NULL, chunk, out);
    if (st) goto done;
  }
  /* the map the kernels read */
  if (identity) {
    d->perm = NULL;
    st = ur__tbe_sync_desc(t);
    ur_tensor_free(*slot);
    *slot = NULL;
  } else {
    if (!*slot && (st = ur__tbe_home_tensor(t, slot, UR_DTYPE_I64, rows))) goto done;
    if ((st = t->be->device_sync())) goto done;
    /* the kernels must not run between the rows moving and the map changing: callers order
     * relayout between steps, and the writes below wait for the device */
    if ((st = ur_tensor_write(*slot, 0, rows, q))) goto done;
    d->perm = ur_tensor_data(*slot);
    st = ur__tbe_sync_desc(t);
  }
done:;
  /* even a failed relayout may have moved rows or the map: mirrors read it again */
  ur_status dropped = ur__tbe_perm_changed(t, table);
  if (!st) st = dropped;
  out->seconds = ur_clock_seconds() - t0;
  for (int k = 0; k < nx; k++) ur_tensor_free(xs[k]);
  ur_tensor_free(from_dev);
  free(q);
  free(qinv);
  free(from);
  return st;
}

ur_status ur_tbe_set_permutation(ur_tbe *t, int32_t table, const ur_tensor *perm) {
  UR__ARGS(t);
  ur_status st = check_index(t, table, "set_permutation");
  if (!st) st = ur__tbe_check_lost(t, table, "tbe set_permutation");
  if (!st && perm) st = check_not_cached(t, table, "set_permutation");
  if (!st) st = ur__tbe_perm_changed(t, table);
  if (st) return st;
  ur__tbe_table *d = &t->tables[table];
  const char *name = t->tc[table].name;
  int64_t rows = d->rows;
  ur_tensor **slot = &t->perm[table];
  if (!perm) {
    d->perm = NULL;
    st = ur__tbe_sync_desc(t);
    ur_tensor_free(*slot);
    *slot = NULL;
    return st;
  }
  if (ur_tensor_dtype(perm) != UR_DTYPE_I64 || ur_tensor_ndim(perm) != 1 || ur_tensor_numel(perm) != rows)
    return ur__error(UR_STATUS_INVALID,
                     "tbe: set_permutation of table '%s': perm is %s [%lld]; expected i64 [%lld]",
                     name, ur_dtype_name(ur_tensor_dtype(perm)), (long long)ur_tensor_numel(perm),
                     (long long)rows);
  size_t nb = sizeof(int64_t) * (size_t)rows;
  int64_t *q = malloc(nb), *inv = malloc(nb);
  if (!q || !inv) st = ur__error(UR_STATUS_OOM, "tbe: set_permutation: out of host memory");
  if (!st && ur_tensor_place(perm) != UR_PLACE_HOST) st = ur_device_sync();
  if (!st) st = ur_tensor_read(perm, 0, rows, q);
  char what[300];
  snprintf(what, sizeof what, "tbe: set_permutation of table '%s'", name);
  if (!st) st = invert(q, rows, inv, what, "perm");
  if (!st && !*slot) st = ur__tbe_home_tensor(t, slot, UR_DTYPE_I64, rows);
  if (!st) st = t->be->device_sync();
  if (!st) st = ur_tensor_write(*slot, 0, rows, q);
  if (!st) {
    d->perm = ur_tensor_data(*slot);
    st = ur__tbe_sync_desc(t);
  }
  free(q);
  free(inv);
  return st;
}

/* ---- row swaps ---- */

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* The ids of a swap, checked: within the table, none twice. */
static ur_status check_swap_ids(const ur_tbe *t, int32_t table, const int64_t *ids, int64_t n2) {
  const char *name = t->tc[table].name;
  int64_t rows = t->tables[table].rows;
  for (int64_t i = 0; i < n2; i++)
    if (ids[i] < 0 || ids[i] >= rows)
      return ur__error(UR_STATUS_INVALID, "tbe: swap_rows of table '%s': %s[%lld] = %lld; expected "
                       "0..%lld", name, i < n2 / 2 ? "a" : "b", (long long)(i % (n2 / 2)),
                       (long long)ids[i], (long long)rows - 1);
  int64_t *sorted = malloc(sizeof(int64_t) * (size_t)(n2 ? n2 : 1));
  if (!sorted) return ur__error(UR_STATUS_OOM, "tbe: swap_rows: out of host memory");
  memcpy(sorted, ids, sizeof(int64_t) * (size_t)n2);
  qsort(sorted, (size_t)n2, sizeof(int64_t), cmp_i64);
  ur_status st = UR_STATUS_OK;
  for (int64_t i = 1; i < n2 && !st; i++)
    if (sorted[i] == sorted[i - 1])
      st = ur__error(UR_STATUS_INVALID, "tbe: swap_rows of table '%s': id %lld is in two pairs; "
                     "each id may move once", name, (long long)sorted[i]);
  free(sorted);
  return st;
}

ur_status ur_tbe_swap_rows(ur_stream *s, ur_tbe *t, int32_t table, const int64_t *a,
                           const int64_t *b, int64_t n, ur_tbe_relayout_stats *out) {
  UR__ARGS(t, a, b, out);
  memset(out, 0, sizeof *out);
  ur_status st = check_index(t, table, "swap_rows");
  if (!st) st = ur__tbe_check_lost(t, table, "tbe swap_rows");
  if (!st) st = check_not_cached(t, table, "swap_rows");
  if (st) return st;
  if (n < 0 || (n > 0 && (!a || !b)))
    return ur__error(UR_STATUS_INVALID, "tbe: swap_rows of table '%s': %lld pairs; expected n >= 0 "
                     "and both lists", t->tc[table].name, (long long)n);
  if (!n) return UR_STATUS_OK;
  double t0 = ur_clock_seconds();
  int64_t rows = t->tables[table].rows;
  int64_t *ids = malloc(sizeof(int64_t) * 2 * (size_t)n);
  if (!ids) return ur__error(UR_STATUS_OOM, "tbe: swap_rows: out of host memory");
  memcpy(ids, a, sizeof(int64_t) * (size_t)n);
  memcpy(ids + n, b, sizeof(int64_t) * (size_t)n);
  ur_tensor *xs[3] = {NULL, NULL, NULL};
  int nx = 0, changed = 0; /* refused ids change nothing: the layout's number stays */
  if ((st = check_swap_ids(t, table, ids, 2 * n)) || (st = UR__NEED(t->be, tbe, swap_rows)))
    goto done;
  changed = 1;
  /* a table without a layout gets the identity first: the swaps change it in place */
  ur_tensor **slot = &t->perm[table];
  if (!*slot) {
    int64_t *iota = malloc(sizeof(int64_t) * (size_t)rows);
    if (!iota) {
      st = ur__error(UR_STATUS_OOM, "tbe: swap_rows: out of host memory for %lld rows", (long long)rows);
      goto done;
    }
    for (int64_t r = 0; r < rows; r++) iota[r] = r;
    if (!(st = ur__tbe_home_tensor(t, slot, UR_DTYPE_I64, rows))) st = ur_tensor_write(*slot, 0, rows, iota);
    free(iota);
    if (st) goto done;
    t->tables[table].perm = ur_tensor_data(*slot);
    if ((st = ur__tbe_sync_desc(t))) goto done;
  }
  /* the ids at home, in a buffer kept for the next swaps (freeing device memory would wait) */
  if (!t->swapbuf || ur_tensor_numel(t->swapbuf) < 2 * n) {
    if (t->swapbuf && (st = t->be->device_sync())) goto done;
    ur_tensor_free(t->swapbuf);
    t->swapbuf = NULL;
    if ((st = ur__tbe_home_tensor(t, &t->swapbuf, UR_DTYPE_I64, 2 * n))) goto done;
  }
  if ((st = t->be->copy(s ? s->handle : NULL, ur_tensor_data(t->swapbuf), ids,
                        sizeof(int64_t) * 2 * (size_t)n)) ||
      (st = table_tensors(t, table, xs, &nx)))
    goto done;
  ur__tbe_swap sw;
  memset(&sw, 0, sizeof sw);
  sw.perm = ur_tensor_data(*slot);
  sw.ids = ur_tensor_data(t->swapbuf);
  sw.n = n;
  sw.ntensors = nx;
  for (int k = 0; k < nx; k++) {
    sw.base[k] = ur_tensor_data(xs[k]);
    sw.row_bytes[k] = (uint64_t)ur_tensor_nbytes(xs[k]) / (uint64_t)rows;
    out->bytes += 2 * (uint64_t)n * sw.row_bytes[k];
  }
  st = t->be->tbe->swap_rows(s ? s->handle : NULL, &sw);
  out->rows_moved = 2 * n;
  out->chunks = 1;
  out->on_gpu = t->home == UR_PLACE_DEVICE;
done:
  if (changed) {
    ur_status dropped = ur__tbe_perm_changed(t, table);
    if (!st) st = dropped;
  }
  out->seconds = ur_clock_seconds() - t0;
  for (int k = 0; k < nx; k++) ur_tensor_free(xs[k]);
  free(ids);
  return st;
}
