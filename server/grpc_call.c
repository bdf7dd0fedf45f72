/* grpc_call.c - one gRPC call on its HTTP/2 stream: nghttp2's callbacks
 * that open the call, check its headers (method, content-type,
 * grpc-encoding, grpc-timeout) and gather its one request message within
 * grpc-max-message-bytes and max-body-memory (inflated by encoding.c when
 * it comes compressed), and the call's answer: the response message and
 * the grpc-status / grpc-message trailers. grpc.c runs the session and
 * dispatches the call once its message is complete.
 */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <nghttp2/nghttp2.h>

#include "encoding.h"
#include "grpc_impl.h"

/* ---- answers ------------------------------------------------------------ */

/* grpc-message is percent-encoded: bytes outside printable ASCII, and
 * '%' itself (gRPC over HTTP/2). */
static void pct_encode(const char *in, char *out, size_t cap) {
  size_t o = 0;
  for (const unsigned char *p = (const unsigned char *)in; *p; p++) {
    if (o + 4 >= cap) break;
    if (*p >= 0x20 && *p <= 0x7e && *p != '%') {
      out[o++] = (char)*p;
    } else {
      snprintf(out + o, cap - o, "%%%02X", *p);
      o += 3;
    }
  }
  out[o] = '\0';
}

#define NV(n, v)                                                         \
  {(uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, strlen(v),             \
   NGHTTP2_NV_FLAG_NONE}

static int submit_trailers(gstream *st) {
  char code[8], msg[1800];
  snprintf(code, sizeof(code), "%d", st->status);
  pct_encode(st->message, msg, sizeof(msg));
  nghttp2_nv tr[2] = {NV("grpc-status", code), NV("grpc-message", msg)};
  return nghttp2_submit_trailer(st->gc->ng, st->id, tr,
                                st->message[0] ? 2 : 1);
}

static ssize_t read_answer(nghttp2_session *ng, int32_t id, uint8_t *buf,
                           size_t len, uint32_t *flags,
                           nghttp2_data_source *src, void *ud) {
  gstream *st = src->ptr;
  size_t n = st->out_len - st->out_off;
  if (n > len) n = len;
  memcpy(buf, st->out + st->out_off, n);
  st->out_off += n;
  if (st->out_off == st->out_len) {
    *flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
    if (submit_trailers(st) != 0) return NGHTTP2_ERR_CALLBACK_FAILURE;
  }
  return (ssize_t)n;
}

/* The call's answer: a message (status OK) or a status alone (gRPC's
 * Trailers-Only form). msg (framed, taken over) may be NULL. */
void cn__grpc_call_answer(gstream *st, int status, const char *message,
                          uint8_t *msg, size_t msg_len, const char *reqid) {
  gconn *gc = st->gc;
  if (st->answered) {
    free(msg);
    return;
  }
  st->answered = true;
  st->status = status;
  snprintf(st->message, sizeof(st->message), "%s", message ? message : "");
  char code[8], pmsg[1800];
  snprintf(code, sizeof(code), "%d", status);
  pct_encode(st->message, pmsg, sizeof(pmsg));
  nghttp2_nv h[7] = {NV(":status", "200"),
                     NV("content-type", "application/grpc"),
                     NV("grpc-accept-encoding", "identity,deflate,gzip")};
  size_t nh = 3;
  if (reqid != NULL && reqid[0] != '\0') h[nh++] = (nghttp2_nv)NV("x-request-id", reqid);
  int rc;
  if (msg != NULL) {
    st->out = msg;
    st->out_len = msg_len;
    atomic_fetch_add(&gc->srv->answer_held, (long long)msg_len);
    nghttp2_data_provider dp = {.source.ptr = st, .read_callback = read_answer};
    rc = nghttp2_submit_response(gc->ng, st->id, h, nh, &dp);
  } else {
    h[nh++] = (nghttp2_nv)NV("grpc-status", code);
    if (pmsg[0]) h[nh++] = (nghttp2_nv)NV("grpc-message", pmsg);
    rc = nghttp2_submit_response(gc->ng, st->id, h, nh, NULL);
  }
  gc->last_out = cn_now_s();
  if (rc != 0) nghttp2_submit_rst_stream(gc->ng, NGHTTP2_FLAG_NONE, st->id,
                                         NGHTTP2_INTERNAL_ERROR);
  CN_LOG(CN_LOG_DEBUG, "msg=grpc-call method=%s stream=%d grpc_status=%d",
         cn__grpc_method_name(st->method), st->id, status);
}

void cn__grpc_call_error(gstream *st, int status, const char *message) {
  cn__grpc_call_answer(st, status, message, NULL, 0, NULL);
}

void cn__grpc_body_release(gstream *st) {
  if (st->held > 0) atomic_fetch_sub(&st->gc->srv->body_bytes,
                                     (long long)st->held);
  st->held = 0;
  free(st->in);
  st->in = NULL;
  st->in_len = st->in_cap = 0;
}

/* ---- nghttp2's callbacks ------------------------------------------------ */

int cn__grpc_on_begin_headers(nghttp2_session *ng, const nghttp2_frame *f,
                              void *ud) {
  gconn *gc = ud;
  if (f->hd.type != NGHTTP2_HEADERS ||
      f->headers.cat != NGHTTP2_HCAT_REQUEST)
    return 0;
  gstream *st = calloc(1, sizeof(*st));
  if (st == NULL) return NGHTTP2_ERR_CALLBACK_FAILURE;
  st->gc = gc;
  st->id = f->hd.stream_id;
  st->method = -1;
  st->t_begin = cn_now_s();
  st->next = gc->streams;
  if (gc->streams) gc->streams->prev = st;
  gc->streams = st;
  gc->n_streams++;
  gc->deadline = 0;
  atomic_store(&gc->srv->last_request_us, (long long)(st->t_begin * 1e6));
  nghttp2_session_set_stream_user_data(ng, st->id, st);
  return 0;
}

/* "<up to 8 digits><unit>", unit H M S m u n, rounded up to ms. */
static long long grpc_timeout_ms(const char *v, size_t n) {
  if (n < 2 || n > 9) return 0;
  long long x = 0;
  for (size_t i = 0; i + 1 < n; i++) {
    if (v[i] < '0' || v[i] > '9') return 0;
    x = x * 10 + (v[i] - '0');
  }
  switch (v[n - 1]) {
    case 'H': return x * 3600000;
    case 'M': return x * 60000;
    case 'S': return x * 1000;
    case 'm': return x;
    case 'u': return (x + 999) / 1000;
    case 'n': return (x + 999999) / 1000000;
    default: return 0;
  }
}

static void copy_value(char *dst, size_t cap, const uint8_t *v, size_t n) {
  if (n >= cap) n = cap - 1;
  memcpy(dst, v, n);
  dst[n] = '\0';
}

int cn__grpc_on_header(nghttp2_session *ng, const nghttp2_frame *f,
                       const uint8_t *name, size_t nl, const uint8_t *value,
                       size_t vl, uint8_t flags, void *ud) {
  if (f->hd.type != NGHTTP2_HEADERS ||
      f->headers.cat != NGHTTP2_HCAT_REQUEST)
    return 0;
  gstream *st = nghttp2_session_get_stream_user_data(ng, f->hd.stream_id);
  if (st == NULL) return 0;
#define IS(lit) (nl == sizeof(lit) - 1 && memcmp(name, lit, nl) == 0)
  if (IS(":path")) {
    copy_value(st->path, sizeof(st->path), value, vl);
    st->method = vl < sizeof(st->path) ? cn__grpc_method(st->path) : -1;
  } else if (IS(":method")) {
    st->post = vl == 4 && memcmp(value, "POST", 4) == 0;
  } else if (IS("content-type")) {
    st->grpc_ct = vl >= 16 && memcmp(value, "application/grpc", 16) == 0 &&
                  (vl == 16 || value[16] == '+' || value[16] == ';');
  } else if (IS("x-request-id")) {
    copy_value(st->meta.request_id, sizeof(st->meta.request_id), value, vl);
  } else if (IS("authorization")) {
    copy_value(st->meta.authorization, sizeof(st->meta.authorization),
               value, vl);
  } else if (IS("grpc-encoding")) {
    copy_value(st->encoding, sizeof(st->encoding), value, vl);
  } else if (IS("grpc-timeout")) {
    st->meta.timeout_ms = grpc_timeout_ms((const char *)value, vl);
  }
#undef IS
  return 0;
}

int cn__grpc_on_data(nghttp2_session *ng, uint8_t flags, int32_t id,
                     const uint8_t *data, size_t len, void *ud) {
  gconn *gc = ud;
  gstream *st = nghttp2_session_get_stream_user_data(ng, id);
  if (st == NULL || st->answered || st->dispatched) return 0;
  cn__server *s = gc->srv;
  const cn_serve_config *sc = &s->cfg.serve;
  size_t max = (size_t)sc->grpc_max_message_bytes + 5;
  char err[300];
  if (st->in_len + len > max) {
    snprintf(err, sizeof(err), "the request message is over the limit of "
             "%d bytes (grpc-max-message-bytes)", sc->grpc_max_message_bytes);
    cn__grpc_body_release(st);
    cn__grpc_call_error(st, CN__GRPC_RESOURCE_EXHAUSTED, err);
    return 0;
  }
  if (st->in_len + len > st->in_cap) {
    size_t cap = st->in_cap ? st->in_cap : 4096;
    while (cap < st->in_len + len) cap *= 2;
    if (cap > max) cap = max;
    long long add = (long long)(cap - st->in_cap);
    if (atomic_fetch_add(&s->body_bytes, add) + add > sc->max_body_memory) {
      atomic_fetch_sub(&s->body_bytes, add);
      snprintf(err, sizeof(err), "the server holds too many request bodies "
               "(max-body-memory %d bytes); retry later",
               sc->max_body_memory);
      cn__grpc_body_release(st);
      cn__grpc_call_error(st, CN__GRPC_RESOURCE_EXHAUSTED, err);
      return 0;
    }
    char *q = realloc(st->in, cap);
    if (q == NULL) {
      atomic_fetch_sub(&s->body_bytes, add);
      cn__grpc_body_release(st);
      cn__grpc_call_error(st, CN__GRPC_RESOURCE_EXHAUSTED, "no memory for the "
                 "request message");
      return 0;
    }
    st->in = q;
    st->in_cap = cap;
    st->held += (size_t)add;
  }
  memcpy(st->in + st->in_len, data, len);
  st->in_len += len;
  /* the message's prefix says its length: one too long is refused now,
   * not once its bytes have arrived */
  const unsigned char *u = (const unsigned char *)st->in;
  if (st->in_len >= 5 &&
      ((size_t)u[1] << 24 | (size_t)u[2] << 16 | (size_t)u[3] << 8 |
       (size_t)u[4]) > (size_t)sc->grpc_max_message_bytes) {
    snprintf(err, sizeof(err), "the request message is %zu bytes, over the "
             "limit of %d (grpc-max-message-bytes)",
             (size_t)u[1] << 24 | (size_t)u[2] << 16 | (size_t)u[3] << 8 |
                 (size_t)u[4],
             sc->grpc_max_message_bytes);
    cn__grpc_body_release(st);
    cn__grpc_call_error(st, CN__GRPC_RESOURCE_EXHAUSTED, err);
  }
  return 0;
}

/* A call is dispatched when its message has ended (END_STREAM), or as
 * soon as its headers refuse it (a method not served, not a gRPC POST):
 * a client of a streaming method (ModelStreamInfer) does not end its side
 * before the first answer, and would otherwise wait for the message
 * deadline instead of UNIMPLEMENTED. */
int cn__grpc_on_frame_recv(nghttp2_session *ng, const nghttp2_frame *f,
                           void *ud) {
  gconn *gc = ud;
  if (f->hd.type != NGHTTP2_HEADERS && f->hd.type != NGHTTP2_DATA) return 0;
  gstream *st = nghttp2_session_get_stream_user_data(ng, f->hd.stream_id);
  if (st == NULL) return 0;
  bool end = (f->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0;
  bool refused = f->hd.type == NGHTTP2_HEADERS &&
                 (st->method < 0 || !st->post || !st->grpc_ct);
  if (!end && !refused) return 0;
  if (end) {
    if (st->complete) return 0;
    st->complete = true;
  }
  if (st->answered || st->ready || st->dispatched) return 0;
  st->ready = true;
  if (gc->rtail) gc->rtail->rnext = st;
  else gc->rhead = st;
  gc->rtail = st;
  return 0;
}

int cn__grpc_on_frame_send(nghttp2_session *ng, const nghttp2_frame *f,
                           void *ud) {
  gconn *gc = ud;
  if (f->hd.type == NGHTTP2_DATA) gc->last_out = cn_now_s();
  /* answered before its message ended (a refusal): the rest is not
   * wanted */
  if ((f->hd.type == NGHTTP2_HEADERS || f->hd.type == NGHTTP2_DATA) &&
      (f->hd.flags & NGHTTP2_FLAG_END_STREAM)) {
    gstream *st = nghttp2_session_get_stream_user_data(ng, f->hd.stream_id);
    if (st != NULL && !st->complete)
      nghttp2_submit_rst_stream(ng, NGHTTP2_FLAG_NONE, f->hd.stream_id,
                                NGHTTP2_NO_ERROR);
  }
  return 0;
}
