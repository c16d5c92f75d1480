/* bypass.h: stores that bypass the CPU's caches, for memory written once and read by someone else
 * later (a consumer thread, a copy to the GPU, a GPU reading host memory): they save reading
 * each line before writing it and leave the caches to the writer's other work.  ur__bypass_fence
 * orders them before whatever the writer does next (another thread or the GPU reading them). */
#ifndef UR_BYPASS_H
#define UR_BYPASS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__SSE2__) && defined(__x86_64__)
#include <emmintrin.h>
static inline void ur__bypass64(int64_t *p, int64_t v) { _mm_stream_si64((long long *)p, v); }
static inline void ur__bypass32(int32_t *p, int32_t v) { _mm_stream_si32(p, v); }
static inline void ur__bypass_fence(void) { _mm_sfence(); }
/* n bytes from `from` to `to`, 16 at a time where both and n are multiples of 16. */
static inline void ur__bypass_copy(void *to, const void *from, size_t n) {
  if (((uintptr_t)to | (uintptr_t)from | n) & 15) {
    memcpy(to, from, n);
    return;
  }
  for (size_t o = 0; o < n; o += 16)
    _mm_stream_si128((__m128i *)((char *)to + o), _mm_load_si128((const __m128i *)((const char *)from + o)));
}
#else
static inline void ur__bypass64(int64_t *p, int64_t v) { *p = v; }
static inline void ur__bypass32(int32_t *p, int32_t v) { *p = v; }
static inline void ur__bypass_fence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void ur__bypass_copy(void *to, const void *from, size_t n) { memcpy(to, from, n); }
#endif

#endif
