/* qtbe.h: the quantized embedding collection's ops table, filled by the CPU reference
 * (engine/src/embedding/qtbe_cpu.c) and by the CUDA backend (kernels/qtbe.cu).  qtbe_plan.h
 * holds the arguments and the formats' arithmetic; qtbe.c has checked every tensor before an
 * entry runs. */
#ifndef UR_QTBE_H
#define UR_QTBE_H

#include "core/core.h"
#include "embedding/qtbe_plan.h"

typedef struct ur_qtbe_ops {
  /* Pools (or, pooling none, copies out) every bag's dequantized rows into a->out, noting ids
   * that map outside their table in a->flags unless bounds are off.  Enqueued on the stream. */
  ur_status (*forward)(void *stream, const struct ur__qtbe_args *a);
} ur_qtbe_ops;

/* The CPU backend's table (qtbe_cpu.c), the reference. */
UR__HIDDEN extern const ur_qtbe_ops ur__cpu_qtbe_ops;

/* ur_qtbe_forward for a caller whose request holds the features' values elsewhere (the serving
 * API's, which reorders a request's keys into the model's order): value_at[f] is where feature
 * f's values start in the caller's request, so that a bad id's message names the value the
 * caller can find; NULL: the values as given. */
UR__HIDDEN ur_status ur__qtbe_forward_at(ur_stream *s, ur_qtbe *q, const ur_tensor *values,
                                         const ur_tensor *offsets, const ur_tensor *weights,
                                         ur_tensor *out, const int64_t *value_at);

#endif
