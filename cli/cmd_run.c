/* cmd_run.c - `canopy run`: a model over a JSONL file, in runs of N
 * consecutive instances, one output line per input line in input order.
 *
 * This is the batch front end: the same core path the daemon uses (parse,
 * join a run, plan, execute, format), without HTTP, so its outputs and its
 * summary line are what the daemon would answer for the same instances.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends.h"
#include "canopy_core.h"
#include "cli.h"
#include "cmd_policy.h"
#include "config.h"

#define DUMP_FLAGS (JSON_COMPACT | JSON_REAL_PRECISION(9))

typedef struct run_opts {
  const char *model, *input, *backend;
  unsigned flags;
  cn_policy_kind policy;
  cn_layout layout;
  long long batch, threads, max_decode_len;
  const char *policy_cache;  /* --policy-cache (NULL: the default)       */
  cn_fsm_encoding encoding;  /* --encoding, for --policy fsm            */
  bool no_learn;             /* --no-learn: a cache miss is an error     */
  cn_fsm *fsm;               /* --policy fsm: cached or learned here    */
  char *slurped;             /* stdin, kept to learn from and then run  */
  cn_config cfg;
} run_opts;

typedef struct totals {
  long long instances, errors, batches, lower_bound, kernels, vertices;
  size_t gather_bytes, cell_bytes, arena_peak;
} totals;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void run_usage(FILE *f) {
  fprintf(f,
          "usage: canopy run --model DIR --input FILE.jsonl [options]\n"
          "\n"
          "Runs the model over every line of FILE.jsonl (one INSTANCE object a "
          "line, as in\ndocs/api.md; '-' reads stdin) and prints one JSON "
          "output object a line, in\ninput order, then a JSON summary as the "
          "last line on stderr. Model directories:\ndocs/models.md.\n"
          "\n"
          "  --outputs root|all    tree families: the root only, or every "
          "node (default root)\n"
          "  --return-hidden       also return hidden vectors (\"h\")\n"
          "  --policy P            none | depth | agenda | sufficient | "
          "lookahead |\n"
          "                        lookahead2 | plan | fsm\n"
          "                        (default agenda)\n"
          "  --policy-cache DIR    where --policy fsm finds (or, with none "
          "cached,\n"
          "                        learns from the input and stores) the "
          "model's policy\n"
          "                        (default: see canopy policy --help)\n"
          "  --no-learn            --policy fsm: fail when no valid policy is "
          "cached\n"
          "                        instead of learning one from the input "
          "(for\n"
          "                        measurements on held-out data)\n"
          "  --encoding E          base | max | sort | bound: the FSM's state "
          "(default bound)\n"
          "  --plan-width N        --policy plan: the beam search's width "
          "(default 16)\n"
          "  --layout L            fused | naive | pq: hand-written cell "
          "kernels, or the\n"
          "                        cells compiled from the op IR with every "
          "variable in its\n"
          "                        own buffer (naive) or laid out by the "
          "PQ-tree (default fused)\n"
          "  --batch N             instances per run (default 64)\n"
          "  --backend B           cpu | cuda (default cpu)\n"
          "  --threads N           OpenBLAS threads (default: OpenBLAS's own)\n"
          "  --max-decode-len N    lstm-nmt: decode at most N steps (below the "
          "model's cap)\n"
          "limits:\n");
  cn_config_usage(f);
  fprintf(f,
          "\nexit status: 0 all lines ok; 1 could not start; 2 some lines "
          "were refused\n(each such line gets an error object on stdout and "
          "a note on stderr).\n");
}

static int parse_args(int argc, char **argv, run_opts *o) {
  const char *v;
  int m;
  long long x;
  o->backend = "cpu";
  o->policy = CN_POLICY_AGENDA;
  o->batch = 64;
  o->encoding = CN_FSM_ENC_BOUND;
  cn_config_defaults(&o->cfg);
  cn_err err;
  cn_err_clear(&err);
  if (cn_config_from_env(&o->cfg, &err) != 0) {
    fprintf(stderr, "canopy run: %s\n", err.msg);
    return -1;
  }
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      run_usage(stdout);
      exit(0);
    } else if (strcmp(a, "--return-hidden") == 0) {
      o->flags |= CN_OUT_HIDDEN;
    } else if (strcmp(a, "--no-learn") == 0) {
      o->no_learn = true;
    } else if ((m = cn__flag_value(argc, argv, &i, "--model", &v)) != 0) {
      if (m < 0) return -1;
      o->model = v;
    } else if ((m = cn__flag_value(argc, argv, &i, "--input", &v)) != 0) {
      if (m < 0) return -1;
      o->input = v;
    } else if ((m = cn__flag_value(argc, argv, &i, "--backend", &v)) != 0) {
      if (m < 0) return -1;
      o->backend = v;
    } else if ((m = cn__flag_value(argc, argv, &i, "--outputs", &v)) != 0) {
      if (m < 0) return -1;
      if (strcmp(v, "all") == 0)
        o->flags |= CN_OUT_ALL;
      else if (strcmp(v, "root") != 0) {
        fprintf(stderr, "canopy run: --outputs must be root or all\n");
        return -1;
      }
    } else if ((m = cn__flag_value(argc, argv, &i, "--policy", &v)) != 0) {
      if (m < 0) return -1;
      if (cn_policy_parse(v, &o->policy) != 0) {
        fprintf(stderr,
                "canopy run: unknown --policy '%s' (none, depth, agenda, "
                "sufficient, lookahead, lookahead2, plan, fsm)\n",
                v);
        return -1;
      }
    } else if ((m = cn__flag_value(argc, argv, &i, "--layout", &v)) != 0) {
      if (m < 0 || cn_layout_parse(v, &o->layout) != 0) {
        fprintf(stderr, "canopy run: --layout must be fused, naive or pq\n");
        return -1;
      }
    } else if ((m = cn__flag_value(argc, argv, &i, "--policy-cache", &v)) !=
               0) {
      if (m < 0) return -1;
      o->policy_cache = v;
    } else if ((m = cn__flag_value(argc, argv, &i, "--encoding", &v)) != 0) {
      if (m < 0 || cn_fsm_encoding_parse(v, &o->encoding) != 0) {
        fprintf(stderr,
                "canopy run: --encoding must be base, max, sort or bound\n");
        return -1;
      }
    } else if ((m = cn__flag_value(argc, argv, &i, "--batch", &v)) != 0) {
      if (m < 0 || cn__parse_int("--batch", v, 1, 1 << 20, &o->batch))
        return -1;
    } else if ((m = cn__flag_value(argc, argv, &i, "--max-decode-len", &v)) !=
               0) {
      if (m < 0 ||
          cn__parse_int("--max-decode-len", v, 1, 1 << 20, &o->max_decode_len))
        return -1;
    } else if ((m = cn__flag_value(argc, argv, &i, "--threads", &v)) != 0) {
      if (m < 0 || cn__parse_int("--threads", v, 1, 1024, &x)) return -1;
      o->threads = x;
    } else if (strncmp(a, "--", 2) == 0 && i + 1 < argc &&
               cn_config_find(a + 2) != NULL) {
      if (cn_config_set(&o->cfg, a + 2, argv[++i], &err) != 0) {
        fprintf(stderr, "canopy run: %s\n", err.msg);
        return -1;
      }
    } else {
      fprintf(stderr, "canopy run: unknown option '%s' (see --help)\n", a);
      return -1;
    }
  }
  if (o->model == NULL || o->input == NULL) {
    fprintf(stderr, "canopy run: --model and --input are required\n\n");
    run_usage(stderr);
    return -1;
  }
  return 0;
}

/* One line's state inside a chunk: its parsed instance, or its error. */
typedef struct line {
  cn_instance *inst;
  int slot;
  cn_err err;
  long long lineno;
} line;

static void print_error(const line *l) {
  json_t *e = cn_err_to_json(&l->err);
  char *s = json_dumps(e, DUMP_FLAGS);
  puts(s);
  free(s);
  json_decref(e);
  fprintf(stderr, "canopy run: line %lld: %s: %s\n", l->lineno,
          cn_err_code(l->err.code), l->err.msg);
}

/* Runs one chunk of lines together and prints them in order. */
static int run_chunk(const run_opts *o, const cn_model *m, cn_backend_ctx *bk,
                     line *ls, int n, totals *tot) {
  int rc = 0;
  cn_run *r = cn_run_new(m, bk);
  if (r == NULL) return -1;
  cn_run_set_layout(r, o->layout);
  cn_run_set_plan_width(r, o->cfg.serve.plan_width);
  for (int i = 0; i < n; i++) {
    if (ls[i].inst == NULL) continue;
    ls[i].slot = cn_run_add(r, ls[i].inst, o->flags, (int)o->max_decode_len);
    if (ls[i].slot < 0) {
      cn_err_set(&ls[i].err, ls[i].slot, "could not add the instance");
      cn_instance_free(ls[i].inst);
      ls[i].inst = NULL;
    }
  }
  cn_err err;
  cn_err_clear(&err);
  if ((o->fsm != NULL ? cn_run_exec_fsm(r, o->fsm, &err)
                      : cn_run_exec(r, o->policy, &err)) != 0) {
    fprintf(stderr, "canopy run: %s\n", err.msg);
    rc = -1;
    goto out;
  }
  cn_run_stats st;
  cn_run_get_stats(r, &st);
  tot->batches += st.batches;
  tot->lower_bound += st.lower_bound;
  tot->kernels += st.kernels;
  tot->vertices += st.vertices;
  tot->gather_bytes += st.gather_bytes;
  tot->cell_bytes += st.cell_bytes;
  if (st.arena_bytes > tot->arena_peak) tot->arena_peak = st.arena_bytes;
  for (int i = 0; i < n; i++) {
    if (ls[i].inst == NULL) {
      print_error(&ls[i]);
      tot->errors++;
      continue;
    }
    json_t *obj = cn_run_output(r, ls[i].slot);
    char *s = json_dumps(obj, DUMP_FLAGS);
    puts(s);
    free(s);
    json_decref(obj);
    tot->instances++;
  }
out:
  cn_run_free(r);
  for (int i = 0; i < n; i++) cn_instance_free(ls[i].inst);
  return rc;
}

/* --policy fsm: the cached policy, else one learned from the input's
 * first runs (stdin is read into memory first so it can be read twice). */
static int load_policy(run_opts *o, const cn_model *m, cn_backend_ctx *bk,
                       FILE **in) {
  if (cn__policy_cached(m, o->policy_cache, "canopy run", o->encoding,
                        &o->fsm) == 0)
    return 0;
  if (o->no_learn) {
    fprintf(stderr, "canopy run: no cached %s policy for this model, and "
            "--no-learn: train one first (canopy policy train --model %s "
            "--input FILE --encoding %s%s%s)\n",
            cn_fsm_encoding_name(o->encoding), o->model,
            cn_fsm_encoding_name(o->encoding),
            o->policy_cache ? " --policy-cache " : "",
            o->policy_cache ? o->policy_cache : "");
    return -1;
  }
  fprintf(stderr, "canopy run: no cached %s policy for this model: learning "
          "one from the input\n", cn_fsm_encoding_name(o->encoding));
  FILE *t = NULL;
  if (*in == stdin) {
    size_t len = 0;
    FILE *mem = open_memstream(&o->slurped, &len);
    char chunk[65536];
    size_t k;
    while (mem != NULL && (k = fread(chunk, 1, sizeof(chunk), stdin)) > 0)
      fwrite(chunk, 1, k, mem);
    if (mem == NULL || fclose(mem) != 0) return -1;
    *in = fmemopen(o->slurped, len ? len : 1, "r");
    t = fmemopen(o->slurped, len ? len : 1, "r");
  } else {
    t = fopen(o->input, "r");
  }
  if (*in == NULL || t == NULL) {
    if (t != NULL) fclose(t);
    fprintf(stderr, "canopy run: cannot read %s again to learn from it\n",
            o->input);
    return -1;
  }
  cn_fsm_opts fo;
  cn_fsm_opts_default(&fo);
  fo.encoding = o->encoding;
  int rc = cn__policy_learn(m, bk, o->policy_cache, "canopy run", &fo, t,
                            o->flags, (int)o->batch, 16, &o->cfg.limits,
                            &o->fsm);
  fclose(t);
  return rc;
}

int cn_cmd_run(int argc, char **argv) {
  run_opts o;
  memset(&o, 0, sizeof(o));
  if (parse_args(argc, argv, &o) != 0) return 1;

  int status = 1;
  cn_model *m = NULL;
  cn_backend_ctx *bk = NULL;
  FILE *in = NULL;
  line *ls = NULL;
  char *buf = NULL;
  size_t cap = 0;
  cn_err err;
  cn_err_clear(&err);

  if (cn_model_load(o.model, &m, &err) != 0) {
    fprintf(stderr, "canopy run: %s\n", err.msg);
    goto out;
  }
  if (cn_backend_open(o.backend, 0, &bk, &err) != 0) {
    fprintf(stderr, "canopy run: %s\n", err.msg);
    goto out;
  }
  if (o.threads > 0) cn_backend_cpu_threads((int)o.threads);
  in = strcmp(o.input, "-") == 0 ? stdin : fopen(o.input, "r");
  if (in == NULL) {
    fprintf(stderr, "canopy run: cannot open %s: %m\n", o.input);
    goto out;
  }
  if (o.policy == CN_POLICY_FSM && load_policy(&o, m, bk, &in) != 0) goto out;
  ls = calloc((size_t)o.batch, sizeof(line));
  if (ls == NULL) goto out;

  totals tot = {0};
  double t0 = now_s();
  long long lineno = 0;
  int n = 0;
  ssize_t len;
  bool failed = false;
  for (;;) {
    len = getline(&buf, &cap, in);
    if (len >= 0) {
      lineno++;
      if (len > 0 && buf[len - 1] == '\n') buf[--len] = '\0';
      line *l = &ls[n++];
      memset(l, 0, sizeof(*l));
      cn_err_clear(&l->err);
      l->lineno = lineno;
      json_error_t je;
      json_t *j = json_loadb(buf, (size_t)len, JSON_REJECT_DUPLICATES, &je);
      if (j == NULL) {
        cn_err_set(&l->err, CN_E_BAD_JSON, "line %lld is not JSON: %s",
                   lineno, je.text);
        l->err.offset = je.position;
        l->err.instance = (int)(lineno - 1);
      } else {
        cn_instance_parse(m, j, &o.cfg.limits, (int)(lineno - 1), &l->inst,
                          &l->err);
        json_decref(j);
      }
    }
    if (n == o.batch || (len < 0 && n > 0)) {
      if (run_chunk(&o, m, bk, ls, n, &tot) != 0) failed = true;
      n = 0;
      if (failed) break;
    }
    if (len < 0) break;
  }
  double secs = now_s() - t0;
  if (failed) goto out;
  fflush(stdout);
  fprintf(stderr,
          "{\"instances\": %lld, \"errors\": %lld, \"batches\": %lld, "
          "\"lower_bound\": %lld, \"seconds\": %.6f, "
          "\"instances_per_s\": %.1f, \"policy\": \"%s\", \"batch\": %lld, "
          "\"layout\": \"%s\", \"vertices\": %lld, \"kernels\": %lld, "
          "\"cell_bytes_copied\": %zu, \"gather_bytes_copied\": %zu, "
          "\"arena_bytes_peak\": %zu}\n",
          tot.instances, tot.errors, tot.batches, tot.lower_bound, secs,
          secs > 0 ? (double)tot.instances / secs : 0.0,
          cn_policy_name(o.policy), o.batch, cn_layout_name(o.layout),
          tot.vertices, tot.kernels, tot.cell_bytes, tot.gather_bytes,
          tot.arena_peak);
  status = tot.errors > 0 ? 2 : 0;
out:
  free(buf);
  free(ls);
  if (in != NULL && in != stdin) fclose(in);
  cn_backend_close(bk);
  cn_fsm_free(o.fsm);
  cn_model_free(m);
  free(o.slurped);
  return status;
}
