/* model_oom.c: a served model's host allocations refused by their size (engine/src/serve/model.c):
 * the engine linked with posix_memalign wrapped (the CPU backend's allocator, core/backend_cpu.c),
 * so that while a limit is set every allocation of more bytes fails.  spec/serve_spec.lua reads
 * the lines.
 *   model_oom MODEL open LIMIT  opens MODEL under LIMIT: "open: STATUS MESSAGE"
 *   model_oom MODEL grow B      a model's context warmed at B samples, then asked for B + 1 under
 *                               the largest allocation a fresh context's B + 1 made ("fresh N"),
 *                               then B + 2 (over it), then B + 1 and B again:
 *                               "B+1: STATUS MESSAGE", ... and "refused K".
 *   model_oom MODEL sweep       opens MODEL with the k-th host allocation the engine makes in
 *                               ur_model_open failing (malloc, calloc, strdup or posix_memalign;
 *                               not jansson's, a shared library), for each k of the N an open
 *                               makes, then likewise a fresh model's first ur_model_predict of one
 *                               sample: "open k: STATUS MESSAGE", "predict k: STATUS MESSAGE" for
 *                               each k that fails its call, and "open: N allocations, F failed",
 *                               "predict: N allocations, F failed".
 *   model_oom FILE save         saves a host, a managed (through the staging buffer) and an i64
 *                               tensor with two metadata entries to FILE (ur_safetensors_save)
 *                               with its k-th host allocation failing, for each k of the N a save
 *                               makes: "save k: STATUS MESSAGE" for each that fails, "save k:
 *                               FILE published" for one that left FILE, and "save: N
 *                               allocations, F failed". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "uvmrec.h"

int __real_posix_memalign(void **p, size_t align, size_t n);
void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
char *__real_strdup(const char *s);

static size_t limit;   /* 0: none */
static size_t largest; /* of the allocations made since reset */
static long long refused;
static int counting;            /* sweep: allocations counted, */
static long long fail_at, made; /* the one to fail (0: none) and those made so far */

/* Whether this allocation is the one the sweep fails. */
static int swept(void) {
  if (!counting || ++made != fail_at) return 0;
  refused++;
  return 1;
}

int __wrap_posix_memalign(void **p, size_t align, size_t n) {
  if (limit && n > limit) {
    refused++;
    return 12; /* ENOMEM */
  }
  if (swept()) return 12;
  if (n > largest) largest = n;
  return __real_posix_memalign(p, align, n);
}

void *__wrap_malloc(size_t n) { return swept() ? NULL : __real_malloc(n); }
void *__wrap_calloc(size_t n, size_t size) { return swept() ? NULL : __real_calloc(n, size); }
char *__wrap_strdup(const char *s) { return swept() ? NULL : __real_strdup(s); }

static ur_model *open_model(const char *path) {
  ur_model_options o;
  ur_model_options_init(&o);
  o.device = -1;
  o.max_callers = 1; /* one context, the one warmed */
  ur_model *m = NULL;
  if (ur_model_open(&m, path, &o)) {
    printf("open: %s\n", ur_last_error());
    exit(1);
  }
  return m;
}

/* A request of b samples, one id a feature (row 1: every table has one), made before any limit. */
typedef struct request {
  ur_tensor *dense, *scores;
  ur_kjt *kjt;
} request;

static void make(ur_model *m, int64_t b, request *r) {
  ur_model_props p;
  ur_model_info(m, &p);
  int64_t ds[2] = {b, p.num_dense}, n = b * p.num_features;
  const char *keys[4096];
  ur_tensor *v = NULL, *l = NULL;
  for (int32_t k = 0; k < p.num_features; k++) keys[k] = ur_model_feature_name(m, k);
  if (ur_tensor_new(&r->dense, UR_DTYPE_F32, 2, ds, UR_PLACE_HOST, UR_LOC_CPU) ||
      ur_tensor_new(&r->scores, UR_DTYPE_F32, 1, &b, UR_PLACE_HOST, UR_LOC_CPU) ||
      ur_tensor_new(&v, UR_DTYPE_I64, 1, &n, UR_PLACE_HOST, UR_LOC_CPU) ||
      ur_tensor_new(&l, UR_DTYPE_I32, 1, &n, UR_PLACE_HOST, UR_LOC_CPU)) {
    printf("request: %s\n", ur_last_error());
    exit(1);
  }
  float *d = ur_tensor_data(r->dense);
  for (int64_t i = 0; i < b * p.num_dense; i++) d[i] = 0.5f;
  int64_t *ids = ur_tensor_data(v);
  int32_t *len = ur_tensor_data(l);
  for (int64_t i = 0; i < n; i++) {
    ids[i] = 1;
    len[i] = 1;
  }
  if (ur_kjt_new(&r->kjt, p.num_features, keys, b, NULL, v, l, NULL, NULL, 1)) {
    printf("request: %s\n", ur_last_error());
    exit(1);
  }
  ur_tensor_free(v);
  ur_tensor_free(l);
}

static void drop(request *r) {
  ur_tensor_free(r->dense);
  ur_tensor_free(r->scores);
  ur_kjt_free(r->kjt);
}

static void ask(ur_model *m, const char *what, const request *r) {
  char before[512];
  snprintf(before, sizeof before, "%s", ur_last_error());
  ur_status st = ur_model_predict(m, r->dense, r->kjt, r->scores);
  /* a call that succeeds leaves no message of a failure it recovered from (a message an earlier
   * call left may stay) */
  int left = !st && *ur_last_error() && strcmp(before, ur_last_error());
  printf("%s: %d %s%s\n", what, (int)st, st ? ur_last_error() : "ok", left ? " (a message left)" : "");
}

/* One call (open, or a fresh model's predict) with its k-th allocation failing (k = 0: none):
 * its status; *n the allocations it made. */
static ur_status one_call(const char *path, const request *r, long long k, long long *n) {
  ur_model_options o;
  ur_model_options_init(&o);
  o.device = -1;
  ur_model *m = r ? open_model(path) : NULL;
  made = 0;
  fail_at = k;
  counting = 1;
  ur_status st = r ? ur_model_predict(m, r->dense, r->kjt, r->scores) : ur_model_open(&m, path, &o);
  counting = 0;
  *n = made;
  ur_model_close(m);
  return st;
}

/* Fails each allocation of ur_model_open in turn, then each of a fresh model's first predict. */
static void sweep(const char *path) {
  ur_model_close(open_model(path)); /* the library's one-time allocations, made unlimited */
  request r;
  ur_model *any = open_model(path);
  make(any, 1, &r);
  ur_model_close(any);
  for (int pass = 0; pass < 2; pass++) {
    const char *what = pass ? "predict" : "open";
    const request *req = pass ? &r : NULL;
    long long n, failed = 0, ignored;
    if (one_call(path, req, 0, &n)) {
      printf("%s: %s\n", what, ur_last_error());
      exit(1);
    }
    for (long long k = 1; k <= n; k++) {
      ur_status st = one_call(path, req, k, &ignored);
      if (st) printf("%s %lld: %d %s\n", what, k, (int)st, ur_last_error());
      failed += st != UR_STATUS_OK;
    }
    printf("%s: %lld allocations, %lld failed\n", what, n, failed);
  }
  drop(&r);
}

/* Fails each allocation of a save in turn (ur_safetensors_save: the writer, its header, the
 * staging buffer of a managed tensor). */
static void save_sweep(const char *path) {
  ur_tensor *t[3];
  int64_t a[2] = {4, 3}, b[2] = {64, 8}, c = 5;
  if (ur_tensor_new(&t[0], UR_DTYPE_F32, 2, a, UR_PLACE_HOST, UR_LOC_CPU) ||
      ur_tensor_new(&t[1], UR_DTYPE_F32, 2, b, UR_PLACE_MANAGED, UR_LOC_CPU) ||
      ur_tensor_new(&t[2], UR_DTYPE_I64, 1, &c, UR_PLACE_HOST, UR_LOC_CPU)) {
    printf("tensors: %s\n", ur_last_error());
    exit(1);
  }
  for (int i = 0; i < 3; i++) memset(ur_tensor_data(t[i]), 0, ur_tensor_nbytes(t[i]));
  const char *names[3] = {"w", "table", "ids"}, *keys[2] = {"note", "uvmrec.step"},
             *values[2] = {"x", "3"};
  const ur_tensor *const *ts = (const ur_tensor *const *)t;
  long long n = 0, failed = 0;
  /* the library's one-time allocations made unlimited, then the allocations of one save */
  for (int pass = 0; pass < 2; pass++) {
    made = 0;
    counting = pass;
    ur_status st = ur_safetensors_save(NULL, path, 3, names, ts, 2, keys, values, 1 << 20);
    counting = 0;
    if (st) {
      printf("save: %s\n", ur_last_error());
      exit(1);
    }
    n = made;
    unlink(path);
  }
  for (long long k = 1; k <= n; k++) {
    made = 0;
    fail_at = k;
    counting = 1;
    ur_status st = ur_safetensors_save(NULL, path, 3, names, ts, 2, keys, values, 1 << 20);
    counting = 0;
    if (st) printf("save %lld: %d %s\n", k, (int)st, ur_last_error());
    if (!access(path, F_OK)) printf("save %lld: %s published\n", k, path);
    unlink(path);
    failed += st != UR_STATUS_OK;
  }
  printf("save: %lld allocations, %lld failed\n", n, failed);
  for (int i = 0; i < 3; i++) ur_tensor_free(t[i]);
}

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[2], "sweep")) {
    sweep(argv[1]);
    return 0;
  }
  if (argc == 3 && !strcmp(argv[2], "save")) {
    save_sweep(argv[1]);
    return 0;
  }
  if (argc != 4) {
    fprintf(stderr, "usage: model_oom MODEL open LIMIT | grow B | sweep, or model_oom FILE save\n");
    return 2;
  }
  if (!strcmp(argv[2], "open")) {
    ur_model_close(open_model(argv[1])); /* the library's one-time allocations, made unlimited */
    ur_model_options o;
    ur_model_options_init(&o);
    o.device = -1;
    ur_model *m = NULL;
    limit = (size_t)atoll(argv[3]);
    ur_status st = ur_model_open(&m, argv[1], &o);
    limit = 0;
    printf("open: %d %s\n", (int)st, st ? ur_last_error() : "ok");
    ur_model_close(m);
    return 0;
  }
  int64_t b = atoll(argv[3]);
  ur_model *fresh = open_model(argv[1]), *m = open_model(argv[1]);
  request r0, r1, r2;
  make(m, b, &r0);
  make(m, b + 1, &r1);
  make(m, b + 2, &r2);
  largest = 0;
  ask(fresh, "fresh B+1", &r1);
  size_t fits = largest;
  printf("fresh %zu\n", fits);
  ask(m, "B", &r0);
  limit = fits;
  ask(m, "B+1", &r1);
  ask(m, "B+2", &r2);
  ask(m, "B+1 again", &r1);
  ask(m, "B again", &r0);
  limit = 0;
  printf("refused %lld\n", refused);
  drop(&r0);
  drop(&r1);
  drop(&r2);
  ur_model_close(fresh);
  ur_model_close(m);
  return 0;
}
