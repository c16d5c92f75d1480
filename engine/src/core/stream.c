/* stream.c: streams (with priority), events and graphs.  On the CPU backend work is
 * synchronous, so a stream orders nothing, an event records the wall-clock time, and a graph
 * captures nothing (the calls between its begin and end run as they are made). */
#include <stdlib.h>
#include <time.h>
#include "core/core.h"

static const ur_backend *be(void) { return ur__gpu() ? ur__gpu() : ur__cpu(); }

ur_status ur_stream_new(ur_stream **out, int32_t priority) {
  UR__ARGS(out);
  *out = NULL;
  ur_stream *s = calloc(1, sizeof *s);
  if (!s) return ur__error(UR_STATUS_OOM, "stream: out of host memory");
  ur_status st = be()->stream_new(priority, &s->handle);
  if (st) {
    free(s);
    return st;
  }
  s->priority = priority;
  *out = s;
  return UR_STATUS_OK;
}

void ur_stream_free(ur_stream *s) {
  if (!s) return;
  be()->stream_free(s->handle);
  free(s);
}

ur_status ur_stream_sync(ur_stream *s) { return be()->stream_sync(s ? s->handle : NULL); }

int32_t ur_stream_priority(const ur_stream *s) { return s ? s->priority : 0; }

ur_status ur_event_new(ur_event **out) {
  UR__ARGS(out);
  *out = NULL;
  ur_event *e = calloc(1, sizeof *e);
  if (!e) return ur__error(UR_STATUS_OOM, "event: out of host memory");
  ur_status st = be()->event_new(&e->handle);
  if (st) {
    free(e);
    return st;
  }
  *out = e;
  return UR_STATUS_OK;
}

void ur_event_free(ur_event *e) {
  if (!e) return;
  be()->event_free(e->handle);
  free(e);
}

ur_status ur_event_record(ur_event *e, ur_stream *s) {
  UR__ARGS(e);
  e->recorded = 1;
  if (be()->event_record) return be()->event_record(e->handle, s ? s->handle : NULL);
  e->cpu_ms = ur_clock_seconds() * 1e3;
  return UR_STATUS_OK;
}

ur_status ur_event_sync(ur_event *e) {
  UR__ARGS(e);
  if (!e->recorded) return ur__error(UR_STATUS_INVALID, "event: synchronised before it was recorded");
  return be()->event_sync ? be()->event_sync(e->handle) : UR_STATUS_OK;
}

ur_status ur_event_elapsed(const ur_event *start, const ur_event *end, double *ms) {
  UR__ARGS(start, end, ms);
  if (!start->recorded || !end->recorded)
    return ur__error(UR_STATUS_INVALID, "event: elapsed time asked of an event never recorded");
  if (be()->event_elapsed) return be()->event_elapsed(start->handle, end->handle, ms);
  *ms = end->cpu_ms - start->cpu_ms;
  return UR_STATUS_OK;
}

/* ---- graphs ---- */

struct ur_graph {
  void *exec; /* the backend's executable graph */
};

/* Captures begun and not yet ended (ur__graph_capturing). */
static int capturing;

int ur__graph_capturing(void) { return capturing > 0; }

ur_status ur_graph_begin(ur_stream *s) {
  const ur_backend *b = be();
  if (!b->graph_begin) return UR_STATUS_OK;
  if (!s)
    return ur__error(UR_STATUS_INVALID,
                     "graph: the default stream cannot be captured; give a stream of ur_stream_new");
  ur_status st = b->graph_begin(s->handle);
  if (!st) capturing++;
  return st;
}

ur_status ur_graph_end(ur_stream *s, ur_graph **g) {
  UR__ARGS(g);
  const ur_backend *b = be();
  if (!b->graph_end) return UR_STATUS_OK;
  if (!s)
    return ur__error(UR_STATUS_INVALID,
                     "graph: the default stream cannot be captured; give a stream of ur_stream_new");
  if (capturing > 0) capturing--;
  ur_graph *out = *g;
  if (!out && !(out = calloc(1, sizeof *out))) {
    /* the capture must still end, or the stream stays capturing */
    void *none = NULL;
    b->graph_end(s->handle, &none);
    if (none) b->graph_free(none);
    return ur__error(UR_STATUS_OOM, "graph: out of host memory");
  }
  ur_status st = b->graph_end(s->handle, &out->exec);
  if (st && !*g) {
    free(out);
    return st;
  }
  *g = out;
  return st;
}

ur_status ur_graph_launch(ur_graph *g, ur_stream *s) {
  const ur_backend *b = be();
  if (!b->graph_launch || !g || !g->exec)
    return ur__error(UR_STATUS_UNSUPPORTED,
                     "graph: launch needs a graph captured on a GPU (%s)",
                     b->graph_launch ? "this one holds none" : "without one the calls ran eagerly");
  if (!s)
    return ur__error(UR_STATUS_INVALID, "graph: launch on the default stream; give the capture's");
  return b->graph_launch(g->exec, s->handle);
}

void ur_graph_free(ur_graph *g) {
  if (!g) return;
  if (g->exec && be()->graph_free) be()->graph_free(g->exec);
  free(g);
}
