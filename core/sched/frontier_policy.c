/* frontier_policy.c - which type the frontier batches next (ED-Batch
 * Alg. 1, line 3), per policy: agenda and lookahead over the frontier
 * (frontier.c), lookahead2 (frontier_lookahead2.c), a learned FSM (fsm.c), or the
 * heuristic an FSM lost to on its sample. Above all three, so none of them
 * calls back: what the static plans (sched.c), FSM training (fsm_train.c)
 * and a growing run (run/run_dynamic.c) call for the next batch.
 */
#include "sched/frontier_impl.h"

/* ED-Batch §5.3: the ready type maximising eq. 1's ratio; ties go to the
 * agenda's order (least average depth, then lowest type). */
static int next_sufficient(const cn_frontier *f) {
  int best = -1;
  double br = -1, bavg = 0;
  for (int t = 0; t < f->n_types; t++) {
    if (f->n_ready[t] == 0) continue;
    double r = cn__frontier_ratio(f, t);
    double avg = f->depth_sum[t] / (double)f->n_of_type[t];
    if (best < 0 || r > br + 1e-12 || (r > br - 1e-12 && avg < bavg)) {
      best = t;
      br = r;
      bavg = avg;
    }
  }
  return best;
}

bool cn__policy_needs_tails(cn_policy_kind policy, const struct cn_fsm *fsm) {
  if (policy == CN_POLICY_LOOKAHEAD || policy == CN_POLICY_LOOKAHEAD2 ||
      policy == CN_POLICY_PLAN)
    return true;
  return policy == CN_POLICY_FSM && fsm != NULL && cn__fsm_needs_tails(fsm);
}

int cn__frontier_next(const cn_frontier *f, cn_policy_kind policy,
                      const struct cn_fsm *fsm) {
  if (f->n_done == f->nv) return -1;
  switch (policy) {
    case CN_POLICY_SUFFICIENT:
      return f->track_sub ? next_sufficient(f) : cn__frontier_agenda(f);
    case CN_POLICY_LOOKAHEAD: return cn__frontier_next_lookahead(f);
    case CN_POLICY_LOOKAHEAD2:
    case CN_POLICY_PLAN: /* a graph that grows cannot be planned ahead */
      return cn__frontier_next_lookahead2(f);
    case CN_POLICY_FSM:
      if (fsm == NULL) return cn__frontier_agenda(f);
      /* A policy that lost to a heuristic on its sample runs that one. */
      if (cn__fsm_executes(fsm) == CN_POLICY_SUFFICIENT && f->track_sub)
        return next_sufficient(f);
      if (cn__fsm_executes(fsm) == CN_POLICY_LOOKAHEAD)
        return cn__frontier_next_lookahead(f);
      if (cn__fsm_executes(fsm) == CN_POLICY_LOOKAHEAD2)
        return cn__frontier_next_lookahead2(f);
      if (cn__fsm_executes(fsm) != CN_POLICY_FSM)
        return cn__frontier_agenda(f);
      return cn__fsm_choose(fsm, f);
    default: return cn__frontier_agenda(f);
  }
}
