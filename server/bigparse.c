/* bigparse.c - bodies over 16 KiB are parsed off the loop thread.
 *
 * jansson builds an 8 MiB body in ~1 s; on the loop thread that stalls
 * every connection. A body over CN__BIG_BODY_BYTES (16 KiB) goes instead
 * to one of libuv's threadpool threads (uv_queue_work), in one of two
 * lanes, each a FIFO waiting here on the loop:
 * - medium bodies, up to CN__MEDIUM_BODY_BYTES (1 MiB), CN__MEDIUM_PARSES
 *   (3) at a time: a batch of a few hundred real trees never waits behind
 *   a hostile 8 MiB parse. Their parses' memory is bounded by 3 x a 1 MiB
 *   parse (~25x the body at worst, all of it strings: ~75 MB; containers
 *   are bounded by bodyscan's counts).
 * - huge bodies, over 1 MiB, CN__BIG_PARSES (one) at a time: the memory of
 *   huge parses in flight is one parse's, bounded by infer.c's container
 *   counts and max-body-bytes.
 * The two lanes together use at most 4 threads, libuv's pool size (unless
 * UV_THREADPOOL_SIZE says less), so a medium parse never queues inside
 * libuv behind a huge one.
 * Bodies up to 16 KiB are parsed inline: a one-tree request parses in
 * microseconds (the hop to the pool and back, ~57 us, would cost it more
 * than that), and 16 KiB is ~64 real trees; the most an inline parse
 * holds the loop is ~0.6 ms (16 KiB of `{}` under an ignored key, ~40 ns
 * a byte on this 2-core machine under load; 64 KiB held it 3-7 ms).
 * A compressed body (Content-Encoding) comes here whatever its size, as
 * it may inflate a thousandfold, and is in the huge lane unless even
 * deflate's largest ratio (1,032 to 1) keeps it within the medium one's
 * 1 MiB: its inflated bytes are held only during its parse, so the
 * memory of compressed bodies inflated at once is bounded by the lanes.
 *
 * Meanwhile the request is WAITING and on s->waiting, like one queued
 * for a run: conn.c reads no more of its connection and cancels it (499)
 * if the client hangs up; drain waits for it, and past drain-grace-ms
 * answers it. The parse holds its own reference to the request, so a
 * request answered meanwhile lives until the parse is back; its result is
 * then thrown away. A request still waiting for a parse when the drain
 * begins gets 503 draining when its turn comes; one whose parse is under
 * way gets it from window.c once the parse is back (serve.c waits for
 * both).
 *
 * The pool thread runs cn__infer_parse_into: jansson, then
 * cn_instance_parse for each instance, which reads the model (const
 * cn_model: vocabularies, lexicon tries, limits) and writes only the new
 * instance; none of core/input or core/model's parsers keeps static or
 * cached state. The model version is held by the request. jansson is
 * safe on separate values from several threads (its hash seed is set
 * once, atomically, long before: the config and models are JSON). */
#include <stdlib.h>

#include "encoding.h"
#include "handlers.h"

static void link_waiting(cn__server *s, cn__req *r) {
  r->wnext = s->waiting;
  r->wprev = NULL;
  if (s->waiting) s->waiting->wprev = r;
  s->waiting = r;
}

static void unlink_waiting(cn__server *s, cn__req *r) {
  if (r->wprev) r->wprev->wnext = r->wnext;
  else s->waiting = r->wnext;
  if (r->wnext) r->wnext->wprev = r->wprev;
  r->wprev = r->wnext = NULL;
}

/* The pool thread: nothing else touches r's body, parsed, perr or prc
 * until after_parse. */
static void do_parse(uv_work_t *w) {
  cn__req *r = w->data;
  cn_err_clear(&r->perr);
  double t0 = cn_thread_cpu_s();
  r->prc = cn__infer_parse_into(r, &r->parsed, &r->perr);
  cn__metrics_stage(&r->srv->metrics, r->me->index, CN__STAGE_PARSE,
                    cn_thread_cpu_s() - t0, false);
  cn__req_body_free(r);
  /* jansson's tree of the body was built and freed in this pool thread's
   * malloc arena; the pool has four threads, so four arenas would each
   * keep a parse's worth of free memory (8 MiB of tokens: ~190 MB each,
   * VmHWM 740 MB where main, parsing on the loop's one arena, had 203).
   * Give it back now, on this thread, not the loop's. A medium parse's
   * free memory waits for the idle trim (serve.c): malloc_trim walks and
   * locks every arena, a cost a 20 KiB body should not pay. */
  if (r->pbig) cn__malloc_trim();
}

static void pump(cn__server *s);

static void after_parse(uv_work_t *w, int status) {
  cn__req *r = w->data;
  cn__server *s = r->srv;
  s->parsing--;
  if (r->pbig) s->parsing_big--;
  if (status != 0 && r->prc == 0) { /* never ran (uv_cancel: not used) */
    cn__parsed_free(&r->parsed, r->srv);
    r->prc = cn_err_set(&r->perr, CN_E_INTERNAL, "the parse did not run");
  }
  if (r->state == CN__REQ_WAITING) {
    unlink_waiting(s, r);
    r->state = CN__REQ_RECEIVING;
    r->parsed_cb(r);
  } else {
    cn__parsed_free(&r->parsed, r->srv); /* answered meanwhile */
  }
  cn__req_unref(r); /* the parse's reference */
  pump(s);
}

/* Takes the head of a lane's FIFO. */
static cn__req *pop(cn__req **head, cn__req **tail) {
  cn__req *r = *head;
  *head = r->pnext;
  if (*head == NULL) *tail = NULL;
  r->pnext = NULL;
  return r;
}

/* Starts r's parse on the pool, or answers it; 1 if it started. */
static int start(cn__server *s, cn__req *r) {
  if (r->state != CN__REQ_WAITING) { /* answered while it waited */
    cn__req_unref(r);
    return 0;
  }
  if (atomic_load(&s->draining)) {
    cn__req_answer(r, 503,
                   cn__error_body(CN_E_DRAINING,
                                  "the server is shutting down", -1),
                   "draining");
    cn__req_unref(r);
    return 0;
  }
  r->pwork.data = r;
  r->prc = 0;
  if (uv_queue_work(&s->loop, &r->pwork, do_parse, after_parse) != 0) {
    cn__req_answer(r, 500,
                   cn__error_body(CN_E_INTERNAL,
                                  "could not start the body's parse", -1),
                   "internal");
    cn__req_unref(r);
    return 0;
  }
  s->parsing++;
  if (r->pbig) s->parsing_big++;
  return 1;
}

static void pump(cn__server *s) {
  while (s->parsing - s->parsing_big < CN__MEDIUM_PARSES && s->mhead != NULL)
    start(s, pop(&s->mhead, &s->mtail));
  while (s->parsing_big < CN__BIG_PARSES && s->phead != NULL)
    start(s, pop(&s->phead, &s->ptail));
}

void cn__bigparse_submit(cn__req *r, void (*parsed)(cn__req *r)) {
  r->parsed_cb = parsed;
  cn__server *s = r->srv;
  r->state = CN__REQ_WAITING;
  link_waiting(s, r);
  atomic_fetch_add(&r->refs, 1); /* the parse's, until after_parse */
  r->pnext = NULL;
  /* a compressed body by the most it can inflate to (deflate's limit,
   * 1,032 to 1), so the medium lane's bound holds for it too */
  r->pbig = r->body_len > (r->body_enc != CN__ENC_NONE
                               ? CN__MEDIUM_BODY_BYTES / 1032
                               : CN__MEDIUM_BODY_BYTES);
  cn__req **head = r->pbig ? &s->phead : &s->mhead;
  cn__req **tail = r->pbig ? &s->ptail : &s->mtail;
  if (*tail) (*tail)->pnext = r;
  else *head = r;
  *tail = r;
  pump(s);
}
