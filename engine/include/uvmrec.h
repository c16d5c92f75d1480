/* uvmrec.h: the whole public C API of the uvmrec engine (Lua-free).
 *
 * Every fallible function returns ur_status (0 ok, negative failure); the reason is in
 * ur_last_error(), a thread-local message naming the object, the value and the expectation.
 * Handles are opaque; the few plain structs are those a caller must read, each with a
 * ur_sizeof_X() so bindings can check their layout.  Argument order: stream first, then
 * inputs, then outputs (marked out), then parameters.
 *
 * The block between UR_CDEF_BEGIN and UR_CDEF_END is turned into lua/uvmrec/cdef.lua by
 * make: keep it free of preprocessor lines, and mark exported functions with UR_API. */
#ifndef UVMREC_H
#define UVMREC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define UR_API __attribute__((visibility("default")))
#define UR_VERSION "0.1.0"
#define UR_MAX_DIMS 4
#define UR_MAX_GPUS 63

/* UR_CDEF_BEGIN */
typedef int ur_status;
enum {
  UR_STATUS_OK = 0,
  UR_STATUS_INVALID = -1,     /* bad argument: value out of range, wrong dtype, ... */
  UR_STATUS_OOM = -2,         /* allocation failed or the HBM budget would be exceeded */
  UR_STATUS_DEVICE = -3,      /* a CUDA call failed; the message carries CUDA's */
  UR_STATUS_IO = -4,
  UR_STATUS_UNSUPPORTED = -5, /* needs something this machine lacks (a GPU, CUPTI) */
  UR_STATUS_INTERRUPTED = -6
};

typedef enum ur_dtype {
  UR_DTYPE_F32 = 0, UR_DTYPE_BF16, UR_DTYPE_F16, UR_DTYPE_I8, UR_DTYPE_U8,
  UR_DTYPE_I32, UR_DTYPE_I64, UR_DTYPE_COUNT
} ur_dtype;

typedef enum ur_place {
  UR_PLACE_HOST = 0,  /* malloc */
  UR_PLACE_PINNED,    /* page-locked, mapped for zero-copy GPU access */
  UR_PLACE_DEVICE,    /* cudaMalloc; counts against the HBM budget */
  UR_PLACE_MANAGED,   /* cudaMallocManaged; host memory when there is no GPU */
  UR_PLACE_COUNT
} ur_place;

typedef enum ur_advice {
  UR_ADVICE_PREFERRED_LOCATION = 0, UR_ADVICE_UNSET_PREFERRED_LOCATION,
  UR_ADVICE_ACCESSED_BY, UR_ADVICE_UNSET_ACCESSED_BY,
  UR_ADVICE_READ_MOSTLY, UR_ADVICE_UNSET_READ_MOSTLY, UR_ADVICE_COUNT
} ur_advice;

/* Locations: a GPU ordinal (>= 0), or one of these. */
enum {
  UR_LOC_CPU = -1,
  UR_LOC_CURRENT_GPU = -2, /* accepted as input: the current device */
  UR_LOC_NONE = -3,        /* reported: no location set */
  UR_LOC_MIXED = -4        /* reported: the pages of the range disagree */
};

typedef enum ur_dist { UR_DIST_UNIFORM = 0, UR_DIST_NORMAL } ur_dist;

struct ur_tensor;
struct ur_stream;
struct ur_event;
typedef struct ur_tensor ur_tensor;
typedef struct ur_stream ur_stream;
typedef struct ur_event ur_event;

/* A hinted range after the engine rounded it outward to whole pages. */
typedef struct ur_range {
  int64_t offset, numel;          /* as asked, in elements */
  uint64_t byte_begin, byte_end;  /* rounded, in bytes from the start of the storage */
  uint64_t page_bytes;            /* the granularity used */
  int32_t rounded;                /* 1 when the rounding widened the range */
} ur_range;

/* What the driver's range attributes say (or, without a GPU, what was recorded):
 * advice, not a measurement. */
typedef struct ur_advised {
  int32_t preferred_location;     /* a GPU, UR_LOC_CPU, UR_LOC_NONE or UR_LOC_MIXED */
  int32_t last_prefetch_location; /* likewise */
  int32_t read_mostly;            /* 1 all pages, 0 none, -1 mixed */
  int32_t accessed_by_cpu;        /* 1 all pages, 0 none, -1 mixed */
  uint64_t accessed_by_gpus;      /* bit N: every page is accessed-by GPU N */
  int32_t from_driver;            /* 1: read from the driver; 0: from the engine's record */
  ur_range range;
} ur_advised;

/* One entry of the hint log: every advise and prefetch the engine applied or recorded. */
typedef struct ur_hint_record {
  uint64_t seq;                   /* 1-based, over the process's lifetime */
  uint64_t tensor_id;
  int32_t is_prefetch;
  int32_t advice;                 /* ur_advice, or -1 for a prefetch */
  int32_t location;
  int32_t applied;                /* 1: passed to the driver; 0: recorded only (no GPU) */
  ur_range range;
} ur_hint_record;

typedef struct ur_device_props {
  char name[256];
  int32_t ordinal, major, minor, sm_count;
  int32_t managed_memory, concurrent_managed_access, pageable_memory_access;
  int32_t stream_priority_low, stream_priority_high;
  uint64_t total_bytes, free_bytes, l2_bytes;
} ur_device_props;

/* Bytes the engine holds per placement, and HBM use against the budget. */
typedef struct ur_memory_stats {
  uint64_t bytes[4];              /* indexed by ur_place */
  uint64_t managed_on_gpu;        /* managed bytes advised preferred-on or prefetched to a GPU */
  uint64_t hbm_used;              /* device bytes + managed_on_gpu */
  uint64_t hbm_budget;            /* 0: no budget */
  uint64_t hbm_peak;
} ur_memory_stats;

/* Migration measured over an interval (CUPTI unified-memory counters). */
typedef struct ur_migration_stats {
  uint64_t bytes_htod, bytes_dtoh;
  uint64_t gpu_page_faults, cpu_page_faults;
  uint64_t thrashing, throttling, remote_map;
  double seconds;                 /* length of the interval */
  int32_t source;                 /* 1 CUPTI, 0 no monitor running */
} ur_migration_stats;

/* A timed-read probe of a range on the GPU. */
typedef struct ur_residency {
  double seconds, gbps;
  int32_t fast;                   /* 1: read at HBM-like speed; 0: host-link speed */
  ur_range range;
} ur_residency;

UR_API size_t ur_sizeof_range(void);
UR_API size_t ur_sizeof_advised(void);
UR_API size_t ur_sizeof_hint_record(void);
UR_API size_t ur_sizeof_device_props(void);
UR_API size_t ur_sizeof_memory_stats(void);
UR_API size_t ur_sizeof_migration_stats(void);
UR_API size_t ur_sizeof_residency(void);

/* Errors and the library. */
UR_API const char *ur_last_error(void);
UR_API const char *ur_status_name(ur_status s);
UR_API const char *ur_version(void);
UR_API int ur_cuda_built(void);           /* 1 when libuvmrec_cuda.so was found and loads */
UR_API const char *ur_cuda_archs(void);   /* its targets, "sm_80 sm_90 compute_90"; "" if none */
UR_API const char *ur_cuda_error(void);   /* why the CUDA backend is not in use, or "" */
UR_API ur_status ur_set_interrupt(int on);/* long engine calls poll this flag */
UR_API int ur_interrupted(void);

/* Names <-> enums ("f32", "pinned", "preferred_location" or
 * "cudaMemAdviseSetPreferredLocation", "cpu" / "gpu" / "cuda:N" / "N"). */
UR_API const char *ur_dtype_name(ur_dtype d);
UR_API size_t ur_dtype_size(ur_dtype d);
UR_API ur_status ur_dtype_parse(const char *s, ur_dtype *out);
UR_API const char *ur_place_name(ur_place p);
UR_API ur_status ur_place_parse(const char *s, ur_place *out);
UR_API const char *ur_advice_name(ur_advice a);
UR_API ur_status ur_advice_parse(const char *s, ur_advice *out);
UR_API ur_status ur_location_parse(const char *s, int32_t *out);
UR_API ur_status ur_location_format(int32_t loc, char *buf, size_t len);

/* Devices. */
UR_API int ur_device_count(void);         /* 0 without a GPU */
UR_API ur_status ur_device_set(int32_t device);
UR_API ur_status ur_device_get(int32_t *out);
UR_API ur_status ur_device_props_get(int32_t device, ur_device_props *out);
UR_API ur_status ur_device_sync(void);

/* HBM budget: every byte the engine places on a GPU counts against it. 0 removes it. */
UR_API ur_status ur_set_hbm_budget(uint64_t bytes);
UR_API uint64_t ur_hbm_budget(void);
UR_API ur_status ur_memory(ur_memory_stats *out);

/* Streams and events.  Without a GPU they exist and order nothing (work is synchronous). */
UR_API ur_status ur_stream_new(ur_stream **out, int32_t priority);
UR_API void ur_stream_free(ur_stream *s);
UR_API ur_status ur_stream_sync(ur_stream *s);
UR_API int32_t ur_stream_priority(const ur_stream *s);
UR_API ur_status ur_event_new(ur_event **out);
UR_API void ur_event_free(ur_event *e);
UR_API ur_status ur_event_record(ur_event *e, ur_stream *s);
UR_API ur_status ur_event_sync(ur_event *e);
UR_API ur_status ur_event_elapsed(const ur_event *start, const ur_event *end, double *ms);

/* Tensors. */
UR_API ur_status ur_tensor_new(ur_tensor **out, ur_dtype dtype, int32_t ndim,
                               const int64_t *shape, ur_place place, int32_t device);
UR_API void ur_tensor_free(ur_tensor *t);
UR_API ur_status ur_tensor_view(const ur_tensor *t, ur_tensor **out, int64_t row0, int64_t nrows);
UR_API ur_status ur_tensor_to(ur_stream *s, const ur_tensor *src, ur_tensor **out,
                              ur_place place, int32_t device);
UR_API ur_status ur_tensor_copy(ur_stream *s, const ur_tensor *src, ur_tensor *dst);
UR_API ur_status ur_tensor_fill(ur_stream *s, ur_tensor *t, double value);
UR_API ur_status ur_tensor_rand(ur_stream *s, ur_tensor *t, ur_dist dist, double a, double b,
                                uint64_t seed);
UR_API ur_status ur_tensor_get(const ur_tensor *t, int64_t index, double *out);
UR_API ur_status ur_tensor_set(ur_tensor *t, int64_t index, double value);
UR_API ur_status ur_tensor_read(const ur_tensor *t, int64_t index, int64_t count, void *out);
UR_API ur_status ur_tensor_write(ur_tensor *t, int64_t index, int64_t count, const void *src);
/* Elements converted to double, for inspection and tests. */
UR_API ur_status ur_tensor_read_f64(const ur_tensor *t, int64_t index, int64_t count, double *out);
UR_API size_t ur_tensor_describe(const ur_tensor *t, char *buf, size_t len);
UR_API ur_dtype ur_tensor_dtype(const ur_tensor *t);
UR_API ur_place ur_tensor_place(const ur_tensor *t);
UR_API int32_t ur_tensor_device(const ur_tensor *t);
UR_API int32_t ur_tensor_ndim(const ur_tensor *t);
UR_API int64_t ur_tensor_dim(const ur_tensor *t, int32_t i);
UR_API int64_t ur_tensor_numel(const ur_tensor *t);
UR_API uint64_t ur_tensor_nbytes(const ur_tensor *t);
UR_API uint64_t ur_tensor_id(const ur_tensor *t);    /* the storage's id, shared by views */
UR_API int64_t ur_tensor_offset(const ur_tensor *t); /* a view's first element in its storage */
UR_API int32_t ur_tensor_refs(const ur_tensor *t);   /* handles sharing the storage */
UR_API void *ur_tensor_data(const ur_tensor *t);

/* Memory hints on managed tensors, by element offset and count within the tensor. */
UR_API ur_status ur_tensor_advise(ur_tensor *t, int64_t offset, int64_t numel, ur_advice advice,
                                  int32_t location, ur_range *out);
UR_API ur_status ur_tensor_prefetch(ur_stream *s, ur_tensor *t, int64_t offset, int64_t numel,
                                    int32_t location, ur_range *out);
UR_API ur_status ur_tensor_advised(const ur_tensor *t, int64_t offset, int64_t numel,
                                   ur_advised *out);
UR_API ur_status ur_tensor_residency(ur_stream *s, const ur_tensor *t, int64_t offset,
                                     int64_t numel, ur_residency *out);
UR_API uint64_t ur_hint_page_bytes(void);
UR_API ur_status ur_set_hint_page_bytes(uint64_t bytes);
UR_API uint64_t ur_hint_log_total(void);            /* records ever written */
UR_API uint64_t ur_hint_log_capacity(void);         /* the newest this many are kept */
UR_API ur_status ur_hint_log_get(uint64_t seq, ur_hint_record *out);
UR_API void ur_hint_log_clear(void);

/* Migration monitor (CUPTI unified-memory counters). */
UR_API ur_status ur_monitor_start(void);
UR_API ur_status ur_monitor_read(ur_migration_stats *out, int32_t reset);
UR_API ur_status ur_monitor_stop(void);
/* UR_CDEF_END */

#ifdef __cplusplus
}
#endif
#endif
