/* cells_test_util.c - what the tests of models described by cells share
 * (test_cells_json.c: equal to the built-ins and to plain evaluations;
 * test_cells_refused.c: malformed descriptions). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cells_test_util.h"

const char *cells_dir(void) {
  const char *d = getenv("CANOPY_CELLS");
  cr_assert_not_null(d, "CANOPY_CELLS (tests/cells) is not set");
  return d;
}

json_t *cells_json(const char *name) {
  char path[512];
  snprintf(path, sizeof(path), "%s/%s.json", cells_dir(), name);
  json_error_t je;
  json_t *j = json_load_file(path, 0, &je);
  cr_assert_not_null(j, "%s: %s", path, je.text);
  return j;
}

void copy_file(const char *from, const char *to) {
  FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
  cr_assert(a != NULL && b != NULL, "copy %s -> %s", from, to);
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), a)) > 0)
    cr_assert_eq(fwrite(buf, 1, n, b), n);
  fclose(a);
  fclose(b);
}

/* dir/c: model.json = j, with dir/m's vocabulary and (weights == NULL)
 * its weights. Returns the load's code; *out the model or NULL. */
int load_cells(const char *dir, const json_t *j, cn_model **out,
               cn_err *err) {
  char c[600], p[700], q[700];
  snprintf(c, sizeof(c), "%s/c", dir);
  mkdir(c, 0700);
  snprintf(p, sizeof(p), "%s/m/vocab.txt", dir);
  snprintf(q, sizeof(q), "%s/vocab.txt", c);
  copy_file(p, q);
  snprintf(q, sizeof(q), "%s/weights.safetensors", c);
  if (access(q, F_OK) != 0) {
    snprintf(p, sizeof(p), "%s/m/weights.safetensors", dir);
    copy_file(p, q);
  }
  /* the built-in's class names, so that outputs compare whole */
  snprintf(p, sizeof(p), "%s/m/model.json", dir);
  json_t *mj = json_load_file(p, 0, NULL);
  json_t *labels = json_object_get(mj, "labels");
  if (labels != NULL && json_object_get(j, "labels") == NULL)
    json_object_set((json_t *)j, "labels", labels);
  json_decref(mj);
  snprintf(q, sizeof(q), "%s/model.json", c);
  cr_assert_eq(json_dump_file(j, q, JSON_INDENT(1)), 0);
  *out = NULL;
  cn_err_clear(err);
  return cn_model_load(c, out, err);
}
