/* job_queue.c - the two queues between the loop and the workers: closed runs
 * go to the workers (cn__jobs_push, a FIFO under qmu, a worker woken), and
 * finished ones come back (cn__jobs_done, a stack under dmu, the loop
 * woken through done_async). Below window.c, which fills the first, and
 * the workers and decode sessions, which take from it and fill the second.
 * The queue, its counts and the busy workers are read and written here
 * only.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

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
  pthread_mutex_unlock(&s->qmu);
  /* signalled after the unlock: a worker woken while the loop still held
   * qmu would block on it at once, and the unlock would wake it a second
   * time (two futex wakes a run, each preempting the loop) */
  pthread_cond_signal(&s->qcv);
}

void cn__jobs_done(cn__server *s, cn__job *j) {
  pthread_mutex_lock(&s->dmu);
  j->next = s->dhead;
  s->dhead = j;
  pthread_mutex_unlock(&s->dmu);
  uv_async_send(&s->done_async);
}

int cn__jobs_queued(cn__server *s) {
  pthread_mutex_lock(&s->qmu);
  int n = s->queued_jobs;
  pthread_mutex_unlock(&s->qmu);
  return n;
}

int cn__jobs_idle_workers(cn__server *s) {
  pthread_mutex_lock(&s->qmu);
  int idle = s->n_threads - s->busy_workers - s->queued_jobs;
  pthread_mutex_unlock(&s->qmu);
  return idle;
}

bool cn__jobs_idle(cn__server *s) {
  pthread_mutex_lock(&s->qmu);
  bool idle = s->qhead == NULL && s->busy_workers == 0;
  pthread_mutex_unlock(&s->qmu);
  return idle;
}

/* Under qmu: the head of the queue, taken. */
static cn__job *pop(cn__server *s) {
  cn__job *j = s->qhead;
  s->qhead = j->next;
  if (s->qhead == NULL) s->qtail = NULL;
  s->queued_jobs--;
  j->next = NULL;
  return j;
}

/* Why: a worker's wait has four ends (a run, a warm-up part, a quiet
 * second, the stop) that all depend on the queue's state under its lock;
 * deciding them here keeps the queue's fields inside this file. */
cn__take cn__jobs_take(cn__server *s, int worker, cn__wait wait, cn__job **j,
                       cn__warmup **wu) {
  cn__take t;
  *j = NULL;
  *wu = NULL;
  pthread_mutex_lock(&s->qmu);
  if (wait == CN__WAIT_NONE && s->qhead == NULL) {
    t = CN__TAKE_EMPTY;
    goto out;
  }
  while (s->qhead == NULL && !s->stopping &&
         (*wu = cn__warmup_next(s, worker)) == NULL) {
    if (wait == CN__WAIT_FOREVER) {
      pthread_cond_wait(&s->qcv, &s->qmu);
      continue;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 1;
    if (pthread_cond_timedwait(&s->qcv, &s->qmu, &ts) == ETIMEDOUT &&
        s->qhead == NULL && !s->stopping) {
      t = CN__TAKE_IDLE;
      goto out;
    }
  }
  /* a version's warm-up goes before queued runs: its loader waits */
  if (*wu != NULL || (*wu = cn__warmup_next(s, worker)) != NULL) {
    t = CN__TAKE_WARMUP;
    goto out;
  }
  if (s->qhead == NULL) { /* stopping and nothing left */
    cn__warmup_abandon(s, worker);
    t = CN__TAKE_STOP;
    goto out;
  }
  *j = pop(s);
  s->busy_workers++;
  t = CN__TAKE_JOB;
out:
  pthread_mutex_unlock(&s->qmu);
  return t;
}

void cn__jobs_over(cn__server *s, cn__job *j) {
  pthread_mutex_lock(&s->qmu);
  s->busy_workers--;
  pthread_mutex_unlock(&s->qmu);
  cn__jobs_done(s, j);
}

cn__job *cn__jobs_take_joins(cn__server *s, const cn__model_entry *me,
                             int *inst, size_t *verts, int max_inst,
                             size_t max_verts, bool *foreign) {
  cn__job *got = NULL, **tail = &got;
  *foreign = false;
  pthread_mutex_lock(&s->qmu);
  while (s->qhead != NULL) {
    cn__job *j = s->qhead;
    if (j->me != me) {
      *foreign = true;
      break;
    }
    if (*inst + j->instances > max_inst || *verts + j->vertices > max_verts)
      break; /* it waits for room; the ones behind it wait behind it */
    *tail = pop(s);
    tail = &j->next;
    *inst += j->instances;
    *verts += j->vertices;
  }
  pthread_mutex_unlock(&s->qmu);
  return got;
}

void cn__jobs_stop(cn__server *s) {
  pthread_mutex_lock(&s->qmu);
  s->stopping = true;
  pthread_cond_broadcast(&s->qcv);
  pthread_mutex_unlock(&s->qmu);
}
