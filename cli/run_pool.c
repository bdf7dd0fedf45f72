/* run_pool.c - the ordered pool behind `canopy run --jobs N` (run_pool.h).
 *
 * A ring of `depth` slots, in submission order: [head, head + pending) are
 * the items between submit and take, of which [head, next) have been
 * picked up by a thread. Threads pick the oldest item nobody has picked;
 * take() waits on the oldest one only, so output order is submission
 * order whatever order the work finishes in. One mutex and two condition
 * variables: items to pick (work_cv), an item finished (done_cv).
 *
 * With two halves (fn, then finish), a thread holds one started item and
 * marks it done only after starting the next one (or finding none).
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

#include "run_pool.h"

struct cn__pool {
  /* set once by cn__pool_new */
  cn__pool_fn fn, finish;
  void *ctx;
  int depth, n_threads;
  pthread_t *threads;
  /* under mu */
  pthread_mutex_t mu;
  pthread_cond_t work_cv, done_cv;
  void **item;
  bool *done;
  int head, pending, picked; /* picked: of pending, how many were taken up */
  bool stopping;
  int held_slot; /* without threads: the started item (-1: none)      */
};

typedef struct pool_thread {
  cn__pool *p;
  int index;
} pool_thread;

/* Under mu: the held item of slot `held` finished (its second half runs
 * unlocked); wakes take(). */
static void finish_held(cn__pool *p, int index, int held) {
  void *item = p->item[held];
  pthread_mutex_unlock(&p->mu);
  p->finish(p->ctx, index, item);
  pthread_mutex_lock(&p->mu);
  p->done[held] = true;
  pthread_cond_broadcast(&p->done_cv);
}

static void *pool_main(void *arg) {
  pool_thread *t = arg;
  cn__pool *p = t->p;
  int index = t->index, held = -1;
  free(t);
  pthread_mutex_lock(&p->mu);
  for (;;) {
    while (p->picked == p->pending && !p->stopping && held < 0)
      pthread_cond_wait(&p->work_cv, &p->mu);
    if (p->picked == p->pending) {
      if (held < 0) break; /* stopping, nothing left */
      finish_held(p, index, held); /* nothing to overlap it with */
      held = -1;
      continue;
    }
    int slot = (p->head + p->picked) % p->depth;
    p->picked++;
    void *item = p->item[slot];
    pthread_mutex_unlock(&p->mu);
    p->fn(p->ctx, index, item);
    pthread_mutex_lock(&p->mu);
    if (p->finish == NULL) {
      p->done[slot] = true;
      pthread_cond_broadcast(&p->done_cv);
      continue;
    }
    if (held >= 0) finish_held(p, index, held);
    held = slot;
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

cn__pool *cn__pool_new(int threads, int depth, cn__pool_fn fn,
                       cn__pool_fn finish, void *ctx) {
  cn__pool *p = calloc(1, sizeof(*p));
  if (p == NULL) return NULL;
  p->fn = fn;
  p->finish = finish;
  p->held_slot = -1;
  p->ctx = ctx;
  p->depth = depth < 1 ? 1 : depth;
  p->item = calloc((size_t)p->depth, sizeof(void *));
  p->done = calloc((size_t)p->depth, sizeof(bool));
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->work_cv, NULL);
  pthread_cond_init(&p->done_cv, NULL);
  if (p->item == NULL || p->done == NULL) goto fail;
  if (threads <= 1) return p;
  p->threads = calloc((size_t)threads, sizeof(pthread_t));
  if (p->threads == NULL) goto fail;
  for (int i = 0; i < threads; i++) {
    pool_thread *t = malloc(sizeof(*t));
    if (t == NULL) goto fail;
    t->p = p;
    t->index = i;
    if (pthread_create(&p->threads[i], NULL, pool_main, t) != 0) {
      free(t);
      goto fail;
    }
    p->n_threads++;
  }
  return p;
fail:
  cn__pool_free(p);
  return NULL;
}

int cn__pool_pending(const cn__pool *p) {
  pthread_mutex_lock((pthread_mutex_t *)&p->mu);
  int n = p->pending;
  pthread_mutex_unlock((pthread_mutex_t *)&p->mu);
  return n;
}

int cn__pool_submit(cn__pool *p, void *item) {
  pthread_mutex_lock(&p->mu);
  if (p->pending == p->depth) {
    pthread_mutex_unlock(&p->mu);
    return -1;
  }
  int slot = (p->head + p->pending) % p->depth;
  p->item[slot] = item;
  p->done[slot] = false;
  p->pending++;
  if (p->n_threads == 0) { /* no thread: the work is done here, now */
    p->picked++;
    pthread_mutex_unlock(&p->mu);
    p->fn(p->ctx, 0, item);
    pthread_mutex_lock(&p->mu);
    if (p->finish == NULL) {
      p->done[slot] = true;
    } else {
      if (p->held_slot >= 0) finish_held(p, 0, p->held_slot);
      p->held_slot = slot;
    }
  } else {
    pthread_cond_signal(&p->work_cv);
  }
  pthread_mutex_unlock(&p->mu);
  return 0;
}

void *cn__pool_take(cn__pool *p) {
  pthread_mutex_lock(&p->mu);
  if (p->pending == 0) {
    pthread_mutex_unlock(&p->mu);
    return NULL;
  }
  if (p->n_threads == 0 && p->held_slot == p->head) { /* no next to wait */
    finish_held(p, 0, p->held_slot);
    p->held_slot = -1;
  }
  while (!p->done[p->head]) pthread_cond_wait(&p->done_cv, &p->mu);
  void *item = p->item[p->head];
  p->head = (p->head + 1) % p->depth;
  p->pending--;
  p->picked--;
  pthread_mutex_unlock(&p->mu);
  return item;
}

void cn__pool_free(cn__pool *p) {
  if (p == NULL) return;
  pthread_mutex_lock(&p->mu);
  if (p->n_threads == 0 && p->held_slot >= 0) { /* not taken back */
    finish_held(p, 0, p->held_slot);
    p->held_slot = -1;
  }
  p->stopping = true;
  pthread_cond_broadcast(&p->work_cv);
  pthread_mutex_unlock(&p->mu);
  for (int i = 0; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
  pthread_cond_destroy(&p->work_cv);
  pthread_cond_destroy(&p->done_cv);
  pthread_mutex_destroy(&p->mu);
  free(p->threads);
  free(p->item);
  free(p->done);
  free(p);
}
