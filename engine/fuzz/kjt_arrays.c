/* kjt_arrays.c: libFuzzer target for keyed jagged tensors made from raw arrays (ur_kjt_new
 * with its checks on, as a batch from outside arrives).  The first bytes pick the keys, the
 * stride, weights and a variable batch per key (VBE); the rest are the lengths, the values and,
 * for VBE, the strides per key and the inverse indices.  A KJT the constructor accepts must have
 * offsets that add up, and one that also validates must survive every operation: permute,
 * split and concat give it back, dedup then expand gives it back, and expand of a VBE batch
 * works; anything refused must be an INVALID error with a message. */
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
  ur_tensor_free(values);
  ur_tensor_free(lengths);
  ur_tensor_free(weights);
  ur_tensor_free(inverse);
  return 0;
}
