/* npy.c: .npy arrays: a strict header parser (the fuzzed one), files mapped for reading, and
 * writers (whole tensors, and a streaming one whose shape is filled in when it closes). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "data/data.h"

size_t ur_sizeof_npy_info(void) { return sizeof(ur_npy_info); }

static ur_status bad(const char *what, const char *fmt, const char *detail) {
  return ur__error(UR_STATUS_FORMAT, "npy: %s: %s%s", what, fmt, detail ? detail : "");
}

typedef struct cursor {
  const char *p, *end;
} cursor;

static void skip_ws(cursor *c) {
  while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r')) c->p++;
}

static int take(cursor *c, char ch) {
  skip_ws(c);
  if (c->p < c->end && *c->p == ch) {
    c->p++;
    return 1;
  }
  return 0;
}

/* A Python string literal in quotes ('...' or "..."), without escapes, up to cap-1 bytes. */
static int quoted(cursor *c, char *out, size_t cap) {
  skip_ws(c);
  if (c->p >= c->end || (*c->p != '\'' && *c->p != '"')) return 0;
  char q = *c->p++;
  size_t n = 0;
  while (c->p < c->end && *c->p != q) {
    if (*c->p == '\\' || n + 1 >= cap) return 0;
    out[n++] = *c->p++;
  }
  if (c->p >= c->end) return 0;
  c->p++;
  out[n] = 0;
  return 1;
}

static int word(cursor *c, const char *w) {
  skip_ws(c);
  size_t n = strlen(w);
  if ((size_t)(c->end - c->p) >= n && !memcmp(c->p, w, n)) {
    c->p += n;
    return 1;
  }
  return 0;
}

ur_status ur_npy_parse_header(const void *buf, size_t len, const char *what, ur_npy_info *out) {
  UR__ARGS(buf, out);
  const unsigned char *b = buf;
  memset(out, 0, sizeof *out);
  if (!what) what = "(buffer)";
  if (len < 10 || memcmp(b, "\x93NUMPY", 6))
    return bad(what, "not a .npy file (no \\x93NUMPY magic)", NULL);
  int major = b[6], minor = b[7];
  uint64_t hlen, start;
  if (major == 1) {
    hlen = (uint64_t)b[8] | (uint64_t)b[9] << 8;
    start = 10;
  } else if (major == 2 || major == 3) {
    if (len < 12) return bad(what, "header truncated", NULL);
    hlen = (uint64_t)b[8] | (uint64_t)b[9] << 8 | (uint64_t)b[10] << 16 | (uint64_t)b[11] << 24;
    start = 12;
  } else {
    char v[32];
    snprintf(v, sizeof v, "%d.%d", major, minor);
    return bad(what, "unsupported format version ", v);
  }
  if (minor != 0) return bad(what, "unsupported format minor version (expected x.0)", NULL);
  if (hlen > len - start) {
    char d[96];
    snprintf(d, sizeof d, " (%llu header bytes announced, %llu present)", (unsigned long long)hlen,
             (unsigned long long)(len - start));
    return bad(what, "header truncated", d);
  }
  out->header_bytes = start + hlen;
  cursor c = {(const char *)b + start, (const char *)b + start + hlen};
  int have_descr = 0, have_order = 0, have_shape = 0;
  if (!take(&c, '{')) return bad(what, "header is not a dict", NULL);
  for (;;) {
    char key[32];
    if (take(&c, '}')) break;
    if (!quoted(&c, key, sizeof key)) return bad(what, "header: expected a quoted key", NULL);
    if (!take(&c, ':')) return bad(what, "header: expected ':' after key ", key);
    if (!strcmp(key, "descr")) {
      if (have_descr++) return bad(what, "header: 'descr' given twice", NULL);
      char d[16];
      if (!quoted(&c, d, sizeof d)) return bad(what, "header: 'descr' is not a dtype string", NULL);
      if (strcmp(d, "<f4") && strcmp(d, "<i4") && strcmp(d, "<u4") && strcmp(d, "<i8")) {
        char m[64];
        snprintf(m, sizeof m, "'%s'; expected '<f4', '<i4', '<u4' or '<i8'", d);
        return bad(what, "dtype ", m);
      }
      memcpy(out->descr, d, 4);
      out->item_bytes = d[1] == 'i' && d[2] == '8' ? 8 : 4;
    } else if (!strcmp(key, "fortran_order")) {
      if (have_order++) return bad(what, "header: 'fortran_order' given twice", NULL);
      if (word(&c, "False")) out->fortran_order = 0;
      else if (word(&c, "True")) out->fortran_order = 1;
      else return bad(what, "header: 'fortran_order' is not True or False", NULL);
    } else if (!strcmp(key, "shape")) {
      if (have_shape++) return bad(what, "header: 'shape' given twice", NULL);
      if (!take(&c, '(')) return bad(what, "header: 'shape' is not a tuple", NULL);
      int n = 0;
      for (;;) {
        if (take(&c, ')')) break;
        skip_ws(&c);
        if (c.p >= c.end || *c.p < '0' || *c.p > '9')
          return bad(what, "header: 'shape' holds something other than sizes", NULL);
        uint64_t v = 0;
        while (c.p < c.end && *c.p >= '0' && *c.p <= '9') {
          v = v * 10 + (uint64_t)(*c.p++ - '0');
          if (v > (1ull << 50)) return bad(what, "header: a size in 'shape' is too large", NULL);
        }
        if (n == 4) return bad(what, "header: 'shape' has more than 4 dimensions", NULL);
        out->shape[n++] = (int64_t)v;
        if (!take(&c, ',')) {
          if (!take(&c, ')')) return bad(what, "header: 'shape' is not a tuple", NULL);
          break;
        }
      }
      out->ndim = n;
    } else {
      return bad(what, "header: unexpected key ", key);
    }
    if (!take(&c, ',')) {
      if (!take(&c, '}')) return bad(what, "header: expected ',' or '}'", NULL);
      break;
    }
  }
  skip_ws(&c);
  if (c.p != c.end) return bad(what, "header: text after the dict", NULL);
  if (!have_descr || !have_order || !have_shape)
    return bad(what, "header lacks ",
               !have_descr ? "'descr'" : !have_order ? "'fortran_order'" : "'shape'");
  if (out->fortran_order && out->ndim > 1)
    return bad(what, "fortran (column-major) order is not supported; save it in C order", NULL);
  uint64_t total = out->item_bytes;
  for (int i = 0; i < out->ndim; i++)
    if (__builtin_mul_overflow(total, (uint64_t)out->shape[i], &total) || total > (1ull << 50))
      return bad(what, "header: the shape's size overflows", NULL);
  return UR_STATUS_OK;
}

uint64_t ur__npy_numel(const ur_npy_info *info) {
  uint64_t n = 1;
  for (int i = 0; i < info->ndim; i++) n *= (uint64_t)info->shape[i];
  return n;
}

ur_status ur__npy_map(const char *path, ur__npy_map_t *m) {
  memset(m, 0, sizeof *m);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ur__error(UR_STATUS_IO, "npy: %s: cannot open: %s", path, strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb)) {
    close(fd);
    return ur__error(UR_STATUS_IO, "npy: %s: cannot stat: %s", path, strerror(errno));
  }
  m->file_bytes = (uint64_t)sb.st_size;
  if (m->file_bytes) {
    m->base = mmap(NULL, m->file_bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (m->base == MAP_FAILED) {
      m->base = NULL;
      close(fd);
      return ur__error(UR_STATUS_IO, "npy: %s: cannot map: %s", path, strerror(errno));
    }
  }
  close(fd);
  ur_status st = ur_npy_parse_header(m->base ? m->base : "", m->file_bytes, path, &m->info);
  if (!st) {
    uint64_t want = ur__npy_numel(&m->info) * m->info.item_bytes;
    uint64_t have = m->file_bytes - m->info.header_bytes;
    if (have < want)
      st = ur__error(UR_STATUS_FORMAT,
                     "npy: %s: truncated: the header's shape needs %llu data bytes but %llu follow",
                     path, (unsigned long long)want, (unsigned long long)have);
    else if (have > want) /* numpy writes none: a header whose shape is not the data's */
      st = ur__error(UR_STATUS_FORMAT,
                     "npy: %s: the header's shape needs %llu data bytes but %llu follow; expected "
                     "exactly those", path, (unsigned long long)want, (unsigned long long)have);
  }
  if (st) {
    ur__npy_unmap(m);
    return st;
  }
  m->data = (const char *)m->base + m->info.header_bytes;
  return UR_STATUS_OK;
}

void ur__npy_unmap(ur__npy_map_t *m) {
  if (m->base) munmap(m->base, m->file_bytes);
  memset(m, 0, sizeof *m);
}

ur_status ur_npy_load(ur_tensor **out, const char *path) {
  UR__ARGS(out, path);
  *out = NULL;
  ur__npy_map_t m;
  ur_status st = ur__npy_map(path, &m);
  if (st) return st;
  int64_t shape[4] = {1};
  int nd = m.info.ndim ? m.info.ndim : 1;
  for (int i = 0; i < m.info.ndim; i++) shape[i] = m.info.shape[i];
  const char *d = m.info.descr;
  ur_dtype dt = d[1] == 'f' ? UR_DTYPE_F32 : d[1] == 'i' && d[2] == '4' ? UR_DTYPE_I32 : UR_DTYPE_I64;
  if ((st = ur_tensor_new(out, dt, nd, shape, UR_PLACE_HOST, UR_LOC_CPU))) {
    ur__npy_unmap(&m);
    return st;
  }
  uint64_t n = ur__npy_numel(&m.info);
  if (d[1] == 'u') {
    int64_t *o = ur_tensor_data(*out);
    const uint32_t *s = (const uint32_t *)m.data;
    for (uint64_t i = 0; i < n; i++) {
      uint32_t v;
      memcpy(&v, s + i, 4);
      o[i] = v;
    }
  } else {
    memcpy(ur_tensor_data(*out), m.data, n * m.info.item_bytes);
  }
  ur__npy_unmap(&m);
  return UR_STATUS_OK;
}

/* A version 1.0 header padded to exactly `total` bytes (a multiple of 64), ending in '\n'. */
static ur_status header_text(char *buf, size_t total, const char *descr, int ndim,
                             const int64_t *shape) {
  char sh[160];
  size_t n = 0;
  sh[0] = 0;
  for (int i = 0; i < ndim; i++)
    n += (size_t)snprintf(sh + n, sizeof sh - n, "%lld,%s", (long long)shape[i],
                          i + 1 < ndim ? " " : "");
  if (ndim > 1 && n) sh[n - 1] = 0; /* (a, b) but (a,) */
  char dict[256];
  int len = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }",
                     descr, sh);
  if (len < 0 || (size_t)len + 11 > total)
    return ur__error(UR_STATUS_INVALID, "npy: header too long");
  memcpy(buf, "\x93NUMPY\x01\x00", 8);
  uint16_t hl = (uint16_t)(total - 10);
  buf[8] = (char)(hl & 0xff);
  buf[9] = (char)(hl >> 8);
  memcpy(buf + 10, dict, (size_t)len);
  memset(buf + 10 + len, ' ', total - 10 - (size_t)len - 1);
  buf[total - 1] = '\n';
  return UR_STATUS_OK;
}

ur_status ur__npy_writer_open(ur__npy_writer *w, const char *path, const char *descr, int ndim,
                              const int64_t *inner) {
  memset(w, 0, sizeof *w);
  if (strlen(path) >= sizeof w->path)
    return ur__error(UR_STATUS_INVALID, "npy: a path of %zu bytes is too long", strlen(path));
  snprintf(w->path, sizeof w->path, "%s", path);
  snprintf(w->tmp, sizeof w->tmp, "%s.tmp-XXXXXX", path);
  snprintf(w->descr, sizeof w->descr, "%s", descr);
  w->ndim = ndim;
  for (int i = 1; i < ndim; i++) w->inner[i] = inner[i];
  int fd = mkostemp(w->tmp, O_CLOEXEC);
  if (fd < 0) {
    w->tmp[0] = 0;
    return ur__error(UR_STATUS_IO, "npy: cannot create %s (a temporary file beside it): %s", path,
                     strerror(errno));
  }
  if (fchmod(fd, 0644) || !(w->f = fdopen(fd, "wb"))) {
    ur_status st = ur__error(UR_STATUS_IO, "npy: cannot write %s: %s", w->tmp, strerror(errno));
    close(fd);
    unlink(w->tmp);
    w->tmp[0] = 0;
    return st;
  }
  char h[UR__NPY_HEADER];
  int64_t shape[4] = {0, w->inner[1], w->inner[2], w->inner[3]};
  ur_status st = header_text(h, sizeof h, descr, ndim, shape);
  if (!st && fwrite(h, 1, sizeof h, w->f) != sizeof h)
    st = ur__error(UR_STATUS_IO, "npy: %s: write failed: %s", w->tmp, strerror(errno));
  if (st) ur__npy_writer_abort(w);
  return st;
}

ur_status ur__npy_writer_append(ur__npy_writer *w, const void *data, int64_t rows,
                                size_t row_bytes) {
  if (rows && fwrite(data, row_bytes, (size_t)rows, w->f) != (size_t)rows)
    return ur__error(UR_STATUS_IO, "npy: %s: write failed: %s", w->tmp, strerror(errno));
  w->rows += rows;
  return UR_STATUS_OK;
}

ur_status ur__npy_writer_close(ur__npy_writer *w) {
  if (!w->f) return UR_STATUS_OK;
  char h[UR__NPY_HEADER];
  int64_t shape[4] = {w->rows, w->inner[1], w->inner[2], w->inner[3]};
  ur_status st = header_text(h, sizeof h, w->descr, w->ndim, shape);
  if (!st && (fseek(w->f, 0, SEEK_SET) || fwrite(h, 1, sizeof h, w->f) != sizeof h ||
              fflush(w->f) || fsync(fileno(w->f))))
    st = ur__error(UR_STATUS_IO, "npy: %s: write failed: %s", w->tmp, strerror(errno));
  if (fclose(w->f) && !st)
    st = ur__error(UR_STATUS_IO, "npy: %s: close failed: %s", w->tmp, strerror(errno));
  w->f = NULL;
  return st;
}

ur_status ur__npy_writer_commit(ur__npy_writer *w) {
  if (w->f || !w->tmp[0])
    return ur__error(UR_STATUS_INVALID, "npy: %s: committed before it was closed", w->path);
  if (rename(w->tmp, w->path))
    return ur__error(UR_STATUS_IO, "npy: renaming %s to %s failed: %s", w->tmp, w->path,
                     strerror(errno));
  w->tmp[0] = 0;
  return UR_STATUS_OK;
}

void ur__npy_writer_abort(ur__npy_writer *w) {
  if (w->f) fclose(w->f);
  w->f = NULL;
  if (w->tmp[0]) unlink(w->tmp);
  w->tmp[0] = 0;
}

/* Close, rename and sync the folder: one file made whole. */
static ur_status writer_finish(ur__npy_writer *w) {
  ur_status st = ur__npy_writer_close(w);
  if (!st) st = ur__npy_writer_commit(w);
  if (!st) st = ur__sync_dir(w->path, "npy");
  ur__npy_writer_abort(w);
  return st;
}

ur_status ur_npy_save(const char *path, const ur_tensor *t, const char *descr) {
  UR__ARGS(path, t);
  ur_dtype dt = ur_tensor_dtype(t);
  const char *want = dt == UR_DTYPE_F32 ? "<f4" : dt == UR_DTYPE_I32 ? "<i4" : dt == UR_DTYPE_I64 ? "<i8" : NULL;
  if (!want)
    return ur__error(UR_STATUS_INVALID, "npy save: %s tensors are not saved; f32, i32 or i64",
                     ur_dtype_name(dt));
  if (descr && *descr) {
    if (!(dt == UR_DTYPE_I32 && !strcmp(descr, "<u4")) && strcmp(descr, want))
      return ur__error(UR_STATUS_INVALID, "npy save: a %s tensor cannot be saved as '%s'",
                       ur_dtype_name(dt), descr);
    want = descr;
  }
  int64_t inner[4] = {0};
  int nd = ur_tensor_ndim(t);
  size_t row = ur_dtype_size(dt);
  for (int i = 1; i < nd; i++) {
    inner[i] = ur_tensor_dim(t, i);
    row *= (size_t)inner[i];
  }
  ur__npy_writer w;
  ur_status st = ur__npy_writer_open(&w, path, want, nd, inner);
  if (st) return st;
  int64_t rows = ur_tensor_dim(t, 0);
  size_t bytes = row * (size_t)rows;
  void *buf = malloc(bytes ? bytes : 1);
  if (!buf) {
    ur__npy_writer_abort(&w);
    return ur__error(UR_STATUS_OOM, "npy save: out of host memory");
  }
  st = ur_tensor_read(t, 0, ur_tensor_numel(t), buf);
  if (!st) st = ur__npy_writer_append(&w, buf, rows, row);
  free(buf);
  if (st) {
    ur__npy_writer_abort(&w);
    return st;
  }
  return writer_finish(&w);
}

/* ---- the public streaming writer ---- */

struct ur_npy_writer {
  ur__npy_writer w;
  int64_t inner;  /* elements per row */
  char kind;      /* 'f', 'i' or 'u' */
  size_t item;
  void *buf;
  size_t cap;
};

ur_status ur_npy_writer_open(ur_npy_writer **out, const char *path, const char *descr, int32_t ndim,
                             const int64_t *shape) {
  UR__ARGS(out, path, descr, shape);
  *out = NULL;
  if (strcmp(descr, "<f4") && strcmp(descr, "<i4") && strcmp(descr, "<u4") && strcmp(descr, "<i8"))
    return ur__error(UR_STATUS_INVALID, "npy writer: dtype '%s'; expected <f4, <i4, <u4 or <i8",
                     descr);
  if (ndim < 1 || ndim > 4)
    return ur__error(UR_STATUS_INVALID, "npy writer: %d dimensions; expected 1..4", (int)ndim);
  ur_npy_writer *w = calloc(1, sizeof *w);
  if (!w) return ur__error(UR_STATUS_OOM, "npy writer: out of host memory");
  int64_t inner[4] = {0};
  w->inner = 1;
  for (int i = 1; i < ndim; i++) {
    if (shape[i] < 0) {
      free(w);
      return ur__error(UR_STATUS_INVALID, "npy writer: dimension %d is %lld", i + 1,
                       (long long)shape[i]);
    }
    inner[i] = shape[i];
    w->inner *= shape[i];
  }
  w->kind = descr[1];
  w->item = descr[1] == 'i' && descr[2] == '8' ? 8 : 4;
  ur_status st = ur__npy_writer_open(&w->w, path, descr, ndim, inner);
  if (st) {
    free(w);
    return st;
  }
  *out = w;
  return UR_STATUS_OK;
}

/* Elements i0..i1 to 32 bits: src i64 or f32 (a whole number), checked against the range of
 * <i4 or <u4; the lowest bad index is kept. */
typedef struct narrow_job {
  const void *src;
  void *dst;
  int from_f32, to_u;
  int64_t bad;
} narrow_job;

static void narrow_range(void *ctx, size_t i0, size_t i1) {
  narrow_job *j = ctx;
  int64_t lo = j->to_u ? 0 : INT32_MIN, hi = j->to_u ? (int64_t)UINT32_MAX : INT32_MAX;
  uint32_t *d = j->dst;
  for (size_t i = i0; i < i1; i++) {
    int64_t v;
    if (j->from_f32) {
      float f = ((const float *)j->src)[i];
      /* the range first: converting NaN or a float past int64 is undefined */
      v = f >= -9.2e18f && f <= 9.2e18f ? (int64_t)f : INT64_MIN;
      if (v != INT64_MIN && (float)v != f) v = INT64_MIN; /* not whole */
    } else {
      v = ((const int64_t *)j->src)[i];
    }
    if (v < lo || v > hi) {
      ur__atomic_min(&j->bad, (int64_t)i);
      continue;
    }
    d[i] = (uint32_t)v;
  }
}

ur_status ur_npy_writer_append(ur_npy_writer *w, const ur_tensor *t) {
  UR__ARGS(w);
  if (!t) return ur__null(__func__, "rows");
  int64_t n = ur_tensor_numel(t), rows = ur_tensor_dim(t, 0);
  if (rows * w->inner != n)
    return ur__error(UR_STATUS_INVALID,
                     "npy writer: %s: %lld elements are not %lld rows of %lld", w->w.path,
                     (long long)n, (long long)rows, (long long)w->inner);
  size_t bytes = (size_t)n * w->item;
  if (bytes > w->cap) {
    void *b = realloc(w->buf, bytes);
    if (!b) return ur__error(UR_STATUS_OOM, "npy writer: out of host memory");
    w->buf = b;
    w->cap = bytes;
  }
  ur_dtype dt = ur_tensor_dtype(t);
  int same = (w->kind == 'f' && dt == UR_DTYPE_F32) || (w->kind == 'i' && w->item == 4 && dt == UR_DTYPE_I32) ||
             (w->kind == 'i' && w->item == 8 && dt == UR_DTYPE_I64);
  ur_status st;
  if (same) {
    if ((st = ur_tensor_read(t, 0, n, w->buf))) return st;
  } else if ((dt == UR_DTYPE_I64 || (dt == UR_DTYPE_F32 && w->kind != 'f')) && w->item == 4 &&
             ur_tensor_place(t) != UR_PLACE_DEVICE) {
    /* ids (i64) and labels (f32) to 32-bit integers, datagen's common cases: checked, on every
     * core, the first bad element named */
    if ((st = ur__tensor_ready(ur__cpu(), t))) return st;
    narrow_job j = {ur_tensor_data(t), w->buf, dt == UR_DTYPE_F32, w->kind == 'u', INT64_MAX};
    ur__parallel_for((size_t)n, (size_t)1 << 16, narrow_range, &j);
    if (j.bad < INT64_MAX) {
      double v = j.from_f32 ? (double)((const float *)j.src)[j.bad] : (double)((const int64_t *)j.src)[j.bad];
      return ur__error(UR_STATUS_INVALID, "npy writer: %s: value %.17g (element %lld) does not fit %s",
                       w->w.path, v, (long long)j.bad, w->w.descr);
    }
  } else {
    size_t es = ur_dtype_size(dt);
    void *raw = malloc((size_t)n * es + 1);
    if (!raw) return ur__error(UR_STATUS_OOM, "npy writer: out of host memory");
    if ((st = ur_tensor_read(t, 0, n, raw))) {
      free(raw);
      return st;
    }
    double lo = w->kind == 'u' ? 0 : w->item == 8 ? -9.3e18 : -2147483648.0;
    double hi = w->kind == 'u' ? 4294967295.0 : w->item == 8 ? 9.2e18 : 2147483647.0;
    for (int64_t i = 0; i < n; i++) {
      double v = ur__load(raw, dt, (size_t)i);
      if (w->kind == 'f') {
        ((float *)w->buf)[i] = (float)v;
        continue;
      }
      if (!(v >= lo && v <= hi) || v != (double)(int64_t)v) {
        free(raw);
        return ur__error(UR_STATUS_INVALID, "npy writer: %s: value %.17g (element %lld) does not fit %s",
                         w->w.path, v, (long long)i, w->w.descr);
      }
      if (w->item == 8) ((int64_t *)w->buf)[i] = (int64_t)v;
      else if (w->kind == 'u') ((uint32_t *)w->buf)[i] = (uint32_t)(int64_t)v;
      else ((int32_t *)w->buf)[i] = (int32_t)v;
    }
    free(raw);
  }
  return ur__npy_writer_append(&w->w, w->buf, rows, (size_t)w->inner * w->item);
}

ur_status ur_npy_writer_close(ur_npy_writer *w) {
  UR__ARGS(w);
  if (!w) return UR_STATUS_OK;
  ur_status st = writer_finish(&w->w);
  free(w->buf);
  free(w);
  return st;
}
