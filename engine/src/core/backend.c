/* backend.c: finds and loads the CUDA backend (libuvmrec_cuda.so) on first use.  Its absence,
 * or a machine without a GPU, is not an error: the engine then runs on the CPU backend. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "core/core.h"

pthread_mutex_t ur__lock = PTHREAD_MUTEX_INITIALIZER;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static const ur_backend *gpu;
static int cuda_loaded;
static char cuda_archs[128];
static char cuda_why[4096];

const ur_core_api ur__core_api = {UR_BACKEND_ABI, ur__error, ur_interrupt_get,
                                   ur__workspace_take, ur__workspace_give, ur_clock_seconds};

void *ur__dlopen_beside(const char *name, const char *env_var, int flags, char *path,
                        size_t path_len, char *tried, size_t tried_len) {
  const char *env = getenv(env_var);
  void *h;
  tried[0] = 0;
  if (env && *env) {
    snprintf(tried, tried_len, "%s", env);
    snprintf(path, path_len, "%s", env);
    return dlopen(env, flags);
  }
  Dl_info info;
  char exe[4096];
  if (dladdr((void *)ur__dlopen_beside, &info) && info.dli_fname) {
    /* A program found through PATH is named without its folder (argv[0]): ask the kernel. */
    const char *fname = info.dli_fname;
    ssize_t n;
    if (!strchr(fname, '/') && (n = readlink("/proc/self/exe", exe, sizeof exe - 1)) > 0) {
      exe[n] = 0;
      fname = exe;
    }
    const char *slash = strrchr(fname, '/');
    int dirlen = slash ? (int)(slash - fname) : 1;
    const char *dir = slash ? fname : ".";
    const char *rel[] = {"/", "/../lib/"};
    for (int i = 0; i < 2; i++) {
      snprintf(path, path_len, "%.*s%s%s", dirlen, dir, rel[i], name);
      if ((h = dlopen(path, flags))) return h;
      size_t used = strlen(tried);
      snprintf(tried + used, tried_len - used, "%s%s: %s", i ? "; " : "", path, dlerror());
    }
  }
  snprintf(path, path_len, "%s", name);
  size_t used = strlen(tried);
  snprintf(tried + used, tried_len - used, "%s%s", used ? "; " : "", name);
  return dlopen(name, flags);
}

static void load(void) {
  char tried[3072];
  const char *off = getenv("UVMREC_NO_GPU");
  if (off && *off && strcmp(off, "0")) {
    snprintf(cuda_why, sizeof cuda_why, "UVMREC_NO_GPU is set");
    return;
  }
  char path[4096];
  void *h = ur__dlopen_beside("libuvmrec_cuda.so", "UVMREC_CUDA_LIB", RTLD_NOW | RTLD_LOCAL, path,
                              sizeof path, tried, sizeof tried);
  if (!h) {
    snprintf(cuda_why, sizeof cuda_why, "libuvmrec_cuda.so not loaded (tried %s): %s", tried,
             dlerror());
    return;
  }
  ur_backend_init_fn init = (ur_backend_init_fn)dlsym(h, UR_CUDA_BACKEND_INIT);
  if (!init) {
    snprintf(cuda_why, sizeof cuda_why, "libuvmrec_cuda.so has no %s", UR_CUDA_BACKEND_INIT);
    return;
  }
  cuda_loaded = 1;
  ur_backend_archs_fn archs = (ur_backend_archs_fn)dlsym(h, UR_CUDA_BACKEND_ARCHS);
  if (archs) snprintf(cuda_archs, sizeof cuda_archs, "%s", archs());
  const ur_backend *b = NULL;
  if (init(&ur__core_api, &b) != UR_STATUS_OK || !b) {
    /* Without a driver at all the CUDA runtime speaks of an "insufficient" one: say which. */
    void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (driver) {
      dlclose(driver);
      snprintf(cuda_why, sizeof cuda_why, "%s", ur_last_error());
    } else {
      snprintf(cuda_why, sizeof cuda_why, "no NVIDIA driver: libcuda.so.1 cannot be loaded (%s)",
               dlerror());
    }
    ur__error(UR_STATUS_OK, "%s", "");
    return;
  }
  if (b->abi != UR_BACKEND_ABI) {
    snprintf(cuda_why, sizeof cuda_why, "libuvmrec_cuda.so speaks backend ABI %d, expected %d",
             b->abi, UR_BACKEND_ABI);
    return;
  }
  gpu = b;
}

const ur_backend *ur__backend_for(ur_place place) {
  const ur_backend *g = ur__gpu();
  return g && (place == UR_PLACE_DEVICE || place == UR_PLACE_MANAGED) ? g : ur__cpu();
}

const ur_backend *ur__tensor_backend(const ur_tensor *t) { return ur__backend_for(t->st->place); }

ur_status ur__device_enter(const ur_backend *b, int32_t device, int32_t *prev) {
  *prev = UR_LOC_CPU;
  if (device < 0 || !b->device_count()) return UR_STATUS_OK;
  ur_status st = b->device_get(prev);
  if (!st && device != *prev) st = b->device_set(device);
  return st;
}

ur_status ur__device_leave(const ur_backend *b, int32_t device, int32_t prev, ur_status st) {
  if (device >= 0 && prev >= 0 && device != prev) {
    ur_status st2 = b->device_set(prev);
    if (!st) st = st2;
  }
  return st;
}

ur_status ur__missing(const ur_backend *b, const char *family, const char *op) {
  return ur__error(UR_STATUS_UNSUPPORTED, "%s %s is not available on %s", family, op, b->name);
}

const ur_backend *ur__gpu(void) {
  pthread_once(&once, load);
  return gpu;
}

int ur_cuda_built(void) {
  pthread_once(&once, load);
  return cuda_loaded;
}

const char *ur_cuda_archs(void) {
  pthread_once(&once, load);
  return cuda_archs;
}

const char *ur_cuda_error(void) {
  pthread_once(&once, load);
  return cuda_why;
}


int ur_device_count(void) { return ur__gpu() ? gpu->device_count() : 0; }

static ur_status no_gpu(const char *what) {
  return ur__error(UR_STATUS_UNSUPPORTED, "%s: needs a GPU, and none is in use (%s)", what,
                   cuda_why);
}

ur_status ur_device_set(int32_t device) {
  if (!ur__gpu()) return no_gpu("device_set");
  int n = gpu->device_count();
  if (device < 0 || device >= n)
    return ur__error(UR_STATUS_INVALID, "device_set: device %d does not exist; expected 0..%d",
                     (int)device, n - 1);
  return gpu->device_set(device);
}

ur_status ur_device_get(int32_t *out) {
  UR__ARGS(out);
  return (ur__gpu() ? gpu : ur__cpu())->device_get(out);
}

ur_status ur_device_props_get(int32_t device, ur_device_props *out) {
  UR__ARGS(out);
  if (!ur__gpu()) return no_gpu("device_props");
  int n = gpu->device_count();
  if (device < 0 || device >= n)
    return ur__error(UR_STATUS_INVALID, "device_props: device %d does not exist; expected 0..%d",
                     (int)device, n - 1);
  memset(out, 0, sizeof *out);
  return gpu->device_props(device, out);
}

ur_status ur_device_sync(void) { return ur__gpu() ? gpu->device_sync() : UR_STATUS_OK; }
