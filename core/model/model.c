/* model.c - load a model directory into one immutable cn_model.
 *
 * A model is served whole or not at all (docs/daemon.md): model.json, every
 * vocabulary and every tensor the family lists is checked here, and any
 * failure frees everything and says which file, key or tensor to fix. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/model.h"

#define MAX_SIZE (1 << 16)  /* H, D: keeps every shape product in range */
#define MAX_MODEL_JSON (64u << 20) /* model.json: labels and cells fit well in it */

const char *cn_input_kind_name(cn_input_kind k) {
  switch (k) {
  case CN_INPUT_TREE: return "tree";
  case CN_INPUT_SEQUENCE: return "sequence";
  case CN_INPUT_LATTICE: return "lattice";
  case CN_INPUT_DAG: return "dag";
  }
  return "unknown";
}

/* dir + "/" + name, for messages (every file is opened relative to the
 * directory's descriptor); NULL when out of memory. */
static char *join(const char *dir, const char *name) {
  size_t dl = strlen(dir);
  while (dl > 1 && dir[dl - 1] == '/') dl--;
  size_t nl = strlen(name);
  char *p = malloc(dl + nl + 2);
  if (p == NULL) return NULL;
  memcpy(p, dir, dl);
  p[dl] = '/';
  memcpy(p + dl + 1, name, nl + 1);
  return p;
}

void cn__family_names(char *buf, size_t cap) {
  size_t n = 0;
  buf[0] = '\0';
  for (int i = 0; i < cn__family_count() && n < cap; i++)
    n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? ", " : "",
                          cn__family_at(i)->name);
}

/* Reads integer key k of model.json into *out: absent gives def (or an
 * error when def < 0, meaning required); present must lie in [1, max]. */
static int get_int(const json_t *j, const char *file, const char *k, int def,
                   int max, int *out, cn_err *err) {
  json_t *v = json_object_get(j, k);
  if (v == NULL && def >= 0) {
    *out = def;
    return 0;
  }
  if (v == NULL)
    return cn_err_set(err, CN_E_BAD_MODEL, "%s: key '%s' is missing (an "
                      "integer ≥ 1)", file, k);
  if (!json_is_integer(v) || json_integer_value(v) < 1 ||
      json_integer_value(v) > max)
    return cn_err_set(err, CN_E_BAD_MODEL, "%s: key '%s' must be an integer "
                      "from 1 to %d", file, k, max);
  *out = (int)json_integer_value(v);
  return 0;
}

/* Optional string key; *out NULL when absent. */
static int get_str(const json_t *j, const char *file, const char *k,
                   const char **out, cn_err *err) {
  json_t *v = json_object_get(j, k);
  *out = json_string_value(v);
  if (v != NULL && (*out == NULL || (*out)[0] == '\0'))
    return cn_err_set(err, CN_E_BAD_MODEL, "%s: key '%s' must be a "
                      "non-empty string", file, k);
  return 0;
}

/* Optional array of strings, copied; want ≥ 0 demands that many. */
static int get_strs(const json_t *j, const char *file, const char *k,
                    int want, char ***out, int *n_out, cn_err *err) {
  json_t *v = json_object_get(j, k);
  if (v == NULL) return 0;
  if (!json_is_array(v))
    return cn_err_set(err, CN_E_BAD_MODEL, "%s: key '%s' must be an array "
                      "of strings", file, k);
  int n = (int)json_array_size(v);
  if (want >= 0 && n != want)
    return cn_err_set(err, CN_E_BAD_MODEL, "%s: key '%s' has %d names but "
                      "'classes' is %d", file, k, n, want);
  *out = cn__xcalloc((size_t)n, sizeof(char *));
  if (*out == NULL)
    return cn_err_set(err, CN_E_NOMEM, "%s: out of memory", file);
  *n_out = n;
  for (int i = 0; i < n; i++) {
    const char *s = json_string_value(json_array_get(v, (size_t)i));
    if (s == NULL)
      return cn_err_set(err, CN_E_BAD_MODEL, "%s: key '%s': item %d is not a "
                        "string", file, k, i);
    if (((*out)[i] = strdup(s)) == NULL)
      return cn_err_set(err, CN_E_NOMEM, "%s: out of memory", file);
  }
  return 0;
}

/* Asked by giving Vw and Vt values no other size expression can produce:
 * the family's own spec is the one place that knows. */
void cn__family_needs(const cn_family *fam, bool *word, bool *tgt) {
  cn_tensor_spec s[CN_MAX_TENSORS];
  *word = *tgt = false;
  if (fam->tensors == NULL) return; /* cells: tensors named by the ops */
  cn_dims d = {.H = 7, .D = 11, .C = 13, .V = 17, .Vw = 1000003, .Dw = 19,
               .Vt = 1000033, .K = 23};
  int n = fam->tensors(&d, s);
  *word = *tgt = false;
  for (int i = 0; i < n; i++)
    for (int k = 0; k < s[i].ndim && k < 3; k++) {
      *word = *word || s[i].shape[k] == d.Vw;
      *tgt = *tgt || s[i].shape[k] == d.Vt;
    }
}

/* A file named by model.json key k must lie inside the model directory
 * (otherwise "tgt_vocab": "../../outside/secret.txt" would serve that
 * file's lines as tokens): no absolute path, no '..' that climbs out of
 * it. A symlink is checked where the file is opened
 * (cn__open_regular_at: one that leads out is refused). */
static int inside_path(const char *file, const char *k, const char *name,
                       cn_err *err) {
  if (name[0] == '/')
    return cn_err_set(err, CN_E_BAD_MODEL, "%s: key '%s': '%s' is an "
                      "absolute path; a file a model names lies inside its "
                      "directory (give a path relative to it)", file, k,
                      name);
  int depth = 0;
  for (const char *p = name; *p != '\0';) {
    size_t l = strcspn(p, "/");
    if (l == 2 && p[0] == '.' && p[1] == '.') depth--;
    else if (l > 0 && !(l == 1 && p[0] == '.')) depth++;
    if (depth < 0)
      return cn_err_set(err, CN_E_BAD_MODEL, "%s: key '%s': '%s' climbs "
                        "out of the model directory with '..'; a file a "
                        "model names lies inside its directory", file, k,
                        name);
    p += l;
    while (*p == '/') p++;
  }
  return 0;
}

/* An error opening the file of key k that left the directory names k. */
static int name_key(int rc, const char *file, const char *k, cn_err *err) {
  if (rc == CN_E_BAD_MODEL && strstr(err->msg, "leads outside") != NULL) {
    char msg[sizeof(err->msg) + 512];
    snprintf(msg, sizeof(msg), "%s: key '%s': %s", file, k, err->msg);
    size_t n = strlen(msg) < sizeof(err->msg) - 1 ? strlen(msg)
                                                   : sizeof(err->msg) - 1;
    memcpy(err->msg, msg, n);
    err->msg[n] = '\0';
  }
  return rc;
}

static int vocab_key(cn_model *m, const char *file, const char *k,
                     bool required, cn_vocab **out, int64_t *size,
                     cn_err *err) {
  const char *name;
  int rc = get_str(m->json, file, k, &name, err);
  if (rc != 0) return rc;
  if (name == NULL)
    return required ? cn_err_set(err, CN_E_BAD_MODEL, "%s: key '%s' is "
                                 "missing (family %s needs a vocabulary file "
                                 "there)", file, k, m->fam->name)
                    : 0;
  if ((rc = inside_path(file, k, name, err)) != 0) return rc;
  char *path = join(m->dir, name);
  if (path == NULL) return cn_err_set(err, CN_E_NOMEM, "out of memory");
  rc = name_key(cn_vocab_load_at(m->dirfd, name, path, out, err), file, k,
                err);
  free(path);
  if (rc == 0) *size = cn_vocab_size(*out);
  return rc;
}

/* "[96, 32]" */
static void fmt_shape(char *b, size_t cap, const int64_t *s, int nd) {
  size_t n = (size_t)snprintf(b, cap, "[");
  for (int i = 0; i < nd && n < cap; i++)
    n += (size_t)snprintf(b + n, cap - n, i ? ", %lld" : "%lld",
                          (long long)s[i]);
  if (n < cap) snprintf(b + n, cap - n, "]");
}

/* "3H=96, D=32": which model.json sizes an expected shape comes from, so
 * a person sees which key or tensor disagrees. */
static void explain(char *b, size_t cap, const cn_dims *d,
                    const cn_tensor_spec *s) {
  const struct { const char *name; int64_t v; } c[] = {
      {"H", d->H},   {"D", d->D},          {"C", d->C},
      {"V", d->V},   {"Vw", d->Vw},        {"Dw", d->Dw},
      {"Vt", d->Vt}, {"K", d->K},          {"2H", 2 * d->H},
      {"3H", 3 * d->H}, {"4H", 4 * d->H},  {"5H", 5 * d->H},
      {"D+H", d->D + d->H}, {"Dw+H", d->Dw + d->H}};
  size_t n = 0;
  b[0] = '\0';
  for (int k = 0; k < s->ndim && k < 3; k++) {
    if (s->shape[k] < 1) continue;
    int hits = 0;
    for (size_t i = 0; i < CN_ARRAY_SIZE(c) && n < cap; i++) {
      /* Dw defaults to D: name it only where a word vocabulary exists. */
      bool dw = c[i].name[0] == 'D' && c[i].name[1] == 'w';
      if (c[i].v != s->shape[k] || (dw && d->Vw == 0)) continue;
      n += (size_t)snprintf(b + n, cap - n, "%s%s", hits ? "=" : n ? ", " : "",
                            c[i].name);
      hits++;
    }
    if (hits && n < cap)
      n += (size_t)snprintf(b + n, cap - n, "=%lld", (long long)s->shape[k]);
  }
}

/* Finds and checks every tensor the family lists, in its order. */
static int bind_tensors(cn_model *m, const char *file, cn_err *err) {
  cn_tensor_spec spec[CN_MAX_TENSORS];
  int n = m->fam->tensors(&m->dims, spec);
  if (n < 0 || n > CN_MAX_TENSORS)
    return cn_err_set(err, CN_E_INTERNAL, "family %s lists %d tensors",
                      m->fam->name, n);
  for (int i = 0; i < n; i++) {
    const cn_tensor_spec *s = &spec[i];
    /* leaf.M [K, H, H] (mvrnn): K is whatever the file holds, read here. */
    bool is_m = strcmp(s->name, "leaf.M") == 0;
    const cn_tensor *t = cn_safetensors_find(&m->st, s->name);
    char want[64], got[64], why[160];
    fmt_shape(want, sizeof(want), s->shape, s->ndim);
    explain(why, sizeof(why), &m->dims, s);
    if (t == NULL)
      return cn_err_set(err, CN_E_BAD_MODEL, "%s: tensor '%s' is missing "
                        "(family %s needs it with shape %s; docs/models.md "
                        "lists each family's tensors)", file, s->name,
                        m->fam->name, want);
    bool ok = t->ndim == s->ndim;
    for (int k = 0; ok && k < s->ndim; k++) {
      int64_t e = s->shape[k];
      if (is_m && k == 0 && m->dims.K == 0) e = -1;
      ok = e < 0 ? t->shape[k] >= 1 : t->shape[k] == e;
    }
    if (!ok) {
      fmt_shape(got, sizeof(got), t->shape, t->ndim);
      return cn_err_set(err, CN_E_BAD_MODEL, "%s: tensor '%s' has shape %s, "
                        "expected %s%s%s%s; see docs/models.md", file,
                        s->name, got, want, why[0] ? " (" : "", why,
                        why[0] ? ")" : "");
    }
    if (is_m) m->dims.K = t->shape[0];
    /* NaN or Inf weights give plausible-looking answers: refuse them. */
    for (int64_t j = 0; j < t->numel; j++)
      if (!isfinite(t->data[j]))
        return cn_err_set(err, CN_E_BAD_MODEL, "%s: tensor '%s' holds %s "
                          "at element %lld (row-major); weights must be "
                          "finite", file, s->name,
                          isnan(t->data[j]) ? "NaN" : "Inf", (long long)j);
    m->w[i] = t;
  }
  m->n_tensors = n;
  return 0;
}

void cn_model_free(cn_model *m) {
  if (m == NULL) return;
  free(m->dir);
  json_decref(m->json);
  cn_vocab_free(m->vocab);
  cn_vocab_free(m->word_vocab);
  cn_vocab_free(m->tgt_vocab);
  for (int i = 0; m->labels && i < m->n_labels; i++) free(m->labels[i]);
  free(m->labels);
  for (int i = 0; m->type_b_labels && i < m->n_type_b_labels; i++)
    free(m->type_b_labels[i]);
  free(m->type_b_labels);
  free(m->lexicon_path);
  cn_lexicon_free(m->lexicon);
  cn_safetensors_close(&m->st);
  cn__cells_free(m->cells);
  free(m->own_fam);
  for (int l = 0; l < CN_LAYOUT__COUNT; l++)
    for (int t = 0; t < CN_MAX_TYPES; t++) cn__cell_free(m->cell[l][t]);
  free(m);
}

int cn__cell_compile(const cn_model *m, int type, const cn_ir *g, int layout,
                     cn_cell **out, cn_err *err) {
  return cn__cell_compile_weights(m->w, m->fam->name, type,
                                  m->fam->type_names[type], g, layout, out,
                                  err);
}

/* Compiles every type the family describes in the IR, for both compiled
 * layouts, once at load, so that no run pays for compiling. */
static int compile_cells(cn_model *m, cn_err *err) {
  cn_ir *g = malloc(sizeof(*g));
  if (g == NULL) return cn_err_set(err, CN_E_NOMEM, "out of memory");
  int rc = 0;
  for (int t = 0; t < m->fam->n_types && rc == 0; t++) {
    memset(g, 0, sizeof(*g));
    if (m->fam->cell(m, t, g) != 0) { /* the family's bug, not the model's */
      rc = cn_err_set(err, CN_E_INTERNAL, "%s: vertex type %s has no cell",
                      m->fam->name, m->fam->type_names[t]);
      break;
    }
    for (int l = 0; l < CN_LAYOUT__COUNT && rc == 0; l++)
      rc = cn__cell_compile(m, t, g, l, &m->cell[l][t], err);
  }
  free(g);
  /* A built-in's cell that does not compile is Canopy's bug; a described
   * one is the model's (docs/cells.md: the compiler's limits). */
  if (rc != 0 && rc != CN_E_NOMEM && m->cells != NULL) {
    char msg[sizeof(err->msg)];
    snprintf(msg, sizeof(msg), "%s", err->msg);
    rc = cn_err_set(err, CN_E_BAD_MODEL, "%s/model.json: %s", m->dir, msg);
  }
  return rc;
}

/* An upper bound on the bytes s takes as a JSON string, quotes and
 * escapes included. */
int64_t cn__json_string_bound(const char *s) {
  int64_t n = 2;
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\' || *p == '/' || *p == '\b' ||
        *p == '\f' || *p == '\n' || *p == '\r' || *p == '\t')
      n += 2;
    else if (*p < 0x20)
      n += 6;
    else
      n += 1;
  }
  return n;
}

/* The longest label and target token as JSON strings (answer bounds). */
static void answer_strings(cn_model *m) {
  m->json_label_max = cn__json_string_bound(""); /* tag_names' fallback */
  for (int i = 0; i < m->n_labels; i++)
    if (m->labels[i] != NULL &&
        cn__json_string_bound(m->labels[i]) > m->json_label_max)
      m->json_label_max = cn__json_string_bound(m->labels[i]);
  m->json_token_max = cn__json_string_bound("<unk>");
  int nt = m->tgt_vocab != NULL ? cn_vocab_size(m->tgt_vocab) : 0;
  for (int i = 0; i < nt; i++) {
    const char *t = cn_vocab_token(m->tgt_vocab, i);
    if (t != NULL && cn__json_string_bound(t) > m->json_token_max)
      m->json_token_max = cn__json_string_bound(t);
  }
}

/* A model with nothing loaded yet: a uid of its own (never 0, never
 * reused in this process) and no directory descriptor. NULL when out of
 * memory. */
static cn_model *model_new(void) {
  static atomic_uint_fast64_t last_uid;
  cn_model *m = calloc(1, sizeof(*m));
  if (m != NULL) {
    m->dirfd = -1;
    m->uid = atomic_fetch_add(&last_uid, 1) + 1;
  }
  return m;
}

/* The directory is opened once (a symlink to it resolved once) and every
 * file read relative to it: a load that a symlink flip races reads one
 * version whole, never model.json of one and weights of another. */
static int open_dir(cn_model *m, const char *dir, cn_err *err) {
  m->dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (m->dirfd < 0)
    return cn_err_set(err, CN_E_IO, "%s: cannot open the model directory: "
                      "%s", dir, strerror(errno));
  return 0;
}

/* model.json, read and parsed: a JSON object without duplicate keys. */
static int read_model_json(cn_model *m, const char *file, cn_err *err) {
  char *text = NULL;
  size_t text_len = 0;
  int rc = cn__read_regular_at(m->dirfd, "model.json", file, MAX_MODEL_JSON,
                               0, &text, &text_len, err);
  if (rc != 0) {
    free(text);
    return rc;
  }
  json_error_t je;
  m->json = json_loadb(text, text_len, JSON_REJECT_DUPLICATES, &je);
  free(text);
  if (m->json == NULL)
    return cn_err_set(err, CN_E_BAD_MODEL, "%s: line %d: %s", file, je.line,
                      je.text);
  if (!json_is_object(m->json))
    return cn_err_set(err, CN_E_BAD_MODEL, "%s: is not a JSON object", file);
  return 0;
}

/* Every key model.json may hold (docs/models.md's table; "cells":
 * docs/cells.md; "seed": written by `canopy model init`, informational). */
static const char *const MODEL_KEYS[] = {
    "family", "hidden", "embed", "classes", "vocab", "labels", "lowercase",
    "type_b_labels", "crf", "word_vocab", "lexicon", "tgt_vocab",
    "max_decode_len", "version", "cells", "seed"};
#define N_MODEL_KEYS (sizeof(MODEL_KEYS) / sizeof(MODEL_KEYS[0]))

/* A key the loader does not know is a mistake, most often a typo
 * ("lables"), that would otherwise load silently without what it meant
 * to set: refused, naming the nearest known key when one is within one
 * edit (two for keys of six letters or more), as configuration keys are
 * (config/config.c), and else listing the keys. */
static int check_keys(const cn_model *m, const char *file, cn_err *err) {
  const char *k;
  json_t *v;
  json_object_foreach(m->json, k, v) {
    size_t i;
    for (i = 0; i < N_MODEL_KEYS && strcmp(k, MODEL_KEYS[i]) != 0; i++) {}
    if (i < N_MODEL_KEYS) continue;
    const char *near = NULL;
    int best = strlen(k) >= 6 ? 3 : 2;
    for (i = 0; i < N_MODEL_KEYS; i++) {
      int d = cn_edit_distance(k, MODEL_KEYS[i], false);
      if (d < best) best = d, near = MODEL_KEYS[i];
    }
    if (near != NULL)
      return cn_err_set(err, CN_E_BAD_MODEL, "%s: unknown key '%s'; did you "
                        "mean '%s'? (docs/models.md lists the keys)", file, k,
                        near);
    char known[300];
    size_t n = 0;
    known[0] = '\0';
    for (i = 0; i < N_MODEL_KEYS && n < sizeof(known); i++)
      n += (size_t)snprintf(known + n, sizeof(known) - n, "%s%s", i ? ", " : "",
                            MODEL_KEYS[i]);
    return cn_err_set(err, CN_E_BAD_MODEL, "%s: unknown key '%s'; the keys "
                      "are %s (docs/models.md)", file, k, known);
  }
  return 0;
}

/* Key 'family': a built-in family, or cells (*cells: described in
 * model.json, docs/cells.md). */
static int find_family(cn_model *m, const char *file, bool *cells,
                       cn_err *err) {
  const char *fam = json_string_value(json_object_get(m->json, "family"));
  char known[300];
  cn__family_names(known, sizeof(known));
  *cells = fam != NULL && strcmp(fam, "cells") == 0;
  if (*cells) m->fam = cn__family_cells();
  if (!*cells && (m->fam = cn__family_find(fam)) == NULL)
    return cn_err_set(err, CN_E_BAD_MODEL, "%s: key 'family' %s%s%s; known "
                      "families (see docs/models.md): %s, or cells "
                      "(docs/cells.md)", file,
                      fam ? "names unknown family '"
                          : "is missing or not a string",
                      fam ? fam : "", fam ? "'" : "", known);
  return 0;
}

/* Keys hidden, embed, classes and max_decode_len into m->dims. */
static int read_dims(cn_model *m, const char *file, bool cells, cn_err *err) {
  int rc, h = 0, d = 0, c = 0, mdl = 0;
  /* cells: the widths come from the cells and tensors (docs/cells.md) */
  if ((rc = get_int(m->json, file, "hidden", cells ? 0 : -1, MAX_SIZE, &h,
                    err)) ||
      (rc = get_int(m->json, file, "embed", cells ? 0 : -1, MAX_SIZE, &d,
                    err)) ||
      (rc = get_int(m->json, file, "classes", m->fam->has_classes ? -1 : 0,
                    1 << 20, &c, err)) ||
      (rc = get_int(m->json, file, "max_decode_len", 50, 1 << 20, &mdl, err)))
    return rc;
  /* docs/models.md mvrnn: a = embed[w] is the node vector, so D must equal H.
   * No other family constrains D, hence a named special case. */
  if (strcmp(m->fam->name, "mvrnn") == 0 && d != h)
    return cn_err_set(err, CN_E_BAD_MODEL, "%s: family mvrnn needs 'embed' "
                      "== 'hidden' (embed=%d, hidden=%d)", file, d, h);
  m->dims = (cn_dims){.H = h, .D = d, .C = c, .Dw = d};
  m->max_decode_len = mdl;
  return 0;
}

/* The boolean keys lowercase and crf. */
static int read_flags(cn_model *m, const char *file, cn_err *err) {
  json_t *lc = json_object_get(m->json, "lowercase");
  if (lc != NULL && !json_is_boolean(lc))
    return cn_err_set(err, CN_E_BAD_MODEL, "%s: key 'lowercase' must be "
                      "true or false", file);
  m->lowercase = json_is_true(lc);
  /* "crf" adds the family's CRF tensors (docs/models.md bilstm-tagger); the key
   * means nothing to other families, so there it is a mistake to report. */
  json_t *crf = json_object_get(m->json, "crf");
  if (crf != NULL && !json_is_boolean(crf))
    return cn_err_set(err, CN_E_BAD_MODEL, "%s: key 'crf' must be true or "
                      "false", file);
  if (crf != NULL && !m->fam->crf)
    return cn_err_set(err, CN_E_BAD_MODEL, "%s: key 'crf' is for family "
                      "bilstm-tagger only, not %s", file, m->fam->name);
  m->dims.crf = json_is_true(crf);
  return 0;
}

/* Keys labels (one per class, for families with classes) and
 * type_b_labels. */
static int read_labels(cn_model *m, const char *file, cn_err *err) {
  int rc;
  if (!m->fam->has_classes && json_object_get(m->json, "labels") != NULL)
    return cn_err_set(err, CN_E_BAD_MODEL, "%s: key 'labels' is given but "
                      "family %s has no classes", file, m->fam->name);
  if ((rc = get_strs(m->json, file, "labels", m->dims.C, &m->labels,
                     &m->n_labels, err)) ||
      (rc = get_strs(m->json, file, "type_b_labels", -1, &m->type_b_labels,
                     &m->n_type_b_labels, err)))
    return rc;
  return 0;
}

/* Key lexicon: a file inside the directory, made a trie once, here
 * (lexicon.c). */
static int read_lexicon(cn_model *m, const char *dir, const char *file,
                        cn_err *err) {
  const char *lex;
  int rc;
  if ((rc = get_str(m->json, file, "lexicon", &lex, err)) != 0) return rc;
  if (lex != NULL && (rc = inside_path(file, "lexicon", lex, err)) != 0)
    return rc;
  if (lex != NULL && (m->lexicon_path = join(dir, lex)) == NULL)
    return cn_err_set(err, CN_E_NOMEM, "%s: out of memory", file);
  if (m->lexicon_path != NULL &&
      (rc = name_key(cn_lexicon_load_at(m->dirfd, lex, m->lexicon_path,
                                        &m->lexicon, err),
                     file, "lexicon", err)) != 0)
    return rc;
  return 0;
}

/* The vocabularies: vocab always, word_vocab and tgt_vocab when the
 * family needs them. */
static int read_vocabs(cn_model *m, const char *file, cn_err *err) {
  bool need_word, need_tgt;
  int rc;
  cn__family_needs(m->fam, &need_word, &need_tgt);
  if ((rc = vocab_key(m, file, "vocab", true, &m->vocab, &m->dims.V, err)) ||
      (rc = vocab_key(m, file, "word_vocab", need_word, &m->word_vocab,
                      &m->dims.Vw, err)) ||
      (rc = vocab_key(m, file, "tgt_vocab", need_tgt, &m->tgt_vocab,
                      &m->dims.Vt, err)))
    return rc;
  return 0;
}

/* weights.safetensors opened, and Dw (latticelstm word_embed [Vw, Dw]),
 * which has no model.json key: whatever the file holds, D when the
 * tensor is absent. */
static int open_weights(cn_model *m, const char *wfile, cn_err *err) {
  int rc = cn_safetensors_open_at(m->dirfd, "weights.safetensors", wfile,
                                  &m->st, err);
  if (rc != 0) return rc;
  const cn_tensor *we = cn_safetensors_find(&m->st, "word_embed");
  if (we != NULL && we->ndim == 2 && we->shape[1] >= 1 &&
      we->shape[1] <= MAX_SIZE)
    m->dims.Dw = we->shape[1];
  return 0;
}

/* The order of the steps follows the order a person would fix things
 * in: model.json keys, then vocabularies, then the weights. */
int cn_model_load(const char *dir, cn_model **out, cn_err *err) {
  int rc = CN_E_NOMEM;
  char *file = NULL, *wfile = NULL;
  bool cells = false;
  cn_model *m = model_new();
  *out = NULL;
  if (m == NULL || (m->dir = strdup(dir)) == NULL ||
      (file = join(dir, "model.json")) == NULL ||
      (wfile = join(dir, "weights.safetensors")) == NULL) {
    cn_err_set(err, rc, "%s: out of memory", dir);
    goto out;
  }
  if ((rc = open_dir(m, dir, err)) != 0 ||
      (rc = read_model_json(m, file, err)) != 0 ||
      (rc = check_keys(m, file, err)) != 0 ||
      (rc = find_family(m, file, &cells, err)) != 0 ||
      (rc = read_dims(m, file, cells, err)) != 0 ||
      (rc = read_flags(m, file, err)) != 0 ||
      (rc = read_labels(m, file, err)) != 0 ||
      (rc = read_lexicon(m, dir, file, err)) != 0 ||
      (rc = read_vocabs(m, file, err)) != 0 ||
      (rc = open_weights(m, wfile, err)) != 0)
    goto out;
  if ((rc = cells ? cn__cells_load(m, file, err)
                  : bind_tensors(m, wfile, err)) != 0)
    goto out;
  if ((rc = compile_cells(m, err)) != 0) goto out;
  answer_strings(m);
  rc = 0;
out:
  if (m != NULL && m->dirfd >= 0) close(m->dirfd);
  if (m != NULL) m->dirfd = -1;
  free(file);
  free(wfile);
  if (rc != 0) cn_model_free(m);
  else *out = m;
  return rc;
}

const char *cn_model_family(const cn_model *m) { return m->fam->name; }
cn_input_kind cn_model_input(const cn_model *m) { return m->fam->input; }
int cn_model_n_types(const cn_model *m) { return m->fam->n_types; }

const char *cn_model_type_name(const cn_model *m, int type) {
  if (type < 0 || type >= m->fam->n_types) return NULL;
  return m->fam->type_names[type];
}

static json_t *str_array(char *const *s, int n) {
  json_t *a = json_array();
  for (int i = 0; i < n; i++) json_array_append_new(a, json_string(s[i]));
  return a;
}

/* GET /v1/models/{model} body, less what the server adds (policy). */
json_t *cn_model_describe(const cn_model *m) {
  json_t *o = json_object();
  const cn_dims *d = &m->dims;
  json_object_set_new(o, "family", json_string(m->fam->name));
  json_object_set_new(o, "input",
                      json_string(cn_input_kind_name(m->fam->input)));
  if (m->cells != NULL) { /* docs/cells.md */
    static const char *st[] = {"tree", "sequence", "bisequence", "dag"};
    json_object_set_new(o, "structure", json_string(st[m->cells->structure]));
  }
  json_object_set_new(o, "hidden", json_integer(d->H));
  json_object_set_new(o, "embed", json_integer(d->D));
  if (m->fam->has_classes)
    json_object_set_new(o, "classes", json_integer(d->C));
  json_object_set_new(o, "vocab_size", json_integer(d->V));
  if (m->labels != NULL)
    json_object_set_new(o, "labels", str_array(m->labels, m->n_labels));
  json_object_set_new(o, "lowercase", json_boolean(m->lowercase));
  if (m->fam->crf) json_object_set_new(o, "crf", json_boolean(m->dims.crf));
  json_t *vt = json_array();
  for (int i = 0; i < m->fam->n_types; i++)
    json_array_append_new(vt, json_string(m->fam->type_names[i]));
  json_object_set_new(o, "vertex_types", vt);
  if (m->word_vocab != NULL) {
    json_object_set_new(o, "word_vocab_size", json_integer(d->Vw));
    json_object_set_new(o, "word_embed", json_integer(d->Dw));
  }
  if (m->tgt_vocab != NULL) {
    json_object_set_new(o, "tgt_vocab_size", json_integer(d->Vt));
    json_object_set_new(o, "max_decode_len", json_integer(m->max_decode_len));
  }
  if (d->K > 0) json_object_set_new(o, "matrices", json_integer(d->K));
  if (m->type_b_labels != NULL)
    json_object_set_new(o, "type_b_labels",
                        str_array(m->type_b_labels, m->n_type_b_labels));
  json_t *lex = json_object_get(m->json, "lexicon");
  if (lex != NULL) json_object_set(o, "lexicon", lex);
  json_object_set_new(o, "weights_sha256",
                      json_string(cn_model_weights_sha256(m)));
  return o;
}

/* The hash is computed on first use (cn_safetensors_sha256): the model is
 * const to its readers, but its digest is a cache filled once. */
const char *cn_model_weights_sha256(const cn_model *m) {
  return cn_safetensors_sha256((cn_safetensors *)&m->st);
}

const char *cn_model_named_version(const cn_model *m) {
  const char *v = json_string_value(json_object_get(m->json, "version"));
  return v != NULL && v[0] != '\0' ? v : NULL;
}
