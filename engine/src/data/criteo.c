/* criteo.c: the Criteo raw TSV reader.  Files (plain or gzip'd) are read in large chunks;
 * each chunk is split into lines on one thread and the lines are parsed on all of them.
 * Workers only mark bad lines; the first one is parsed again on the calling thread to word
 * the error, so messages stay thread-local and parsing stays free of formatting. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>
#include "data/data.h"

#define NDENSE 13
#define NCAT 26
#define NFIELDS 40
#define MAX_LINE (1 << 20)  /* a real line is under 500 bytes */
#define LOG_TABLE 16384

size_t ur_sizeof_criteo_opts(void) { return sizeof(ur_criteo_opts); }
size_t ur_sizeof_criteo_stats(void) { return sizeof(ur_criteo_stats); }

static float log_table[LOG_TABLE];
static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static void log_init(void) {
  for (int i = 0; i < LOG_TABLE; i++) log_table[i] = (float)log((double)i + 1.0);
}

/* log(x + 1) of x clamped to 0, computed in double and rounded to f32. */
static inline float dense_of(int64_t v) {
  if (v <= 0) return 0.0f;
  if (v < LOG_TABLE) return log_table[v];
  return (float)log((double)v + 1.0);
}

static void shown(char *out, size_t cap, const char *s, size_t n) {
  size_t k = 0;
  for (size_t i = 0; i < n && k + 4 < cap; i++) {
    unsigned char c = (unsigned char)s[i];
    if (i == 24) {
      memcpy(out + k, "...", 3);
      k += 3;
      break;
    }
    out[k++] = c >= 32 && c < 127 ? (char)c : '?';
  }
  out[k] = 0;
}

static const char *field_name(int f, char *buf) { /* buf: 16 bytes */
  if (f == 0) return "label";
  if (f <= NDENSE) snprintf(buf, 16, "I%d", f);
  else snprintf(buf, 16, "C%d", f - NDENSE);
  return buf;
}

/* Parses one line (no newline).  Returns 0, or 1 with msg (when given) saying why. */
static int parse(const char *s, size_t len, int pad, int32_t *label, float *dense,
                 uint32_t *cats, int *padded, char *msg, size_t cap) {
  const char *p = s, *end = s + len;
  const char *fq = p;
  int f = 0;
  char fb[16], val[32];
  *padded = 0;
  if (len && s[len - 1] == '\r') {
    if (msg) snprintf(msg, cap, "ends with a carriage return (CRLF line endings; convert with dos2unix)");
    return 1;
  }
  for (;;) {
    const char *q = p;
    while (q < end && *q != '\t') q++;
    size_t n = (size_t)(q - p);
    fq = q;
    if (f == 0) {
      if (n != 1 || (p[0] != '0' && p[0] != '1')) {
        if (msg) {
          shown(val, sizeof val, p, n);
          snprintf(msg, cap, "label is '%s'; expected 0 or 1", val);
        }
        return 1;
      }
      *label = p[0] - '0';
    } else if (f <= NDENSE) {
      int64_t v = 0;
      if (n) {
        const char *d = p;
        int neg = *d == '-';
        if (neg) d++;
        if (d == q) goto not_int;
        /* Every character is a digit before the value is judged; past 10^10 it stops growing
         * (it is out of range then), so leading zeros count for nothing and nothing overflows. */
        for (; d < q; d++) {
          if (*d < '0' || *d > '9') goto not_int;
          if (v < 10000000000LL) v = v * 10 + (*d - '0');
        }
        if (neg) v = -v;
        if (v > 2147483647 || v < -2147483647 - 1) goto overflow;
      }
      dense[f - 1] = dense_of(v);
    } else if (f < NFIELDS) {
      uint32_t v = 0;
      /* Every character is a hex digit before the count is judged ('0x1234abcd' is not hex). */
      for (const char *d = p; d < q; d++) {
        unsigned c = (unsigned char)*d, x;
        if (c - '0' < 10) x = c - '0';
        else if ((c | 32) - 'a' < 6) x = (c | 32) - 'a' + 10;
        else {
          if (msg) {
            shown(val, sizeof val, p, n);
            snprintf(msg, cap, "field %s is '%s': not hexadecimal", field_name(f, fb), val);
          }
          return 1;
        }
        v = v << 4 | x;
      }
      if (n > 8) {
        if (msg) {
          shown(val, sizeof val, p, n);
          snprintf(msg, cap, "field %s is '%s': %zu hex digits, more than 32 bits", field_name(f, fb),
                   val, n);
        }
        return 1;
      }
      cats[f - NDENSE - 1] = v;
    }
    f++;
    if (q == end) break;
    p = q + 1;
    if (f == NFIELDS) { /* a 41st field begins: count them all for the message */
      int total = f + 1;
      for (const char *r = p; r < end; r++) total += *r == '\t';
      if (msg) snprintf(msg, cap, "has %d fields; expected %d", total, NFIELDS);
      return 1;
    }
  }
  if (f < NFIELDS) {
    if (pad && f >= 1 + NDENSE + 1) {
      for (; f < NFIELDS; f++) {
        if (f <= NDENSE) dense[f - 1] = 0;
        else cats[f - NDENSE - 1] = 0;
      }
      *padded = 1;
      return 0;
    }
    if (msg)
      snprintf(msg, cap, "has %d fields; expected %d%s", f, NFIELDS,
               pad ? ", or 15 to 39 with the missing ones padded" : "");
    return 1;
  }
  return 0;
not_int:
  if (msg) {
    shown(val, sizeof val, p, (size_t)(fq - p));
    snprintf(msg, cap, "field %s is '%s': not an integer", field_name(f, fb), val);
  }
  return 1;
overflow:
  if (msg) {
    shown(val, sizeof val, p, (size_t)(fq - p));
    snprintf(msg, cap, "field %s is '%s': outside 32-bit integers", field_name(f, fb), val);
  }
  return 1;
}

ur_status ur_criteo_parse_line(const char *line, size_t len, int32_t pad_missing_fields,
                               int32_t *label, float *dense, uint32_t *cats, int32_t *padded) {
  UR__ARGS(line, label, dense, cats);
  pthread_once(&log_once, log_init);
  char msg[256];
  int pd = 0;
  if (parse(line, len, pad_missing_fields, label, dense, cats, &pd, msg, sizeof msg))
    return ur__error(UR_STATUS_FORMAT, "criteo-tsv: %s", msg);
  if (padded) *padded = pd;
  return UR_STATUS_OK;
}

/* ---- the reader ---- */

enum { LINE_OK = 0, LINE_BAD = 1, LINE_LONG = 2, LINE_NO_NEWLINE = 3 };

/* How the current file's bytes ended (src_read's answer once it gives 0 bytes). */
enum { SRC_END = 1, SRC_CUT, SRC_TRAILING, SRC_FAILED };

/* The bytes of one file, plain or gzip'd.  zlib's gzread ends a file cleanly at the first bytes
 * after a member that begin no other member (its "trailing garbage"): a damaged member header
 * or anything appended read as a whole, shorter file.  So the members are inflated here, each to
 * its end, and whatever follows the last one is an error. */
typedef struct src {
  int fd;                 /* -1: no file open */
  int gzip;               /* the file begins with gzip's magic bytes */
  int zinit;              /* z holds inflate's state */
  int member;             /* a member is begun and not ended */
  int in_eof;             /* fd has no more bytes */
  int end;                /* 0, or SRC_*: why there are no more bytes */
  char why[256];          /* SRC_FAILED: what failed */
  z_stream z;
  gz_header hdr;          /* the member's header, for hdr.done: a header not read whole is no member */
  unsigned char *in;
  size_t in_cap;
  uint64_t in_bytes;      /* bytes read from fd */
  uint64_t member_at;     /* the file offset the current member begins at */
  uint64_t size;          /* the file's size (fstat; 0 for a pipe) */
} src;

struct ur_criteo_reader {
  char **paths;
  int npaths, cur;
  src in;
  ur_criteo_opts opts;
  int64_t line_no;       /* complete lines consumed in the current file */
  uint64_t file_bytes;   /* bytes read from the current file */
  int discarding;        /* skipping the rest of an overlong line */
  char *buf;
  size_t cap, len;
  /* lines of the chunk being parsed, and the rows parsed from them */
  size_t *starts;
  uint32_t *lens;
  uint8_t *status;
  size_t line_cap;
  int32_t *labels;
  float *dense;
  uint32_t *ids;
  int64_t nrows, rpos;
  int rows_file;
  int done;
  ur_status failed;
  char err[1024];
  ur_criteo_stats stats;
  double t0;                    /* ur_clock_seconds() when opened */
};

void ur_criteo_close(ur_criteo_reader *r) {
  if (!r) return;
  if (r->in.fd >= 0) close(r->in.fd);
  if (r->in.zinit) inflateEnd(&r->in.z);
  free(r->in.in);
  for (int i = 0; i < r->npaths; i++) free(r->paths[i]);
  free(r->paths);
  free(r->buf);
  free(r->starts);
  free(r->lens);
  free(r->status);
  free(r->labels);
  free(r->dense);
  free(r->ids);
  free(r);
}

ur_status ur_criteo_open(ur_criteo_reader **out, const char *const *paths, int32_t npaths,
                         const ur_criteo_opts *opts) {
  UR__ARGS(out, paths);
  *out = NULL;
  pthread_once(&log_once, log_init);
  if (npaths < 1) return ur__error(UR_STATUS_INVALID, "criteo-tsv: no input files");
  ur_criteo_reader *r = calloc(1, sizeof *r);
  if (!r) return ur__error(UR_STATUS_OOM, "criteo-tsv: out of host memory");
  r->in.fd = -1;
  if (opts) r->opts = *opts;
  for (int i = 0; i < NCAT; i++)
    if (r->opts.rows[i] > 4294967296LL) {
      long long rows = (long long)r->opts.rows[i];
      free(r);
      return ur__error(UR_STATUS_INVALID, "criteo-tsv: rows of C%d is %lld; at most 2^32", i + 1,
                       rows);
    }
  r->cap = r->opts.chunk_bytes > 0 ? (size_t)r->opts.chunk_bytes : (size_t)16 << 20;
  if (r->cap < 4096) r->cap = 4096;
  r->paths = calloc((size_t)npaths, sizeof(char *));
  r->buf = malloc(r->cap + 1);
  if (!r->paths || !r->buf) {
    ur_criteo_close(r);
    return ur__error(UR_STATUS_OOM, "criteo-tsv: out of host memory");
  }
  r->npaths = npaths;
  for (int i = 0; i < npaths; i++) {
    if (!(r->paths[i] = strdup(paths[i] ? paths[i] : ""))) {
      ur_criteo_close(r);
      return ur__error(UR_STATUS_OOM, "criteo-tsv: out of host memory");
    }
  }
  /* Every file must open before any is read, so a typo fails at once. */
  for (int i = 0; i < npaths; i++) {
    int fd = open(r->paths[i], O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      ur_status st = ur__error(UR_STATUS_IO, "criteo-tsv: %s: cannot open: %s", r->paths[i],
                               strerror(errno));
      ur_criteo_close(r);
      return st;
    }
    close(fd);
  }
  r->rows_file = -1;
  r->t0 = ur_clock_seconds();
  *out = r;
  return UR_STATUS_OK;
}

typedef struct parse_job {
  ur_criteo_reader *r;
} parse_job;

static void parse_range(void *ctx, size_t i0, size_t i1) {
  ur_criteo_reader *r = ((parse_job *)ctx)->r;
  int pad = r->opts.pad_missing_fields;
  for (size_t i = i0; i < i1; i++) {
    if (r->status[i] != LINE_OK) continue;
    int padded;
    if (parse(r->buf + r->starts[i], r->lens[i], pad, r->labels + i, r->dense + i * NDENSE,
              r->ids + i * NCAT, &padded, NULL, 0)) {
      r->status[i] = LINE_BAD;
      continue;
    }
    if (padded) r->status[i] = 0x10;
    uint32_t *c = r->ids + i * NCAT;
    for (int k = 0; k < NCAT; k++)
      if (r->opts.rows[k] > 0) c[k] = (uint32_t)((uint64_t)c[k] % (uint64_t)r->opts.rows[k]);
  }
}

static ur_status grow(ur_criteo_reader *r, size_t n) {
  if (n <= r->line_cap) return UR_STATUS_OK;
  size_t c = r->line_cap ? r->line_cap : 4096;
  while (c < n) c *= 2;
  size_t *s = realloc(r->starts, c * sizeof *s);
  if (s) r->starts = s;
  uint32_t *l = realloc(r->lens, c * sizeof *l);
  if (l) r->lens = l;
  uint8_t *st = realloc(r->status, c);
  if (st) r->status = st;
  int32_t *lb = realloc(r->labels, c * sizeof *lb);
  if (lb) r->labels = lb;
  float *d = realloc(r->dense, c * NDENSE * sizeof *d);
  if (d) r->dense = d;
  uint32_t *ids = realloc(r->ids, c * NCAT * sizeof *ids);
  if (ids) r->ids = ids;
  if (!s || !l || !st || !lb || !d || !ids)
    return ur__error(UR_STATUS_OOM, "criteo-tsv: out of host memory for %zu lines", c);
  r->line_cap = c;
  return UR_STATUS_OK;
}

static ur_status fail(ur_criteo_reader *r, ur_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static ur_status fail(ur_criteo_reader *r, ur_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->err, sizeof r->err, fmt, ap);
  va_end(ap);
  r->failed = st;
  return ur__error(st, "%s", r->err);
}

/* A bad line in skip mode: counted, and the first one remembered. */
static void skipped(ur_criteo_reader *r, int64_t line, const char *why) {
  if (!r->stats.skipped) {
    char full[1400];
    snprintf(full, sizeof full, "%.1000s:%lld: %.300s", r->paths[r->cur], (long long)line, why);
    size_t n = strlen(full), cap = sizeof r->stats.first_skipped - 1;
    if (n > cap) n = cap;
    memcpy(r->stats.first_skipped, full, n);
    r->stats.first_skipped[n] = 0;
  }
  r->stats.skipped++;
}

/* ---- one file's bytes ---- */

#define IN_BYTES ((size_t)1 << 20)

static void src_close(src *s) {
  if (s->fd >= 0) close(s->fd);
  s->fd = -1;
}

/* read(2), again where a signal interrupted it. */
static ssize_t read_some(int fd, void *buf, size_t n) {
  ssize_t k;
  do k = read(fd, buf, n);
  while (k < 0 && errno == EINTR);
  return k;
}

/* Reads more of the file behind the bytes not yet inflated; at its end sets in_eof. */
static void src_fill(src *s) {
  if (s->z.avail_in) memmove(s->in, s->z.next_in, s->z.avail_in);
  s->z.next_in = s->in;
  ssize_t k = read_some(s->fd, s->in + s->z.avail_in, s->in_cap - s->z.avail_in);
  if (k < 0) {
    snprintf(s->why, sizeof s->why, "%s", strerror(errno));
    s->end = SRC_FAILED;
  } else if (k == 0) {
    s->in_eof = 1;
  } else {
    s->z.avail_in += (uInt)k;
    s->in_bytes += (uint64_t)k;
  }
}

static ur_status src_open(src *s, const char *path) {
  s->fd = open(path, O_RDONLY | O_CLOEXEC);
  if (s->fd < 0) return ur__error(UR_STATUS_IO, "criteo-tsv: %s: cannot open: %s", path, strerror(errno));
  struct stat st;
  s->size = fstat(s->fd, &st) == 0 && S_ISREG(st.st_mode) ? (uint64_t)st.st_size : 0;
  s->gzip = s->member = s->in_eof = s->end = 0;
  s->in_bytes = s->member_at = 0;
  if (!s->in && !(s->in = malloc(IN_BYTES))) return ur__error(UR_STATUS_OOM, "criteo-tsv: out of host memory");
  s->in_cap = IN_BYTES;
  s->z.next_in = s->in;
  s->z.avail_in = 0;
  /* gzip's two magic bytes, as gzread tells a gzip'd file from a plain one */
  while (s->z.avail_in < 2 && !s->in_eof && !s->end) src_fill(s);
  s->gzip = s->z.avail_in >= 2 && s->in[0] == 0x1f && s->in[1] == 0x8b;
  if (s->gzip && !s->zinit) {
    if (inflateInit2(&s->z, 15 + 16) != Z_OK) /* 16: gzip members only */
      return ur__error(UR_STATUS_OOM, "criteo-tsv: out of host memory");
    s->zinit = 1;
  }
  return UR_STATUS_OK;
}

/* Up to want bytes of the file into out; 0 only at its end, with s->end saying how it ended. */
static size_t src_read(src *s, char *out, size_t want) {
  if (s->end) return 0;
  if (want > (1u << 30)) want = 1u << 30;
  if (!s->gzip) {
    if (s->z.avail_in) { /* the bytes read to look for the magic */
      size_t k = s->z.avail_in < want ? s->z.avail_in : want;
      memcpy(out, s->z.next_in, k);
      s->z.next_in += k;
      s->z.avail_in -= (uInt)k;
      return k;
    }
    ssize_t k = read_some(s->fd, out, want);
    if (k > 0) return (size_t)k;
    if (k < 0) snprintf(s->why, sizeof s->why, "%s", strerror(errno));
    s->end = k < 0 ? SRC_FAILED : SRC_END;
    return 0;
  }
  s->z.next_out = (Bytef *)out;
  s->z.avail_out = (uInt)want;
  while (s->z.avail_out && !s->end) {
    if (!s->z.avail_in && !s->in_eof) {
      src_fill(s);
      continue;
    }
    if (!s->member) {
      if (!s->z.avail_in) { /* the file ends where a member does */
        s->end = SRC_END;
        break;
      }
      inflateReset(&s->z);
      memset(&s->hdr, 0, sizeof s->hdr);
      inflateGetHeader(&s->z, &s->hdr);
      s->member = 1;
      s->member_at = s->in_bytes - s->z.avail_in;
    }
    if (!s->z.avail_in) { /* the file ends inside a member: cut, or a later one's header is not whole */
      s->end = s->hdr.done == 1 || s->member_at == 0 ? SRC_CUT : SRC_TRAILING;
      break;
    }
    int zr = inflate(&s->z, Z_NO_FLUSH);
    if (zr == Z_STREAM_END) s->member = 0;
    else if (zr == Z_DATA_ERROR && s->hdr.done != 1 && s->member_at > 0) s->end = SRC_TRAILING;
    else if (zr != Z_OK && zr != Z_BUF_ERROR) {
      snprintf(s->why, sizeof s->why, "%s", zr == Z_MEM_ERROR ? "out of host memory" : s->z.msg ? s->z.msg
               : zError(zr));
      s->end = SRC_FAILED;
    }
  }
  return want - s->z.avail_out;
}

/* The file's bytes ended badly after line r->line_no: the error, for the read after its rows. */
static void src_failed(ur_criteo_reader *r, const char *path) {
  const src *s = &r->in;
  long long line = (long long)r->line_no;
  if (s->end == SRC_CUT)
    fail(r, UR_STATUS_IO, "criteo-tsv: %s: the gzip stream is cut short after line %lld (a truncated file?)",
         path, line);
  else if (s->end == SRC_TRAILING && s->size > s->member_at)
    fail(r, UR_STATUS_FORMAT, "criteo-tsv: %s: its last %llu bytes, from byte %llu (after line %lld), are no "
         "gzip member: bytes appended to the gzip data, or a member's header damaged", path,
         (unsigned long long)(s->size - s->member_at), (unsigned long long)s->member_at, line);
  else if (s->end == SRC_TRAILING)
    fail(r, UR_STATUS_FORMAT, "criteo-tsv: %s: the bytes from byte %llu (after line %lld) are no gzip "
         "member: bytes appended to the gzip data, or a member's header damaged", path,
         (unsigned long long)s->member_at, line);
  else
    fail(r, UR_STATUS_IO, "criteo-tsv: %s: read failed after line %lld: %s", path, line, s->why);
}

/* Parses the next chunk of the current file into rows; moves to the next file at its end. */
static ur_status refill(ur_criteo_reader *r) {
  r->nrows = r->rpos = 0;
  while (!r->nrows) {
    if (r->cur >= r->npaths) {
      r->done = 1;
      return UR_STATUS_OK;
    }
    const char *path = r->paths[r->cur];
    if (r->in.fd < 0) {
      ur_status st = src_open(&r->in, path);
      if (st) return fail(r, st, "%s", ur_last_error());
      r->line_no = 0;
      r->file_bytes = 0;
      r->len = 0;
      r->discarding = 0;
    }
    int eof = 0, cut = 0;
    while (r->len < r->cap) {
      size_t got = src_read(&r->in, r->buf + r->len, r->cap - r->len);
      if (!got) {
        /* cut short, bytes after the last member, a failed read: its rows are served first */
        cut = r->in.end != SRC_END;
        eof = 1;
        break;
      }
      r->len += got;
      r->file_bytes += (uint64_t)got;
      r->stats.bytes += (int64_t)got;
    }
    if (eof && r->file_bytes == 0 && !cut)
      return fail(r, UR_STATUS_FORMAT, "criteo-tsv: %s: empty file (no lines)", path);
    /* Split into lines. */
    size_t pos = 0, n = 0;
    if (r->discarding) {
      char *nl = memchr(r->buf, '\n', r->len);
      if (!nl) {
        r->len = 0;
        pos = 0;
      } else {
        pos = (size_t)(nl - r->buf) + 1;
        r->discarding = 0;
        r->line_no++;
      }
    }
    for (;;) {
      char *nl = pos < r->len ? memchr(r->buf + pos, '\n', r->len - pos) : NULL;
      if (!nl) break;
      ur_status st = grow(r, n + 1);
      if (st) return fail(r, st, "%s", ur_last_error());
      size_t l = (size_t)(nl - (r->buf + pos));
      r->starts[n] = pos;
      r->lens[n] = (uint32_t)(l < MAX_LINE ? l : MAX_LINE);
      r->status[n] = l > MAX_LINE ? LINE_LONG : LINE_OK;
      n++;
      pos += l + 1;
    }
    size_t rest = r->len - pos;
    if (!n && !eof && rest == r->cap && r->cap <= MAX_LINE) {
      /* A small buffer holds no whole line: grow it (a line is refused past MAX_LINE). */
      char *b = realloc(r->buf, r->cap * 2 + 1);
      if (!b) return fail(r, UR_STATUS_OOM, "criteo-tsv: out of host memory");
      r->buf = b;
      r->cap *= 2;
      continue;
    }
    int tail = 0; /* 1: the rest is a final line without newline; 2: an overlong partial line */
    if (eof && rest && !r->discarding && !cut) tail = 1;
    else if (!eof && rest > MAX_LINE) tail = 2;
    if (tail == 1) {
      ur_status st = grow(r, n + 1);
      if (st) return fail(r, st, "%s", ur_last_error());
      r->starts[n] = pos;
      r->lens[n] = (uint32_t)(rest < MAX_LINE ? rest : MAX_LINE);
      r->status[n] = LINE_NO_NEWLINE;
      n++;
      pos = r->len;
      rest = 0;
    }
    if (n) {
      parse_job job = {r};
      ur__parallel_for(n, 2048, parse_range, &job);
    }
    char msg[256];
    int64_t kept = 0;
    for (size_t i = 0; i < n; i++) {
      int64_t line = r->line_no + (int64_t)i + 1;
      uint8_t s = r->status[i];
      if (s == LINE_OK || s == 0x10) {
        if (s == 0x10) r->stats.padded++;
        if ((int64_t)i != kept) {
          r->labels[kept] = r->labels[i];
          memcpy(r->dense + kept * NDENSE, r->dense + i * NDENSE, NDENSE * sizeof(float));
          memcpy(r->ids + kept * NCAT, r->ids + i * NCAT, NCAT * sizeof(uint32_t));
        }
        kept++;
        continue;
      }
      if (s == LINE_LONG)
        snprintf(msg, sizeof msg, "line is over %d bytes long (a Criteo line is under 1 KiB)", MAX_LINE);
      else if (s == LINE_NO_NEWLINE)
        snprintf(msg, sizeof msg, "the last line has no final newline (a truncated file?)");
      else {
        int32_t lb;
        float d[NDENSE];
        uint32_t c[NCAT];
        int pd;
        parse(r->buf + r->starts[i], r->lens[i], r->opts.pad_missing_fields, &lb, d, c, &pd, msg,
              sizeof msg);
      }
      if (!r->opts.skip_bad_lines) {
        /* The rows before it are served first; the error comes with the read after them. */
        fail(r, UR_STATUS_FORMAT, "criteo-tsv: %s:%lld: %s", path, (long long)line, msg);
        r->stats.lines += (int64_t)i;
        r->nrows = kept;
        r->stats.rows += kept;
        r->rows_file = r->cur;
        return UR_STATUS_OK;
      }
      skipped(r, line, msg);
    }
    r->stats.lines += (int64_t)n;
    r->line_no += (int64_t)n;
    r->nrows = kept;
    r->stats.rows += kept;
    r->rows_file = r->cur;
    if (cut) { /* the rows before it are served first, as for a bad line; skipping cannot help */
      src_failed(r, path);
      return UR_STATUS_OK;
    }
    if (tail == 2) {
      int64_t line = r->line_no + 1;
      snprintf(msg, sizeof msg, "line is over %d bytes long (a Criteo line is under 1 KiB)", MAX_LINE);
      if (!r->opts.skip_bad_lines) { /* as for a bad line: the chunk's rows before it go out first */
        fail(r, UR_STATUS_FORMAT, "criteo-tsv: %s:%lld: %s", path, (long long)line, msg);
        return UR_STATUS_OK;
      }
      skipped(r, line, msg);
      r->stats.lines++;
      r->discarding = 1;
      rest = 0;
    }
    /* The partial line waits for the next read (rows live in their own arrays). */
    memmove(r->buf, r->buf + pos, rest);
    r->len = rest;
    if (eof) {
      src_close(&r->in);
      r->cur++;
    }
  }
  return UR_STATUS_OK;
}

ur_status ur_criteo_read(ur_criteo_reader *r, int64_t max, int32_t *labels, float *dense,
                         uint32_t *ids, int64_t *n) {
  UR__ARGS(r, n);
  *n = 0;
  if (r->failed && r->rpos == r->nrows) return ur__error(r->failed, "%s", r->err);
  if (max < 0) return ur__error(UR_STATUS_INVALID, "criteo-tsv: read of %lld rows", (long long)max);
  if (r->rpos == r->nrows && !r->done && !r->failed) {
    ur_status st = refill(r);
    r->stats.seconds = ur_clock_seconds() - r->t0;
    if (st) return st;
    if (r->failed && r->rpos == r->nrows) return ur__error(r->failed, "%s", r->err);
  }
  int64_t k = r->nrows - r->rpos;
  if (k > max) k = max;
  if (k > 0) {
    if (labels) memcpy(labels, r->labels + r->rpos, (size_t)k * sizeof(int32_t));
    if (dense) memcpy(dense, r->dense + r->rpos * NDENSE, (size_t)k * NDENSE * sizeof(float));
    if (ids) memcpy(ids, r->ids + r->rpos * NCAT, (size_t)k * NCAT * sizeof(uint32_t));
    r->rpos += k;
  }
  *n = k;
  return UR_STATUS_OK;
}

ur_status ur_criteo_stats_get(const ur_criteo_reader *r, ur_criteo_stats *out) {
  UR__ARGS(r, out);
  *out = r->stats;
  out->seconds = ur_clock_seconds() - r->t0;
  return UR_STATUS_OK;
}

int32_t ur_criteo_file_index(const ur_criteo_reader *r) {
  UR__ARGS_OR(-1, r);
  return r->rows_file;
}

/* ---- conversion to day files ---- */

/* Every day's three files are written under temporary names and renamed only when the whole
 * conversion succeeded: a failed or killed one leaves no file that looks like a day. */
ur_status ur_criteo_convert(const char *const *paths, int32_t npaths, ur_criteo_stats *out,
                            const ur_criteo_opts *opts, const char *out_dir, const int32_t *days) {
  UR__ARGS(paths, out_dir);
  for (int32_t i = 0; days && i < npaths; i++)
    if (days[i] < 0)
      return ur__error(UR_STATUS_INVALID, "criteo convert: days[%d] is %d; expected a whole number from 0 "
                       "(loaders read day_N for N from 0)", (int)i, (int)days[i]);
  /* two inputs of one day would write the same files: the second's would replace the first's */
  for (int32_t i = 1; days && i < npaths; i++)
    for (int32_t j = 0; j < i; j++)
      if (days[j] == days[i])
        return ur__error(UR_STATUS_INVALID, "criteo convert: days[%d] and days[%d] are both %d; each input "
                         "needs a day of its own", (int)j, (int)i, (int)days[i]);
  ur_criteo_reader *r;
  ur_status st = ur_criteo_open(&r, paths, npaths, opts);
  if (st) return st;
  int all_rows = 1, any_rows = 0;
  for (int k = 0; k < NCAT; k++) {
    if (r->opts.rows[k] <= 0 || r->opts.rows[k] > 2147483648LL) all_rows = 0;
    if (r->opts.rows[k] > 0) any_rows = 1;
  }
  const int64_t chunk = 1 << 16;
  int32_t *labels = malloc(sizeof(int32_t) * chunk);
  float *dense = malloc(sizeof(float) * NDENSE * chunk);
  uint32_t *ids = malloc(sizeof(uint32_t) * NCAT * chunk);
  /* three files a day, then (ids taken mod rows) each day's day_N_sparse_rows.npy */
  ur__npy_writer *w = calloc((size_t)npaths * 4, sizeof *w);
  int open_file = -1;
  if (!labels || !dense || !ids || !w) st = ur__error(UR_STATUS_OOM, "criteo convert: out of host memory");
  for (;;) {
    int64_t n = 0;
    if (!st) st = ur_criteo_read(r, chunk, labels, dense, ids, &n);
    int fi = ur_criteo_file_index(r);
    /* A file ends: close its day; files that gave no rows still get (empty) days. */
    int next = st ? -1 : n ? fi : npaths;
    while (!st && open_file < next) {
      if (open_file >= 0)
        for (int j = 0; j < 3 && !st; j++) st = ur__npy_writer_close(&w[3 * open_file + j]);
      open_file++;
      if (open_file >= npaths || st) break;
      int day = days ? days[open_file] : open_file;
      ur__npy_writer *d = &w[3 * open_file];
      char path[4096];
      int64_t inner_d[4] = {0, NDENSE}, inner_s[4] = {0, NCAT}, inner_l[4] = {0};
      snprintf(path, sizeof path, "%s/day_%d_dense.npy", out_dir, day);
      st = ur__npy_writer_open(&d[0], path, "<f4", 2, inner_d);
      snprintf(path, sizeof path, "%s/day_%d_sparse.npy", out_dir, day);
      if (!st) st = ur__npy_writer_open(&d[1], path, all_rows ? "<i4" : "<u4", 2, inner_s);
      snprintf(path, sizeof path, "%s/day_%d_labels.npy", out_dir, day);
      if (!st) st = ur__npy_writer_open(&d[2], path, "<i4", 1, inner_l);
    }
    if (st || !n) break;
    ur__npy_writer *d = &w[3 * open_file];
    st = ur__npy_writer_append(&d[0], dense, n, NDENSE * sizeof(float));
    if (!st) st = ur__npy_writer_append(&d[1], ids, n, NCAT * sizeof(uint32_t));
    if (!st) st = ur__npy_writer_append(&d[2], labels, n, sizeof(int32_t));
  }
  /* The table sizes the ids were taken modulo (0: raw), which the loader checks against its own:
   * ids reduced twice by sizes that do not divide would not be the raw ids a served model maps. */
  for (int i = 0; !st && any_rows && i < npaths; i++) {
    char path[4096];
    int64_t mod[NCAT], inner[4] = {0};
    for (int k = 0; k < NCAT; k++) mod[k] = r->opts.rows[k] > 0 ? r->opts.rows[k] : 0;
    snprintf(path, sizeof path, "%s/day_%d_sparse_rows.npy", out_dir, days ? days[i] : i);
    st = ur__npy_writer_open(&w[3 * npaths + i], path, "<i8", 1, inner);
    if (!st) st = ur__npy_writer_append(&w[3 * npaths + i], mod, NCAT, sizeof(int64_t));
    if (!st) st = ur__npy_writer_close(&w[3 * npaths + i]);
  }
  for (int i = 0; !st && w && i < (any_rows ? 4 : 3) * npaths; i++) st = ur__npy_writer_commit(&w[i]);
  /* raw ids now: an older conversion's record of the same day would be a lie */
  for (int i = 0; !st && !any_rows && i < npaths; i++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/day_%d_sparse_rows.npy", out_dir, days ? days[i] : i);
    if (unlink(path) && errno != ENOENT)
      st = ur__error(UR_STATUS_IO, "criteo convert: cannot remove %s (an older conversion's): %s", path,
                     strerror(errno));
  }
  if (!st && npaths > 0) st = ur__sync_dir(w[0].path, "criteo convert");
  char msg[1024];
  if (st) snprintf(msg, sizeof msg, "%s", ur_last_error());
  for (int i = 0; w && i < 4 * npaths; i++) ur__npy_writer_abort(&w[i]);
  if (out) ur_criteo_stats_get(r, out);
  ur_criteo_close(r);
  free(w);
  free(labels);
  free(dense);
  free(ids);
  return st ? ur__error(st, "%s", msg) : UR_STATUS_OK;
}
