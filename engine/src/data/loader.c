/* loader.c: the batch loader.  One thread reads windows of rows from a source (synthetic,
 * Criteo TSV, day files) into a staging area, permutes each window with a seeded shuffle and
 * cuts batches into a ring of pinned slots; the consumer takes them in order and releases
 * them.  Stopping (close) and errors of the thread both end it cleanly: the thread is joined
 * and every buffer freed. */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "data/data.h"
#include "core/philox.h"

size_t ur_sizeof_loader_opts(void) { return sizeof(ur_loader_opts); }
size_t ur_sizeof_loader_stats(void) { return sizeof(ur_loader_stats); }

enum { SLOT_FREE = 0, SLOT_FILLING, SLOT_READY, SLOT_TAKEN };

struct ur_batch {
  int state;
  int64_t size, epoch, first;
  /* whole-capacity buffers, and this batch's views of them */
  ur_tensor *dense_buf, *labels_buf, *groups_buf, *values_buf, *lengths_buf, *weights_buf;
  ur_tensor *dense, *labels, *groups;
  ur_kjt *sparse;
  uint64_t bytes;
};

typedef struct day {
  ur__npy_map_t dense, sparse, labels, weights, groups;
  int have_weights, have_groups;
  int64_t rows, first;       /* rows, and the global row of the first */
} day;

struct ur_loader {
  ur_loader_opts o;
  char **paths, **keys;
  ur_synth_spec synth;
  int32_t T, D;
  int64_t H, B;
  int32_t hot_max[UR_SYNTH_MAX_TABLES];
  int64_t col0[UR_SYNTH_MAX_TABLES + 1];
  int weighted, grouped;
  /* the rows of this rank per epoch: [lo, hi) of the source (hi -1: unknown, TSV) */
  int64_t total, lo, hi;
  /* staging: one window of rows in storage order */
  int64_t W;
  float *s_dense, *s_labels, *s_weights;
  int64_t *s_ids, *s_groups, *perm;
  int32_t *s_len;
  int64_t win_index, win_rows, win_epoch; /* which window is staged */
  /* the batch being gathered, row by row from the window (it may span two windows) */
  float *g_dense, *g_labels, *g_weights;
  int64_t *g_ids, *g_groups;
  int32_t *g_len;
  /* sources */
  ur_criteo_reader *tsv;
  int64_t tsv_next;          /* the row the TSV reader gives next */
  int32_t *t_labels;
  float *t_dense;
  uint32_t *t_ids;
  day *days;
  int ndays;
  /* slots */
  ur_batch *slots;
  int nslots;
  int64_t head, tail;        /* batches made, batches handed out */
  pthread_t thread;
  int started;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int stop, finished;
  ur_status err;
  char errmsg[1024];
  ur_status pending;         /* a source error met after some rows: raised once they are out */
  char pending_msg[1024];
  ur_loader_stats stats;
};

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- sources ---- */

static int day_cmp(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

static ur_status open_day(ur_loader *l, const char *dir, int dn, day *d) {
  char path[4200];
  ur_status st;
  snprintf(path, sizeof path, "%s/day_%d_dense.npy", dir, dn);
  if ((st = ur__npy_map(path, &d->dense))) return st;
  snprintf(path, sizeof path, "%s/day_%d_sparse.npy", dir, dn);
  if ((st = ur__npy_map(path, &d->sparse))) return st;
  snprintf(path, sizeof path, "%s/day_%d_labels.npy", dir, dn);
  if ((st = ur__npy_map(path, &d->labels))) return st;
  snprintf(path, sizeof path, "%s/day_%d_weights.npy", dir, dn);
  if (!access(path, R_OK)) {
    if ((st = ur__npy_map(path, &d->weights))) return st;
    d->have_weights = 1;
  }
  snprintf(path, sizeof path, "%s/day_%d_groups.npy", dir, dn);
  if (!access(path, R_OK)) {
    if ((st = ur__npy_map(path, &d->groups))) return st;
    d->have_groups = 1;
  }
  const ur_npy_info *di = &d->dense.info, *si = &d->sparse.info, *li = &d->labels.info;
  d->rows = di->ndim >= 1 ? di->shape[0] : 0;
  snprintf(path, sizeof path, "%s/day_%d", dir, dn);
  if (di->ndim != 2 || strcmp(di->descr, "<f4"))
    return ur__error(UR_STATUS_FORMAT, "criteo-bin: %s_dense.npy must be <f4 [N, dense], got %s with %d dims",
                     path, di->descr, (int)di->ndim);
  if (si->ndim != 2 || si->shape[0] != d->rows || !strcmp(si->descr, "<f4"))
    return ur__error(UR_STATUS_FORMAT,
                     "criteo-bin: %s_sparse.npy must be integer ids [%lld, columns], got %s with %d dims",
                     path, (long long)d->rows, si->descr, (int)si->ndim);
  if (!(li->ndim == 1 || (li->ndim == 2 && li->shape[1] == 1)) || li->shape[0] != d->rows)
    return ur__error(UR_STATUS_FORMAT, "criteo-bin: %s_labels.npy must be [%lld] or [%lld, 1]",
                     path, (long long)d->rows, (long long)d->rows);
  if (d->have_weights && (d->weights.info.ndim != 2 || d->weights.info.shape[0] != d->rows ||
                          d->weights.info.shape[1] != si->shape[1] || strcmp(d->weights.info.descr, "<f4")))
    return ur__error(UR_STATUS_FORMAT, "criteo-bin: %s_weights.npy must be <f4 like the sparse ids", path);
  if (d->have_groups && (d->groups.info.ndim != 1 || d->groups.info.shape[0] != d->rows))
    return ur__error(UR_STATUS_FORMAT, "criteo-bin: %s_groups.npy must be [%lld]", path,
                     (long long)d->rows);
  return UR_STATUS_OK;
}

/* Table layout of day files: layout.txt's "hot" line when present, else one column a table. */
static ur_status bin_layout(ur_loader *l, const char *dir, int64_t columns, int64_t dense) {
  char path[4200], line[8192];
  snprintf(path, sizeof path, "%s/layout.txt", dir);
  FILE *f = fopen(path, "r");
  int nt = 0;
  if (f) {
    while (fgets(line, sizeof line, f)) {
      if (strncmp(line, "hot ", 4)) continue;
      char *p = line + 4;
      while (*p && *p != '\n' && nt < UR_SYNTH_MAX_TABLES) {
        long lo = strtol(p, &p, 10), hi = lo;
        if (*p == '-') hi = strtol(p + 1, &p, 10);
        l->hot_max[nt++] = (int32_t)hi;
        if (*p == ',') p++;
        else break;
      }
    }
    fclose(f);
  }
  if (!nt) {
    if (columns > UR_SYNTH_MAX_TABLES)
      return ur__error(UR_STATUS_FORMAT, "criteo-bin: %s: %lld sparse columns; at most %d tables",
                       dir, (long long)columns, UR_SYNTH_MAX_TABLES);
    nt = (int)columns;
    for (int t = 0; t < nt; t++) l->hot_max[t] = 1;
  }
  l->T = nt;
  l->D = (int32_t)dense;
  l->H = 0;
  for (int t = 0; t < nt; t++) {
    l->col0[t] = l->H;
    l->H += l->hot_max[t];
  }
  l->col0[nt] = l->H;
  if (l->H != columns)
    return ur__error(UR_STATUS_FORMAT, "criteo-bin: %s: layout.txt's tables take %lld columns but the sparse ids have %lld",
                     dir, (long long)l->H, (long long)columns);
  return UR_STATUS_OK;
}

static ur_status open_bin(ur_loader *l) {
  const char *dir = l->paths[0];
  DIR *dh = opendir(dir);
  if (!dh) return ur__error(UR_STATUS_IO, "criteo-bin: %s: cannot open the folder", dir);
  int nums[4096], n = 0;
  struct dirent *e;
  while ((e = readdir(dh)) && n < 4096) {
    int dn, len = 0;
    if (sscanf(e->d_name, "day_%d_dense.npy%n", &dn, &len) == 1 && len == (int)strlen(e->d_name))
      nums[n++] = dn;
  }
  closedir(dh);
  if (!n) return ur__error(UR_STATUS_IO, "criteo-bin: %s: no day_N_dense.npy files", dir);
  qsort(nums, (size_t)n, sizeof(int), day_cmp);
  l->days = calloc((size_t)n, sizeof(day));
  if (!l->days) return ur__error(UR_STATUS_OOM, "criteo-bin: out of host memory");
  l->ndays = n;
  int64_t first = 0;
  ur_status st;
  for (int i = 0; i < n; i++) {
    if ((st = open_day(l, dir, nums[i], &l->days[i]))) return st;
    l->days[i].first = first;
    first += l->days[i].rows;
    const day *d0 = &l->days[0], *d = &l->days[i];
    if (d->dense.info.shape[1] != d0->dense.info.shape[1] || d->sparse.info.shape[1] != d0->sparse.info.shape[1])
      return ur__error(UR_STATUS_FORMAT, "criteo-bin: %s: day %d's shapes differ from day %d's", dir,
                       nums[i], nums[0]);
    if (d->have_weights != d0->have_weights || d->have_groups != d0->have_groups)
      return ur__error(UR_STATUS_FORMAT, "criteo-bin: %s: day %d has weights or groups where day %d has not",
                       dir, nums[i], nums[0]);
  }
  l->total = first;
  l->weighted = l->days[0].have_weights;
  l->grouped = l->days[0].have_groups;
  return bin_layout(l, dir, l->days[0].sparse.info.shape[1], l->days[0].dense.info.shape[1]);
}

/* Rows r0.. of day d into staging rows at0.. (one range of a parallel loop). */
typedef struct bin_job {
  ur_loader *l;
  const day *d;
  int64_t r0, at0;
} bin_job;

static void bin_rows(void *ctx, size_t i0, size_t i1) {
  const bin_job *j = ctx;
  ur_loader *l = j->l;
  const day *d = j->d;
  const ur_npy_info *li = &d->labels.info, *si = &d->sparse.info;
  for (size_t ii = i0; ii < i1; ii++) {
    int64_t r = j->r0 + (int64_t)ii, at = j->at0 + (int64_t)ii;
    memcpy(l->s_dense + at * l->D, (const float *)d->dense.data + r * l->D, sizeof(float) * (size_t)l->D);
    if (li->descr[1] == 'f') {
      float v;
      memcpy(&v, (const char *)d->labels.data + (size_t)r * 4, 4);
      l->s_labels[at] = v;
    } else if (li->item_bytes == 8) {
      int64_t v;
      memcpy(&v, (const char *)d->labels.data + (size_t)r * 8, 8);
      l->s_labels[at] = (float)v;
    } else {
      int32_t v;
      memcpy(&v, (const char *)d->labels.data + (size_t)r * 4, 4);
      l->s_labels[at] = (float)v;
    }
    int64_t *ids = l->s_ids + at * l->H;
    const char *src = (const char *)d->sparse.data + (size_t)r * (size_t)l->H * si->item_bytes;
    for (int64_t c = 0; c < l->H; c++) {
      int64_t v;
      if (si->item_bytes == 8) memcpy(&v, src + c * 8, 8);
      else if (si->descr[1] == 'u') {
        uint32_t u;
        memcpy(&u, src + c * 4, 4);
        v = u;
      } else {
        int32_t x;
        memcpy(&x, src + c * 4, 4);
        v = x;
      }
      ids[c] = v;
    }
    for (int t = 0; t < l->T; t++) {
      int32_t len = 0;
      int64_t rows = t < 26 ? l->o.criteo.rows[t] : 0;
      for (int64_t c = l->col0[t]; c < l->col0[t + 1]; c++) {
        if (ids[c] < 0) break; /* -1 pads a multi-hot bag */
        if (rows > 0) ids[c] %= rows;
        len++;
      }
      l->s_len[at * l->T + t] = len;
    }
    if (l->weighted)
      memcpy(l->s_weights + at * l->H, (const float *)d->weights.data + r * l->H,
             sizeof(float) * (size_t)l->H);
    if (l->grouped) {
      const ur_npy_info *gi = &d->groups.info;
      int64_t g = 0;
      if (gi->item_bytes == 8) memcpy(&g, (const char *)d->groups.data + r * 8, 8);
      else {
        int32_t x;
        memcpy(&x, (const char *)d->groups.data + r * 4, 4);
        g = x;
      }
      l->s_groups[at] = g;
    }
  }
}

/* Rows [row0, row0 + n) of the day files into staging rows 0..n-1, on every core. */
static ur_status read_bin(ur_loader *l, int64_t row0, int64_t n) {
  int64_t done = 0;
  int di = 0;
  while (di + 1 < l->ndays && l->days[di + 1].first <= row0) di++;
  while (done < n) {
    const day *d = &l->days[di];
    int64_t r = row0 + done - d->first, k = d->rows - r;
    if (k > n - done) k = n - done;
    if (k <= 0) {
      di++;
      if (di >= l->ndays)
        return ur__error(UR_STATUS_INVALID, "criteo-bin: row %lld past the end", (long long)(row0 + done));
      continue;
    }
    bin_job j = {l, d, r, done};
    ur__parallel_for((size_t)k, 2048, bin_rows, &j);
    done += k;
  }
  return UR_STATUS_OK;
}

static ur_status read_synth(ur_loader *l, int64_t row0, int64_t n) {
  ur_tensor *t[6] = {0};
  int64_t s1[1] = {n}, sd[2] = {n, l->D}, sh[2] = {n, l->H}, st_[2] = {n, l->T};
  /* Host tensors wrapping the staging arrays would need an adopt API; generate into
   * temporaries and copy (a few percent of the generator's time). */
  ur_status st = ur_tensor_new(&t[0], UR_DTYPE_F32, 2, sd, UR_PLACE_HOST, UR_LOC_CPU);
  if (!st) st = ur_tensor_new(&t[1], UR_DTYPE_F32, 1, s1, UR_PLACE_HOST, UR_LOC_CPU);
  if (!st) st = ur_tensor_new(&t[2], UR_DTYPE_I64, 2, sh, UR_PLACE_HOST, UR_LOC_CPU);
  if (!st && l->weighted) st = ur_tensor_new(&t[3], UR_DTYPE_F32, 2, sh, UR_PLACE_HOST, UR_LOC_CPU);
  if (!st) st = ur_tensor_new(&t[4], UR_DTYPE_I32, 2, st_, UR_PLACE_HOST, UR_LOC_CPU);
  if (!st && l->grouped) st = ur_tensor_new(&t[5], UR_DTYPE_I64, 1, s1, UR_PLACE_HOST, UR_LOC_CPU);
  if (!st) st = ur_synth_generate(NULL, &l->synth, row0, n, t[0], t[1], t[2], t[3], t[4], t[5], NULL);
  if (!st) {
    memcpy(l->s_dense, ur_tensor_data(t[0]), sizeof(float) * (size_t)(n * l->D));
    memcpy(l->s_labels, ur_tensor_data(t[1]), sizeof(float) * (size_t)n);
    memcpy(l->s_ids, ur_tensor_data(t[2]), sizeof(int64_t) * (size_t)(n * l->H));
    if (t[3]) memcpy(l->s_weights, ur_tensor_data(t[3]), sizeof(float) * (size_t)(n * l->H));
    memcpy(l->s_len, ur_tensor_data(t[4]), sizeof(int32_t) * (size_t)(n * l->T));
    if (t[5]) memcpy(l->s_groups, ur_tensor_data(t[5]), sizeof(int64_t) * (size_t)n);
    /* rows reduce synthetic ids too (an id space larger than the table), as day files' */
    for (int tb = 0; tb < l->T && tb < 26; tb++) {
      int64_t rows = l->o.criteo.rows[tb];
      if (rows <= 0) continue;
      for (int64_t r = 0; r < n; r++)
        for (int64_t c = l->col0[tb]; c < l->col0[tb + 1]; c++) {
          int64_t *id = &l->s_ids[r * l->H + c];
          if (*id >= 0) *id %= rows;
        }
    }
  }
  for (int i = 0; i < 6; i++) ur_tensor_free(t[i]);
  return st;
}

static ur_status tsv_restart(ur_loader *l) {
  ur_criteo_close(l->tsv);
  l->tsv = NULL;
  l->tsv_next = 0;
  return ur_criteo_open(&l->tsv, (const char *const *)l->paths, l->o.npaths, &l->o.criteo);
}

/* Up to n rows from row0 (TSV reads forward, restarting when asked to go back); *got is
 * fewer than n at the end of the files. */
static ur_status read_tsv(ur_loader *l, int64_t row0, int64_t n, int64_t *got) {
  ur_status st;
  *got = 0;
  if (!l->tsv || row0 < l->tsv_next)
    if ((st = tsv_restart(l))) return st;
  int64_t m;
  while (l->tsv_next < row0) { /* skip */
    int64_t want = row0 - l->tsv_next < l->W ? row0 - l->tsv_next : l->W;
    if ((st = ur_criteo_read(l->tsv, want, l->t_labels, l->t_dense, l->t_ids, &m))) return st;
    if (!m) return UR_STATUS_OK;
    l->tsv_next += m;
  }
  while (*got < n) {
    if ((st = ur_criteo_read(l->tsv, n - *got, l->t_labels, l->t_dense, l->t_ids, &m))) {
      if (!*got) return st;
      l->pending = st;
      snprintf(l->pending_msg, sizeof l->pending_msg, "%s", ur_last_error());
      return UR_STATUS_OK;
    }
    if (!m) break;
    for (int64_t i = 0; i < m; i++) {
      int64_t r = *got + i;
      l->s_labels[r] = (float)l->t_labels[i];
      memcpy(l->s_dense + r * 13, l->t_dense + i * 13, 13 * sizeof(float));
      for (int c = 0; c < 26; c++) {
        l->s_ids[r * 26 + c] = l->t_ids[i * 26 + c];
        l->s_len[r * 26 + c] = 1;
      }
    }
    *got += m;
    l->tsv_next += m;
  }
  return UR_STATUS_OK;
}

/* ---- windows ---- */

/* Loads window w of epoch e (rows lo + w*W ...) and its permutation; win_rows 0 at the end. */
static ur_status load_window(ur_loader *l, int64_t e, int64_t w) {
  int64_t row0 = l->lo + w * l->W, n = l->W;
  ur_status st = UR_STATUS_OK;
  if (l->hi >= 0) {
    n = l->hi - row0;
    if (n > l->W) n = l->W;
    if (n < 0) n = 0;
  }
  int64_t got = n;
  if (n > 0) {
    if (l->o.source == UR_SOURCE_CRITEO_TSV) st = read_tsv(l, row0, n, &got);
    else if (l->o.source == UR_SOURCE_CRITEO_BIN) st = read_bin(l, row0, n);
    else st = read_synth(l, row0, n);
  }
  if (st) return st;
  l->win_index = w;
  l->win_epoch = e;
  l->win_rows = got;
  for (int64_t i = 0; i < got; i++) l->perm[i] = i;
  if (l->o.shuffle_window > 0) {
    /* Fisher-Yates drawing from Philox at (epoch, window, i): the same order on a resume. */
    uint64_t key = l->o.seed ^ 0x5DEECE66Dull;
    for (int64_t i = got - 1; i > 0; i--) {
      ur_philox4 r = ur_philox(((uint64_t)e << 44) ^ ((uint64_t)w << 24) ^ (uint64_t)i, key);
      uint64_t x = ((uint64_t)r.v[0] << 32 | r.v[1]) % (uint64_t)(i + 1);
      int64_t tmp = l->perm[i];
      l->perm[i] = l->perm[x];
      l->perm[x] = tmp;
    }
  }
  return UR_STATUS_OK;
}

/* ---- batches ---- */

static void batch_views_free(ur_batch *b) {
  ur_tensor_free(b->dense);
  ur_tensor_free(b->labels);
  ur_tensor_free(b->groups);
  ur_kjt_free(b->sparse);
  b->dense = b->labels = b->groups = NULL;
  b->sparse = NULL;
}

static void slot_free(ur_batch *b) {
  batch_views_free(b);
  ur_tensor_free(b->dense_buf);
  ur_tensor_free(b->labels_buf);
  ur_tensor_free(b->groups_buf);
  ur_tensor_free(b->values_buf);
  ur_tensor_free(b->lengths_buf);
  ur_tensor_free(b->weights_buf);
}

static ur_status slot_alloc(ur_loader *l, ur_batch *b) {
  ur_place p = l->o.placement == UR_PLACE_HOST ? UR_PLACE_HOST : UR_PLACE_PINNED;
  int64_t sd[2] = {l->B, l->D}, s1[1] = {l->B}, sv[1] = {l->B * l->H}, sl[1] = {l->B * l->T};
  ur_status st = ur_tensor_new(&b->dense_buf, UR_DTYPE_F32, 2, sd, p, UR_LOC_CPU);
  if (!st) st = ur_tensor_new(&b->labels_buf, UR_DTYPE_F32, 1, s1, p, UR_LOC_CPU);
  if (!st && l->grouped) st = ur_tensor_new(&b->groups_buf, UR_DTYPE_I64, 1, s1, p, UR_LOC_CPU);
  if (!st) st = ur_tensor_new(&b->values_buf, UR_DTYPE_I64, 1, sv, p, UR_LOC_CPU);
  if (!st) st = ur_tensor_new(&b->lengths_buf, UR_DTYPE_I32, 1, sl, p, UR_LOC_CPU);
  if (!st && l->weighted) st = ur_tensor_new(&b->weights_buf, UR_DTYPE_F32, 1, sv, p, UR_LOC_CPU);
  return st;
}

/* Rows perm[off .. off+take) of the window to rows n0.. of the batch being gathered. */
typedef struct gather_job {
  ur_loader *l;
  int64_t off, n0;
} gather_job;

static void gather_rows(void *ctx, size_t i0, size_t i1) {
  const gather_job *j = ctx;
  ur_loader *l = j->l;
  for (size_t i = i0; i < i1; i++) {
    int64_t r = l->perm[j->off + (int64_t)i], g = j->n0 + (int64_t)i;
    memcpy(l->g_dense + g * l->D, l->s_dense + r * l->D, sizeof(float) * (size_t)l->D);
    l->g_labels[g] = l->s_labels[r];
    memcpy(l->g_ids + g * l->H, l->s_ids + r * l->H, sizeof(int64_t) * (size_t)l->H);
    memcpy(l->g_len + g * l->T, l->s_len + r * l->T, sizeof(int32_t) * (size_t)l->T);
    if (l->weighted)
      memcpy(l->g_weights + g * l->H, l->s_weights + r * l->H, sizeof(float) * (size_t)l->H);
    if (l->grouped) l->g_groups[g] = l->s_groups[r];
  }
}

static void gather(ur_loader *l, int64_t off, int64_t take, int64_t n0) {
  gather_job j = {l, off, n0};
  ur__parallel_for((size_t)take, 4096, gather_rows, &j);
}

/* Key t of the gathered rows into the batch's lengths and values (keys run in parallel; each
 * knows where its values start). */
typedef struct key_job {
  ur_loader *l;
  int64_t n;
  int64_t *vstart;
  int64_t *vals;
  int32_t *lens;
  float *w;
} key_job;

static void key_lengths(void *ctx, size_t t0, size_t t1) {
  const key_job *j = ctx;
  ur_loader *l = j->l;
  for (size_t t = t0; t < t1; t++) {
    int64_t sum = 0;
    for (int64_t i = 0; i < j->n; i++) {
      int32_t len = l->g_len[i * l->T + (int64_t)t];
      j->lens[(int64_t)t * j->n + i] = len;
      sum += len;
    }
    j->vstart[t + 1] = sum;
  }
}

static void key_values(void *ctx, size_t t0, size_t t1) {
  const key_job *j = ctx;
  ur_loader *l = j->l;
  for (size_t t = t0; t < t1; t++) {
    int64_t nv = j->vstart[t], c0 = l->col0[t];
    for (int64_t i = 0; i < j->n; i++) {
      int32_t len = j->lens[(int64_t)t * j->n + i];
      const int64_t *src = l->g_ids + i * l->H + c0;
      for (int32_t q = 0; q < len; q++) j->vals[nv + q] = src[q];
      if (j->w) memcpy(j->w + nv, l->g_weights + i * l->H + c0, sizeof(float) * (size_t)len);
      nv += len;
    }
  }
}

/* The gathered rows into slot b as a batch of n samples: dense, labels and a key-major KJT. */
static ur_status fill_batch(ur_loader *l, ur_batch *b, int64_t n) {
  float *dense = ur_tensor_data(b->dense_buf), *labels = ur_tensor_data(b->labels_buf);
  int64_t *vals = ur_tensor_data(b->values_buf);
  int32_t *lens = ur_tensor_data(b->lengths_buf);
  float *w = l->weighted ? ur_tensor_data(b->weights_buf) : NULL;
  int64_t *groups = l->grouped ? ur_tensor_data(b->groups_buf) : NULL;
  memcpy(dense, l->g_dense, sizeof(float) * (size_t)(n * l->D));
  memcpy(labels, l->g_labels, sizeof(float) * (size_t)n);
  if (groups) memcpy(groups, l->g_groups, sizeof(int64_t) * (size_t)n);
  int64_t vstart[UR_SYNTH_MAX_TABLES + 1] = {0};
  key_job kj = {l, n, vstart, vals, lens, w};
  ur__parallel_for((size_t)l->T, 1, key_lengths, &kj);
  for (int t = 0; t < l->T; t++) vstart[t + 1] += vstart[t];
  ur__parallel_for((size_t)l->T, 1, key_values, &kj);
  int64_t nv = vstart[l->T];
  ur_tensor *v = NULL, *ln = NULL, *wt = NULL;
  ur_status st = ur_tensor_view(b->values_buf, &v, 0, nv);
  if (!st) st = ur_tensor_view(b->lengths_buf, &ln, 0, n * l->T);
  if (!st && w) st = ur_tensor_view(b->weights_buf, &wt, 0, nv);
  if (!st) st = ur_tensor_view(b->dense_buf, &b->dense, 0, n);
  if (!st) st = ur_tensor_view(b->labels_buf, &b->labels, 0, n);
  if (!st && groups) st = ur_tensor_view(b->groups_buf, &b->groups, 0, n);
  if (!st)
    st = ur_kjt_new(&b->sparse, l->T, (const char *const *)l->keys, n, NULL, v, ln, wt, NULL, 0);
  ur_tensor_free(v);
  ur_tensor_free(ln);
  ur_tensor_free(wt);
  b->size = n;
  b->bytes = (uint64_t)n * (uint64_t)(l->D * 4 + 4 + (groups ? 8 : 0) + l->T * 4) +
             (uint64_t)nv * (w ? 12 : 8);
  return st;
}

/* ---- the thread ---- */

static void set_error(ur_loader *l, ur_status st) {
  pthread_mutex_lock(&l->mu);
  l->err = st;
  snprintf(l->errmsg, sizeof l->errmsg, "%s", ur_last_error());
  pthread_mutex_unlock(&l->mu);
}

static ur_batch *wait_free_slot(ur_loader *l) {
  pthread_mutex_lock(&l->mu);
  ur_batch *b = &l->slots[l->head % l->nslots];
  /* depth batches ahead of the consumer; the rest of the ring holds batches it keeps */
  while (!l->stop && (b->state != SLOT_FREE || l->head - l->tail >= l->o.depth))
    pthread_cond_wait(&l->cv, &l->mu);
  if (l->stop) b = NULL;
  else b->state = SLOT_FILLING;
  pthread_mutex_unlock(&l->mu);
  return b;
}

static void *run(void *arg) {
  ur_loader *l = arg;
  ur_status st = UR_STATUS_OK;
  int64_t epoch = l->o.start_epoch, k = l->o.start_sample;
  while (!st && (l->o.epochs <= 0 || epoch < l->o.epochs)) {
    int end = 0;
    while (!st && !end) {
      if (__atomic_load_n(&l->stop, __ATOMIC_ACQUIRE)) goto out;
      double t0 = now_s();
      int64_t n = 0;
      int then_fail = 0;
      while (n < l->B) {
        int64_t w = (k + n) / l->W, off = (k + n) % l->W;
        if (l->win_epoch != epoch || l->win_index != w)
          if ((st = load_window(l, epoch, w))) break;
        if (off >= l->win_rows) {
          if (l->pending) then_fail = 1;
          end = 1;
          break;
        }
        int64_t take = l->win_rows - off;
        if (take > l->B - n) take = l->B - n;
        gather(l, off, take, n);
        n += take;
      }
      if (st) break;
      if (l->hi >= 0 && l->lo + k + n >= l->hi) end = 1;
      if (end && l->hi < 0) {
        pthread_mutex_lock(&l->mu);
        l->stats.samples_per_epoch = k + n;
        pthread_mutex_unlock(&l->mu);
      }
      if (then_fail && (!n || (n < l->B && l->o.drop_last))) {
        st = ur__error(l->pending, "%s", l->pending_msg);
        break;
      }
      if (!n || (n < l->B && l->o.drop_last)) break;
      double busy = now_s() - t0;
      ur_batch *b = wait_free_slot(l);
      if (!b) goto out;
      t0 = now_s();
      batch_views_free(b);
      if ((st = fill_batch(l, b, n))) {
        pthread_mutex_lock(&l->mu);
        b->state = SLOT_FREE;
        pthread_mutex_unlock(&l->mu);
        break;
      }
      b->epoch = epoch;
      b->first = k;
      k += n;
      pthread_mutex_lock(&l->mu);
      l->stats.produce_seconds += busy + (now_s() - t0);
      b->state = SLOT_READY;
      l->head++;
      pthread_cond_broadcast(&l->cv);
      pthread_mutex_unlock(&l->mu);
      if (then_fail) st = ur__error(l->pending, "%s", l->pending_msg);
    }
    if (st) break;
    epoch++;
    k = 0;
  }
  if (st) set_error(l, st);
out:
  pthread_mutex_lock(&l->mu);
  l->finished = 1;
  pthread_cond_broadcast(&l->cv);
  pthread_mutex_unlock(&l->mu);
  return NULL;
}

/* ---- the consumer's side ---- */

void ur_loader_close(ur_loader *l) {
  if (!l) return;
  if (l->started) {
    pthread_mutex_lock(&l->mu);
    l->stop = 1;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    pthread_join(l->thread, NULL);
  }
  for (int i = 0; i < l->nslots && l->slots; i++) slot_free(&l->slots[i]);
  free(l->slots);
  ur_criteo_close(l->tsv);
  for (int i = 0; i < l->ndays && l->days; i++) {
    day *d = &l->days[i];
    ur__npy_unmap(&d->dense);
    ur__npy_unmap(&d->sparse);
    ur__npy_unmap(&d->labels);
    ur__npy_unmap(&d->weights);
    ur__npy_unmap(&d->groups);
  }
  free(l->days);
  for (int i = 0; i < l->o.npaths && l->paths; i++) free(l->paths[i]);
  free(l->paths);
  for (int i = 0; i < l->T && l->keys; i++) free(l->keys[i]);
  free(l->keys);
  void *bufs[] = {l->s_dense, l->s_labels, l->s_weights, l->s_ids, l->s_groups, l->perm, l->s_len,
                  l->g_dense, l->g_labels, l->g_weights, l->g_ids, l->g_groups, l->g_len,
                  l->t_labels, l->t_dense, l->t_ids};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
  if (l->started) {
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
  }
  free(l);
}

static void *xmalloc(size_t n, int *bad) {
  void *p = malloc(n ? n : 1);
  if (!p) *bad = 1;
  return p;
}

ur_status ur_loader_open(ur_loader **out, const ur_loader_opts *o) {
  *out = NULL;
  if (o->batch_size < 1)
    return ur__error(UR_STATUS_INVALID, "loader: batch_size %lld; expected >= 1", (long long)o->batch_size);
  if (o->depth < 1 || o->depth > 64)
    return ur__error(UR_STATUS_INVALID, "loader: depth %d; expected 1..64", (int)o->depth);
  if (o->world < 1 || o->rank < 0 || o->rank >= o->world)
    return ur__error(UR_STATUS_INVALID, "loader: rank %d of world %d; expected 0 <= rank < world",
                     (int)o->rank, (int)o->world);
  if (o->shuffle_window < 0 || o->start_epoch < 0 || o->start_sample < 0 || o->epochs < 0)
    return ur__error(UR_STATUS_INVALID, "loader: negative shuffle_window, epochs or start position");
  if (o->placement != UR_PLACE_HOST && o->placement != UR_PLACE_PINNED)
    return ur__error(UR_STATUS_INVALID, "loader: batches go to host or pinned memory, not %s",
                     ur_place_name((ur_place)o->placement));
  if (o->source != UR_SOURCE_SYNTHETIC && (o->npaths < 1 || !o->paths))
    return ur__error(UR_STATUS_INVALID, "loader: no input paths");
  if (o->source == UR_SOURCE_CRITEO_BIN && o->npaths != 1)
    return ur__error(UR_STATUS_INVALID, "loader: criteo-bin takes one folder, got %d paths", (int)o->npaths);
  if (o->source == UR_SOURCE_SYNTHETIC && (!o->synth || o->samples < 0))
    return ur__error(UR_STATUS_INVALID, "loader: synthetic needs a spec and samples >= 0");
  if (o->source < 0 || o->source > UR_SOURCE_CRITEO_BIN)
    return ur__error(UR_STATUS_INVALID, "loader: source %d is not a source", (int)o->source);
  ur_loader *l = calloc(1, sizeof *l);
  if (!l) return ur__error(UR_STATUS_OOM, "loader: out of host memory");
  l->o = *o;
  l->o.paths = NULL;
  l->o.keys = NULL;
  l->o.synth = NULL;
  l->B = o->batch_size;
  l->win_epoch = -1;
  ur_status st = UR_STATUS_OK;
  int bad = 0;
  if (o->npaths > 0) {
    l->paths = calloc((size_t)o->npaths, sizeof(char *));
    if (!l->paths) bad = 1;
    for (int i = 0; i < o->npaths && !bad; i++)
      if (!(l->paths[i] = strdup(o->paths[i] ? o->paths[i] : ""))) bad = 1;
  }
  if (bad) st = ur__error(UR_STATUS_OOM, "loader: out of host memory");
  if (!st) {
    if (o->source == UR_SOURCE_SYNTHETIC) {
      l->synth = *o->synth;
      if (!(st = ur_synth_check(&l->synth))) {
        l->T = l->synth.num_tables;
        l->D = l->synth.num_dense;
        l->H = 0;
        for (int t = 0; t < l->T; t++) {
          l->hot_max[t] = l->synth.tables[t].hot_max;
          l->col0[t] = l->H;
          l->H += l->hot_max[t];
          l->weighted |= l->synth.tables[t].weighted != 0;
        }
        l->col0[l->T] = l->H;
        l->grouped = l->synth.groups > 0;
        l->total = o->samples;
      }
    } else if (o->source == UR_SOURCE_CRITEO_BIN) {
      st = open_bin(l);
    } else {
      l->T = 26;
      l->D = 13;
      l->H = 26;
      for (int t = 0; t <= 26; t++) l->col0[t] = t;
      for (int t = 0; t < 26; t++) l->hot_max[t] = 1;
      st = ur_criteo_open(&l->tsv, (const char *const *)l->paths, o->npaths, &o->criteo);
      l->total = -1;
      if (!st && o->world > 1) {
        /* A split by rows needs the count: one pass over the files first. */
        int64_t m, total = 0;
        while (!(st = ur_criteo_read(l->tsv, INT64_MAX, NULL, NULL, NULL, &m)) && m) total += m;
        l->total = total;
        if (!st) st = tsv_restart(l);
      }
    }
  }
  if (!st) {
    if (l->total >= 0) {
      l->lo = l->total * o->rank / o->world;
      l->hi = l->total * (o->rank + 1) / o->world;
    } else {
      l->lo = 0;
      l->hi = -1;
    }
    l->stats.samples_per_epoch = l->hi >= 0 ? l->hi - l->lo : -1;
    l->W = o->shuffle_window > 0 ? o->shuffle_window : (l->B > 65536 ? l->B : 65536);
    l->keys = calloc((size_t)l->T + 1, sizeof(char *));
    if (!l->keys) bad = 1;
    for (int t = 0; t < l->T && !bad; t++) {
      char name[32];
      snprintf(name, sizeof name, "C%d", t + 1);
      if (!(l->keys[t] = strdup(o->keys && o->keys[t] ? o->keys[t] : name))) bad = 1;
    }
    size_t W = (size_t)l->W, B = (size_t)l->B, D = (size_t)l->D, H = (size_t)l->H, T = (size_t)l->T;
    l->s_dense = xmalloc(W * D * 4, &bad);
    l->s_labels = xmalloc(W * 4, &bad);
    l->s_ids = xmalloc(W * H * 8, &bad);
    l->s_len = xmalloc(W * T * 4, &bad);
    l->perm = xmalloc(W * 8, &bad);
    l->g_dense = xmalloc(B * D * 4, &bad);
    l->g_labels = xmalloc(B * 4, &bad);
    l->g_ids = xmalloc(B * H * 8, &bad);
    l->g_len = xmalloc(B * T * 4, &bad);
    if (l->weighted) {
      l->s_weights = xmalloc(W * H * 4, &bad);
      l->g_weights = xmalloc(B * H * 4, &bad);
    }
    if (l->grouped) {
      l->s_groups = xmalloc(W * 8, &bad);
      l->g_groups = xmalloc(B * 8, &bad);
    }
    if (o->source == UR_SOURCE_CRITEO_TSV) {
      l->t_labels = xmalloc(W * 4, &bad);
      l->t_dense = xmalloc(W * 13 * 4, &bad);
      l->t_ids = xmalloc(W * 26 * 4, &bad);
    }
    if (bad) st = ur__error(UR_STATUS_OOM, "loader: out of host memory for a window of %zu rows", W);
  }
  if (!st) {
    l->nslots = o->depth + 2;
    l->slots = calloc((size_t)l->nslots, sizeof(ur_batch));
    if (!l->slots) st = ur__error(UR_STATUS_OOM, "loader: out of host memory");
    for (int i = 0; i < l->nslots && !st; i++) st = slot_alloc(l, &l->slots[i]);
  }
  if (!st) {
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    l->started = 1;
    if (pthread_create(&l->thread, NULL, run, l)) {
      l->started = 0;
      pthread_mutex_destroy(&l->mu);
      pthread_cond_destroy(&l->cv);
      st = ur__error(UR_STATUS_OOM, "loader: cannot start its thread");
    }
  }
  if (st) {
    ur_loader_close(l);
    return st;
  }
  l->stats.epoch = o->start_epoch;
  l->stats.sample = o->start_sample;
  *out = l;
  return UR_STATUS_OK;
}

ur_status ur_loader_next(ur_loader *l, ur_batch **out) {
  *out = NULL;
  double t0 = now_s();
  pthread_mutex_lock(&l->mu);
  ur_batch *b = &l->slots[l->tail % l->nslots];
  while (l->tail == l->head && !l->finished) pthread_cond_wait(&l->cv, &l->mu);
  l->stats.wait_seconds += now_s() - t0;
  if (l->tail == l->head) { /* finished: the end, or the thread's error */
    ur_status st = l->err;
    if (st) ur__error(st, "%s", l->errmsg);
    pthread_mutex_unlock(&l->mu);
    return st;
  }
  b->state = SLOT_TAKEN;
  l->tail++;
  l->stats.batches++;
  l->stats.samples += b->size;
  l->stats.bytes += (int64_t)b->bytes;
  l->stats.epoch = b->epoch;
  l->stats.sample = b->first + b->size;
  pthread_cond_broadcast(&l->cv);
  pthread_mutex_unlock(&l->mu);
  *out = b;
  return UR_STATUS_OK;
}

void ur_loader_release(ur_loader *l, ur_batch *b) {
  if (!b) return;
  pthread_mutex_lock(&l->mu);
  if (b->state == SLOT_TAKEN) {
    b->state = SLOT_FREE;
    pthread_cond_broadcast(&l->cv);
  }
  pthread_mutex_unlock(&l->mu);
}

ur_status ur_loader_stats_get(const ur_loader *l, ur_loader_stats *out) {
  pthread_mutex_lock((pthread_mutex_t *)&l->mu);
  *out = l->stats;
  pthread_mutex_unlock((pthread_mutex_t *)&l->mu);
  return UR_STATUS_OK;
}

const ur_tensor *ur_batch_dense(const ur_batch *b) { return b->dense; }
const ur_tensor *ur_batch_labels(const ur_batch *b) { return b->labels; }
const ur_tensor *ur_batch_groups(const ur_batch *b) { return b->groups; }
const ur_kjt *ur_batch_sparse(const ur_batch *b) { return b->sparse; }
int64_t ur_batch_size(const ur_batch *b) { return b->size; }
int64_t ur_batch_epoch(const ur_batch *b) { return b->epoch; }
int64_t ur_batch_first_sample(const ur_batch *b) { return b->first; }
