/* copy.c — the executor's copies into user buffers, and when to bypass the cache.
 *
 * A large collective writes every byte of the receive buffer once and nobody reads it
 * again before the call returns.  An ordinary store first reads the line it writes
 * (read-for-ownership), so an out-of-place copy of n bytes costs 3n of memory traffic;
 * a streaming (non-temporal) store writes the line without reading it: 2n.  When the
 * call's buffers are far larger than the cache that is a third less traffic, which is
 * what large all-gathers and all-reduces are bound by.  Small calls keep ordinary
 * stores: their output is likely read next, and from cache.
 *
 * Must never: stream into FIFO slots (the peer reads those next, from cache).  The
 * streamed stores are ordered once, by coll_copy_nt_fence() at the end of the call
 * (an sfence per slice stalled every slice until its lines reached memory).
 */
#include <stdint.h>
#include <string.h>

#include "internal.h"

/* The user's bytes are the whole of what the call writes on this rank: p blocks for
 * all-gather, reduce-scatter's input, all-to-all, gather and scatter.  In place, an
 * all-reduce, reduce-scatter, reduce or all-to-all reads its output lines as inputs first,
 * and streaming them back out cost more than it saved (2 ranks, 64 MiB all-reduce in
 * place: 16.0-16.6 ms cached, 18.8-23.0 streamed).  A broadcast's, all-gather's or
 * gather's output lines in place are never its inputs (the root's own block or buffer is
 * not rewritten), so they stream as out of place (2 ranks, 64 MiB broadcast in place:
 * 12.3 ms cached, 7.9 streamed; 4 ranks 30.7 and 19.7). */
bool coll_copy_streams(coll_coll_kind c, size_t count, size_t es, int nranks, bool in_place,
                       size_t nt_bytes) {
  size_t user = count * es;
  if (c == COLL_COLL_ALL_GATHER || c == COLL_COLL_REDUCE_SCATTER || c == COLL_COLL_ALL_TO_ALL ||
      c == COLL_COLL_GATHER || c == COLL_COLL_SCATTER)
    user *= (size_t)nranks;
  bool pure_output = c == COLL_COLL_BROADCAST || c == COLL_COLL_ALL_GATHER || c == COLL_COLL_GATHER;
  return user >= nt_bytes && (!in_place || pure_output);
}

#if defined(__x86_64__)
#include <emmintrin.h>

#include <immintrin.h>

/* One 64-byte line per store where the CPU has AVX-512 (measured on this VM's Zen cores:
 * 64 MiB streamed copies 19-21 GB/s against 17.7-18.5 with four 16-byte stores). */
__attribute__((target("avx512f"))) static void nt_lines_avx512(uint8_t *d, const uint8_t *s,
                                                               size_t lines) {
  for (; lines; lines--, d += 64, s += 64)
    _mm512_stream_si512((void *)d, _mm512_loadu_si512((const void *)s));
}

static int have_avx512 = -1;
__attribute__((constructor)) static void probe_cpu(void) {
  __builtin_cpu_init();
  have_avx512 = __builtin_cpu_supports("avx512f") ? 1 : 0;
}

void coll_copy_nt(void *dst, const void *src, size_t n) {
  uint8_t *d = dst;
  const uint8_t *s = src;
  size_t head = have_avx512 > 0 ? (size_t)(-(uintptr_t)d & 63) : (size_t)(-(uintptr_t)d & 15);
  if (n < 256 || head >= n) {
    memcpy(d, s, n);
    return;
  }
  memcpy(d, s, head);
  d += head, s += head, n -= head;
  if (have_avx512 > 0) {
    nt_lines_avx512(d, s, n / 64);
    d += n / 64 * 64, s += n / 64 * 64, n %= 64;
  }
  for (; n >= 64; d += 64, s += 64, n -= 64) {
    __m128i a = _mm_loadu_si128((const __m128i *)s);
    __m128i b = _mm_loadu_si128((const __m128i *)(s + 16));
    __m128i c = _mm_loadu_si128((const __m128i *)(s + 32));
    __m128i e = _mm_loadu_si128((const __m128i *)(s + 48));
    _mm_stream_si128((__m128i *)d, a);
    _mm_stream_si128((__m128i *)(d + 16), b);
    _mm_stream_si128((__m128i *)(d + 32), c);
    _mm_stream_si128((__m128i *)(d + 48), e);
  }
  memcpy(d, s, n);
}

void coll_copy_nt_fence(void) { _mm_sfence(); }

/* Four lines a step, each step asking for the lines 2 KiB ahead: the lines another core
 * just wrote come over one at a time unless asked for early. */
__attribute__((target("avx512f"))) static void pf_lines_avx512(uint8_t *d, const uint8_t *s,
                                                               size_t steps) {
  for (; steps; steps--, d += 256, s += 256) {
    _mm_prefetch((const char *)s + 2048, _MM_HINT_T0);
    _mm_prefetch((const char *)s + 2048 + 64, _MM_HINT_T0);
    _mm_prefetch((const char *)s + 2048 + 128, _MM_HINT_T0);
    _mm_prefetch((const char *)s + 2048 + 192, _MM_HINT_T0);
    __m512i a = _mm512_loadu_si512((const void *)s), b = _mm512_loadu_si512((const void *)(s + 64));
    __m512i c = _mm512_loadu_si512((const void *)(s + 128));
    __m512i e = _mm512_loadu_si512((const void *)(s + 192));
    _mm512_storeu_si512((void *)d, a);
    _mm512_storeu_si512((void *)(d + 64), b);
    _mm512_storeu_si512((void *)(d + 128), c);
    _mm512_storeu_si512((void *)(d + 192), e);
  }
}

void coll_copy_shared(void *dst, const void *src, size_t n) {
  if (have_avx512 <= 0 || n < 4096) {
    memcpy(dst, src, n);
    return;
  }
  pf_lines_avx512(dst, src, n / 256);
  memcpy((uint8_t *)dst + n / 256 * 256, (const uint8_t *)src + n / 256 * 256, n % 256);
}
#else
void coll_copy_nt(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }
void coll_copy_nt_fence(void) {}
void coll_copy_shared(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }
#endif
