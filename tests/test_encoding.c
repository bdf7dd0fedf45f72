/* test_encoding.c - the daemon's content codings (server/encoding.c)
 * against zlib used directly as the reference: Content-Encoding and
 * Accept-Encoding read as RFC 9110 says (lists, q values, "*",
 * identity), bodies inflated back to their bytes (gzip, gzip members one
 * after another, the zlib format and a raw deflate stream sent as
 * "deflate"), and every way a body can fail: over the bound (413, decided
 * before the rest of the stream is read: a bomb whose tail is corrupt
 * still gets 413), truncated, corrupt, or followed by bytes (400). */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "encoding.h"

/* in[0..n) compressed by zlib itself: wbits 16+15 gzip, 15 zlib, -15 raw */
static unsigned char *zip(const void *in, size_t n, int wbits, size_t *out) {
  z_stream z;
  memset(&z, 0, sizeof(z));
  cr_assert_eq(deflateInit2(&z, 9, Z_DEFLATED, wbits, 8, Z_DEFAULT_STRATEGY),
               Z_OK);
  size_t cap = deflateBound(&z, n) + 64;
  unsigned char *b = malloc(cap);
  z.next_in = (Bytef *)in;
  z.avail_in = (uInt)n;
  z.next_out = b;
  z.avail_out = (uInt)cap;
  cr_assert_eq(deflate(&z, Z_FINISH), Z_STREAM_END);
  *out = cap - z.avail_out;
  deflateEnd(&z);
  return b;
}

static char *text(size_t n) {
  char *t = malloc(n);
  for (size_t i = 0; i < n; i++) t[i] = "{\"tree\": \"(3 (2 a) (4 b))\"} "[i % 28] + (char)(i % 7 == 0);
  return t;
}

Test(encoding, content_header) {
  cr_expect_eq(cn__enc_of_content(NULL), CN__ENC_NONE);
  cr_expect_eq(cn__enc_of_content("gzip"), CN__ENC_GZIP);
  cr_expect_eq(cn__enc_of_content(" GZip "), CN__ENC_GZIP);
  cr_expect_eq(cn__enc_of_content("x-gzip"), CN__ENC_GZIP);
  cr_expect_eq(cn__enc_of_content("deflate"), CN__ENC_DEFLATE);
  cr_expect_eq(cn__enc_of_content("identity"), CN__ENC_NONE);
  cr_expect_eq(cn__enc_of_content("identity, gzip"), CN__ENC_GZIP);
  cr_expect_eq(cn__enc_of_content(""), CN__ENC_NONE);
  cr_expect_eq(cn__enc_of_content("br"), CN__ENC_BAD);
  cr_expect_eq(cn__enc_of_content("deflate, gzip"), CN__ENC_BAD);
  cr_expect_eq(cn__enc_of_content("gzipx"), CN__ENC_BAD);
}

Test(encoding, accept_header) {
  cr_expect_eq(cn__enc_of_accept(NULL), CN__ENC_NONE);
  cr_expect_eq(cn__enc_of_accept("gzip"), CN__ENC_GZIP);
  cr_expect_eq(cn__enc_of_accept("deflate"), CN__ENC_DEFLATE);
  cr_expect_eq(cn__enc_of_accept("gzip, deflate"), CN__ENC_GZIP);
  cr_expect_eq(cn__enc_of_accept("deflate, gzip;q=0.5"), CN__ENC_DEFLATE);
  cr_expect_eq(cn__enc_of_accept("gzip;q=0, deflate"), CN__ENC_DEFLATE);
  cr_expect_eq(cn__enc_of_accept("gzip; q=0"), CN__ENC_NONE);
  cr_expect_eq(cn__enc_of_accept("*"), CN__ENC_GZIP);
  cr_expect_eq(cn__enc_of_accept("*;q=0"), CN__ENC_NONE);
  cr_expect_eq(cn__enc_of_accept("gzip;q=0, *"), CN__ENC_DEFLATE);
  cr_expect_eq(cn__enc_of_accept("identity"), CN__ENC_NONE);
  cr_expect_eq(cn__enc_of_accept("br, zstd"), CN__ENC_NONE);
}

static void round_trip(int enc, int wbits, size_t n) {
  char *t = text(n), *out;
  size_t zn, on;
  unsigned char *z = zip(t, n, wbits, &zn);
  cn_err e;
  cn_err_clear(&e);
  cr_assert_eq(cn__inflate(enc, (char *)z, zn, n, &out, &on, &e), 0,
               "wbits %d n %zu: %s", wbits, n, e.msg);
  cr_expect_eq(on, n);
  cr_expect(memcmp(out, t, n) == 0);
  cr_expect_eq(out[on], '\0');
  free(out);
  free(z);
  free(t);
}

Test(encoding, inflates_every_form) {
  size_t sizes[] = {0, 1, 27, 4095, 4096, 4097, 100000};
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    round_trip(CN__ENC_GZIP, 16 + 15, sizes[i]);
    round_trip(CN__ENC_DEFLATE, 15, sizes[i]);
    round_trip(CN__ENC_DEFLATE, -15, sizes[i]); /* raw, as some send */
  }
}

Test(encoding, gzip_members) {
  size_t an, bn;
  unsigned char *a = zip("{\"tree\": ", 9, 16 + 15, &an);
  unsigned char *b = zip("\"(a b)\"}", 8, 16 + 15, &bn);
  char *both = malloc(an + bn), *out;
  memcpy(both, a, an);
  memcpy(both + an, b, bn);
  size_t on;
  cn_err e;
  cn_err_clear(&e);
  cr_assert_eq(cn__inflate(CN__ENC_GZIP, both, an + bn, 100, &out, &on, &e),
               0, "%s", e.msg);
  cr_expect_str_eq(out, "{\"tree\": \"(a b)\"}");
  free(out);
  /* "deflate" is one stream: bytes after it are refused */
  free(a);
  free(b);
  a = zip("{}", 2, 15, &an);
  memcpy(both, a, an);
  both[an] = 'x';
  cr_expect_eq(cn__inflate(CN__ENC_DEFLATE, both, an + 1, 100, &out, &on,
                           &e), CN_E_BAD_REQUEST);
  cr_expect(strstr(e.msg, "after its compressed stream") != NULL, "%s",
            e.msg);
  cr_expect_null(out);
  free(a);
  free(both);
}

Test(encoding, bound_exact) {
  char *t = text(5000), *out;
  size_t zn, on;
  unsigned char *z = zip(t, 5000, 16 + 15, &zn);
  cn_err e;
  cn_err_clear(&e);
  cr_expect_eq(cn__inflate(CN__ENC_GZIP, (char *)z, zn, 5000, &out, &on, &e),
               0); /* exactly the bound */
  free(out);
  cr_expect_eq(cn__inflate(CN__ENC_GZIP, (char *)z, zn, 4999, &out, &on, &e),
               CN_E_TOO_LARGE);
  cr_expect(strstr(e.msg, "more than 4999 bytes (max-body-bytes") != NULL,
            "%s", e.msg);
  cr_expect_null(out);
  free(z);
  free(t);
}

/* 64 MiB of zeros, its compressed tail replaced by junk: a reader that
 * inflated it all would find the junk (400); one that stops at the bound
 * never reaches it (413). */
Test(encoding, bomb_stops_at_the_bound) {
  size_t n = 64u << 20, zn;
  char *zeros = calloc(1, n), *out;
  unsigned char *z = zip(zeros, n, 16 + 15, &zn);
  free(zeros);
  cr_assert_gt(zn, 1000);
  memset(z + zn / 2, 0xff, zn - zn / 2);
  size_t on;
  cn_err e;
  cn_err_clear(&e);
  cr_expect_eq(cn__inflate(CN__ENC_GZIP, (char *)z, zn, 1 << 20, &out, &on,
                           &e), CN_E_TOO_LARGE, "%s", e.msg);
  cr_expect(strstr(e.msg, "inflates (gzip) to more than 1048576") != NULL,
            "%s", e.msg);
  /* with room for all of it, the junk is found */
  cr_expect_eq(cn__inflate(CN__ENC_GZIP, (char *)z, zn, 1u << 30, &out, &on,
                           &e), CN_E_BAD_REQUEST, "%s", e.msg);
  free(z);
}

Test(encoding, truncated_and_corrupt) {
  char *t = text(3000), *out;
  size_t zn, on;
  unsigned char *z = zip(t, 3000, 16 + 15, &zn);
  cn_err e;
  cn_err_clear(&e);
  cr_expect_eq(cn__inflate(CN__ENC_GZIP, (char *)z, zn - 5, 10000, &out, &on,
                           &e), CN_E_BAD_REQUEST);
  cr_expect(strstr(e.msg, "ends before its compressed stream") != NULL, "%s",
            e.msg);
  cr_expect_eq(cn__inflate(CN__ENC_GZIP, "not gzip at all", 15, 10000, &out,
                           &on, &e), CN_E_BAD_REQUEST);
  cr_expect(strstr(e.msg, "not valid gzip") != NULL, "%s", e.msg);
  cr_expect_eq(cn__inflate(CN__ENC_GZIP, "", 0, 10000, &out, &on, &e),
               CN_E_BAD_REQUEST);
  free(z);
  free(t);
}

Test(encoding, deflate_is_inflated_by_zlib) {
  char *t = text(70000), *z;
  size_t zn;
  for (int enc = CN__ENC_GZIP; enc <= CN__ENC_DEFLATE; enc++) {
    cr_assert_eq(cn__deflate(enc, t, 70000, &z, &zn), 0);
    cr_expect_lt(zn, 70000);
    z_stream s;
    memset(&s, 0, sizeof(s));
    cr_assert_eq(inflateInit2(&s, enc == CN__ENC_GZIP ? 16 + 15 : 15), Z_OK);
    char *back = malloc(70001);
    s.next_in = (Bytef *)z;
    s.avail_in = (uInt)zn;
    s.next_out = (Bytef *)back;
    s.avail_out = 70001;
    cr_expect_eq(inflate(&s, Z_FINISH), Z_STREAM_END);
    cr_expect_eq(s.total_out, 70000);
    cr_expect(memcmp(back, t, 70000) == 0);
    cr_expect_eq(s.avail_in, 0);
    inflateEnd(&s);
    free(back);
    free(z);
  }
  free(t);
}
