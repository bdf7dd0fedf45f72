/* test_f32fmt.c - cn_f32_json (core/base/f32fmt.c) against strtof and a
 * brute-force search: every float printed reads back as the same float32
 * (its bits, -0 included), with as few significant digits as any decimal
 * that reads back as it, and the closest of those when the correctly
 * rounded one of that length reads back; never longer than jansson's
 * "%.9g" text. Edge cases, every power of two, 10M random bit patterns;
 * the brute force on a sample; the layout against a plain one built from
 * the shortest digits, and the array writer (cn_buf_floats) against the
 * numbers one by one, within its room. All 2^32 patterns: `ninja -C build
 * f32fmt_all` (tests/f32fmt_all.c, minutes). */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "canopy_core.h"

static uint32_t bits_of(float x) {
  uint32_t b;
  memcpy(&b, &x, sizeof(b));
  return b;
}

static float float_of(uint32_t b) {
  float x;
  memcpy(&x, &b, sizeof(x));
  return x;
}

/* Significant digits of a decimal text (leading zeros and the exponent
 * aside, trailing zeros of the mantissa aside). */
static int sig_digits(const char *s) {
  int n = 0, zeros = 0;
  bool started = false;
  for (; *s && *s != 'e' && *s != 'E'; s++) {
    if (*s < '0' || *s > '9') continue;
    if (*s == '0' && !started) continue;
    started = true;
    if (*s == '0') zeros++;
    else n += zeros + 1, zeros = 0;
  }
  return n;
}

/* jansson's "%.9g" text of x (what the answers printed before). */
static size_t jansson_len(float x) {
  json_t *a = json_real(x);
  char *s = json_dumps(a, JSON_ENCODE_ANY | JSON_COMPACT |
                              JSON_REAL_PRECISION(9));
  size_t n = strlen(s);
  free(s);
  json_decref(a);
  return n;
}

static void check_one(uint32_t b) {
  float x = float_of(b);
  char out[CN_JSON_FLOAT_MAX + 1];
  size_t n = cn_f32_json(x, out);
  if (!isfinite(x)) {
    cr_assert_str_eq(out, "null");
    return;
  }
  cr_assert_eq(n, strlen(out));
  cr_assert_leq(n, (size_t)CN_JSON_FLOAT_MAX, "%08x: '%s'", b, out);
  char *end;
  float y = strtof(out, &end);
  cr_assert_eq(*end, '\0', "%08x: '%s' is not all a number", b, out);
  cr_assert_eq(bits_of(y), b, "%08x (%.9g) printed '%s', which reads as %08x",
               b, (double)x, out, bits_of(y));
  cr_assert_leq(sig_digits(out), 9, "%08x: '%s'", b, out);
}

/* The fewest significant digits p such that some p-digit decimal reads
 * back as x, by trying the correctly rounded p-digit decimal and its two
 * neighbours for p = 1..9; *rounded: that length's correctly rounded one
 * reads back. */
static int brute_shortest(float x, bool *rounded, double *value) {
  for (int p = 1; p <= 9; p++) {
    char s[64];
    snprintf(s, sizeof(s), "%.*e", p - 1, (double)x);
    char *e = strchr(s, 'e');
    int ex = atoi(e + 1);
    *e = '\0';
    /* the mantissa's digits as an integer */
    long long m = 0;
    bool neg = s[0] == '-';
    for (char *c = s; *c; c++)
      if (*c >= '0' && *c <= '9') m = m * 10 + (*c - '0');
    for (int d = 0; d < 3; d++) {
      long long c = m + (d == 0 ? 0 : d == 1 ? -1 : 1);
      if (c <= 0) continue;
      char t[64];
      snprintf(t, sizeof(t), "%s%llde%d", neg ? "-" : "", c, ex - (p - 1));
      if (bits_of(strtof(t, NULL)) == bits_of(x)) {
        *rounded = d == 0;
        *value = strtod(t, NULL);
        if (d == 0) return p;
        /* a neighbour reads back: the rounded one may too */
        char r[64];
        snprintf(r, sizeof(r), "%s%llde%d", neg ? "-" : "", m, ex - (p - 1));
        if (bits_of(strtof(r, NULL)) == bits_of(x)) {
          *rounded = true;
          *value = strtod(r, NULL);
        }
        return p;
      }
    }
  }
  return 99;
}

Test(f32fmt, edge_cases) {
  float xs[] = {0.0f, -0.0f, 1.0f, -1.0f, 0.1f, 0.2f, 0.3f, 1.0f / 3.0f,
                FLT_MAX, -FLT_MAX, FLT_MIN, -FLT_MIN, FLT_TRUE_MIN,
                -FLT_TRUE_MIN, FLT_EPSILON, 1e-45f, 3e-45f, 1e-38f, 1e38f,
                9.99999997e-5f, 1e-4f, 1e-5f, 123456789.0f, 100000000.0f,
                1e9f, 16777216.0f, 16777217.0f, 33554432.0f, 0.0001f,
                0.00012345679f, 1.17549421e-38f, 8388608.0f, 2.5f,
                7.0e-10f, 1.5e10f, 65504.0f, 3.4028235e38f};
  for (size_t i = 0; i < sizeof(xs) / sizeof(xs[0]); i++)
    check_one(bits_of(xs[i]));
  /* the text of a few, in the answers' layout */
  char out[CN_JSON_FLOAT_MAX + 1];
  struct { float x; const char *s; } t[] = {
      {0.0f, "0.0"},        {-0.0f, "-0.0"},      {1.0f, "1.0"},
      {0.1f, "0.1"},        {-2.5f, "-2.5"},      {100.0f, "100.0"},
      {1e-5f, "1e-5"},      {0.0001f, "0.0001"},  {1e9f, "1e9"},
      {123456789.0f, "123456790.0"}, {1.5e10f, "1.5e10"},
      {FLT_MAX, "3.4028235e38"}, {FLT_TRUE_MIN, "1e-45"},
      {-0.00012345679f, "-0.00012345679"}, {12.375f, "12.375"}};
  for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
    cn_f32_json(t[i].x, out);
    cr_expect_str_eq(out, t[i].s, "%.9g printed '%s', not '%s'",
                     (double)t[i].x, out, t[i].s);
  }
  cr_expect_str_eq((cn_f32_json(NAN, out), out), "null");
  cr_expect_str_eq((cn_f32_json(-INFINITY, out), out), "null");
}

/* Every power of two, and its neighbours (the asymmetric intervals). */
Test(f32fmt, powers_of_two) {
  for (uint32_t e = 0; e < 255; e++)
    for (int s = 0; s < 2; s++) {
      uint32_t b = (uint32_t)s << 31 | e << 23;
      check_one(b);
      check_one(b + 1);
      if ((b & 0x7fffffffu) != 0) check_one(b - 1);
    }
}

/* 10M random bit patterns (a fixed stream: the same ones each time). */
Test(f32fmt, random_round_trip, .timeout = 600) {
  uint64_t st = 0x5eed;
  for (int i = 0; i < 10000000; i++) {
    uint64_t z = (st += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    check_one((uint32_t)(z ^ (z >> 31)));
  }
}

/* Against the brute force and jansson's text, on a sample: random bit
 * patterns, and values near 0.1 (the answers' logits). */
Test(f32fmt, brute_force_shortest, .timeout = 600) {
  uint32_t s = 12345;
  for (int i = 0; i < 300000; i++) {
    s = s * 1664525u + 1013904223u;
    uint32_t b = i % 2 ? s : bits_of(0.1f) + (s >> 12) - (1u << 19);
    float x = float_of(b);
    if (!isfinite(x) || x == 0.0f) continue;
    char out[CN_JSON_FLOAT_MAX + 1];
    size_t n = cn_f32_json(x, out);
    bool rounded = false;
    double v = 0;
    int p = brute_shortest(x, &rounded, &v);
    cr_assert_eq(sig_digits(out), p, "%08x printed '%s' (%d digits), the "
                 "shortest has %d", b, out, sig_digits(out), p);
    if (rounded)
      cr_assert_eq(strtod(out, NULL), v, "%08x printed '%s', the closest "
                   "shortest is %.17g", b, out, v);
    cr_assert_leq(n, jansson_len(x), "%08x: '%s' is longer than %%.9g's",
                  b, out);
  }
}

/* "%.9g"'s layout of digits·10^exp10, built the plain way (a decimal
 * string of the digits, the point placed by copying): what cn_f32_json's
 * word-at-a-time layout must print. */
static void plain_layout(float x, char *out) {
  uint32_t d;
  int e;
  if (cn_f32_shortest(x, &d, &e) != 0) {
    strcpy(out, "null");
    return;
  }
  char dig[16];
  int n = snprintf(dig, sizeof(dig), "%u", d);
  int X = e + n - 1;
  char *p = out;
  if (signbit(x)) *p++ = '-';
  if (X >= -4 && X < 9) {
    if (X < 0) {
      p += sprintf(p, "0.");
      for (int z = 0; z < -X - 1; z++) *p++ = '0';
      p += sprintf(p, "%s", dig);
    } else if (e >= 0) {
      p += sprintf(p, "%s", dig);
      for (int z = 0; z < e; z++) *p++ = '0';
      p += sprintf(p, ".0");
    } else {
      memcpy(p, dig, (size_t)X + 1);
      p += X + 1;
      *p++ = '.';
      p += sprintf(p, "%s", dig + X + 1);
    }
  } else {
    *p++ = dig[0];
    if (n > 1) p += sprintf(p, ".%s", dig + 1);
    p += sprintf(p, "e%d", X);
  }
  *p = '\0';
}

/* Every layout (each count of digits, each decimal exponent, both signs)
 * as the plain one, on random patterns and on the decades' edges. */
Test(f32fmt, layout_as_plain) {
  uint64_t st = 0xface;
  for (int i = 0; i < 2000000; i++) {
    uint64_t z = (st += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    uint32_t b = (uint32_t)(z ^ (z >> 31));
    if (i % 2) /* half near 1e-5 .. 1e10, where the fixed layouts are */
      b = (b & 0x807fffffu) | ((uint32_t)(110 + (z >> 40) % 50) << 23);
    char want[64], got[CN_JSON_FLOAT_MAX + 1];
    plain_layout(float_of(b), want);
    cn_f32_json(float_of(b), got);
    cr_assert_str_eq(got, want, "%08x", b);
  }
  for (int ex = -46; ex <= 39; ex++)
    for (int k = 1; k <= 9; k++) {
      char t[32], want[64], got[CN_JSON_FLOAT_MAX + 1];
      snprintf(t, sizeof(t), "%.*s5e%d", k - 1, "12345678", ex);
      float x = strtof(t, NULL);
      plain_layout(x, want);
      cn_f32_json(x, got);
      cr_assert_str_eq(got, want, "%s", t);
      plain_layout(-x, want);
      cn_f32_json(-x, got);
      cr_assert_str_eq(got, want, "-%s", t);
    }
}

/* cn_buf_floats: "[" and the numbers as cn_f32_json prints them, ","
 * between, "]"; the raw writer stays within the room it asks for
 * (canary bytes after it) and reports a non-finite value. */
Test(f32fmt, floats_array) {
  uint64_t st = 0xbeef;
  for (int len = 0; len < 40; len++) {
    float x[40];
    for (int i = 0; i < len; i++) {
      uint64_t z = (st += 0x9e3779b97f4a7c15ull);
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      uint32_t b = (uint32_t)(z ^ (z >> 29));
      x[i] = float_of(len % 3 ? b : (b & 0x807fffffu) | 0x3d000000u);
    }
    char want[40 * 16 + 8] = "[";
    bool all_finite = true;
    for (int i = 0; i < len; i++) {
      char one[CN_JSON_FLOAT_MAX + 1];
      cn_f32_json(x[i], one);
      if (i > 0) strcat(want, ",");
      strcat(want, one);
      all_finite = all_finite && isfinite(x[i]);
    }
    strcat(want, "]");
    cn_buf b = {0};
    cn_buf_puts(&b, "k:");
    int finite = cn_buf_floats(&b, x, len);
    cr_assert_str_eq(b.p + 2, want, "%d floats", len);
    cr_assert_eq(b.len, 2 + strlen(want));
    cr_assert_eq(finite != 0, all_finite);
    cn_buf_free(&b);
    size_t room = 2 + (size_t)len * (CN_JSON_FLOAT_MAX + 1) + CN__JSON_SCRATCH;
    char *raw = malloc(room + 64);
    memset(raw, 0x5a, room + 64);
    int f2 = 1;
    char *end = cn__f32_json_array(raw, x, len, &f2);
    cr_assert_eq((size_t)(end - raw), strlen(want));
    cr_assert(memcmp(raw, want, strlen(want)) == 0);
    for (size_t i = room; i < room + 64; i++)
      cr_assert_eq((unsigned char)raw[i], 0x5a, "%d floats: byte %zu of "
                   "%zu written", len, i, room);
    free(raw);
  }
}

/* cn_buf_json prints a json_t as json_dumps does (compact), but for its
 * float32 reals. */
Test(f32fmt, buf_json_as_jansson) {
  json_t *j = json_pack("{s:[i,i,s,b,n,f],s:{s:s},s:f,s:f,s:[]}", "a", 1,
                        -42, "q\"\\\n\x01/é", 1, 0.5, "o", "k", "v", "t",
                        1234.5678, "f", (double)0.1f, "e");
  cn_buf b = {0};
  cn_buf_json(&b, j);
  char *d = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(9));
  /* the same text but 0.1f's: jansson "0.100000001", here "0.1" */
  char *at = strstr(d, "0.100000001");
  cr_assert(at != NULL);
  memmove(at + 3, at + 11, strlen(at + 11) + 1);
  cr_expect_str_eq(b.p, d);
  free(d);
  cn_buf_free(&b);
  json_decref(j);
}
