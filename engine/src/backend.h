/* backend.h: the table a compute backend fills (ggml-backend's shape).  The CPU backend is
 * always in libuvmrec; the CUDA one lives in libuvmrec_cuda.so, loaded at run time, and
 * reaches the core only through the ur_core_api it is handed, so it links nothing of ours. */
#ifndef UR_BACKEND_H
#define UR_BACKEND_H

#include "uvmrec.h"

#define UR_BACKEND_ABI 3

/* What the core lends a backend. */
typedef struct ur_core_api {
  int abi;
  /* Sets the thread-local error and returns status. */
  ur_status (*set_error)(ur_status status, const char *fmt, ...)
      __attribute__((format(printf, 2, 3)));
  int (*interrupted)(void);
} ur_core_api;

struct ur_backend;
/* Fills the dense entries of the CUDA backend's table (engine/src/cuda/dense.cu). */
void ur__cuda_dense_install(struct ur_backend *b, const ur_core_api *core);

struct ur__tbe_args;  /* engine/src/tbe_plan.h */
struct ur__tbe_hyper;
struct ur_backend;
/* Fills the tbe entries of the CUDA backend's table (engine/src/cuda/tbe.cu). */
void ur__cuda_tbe_install(struct ur_backend *b, const ur_core_api *core);
struct ur__synth; /* engine/src/synth.h */
struct ur_backend;
/* Fills the data entries of the CUDA backend's table (engine/src/cuda/data.cu). */
void ur__cuda_data_install(struct ur_backend *b, const ur_core_api *core);
struct ur__metrics_job; /* engine/src/metrics_job.h */
struct ur_backend;
/* Fills the metrics entries of the CUDA backend's table (engine/src/cuda/metrics.cu). */
void ur__cuda_metrics_install(struct ur_backend *b, const ur_core_api *core);

struct ur__cache_io; /* engine/src/cache.h */
struct ur__cache_dev;
struct ur__cache_job;
struct ur_backend;
/* Fills the cache entries of the CUDA backend's table (engine/src/cuda/cache.cu). */
void ur__cuda_cache_install(struct ur_backend *b, const ur_core_api *core);

struct ur__kjt_seg; /* engine/src/kjt.h */
struct ur_backend;
/* Fills the kjt entries of the CUDA backend's table (engine/src/cuda/kjt.cu). */
void ur__cuda_kjt_install(struct ur_backend *b, const ur_core_api *core);

/* Streams and events are the backend's own handles (cudaStream_t, cudaEvent_t). */
typedef struct ur_backend {
  int abi;
  const char *name;
  const char *archs;                /* compiled targets, e.g. "sm_80 sm_90 compute_90" */
  int (*device_count)(void);
  ur_status (*device_set)(int32_t device);
  ur_status (*device_get)(int32_t *out);
  ur_status (*device_props)(int32_t device, ur_device_props *out);
  ur_status (*device_sync)(void);

  /* place is UR_PLACE_PINNED, DEVICE or MANAGED (host memory is the core's). */
  ur_status (*alloc)(ur_place place, int32_t device, size_t bytes, void **out);
  void (*free)(ur_place place, void *p);
  /* Copies bytes between any two placements, ordered on stream (NULL: the default stream);
   * returns once the copy is enqueued; host-memory ends must stay alive until it is done. */
  ur_status (*copy)(void *stream, void *dst, const void *src, size_t bytes);
  /* Fills n elements of elem_bytes each (1, 2, 4 or 8) with the bit pattern in value. */
  ur_status (*fill)(void *stream, void *dst, size_t n, size_t elem_bytes, uint64_t value);
  /* Counter-based random numbers (see philox.h): element i of the tensor, counted from
   * first, takes philox(seed, first + i); the CPU backend gives the same numbers. */
  ur_status (*rand)(void *stream, void *dst, ur_dtype dtype, size_t n, uint64_t first,
                    ur_dist dist, double a, double b, uint64_t seed);

  ur_status (*stream_new)(int32_t priority, void **out);
  void (*stream_free)(void *s);
  ur_status (*stream_sync)(void *s);
  ur_status (*event_new)(void **out);
  void (*event_free)(void *e);
  ur_status (*event_record)(void *e, void *stream);
  ur_status (*event_sync)(void *e);
  ur_status (*event_elapsed)(void *start, void *end, double *ms);

  /* Managed-memory hints on a page-aligned byte range; location as in uvmrec.h
   * (UR_LOC_CPU or a GPU ordinal; UR_LOC_CURRENT_GPU is resolved by the core). */
  ur_status (*advise)(void *ptr, size_t bytes, ur_advice advice, int32_t location);
  ur_status (*prefetch)(void *stream, void *ptr, size_t bytes, int32_t location);
  /* Fills everything of out but range and from_driver, from cudaMemRangeGetAttribute. */
  ur_status (*range_attrs)(const void *ptr, size_t bytes, ur_advised *out);
  /* Times one read of every byte of the range on the GPU (synchronous). */
  ur_status (*probe_read)(void *stream, const void *ptr, size_t bytes, double *seconds);

  ur_status (*monitor_start)(void);
  ur_status (*monitor_read)(ur_migration_stats *out, int32_t reset);
  ur_status (*monitor_stop)(void);

  /* dense (engine/src/dense.h says what each computes; the core has checked every shape and
   * dtype).  Matrices are row-major and contiguous; counts are elements. */
  ur_status (*linear_forward)(void *stream, const void *x, const void *w, const void *b, void *y,
                              int64_t rows, int64_t in, int64_t out, ur_dtype dtype, ur_act act,
                              uint32_t flags);
  ur_status (*linear_backward)(void *stream, const void *x, const void *w, const void *y,
                               const void *gy, void *gx, float *gw, float *gb, void *work,
                               int64_t rows, int64_t in, int64_t out, ur_dtype dtype, ur_act act,
                               uint32_t flags);
  ur_status (*act_forward)(void *stream, const void *x, void *y, int64_t n, ur_dtype dtype,
                           ur_act act);
  ur_status (*act_backward)(void *stream, const void *y, const void *gy, void *gx, int64_t n,
                            ur_dtype dtype, ur_act act);
  ur_status (*interaction_forward)(void *stream, const void *dense, const void *emb, void *out,
                                   int64_t rows, int32_t tables, int32_t dim, int32_t self,
                                   ur_dtype dense_dtype, ur_dtype emb_dtype, ur_dtype out_dtype);
  ur_status (*interaction_backward)(void *stream, const void *dense, const void *emb,
                                    const void *gout, void *gdense, void *gemb, int64_t rows,
                                    int32_t tables, int32_t dim, int32_t self,
                                    ur_dtype dense_dtype, ur_dtype emb_dtype, ur_dtype out_dtype);
  ur_status (*cross_forward)(void *stream, const void *x0, const void *z, const void *xl, void *y,
                             int64_t n, ur_dtype dtype);
  ur_status (*cross_backward)(void *stream, const void *x0, const void *z, const void *gy,
                              void *gz, void *gx0, void *gxl, int64_t n, ur_dtype dtype,
                              uint32_t flags);
  /* rows rows of width bytes, from src (pitch spitch bytes) to dst (pitch dpitch). */
  ur_status (*copy_2d)(void *stream, void *dst, size_t dpitch, const void *src, size_t spitch,
                       size_t width, size_t rows);
  ur_status (*bce_forward)(void *stream, const void *logits, const float *targets,
                           const float *weights, float *loss, int64_t n, ur_dtype dtype,
                           ur_reduction reduction);
  ur_status (*bce_backward)(void *stream, const void *logits, const float *targets,
                            const float *weights, void *glogits, int64_t n, ur_dtype dtype,
                            ur_reduction reduction, double scale);
  ur_status (*mean)(void *stream, const void *x, float *out, int64_t n, ur_dtype dtype);
  ur_status (*cast)(void *stream, const void *src, ur_dtype src_dtype, void *dst,
                    ur_dtype dst_dtype, int64_t n);
  /* Entries of s1, s2 and halves may be NULL where the rule or the caller needs none. */
  ur_status (*optim_step)(void *stream, const ur_optim_cfg *cfg, int32_t n, float *const *params,
                          float *const *grads, float *const *s1, float *const *s2,
                          void *const *halves, const int64_t *numel);

  /* tbe: embedding collections (engine/src/tbe_plan.h holds the argument structs; tbe.c has
   * checked every tensor).  work is device memory of the bytes tbe_work_bytes gives. */
  ur_status (*tbe_work_bytes)(const struct ur__tbe_args *a, int backward, size_t *out);
  ur_status (*tbe_forward)(void *stream, const struct ur__tbe_args *a, void *work);
  /* Sorts, sums each distinct row's gradient and steps the optimizer, all on the stream. */
  ur_status (*tbe_backward)(void *stream, const struct ur__tbe_args *a,
                            const struct ur__tbe_hyper *h, void *work);
  /* The deduplicated gradient in two calls on the same work: count (synchronous, fills
   * counts[num_tables] in host memory), then write rows i64 [U] and grads f32. */
  ur_status (*tbe_sparse_count)(void *stream, const struct ur__tbe_args *a, void *work,
                                int64_t *counts);
  ur_status (*tbe_sparse_write)(void *stream, const struct ur__tbe_args *a, void *work,
                                const int64_t *counts, int64_t *rows, float *grads);
  /* out[i] = src[ids[i]], rows of row_bytes (a multiple of 4). */
  ur_status (*gather_rows)(void *stream, const void *src, size_t row_bytes, const int64_t *ids,
                           int64_t n, void *out);
  /* metrics (engine/src/metrics_job.h; metrics.c has checked every tensor and holds the CPU
   * forms).  update adds a batch to job->state and job's ring; window puts the raw values
   * of job's samples into job->raw (AUC terms included as job->auc and job->grouped ask);
   * lifetime puts those of job->state into job->raw; scratch says what window needs. */
  ur_status (*metrics_update)(void *stream, const struct ur__metrics_job *job);
  ur_status (*metrics_window)(void *stream, const struct ur__metrics_job *job);
  ur_status (*metrics_lifetime)(void *stream, const struct ur__metrics_job *job);
  ur_status (*metrics_scratch)(const struct ur__metrics_job *job, size_t *bytes);

  /* data: the synthetic generator (synth.c has checked the outputs: device memory, sizes). */
  ur_status (*synth)(void *stream, const struct ur__synth *x, int64_t first, int64_t n,
                     void *dense, void *labels, void *ids, void *weights, void *lengths,
                     void *groups, void *probs);

  /* tbe access counters (engine/src/tbe_stats.c): c[i] = floor(c[i] * factor), n of them. */
  ur_status (*tbe_decay_counts)(void *stream, int32_t *c, int64_t n, double factor);

  /* cache (engine/src/cache.h): rows between host memory and the slot storage, for n entries
   * (pairs in device memory); to_host 1: slot rows to host memory, 0: host rows to slots. */
  ur_status (*cache_move)(void *stream, const struct ur__cache_io *io, const int64_t *entries,
                          int64_t n, int32_t to_host);
  /* Work enqueued on stream after this call waits for event (cudaStreamWaitEvent). */
  ur_status (*stream_wait)(void *stream, void *event);

  /* kjt (engine/src/kjt.c has checked every size; pointers are GPU-visible memory of the
   * current GPU unless called host arrays).  offsets: off [nb + 1] from len; with val0 (host,
   * nkeys + 1) it also waits and gives val0[k] = off[bag0[k]] (bag0 host), bad[0] the first
   * negative length and bad[1] the first bag ending past nv values (-1: none). */
  ur_status (*kjt_offsets)(void *stream, const int32_t *len, int64_t nb, int64_t *off,
                           const int64_t *bag0, int32_t nkeys, int64_t nv, int64_t *val0,
                           int64_t *bad);
  /* Waits; bad[0]: first bag with a negative length or offsets that disagree with it, bad[1]:
   * first sound bag holding an id outside [0, rows[key]) where rows (host) is given and > 0,
   * bad[2]: first inverse index outside its key's stride (spk host); -1: none. */
  ur_status (*kjt_validate)(void *stream, const int32_t *len, const int64_t *off,
                            const int64_t *val, const int64_t *inv, int64_t nv, int32_t nkeys,
                            int64_t stride, const int64_t *bag0, const int64_t *spk,
                            const int64_t *rows, int64_t *bad);
  /* dst elements (elem_bytes 4 or 8) from nseg runs (segs in host memory, engine/src/kjt.h). */
  ur_status (*kjt_segments)(void *stream, void *dst, size_t elem_bytes,
                            const struct ur__kjt_seg *segs, int64_t nseg);
  /* map[k * stride + j] = bag0[k] + (inv ? inv[k * stride + j] : j); bag0 in host memory. */
  ur_status (*kjt_expand_map)(void *stream, const int64_t *inv, const int64_t *bag0,
                              int32_t nkeys, int64_t stride, int64_t *map);
  /* len_out[i] = len[map[i]], off_out [n + 1] their offsets; with nat > 0 it waits and gives
   * at[j] = off_out[j * step] (host) for j < nat. */
  ur_status (*kjt_bag_lengths)(void *stream, const int32_t *len, const int64_t *map, int64_t n,
                               int32_t *len_out, int64_t *off_out, int64_t step, int32_t nat,
                               int64_t *at);
  /* Values (and weights, w may be NULL) of bag map[i] to off_out[i]... */
  ur_status (*kjt_bag_copy)(void *stream, const int64_t *off, const int64_t *val, const float *w,
                            const int64_t *map, int64_t n, const int64_t *off_out,
                            int64_t *val_out, float *w_out);
  /* dst row k * stride + j = src row bag0[k] + (inv ? inv[k * stride + j] : j), rows of
   * row_bytes; bag0 in host memory. */
  ur_status (*kjt_expand_rows)(void *stream, const void *src, size_t row_bytes,
                               const int64_t *inv, const int64_t *bag0, int32_t nkeys,
                               int64_t stride, void *dst);
  /* Per key of nkeys * stride bags, the distinct bags (ids and weight bits) in order of first
   * appearance; waits.  map [sum of spk]: each distinct bag's first bag, key-major; inv
   * [nkeys * stride]; host spk [nkeys] and val0 [nkeys + 1] (each key's first value). */
  ur_status (*kjt_dedup)(void *stream, const int64_t *off, const int64_t *val, const float *w,
                         const int32_t *len, int32_t nkeys, int64_t stride, int64_t *map,
                         int64_t *inv, int64_t *spk, int64_t *val0);

  /* cache decisions (engine/src/cache.h): scratch bytes for a batch of n values; then one
   * batch's lookup, decide and place on stream (each copies the job's info to info_host,
   * which the caller reads after a stream sync); mark sets dirty[slots[0..n-1]] = 1. */
  ur_status (*cache_scratch)(const struct ur__cache_dev *d, int64_t n, size_t *bytes);
  ur_status (*cache_lookup)(void *stream, const struct ur__cache_dev *d,
                            const struct ur__cache_job *j);
  ur_status (*cache_decide)(void *stream, const struct ur__cache_dev *d,
                            const struct ur__cache_job *j);
  ur_status (*cache_place)(void *stream, const struct ur__cache_dev *d,
                           const struct ur__cache_job *j);
  ur_status (*cache_mark)(void *stream, uint8_t *dirty, const int64_t *slots, int64_t n);
} ur_backend;

/* The two symbols libuvmrec_cuda.so exports: init, and the targets it was built for (which
 * work without a GPU). */
typedef ur_status (*ur_backend_init_fn)(const ur_core_api *core, const ur_backend **out);
typedef const char *(*ur_backend_archs_fn)(void);
#define UR_CUDA_BACKEND_INIT "ur_cuda_backend_init"
#define UR_CUDA_BACKEND_ARCHS "ur_cuda_backend_archs"

#endif
