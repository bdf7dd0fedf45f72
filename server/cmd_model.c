/* cmd_model.c - `canopy model init` writes a model directory with
 * deterministic random weights; `canopy model info` describes one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "canopy_core.h"
#include "cli.h"

static void model_usage(FILE *f) {
  fprintf(f,
          "usage: canopy model init FAMILY DIR [--hidden H] [--embed D] "
          "[--classes C]\n"
          "                         [--vocab-from FILE.jsonl] [--seed S] "
          "[--max-vocab N]\n"
          "                         [--lexicon WORDS.txt]   (latticelstm)\n"
          "       canopy model info DIR\n"
          "\n"
          "init writes DIR/model.json, DIR/weights.safetensors and the "
          "vocabularies, with\nweights drawn from a seeded generator (the "
          "same seed gives the same model) and\na vocabulary of the tokens "
          "in FILE.jsonl, most frequent first.\n"
          "families: treelstm treelstm-2type treegru childsum-treelstm "
          "mvrnn bilstm-tagger\n"
          "          lstm-nmt latticelstm latticegru\n");
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
  char *s = json_dumps(d, JSON_INDENT(2));
  puts(s);
  free(s);
  json_decref(d);
  cn_model_free(m);
  return 0;
}

int cn_cmd_model(int argc, char **argv) {
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
