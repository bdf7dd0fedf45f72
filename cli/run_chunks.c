/* run_chunks.c - `canopy run`'s input through its jobs (run_chunks.h).
 *
 * The main thread reads the input in chunks of --batch lines; a job (a
 * thread of run_pool.c, with its own backend context) parses a chunk's
 * lines, runs them as one cn_run and formats the outputs into memory; the
 * main thread prints the chunks in input order, so the output is
 * byte-equal to --jobs 1. On a device a job's work comes in two halves
 * (chunk_start issues the run, chunk_finish waits and formats), so it
 * prepares its next run while the device computes the one before.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "progress.h"
#include "run_chunks.h"
#include "run_pool.h"

/* One line's state inside a chunk: its parsed instance, or its error. */
typedef struct line {
  cn_instance *inst;
  int slot;
  cn_err err;
  long long lineno;
} line;

/* Up to --batch consecutive input lines: read by the main thread, parsed,
 * computed and formatted by a job, printed by the main thread. Reused. */
typedef struct chunk {
  char *text;          /* the raw lines, each NUL-terminated            */
  size_t used, cap;
  size_t *off;         /* [batch]: where line i starts in text         */
  line *ls;            /* [batch]                                      */
  int n;
  long long first_lineno;
  cn_buf out;          /* formatted stdout lines (kept from chunk to
                          chunk: written once, no FILE in between)     */
  char *notes;         /* stderr notes                                 */
  size_t notes_len;
  FILE *fnotes;        /* open on notes while the chunk runs           */
  cn_run *run;         /* issued by chunk_start, done by chunk_finish  */
  double read_s;       /* CPU the main thread spent reading its lines  */
  totals tot;          /* this chunk's share                           */
  int rc;              /* -1: the run failed (its note is in notes)    */
  cn_line_reader *rd;  /* its instances, reset when the chunk is reused */
  long long last_vertices; /* of its last run: the next one's reserve */
} chunk;

static void print_error(cn_buf *out, FILE *notes, const line *l) {
  json_t *e = cn_err_to_json(&l->err);
  cn_buf_json(out, e);
  cn_buf_put(out, "\n", 1);
  json_decref(e);
  fprintf(notes, "canopy run: line %lld: %s: %s\n", l->lineno,
          cn_err_code(l->err.code), l->err.msg);
}

/* Parses one raw line into l (an instance, or the error it gets): read
 * directly by rd where it can, else (any other shape, and every error)
 * through jansson and cn_instance_parse. */
static void parse_line(const run_opts *o, const cn_model *m,
                       cn_line_reader *rd, const char *buf, size_t len,
                       long long lineno, line *l) {
  l->inst = NULL; /* field by field: the error's 320-byte message is */
  l->slot = 0;    /* written only when there is one                  */
  cn_err_clear(&l->err);
  l->lineno = lineno;
  if (rd != NULL &&
      cn_instance_parse_line(m, rd, buf, len, &o->cfg.limits, &l->inst) == 0)
    return;
  json_error_t je;
  json_t *j = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
  if (j == NULL) {
    cn_err_set(&l->err, CN_E_BAD_JSON, "line %lld is not JSON: %s", lineno,
               je.text);
    l->err.offset = je.position;
    l->err.instance = (int)(lineno - 1);
    return;
  }
  cn_instance_parse(m, j, &o->cfg.limits, (int)(lineno - 1), &l->inst,
                    &l->err);
  json_decref(j);
}

/* Issues one chunk of lines as one run (*rp; on a device backend it may
 * still be computing on return): notes on a failed run go to notes. *rp,
 * when not NULL, is the chunk's run of its last chunk, reset: its graph
 * and plan arrays are reused (cn_run_reset). */
static int run_start(const run_opts *o, const cn_model *m, cn_backend_ctx *bk,
                     line *ls, int n, long long reserve, FILE *notes,
                     cn_run **rp) {
  if (*rp != NULL && cn_run_reset(*rp, m, bk) != 0) {
    cn_run_free(*rp);
    *rp = NULL;
  }
  cn_run *r = *rp != NULL ? *rp : (*rp = cn_run_new(m, bk));
  if (r == NULL) {
    fprintf(notes, "canopy run: no memory for a run\n");
    return -1;
  }
  /* the graph's arrays at the last run's size at once (a hint: a failure
   * leaves them to grow as they go) */
  (void)cn_run_reserve(r, n, reserve);
  cn_run_set_async(r, 1);
  cn_run_set_layout(r, o->layout);
  cn_run_set_plan_width(r, o->cfg.serve.plan_width);
  if (o->no_reuse) cn_run_set_arena_reuse(r, 0);
  cn_run_set_memory_budget(r, o->cfg.serve.memory_budget);
  for (int i = 0; i < n; i++) {
    if (ls[i].inst == NULL) continue;
    ls[i].slot = cn_run_add(r, ls[i].inst, o->flags, (int)o->max_decode_len);
    if (ls[i].slot < 0) {
      cn_err_set(&ls[i].err, ls[i].slot, "could not add the instance");
      cn_instance_free(ls[i].inst);
      ls[i].inst = NULL;
    }
  }
  cn_err err;
  cn_err_clear(&err);
  if ((o->fsm != NULL ? cn_run_exec_fsm(r, o->fsm, &err)
                      : cn_run_exec(r, o->policy, &err)) != 0) {
    fprintf(notes, "canopy run: %s\n", err.msg);
    return -1;
  }
  return 0;
}

/* Waits for a run_start'ed run and writes its outputs, in order, to out
 * (and notes on refused lines or a failed run to notes). */
static int write_outputs(cn_run *r, line *ls, int n, totals *tot, cn_buf *out,
                      FILE *notes) {
  cn_err err;
  cn_err_clear(&err);
  if (cn_run_wait(r, &err) != 0) {
    fprintf(notes, "canopy run: %s\n", err.msg);
    return -1;
  }
  double t0 = cn_thread_cpu_s();
  cn_run_stats st;
  cn_run_get_stats(r, &st);
  tot->schedule_s += st.schedule_s;
  tot->execute_s += st.execute_s;
  tot->batches += st.batches;
  tot->lower_bound += st.lower_bound;
  tot->policy_batches += st.policy_batches;
  tot->kernels += st.kernels;
  tot->vertices += st.vertices;
  tot->gather_bytes += st.gather_bytes;
  tot->cell_bytes += st.cell_bytes;
  if (st.arena_bytes > tot->arena_peak) tot->arena_peak = st.arena_bytes;
  if (st.state_bytes > tot->state_peak) tot->state_peak = st.state_bytes;
  if (st.state_bytes_total > tot->state_total)
    tot->state_total = st.state_bytes_total;
  tot->runs++;
  tot->syncs += st.device_syncs;
  tot->to_device += st.bytes_to_device;
  tot->to_host += st.bytes_to_host;
  tot->allocs += st.device_allocs;
  tot->launches += st.launches;
  tot->copies += st.copies_to_device;
  for (int i = 0; i < n; i++) {
    if (ls[i].inst == NULL) {
      print_error(out, notes, &ls[i]);
      tot->errors++;
      continue;
    }
    if (cn_run_write_output(r, ls[i].slot, out, &ls[i].err) != 0) {
      print_error(out, notes, &ls[i]); /* NaN: an error line */
      tot->errors++;
      continue;
    }
    cn_buf_put(out, "\n", 1);
    tot->instances++;
  }
  tot->output_s += cn_thread_cpu_s() - t0;
  return 0;
}

/* What every job shares: the options, the model, one backend context per
 * job (indexed by the pool's thread number). */
typedef struct jobs_ctx {
  const run_opts *o;
  const cn_model *m;
  cn_backend_ctx **bk;
} jobs_ctx;

/* A job's first half (run_pool.h): parse one chunk and issue its run. */
static void chunk_start(void *arg, int thread, void *item) {
  jobs_ctx *jc = arg;
  chunk *c = item;
  double t0 = cn_thread_cpu_s();
  cn_line_reader_reset(c->rd); /* the chunk's last instances are freed */
  for (int i = 0; i < c->n; i++) { /* a line may hold a NUL: lengths */
    size_t end = i + 1 < c->n ? c->off[i + 1] : c->used;
    parse_line(jc->o, jc->m, c->rd, c->text + c->off[i],
               end - c->off[i] - 1, c->first_lineno + i, &c->ls[i]);
  }
  memset(&c->tot, 0, sizeof(c->tot));
  c->out.len = 0;
  c->fnotes = open_memstream(&c->notes, &c->notes_len);
  if (c->fnotes == NULL)
    c->rc = -1;
  else
    c->rc = run_start(jc->o, jc->m, jc->bk[thread], c->ls, c->n,
                      c->last_vertices, c->fnotes, &c->run);
  /* the lines and their graphs (cn_run_add); the run's own planning and
   * execution are its stats' */
  double dt = cn_thread_cpu_s() - t0;
  cn_run_stats st;
  if (c->run != NULL) {
    cn_run_get_stats(c->run, &st);
    dt -= st.schedule_s + st.execute_s;
    c->last_vertices = st.vertices;
  }
  c->tot.parse_s += dt;
}

/* Its second half: wait for the run and format its outputs into memory. */
static void chunk_finish(void *arg, int thread, void *item) {
  jobs_ctx *jc = arg;
  chunk *c = item;
  if (c->rc == 0)
    c->rc = write_outputs(c->run, c->ls, c->n, &c->tot, &c->out, c->fnotes);
  if (c->out.failed) {
    fprintf(c->fnotes, "canopy run: no memory for the answers\n");
    c->rc = -1;
  }
  /* the run's arena and the instances go: counted with the graphs they
   * held; the run's host arrays stay for the chunk's next run */
  double t0 = cn_thread_cpu_s();
  if (c->run != NULL && cn_run_reset(c->run, jc->m, jc->bk[thread]) != 0) {
    cn_run_free(c->run);
    c->run = NULL;
  }
  for (int i = 0; i < c->n; i++) {
    cn_instance_free(c->ls[i].inst);
    c->ls[i].inst = NULL;
  }
  if (c->fnotes != NULL) fclose(c->fnotes);
  c->fnotes = NULL;
  c->tot.parse_s += cn_thread_cpu_s() - t0;
}

/* Both halves at once (host backends: nothing to overlap). */
static void chunk_work(void *arg, int thread, void *item) {
  chunk_start(arg, thread, item);
  chunk_finish(arg, thread, item);
}

/* Prints a computed chunk and adds its totals; returns its status. */
static int chunk_emit(chunk *c, totals *tot, cn__progress *pg) {
  double t0 = cn_thread_cpu_s();
  if (c->out.len > 0) fwrite(c->out.p, 1, c->out.len, stdout);
  c->out.len = 0;
  if (c->notes != NULL && c->notes_len > 0) cn__progress_clear(pg);
  if (c->notes != NULL) {
    fflush(stdout);
    fwrite(c->notes, 1, c->notes_len, stderr);
  }
  free(c->notes);
  c->notes = NULL;
  tot->output_s += cn_thread_cpu_s() - t0;
  if (c->rc != 0) return -1;
  tot->parse_s += c->tot.parse_s + c->read_s;
  tot->schedule_s += c->tot.schedule_s;
  tot->execute_s += c->tot.execute_s;
  tot->output_s += c->tot.output_s;
  tot->instances += c->tot.instances;
  tot->errors += c->tot.errors;
  tot->batches += c->tot.batches;
  tot->lower_bound += c->tot.lower_bound;
  tot->policy_batches += c->tot.policy_batches;
  tot->kernels += c->tot.kernels;
  tot->vertices += c->tot.vertices;
  tot->gather_bytes += c->tot.gather_bytes;
  tot->cell_bytes += c->tot.cell_bytes;
  if (c->tot.arena_peak > tot->arena_peak) tot->arena_peak = c->tot.arena_peak;
  if (c->tot.state_peak > tot->state_peak) tot->state_peak = c->tot.state_peak;
  if (c->tot.state_total > tot->state_total)
    tot->state_total = c->tot.state_total;
  tot->runs += c->tot.runs;
  tot->syncs += c->tot.syncs;
  tot->to_device += c->tot.to_device;
  tot->to_host += c->tot.to_host;
  tot->allocs += c->tot.allocs;
  tot->launches += c->tot.launches;
  return 0;
}

/* Reads up to `batch` lines from in into c; returns how many (0: EOF). */
static int chunk_fill(chunk *c, FILE *in, long long batch, char **buf,
                      size_t *cap, long long *lineno) {
  c->n = 0;
  double t0 = cn_thread_cpu_s();
  c->used = 0;
  c->first_lineno = *lineno + 1;
  ssize_t len;
  while (c->n < batch && (len = getline(buf, cap, in)) >= 0) {
    ++*lineno;
    if (len > 0 && (*buf)[len - 1] == '\n') (*buf)[--len] = '\0';
    if (c->used + (size_t)len + 1 > c->cap) {
      size_t ncap = 2 * (c->used + (size_t)len + 1);
      char *t = realloc(c->text, ncap);
      if (t == NULL) return -1;
      c->text = t;
      c->cap = ncap;
    }
    memcpy(c->text + c->used, *buf, (size_t)len + 1);
    c->off[c->n++] = c->used;
    c->used += (size_t)len + 1;
  }
  c->read_s = cn_thread_cpu_s() - t0;
  return c->n;
}

static void chunks_free(chunk *cs, int n) {
  for (int i = 0; cs != NULL && i < n; i++) {
    free(cs[i].text);
    free(cs[i].off);
    free(cs[i].ls);
    cn_buf_free(&cs[i].out);
    free(cs[i].notes);
    cn_line_reader_free(cs[i].rd);
    cn_run_free(cs[i].run);
  }
  free(cs);
}

/* Two chunks a job: one computing, one read ahead (or waiting to be
 * printed behind a slower neighbour); a single job on a device keeps two
 * as well (one on the device, one prepared meanwhile). *cs and *n_cs are
 * set as soon as they exist (the caller frees them with chunks_free). */
static int alloc_chunks(long long batch, int jobs, bool overlap, chunk **cs,
                        int *n_cs) {
  *n_cs = jobs > 1 || overlap ? 2 * jobs : 1;
  *cs = calloc((size_t)*n_cs, sizeof(chunk));
  if (*cs == NULL) return -1;
  for (int i = 0; i < *n_cs; i++) {
    (*cs)[i].off = calloc((size_t)batch, sizeof(size_t));
    (*cs)[i].ls = calloc((size_t)batch, sizeof(line));
    (*cs)[i].rd = cn_line_reader_new();
    if ((*cs)[i].off == NULL || (*cs)[i].ls == NULL || (*cs)[i].rd == NULL)
      return -1;
  }
  return 0;
}

/* Reads the input chunk by chunk into the pool and prints the computed
 * chunks in input order: a slot is refilled only after its last chunk,
 * the oldest pending, is taken back and printed. Then the pool is
 * drained. True when a chunk failed or memory ran out. */
static bool stream_chunks(cn__pool *pool, chunk *cs, int n_cs, FILE *in,
                          long long batch, char **buf, size_t *cap,
                          totals *tot, cn__progress *pg) {
  long long lineno = 0;
  bool failed = false;
  for (long long seq = 0; !failed; seq++) {
    chunk *c = &cs[seq % n_cs];
    if (seq >= n_cs) { /* the slot's last chunk is the oldest pending */
      chunk *done = cn__pool_take(pool);
      if (chunk_emit(done, tot, pg) != 0) failed = true;
      if (failed) break;
      cn__progress_show(pg, tot->instances, tot->errors);
    }
    int n = chunk_fill(c, in, batch, buf, cap, &lineno);
    if (n < 0) {
      fprintf(stderr, "canopy run: no memory for line %lld\n", lineno);
      failed = true;
    }
    if (n <= 0) break;
    cn__pool_submit(pool, c);
  }
  for (chunk *c; (c = cn__pool_take(pool)) != NULL;) {
    if (!failed && chunk_emit(c, tot, pg) != 0) failed = true;
    if (!failed) cn__progress_show(pg, tot->instances, tot->errors);
  }
  return failed;
}

int cn__run_stream(const run_opts *o, const cn_model *m,
                   cn_backend_ctx **job_bk, int jobs, bool overlap, FILE *in,
                   totals *tot) {
  chunk *cs = NULL;
  int n_cs = 0, rc = -1;
  char *buf = NULL;
  size_t cap = 0;
  cn__pool *pool = NULL;
  jobs_ctx jc = {.o = o, .m = m, .bk = job_bk};
  if (alloc_chunks(o->batch, jobs, overlap, &cs, &n_cs) != 0) {
    fprintf(stderr, "canopy run: no memory for %d chunks\n", n_cs);
    goto out;
  }
  pool = overlap ? cn__pool_new(jobs, n_cs, chunk_start, chunk_finish, &jc)
                 : cn__pool_new(jobs, n_cs, chunk_work, NULL, &jc);
  if (pool == NULL) {
    fprintf(stderr, "canopy run: cannot start %d jobs\n", jobs);
    goto out;
  }
  cn__progress pg;
  cn__progress_init(&pg, in);
  bool failed = stream_chunks(pool, cs, n_cs, in, o->batch, &buf, &cap, tot,
                              &pg);
  cn__progress_clear(&pg);
  rc = failed ? -1 : 0;
out:
  cn__pool_free(pool);
  chunks_free(cs, n_cs);
  free(buf);
  return rc;
}
