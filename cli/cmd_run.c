/* cmd_run.c - `canopy run`: a model over a JSONL file, in runs of N
 * consecutive instances, one output line per input line in input order.
 *
 * This is the batch front end: the same core path the daemon uses (parse,
 * join a run, plan, execute, format), without HTTP, so its outputs and its
 * summary line are what the daemon would answer for the same instances.
 *
 * --jobs J computes J runs at once, one per thread:
 * GEMMs of 64-400 rows split badly across BLAS threads, whole runs split
 * perfectly. As in the daemon's workers (server/worker.c), the loaded
 * model is shared read-only (weights, vocabularies and compiled cells are
 * fixed at load) and each thread has its own backend context and its own
 * cn_run; each thread parses, computes and formats its chunk of lines into
 * memory, and the main thread reads ahead and prints chunks in input order
 * (run_chunks.c, run_pool.c), so the output is byte-equal to --jobs 1.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backends.h"
#include "canopy_core.h"
#include "cli.h"
#include "cmd_policy.h"
#include "config.h"
#include "run_chunks.h"

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
          "                        (default sufficient: the fastest "
          "measured on CPU,\n"
          "                        docs/policies.md)\n"
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
          "  --layout L            pq | naive: the cells compiled from the "
          "op IR laid out by\n"
          "                        the PQ-tree (default), or with every "
          "variable in its own\n"
          "                        buffer (naive); fused, the hand-written "
          "kernels pq replaced,\n"
          "                        is read as pq\n"
          "  --batch N             instances per run (default 64)\n"
          "  --backend B           cpu | cuda (default cpu)\n"
          "  --jobs N              runs computed at once, one per thread, "
          "each with its own\n"
          "                        backend context; output order is kept "
          "and equals\n"
          "                        --jobs 1 (default: the number of cores)\n"
          "  --threads N           threads splitting each product of a job (default: "
          "max(1,\n"
          "                        cores / jobs))\n"
          "  --max-decode-len N    lstm-nmt: decode at most N steps (below the "
          "model's cap)\n"
          "  --memory-budget B     plan each run so its arena (states and "
          "scratch) holds\n"
          "                        at most B bytes (KiB/MiB/GiB suffixes), with "
          "extra\n"
          "                        batches where needed; same outputs "
          "(docs/memory.md)\n"
          "  --no-arena-reuse      keep every vertex's state row to the end of "
          "its run\n"
          "                        instead of reusing it after its last reader "
          "(the\n"
          "                        arena before docs/memory.md; also "
          "CANOPY_ARENA_REUSE=0)\n"
          "limits:\n");
  cn_config_usage(f);
  fprintf(f,
          "\nexit status: 0 all lines ok; 1 could not start; 2 some lines "
          "were refused\n(each such line gets an error object on stdout and "
          "a note on stderr).\n");
}

/* The flags of `run` that name one of a few choices (--outputs, --policy,
 * --layout, --encoding): 1 when argv[*i] was one and its value was taken,
 * 0 when it is none of them, -1 (said on stderr) when its value is
 * missing or not a choice. */
static int choice_flag(int argc, char **argv, int *i, run_opts *o) {
  const char *v;
  int m;
  if ((m = cn__flag_value(argc, argv, i, "--outputs", &v)) != 0) {
    if (m < 0) return -1;
    if (strcmp(v, "all") == 0)
      o->flags |= CN_OUT_ALL;
    else if (strcmp(v, "root") != 0) {
      fprintf(stderr, "canopy run: --outputs must be root or all\n");
      return -1;
    }
  } else if ((m = cn__flag_value(argc, argv, i, "--policy", &v)) != 0) {
    if (m < 0) return -1;
    if (cn_policy_parse(v, &o->policy) != 0) {
      fprintf(stderr,
              "canopy run: unknown --policy '%s' (none, depth, agenda, "
              "sufficient, lookahead, lookahead2, plan, fsm)\n",
              v);
      return -1;
    }
  } else if ((m = cn__flag_value(argc, argv, i, "--layout", &v)) != 0) {
    if (m < 0 || cn_layout_parse(v, &o->layout) != 0) {
      fprintf(stderr, "canopy run: --layout must be pq or naive\n");
      return -1;
    }
  } else if ((m = cn__flag_value(argc, argv, i, "--encoding", &v)) != 0) {
    if (m < 0 || cn_fsm_encoding_parse(v, &o->encoding) != 0) {
      fprintf(stderr,
              "canopy run: --encoding must be base, max, sort or bound\n");
      return -1;
    }
  } else {
    return 0;
  }
  return 1;
}

/* The flags of `run` that take a whole number (--batch, --max-decode-len,
 * --jobs, --threads), as choice_flag answers. */
static int number_flag(int argc, char **argv, int *i, run_opts *o) {
  const char *v;
  int m;
  long long x;
  if ((m = cn__flag_value(argc, argv, i, "--batch", &v)) != 0) {
    if (m < 0 || cn__parse_int("--batch", v, 1, 1 << 20, &o->batch))
      return -1;
  } else if ((m = cn__flag_value(argc, argv, i, "--max-decode-len", &v)) !=
             0) {
    if (m < 0 ||
        cn__parse_int("--max-decode-len", v, 1, 1 << 20, &o->max_decode_len))
      return -1;
  } else if ((m = cn__flag_value(argc, argv, i, "--jobs", &v)) != 0) {
    if (m < 0 || cn__parse_int("--jobs", v, 1, 1024, &o->jobs)) return -1;
  } else if ((m = cn__flag_value(argc, argv, i, "--threads", &v)) != 0) {
    if (m < 0 || cn__parse_int("--threads", v, 1, 1024, &x)) return -1;
    o->threads = x;
  } else {
    return 0;
  }
  return 1;
}

static int parse_args(int argc, char **argv, run_opts *o) {
  const char *v;
  int m;
  o->backend = "cpu";
  o->policy = CN_POLICY_SUFFICIENT; /* docs/policies.md: fastest on CPU */
  o->batch = 64;
  o->encoding = CN_FSM_ENC_BOUND;
  cn_config_defaults(&o->cfg);
  cn_err err;
  cn_err_clear(&err);
  cn_config_flags seen; /* a limit given twice is refused, as by serve */
  memset(&seen, 0, sizeof(seen));
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
    } else if (strcmp(a, "--no-arena-reuse") == 0) {
      o->no_reuse = true;
    } else if ((m = cn__flag_value(argc, argv, &i, "--model", &v)) != 0) {
      if (m < 0) return -1;
      o->model = v;
    } else if ((m = cn__flag_value(argc, argv, &i, "--input", &v)) != 0) {
      if (m < 0) return -1;
      o->input = v;
    } else if ((m = cn__flag_value(argc, argv, &i, "--backend", &v)) != 0) {
      if (m < 0) return -1;
      o->backend = v;
    } else if ((m = cn__flag_value(argc, argv, &i, "--policy-cache", &v)) !=
               0) {
      if (m < 0) return -1;
      o->policy_cache = v;
    } else if ((m = choice_flag(argc, argv, &i, o)) != 0 ||
               (m = number_flag(argc, argv, &i, o)) != 0) {
      if (m < 0) return -1;
    } else if (strncmp(a, "--", 2) == 0 && i + 1 < argc &&
               cn_config_find(a + 2) != NULL) {
      if (cn_config_set_flag(&o->cfg, &seen, a + 2, argv[++i], &err) != 0) {
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
    char block[65536];
    size_t k;
    while (mem != NULL && (k = fread(block, 1, sizeof(block), stdin)) > 0)
      fwrite(block, 1, k, mem);
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

/* Product threads of a job: max(1, cores / jobs) unless asked (serve.c
 * does the same per worker); --jobs 1 gets every core. */
static void set_product_threads(const run_opts *o, int cores, int jobs) {
  if (o->threads > 0)
    cn_backend_cpu_threads((int)o->threads);
  else
    cn_backend_cpu_threads(cores / jobs > 1 ? cores / jobs : 1);
}

/* Every job's backend context opens before any input is read, so a
 * backend that cannot open stops here with its error. Job 0 uses bk.
 * *out is set as soon as it exists (the caller closes what opened). */
static int open_job_backends(const run_opts *o, cn_backend_ctx *bk,
                             int jobs, cn_backend_ctx ***out, cn_err *err) {
  cn_backend_ctx **job_bk = calloc((size_t)jobs, sizeof(*job_bk));
  *out = job_bk;
  if (job_bk == NULL) return -1;
  job_bk[0] = bk;
  for (int i = 1; i < jobs; i++) {
    if (cn_backend_open(o->backend, 0, &job_bk[i], err) != 0) {
      fprintf(stderr, "canopy run: job %d: %s\n", i, err->msg);
      return -1;
    }
  }
  return 0;
}

/* The summary line on stderr: one JSON object of the totals. */
static void print_summary(const run_opts *o, int jobs, const totals *tot,
                          double secs) {
  fprintf(stderr,
          "{\"instances\": %lld, \"errors\": %lld, \"batches\": %lld, "
          "\"lower_bound\": %lld, \"seconds\": %.6f, "
          "\"instances_per_s\": %.1f, \"policy\": \"%s\", \"batch\": %lld, "
          "\"jobs\": %d, "
          "\"layout\": \"%s\", \"vertices\": %lld, \"kernels\": %lld, "
          "\"cell_bytes_copied\": %zu, \"gather_bytes_copied\": %zu, "
          "\"arena_bytes_peak\": %zu, \"state_bytes_peak\": %zu, "
          "\"state_bytes_total\": %zu, \"memory_budget\": %lld, "
          "\"policy_batches\": %lld, "
          "\"runs\": %lld, \"device_syncs\": %lld, "
          "\"bytes_to_device\": %lld, \"bytes_to_host\": %lld, "
          "\"device_allocs\": %lld, \"launches\": %lld, "
          "\"copies_to_device\": %lld, \"parse_s\": %.6f, "
          "\"schedule_s\": %.6f, \"execute_s\": %.6f, "
          "\"output_s\": %.6f}\n",
          tot->instances, tot->errors, tot->batches, tot->lower_bound, secs,
          secs > 0 ? (double)tot->instances / secs : 0.0,
          cn_policy_name(o->policy), o->batch, jobs,
          cn_layout_name(o->layout), tot->vertices, tot->kernels,
          tot->cell_bytes, tot->gather_bytes, tot->arena_peak,
          tot->state_peak, tot->state_total, o->cfg.serve.memory_budget,
          tot->policy_batches, tot->runs, tot->syncs,
          tot->to_device, tot->to_host, tot->allocs, tot->launches,
          tot->copies, tot->parse_s, tot->schedule_s, tot->execute_s,
          tot->output_s);
}

/* `canopy run`: JSON lines in, one output line per input line, in order,
 * computed by --jobs jobs; the summary on stderr. Exit status 0, 2 when
 * any line was an error, 1 when the run could not go on. */
int cn_cmd_run(int argc, char **argv) {
  /* A batch job reuses its memory from run to run. glibc's moving
   * thresholds mapped each large per-run array afresh (a page fault per
   * 4 KiB touched, an munmap at free): 10-15% of a small model's host
   * time per run, the time the GPU path is bound by (docs/cuda.md). At
   * 256 MiB they stay in the heap for the next run. (The daemon keeps
   * 1 MiB, for an idle RSS that comes down: server/serve.c.) */
  cn_malloc_thresholds((size_t)256 << 20);
  run_opts o;
  memset(&o, 0, sizeof(o));
  if (parse_args(argc, argv, &o) != 0) return 1;

  int status = 1;
  cn_model *m = NULL;
  cn_backend_ctx *bk = NULL, **job_bk = NULL;
  FILE *in = NULL;
  cn_err err;
  cn_err_clear(&err);

  int cores = cn__cpu_count();
  int jobs = o.jobs > 0 ? (int)o.jobs : (int)cores;
  if (cn_model_load(o.model, &m, &err) != 0) {
    fprintf(stderr, "canopy run: %s\n", err.msg);
    goto out;
  }
  if (cn_backend_open(o.backend, 0, &bk, &err) != 0) {
    fprintf(stderr, "canopy run: %s\n", err.msg);
    goto out;
  }
  /* a budget under which not even the model's smallest instance runs
   * would refuse every line: refused here, naming the smallest that runs */
  long long floor = 0;
  if (o.cfg.serve.memory_budget > 0 &&
      cn_run_min_budget(m, bk, o.policy, o.layout,
                        o.cfg.serve.plan_width, &floor, &err) != 0) {
    fprintf(stderr, "canopy run: %s\n", err.msg);
    goto out;
  }
  if (o.cfg.serve.memory_budget < floor) {
    fprintf(stderr, "canopy run: --memory-budget %lld bytes is too small: "
            "the model cannot run even its smallest instance under %lld "
            "bytes; give at least %lld, or 0 for no budget\n",
            o.cfg.serve.memory_budget, floor, floor);
    goto out;
  }
  set_product_threads(&o, cores, jobs);
  in = strcmp(o.input, "-") == 0 ? stdin : fopen(o.input, "r");
  if (in == NULL) {
    fprintf(stderr, "canopy run: cannot open %s: %m\n", o.input);
    goto out;
  }
  if (o.policy == CN_POLICY_FSM && load_policy(&o, m, bk, &in) != 0) goto out;
  if (open_job_backends(&o, bk, jobs, &job_bk, &err) != 0) goto out;
  /* on a device, each job prepares its next run while the device
   * computes the one before (docs/cuda.md).
   * CANOPY_RUN_OVERLAP=0 turns that off (to measure what it gives), =1
   * on for host backends too (the tests: same path, same answers) */
  const char *ov = getenv("CANOPY_RUN_OVERLAP");
  bool overlap = ov != NULL && ov[0] != '\0' ? strcmp(ov, "0") != 0
                                              : cn_backend_is_device(bk);
  totals tot = {0};
  double t0 = cn_now_s();
  if (cn__run_stream(&o, m, job_bk, jobs, overlap, in, &tot) != 0) goto out;
  double secs = cn_now_s() - t0;
  fflush(stdout);
  print_summary(&o, jobs, &tot, secs);
  status = tot.errors > 0 ? 2 : 0;
out:
  if (in != NULL && in != stdin) fclose(in);
  for (int i = 1; job_bk != NULL && i < jobs; i++)
    cn_backend_close(job_bk[i]);
  free(job_bk);
  cn_backend_close(bk);
  cn_fsm_free(o.fsm);
  cn_model_free(m);
  free(o.slurped);
  return status;
}
