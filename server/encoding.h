/* encoding.h - HTTP content codings (RFC 9110 section 8.4) with zlib:
 * request bodies sent with Content-Encoding gzip or deflate inflated under
 * a bound, answers compressed for a client whose Accept-Encoding asks
 * (encoding.c). Calls no other file of the daemon. */
#ifndef CANOPY_SERVER_ENCODING_H
#define CANOPY_SERVER_ENCODING_H

#include <stddef.h>

#include "canopy_core.h"

/* A content coding: none, gzip (RFC 1952) or deflate (the zlib format of
 * RFC 1950, as HTTP means it); CN__ENC_BAD: one the daemon does not do. */
enum { CN__ENC_NONE = 0, CN__ENC_GZIP, CN__ENC_DEFLATE, CN__ENC_BAD };

/* The coding a Content-Encoding header names (NULL: none). */
int cn__enc_of_content(const char *header);
/* The coding an answer gets for an Accept-Encoding header (NULL: none):
 * gzip if the client takes it, else deflate, else none. */
int cn__enc_of_accept(const char *header);
/* "gzip", "deflate". */
const char *cn__enc_name(int enc);

/* Inflates in[0..n) coded enc into *out (malloc'd, *out_len bytes, a NUL
 * after them). Stops as soon as the result would pass max bytes: 413
 * too_large then, with what is known of its size, without inflating the
 * rest. Truncated or corrupt data, or bytes after the stream: 400
 * bad_request naming the byte. On failure *out is NULL. */
int cn__inflate(int enc, const char *in, size_t n, size_t max, char **out,
                size_t *out_len, cn_err *e);

/* Compresses in[0..n) with enc into *out (malloc'd, *out_len bytes).
 * Returns 0, or -1 (no memory: the caller answers uncompressed). */
int cn__deflate(int enc, const char *in, size_t n, char **out,
                size_t *out_len);

#endif
