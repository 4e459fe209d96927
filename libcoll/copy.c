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
 * streamed stores are ordered once, by coll_copy_stream_fence() at the end of the call
 * (an sfence per slice stalled every slice until its lines reached memory).
 */
#include <stdint.h>
#include <string.h>

#include "internal.h"

#if defined(__x86_64__)
#include <emmintrin.h>

void coll_copy_stream(void *dst, const void *src, size_t n) {
  uint8_t *d = dst;
  const uint8_t *s = src;
  size_t head = (size_t)(-(uintptr_t)d & 15);
  if (n < 256 || head >= n) {
    memcpy(d, s, n);
    return;
  }
  memcpy(d, s, head);
  d += head, s += head, n -= head;
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

void coll_copy_stream_fence(void) { _mm_sfence(); }
#else
void coll_copy_stream(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }
void coll_copy_stream_fence(void) {}
#endif
