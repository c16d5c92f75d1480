/* memory.c: bytes held per placement, the HBM budget, and the page size by which managed
 * storage is allocated and hinted.  Every byte the engine places on a
 * GPU counts: device tensors, managed bytes advised preferred-on or prefetched to a GPU, and
 * the GPU backend's own workspaces (ur__workspace_take).
 * The budget is how a smaller GPU is emulated on a large one. */
#include <string.h>
#include <unistd.h>
#include "core/core.h"

static ur_memory_stats mem;
static uint64_t page_bytes;

uint64_t ur_hint_page_bytes_get(void) {
  if (!page_bytes) page_bytes = (uint64_t)sysconf(_SC_PAGESIZE);
  return page_bytes;
}

ur_status ur_hint_page_bytes_set(uint64_t bytes) {
  if (bytes < 4096 || bytes > (2u << 20) || (bytes & (bytes - 1)))
    return ur__error(UR_STATUS_INVALID,
                     "hint page size: %llu bytes; expected a power of two from 4096 to 2097152",
                     (unsigned long long)bytes);
  page_bytes = bytes;
  return UR_STATUS_OK;
}

ur_status ur__hbm_reserve(uint64_t bytes, const char *what) {
  if (mem.hbm_budget && mem.hbm_used + bytes > mem.hbm_budget) {
    char a[32], u[32], b[32];
    ur__format_bytes(bytes, a, sizeof a);
    ur__format_bytes(mem.hbm_used, u, sizeof u);
    ur__format_bytes(mem.hbm_budget, b, sizeof b);
    return ur__error(UR_STATUS_OOM,
                     "hbm budget: %s asks for %s (%llu bytes) on the GPU, %s are in use, and "
                     "the budget is %s (%llu bytes)",
                     what, a, (unsigned long long)bytes, u, b,
                     (unsigned long long)mem.hbm_budget);
  }
  mem.hbm_used += bytes;
  if (mem.hbm_used > mem.hbm_peak) mem.hbm_peak = mem.hbm_used;
  return UR_STATUS_OK;
}

void ur__hbm_release(uint64_t bytes) { mem.hbm_used -= bytes < mem.hbm_used ? bytes : mem.hbm_used; }

ur_status ur__workspace_take(uint64_t bytes, const char *what) {
  pthread_mutex_lock(&ur__lock);
  ur_status s = ur__hbm_reserve(bytes, what);
  if (!s) mem.workspace += bytes;
  pthread_mutex_unlock(&ur__lock);
  return s;
}

void ur__workspace_give(uint64_t bytes) {
  pthread_mutex_lock(&ur__lock);
  if (bytes > mem.workspace) bytes = mem.workspace;
  mem.workspace -= bytes;
  ur__hbm_release(bytes);
  pthread_mutex_unlock(&ur__lock);
}

void ur__place_add(ur_place place, uint64_t bytes) {
  mem.bytes[place] += bytes;
  mem.allocs[place]++;
}
void ur__place_sub(ur_place place, uint64_t bytes) {
  mem.bytes[place] -= bytes;
  mem.frees[place]++;
}

void ur__managed_gpu_add(int64_t delta) { mem.managed_on_gpu += (uint64_t)delta; }

ur_status ur_hbm_budget_set(uint64_t bytes) {
  pthread_mutex_lock(&ur__lock);
  mem.hbm_budget = bytes;
  pthread_mutex_unlock(&ur__lock);
  return UR_STATUS_OK;
}

uint64_t ur_hbm_budget_get(void) {
  pthread_mutex_lock(&ur__lock);
  uint64_t b = mem.hbm_budget;
  pthread_mutex_unlock(&ur__lock);
  return b;
}

ur_status ur_memory_get(ur_memory_stats *out) {
  UR__ARGS(out);
  pthread_mutex_lock(&ur__lock);
  *out = mem;
  pthread_mutex_unlock(&ur__lock);
  return UR_STATUS_OK;
}

void ur_memory_peak_reset(void) {
  pthread_mutex_lock(&ur__lock);
  mem.hbm_peak = mem.hbm_used;
  pthread_mutex_unlock(&ur__lock);
}
