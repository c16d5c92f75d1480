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

#endif
