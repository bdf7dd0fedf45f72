/* fuzz_cells.c - libFuzzer target for the cells loader (model.json
 * "family": "cells", docs/cells.md): the bytes are model.json in a
 * directory whose vocabulary and weights stay fixed (a treelstm's, H = D =
 * 4, C = 3: embed, leaf.W, leaf.b, internal.U, internal.b, out.W, out.b).
 * cn_model_load must load the model or refuse it with a message, never
 * crash, leak or read out of bounds (unknown ops and keys, references
 * forward or out of range, widths, column ranges, tensor shapes, slices
 * and concats that split values into many pieces, the IR's limits). A
 * model that loads is then run on one small instance of its input kind
 * under every layout: whatever the loader accepts, the compiler and the
 * executor must take. */
#include <jansson.h>

#include "backends.h"
#include "canopy_core.h"
#include "fuzz_common.h"

static char dir[512];
static cn_backend_ctx *bk;

static void setup(void) {
  snprintf(dir, sizeof(dir), "%s/m", fuzz_tmpdir());
  fuzz_small_model("treelstm", dir, NULL, NULL);
  cn_err e;
  cn_err_clear(&e);
  CHECK(cn_backend_open("cpu", 0, &bk, &e) == 0);
}

static const char *instance_for(cn_input_kind k) {
  switch (k) {
  case CN_INPUT_TREE: return "{\"tree\": \"(S (NP (W the) (N cat)) (V sat) "
                             "(X (Y (Z the))))\"}";
  case CN_INPUT_SEQUENCE: return "{\"tokens\": [\"the\", \"cat\", \"sat\"]}";
  case CN_INPUT_DAG:
    return "{\"nodes\": [{\"token\": \"the\", \"prev\": []}, {\"token\": "
           "\"cat\", \"prev\": [0]}, {\"token\": \"sat\", \"prev\": [0, 1]}]}";
  default: return NULL;
  }
}

static void run_once(const cn_model *m) {
  const char *text = instance_for(cn_model_input(m));
  if (text == NULL) return;
  json_t *j = json_loads(text, 0, NULL);
  CHECK(j != NULL);
  cn_instance *in = NULL;
  cn_err e;
  cn_err_clear(&e);
  if (cn_instance_parse(m, j, NULL, 0, &in, &e) == 0) {
    for (int l = 0; l < CN_LAYOUT__COUNT; l++) {
      cn_run *r = cn_run_new(m, bk);
      CHECK(r != NULL);
      cn_run_set_layout(r, (cn_layout)l);
      int slot = cn_run_add(r, in, CN_OUT_ALL | CN_OUT_HIDDEN, 0);
      CHECK(slot >= 0);
      cn_err_clear(&e);
      if (cn_run_exec(r, CN_POLICY_AGENDA, &e) == 0) {
        json_t *o = cn_run_output(r, slot);
        CHECK(o != NULL);
        json_decref(o);
      } else {
        CHECK(e.msg[0] != '\0');
      }
      cn_run_free(r);
    }
    cn_instance_free(in);
  } else {
    CHECK(e.msg[0] != '\0');
  }
  json_decref(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (dir[0] == '\0') setup();
  char path[600];
  snprintf(path, sizeof(path), "%s/model.json", dir);
  fuzz_write(path, data, size);
  cn_model *m = fuzz_load(dir);
  if (m != NULL) {
    json_t *c = cn_model_describe_cells(m);
    CHECK(c != NULL);
    json_decref(c);
    run_once(m);
    cn_model_free(m);
  }
  return 0;
}
