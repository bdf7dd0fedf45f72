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
/* A fresh model of options o in a new temp dir (written to dir_out; the
 * model goes to its m/, which replaces o.dir): what tu_model does for
 * tests that set other options (classes, lexicon). */
cn_model *tu_model_opts(cn_model_init_opts o, char *dir_out, size_t dir_len);
/* $CANOPY_DATA/name into path (failing the test when it is not set). */
const char *tu_data_path(const char *name, char *path, size_t len);
/* Lines of a data file under $CANOPY_DATA (at most max), parsed. */
json_t *tu_data_lines(const char *name, int max);
/* Runs instances (a JSON array) in runs of `batch` on backend bk, returns a
 * JSON array of per-instance outputs (or error objects). */
json_t *tu_run_on(cn_backend_ctx *bk, const cn_model *m, const json_t *insts,
                  cn_policy_kind pol, int batch, unsigned flags,
                  long long *batches, long long *lower_bound);
/* The layout tu_run_on's runs use (default fused), and the statistics of
 * its last call, summed over its runs (instances: the number of runs). */
extern cn_layout tu_layout;
extern cn_run_stats tu_stats;
/* A cpu backend context (failing the test if none opens); the caller
 * closes it. */
cn_backend_ctx *tu_cpu(void);
/* The same on a fresh cpu backend context. */
json_t *tu_run(const cn_model *m, const json_t *insts, cn_policy_kind pol,
               int batch, unsigned flags, long long *batches,
               long long *lower_bound);
/* Largest absolute difference between numbers of two JSON values of the
 * same shape; returns 1e30 when the shapes differ. */
double tu_json_maxdiff(const json_t *a, const json_t *b);
/* Floats of states one output object prints: logits rows (per node with
 * "nodes", the root's being nodes[0]) and hidden vectors ("h"); what a
 * device must bring back for it. */
long long tu_answer_floats(const json_t *o);
/* Rewrites the weights file at path without tensor drop, with tensor
 * reshape given shape [r, c] (zeros) and with a tensor add of shape [r, c]
 * (zeros), each where not NULL: the broken models the load tests expect
 * to be refused. */
void tu_rewrite_weights(const char *path, const char *drop,
                        const char *reshape, const char *add, int64_t r,
                        int64_t c);
void tu_rmdir(const char *dir);

/* Every family with the data file its instances come from. */
typedef struct tu_family {
  char family[32];
  char data[32];
} tu_family;
extern tu_family tu_families[];
extern const size_t tu_n_families;
/* The data file of a family of tu_families (NULL for another name). */
const char *tu_data_for(const char *family);

/* Fewest batches any schedule of the run's graph can launch (<= 32
 * vertices): breadth-first search over the sets of executed vertices. */
struct cn_run;
int tu_brute_force_min(const struct cn_run *r);

#endif
