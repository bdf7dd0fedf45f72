/* test_instance_at.c - an INSTANCE object read where it lies inside a
 * larger document (cn_instance_parse_at, core/model/instance_at.c), as a
 * daemon request's "instances" hold them, against the same object read as
 * a line of its own (cn_instance_parse_line, itself checked against
 * jansson's path by test_instance_line.c).
 *
 * Every line of data/ is put in an envelope between other values - an
 * instance whose strings hold brackets, braces, escaped quotes and runs
 * of backslashes, whitespace of each kind - and read at its offset: the
 * same instance, array for array, and *end exactly past its closing
 * brace. Cut envelopes (at every byte of the object) are never read, and
 * a value that is not an object is declined. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_util.h"
#include "internal.h"

static char dir[256];

/* A fresh model of family at H = 4 (test_instance_line.c's). */
static cn_model *model(const char *family, const char *data) {
  char path[512];
  cn_model_init_opts o = {.family = family, .hidden = 4, .embed = 4,
                          .classes = 3,
                          .vocab_from = tu_data_path(data, path, sizeof(path)),
                          .seed = 7};
  return tu_model_opts(o, dir, sizeof(dir));
}

/* Byte for byte the arrays both readers fill, by input kind. */
static void same(const cn_instance *x, const cn_instance *y) {
  cr_assert_eq(x->kind, y->kind);
  cr_assert_eq(cn_instance_vertices(x, 1), cn_instance_vertices(y, 1));
  cr_assert_eq(cn_instance_unknown(x, NULL, 0), cn_instance_unknown(y, NULL, 0));
  if (x->kind == CN_INPUT_TREE) {
    cr_assert_eq(x->tree.n_nodes, y->tree.n_nodes);
    cr_assert(memcmp(x->ids, y->ids, (size_t)x->tree.n_nodes *
                                         sizeof(*x->ids)) == 0);
  } else {
    cr_assert_eq(x->n, y->n);
    cr_assert(memcmp(x->ids, y->ids, (size_t)x->n * sizeof(*x->ids)) == 0);
  }
}

/* An instance whose strings hold what a bracket count must skip: its
 * words (a"}]\ and b\\"{[) hold a bracket, a brace, escaped quotes and
 * runs of backslashes before a quote. A tree model reads it. */
static const char decoy[] =
    "{\"tree\": \"(S (N a\\\"}]\\\\) (V b\\\\\\\\\\\"{[))\"}";

static void check_family(const char *family, const char *data,
                         bool tree) {
  cn_model *m = model(family, data);
  cn_line_reader *rd = cn_line_reader_new();
  cn_limits lim;
  cn_limits_default(&lim);
  char path[512];
  snprintf(path, sizeof(path), "%s/%s", getenv("CANOPY_DATA"), data);
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f);
  char *line = NULL;
  size_t cap = 0;
  ssize_t len;
  int n = 0;
  while ((len = getline(&line, &cap, f)) > 0) {
    if (line[len - 1] == '\n') line[--len] = '\0';
    cn_line_reader_reset(rd);
    cn_instance *alone = NULL, *at = NULL;
    cr_assert_eq(cn_instance_parse_line(m, rd, line, (size_t)len, &lim,
                                        &alone), 0, "%s", line);
    /* {"instances": [DECOY,\n\t LINE \r\n, DECOY]} */
    size_t cap2 = (size_t)len + 2 * sizeof(decoy) + 64;
    char *doc = malloc(cap2);
    int pre = snprintf(doc, cap2, "{\"instances\": [%s,\n\t ", decoy);
    memcpy(doc + pre, line, (size_t)len);
    int post = snprintf(doc + pre + len, cap2 - (size_t)pre - (size_t)len,
                        " \r\n, %s]}", decoy);
    size_t dlen = (size_t)pre + (size_t)len + (size_t)post, end = 0;
    cr_assert_eq(cn_instance_parse_at(m, rd, doc, dlen, (size_t)pre, &lim,
                                      &at, &end), 0, "%s", line);
    cr_assert_eq(end, (size_t)pre + (size_t)len, "%s", line);
    same(alone, at);
    /* the decoy before it: its extent, strings and all */
    cn_instance *d = NULL;
    size_t dstart = strlen("{\"instances\": [");
    int rc = cn_instance_parse_at(m, rd, doc, dlen, dstart, &lim, &d, &end);
    if (tree) cr_assert_eq(rc, 0, "the decoy is not read");
    if (rc == 0) cr_assert_eq(end, dstart + strlen(decoy));
    /* cut anywhere inside the object: never read */
    if (n % 16 == 0)
      for (size_t c = (size_t)pre; c < (size_t)pre + (size_t)len; c++)
        cr_assert_neq(cn_instance_parse_at(m, rd, doc, c, (size_t)pre, &lim,
                                           &at, &end), 0);
    /* not an object where it is asked for */
    cr_assert_eq(cn_instance_parse_at(m, rd, doc, dlen, (size_t)pre - 1,
                                      &lim, &at, &end), 1);
    free(doc);
    n++;
  }
  cr_assert_gt(n, 0);
  free(line);
  fclose(f);
  cn_line_reader_free(rd);
  cn_model_free(m);
  tu_rmdir(dir);
}

Test(instance_at, trees) { check_family("treelstm", "trees-binary.jsonl", true); }
Test(instance_at, sequences) {
  check_family("bilstm-tagger", "sequences.jsonl", false);
}
Test(instance_at, dags) { check_family("latticegru", "dags.jsonl", false); }
