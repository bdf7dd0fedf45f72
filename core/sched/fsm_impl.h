/* fsm_impl.h - the learned policy object, shared by fsm.c (learning,
 * choosing) and policy_cache.c (files). Not seen outside core/. */
#ifndef CANOPY_FSM_IMPL_H
#define CANOPY_FSM_IMPL_H

#include <stdatomic.h>

#include "sched/sched_api.h"

/* The Q table: open addressing on the state key (0 = empty slot; a
 * non-empty frontier never encodes to 0). seen[i] has bit a set once
 * Q(state, a) was updated; only those actions are ever chosen greedily. */
typedef struct cn_qtab {
  int n_types;
  uint32_t cap, n;       /* cap is a power of two, n used slots          */
  uint32_t *keys;
  uint8_t *seen;
  double *q;             /* cap × n_types                                */
} cn_qtab;

int cn__qtab_init(cn_qtab *t, int n_types, uint32_t cap);
void cn__qtab_free(cn_qtab *t);
int cn__qtab_copy(cn_qtab *dst, const cn_qtab *src);
/* Slot of key, or -1 (find); inserted if absent (get; -1: no memory). */
int64_t cn__qtab_find(const cn_qtab *t, uint32_t key);
int64_t cn__qtab_get(cn_qtab *t, uint32_t key);

/* Counts on the training sample, kept with the policy for describe(). */
typedef struct cn_fsm_stats {
  long long fsm, agenda, depth, sufficient, lookahead, lookahead2,
      lower_bound;
  int graphs;
  long long vertices;
  int iterations;        /* episodes run                                 */
  int best_iteration;    /* episodes before the kept table's evaluation  */
  int distilled;         /* 1: the table started from distill(), not Q    */
  double seconds;
} cn_fsm_stats;

struct cn_fsm {
  atomic_int refs;
  char family[64];
  int n_types;
  char type_names[CN_MAX_TYPES][32];
  cn_fsm_encoding enc;
  cn_policy_kind executes; /* CN_POLICY_FSM, or the fallback that won     */
  uint64_t key;            /* cn__fsm_model_key at training time          */
  cn_qtab tab;
  cn_fsm_stats st;
};

cn_fsm *cn__fsm_new(int n_types, cn_fsm_encoding enc);
uint64_t cn__fsm_key(const cn_fsm *p);

/* policy_cache.c: the key of (model family, vertex types, weights file
 * bytes, encoding) a policy is valid for. */
uint64_t cn__fsm_model_key(const cn_model *m, cn_fsm_encoding enc);

/* graph_set.c: graph i of the set as a DAG view, and its lower bound. */
void cn__graph_set_get(const cn_graph_set *s, int i, cn_dag *g, int64_t *lb);

#endif
