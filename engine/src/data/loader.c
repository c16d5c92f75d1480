/* loader.c: the batch loader.  Worker threads each make whole batches.  A dispatcher (run by
 * one worker at a time) hands the batches out in order, each a run of positions of one epoch,
 * and prepares the windows they read: a window's Fisher-Yates permutation, drawn from Philox
 * at (epoch, window, i), and for TSV its rows, read in order.  The worker then reads its
 * batch's rows straight from the source (day files mapped in memory, the synthetic generator,
 * or the window's TSV rows) into a slot of pinned buffers: dense, labels, and the KJT key-major
 * with its offsets, written in one pass.  The consumer takes the batches in order, so the
 * batches and a resume position are the same on any number of threads.  Stopping (close) and
 * errors end it cleanly: the threads are joined and every buffer freed. */
#include <ctype.h>
#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "data/data.h"
#include "data/kjt.h"
#include "data/synth.h"
#include "core/bypass.h"
#include "core/philox.h"

size_t ur_sizeof_loader_opts(void) { return sizeof(ur_loader_opts); }
size_t ur_sizeof_loader_stats(void) { return sizeof(ur_loader_stats); }

enum { SLOT_FREE = 0, SLOT_FILLING, SLOT_READY, SLOT_TAKEN, SLOT_ERROR };

struct ur_batch {
  int state;
  int64_t index;             /* which batch of the run this slot holds */
  int64_t size, epoch, first;
  int64_t next;              /* the position after it: first + size, or past the global batch
                              * a slice was cut from */
  /* whole-capacity buffers, and this batch's views of them */
  ur_tensor *dense_buf, *labels_buf, *groups_buf, *values_buf, *lengths_buf, *weights_buf,
      *offsets_buf;
  ur_tensor *dense, *labels, *groups;
  ur_kjt *sparse;
  uint64_t bytes;
};

typedef struct day {
  ur__npy_map_t dense, sparse, labels, weights, groups;
  ur__npy_map_t mod;         /* day_N_sparse_rows.npy: the sizes convert took ids modulo */
  int have_weights, have_groups, have_mod;
  int number;                /* N of day_N_*.npy */
  int64_t rows, first;       /* rows, and the global row of the first */
} day;

/* A window of rows of one epoch: its permutation, and for TSV the rows themselves. */
typedef struct win {
  int64_t epoch, index, rows;
  int64_t ended;             /* TSV: the epoch's rows where the files ended before the window, else -1 */
  int64_t *perm;             /* position -> row within the window; NULL: in order */
  int drawn;                 /* the permutation: 0 to draw, 1 being drawn, 2 ready */
  int refs;                  /* batches handed out that read it */
  int32_t *t_labels;         /* TSV: the rows as read */
  float *t_dense;
  uint32_t *t_ids;
  struct win *next;
} win;

/* A batch handed to a worker: positions k .. k + n - 1 of an epoch, or an error in its place. */
typedef struct job {
  int64_t index, epoch, k, n;
  int nwins;
  win **wins;                /* windows k / W, k / W + 1, ... (the worker's array) */
  ur_status err;
  char msg[1024];
} job;

typedef struct worker {
  struct ur_loader *l;
  pthread_t thread;
  win **wins;
  int64_t *ids;              /* a block of samples' ids, weights and lengths (out_rows) */
  float *w;
  int32_t *len;
  int64_t *tot, *val0;       /* [T], [T + 1]: a batch's values per table and where each begins */
} worker;

struct ur_loader {
  ur_loader_opts o;
  char **paths, **keys;
  ur__synth *sx;             /* the synthetic spec, expanded */
  int32_t T, D;
  int64_t H, B;
  /* per table, T of each (col0 T + 1), sized once the source is open (alloc_tables) */
  int32_t *hot_max;
  int64_t *col0;
  int64_t *rows_mod;         /* day files, synthetic: ids of table t mod rows_mod[t] (> 0) */
  int rows_given;            /* rows_mod are the consumer's sizes, 0 (raw) included */
  int weighted, grouped, one_hot; /* one_hot: every table one id a sample */
  /* the rows of this rank per epoch: [lo, hi) of the source (hi -1: unknown, TSV) */
  int64_t total, lo, hi;
  int64_t W;                 /* rows a window */
  /* sources */
  ur_criteo_reader *tsv;
  int64_t tsv_next;          /* the row the TSV reader gives next */
  day *days;
  int ndays;
  /* the dispatcher's state, under dmu */
  pthread_mutex_t dmu;
  pthread_cond_t wcv;        /* a window's permutation is drawn */
  win *wins;
  int64_t d_index, d_epoch, d_k;
  int d_done;
  ur_status pending;         /* a TSV error met after some rows: raised once they are out */
  char pending_msg[1024];
  int fail_next;             /* the batch just handed out is the last before that error */
  /* the workers */
  worker *workers;
  int nworkers, nstarted;
  /* the slots and the consumer, under mu */
  ur_batch *slots;
  int nslots;
  int64_t ahead;             /* batches made or in the making ahead of the consumer */
  int64_t tail;              /* batches handed to the consumer */
  int64_t njobs;             /* batches in all (errors included) once known; -1 before */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int stop, locks;
  ur_status err;
  char errmsg[1024];
  ur_loader_stats stats;
};

static double cpu_s(void) { /* this thread's CPU time: what a batch costs, whatever the load */
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- sources ---- */

static int day_cmp(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

/* "<i4 [400, 26]": what a day file holds, for its errors. */
static const char *npy_what(const ur_npy_info *i, char *buf, size_t n) {
  int k = snprintf(buf, n, "%s [", i->descr);
  for (int j = 0; j < i->ndim && k > 0 && (size_t)k < n; j++)
    k += snprintf(buf + k, n - (size_t)k, "%s%lld", j ? ", " : "", (long long)i->shape[j]);
  if (k > 0 && (size_t)k < n) snprintf(buf + k, n - (size_t)k, "]");
  return buf;
}

static ur_status open_day(ur_loader *l, const char *dir, int dn, day *d) {
  char path[4200];
  ur_status st;
  d->number = dn;
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
  snprintf(path, sizeof path, "%s/day_%d_sparse_rows.npy", dir, dn);
  if (!access(path, R_OK)) {
    if ((st = ur__npy_map(path, &d->mod))) return st;
    d->have_mod = 1;
  }
  const ur_npy_info *di = &d->dense.info, *si = &d->sparse.info, *li = &d->labels.info;
  d->rows = di->ndim >= 1 ? di->shape[0] : 0;
  snprintf(path, sizeof path, "%s/day_%d", dir, dn);
  char got[96];
  if (di->ndim != 2 || strcmp(di->descr, "<f4"))
    return ur__error(UR_STATUS_FORMAT, "criteo-bin: %s_dense.npy must be <f4 [N, dense], got %s", path,
                     npy_what(di, got, sizeof got));
  if (si->ndim != 2 || si->shape[0] != d->rows || !strcmp(si->descr, "<f4"))
    return ur__error(UR_STATUS_FORMAT,
                     "criteo-bin: %s_sparse.npy must be integer ids [%lld, columns] (the dense file's rows), "
                     "got %s", path, (long long)d->rows, npy_what(si, got, sizeof got));
  if (!(li->ndim == 1 || (li->ndim == 2 && li->shape[1] == 1)) || li->shape[0] != d->rows)
    return ur__error(UR_STATUS_FORMAT, "criteo-bin: %s_labels.npy must be [%lld] or [%lld, 1], got %s",
                     path, (long long)d->rows, (long long)d->rows, npy_what(li, got, sizeof got));
  if (d->have_weights && (d->weights.info.ndim != 2 || d->weights.info.shape[0] != d->rows ||
                          d->weights.info.shape[1] != si->shape[1] || strcmp(d->weights.info.descr, "<f4")))
    return ur__error(UR_STATUS_FORMAT, "criteo-bin: %s_weights.npy must be <f4 like the sparse ids", path);
  /* grouping keys are read as integers: an <f4 file's bits would be read as keys */
  if (d->have_groups && (d->groups.info.ndim != 1 || d->groups.info.shape[0] != d->rows ||
                         d->groups.info.descr[1] == 'f'))
    return ur__error(UR_STATUS_FORMAT, "criteo-bin: %s_groups.npy must be integer keys [%lld] (<i4, <u4 or "
                     "<i8), got %s", path, (long long)d->rows, npy_what(&d->groups.info, got, sizeof got));
  if (d->have_mod && (d->mod.info.ndim != 1 || d->mod.info.shape[0] != si->shape[1] ||
                      strcmp(d->mod.info.descr, "<i8")))
    return ur__error(UR_STATUS_FORMAT, "criteo-bin: %s_sparse_rows.npy must be <i8 [%lld] (a size a column), got %s",
                     path, (long long)si->shape[1], npy_what(&d->mod.info, got, sizeof got));
  return UR_STATUS_OK;
}

/* Day files whose ids convert took modulo sizes R (day_N_sparse_rows.npy) are read taking them
 * modulo the loader's rows only where those divide R: (id mod R) mod rows is then id mod rows,
 * the row a model given the raw id maps it to (serving, TSV files). Other rows would read
 * other rows than the served model does, so they are refused; so is a table read raw (rows 0)
 * beside tables given rows, or where the caller says its rows are given (rows_given: every
 * table raw), as training keeps a managed-collision table's raw ids: it would learn ids mod R
 * and be served the raw ones.  A loader given no rows at all only reads. */
static ur_status check_mod(const ur_loader *l, const char *dir) {
  int sized = l->rows_given;
  for (int t = 0; t < l->T; t++) sized |= l->rows_mod[t] > 0;
  for (int i = 0; sized && i < l->ndays; i++) {
    const day *d = &l->days[i];
    if (!d->have_mod) continue;
    const int64_t *mod = d->mod.data;
    for (int t = 0; t < l->T; t++) {
      int64_t was = mod[l->col0[t]], rows = l->rows_mod[t];
      char how[64];
      if (rows > 0) snprintf(how, sizeof how, "mod %lld rows, which does not divide it", (long long)rows);
      else snprintf(how, sizeof how, "raw (the table keeps its raw ids: managed collisions)");
      if (was > 0 && (rows <= 0 || was % rows))
        return ur__error(UR_STATUS_FORMAT,
                         "criteo-bin: %s/day_%d's ids of C%d were taken mod %lld (uvmrec convert --rows; "
                         "day_%d_sparse_rows.npy) but are read %s: the model would not see the rows its "
                         "served raw ids map to; convert again with these rows (--config or --rows) or "
                         "without --rows",
                         dir, d->number, t + 1, (long long)was, d->number, how);
    }
  }
  return UR_STATUS_OK;
}

/* What the loader reads, for its errors: "criteo-bin: DIR", "criteo-tsv", "synthetic data". */
static const char *source_name(const ur_loader *l, char *buf, size_t n) {
  if (l->o.source == UR_SOURCE_CRITEO_BIN) snprintf(buf, n, "criteo-bin: %s", l->paths[0]);
  else snprintf(buf, n, "%s", l->o.source == UR_SOURCE_CRITEO_TSV ? "criteo-tsv" : "synthetic data");
  return buf;
}

/* The rows and key names given for a source (what) of T tables: one a table (rows: or one for
 * all), sizes >= 0; fewer keys would be read past their end. */
static ur_status check_counts(const ur_loader_opts *o, int32_t T, const char *what) {
  if (o->rows) {
    if (o->num_rows != 1 && o->num_rows != T)
      return ur__error(UR_STATUS_INVALID, "loader: %d table size%s (rows) for %s, which has %d table%s; "
                       "expected one a table, or one for every table", (int)o->num_rows, ur__s(o->num_rows), what,
                       (int)T, ur__s(T));
    for (int t = 0; t < T; t++) {
      int64_t r = o->rows[o->num_rows == 1 ? 0 : t];
      if (r < 0)
        return ur__error(UR_STATUS_INVALID, "loader: rows of table %d (of %s) is %lld; expected a table "
                         "size >= 1, or 0 (raw ids)", t + 1, what, (long long)r);
    }
  }
  if (o->keys && o->num_keys != T)
    return ur__error(UR_STATUS_INVALID, "loader: %d key name%s for %s, which has %d table%s; expected one a table",
                     (int)o->num_keys, ur__s(o->num_keys), what, (int)T, ur__s(T));
  return UR_STATUS_OK;
}

/* The sizes each of the source's tables' ids are taken modulo (rows_mod; 0: raw): opts.rows,
 * one a table or one for all, else criteo.rows, which hold 26, the TSV format's tables: a wider
 * source given those would read its tables past the 26th raw, ids beyond their tables, so it is
 * refused, and told to give rows. */
static ur_status set_rows(ur_loader *l, const ur_loader_opts *o) {
  char what[4200];
  source_name(l, what, sizeof what);
  ur_loader_opts counted = *o;
  counted.keys = NULL; /* checked by open, once the source is open */
  ur_status st = check_counts(&counted, l->T, what);
  if (st) return st;
  if (o->rows) {
    for (int t = 0; t < l->T; t++) l->rows_mod[t] = o->rows[o->num_rows == 1 ? 0 : t];
    return UR_STATUS_OK;
  }
  int any = o->rows_given;
  for (int t = 0; t < 26; t++) any |= o->criteo.rows[t] > 0;
  if (any && l->T > 26)
    return ur__error(UR_STATUS_INVALID, "loader: criteo.rows hold the sizes of 26 tables, but %s has %d: its "
                     "tables 27 to %d would be read raw; give rows (num_rows: one a table, or one for all)",
                     what, (int)l->T, (int)l->T);
  for (int t = 0; t < l->T; t++) l->rows_mod[t] = t < 26 && o->criteo.rows[t] > 0 ? o->criteo.rows[t] : 0;
  return UR_STATUS_OK;
}

/* The key names given are the batches' KJT keys: two of one name would make every batch a KJT
 * whose lookups by name find one table's bags for both (sorted: 1000 keys, 10k comparisons). */
static ur_status distinct_keys(const char *const *keys, int32_t T, const char *what) {
  int32_t a, b;
  ur_status st = ur__names_repeat(keys, T, "loader", &a, &b);
  if (!st && a >= 0)
    st = ur__error(UR_STATUS_INVALID, "loader: key names %d and %d (of %s) are both '%s'; expected one name a "
                   "table", (int)a + 1, (int)b + 1, what, keys[a]);
  return st;
}

/* The per-table arrays for T tables (T <= UR_SYNTH_MAX_TABLES, checked by the caller). */
static ur_status alloc_tables(ur_loader *l, int32_t T) {
  l->T = T;
  if (!(l->hot_max = calloc((size_t)T + 1, sizeof *l->hot_max)) ||
      !(l->col0 = calloc((size_t)T + 1, sizeof *l->col0)) ||
      !(l->rows_mod = calloc((size_t)T + 1, sizeof *l->rows_mod)))
    return ur__error(UR_STATUS_OOM, "loader: out of host memory for %d table%s", (int)T, ur__s(T));
  return UR_STATUS_OK;
}

/* Table layout of day files: layout.txt's "hot" line when present ("hot 1,1-3,..."; a bag
 * of at most hi ids a table), else one column a table. */
static ur_status bin_layout(ur_loader *l, const char *dir, int64_t columns, int64_t dense) {
  char path[4200];
  snprintf(path, sizeof path, "%s/layout.txt", dir);
  FILE *f = fopen(path, "r");
  char *line = NULL, *hot = NULL;
  size_t cap = 0;
  if (f) {
    while (!hot && getline(&line, &cap, f) >= 0)
      if (!strncmp(line, "hot ", 4)) hot = line + 4;
    fclose(f);
  }
  int64_t nt = 0;
  if (hot) {
    nt = 1;
    for (const char *p = hot; *p; p++) nt += *p == ',';
  } else {
    nt = columns;
  }
  ur_status st = UR_STATUS_OK;
  if (nt > UR_SYNTH_MAX_TABLES)
    st = ur__error(UR_STATUS_FORMAT, "criteo-bin: %s: %lld tables (%s); expected at most %d "
                   "(UR_SYNTH_MAX_TABLES)", dir, (long long)nt,
                   hot ? "layout.txt's hot line" : "sparse columns", UR_SYNTH_MAX_TABLES);
  if (!st) st = alloc_tables(l, (int32_t)nt);
  for (int64_t t = 0; !st && t < nt; t++) {
    if (!hot) {
      l->hot_max[t] = 1;
      continue;
    }
    char *p = hot;
    long lo = strtol(p, &p, 10), hi = lo;
    if (*p == '-') hi = strtol(p + 1, &p, 10);
    /* the entry ends at its comma, the last at the line's end ('2x' read as 2 before) */
    const char *q = p;
    while (t + 1 == nt && isspace((unsigned char)*q)) q++;
    int ends = t + 1 < nt ? *p == ',' : !*q;
    if (p == hot || !ends || hi < 1 || hi > 4096 || lo < 0 || lo > hi) {
      size_t len = strcspn(hot, ",\r\n");
      st = ur__error(UR_STATUS_FORMAT, "criteo-bin: %s/layout.txt: table %lld's ids per sample "
                     "'%.*s'; expected N or MIN-MAX with 0 <= MIN <= MAX, 1 <= MAX <= 4096",
                     dir, (long long)t + 1, (int)(len < 40 ? len : 40), hot);
    }
    l->hot_max[t] = (int32_t)hi;
    hot = *p == ',' ? p + 1 : p;
  }
  free(line);
  if (st) return st;
  l->D = (int32_t)dense;
  l->H = 0;
  for (int64_t t = 0; t < nt; t++) {
    l->col0[t] = l->H;
    l->H += l->hot_max[t];
  }
  l->col0[nt] = l->H;
  if (l->H != columns)
    return ur__error(UR_STATUS_FORMAT, "criteo-bin: %s: layout.txt's tables take %lld column%s but the sparse ids have %lld",
                     dir, (long long)l->H, ur__s(l->H), (long long)columns);
  return UR_STATUS_OK;
}

/* N of a file named day_N_dense.npy, as convert and datagen name days: N in decimal, without a
 * sign or leading zeros, below 2^31.  1: a day; 0: not a day's dense file; -1: a name of that
 * shape whose N is written otherwise (day_01, day_+1, day_99999999999), which would be read as
 * another day's files, or a day twice. */
static int day_number(const char *name, int *out) {
  if (strncmp(name, "day_", 4)) return 0;
  const char *p = name + 4, *q = p;
  while (*q >= '0' && *q <= '9') q++;
  if (q == p) {
    const char *r = p + (*p == '-' || *p == '+');
    while (*r >= '0' && *r <= '9') r++;
    return r > p + 1 && !strcmp(r, "_dense.npy") ? -1 : 0;
  }
  if (strcmp(q, "_dense.npy")) return 0;
  if ((q - p > 1 && *p == '0') || q - p > 10) return -1;
  long long n = strtoll(p, NULL, 10);
  if (n > INT32_MAX) return -1;
  *out = (int)n;
  return 1;
}

static ur_status open_bin(ur_loader *l) {
  const char *dir = l->paths[0];
  DIR *dh = opendir(dir);
  if (!dh) return ur__error(UR_STATUS_IO, "criteo-bin: %s: cannot open the folder", dir);
  /* every day there, however many (grown by doubling), then in the order of N */
  int *nums = NULL;
  size_t n = 0, cap = 0;
  struct dirent *e;
  ur_status st = UR_STATUS_OK;
  while (!st && (e = readdir(dh))) {
    int dn = 0, k = day_number(e->d_name, &dn);
    if (k < 0)
      st = ur__error(UR_STATUS_FORMAT, "criteo-bin: %s/%s: not a day's name; expected day_N_dense.npy with N "
                     "a whole number from 0 to 2147483647 without leading zeros (as uvmrec convert and "
                     "datagen write them)", dir, e->d_name);
    if (k <= 0 || st) continue;
    if (n == cap) {
      size_t c2 = cap ? cap * 2 : 256;
      int *grown = realloc(nums, c2 * sizeof *nums);
      if (!grown) {
        st = ur__error(UR_STATUS_OOM, "criteo-bin: %s: out of host memory for %zu day files", dir, c2);
        break;
      }
      nums = grown;
      cap = c2;
    }
    nums[n++] = dn;
  }
  closedir(dh);
  if (!st && !n) st = ur__error(UR_STATUS_IO, "criteo-bin: %s: no day_N_dense.npy files", dir);
  if (!st && n > INT32_MAX)
    st = ur__error(UR_STATUS_FORMAT, "criteo-bin: %s: %zu day files; at most %d", dir, n, INT32_MAX);
  if (st) {
    free(nums);
    return st;
  }
  qsort(nums, n, sizeof(int), day_cmp);
  l->days = calloc(n, sizeof(day));
  if (!l->days) {
    free(nums);
    return ur__error(UR_STATUS_OOM, "criteo-bin: out of host memory");
  }
  l->ndays = (int)n;
  int64_t first = 0;
  for (size_t i = 0; i < n && !st; i++) {
    if ((st = open_day(l, dir, nums[i], &l->days[i]))) break;
    l->days[i].first = first;
    first += l->days[i].rows;
    const day *d0 = &l->days[0], *d = &l->days[i];
    if (d->dense.info.shape[1] != d0->dense.info.shape[1] || d->sparse.info.shape[1] != d0->sparse.info.shape[1])
      st = ur__error(UR_STATUS_FORMAT, "criteo-bin: %s: day %d's shapes differ from day %d's", dir,
                     nums[i], nums[0]);
    else if (d->have_weights != d0->have_weights || d->have_groups != d0->have_groups)
      st = ur__error(UR_STATUS_FORMAT, "criteo-bin: %s: day %d has weights or groups where day %d has not",
                     dir, nums[i], nums[0]);
  }
  free(nums);
  if (st) return st;
  l->total = first;
  l->weighted = l->days[0].have_weights;
  l->grouped = l->days[0].have_groups;
  return bin_layout(l, dir, l->days[0].sparse.info.shape[1], l->days[0].dense.info.shape[1]);
}

static ur_status tsv_restart(ur_loader *l) {
  ur_criteo_close(l->tsv);
  l->tsv = NULL;
  l->tsv_next = 0;
  return ur_criteo_open(&l->tsv, (const char *const *)l->paths, l->o.npaths, &l->o.criteo);
}

/* Up to n TSV rows from row0 into window x (the reader goes forward, restarting when asked to
 * go back); *got is fewer than n at the end of the files.  An error after some rows is kept
 * as pending and raised once those rows are out. */
static ur_status read_tsv(ur_loader *l, win *x, int64_t row0, int64_t n, int64_t *got) {
  ur_status st;
  *got = 0;
  if (!l->tsv || row0 < l->tsv_next)
    if ((st = tsv_restart(l))) return st;
  int64_t m;
  while (l->tsv_next < row0) { /* skip, through the window's arrays */
    int64_t want = row0 - l->tsv_next < l->W ? row0 - l->tsv_next : l->W;
    if ((st = ur_criteo_read(l->tsv, want, x->t_labels, x->t_dense, x->t_ids, &m))) return st;
    if (!m) return UR_STATUS_OK;
    l->tsv_next += m;
  }
  while (*got < n) {
    if ((st = ur_criteo_read(l->tsv, n - *got, x->t_labels + *got, x->t_dense + *got * 13,
                             x->t_ids + *got * 26, &m))) {
      if (!*got) return st;
      l->pending = st;
      snprintf(l->pending_msg, sizeof l->pending_msg, "%s", ur_last_error());
      return UR_STATUS_OK;
    }
    if (!m) break;
    *got += m;
    l->tsv_next += m;
  }
  return UR_STATUS_OK;
}

/* ---- windows (the dispatcher's, under dmu) ---- */

static void win_free(win *x) {
  if (!x) return;
  free(x->perm);
  free(x->t_labels);
  free(x->t_dense);
  free(x->t_ids);
  free(x);
}

/* Window w of epoch e, with a reference for the caller: kept from before, or made (a window no
 * batch reads any more, from before it, is reused: windows are asked for in order). */
static ur_status get_window(ur_loader *l, int64_t e, int64_t w, win **out) {
  *out = NULL;
  win *x = NULL;
  for (win *y = l->wins; y; y = y->next)
    if (y->epoch == e && y->index == w) {
      y->refs++;
      *out = y;
      return UR_STATUS_OK;
    }
  for (win *y = l->wins; y && !x; y = y->next)
    if (!y->refs && (y->epoch < e || (y->epoch == e && y->index < w))) x = y;
  if (!x) {
    int bad = !(x = calloc(1, sizeof *x));
    if (!bad && l->o.shuffle_window > 0) bad = !(x->perm = malloc(sizeof(int64_t) * (size_t)l->W));
    if (!bad && l->o.source == UR_SOURCE_CRITEO_TSV) {
      bad = !(x->t_labels = malloc(sizeof(int32_t) * (size_t)l->W)) ||
            !(x->t_dense = malloc(sizeof(float) * 13 * (size_t)l->W)) ||
            !(x->t_ids = malloc(sizeof(uint32_t) * 26 * (size_t)l->W));
    }
    if (bad) {
      win_free(x);
      return ur__error(UR_STATUS_OOM, "loader: out of host memory for a window of %lld row%s",
                       (long long)l->W, ur__s(l->W));
    }
    x->next = l->wins;
    l->wins = x;
  }
  x->epoch = e;
  x->index = w;
  x->rows = 0;
  int64_t row0 = l->lo + w * l->W, n = l->W, got = 0;
  if (l->hi >= 0) {
    n = l->hi - row0;
    if (n > l->W) n = l->W;
    if (n < 0) n = 0;
  }
  got = n;
  ur_status st = UR_STATUS_OK;
  if (n > 0 && l->o.source == UR_SOURCE_CRITEO_TSV) st = read_tsv(l, x, row0, n, &got);
  if (st) {
    x->epoch = -1; /* nothing valid: reusable at once */
    return st;
  }
  x->rows = got;
  /* TSV files that end before the window's first row (only a start position asks for it) */
  x->ended = l->o.source == UR_SOURCE_CRITEO_TSV && n > 0 && !got && l->tsv_next < row0 ? l->tsv_next - l->lo
                                                                                         : -1;
  x->drawn = x->perm ? 0 : 2;
  x->refs = 1;
  *out = x;
  return UR_STATUS_OK;
}

/* The shuffle's draw i of window w of epoch e (W rows a window).  In 64 bits the counter was
 * (e << 44) ^ (w << 24) ^ i, whose fields met past their bits: window 0's draw 2^24 + j was
 * window 1's draw j, window 2^20 + v of epoch e was window v of epoch e + 1, and epoch 2^20 was
 * epoch 0.  Within those bits (i < 2^24, w < 2^20, e < 2^20) it stays, the same orders as
 * before; past them ur_philox128 takes e + 1 (never 0) as the high word and the draw's row in
 * the epoch, w * W + i, as the low one: a counter of its own whatever the sizes. */
static ur_philox4 shuffle_draw(uint64_t e, uint64_t w, uint64_t W, uint64_t i, uint64_t key) {
  if (i < (1u << 24) && w < (1u << 20) && e < (1u << 20)) return ur_philox(e << 44 | w << 24 | i, key);
  return ur_philox128(w * W + i, e + 1, key);
}

/* Window x's permutation, drawn by the first worker that needs it (outside the dispatcher's
 * lock: windows are drawn by several workers at once), waited for by the others. */
static void draw_window(ur_loader *l, win *x) {
  pthread_mutex_lock(&l->dmu);
  while (x->drawn == 1) pthread_cond_wait(&l->wcv, &l->dmu);
  int mine = x->drawn == 0;
  if (mine) x->drawn = 1;
  pthread_mutex_unlock(&l->dmu);
  if (!mine) return;
  /* Fisher-Yates drawing from Philox at (epoch, window, i): the same order on a resume. */
  int64_t *p = x->perm, got = x->rows;
  uint64_t key = l->o.seed ^ 0x5DEECE66Dull, e = (uint64_t)x->epoch, w = (uint64_t)x->index;
  for (int64_t i = 0; i < got; i++) p[i] = i;
  for (int64_t i = got - 1; i > 0; i--) {
    ur_philox4 r = shuffle_draw(e, w, (uint64_t)l->W, (uint64_t)i, key);
    uint64_t k = ((uint64_t)r.v[0] << 32 | r.v[1]) % (uint64_t)(i + 1);
    int64_t tmp = p[i];
    p[i] = p[k];
    p[k] = tmp;
  }
  pthread_mutex_lock(&l->dmu);
  x->drawn = 2;
  pthread_cond_broadcast(&l->wcv);
  pthread_mutex_unlock(&l->dmu);
}

static void release_windows(job *j) {
  for (int i = 0; i < j->nwins; i++) j->wins[i]->refs--;
  j->nwins = 0;
}

/* A start position past the epoch's end (sample `end` of this rank's share): a resume from
 * another data set, refused where the loader opens (the size known) or at the first batch. */
static ur_status past_end(int64_t epoch, int64_t sample, int64_t end) {
  return ur__error(UR_STATUS_INVALID, "loader: the start position (epoch %lld, sample %lld) lies past the epoch's "
                   "end (sample %lld); expected a position this data gave, at most its end", (long long)epoch,
                   (long long)sample, (long long)end);
}

/* The start position against a source of `total` samples (< 0: not known until read), this
 * rank's share of them as ur_loader_open splits it. */
static ur_status check_start(const ur_loader_opts *o, int64_t total) {
  if (total < 0) return UR_STATUS_OK;
  int64_t share = total * (o->rank + 1) / o->world - total * o->rank / o->world;
  return o->start_sample > share ? past_end(o->start_epoch, o->start_sample, share) : UR_STATUS_OK;
}

static void set_samples_per_epoch(ur_loader *l, int64_t n) {
  pthread_mutex_lock(&l->mu);
  l->stats.samples_per_epoch = n;
  pthread_mutex_unlock(&l->mu);
}

/* The next batch in order into j (1), or 0 when there are no more.  Under dmu.  Batches never
 * cross an epoch; a partial last batch is dropped on request; an error of the source becomes
 * a batch of its own, after the batches made before it, and the last one. */
static int dispatch(ur_loader *l, job *j) {
  j->nwins = 0;
  j->err = UR_STATUS_OK;
  for (;;) {
    if (l->d_done) return 0;
    if (l->fail_next) {
      j->err = l->pending;
      snprintf(j->msg, sizeof j->msg, "%s", l->pending_msg);
      j->index = l->d_index++;
      l->d_done = 1;
      return 1;
    }
    int64_t e = l->d_epoch, k = l->d_k, n = 0;
    if (l->o.epochs > 0 && e >= l->o.epochs) {
      l->d_done = 1;
      return 0;
    }
    int end = 0, then_fail = 0;
    ur_status st = UR_STATUS_OK;
    while (n < l->B) {
      int64_t w = (k + n) / l->W, off = (k + n) % l->W;
      win *x = j->nwins ? j->wins[j->nwins - 1] : NULL;
      if (!x || x->index != w) {
        if ((st = get_window(l, e, w, &x))) {
          if (n) { /* the rows before it go out first, as those before an error within a window */
            l->pending = st;
            snprintf(l->pending_msg, sizeof l->pending_msg, "%s", ur_last_error());
            st = UR_STATUS_OK;
            then_fail = end = 1;
          }
          break;
        }
        j->wins[j->nwins++] = x;
      }
      if (!n && off > x->rows && l->pending) { /* the reader's error ended the rows first */
        st = ur__error(l->pending, "%s", l->pending_msg);
        break;
      }
      /* only a start position can lie there: a resume from another data set */
      if (!n && (off > x->rows || x->ended >= 0)) {
        st = past_end(e, k, x->ended >= 0 ? x->ended : k - off + x->rows);
        break;
      }
      if (off >= x->rows) {
        if (l->pending) then_fail = 1;
        end = 1;
        break;
      }
      int64_t take = x->rows - off;
      if (take > l->B - n) take = l->B - n;
      n += take;
    }
    if (st) {
      release_windows(j);
      j->err = st;
      snprintf(j->msg, sizeof j->msg, "%s", ur_last_error());
      j->index = l->d_index++;
      l->d_done = 1;
      return 1;
    }
    if (l->hi >= 0 && l->lo + k + n >= l->hi) end = 1;
    if (end && !then_fail && l->hi < 0) set_samples_per_epoch(l, k + n);
    /* Rows an error cut short: a batch unless dropped, or unless the ranks cannot share it, where
     * the error itself is what fails (the epoch's count of rows is not what went wrong). */
    if (then_fail && (!n || (n < l->B && l->o.drop_last) ||
                      (l->o.even_slices && l->o.slice_world > 1 && n % l->o.slice_world))) {
      release_windows(j);
      l->fail_next = 1;
      continue;
    }
    if (!n || (n < l->B && l->o.drop_last)) {
      release_windows(j);
      if (!k) { /* an epoch without a batch: so are the next ones */
        l->d_done = 1;
        return 0;
      }
      l->d_epoch++;
      l->d_k = 0;
      continue;
    }
    if (l->o.even_slices && l->o.slice_world > 1 && n % l->o.slice_world) {
      /* every rank reads the same global batches, so every rank fails here alike */
      release_windows(j);
      ur__error(UR_STATUS_FORMAT, "loader: the batch at sample %lld of epoch %lld (the epoch's last) has %lld "
                "sample%s (batch_size %lld), which the %d ranks (slice_world) cannot share equally: each takes "
                "an equal slice of every global batch (drop_last drops an epoch's short last batch)",
                (long long)k, (long long)e, (long long)n, ur__s(n), (long long)l->B, (int)l->o.slice_world);
      j->err = UR_STATUS_FORMAT; /* the data's count: returned, as a reading error is */
      snprintf(j->msg, sizeof j->msg, "%s", ur_last_error());
      j->index = l->d_index++;
      l->d_done = 1;
      return 1;
    }
    j->index = l->d_index++;
    j->epoch = e;
    j->k = k;
    j->n = n;
    l->d_k = k + n;
    if (then_fail) l->fail_next = 1;
    if (end) {
      l->d_epoch++;
      l->d_k = 0;
    }
    return 1;
  }
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
  ur_tensor_free(b->offsets_buf);
}

/* The bytes of one slot's buffers (for the accounting of host memory). */
static uint64_t slot_bytes(int64_t B, int64_t D, int64_t H, int64_t T, int weighted, int grouped) {
  return (uint64_t)B * (uint64_t)(D * 4 + 4 + (grouped ? 8 : 0) + H * (weighted ? 12 : 8) + T * 4 +
                                  T * 8) + 8;
}

static ur_status slot_alloc(ur_loader *l, ur_batch *b) {
  ur_place p = l->o.placement == UR_PLACE_HOST ? UR_PLACE_HOST : UR_PLACE_PINNED;
  int64_t sd[2] = {l->B, l->D}, s1[1] = {l->B}, sv[1] = {l->B * l->H}, sl[1] = {l->B * l->T},
          so[1] = {l->B * l->T + 1};
  b->index = -1;
  ur_status st = ur_tensor_new(&b->dense_buf, UR_DTYPE_F32, 2, sd, p, UR_LOC_CPU);
  if (!st) st = ur_tensor_new(&b->labels_buf, UR_DTYPE_F32, 1, s1, p, UR_LOC_CPU);
  if (!st && l->grouped) st = ur_tensor_new(&b->groups_buf, UR_DTYPE_I64, 1, s1, p, UR_LOC_CPU);
  if (!st) st = ur_tensor_new(&b->values_buf, UR_DTYPE_I64, 1, sv, p, UR_LOC_CPU);
  if (!st) st = ur_tensor_new(&b->lengths_buf, UR_DTYPE_I32, 1, sl, p, UR_LOC_CPU);
  if (!st) st = ur_tensor_new(&b->offsets_buf, UR_DTYPE_I64, 1, so, p, UR_LOC_CPU);
  if (!st && l->weighted) st = ur_tensor_new(&b->weights_buf, UR_DTYPE_F32, 1, sv, p, UR_LOC_CPU);
  return st;
}

/* Under the address sanitizer (ur__tensor_poison): the slot's buffers past what a batch of n
 * samples and nv ids uses made unreadable, so a reader of the batch's views that runs past
 * their end is reported; n < 0 makes them readable again, before the slot is filled. */
static void slot_tails(const ur_loader *l, ur_batch *b, int64_t n, int64_t nv) {
  ur_tensor *bufs[] = {b->dense_buf,  b->labels_buf,  b->groups_buf, b->values_buf,
                       b->weights_buf, b->lengths_buf, b->offsets_buf};
  uint64_t used[] = {(uint64_t)(n * l->D * 4), (uint64_t)n * 4, (uint64_t)n * 8, (uint64_t)nv * 8,
                     (uint64_t)nv * 4, (uint64_t)(n * l->T * 4), (uint64_t)(n * l->T + 1) * 8};
  for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
    if (bufs[i]) ur__tensor_poison(bufs[i], n < 0 ? 0 : used[i], UINT64_MAX, n >= 0);
}

/* Where a batch's rows go.  Dense features and labels straight into the slot; ids, weights
 * and lengths first into a block of BLOCK samples (sample-major, small enough for the L1 and L2
 * caches), then out key-major: sample i's bag of table t padded at values[n * col0[t] + i *
 * hot_max[t]], its length at lengths[t * n + i].  Written a block at a time, each table's run is
 * contiguous: a few store streams instead of one a table and a length a sample. */
#define BLOCK 128
typedef struct out_rows {
  int64_t n;
  float *dense, *labels, *weights;
  int64_t *values, *groups, *offsets;
  int32_t *lengths;
  int64_t *bids;             /* the block: ids [BLOCK, H], weights, lengths [BLOCK, T] */
  float *bw;
  int32_t *blen;
  int64_t *tot;              /* [T] values per table (the worker's) */
  int64_t bad_row;           /* day files: the first global row whose label is outside [0, 1], or -1 */
  float bad_label;           /* its value: in an <f4 file */
  int64_t bad_label_int;     /* in an integer file, as the file holds it (exactly) */
  int64_t bad_id_row, bad_id_col, bad_id; /* and the first id below -1 (-1: no id), or row -1 */
  int64_t bad_dense_row, bad_dense_col;     /* and the first dense value not finite, or row -1 */
  float bad_dense;
  int64_t bad_w_row, bad_w_col;             /* and the first weight of an id not finite, or row -1 */
  float bad_w;
} out_rows;

/* Samples i0 .. i0 + m - 1 of the block out to the slot, with the offsets they would have if
 * no bag were short (make_batch mends them when one is).  The slot's big arrays are written once
 * and read by someone else later (the consumer, or a copy to the GPU): stores that bypass the
 * cache. */
static void flush_block(const ur_loader *l, out_rows *o, int64_t i0, int64_t m) {
  int64_t n = o->n, H = l->H, T = l->T;
  for (int64_t t = 0; t < T; t++) {
    int32_t *len = o->lengths + t * n + i0;
    int64_t sum = 0, hot = l->hot_max[t], c0 = l->col0[t];
    int64_t *off = o->offsets + t * n + i0 + 1, at = n * c0 + i0 * hot;
    for (int64_t s = 0; s < m; s++) {
      int32_t k = o->blen[s * T + t];
      ur__bypass32(len + s, k);
      ur__bypass64(off + s, at + (s + 1) * hot);
      sum += k;
    }
    o->tot[t] += sum;
    int64_t *v = o->values + n * c0 + i0 * hot;
    if (hot == 1) {
      for (int64_t s = 0; s < m; s++) ur__bypass64(v + s, o->bids[s * H + c0]);
      if (o->weights)
        for (int64_t s = 0; s < m; s++) o->weights[n * c0 + i0 + s] = o->bw[s * H + c0];
    } else {
      for (int64_t s = 0; s < m; s++) {
        for (int64_t q = 0; q < hot; q++) ur__bypass64(v + s * hot + q, o->bids[s * H + c0 + q]);
        if (o->weights)
          memcpy(o->weights + n * c0 + (i0 + s) * hot, o->bw + s * H + c0, sizeof(float) * (size_t)hot);
      }
    }
  }
}

static int64_t read_id(const char *src, const ur_npy_info *si, int64_t c) {
  if (si->item_bytes == 8) {
    int64_t v;
    memcpy(&v, src + c * 8, 8);
    return v;
  }
  if (si->descr[1] == 'u') {
    uint32_t u;
    memcpy(&u, src + c * 4, 4);
    return u;
  }
  int32_t x;
  memcpy(&x, src + c * 4, 4);
  return x;
}

/* The day holding global row g (*dc: the day last found, where the next row most often is;
 * else a binary search of the days' first rows: a shuffled window jumps between days, and
 * walking to the row's day cost a step a day between, for every row, over thousands of small
 * days).  Days of no rows share their first row with the next day, so the last day whose first
 * row is at most g is the one holding it. */
static const day *day_of(const ur_loader *l, int64_t g, int *dc) {
  const day *d = &l->days[*dc];
  if (g >= d->first && g < d->first + d->rows) return d;
  int lo = 0, hi = l->ndays - 1;
  while (lo < hi) {
    int mid = lo + (hi - lo + 1) / 2;
    if (l->days[mid].first <= g) lo = mid;
    else hi = mid - 1;
  }
  *dc = lo;
  return &l->days[lo];
}

/* Rows are read at random within a window (the shuffle), so each is a cache and TLB miss:
 * the rows PREFETCH samples ahead are asked for while this one is copied. */
#define PREFETCH 16

static void bin_prefetch(const ur_loader *l, int64_t g, int *dc) {
  const day *d = day_of(l, g, dc);
  int64_t r = g - d->first;
  const char *sp = (const char *)d->sparse.data + (size_t)r * (size_t)l->H * d->sparse.info.item_bytes;
  const char *dp = (const char *)d->dense.data + (size_t)r * (size_t)l->D * 4;
  __builtin_prefetch(dp);
  __builtin_prefetch(dp + l->D * 4 - 1);
  __builtin_prefetch(sp);
  __builtin_prefetch(sp + (size_t)l->H * d->sparse.info.item_bytes - 1);
  __builtin_prefetch((const char *)d->labels.data + (size_t)r * d->labels.info.item_bytes);
}

/* Global row g of the day files as sample i; *dc caches the day last read. */
static void bin_row(const ur_loader *l, int64_t g, int64_t i, out_rows *o, int *dc) {
  const day *d = day_of(l, g, dc);
  int64_t r = g - d->first;
  const ur_npy_info *li = &d->labels.info, *si = &d->sparse.info;
  const float *dsrc = (const float *)d->dense.data + r * l->D;
  if (l->D == 13) memcpy(o->dense + i * 13, dsrc, 13 * sizeof(float)); /* inlined: Criteo's */
  else memcpy(o->dense + i * l->D, dsrc, sizeof(float) * (size_t)l->D);
  /* a NaN or infinite feature would train the model to NaN, far from the row that held it */
  for (int64_t c = 0; c < l->D; c++)
    if (!isfinite(dsrc[c]) && o->bad_dense_row < 0)
      o->bad_dense_row = g, o->bad_dense_col = c, o->bad_dense = dsrc[c];
  /* a label outside [0, 1] (2, -1, NaN) would train and score silently wrong: make_batch fails */
  if (li->descr[1] == 'f') {
    float v;
    memcpy(&v, (const char *)d->labels.data + (size_t)r * 4, 4);
    o->labels[i] = v;
    if (!(v >= 0 && v <= 1) && o->bad_row < 0) o->bad_row = g, o->bad_label = v;
  } else {
    int64_t v; /* as the file holds it: <u4 unsigned, <i8 whole */
    if (li->item_bytes == 8) {
      memcpy(&v, (const char *)d->labels.data + (size_t)r * 8, 8);
    } else if (li->descr[1] == 'u') {
      uint32_t u;
      memcpy(&u, (const char *)d->labels.data + (size_t)r * 4, 4);
      v = u;
    } else {
      int32_t x;
      memcpy(&x, (const char *)d->labels.data + (size_t)r * 4, 4);
      v = x;
    }
    o->labels[i] = (float)v;
    if ((v < 0 || v > 1) && o->bad_row < 0) o->bad_row = g, o->bad_label_int = v;
  }
  const char *src = (const char *)d->sparse.data + (size_t)r * (size_t)l->H * si->item_bytes;
  const float *wsrc = l->weighted ? (const float *)d->weights.data + r * l->H : NULL;
  int64_t s = i % BLOCK, *ids = o->bids + s * l->H;
  int32_t *len = o->blen + s * l->T;
  if (l->one_hot && si->item_bytes == 4 && !wsrc) {
    /* Criteo's layout: a column a table, 32-bit ids (the common case, kept branch-light) */
    int is_u = si->descr[1] == 'u';
    for (int t = 0; t < l->T; t++) {
      int32_t x;
      memcpy(&x, src + t * 4, 4);
      int64_t v = is_u ? (int64_t)(uint32_t)x : (int64_t)x, rows = l->rows_mod[t];
      if (v < -1 && o->bad_id_row < 0) o->bad_id_row = g, o->bad_id_col = t, o->bad_id = v;
      len[t] = v >= 0;
      if (rows > 0 && v >= rows) v %= rows;
      ids[t] = v;
    }
  } else {
    for (int t = 0; t < l->T; t++) {
      int64_t rows = l->rows_mod[t], c0 = l->col0[t];
      int32_t k = 0;
      for (int64_t c = c0; c < l->col0[t + 1]; c++) {
        int64_t v = read_id(src, si, c);
        if (v < -1 && o->bad_id_row < 0) o->bad_id_row = g, o->bad_id_col = c, o->bad_id = v;
        if (v < 0) continue; /* -1: no id in this slot (a multi-hot bag's padding); the ids after it count */
        if (rows > 0 && v >= rows) v %= rows;
        ids[c0 + k] = v;
        if (wsrc) { /* as a dense value: a NaN weight makes the pooled embedding, and the model, NaN */
          o->bw[s * l->H + c0 + k] = wsrc[c];
          if (!isfinite(wsrc[c]) && o->bad_w_row < 0) o->bad_w_row = g, o->bad_w_col = c, o->bad_w = wsrc[c];
        }
        k++;
      }
      len[t] = k;
    }
  }
  if (l->grouped) {
    const ur_npy_info *gi = &d->groups.info;
    int64_t gv = 0;
    if (gi->item_bytes == 8) memcpy(&gv, (const char *)d->groups.data + r * 8, 8);
    else if (gi->descr[1] == 'u') {
      uint32_t x;
      memcpy(&x, (const char *)d->groups.data + r * 4, 4);
      gv = x;
    } else {
      int32_t x;
      memcpy(&x, (const char *)d->groups.data + r * 4, 4);
      gv = x;
    }
    o->groups[i] = gv;
  }
}

/* Synthetic sample g as sample i. */
static void synth_row(const ur_loader *l, int64_t g, int64_t i, out_rows *o) {
  int64_t s = i % BLOCK;
  int64_t *ids = o->bids + s * l->H;
  ur__synth_row(l->sx, g, o->dense + i * l->D, o->labels + i, ids,
                l->weighted ? o->bw + s * l->H : NULL, o->blen + s * l->T,
                l->grouped ? o->groups + i : NULL, NULL);
  /* rows reduce synthetic ids too (an id space larger than the table), as day files' */
  for (int t = 0; t < l->T; t++) {
    int64_t rows = l->rows_mod[t];
    if (rows <= 0) continue;
    for (int64_t c = l->col0[t]; c < l->col0[t + 1]; c++)
      if (ids[c] >= rows) ids[c] %= rows;
  }
}

/* Row r of TSV window x as sample i (the reader reduced the ids already). */
static void tsv_row(const win *x, int64_t r, int64_t i, out_rows *o) {
  int64_t s = i % BLOCK;
  memcpy(o->dense + i * 13, x->t_dense + r * 13, 13 * sizeof(float));
  o->labels[i] = (float)x->t_labels[r];
  for (int c = 0; c < 26; c++) {
    o->bids[s * 26 + c] = x->t_ids[r * 26 + c];
    o->blen[s * 26 + c] = 1;
  }
}

/* Job j's rows into slot b: dense, labels, groups, and the KJT (padded bags closed up where
 * some are short, then the offsets).  With slice_world > 1 the job is a global batch and only
 * this rank's slice of it, rows [r0, r0 + n), is read. */
static ur_status make_batch(ur_loader *l, worker *wk, const job *j, ur_batch *b) {
  int64_t r0 = 0, n = j->n, T = l->T;
  if (l->o.slice_world > 1) {
    r0 = j->n * l->o.slice_rank / l->o.slice_world;
    n = j->n * (l->o.slice_rank + 1) / l->o.slice_world - r0;
  }
  out_rows o;
  memset(&o, 0, sizeof o);
  o.n = n;
  o.bad_row = o.bad_id_row = o.bad_dense_row = o.bad_w_row = -1;
  slot_tails(l, b, -1, 0);
  o.dense = ur_tensor_data(b->dense_buf);
  o.labels = ur_tensor_data(b->labels_buf);
  o.values = ur_tensor_data(b->values_buf);
  o.lengths = ur_tensor_data(b->lengths_buf);
  o.weights = l->weighted ? ur_tensor_data(b->weights_buf) : NULL;
  o.groups = l->grouped ? ur_tensor_data(b->groups_buf) : NULL;
  o.offsets = ur_tensor_data(b->offsets_buf);
  o.offsets[0] = 0;
  o.bids = wk->ids;
  o.bw = wk->w;
  o.blen = wk->len;
  o.tot = wk->tot;
  memset(o.tot, 0, sizeof(int64_t) * (size_t)T);
  for (int i = 0; i < j->nwins; i++) draw_window(l, j->wins[i]);
  int64_t w0 = j->k / l->W;
  int dc = 0, pc = 0;
  for (int64_t i = 0; i < n; i++) {
    int64_t q = j->k + r0 + i;
    const win *x = j->wins[q / l->W - w0];
    int64_t off = q % l->W, r = x->perm ? x->perm[off] : off;
    if (l->o.source == UR_SOURCE_CRITEO_BIN) {
      if (i + PREFETCH < n) {
        int64_t qp = q + PREFETCH, op = qp % l->W;
        const win *xp = j->wins[qp / l->W - w0];
        bin_prefetch(l, l->lo + xp->index * l->W + (xp->perm ? xp->perm[op] : op), &pc);
      }
      bin_row(l, l->lo + x->index * l->W + r, i, &o, &dc);
    } else if (l->o.source == UR_SOURCE_SYNTHETIC) {
      synth_row(l, l->lo + x->index * l->W + r, i, &o);
    } else {
      tsv_row(x, r, i, &o);
    }
    if (i % BLOCK == BLOCK - 1 || i == n - 1) flush_block(l, &o, i - i % BLOCK, i % BLOCK + 1);
  }
  ur__bypass_fence(); /* the streamed stores are done before anything reads them */
  if (o.bad_row >= 0) {
    const day *d = day_of(l, o.bad_row, &dc);
    char v[32];
    if (d->labels.info.descr[1] == 'f') snprintf(v, sizeof v, "%g", (double)o.bad_label);
    else snprintf(v, sizeof v, "%lld", (long long)o.bad_label_int);
    return ur__error(UR_STATUS_FORMAT, "criteo-bin: %s/day_%d_labels.npy: row %lld holds label %s; expected 0 or 1 "
                     "(or, in an <f4 file, a value from 0 to 1)", l->paths[0], d->number,
                     (long long)(o.bad_row - d->first), v);
  }
  if (o.bad_id_row >= 0) { /* a negative id read as a bag of none would lose it silently */
    const day *d = day_of(l, o.bad_id_row, &dc);
    return ur__error(UR_STATUS_FORMAT, "criteo-bin: %s/day_%d_sparse.npy: row %lld, column %lld holds id %lld; "
                     "expected an id >= 0 or -1 (no id; ids of 2^31 and more need a <u4 or <i8 file)",
                     l->paths[0], d->number, (long long)(o.bad_id_row - d->first), (long long)o.bad_id_col,
                     (long long)o.bad_id);
  }
  if (o.bad_dense_row >= 0) {
    const day *d = day_of(l, o.bad_dense_row, &dc);
    return ur__error(UR_STATUS_FORMAT, "criteo-bin: %s/day_%d_dense.npy: row %lld, column %lld holds %g; "
                     "expected a finite value", l->paths[0], d->number,
                     (long long)(o.bad_dense_row - d->first), (long long)o.bad_dense_col,
                     (double)o.bad_dense);
  }
  if (o.bad_w_row >= 0) {
    const day *d = day_of(l, o.bad_w_row, &dc);
    return ur__error(UR_STATUS_FORMAT, "criteo-bin: %s/day_%d_weights.npy: row %lld, column %lld holds %g; "
                     "expected a finite weight", l->paths[0], d->number, (long long)(o.bad_w_row - d->first),
                     (long long)o.bad_w_col, (double)o.bad_w);
  }
  int64_t *val0 = wk->val0;
  val0[0] = 0;
  int short_bags = 0;
  for (int64_t t = 0; t < T; t++) {
    val0[t + 1] = val0[t] + o.tot[t];
    short_bags |= o.tot[t] != n * l->hot_max[t];
  }
  if (short_bags) { /* close the bags up, then offsets from the lengths */
    for (int64_t t = 0; t < T; t++) {
      int64_t dst = val0[t], hot = l->hot_max[t];
      if (dst == n * l->col0[t] && o.tot[t] == n * hot) continue; /* in place already */
      for (int64_t i = 0; i < n; i++) {
        int32_t len = o.lengths[t * n + i];
        int64_t src = n * l->col0[t] + i * hot;
        if (src != dst) {
          memmove(o.values + dst, o.values + src, sizeof(int64_t) * (size_t)len);
          if (o.weights) memmove(o.weights + dst, o.weights + src, sizeof(float) * (size_t)len);
        }
        dst += len;
      }
    }
    int64_t sum = 0;
    for (int64_t k = 0; k < T * n; k++) {
      sum += o.lengths[k];
      o.offsets[k + 1] = sum;
    }
  }
  int64_t nv = val0[T];
  ur_tensor *v = NULL, *ln = NULL, *wt = NULL, *of = NULL;
  ur_status st = ur_tensor_view(b->values_buf, &v, 0, nv);
  if (!st) st = ur_tensor_view(b->lengths_buf, &ln, 0, n * T);
  if (!st) st = ur_tensor_view(b->offsets_buf, &of, 0, n * T + 1);
  if (!st && o.weights) st = ur_tensor_view(b->weights_buf, &wt, 0, nv);
  if (!st) st = ur_tensor_view(b->dense_buf, &b->dense, 0, n);
  if (!st) st = ur_tensor_view(b->labels_buf, &b->labels, 0, n);
  if (!st && o.groups) st = ur_tensor_view(b->groups_buf, &b->groups, 0, n);
  if (!st)
    st = ur__kjt_new_with_offsets(&b->sparse, l->T, (const char *const *)l->keys, n, v, ln, wt, of,
                                  val0);
  if (!st) slot_tails(l, b, n, nv);
  ur_tensor_free(v);
  ur_tensor_free(ln);
  ur_tensor_free(wt);
  ur_tensor_free(of);
  b->size = n;
  b->epoch = j->epoch;
  b->first = j->k + r0;
  b->next = j->k + j->n;
  b->bytes = (uint64_t)n * (uint64_t)(l->D * 4 + 4 + (o.groups ? 8 : 0) + l->T * 4) +
             (uint64_t)nv * (o.weights ? 12 : 8);
  return st;
}

/* ---- the workers ---- */

static int stopping(ur_loader *l) { return __atomic_load_n(&l->stop, __ATOMIC_ACQUIRE); }

static void *run(void *arg) {
  worker *wk = arg;
  ur_loader *l = wk->l;
  job j;
  memset(&j, 0, sizeof j);
  j.wins = wk->wins;
  for (;;) {
    double c0 = cpu_s();
    pthread_mutex_lock(&l->dmu);
    int got = !stopping(l) && dispatch(l, &j);
    int64_t total = l->d_done ? l->d_index : -1;
    pthread_mutex_unlock(&l->dmu);
    if (!got) {
      pthread_mutex_lock(&l->mu);
      if (total >= 0) l->njobs = total;
      pthread_cond_broadcast(&l->cv);
      pthread_mutex_unlock(&l->mu);
      break;
    }
    pthread_mutex_lock(&l->mu);
    ur_batch *b = &l->slots[j.index % l->nslots];
    /* ahead batches in the making or made; the rest of the ring holds batches the consumer keeps */
    while (!l->stop && (b->state != SLOT_FREE || j.index - l->tail >= l->ahead))
      pthread_cond_wait(&l->cv, &l->mu);
    int stop = l->stop;
    if (!stop) {
      b->state = SLOT_FILLING;
      b->index = j.index;
    }
    pthread_mutex_unlock(&l->mu);
    ur_status st = j.err;
    double t0 = ur_clock_seconds();
    if (!stop && !st) {
      batch_views_free(b);
      if ((st = make_batch(l, wk, &j, b))) snprintf(j.msg, sizeof j.msg, "%s", ur_last_error());
    }
    double busy = ur_clock_seconds() - t0;
    pthread_mutex_lock(&l->dmu);
    release_windows(&j);
    if (st) l->d_done = 1;
    pthread_mutex_unlock(&l->dmu);
    if (stop) break;
    pthread_mutex_lock(&l->mu);
    if (st) {
      b->state = SLOT_ERROR;
      if (!l->err) {
        l->err = st;
        snprintf(l->errmsg, sizeof l->errmsg, "%s", j.msg);
      }
    } else {
      b->state = SLOT_READY;
      l->stats.produce_seconds += busy;
      l->stats.produce_cpu_seconds += cpu_s() - c0;
    }
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
  }
  return NULL;
}

/* ---- the consumer's side ---- */

void ur_loader_close(ur_loader *l) {
  if (!l) return;
  if (l->nstarted) {
    pthread_mutex_lock(&l->mu);
    /* atomic: stopping() reads it under the dispatch lock, not this one */
    __atomic_store_n(&l->stop, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    for (int i = 0; i < l->nstarted; i++) pthread_join(l->workers[i].thread, NULL);
  }
  for (int i = 0; i < l->nslots && l->slots; i++) slot_free(&l->slots[i]);
  free(l->slots);
  for (int i = 0; i < l->nworkers && l->workers; i++) {
    free(l->workers[i].wins);
    free(l->workers[i].ids);
    free(l->workers[i].w);
    free(l->workers[i].len);
    free(l->workers[i].tot);
    free(l->workers[i].val0);
  }
  free(l->workers);
  while (l->wins) {
    win *x = l->wins;
    l->wins = x->next;
    win_free(x);
  }
  ur_criteo_close(l->tsv);
  for (int i = 0; i < l->ndays && l->days; i++) {
    day *d = &l->days[i];
    ur__npy_unmap(&d->dense);
    ur__npy_unmap(&d->sparse);
    ur__npy_unmap(&d->labels);
    ur__npy_unmap(&d->weights);
    ur__npy_unmap(&d->groups);
    ur__npy_unmap(&d->mod);
  }
  free(l->days);
  for (int i = 0; i < l->o.npaths && l->paths; i++) free(l->paths[i]);
  free(l->paths);
  for (int i = 0; i < l->T && l->keys; i++) free(l->keys[i]);
  free(l->keys);
  ur__synth_release(l->sx);
  free(l->sx);
  free(l->hot_max);
  free(l->col0);
  free(l->rows_mod);
  if (l->locks) {
    pthread_mutex_destroy(&l->mu);
    pthread_mutex_destroy(&l->dmu);
    pthread_cond_destroy(&l->cv);
    pthread_cond_destroy(&l->wcv);
  }
  free(l);
}

static ur_status check_opts(const ur_loader_opts *o) {
  if (o->batch_size < 1)
    return ur__error(UR_STATUS_INVALID, "loader: batch_size %lld; expected >= 1", (long long)o->batch_size);
  if (o->depth < 1 || o->depth > 64)
    return ur__error(UR_STATUS_INVALID, "loader: depth %d; expected 1..64", (int)o->depth);
  if (o->slice_world < 0 || (o->slice_world > 0 && (o->slice_rank < 0 || o->slice_rank >= o->slice_world)))
    return ur__error(UR_STATUS_INVALID,
                     "loader: batch slice %d of %d; expected 0 <= slice_rank < slice_world",
                     (int)o->slice_rank, (int)o->slice_world);
  if (o->even_slices && o->slice_world > 1 && o->batch_size % o->slice_world)
    return ur__error(UR_STATUS_INVALID, "loader: batch_size %lld is not a multiple of the %d ranks (slice_world): "
                     "with even_slices each takes an equal slice of every global batch",
                     (long long)o->batch_size, (int)o->slice_world);
  if (o->threads < 0 || o->threads > 256)
    return ur__error(UR_STATUS_INVALID, "loader: threads %d; expected 0 (UR_NUM_THREADS, else every "
                     "core) to 256", (int)o->threads);
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
  return UR_STATUS_OK;
}

ur_status ur_loader_check(const ur_loader_opts *opts, int32_t tables) {
  UR__ARGS(opts);
  ur_loader_opts o = *opts;
  o.placement = UR_PLACE_PINNED; /* the caller's batches go where it makes them */
  ur_status st = check_opts(&o);
  if (st) return st;
  char what[4200];
  if (o.source == UR_SOURCE_CRITEO_BIN) snprintf(what, sizeof what, "criteo-bin: %s", o.paths[0]);
  else snprintf(what, sizeof what, "%s", o.source == UR_SOURCE_CRITEO_TSV ? "criteo-tsv" : "synthetic data");
  st = check_counts(&o, tables, what);
  if (!st && o.keys) st = distinct_keys(o.keys, tables, what);
  if (!st && o.source == UR_SOURCE_SYNTHETIC) st = check_start(&o, o.samples);
  return st;
}

/* The source: its tables, columns and rows. */
static ur_status open_source(ur_loader *l, const ur_loader_opts *o) {
  ur_status st;
  if (o->source == UR_SOURCE_SYNTHETIC) {
    const ur_synth_spec *sp = o->synth;
    if (!(l->sx = calloc(1, sizeof *l->sx))) return ur__error(UR_STATUS_OOM, "loader: out of host memory");
    if ((st = ur__synth_expand(sp, l->sx))) return st;
    if ((st = alloc_tables(l, sp->num_tables))) return st;
    l->D = sp->num_dense;
    l->H = 0;
    for (int t = 0; t < l->T; t++) {
      l->hot_max[t] = sp->tables[t].hot_max;
      l->col0[t] = l->H;
      l->H += l->hot_max[t];
      l->weighted |= sp->tables[t].weighted != 0;
    }
    l->col0[l->T] = l->H;
    l->grouped = sp->groups > 0;
    l->total = o->samples;
    return set_rows(l, o);
  }
  if (o->source == UR_SOURCE_CRITEO_BIN) {
    if ((st = open_bin(l))) return st;
    if ((st = set_rows(l, o))) return st;
    l->rows_given = o->rows_given != 0;
    return check_mod(l, l->paths[0]);
  }
  if ((st = alloc_tables(l, 26))) return st;
  l->D = 13;
  l->H = 26;
  for (int t = 0; t <= 26; t++) l->col0[t] = t;
  for (int t = 0; t < 26; t++) l->hot_max[t] = 1;
  if ((st = set_rows(l, o))) return st;
  /* the reader takes the ids modulo the rows as it parses them */
  for (int t = 0; t < 26; t++) l->o.criteo.rows[t] = l->rows_mod[t];
  if ((st = ur_criteo_open(&l->tsv, (const char *const *)l->paths, o->npaths, &l->o.criteo))) return st;
  l->total = -1;
  if (o->world > 1 || o->count_samples) {
    /* A split by rows needs the count, and a caller may ask for it (the epoch's last batch
     * checked before the first): one pass over the files first. */
    int64_t m, total = 0;
    while (!(st = ur_criteo_read(l->tsv, INT64_MAX, NULL, NULL, NULL, &m)) && m) total += m;
    l->total = total;
    if (!st) st = tsv_restart(l);
  }
  return st;
}

ur_status ur_loader_open(ur_loader **out, const ur_loader_opts *o) {
  UR__ARGS(out);
  if (!o) return ur__null(__func__, "opts");
  *out = NULL;
  ur_status st = check_opts(o);
  if (st) return st;
  ur_loader *l = calloc(1, sizeof *l);
  if (!l) return ur__error(UR_STATUS_OOM, "loader: out of host memory");
  l->o = *o;
  l->o.paths = NULL;
  l->o.keys = NULL;
  l->o.synth = NULL;
  l->o.rows = NULL; /* the caller's: read by open_source only */
  /* keys and rows name the source's tables one for one, known once it is open */
  l->B = o->batch_size;
  l->njobs = -1;
  int bad = 0;
  if (o->npaths > 0) {
    l->paths = calloc((size_t)o->npaths, sizeof(char *));
    if (!l->paths) bad = 1;
    for (int i = 0; i < o->npaths && !bad; i++)
      if (!(l->paths[i] = strdup(o->paths[i] ? o->paths[i] : ""))) bad = 1;
  }
  if (bad) st = ur__error(UR_STATUS_OOM, "loader: out of host memory");
  if (!st) st = open_source(l, o);
  if (!st && o->keys) {
    char what[4200];
    ur_loader_opts named = *o;
    named.rows = NULL; /* checked by set_rows */
    st = check_counts(&named, l->T, source_name(l, what, sizeof what));
    if (!st) st = distinct_keys(o->keys, l->T, what);
  }
  if (!st) {
    l->one_hot = 1;
    for (int t = 0; t < l->T; t++) l->one_hot &= l->hot_max[t] == 1;
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
    l->nworkers = o->threads > 0 ? o->threads : ur__threads();
    l->workers = calloc((size_t)l->nworkers, sizeof(worker));
    if (!l->workers) bad = 1;
    /* windows a batch reads: B / W whole ones, a partial one at each end, one past the end */
    size_t nw = (size_t)(l->B / l->W) + 3;
    for (int i = 0; i < l->nworkers && !bad; i++) {
      worker *wk = &l->workers[i];
      wk->l = l;
      bad = !(wk->wins = calloc(nw, sizeof(win *))) ||
            !(wk->ids = malloc(sizeof(int64_t) * BLOCK * (size_t)(l->H + 1))) ||
            !(wk->w = malloc(sizeof(float) * BLOCK * (size_t)(l->H + 1))) ||
            !(wk->len = malloc(sizeof(int32_t) * BLOCK * (size_t)(l->T + 1))) ||
            !(wk->tot = malloc(sizeof(int64_t) * (size_t)(l->T + 1))) ||
            !(wk->val0 = malloc(sizeof(int64_t) * (size_t)(l->T + 1)));
    }
    if (bad) st = ur__error(UR_STATUS_OOM, "loader: out of host memory");
    else st = check_start(o, l->total);
  }
  if (!st) {
    l->ahead = o->depth > l->nworkers ? o->depth : l->nworkers;
    l->nslots = (int)l->ahead + 2;
    l->slots = calloc((size_t)l->nslots, sizeof(ur_batch));
    if (!l->slots) st = ur__error(UR_STATUS_OOM, "loader: out of host memory");
    for (int i = 0; i < l->nslots && !st; i++) st = slot_alloc(l, &l->slots[i]);
    if (st && st == UR_STATUS_OOM) {
      char have[32];
      ur__format_bytes(slot_bytes(l->B, l->D, l->H, l->T, l->weighted, l->grouped), have, sizeof have);
      st = ur__error_cause(st, "loader: %d slot%s of %s (batch %lld, %d ahead)", l->nslots, ur__s(l->nslots), have,
                           (long long)l->B, (int)l->ahead);
    }
  }
  if (!st) {
    pthread_mutex_init(&l->mu, NULL);
    pthread_mutex_init(&l->dmu, NULL);
    pthread_cond_init(&l->cv, NULL);
    pthread_cond_init(&l->wcv, NULL);
    l->locks = 1;
    l->d_epoch = o->start_epoch;
    l->d_k = o->start_sample;
    l->stats.epoch = o->start_epoch;
    l->stats.sample = o->start_sample;
    for (int i = 0; i < l->nworkers; i++) {
      if (pthread_create(&l->workers[i].thread, NULL, run, &l->workers[i])) break;
      l->nstarted++;
    }
    if (!l->nstarted) st = ur__error(UR_STATUS_OOM, "loader: cannot start its threads");
  }
  if (st) {
    ur_loader_close(l);
    return st;
  }
  *out = l;
  return UR_STATUS_OK;
}

ur_status ur_loader_next(ur_loader *l, ur_batch **out) {
  UR__ARGS(l, out);
  *out = NULL;
  double t0 = ur_clock_seconds();
  pthread_mutex_lock(&l->mu);
  ur_batch *b;
  for (;;) {
    b = &l->slots[l->tail % l->nslots];
    if (b->index == l->tail && (b->state == SLOT_READY || b->state == SLOT_ERROR)) break;
    if (l->njobs >= 0 && l->tail >= l->njobs) { /* the end */
      l->stats.wait_seconds += ur_clock_seconds() - t0;
      pthread_mutex_unlock(&l->mu);
      return UR_STATUS_OK;
    }
    pthread_cond_wait(&l->cv, &l->mu);
  }
  l->stats.wait_seconds += ur_clock_seconds() - t0;
  if (b->state == SLOT_ERROR) { /* raised after the batches before it, and again if asked */
    ur_status st = ur__error(l->err, "%s", l->errmsg);
    pthread_mutex_unlock(&l->mu);
    return st;
  }
  b->state = SLOT_TAKEN;
  l->tail++;
  l->stats.batches++;
  l->stats.samples += b->size;
  l->stats.bytes += (int64_t)b->bytes;
  l->stats.epoch = b->epoch;
  l->stats.sample = b->next;
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
  UR__ARGS(l, out);
  pthread_mutex_lock((pthread_mutex_t *)&l->mu);
  *out = l->stats;
  out->threads = l->nworkers;
  pthread_mutex_unlock((pthread_mutex_t *)&l->mu);
  return UR_STATUS_OK;
}

uint64_t ur_loader_host_bytes(const ur_loader_opts *opts, int32_t columns, int32_t tables,
                              int32_t dense) {
  UR__ARGS_OR(0, opts);
  int threads = opts->threads > 0 ? opts->threads : ur__threads();
  int64_t ahead = opts->depth > threads ? opts->depth : threads;
  int64_t B = opts->batch_size > 0 ? opts->batch_size : 1;
  int64_t W = opts->shuffle_window > 0 ? opts->shuffle_window : (B > 65536 ? B : 65536);
  uint64_t slots = (uint64_t)(ahead + 2) * slot_bytes(B, dense, columns, tables, 1, 1);
  /* the windows batches in the making read: their permutations, and TSV rows */
  uint64_t per_win = (opts->shuffle_window > 0 ? 8 : 0) +
                     (opts->source == UR_SOURCE_CRITEO_TSV ? 4 + 13 * 4 + 26 * 4 : 0);
  uint64_t wins = (uint64_t)(ahead + 2) * ((uint64_t)(B / W) + 3) * (uint64_t)W * per_win;
  return slots + wins;
}

const ur_tensor *ur_batch_dense(const ur_batch *b) {
  UR__ARGS_OR(NULL, b);
  return b->dense;
}
const ur_tensor *ur_batch_labels(const ur_batch *b) {
  UR__ARGS_OR(NULL, b);
  return b->labels;
}
const ur_tensor *ur_batch_groups(const ur_batch *b) {
  UR__ARGS_OR(NULL, b);
  return b->groups;
}
const ur_kjt *ur_batch_sparse(const ur_batch *b) {
  UR__ARGS_OR(NULL, b);
  return b->sparse;
}
int64_t ur_batch_size(const ur_batch *b) {
  UR__ARGS_OR(-1, b);
  return b->size;
}
int64_t ur_batch_epoch(const ur_batch *b) {
  UR__ARGS_OR(-1, b);
  return b->epoch;
}
int64_t ur_batch_first_sample(const ur_batch *b) {
  UR__ARGS_OR(-1, b);
  return b->first;
}
int64_t ur_batch_next_sample(const ur_batch *b) {
  UR__ARGS_OR(-1, b);
  return b->next;
}
