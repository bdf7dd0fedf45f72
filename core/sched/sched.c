/* sched.c - which vertices run together: the batching policies.
 *
 * Every policy turns a typed DAG into a sequence of batches, each of a
 * single vertex type whose inputs were all computed by earlier batches.
 *   none   - every vertex alone, instance after instance, in the order the
 *            family built them (a topological order): the unbatched
 *            reference every batched path is checked against.
 *   depth  - TensorFlow Fold (Looks et al. 2017): vertices of one type at one
 *            topological depth (inputs have depth 0) form a batch, depths in
 *            increasing order (ED-Batch §1, Fig. 1b).
 *   agenda - DyNet (Neubig et al. 2017): among the types with ready
 *            vertices, batch the one of least average topological depth over
 *            the whole graph; the batch is every ready vertex of that type
 *            (ED-Batch §1, Fig. 1c; ED-Batch Alg. 1 with the agenda
 *            heuristic in line 3).
 *   sufficient - ED-Batch §5.3: Alg. 1 with the ready type maximising the
 *            ratio of eq. 1 (Lemma 1's sufficient condition) in line 3.
 *   lookahead - Alg. 1 with, in line 3, the ready type whose batch lowers
 *            the lower bound Σ_t depth_t of what is left the most (ties: the
 *            smaller batch, then agenda). Needs the graph's future, so it
 *            sees more than the frontier: each vertex's "tail", the most
 *            type-t vertices on a path from it to a sink (frontier.c). It
 *            is the one-step greedy form of the exact search (dag_optimum.c).
 *   lookahead2 - lookahead two batches deep (the best second type after
 *            each first), ties to the instances furthest behind by their own
 *            bounds (Σ_c B_c³): the greedy form of the beam search
 *            (dag_beam.c). For a type worth nothing until its consumers
 *            follow (a lattice's word, then link). Reads tails too.
 *   plan   - not a frontier policy: before the run, a beam search over the
 *            whole run graph (dag_beam.c, cn_run_set_plan_width), kept
 *            where it beats lookahead2's schedule. It pays only where a
 *            batch costs more than the search (README); lstm-nmt's growing
 *            graph gets lookahead2.
 *   fsm    - ED-Batch §2: Alg. 1 with a learned FSM in line 3 (fsm.c).
 * agenda, sufficient and fsm only look at the frontier (frontier.c), so a
 * dynamic executor can drive them one step at a time.
 * The lower bound Σ_t depth_t is docs/models.md "Batching granularity".
 */
#include <stdlib.h>
#include <string.h>

#include "sched/fsm_impl.h"

/* The plan being written: order and batches may be NULL (count only). */
typedef struct plan {
  int32_t *order;
  cn_run_batch *batches;
  int32_t n;
} plan;

static void push_batch(plan *p, int type, int32_t start, int32_t n) {
  if (p->batches != NULL) {
    cn_run_batch *b = &p->batches[p->n];
    b->type = type;
    b->start = start;
    b->n = n;
  }
  p->n++;
}

static void plan_none(const cn_dag *g, plan *p) {
  for (int32_t v = 0; v < g->nv; v++) {
    if (p->order) p->order[v] = v;
    push_batch(p, g->vtype[v], v, 1);
  }
}

/* Counting sort by (depth, type); each key is one batch. Depth: 0 without
 * inputs, else one more than the deepest input. */
static int plan_depth(const cn_dag *g, plan *p) {
  int T = g->n_types, rc = CN_E_NOMEM;
  int32_t *depth = malloc(((size_t)g->nv + 1) * sizeof(int32_t));
  int32_t *start = NULL;
  if (depth == NULL) goto out;
  int32_t maxd = 0;
  for (int32_t v = 0; v < g->nv; v++) {
    int32_t d = -1;
    for (int32_t i = g->in_start[v]; i < g->in_start[v + 1]; i++)
      if (depth[g->in_edges[i]] > d) d = depth[g->in_edges[i]];
    depth[v] = d + 1;
    if (depth[v] > maxd) maxd = depth[v];
  }
  size_t nkeys = (size_t)(maxd + 1) * (size_t)T;
  start = cn__xcalloc(nkeys + 1, sizeof(int32_t));
  if (start == NULL) goto out;
  for (int32_t v = 0; v < g->nv; v++)
    start[(size_t)depth[v] * T + g->vtype[v] + 1]++;
  for (size_t k = 0; k < nkeys; k++) start[k + 1] += start[k];
  for (int32_t v = 0; v < g->nv; v++) {
    int32_t at = start[(size_t)depth[v] * T + g->vtype[v]]++;
    if (p->order) p->order[at] = v;
  }
  /* start[k] now holds the end of key k. */
  int32_t s = 0;
  for (size_t k = 0; k < nkeys; k++) {
    if (start[k] > s) push_batch(p, (int)(k % (size_t)T), s, start[k] - s);
    s = start[k];
  }
  rc = 0;
out:
  free(depth);
  free(start);
  return rc;
}

/* ED-Batch Alg. 1 over the frontier with a frontier policy; with seq, the
 * types come from seq instead (a schedule planned ahead, every step of which
 * runs something). */
static int plan_frontier(const cn_dag *g, cn_policy_kind policy,
                         const cn_fsm *fsm, const uint8_t *seq, plan *p) {
  cn_frontier f;
  int rc = cn__frontier_init(&f, g->n_types, policy == CN_POLICY_SUFFICIENT);
  int32_t *tmp = p->order ? NULL : malloc(((size_t)g->nv + 1) * 4);
  if (rc == 0 && p->order == NULL && tmp == NULL) rc = CN_E_NOMEM;
  f.borrow = true; /* g outlives f, and nothing is added */
  if (rc == 0) rc = cn__frontier_add_dag(&f, g);
  f.complete = true;
  if (rc == 0 && seq == NULL && cn__policy_needs_tails(policy, fsm))
    rc = cn__frontier_tails(&f);
  int32_t placed = 0;
  while (rc == 0 && placed < g->nv) {
    int t = seq != NULL ? seq[p->n] : cn__frontier_next(&f, policy, fsm);
    if (t < 0) { /* cannot happen in a DAG */
      rc = CN_E_INTERNAL;
      break;
    }
    int32_t n = cn__frontier_commit(&f, t, p->order ? p->order + placed : tmp);
    if (n <= 0) {
      rc = n < 0 ? n : CN_E_INTERNAL;
      break;
    }
    push_batch(p, t, placed, n);
    placed += n;
  }
  free(tmp);
  cn__frontier_free(&f);
  return rc;
}

/* plan: lookahead2's schedule, then the beam search's (dag_beam.c) where
 * it launches fewer batches; so never more batches than lookahead2, and
 * the beam is skipped where lookahead2 already meets the lower bound. */
static int plan_beam(const cn_dag *g, int width, plan *p) {
  int rc = plan_frontier(g, CN_POLICY_LOOKAHEAD2, NULL, NULL, p);
  if (rc != 0 || p->n <= cn__dag_lower_bound(g)) return rc;
  int64_t nb;
  uint8_t *seq = NULL;
  rc = cn__dag_beam(g, width, &nb, &seq);
  if (rc == 0 && nb < p->n) {
    p->n = 0;
    rc = plan_frontier(g, CN_POLICY_PLAN, NULL, seq, p);
    if (rc == 0 && p->n != nb) rc = CN_E_INTERNAL;
  }
  free(seq);
  return rc;
}

int cn__sched_dag(const cn_dag *g, cn_policy_kind policy, const cn_fsm *fsm,
                  int plan_width, int32_t *order, cn_run_batch *batches,
                  int32_t *n_batches) {
  plan p = {order, batches, 0};
  int rc;
  /* A learned policy that lost to a heuristic on its training sample
   * executes that heuristic (fsm.c). */
  if (policy == CN_POLICY_FSM && fsm != NULL &&
      cn__fsm_executes(fsm) != CN_POLICY_FSM)
    policy = cn__fsm_executes(fsm);
  switch (policy) {
    case CN_POLICY_NONE: plan_none(g, &p); rc = 0; break;
    case CN_POLICY_DEPTH: rc = plan_depth(g, &p); break;
    case CN_POLICY_AGENDA:
    case CN_POLICY_SUFFICIENT:
    case CN_POLICY_LOOKAHEAD:
    case CN_POLICY_LOOKAHEAD2:
    case CN_POLICY_FSM: rc = plan_frontier(g, policy, fsm, NULL, &p); break;
    case CN_POLICY_PLAN: rc = plan_beam(g, plan_width, &p); break;
    default: rc = CN_E_INTERNAL; break;
  }
  *n_batches = p.n;
  return rc;
}
