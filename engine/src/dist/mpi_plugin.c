/* mpi_plugin.c: libuvmrec_mpi.so, the engine's MPI: host-memory collectives over a duplicate of
 * MPI_COMM_WORLD, each posted non-blocking and completed by wait.  Built against OpenMPI
 * (mpicc) apart from libuvmrec and opened at run time, so neither the engine nor a program of
 * one process needs MPI; it reaches the core only through the ur_core_api it is handed. */
#include <limits.h>
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dist/comm.h"

static const ur_core_api *core;
static int started_here; /* MPI_Init was ours, so MPI_Finalize is too */
static char library[MPI_MAX_LIBRARY_VERSION_STRING];

typedef struct pending {
  MPI_Request req;
  int *ints; /* counts and displacements the request reads until it completes */
} pending;

typedef struct mpi_net {
  MPI_Comm comm;
  int rank, world;
  pending *p;
  int np, cap;
} mpi_net;

static ur_status fail(int code, const char *what) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "code %d", code);
  return core->set_error(UR_STATUS_DEVICE, "comm: MPI %s failed: %s", what, msg);
}

#define MPI_TRY(call, what)                 \
  do {                                      \
    int rc_ = (call);                       \
    if (rc_ != MPI_SUCCESS) return fail(rc_, what); \
  } while (0)

static MPI_Datatype datatype(ur_dtype dt) {
  switch (dt) {
    case UR_DTYPE_F32: return MPI_FLOAT;
    case UR_DTYPE_F64: return MPI_DOUBLE;
    case UR_DTYPE_I32: return MPI_INT32_T;
    case UR_DTYPE_I64: return MPI_INT64_T;
    case UR_DTYPE_I8: return MPI_INT8_T;
    case UR_DTYPE_U8: return MPI_UINT8_T;
    default: return MPI_UINT16_T; /* f16, bf16: moved as bits, never reduced */
  }
}

static ur_status reducible(ur_dtype dt, const char *what) {
  if (dt == UR_DTYPE_F32 || dt == UR_DTYPE_F64 || dt == UR_DTYPE_I32 || dt == UR_DTYPE_I64)
    return UR_STATUS_OK;
  return core->set_error(UR_STATUS_INVALID, "comm: %s of dtype %d over MPI; expected f32, f64, "
                                            "i32 or i64", what, (int)dt);
}

static MPI_Op reduce_op(ur_reduce_op op) {
  return op == UR_REDUCE_MAX ? MPI_MAX : op == UR_REDUCE_MIN ? MPI_MIN : MPI_SUM;
}

static ur_status fits(int64_t n, const char *what) {
  if (n < 0 || n > INT_MAX)
    return core->set_error(UR_STATUS_INVALID,
                           "comm: %s of %lld elements in one MPI call; at most %d", what,
                           (long long)n, INT_MAX);
  return UR_STATUS_OK;
}

/* A new pending entry, with room for nints ints it keeps until completion. */
static ur_status push(mpi_net *n, int nints, pending **out) {
  if (n->np == n->cap) {
    int cap = n->cap ? 2 * n->cap : 8;
    pending *p = realloc(n->p, (size_t)cap * sizeof *p);
    if (!p) return core->set_error(UR_STATUS_OOM, "comm: out of host memory");
    n->p = p;
    n->cap = cap;
  }
  pending *e = &n->p[n->np];
  e->req = MPI_REQUEST_NULL;
  e->ints = NULL;
  if (nints && !(e->ints = malloc((size_t)nints * sizeof(int))))
    return core->set_error(UR_STATUS_OOM, "comm: out of host memory");
  n->np++;
  *out = e;
  return UR_STATUS_OK;
}

/* A reduction's checks (its dtype, its count of elements in one call) and its pending entry. */
static ur_status start_reduction(mpi_net *n, ur_dtype dt, int64_t count, const char *what,
                                 pending **out) {
  ur_status st = reducible(dt, what);
  if (!st) st = fits(count, what);
  if (!st) st = push(n, 0, out);
  return st;
}

/* counts[r] into ints[0..W) and their running sums into ints[W..2W). */
static ur_status layout(const int64_t *counts, int world, int *ints, const char *what) {
  int64_t at = 0;
  for (int r = 0; r < world; r++) {
    ur_status st = fits(counts[r], what);
    if (!st) st = fits(at, what);
    if (st) return st;
    ints[r] = (int)counts[r];
    ints[world + r] = (int)at;
    at += counts[r];
  }
  return fits(at, what);
}

static ur_status mpi_open(void **out, int32_t *rank, int32_t *world, int32_t *local_rank,
                          int32_t *local_world) {
  int inited = 0, finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized)
    return core->set_error(UR_STATUS_INVALID, "comm: MPI was finalized; it cannot start again");
  MPI_Initialized(&inited);
  if (!inited) {
    int provided;
    MPI_TRY(MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    started_here = 1;
  }
  mpi_net *n = calloc(1, sizeof *n);
  if (!n) return core->set_error(UR_STATUS_OOM, "comm: out of host memory");
  int rc = MPI_Comm_dup(MPI_COMM_WORLD, &n->comm);
  if (rc != MPI_SUCCESS) {
    free(n);
    return fail(rc, "MPI_Comm_dup");
  }
  /* Errors come back as codes, not as an abort inside MPI. */
  MPI_Comm_set_errhandler(n->comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(n->comm, &n->rank);
  MPI_Comm_size(n->comm, &n->world);
  MPI_Comm local;
  int lr = 0, lw = 1;
  if (MPI_Comm_split_type(n->comm, MPI_COMM_TYPE_SHARED, n->rank, MPI_INFO_NULL, &local) ==
      MPI_SUCCESS) {
    MPI_Comm_rank(local, &lr);
    MPI_Comm_size(local, &lw);
    MPI_Comm_free(&local);
  }
  *rank = n->rank;
  *world = n->world;
  *local_rank = lr;
  *local_world = lw;
  *out = n;
  return UR_STATUS_OK;
}

/* How long a wait may take, in seconds (UVMREC_COMM_TIMEOUT; 0: no limit).  A rank that died is
 * noticed by mpirun, which stops the job; one that hangs or skipped a collective is noticed
 * here: the wait fails naming the timeout, and the failing exit aborts the job. */
static double timeout_s(void) {
  const char *v = getenv("UVMREC_COMM_TIMEOUT");
  if (!v || !*v) return UR__COMM_TIMEOUT_DEFAULT;
  char *end;
  double t = strtod(v, &end);
  return (*end || t < 0) ? -1 : t;
}

/* Tests req until it completes or the limit passes (seconds since start; 0: none), yielding
 * between tests so that ranks sharing cores make progress. */
static ur_status settle(mpi_net *n, MPI_Request *req, double start, double limit) {
  for (unsigned k = 0;; k++) {
    int done = 0;
    int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return fail(rc, "MPI_Test");
    if (done) return UR_STATUS_OK;
    if (limit > 0 && (k & 255) == 255 && MPI_Wtime() - start > limit)
      return core->set_error(UR_STATUS_DEVICE,
                             "comm: rank %d of %d waited %.0f s for its collectives "
                             "(UVMREC_COMM_TIMEOUT): another rank stopped, failed or made "
                             "other calls",
                             n->rank, n->world, MPI_Wtime() - start);
    sched_yield();
  }
}

static ur_status limit_of(double *limit) {
  *limit = timeout_s();
  if (*limit < 0)
    return core->set_error(UR_STATUS_INVALID, "comm: UVMREC_COMM_TIMEOUT is '%s'; expected seconds >= 0 "
                                              "(0: no limit)", getenv("UVMREC_COMM_TIMEOUT"));
  return UR_STATUS_OK;
}

static ur_status mpi_wait(void *net) {
  mpi_net *n = net;
  double limit;
  ur_status st = limit_of(&limit);
  double start = MPI_Wtime();
  for (int i = 0; i < n->np && !st; i++) st = settle(n, &n->p[i].req, start, limit);
  /* A request that did not complete may still read its arrays: kept for the next wait. */
  if (st) return st;
  for (int i = 0; i < n->np; i++) free(n->p[i].ints);
  n->np = 0;
  return st;
}

/* The checks' exchanges, done before the collective they check is posted (the requests posted
 * before them go on): every rank's k values side by side (all: k * world), and mine[r] sent to
 * rank r, got[r] received from it. */
static ur_status mpi_gather_check(void *net, const int64_t *mine, int32_t k, int64_t *all) {
  mpi_net *n = net;
  double limit;
  ur_status st = limit_of(&limit);
  MPI_Request req = MPI_REQUEST_NULL;
  if (!st) MPI_TRY(MPI_Iallgather(mine, k, MPI_INT64_T, all, k, MPI_INT64_T, n->comm, &req),
                   "MPI_Iallgather");
  return st ? st : settle(n, &req, MPI_Wtime(), limit);
}

static ur_status mpi_swap_check(void *net, const int64_t *mine, int64_t *got) {
  mpi_net *n = net;
  double limit;
  ur_status st = limit_of(&limit);
  MPI_Request req = MPI_REQUEST_NULL;
  if (!st) MPI_TRY(MPI_Ialltoall(mine, 1, MPI_INT64_T, got, 1, MPI_INT64_T, n->comm, &req),
                   "MPI_Ialltoall");
  return st ? st : settle(n, &req, MPI_Wtime(), limit);
}

static void mpi_close(void *net) {
  mpi_net *n = net;
  if (!n) return;
  /* left to the process's end when its requests do not complete (see mpi_wait) */
  if (mpi_wait(n)) return;
  free(n->p);
  MPI_Comm_free(&n->comm);
  free(n);
}

static ur_status mpi_all_to_all(void *net, ur_dtype dt, const void *send,
                                const int64_t *send_counts, void *recv,
                                const int64_t *recv_counts) {
  mpi_net *n = net;
  pending *p = NULL;
  ur_status st = push(n, 4 * n->world, &p);
  if (!st) st = layout(send_counts, n->world, p->ints, "all_to_all send");
  if (!st) st = layout(recv_counts, n->world, p->ints + 2 * n->world, "all_to_all receive");
  if (st) return st;
  MPI_Datatype t = datatype(dt);
  int *sc = p->ints, *rc = p->ints + 2 * n->world;
  MPI_TRY(MPI_Ialltoallv(send, sc, sc + n->world, t, recv, rc, rc + n->world, t, n->comm,
                         &p->req),
          "MPI_Ialltoallv");
  return UR_STATUS_OK;
}

static ur_status mpi_all_reduce(void *net, ur_dtype dt, ur_reduce_op op, const void *send,
                                void *recv, int64_t count) {
  mpi_net *n = net;
  pending *p = NULL;
  ur_status st = start_reduction(n, dt, count, "all_reduce", &p);
  if (st) return st;
  MPI_TRY(MPI_Iallreduce(send == recv ? MPI_IN_PLACE : send, recv, (int)count, datatype(dt),
                         reduce_op(op), n->comm, &p->req),
          "MPI_Iallreduce");
  return UR_STATUS_OK;
}

static ur_status mpi_reduce_scatter(void *net, ur_dtype dt, ur_reduce_op op, const void *send,
                                    void *recv, int64_t count) {
  mpi_net *n = net;
  pending *p = NULL;
  ur_status st = start_reduction(n, dt, count * n->world, "reduce_scatter", &p);
  if (st) return st;
  MPI_TRY(MPI_Ireduce_scatter_block(send, recv, (int)count, datatype(dt), reduce_op(op), n->comm,
                                    &p->req),
          "MPI_Ireduce_scatter_block");
  return UR_STATUS_OK;
}

static ur_status mpi_all_gather(void *net, ur_dtype dt, const void *send, void *recv,
                                const int64_t *counts) {
  mpi_net *n = net;
  pending *p = NULL;
  ur_status st = push(n, 2 * n->world, &p);
  if (!st) st = layout(counts, n->world, p->ints, "all_gather");
  if (st) return st;
  MPI_TRY(MPI_Iallgatherv(send, p->ints[n->rank], datatype(dt), recv, p->ints,
                          p->ints + n->world, datatype(dt), n->comm, &p->req),
          "MPI_Iallgatherv");
  return UR_STATUS_OK;
}

static ur_status mpi_broadcast(void *net, ur_dtype dt, void *buf, int64_t count, int32_t root) {
  mpi_net *n = net;
  pending *p = NULL;
  ur_status st = fits(count, "broadcast");
  if (!st) st = push(n, 0, &p);
  if (st) return st;
  MPI_TRY(MPI_Ibcast(buf, (int)count, datatype(dt), root, n->comm, &p->req), "MPI_Ibcast");
  return UR_STATUS_OK;
}

static ur_status mpi_barrier(void *net) {
  mpi_net *n = net;
  ur_status st = mpi_wait(n);
  pending *p = NULL;
  if (!st) st = push(n, 0, &p);
  if (st) return st;
  MPI_TRY(MPI_Ibarrier(n->comm, &p->req), "MPI_Ibarrier");
  return mpi_wait(n);
}

static void mpi_exit(int32_t code) {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (!inited || finalized) return;
  if (code) MPI_Abort(MPI_COMM_WORLD, code);
  else if (started_here) MPI_Finalize();
}

/* A program that returns from main without ur_comm_exit still finalizes (a failing one should
 * call it: MPI_Finalize would wait for ranks that wait for it). */
static void at_exit(void) { mpi_exit(0); }

static const char *mpi_library(void) {
  if (!library[0]) {
    int len = 0;
    MPI_Get_library_version(library, &len);
    char *nl = strchr(library, '\n');
    if (nl) *nl = 0;
    char *comma = strchr(library, ',');
    if (comma) *comma = 0;
  }
  return library;
}

static const ur__mpi_api api = {
    .abi = UR_MPI_ABI,
    .open = mpi_open,
    .close = mpi_close,
    .all_to_all = mpi_all_to_all,
    .all_reduce = mpi_all_reduce,
    .reduce_scatter = mpi_reduce_scatter,
    .all_gather = mpi_all_gather,
    .broadcast = mpi_broadcast,
    .barrier = mpi_barrier,
    .wait = mpi_wait,
    .gather_check = mpi_gather_check,
    .swap_check = mpi_swap_check,
    .exit = mpi_exit,
    .library = mpi_library,
};

__attribute__((visibility("default"))) ur_status ur_mpi_plugin_init(const ur_core_api *c,
                                                                     const ur__mpi_api **out) {
  static int registered;
  core = c;
  if (!registered) {
    atexit(at_exit);
    registered = 1;
  }
  *out = &api;
  return UR_STATUS_OK;
}
