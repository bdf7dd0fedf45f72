/* conn_parse.c - the request side of an HTTP/1.1 connection: the
 * callbacks of http_parser (Debian's libhttp-parser) that collect a
 * request head within fixed limits, the framing checks http_parser leaves
 * to its caller (RFC 9112: one length, no smuggling), parse errors as one
 * JSON answer of docs/api.md each, and the pump that feeds buffered input
 * to the parser one request at a time and hands each parsed request to
 * http.c. The socket, answers and deadlines are conn.c's; the connection
 * itself is described in conn_impl.h.
 */
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <pthread.h>

#include "conn_impl.h"

static http_parser_settings settings;

/* ---- the head ------------------------------------------------------- */

static int hb_put(cn__conn *c, const char *d, size_t n) {
  if (c->hlen + n + 1 > MAX_HEAD) return -1;
  if (c->hlen + n + 1 > c->hcap) {
    size_t cap = c->hcap ? c->hcap : 512;
    while (cap < c->hlen + n + 1) cap *= 2;
    char *b = realloc(c->hb, cap);
    if (b == NULL) return -1;
    c->hb = b;
    c->hcap = cap;
  }
  memcpy(c->hb + c->hlen, d, n);
  c->hlen += n;
  c->hb[c->hlen] = '\0'; /* a head cut short still reads as strings */
  return 0;
}

/* A callback's refusal: -1 stops http_parser (from on_headers_complete,
 * 1 would only mean "no body"). */
static int refuse(cn__conn *c, int code, const char *msg) {
  c->err_code = code;
  snprintf(c->err_msg, sizeof(c->err_msg), "%s", msg);
  return -1;
}

static int head_too_large(cn__conn *c) {
  char m[120];
  snprintf(m, sizeof(m), "the request head is over %d bytes", MAX_HEAD);
  return refuse(c, CN_E_HEADER_TOO_LARGE, m);
}

/* A header of the request: only one whose line was read to its end. A
 * head refused mid-line (a control character in a value) leaves its last
 * header without a value, or with part of one: the request id of that
 * 400 was once the header's own name, "X-Request-Id", echoed back. */
const char *cn__conn_header(const cn__conn *c, const char *name) {
  int n = c->head_done ? c->nh : c->nh - 1;
  size_t len = strlen(name);
  for (int i = 0; i < n; i++) {
    /* name_len is set once the head is done; before, every name is
     * compared (the request id of a head refused mid-way) */
    if (c->head_done && c->h[i].name_len != len) continue;
    if (strcasecmp(c->hb + c->h[i].name, name) == 0)
      return c->hb + c->h[i].value;
  }
  return NULL;
}

/* RFC 9110 §5.6.2: the bytes of a token (a header name). Everything
 * else (controls, space, DEL, bytes over 0x7f, and the separators
 * "(),/:;<=>?@[\]{} and the double quote) is not. */
static bool token_table[256]; /* filled once, by settings_init */

static bool token_byte(unsigned char ch) { return token_table[ch]; }

/* Whether the header name k of n bytes is lit (lit_len bytes), in any
 * case: the lengths first, so most names cost one comparison. */
static bool name_is(const char *k, size_t n, const char *lit, size_t lit_len) {
  return n == lit_len && strcasecmp(k, lit) == 0;
}
#define NAME_IS(k, n, lit) name_is((k), (n), (lit), sizeof(lit) - 1)

static int on_message_begin(http_parser *p) {
  cn__conn *c = p->data;
  c->phase = PH_HEAD;
  c->deadline = cn_now_s() + c->srv->cfg.serve.header_timeout_s;
  c->hlen = 0;
  c->part = 0;
  c->url_len = 0;
  c->nh = 0;
  c->head_done = false;
  c->expect_continue = false;
  c->ck = 0;
  return 0;
}

static int on_url(http_parser *p, const char *at, size_t n) {
  cn__conn *c = p->data;
  c->url_len += n;
  if (c->url_len > MAX_URL) {
    char m[80];
    snprintf(m, sizeof(m), "the URL is over %d bytes", MAX_URL);
    return refuse(c, CN_E_URI_TOO_LONG, m);
  }
  return hb_put(c, at, n) ? head_too_large(c) : 0;
}

/* A chunked body's trailer section: unused, but bounded like a head (it
 * was not: 10,000 trailer lines were read and dropped). */
static int trailer_put(cn__conn *c, size_t n, int part) {
  c->trailer_len += n;
  if (part == 1 && c->part != 1) c->trailer_lines++;
  c->part = part;
  if (c->trailer_len <= MAX_HEAD && c->trailer_lines <= MAX_HEADERS)
    return 0;
  char m[120];
  snprintf(m, sizeof(m), "the trailer section is over %d bytes or %d lines",
           MAX_HEAD, MAX_HEADERS);
  return refuse(c, CN_E_HEADER_TOO_LARGE, m);
}

static int on_header_field(http_parser *p, const char *at, size_t n) {
  cn__conn *c = p->data;
  if (c->phase != PH_HEAD) return trailer_put(c, n, 1);
  if (c->part != 1) { /* a new header: end the URL or the last value */
    if (c->nh == MAX_HEADERS) {
      char m[80];
      snprintf(m, sizeof(m), "more than %d header lines", MAX_HEADERS);
      return refuse(c, CN_E_HEADER_TOO_LARGE, m);
    }
    if (hb_put(c, "", 1)) return head_too_large(c);
    c->h[c->nh].name = c->hlen;
    c->h[c->nh].value = c->hlen;
    c->nh++;
    c->part = 1;
  }
  return hb_put(c, at, n) ? head_too_large(c) : 0;
}

static int on_header_value(http_parser *p, const char *at, size_t n) {
  cn__conn *c = p->data;
  if (c->phase != PH_HEAD) return trailer_put(c, n, 2);
  if (c->part != 2) {
    if (c->part != 1 || hb_put(c, "", 1)) return head_too_large(c);
    c->h[c->nh - 1].value = c->hlen;
    c->part = 2;
  }
  return hb_put(c, at, n) ? head_too_large(c) : 0;
}

/* Framing checks http_parser leaves to its caller, then the request. */
static int on_headers_complete(http_parser *p) {
  cn__conn *c = p->data;
  cn__server *s = c->srv;
  if (hb_put(c, "", 1)) return head_too_large(c);
  if (c->part == 1) c->h[c->nh - 1].value = c->hlen - 1; /* no value */
  c->head_done = true;
  for (int i = 0; i < c->nh; i++) /* cn__conn_header compares these */
    c->h[i].name_len = strlen(c->hb + c->h[i].name);
  int n_cl = 0, n_te = 0, n_host = 0;
  const char *te = NULL;
  for (int i = 0; i < c->nh; i++) {
    const char *k = c->hb + c->h[i].name;
    /* RFC 9112 §5.1: no whitespace between a field name and its colon
     * (http_parser reads "Content-Length :" as the length; a proxy may
     * not), and a name is a token */
    size_t kl = c->h[i].name_len;
    for (size_t q = 0; q < kl; q++)
      if (!token_byte((unsigned char)k[q]))
        return refuse(c, CN_E_BAD_REQUEST,
                      "a header name holds whitespace or a separator");
    /* a value's trailing whitespace is not part of it (§5.5) */
    char *v = c->hb + c->h[i].value;
    for (size_t vl = strlen(v); vl > 0 && (v[vl - 1] == ' ' || v[vl - 1] == '\t');)
      v[--vl] = '\0';
    if (NAME_IS(k, kl, "Content-Length")) n_cl++;
    if (NAME_IS(k, kl, "Host")) n_host++;
    if (NAME_IS(k, kl, "Transfer-Encoding")) {
      n_te++;
      te = c->hb + c->h[i].value;
    }
    if (NAME_IS(k, kl, "Expect")) {
      if (strcasecmp(c->hb + c->h[i].value, "100-continue") == 0)
        c->expect_continue = true;
      else
        return refuse(c, CN_E_BAD_REQUEST, "unsupported Expect header");
    }
  }
  /* RFC 9112 §6.3: which length frames the body would be a guess, and
   * behind a proxy that guesses the other way it is request smuggling */
  if (n_cl > 1)
    return refuse(c, CN_E_BAD_REQUEST, "more than one Content-Length header");
  if (n_cl > 0 && n_te > 0)
    return refuse(c, CN_E_BAD_REQUEST,
                  "both Content-Length and Transfer-Encoding");
  if (n_te > 1 || (te != NULL && strcasecmp(te, "chunked") != 0))
    return refuse(c, CN_E_NOT_IMPLEMENTED,
                  "Transfer-Encoding other than chunked");
  /* RFC 9112 §6.1: an HTTP/1.0 message with Transfer-Encoding has faulty
   * framing (a 1.0 proxy on the way does not know chunked) */
  if (n_te > 0 && p->http_major == 1 && p->http_minor == 0)
    return refuse(c, CN_E_BAD_REQUEST,
                  "Transfer-Encoding in a request of HTTP version 1.0");
  if (p->http_major != 1 || p->http_minor > 1)
    return refuse(c, CN_E_BAD_REQUEST, "unsupported HTTP version (1.0 "
                  "and 1.1 are served)");
  /* RFC 9112 §3.2: an HTTP/1.1 request has exactly one Host header (an
   * HTTP/1.0 one may have none); two are refused in either version, as
   * a proxy and the daemon could each pick another */
  if (n_host > 1)
    return refuse(c, CN_E_BAD_REQUEST, "more than one Host header");
  if (n_host == 0 && p->http_minor >= 1)
    return refuse(c, CN_E_BAD_REQUEST, "a request of HTTP version 1.1 needs a "
                  "Host header (RFC 9112 section 3.2)");
  char method[16];
  const char *ms = http_method_str((enum http_method)p->method);
  size_t ml = strnlen(ms, sizeof(method) - 1);
  memcpy(method, ms, ml);
  method[ml] = '\0';
  c->r = s->http->begin(s, c, method, c->hb);
  if (c->r == NULL) return refuse(c, CN_E_NOMEM, "out of memory");
  CN_LOG(CN_LOG_DEBUG, "msg=request-head peer=%d method=%s",
         cn__conn_peer_port(c), method);
  bool chunked = te != NULL;
  bool body = chunked || (p->content_length > 0 &&
                          p->content_length != ULLONG_MAX);
  if (body) {
    c->phase = PH_BODY;
    cn__conn_progress_start(c);
    c->deadline = c->credit_at + s->cfg.serve.body_timeout_s; /* now */
    c->trailer_len = 0;
    c->trailer_lines = 0;
    c->part = 0;
  }
  /* a body declared too large is refused before it is sent */
  if (c->srv->http->head_done(c->r, body && !chunked ? p->content_length : 0)) {
    c->must_close = true;
    return -1;
  }
  if (body && c->expect_continue && p->http_major == 1 && p->http_minor >= 1)
    cn__conn_write(c, strdup("HTTP/1.1 100 Continue\r\n\r\n"), 25);
  if (chunked) {
    /* the chunk framing is checked on the raw bytes from here on
     * (chunk_check): http_parser stops here, so the pump knows where the
     * body begins (at the head's last LF, which it parses again) */
    c->ck = CK_HEAD_LF;
    http_parser_pause(p, 1);
  }
  return 0;
}

static int on_body(http_parser *p, const char *at, size_t n) {
  cn__conn *c = p->data;
  if (c->r == NULL) return -1;
  cn__conn_progress(c, n);
  if (c->srv->http->body(c->r, at, n)) { /* answered (too large): stop here */
    c->must_close = true;
    return -1;
  }
  return 0;
}

static int on_message_complete(http_parser *p) {
  cn__conn *c = p->data;
  c->phase = PH_ANSWER;
  c->deadline = 0;
  c->complete = true;
  http_parser_pause(p, 1);
  return 0;
}

static void settings_init(void) {
  for (int k = 0x21; k < 0x7f; k++)
    token_table[k] = strchr("\"(),/:;<=>?@[\\]{}", k) == NULL;
  settings.on_message_begin = on_message_begin;
  settings.on_url = on_url;
  settings.on_header_field = on_header_field;
  settings.on_header_value = on_header_value;
  settings.on_headers_complete = on_headers_complete;
  settings.on_body = on_body;
  settings.on_message_complete = on_message_complete;
}

/* ---- chunk framing -------------------------------------------------- */

/* Debian's libhttp-parser is built without HTTP_PARSER_STRICT: it takes
 * any two bytes after a chunk's data for the CRLF RFC 9112 §7.1 requires
 * there (`1a\r\n<26 bytes>XX0\r\n\r\n`), and anything after a chunk size
 * as an extension even without its `;` (`1a zz\r\n`). A proxy in front
 * that reads such a body another way (takes `XX0...` as data, or `zz` as
 * part of the size) and forwards the rest as a next request is request
 * smuggling: the two disagree on where this request ends. So the framing
 * of a chunked body is checked here on the raw bytes http_parser consumed,
 * whichever reads they came in, and a body that breaks it is refused 400
 * and the connection closed, as any other framing error. Accepted:
 *   chunk-size [ *(SP / HTAB) ";" ext-without-CR-LF ] CRLF data CRLF
 * up to the last chunk (size 0); its trailer section is http_parser's. */

static bool ck_hex(char ch, unsigned *v) {
  if (ch >= '0' && ch <= '9') *v = (unsigned)(ch - '0');
  else if (ch >= 'a' && ch <= 'f') *v = (unsigned)(ch - 'a' + 10);
  else if (ch >= 'A' && ch <= 'F') *v = (unsigned)(ch - 'A' + 10);
  else return false;
  return true;
}

/* Walks n raw bytes of the body; NULL when they keep the framing, else
 * what is wrong. */
static const char *chunk_check(cn__conn *c, const char *b, size_t n) {
  for (size_t i = 0; i < n && c->ck != CK_DONE; i++) {
    char ch = b[i];
    unsigned v;
    switch (c->ck) {
      case CK_HEAD_LF:
        if (ch != '\n') return "the request head does not end with CRLF";
        c->ck = CK_SIZE0;
        c->ck_left = 0;
        c->ck_digits = 0;
        break;
      case CK_SIZE0:
      case CK_SIZE:
        if (ck_hex(ch, &v)) {
          /* leading zeros are no digits of the size */
          if ((c->ck_left != 0 || v != 0) && ++c->ck_digits > 15)
            return "a chunk size is too large";
          c->ck_left = c->ck_left * 16 + v;
          c->ck = CK_SIZE;
        } else if (c->ck == CK_SIZE0) {
          return "a chunk size is not hexadecimal";
        } else if (ch == ' ' || ch == '\t') {
          c->ck = CK_BWS;
        } else if (ch == ';') {
          c->ck = CK_EXT;
        } else if (ch == '\r') {
          c->ck = CK_SIZE_LF;
        } else {
          return "junk after a chunk size";
        }
        break;
      case CK_BWS: /* whitespace may come before an extension's ';' only */
        if (ch == ';') c->ck = CK_EXT;
        else if (ch != ' ' && ch != '\t') return "junk after a chunk size";
        break;
      case CK_EXT:
        if (ch == '\r') c->ck = CK_SIZE_LF;
        else if ((unsigned char)ch < 0x20 && ch != '\t')
          return "a control character in a chunk extension";
        break;
      case CK_SIZE_LF:
        if (ch != '\n') return "a chunk size line does not end with CRLF";
        c->ck = c->ck_left == 0 ? CK_DONE : CK_DATA;
        break;
      case CK_DATA: {
        uint64_t k = n - i < c->ck_left ? n - i : c->ck_left;
        c->ck_left -= k;
        i += (size_t)k - 1;
        if (c->ck_left == 0) c->ck = CK_DATA_CR;
        break;
      }
      case CK_DATA_CR:
        if (ch != '\r') return "a chunk's data is not followed by CRLF";
        c->ck = CK_DATA_LF;
        break;
      case CK_DATA_LF:
        if (ch != '\n') return "a chunk's data is not followed by CRLF";
        c->ck = CK_SIZE0;
        c->ck_left = 0;
        c->ck_digits = 0;
        break;
      default:
        break;
    }
  }
  return NULL;
}

/* ---- errors ---------------------------------------------------------- */

/* An error of the front end itself (framing, limits, deadlines): one JSON
 * answer with a request id, then close. */
void cn__conn_answer_error(cn__conn *c, int code, const char *msg) {
  c->must_close = true;
  if (c->r == NULL) {
    const char *url = c->phase == PH_HEAD && c->hlen > 0 ? c->hb : "-";
    c->r = c->srv->http->begin(c->srv, c, "-", url);
    if (c->r == NULL) {
      cn__conn_close(c);
      return;
    }
  }
  c->srv->http->fail(c->r, code, msg);
}

/* Why http_parser stopped, as one of docs/api.md's errors. */
static void parse_error(cn__conn *c) {
  enum http_errno e = HTTP_PARSER_ERRNO(&c->p);
  if (c->err_code != 0) {
    int code = c->err_code;
    c->err_code = 0;
    cn__conn_answer_error(c, code, c->err_msg);
    return;
  }
  if (c->phase == PH_LINGER || c->phase == PH_CLOSED)
    return; /* a callback answered already (413) */
  char m[200];
  int code = CN_E_BAD_REQUEST;
  switch (e) {
    case HPE_HEADER_OVERFLOW:
      code = CN_E_HEADER_TOO_LARGE;
      snprintf(m, sizeof(m), "the request head is too large");
      break;
    case HPE_INVALID_CONTENT_LENGTH: /* http_parser's, for both */
      snprintf(m, sizeof(m), c->ck != CK_NONE
                                 ? "a chunk size is too large"
                                 : "Content-Length is not a valid length");
      break;
    case HPE_UNEXPECTED_CONTENT_LENGTH:
      snprintf(m, sizeof(m), "more than one Content-Length header, or both "
               "Content-Length and Transfer-Encoding");
      break;
    case HPE_INVALID_TRANSFER_ENCODING:
      code = CN_E_NOT_IMPLEMENTED;
      snprintf(m, sizeof(m), "Transfer-Encoding other than chunked");
      break;
    default:
      snprintf(m, sizeof(m), "malformed HTTP request: %s",
               http_errno_description(e));
  }
  cn__conn_answer_error(c, code, m);
}

/* ---- the input ------------------------------------------------------- */

/* Parses what was read, one request at a time: stops at the end of a
 * message until its answer is written. */
void cn__conn_pump(cn__conn *c) {
  c->pumping = true;
  while ((c->phase == PH_IDLE || c->phase == PH_HEAD ||
          c->phase == PH_BODY) &&
         c->writes == 0 && c->in_len > 0) {
    if (HTTP_PARSER_ERRNO(&c->p) == HPE_PAUSED) http_parser_pause(&c->p, 0);
    /* set mid-call (the head, up to the pause) or done (a next request):
     * nothing to check */
    bool in_chunks = c->ck != CK_NONE && c->ck != CK_DONE;
    size_t n = http_parser_execute(&c->p, &settings, c->in, c->in_len);
    if (c->phase == PH_CLOSED) return;
    if (n > c->in_len) n = c->in_len;
    const char *bad = in_chunks ? chunk_check(c, c->in, n) : NULL;
    memmove(c->in, c->in + n, c->in_len - n);
    c->in_len -= n;
    enum http_errno e = HTTP_PARSER_ERRNO(&c->p);
    if (e != HPE_OK && e != HPE_PAUSED) {
      c->in_len = 0;
      parse_error(c);
      break;
    }
    if (bad != NULL) { /* http_parser took it; a proxy may not (above) */
      c->complete = false;
      c->in_len = 0;
      cn__conn_answer_error(c, CN_E_BAD_REQUEST, bad);
      break;
    }
    if (c->complete) {
      c->complete = false;
      if (c->p.upgrade) c->must_close = true; /* not HTTP after this */
      c->srv->http->complete(c->r); /* answers now or later */
    }
  }
  c->pumping = false;
  if (c->phase == PH_LINGER) c->in_len = 0;
  cn__conn_reads(c);
}

/* Bytes from the client. */
void cn__conn_feed(cn__conn *c, const char *data, size_t n) {
  if (c->phase == PH_CLOSED || n == 0) return;
  if (c->phase == PH_LINGER) return; /* read and dropped */
  if (c->in_len + n > c->in_cap) {
    size_t cap = c->in_cap ? c->in_cap : 1024;
    while (cap < c->in_len + n) cap *= 2;
    char *b = realloc(c->in, cap);
    if (b == NULL) {
      cn__conn_close(c);
      return;
    }
    c->in = b;
    c->in_cap = cap;
  }
  memcpy(c->in + c->in_len, data, n);
  c->in_len += n;
  if (c->quiet_until != 0) cn__conn_drain_quiet(c); /* still talking */
  cn__conn_pump(c);
  /* nothing held: give the buffer back (2,000 idle connections) */
  if (c->in_len == 0 && c->in_cap > 4096) {
    free(c->in);
    c->in = NULL;
    c->in_cap = 0;
  }
}

/* ---- the protocol the transport hands up to --------------------------- */

static const struct cn__conn_proto http1 = {cn__conn_feed, cn__conn_pump,
                                     cn__conn_answer_error};

void cn__http1_attach(cn__server *s) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, settings_init);
  s->conn_proto = &http1;
}
