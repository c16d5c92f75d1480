/* nccl.c: finds and opens NCCL (libnccl.so.2) at run time, once per process: UVMREC_NCCL, the
 * CUDA toolkit's, the system's (the loader's path), then PyTorch's nvidia/nccl/lib of a
 * virtualenv or the system's Pythons.  Nothing is shipped: a host without NCCL still runs one
 * process per job, and one without a GPU can open it (ur_nccl_version) but not use it. */
#include <dlfcn.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dist/comm.h"

static pthread_once_t once = PTHREAD_ONCE_INIT;
static ur__nccl_api nccl;
static int opened;
static char why[4096];

static void *try_open(const char *path, char *tried, size_t len) {
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    size_t used = strlen(tried);
    snprintf(tried + used, len - used, "%s%s", used ? ", " : "", path);
  }
  return h;
}

static void *find(char *tried, size_t len, char *found, size_t flen) {
  static const char *const fixed[] = {"/usr/local/cuda/lib64/libnccl.so.2",
                                      "/usr/local/cuda/lib/libnccl.so.2", "libnccl.so.2"};
  const char *env = getenv("UVMREC_NCCL");
  void *h;
  if (env && *env) {
    snprintf(found, flen, "%s", env);
    return try_open(env, tried, len);
  }
  for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++)
    if ((h = try_open(fixed[i], tried, len))) {
      snprintf(found, flen, "%s", fixed[i]);
      return h;
    }
  /* PyTorch's wheels carry NCCL in site-packages/nvidia/nccl/lib. */
  char pattern[2048];
  const char *venv = getenv("VIRTUAL_ENV");
  const char *roots[] = {venv && *venv ? venv : NULL, "/usr/local", "/usr", "/opt/conda"};
  for (size_t i = 0; i < sizeof roots / sizeof *roots; i++) {
    if (!roots[i]) continue;
    snprintf(pattern, sizeof pattern, "%s/lib/python3*/*-packages/nvidia/nccl/lib/libnccl.so.2",
             roots[i]);
    glob_t g;
    if (glob(pattern, 0, NULL, &g) == 0) {
      for (size_t k = 0; k < g.gl_pathc; k++)
        if ((h = try_open(g.gl_pathv[k], tried, len))) {
          snprintf(found, flen, "%s", g.gl_pathv[k]);
          globfree(&g);
          return h;
        }
      globfree(&g);
    }
    size_t used = strlen(tried);
    snprintf(tried + used, len - used, ", %s", pattern);
  }
  return NULL;
}

static void load(void) {
  char tried[3072] = "";
  void *h = find(tried, sizeof tried, nccl.path, sizeof nccl.path);
  if (!h) {
    snprintf(why, sizeof why, "comm: NCCL (libnccl.so.2) not found; tried %s (set UVMREC_NCCL to "
                              "its path)", tried);
    return;
  }
  struct {
    void **fn;
    const char *name;
  } syms[] = {
      {(void **)&nccl.get_version, "ncclGetVersion"},
      {(void **)&nccl.get_unique_id, "ncclGetUniqueId"},
      {(void **)&nccl.comm_init_rank, "ncclCommInitRank"},
      {(void **)&nccl.comm_destroy, "ncclCommDestroy"},
      {(void **)&nccl.comm_abort, "ncclCommAbort"},
      {(void **)&nccl.get_error_string, "ncclGetErrorString"},
      {(void **)&nccl.all_reduce, "ncclAllReduce"},
      {(void **)&nccl.reduce_scatter, "ncclReduceScatter"},
      {(void **)&nccl.all_gather, "ncclAllGather"},
      {(void **)&nccl.broadcast, "ncclBroadcast"},
      {(void **)&nccl.send, "ncclSend"},
      {(void **)&nccl.recv, "ncclRecv"},
      {(void **)&nccl.group_start, "ncclGroupStart"},
      {(void **)&nccl.group_end, "ncclGroupEnd"},
  };
  for (size_t i = 0; i < sizeof syms / sizeof *syms; i++)
    if (!(*syms[i].fn = dlsym(h, syms[i].name))) {
      snprintf(why, sizeof why, "comm: %s has no %s (NCCL 2.7 or later is needed)", nccl.path,
               syms[i].name);
      return;
    }
  /* optional: without them (NCCL before 2.14) communicators block, and a hang is not aborted */
  nccl.comm_init_rank_config = (int (*)(ur__nccl_comm_t *, int, ur__nccl_id, int,
                                        ur__nccl_config *))dlsym(h, "ncclCommInitRankConfig");
  nccl.comm_get_async_error = (int (*)(ur__nccl_comm_t, int *))dlsym(h, "ncclCommGetAsyncError");
  if (nccl.get_version(&nccl.version) != UR__NCCL_SUCCESS) {
    snprintf(why, sizeof why, "comm: ncclGetVersion of %s failed", nccl.path);
    return;
  }
  opened = 1;
}

ur_status ur__nccl_open(const ur__nccl_api **out) {
  pthread_once(&once, load);
  if (!opened) return ur__error(UR_STATUS_UNSUPPORTED, "%s", why);
  *out = &nccl;
  return UR_STATUS_OK;
}

ur_status ur_nccl_version(int32_t *version, char *path, size_t len) {
  UR__ARGS(version);
  const ur__nccl_api *api = NULL;
  ur_status st = ur__nccl_open(&api);
  if (st) return st;
  *version = api->version;
  if (path && len) snprintf(path, len, "%s", api->path);
  return UR_STATUS_OK;
}
