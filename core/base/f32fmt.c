/* f32fmt.c - a float32 printed as the shortest decimal that reads back as
 * the same float32, without printf: the Ryū algorithm (Ulf Adams, "Ryū:
 * fast float-to-string conversion", PLDI 2018) for 32-bit floats, then
 * laid out as the answers always were (jansson's "%.9g" layout: fixed
 * notation for decimal exponents -4..8, else d.ddde-X, a ".0" after an
 * integer). printf("%.9g") costs ~0.5 µs a number in glibc (it converts
 * exactly with big integers); this costs a few tens of ns. Tested against
 * strtof over every float32 (tests/test_f32fmt.c, the f32fmt_all suite).
 */
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "base/base.h"

typedef unsigned __int128 u128;

/* Ryū's two tables, computed once (exactly, in 128-bit integers) rather
 * than written out: inv5[q] = floor(2^(bits5(q) - 1 + INV_BITS) / 5^q) + 1
 * for the decimal exponents of values >= 1, pow5[i] = the top POW_BITS
 * bits of 5^i for those below. 5^47 < 2^110, and 2^128 / 5^30 is taken
 * as (2^128 - 1) / 5^30 (no power of 5 divides a power of 2). */
#define INV_BITS 59
#define POW_BITS 61
#define N_INV 31
#define N_POW 48
static uint64_t inv5[N_INV], pow5[N_POW];
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;
static void tables_init(void);
/* Set before main (a static library's constructor runs with the
 * program's), so the per-number path reads a flag and calls nothing;
 * pthread_once stays for a caller that runs before constructors do. */
static bool tables_ready;
__attribute__((constructor)) static void tables_at_load(void) {
  pthread_once(&tables_once, tables_init);
}

/* ceil(log2(5^e)) for e > 0, 1 for e = 0 (exact for 0 <= e <= 3528). */
static inline int32_t bits5(int32_t e) {
  return (int32_t)(((uint32_t)e * 1217359u) >> 19) + 1;
}
/* floor(log10(2^e)), floor(log10(5^e)) for 0 <= e <= 1650. */
static inline uint32_t log10_2(int32_t e) {
  return ((uint32_t)e * 78913u) >> 18;
}
static inline uint32_t log10_5(int32_t e) {
  return ((uint32_t)e * 732923u) >> 20;
}

static void tables_init(void) {
  u128 p = 1;
  for (int i = 0; i < N_POW; i++, p *= 5) {
    int shift = bits5(i) - POW_BITS;
    pow5[i] = (uint64_t)(shift >= 0 ? p >> shift : p << -shift);
    if (i < N_INV) {
      int j = bits5(i) - 1 + INV_BITS;
      u128 num = j >= 128 ? ~(u128)0 : (u128)1 << j;
      inv5[i] = (uint64_t)(num / p) + 1;
    }
  }
  __atomic_store_n(&tables_ready, true, __ATOMIC_RELEASE);
}

/* (m · factor) >> shift, the product exact in 128 bits (m < 2^27). */
static inline uint32_t mul_shift(uint32_t m, uint64_t factor, int32_t shift) {
  return (uint32_t)(((u128)m * factor) >> shift);
}

static inline uint32_t pow5_factor(uint32_t v) {
  uint32_t n = 0;
  while (v != 0 && v % 5 == 0) v /= 5, n++;
  return n;
}

/* The shortest decimal digits·10^exp10 that rounds (to nearest, ties to
 * even, as strtof does) to the finite, non-zero x; of several that short,
 * the closest to x. Ryū §3: the interval of decimals that round to x,
 * its ends scaled by 10^-q with 64-bit approximations of the powers of 5
 * exact enough that no end is misjudged, then digits removed while the
 * interval still holds a number with fewer. */
static inline void shortest(uint32_t bits, uint32_t *digits,
                            int32_t *exp10) {
  uint32_t frac = bits & 0x7fffffu, bexp = (bits >> 23) & 0xffu;
  int32_t e2;
  uint32_t m2;
  if (bexp == 0) { /* subnormal */
    e2 = 1 - 127 - 23 - 2;
    m2 = frac;
  } else {
    e2 = (int32_t)bexp - 127 - 23 - 2;
    m2 = (1u << 23) | frac;
  }
  /* ties go to the even mantissa: its bounds belong to it */
  const bool even = (m2 & 1) == 0;
  /* the value and its interval's ends, times 4 (a power of two below has
   * a gap half as wide) */
  const uint32_t mv = 4 * m2, mp = 4 * m2 + 2;
  const uint32_t mm_shift = frac != 0 || bexp <= 1;
  const uint32_t mm = 4 * m2 - 1 - mm_shift;

  uint32_t vr, vp, vm;
  int32_t e10;
  bool vm_zeros = false, vr_zeros = false; /* digits removed were all 0 */
  uint32_t last = 0;                       /* the last digit removed    */
  if (e2 >= 0) {
    const uint32_t q = log10_2(e2);
    e10 = (int32_t)q;
    const int32_t k = INV_BITS + bits5((int32_t)q) - 1;
    const int32_t i = -e2 + (int32_t)q + k;
    vr = mul_shift(mv, inv5[q], i);
    vp = mul_shift(mp, inv5[q], i);
    vm = mul_shift(mm, inv5[q], i);
    if (q != 0 && (vp - 1) / 10 <= vm / 10) {
      /* the loop below removes no digit: the one below vr, from q - 1 */
      const int32_t l = INV_BITS + bits5((int32_t)(q - 1)) - 1;
      last = mul_shift(mv, inv5[q - 1], -e2 + (int32_t)q - 1 + l) % 10;
    }
    if (q <= 9) {
      /* exact when 5^q divides the end: at most one of the three can be
       * a multiple of 5 (they are 2 apart at most, below 2^27) */
      if (mv % 5 == 0)
        vr_zeros = pow5_factor(mv) >= q;
      else if (even)
        vm_zeros = pow5_factor(mm) >= q;
      else
        vp -= pow5_factor(mp) >= q;
    }
  } else {
    const uint32_t q = log10_5(-e2);
    e10 = (int32_t)q + e2;
    const int32_t i = -e2 - (int32_t)q;
    const int32_t k = bits5(i) - POW_BITS;
    int32_t j = (int32_t)q - k;
    vr = mul_shift(mv, pow5[i], j);
    vp = mul_shift(mp, pow5[i], j);
    vm = mul_shift(mm, pow5[i], j);
    if (q != 0 && (vp - 1) / 10 <= vm / 10) {
      j = (int32_t)q - 1 - (bits5(i + 1) - POW_BITS);
      last = mul_shift(mv, pow5[i + 1], j) % 10;
    }
    if (q <= 1) {
      /* mv = 4·m2 has two trailing zero bits; mm one iff mm_shift */
      vr_zeros = true;
      if (even)
        vm_zeros = mm_shift == 1;
      else
        --vp; /* mp = mv + 2: its end is excluded */
    } else if (q < 31) {
      vr_zeros = (mv & ((1u << (q - 1)) - 1)) == 0;
    }
  }

  int32_t removed = 0;
  uint32_t out;
  if (vm_zeros || vr_zeros) { /* rare: exact ends, exact ties */
    while (vp / 10 > vm / 10) {
      vm_zeros &= vm % 10 == 0;
      vr_zeros &= last == 0;
      last = vr % 10;
      vr /= 10, vp /= 10, vm /= 10;
      removed++;
    }
    if (vm_zeros) {
      while (vm % 10 == 0) {
        vr_zeros &= last == 0;
        last = vr % 10;
        vr /= 10, vp /= 10, vm /= 10;
        removed++;
      }
    }
    if (vr_zeros && last == 5 && vr % 2 == 0) last = 4; /* exact tie: even */
    out = vr + ((vr == vm && (!even || !vm_zeros)) || last >= 5);
  } else {
    while (vp / 10 > vm / 10) {
      last = vr % 10;
      vr /= 10, vp /= 10, vm /= 10;
      removed++;
    }
    out = vr + (vr == vm || last >= 5);
  }
  *digits = out;
  *exp10 = e10 + removed;
}

/* The bits' shortest digits, or -1 for NaN and infinity: the path both
 * public functions share, inline. */
static inline int shortest_of(uint32_t bits, uint32_t *digits, int *exp10) {
  if (((bits >> 23) & 0xffu) == 0xffu) return -1; /* NaN, infinity */
  if ((bits & 0x7fffffffu) == 0) {
    *digits = 0;
    *exp10 = 0;
    return 0;
  }
  if (!__atomic_load_n(&tables_ready, __ATOMIC_ACQUIRE))
    pthread_once(&tables_once, tables_init);
  int32_t e;
  shortest(bits, digits, &e);
  *exp10 = e;
  return 0;
}

int cn_f32_shortest(float x, uint32_t *digits, int *exp10) {
  uint32_t bits;
  memcpy(&bits, &x, sizeof(bits));
  return shortest_of(bits, digits, exp10);
}

/* Decimal digits of v < 10^9 (a float32's shortest digits are at most
 * nine; 0 counts as one digit): the bit length's estimate of the
 * logarithm, corrected by one compare, so no branch depends on the
 * value's length. */
static inline int n_digits(uint32_t v) {
  static const uint32_t pow10[10] = {1,      10,      100,      1000,
                                     10000,  100000,  1000000,  10000000,
                                     100000000, 1000000000};
  uint32_t v1 = v | 1;
  int t = ((32 - __builtin_clz(v1)) * 1233) >> 12; /* floor or one below */
  return t + (v1 >= pow10[t]);
}

/* The eight decimal digits of v < 10^8, zero-padded, as the bytes of a
 * little-endian word, most significant first: split into halves of four
 * digits, the halves into pairs, the pairs into digits, every lane of the
 * word at once (multiplications by reciprocals exact for these ranges:
 * x·10486 >> 20 is x / 100 for x < 10^4, x·103 >> 10 is x / 10 for
 * x < 100). */
static inline uint64_t eight_digits(uint32_t v) {
  uint32_t a = v / 10000, b = v - a * 10000;
  uint64_t m = a | ((uint64_t)b << 32);
  uint64_t top = ((m * 10486) >> 20) & ((0x7Full << 32) | 0x7Full);
  uint64_t bot = m - 100 * top;
  uint64_t hundreds = (bot << 16) + top;
  uint64_t tens = (hundreds * 103) >> 10;
  tens &= (0xFull << 48) | (0xFull << 32) | (0xFull << 16) | 0xFull;
  tens += (hundreds - 10 * tens) << 8;
  return tens + 0x3030303030303030ull;
}

/* "00" .. "99": an exponent's two digits in one copy. */
static const char two_digits[201] =
    "00010203040506070809101112131415161718192021222324252627282930313233"
    "34353637383940414243444546474849505152535455565758596061626364656667"
    "68697071727374757677787980818283848586878889909192939495969798990";

/* How far past the start of a number put_f32 may write (its text is at
 * most CN_JSON_FLOAT_MAX characters; the rest is scratch that the next
 * number or the buffer's end overwrites). */
#define F32_SCRATCH CN__JSON_SCRATCH

/* Nine digits (d >= 10^8) in any layout: zero-padded in memory, each
 * part copied from where it starts. */
static inline char *put_nine(char *p, uint32_t d, int X) {
  char pad[32];
  uint32_t hi = d / 100000000u;
  uint64_t lo = eight_digits(d - hi * 100000000u);
  pad[0] = (char)('0' + hi);
  memcpy(pad + 1, &lo, 8);
  memset(pad + 9, 0, 16);
  if (X >= -4 && X < 9) {
    if (X < 0) {
      memcpy(p, "0.000000", 8);
      p += 1 - X;
      memcpy(p, pad, 9);
      return p + 9;
    }
    if (X == 8) { /* e == 0: digits, ".0" */
      memcpy(p, pad, 9);
      memcpy(p + 9, ".0", 2);
      return p + 11;
    }
    memcpy(p, pad, (size_t)X + 1);
    p[X + 1] = '.';
    memcpy(p + X + 2, pad + X + 1, 16);
    return p + 10;
  }
  p[0] = pad[0];
  p[1] = '.';
  memcpy(p + 2, pad + 1, 8);
  return p + 10;
}

/* x laid out as cn_f32_json lays it out, at p; the length. Writes up to
 * F32_SCRATCH bytes from p, so the caller leaves that much room after
 * the last number: the digits (up to eight) are one word, shifted and
 * stored whole, so that every part is a store of fixed size and only the
 * choice of layout branches. No NUL. */
static inline size_t put_f32(float x, char *p) {
  uint32_t bits, d;
  int e;
  memcpy(&bits, &x, sizeof(bits));
  if (shortest_of(bits, &d, &e) != 0) {
    memcpy(p, "null", 4);
    return 4;
  }
  char *p0 = p;
  *p = '-';
  p += bits >> 31;
  int n = n_digits(d);
  int X = e + n - 1; /* the exponent of the first digit */
  if (n == 9) {
    p = put_nine(p, d, X);
    if (X >= -4 && X < 9) return (size_t)(p - p0);
  } else {
    /* the n digits in the word's low bytes, first digit first */
    uint64_t w = eight_digits(d) >> (8 * (8 - n));
    if (X >= -4 && X < 9) { /* fixed, as %.9g chooses */
      if (X < 0) { /* "0.", zeros, the digits: at most 0.0001dddddddd */
        memcpy(p, "0.000000", 8);
        p += 1 - X;
        memcpy(p, &w, 8);
        p += n;
      } else if (e >= 0) { /* an integer: digits, zeros (e <= 8), ".0" */
        memcpy(p, &w, 8);
        p += n;
        memcpy(p, "00000000", 8);
        p += e;
        memcpy(p, ".0", 2);
        p += 2;
      } else { /* the point inside the digits: X + 1 < n <= 8 of them */
        uint64_t rest = w >> (8 * (X + 1));
        memcpy(p, &w, 8);
        p[X + 1] = '.';
        memcpy(p + X + 2, &rest, 8);
        p += n + 1;
      }
      return (size_t)(p - p0);
    }
    /* d.ddde-X: the first digit, the point, the others */
    uint64_t rest = w >> 8;
    p[0] = (char)w;
    p[1] = '.';
    memcpy(p + 2, &rest, 8);
    p += n > 1 ? n + 1 : 1;
  }
  /* the exponent: no '+', no leading zeros */
  *p++ = 'e';
  int ex = X;
  if (ex < 0) *p++ = '-', ex = -ex;
  if (ex >= 10) {
    memcpy(p, two_digits + 2 * ex, 2);
    p += 2;
  } else {
    *p++ = (char)('0' + ex);
  }
  return (size_t)(p - p0);
}

/* Why its own layout code rather than printf: the answers' numbers are
 * most of their bytes, and "%.9g"'s layout (fixed for decimal exponents
 * -4..8, else d.ddde-X, ".0" after an integer) is a few copies once the
 * digits are known. */
size_t cn_f32_json(float x, char *out) {
  char t[F32_SCRATCH];
  size_t n = put_f32(x, t);
  t[n] = '\0';
  memcpy(out, t, CN_JSON_FLOAT_MAX + 1);
  return n;
}

char *cn__f32_json_array(char *p, const float *x, int64_t n, int *finite) {
  *p++ = '[';
  for (int64_t i = 0; i < n; i++) {
    uint32_t bits;
    memcpy(&bits, &x[i], sizeof(bits));
    if (((bits >> 23) & 0xffu) == 0xffu) *finite = 0;
    p += put_f32(x[i], p);
    *p++ = ',';
  }
  if (n > 0) p--;
  *p++ = ']';
  return p;
}
