/* yaml_doc.c: libFuzzer target for the YAML reader (libyaml's events into a tree of nodes).
 * An accepted document must be a tree: node 0 the root, every child index in range and after
 * its parent, the children counted, maps of key-value pairs with scalar-free containers,
 * scalars with their text NUL-terminated at their length, nesting within UR_YAML_MAX_DEPTH;
 * anything else must be a FORMAT error with a message. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "uvmrec.h"

static int depth_ok(const ur_yaml_node *nodes, int32_t count, int32_t i, int depth, int32_t *seen) {
  if (i < 0 || i >= count || depth > UR_YAML_MAX_DEPTH + 1) return 0;
  (*seen)++;
  const ur_yaml_node *n = &nodes[i];
  if (n->line < 1 || n->column < 1) return 0;
  if (n->kind == UR_YAML_SCALAR) {
    if (!n->value || n->first_child != -1 || n->count != 0) return 0;
    if (n->value[n->length] != 0) return 0;
    return n->style >= UR_YAML_PLAIN && n->style <= UR_YAML_BLOCK;
  }
  if ((n->kind != UR_YAML_MAP && n->kind != UR_YAML_SEQ) || n->value) return 0;
  if (n->kind == UR_YAML_MAP && n->count % 2) return 0;
  int32_t k = 0;
  for (int32_t c = n->first_child; c >= 0; c = nodes[c].next_sibling) {
    if (c <= i || c >= count || ++k > n->count) return 0;
    if (!depth_ok(nodes, count, c, depth + 1, seen)) return 0;
  }
  return k == n->count;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = malloc(size ? size : 1);
  if (!text) return 0;
  memcpy(text, data, size);
  ur_yaml_doc *d = NULL;
  ur_status st = ur_yaml_parse(&d, text, size, "fuzz.yaml");
  if (st == UR_STATUS_OK) {
    int32_t count = ur_yaml_count(d), seen = 0;
    const ur_yaml_node *nodes = ur_yaml_nodes(d);
    if (count > 0 && !depth_ok(nodes, count, 0, 1, &seen)) abort();
    if (seen != count) abort(); /* every node hangs from the root, once */
    if (strcmp(ur_yaml_name(d), "fuzz.yaml")) abort();
    ur_yaml_free(d);
  } else if (st != UR_STATUS_FORMAT || !ur_last_error()[0] || d) {
    abort();
  }
  free(text);
  return 0;
}
