/* comm.c: communicators (ur_comm_*): the job read from the environment (mpirun's, or `uvmrec
 * launch`'s), the engines opened for it (MPI for host memory, NCCL for device memory), the
 * rendezvous folder that bootstraps NCCL without MPI, argument checks, and each collective
 * routed by where its tensors live; a world of one copies. */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "dist/comm.h"

enum { ENGINE_NONE = 0, ENGINE_SELF, ENGINE_MPI, ENGINE_NCCL, ENGINE_STAGED };
static const char *const engine_names[] = {"none", "self", "mpi", "nccl", "nccl"};

struct ur_comm {
  int32_t rank, world, local_rank, local_world, device;
  int host, dev;               /* ENGINE_* for host and device memory */
  const ur__mpi_api *mpi;
  void *host_net, *dev_net;    /* the CPU backend's (MPI) and the GPU backend's (NCCL) */
  char rendezvous[1024];
  uint64_t seq;                /* this communicator's number in the process (rendezvous files) */
  int grouped;
  ur_comm_stats stats;
  /* The host collectives posted since the last wait hold their tensors (1-D views sharing their
   * storage) until a wait sees them done: a tensor freed meanwhile (a rank failing between a
   * collective and its wait: its finalizers run as Lua closes, and freeing the communicator
   * completes what it left posted) would be written by MPI after it was freed.  A half reduced
   * as f32 holds its f32 result with the output it goes to. */
  struct held { ur_tensor *t, *into; } *held;
  size_t nheld, cap_held;
  int host_failed; /* the last wait on host collectives failed: MPI may still write their tensors */
  int check;       /* UVMREC_COMM_CHECK: collectives compared over the ranks first (agree) */
};

size_t ur_sizeof_comm_stats(void) { return sizeof(ur_comm_stats); }

/* ---- the MPI plugin ---- */

static pthread_once_t mpi_once = PTHREAD_ONCE_INIT;
static const ur__mpi_api *mpi_api;
static char mpi_why[4096], mpi_path[1024];

static void load_mpi(void) {
  char tried[3072];
  /* RTLD_GLOBAL: OpenMPI's own components find libmpi's symbols. */
  void *h = ur__dlopen_beside("libuvmrec_mpi.so", "UVMREC_MPI_LIB", RTLD_NOW | RTLD_GLOBAL,
                              mpi_path, sizeof mpi_path, tried, sizeof tried);
  if (!h) {
    snprintf(mpi_why, sizeof mpi_why,
             "comm: the MPI plugin libuvmrec_mpi.so did not load (tried %s): %s; it is built "
             "where OpenMPI is installed (Debian: openmpi-bin, libopenmpi-dev)",
             tried, dlerror());
    return;
  }
  ur__mpi_init_fn init = (ur__mpi_init_fn)dlsym(h, UR_MPI_PLUGIN_INIT);
  const ur__mpi_api *api = NULL;
  if (!init || init(&ur__core_api, &api) || !api) {
    snprintf(mpi_why, sizeof mpi_why, "comm: %s has no working %s", mpi_path, UR_MPI_PLUGIN_INIT);
    return;
  }
  if (api->abi != UR_MPI_ABI) {
    snprintf(mpi_why, sizeof mpi_why, "comm: %s speaks plugin ABI %d, expected %d", mpi_path,
             api->abi, UR_MPI_ABI);
    return;
  }
  mpi_api = api;
}

ur_status ur__mpi_open(const ur__mpi_api **out) {
  pthread_once(&mpi_once, load_mpi);
  if (!mpi_api) return ur__error(UR_STATUS_UNSUPPORTED, "%s", mpi_why);
  *out = mpi_api;
  return UR_STATUS_OK;
}

ur_status ur_mpi_version(char *version, size_t len, char *path, size_t len2) {
  UR__ARGS(version);
  const ur__mpi_api *api = NULL;
  ur_status st = ur__mpi_open(&api);
  if (st) return st;
  if (version && len) snprintf(version, len, "%s", api->library());
  if (path && len2) snprintf(path, len2, "%s", mpi_path);
  return UR_STATUS_OK;
}

void ur_comm_exit(int32_t code) {
  if (mpi_api) mpi_api->exit(code);
}

/* ---- the job, from the environment ---- */

static int env_int(const char *name, int32_t *out) {
  const char *v = getenv(name);
  if (!v || !*v) return 0;
  char *end;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno || *end || x < 0 || x > 1 << 24) return -1;
  *out = (int32_t)x;
  return 1;
}

/* The MPI launchers' marks: OpenMPI's, then PMI's (MPICH, Slurm) and PMIx's. */
static const char *mpi_mark(void) {
  static const char *const marks[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"};
  for (size_t i = 0; i < sizeof marks / sizeof *marks; i++)
    if (getenv(marks[i]) && *getenv(marks[i])) return marks[i];
  return NULL;
}

static ur_status launch_env(ur_comm *c) {
  int32_t v;
  int got = env_int("UVMREC_WORLD", &c->world);
  if (got < 0 || (got && c->world < 1))
    return ur__error(UR_STATUS_INVALID, "comm: UVMREC_WORLD is '%s'; expected a number of ranks",
                     getenv("UVMREC_WORLD"));
  if (!got) {
    c->world = 1;
    return UR_STATUS_OK;
  }
  if (env_int("UVMREC_RANK", &c->rank) != 1 || c->rank >= c->world)
    return ur__error(UR_STATUS_INVALID,
                     "comm: UVMREC_RANK is '%s' in a world of %d (UVMREC_WORLD); expected 0..%d",
                     getenv("UVMREC_RANK") ? getenv("UVMREC_RANK") : "(unset)", (int)c->world,
                     (int)c->world - 1);
  c->local_rank = env_int("UVMREC_LOCAL_RANK", &v) == 1 ? v : c->rank;
  c->local_world = env_int("UVMREC_LOCAL_WORLD", &v) == 1 ? v : c->world;
  const char *dir = getenv("UVMREC_RENDEZVOUS");
  snprintf(c->rendezvous, sizeof c->rendezvous, "%s", dir ? dir : "");
  return UR_STATUS_OK;
}

/* ---- sharing rank 0's bytes: MPI's broadcast, or a file in the rendezvous folder ---- */

static ur_status share_mpi(void *ctx, void *bytes, size_t n) {
  ur_comm *c = ctx;
  ur_status st = ur__cpu_comm_ops.broadcast(NULL, c->host_net, UR_DTYPE_U8, bytes, (int64_t)n, 0);
  return st ? st : ur__cpu_comm_ops.wait(NULL, c->host_net);
}

/* Rank 0 writes <folder>/comm-<n>.id (a temporary file renamed, so it is whole when seen); the
 * others wait for it, UVMREC_RENDEZVOUS_TIMEOUT seconds at most (300). */
static ur_status share_file(void *ctx, void *bytes, size_t n) {
  ur_comm *c = ctx;
  char path[1200], tmp[1300];
  if (!c->rendezvous[0])
    return ur__error(UR_STATUS_INVALID,
                     "comm: rank %d of %d without MPI needs UVMREC_RENDEZVOUS, the folder where "
                     "rank 0 leaves NCCL's unique id (uvmrec launch sets it)",
                     (int)c->rank, (int)c->world);
  snprintf(path, sizeof path, "%s/comm-%llu.id", c->rendezvous, (unsigned long long)c->seq);
  if (c->rank == 0) {
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f || fwrite(bytes, 1, n, f) != n || fclose(f) != 0 || rename(tmp, path) != 0)
      return ur__error(UR_STATUS_IO, "comm: rendezvous: cannot write %s: %s", path,
                       strerror(errno));
    return UR_STATUS_OK;
  }
  int32_t limit = 300;
  if (env_int("UVMREC_RENDEZVOUS_TIMEOUT", &limit) < 0) limit = 300;
  double t0 = ur_clock_seconds();
  for (;;) {
    FILE *f = fopen(path, "rb");
    if (f) {
      size_t got = fread(bytes, 1, n, f);
      fclose(f);
      if (got == n) return UR_STATUS_OK;
      return ur__error(UR_STATUS_IO, "comm: rendezvous: %s holds %zu bytes; expected %zu", path,
                       got, n);
    }
    if (ur_clock_seconds() - t0 > limit)
      return ur__error(UR_STATUS_IO,
                       "comm: rendezvous: rank %d waited %d s for rank 0's %s; is rank 0 running?",
                       (int)c->rank, (int)limit, path);
    if (ur_interrupt_get())
      return ur__error(UR_STATUS_INTERRUPTED, "comm: rendezvous interrupted");
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
}

/* ---- making and freeing ---- */

static uint64_t comm_seq;

ur_status ur_comm_new(ur_comm **out, int32_t device) {
  UR__ARGS(out);
  *out = NULL;
  ur_comm *c = calloc(1, sizeof *c);
  if (!c) return ur__error(UR_STATUS_OOM, "comm: out of host memory");
  c->device = device;
  c->local_world = c->world = 1;
  pthread_mutex_lock(&ur__lock);
  c->seq = comm_seq++;
  pthread_mutex_unlock(&ur__lock);
  ur__comm_boot boot;
  memset(&boot, 0, sizeof boot);
  ur_status st = UR_STATUS_OK;
  const char *mark = mpi_mark();
  if (mark) {
    /* Started by mpirun: MPI says who is who. */
    st = ur__mpi_open(&c->mpi);
    if (st)
      st = ur__error_cause(st, "comm: this process was started by an MPI launcher (%s is set)",
                           mark);
    if (!st) {
      boot.mpi = c->mpi;
      st = ur__cpu_comm_ops.open(&boot, &c->host_net);
    }
    if (!st) {
      c->rank = boot.rank;
      c->world = boot.world;
      c->local_rank = boot.local_rank;
      c->local_world = boot.local_world;
      c->host = ENGINE_MPI;
    }
  } else {
    st = launch_env(c);
  }
  int got = env_int("UVMREC_COMM_CHECK", &c->check);
  if (!st && (got < 0 || c->check > 1))
    st = ur__error(UR_STATUS_INVALID, "comm: UVMREC_COMM_CHECK is '%s'; expected 0 or 1 (1: the "
                                      "ranks compare each collective's sizes before it)",
                   getenv("UVMREC_COMM_CHECK"));
  if (!st && c->world == 1) c->host = ENGINE_SELF;
  if (!st && device >= 0) {
    const ur_backend *gpu = ur__gpu();
    if (!gpu || device >= gpu->device_count())
      st = ur__error(UR_STATUS_UNSUPPORTED,
                     "comm: rank %d asks for GPU %d for its device collectives, and %s",
                     (int)c->rank, (int)device,
                     gpu ? "this host has fewer GPUs" : "no GPU is in use here");
    else if (c->world == 1)
      c->dev = ENGINE_SELF;
    else {
      st = ur__nccl_open(&boot.nccl);
      if (!st) {
        boot.rank = c->rank;
        boot.world = c->world;
        boot.device = device;
        boot.share = c->host == ENGINE_MPI ? share_mpi : share_file;
        boot.share_ctx = c;
        int32_t prev;
        st = ur__device_enter(gpu, device, &prev);
        if (!st) st = ur__device_leave(gpu, device, prev, gpu->comm->open(&boot, &c->dev_net));
      }
      if (!st) {
        c->dev = ENGINE_NCCL;
        if (!c->host) c->host = ENGINE_STAGED;
      }
    }
  }
  if (!st && c->host == ENGINE_NONE)
    st = ur__error(UR_STATUS_UNSUPPORTED,
                   "comm: rank %d of %d has neither MPI (the job was not started by mpirun) nor a "
                   "GPU to run its collectives through NCCL; on the CPU, install OpenMPI (Debian: "
                   "openmpi-bin, libopenmpi-dev) and start the job with mpirun or `uvmrec launch`",
                   (int)c->rank, (int)c->world);
  /* the checks' exchanges go over MPI: ranks started without it (launch --fork, or a GPU host
   * without OpenMPI) would run unchecked while asked to check */
  if (!st && c->check && c->world > 1 && c->host != ENGINE_MPI)
    st = ur__error(UR_STATUS_UNSUPPORTED,
                   "comm: UVMREC_COMM_CHECK=1 compares each collective over MPI, and rank %d of %d "
                   "was not started by mpirun (uvmrec launch --fork, or no OpenMPI here): start the "
                   "job with mpirun (`uvmrec launch` does where OpenMPI is installed) or unset "
                   "UVMREC_COMM_CHECK", (int)c->rank, (int)c->world);
  if (st) {
    ur_comm_free(c);
    return st;
  }
  *out = c;
  return UR_STATUS_OK;
}

/* The host collectives done: the halves reduced as f32 go to their outputs, rounded once, and
 * every tensor held is let go. */
static void release_held(ur_comm *c, int done) {
  for (size_t i = 0; i < c->nheld; i++) {
    struct held *h = &c->held[i];
    if (done && h->into)
      ur__store_f32(ur_tensor_data(h->into), h->into->dtype, (size_t)ur_tensor_numel(h->into),
                    ur_tensor_data(h->t));
    ur_tensor_free(h->t);
    ur_tensor_free(h->into);
  }
  c->nheld = 0;
}

void ur_comm_free(ur_comm *c) {
  if (!c) return;
  if (c->dev_net) ur__gpu()->comm->close(c->dev_net);
  if (c->host_net) {
    /* Host collectives left posted complete before their tensors go.  After a failed wait MPI
     * may still write them whenever it is next called: the communicator and the tensors are
     * left to the process's end (a failing exit aborts the job). */
    if (c->host_failed || (c->nheld && ur__cpu_comm_ops.wait(NULL, c->host_net))) return;
    ur__cpu_comm_ops.close(c->host_net);
  }
  release_held(c, 0);
  free(c->held);
  free(c);
}

int32_t ur_comm_rank(const ur_comm *c) {
  UR__ARGS_OR(-1, c);
  return c->rank;
}
int32_t ur_comm_world(const ur_comm *c) {
  UR__ARGS_OR(-1, c);
  return c->world;
}
int32_t ur_comm_local_rank(const ur_comm *c) {
  UR__ARGS_OR(-1, c);
  return c->local_rank;
}
int32_t ur_comm_local_world(const ur_comm *c) {
  UR__ARGS_OR(-1, c);
  return c->local_world;
}
int32_t ur_comm_device(const ur_comm *c) {
  UR__ARGS_OR(-1, c);
  return c->device;
}
const char *ur_comm_host_engine(const ur_comm *c) {
  UR__ARGS_OR(NULL, c);
  return engine_names[c->host];
}
const char *ur_comm_device_engine(const ur_comm *c) {
  UR__ARGS_OR(NULL, c);
  return engine_names[c->dev];
}

ur_status ur_comm_stats_get(const ur_comm *c, ur_comm_stats *out) {
  UR__ARGS(c, out);
  *out = c->stats;
  return UR_STATUS_OK;
}

void ur_comm_reset_stats(ur_comm *c) {
  if (c) memset(&c->stats, 0, sizeof c->stats);
}

/* ---- routing: where a collective's tensors live says which engine moves them ---- */

typedef struct route {
  int engine;
  const ur_backend *b; /* the backend whose comm table runs it (NCCL and staged: the GPU's) */
  void *net;
  int32_t device;
} route;

static int on_gpu(const ur_tensor *t) {
  return ur__gpu() && (t->st->place == UR_PLACE_DEVICE || t->st->place == UR_PLACE_MANAGED);
}

static ur_status route_of(ur_comm *c, const char *op, const ur_tensor *a, const ur_tensor *b,
                          route *r) {
  if (!a)
    return ur__error(UR_STATUS_INVALID, "comm %s: a tensor is missing (NULL)", op);
  if (b && on_gpu(a) != on_gpu(b))
    return ur__error(UR_STATUS_INVALID,
                     "comm %s: one tensor is in %s memory and the other in %s memory; a "
                     "collective takes both on the GPU or both on the host",
                     op, ur_place_name(a->st->place), ur_place_name(b->st->place));
  memset(r, 0, sizeof *r);
  if (on_gpu(a)) {
    r->engine = c->dev;
    r->b = ur__gpu();
    r->net = c->dev_net;
    r->device = c->device;
    if (c->dev == ENGINE_NONE)
      return ur__error(UR_STATUS_INVALID,
                       "comm %s: the tensor is in %s memory on GPU %d, and rank %d's "
                       "communicator has no device engine (it was made for host memory only, "
                       "device -1); make it with that GPU (ur_comm_new's device %d; in Lua "
                       "dist.comm{device = %d}, or dist.init(), which takes the rank's GPU)",
                       op, ur_place_name(a->st->place), (int)a->st->device, (int)c->rank,
                       (int)a->st->device, (int)a->st->device);
    if (a->st->device != c->device)
      return ur__error(UR_STATUS_INVALID,
                       "comm %s: the tensor is on GPU %d; rank %d's communicator uses GPU %d", op,
                       (int)a->st->device, (int)c->rank, (int)c->device);
    return UR_STATUS_OK;
  }
  r->engine = c->host;
  r->device = -1;
  if (c->host == ENGINE_MPI) {
    r->b = ur__cpu();
    r->net = c->host_net;
  } else if (c->host == ENGINE_STAGED) {
    r->b = ur__gpu();
    r->net = c->dev_net;
    r->device = c->device;
  } else if (c->host == ENGINE_NONE) {
    return ur__error(UR_STATUS_UNSUPPORTED,
                     "comm %s: host collectives over %d ranks need MPI (Debian: openmpi-bin and "
                     "libopenmpi-dev; run under mpirun or `uvmrec launch`) or a GPU to stage "
                     "them through NCCL",
                     op, (int)c->world);
  }
  if (c->host != ENGINE_SELF) {
    ur_status st = ur__tensor_ready(ur__cpu(), a);
    if (!st && b) st = ur__tensor_ready(ur__cpu(), b);
    if (st) return st;
  }
  return UR_STATUS_OK;
}

static void *data(const ur_tensor *t) { return ur_tensor_data(t); }
static uint64_t bytes_of(const ur_tensor *t) { return ur_tensor_nbytes(t); }

/* Collectives that move data between ranks cannot read and write the same bytes. */
static int overlap(const ur_tensor *a, const ur_tensor *b) {
  const char *pa = data(a), *pb = data(b);
  return bytes_of(a) && bytes_of(b) && pa < pb + bytes_of(b) && pb < pa + bytes_of(a);
}

static ur_status same_dtype(const char *op, const ur_tensor *a, const ur_tensor *b) {
  if (a->dtype != b->dtype)
    return ur__error(UR_STATUS_INVALID, "comm %s: the input is %s and the output %s; expected one "
                                        "dtype", op, ur_dtype_name(a->dtype), ur_dtype_name(b->dtype));
  return UR_STATUS_OK;
}

/* Every engine reduces these (MPI halves as f32: issue_widened). */
static ur_status reducible(const char *op, ur_dtype dt) {
  if (dt == UR_DTYPE_F32 || dt == UR_DTYPE_F64 || dt == UR_DTYPE_I32 || dt == UR_DTYPE_I64 ||
      dt == UR_DTYPE_F16 || dt == UR_DTYPE_BF16)
    return UR_STATUS_OK;
  return ur__error(UR_STATUS_INVALID, "comm %s: dtype %s cannot be reduced; expected f32, f64, "
                                      "i32, i64, f16 or bf16", op, ur_dtype_name(dt));
}

static ur_status check_op(const char *op, ur_reduce_op o) {
  if ((unsigned)o >= UR_REDUCE_COUNT)
    return ur__error(UR_STATUS_INVALID, "comm %s: reduction %d is not sum, max or min", op, (int)o);
  return UR_STATUS_OK;
}

static void *stream_of(ur_stream *s) { return s ? s->handle : NULL; }

/* The world of one: out = in, byte for byte. */
static ur_status self_copy(ur_stream *s, const ur_tensor *in, ur_tensor *out) {
  if (in == out || data(in) == data(out)) return UR_STATUS_OK;
  const ur_backend *b = on_gpu(out) || on_gpu(in) ? ur__gpu() : ur__cpu();
  return b->copy(stream_of(s), data(out), data(in), (size_t)bytes_of(in));
}

/* Host memory without MPI: copied into device memory, reduced there by NCCL, copied back
 * (synchronous; a job without MPI keeps its data on the GPU, so this is for small things). */
typedef struct staged {
  ur_tensor *in, *out;
} staged;

static ur_status stage_in(ur_comm *c, ur_stream *s, const ur_tensor *in, const ur_tensor *out,
                          staged *g) {
  memset(g, 0, sizeof *g);
  if (c->grouped)
    return ur__error(UR_STATUS_INVALID, "comm: host collectives staged through the GPU cannot "
                                        "be grouped; issue them outside group_start/group_end");
  int64_t n = ur_tensor_numel(in), m = out ? ur_tensor_numel(out) : 0;
  ur_status st = ur_tensor_new(&g->in, in->dtype, 1, &n, UR_PLACE_DEVICE, c->device);
  if (!st && out) st = ur_tensor_new(&g->out, out->dtype, 1, &m, UR_PLACE_DEVICE, c->device);
  if (!st) st = ur__gpu()->copy(stream_of(s), data(g->in), data(in), (size_t)bytes_of(in));
  return st;
}

static ur_status stage_out(ur_comm *c, ur_stream *s, ur_tensor *dst, staged *g, ur_status st) {
  const ur_backend *gpu = ur__gpu();
  if (!st) st = gpu->comm->wait(stream_of(s), c->dev_net);
  ur_tensor *src = g->out ? g->out : g->in;
  if (!st && dst) st = gpu->copy(stream_of(s), data(dst), data(src), (size_t)bytes_of(dst));
  if (!st) st = gpu->stream_sync(stream_of(s));
  ur_tensor_free(g->in);
  ur_tensor_free(g->out);
  return st;
}

static void account(ur_comm *c, double t0, uint64_t sent, uint64_t received) {
  c->stats.calls++;
  c->stats.bytes_sent += sent;
  c->stats.bytes_received += received;
  c->stats.seconds += ur_clock_seconds() - t0;
}

/* The checks every collective opens with: the route of in and out (out NULL: one tensor, in
 * place), one dtype, and for a reduction (op not NULL) a dtype its engine reduces and a known
 * reduction. */
static ur_status prologue(ur_comm *c, const char *name, const ur_tensor *in, const ur_tensor *out,
                          const ur_reduce_op *op, route *r) {
  ur_status st = route_of(c, name, in, out, r);
  if (!st && out) st = same_dtype(name, in, out);
  if (!st && op) st = reducible(name, in->dtype);
  if (!st && op) st = check_op(name, *op);
  return st;
}

static ur_status separate(ur_comm *c, const char *name, const ur_tensor *in, const ur_tensor *out) {
  if (c->world > 1 && overlap(in, out))
    return ur__error(UR_STATUS_INVALID, "comm %s: the input and the output overlap; expected "
                                        "separate memory", name);
  return UR_STATUS_OK;
}

/* One collective's call into its engine's table, whichever buffers it is given. */
enum { ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER, BROADCAST, ALL_TO_ALL };
typedef struct call {
  int kind;
  ur_dtype dtype;
  ur_reduce_op op;
  int64_t n;                       /* all_reduce, broadcast: the elements; reduce_scatter: each
                                    * rank's */
  int32_t root;
  const int64_t *counts, *recv;    /* all_gather's counts; all_to_all's send and receive ones */
} call;

static ur_status issue(const route *r, ur_stream *s, const call *k, void *in, void *out) {
  const ur_comm_ops *o = r->b->comm;
  void *q = stream_of(s);
  switch (k->kind) {
    case ALL_REDUCE: return o->all_reduce(q, r->net, k->dtype, k->op, in, out, k->n);
    case REDUCE_SCATTER: return o->reduce_scatter(q, r->net, k->dtype, k->op, in, out, k->n);
    case ALL_GATHER: return o->all_gather(q, r->net, k->dtype, in, out, k->counts);
    case BROADCAST: return o->broadcast(q, r->net, k->dtype, in, k->n, k->root);
    default: return o->all_to_all(q, r->net, k->dtype, in, k->counts, out, k->recv);
  }
}

/* Kept until the next wait that sees the host collectives done: t (owned), and into (owned,
 * or NULL) where t's f32 elements then go.  Frees both when it cannot keep them. */
static ur_status keep(ur_comm *c, ur_tensor *t, ur_tensor *into) {
  if (c->nheld == c->cap_held) {
    size_t cap = c->cap_held ? 2 * c->cap_held : 8;
    struct held *h = realloc(c->held, cap * sizeof *h);
    if (!h) {
      ur_tensor_free(t);
      ur_tensor_free(into);
      return ur__error(UR_STATUS_OOM, "comm: out of host memory");
    }
    c->held = h;
    c->cap_held = cap;
  }
  c->held[c->nheld].t = t;
  c->held[c->nheld++].into = into;
  return UR_STATUS_OK;
}

/* A 1-D view of t's elements (sharing its storage). */
static ur_status view_of(const ur_tensor *t, ur_tensor **out) {
  int64_t n = ur_tensor_numel(t);
  return ur_tensor_view_as(t, out, 0, 1, &n);
}

static ur_status hold(ur_comm *c, const ur_tensor *t) {
  ur_tensor *v = NULL;
  ur_status st = view_of(t, &v);
  return st ? st : keep(c, v, NULL);
}

static int is_half(ur_dtype dt) { return dt == UR_DTYPE_F16 || dt == UR_DTYPE_BF16; }

/* UVMREC_COMM_CHECK=1: the ranks compare a collective before MPI (or NCCL: checked) is given
 * it, which crashes, hangs or takes the wrong bytes on calls that disagree in size (one small
 * all-gather of each rank's call; an all-to-all also hands each rank the counts it will be
 * sent).  Every rank finds the same disagreement but all_gather's counts and all_to_all's,
 * which the ranks receiving them find. */
static const char *const kind_names[] = {"all_reduce", "reduce_scatter", "all_gather",
                                         "broadcast", "all_to_all"};
enum { F_KIND, F_DTYPE, F_A, F_B, F_N };

static ur_status disagree(const char *name, const int64_t *f, const int64_t *g, int32_t r) {
  static const char *const ops[] = {"sum", "max", "min"};
  const char *kind = kind_names[g[F_KIND]];
  if (f[F_KIND] != g[F_KIND])
    return ur__error(UR_STATUS_INVALID, "comm %s: rank 0 calls %s and rank %d %s; every rank makes "
                                        "the same collectives in the same order",
                     name, kind_names[f[F_KIND]], (int)r, kind);
  if (f[F_DTYPE] != g[F_DTYPE])
    return ur__error(UR_STATUS_INVALID, "comm %s: rank 0 gives %s and rank %d %s; expected one dtype",
                     name, ur_dtype_name((ur_dtype)f[F_DTYPE]), (int)r,
                     ur_dtype_name((ur_dtype)g[F_DTYPE]));
  if (f[F_A] != g[F_A])
    return ur__error(UR_STATUS_INVALID, "comm %s: rank 0 gives %lld elements%s and rank %d %lld; "
                                        "every rank gives as many",
                     name, (long long)f[F_A], g[F_KIND] == REDUCE_SCATTER ? " per rank" : "",
                     (int)r, (long long)g[F_A]);
  if (g[F_KIND] == BROADCAST)
    return ur__error(UR_STATUS_INVALID, "comm broadcast: rank 0 takes root %lld and rank %d %lld; "
                                        "expected one root", (long long)f[F_B], (int)r,
                     (long long)g[F_B]);
  return ur__error(UR_STATUS_INVALID, "comm %s: rank 0 reduces by %s and rank %d by %s; expected "
                                      "one reduction", name, ops[f[F_B] % 3], (int)r, ops[g[F_B] % 3]);
}

static ur_status agree(ur_comm *c, const char *name, const call *k, const ur_tensor *in) {
  /* all_gather: this rank's count (each rank's counts are compared below); all_to_all: none */
  int64_t mine[F_N] = {k->kind, k->dtype, k->n, k->kind == BROADCAST ? k->root : (int64_t)k->op};
  if (k->kind == ALL_GATHER || k->kind == ALL_TO_ALL) mine[F_B] = 0;
  if (k->kind == ALL_GATHER) mine[F_A] = ur_tensor_numel(in);
  if (k->kind == ALL_TO_ALL) mine[F_A] = 0;
  size_t w = (size_t)c->world;
  /* MPI's buffers: every rank's fields, then this rank's and its all_to_all counts.  An exchange
   * that does not complete may still use them, so they and the communicator are then left to
   * the process's end, as after a failed wait. */
  int64_t *all = malloc((w * F_N + F_N + w) * sizeof *all), *me = all + w * F_N, *sent = me + F_N;
  if (!all) return ur__error(UR_STATUS_OOM, "comm: out of host memory");
  memcpy(me, mine, sizeof mine);
  ur_status st = ur__cpu_comm_gather_check(c->host_net, me, F_N, all);
  if (st) {
    c->host_failed = 1;
    return st;
  }
  for (int32_t r = 1; !st && r < c->world; r++) {
    const int64_t *f = all, *g = all + (size_t)r * F_N;
    if (f[F_KIND] != g[F_KIND] || f[F_DTYPE] != g[F_DTYPE] ||
        (k->kind != ALL_GATHER && memcmp(f, g, sizeof mine)))
      st = disagree(name, f, g, r);
  }
  for (int32_t r = 0; !st && k->kind == ALL_GATHER && r < c->world; r++)
    if (all[(size_t)r * F_N + F_A] != k->counts[r])
      st = ur__error(UR_STATUS_INVALID, "comm all_gather: rank %d gives %lld elements, and rank "
                                        "%d's counts[%d] is %lld",
                     (int)r, (long long)all[(size_t)r * F_N + F_A], (int)c->rank, (int)r,
                     (long long)k->counts[r]);
  if (!st && k->kind == ALL_TO_ALL) {
    memcpy(sent, k->counts, w * sizeof *sent);
    if ((st = ur__cpu_comm_swap_check(c->host_net, sent, all))) {
      c->host_failed = 1;
      return st;
    }
    for (int32_t r = 0; !st && r < c->world; r++)
      if (all[r] != k->recv[r])
        st = ur__error(UR_STATUS_INVALID, "comm all_to_all: rank %d sends rank %d %lld elements, "
                                          "and rank %d's recv_counts[%d] is %lld",
                       (int)r, (int)c->rank, (long long)all[r], (int)c->rank, (int)r,
                       (long long)k->recv[r]);
  }
  free(all);
  return st;
}

/* Which collectives UVMREC_COMM_CHECK compares: MPI's, and NCCL's too, whose arguments (kind,
 * dtype, count, reduction, root, all_to_all's counts) are host values, exchanged over the job's
 * MPI communicator by the same agree before NCCL is given them (a job under mpirun has both).
 * A job without MPI has nothing to compare them over: ur_comm_new refuses the check there. */
static int checked(const ur_comm *c, const route *r) {
  return c->check && c->host == ENGINE_MPI && (r->engine == ENGINE_MPI || r->engine == ENGINE_NCCL);
}

/* MPI reduces no halves: an f16 or bf16 reduction runs on f32 copies (the input widened here,
 * the output kept until wait, which rounds it into out once; NCCL rounds at every step). */
static ur_status issue_widened(ur_comm *c, const route *r, ur_stream *s, const call *k,
                               const ur_tensor *in, ur_tensor *out) {
  int64_t n = ur_tensor_numel(in), m = ur_tensor_numel(out);
  int in_place = data(in) == data(out);
  ur_tensor *wi = NULL, *wo = NULL, *into = NULL;
  ur_status st = ur_tensor_new(&wi, UR_DTYPE_F32, 1, &n, UR_PLACE_HOST, -1);
  if (!st && !in_place) st = ur_tensor_new(&wo, UR_DTYPE_F32, 1, &m, UR_PLACE_HOST, -1);
  if (!st) st = view_of(out, &into);
  if (st) {
    ur_tensor_free(wi);
    ur_tensor_free(wo);
    return st;
  }
  ur__load_f32(data(in), in->dtype, (size_t)n, data(wi));
  if (!in_place) st = keep(c, wi, NULL);
  if (st) {
    ur_tensor_free(wo);
    ur_tensor_free(into);
    return st;
  }
  ur_tensor *result = in_place ? wi : wo;
  if ((st = keep(c, result, into))) return st;
  call w = *k;
  w.dtype = UR_DTYPE_F32;
  st = issue(r, s, &w, data(wi), data(result));
  if (st) { /* nothing posted: this call's copies go, and out keeps what it held */
    size_t mine = in_place ? 1 : 2;
    for (size_t i = c->nheld - mine; i < c->nheld; i++) {
      ur_tensor_free(c->held[i].t);
      ur_tensor_free(c->held[i].into);
    }
    c->nheld -= mine;
  }
  return st;
}

/* Runs k on its route: the world of one copies in to out (a broadcast's one tensor stays);
 * host memory without MPI is staged through the GPU (all_reduce and broadcast in place there);
 * else the engine runs it on the route's device. */
static ur_status run(ur_comm *c, ur_stream *s, const route *r, const call *k, const ur_tensor *in,
                     ur_tensor *out) {
  if (r->engine == ENGINE_SELF) return self_copy(s, in, out);
  int32_t prev;
  ur_status st = ur__device_enter(r->b, r->device, &prev);
  if (r->engine == ENGINE_STAGED) {
    int in_place = k->kind == ALL_REDUCE || k->kind == BROADCAST;
    staged g = {NULL, NULL};
    if (!st) st = stage_in(c, s, in, in_place ? NULL : out, &g);
    if (!st) st = issue(r, s, k, data(g.in), data(in_place ? g.in : g.out));
    st = stage_out(c, s, out, &g, st);
  } else if (!st) {
    int widen = r->engine == ENGINE_MPI && is_half(k->dtype) &&
                (k->kind == ALL_REDUCE || k->kind == REDUCE_SCATTER);
    if (checked(c, r)) st = agree(c, kind_names[k->kind], k, in);
    if (!st && widen) {
      st = issue_widened(c, r, s, k, in, out);
    } else if (!st) {
      if (r->engine == ENGINE_MPI) {
        st = hold(c, in);
        if (!st && out != in) st = hold(c, out);
      }
      if (!st) st = issue(r, s, k, data(in), data(out));
    }
  }
  return ur__device_leave(r->b, r->device, prev, st);
}

/* ---- the collectives ---- */

ur_status ur_comm_all_reduce(ur_stream *s, ur_comm *c, const ur_tensor *in, ur_tensor *out,
                             ur_reduce_op op) {
  UR__ARGS(c, in, out);
  route r;
  double t0 = ur_clock_seconds();
  ur_status st = prologue(c, "all_reduce", in, out, &op, &r);
  if (!st && ur_tensor_numel(in) != ur_tensor_numel(out))
    st = ur__error(UR_STATUS_INVALID, "comm all_reduce: the input has %lld elements and the "
                                      "output %lld; expected as many",
                   (long long)ur_tensor_numel(in), (long long)ur_tensor_numel(out));
  if (st) return st;
  call k = {ALL_REDUCE, in->dtype, op, ur_tensor_numel(in), 0, NULL, NULL};
  st = run(c, s, &r, &k, in, out);
  uint64_t others = bytes_of(in) * (uint64_t)(c->world - 1);
  if (!st) account(c, t0, others, others);
  return st;
}

ur_status ur_comm_reduce_scatter(ur_stream *s, ur_comm *c, const ur_tensor *in, ur_tensor *out,
                                 ur_reduce_op op) {
  UR__ARGS(c, in, out);
  const char *name = "reduce_scatter";
  route r;
  double t0 = ur_clock_seconds();
  ur_status st = prologue(c, name, in, out, &op, &r);
  int64_t n = ur_tensor_numel(out);
  if (!st && ur_tensor_numel(in) != n * c->world)
    st = ur__error(UR_STATUS_INVALID, "comm reduce_scatter: the input has %lld elements; "
                                      "expected %d blocks of the output's %lld",
                   (long long)ur_tensor_numel(in), (int)c->world, (long long)n);
  if (!st) st = separate(c, name, in, out);
  if (st) return st;
  call k = {REDUCE_SCATTER, in->dtype, op, n, 0, NULL, NULL};
  st = run(c, s, &r, &k, in, out);
  if (!st) account(c, t0, bytes_of(in) - bytes_of(out), bytes_of(out) * (uint64_t)(c->world - 1));
  return st;
}

/* counts: NULL (every rank's as this rank's input) or one per rank, >= 0. */
static ur_status counts_check(ur_comm *c, const char *op, const char *what,
                              const int64_t *counts, int64_t total, const char *of) {
  int64_t sum = 0;
  for (int32_t r = 0; r < c->world; r++) {
    if (counts[r] < 0)
      return ur__error(UR_STATUS_INVALID, "comm %s: %s[%d] is %lld; expected a count >= 0", op,
                       what, (int)r, (long long)counts[r]);
    sum += counts[r];
  }
  if (sum != total)
    return ur__error(UR_STATUS_INVALID, "comm %s: %s sum to %lld, and %s has %lld elements", op,
                     what, (long long)sum, of, (long long)total);
  return UR_STATUS_OK;
}

ur_status ur_comm_all_gather(ur_stream *s, ur_comm *c, const ur_tensor *in, ur_tensor *out,
                             const int64_t *counts) {
  UR__ARGS(c, in, out);
  const char *name = "all_gather";
  route r;
  double t0 = ur_clock_seconds();
  ur_status st = prologue(c, name, in, out, NULL, &r);
  if (st) return st;
  int64_t *own = NULL;
  if (!counts) {
    own = malloc((size_t)c->world * sizeof *own);
    if (!own) return ur__error(UR_STATUS_OOM, "comm: out of host memory");
    for (int32_t k = 0; k < c->world; k++) own[k] = ur_tensor_numel(in);
    counts = own;
  }
  st = counts_check(c, name, "counts", counts, ur_tensor_numel(out), "the output");
  if (!st && counts[c->rank] != ur_tensor_numel(in))
    st = ur__error(UR_STATUS_INVALID, "comm all_gather: counts[%d] is %lld, and rank %d's input "
                                      "has %lld elements",
                   (int)c->rank, (long long)counts[c->rank], (int)c->rank,
                   (long long)ur_tensor_numel(in));
  if (!st) st = separate(c, name, in, out);
  if (!st) {
    call k = {ALL_GATHER, in->dtype, UR_REDUCE_SUM, 0, 0, counts, NULL};
    st = run(c, s, &r, &k, in, out);
  }
  if (!st)
    account(c, t0, bytes_of(in) * (uint64_t)(c->world - 1), bytes_of(out) - bytes_of(in));
  free(own);
  return st;
}

ur_status ur_comm_broadcast(ur_stream *s, ur_comm *c, ur_tensor *t, int32_t root) {
  UR__ARGS(c, t);
  route r;
  double t0 = ur_clock_seconds();
  ur_status st = prologue(c, "broadcast", t, NULL, NULL, &r);
  if (!st && (root < 0 || root >= c->world))
    st = ur__error(UR_STATUS_INVALID, "comm broadcast: root %d; expected a rank 0..%d", (int)root,
                   (int)c->world - 1);
  if (st) return st;
  call k = {BROADCAST, t->dtype, UR_REDUCE_SUM, ur_tensor_numel(t), root, NULL, NULL};
  st = run(c, s, &r, &k, t, t);
  uint64_t b = bytes_of(t);
  if (!st) account(c, t0, c->rank == root ? b * (uint64_t)(c->world - 1) : 0, c->rank == root ? 0 : b);
  return st;
}

ur_status ur_comm_all_to_all(ur_stream *s, ur_comm *c, const ur_tensor *in, ur_tensor *out,
                             const int64_t *send_counts, const int64_t *recv_counts) {
  UR__ARGS(c, in, out, send_counts, recv_counts);
  const char *name = "all_to_all";
  route r;
  double t0 = ur_clock_seconds();
  ur_status st = prologue(c, name, in, out, NULL, &r);
  if (!st) st = counts_check(c, name, "send_counts", send_counts, ur_tensor_numel(in), "the input");
  if (!st)
    st = counts_check(c, name, "recv_counts", recv_counts, ur_tensor_numel(out), "the output");
  if (!st) st = separate(c, name, in, out);
  if (!st && send_counts[c->rank] != recv_counts[c->rank])
    st = ur__error(UR_STATUS_INVALID, "comm all_to_all: rank %d sends itself %lld elements and "
                                      "receives %lld from itself",
                   (int)c->rank, (long long)send_counts[c->rank],
                   (long long)recv_counts[c->rank]);
  if (st) return st;
  call k = {ALL_TO_ALL, in->dtype, UR_REDUCE_SUM, 0, 0, send_counts, recv_counts};
  st = run(c, s, &r, &k, in, out);
  if (!st) {
    size_t es = ur_dtype_size(in->dtype);
    uint64_t own = (uint64_t)send_counts[c->rank] * es;
    account(c, t0, bytes_of(in) - own, bytes_of(out) - own);
  }
  return st;
}

ur_status ur_comm_barrier(ur_stream *s, ur_comm *c) {
  UR__ARGS(c);
  double t0 = ur_clock_seconds();
  ur_status st = UR_STATUS_OK;
  if (c->host == ENGINE_MPI) {
    /* MPI's barrier completes the collectives posted before it, as wait does */
    st = ur__cpu_comm_ops.barrier(NULL, c->host_net);
    c->host_failed = st != UR_STATUS_OK;
    if (!st) release_held(c, 1);
  }
  else if (c->dev == ENGINE_NCCL) st = ur__gpu()->comm->barrier(stream_of(s), c->dev_net);
  else if (c->host == ENGINE_NONE)
    st = ur__error(UR_STATUS_UNSUPPORTED, "comm barrier: %d ranks without MPI or NCCL",
                   (int)c->world);
  if (!st) account(c, t0, 0, 0);
  return st;
}

ur_status ur_comm_group_start(ur_comm *c) {
  UR__ARGS(c);
  ur_status st = UR_STATUS_OK;
  if (c->dev_net) st = ur__gpu()->comm->group_start(c->dev_net);
  if (!st && c->host_net) st = ur__cpu_comm_ops.group_start(c->host_net);
  if (!st) c->grouped++;
  return st;
}

ur_status ur_comm_group_end(ur_stream *s, ur_comm *c) {
  UR__ARGS(c);
  if (c->grouped <= 0)
    return ur__error(UR_STATUS_INVALID, "comm group_end: no group_start before it");
  c->grouped--;
  ur_status st = UR_STATUS_OK;
  if (c->dev_net) st = ur__gpu()->comm->group_end(stream_of(s), c->dev_net);
  if (!st && c->host_net) st = ur__cpu_comm_ops.group_end(stream_of(s), c->host_net);
  return st;
}

ur_status ur_comm_wait(ur_stream *s, ur_comm *c) {
  UR__ARGS(c);
  double t0 = ur_clock_seconds();
  ur_status st = UR_STATUS_OK;
  if (c->grouped)
    return ur__error(UR_STATUS_INVALID, "comm wait: inside a group; call group_end first");
  if (c->host_net) {
    st = ur__cpu_comm_ops.wait(NULL, c->host_net);
    c->host_failed = st != UR_STATUS_OK;
    if (!st) release_held(c, 1);
  }
  if (!st && c->dev_net) {
    const ur_backend *gpu = ur__gpu();
    int32_t prev;
    st = ur__device_enter(gpu, c->device, &prev);
    if (!st) st = ur__device_leave(gpu, c->device, prev, gpu->comm->wait(stream_of(s), c->dev_net));
  }
  c->stats.seconds += ur_clock_seconds() - t0;
  return st;
}
