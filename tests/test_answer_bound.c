/* test_answer_bound.c - cn_model_answer_bound (the daemon's
 * max-answer-bytes) against brute force: for every family, over real
 * instances from $CANOPY_DATA and every combination of outputs and
 * return_hidden, the bound is at least the bytes of the instance's output
 * as the daemon prints it, and within 4x of them (lstm-nmt aside: its
 * bound is max_decode_len steps, whatever the decoder stops at). */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cells_test_util.h"
#include "engine_util.h"
#include "internal.h"
#include "families/families.h"

#define DUMP_FLAGS (JSON_COMPACT | JSON_REAL_PRECISION(9))
#define N_INST 40

static size_t dumped_len(const json_t *j) {
  char *s = json_dumps(j, DUMP_FLAGS);
  cr_assert_not_null(s);
  size_t n = strlen(s);
  free(s);
  return n;
}

/* Rewrites dir/m/model.json's labels as names JSON must escape, and
 * reloads the model. */
static cn_model *hostile_labels(cn_model *m, const char *dir) {
  char path[600];
  snprintf(path, sizeof(path), "%s/m/model.json", dir);
  json_error_t je;
  json_t *j = json_load_file(path, 0, &je);
  cr_assert_not_null(j, "%s: %s", path, je.text);
  json_t *l = json_array();
  const char *names[] = {"\"q\"", "back\\slash/", "ctl\x01\x1f", "nl\n\t",
                         "\xc3\xa9t\xc3\xa9"};
  for (int i = 0; i < 5; i++) json_array_append_new(l, json_string(names[i]));
  json_object_set_new(j, "labels", l);
  cr_assert_eq(json_dump_file(j, path, JSON_INDENT(2)), 0);
  json_decref(j);
  cn_model_free(m);
  cn_err err;
  cn_model *out = NULL;
  snprintf(path, sizeof(path), "%s/m", dir);
  cr_assert_eq(cn_model_load(path, &out, &err), 0, "reload: %s", err.msg);
  return out;
}

/* Every instance of insts under every flag combination: bound >= actual;
 * returns the largest bound / actual ratio seen. */
static double check_model(const cn_model *m, const char *name,
                          const json_t *insts) {
  double worst = 0;
  for (unsigned flags = 0; flags < 4; flags++) {
    json_t *outs = tu_run(m, insts, CN_POLICY_AGENDA, 8, flags, NULL, NULL);
    cr_assert_eq(json_array_size(outs), json_array_size(insts));
    size_t total_b = 0, total_a = 0;
    for (size_t i = 0; i < json_array_size(insts); i++) {
      cn_instance *in = NULL;
      cn_err err;
      cr_assert_eq(cn_instance_parse(m, json_array_get(insts, i), NULL,
                                     (int)i, &in, &err),
                   0, "%s: parse %zu: %s", name, i, err.msg);
      const json_t *o = json_array_get(outs, i);
      cr_assert(json_object_get(o, "error") == NULL, "%s: instance %zu failed",
                name, i);
      int64_t b = cn_model_answer_bound(m, in, flags, 0);
      size_t a = dumped_len(o);
      cr_expect_geq(b, (int64_t)a,
                    "%s flags %u instance %zu: bound %lld < actual %zu",
                    name, flags, i, (long long)b, a);
      double ratio = (double)b / (double)a;
      if (ratio > worst) worst = ratio;
      total_b += (size_t)b, total_a += a;
      cn_instance_free(in);
    }
    cr_log_info("%-22s outputs=%s hidden=%d: bound/actual %.2f over %zu "
                "instances (%zu / %zu bytes)",
                name, (flags & CN_OUT_ALL) ? "all " : "root",
                (flags & CN_OUT_HIDDEN) ? 1 : 0,
                (double)total_b / (double)total_a,
                json_array_size(insts), total_b, total_a);
    json_decref(outs);
  }
  return worst;
}

Test(answer_bound, every_family_against_its_outputs, .timeout = 300) {
  for (size_t f = 0; f < tu_n_families; f++) {
    char dir[256];
    const tu_family *tf = &tu_families[f];
    cn_model *m = tu_model(tf->family, 16, 16, tf->data, dir, sizeof(dir));
    json_t *insts = tu_data_lines(tf->data, N_INST);
    double worst = check_model(m, tf->family, insts);
    printf("%-22s worst bound/actual %.2f\n", tf->family, worst);
    if (strcmp(tf->family, "lstm-nmt") != 0)
      cr_expect_leq(worst, 4.0, "%s: bound %.2fx the answer", tf->family,
                    worst);
    if (m->labels != NULL) {
      /* labels that print escaped: label_name and tag_names */
      m = hostile_labels(m, dir);
      char name[64];
      snprintf(name, sizeof(name), "%s+labels", tf->family);
      double w2 = check_model(m, name, insts);
      printf("%-22s worst bound/actual %.2f\n", name, w2);
    }
    json_decref(insts);
    cn_model_free(m);
    tu_rmdir(dir);
  }
}

/* Models described by cells (docs/cells.md): a tree, a sequence in both
 * directions, a DAG (the built-ins as cells, with their weights). */
Test(answer_bound, cells_models, .timeout = 300) {
  static const struct { const char *family, *data, *cells; } cs[] = {
      {"treelstm", "trees-binary.jsonl", "treelstm"},
      {"treegru", "trees-binary.jsonl", "treegru"},
      {"bilstm-tagger", "sequences.jsonl", "bilstm-tagger"},
      {"latticegru", "dags.jsonl", "latticegru"},
  };
  for (size_t k = 0; k < sizeof(cs) / sizeof(cs[0]); k++) {
    char dir[256];
    cn_model *ref = tu_model(cs[k].family, 16, 12, cs[k].data, dir,
                             sizeof(dir));
    json_t *j = cells_json(cs[k].cells);
    cn_model *m = NULL;
    cn_err e;
    cr_assert_eq(load_cells(dir, j, &m, &e), 0, "%s: %s", cs[k].cells,
                 e.msg);
    json_t *insts = tu_data_lines(cs[k].data, N_INST);
    char name[64];
    snprintf(name, sizeof(name), "cells:%s", cs[k].cells);
    double worst = check_model(m, name, insts);
    printf("%-22s worst bound/actual %.2f\n", name, worst);
    cr_expect_leq(worst, 4.0, "%s: bound %.2fx the answer", name, worst);
    json_decref(insts);
    json_decref(j);
    cn_model_free(m);
    cn_model_free(ref);
    tu_rmdir(dir);
  }
}

/* bilstm-tagger with its CRF layer: "path_score" is counted. */
Test(answer_bound, crf_tagger, .timeout = 120) {
  char dir[256];
  snprintf(dir, sizeof(dir), "/tmp/canopy-test-XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
  char mdir[600], data[512];
  snprintf(mdir, sizeof(mdir), "%s/m", dir);
  snprintf(data, sizeof(data), "%s/sequences.jsonl", getenv("CANOPY_DATA"));
  cn_model_init_opts o = {.family = "bilstm-tagger", .dir = mdir,
                          .hidden = 16, .embed = 16, .classes = 7,
                          .vocab_from = data, .seed = 3, .crf = 1};
  cn_err err;
  cr_assert_eq(cn_model_init(&o, &err), 0, "%s", err.msg);
  cn_model *m = NULL;
  cr_assert_eq(cn_model_load(mdir, &m, &err), 0, "%s", err.msg);
  json_t *insts = tu_data_lines("sequences.jsonl", N_INST);
  double worst = check_model(m, "bilstm-tagger+crf", insts);
  cr_expect_leq(worst, 4.0);
  json_decref(insts);
  cn_model_free(m);
  tu_rmdir(dir);
}

/* lstm-nmt: a smaller max_decode_len lowers the bound, and every cap
 * bounds what a decode of that many steps prints. */
Test(answer_bound, nmt_decode_len) {
  char dir[256];
  cn_model *m = tu_model("lstm-nmt", 16, 16, "sequences.jsonl", dir,
                         sizeof(dir));
  json_t *insts = tu_data_lines("sequences.jsonl", 1);
  cn_instance *in = NULL;
  cn_err err;
  cr_assert_eq(cn_instance_parse(m, json_array_get(insts, 0), NULL, 0, &in,
                                 &err), 0);
  int64_t b5 = cn_model_answer_bound(m, in, 0, 5);
  int64_t b50 = cn_model_answer_bound(m, in, 0, 50);
  cr_expect_lt(b5, b50);
  cr_expect_eq(cn_model_answer_bound(m, in, 0, 0), b50, "default cap 50");
  cr_expect_eq(cn_model_answer_bound(m, in, 0, 1000), b50,
               "the model's cap wins");
  cr_expect_gt(cn_model_answer_bound(m, in, CN_OUT_HIDDEN, 5), b5);
  cn_instance_free(in);
  json_decref(insts);
  cn_model_free(m);
  tu_rmdir(dir);
}

/* CN_JSON_FLOAT_MAX is the widest a float prints at the daemon's
 * precision: the extremes, and random bit patterns. */
Test(answer_bound, float_width) {
  float xs[] = {FLT_MAX, -FLT_MAX, FLT_MIN, -FLT_MIN, 1.4e-45f, -1.4e-45f,
                -1.23456789e-38f, -0.000123456789f, -123456789.0f,
                -1.23456789e-5f, -9.99999999e-5f, -0.1f / 3.0f, 0.0f, -0.0f};
  size_t widest = 0;
  for (size_t i = 0; i < sizeof(xs) / sizeof(xs[0]); i++) {
    json_t *a = cn__json_floats(&xs[i], 1);
    size_t n = dumped_len(a) - 2; /* [] */
    if (n > widest) widest = n;
    json_decref(a);
  }
  uint32_t s = 12345;
  for (int i = 0; i < 200000; i++) {
    s = s * 1664525u + 1013904223u;
    float x;
    memcpy(&x, &s, sizeof(x));
    json_t *a = cn__json_floats(&x, 1);
    size_t n = dumped_len(a) - 2;
    if (n > widest) widest = n;
    json_decref(a);
  }
  cr_expect_leq(widest, (size_t)CN_JSON_FLOAT_MAX, "a float printed %zu",
                widest);
  cr_expect_eq(widest, (size_t)CN_JSON_FLOAT_MAX, "the bound is tight");
}
