/* fuzz_grpc.c - libFuzzer target for the daemon's gRPC front end: HTTP/2
 * (nghttp2) and the protobuf messages of inference.GRPCInferenceService
 * (server/grpc.c, server/grpc_service.c), and the HTTP request each call
 * becomes (server/conn.c, http.c, kserve.c), driven in memory with no
 * socket and no loop running.
 *
 * The first byte seeds the choices; the rest is the client's bytes (the
 * connection preface, then frames), fed in chunks of 1 to 256 bytes.
 * Between chunks the requests that wait for their run may be answered
 * (200, 429 or 504), or the deadlines may pass. One treelstm model is
 * served.
 *
 * Checked on the server's bytes: they are whole HTTP/2 frames, the first
 * a SETTINGS; every header block decodes (HPACK, in order); each response
 * has :status 200 and content-type application/grpc; every grpc-status
 * is a number in 0..16. After each input no request is left in flight
 * and no connection open. */
#include "fuzz_server.h"

#include <jansson.h>
#include <nghttp2/nghttp2.h>

static cn__server srv;
static cn__req **pending;
static int n_pending, cap_pending;

typedef struct out_state {
  unsigned char *b;
  size_t len, cap;
} out_state;

static void collect(void *ud, const char *d, size_t n) {
  out_state *o = ud;
  if (o->len + n > o->cap) {
    size_t cap = o->cap ? o->cap : 4096;
    while (cap < o->len + n) cap *= 2;
    o->b = realloc(o->b, cap);
    CHECK(o->b != NULL);
    o->cap = cap;
  }
  memcpy(o->b + o->len, d, n);
  o->len += n;
}

/* The server's bytes: whole frames, header blocks that decode in order. */
static void check_output(const out_state *o) {
  nghttp2_hd_inflater *inf;
  CHECK(nghttp2_hd_inflate_new(&inf) == 0);
  size_t off = 0;
  bool first = true;
  while (off < o->len) {
    CHECK(o->len - off >= 9);
    const unsigned char *h = o->b + off;
    size_t len = (size_t)h[0] << 16 | (size_t)h[1] << 8 | h[2];
    unsigned type = h[3], flags = h[4];
    CHECK(len <= 16384);
    CHECK(o->len - off - 9 >= len);
    if (first) CHECK(type == NGHTTP2_SETTINGS);
    first = false;
    if (type == NGHTTP2_HEADERS) {
      CHECK(flags & NGHTTP2_FLAG_END_HEADERS); /* no CONTINUATION sent */
      const unsigned char *p = h + 9;
      size_t left = len;
      if (flags & NGHTTP2_FLAG_PADDED) {
        CHECK(left >= 1 && p[0] < left);
        left -= 1 + p[0];
        p++;
      }
      if (flags & NGHTTP2_FLAG_PRIORITY) {
        CHECK(left >= 5);
        p += 5;
        left -= 5;
      }
      bool status = false, ctype = false, grpc_status = false;
      for (;;) {
        nghttp2_nv nv;
        int fl = 0;
        ssize_t r = nghttp2_hd_inflate_hd2(inf, &nv, &fl, p, left, 1);
        CHECK(r >= 0);
        p += r;
        left -= (size_t)r;
        if (fl & NGHTTP2_HD_INFLATE_EMIT) {
          if (nv.namelen == 7 && memcmp(nv.name, ":status", 7) == 0) {
            CHECK(nv.valuelen == 3 && memcmp(nv.value, "200", 3) == 0);
            status = true;
          }
          if (nv.namelen == 12 && memcmp(nv.name, "content-type", 12) == 0)
            ctype = nv.valuelen == 16 &&
                    memcmp(nv.value, "application/grpc", 16) == 0;
          if (nv.namelen == 11 && memcmp(nv.name, "grpc-status", 11) == 0) {
            char v[8] = "";
            CHECK(nv.valuelen >= 1 && nv.valuelen < sizeof(v));
            memcpy(v, nv.value, nv.valuelen);
            int code = atoi(v);
            CHECK(code >= 0 && code <= 16);
            grpc_status = true;
          }
        }
        if (fl & NGHTTP2_HD_INFLATE_FINAL) {
          nghttp2_hd_inflate_end_headers(inf);
          break;
        }
        if ((fl & NGHTTP2_HD_INFLATE_EMIT) == 0 && left == 0) break;
      }
      /* a response head, or trailers (which carry grpc-status) */
      CHECK((status && ctype) || grpc_status);
      if (flags & NGHTTP2_FLAG_END_STREAM) CHECK(grpc_status);
    }
    off += 9 + len;
  }
  nghttp2_hd_inflate_del(inf);
}

/* A request that would wait for its run: kept, answered between chunks. */
static void keep_waiting(cn__server *s, cn__req *r) {
  if (n_pending == cap_pending) {
    cap_pending = cap_pending ? cap_pending * 2 : 16;
    pending = realloc(pending, (size_t)cap_pending * sizeof(*pending));
    CHECK(pending != NULL);
  }
  atomic_fetch_add(&r->refs, 1);
  pending[n_pending++] = r;
}

static void answer_pending(unsigned how) {
  while (n_pending > 0) {
    cn__req *r = pending[--n_pending];
    static const int st[] = {200, 429, 504};
    int status = st[how % 3];
    how = how * 7 + 1;
    char *body = status == 200
                     ? strdup("{\"model_name\":\"treelstm\",\"outputs\":[]}")
                     : cn__error_body(status == 429 ? CN_E_OVERLOADED
                                                    : CN_E_TIMEOUT,
                                      "fuzz", -1);
    if (status == 200) {
      r->result = body;
      r->result_status = 200;
      cn__req_answer_result(r); /* no-op if answered */
    } else {
      cn__req_answer(r, status, body, NULL); /* no-op if answered */
    }
    cn__req_unref(r);
  }
}

static void setup(void) { fuzz_server_setup(&srv, keep_waiting); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (srv.models == NULL) setup();
  if (size == 0) return 0;
  unsigned x = data[0] * 2654435761u + 1;
  data++, size--;
  out_state out = {0};
  cn__grpc_conn *c = cn__grpc_new_mem(&srv, collect, &out);
  CHECK(c != NULL);
  size_t off = 0;
  while (off < size && !cn__grpc_closed(c)) {
    x = x * 1103515245u + 12345u;
    size_t k = 1 + (x >> 16) % 256;
    if (k > size - off) k = size - off;
    cn__grpc_feed(c, (const char *)data + off, k);
    off += k;
    switch ((x >> 8) % 16) {
      case 0: case 1: case 2: case 3:
        answer_pending(x >> 4);
        break;
      case 4:
        cn__grpc_tick(c, cn_now_s() + 1e6); /* every deadline passed */
        break;
      default:
        break;
    }
  }
  answer_pending(x >> 3);
  cn__grpc_tick(c, cn_now_s());
  check_output(&out);
  cn__grpc_free_mem(c); /* a request still waiting is 499 */
  answer_pending(0);
  free(out.b);
  CHECK(atomic_load(&srv.in_flight) == 0);
  CHECK(atomic_load(&srv.open_conns) == 0);
  return 0;
}
