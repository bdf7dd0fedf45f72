/* seq_parse.c - the non-tree INSTANCE forms of docs/api.md: token sequences,
 * character lattices with word spans, and word DAGs.
 *
 * Everything a family's build() relies on is checked here, so a run never
 * sees an instance it cannot execute: ids inside the vocabularies, spans
 * inside the characters, predecessors before their node, one sink. Each
 * error names the token, span or node (err->node) and what to change.
 */
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

/* A borrowed string: a JSON string's bytes, or a slice of "text". */
typedef struct piece {
  const char *s;
  int32_t len;
} piece;

/* Length of the UTF-8 sequence starting at s (jansson strings are valid). */
static int u8_len(unsigned char c) {
  return c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
}

static uint32_t u8_decode(const char *s, int n) {
  const unsigned char *u = (const unsigned char *)s;
  if (n == 1) return u[0];
  uint32_t cp = u[0] & (0xff >> (n + 1));
  for (int i = 1; i < n; i++) cp = (cp << 6) | (u[i] & 0x3f);
  return cp;
}

/* Unicode whitespace, as Python's str.split() sees it. */
static bool is_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 ||
         c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) ||
         c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f ||
         c == 0x3000;
}

/* Splits `text` on whitespace (words) or into code points (chars). */
static int split_text(const char *s, size_t len, bool chars, piece **out,
                      int32_t *n, int32_t max, cn_err *err) {
  piece *p = NULL;
  int32_t k = 0, cap = 0;
  size_t i = 0;
  while (i < len) {
    int l = u8_len((unsigned char)s[i]);
    if (i + (size_t)l > len) l = (int)(len - i);
    bool sp = !chars && is_space(u8_decode(s + i, l));
    if (sp) {
      i += (size_t)l;
      continue;
    }
    size_t start = i, end = i + (size_t)l;
    if (!chars) /* extend the word to the next space */
      while (end < len) {
        int m = u8_len((unsigned char)s[end]);
        if (end + (size_t)m > len) m = (int)(len - end);
        if (is_space(u8_decode(s + end, m))) break;
        end += (size_t)m;
      }
    if (k == max) {
      free(p);
      err->node = k;
      return cn_err_set(err, CN_E_TOO_LARGE,
                        "\"text\" has more %s than the limit of %d "
                        "(max-seq-len)", chars ? "characters" : "tokens", max);
    }
    if (k == cap) {
      cap = cap ? cap * 2 : 32;
      piece *q = cn__xrealloc(p, (size_t)cap, sizeof(*p));
      if (q == NULL) {
        free(p);
        return cn_err_set(err, CN_E_NOMEM, "no memory for the input");
      }
      p = q;
    }
    p[k].s = s + start;
    p[k].len = (int32_t)(end - start);
    k++;
    i = end;
  }
  *out = p;
  *n = k;
  return 0;
}

int32_t cn__split_text(const char *s, size_t len, bool chars, int32_t max,
                       const char ***ps, int32_t **pl, int32_t *cap) {
  int32_t k = 0;
  size_t i = 0;
  while (i < len) { /* split_text's walk, into the caller's arrays */
    int l = u8_len((unsigned char)s[i]);
    if (i + (size_t)l > len) l = (int)(len - i);
    if (!chars && is_space(u8_decode(s + i, l))) {
      i += (size_t)l;
      continue;
    }
    size_t start = i, end = i + (size_t)l;
    if (!chars)
      while (end < len) {
        int m = u8_len((unsigned char)s[end]);
        if (end + (size_t)m > len) m = (int)(len - end);
        if (is_space(u8_decode(s + end, m))) break;
        end += (size_t)m;
      }
    if (k == max) return -1;
    if (k == *cap) {
      int32_t c = *cap ? *cap * 2 : 64;
      const char **a = cn__xrealloc((void *)*ps, (size_t)c, sizeof(char *));
      if (a == NULL) return -2;
      *ps = a;
      int32_t *b = cn__xrealloc(*pl, (size_t)c, sizeof(int32_t));
      if (b == NULL) return -2;
      *pl = b;
      *cap = c;
    }
    (*ps)[k] = s + start;
    (*pl)[k] = (int32_t)(end - start);
    k++;
    i = end;
  }
  return k;
}

/* The items of an instance: "tokens"/"chars" (array of strings) or "text". */
static int get_items(const json_t *inst, const char *key, bool chars,
                     const cn_limits *lim, int code, piece **out, int32_t *n,
                     cn_err *err) {
  const json_t *arr = json_object_get(inst, key);
  const json_t *text = json_object_get(inst, "text");
  *out = NULL;
  *n = 0;
  if (arr != NULL) {
    if (!json_is_array(arr))
      return cn_err_set(err, code, "\"%s\" must be an array of strings", key);
    size_t m = json_array_size(arr);
    if (m > (size_t)lim->max_seq_len)
      return cn_err_set(err, CN_E_TOO_LARGE,
                        "\"%s\" has %zu items, over the limit of %d "
                        "(max-seq-len)", key, m, lim->max_seq_len);
    piece *p = cn__xcalloc(m ? m : 1, sizeof(*p));
    if (p == NULL) return cn_err_set(err, CN_E_NOMEM, "no memory");
    for (size_t i = 0; i < m; i++) {
      const json_t *t = json_array_get(arr, i);
      if (!json_is_string(t) || json_string_length(t) == 0) {
        free(p);
        err->node = (int)i;
        return cn_err_set(err, code, "\"%s\"[%zu] must be a non-empty string",
                          key, i);
      }
      p[i].s = json_string_value(t);
      p[i].len = (int32_t)json_string_length(t);
    }
    *out = p;
    *n = (int32_t)m;
  } else if (json_is_string(text)) {
    int rc = split_text(json_string_value(text), json_string_length(text),
                        chars, out, n, lim->max_seq_len, err);
    if (rc != 0) return rc;
  } else {
    return cn_err_set(err, code, "the instance needs \"%s\" (an array) or "
                      "\"text\" (a string)", key);
  }
  if (*n == 0) {
    free(*out);
    *out = NULL;
    return cn_err_set(err, code, "the input is empty: send at least one %s",
                      chars ? "character" : "token");
  }
  for (int32_t i = 0; i < *n; i++)
    if ((*out)[i].len > lim->max_token_len) {
      int32_t len = (*out)[i].len;
      free(*out);
      *out = NULL;
      err->node = i;
      if (arr != NULL)
        return cn_err_set(err, CN_E_TOO_LARGE,
                          "\"%s\"[%d] is %d bytes, over the limit of %d "
                          "(max-token-len)", key, i, len, lim->max_token_len);
      return cn_err_set(err, CN_E_TOO_LARGE,
                        "%s %d of \"text\" is %d bytes, over the limit of %d "
                        "(max-token-len)", chars ? "character" : "token", i,
                        len, lim->max_token_len);
    }
  return 0;
}

static int lookup_all(const cn_vocab *v, bool lower, const piece *p,
                      int32_t n, cn_instance *in, cn_err *err) {
  in->ids = malloc((size_t)n * sizeof(int32_t));
  if (in->ids == NULL) return cn_err_set(err, CN_E_NOMEM, "no memory");
  for (int32_t i = 0; i < n; i++)
    in->ids[i] = cn_vocab_lookup(v, p[i].s, (size_t)p[i].len, lower);
  in->n = n;
  return 0;
}

int cn__parse_sequence(const cn_model *m, const json_t *inst,
                       const cn_limits *lim, cn_instance *in, cn_err *err) {
  piece *p = NULL;
  int32_t n = 0;
  int rc = get_items(inst, "tokens", false, lim, CN_E_BAD_INSTANCE, &p, &n,
                     err);
  if (rc == 0) rc = lookup_all(m->vocab, m->lowercase, p, n, in, err);
  free(p);
  return rc;
}

/* ---- lattices ---- */

typedef struct span_acc {
  cn_instance *in;
  int32_t cap;
  int32_t max;
} span_acc;

static int add_span(void *ctx, int32_t b, int32_t e) {
  span_acc *a = ctx;
  cn_instance *in = a->in;
  if (in->n_spans == a->max) return CN_E_TOO_LARGE;
  if (in->n_spans == a->cap) {
    int32_t c = a->cap ? a->cap * 2 : 64;
    int32_t *s = cn__xrealloc(in->span_start, (size_t)c, sizeof(int32_t));
    if (s == NULL) return CN_E_NOMEM;
    in->span_start = s;
    int32_t *t = cn__xrealloc(in->span_end, (size_t)c, sizeof(int32_t));
    if (t == NULL) return CN_E_NOMEM;
    in->span_end = t;
    a->cap = c;
  }
  in->span_start[in->n_spans] = b;
  in->span_end[in->n_spans] = e;
  in->n_spans++;
  return 0;
}

static int cmp_span(const void *x, const void *y) {
  const int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
  return a < b ? -1 : a > b;
}

/* The word_vocab id of each span: its "token", else its joined chars. */
static int span_words(const cn_model *m, const piece *c, const json_t *words,
                      cn_instance *in, cn_err *err) {
  in->span_word = malloc((size_t)(in->n_spans ? in->n_spans : 1) *
                         sizeof(int32_t));
  if (in->span_word == NULL) return cn_err_set(err, CN_E_NOMEM, "no memory");
  char buf[1024];
  for (int32_t k = 0; k < in->n_spans; k++) {
    const json_t *tok = NULL;
    if (words != NULL)
      tok = json_object_get(json_array_get(words, (size_t)k), "token");
    if (json_is_string(tok)) {
      in->span_word[k] = cn_vocab_lookup(m->word_vocab, json_string_value(tok),
                                         json_string_length(tok),
                                         m->lowercase);
      continue;
    }
    size_t len = 0;
    bool fits = true;
    for (int32_t j = in->span_start[k]; j < in->span_end[k]; j++) {
      if (len + (size_t)c[j].len > sizeof(buf)) {
        fits = false;
        break;
      }
      memcpy(buf + len, c[j].s, (size_t)c[j].len);
      len += (size_t)c[j].len;
    }
    in->span_word[k] =
        fits ? cn_vocab_lookup(m->word_vocab, buf, len, m->lowercase) : 0;
  }
  return 0;
}

/* Reads "words": each {start, end, token?} inside the characters, at least
 * two long, no two the same. Spans keep the request's order. */
static int given_spans(const json_t *words, const cn_limits *lim,
                       cn_instance *in, cn_err *err) {
  size_t m = json_array_size(words);
  if (m > (size_t)lim->max_spans)
    return cn_err_set(err, CN_E_TOO_LARGE,
                      "\"words\" has %zu spans, over the limit of %d "
                      "(max-spans)", m, lim->max_spans);
  span_acc acc = {in, 0, lim->max_spans};
  int64_t *keys = malloc((m ? m : 1) * sizeof(int64_t));
  if (keys == NULL) return cn_err_set(err, CN_E_NOMEM, "no memory");
  int rc = 0;
  for (size_t i = 0; i < m; i++) {
    const json_t *w = json_array_get(words, i);
    const json_t *js = json_object_get(w, "start");
    const json_t *je = json_object_get(w, "end");
    const json_t *jt = json_object_get(w, "token");
    err->node = (int)i;
    if (!json_is_object(w) || !json_is_integer(js) || !json_is_integer(je)) {
      rc = cn_err_set(err, CN_E_BAD_LATTICE,
                      "word %zu: needs integer \"start\" and \"end\"", i);
      goto out;
    }
    if (jt != NULL && !json_is_string(jt)) {
      rc = cn_err_set(err, CN_E_BAD_LATTICE,
                      "word %zu: \"token\" must be a string", i);
      goto out;
    }
    json_int_t b = json_integer_value(js), e = json_integer_value(je);
    if (b < 0 || e > in->n || b >= e) {
      rc = cn_err_set(err, CN_E_BAD_LATTICE,
                      "word %zu: span [%lld, %lld) is outside the %d "
                      "characters (end is exclusive)",
                      i, (long long)b, (long long)e, in->n);
      goto out;
    }
    if (e - b < 2) {
      rc = cn_err_set(err, CN_E_BAD_LATTICE,
                      "word %zu: span [%lld, %lld) is shorter than 2 "
                      "characters (single characters are the char cells)",
                      i, (long long)b, (long long)e);
      goto out;
    }
    if ((rc = add_span(&acc, (int32_t)b, (int32_t)e)) != 0) {
      rc = cn_err_set(err, rc, "no memory for the spans");
      goto out;
    }
    keys[i] = ((int64_t)b << 32) | (int64_t)e;
  }
  qsort(keys, m, sizeof(int64_t), cmp_span);
  for (size_t i = 1; i < m; i++)
    if (keys[i] == keys[i - 1]) {
      err->node = -1;
      rc = cn_err_set(err, CN_E_BAD_LATTICE,
                      "span [%lld, %lld) is given twice in \"words\"",
                      (long long)(keys[i] >> 32),
                      (long long)(keys[i] & 0xffffffff));
      goto out;
    }
  err->node = -1;
out:
  free(keys);
  return rc;
}

int cn__parse_lattice(const cn_model *m, const json_t *inst,
                      const cn_limits *lim, cn_instance *in, cn_err *err) {
  piece *c = NULL;
  int32_t n = 0;
  int rc = get_items(inst, "chars", true, lim, CN_E_BAD_LATTICE, &c, &n, err);
  if (rc != 0) return rc;
  if ((rc = lookup_all(m->vocab, m->lowercase, c, n, in, err)) != 0) goto out;
  const json_t *words = json_object_get(inst, "words");
  if (words != NULL && !json_is_array(words)) {
    rc = cn_err_set(err, CN_E_BAD_LATTICE,
                    "\"words\" must be an array of {start, end, token?}");
    goto out;
  }
  if (words != NULL) {
    rc = given_spans(words, lim, in, err);
  } else if (m->lexicon != NULL) {
    const char **cs = malloc((size_t)n * sizeof(char *));
    int32_t *ls = malloc((size_t)n * sizeof(int32_t));
    span_acc acc = {in, 0, lim->max_spans};
    if (cs == NULL || ls == NULL) {
      rc = CN_E_NOMEM;
    } else {
      for (int32_t i = 0; i < n; i++) cs[i] = c[i].s, ls[i] = c[i].len;
      rc = cn_lexicon_match(m->lexicon, cs, ls, n, m->lowercase, add_span,
                            &acc);
    }
    free(cs);
    free(ls);
    if (rc == CN_E_TOO_LARGE)
      cn_err_set(err, rc, "the lexicon finds more word spans than the "
                 "limit of %d (max-spans); send \"words\" or a shorter text",
                 lim->max_spans);
    else if (rc != 0)
      cn_err_set(err, rc, "no memory for the spans");
  }
  if (rc != 0) goto out;
  /* Span k is words[k] when the request sent words. */
  rc = span_words(m, c, words, in, err);
out:
  free(c);
  return rc;
}

/* ---- word DAGs ---- */

/* The first pass over a DAG's nodes: each an object with a string
 * "token" and an array "prev" (or none); *edges, their predecessors in
 * all, within max-spans. */
static int dag_count_edges(const json_t *nodes, size_t n,
                           const cn_limits *lim, size_t *edges, cn_err *err) {
  *edges = 0;
  for (size_t j = 0; j < n; j++) {
    const json_t *nd = json_array_get(nodes, j);
    const json_t *prev = json_object_get(nd, "prev");
    if (!json_is_object(nd) || !json_is_string(json_object_get(nd, "token")) ||
        (prev != NULL && !json_is_array(prev))) {
      err->node = (int)j;
      return cn_err_set(err, CN_E_BAD_LATTICE,
                        "node %zu: needs a string \"token\" and an array "
                        "\"prev\"", j);
    }
    *edges += json_array_size(prev);
  }
  if (*edges > (size_t)lim->max_spans)
    return cn_err_set(err, CN_E_TOO_LARGE,
                      "the DAG has %zu predecessor edges, over the limit of "
                      "%d (max-spans)", *edges, lim->max_spans);
  return 0;
}

/* Node j of a DAG the first pass checked: its token's id, and its
 * predecessors appended at in->prev[*at ..], each an earlier node listed
 * once, marked in has_succ. */
static int dag_node(const cn_model *m, const json_t *nd, size_t j,
                    const cn_limits *lim, cn_instance *in, int32_t *at,
                    char *has_succ, cn_err *err) {
  const json_t *tok = json_object_get(nd, "token");
  const json_t *prev = json_object_get(nd, "prev");
  if (json_string_length(tok) > (size_t)lim->max_token_len) {
    err->node = (int)j;
    return cn_err_set(err, CN_E_TOO_LARGE,
                      "node %zu: token of %zu bytes, over the limit of %d "
                      "(max-token-len)", j, json_string_length(tok),
                      lim->max_token_len);
  }
  in->ids[j] = cn_vocab_lookup(m->vocab, json_string_value(tok),
                               json_string_length(tok), m->lowercase);
  in->prev_start[j] = *at;
  for (size_t k = 0; k < json_array_size(prev); k++) {
    const json_t *p = json_array_get(prev, k);
    json_int_t u = json_is_integer(p) ? json_integer_value(p) : -1;
    err->node = (int)j;
    if (!json_is_integer(p) || u < 0 || (size_t)u >= j)
      return cn_err_set(err, CN_E_BAD_LATTICE,
                        "node %zu: prev[%zu] must be the index of an earlier "
                        "node (0..%zu): nodes come in topological order",
                        j, k, j ? j - 1 : 0);
    for (int32_t q = in->prev_start[j]; q < *at; q++)
      if (in->prev[q] == (int32_t)u)
        return cn_err_set(err, CN_E_BAD_LATTICE,
                          "node %zu: predecessor %lld is listed twice", j,
                          (long long)u);
    in->prev[(*at)++] = (int32_t)u;
    has_succ[u] = 1;
  }
  return 0;
}

int cn__parse_dag(const cn_model *m, const json_t *inst, const cn_limits *lim,
                  cn_instance *in, cn_err *err) {
  const json_t *nodes = json_object_get(inst, "nodes");
  char *has_succ = NULL;
  int rc = 0;
  if (!json_is_array(nodes))
    return cn_err_set(err, CN_E_BAD_INSTANCE,
                      "the instance needs \"nodes\": an array of "
                      "{\"token\", \"prev\"}");
  size_t n = json_array_size(nodes);
  if (n == 0)
    return cn_err_set(err, CN_E_BAD_LATTICE,
                      "the DAG is empty: send at least one node");
  if (n > (size_t)lim->max_seq_len)
    return cn_err_set(err, CN_E_TOO_LARGE,
                      "the DAG has %zu nodes, over the limit of %d "
                      "(max-seq-len)", n, lim->max_seq_len);
  in->n = (int32_t)n;
  in->ids = malloc(n * sizeof(int32_t));
  in->prev_start = malloc((n + 1) * sizeof(int32_t));
  has_succ = calloc(n, 1);
  if (in->ids == NULL || in->prev_start == NULL || has_succ == NULL) {
    rc = cn_err_set(err, CN_E_NOMEM, "no memory");
    goto out;
  }
  size_t edges;
  if ((rc = dag_count_edges(nodes, n, lim, &edges, err)) != 0) goto out;
  in->prev = malloc((edges ? edges : 1) * sizeof(int32_t));
  if (in->prev == NULL) {
    rc = cn_err_set(err, CN_E_NOMEM, "no memory");
    goto out;
  }
  int32_t at = 0;
  for (size_t j = 0; j < n; j++)
    if ((rc = dag_node(m, json_array_get(nodes, j), j, lim, in, &at,
                       has_succ, err)) != 0)
      goto out;
  in->prev_start[n] = at;
  /* one sink: every node but the last has a successor */
  for (size_t j = 0; j + 1 < n; j++)
    if (!has_succ[j]) {
      err->node = (int)j;
      rc = cn_err_set(err, CN_E_BAD_LATTICE,
                      "node %zu has no successor, so the DAG has more than "
                      "one sink: the last node (%zu) must be the only one",
                      j, n - 1);
      goto out;
    }
  err->node = -1;
out:
  free(has_succ);
  return rc;
}
