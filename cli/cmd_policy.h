/* cmd_policy.h - loading or learning a model's FSM batching policy from
 * the command line (cmd_policy.c), shared by `canopy policy` and
 * `canopy run --policy fsm`. Messages go to stderr, prefixed by `who`. */
#ifndef CANOPY_CMD_POLICY_H
#define CANOPY_CMD_POLICY_H

#include <stdio.h>

#include "canopy_core.h"

/* The graphs of at most max_runs runs of `batch` consecutive instances of
 * a JSONL stream (lines that do not parse are skipped and counted); each
 * run is executed on bk first when bk != NULL (needed for graphs that grow
 * while they run: lstm-nmt). */
int cn__policy_graphs(const cn_model *m, cn_backend_ctx *bk, FILE *in,
                      unsigned flags, int batch, int max_runs,
                      const cn_limits *lim, cn_graph_set **out,
                      long long *skipped);
/* Learns a policy on the graphs of `in`, says so, stores it in the cache
 * (cache NULL: the default directory). 0 or -1. */
int cn__policy_learn(const cn_model *m, cn_backend_ctx *bk, const char *cache,
                     const char *who, const cn_fsm_opts *o, FILE *in,
                     unsigned flags, int batch, int max_runs,
                     const cn_limits *lim, cn_fsm **out);
/* The cached policy (0), or -1 with a warning for a stale or corrupt file
 * and silence for none. */
int cn__policy_cached(const cn_model *m, const char *cache, const char *who,
                      cn_fsm_encoding enc, cn_fsm **out);

#endif
