/* model_threads.c: the serving API under concurrent callers (spec/serve_spec.lua runs it on an
 * exported model): requests of many batch sizes are scored by one thread first, then by
 * THREADS threads at once, each in its own order, several rounds, and every score must be the
 * single caller's bit for bit.  Meanwhile bad requests (a missing feature, dense of the wrong
 * width, an id outside its table under bounds fatal) must fail alone, naming what was wrong,
 * and the model must go on serving.  Exit 0 when all hold.
 * Usage: model_threads MODEL [THREADS] [MAX_CALLERS] */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "uvmrec.h"

enum { REQUESTS = 24, ROUNDS = 3, MAX_BATCH = 300 };

typedef struct request {
  int64_t batch;
  ur_tensor *dense, *values, *lengths, *scores;
  ur_kjt *kjt;
  float *want;              /* the single caller's scores */
} request;

typedef struct job {
  ur_model *m;
  request *reqs;
  int index;
  int mismatches, errors, bad_ok;
  ur_kjt *short_kjt;        /* one feature short */
  ur_tensor *wide_dense;    /* a dense column too many */
  ur_kjt *bad_id_kjt;       /* an id outside its table */
  char first_error[512];
} job;

static uint64_t rng = 88172645463325252ull;
static uint64_t next(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

static int fail(const char *what) {
  fprintf(stderr, "model_threads: %s: %s\n", what, ur_last_error());
  return 1;
}

/* A request of b samples: dense in [0, 5), one id a feature, within the feature's table (or any
 * 32-bit id when the table takes ids modulo its rows); bad_id puts row count in sample 0's
 * first id. */
static ur_status make_request(ur_model *m, int64_t b, int nkeys, int bad_id, int64_t ndense,
                              request *r) {
  ur_model_props info;
  ur_model_info(m, &info);
  ur_qtbe *q = ur_model_tables(m);
  const char *keys[4096];
  int64_t ds[2] = {b, ndense}, n = b * nkeys;
  memset(r, 0, sizeof *r);
  r->batch = b;
  ur_status st = ur_tensor_new(&r->dense, UR_DTYPE_F32, 2, ds, UR_PLACE_HOST, UR_LOC_CPU);
  if (!st) st = ur_tensor_new(&r->values, UR_DTYPE_I64, 1, &n, UR_PLACE_HOST, UR_LOC_CPU);
  if (!st) st = ur_tensor_new(&r->lengths, UR_DTYPE_I32, 1, &n, UR_PLACE_HOST, UR_LOC_CPU);
  if (!st) st = ur_tensor_new(&r->scores, UR_DTYPE_F32, 1, &b, UR_PLACE_HOST, UR_LOC_CPU);
  if (st) return st;
  float *d = ur_tensor_data(r->dense);
  for (int64_t i = 0; i < b * ndense; i++) d[i] = (float)(next() % 5000) / 1000.0f;
  int64_t *v = ur_tensor_data(r->values);
  int32_t *l = ur_tensor_data(r->lengths);
  for (int k = 0; k < nkeys; k++) {
    keys[k] = ur_model_feature_name(m, k);
    ur_tensor *t = NULL;
    if ((st = ur_qtbe_table(q, ur_qtbe_feature_table(q, k), &t))) return st;
    int64_t rows = ur_tensor_dim(t, 0);
    ur_tensor_free(t);
    int64_t mod = ur_model_table_modulo(m, k);
    for (int64_t s = 0; s < b; s++) {
      v[k * b + s] = mod > 0 ? (int64_t)(next() & 0xffffffffu) : (int64_t)(next() % (uint64_t)rows);
      l[k * b + s] = 1;
    }
    if (bad_id && k == 0) v[0] = mod > 0 ? -1 : rows;
  }
  return ur_kjt_new(&r->kjt, nkeys, keys, b, NULL, r->values, r->lengths, NULL, NULL, 1);
}

static void free_request(request *r) {
  ur_kjt_free(r->kjt);
  ur_tensor_free(r->dense);
  ur_tensor_free(r->values);
  ur_tensor_free(r->lengths);
  ur_tensor_free(r->scores);
  free(r->want);
}

static void note(job *j, const char *what) {
  if (!j->first_error[0]) snprintf(j->first_error, sizeof j->first_error, "%s: %s", what, ur_last_error());
}

/* Each thread keeps its own scores tensor per request: requests are shared read-only. */
static void *run(void *p) {
  job *j = p;
  int64_t b = MAX_BATCH;
  ur_tensor *scores = NULL;
  if (ur_tensor_new(&scores, UR_DTYPE_F32, 1, &b, UR_PLACE_HOST, UR_LOC_CPU)) {
    note(j, "scores");
    j->errors++;
    return NULL;
  }
  for (int round = 0; round < ROUNDS; round++)
    for (int k = 0; k < REQUESTS; k++) {
      request *r = &j->reqs[(k * 7 + j->index * 5 + round) % REQUESTS];
      ur_tensor *s = NULL;
      if (ur_tensor_view(scores, &s, 0, r->batch) || ur_model_predict(j->m, r->dense, r->kjt, s)) {
        note(j, "predict");
        j->errors++;
      } else if (memcmp(ur_tensor_data(s), r->want, sizeof(float) * (size_t)r->batch)) {
        j->mismatches++;
      }
      ur_tensor_free(s);
      /* Now and then a bad request, which must fail alone. */
      if ((k + j->index) % 8 == 0) {
        ur_tensor *s1 = NULL;
        ur_tensor_view(scores, &s1, 0, 4);
        const request *bad = &j->reqs[REQUESTS + (k / 8 + j->index) % 3];
        ur_status st = ur_model_predict(j->m, bad->dense, bad->kjt, s1);
        const char *want = bad->kjt == j->short_kjt ? "sparse features"
                           : bad->dense == j->wide_dense ? "dense is f32"
                                                         : "has no row";
        if (st && strstr(ur_last_error(), want)) j->bad_ok++;
        else {
          note(j, "a bad request");
          j->errors++;
        }
        ur_tensor_free(s1);
      }
    }
  ur_tensor_free(scores);
  return NULL;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: model_threads MODEL [THREADS] [MAX_CALLERS]\n");
    return 2;
  }
  int threads = argc > 2 ? atoi(argv[2]) : 8;
  ur_model_options o;
  ur_model_options_init(&o);
  o.device = -1;
  o.max_callers = argc > 3 ? atoi(argv[3]) : 0;
  ur_model *m;
  if (ur_model_open(&m, argv[1], &o)) return fail("open");
  ur_model_props info;
  ur_model_info(m, &info);
  request reqs[REQUESTS + 3];
  for (int k = 0; k < REQUESTS; k++) {
    int64_t b = k == 0 ? 1 : k == 1 ? MAX_BATCH : 1 + (int64_t)(next() % MAX_BATCH);
    if (make_request(m, b, info.num_features, 0, info.num_dense, &reqs[k])) return fail("request");
    if (ur_model_predict(m, reqs[k].dense, reqs[k].kjt, reqs[k].scores)) return fail("single caller");
    reqs[k].want = malloc(sizeof(float) * (size_t)b);
    memcpy(reqs[k].want, ur_tensor_data(reqs[k].scores), sizeof(float) * (size_t)b);
  }
  /* The bad ones: a feature short, a dense column too many, an id outside its table. */
  if (make_request(m, 4, info.num_features - 1, 0, info.num_dense, &reqs[REQUESTS]) ||
      make_request(m, 4, info.num_features, 0, info.num_dense + 1, &reqs[REQUESTS + 1]) ||
      make_request(m, 4, info.num_features, 1, info.num_dense, &reqs[REQUESTS + 2]))
    return fail("bad request");
  job jobs[256];
  pthread_t tid[256];
  if (threads < 1 || threads > 256) threads = 8;
  for (int t = 0; t < threads; t++) {
    memset(&jobs[t], 0, sizeof jobs[t]);
    jobs[t].m = m;
    jobs[t].reqs = reqs;
    jobs[t].index = t;
    jobs[t].short_kjt = reqs[REQUESTS].kjt;
    jobs[t].wide_dense = reqs[REQUESTS + 1].dense;
    jobs[t].bad_id_kjt = reqs[REQUESTS + 2].kjt;
    if (pthread_create(&tid[t], NULL, run, &jobs[t])) return fail("pthread_create");
  }
  int mismatches = 0, errors = 0, bad_ok = 0;
  for (int t = 0; t < threads; t++) {
    pthread_join(tid[t], NULL);
    mismatches += jobs[t].mismatches;
    errors += jobs[t].errors;
    bad_ok += jobs[t].bad_ok;
    if (jobs[t].first_error[0]) fprintf(stderr, "model_threads: thread %d: %s\n", t, jobs[t].first_error);
  }
  /* Still serving, and as before. */
  for (int k = 0; k < REQUESTS; k++) {
    if (ur_model_predict(m, reqs[k].dense, reqs[k].kjt, reqs[k].scores)) return fail("after");
    if (memcmp(ur_tensor_data(reqs[k].scores), reqs[k].want, sizeof(float) * (size_t)reqs[k].batch)) mismatches++;
  }
  ur_model_info(m, &info);
  printf("model_threads: %d threads, %lld calls (%lld failed, as asked: %d), %d contexts, %d mismatches, "
         "%d errors\n",
         threads, (long long)info.calls, (long long)info.failed, bad_ok, (int)info.contexts, mismatches,
         errors);
  for (int k = 0; k < REQUESTS + 3; k++) free_request(&reqs[k]);
  ur_model_close(m);
  if (mismatches || errors || !bad_ok) return 1;
  printf("model_threads: ok\n");
  return 0;
}
