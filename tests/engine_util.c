/* engine_util.c - see engine_util.h. */
#include "engine_util.h"

#include "internal.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

cn_model *tu_model_opts(cn_model_init_opts o, char *dir, size_t dir_len) {
  snprintf(dir, dir_len, "/tmp/canopy-test-XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
  char mdir[600];
  snprintf(mdir, sizeof(mdir), "%s/m", dir);
  o.dir = mdir;
  cn_err err;
  cn_err_clear(&err);
  cr_assert_eq(cn_model_init(&o, &err), 0, "init %s: %s", o.family, err.msg);
  cn_model *m = NULL;
  cr_assert_eq(cn_model_load(mdir, &m, &err), 0, "load %s: %s", o.family,
               err.msg);
  return m;
}

const char *tu_data_path(const char *name, char *path, size_t len) {
  const char *root = getenv("CANOPY_DATA");
  cr_assert_not_null(root, "CANOPY_DATA is not set");
  snprintf(path, len, "%s/%s", root, name);
  return path;
}

cn_model *tu_model(const char *family, int H, int D, const char *data,
                   char *dir, size_t dir_len) {
  char path[512];
  cn_model_init_opts o = {
      .family = family, .hidden = H, .embed = D, .classes = 5,
      .vocab_from = data ? tu_data_path(data, path, sizeof(path)) : NULL,
      .seed = 7};
  return tu_model_opts(o, dir, dir_len);
}

json_t *tu_data_lines(const char *name, int max) {
  char path[512];
  tu_data_path(name, path, sizeof(path));
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f, "cannot open %s", path);
  json_t *a = json_array();
  char *line = NULL;
  size_t cap = 0;
  while ((max <= 0 || (int)json_array_size(a) < max) &&
         getline(&line, &cap, f) > 0) {
    json_error_t je;
    json_t *j = json_loads(line, 0, &je);
    cr_assert_not_null(j, "%s: %s", path, je.text);
    json_array_append_new(a, j);
  }
  free(line);
  fclose(f);
  return a;
}

cn_layout tu_layout = CN_LAYOUT_PQ;
cn_run_stats tu_stats;

json_t *tu_run_on(cn_backend_ctx *bk, const cn_model *m, const json_t *insts,
                  cn_policy_kind pol, int batch, unsigned flags,
                  long long *batches, long long *lower_bound) {
  cn_err err;
  size_t n = json_array_size(insts);
  json_t *outs = json_array();
  if (batches) *batches = 0;
  if (lower_bound) *lower_bound = 0;
  memset(&tu_stats, 0, sizeof(tu_stats));
  for (size_t s = 0; s < n; s += (size_t)batch) {
    size_t e = s + (size_t)batch < n ? s + (size_t)batch : n;
    cn_instance **in = calloc(e - s, sizeof(*in));
    int *slot = calloc(e - s, sizeof(int));
    json_t **errs = calloc(e - s, sizeof(json_t *));
    cn_run *r = cn_run_new(m, bk);
    cn_run_set_layout(r, tu_layout);
    for (size_t i = s; i < e; i++) {
      if (cn_instance_parse(m, json_array_get(insts, i), NULL, (int)i,
                            &in[i - s], &err) != 0) {
        errs[i - s] = cn_err_to_json(&err);
        continue;
      }
      slot[i - s] = cn_run_add(r, in[i - s], flags, 0);
      cr_assert_geq(slot[i - s], 0);
    }
    cn_err_clear(&err);
    cr_assert_eq(cn_run_exec(r, pol, &err), 0, "exec: %s", err.msg);
    cn_run_stats st;
    cn_run_get_stats(r, &st);
    if (batches) *batches += st.batches;
    if (lower_bound) *lower_bound += st.lower_bound;
    tu_stats.kernels += st.kernels;
    tu_stats.cell_bytes += st.cell_bytes;
    tu_stats.gather_bytes += st.gather_bytes;
    tu_stats.batches += st.batches;
    tu_stats.instances++; /* here: the runs */
    tu_stats.device_syncs += st.device_syncs;
    tu_stats.bytes_to_device += st.bytes_to_device;
    tu_stats.bytes_to_host += st.bytes_to_host;
    tu_stats.device_allocs += st.device_allocs;
    tu_stats.launches += st.launches;
    tu_stats.copies_to_device += st.copies_to_device;
    for (size_t i = s; i < e; i++)
      json_array_append_new(outs, errs[i - s] ? errs[i - s]
                                              : cn_run_output(r, slot[i - s]));
    cn_run_free(r);
    for (size_t i = 0; i < e - s; i++) cn_instance_free(in[i]);
    free(in);
    free(slot);
    free(errs);
  }
  return outs;
}

cn_backend_ctx *tu_cpu(void) {
  cn_backend_ctx *bk = NULL;
  cn_err err;
  cn_err_clear(&err);
  cr_assert_eq(cn_backend_open("cpu", 0, &bk, &err), 0, "%s", err.msg);
  return bk;
}

json_t *tu_run(const cn_model *m, const json_t *insts, cn_policy_kind pol,
               int batch, unsigned flags, long long *batches,
               long long *lower_bound) {
  cn_backend_ctx *bk = tu_cpu();
  json_t *outs = tu_run_on(bk, m, insts, pol, batch, flags, batches,
                           lower_bound);
  cn_backend_close(bk);
  return outs;
}

double tu_json_maxdiff(const json_t *a, const json_t *b) {
  if (a == NULL || b == NULL) return a == b ? 0 : 1e30;
  if (json_is_number(a) && json_is_number(b))
    return fabs(json_number_value(a) - json_number_value(b));
  if (json_typeof(a) != json_typeof(b)) return 1e30;
  double m = 0;
  if (json_is_array(a)) {
    if (json_array_size(a) != json_array_size(b)) return 1e30;
    for (size_t i = 0; i < json_array_size(a); i++) {
      double d = tu_json_maxdiff(json_array_get(a, i), json_array_get(b, i));
      if (d > m) m = d;
    }
    return m;
  }
  if (json_is_object(a)) {
    if (json_object_size(a) != json_object_size(b)) return 1e30;
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)a, k, v) {
      json_t *w = json_object_get(b, k);
      if (w == NULL) return 1e30;
      double d = tu_json_maxdiff(v, w);
      if (d > m) m = d;
    }
    return m;
  }
  return json_equal(a, b) ? 0 : 1e30;
}

void tu_rewrite_weights(const char *path, const char *drop,
                        const char *reshape, const char *add, int64_t r,
                        int64_t c) {
  cn_safetensors st;
  cn_err e;
  cr_assert_eq(cn_safetensors_open(path, &st, &e), 0, "%s", e.msg);
  cn_tensor_out t[CN_MAX_TENSORS + 1];
  float *big = calloc((size_t)(r * c + 1), sizeof(float));
  int n = 0;
  for (int i = 0; i < st.n; i++) {
    const cn_tensor *s = &st.tensors[i];
    if (drop && strcmp(s->name, drop) == 0) continue;
    t[n] = (cn_tensor_out){s->name, s->ndim, {0}, s->data};
    memcpy(t[n].shape, s->shape, sizeof(s->shape));
    if (reshape && strcmp(s->name, reshape) == 0)
      t[n] = (cn_tensor_out){s->name, 2, {r, c}, big};
    n++;
  }
  if (add) t[n++] = (cn_tensor_out){add, 2, {r, c}, big};
  cr_assert_eq(cn_safetensors_write(path, t, n, &e), 0, "%s", e.msg);
  cn_safetensors_close(&st);
  free(big);
}

void tu_rmdir(const char *dir) {
  char cmd[700];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

tu_family tu_families[] = {
    {"treelstm", "trees-binary.jsonl"},
    {"treelstm-2type", "trees-binary.jsonl"},
    {"treegru", "trees-binary.jsonl"},
    {"childsum-treelstm", "trees-nary.jsonl"},
    {"mvrnn", "trees-binary.jsonl"},
    {"bilstm-tagger", "sequences.jsonl"},
    {"latticelstm", "lattices.jsonl"},
    {"latticegru", "dags.jsonl"},
    {"lstm-nmt", "sequences.jsonl"},
};
const size_t tu_n_families = sizeof(tu_families) / sizeof(tu_families[0]);

const char *tu_data_for(const char *family) {
  for (size_t i = 0; i < tu_n_families; i++)
    if (strcmp(tu_families[i].family, family) == 0) return tu_families[i].data;
  return NULL;
}

/* Each step runs every ready vertex of one type (running fewer of them is
 * never better), so the search is over sets of executed vertices. */
int tu_brute_force_min(const cn_run *r) {
  int n = r->nv;
  cr_assert_leq(n, 32);
  uint32_t full = (n == 32) ? 0xffffffffu : ((1u << n) - 1);
  uint32_t inmask[32] = {0};
  for (int v = 0; v < n; v++) {
    int k;
    const int32_t *in = cn__run_inputs(r, v, &k);
    for (int j = 0; j < k; j++) inmask[v] |= 1u << in[j];
  }
  size_t cap = (size_t)1 << n;
  uint8_t *dist = malloc(cap);
  uint32_t *q = malloc(cap * sizeof(uint32_t));
  memset(dist, 0xff, cap);
  size_t qh = 0, qt = 0;
  dist[0] = 0;
  q[qt++] = 0;
  while (qh < qt) {
    uint32_t s = q[qh++];
    if (s == full) break;
    for (int t = 0; t < r->fam->n_types; t++) {
      uint32_t a = 0;
      for (int v = 0; v < n; v++)
        if (!(s >> v & 1) && r->vtype[v] == t && (inmask[v] & ~s) == 0)
          a |= 1u << v;
      if (a != 0 && dist[s | a] == 0xff) {
        dist[s | a] = (uint8_t)(dist[s] + 1);
        q[qt++] = s | a;
      }
    }
  }
  int best = dist[full];
  free(dist);
  free(q);
  return best;
}

static long long numbers(const json_t *v) {
  if (json_is_array(v)) {
    long long n = 0;
    size_t i;
    const json_t *e;
    json_array_foreach(v, i, e) n += numbers(e);
    return n;
  }
  return json_is_number(v) || json_is_null(v) ? 1 : 0;
}

long long tu_answer_floats(const json_t *o) {
  long long n = 0;
  const json_t *nodes = json_object_get(o, "nodes");
  if (nodes != NULL) {
    size_t i;
    const json_t *e;
    json_array_foreach(nodes, i, e) n += numbers(json_object_get(e, "logits"));
  } else {
    n += numbers(json_object_get(o, "logits"));
  }
  return n + numbers(json_object_get(o, "h"));
}
