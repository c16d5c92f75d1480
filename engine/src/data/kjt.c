/* kjt.c: keyed jagged tensors: construction with checked lengths, offsets, permute, split,
 * concat, dedup into a variable batch per key (VBE), expand back, and placement moves.
 * A KJT in device memory, or in managed memory with the CUDA backend loaded, is worked on by
 * the GPU (engine/src/cuda/kjt.cu), its results staying there; only sizes come back to the
 * host.  The host code below is the reference the GPU's results equal. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "data/kjt.h"

struct ur_kjt {
  int32_t nkeys;
  char **keys;
  int64_t stride;
  int64_t *spk;        /* bags per key (stride for every key unless VBE) */
  int64_t *bag0;       /* nkeys + 1: first bag of each key */
  int64_t *val0;       /* nkeys + 1: first value of each key */
  int variable;
  ur_tensor *values, *lengths, *offsets, *weights, *inverse;
};

/* ---- host access ---- */

/* A host pointer to t's elements: the tensor itself where the CPU can read it, else a
 * malloc'd copy left in *tmp for the caller to free. */
static const void *host_data(const ur_tensor *t, void **tmp, ur_status *st) {
  *tmp = NULL;
  *st = UR_STATUS_OK;
  if (!t) return NULL;
  if (ur_tensor_place(t) == UR_PLACE_DEVICE) {
    size_t bytes = (size_t)ur_tensor_nbytes(t);
    *tmp = malloc(bytes ? bytes : 1);
    if (!*tmp) {
      *st = ur__error(UR_STATUS_OOM, "kjt: out of host memory staging %zu bytes", bytes);
      return NULL;
    }
    if ((*st = ur_tensor_read(t, 0, ur_tensor_numel(t), *tmp))) return NULL;
    return *tmp;
  }
  if (ur__gpu() && ur_tensor_place(t) != UR_PLACE_HOST) {
    if ((*st = ur__gpu()->device_sync())) return NULL;
  }
  return ur_tensor_data(t);
}

static ur_status new_1d(ur_tensor **out, ur_dtype dt, int64_t n, ur_place place, int32_t dev) {
  return ur_tensor_new(out, dt, 1, &n, place, dev);
}

/* ---- the GPU ---- */

/* Whether work on t runs on the GPU: device memory, or managed memory with the backend. */
static int on_gpu(const ur_tensor *t) {
  ur_place p = ur_tensor_place(t);
  return ur__gpu() && (p == UR_PLACE_DEVICE || p == UR_PLACE_MANAGED);
}

static void *dp(const ur_tensor *t) { return t ? ur_tensor_data(t) : NULL; }

/* Kernels run on t's GPU (managed memory made for the CPU: the current one). */
static ur_status gpu_enter(const ur_tensor *t, int32_t *prev) {
  ur_status st = ur_device_get(prev);
  int32_t d = ur_tensor_device(t);
  if (!st && d >= 0 && d != *prev) st = ur_device_set(d);
  return st;
}

static ur_status gpu_leave(const ur_tensor *t, int32_t prev, ur_status st) {
  int32_t d = ur_tensor_device(t);
  if (d >= 0 && d != prev) {
    ur_status st2 = ur_device_set(prev);
    if (!st) st = st2;
  }
  return st;
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

/* The CPU's first error, from the GPU's first negative length (bad[0]) and first bag ending
 * past the values (bad[1]): whichever comes first in bag order. */
static ur_status gpu_offsets_error(const ur_kjt *k, const int64_t *bad, int64_t nv) {
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
                     "kjt: key '%s' lengths sum to %lld but %lld values remain (the bag of "
                     "sample %lld, lengths[%lld], ends past them)",
                     kname(k, key), (long long)(end - k->val0[key]),
                     (long long)(nv - k->val0[key]), (long long)(over - k->bag0[key]),
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
                       "kjt: lengths sum to %lld but there are %lld values (%lld left after the "
                       "last key, '%s')",
                       (long long)k->val0[k->nkeys], (long long)nv,
                       (long long)(nv - k->val0[k->nkeys]), kname(k, k->nkeys - 1));
    return ur__error(UR_STATUS_INVALID, "kjt: no keys, but %lld values", (long long)nv);
  }
  return UR_STATUS_OK;
}

/* Offsets by a scan on the GPU.  With val0 known (results of permute, split, concat) nothing
 * waits; else the key spans come back, with the checks. */
static ur_status gpu_offsets(ur_kjt *k, const int64_t *val0, int check) {
  int64_t nb = k->bag0[k->nkeys], nv = ur_tensor_numel(k->values);
  ur_status st = new_1d(&k->offsets, UR_DTYPE_I64, nb + 1, ur_tensor_place(k->values),
                        ur_tensor_device(k->values));
  if (st) return st;
  int64_t bad[2] = {-1, -1};
  int32_t prev = 0;
  if ((st = gpu_enter(k->values, &prev))) return st;
  st = ur__gpu()->kjt->offsets(NULL, dp(k->lengths), nb, dp(k->offsets), k->bag0, k->nkeys, nv,
                              val0 ? NULL : k->val0, bad);
  if ((st = gpu_leave(k->values, prev, st))) return st;
  if (val0) {
    memcpy(k->val0, val0, sizeof(int64_t) * (size_t)(k->nkeys + 1));
    return UR_STATUS_OK;
  }
  return check ? gpu_offsets_error(k, bad, nv) : UR_STATUS_OK;
}

/* Offsets from lengths: checks negative lengths and the sum against the values (when check),
 * and fills val0.  `given` (offsets already computed, e.g. by a copy) skips the work; val0
 * alone (a result whose key spans are known) lets the GPU's scan run without waiting. */
static ur_status make_offsets(ur_kjt *k, const ur_tensor *given, const int64_t *val0,
                              int check) {
  ur_place place = ur_tensor_place(k->values);
  int32_t dev = ur_tensor_device(k->values);
  int64_t nb = k->bag0[k->nkeys], nv = ur_tensor_numel(k->values);
  ur_status st;
  if (given) {
    if ((st = view_all(given, &k->offsets))) return st;
    if (val0) {
      memcpy(k->val0, val0, sizeof(int64_t) * (size_t)(k->nkeys + 1));
      return UR_STATUS_OK;
    }
    void *tmp;
    const int64_t *off = host_data(k->offsets, &tmp, &st);
    if (st) return st;
    for (int32_t i = 0; i <= k->nkeys; i++) k->val0[i] = off[k->bag0[i]];
    free(tmp);
    return UR_STATUS_OK;
  }
  if (on_gpu(k->lengths)) return gpu_offsets(k, val0, check);
  void *tmp;
  const int32_t *len = host_data(k->lengths, &tmp, &st);
  if (st) return st;
  int64_t *off = malloc(sizeof(int64_t) * (size_t)(nb + 1));
  if (!off) {
    free(tmp);
    return ur__error(UR_STATUS_OOM, "kjt: out of host memory for %lld offsets", (long long)nb + 1);
  }
  int64_t sum = 0;
  st = UR_STATUS_OK;
  for (int32_t key = 0; key < k->nkeys && !st; key++) {
    k->val0[key] = sum;
    for (int64_t b = k->bag0[key]; b < k->bag0[key + 1]; b++) {
      off[b] = sum;
      int32_t l = len[b];
      if (check && l < 0) {
        st = ur__error(UR_STATUS_INVALID,
                       "kjt: key '%s' sample %lld (lengths[%lld]) has length %d; lengths must be >= 0",
                       kname(k, key), (long long)(b - k->bag0[key]), (long long)b, (int)l);
        break;
      }
      sum += l;
      if (check && sum > nv) {
        int64_t end = sum;
        for (int64_t c = b + 1; c < k->bag0[key + 1]; c++) end += len[c] > 0 ? len[c] : 0;
        st = ur__error(UR_STATUS_INVALID,
                       "kjt: key '%s' lengths sum to %lld but %lld values remain (the bag of "
                       "sample %lld, lengths[%lld], ends past them)",
                       kname(k, key), (long long)(end - k->val0[key]),
                       (long long)(nv - k->val0[key]), (long long)(b - k->bag0[key]),
                       (long long)b);
        break;
      }
    }
  }
  if (!st && check && sum != nv) {
    if (k->nkeys)
      st = ur__error(UR_STATUS_INVALID,
                     "kjt: lengths sum to %lld but there are %lld values (%lld left after the last "
                     "key, '%s')",
                     (long long)sum, (long long)nv, (long long)(nv - sum), kname(k, k->nkeys - 1));
    else
      st = ur__error(UR_STATUS_INVALID, "kjt: no keys, but %lld values", (long long)nv);
  }
  k->val0[k->nkeys] = sum;
  off[nb] = sum;
  free(tmp);
  if (!st) st = new_1d(&k->offsets, UR_DTYPE_I64, nb + 1, place, dev);
  if (!st) st = ur_tensor_write(k->offsets, 0, nb + 1, off);
  free(off);
  return st;
}

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
                     "kjt: inverse_indices given without stride_per_key (a VBE batch needs both)");
  if (spk && !inverse)
    return ur__error(UR_STATUS_INVALID,
                     "kjt: stride_per_key given without inverse_indices (a VBE batch needs both)");
  const ur_tensor *all[] = {values, lengths, weights, inverse};
  const char *names[] = {"values", "lengths", "weights", "inverse_indices"};
  for (int i = 1; i < 4; i++) {
    if (!all[i]) continue;
    if (ur_tensor_place(all[i]) != ur_tensor_place(values) ||
        ur_tensor_device(all[i]) != ur_tensor_device(values))
      return ur__error(UR_STATUS_INVALID,
                       "kjt: %s are in %s (device %d) but values in %s (device %d); one placement "
                       "for all",
                       names[i], ur_place_name(ur_tensor_place(all[i])),
                       (int)ur_tensor_device(all[i]), ur_place_name(ur_tensor_place(values)),
                       (int)ur_tensor_device(values));
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
                     "kjt: %d keys with %lld bags in all (stride_per_key) need %lld lengths, got %lld",
                     (int)nkeys, (long long)nb, (long long)nb, (long long)ur_tensor_numel(lengths));
    else
      st = ur__error(UR_STATUS_INVALID,
                     "kjt: %d keys with stride %lld need %lld lengths, got %lld", (int)nkeys,
                     (long long)stride, (long long)nb, (long long)ur_tensor_numel(lengths));
    kjt_free_parts(k);
    return st;
  }
  if (weights && ur_tensor_numel(weights) != ur_tensor_numel(values)) {
    st = ur__error(UR_STATUS_INVALID, "kjt: %lld weights for %lld values; expected one per value",
                   (long long)ur_tensor_numel(weights), (long long)ur_tensor_numel(values));
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
  if ((st = view_all(values, &k->values)) || (st = view_all(lengths, &k->lengths)) ||
      (st = view_all(weights, &k->weights)) || (st = view_all(inverse, &k->inverse)) ||
      (st = make_offsets(k, offsets, val0, check))) {
    kjt_free_parts(k);
    return st;
  }
  *out = k;
  return UR_STATUS_OK;
}

ur_status ur_kjt_new(ur_kjt **out, int32_t num_keys, const char *const *keys, int64_t stride,
                     const int64_t *stride_per_key, ur_tensor *values, ur_tensor *lengths,
                     ur_tensor *weights, ur_tensor *inverse_indices, int32_t check) {
  ur_status st = kjt_make(num_keys, keys, stride, stride_per_key, values, lengths, weights,
                          inverse_indices, NULL, NULL, check, out);
  if (!st && check && inverse_indices && (st = ur_kjt_validate(*out, NULL))) {
    ur_kjt_free(*out);
    *out = NULL;
  }
  return st;
}

/* ---- accessors ---- */

int32_t ur_kjt_num_keys(const ur_kjt *k) { return k->nkeys; }
const char *ur_kjt_key(const ur_kjt *k, int32_t i) {
  return i >= 0 && i < k->nkeys ? k->keys[i] : NULL;
}
int32_t ur_kjt_key_index(const ur_kjt *k, const char *key) {
  for (int32_t i = 0; i < k->nkeys; i++)
    if (!strcmp(k->keys[i], key)) return i;
  return -1;
}
int64_t ur_kjt_stride(const ur_kjt *k) { return k->stride; }
int64_t ur_kjt_stride_of(const ur_kjt *k, int32_t i) {
  return i >= 0 && i < k->nkeys ? k->spk[i] : -1;
}
int32_t ur_kjt_variable_stride(const ur_kjt *k) { return k->variable; }
const ur_tensor *ur_kjt_values(const ur_kjt *k) { return k->values; }
const ur_tensor *ur_kjt_lengths(const ur_kjt *k) { return k->lengths; }
const ur_tensor *ur_kjt_offsets(const ur_kjt *k) { return k->offsets; }
const ur_tensor *ur_kjt_weights(const ur_kjt *k) { return k->weights; }
const ur_tensor *ur_kjt_inverse_indices(const ur_kjt *k) { return k->inverse; }

ur_status ur_kjt_key_span(const ur_kjt *k, int32_t i, int64_t *bag0, int64_t *bag1,
                          int64_t *value0, int64_t *value1) {
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

/* The GPU finds the first bad bag, the first bag with a bad id and the first bad inverse
 * index; the CPU's error is the one of the lowest key (bags, then ids, then inverse indices
 * within a key), and its message is made from a few elements read back. */
static ur_status gpu_validate(const ur_kjt *k, const int64_t *rows) {
  int64_t bad[3] = {-1, -1, -1}, nv = ur_tensor_numel(k->values);
  int32_t prev = 0;
  ur_status st = gpu_enter(k->values, &prev);
  if (!st)
    st = ur__gpu()->kjt->validate(NULL, dp(k->lengths), dp(k->offsets), dp(k->values),
                                 dp(k->inverse), nv, k->nkeys, k->stride, k->bag0, k->spk, rows,
                                 bad);
  if ((st = gpu_leave(k->values, prev, st))) return st;
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
                       "kjt: key '%s' sample %lld (lengths[%lld]) has length %d; lengths must be >= 0",
                       kname(k, key), (long long)(b - k->bag0[key]), (long long)b, (int)l);
    return ur__error(UR_STATUS_INVALID,
                     "kjt: key '%s' sample %lld: offsets %lld..%lld disagree with length %d "
                     "or pass the %lld values",
                     kname(k, key), (long long)(b - k->bag0[key]), (long long)off[0],
                     (long long)off[1], (int)l, (long long)nv);
  }
  if (ki != none && ki <= kv) {
    int64_t b = bad[1], off[2];
    int32_t key = (int32_t)ki;
    if ((st = ur_tensor_read(k->offsets, b, 2, off))) return st;
    int64_t n = off[1] - off[0];
    int64_t *ids = malloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1));
    if (!ids) return ur__error(UR_STATUS_OOM, "kjt: out of host memory");
    st = ur_tensor_read(k->values, off[0], n, ids);
    for (int64_t v = 0; v < n && !st; v++)
      if (ids[v] < 0 || ids[v] >= rows[key])
        st = ur__error(UR_STATUS_INVALID,
                       "kjt: key '%s' sample %lld (values[%lld]) has id %lld, outside the "
                       "table's %lld rows",
                       kname(k, key), (long long)(b - k->bag0[key]), (long long)(off[0] + v),
                       (long long)ids[v], (long long)rows[key]);
    free(ids);
    if (!st)
      st = ur__error(UR_STATUS_DEVICE, "kjt: the GPU found a bad id in bag %lld of key '%s' that "
                     "the host does not see", (long long)b, kname(k, key));
    return st;
  }
  if (kv != none) {
    int64_t i = bad[2], x = 0;
    int32_t key = (int32_t)kv;
    if ((st = ur_tensor_read(k->inverse, i, 1, &x))) return st;
    return ur__error(UR_STATUS_INVALID,
                     "kjt: key '%s' sample %lld has inverse index %lld; expected 0..%lld "
                     "(the key's stride is %lld)",
                     kname(k, key), (long long)(i - kv * k->stride), (long long)x,
                     (long long)k->spk[key] - 1, (long long)k->spk[key]);
  }
  if (k->val0[k->nkeys] != nv)
    return ur__error(UR_STATUS_INVALID, "kjt: lengths sum to %lld but there are %lld values",
                     (long long)k->val0[k->nkeys], (long long)nv);
  return UR_STATUS_OK;
}

ur_status ur_kjt_validate(const ur_kjt *k, const int64_t *rows) {
  if (on_gpu(k->values)) return gpu_validate(k, rows);
  ur_status st = UR_STATUS_OK;
  void *t1 = NULL, *t2 = NULL, *t3 = NULL, *t4 = NULL;
  const int32_t *len = host_data(k->lengths, &t1, &st);
  const int64_t *off = st ? NULL : host_data(k->offsets, &t2, &st);
  const int64_t *val = st ? NULL : host_data(k->values, &t3, &st);
  const int64_t *inv = st || !k->inverse ? NULL : host_data(k->inverse, &t4, &st);
  int64_t nv = ur_tensor_numel(k->values);
  for (int32_t key = 0; key < k->nkeys && !st; key++) {
    for (int64_t b = k->bag0[key]; b < k->bag0[key + 1] && !st; b++) {
      if (len[b] < 0)
        st = ur__error(UR_STATUS_INVALID,
                       "kjt: key '%s' sample %lld (lengths[%lld]) has length %d; lengths must be >= 0",
                       kname(k, key), (long long)(b - k->bag0[key]), (long long)b, (int)len[b]);
      else if (off[b + 1] - off[b] != len[b] || off[b] < 0 || off[b + 1] > nv)
        st = ur__error(UR_STATUS_INVALID,
                       "kjt: key '%s' sample %lld: offsets %lld..%lld disagree with length %d "
                       "or pass the %lld values",
                       kname(k, key), (long long)(b - k->bag0[key]), (long long)off[b],
                       (long long)off[b + 1], (int)len[b], (long long)nv);
    }
    if (!st && rows && rows[key] > 0) {
      for (int64_t b = k->bag0[key]; b < k->bag0[key + 1] && !st; b++)
        for (int64_t v = off[b]; v < off[b + 1]; v++)
          if (val[v] < 0 || val[v] >= rows[key]) {
            st = ur__error(UR_STATUS_INVALID,
                           "kjt: key '%s' sample %lld (values[%lld]) has id %lld, outside the "
                           "table's %lld rows",
                           kname(k, key), (long long)(b - k->bag0[key]), (long long)v,
                           (long long)val[v], (long long)rows[key]);
            break;
          }
    }
    if (!st && inv) {
      for (int64_t b = 0; b < k->stride; b++) {
        int64_t x = inv[key * k->stride + b];
        if (x < 0 || x >= k->spk[key]) {
          st = ur__error(UR_STATUS_INVALID,
                         "kjt: key '%s' sample %lld has inverse index %lld; expected 0..%lld "
                         "(the key's stride is %lld)",
                         kname(k, key), (long long)b, (long long)x, (long long)k->spk[key] - 1,
                         (long long)k->spk[key]);
          break;
        }
      }
    }
  }
  if (!st && k->val0[k->nkeys] != nv)
    st = ur__error(UR_STATUS_INVALID, "kjt: lengths sum to %lld but there are %lld values",
                   (long long)k->val0[k->nkeys], (long long)nv);
  free(t1);
  free(t2);
  free(t3);
  free(t4);
  return st;
}

/* ---- building results ---- */

/* A result assembled in host memory, then moved to the input's placement; or, made by the
 * GPU, in that placement from the start, with its key spans (val0) known. */
typedef struct build {
  int32_t nkeys;
  const char **keys;
  int64_t stride;
  int64_t *spk;        /* NULL: not VBE */
  int64_t nvalues, nbags;
  int weighted;
  ur_tensor *values, *lengths, *weights, *inverse;
  ur_place place;      /* placement the buffers live in */
  ur_place want;       /* the result's placement */
  int32_t device;
  int64_t *val0;       /* GPU results: nkeys + 1 first values */
} build;

static ur_status build_alloc(build *b, ur_place want, int32_t device) {
  b->want = want;
  b->device = device;
  b->place = want == UR_PLACE_DEVICE && !b->val0 ? UR_PLACE_HOST : want;
  int32_t hd = b->place == UR_PLACE_HOST || b->place == UR_PLACE_PINNED ? UR_LOC_CPU : device;
  ur_status st = new_1d(&b->values, UR_DTYPE_I64, b->nvalues, b->place, hd);
  if (!st) st = new_1d(&b->lengths, UR_DTYPE_I32, b->nbags, b->place, hd);
  if (!st && b->weighted) st = new_1d(&b->weights, UR_DTYPE_F32, b->nvalues, b->place, hd);
  if (!st && b->spk)
    st = new_1d(&b->inverse, UR_DTYPE_I64, (int64_t)b->nkeys * b->stride, b->place, hd);
  return st;
}

static void build_free(build *b) {
  ur_tensor_free(b->values);
  ur_tensor_free(b->lengths);
  ur_tensor_free(b->weights);
  ur_tensor_free(b->inverse);
  free(b->spk);
  free(b->keys);
  free(b->val0);
}

static ur_status move_to(ur_tensor **t, ur_place place, int32_t device) {
  if (!*t) return UR_STATUS_OK;
  ur_tensor *d;
  ur_status st = ur_tensor_to(NULL, *t, &d, place, device);
  if (st) return st;
  ur_tensor_free(*t);
  *t = d;
  return UR_STATUS_OK;
}

static ur_status build_finish(build *b, ur_kjt **out) {
  ur_status st = UR_STATUS_OK;
  if (b->want != b->place) {
    if (!st) st = move_to(&b->values, b->want, b->device);
    if (!st) st = move_to(&b->lengths, b->want, b->device);
    if (!st) st = move_to(&b->weights, b->want, b->device);
    if (!st) st = move_to(&b->inverse, b->want, b->device);
  }
  if (!st)
    st = kjt_make(b->nkeys, b->keys, b->stride, b->spk, b->values, b->lengths, b->weights,
                  b->inverse, NULL, b->val0, 0, out);
  build_free(b);
  return st;
}

/* Host pointers to a KJT's parts (staged when on the device). */
typedef struct hostkjt {
  const int64_t *val, *off, *inv;
  const int32_t *len;
  const float *w;
  void *tmp[5];
} hostkjt;

static ur_status host_kjt(const ur_kjt *k, hostkjt *h) {
  ur_status st = UR_STATUS_OK;
  memset(h, 0, sizeof *h);
  h->val = host_data(k->values, &h->tmp[0], &st);
  if (!st) h->len = host_data(k->lengths, &h->tmp[1], &st);
  if (!st) h->off = host_data(k->offsets, &h->tmp[2], &st);
  if (!st && k->weights) h->w = host_data(k->weights, &h->tmp[3], &st);
  if (!st && k->inverse) h->inv = host_data(k->inverse, &h->tmp[4], &st);
  return st;
}

static void host_kjt_free(hostkjt *h) {
  for (int i = 0; i < 5; i++) free(h->tmp[i]);
}

/* ---- permute, split, concat ---- */

/* Segment copies on the GPU, array by array (seg[a * n ...]: values, weights, lengths,
 * inverse indices), into b's tensors, allocated here in the result's placement. */
static ur_status gpu_assemble(const ur_tensor *like, build *b, const ur__kjt_seg *seg, int64_t n) {
  ur_status st = build_alloc(b, ur_tensor_place(like), ur_tensor_device(like));
  if (st) return st;
  int32_t prev = 0;
  const ur_backend *g = ur__gpu();
  if ((st = gpu_enter(like, &prev))) return st;
  st = g->kjt->segments(NULL, dp(b->values), sizeof(int64_t), seg, n);
  if (!st && b->weights) st = g->kjt->segments(NULL, dp(b->weights), sizeof(float), seg + n, n);
  if (!st) st = g->kjt->segments(NULL, dp(b->lengths), sizeof(int32_t), seg + 2 * n, n);
  if (!st && b->inverse) st = g->kjt->segments(NULL, dp(b->inverse), sizeof(int64_t), seg + 3 * n, n);
  return gpu_leave(like, prev, st);
}

/* One run per key (and array); the offsets are scanned from the lengths, nothing waits. */
static ur_status gpu_permute(const ur_kjt *k, const int32_t *order, int32_t n, build *b,
                             ur_kjt **out) {
  ur__kjt_seg *seg = malloc(sizeof *seg * 4 * (size_t)(n > 0 ? n : 1));
  b->val0 = malloc(sizeof(int64_t) * ((size_t)n + 1));
  if (!seg || !b->val0) {
    free(seg);
    build_free(b);
    return ur__error(UR_STATUS_OOM, "kjt permute: out of host memory");
  }
  const char *val = dp(k->values), *w = dp(k->weights), *len = dp(k->lengths),
             *inv = dp(k->inverse);
  int64_t vo = 0, bo = 0;
  for (int32_t j = 0; j < n; j++) {
    int32_t s = order[j];
    int64_t nv = k->val0[s + 1] - k->val0[s], nb = k->spk[s];
    b->val0[j] = vo;
    seg[j] = (ur__kjt_seg){val + 8 * k->val0[s], vo, nv};
    seg[n + j] = (ur__kjt_seg){w ? w + 4 * k->val0[s] : NULL, vo, nv};
    seg[2 * n + j] = (ur__kjt_seg){len + 4 * k->bag0[s], bo, nb};
    seg[3 * n + j] = (ur__kjt_seg){inv ? inv + 8 * (int64_t)s * k->stride : NULL,
                                   (int64_t)j * k->stride, k->stride};
    vo += nv;
    bo += nb;
  }
  b->val0[n] = vo;
  ur_status st = gpu_assemble(k->values, b, seg, n);
  free(seg);
  if (st) {
    build_free(b);
    return st;
  }
  return build_finish(b, out);
}

/* One run per part (and array). */
static ur_status gpu_concat(const ur_kjt *const *parts, int32_t n, build *b, ur_kjt **out) {
  ur__kjt_seg *seg = malloc(sizeof *seg * 4 * (size_t)n);
  b->val0 = malloc(sizeof(int64_t) * ((size_t)b->nkeys + 1));
  if (!seg || !b->val0) {
    free(seg);
    build_free(b);
    return ur__error(UR_STATUS_OOM, "kjt concat: out of host memory");
  }
  int64_t vo = 0, bo = 0, ko = 0;
  for (int32_t j = 0; j < n; j++) {
    const ur_kjt *p = parts[j];
    int64_t nv = ur_tensor_numel(p->values), nb = p->bag0[p->nkeys];
    seg[j] = (ur__kjt_seg){dp(p->values), vo, nv};
    seg[n + j] = (ur__kjt_seg){dp(p->weights), vo, nv};
    seg[2 * n + j] = (ur__kjt_seg){dp(p->lengths), bo, nb};
    seg[3 * n + j] = (ur__kjt_seg){dp(p->inverse), ko * b->stride, p->nkeys * b->stride};
    for (int32_t i = 0; i < p->nkeys; i++) {
      b->keys[ko + i] = p->keys[i];
      if (b->spk) b->spk[ko + i] = p->spk[i];
      b->val0[ko + i] = vo + p->val0[i];
    }
    vo += nv;
    bo += nb;
    ko += p->nkeys;
  }
  b->val0[b->nkeys] = vo;
  ur_status st = gpu_assemble(parts[0]->values, b, seg, n);
  free(seg);
  if (st) {
    build_free(b);
    return st;
  }
  return build_finish(b, out);
}

ur_status ur_kjt_permute(const ur_kjt *k, const int32_t *order, int32_t n, ur_kjt **out) {
  *out = NULL;
  if (n < 0) return ur__error(UR_STATUS_INVALID, "kjt permute: %d keys asked", (int)n);
  for (int32_t j = 0; j < n; j++)
    if (order[j] < 0 || order[j] >= k->nkeys)
      return ur__error(UR_STATUS_INVALID,
                       "kjt permute: position %d asks for key %d; the KJT has keys 0..%d", (int)j,
                       (int)order[j], (int)k->nkeys - 1);
  build b = {0};
  b.nkeys = n;
  b.stride = k->stride;
  b.weighted = k->weights != NULL;
  b.keys = calloc((size_t)n + 1, sizeof(char *));
  if (k->variable) b.spk = calloc((size_t)n + 1, sizeof(int64_t));
  if (!b.keys || (k->variable && !b.spk)) {
    build_free(&b);
    return ur__error(UR_STATUS_OOM, "kjt permute: out of host memory");
  }
  for (int32_t j = 0; j < n; j++) {
    int32_t s = order[j];
    b.keys[j] = k->keys[s];
    if (b.spk) b.spk[j] = k->spk[s];
    b.nbags += k->spk[s];
    b.nvalues += k->val0[s + 1] - k->val0[s];
  }
  if (on_gpu(k->values)) return gpu_permute(k, order, n, &b, out);
  hostkjt h;
  ur_status st = host_kjt(k, &h);
  if (!st) st = build_alloc(&b, ur_tensor_place(k->values), ur_tensor_device(k->values));
  if (st) {
    host_kjt_free(&h);
    build_free(&b);
    return st;
  }
  int64_t *val = ur_tensor_data(b.values), *inv = b.inverse ? ur_tensor_data(b.inverse) : NULL;
  int32_t *len = ur_tensor_data(b.lengths);
  float *w = b.weights ? ur_tensor_data(b.weights) : NULL;
  int64_t vo = 0, bo = 0;
  for (int32_t j = 0; j < n; j++) {
    int32_t s = order[j];
    int64_t nv = k->val0[s + 1] - k->val0[s], nb = k->spk[s];
    memcpy(val + vo, h.val + k->val0[s], sizeof(int64_t) * (size_t)nv);
    if (w) memcpy(w + vo, h.w + k->val0[s], sizeof(float) * (size_t)nv);
    memcpy(len + bo, h.len + k->bag0[s], sizeof(int32_t) * (size_t)nb);
    if (inv)
      memcpy(inv + (int64_t)j * k->stride, h.inv + (int64_t)s * k->stride,
             sizeof(int64_t) * (size_t)k->stride);
    vo += nv;
    bo += nb;
  }
  host_kjt_free(&h);
  return build_finish(&b, out);
}

/* Consecutive keys share storage with the input: the parts are views. */
ur_status ur_kjt_split(const ur_kjt *k, const int32_t *sizes, int32_t n, ur_kjt **outs) {
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
  int32_t k0 = 0;
  ur_status st = UR_STATUS_OK;
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
  *out = NULL;
  if (n < 1) return ur__error(UR_STATUS_INVALID, "kjt concat: no parts");
  const ur_kjt *p0 = parts[0];
  build b = {0};
  b.stride = p0->stride;
  b.weighted = p0->weights != NULL;
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
    if (ur_tensor_place(p->values) != ur_tensor_place(p0->values) ||
        ur_tensor_device(p->values) != ur_tensor_device(p0->values))
      return ur__error(UR_STATUS_INVALID, "kjt concat: part %d is in %s but part 1 in %s",
                       (int)j + 1, ur_place_name(ur_tensor_place(p->values)),
                       ur_place_name(ur_tensor_place(p0->values)));
    b.nkeys += p->nkeys;
    b.nvalues += ur_tensor_numel(p->values);
    b.nbags += p->bag0[p->nkeys];
  }
  ur_status dup = concat_duplicate(parts, n, b.nkeys);
  if (dup) return dup;
  b.keys = calloc((size_t)b.nkeys + 1, sizeof(char *));
  if (p0->variable) b.spk = calloc((size_t)b.nkeys + 1, sizeof(int64_t));
  if (!b.keys || (p0->variable && !b.spk)) {
    build_free(&b);
    return ur__error(UR_STATUS_OOM, "kjt concat: out of host memory");
  }
  if (on_gpu(p0->values)) return gpu_concat(parts, n, &b, out);
  ur_status st = build_alloc(&b, ur_tensor_place(p0->values), ur_tensor_device(p0->values));
  int64_t vo = 0, bo = 0, ko = 0;
  for (int32_t j = 0; j < n && !st; j++) {
    const ur_kjt *p = parts[j];
    hostkjt h;
    if ((st = host_kjt(p, &h))) {
      host_kjt_free(&h);
      break;
    }
    int64_t nv = ur_tensor_numel(p->values), nb = p->bag0[p->nkeys];
    memcpy((int64_t *)ur_tensor_data(b.values) + vo, h.val, sizeof(int64_t) * (size_t)nv);
    if (b.weights) memcpy((float *)ur_tensor_data(b.weights) + vo, h.w, sizeof(float) * (size_t)nv);
    memcpy((int32_t *)ur_tensor_data(b.lengths) + bo, h.len, sizeof(int32_t) * (size_t)nb);
    if (b.inverse)
      memcpy((int64_t *)ur_tensor_data(b.inverse) + ko * b.stride, h.inv,
             sizeof(int64_t) * (size_t)(p->nkeys * b.stride));
    for (int32_t i = 0; i < p->nkeys; i++) {
      b.keys[ko + i] = p->keys[i];
      if (b.spk) b.spk[ko + i] = p->spk[i];
    }
    vo += nv;
    bo += nb;
    ko += p->nkeys;
    host_kjt_free(&h);
  }
  if (st) {
    build_free(&b);
    return st;
  }
  return build_finish(&b, out);
}

/* ---- dedup and expand ---- */

static uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

static uint64_t bag_hash(const int64_t *v, const float *w, int64_t n) {
  uint64_t h = 0x9e3779b97f4a7c15ull ^ (uint64_t)n;
  for (int64_t i = 0; i < n; i++) {
    h = mix64(h ^ (uint64_t)v[i]);
    if (w) {
      uint32_t bits;
      memcpy(&bits, &w[i], 4);
      h = mix64(h ^ bits);
    }
  }
  return h;
}

static int bag_equal(const hostkjt *h, int64_t a, int64_t b) {
  int64_t na = h->off[a + 1] - h->off[a];
  if (na != h->off[b + 1] - h->off[b]) return 0;
  if (memcmp(h->val + h->off[a], h->val + h->off[b], sizeof(int64_t) * (size_t)na)) return 0;
  return !h->w || !memcmp(h->w + h->off[a], h->w + h->off[b], sizeof(float) * (size_t)na);
}

/* The result's bags gathered by map [n] (each result bag's bag in k), with its offsets; at
 * (nat > 0) takes the result's offsets at every step-th bag (waiting for them). */
static ur_status gpu_gather_bags(const ur_kjt *k, const ur_tensor *map, int64_t n,
                                 ur_tensor **len, ur_tensor **off, int64_t step, int32_t nat,
                                 int64_t *at) {
  ur_place place = ur_tensor_place(k->values);
  int32_t dev = ur_tensor_device(k->values);
  ur_status st = new_1d(len, UR_DTYPE_I32, n, place, dev);
  if (!st) st = new_1d(off, UR_DTYPE_I64, n + 1, place, dev);
  if (!st)
    st = ur__gpu()->kjt->bag_lengths(NULL, dp(k->lengths), dp(map), n, dp(*len), dp(*off), step,
                                    nat, at);
  return st;
}

/* Values and weights of the gathered bags; then the result, its spans known. */
static ur_status gpu_finish_bags(const ur_kjt *k, const ur_tensor *map, int64_t n,
                                 ur_tensor *len, ur_tensor *off, const int64_t *spk,
                                 ur_tensor *inv, const int64_t *val0, ur_kjt **out) {
  ur_place place = ur_tensor_place(k->values);
  int32_t dev = ur_tensor_device(k->values);
  ur_tensor *v = NULL, *w = NULL;
  ur_status st = new_1d(&v, UR_DTYPE_I64, val0[k->nkeys], place, dev);
  if (!st && k->weights) st = new_1d(&w, UR_DTYPE_F32, val0[k->nkeys], place, dev);
  if (!st)
    st = ur__gpu()->kjt->bag_copy(NULL, dp(k->offsets), dp(k->values), dp(k->weights), dp(map), n,
                                 dp(off), dp(v), dp(w));
  if (!st)
    st = kjt_make(k->nkeys, (const char *const *)k->keys, k->stride, spk, v, len, w, inv, off,
                  val0, 0, out);
  ur_tensor_free(v);
  ur_tensor_free(w);
  return st;
}

/* Sorted by hash within each key, equal bags found by comparing runs: see kernels/kjt.cu. */
static ur_status gpu_dedup(const ur_kjt *k, ur_kjt **out) {
  int64_t nb = (int64_t)k->nkeys * k->stride;
  ur_place place = ur_tensor_place(k->values);
  int32_t dev = ur_tensor_device(k->values);
  int64_t *spk = calloc((size_t)k->nkeys + 1, sizeof(int64_t));
  int64_t *val0 = calloc((size_t)k->nkeys + 1, sizeof(int64_t));
  ur_tensor *map = NULL, *inv = NULL, *len = NULL, *off = NULL;
  int32_t prev = 0;
  ur_status st = spk && val0 ? UR_STATUS_OK : ur__error(UR_STATUS_OOM, "kjt dedup: out of host memory");
  if (!st) st = new_1d(&map, UR_DTYPE_I64, nb, place, dev);
  if (!st) st = new_1d(&inv, UR_DTYPE_I64, nb, place, dev);
  if (!st && !(st = gpu_enter(k->values, &prev))) {
    st = ur__gpu()->kjt->dedup(NULL, dp(k->offsets), dp(k->values), dp(k->weights),
                              dp(k->lengths), k->nkeys, k->stride, dp(map), dp(inv), spk, val0);
    int64_t nu = 0;
    for (int32_t i = 0; i < k->nkeys; i++) nu += spk[i];
    if (!st) st = gpu_gather_bags(k, map, nu, &len, &off, 0, 0, NULL);
    if (!st) st = gpu_finish_bags(k, map, nu, len, off, spk, inv, val0, out);
    st = gpu_leave(k->values, prev, st);
  }
  ur_tensor_free(map);
  ur_tensor_free(inv);
  ur_tensor_free(len);
  ur_tensor_free(off);
  free(spk);
  free(val0);
  return st;
}

static ur_status gpu_expand(const ur_kjt *k, ur_kjt **out) {
  int64_t n = (int64_t)k->nkeys * k->stride;
  ur_tensor *map = NULL, *len = NULL, *off = NULL;
  int64_t *val0 = malloc(sizeof(int64_t) * ((size_t)k->nkeys + 1));
  int32_t prev = 0;
  ur_status st = val0 ? UR_STATUS_OK : ur__error(UR_STATUS_OOM, "kjt expand: out of host memory");
  if (!st) st = new_1d(&map, UR_DTYPE_I64, n, ur_tensor_place(k->values), ur_tensor_device(k->values));
  if (!st && !(st = gpu_enter(k->values, &prev))) {
    st = ur__gpu()->kjt->expand_map(NULL, dp(k->inverse), k->bag0, k->nkeys, k->stride, dp(map));
    if (!st) st = gpu_gather_bags(k, map, n, &len, &off, k->stride, k->nkeys + 1, val0);
    if (!st) st = gpu_finish_bags(k, map, n, len, off, NULL, NULL, val0, out);
    st = gpu_leave(k->values, prev, st);
  }
  ur_tensor_free(map);
  ur_tensor_free(len);
  ur_tensor_free(off);
  free(val0);
  return st;
}

ur_status ur_kjt_dedup(const ur_kjt *k, ur_kjt **out) {
  *out = NULL;
  if (k->variable)
    return ur__error(UR_STATUS_INVALID,
                     "kjt dedup: the KJT already has a variable batch per key; expand() it first");
  if (on_gpu(k->values)) return gpu_dedup(k, out);
  hostkjt h;
  ur_status st = host_kjt(k, &h);
  if (st) {
    host_kjt_free(&h);
    return st;
  }
  int64_t B = k->stride;
  size_t cap = 16;
  while (cap < (size_t)B * 2) cap <<= 1;
  int64_t *table = malloc(sizeof(int64_t) * cap);
  int64_t *first = malloc(sizeof(int64_t) * (size_t)(k->nkeys * B + 1)); /* unique -> bag */
  build b = {0};
  b.nkeys = k->nkeys;
  b.stride = B;
  b.weighted = k->weights != NULL;
  b.keys = calloc((size_t)k->nkeys + 1, sizeof(char *));
  b.spk = calloc((size_t)k->nkeys + 1, sizeof(int64_t));
  int64_t *inv = malloc(sizeof(int64_t) * (size_t)(k->nkeys * B + 1));
  if (!table || !first || !b.keys || !b.spk || !inv) {
    free(table);
    free(first);
    free(inv);
    build_free(&b);
    host_kjt_free(&h);
    return ur__error(UR_STATUS_OOM, "kjt dedup: out of host memory");
  }
  int64_t nu = 0;
  for (int32_t key = 0; key < k->nkeys; key++) {
    b.keys[key] = k->keys[key];
    for (size_t i = 0; i < cap; i++) table[i] = -1;
    int64_t u0 = nu;
    for (int64_t s = 0; s < B; s++) {
      int64_t bag = k->bag0[key] + s;
      uint64_t hv = bag_hash(h.val + h.off[bag], h.w ? h.w + h.off[bag] : NULL,
                             h.off[bag + 1] - h.off[bag]);
      size_t slot = (size_t)hv & (cap - 1);
      int64_t found = -1;
      while (table[slot] >= 0) {
        if (bag_equal(&h, first[table[slot]], bag)) {
          found = table[slot];
          break;
        }
        slot = (slot + 1) & (cap - 1);
      }
      if (found < 0) {
        found = nu;
        first[nu++] = bag;
        table[slot] = found;
      }
      inv[key * B + s] = found - u0;
    }
    b.spk[key] = nu - u0;
    b.nbags += nu - u0;
  }
  for (int64_t u = 0; u < nu; u++) b.nvalues += h.off[first[u] + 1] - h.off[first[u]];
  st = build_alloc(&b, ur_tensor_place(k->values), ur_tensor_device(k->values));
  if (!st) {
    int64_t *val = ur_tensor_data(b.values);
    int32_t *len = ur_tensor_data(b.lengths);
    float *w = b.weights ? ur_tensor_data(b.weights) : NULL;
    int64_t vo = 0;
    for (int64_t u = 0; u < nu; u++) {
      int64_t bag = first[u], n = h.off[bag + 1] - h.off[bag];
      memcpy(val + vo, h.val + h.off[bag], sizeof(int64_t) * (size_t)n);
      if (w) memcpy(w + vo, h.w + h.off[bag], sizeof(float) * (size_t)n);
      len[u] = (int32_t)n;
      vo += n;
    }
    memcpy(ur_tensor_data(b.inverse), inv, sizeof(int64_t) * (size_t)(k->nkeys * B));
  }
  free(table);
  free(first);
  free(inv);
  host_kjt_free(&h);
  if (st) {
    build_free(&b);
    return st;
  }
  return build_finish(&b, out);
}

ur_status ur_kjt_expand(const ur_kjt *k, ur_kjt **out) {
  *out = NULL;
  if (on_gpu(k->values)) return gpu_expand(k, out);
  hostkjt h;
  ur_status st = host_kjt(k, &h);
  if (st) {
    host_kjt_free(&h);
    return st;
  }
  int64_t B = k->stride;
  build b = {0};
  b.nkeys = k->nkeys;
  b.stride = B;
  b.weighted = k->weights != NULL;
  b.nbags = (int64_t)k->nkeys * B;
  b.keys = calloc((size_t)k->nkeys + 1, sizeof(char *));
  if (!b.keys) {
    host_kjt_free(&h);
    return ur__error(UR_STATUS_OOM, "kjt expand: out of host memory");
  }
  for (int32_t key = 0; key < k->nkeys; key++) {
    b.keys[key] = k->keys[key];
    for (int64_t s = 0; s < B; s++) {
      int64_t bag = k->bag0[key] + (h.inv ? h.inv[key * B + s] : s);
      b.nvalues += h.off[bag + 1] - h.off[bag];
    }
  }
  st = build_alloc(&b, ur_tensor_place(k->values), ur_tensor_device(k->values));
  if (!st) {
    int64_t *val = ur_tensor_data(b.values);
    int32_t *len = ur_tensor_data(b.lengths);
    float *w = b.weights ? ur_tensor_data(b.weights) : NULL;
    int64_t vo = 0;
    for (int32_t key = 0; key < k->nkeys; key++)
      for (int64_t s = 0; s < B; s++) {
        int64_t bag = k->bag0[key] + (h.inv ? h.inv[key * B + s] : s);
        int64_t n = h.off[bag + 1] - h.off[bag];
        memcpy(val + vo, h.val + h.off[bag], sizeof(int64_t) * (size_t)n);
        if (w) memcpy(w + vo, h.w + h.off[bag], sizeof(float) * (size_t)n);
        len[key * B + s] = (int32_t)n;
        vo += n;
      }
  }
  host_kjt_free(&h);
  if (st) {
    build_free(&b);
    return st;
  }
  return build_finish(&b, out);
}

/* Rows gathered on the GPU, ordered on s; a KJT elsewhere lends its inverse indices through
 * a copy in the input's placement. */
static ur_status gpu_expand_rows(ur_stream *s, const ur_kjt *k, const ur_tensor *in, int nd,
                                 const int64_t *shape, int64_t row, ur_tensor **out) {
  ur_place place = ur_tensor_place(in);
  int32_t dev = ur_tensor_device(in);
  ur_tensor *o = NULL, *inv = NULL;
  ur_status st = ur_tensor_new(&o, ur_tensor_dtype(in), nd, shape, place, dev);
  if (!st && k->inverse && !on_gpu(k->inverse))
    st = ur_tensor_to(s, k->inverse, &inv, place, dev);
  int32_t prev = 0;
  if (!st && !(st = gpu_enter(in, &prev))) {
    st = ur__gpu()->kjt->expand_rows(s ? s->handle : NULL, dp(in),
                                    (size_t)row * ur_dtype_size(ur_tensor_dtype(in)),
                                    dp(inv ? inv : k->inverse), k->bag0, k->nkeys, k->stride,
                                    dp(o));
    st = gpu_leave(in, prev, st);
  }
  ur_tensor_free(inv);
  if (st) {
    ur_tensor_free(o);
    return st;
  }
  *out = o;
  return UR_STATUS_OK;
}

ur_status ur_kjt_expand_rows(ur_stream *s, const ur_kjt *k, const ur_tensor *in,
                             ur_tensor **out) {
  *out = NULL;
  int64_t nb = k->bag0[k->nkeys], B = k->stride;
  int nd = ur_tensor_ndim(in);
  if (ur_tensor_dim(in, 0) != nb)
    return ur__error(UR_STATUS_INVALID,
                     "kjt expand: the input has %lld rows but the KJT has %lld bags (one row per bag)",
                     (long long)ur_tensor_dim(in, 0), (long long)nb);
  int64_t shape[UR_MAX_DIMS], row = 1;
  for (int i = 0; i < nd; i++) shape[i] = ur_tensor_dim(in, i);
  for (int i = 1; i < nd; i++) row *= shape[i];
  shape[0] = (int64_t)k->nkeys * B;
  if (on_gpu(in)) return gpu_expand_rows(s, k, in, nd, shape, row, out);
  ur_place place = ur_tensor_place(in);
  int32_t dev = ur_tensor_device(in);
  ur_place hp = place == UR_PLACE_DEVICE ? UR_PLACE_HOST : place;
  ur_tensor *o = NULL;
  ur_status st = ur_tensor_new(&o, ur_tensor_dtype(in), nd, shape, hp,
                               hp == UR_PLACE_HOST || hp == UR_PLACE_PINNED ? UR_LOC_CPU : dev);
  if (st) return st;
  void *t1, *t2;
  const char *src = host_data(in, &t1, &st);
  const int64_t *inv = st || !k->inverse ? NULL : host_data(k->inverse, &t2, &st);
  if (st || !k->inverse) t2 = NULL;
  if (!st) {
    size_t rb = (size_t)row * ur_dtype_size(ur_tensor_dtype(in));
    char *dst = ur_tensor_data(o);
    for (int32_t key = 0; key < k->nkeys; key++)
      for (int64_t b = 0; b < B; b++) {
        int64_t from = k->bag0[key] + (inv ? inv[key * B + b] : b);
        memcpy(dst + (size_t)(key * B + b) * rb, src + (size_t)from * rb, rb);
      }
  }
  free(t1);
  free(t2);
  if (!st && hp != place) {
    ur_tensor *d;
    if (!(st = ur_tensor_to(s, o, &d, place, dev))) {
      ur_tensor_free(o);
      o = d;
    }
  }
  if (st) {
    ur_tensor_free(o);
    return st;
  }
  *out = o;
  return UR_STATUS_OK;
}

/* ---- placement ---- */

ur_status ur_kjt_to(ur_stream *s, const ur_kjt *k, ur_kjt **out, ur_place place,
                    int32_t device) {
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
  ur_tensor_free(v);
  ur_tensor_free(l);
  ur_tensor_free(w);
  ur_tensor_free(inv);
  ur_tensor_free(off);
  return st;
}
