/* far.c: the far rows' copies of a GPU collection (uvmrec.h, "far rows' copies"; the kernels'
 * half is in kernels/tbe.cu).  The room for the copies at home, keeping each table's far_from
 * current, when a forward makes copies and a backward may read them, and the early copies of
 * the next batch's far rows (ur_tbe_far_prefetch) in the next map.  Where far rows begin
 * (ur__tbe_far_from) and forgetting the copies (ur__tbe_far_drop) are table.c's: its calls that
 * write rows drop them, and this file calls table.c, not the other way.  Each map is one piece
 * of memory: the map (keys, then where each copy is), the counts (tbe_plan.h's UR__FAR_*), the
 * early copies' pairs and loads, each copy's home (where its row is, and its bytes) and the
 * copies; the maps are taken in turn (table.h's UR__FAR_MAPS).  Written behind
 * (ur_tbe_set_far_behind), a backward steps the copies only and they go home on the
 * collection's own stream: every call here that reads or writes rows at home waits for that
 * first (far_wait_home; table.c's far_settle for the rest).
 * The rows cross the link in copy kernels (far_move), or with ur_tbe_set_far_dma through the
 * copy engines and host threads (far_dma_*). */
#include "core/bypass.h"
#include "embedding/table.h"

#define FAR_ALIGN 256
#define FAR_LIST_BYTES 16 /* a load's or a home's entry: (slot | bytes << 32 or bytes, address) */

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

/* The memory's layout for `rows` copies: keys, at, taken, pairs, loads and homes, then the
 * copies. */
typedef struct far_layout {
  int64_t slots, at, taken, pairs, loads, homes, rows, total;
} far_layout;

static far_layout layout_of(const ur_tbe *t, int64_t rows) {
  far_layout L;
  L.slots = far_slots(rows);
  L.at = far_align(8 * L.slots);
  L.taken = L.at + far_align(4 * L.slots);
  L.pairs = L.taken + FAR_ALIGN;
  L.loads = L.pairs + far_align(8 * rows);
  L.homes = L.loads + far_align(FAR_LIST_BYTES * rows);
  L.rows = L.homes + far_align(FAR_LIST_BYTES * rows);
  L.total = L.rows + rows * far_row_bytes(t);
  return L;
}

/* The pinned staging's layout for `rows` copies (ur_tbe_set_far_dma): the counts (a map's
 * taken), the list (its loads or homes), then the copies in their slots. */
typedef struct far_staging {
  int64_t list, rows, total;
} far_staging;

static far_staging staging_of(const ur_tbe *t, int64_t rows) {
  far_staging L;
  L.list = FAR_ALIGN;
  L.rows = L.list + far_align(FAR_LIST_BYTES * rows);
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

/* The room (every map, and their pinned staging) freed, once no kernel or host call can read
 * it. */
static ur_status far_release(ur_tbe *t) {
  ur_status st = UR_STATUS_OK;
  if (t->far[0] && (st = t->be->device_sync())) return st; /* map 0 is made first */
  for (int k = 0; k < UR__FAR_MAPS; k++) {
    ur_tensor_free(t->far[k]);
    ur_tensor_free(t->far_host[k]);
    t->far[k] = t->far_host[k] = NULL;
  }
  t->far_cur = 0;
  return st;
}

static ur_status far_dma_ready(ur_tbe *t, const char *who);

/* Room for t->far_rows copies in far[k]. */
static ur_status far_alloc(ur_tbe *t, int k, const char *who) {
  int64_t bytes = layout_of(t, t->far_rows).total;
  ur_status st = ur__tbe_home_tensor(t, &t->far[k], UR_DTYPE_U8, bytes);
  if (st)
    return ur__error_cause(st, "tbe %s: room for %lld copies takes %lld bytes of HBM", who,
                           (long long)t->far_rows, (long long)bytes);
  return UR_STATUS_OK;
}

ur_status ur_tbe_set_far_rows(ur_tbe *t, int64_t rows) {
  UR__ARGS(t);
  if (rows < 0 || rows > INT32_MAX / 2)
    return ur__error(UR_STATUS_INVALID, "tbe set_far_rows: %lld copies; expected 0 (none) to %d",
                     (long long)rows, INT32_MAX / 2);
  t->far_made = t->far_captured = 0;
  ur_status st = ur__tbe_far_drop(t);
  if (st) return st;
  if (t->home == UR_PLACE_DEVICE && rows != t->far_rows) {
    /* kernels in flight may read the old copies */
    st = far_release(t);
    if (st) return st;
    t->far_rows = rows;
    if (rows > 0 && (st = far_alloc(t, 0, "set_far_rows"))) {
      t->far_rows = 0;
      return st;
    }
  }
  t->far_rows = rows;
  st = far_dma_ready(t, "set_far_rows");
  ur_status up = far_update(t);
  return st ? st : up;
}

int64_t ur_tbe_far_rows(const ur_tbe *t) {
  UR__ARGS_OR(-1, t);
  return t ? t->far_rows : 0;
}

ur_status ur_tbe_far_refresh(ur_tbe *t) {
  UR__ARGS(t);
  ur_status st = ur__tbe_far_drop(t);
  return st ? st : far_update(t);
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
  int32_t n[UR__FAR_UNPLACED + 1] = {0};
  const char *base = ur_tensor_data(t->far[t->far_cur]);
  ur_status st = t->be->read(s ? s->handle : NULL, n, base + layout_of(t, t->far_rows).taken,
                             sizeof n);
  if (st) return st;
  *out = n[UR__FAR_ASKED];
  if (unplaced) *unplaced = n[UR__FAR_UNPLACED];
  return UR_STATUS_OK;
}

/* f pointed at map k (neither filling nor reading it yet). */
static void far_args(const ur_tbe *t, int k, ur__tbe_far *f) {
  far_layout L = layout_of(t, t->far_rows);
  char *base = ur_tensor_data(t->far[k]);
  memset(f, 0, sizeof *f);
  f->keys = (unsigned long long *)base;
  f->at = (int32_t *)(base + L.at);
  f->taken = (int32_t *)(base + L.taken);
  f->pairs = (int32_t *)(base + L.pairs);
  f->loads = (int64_t *)(base + L.loads);
  f->homes = (int64_t *)(base + L.homes);
  f->rows = base + L.rows;
  f->mask = L.slots - 1;
  f->cap = (int32_t)t->far_rows;
  f->row_bytes = far_row_bytes(t);
}

/* Map f emptied on the stream: no keys, no counts; with at_too, every at -1 (early copies: a
 * forward reads an at only below the early count, and a stale one must not be). */
static ur_status far_clear(const ur_tbe *t, void *sh, const ur__tbe_far *f, int at_too) {
  size_t slots = (size_t)(f->mask + 1);
  ur_status st = t->be->fill(sh, f->keys, slots, 8, 0);
  if (!st && at_too) st = t->be->fill(sh, f->at, slots, 4, 0xFFFFFFFFu);
  if (!st) st = t->be->fill(sh, f->taken, UR__FAR_COUNTS, 4, 0);
  return st;
}

/* Event k (0: a forward's end, 1: early copies' end), made on first use. */
static ur_status far_event(ur_tbe *t, int k, void **out) {
  ur_status st = UR_STATUS_OK;
  if (!t->far_ev[k] && (st = t->be->event_new(&t->far_ev[k]))) return st;
  *out = t->far_ev[k];
  return UR_STATUS_OK;
}

/* Work enqueued on stream sh after this waits for the copies written home behind a step: map
 * k's, or -1 every map's (none pending: nothing to wait for).  A graph being captured
 * may not wait on work outside it: the host waits instead, before the capture goes on. */
static ur_status far_wait_home(ur_tbe *t, void *sh, int k) {
  int bits = k < 0 ? (1 << UR__FAR_MAPS) - 1 : 1 << k;
  if (!(t->far_home_pending & bits)) return UR_STATUS_OK;
  if (!ur__graph_capturing())
    return t->be->stream_wait(sh, t->far_home_ev[k < 0 ? t->far_home_last : k]);
  ur_status st = ur__tbe_far_settle(t);
  if (!st) t->far_home_pending = 0;
  return st;
}

ur_status ur_tbe_set_far_behind(ur_tbe *t, int32_t on) {
  UR__ARGS(t);
  if (on != 0 && on != 1)
    return ur__error(UR_STATUS_INVALID, "tbe set_far_behind: %d; expected 1 (far rows' copies "
                     "written home behind the step) or 0 (by the step)", (int)on);
  t->far_behind = on;
  return UR_STATUS_OK;
}

int32_t ur_tbe_far_behind(const ur_tbe *t) {
  UR__ARGS_OR(-1, t);
  return t->far_behind;
}

/* ---- through the copy engines (ur_tbe_set_far_dma) ---- */

#define FAR_DMA_AHEAD 16  /* rows ahead whose homes a host thread has in flight */

/* Map k's pinned staging (staging_of), made once there is a room: and what each way's host
 * call is given. */
static ur_status far_dma_alloc(ur_tbe *t, int k, const char *who) {
  if (t->far_host[k]) return UR_STATUS_OK;
  if (!t->be->host_call)
    return ur__error(UR_STATUS_UNSUPPORTED, "tbe %s: the %s backend has no host calls, which "
                     "set_far_dma's copies need", who, t->be->name);
  ur_status st = UR__NEED(t->be, tbe, far_spill);
  if (st) return st;
  far_staging L = staging_of(t, t->far_rows);
  if ((st = ur_tensor_new(&t->far_host[k], UR_DTYPE_U8, 1, &L.total, UR_PLACE_PINNED, UR_LOC_CPU)))
    return ur__error_cause(st, "tbe %s: set_far_dma's staging for %lld copies takes %lld bytes "
                           "of pinned host memory", who, (long long)t->far_rows, (long long)L.total);
  for (int h = 0; h < 2; h++)
    t->far_jobs[k][h] = (struct ur__far_job){ur_tensor_data(t->far_host[k]), t->far_rows, L.list,
                                             L.rows, far_row_bytes(t), h, -1, &t->far_dma_done[h]};
  return UR_STATUS_OK;
}

/* Every map's staging where t moves rows through the copy engines and has a room on a GPU:
 * made when the ways or the room are set, so that pinned memory too little fails there, not in
 * a step. */
static ur_status far_dma_ready(ur_tbe *t, const char *who) {
  ur_status st = UR_STATUS_OK;
  if (!t->far_dma || !t->far[0]) return st;
  for (int k = 0; k < UR__FAR_MAPS && !st; k++) st = far_dma_alloc(t, k, who);
  return st;
}

ur_status ur_tbe_set_far_dma(ur_tbe *t, int32_t ways) {
  UR__ARGS(t);
  if (ways < UR_FAR_DMA_NONE || ways > UR_FAR_DMA_BOTH)
    return ur__error(UR_STATUS_INVALID, "tbe set_far_dma: %d; expected %d (copy kernels), %d (the "
                     "write home through the copy engines), %d (the early copies) or %d (both)",
                     (int)ways, UR_FAR_DMA_NONE, UR_FAR_DMA_HOME, UR_FAR_DMA_EARLY, UR_FAR_DMA_BOTH);
  ur_device_props p;
  ur_status st = UR_STATUS_OK;
  if (ways && t->home == UR_PLACE_DEVICE && !(st = ur_device_props_get(t->cfg.device, &p)) &&
      !p.concurrent_managed_access)
    return ur__error(UR_STATUS_UNSUPPORTED, "tbe set_far_dma: GPU %d cannot have managed memory "
                     "read by the host while kernels run (concurrentManagedAccess is 0), which "
                     "the host threads do", (int)t->cfg.device);
  if (st) return st;
  int32_t was = t->far_dma;
  t->far_dma = ways;
  if ((st = far_dma_ready(t, "set_far_dma"))) t->far_dma = was; /* the ways set before stay */
  return st;
}

int32_t ur_tbe_far_dma(const ur_tbe *t) {
  UR__ARGS_OR(-1, t);
  return t->far_dma;
}

size_t ur_sizeof_far_dma_stats(void) { return sizeof(ur_far_dma_stats); }

ur_status ur_tbe_far_dma_stats(const ur_tbe *t, ur_far_dma_stats *out) {
  UR__ARGS(t, out);
  int64_t v[2][3];
  for (int h = 0; h < 2; h++) {
    const struct ur__far_done *d = &t->far_dma_done[h];
    v[h][0] = __atomic_load_n(&d->rows, __ATOMIC_RELAXED);
    v[h][1] = __atomic_load_n(&d->calls, __ATOMIC_RELAXED);
    v[h][2] = __atomic_load_n(&d->ns, __ATOMIC_RELAXED);
  }
  *out = (ur_far_dma_stats){.home_rows = v[1][0], .early_rows = v[0][0], .home_calls = v[1][1],
                            .early_calls = v[0][1], .home_seconds = v[1][2] * 1e-9,
                            .early_seconds = v[0][2] * 1e-9};
  return UR_STATUS_OK;
}

/* Rows [b, e) of a job's list, on a host thread: each copy written home from the staging (the
 * homes: bytes, address), or gathered into it in its copy's slot (the loads: slot | bytes << 32,
 * address).  The homes are scattered over the tables: the next FAR_DMA_AHEAD are asked for
 * ahead, and every row is stored past the caches (it is read next by the GPU). */
static void far_dma_range(void *ctx, size_t b, size_t e) {
  const struct ur__far_job *j = ctx;
  const int64_t *list = (const int64_t *)(j->base + j->list);
  char *rows = j->base + j->rows;
  for (size_t q = b; q < e; q++) {
    if (q + FAR_DMA_AHEAD < e) {
      const int64_t *y = list + 2 * (q + FAR_DMA_AHEAD);
      const char *h = (const char *)(intptr_t)y[1];
      int64_t n = j->home ? y[0] : y[0] >> 32;
      for (int64_t o = 0; o < n; o += 64) {
        if (j->home) __builtin_prefetch(h + o, 1);
        else __builtin_prefetch(h + o, 0);
      }
    }
    const int64_t *x = list + 2 * q;
    char *home = (char *)(intptr_t)x[1];
    if (j->home) ur__bypass_copy(home, rows + (int64_t)q * j->row_bytes, (size_t)x[0]);
    else ur__bypass_copy(rows + (x[0] & 0xffffffff) * j->row_bytes, home, (size_t)(x[0] >> 32));
  }
  ur__bypass_fence();
}

/* A job's rows, on the GPU's host-call thread: split into ranges for the engine's thread count
 * less two, which that thread and the engine's pool of threads take (parallel.c); two cores are
 * left to the thread that drives the GPU and the runtime's own. */
static void far_dma_run(void *ctx) {
  struct ur__far_job *j = ctx;
  double t0 = ur_clock_seconds();
  const int32_t *taken = (const int32_t *)j->base;
  int64_t made = taken[UR__FAR_ASKED] < j->cap ? taken[UR__FAR_ASKED] : j->cap;
  int64_t n = j->home ? made : taken[UR__FAR_LOADS];
  int64_t threads = ur__threads() > 3 ? ur__threads() - 2 : 1;
  size_t grain = (size_t)(n / threads + 1);
  ur__parallel_for((size_t)n, grain < 256 ? 256 : grain, far_dma_range, j);
  __atomic_store_n(&j->seen, made, __ATOMIC_RELAXED);
  __atomic_fetch_add(&j->done->rows, n, __ATOMIC_RELAXED);
  __atomic_fetch_add(&j->done->calls, 1, __ATOMIC_RELAXED);
  __atomic_fetch_add(&j->done->ns, (int64_t)((ur_clock_seconds() - t0) * 1e9), __ATOMIC_RELAXED);
}

/* The copies the copy engines move for map k: its last calls' copies and an eighth more (a
 * batch's count is known on the GPU only); the copy kernel far_spill moves any past them.  The
 * whole room until a call has said. */
static int64_t far_dma_extent(const ur_tbe *t) {
  int64_t seen = -1, cap = t->far_rows;
  for (int k = 0; k < UR__FAR_MAPS; k++)
    for (int h = 0; h < 2; h++) {
      int64_t v = __atomic_load_n(&t->far_jobs[k][h].seen, __ATOMIC_RELAXED);
      if (t->far_host[k] && v > seen) seen = v;
    }
  if (seen < 0) return cap;
  int64_t g = seen + seen / 8 + 256;
  return g < cap ? g : cap;
}

/* f's rows (map k's) moved over the link on stream sh: its loads into its copies (home 0: the
 * list down, the rows gathered by host threads, the copies up), or every copy home (1: the list
 * and the copies down, the rows written home by host threads); in copy kernels where far_dma
 * leaves that way to them. */
static ur_status far_move(ur_tbe *t, void *sh, int k, int home, const ur__tbe_far *f) {
  if (!(t->far_dma & (home ? UR_FAR_DMA_HOME : UR_FAR_DMA_EARLY)) || !t->far_host[k])
    return t->be->tbe->far_move(sh, f, home);
  struct ur__far_job *j = &t->far_jobs[k][home];
  int64_t g = far_dma_extent(t);
  size_t moved = (size_t)g * (size_t)j->row_bytes;
  char *staged = j->base + j->rows;
  ur_status st = t->be->copy(sh, j->base, f->taken, UR__FAR_COUNTS * sizeof(int32_t));
  if (!st)
    st = t->be->copy(sh, j->base + j->list, home ? f->homes : f->loads, FAR_LIST_BYTES * (size_t)j->cap);
  if (!st && home && !(st = t->be->copy(sh, staged, f->rows, moved)))
    st = t->be->tbe->far_spill(sh, f, staged, g, 1);
  if (!st) st = t->be->host_call(sh, far_dma_run, j);
  if (!st && !home && !(st = t->be->copy(sh, f->rows, staged, moved)))
    st = t->be->tbe->far_spill(sh, f, staged, g, 0);
  return st;
}

ur_status ur__tbe_far_forward(ur_tbe *t, ur_stream *s, ur__tbe_args *a) {
  memset(&a->far, 0, sizeof a->far);
  memset(&a->prior, 0, sizeof a->prior);
  t->far_made = t->far_ready = 0;
  /* with a room a forward always fills it, far rows or none: a captured step (train.graph)
   * then makes copies whatever the hints do after the capture */
  if (!t->far[0]) return UR_STATUS_OK;
  void *sh = s ? s->handle : NULL, *ev = NULL;
  ur_status st = UR_STATUS_OK;
  int capturing = ur__graph_capturing();
  t->far_captured |= capturing;
  t->far_graphed |= capturing;
  if (t->far_early && !capturing) {
    /* the early copies become the current ones, once made and patched with the rows the last
     * backward stepped (from the old current copies, which it kept current) */
    ur__tbe_far old;
    int was = t->far_cur;
    far_args(t, was, &old);
    /* the old copies, still the rows while they go home: a far row the forward finds no copy
     * of in its own map is read there; the map before them must be home (the early copies took
     * its rows without waiting for it) */
    if (t->far_homing == was + 1) {
      a->prior = old;
      a->prior.use = 1;
    }
    t->far_cur = (was + 1) % UR__FAR_MAPS;
    far_args(t, t->far_cur, &a->far);
    if (!(st = far_wait_home(t, sh, (was + 2) % UR__FAR_MAPS)) && !(st = far_event(t, 1, &ev)) &&
        !(st = t->be->stream_wait(sh, ev)))
      st = t->be->tbe->far_patch(sh, &a->far, &old, 0);
  } else {
    /* the forward reads rows at home and clears the map whose copies may be going there */
    far_args(t, t->far_cur, &a->far);
    if (!(st = far_wait_home(t, sh, -1))) st = far_clear(t, sh, &a->far, 0);
    if (t->far_homing == t->far_cur + 1) t->far_homing = 0;
    t->far_kept = 0; /* this map's rows are home now, older maps' copies of them stale */
  }
  t->far_early = 0;
  a->far.fill = !st;
  return st;
}

ur_status ur__tbe_far_forward_done(ur_tbe *t, ur_stream *s, const ur_tensor *values) {
  t->far_values = ur_tensor_data(values);
  t->far_n = ur_tensor_numel(values);
  t->far_open = 1;
  void *ev = NULL;
  /* early copies wait for it (none are made after a capture) */
  if (ur__graph_capturing()) return UR_STATUS_OK;
  ur_status st = far_event(t, 0, &ev);
  return st ? st : t->be->event_record(ev, s ? s->handle : NULL);
}

ur_status ur__tbe_far_backward(ur_tbe *t, ur_stream *s, ur__tbe_args *a, const ur_tensor *values) {
  memset(&a->far, 0, sizeof a->far);
  /* early copies made beside this step left this step's rows to it, as its forward read them:
   * a backward of other values (or one that steps by atomics, below) may write rows they hold */
  if (ur_tensor_data(values) != t->far_values || ur_tensor_numel(values) != t->far_n)
    t->far_early = t->far_kept = 0; /* ... and rows the kept maps hold */
  /* it reads and writes rows without copies at home, where the last copies may be going */
  ur_status st = far_wait_home(t, s ? s->handle : NULL, -1);
  if (!t->far_ready) t->far_kept = 0; /* it steps every row at home */
  if (st || !t->far_ready) return st;
  far_args(t, t->far_cur, &a->far);
  a->far.use = 1;
  /* a captured step would write the copies home in no replay */
  if (!t->far_behind || a->atomic || t->far_graphed || ur__graph_capturing()) return UR_STATUS_OK;
  /* what sends the copies home is had before the step writes them only: after it, a failure
   * would leave the rows in copies nothing may trust */
  for (int k = 0; k < UR__FAR_MAPS && !st; k++)
    if (!t->far_home_ev[k]) st = t->be->event_new(&t->far_home_ev[k]);
  if (!st && !t->far_bwd_ev) st = t->be->event_new(&t->far_bwd_ev);
  if (!st && !t->far_stream) st = t->be->stream_new(0, &t->far_stream);
  if (!st) st = UR__NEED(t->be, tbe, far_move);
  if (!st && (t->far_dma & UR_FAR_DMA_HOME)) st = far_dma_alloc(t, t->far_cur, "backward");
  a->far.behind = !st;
  return st;
}

ur_status ur__tbe_far_backward_done(ur_tbe *t, ur_stream *s, const ur__tbe_args *a,
                                    int32_t stepped) {
  if (stepped) t->far_open = 0;
  /* a step by atomics writes the rows, not the copies */
  if (stepped && a->atomic) return ur__tbe_far_drop(t);
  /* stepped there (and at home too, unless written behind): the newest of the rows they hold */
  if (stepped && a->far.use) t->far_kept |= 1 << t->far_cur;
  if (!stepped || !a->far.behind) return UR_STATUS_OK;
  /* the stepped copies go home on the collection's own stream, behind the step */
  void *sh = s ? s->handle : NULL;
  int k = t->far_cur;
  ur_status st = t->be->event_record(t->far_bwd_ev, sh);
  if (!st) st = t->be->stream_wait(t->far_stream, t->far_bwd_ev);
  if (!st) st = far_move(t, t->far_stream, k, 1, &a->far);
  if (!st) st = t->be->event_record(t->far_home_ev[k], t->far_stream);
  if (!st) {
    t->far_homing = k + 1;
    t->far_home_pending |= 1 << k;
    t->far_home_last = k;
    return UR_STATUS_OK;
  }
  /* the rows are in the copies only: they go home on the step's stream, and the host waits for
   * every stream, or the error says they may not have */
  ur_status st2 = t->be->device_sync();
  if (!st2) st2 = t->be->tbe->far_move(sh, &a->far, 1);
  if (!st2) st2 = t->be->stream_sync(sh);
  if (!st2) t->far_home_pending = 0;
  return ur__error_cause(st, "tbe backward: writing the far rows' copies home behind the step%s",
                         st2 ? " failed, and on the step's stream too: the rows the step wrote to "
                               "its copies may not have reached their homes" : " failed (they were "
                               "written on the step's stream instead)");
}

int32_t ur_tbe_far_early_usable(const ur_tbe *t) {
  UR__ARGS_OR(-1, t);
  return t->home == UR_PLACE_DEVICE && t->far[0] && !t->far_captured && !ur__graph_capturing();
}

ur_status ur__tbe_far_refuse_early(const ur_tbe *t) {
  if (ur__graph_capturing())
    return ur__error(UR_STATUS_INVALID, "tbe far_prefetch: a graph is being captured; early "
                     "copies are decided on the host, which a replay does not run");
  if (t->far_captured)
    return ur__error(UR_STATUS_INVALID, "tbe far_prefetch: a forward of this collection was "
                     "captured into a graph, whose replays would not take early copies; "
                     "set_far_rows again to use them eagerly");
  return UR_STATUS_OK;
}

ur_status ur__tbe_far_prefetch(ur_tbe *t, ur_stream *s, ur__tbe_args *a) {
  void *sh = s ? s->handle : NULL, *ev = NULL;
  int next = (t->far_cur + 1) % UR__FAR_MAPS, last = (t->far_cur + 2) % UR__FAR_MAPS;
  ur__tbe_far cur;
  memset(&cur, 0, sizeof cur);
  memset(&a->prior, 0, sizeof a->prior);
  t->far_early = 0;
  /* the last forward's backward is still to come and its copies are not in use (dropped by a
   * load, init_table, reset_rows, set_far_rows, ...): which rows that backward steps, and when,
   * is not known here, so none is copied early (a copy read now could miss its step); the next
   * forward reads them itself */
  if (t->far_open && !t->far_ready) return UR_STATUS_OK;
  /* it clears the next map, whose copies may still be going home (two steps ago: gone by now,
   * mostly); the rows it reads at home are of no map's copies (the current map's are paired,
   * the last step's taken from its copies), or went home with that map's */
  ur_status st = far_wait_home(t, sh, next);
  if (!st && !t->far[next]) st = far_alloc(t, next, "far_prefetch");
  if (!st && (t->far_dma & UR_FAR_DMA_EARLY)) st = far_dma_alloc(t, next, "far_prefetch");
  if (!st && t->far_made && t->far_ready) {
    /* after the last forward: its map is final, and every kernel reading the next map (the
     * forward's patch, the backward before it) was before it */
    far_args(t, t->far_cur, &cur);
    cur.use = 1;
    if (!(st = far_event(t, 0, &ev))) st = t->be->stream_wait(sh, ev);
    /* the last step's copies, the newest of the rows they hold but where cur has a copy: taken
     * from there, not from home, so that they need not wait for them to go; else they must */
    if (!st && (t->far_kept & (1 << last)) && t->far[last]) {
      far_args(t, last, &a->prior);
      a->prior.use = 1;
    } else if (!st) {
      st = far_wait_home(t, sh, last);
    }
  } else if (!st) {
    /* no current copies to leave rows to: nothing may write rows while these are read */
    st = t->be->device_sync();
  }
  /* the last early copies, made on another stream or left unread (dropped), may still be
   * filling this map (their host calls take milliseconds) */
  if (!st && t->far_ev[1]) st = t->be->stream_wait(sh, t->far_ev[1]);
  if (!st) {
    far_args(t, next, &a->far);
    a->far.fill = 1;
    st = far_clear(t, sh, &a->far, 1);
    if (t->far_homing == next + 1) t->far_homing = 0;
    t->far_kept &= ~(1 << next);
  }
  if (!st) st = t->be->tbe->far_prefetch(sh, a, &cur);
  if (!st) st = far_move(t, sh, next, 0, &a->far);
  /* after the loads, which through the copy engines fill every slot below their extent */
  if (!st && a->prior.use) st = t->be->tbe->far_patch(sh, &a->far, &a->prior, 1);
  if (!st && !(st = far_event(t, 1, &ev))) st = t->be->event_record(ev, sh);
  t->far_early = !st;
  return st;
}
