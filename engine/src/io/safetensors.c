/* safetensors.c: checkpoint files in the safetensors format (an 8-byte little-endian header
 * length, a JSON header, raw little-endian data), written atomically and streamed through a
 * bounded staging buffer, read through a validated memory map; and the few directory helpers
 * a run directory of checkpoints needs. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "core/core.h"

/* The reference reader refuses larger headers; so do we, before parsing one. */
#define HEADER_MAX 100000000ull
#define STAGING_DEFAULT (64ull << 20)
#define STAGING_MIN (8ull << 10)
#define DIRECT_CHUNK (64ull << 20) /* host reads between interrupt polls */
#define IO_MAX (1ull << 30)        /* Linux moves at most ~2 GiB per read or write call */

static const char *const st_dtype[UR_DTYPE_COUNT] = {"F32", "BF16", "F16", "I8", "U8", "I32", "I64", "F64"};
/* Position in the reference implementation's dtype order.  Tensors are written by descending
 * position, then by name, as it does: every tensor then starts aligned to its element size
 * (the data starts 8-aligned), and our files equal its files byte for byte. */
static const int st_rank[UR_DTYPE_COUNT] = {11, 8, 7, 2, 1, 9, 13, 12};

static void tensor_text(const ur_tensor *t, char *buf, size_t len) {
  int64_t shape[UR_MAX_DIMS];
  int32_t nd = ur_tensor_ndim(t);
  for (int i = 0; i < nd; i++) shape[i] = ur_tensor_dim(t, i);
  size_t n = (size_t)snprintf(buf, len, "%s ", st_dtype[ur_tensor_dtype(t)]);
  if (n < len) ur__shape_text(nd, shape, buf + n, len - n);
}

/* A shape's bound, the writer's and the reader's alike: the engine's (ur__shape_bytes: the
 * dimensions but zeros at most the largest tensor's bytes), so that a save refuses what open
 * would; *bytes its size.  path: the file read (a bad shape is its FORMAT), or NULL for a save. */
static ur_status shape_bound(const char *path, const char *name, int32_t dtype, int32_t ndim,
                             const int64_t *shape, uint64_t *bytes) {
  *bytes = ur_dtype_size((ur_dtype)dtype);
  if (ndim == 0) return UR_STATUS_OK; /* a scalar: one element */
  char who[160];
  snprintf(who, sizeof who, "%stensor '%.100s'", path ? "" : "safetensors save: ", name);
  uint64_t numel;
  ur_status st = ur__shape_bytes(who, (ur_dtype)dtype, ndim, shape, &numel, bytes);
  return st && path ? ur__error_cause(UR_STATUS_FORMAT, "safetensors: %s", path) : st;
}

/* ---- checksums: CRC32C of each tensor's bytes, kept in the metadata as CRC_KEY ---- */

/* {"<tensor>": "<crc32c, 8 hex digits>", ...} in data order: written by every save of tensors,
 * checked by ur_safetensors_verify; a flipped bit in the data is an error, not a weight. */
#define CRC_KEY "uvmrec.crc32c"

static uint32_t crc_table[8][256];

static void crc_table_init(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    crc_table[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; i++)
    for (int t = 1; t < 8; t++)
      crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xff];
}

/* Slicing by 8, for CPUs without the instruction. */
static uint32_t crc_soft(uint32_t c, const unsigned char *p, size_t n) {
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t v;
    memcpy(&v, p, 8);
    v ^= c;
    c = crc_table[7][v & 0xff] ^ crc_table[6][(v >> 8) & 0xff] ^ crc_table[5][(v >> 16) & 0xff] ^
        crc_table[4][(v >> 24) & 0xff] ^ crc_table[3][(v >> 32) & 0xff] ^
        crc_table[2][(v >> 40) & 0xff] ^ crc_table[1][(v >> 48) & 0xff] ^
        crc_table[0][v >> 56];
  }
  while (n--) c = (c >> 8) ^ crc_table[0][(c ^ *p++) & 0xff];
  return c;
}

#if defined(__x86_64__)
/* SSE4.2's crc32 instruction computes CRC32C (several GB/s: the disk, not this, bounds a save). */
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t c, const unsigned char *p,
                                                          size_t n) {
  uint64_t c64 = c;
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t v;
    memcpy(&v, p, 8);
    c64 = __builtin_ia32_crc32di(c64, v);
  }
  c = (uint32_t)c64;
  while (n--) c = __builtin_ia32_crc32qi(c, *p++);
  return c;
}
#endif

static uint32_t (*crc_update)(uint32_t, const unsigned char *, size_t);

static void crc_pick(void) {
  crc_table_init();
  crc_update = crc_soft;
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("sse4.2")) crc_update = crc_hw;
#endif
}

/* CRC32C (Castagnoli) of n bytes, continuing crc (0 to start). */
static uint32_t crc32c(uint32_t crc, const void *p, size_t n) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, crc_pick);
  return ~crc_update(~crc, p, n);
}

/* The checksum for the library's other files (a sharded checkpoint's manifest.json). */
uint32_t ur_crc32c(uint32_t crc, const void *p, size_t n) {
  if (n > 0 && !p) {
    ur__null(__func__, "p");
    return 0;
  }
  return crc32c(crc, p, n);
}

/* {"...": ..., HEADER_CRC_KEY: "<crc32c, 8 hex digits>"}: the CRC32C of what the header says
 * (header_crc), written with the tensors' and checked at open, so that a flipped bit in a
 * metadata key or value (a step, a config, CRC_KEY's name: the file then loaded unchecked) or
 * in a tensor's shape is refused as one in the data is.  A file without it (another writer's,
 * or uvmrec's before it) is opened as it was. */
#define HEADER_CRC_KEY "uvmrec.header_crc32c"

typedef struct kv {
  const char *k, *v;
} kv;

static int kv_by_key(const void *a, const void *b) {
  return strcmp(((const kv *)a)->k, ((const kv *)b)->k);
}

/* The text each side checksums, not the JSON's spelling (escapes, order, spaces): every
 * metadata pair but HEADER_CRC_KEY by key ("key\0value\0"; m is sorted here), then every
 * tensor by name ("name\0DTYPE [shape] begin end\0", each given to header_crc_tensor). */
static uint32_t header_crc_meta(kv *m, size_t nm) {
  qsort(m, nm, sizeof *m, kv_by_key);
  uint32_t c = 0;
  for (size_t i = 0; i < nm; i++) {
    c = crc32c(c, m[i].k, strlen(m[i].k) + 1);
    c = crc32c(c, m[i].v, strlen(m[i].v) + 1);
  }
  return c;
}

static uint32_t header_crc_tensor(uint32_t c, const char *name, int32_t dtype, int32_t ndim,
                                  const int64_t *shape, uint64_t begin, uint64_t end) {
  char text[256];
  size_t k = (size_t)snprintf(text, sizeof text, "%s ", st_dtype[dtype]);
  ur__shape_text(ndim, shape, text + k, sizeof text - k);
  k = strlen(text);
  snprintf(text + k, sizeof text - k, " %llu %llu", (unsigned long long)begin,
           (unsigned long long)end);
  c = crc32c(c, name, strlen(name) + 1);
  return crc32c(c, text, strlen(text) + 1);
}

/* 1 and *out for a checksum in the one form the writer writes ("%08x"), else 0 (NULL too):
 * strtoul also took a sign ("-0000001" read as ffffffff), spaces, "0x" and capitals. */
static int crc_parse(const char *text, uint32_t *out) {
  uint32_t c = 0;
  for (int i = 0; i < 8; i++) {
    char ch = text ? text[i] : 0;
    if (ch >= '0' && ch <= '9') c = c << 4 | (uint32_t)(ch - '0');
    else if (ch >= 'a' && ch <= 'f') c = c << 4 | (uint32_t)(ch - 'a' + 10);
    else return 0;
  }
  if (text[8]) return 0;
  *out = c;
  return 1;
}

/* ---- staging: two halves of one pinned buffer, so a copy and a file transfer overlap ---- */

typedef struct staging {
  uint64_t want;    /* bytes asked for (0: the default) */
  ur_tensor *buf;   /* allocated on first use */
  char *half[2];
  size_t chunk;
  const ur_backend *b;
  void *stream;
} staging;

/* Device memory, and managed memory (whose pages may be on a GPU: reading them on the CPU
 * would migrate them), go through the staging buffer; host and pinned memory do not. */
static int staged(const ur_tensor *t) {
  ur_place p = ur_tensor_place(t);
  return p == UR_PLACE_DEVICE || p == UR_PLACE_MANAGED;
}

/* who and path: the file's, as messages name it ("safetensors save: ", path), for the tensor
 * being read or written. */
static ur_status staging_ready(staging *sg, const char *who, const char *path, const char *name) {
  if (sg->buf) return UR_STATUS_OK;
  uint64_t bytes = sg->want ? sg->want : STAGING_DEFAULT;
  if (bytes < STAGING_MIN) bytes = STAGING_MIN;
  sg->chunk = (size_t)(bytes / 2 / 4096 * 4096);
  int64_t n = (int64_t)sg->chunk * 2;
  ur_status s = ur_tensor_new(&sg->buf, UR_DTYPE_U8, 1, &n, UR_PLACE_PINNED, UR_LOC_CPU);
  if (s)
    return ur__error_cause(s, "%s%s: tensor '%s': a staging buffer of %lld bytes", who, path, name,
                           (long long)n);
  sg->half[0] = ur_tensor_data(sg->buf);
  sg->half[1] = sg->half[0] + sg->chunk;
  return UR_STATUS_OK;
}

static void staging_init(staging *sg, ur_stream *s, uint64_t want) {
  memset(sg, 0, sizeof *sg);
  sg->want = want;
  sg->b = ur__gpu() ? ur__gpu() : ur__cpu();
  sg->stream = s ? s->handle : NULL;
}

/* Waits for copies still in flight before the buffer goes. */
static void staging_done(staging *sg) {
  if (!sg->buf) return;
  sg->b->stream_sync(sg->stream);
  ur_tensor_free(sg->buf);
  sg->buf = NULL;
}

/* ---- writing ---- */

/* One tensor of a file being written: what the header says of it, the caller's index, and how
 * many of its bytes were given. */
typedef struct item {
  char *name; /* the writer's copy */
  int32_t dtype, ndim, index;
  int64_t shape[UR_MAX_DIMS];
  uint64_t begin, end, given;
  uint32_t crc; /* of the bytes given, in order (parts are appended) */
} item;

static int by_name(const void *a, const void *b) {
  return strcmp(((const item *)a)->name, ((const item *)b)->name);
}

static int item_ptr_by_name(const void *a, const void *b) {
  return strcmp((*(const item *const *)a)->name, (*(const item *const *)b)->name);
}

static int by_layout(const void *a, const void *b) {
  const item *x = a, *y = b;
  int rx = st_rank[x->dtype], ry = st_rank[y->dtype];
  if (rx != ry) return ry - rx;
  return strcmp(x->name, y->name);
}

struct ur_safetensors_writer {
  int fd;
  char *path, *tmp;
  uint64_t done, total, data_start;
  int32_t n;
  item *items;    /* in layout order */
  int32_t *slot;  /* the caller's index -> its item */
  staging sg;
  uint32_t *crc;  /* the checksum of the part being written, or NULL (the header) */
  int32_t nmeta;  /* the metadata, kept for the header written again with the checksums */
  char **meta_keys, **meta_values;
};

/* n bytes at byte `at` of the temporary file. */
static ur_status write_at(ur_safetensors_writer *w, const void *p, uint64_t n, uint64_t at) {
  const char *c = p;
  while (n) {
    ssize_t k = pwrite(w->fd, c, n < IO_MAX ? (size_t)n : IO_MAX, (off_t)at);
    if (k < 0) {
      if (errno == EINTR) continue;
      return ur__error(UR_STATUS_IO,
                       "safetensors: writing %s failed after %llu of %llu bytes: %s; %s is "
                       "unchanged",
                       w->tmp, (unsigned long long)w->done, (unsigned long long)w->total,
                       strerror(errno), w->path);
    }
    if (w->crc) *w->crc = crc32c(*w->crc, c, (size_t)k);
    c += k;
    n -= (uint64_t)k;
    at += (uint64_t)k;
    w->done += (uint64_t)k;
  }
  return UR_STATUS_OK;
}

static ur_status write_staged(ur_safetensors_writer *w, const char *name, const ur_tensor *t,
                               uint64_t at) {
  staging *sg = &w->sg;
  uint64_t n = ur_tensor_nbytes(t);
  const char *src = ur_tensor_data(t);
  if (!n) return UR_STATUS_OK;
  ur_status s = staging_ready(sg, "safetensors save: ", w->path, name);
  if (s) return s;
  size_t len0 = n < sg->chunk ? (size_t)n : sg->chunk;
  if ((s = sg->b->copy(sg->stream, sg->half[0], src, len0))) return s;
  int cur = 0;
  for (uint64_t off = 0; off < n;) {
    size_t len = n - off < sg->chunk ? (size_t)(n - off) : sg->chunk;
    if ((s = sg->b->stream_sync(sg->stream))) return s;
    uint64_t next = off + len;
    if (next < n) {
      size_t nlen = n - next < sg->chunk ? (size_t)(n - next) : sg->chunk;
      if ((s = sg->b->copy(sg->stream, sg->half[cur ^ 1], src + next, nlen))) return s;
    }
    if ((s = write_at(w, sg->half[cur], len, at + off))) return s;
    cur ^= 1;
    off = next;
  }
  return UR_STATUS_OK;
}

/* The checksums' metadata value: {"name":"8 hex digits",...} in data order (its length does
 * not depend on the checksums, so the header written before the data keeps its size). */
static char *crc_text(const item *items, int32_t n) {
  json_t *o = json_object();
  for (int32_t i = 0; o && i < n; i++) {
    char hex[9];
    snprintf(hex, sizeof hex, "%08x", (unsigned)items[i].crc);
    if (json_object_set_new(o, items[i].name, json_string(hex))) {
      json_decref(o);
      return NULL;
    }
  }
  char *text = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
  json_decref(o);
  return text;
}

/* Out of host memory for the header of the file at path: its JSON (jansson's allocations, whose
 * sizes it does not say). */
static ur_status header_no_memory(const char *path, int32_t n, int32_t nmeta) {
  return ur__error(UR_STATUS_OOM, "safetensors save: %s: out of host memory for its header (%d "
                   "metadata entries and %d tensor entries)", path, (int)nmeta, (int)n);
}

static ur_status build_header(const char *path, const item *items, int32_t n, int32_t nmeta,
                              const char *const *keys, const char *const *values, char **out,
                              size_t *len) {
  json_t *root = json_object();
  ur_status s = root ? UR_STATUS_OK : header_no_memory(path, n, nmeta);
  if (!s && (nmeta > 0 || n > 0)) {
    json_t *m = json_object();
    if (!m || json_object_set_new(root, "__metadata__", m)) s = header_no_memory(path, n, nmeta);
    for (int32_t i = 0; !s && i < nmeta; i++) {
      if (!keys[i] || !values[i])
        s = ur__error(UR_STATUS_INVALID, "safetensors: metadata entry %d has a NULL key or value",
                      (int)i);
      else if (!strcmp(keys[i], CRC_KEY) || !strcmp(keys[i], HEADER_CRC_KEY))
        continue; /* the writer's own (a loaded file's metadata saved again): computed anew */
      else if (json_object_get(m, keys[i]))
        s = ur__error(UR_STATUS_INVALID, "safetensors: metadata key '%s' is given twice", keys[i]);
      else if (json_object_set_new(m, keys[i], json_string(values[i])))
        s = ur__error(UR_STATUS_INVALID,
                      "safetensors: metadata '%s' is not valid UTF-8 text (key or value)", keys[i]);
    }
  }
  for (int32_t i = 0; !s && i < n; i++) {
    json_t *e = json_object(), *shape = json_array(), *offs = json_array();
    if (!e || !shape || !offs) {
      json_decref(e);
      json_decref(shape);
      json_decref(offs);
      s = header_no_memory(path, n, nmeta);
      break;
    }
    for (int32_t d = 0; d < items[i].ndim; d++)
      json_array_append_new(shape, json_integer((json_int_t)items[i].shape[d]));
    json_array_append_new(offs, json_integer((json_int_t)items[i].begin));
    json_array_append_new(offs, json_integer((json_int_t)items[i].end));
    json_object_set_new(e, "dtype", json_string(st_dtype[items[i].dtype]));
    json_object_set_new(e, "shape", shape);
    json_object_set_new(e, "data_offsets", offs);
    if (json_object_set_new(root, items[i].name, e))
      s = ur__error(UR_STATUS_INVALID, "safetensors: tensor name '%s' is not valid UTF-8",
                    items[i].name);
  }
  char *ct = NULL;
  if (!s && n > 0) { /* the names are valid: the tensors took them */
    ct = crc_text(items, n);
    if (!ct || json_object_set_new(json_object_get(root, "__metadata__"), CRC_KEY, json_string(ct)))
      s = header_no_memory(path, n, nmeta);
  }
  json_t *meta = json_object_get(root, "__metadata__");
  if (!s && meta) { /* what the header says, CRC_KEY's text with it */
    size_t nm = 0;
    size_t nkv = json_object_size(meta) + 1;
    kv *m = malloc(nkv * sizeof *m);
    const item **by = malloc(((size_t)n + 1) * sizeof *by);
    if (!m || !by)
      s = ur__no_memory("safetensors save: ", path, nkv * sizeof *m + ((size_t)n + 1) * sizeof *by,
                        "its header's checksum over %zu metadata pairs and %d tensors", nkv - 1, (int)n);
    const char *k;
    json_t *v;
    if (!s) json_object_foreach(meta, k, v) m[nm++] = (kv){k, json_string_value(v)};
    for (int32_t i = 0; !s && i < n; i++) by[i] = &items[i];
    if (!s) qsort(by, (size_t)n, sizeof *by, item_ptr_by_name);
    uint32_t c = s ? 0 : header_crc_meta(m, nm);
    for (int32_t i = 0; !s && i < n; i++)
      c = header_crc_tensor(c, by[i]->name, by[i]->dtype, by[i]->ndim, by[i]->shape, by[i]->begin,
                            by[i]->end);
    char hex[9];
    snprintf(hex, sizeof hex, "%08x", (unsigned)c);
    if (!s && json_object_set_new(meta, HEADER_CRC_KEY, json_string(hex)))
      s = header_no_memory(path, n, nmeta);
    free(m);
    free(by);
  }
  free(ct);
  char *text = s ? NULL : json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
  json_decref(root);
  if (s) return s;
  if (!text) return header_no_memory(path, n, nmeta);
  size_t tl = strlen(text), padded = (tl + 7) / 8 * 8;
  char *buf = malloc(8 + padded);
  if (!buf) {
    free(text);
    return ur__no_memory("safetensors save: ", path, 8 + padded, "its header");
  }
  /* Spaces pad the header so the data starts 8-aligned, as the format allows. */
  for (int b = 0; b < 8; b++) buf[b] = (char)((uint64_t)padded >> (8 * b));
  memcpy(buf + 8, text, tl);
  memset(buf + 8 + tl, ' ', padded - tl);
  free(text);
  *out = buf;
  *len = 8 + padded;
  return UR_STATUS_OK;
}

/* What an entry given to the writer must say of its tensor: a name, a dtype, a shape. */
static ur_status check_entry(const ur_safetensors_entry *e, int32_t i) {
  if (!e->name || !*e->name || !strcmp(e->name, "__metadata__"))
    return ur__error(UR_STATUS_INVALID,
                     "safetensors save: tensor %d is named '%s'; expected a non-empty name other "
                     "than __metadata__", (int)i, e->name ? e->name : "(null)");
  if (e->dtype < 0 || e->dtype >= UR_DTYPE_COUNT)
    return ur__error(UR_STATUS_INVALID, "safetensors save: tensor '%s' has dtype %d; expected a "
                     "ur_dtype", e->name, (int)e->dtype);
  if (e->ndim < 0 || e->ndim > UR_MAX_DIMS)
    return ur__error(UR_STATUS_INVALID, "safetensors save: tensor '%s' has %d dims; expected 0 to "
                     "%d", e->name, (int)e->ndim, UR_MAX_DIMS);
  for (int32_t d = 0; d < e->ndim; d++)
    if (e->shape[d] < 0)
      return ur__error(UR_STATUS_INVALID, "safetensors save: tensor '%s' has dim %d of %lld; "
                       "expected a size >= 0", e->name, (int)d, (long long)e->shape[d]);
  /* bounded as the reader bounds it: a shape whose product wrapped gave a header whose offsets
   * did not match its shapes, and a file the reader refuses would be published */
  uint64_t bytes;
  return shape_bound(NULL, e->name, e->dtype, e->ndim, e->shape, &bytes);
}

/* For the specs only: UVMREC_CHECKPOINT_TEST_DELAY=S holds a complete temporary file for S
 * seconds before the rename, and says so on stderr, so a spec can kill the process at that
 * point for certain (the previous checkpoint must then be the one that loads). */
static void test_delay(const char *tmp, const char *path) {
  const char *env = getenv("UVMREC_CHECKPOINT_TEST_DELAY");
  double sec = env ? atof(env) : 0;
  if (!(sec > 0)) return;
  char line[2 * PATH_MAX + 128];
  int len = snprintf(line, sizeof line,
                     "safetensors: UVMREC_CHECKPOINT_TEST_DELAY: %s is complete; renaming it to %s "
                     "in %g s\n", tmp, path, sec);
  if (len > 0 && write(2, line, (size_t)len < sizeof line ? (size_t)len : sizeof line - 1) < 0) return;
  struct timespec ts = {(time_t)sec, (long)((sec - (double)(time_t)sec) * 1e9)};
  while (nanosleep(&ts, &ts) && errno == EINTR) {
  }
}

void ur_safetensors_writer_free(ur_safetensors_writer *w) {
  if (!w) return;
  staging_done(&w->sg);
  if (w->fd >= 0) {
    close(w->fd);
    unlink(w->tmp);
  }
  free(w->tmp);
  free(w->path);
  for (int32_t i = 0; w->items && i < w->n; i++) free(w->items[i].name);
  free(w->items);
  free(w->slot);
  for (int32_t i = 0; w->meta_keys && i < w->nmeta; i++) {
    free(w->meta_keys[i]);
    free(w->meta_values[i]);
  }
  free(w->meta_keys);
  free(w->meta_values);
  free(w);
}

ur_status ur_safetensors_writer_open(ur_safetensors_writer **out, ur_stream *stream,
                                     const char *path, int32_t n, ur_safetensors_entry *entries,
                                     int32_t nmeta, const char *const *meta_keys,
                                     const char *const *meta_values, uint64_t staging_bytes) {
  UR__ARGS(out, path);
  *out = NULL;
  if (n > 0 && !entries) return ur__null(__func__, "entries");
  if (nmeta > 0 && !meta_keys) return ur__null(__func__, "meta_keys");
  if (nmeta > 0 && !meta_values) return ur__null(__func__, "meta_values");
  if (!*path) return ur__error(UR_STATUS_INVALID, "safetensors save: no path given");
  if (n < 0 || nmeta < 0)
    return ur__error(UR_STATUS_INVALID, "safetensors save: %d tensors and %d metadata entries; "
                     "expected counts >= 0", (int)n, (int)nmeta);
  ur_status s = UR_STATUS_OK;
  for (int32_t i = 0; !s && i < n; i++) s = check_entry(&entries[i], i);
  if (s) return s;
  ur_safetensors_writer *w = calloc(1, sizeof *w);
  if (!w) return ur__no_memory("safetensors save: ", path, sizeof *w, "a writer");
  w->fd = -1;
  w->n = n;
  w->items = calloc((size_t)n + 1, sizeof *w->items);
  w->slot = calloc((size_t)n + 1, sizeof *w->slot);
  w->path = strdup(path);
  w->tmp = malloc(strlen(path) + 16);
  staging_init(&w->sg, stream, staging_bytes);
  w->meta_keys = calloc((size_t)nmeta + 1, sizeof *w->meta_keys);
  w->meta_values = calloc((size_t)nmeta + 1, sizeof *w->meta_values);
  int meta_ok = w->meta_keys && w->meta_values;
  const char *lost = NULL; /* the metadata string whose copy failed, entry lost_at's key or value */
  int32_t lost_at = -1;
  for (int32_t i = 0; meta_ok && i < nmeta; i++, w->nmeta = i) {
    /* kept for close, which writes the header again with the checksums (NULLs refused there) */
    w->meta_keys[i] = meta_keys[i] ? strdup(meta_keys[i]) : NULL;
    w->meta_values[i] = meta_values[i] ? strdup(meta_values[i]) : NULL;
    if (meta_keys[i] && !w->meta_keys[i]) lost = meta_keys[i];
    else if (meta_values[i] && !w->meta_values[i]) lost = meta_values[i];
    if (lost) lost_at = i;
    meta_ok = !lost;
  }
  if (!w->items || !w->slot || !w->path || !w->tmp || !meta_ok) {
    if (!w->items || !w->slot)
      s = ur__no_memory("safetensors save: ", path, ((size_t)n + 1) * (sizeof *w->items + sizeof *w->slot),
                        "its %d tensors' entries", (int)n);
    else if (!w->path || !w->tmp)
      s = ur__no_memory("safetensors save: ", path, 2 * strlen(path) + 17, "its path");
    else if (!lost)
      s = ur__no_memory("safetensors save: ", path, 2 * ((size_t)nmeta + 1) * sizeof(char *),
                        "the list of its %d metadata entries", (int)nmeta);
    else
      s = ur__no_memory("safetensors save: ", path, strlen(lost) + 1, "a copy of metadata entry %d's %s",
                        (int)lost_at, lost == meta_keys[lost_at] ? "key" : "value");
    ur_safetensors_writer_free(w);
    return s;
  }
  item *items = w->items;
  for (int32_t i = 0; !s && i < n; i++) {
    items[i] = (item){strdup(entries[i].name), entries[i].dtype, entries[i].ndim, i, {0}, 0, 0, 0, 0};
    memcpy(items[i].shape, entries[i].shape, sizeof items[i].shape);
    if (!items[i].name)
      s = ur__no_memory("safetensors save: ", path, strlen(entries[i].name) + 1, "tensor '%s''s name",
                        entries[i].name);
  }
  /* (not sorted with a name missing: the comparisons read every name) */
  if (!s) qsort(items, (size_t)n, sizeof *items, by_name);
  for (int32_t i = 1; !s && i < n; i++)
    if (!strcmp(items[i].name, items[i - 1].name))
      s = ur__error(UR_STATUS_INVALID, "safetensors save: tensor name '%s' is given twice",
                    items[i].name);
  if (!s) qsort(items, (size_t)n, sizeof *items, by_layout);
  uint64_t off = 0;
  for (int32_t i = 0; !s && i < n; i++) {
    uint64_t bytes = ur_dtype_size((ur_dtype)items[i].dtype);
    for (int32_t d = 0; d < items[i].ndim; d++) bytes *= (uint64_t)items[i].shape[d];
    items[i].begin = off;
    if (__builtin_add_overflow(off, bytes, &off))
      s = ur__error(UR_STATUS_INVALID, "safetensors save: the %d tensors' bytes overflow 64 bits",
                    (int)n);
    items[i].end = off;
    w->slot[items[i].index] = i;
  }
  char *header = NULL;
  size_t hlen = 0;
  if (!s) s = build_header(path, items, n, nmeta, meta_keys, meta_values, &header, &hlen);
  if (!s && hlen - 8 > HEADER_MAX) { /* published, it would be refused by every reader */
    int32_t big = -1;
    for (int32_t i = 0; i < nmeta; i++)
      if (big < 0 || strlen(meta_values[i]) > strlen(meta_values[big])) big = i;
    s = ur__error(UR_STATUS_INVALID, "safetensors save: %s: the header (metadata and %d tensor "
                  "entries) takes %zu bytes; a reader takes at most %llu (the largest metadata "
                  "value: '%s', %zu bytes); nothing was written", path, (int)n, hlen - 8, HEADER_MAX,
                  big >= 0 ? meta_keys[big] : "none", big >= 0 ? strlen(meta_values[big]) : (size_t)0);
  }
  w->data_start = hlen;
  w->total = hlen + off;
  for (int32_t i = 0; !s && i < n; i++) {
    ur_safetensors_entry *e = &entries[items[i].index];
    e->begin = items[i].begin;
    e->end = items[i].end;
    e->file_offset = hlen + items[i].begin;
  }
  if (!s) {
    sprintf(w->tmp, "%s.tmp-XXXXXX", path);
    w->fd = mkostemp(w->tmp, O_CLOEXEC);
    if (w->fd < 0)
      s = ur__error(UR_STATUS_IO, "safetensors: cannot create a temporary file beside %s: %s",
                    path, strerror(errno));
  }
  if (!s && fchmod(w->fd, 0644))
    s = ur__error(UR_STATUS_IO, "safetensors: chmod of %s: %s", w->tmp, strerror(errno));
  /* Reserving the blocks first turns a full disk into an error before hours of writing; the
   * size is kept, so only the writes count against a file-size limit.  Filesystems without
   * fallocate just skip it. */
  if (!s && w->total && fallocate(w->fd, FALLOC_FL_KEEP_SIZE, 0, (off_t)w->total) &&
      errno == ENOSPC) {
    char need[32];
    ur__format_bytes(w->total, need, sizeof need);
    s = ur__error(UR_STATUS_IO, "safetensors: %s needs %s and the disk has less free; %s is "
                  "unchanged", w->tmp, need, path);
  }
  if (!s) s = write_at(w, header, hlen, 0);
  free(header);
  if (s) {
    ur_safetensors_writer_free(w);
    return s;
  }
  *out = w;
  return UR_STATUS_OK;
}

static void entry_text(const item *it, char *buf, size_t len) {
  size_t k = (size_t)snprintf(buf, len, "%s ", st_dtype[it->dtype]);
  if (k < len) ur__shape_text(it->ndim, it->shape, buf + k, len - k);
}

ur_status ur_safetensors_writer_put(ur_stream *stream, ur_safetensors_writer *w, int32_t i,
                                    const ur_tensor *part) {
  UR__ARGS(w, part);
  if (i < 0 || i >= w->n)
    return ur__error(UR_STATUS_INVALID, "safetensors writer: %s: tensor %d does not exist; the "
                     "file has %d (0-based)", w->path, (int)i, (int)w->n);
  item *it = &w->items[w->slot[i]];
  uint64_t n = ur_tensor_nbytes(part), size = it->end - it->begin;
  char want[192];
  entry_text(it, want, sizeof want);
  if ((int32_t)ur_tensor_dtype(part) != it->dtype)
    return ur__error(UR_STATUS_INVALID, "safetensors writer: %s: tensor '%s' is %s, and a part "
                     "of %s was given", w->path, it->name, want, ur_dtype_name(ur_tensor_dtype(part)));
  if (it->given + n > size)
    return ur__error(UR_STATUS_INVALID, "safetensors writer: %s: tensor '%s' is %s (%llu bytes); "
                     "%llu were given and a part of %llu more would pass its end", w->path,
                     it->name, want, (unsigned long long)size, (unsigned long long)it->given,
                     (unsigned long long)n);
  uint64_t at = w->data_start + it->begin + it->given;
  /* A part is appended to the bytes given, so the checksum runs over them in order; it is kept
   * only when the whole part was written. */
  uint32_t crc = it->crc;
  w->crc = &crc;
  ur_status s;
  if (staged(part)) {
    w->sg.stream = stream ? stream->handle : NULL;
    /* kernels still writing the part must finish before its bytes are read */
    s = ur__gpu() ? ur__gpu()->device_sync() : UR_STATUS_OK;
    if (!s) s = write_staged(w, it->name, part, at);
  } else {
    s = write_at(w, ur_tensor_data(part), n, at);
  }
  w->crc = NULL;
  if (!s) {
    it->given += n;
    it->crc = crc;
  }
  return s;
}

ur_status ur_safetensors_writer_close(ur_safetensors_writer *w) {
  UR__ARGS(w);
  ur_status s = UR_STATUS_OK;
  for (int32_t i = 0; !s && i < w->n; i++) {
    const item *it = &w->items[i];
    if (it->given != it->end - it->begin) {
      char want[192];
      entry_text(it, want, sizeof want);
      s = ur__error(UR_STATUS_INVALID, "safetensors writer: %s: tensor '%s' is %s (%llu bytes) "
                    "and %llu were given; %s is unchanged", w->tmp, it->name, want,
                    (unsigned long long)(it->end - it->begin), (unsigned long long)it->given,
                    w->path);
    }
  }
  staging_done(&w->sg);
  /* The header again, now with the checksums (the same length: hex digits for hex digits). */
  if (!s && w->n > 0) {
    char *final = NULL;
    size_t flen = 0;
    s = build_header(w->path, w->items, w->n, w->nmeta, (const char *const *)w->meta_keys,
                     (const char *const *)w->meta_values, &final, &flen);
    if (!s && flen != w->data_start)
      s = ur__error(UR_STATUS_INVALID, "safetensors: the header of %s changed length once its "
                    "checksums were known (%llu bytes, then %zu)", w->tmp,
                    (unsigned long long)w->data_start, flen);
    uint64_t done = w->done;
    if (!s) s = write_at(w, final, flen, 0);
    w->done = done; /* counted once, at open */
    free(final);
  }
  if (!s && fsync(w->fd))
    s = ur__error(UR_STATUS_IO, "safetensors: fsync of %s failed: %s; %s is unchanged", w->tmp,
                  strerror(errno), w->path);
  if (!s) {
    int fd = w->fd;
    w->fd = -1;
    if (close(fd)) {
      s = ur__error(UR_STATUS_IO, "safetensors: closing %s failed: %s; %s is unchanged", w->tmp,
                    strerror(errno), w->path);
      unlink(w->tmp);
    }
  }
  if (!s) test_delay(w->tmp, w->path);
  if (!s && rename(w->tmp, w->path)) {
    s = ur__error(UR_STATUS_IO, "safetensors: renaming %s to %s failed: %s; %s is unchanged",
                  w->tmp, w->path, strerror(errno), w->path);
    unlink(w->tmp);
  }
  if (!s) s = ur__sync_dir(w->path, "safetensors save");
  ur_safetensors_writer_free(w);
  return s;
}

ur_status ur_safetensors_save(ur_stream *stream, const char *path, int32_t n,
                              const char *const *names, const ur_tensor *const *tensors,
                              int32_t nmeta, const char *const *meta_keys,
                              const char *const *meta_values, uint64_t staging_bytes) {
  UR__ARGS(path);
  if (n > 0 && !names) return ur__null(__func__, "names");
  if (n > 0 && !tensors) return ur__null(__func__, "tensors");
  if (nmeta > 0 && !meta_keys) return ur__null(__func__, "meta_keys");
  if (nmeta > 0 && !meta_values) return ur__null(__func__, "meta_values");
  ur_safetensors_entry *entries = calloc(n > 0 ? (size_t)n : 1, sizeof *entries);
  if (!entries)
    return ur__no_memory("safetensors save: ", path, (n > 0 ? (size_t)n : 1) * sizeof *entries,
                         "the list of its %d tensors", (int)n);
  ur_status s = UR_STATUS_OK;
  for (int32_t i = 0; !s && i < n; i++) {
    if (!tensors[i]) {
      s = ur__error(UR_STATUS_INVALID, "safetensors save: tensor '%s' is NULL",
                    names[i] ? names[i] : "(null)");
      break;
    }
    ur_safetensors_entry *e = &entries[i];
    e->name = names[i];
    e->dtype = (int32_t)ur_tensor_dtype(tensors[i]);
    e->ndim = ur_tensor_ndim(tensors[i]);
    for (int32_t d = 0; d < e->ndim; d++) e->shape[d] = ur_tensor_dim(tensors[i], d);
  }
  /* Kernels still writing a tensor must finish before its bytes are read. */
  if (!s && ur__gpu()) s = ur__gpu()->device_sync();
  ur_safetensors_writer *w = NULL;
  if (!s) s = ur_safetensors_writer_open(&w, stream, path, n, entries, nmeta, meta_keys,
                                         meta_values, staging_bytes);
  /* in the file's order, so the file is written front to back */
  for (int32_t k = 0; !s && k < n; k++) {
    int32_t i = w->items[k].index;
    s = ur_safetensors_writer_put(stream, w, i, tensors[i]);
  }
  if (!s) s = ur_safetensors_writer_close(w);
  else ur_safetensors_writer_free(w);
  free(entries);
  return s;
}

/* ---- reading ---- */

/* The file's mapping outlives the file handle while views of it are alive. */
typedef struct mapping {
  void *base;
  size_t len;
  int refs; /* atomic */
} mapping;

static void mapping_release(void *ctx) {
  mapping *m = ctx;
  if (__atomic_sub_fetch(&m->refs, 1, __ATOMIC_ACQ_REL)) return;
  munmap(m->base, m->len);
  free(m);
}

struct ur_safetensors {
  char *path;
  int fd;
  mapping *map;
  uint64_t size, data_start;
  int32_t n, nmeta;
  ur_safetensors_entry *entries; /* in data order */
  int32_t *sorted;               /* entry indices by name, for lookups */
  char **meta_keys, **meta_values;
  uint32_t *crc;                 /* per entry, when the file has CRC_KEY (else NULL) */
  /* per entry, with crc: where ur_safetensors_read_part's parts read in order have reached and
   * their checksum so far (next = UINT64_MAX: no run), and whether the whole tensor's bytes were
   * found to match (a run that reached its end, or ur_safetensors_verify) */
  struct part_crc {
    uint64_t next;
    uint32_t crc;
    int checked;
  } *parts;
};

static int entry_by_name(const void *a, const void *b, void *ctx) {
  const ur_safetensors_entry *e = ctx;
  return strcmp(e[*(const int32_t *)a].name, e[*(const int32_t *)b].name);
}

static int entry_by_offset(const void *a, const void *b) {
  const ur_safetensors_entry *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return 0;
}

void ur_safetensors_close(ur_safetensors *f) {
  if (!f) return;
  for (int32_t i = 0; f->entries && i < f->n; i++) free((char *)f->entries[i].name);
  for (int32_t i = 0; f->meta_keys && i < f->nmeta; i++) {
    free(f->meta_keys[i]);
    free(f->meta_values[i]);
  }
  free(f->entries);
  free(f->sorted);
  free(f->crc);
  free(f->parts);
  free(f->meta_keys);
  free(f->meta_values);
  if (f->map) mapping_release(f->map);
  if (f->fd >= 0) close(f->fd);
  free(f->path);
  free(f);
}

static const char *json_kind(const json_t *v) {
  switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    default: return "null";
  }
}

static ur_status parse_metadata(ur_safetensors *f, json_t *m) {
  if (!json_is_object(m))
    return ur__error(UR_STATUS_FORMAT,
                     "safetensors: %s: __metadata__ is %s; expected an object of strings", f->path,
                     json_kind(m));
  size_t n = json_object_size(m);
  f->meta_keys = calloc(n + 1, sizeof(char *));
  f->meta_values = calloc(n + 1, sizeof(char *));
  if (!f->meta_keys || !f->meta_values)
    return ur__no_memory("safetensors: ", f->path, 2 * (n + 1) * sizeof(char *), "its metadata's %zu keys", n);
  const char *k;
  json_t *v;
  json_object_foreach(m, k, v) {
    if (!json_is_string(v))
      return ur__error(UR_STATUS_FORMAT,
                       "safetensors: %s: __metadata__ '%s' is %s; metadata values must be strings",
                       f->path, k, json_kind(v));
    int32_t i = f->nmeta++; /* counted first, so close() frees a half-made pair */
    f->meta_keys[i] = strdup(k);
    f->meta_values[i] = strdup(json_string_value(v));
    if (!f->meta_keys[i] || !f->meta_values[i])
      return ur__no_memory("safetensors: ", f->path, strlen(k) + strlen(json_string_value(v)) + 2,
                           "its metadata '%s'", k);
  }
  return UR_STATUS_OK;
}

static ur_status get_u64(const ur_safetensors *f, const char *name, const char *field, size_t i,
                         json_t *v, uint64_t *out) {
  if (!json_is_integer(v) || json_integer_value(v) < 0)
    return ur__error(UR_STATUS_FORMAT,
                     "safetensors: %s: tensor '%s': %s[%zu] is %s%s; expected an integer >= 0",
                     f->path, name, field, i, json_kind(v),
                     json_is_integer(v) ? " below 0" : "");
  *out = (uint64_t)json_integer_value(v);
  return UR_STATUS_OK;
}

static ur_status parse_entry(const ur_safetensors *f, const char *name, json_t *v,
                             ur_safetensors_entry *e) {
  if (!json_is_object(v))
    return ur__error(UR_STATUS_FORMAT,
                     "safetensors: %s: tensor '%s' is %s; expected an object with dtype, shape "
                     "and data_offsets", f->path, name, json_kind(v));
  const char *k;
  json_t *x;
  json_object_foreach(v, k, x) {
    if (strcmp(k, "dtype") && strcmp(k, "shape") && strcmp(k, "data_offsets"))
      return ur__error(UR_STATUS_FORMAT,
                       "safetensors: %s: tensor '%s' has an unknown field '%s'; expected dtype, "
                       "shape and data_offsets", f->path, name, k);
  }
  static const char *const fields[] = {"dtype", "shape", "data_offsets"};
  for (int i = 0; i < 3; i++)
    if (!json_object_get(v, fields[i]))
      return ur__error(UR_STATUS_FORMAT, "safetensors: %s: tensor '%s' has no %s", f->path, name,
                       fields[i]);
  json_t *dt = json_object_get(v, "dtype");
  if (!json_is_string(dt))
    return ur__error(UR_STATUS_FORMAT, "safetensors: %s: tensor '%s': dtype is %s; expected a "
                     "string", f->path, name, json_kind(dt));
  e->dtype = -1;
  for (int d = 0; d < UR_DTYPE_COUNT; d++)
    if (!strcmp(json_string_value(dt), st_dtype[d])) e->dtype = d;
  if (e->dtype < 0)
    return ur__error(UR_STATUS_FORMAT,
                     "safetensors: %s: tensor '%s' has dtype '%s', which uvmrec does not read; "
                     "expected F32, BF16, F16, I8, U8, I32, I64 or F64", f->path, name,
                     json_string_value(dt));
  json_t *shape = json_object_get(v, "shape");
  if (!json_is_array(shape))
    return ur__error(UR_STATUS_FORMAT, "safetensors: %s: tensor '%s': shape is %s; expected an "
                     "array", f->path, name, json_kind(shape));
  if (json_array_size(shape) > UR_MAX_DIMS)
    return ur__error(UR_STATUS_UNSUPPORTED,
                     "safetensors: %s: tensor '%s' has %zu dimensions; uvmrec tensors have at "
                     "most %d", f->path, name, json_array_size(shape), UR_MAX_DIMS);
  e->ndim = (int32_t)json_array_size(shape);
  for (int32_t d = 0; d < e->ndim; d++) {
    uint64_t dim;
    ur_status s = get_u64(f, name, "shape", (size_t)d, json_array_get(shape, (size_t)d), &dim);
    if (s) return s;
    e->shape[d] = (int64_t)dim; /* json_int_t: below 2^63 */
  }
  uint64_t bytes;
  ur_status s = shape_bound(f->path, name, e->dtype, e->ndim, e->shape, &bytes);
  if (s) return s;
  json_t *offs = json_object_get(v, "data_offsets");
  if (!json_is_array(offs) || json_array_size(offs) != 2)
    return ur__error(UR_STATUS_FORMAT,
                     "safetensors: %s: tensor '%s': data_offsets is %s; expected [begin, end]",
                     f->path, name, json_is_array(offs) ? "an array of other than 2" : json_kind(offs));
  s = get_u64(f, name, "data_offsets", 0, json_array_get(offs, 0), &e->begin);
  if (!s) s = get_u64(f, name, "data_offsets", 1, json_array_get(offs, 1), &e->end);
  if (s) return s;
  char sh[160];
  ur__shape_text(e->ndim, e->shape, sh, sizeof sh);
  if (e->end < e->begin)
    return ur__error(UR_STATUS_FORMAT,
                     "safetensors: %s: tensor '%s': data_offsets [%llu, %llu] end before they "
                     "begin", f->path, name, (unsigned long long)e->begin,
                     (unsigned long long)e->end);
  if (e->end - e->begin != bytes)
    return ur__error(UR_STATUS_FORMAT,
                     "safetensors: %s: tensor '%s': data_offsets [%llu, %llu] hold %llu bytes but "
                     "%s %s is %llu bytes", f->path, name, (unsigned long long)e->begin,
                     (unsigned long long)e->end, (unsigned long long)(e->end - e->begin),
                     st_dtype[e->dtype], sh, (unsigned long long)bytes);
  return UR_STATUS_OK;
}

/* The token jansson quotes in its duplicate-key message ("... near '"name"'"). */
static void duplicate_name(const char *text, char *out, size_t len) {
  const char *p = strstr(text, "near '\"");
  snprintf(out, len, "%s", p ? p + 7 : "?");
  char *q = strstr(out, "\"'");
  if (q) *q = 0;
}

static ur_status parse_header(ur_safetensors *f, const char *text, size_t len) {
  if (!len || text[0] != '{')
    return ur__error(UR_STATUS_FORMAT,
                     "safetensors: %s: the header is not valid JSON: it does not start with '{'",
                     f->path);
  json_error_t err;
  json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
  if (!root) {
    if (json_error_code(&err) == json_error_duplicate_key) {
      char dup[256];
      duplicate_name(err.text, dup, sizeof dup);
      return ur__error(UR_STATUS_FORMAT,
                       "safetensors: %s: the header names '%s' twice (at header byte %d)", f->path,
                       dup, err.position);
    }
    return ur__error(UR_STATUS_FORMAT,
                     "safetensors: %s: the header is not valid JSON: %s (at header byte %d)",
                     f->path, err.text, err.position);
  }
  ur_status s = UR_STATUS_OK;
  json_t *meta = json_object_get(root, "__metadata__");
  size_t n = json_object_size(root) - (meta ? 1 : 0);
  f->entries = calloc(n + 1, sizeof *f->entries);
  f->sorted = calloc(n + 1, sizeof *f->sorted);
  if (!f->entries || !f->sorted)
    s = ur__no_memory("safetensors: ", f->path, (n + 1) * (sizeof *f->entries + sizeof *f->sorted),
                      "its %zu tensors' entries", n);
  if (!s && meta) s = parse_metadata(f, meta);
  const char *k;
  json_t *v;
  json_object_foreach(root, k, v) {
    if (s) break;
    if (!strcmp(k, "__metadata__")) continue;
    ur_safetensors_entry *e = &f->entries[f->n];
    if ((s = parse_entry(f, k, v, e))) break;
    if (!(e->name = strdup(k))) s = ur__no_memory("safetensors: ", f->path, strlen(k) + 1, "tensor '%s''s name", k);
    else f->n++;
  }
  json_decref(root);
  return s;
}

/* Offsets must tile the data exactly, as the format demands: no gaps, no overlaps, nothing
 * past the end or left over; and each tensor aligned to its element size. */
static ur_status check_layout(ur_safetensors *f) {
  uint64_t data_len = f->size - f->data_start;
  for (int32_t i = 0; i < f->n; i++) {
    const ur_safetensors_entry *e = &f->entries[i];
    if (e->end > data_len)
      return ur__error(UR_STATUS_FORMAT,
                       "safetensors: %s: tensor '%s': data_offsets [%llu, %llu] run past the end "
                       "of the data (%llu bytes): the file is truncated or the offsets are wrong",
                       f->path, e->name, (unsigned long long)e->begin, (unsigned long long)e->end,
                       (unsigned long long)data_len);
  }
  qsort(f->entries, (size_t)f->n, sizeof *f->entries, entry_by_offset);
  uint64_t at = 0;
  for (int32_t i = 0; i < f->n; i++) {
    const ur_safetensors_entry *e = &f->entries[i];
    if (e->begin < at)
      return ur__error(UR_STATUS_FORMAT,
                       "safetensors: %s: tensor '%s' (data_offsets [%llu, %llu]) overlaps tensor "
                       "'%s' ([%llu, %llu])", f->path, e->name, (unsigned long long)e->begin,
                       (unsigned long long)e->end, f->entries[i - 1].name,
                       (unsigned long long)f->entries[i - 1].begin,
                       (unsigned long long)f->entries[i - 1].end);
    if (e->begin > at)
      return ur__error(UR_STATUS_FORMAT,
                       "safetensors: %s: data bytes %llu..%llu belong to no tensor (a gap before "
                       "tensor '%s')", f->path, (unsigned long long)at,
                       (unsigned long long)e->begin - 1, e->name);
    size_t es = ur_dtype_size((ur_dtype)e->dtype);
    if (e->end > e->begin && (f->data_start + e->begin) % es)
      return ur__error(UR_STATUS_FORMAT,
                       "safetensors: %s: tensor '%s' starts at file byte %llu, which is not "
                       "aligned to its %zu-byte elements", f->path, e->name,
                       (unsigned long long)(f->data_start + e->begin), es);
    at = e->end;
  }
  if (at != data_len)
    return ur__error(UR_STATUS_FORMAT,
                     "safetensors: %s: the tensors end at data byte %llu but the data runs to "
                     "%llu: %llu trailing bytes belong to no tensor", f->path,
                     (unsigned long long)at, (unsigned long long)data_len,
                     (unsigned long long)(data_len - at));
  return UR_STATUS_OK;
}

/* The checksums of CRC_KEY, one for every tensor (a file without the key has none to check:
 * written by another tool, or before uvmrec kept them). */
static ur_status parse_crc(ur_safetensors *f) {
  const char *text = ur_safetensors_meta_get(f, CRC_KEY);
  if (!text) return UR_STATUS_OK;
  json_error_t err;
  json_t *o = json_loads(text, JSON_REJECT_DUPLICATES, &err);
  ur_status s = UR_STATUS_OK;
  if (!json_is_object(o))
    s = ur__error(UR_STATUS_FORMAT, "safetensors: %s: __metadata__ '%s' is not an object of "
                  "checksums: %s", f->path, CRC_KEY, o ? "not an object" : err.text);
  if (!s && (!(f->crc = calloc((size_t)f->n + 1, sizeof *f->crc)) ||
             !(f->parts = calloc((size_t)f->n + 1, sizeof *f->parts))))
    s = ur__no_memory("safetensors: ", f->path, ((uint64_t)f->n + 1) * (sizeof *f->crc + sizeof *f->parts),
                      "its %d tensors' checksums", (int)f->n);
  if (!s && json_object_size(o) != (size_t)f->n)
    s = ur__error(UR_STATUS_FORMAT, "safetensors: %s: __metadata__ '%s' holds %zu checksums for "
                  "%d tensors", f->path, CRC_KEY, json_object_size(o), (int)f->n);
  const char *k;
  json_t *v;
  if (!s) json_object_foreach(o, k, v) {
    int32_t i = ur_safetensors_find(f, k);
    const char *hex = json_string_value(v);
    if (i < 0)
      s = ur__error(UR_STATUS_FORMAT, "safetensors: %s: __metadata__ '%s' names tensor '%s', "
                    "which the file does not hold", f->path, CRC_KEY, k);
    else if (!crc_parse(hex, &f->crc[i]))
      s = ur__error(UR_STATUS_FORMAT, "safetensors: %s: __metadata__ '%s': tensor '%s' has "
                    "checksum %s%s%s; expected 8 lowercase hex digits (as uvmrec writes them)",
                    f->path, CRC_KEY, k, hex ? "'" : "", hex ? hex : json_kind(v), hex ? "'" : "");
    if (s) break;
  }
  json_decref(o);
  return s;
}

/* HEADER_CRC_KEY against what the header says (a file without it has none to check). */
static ur_status check_header_crc(const ur_safetensors *f) {
  const char *hex = ur_safetensors_meta_get(f, HEADER_CRC_KEY);
  if (!hex) return UR_STATUS_OK;
  uint32_t want;
  if (!crc_parse(hex, &want))
    return ur__error(UR_STATUS_FORMAT, "safetensors: %s: __metadata__ '%s' is '%s'; expected 8 "
                     "lowercase hex digits (as uvmrec writes them)", f->path, HEADER_CRC_KEY, hex);
  kv *m = malloc(((size_t)f->nmeta + 1) * sizeof *m);
  if (!m)
    return ur__no_memory("safetensors: ", f->path, ((uint64_t)f->nmeta + 1) * sizeof *m,
                         "checking its header's checksum");
  size_t nm = 0;
  for (int32_t i = 0; i < f->nmeta; i++)
    if (strcmp(f->meta_keys[i], HEADER_CRC_KEY)) m[nm++] = (kv){f->meta_keys[i], f->meta_values[i]};
  uint32_t c = header_crc_meta(m, nm);
  free(m);
  for (int32_t i = 0; i < f->n; i++) {
    const ur_safetensors_entry *e = &f->entries[f->sorted[i]];
    c = header_crc_tensor(c, e->name, e->dtype, e->ndim, e->shape, e->begin, e->end);
  }
  if (c != want)
    return ur__error(UR_STATUS_FORMAT, "safetensors: %s: the header does not match the checksum "
                     "written with it (%s %08x, its metadata and tensors' names, dtypes, shapes "
                     "and offsets give %08x): the file is corrupted", f->path, HEADER_CRC_KEY,
                     (unsigned)want, (unsigned)c);
  return UR_STATUS_OK;
}

ur_status ur_safetensors_open(ur_safetensors **out, const char *path) {
  UR__ARGS(out, path);
  *out = NULL;
  if (!path || !*path) return ur__error(UR_STATUS_INVALID, "safetensors open: no path given");
  ur_safetensors *f = calloc(1, sizeof *f);
  if (!f || !(f->path = strdup(path))) {
    free(f);
    return ur__no_memory("safetensors: ", path, sizeof *f + strlen(path) + 1, "opening it");
  }
  ur_status s = UR_STATUS_OK;
  struct stat sb;
  f->fd = open(path, O_RDONLY | O_CLOEXEC);
  if (f->fd < 0 || fstat(f->fd, &sb))
    s = ur__error(UR_STATUS_IO, "safetensors: cannot open %s: %s", path, strerror(errno));
  else if (!S_ISREG(sb.st_mode))
    s = ur__error(UR_STATUS_IO, "safetensors: %s is not a regular file", path);
  else if ((f->size = (uint64_t)sb.st_size) < 8)
    s = ur__error(UR_STATUS_FORMAT,
                  "safetensors: %s is %llu bytes, shorter than the 8-byte header length: the file "
                  "is truncated", path, (unsigned long long)f->size);
  if (!s && !(f->map = calloc(1, sizeof *f->map)))
    s = ur__no_memory("safetensors: ", path, sizeof *f->map, "its mapping");
  if (!s) {
    /* Private and writable: a view may be written (the pages are copied on write, the file is
     * never changed); no swap is reserved for a mapping as large as the file. */
    void *p = mmap(NULL, f->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_NORESERVE, f->fd, 0);
    if (p == MAP_FAILED) {
      free(f->map);
      f->map = NULL;
      s = ur__error(UR_STATUS_IO, "safetensors: cannot map %s: %s", path, strerror(errno));
    } else {
      *f->map = (mapping){p, f->size, 1};
    }
  }
  uint64_t hlen = 0;
  if (!s) {
    const unsigned char *b = f->map->base;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)b[i] << (8 * i);
    if (hlen > HEADER_MAX)
      s = ur__error(UR_STATUS_FORMAT,
                    "safetensors: %s: header length %llu is over the %llu bytes allowed", path,
                    (unsigned long long)hlen, HEADER_MAX);
    else if (hlen > f->size - 8)
      s = ur__error(UR_STATUS_FORMAT,
                    "safetensors: %s: header length %llu runs past the end of the file (%llu "
                    "bytes): the file is truncated", path, (unsigned long long)hlen,
                    (unsigned long long)f->size);
  }
  if (!s) {
    f->data_start = 8 + hlen;
    s = parse_header(f, (const char *)f->map->base + 8, (size_t)hlen);
  }
  if (!s) s = check_layout(f);
  if (s) {
    ur_safetensors_close(f);
    return s;
  }
  for (int32_t i = 0; i < f->n; i++) f->sorted[i] = i;
  qsort_r(f->sorted, (size_t)f->n, sizeof *f->sorted, entry_by_name, f->entries);
  for (int32_t i = 0; i < f->n; i++) f->entries[i].file_offset = f->data_start + f->entries[i].begin;
  if ((s = parse_crc(f)) || (s = check_header_crc(f))) {
    ur_safetensors_close(f);
    return s;
  }
  *out = f;
  return UR_STATUS_OK;
}

const char *ur_safetensors_path(const ur_safetensors *f) {
  UR__ARGS_OR(NULL, f);
  return f->path;
}
uint64_t ur_safetensors_bytes(const ur_safetensors *f) {
  UR__ARGS_OR(0, f);
  return f->size;
}
uint64_t ur_safetensors_data_start(const ur_safetensors *f) {
  UR__ARGS_OR(0, f);
  return f->data_start;
}
int32_t ur_safetensors_count(const ur_safetensors *f) {
  UR__ARGS_OR(-1, f);
  return f->n;
}
int32_t ur_safetensors_meta_count(const ur_safetensors *f) {
  UR__ARGS_OR(-1, f);
  return f->nmeta;
}
size_t ur_sizeof_safetensors_entry(void) { return sizeof(ur_safetensors_entry); }

int32_t ur_safetensors_find(const ur_safetensors *f, const char *name) {
  UR__ARGS_OR(-1, f, name);
  int32_t lo = 0, hi = f->n - 1;
  while (name && lo <= hi) {
    int32_t mid = lo + (hi - lo) / 2;
    int c = strcmp(f->entries[f->sorted[mid]].name, name);
    if (!c) return f->sorted[mid];
    if (c < 0) lo = mid + 1;
    else hi = mid - 1;
  }
  return -1;
}

static ur_status check_index(const ur_safetensors *f, int32_t i, const char *what) {
  if (i < 0 || i >= f->n)
    return ur__error(UR_STATUS_INVALID, "safetensors %s: %s: tensor %d does not exist; the file "
                     "has %d (0-based)", what, f->path, (int)i, (int)f->n);
  return UR_STATUS_OK;
}

ur_status ur_safetensors_entry_get(const ur_safetensors *f, int32_t i, ur_safetensors_entry *out) {
  UR__ARGS(f, out);
  ur_status s = check_index(f, i, "entry");
  if (!s) *out = f->entries[i];
  return s;
}

const char *ur_safetensors_meta_key(const ur_safetensors *f, int32_t i) {
  UR__ARGS_OR(NULL, f);
  return i >= 0 && i < f->nmeta ? f->meta_keys[i] : NULL;
}

const char *ur_safetensors_meta_get(const ur_safetensors *f, const char *key) {
  UR__ARGS_OR(NULL, f, key);
  for (int32_t i = 0; key && i < f->nmeta; i++)
    if (!strcmp(f->meta_keys[i], key)) return f->meta_values[i];
  return NULL;
}

ur_status ur_safetensors_view(const ur_safetensors *f, int32_t i, ur_tensor **out) {
  UR__ARGS(f, out);
  *out = NULL;
  ur_status s = check_index(f, i, "view");
  if (s) return s;
  const ur_safetensors_entry *e = &f->entries[i];
  int64_t one = 1;
  __atomic_add_fetch(&f->map->refs, 1, __ATOMIC_RELAXED);
  s = ur__tensor_wrap(out, (ur_dtype)e->dtype, e->ndim ? e->ndim : 1, e->ndim ? e->shape : &one,
                      (char *)f->map->base + e->file_offset, mapping_release, f->map);
  if (s) {
    mapping_release(f->map);
    s = ur__error_cause(s, "safetensors: %s: a view of tensor '%s'", f->path, e->name);
  }
  return s;
}

static ur_status read_all(const ur_safetensors *f, void *dst, uint64_t n, uint64_t at) {
  char *c = dst;
  while (n) {
    ssize_t k = pread(f->fd, c, n < IO_MAX ? (size_t)n : IO_MAX, (off_t)at);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0)
      return ur__error(UR_STATUS_IO, "safetensors: reading %s at byte %llu failed: %s", f->path,
                       (unsigned long long)at, strerror(errno));
    if (k == 0)
      return ur__error(UR_STATUS_IO, "safetensors: %s ended at byte %llu while being read (was it "
                       "truncated after it was opened?)", f->path, (unsigned long long)at);
    c += k;
    n -= (uint64_t)k;
    at += (uint64_t)k;
  }
  return UR_STATUS_OK;
}

/* Tensor i's bytes give checksum c, not the one written with them. */
static ur_status crc_mismatch(const ur_safetensors *f, int32_t i, uint32_t c) {
  const ur_safetensors_entry *e = &f->entries[i];
  return ur__error(UR_STATUS_FORMAT, "safetensors: %s: tensor '%s' (file bytes %llu..%llu) does "
                   "not match the checksum written with it (crc32c %08x, its bytes give %08x): "
                   "the file is corrupted", f->path, e->name, (unsigned long long)e->file_offset,
                   (unsigned long long)(e->file_offset + e->end - e->begin), (unsigned)f->crc[i],
                   (unsigned)c);
}

/* Reads tensor i from the file a MiB at a time: its checksum checked (crc, when the file has
 * them) and its first NaN or infinity into *nonfinite (float dtypes; -1 when none; NULL: not
 * looked for). */
static ur_status scan(const ur_safetensors *f, int32_t i, int crc, int64_t *nonfinite) {
  const ur_safetensors_entry *e = &f->entries[i];
  ur_dtype d = (ur_dtype)e->dtype;
  int floats = d == UR_DTYPE_F32 || d == UR_DTYPE_BF16 || d == UR_DTYPE_F16 || d == UR_DTYPE_F64;
  if (nonfinite) *nonfinite = -1;
  if (!floats) nonfinite = NULL;
  crc = crc && f->crc;
  if (!crc && !nonfinite) return UR_STATUS_OK;
  const uint64_t chunk = (uint64_t)1 << 20; /* a multiple of every element size */
  uint64_t n = e->end - e->begin, es = ur_dtype_size(d);
  uint64_t bytes = n < chunk ? (n ? n : 1) : chunk;
  char *buf = malloc(bytes);
  if (!buf) return ur__no_memory("safetensors: ", f->path, bytes, "reading tensor '%s'", e->name);
  ur_status s = UR_STATUS_OK;
  uint32_t c = 0;
  for (uint64_t off = 0; !s && off < n; off += chunk) {
    uint64_t len = n - off < chunk ? n - off : chunk;
    if ((s = read_all(f, buf, len, e->file_offset + off))) break;
    if (crc) c = crc32c(c, buf, (size_t)len);
    if (nonfinite && *nonfinite < 0) {
      int64_t k = ur__nonfinite_first(buf, d, (int64_t)(len / es));
      if (k < (int64_t)(len / es)) {
        *nonfinite = (int64_t)(off / es) + k;
        if (!crc) break;
      }
    }
  }
  free(buf);
  if (!s && crc && c != f->crc[i]) s = crc_mismatch(f, i, c);
  return s;
}

ur_status ur_safetensors_find_nonfinite(const ur_safetensors *f, int32_t i, int64_t *out) {
  UR__ARGS(f, out);
  *out = -1;
  ur_status s = check_index(f, i, "find_nonfinite");
  return s ? s : scan(f, i, 0, out);
}

ur_status ur_safetensors_verify(const ur_safetensors *f, int32_t i, int64_t *nonfinite) {
  UR__ARGS(f);
  if (nonfinite) *nonfinite = -1;
  ur_status s = check_index(f, i, "verify");
  if (!s) s = scan(f, i, 1, nonfinite);
  if (!s && f->crc) f->parts[i].checked = 1;
  return s;
}


ur_status ur_safetensors_read_part(const ur_safetensors *f, int32_t i, ur_tensor *dst,
                                   uint64_t offset) {
  UR__ARGS(f, dst);
  ur_status s = check_index(f, i, "read_part");
  if (s) return s;
  const ur_safetensors_entry *e = &f->entries[i];
  uint64_t n = ur_tensor_nbytes(dst), size = e->end - e->begin;
  ur_place p = ur_tensor_place(dst);
  if (p != UR_PLACE_HOST && p != UR_PLACE_PINNED)
    return ur__error(UR_STATUS_INVALID, "safetensors read_part: %s: the destination of '%s' is in "
                     "%s memory; expected host or pinned", f->path, e->name, ur_place_name(p));
  if (offset > size || n > size - offset)
    return ur__error(UR_STATUS_INVALID, "safetensors read_part: %s: tensor '%s' has %llu bytes; "
                     "%llu from byte %llu pass its end", f->path, e->name,
                     (unsigned long long)size, (unsigned long long)n, (unsigned long long)offset);
  struct part_crc *pc = f->crc ? &f->parts[i] : NULL;
  if (!pc || pc->checked) return read_all(f, ur_tensor_data(dst), n, e->file_offset + offset);
  /* Parts read in order of offset from byte 0 to the end are checked against the tensor's
   * checksum at its last byte, with no second read (a read from byte 0 starts the run again).
   * Any other read checks the whole tensor first, once: a part read out of order was handed
   * out unchecked. */
  if (offset == 0) *pc = (struct part_crc){0, 0, 0};
  if (pc->next != offset) {
    pc->next = UINT64_MAX;
    if ((s = scan(f, i, 1, NULL))) return s;
    pc->checked = 1;
    return read_all(f, ur_tensor_data(dst), n, e->file_offset + offset);
  }
  if ((s = read_all(f, ur_tensor_data(dst), n, e->file_offset + offset))) return s;
  pc->crc = crc32c(pc->crc, ur_tensor_data(dst), (size_t)n);
  pc->next += n;
  if (pc->next != size) return UR_STATUS_OK;
  pc->next = UINT64_MAX;
  if (pc->crc != f->crc[i]) return crc_mismatch(f, i, pc->crc);
  pc->checked = 1;
  return UR_STATUS_OK;
}

static ur_status interrupted(const ur_safetensors *f, const char *name, uint64_t done) {
  return ur__error(UR_STATUS_INTERRUPTED,
                   "safetensors: reading tensor '%s' of %s interrupted after %llu bytes", name,
                   f->path, (unsigned long long)done);
}

static ur_status read_direct(const ur_safetensors *f, const ur_safetensors_entry *e, char *dst) {
  uint64_t n = e->end - e->begin;
  for (uint64_t off = 0; off < n; off += DIRECT_CHUNK) {
    if (ur_interrupt_get()) return interrupted(f, e->name, off);
    uint64_t len = n - off < DIRECT_CHUNK ? n - off : DIRECT_CHUNK;
    ur_status s = read_all(f, dst + off, len, e->file_offset + off);
    if (s) return s;
  }
  return UR_STATUS_OK;
}

/* The file read of chunk k overlaps the copy of chunk k-1 out of the other half. */
static ur_status read_staged(const ur_safetensors *f, const ur_safetensors_entry *e, staging *sg,
                             char *dst) {
  uint64_t n = e->end - e->begin;
  if (!n) return UR_STATUS_OK;
  ur_status s = staging_ready(sg, "safetensors: ", f->path, e->name);
  int cur = 0;
  for (uint64_t off = 0; !s && off < n; off += sg->chunk) {
    if (ur_interrupt_get()) return interrupted(f, e->name, off);
    size_t len = n - off < sg->chunk ? (size_t)(n - off) : sg->chunk;
    if ((s = read_all(f, sg->half[cur], len, e->file_offset + off))) break;
    if ((s = sg->b->stream_sync(sg->stream))) break;
    s = sg->b->copy(sg->stream, dst + off, sg->half[cur], len);
    cur ^= 1;
  }
  return s ? s : sg->b->stream_sync(sg->stream);
}

static int same_shape(const ur_safetensors_entry *e, const ur_tensor *t) {
  if (e->dtype != (int32_t)ur_tensor_dtype(t)) return 0;
  if (e->ndim == 0) return ur_tensor_ndim(t) == 1 && ur_tensor_dim(t, 0) == 1;
  if (e->ndim != ur_tensor_ndim(t)) return 0;
  for (int32_t d = 0; d < e->ndim; d++)
    if (e->shape[d] != ur_tensor_dim(t, d)) return 0;
  return 1;
}

ur_status ur_safetensors_load(ur_stream *stream, const ur_safetensors *f, int32_t n,
                              const char *const *names, ur_tensor *const *dsts,
                              uint64_t staging_bytes) {
  UR__ARGS(f);
  if (n > 0 && !names) return ur__null(__func__, "names");
  if (n > 0 && !dsts) return ur__null(__func__, "dsts");
  if (n < 0) return ur__error(UR_STATUS_INVALID, "safetensors load: %d tensors asked", (int)n);
  int32_t *idx = calloc((size_t)n + 1, sizeof *idx);
  if (!idx)
    return ur__no_memory("safetensors: ", f->path, ((uint64_t)n + 1) * sizeof *idx, "loading %d tensor%s", (int)n,
                         ur__s(n));
  ur_status s = UR_STATUS_OK;
  /* Everything is checked before anything is written, so a mismatch changes nothing. */
  for (int32_t i = 0; !s && i < n; i++) {
    idx[i] = ur_safetensors_find(f, names[i]);
    if (!dsts[i])
      s = ur__error(UR_STATUS_INVALID, "safetensors load: %s: the destination of '%s' is NULL",
                    f->path, names[i] ? names[i] : "(null)");
    else if (idx[i] < 0)
      s = ur__error(UR_STATUS_INVALID, "safetensors load: %s has no tensor '%s'", f->path,
                    names[i] ? names[i] : "(null)");
    else if (!same_shape(&f->entries[idx[i]], dsts[i])) {
      char a[192], b[192];
      const ur_safetensors_entry *e = &f->entries[idx[i]];
      int n0 = snprintf(a, sizeof a, "%s ", st_dtype[e->dtype]);
      ur__shape_text(e->ndim, e->shape, a + n0, sizeof a - (size_t)n0);
      tensor_text(dsts[i], b, sizeof b);
      s = ur__error(UR_STATUS_INVALID,
                    "safetensors load: %s: tensor '%s' is %s in the file but the destination is "
                    "%s", f->path, names[i], a, b);
    }
  }
  if (!s && ur__gpu()) s = ur__gpu()->device_sync();
  staging sg;
  staging_init(&sg, stream, staging_bytes);
  for (int32_t i = 0; !s && i < n; i++) {
    const ur_safetensors_entry *e = &f->entries[idx[i]];
    char *dst = ur_tensor_data(dsts[i]);
    s = staged(dsts[i]) ? read_staged(f, e, &sg, dst) : read_direct(f, e, dst);
  }
  staging_done(&sg);
  free(idx);
  return s;
}
