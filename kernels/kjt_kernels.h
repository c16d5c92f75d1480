/* kjt_kernels.h: launch wrappers for the keyed-jagged-tensor kernels in kernels/kjt.cu, called by
 * engine/src/cuda/kjt.cu (which sequences them with cub's scans and sorts).  Each enqueues on
 * the current device and stream and returns the launch's error; engine/src/kjt.c has checked
 * the sizes.  "bad" outputs are first positions kept by atomicMin, ULLONG_MAX for none. */
#ifndef UR_KERNELS_KJT_H
#define UR_KERNELS_KJT_H

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "kjt.h"

/* off[0] = 0, off[b + 1] = len[b] (the input of an in-place inclusive scan); with neg, the
 * first b whose length is negative. */
cudaError_t ur__cuda_kjt_widen(cudaStream_t s, const int32_t *len, int64_t nb, int64_t *off,
                               unsigned long long *neg);
/* The first b whose bag ends past nv values: off[b + 1] > nv (off the inclusive scan). */
cudaError_t ur__cuda_kjt_over(cudaStream_t s, const int64_t *off, int64_t nb, int64_t nv,
                              unsigned long long *over);
/* out[i] = src[idx[i]]; with idx NULL, out[i] = src[i * step]. */
cudaError_t ur__cuda_kjt_gather_i64(cudaStream_t s, const int64_t *src, const int64_t *idx,
                                    int64_t step, int64_t n, int64_t *out);
/* validate: bad_bag, the first bag with a negative length or offsets that disagree with it
 * (or pass nv); bad_id, the first sound bag of a key with rows[key] > 0 holding an id outside
 * [0, rows[key]) (rows NULL: none checked).  bag0 [nkeys + 1] in device memory. */
cudaError_t ur__cuda_kjt_validate_bags(cudaStream_t s, const int32_t *len, const int64_t *off,
                                       const int64_t *val, int64_t nb, int64_t nv,
                                       const int64_t *bag0, int32_t nkeys, const int64_t *rows,
                                       unsigned long long *bad_bag, unsigned long long *bad_id);
/* The first i of inverse [nkeys * stride] outside 0..spk[i / stride] - 1. */
cudaError_t ur__cuda_kjt_validate_inverse(cudaStream_t s, const int64_t *inv, int32_t nkeys,
                                          int64_t stride, const int64_t *spk,
                                          unsigned long long *bad);
/* Segment copies of elem_bytes (4 or 8) elements: block0 [nseg + 1] is each segment's first
 * block of UR__KJT_CHUNK elements (nblocks in all); segs and block0 in device memory. */
#define UR__KJT_CHUNK 4096
cudaError_t ur__cuda_kjt_segments(cudaStream_t s, void *dst, size_t elem_bytes,
                                  const ur__kjt_seg *segs, const int64_t *block0, int64_t nseg,
                                  int64_t nblocks);
/* map[k * stride + j] = bag0[k] + (inv ? inv[k * stride + j] : j); bag0 in device memory. */
cudaError_t ur__cuda_kjt_expand_map(cudaStream_t s, const int64_t *inv, const int64_t *bag0,
                                    int32_t nkeys, int64_t stride, int64_t *map);
/* len_out[i] = len[map[i]], off[0] = 0, off[i + 1] = len[map[i]] (to be scanned). */
cudaError_t ur__cuda_kjt_bag_lengths(cudaStream_t s, const int32_t *len, const int64_t *map,
                                     int64_t n, int32_t *len_out, int64_t *off);
/* Values (and weights) of bag map[i] to off_out[i]..: one warp per bag. */
cudaError_t ur__cuda_kjt_bag_copy(cudaStream_t s, const int64_t *off, const int64_t *val,
                                  const float *w, const int64_t *map, int64_t n,
                                  const int64_t *off_out, int64_t *val_out, float *w_out);
/* dedup, for nb = nkeys * stride bags: keys[b] = key << (64 - kbits) | hash of the bag's ids
 * (and weights) >> kbits, idx[b] = b. */
cudaError_t ur__cuda_kjt_dedup_hash(cudaStream_t s, const int64_t *off, const int64_t *val,
                                    const float *w, int64_t nb, int64_t stride, int kbits,
                                    uint64_t *keys, int64_t *idx);
/* rs[i] = i where sorted keys[i] starts a run, else 0 (a max-scan makes it the run's start). */
cudaError_t ur__cuda_kjt_run_heads(cudaStream_t s, const uint64_t *keys, int64_t n, int64_t *rs);
/* rep[sidx[i]] = the first bag of i's run (sorted by bag within it) with the same ids and
 * weights as bag sidx[i]: its first appearance in the key. */
cudaError_t ur__cuda_kjt_dedup_rep(cudaStream_t s, const int64_t *sidx, const int64_t *rs,
                                   int64_t n, const int64_t *off, const int64_t *val,
                                   const float *w, int64_t *rep);
/* a[0] = c[0] = 0, a[b + 1] = (rep[b] == b), c[b + 1] = that times len[b] (to be scanned). */
cudaError_t ur__cuda_kjt_dedup_flags(cudaStream_t s, const int64_t *rep, const int32_t *len,
                                     int64_t nb, int64_t *a, int64_t *c);
/* After the scans: map[a[b]] = b for first appearances, inv[b] = a[rep[b]] - a[key's first]. */
cudaError_t ur__cuda_kjt_dedup_scatter(cudaStream_t s, const int64_t *rep, const int64_t *a,
                                       int64_t nb, int64_t stride, int64_t *map, int64_t *inv);
/* dst row i = src row map[i], rows of row_bytes. */
cudaError_t ur__cuda_kjt_gather_rows(cudaStream_t s, const void *src, size_t row_bytes,
                                     const int64_t *map, int64_t n, void *dst);

#endif
