/* far.c: the far rows' copies of a GPU collection (uvmrec.h, "far rows' copies"; the kernels'
 * half is in kernels/tbe.cu).  The room for the copies at home, keeping each table's far_from
 * current, and when a forward makes copies and a backward may read them.  Where far rows begin
 * (ur__tbe_far_from) and forgetting the copies (ur__tbe_far_drop) are table.c's: its calls that
 * write rows drop them, and this file calls table.c, not the other way.  One piece of memory
 * holds the map (keys, then where each copy is), the count of copies asked for with the count of
 * lookups that found no free slot, and the copies. */
#include "embedding/table.h"

#define FAR_ALIGN 256

static int64_t far_align(int64_t n) { return (n + FAR_ALIGN - 1) / FAR_ALIGN * FAR_ALIGN; }

/* The widest row of the collection, in bytes, rounded to the 16-byte loads that copy it. */
static int32_t far_row_bytes(const ur_tbe *t) {
  int64_t b = 16;
  for (int32_t i = 0; i < t->names.T; i++) {
    int64_t r = (int64_t)t->tc[i].dim * (int64_t)ur_dtype_size(t->tc[i].dtype);
    if (r > b) b = r;
  }
  return (int32_t)((b + 15) / 16 * 16);
}

/* Slots of the map: a power of two, at least twice the copies.  Rows past the room take slots
 * too (so far_taken counts them), so a forward reading more than twice the room fills the map,
 * and its last rows find no slot (32 probes) and go uncounted and uncopied: the lookups that
 * did are counted beside taken, and far_taken says so. */
static int64_t far_slots(int64_t rows) {
  int64_t s = 64;
  while (s < 2 * rows) s *= 2;
  return s;
}

/* The memory's layout for `rows` copies: keys, at and taken, then the copies. */
typedef struct far_layout {
  int64_t slots, at, taken, rows, total;
} far_layout;

static far_layout layout_of(const ur_tbe *t, int64_t rows) {
  far_layout L;
  L.slots = far_slots(rows);
  L.at = far_align(8 * L.slots);
  L.taken = L.at + far_align(4 * L.slots);
  L.rows = L.taken + FAR_ALIGN;
  L.total = L.rows + rows * far_row_bytes(t);
  return L;
}

/* Sets each table's far_from from where its rows live now; uploads the descriptors when one
 * changed. */
static ur_status far_update(ur_tbe *t) {
  int changed = 0;
  for (int32_t i = 0; i < t->names.T; i++) {
    int64_t f = ur__tbe_far_from(t, i);
    changed |= f != t->tables[i].far_from;
    t->tables[i].far_from = f;
  }
  return changed ? ur__tbe_sync_desc(t) : UR_STATUS_OK;
}

ur_status ur_tbe_set_far_rows(ur_tbe *t, int64_t rows) {
  UR__ARGS(t);
  if (rows < 0 || rows > INT32_MAX / 2)
    return ur__error(UR_STATUS_INVALID, "tbe set_far_rows: %lld copies; expected 0 (none) to %d",
                     (long long)rows, INT32_MAX / 2);
  t->far_made = 0;
  ur__tbe_far_drop(t);
  if (t->home == UR_PLACE_DEVICE && rows != t->far_rows) {
    ur_tensor *mem = NULL;
    ur_status st = UR_STATUS_OK;
    /* kernels in flight may read the old copies */
    if (t->far && (st = t->be->device_sync())) return st;
    int64_t bytes = rows > 0 ? layout_of(t, rows).total : 0;
    if (rows > 0 && (st = ur__tbe_home_tensor(t, &mem, UR_DTYPE_U8, bytes)))
      return ur__error_cause(st, "tbe set_far_rows: room for %lld copies takes %lld bytes of HBM",
                             (long long)rows, (long long)bytes);
    ur_tensor_free(t->far);
    t->far = mem;
  }
  t->far_rows = rows;
  return far_update(t);
}

int64_t ur_tbe_far_rows(const ur_tbe *t) {
  UR__ARGS_OR(-1, t);
  return t ? t->far_rows : 0;
}

ur_status ur_tbe_far_refresh(ur_tbe *t) {
  UR__ARGS(t);
  ur__tbe_far_drop(t);
  return far_update(t);
}

ur_status ur_tbe_far_from(const ur_tbe *t, int32_t table, int64_t *out) {
  UR__ARGS(t, out);
  ur_status st = ur__tbe_names_index(&t->names, table);
  if (!st) *out = t->tables[table].far_from;
  return st;
}

ur_status ur_tbe_far_taken(ur_stream *s, ur_tbe *t, int64_t *out, int64_t *unplaced) {
  UR__ARGS(t, out);
  *out = 0;
  if (unplaced) *unplaced = 0;
  if (!t->far_made) return UR_STATUS_OK;
  int32_t n[2] = {0, 0};
  const char *base = ur_tensor_data(t->far);
  ur_status st = t->be->copy(s ? s->handle : NULL, n, base + layout_of(t, t->far_rows).taken, 8);
  if (!st) st = t->be->stream_sync(s ? s->handle : NULL);
  if (st) return st;
  *out = n[0];
  if (unplaced) *unplaced = n[1];
  return UR_STATUS_OK;
}

/* Points a at the copies (neither filling nor reading them yet). */
static void far_args(const ur_tbe *t, ur__tbe_args *a) {
  far_layout L = layout_of(t, t->far_rows);
  char *base = ur_tensor_data(t->far);
  a->far.keys = (unsigned long long *)base;
  a->far.at = (int32_t *)(base + L.at);
  a->far.taken = (int32_t *)(base + L.taken);
  a->far.rows = base + L.rows;
  a->far.mask = L.slots - 1;
  a->far.cap = (int32_t)t->far_rows;
  a->far.row_bytes = far_row_bytes(t);
}

ur_status ur__tbe_far_forward(ur_tbe *t, ur_stream *s, ur__tbe_args *a) {
  memset(&a->far, 0, sizeof a->far);
  t->far_made = t->far_ready = 0;
  /* with a room a forward always fills it, far rows or none: a captured step (train.graph)
   * then makes copies whatever the hints do after the capture */
  if (!t->far) return UR_STATUS_OK;
  far_args(t, a);
  void *sh = s ? s->handle : NULL;
  ur_status st = t->be->fill(sh, a->far.keys, (size_t)(a->far.mask + 1), 8, 0);
  if (!st) st = t->be->fill(sh, a->far.taken, 2, 4, 0);
  a->far.fill = !st;
  return st;
}

void ur__tbe_far_backward(const ur_tbe *t, ur__tbe_args *a) {
  memset(&a->far, 0, sizeof a->far);
  if (!t->far_ready) return;
  far_args(t, a);
  a->far.use = 1;
}
