/* counters.c: per-row access counters of embedding tables.  The forward pass of either backend
 * counts each read of a row in its table's counter (when counting is on); the counters are
 * decayed here, by the collection's backend, and read by hint policies and layout.c's ranking. */
#include "embedding/table.h"

static ur_status check_index(const ur_tbe *t, int32_t i, int all_ok, const char *what) {
  if ((all_ok && i == -1) || (i >= 0 && i < t->names.T)) return UR_STATUS_OK;
  return ur__error(UR_STATUS_INVALID, "tbe: %s: table %d does not exist; expected 0..%d%s", what,
                   (int)i, (int)t->names.T - 1, all_ok ? " or -1 (every table)" : "");
}

static ur_status set_counting_one(ur_tbe *t, int32_t i, int32_t on) {
  ur__tbe_table *d = &t->tables[i];
  ur_tensor **slot = &t->counts[i];
  if (on && !*slot) {
    ur_status st = ur__tbe_home_tensor(t, slot, UR_DTYPE_I32, d->rows);
    if (!st) st = ur_tensor_fill(NULL, *slot, 0);
    if (st) {
      ur_tensor_free(*slot);
      *slot = NULL;
      return st;
    }
  }
  d->counts = on ? (int32_t *)ur_tensor_data(*slot) : NULL;
  return UR_STATUS_OK;
}

/* A cached table's kernels read the cache's slots, so its forward would count slots, not row
 * ids: it takes no counters (the cache's stats count its lookups).  Turning counting on for it
 * by name is refused; for every table (-1) it is skipped. */
ur_status ur_tbe_set_counting(ur_tbe *t, int32_t table, int32_t on) {
  UR__ARGS(t);
  ur_status st = check_index(t, table, 1, "set_counting");
  if (st) return st;
  if (on && table >= 0 && t->owner[table])
    return ur__error(UR_STATUS_INVALID,
                     "tbe: set_counting of table '%s': the table is cached (its kernels read the "
                     "cache's slots, which are no row ids); its cache's stats count its lookups",
                     t->tc[table].name);
  int32_t lo = table < 0 ? 0 : table, hi = table < 0 ? t->names.T : table + 1;
  for (int32_t i = lo; i < hi && !st; i++)
    if (!(on && t->owner[i])) st = set_counting_one(t, i, on != 0);
  ur_status sync = ur__tbe_sync_desc(t);
  return st ? st : sync;
}

int32_t ur_tbe_counting(const ur_tbe *t, int32_t table) {
  UR__ARGS_OR(-1, t);
  if (check_index(t, table, 0, "counting")) return 0;
  return t->tables[table].counts != NULL;
}

ur_status ur_tbe_counts(const ur_tbe *t, int32_t table, ur_tensor **out) {
  UR__ARGS(t, out);
  *out = NULL;
  ur_status st = check_index(t, table, 0, "counts");
  if (st) return st;
  ur_tensor *c = t->counts[table];
  if (!c)
    return ur__error(UR_STATUS_INVALID,
                     "tbe: table '%s' has no access counters; turn counting on first "
                     "(ur_tbe_set_counting)", t->tc[table].name);
  int64_t n = ur_tensor_numel(c);
  return ur_tensor_view_as(c, out, 0, 1, &n);
}

ur_status ur_tbe_decay_counts(ur_stream *s, ur_tbe *t, int32_t table, double factor) {
  UR__ARGS(t);
  ur_status st = check_index(t, table, 1, "decay_counts");
  if (st) return st;
  if (!(factor >= 0 && factor <= 1))
    return ur__error(UR_STATUS_INVALID, "tbe: decay factor %g; expected a value in [0, 1]", factor);
  int32_t lo = table < 0 ? 0 : table, hi = table < 0 ? t->names.T : table + 1;
  for (int32_t i = lo; i < hi && !st; i++) {
    ur_tensor *c = t->counts[i];
    if (!c) continue;
    if ((st = UR__NEED(t->be, tbe, decay_counts))) return st;
    st = t->be->tbe->decay_counts(s ? s->handle : NULL, ur_tensor_data(c), ur_tensor_numel(c),
                                  factor);
  }
  return st;
}
