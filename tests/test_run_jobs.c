/* test_run_jobs.c - `canopy run --jobs N`: runs
 * computed at once on several threads print exactly what --jobs 1 prints,
 * in input order, refused lines included; a bad --jobs value is refused
 * with a message naming it.
 *
 * The real binary ($CANOPY_BIN) on the real data ($CANOPY_DATA), with
 * --batch small enough that every job computes several runs.
 */
#include <criterion/criterion.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "engine_util.h"

#define BAD_JSON ((size_t)-1) /* an output line that must be bad_json */

static char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f, "cannot open %s", path);
  char *s = NULL;
  size_t cap = 0;
  FILE *mem = open_memstream(&s, &cap);
  char b[65536];
  size_t k;
  while ((k = fread(b, 1, sizeof(b), f)) > 0) fwrite(b, 1, k, mem);
  fclose(f);
  fclose(mem);
  if (len != NULL) *len = cap;
  return s;
}

/* `canopy run` on input with extra flags; stdout and stderr land in
 * dir/out-TAG and dir/err-TAG. Returns the exit status. */
static int run_cli(const char *dir, const char *input, const char *extra,
                   const char *tag) {
  const char *bin = getenv("CANOPY_BIN");
  cr_assert_not_null(bin, "CANOPY_BIN is not set");
  char cmd[2048];
  snprintf(cmd, sizeof(cmd),
           "%s run --model %s/m --input %s %s >%s/out-%s 2>%s/err-%s", bin,
           dir, input, extra, dir, tag, dir, tag);
  int rc = system(cmd);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* The data file with two refused lines spliced in: a line that is not
 * JSON after line 5, an instance the model refuses after line 37, so
 * error objects must come out in their place too. Returns the path. */
static void spliced_input(const char *dir, const char *data, char *path,
                          size_t len) {
  char src[512];
  snprintf(src, sizeof(src), "%s/%s", getenv("CANOPY_DATA"), data);
  snprintf(path, len, "%s/input.jsonl", dir);
  FILE *in = fopen(src, "r"), *out = fopen(path, "w");
  cr_assert(in && out, "%s", src);
  char *line = NULL;
  size_t cap = 0;
  for (int i = 0; getline(&line, &cap, in) > 0; i++) {
    if (i == 5) fputs("{\"tree\": \n", out);
    if (i == 37) fputs("{\"nothing\": 1}\n", out);
    fputs(line, out);
  }
  free(line);
  fclose(in);
  fclose(out);
}

/* --jobs 2 and 3 print byte for byte what --jobs 1 prints, with the same
 * exit status and summary counts, for a family of each input kind; so do
 * jobs 1 to 3 with CANOPY_RUN_OVERLAP=1 (each job issues its next run
 * before it finishes the one before: the path a GPU takes). */
static void same_as_one_job(const char *family, const char *data,
                            const char *flags) {
  char dir[256], input[600], extra[512], path[600];
  cn_model *m = tu_model(family, 16, 16, data, dir, sizeof(dir));
  cn_model_free(m);
  spliced_input(dir, data, input, sizeof(input));
  snprintf(extra, sizeof(extra), "--batch 7 %s --jobs 1", flags);
  cr_assert_eq(run_cli(dir, input, extra, "1"), 2, "%s: --jobs 1", family);
  snprintf(path, sizeof(path), "%s/out-1", dir);
  size_t n1;
  char *one = read_file(path, &n1);
  cr_assert_gt(n1, 0);
  for (int v = 0; v < 5; v++) {
    int j = v < 2 ? v + 2 : v - 1; /* 2, 3, then 1, 2, 3 overlapped */
    bool overlap = v >= 2;
    char tag[8];
    snprintf(tag, sizeof(tag), "%d%s", j, overlap ? "o" : "");
    snprintf(extra, sizeof(extra), "--batch 7 %s --jobs %d", flags, j);
    if (overlap) setenv("CANOPY_RUN_OVERLAP", "1", 1);
    cr_expect_eq(run_cli(dir, input, extra, tag), 2, "%s: --jobs %d%s",
                 family, j, overlap ? " overlapped" : "");
    unsetenv("CANOPY_RUN_OVERLAP");
    snprintf(path, sizeof(path), "%s/out-%s", dir, tag);
    size_t nj;
    char *many = read_file(path, &nj);
    cr_expect(nj == n1 && memcmp(one, many, n1) == 0,
              "%s: --jobs %d%s differs from --jobs 1 (%zu vs %zu bytes)",
              family, j, overlap ? " overlapped" : "", nj, n1);
    free(many);
    snprintf(path, sizeof(path), "%s/err-%s", dir, tag);
    char *err = read_file(path, NULL);
    const char *sum = strstr(err, "{\"instances\": 400, \"errors\": 2,");
    cr_expect_not_null(sum, "%s --jobs %d: %s", family, j, err);
    char want[32];
    snprintf(want, sizeof(want), "\"jobs\": %d", j);
    cr_expect(sum && strstr(sum, want), "%s", err);
    /* the notes on refused lines name them, in input order */
    const char *a = strstr(err, "line 6:"), *b = strstr(err, "line 39:");
    cr_expect(a && b && a < b, "%s", err);
    free(err);
  }
  free(one);
  tu_rmdir(dir);
}

Test(run_jobs, tree_family_equals_one_job, .timeout = 120) {
  same_as_one_job("treelstm", "trees-binary.jsonl", "--outputs all");
}

Test(run_jobs, sequence_family_equals_one_job, .timeout = 120) {
  same_as_one_job("bilstm-tagger", "sequences.jsonl", "--return-hidden");
}

Test(run_jobs, dag_family_equals_one_job, .timeout = 120) {
  same_as_one_job("latticegru", "dags.jsonl", "");
}

Test(run_jobs, lattice_family_equals_one_job, .timeout = 120) {
  same_as_one_job("latticelstm", "lattices.jsonl", "--policy depth");
}

/* Order, checked against the input itself rather than against --jobs 1:
 * line i of the output has one row of logits per token of input line i,
 * and the refused lines' error objects sit at their own line. The first
 * chunks hold the longest sentences, so the first job finishes last. A
 * line with a NUL inside is refused whole, as before --jobs (not parsed
 * up to the NUL). */
Test(run_jobs, output_order_is_input_order, .timeout = 120) {
  char dir[256], input[600], path[600];
  cn_model *m = tu_model("bilstm-tagger", 16, 16, "sequences.jsonl", dir,
                         sizeof(dir));
  cn_model_free(m);
  json_t *lines = tu_data_lines("sequences.jsonl", 0);
  size_t n = json_array_size(lines);
  cr_assert_gt(n, 100);
  /* longest first: the sentence lengths of the 400 lines, sorted */
  size_t *ord = malloc(n * sizeof(size_t));
  for (size_t i = 0; i < n; i++) ord[i] = i;
  for (size_t i = 1; i < n; i++)
    for (size_t k = i; k > 0; k--) {
      size_t a = json_array_size(
          json_object_get(json_array_get(lines, ord[k - 1]), "tokens"));
      size_t b = json_array_size(
          json_object_get(json_array_get(lines, ord[k]), "tokens"));
      if (a >= b) break;
      size_t t = ord[k];
      ord[k] = ord[k - 1];
      ord[k - 1] = t;
    }
  snprintf(input, sizeof(input), "%s/input.jsonl", dir);
  FILE *f = fopen(input, "w");
  cr_assert_not_null(f);
  /* rows of logits each output line must have; 0: an error line */
  size_t *want = calloc(n + 3, sizeof(size_t));
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    if (i == 3 || i == n - 2) {
      fputs("[1, 2]\n", f); /* JSON, but not an instance */
      want[k++] = 0;
    }
    if (i == 11) { /* a valid instance, then a NUL and junk: not JSON */
      static const char nul[] = "{\"tokens\": [\"a\"]}\0junk\n";
      fwrite(nul, 1, sizeof(nul) - 1, f);
      want[k++] = BAD_JSON;
    }
    json_t *l = json_array_get(lines, ord[i]);
    char *s = json_dumps(l, JSON_COMPACT);
    fprintf(f, "%s\n", s);
    free(s);
    want[k++] = json_array_size(json_object_get(l, "tokens"));
  }
  fclose(f);
  cr_assert_eq(run_cli(dir, input, "--batch 5 --jobs 3", "3"), 2);
  snprintf(path, sizeof(path), "%s/out-3", dir);
  f = fopen(path, "r");
  cr_assert_not_null(f);
  char *line = NULL;
  size_t cap = 0, got = 0;
  while (getline(&line, &cap, f) > 0) {
    cr_assert_lt(got, k, "more output lines than input lines");
    json_t *o = json_loads(line, 0, NULL);
    cr_assert_not_null(o, "output line %zu is not JSON", got + 1);
    if (want[got] == 0)
      cr_expect_not_null(json_object_get(o, "error"),
                         "line %zu should be an error: %s", got + 1, line);
    else if (want[got] == BAD_JSON)
      cr_expect_str_eq(json_string_value(json_object_get(
                           json_object_get(o, "error"), "code")),
                       "bad_json", "line %zu: %s", got + 1, line);
    else
      cr_expect_eq(json_array_size(json_object_get(o, "logits")), want[got],
                   "line %zu: %zu rows of logits for %zu tokens", got + 1,
                   json_array_size(json_object_get(o, "logits")),
                   want[got]);
    json_decref(o);
    got++;
  }
  cr_expect_eq(got, k, "%zu output lines for %zu input lines", got, k);
  free(line);
  fclose(f);
  free(want);
  free(ord);
  json_decref(lines);
  tu_rmdir(dir);
}

/* A bad --jobs stops before any work with a message naming the flag and
 * its range; the default (no --jobs) is the number of cores this process
 * may use. */
Test(run_jobs, bad_jobs_value_is_refused, .timeout = 60) {
  char dir[256], path[600], input[600];
  cn_model *m = tu_model("treelstm", 8, 8, "trees-binary.jsonl", dir,
                         sizeof(dir));
  cn_model_free(m);
  snprintf(input, sizeof(input), "%s/trees-binary.jsonl",
           getenv("CANOPY_DATA"));
  const char *bad[] = {"--jobs 0", "--jobs -2", "--jobs two", "--jobs 2x",
                       "--jobs 100000", "--jobs=", "--jobs"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    cr_expect_eq(run_cli(dir, input, bad[i], "bad"), 1, "%s", bad[i]);
    snprintf(path, sizeof(path), "%s/out-bad", dir);
    size_t n;
    free(read_file(path, &n));
    cr_expect_eq(n, 0, "%s printed output", bad[i]);
    snprintf(path, sizeof(path), "%s/err-bad", dir);
    char *e = read_file(path, NULL);
    cr_expect(strstr(e, "--jobs") != NULL, "%s: %s", bad[i], e);
    free(e);
  }
  cr_assert_eq(run_cli(dir, input, "", "default"), 0);
  snprintf(path, sizeof(path), "%s/err-default", dir);
  char *e = read_file(path, NULL);
  char want[32];
  cpu_set_t set;
  cr_assert_eq(sched_getaffinity(0, sizeof(set), &set), 0);
  snprintf(want, sizeof(want), "\"jobs\": %d", CPU_COUNT(&set));
  cr_expect(strstr(e, want) != NULL, "%s", e);
  free(e);
  tu_rmdir(dir);
}
