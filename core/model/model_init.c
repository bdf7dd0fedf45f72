/* model_init.c - write a fresh model directory with random weights.
 *
 * `canopy init` and the tests need models without a training pipeline: the
 * vocabulary comes from a JSONL file of docs/api.md instances (or a tiny
 * built-in list), the weights from a deterministic PRNG scaled so
 * activations do not saturate. model.json is removed first and written
 * last (tmp + rename), so a crash part-way leaves a directory that does not
 * load rather than one that loads mismatched files. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/model.h"

#define MAX_SIZE (1 << 16)

/* U(a, b) in float, from the top 24 bits. */
static float uniform(uint64_t *s, float a, float b) {
  return a + (b - a) * (float)(cn__splitmix64(s) >> 40) * (1.0f / 16777216.0f);
}

/* Each tensor's stream depends on the seed and its own name only, so
 * adding a tensor to a family leaves the others' values unchanged. */
static void fill(const cn_tensor_spec *sp, const cn_dims *d, uint64_t seed,
                 float *x, int64_t numel) {
  uint64_t h = 14695981039346656037ull;
  for (const char *p = sp->name; *p; p++)
    h = (h ^ (unsigned char)*p) * 1099511628211ull;
  uint64_t s = seed;
  s = cn__splitmix64(&s) ^ h;
  int64_t last = sp->shape[sp->ndim > 0 ? sp->ndim - 1 : 0];
  float b = 0.5f;
  switch (sp->init) {
  case CN_INIT_LINEAR: b = 1.0f / sqrtf((float)(last > 0 ? last : 1)); break;
  case CN_INIT_BIAS: b = 1.0f / sqrtf((float)d->H); break;
  case CN_INIT_MATRICES: b = 0.05f; break;
  case CN_INIT_SCORES: b = 0.1f; break;
  default: break; /* CN_INIT_EMBED: U(-1, 1)·0.5 */
  }
  for (int64_t i = 0; i < numel; i++) x[i] = uniform(&s, -b, b);
  if (sp->init == CN_INIT_MATRICES && sp->ndim >= 2 &&
      sp->shape[sp->ndim - 1] == sp->shape[sp->ndim - 2]) {
    int64_t n = last; /* identity on each [n, n] slice */
    for (int64_t k = 0; k < numel / (n * n); k++)
      for (int64_t i = 0; i < n; i++) x[k * n * n + i * n + i] += 1.0f;
  }
}

/* mkdir -p: every missing component of dir, each must end up a directory. */
static int mkdirs(const char *dir, cn_err *err) {
  int rc = 0;
  char *p = strdup(dir);
  if (p == NULL) return cn_err_set(err, CN_E_NOMEM, "out of memory");
  for (char *q = p + 1;; q++) {
    if (*q != '/' && *q != '\0') continue;
    char c = *q;
    *q = '\0';
    struct stat sb;
    int e = mkdir(p, 0755) == 0 ? 0 : errno;
    if (e != 0 && (e != EEXIST || stat(p, &sb) != 0 || !S_ISDIR(sb.st_mode))) {
      rc = cn_err_set(err, CN_E_IO, "%s: cannot create directory: %s", p,
                      e == EEXIST ? "a file is in the way" : strerror(e));
      goto out;
    }
    *q = c;
    if (c == '\0') break;
  }
out:
  free(p);
  return rc;
}

/* dir/name into buf, or an error naming the too-long path. */
static int path_in(char *buf, size_t cap, const char *dir, const char *name,
                   cn_err *err) {
  if ((size_t)snprintf(buf, cap, "%s/%s", dir, name) >= cap)
    return cn_err_set(err, CN_E_IO, "%s/%s: path too long", dir, name);
  return 0;
}

static int fill_text(FILE *f, void *ctx) {
  const char *text = ctx;
  size_t n = strlen(text);
  return fwrite(text, 1, n, f) != n || fputc('\n', f) == EOF ? -1 : 0;
}

/* Writes text and a newline to path.tmp, syncs it and renames it over
 * path (cn__file_write_atomic). */
static int write_atomic(const char *path, const char *text, cn_err *err) {
  char tmp[4096 + 8];
  snprintf(tmp, sizeof(tmp), "%s.tmp", path);
  return cn__file_write_atomic_err(path, tmp, false, fill_text, (void *)text,
                                   err);
}

/* Writes the family's tensors at dims d, in spec order. */
static int write_weights(const cn_family *fam, const cn_dims *d,
                         uint64_t seed, const char *path, cn_err *err) {
  int rc = 0;
  cn_tensor_spec sp[CN_MAX_TENSORS];
  cn_tensor_out t[CN_MAX_TENSORS];
  float *data[CN_MAX_TENSORS] = {0};
  int n = fam->tensors(d, sp);
  if (n < 0 || n > CN_MAX_TENSORS) {
    n = 0;
    rc = cn_err_set(err, CN_E_INTERNAL, "family %s lists too many tensors",
                    fam->name);
    goto out;
  }
  for (int i = 0; i < n; i++) {
    int64_t numel = 1;
    t[i] = (cn_tensor_out){.name = sp[i].name, .ndim = sp[i].ndim};
    for (int k = 0; k < sp[i].ndim; k++) {
      if (sp[i].shape[k] < 1) {
        rc = cn_err_set(err, CN_E_INTERNAL, "family %s: tensor '%s' has no "
                        "fixed size at init", fam->name, sp[i].name);
        goto out;
      }
      t[i].shape[k] = sp[i].shape[k];
      numel *= sp[i].shape[k];
    }
    if ((data[i] = cn__xcalloc((size_t)numel, sizeof(float))) == NULL) {
      rc = cn_err_set(err, CN_E_NOMEM, "tensor '%s': out of memory",
                      sp[i].name);
      goto out;
    }
    fill(&sp[i], d, seed, data[i], numel);
    t[i].data = data[i];
  }
  rc = cn_safetensors_write(path, t, n, err);
out:
  for (int i = 0; i < n; i++) free(data[i]);
  return rc;
}

/* ---- vocabularies from instances --------------------------------------*/
typedef struct toklist {
  char **s;
  size_t n, cap;
} toklist;

static int tl_add(toklist *l, const char *s, size_t len) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 1024;
    char **ns = cn__xrealloc(l->s, cap, sizeof(*ns));
    if (ns == NULL) return CN_E_NOMEM;
    l->s = ns;
    l->cap = cap;
  }
  if ((l->s[l->n] = strndup(s, len)) == NULL) return CN_E_NOMEM;
  l->n++;
  return 0;
}

static void tl_free(toklist *l) {
  for (size_t i = 0; i < l->n; i++) free(l->s[i]);
  free(l->s);
}

static const char *const builtin[] = {
    "the", "of", "and", "to", "a", "in", "is", "it", "you", "that", "he",
    "was", "for", "on", "are", "with", "as", "his", "they", "be", "at", "one",
    "have", "this", "from", "or", "had", "by", "not", "but", "what", "all",
    "were", "when", "we", "there", "can", "an", "your", "which", "their",
    "said", "if", "do", "will", "each", "about", "how", "up", "out", "film",
    "good", "bad", "movie", "fine", ".", ","};

/* ASCII whitespace splits "text" here; instance.c applies the full Unicode
 * rule at request time, which only matters for rare separators. */
static int add_split(toklist *l, const char *s) {
  int rc = 0;
  while (*s && rc == 0) {
    size_t n = strcspn(s, " \t\n\r\v\f");
    if (n > 0) rc = tl_add(l, s, n);
    s += n;
    s += strspn(s, " \t\n\r\v\f");
  }
  return rc;
}

/* One UTF-8 code point at a time (a stray byte is its own "character"). */
static int add_chars(toklist *l, const char *s) {
  int rc = 0;
  while (*s && rc == 0) {
    unsigned char c = (unsigned char)*s;
    size_t n = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
    size_t k = 1;
    while (k < n && ((unsigned char)s[k] & 0xc0) == 0x80) k++;
    rc = tl_add(l, s, k);
    s += k;
  }
  return rc;
}

/* Adds the strings of array a (or member key of each object in a). */
static int add_array(toklist *l, const json_t *a, const char *key) {
  size_t i;
  json_t *v;
  json_array_foreach(a, i, v) {
    const char *s = json_string_value(key ? json_object_get(v, key) : v);
    if (s != NULL && tl_add(l, s, strlen(s)) != 0) return CN_E_NOMEM;
  }
  return 0;
}

/* Tokens of one instance: input-side ones into src, lattice words (the
 * span's token, or its characters joined) into word. */
static int collect(const cn_family *fam, const json_t *in, toklist *src,
                   toklist *word, cn_err *e) {
  int rc = 0;
  cn_limits lim;
  cn_tree t = {0};
  cn_limits_default(&lim);
  json_t *tr = json_object_get(in, "tree"), *text = json_object_get(in, "text");
  switch (fam->input) {
  case CN_INPUT_TREE:
    if (json_is_string(tr))
      rc = cn_tree_parse_bracketed(json_string_value(tr),
                                   json_string_length(tr), &lim, &t, e);
    else if (tr != NULL)
      rc = cn_tree_parse_json(tr, &lim, &t, e);
    else
      rc = cn_err_set(e, CN_E_BAD_INSTANCE, "no \"tree\"");
    for (int i = 0; rc == 0 && i < t.n_nodes; i++)
      if (t.nodes[i].word != NULL)
        rc = tl_add(src, t.nodes[i].word, (size_t)t.nodes[i].word_len);
    cn_tree_free(&t);
    break;
  case CN_INPUT_SEQUENCE:
    rc = json_is_string(text) ? add_split(src, json_string_value(text))
                              : add_array(src, json_object_get(in, "tokens"),
                                          NULL);
    break;
  case CN_INPUT_LATTICE: {
    size_t base = src->n, i;
    json_t *w;
    rc = json_is_string(text) ? add_chars(src, json_string_value(text))
                              : add_array(src, json_object_get(in, "chars"),
                                          NULL);
    json_array_foreach(json_object_get(in, "words"), i, w) {
      const char *tok = json_string_value(json_object_get(w, "token"));
      json_int_t b = json_integer_value(json_object_get(w, "start"));
      json_int_t en = json_integer_value(json_object_get(w, "end"));
      if (rc != 0) break;
      if (tok != NULL) {
        rc = tl_add(word, tok, strlen(tok));
        continue;
      }
      if (b < 0 || en <= b || (size_t)en > src->n - base) {
        rc = cn_err_set(e, CN_E_BAD_LATTICE, "words[%zu] is not a span of "
                        "the characters", i);
        break;
      }
      char joined[1024];
      size_t n = 0;
      for (json_int_t k = b; k < en && n < sizeof(joined); k++) {
        const char *ch = src->s[base + (size_t)k];
        size_t l = strlen(ch);
        if (n + l < sizeof(joined)) memcpy(joined + n, ch, l);
        n += l;
      }
      if (n < sizeof(joined)) rc = tl_add(word, joined, n); /* else: skip */
    }
    break;
  }
  case CN_INPUT_DAG:
    rc = add_array(src, json_object_get(in, "nodes"), "token");
    break;
  }
  if (rc == CN_E_NOMEM) cn_err_set(e, rc, "out of memory");
  return rc;
}

/* Reads the JSONL file (one instance a line, blank lines skipped). */
static int collect_file(const cn_family *fam, const char *path, toklist *src,
                        toklist *word, cn_err *err) {
  int rc = 0, line = 0;
  char *buf = NULL;
  size_t cap = 0;
  json_t *in = NULL;
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    rc = cn_err_set(err, CN_E_IO, "%s: cannot open: %s", path,
                    strerror(errno));
    goto out;
  }
  while (getline(&buf, &cap, f) >= 0) {
    line++;
    if (buf[strspn(buf, " \t\r\n")] == '\0') continue;
    json_error_t je;
    cn_err e;
    cn_err_clear(&e);
    in = json_loads(buf, 0, &je);
    if (in == NULL || !json_is_object(in))
      rc = cn_err_set(&e, CN_E_BAD_JSON, "%s", in ? "not an object" : je.text);
    else
      rc = collect(fam, in, src, word, &e);
    json_decref(in);
    in = NULL;
    if (rc != 0) {
      cn_err_set(err, rc, "%s: line %d: %s", path, line, e.msg);
      goto out;
    }
  }
out:
  if (f != NULL) fclose(f);
  free(buf);
  return rc;
}

/* The lexicon's words (two characters or more) join the word vocabulary,
 * so spans the lexicon finds have embeddings of their own. The file is
 * read as the loader reads it (base/file.c: regular, bounded): a FIFO or
 * /dev/zero named by --lexicon would block or grow for ever. */
static int lexicon_words(const char *path, toklist *word, cn_err *err) {
  char *buf;
  size_t len;
  int rc = cn__read_regular(path, CN__MAX_LEXICON_BYTES, 0, &buf, &len, err);
  if (rc != 0) return rc;
  for (size_t i = 0; rc == 0 && i < len;) {
    size_t n = 0;
    while (i + n < len && buf[i + n] != '\n') n++;
    size_t next = i + n + 1;
    while (n > 0 && (buf[i + n - 1] == '\n' || buf[i + n - 1] == '\r')) n--;
    if (n >= 2) rc = tl_add(word, buf + i, n);
    i = next;
  }
  free(buf);
  return rc != 0 ? cn_err_set(err, rc, "%s: out of memory", path) : 0;
}

/* Copies the lexicon into the model directory (tmp + rename). */
static int copy_lexicon(const char *from, const char *to, cn_err *err) {
  char *buf;
  size_t len;
  int rc = cn__read_regular(from, CN__MAX_LEXICON_BYTES, 0, &buf, &len, err);
  if (rc != 0) return rc;
  rc = write_atomic(to, buf, err);
  free(buf);
  return rc;
}

static json_t *labels_json(int c) {
  static const char *five[] = {"very negative", "negative", "neutral",
                               "positive", "very positive"};
  static const char *two[] = {"negative", "positive"};
  json_t *a = json_array();
  for (int i = 0; i < c; i++) {
    char b[32];
    snprintf(b, sizeof(b), "class_%d", i);
    json_array_append_new(a, json_string(c == 5   ? five[i]
                                         : c == 2 ? two[i]
                                                  : b));
  }
  return a;
}

/* model.json: sizes, file names, labels and family options. The seed is
 * recorded for the reader (a seed above 2^63 shows as negative). */
static json_t *model_json(const cn_family *fam, int h, int d, int c,
                          const int nv[3], uint64_t seed, bool lexicon,
                          bool crf) {
  json_t *j = json_object();
  json_object_set_new(j, "family", json_string(fam->name));
  json_object_set_new(j, "hidden", json_integer(h));
  json_object_set_new(j, "embed", json_integer(d));
  if (fam->has_classes) json_object_set_new(j, "classes", json_integer(c));
  json_object_set_new(j, "vocab", json_string("vocab.txt"));
  if (nv[1]) json_object_set_new(j, "word_vocab", json_string("words.txt"));
  if (nv[2]) {
    json_object_set_new(j, "tgt_vocab", json_string("tgt_vocab.txt"));
    json_object_set_new(j, "max_decode_len", json_integer(50));
  }
  if (lexicon) json_object_set_new(j, "lexicon", json_string("lexicon.txt"));
  if (fam->has_classes) json_object_set_new(j, "labels", labels_json(c));
  json_object_set_new(j, "lowercase", json_false());
  if (crf) json_object_set_new(j, "crf", json_true());
  if (strcmp(fam->name, "treelstm-2type") == 0)
    json_object_set_new(j, "type_b_labels", json_pack("[ss]", "NP", "PP"));
  json_object_set_new(j, "seed", json_integer((json_int_t)seed));
  return j;
}

static int check_size(const char *k, int v, int max, cn_err *err) {
  if (v < 1 || v > max)
    return cn_err_set(err, CN_E_BAD_CONFIG, "%s must be from 1 to %d (got %d)",
                      k, max, v);
  return 0;
}

/* The sizes the directory is made at: the options' or the defaults. */
typedef struct init_sizes {
  int h, d, c, maxv; /* hidden, embed, classes (0: none), vocabulary */
} init_sizes;

/* The options checked against the family before anything is written:
 * sizes in range, mvrnn's square matrices, a directory, --lexicon and
 * --crf only for the families that read them. */
static int check_opts(const cn_model_init_opts *o, const cn_family *fam,
                      init_sizes *z, cn_err *err) {
  int rc;
  bool mv = strcmp(fam->name, "mvrnn") == 0;
  z->h = o->hidden ? o->hidden : 64;
  z->d = o->embed ? o->embed : mv ? z->h : 64;
  z->c = fam->has_classes ? (o->classes ? o->classes : 5) : 0;
  z->maxv = o->max_vocab ? o->max_vocab : 20000;
  if ((rc = check_size("hidden", z->h, MAX_SIZE, err)) ||
      (rc = check_size("embed", z->d, MAX_SIZE, err)) ||
      (fam->has_classes && (rc = check_size("classes", z->c, 1 << 20, err))) ||
      (rc = check_size("max_vocab", z->maxv, 1 << 24, err)))
    return rc;
  if (mv && z->d != z->h)
    return cn_err_set(err, CN_E_BAD_CONFIG, "family mvrnn needs embed == "
                      "hidden (embed=%d, hidden=%d)", z->d, z->h);
  if (o->dir == NULL || o->dir[0] == '\0')
    return cn_err_set(err, CN_E_BAD_CONFIG, "no model directory given");
  if (o->lexicon != NULL && fam->input != CN_INPUT_LATTICE)
    return cn_err_set(err, CN_E_BAD_CONFIG, "--lexicon is for lattice "
                      "families (latticelstm), not %s", fam->name);
  if (o->crf && !fam->crf)
    return cn_err_set(err, CN_E_BAD_CONFIG, "--crf is for bilstm-tagger, not "
                      "%s", fam->name);
  return 0;
}

/* The tokens the vocabularies are ranked from: the lexicon's words, then
 * the instances of --vocab-from, or the built-in list (a lattice family's
 * characters to src, its words to word). */
static int collect_tokens(const cn_model_init_opts *o, const cn_family *fam,
                          toklist *src, toklist *word, cn_err *err) {
  int rc = 0;
  if (o->lexicon != NULL && (rc = lexicon_words(o->lexicon, word, err)))
    return rc;
  if (o->vocab_from != NULL) return collect_file(fam, o->vocab_from, src, word,
                                                 err);
  for (size_t i = 0; i < CN_ARRAY_SIZE(builtin) && rc == 0; i++) {
    const char *w = builtin[i];
    size_t n = strlen(w);
    if (fam->input != CN_INPUT_LATTICE) rc = tl_add(src, w, n);
    else if ((rc = add_chars(src, w)) == 0 && n >= 2)
      rc = tl_add(word, w, n);
  }
  if (rc != 0) cn_err_set(err, rc, "out of memory");
  return rc;
}

/* vocab.txt, words.txt, tgt_vocab.txt: voc[k] of nv[k] tokens each (0
 * where the family needs none). The target side of lstm-nmt shares the
 * source tokens (there is no target text to learn from). */
static int rank_vocabs(const cn_family *fam, const toklist *src,
                       const toklist *word, int maxv, const char **voc[3],
                       int nv[3], cn_err *err) {
  static const char *const sp[] = {"<unk>", "<s>", "</s>"};
  bool need_word, need_tgt;
  cn__family_needs(fam, &need_word, &need_tgt);
  int rc;
  if ((rc = cn__vocab_rank(src->s, src->n, sp, 1, maxv, &voc[0], &nv[0])) ||
      (need_word &&
       (rc = cn__vocab_rank(word->s, word->n, sp, 1, maxv, &voc[1], &nv[1]))) ||
      (need_tgt &&
       (rc = cn__vocab_rank(src->s, src->n, sp, 3, maxv, &voc[2], &nv[2])))) {
    if (rc == CN_E_NOMEM) cn_err_set(err, rc, "out of memory");
  }
  return rc;
}

/* The directory's files but model.json: the vocabularies, the weights at
 * dims, the lexicon's copy; model.json, which would make a half-written
 * directory load, is removed first. */
static int write_files(const cn_model_init_opts *o, const cn_family *fam,
                       const cn_dims *dims, const char **const voc[3],
                       const int nv[3], cn_err *err) {
  static const char *const file[] = {"vocab.txt", "words.txt",
                                     "tgt_vocab.txt"};
  char path[4096];
  int rc;
  if ((rc = mkdirs(o->dir, err)) ||
      (rc = path_in(path, sizeof(path), o->dir, "model.json", err)))
    return rc;
  if (unlink(path) != 0 && errno != ENOENT)
    return cn_err_set(err, CN_E_IO, "%s: cannot remove the old file: %s",
                      path, strerror(errno));
  for (int i = 0; i < 3; i++) {
    if (nv[i] == 0) continue;
    if ((rc = path_in(path, sizeof(path), o->dir, file[i], err)) ||
        (rc = cn_vocab_write(path, voc[i], nv[i], err)))
      return rc;
  }
  if ((rc = path_in(path, sizeof(path), o->dir, "weights.safetensors",
                    err)) ||
      (rc = write_weights(fam, dims, o->seed, path, err)))
    return rc;
  if (o->lexicon != NULL &&
      ((rc = path_in(path, sizeof(path), o->dir, "lexicon.txt", err)) ||
       (rc = copy_lexicon(o->lexicon, path, err))))
    return rc;
  return 0;
}

/* The whole directory, in the order the file comment explains. */
int cn_model_init(const cn_model_init_opts *o, cn_err *err) {
  int rc = 0;
  toklist src = {0}, word = {0};
  const char **voc[3] = {0};
  int nv[3] = {0};
  json_t *j = NULL;
  char *text = NULL;
  char path[4096];
  const cn_family *fam = cn__family_find(o->family);
  char known[256];
  cn__family_names(known, sizeof(known));
  if (fam == NULL) {
    rc = cn_err_set(err, CN_E_BAD_CONFIG, "unknown family '%s'; known "
                    "families: %s", o->family ? o->family : "(none)", known);
    goto out;
  }
  init_sizes z;
  if ((rc = check_opts(o, fam, &z, err)) ||
      (rc = collect_tokens(o, fam, &src, &word, err)) ||
      (rc = rank_vocabs(fam, &src, &word, z.maxv, voc, nv, err)))
    goto out;
  cn_dims dims = {.H = z.h, .D = z.d, .C = z.c, .Dw = z.d,
                  .V = nv[0], .Vw = nv[1], .Vt = nv[2], .crf = o->crf != 0};
  dims.K = dims.V < 256 ? dims.V : 256; /* mvrnn leaf.M */
  if ((rc = write_files(o, fam, &dims, voc, nv, err)))
    goto out;
  j = model_json(fam, z.h, z.d, z.c, nv, o->seed, o->lexicon != NULL,
                 o->crf != 0);
  text = j ? json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
  if (text == NULL) {
    rc = cn_err_set(err, CN_E_NOMEM, "model.json: out of memory");
    goto out;
  }
  if ((rc = path_in(path, sizeof(path), o->dir, "model.json", err)) ||
      (rc = write_atomic(path, text, err)))
    goto out;
out:
  for (int i = 0; i < 3; i++) free(voc[i]);
  tl_free(&src);
  tl_free(&word);
  json_decref(j);
  free(text);
  return rc;
}
