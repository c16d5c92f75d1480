/* core.h: internals shared by the engine's C files (ur__ names, never in the public header). */
#ifndef UR_CORE_H
#define UR_CORE_H

#include <pthread.h>
#include <stdarg.h>
#include "core/backend.h"
#include "core/half.h" /* f32 to and from f16 and bf16 */
#include "uvmrec.h"

#define UR__HIDDEN __attribute__((visibility("hidden")))

/* Built with the address sanitizer (make SAN=1; gcc says so by __SANITIZE_ADDRESS__, clang by
 * __has_feature): host storage is allocated to the byte and the slack the engine keeps past a
 * tensor's bytes is poisoned (ur__tensor_poison), so a read past a tensor's end is reported. */
#if defined(__SANITIZE_ADDRESS__)
#define UR__ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UR__ASAN 1
#endif
#endif

/* Files are read and written in place as little-endian: safetensors' data (checkpoints, model
 * files), npy arrays, the quantized rows' f16 scale and bias (qtbe_plan.h).  A big-endian host
 * would misread every one without a word, so the engine does not build there. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "uvmrec needs a little-endian host: it reads its files (safetensors, npy) in place as little-endian"
#endif

/* Errors: sets the thread-local message and returns status. */
UR__HIDDEN ur_status ur__error(ur_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
UR__HIDDEN ur_status ur__errorv(ur_status status, const char *fmt, va_list ap);
/* The same, then ": " and the message of the call that failed before it. */
UR__HIDDEN ur_status ur__error_cause(ur_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Host memory refused while reading a file: "<who><path>: out of host memory for <what> (N
 * bytes)", who "safetensors: " or "model file ", what by fmt, so the message names the file, what
 * it could not have and its bytes. */
UR__HIDDEN ur_status ur__no_memory(const char *who, const char *path, uint64_t bytes, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Empties the message: for a call that recovered from a failure of its own (a fallback that
 * then succeeded), whose message would otherwise read as this call's error. */
UR__HIDDEN void ur__error_clear(void);
UR__HIDDEN void ur__format_bytes(uint64_t bytes, char *buf, size_t len);
/* A count's noun ending: "%lld sample%s", n, ur__s(n) reads "1 sample", "0 samples", "2 samples"
 * (Lua's lib.things says the same). */
static inline const char *ur__s(long long n) { return n == 1 ? "" : "s"; }

/* NULL arguments of the C API, checked before anything else is read: UR__ARGS(t, out) returns
 * UR_STATUS_INVALID with "<function>: argument '<name>' is NULL" for the first NULL one.  A
 * pointer needed only in some cases is checked where it is needed:
 *   if (n > 0 && !names) return ur__null(__func__, "names");
 * spec/capi_null_spec.lua calls every function of uvmrec.h with NULLs to hold this. */
UR__HIDDEN ur_status ur__null(const char *fn, const char *arg);
UR__HIDDEN ur_status ur__null_args(const char *fn, const char *names, const void *const *ptrs, int n);
#define UR__ARGS(...) UR__ARGS_OR(UR_STATUS_INVALID, __VA_ARGS__)
/* The same for a function returning a value: it sets the message and returns none (NULL, -1,
 * 0 or an enum's _COUNT: uvmrec.h's opening comment says which). */
#define UR__ARGS_OR(none, ...)                                                         \
  do {                                                                                 \
    const void *const ur__ptrs_[] = {__VA_ARGS__};                                     \
    enum { ur__n_ = (int)(sizeof ur__ptrs_ / sizeof *ur__ptrs_) };                     \
    for (int ur__i_ = 0; ur__i_ < ur__n_; ur__i_++) /* inline: accessors are hot */    \
      if (!ur__ptrs_[ur__i_]) {                                                        \
        ur__null_args(__func__, #__VA_ARGS__, ur__ptrs_, ur__n_);                      \
        return none;                                                                   \
      }                                                                                \
  } while (0)

/* The index of s among names[0..n), or -1: the parse half of a name table
 * (engine/src/core/names.c). */
UR__HIDDEN int ur__name_index(const char *const *names, int n, const char *s);

/* A name and where it stands (its index), for finding names by sorting them (qsort with
 * ur__named_cmp: by name, then by place) rather than comparing each with every other: a KJT's
 * keys, a collection's tables and features (names.c). */
typedef struct ur__named {
  const char *name;
  int32_t at;
} ur__named;
UR__HIDDEN int ur__named_cmp(const void *a, const void *b);
/* Two equal names among the n (NULL ones skipped), found by sorting: their places *a < *b (the
 * first such pair in name order), or -1, -1 where all differ; who names the caller in an OOM
 * message. */
UR__HIDDEN ur_status ur__names_repeat(const char *const *names, int32_t n, const char *who, int32_t *a,
                                      int32_t *b);

/* Files written atomically (a temporary name renamed over the final one) need the folder
 * synced for the rename to last: fsyncs the folder holding path.  what prefixes the error
 * ("safetensors", "npy"); io/os.c. */
UR__HIDDEN ur_status ur__sync_dir(const char *path, const char *what);

/* Checks optimizer settings (optim.c) for dense parameters (tables 0) or embedding tables (1);
 * `who` opens the message. */
UR__HIDDEN ur_status ur__optim_check(const char *who, const ur_optim_config *c, int tables);

/* A hint's location (hints.c): -1 (cpu), a GPU this machine has (any GPU number on a machine
 * without one: the CPU backend records hints), or UR_LOC_CURRENT_GPU: gpu when >= 0, else the
 * current GPU (0 without one).  `what` opens the message; `current` names -2 in it. */
UR__HIDDEN ur_status ur__hint_location(int32_t loc, int32_t gpu, const char *what,
                                       const char *current, int32_t *out);

/* What the core lends a backend or plugin: its error setter and the interrupt flag. */
UR__HIDDEN extern const ur_core_api ur__core_api;
/* Opens the shared library `name` as the CUDA backend and the MPI plugin are found: the file
 * the environment variable env_var names (when set, nothing else), else beside the binary
 * holding this code and in ../lib beside it, else through the loader's search path.  path gets
 * the file last tried (the one opened, on success); tried lists every file tried, each with the
 * loader's reason, for the caller's message.  dlopen's flags (RTLD_NOW | RTLD_LOCAL ...). */
UR__HIDDEN void *ur__dlopen_beside(const char *name, const char *env_var, int flags, char *path,
                                   size_t path_len, char *tried, size_t tried_len);

/* Backends: the CPU one always; the CUDA one when it loaded and sees a GPU (else NULL). */
UR__HIDDEN const ur_backend *ur__cpu(void);
UR__HIDDEN const ur_backend *ur__gpu(void);

/* The one dispatch rule.  An object (a KJT, an embedding collection, a cache, metrics; for the
 * dense ops, a tensor) takes its backend once, when it is made or placed, from its memory's
 * placement: the GPU's for device and managed memory when a GPU is in use, else the CPU's
 * (host and pinned memory, and everything without a GPU).  Code below never asks again. */
UR__HIDDEN const ur_backend *ur__backend_for(ur_place place);
UR__HIDDEN const ur_backend *ur__tensor_backend(const ur_tensor *t);

/* Before backend b works on t's memory: the CPU's waits for the GPU, which may still be
 * writing pinned or managed memory; a GPU orders its own work on its streams. */
UR__HIDDEN ur_status ur__tensor_ready(const ur_backend *b, const ur_tensor *t);
/* Backend b's kernels run on the current device, and the runtime's current device is per
 * thread: enter makes device current (device < 0, or a backend without devices: nothing),
 * leave restores *prev and returns st, or its own failure. */
UR__HIDDEN ur_status ur__device_enter(const ur_backend *b, int32_t device, int32_t *prev);
UR__HIDDEN ur_status ur__device_leave(const ur_backend *b, int32_t device, int32_t prev,
                                      ur_status st);

/* The CPU backend's non-finite check and step end (nonfinite.c; backend.h says what). */
UR__HIDDEN ur_status ur__cpu_nonfinite_check(void *stream, int32_t n, const void *const *xs,
                                             const ur_dtype *dtypes, const int64_t *counts,
                                             int32_t *flags, int32_t slot0);
UR__HIDDEN ur_status ur__cpu_nonfinite_end(void *stream, int32_t *flags, int32_t sticky);
/* The first NaN or infinity of n elements of a float dtype (f32, bf16, f16, f64), or n. */
UR__HIDDEN int64_t ur__nonfinite_first(const void *x, ur_dtype dtype, int64_t n);
/* "<family> <op> is not available on <backend>" (UR_STATUS_UNSUPPORTED). */
UR__HIDDEN ur_status ur__missing(const ur_backend *b, const char *family, const char *op);
/* OK when backend b has op in family's table, else ur__missing's error:
 *   if ((st = UR__NEED(b, tbe, forward))) return st;  st = b->tbe->forward(...); */
#define UR__NEED(b, family, op) \
  ((b)->family && (b)->family->op ? UR_STATUS_OK : ur__missing((b), #family, #op))

/* One lock for accounting, the hint log and hint records; held only briefly. */
UR__HIDDEN extern pthread_mutex_t ur__lock;

/* Accounting of placed bytes (call with ur__lock held). */
UR__HIDDEN ur_status ur__hbm_reserve(uint64_t bytes, const char *what);
UR__HIDDEN void ur__hbm_release(uint64_t bytes);
/* The same for a backend's working memory (ur_core_api's workspace_take / _give): they take
 * ur__lock themselves, and count the bytes in ur_memory_stats' workspace too. */
UR__HIDDEN ur_status ur__workspace_take(uint64_t bytes, const char *what);
UR__HIDDEN void ur__workspace_give(uint64_t bytes);
UR__HIDDEN void ur__place_add(ur_place place, uint64_t bytes);
UR__HIDDEN void ur__place_sub(ur_place place, uint64_t bytes);
UR__HIDDEN void ur__managed_gpu_add(int64_t delta);

/* Hint attributes of a byte segment of managed storage, as the engine recorded them. */
typedef struct ur__seg {
  uint64_t begin, end;
  int32_t preferred, prefetched;  /* UR_LOC_NONE, UR_LOC_CPU or a GPU */
  int32_t read_mostly, accessed_by_cpu;
  uint64_t accessed_by_gpus;
} ur__seg;

typedef struct ur__segmap {
  ur__seg *v;
  size_t n, cap;
} ur__segmap;

typedef struct ur__storage {
  void *data;
  uint64_t bytes;       /* as asked */
  uint64_t alloc_bytes; /* as allocated (managed storage is rounded to whole pages) */
  ur_place place;
  int32_t device;
  uint64_t id;
  int refs;             /* atomic */
  ur__segmap hints;     /* managed only */
  uint64_t on_gpu;      /* managed bytes counted against the HBM budget */
  void (*release)(void *ctx); /* memory the engine did not allocate: called instead of free */
  void *release_ctx;
} ur__storage;

struct ur_tensor {
  ur__storage *st;
  ur_dtype dtype;
  int32_t ndim;
  int64_t shape[UR_MAX_DIMS];
  int64_t offset;       /* first element in the storage */
  int64_t numel;
};

/* Whether a graph capture (ur_graph_begin) is under way: calls that would decide on the host
 * what a replay cannot decide again refuse or take their plain path. */
UR__HIDDEN int ur__graph_capturing(void);

struct ur_stream {
  void *handle;         /* the backend's stream (NULL on the CPU backend) */
  int32_t priority;
};

struct ur_event {
  void *handle;         /* the backend's event; the CPU keeps a time */
  double cpu_ms;
  int recorded;
};

/* A host tensor over memory the engine did not allocate (a file mapping): release(ctx) runs
 * when the last handle sharing it is freed.  Not counted in ur_memory_get's bytes.  On failure the
 * caller keeps its reference (release is not called). */
/* t (zeroed, its storage attached) takes its dtype and shape (numel elements, checked by
 * ur__shape_bytes); returns t.  The one place a new tensor is shaped: ur_tensor_new,
 * ur__tensor_wrap, the dense arena. */
UR__HIDDEN ur_tensor *ur__tensor_shaped(ur_tensor *t, ur_dtype dtype, int32_t ndim,
                                        const int64_t *shape, uint64_t numel);
UR__HIDDEN ur_status ur__tensor_wrap(ur_tensor **out, ur_dtype dtype, int32_t ndim,
                                     const int64_t *shape, void *data,
                                     void (*release)(void *ctx), void *ctx);

/* A storage's record of the hints in force, made with the storage (tensor.c) and kept by
 * hints.c. */
UR__HIDDEN ur_status ur__segmap_init(ur__segmap *m, uint64_t bytes);
UR__HIDDEN void ur__segmap_free(ur__segmap *m);
/* Bytes of t's elements [first, first + numel) that a GPU holds or is asked to hold (preferred
 * there or prefetched there, as the record says), counted from the first without a break: the
 * leading run a managed table's hints keep on the GPU.  0 for memory that is not managed. */
UR__HIDDEN uint64_t ur__hint_gpu_run(const ur_tensor *t, int64_t first, int64_t numel);

/* Under the address sanitizer (UR__ASAN): bytes [begin, end) of t's storage, counted from t's
 * first element and cut at the storage's end, made unreadable (poison 1) or readable again
 * (poison 0), for slack the engine keeps past what a tensor holds (an arena's padding and free
 * bytes, a reused buffer's tail).  Only host memory of the CPU backend's allocations, which
 * ASan's allocator repaints when it frees and reuses them; elsewhere and in other builds,
 * nothing. */
UR__HIDDEN void ur__tensor_poison(const ur_tensor *t, uint64_t begin, uint64_t end, int poison);

/* The CPU backends' workspaces: the next piece of one carved from base (NULL: only measuring),
 * its bytes rounded up to 64; *at counts the bytes carved so far. */
static inline void *ur__carve(char *base, size_t *at, size_t bytes) {
  void *p = base ? base + *at : NULL;
  *at += (bytes + 63) / 64 * 64;
  return p;
}

/* A tensor shape's checks (a dtype, 1 to UR_MAX_DIMS dimensions, none negative, the dimensions
 * but zeros at most 2^UR_TENSOR_MAX_BYTES_LOG2 bytes: a 0 lets no other be anything; who starts
 * the messages) and its element and byte counts (engine/src/core/tensor.c).  Tensors, views, the
 * dense arena and safetensors files are bounded by it alike. */
UR__HIDDEN ur_status ur__shape_bytes(const char *who, ur_dtype dtype, int32_t ndim,
                                     const int64_t *shape, uint64_t *numel, uint64_t *bytes);
/* "[d0, d1, ...]" into buf (len bytes, cut short where it does not fit). */
UR__HIDDEN void ur__shape_text(int32_t ndim, const int64_t *shape, char *buf, size_t len);

/* A parallel loop: fn(ctx, begin, end) over [0, n) in chunks of at least grain
 * (engine/src/core/parallel.c). */
typedef void (*ur__range_fn)(void *ctx, size_t begin, size_t end);
UR__HIDDEN void ur__parallel_for(size_t n, size_t grain, ur__range_fn fn, void *ctx);
UR__HIDDEN int ur__threads(void);
/* *p becomes v if v is less, atomically: how a parallel loop's ranges keep the first bad index. */
UR__HIDDEN void ur__atomic_min(int64_t *p, int64_t v);

/* Sorts n keys by their low `bits` bits, each with its value when v is not NULL (LSD radix
 * sort, stable: equal keys keep their order), with *tk and *tv as scratch of n entries; after,
 * *k and *v point at whichever arrays hold the result, *tk and *tv at the others
 * (engine/src/core/sort.c). */
UR__HIDDEN void ur__radix_sort(uint64_t **k, int64_t **v, uint64_t **tk, int64_t **tv, int64_t n,
                               int bits);
/* The bits that hold every key from 0 to max (1 to 63): what a radix sort of such keys is
 * given, here or by cub on the GPU (engine/src/core/sort.c). */
UR__HIDDEN int ur__key_bits(uint64_t max);

/* Numbers (engine/src/core/convert.c). */
UR__HIDDEN double ur__load(const void *base, ur_dtype d, size_t i);
/* n elements of dtype d from src as floats: src itself for f32, else each converted into buf
 * (n floats; halves exactly, the other dtypes as ur__load gives them, rounded to float). */
UR__HIDDEN const float *ur__load_f32(const void *src, ur_dtype d, size_t n, float *buf);
UR__HIDDEN void ur__store(void *base, ur_dtype d, size_t i, double v);
/* n floats into dst as dtype d (ur__load_f32's inverse; halves rounded to nearest even). */
UR__HIDDEN void ur__store_f32(void *dst, ur_dtype d, size_t n, const float *src);
UR__HIDDEN uint64_t ur__bits_of(ur_dtype d, double v);

#endif
