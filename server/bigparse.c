/* bigparse.c - big infer bodies are parsed off the loop thread.
 *
 * jansson builds an 8 MiB body in ~1 s; on the loop thread that stalls
 * every connection. A body over CN__BIG_BODY_BYTES goes instead to one of
 * libuv's threadpool threads (uv_queue_work), CN__BIG_PARSES at a time
 * (one: the memory of parses in flight is then one parse's, bounded by
 * infer.c's container counts and max-body-bytes); the others wait here,
 * FIFO, on the loop. Bodies up to the threshold are parsed inline as
 * before (a one-tree request parses in microseconds; the hop to the pool
 * and back would cost it more than that).
 *
 * Meanwhile the request is WAITING and on s->waiting, like one queued
 * for a run: conn.c reads no more of its connection and cancels it (499)
 * if the client hangs up; drain waits for it, and past drain-grace-ms
 * answers it. The parse holds its own reference to the request, so a
 * request answered meanwhile lives until the parse is back; its result is
 * then thrown away. A request still waiting for a parse when the drain
 * begins gets 503 draining when its turn comes; one whose parse is under
 * way gets it from the batcher once the parse is back (serve.c waits for
 * both).
 *
 * The pool thread runs cn__infer_parse_into: jansson, then
 * cn_instance_parse for each instance, which reads the model (const
 * cn_model: vocabularies, lexicon tries, limits) and writes only the new
 * instance; none of core/input or core/model's parsers keeps static or
 * cached state. The model version is held by the request. jansson is
 * safe on separate values from several threads (its hash seed is set
 * once, atomically, long before: the config and models are JSON). */
#include <malloc.h>
#include <stdlib.h>

#include "serve_impl.h"

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
  r->prc = cn__infer_parse_into(r, &r->parsed, &r->perr);
  cn__req_body_free(r);
  /* jansson's tree of the body was built and freed in this pool thread's
   * malloc arena; the pool has four threads, so four arenas would each
   * keep a parse's worth of free memory (8 MiB of tokens: ~190 MB each,
   * VmHWM 740 MB where main, parsing on the loop's one arena, had 203).
   * Give it back now, on this thread, not the loop's. */
  malloc_trim(0);
}

static void pump(cn__server *s);

static void after_parse(uv_work_t *w, int status) {
  cn__req *r = w->data;
  cn__server *s = r->srv;
  s->parsing--;
  if (status != 0 && r->prc == 0) { /* never ran (uv_cancel: not used) */
    cn__parsed_free(&r->parsed);
    r->prc = cn_err_set(&r->perr, CN_E_INTERNAL, "the parse did not run");
  }
  if (r->state == CN__REQ_WAITING) {
    unlink_waiting(s, r);
    r->state = CN__REQ_RECEIVING;
    cn__http_parsed(r);
  } else {
    cn__parsed_free(&r->parsed); /* answered meanwhile */
  }
  cn__req_unref(r); /* the parse's reference */
  pump(s);
}

static void pump(cn__server *s) {
  while (s->parsing < CN__BIG_PARSES && s->phead != NULL) {
    cn__req *r = s->phead;
    s->phead = r->pnext;
    if (s->phead == NULL) s->ptail = NULL;
    r->pnext = NULL;
    if (r->state != CN__REQ_WAITING) { /* answered while it waited */
      cn__req_unref(r);
      continue;
    }
    if (atomic_load(&s->draining)) {
      cn__req_answer(r, 503,
                     cn__error_body(CN_E_DRAINING,
                                    "the server is shutting down", -1),
                     "draining");
      cn__req_unref(r);
      continue;
    }
    r->pwork.data = r;
    r->prc = 0;
    if (uv_queue_work(&s->loop, &r->pwork, do_parse, after_parse) != 0) {
      cn__req_answer(r, 500,
                     cn__error_body(CN_E_INTERNAL,
                                    "could not start the body's parse", -1),
                     "internal");
      cn__req_unref(r);
      continue;
    }
    s->parsing++;
  }
}

void cn__bigparse_submit(cn__req *r) {
  cn__server *s = r->srv;
  r->state = CN__REQ_WAITING;
  link_waiting(s, r);
  atomic_fetch_add(&r->refs, 1); /* the parse's, until after_parse */
  r->pnext = NULL;
  if (s->ptail) s->ptail->pnext = r;
  else s->phead = r;
  s->ptail = r;
  pump(s);
}
