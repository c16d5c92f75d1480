/* kjt.c: keyed jagged tensors: construction with checked lengths, offsets, permute, split,
 * concat, dedup into a variable batch per key (VBE), expand back, and placement moves.
 * A KJT takes its backend once, when it is made or placed, from its values' placement
 * (ur__backend_for), and its work goes through that backend's kjt table (kjt_cpu.c, the
 * reference; kernels/kjt.cu), whose results stay in the KJT's memory.  Here are the checks,
 * the sizes, the allocations and the messages, one path for every backend: only sizes (key
 * spans, counts, the first bad positions) come back to the host. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "data/kjt.h"

struct ur_kjt {
  const ur_backend *be; /* from the values' placement, when made */
  int32_t nkeys;
  char **keys;
  int64_t stride;
  int64_t *spk;        /* bags per key (stride for every key unless VBE) */
  int64_t *bag0;       /* nkeys + 1: first bag of each key */
  int64_t *val0;       /* nkeys + 1: first value of each key */
  int variable;
  /* 1: known sound (lengths >= 0, offsets their running sum within the values, key spans adding
   * up to them, inverse indices within their keys' strides), so the ops that read bag by bag
   * through the offsets check nothing.  Set when made with the checks (or by a scan that found
   * nothing wrong), by ur_kjt_validate, and by ops whose results are sound by construction from
   * sound inputs.  Read and written with relaxed atomics (is_checked, set_checked): validate
   * and the ops that check take a const KJT, which other threads may be reading. */
  int checked;
  ur_tensor *values, *lengths, *offsets, *weights, *inverse;
};

static int is_checked(const ur_kjt *k) { return __atomic_load_n(&k->checked, __ATOMIC_RELAXED); }

/* The KJT was allocated writable (kjt_make): only the const of the caller's view is cast away. */
static void set_checked(const ur_kjt *k, int v) {
  __atomic_store_n(&((ur_kjt *)k)->checked, v, __ATOMIC_RELAXED);
}

static ur_status new_1d(ur_tensor **out, ur_dtype dt, int64_t n, ur_place place, int32_t dev) {
  return ur_tensor_new(out, dt, 1, &n, place, dev);
}

static ur_status new_like(ur_tensor **out, ur_dtype dt, int64_t n, const ur_tensor *like) {
  return new_1d(out, dt, n, ur_tensor_place(like), ur_tensor_device(like));
}

static void *dp(const ur_tensor *t) { return t ? ur_tensor_data(t) : NULL; }

/* Backend b about to work on t's memory: the memory ready for it, t's GPU current. */
static ur_status enter(const ur_backend *b, const ur_tensor *t, int32_t *prev) {
  ur_status st = ur__tensor_ready(b, t);
  return st ? st : ur__device_enter(b, ur_tensor_device(t), prev);
}

static ur_status leave(const ur_backend *b, const ur_tensor *t, int32_t prev, ur_status st) {
  return ur__device_leave(b, ur_tensor_device(t), prev, st);
}

/* ---- construction ---- */

static void kjt_free_parts(ur_kjt *k) {
  if (!k) return;
  if (k->keys)
    for (int32_t i = 0; i < k->nkeys; i++) free(k->keys[i]);
  free(k->keys);
  free(k->spk);
  free(k->bag0);
  free(k->val0);
  ur_tensor_free(k->values);
  ur_tensor_free(k->lengths);
  ur_tensor_free(k->offsets);
  ur_tensor_free(k->weights);
  ur_tensor_free(k->inverse);
  free(k);
}

void ur_kjt_free(ur_kjt *k) { kjt_free_parts(k); }

static const char *kname(const ur_kjt *k, int32_t i) { return k->keys[i]; }

/* The key whose bags hold bag b (keys with no bags skipped). */
static int32_t key_of_bag(const ur_kjt *k, int64_t b) {
  int32_t lo = 0, hi = k->nkeys; /* bag0[lo] <= b < bag0[hi] */
  while (hi - lo > 1) {
    int32_t mid = lo + (hi - lo) / 2;
    if (k->bag0[mid] <= b) lo = mid;
    else hi = mid;
  }
  return lo;
}

static ur_status view_all(const ur_tensor *t, ur_tensor **out) {
  *out = NULL;
  if (!t) return UR_STATUS_OK;
  return ur_tensor_view(t, out, 0, ur_tensor_dim(t, 0));
}

static ur_status check_1d(const ur_tensor *t, const char *what, ur_dtype want) {
  if (ur_tensor_ndim(t) != 1 || ur_tensor_dtype(t) != want)
    return ur__error(UR_STATUS_INVALID, "kjt: %s must be a 1-d %s tensor, got %s with %d dimensions",
                     what, ur_dtype_name(want), ur_dtype_name(ur_tensor_dtype(t)),
                     (int)ur_tensor_ndim(t));
  return UR_STATUS_OK;
}

/* The first error in bag order, from the first negative length (bad[0]) and the first bag
 * ending past the values (bad[1]), with its message made of a few elements read back. */
static ur_status offsets_error(const ur_kjt *k, const int64_t *bad, int64_t nv) {
  int64_t neg = bad[0], over = bad[1];
  ur_status st = UR_STATUS_OK;
  if (over >= 0 && (neg < 0 || over < neg)) {
    int32_t key = key_of_bag(k, over);
    int64_t end = 0, rest = k->bag0[key + 1] - over - 1;
    st = ur_tensor_read(k->offsets, over + 1, 1, &end);
    if (!st && rest > 0) {
      int32_t *len = malloc(sizeof(int32_t) * (size_t)rest);
      if (!len) return ur__error(UR_STATUS_OOM, "kjt: out of host memory");
      st = ur_tensor_read(k->lengths, over + 1, rest, len);
      for (int64_t i = 0; i < rest && !st; i++) end += len[i] > 0 ? len[i] : 0;
      free(len);
    }
    if (st) return st;
    return ur__error(UR_STATUS_INVALID,
                     "kjt: key '%s' lengths sum to %lld for the %lld value%s left (the bag of "
                     "sample %lld, lengths[%lld], ends past them)",
                     kname(k, key), (long long)(end - k->val0[key]),
                     (long long)(nv - k->val0[key]), ur__s(nv - k->val0[key]), (long long)(over - k->bag0[key]),
                     (long long)over);
  }
  if (neg >= 0) {
    int32_t key = key_of_bag(k, neg), l = 0;
    if ((st = ur_tensor_read(k->lengths, neg, 1, &l))) return st;
    return ur__error(UR_STATUS_INVALID,
                     "kjt: key '%s' sample %lld (lengths[%lld]) has length %d; lengths must be >= 0",
                     kname(k, key), (long long)(neg - k->bag0[key]), (long long)neg, (int)l);
  }
  if (k->val0[k->nkeys] != nv) {
    if (k->nkeys)
      return ur__error(UR_STATUS_INVALID,
                       "kjt: lengths sum to %lld for %lld value%s (%lld left after the "
                       "last key, '%s')",
                       (long long)k->val0[k->nkeys], (long long)nv, ur__s(nv),
                       (long long)(nv - k->val0[k->nkeys]), kname(k, k->nkeys - 1));
    return ur__error(UR_STATUS_INVALID, "kjt: no keys for %lld value%s", (long long)nv, ur__s(nv));
  }
  return UR_STATUS_OK;
}

/* Offsets: given (views and copies, which come with their key spans), or scanned from the
 * lengths by the backend.  With val0 known (results whose key spans were counted before) the
 * scan does not wait; else the key spans come back, with the checks when check. */
static ur_status make_offsets(ur_kjt *k, const ur_tensor *given, const int64_t *val0,
                              int check) {
  ur_status st;
  if (given) {
    if ((st = view_all(given, &k->offsets))) return st;
    memcpy(k->val0, val0, sizeof(int64_t) * (size_t)(k->nkeys + 1));
    return UR_STATUS_OK;
  }
  int64_t nb = k->bag0[k->nkeys], nv = ur_tensor_numel(k->values), bad[2] = {-1, -1};
  int32_t prev = 0;
  if ((st = new_like(&k->offsets, UR_DTYPE_I64, nb + 1, k->values)) ||
      (st = UR__NEED(k->be, kjt, offsets)) || (st = enter(k->be, k->values, &prev)))
    return st;
  st = k->be->kjt->offsets(NULL, dp(k->lengths), nb, dp(k->offsets), k->bag0, k->nkeys, nv,
                           val0 ? NULL : k->val0, bad);
  if ((st = leave(k->be, k->values, prev, st))) return st;
  if (val0) {
    memcpy(k->val0, val0, sizeof(int64_t) * (size_t)(k->nkeys + 1));
    return UR_STATUS_OK;
  }
  if (check && (st = offsets_error(k, bad, nv))) return st;
  /* The scan found what ur_kjt_validate would (its offsets are the lengths' running sum), made
   * unchecked or not.  A VBE batch's inverse indices, which it does not read, the backend's
   * check reads next on the same stream, as the scan read the lengths given with them (no wait
   * for the device's other streams): a sound VBE batch made unchecked (managed collisions' rows,
   * the sharded input's exchange) is known checked, and the collection's forward reads it
   * without a check of its own. */
  int sound = bad[0] < 0 && bad[1] < 0 && k->val0[k->nkeys] == nv;
  if (sound && k->inverse) {
    int64_t ib[3] = {-1, -1, -1};
    if ((st = UR__NEED(k->be, kjt, validate)) || (st = enter(k->be, k->values, &prev))) return st;
    st = k->be->kjt->validate(NULL, dp(k->lengths), dp(k->offsets), dp(k->values),
                              dp(k->inverse), nv, k->nkeys, k->stride, k->bag0, k->spk, NULL, ib);
    if ((st = leave(k->be, k->values, prev, st))) return st;
    sound = ib[0] < 0 && ib[2] < 0;
  }
  k->checked = sound;
  return UR_STATUS_OK;
}

/* t (the argument `what`, with its verb) in the placement of ref (`rwhat`), device and all: the
 * message names both devices, as two GPUs share a placement's name. */
static ur_status same_place(const char *who, const char *what, const char *verb,
                            const ur_tensor *t, const char *rwhat, const ur_tensor *ref) {
  if (ur_tensor_place(t) != ur_tensor_place(ref) || ur_tensor_device(t) != ur_tensor_device(ref))
    return ur__error(UR_STATUS_INVALID,
                     "%s: %s %s in %s (device %d) but %s in %s (device %d); one placement for all",
                     who, what, verb, ur_place_name(ur_tensor_place(t)), (int)ur_tensor_device(t),
                     rwhat, ur_place_name(ur_tensor_place(ref)), (int)ur_tensor_device(ref));
  return UR_STATUS_OK;
}

/* Every KJT is made here, and takes its backend here.  Offsets given (a view's or a copy's)
 * come with their key spans val0; else they are scanned from the lengths, checked when check. */
static ur_status kjt_make(int32_t nkeys, const char *const *keys, int64_t stride,
                          const int64_t *spk, const ur_tensor *values, const ur_tensor *lengths,
                          const ur_tensor *weights, const ur_tensor *inverse,
                          const ur_tensor *offsets, const int64_t *val0, int check,
                          ur_kjt **out) {
  *out = NULL;
  if (nkeys < 0)
    return ur__error(UR_STATUS_INVALID, "kjt: %d keys; expected >= 0", (int)nkeys);
  if (stride < 0)
    return ur__error(UR_STATUS_INVALID, "kjt: stride %lld; expected >= 0", (long long)stride);
  if (!values || !lengths)
    return ur__error(UR_STATUS_INVALID, "kjt: values and lengths are required");
  if (!keys && nkeys)
    return ur__error(UR_STATUS_INVALID, "kjt: %d keys but no key names", (int)nkeys);
  for (int32_t i = 0; i < nkeys; i++)
    if (!keys[i] || !keys[i][0])
      return ur__error(UR_STATUS_INVALID, "kjt: key %d has no name", (int)i);
  ur_status st;
  if ((st = check_1d(values, "values", UR_DTYPE_I64))) return st;
  if ((st = check_1d(lengths, "lengths", UR_DTYPE_I32))) return st;
  if (weights && (st = check_1d(weights, "weights", UR_DTYPE_F32))) return st;
  if (inverse && (st = check_1d(inverse, "inverse_indices", UR_DTYPE_I64))) return st;
  if (inverse && !spk)
    return ur__error(UR_STATUS_INVALID,
                     "kjt: inverse_indices given without stride_per_key_per_rank (a VBE batch "
                     "needs both)");
  if (spk && !inverse)
    return ur__error(UR_STATUS_INVALID,
                     "kjt: stride_per_key_per_rank given without inverse_indices (a VBE batch "
                     "needs both)");
  const ur_tensor *all[] = {values, lengths, weights, inverse};
  const char *names[] = {"values", "lengths", "weights", "inverse_indices"};
  for (int i = 1; i < 4; i++) {
    ur_status bad = all[i] ? same_place("kjt", names[i], "are", all[i], "values", values) : 0;
    if (bad) return bad;
  }
  ur_kjt *k = calloc(1, sizeof *k);
  if (!k) return ur__error(UR_STATUS_OOM, "kjt: out of host memory");
  k->nkeys = nkeys;
  k->stride = stride;
  k->variable = spk != NULL;
  k->keys = calloc((size_t)nkeys + 1, sizeof(char *));
  k->spk = calloc((size_t)nkeys + 1, sizeof(int64_t));
  k->bag0 = calloc((size_t)nkeys + 1, sizeof(int64_t));
  k->val0 = calloc((size_t)nkeys + 1, sizeof(int64_t));
  if (!k->keys || !k->spk || !k->bag0 || !k->val0) {
    kjt_free_parts(k);
    return ur__error(UR_STATUS_OOM, "kjt: out of host memory");
  }
  for (int32_t i = 0; i < nkeys; i++) {
    if (!(k->keys[i] = strdup(keys[i]))) {
      kjt_free_parts(k);
      return ur__error(UR_STATUS_OOM, "kjt: out of host memory");
    }
    int64_t s = spk ? spk[i] : stride;
    if (s < 0 || (spk && s > stride)) {
      st = ur__error(UR_STATUS_INVALID,
                     "kjt: key '%s' has stride %lld; expected 0..%lld (the batch size)",
                     keys[i], (long long)s, (long long)stride);
      kjt_free_parts(k);
      return st;
    }
    k->spk[i] = s;
    k->bag0[i + 1] = k->bag0[i] + s;
  }
  int64_t nb = k->bag0[nkeys];
  if (ur_tensor_numel(lengths) != nb) {
    if (spk)
      st = ur__error(UR_STATUS_INVALID,
                     "kjt: %d keys with %lld bags in all (stride_per_key_per_rank) need %lld "
                     "lengths, got %lld",
                     (int)nkeys, (long long)nb, (long long)nb, (long long)ur_tensor_numel(lengths));
    else
      st = ur__error(UR_STATUS_INVALID,
                     "kjt: %d keys with stride %lld need %lld lengths, got %lld", (int)nkeys,
                     (long long)stride, (long long)nb, (long long)ur_tensor_numel(lengths));
    kjt_free_parts(k);
    return st;
  }
  if (weights && ur_tensor_numel(weights) != ur_tensor_numel(values)) {
    int64_t nw = ur_tensor_numel(weights), nv = ur_tensor_numel(values);
    st = ur__error(UR_STATUS_INVALID, "kjt: %lld weight%s for %lld value%s; expected one per value",
                   (long long)nw, ur__s(nw), (long long)nv, ur__s(nv));
    kjt_free_parts(k);
    return st;
  }
  if (inverse && ur_tensor_numel(inverse) != (int64_t)nkeys * stride) {
    st = ur__error(UR_STATUS_INVALID,
                   "kjt: %lld inverse_indices for %d keys of stride %lld; expected %lld",
                   (long long)ur_tensor_numel(inverse), (int)nkeys, (long long)stride,
                   (long long)nkeys * stride);
    kjt_free_parts(k);
    return st;
  }
  k->be = ur__tensor_backend(values);
  if ((st = view_all(values, &k->values)) || (st = view_all(lengths, &k->lengths)) ||
      (st = view_all(weights, &k->weights)) || (st = view_all(inverse, &k->inverse)) ||
      (st = make_offsets(k, offsets, val0, check))) {
    kjt_free_parts(k);
    return st;
  }
  *out = k;
  return UR_STATUS_OK;
}

/* No two keys of a KJT made from the caller's names share one (a lookup by name would find one
 * key's bags for both): sorted, so a request of 1000 keys costs about 10k comparisons, not half
 * a million.  A missing name is left to kjt_make's check, which names it. */
static ur_status distinct_keys(int32_t n, const char *const *keys) {
  int32_t a, b;
  ur_status st = ur__names_repeat(keys, n, "kjt", &a, &b);
  if (!st && a >= 0)
    st = ur__error(UR_STATUS_INVALID, "kjt: keys %d and %d are both named '%s'; expected distinct keys", (int)a,
                   (int)b, keys[a]);
  return st;
}

ur_status ur__kjt_key_order(const ur_kjt *k, const char *const *names, int32_t n, int32_t *order,
                           int32_t *missing) {
  *missing = -1;
  int32_t i = 0;
  for (; i < n && i < k->nkeys && !strcmp(k->keys[i], names[i]); i++) order[i] = i;
  if (i == n) return UR_STATUS_OK;
  ur__named *v = malloc(sizeof *v * (size_t)(k->nkeys > 0 ? k->nkeys : 1));
  if (!v) return ur__error(UR_STATUS_OOM, "kjt: out of host memory");
  for (int32_t j = 0; j < k->nkeys; j++) v[j] = (ur__named){k->keys[j], j};
  qsort(v, (size_t)k->nkeys, sizeof *v, ur__named_cmp);
  for (; i < n; i++) {
    int32_t lo = 0, hi = k->nkeys; /* the first key not below names[i] */
    while (lo < hi) {
      int32_t mid = lo + (hi - lo) / 2;
      if (strcmp(v[mid].name, names[i]) < 0) lo = mid + 1;
      else hi = mid;
    }
    if (lo == k->nkeys || strcmp(v[lo].name, names[i])) {
      *missing = i;
      break;
    }
    order[i] = v[lo].at;
  }
  free(v);
  return UR_STATUS_OK;
}

ur_status ur_kjt_new(ur_kjt **out, int32_t num_keys, const char *const *keys, int64_t stride,
                     const int64_t *stride_per_key_per_rank, ur_tensor *values, ur_tensor *lengths,
                     ur_tensor *weights, ur_tensor *inverse_indices, int32_t check) {
  UR__ARGS(out, values, lengths);
  *out = NULL;
  if (num_keys > 0 && !keys) return ur__null(__func__, "keys");
  ur_status st = distinct_keys(num_keys, keys);
  if (st) return st;
  st = kjt_make(num_keys, keys, stride, stride_per_key_per_rank, values, lengths, weights,
                inverse_indices, NULL, NULL, check, out);
  /* the scan and the inverse indices' pass found nothing (kjt_make): known checked, no wait
   * more; else ur_kjt_validate names what is wrong */
  if (!st && check && inverse_indices && !is_checked(*out) && (st = ur_kjt_validate(*out, NULL))) {
    ur_kjt_free(*out);
    *out = NULL;
  }
  return st;
}

/* A KJT whose offsets the caller made (the loader, writing them with the lengths): offsets
 * [nkeys * stride + 1] beside values, val0 (host, nkeys + 1) each key's first value.  Nothing
 * is scanned or allocated but the views.  The loader counts every bag's ids as it writes them,
 * with its offsets and key spans: sound by construction, so checked. */
ur_status ur__kjt_new_with_offsets(ur_kjt **out, int32_t num_keys, const char *const *keys,
                                   int64_t stride, ur_tensor *values, ur_tensor *lengths,
                                   ur_tensor *weights, ur_tensor *offsets, const int64_t *val0) {
  ur_status st = kjt_make(num_keys, keys, stride, NULL, values, lengths, weights, NULL, offsets,
                          val0, 0, out);
  if (!st) (*out)->checked = 1;
  return st;
}

/* ---- accessors ---- */

int32_t ur_kjt_num_keys(const ur_kjt *k) {
  UR__ARGS_OR(-1, k);
  return k->nkeys;
}
const char *ur_kjt_key(const ur_kjt *k, int32_t i) {
  UR__ARGS_OR(NULL, k);
  return i >= 0 && i < k->nkeys ? k->keys[i] : NULL;
}
int32_t ur_kjt_key_index(const ur_kjt *k, const char *key) {
  UR__ARGS_OR(-1, k, key);
  for (int32_t i = 0; i < k->nkeys; i++)
    if (!strcmp(k->keys[i], key)) return i;
  return -1;
}
int64_t ur_kjt_stride(const ur_kjt *k) {
  UR__ARGS_OR(-1, k);
  return k->stride;
}
int64_t ur_kjt_stride_of(const ur_kjt *k, int32_t i) {
  UR__ARGS_OR(-1, k);
  return i >= 0 && i < k->nkeys ? k->spk[i] : -1;
}
int32_t ur_kjt_variable_stride(const ur_kjt *k) {
  UR__ARGS_OR(-1, k);
  return k->variable;
}
int32_t ur_kjt_checked(const ur_kjt *k) {
  UR__ARGS_OR(-1, k);
  return is_checked(k);
}
const ur_tensor *ur_kjt_values(const ur_kjt *k) {
  UR__ARGS_OR(NULL, k);
  return k->values;
}
const ur_tensor *ur_kjt_lengths(const ur_kjt *k) {
  UR__ARGS_OR(NULL, k);
  return k->lengths;
}
const ur_tensor *ur_kjt_offsets(const ur_kjt *k) {
  UR__ARGS_OR(NULL, k);
  return k->offsets;
}
const ur_tensor *ur_kjt_weights(const ur_kjt *k) {
  UR__ARGS_OR(NULL, k);
  return k->weights;
}
const ur_tensor *ur_kjt_inverse_indices(const ur_kjt *k) {
  UR__ARGS_OR(NULL, k);
  return k->inverse;
}

ur_status ur_kjt_key_span(const ur_kjt *k, int32_t i, int64_t *bag0, int64_t *bag1,
                          int64_t *value0, int64_t *value1) {
  UR__ARGS(k, bag0, bag1, value0, value1);
  if (i < 0 || i >= k->nkeys)
    return ur__error(UR_STATUS_INVALID, "kjt: key index %d outside 0..%d", (int)i,
                     (int)k->nkeys - 1);
  *bag0 = k->bag0[i];
  *bag1 = k->bag0[i + 1];
  *value0 = k->val0[i];
  *value1 = k->val0[i + 1];
  return UR_STATUS_OK;
}

/* ---- validate ---- */

/* Each key's first offset and the last, offsets[bag0[i]] for i = 0..nkeys, into at (host,
 * nkeys + 1): one gather by the backend and one read back, not a read a key (on a GPU, a wait
 * each).  The backend's device is current. */
static ur_status key_offsets(const ur_kjt *k, int64_t *at) {
  int32_t n = k->nkeys + 1;
  ur__kjt_seg *seg = malloc(sizeof *seg * (size_t)n);
  if (!seg) return ur__error(UR_STATUS_OOM, "kjt: out of host memory");
  const int64_t *off = dp(k->offsets);
  for (int32_t i = 0; i < n; i++) seg[i] = (ur__kjt_seg){off + k->bag0[i], i, 1};
  ur_tensor *t = NULL;
  ur_status st = UR__NEED(k->be, kjt, segments);
  if (!st) st = new_like(&t, UR_DTYPE_I64, n, k->offsets);
  if (!st) st = k->be->kjt->segments(NULL, dp(t), sizeof(int64_t), seg, n);
  if (!st) st = ur_tensor_read(t, 0, n, at);
  ur_tensor_free(t);
  free(seg);
  return st;
}

/* The one check of a KJT, for ur_kjt_validate and for the ops that read bag by bag through the
 * offsets of a KJT not known checked (ur__kjt_need_checked); `who` opens the message.  The backend
 * finds the first bad bag, the first bag with a bad id and the first bad inverse index; the
 * error is the one of the lowest key (bags, then ids, then inverse indices within a key), and
 * its message is made from a few elements read back.  The KJT is marked checked when its bags
 * and inverse indices are sound (ids out of range are the rows' matter, not its shape's), and
 * unmarked when not, so a caller who wrote into its tensors and validates again is believed. */
static ur_status check_kjt(const ur_kjt *k, const int64_t *rows, const char *who) {
  int64_t bad[3] = {-1, -1, -1}, nv = ur_tensor_numel(k->values);
  int64_t *at = malloc(sizeof(int64_t) * ((size_t)k->nkeys + 1));
  if (!at) return ur__error(UR_STATUS_OOM, "%s: out of host memory", who);
  int32_t prev = 0, span = -1;
  ur_status st = UR__NEED(k->be, kjt, validate);
  /* the check waits for the device, which a capture cannot hold: refused before any CUDA call,
   * so the capture is left whole */
  if (!st && k->be == ur__gpu() && ur__graph_capturing())
    st = ur__error(UR_STATUS_INVALID,
                   "%s: not known checked, and on the GPU its check waits for the device, "
                   "which a graph capture cannot: validate it before the capture begins, or "
                   "make it with check", who);
  if (!st && !(st = enter(k->be, k->values, &prev))) {
    /* on the GPU after every write queued before, on any stream: the engine's streams do not
     * wait for the NULL stream's work, nor it for theirs, and the flag remembers the answer */
    if (k->be == ur__gpu()) st = k->be->device_sync();
    if (!st)
      st = k->be->kjt->validate(NULL, dp(k->lengths), dp(k->offsets), dp(k->values),
                                dp(k->inverse), nv, k->nkeys, k->stride, k->bag0, k->spk, rows,
                                bad);
    /* the key spans kept on the host (val0, from the lengths when the KJT was made) against
     * the offsets at each key's first bag: tensors written after the KJT was made (a copy into
     * buffers reused for another batch) may agree bag by bag and not with them, and every op
     * reading whole key spans trusts them once the KJT is known checked */
    if (!st && bad[0] < 0) st = key_offsets(k, at);
    for (int32_t i = 0; !st && bad[0] < 0 && i <= k->nkeys && span < 0; i++)
      if (at[i] != k->val0[i]) span = i;
    st = leave(k->be, k->values, prev, st);
  }
  int64_t at_span = span >= 0 ? at[span] : 0;
  free(at);
  if (st) return st;
  set_checked(k, bad[0] < 0 && bad[2] < 0 && span < 0 && k->val0[k->nkeys] == nv);
  int64_t none = INT64_MAX;
  int64_t kb = bad[0] >= 0 ? key_of_bag(k, bad[0]) : none;
  int64_t ki = bad[1] >= 0 ? key_of_bag(k, bad[1]) : none;
  int64_t kv = bad[2] >= 0 && k->stride > 0 ? bad[2] / k->stride : none;
  if (kb != none && kb <= ki && kb <= kv) {
    int64_t b = bad[0], off[2];
    int32_t key = (int32_t)kb, l = 0;
    if ((st = ur_tensor_read(k->lengths, b, 1, &l)) || (st = ur_tensor_read(k->offsets, b, 2, off)))
      return st;
    if (l < 0)
      return ur__error(UR_STATUS_INVALID,
                       "%s: key '%s' sample %lld (lengths[%lld]) has length %d; lengths must be >= 0",
                       who, kname(k, key), (long long)(b - k->bag0[key]), (long long)b, (int)l);
    return ur__error(UR_STATUS_INVALID,
                     "%s: key '%s' sample %lld: offsets %lld..%lld disagree with length %d "
                     "or pass the %lld values",
                     who, kname(k, key), (long long)(b - k->bag0[key]), (long long)off[0],
                     (long long)off[1], (int)l, (long long)nv);
  }
  if (ki != none && ki <= kv) {
    int64_t b = bad[1], off[2];
    int32_t key = (int32_t)ki;
    if ((st = ur_tensor_read(k->offsets, b, 2, off))) return st;
    int64_t n = off[1] - off[0];
    int64_t *ids = malloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1));
    if (!ids) return ur__error(UR_STATUS_OOM, "%s: out of host memory", who);
    st = ur_tensor_read(k->values, off[0], n, ids);
    for (int64_t v = 0; v < n && !st; v++)
      if (ids[v] < 0 || ids[v] >= rows[key])
        st = ur__error(UR_STATUS_INVALID,
                       "%s: key '%s' sample %lld (values[%lld]) has id %lld, outside the "
                       "table's %lld rows",
                       who, kname(k, key), (long long)(b - k->bag0[key]), (long long)(off[0] + v),
                       (long long)ids[v], (long long)rows[key]);
    free(ids);
    if (!st)
      st = ur__error(UR_STATUS_DEVICE, "%s: the %s backend found a bad id in bag %lld of key "
                     "'%s' that reading the bag back does not show", who, k->be->name, (long long)b,
                     kname(k, key));
    return st;
  }
  if (kv != none) {
    int64_t i = bad[2], x = 0;
    int32_t key = (int32_t)kv;
    if ((st = ur_tensor_read(k->inverse, i, 1, &x))) return st;
    return ur__error(UR_STATUS_INVALID,
                     "%s: key '%s' sample %lld has inverse index %lld; expected 0..%lld "
                     "(the key's stride is %lld)",
                     who, kname(k, key), (long long)(i - kv * k->stride), (long long)x,
                     (long long)k->spk[key] - 1, (long long)k->spk[key]);
  }
  if (span >= 0 && span < k->nkeys)
    return ur__error(UR_STATUS_INVALID,
                     "%s: key '%s' starts at value %lld by the lengths the KJT was made with, but "
                     "its offsets say %lld (its tensors written since? make a new KJT of them)",
                     who, kname(k, span), (long long)k->val0[span], (long long)at_span);
  if (span >= 0)
    return ur__error(UR_STATUS_INVALID,
                     "%s: the keys end at value %lld by the lengths the KJT was made with, but "
                     "its offsets say %lld (its tensors written since? make a new KJT of them)",
                     who, (long long)k->val0[span], (long long)at_span);
  if (k->val0[k->nkeys] != nv)
    return ur__error(UR_STATUS_INVALID, "%s: lengths sum to %lld for %lld value%s",
                     who, (long long)k->val0[k->nkeys], (long long)nv, ur__s(nv));
  return UR_STATUS_OK;
}

ur_status ur_kjt_validate(const ur_kjt *k, const int64_t *rows) {
  UR__ARGS(k);
  return check_kjt(k, rows, "kjt");
}

/* What an op reading bag by bag through k's offsets (or its inverse indices) needs: nothing for
 * a KJT known checked, else the check, whose error names the op (on the GPU it waits).  The
 * ops here, and serving's predict, whose collection reads the bags (kjt.h). */
ur_status ur__kjt_need_checked(const ur_kjt *k, const char *who) {
  return is_checked(k) ? UR_STATUS_OK : check_kjt(k, NULL, who);
}

/* ---- permute and concat: segment copies ---- */

/* A result made of runs of its input's arrays, in the input's placement from the start; its
 * key spans (val0) are counted before, so its offsets are scanned without waiting. */
typedef struct build {
  int32_t nkeys;
  const char **keys;
  int64_t stride;
  int64_t *spk;        /* NULL: not VBE */
  int64_t nvalues, nbags;
  int weighted;
  int checked;         /* every input known checked: so is the result */
  ur_tensor *values, *lengths, *weights, *inverse;
  int64_t *val0;       /* nkeys + 1 first values */
  ur__kjt_seg *seg;    /* 4 * n runs, array by array: values, weights, lengths, inverse */
} build;

static void build_free(build *b) {
  ur_tensor_free(b->values);
  ur_tensor_free(b->lengths);
  ur_tensor_free(b->weights);
  ur_tensor_free(b->inverse);
  free(b->spk);
  free(b->keys);
  free(b->val0);
  free(b->seg);
}

/* b's arrays, in the placement of `like`, copied by backend be from n runs each; then the
 * result.  Frees b. */
static ur_status build_finish(const ur_backend *be, const ur_tensor *like, build *b, int64_t n,
                              ur_kjt **out) {
  const ur__kjt_seg *seg = b->seg;
  int32_t prev = 0;
  ur_status st = new_like(&b->values, UR_DTYPE_I64, b->nvalues, like);
  if (!st) st = new_like(&b->lengths, UR_DTYPE_I32, b->nbags, like);
  if (!st && b->weighted) st = new_like(&b->weights, UR_DTYPE_F32, b->nvalues, like);
  if (!st && b->spk) st = new_like(&b->inverse, UR_DTYPE_I64, (int64_t)b->nkeys * b->stride, like);
  if (!st) st = UR__NEED(be, kjt, segments);
  if (!st && !(st = enter(be, like, &prev))) {
    st = be->kjt->segments(NULL, dp(b->values), sizeof(int64_t), seg, n);
    if (!st && b->weights) st = be->kjt->segments(NULL, dp(b->weights), sizeof(float), seg + n, n);
    if (!st) st = be->kjt->segments(NULL, dp(b->lengths), sizeof(int32_t), seg + 2 * n, n);
    if (!st && b->inverse)
      st = be->kjt->segments(NULL, dp(b->inverse), sizeof(int64_t), seg + 3 * n, n);
    st = leave(be, like, prev, st);
  }
  if (!st)
    st = kjt_make(b->nkeys, b->keys, b->stride, b->spk, b->values, b->lengths, b->weights,
                  b->inverse, NULL, b->val0, 0, out);
  if (!st) (*out)->checked = b->checked;
  build_free(b);
  return st;
}

/* Each key's span of values within the values, one after the other, ending at the last: what a
 * copy or a view of whole key spans reads (permute, split, concat).  A KJT made unchecked
 * (ur_kjt_new's check 0) may break this; the spans are on the host wherever the KJT is, so the
 * check costs num_keys steps and reads no device memory, and a KJT known checked skips it.  Bags
 * within a span are not looked at: the result is not known checked either, and an op reading
 * its bags checks them (ur__kjt_need_checked). */
ur_status ur__kjt_spans_fit(const ur_kjt *k, const char *who) {
  if (is_checked(k)) return UR_STATUS_OK;
  int64_t nv = ur_tensor_numel(k->values);
  for (int32_t i = 0; i < k->nkeys; i++) {
    int64_t v0 = k->val0[i], v1 = k->val0[i + 1];
    if (v1 < v0)
      return ur__error(UR_STATUS_INVALID,
                       "%s: key '%s' lengths sum to %lld; expected a count of values, 0 or more "
                       "(a KJT made unchecked? ur_kjt_validate names the bag)",
                       who, kname(k, i), (long long)(v1 - v0));
    if (v0 < 0 || v1 > nv)
      return ur__error(UR_STATUS_INVALID,
                       "%s: key '%s' lengths sum to %lld for the %lld value%s left (a KJT made "
                       "unchecked? ur_kjt_validate names the bag)",
                       who, kname(k, i), (long long)(v1 - v0), (long long)(nv - v0),
                       ur__s(nv - v0));
  }
  if (k->nkeys && k->val0[k->nkeys] != nv)
    return ur__error(UR_STATUS_INVALID,
                     "%s: lengths sum to %lld for %lld value%s (%lld left after the last key, "
                     "'%s'; a KJT made unchecked? ur_kjt_validate names the bag)",
                     who, (long long)k->val0[k->nkeys], (long long)nv, ur__s(nv),
                     (long long)(nv - k->val0[k->nkeys]), kname(k, k->nkeys - 1));
  return UR_STATUS_OK;
}

/* One run per key (and array), so the key spans must fit the values (ur__kjt_spans_fit). */
ur_status ur_kjt_permute(const ur_kjt *k, const int32_t *order, int32_t n, ur_kjt **out) {
  UR__ARGS(k, out);
  if (n > 0 && !order) return ur__null(__func__, "order");
  *out = NULL;
  if (n < 0) return ur__error(UR_STATUS_INVALID, "kjt permute: %d keys asked", (int)n);
  for (int32_t j = 0; j < n; j++)
    if (order[j] < 0 || order[j] >= k->nkeys)
      return ur__error(UR_STATUS_INVALID,
                       "kjt permute: position %d asks for key %d; the KJT has keys 0..%d", (int)j,
                       (int)order[j], (int)k->nkeys - 1);
  ur_status st = ur__kjt_spans_fit(k, "kjt permute");
  if (st) return st;
  build b = {0};
  b.nkeys = n;
  b.stride = k->stride;
  b.weighted = k->weights != NULL;
  b.checked = is_checked(k);
  b.keys = calloc((size_t)n + 1, sizeof(char *));
  if (k->variable) b.spk = calloc((size_t)n + 1, sizeof(int64_t));
  b.val0 = malloc(sizeof(int64_t) * ((size_t)n + 1));
  b.seg = malloc(sizeof *b.seg * 4 * (size_t)(n > 0 ? n : 1));
  if (!b.keys || (k->variable && !b.spk) || !b.val0 || !b.seg) {
    build_free(&b);
    return ur__error(UR_STATUS_OOM, "kjt permute: out of host memory");
  }
  const char *val = dp(k->values), *w = dp(k->weights), *len = dp(k->lengths),
             *inv = dp(k->inverse);
  ur__kjt_seg *seg = b.seg;
  for (int32_t j = 0; j < n; j++) {
    int32_t s = order[j];
    int64_t nv = k->val0[s + 1] - k->val0[s], nb = k->spk[s];
    b.keys[j] = k->keys[s];
    if (b.spk) b.spk[j] = nb;
    b.val0[j] = b.nvalues;
    seg[j] = (ur__kjt_seg){val + 8 * k->val0[s], b.nvalues, nv};
    seg[n + j] = (ur__kjt_seg){w ? w + 4 * k->val0[s] : NULL, b.nvalues, nv};
    seg[2 * n + j] = (ur__kjt_seg){len + 4 * k->bag0[s], b.nbags, nb};
    seg[3 * n + j] = (ur__kjt_seg){inv ? inv + 8 * (int64_t)s * k->stride : NULL,
                                   (int64_t)j * k->stride, k->stride};
    b.nvalues += nv;
    b.nbags += nb;
  }
  b.val0[n] = b.nvalues;
  return build_finish(k->be, k->values, &b, n, out);
}

/* Consecutive keys share storage with the input: the parts are views. */
ur_status ur_kjt_split(const ur_kjt *k, const int32_t *sizes, int32_t n, ur_kjt **outs) {
  UR__ARGS(k);
  if (n > 0 && !sizes) return ur__null(__func__, "sizes");
  if (n > 0 && !outs) return ur__null(__func__, "outs");
  int64_t total = 0;
  for (int32_t j = 0; j < n; j++) {
    outs[j] = NULL;
    if (sizes[j] < 0)
      return ur__error(UR_STATUS_INVALID, "kjt split: segment %d has %d keys; expected >= 0",
                       (int)j + 1, (int)sizes[j]);
    total += sizes[j];
  }
  if (n < 0 || total != k->nkeys)
    return ur__error(UR_STATUS_INVALID,
                     "kjt split: segments hold %lld keys in all but the KJT has %d",
                     (long long)total, (int)k->nkeys);
  /* The parts are views of whole key spans; they are known checked when k is. */
  ur_status st = ur__kjt_spans_fit(k, "kjt split");
  if (st) return st;
  int checked = is_checked(k);
  int32_t k0 = 0;
  for (int32_t j = 0; j < n && !st; j++) {
    int32_t k1 = k0 + sizes[j];
    ur_tensor *v = NULL, *l = NULL, *w = NULL, *inv = NULL, *off = NULL;
    st = ur_tensor_view(k->values, &v, k->val0[k0], k->val0[k1] - k->val0[k0]);
    if (!st) st = ur_tensor_view(k->lengths, &l, k->bag0[k0], k->bag0[k1] - k->bag0[k0]);
    if (!st && k->weights)
      st = ur_tensor_view(k->weights, &w, k->val0[k0], k->val0[k1] - k->val0[k0]);
    if (!st && k->inverse)
      st = ur_tensor_view(k->inverse, &inv, (int64_t)k0 * k->stride,
                          (int64_t)(k1 - k0) * k->stride);
    /* Offsets of the part start at 0: rebased copies, unless the part starts at value 0. */
    if (!st && k->val0[k0] == 0)
      st = ur_tensor_view(k->offsets, &off, k->bag0[k0], k->bag0[k1] - k->bag0[k0] + 1);
    /* Rebased key spans, so the GPU scans the new offsets without waiting. */
    int64_t *v0 = NULL;
    if (!st && !off) {
      if (!(v0 = malloc(sizeof(int64_t) * (size_t)(k1 - k0 + 1))))
        st = ur__error(UR_STATUS_OOM, "kjt split: out of host memory");
      for (int32_t i = 0; v0 && i <= k1 - k0; i++) v0[i] = k->val0[k0 + i] - k->val0[k0];
    }
    if (!st)
      st = kjt_make(k1 - k0, (const char *const *)k->keys + k0, k->stride,
                    k->variable ? k->spk + k0 : NULL, v, l, w, inv, off, off ? k->val0 + k0 : v0, 0,
                    &outs[j]);
    if (!st) outs[j]->checked = checked;
    free(v0);
    ur_tensor_free(v);
    ur_tensor_free(l);
    ur_tensor_free(w);
    ur_tensor_free(inv);
    ur_tensor_free(off);
    k0 = k1;
  }
  if (st)
    for (int32_t j = 0; j < n; j++) {
      ur_kjt_free(outs[j]);
      outs[j] = NULL;
    }
  return st;
}

typedef struct keyref {
  const char *name;
  int32_t part, at; /* at: position among all parts' keys */
} keyref;

static int keyref_cmp(const void *a, const void *b) {
  const keyref *x = a, *y = b;
  int c = strcmp(x->name, y->name);
  return c ? c : (x->at > y->at) - (x->at < y->at);
}

/* A key that is in two places: the earliest second occurrence, and the part of its first (by
 * sorting the names, not comparing every pair: concat takes hundreds of keys). */
static ur_status concat_duplicate(const ur_kjt *const *parts, int32_t n, int32_t nkeys) {
  keyref *r = malloc(sizeof *r * ((size_t)nkeys + 1));
  if (!r) return ur__error(UR_STATUS_OOM, "kjt concat: out of host memory");
  int32_t m = 0;
  for (int32_t j = 0; j < n; j++)
    for (int32_t i = 0; i < parts[j]->nkeys; i++, m++) r[m] = (keyref){parts[j]->keys[i], j, m};
  qsort(r, (size_t)m, sizeof *r, keyref_cmp);
  int32_t second = -1, first = -1;
  for (int32_t i = 1, g = 0; i < m; i++) {
    if (strcmp(r[i].name, r[g].name)) {
      g = i;
      continue;
    }
    if (i == g + 1 && (second < 0 || r[i].at < r[second].at)) {
      second = i;
      first = g;
    }
  }
  ur_status st = UR_STATUS_OK;
  if (second >= 0)
    st = ur__error(UR_STATUS_INVALID, "kjt concat: key '%s' of part %d is also in part %d",
                   r[second].name, (int)r[second].part + 1, (int)r[first].part + 1);
  free(r);
  return st;
}

ur_status ur_kjt_concat(const ur_kjt *const *parts, int32_t n, ur_kjt **out) {
  UR__ARGS(parts, out);
  *out = NULL;
  if (n < 1) return ur__error(UR_STATUS_INVALID, "kjt concat: no parts");
  const ur_kjt *p0 = parts[0];
  build b = {0};
  b.stride = p0->stride;
  b.weighted = p0->weights != NULL;
  b.checked = 1;
  for (int32_t j = 0; j < n; j++) {
    const ur_kjt *p = parts[j];
    if (p->stride != p0->stride)
      return ur__error(UR_STATUS_INVALID,
                       "kjt concat: part %d has stride %lld but part 1 has %lld", (int)j + 1,
                       (long long)p->stride, (long long)p0->stride);
    if ((p->weights != NULL) != b.weighted)
      return ur__error(UR_STATUS_INVALID,
                       "kjt concat: part %d is %sweighted but part 1 is %sweighted", (int)j + 1,
                       p->weights ? "" : "not ", b.weighted ? "" : "not ");
    if (p->variable != p0->variable)
      return ur__error(UR_STATUS_INVALID,
                       "kjt concat: part %d %s a variable batch per key but part 1 %s", (int)j + 1,
                       p->variable ? "has" : "has not", p0->variable ? "has" : "has not");
    char part[32], who[48];
    snprintf(part, sizeof part, "part %d", (int)j + 1);
    ur_status bad = same_place("kjt concat", part, "is", p->values, "part 1", p0->values);
    if (bad) return bad;
    /* The result's key spans are each part's, laid after the values of the parts before: a
     * part whose lengths do not add up to its values would give keys another part's values. */
    snprintf(who, sizeof who, "kjt concat: part %d", (int)j + 1);
    if ((bad = ur__kjt_spans_fit(p, who))) return bad;
    b.checked &= is_checked(p);
    b.nkeys += p->nkeys;
    b.nvalues += ur_tensor_numel(p->values);
    b.nbags += p->bag0[p->nkeys];
  }
  ur_status dup = concat_duplicate(parts, n, b.nkeys);
  if (dup) return dup;
  b.keys = calloc((size_t)b.nkeys + 1, sizeof(char *));
  if (p0->variable) b.spk = calloc((size_t)b.nkeys + 1, sizeof(int64_t));
  b.val0 = malloc(sizeof(int64_t) * ((size_t)b.nkeys + 1));
  b.seg = malloc(sizeof *b.seg * 4 * (size_t)n);
  if (!b.keys || (p0->variable && !b.spk) || !b.val0 || !b.seg) {
    build_free(&b);
    return ur__error(UR_STATUS_OOM, "kjt concat: out of host memory");
  }
  /* Key spans from the parts' lengths, as the scan of the result's lengths gives them. */
  ur__kjt_seg *seg = b.seg;
  int64_t vo = 0, bo = 0, ko = 0, lo = 0;
  for (int32_t j = 0; j < n; j++) {
    const ur_kjt *p = parts[j];
    int64_t nv = ur_tensor_numel(p->values), nb = p->bag0[p->nkeys];
    seg[j] = (ur__kjt_seg){dp(p->values), vo, nv};
    seg[n + j] = (ur__kjt_seg){dp(p->weights), vo, nv};
    seg[2 * n + j] = (ur__kjt_seg){dp(p->lengths), bo, nb};
    seg[3 * n + j] = (ur__kjt_seg){dp(p->inverse), ko * b.stride, p->nkeys * b.stride};
    for (int32_t i = 0; i < p->nkeys; i++) {
      b.keys[ko + i] = p->keys[i];
      if (b.spk) b.spk[ko + i] = p->spk[i];
      b.val0[ko + i] = lo + p->val0[i];
    }
    vo += nv;
    bo += nb;
    ko += p->nkeys;
    lo += p->val0[p->nkeys];
  }
  b.val0[b.nkeys] = lo;
  return build_finish(p0->be, p0->values, &b, n, out);
}

/* ---- dedup and expand: bag gathers ---- */

/* The result whose bag i is k's bag map[i] (n bags): lengths and offsets gathered, then
 * values and weights.  val0 (nkeys + 1) is known (dedup), or read from the gathered offsets
 * at every stride-th bag when nat > 0 (expand: each key's first bag), which waits. */
static ur_status gather_bags(const ur_kjt *k, const ur_tensor *map, int64_t n,
                             const int64_t *spk, ur_tensor *inv, int64_t *val0, int32_t nat,
                             ur_kjt **out) {
  const ur_backend *be = k->be;
  ur_tensor *len = NULL, *off = NULL, *v = NULL, *w = NULL;
  int32_t prev = 0;
  ur_status st = new_like(&len, UR_DTYPE_I32, n, k->values);
  if (!st) st = new_like(&off, UR_DTYPE_I64, n + 1, k->values);
  if (!st && !(st = UR__NEED(be, kjt, bag_lengths)) && !(st = UR__NEED(be, kjt, bag_copy)) &&
      !(st = enter(be, k->values, &prev))) {
    st = be->kjt->bag_lengths(NULL, dp(k->lengths), dp(map), n, dp(len), dp(off), k->stride,
                              nat, val0);
    if (!st) st = new_like(&v, UR_DTYPE_I64, val0[k->nkeys], k->values);
    if (!st && k->weights) st = new_like(&w, UR_DTYPE_F32, val0[k->nkeys], k->values);
    if (!st)
      st = be->kjt->bag_copy(NULL, dp(k->offsets), dp(k->values), dp(k->weights), dp(map), n,
                             dp(off), dp(v), dp(w));
    st = leave(be, k->values, prev, st);
  }
  if (!st)
    st = kjt_make(k->nkeys, (const char *const *)k->keys, k->stride, spk, v, len, w, inv, off,
                  val0, 0, out);
  if (!st) (*out)->checked = 1; /* gathered whole bags of a checked k */
  ur_tensor_free(len);
  ur_tensor_free(off);
  ur_tensor_free(v);
  ur_tensor_free(w);
  return st;
}

/* Lengths first (a copy for the keys that stay, the bucket counts for the others), their
 * offsets, then the values: a copy, or each bag's ids dealt to its buckets. */
ur_status ur_kjt_bucketize(const ur_kjt *k, ur_kjt **out, const int64_t *block,
                           const int64_t *rows, int32_t buckets) {
  UR__ARGS(k, out, block, rows);
  *out = NULL;
  if (k->variable)
    return ur__error(UR_STATUS_INVALID, "kjt bucketize: a VBE batch; expand() it first");
  if (buckets < 1 || buckets > 4096)
    return ur__error(UR_STATUS_INVALID, "kjt bucketize: %d buckets; expected 1..4096", (int)buckets);
  int32_t n = 0;
  for (int32_t i = 0; i < k->nkeys; i++) {
    if (block[i] < 0 || (block[i] > 0 && (rows[i] < 1 || rows[i] > block[i] * buckets)))
      return ur__error(UR_STATUS_INVALID,
                       "kjt bucketize: key '%s' has blocks of %lld rows for a table of %lld rows; "
                       "expected %d blocks to cover it",
                       k->keys[i], (long long)block[i], (long long)rows[i], (int)buckets);
    n += block[i] > 0 ? buckets : 1;
  }
  const ur_backend *be = k->be;
  ur_status st = ur__kjt_need_checked(k, "kjt bucketize");
  if (!st) st = UR__NEED(be, kjt, bucket_count);
  if (!st) st = UR__NEED(be, kjt, bucket_fill);
  if (!st) st = UR__NEED(be, kjt, segments);
  if (!st) st = UR__NEED(be, kjt, offsets);
  if (st) return st;
  char **names = calloc((size_t)n + 1, sizeof *names);
  int64_t *bag0 = calloc((size_t)n + 1, sizeof *bag0), *val0 = calloc((size_t)n + 1, sizeof *val0);
  ur__kjt_seg *seg = calloc((size_t)n + 1, sizeof *seg);
  ur_tensor *len = NULL, *off = NULL, *val = NULL, *w = NULL;
  int64_t nv = k->val0[k->nkeys], nb = 0, bad[2];
  int32_t prev = 0, nseg = 0;
  if (!names || !bag0 || !val0 || !seg) st = ur__error(UR_STATUS_OOM, "kjt bucketize: out of host memory");
  for (int32_t i = 0, j = 0; i < k->nkeys && !st; i++)
    for (int32_t b = 0; b < (block[i] > 0 ? buckets : 1) && !st; b++, j++) {
      size_t l = strlen(k->keys[i]) + 16;
      if (!(names[j] = malloc(l))) st = ur__error(UR_STATUS_OOM, "kjt bucketize: out of host memory");
      else if (block[i] > 0) snprintf(names[j], l, "%s@%d", k->keys[i], (int)b);
      else snprintf(names[j], l, "%s", k->keys[i]);
      bag0[j] = nb;
      nb += k->spk[i];
      bag0[j + 1] = nb;
    }
  if (!st) st = new_like(&len, UR_DTYPE_I32, nb, k->values);
  if (!st) st = new_like(&off, UR_DTYPE_I64, nb + 1, k->values);
  if (!st) st = new_like(&val, UR_DTYPE_I64, nv, k->values);
  if (!st && k->weights) st = new_like(&w, UR_DTYPE_F32, nv, k->values);
  if (!st && !(st = enter(be, k->values, &prev))) {
    const int64_t *koff = dp(k->offsets), *kval = dp(k->values);
    for (int32_t i = 0, j = 0; i < k->nkeys && !st; i++) {
      int64_t kb = k->spk[i];
      if (block[i] == 0) {
        seg[nseg++] = (ur__kjt_seg){(const int32_t *)dp(k->lengths) + k->bag0[i], bag0[j], kb};
        j++;
        continue;
      }
      st = be->kjt->bucket_count(NULL, koff + k->bag0[i], kval, kb, block[i], rows[i], buckets,
                                 (int32_t *)dp(len) + bag0[j], bad);
      if (!st && bad[0] >= 0) {
        int64_t id = 0, sample = 0;
        ur_tensor_read(k->values, bad[0], 1, &id);
        for (int64_t b = k->bag0[i]; b < k->bag0[i + 1]; b++) {
          int64_t o1 = 0;
          ur_tensor_read(k->offsets, b + 1, 1, &o1);
          if (o1 > bad[0]) {
            sample = b - k->bag0[i];
            break;
          }
        }
        st = ur__error(UR_STATUS_INVALID,
                       "kjt bucketize: key '%s' sample %lld has id %lld; expected 0..%lld (its "
                       "table's rows)",
                       k->keys[i], (long long)sample, (long long)id, (long long)rows[i] - 1);
      }
      j += buckets;
    }
    if (!st && nseg) st = be->kjt->segments(NULL, dp(len), sizeof(int32_t), seg, nseg);
    if (!st)
      st = be->kjt->offsets(NULL, dp(len), nb, dp(off), bag0, n, nv, val0, bad);
    nseg = 0;
    for (int32_t i = 0, j = 0; i < k->nkeys && !st; i++) {
      if (block[i] == 0) {
        seg[nseg++] = (ur__kjt_seg){kval + k->val0[i], val0[j], k->val0[i + 1] - k->val0[i]};
        j++;
        continue;
      }
      st = be->kjt->bucket_fill(NULL, koff + k->bag0[i], kval, dp(k->weights), k->spk[i],
                                block[i], buckets, (const int64_t *)dp(off) + bag0[j], dp(val),
                                dp(w));
      j += buckets;
    }
    if (!st && nseg) st = be->kjt->segments(NULL, dp(val), sizeof(int64_t), seg, nseg);
    if (!st && nseg && w) {
      for (int32_t i = 0; i < nseg; i++)
        seg[i].src = (const float *)dp(k->weights) + ((const int64_t *)seg[i].src - kval);
      st = be->kjt->segments(NULL, dp(w), sizeof(float), seg, nseg);
    }
    st = leave(be, k->values, prev, st);
  }
  if (!st)
    st = kjt_make(n, (const char *const *)names, k->stride, NULL, val, len, w, NULL, off, val0, 0,
                  out);
  if (!st) (*out)->checked = 1; /* counted bags of a checked k */
  for (int32_t j = 0; names && j < n; j++) free(names[j]);
  free(names);
  free(bag0);
  free(val0);
  free(seg);
  ur_tensor_free(len);
  ur_tensor_free(off);
  ur_tensor_free(val);
  ur_tensor_free(w);
  return st;
}

/* The backend finds each key's distinct bags (in order of first appearance) and every bag's
 * distinct one; the result gathers the distinct bags. */
ur_status ur_kjt_dedup(const ur_kjt *k, ur_kjt **out) {
  UR__ARGS(k, out);
  *out = NULL;
  if (k->variable)
    return ur__error(UR_STATUS_INVALID,
                     "kjt dedup: the KJT already has a variable batch per key; expand() it first");
  ur_status st = ur__kjt_need_checked(k, "kjt dedup");
  if (st) return st;
  int64_t nb = (int64_t)k->nkeys * k->stride;
  int64_t *spk = calloc((size_t)k->nkeys + 1, sizeof(int64_t));
  int64_t *val0 = calloc((size_t)k->nkeys + 1, sizeof(int64_t));
  ur_tensor *map = NULL, *inv = NULL;
  int32_t prev = 0;
  st = spk && val0 ? UR_STATUS_OK : ur__error(UR_STATUS_OOM, "kjt dedup: out of host memory");
  if (!st) st = new_like(&map, UR_DTYPE_I64, nb, k->values);
  if (!st) st = new_like(&inv, UR_DTYPE_I64, nb, k->values);
  if (!st && !(st = UR__NEED(k->be, kjt, dedup)) && !(st = enter(k->be, k->values, &prev))) {
    st = k->be->kjt->dedup(NULL, dp(k->offsets), dp(k->values), dp(k->weights),
                           dp(k->lengths), k->nkeys, k->stride, dp(map), dp(inv), spk, val0);
    st = leave(k->be, k->values, prev, st);
  }
  if (!st) {
    int64_t nu = 0;
    for (int32_t i = 0; i < k->nkeys; i++) nu += spk[i];
    st = gather_bags(k, map, nu, spk, inv, val0, 0, out);
  }
  ur_tensor_free(map);
  ur_tensor_free(inv);
  free(spk);
  free(val0);
  return st;
}

ur_status ur_kjt_expand(const ur_kjt *k, ur_kjt **out) {
  UR__ARGS(k, out);
  *out = NULL;
  ur_status st = ur__kjt_need_checked(k, "kjt expand");
  if (st) return st;
  int64_t n = (int64_t)k->nkeys * k->stride;
  int64_t *val0 = malloc(sizeof(int64_t) * ((size_t)k->nkeys + 1));
  ur_tensor *map = NULL;
  int32_t prev = 0;
  st = val0 ? UR_STATUS_OK : ur__error(UR_STATUS_OOM, "kjt expand: out of host memory");
  if (!st) st = new_like(&map, UR_DTYPE_I64, n, k->values);
  if (!st && !(st = UR__NEED(k->be, kjt, expand_map)) && !(st = enter(k->be, k->values, &prev))) {
    st = k->be->kjt->expand_map(NULL, dp(k->inverse), k->bag0, k->nkeys, k->stride, dp(map));
    st = leave(k->be, k->values, prev, st);
  }
  if (!st) st = gather_bags(k, map, n, NULL, NULL, val0, k->nkeys + 1, out);
  ur_tensor_free(map);
  free(val0);
  return st;
}

/* The rows' memory decides who gathers them: it is the work, and the result stays in its
 * placement.  A KJT whose memory that backend does not read lends its inverse indices
 * through a copy in the rows' placement, ordered on s.  Rows are read through the inverse
 * indices alone (a plain KJT's bags are its rows), so only a VBE batch needs them checked. */
ur_status ur_kjt_expand_rows(ur_stream *s, const ur_kjt *k, const ur_tensor *in,
                             ur_tensor **out) {
  UR__ARGS(k, in, out);
  *out = NULL;
  int64_t nb = k->bag0[k->nkeys];
  int nd = ur_tensor_ndim(in);
  if (ur_tensor_dim(in, 0) != nb)
    return ur__error(UR_STATUS_INVALID,
                     "kjt expand: the input has %lld rows but the KJT has %lld bags (one row per bag)",
                     (long long)ur_tensor_dim(in, 0), (long long)nb);
  ur_status st = k->inverse ? ur__kjt_need_checked(k, "kjt expand") : UR_STATUS_OK;
  if (st) return st;
  int64_t shape[UR_MAX_DIMS], row = 1;
  for (int i = 0; i < nd; i++) shape[i] = ur_tensor_dim(in, i);
  for (int i = 1; i < nd; i++) row *= shape[i];
  shape[0] = (int64_t)k->nkeys * k->stride;
  const ur_backend *be = ur__tensor_backend(in);
  ur_place place = ur_tensor_place(in);
  int32_t dev = ur_tensor_device(in), prev = 0;
  ur_tensor *o = NULL, *copy = NULL;
  const ur_tensor *inv = k->inverse;
  st = ur_tensor_new(&o, ur_tensor_dtype(in), nd, shape, place, dev);
  if (!st && inv && ur__tensor_backend(inv) != be &&
      !(st = ur_tensor_to(s, inv, &copy, place, dev)))
    inv = copy;
  if (!st && inv) st = ur__tensor_ready(be, inv);
  if (!st && !(st = UR__NEED(be, kjt, expand_rows)) && !(st = enter(be, in, &prev))) {
    st = be->kjt->expand_rows(s ? s->handle : NULL, dp(in),
                              (size_t)row * ur_dtype_size(ur_tensor_dtype(in)), dp(inv), k->bag0,
                              k->nkeys, k->stride, dp(o));
    st = leave(be, in, prev, st);
  }
  ur_tensor_free(copy);
  if (st) {
    ur_tensor_free(o);
    return st;
  }
  *out = o;
  return UR_STATUS_OK;
}

/* ---- from sample-major rows ---- */

static ur_status check_rows(const ur_tensor *t, const char *what, ur_dtype dt, int64_t n,
                            int64_t cols, const ur_tensor *ref) {
  if (ur_tensor_dtype(t) != dt || ur_tensor_ndim(t) != 2 || ur_tensor_dim(t, 0) != n ||
      ur_tensor_dim(t, 1) != cols)
    return ur__error(UR_STATUS_INVALID,
                     "kjt from_rows: %s must be %s [%lld, %lld]; got %s with %lld elements", what,
                     ur_dtype_name(dt), (long long)n, (long long)cols,
                     ur_dtype_name(ur_tensor_dtype(t)), (long long)ur_tensor_numel(t));
  return same_place("kjt from_rows", what, "is", t, "ids", ref);
}

static ur_status check_room(const ur_tensor *t, const char *what, ur_dtype dt, int64_t need,
                            const ur_tensor *ref) {
  if (ur_tensor_dtype(t) != dt || ur_tensor_ndim(t) != 1 || ur_tensor_numel(t) < need)
    return ur__error(UR_STATUS_INVALID,
                     "kjt from_rows: %s must be a 1-d %s tensor of at least %lld elements; got %s "
                     "with %lld", what, ur_dtype_name(dt), (long long)need,
                     ur_dtype_name(ur_tensor_dtype(t)), (long long)ur_tensor_numel(t));
  return same_place("kjt from_rows", what, "is", t, "ids", ref);
}

ur_status ur_kjt_from_rows(ur_stream *s, ur_kjt **out, int32_t num_keys, const char *const *keys,
                           const int32_t *hot, const ur_tensor *ids, const ur_tensor *weights,
                           const ur_tensor *lengths, ur_tensor *values, ur_tensor *lengths_out,
                           ur_tensor *offsets, ur_tensor *weights_out) {
  UR__ARGS(out, keys, hot, ids, values, lengths_out, offsets);
  *out = NULL;
  if (num_keys < 1)
    return ur__error(UR_STATUS_INVALID, "kjt from_rows: %d keys; expected at least one, with "
                     "names and ids per sample", (int)num_keys);
  ur_status dst = distinct_keys(num_keys, keys);
  if (dst) return dst;
  int64_t H = 0;
  for (int32_t k = 0; k < num_keys; k++) {
    if (hot[k] < 1)
      return ur__error(UR_STATUS_INVALID, "kjt from_rows: key '%s' takes %d ids a sample; "
                       "expected >= 1", keys[k] ? keys[k] : "?", (int)hot[k]);
    H += hot[k];
  }
  if (!ids || !values || !lengths_out || !offsets || !weights != !weights_out)
    return ur__error(UR_STATUS_INVALID, "kjt from_rows: ids, values, lengths and offsets are "
                     "required, and weights_out exactly when weights are given");
  int64_t n = ur_tensor_ndim(ids) == 2 ? ur_tensor_dim(ids, 0) : -1;
  ur_status st = check_rows(ids, "ids", UR_DTYPE_I64, n, H, ids);
  if (!st && weights) st = check_rows(weights, "weights", UR_DTYPE_F32, n, H, ids);
  if (!st && lengths) st = check_rows(lengths, "lengths", UR_DTYPE_I32, n, num_keys, ids);
  if (!st) st = check_room(values, "values", UR_DTYPE_I64, n * H, ids);
  if (!st) st = check_room(lengths_out, "lengths_out", UR_DTYPE_I32, n * num_keys, ids);
  if (!st) st = check_room(offsets, "offsets", UR_DTYPE_I64, n * num_keys + 1, ids);
  if (!st && weights_out) st = check_room(weights_out, "weights_out", UR_DTYPE_F32, n * H, ids);
  if (st) return st;
  int64_t *col0 = malloc(sizeof(int64_t) * ((size_t)num_keys + 1)),
          *val0 = malloc(sizeof(int64_t) * ((size_t)num_keys + 1)), bad = -1;
  if (!col0 || !val0) {
    free(col0);
    free(val0);
    return ur__error(UR_STATUS_OOM, "kjt from_rows: out of host memory");
  }
  col0[0] = 0;
  for (int32_t k = 0; k < num_keys; k++) col0[k + 1] = col0[k] + hot[k];
  /* every bag full: the key spans are the columns' (no wait for the device) */
  for (int32_t k = 0; k <= num_keys; k++) val0[k] = n * col0[k];
  const ur_backend *be = ur__tensor_backend(ids);
  int32_t prev = 0;
  if (!(st = UR__NEED(be, kjt, from_rows)) && !(st = enter(be, ids, &prev))) {
    st = be->kjt->from_rows(s ? s->handle : NULL, dp(ids), dp(weights), dp(lengths), n, num_keys,
                            H, col0, hot, dp(lengths_out), dp(offsets), dp(values),
                            dp(weights_out), lengths ? val0 : NULL, lengths ? &bad : NULL);
    st = leave(be, ids, prev, st);
  }
  if (!st && bad >= 0) {
    int32_t key = (int32_t)(bad / (n ? n : 1)), got = 0;
    st = ur_tensor_read(lengths, (bad % (n ? n : 1)) * num_keys + key, 1, &got);
    if (!st)
      st = ur__error(UR_STATUS_INVALID,
                     "kjt from_rows: key '%s' sample %lld has length %d; expected 0..%d (its ids "
                     "a sample)", keys[key] ? keys[key] : "?", (long long)(bad % (n ? n : 1)),
                     (int)got, (int)hot[key]);
  }
  ur_tensor *v = NULL, *l = NULL, *o = NULL, *w = NULL;
  if (!st) st = ur_tensor_view(values, &v, 0, val0[num_keys]);
  if (!st) st = ur_tensor_view(lengths_out, &l, 0, n * num_keys);
  if (!st) st = ur_tensor_view(offsets, &o, 0, n * num_keys + 1);
  if (!st && weights_out) st = ur_tensor_view(weights_out, &w, 0, val0[num_keys]);
  if (!st) st = kjt_make(num_keys, keys, n, NULL, v, l, w, NULL, o, val0, 0, out);
  if (!st) (*out)->checked = 1; /* lengths in 0..hot (checked above), offsets written with them */
  ur_tensor_free(v);
  ur_tensor_free(l);
  ur_tensor_free(o);
  ur_tensor_free(w);
  free(col0);
  free(val0);
  return st;
}

/* ---- placement ---- */

ur_status ur_kjt_to(ur_stream *s, const ur_kjt *k, ur_kjt **out, ur_place place,
                    int32_t device) {
  UR__ARGS(k, out);
  *out = NULL;
  ur_tensor *v = NULL, *l = NULL, *w = NULL, *inv = NULL, *off = NULL;
  ur_status st = ur_tensor_to(s, k->values, &v, place, device);
  if (!st) st = ur_tensor_to(s, k->lengths, &l, place, device);
  if (!st) st = ur_tensor_to(s, k->offsets, &off, place, device);
  if (!st && k->weights) st = ur_tensor_to(s, k->weights, &w, place, device);
  if (!st && k->inverse) st = ur_tensor_to(s, k->inverse, &inv, place, device);
  /* The key spans come from the source, so nothing waits for the copies. */
  if (!st)
    st = kjt_make(k->nkeys, (const char *const *)k->keys, k->stride,
                  k->variable ? k->spk : NULL, v, l, w, inv, off, k->val0, 0, out);
  if (!st) (*out)->checked = is_checked(k); /* the same contents */
  ur_tensor_free(v);
  ur_tensor_free(l);
  ur_tensor_free(w);
  ur_tensor_free(inv);
  ur_tensor_free(off);
  return st;
}

ur_status ur_kjt_copy(ur_stream *s, const ur_kjt *k, ur_tensor *const *into, ur_kjt **out) {
  UR__ARGS(k, into, out);
  *out = NULL;
  static const char *names[5] = {"values", "lengths", "offsets", "weights", "inverse_indices"};
  const ur_tensor *src[5] = {k->values, k->lengths, k->offsets, k->weights, k->inverse};
  ur_tensor *dst[5] = {NULL, NULL, NULL, NULL, NULL};
  ur_status st = UR_STATUS_OK;
  for (int i = 0; i < 5 && !st; i++) {
    if (!src[i]) continue;
    const ur_tensor *b = into ? into[i] : NULL;
    int64_t n = ur_tensor_numel(src[i]);
    if (!b)
      st = ur__error(UR_STATUS_INVALID, "kjt copy: no buffer for its %s", names[i]);
    else if (ur_tensor_ndim(b) != 1 || ur_tensor_dtype(b) != ur_tensor_dtype(src[i]) ||
             ur_tensor_numel(b) < n)
      st = ur__error(UR_STATUS_INVALID,
                     "kjt copy: the buffer for its %s is %s of %lld elements (%d-D); expected "
                     "1-D %s of at least %lld",
                     names[i], ur_dtype_name(ur_tensor_dtype(b)), (long long)ur_tensor_numel(b),
                     (int)ur_tensor_ndim(b), ur_dtype_name(ur_tensor_dtype(src[i])),
                     (long long)n);
    else if (!(st = ur_tensor_view(b, &dst[i], 0, n)))
      st = ur_tensor_copy(s, src[i], dst[i]);
  }
  /* The key spans come from the source, so nothing waits for the copies. */
  if (!st)
    st = kjt_make(k->nkeys, (const char *const *)k->keys, k->stride, k->variable ? k->spk : NULL,
                  dst[0], dst[1], dst[3], dst[4], dst[2], k->val0, 0, out);
  if (!st) (*out)->checked = is_checked(k); /* the same contents */
  for (int i = 0; i < 5; i++) ur_tensor_free(dst[i]);
  return st;
}
