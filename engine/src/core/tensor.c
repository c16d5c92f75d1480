/* tensor.c: tensors over refcounted storage in any placement, views, copies, fill and the
 * counter-based random init. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#ifdef UR__ASAN
#include <sanitizer/asan_interface.h>
#endif

static uint64_t next_storage_id;

/* The backend whose allocator holds a storage of this placement. */
static const ur_backend *allocator(ur_place place) {
  return place == UR_PLACE_HOST || !ur__gpu() ? ur__cpu() : ur__gpu();
}

static int storage_on_gpu(const ur__storage *st) {
  return st->place == UR_PLACE_DEVICE && ur__gpu();
}

/* CPU code may touch managed or pinned memory the GPU is still writing: wait for it first. */
static ur_status host_access(const ur__storage *st) {
  if (ur__gpu() && st->place != UR_PLACE_HOST) return ur__gpu()->device_sync();
  return UR_STATUS_OK;
}

ur_status ur__tensor_ready(const ur_backend *b, const ur_tensor *t) {
  return b == ur__gpu() ? UR_STATUS_OK : host_access(t->st);
}

static ur_status check_device(ur_place place, int32_t device) {
  int n = ur_device_count();
  if (place == UR_PLACE_HOST || place == UR_PLACE_PINNED) {
    if (device != UR_LOC_CPU)
      return ur__error(UR_STATUS_INVALID,
                       "tensor: device %d given for placement '%s'; host memory takes -1 (the CPU)",
                       (int)device, ur_place_name(place));
    return UR_STATUS_OK;
  }
  if (place == UR_PLACE_DEVICE && !n)
    return ur__error(UR_STATUS_UNSUPPORTED,
                     "tensor: placement 'device' needs a GPU, and none is in use (%s)",
                     ur_cuda_error());
  int hi = n ? n - 1 : UR_MAX_GPUS;
  if (device < (place == UR_PLACE_MANAGED ? UR_LOC_CPU : 0) || device > hi)
    return ur__error(UR_STATUS_INVALID, "tensor: device %d does not exist for placement '%s'; expected %s0..%d",
                     (int)device, ur_place_name(place), place == UR_PLACE_MANAGED ? "-1 or " : "",
                     hi);
  return UR_STATUS_OK;
}

/* ---- a storage's record of the hints in force (hints.c keeps it) ---- */

static const ur__seg default_seg = {0, 0, UR_LOC_NONE, UR_LOC_NONE, 0, 0, 0};

ur_status ur__segmap_init(ur__segmap *m, uint64_t bytes) {
  m->v = malloc(4 * sizeof *m->v);
  if (!m->v) return ur__error(UR_STATUS_OOM, "hints: out of host memory");
  m->cap = 4;
  m->n = 1;
  m->v[0] = default_seg;
  m->v[0].end = bytes;
  return UR_STATUS_OK;
}

void ur__segmap_free(ur__segmap *m) {
  free(m->v);
  m->v = NULL;
  m->n = m->cap = 0;
}

static ur_status storage_new(ur__storage **out, uint64_t bytes, ur_place place, int32_t device) {
  ur__storage *st = calloc(1, sizeof *st);
  if (!st) return ur__error(UR_STATUS_OOM, "tensor: out of host memory");
  st->bytes = bytes;
  st->place = place;
  st->device = device;
  st->refs = 1;
  uint64_t page = ur_hint_page_bytes_get();
  st->alloc_bytes = place == UR_PLACE_MANAGED ? (bytes + page - 1) / page * page : bytes;
  ur_status s = UR_STATUS_OK;
  if (place == UR_PLACE_DEVICE) {
    pthread_mutex_lock(&ur__lock);
    s = ur__hbm_reserve(bytes, "device tensor");
    pthread_mutex_unlock(&ur__lock);
  }
  if (!s) {
    s = allocator(place)->alloc(place, device, st->alloc_bytes ? st->alloc_bytes : 1, &st->data);
    if (s && place == UR_PLACE_DEVICE) {
      pthread_mutex_lock(&ur__lock);
      ur__hbm_release(bytes);
      pthread_mutex_unlock(&ur__lock);
    }
  }
  if (!s && place == UR_PLACE_MANAGED) s = ur__segmap_init(&st->hints, st->alloc_bytes);
  if (s) {
    if (st->data) allocator(place)->free(place, st->data);
    free(st);
    return s;
  }
  pthread_mutex_lock(&ur__lock);
  ur__place_add(place, bytes);
  pthread_mutex_unlock(&ur__lock);
  st->id = __atomic_add_fetch(&next_storage_id, 1, __ATOMIC_RELAXED);
  *out = st;
  /* managed storage's whole pages past its bytes are no tensor's */
  ur_tensor whole = {.st = st, .dtype = UR_DTYPE_U8};
  ur__tensor_poison(&whole, bytes, st->alloc_bytes, 1);
  return UR_STATUS_OK;
}

void ur__tensor_poison(const ur_tensor *t, uint64_t begin, uint64_t end, int poison) {
#ifdef UR__ASAN
  const ur__storage *st = t->st;
  if (st->release || allocator(st->place) != ur__cpu()) return;
  uint64_t at = (uint64_t)t->offset * ur_dtype_size(t->dtype);
  if (end > st->alloc_bytes - at) end = st->alloc_bytes - at;
  if (begin >= end) return;
  char *p = (char *)st->data + at + begin;
  if (poison) ASAN_POISON_MEMORY_REGION(p, end - begin);
  else ASAN_UNPOISON_MEMORY_REGION(p, end - begin);
#else
  (void)t, (void)begin, (void)end, (void)poison;
#endif
}

static void storage_release(ur__storage *st) {
  if (__atomic_sub_fetch(&st->refs, 1, __ATOMIC_ACQ_REL)) return;
  if (st->release) {
    st->release(st->release_ctx);
    free(st);
    return;
  }
  pthread_mutex_lock(&ur__lock);
  ur__place_sub(st->place, st->bytes);
  if (st->place == UR_PLACE_DEVICE) ur__hbm_release(st->bytes);
  if (st->on_gpu) {
    ur__hbm_release(st->on_gpu);
    ur__managed_gpu_add(-(int64_t)st->on_gpu);
  }
  pthread_mutex_unlock(&ur__lock);
  ur__segmap_free(&st->hints);
  allocator(st->place)->free(st->place, st->data);
  free(st);
}

void ur__shape_text(int32_t ndim, const int64_t *shape, char *buf, size_t len) {
  size_t n = (size_t)snprintf(buf, len, "[");
  for (int i = 0; i < ndim && n < len; i++)
    n += (size_t)snprintf(buf + n, len - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
  if (n < len) snprintf(buf + n, len - n, "]");
}

ur_status ur__shape_bytes(const char *who, ur_dtype dtype, int32_t ndim, const int64_t *shape,
                          uint64_t *numel, uint64_t *bytes) {
  if ((unsigned)dtype >= UR_DTYPE_COUNT)
    return ur__error(UR_STATUS_INVALID, "%s: dtype %d is not a dtype", who, (int)dtype);
  if (ndim < 1 || ndim > UR_MAX_DIMS)
    return ur__error(UR_STATUS_INVALID, "%s: %d dimensions asked; expected 1 to %d", who,
                     (int)ndim, UR_MAX_DIMS);
  for (int i = 0; i < ndim; i++)
    if (shape[i] < 0)
      return ur__error(UR_STATUS_INVALID, "%s: dimension %d is %lld; expected >= 0", who, i + 1,
                       (long long)shape[i]);
  /* Every dimension bounded, a 0 counted as 1: rows of [0, 2^62, 2^62] would count past what
   * views and strides hold, and a file's [0, 2^53] past what Lua's numbers keep exact. */
  uint64_t bound = (uint64_t)ur_dtype_size(dtype);
  for (int i = 0; i < ndim; i++)
    if (shape[i] && (__builtin_mul_overflow(bound, (uint64_t)shape[i], &bound) ||
                     bound > (1ull << UR_TENSOR_MAX_BYTES_LOG2))) {
      char sh[160];
      ur__shape_text(ndim, shape, sh, sizeof sh);
      return ur__error(UR_STATUS_INVALID, "%s: %s %s; expected a shape whose dimensions other "
                       "than 0 make at most 2^%d bytes (the largest tensor)", who,
                       ur_dtype_name(dtype), sh, UR_TENSOR_MAX_BYTES_LOG2);
    }
  *numel = 1;
  for (int i = 0; i < ndim; i++) *numel *= (uint64_t)shape[i];
  *bytes = *numel * (uint64_t)ur_dtype_size(dtype); /* at most bound */
  return UR_STATUS_OK;
}

ur_tensor *ur__tensor_shaped(ur_tensor *t, ur_dtype dtype, int32_t ndim, const int64_t *shape,
                             uint64_t numel) {
  t->dtype = dtype;
  t->ndim = ndim;
  memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
  t->numel = (int64_t)numel;
  return t;
}

ur_status ur_tensor_new(ur_tensor **out, ur_dtype dtype, int32_t ndim, const int64_t *shape,
                        ur_place place, int32_t device) {
  UR__ARGS(out, shape);
  *out = NULL;
  if ((unsigned)place >= UR_PLACE_COUNT)
    return ur__error(UR_STATUS_INVALID, "tensor: placement %d is not a placement", (int)place);
  uint64_t numel, bytes;
  ur_status s = ur__shape_bytes("tensor", dtype, ndim, shape, &numel, &bytes);
  if (!s) s = check_device(place, device);
  if (s) return s;
  ur_tensor *t = calloc(1, sizeof *t);
  if (!t) return ur__error(UR_STATUS_OOM, "tensor: out of host memory");
  if ((s = storage_new(&t->st, bytes, place, device))) {
    free(t);
    return s;
  }
  *out = ur__tensor_shaped(t, dtype, ndim, shape, numel);
  return UR_STATUS_OK;
}

ur_status ur__tensor_wrap(ur_tensor **out, ur_dtype dtype, int32_t ndim, const int64_t *shape,
                          void *data, void (*release)(void *ctx), void *ctx) {
  *out = NULL;
  uint64_t numel = 1;
  for (int i = 0; i < ndim; i++) numel *= (uint64_t)shape[i];
  ur_tensor *t = calloc(1, sizeof *t);
  ur__storage *st = calloc(1, sizeof *st);
  if (!t || !st) {
    free(t);
    free(st);
    return ur__error(UR_STATUS_OOM, "tensor: out of host memory");
  }
  st->data = data;
  st->bytes = st->alloc_bytes = numel * ur_dtype_size(dtype);
  st->place = UR_PLACE_HOST;
  st->device = UR_LOC_CPU;
  st->refs = 1;
  st->release = release;
  st->release_ctx = ctx;
  st->id = __atomic_add_fetch(&next_storage_id, 1, __ATOMIC_RELAXED);
  t->st = st;
  *out = ur__tensor_shaped(t, dtype, ndim, shape, numel);
  return UR_STATUS_OK;
}

void ur_tensor_free(ur_tensor *t) {
  if (!t) return;
  storage_release(t->st);
  free(t);
}

/* "5..6": the span of count from first, for errors; a span whose end passes 64 bits (or that is
 * empty) says where it starts and how long it is instead. */
static const char *span_text(char *buf, size_t n, int64_t first, int64_t count) {
  int64_t last;
  if (count >= 1 && !__builtin_add_overflow(first, count - 1, &last))
    snprintf(buf, n, "%lld..%lld", (long long)first, (long long)last);
  else
    snprintf(buf, n, "%lld of them from %lld", (long long)count, (long long)first);
  return buf;
}

static int64_t row_elems(const ur_tensor *t) {
  int64_t r = 1;
  for (int i = 1; i < t->ndim; i++) r *= t->shape[i];
  return r;
}

ur_status ur_tensor_view(const ur_tensor *t, ur_tensor **out, int64_t row0, int64_t nrows) {
  UR__ARGS(t, out);
  *out = NULL;
  char span[64];
  if (row0 < 0 || nrows < 0 || row0 > t->shape[0] - nrows)
    return ur__error(UR_STATUS_INVALID,
                     "tensor view: rows %s (%lld rows) are outside the tensor's %lld rows",
                     span_text(span, sizeof span, row0, nrows), (long long)nrows, (long long)t->shape[0]);
  ur_tensor *v = malloc(sizeof *v);
  if (!v) return ur__error(UR_STATUS_OOM, "tensor view: out of host memory");
  *v = *t;
  v->shape[0] = nrows;
  v->offset = t->offset + row0 * row_elems(t);
  v->numel = nrows * row_elems(t);
  __atomic_add_fetch(&t->st->refs, 1, __ATOMIC_RELAXED);
  *out = v;
  return UR_STATUS_OK;
}

/* Bounded by the storage, not by t: an embedding collection keeps many tables of different
 * shapes in one storage and hands out each as its own view. */
ur_status ur_tensor_view_as(const ur_tensor *t, ur_tensor **out, int64_t offset, int32_t ndim,
                            const int64_t *shape) {
  UR__ARGS(t, out, shape);
  *out = NULL;
  uint64_t count, bytes;
  ur_status st = ur__shape_bytes("tensor view_as", t->dtype, ndim, shape, &count, &bytes);
  if (st) return st;
  int64_t numel = (int64_t)count, cap = (int64_t)(t->st->bytes / ur_dtype_size(t->dtype)), first;
  if (__builtin_add_overflow(t->offset, offset, &first) || first < 0 || first > cap - numel)
    return ur__error(UR_STATUS_INVALID,
                     "tensor view_as: %lld elements at offset %lld from element %lld pass the "
                     "storage's %lld elements",
                     (long long)numel, (long long)offset, (long long)t->offset, (long long)cap);
  ur_tensor *v = malloc(sizeof *v);
  if (!v) return ur__error(UR_STATUS_OOM, "tensor view_as: out of host memory");
  *v = *t;
  v->ndim = ndim;
  memset(v->shape, 0, sizeof v->shape);
  memcpy(v->shape, shape, sizeof(int64_t) * (size_t)ndim);
  v->offset = first;
  v->numel = numel;
  __atomic_add_fetch(&t->st->refs, 1, __ATOMIC_RELAXED);
  *out = v;
  return UR_STATUS_OK;
}

static char *elem_ptr(const ur_tensor *t, int64_t i) {
  return (char *)t->st->data + (uint64_t)(t->offset + i) * ur_dtype_size(t->dtype);
}

static void shape_str(const ur_tensor *t, char *buf, size_t len) {
  size_t n = (size_t)snprintf(buf, len, "[");
  for (int i = 0; i < t->ndim && n < len; i++)
    n += (size_t)snprintf(buf + n, len - n, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
  if (n < len) snprintf(buf + n, len - n, "]");
}

ur_status ur_tensor_copy(ur_stream *s, const ur_tensor *src, ur_tensor *dst) {
  UR__ARGS(src, dst);
  if (src->dtype != dst->dtype || src->numel != dst->numel) {
    char a[96], b[96];
    shape_str(src, a, sizeof a);
    shape_str(dst, b, sizeof b);
    return ur__error(UR_STATUS_INVALID,
                     "tensor copy: source is %s %s but destination is %s %s; dtype and element "
                     "count must match",
                     ur_dtype_name(src->dtype), a, ur_dtype_name(dst->dtype), b);
  }
  size_t es = ur_dtype_size(src->dtype), bytes = (size_t)src->numel * es;
  if (!bytes) return UR_STATUS_OK;
  char *d = elem_ptr(dst, 0);
  const char *p = elem_ptr(src, 0);
  if (d == p) return UR_STATUS_OK;
  if (src->st == dst->st && p < d + bytes && d < p + bytes)
    return ur__error(UR_STATUS_INVALID,
                     "tensor copy: source and destination overlap in storage #%llu",
                     (unsigned long long)src->st->id);
  const ur_backend *g = ur__gpu();
  if (g && src->st->place != UR_PLACE_HOST && dst->st->place != UR_PLACE_HOST)
    return g->copy(s ? s->handle : NULL, d, p, bytes);
  if (g && (src->st->place == UR_PLACE_DEVICE || dst->st->place == UR_PLACE_DEVICE)) {
    ur_status st = g->copy(s ? s->handle : NULL, d, p, bytes);
    return st ? st : g->stream_sync(s ? s->handle : NULL);
  }
  ur_status st = host_access(src->st);
  if (!st) st = host_access(dst->st);
  return st ? st : ur__cpu()->copy(NULL, d, p, bytes);
}

ur_status ur_tensor_to(ur_stream *s, const ur_tensor *src, ur_tensor **out, ur_place place,
                       int32_t device) {
  UR__ARGS(src, out);
  ur_status st = ur_tensor_new(out, src->dtype, src->ndim, src->shape, place, device);
  if (st) return st;
  if ((st = ur_tensor_copy(s, src, *out))) {
    ur_tensor_free(*out);
    *out = NULL;
  }
  return st;
}

static int is_int(ur_dtype d) { return d >= UR_DTYPE_I8 && d <= UR_DTYPE_I64; }

/* An integer dtype takes whole v in [lo, end): end exclusive, as i64's largest value, 2^63 - 1,
 * is not a double (it rounds to 2^63, which does not fit). */
static ur_status check_value(const ur_tensor *t, double v, const char *what) {
  static const double lo[] = {0, 0, 0, -128.0, 0, -2147483648.0, -9223372036854775808.0};
  static const double end[] = {0, 0, 0, 128.0, 256.0, 2147483648.0, 9223372036854775808.0};
  static const char *const range[] = {"", "", "", "-128..127", "0..255", "-2147483648..2147483647",
                                      "-9223372036854775808..9223372036854775807"};
  if (is_int(t->dtype) && !(v >= lo[t->dtype] && v < end[t->dtype] && v == floor(v)))
    return ur__error(UR_STATUS_INVALID, "%s: %.17g is not an integer that fits %s (%s)", what, v,
                     ur_dtype_name(t->dtype), range[t->dtype]);
  return UR_STATUS_OK;
}

ur_status ur_tensor_fill(ur_stream *s, ur_tensor *t, double value) {
  UR__ARGS(t);
  ur_status st = check_value(t, value, "tensor fill");
  if (st) return st;
  uint64_t bits = ur__bits_of(t->dtype, value);
  size_t es = ur_dtype_size(t->dtype);
  if (storage_on_gpu(t->st))
    return ur__gpu()->fill(s ? s->handle : NULL, elem_ptr(t, 0), (size_t)t->numel, es, bits);
  if ((st = host_access(t->st))) return st;
  return ur__cpu()->fill(NULL, elem_ptr(t, 0), (size_t)t->numel, es, bits);
}

/* Element i of a tensor draws counter (its offset in the storage + i): a view draws exactly
 * the numbers of the same rows of the whole tensor.  Managed tensors are drawn on the host,
 * so their pages start there, as a table that outgrows the GPU must. */
ur_status ur_tensor_rand(ur_stream *s, ur_tensor *t, ur_dist dist, double a, double b,
                         uint64_t seed) {
  UR__ARGS(t);
  if (dist != UR_DIST_UNIFORM && dist != UR_DIST_NORMAL)
    return ur__error(UR_STATUS_INVALID, "tensor rand: distribution %d is not uniform or normal",
                     (int)dist);
  if (!isfinite(a) || !isfinite(b) || (dist == UR_DIST_UNIFORM ? a > b : b < 0))
    return ur__error(UR_STATUS_INVALID,
                     dist == UR_DIST_UNIFORM
                         ? "tensor rand: uniform bounds [%g, %g) are not finite with low <= high"
                         : "tensor rand: normal(mean %g, std %g) needs finite values and std >= 0",
                     a, b);
  if (is_int(t->dtype) && dist == UR_DIST_UNIFORM) {
    ur_status st = check_value(t, a, "tensor rand low");
    if (!st && b > a) st = check_value(t, b - 1, "tensor rand high - 1");
    if (st) return st;
  }
  if (storage_on_gpu(t->st))
    return ur__gpu()->rand(s ? s->handle : NULL, elem_ptr(t, 0), t->dtype, (size_t)t->numel,
                           (uint64_t)t->offset, 1, 1, dist, a, b, seed);
  ur_status st = host_access(t->st);
  return st ? st
            : ur__cpu()->rand(NULL, elem_ptr(t, 0), t->dtype, (size_t)t->numel,
                              (uint64_t)t->offset, 1, 1, dist, a, b, seed);
}

static ur_status check_span(const ur_tensor *t, int64_t index, int64_t count, const char *what) {
  char span[64];
  if (index < 0 || count < 0 || index > t->numel - count)
    return ur__error(UR_STATUS_INVALID, "%s: elements %s are outside the tensor's %lld elements (0-based)",
                     what, span_text(span, sizeof span, index, count), (long long)t->numel);
  return UR_STATUS_OK;
}

/* count elements from index copied between t and host memory: out of t into out (read), or
 * from src into t (write, out NULL), done when this returns. */
static ur_status copy_span(const ur_tensor *t, int64_t index, int64_t count, void *out,
                           const void *src, const char *what) {
  ur_status st = check_span(t, index, count, what);
  if (st || !count) return st;
  size_t bytes = (size_t)count * ur_dtype_size(t->dtype);
  void *to = out ? out : elem_ptr(t, index);
  const void *from = out ? elem_ptr(t, index) : src;
  if (storage_on_gpu(t->st)) {
    if (out) return ur__gpu()->read(NULL, out, from, bytes); /* a small one by the SMs */
    if ((st = ur__gpu()->copy(NULL, to, from, bytes))) return st;
    return ur__gpu()->stream_sync(NULL);
  }
  if ((st = host_access(t->st))) return st;
  memcpy(to, from, bytes);
  return UR_STATUS_OK;
}

ur_status ur_tensor_read(const ur_tensor *t, int64_t index, int64_t count, void *out) {
  UR__ARGS(t);
  if (count && !out) return ur__null(__func__, "out");
  return copy_span(t, index, count, out, NULL, "tensor read");
}

ur_status ur_tensor_write(ur_tensor *t, int64_t index, int64_t count, const void *src) {
  UR__ARGS(t);
  if (count && !src) return ur__null(__func__, "src");
  return copy_span(t, index, count, NULL, src, "tensor write");
}

ur_status ur_tensor_read_f64(const ur_tensor *t, int64_t index, int64_t count, double *out) {
  UR__ARGS(t);
  if (count && !out) return ur__null(__func__, "out");
  ur_status st = check_span(t, index, count, "tensor read");
  if (st || !count) return st;
  size_t es = ur_dtype_size(t->dtype);
  /* Converted in place: raw elements are no wider than the doubles they become, so reading
   * them into the tail of out and converting front to back never overwrites unread data. */
  char *raw = (char *)out + (size_t)count * (8 - es);
  if ((st = ur_tensor_read(t, index, count, raw))) return st;
  for (int64_t i = 0; i < count; i++) out[i] = ur__load(raw, t->dtype, (size_t)i);
  return UR_STATUS_OK;
}

ur_status ur_tensor_get(const ur_tensor *t, int64_t index, double *out) {
  UR__ARGS(t, out);
  unsigned char buf[8];
  ur_status st = check_span(t, index, 1, "tensor get");
  if (!st) st = ur_tensor_read(t, index, 1, buf);
  if (!st) *out = ur__load(buf, t->dtype, 0);
  return st;
}

ur_status ur_tensor_set(ur_tensor *t, int64_t index, double value) {
  UR__ARGS(t);
  unsigned char buf[8];
  ur_status st = check_span(t, index, 1, "tensor set");
  if (!st) st = check_value(t, value, "tensor set");
  if (st) return st;
  ur__store(buf, t->dtype, 0, value);
  return ur_tensor_write(t, index, 1, buf);
}

size_t ur_tensor_describe(const ur_tensor *t, char *buf, size_t len) {
  UR__ARGS_OR(0, t, buf);
  char shape[128], size[32], where[64], view[96] = "";
  shape_str(t, shape, sizeof shape);
  ur__format_bytes((uint64_t)t->numel * ur_dtype_size(t->dtype), size, sizeof size);
  const ur__storage *st = t->st;
  const char *nogpu = ur__gpu() ? "" : " (host memory: no GPU)";
  if (st->place == UR_PLACE_HOST) where[0] = 0;
  else if (st->place == UR_PLACE_PINNED) snprintf(where, sizeof where, "%s", nogpu);
  else if (st->device >= 0) snprintf(where, sizeof where, " cuda:%d%s", (int)st->device, nogpu);
  else snprintf(where, sizeof where, " cpu%s", nogpu);
  if (t->offset || (uint64_t)t->numel * ur_dtype_size(t->dtype) != st->bytes)
    snprintf(view, sizeof view, " view at element %lld of storage #%llu", (long long)t->offset,
             (unsigned long long)st->id);
  int n = snprintf(buf, len, "tensor %s %s %s%s %s%s", ur_dtype_name(t->dtype), shape,
                   ur_place_name(st->place), where, size, view);
  return n < 0 ? 0 : (size_t)n;
}

ur_dtype ur_tensor_dtype(const ur_tensor *t) {
  UR__ARGS_OR(UR_DTYPE_COUNT, t);
  return t->dtype;
}
ur_place ur_tensor_place(const ur_tensor *t) {
  UR__ARGS_OR(UR_PLACE_COUNT, t);
  return t->st->place;
}
int32_t ur_tensor_device(const ur_tensor *t) {
  UR__ARGS_OR(-1, t);
  return t->st->device;
}
int32_t ur_tensor_ndim(const ur_tensor *t) {
  UR__ARGS_OR(-1, t);
  return t->ndim;
}
int64_t ur_tensor_dim(const ur_tensor *t, int32_t i) {
  UR__ARGS_OR(-1, t);
  return i >= 0 && i < t->ndim ? t->shape[i] : -1;
}
int64_t ur_tensor_numel(const ur_tensor *t) {
  UR__ARGS_OR(-1, t);
  return t->numel;
}
uint64_t ur_tensor_nbytes(const ur_tensor *t) {
  UR__ARGS_OR(0, t);
  return (uint64_t)t->numel * ur_dtype_size(t->dtype);
}
uint64_t ur_tensor_id(const ur_tensor *t) {
  UR__ARGS_OR(0, t);
  return t->st->id;
}
int64_t ur_tensor_offset(const ur_tensor *t) {
  UR__ARGS_OR(-1, t);
  return t->offset;
}
int32_t ur_tensor_refs(const ur_tensor *t) {
  UR__ARGS_OR(-1, t);
  return __atomic_load_n(&t->st->refs, __ATOMIC_RELAXED);
}
void *ur_tensor_data(const ur_tensor *t) {
  UR__ARGS_OR(NULL, t);
  return elem_ptr(t, 0);
}
