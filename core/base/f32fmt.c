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
static void shortest(uint32_t bits, uint32_t *digits, int32_t *exp10) {
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

int cn_f32_shortest(float x, uint32_t *digits, int *exp10) {
  uint32_t bits;
  memcpy(&bits, &x, sizeof(bits));
  if (((bits >> 23) & 0xffu) == 0xffu) return -1; /* NaN, infinity */
  if ((bits & 0x7fffffffu) == 0) {
    *digits = 0;
    *exp10 = 0;
    return 0;
  }
  pthread_once(&tables_once, tables_init);
  int32_t e;
  shortest(bits, digits, &e);
  *exp10 = e;
  return 0;
}

static int n_digits(uint32_t v) {
  int n = 1;
  while (v >= 10) v /= 10, n++;
  return n;
}

/* Writes v's n decimal digits to out. */
static void put_digits(char *out, uint32_t v, int n) {
  for (int i = n - 1; i >= 0; i--) {
    out[i] = (char)('0' + v % 10);
    v /= 10;
  }
}

size_t cn_f32_json(float x, char *out) {
  uint32_t d;
  int e;
  size_t at = 0;
  if (cn_f32_shortest(x, &d, &e) != 0) {
    memcpy(out, "null", 5);
    return 4;
  }
  if (signbit(x)) out[at++] = '-';
  int n = n_digits(d);
  int X = e + n - 1; /* the exponent of the first digit */
  if (X >= -4 && X < 9) { /* fixed, as %.9g chooses */
    if (X < 0) {
      out[at++] = '0';
      out[at++] = '.';
      for (int z = -1; z > X; z--) out[at++] = '0';
      put_digits(out + at, d, n);
      at += (size_t)n;
    } else if (e >= 0) { /* an integer: digits, zeros, ".0" */
      put_digits(out + at, d, n);
      at += (size_t)n;
      for (int z = 0; z < e; z++) out[at++] = '0';
      out[at++] = '.';
      out[at++] = '0';
    } else { /* the point inside the digits */
      char tmp[10];
      put_digits(tmp, d, n);
      memcpy(out + at, tmp, (size_t)X + 1);
      at += (size_t)X + 1;
      out[at++] = '.';
      memcpy(out + at, tmp + X + 1, (size_t)(n - X - 1));
      at += (size_t)(n - X - 1);
    }
  } else { /* d.ddde-X: no '+', no leading zeros in the exponent */
    char tmp[10];
    put_digits(tmp, d, n);
    out[at++] = tmp[0];
    if (n > 1) {
      out[at++] = '.';
      memcpy(out + at, tmp + 1, (size_t)n - 1);
      at += (size_t)n - 1;
    }
    out[at++] = 'e';
    int ex = X;
    if (ex < 0) out[at++] = '-', ex = -ex;
    if (ex >= 10) out[at++] = (char)('0' + ex / 10);
    out[at++] = (char)('0' + ex % 10);
  }
  out[at] = '\0';
  return at;
}
