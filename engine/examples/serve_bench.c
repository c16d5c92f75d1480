/* serve_bench.c: load on an exported model through the C serving API (BENCH.md B11): for each
 * configuration BATCHxTHREADS, THREADS client threads each send batches of BATCH samples back to
 * back for SECONDS (after a warm-up call each), taken in turn from requests stored as .npy files
 * (dense f32 [N, num_dense], ids i64 [N, num_features], one id a feature, raw: the model maps
 * them); each call is timed.  It prints a JSON line a configuration: calls, samples, the
 * measured window, samples/s and the p50 / p99 latency of a call in milliseconds.  The model is
 * opened once.  scripts/bench/serve.lua writes the requests and runs it.
 *
 *   serve_bench MODEL DENSE.npy IDS.npy 4096x1,1x1,... SECONDS [cpu|gpu] [device|managed|host]
 *               [HOT_FRACTION] [HBM_BUDGET_BYTES]
 *
 * cpu or gpu (default: the current GPU when there is one), then the tables' placement ('' or
 * absent: where it runs); HOT_FRACTION: of each managed table's rows, preferred on the GPU (the
 * rest read in place); HBM_BUDGET_BYTES: the engine's HBM budget, to serve a model larger than
 * the HBM it is given.  An argument that does not read as its kind is named, and gpu on a
 * machine without one is refused: a measurement of something else than was asked is no answer.
 * Exit status: 0 measured, 1 an engine call failed (its message on standard error), 2 usage. */
#define _POSIX_C_SOURCE 200809L /* pthread barriers under -std=c11 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "uvmrec.h"

typedef struct client {
  ur_model *m;
  const char *const *keys;
  const float *dense;
  const int64_t *ids;
  int64_t n, nd, nf, batch;
  int index;
  pthread_barrier_t *start;
  double seconds, began, ended;
  double *lat;              /* seconds per call */
  int64_t cap, calls;
  ur_status st;
  char err[512];
} client;

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* One call on samples [first, first + batch) of the requests (wrapping around). */
static ur_status call(client *c, int64_t first, ur_tensor *dense, ur_tensor *values, ur_tensor *lengths,
                      ur_tensor *scores) {
  float *d = ur_tensor_data(dense);
  int64_t *v = ur_tensor_data(values);
  for (int64_t b = 0; b < c->batch; b++) {
    int64_t s = (first + b) % c->n;
    memcpy(d + b * c->nd, c->dense + s * c->nd, sizeof(float) * (size_t)c->nd);
    for (int64_t f = 0; f < c->nf; f++) v[f * c->batch + b] = c->ids[s * c->nf + f];
  }
  ur_kjt *k = NULL;
  ur_status st = ur_kjt_new(&k, (int32_t)c->nf, c->keys, c->batch, NULL, values, lengths, NULL, NULL, 0);
  if (!st) st = ur_model_predict(c->m, dense, k, scores);
  ur_kjt_free(k);
  return st;
}

static void *run(void *p) {
  client *c = p;
  int64_t ds[2] = {c->batch, c->nd}, nv = c->batch * c->nf;
  ur_tensor *dense = NULL, *values = NULL, *lengths = NULL, *scores = NULL;
  c->st = ur_tensor_new(&dense, UR_DTYPE_F32, 2, ds, UR_PLACE_HOST, UR_LOC_CPU);
  if (!c->st) c->st = ur_tensor_new(&values, UR_DTYPE_I64, 1, &nv, UR_PLACE_HOST, UR_LOC_CPU);
  if (!c->st) c->st = ur_tensor_new(&lengths, UR_DTYPE_I32, 1, &nv, UR_PLACE_HOST, UR_LOC_CPU);
  if (!c->st) c->st = ur_tensor_new(&scores, UR_DTYPE_F32, 1, &ds[0], UR_PLACE_HOST, UR_LOC_CPU);
  if (!c->st) c->st = ur_tensor_fill(NULL, lengths, 1);
  /* Clients start at different requests, and the request a call sends is copied in first:
   * what is timed is the call alone. */
  int64_t at = (int64_t)c->index * 7919 * c->batch;
  if (!c->st) c->st = call(c, at, dense, values, lengths, scores); /* warm-up */
  /* Every client warmed up, then all measure over the same window. */
  pthread_barrier_wait(c->start);
  c->began = ur_clock_seconds();
  while (!c->st && ur_clock_seconds() < c->began + c->seconds) {
    at += c->batch;
    double t0 = ur_clock_seconds();
    c->st = call(c, at, dense, values, lengths, scores);
    double t = ur_clock_seconds() - t0;
    if (c->calls == c->cap) {
      c->cap = c->cap ? 2 * c->cap : 4096;
      double *l = realloc(c->lat, sizeof(double) * (size_t)c->cap);
      if (!l) break;
      c->lat = l;
    }
    c->lat[c->calls++] = t;
  }
  c->ended = ur_clock_seconds();
  if (c->st) snprintf(c->err, sizeof c->err, "%s", ur_last_error());
  ur_tensor_free(dense);
  ur_tensor_free(values);
  ur_tensor_free(lengths);
  ur_tensor_free(scores);
  return NULL;
}

static int usage(void) {
  fprintf(stderr, "usage: serve_bench MODEL DENSE.npy IDS.npy BATCHxTHREADS[,...] SECONDS [cpu|gpu] "
                  "[device|managed|host] [HOT_FRACTION] [HBM_BUDGET_BYTES]\n");
  return 2;
}

/* An argument as a number (whole: *whole set instead of *out), or the usage after naming it. */
static int number_arg(const char *what, const char *s, double *out, uint64_t *whole) {
  char *end;
  errno = 0;
  if (whole) *whole = strtoull(s, &end, 10);
  else *out = strtod(s, &end);
  if (errno || end == s || *end || (whole && s[0] == '-')) {
    fprintf(stderr, "serve_bench: %s is '%s'; expected %s\n", what, s, whole ? "a whole number" : "a number");
    return usage();
  }
  return 0;
}

/* One configuration: prints its line; 1 when a client failed. */
static int measure(ur_model *m, const ur_tensor *dense, const ur_tensor *ids, const char *const *keys,
                   long batch, long threads, double seconds);

int main(int argc, char **argv) {
  if (argc < 6 || argc > 10) return usage();
  double seconds;
  uint64_t budget = 0;
  if (number_arg("SECONDS", argv[5], &seconds, NULL)) return 2;
  if (!(seconds > 0)) {
    fprintf(stderr, "serve_bench: SECONDS is '%s'; expected more than 0\n", argv[5]);
    return usage();
  }
  ur_model_options o;
  ur_model_options_init(&o);
  if (argc > 6 && strcmp(argv[6], "cpu") && strcmp(argv[6], "gpu")) {
    fprintf(stderr, "serve_bench: '%s' is not cpu or gpu\n", argv[6]);
    return usage();
  }
  if (argc > 6 && !strcmp(argv[6], "cpu")) o.device = -1;
  if (argc > 6 && !strcmp(argv[6], "gpu") && o.device < 0) {
    fprintf(stderr, "serve_bench: gpu asked, but this machine has no GPU in use\n");
    return 2;
  }
  if (argc > 7 && argv[7][0]) {
    ur_place p;
    if (ur_place_parse(argv[7], &p)) {
      fprintf(stderr, "serve_bench: placement '%s'; expected device, managed or host\n", argv[7]);
      return usage();
    }
    o.table_place = p;
  }
  if (argc > 8 && number_arg("HOT_FRACTION", argv[8], &o.hot_fraction, NULL)) return 2;
  if (argc > 9 && number_arg("HBM_BUDGET_BYTES", argv[9], NULL, &budget)) return 2;
  if (argc > 9 && ur_hbm_budget_set(budget)) {
    fprintf(stderr, "serve_bench: %s\n", ur_last_error());
    return 1;
  }
  ur_model *m = NULL;
  ur_tensor *dense = NULL, *ids = NULL;
  if (ur_model_open(&m, argv[1], &o) || ur_npy_load(&dense, argv[2]) || ur_npy_load(&ids, argv[3])) {
    fprintf(stderr, "serve_bench: %s\n", ur_last_error());
    return 1;
  }
  ur_model_props info;
  ur_model_info(m, &info);
  int64_t n = ur_tensor_dim(dense, 0);
  if (ur_tensor_dtype(dense) != UR_DTYPE_F32 || ur_tensor_ndim(dense) != 2 ||
      ur_tensor_dim(dense, 1) != info.num_dense || ur_tensor_ndim(ids) != 2 ||
      ur_tensor_dim(ids, 0) != n || ur_tensor_dim(ids, 1) != info.num_features ||
      ur_tensor_dtype(ids) != UR_DTYPE_I64) {
    fprintf(stderr, "serve_bench: the requests are not dense f32 [N, %d] and ids i64 [N, %d]\n",
            (int)info.num_dense, (int)info.num_features);
    return 2;
  }
  if (n < 1) { /* the calls take their samples round the requests: modulo N */
    fprintf(stderr, "serve_bench: the requests hold 0 samples; expected at least one\n");
    return 2;
  }
  const char *keys[4096];
  for (int f = 0; f < info.num_features; f++) keys[f] = ur_model_feature_name(m, f);
  int failed = 0;
  for (const char *c = argv[4]; *c && !failed;) {
    char *end;
    long batch = strtol(c, &end, 10), threads = *end == 'x' ? strtol(end + 1, &end, 10) : 0;
    if (batch < 1 || threads < 1 || threads > 256 || (*end && *end != ',')) {
      fprintf(stderr, "serve_bench: configuration '%.*s' is not BATCHxTHREADS (BATCH 1 or more, THREADS 1 to 256)\n",
              (int)strcspn(c, ","), c);
      return usage();
    }
    failed = measure(m, dense, ids, keys, batch, threads, seconds);
    c = *end ? end + 1 : end;
  }
  ur_tensor_free(dense);
  ur_tensor_free(ids);
  ur_model_close(m);
  return failed;
}

static int measure(ur_model *m, const ur_tensor *dense, const ur_tensor *ids, const char *const *keys,
                   long batch, long threads, double seconds) {
  ur_model_props info;
  ur_model_info(m, &info);
  int64_t n = ur_tensor_dim(dense, 0);
  client cs[256];
  pthread_t tid[256];
  pthread_barrier_t start;
  pthread_barrier_init(&start, NULL, (unsigned)threads);
  for (long t = 0; t < threads; t++) {
    memset(&cs[t], 0, sizeof cs[t]);
    cs[t].m = m;
    cs[t].keys = keys;
    cs[t].dense = ur_tensor_data(dense);
    cs[t].ids = ur_tensor_data(ids);
    cs[t].n = n;
    cs[t].nd = info.num_dense;
    cs[t].nf = info.num_features;
    cs[t].batch = batch;
    cs[t].index = (int)t;
    cs[t].start = &start;
    cs[t].seconds = seconds;
  }
  for (long t = 0; t < threads; t++) pthread_create(&tid[t], NULL, run, &cs[t]);
  int64_t calls = 0;
  int failed = 0;
  double began = 0, ended = 0;
  for (long t = 0; t < threads; t++) {
    pthread_join(tid[t], NULL);
    calls += cs[t].calls;
    began = t == 0 || cs[t].began < began ? cs[t].began : began;
    ended = cs[t].ended > ended ? cs[t].ended : ended;
    if (cs[t].st) {
      fprintf(stderr, "serve_bench: client %ld: %s\n", t, cs[t].err);
      failed = 1;
    }
  }
  pthread_barrier_destroy(&start);
  double wall = ended - began;
  ur_model_info(m, &info);
  double *all = malloc(sizeof(double) * (size_t)(calls ? calls : 1));
  int64_t k = 0;
  for (long t = 0; t < threads; t++) {
    if (cs[t].lat) memcpy(all + k, cs[t].lat, sizeof(double) * (size_t)cs[t].calls);
    k += cs[t].calls;
    free(cs[t].lat);
  }
  qsort(all, (size_t)calls, sizeof(double), cmp);
  double p50 = calls ? all[(calls - 1) / 2] : 0, p99 = calls ? all[(int64_t)((double)(calls - 1) * 0.99)] : 0;
  printf("{\"batch\":%ld,\"threads\":%ld,\"calls\":%lld,\"samples\":%lld,\"seconds\":%.4f,"
         "\"samples_per_s\":%.1f,\"p50_ms\":%.4f,\"p99_ms\":%.4f,\"contexts\":%d}\n",
         batch, threads, (long long)calls, (long long)(calls * batch), wall,
         (double)(calls * batch) / wall, 1e3 * p50, 1e3 * p99, (int)info.contexts);
  free(all);
  fflush(stdout);
  return failed;
}
