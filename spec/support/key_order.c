/* key_order.c: how many name comparisons a model's predict spends matching a request's keys to
 * its features (engine/src/data/kjt.c ur__kjt_key_order, which check_request calls), counted by
 * linking the engine with strcmp wrapped (-Wl,--wrap=strcmp); spec/serve/key_order_spec.lua
 * reads its lines.  A KJT of n keys in the features' order, shuffled, and shuffled with one
 * name replaced: "CASE n comparisons ok" or "CASE ... FAIL why".
 *   key_order [n]   (default 2000) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "uvmrec.h"
#include "data/kjt.h"

int __real_strcmp(const char *a, const char *b);
static long long calls;
int __wrap_strcmp(const char *a, const char *b) {
  calls++;
  return __real_strcmp(a, b);
}

/* A KJT of keys[0..n) of one sample, one id each. */
static ur_kjt *make(int32_t n, char **keys) {
  int64_t nv = n;
  ur_tensor *values, *lengths;
  ur_kjt *k = NULL;
  if (ur_tensor_new(&values, UR_DTYPE_I64, 1, &nv, UR_PLACE_HOST, -1) ||
      ur_tensor_new(&lengths, UR_DTYPE_I32, 1, &nv, UR_PLACE_HOST, -1))
    return NULL;
  int64_t *v = ur_tensor_data(values);
  int32_t *l = ur_tensor_data(lengths);
  for (int32_t i = 0; i < n; i++) v[i] = i, l[i] = 1;
  if (ur_kjt_new(&k, n, (const char *const *)keys, 1, NULL, values, lengths, NULL, NULL, 1))
    fprintf(stderr, "kjt: %s\n", ur_last_error());
  ur_tensor_free(values);
  ur_tensor_free(lengths);
  return k;
}

/* Matches names against k, whose key at position j is names[pos_of[j]] (or absent where
 * pos_of[j] < 0, expecting missing `want_missing`). */
static int run(const char *what, int32_t n, char **names, char **keys, const int32_t *name_at,
               int32_t want_missing) {
  ur_kjt *k = make(n, keys);
  if (!k) return 1;
  int32_t *order = malloc(sizeof *order * (size_t)n), missing = -2;
  calls = 0;
  ur_status st = ur__kjt_key_order(k, (const char *const *)names, n, order, &missing);
  long long got = calls;
  const char *bad = st ? "failed" : missing != want_missing ? "missing differs" : NULL;
  for (int32_t i = 0; !bad && i < (want_missing >= 0 ? want_missing : n); i++)
    if (order[i] < 0 || order[i] >= n || name_at[order[i]] != i) bad = "order differs";
  if (bad) printf("%s %d %lld FAIL %s (missing %d, want %d)\n", what, (int)n, got, bad, (int)missing,
                  (int)want_missing);
  else printf("%s %d %lld ok\n", what, (int)n, got);
  free(order);
  ur_kjt_free(k);
  return bad != NULL;
}

int main(int argc, char **argv) {
  int32_t n = argc > 1 ? atoi(argv[1]) : 2000;
  if (n < 2) return 2;
  char **names = calloc((size_t)n, sizeof *names), **keys = calloc((size_t)n, sizeof *keys);
  int32_t *name_at = calloc((size_t)n, sizeof *name_at);
  for (int32_t i = 0; i < n; i++) {
    names[i] = malloc(16);
    snprintf(names[i], 16, "C%d", (int)i + 1);
    keys[i] = names[i];
    name_at[i] = i;
  }
  int fails = run("in_order", n, names, keys, name_at, -1);
  uint64_t s = 0x2545f4914f6cdd1dull;
  for (int32_t i = n - 1; i > 0; i--) { /* Fisher-Yates, a fixed LCG */
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    int32_t j = (int32_t)((s >> 33) % (uint64_t)(i + 1));
    char *t = keys[i];
    keys[i] = keys[j];
    keys[j] = t;
    int32_t a = name_at[i];
    name_at[i] = name_at[j];
    name_at[j] = a;
  }
  fails += run("shuffled", n, names, keys, name_at, -1);
  /* the key of feature n/2 renamed: the first name missing is that feature's */
  int32_t j = 0;
  while (name_at[j] != n / 2) j++;
  char other[] = "not_a_feature";
  keys[j] = other;
  fails += run("missing", n, names, keys, name_at, n / 2);
  return fails ? 1 : 0;
}
