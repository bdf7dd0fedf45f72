/* versions.c - a loaded version of a model (cn__model_entry) is reference
 * counted: its slot holds one reference while new requests get it, and
 * every request and run that uses it holds one (docs/daemon.md, reloads).
 * The last release frees it, its policy with it. Any thread. Below
 * everything that holds versions: the repository (repo.c) makes them,
 * requests, runs and the retrainer hold them.
 */
#include <stdlib.h>

#include "request.h"

/* The version's batching policy (learned_policy.c made it): its FSM and its
 * reservoir of run graphs. */
static void policy_free(cn__model_entry *me) {
  cn__policy *p = &me->pol;
  cn_fsm_free(p->fsm);
  p->fsm = NULL;
  cn_graph_set_free(p->reservoir);
  p->reservoir = NULL;
  pthread_mutex_destroy(&p->mu);
  pthread_mutex_destroy(&p->rmu);
}

cn__model_entry *cn__model_retain(cn__model_slot *sl) {
  if (sl == NULL) return NULL;
  pthread_mutex_lock(&sl->vmu);
  cn__model_entry *me = sl->cur;
  if (me != NULL) atomic_fetch_add(&me->refs, 1);
  pthread_mutex_unlock(&sl->vmu);
  return me;
}

void cn__model_release(cn__model_entry *me) {
  if (me == NULL || atomic_fetch_sub(&me->refs, 1) != 1) return;
  CN_LOG(CN_LOG_INFO, "msg=model-version-freed model=%s version=%s",
         me->name, me->version);
  json_decref(me->describe);
  policy_free(me);
  cn_model_free(me->model);
  if (me->slot != NULL) atomic_fetch_sub(&me->slot->entries, 1);
  free(me);
}
