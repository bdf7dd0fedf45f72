/* encoding.c - HTTP content codings with zlib (docs/api.md
 * "Compression"): a request body sent with Content-Encoding gzip or
 * deflate is inflated before it is parsed, never past max-body-bytes (a
 * body that would inflate further is refused as soon as it passes, so a
 * few KiB that inflate to gigabytes cost the daemon max-body-bytes at
 * most), and an answer is compressed for a client whose Accept-Encoding
 * takes gzip or deflate. Tritonclient's and the KServe SDK's
 * request_compression_algorithm and response_compression_algorithm send
 * exactly these headers. Calls no other file of the daemon. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <zlib.h>

#include "encoding.h"

/* One element of a comma-separated header list: [b, e) trimmed, its
 * q value (1 when none, 0 when "q=0"). Returns the rest, or NULL. */
static const char *list_item(const char *p, const char **b, size_t *len,
                             double *q) {
  while (*p == ' ' || *p == '\t' || *p == ',') p++;
  if (*p == '\0') return NULL;
  const char *end = p + strcspn(p, ",");
  const char *semi = memchr(p, ';', (size_t)(end - p));
  const char *ne = semi ? semi : end;
  while (ne > p && (ne[-1] == ' ' || ne[-1] == '\t')) ne--;
  *b = p;
  *len = (size_t)(ne - p);
  *q = 1.0;
  if (semi != NULL) {
    const char *qs = semi + 1;
    while (*qs == ' ' || *qs == '\t') qs++;
    if ((qs[0] == 'q' || qs[0] == 'Q') && qs[1] == '=')
      *q = strtod(qs + 2, NULL);
  }
  return end;
}

static bool is(const char *b, size_t n, const char *name) {
  return n == strlen(name) && strncasecmp(b, name, n) == 0;
}

/* One coding, "identity" ignored; two codings applied one after the
 * other are not done here (CN__ENC_BAD, as an unknown one). */
int cn__enc_of_content(const char *h) {
  int enc = CN__ENC_NONE;
  const char *b;
  size_t n;
  double q;
  while (h != NULL && (h = list_item(h, &b, &n, &q)) != NULL) {
    int this = is(b, n, "gzip") || is(b, n, "x-gzip") ? CN__ENC_GZIP
               : is(b, n, "deflate")                  ? CN__ENC_DEFLATE
               : is(b, n, "identity")                 ? CN__ENC_NONE
                                                      : CN__ENC_BAD;
    if (this == CN__ENC_NONE) continue;
    if (enc != CN__ENC_NONE) return CN__ENC_BAD;
    enc = this;
  }
  return enc;
}

/* RFC 9110 section 12.5.3: a coding is acceptable when listed (or "*" is)
 * with q > 0; the higher q wins, gzip on a tie. */
int cn__enc_of_accept(const char *h) {
  double qg = -1, qd = -1, qstar = -1;
  const char *b;
  size_t n;
  double q;
  while (h != NULL && (h = list_item(h, &b, &n, &q)) != NULL) {
    if (is(b, n, "gzip") || is(b, n, "x-gzip")) qg = q;
    else if (is(b, n, "deflate")) qd = q;
    else if (is(b, n, "*")) qstar = q;
  }
  if (qg < 0) qg = qstar;
  if (qd < 0) qd = qstar;
  if (qg > 0 && qg >= qd) return CN__ENC_GZIP;
  if (qd > 0) return CN__ENC_DEFLATE;
  return CN__ENC_NONE;
}

const char *cn__enc_name(int enc) {
  return enc == CN__ENC_GZIP ? "gzip" : enc == CN__ENC_DEFLATE ? "deflate"
                                                               : "identity";
}

/* "deflate" in HTTP is the zlib format (RFC 1950), but some clients send
 * a raw deflate stream: a valid zlib header tells them apart (its first
 * two bytes, big-endian, are a multiple of 31 with method 8). */
static bool zlib_header(const char *in, size_t n) {
  if (n < 2) return true;
  unsigned char a = (unsigned char)in[0], b = (unsigned char)in[1];
  return (a & 0x0f) == 8 && (a >> 4) <= 7 && ((a << 8) | b) % 31 == 0;
}

/* Why inflating a body exists: the JSON parse takes bytes, and a bound on
 * what it may take has to hold for what the body inflates to, not for
 * what was sent (a 64 KiB gzip body can hold 64 MiB of one byte). The
 * output grows by doubling up to max + 1 bytes, so the refusal costs at
 * most max-body-bytes of memory and that much inflating. */
int cn__inflate(int enc, const char *in, size_t n, size_t max, char **out,
                size_t *out_len, cn_err *e) {
  z_stream z;
  char *buf = NULL;
  size_t cap = 0, len = 0;
  int rc = 0;
  const char *name = cn__enc_name(enc);
  *out = NULL;
  *out_len = 0;
  memset(&z, 0, sizeof(z));
  int wbits = enc == CN__ENC_GZIP ? 16 + MAX_WBITS
              : zlib_header(in, n) ? MAX_WBITS
                                   : -MAX_WBITS;
  if (inflateInit2(&z, wbits) != Z_OK)
    return cn_err_set(e, CN_E_NOMEM, "no memory to inflate the body");
  z.next_in = (Bytef *)(uintptr_t)in;
  z.avail_in = (uInt)n;
  for (;;) {
    if (len > max) {
      rc = cn_err_set(e, CN_E_TOO_LARGE, "the body inflates (%s) to more "
                      "than %zu bytes (max-body-bytes; it was sent as %zu "
                      "bytes)", name, max, n);
      goto out;
    }
    if (len == cap) {
      size_t ncap = cap ? cap * 2 : (n < 1024 ? 4096 : n * 4);
      if (ncap > max + 1) ncap = max + 1;
      char *nb = realloc(buf, ncap);
      if (nb == NULL) {
        rc = cn_err_set(e, CN_E_NOMEM, "no memory to inflate the body");
        goto out;
      }
      buf = nb;
      cap = ncap;
    }
    z.next_out = (Bytef *)buf + len;
    z.avail_out = (uInt)(cap - len);
    int zr = inflate(&z, Z_NO_FLUSH);
    len = cap - z.avail_out;
    if (len > max) continue; /* refused above */
    if (zr == Z_STREAM_END) {
      if (z.avail_in == 0) break;
      /* RFC 1952: a gzip body may be several members one after another */
      if (enc == CN__ENC_GZIP && inflateReset(&z) == Z_OK) continue;
      rc = cn_err_set(e, CN_E_BAD_REQUEST, "the %s body has %u bytes after "
                      "its compressed stream ends (at byte %zu)", name,
                      z.avail_in, n - z.avail_in);
      goto out;
    }
    if (zr == Z_OK || (zr == Z_BUF_ERROR && z.avail_out == 0)) continue;
    if (zr == Z_BUF_ERROR) /* no output room wanted, no input left */
      rc = cn_err_set(e, CN_E_BAD_REQUEST, "the %s body ends before its "
                      "compressed stream does (%zu bytes sent, truncated?)",
                      name, n);
    else if (zr == Z_MEM_ERROR)
      rc = cn_err_set(e, CN_E_NOMEM, "no memory to inflate the body");
    else
      rc = cn_err_set(e, CN_E_BAD_REQUEST, "the body is not valid %s data "
                      "(Content-Encoding: %s): %s, near byte %zu", name, name,
                      z.msg ? z.msg : "corrupt stream", n - z.avail_in);
    goto out;
  }
  if (len == cap) {
    char *nb = realloc(buf, len + 1);
    if (nb == NULL) {
      rc = cn_err_set(e, CN_E_NOMEM, "no memory to inflate the body");
      goto out;
    }
    buf = nb;
  }
  buf[len] = '\0';
  *out = buf;
  *out_len = len;
  buf = NULL;
out:
  inflateEnd(&z);
  free(buf);
  return rc;
}

/* Level 1, zlib's fastest: an answer is compressed on the worker that
 * ran it, before the next run, and the text of floats and names the
 * answers hold gets most of its gain at that level. */
int cn__deflate(int enc, const char *in, size_t n, char **out,
                size_t *out_len) {
  z_stream z;
  int rc = -1;
  *out = NULL;
  *out_len = 0;
  memset(&z, 0, sizeof(z));
  if (deflateInit2(&z, 1, Z_DEFLATED,
                   enc == CN__ENC_GZIP ? 16 + MAX_WBITS : MAX_WBITS, 8,
                   Z_DEFAULT_STRATEGY) != Z_OK)
    return -1;
  size_t cap = deflateBound(&z, (uLong)n) + 32;
  char *buf = malloc(cap);
  if (buf == NULL) goto out;
  z.next_in = (Bytef *)(uintptr_t)in;
  z.avail_in = (uInt)n;
  z.next_out = (Bytef *)buf;
  z.avail_out = (uInt)cap;
  if (deflate(&z, Z_FINISH) != Z_STREAM_END) goto out;
  *out = buf;
  *out_len = cap - z.avail_out;
  buf = NULL;
  rc = 0;
out:
  deflateEnd(&z);
  free(buf);
  return rc;
}
