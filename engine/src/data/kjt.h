/* kjt.h: the keyed-jagged-tensor ops' table that kjt.c dispatches through, filled by the CPU
 * reference (kjt_cpu.c) and by the CUDA backend (kernels/kjt.cu). */
#ifndef UR_KJT_H
#define UR_KJT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "core/core.h"
#include "core/philox.h" /* UR_HD, ur__mix64 */

/* A bag's hash for dedup, the same on both backends: its length, then each id (and its
 * weight's bits) mixed in.  Bags of one key with equal hashes are compared before they are
 * taken as one. */
UR_HD uint64_t ur__kjt_bag_hash(const int64_t *v, const float *w, int64_t n) {
  uint64_t h = 0x9e3779b97f4a7c15ull ^ (uint64_t)n;
  for (int64_t i = 0; i < n; i++) {
    h = ur__mix64(h ^ (uint64_t)v[i]);
    if (w) {
      float f = w[i]; /* one load: a memcpy from memory is byte loads on the GPU */
      uint32_t bits;
      memcpy(&bits, &f, 4);
      h = ur__mix64(h ^ bits);
    }
  }
  return h;
}

/* Whether a bag is sound, the same on both backends (validate): its length l >= 0 and its
 * offsets o0..o1 that far apart within the nv values.  The bounds come first, so o1 - o0 is
 * taken only of offsets within 0..nv: offsets written after the KJT was made may be any 64-bit
 * integers, whose difference overflows (signed overflow, undefined: found by the fuzzer,
 * engine/fuzz/kjt_arrays.c, on offsets INT64_MAX and -16). */
UR_HD int ur__kjt_bag_sound(int32_t l, int64_t o0, int64_t o1, int64_t nv) {
  return l >= 0 && o0 >= 0 && o1 >= o0 && o1 <= nv && o1 - o0 == l;
}

/* One run of a segment copy: n elements from src (memory the backend reads) to element dst of
 * the output. */
typedef struct ur__kjt_seg {
  const void *src;
  int64_t dst, n;
} ur__kjt_seg;

/* The KJT ops' table.  kjt.c has checked every size; pointers are memory the backend reads
 * (for the GPU: of the current GPU) unless called host arrays.  Both tables give the same
 * results, bit for bit. */
typedef struct ur_kjt_ops {
  /* off [nb + 1]: 0, then the running sum of len.  With val0 (host, nkeys + 1) it waits and
   * gives val0[i] = off[bag0[i]] (bag0 host), bad[0]: the first negative length, bad[1]: the
   * first bag ending past nv values; -1: none. */
  ur_status (*offsets)(void *stream, const int32_t *len, int64_t nb, int64_t *off,
                       const int64_t *bag0, int32_t nkeys, int64_t nv, int64_t *val0,
                       int64_t *bad);
  /* Waits; bad[0]: first bag with a negative length or offsets that disagree with it, bad[1]:
   * first sound bag holding an id outside [0, rows[key]) where rows (host) is given and > 0,
   * bad[2]: first inverse index outside its key's stride (spk host); -1: none. */
  ur_status (*validate)(void *stream, const int32_t *len, const int64_t *off,
                        const int64_t *val, const int64_t *inv, int64_t nv, int32_t nkeys,
                        int64_t stride, const int64_t *bag0, const int64_t *spk,
                        const int64_t *rows, int64_t *bad);
  /* dst elements (elem_bytes 4 or 8) from nseg runs (segs in host memory). */
  ur_status (*segments)(void *stream, void *dst, size_t elem_bytes,
                        const struct ur__kjt_seg *segs, int64_t nseg);
  /* map[k * stride + j] = bag0[k] + (inv ? inv[k * stride + j] : j); bag0 in host memory. */
  ur_status (*expand_map)(void *stream, const int64_t *inv, const int64_t *bag0,
                          int32_t nkeys, int64_t stride, int64_t *map);
  /* len_out[i] = len[map[i]], off_out [n + 1] their offsets; with nat > 0 it waits and gives
   * at[j] = off_out[j * step] (host) for j < nat. */
  ur_status (*bag_lengths)(void *stream, const int32_t *len, const int64_t *map, int64_t n,
                           int32_t *len_out, int64_t *off_out, int64_t step, int32_t nat,
                           int64_t *at);
  /* Values (and weights, w may be NULL) of bag map[i] to off_out[i]... */
  ur_status (*bag_copy)(void *stream, const int64_t *off, const int64_t *val, const float *w,
                        const int64_t *map, int64_t n, const int64_t *off_out,
                        int64_t *val_out, float *w_out);
  /* dst row k * stride + j = src row bag0[k] + (inv ? inv[k * stride + j] : j), rows of
   * row_bytes; bag0 in host memory. */
  ur_status (*expand_rows)(void *stream, const void *src, size_t row_bytes,
                           const int64_t *inv, const int64_t *bag0, int32_t nkeys,
                           int64_t stride, void *dst);
  /* Per key of nkeys * stride bags, the distinct bags (ids and weight bits) in order of first
   * appearance; waits.  map [sum of spk]: each distinct bag's first bag, key-major; inv
   * [nkeys * stride]: each bag's distinct bag, counted from its key's first; host spk [nkeys]
   * and val0 [nkeys + 1] (each key's first value in the result). */
  ur_status (*dedup)(void *stream, const int64_t *off, const int64_t *val, const float *w,
                     const int32_t *len, int32_t nkeys, int64_t stride, int64_t *map,
                     int64_t *inv, int64_t *spk, int64_t *val0);
  /* Sample-major rows to key-major bags: len_out[k * n + i] = len[i * nkeys + k] (hot[k] when
   * len is NULL: every bag full), off_out [nkeys * n + 1] their running sum, and bag (k, i)
   * copied from ids[i * H + col0[k]] (and w) to val_out (w_out) at its offset.  col0 [nkeys]
   * and hot [nkeys] are host arrays.  With len it waits and gives val0 [nkeys + 1] (host): each
   * key's first value and the total, and bad: the first bag (k * n + i) whose length is
   * outside 0..hot[k] (its bag is left empty), -1: none; without, nothing waits (the caller
   * knows them). */
  ur_status (*from_rows)(void *stream, const int64_t *ids, const float *w, const int32_t *len,
                         int64_t n, int32_t nkeys, int64_t H, const int64_t *col0,
                         const int32_t *hot, int32_t *len_out, int64_t *off_out, int64_t *val_out,
                         float *w_out, int64_t *val0, int64_t *bad);
  /* Row-wise bucketing of one key's nb bags (off [nb + 1] into val): cnt [buckets * nb],
   * bucket-major, counts each bag's ids with id / block == b; waits and gives bad: the first
   * value index holding an id outside [0, rows), or -1. */
  ur_status (*bucket_count)(void *stream, const int64_t *off, const int64_t *val, int64_t nb,
                            int64_t block, int64_t rows, int32_t buckets, int32_t *cnt,
                            int64_t *bad);
  /* Each bag's ids (as id - b * block) and weights (w may be NULL), in order, to its bucket's
   * bag: off_out [buckets * nb], bucket-major, the first value of each output bag. */
  ur_status (*bucket_fill)(void *stream, const int64_t *off, const int64_t *val, const float *w,
                           int64_t nb, int64_t block, int32_t buckets, const int64_t *off_out,
                           int64_t *val_out, float *w_out);
} ur_kjt_ops;

/* A KJT on offsets the caller computed (kjt.c; the loader's): no scan, no allocation but the
 * views.  offsets i64 [num_keys * stride + 1] in values' placement, val0 (host) each key's first
 * value and the total.  The KJT is known checked (ur_kjt_checked): the caller vouches for the
 * lengths, offsets and spans it wrote together. */
UR__HIDDEN ur_status ur__kjt_new_with_offsets(struct ur_kjt **out, int32_t num_keys,
                                              const char *const *keys, int64_t stride,
                                              struct ur_tensor *values, struct ur_tensor *lengths,
                                              struct ur_tensor *weights, struct ur_tensor *offsets,
                                              const int64_t *val0);

/* Where each of n names is among k's keys: order[i] its position (the first, were two keys one
 * name), *missing the first i whose name k lacks (order filled before it), else -1.  Names in
 * k's order cost n comparisons; any other order sorts k's keys once, n log n, as a scan of k
 * per name would cost n^2 / 2 (half a million for a model of 1000 features, each request). */
UR__HIDDEN ur_status ur__kjt_key_order(const struct ur_kjt *k, const char *const *names, int32_t n,
                                       int32_t *order /* out */, int32_t *missing /* out */);

/* Nothing for a KJT known checked (ur_kjt_checked: one atomic read, no wait), else
 * ur_kjt_validate's check, with who opening the message ("model: key 'C3' sample 0 ..."): for an
 * entry that reads k bag by bag through its offsets or inverse indices (the ops of kjt.c,
 * serving's predict).  A KJT found sound is known checked after; on the GPU the check waits. */
UR__HIDDEN ur_status ur__kjt_need_checked(const struct ur_kjt *k, const char *who);

/* Each key's span of values within k's values, one after the other, ending at the last (what a
 * copy or view of whole key spans reads); who names the caller in the message.  num_keys steps
 * on the host; a KJT known checked passes at once. */
UR__HIDDEN ur_status ur__kjt_spans_fit(const struct ur_kjt *k, const char *who);

/* The CPU reference (kjt_cpu.c); the CUDA backend's is ur__cuda_kjt_ops (kernels/kjt.cu). */
UR__HIDDEN extern const ur_kjt_ops ur__cpu_kjt_ops;

#endif
