/* backend.h: the core table a compute backend fills (ggml-backend's shape): devices, memory,
 * streams, events and hints, and a pointer to each op family's table.  The CPU backend is
 * always in libuvmrec; the CUDA one lives in libuvmrec_cuda.so, loaded at run time, and
 * reaches the core only through the ur_core_api it is handed, so it links nothing of ours. */
#ifndef UR_BACKEND_H
#define UR_BACKEND_H

#include "uvmrec.h"

#define UR_BACKEND_ABI 13

/* What the core lends a backend. */
typedef struct ur_core_api {
  int abi;
  /* Sets the thread-local error and returns status. */
  ur_status (*set_error)(ur_status status, const char *fmt, ...)
      __attribute__((format(printf, 2, 3)));
  int (*interrupted)(void);
  /* The backend's own working memory on a GPU (workspaces it keeps), counted in ur_memory_stats'
   * workspace and against the HBM budget as device tensors are: take before allocating (fails
   * with the budget's error, naming what, and changes nothing), give back after freeing. */
  ur_status (*workspace_take)(uint64_t bytes, const char *what);
  void (*workspace_give)(uint64_t bytes);
  double (*clock_seconds)(void); /* the monotonic clock of timings (ur_clock_seconds) */
} ur_core_api;

/* The op families' tables, each declared in its family's header and filled by the family's
 * CPU reference and by the CUDA backend (kernels/<family>.cu).  An entry a backend leaves NULL
 * is an op it does not have: UR__NEED (core.h) turns that into "<op> is not available on
 * <backend>". */
struct ur_dense_ops;    /* dense/dense.h */
struct ur_tbe_ops;      /* embedding/tbe.h */
struct ur_qtbe_ops;     /* embedding/qtbe.h */
struct ur_cache_ops;    /* embedding/cache.h */
struct ur_kjt_ops;      /* data/kjt.h */
struct ur_synth_ops;    /* data/synth.h */
struct ur_metrics_ops;  /* metrics/metrics.h */
struct ur_mc_ops;       /* embedding/mc.h */
struct ur_comm_ops;     /* dist/comm.h */

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
  /* Reads bytes of src (memory on a GPU) into host memory out once the work before on stream
   * is done, and returns when they are there.  A copy engine serves its copies one at a time,
   * in order, whatever their streams: a few bytes read that way wait behind every big copy
   * already given to it (the far rows' write home: a millisecond).  So small reads go through
   * the SMs into pinned memory instead, waiting for their own stream only. */
  ur_status (*read)(void *stream, void *out, const void *src, size_t bytes);
  /* Fills n elements of elem_bytes each (1, 2, 4 or 8) with the bit pattern in value. */
  ur_status (*fill)(void *stream, void *dst, size_t n, size_t elem_bytes, uint64_t value);
  /* Counter-based random numbers (see philox.h): element i, at row i / cols and column
   * i % cols, takes philox(seed, first + row * pitch + column), so a block of columns of a
   * wider array draws that array's numbers (pitch = cols: counters first + i); the CPU backend
   * gives the same numbers. */
  ur_status (*rand)(void *stream, void *dst, ur_dtype dtype, size_t n, uint64_t first,
                    size_t cols, uint64_t pitch, ur_dist dist, double a, double b, uint64_t seed);
  /* The same draw for scattered rows (re-initialising embedding rows): row phys[j] of dst
   * (row_elems elements of a float dtype) takes the uniform numbers on [a, b) that rand with
   * first 0 gives elements ids[j] * row_elems .. + row_elems - 1; n rows, phys and ids in
   * memory the backend reads. */
  ur_status (*rand_rows)(void *stream, void *dst, ur_dtype dtype, size_t row_elems,
                         const int64_t *phys, const int64_t *ids, size_t n, double a, double b,
                         uint64_t seed);
  /* Rows rows[j] of dst (row_bytes each, a multiple of 4) set to zero; n rows. */
  ur_status (*zero_rows)(void *stream, void *dst, size_t row_bytes, const int64_t *rows,
                         size_t n);

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

  /* Work enqueued on stream after this call waits for event (cudaStreamWaitEvent). */
  ur_status (*stream_wait)(void *stream, void *event);
  /* fn(ctx) on a host thread once the work before it on stream is done; work enqueued on the
   * stream after it waits for it to return (cudaLaunchHostFunc).  fn may not call the backend. */
  ur_status (*host_call)(void *stream, void (*fn)(void *ctx), void *ctx);
  /* Graph capture on stream, its end into *exec (an executable graph, updated when given and
   * of the same shape, else replaced) launched once, replay, release.  NULL: work is eager. */
  ur_status (*graph_begin)(void *stream);
  ur_status (*graph_end)(void *stream, void **exec);
  ur_status (*graph_launch)(void *exec, void *stream);
  void (*graph_free)(void *exec);

  /* ORs "an element is NaN or +-Inf" of n arrays (counts[i] elements of dtypes[i]: f32, bf16,
   * f16 or f64) into a guard's flags as slots slot0 + i (uvmrec.h's ur_nonfinite_check),
   * n <= UR__NONFINITE_GROUP; and the end of a step (ur_nonfinite_end_step). */
  ur_status (*nonfinite_check)(void *stream, int32_t n, const void *const *xs,
                               const ur_dtype *dtypes, const int64_t *counts, int32_t *flags,
                               int32_t slot0);
  ur_status (*nonfinite_end)(void *stream, int32_t *flags, int32_t sticky);

  const struct ur_dense_ops *dense;
  const struct ur_tbe_ops *tbe;
  const struct ur_cache_ops *cache;
  const struct ur_kjt_ops *kjt;
  const struct ur_synth_ops *synth;
  const struct ur_metrics_ops *metrics;
  const struct ur_qtbe_ops *qtbe;
  const struct ur_mc_ops *mc;
  const struct ur_comm_ops *comm;
} ur_backend;

/* Arrays per nonfinite_check call (for the GPU, one launch). */
#define UR__NONFINITE_GROUP 32

/* The two symbols libuvmrec_cuda.so exports: init, and the targets it was built for (which
 * work without a GPU). */
typedef ur_status (*ur_backend_init_fn)(const ur_core_api *core, const ur_backend **out);
typedef const char *(*ur_backend_archs_fn)(void);
#define UR_CUDA_BACKEND_INIT "ur_cuda_backend_init"
#define UR_CUDA_BACKEND_ARCHS "ur_cuda_backend_archs"

#endif
