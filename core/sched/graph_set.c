/* graph_set.c - bounded sets of run graphs: the FSM's training sample and
 * the online reservoir of recent traffic.
 *
 * A graph is a compact, immutable copy of a run's typed DAG (vertex types
 * and input edges; no instances, no tensors) in one allocation, with its
 * lower bound computed once. Graphs are reference counted so a snapshot of
 * a reservoir shares them: the daemon takes a snapshot under its lock and
 * trains from it in the background while workers keep adding. The set is a
 * ring: when full, a new graph replaces the oldest.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "sched/fsm_impl.h"

typedef struct cn_cgraph {
  atomic_int refs;
  int32_t nv, ne;
  int64_t lower_bound;
  int32_t *in_start; /* nv + 1 */
  int32_t *in_edges; /* ne */
  uint8_t *vtype;    /* nv */
} cn_cgraph;

struct cn_graph_set {
  int n_types;
  int cap, n, next; /* next: the slot the next graph goes to */
  cn_cgraph **g;
};

static void cgraph_release(cn_cgraph *c) {
  if (c != NULL && atomic_fetch_sub(&c->refs, 1) == 1) free(c);
}

cn_graph_set *cn_graph_set_new(int n_types, int capacity) {
  if (n_types < 1 || n_types > CN_MAX_TYPES || capacity < 1) return NULL;
  cn_graph_set *s = calloc(1, sizeof(*s));
  if (s == NULL) return NULL;
  s->g = calloc((size_t)capacity, sizeof(*s->g));
  if (s->g == NULL) {
    free(s);
    return NULL;
  }
  s->n_types = n_types;
  s->cap = capacity;
  return s;
}

void cn_graph_set_free(cn_graph_set *s) {
  if (s == NULL) return;
  for (int i = 0; i < s->n; i++) cgraph_release(s->g[i]);
  free(s->g);
  free(s);
}

int cn_graph_set_count(const cn_graph_set *s) { return s->n; }
int cn__graph_set_n_types(const cn_graph_set *s) { return s->n_types; }

void cn__graph_set_get(const cn_graph_set *s, int i, cn_dag *g, int64_t *lb) {
  const cn_cgraph *c = s->g[i];
  g->n_types = s->n_types;
  g->nv = c->nv;
  g->vtype = c->vtype;
  g->in_start = c->in_start;
  g->in_edges = c->in_edges;
  if (lb != NULL) *lb = c->lower_bound;
}

int cn__graph_set_add_dag(cn_graph_set *s, const cn_dag *g, int32_t n_edges) {
  if (g->nv == 0) return 0;
  size_t nv = (size_t)g->nv, ne = (size_t)n_edges;
  size_t bytes = sizeof(cn_cgraph) + (nv + 1 + ne) * sizeof(int32_t) + nv;
  cn_cgraph *c = malloc(bytes);
  if (c == NULL) return CN_E_NOMEM;
  atomic_init(&c->refs, 1);
  c->nv = g->nv;
  c->ne = n_edges;
  c->in_start = (int32_t *)(c + 1);
  c->in_edges = c->in_start + nv + 1;
  c->vtype = (uint8_t *)(c->in_edges + ne);
  memcpy(c->in_start, g->in_start, (nv + 1) * sizeof(int32_t));
  if (ne > 0) memcpy(c->in_edges, g->in_edges, ne * sizeof(int32_t));
  memcpy(c->vtype, g->vtype, nv);
  c->lower_bound = cn__dag_lower_bound(g);
  if (c->lower_bound < 0) {
    free(c);
    return CN_E_NOMEM;
  }
  if (s->n < s->cap) {
    s->g[s->n++] = c;
  } else {
    cgraph_release(s->g[s->next]);
    s->g[s->next] = c;
  }
  s->next = (s->next + 1) % s->cap;
  return 0;
}

cn_graph_set *cn_graph_set_snapshot(const cn_graph_set *s) {
  cn_graph_set *c = cn_graph_set_new(s->n_types, s->cap);
  if (c == NULL) return NULL;
  for (int i = 0; i < s->n; i++) {
    atomic_fetch_add(&s->g[i]->refs, 1);
    c->g[i] = s->g[i];
  }
  c->n = s->n;
  c->next = s->next;
  return c;
}

long long cn_graph_set_batches(const cn_graph_set *s, cn_policy_kind policy,
                               const cn_fsm *fsm, long long *lower_bound) {
  long long total = 0, lb = 0;
  for (int i = 0; i < s->n; i++) {
    cn_dag g;
    int64_t b;
    int32_t nb;
    cn__graph_set_get(s, i, &g, &b);
    int rc = cn__sched_dag(&g, policy, fsm, CN_PLAN_WIDTH_DEFAULT, NULL, NULL,
                           &nb);
    if (rc != 0) return rc;
    total += nb;
    lb += b;
  }
  if (lower_bound != NULL) *lower_bound = lb;
  return total;
}

int cn_graph_set_optimum(const cn_graph_set *s, int i, long long budget,
                         int beam, cn_optimum *out) {
  memset(out, 0, sizeof(*out));
  if (i < 0 || i >= s->n) return CN_E_INTERNAL;
  cn_dag g;
  int64_t lb;
  cn__graph_set_get(s, i, &g, &lb);
  out->lower_bound = lb;
  for (int p = CN_POLICY_DEPTH; p <= CN_POLICY_PLAN; p++) {
    int32_t nb;
    int rc = cn__sched_dag(&g, (cn_policy_kind)p, NULL,
                           CN_PLAN_WIDTH_DEFAULT, NULL, NULL, &nb);
    if (rc != 0) return rc;
    out->policy[p] = nb;
  }
  cn_dag_optimum o;
  int rc = cn__dag_optimum(&g, budget, &o);
  if (rc != 0) return rc;
  free(o.schedule);
  out->lower = o.lower;
  out->exact = o.exact;
  out->nodes = o.nodes;
  if (o.exact) {
    out->upper = o.upper;
    return 0;
  }
  out->upper = out->policy[CN_POLICY_DEPTH];
  for (int p = CN_POLICY_DEPTH; p <= CN_POLICY_PLAN; p++)
    if (out->policy[p] < out->upper) out->upper = out->policy[p];
  if (beam > 0) {
    int64_t b;
    if ((rc = cn__dag_beam(&g, beam, &b, NULL)) != 0) return rc;
    out->beam = b;
    if (b < out->upper) out->upper = b;
  }
  return 0;
}
