/* run_chunks.h - how `canopy run` streams its input through its jobs
 * (run_chunks.c): chunks of --batch lines, each parsed, run and formatted
 * by a job, printed in input order. cmd_run.c parses the options, opens
 * the model and the backends, and prints the summary. */
#ifndef CANOPY_RUN_CHUNKS_H
#define CANOPY_RUN_CHUNKS_H

#include <stdbool.h>
#include <stdio.h>

#include "backends.h"
#include "canopy_core.h"
#include "config.h"

/* canopy run's options (cmd_run.c parses them). */
typedef struct run_opts {
  const char *model, *input, *backend;
  unsigned flags;
  cn_policy_kind policy;
  cn_layout layout;
  long long batch, threads, max_decode_len;
  long long jobs;            /* --jobs: runs computed at once (0: cores) */
  const char *policy_cache;  /* --policy-cache (NULL: the default)       */
  cn_fsm_encoding encoding;  /* --encoding, for --policy fsm            */
  bool no_learn;             /* --no-learn: a cache miss is an error     */
  bool no_reuse;             /* --no-arena-reuse: every row to the end   */
  cn_fsm *fsm;               /* --policy fsm: cached or learned here    */
  char *slurped;             /* stdin, kept to learn from and then run  */
  cn_config cfg;
} run_opts;

/* What the runs added up to, for the summary line. */
typedef struct totals {
  long long instances, errors, batches, lower_bound, kernels, vertices;
  long long policy_batches; /* the policy's, before the memory order */
  size_t gather_bytes, cell_bytes, arena_peak;
  size_t state_peak, state_total; /* docs/memory.md: the largest run's */
  /* the backend's counters (cn_backend_counters), summed over the runs */
  long long runs, syncs, to_device, to_host, allocs, launches, copies;
  /* CPU seconds by stage, summed over the threads (docs/cli.md):
   * reading lines, parsing them and building their graphs; planning;
   * executing; writing the answers */
  double parse_s, schedule_s, execute_s, output_s;
} totals;


/* Runs every line of `in` on `jobs` jobs (job j computes on job_bk[j]),
 * prints each output line to stdout in input order and notes to stderr,
 * and adds the counts to *tot. overlap: each job issues its next run
 * before it finishes the one before (a device computes one while the
 * host prepares the next). -1 when a run failed,
 * memory ran out or the jobs could not start (said on stderr). */
int cn__run_stream(const run_opts *o, const cn_model *m,
                   cn_backend_ctx **job_bk, int jobs, bool overlap, FILE *in,
                   totals *tot);

#endif
