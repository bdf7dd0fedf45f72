/* request.c - a request's life after its handler: the reference count
 * and the free, the body's bytes given back to max-body-memory, the
 * account (metrics and the log line, once), and the answer written on its
 * connection (conn.c), in /v1's error form or, for a v2 route, the Open
 * Inference Protocol's. Called by the handlers (http.c, repo.c,
 * bigparse.c) and the batching side (window.c, worker.c), never calling
 * them: it sits below both, above the connections.
 */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "request.h"
#include "routes.h"

#define DUMP_FLAGS (JSON_COMPACT | JSON_REAL_PRECISION(9))

char *cn__error_body(int code, const char *msg, int instance) {
  cn_err e;
  cn_err_clear(&e);
  cn_err_set(&e, code, "%s", msg);
  e.instance = instance;
  json_t *j = cn_err_to_json(&e);
  char *s = json_dumps(j, DUMP_FLAGS);
  json_decref(j);
  return s;
}

/* Frees the body and gives its bytes back to max-body-memory; any thread
 * (bigparse.c frees it on the pool thread that parsed it). */
void cn__req_body_free(cn__req *r) {
  if (r->body_cap > 0)
    atomic_fetch_sub(&r->srv->body_bytes, (long long)r->body_cap);
  free(r->body);
  r->body = NULL;
  r->body_len = r->body_cap = 0;
}

/* max-answer-memory counts the answers connections hold written and not
 * yet taken by their clients (conn.c, answer_held) and, for each request
 * admitted and not yet answered, the most its answer could take
 * (answer_reserved): its max-answer-bytes bound (infer.c) and the status
 * line and headers conn.c puts before it. The answer replaces its
 * reservation when it is written (account, then conn.c), so held and
 * reserved together never pass the bound, however many clients leave
 * their answers unread (without it, 60 connections that each left a
 * 41.8 MB answer unread held 968 MB until idle-timeout-s). */
#define ANSWER_HEAD_BYTES 1024

int cn__req_reserve_answer(cn__req *r, cn_err *e) {
  cn__server *s = r->srv;
  long long want = r->answer_bound + ANSWER_HEAD_BYTES;
  long long max = s->cfg.serve.max_answer_memory;
  long long held = atomic_load(&s->answer_held);
  long long res = atomic_load(&s->answer_reserved);
  if (held + res + want > max) {
    cn__metrics_answer_refused(&s->metrics);
    return cn_err_set(e, CN_E_ANSWER_MEMORY, "the server holds %lld bytes "
                      "of answers its clients have not read and %lld "
                      "reserved for requests in progress; this answer "
                      "could take %lld more, over max-answer-memory (%lld): "
                      "retry later", held, res, want, max);
  }
  atomic_fetch_add(&s->answer_reserved, want);
  r->answer_reserved = want;
  return 0;
}

/* The request is answered (or freed): its reservation goes back. */
static void release_answer(cn__req *r) {
  if (r->answer_reserved == 0) return;
  atomic_fetch_sub(&r->srv->answer_reserved, r->answer_reserved);
  r->answer_reserved = 0;
}

/* The pool's flag: held for a few instructions, by the loop, a pool
 * thread (bigparse.c) or a worker giving a reader back. */
static void readers_lock(cn__server *s) {
  int z = 0;
  while (!atomic_compare_exchange_weak(&s->readers_lock, &z, 1)) z = 0;
}

static void readers_unlock(cn__server *s) {
  atomic_store(&s->readers_lock, 0);
}

/* Why: a reader grows its tape, scratch and arena to what it reads; kept
 * between requests, a small request allocates nothing to be read. */
cn_line_reader *cn__reader_take(cn__server *s) {
  cn_line_reader *rd = NULL;
  readers_lock(s);
  if (s->n_readers > 0) rd = s->readers[--s->n_readers];
  readers_unlock(s);
  return rd != NULL ? rd : cn_line_reader_new();
}

void cn__reader_give(cn__server *s, cn_line_reader *rd, size_t body_bytes) {
  if (rd == NULL) return;
  if (body_bytes <= CN__READER_KEEP_BYTES) {
    cn_line_reader_reset(rd);
    readers_lock(s);
    if (s->n_readers < CN__READERS_KEPT) {
      s->readers[s->n_readers++] = rd;
      rd = NULL;
    }
    readers_unlock(s);
  }
  cn_line_reader_free(rd);
}

void cn__readers_free(cn__server *s) {
  for (int i = 0; i < s->n_readers; i++) cn_line_reader_free(s->readers[i]);
  s->n_readers = 0;
}

static void req_free(cn__req *r) {
  release_answer(r);
  for (int i = 0; i < r->n_inst; i++) cn_instance_free(r->inst[i]);
  cn__reader_give(r->srv, r->rd, r->rd_bytes);
  cn__model_release(r->me);
  free(r->inst);
  cn__req_body_free(r);
  free(r->result);
  free(r->v2_id);
  free(r);
}

void cn__req_unref(cn__req *r) {
  if (atomic_fetch_sub(&r->refs, 1) == 1) req_free(r);
}

void cn__handle_unref_cb(uv_handle_t *h) { cn__req_unref(h->data); }

/* The loop: /v1's {"error": {"code", "message", "instance"?, ...}} as
 * v2's {"error": message}, the message naming the INSTANCE element where
 * /v1 said it in a field of its own (takes body). */
static char *v2_error(char *body) {
  json_t *j = body ? json_loads(body, 0, NULL) : NULL;
  const json_t *err = json_object_get(j, "error");
  const char *msg = json_string_value(json_object_get(err, "message"));
  const json_t *inst = json_object_get(err, "instance");
  if (msg == NULL) {
    json_decref(j);
    return body;
  }
  bool named = strncmp(msg, "INSTANCE[", 9) == 0 ||
               (strncmp(msg, "instance ", 9) == 0 &&
                isdigit((unsigned char)msg[9]));
  json_t *o = json_object();
  if (json_is_integer(inst) && !named)
    json_object_set_new(o, "error", json_sprintf("INSTANCE[%lld]: %s",
                        (long long)json_integer_value(inst), msg));
  else
    json_object_set_new(o, "error", json_string(msg));
  char *b = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  json_decref(j);
  if (b == NULL) return body;
  free(body);
  return b;
}

/* Counts and logs a request once, when its status is decided. */
static void account(cn__req *r, int status, const char *reason) {
  cn__server *s = r->srv;
  double secs = cn_now_s() - r->t_arrive;
  int model = r->me ? r->me->index : r->slot ? r->slot->index : -1;
  release_answer(r); /* the answer, if any, is held from here (conn.c) */
  /* an inference (a POST to a model's version serving) is counted in its
   * model's statistics too; queue and compute as this request saw them,
   * -1 where it never reached a run. A wrong version or method named no
   * inference: only the request counters have it. */
  int proto = r->conn != NULL ? cn__conn_protocol(r->conn) : CN__PROTO_HTTP;
  if (status != 499 && r->route == CN__RT_INFER && r->me != NULL &&
      !r->version_bad && strcmp(r->method, "POST") == 0)
    cn__metrics_infer_request(&s->metrics, proto, model, status, r->n_inst,
                              secs,
                              r->queue_ms > 0 ? r->queue_ms / 1e3 : -1,
                              r->compute_ms > 0 ? r->compute_ms / 1e3 : -1);
  else if (status != 499)
    cn__metrics_request(&s->metrics, proto, model, status, r->n_inst, secs);
  CN_LOG(status >= 500 && status != 503 && status != 504 ? CN_LOG_ERROR
                                                         : CN_LOG_INFO,
         "msg=request id=%s method=%s path=\"%s\" model=%s version=%s "
         "status=%d instances=%d queue_ms=%.3f compute_ms=%.3f "
         "total_ms=%.3f%s%s%s",
         r->id, r->method, r->path,
         r->me ? r->me->name : r->slot ? r->slot->name : "-",
         r->me ? r->me->version : "-", status, r->n_inst, r->queue_ms,
         r->compute_ms, secs * 1e3, reason ? " reason=" : "",
         reason ? reason : "", proto == CN__PROTO_GRPC ? " protocol=grpc" : "");
}

/* Sends body (taking it over) on the request's connection (conn.c adds
 * the headers every answer carries). */
static void send_body(cn__req *r, int status, char *body, const char *ctype) {
  if (body == NULL) {
    status = 500;
    body = strdup("{\"error\":{\"code\":\"internal\",\"message\":\"out of "
                  "memory\"}}");
  }
  if (r->v2 && status >= 400) body = v2_error(body);
  const char *allow = NULL;
  if (status == 405)
    allow = strstr(r->path, "/infer") || strstr(r->path, "/repository")
                ? "Allow: POST\r\n"
                : "Allow: GET, HEAD\r\n";
  cn__conn_respond(r, status, body, body ? strlen(body) : 0, ctype, allow);
}

void cn__req_answer_now(cn__req *r, int status, char *body,
                        const char *ctype) {
  r->state = CN__REQ_ANSWERED;
  account(r, status, NULL);
  send_body(r, status, body, ctype ? ctype : "application/json");
}

/* r leaves the timeout list; the list's timer stops once it is empty (an
 * armed timer would keep a draining loop running). */
static void tmo_unlink(cn__server *s, cn__req *r) {
  if (!r->tmo_listed) return;
  r->tmo_listed = false;
  if (r->tprev) r->tprev->tnext = r->tnext;
  else s->tmo_head = r->tnext;
  if (r->tnext) r->tnext->tprev = r->tprev;
  else s->tmo_tail = r->tprev;
  r->tprev = r->tnext = NULL;
  if (s->tmo_head == NULL) uv_timer_stop(&s->tmo_timer);
}

/* A waiting request answered (state, its timeout, the waiting list, the
 * account); false, with body freed, when it was answered already. */
static bool answered(cn__req *r, int status, char *body, const char *reason) {
  cn__server *s = r->srv;
  if (r->state != CN__REQ_WAITING) {
    free(body);
    return false;
  }
  r->state = CN__REQ_ANSWERED;
  atomic_store(&r->cancelled, 1);
  r->status = status;
  r->reason = reason;
  if (r->tmo_open) {
    r->tmo_open = false;
    uv_close((uv_handle_t *)&r->tmo, cn__handle_unref_cb);
  }
  tmo_unlink(s, r);
  if (r->wprev) r->wprev->wnext = r->wnext;
  else s->waiting = r->wnext;
  if (r->wnext) r->wnext->wprev = r->wprev;
  r->wprev = r->wnext = NULL;
  account(r, status, reason);
  return true;
}

void cn__req_answer(cn__req *r, int status, char *body, const char *reason) {
  if (!answered(r, status, body, reason)) return;
  /* the answer goes out now, on this (the loop) thread; a client that
   * hung up (499) gets nothing */
  if (status == 499) cn__conn_respond(r, 499, body, 0, NULL, NULL);
  else send_body(r, status, body, "application/json");
}

void cn__req_answer_result(cn__req *r) {
  char *body = r->result;
  int status = r->result_status;
  r->result = NULL;
  if (body == NULL)
    cn__req_answer(r, 500, cn__error_body(CN_E_INTERNAL, "the run produced "
                                          "no result", -1), NULL);
  else if (status != 200 || r->result_len == 0)
    cn__req_answer(r, status, body, NULL);
  else if (answered(r, status, body, NULL))
    cn__conn_respond(r, status, body, r->result_len,
                     r->result_ctype ? r->result_ctype : "application/json",
                     r->result_head);
}
