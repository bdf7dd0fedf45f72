/* metrics_text.c - the exposition of the counters metrics.c keeps: the
 * whole /metrics page in the Prometheus text format 0.0.4, written from
 * one snapshot of the counters under their mutex (cn__metrics_render).
 *
 * Names follow the Prometheus conventions: base units (seconds, bytes),
 * `_total` on counters, histograms as _bucket/_sum/_count with cumulative
 * buckets and a final le="+Inf". `promtool check metrics` runs on this
 * output in the tests. */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics_impl.h"

/* A growing text buffer. */
typedef struct sbuf {
  char *p;
  size_t len, cap;
  int oom;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < b->cap - b->len) {
      b->len += (size_t)n;
      return;
    }
    size_t cap = (b->cap + (size_t)n + 1) * 2;
    char *q = realloc(b->p, cap);
    if (q == NULL) {
      b->oom = 1;
      return;
    }
    b->p = q;
    b->cap = cap;
  }
}

static void head(sbuf *b, const char *name, const char *type,
                 const char *help) {
  sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void counter(sbuf *b, const char *name, const char *help,
                    unsigned long long v) {
  head(b, name, "counter", help);
  sb_printf(b, "%s %llu\n", name, v);
}

static void gauge(sbuf *b, const char *name, const char *help, double v) {
  head(b, name, "gauge", help);
  sb_printf(b, "%s %.17g\n", name, v);
}

/* The labels of a series of model slot mi: model="NAME" and a comma, or
 * nothing for the slot of requests naming no model (health probes,
 * /metrics, the index, unknown routes and names). A model="" label would
 * read as a model with an empty name; Prometheus stores an empty label as
 * no label anyway, so the series are the same ones. */
static void model_label(char *out, size_t cap, const cn__metrics *m, int mi) {
  if (mi < m->n_models) snprintf(out, cap, "model=\"%s\",", m->model_names[mi]);
  else out[0] = '\0';
}

static void counter_f(sbuf *b, const char *name, const char *help,
                      double v) {
  head(b, name, "counter", help);
  sb_printf(b, "%s %.6f\n", name, v);
}

/* One histogram family with a model label: a series per model slot in
 * use, and one without the label (requests naming no model) when it has
 * any. */
static void hist(sbuf *b, const char *name, const char *help,
                 const cn__metrics *m, const cn__hist *hs) {
  head(b, name, "histogram", help);
  for (int k = 0; k <= m->n_models; k++) {
    int mi = k < m->n_models ? k : m->cap;
    const cn__hist *h = &hs[mi];
    char lab[300]; /* a label value is at most 2 x 128 bytes */
    if (k == m->n_models && h->count == 0) continue;
    model_label(lab, sizeof(lab), m, mi);
    uint64_t cum = 0;
    for (int i = 0; i < h->n; i++) {
      cum += h->counts[i];
      sb_printf(b, "%s_bucket{%sle=\"%g\"} %llu\n", name, lab, h->le[i],
                (unsigned long long)cum);
    }
    cum += h->counts[h->n];
    sb_printf(b, "%s_bucket{%sle=\"+Inf\"} %llu\n", name, lab,
              (unsigned long long)cum);
    /* the labels less their trailing comma: {model="m"} or none */
    size_t ll = strlen(lab);
    if (ll > 0) lab[ll - 1] = '\0';
    sb_printf(b, "%s_sum%s%s%s %.17g\n%s_count%s%s%s %llu\n", name,
              ll ? "{" : "", lab, ll ? "}" : "", h->sum, name, ll ? "{" : "",
              lab, ll ? "}" : "", (unsigned long long)h->count);
  }
}

static const char *const retrain_results[CN__N_RETRAIN] = {"swapped", "kept",
                                                         "failed"};

/* One family with a worker label per worker: the backend's counters. */
static void per_worker(sbuf *b, const char *name, const char *type,
                       const char *help, const cn__metrics *m,
                       size_t field) {
  head(b, name, type, help);
  for (int w = 0; w < m->n_workers; w++) {
    long long v;
    memcpy(&v, (const char *)&m->worker_dev[w] + field, sizeof(v));
    sb_printf(b, "%s{worker=\"%d\"} %lld\n", name, w, v);
  }
}

/* Under m->mu: requests by model and status, and the instances answered
 * per model. */
static void render_requests(sbuf *b, const cn__metrics *m) {
  head(b, "canopy_requests_total", "counter",
       "HTTP requests answered, by model and status");
  for (int k = 0; k <= m->n_models; k++)
    for (int si = 0; si < CN__N_STATUS; si++) {
      int mi = k < m->n_models ? k : m->cap; /* the last: no model */
      uint64_t v = m->requests[mi * CN__N_STATUS + si];
      if (v == 0 && !(si == 0 && mi < m->n_models)) continue;
      char st[8];
      if (statuses[si]) snprintf(st, sizeof(st), "%d", statuses[si]);
      else snprintf(st, sizeof(st), "other");
      char lab[300]; /* a label value is at most 2 x 128 bytes */
      model_label(lab, sizeof(lab), m, mi);
      sb_printf(b, "canopy_requests_total{%sstatus=\"%s\"} %llu\n", lab, st,
                (unsigned long long)v);
    }
  head(b, "canopy_protocol_requests_total", "counter",
       "requests answered (those of canopy_requests_total), by how they "
       "arrived: http (/v1, /v2) or grpc (each call is the /v2 request it "
       "asks for)");
  static const char *const protos[CN__N_PROTOS] = {"http", "grpc"};
  for (int p = 0; p < CN__N_PROTOS; p++)
    sb_printf(b, "canopy_protocol_requests_total{protocol=\"%s\"} %llu\n",
              protos[p], (unsigned long long)m->protocol_requests[p]);
  head(b, "canopy_instances_total", "counter",
       "instances answered with outputs, by model");
  for (int mi = 0; mi < m->n_models; mi++)
    sb_printf(b, "canopy_instances_total{model=\"%s\"} %llu\n",
              m->model_names[mi], (unsigned long long)m->instances[mi]);
}

/* Under m->mu: the latency and batch-size histograms, runs, and why
 * windows closed. */
static void render_runs(sbuf *b, const cn__metrics *m) {
  hist(b, "canopy_request_duration_seconds",
       "time from a request's arrival to its answer", m, m->request_s);
  hist(b, "canopy_queue_duration_seconds",
       "time a request waited (window and queue) before its run started",
       m, m->queue_s);
  hist(b, "canopy_compute_duration_seconds",
       "time a worker spent executing one run", m, m->compute_s);
  hist(b, "canopy_batch_size_instances", "instances per executed run",
       m, m->batch_instances);
  counter(b, "canopy_runs_total", "runs executed", m->runs);
  static const char *why[CN__N_CLOSE] = {"idle_worker", "worker_freed",
                                         "max_delay", "size", "flush",
                                         "join", "memory"};
  head(b, "canopy_window_closes_total", "counter",
       "aggregation windows closed into runs, by reason (docs/daemon.md)");
  for (int i = 0; i < CN__N_CLOSE; i++)
    sb_printf(b, "canopy_window_closes_total{reason=\"%s\"} %llu\n", why[i],
              (unsigned long long)m->window_closes[i]);
}

/* Under m->mu: decode sessions, and the batches launched against their
 * lower bound (docs/models.md), overall and by model. */
/* Where the CPU went, by model and stage (docs/daemon.md "Stage
 * times"), and the loop thread's own (http): counters of seconds. */
static void render_stages(sbuf *b, const cn__metrics *m, double loop_cpu) {
  static const char *const names[CN__N_STAGES] = {"parse", "schedule",
                                                  "execute", "output"};
  head(b, "canopy_stage_seconds_total", "counter",
       "CPU seconds by model and stage: parse (body to instances and their "
       "graphs), schedule (the run's plan), execute (its batches), output "
       "(answers written)");
  for (int i = 0; i < m->n_models; i++)
    for (int k = 0; k < CN__N_STAGES; k++)
      sb_printf(b, "canopy_stage_seconds_total{model=\"%s\",stage=\"%s\"} "
                "%.6f\n", m->model_names[i], names[k],
                m->stage_s[(size_t)i * CN__N_STAGES + k]);
  double http = loop_cpu - m->loop_parse_s;
  counter_f(b, "canopy_http_seconds_total",
            "CPU seconds of the HTTP front end: the loop thread's, less "
            "the parsing it did (in canopy_stage_seconds_total)",
            http > 0 ? http : 0);
}

static void render_batching(sbuf *b, const cn__metrics *m) {
  counter(b, "canopy_decode_sessions_total",
          "decode sessions started (continuous-decoding)", m->decode_sessions);
  counter(b, "canopy_decode_joined_instances_total",
          "instances that joined a decode session in flight",
          m->decode_joined);
  counter(b, "canopy_decode_early_instances_total",
          "instances answered while other instances of their session were "
          "still decoding", m->decode_early);
  counter(b, "canopy_batches_total",
          "batched vertex launches of all runs", m->batches);
  counter(b, "canopy_lower_bound_batches_total",
          "sum over runs of the lower bound on batches (docs/models.md)",
          m->lower_bound);
  head(b, "canopy_model_batches_total", "counter",
       "batched vertex launches, by model");
  for (int mi = 0; mi < m->n_models; mi++)
    sb_printf(b, "canopy_model_batches_total{model=\"%s\"} %llu\n",
              m->model_names[mi], (unsigned long long)m->model_batches[mi]);
  head(b, "canopy_model_lower_bound_batches_total", "counter",
       "the lower bound on batches of the runs, by model (docs/models.md)");
  for (int mi = 0; mi < m->n_models; mi++)
    sb_printf(b, "canopy_model_lower_bound_batches_total{model=\"%s\"} "
              "%llu\n", m->model_names[mi],
              (unsigned long long)m->model_lower_bound[mi]);
  counter(b, "canopy_vertices_total", "vertices executed", m->vertices);
  counter(b, "canopy_backend_kernels_total", "backend calls", m->kernels);
}

/* Under m->mu: work dropped, cancelled, rejected or refused, and connections
 * refused or evicted at max-connections. */
static void render_refusals(sbuf *b, const cn__metrics *m) {
  counter(b, "canopy_instances_dropped_total",
          "instances dropped before running (timeout or disconnect)",
          m->instances_dropped);
  head(b, "canopy_requests_cancelled_total", "counter",
       "requests abandoned before their answer, by reason");
  sb_printf(b, "canopy_requests_cancelled_total{reason=\"timeout\"} %llu\n",
            (unsigned long long)m->cancelled_timeout);
  sb_printf(b,
            "canopy_requests_cancelled_total{reason=\"disconnect\"} %llu\n",
            (unsigned long long)m->cancelled_disconnect);
  counter(b, "canopy_requests_rejected_overloaded_total",
          "requests refused with 429 because the queue was full",
          m->rejected_overloaded);
  counter(b, "canopy_connections_refused_total",
          "connections answered 503 and closed because max-connections "
          "were open",
          m->conns_refused);
  counter(b, "canopy_connections_evicted_total",
          "connections without a request in progress closed, unanswered, "
          "to make room for a new one at max-connections",
          m->conns_evicted);
  counter(b, "canopy_requests_refused_answer_memory_total",
          "inference requests answered 503 answer_memory_full: their "
          "answer would have taken the answers held past max-answer-memory",
          m->answer_refused);
}

/* Under m->mu: bytes copied by gathers and cells, and the planned arenas. */
static void render_memory(sbuf *b, const cn__metrics *m) {
  counter(b, "canopy_gather_copied_bytes_total",
          "bytes moved by child gathers and scatters", m->gather_bytes);
  counter(b, "canopy_cell_copied_bytes_total",
          "bytes moved by copies inside vertex functions (layout naive; "
          "zero with pq where the layout removes them)", m->cell_bytes);
  counter(b, "canopy_arena_allocated_bytes_total",
          "bytes of arenas planned for runs", m->arena_bytes_total);
  gauge(b, "canopy_arena_bytes", "arena bytes of the last run",
        (double)m->arena_bytes_last);
  gauge(b, "canopy_arena_peak_bytes", "largest arena of any run",
        (double)m->arena_bytes_peak);
  head(b, "canopy_model_arena_peak_bytes", "gauge",
       "largest arena of a run, by model: the live high-water mark of its "
       "states plus scratch (docs/memory.md)");
  for (int mi = 0; mi < m->n_models; mi++)
    sb_printf(b, "canopy_model_arena_peak_bytes{model=\"%s\"} %llu\n",
              m->model_names[mi], (unsigned long long)m->model_arena_peak[mi]);
  gauge(b, "canopy_memory_budget_bytes",
        "arena bytes one worker's run may hold (memory-budget; 0: none)",
        (double)m->memory_budget);
  counter(b, "canopy_budget_extra_batches_total",
          "batches the memory budget added to the policies' plans",
          m->budget_extra_batches);
  counter(b, "canopy_runs_over_budget_total",
          "runs over the memory budget together, re-run request by request",
          m->runs_over_budget);
}

/* Under m->mu: each worker's backend counters. */
static void render_devices(sbuf *b, const cn__metrics *m) {
  per_worker(b, "canopy_device_syncs_total", "counter",
             "host waits for the device, by worker (zero on cpu)", m,
             offsetof(cn_backend_counters, syncs));
  per_worker(b, "canopy_device_bytes_to_device_total", "counter",
             "bytes copied host to device, by worker", m,
             offsetof(cn_backend_counters, bytes_to_device));
  per_worker(b, "canopy_device_bytes_to_host_total", "counter",
             "bytes copied device to host, by worker", m,
             offsetof(cn_backend_counters, bytes_to_host));
  per_worker(b, "canopy_device_allocs_total", "counter",
             "device and pinned host allocations, by worker", m,
             offsetof(cn_backend_counters, allocs));
  per_worker(b, "canopy_device_copies_to_device_total", "counter",
             "host to device copies (index uploads, weights), by worker", m,
             offsetof(cn_backend_counters, copies_to_device));
  per_worker(b, "canopy_device_launches_total", "counter",
             "kernel launches, by worker", m,
             offsetof(cn_backend_counters, launches));
  per_worker(b, "canopy_device_memory_bytes", "gauge",
             "device memory a worker's backend context holds (pool, "
             "weights, staging); released when the worker is idle", m,
             offsetof(cn_backend_counters, device_bytes));
}

/* Under m->mu: the learned-policy retraining rounds by model and result. */
static void render_retrains(sbuf *b, const cn__metrics *m) {
  head(b, "canopy_policy_retrains_total", "counter",
       "online retraining rounds of a model's learned batching policy, by "
       "result (swapped: the new policy launches fewer batches)");
  for (int mi = 0; mi < m->n_models; mi++)
    for (int ri = 0; ri < CN__N_RETRAIN; ri++)
      sb_printf(b,
                "canopy_policy_retrains_total{model=\"%s\",result=\"%s\"} "
                "%llu\n",
                m->model_names[mi], retrain_results[ri],
                (unsigned long long)m->retrains[mi * CN__N_RETRAIN + ri]);
}

/* The server's gauges, read outside m->mu, and the start time. */
static void render_gauges(sbuf *b, const cn__gauges *g, double start) {
  gauge(b, "canopy_queue_depth_instances",
        "instances waiting in windows or the run queue",
        (double)g->queue_instances);
  gauge(b, "canopy_queue_depth_runs", "closed runs waiting for a worker",
        (double)g->queued_runs);
  gauge(b, "canopy_open_connections",
        "client connections open (max-connections bounds them)",
        (double)g->open_connections);
  gauge(b, "canopy_body_bytes",
        "bytes of request bodies held (max-body-memory bounds them)",
        (double)g->body_bytes);
  gauge(b, "canopy_answer_bytes",
        "bytes of answers written to connections and not yet taken by "
        "their clients (with canopy_answer_reserved_bytes, bounded by "
        "max-answer-memory)",
        (double)g->answer_held);
  gauge(b, "canopy_answer_reserved_bytes",
        "bytes reserved for the answers of requests admitted and not yet "
        "answered (each its max-answer-bytes bound)",
        (double)g->answer_reserved);
  gauge(b, "canopy_in_flight_requests",
        "requests accepted and not yet answered", (double)g->in_flight);
  gauge(b, "canopy_workers", "worker threads", (double)g->workers);
  gauge(b, "canopy_ready", "1 when /readyz answers 200", (double)g->ready);
  gauge(b, "canopy_draining", "1 while shutting down",
        (double)g->draining);
  gauge(b, "canopy_start_time_seconds",
        "when the daemon started, seconds since the Unix epoch", start);
}

/* The whole /metrics page: the counters as one snapshot under m->mu, then
 * the gauges the caller read. NULL when out of memory. */
char *cn__metrics_render(cn__metrics *m, const cn__gauges *g) {
  sbuf b = {malloc(8192), 0, 8192, 0};
  if (b.p == NULL) return NULL;
  pthread_mutex_lock(&m->mu);
  render_requests(&b, m);
  render_runs(&b, m);
  render_stages(&b, m, g->loop_cpu_s);
  render_batching(&b, m);
  render_refusals(&b, m);
  render_memory(&b, m);
  render_devices(&b, m);
  render_retrains(&b, m);
  double start = m->start_time;
  pthread_mutex_unlock(&m->mu);
  render_gauges(&b, g, start);
  if (b.oom) {
    free(b.p);
    return NULL;
  }
  return b.p;
}
