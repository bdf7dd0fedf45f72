/* cmd_model.c - `canopy model init` writes a model directory with
 * deterministic random weights; `canopy model info` describes one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "canopy_core.h"
#include "backends.h"
#include "cli.h"

static void model_usage(FILE *f) {
  fprintf(f,
          "usage: canopy model init FAMILY DIR [--hidden H] [--embed D] "
          "[--classes C]\n"
          "                         [--vocab-from FILE.jsonl] [--seed S] "
          "[--max-vocab N]\n"
          "                         [--lexicon WORDS.txt]   (latticelstm)\n"
          "                         [--crf]                 (bilstm-tagger)\n"
          "       canopy model info DIR\n"
          "       canopy model bench DIR --input FILE.jsonl [--runsize R] "
          "[--batch N] [--iters K]\n"
          "\n"
          "init writes DIR/model.json, DIR/weights.safetensors and the "
          "vocabularies, with\nweights drawn from a seeded generator (the "
          "same seed gives the same model) and\na vocabulary of the tokens "
          "in FILE.jsonl, most frequent first. --crf adds a CRF layer "
          "(crf.start,\ncrf.end, crf.trans; tags become the Viterbi path).\n"
          "families: treelstm treelstm-2type treegru childsum-treelstm "
          "mvrnn bilstm-tagger\n"
          "          lstm-nmt latticelstm latticegru\n"
          "info also lists each vertex type's compiled cells (--layout naive "
          "and pq).\n"
          "bench runs the first R instances (default 64, outputs all), then "
          "re-executes N\nvertices (default 8) of each type K times "
          "(default 200) under each layout and\nprints one JSON line per "
          "(type, layout): microseconds, kernels and bytes\ncopied per "
          "execution (ED-Batch's Table-2 report; scripts/bench/cell_report.py).\n");
}

static int cmd_init(int argc, char **argv) {
  cn_model_init_opts o = {0};
  o.seed = 1;
  long long x;
  int m;
  const char *v;
  int pos = 0;
  for (int i = 1; i < argc; i++) {
    if ((m = cn__flag_value(argc, argv, &i, "--hidden", &v)) != 0) {
      if (m < 0 || cn__parse_int("--hidden", v, 1, 65536, &x)) return 1;
      o.hidden = (int)x;
    } else if ((m = cn__flag_value(argc, argv, &i, "--embed", &v)) != 0) {
      if (m < 0 || cn__parse_int("--embed", v, 1, 65536, &x)) return 1;
      o.embed = (int)x;
    } else if ((m = cn__flag_value(argc, argv, &i, "--classes", &v)) != 0) {
      if (m < 0 || cn__parse_int("--classes", v, 1, 1 << 20, &x)) return 1;
      o.classes = (int)x;
    } else if ((m = cn__flag_value(argc, argv, &i, "--seed", &v)) != 0) {
      if (m < 0 || cn__parse_int("--seed", v, 0, INT64_MAX, &x)) return 1;
      o.seed = (uint64_t)x;
    } else if ((m = cn__flag_value(argc, argv, &i, "--max-vocab", &v)) != 0) {
      if (m < 0 || cn__parse_int("--max-vocab", v, 1, 1 << 24, &x)) return 1;
      o.max_vocab = (int)x;
    } else if (strcmp(argv[i], "--crf") == 0) {
      o.crf = 1;
    } else if ((m = cn__flag_value(argc, argv, &i, "--lexicon", &v)) != 0) {
      if (m < 0) return 1;
      o.lexicon = v;
    } else if ((m = cn__flag_value(argc, argv, &i, "--vocab-from", &v)) !=
               0) {
      if (m < 0) return 1;
      o.vocab_from = v;
    } else if (argv[i][0] == '-') {
      fprintf(stderr, "canopy model init: unknown option '%s'\n", argv[i]);
      return 1;
    } else if (pos == 0) {
      o.family = argv[i];
      pos++;
    } else if (pos == 1) {
      o.dir = argv[i];
      pos++;
    } else {
      fprintf(stderr, "canopy model init: unexpected argument '%s'\n",
              argv[i]);
      return 1;
    }
  }
  if (pos != 2) {
    model_usage(stderr);
    return 1;
  }
  cn_err err;
  cn_err_clear(&err);
  if (cn_model_init(&o, &err) != 0) {
    fprintf(stderr, "canopy model init: %s\n", err.msg);
    return 1;
  }
  fprintf(stderr, "canopy model init: wrote %s model to %s\n", o.family,
          o.dir);
  return 0;
}

static int cmd_info(int argc, char **argv) {
  if (argc != 2) {
    model_usage(stderr);
    return 1;
  }
  cn_model *m;
  cn_err err;
  cn_err_clear(&err);
  if (cn_model_load(argv[1], &m, &err) != 0) {
    fprintf(stderr, "canopy model info: %s\n", err.msg);
    return 1;
  }
  json_t *d = cn_model_describe(m);
  json_object_set_new(d, "cells", cn_model_describe_cells(m));
  char *s = json_dumps(d, JSON_INDENT(2));
  puts(s);
  free(s);
  json_decref(d);
  cn_model_free(m);
  return 0;
}

/* Reads up to max instances of a JSONL file. */
static int read_instances(const cn_model *m, const char *path, int max,
                          cn_instance **in, int *n) {
  FILE *f = fopen(path, "r");
  if (f == NULL) {
    fprintf(stderr, "canopy model bench: cannot open %s\n", path);
    return -1;
  }
  char *line = NULL;
  size_t cap = 0;
  *n = 0;
  while (*n < max && getline(&line, &cap, f) > 0) {
    json_error_t je;
    json_t *j = json_loads(line, 0, &je);
    cn_err err;
    cn_err_clear(&err);
    if (j == NULL || cn_instance_parse(m, j, NULL, *n, &in[*n], &err) != 0) {
      fprintf(stderr, "canopy model bench: %s line %d: %s\n", path, *n + 1,
              j == NULL ? je.text : err.msg);
      json_decref(j);
      continue;
    }
    json_decref(j);
    (*n)++;
  }
  free(line);
  fclose(f);
  return 0;
}

static int cmd_bench(int argc, char **argv) {
  const char *input = NULL, *v;
  long long runsize = 64, batch = 8, iters = 200, x;
  int rc = 1, mm;
  if (argc < 2) {
    model_usage(stderr);
    return 1;
  }
  for (int i = 2; i < argc; i++) {
    if ((mm = cn__flag_value(argc, argv, &i, "--input", &v)) != 0) {
      if (mm < 0) return 1;
      input = v;
    } else if ((mm = cn__flag_value(argc, argv, &i, "--runsize", &v)) != 0) {
      if (mm < 0 || cn__parse_int("--runsize", v, 1, 100000, &x) != 0) return 1;
      runsize = x;
    } else if ((mm = cn__flag_value(argc, argv, &i, "--batch", &v)) != 0) {
      if (mm < 0 || cn__parse_int("--batch", v, 1, 100000, &x) != 0) return 1;
      batch = x;
    } else if ((mm = cn__flag_value(argc, argv, &i, "--iters", &v)) != 0) {
      if (mm < 0 || cn__parse_int("--iters", v, 1, 10000000, &x) != 0) return 1;
      iters = x;
    } else {
      fprintf(stderr, "canopy model bench: unknown argument '%s'\n", argv[i]);
      return 1;
    }
  }
  if (input == NULL) {
    fprintf(stderr, "canopy model bench: --input is required\n");
    return 1;
  }
  cn_model *m = NULL;
  cn_backend_ctx *bk = NULL;
  cn_run *r = NULL;
  cn_instance **in = calloc((size_t)runsize, sizeof(*in));
  int n = 0;
  cn_err err;
  cn_err_clear(&err);
  if (in == NULL || cn_model_load(argv[1], &m, &err) != 0 ||
      cn_backend_open("cpu", 0, &bk, &err) != 0) {
    fprintf(stderr, "canopy model bench: %s\n", err.msg);
    goto out;
  }
  if (read_instances(m, input, (int)runsize, in, &n) != 0) goto out;
  r = cn_run_new(m, bk);
  if (r != NULL) cn_run_set_arena_reuse(r, 0); /* the batches run again */
  for (int i = 0; r != NULL && i < n; i++)
    if (cn_run_add(r, in[i], CN_OUT_ALL, 0) < 0) goto out;
  if (r == NULL || cn_run_exec(r, CN_POLICY_AGENDA, &err) != 0) {
    fprintf(stderr, "canopy model bench: %s\n", err.msg[0] ? err.msg
                                                          : "cannot run");
    goto out;
  }
  json_t *desc = cn_model_describe(m);
  int hidden = (int)json_integer_value(json_object_get(desc, "hidden"));
  json_decref(desc);
  for (int t = 0; t < cn_model_n_types(m); t++)
    for (int l = 0; l < CN_LAYOUT__COUNT; l++) {
      cn_cell_bench b;
      if (cn_run_bench_type(r, t, (cn_layout)l, (int)batch, (int)iters, &b,
                            &err) != 0) {
        fprintf(stderr, "canopy model bench: %s\n", err.msg);
        goto out;
      }
      if (b.n == 0) continue;
      printf("{\"type\": \"%s\", \"layout\": \"%s\", \"n\": %d, "
             "\"hidden\": %d, \"us\": %.2f, \"kernels\": %lld, "
             "\"cell_bytes\": %zu, \"gather_bytes\": %zu, "
             "\"products\": %d, \"fused_kernels\": %d, "
             "\"copy_kernels\": %d, \"compile_ms\": %.3f}\n",
             cn_model_type_name(m, t),
             cn_layout_name((cn_layout)l), b.n,
             hidden, b.us, b.kernels, b.cell_bytes,
             b.gather_bytes, b.products, b.fused_kernels, b.copy_kernels,
             b.compile_ms);
    }
  rc = 0;
out:
  cn_run_free(r);
  for (int i = 0; i < n; i++) cn_instance_free(in[i]);
  free(in);
  if (bk != NULL) cn_backend_close(bk);
  cn_model_free(m);
  return rc;
}

int cn_cmd_model(int argc, char **argv) {
  if (argc >= 2 && strcmp(argv[1], "bench") == 0)
    return cmd_bench(argc - 1, argv + 1);
  if (argc >= 2 && strcmp(argv[1], "init") == 0)
    return cmd_init(argc - 1, argv + 1);
  if (argc >= 2 && strcmp(argv[1], "info") == 0)
    return cmd_info(argc - 1, argv + 1);
  if (argc >= 2 && (strcmp(argv[1], "--help") == 0 ||
                    strcmp(argv[1], "-h") == 0)) {
    model_usage(stdout);
    return 0;
  }
  model_usage(stderr);
  return 1;
}
