/* test_fsm.c - learned FSM batching policies (ED-Batch §2): the frontier
 * and eq. 1's ratio against their definitions, the encodings on the
 * paper's Fig. 1/2 example, Q-learning against exhaustive search on small
 * random DAGs, validity of greedy schedules, the policy cache (round trip,
 * corrupt and mismatched files, and `canopy run` retraining), and outputs
 * under --policy fsm against the unbatched path. */
#include <criterion/criterion.h>
#include <errno.h>
#include <sys/stat.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine_util.h"
#include "internal.h"

static const cn_family fake3 = {.name = "fake", .n_types = 3,
                                .type_names = {"a", "b", "c"}};
static const cn_family fake4 = {.name = "fig1", .n_types = 4,
                                .type_names = {"L", "I", "O", "R"}};
static cn_model fake_model = {.fam = &fake3};
static cn_model fig1_model = {.fam = &fake4};

static int32_t add(cn_run *r, int type, int n, ...) {
  int32_t in[16];
  va_list ap;
  va_start(ap, n);
  for (int i = 0; i < n; i++) in[i] = va_arg(ap, int32_t);
  va_end(ap);
  return cn__run_add_vertex(r, type, 0, 0, 0, in, n);
}

/* ED-Batch Fig. 1(a) as §2.1 describes it: inputs x1..x4 (L), a chain of
 * internal nodes I1 = (x1, x2), I2 = (I1, x3), I3 = (I2, x4), an output O
 * on each of the 7, and a reduction R over the outputs. */
static cn_run *fig1(void) {
  cn_run *r = cn_run_new(&fig1_model, NULL);
  int32_t x[4], in[3], o[7];
  for (int i = 0; i < 4; i++) x[i] = add(r, 0, 0);
  in[0] = add(r, 1, 2, x[0], x[1]);
  in[1] = add(r, 1, 2, in[0], x[2]);
  in[2] = add(r, 1, 2, in[1], x[3]);
  for (int i = 0; i < 4; i++) o[i] = add(r, 2, 1, x[i]);
  for (int i = 0; i < 3; i++) o[4 + i] = add(r, 2, 1, in[i]);
  add(r, 3, 7, o[0], o[1], o[2], o[3], o[4], o[5], o[6]);
  return r;
}

/* Training options of the tests that check what the search finds:
 * encoding e, no fallback policy, `iterations` steps. */
static cn_fsm_opts search_opts(int e, int iterations) {
  cn_fsm_opts o;
  cn_fsm_opts_default(&o);
  o.encoding = (cn_fsm_encoding)e;
  o.fallback = 0;
  o.iterations = iterations;
  return o;
}

Test(fsm, encodings_and_ratio_on_fig1) {
  cn_run *r = fig1();
  cn_dag g = cn__run_dag(r);
  cn_frontier f;
  int32_t out[32];
  cr_assert_eq(cn__frontier_init(&f, 4, true), 0);
  cr_assert_eq(cn__frontier_add_dag(&f, &g), 0);
  cr_assert_eq(cn__frontier_commit(&f, 0, out), 4); /* iteration 1: L */
  cr_assert_eq(cn__frontier_commit(&f, 1, out), 1); /* I1 */
  /* Iteration 2 of §2.3: the ratio is 5/7 for O and 1/1 for I. */
  cr_expect_float_eq(cn__frontier_ratio(&f, 2), 5.0 / 7.0, 1e-12);
  cr_expect_float_eq(cn__frontier_ratio(&f, 1), 1.0, 1e-12);
  cr_expect_eq(cn__frontier_ratio(&f, 3), 0.0);
  /* E_base = {I, O}; E_max adds O; E_sort = (O, I). */
  cr_expect_eq(cn__fsm_encode(CN_FSM_ENC_BASE, 4, f.n_ready), 0x6u);
  cr_expect_eq(cn__fsm_encode(CN_FSM_ENC_MAX, 4, f.n_ready), 0x6u | 3u << 8);
  cr_expect_eq(cn__fsm_encode(CN_FSM_ENC_SORT, 4, f.n_ready), 3u | 2u << 4);
  /* The agenda picks O here (average depth 1.85 < 2, Fig. 1c); the
   * sufficient condition picks I (Fig. 2). */
  cr_expect_eq(cn__frontier_next(&f, CN_POLICY_AGENDA, NULL), 2);
  cr_expect_eq(cn__frontier_next(&f, CN_POLICY_SUFFICIENT, NULL), 1);
  cn__frontier_free(&f);
  /* Whole schedules: the bound L, I, I, I, O, R = 6 for the FSM. */
  int32_t nb;
  cr_assert_eq(cn__sched_dag(&g, CN_POLICY_AGENDA, NULL,
                             CN_PLAN_WIDTH_DEFAULT, NULL, NULL, &nb), 0);
  cr_expect_gt(nb, 6);
  cn_graph_set *gs = cn_graph_set_new(4, 4);
  cr_assert_eq(cn_graph_set_add_run(gs, r), 0);
  for (int e = 0; e < CN_FSM_ENC__COUNT; e++) {
    cn_fsm_opts o = search_opts(e, 200);
    o.polish_rounds = 0;
    cn_fsm *p = NULL;
    cn_err err;
    cn_err_clear(&err);
    cr_assert_eq(cn_fsm_train(&fig1_model, gs, &o, &p, &err), 0, "%s",
                 err.msg);
    long long lb;
    cr_expect_eq(cn_graph_set_batches(gs, CN_POLICY_FSM, p, &lb), 6,
                 "encoding %s", cn_fsm_encoding_name(o.encoding));
    cr_expect_eq(lb, 6);
    cn_fsm_free(p);
  }
  cn_graph_set_free(gs);
  cn_run_free(r);
}

Test(fsm, encodings_sort_ties_and_all_types) {
  int64_t n[4] = {3, 3, 0, 7};
  cr_expect_eq(cn__fsm_encode(CN_FSM_ENC_SORT, 4, n), 4u | 1u << 4 | 2u << 8);
  cr_expect_eq(cn__fsm_encode(CN_FSM_ENC_MAX, 4, n), 0xbu | 4u << 8);
  cr_expect_eq(cn__fsm_encode(CN_FSM_ENC_BASE, 4, n), 0xbu);
  int64_t z[4] = {0};
  cr_expect_eq(cn__fsm_encode(CN_FSM_ENC_SORT, 4, z), 0u);
  int64_t e[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  cr_expect_eq(cn__fsm_encode(CN_FSM_ENC_SORT, 8, e), 0x12345678u);
}

/* A random DAG of n vertices and 3 types, seeded. */
static cn_run *random_dag(int n, unsigned seed) {
  srand(seed);
  cn_run *r = cn_run_new(&fake_model, NULL);
  for (int v = 0; v < n; v++) {
    int32_t in[3];
    int k = v == 0 ? 0 : rand() % (v < 3 ? v + 1 : 4);
    for (int j = 0; j < k; j++) in[j] = rand() % v;
    cn__run_add_vertex(r, rand() % 3, 0, 0, 0, in, k);
  }
  return r;
}

/* |Frontier(G^t)| by its definition: type-t vertices left with no type-t
 * vertex left among their ancestors (a search per vertex). */
static int64_t sub_by_definition(const cn_run *r, const char *done, int t) {
  int64_t count = 0;
  for (int32_t v = 0; v < r->nv; v++) {
    if (done[v] || r->vtype[v] != t) continue;
    char *seen = calloc((size_t)r->nv, 1);
    int32_t *st = malloc((size_t)r->nv * 4), sp = 0;
    bool blocked = false;
    st[sp++] = v;
    while (sp > 0 && !blocked) {
      int k;
      const int32_t *in = cn__run_inputs(r, st[--sp], &k);
      for (int j = 0; j < k; j++) {
        if (seen[in[j]]) continue;
        seen[in[j]] = 1;
        if (!done[in[j]] && r->vtype[in[j]] == t) blocked = true;
        st[sp++] = in[j];
      }
    }
    count += !blocked;
    free(seen);
    free(st);
  }
  return count;
}

/* The incremental counts against the definition along random schedules,
 * with half the vertices added only after some batches ran (the dynamic
 * executor's way). */
Test(fsm, frontier_counts_against_definition) {
  for (int trial = 0; trial < 200; trial++) {
    int n = 3 + trial % 20;
    cn_run *r = random_dag(n, 500u + (unsigned)trial);
    cn_frontier f;
    cr_assert_eq(cn__frontier_init(&f, 3, true), 0);
    char *done = calloc((size_t)n, 1);
    int32_t *out = malloc((size_t)n * 4);
    int32_t added = 0;
    while (f.n_done < n) {
      /* Half the graph up front, then one vertex after each batch. */
      while (added < n && (added < n / 2 || f.n_done == added)) {
        int k;
        const int32_t *in = cn__run_inputs(r, added, &k);
        cr_assert_eq(cn__frontier_add(&f, r->vtype[added], in, k), added);
        added++;
      }
      int32_t nv = r->nv;
      r->nv = added; /* vertices not added yet do not exist yet */
      for (int t = 0; t < 3; t++) {
        int64_t ready = 0;
        for (int32_t v = 0; v < added; v++) {
          int k;
          const int32_t *in = cn__run_inputs(r, v, &k);
          bool ok = !done[v] && r->vtype[v] == t;
          for (int j = 0; j < k && ok; j++) ok = done[in[j]];
          ready += ok;
        }
        cr_assert_eq(f.n_ready[t], ready, "trial %d type %d", trial, t);
        cr_assert_eq(f.n_sub[t], sub_by_definition(r, done, t),
                     "trial %d type %d", trial, t);
      }
      r->nv = nv;
      int t = cn__frontier_next(&f, CN_POLICY_SUFFICIENT, NULL);
      cr_assert_geq(t, 0);
      int32_t k = cn__frontier_commit(&f, t, out);
      for (int32_t i = 0; i < k; i++) done[out[i]] = 1;
      if (added < n) {
        int kk;
        const int32_t *in = cn__run_inputs(r, added, &kk);
        cr_assert_eq(cn__frontier_add(&f, r->vtype[added], in, kk), added);
        added++;
      }
    }
    cr_expect_eq(f.n_done, n);
    free(done);
    free(out);
    cn__frontier_free(&f);
    cn_run_free(r);
  }
}



/* Fewest batches of any FSM with the encoding: depth-first search over
 * schedules, choosing an action the first time a state is met and keeping
 * it whenever the state recurs. */
typedef struct fsm_search {
  cn_frontier f;
  cn_fsm_encoding enc;
  uint32_t keys[64];
  int acts[64], nk;
  int seq[64], best;
  int32_t out[64];
} fsm_search;

static void fsm_dfs(fsm_search *s, int ns) {
  cn__frontier_reset(&s->f);
  for (int i = 0; i < ns; i++) cn__frontier_commit(&s->f, s->seq[i], s->out);
  if (s->f.n_done == s->f.nv) {
    if (ns < s->best) s->best = ns;
    return;
  }
  if (ns + 1 >= s->best) return;
  uint32_t key = cn__fsm_state(s->enc, &s->f);
  for (int i = 0; i < s->nk; i++)
    if (s->keys[i] == key) {
      s->seq[ns] = s->acts[i];
      fsm_dfs(s, ns + 1);
      return;
    }
  int64_t ready[CN_MAX_TYPES];
  memcpy(ready, s->f.n_ready, sizeof(ready));
  for (int a = 0; a < 3; a++) {
    if (ready[a] == 0) continue;
    s->keys[s->nk] = key;
    s->acts[s->nk++] = a;
    s->seq[ns] = a;
    fsm_dfs(s, ns + 1);
    s->nk--;
  }
}

static int best_fsm(const cn_run *r, cn_fsm_encoding enc) {
  fsm_search *s = calloc(1, sizeof(*s));
  cn_dag g = cn__run_dag(r);
  cn__frontier_init(&s->f, 3, false);
  cn__frontier_add_dag(&s->f, &g);
  cn__frontier_tails(&s->f); /* E_bound reads the drops */
  s->enc = enc;
  s->best = 1 << 30;
  fsm_dfs(s, 0);
  int b = s->best;
  cn__frontier_free(&s->f);
  free(s);
  return b;
}

/* Every vertex exactly once, one type per batch, inputs before use. */
static void check_valid(const cn_dag *g, const int32_t *order,
                        const cn_run_batch *b, int32_t nb) {
  char *done = calloc((size_t)g->nv, 1);
  int32_t seen = 0;
  for (int32_t i = 0; i < nb; i++) {
    cr_assert_gt(b[i].n, 0);
    for (int32_t j = 0; j < b[i].n; j++) {
      int32_t v = order[b[i].start + j];
      cr_assert_eq(g->vtype[v], b[i].type);
      for (int32_t e = g->in_start[v]; e < g->in_start[v + 1]; e++)
        cr_assert(done[g->in_edges[e]], "vertex %d before its input", v);
    }
    for (int32_t j = 0; j < b[i].n; j++) {
      cr_assert(!done[order[b[i].start + j]]);
      done[order[b[i].start + j]] = 1;
      seen++;
    }
  }
  cr_assert_eq(seen, g->nv);
  free(done);
}

/* Learning against exhaustive search: wherever some FSM with the
 * encoding reaches the optimum, the learned one does; it is never better
 * than the optimum, never worse than agenda, and its schedules are valid. */
Test(fsm, learning_finds_the_optimum_on_small_dags, .timeout = 60) {
  int representable = 0, found = 0;
  for (int trial = 0; trial < 150; trial++) {
    int n = 4 + trial % 11;
    cn_run *r = random_dag(n, 9000u + (unsigned)trial);
    cn_dag g = cn__run_dag(r);
    int opt = tu_brute_force_min(r);
    cn_graph_set *gs = cn_graph_set_new(3, 1);
    cr_assert_eq(cn_graph_set_add_run(gs, r), 0);
    for (int e = 0; e < CN_FSM_ENC__COUNT; e++) {
      cn_fsm_opts o = search_opts(e, 300);
      o.seed = (uint64_t)trial + 1;
      cn_fsm *p = NULL;
      cn_err err;
      cn_err_clear(&err);
      cr_assert_eq(cn_fsm_train(&fake_model, gs, &o, &p, &err), 0);
      long long got = cn_graph_set_batches(gs, CN_POLICY_FSM, p, NULL);
      long long ag = cn_graph_set_batches(gs, CN_POLICY_AGENDA, NULL, NULL);
      int bf = best_fsm(r, o.encoding);
      cr_expect_geq(got, opt, "trial %d", trial);
      cr_expect_geq(got, bf, "trial %d", trial);
      cr_expect_leq(got, ag, "trial %d: fsm %lld > agenda %lld", trial, got,
                    ag);
      if (bf == opt) {
        representable++;
        found += got == opt;
        cr_expect_eq(got, opt, "trial %d enc %s: learned %lld, optimum %d",
                     trial, cn_fsm_encoding_name(o.encoding), got, opt);
      }
      int32_t *order = malloc((size_t)n * 4), nb;
      cn_run_batch *b = malloc((size_t)n * sizeof(*b));
      cr_assert_eq(cn__sched_dag(&g, CN_POLICY_FSM, p,
                                 CN_PLAN_WIDTH_DEFAULT, order, b, &nb), 0);
      cr_expect_eq(nb, got);
      check_valid(&g, order, b, nb);
      free(order);
      free(b);
      cn_fsm_free(p);
    }
    cn_graph_set_free(gs);
    cn_run_free(r);
  }
  cr_log_info("optimum representable in %d cases, learned in %d",
              representable, found);
  cr_expect_gt(representable, 300);
}

/* ---- real models: cache, CLI, outputs --------------------------------- */

/* Graphs of `insts` in runs of 64 (outputs all). */
static cn_graph_set *graphs_of(const cn_model *m, const json_t *insts) {
  cn_graph_set *gs = cn_graph_set_new(cn_model_n_types(m), 16);
  size_t n = json_array_size(insts);
  for (size_t s = 0; s < n; s += 64) {
    cn_run *r = cn_run_new(m, NULL);
    cn_instance *in[64] = {0};
    for (size_t i = s; i < n && i < s + 64; i++) {
      cn_err err;
      cr_assert_eq(cn_instance_parse(m, json_array_get(insts, i), NULL, 0,
                                     &in[i - s], &err), 0);
      cr_assert_geq(cn_run_add(r, in[i - s], CN_OUT_ALL, 0), 0);
    }
    cr_assert_eq(cn_graph_set_add_run(gs, r), 0);
    cn_run_free(r);
    for (int i = 0; i < 64; i++) cn_instance_free(in[i]);
  }
  return gs;
}

static cn_fsm *train(const cn_model *m, cn_graph_set *gs,
                     cn_fsm_encoding enc, int fallback) {
  cn_fsm_opts o;
  cn_fsm_opts_default(&o);
  o.encoding = enc;
  o.fallback = fallback;
  cn_fsm *p = NULL;
  cn_err err;
  cn_err_clear(&err);
  cr_assert_eq(cn_fsm_train(m, gs, &o, &p, &err), 0, "%s", err.msg);
  return p;
}

static void write_file(const char *path, const char *s, size_t n) {
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f);
  fwrite(s, 1, n, f);
  fclose(f);
}

static char *read_file(const char *path, size_t *n) {
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f, "cannot open %s", path);
  char *b = malloc(1 << 22);
  *n = fread(b, 1, (1 << 22) - 1, f);
  b[*n] = '\0';
  fclose(f);
  return b;
}

Test(fsm, cache_round_trip_corrupt_and_mismatched, .timeout = 60) {
  char dir[256], dir2[256], cache[300], path[600];
  cn_model *m = tu_model("treelstm-2type", 8, 8, "trees-binary.jsonl", dir,
                         sizeof(dir));
  cn_model *m2 = tu_model("treelstm-2type", 12, 8, "trees-binary.jsonl",
                          dir2, sizeof(dir2));
  snprintf(cache, sizeof(cache), "%s/cache", dir);
  json_t *insts = tu_data_lines("trees-binary.jsonl", 128);
  cn_graph_set *gs = graphs_of(m, insts);
  cn_fsm *p = train(m, gs, CN_FSM_ENC_SORT, 1), *q = NULL;
  cn_err err;
  cn_err_clear(&err);
  cr_assert_eq(cn_policy_cache_load(m, cache, CN_FSM_ENC_SORT, &q, &err),
               CN_CACHE_MISS);
  cr_assert_eq(cn_policy_cache_store(m, cache, p, &err), 0, "%s", err.msg);
  /* Round trip: the same description, the same batches. */
  cr_assert_eq(cn_policy_cache_load(m, cache, CN_FSM_ENC_SORT, &q, &err),
               CN_CACHE_HIT, "%s", err.msg);
  json_t *a = cn_fsm_describe(p), *b = cn_fsm_describe(q);
  json_object_del(a, "train_seconds"); /* a float printed with %.17g */
  json_object_del(b, "train_seconds");
  cr_expect(json_equal(a, b));
  json_decref(a);
  json_decref(b);
  cr_expect_eq(cn_graph_set_batches(gs, CN_POLICY_FSM, p, NULL),
               cn_graph_set_batches(gs, CN_POLICY_FSM, q, NULL));
  cn_fsm_free(q);
  q = NULL;
  /* E_bound round-trips too, beside the E_sort file. */
  cn_fsm *pb = train(m, gs, CN_FSM_ENC_BOUND, 0);
  cr_assert_eq(cn_policy_cache_store(m, cache, pb, &err), 0, "%s", err.msg);
  cr_assert_eq(cn_policy_cache_load(m, cache, CN_FSM_ENC_BOUND, &q, &err),
               CN_CACHE_HIT, "%s", err.msg);
  cr_expect_eq(cn_graph_set_batches(gs, CN_POLICY_FSM, pb, NULL),
               cn_graph_set_batches(gs, CN_POLICY_FSM, q, NULL));
  cr_expect_eq(cn_fsm_get_encoding(q), CN_FSM_ENC_BOUND);
  cn_fsm_free(q);
  cn_fsm_free(pb);
  q = NULL;
  /* Another encoding: the file is for other states. */
  cr_expect_eq(cn_policy_cache_load(m, cache, CN_FSM_ENC_BASE, &q, &err),
               CN_CACHE_STALE);
  cr_expect_null(q);
  /* Another model's weights under this model's name. */
  cr_assert_eq(cn_policy_cache_path(m2, cache, path, sizeof(path)), 0);
  cr_assert_eq(cn_fsm_save(p, path, &err), 0);
  cr_expect_eq(cn_policy_cache_load(m2, cache, CN_FSM_ENC_SORT, &q, &err),
               CN_CACHE_STALE);
  cr_expect_null(q);
  /* Damage: one changed digit (valid JSON: the checksum catches it), a
   * cut, garbage. */
  cr_assert_eq(cn_policy_cache_path(m, cache, path, sizeof(path)), 0);
  size_t n;
  char *good = read_file(path, &n);
  char *bad = strdup(good);
  char *digit = strstr(bad, "\"states\":[[");
  cr_assert_not_null(digit);
  digit = strpbrk(digit + 11, "123456789");
  *digit = *digit == '9' ? '1' : (char)(*digit + 1);
  write_file(path, bad, n);
  cr_expect_eq(cn_policy_cache_load(m, cache, CN_FSM_ENC_SORT, &q, &err),
               CN_CACHE_CORRUPT);
  cr_expect(strstr(err.msg, "checksum") != NULL, "%s", err.msg);
  write_file(path, good, n / 2);
  cr_expect_eq(cn_policy_cache_load(m, cache, CN_FSM_ENC_SORT, &q, &err),
               CN_CACHE_CORRUPT);
  write_file(path, "\x01\x02garbage", 9);
  cr_expect_eq(cn_policy_cache_load(m, cache, CN_FSM_ENC_SORT, &q, &err),
               CN_CACHE_CORRUPT);
  cr_expect_null(q);
  /* Not a regular file: a FIFO blocked the open for ever, a
   * directory or /dev/zero there is corrupt too, and nothing is read. */
  const char *kinds[] = {"FIFO", "directory", "/dev/zero"};
  for (int i = 0; i < 3; i++) {
    unlink(path);
    rmdir(path);
    int made = i == 0   ? mkfifo(path, 0644)
               : i == 1 ? mkdir(path, 0755)
                        : symlink("/dev/zero", path);
    cr_assert_eq(made, 0, "%s: %s", kinds[i], strerror(errno));
    cn_err_clear(&err);
    cr_expect_eq(cn_policy_cache_load(m, cache, CN_FSM_ENC_SORT, &q, &err),
                 CN_CACHE_CORRUPT, "%s", kinds[i]);
    cr_expect(strstr(err.msg, "not a regular file") != NULL, "%s: %s",
              kinds[i], err.msg);
    cr_expect_null(q);
  }
  rmdir(path);
  /* A FIFO where the store writes its temporary file: replaced, not
   * opened (that blocks until a reader comes). */
  char tmp[700];
  snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid());
  cr_assert_eq(mkfifo(tmp, 0644), 0);
  cr_expect_eq(cn_policy_cache_store(m, cache, p, &err), 0, "%s", err.msg);
  cr_expect_eq(cn_policy_cache_load(m, cache, CN_FSM_ENC_SORT, &q, &err),
               CN_CACHE_HIT, "%s", err.msg);
  cn_fsm_free(q);
  q = NULL;
  free(good);
  free(bad);
  json_decref(insts);
  cn_fsm_free(p);
  cn_graph_set_free(gs);
  cn_model_free(m);
  cn_model_free(m2);
  tu_rmdir(dir);
  tu_rmdir(dir2);
}

static int sh(const char *cmd) {
  int rc = system(cmd);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* `canopy run --policy fsm`: learns and caches with nothing cached, uses
 * the cache next time, ignores (and replaces) a corrupt or stale file. */
Test(fsm, cli_run_learns_caches_and_retrains, .timeout = 120) {
  const char *bin = getenv("CANOPY_BIN"), *data = getenv("CANOPY_DATA");
  cr_assert_not_null(bin, "CANOPY_BIN is not set");
  char dir[256], cmd[2048], errp[300], path[600], cache[300];
  cn_model *m = tu_model("treelstm", 8, 8, "trees-binary.jsonl", dir,
                         sizeof(dir));
  snprintf(cache, sizeof(cache), "%s/cache", dir);
  snprintf(errp, sizeof(errp), "%s/err", dir);
  cr_assert_eq(cn_policy_cache_path(m, cache, path, sizeof(path)), 0);
#define RUN(extra)                                                           \
  snprintf(cmd, sizeof(cmd),                                                 \
           "head -n 128 %s/trees-binary.jsonl | %s run --model %s/m "        \
           "--input - --outputs all --policy fsm --policy-cache %s %s "      \
           ">/dev/null 2>%s",                                                \
           data, bin, dir, cache, extra, errp);                              \
  cr_assert_eq(sh(cmd), 0, "%s", cmd)
  size_t n;
  /* --no-learn: a cache miss stops the run, which learns nothing. */
  snprintf(cmd, sizeof(cmd),
           "head -n 128 %s/trees-binary.jsonl | %s run --model %s/m "
           "--input - --outputs all --policy fsm --policy-cache %s "
           "--no-learn >/dev/null 2>%s",
           data, bin, dir, cache, errp);
  cr_expect_eq(sh(cmd), 1, "%s", cmd);
  char *e = read_file(errp, &n);
  cr_expect(strstr(e, "--no-learn") && strstr(e, "learning") == NULL, "%s",
            e);
  free(e);
  cr_expect_neq(access(path, F_OK), 0, "--no-learn wrote %s", path);
  RUN("");
  e = read_file(errp, &n);
  cr_expect(strstr(e, "learning one from the input") && strstr(e, "cached"),
            "%s", e);
  long long nb = -1, lb = -2;
  const char *sum = strstr(e, "{\"instances\"");
  cr_assert_not_null(sum, "%s", e);
  sscanf(strstr(sum, "\"batches\""), "\"batches\": %lld, \"lower_bound\": %lld",
         &nb, &lb);
  cr_expect_eq(nb, lb, "%s", e); /* treelstm: the learned FSM is optimal */
  free(e);
  RUN("--no-learn"); /* cached now: runs it */
  e = read_file(errp, &n);
  cr_expect(strstr(e, "learning") == NULL, "%s", e);
  free(e);
  write_file(path, "{\"format\": \"canopy-fsm\"", 23);
  RUN("");
  e = read_file(errp, &n);
  cr_expect(strstr(e, "ignoring the cached policy") && strstr(e, "learning"),
            "%s", e);
  free(e);
  RUN("--encoding base"); /* the file is for sort: stale */
  e = read_file(errp, &n);
  cr_expect(strstr(e, "ignoring the cached policy") && strstr(e, "learning"),
            "%s", e);
  free(e);
  cn_fsm *p = NULL;
  cn_err err;
  cr_expect_eq(cn_policy_cache_load(m, cache, CN_FSM_ENC_BASE, &p, &err),
               CN_CACHE_HIT, "%s", err.msg);
  cn_fsm_free(p);
  cn_model_free(m);
  tu_rmdir(dir);
}

/* Only the order changes: outputs under the learned policy equal the
 * unbatched ones (policy none) to 1e-5. */
static json_t *run_all(const cn_model *m, const json_t *insts,
                       const cn_fsm *p, long long *batches) {
  cn_backend_ctx *bk = tu_cpu();
  size_t n = json_array_size(insts);
  cn_instance **in = calloc(n, sizeof(*in));
  cn_run *r = cn_run_new(m, bk);
  cn_err err;
  cn_err_clear(&err);
  for (size_t i = 0; i < n; i++) {
    cr_assert_eq(cn_instance_parse(m, json_array_get(insts, i), NULL, 0,
                                   &in[i], &err), 0);
    cr_assert_eq(cn_run_add(r, in[i], CN_OUT_ALL, 0), (int)i);
  }
  cr_assert_eq(p ? cn_run_exec_fsm(r, p, &err)
                 : cn_run_exec(r, CN_POLICY_NONE, &err), 0, "%s", err.msg);
  json_t *outs = json_array();
  for (size_t i = 0; i < n; i++)
    json_array_append_new(outs, cn_run_output(r, (int)i));
  cn_run_stats st;
  cn_run_get_stats(r, &st);
  *batches = st.policy_batches; /* before the memory order (docs/memory.md) */
  cn_run_free(r);
  for (size_t i = 0; i < n; i++) cn_instance_free(in[i]);
  free(in);
  cn_backend_close(bk);
  return outs;
}

Test(fsm, outputs_equal_policy_none, .timeout = 60) {
  const char *fams[] = {"treelstm", "treelstm-2type"};
  for (int k = 0; k < 2; k++) {
    char dir[256];
    cn_model *m = tu_model(fams[k], 16, 16, "trees-binary.jsonl", dir,
                           sizeof(dir));
    json_t *insts = tu_data_lines("trees-binary.jsonl", 64);
    cn_graph_set *gs = graphs_of(m, insts);
    cn_fsm *p = train(m, gs, CN_FSM_ENC_SORT, 0); /* the FSM itself */
    long long bn, bf, lb;
    json_t *a = run_all(m, insts, NULL, &bn), *b = run_all(m, insts, p, &bf);
    cr_expect_leq(tu_json_maxdiff(a, b), 1e-5, "%s", fams[k]);
    cr_expect_eq(bf, cn_graph_set_batches(gs, CN_POLICY_FSM, p, &lb));
    cr_expect_lt(bf, bn);
    json_decref(a);
    json_decref(b);
    json_decref(insts);
    cn_fsm_free(p);
    cn_graph_set_free(gs);
    cn_model_free(m);
    tu_rmdir(dir);
  }
}
