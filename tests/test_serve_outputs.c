/* test_serve_outputs.c - the daemon answers what `canopy run` answers.
 *
 * For every tree family: 40 instances sent by 8 concurrent clients (5 per
 * request, all sent before any answer is read, so they share runs) must
 * get exactly the outputs `canopy run` prints for the same instances
 * (1e-5 per element), including outputs=all and return_hidden; and so
 * must a worker that overlaps its runs. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "serve_harness.h"

#define N_INST 40
#define PER_REQ 5

static th_daemon d;
static bool overlapped; /* CANOPY_RUN_OVERLAP=1: see overlapped_runs */
static void teardown(void) { th_cleanup(&d); }

/* The daemon's answers from model `served` against `canopy run` on model
 * `ref` (the same model, or the one it describes). */
static void check_served(const char *served, const char *ref,
                         const char *extra_flags, const char *opts) {
  const char *family = served;
  /* not work-conserving: an idle worker would take each request alone
   * when the client is slower than the run (8 runs of one request, seen
   * once in CI); the window gathers them for up to 100 ms instead.
   * Overlapped: one worker, a run a request, so the worker issues each
   * run before it answers the one before. */
  if (overlapped)
    th_start(&d, (const char *const[]){"--max-delay-us", "100000",
                                       "--work-conserving", "false",
                                       "--workers", "1", "--max-instances",
                                       "5", NULL});
  else
    th_start(&d, (const char *const[]){"--max-delay-us", "100000",
                                       "--work-conserving", "false", NULL});
  const char *file = strcmp(family, "childsum-treelstm") == 0
                         ? "trees-nary.jsonl"
                         : "trees-binary.jsonl";
  char cmd[2048], path[600];
  snprintf(path, sizeof(path), "%s/in.jsonl", d.dir);
  snprintf(cmd, sizeof(cmd), "head -n %d %s/%s > %s", N_INST, th_data(),
           file, path);
  cr_assert_eq(system(cmd), 0);
  snprintf(cmd, sizeof(cmd),
           "%s run --model %s/models/%s --input %s --batch 7 %s 2>/dev/null",
           th_bin(), d.dir, ref, path, extra_flags);
  FILE *p = popen(cmd, "r");
  json_t *want[N_INST];
  char line[1 << 16];
  for (int i = 0; i < N_INST; i++) {
    cr_assert(fgets(line, sizeof(line), p) != NULL, "canopy run: line %d", i);
    want[i] = json_loads(line, 0, NULL);
  }
  pclose(p);
  FILE *in = fopen(path, "r");
  int fds[N_INST / PER_REQ];
  for (int q = 0; q < N_INST / PER_REQ; q++) {
    char body[1 << 16] = "{\"instances\":[";
    for (int i = 0; i < PER_REQ; i++) {
      cr_assert(fgets(line, sizeof(line), in) != NULL);
      line[strcspn(line, "\n")] = '\0';
      strcat(body, line);
      strcat(body, i + 1 < PER_REQ ? "," : "]");
    }
    strcat(body, opts);
    strcat(body, "}");
    char url[256];
    snprintf(url, sizeof(url), "/v1/models/%s/infer", family);
    fds[q] = th_connect(d.port);
    th_send(fds[q], "POST", url, body, NULL);
  }
  fclose(in);
  long long shared = 0;
  for (int q = 0; q < N_INST / PER_REQ; q++) {
    th_resp r;
    cr_assert_eq(th_read(fds[q], &r), 0);
    cr_assert_eq(r.status, 200, "%s", r.body);
    json_t *j = json_loads(r.body, 0, NULL);
    json_t *outs = json_object_get(j, "outputs");
    cr_assert_eq(json_array_size(outs), PER_REQ);
    for (int i = 0; i < PER_REQ; i++)
      th_expect_json_near(json_array_get(outs, i), want[q * PER_REQ + i], family);
    shared += json_integer_value(
        json_object_get(json_object_get(j, "stats"), "lower_bound"));
    json_decref(j);
    th_resp_free(&r);
    close(fds[q]);
  }
  cr_expect(shared > 0);
  for (int i = 0; i < N_INST; i++) json_decref(want[i]);
  th_resp r;
  cr_assert_eq(th_http(d.port, "GET", "/metrics", NULL, NULL, &r), 0);
  if (overlapped) {
    /* a run each, one worker that said it overlaps them */
    cr_expect_eq(th_metric(r.body, "canopy_runs_total"), 8, "%s", r.body);
    char *log = th_read_file(d.log);
    cr_expect(strstr(log, "msg=workers-started workers=1 backend=cpu "
                          "overlap=true") != NULL, "%s", log);
    free(log);
  } else {
    /* 8 requests, fewer runs: they were batched together */
    cr_expect(th_metric(r.body, "canopy_runs_total") < 8, "%s", r.body);
  }
  th_resp_free(&r);
  cr_expect_eq(th_stop(&d), 0);
}

static void check_family(const char *family, const char *extra_flags,
                         const char *opts) {
  const char *fams[] = {family, NULL};
  th_models(&d, fams);
  check_served(family, family, extra_flags, opts);
}

/* A model described by cells (docs/cells.md): tests/cells/treelstm.json
 * over a treelstm's weights, served beside it: its description, its
 * readiness, and answers equal to what the built-in treelstm gives
 * under `canopy run`. */
Test(serve_outputs, cells_model, .fini = teardown, .timeout = 60) {
  memset(&d, 0, sizeof(d));
  snprintf(d.dir, sizeof(d.dir), "/tmp/canopy-serve-XXXXXX");
  cr_assert(mkdtemp(d.dir) != NULL);
  char cmd[2048], path[700];
  snprintf(cmd, sizeof(cmd),
           "%s model init treelstm %s/models/treelstm --hidden 16 --embed 12 "
           "--vocab-from %s/trees-binary.jsonl >/dev/null 2>&1 && "
           "mkdir %s/models/cells && cp %s/models/treelstm/vocab.txt "
           "%s/models/treelstm/weights.safetensors %s/models/cells/",
           th_bin(), d.dir, th_data(), d.dir, d.dir, d.dir, d.dir);
  cr_assert_eq(system(cmd), 0, "%s", cmd);
  const char *cells = getenv("CANOPY_CELLS");
  cr_assert_not_null(cells);
  snprintf(path, sizeof(path), "%s/treelstm.json", cells);
  json_t *j = json_load_file(path, 0, NULL);
  snprintf(path, sizeof(path), "%s/models/treelstm/model.json", d.dir);
  json_t *b = json_load_file(path, 0, NULL);
  cr_assert(j != NULL && b != NULL);
  json_object_set(j, "labels", json_object_get(b, "labels"));
  snprintf(path, sizeof(path), "%s/models/cells/model.json", d.dir);
  cr_assert_eq(json_dump_file(j, path, 0), 0);
  json_decref(j);
  json_decref(b);
  check_served("cells", "treelstm", "--outputs all --return-hidden",
               ",\"outputs\":\"all\",\"return_hidden\":true");
  th_start(&d, NULL);
  th_resp r;
  cr_assert_eq(th_http(d.port, "GET", "/v1/models/cells", NULL, NULL, &r), 0);
  cr_assert_eq(r.status, 200, "%s", r.body);
  json_t *m = json_loads(r.body, 0, NULL);
  cr_expect_str_eq(json_string_value(json_object_get(m, "family")), "cells");
  cr_expect_str_eq(json_string_value(json_object_get(m, "input")), "tree");
  json_t *vt = json_object_get(m, "vertex_types");
  cr_expect_eq(json_array_size(vt), 3);
  cr_expect_str_eq(json_string_value(json_array_get(vt, 1)), "internal");
  json_decref(m);
  th_resp_free(&r);
  cr_assert_eq(th_http(d.port, "GET", "/v2/models/cells/ready", NULL, NULL,
                       &r), 0);
  cr_expect_eq(r.status, 200, "%s", r.body);
  th_resp_free(&r);
  cr_expect_eq(th_stop(&d), 0);
}

Test(serve_outputs, treelstm, .fini = teardown, .timeout = 40) {
  check_family("treelstm", "", "");
}
Test(serve_outputs, treelstm_all_hidden, .fini = teardown, .timeout = 40) {
  check_family("treelstm", "--outputs all --return-hidden",
               ",\"outputs\":\"all\",\"return_hidden\":true");
}
/* A worker that issues its next run before it answers the one before
 * (on a device, so the host prepares run N+1 while the device computes
 * run N; CANOPY_RUN_OVERLAP=1 takes the same path on the cpu backend):
 * 8 runs back to back on one worker, answers as `canopy run`'s, hidden
 * states included. */
Test(serve_outputs, overlapped_runs, .fini = teardown, .timeout = 40) {
  setenv("CANOPY_RUN_OVERLAP", "1", 1);
  overlapped = true;
  check_family("treelstm", "--outputs all --return-hidden",
               ",\"outputs\":\"all\",\"return_hidden\":true");
}
Test(serve_outputs, treelstm_2type, .fini = teardown, .timeout = 40) {
  check_family("treelstm-2type", "", "");
}
Test(serve_outputs, treegru, .fini = teardown, .timeout = 40) {
  check_family("treegru", "", "");
}
Test(serve_outputs, childsum_treelstm, .fini = teardown, .timeout = 40) {
  check_family("childsum-treelstm", "", "");
}
Test(serve_outputs, mvrnn, .fini = teardown, .timeout = 40) {
  check_family("mvrnn", "--return-hidden", ",\"return_hidden\":true");
}

/* Makes the output layer of a model overflow at compute with finite
 * weights: row 0 of out.W is +3.4e38, row
 * 1 is -3.4e38, and out.b is FLT_MAX, so logits 0 and 1 are FLT_MAX ±
 * 3.4e38 * sum(h): one of them is infinite unless sum(h) is within 1e-7 of
 * 0, which the fixed seed of `canopy model init` does not give. */
static void overflow_output_layer(const char *model_dir) {
  char path[700];
  snprintf(path, sizeof(path), "%s/weights.safetensors", model_dir);
  FILE *f = fopen(path, "r+b");
  cr_assert_not_null(f, "%s", path);
  unsigned char len8[8];
  cr_assert_eq(fread(len8, 1, 8, f), 8);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | len8[i];
  char *hdr = malloc(hlen);
  cr_assert_eq(fread(hdr, 1, hlen, f), hlen);
  json_t *h = json_loadb(hdr, hlen, 0, NULL);
  cr_assert_not_null(h);
  json_t *w = json_object_get(h, "out.W"), *b = json_object_get(h, "out.b");
  cr_assert(w != NULL && b != NULL, "no out.W / out.b in %s", path);
  long long cols = json_integer_value(
      json_array_get(json_object_get(w, "shape"), 1));
  const char *names[] = {"out.W", "out.b"};
  for (int t = 0; t < 2; t++) {
    json_t *off = json_object_get(json_object_get(h, names[t]),
                                  "data_offsets");
    long long s = json_integer_value(json_array_get(off, 0));
    long long e = json_integer_value(json_array_get(off, 1));
    for (long long k = 0; k < (e - s) / 4; k++) {
      float v = t == 1 ? FLT_MAX : k < cols ? 3.4e38f
                                 : k < 2 * cols ? -3.4e38f : 0.5f;
      cr_assert_eq(fseek(f, (long)(8 + hlen + s + 4 * k), SEEK_SET), 0);
      cr_assert_eq(fwrite(&v, 4, 1, f), 1); /* little-endian host */
    }
  }
  json_decref(h);
  free(hdr);
  fclose(f);
}

/* Weights that overflow at compute once answered 200 with "logits": []
 * (jansson's json_real refuses NaN and infinity) and a made-up label.
 * JSON cannot hold the value, so the request fails: 500 non_finite naming
 * the instance and the field. The daemon goes on serving, the other
 * model included; `canopy run` prints an error line for the instance. */
Test(serve_outputs, non_finite_output_is_an_error, .fini = teardown,
     .timeout = 40) {
  const char *fams[] = {"treelstm", "treegru", NULL};
  th_models(&d, fams);
  char dir[600];
  snprintf(dir, sizeof(dir), "%s/models/treelstm", d.dir);
  overflow_output_layer(dir);
  /* the warm-up would refuse the version (test_serve_warmup): this test
   * is of the request path */
  const char *const off[] = {"--warmup", "false", NULL};
  th_start(&d, off);
  const char *body = "{\"instances\":[{\"tree\":\"(3 (2 a) (2 b))\"},"
                     "{\"tree\":\"(1 c)\"}],\"outputs\":\"all\"}";
  for (int round = 0; round < 2; round++) {
    th_resp r;
    cr_assert_eq(th_http(d.port, "POST", "/v1/models/treelstm/infer", body,
                         NULL, &r), 0);
    cr_expect_eq(r.status, 500, "%s", r.body);
    json_t *j = json_loads(r.body, 0, NULL);
    json_t *e = json_object_get(j, "error");
    cr_expect_str_eq(json_string_value(json_object_get(e, "code")),
                     "non_finite", "%s", r.body);
    cr_expect_eq(json_integer_value(json_object_get(e, "instance")), 0);
    const char *msg = json_string_value(json_object_get(e, "message"));
    cr_expect(msg != NULL && strstr(msg, "instance 0") != NULL &&
                  strstr(msg, "'logits'") != NULL,
              "%s", r.body);
    json_decref(j);
    th_resp_free(&r);
    cr_assert_eq(th_http(d.port, "POST", "/v1/models/treegru/infer", body,
                         NULL, &r), 0);
    cr_expect_eq(r.status, 200, "%s", r.body);
    th_resp_free(&r);
  }
  th_resp r;
  cr_assert_eq(th_http(d.port, "GET", "/healthz", NULL, NULL, &r), 0);
  cr_expect_eq(r.status, 200);
  th_resp_free(&r);
  char cmd[2048];
  snprintf(cmd, sizeof(cmd), "echo '{\"tree\":\"(3 (2 a) (2 b))\"}' | %s run "
           "--model %s --input - 2>/dev/null", th_bin(), dir);
  FILE *p = popen(cmd, "r");
  char line[4096] = "";
  cr_assert_not_null(fgets(line, sizeof(line), p));
  pclose(p);
  cr_expect(strstr(line, "\"non_finite\"") != NULL, "%s", line);
  cr_expect_eq(th_stop(&d), 0);
}

/* Every /v1 answer says how many of its words the model did
 * not know (stats.unknown_tokens: read as '<unk>'), and where with
 * "unknown_positions": true: one array an instance, a tree's leaves
 * counted left to right; a model that types nodes by label, how many
 * labels it does not list (stats.unknown_labels). Trees, a tagger's tokens, and lstm-nmt, whose
 * answers come from the continuous decoder (decode.c). */
static json_t *post_json(const char *model, const char *body, int want) {
  char path[128];
  snprintf(path, sizeof(path), "/v1/models/%s/infer", model);
  th_resp r;
  cr_assert_eq(th_http(d.port, "POST", path, body, NULL, &r), 0);
  cr_assert_eq(r.status, want, "%s: %d %s", body, r.status, r.body);
  json_t *j = json_loads(r.body, 0, NULL);
  cr_assert_not_null(j, "%s", r.body);
  th_resp_free(&r);
  return j;
}

/* post_json(model, body, 200), its stats checked: unknown_tokens is
 * tokens and unknown_positions, as compact JSON, is positions (NULL: no
 * such key). Returns the answer (the caller frees it). */
static json_t *expect_unknowns(const char *model, const char *body,
                               long long tokens, const char *positions) {
  json_t *j = post_json(model, body, 200);
  json_t *st = json_object_get(j, "stats");
  cr_expect_eq(json_integer_value(json_object_get(st, "unknown_tokens")),
               tokens, "%s", body);
  if (positions == NULL) {
    cr_expect_null(json_object_get(st, "unknown_positions"), "%s", body);
    return j;
  }
  char *pos = json_dumps(json_object_get(st, "unknown_positions"),
                         JSON_COMPACT);
  cr_expect_str_eq(pos, positions, "%s", body);
  free(pos);
  return j;
}

Test(serve_outputs, unknown_tokens, .fini = teardown, .timeout = 60) {
  th_models(&d, (const char *const[]){"treelstm", "bilstm-tagger",
                                      "treelstm-2type", NULL});
  char cmd[1400]; /* th_models' lstm-nmt has a vocabulary of trees: none */
  snprintf(cmd, sizeof(cmd), "%s model init lstm-nmt %s/models/nmt "
           "--vocab-from %s/sequences.jsonl >/dev/null 2>&1", th_bin(),
           d.dir, th_data());
  cr_assert_eq(system(cmd), 0, "%s", cmd);
  th_start(&d, NULL);
  json_t *j = expect_unknowns(
      "treelstm", "{\"instances\": ["
      "{\"tree\": \"(S (W zzqx) (S (W your) (W qqqz)))\"},"
      "{\"tree\": \"(S (W your) (W dreams))\"}],"
      "\"unknown_positions\": true}", 2, "[[0,2],[]]");
  json_t *st = json_object_get(j, "stats");
  /* treelstm reads no labels: no count of them */
  cr_expect_null(json_object_get(st, "unknown_labels"));
  json_decref(j);
  /* treelstm-2type types nodes by label (NP, PP listed): "np" and "S"
   * are not listed, and the answer counts them */
  j = post_json("treelstm-2type", "{\"instances\": ["
                "{\"tree\": \"(S (np (W your) (W dreams)) (NP (W a) (W b)))\"},"
                "{\"tree\": \"(PP (W your) (W dreams))\"}]}", 200);
  st = json_object_get(j, "stats");
  cr_expect_eq(json_integer_value(json_object_get(st, "unknown_labels")), 2);
  json_decref(j);
  /* without the option: the count only */
  json_decref(expect_unknowns("bilstm-tagger", "{\"tokens\": [\"zzqx\", "
                              "\"your\", \"QQQZ\", \"dreams\"]}", 2, NULL));
  json_decref(expect_unknowns("bilstm-tagger", "{\"tokens\": [\"your\", "
                              "\"dreams\"], \"unknown_positions\": true}",
                              0, "[[]]"));
  j = expect_unknowns("nmt", "{\"tokens\": [\"your\", \"zzqx\"], "
                      "\"unknown_positions\": true}", 1, "[[1]]");
  st = json_object_get(j, "stats");
  cr_expect(json_is_true(json_object_get(st, "continuous")));
  json_decref(j);
  j = post_json("treelstm", "{\"tree\": \"(S (W a) (W b))\", "
                "\"unknown_positions\": 1}", 400);
  cr_expect(strstr(json_string_value(json_object_get(
                       json_object_get(j, "error"), "message")),
                   "unknown_positions") != NULL);
  json_decref(j);
  cr_expect_eq(th_stop(&d), 0);
}
