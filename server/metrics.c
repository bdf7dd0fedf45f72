/* metrics.c - the one generator of /metrics and the counters behind it.
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
#include <time.h>

#include "metrics.h"

static const int statuses[] = {200, 400, 401, 403, 404, 405, 408, 413,
                               414, 429, 431, 499, 501,
                               500, 503, 504, 0 /* other */};
#define CN__N_STATUS ((int)(sizeof(statuses) / sizeof(statuses[0])))

static const double lat_le[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                0.05,   0.1,   0.25,   0.5,   1,    2.5,
                                5,      10,    30};
static const double size_le[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512,
                                  1024, 4096};

static void hist_init(cn__hist *h, const double *le, int n) {
  memset(h, 0, sizeof(*h));
  h->le = le;
  h->n = n;
}

static void hist_add(cn__hist *h, double v) {
  int i = 0;
  while (i < h->n && v > h->le[i]) i++;
  h->counts[i]++;
  h->sum += v;
  h->count++;
}

/* name as a Prometheus label value (text format 0.0.4: backslash, double
 * quote and line feed escaped). */
void cn__metrics_label_escape(char *out, size_t cap, const char *in) {
  size_t n = 0;
  for (; *in != '\0' && n + 3 < cap; in++) {
    if (*in == '\\' || *in == '"') out[n++] = '\\';
    if (*in == '\n') {
      out[n++] = '\\';
      out[n++] = 'n';
      continue;
    }
    out[n++] = *in;
  }
  out[n] = '\0';
}

int cn__metrics_init(cn__metrics *m, int cap, const char **names) {
  memset(m, 0, sizeof(*m));
  pthread_mutex_init(&m->mu, NULL);
  m->cap = cap;
  m->n_models = 0;
  m->model_names = names;
  m->requests = calloc((size_t)(cap + 1) * CN__N_STATUS, sizeof(uint64_t));
  m->instances = calloc((size_t)cap + 1, sizeof(uint64_t));
  m->retrains = calloc((size_t)(cap > 0 ? cap : 1) * CN__N_RETRAIN,
                       sizeof(uint64_t));
  if (m->requests == NULL || m->instances == NULL || m->retrains == NULL)
    return -1;
  m->request_s = calloc((size_t)cap + 1, sizeof(cn__hist));
  m->queue_s = calloc((size_t)cap + 1, sizeof(cn__hist));
  m->compute_s = calloc((size_t)cap + 1, sizeof(cn__hist));
  m->batch_instances = calloc((size_t)cap + 1, sizeof(cn__hist));
  m->model_batches = calloc((size_t)cap + 1, sizeof(uint64_t));
  m->model_lower_bound = calloc((size_t)cap + 1, sizeof(uint64_t));
  m->model_arena_peak = calloc((size_t)cap + 1, sizeof(uint64_t));
  m->infer = calloc((size_t)cap + 1, sizeof(cn__infer_stats));
  m->stage_s = calloc((size_t)(cap + 1) * CN__N_STAGES, sizeof(double));
  if (m->model_batches == NULL || m->model_lower_bound == NULL ||
      m->model_arena_peak == NULL || m->infer == NULL || m->stage_s == NULL)
    return -1;
  if (m->request_s == NULL || m->queue_s == NULL || m->compute_s == NULL ||
      m->batch_instances == NULL)
    return -1;
  for (int i = 0; i <= cap; i++) {
    hist_init(&m->request_s[i], lat_le, 15);
    hist_init(&m->queue_s[i], lat_le, 15);
    hist_init(&m->compute_s[i], lat_le, 15);
    hist_init(&m->batch_instances[i], size_le, 12);
  }
  return 0;
}

void cn__metrics_free(cn__metrics *m) {
  free(m->requests);
  free(m->instances);
  free(m->retrains);
  free(m->request_s);
  free(m->queue_s);
  free(m->compute_s);
  free(m->batch_instances);
  free(m->model_batches);
  free(m->model_lower_bound);
  free(m->model_arena_peak);
  free(m->infer);
  free(m->stage_s);
  free(m->worker_dev);
  pthread_mutex_destroy(&m->mu);
}

int cn__metrics_workers(cn__metrics *m, int n) {
  cn_backend_counters *p = calloc(n > 0 ? (size_t)n : 1, sizeof(*p));
  if (p == NULL) return CN_E_NOMEM;
  pthread_mutex_lock(&m->mu);
  free(m->worker_dev);
  m->worker_dev = p;
  m->n_workers = n > 0 ? n : 0;
  pthread_mutex_unlock(&m->mu);
  return 0;
}

void cn__metrics_worker_backend(cn__metrics *m, int worker,
                                const cn_backend_counters *c) {
  pthread_mutex_lock(&m->mu);
  if (worker >= 0 && worker < m->n_workers) m->worker_dev[worker] = *c;
  pthread_mutex_unlock(&m->mu);
}


/* A model index as a slot (the last slot: no model). Under m->mu. */
static int slot_of(const cn__metrics *m, int model) {
  return model >= 0 && model < m->n_models ? model : m->cap;
}

/* Under m->mu: a request answered, into its model's counters. */
static int count_request(cn__metrics *m, int model, int status,
                         int instances, double seconds) {
  int slot = CN__N_STATUS - 1;
  for (int i = 0; i < CN__N_STATUS - 1; i++)
    if (statuses[i] == status) slot = i;
  model = slot_of(m, model);
  m->requests[model * CN__N_STATUS + slot]++;
  if (status == 200) m->instances[model] += (uint64_t)instances;
  hist_add(&m->request_s[model], seconds);
  return model;
}

void cn__metrics_protocol(cn__metrics *m, int protocol) {
  if (protocol < 0 || protocol >= CN__N_PROTOS) protocol = CN__PROTO_HTTP;
  pthread_mutex_lock(&m->mu);
  m->protocol_requests[protocol]++;
  pthread_mutex_unlock(&m->mu);
}

void cn__metrics_request(cn__metrics *m, int model, int status,
                         int instances, double seconds) {
  pthread_mutex_lock(&m->mu);
  count_request(m, model, status, instances, seconds);
  pthread_mutex_unlock(&m->mu);
}

void cn__metrics_infer_request(cn__metrics *m, int model, int status,
                               int instances, double seconds, double queue_s,
                               double compute_s) {
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  pthread_mutex_lock(&m->mu);
  model = count_request(m, model, status, instances, seconds);
  cn__infer_stats *st = &m->infer[model];
  if (status == 200) {
    st->ok++;
    st->ok_s += seconds;
    st->instances += (uint64_t)instances;
    st->last_ms = (uint64_t)now.tv_sec * 1000u +
                  (uint64_t)(now.tv_nsec / 1000000);
  } else {
    st->fail++;
    st->fail_s += seconds;
  }
  if (queue_s >= 0) {
    st->queued++;
    st->queue_s += queue_s;
  }
  if (compute_s >= 0 && status == 200) {
    st->computed++;
    st->compute_s += compute_s;
  }
  pthread_mutex_unlock(&m->mu);
}

void cn__metrics_infer_stats(cn__metrics *m, int model, cn__infer_stats *out) {
  pthread_mutex_lock(&m->mu);
  int i = slot_of(m, model);
  *out = m->infer[i];
  /* the runs and their compute are the histograms' (one count a run) */
  out->runs = m->compute_s[i].count;
  out->run_infer_s = m->compute_s[i].sum;
  pthread_mutex_unlock(&m->mu);
  if (i == m->cap) memset(out, 0, sizeof(*out));
}

void cn__metrics_run(cn__metrics *m, int model, int instances,
                     double queue_s_max,
                     double compute_s, double input_s, double output_s,
                     long long batches,
                     long long lower_bound, long long vertices,
                     long long kernels, size_t gather_bytes,
                     size_t cell_bytes, size_t arena_bytes) {
  (void)queue_s_max;
  pthread_mutex_lock(&m->mu);
  m->runs++;
  model = slot_of(m, model);
  m->model_batches[model] += (uint64_t)batches;
  m->model_lower_bound[model] += (uint64_t)lower_bound;
  hist_add(&m->batch_instances[model], instances);
  hist_add(&m->compute_s[model], compute_s);
  m->infer[model].run_input_s += input_s;
  m->infer[model].run_output_s += output_s;
  m->batches += (uint64_t)batches;
  m->lower_bound += (uint64_t)lower_bound;
  m->vertices += (uint64_t)vertices;
  m->kernels += (uint64_t)kernels;
  m->gather_bytes += gather_bytes;
  m->cell_bytes += cell_bytes;
  m->arena_bytes_total += arena_bytes;
  m->arena_bytes_last = arena_bytes;
  if (arena_bytes > m->arena_bytes_peak) m->arena_bytes_peak = arena_bytes;
  pthread_mutex_unlock(&m->mu);
}

void cn__metrics_stage(cn__metrics *m, int model, cn__stage stage,
                       double seconds, bool on_loop) {
  if (stage < 0 || stage >= CN__N_STAGES || !(seconds > 0)) return;
  pthread_mutex_lock(&m->mu);
  model = slot_of(m, model);
  m->stage_s[(size_t)model * CN__N_STAGES + stage] += seconds;
  if (on_loop) m->loop_parse_s += seconds;
  pthread_mutex_unlock(&m->mu);
}

void cn__metrics_stages(cn__metrics *m, int model,
                        const double seconds[CN__N_STAGES]) {
  pthread_mutex_lock(&m->mu);
  model = slot_of(m, model);
  for (int k = 0; k < CN__N_STAGES; k++)
    if (seconds[k] > 0)
      m->stage_s[(size_t)model * CN__N_STAGES + k] += seconds[k];
  pthread_mutex_unlock(&m->mu);
}

void cn__metrics_memory(cn__metrics *m, int model, size_t arena_bytes,
                        long long extra_batches, bool over) {
  pthread_mutex_lock(&m->mu);
  model = slot_of(m, model);
  if (arena_bytes > m->model_arena_peak[model])
    m->model_arena_peak[model] = arena_bytes;
  if (extra_batches > 0) m->budget_extra_batches += (uint64_t)extra_batches;
  if (over) m->runs_over_budget++;
  pthread_mutex_unlock(&m->mu);
}

void cn__metrics_set_models(cn__metrics *m, int n) {
  pthread_mutex_lock(&m->mu);
  if (n <= m->cap) m->n_models = n;
  pthread_mutex_unlock(&m->mu);
}

void cn__metrics_reset_model(cn__metrics *m, int i) {
  if (i < 0 || i >= m->cap) return;
  pthread_mutex_lock(&m->mu);
  memset(&m->requests[(size_t)i * CN__N_STATUS], 0,
         CN__N_STATUS * sizeof(uint64_t));
  m->instances[i] = m->model_batches[i] = m->model_lower_bound[i] = 0;
  m->model_arena_peak[i] = 0;
  memset(&m->infer[i], 0, sizeof(m->infer[i]));
  memset(&m->stage_s[(size_t)i * CN__N_STAGES], 0,
         CN__N_STAGES * sizeof(double));
  memset(&m->retrains[(size_t)i * CN__N_RETRAIN], 0,
         CN__N_RETRAIN * sizeof(uint64_t));
  cn__hist *h[] = {&m->request_s[i], &m->queue_s[i], &m->compute_s[i],
                   &m->batch_instances[i]};
  for (int k = 0; k < 4; k++) {
    memset(h[k]->counts, 0, sizeof(h[k]->counts));
    h[k]->sum = 0;
    h[k]->count = 0;
  }
  pthread_mutex_unlock(&m->mu);
}

void cn__metrics_window_close(cn__metrics *m, cn__close_reason why) {
  pthread_mutex_lock(&m->mu);
  m->window_closes[why]++;
  pthread_mutex_unlock(&m->mu);
}

void cn__metrics_queue_wait(cn__metrics *m, int model, double seconds) {
  pthread_mutex_lock(&m->mu);
  hist_add(&m->queue_s[slot_of(m, model)], seconds);
  pthread_mutex_unlock(&m->mu);
}

void cn__metrics_queue_waits(cn__metrics *m, int model, const double *seconds,
                             int n) {
  if (n <= 0) return;
  pthread_mutex_lock(&m->mu);
  model = slot_of(m, model);
  for (int i = 0; i < n; i++) hist_add(&m->queue_s[model], seconds[i]);
  pthread_mutex_unlock(&m->mu);
}

void cn__metrics_dropped(cn__metrics *m, int instances, int disconnect,
                         int timeout) {
  pthread_mutex_lock(&m->mu);
  m->instances_dropped += (uint64_t)instances;
  m->cancelled_disconnect += (uint64_t)disconnect;
  m->cancelled_timeout += (uint64_t)timeout;
  pthread_mutex_unlock(&m->mu);
}

void cn__metrics_decode(cn__metrics *m, int sessions, int joined,
                        int early) {
  pthread_mutex_lock(&m->mu);
  m->decode_sessions += (uint64_t)sessions;
  m->decode_joined += (uint64_t)joined;
  m->decode_early += (uint64_t)early;
  pthread_mutex_unlock(&m->mu);
}

void cn__metrics_conn_refused(cn__metrics *m) {
  pthread_mutex_lock(&m->mu);
  m->conns_refused++;
  pthread_mutex_unlock(&m->mu);
}

void cn__metrics_conn_evicted(cn__metrics *m) {
  pthread_mutex_lock(&m->mu);
  m->conns_evicted++;
  pthread_mutex_unlock(&m->mu);
}

void cn__metrics_answer_refused(cn__metrics *m) {
  pthread_mutex_lock(&m->mu);
  m->answer_refused++;
  pthread_mutex_unlock(&m->mu);
}

void cn__metrics_overloaded(cn__metrics *m) {
  pthread_mutex_lock(&m->mu);
  m->rejected_overloaded++;
  pthread_mutex_unlock(&m->mu);
}

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

void cn__metrics_retrain(cn__metrics *m, int model, int result) {
  if (model < 0 || model >= m->cap || result < 0 || result >= CN__N_RETRAIN)
    return;
  pthread_mutex_lock(&m->mu);
  m->retrains[model * CN__N_RETRAIN + result]++;
  pthread_mutex_unlock(&m->mu);
}

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
