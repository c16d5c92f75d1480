/* kjt_arrays.c: libFuzzer target for keyed jagged tensors made from raw arrays.  The first bytes
 * pick the keys, the stride, weights, a variable batch per key (VBE) and what is made; the rest
 * are the lengths, the values and, for VBE, the strides per key and the inverse indices.
 *
 * Made with the checks (ur_kjt_new, check 1), as a batch from outside arrives: a KJT the
 * constructor accepts must have offsets that add up, and one that also validates must survive
 * every operation: permute, split and concat give it back, dedup then expand gives it back, and
 * expand of a VBE batch works.
 *
 * Then, with flag 16, made unchecked (check 0), its offsets, lengths and inverse indices rewritten
 * from the input (flags 32, 64, 128: small values, kept ones, or any 64-bit integer), as a
 * caller writing into a KJT's tensors does: validate, permute, split, concat, dedup, expand,
 * expand_rows, bucketize, to and copy run on it and on what they give.  None may crash or read
 * out of bounds; each succeeds or is refused with an INVALID error and a message.  validate
 * agrees with a plain check written here, and every KJT known checked (ur_kjt_checked) passes
 * that plain check: no op marks a result it did not make sound. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "uvmrec.h"

static const char *const KEYS[8] = {"k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7"};

static ur_tensor *host(ur_dtype dt, int64_t n) {
  ur_tensor *t = NULL;
  int64_t shape[1] = {n};
  if (ur_tensor_new(&t, dt, 1, shape, UR_PLACE_HOST, UR_LOC_CPU)) abort();
  return t;
}

static void refused(ur_status st) {
  if (st != UR_STATUS_INVALID || !ur_last_error()[0]) abort();
}

static int same_tensor(const ur_tensor *a, const ur_tensor *b) {
  if (!a || !b) return a == b;
  return ur_tensor_dtype(a) == ur_tensor_dtype(b) && ur_tensor_numel(a) == ur_tensor_numel(b) &&
         !memcmp(ur_tensor_data(a), ur_tensor_data(b), ur_tensor_nbytes(a));
}

static int same_kjt(const ur_kjt *a, const ur_kjt *b) {
  if (ur_kjt_num_keys(a) != ur_kjt_num_keys(b) || ur_kjt_stride(a) != ur_kjt_stride(b)) return 0;
  for (int32_t i = 0; i < ur_kjt_num_keys(a); i++)
    if (strcmp(ur_kjt_key(a, i), ur_kjt_key(b, i))) return 0;
  return same_tensor(ur_kjt_values(a), ur_kjt_values(b)) &&
         same_tensor(ur_kjt_lengths(a), ur_kjt_lengths(b)) &&
         same_tensor(ur_kjt_offsets(a), ur_kjt_offsets(b)) &&
         same_tensor(ur_kjt_weights(a), ur_kjt_weights(b));
}

static void check_offsets(const ur_kjt *k) {
  const ur_tensor *lt = ur_kjt_lengths(k), *ot = ur_kjt_offsets(k);
  const int32_t *len = ur_tensor_data(lt);
  const int64_t *off = ur_tensor_data(ot);
  int64_t bags = ur_tensor_numel(lt);
  if (ur_tensor_numel(ot) != bags + 1 || off[0] != 0) abort();
  for (int64_t b = 0; b < bags; b++)
    if (len[b] < 0 || off[b + 1] != off[b] + len[b]) abort();
  if (off[bags] != ur_tensor_numel(ur_kjt_values(k))) abort();
}

/* What ur_kjt_validate (rows NULL) holds a KJT to, written plainly: every bag's length >= 0 and
 * its offsets that length apart within the values, each key's first offset where its key span
 * (ur_kjt_key_span) starts, the spans ending at the last value, and inverse indices within their
 * keys' bags.  Read from the KJT's own host tensors, so it needs no sound KJT. */
static int sound(const ur_kjt *k) {
  int32_t nk = ur_kjt_num_keys(k);
  int64_t stride = ur_kjt_stride(k), nv = ur_tensor_numel(ur_kjt_values(k));
  const ur_tensor *lt = ur_kjt_lengths(k), *ot = ur_kjt_offsets(k), *it = ur_kjt_inverse_indices(k);
  int64_t nb = ur_tensor_numel(lt);
  if (ur_tensor_numel(ot) != nb + 1) abort(); /* every KJT's offsets: one past its bags */
  const int32_t *len = ur_tensor_data(lt);
  const int64_t *off = ur_tensor_data(ot);
  for (int64_t b = 0; b < nb; b++)
    if (len[b] < 0 || off[b] < 0 || off[b + 1] < off[b] || off[b + 1] > nv ||
        off[b + 1] - off[b] != len[b])
      return 0;
  int64_t b0 = 0, b1 = 0, v0 = 0, v1 = 0;
  for (int32_t i = 0; i < nk; i++) {
    if (ur_kjt_key_span(k, i, &b0, &b1, &v0, &v1)) abort();
    if (off[b0] != v0) return 0;
  }
  if (off[nb] != v1 || v1 != nv) return 0; /* v1: the last key's end, 0 without keys */
  if (it) {
    const int64_t *inv = ur_tensor_data(it);
    for (int32_t i = 0; i < nk; i++)
      for (int64_t j = 0; j < stride; j++)
        if (inv[i * stride + j] < 0 || inv[i * stride + j] >= ur_kjt_stride_of(k, i)) return 0;
  }
  return 1;
}

/* validate says what the plain check says, and marks k (or not) as it does. */
static void validated(const ur_kjt *k) {
  int s = sound(k);
  ur_status st = ur_kjt_validate(k, NULL);
  if (st) refused(st);
  if ((st == UR_STATUS_OK) != s || ur_kjt_checked(k) != s) abort();
}

/* A KJT an op gave (or the input, untouched since made): one known checked must be sound. */
static void judged(const ur_kjt *k) {
  if (ur_kjt_checked(k) && !sound(k)) abort();
  validated(k);
}

static void operations(const ur_kjt *k, int32_t nk) {
  ur_kjt *p = NULL, *pp = NULL, *parts[2] = {NULL, NULL}, *c = NULL;
  /* permute reversed, twice: the KJT again */
  int32_t order[8];
  for (int32_t i = 0; i < nk; i++) order[i] = nk - 1 - i;
  if (ur_kjt_permute(k, order, nk, &p) || ur_kjt_permute(p, order, nk, &pp)) abort();
  if (!ur_kjt_variable_stride(k) && !same_kjt(k, pp)) abort();
  /* split in two and concatenated again */
  if (nk >= 2) {
    int32_t sizes[2] = {1, nk - 1};
    if (ur_kjt_split(k, sizes, 2, parts)) abort();
    if (!ur_kjt_variable_stride(k)) {
      if (ur_kjt_concat((const ur_kjt *const *)parts, 2, &c)) abort();
      if (!same_kjt(k, c)) abort();
    }
  }
  if (!ur_kjt_variable_stride(k)) {
    ur_kjt *d = NULL, *e = NULL;
    if (ur_kjt_dedup(k, &d) || ur_kjt_validate(d, NULL) || ur_kjt_expand(d, &e)) abort();
    if (!same_kjt(k, e)) abort();
    ur_kjt_free(d);
    ur_kjt_free(e);
  }
  ur_kjt_free(p);
  ur_kjt_free(pp);
  ur_kjt_free(parts[0]);
  ur_kjt_free(parts[1]);
  ur_kjt_free(c);
}

/* The input's bytes after the arrays: the rewrites and the ops' arguments.  Past the end, 0xc0:
 * "keep" for a rewrite, and small arguments. */
typedef struct bytes {
  const uint8_t *p, *end;
} bytes;

static uint8_t byte(bytes *b) { return b->p < b->end ? *b->p++ : 0xc0; }

static uint64_t wide(bytes *b) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v = v << 8 | byte(b);
  return v;
}

/* A rewritten element: kept (0xc0..0xfb), an extreme (0xfc..0xfe: INT64_MIN, INT64_MAX, -1), any
 * 64-bit integer (0xff, then 8 bytes), or small, around the values' count n (0..0xbf: -16 ..
 * n + 16). */
static int64_t rewritten(bytes *b, int64_t old, int64_t n) {
  uint8_t c = byte(b);
  if (c == 0xff) return (int64_t)wide(b);
  if (c == 0xfe) return -1;
  if (c == 0xfd) return INT64_MAX;
  if (c == 0xfc) return INT64_MIN;
  if (c >= 0xc0) return old;
  return (int64_t)c * (n + 33) / 0xc0 - 16;
}

/* An op's result: judged, then (a bounded few) its own ops. */
static void unchecked_ops(const ur_kjt *k, bytes *b, int depth);

static void result(ur_status st, ur_kjt *r, bytes *b, int depth) {
  if (st) {
    refused(st);
    if (r) abort();
    return;
  }
  judged(r);
  if (depth < 2) unchecked_ops(r, b, depth + 1);
  ur_kjt_free(r);
}

static void unchecked_ops(const ur_kjt *k, bytes *b, int depth) {
  int32_t nk = ur_kjt_num_keys(k);
  int64_t stride = ur_kjt_stride(k), nb = ur_tensor_numel(ur_kjt_lengths(k));
  ur_kjt *r = NULL;
  uint8_t ops = byte(b);
  /* permute: keys by the input, repeats allowed (now and then one out of range) */
  if (ops & 1) {
    int32_t order[16], n = byte(b) % 17;
    for (int32_t j = 0; j < n; j++) order[j] = nk ? (int32_t)(byte(b) % (nk + (j == 5))) : 0;
    result(ur_kjt_permute(k, order, nk ? n : 0, &r), r, b, depth);
  }
  /* split, and concat of the parts (a view at a part past value 0 rebases its offsets) */
  if (ops & 2 && nk > 0) {
    int32_t sizes[8], n = 0, left = nk; /* results have more keys than 8: a repeating permute's */
    while (left > 0 && n < 7) {
      sizes[n] = 1 + byte(b) % left;
      left -= sizes[n++];
    }
    if (left) sizes[n++] = left;
    ur_kjt *parts[8] = {NULL};
    ur_status st = ur_kjt_split(k, sizes, n, parts);
    if (st) {
      refused(st);
    } else {
      for (int32_t j = 0; j < n; j++) judged(parts[j]);
      r = NULL;
      result(ur_kjt_concat((const ur_kjt *const *)parts, n, &r), r, b, depth);
      if (depth < 2 && n > 1) unchecked_ops(parts[n - 1], b, depth + 1);
      for (int32_t j = 0; j < n; j++) ur_kjt_free(parts[j]);
    }
  }
  /* dedup (refused for VBE), expand, and expand_rows of one f32 row per bag */
  if (ops & 4) {
    r = NULL;
    result(ur_kjt_dedup(k, &r), r, b, depth);
  }
  if (ops & 8) {
    r = NULL;
    result(ur_kjt_expand(k, &r), r, b, depth);
    ur_tensor *in = NULL, *out = NULL;
    int64_t shape[2] = {nb, 2};
    if (ur_tensor_new(&in, UR_DTYPE_F32, 2, shape, UR_PLACE_HOST, UR_LOC_CPU)) abort();
    for (int64_t i = 0; i < 2 * nb; i++) ((float *)ur_tensor_data(in))[i] = (float)i;
    ur_status st = ur_kjt_expand_rows(NULL, k, in, &out);
    if (st) refused(st);
    else if (ur_tensor_dim(out, 0) != (int64_t)nk * stride) abort();
    ur_tensor_free(out);
    ur_tensor_free(in);
  }
  /* bucketize: blocks of rows per key from the input (0: the key stays) */
  int64_t *block = calloc((size_t)nk + 1, sizeof(int64_t)), *rows = calloc((size_t)nk + 1, sizeof(int64_t));
  if (!block || !rows) abort();
  if (ops & 16) {
    int32_t buckets = 1 + byte(b) % 4;
    for (int32_t i = 0; i < nk; i++) {
      block[i] = byte(b) % 5;
      rows[i] = block[i] ? 1 + (int64_t)(byte(b) % (block[i] * buckets)) : 0;
    }
    r = NULL;
    result(ur_kjt_bucketize(k, &r, block, rows, buckets), r, b, depth);
  }
  /* to and copy: the same contents, marked as k is */
  if (ops & 32) {
    r = NULL;
    ur_status st = ur_kjt_to(NULL, k, &r, UR_PLACE_HOST, UR_LOC_CPU);
    if (st || ur_kjt_checked(r) != ur_kjt_checked(k)) abort();
    result(st, r, b, depth);
    const ur_tensor *src[5] = {ur_kjt_values(k), ur_kjt_lengths(k), ur_kjt_offsets(k),
                               ur_kjt_weights(k), ur_kjt_inverse_indices(k)};
    ur_tensor *into[5] = {NULL};
    for (int i = 0; i < 5; i++)
      if (src[i]) into[i] = host(ur_tensor_dtype(src[i]), ur_tensor_numel(src[i]) + (byte(b) & 1));
    r = NULL;
    st = ur_kjt_copy(NULL, k, into, &r);
    if (st || ur_kjt_checked(r) != ur_kjt_checked(k)) abort();
    result(st, r, b, depth);
    for (int i = 0; i < 5; i++) ur_tensor_free(into[i]);
  }
  /* validate with rows: ids out of range are refused, the mark is the bags' matter */
  if (ops & 64) {
    for (int32_t i = 0; i < nk; i++) rows[i] = byte(b) % 130;
    ur_status st = ur_kjt_validate(k, rows);
    if (st) refused(st);
    if (ur_kjt_checked(k) != sound(k)) abort();
  }
  free(block);
  free(rows);
  /* sound: the checked KJT's round trips hold too (8 keys at most, distinct: a repeating
   * permute's result does not concat back) */
  int distinct = nk <= 8;
  for (int32_t i = 0; i < nk && distinct; i++)
    for (int32_t j = 0; j < i; j++)
      if (!strcmp(ur_kjt_key(k, i), ur_kjt_key(k, j))) distinct = 0;
  if (ops & 128 && distinct && !ur_kjt_validate(k, NULL)) operations(k, nk);
}

/* The KJT made unchecked from the same arrays (copies: the rewrites stay its own), its tensors
 * rewritten as the flags say, then every op. */
static void unchecked(int32_t nk, const char *const *keys, int64_t stride, const int64_t *spk,
                      const ur_tensor *values, const ur_tensor *lengths, const ur_tensor *weights,
                      const ur_tensor *inverse, int flags, bytes *b) {
  ur_tensor *v = NULL, *l = NULL, *w = NULL, *inv = NULL;
  if (ur_tensor_to(NULL, values, &v, UR_PLACE_HOST, UR_LOC_CPU) ||
      ur_tensor_to(NULL, lengths, &l, UR_PLACE_HOST, UR_LOC_CPU) ||
      (weights && ur_tensor_to(NULL, weights, &w, UR_PLACE_HOST, UR_LOC_CPU)) ||
      (inverse && ur_tensor_to(NULL, inverse, &inv, UR_PLACE_HOST, UR_LOC_CPU)))
    abort();
  ur_kjt *k = NULL;
  ur_status st = ur_kjt_new(&k, nk, keys, stride, spk, v, l, w, inv, 0);
  if (st) {
    refused(st);
    if (k) abort();
  } else {
    /* made unchecked: known checked exactly when sound, as the make's scan found it */
    if (ur_kjt_checked(k) != sound(k)) abort();
    int64_t nv = ur_tensor_numel(ur_kjt_values(k)), nb = ur_tensor_numel(ur_kjt_lengths(k));
    int64_t *off = ur_tensor_data(ur_kjt_offsets(k));
    int32_t *len = ur_tensor_data(ur_kjt_lengths(k));
    const ur_tensor *it = ur_kjt_inverse_indices(k);
    if (flags & 32)
      for (int64_t i = 0; i <= nb; i++) off[i] = rewritten(b, off[i], nv);
    if (flags & 64)
      for (int64_t i = 0; i < nb; i++) len[i] = (int32_t)rewritten(b, len[i], 8);
    if (flags & 128 && it)
      for (int64_t i = 0; i < ur_tensor_numel(it); i++)
        ((int64_t *)ur_tensor_data(it))[i] = rewritten(b, ((int64_t *)ur_tensor_data(it))[i], 8);
    /* A KJT known checked whose tensors were written validates again (ur_kjt_checked: the mark
     * holds for the contents as checked); one not known checked goes to the ops as it is. */
    if (flags & 224 && ur_kjt_checked(k)) validated(k);
    if (ur_kjt_checked(k) && !sound(k)) abort();
    unchecked_ops(k, b, 0);
    judged(k);
    ur_kjt_free(k);
  }
  ur_tensor_free(v);
  ur_tensor_free(l);
  ur_tensor_free(w);
  ur_tensor_free(inv);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 3) return 0;
  int32_t nk = data[0] % 9;
  int64_t stride = data[1] % 17;
  int flags = data[2];
  int weighted = flags & 1, vbe = flags & 2, fill = flags & 4, no_name = flags & 8;
  const uint8_t *p = data + 3, *end = data + size;
#define NEXT() (p < end ? *p++ : 0)
  int64_t spk[8];
  int64_t bags = 0;
  for (int32_t i = 0; i < nk; i++) {
    spk[i] = vbe ? (int8_t)NEXT() % (stride + 2) : stride; /* sometimes out of range */
    bags += spk[i] > 0 ? spk[i] : 0;
  }
  ur_tensor *lengths = host(UR_DTYPE_I32, bags);
  int32_t *len = ur_tensor_data(lengths);
  int64_t total = 0;
  for (int64_t b = 0; b < bags; b++) {
    len[b] = (int8_t)NEXT() % 9; /* -8..8 */
    total += len[b];
  }
  /* fill: exactly as many values as the lengths ask (when that is not negative) */
  int64_t n = fill ? (total > 0 ? total : 0) : (int64_t)(end - p) / 2;
  if (n > 4096) n = 4096;
  ur_tensor *values = host(UR_DTYPE_I64, n), *weights = weighted ? host(UR_DTYPE_F32, n) : NULL;
  int64_t *val = ur_tensor_data(values);
  for (int64_t i = 0; i < n; i++) {
    val[i] = (int8_t)NEXT();
    if (weights) ((float *)ur_tensor_data(weights))[i] = (float)(NEXT() % 4);
  }
  ur_tensor *inverse = NULL;
  if (vbe) {
    inverse = host(UR_DTYPE_I64, nk * stride);
    for (int64_t i = 0; i < nk * stride; i++) ((int64_t *)ur_tensor_data(inverse))[i] = (int8_t)NEXT() % 18;
  }
  const char *keys[8];
  for (int32_t i = 0; i < nk; i++) keys[i] = no_name && i == nk - 1 ? "" : KEYS[i];
  ur_kjt *k = NULL;
  ur_status st = ur_kjt_new(&k, nk, keys, stride, vbe ? spk : NULL, values, lengths, weights,
                            inverse, 1);
  if (st == UR_STATUS_OK) {
    check_offsets(k);
    int64_t rows[8];
    for (int32_t i = 0; i < nk; i++) rows[i] = 1 + NEXT() % 130;
    st = ur_kjt_validate(k, rows);
    if (st) refused(st);
    st = ur_kjt_validate(k, NULL);
    if (st) refused(st);
    else operations(k, nk);
    ur_kjt_free(k);
  } else {
    refused(st);
    if (k) abort();
  }
  if (flags & 16) { /* the rest of the input drives the rewrites and the ops */
    bytes b = {p, end};
    unchecked(nk, keys, stride, vbe ? spk : NULL, values, lengths, weights, inverse, flags, &b);
  }
  ur_tensor_free(values);
  ur_tensor_free(lengths);
  ur_tensor_free(weights);
  ur_tensor_free(inverse);
  return 0;
}
