/* fuzz_instance.c - libFuzzer target for the INSTANCE parsers of every
 * input kind (docs/api.md "Instances"): the bytes, when they are JSON,
 * are parsed as an instance of a tree model (binary and any arity), a
 * sequence model, a lattice model with a lexicon, a DAG model and an
 * encoder-decoder, under the default limits and under tiny ones. Besides
 * "no crash, no leak, no UB": a parse either succeeds with a positive
 * vertex count or fails with an error code and a message, never both. */
#include <jansson.h>

#include "canopy_core.h"
#include "fuzz_common.h"

static const char *const families[] = {"treelstm", "childsum-treelstm",
                                       "bilstm-tagger", "latticelstm",
                                       "latticegru", "lstm-nmt"};
#define N_FAM (sizeof(families) / sizeof(families[0]))
static cn_model *models[N_FAM];

static void load_models(void) {
  char lex[512];
  fuzz_lexicon(lex, sizeof(lex));
  for (size_t i = 0; i < N_FAM; i++) {
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/%s", fuzz_tmpdir(), families[i]);
    fuzz_small_model(families[i], dir, i == 3 ? lex : NULL, &models[i]);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (models[0] == NULL) load_models();
  json_t *j = json_loadb((const char *)data, size, JSON_DECODE_ANY, NULL);
  if (j == NULL) return 0;
  cn_limits lim[2];
  cn_limits_default(&lim[0]);
  cn_limits_default(&lim[1]);
  lim[1].max_nodes = 5, lim[1].max_depth = 3, lim[1].max_token_len = 3;
  lim[1].max_children = 2, lim[1].max_seq_len = 4, lim[1].max_spans = 3;
  for (size_t i = 0; i < N_FAM; i++)
    for (int k = 0; k < 2; k++) {
      cn_instance *in = NULL;
      cn_err e;
      cn_err_clear(&e);
      int rc = cn_instance_parse(models[i], j, &lim[k], 7, &in, &e);
      if (rc == 0) {
        CHECK(in != NULL);
        CHECK(cn_instance_vertices(in, 0) > 0);
        CHECK(cn_instance_vertices(in, 1) >= cn_instance_vertices(in, 0));
        cn_instance_free(in);
      } else {
        CHECK(in == NULL && rc < 0 && e.code == rc && e.msg[0] != '\0');
        CHECK(e.instance == 7);
      }
    }
  json_decref(j);
  return 0;
}
