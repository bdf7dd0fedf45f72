/* fuzz_line.c - libFuzzer target for instance lines read without a DOM
 * (cn_instance_parse_line, core/model/instance_line.c and the tape of
 * core/input/jline.c). The bytes are one line, read for a tree model
 * (binary and any arity), a sequence model, a lattice model with a
 * lexicon and a DAG model, under the default limits and tiny ones.
 * Besides "no crash, no leak, no UB": a line the reader reads, jansson
 * reads too (json_loadb with JSON_REJECT_DUPLICATES, as `canopy run`),
 * cn_instance_parse accepts its object, and both instances have the same
 * vertices and the same unknown words at the same positions; a line
 * either path refuses, the reader never reads. */
#include <jansson.h>

#include "canopy_core.h"
#include "fuzz_common.h"

static const char *const families[] = {"treelstm", "childsum-treelstm",
                                       "bilstm-tagger", "latticelstm",
                                       "latticegru"};
#define N_FAM (sizeof(families) / sizeof(families[0]))
static cn_model *models[N_FAM];
static cn_line_reader *rd;

static void load_models(void) {
  char lex[512], voc[512];
  fuzz_lexicon(lex, sizeof(lex));
  /* a vocabulary, so that known and unknown words both occur */
  snprintf(voc, sizeof(voc), "%s/vocab.jsonl", fuzz_tmpdir());
  static const char vocab[] =
      "{\"tree\": \"(S (N the) (V cat))\", \"tokens\": [\"the\", \"cat\", "
      "\"a\"], \"chars\": [\"a\", \"b\", \"c\"], \"nodes\": [{\"token\": "
      "\"ab\", \"prev\": []}]}\n";
  fuzz_write(voc, (const uint8_t *)vocab, sizeof(vocab) - 1);
  for (size_t i = 0; i < N_FAM; i++) {
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/%s", fuzz_tmpdir(), families[i]);
    fuzz_small_model(families[i], dir, i == 3 ? lex : NULL, &models[i]);
  }
  rd = cn_line_reader_new();
  CHECK(rd != NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (models[0] == NULL) load_models();
  cn_limits lim[2];
  cn_limits_default(&lim[0]);
  cn_limits_default(&lim[1]);
  lim[1].max_nodes = 5, lim[1].max_depth = 3, lim[1].max_token_len = 3;
  lim[1].max_children = 2, lim[1].max_seq_len = 4, lim[1].max_spans = 3;
  json_t *j = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES,
                         NULL);
  for (size_t i = 0; i < N_FAM; i++)
    for (int k = 0; k < 2; k++) {
      cn_line_reader_reset(rd);
      cn_instance *fast = NULL, *slow = NULL;
      int rf = cn_instance_parse_line(models[i], rd, (const char *)data, size,
                                      &lim[k], &fast);
      CHECK(rf == 0 || rf == 1);
      CHECK((rf == 0) == (fast != NULL));
      if (rf != 0) continue;
      CHECK(j != NULL);
      cn_err e;
      cn_err_clear(&e);
      CHECK(cn_instance_parse(models[i], j, &lim[k], 0, &slow, &e) == 0);
      for (int all = 0; all < 2; all++)
        CHECK(cn_instance_vertices(fast, all) ==
              cn_instance_vertices(slow, all));
      int32_t pf[64], ps[64];
      int nf = cn_instance_unknown(fast, pf, 64);
      int ns = cn_instance_unknown(slow, ps, 64);
      CHECK(nf == ns);
      CHECK(memcmp(pf, ps, (size_t)(nf < 64 ? nf : 64) * sizeof(int32_t)) == 0);
      cn_instance_free(fast);
      cn_instance_free(slow);
    }
  json_decref(j);
  return 0;
}
