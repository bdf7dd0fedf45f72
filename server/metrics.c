/* metrics.c - the counters behind /metrics and their updates, kept where
 * the work happens (metrics_text.c writes the page from them): requests
 * by model and status, runs, stages, batching, refusals, memory, the
 * workers' backends and retrains, and the histograms' buckets. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "metrics_impl.h"

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

/* Under mu: a request answered that arrived by protocol. */
static void count_protocol(cn__metrics *m, int protocol) {
  if (protocol < 0 || protocol >= CN__N_PROTOS) protocol = CN__PROTO_HTTP;
  m->protocol_requests[protocol]++;
}

void cn__metrics_request(cn__metrics *m, int protocol, int model, int status,
                         int instances, double seconds) {
  pthread_mutex_lock(&m->mu);
  count_protocol(m, protocol);
  count_request(m, model, status, instances, seconds);
  pthread_mutex_unlock(&m->mu);
}

void cn__metrics_infer_request(cn__metrics *m, int protocol, int model,
                               int status, int instances, double seconds,
                               double queue_s, double compute_s) {
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  pthread_mutex_lock(&m->mu);
  count_protocol(m, protocol);
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

void cn__metrics_retrain(cn__metrics *m, int model, int result) {
  if (model < 0 || model >= m->cap || result < 0 || result >= CN__N_RETRAIN)
    return;
  pthread_mutex_lock(&m->mu);
  m->retrains[model * CN__N_RETRAIN + result]++;
  pthread_mutex_unlock(&m->mu);
}
