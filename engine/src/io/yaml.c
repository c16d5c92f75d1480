/* yaml.c: YAML files as node trees with positions, through libyaml's event API.  Only the
 * structure is decided here; the schema types the scalars (no yes->true, no octal). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>
#include "core/core.h"

struct ur_yaml_doc {
  ur_yaml_node *nodes;
  int32_t n, cap;
  char *name;
};

typedef struct frame {
  int32_t node, last_child;
} frame;

size_t ur_sizeof_yaml_node(void) { return sizeof(ur_yaml_node); }
int32_t ur_yaml_count(const ur_yaml_doc *d) {
  UR__ARGS_OR(-1, d);
  return d->n;
}
const ur_yaml_node *ur_yaml_nodes(const ur_yaml_doc *d) {
  UR__ARGS_OR(NULL, d);
  return d->nodes;
}
const char *ur_yaml_name(const ur_yaml_doc *d) {
  UR__ARGS_OR(NULL, d);
  return d->name;
}

void ur_yaml_free(ur_yaml_doc *d) {
  if (!d) return;
  for (int32_t i = 0; i < d->n; i++) free((char *)d->nodes[i].value);
  free(d->nodes);
  free(d->name);
  free(d);
}

static ur_status at(const ur_yaml_doc *d, yaml_mark_t m, const char *what) {
  return ur__error(UR_STATUS_FORMAT, "%s:%zu:%zu: %s", d->name, m.line + 1, m.column + 1, what);
}

static int32_t add_node(ur_yaml_doc *d, frame *stack, int depth, int32_t kind, yaml_mark_t m) {
  if (d->n == d->cap) {
    int32_t cap = d->cap ? d->cap * 2 : 64;
    ur_yaml_node *v = realloc(d->nodes, (size_t)cap * sizeof *v);
    if (!v) return -1;
    d->nodes = v;
    d->cap = cap;
  }
  int32_t i = d->n++;
  ur_yaml_node *nd = &d->nodes[i];
  memset(nd, 0, sizeof *nd);
  nd->kind = kind;
  nd->line = (int32_t)m.line + 1;
  nd->column = (int32_t)m.column + 1;
  nd->first_child = nd->next_sibling = -1;
  if (depth > 0) {
    frame *f = &stack[depth - 1];
    if (f->last_child < 0) d->nodes[f->node].first_child = i;
    else d->nodes[f->last_child].next_sibling = i;
    f->last_child = i;
    d->nodes[f->node].count++;
  }
  return i;
}

static ur_status build(ur_yaml_doc *d, yaml_parser_t *p) {
  frame stack[UR_YAML_MAX_DEPTH];
  int depth = 0, docs = 0, done = 0;
  ur_status st = UR_STATUS_OK;
  while (!done && !st) {
    yaml_event_t ev;
    if (!yaml_parser_parse(p, &ev))
      return ur__error(UR_STATUS_FORMAT, "%s:%zu:%zu: %s%s%s", d->name,
                       p->problem_mark.line + 1, p->problem_mark.column + 1,
                       p->problem ? p->problem : "malformed YAML", p->context ? " " : "",
                       p->context ? p->context : "");
    yaml_mark_t m = ev.start_mark;
    switch (ev.type) {
      case YAML_STREAM_END_EVENT: done = 1; break;
      case YAML_DOCUMENT_START_EVENT:
        if (++docs > 1) st = at(d, m, "a second document; a config holds one");
        break;
      case YAML_ALIAS_EVENT:
        st = at(d, m, "aliases (*name) are not allowed in a config; write the value out");
        break;
      case YAML_SCALAR_EVENT:
      case YAML_SEQUENCE_START_EVENT:
      case YAML_MAPPING_START_EVENT: {
        const yaml_char_t *anchor = ev.type == YAML_SCALAR_EVENT ? ev.data.scalar.anchor
                                    : ev.type == YAML_SEQUENCE_START_EVENT
                                        ? ev.data.sequence_start.anchor
                                        : ev.data.mapping_start.anchor;
        const yaml_char_t *tag = ev.type == YAML_SCALAR_EVENT ? ev.data.scalar.tag
                                 : ev.type == YAML_SEQUENCE_START_EVENT
                                     ? ev.data.sequence_start.tag
                                     : ev.data.mapping_start.tag;
        if (anchor) {
          st = at(d, m, "anchors (&name) are not allowed in a config");
          break;
        }
        int32_t kind = ev.type == YAML_SCALAR_EVENT ? UR_YAML_SCALAR
                       : ev.type == YAML_SEQUENCE_START_EVENT ? UR_YAML_SEQ
                                                               : UR_YAML_MAP;
        if (kind != UR_YAML_SCALAR && depth == UR_YAML_MAX_DEPTH) {
          st = at(d, m, "nesting deeper than 64 levels");
          break;
        }
        int32_t i = add_node(d, stack, depth, kind, m);
        if (i < 0) {
          st = ur__error(UR_STATUS_OOM, "%s: out of memory reading YAML", d->name);
          break;
        }
        d->nodes[i].has_tag = tag != NULL;
        if (kind == UR_YAML_SCALAR) {
          yaml_scalar_style_t s = ev.data.scalar.style;
          d->nodes[i].style = s == YAML_SINGLE_QUOTED_SCALAR_STYLE || s == YAML_DOUBLE_QUOTED_SCALAR_STYLE
                                  ? UR_YAML_QUOTED
                              : s == YAML_LITERAL_SCALAR_STYLE || s == YAML_FOLDED_SCALAR_STYLE
                                  ? UR_YAML_BLOCK
                                  : UR_YAML_PLAIN;
          char *v = malloc(ev.data.scalar.length + 1);
          if (!v) {
            st = ur__error(UR_STATUS_OOM, "%s: out of memory reading YAML", d->name);
            break;
          }
          memcpy(v, ev.data.scalar.value, ev.data.scalar.length);
          v[ev.data.scalar.length] = 0;
          d->nodes[i].value = v;
          d->nodes[i].length = ev.data.scalar.length;
        } else {
          stack[depth].node = i;
          stack[depth].last_child = -1;
          depth++;
        }
        break;
      }
      case YAML_SEQUENCE_END_EVENT:
      case YAML_MAPPING_END_EVENT: depth--; break;
      default: break;
    }
    yaml_event_delete(&ev);
  }
  if (!st && d->n == 0) st = ur__error(UR_STATUS_FORMAT, "%s:1:1: the document is empty", d->name);
  return st;
}

ur_status ur_yaml_parse(ur_yaml_doc **out, const char *text, size_t len, const char *name) {
  UR__ARGS(out, text);
  *out = NULL;
  ur_yaml_doc *d = calloc(1, sizeof *d);
  if (!d || !(d->name = strdup(name ? name : "<string>"))) {
    free(d);
    return ur__error(UR_STATUS_OOM, "yaml: out of memory");
  }
  yaml_parser_t p;
  if (!yaml_parser_initialize(&p)) {
    ur_yaml_free(d);
    return ur__error(UR_STATUS_OOM, "yaml: cannot initialise the parser");
  }
  yaml_parser_set_input_string(&p, (const unsigned char *)text, len);
  ur_status st = build(d, &p);
  yaml_parser_delete(&p);
  if (st) {
    ur_yaml_free(d);
    return st;
  }
  *out = d;
  return UR_STATUS_OK;
}

ur_status ur_yaml_load(ur_yaml_doc **out, const char *path) {
  UR__ARGS(out, path);
  *out = NULL;
  FILE *f = fopen(path, "rb");
  if (!f) return ur__error(UR_STATUS_IO, "%s: cannot open: %s", path, strerror(errno));
  char *buf = NULL;
  size_t n = 0, cap = 0, got;
  do {
    if (n + 65536 > cap) {
      char *b = realloc(buf, cap = cap ? cap * 2 : 65536 * 2);
      if (!b) {
        free(buf);
        fclose(f);
        return ur__error(UR_STATUS_OOM, "%s: out of memory reading it", path);
      }
      buf = b;
    }
    got = fread(buf + n, 1, cap - n, f);
    n += got;
  } while (got > 0);
  int err = ferror(f);
  fclose(f);
  if (err) {
    free(buf);
    return ur__error(UR_STATUS_IO, "%s: read error", path);
  }
  ur_status st = ur_yaml_parse(out, buf, n, path);
  free(buf);
  return st;
}
