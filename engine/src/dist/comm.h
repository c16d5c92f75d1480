/* comm.h: the communicators' ops table (filled by the CPU backend through the MPI plugin in
 * comm_cpu.c, and by kernels/comm.cu through NCCL), what a backend is handed to open its engine,
 * and the two engines' own tables: the MPI plugin's (mpi_plugin.c, libuvmrec_mpi.so) and the
 * NCCL functions opened by nccl.c.  Neither MPI's nor NCCL's headers are needed here: the
 * engines are opened at run time, so a program of one process needs neither library. */
#ifndef UR_COMM_H
#define UR_COMM_H

#include "core/core.h"

/* Seconds a rank waits for its collectives before failing (UVMREC_COMM_TIMEOUT overrides; 0: no
 * limit): a rank that hangs or skipped a collective stops the job rather than leave it waiting. */
#define UR__COMM_TIMEOUT_DEFAULT 300.0

/* ---- NCCL, opened with dlopen (nccl.c).  The few types it needs, as nccl.h gives them. ---- */
typedef struct ur__nccl_comm *ur__nccl_comm_t;
typedef struct { char internal[128]; } ur__nccl_id;
enum { UR__NCCL_SUCCESS = 0, UR__NCCL_IN_PROGRESS = 7 };
enum {
  UR__NCCL_INT8 = 0, UR__NCCL_UINT8 = 1, UR__NCCL_INT32 = 2, UR__NCCL_INT64 = 4,
  UR__NCCL_FLOAT16 = 6, UR__NCCL_FLOAT32 = 7, UR__NCCL_FLOAT64 = 8, UR__NCCL_BFLOAT16 = 9
};
enum { UR__NCCL_SUM = 0, UR__NCCL_MAX = 2, UR__NCCL_MIN = 3 };
/* ncclConfig_t as NCCL 2.14 lays it out (NCCL reads the fields of the version it is given):
 * blocking = 0 makes a non-blocking communicator, whose calls may return ncclInProgress and
 * which ncclCommAbort can stop while its work hangs. */
typedef struct {
  size_t size;
  unsigned int magic, version;
  int blocking, cga_cluster_size, min_ctas, max_ctas;
  const char *net_name;
} ur__nccl_config;
#define UR__NCCL_CONFIG_MAGIC 0xcafebeefu
#define UR__NCCL_CONFIG_VERSION 21400 /* NCCL_VERSION(2, 14, 0) */
typedef struct ur__nccl_api {
  int version;
  char path[1024];
  int (*get_version)(int *version);
  int (*get_unique_id)(ur__nccl_id *id);
  int (*comm_init_rank)(ur__nccl_comm_t *comm, int nranks, ur__nccl_id id, int rank);
  int (*comm_destroy)(ur__nccl_comm_t comm);
  int (*comm_abort)(ur__nccl_comm_t comm);
  const char *(*get_error_string)(int result);
  int (*all_reduce)(const void *send, void *recv, size_t count, int dtype, int op,
                    ur__nccl_comm_t comm, void *stream);
  int (*reduce_scatter)(const void *send, void *recv, size_t recv_count, int dtype, int op,
                        ur__nccl_comm_t comm, void *stream);
  int (*all_gather)(const void *send, void *recv, size_t send_count, int dtype,
                    ur__nccl_comm_t comm, void *stream);
  int (*broadcast)(const void *send, void *recv, size_t count, int dtype, int root,
                   ur__nccl_comm_t comm, void *stream);
  int (*send)(const void *send, size_t count, int dtype, int peer, ur__nccl_comm_t comm,
              void *stream);
  int (*recv)(void *recv, size_t count, int dtype, int peer, ur__nccl_comm_t comm, void *stream);
  int (*group_start)(void);
  int (*group_end)(void);
  /* NCCL 2.14 and later (NULL before): non-blocking communicators and their state */
  int (*comm_init_rank_config)(ur__nccl_comm_t *comm, int nranks, ur__nccl_id id, int rank,
                               ur__nccl_config *config);
  int (*comm_get_async_error)(ur__nccl_comm_t comm, int *result);
} ur__nccl_api;
/* NCCL opened once per process (UVMREC_NCCL, the CUDA toolkit's, the system's, PyTorch's), or
 * an error naming every file tried. */
UR__HIDDEN ur_status ur__nccl_open(const ur__nccl_api **out);

/* ---- The MPI plugin (libuvmrec_mpi.so: mpi_plugin.c, built against OpenMPI) ---- */
#define UR_MPI_ABI 2
/* Host-memory collectives over one MPI communicator.  Each is non-blocking: it adds a request
 * to the communicator's list, and wait completes them all (the arrays a request needs are
 * copied into it).  Counts are elements. */
typedef struct ur__mpi_api {
  int abi;
  /* MPI_Init_thread (once per process; MPI_Finalize at exit), then a duplicate of the world:
   * *comm, with this rank, the world's size, and the rank and size among this host's ranks. */
  ur_status (*open)(void **comm, int32_t *rank, int32_t *world, int32_t *local_rank,
                    int32_t *local_world);
  void (*close)(void *comm);
  ur_status (*all_to_all)(void *comm, ur_dtype dt, const void *send, const int64_t *send_counts,
                          void *recv, const int64_t *recv_counts);
  ur_status (*all_reduce)(void *comm, ur_dtype dt, ur_reduce_op op, const void *send, void *recv,
                          int64_t n);
  ur_status (*reduce_scatter)(void *comm, ur_dtype dt, ur_reduce_op op, const void *send,
                              void *recv, int64_t n);
  ur_status (*all_gather)(void *comm, ur_dtype dt, const void *send, void *recv,
                          const int64_t *counts);
  ur_status (*broadcast)(void *comm, ur_dtype dt, void *buf, int64_t n, int32_t root);
  ur_status (*barrier)(void *comm);
  ur_status (*wait)(void *comm);
  /* The checks' small exchanges (UVMREC_COMM_CHECK), blocking, leaving the posted requests be:
   * every rank's k values (all: k per rank, in rank order); mine[r] to rank r, got[r] from it. */
  ur_status (*gather_check)(void *comm, const int64_t *mine, int32_t k, int64_t *all);
  ur_status (*swap_check)(void *comm, const int64_t *mine, int64_t *got);
  /* With a failure code, MPI_Abort of the whole job; with 0, MPI_Finalize (if MPI was started). */
  void (*exit)(int32_t code);
  const char *(*library)(void); /* MPI_Get_library_version's first line */
} ur__mpi_api;
typedef ur_status (*ur__mpi_init_fn)(const ur_core_api *core, const ur__mpi_api **out);
#define UR_MPI_PLUGIN_INIT "ur_mpi_plugin_init"
/* The plugin opened once per process (UVMREC_MPI_LIB, beside the engine, the loader's path). */
UR__HIDDEN ur_status ur__mpi_open(const ur__mpi_api **out);

/* ---- What a backend is handed to open its engine over the job's ranks ---- */
typedef struct ur__comm_boot {
  int32_t rank, world, device;
  int32_t local_rank, local_world; /* the CPU's open fills all four from MPI when world is 0 */
  const ur__mpi_api *mpi;    /* the CPU's engine */
  const ur__nccl_api *nccl;  /* the GPU's engine */
  /* Hands rank 0's n bytes to every rank (MPI's broadcast, or the rendezvous folder). */
  ur_status (*share)(void *ctx, void *bytes, size_t n);
  void *share_ctx;
} ur__comm_boot;

/* Every collective of a backend's engine.  stream is the caller's (the backend's handle): a
 * collective is ordered after its work; wait makes it wait for the engine's.  Counts are
 * elements, one per rank, the blocks consecutive in rank order. */
typedef struct ur_comm_ops {
  ur_status (*open)(ur__comm_boot *boot, void **net);
  void (*close)(void *net);
  ur_status (*all_to_all)(void *stream, void *net, ur_dtype dt, const void *send,
                          const int64_t *send_counts, void *recv, const int64_t *recv_counts);
  ur_status (*all_reduce)(void *stream, void *net, ur_dtype dt, ur_reduce_op op,
                          const void *send, void *recv, int64_t n);
  /* n: the elements each rank receives */
  ur_status (*reduce_scatter)(void *stream, void *net, ur_dtype dt, ur_reduce_op op,
                              const void *send, void *recv, int64_t n);
  ur_status (*all_gather)(void *stream, void *net, ur_dtype dt, const void *send, void *recv,
                          const int64_t *counts);
  ur_status (*broadcast)(void *stream, void *net, ur_dtype dt, void *buf, int64_t n,
                         int32_t root);
  ur_status (*barrier)(void *stream, void *net);
  ur_status (*group_start)(void *net);
  ur_status (*group_end)(void *stream, void *net);
  ur_status (*wait)(void *stream, void *net);
} ur_comm_ops;

UR__HIDDEN extern const ur_comm_ops ur__cpu_comm_ops;
/* The MPI plugin's check exchanges over the CPU backend's net (ur__mpi_api's). */
UR__HIDDEN ur_status ur__cpu_comm_gather_check(void *net, const int64_t *mine, int32_t k,
                                               int64_t *all);
UR__HIDDEN ur_status ur__cpu_comm_swap_check(void *net, const int64_t *mine, int64_t *got);

#endif
