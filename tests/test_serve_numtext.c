/* test_serve_numtext.c - an answer's queue_ms as text (server/numtext.c)
 * against cn_buf_double, whose "%.9g" printf wrote it before, byte for
 * byte: millions of values spread over the range the fast path takes
 * (1e-4 to 1e9) and past its ends, the durations a clock difference
 * gives, exact ties at the ninth digit (rounded half to even) and their
 * neighbours, the powers of ten and 10^9 - 0.5 each side, where the
 * digits roll over into another exponent. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "numtext.h"

static long long checked;

/* One value: the fast text and cn_buf_double's must be the same bytes. */
static void same(double x) {
  cn_buf a = {0}, b = {0};
  cn__buf_ms(&a, x);
  cn_buf_double(&b, x);
  cr_assert(!a.failed && !b.failed);
  if (a.len != b.len || memcmp(a.p, b.p, a.len) != 0)
    cr_assert_fail("%.17g (%a): fast \"%s\", printf \"%s\"", x, x, a.p, b.p);
  cn_buf_free(&a);
  cn_buf_free(&b);
  checked++;
}

/* x and its nearest neighbours, two each side. */
static void around(double x) {
  double lo = x, hi = x;
  same(x);
  for (int i = 0; i < 2; i++) {
    lo = nextafter(lo, 0);
    hi = nextafter(hi, INFINITY);
    same(lo);
    same(hi);
  }
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t next_u64(void) { /* xorshift64* */
  rng ^= rng >> 12;
  rng ^= rng << 25;
  rng ^= rng >> 27;
  return rng * 2685821657736338717ull;
}

Test(numtext, random_bits_over_the_range) {
  /* every bit pattern whose exponent puts it in 2^-15 .. 2^31 */
  for (int i = 0; i < 2000000; i++) {
    uint64_t u = next_u64();
    uint64_t exp = 1023 - 15 + (u >> 58) % 47;
    uint64_t bits = (exp << 52) | (u & ((1ull << 52) - 1));
    double x;
    memcpy(&x, &bits, sizeof(x));
    same(x);
  }
}

Test(numtext, durations_as_a_clock_gives_them) {
  /* (t1 - t0) * 1e3 of two monotonic seconds, as worker.c computes it */
  for (int i = 0; i < 1000000; i++) {
    double t0 = 1000.0 + (double)(next_u64() % 100000000000ull) / 1e6;
    double dt = (double)(next_u64() % 10000000000ull) / 1e9;
    same(((t0 + dt) - t0) * 1e3);
  }
  for (int k = 1; k < 200000; k++) { /* short decimals: 0.001, 0.002 ... */
    same(k / 1000.0);
    same(k * 0.001);
    same(k / 7.0);
  }
}

Test(numtext, ties_and_their_neighbours) {
  /* a tenth significant digit of exactly 5: n + 0.5 is exact for n below
   * 2^52, and n/2^k for small k; ties go to the even ninth digit */
  for (long long n = 100000000; n < 100000000 + 200000; n++) same(n + 0.5);
  for (long long n = 999800000; n < 1000000000; n += 7) around(n + 0.5);
  for (int k = 1; k <= 30; k++)
    for (int i = 0; i < 20000; i++) {
      uint64_t n = next_u64() % (1ull << 40);
      around(ldexp((double)(2 * n + 1), -k));
    }
  /* decimal ties d.dddddddd5 x 10^E nearest a double, each side */
  for (int E = -5; E <= 9; E++)
    for (int i = 0; i < 20000; i++) {
      long long d = 100000000 + (long long)(next_u64() % 900000000ull);
      around((d * 10 + 5) * pow(10, E - 9));
    }
}

Test(numtext, ends_and_powers_of_ten) {
  static const double ends[] = {1e-4, 1e-5, 9.99999999e-5, 9.999999995e-5,
                                1e9, 999999999.0, 999999999.5, 999999999.4,
                                999999999.6, 99999999.95, 0.0001000000005,
                                1.0, 0.1, 123456789.0, 123456789.25};
  for (size_t i = 0; i < sizeof(ends) / sizeof(ends[0]); i++) around(ends[i]);
  for (int E = -6; E <= 10; E++) {
    double p = pow(10, E);
    around(p);
    around(p * (1 - 5e-10));  /* rounds up into the next power */
    around(p * (1 - 4e-10));
    around(p * (1 + 5e-9));
  }
  /* what the fast path leaves to printf: still the same bytes */
  static const double other[] = {0.0, -0.0, -1.5, -123.456, 1e300, 1e-300,
                                 INFINITY, 0.5, 2.0, 1.25e9, 3e-7};
  for (size_t i = 0; i < sizeof(other) / sizeof(other[0]); i++)
    same(other[i]);
  cr_assert_gt(checked, 100);
}
