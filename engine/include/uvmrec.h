/* uvmrec.h: the whole public C API of the uvmrec engine (Lua-free).
 *
 * Contents (each section opens with a "==== N. name ====" comment line):
 *   1. core        statuses and errors, the library, names of enums, devices, memory and the
 *                  HBM budget, streams and events, tensors, non-finite values (the training
 *                  guard's flags), interrupts and signals, the clock,
 *                  optimizer settings (the dense parameters' and the embedding tables' alike)
 *   2. hints       advice and prefetch on managed tensors, what is advised, what moved
 *   3. data        keyed jagged tensors (KJT), .npy arrays, Criteo TSV, synthetic data, the
 *                  loader and its batches
 *   4. embeddings  table-batched collections (tbe), far rows' copies, access counters and row
 *                  layout, page prefetch of managed tables, managed collisions (raw ids to rows)
 *   5. cache       the software HBM cache of `cached` tables
 *   6. dense       linear layers, activations, interaction, cross layers, concat, loss,
 *                  the dense optimizers' step, arenas
 *   7. metrics     AUC, grouped AUC, NE and the rest, streaming
 *   8. io          checkpoints (safetensors), configs (YAML), JSON
 *   9. dist        communicators over the ranks of a job (NCCL on GPUs, MPI on hosts)
 *  10. serve       quantized rows and collections (qtbe), exported model files, the serving
 *                  API (ur_model_*)
 *
 * Every fallible function returns ur_status (0 ok, negative failure); the reason is in
 * ur_last_error(), a thread-local message naming the object, the value and the expectation.
 * Pointer arguments must not be NULL unless the parameter says "or NULL" (a stream may always
 * be: NULL is the default stream): a NULL one is UR_STATUS_INVALID with "<function>: argument
 * '<name>' is NULL", and functions returning nothing (the _free ones, ...) do nothing with NULL.
 * Functions returning a value (a count, a dim, a name, a handle) set that same message for a
 * NULL argument (an out pointer too, as ur_mc_reassigned's count) and answer NULL for a pointer,
 * -1 for a signed number, 0 for an unsigned one, the enum's _COUNT for ur_dtype and ur_place
 * and NaN for ur_tbe_lr; ur_json's readers answer as for a value of another type (UR_JSON_NULL,
 * 0).  Where that answer is also a valid one (-1 from ur_tensor_device is the CPU, NULL from
 * ur_kjt_weights is unweighted), a caller that may hold NULL checks it first.
 * A constructor that fails past that check leaves its new handle NULL (*out = NULL).
 * Handles are opaque; the few plain structs are those a caller must read, each with a
 * ur_sizeof_X() so bindings can check their layout.  Names are ur_<object>_<verb>.  Argument
 * order (THNN's): the stream first, then the object acted on and the inputs (what selects in
 * them, a table, an index or a range, goes with them), then the outputs (marked out), then the
 * parameters; a constructor's new handle comes first.
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
#define UR_SYNTH_MAX_TABLES 65536 /* sparse features of a synthetic spec or day files (the
                                     per-table arrays are sized by the actual count) */

/* UR_CDEF_BEGIN */
/* ==== 1. core: statuses, library, names, devices, memory, streams, tensors, interrupts, optimizers ==== */
typedef int ur_status;
enum {
  UR_STATUS_OK = 0,
  UR_STATUS_INVALID = -1,     /* bad argument: value out of range, wrong dtype, ... */
  UR_STATUS_OOM = -2,         /* allocation failed or the HBM budget would be exceeded */
  UR_STATUS_DEVICE = -3,      /* a CUDA call failed; the message carries CUDA's */
  UR_STATUS_IO = -4,
  UR_STATUS_UNSUPPORTED = -5, /* needs something this machine lacks (a GPU, CUPTI) */
  UR_STATUS_INTERRUPTED = -6,
  UR_STATUS_FORMAT = -7       /* malformed input data (a file's contents): position in the message */
};

typedef enum ur_dtype {
  UR_DTYPE_F32 = 0, UR_DTYPE_BF16, UR_DTYPE_F16, UR_DTYPE_I8, UR_DTYPE_U8,
  UR_DTYPE_I32, UR_DTYPE_I64,
  UR_DTYPE_F64, /* for sums that must not round: metric state reduced over ranks */
  UR_DTYPE_COUNT
} ur_dtype;

typedef enum ur_place {
  UR_PLACE_HOST = 0,  /* malloc */
  UR_PLACE_PINNED,    /* page-locked, mapped for zero-copy GPU access */
  UR_PLACE_DEVICE,    /* cudaMalloc; counts against the HBM budget */
  UR_PLACE_MANAGED,   /* cudaMallocManaged; host memory when there is no GPU */
  UR_PLACE_COUNT
} ur_place;

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
struct ur_graph;
typedef struct ur_tensor ur_tensor;
typedef struct ur_stream ur_stream;
typedef struct ur_event ur_event;
typedef struct ur_graph ur_graph;

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
  uint64_t hbm_used;              /* device bytes + managed_on_gpu + workspace */
  uint64_t hbm_budget;            /* 0: no budget */
  uint64_t hbm_peak;
  uint64_t workspace;             /* the GPU backend's own working memory: the dense ops'
                                     workspace of each stream that ran a matrix product */
  uint64_t allocs[4], frees[4];   /* tensor storage allocated and freed so far, by ur_place: on
                                     a GPU a device, pinned or managed free waits for the whole
                                     device (cudaFree, cudaFreeHost) */
} ur_memory_stats;

UR_API size_t ur_sizeof_device_props(void);
UR_API size_t ur_sizeof_memory_stats(void);

/* Errors and the library. */
UR_API const char *ur_last_error(void);
UR_API const char *ur_status_name(ur_status s);
UR_API const char *ur_version(void);
UR_API int ur_cuda_built(void);           /* 1 when libuvmrec_cuda.so was found and loads */
UR_API const char *ur_cuda_archs(void);   /* its targets, "sm_90 compute_90"; "" if none */
UR_API const char *ur_cuda_error(void);   /* why the CUDA backend is not in use, or "" */

/* Names <-> enums ("f32", "pinned", "preferred_location" or
 * "cudaMemAdviseSetPreferredLocation", "cpu" / "gpu" / "cuda:N" / "N"). */
UR_API const char *ur_dtype_name(ur_dtype d);
UR_API size_t ur_dtype_size(ur_dtype d);
UR_API ur_status ur_dtype_parse(const char *s, ur_dtype *out);
UR_API const char *ur_place_name(ur_place p);
UR_API ur_status ur_place_parse(const char *s, ur_place *out);
UR_API ur_status ur_location_parse(const char *s, int32_t *out);
UR_API ur_status ur_location_format(int32_t loc, char *buf, size_t len);

/* Devices. */
UR_API int ur_device_count(void);         /* 0 without a GPU */
UR_API ur_status ur_device_set(int32_t device);
UR_API ur_status ur_device_get(int32_t *out);
UR_API ur_status ur_device_props_get(int32_t device, ur_device_props *out);
UR_API ur_status ur_device_sync(void);

/* HBM budget: every byte the engine places on a GPU counts against it. 0 removes it. */
UR_API ur_status ur_hbm_budget_set(uint64_t bytes);
UR_API uint64_t ur_hbm_budget_get(void);
UR_API ur_status ur_memory_get(ur_memory_stats *out);
UR_API void ur_memory_peak_reset(void);    /* hbm_peak from now: the HBM in use now */

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

/* Work enqueued on s after this call waits until e has happened (the prefetch pipeline's
 * stages meet through this; without a GPU work is synchronous and it returns at once). */
UR_API ur_status ur_stream_wait_event(ur_stream *s, ur_event *e);

/* Graphs: the work a sequence of calls enqueues on a stream (and on the streams it forks and
 * joins back), captured once and replayed with one launch.  ur_graph_begin starts capturing s
 * (a stream of ur_stream_new: the default stream cannot be captured); the calls that follow
 * only record their work, so nothing they compute may be read on the host before the end.
 * ur_graph_end stops, turns the capture into *g (updating *g in place when it is a graph of
 * the same shape from an earlier capture, else replacing it) and launches it once, so that the
 * calls' work is done as if they had run.  ur_graph_launch replays it on s: the same kernels on
 * the same memory with the same arguments (numbers computed on the host, such as learning
 * rates, are those of the capture).  A call that waits for the GPU, allocates device memory or
 * reads results breaks the capture: ur_graph_end then fails with the reason and leaves *g as
 * it was.  Without a GPU the calls run as they are made: begin and end do nothing (*g stays
 * NULL) and launch says it needs a GPU. */
UR_API ur_status ur_graph_begin(ur_stream *s);
UR_API ur_status ur_graph_end(ur_stream *s, ur_graph **g /* in, out */);
UR_API ur_status ur_graph_launch(ur_graph *g /* or NULL: what ur_graph_end gives without a GPU */, ur_stream *s);
UR_API void ur_graph_free(ur_graph *g);

/* Tensors.  A tensor holds at most 2^UR_TENSOR_MAX_BYTES_LOG2 bytes; so does its shape with
 * each 0 dimension counted as 1 (a 0 lets no other dimension be anything): a larger shape is
 * refused naming it, by tensors, views and safetensors files alike. */
enum { UR_TENSOR_MAX_BYTES_LOG2 = 50 };
UR_API ur_status ur_tensor_new(ur_tensor **out, ur_dtype dtype, int32_t ndim,
                               const int64_t *shape, ur_place place, int32_t device);
UR_API void ur_tensor_free(ur_tensor *t);
UR_API ur_status ur_tensor_view(const ur_tensor *t, ur_tensor **out, int64_t row0, int64_t nrows);
/* A view of any shape whose first element is element `offset` of t (counting from t's first);
 * it may reach past t's own elements but not past its storage. */
UR_API ur_status ur_tensor_view_as(const ur_tensor *t, ur_tensor **out, int64_t offset,
                                   int32_t ndim, const int64_t *shape);
UR_API ur_status ur_tensor_to(ur_stream *s, const ur_tensor *src, ur_tensor **out,
                              ur_place place, int32_t device);
UR_API ur_status ur_tensor_copy(ur_stream *s, const ur_tensor *src, ur_tensor *dst);
UR_API ur_status ur_tensor_fill(ur_stream *s, ur_tensor *t, double value);
UR_API ur_status ur_tensor_rand(ur_stream *s, ur_tensor *t, ur_dist dist, double a, double b,
                                uint64_t seed);
UR_API ur_status ur_tensor_get(const ur_tensor *t, int64_t index, double *out);
UR_API ur_status ur_tensor_set(ur_tensor *t, int64_t index, double value);
/* Reads wait for the default stream's work.  Up to 4 KiB of a GPU's device memory are read by
 * its SMs, so they do not queue behind other streams' copies on the copy engines; bigger reads
 * are copies (and may). */
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

/* A plain row gather, out[i] = src[ids[i]] (src [rows, dim] 2-D, out [n, dim], same dtype):
 * the ceiling the embedding kernels are measured against.  ids are not checked on the GPU. */
UR_API ur_status ur_tensor_gather_rows(ur_stream *s, const ur_tensor *src, const ur_tensor *ids,
                                       ur_tensor *out);

/* Non-finite values: the guard of a training step (train.nonfinite, docs/training.md) and the
 * checkpoints' load check.  A guard's flags are i32 [UR_NONFINITE_HEAD + slots], zeroed by their
 * owner, in memory the work's backend reads (device memory on a GPU): [0] 1 once the current
 * step held a NaN or an infinity (a gate: ur_optim_step and ur_tbe_set_gate skip their update
 * while it is set), [1] steps ended, [2] steps that ended with [0] set since the owner last
 * cleared it; [UR_NONFINITE_HEAD + i] the step (1 + [1] then) in which slot i's tensor first
 * held one, 0 while it never did.  Skipped steps are no updates: the gated Adam updates take
 * [2] off their number (the dense step's cfg->step, the collection's count) where they run,
 * so the owner that clears [2] takes it off those counts at the same time. */
enum { UR_NONFINITE_HEAD = 3 };
/* ORs "some element is NaN or +-Inf" of each of n tensors (f32, bf16, f16, f64; any shape)
 * into flags, tensor i as slot first_slot + i.  Ordered on s; reads nothing back (on a GPU: one
 * launch for every 32 tensors, no wait).  The tensors and flags are on one side (GPU or host). */
UR_API ur_status ur_nonfinite_check(ur_stream *s, int32_t n, const ur_tensor *const *xs,
                                    ur_tensor *flags, int32_t first_slot);
/* The end of a step, ordered on s: [1] += 1, [2] += [0], and [0] cleared unless sticky. */
UR_API ur_status ur_nonfinite_end_step(ur_stream *s, ur_tensor *flags, int32_t sticky);
/* *out = the index of x's first NaN or infinity (f32, bf16, f16, f64), or -1.  Synchronous;
 * x in memory the CPU reads (host, pinned, managed), as a checkpoint file's views are. */
UR_API ur_status ur_tensor_find_nonfinite(const ur_tensor *x, int64_t *out);

/* Interrupts: long engine calls poll a flag, which SIGINT and SIGTERM may raise. */
UR_API ur_status ur_interrupt_set(int32_t on);
UR_API int32_t ur_interrupt_get(void);
/* on = 1: SIGINT and SIGTERM (unless the process inherited them ignored) only raise the
 * interrupt flag (ur_interrupt_get) and are remembered, instead of ending the process; each
 * handler is one-shot, so a second signal ends the process as usual.  on = 0: the previous
 * handlers come back, after which ur_signals_caught still says what came before them (read it
 * then: a signal between a read and the handlers' return is not lost).  Both clear the flag;
 * on = 1 also the remembered signal. */
UR_API ur_status ur_signals_catch(int32_t on);
/* The signal caught since ur_signals_catch(1) (SIGINT 2, SIGTERM 15), or 0. */
UR_API int32_t ur_signals_caught(void);
/* Monotonic seconds (rates, ETAs, timings). */
UR_API double ur_clock_seconds(void);

/* Optimizer settings: one kind and one struct for the dense parameters (ur_optim_step, PyTorch's
 * formulas) and the embedding tables, whose optimizer is fused into their backward
 * (ur_tbe_config.optim).  Dense parameters take sgd, adagrad, adam and adamw; tables take sgd,
 * rowwise_adagrad (one sum per row), adagrad and adam. */
typedef enum ur_optim_kind {
  UR_OPTIM_KIND_SGD = 0, UR_OPTIM_KIND_ADAGRAD, UR_OPTIM_KIND_ADAM, UR_OPTIM_KIND_ADAMW,
  UR_OPTIM_KIND_ROWWISE_ADAGRAD, UR_OPTIM_KIND_COUNT
} ur_optim_kind;

typedef struct ur_optim_config {
  int32_t kind;             /* ur_optim_kind */
  int32_t nesterov;         /* dense SGD with momentum */
  int32_t zero_grad;        /* dense: 1: gradients are zeroed once read */
  int32_t pad_;
  int64_t step;             /* dense: this update's number, from 1 (tables count their own) */
  double lr, weight_decay;  /* weight decay is L2 (g += weight_decay * w); AdamW's decoupled */
  double momentum;          /* dense SGD; 0 for none */
  double beta1, beta2;      /* Adam */
  double eps;               /* Adagrad, Adam */
  double max_grad;          /* tables: > 0 clips each gradient element to [-max_grad, max_grad] */
  double clip_norm;         /* dense: > 0 scales all gradients by min(1, clip_norm / (norm + 1e-6)),
                               norm the 2-norm of all of them together, as PyTorch's
                               clip_grad_norm_ (ur_optim_step's clip_work); 0: none */
} ur_optim_config;

UR_API size_t ur_sizeof_optim_config(void);

/* ==== 2. hints: advice and prefetch on managed tensors, what is advised, what moved ==== */
typedef enum ur_advice {
  UR_ADVICE_PREFERRED_LOCATION = 0, UR_ADVICE_UNSET_PREFERRED_LOCATION,
  UR_ADVICE_ACCESSED_BY, UR_ADVICE_UNSET_ACCESSED_BY,
  UR_ADVICE_READ_MOSTLY, UR_ADVICE_UNSET_READ_MOSTLY, UR_ADVICE_COUNT
} ur_advice;

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
  double device_gbps, host_gbps;  /* the same size read from device and pinned host memory */
  int32_t fast;                   /* 1: HBM-like speed; 0: host-link speed; -1: too small a
                                     read to tell (the two references within 4x) */
  ur_range range;
} ur_residency;

UR_API size_t ur_sizeof_range(void);
UR_API size_t ur_sizeof_advised(void);
UR_API size_t ur_sizeof_hint_record(void);
UR_API size_t ur_sizeof_migration_stats(void);
UR_API size_t ur_sizeof_residency(void);

UR_API const char *ur_advice_name(ur_advice a);
UR_API ur_status ur_advice_parse(const char *s, ur_advice *out);

/* Memory hints on managed tensors, by element offset and count within the tensor. */
UR_API ur_status ur_tensor_advise(ur_tensor *t, int64_t offset, int64_t numel,
                                  ur_range *out /* or NULL */, ur_advice advice, int32_t location);
UR_API ur_status ur_tensor_prefetch(ur_stream *s, ur_tensor *t, int64_t offset, int64_t numel,
                                    ur_range *out /* or NULL */, int32_t location);
UR_API ur_status ur_tensor_advised(const ur_tensor *t, int64_t offset, int64_t numel,
                                   ur_advised *out);
UR_API ur_status ur_tensor_residency(ur_stream *s, const ur_tensor *t, int64_t offset,
                                     int64_t numel, ur_residency *out);
UR_API uint64_t ur_hint_page_bytes_get(void);
UR_API ur_status ur_hint_page_bytes_set(uint64_t bytes);
UR_API uint64_t ur_hint_log_total(void);            /* records ever written */
UR_API uint64_t ur_hint_log_capacity(void);         /* the newest this many are kept */
UR_API ur_status ur_hint_log_get(uint64_t seq, ur_hint_record *out);
UR_API void ur_hint_log_clear(void);

/* Migration monitor (CUPTI unified-memory counters).  Reading waits for the device.  CUPTI
 * counts only managed memory allocated after the monitor started: start it first. */
UR_API ur_status ur_monitor_start(void);
UR_API ur_status ur_monitor_read(ur_migration_stats *out, int32_t reset);
UR_API ur_status ur_monitor_stop(void);

/* ==== 3. data: keyed jagged tensors, .npy, Criteo TSV, synthetic data, the loader ==== */
/* Keyed jagged tensors (engine/src/data/kjt.c).  Key-major: lengths[k * stride + b] is the bag of
 * key k for sample b, offsets its exclusive cumulative sum (num_keys * stride + 1 entries), so
 * offsets are directly the embedding kernels' bag offsets into values.  With a variable batch
 * per key (VBE; TorchRec's names), key k has stride_per_key_per_rank[k] bags (one rank) and
 * inverse_indices [num_keys, stride] gives, for each sample of the full batch, its bag within
 * that key.  A KJT holds views of the tensors it was given (the caller keeps its own handles);
 * accessors lend the KJT's own handles, valid while it lives. */
struct ur_kjt;
typedef struct ur_kjt ur_kjt;

/* values i64 [n], lengths i32 [sum of strides], weights f32 [n] or NULL;
 * stride_per_key_per_rank NULL for one stride for all keys (then inverse_indices must be NULL),
 * else each key's bags on each rank (TorchRec's names; one rank: num_keys entries) and
 * inverse_indices i64 [num_keys * stride].  All tensors in one placement (device: one GPU).
 * Offsets are computed here; lengths are checked (negative, sum) and inverse indices validated
 * unless check is 0.  With check 0 a bad KJT is made all the same, not known checked (see
 * ur_kjt_checked); one whose lengths the offsets' scan finds sound is known checked anyway,
 * inverse indices and all: those are read next, on the scan's stream (for a device KJT one more
 * pass and read back, no wait for the device's other streams; the tensors must be written when
 * given, as the scan reads the lengths at once). */
UR_API ur_status ur_kjt_new(ur_kjt **out, int32_t num_keys, const char *const *keys,
                            int64_t stride, const int64_t *stride_per_key_per_rank /* or NULL */,
                            ur_tensor *values, ur_tensor *lengths, ur_tensor *weights /* or NULL */,
                            ur_tensor *inverse_indices /* or NULL */, int32_t check);
UR_API void ur_kjt_free(ur_kjt *k);
UR_API int32_t ur_kjt_num_keys(const ur_kjt *k);
UR_API const char *ur_kjt_key(const ur_kjt *k, int32_t i);     /* NULL outside 0..num_keys-1 */
UR_API int32_t ur_kjt_key_index(const ur_kjt *k, const char *key); /* -1 when absent */
UR_API int64_t ur_kjt_stride(const ur_kjt *k);                 /* the full batch size */
UR_API int64_t ur_kjt_stride_of(const ur_kjt *k, int32_t i);   /* key i's bags (VBE) */
UR_API int32_t ur_kjt_variable_stride(const ur_kjt *k);        /* 1 for a VBE batch */
/* 1: k is known sound (lengths >= 0, offsets their running sum within the values, inverse
 * indices within their keys' strides): made with the checks, passed ur_kjt_validate, or made by
 * an op below from KJTs known sound.  0: not known (made with check 0), and dedup, expand and
 * bucketize, which read bag by bag, first run ur_kjt_validate's check (a pass over the lengths;
 * for a device KJT it waits for the device) and refuse a bad KJT naming the op, key and sample.
 * So does ur_model_predict, and uvmrec's Lua entries that hand a KJT's offsets to C or kernels
 * (the collections' forward, backward, prepare and pages, the quantized collection, managed
 * collisions, the sharded input; docs/data.md): a KJT known checked costs them one read of
 * this mark.
 * The mark holds for the contents as checked: a caller that writes into tensors it gave the KJT
 * calls ur_kjt_validate again, which also holds the offsets to the key spans the KJT kept from
 * its lengths when made (each key's first offset), refusing tensors written with other spans
 * (a copy into buffers reused for another batch: make a new KJT of them).  On a GPU it waits for
 * the device first (the writes of any stream). */
UR_API int32_t ur_kjt_checked(const ur_kjt *k);
UR_API const ur_tensor *ur_kjt_values(const ur_kjt *k);
UR_API const ur_tensor *ur_kjt_lengths(const ur_kjt *k);
UR_API const ur_tensor *ur_kjt_offsets(const ur_kjt *k);
UR_API const ur_tensor *ur_kjt_weights(const ur_kjt *k);       /* NULL: unweighted */
UR_API const ur_tensor *ur_kjt_inverse_indices(const ur_kjt *k); /* NULL unless VBE */
/* The first bag (lengths index) and first value of key i, and one past their ends. */
UR_API ur_status ur_kjt_key_span(const ur_kjt *k, int32_t i, int64_t *bag0, int64_t *bag1,
                                 int64_t *value0, int64_t *value1);
/* Checks lengths, offsets, sizes, inverse indices and, where rows[i] > 0, that key i's ids lie
 * in [0, rows[i]); rows may be NULL.  The error names the key and the position.  It marks k
 * known checked (ur_kjt_checked) when all but the ids are sound, and unmarks it when not; on
 * the GPU it waits for the device. */
UR_API ur_status ur_kjt_validate(const ur_kjt *k, const int64_t *rows /* or NULL */);
/* A KJT of keys order[0..n-1] (indices into k's keys; repeats allowed).  It copies each key's
 * span of values whole: spans that do not lie within the values one after the other (a KJT made
 * unchecked) are refused, naming the key, before anything is read; the bags within a span are
 * copied as they are (ur_kjt_validate checks them).  Permute, split and concat look at the key
 * spans (on the host, num_keys steps) only of a KJT not known checked, and their results are
 * known checked when their inputs are. */
UR_API ur_status ur_kjt_permute(const ur_kjt *k, const int32_t *order, int32_t n,
                                ur_kjt **out);
/* Splits the keys into consecutive groups of sizes[0..n-1] keys (summing to num_keys): views,
 * so key spans outside the values are refused as by permute. */
UR_API ur_status ur_kjt_split(const ur_kjt *k, const int32_t *sizes, int32_t n, ur_kjt **outs);
/* Keys of all parts in order; same stride, distinct keys, all weighted or none.  A part whose
 * key spans do not add up to its values (made unchecked) is refused, naming the part and key:
 * its keys would take the next part's values. */
UR_API ur_status ur_kjt_concat(const ur_kjt *const *parts, int32_t n, ur_kjt **out);
/* Per key, the distinct bags (same ids and weights) in order of first appearance, and for
 * every sample its bag: a VBE batch whose expand() is the input.  Dedup, bucketize, expand and
 * expand_rows (of a VBE batch) check a KJT not known checked first (ur_kjt_checked); their
 * results are known checked. */
UR_API ur_status ur_kjt_dedup(const ur_kjt *k, ur_kjt **out);
/* Row-wise sharding's split of ids (not for VBE batches): key i with block[i] > 0 becomes
 * `buckets` keys "<key>@<b>" in its place, bucket b holding, bag by bag and in order, the ids
 * in [b * block[i], (b + 1) * block[i]) less b * block[i], with their weights; keys with
 * block[i] 0 stay as they are.  An id outside [0, rows[i]) is an error naming the key, the
 * sample and the id. */
UR_API ur_status ur_kjt_bucketize(const ur_kjt *k, ur_kjt **out, const int64_t *block,
                                  const int64_t *rows, int32_t buckets);
/* A VBE batch back to the full batch (a plain KJT is copied). */
UR_API ur_status ur_kjt_expand(const ur_kjt *k, ur_kjt **out);
/* Rows of a per-bag output [sum of strides, D] (bag order) to the full batch's bag order
 * [num_keys * stride, D]: out row k*stride+b = in row (first bag of k) + inverse[k][b]. */
UR_API ur_status ur_kjt_expand_rows(ur_stream *s, const ur_kjt *k, const ur_tensor *in,
                                    ur_tensor **out);
/* Sample-major rows (as the synthetic generator makes them) to a KJT: key k takes hot[k] id
 * columns of ids i64 [n, sum of hot] (weights f32 alike, or NULL), of which lengths i32
 * [n, num_keys] say how many are used (NULL: all of them).  Written into the caller's buffers
 * (values and weights_out at least n * sum of hot elements, lengths_out n * num_keys, offsets
 * n * num_keys + 1; one placement for all), of which the KJT holds views: no allocation, so a
 * loader reuses them.  With lengths it waits for the device (the key spans come back); without,
 * nothing waits.  A length outside 0..hot[k] is an error naming the key and the sample. */
UR_API ur_status ur_kjt_from_rows(ur_stream *s, ur_kjt **out, int32_t num_keys,
                                  const char *const *keys, const int32_t *hot,
                                  const ur_tensor *ids, const ur_tensor *weights /* or NULL */,
                                  const ur_tensor *lengths /* or NULL */,
                                  ur_tensor *values /* out */, ur_tensor *lengths_out /* out */,
                                  ur_tensor *offsets /* out */,
                                  ur_tensor *weights_out /* out, or NULL without weights */);
/* A copy in another placement, ordered on s (asynchronous where the GPU is involved). */
UR_API ur_status ur_kjt_to(ur_stream *s, const ur_kjt *k, ur_kjt **out, ur_place place,
                           int32_t device);
/* The same into buffers the caller keeps: into[0..4] for the values, lengths, offsets, weights
 * and inverse_indices (1-D, of k's dtypes, at least as long, in one placement; NULL where k has
 * none).  The copy's tensors are views of their first elements, so a loop that copies every
 * batch to the GPU allocates no device memory and waits for nothing. */
UR_API ur_status ur_kjt_copy(ur_stream *s, const ur_kjt *k, ur_tensor *const *into /* out */,
                             ur_kjt **out /* out */);

/* .npy arrays (engine/src/data/npy.c): version 1, 2 and 3 headers; dtypes <f4, <i4, <u4, <i8. */
typedef struct ur_npy_info {
  char descr[8];                  /* "<f4", "<i4", "<u4" or "<i8" */
  int32_t ndim;                   /* 0 to 4 */
  int32_t fortran_order;
  int64_t shape[4];
  uint64_t header_bytes;          /* where the data begins */
  uint64_t item_bytes;
} ur_npy_info;
UR_API size_t ur_sizeof_npy_info(void);
/* Parses a header held in buf[0..len); what is named in errors is `what` (a file name). */
UR_API ur_status ur_npy_parse_header(const void *buf, size_t len, const char *what /* or NULL */,
                                     ur_npy_info *out);
/* Reads a whole file into a new host tensor: f32 for <f4, i32 for <i4, i64 for <u4 and <i8. */
UR_API ur_status ur_npy_load(ur_tensor **out, const char *path);
/* Writes a tensor (f32, i32, i64) as .npy; descr overrides the dtype's ("<u4" for i32 ids). */
UR_API ur_status ur_npy_save(const char *path, const ur_tensor *t, const char *descr /* or NULL */);
/* A .npy written in parts: rows of tensors appended, converted to descr (f32 to <f4; integer
 * or f32 tensors to <i4, <u4, <i8, each value checked to fit), the row count set on close.  It is
 * written under a temporary name beside path and appears at path only when closed (as does
 * ur_npy_save's file): a writer that fails or is killed leaves no file that looks complete. */
struct ur_npy_writer;
typedef struct ur_npy_writer ur_npy_writer;
UR_API ur_status ur_npy_writer_open(ur_npy_writer **out, const char *path, const char *descr,
                                    int32_t ndim, const int64_t *shape);
UR_API ur_status ur_npy_writer_append(ur_npy_writer *w, const ur_tensor *rows);
/* Writes the header and closes; frees w either way. */
UR_API ur_status ur_npy_writer_close(ur_npy_writer *w);

/* Criteo raw TSV (engine/src/data/criteo.c): 40 tab-separated fields, label, 13 integers, 26 hex
 * categoricals.  Integers: empty 0, negatives clamped to 0, then log(x + 1); categoricals:
 * hex as unsigned 32-bit, empty 0, then id mod rows[i] where rows[i] > 0.  Files are read
 * plain or gzip'd (every member; bytes after the last one are an error), parsed on
 * UR_NUM_THREADS threads (default: every core).  Malformed data is UR_STATUS_FORMAT with
 * "FILE:LINE: what" in the message. */
typedef struct ur_criteo_opts {
  int32_t pad_missing_fields;     /* lines of 15..39 fields take empty trailing fields */
  int32_t skip_bad_lines;         /* 0: a bad line is an error; 1: skipped and counted */
  int64_t rows[26];               /* per categorical column; <= 0: raw ids */
  int64_t chunk_bytes;            /* read size; 0: 16 MiB */
} ur_criteo_opts;
typedef struct ur_criteo_stats {
  int64_t lines, rows, skipped, padded, bytes;
  double seconds;
  char first_skipped[256];        /* the first skipped line's error, or "" */
} ur_criteo_stats;
UR_API size_t ur_sizeof_criteo_opts(void);
UR_API size_t ur_sizeof_criteo_stats(void);
struct ur_criteo_reader;
typedef struct ur_criteo_reader ur_criteo_reader;
/* One line (without its newline); dense[13] already transformed, cats[26] raw.  Returns
 * UR_STATUS_FORMAT with a message naming the field; *padded set when fields were added. */
UR_API ur_status ur_criteo_parse_line(const char *line, size_t len, int32_t pad_missing_fields,
                                      int32_t *label, float *dense, uint32_t *cats,
                                      int32_t *padded /* or NULL */);
UR_API ur_status ur_criteo_open(ur_criteo_reader **out, const char *const *paths, int32_t npaths,
                                const ur_criteo_opts *opts /* or NULL */);
UR_API void ur_criteo_close(ur_criteo_reader *r);
/* Up to max rows into host buffers labels[max], dense[max * 13], ids[max * 26] (ids reduced
 * modulo rows where given); *n 0 at the end.  An error names file and line. */
UR_API ur_status ur_criteo_read(ur_criteo_reader *r, int64_t max, int32_t *labels /* or NULL */,
                                float *dense /* or NULL */, uint32_t *ids /* or NULL */,
                                int64_t *n);
UR_API ur_status ur_criteo_stats_get(const ur_criteo_reader *r, ur_criteo_stats *out);
/* Which input file the last rows came from (index into paths), -1 before any. */
UR_API int32_t ur_criteo_file_index(const ur_criteo_reader *r);
/* TSV to binary day files: input i becomes out_dir/day_D_{dense,sparse,labels}.npy with
 * D = days[i] (distinct whole numbers from 0, or i when days is NULL): dense <f4 [N,13] already transformed, sparse <i4
 * [N,26] when every column has rows of at most 2^31 (ids mod rows), else <u4 (ids mod rows where
 * given, raw elsewhere), labels <i4 [N]; with rows, day_D_sparse_rows.npy <i8 [26] records them
 * (0: raw), and a loader given rows (rows_given) reads the day only with rows that divide them,
 * a table read raw refused (without rows, an older record of day D is removed).  All or nothing:
 * the files appear when every input converted, and a failure leaves none of them. */
UR_API ur_status ur_criteo_convert(const char *const *paths, int32_t npaths,
                                   ur_criteo_stats *out /* or NULL */,
                                   const ur_criteo_opts *opts /* or NULL */, const char *out_dir,
                                   const int32_t *days /* or NULL */);

/* Synthetic data (engine/src/data/synth.c): counter-based, so sample i is the same whatever the
 * order, the thread count or the backend.  Labels come from a hidden logistic model whose
 * logit is mostly per-id effects of the sparse features. */
typedef struct ur_synth_table {
  int64_t rows;
  double zipf;                    /* exponent > 0; 0: uniform */
  int32_t hot_min, hot_max;       /* ids per sample, uniform in [min, max]; equal: fixed */
  int32_t weighted;               /* per-id weights in (0, 1] */
  float signal;                   /* std of this table's per-id effects on the logit */
  int64_t id_space;               /* ids drawn from [0, id_space), Zipf ranks over all of it
                                     (raw ids: a consumer takes them modulo rows, or maps them
                                     with managed collisions); 0: rows */
} ur_synth_table;
typedef struct ur_synth_spec {
  int32_t num_tables, num_dense;
  const ur_synth_table *tables;   /* num_tables of them (at most 65536), the caller's: read
                                     during each call (the loader keeps a copy) */
  uint64_t seed;
  float dense_signal;             /* weight of the dense features in the logit */
  float bias;                     /* logit offset (sets the click rate) */
  int64_t groups;                 /* > 0: per-sample grouping keys in [0, groups) */
  double drift;                   /* > 0: the hot ids move: sample i's Zipf rank r is read as
                                     rank r + floor(i * drift) (mod the id space), so every id
                                     climbs a rank each 1/drift samples, colder ids (never seen
                                     ones, in a wide id space) rising into the hot set and the
                                     hottest leaving it for the cold end; 0: none */
} ur_synth_spec;
UR_API size_t ur_sizeof_synth_table(void);
UR_API size_t ur_sizeof_synth_spec(void);
UR_API ur_status ur_synth_check(const ur_synth_spec *spec);
/* Samples first .. first+n-1 into tensors of one placement (device: generated on the GPU):
 * dense f32 [n, num_dense], labels f32 [n], ids i64 [n, H] and weights f32 [n, H] (or NULL)
 * with H the sum of hot_max, lengths i32 [n, num_tables] (sample-major; unused slots -1),
 * groups i64 [n] or NULL, probs f32 [n] (the hidden model's click probability) or NULL. */
UR_API ur_status ur_synth_generate(ur_stream *s, const ur_synth_spec *spec, int64_t first,
                                   int64_t n, ur_tensor *dense, ur_tensor *labels, ur_tensor *ids,
                                   ur_tensor *weights /* or NULL */, ur_tensor *lengths,
                                   ur_tensor *groups /* or NULL */, ur_tensor *probs /* or NULL */);
/* The loader (engine/src/data/loader.c): threads that turn a source into batches in pinned
 * buffers ahead of use, each thread making whole batches, handed out in order.  Each epoch a
 * rank reads its contiguous share of the rows, in windows of shuffle_window rows shuffled by a
 * seeded permutation (a window of 0: in order), so a position (epoch, sample) restores the
 * exact order, on any number of threads.  A batch stays valid until it is released; the loader
 * holds max(depth, threads) batches ahead, plus two the consumer may hold. */
typedef enum ur_source_kind {
  UR_SOURCE_SYNTHETIC = 0, UR_SOURCE_CRITEO_TSV, UR_SOURCE_CRITEO_BIN
} ur_source_kind;
typedef struct ur_loader_opts {
  int32_t source;                 /* ur_source_kind */
  int32_t npaths;
  const char *const *paths;       /* TSV files, or one folder of day files */
  const ur_synth_spec *synth;     /* UR_SOURCE_SYNTHETIC */
  int64_t samples;                /* synthetic samples per epoch */
  const char *const *keys;        /* num_keys names of the sparse features, one a table of the
                                     source (NULL: C1, C2, ...) */
  int32_t num_keys;
  ur_criteo_opts criteo;          /* TSV options; without `rows`, criteo.rows also reduce day
                                     files' and synthetic data's ids on read, for a source of at
                                     most 26 tables (more are refused where any is > 0) */
  const int64_t *rows;            /* num_rows table sizes, one a table of the source (or one for
                                     every table): ids mod rows where > 0, raw where 0; any
                                     count of tables; NULL: criteo.rows */
  int32_t num_rows;
  int32_t rows_given;             /* 1: the rows are the consumer's table sizes, 0 included
                                     (a table that keeps raw ids: managed collisions), and day
                                     files convert reduced are checked against every one; 0:
                                     checked where rows > 0, a loader given none only reads */
  int64_t batch_size;
  int32_t depth;                  /* batches prepared ahead (>= 1; at least one a thread) */
  int32_t threads;                /* threads making batches; 0: UR_NUM_THREADS, else every core */
  int32_t drop_last;
  int64_t shuffle_window;         /* rows per shuffled window; 0: no shuffling */
  uint64_t seed;
  int32_t epochs;                 /* 0: without end */
  int32_t rank, world;
  int64_t start_epoch, start_sample; /* the position to start from (a resumed run) */
  int32_t placement;              /* of the batches: UR_PLACE_PINNED (default) or HOST */
  /* slice_world > 1: batch_size is a global batch, and each batch handed out is this rank's
   * slice of it, samples [n * slice_rank / slice_world, n * (slice_rank + 1) / slice_world) of
   * its n (data-parallel training: every rank reads the same global batches) */
  int32_t slice_rank, slice_world;
  /* 1 (with slice_world > 1): every slice the same size, as training over ranks needs; a global
   * batch the slices cannot share equally (an epoch's short last batch, known only at its end
   * for TSV files without count_samples) fails there, after the batches before it, unless drop_last drops it, and a
   * batch_size that is not a multiple of slice_world is refused by open */
  int32_t even_slices;
  /* 1: TSV files' samples are counted when the loader opens (one parsing pass over the files,
   * as a split by rank makes), so samples_per_epoch is known before the first batch: training
   * over ranks checks the epoch's last batch with it before any step */
  int32_t count_samples;
} ur_loader_opts;
typedef struct ur_loader_stats {
  int64_t batches, samples, bytes;
  double wait_seconds;            /* the consumer's time blocked in next */
  double produce_seconds;         /* the threads' wall time making batches, summed */
  double produce_cpu_seconds;     /* their CPU time for it (dispatch included): the cost on a
                                     shared machine */
  int64_t epoch, sample;          /* the position after the last batch handed out */
  int64_t samples_per_epoch;      /* this rank's; -1 until known (TSV, without count_samples
                                     or a split by rank) */
  int32_t threads;                /* threads making batches */
} ur_loader_stats;
struct ur_loader;
struct ur_batch;
typedef struct ur_loader ur_loader;
typedef struct ur_batch ur_batch;
UR_API size_t ur_sizeof_loader_opts(void);
UR_API size_t ur_sizeof_loader_stats(void);
UR_API ur_status ur_loader_open(ur_loader **out, const ur_loader_opts *opts);
/* The checks open makes of the options, for a source of `tables` tables (their rows and key
 * names counted against them), without opening it; the placement is the caller's (for
 * uvmrec.data.generator, which makes the loader's batches where they are used). */
UR_API ur_status ur_loader_check(const ur_loader_opts *opts, int32_t tables);
/* The next batch (*out NULL at the end); an error of the loader thread is returned here,
 * after the batches made before it. */
UR_API ur_status ur_loader_next(ur_loader *l, ur_batch **out);
UR_API void ur_loader_release(ur_loader *l, ur_batch *b);
/* Stops the thread (also mid-epoch) and frees everything; batches not released are freed too. */
UR_API void ur_loader_close(ur_loader *l);
UR_API ur_status ur_loader_stats_get(const ur_loader *l, ur_loader_stats *out);
/* Host memory a loader with these options takes at most (its slots and the windows it keeps),
 * for data of `columns` id columns (the sum of each table's ids per sample), `tables` tables
 * and `dense` features: for accounting before anything is allocated. */
UR_API uint64_t ur_loader_host_bytes(const ur_loader_opts *opts, int32_t columns, int32_t tables,
                                     int32_t dense);
UR_API const ur_tensor *ur_batch_dense(const ur_batch *b);   /* f32 [B, dense] */
UR_API const ur_tensor *ur_batch_labels(const ur_batch *b);  /* f32 [B] */
UR_API const ur_tensor *ur_batch_groups(const ur_batch *b);  /* i64 [B], or NULL */
UR_API const ur_kjt *ur_batch_sparse(const ur_batch *b);
UR_API int64_t ur_batch_size(const ur_batch *b);
UR_API int64_t ur_batch_epoch(const ur_batch *b);
UR_API int64_t ur_batch_first_sample(const ur_batch *b);     /* within the epoch */
/* Where the data stands after the batch: first + size, or past the global batch a rank's slice
 * (slice_world > 1) was cut from. */
UR_API int64_t ur_batch_next_sample(const ur_batch *b);

/* ==== 4. embeddings: table-batched collections, access counters and row layout, page prefetch ==== */
/* Many embedding tables served by one kernel launch per pass.  Each table has rows of `dim`
 * elements (a multiple of 4, 4..1024) stored as f32, f16 or bf16 (arithmetic in f32), a
 * pooling, and a placement; features (the keys of the input) map onto tables.  Inputs are
 * plain tensors: values i64 [n] (row ids), offsets i64 [bags + 1] (key-major bags, as a KJT's
 * offsets), optional per-value weights f32 [n].  Backward is fused with the optimizer: rows are
 * deduplicated (sorted), each gets one update, and the result is bit-identical run to run. */
typedef enum ur_pooling {
  UR_POOLING_SUM = 0, UR_POOLING_MEAN, UR_POOLING_NONE, UR_POOLING_COUNT
} ur_pooling;
typedef enum ur_tbe_bounds {
  UR_TBE_BOUNDS_FATAL = 0, /* a bad id fails the call, naming table, feature, sample and id;
                            * with a cache, ur_cache_prepare checks them and the forward, which
                            * takes the prepare's ids, reads no flag back (none fails there) */
  UR_TBE_BOUNDS_WARN,      /* the id is skipped and counted (ur_tbe_skipped) */
  UR_TBE_BOUNDS_OFF,       /* not checked: the caller guarantees valid ids */
  UR_TBE_BOUNDS_COUNT
} ur_tbe_bounds;

struct ur_tbe;
typedef struct ur_tbe ur_tbe;

/* One table; ur_tbe_new copies it (the name too). */
typedef struct ur_tbe_table_config {
  const char *name;
  int64_t rows;
  int32_t dim;
  ur_dtype dtype;          /* f32, f16 or bf16 */
  ur_pooling pooling;      /* all tables pool (sum or mean), or none does */
  ur_place place;          /* device, managed, or host (kept pinned: the GPU reads it in place) */
  int32_t state_place;     /* where its optimizer state lives: a ur_place, or -1: as the table */
  /* A shard of a larger logical table (sharding over ranks): this table is rows [row0, row0 +
   * rows) and columns [col0, col0 + dim) of the logical_rows x logical_dim table that is table
   * `logical` of the unsharded collection, and starts as those elements of it: the same numbers,
   * drawn with that table's seed and bound.  logical_rows 0: not a shard (the rest is unused). */
  int32_t logical;
  int32_t logical_dim, col0;
  int64_t logical_rows, row0;
} ur_tbe_table_config;

typedef struct ur_tbe_config {
  int32_t device;          /* the GPU that runs the collection, or -1: the CPU backend */
  ur_optim_config optim;   /* sgd, rowwise_adagrad, adagrad or adam; its step is the collection's */
  ur_tbe_bounds bounds;
  int32_t stochastic_rounding; /* 1: f16/bf16 rows are written with stochastic rounding */
  uint64_t seed;           /* initialisation and stochastic rounding */
  ur_dtype out_dtype;      /* pooled output and its gradient: f32 or bf16 */
  int32_t nondeterministic; /* 1: on the GPU, SGD without weight decay or clipping on a
                               collection of f32 tables adds each value's update to its row by
                               atomics, without the sort: faster, not bit-reproducible.  The
                               CPU, and every other case, steps deterministically. */
} ur_tbe_config;

UR_API size_t ur_sizeof_tbe_table_config(void);
UR_API size_t ur_sizeof_tbe_config(void);

/* feature_table[f] is the table of feature f (0-based); feature_names may be NULL.  Tables
 * start uniform in (-1/sqrt(rows), 1/sqrt(rows)), drawn per table from the seed, the same on
 * every backend and placement; optimizer state starts at zero. */
UR_API ur_status ur_tbe_new(ur_tbe **out, const ur_tbe_config *config, int32_t num_tables,
                            const ur_tbe_table_config *tables, int32_t num_features,
                            const int32_t *feature_table,
                            const char *const *feature_names /* or NULL */);
UR_API void ur_tbe_free(ur_tbe *t);
UR_API int32_t ur_tbe_num_tables(const ur_tbe *t);
UR_API int32_t ur_tbe_num_features(const ur_tbe *t);
UR_API int32_t ur_tbe_device(const ur_tbe *t);
/* Output columns: the sum of every feature's table dim (pooled), or the common dim (none). */
UR_API int64_t ur_tbe_out_dim(const ur_tbe *t);
/* The first output column of feature f (pooled collections). */
UR_API int64_t ur_tbe_feature_col(const ur_tbe *t, int32_t feature);

/* Pooled forward.  Without VBE (stride_per_key_per_rank NULL) every feature has
 * bags/num_features bags and out is [batch, out_dim].  With VBE, stride_per_key_per_rank[f]
 * (host memory; one rank) gives each feature's bags, as a KJT's; out is then either flat
 * [sum_f batch_f * dim_f] (inverse_indices NULL) or, with inverse_indices i64
 * [num_features * B] (key-major: sample b of feature f reads its bag
 * inverse_indices[f * B + b]), expanded to [B, out_dim].  Pooling none: out is [n, dim], one row per
 * value.  Empty bags give zeros; mean divides by the bag's length.  weights may be NULL. */
UR_API ur_status ur_tbe_forward(ur_stream *s, ur_tbe *t, const ur_tensor *values,
                                const ur_tensor *offsets, const ur_tensor *weights /* or NULL */,
                                const int64_t *stride_per_key_per_rank /* or NULL */,
                                const ur_tensor *inverse_indices /* or NULL */, ur_tensor *out);
/* The gradient of forward's output updates the rows in place through the optimizer. */
UR_API ur_status ur_tbe_backward(ur_stream *s, ur_tbe *t, const ur_tensor *grad_out,
                                 const ur_tensor *values, const ur_tensor *offsets,
                                 const ur_tensor *weights /* or NULL */,
                                 const int64_t *stride_per_key_per_rank /* or NULL */,
                                 const ur_tensor *inverse_indices /* or NULL */);
/* gate: a guard's flags (ur_nonfinite_check), or NULL: while its element 0 is set when a
 * backward runs, that backward leaves rows and optimizer state as they are (decided where it
 * runs, without a wait; the collection's own step count still advances, and Adam's bias terms
 * take the gate's [2] off it: ur_nonfinite_check).  The flags stay the
 * caller's and must outlive the collection or be unset first; i32, on the collection's side. */
UR_API ur_status ur_tbe_set_gate(ur_tbe *t, const ur_tensor *gate /* or NULL */);
/* Rowwise Adagrad over column shards: a table split by columns over several collections steps
 * each row by the mean squared gradient of the whole row, which no shard holds alone.  Split
 * into halves around the caller's all-reduce:
 *   ur_tbe_set_row_sums(t, table, sums): sums f32 [the table's rows], on the collection's side
 *     (the caller's; it must outlive the collection or be unset first; NULL unsets), one per
 *     table; rowwise Adagrad only;
 *   ur_tbe_row_sums(s, t, ...): the first half, a backward's arguments: each table with sums
 *     gets there, for every row the input reads, the sum over its own columns of the squared
 *     gradient its step would take (clipped, with weight decay), and 0 for every other row;
 *     rows, state and the step count are left alone;
 *   the caller sums the sums of the table's shards (an all-reduce);
 *   ur_tbe_backward(s, t, ...) with the same arguments: the step, each such table's row state
 *     growing by sums[row] / the whole row's columns (the logical table's dim for a shard). */
UR_API ur_status ur_tbe_set_row_sums(ur_tbe *t, int32_t table, ur_tensor *sums /* or NULL */);
UR_API ur_status ur_tbe_row_sums(ur_stream *s, ur_tbe *t, const ur_tensor *grad_out,
                                 const ur_tensor *values, const ur_tensor *offsets,
                                 const ur_tensor *weights /* or NULL */,
                                 const int64_t *stride_per_key_per_rank /* or NULL */,
                                 const ur_tensor *inverse_indices /* or NULL */);
/* The deduplicated gradient instead of an update: rows i64 [U] (row ids within their tables,
 * ascending per table, tables in order), grads f32 [sum_t U_t * dim_t] (table t's block is
 * [U_t, dim_t]), and counts[t] = U_t (host array of num_tables).  Synchronous. */
UR_API ur_status ur_tbe_sparse_grad(ur_stream *s, ur_tbe *t, const ur_tensor *grad_out,
                                    const ur_tensor *values, const ur_tensor *offsets,
                                    const ur_tensor *weights /* or NULL */,
                                    const int64_t *stride_per_key_per_rank /* or NULL */,
                                    const ur_tensor *inverse_indices /* or NULL */,
                                    ur_tensor **rows /* out */, ur_tensor **grads /* out */,
                                    int64_t *counts /* out */);

/* Table t as a [rows, dim] view of the batched storage; its optimizer state `which`
 * (0-based, ur_tbe_state_count of them: rowwise Adagrad's sum [rows], Adagrad's sum
 * [rows, dim], Adam's exp_avg and exp_avg_sq [rows, dim]). */
UR_API ur_status ur_tbe_table(const ur_tbe *t, int32_t table, ur_tensor **out);
UR_API int32_t ur_tbe_state_count(const ur_tbe *t);
UR_API const char *ur_tbe_state_name(const ur_tbe *t, int32_t which);
UR_API ur_status ur_tbe_state(const ur_tbe *t, int32_t table, int32_t which, ur_tensor **out);
UR_API const char *ur_tbe_table_name(const ur_tbe *t, int32_t table);
UR_API const char *ur_tbe_feature_name(const ur_tbe *t, int32_t feature);
UR_API int32_t ur_tbe_feature_table(const ur_tbe *t, int32_t feature);
/* Draws table t again: uniform in [lo, hi), the same numbers on every backend and placement. */
UR_API ur_status ur_tbe_init_table(ur_stream *s, ur_tbe *t, int32_t table, double lo, double hi,
                                   uint64_t seed);
UR_API ur_status ur_tbe_set_lr(ur_tbe *t, double lr);
/* The dtype of the output and of its gradient from now on: f32 or bf16. */
UR_API ur_status ur_tbe_set_out_dtype(ur_tbe *t, ur_dtype dtype);
UR_API double ur_tbe_lr(const ur_tbe *t);
/* Optimizer steps taken (Adam's bias correction counts them); settable to resume. */
UR_API int64_t ur_tbe_step(const ur_tbe *t);
UR_API ur_status ur_tbe_set_step(ur_tbe *t, int64_t step);
/* Ids skipped under UR_TBE_BOUNDS_WARN since the collection was made (waits for the GPU). */
UR_API ur_status ur_tbe_skipped(ur_tbe *t, int64_t *out);

/* ---- far rows' copies ---- */
/* Far rows are the rows a GPU collection reads over the host link: a managed table's rows past
 * the leading run its hints keep on the GPU (preferred or prefetched there), every row of a
 * host table.  With room for `rows` copies (0: none, the default), each forward copies the
 * distinct far rows it reads, the first `rows` it claims (which ones varies run to run), into
 * HBM, and the next backward steps those rows from their copies: the link carries a copied row
 * once a step each way instead of twice in.  The results are the same bits with or without
 * copies; a row past the room is read over the link as before.  The copies hold the rows as
 * the forward read them: the collection's own calls that write rows or change a layout between
 * a forward and its backward drop them (init_table, reset_rows, set_permutation, relayout,
 * swaps, a cache's redirect); a write through a view (ur_tbe_table) in between is not seen:
 * write rows between steps, or call ur_tbe_far_refresh after.  The room is HBM of the
 * collection's GPU, counted in the budget: `rows` times the collection's widest row (rounded to
 * 16 bytes) and 40 bytes (what each copy is read from and written to), plus a map of 12 bytes a
 * slot (the power of two at least 2 * rows, 64 at least).
 * On a CPU collection nothing is copied (the setting is kept). */
UR_API ur_status ur_tbe_set_far_rows(ur_tbe *t, int64_t rows);
UR_API int64_t ur_tbe_far_rows(const ur_tbe *t);
/* Forgets the copies and reads where each table's far rows begin again from its hints
 * (set_far_rows does both): after a hint policy moves rows between GPU and host, or after rows
 * were written through a view (a load), uploading what changed. */
UR_API ur_status ur_tbe_far_refresh(ur_tbe *t);
/* The first far physical row of table t (rows when none is far; on a CPU collection a managed
 * table's as its recorded hints say, though nothing is copied there). */
UR_API ur_status ur_tbe_far_from(const ur_tbe *t, int32_t table, int64_t *out);
/* The distinct far rows the last forward read (waits for it on s), counted as far as the
 * copies' map holds them (its slots: the power of two at least twice far_rows, 64 at least):
 * min(this, far_rows) were copied; 0 when it made no copies.  *unplaced (NULL: not asked) is
 * how many of its lookups found no free slot where they looked (32 slots: the map full there):
 * 0, *out counts every distinct far row; more, *out is a lower bound.  (A backward or a write
 * since changes neither.  After early copies, *out counts the rows copied early, of the batch
 * given to ur_tbe_far_prefetch, and the forward's own.) */
UR_API ur_status ur_tbe_far_taken(ur_stream *s, ur_tbe *t, int64_t *out,
                                   int64_t *unplaced /* or NULL */);
/* Early copies: the far rows of the batch the next forward will read (values and offsets as for
 * ur_tbe_forward, stride_per_key_per_rank for a variable batch or NULL), copied into another
 * room of the same size (three are taken in turn, each made on its first use: the current
 * step's, the early copies', the last step's) on stream s while the current step computes,
 * so that the next forward reads them in HBM instead of over the host link.  Call it after the
 * current step's forward (its map must be final: s waits for that forward on the GPU) and before
 * the next forward; the next forward waits for the copies on its own stream and takes them,
 * whatever batch it is given (a row it reads that has none is read and copied as before).  A
 * row the current forward read is not read early, since its backward may still step it: that
 * backward writes each stepped row to its copy, and the next forward copies those rows from
 * there first.  A row the last step's copies hold is copied from there (written behind, they
 * may still be going home).  The numbers are the same bits as without early copies.  None are made (and the
 * forward reads as before) where the current forward found no free slot for some far row (a
 * room too small) or where a call that writes rows or a layout (far_refresh's list) or
 * set_far_rows came between the current forward and its backward, which is still to come
 * (which rows it steps is then not known); none are taken where the current backward is given other values than
 * its forward, steps by atomics (nondeterministic SGD), or such a call comes after them.
 * Refused while a graph is captured, and after a forward of the collection was captured (its
 * replays would not take them) until set_far_rows is called again.  Nothing is copied on a
 * CPU collection or without room (the ids are checked). */
UR_API ur_status ur_tbe_far_prefetch(ur_stream *s, ur_tbe *t, const ur_tensor *values,
                                     const ur_tensor *offsets,
                                     const int64_t *stride_per_key_per_rank /* or NULL */);
/* 1 where ur_tbe_far_prefetch would make early copies now (a GPU collection with room, no
 * forward of it captured into a graph, no capture under way), else 0 (a pipeline skips them);
 * -1 for a NULL t. */
UR_API int32_t ur_tbe_far_early_usable(const ur_tbe *t);
/* Write-behind (on: 1; off: 0, the default): a backward steps each far row that has a copy in
 * its copy only, and the collection writes every copy home over the link on a stream of its
 * own, behind the step, instead of the backward writing each stepped row twice.  The numbers
 * are the same bits.  Until a step's copies are home they are the rows, and the collection
 * orders itself after them: the next forward reads a far row it has no copy of from there, the
 * next early copies take the rows they hold from them (or wait, where a backward of other
 * values, or a forward without early copies, came between), the forward after them waits for
 * them, and the next backward, a forward without early copies, ur_tbe_table (every view, so
 * checkpoints and hints), and every call that writes rows or a layout wait for them (the host
 * waits where no stream does).  A view taken before a step is not ordered after it:
 * ur_device_sync, or take the view again.  A captured backward writes both, as without, and once
 * a forward of the collection was captured into a graph write-behind stays off (the graph's
 * replays wait for nothing), set_far_rows or not. */
UR_API ur_status ur_tbe_set_far_behind(ur_tbe *t, int32_t on);
/* 1 with write-behind on, 0 off, -1 for a NULL t. */
UR_API int32_t ur_tbe_far_behind(const ur_tbe *t);
/* Which of the far rows' moves cross the link through the GPU's copy engines and host threads
 * instead of copy kernels, which hold SMs the step computes on while rows cross (writes to host
 * memory most).  HOME: the copies written behind (ur_tbe_set_far_behind; nothing without it)
 * copied to pinned host memory after the backward, and each written home by host threads.
 * EARLY: the early copies' (ur_tbe_far_prefetch; nothing without it) list copied to the host,
 * their rows gathered there by host threads into pinned memory in their slots' order, and
 * copied to the GPU in one copy.  The copy engines move as many copies as the last batches had
 * and an eighth more (a batch's count is known on the GPU only), a copy kernel any past them.
 * With a room on a GPU, each of the three maps takes pinned host memory for its copies and 16
 * bytes a copy (66 MiB for 131,072 rows of 512 bytes), made by this call or by set_far_rows
 * (which fail, leaving the ways as they were, where it cannot be had) and freed with the room.
 * The host threads are the engine's thread count (UR_NUM_THREADS, every core by default) less
 * two, inside a host call on the copies' stream; host calls on two streams were seen to run one
 * at a time (an H100, driver 580), so with BOTH one way may wait for the other.  The same bits
 * every way.  A GPU whose managed memory the host may not touch while kernels run
 * (concurrentManagedAccess 0) refuses any but NONE. */
typedef enum {
  UR_FAR_DMA_NONE = 0, /* copy kernels both ways (the default) */
  UR_FAR_DMA_HOME = 1,
  UR_FAR_DMA_EARLY = 2,
  UR_FAR_DMA_BOTH = 3,
} ur_far_dma;
UR_API ur_status ur_tbe_set_far_dma(ur_tbe *t, int32_t ways /* ur_far_dma */);
/* The ways set (ur_far_dma), -1 for a NULL t. */
UR_API int32_t ur_tbe_far_dma(const ur_tbe *t);
/* What the host threads did since the collection was made, each way (home: the copies written
 * home; early: the early copies gathered).  Counted as each host call ends: exact after
 * ur_device_sync. */
typedef struct ur_far_dma_stats {
  int64_t home_rows, early_rows;      /* rows moved */
  int64_t home_calls, early_calls;    /* host calls */
  double home_seconds, early_seconds; /* those calls' time, each from its start to its end on
                                       * the thread that runs it (the threads' span) */
} ur_far_dma_stats;
UR_API size_t ur_sizeof_far_dma_stats(void);
UR_API ur_status ur_tbe_far_dma_stats(const ur_tbe *t, ur_far_dma_stats *out /* out */);

/* ---- access counters and row layout ---- */
/* Access counters: per table an i32 counter per row id, kept where the collection runs (device
 * memory on a GPU), added to by every forward while counting is on: one per value that reads
 * the row, integer adds on either backend, so counts are exact and the same on both.  They
 * stop growing at 2^30; decay scales them, c = floor(c * factor) (factor 0 clears).  Counters
 * are indexed by row id, so they survive a relayout.  table -1: every table.  A cached table
 * takes none (its kernels read the cache's slots): on by name is refused, -1 skips it. */
UR_API ur_status ur_tbe_set_counting(ur_tbe *t, int32_t table, int32_t on);
UR_API int32_t ur_tbe_counting(const ur_tbe *t, int32_t table);
/* The counters of a table as an i32 [rows] view (an error if it never counted). */
UR_API ur_status ur_tbe_counts(const ur_tbe *t, int32_t table, ur_tensor **out);
UR_API ur_status ur_tbe_decay_counts(ur_stream *s, ur_tbe *t, int32_t table, double factor);
/* order[r] = the id with the r-th highest count (ties: lower id first); cumsum[r] (optional)
 * = the counts of order[0..r] summed; by_id[id] (optional) = the count ranked for id (below 0
 * as 0): the counters as the ranking read them, for ur_counts_prefix without reading them
 * again.  counts is i32 [n] in any placement; order and cumsum are i64 [n], by_id i32 [n], in
 * host memory.  Linear time (a radix sort; on the GPU for device counters where the HBM budget
 * has 16 bytes a row for it, else on the CPU: the same order); *on_device (optional) is 1
 * where the GPU ranked, else 0. */
UR_API ur_status ur_counts_rank(const ur_tensor *counts, ur_tensor *order /* out */,
                                ur_tensor *cumsum /* out, or NULL */,
                                ur_tensor *by_id /* out, or NULL */,
                                int32_t *on_device /* out, or NULL */);
/* *out = the counts (negative ones as 0) of the ids whose row perm[id] is below k (perm NULL:
 * the identity, ids 0..k-1).  counts i32 [n], perm i64 [n], in host memory. */
UR_API ur_status ur_counts_prefix(const ur_tensor *counts, const ur_tensor *perm /* or NULL */,
                                  int64_t k, int64_t *out /* out */);
/* The ids that trade rows across the prefix [0, k) of a layout (perm, NULL: the identity),
 * from a ranking (order and cumsum as ur_counts_rank gives them): pair i is a[i], the i-th
 * hottest id outside, with b[i], the i-th coldest inside, while a[i] was read more than
 * (1 + band) times as often as b[i] (band >= 0).  a and b are i64 with room for the pairs (min(k,
 * n - k) is enough; fewer stops early, *n_out says how many were written) in host memory.
 * *gain (optional) = what the pairs' trades add to the prefix's accesses (ur_counts_prefix of
 * the counts ranked): the sum of a[i]'s counts less b[i]'s.  An id of order outside 0..n-1 that
 * the scans meet is refused (they read order from both ends only as far as the pairs go; the
 * flags of which side each id is on take n bytes meanwhile). */
UR_API ur_status ur_counts_swap_pairs(const ur_tensor *order, const ur_tensor *cumsum,
                                      const ur_tensor *perm /* or NULL */, int64_t k, double band,
                                      ur_tensor *a /* out */, ur_tensor *b /* out */,
                                      int64_t *n_out /* out */, int64_t *gain /* out, or NULL */);
/* perm[order[r]] = r: the permutation that lays rows out in the given order (which must hold
 * each of 0..n-1 once); perm is i64 [n] in host memory. */
UR_API ur_status ur_perm_from_order(const ur_tensor *order, ur_tensor *perm /* out */);

/* Row layout: a table may keep row id at physical row perm[id] (the kernels look it up; ids
 * are never remapped by the caller).  Relayout applies a new permutation (NULL: back to the
 * identity), moving the rows and their optimizer state: in device memory the GPU copies each
 * tensor aside and gathers it back chunk_rows rows at a time (0: 2^20); elsewhere the CPU
 * copies aside only the rows that move and writes them to their places.  Call it between
 * steps; it returns when the rows are in place. */
typedef struct ur_tbe_relayout_stats {
  double seconds;          /* wall time, waits included */
  uint64_t bytes;          /* bytes of rows and state rewritten (GPU: all; CPU: those that moved) */
  int64_t rows_moved;      /* rows whose physical row changed */
  int32_t chunks;          /* gathers issued */
  int32_t on_gpu;          /* 1: some tensor was moved by the GPU */
} ur_tbe_relayout_stats;
UR_API size_t ur_sizeof_tbe_relayout_stats(void);
/* The permutation in force as an i64 [rows] view, or *out = NULL for the identity. */
UR_API ur_status ur_tbe_permutation(const ur_tbe *t, int32_t table, ur_tensor **out);
/* A number that changes whenever the table's permutation does (relaid out, rows swapped, set or
 * removed): a copy of the permutation read while it was n is current while it is still n. */
UR_API ur_status ur_tbe_permutation_gen(const ur_tbe *t, int32_t table, uint64_t *out);
UR_API ur_status ur_tbe_relayout(ur_stream *s, ur_tbe *t, int32_t table,
                                 const ur_tensor *perm /* or NULL */,
                                 ur_tbe_relayout_stats *out /* out */, int64_t chunk_rows);
/* Trades the physical rows of ids a[k] and b[k] (k < n; host arrays; no id in two pairs), in
 * the weights and in the optimizer state, and their entries of the permutation, in place (a
 * table without a layout gets the identity first).  Work is O(n rows), ordered on s: on a GPU
 * collection a kernel moves the rows (managed rows are read and written where they are: no page
 * moves, no wait).  The kernels must not read the table meanwhile: order it between steps on
 * their stream.  Stats as relayout's (bytes: the rows rewritten; seconds: the host's time). */
UR_API ur_status ur_tbe_swap_rows(ur_stream *s, ur_tbe *t, int32_t table, const int64_t *a,
                                  const int64_t *b, int64_t n,
                                  ur_tbe_relayout_stats *out /* out */);
/* Installs perm (NULL: the identity) without moving any row: for rows already laid out by it,
 * as a checkpoint holds them. */
UR_API ur_status ur_tbe_set_permutation(ur_tbe *t, int32_t table,
                                        const ur_tensor *perm /* or NULL */);

/* ---- page prefetch of managed tables ---- */
/* For every managed table of the collection (not those a software cache serves): the physical
 * rows the batch's ids read (through the permutation in force), the pages those rows touch
 * (ur_hint_page_bytes_get; a row may straddle two) in the table's weights and in its optimizer
 * state where that is managed too, deduplicated and coalesced into runs of adjacent pages.
 * Runs that lie wholly in bytes the hint record says are preferred on, or last prefetched to,
 * the location are skipped; the others are prefetched there on s (cudaMemPrefetchAsync).
 * values i64 [n] and offsets i64 [bags + 1] as ur_tbe_forward takes them (any placement:
 * device ones are read back, synchronously), stride_per_key_per_rank as there.  Ids out of range
 * fail under the collection's fatal bounds check with the forward's error (naming table,
 * feature, sample and id); under warn and off they are skipped (and counted here, not in
 * ur_tbe_skipped).  location: a GPU, UR_LOC_CURRENT_GPU (the collection's GPU) or UR_LOC_CPU.
 * The prefetches are not entered in the hint record or log: they are transient (the batch's
 * pages), and would otherwise count against the HBM budget for good.  Work is
 * O(ids + pages touched), and the host mirror of a permutation in device memory is read again
 * only when the permutation changes.  Without a GPU (or for a collection on the CPU) the runs
 * are computed the same way and nothing is issued. */
typedef struct ur_page_run {
  int32_t table;                  /* the collection's table index */
  int32_t tensor;                 /* 0: the table's weights; k >= 1: its optimizer state k - 1 */
  uint64_t byte_begin, byte_end;  /* whole pages, in bytes from the start of the tensor's
                                     storage (as ur_range), the end clamped to the allocation */
  int32_t skipped;                /* 1: wholly preferred on or prefetched to the location */
} ur_page_run;
typedef struct ur_page_stats {
  int64_t ids;                    /* ids of the managed tables' features */
  int64_t skipped_ids;            /* out of range and skipped (bounds warn or off) */
  int64_t rows;                   /* distinct physical rows, summed over tables */
  int64_t pages;                  /* distinct pages those rows touch, over their tensors */
  int64_t runs, runs_skipped;     /* runs of adjacent pages; those skipped */
  uint64_t bytes;                 /* bytes of the runs asked for (not skipped) */
  uint64_t bytes_skipped;
  int32_t location;               /* resolved: a GPU or UR_LOC_CPU */
  int32_t issued;                 /* 1: the runs asked for went to the driver; 0: computed only */
} ur_page_stats;
UR_API size_t ur_sizeof_page_run(void);
UR_API size_t ur_sizeof_page_stats(void);
UR_API ur_status ur_tbe_prefetch_pages(ur_stream *s, ur_tbe *t, const ur_tensor *values,
                                       const ur_tensor *offsets,
                                       const int64_t *stride_per_key_per_rank /* or NULL */,
                                       ur_page_stats *out /* out */, int32_t location);
/* The same computation, issuing nothing: for tests and for looking at what a batch touches. */
UR_API ur_status ur_tbe_page_runs(ur_tbe *t, const ur_tensor *values, const ur_tensor *offsets,
                                  const int64_t *stride_per_key_per_rank /* or NULL */,
                                  ur_page_stats *out /* out */, int32_t location);
/* The runs of the last ur_tbe_prefetch_pages or ur_tbe_page_runs on t, skipped ones included,
 * by table, then tensor, then address: lent, valid until the next such call or ur_tbe_free.
 * *count gets their number (0, with NULL, before any call). */
UR_API const ur_page_run *ur_tbe_last_page_runs(const ur_tbe *t, int64_t *count /* out */);

/* Re-initialises rows ids[0..n-1] (row ids of table t, i64 in host memory) as the collection
 * first drew them: uniform in (-1/sqrt(rows), 1/sqrt(rows)) from the configured seed, element
 * (id, c) taking the number it took at creation, the same on every backend and placement; their
 * optimizer state and access counters are zeroed.  Rows are found through the permutation in
 * force (a relaid-out row is reset where it lives).  On a cached table the rows are reset in host
 * memory: drop them from the cache first (ur_cache_drop), or a cached copy wins.  Ordered on s.
 * Refused for a shard of a logical table (uvmrec.dist). */
UR_API ur_status ur_tbe_reset_rows(ur_stream *s, ur_tbe *t, int32_t table, const int64_t *ids,
                                   int64_t n);

/* ---- managed collisions: raw ids to rows ---- */
/* A map per table from raw 64-bit ids to the rows of an embedding table (engine/src/embedding/
 * mc.c), kept where the lookups run (device memory on a GPU).  The first rows - fallback_rows
 * rows belong to resident ids, one id a row; every other id reads one of the last
 * fallback_rows rows (a hash of the id picks it) and is counted as a candidate.  Within a batch
 * the map is read-only.  Residents change only in rounds, run before a batch: an eviction
 * round every evict_every updating batches, or as soon as the candidates counted up to the
 * previous batch number max_candidates, ranks residents and candidates by (score, id) (a
 * higher score is better, then a lower id) and keeps the best; admitted candidates take the
 * rows freed, in ascending row order, best first, then the free rows; the candidates are then
 * forgotten, and every count decays.  With fill on, a fill round before any batch admits the
 * best candidates into free rows while there are any (no eviction, no decay; their lookups stay
 * lookups since the last eviction round).  Scores: lfu
 * the count (lookups, decayed at every eviction round); lru the step of the last lookup, ties
 * going to more lookups since the last eviction round; distance_lfu the count / (1 + steps
 * since the last lookup)^distance_power.  All counting is
 * integer and the scores are computed the same way on both backends, so the CPU and the GPU
 * make the same decisions.  The id -1 is never admitted (it always reads a fallback row). */
typedef enum ur_mc_policy {
  UR_MC_LFU = 0, UR_MC_LRU, UR_MC_DISTANCE_LFU, UR_MC_POLICY_COUNT
} ur_mc_policy;
typedef struct ur_mc_table_config {
  const char *name;               /* for messages (copied); NULL: "table <i>" */
  int64_t rows;                   /* the embedding table's rows, 2 .. 2^32 */
  int64_t fallback_rows;          /* 1 .. rows - 1: the last rows, shared by other ids */
  ur_mc_policy policy;
  int64_t evict_every;            /* updating batches between eviction rounds, >= 1 */
  int64_t max_candidates;         /* distinct candidates that start an eviction round early, >= 1 */
  double decay;                   /* counts *= decay at each eviction round, in (0, 1] */
  double distance_power;          /* distance_lfu's exponent, in (0, 16] */
  int32_t fill;                   /* 1: fill rounds admit candidates into free rows */
} ur_mc_table_config;
typedef struct ur_mc_config {
  int32_t device;                 /* the GPU the maps live on, or -1: the CPU */
  uint64_t seed;                  /* of the hashes (the map's index, the fallback rows) */
} ur_mc_config;
/* Counts since the map was made (or restored, or its stats reset); per table or in total. */
typedef struct ur_mc_stats {
  int64_t capacity;               /* rows for resident ids: rows - fallback_rows */
  int64_t resident;               /* ids holding a row now */
  int64_t candidates;             /* distinct ids waiting, as counted after the last batch */
  int64_t lookups;                /* ids looked up by updating remaps */
  int64_t resident_lookups;       /* of them, ids found resident */
  int64_t fallback_lookups;       /* of them, ids sent to the fallback rows */
  int64_t rounds, fills;          /* eviction rounds and fill rounds */
  int64_t admissions, evictions;  /* ids given a row; ids that lost theirs */
  int64_t skipped;                /* updating batches whose candidates did not fit the
                                     candidates' map (larger than any batch before it) and
                                     were not counted as candidates, all or none */
  double seconds;                 /* host time in remaps and rounds (GPU: waits included) */
  double round_seconds;           /* of which in rounds */
} ur_mc_stats;
/* One table's map as host tensors (for checkpoints).  ur_mc_state_get makes new tensors the
 * caller frees; ur_mc_state_set copies from tensors of any placement (restoring exactly). */
typedef struct ur_mc_state {
  ur_tensor *ids;                 /* i64 [capacity]: the id on each row, -1 when free */
  ur_tensor *counts;              /* i64 [capacity]: decayed counts, in 1/65536ths */
  ur_tensor *window;              /* i64 [capacity]: lookups since the last eviction round */
  ur_tensor *last;                /* i64 [capacity]: the step of the last lookup */
  ur_tensor *cand_ids;            /* i64 [k]: the candidates, ascending */
  ur_tensor *cand_counts;         /* i64 [k]: their lookups (set: i32 too, as states were) */
  ur_tensor *cand_last;           /* i64 [k]: the step of their last lookup */
  /* as ur_mc_stats_get gives them (since the map was made, restored or its stats reset) */
  int64_t lookups, resident_lookups, fallback_lookups, rounds, fills, admissions, evictions;
  int64_t skipped;
  /* What sizes the candidates' map, so that a restored map counts and skips the batches the
   * saved one would: the most ids one updating batch of the table held (-1: none counted yet;
   * the next batch's are read), and the map's slots (a power of 2 >= 2 * k; 0: sized for the
   * candidates and batch_max). */
  int64_t batch_max, slots;
} ur_mc_state;
struct ur_mc;
typedef struct ur_mc ur_mc;
UR_API size_t ur_sizeof_mc_table_config(void);
UR_API size_t ur_sizeof_mc_config(void);
UR_API size_t ur_sizeof_mc_stats(void);
UR_API size_t ur_sizeof_mc_state(void);
UR_API const char *ur_mc_policy_name(ur_mc_policy p);
UR_API ur_status ur_mc_policy_parse(const char *s, ur_mc_policy *out);
/* feature_table[f]: the map table of feature f (the input's keys, in order), or -1 for a
 * feature whose ids pass through unchanged. */
UR_API ur_status ur_mc_new(ur_mc **out, const ur_mc_config *config, int32_t num_tables,
                           const ur_mc_table_config *tables, int32_t num_features,
                           const int32_t *feature_table);
UR_API void ur_mc_free(ur_mc *m);
UR_API int32_t ur_mc_num_tables(const ur_mc *m);
UR_API int32_t ur_mc_device(const ur_mc *m);
/* Raw ids to rows for one batch, laid out as ur_tbe_forward takes it: values i64 [n], offsets
 * i64 [bags + 1], batch_per_feature and inverse (VBE; a distinct bag counts once per sample
 * that reads it) as there, all where the map runs (device or managed memory for a GPU, host or
 * pinned for the CPU).  out i64 [n] there: each id's row, or the id itself for features
 * without a table.  update 1 (training): the rounds due run first, then the batch is counted
 * (its step is the batches counted before it, plus one); a batch refused (its input, or the
 * memory its rounds and candidates' maps need, taken before any runs) runs no round and counts
 * nothing; update 0: a read-only lookup.  On the CPU the offsets (0 to n, never decreasing) and
 * inverse (within each feature's bags) are checked here; on a GPU they are read as given, not
 * read back: those of a KJT not known checked (ur_kjt_checked) must pass ur_kjt_validate first
 * (uvmrec.mc's remap sees to it).
 * A map holds one batch at a time: its remaps and rounds on two streams must be ordered by the
 * caller (an event, or one stream), as they share the map and its bag starts. */
UR_API ur_status ur_mc_remap(ur_stream *s, ur_mc *m, const ur_tensor *values,
                             const ur_tensor *offsets,
                             const int64_t *batch_per_feature /* or NULL */,
                             const ur_tensor *inverse /* or NULL */, ur_tensor *out /* out */,
                             int32_t update);
/* An eviction round of table `table` now (waits for the GPU). */
UR_API ur_status ur_mc_round(ur_stream *s, ur_mc *m, int32_t table);
/* The rows of `table` whose id changed in the rounds of the last updating ur_mc_remap (one that
 * failed ran none) or ur_mc_round
 * (evicted and given to another id: the embedding rows to re-initialise, ur_tbe_reset_rows),
 * ascending within each round; lent until the next remap, round or state_set.  NULL with *count
 * 0 when there are none or `table` is out of range (the message names it); NULL for a NULL m or
 * count (the message names the argument). */
UR_API const int64_t *ur_mc_reassigned(const ur_mc *m, int32_t table, int64_t *count /* out */);
/* The rows ids[0..n-1] (host arrays) read in `table`, without counting; resident[i] (may be
 * NULL) says whether the id holds a row of its own.  On a GPU it waits for the device first, so
 * it reads the map after every remap and round queued before it, on any stream. */
UR_API ur_status ur_mc_lookup(ur_mc *m, int32_t table, const int64_t *ids, int64_t n,
                              int64_t *rows /* out */, int32_t *resident /* out, or NULL */);
/* Updating batches counted so far (the step of the last one); settable to resume. */
UR_API int64_t ur_mc_step(const ur_mc *m);
UR_API ur_status ur_mc_set_step(ur_mc *m, int64_t step);
/* table -1: the sums over tables (capacity and resident summed too).  Waits for the GPU. */
UR_API ur_status ur_mc_stats_get(ur_mc *m, int32_t table, ur_mc_stats *out);
UR_API void ur_mc_reset_stats(ur_mc *m);
UR_API ur_status ur_mc_state_get(ur_mc *m, int32_t table, ur_mc_state *out);
/* ur_mc_state_check: whether in would restore table `table` (sizes, dtypes, ids distinct, the
 * resident rows first, counts and steps >= 0, the sizing), naming what is not; reads in, writes
 * nothing.  ur_mc_state_set checks the same, then takes the memory it needs before it writes:
 * one that fails leaves the table's map as it was. */
UR_API ur_status ur_mc_state_check(const ur_mc *m, int32_t table, const ur_mc_state *in);
UR_API ur_status ur_mc_state_set(ur_mc *m, int32_t table, const ur_mc_state *in);

/* ==== 5. cache: a software HBM cache of rows for `cached` embedding tables ==== */
/* The tables of a collection given to ur_cache_new keep their rows and optimizer state in
 * host memory (the collection's own storage of the table: host, pinned or managed), and the
 * cache keeps copies of some rows in slots where the collection runs (device memory on a GPU;
 * they count against the HBM budget).  From then on the collection's kernels read and update
 * the slots: each batch's ids go through ur_cache_prepare, which looks them up, brings the
 * missing rows in, and writes the slot ids the collection's forward and backward take.
 * Set-associative, UR_CACHE_WAYS ways per set, a row's set given by a hash of (table, row);
 * LRU (per-slot batch stamps) or LFU (per-row counts, halved every decay_batches batches);
 * write-back: a dirty row returns to host memory when evicted and on flush.  The decisions
 * are made where the collection runs (a warp per set on the GPU), the same way on both
 * backends: the CPU's are the reference of the GPU's.  Within a batch, rows are decided set by set and within a set in
 * ascending (table, row) order.  Rows of batches not yet retired are locked (never evicted);
 * a row whose set has no evictable way is a conflict miss, served from a staging row (also
 * where the collection runs) that is written back to host memory at retire. */
enum { UR_CACHE_WAYS = 32 };
typedef enum ur_cache_policy { UR_CACHE_LRU = 0, UR_CACHE_LFU, UR_CACHE_POLICY_COUNT } ur_cache_policy;
typedef struct ur_cache_config {
  int64_t slots;                  /* rows held; rounded up to whole sets of UR_CACHE_WAYS */
  const int64_t *table_slots;     /* per table: its own sets of that many slots (rounded up);
                                     NULL: the tables share the `slots` */
  ur_cache_policy policy;
  int32_t decay_batches;          /* LFU: counts halve every this many batches; 0: never */
  int64_t staging_rows;           /* conflict-miss rows per batch to start with (grows) */
  int32_t mover_warps;            /* GPU: warps moving a batch's rows, rounded up to blocks of
                                   * 32 (few SMs, beside the step's kernels), while they have at
                                   * most 512 rows each; else, and with 0, a warp a row (every
                                   * SM); uvmrec.cache's default: 256 */
} ur_cache_config;
/* Counts since the cache was made or its stats were reset; per table or in total. */
typedef struct ur_cache_stats {
  int64_t batches;                /* prepared */
  int64_t lookups;                /* ids looked up */
  int64_t unique;                 /* distinct rows per batch, summed over batches */
  int64_t hits, misses;           /* misses: rows brought into a slot */
  int64_t conflicts;              /* rows served from staging: their set had no free way */
  int64_t evictions, writebacks;  /* writebacks: rows written to host memory: dirty victims,
                                   * a trained batch's staged rows, dirty rows at a flush */
  int64_t waits;                  /* prepares that waited for the previous batch's retire */
  int64_t staging_grows;          /* the cache's (any table): staging rows grown for a batch */
  int64_t staging_grows_via_host; /* of those, grown with the kept slots waiting in host
                                   * memory: no room beside the slots for the new storage */
  uint64_t bytes_in, bytes_out;   /* rows (with optimizer state) host to cache, cache to host */
  uint64_t bytes_ids;             /* ids and lists over the host link (GPU: the decisions' info) */
  double seconds;                 /* time in the cache's calls on the host, its waits included */
  double gpu_seconds;             /* GPU time of the cache's kernels: each prepare's lookup,
                                   * decisions, placement and row moves, each retire's marks
                                   * and write-backs (0 on the CPU); waits for the GPU */
  double gpu_phase_seconds[4];    /* gpu_seconds by phase: lookup, decisions, placement and
                                   * row moves, retire */
} ur_cache_stats;
struct ur_cache;
typedef struct ur_cache ur_cache;
UR_API size_t ur_sizeof_cache_config(void);
UR_API size_t ur_sizeof_cache_stats(void);
/* Caches tables[0..num_tables-1] of collection t (one dim and dtype; placements host,
 * pinned or managed); t's kernels use the slots from now on.  Free the cache before t, or
 * after: either order is safe (freeing the cache writes dirty rows back and points t at its
 * own storage again).  Where it cannot write them back (ur_cache_flush fails: a lost cache,
 * memory, the GPU), t's tables it held are marked lost: t's forward and backward, those tables'
 * views, state, resets and layouts, and a new cache over them refuse them, naming why, until
 * ur_tbe_init_table writes each one's rows (and zeroes its optimizer state).  ur_cache_free
 * returns nothing and leaves ur_last_error() as it was: each table keeps why it was lost. */
UR_API ur_status ur_cache_new(ur_cache **out, ur_tbe *t, int32_t num_tables,
                              const int32_t *tables, const ur_cache_config *config);
UR_API void ur_cache_free(ur_cache *c);
UR_API int64_t ur_cache_slots(const ur_cache *c);
UR_API int64_t ur_cache_staging_rows(const ur_cache *c);  /* per batch, now */
UR_API int32_t ur_cache_num_tables(const ur_cache *c);
UR_API int32_t ur_cache_table(const ur_cache *c, int32_t i);   /* collection table index */
/* Slot storage in bytes where the collection runs (rows, optimizer state and staging). */
UR_API uint64_t ur_cache_bytes(const ur_cache *c);
/* A batch's ids: values i64 [n] and offsets i64 [bags + 1] as ur_tbe_forward takes them (any
 * placement: device ones are read back, synchronously), stride_per_key_per_rank as there.  Writes
 * into out (i64 [n], where the collection runs) the ids to give the collection instead:
 * slot ids for the cached tables' features, the ids themselves for other features.  The
 * copies are ordered on s; *ticket identifies the batch for ur_cache_retire.  Ids out of
 * range fail under the collection's fatal bounds check (naming table, feature, sample, id),
 * every feature's, cached or not (the collection's forward then reads no bad-id flag back);
 * else a cached table's become -1 and the others' stay (the collection skips and counts them). */
UR_API ur_status ur_cache_prepare(ur_stream *s, ur_cache *c, const ur_tensor *values,
                                  const ur_tensor *offsets,
                                  const int64_t *stride_per_key_per_rank /* or NULL */,
                                  ur_tensor *out, int64_t *ticket /* out */);
/* The batch is done with: after its backward was enqueued on s (trained 1: its rows are
 * dirty and its staged rows are written back to host memory, ordered on s), or without one
 * (trained 0).  Unlocks its rows for later prepares. */
UR_API ur_status ur_cache_retire(ur_stream *s, ur_cache *c, int64_t ticket, int32_t trained);
/* Writes every dirty row back to host memory and waits: host memory then holds the truth. */
UR_API ur_status ur_cache_flush(ur_cache *c);
/* Flushes and empties the cache (after host memory was changed behind it: a load). */
UR_API ur_status ur_cache_invalidate(ur_cache *c);
/* Rows ids[0..n-1] of the cache's table `table` leave the cache without being written back
 * (their host rows were re-initialised behind it: ur_tbe_reset_rows).  No batch may be in
 * flight.  *dropped (may be NULL) gets how many were cached. */
UR_API ur_status ur_cache_drop(ur_cache *c, int32_t table, const int64_t *ids, int64_t n,
                               int64_t *dropped /* out, or NULL */);
/* table -1: the total; else the cache's table index (0..num_tables-1). */
UR_API ur_status ur_cache_stats_get(const ur_cache *c, int32_t table, ur_cache_stats *out);
UR_API void ur_cache_reset_stats(ur_cache *c);
/* For each of ids[0..n-1] (rows of the cache's table `table`), its slot or -1. */
UR_API ur_status ur_cache_contains(const ur_cache *c, int32_t table, const int64_t *ids,
                                   int64_t n, int64_t *slots /* out */);
/* Batches prepared and not yet retired. */
UR_API int32_t ur_cache_in_flight(const ur_cache *c);

/* ==== 6. dense: linear layers, activations, interaction, cross layers, concat, loss, optimizers, arenas ==== */
/* Dense ops take 2-D row-major tensors [rows, features] of f32 or bf16 (gradients of
 * parameters are f32: bf16 math keeps f32 master weights) and run where their tensors are:
 * on the GPU when every tensor is device or managed memory and a GPU is in use, else on the
 * CPU (OpenBLAS), which is the reference.  Device memory mixed with host memory is an error. */
typedef enum ur_act { UR_ACT_NONE = 0, UR_ACT_RELU, UR_ACT_SIGMOID, UR_ACT_COUNT } ur_act;
enum {
  UR_DENSE_TF32 = 1,        /* f32 matrix products may use TF32 tensor cores (GPU) */
  UR_DENSE_ACCUMULATE = 2,  /* add into the input gradient rather than overwrite it */
  UR_DENSE_GY_MASKED = 4,   /* linear backward: gy is already the gradient at the ReLU's input,
                               and the bias gradient was taken (by the layer above: X_RELU or
                               x_mask) */
  UR_DENSE_WGRAD_ASYNC = 8, /* linear backward (GPU): gw and gb on a side stream of s, which
                               ur_dense_join brings back; the inputs must stay until then */
  UR_DENSE_X_RELU = 16,     /* linear backward: x is the stored output of a ReLU (the layer
                               below's): gx is masked by "x > 0 or x is NaN", as x_mask would */
  /* Bits 8..15: the first row's index in a larger batch, mod 256 (a data-parallel rank's
   * first sample in the global batch): the CPU then computes each row of a linear layer bit
   * for bit as it computes that row of the whole batch. */
  UR_DENSE_ROW0_SHIFT = 8,
  UR_DENSE_PAD_SHIFT = 16,  /* flags | n << PAD_SHIFT (n <= PAD_MAX): the last n columns of x
                               and w are zero padding (the CPU skips them; gx's are written zero) */
  UR_DENSE_PAD_MAX = 255
};
typedef enum ur_reduction {
  UR_REDUCTION_MEAN = 0, UR_REDUCTION_SUM, UR_REDUCTION_NONE, UR_REDUCTION_COUNT
} ur_reduction;
struct ur_arena;
typedef struct ur_arena ur_arena;
typedef struct ur_arena_stats {
  uint64_t used;            /* bytes handed out, alignment included */
  uint64_t reserved;        /* bytes of the blocks */
  uint64_t blocks;          /* allocations made, ever */
  uint64_t tensors;         /* tensors handed out, ever */
} ur_arena_stats;

UR_API size_t ur_sizeof_arena_stats(void);

/* y[rows, out] = act(x[rows, in] w[out, in]^T + b[out]), one dtype for all four; b may be
 * NULL; act NONE or RELU (fused into the product's epilogue on the GPU); flags: TF32, PAD.
 * With RELU, mask (u8 [rows, ur_linear_mask_cols(out)], or NULL) receives "y > 0 or y is NaN"
 * as bits (element j of a row: bit j % 8 of byte j / 8), for the backward of the layer reading
 * y.  ReLU passes NaN on on the CPU and in the engine's own GPU kernels; cuBLASLt's epilogues,
 * which the GPU's products use, give NaN or 0 for it, by kernel. */
UR_API ur_status ur_linear_forward(ur_stream *s, const ur_tensor *x, const ur_tensor *w,
                                   const ur_tensor *b /* or NULL */, ur_tensor *y /* out */,
                                   ur_tensor *mask /* out, or NULL */, ur_act act, uint32_t flags);
/* From gy = dL/dy, with g = gy masked by "y > 0 or y is NaN" (RELU; then y and work [rows, out] of x's dtype
 * are needed, and work receives g) or g = gy (NONE, or GY_MASKED):
 * gx = g w (+= with ACCUMULATE), gw += g^T x, gb += column sums of g.  With X_RELU (x is the
 * layer below's ReLU output), gx is masked by "x > 0 or x is NaN" and gb_x += the column sums
 * of that masked gx: the layer below's gradient at its ReLU's input and its bias gradient, so
 * its backward takes GY_MASKED and no gb (on the GPU one pass after the product masks gx and
 * sums it).  x_mask (the mask the layer below's forward wrote) does the same from its bits:
 * on the GPU through cuBLASLt's DRELU epilogues, where it has them (on an H200 they took 2-4x
 * the bare product: docs/dense.md); the library's own Linears use X_RELU.  gx, gw, gb, x_mask
 * and gb_x may each be NULL; gw, gb and gb_x are f32.  flags: TF32, ACCUMULATE (not with x_mask
 * or X_RELU), GY_MASKED, WGRAD_ASYNC, X_RELU (not with x_mask), PAD. */
UR_API ur_status ur_linear_backward(ur_stream *s, const ur_tensor *x, const ur_tensor *w,
                                    const ur_tensor *y /* or NULL */, const ur_tensor *gy,
                                    const ur_tensor *x_mask /* or NULL */,
                                    ur_tensor *gx /* out, or NULL */,
                                    ur_tensor *gw /* out, or NULL */,
                                    ur_tensor *gb /* out, or NULL */,
                                    ur_tensor *gb_x /* out, or NULL */,
                                    ur_tensor *work /* or NULL */, ur_act act, uint32_t flags);
/* The GPU workspace a ur_linear_backward call needs, for x [rows, in] and gy [rows, out], the
 * optional outputs and x_mask given or not (gx, gw, gb, x_mask: 1 or 0; gb_x is counted as
 * given), act and flags as the call takes them, on a GPU of sms multiprocessors: in
 * *main_bytes for s and in *side_bytes for its weight gradients' side stream (WGRAD_ASYNC), 0
 * where the call runs nothing.  Each is cuBLASLt's 32 MiB and after it the largest part the
 * call asks there (the bias gradients' and a one-output layer's partial sums, which depend on
 * sms).  A stream's workspace grows to the most a call on it needs, and stays
 * (ur_memory_stats.workspace).  Where cuBLASLt has no algorithm for a product, cuBLAS runs it
 * and a pass after it asks more, which these do not count.  Computed on any machine. */
UR_API ur_status ur_linear_backward_workspace(int64_t rows, int64_t in, int64_t out, int32_t gx,
                                              int32_t gw, int32_t gb, int32_t x_mask,
                                              uint64_t *main_bytes /* out */,
                                              uint64_t *side_bytes /* out */, ur_act act,
                                              uint32_t flags, int32_t sms);
/* Bytes a row of a ReLU mask takes for out columns: whole 16-byte words. */
UR_API int64_t ur_linear_mask_cols(int64_t out);
/* Work enqueued on s after this waits for the weight gradients that linear backward calls with
 * WGRAD_ASYNC on s put on its side stream.  Returns at once when none is pending (and without
 * a GPU, where work is synchronous). */
UR_API ur_status ur_dense_join(ur_stream *s);
/* Elementwise y = act(x) (RELU or SIGMOID), and gx = gy act'(x) computed from y; in place
 * (y = x, gx = gy) is allowed. */
UR_API ur_status ur_act_forward(ur_stream *s, const ur_tensor *x, ur_tensor *y /* out */,
                                ur_act act);
UR_API ur_status ur_act_backward(ur_stream *s, const ur_tensor *y, const ur_tensor *gy,
                                 ur_tensor *gx /* out */, ur_act act);
/* The DLRM dot interaction.  dense [rows, d] and emb [rows, T*d] are T+1 vectors per row;
 * out [rows, d + P] is dense followed by the dot products of pairs (i, j), j < i (j <= i with
 * self_interaction), in the order i = 1.., j = 0..: P = T(T+1)/2 (+ T+1).  out (and gout) may
 * also be padded to a multiple of 8 columns (ur_interaction_cols): the padding is written
 * zero and its gradient ignored, so a next layer's rows stay aligned.  Each of the three may
 * be f32 or bf16 (sums in f32); the gradients take their input's dtype.  flags: TF32 (f32
 * inputs may use TF32 tensor cores on the GPU; bf16 inputs use bf16 ones whatever the flags). */
UR_API ur_status ur_interaction_forward(ur_stream *s, const ur_tensor *dense,
                                        const ur_tensor *emb, ur_tensor *out /* out */,
                                        int32_t self_interaction, uint32_t flags);
UR_API ur_status ur_interaction_backward(ur_stream *s, const ur_tensor *dense,
                                         const ur_tensor *emb, const ur_tensor *gout,
                                         ur_tensor *gdense /* out */, ur_tensor *gemb /* out */,
                                         int32_t self_interaction, uint32_t flags);
/* Columns of the interaction's output: d + P, or that rounded up to a multiple of 8 (padded);
 * 0 when tables or dim is below 1. */
UR_API int64_t ur_interaction_cols(int32_t tables, int32_t dim, int32_t self_interaction,
                                   int32_t padded);
/* A DCNv2 cross layer's elementwise part: y = x0 * z + xl, where z = W xl + b comes from
 * ur_linear_forward.  Backward from gy: gz = gy * x0; gx0 = gy * z (+= with ACCUMULATE);
 * gxl = gy, or, when gxl is NULL (the layer whose xl is x0), gy is added into gx0 too. */
UR_API ur_status ur_cross_forward(ur_stream *s, const ur_tensor *x0, const ur_tensor *z,
                                  const ur_tensor *xl, ur_tensor *y /* out */);
UR_API ur_status ur_cross_backward(ur_stream *s, const ur_tensor *x0, const ur_tensor *z,
                                   const ur_tensor *gy, ur_tensor *gz /* out */,
                                   ur_tensor *gx0 /* out */, ur_tensor *gxl /* out, or NULL */,
                                   uint32_t flags);
/* out [rows, sum of widths] = the n parts [rows, width_i] side by side (one dtype), and back. */
UR_API ur_status ur_features_concat(ur_stream *s, const ur_tensor *const *parts, int32_t n,
                                    ur_tensor *out /* out */);
UR_API ur_status ur_features_split(ur_stream *s, const ur_tensor *in,
                                   ur_tensor *const *parts /* out */, int32_t n);
/* Binary cross-entropy on logits, stable at any logit: l_i = w_i (max(x, 0) - x y +
 * log(1 + e^-|x|)).  logits [rows] or [rows, 1], f32 or bf16; targets and weights (NULL: 1)
 * f32 of as many elements; loss f32 [1] (MEAN: sum / rows, SUM) or [rows] (NONE).  Sums in
 * double, in a fixed order.  Backward: glogits (logits' dtype) = scale * dl/dx. */
UR_API ur_status ur_bce_forward(ur_stream *s, const ur_tensor *logits, const ur_tensor *targets,
                                const ur_tensor *weights /* or NULL */, ur_tensor *loss /* out */,
                                ur_reduction reduction);
UR_API ur_status ur_bce_backward(ur_stream *s, const ur_tensor *logits, const ur_tensor *targets,
                                 const ur_tensor *weights /* or NULL */,
                                 ur_tensor *glogits /* out */, ur_reduction reduction,
                                 double scale);
/* out f32 [1] = the mean of every element of x (f32 or bf16; summed in double). */
UR_API ur_status ur_dense_mean(ur_stream *s, const ur_tensor *x, ur_tensor *out /* out */);
/* dst = src converted between f32 and bf16 (round to nearest even), or copied. */
UR_API ur_status ur_dense_cast(ur_stream *s, const ur_tensor *src, ur_tensor *dst /* out */);
/* One step of cfg's rule over n parameters (f32) with their gradients (f32, same shapes) and
 * state (f32, same shapes: SGD's momentum buffer in state1; Adagrad's sum in state1; Adam's
 * exp_avg, exp_avg_sq in state1, state2; NULL arrays or entries where a rule needs none);
 * halves (NULL or entries NULL) receive the new values in bf16.  On the GPU, one launch
 * for every 48 parameters.  gate: a guard's flags (ur_nonfinite_check); when its element 0 is
 * set as the step runs, parameters and state are left as they are (gradients are still zeroed
 * when cfg->zero_grad says so), decided where the work runs, without a wait; Adam's update
 * number is then cfg->step less the gate's [2] (skipped steps not yet taken off the count).
 * cfg->clip_norm > 0 clips the gradients by their global norm first (without a wait, so a
 * step stays capturable in a graph): clip_work, f64 [UR_OPTIM_CLIP_WORK] on the parameters'
 * side, receives [0] the norm (summed in f64: finite whenever every gradient is), [1] the
 * factor the update reads the gradients with, then partial sums; gradients not zeroed by the
 * step keep the clipped values, as PyTorch's. */
enum { UR_OPTIM_CLIP_PARTS = 256, UR_OPTIM_CLIP_WORK = 2 + UR_OPTIM_CLIP_PARTS };
UR_API ur_status ur_optim_step(ur_stream *s, const ur_optim_config *cfg, int32_t n,
                               ur_tensor *const *params, ur_tensor *const *grads,
                               ur_tensor *const *state1 /* or NULL */,
                               ur_tensor *const *state2 /* or NULL */,
                               ur_tensor *const *halves /* or NULL */,
                               const ur_tensor *gate /* or NULL */,
                               ur_tensor *clip_work /* or NULL without clip_norm */);

/* An arena: tensors carved from a few large blocks of one placement, 256-byte aligned, so a
 * model's activations cost a handful of allocations once.  A tensor keeps its block alive;
 * reset makes later tensors come from new blocks. */
UR_API ur_status ur_arena_new(ur_arena **out, ur_place place, int32_t device,
                              uint64_t block_bytes);
UR_API void ur_arena_free(ur_arena *a);
UR_API ur_status ur_arena_tensor(ur_arena *a, ur_tensor **out, ur_dtype dtype, int32_t ndim,
                                 const int64_t *shape);
UR_API void ur_arena_reset(ur_arena *a);
UR_API void ur_arena_stats_get(const ur_arena *a, ur_arena_stats *out);

/* ==== 7. metrics: AUC, grouped AUC, NE and the rest, streaming ==== */
/* Streaming metrics of binary predictions (engine/src/metrics/metrics.c), computed where the metric's
 * state lives: on the GPU for device or managed state when one is in use, else on the CPU.
 * Inputs are f32 predictions and labels [n] or [n, tasks] (labels in [0, 1]: a sample counts
 * w * y as positive and w * (1 - y) as negative), optional f32 weights [n] or [n, tasks] and
 * i64 grouping keys [n]; the GPU reads device, managed and pinned memory, the CPU host,
 * pinned and managed memory.  Two scopes: the window (the last `window` samples, kept on the
 * device, from which AUC and grouped AUC are exact) and the lifetime (f64 sums, and a
 * histogram of `bins` prediction bins over [0, 1] for AUC).  Updates enqueue work on the
 * stream and never wait; compute waits for it.  Calls on one metric are ordered on the
 * streams they are given: use one stream per metric, or order them.  No result is ever NaN
 * for finite inputs: every denominator is clamped at eta, and a value that needs both classes
 * is a number anyway (torchrec's convention, kept so that callers never meet a NaN): AUC of a
 * scope without a positive and a negative weight (one class, or no sample) is 0.5 with
 * auc_error 0, grouped AUC with no group holding both classes (groups 0) is 0.5, and NE (over
 * the entropy of a base rate of 0 or 1, which is 0) and calibration without positive weight
 * (over the positive weight) divide by about eta instead: 2e12 for one sample of log loss 2
 * and torchrec's eta.  None of these is a measurement: tell them by positive and negative
 * (both > 0: AUC is defined) and groups; uvmrec.metrics (Lua) reports them as undefined, nil
 * with the reason, instead. */
typedef struct ur_metrics_opts {
  int32_t tasks;        /* columns of predictions and labels, 1 to 1024 */
  int32_t auc;          /* 1: exact AUC over the window */
  int32_t grouped_auc;  /* 1: grouped AUC over the window; every update then needs keys */
  int32_t bins;         /* lifetime AUC histogram bins, 0 (no lifetime AUC) to 2^24 */
  int64_t window;       /* samples kept for the window scope, 0 (none) to 2^31 - 1 */
  double threshold;     /* accuracy: prediction >= threshold says positive (0.5) */
  double eta;           /* predictions are clamped to [eta, 1 - eta] in log loss, and
                           denominators at eta; in (0, 0.5), torchrec's is 1e-12 */
} ur_metrics_opts;
/* One task's values in one scope.  AUC counts tied predictions as half (Mann-Whitney);
 * lifetime AUC comes from the histogram, within auc_error of the exact AUC of all samples
 * seen: auc_error = 0.5 * sum over bins of positive(bin) * negative(bin) / (P * N), the
 * weight of the pairs a bin cannot order, at most 0.5 * max_bin negative(bin) / N.  A scope
 * with one class has auc 0.5 (see above: not a measurement).  What a scope does not compute
 * is 0, which is no AUC either: auc and auc_error of the window without opts auc and a
 * window, of the lifetime without bins; grouped_auc and groups without grouped_auc. */
typedef struct ur_metric_values {
  double auc, auc_error;
  double grouped_auc;   /* mean AUC over the groups holding both classes (window only; 0.5
                           when no group does: groups 0) */
  double ne;            /* log loss / entropy of the weighted base rate (torchrec's NE) */
  double logloss;       /* mean weighted binary cross-entropy, natural log */
  double accuracy;      /* weight of samples on the right side of the threshold / weight */
  double calibration;   /* sum of w * prediction / sum of w * label */
  double ctr;           /* sum of w * label / sum of w */
  double weight, positive, negative; /* sums of w, w * y, w * (1 - y) */
  int64_t samples;      /* samples counted (exact as f64 up to 2^53, past 2^32) */
  int64_t groups;       /* groups that entered grouped_auc */
} ur_metric_values;
struct ur_metrics;
typedef struct ur_metrics ur_metrics;
UR_API size_t ur_sizeof_metrics_opts(void);
UR_API size_t ur_sizeof_metric_values(void);
/* State in placement place (host, pinned, managed or device) on device (-1: the CPU). */
UR_API ur_status ur_metrics_new(ur_metrics **out, const ur_metrics_opts *opts, ur_place place,
                                int32_t device);
UR_API void ur_metrics_free(ur_metrics *m);
/* Adds a batch: lifetime sums and histogram, and its last samples into the window.  weights
 * and groups may be NULL (weight 1; groups are needed only with grouped_auc). */
UR_API ur_status ur_metrics_update(ur_stream *s, ur_metrics *m, const ur_tensor *predictions,
                                   const ur_tensor *labels, const ur_tensor *weights /* or NULL */,
                                   const ur_tensor *groups /* or NULL */);
UR_API ur_status ur_metrics_reset(ur_stream *s, ur_metrics *m);
/* Samples added since the last reset (host-side; no wait). */
UR_API int64_t ur_metrics_seen(const ur_metrics *m);
UR_API int32_t ur_metrics_on_gpu(const ur_metrics *m);
/* For a reduction across GPUs: copies the lifetime state into the metric's snapshot buffer
 * and lends it, *count doubles in the metric's placement, to be summed in place over the
 * ranks (every entry adds: sums, counts, histogram) before ur_metrics_compute with
 * from_snapshot = 1.  Ordered on s like everything else. */
UR_API ur_status ur_metrics_snapshot(ur_stream *s, ur_metrics *m, double **state /* out */,
                                     uint64_t *count /* out */);
/* The same snapshot as an f64 [count] tensor (a view the caller frees), for a communicator's
 * all-reduce (ur_comm_all_reduce). */
UR_API ur_status ur_metrics_snapshot_tensor(ur_stream *s, ur_metrics *m, ur_tensor **out /* out */);
/* Views of the window's filled part (rows in slot order, not time order): predictions,
 * labels and weights f32 [n, tasks], groups i64 [n] (NULL without grouped_auc).  The caller
 * frees them; an all-gather of these over the ranks is the window of the whole job. */
UR_API ur_status ur_metrics_window(const ur_metrics *m, ur_tensor **predictions,
                                   ur_tensor **labels, ur_tensor **weights, ur_tensor **groups);
/* Fills window[tasks] and lifetime[tasks]; waits for the stream.  The window scope comes from
 * the given tensors (as in update; any length up to 2^31 - 1, in the metric's reach) or, when
 * predictions is NULL, from the metric's own window; the lifetime scope from the snapshot
 * (from_snapshot = 1) or the live state. */
UR_API ur_status ur_metrics_compute(ur_stream *s, ur_metrics *m, int32_t from_snapshot,
                                    const ur_tensor *predictions /* or NULL */,
                                    const ur_tensor *labels /* or NULL */,
                                    const ur_tensor *weights /* or NULL */,
                                    const ur_tensor *groups /* or NULL */,
                                    ur_metric_values *window /* out */,
                                    ur_metric_values *lifetime /* out */);

/* ==== 8. io: checkpoints (safetensors), configs (YAML), JSON ==== */
/* safetensors files (engine/src/io/safetensors.c): an 8-byte little-endian header length, a JSON
 * header (per tensor: dtype F32 BF16 F16 I8 U8 I32 I64 F64, shape, data_offsets from the start of
 * the data; "__metadata__": strings to strings), then the raw little-endian data.  Saving
 * writes <path>.tmp-XXXXXX in the same directory, fsyncs it, renames it over path and fsyncs
 * the directory, so a failed or killed save leaves the previous file as it was.  Tensors are
 * laid out as the reference implementation does (by dtype, widest first, then by name), so
 * each is aligned to its element size.  Device and managed tensors move through a pinned
 * staging buffer of staging_bytes (0: 64 MiB) in chunks, so a table larger than host memory
 * is saved and loaded without that much host memory; host and pinned ones are written and
 * read in place.  Saves do not poll the interrupt flag (a save on SIGINT must finish); loads
 * do.  Opening maps the file and validates the header and the layout (UR_STATUS_FORMAT for a
 * malformed file, naming the file, the tensor and the value; UR_STATUS_UNSUPPORTED for a tensor
 * of more than UR_MAX_DIMS dimensions; UR_STATUS_IO for the OS). */
typedef struct ur_safetensors ur_safetensors;
typedef struct ur_safetensors_entry {
  const char *name;               /* valid while the file is open */
  int32_t dtype;                  /* ur_dtype */
  int32_t ndim;                   /* 0 (a scalar) to UR_MAX_DIMS */
  int64_t shape[4];
  uint64_t begin, end;            /* data_offsets: bytes from the start of the data */
  uint64_t file_offset;           /* where the tensor's bytes start in the file */
} ur_safetensors_entry;
UR_API size_t ur_sizeof_safetensors_entry(void);
/* n tensors of any placement under unique names, and nmeta metadata pairs (UTF-8). */
UR_API ur_status ur_safetensors_save(ur_stream *s, const char *path, int32_t n,
                                     const char *const *names, const ur_tensor *const *tensors,
                                     int32_t nmeta, const char *const *meta_keys,
                                     const char *const *meta_values, uint64_t staging_bytes);
/* A file written a part at a time, so that no tensor need be whole in memory at once: open
 * takes every tensor's name, dtype, ndim and shape (entries; it fills their begin, end and
 * file_offset) and the metadata, lays them out as save does and writes the header into the
 * temporary file; put appends a part (any placement, the tensor's dtype) to tensor i's bytes
 * (entries' index), tensors in any order; close checks that every byte was given and publishes
 * the file as save does (fsync, rename, the directory's fsync), then frees the writer.  free
 * abandons a writer (its temporary file removed; path unchanged).  A file written by parts is
 * the file save writes of the same tensors, byte for byte: each tensor's CRC32C is computed
 * over its parts as they are put (a part is appended to the tensor's bytes given before it)
 * and close writes the header again with them ("uvmrec.crc32c", below), the same length. */
typedef struct ur_safetensors_writer ur_safetensors_writer;
UR_API ur_status ur_safetensors_writer_open(ur_safetensors_writer **out, ur_stream *s,
                                            const char *path, int32_t n,
                                            ur_safetensors_entry *entries /* in and out */,
                                            int32_t nmeta, const char *const *meta_keys,
                                            const char *const *meta_values,
                                            uint64_t staging_bytes);
UR_API ur_status ur_safetensors_writer_put(ur_stream *s, ur_safetensors_writer *w, int32_t i,
                                           const ur_tensor *part);
UR_API ur_status ur_safetensors_writer_close(ur_safetensors_writer *w);
UR_API void ur_safetensors_writer_free(ur_safetensors_writer *w);
UR_API ur_status ur_safetensors_open(ur_safetensors **out, const char *path);
UR_API void ur_safetensors_close(ur_safetensors *f);
UR_API const char *ur_safetensors_path(const ur_safetensors *f);
UR_API uint64_t ur_safetensors_bytes(const ur_safetensors *f);      /* the file's size */
UR_API uint64_t ur_safetensors_data_start(const ur_safetensors *f); /* 8 + header length */
UR_API int32_t ur_safetensors_count(const ur_safetensors *f);       /* entries, in data order */
UR_API ur_status ur_safetensors_entry_get(const ur_safetensors *f, int32_t i,
                                          ur_safetensors_entry *out);
UR_API int32_t ur_safetensors_find(const ur_safetensors *f, const char *name); /* -1: absent */
UR_API int32_t ur_safetensors_meta_count(const ur_safetensors *f);
UR_API const char *ur_safetensors_meta_key(const ur_safetensors *f, int32_t i);
UR_API const char *ur_safetensors_meta_get(const ur_safetensors *f, const char *key); /* or NULL */
/* Copies tensors names[0..n-1] into dsts (any placement, same dtype and shape; a scalar loads
 * into shape [1]).  Every name and shape is checked before anything is written. */
UR_API ur_status ur_safetensors_load(ur_stream *s, const ur_safetensors *f, int32_t n,
                                     const char *const *names, ur_tensor *const *dsts,
                                     uint64_t staging_bytes);
/* A host tensor over the mapped bytes (zero-copy; a scalar is shape [1]).  It keeps the
 * mapping alive after close; writes to it stay in memory (copy-on-write), never in the file. */
UR_API ur_status ur_safetensors_view(const ur_safetensors *f, int32_t i, ur_tensor **out);
/* dst's bytes (host or pinned) from byte `offset` of tensor i, read from the file (its pages
 * are not mapped, so a table is read a part at a time in that part's host memory).  In a file
 * with checksums, parts read in order of offset from byte 0 are checked as a whole with no
 * second read: the read that reaches the tensor's end returns UR_STATUS_FORMAT (the file, the
 * tensor, both checksums) when the bytes read do not match (dst holds them; the caller discards
 * its work; a read from byte 0 starts the run again).  Any other read (out of order, after a
 * break) checks the whole tensor first, once, and writes nothing into dst when it does not
 * match.  Once a tensor matched (a run to its end, or ur_safetensors_verify) its parts read
 * unchecked.  A caller that reads only a prefix in order calls ur_safetensors_verify first: a
 * run that stops before the end is never checked.  The runs' state is kept in f: one reader at
 * a time per tensor. */
UR_API ur_status ur_safetensors_read_part(const ur_safetensors *f, int32_t i,
                                          ur_tensor *dst /* out */, uint64_t offset);
/* *out = the index of the first NaN or infinity of tensor i (f32, bf16, f16, f64; -1 when none,
 * and for other dtypes), read from the file a chunk at a time (the pages are not mapped: the
 * host memory used stays a chunk's), before a load that should refuse such a tensor. */
UR_API ur_status ur_safetensors_find_nonfinite(const ur_safetensors *f, int32_t i, int64_t *out);
/* Every save of tensors keeps each one's CRC32C in the metadata ("uvmrec.crc32c": a JSON object
 * of tensor names to 8 lowercase hex digits, the writer's own key); opening checks that it names
 * every tensor, and reads both checksums' keys in that form only.  Every save with metadata or
 * tensors also keeps "uvmrec.header_crc32c", the CRC32C of what the header says (the other
 * metadata pairs by key, then each tensor's name, dtype, shape and offsets by name:
 * docs/checkpoints.md), and opening refuses a header that gives another (UR_STATUS_FORMAT: a
 * flipped bit in a metadata key or value, or in a shape).
 * ur_safetensors_verify reads tensor i a chunk at a time and checks its bytes against
 * it (UR_STATUS_FORMAT naming the file, the tensor and its bytes when they differ: a flipped
 * bit), finding its first NaN or infinity as ur_safetensors_find_nonfinite does in the same
 * read (nonfinite may be NULL); a file without checksums (another writer's) is only scanned.
 * ur_safetensors_load does not verify: call this first, for every tensor to be loaded, as the
 * Lua library does, so that a corrupted file is refused before anything is written. */
UR_API ur_status ur_safetensors_verify(const ur_safetensors *f, int32_t i,
                                       int64_t *nonfinite /* out, or NULL */);
/* The CRC32C (Castagnoli) of n bytes, continuing crc (0 to start; "123456789" gives e3069283):
 * the checksum of the files above, for the library's other files (a sharded checkpoint's
 * manifest.json). */
UR_API uint32_t ur_crc32c(uint32_t crc, const void *p, size_t n);

/* ---- YAML documents (configs) ---- */
/* A YAML file as a tree of nodes with their positions, read through libyaml's event API.
 * Anchors, aliases, several documents and nesting deeper than UR_YAML_MAX_DEPTH are errors
 * naming file:line:column; typing the scalars is the schema's job (lua/uvmrec/config.lua). */
enum { UR_YAML_SCALAR = 0, UR_YAML_MAP = 1, UR_YAML_SEQ = 2, UR_YAML_MAX_DEPTH = 64 };
enum { UR_YAML_PLAIN = 0, UR_YAML_QUOTED = 1, UR_YAML_BLOCK = 2 };
typedef struct ur_yaml_node {
  int32_t kind;          /* UR_YAML_SCALAR, MAP or SEQ */
  int32_t style;         /* scalars: UR_YAML_PLAIN, QUOTED or BLOCK (| and >) */
  int32_t line, column;  /* 1-based, where the node starts */
  int32_t first_child;   /* index of the first child, -1 if none; a map's children alternate
                            key, value */
  int32_t next_sibling;  /* -1 if none */
  int32_t count;         /* children */
  int32_t has_tag;       /* 1 when the node carries an explicit tag (!!str, !foo) */
  const char *value;     /* a scalar's text, NUL-terminated; NULL for containers */
  uint64_t length;       /* a scalar's length in bytes (values may hold NUL) */
} ur_yaml_node;
typedef struct ur_yaml_doc ur_yaml_doc;
UR_API size_t ur_sizeof_yaml_node(void);
UR_API ur_status ur_yaml_load(ur_yaml_doc **out, const char *path);
UR_API ur_status ur_yaml_parse(ur_yaml_doc **out, const char *text, size_t len,
                               const char *name /* or NULL */);
UR_API int32_t ur_yaml_count(const ur_yaml_doc *d);    /* nodes; node 0 is the root */
UR_API const ur_yaml_node *ur_yaml_nodes(const ur_yaml_doc *d);
UR_API const char *ur_yaml_name(const ur_yaml_doc *d); /* the file name errors use */
UR_API void ur_yaml_free(ur_yaml_doc *d);

/* ---- JSON values for checkpoint metadata, run logs and benchmarks (engine/src/io/json.c) ---- */
/* jansson holds the values.  Integers are 64-bit signed and exact (text beyond int64 is an
 * error naming it); reals are doubles.  A value owns what it holds: ur_json_free frees a root
 * and everything in it, and the values ur_json_item and ur_json_iter_value lend live as long as
 * their root.  ur_json_dump writes canonical text, the same bytes for the same value: object
 * keys sorted bytewise, no spaces, integers in digits, reals as "%.17g", strings escaped as
 * \" \\ \b \f \n \r \t and \u00xx (other control bytes) and otherwise as they are. */
typedef struct ur_json ur_json;
typedef enum ur_json_type {
  UR_JSON_NULL = 0, UR_JSON_FALSE, UR_JSON_TRUE, UR_JSON_INTEGER, UR_JSON_REAL, UR_JSON_STRING,
  UR_JSON_ARRAY, UR_JSON_OBJECT
} ur_json_type;
/* Any JSON value (not only objects and arrays); UR_STATUS_FORMAT names the byte where it fails. */
UR_API ur_status ur_json_parse(ur_json **out, const char *text, size_t len);
UR_API void ur_json_free(ur_json *v);
UR_API ur_json_type ur_json_typeof(const ur_json *v);
UR_API int64_t ur_json_integer(const ur_json *v);                 /* 0 unless an integer */
UR_API double ur_json_real(const ur_json *v);                     /* 0 unless a real */
UR_API const char *ur_json_string(const ur_json *v, size_t *len); /* NULL unless a string */
UR_API size_t ur_json_size(const ur_json *v);        /* an array's items, an object's members */
UR_API ur_json *ur_json_item(const ur_json *array, size_t i);     /* NULL past the end */
/* An object's members in the text's order: an iterator (NULL when there are no more). */
UR_API void *ur_json_iter(const ur_json *object);
UR_API void *ur_json_iter_next(const ur_json *object, void *it);
UR_API const char *ur_json_iter_key(void *it, size_t *len);
UR_API ur_json *ur_json_iter_value(void *it);
/* Building: null, false, true, an empty array or object; then the typed values.  A real must
 * be finite and a string valid UTF-8 (else UR_STATUS_INVALID). */
UR_API ur_status ur_json_new(ur_json **out, ur_json_type type);
UR_API ur_status ur_json_new_integer(ur_json **out, int64_t value);
UR_API ur_status ur_json_new_real(ur_json **out, double value);
UR_API ur_status ur_json_new_string(ur_json **out, const char *s, size_t len);
/* Both take the value they add, also when they fail, except the container itself (refused,
 * UR_STATUS_INVALID, and left as it was); a key set again replaces its value. */
UR_API ur_status ur_json_append(ur_json *array, ur_json *item);
UR_API ur_status ur_json_set(ur_json *object, const char *key, size_t len, ur_json *value);
/* Canonical text into buf[len], NUL-terminated; *needed is the bytes it takes with the NUL
 * (retry with a larger buf when it is more than len). */
UR_API ur_status ur_json_dump(const ur_json *v, char *buf, uint64_t len, uint64_t *needed);
/* ==== 9. dist: communicators over the ranks of a job (NCCL on GPUs, MPI on hosts) ==== */
/* A job runs one process ("rank") per GPU.  A communicator joins the job's W ranks.  Collectives
 * on device memory (device tensors, and managed ones when a GPU is in use) go through NCCL
 * (libnccl.so.2 opened at run time: UVMREC_NCCL, the CUDA toolkit's, the system's, or PyTorch's
 * nvidia/nccl/lib); on host memory (host, pinned) through MPI (libuvmrec_mpi.so, a plugin built
 * against OpenMPI and opened at run time), so a single process needs neither.  The ranks come
 * from the environment: MPI's (the process was started by mpirun, on one host or several), else
 * `uvmrec launch`'s (UVMREC_RANK, UVMREC_WORLD, UVMREC_LOCAL_RANK; NCCL's unique id is handed from
 * rank 0 to the others through a file in the folder UVMREC_RENDEZVOUS, a bootstrap, not a
 * transport), else the world is this process alone and collectives copy.  Without MPI, host
 * collectives over several ranks are staged through the GPU's NCCL communicator.
 * Every rank makes the same collectives in the same order.  A collective is ordered after the
 * work enqueued on s so far and runs on the communicator's own high-priority stream (MPI's are
 * non-blocking); its output may be used by work enqueued on s after ur_comm_wait(s, c), and
 * read on the host after ur_comm_wait returned, and its input must not change until then.
 * Element counts are per rank, in rank order; a tensor's elements are taken as a flat array. */
typedef enum ur_reduce_op { UR_REDUCE_SUM = 0, UR_REDUCE_MAX, UR_REDUCE_MIN, UR_REDUCE_COUNT } ur_reduce_op;
struct ur_comm;
typedef struct ur_comm ur_comm;
/* What a communicator moved since it was made (or the stats were reset). */
typedef struct ur_comm_stats {
  int64_t calls;                  /* collectives issued */
  uint64_t bytes_sent;            /* this rank's bytes handed to the engine, to other ranks */
  uint64_t bytes_received;        /* bytes that came from other ranks */
  double seconds;                 /* host time in the calls, waits included */
} ur_comm_stats;
UR_API size_t ur_sizeof_comm_stats(void);
/* The job's communicator, its rank and world from the environment.  device: the GPU of this
 * rank's device collectives (-1: host memory only).  Environmental failures (no MPI plugin for
 * a job started by mpirun, no NCCL, a rendezvous that times out) name what was tried. */
UR_API ur_status ur_comm_new(ur_comm **out, int32_t device);
UR_API void ur_comm_free(ur_comm *c);
UR_API int32_t ur_comm_rank(const ur_comm *c);
UR_API int32_t ur_comm_world(const ur_comm *c);
UR_API int32_t ur_comm_local_rank(const ur_comm *c);   /* among the ranks of this host */
UR_API int32_t ur_comm_local_world(const ur_comm *c);
UR_API int32_t ur_comm_device(const ur_comm *c);
/* The engines in use: host memory "mpi", "nccl" (staged through the GPU), "self" (a world of
 * one) or "none"; device memory "nccl", "self" or "none". */
UR_API const char *ur_comm_host_engine(const ur_comm *c);
UR_API const char *ur_comm_device_engine(const ur_comm *c);
/* out = op over the ranks of in, elementwise (in and out alike in dtype and size; in == out is
 * allowed).  dtypes f32, f64, i32, i64 (on NCCL also f16, bf16). */
UR_API ur_status ur_comm_all_reduce(ur_stream *s, ur_comm *c, const ur_tensor *in, ur_tensor *out,
                                    ur_reduce_op op);
/* in holds W blocks of out's size; rank r's out = op over the ranks of block r. */
UR_API ur_status ur_comm_reduce_scatter(ur_stream *s, ur_comm *c, const ur_tensor *in,
                                        ur_tensor *out, ur_reduce_op op);
/* out = every rank's in, in rank order; counts[r] the elements of rank r (NULL: all alike). */
UR_API ur_status ur_comm_all_gather(ur_stream *s, ur_comm *c, const ur_tensor *in, ur_tensor *out,
                                    const int64_t *counts /* or NULL: all alike */);
/* t on every rank = root's t. */
UR_API ur_status ur_comm_broadcast(ur_stream *s, ur_comm *c, ur_tensor *t, int32_t root);
/* in holds send_counts[r] elements for each rank r in turn; out receives recv_counts[r]
 * elements from each rank r in turn (recv_counts here = send_counts there, to this rank). */
UR_API ur_status ur_comm_all_to_all(ur_stream *s, ur_comm *c, const ur_tensor *in, ur_tensor *out,
                                    const int64_t *send_counts, const int64_t *recv_counts);
/* Every rank has reached it (waits on the host). */
UR_API ur_status ur_comm_barrier(ur_stream *s, ur_comm *c);
/* The collectives between start and end go to the engine as one (NCCL's group: several
 * all-to-alls in one launch); end needs the stream the collectives were given. */
UR_API ur_status ur_comm_group_start(ur_comm *c);
UR_API ur_status ur_comm_group_end(ur_stream *s, ur_comm *c);
/* Work enqueued on s from now on waits for every collective issued so far; host ones are done
 * when it returns. */
UR_API ur_status ur_comm_wait(ur_stream *s, ur_comm *c);
UR_API ur_status ur_comm_stats_get(const ur_comm *c, ur_comm_stats *out);
UR_API void ur_comm_reset_stats(ur_comm *c);
/* NCCL, opened (not initialised: no GPU needed): its version (e.g. 22809) and the file. */
UR_API ur_status ur_nccl_version(int32_t *version, char *path /* or NULL */, size_t len);
/* The MPI plugin, opened: the MPI library's version line and the plugin's file.  Opening it
 * does not start MPI. */
UR_API ur_status ur_mpi_version(char *version, size_t len, char *path /* or NULL */,
                                size_t len2);
/* For a program about to exit with `code`: a failure while MPI is in use aborts the job
 * (MPI_Abort), so that no rank waits for this one forever; 0 finalizes MPI. */
UR_API void ur_comm_exit(int32_t code);

/* ==== 10. serve: quantized rows and collections, exported model files, the serving API ==== */
/* Rows in a serving format (engine/src/embedding/qtbe.c), dequantized on the fly in f32.
 * f32 and f16 rows are stored as they are ([rows, dim] of that dtype).  int8, int4 and int2
 * rows are row-wise quantized (u8 [rows, row bytes]): each row is a 4-byte header, an f16 scale
 * then an f16 bias (little-endian), then dim codes of 8, 4 or 2 bits packed from the low bits of
 * each byte up (element c of an int4 row is in byte 4 + c/2, the low nibble for even c), the row
 * padded to a multiple of 4 bytes; element c is code * scale + bias, computed in f32.  Quantizing
 * takes bias = the row's minimum rounded down to f16 and scale = (maximum - bias) / (2^bits - 1)
 * rounded up to f16, so no code clamps and every element is within scale / 2 of its value (plus
 * f32 rounding: the bound is scale / 2 + 2^-22 max |x| of the row); f16 rows are within 2^-11 |x|
 * (2^-25 below 2^-14).  These run on the CPU, over host, pinned or managed memory. */
typedef enum ur_qformat {
  UR_QFORMAT_F32 = 0, UR_QFORMAT_F16, UR_QFORMAT_INT8, UR_QFORMAT_INT4, UR_QFORMAT_INT2,
  UR_QFORMAT_COUNT
} ur_qformat;
/* What quantizing cost, over the elements given. */
typedef struct ur_qerror {
  double max_abs;          /* the largest |x - dequantized x| */
  double sum_sq;           /* sum of (x - dequantized x)^2 */
  double ref_sum_sq;       /* sum of x^2 */
  double max_ratio;        /* the largest |x - dequantized x| / the bound above (<= 1) */
  int64_t count;           /* elements */
} ur_qerror;
UR_API size_t ur_sizeof_qerror(void);
UR_API const char *ur_qformat_name(ur_qformat f);   /* "f32", "fp16", "int8", "int4", "int2" */
UR_API ur_status ur_qformat_parse(const char *s, ur_qformat *out); /* also "f16" */
/* Bytes of one stored row of dim elements (dim a multiple of 4, 4..1024), or -1. */
UR_API int64_t ur_qformat_row_bytes(ur_qformat f, int32_t dim);
/* src [rows, dim] f32, f16 or bf16 into dst in format f (u8 [rows, row bytes], or f16 / f32
 * [rows, dim]); err (may be NULL) receives the error.  A non-finite value or a row beyond f16's
 * range is an error naming the row. */
UR_API ur_status ur_rows_quantize(const ur_tensor *src, ur_tensor *dst /* out */,
                                  ur_qerror *err /* out, or NULL */, ur_qformat f);
/* The reverse: src in format f into dst f32 [rows, dim]. */
UR_API ur_status ur_rows_dequantize(const ur_tensor *src, ur_tensor *dst /* out */, ur_qformat f);

/* Quantized embedding collections: an inference-only ur_tbe.  Each table's rows are in one
 * format and one placement (device, managed, or host: pinned when a GPU runs the collection, so
 * the GPU reads it in place); each maps the ids of its features before the bounds check: an id
 * is taken modulo the table's `modulo` when that is > 0 (the hashing of raw ids), then through
 * the row permutation when one is set (row id r is stored at row perm[r]).  Forward pools bags
 * (sum or mean) into [batch, out_dim], or, pooling none, gives one row per value [n, dim]; it
 * is safe from several threads at once, each with its own stream and output; the other calls
 * are not (set up the collection first). */
struct ur_qtbe;
typedef struct ur_qtbe ur_qtbe;
typedef struct ur_qtbe_table_config {
  const char *name;
  int64_t rows;
  int32_t dim;             /* a multiple of 4, 4..1024 */
  ur_qformat format;
  ur_pooling pooling;      /* all tables pool (sum or mean), or none does */
  ur_place place;          /* device, managed or host */
  int64_t modulo;          /* > 0: ids are taken modulo this first; 0: as they come */
} ur_qtbe_table_config;
typedef struct ur_qtbe_config {
  int32_t device;          /* the GPU that runs the collection, or -1: the CPU */
  ur_tbe_bounds bounds;    /* fatal: a bad id fails the call; warn: skipped and counted */
  ur_dtype out_dtype;      /* f32 or bf16 */
} ur_qtbe_config;
UR_API size_t ur_sizeof_qtbe_table_config(void);
UR_API size_t ur_sizeof_qtbe_config(void);
/* Rows start as zeros; fill them through ur_qtbe_table's views. */
UR_API ur_status ur_qtbe_new(ur_qtbe **out, const ur_qtbe_config *config, int32_t num_tables,
                             const ur_qtbe_table_config *tables, int32_t num_features,
                             const int32_t *feature_table,
                             const char *const *feature_names /* or NULL: f0, f1, ... */);
UR_API void ur_qtbe_free(ur_qtbe *q);
UR_API int32_t ur_qtbe_num_tables(const ur_qtbe *q);
UR_API int32_t ur_qtbe_num_features(const ur_qtbe *q);
UR_API int32_t ur_qtbe_device(const ur_qtbe *q);
/* The dtype of the output from now on: f32 or bf16 (not while a forward runs on q). */
UR_API ur_status ur_qtbe_set_out_dtype(ur_qtbe *q, ur_dtype dtype);
UR_API int64_t ur_qtbe_out_dim(const ur_qtbe *q);
UR_API int64_t ur_qtbe_feature_col(const ur_qtbe *q, int32_t feature);
UR_API const char *ur_qtbe_table_name(const ur_qtbe *q, int32_t table);
UR_API const char *ur_qtbe_feature_name(const ur_qtbe *q, int32_t feature);
UR_API int32_t ur_qtbe_feature_table(const ur_qtbe *q, int32_t feature);
UR_API uint64_t ur_qtbe_bytes(const ur_qtbe *q);    /* of the rows, over every table */
/* Table t's rows as a view in its format's shape (as ur_rows_quantize writes them): copy into
 * it (ur_tensor_copy, ur_safetensors_load), or advise and prefetch it when managed. */
UR_API ur_status ur_qtbe_table(const ur_qtbe *q, int32_t table, ur_tensor **out);
/* perm i64 [rows] (any placement; copied and checked to be a permutation), or NULL: none. */
UR_API ur_status ur_qtbe_set_permutation(ur_qtbe *q, int32_t table,
                                         const ur_tensor *perm /* or NULL */);
/* values i64 [n], offsets i64 [bags + 1] (key-major, bags = batch * num_features), weights
 * f32 [n] or NULL, in memory the collection's backend reads; out as above, of out_dtype.  A bad
 * id under fatal names the table, feature, sample and id (after mapping); the call waits for
 * the GPU unless bounds are off. */
UR_API ur_status ur_qtbe_forward(ur_stream *s, ur_qtbe *q, const ur_tensor *values,
                                 const ur_tensor *offsets, const ur_tensor *weights /* or NULL */,
                                 ur_tensor *out /* out */);
/* Ids skipped under warn since the collection was made. */
UR_API int64_t ur_qtbe_skipped(const ur_qtbe *q);

/* Exported models (engine/src/serve/model.c): one safetensors file that `uvmrec export` writes
 * from a training checkpoint (docs/serving.md): metadata uvmrec.format = "model" and
 * uvmrec.model (the description: DLRM with the dot or DCNv2 interaction, its layers, tables,
 * features and id mappings, the input transform, where the held-out samples were), the dense
 * weights (f32 or bf16) and the tables in their formats.  Opening checks the whole file against
 * its description before anything is placed; any other file, or another architecture, is
 * refused with the file and the reason.  Predicting is safe from many threads at once: each
 * call takes a context (its own stream and buffers) from the model's pool, making one when none
 * is free, up to max_callers; a bad request fails that call only.  ur_model_info and the other
 * readers may run beside predictions; ur_model_close may not: close after every call returned. */
/* The version of the description (its key "version") that `uvmrec export` writes and this
 * engine serves; a file of another is refused. */
enum { UR_MODEL_VERSION = 1 };
struct ur_model;
typedef struct ur_model ur_model;
typedef struct ur_model_options {
  int32_t device;          /* the GPU that serves, or -1: the CPU */
  int32_t table_place;     /* ur_place of the tables (device, managed, host); -1: device on a
                              GPU, host on the CPU */
  int32_t bounds;          /* ur_tbe_bounds for the ids after their mapping */
  int32_t max_callers;     /* contexts at most (callers beyond wait); 0: no limit */
  double hot_fraction;     /* managed tables: the leading share of each table's rows (the
                              hottest first where the file's layout sorts them) preferred on the
                              GPU and prefetched there, the rest preferred on the host and read
                              in place (the hot_prefix policy's split); < 0: no hints */
} ur_model_options;
/* What a model is and what it did. */
typedef struct ur_model_props {
  char interaction[8];     /* "dot" or "dcnv2" */
  char input[16];          /* the transform its training data had: "criteo" or "synthetic" */
  int32_t num_dense, num_features, num_tables, dim;
  int32_t device, table_place, dense_dtype;
  int32_t contexts;        /* made so far */
  int64_t rows;            /* over every table */
  uint64_t table_bytes, dense_bytes, file_bytes;
  int64_t calls, failed, samples;
} ur_model_props;
UR_API size_t ur_sizeof_model_options(void);
UR_API size_t ur_sizeof_model_props(void);
/* Defaults: the current GPU when one is in use (else -1), tables where it runs, bounds fatal,
 * no caller limit, hot_fraction 0.2. */
UR_API void ur_model_options_init(ur_model_options *opts);
/* opts NULL: the defaults. */
UR_API ur_status ur_model_open(ur_model **out, const char *path,
                               const ur_model_options *opts /* or NULL */);
UR_API void ur_model_close(ur_model *m);
UR_API ur_status ur_model_info(const ur_model *m, ur_model_props *out);
/* A feature's name and its table's modulo (0: none); for a feature out of range NULL and -1,
 * the message naming it. */
UR_API const char *ur_model_feature_name(const ur_model *m, int32_t feature);
UR_API int64_t ur_model_table_modulo(const ur_model *m, int32_t feature);
/* A metadata value of the file (uvmrec.model, uvmrec.config, ...), or NULL. */
UR_API const char *ur_model_meta(const ur_model *m, const char *key);
/* The model's tables, for a look at their rows or hints of your own. */
UR_API ur_qtbe *ur_model_tables(const ur_model *m);
/* Probabilities of a batch: dense f32 [B, num_dense], sparse a KJT of the model's features (in
 * its order, or in any order by name) with stride B, raw ids (the model maps them), any
 * placement; scores f32 of B elements, any placement, written when the call returns.  The KJT
 * carries per-id weights exactly when some table was trained with them (the description's
 * tables[i].weighted), 1 for the ids of the others (checked where the KJT is in host memory);
 * otherwise the call is refused naming a table, as weights scale the rows a bag sums.  A KJT
 * not known checked (ur_kjt_checked) is checked first as ur_kjt_validate checks it (for a device
 * KJT a wait for the device), and a bad one refused naming the key and sample before anything
 * reads through its offsets; a KJT known checked is read as it is. */
UR_API ur_status ur_model_predict(ur_model *m, const ur_tensor *dense, const ur_kjt *sparse,
                                  ur_tensor *scores /* out */);
/* UR_CDEF_END */

#ifdef __cplusplus
}
#endif
#endif
