/* sched_bench.c - canopy-sched-bench: what scheduling one run costs per
 * vertex, policy by policy (docs/benchmarks.md "Host cost: input and
 * scheduling").
 *
 * usage: canopy-sched-bench MODEL_DIR INPUT.jsonl [INSTANCES=1024] [REPS=5]
 *                           [POLICIES=none,depth,...,plan]
 *
 * Reads the first INSTANCES lines into one run and times, in CPU seconds
 * of the calling thread (steady on a shared machine, unlike wall time),
 * the best of REPS: each policy's plan over the run's DAG (cn__sched_dag),
 * then for the default policy's plan the memory order (cn__dag_mem_order,
 * as a run orders its batches) and the row plan (cn__run_plan_live).
 * Prints nanoseconds per vertex, the batches of each and a hash of the
 * schedule (order and batches), so that two builds can be checked to plan
 * the same; then the lower bound and the sum a planned run pays per
 * vertex (the default's plan, the bound, the memory order, the row plan).
 * It computes nothing and asserts nothing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends.h"
#include "run/run_api.h"

/* FNV-1a over a schedule: two builds plan alike when the hashes agree. */
static uint32_t sched_hash(const int32_t *order, const cn_run_batch *bt,
                           int32_t nb) {
  uint32_t h = 2166136261u;
  for (int32_t b = 0; b < nb; b++) {
    h = (h ^ (uint32_t)bt[b].type) * 16777619u;
    for (int32_t i = 0; i < bt[b].n; i++)
      h = (h ^ (uint32_t)order[bt[b].start + i]) * 16777619u;
  }
  return h;
}

static double cpu_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* The best of the repetitions of one piece, in CPU seconds. */
typedef struct best {
  double t, t0;
} best;
static void b_init(best *b) { b->t = 1e30; }
static void b_start(best *b) { b->t0 = cpu_now(); }
static void b_stop(best *b) {
  double t = cpu_now() - b->t0;
  if (t < b->t) b->t = t;
}
static void b_print(const char *name, const best *b, int32_t nv) {
  printf("  %-12s %8.1f ", name, b->t * 1e9 / nv);
}

/* The rows the answers read after the run (run.c's rows_read_after). */
static uint8_t *rows_kept(cn_run *r) {
  if (r->fam->reads == NULL) return NULL;
  uint8_t *keep = calloc((size_t)r->nv + 1, 1);
  if (keep == NULL) return NULL;
  r->n_spans = 0;
  for (int s = 0; s < r->n_slots; s++) r->fam->reads(r, s);
  for (int64_t i = 0; i < r->n_spans; i++) keep[r->spans[i].v] = 1;
  r->n_spans = 0;
  return keep;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: canopy-sched-bench MODEL_DIR INPUT.jsonl "
                    "[INSTANCES=1024] [REPS=5] [POLICIES]\n");
    return 2;
  }
  int max = argc > 3 ? atoi(argv[3]) : 1024, reps = argc > 4 ? atoi(argv[4]) : 5;
  cn_err err;
  cn_err_clear(&err);
  cn_model *m = NULL;
  cn_backend_ctx *bk = NULL;
  if (cn_model_load(argv[1], &m, &err) != 0 ||
      cn_backend_open("cpu", 0, &bk, &err) != 0) {
    fprintf(stderr, "canopy-sched-bench: %s\n", err.msg);
    return 1;
  }
  FILE *f = fopen(argv[2], "r");
  if (f == NULL) {
    perror(argv[2]);
    return 1;
  }
  cn_run *r = cn_run_new(m, bk);
  cn_instance **ins = calloc((size_t)max + 1, sizeof(*ins));
  char *buf = NULL;
  size_t cap = 0;
  ssize_t len;
  int n = 0;
  while (n < max && (len = getline(&buf, &cap, f)) >= 0) {
    json_t *j = json_loadb(buf, (size_t)len, 0, NULL);
    if (j == NULL || cn_instance_parse(m, j, NULL, n, &ins[n], &err) != 0 ||
        cn_run_add(r, ins[n], CN_OUT_ALL, 0) < 0) {
      fprintf(stderr, "canopy-sched-bench: line %d: %s\n", n + 1, err.msg);
      return 1;
    }
    json_decref(j);
    n++;
  }
  fclose(f);
  free(buf);
  cn_dag g = cn__run_dag(r);
  best b_policy, b_bound, b_mem, b_live;
  b_init(&b_policy);
  int32_t *order = malloc(((size_t)g.nv + 1) * sizeof(int32_t));
  cn_run_batch *bt = malloc(((size_t)g.nv + 1) * sizeof(*bt));
  printf("%s: %d instances, %d vertices, CPU ns per vertex, "
         "best of %d\n", argv[2], n, g.nv, reps);
  static const cn_policy_kind pk[] = {
      CN_POLICY_NONE, CN_POLICY_DEPTH, CN_POLICY_AGENDA, CN_POLICY_SUFFICIENT,
      CN_POLICY_LOOKAHEAD, CN_POLICY_LOOKAHEAD2, CN_POLICY_PLAN};
  const char *only = argc > 5 ? argv[5] : NULL;
  for (size_t p = 0; p < sizeof(pk) / sizeof(pk[0]); p++) {
    if (only != NULL && pk[p] != CN_POLICY_SUFFICIENT) { /* a listed one? */
      const char *nm = cn_policy_name(pk[p]), *at = only;
      size_t l = strlen(nm);
      while ((at = strstr(at, nm)) != NULL &&
             ((at > only && at[-1] != ',') || (at[l] != ',' && at[l] != 0)))
        at++;
      if (at == NULL) continue;
    }
    best b;
    b_init(&b);
    int32_t nb = 0;
    for (int k = 0; k < reps; k++) {
      b_start(&b);
      cn__sched_dag(&g, pk[p], NULL, 16, order, bt, &nb);
      b_stop(&b);
    }
    b_print(cn_policy_name(pk[p]), &b, g.nv);
    printf(" batches %d  hash %08x\n", nb, sched_hash(order, bt, nb));
    if (pk[p] == CN_POLICY_SUFFICIENT) b_policy = b;
  }
  b_init(&b_bound);
  int64_t lb = 0;
  for (int k = 0; k < reps; k++) {
    b_start(&b_bound);
    lb = cn__dag_lower_bound(&g);
    b_stop(&b_bound);
  }
  b_print("lower bound", &b_bound, g.nv);
  printf(" bound %lld\n", (long long)lb);
  /* the default's plan, then what a run does with it */
  uint8_t *keep = rows_kept(r);
  int64_t bytes[CN_MAX_TYPES];
  for (int t = 0; t < r->fam->n_types; t++) {
    r->state_floats[t] = r->fam->state_floats(m, t);
    bytes[t] = r->state_floats[t] * (int64_t)sizeof(float);
  }
  free(r->state_off);
  r->state_off = malloc(((size_t)g.nv + 1) * sizeof(int64_t));
  b_init(&b_mem);
  b_init(&b_live);
  int32_t nbm = 0;
  int64_t peak = 0, states = 0;
  uint32_t hm = 0, hl = 0;
  for (int k = 0; k < reps; k++) {
    int32_t nb;
    cn__sched_dag(&g, CN_POLICY_SUFFICIENT, NULL, 16, order, bt, &nb);
    cn_dag_mem mm = {bytes, keep};
    cn_dag_mem_result res;
    b_start(&b_mem);
    cn__dag_mem_order(&g, &mm, 0, order, bt, &nb, &res);
    b_stop(&b_mem);
    peak = res.peak;
    hm = sched_hash(order, bt, nb);
    int32_t *o0 = r->order;
    cn_run_batch *b0 = r->batches;
    int32_t n0 = r->n_batches;
    r->order = order, r->batches = bt, r->n_batches = nbm = nb;
    b_start(&b_live);
    cn__run_plan_live(r, keep, &states);
    b_stop(&b_live);
    hl = sched_hash(order, bt, nb);
    for (int32_t v = 0; v < g.nv; v++)
      hl = (hl ^ (uint32_t)r->state_off[v]) * 16777619u;
    r->order = o0, r->batches = b0, r->n_batches = n0;
  }
  b_print("memory order", &b_mem, g.nv);
  printf(" batches %d  hash %08x  peak %lld\n", nbm, hm, (long long)peak);
  b_print("row plan", &b_live, g.nv);
  printf(" hash %08x  states %lld\n", hl, (long long)states);
  best sum = {b_policy.t + b_bound.t + b_mem.t + b_live.t, 0};
  b_print("planned run", &sum, g.nv);
  printf(" (sufficient + lower bound + memory order + row plan)\n");
  free(keep);
  free(order);
  free(bt);
  cn_run_free(r);
  for (int i = 0; i < n; i++) cn_instance_free(ins[i]);
  free(ins);
  cn_backend_close(bk);
  cn_model_free(m);
  return 0;
}
