/* kserve_ext.c - two of Triton's extensions to the Open Inference
 * Protocol that its clients and tools call (docs/api.md "Model
 * configuration and statistics"):
 *
 *   GET /v2/models/{m}[/versions/{v}]/config: the model's configuration in
 *   Triton's shape (model_config.proto as JSON): the tensors of the
 *   metadata (kserve.c) with Triton's type names and per-instance dims, the
 *   batching the daemon does (max-instances-per-request, max-delay-us) as
 *   max_batch_size and dynamic_batching, one version served.
 *
 *   GET /v2/models[/{m}[/versions/{v}]]/stats: the statistics extension's
 *   model_stats, read from the counters /metrics is made of (metrics.c):
 *   nothing here counts.
 *
 * Both only read: the version is held by the request, the counters are
 * copied under their mutex. */
#include <stdio.h>
#include <string.h>

#include "kserve_impl.h"
#include "handlers.h"

/* ---- configuration ----------------------------------------------------- */

/* The protocol's datatype as model_config.proto names it. */
static const char *triton_type(const char *dtype) {
  if (strcmp(dtype, "BYTES") == 0) return "TYPE_STRING";
  if (strcmp(dtype, "FP32") == 0) return "TYPE_FP32";
  if (strcmp(dtype, "INT64") == 0) return "TYPE_INT64";
  return "TYPE_INVALID";
}

/* One tensor of "input" or "output": dims are one row's (the batch
 * dimension is max_batch_size's). A row of one element is dims [1]
 * reshaped to [] (Triton's way of saying the tensor is [N], which the
 * daemon takes and answers, while [N, 1] is accepted too). */
static json_t *config_tensor(const char *name, const char *dtype,
                             long long width, bool input) {
  json_t *t = json_object(), *dims = json_array();
  json_object_set_new(t, "name", json_string(name));
  json_object_set_new(t, "data_type", json_string(triton_type(dtype)));
  if (input) json_object_set_new(t, "format", json_string("FORMAT_NONE"));
  json_array_append_new(dims, json_integer(width > 0 ? width : 1));
  json_object_set_new(t, "dims", dims);
  if (width <= 0) {
    json_t *re = json_object();
    json_object_set_new(re, "shape", json_array());
    json_object_set_new(t, "reshape", re);
  }
  json_object_set_new(t, "is_shape_tensor", json_false());
  if (input) {
    json_object_set_new(t, "allow_ragged_batch", json_false());
    json_object_set_new(t, "optional", json_false());
  } else {
    json_object_set_new(t, "label_filename", json_string(""));
  }
  return t;
}

static json_t *string_param(const char *v) {
  json_t *o = json_object();
  json_object_set_new(o, "string_value", json_string(v));
  return o;
}

json_t *cn__kserve_model_config(cn__server *s, const cn__model_entry *me) {
  const cn_serve_config *sc = &s->cfg.serve;
  cn__v2_sig g;
  cn__v2_model_sig(me, &g);
  char platform[96];
  snprintf(platform, sizeof(platform), "canopy_%s", g.family);
  json_t *ins = json_array(), *outs = json_array();
  json_array_append_new(ins, config_tensor("INSTANCE", "BYTES", 0, true));
  for (int i = 0; i < CN__V2_N_OUTPUTS; i++) {
    const cn__v2_output *d = &cn__v2_outputs[i];
    if (!(g.outputs & d->bit)) continue;
    long long w = d->bit == CN__V2_LOGITS   ? g.classes
                  : d->bit == CN__V2_HIDDEN ? g.hidden
                                            : 0;
    json_array_append_new(outs, config_tensor(d->name, d->dtype, w, false));
  }
  /* the aggregation window: requests wait up to max-delay-us for company */
  json_t *db = json_object();
  json_object_set_new(db, "preferred_batch_size", json_array());
  json_object_set_new(db, "max_queue_delay_microseconds",
                      json_integer(sc->max_delay_us));
  json_object_set_new(db, "preserve_ordering", json_false());
  /* one version is served at a time: the newest loaded */
  json_t *latest = json_object(), *vp = json_object();
  json_object_set_new(latest, "num_versions", json_integer(1));
  json_object_set_new(vp, "latest", latest);
  json_t *group = json_object(), *groups = json_array();
  json_object_set_new(group, "name", json_string(me->name));
  json_object_set_new(group, "kind",
                      json_string(strcmp(sc->backend, "cuda") == 0
                                      ? "KIND_GPU" : "KIND_CPU"));
  json_object_set_new(group, "count", json_integer(sc->workers));
  json_array_append_new(groups, group);
  json_t *par = json_object();
  json_object_set_new(par, "family", string_param(g.family));
  json_object_set_new(par, "input", string_param(g.input));
  json_object_set_new(par, "version", string_param(me->version));
  json_t *o = json_object();
  json_object_set_new(o, "name", json_string(me->name));
  json_object_set_new(o, "platform", json_string(platform));
  json_object_set_new(o, "backend", json_string("canopy"));
  json_object_set_new(o, "version_policy", vp);
  json_object_set_new(o, "max_batch_size",
                      json_integer(sc->max_instances_per_request));
  json_object_set_new(o, "input", ins);
  json_object_set_new(o, "output", outs);
  json_object_set_new(o, "dynamic_batching", db);
  json_object_set_new(o, "instance_group", groups);
  json_object_set_new(o, "parameters", par);
  return o;
}

/* ---- statistics -------------------------------------------------------- */

static json_t *duration(uint64_t count, double seconds) {
  json_t *o = json_object();
  json_object_set_new(o, "count", json_integer((json_int_t)count));
  json_object_set_new(o, "ns", json_integer((json_int_t)(seconds * 1e9 + 0.5)));
  return o;
}

/* One model version's $model_stat. Queue and compute_infer are counted
 * per request (each request the time it waited, and its run's compute);
 * compute_input (a run adding its instances: parse to graph) and
 * compute_output (laying out its answers) per run, as execution_count. */
static json_t *model_stat(cn__server *s, const cn__model_entry *me) {
  cn__infer_stats st;
  cn__metrics_infer_stats(&s->metrics, me->index, &st);
  double infer_s = st.run_infer_s - st.run_input_s;
  json_t *is = json_object();
  json_object_set_new(is, "success", duration(st.ok, st.ok_s));
  json_object_set_new(is, "fail", duration(st.fail, st.fail_s));
  json_object_set_new(is, "queue", duration(st.queued, st.queue_s));
  json_object_set_new(is, "compute_input", duration(st.runs, st.run_input_s));
  json_object_set_new(is, "compute_infer",
                      duration(st.runs, infer_s > 0 ? infer_s : 0));
  json_object_set_new(is, "compute_output",
                      duration(st.runs, st.run_output_s));
  json_object_set_new(is, "cache_hit", duration(0, 0));
  json_object_set_new(is, "cache_miss", duration(0, 0));
  json_t *o = json_object();
  json_object_set_new(o, "name", json_string(me->name));
  json_object_set_new(o, "version", json_string(me->version));
  json_object_set_new(o, "last_inference",
                      json_integer((json_int_t)st.last_ms));
  json_object_set_new(o, "inference_count",
                      json_integer((json_int_t)st.instances));
  json_object_set_new(o, "execution_count", json_integer((json_int_t)st.runs));
  json_object_set_new(o, "inference_stats", is);
  return o;
}

json_t *cn__kserve_model_stats(cn__server *s, const cn__model_entry *me) {
  json_t *arr = json_array();
  if (me != NULL) {
    json_array_append_new(arr, model_stat(s, me));
  } else { /* every model serving, in the repository's order */
    int n = atomic_load(&s->n_models);
    for (int i = 0; i < n; i++) {
      cn__model_entry *cur = cn__model_retain(&s->models[i]);
      if (cur == NULL) continue;
      json_array_append_new(arr, model_stat(s, cur));
      cn__model_release(cur);
    }
  }
  json_t *o = json_object();
  json_object_set_new(o, "model_stats", arr);
  return o;
}
