/* engine_util.h - helpers shared by the engine tests: temporary models,
 * running instances through the engine, comparing JSON outputs. */
#ifndef CANOPY_TEST_ENGINE_UTIL_H
#define CANOPY_TEST_ENGINE_UTIL_H

#include <jansson.h>
#include <stdio.h>

#include "backends.h"
#include "canopy_core.h"

/* A fresh model of `family` in a temp dir (vocab from a data file when
 * data != NULL, e.g. "trees-binary.jsonl" under $CANOPY_DATA). */
cn_model *tu_model(const char *family, int H, int D, const char *data,
                   char *dir_out, size_t dir_len);
/* Lines of a data file under $CANOPY_DATA (at most max), parsed. */
json_t *tu_data_lines(const char *name, int max);
/* Runs instances (a JSON array) in runs of `batch`, returns a JSON array of
 * per-instance outputs (or error objects). */
json_t *tu_run(const cn_model *m, const json_t *insts, cn_policy_kind pol,
               int batch, unsigned flags, long long *batches,
               long long *lower_bound);
/* Largest absolute difference between numbers of two JSON values of the
 * same shape; returns 1e30 when the shapes differ. */
double tu_json_maxdiff(const json_t *a, const json_t *b);
void tu_rmdir(const char *dir);

#endif
