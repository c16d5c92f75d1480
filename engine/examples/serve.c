/* serve.c: a host program that serves an exported model (`uvmrec export`) through the C API
 * alone, no Lua: it reads Criteo TSV lines on standard input (40 fields with the label, which it
 * ignores, or the 39 without), applies the model's input transform (log(x + 1) of the integer
 * fields, the categorical fields' hex as ids; ur_criteo_parse_line) and lets the model map the
 * ids (modulo its tables' rows, through their permutations), scores the lines in batches on
 * several threads at once, and writes one probability a line, in input order.
 *
 *   cc serve.c $(pkg-config --cflags --libs uvmrec) -lpthread -o serve
 *   ./serve model.safetensors < day_23.tsv > scores.txt
 *   ./serve [--batch N] [--threads N] [--cpu] [--placement device|managed|host]
 *           [--labels yes|no] MODEL
 *
 * A line of 39 fields is a line without its label, or a labeled one whose last field is
 * missing: the line alone cannot tell.  The input decides once: --labels yes (40 fields a line,
 * the label first), --labels no (39), or by default the first line's count (40 or 39); every
 * other line must have that count, and a line of the other is refused rather than read shifted
 * by a column.  Give --labels when the first line may be a short one.
 *
 * A line that does not parse scores "nan" (its error goes to standard error) and the others go
 * on; so does a batch the model refuses.  Exit status: 0 every line scored, 1 some failed, 2 a
 * bad command line or a model that cannot be opened or does not take Criteo lines. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "uvmrec.h"

enum { DENSE = 13, SPARSE = 26, MAX_LINE = 1 << 16 };

/* What the workers share: the input (read in turns), the output (written in turns). */
typedef struct shared {
  ur_model *model;
  const char *keys[SPARSE];
  int64_t batch;
  pthread_mutex_t lock;
  pthread_cond_t turn;
  int64_t next_batch;       /* the number the next batch read gets */
  int64_t next_write;       /* the batch whose scores go out next */
  int64_t line_no;          /* lines read */
  int eof;
  int failed;               /* written atomically (workers score outside the lock) */
  int labels;               /* 1: 40 fields, the label first; 0: 39; -1: the first line says */
  int64_t labels_line;      /* the line that said (0: --labels) */
} shared;

/* One worker's buffers for a batch. */
typedef struct worker {
  shared *sh;
  pthread_t tid;
  ur_tensor *dense, *values, *lengths, *scores;
  int32_t *ok;              /* per line: 1 parsed */
  char *line;
} worker;

static int bad_line(shared *sh, int64_t no, const char *why) {
  fprintf(stderr, "serve: line %lld: %s\n", (long long)no, why);
  __atomic_store_n(&sh->failed, 1, __ATOMIC_RELAXED);
  return 0;
}

/* Parses one line into row b of the worker's buffers; 0 when it does not parse.  Called under the
 * lock in line order, so the first line decides the input's form when --labels did not. */
static int parse(worker *w, int64_t no, char *line, int64_t b) {
  size_t len = strlen(line);
  while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
  int tabs = 0;
  for (size_t i = 0; i < len; i++) tabs += line[i] == '\t';
  shared *sh = w->sh;
  if (sh->labels < 0 && (tabs == 38 || tabs == 39)) {
    sh->labels = tabs == 39;
    sh->labels_line = no;
  }
  if (sh->labels < 0 || tabs != 38 + sh->labels) {
    /* Named: what said so, and the option that says otherwise. */
    char why[160], as[64];
    if (sh->labels_line)
      snprintf(as, sizeof as, "as line %lld; else --labels %s", (long long)sh->labels_line,
               sh->labels ? "no" : "yes");
    else snprintf(as, sizeof as, "--labels %s", sh->labels ? "yes" : "no");
    if (sh->labels < 0) snprintf(why, sizeof why, "%d fields; expected 40 (label first) or 39 (none)", tabs + 1);
    else snprintf(why, sizeof why, "%d fields; expected %d (%s, %s)", tabs + 1, 39 + sh->labels,
                  sh->labels ? "the label first" : "no label", as);
    return bad_line(sh, no, why);
  }
  const char *text = line;
  char *with_label = NULL;
  if (!sh->labels) { /* 39 fields: no label; the parser takes 40 */
    with_label = malloc(len + 3);
    if (!with_label) return bad_line(w->sh, no, "out of memory");
    memcpy(with_label, "0\t", 2);
    memcpy(with_label + 2, line, len + 1);
    text = with_label;
    len += 2;
  }
  int32_t label;
  uint32_t cats[SPARSE];
  float *dense = (float *)ur_tensor_data(w->dense) + b * DENSE;
  ur_status st = ur_criteo_parse_line(text, len, 0, &label, dense, cats, NULL);
  free(with_label);
  if (st) return bad_line(sh, no, ur_last_error());
  /* Key-major: feature k's ids for the whole batch are one run. */
  int64_t *values = ur_tensor_data(w->values);
  for (int k = 0; k < SPARSE; k++) values[(int64_t)k * sh->batch + b] = cats[k];
  return 1;
}

/* Reads the next batch (under the lock): *n lines, their batch number, and their first line. */
static int64_t read_batch(worker *w, int64_t *n, int64_t *first) {
  shared *sh = w->sh;
  pthread_mutex_lock(&sh->lock);
  int64_t no = sh->next_batch, b = 0;
  *first = sh->line_no + 1;
  while (!sh->eof && b < sh->batch) {
    if (!fgets(w->line, MAX_LINE, stdin)) {
      sh->eof = 1;
      break;
    }
    sh->line_no++;
    size_t len = strlen(w->line);
    if (len == MAX_LINE - 1 && w->line[len - 1] != '\n') {
      /* The rest of the line is still on the input: drop it, so that one line scores once. */
      int ch;
      while ((ch = getchar()) != EOF && ch != '\n') continue;
      w->ok[b] = bad_line(sh, sh->line_no, "longer than 65535 bytes");
    } else {
      w->ok[b] = parse(w, sh->line_no, w->line, b);
    }
    b++;
  }
  if (b) sh->next_batch++;
  pthread_mutex_unlock(&sh->lock);
  *n = b;
  return no;
}

/* Scores n lines: the parsed ones in one call (bad lines are given id 0 and dense 0, and their
 * scores dropped).  Returns 0 when the model refused the batch. */
static int score(worker *w, int64_t n) {
  shared *sh = w->sh;
  int64_t *values = ur_tensor_data(w->values);
  float *dense = ur_tensor_data(w->dense);
  int32_t *lengths = ur_tensor_data(w->lengths);
  for (int64_t b = 0; b < n; b++)
    if (!w->ok[b]) {
      memset(dense + b * DENSE, 0, sizeof(float) * DENSE);
      for (int k = 0; k < SPARSE; k++) values[(int64_t)k * sh->batch + b] = 0;
    }
  /* The first n samples of each feature's run, packed key-major for n samples. */
  if (n < sh->batch)
    for (int k = 1; k < SPARSE; k++) memmove(values + k * n, values + (int64_t)k * sh->batch, sizeof(int64_t) * n);
  for (int64_t i = 0; i < n * SPARSE; i++) lengths[i] = 1;
  ur_tensor *d = NULL, *v = NULL, *l = NULL, *s = NULL;
  ur_kjt *kjt = NULL;
  ur_status st = ur_tensor_view(w->dense, &d, 0, n);
  if (!st) st = ur_tensor_view(w->values, &v, 0, n * SPARSE);
  if (!st) st = ur_tensor_view(w->lengths, &l, 0, n * SPARSE);
  if (!st) st = ur_tensor_view(w->scores, &s, 0, n);
  if (!st) st = ur_kjt_new(&kjt, SPARSE, sh->keys, n, NULL, v, l, NULL, NULL, 1);
  if (!st) st = ur_model_predict(sh->model, d, kjt, s);
  if (st) {
    fprintf(stderr, "serve: a batch of %lld lines failed: %s\n", (long long)n, ur_last_error());
    __atomic_store_n(&sh->failed, 1, __ATOMIC_RELAXED); /* outside the lock: workers score at once */
  }
  ur_kjt_free(kjt);
  ur_tensor_free(d);
  ur_tensor_free(v);
  ur_tensor_free(l);
  ur_tensor_free(s);
  return st == UR_STATUS_OK;
}

static void *work(void *p) {
  worker *w = p;
  shared *sh = w->sh;
  for (;;) {
    int64_t n, first;
    int64_t no = read_batch(w, &n, &first);
    if (!n) break;
    int ok = score(w, n);
    const float *scores = ur_tensor_data(w->scores);
    pthread_mutex_lock(&sh->lock);
    while (sh->next_write != no) pthread_cond_wait(&sh->turn, &sh->lock);
    for (int64_t b = 0; b < n; b++) {
      if (ok && w->ok[b]) printf("%.9g\n", (double)scores[b]);
      else printf("nan\n");
    }
    sh->next_write++;
    pthread_cond_broadcast(&sh->turn);
    pthread_mutex_unlock(&sh->lock);
  }
  return NULL;
}

static int usage(void) {
  fprintf(stderr, "usage: serve [--batch N] [--threads N] [--cpu] [--placement device|managed|host] "
                  "[--labels yes|no] MODEL < lines\n  --batch: lines scored together, 1 to 1048576 "
                  "(512); --threads: callers, 1 to 256 (2); --labels: whether lines carry the label "
                  "first (40 fields) or not (39; default: as the first line)\n");
  return 2;
}

/* A whole number from lo to hi, or the usage after naming the flag and its value. */
static int count_arg(const char *flag, const char *s, long lo, long hi, long *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) {
    fprintf(stderr, "serve: %s is '%s'; expected a whole number from %ld to %ld\n", flag, s, lo, hi);
    return usage();
  }
  *out = v;
  return 0;
}

int main(int argc, char **argv) {
  const char *path = NULL;
  long batch = 512, threads = 2;
  int labels = -1;
  ur_model_options opts;
  ur_model_options_init(&opts);
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--batch") && i + 1 < argc) {
      if (count_arg("--batch", argv[++i], 1, 1 << 20, &batch)) return 2;
    } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
      if (count_arg("--threads", argv[++i], 1, 256, &threads)) return 2;
    }
    else if (!strcmp(argv[i], "--cpu")) opts.device = -1;
    else if (!strcmp(argv[i], "--placement") && i + 1 < argc) {
      ur_place p;
      if (ur_place_parse(argv[++i], &p)) {
        fprintf(stderr, "serve: --placement is '%s'; expected device, managed or host\n", argv[i]);
        return usage();
      }
      opts.table_place = p;
    } else if (!strcmp(argv[i], "--labels") && i + 1 < argc) {
      const char *v = argv[++i];
      if (strcmp(v, "yes") && strcmp(v, "no")) {
        fprintf(stderr, "serve: --labels is '%s'; expected yes (40 fields, the label first) or no (39)\n", v);
        return usage();
      }
      labels = !strcmp(v, "yes");
    } else if (argv[i][0] == '-') {
      int takes = !strcmp(argv[i], "--batch") || !strcmp(argv[i], "--threads") ||
                  !strcmp(argv[i], "--placement") || !strcmp(argv[i], "--labels");
      if (takes) fprintf(stderr, "serve: %s needs a value\n", argv[i]);
      else fprintf(stderr, "serve: unknown option '%s'\n", argv[i]);
      return usage();
    } else if (path) {
      fprintf(stderr, "serve: one model file; '%s' and '%s' given\n", path, argv[i]);
      return usage();
    } else path = argv[i];
  }
  if (!path) {
    fprintf(stderr, "serve: no model file given\n");
    return usage();
  }

  shared sh;
  memset(&sh, 0, sizeof sh);
  sh.batch = batch;
  sh.labels = labels;
  if (ur_model_open(&sh.model, path, &opts)) {
    fprintf(stderr, "serve: %s\n", ur_last_error());
    return 2;
  }
  ur_model_props info;
  ur_model_info(sh.model, &info);
  if (strcmp(info.input, "criteo") || info.num_dense != DENSE || info.num_features != SPARSE) {
    fprintf(stderr, "serve: %s takes %s input with %d dense and %d sparse features; serve reads "
                    "Criteo lines (13 and 26)\n",
            path, info.input, (int)info.num_dense, (int)info.num_features);
    ur_model_close(sh.model);
    return 2;
  }
  /* The model's feature k is the line's categorical column k: Criteo models name them C1..C26. */
  for (int k = 0; k < SPARSE; k++) sh.keys[k] = ur_model_feature_name(sh.model, k);
  pthread_mutex_init(&sh.lock, NULL);
  pthread_cond_init(&sh.turn, NULL);

  worker *ws = calloc((size_t)threads, sizeof *ws);
  int ok = ws != NULL;
  for (long t = 0; t < threads && ok; t++) {
    worker *w = &ws[t];
    int64_t ds[2] = {batch, DENSE}, n = batch * SPARSE;
    w->sh = &sh;
    w->ok = malloc(sizeof(int32_t) * (size_t)batch);
    w->line = malloc(MAX_LINE);
    ok = w->ok && w->line && !ur_tensor_new(&w->dense, UR_DTYPE_F32, 2, ds, UR_PLACE_HOST, UR_LOC_CPU) &&
         !ur_tensor_new(&w->values, UR_DTYPE_I64, 1, &n, UR_PLACE_HOST, UR_LOC_CPU) &&
         !ur_tensor_new(&w->lengths, UR_DTYPE_I32, 1, &n, UR_PLACE_HOST, UR_LOC_CPU) &&
         !ur_tensor_new(&w->scores, UR_DTYPE_F32, 1, &ds[0], UR_PLACE_HOST, UR_LOC_CPU);
  }
  long started = 0;
  if (!ok) fprintf(stderr, "serve: cannot make the buffers: %s\n", ur_last_error());
  for (; ok && started < threads; started++)
    if (pthread_create(&ws[started].tid, NULL, work, &ws[started])) break;
  for (long t = 0; t < started; t++) pthread_join(ws[t].tid, NULL);
  if (ok && !started) fprintf(stderr, "serve: no thread could be started\n");
  for (long t = 0; ws && t < threads; t++) {
    ur_tensor_free(ws[t].dense);
    ur_tensor_free(ws[t].values);
    ur_tensor_free(ws[t].lengths);
    ur_tensor_free(ws[t].scores);
    free(ws[t].ok);
    free(ws[t].line);
  }
  free(ws);
  ur_model_close(sh.model);
  fflush(stdout);
  return !ok || !started || sh.failed ? 1 : 0;
}
