/* cmd_policy.c - `canopy policy`: learn a model's FSM batching policy
 * (ED-Batch §2) from a JSONL file of instances and keep it in the policy
 * cache that `canopy run --policy fsm` and `canopy serve` read; or show the
 * cached one. Also the helpers `run` uses to load-or-learn a policy.
 */
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends.h"
#include "canopy_core.h"
#include "cli.h"
#include "cmd_policy.h"

int cn__policy_graphs(const cn_model *m, cn_backend_ctx *bk, FILE *in,
                      unsigned flags, int batch, int max_runs,
                      const cn_limits *lim, cn_graph_set **out,
                      long long *skipped) {
  int rc = CN_E_NOMEM, n = 0;
  char *buf = NULL;
  size_t cap = 0;
  ssize_t len;
  cn_instance **insts = calloc((size_t)batch, sizeof(*insts));
  cn_graph_set *gs = cn_graph_set_new(cn_model_n_types(m), max_runs);
  *out = NULL;
  *skipped = 0;
  if (insts == NULL || gs == NULL) goto out;
  do {
    len = getline(&buf, &cap, in);
    if (len > 0) {
      json_t *j = json_loadb(buf, (size_t)len, 0, NULL);
      cn_err err;
      cn_err_clear(&err);
      if (j == NULL || cn_instance_parse(m, j, lim, 0, &insts[n], &err) != 0)
        ++*skipped;
      else
        n++;
      json_decref(j);
    }
    if (n == batch || (len < 0 && n > 0)) {
      /* Executed (with agenda) when there is a backend: a graph that grows
       * while it runs (lstm-nmt decoding) is complete only afterwards. */
      cn_run *r = cn_run_new(m, bk);
      cn_err err;
      cn_err_clear(&err);
      if (r == NULL) goto out;
      for (int i = 0; i < n; i++)
        if (cn_run_add(r, insts[i], flags, 0) < 0) ++*skipped;
      rc = bk != NULL ? cn_run_exec(r, CN_POLICY_AGENDA, &err) : 0;
      if (rc == 0) rc = cn_graph_set_add_run(gs, r);
      cn_run_free(r);
      for (int i = 0; i < n; i++) cn_instance_free(insts[i]);
      n = 0;
      if (rc != 0) goto out;
      if (cn_graph_set_count(gs) == max_runs) break;
    }
  } while (len >= 0);
  rc = 0;
  *out = gs;
  gs = NULL;
out:
  for (int i = 0; i < n; i++) cn_instance_free(insts[i]);
  free(insts);
  free(buf);
  cn_graph_set_free(gs);
  return rc;
}

int cn__policy_learn(const cn_model *m, cn_backend_ctx *bk, const char *cache,
                     const char *who, const cn_fsm_opts *o, FILE *in,
                     unsigned flags, int batch, int max_runs,
                     const cn_limits *lim, cn_fsm **out) {
  cn_err err;
  cn_err_clear(&err);
  cn_graph_set *gs = NULL;
  long long skipped = 0;
  *out = NULL;
  if (cn__policy_graphs(m, bk, in, flags, batch, max_runs, lim, &gs,
                        &skipped)) {
    fprintf(stderr, "%s: could not build the training graphs\n", who);
    return -1;
  }
  int rc = cn_fsm_train(m, gs, o, out, &err);
  cn_graph_set_free(gs);
  if (rc != 0) {
    fprintf(stderr, "%s: %s\n", who, err.msg);
    return -1;
  }
  long long lb, b = cn_fsm_train_batches(*out, &lb);
  json_t *d = cn_fsm_describe(*out);
  fprintf(stderr,
          "%s: learned a %s batching policy for %s on %d graphs (%lld lines "
          "skipped) in %.3f s, %lld iterations: %lld batches, lower bound "
          "%lld; executes %s\n",
          who, cn_fsm_encoding_name(o->encoding), cn_model_family(m),
          (int)json_integer_value(json_object_get(d, "trained_on_graphs")),
          skipped, json_real_value(json_object_get(d, "train_seconds")),
          (long long)json_integer_value(json_object_get(d, "iterations")), b,
          lb, json_string_value(json_object_get(d, "executes")));
  json_decref(d);
  char path[PATH_MAX];
  if (cn_policy_cache_store(m, cache, *out, &err) != 0)
    fprintf(stderr, "%s: warning: policy not cached: %s\n", who, err.msg);
  else if (cn_policy_cache_path(m, cache, path, sizeof(path)) == 0)
    fprintf(stderr, "%s: cached the policy in %s\n", who, path);
  return 0;
}

int cn__policy_cached(const cn_model *m, const char *cache, const char *who,
                      cn_fsm_encoding enc, cn_fsm **out) {
  cn_err err;
  cn_err_clear(&err);
  int st = cn_policy_cache_load(m, cache, enc, out, &err);
  if (st == CN_CACHE_STALE || st == CN_CACHE_CORRUPT)
    fprintf(stderr, "%s: warning: ignoring the cached policy: %s\n", who,
            err.msg);
  return st == CN_CACHE_HIT ? 0 : -1;
}

static void policy_usage(FILE *f) {
  fprintf(f,
    "usage: canopy policy train --model DIR --input FILE.jsonl [options]\n"
    "       canopy policy show --model DIR [--encoding E] [--policy-cache DIR]\n"
    "       canopy policy optimum --model DIR --input FILE.jsonl [--outputs O]\n"
    "                             [--batch N] [--train-runs N] [--budget N]\n"
    "                             [--beam W]\n"
    "\n"
    "train learns the model's FSM batching policy (ED-Batch §2: tabular\n"
    "Q-learning, reward eq. 1) on the run graphs of FILE.jsonl and stores it\n"
    "in the policy cache read by `canopy run --policy fsm` and `canopy "
    "serve`;\nit prints the policy's description (JSON) on stdout. show "
    "prints the cached one.\noptimum searches (IDA*) for the fewest batches "
    "each run graph of FILE.jsonl can run in, and prints one JSON line a graph\n"
    "(lower_bound; optimum_lower = optimum_upper when exact, else a proven\n"
    "lower bound and the best schedule known; depth, agenda, sufficient,\n"
    "lookahead, lookahead2, plan, beam) and a total: how far any policy could still\nimprove.\n"
    "\n"
    "  --outputs root|all     tree families: graphs with root or all outputs"
    " (default root)\n"
    "  --batch N              instances per training graph (default 64)\n"
    "  --train-runs N         at most N training graphs (default 16)\n"
    "  --encoding E           base | max | sort: the state, ED-Batch §2.3; "
    "bound:\n"
    "                         max plus the types whose batch lowers the "
    "bound on\n"
    "                         what is left the most (default bound)\n"
    "  --iterations N         training episodes (default 1000)\n"
    "  --eval-every K         greedy evaluation interval; the best table is "
    "kept,\n"
    "                         and training stops at the lower bound "
    "(default 50)\n"
    "  --nstep N              n-step bootstrapping (default 4)\n"
    "  --alpha A              eq. 1's alpha (default 0.5)\n"
    "  --learning-rate L      (default 0.2)\n"
    "  --gamma G              discount (default 1.0)\n"
    "  --epsilon-start E      exploration, decayed linearly (default 0.5)\n"
    "  --epsilon-end E        (default 0.02)\n"
    "  --polish-rounds N      after Q-learning, rounds of coordinate "
    "descent on the\n"
    "                         greedy table, scored on the sample (default 8; "
    "0: off)\n"
    "  --seed S               (default 1)\n"
    "  --time-limit S         seconds, 0: none (default 60)\n"
    "  --no-fallback          keep the FSM even where agenda or depth "
    "launches fewer\n"
    "                         batches on the training graphs\n"
    "  --budget N             optimum: states to expand per graph before "
    "settling\n"
    "                         for proven bounds (default 20000000)\n"
    "  --beam W               optimum: where the search does not finish, also "
    "a\n"
    "                         beam search of width W (default 1024; 0: off)\n"
    "  --policy-cache DIR     (default $CANOPY_POLICY_CACHE, else\n"
    "                         $XDG_CACHE_HOME/canopy/policies, else\n"
    "                         ~/.cache/canopy/policies)\n");
}

static int parse_double(const char *flag, const char *s, double lo, double hi,
                        double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno != 0 || end == s || *end != '\0' || !(v >= lo && v <= hi)) {
    fprintf(stderr, "canopy policy: %s: '%s' is not a number in [%g, %g]\n",
            flag, s, lo, hi);
    return -1;
  }
  *out = v;
  return 0;
}

typedef struct policy_args {
  const char *model, *input, *cache;
  unsigned flags;
  long long batch, runs, budget, beam;
  cn_fsm_opts o;
} policy_args;

static int parse_args(int argc, char **argv, policy_args *a) {
  const char *v;
  long long x;
  int m;
  a->batch = 64;
  a->runs = 16;
  a->budget = 20000000;
  a->beam = 1024;
  cn_fsm_opts_default(&a->o);
  for (int i = 2; i < argc; i++) {
#define FLAG(name) ((m = cn__flag_value(argc, argv, &i, name, &v)) != 0)
#define INT(name, lo, hi, dst)                                        \
  if (FLAG(name)) {                                                   \
    if (m < 0 || cn__parse_int(name, v, lo, hi, &x)) return -1;       \
    dst = x;                                                          \
    continue;                                                         \
  }
#define DBL(name, lo, hi, dst)                                        \
  if (FLAG(name)) {                                                   \
    if (m < 0 || parse_double(name, v, lo, hi, &dst)) return -1;      \
    continue;                                                         \
  }
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      policy_usage(stdout);
      exit(0);
    }
    if (strcmp(argv[i], "--no-fallback") == 0) {
      a->o.fallback = 0;
      continue;
    }
    if (FLAG("--model")) { if (m < 0) return -1; a->model = v; continue; }
    if (FLAG("--input")) { if (m < 0) return -1; a->input = v; continue; }
    if (FLAG("--policy-cache")) {
      if (m < 0) return -1;
      a->cache = v;
      continue;
    }
    if (FLAG("--outputs")) {
      if (m < 0 || (strcmp(v, "all") != 0 && strcmp(v, "root") != 0)) {
        fprintf(stderr, "canopy policy: --outputs must be root or all\n");
        return -1;
      }
      if (strcmp(v, "all") == 0) a->flags |= CN_OUT_ALL;
      continue;
    }
    if (FLAG("--encoding")) {
      if (m < 0 || cn_fsm_encoding_parse(v, &a->o.encoding) != 0) {
        fprintf(stderr,
                "canopy policy: --encoding: base, max, sort or bound\n");
        return -1;
      }
      continue;
    }
    INT("--batch", 1, 1 << 20, a->batch)
    INT("--train-runs", 1, 1 << 16, a->runs)
    INT("--budget", 1, LLONG_MAX, a->budget)
    INT("--beam", 0, 1 << 16, a->beam)
    INT("--iterations", 0, 100000000, a->o.iterations)
    INT("--eval-every", 1, 100000000, a->o.eval_every)
    INT("--nstep", 1, 1000, a->o.nstep)
    INT("--polish-rounds", 0, 1000, a->o.polish_rounds)
    INT("--seed", 0, LLONG_MAX, a->o.seed)
    DBL("--alpha", 0, 100, a->o.alpha)
    DBL("--learning-rate", 0, 1, a->o.learning_rate)
    DBL("--gamma", 0, 1, a->o.gamma)
    DBL("--epsilon-start", 0, 1, a->o.epsilon_start)
    DBL("--epsilon-end", 0, 1, a->o.epsilon_end)
    DBL("--time-limit", 0, 1e9, a->o.time_limit_s)
    fprintf(stderr, "canopy policy: unknown option '%s' (see --help)\n",
            argv[i]);
    return -1;
  }
  return 0;
}

/* `canopy policy optimum`: per graph, the search's result beside the
 * heuristics; a total line last. */
static const char *const opt_fields[] = {
    "lower_bound", "optimum_lower", "optimum_upper", "depth", "agenda",
    "sufficient", "lookahead", "lookahead2", "plan", "beam", "states"};
enum { N_OPT_FIELDS = sizeof(opt_fields) / sizeof(opt_fields[0]) };

static void opt_values(const cn_optimum *o, long long *v) {
  long long x[N_OPT_FIELDS] = {
      o->lower_bound, o->lower, o->upper, o->policy[CN_POLICY_DEPTH],
      o->policy[CN_POLICY_AGENDA], o->policy[CN_POLICY_SUFFICIENT],
      o->policy[CN_POLICY_LOOKAHEAD], o->policy[CN_POLICY_LOOKAHEAD2],
      o->policy[CN_POLICY_PLAN], o->beam, o->nodes};
  memcpy(v, x, sizeof(x));
}

static void print_json(json_t *j) {
  char *s = json_dumps(j, JSON_COMPACT);
  if (s != NULL) puts(s);
  fflush(stdout);
  free(s);
  json_decref(j);
}

static int policy_optimum(const cn_model *m, cn_backend_ctx *bk, FILE *in,
                          const policy_args *a) {
  cn_graph_set *gs = NULL;
  long long skipped = 0, tot[N_OPT_FIELDS] = {0}, v[N_OPT_FIELDS];
  if (cn__policy_graphs(m, bk, in, a->flags, (int)a->batch, (int)a->runs,
                        NULL, &gs, &skipped)) {
    fprintf(stderr, "canopy policy: could not build the run graphs\n");
    return -1;
  }
  int exact = 1, rc = 0;
  for (int i = 0; i < cn_graph_set_count(gs); i++) {
    cn_optimum o;
    if (cn_graph_set_optimum(gs, i, a->budget, (int)a->beam, &o) != 0) {
      fprintf(stderr, "canopy policy: out of memory in the search\n");
      rc = -1;
      break;
    }
    json_t *j = json_pack("{sisb}", "graph", i, "exact", o.exact);
    opt_values(&o, v);
    for (int k = 0; k < N_OPT_FIELDS; k++) {
      json_object_set_new(j, opt_fields[k], json_integer(v[k]));
      tot[k] += v[k];
    }
    print_json(j);
    exact &= o.exact;
  }
  if (rc == 0) {
    json_t *j = json_pack("{sisIsb}", "graphs", cn_graph_set_count(gs),
                          "skipped_lines", (json_int_t)skipped, "exact",
                          exact);
    for (int k = 0; k < N_OPT_FIELDS; k++)
      json_object_set_new(j, opt_fields[k], json_integer(tot[k]));
    print_json(j);
  }
  cn_graph_set_free(gs);
  return rc;
}

int cn_cmd_policy(int argc, char **argv) {
  if (argc < 2 || strcmp(argv[1], "--help") == 0 ||
      strcmp(argv[1], "-h") == 0) {
    policy_usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 1 : 0;
  }
  bool optimum = strcmp(argv[1], "optimum") == 0;
  bool train = optimum || strcmp(argv[1], "train") == 0;
  if (!train && strcmp(argv[1], "show") != 0) {
    fprintf(stderr, "canopy policy: unknown subcommand '%s'\n\n", argv[1]);
    policy_usage(stderr);
    return 1;
  }
  policy_args a;
  memset(&a, 0, sizeof(a));
  if (parse_args(argc, argv, &a) != 0) return 1;
  if (a.model == NULL || (train && a.input == NULL)) {
    fprintf(stderr, "canopy policy: --model%s required\n\n",
                    train ? " and --input are" : " is");
    policy_usage(stderr);
    return 1;
  }
  int status = 1;
  cn_model *m = NULL;
  cn_fsm *p = NULL;
  cn_backend_ctx *bk = NULL;
  FILE *in = NULL;
  cn_err err;
  cn_err_clear(&err);
  if (cn_model_load(a.model, &m, &err) != 0) {
    fprintf(stderr, "canopy policy: %s\n", err.msg);
    goto out;
  }
  if (train) {
    in = strcmp(a.input, "-") == 0 ? stdin : fopen(a.input, "r");
    if (in == NULL) {
      fprintf(stderr, "canopy policy: cannot open %s: %s\n", a.input,
              strerror(errno));
      goto out;
    }
    if (cn_backend_open("cpu", 0, &bk, &err) != 0) {
      fprintf(stderr, "canopy policy: %s\n", err.msg);
      goto out;
    }
    if (optimum) {
      status = policy_optimum(m, bk, in, &a) == 0 ? 0 : 1;
      goto out;
    }
    if (cn__policy_learn(m, bk, a.cache, "canopy policy", &a.o, in, a.flags,
                         (int)a.batch, (int)a.runs, NULL, &p) != 0)
      goto out;
  } else if (cn__policy_cached(m, a.cache, "canopy policy", a.o.encoding,
                               &p) != 0) {
    fprintf(stderr, "canopy policy: no cached %s policy for %s\n",
            cn_fsm_encoding_name(a.o.encoding), a.model);
    goto out;
  }
  json_t *d = cn_fsm_describe(p);
  char *s = json_dumps(d, JSON_COMPACT | JSON_REAL_PRECISION(6));
  puts(s);
  free(s);
  json_decref(d);
  status = 0;
out:
  if (in != NULL && in != stdin) fclose(in);
  cn_fsm_free(p);
  cn_backend_close(bk);
  cn_model_free(m);
  return status;
}
