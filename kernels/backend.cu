/* backend.cu: the CUDA backend, the ur_backend table of backend.h on the CUDA runtime API.
 * It is built into libuvmrec_cuda.so, which the core loads at run time and which exports
 * only ur_cuda_backend_init; CUPTI, needed by the migration monitor alone, is opened with
 * dlopen when the monitor starts, so the library loads on hosts without it. */
#include <atomic>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#if __has_include(<cupti_activity.h>)
#include <cupti_activity.h>
#define UR_HAVE_CUPTI 1
#else
#define UR_HAVE_CUPTI 0
#endif

#include "common.cuh"
#include "tensor.cuh"

/* Every managed page may end up on the GPU, and oversubscribing managed memory can hang our
 * shared GPU (BENCH.md).  So managed allocations stay below the GPU's free memory less this
 * margin (the larger of the two), which leaves room for CUDA contexts, library workspaces
 * and other processes' growth. */
#define UR_CUDA_MANAGED_MARGIN_MIN (1ull << 30)
#define UR_CUDA_MANAGED_MARGIN_DIV 32

/* range_attrs samples at most this many pages to tell "no location" from "mixed". */
#define UR_CUDA_RANGE_SAMPLES 64

/* Never equal, in practice, to the sum the probe computes; see ur__cuda_probe. */
#define UR_CUDA_PROBE_MAGIC 0x9E3779B97F4A7C15ull

const ur_core_api *ur__cuda_core;
static ur_backend g_backend;
static int g_device_count;
static char g_archs[128];

static const char *ur_cuda_loc_name(int32_t loc, char *buf, size_t len) {
  if (loc == UR_LOC_CPU) snprintf(buf, len, "cpu");
  else snprintf(buf, len, "cuda:%d", (int)loc);
  return buf;
}

/* ---- devices ---- */

static ur_status ur_cuda_device_check(int32_t device, const char *what) {
  if (device >= 0 && device < g_device_count) return UR_STATUS_OK;
  return ur__cuda_core->set_error(UR_STATUS_INVALID, "cuda: %s: device %d is not a GPU ordinal (0..%d)",
                           what, (int)device, g_device_count - 1);
}

/* The runtime's current device is per thread and the core relies on it, so calls that
 * need another device switch to it and back. */
static ur_status ur_cuda_device_enter(int32_t device, int *prev) {
  UR_CUDA_CHECK(cudaGetDevice(prev), "cudaGetDevice");
  if (*prev != device) UR_CUDA_CHECK(cudaSetDevice(device), "cudaSetDevice(%d)", (int)device);
  return UR_STATUS_OK;
}

static ur_status ur_cuda_device_leave(int32_t device, int prev) {
  if (prev != device) UR_CUDA_CHECK(cudaSetDevice(prev), "cudaSetDevice(%d)", prev);
  return UR_STATUS_OK;
}

static int ur_cuda_device_count(void) { return g_device_count; }

static ur_status ur_cuda_device_set(int32_t device) {
  ur_status st = ur_cuda_device_check(device, "device_set");
  if (st != UR_STATUS_OK) return st;
  UR_CUDA_CHECK(cudaSetDevice(device), "cudaSetDevice(%d)", (int)device);
  return UR_STATUS_OK;
}

static ur_status ur_cuda_device_get(int32_t *out) {
  int dev = 0;
  UR_CUDA_CHECK(cudaGetDevice(&dev), "cudaGetDevice");
  *out = dev;
  return UR_STATUS_OK;
}

/* Free and total memory, and the stream priorities, are queries of the current device. */
static ur_status ur_cuda_device_query(int32_t device, ur_device_props *out) {
  size_t free_b = 0, total_b = 0;
  int low = 0, high = 0;
  UR_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo on GPU %d", (int)device);
  UR_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&low, &high),
                "cudaDeviceGetStreamPriorityRange on GPU %d", (int)device);
  out->free_bytes = free_b;
  out->total_bytes = total_b;
  out->stream_priority_low = low;
  out->stream_priority_high = high;
  return UR_STATUS_OK;
}

static ur_status ur_cuda_device_props(int32_t device, ur_device_props *out) {
  ur_status st = ur_cuda_device_check(device, "device_props");
  if (st != UR_STATUS_OK) return st;
  cudaDeviceProp p;
  UR_CUDA_CHECK(cudaGetDeviceProperties(&p, device), "cudaGetDeviceProperties(%d)", (int)device);
  memset(out, 0, sizeof *out);
  memcpy(out->name, p.name, sizeof out->name - 1);
  out->ordinal = device;
  out->major = p.major;
  out->minor = p.minor;
  out->sm_count = p.multiProcessorCount;
  out->managed_memory = p.managedMemory;
  out->concurrent_managed_access = p.concurrentManagedAccess;
  out->pageable_memory_access = p.pageableMemoryAccess;
  out->l2_bytes = (uint64_t)p.l2CacheSize;
  int prev = 0;
  if ((st = ur_cuda_device_enter(device, &prev)) != UR_STATUS_OK) return st;
  st = ur_cuda_device_query(device, out);
  ur_status st2 = ur_cuda_device_leave(device, prev);
  return st != UR_STATUS_OK ? st : st2;
}

static ur_status ur_cuda_device_sync(void) {
  UR_CUDA_CHECK(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  return UR_STATUS_OK;
}

cudaError_t ur__cuda_sms(int *sms) {
  static std::atomic<int> cache[UR_MAX_GPUS + 1];
  int dev = 0;
  *sms = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  int cached = dev >= 0 && dev <= UR_MAX_GPUS;
  if (cached) *sms = cache[dev].load(std::memory_order_relaxed);
  if (*sms > 0) return cudaSuccess;
  e = cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, dev);
  if (e == cudaSuccess && cached) cache[dev].store(*sms, std::memory_order_relaxed);
  return e;
}

/* ---- memory ---- */

/* Live allocations with their sizes, since free() is not told sizes: managed ones (the
 * oversubscription check counts what is already allocated) and registered pinned ones (their
 * mapping's length).  Callers hold the list's lock. */
typedef struct ur_cuda_block {
  void *p;
  size_t bytes;
} ur_cuda_block;

typedef struct ur_cuda_blocks {
  ur_cuda_block *b;
  size_t n, cap;
} ur_cuda_blocks;

static int ur_cuda_blocks_add(ur_cuda_blocks *l, void *p, size_t bytes) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 64;
    ur_cuda_block *b = (ur_cuda_block *)realloc(l->b, cap * sizeof *b);
    if (!b) return -1;
    l->b = b;
    l->cap = cap;
  }
  l->b[l->n].p = p;
  l->b[l->n].bytes = bytes;
  l->n++;
  return 0;
}

/* Removes p; its bytes, or 0 when p is not in the list. */
static size_t ur_cuda_blocks_take(ur_cuda_blocks *l, void *p) {
  for (size_t i = 0; i < l->n; i++) {
    if (l->b[i].p != p) continue;
    size_t bytes = l->b[i].bytes;
    l->b[i] = l->b[--l->n];
    return bytes;
  }
  return 0;
}

static pthread_mutex_t g_managed_lock = PTHREAD_MUTEX_INITIALIZER;
static ur_cuda_blocks g_managed;
static uint64_t g_managed_bytes; /* includes reservations of allocations in progress */

static int ur_cuda_managed_track(void *p, size_t bytes) { return ur_cuda_blocks_add(&g_managed, p, bytes); }

static void ur_cuda_managed_untrack(void *p) { g_managed_bytes -= ur_cuda_blocks_take(&g_managed, p); }

/* Pinned host memory of at least UR_CUDA_PINNED_HUGE_MIN bytes is an anonymous mapping aligned
 * to 2 MiB, asked to be backed by transparent huge pages (madvise; the host's setting decides)
 * before it is touched, kept out of forked children (pinned pages must not turn copy-on-write
 * under the GPU), and registered (cudaHostRegister, mapped and portable).  On the H200 a cached
 * DCNv2's 89.5 GiB of tables were built in 32-39 s this way against 72 s from cudaHostAlloc;
 * the GPU's in-place reads run at the same speed either way (scripts/bench/zero_copy_probe.py).
 * Smaller requests, and any whose mapping or registration fails, come from cudaHostAlloc. */
#define UR_CUDA_PINNED_HUGE_MIN (64ull << 20)
#define UR_CUDA_HUGE_PAGE (2ull << 20)

static pthread_mutex_t g_pinned_lock = PTHREAD_MUTEX_INITIALIZER;
static ur_cuda_blocks g_pinned; /* the registered mappings: start, length */

/* Whether every GPU reads registered host memory at its host address (as cudaHostAlloc's
 * mapped memory is read: the engine passes host pointers to kernels). */
static int ur_cuda_host_pointers_registered(void) {
  static std::atomic<int> known(-1);
  int k = known.load();
  if (k >= 0) return k;
  k = g_device_count > 0;
  for (int d = 0; d < g_device_count && k; d++) {
    int v = 0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrCanUseHostPointerForRegisteredMem, d) != cudaSuccess) {
      (void)cudaGetLastError();
      v = 0;
    }
    k = v != 0;
  }
  known.store(k);
  return k;
}

/* A registered mapping of at least bytes, or NULL (nothing to clean up) when one cannot be had. */
static void *ur_cuda_pinned_map(size_t bytes) {
  if (!ur_cuda_host_pointers_registered()) return NULL;
  size_t len = (bytes + UR_CUDA_HUGE_PAGE - 1) & ~(UR_CUDA_HUGE_PAGE - 1);
  size_t span = len + UR_CUDA_HUGE_PAGE;
  char *raw = (char *)mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == (char *)MAP_FAILED) return NULL;
  char *p = (char *)(((uintptr_t)raw + UR_CUDA_HUGE_PAGE - 1) & ~(uintptr_t)(UR_CUDA_HUGE_PAGE - 1));
  if (p > raw) munmap(raw, (size_t)(p - raw));
  if (raw + span > p + len) munmap(p + len, (size_t)(raw + span - (p + len)));
#ifdef MADV_HUGEPAGE
  (void)madvise(p, len, MADV_HUGEPAGE); /* advice: without huge pages the mapping is still right */
#endif
  if (madvise(p, len, MADV_DONTFORK) != 0) {
    munmap(p, len);
    return NULL;
  }
  if (cudaHostRegister(p, len, cudaHostRegisterMapped | cudaHostRegisterPortable) != cudaSuccess) {
    (void)cudaGetLastError(); /* not sticky: the fallback's cudaHostAlloc reports its own */
    munmap(p, len);
    return NULL;
  }
  pthread_mutex_lock(&g_pinned_lock);
  int lost = ur_cuda_blocks_add(&g_pinned, p, len);
  pthread_mutex_unlock(&g_pinned_lock);
  if (lost) {
    ur__cuda_drop(cudaHostUnregister(p));
    munmap(p, len);
    return NULL;
  }
  return p;
}

/* Pages of managed memory are counted whether or not they are resident on the GPU yet (free
 * memory only drops when they arrive), so the check errs towards refusing: it may count a
 * resident page twice, but never lets the total pass what the GPU has free. */
static ur_status ur_cuda_alloc_managed(int32_t device, size_t bytes, void **out) {
  ur_status st;
  int dev = device;
  if (dev < 0) UR_CUDA_CHECK(cudaGetDevice(&dev), "cudaGetDevice");
  else if ((st = ur_cuda_device_check(device, "managed alloc")) != UR_STATUS_OK) return st;
  size_t free_b = 0, total_b = 0;
  int prev = 0;
  if ((st = ur_cuda_device_enter(dev, &prev)) != UR_STATUS_OK) return st;
  cudaError_t err = cudaMemGetInfo(&free_b, &total_b);
  if ((st = ur_cuda_device_leave(dev, prev)) != UR_STATUS_OK) return st;
  if (err != cudaSuccess) return ur__cuda_fail(err, "cudaMemGetInfo on GPU %d", dev);

  uint64_t margin = total_b / UR_CUDA_MANAGED_MARGIN_DIV;
  if (margin < UR_CUDA_MANAGED_MARGIN_MIN) margin = UR_CUDA_MANAGED_MARGIN_MIN;
  uint64_t avail = free_b > margin ? free_b - margin : 0;
  pthread_mutex_lock(&g_managed_lock);
  uint64_t live = g_managed_bytes;
  if (live > avail || bytes > avail - live) {
    pthread_mutex_unlock(&g_managed_lock);
    return ur__cuda_core->set_error(
        UR_STATUS_OOM,
        "cuda: refusing cudaMallocManaged of %zu bytes for GPU %d: with %llu managed bytes "
        "already allocated it would pass the GPU's %zu free bytes less a safety margin of "
        "%llu (oversubscribing managed memory can hang a shared GPU; emulate a larger table "
        "with the HBM budget)",
        bytes, dev, (unsigned long long)live, free_b, (unsigned long long)margin);
  }
  g_managed_bytes += bytes; /* reserved now, so that concurrent allocations see it */
  pthread_mutex_unlock(&g_managed_lock);

  err = cudaMallocManaged(out, bytes, cudaMemAttachGlobal);
  pthread_mutex_lock(&g_managed_lock);
  int lost = err == cudaSuccess && ur_cuda_managed_track(*out, bytes) != 0;
  if (err != cudaSuccess || lost) g_managed_bytes -= bytes;
  pthread_mutex_unlock(&g_managed_lock);
  if (err != cudaSuccess) {
    *out = NULL;
    return ur__cuda_fail(err, "cudaMallocManaged of %zu bytes for GPU %d", bytes, dev);
  }
  if (lost) {
    ur__cuda_drop(cudaFree(*out));
    *out = NULL;
    return ur__cuda_core->set_error(UR_STATUS_OOM, "cuda: out of host memory recording a managed "
                                            "allocation of %zu bytes", bytes);
  }
  return UR_STATUS_OK;
}

/* A zero-byte request gives NULL and succeeds; free() accepts NULL. */
static ur_status ur_cuda_alloc(ur_place place, int32_t device, size_t bytes, void **out) {
  ur_status st;
  *out = NULL;
  if (bytes == 0) return UR_STATUS_OK;
  switch (place) {
  case UR_PLACE_PINNED:
    if (bytes >= UR_CUDA_PINNED_HUGE_MIN && (*out = ur_cuda_pinned_map(bytes)) != NULL) return UR_STATUS_OK;
    /* Portable: usable from every device's context; mapped: readable in place by kernels. */
    UR_CUDA_CHECK(cudaHostAlloc(out, bytes, cudaHostAllocMapped | cudaHostAllocPortable),
                  "cudaHostAlloc of %zu bytes", bytes);
    return UR_STATUS_OK;
  case UR_PLACE_DEVICE: {
    if ((st = ur_cuda_device_check(device, "device alloc")) != UR_STATUS_OK) return st;
    int prev = 0;
    if ((st = ur_cuda_device_enter(device, &prev)) != UR_STATUS_OK) return st;
    cudaError_t err = cudaMalloc(out, bytes);
    st = ur_cuda_device_leave(device, prev);
    if (err != cudaSuccess) {
      *out = NULL;
      return ur__cuda_fail(err, "cudaMalloc of %zu bytes on GPU %d", bytes, (int)device);
    }
    if (st != UR_STATUS_OK) {
      ur__cuda_drop(cudaFree(*out));
      *out = NULL;
    }
    return st;
  }
  case UR_PLACE_MANAGED:
    return ur_cuda_alloc_managed(device, bytes, out);
  default:
    return ur__cuda_core->set_error(UR_STATUS_INVALID,
                             "cuda: alloc: placement %d is not pinned, device or managed",
                             (int)place);
  }
}

static void ur_cuda_free(ur_place place, void *p) {
  if (!p) return;
  switch (place) {
  case UR_PLACE_PINNED: {
    pthread_mutex_lock(&g_pinned_lock);
    size_t len = ur_cuda_blocks_take(&g_pinned, p);
    pthread_mutex_unlock(&g_pinned_lock);
    if (len) {
      /* as cudaFreeHost does: no kernel of any GPU still reads it */
      for (int d = 0; d < g_device_count; d++) {
        int prev = 0;
        if (ur_cuda_device_enter(d, &prev) != UR_STATUS_OK) continue;
        ur__cuda_drop(cudaDeviceSynchronize());
        (void)ur_cuda_device_leave(d, prev);
      }
      ur__cuda_drop(cudaHostUnregister(p));
      munmap(p, len);
    } else {
      ur__cuda_drop(cudaFreeHost(p));
    }
    break;
  }
  case UR_PLACE_MANAGED:
    pthread_mutex_lock(&g_managed_lock);
    ur_cuda_managed_untrack(p);
    pthread_mutex_unlock(&g_managed_lock);
    ur__cuda_drop(cudaFree(p));
    break;
  default:
    ur__cuda_drop(cudaFree(p));
    break;
  }
}

static ur_status ur_cuda_copy(void *stream, void *dst, const void *src, size_t bytes) {
  if (bytes == 0) return UR_STATUS_OK;
  /* With unified addressing cudaMemcpyDefault finds each end's kind, malloc memory too. */
  UR_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)stream),
                "cudaMemcpyAsync of %zu bytes from %p to %p", bytes, src, dst);
  return UR_STATUS_OK;
}

/* Each host thread's pinned page for small reads (UR_CUDA_READ_SMALL bytes), made by its first
 * read. A thread that ends gives its page to the spares, for the next thread's first read:
 * cudaFreeHost would wait for every GPU's work, each time a serving program's thread ends.
 * A page is idle between reads (each read waits for its stream), so any thread may take it. */
struct ur_read_page {
  unsigned char *host, *dev; /* the same page, as the host and the GPU address it */
  struct ur_read_page *next; /* among the spares */
};
static pthread_key_t g_read_key;
static pthread_once_t g_read_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_read_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ur_read_page *g_read_spares;
static void ur_read_page_give(void *p) {
  struct ur_read_page *pg = (struct ur_read_page *)p;
  pthread_mutex_lock(&g_read_lock);
  pg->next = g_read_spares;
  g_read_spares = pg;
  pthread_mutex_unlock(&g_read_lock);
}
static void ur_read_key_make(void) { (void)pthread_key_create(&g_read_key, ur_read_page_give); }

static ur_status ur_read_page_get(struct ur_read_page **out) {
  (void)pthread_once(&g_read_once, ur_read_key_make);
  struct ur_read_page *pg = (struct ur_read_page *)pthread_getspecific(g_read_key);
  if (pg) {
    *out = pg;
    return UR_STATUS_OK;
  }
  pthread_mutex_lock(&g_read_lock);
  if ((pg = g_read_spares)) g_read_spares = pg->next;
  pthread_mutex_unlock(&g_read_lock);
  if (!pg) {
    void *h = NULL, *d = NULL;
    UR_CUDA_CHECK(cudaHostAlloc(&h, UR_CUDA_READ_SMALL, cudaHostAllocPortable | cudaHostAllocMapped),
                  "read: cudaHostAlloc of its %d-byte pinned page", UR_CUDA_READ_SMALL);
    cudaError_t e = cudaHostGetDevicePointer(&d, h, 0);
    if (e == cudaSuccess && !(pg = (struct ur_read_page *)malloc(sizeof *pg)))
      e = cudaErrorMemoryAllocation;
    if (e != cudaSuccess) {
      free(pg);
      ur__cuda_drop(cudaFreeHost(h));
      UR_CUDA_CHECK(e, "read: its pinned page for this thread");
    }
    pg->host = (unsigned char *)h;
    pg->dev = (unsigned char *)d;
  }
  if (pthread_setspecific(g_read_key, pg) != 0) {
    ur_read_page_give(pg);
    return ur__cuda_core->set_error(UR_STATUS_OOM, "cuda: read: no room to keep this thread's pinned page");
  }
  *out = pg;
  return UR_STATUS_OK;
}

/* A small read of the current GPU's own memory, on a stream of that GPU (NULL: its default),
 * goes through a one-block kernel into the thread's pinned page; any other (bigger than the
 * page, managed memory, which a kernel would fault over, another GPU's) through the copy
 * engines. */
static ur_status ur_cuda_read(void *stream, void *out, const void *src, size_t bytes) {
  if (bytes == 0) return UR_STATUS_OK;
  cudaStream_t s = (cudaStream_t)stream;
  cudaPointerAttributes a;
  int dev = -1, sdev = -1;
  int small = bytes <= UR_CUDA_READ_SMALL && cudaGetDevice(&dev) == cudaSuccess &&
              cudaPointerGetAttributes(&a, src) == cudaSuccess &&
              a.type == cudaMemoryTypeDevice && a.device == dev &&
              (!s || (cudaStreamGetDevice(s, &sdev) == cudaSuccess && sdev == dev));
  (void)cudaGetLastError(); /* a failed query above is no error: the copy engines read it */
  struct ur_read_page *pg = NULL;
  if (small) {
    ur_status st = ur_read_page_get(&pg);
    if (st) return st;
    UR_CUDA_CHECK(ur__cuda_read_small(s, pg->dev, src, bytes),
                  "read: its kernel (%zu bytes from %p)", bytes, src);
  } else {
    UR_CUDA_CHECK(cudaMemcpyAsync(out, src, bytes, cudaMemcpyDefault, s),
                  "read: cudaMemcpyAsync of %zu bytes from %p to %p", bytes, src, out);
  }
  UR_CUDA_CHECK(cudaStreamSynchronize(s), "read: cudaStreamSynchronize after %zu bytes from %p",
                bytes, src);
  if (small) memcpy(out, pg->host, bytes);
  return UR_STATUS_OK;
}

static ur_status ur_cuda_fill(void *stream, void *dst, size_t n, size_t elem_bytes,
                              uint64_t value) {
  if (elem_bytes != 1 && elem_bytes != 2 && elem_bytes != 4 && elem_bytes != 8)
    return ur__cuda_core->set_error(UR_STATUS_INVALID,
                             "cuda: fill: element size %zu is not 1, 2, 4 or 8 bytes", elem_bytes);
  if ((uintptr_t)dst % elem_bytes != 0)
    return ur__cuda_core->set_error(UR_STATUS_INVALID,
                             "cuda: fill: destination %p is not aligned to its %zu-byte elements",
                             dst, elem_bytes);
  if (n > SIZE_MAX / elem_bytes)
    return ur__cuda_core->set_error(UR_STATUS_INVALID, "cuda: fill: %zu elements of %zu bytes overflow",
                             n, elem_bytes);
  if (n == 0) return UR_STATUS_OK;
  int same = 1;
  for (size_t i = 1; i < elem_bytes; i++)
    same &= ((value >> (8 * i)) & 0xFF) == (value & 0xFF);
  if (same) {
    /* One byte repeated: the driver's memset is as fast and needs no kernel. */
    UR_CUDA_CHECK(cudaMemsetAsync(dst, (int)(value & 0xFF), n * elem_bytes, (cudaStream_t)stream),
                  "cudaMemsetAsync of %zu bytes at %p", n * elem_bytes, dst);
    return UR_STATUS_OK;
  }
  UR_CUDA_CHECK(ur__cuda_fill((cudaStream_t)stream, dst, n, elem_bytes, value),
                "fill kernel (%zu elements of %zu bytes at %p)", n, elem_bytes, dst);
  return UR_STATUS_OK;
}

static ur_status ur_cuda_rand(void *stream, void *dst, ur_dtype dtype, size_t n, uint64_t first,
                              size_t cols, uint64_t pitch, ur_dist dist, double a, double b,
                              uint64_t seed) {
  if ((int)dtype < 0 || dtype >= UR_DTYPE_COUNT)
    return ur__cuda_core->set_error(UR_STATUS_INVALID, "cuda: rand: dtype %d is unknown", (int)dtype);
  if (dist != UR_DIST_UNIFORM && dist != UR_DIST_NORMAL)
    return ur__cuda_core->set_error(UR_STATUS_INVALID, "cuda: rand: distribution %d is unknown",
                             (int)dist);
  if (n == 0) return UR_STATUS_OK;
  UR_CUDA_CHECK(ur__cuda_rand((cudaStream_t)stream, dst, dtype, n, first, cols ? cols : 1, pitch,
                              dist, a, b, seed),
                "rand kernel (dtype %d, %zu elements at %p)", (int)dtype, n, dst);
  return UR_STATUS_OK;
}

static ur_status ur_cuda_nonfinite_check(void *stream, int32_t n, const void *const *xs,
                                         const ur_dtype *dtypes, const int64_t *counts,
                                         int32_t *flags, int32_t slot0) {
  UR_CUDA_CHECK(ur__cuda_nonfinite_check((cudaStream_t)stream, n, xs, dtypes, counts, flags,
                                         slot0),
                "nonfinite check kernel (%d tensors from slot %d)", (int)n, (int)slot0);
  return UR_STATUS_OK;
}

static ur_status ur_cuda_nonfinite_end(void *stream, int32_t *flags, int32_t sticky) {
  UR_CUDA_CHECK(ur__cuda_nonfinite_end((cudaStream_t)stream, flags, sticky),
                "nonfinite end-of-step kernel");
  return UR_STATUS_OK;
}

static ur_status ur_cuda_rand_rows(void *stream, void *dst, ur_dtype dtype, size_t row_elems,
                                   const int64_t *phys, const int64_t *ids, size_t n, double a,
                                   double b, uint64_t seed) {
  if (dtype != UR_DTYPE_F32 && dtype != UR_DTYPE_F16 && dtype != UR_DTYPE_BF16)
    return ur__cuda_core->set_error(UR_STATUS_INVALID, "cuda: rand_rows: dtype %d is not a float",
                                    (int)dtype);
  UR_CUDA_CHECK(ur__cuda_rand_rows((cudaStream_t)stream, dst, dtype, row_elems, phys, ids, n, a, b, seed),
                "rand_rows kernel (%zu rows of %zu elements at %p)", n, row_elems, dst);
  return UR_STATUS_OK;
}

static ur_status ur_cuda_zero_rows(void *stream, void *dst, size_t row_bytes, const int64_t *rows,
                                   size_t n) {
  UR_CUDA_CHECK(ur__cuda_zero_rows((cudaStream_t)stream, dst, row_bytes, rows, n),
                "zero_rows kernel (%zu rows of %zu bytes at %p)", n, row_bytes, dst);
  return UR_STATUS_OK;
}

/* ---- streams and events ---- */

static ur_status ur_cuda_stream_new(int32_t priority, void **out) {
  cudaStream_t s = NULL;
  /* Non-blocking: side streams must not wait for the legacy default stream.  The runtime
   * clamps priorities outside the device's range. */
  UR_CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, priority),
                "cudaStreamCreateWithPriority(priority %d)", (int)priority);
  *out = s;
  return UR_STATUS_OK;
}

static void ur_cuda_stream_free(void *s) {
  if (!s) return;
  ur__cuda_dense_stream_gone((cudaStream_t)s);
  ur__cuda_drop(cudaStreamDestroy((cudaStream_t)s));
}

static ur_status ur_cuda_stream_sync(void *s) {
  UR_CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)s), "cudaStreamSynchronize");
  return UR_STATUS_OK;
}

static ur_status ur_cuda_event_new(void **out) {
  cudaEvent_t e = NULL;
  UR_CUDA_CHECK(cudaEventCreate(&e), "cudaEventCreate");
  *out = e;
  return UR_STATUS_OK;
}

static void ur_cuda_event_free(void *e) {
  if (e) ur__cuda_drop(cudaEventDestroy((cudaEvent_t)e));
}

static ur_status ur_cuda_event_record(void *e, void *stream) {
  UR_CUDA_CHECK(cudaEventRecord((cudaEvent_t)e, (cudaStream_t)stream), "cudaEventRecord");
  return UR_STATUS_OK;
}

static ur_status ur_cuda_event_sync(void *e) {
  UR_CUDA_CHECK(cudaEventSynchronize((cudaEvent_t)e), "cudaEventSynchronize");
  return UR_STATUS_OK;
}

static ur_status ur_cuda_stream_wait(void *stream, void *event) {
  UR_CUDA_CHECK(cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)event, 0),
                "cudaStreamWaitEvent");
  return UR_STATUS_OK;
}

static ur_status ur_cuda_host_call(void *stream, void (*fn)(void *ctx), void *ctx) {
  UR_CUDA_CHECK(cudaLaunchHostFunc((cudaStream_t)stream, fn, ctx), "cudaLaunchHostFunc");
  return UR_STATUS_OK;
}

/* ---- graphs ---- */

/* Relaxed: the calls being captured may make calls that are unsafe during a capture (a
 * shared-memory limit raised, a device attribute read), which a global capture would refuse
 * from any thread; what waits or allocates still breaks the capture, as it must. */
static ur_status ur_cuda_graph_begin(void *stream) {
  UR_CUDA_CHECK(cudaStreamBeginCapture((cudaStream_t)stream, cudaStreamCaptureModeRelaxed),
                "cudaStreamBeginCapture");
  return UR_STATUS_OK;
}

static ur_status ur_cuda_graph_end(void *stream, void **exec) {
  cudaStream_t s = (cudaStream_t)stream;
  cudaGraph_t graph = NULL;
  UR_CUDA_CHECK(cudaStreamEndCapture(s, &graph),
                "cudaStreamEndCapture (a captured call waited, allocated or failed)");
  cudaGraphExec_t ex = (cudaGraphExec_t)*exec;
  cudaError_t e = cudaSuccess;
  if (ex) {
    /* the same kernels with new arguments update in place; a new shape needs a new graph */
    cudaGraphExecUpdateResultInfo info;
    if (cudaGraphExecUpdate(ex, graph, &info) != cudaSuccess) {
      (void)cudaGetLastError();
      cudaGraphExecDestroy(ex);
      ex = NULL;
    }
  }
  if (!ex) e = cudaGraphInstantiate(&ex, graph, 0);
  cudaGraphDestroy(graph);
  *exec = e == cudaSuccess ? ex : NULL;
  UR_CUDA_CHECK(e, "cudaGraphInstantiate");
  UR_CUDA_CHECK(cudaGraphLaunch(ex, s), "cudaGraphLaunch");
  return UR_STATUS_OK;
}

static ur_status ur_cuda_graph_launch(void *exec, void *stream) {
  UR_CUDA_CHECK(cudaGraphLaunch((cudaGraphExec_t)exec, (cudaStream_t)stream), "cudaGraphLaunch");
  return UR_STATUS_OK;
}

static void ur_cuda_graph_free(void *exec) {
  if (exec) ur__cuda_drop(cudaGraphExecDestroy((cudaGraphExec_t)exec));
}

static ur_status ur_cuda_event_elapsed(void *start, void *end, double *ms) {
  float f = 0.0f;
  UR_CUDA_CHECK(cudaEventElapsedTime(&f, (cudaEvent_t)start, (cudaEvent_t)end),
                "cudaEventElapsedTime");
  *ms = f;
  return UR_STATUS_OK;
}

/* ---- managed-memory hints ---- */

static ur_status ur_cuda_location(int32_t loc, const char *what, struct cudaMemLocation *out) {
  memset(out, 0, sizeof *out);
  if (loc == UR_LOC_CPU) {
    out->type = cudaMemLocationTypeHost; /* id ignored */
    return UR_STATUS_OK;
  }
  if (loc >= 0 && loc < g_device_count) {
    out->type = cudaMemLocationTypeDevice;
    out->id = loc;
    return UR_STATUS_OK;
  }
  return ur__cuda_core->set_error(UR_STATUS_INVALID,
                           "cuda: %s: location %d is neither the cpu (-1) nor a GPU ordinal "
                           "(0..%d)", what, (int)loc, g_device_count - 1);
}

static ur_status ur_cuda_advise(void *ptr, size_t bytes, ur_advice advice, int32_t location) {
  enum cudaMemoryAdvise ca;
  int uses_location = 1;
  const char *name;
  switch (advice) {
  case UR_ADVICE_PREFERRED_LOCATION:
    ca = cudaMemAdviseSetPreferredLocation; name = "cudaMemAdviseSetPreferredLocation"; break;
  case UR_ADVICE_UNSET_PREFERRED_LOCATION:
    ca = cudaMemAdviseUnsetPreferredLocation; name = "cudaMemAdviseUnsetPreferredLocation";
    uses_location = 0;
    break;
  case UR_ADVICE_ACCESSED_BY:
    ca = cudaMemAdviseSetAccessedBy; name = "cudaMemAdviseSetAccessedBy"; break;
  case UR_ADVICE_UNSET_ACCESSED_BY:
    ca = cudaMemAdviseUnsetAccessedBy; name = "cudaMemAdviseUnsetAccessedBy"; break;
  case UR_ADVICE_READ_MOSTLY:
    ca = cudaMemAdviseSetReadMostly; name = "cudaMemAdviseSetReadMostly"; uses_location = 0;
    break;
  case UR_ADVICE_UNSET_READ_MOSTLY:
    ca = cudaMemAdviseUnsetReadMostly; name = "cudaMemAdviseUnsetReadMostly"; uses_location = 0;
    break;
  default:
    return ur__cuda_core->set_error(UR_STATUS_INVALID, "cuda: advise: advice %d is unknown",
                             (int)advice);
  }
  if (bytes == 0) return UR_STATUS_OK;
  /* The driver ignores the location of these three; pass a valid one whatever was given. */
  struct cudaMemLocation loc;
  char lname[32];
  ur_status st = ur_cuda_location(uses_location ? location : UR_LOC_CPU, name, &loc);
  if (st != UR_STATUS_OK) return st;
  UR_CUDA_CHECK(cudaMemAdvise(ptr, bytes, ca, loc), "cudaMemAdvise(%s, %s) of %zu bytes at %p",
                name, uses_location ? ur_cuda_loc_name(location, lname, sizeof lname) : "-",
                bytes, ptr);
  return UR_STATUS_OK;
}

static ur_status ur_cuda_prefetch(void *stream, void *ptr, size_t bytes, int32_t location) {
  struct cudaMemLocation loc;
  char lname[32];
  ur_status st = ur_cuda_location(location, "prefetch", &loc);
  if (st != UR_STATUS_OK) return st;
  if (bytes == 0) return UR_STATUS_OK;
  UR_CUDA_CHECK(cudaMemPrefetchAsync(ptr, bytes, loc, 0, (cudaStream_t)stream),
                "cudaMemPrefetchAsync of %zu bytes at %p to %s", bytes, ptr,
                ur_cuda_loc_name(location, lname, sizeof lname));
  return UR_STATUS_OK;
}

/* What cudaMemRangeGetAttributes says of one range. */
typedef struct ur_cuda_range {
  enum cudaMemLocationType preferred_type, prefetch_type;
  int preferred_id, prefetch_id, read_mostly;
  int accessed_by[UR_MAX_GPUS + 1]; /* ids, padded with cudaInvalidDeviceId by the driver */
} ur_cuda_range;

/* The location-type/id attributes (CUDA 12.2+) rather than the older single-int ones, so a
 * host NUMA location reads as the cpu instead of as "no location". */
static cudaError_t ur_cuda_range_query(const void *ptr, size_t bytes, ur_cuda_range *q) {
  enum cudaMemRangeAttribute attrs[6] = {
      cudaMemRangeAttributePreferredLocationType, cudaMemRangeAttributePreferredLocationId,
      cudaMemRangeAttributeLastPrefetchLocationType, cudaMemRangeAttributeLastPrefetchLocationId,
      cudaMemRangeAttributeReadMostly, cudaMemRangeAttributeAccessedBy};
  void *data[6] = {&q->preferred_type, &q->preferred_id, &q->prefetch_type, &q->prefetch_id,
                   &q->read_mostly, q->accessed_by};
  size_t sizes[6] = {sizeof q->preferred_type, sizeof q->preferred_id, sizeof q->prefetch_type,
                     sizeof q->prefetch_id, sizeof q->read_mostly, sizeof q->accessed_by};
  memset(q, 0, sizeof *q);
  return cudaMemRangeGetAttributes(data, sizes, attrs, 6, ptr, bytes);
}

/* A GPU ordinal, UR_LOC_CPU, or UR_LOC_NONE where the driver names no single location. */
static int32_t ur_cuda_range_loc(enum cudaMemLocationType type, int id) {
  switch (type) {
  case cudaMemLocationTypeDevice: return id;
  case cudaMemLocationTypeHost:
  case cudaMemLocationTypeHostNuma:
  case cudaMemLocationTypeHostNumaCurrent: return UR_LOC_CPU;
  default: return UR_LOC_NONE;
  }
}

static int ur_cuda_range_cpu(const ur_cuda_range *q) {
  for (int i = 0; i <= UR_MAX_GPUS; i++)
    if (q->accessed_by[i] == cudaCpuDeviceId) return 1;
  return 0;
}

/* The driver answers for the whole range only when every page agrees: "no location"
 * (cudaMemLocationTypeInvalid) means either that no page has one or that pages differ, and
 * read-mostly 0 and a missing accessed-by likewise mean "not on every page".  Sampled pages
 * tell the cases apart: any sampled page that has the attribute makes the range mixed.  With
 * up to UR_CUDA_RANGE_SAMPLES pages every page is sampled and the answer is exact; beyond,
 * "none" means no sampled page had it.  GPU accessed-by bits keep the driver's meaning
 * (every page). */
static ur_status ur_cuda_range_attrs(const void *ptr, size_t bytes, ur_advised *out) {
  ur_cuda_range q;
  UR_CUDA_CHECK(ur_cuda_range_query(ptr, bytes, &q), "cudaMemRangeGetAttributes of %zu bytes at %p",
                bytes, ptr);
  int32_t preferred = ur_cuda_range_loc(q.preferred_type, q.preferred_id);
  int32_t prefetched = ur_cuda_range_loc(q.prefetch_type, q.prefetch_id);
  int read_mostly = q.read_mostly != 0, cpu = ur_cuda_range_cpu(&q);
  uint64_t gpus = 0;
  for (int i = 0; i <= UR_MAX_GPUS; i++)
    if (q.accessed_by[i] >= 0 && q.accessed_by[i] < 64) gpus |= 1ull << q.accessed_by[i];

  int seen_preferred = 0, seen_prefetched = 0, seen_read_mostly = 0, seen_cpu = 0;
  long page_l = sysconf(_SC_PAGESIZE);
  uintptr_t page = page_l > 0 ? (uintptr_t)page_l : 4096;
  uintptr_t begin = (uintptr_t)ptr & ~(page - 1);
  uintptr_t end = ((uintptr_t)ptr + bytes + page - 1) & ~(page - 1);
  uint64_t npages = (end - begin) / page;
  int ambiguous = preferred == UR_LOC_NONE || prefetched == UR_LOC_NONE || !read_mostly || !cpu;
  if (ambiguous && npages > 1) {
    uint64_t k = npages < UR_CUDA_RANGE_SAMPLES ? npages : UR_CUDA_RANGE_SAMPLES;
    for (uint64_t j = 0; j < k; j++) {
      uint64_t idx = j * (npages - 1) / (k - 1); /* first and last page always */
      const void *at = (const void *)(begin + idx * page);
      ur_cuda_range s;
      UR_CUDA_CHECK(ur_cuda_range_query(at, page, &s),
                    "cudaMemRangeGetAttributes of page %p", at);
      seen_preferred |= ur_cuda_range_loc(s.preferred_type, s.preferred_id) != UR_LOC_NONE;
      seen_prefetched |= ur_cuda_range_loc(s.prefetch_type, s.prefetch_id) != UR_LOC_NONE;
      seen_read_mostly |= s.read_mostly != 0;
      seen_cpu |= ur_cuda_range_cpu(&s);
    }
  }
  out->preferred_location =
      preferred != UR_LOC_NONE ? preferred : seen_preferred ? UR_LOC_MIXED : UR_LOC_NONE;
  out->last_prefetch_location =
      prefetched != UR_LOC_NONE ? prefetched : seen_prefetched ? UR_LOC_MIXED : UR_LOC_NONE;
  out->read_mostly = read_mostly ? 1 : seen_read_mostly ? -1 : 0;
  out->accessed_by_cpu = cpu ? 1 : seen_cpu ? -1 : 0;
  out->accessed_by_gpus = gpus;
  return UR_STATUS_OK;
}

static ur_status ur_cuda_probe_read(void *stream, const void *ptr, size_t bytes,
                                    double *seconds) {
  cudaStream_t s = (cudaStream_t)stream;
  cudaEvent_t start = NULL, end = NULL;
  float ms = 0.0f;
  cudaError_t err = cudaSuccess;
  const char *what = "";
  *seconds = 0.0;
  if (bytes == 0) return UR_STATUS_OK;
#define UR_PROBE_STEP(call, name)  \
  if ((err = (call)) != cudaSuccess) { \
    what = name;                       \
    goto fail;                         \
  }
  /* Load the kernel before the clock starts: lazy loading would time the module load. */
  UR_PROBE_STEP(ur__cuda_probe_prepare(), "loading the probe kernel")
  UR_PROBE_STEP(cudaEventCreate(&start), "cudaEventCreate")
  UR_PROBE_STEP(cudaEventCreate(&end), "cudaEventCreate")
  UR_PROBE_STEP(cudaEventRecord(start, s), "cudaEventRecord")
  UR_PROBE_STEP(ur__cuda_probe(s, ptr, bytes, UR_CUDA_PROBE_MAGIC), "probe kernel launch")
  UR_PROBE_STEP(cudaEventRecord(end, s), "cudaEventRecord")
  UR_PROBE_STEP(cudaEventSynchronize(end), "probe kernel")
  UR_PROBE_STEP(cudaEventElapsedTime(&ms, start, end), "cudaEventElapsedTime")
#undef UR_PROBE_STEP
  ur__cuda_drop(cudaEventDestroy(start));
  ur__cuda_drop(cudaEventDestroy(end));
  *seconds = ms / 1e3;
  return UR_STATUS_OK;
fail:
  if (start) ur__cuda_drop(cudaEventDestroy(start));
  if (end) ur__cuda_drop(cudaEventDestroy(end));
  return ur__cuda_fail(err, "%s (probe of %zu bytes at %p)", what, bytes, ptr);
}

/* ---- migration monitor (CUPTI unified-memory counters) ---- */

#if UR_HAVE_CUPTI

/* Only the functions used, resolved with dlsym: linking libcupti would make it a load-time
 * dependency of the whole backend. */
typedef struct ur_cupti {
  void *lib;
  decltype(&cuptiActivityRegisterCallbacks) register_callbacks;
  decltype(&cuptiActivityConfigureUnifiedMemoryCounter) configure;
  decltype(&cuptiActivityEnable) enable;
  decltype(&cuptiActivityDisable) disable;
  decltype(&cuptiActivityFlushAll) flush_all;
  decltype(&cuptiActivityGetNextRecord) next_record;
  decltype(&cuptiGetResultString) result_string;
} ur_cupti;

/* Two locks: CUPTI calls our buffer callback from its own threads and from inside
 * cuptiActivityFlushAll, so the lock taken there (g_acc_lock) is never held across a CUPTI
 * call; g_monitor_lock serialises start/read/stop. */
static pthread_mutex_t g_monitor_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t g_acc_lock = PTHREAD_MUTEX_INITIALIZER;
static ur_cupti g_cupti;
static int g_cupti_registered, g_monitor_running;
static ur_migration_stats g_acc;
static double g_acc_since;

#define UR_CUPTI_BUFFER_BYTES ((size_t)4 << 20)

static const char *ur_cupti_result(CUptiResult r) {
  const char *s = NULL;
  if (g_cupti.result_string && g_cupti.result_string(r, &s) == CUPTI_SUCCESS && s) return s;
  return "unknown CUPTI error";
}

static void CUPTIAPI ur_cupti_buffer_request(uint8_t **buffer, size_t *size,
                                              size_t *max_records) {
  void *p = NULL;
  /* CUPTI wants 8-byte alignment; declining (NULL) makes it drop records, not fail. */
  if (posix_memalign(&p, 8, UR_CUPTI_BUFFER_BYTES) != 0) p = NULL;
  *buffer = (uint8_t *)p;
  *size = p ? UR_CUPTI_BUFFER_BYTES : 0;
  *max_records = 0;
}

/* Units follow cupti_activity.h: byte counters carry bytes in `value`; a GPU fault record
 * carries in `value` the number of fault groups for its page, so those are summed; a CPU
 * fault record's value is a program counter, and thrashing, throttling and remote-map
 * records describe one event each, so those are counted. */
static void CUPTIAPI ur_cupti_buffer_complete(CUcontext ctx, uint32_t stream_id,
                                               uint8_t *buffer, size_t size, size_t valid) {
  (void)ctx;
  (void)stream_id;
  (void)size;
  ur_migration_stats add;
  memset(&add, 0, sizeof add);
  CUpti_Activity *rec = NULL;
  while (buffer && g_cupti.next_record(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind != CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER) continue;
    /* kind, counterKind and value lead every version of this record (2 and 3). */
    const CUpti_ActivityUnifiedMemoryCounter3 *um =
        (const CUpti_ActivityUnifiedMemoryCounter3 *)rec;
    switch (um->counterKind) {
    case CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_HTOD:
      add.bytes_htod += um->value; break;
    case CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_DTOH:
      add.bytes_dtoh += um->value; break;
    case CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_GPU_PAGE_FAULT:
      add.gpu_page_faults += um->value; break;
    case CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_CPU_PAGE_FAULT_COUNT:
      add.cpu_page_faults++; break;
    case CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_THRASHING: add.thrashing++; break;
    case CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_THROTTLING: add.throttling++; break;
    case CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_REMOTE_MAP: add.remote_map++; break;
    default: break;
    }
  }
  pthread_mutex_lock(&g_acc_lock);
  g_acc.bytes_htod += add.bytes_htod;
  g_acc.bytes_dtoh += add.bytes_dtoh;
  g_acc.gpu_page_faults += add.gpu_page_faults;
  g_acc.cpu_page_faults += add.cpu_page_faults;
  g_acc.thrashing += add.thrashing;
  g_acc.throttling += add.throttling;
  g_acc.remote_map += add.remote_map;
  pthread_mutex_unlock(&g_acc_lock);
  free(buffer);
}

static ur_status ur_cupti_load(void) {
  static const char *const names[] = {
      "libcupti.so.13", "libcupti.so", "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13",
      "/usr/local/cuda/lib64/libcupti.so.13"};
  char first_error[256] = "";
  void *lib = NULL;
  for (size_t i = 0; i < sizeof names / sizeof names[0] && !lib; i++) {
    lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    const char *e = lib ? NULL : dlerror();
    if (!lib && i == 0 && e) snprintf(first_error, sizeof first_error, "%s", e);
  }
  if (!lib)
    return ur__cuda_core->set_error(UR_STATUS_UNSUPPORTED,
                             "cuda: migration monitor: CUPTI not found (dlopen libcupti.so.13: "
                             "%s; also tried libcupti.so and /usr/local/cuda)", first_error);
  ur_cupti c;
  memset(&c, 0, sizeof c);
  c.lib = lib;
  const char *missing = NULL;
#define UR_CUPTI_SYM(field, sym)                                              \
  if (!missing && !(c.field = reinterpret_cast<decltype(c.field)>(dlsym(lib, #sym)))) \
    missing = #sym;
  UR_CUPTI_SYM(register_callbacks, cuptiActivityRegisterCallbacks)
  UR_CUPTI_SYM(configure, cuptiActivityConfigureUnifiedMemoryCounter)
  UR_CUPTI_SYM(enable, cuptiActivityEnable)
  UR_CUPTI_SYM(disable, cuptiActivityDisable)
  UR_CUPTI_SYM(flush_all, cuptiActivityFlushAll)
  UR_CUPTI_SYM(next_record, cuptiActivityGetNextRecord)
  UR_CUPTI_SYM(result_string, cuptiGetResultString)
#undef UR_CUPTI_SYM
  if (missing) {
    dlclose(lib);
    return ur__cuda_core->set_error(UR_STATUS_UNSUPPORTED,
                             "cuda: migration monitor: the CUPTI found lacks %s", missing);
  }
  g_cupti = c;
  return UR_STATUS_OK;
}

/* Turns the counters on; when some are unsupported here, retries with those the monitor
 * is for (bytes each way and GPU faults). */
static CUptiResult ur_cupti_configure(void) {
  static const CUpti_ActivityUnifiedMemoryCounterKind kinds[] = {
      CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_HTOD,
      CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_DTOH,
      CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_GPU_PAGE_FAULT,
      CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_CPU_PAGE_FAULT_COUNT,
      CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_THRASHING,
      CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_THROTTLING,
      CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_REMOTE_MAP};
  const uint32_t n = sizeof kinds / sizeof kinds[0];
  CUpti_ActivityUnifiedMemoryCounterConfig cfg[sizeof kinds / sizeof kinds[0]];
  memset(cfg, 0, sizeof cfg);
  for (uint32_t i = 0; i < n; i++) {
    cfg[i].scope = CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_SCOPE_PROCESS_SINGLE_DEVICE;
    cfg[i].kind = kinds[i];
    cfg[i].deviceId = 0;
    cfg[i].enable = 1;
  }
  CUptiResult r = g_cupti.configure(cfg, n);
  if (r != CUPTI_SUCCESS) {
    CUptiResult r3 = g_cupti.configure(cfg, 3);
    if (r3 == CUPTI_SUCCESS) r = r3;
  }
  return r;
}

static void ur_cupti_acc_reset(double now) {
  pthread_mutex_lock(&g_acc_lock);
  memset(&g_acc, 0, sizeof g_acc);
  g_acc_since = now;
  pthread_mutex_unlock(&g_acc_lock);
}

/* Starting a running monitor restarts its interval. */
static ur_status ur_cuda_monitor_start(void) {
  ur_status st = UR_STATUS_OK;
  CUptiResult r;
  pthread_mutex_lock(&g_monitor_lock);
  if (!g_cupti.lib && (st = ur_cupti_load()) != UR_STATUS_OK) goto out;
  if (!g_cupti_registered) {
    r = g_cupti.register_callbacks(ur_cupti_buffer_request, ur_cupti_buffer_complete);
    if (r != CUPTI_SUCCESS) {
      st = ur__cuda_core->set_error(UR_STATUS_UNSUPPORTED,
                             "cuda: migration monitor: cuptiActivityRegisterCallbacks failed: %s",
                             ur_cupti_result(r));
      goto out;
    }
    g_cupti_registered = 1;
  }
  if (!g_monitor_running) {
    if ((r = ur_cupti_configure()) != CUPTI_SUCCESS) {
      st = ur__cuda_core->set_error(UR_STATUS_UNSUPPORTED,
                             "cuda: migration monitor: cuptiActivityConfigureUnifiedMemoryCounter "
                             "failed: %s", ur_cupti_result(r));
      goto out;
    }
    if ((r = g_cupti.enable(CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER)) != CUPTI_SUCCESS) {
      st = ur__cuda_core->set_error(UR_STATUS_UNSUPPORTED,
                             "cuda: migration monitor: cuptiActivityEnable(UNIFIED_MEMORY_COUNTER) "
                             "failed: %s", ur_cupti_result(r));
      goto out;
    }
    g_monitor_running = 1;
  }
  ur_cupti_acc_reset(ur__cuda_core->clock_seconds());
out:
  pthread_mutex_unlock(&g_monitor_lock);
  return st;
}

/* Waits for the device, then has CUPTI hand over every buffer (a forced flush): a plain flush
 * returns only full buffers, and on the H200 a 4 GiB prefetch read through it showed 0 bytes.
 * After the wait every migration record is complete, so the forced flush loses none. */
static ur_status ur_cuda_monitor_read(ur_migration_stats *out, int32_t reset) {
  ur_status st = UR_STATUS_OK;
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&g_monitor_lock);
  if (g_monitor_running) {
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
      pthread_mutex_unlock(&g_monitor_lock);
      return ur__cuda_fail(e, "cudaDeviceSynchronize before reading the migration monitor");
    }
    CUptiResult r = g_cupti.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    if (r != CUPTI_SUCCESS) {
      st = ur__cuda_core->set_error(UR_STATUS_UNSUPPORTED,
                             "cuda: migration monitor: cuptiActivityFlushAll failed: %s",
                             ur_cupti_result(r));
    } else {
      double now = ur__cuda_core->clock_seconds();
      pthread_mutex_lock(&g_acc_lock);
      *out = g_acc;
      out->seconds = now - g_acc_since;
      out->source = 1;
      if (reset) {
        memset(&g_acc, 0, sizeof g_acc);
        g_acc_since = now;
      }
      pthread_mutex_unlock(&g_acc_lock);
    }
  }
  pthread_mutex_unlock(&g_monitor_lock);
  return st;
}

static ur_status ur_cuda_monitor_stop(void) {
  ur_status st = UR_STATUS_OK;
  pthread_mutex_lock(&g_monitor_lock);
  if (g_monitor_running) {
    g_monitor_running = 0;
    CUptiResult r = g_cupti.disable(CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER);
    /* Forced: hand back every buffer, so that none is left allocated by a stopped monitor. */
    CUptiResult rf = g_cupti.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    if (r == CUPTI_SUCCESS) r = rf;
    if (r != CUPTI_SUCCESS)
      st = ur__cuda_core->set_error(UR_STATUS_UNSUPPORTED,
                             "cuda: migration monitor: stopping CUPTI failed: %s",
                             ur_cupti_result(r));
  }
  pthread_mutex_unlock(&g_monitor_lock);
  return st;
}

#else /* !UR_HAVE_CUPTI */

static ur_status ur_cuda_monitor_start(void) {
  return ur__cuda_core->set_error(UR_STATUS_UNSUPPORTED,
                           "cuda: migration monitor: this backend was built without the CUPTI "
                           "headers (cupti_activity.h)");
}

static ur_status ur_cuda_monitor_read(ur_migration_stats *out, int32_t reset) {
  (void)reset;
  memset(out, 0, sizeof *out);
  return UR_STATUS_OK;
}

static ur_status ur_cuda_monitor_stop(void) { return UR_STATUS_OK; }

#endif

/* ---- the table ---- */

/* UR_CUDA_ARCHS may be given by the build (-DUR_CUDA_ARCHS='"sm_90 compute_90"');
 * otherwise nvcc's __CUDA_ARCH_LIST__ gives the virtual architectures compiled for. */
static void ur_cuda_archs_init(void) {
#if defined(UR_CUDA_ARCHS)
  snprintf(g_archs, sizeof g_archs, "%s", UR_CUDA_ARCHS);
#elif defined(__CUDA_ARCH_LIST__)
  static const int list[] = {__CUDA_ARCH_LIST__};
  size_t len = 0;
  for (size_t i = 0; i < sizeof list / sizeof list[0] && len < sizeof g_archs; i++) {
    int n = snprintf(g_archs + len, sizeof g_archs - len, "%ssm_%d", i ? " " : "", list[i] / 10);
    if (n < 0) break;
    len += (size_t)n;
  }
#else
  g_archs[0] = '\0';
#endif
}

/* The targets this library was built for, asked before init so that a machine without a GPU
 * can still say what the build holds. */
extern "C" __attribute__((visibility("default"))) const char *ur_cuda_backend_archs(void) {
  if (!g_archs[0]) ur_cuda_archs_init();
  return g_archs;
}

extern "C" __attribute__((visibility("default"))) ur_status
ur_cuda_backend_init(const ur_core_api *core, const ur_backend **out) {
  if (!core || !out || !core->set_error) return UR_STATUS_INVALID;
  *out = NULL;
  if (core->abi != UR_BACKEND_ABI)
    return core->set_error(UR_STATUS_UNSUPPORTED,
                           "cuda: backend ABI %d does not match the core's %d", UR_BACKEND_ABI,
                           core->abi);
  ur__cuda_core = core;
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return core->set_error(UR_STATUS_UNSUPPORTED,
                           "cuda: no usable GPU: cudaGetDeviceCount failed: %s (%s)",
                           cudaGetErrorName(err), cudaGetErrorString(err));
  }
  if (n <= 0) return core->set_error(UR_STATUS_UNSUPPORTED, "cuda: no GPU found");
  g_device_count = n;
  ur_cuda_archs_init();

  ur_backend *b = &g_backend;
  memset(b, 0, sizeof *b);
  b->abi = UR_BACKEND_ABI;
  b->name = "cuda";
  b->archs = g_archs;
  b->device_count = ur_cuda_device_count;
  b->device_set = ur_cuda_device_set;
  b->device_get = ur_cuda_device_get;
  b->device_props = ur_cuda_device_props;
  b->device_sync = ur_cuda_device_sync;
  b->alloc = ur_cuda_alloc;
  b->free = ur_cuda_free;
  b->copy = ur_cuda_copy;
  b->read = ur_cuda_read;
  b->fill = ur_cuda_fill;
  b->rand = ur_cuda_rand;
  b->rand_rows = ur_cuda_rand_rows;
  b->zero_rows = ur_cuda_zero_rows;
  b->stream_new = ur_cuda_stream_new;
  b->stream_free = ur_cuda_stream_free;
  b->stream_sync = ur_cuda_stream_sync;
  b->event_new = ur_cuda_event_new;
  b->event_free = ur_cuda_event_free;
  b->event_record = ur_cuda_event_record;
  b->event_sync = ur_cuda_event_sync;
  b->event_elapsed = ur_cuda_event_elapsed;
  b->advise = ur_cuda_advise;
  b->prefetch = ur_cuda_prefetch;
  b->range_attrs = ur_cuda_range_attrs;
  b->probe_read = ur_cuda_probe_read;
  b->monitor_start = ur_cuda_monitor_start;
  b->monitor_read = ur_cuda_monitor_read;
  b->monitor_stop = ur_cuda_monitor_stop;
  b->stream_wait = ur_cuda_stream_wait;
  b->host_call = ur_cuda_host_call;
  b->graph_begin = ur_cuda_graph_begin;
  b->graph_end = ur_cuda_graph_end;
  b->graph_launch = ur_cuda_graph_launch;
  b->graph_free = ur_cuda_graph_free;
  b->nonfinite_check = ur_cuda_nonfinite_check;
  b->nonfinite_end = ur_cuda_nonfinite_end;
  b->dense = &ur__cuda_dense_ops;
  b->tbe = &ur__cuda_tbe_ops;
  b->cache = &ur__cuda_cache_ops;
  b->kjt = &ur__cuda_kjt_ops;
  b->synth = &ur__cuda_synth_ops;
  b->metrics = &ur__cuda_metrics_ops;
  b->qtbe = &ur__cuda_qtbe_ops;
  b->mc = &ur__cuda_mc_ops;
  b->comm = &ur__cuda_comm_ops;
  *out = b;
  return UR_STATUS_OK;
}
