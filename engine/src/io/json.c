/* json.c: JSON values for checkpoint metadata, run logs and benchmarks (lua/uvmrec/json.lua).
 * jansson parses and holds the values; the writer here is ours because the text must be
 * canonical and stay the bytes uvmrec has always written: keys sorted bytewise, no spaces,
 * reals as %.17g (jansson rewrites exponents, "1e-05" to "1e-5"), lowercase \u escapes. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"

/* A ur_json is a json_t; the handle type keeps jansson out of the public header. */
#define J(v) ((json_t *)(v))
#define U(v) ((ur_json *)(v))

static ur_status oom(void) { return ur__error(UR_STATUS_OOM, "json: out of host memory"); }

/* Refused before jansson sees it: jansson would drop the value, which here is the container the
 * caller still holds, and say only that it failed. */
static ur_status inside_itself(const char *fn) {
  return ur__error(UR_STATUS_INVALID, "json: %s: a value cannot go inside itself", fn);
}

ur_status ur_json_parse(ur_json **out, const char *text, size_t len) {
  UR__ARGS(out);
  if (len && !text) return ur__null(__func__, "text");
  *out = NULL;
  json_error_t e;
  /* A key given twice is an error, as in safetensors headers and YAML configs, not its last value. */
  json_t *v = json_loadb(text, len, JSON_DECODE_ANY | JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES, &e);
  if (!v) return ur__error(UR_STATUS_FORMAT, "json: %s at byte %d", e.text, e.position);
  *out = U(v);
  return UR_STATUS_OK;
}

void ur_json_free(ur_json *v) { json_decref(J(v)); }

ur_json_type ur_json_typeof(const ur_json *v) {
  UR__ARGS_OR(UR_JSON_NULL, v);
  switch (json_typeof(J(v))) {
  case JSON_OBJECT: return UR_JSON_OBJECT;
  case JSON_ARRAY: return UR_JSON_ARRAY;
  case JSON_STRING: return UR_JSON_STRING;
  case JSON_INTEGER: return UR_JSON_INTEGER;
  case JSON_REAL: return UR_JSON_REAL;
  case JSON_TRUE: return UR_JSON_TRUE;
  case JSON_FALSE: return UR_JSON_FALSE;
  default: return UR_JSON_NULL;
  }
}

int64_t ur_json_integer(const ur_json *v) {
  UR__ARGS_OR(0, v);
  return (int64_t)json_integer_value(J(v));
}
double ur_json_real(const ur_json *v) {
  UR__ARGS_OR(0, v);
  return json_real_value(J(v));
}

const char *ur_json_string(const ur_json *v, size_t *len) {
  UR__ARGS_OR(NULL, v, len);
  if (!json_is_string(J(v))) return NULL;
  *len = json_string_length(J(v));
  return json_string_value(J(v));
}

size_t ur_json_size(const ur_json *v) {
  UR__ARGS_OR(0, v);
  if (json_is_array(J(v))) return json_array_size(J(v));
  return json_is_object(J(v)) ? json_object_size(J(v)) : 0;
}

ur_json *ur_json_item(const ur_json *array, size_t i) {
  UR__ARGS_OR(NULL, array);
  return U(json_array_get(J(array), i));
}

void *ur_json_iter(const ur_json *object) {
  UR__ARGS_OR(NULL, object);
  return json_object_iter(J(object));
}
void *ur_json_iter_next(const ur_json *object, void *it) {
  UR__ARGS_OR(NULL, object, it);
  return json_object_iter_next(J(object), it);
}
const char *ur_json_iter_key(void *it, size_t *len) {
  UR__ARGS_OR(NULL, it, len);
  *len = json_object_iter_key_len(it);
  return json_object_iter_key(it);
}
ur_json *ur_json_iter_value(void *it) {
  UR__ARGS_OR(NULL, it);
  return U(json_object_iter_value(it));
}

/* ---- building ---- */

ur_status ur_json_new(ur_json **out, ur_json_type type) {
  UR__ARGS(out);
  json_t *v;
  switch (type) {
  case UR_JSON_NULL: v = json_null(); break;
  case UR_JSON_FALSE: v = json_false(); break;
  case UR_JSON_TRUE: v = json_true(); break;
  case UR_JSON_ARRAY: v = json_array(); break;
  case UR_JSON_OBJECT: v = json_object(); break;
  default:
    *out = NULL;
    return ur__error(UR_STATUS_INVALID,
                     "json: ur_json_new makes null, false, true, an array or an object, not type "
                     "%d (integers, reals and strings have their own constructors)", (int)type);
  }
  *out = U(v);
  return v ? UR_STATUS_OK : oom();
}

ur_status ur_json_new_integer(ur_json **out, int64_t value) {
  UR__ARGS(out);
  *out = U(json_integer((json_int_t)value));
  return *out ? UR_STATUS_OK : oom();
}

ur_status ur_json_new_real(ur_json **out, double value) {
  UR__ARGS(out);
  *out = NULL;
  if (!isfinite(value))
    return ur__error(UR_STATUS_INVALID, "json: %g cannot be written; JSON numbers are finite",
                     value);
  *out = U(json_real(value));
  return *out ? UR_STATUS_OK : oom();
}

ur_status ur_json_new_string(ur_json **out, const char *s, size_t len) {
  UR__ARGS(out);
  *out = NULL;
  if (len && !s) return ur__null(__func__, "s");
  *out = U(json_stringn(s, len));
  if (*out) return UR_STATUS_OK;
  /* json_stringn fails only on bad UTF-8 or memory: tell which. */
  json_t *probe = json_stringn_nocheck(s, len);
  if (!probe) return oom();
  json_decref(probe);
  return ur__error(UR_STATUS_INVALID, "json: a string is not valid UTF-8 (%zu bytes)", len);
}

ur_status ur_json_append(ur_json *array, ur_json *item) {
  if (!array) {
    json_decref(J(item));
    return ur__null(__func__, "array");
  }
  if (!item) return ur__null(__func__, "item");
  if (item == array) return inside_itself(__func__);
  if (!json_is_array(J(array))) {
    json_decref(J(item));
    return ur__error(UR_STATUS_INVALID, "json: ur_json_append needs an array");
  }
  return json_array_append_new(J(array), J(item)) ? oom() : UR_STATUS_OK;
}

ur_status ur_json_set(ur_json *object, const char *key, size_t len, ur_json *value) {
  if (!object || (len && !key)) {
    json_decref(J(value));
    return ur__null(__func__, object ? "key" : "object");
  }
  if (!value) return ur__null(__func__, "value");
  if (value == object) return inside_itself(__func__);
  if (!json_is_object(J(object))) {
    json_decref(J(value));
    return ur__error(UR_STATUS_INVALID, "json: ur_json_set needs an object");
  }
  /* Takes value even when it fails; it fails on a key that is not UTF-8, or on memory. */
  if (!json_object_setn_new(J(object), key, len, J(value))) return UR_STATUS_OK;
  json_t *probe = json_stringn(key, len);
  if (!probe)
    return ur__error(UR_STATUS_INVALID, "json: the key '%.*s' is not valid UTF-8", (int)len, key);
  json_decref(probe);
  return oom();
}

/* ---- canonical text ---- */

typedef struct out_buf {
  char *p;
  size_t n, cap;
  int failed;
} out_buf;

static void put(out_buf *b, const char *s, size_t n) {
  if (b->failed) return;
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (b->n + n + 1 > cap) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
      b->failed = 1;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
}

static void put_string(out_buf *b, const char *s, size_t n) {
  put(b, "\"", 1);
  size_t run = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    const char *esc = NULL;
    char hex[8];
    switch (c) {
    case '"': esc = "\\\""; break;
    case '\\': esc = "\\\\"; break;
    case '\b': esc = "\\b"; break;
    case '\f': esc = "\\f"; break;
    case '\n': esc = "\\n"; break;
    case '\r': esc = "\\r"; break;
    case '\t': esc = "\\t"; break;
    default:
      if (c < 0x20) {
        snprintf(hex, sizeof hex, "\\u%04x", c);
        esc = hex;
      }
    }
    if (!esc) continue;
    put(b, s + run, i - run);
    put(b, esc, strlen(esc));
    run = i + 1;
  }
  put(b, s + run, n - run);
  put(b, "\"", 1);
}

typedef struct member {
  const char *key;
  size_t len;
  json_t *value;
} member;

static int cmp_member(const void *pa, const void *pb) {
  const member *a = pa, *b = pb;
  int c = memcmp(a->key, b->key, a->len < b->len ? a->len : b->len);
  return c ? c : (a->len > b->len) - (a->len < b->len);
}

static void put_value(out_buf *b, json_t *v) {
  char num[64];
  switch (json_typeof(v)) {
  case JSON_OBJECT: {
    size_t n = json_object_size(v), i = 0;
    member *m = n ? malloc(n * sizeof *m) : NULL;
    if (n && !m) {
      b->failed = 1;
      return;
    }
    for (void *it = json_object_iter(v); it; it = json_object_iter_next(v, it), i++)
      m[i] = (member){json_object_iter_key(it), json_object_iter_key_len(it),
                      json_object_iter_value(it)};
    if (n) qsort(m, n, sizeof *m, cmp_member); /* qsort takes no NULL, even for 0 items */
    put(b, "{", 1);
    for (i = 0; i < n; i++) {
      if (i) put(b, ",", 1);
      put_string(b, m[i].key, m[i].len);
      put(b, ":", 1);
      put_value(b, m[i].value);
    }
    put(b, "}", 1);
    free(m);
    return;
  }
  case JSON_ARRAY:
    put(b, "[", 1);
    for (size_t i = 0; i < json_array_size(v); i++) {
      if (i) put(b, ",", 1);
      put_value(b, json_array_get(v, i));
    }
    put(b, "]", 1);
    return;
  case JSON_STRING:
    put_string(b, json_string_value(v), json_string_length(v));
    return;
  case JSON_INTEGER:
    put(b, num, (size_t)snprintf(num, sizeof num, "%" JSON_INTEGER_FORMAT, json_integer_value(v)));
    return;
  case JSON_REAL:
    put(b, num, (size_t)snprintf(num, sizeof num, "%.17g", json_real_value(v)));
    return;
  case JSON_TRUE: put(b, "true", 4); return;
  case JSON_FALSE: put(b, "false", 5); return;
  default: put(b, "null", 4); return;
  }
}

ur_status ur_json_dump(const ur_json *v, char *buf, uint64_t len, uint64_t *needed) {
  UR__ARGS(v, needed);
  if (len && !buf) return ur__null(__func__, "buf");
  out_buf b = {0};
  put(&b, "", 0);
  put_value(&b, J(v));
  if (b.failed) {
    free(b.p);
    *needed = 0;
    return oom();
  }
  *needed = b.n + 1;
  if (len >= *needed) memcpy(buf, b.p, b.n + 1);
  else if (len) buf[0] = 0;
  free(b.p);
  return UR_STATUS_OK;
}
