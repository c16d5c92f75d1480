/* kjt.c: keyed jagged tensors: construction with checked lengths, offsets, permute, split,
 * concat, dedup into a variable batch per key (VBE), expand back, and placement moves.
 * The work is done on host-visible memory; a KJT on the device is staged through the host
 * (its results go back to the device), so every placement is accepted everywhere. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core.h"

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

/* Offsets from lengths: checks negative lengths and the sum against the values (when check),
 * and fills val0.  `given` (offsets already computed, e.g. by a copy) skips the work. */
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

ur_status ur_kjt_validate(const ur_kjt *k, const int64_t *rows) {
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

/* A result assembled in host memory, then moved to the input's placement. */
typedef struct build {
  int32_t nkeys;
  const char **keys;
  int64_t stride;
  int64_t *spk;        /* NULL: not VBE */
  int64_t nvalues, nbags;
  int weighted;
  ur_tensor *values, *lengths, *weights, *inverse;
  ur_place place;      /* host-visible placement the buffers live in */
  ur_place want;       /* the result's placement */
  int32_t device;
} build;

static ur_status build_alloc(build *b, ur_place want, int32_t device) {
  b->want = want;
  b->device = device;
  b->place = want == UR_PLACE_DEVICE ? UR_PLACE_HOST : want;
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
                  b->inverse, NULL, NULL, 0, out);
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
    if (!st)
      st = kjt_make(k1 - k0, (const char *const *)k->keys + k0, k->stride,
                    k->variable ? k->spk + k0 : NULL, v, l, w, inv, off, off ? k->val0 + k0 : NULL, 0,
                    &outs[j]);
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
    for (int32_t i = 0; i < p->nkeys; i++)
      for (int32_t q = 0; q <= j; q++)
        for (int32_t m = 0; m < (q == j ? i : parts[q]->nkeys); m++)
          if (!strcmp(parts[q]->keys[m], p->keys[i]))
            return ur__error(UR_STATUS_INVALID,
                             "kjt concat: key '%s' of part %d is also in part %d", p->keys[i],
                             (int)j + 1, (int)q + 1);
    b.nkeys += p->nkeys;
    b.nvalues += ur_tensor_numel(p->values);
    b.nbags += p->bag0[p->nkeys];
  }
  b.keys = calloc((size_t)b.nkeys + 1, sizeof(char *));
  if (p0->variable) b.spk = calloc((size_t)b.nkeys + 1, sizeof(int64_t));
  if (!b.keys || (p0->variable && !b.spk)) {
    build_free(&b);
    return ur__error(UR_STATUS_OOM, "kjt concat: out of host memory");
  }
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

ur_status ur_kjt_dedup(const ur_kjt *k, ur_kjt **out) {
  *out = NULL;
  if (k->variable)
    return ur__error(UR_STATUS_INVALID,
                     "kjt dedup: the KJT already has a variable batch per key; expand() it first");
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
