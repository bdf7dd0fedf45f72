/* job_queue.c - the two queues between the loop and the workers: closed runs
 * go to the workers (cn__jobs_push, a FIFO under qmu, a worker woken), and
 * finished ones come back (cn__jobs_done, a stack under dmu, the loop
 * woken through done_async). Below the batcher, which fills the first, and
 * the workers and decode sessions, which take from it and fill the second.
 */
#include <pthread.h>
#include <stdlib.h>

#include "work.h"

void cn__job_free(cn__job *j) {
  for (int i = 0; i < j->n; i++) cn__req_unref(j->reqs[i]);
  cn__model_release(j->me);
  free(j->reqs);
  free(j);
}

void cn__jobs_push(cn__server *s, cn__job *j) {
  pthread_mutex_lock(&s->qmu);
  j->next = NULL;
  if (s->qtail) s->qtail->next = j;
  else s->qhead = j;
  s->qtail = j;
  s->queued_jobs++;
  pthread_cond_signal(&s->qcv);
  pthread_mutex_unlock(&s->qmu);
}

void cn__jobs_done(cn__server *s, cn__job *j) {
  pthread_mutex_lock(&s->dmu);
  j->next = s->dhead;
  s->dhead = j;
  pthread_mutex_unlock(&s->dmu);
  uv_async_send(&s->done_async);
}
