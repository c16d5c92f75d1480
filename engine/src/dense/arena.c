/* arena.c: tensors carved from a few large blocks of one placement, so that a model's
 * activations and workspaces cost a handful of allocations, once.  Each tensor holds a
 * reference to its block's storage (as a view does), so freeing the arena, or resetting it,
 * never pulls memory from under a live tensor. */
#include <stdlib.h>
#include <string.h>
#include "core/core.h"

#define UR__ARENA_ALIGN 256 /* bytes: what cuBLASLt's fastest kernels assume */

struct ur_arena {
  ur_place place;
  int32_t device;
  uint64_t block_bytes;
  ur_tensor *block;     /* the block being carved (u8), or NULL */
  uint64_t next;        /* its first free byte */
  ur_arena_stats stats;
};

ur_status ur_arena_new(ur_arena **out, ur_place place, int32_t device, uint64_t block_bytes) {
  UR__ARGS(out);
  *out = NULL;
  if ((unsigned)place >= UR_PLACE_COUNT)
    return ur__error(UR_STATUS_INVALID, "arena: placement %d is not a placement", (int)place);
  if (block_bytes < UR__ARENA_ALIGN || block_bytes > (1ull << 40))
    return ur__error(UR_STATUS_INVALID, "arena: block size %llu bytes; expected %d to 2^40",
                     (unsigned long long)block_bytes, UR__ARENA_ALIGN);
  ur_arena *a = calloc(1, sizeof *a);
  if (!a) return ur__error(UR_STATUS_OOM, "arena: out of host memory");
  a->place = place;
  a->device = device;
  a->block_bytes = block_bytes;
  *out = a;
  return UR_STATUS_OK;
}

void ur_arena_reset(ur_arena *a) {
  if (!a) return;
  ur_tensor_free(a->block);
  a->block = NULL;
  a->next = 0;
  a->stats.used = a->stats.reserved = 0;
}

void ur_arena_free(ur_arena *a) {
  if (!a) return;
  ur_arena_reset(a);
  free(a);
}

void ur_arena_stats_get(const ur_arena *a, ur_arena_stats *out) {
  if (a && out) *out = a->stats;
}

ur_status ur_arena_tensor(ur_arena *a, ur_tensor **out, ur_dtype dtype, int32_t ndim,
                          const int64_t *shape) {
  UR__ARGS(a, out, shape);
  *out = NULL;
  uint64_t numel, bytes;
  ur_status st = ur__shape_bytes("arena", dtype, ndim, shape, &numel, &bytes);
  if (st) return st;
  uint64_t need = (bytes + UR__ARENA_ALIGN - 1) / UR__ARENA_ALIGN * UR__ARENA_ALIGN;
  if (!need) need = UR__ARENA_ALIGN;
  ur_tensor *t = malloc(sizeof *t);
  if (!t) return ur__error(UR_STATUS_OOM, "arena: out of host memory");
  if (!a->block || a->next + need > (uint64_t)a->block->numel) {
    uint64_t size = need > a->block_bytes ? need : a->block_bytes;
    int64_t dims[1] = {(int64_t)size};
    ur_tensor *blk;
    st = ur_tensor_new(&blk, UR_DTYPE_U8, 1, dims, a->place, a->device);
    if (st) {
      free(t);
      return st;
    }
    ur_tensor_free(a->block); /* live tensors keep the old block */
    a->block = blk;
    ur__tensor_poison(blk, 0, size, 1); /* readable as it is carved */
    a->next = 0;
    a->stats.reserved += size;
    a->stats.blocks++;
  }
  memset(t, 0, sizeof *t);
  t->st = a->block->st;
  __atomic_add_fetch(&t->st->refs, 1, __ATOMIC_RELAXED);
  ur__tensor_shaped(t, dtype, ndim, shape, numel);
  /* Blocks start page-aligned and need is a multiple of 256, so the offset is whole elements. */
  t->offset = (int64_t)(a->next / ur_dtype_size(dtype));
  ur__tensor_poison(a->block, a->next, a->next + bytes, 0); /* its padding to need stays poisoned */
  a->next += need;
  a->stats.used += need;
  a->stats.tensors++;
  *out = t;
  return UR_STATUS_OK;
}
