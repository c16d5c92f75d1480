/* comm.cu: the CUDA backend's collectives: device memory through NCCL (opened at run time by
 * the core, dist/nccl.c), on the communicator's own stream of the device's highest priority,
 * ordered after the caller's stream by an event and joined back to it by wait.
 *
 * Faults: with NCCL 2.14 or later the communicator is non-blocking (its calls may return
 * ncclInProgress, settled here by polling ncclCommGetAsyncError), and a watchdog thread follows
 * the work each wait posted: if it has not completed UVMREC_COMM_TIMEOUT seconds (300 by
 * default; 0: no limit) after it was posted, or NCCL reports an asynchronous error (a peer gone),
 * the watchdog aborts the communicator (ncclCommAbort), which ends its kernels, and every later
 * call fails naming the cause, so the rank's error exit ends the job instead of a hang. */
#include <cuda_runtime.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.cuh"
#include "dist/comm.h"

struct ur_nccl_net {
  const ur__nccl_api *api;
  ur__nccl_comm_t comm;
  cudaStream_t stream;      /* the collectives' own */
  cudaEvent_t before, after; /* the caller's work so far; the collectives' so far */
  int32_t rank, world, device;
  int *one;                 /* a device int the barrier reduces */
  int grouped;
  /* the watchdog's: the last wait's work and when it was posted, the limit, the abort */
  int nonblocking;
  double timeout, posted_at;
  int pending, watching;
  volatile int stop, aborted;
  char why[512];
  pthread_t watchdog;
  pthread_mutex_t mu;
};

static ur_status nccl_fail(const ur_nccl_net *n, int rc, const char *what) {
  return ur__cuda_core->set_error(UR_STATUS_DEVICE, "comm: NCCL %s failed on rank %d: %s", what,
                                  (int)n->rank, n->api->get_error_string(rc));
}

static ur_status aborted_error(ur_nccl_net *n) {
  pthread_mutex_lock(&n->mu);
  ur_status st = ur__cuda_core->set_error(UR_STATUS_DEVICE, "comm: rank %d's NCCL communicator was "
                                          "aborted: %s", (int)n->rank, n->why);
  pthread_mutex_unlock(&n->mu);
  return st;
}

/* A call's result: ncclInProgress (a non-blocking communicator) is polled until it settles, the
 * limit passes or the watchdog aborts. */
static ur_status nccl_settle(ur_nccl_net *n, int rc, const char *what) {
  double start = ur__cuda_core->clock_seconds();
  while (rc == UR__NCCL_IN_PROGRESS && n->comm && n->api->comm_get_async_error) {
    if (n->aborted) return aborted_error(n);
    if (n->timeout > 0 && ur__cuda_core->clock_seconds() - start > n->timeout)
      return ur__cuda_core->set_error(UR_STATUS_DEVICE, "comm: NCCL %s on rank %d did not complete "
                                      "within %.0f s (UVMREC_COMM_TIMEOUT)", what, (int)n->rank,
                                      n->timeout);
    sched_yield();
    int r = UR__NCCL_SUCCESS;
    int q = n->api->comm_get_async_error(n->comm, &r);
    rc = q != UR__NCCL_SUCCESS ? q : r;
  }
  if (rc != UR__NCCL_SUCCESS) return nccl_fail(n, rc, what);
  return UR_STATUS_OK;
}

#define NCCL_TRY(n, call, what)                              \
  do {                                                       \
    if ((n)->aborted) return aborted_error(n);               \
    ur_status st_ = nccl_settle((n), (call), what);          \
    if (st_) return st_;                                     \
  } while (0)

static void watchdog_abort(ur_nccl_net *n, const char *why) {
  pthread_mutex_lock(&n->mu);
  snprintf(n->why, sizeof n->why, "%s", why);
  pthread_mutex_unlock(&n->mu);
  n->aborted = 1;
  n->api->comm_abort(n->comm);
}

/* Every 50 ms: has the last wait's work completed, is it past the limit, has NCCL an error? */
static void *watch(void *arg) {
  ur_nccl_net *n = (ur_nccl_net *)arg;
  cudaSetDevice(n->device);
  while (!n->stop && !n->aborted) {
    struct timespec t = {0, 50 * 1000 * 1000};
    nanosleep(&t, NULL);
    pthread_mutex_lock(&n->mu);
    int pending = n->pending;
    double posted = n->posted_at;
    pthread_mutex_unlock(&n->mu);
    if (n->nonblocking && n->api->comm_get_async_error) {
      int r = UR__NCCL_SUCCESS;
      if (n->api->comm_get_async_error(n->comm, &r) == UR__NCCL_SUCCESS && r != UR__NCCL_SUCCESS &&
          r != UR__NCCL_IN_PROGRESS) {
        char why[400];
        snprintf(why, sizeof why, "NCCL reported an asynchronous error (%s): another rank failed "
                 "or its connection broke", n->api->get_error_string(r));
        watchdog_abort(n, why);
        break;
      }
    }
    if (!pending) continue;
    cudaError_t q = cudaEventQuery(n->after);
    if (q == cudaSuccess) {
      pthread_mutex_lock(&n->mu);
      if (n->posted_at == posted) n->pending = 0;
      pthread_mutex_unlock(&n->mu);
    } else if (q == cudaErrorNotReady && n->timeout > 0 && ur__cuda_core->clock_seconds() - posted > n->timeout) {
      char why[400];
      snprintf(why, sizeof why, "its collectives did not complete within %.0f s "
               "(UVMREC_COMM_TIMEOUT): another rank stopped, failed or made other calls",
               n->timeout);
      watchdog_abort(n, why);
      break;
    } else if (q != cudaErrorNotReady && q != cudaSuccess) {
      cudaGetLastError();
    }
  }
  return NULL;
}

static int nccl_type(ur_dtype dt) {
  switch (dt) {
    case UR_DTYPE_F32: return UR__NCCL_FLOAT32;
    case UR_DTYPE_F64: return UR__NCCL_FLOAT64;
    case UR_DTYPE_F16: return UR__NCCL_FLOAT16;
    case UR_DTYPE_BF16: return UR__NCCL_BFLOAT16;
    case UR_DTYPE_I32: return UR__NCCL_INT32;
    case UR_DTYPE_I64: return UR__NCCL_INT64;
    case UR_DTYPE_I8: return UR__NCCL_INT8;
    default: return UR__NCCL_UINT8;
  }
}

static int nccl_op(ur_reduce_op op) {
  return op == UR_REDUCE_MAX ? UR__NCCL_MAX : op == UR_REDUCE_MIN ? UR__NCCL_MIN : UR__NCCL_SUM;
}

static size_t elem(ur_dtype dt) {
  switch (dt) {
    case UR_DTYPE_F64: case UR_DTYPE_I64: return 8;
    case UR_DTYPE_F32: case UR_DTYPE_I32: return 4;
    case UR_DTYPE_F16: case UR_DTYPE_BF16: return 2;
    default: return 1;
  }
}

static void nccl_close(void *net) {
  ur_nccl_net *n = (ur_nccl_net *)net;
  if (!n) return;
  if (n->watching) {
    n->stop = 1;
    pthread_join(n->watchdog, NULL);
  }
  pthread_mutex_destroy(&n->mu);
  if (n->comm && !n->aborted) n->api->comm_destroy(n->comm);
  if (n->stream) ur__cuda_drop(cudaStreamDestroy(n->stream));
  if (n->before) ur__cuda_drop(cudaEventDestroy(n->before));
  if (n->after) ur__cuda_drop(cudaEventDestroy(n->after));
  if (n->one) {
    ur__cuda_drop(cudaFree(n->one));
    ur__cuda_core->workspace_give(sizeof(int));
  }
  free(n);
}

static ur_status nccl_setup(const ur__comm_boot *boot, ur_nccl_net *n) {
  int least = 0, greatest = 0;
  UR_CUDA_CHECK(cudaSetDevice(boot->device), "cudaSetDevice(%d)", (int)boot->device);
  UR_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest),
                "cudaDeviceGetStreamPriorityRange");
  UR_CUDA_CHECK(cudaStreamCreateWithPriority(&n->stream, cudaStreamNonBlocking, greatest),
                "cudaStreamCreateWithPriority(%d) for the collectives", greatest);
  UR_CUDA_CHECK(cudaEventCreateWithFlags(&n->before, cudaEventDisableTiming), "cudaEventCreate");
  UR_CUDA_CHECK(cudaEventCreateWithFlags(&n->after, cudaEventDisableTiming), "cudaEventCreate");
  /* the barrier's word is the engine's own device memory: it counts against the HBM budget */
  ur_status st = ur__cuda_core->workspace_take(sizeof(int), "a communicator's barrier word");
  if (st) return st;
  cudaError_t e = cudaMalloc((void **)&n->one, sizeof(int));
  if (e != cudaSuccess) {
    n->one = NULL;
    ur__cuda_core->workspace_give(sizeof(int));
    return ur__cuda_fail(e, "cudaMalloc of the barrier's int");
  }
  ur__nccl_id id;
  memset(&id, 0, sizeof id);
  if (boot->rank == 0) NCCL_TRY(n, n->api->get_unique_id(&id), "ncclGetUniqueId");
  st = boot->share(boot->share_ctx, &id, sizeof id);
  if (st) return st;
  const char *limit = getenv("UVMREC_COMM_TIMEOUT");
  char *end = NULL;
  n->timeout = limit && *limit ? strtod(limit, &end) : UR__COMM_TIMEOUT_DEFAULT;
  if (limit && *limit && (*end || n->timeout < 0))
    return ur__cuda_core->set_error(UR_STATUS_INVALID, "comm: UVMREC_COMM_TIMEOUT is '%s'; expected "
                                    "seconds >= 0 (0: no limit)", limit);
  if (n->api->comm_init_rank_config && n->api->comm_get_async_error) {
    ur__nccl_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.size = sizeof cfg;
    cfg.magic = UR__NCCL_CONFIG_MAGIC;
    cfg.version = UR__NCCL_CONFIG_VERSION;
    cfg.blocking = 0;
    cfg.cga_cluster_size = cfg.min_ctas = cfg.max_ctas = INT_MIN; /* NCCL_CONFIG_UNDEF_INT */
    cfg.net_name = NULL;
    n->nonblocking = 1;
    NCCL_TRY(n, n->api->comm_init_rank_config(&n->comm, boot->world, id, boot->rank, &cfg),
             "ncclCommInitRankConfig (non-blocking)");
  } else {
    NCCL_TRY(n, n->api->comm_init_rank(&n->comm, boot->world, id, boot->rank), "ncclCommInitRank");
  }
  if (pthread_create(&n->watchdog, NULL, watch, n))
    return ur__cuda_core->set_error(UR_STATUS_INVALID, "comm: cannot start the NCCL watchdog thread");
  n->watching = 1;
  return UR_STATUS_OK;
}

static ur_status nccl_open(ur__comm_boot *boot, void **out) {
  if (!boot->nccl)
    return ur__cuda_core->set_error(UR_STATUS_UNSUPPORTED, "comm: device collectives need NCCL");
  ur_nccl_net *n = (ur_nccl_net *)calloc(1, sizeof *n);
  if (!n) return ur__cuda_core->set_error(UR_STATUS_OOM, "comm: out of host memory");
  n->api = boot->nccl;
  pthread_mutex_init(&n->mu, NULL);
  n->rank = boot->rank;
  n->world = boot->world;
  n->device = boot->device;
  ur_status st = nccl_setup(boot, n);
  if (st) {
    nccl_close(n);
    return st;
  }
  *out = n;
  return UR_STATUS_OK;
}

/* The collectives' stream waits for the caller's work so far. */
static ur_status after_caller(ur_nccl_net *n, void *stream) {
  if (n->aborted) return aborted_error(n);
  UR_CUDA_CHECK(cudaEventRecord(n->before, (cudaStream_t)stream), "cudaEventRecord");
  UR_CUDA_CHECK(cudaStreamWaitEvent(n->stream, n->before, 0), "cudaStreamWaitEvent");
  return UR_STATUS_OK;
}

static ur_status nccl_all_to_all(void *stream, void *net, ur_dtype dt, const void *send,
                                 const int64_t *send_counts, void *recv,
                                 const int64_t *recv_counts) {
  ur_nccl_net *n = (ur_nccl_net *)net;
  ur_status st = after_caller(n, stream);
  if (st) return st;
  size_t es = elem(dt);
  int t = nccl_type(dt);
  size_t so = 0, ro = 0;
  NCCL_TRY(n, n->api->group_start(), "ncclGroupStart");
  for (int32_t r = 0; r < n->world; r++) {
    if (send_counts[r])
      NCCL_TRY(n, n->api->send((const char *)send + so * es, (size_t)send_counts[r], t, r,
                               n->comm, n->stream),
               "ncclSend");
    if (recv_counts[r])
      NCCL_TRY(n, n->api->recv((char *)recv + ro * es, (size_t)recv_counts[r], t, r, n->comm,
                               n->stream),
               "ncclRecv");
    so += (size_t)send_counts[r];
    ro += (size_t)recv_counts[r];
  }
  NCCL_TRY(n, n->api->group_end(), "ncclGroupEnd");
  return UR_STATUS_OK;
}

static ur_status nccl_all_reduce(void *stream, void *net, ur_dtype dt, ur_reduce_op op,
                                 const void *send, void *recv, int64_t count) {
  ur_nccl_net *n = (ur_nccl_net *)net;
  ur_status st = after_caller(n, stream);
  if (st) return st;
  NCCL_TRY(n, n->api->all_reduce(send, recv, (size_t)count, nccl_type(dt), nccl_op(op), n->comm,
                                 n->stream),
           "ncclAllReduce");
  return UR_STATUS_OK;
}

static ur_status nccl_reduce_scatter(void *stream, void *net, ur_dtype dt, ur_reduce_op op,
                                     const void *send, void *recv, int64_t count) {
  ur_nccl_net *n = (ur_nccl_net *)net;
  ur_status st = after_caller(n, stream);
  if (st) return st;
  NCCL_TRY(n, n->api->reduce_scatter(send, recv, (size_t)count, nccl_type(dt), nccl_op(op),
                                     n->comm, n->stream),
           "ncclReduceScatter");
  return UR_STATUS_OK;
}

/* Equal counts: one all-gather; else each rank's block broadcast from it, in one group. */
static ur_status nccl_all_gather(void *stream, void *net, ur_dtype dt, const void *send,
                                 void *recv, const int64_t *counts) {
  ur_nccl_net *n = (ur_nccl_net *)net;
  ur_status st = after_caller(n, stream);
  if (st) return st;
  int equal = 1;
  for (int32_t r = 1; r < n->world; r++) equal &= counts[r] == counts[0];
  if (equal) {
    NCCL_TRY(n, n->api->all_gather(send, recv, (size_t)counts[0], nccl_type(dt), n->comm,
                                   n->stream),
             "ncclAllGather");
    return UR_STATUS_OK;
  }
  size_t es = elem(dt), at = 0;
  NCCL_TRY(n, n->api->group_start(), "ncclGroupStart");
  for (int32_t r = 0; r < n->world; r++) {
    char *dst = (char *)recv + at * es;
    if (counts[r])
      NCCL_TRY(n, n->api->broadcast(r == n->rank ? send : dst, dst, (size_t)counts[r],
                                    nccl_type(dt), r, n->comm, n->stream),
               "ncclBroadcast");
    at += (size_t)counts[r];
  }
  NCCL_TRY(n, n->api->group_end(), "ncclGroupEnd");
  return UR_STATUS_OK;
}

static ur_status nccl_broadcast(void *stream, void *net, ur_dtype dt, void *buf, int64_t count,
                                int32_t root) {
  ur_nccl_net *n = (ur_nccl_net *)net;
  ur_status st = after_caller(n, stream);
  if (st) return st;
  NCCL_TRY(n, n->api->broadcast(buf, buf, (size_t)count, nccl_type(dt), root, n->comm, n->stream),
           "ncclBroadcast");
  return UR_STATUS_OK;
}

static ur_status nccl_barrier(void *stream, void *net) {
  ur_nccl_net *n = (ur_nccl_net *)net;
  ur_status st = after_caller(n, stream);
  if (st) return st;
  NCCL_TRY(n, n->api->all_reduce(n->one, n->one, 1, UR__NCCL_INT32, UR__NCCL_SUM, n->comm,
                                 n->stream),
           "ncclAllReduce (barrier)");
  /* polled, not cudaStreamSynchronize: the watchdog's abort (or the limit) ends a hung barrier */
  UR_CUDA_CHECK(cudaEventRecord(n->before, n->stream), "cudaEventRecord (barrier)");
  double start = ur__cuda_core->clock_seconds();
  for (;;) {
    cudaError_t q = cudaEventQuery(n->before);
    if (q == cudaSuccess) break;
    if (q != cudaErrorNotReady) UR_CUDA_CHECK(q, "cudaEventQuery (barrier)");
    if (n->aborted) return aborted_error(n);
    if (n->timeout > 0 && ur__cuda_core->clock_seconds() - start > n->timeout) {
      watchdog_abort(n, "a barrier did not complete within UVMREC_COMM_TIMEOUT");
      return aborted_error(n);
    }
    sched_yield();
  }
  return UR_STATUS_OK;
}

static ur_status nccl_group_start(void *net) {
  ur_nccl_net *n = (ur_nccl_net *)net;
  NCCL_TRY(n, n->api->group_start(), "ncclGroupStart");
  n->grouped++;
  return UR_STATUS_OK;
}

static ur_status nccl_group_end(void *stream, void *net) {
  (void)stream;
  ur_nccl_net *n = (ur_nccl_net *)net;
  n->grouped--;
  NCCL_TRY(n, n->api->group_end(), "ncclGroupEnd");
  return UR_STATUS_OK;
}

static ur_status nccl_wait(void *stream, void *net) {
  ur_nccl_net *n = (ur_nccl_net *)net;
  if (n->aborted) return aborted_error(n);
  pthread_mutex_lock(&n->mu);
  cudaError_t rec = cudaEventRecord(n->after, n->stream);
  n->pending = rec == cudaSuccess;
  n->posted_at = ur__cuda_core->clock_seconds();
  pthread_mutex_unlock(&n->mu);
  UR_CUDA_CHECK(rec, "cudaEventRecord");
  UR_CUDA_CHECK(cudaStreamWaitEvent((cudaStream_t)stream, n->after, 0), "cudaStreamWaitEvent");
  return UR_STATUS_OK;
}

const ur_comm_ops ur__cuda_comm_ops = {
    nccl_open,      nccl_close,     nccl_all_to_all,  nccl_all_reduce,
    nccl_reduce_scatter, nccl_all_gather, nccl_broadcast, nccl_barrier,
    nccl_group_start, nccl_group_end, nccl_wait,
};
