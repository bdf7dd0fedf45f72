/* numtext.c - a duration of an answer's stats (queue_ms) as text, the
 * bytes cn_buf_double writes, without a printf per answer.
 *
 * cn_buf_double writes a double that is not a float32 as "%.9g" (then a
 * ".0" after an integer, no '+' or leading zeros in an exponent). Each
 * answer of a run has its own queue_ms, and snprintf's "%.9g" took
 * ~2,600 instructions of the ~6,000 the worker spent on an answer's
 * envelope. Here the nine digits are computed exactly in integers: a
 * double is m * 2^e, and for 1e-4 <= x < 1e9 (every duration a request
 * sees: 0.1 µs to 11 days) the decimal digits are m * 10^k >> -e with
 * k <= 12, a product below 2^93, rounded half to even on the exact
 * remainder as glibc's printf rounds in the default rounding mode. Any
 * other value (negative, a float32, out of that range, not finite) is
 * cn_buf_double's own. tests/test_serve_numtext.c compares the two byte
 * for byte on millions of values, ties and boundaries included.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "numtext.h"

static const uint64_t pow10_u64[] = {
    1ull,          10ull,          100ull,          1000ull,
    10000ull,      100000ull,      1000000ull,      10000000ull,
    100000000ull,  1000000000ull,  10000000000ull,  100000000000ull,
    1000000000000ull};

/* x's nine significant digits at decimal exponent E (x ~ d.dddddddd *
 * 10^E), truncated, with the remainder's relation to one half of the
 * last digit: *half < 0 below, 0 exactly half, > 0 above; false where
 * k = 8 - E is outside 0..12 (then the caller falls back). */
static bool digits_at(uint64_t m, int e2, int E, uint64_t *q, int *half) {
  int k = 8 - E;
  if (k < 0 || k > 12 || e2 >= 0 || e2 < -120) return false;
  unsigned __int128 n = (unsigned __int128)m * pow10_u64[k];
  int s = -e2;
  unsigned __int128 whole = s >= 128 ? 0 : n >> s;
  unsigned __int128 rem = n - (whole << s);
  unsigned __int128 h = (unsigned __int128)1 << (s - 1);
  *q = (uint64_t)whole;
  *half = rem < h ? -1 : rem == h ? 0 : 1;
  return true;
}

void cn__buf_ms(cn_buf *b, double x) {
  if (!(x >= 1e-4 && x < 1e9) || (double)(float)x == x) {
    cn_buf_double(b, x);
    return;
  }
  int e;
  double fr = frexp(x, &e); /* x = fr * 2^e, 0.5 <= fr < 1 */
  uint64_t m = (uint64_t)ldexp(fr, 53);
  int e2 = e - 53;
  /* the decimal exponent: a guess, corrected on the exact digits */
  int E = (int)floor(log10(x));
  uint64_t q = 0;
  int half = 0;
  for (int tries = 0;; tries++) {
    if (tries > 3 || !digits_at(m, e2, E, &q, &half)) {
      cn_buf_double(b, x);
      return;
    }
    if (q >= 1000000000ull) E++;
    else if (q < 100000000ull) E--;
    else break;
  }
  if (half > 0 || (half == 0 && (q & 1))) q++;
  if (q == 1000000000ull) {
    q = 100000000ull;
    E++;
  }
  if (E < -4 || E >= 9) { /* "%.9g" writes an exponent: printf's case */
    cn_buf_double(b, x);
    return;
  }
  char d[9];
  for (int i = 8; i >= 0; i--, q /= 10) d[i] = (char)('0' + q % 10);
  int nd = 9; /* trailing zeros go, as "%g" drops them */
  while (nd > 1 && d[nd - 1] == '0') nd--;
  char out[24], *p = out;
  if (E < 0) {
    *p++ = '0';
    *p++ = '.';
    for (int i = 0; i < -E - 1; i++) *p++ = '0';
    memcpy(p, d, (size_t)nd);
    p += nd;
  } else {
    int ni = E + 1; /* digits before the point */
    for (int i = 0; i < ni; i++) *p++ = i < nd ? d[i] : '0';
    *p++ = '.';
    if (nd > ni) {
      memcpy(p, d + ni, (size_t)(nd - ni));
      p += nd - ni;
    } else {
      *p++ = '0'; /* an integer: cn_buf_double's ".0" */
    }
  }
  cn_buf_put(b, out, (size_t)(p - out));
}
