/* sched.c - which vertices run together: the batching policies.
 *
 * Every policy turns the run's graph into a sequence of batches, each of a
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
 *            (ED-Batch §1, Fig. 1c; the loop is ED-Batch Alg. 1 with the
 *            agenda heuristic in line 3).
 * The lower bound Σ_t depth_t is MODELS.md "Batching granularity".
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Topological depth of every vertex: 0 without inputs, else one more than
 * its deepest input. Vertices are stored in a topological order. */
static void topo_depth(const cn_run *r, int32_t *depth) {
  for (int32_t v = 0; v < r->nv; v++) {
    int k;
    const int32_t *in = cn__run_inputs(r, v, &k);
    int32_t d = -1;
    for (int i = 0; i < k; i++)
      if (depth[in[i]] > d) d = depth[in[i]];
    depth[v] = d + 1;
  }
}

int64_t cn__sched_lower_bound(const cn_run *r) {
  int T = r->fam->n_types;
  if (r->nv == 0) return 0;
  /* cnt[v][t]: most type-t vertices on any path ending at v. */
  int32_t *cnt = cn__xcalloc((size_t)r->nv * (size_t)T, sizeof(int32_t));
  if (cnt == NULL) return -1;
  int32_t best[CN_MAX_TYPES] = {0};
  for (int32_t v = 0; v < r->nv; v++) {
    int32_t *c = cnt + (size_t)v * T;
    int k;
    const int32_t *in = cn__run_inputs(r, v, &k);
    for (int i = 0; i < k; i++) {
      const int32_t *p = cnt + (size_t)in[i] * T;
      for (int t = 0; t < T; t++)
        if (p[t] > c[t]) c[t] = p[t];
    }
    c[r->vtype[v]]++;
    for (int t = 0; t < T; t++)
      if (c[t] > best[t]) best[t] = c[t];
  }
  free(cnt);
  int64_t lb = 0;
  for (int t = 0; t < T; t++) lb += best[t];
  return lb;
}

static void push_batch(cn_run *r, int type, int32_t start, int32_t n) {
  cn_run_batch *b = &r->batches[r->n_batches++];
  b->type = type;
  b->start = start;
  b->n = n;
  if (n > r->max_batch[type]) r->max_batch[type] = n;
}

static void plan_none(cn_run *r) {
  for (int32_t v = 0; v < r->nv; v++) {
    r->order[v] = v;
    push_batch(r, r->vtype[v], v, 1);
  }
}

/* Counting sort by (depth, type); each key is one batch. */
static int plan_depth(cn_run *r, const int32_t *depth) {
  int T = r->fam->n_types;
  int32_t maxd = 0;
  for (int32_t v = 0; v < r->nv; v++)
    if (depth[v] > maxd) maxd = depth[v];
  size_t nkeys = (size_t)(maxd + 1) * (size_t)T;
  int32_t *start = cn__xcalloc(nkeys + 1, sizeof(int32_t));
  if (start == NULL) return CN_E_NOMEM;
  for (int32_t v = 0; v < r->nv; v++)
    start[(size_t)depth[v] * T + r->vtype[v] + 1]++;
  for (size_t k = 0; k < nkeys; k++) start[k + 1] += start[k];
  for (int32_t v = 0; v < r->nv; v++)
    r->order[start[(size_t)depth[v] * T + r->vtype[v]]++] = v;
  /* start[k] now holds the end of key k. */
  int32_t s = 0;
  for (size_t k = 0; k < nkeys; k++) {
    if (start[k] > s) push_batch(r, (int)(k % (size_t)T), s, start[k] - s);
    s = start[k];
  }
  free(start);
  return 0;
}

/* The agenda loop; consumers found through a CSR of out-edges. */
static int plan_agenda(cn_run *r, const int32_t *depth) {
  int T = r->fam->n_types;
  int rc = CN_E_NOMEM;
  int32_t nv = r->nv;
  int32_t *out_start = cn__xcalloc((size_t)nv + 1, sizeof(int32_t));
  int32_t *out_edges = cn__xcalloc((size_t)r->ne + 1, sizeof(int32_t));
  int32_t *pending = cn__xcalloc((size_t)nv, sizeof(int32_t));
  int32_t *ready = cn__xcalloc((size_t)nv, sizeof(int32_t));
  if (!out_start || !out_edges || !pending || !ready) goto out;

  for (int32_t v = 0; v < nv; v++) {
    int k;
    const int32_t *in = cn__run_inputs(r, v, &k);
    pending[v] = k;
    for (int i = 0; i < k; i++) out_start[in[i] + 1]++;
  }
  for (int32_t v = 0; v < nv; v++) out_start[v + 1] += out_start[v];
  {
    int32_t *cur = cn__xcalloc((size_t)nv, sizeof(int32_t));
    if (cur == NULL) goto out;
    memcpy(cur, out_start, (size_t)nv * sizeof(int32_t));
    for (int32_t v = 0; v < nv; v++) {
      int k;
      const int32_t *in = cn__run_inputs(r, v, &k);
      for (int i = 0; i < k; i++) out_edges[cur[in[i]]++] = v;
    }
    free(cur);
  }

  /* Per-type FIFO queues laid out in one array: type t owns n_of_type[t]
   * consecutive entries of ready[], consumed from head[t] to tail[t]. */
  int64_t head[CN_MAX_TYPES], tail[CN_MAX_TYPES];
  double avg[CN_MAX_TYPES];
  double sum[CN_MAX_TYPES] = {0};
  int64_t acc = 0;
  for (int t = 0; t < T; t++) {
    head[t] = tail[t] = acc;
    acc += r->n_of_type[t];
  }
  for (int32_t v = 0; v < nv; v++) {
    sum[r->vtype[v]] += depth[v];
    if (pending[v] == 0) ready[tail[r->vtype[v]]++] = v;
  }
  for (int t = 0; t < T; t++)
    avg[t] = r->n_of_type[t] ? sum[t] / (double)r->n_of_type[t] : 0.0;

  int32_t placed = 0;
  while (placed < nv) {
    int best = -1;
    for (int t = 0; t < T; t++)
      if (tail[t] > head[t] && (best < 0 || avg[t] < avg[best])) best = t;
    if (best < 0) { /* cannot happen in a DAG */
      rc = CN_E_INTERNAL;
      goto out;
    }
    int64_t h = head[best], e = tail[best];
    head[best] = e;
    int32_t start = placed;
    for (int64_t i = h; i < e; i++) {
      int32_t v = ready[i];
      r->order[placed++] = v;
      for (int32_t j = out_start[v]; j < out_start[v + 1]; j++) {
        int32_t w = out_edges[j];
        if (--pending[w] == 0) ready[tail[r->vtype[w]]++] = w;
      }
    }
    push_batch(r, best, start, placed - start);
  }
  rc = 0;
out:
  free(out_start);
  free(out_edges);
  free(pending);
  free(ready);
  return rc;
}

int cn__sched_plan(cn_run *r, cn_policy_kind policy, cn_err *err) {
  int rc = CN_E_NOMEM;
  int32_t *depth = NULL;
  r->order = malloc((size_t)r->nv * sizeof(int32_t));
  r->batches = malloc((size_t)r->nv * sizeof(cn_run_batch));
  depth = malloc((size_t)r->nv * sizeof(int32_t));
  if (r->order == NULL || r->batches == NULL || depth == NULL) goto out;
  r->n_batches = 0;
  memset(r->max_batch, 0, sizeof(r->max_batch));
  topo_depth(r, depth);
  switch (policy) {
    case CN_POLICY_NONE: plan_none(r); rc = 0; break;
    case CN_POLICY_DEPTH: rc = plan_depth(r, depth); break;
    case CN_POLICY_AGENDA: rc = plan_agenda(r, depth); break;
    default: rc = CN_E_INTERNAL; break;
  }
  if (rc != 0) goto out;
  r->lower_bound = cn__sched_lower_bound(r);
  if (r->lower_bound < 0) rc = CN_E_NOMEM;
out:
  free(depth);
  if (rc != 0)
    cn_err_set(err, rc, "could not plan the run's batches (%s)",
               cn_err_default_msg(rc));
  return rc;
}

static const char *const policy_names[CN_POLICY__COUNT] = {"none", "depth",
                                                           "agenda"};

const char *cn_policy_name(cn_policy_kind p) {
  return p >= 0 && p < CN_POLICY__COUNT ? policy_names[p] : "?";
}

int cn_policy_parse(const char *name, cn_policy_kind *out) {
  for (int p = 0; p < CN_POLICY__COUNT; p++)
    if (strcmp(name, policy_names[p]) == 0) {
      *out = (cn_policy_kind)p;
      return 0;
    }
  return CN_E_BAD_CONFIG;
}
