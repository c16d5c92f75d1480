/* comm_cpu.c: the CPU backend's collectives: host memory through MPI (the plugin's
 * non-blocking calls; wait completes them).  Streams order nothing on the CPU. */
#include <stdlib.h>
#include "dist/comm.h"

typedef struct cpu_net {
  const ur__mpi_api *mpi;
  void *comm;
} cpu_net;

static ur_status cpu_open(ur__comm_boot *boot, void **out) {
  if (!boot->mpi)
    return ur__error(UR_STATUS_UNSUPPORTED,
                     "comm: host collectives over %d ranks need MPI, and it is not in use",
                     (int)boot->world);
  cpu_net *n = calloc(1, sizeof *n);
  if (!n) return ur__error(UR_STATUS_OOM, "comm: out of host memory");
  n->mpi = boot->mpi;
  int32_t rank, world, lr, lw;
  ur_status st = n->mpi->open(&n->comm, &rank, &world, &lr, &lw);
  if (!st && boot->world == 0) {
    boot->rank = rank;
    boot->world = world;
    boot->local_rank = lr;
    boot->local_world = lw;
  } else if (!st && (rank != boot->rank || world != boot->world)) {
    st = ur__error(UR_STATUS_INVALID, "comm: MPI says rank %d of %d, the job rank %d of %d",
                   (int)rank, (int)world, (int)boot->rank, (int)boot->world);
  }
  if (st) {
    if (n->comm) n->mpi->close(n->comm);
    free(n);
    return st;
  }
  *out = n;
  return UR_STATUS_OK;
}

static void cpu_close(void *net) {
  cpu_net *n = net;
  if (!n) return;
  n->mpi->close(n->comm);
  free(n);
}

static ur_status cpu_all_to_all(void *stream, void *net, ur_dtype dt, const void *send,
                                const int64_t *send_counts, void *recv,
                                const int64_t *recv_counts) {
  (void)stream;
  cpu_net *n = net;
  return n->mpi->all_to_all(n->comm, dt, send, send_counts, recv, recv_counts);
}

static ur_status cpu_all_reduce(void *stream, void *net, ur_dtype dt, ur_reduce_op op,
                                const void *send, void *recv, int64_t count) {
  (void)stream;
  cpu_net *n = net;
  return n->mpi->all_reduce(n->comm, dt, op, send, recv, count);
}

static ur_status cpu_reduce_scatter(void *stream, void *net, ur_dtype dt, ur_reduce_op op,
                                    const void *send, void *recv, int64_t count) {
  (void)stream;
  cpu_net *n = net;
  return n->mpi->reduce_scatter(n->comm, dt, op, send, recv, count);
}

static ur_status cpu_all_gather(void *stream, void *net, ur_dtype dt, const void *send,
                                void *recv, const int64_t *counts) {
  (void)stream;
  cpu_net *n = net;
  return n->mpi->all_gather(n->comm, dt, send, recv, counts);
}

static ur_status cpu_broadcast(void *stream, void *net, ur_dtype dt, void *buf, int64_t count,
                               int32_t root) {
  (void)stream;
  cpu_net *n = net;
  return n->mpi->broadcast(n->comm, dt, buf, count, root);
}

static ur_status cpu_barrier(void *stream, void *net) {
  (void)stream;
  cpu_net *n = net;
  return n->mpi->barrier(n->comm);
}

/* MPI's calls are already posted without waiting: a group needs nothing more. */
static ur_status cpu_group_start(void *net) {
  (void)net;
  return UR_STATUS_OK;
}

static ur_status cpu_group_end(void *stream, void *net) {
  (void)stream;
  (void)net;
  return UR_STATUS_OK;
}

static ur_status cpu_wait(void *stream, void *net) {
  (void)stream;
  cpu_net *n = net;
  return n->mpi->wait(n->comm);
}

ur_status ur__cpu_comm_gather_check(void *net, const int64_t *mine, int32_t k, int64_t *all) {
  cpu_net *n = net;
  return n->mpi->gather_check(n->comm, mine, k, all);
}

ur_status ur__cpu_comm_swap_check(void *net, const int64_t *mine, int64_t *got) {
  cpu_net *n = net;
  return n->mpi->swap_check(n->comm, mine, got);
}

const ur_comm_ops ur__cpu_comm_ops = {
    .open = cpu_open,
    .close = cpu_close,
    .all_to_all = cpu_all_to_all,
    .all_reduce = cpu_all_reduce,
    .reduce_scatter = cpu_reduce_scatter,
    .all_gather = cpu_all_gather,
    .broadcast = cpu_broadcast,
    .barrier = cpu_barrier,
    .group_start = cpu_group_start,
    .group_end = cpu_group_end,
    .wait = cpu_wait,
};
