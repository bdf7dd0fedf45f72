/* instance_line.c - an INSTANCE line read without a JSON DOM: the shapes
 * `canopy run` reads by the thousand ({"tree": "..."}, {"tokens": [...]},
 * {"chars": [...], "words": [...]}, {"nodes": [...]}) go from the line's
 * bytes (input/jline.c's tape) to the instance in one pass, its arrays in
 * the reader's arena.
 *
 * "text" is split as seq_parse.c splits it (cn__split_text).
 *
 * It only ever succeeds. Whatever it does not read, or finds wrong -
 * another key, a tree as JSON nodes, any error a check of
 * instance.c or seq_parse.c would report - it declines, and the caller
 * parses the line as before (json_loadb, cn_instance_parse). So every
 * error, its message and its byte offset, comes from the one path that
 * always wrote them; and an instance read here equals, array for array,
 * the one cn_instance_parse makes of the same line
 * (tests/test_instance_line.c checks both on every line of data/ and on
 * malformed variants of them).
 */
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

struct cn_line_reader {
  cn_jline j;
  cn_tree_scratch ts;
  cn_arena arena;      /* the instances, until cn_line_reader_reset */
  int64_t *keys;       /* lattices: span keys, sorted to find repeats */
  int32_t *sb, *se;    /* lattices: lexicon spans before they are copied */
  const char **cs;     /* the characters (lattices) or words of "text" */
  int32_t *cl;
  const char **ws;     /* lattices: each span's word (span_word), ... */
  int32_t *wl;         /* ... and its length */
  int32_t *tk;         /* lattices: the tape index of its "token", or -1 */
  char *jb;            /* lattices: the characters joined, ... */
  int32_t *co;         /* ... character c from jb[co[c]] (n + 1 entries) */
  size_t jb_cap;
  int32_t keys_cap, sb_cap, se_cap, ws_cap, wl_cap, tk_cap, co_cap;
  int32_t text_cap;    /* of cs and cl both (cn__split_text grows them) */
};

cn_line_reader *cn_line_reader_new(void) {
  return calloc(1, sizeof(cn_line_reader));
}

void cn_line_reader_reset(cn_line_reader *rd) {
  if (rd != NULL) cn__arena_reset(&rd->arena);
}

void cn_line_reader_free(cn_line_reader *rd) {
  if (rd == NULL) return;
  cn__jline_free(&rd->j);
  cn__tree_scratch_free(&rd->ts);
  cn__arena_free(&rd->arena);
  free(rd->keys);
  free(rd->sb);
  free(rd->se);
  free(rd->ws);
  free(rd->wl);
  free(rd->tk);
  free(rd->co);
  free(rd->jb);
  free(rd->cs);
  free(rd->cl);
  free(rd);
}

/* Grows *p to hold n items of size bytes (cap in items); -1: no memory. */
static int grow(void **p, int32_t *cap, int32_t n, size_t size) {
  if (n <= *cap) return 0;
  int32_t c = *cap ? *cap : 64;
  while (c < n) c *= 2;
  void *q = cn__xrealloc(*p, (size_t)c, size);
  if (q == NULL) return -1;
  *p = q;
  *cap = c;
  return 0;
}

/* True when object v[obj] has no member but those named (each at most
 * once: jline refuses repeats). */
static bool only_keys(const cn_jline *j, int32_t obj, const char *const *keys,
                      int n_keys) {
  int32_t q = obj + 1;
  for (int32_t m = 0; m < j->v[obj].n; m++) {
    const cn_jval *k = &j->v[q];
    bool known = false;
    for (int i = 0; i < n_keys && !known; i++)
      known = (size_t)k->n == strlen(keys[i]) &&
              memcmp(k->s, keys[i], (size_t)k->n) == 0;
    if (!known) return false;
    q = j->v[q + 1].next;
  }
  return true;
}

#define ALLOC(rd, n, T) ((T *)cn__arena_alloc(&(rd)->arena, (size_t)(n) * sizeof(T)))

/* {"tree": "(...)"}: the bracketed parse into the scratch tree, its words
 * and labels pointing into the line; then instance.c's own word ids and
 * cell kinds, read from the scratch's nodes. What a run reads of the
 * tree - its children, child_start, ids and node types - goes into the
 * arena; the nodes, words and labels stay behind (tree.nodes and
 * tree.pool are NULL: nothing reads them after cn__tree_finish). */
static int read_tree(const cn_model *m, cn_line_reader *rd,
                     const cn_limits *lim, cn_instance *in) {
  static const char *const keys[] = {"tree"};
  const cn_jline *j = &rd->j;
  const cn_jval *t = cn__jline_get(j, 0, "tree", NULL);
  if (t == NULL || t->kind != CN_JV_STR || !only_keys(j, 0, keys, 1)) return 1;
  cn_err err;
  cn_err_clear(&err);
  cn_tree *dt = &in->tree;
  if (cn__tree_parse_bracketed_view(t->s, (size_t)t->n, lim, &rd->ts,
                                    &err) != 0)
    return 1;
  const cn_tree *st = &rd->ts.t;
  int32_t n = st->n_nodes;
  dt->n_nodes = n;
  dt->height = st->height;
  dt->children = ALLOC(rd, n > 1 ? n - 1 : 1, int32_t);
  in->ids = ALLOC(rd, n, int32_t);
  in->node_type = ALLOC(rd, n, uint8_t);
  in->child_start = ALLOC(rd, n + 1, int32_t);
  if (!dt->children || !in->ids || !in->node_type || !in->child_start)
    return CN_E_NOMEM;
  if (n > 1) memcpy(dt->children, st->children, (size_t)(n - 1) * sizeof(int32_t));
  dt->nodes = st->nodes; /* for cn__tree_finish only */
  int rc = cn__tree_finish(m, lim, false, in, &err) != 0 ? 1 : 0;
  dt->nodes = NULL;
  return rc;
}

/* An array of non-empty strings within the limits (the checks of
 * seq_parse.c's get_items), looked up in v into ids; 1: anything else. */
static int read_items(cn_line_reader *rd, const cn_jval *arr, int32_t at,
                      const cn_vocab *v, bool lower, const cn_limits *lim,
                      cn_instance *in) {
  const cn_jline *j = &rd->j;
  if (arr == NULL || arr->kind != CN_JV_ARR) return 1;
  int32_t n = arr->n;
  if (n == 0 || n > lim->max_seq_len) return 1;
  in->ids = ALLOC(rd, n, int32_t);
  if (in->ids == NULL) return CN_E_NOMEM;
  for (int32_t i = 0, q = at + 1; i < n; i++, q = j->v[q].next) {
    const cn_jval *s = &j->v[q];
    if (s->kind != CN_JV_STR || s->n == 0 || s->n > lim->max_token_len)
      return 1;
    in->ids[i] = cn_vocab_lookup(v, s->s, (size_t)s->n, lower);
  }
  in->n = n;
  return 0;
}

/* "text" split into rd->cs / rd->cl (seq_parse.c's split), checked
 * as get_items checks it, looked up in v into ids; 1: anything else. */
static int read_text(cn_line_reader *rd, const cn_jval *text, bool chars,
                     const cn_vocab *v, bool lower, const cn_limits *lim,
                     cn_instance *in) {
  if (text == NULL || text->kind != CN_JV_STR) return 1;
  int32_t n = cn__split_text(text->s, (size_t)text->n, chars,
                             lim->max_seq_len, &rd->cs, &rd->cl, &rd->text_cap);
  if (n == -2) return CN_E_NOMEM;
  if (n <= 0) return 1;
  in->ids = ALLOC(rd, n, int32_t);
  if (in->ids == NULL) return CN_E_NOMEM;
  for (int32_t i = 0; i < n; i++) {
    if (rd->cl[i] > lim->max_token_len) return 1;
    in->ids[i] = cn_vocab_lookup(v, rd->cs[i], (size_t)rd->cl[i], lower);
  }
  in->n = n;
  return 0;
}

static int read_sequence(const cn_model *m, cn_line_reader *rd,
                         const cn_limits *lim, cn_instance *in) {
  static const char *const keys[] = {"tokens"}, *const tkeys[] = {"text"};
  int32_t at;
  const cn_jval *arr = cn__jline_get(&rd->j, 0, "tokens", &at);
  if (arr == NULL) {
    if (!only_keys(&rd->j, 0, tkeys, 1)) return 1;
    return read_text(rd, cn__jline_get(&rd->j, 0, "text", NULL), false,
                     m->vocab, m->lowercase, lim, in);
  }
  if (!only_keys(&rd->j, 0, keys, 1)) return 1;
  return read_items(rd, arr, at, m->vocab, m->lowercase, lim, in);
}

static int cmp_key(const void *x, const void *y) {
  const int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
  return a < b ? -1 : a > b;
}

typedef struct lex_acc {
  cn_line_reader *rd;
  int32_t n, max;
} lex_acc;

static int lex_span(void *ctx, int32_t b, int32_t e) {
  lex_acc *a = ctx;
  if (a->n == a->max) return CN_E_TOO_LARGE;
  if (grow((void **)&a->rd->sb, &a->rd->sb_cap, a->n + 1, sizeof(int32_t)) ||
      grow((void **)&a->rd->se, &a->rd->se_cap, a->n + 1, sizeof(int32_t)))
    return CN_E_NOMEM;
  a->rd->sb[a->n] = b;
  a->rd->se[a->n] = e;
  a->n++;
  return 0;
}

/* The n characters rd->cs / rd->cl joined once into rd->jb, character c
 * at rd->co[c]: the word of span [b, e) with no "token" is then
 * jb[co[b] .. co[e]), read in place rather than joined span by span
 * (a character is in several spans). */
static int join_chars(cn_line_reader *rd, int32_t n) {
  if (grow((void **)&rd->co, &rd->co_cap, n + 1, sizeof(int32_t)))
    return CN_E_NOMEM;
  size_t total = 0;
  for (int32_t c = 0; c < n; c++) total += (size_t)rd->cl[c];
  if (total > INT32_MAX) return 1; /* no line is that long */
  if (total + 8 > rd->jb_cap) {
    size_t cap = rd->jb_cap ? rd->jb_cap : 4096;
    while (cap < total + 8) cap *= 2;
    char *p = realloc(rd->jb, cap);
    if (p == NULL) return CN_E_NOMEM;
    rd->jb = p, rd->jb_cap = cap;
  }
  int32_t at = 0;
  for (int32_t c = 0; c < n; c++) {
    rd->co[c] = at;
    const char *p = rd->cs[c];
    int32_t l = rd->cl[c];
    if (l <= 4) /* characters are mostly a byte or two: no call */
      for (int32_t i = 0; i < l; i++) rd->jb[at + i] = p[i];
    else
      memcpy(rd->jb + at, p, (size_t)l);
    at += l;
  }
  rd->co[n] = at;
  return 0;
}

/* Span k's word: its "token" (the string at tape index rd->tk[k]) or its
 * characters joined (join_chars), as seq_parse.c's span_words makes it;
 * *len -1 when that is longer than 1,024 bytes (an unknown word, id 0). */
static inline const char *span_word(const cn_line_reader *rd,
                                    const int32_t *sb, const int32_t *se,
                                    int32_t k, int32_t *len) {
  if (rd->tk[k] >= 0) {
    *len = rd->j.v[rd->tk[k]].n;
    return rd->j.v[rd->tk[k]].s;
  }
  int32_t b = rd->co[sb[k]], l = rd->co[se[k]] - b;
  *len = l > 1024 ? -1 : l;
  return rd->jb + b;
}

/* The span words' ids, looked up together (cn__vocab_lookup_many: a
 * lattice has hundreds of words in a vocabulary too large to stay in
 * cache, and one by one each look-up waited on its own miss). The
 * characters are joined first (join_chars), once for every span. */
static int span_words(const cn_model *m, cn_line_reader *rd, int32_t n,
                      const int32_t *sb, const int32_t *se, int32_t ns,
                      int32_t *out) {
  int rc = join_chars(rd, n);
  if (rc != 0) return rc;
  if (grow((void **)&rd->ws, &rd->ws_cap, ns, sizeof(char *)) ||
      grow((void **)&rd->wl, &rd->wl_cap, ns, sizeof(int32_t)))
    return CN_E_NOMEM;
  for (int32_t k = 0; k < ns; k++)
    rd->ws[k] = span_word(rd, sb, se, k, &rd->wl[k]);
  cn__vocab_lookup_many(m->word_vocab, rd->ws, rd->wl, ns, m->lowercase, out);
  return 0;
}

/* The members of a word object v[q] ({"start", "end", "token"?}) in one
 * pass over its keys (a lattice has hundreds of words; a lookup per key
 * read the keys three times); 1: not an object, or another key. */
static int word_members(const cn_jline *j, int32_t q, const cn_jval **js,
                        const cn_jval **je, const cn_jval **jt) {
  if (j->v[q].kind != CN_JV_OBJ) return 1;
  int32_t k = q + 1;
  for (int32_t m = 0; m < j->v[q].n; m++, k = j->v[k + 1].next) {
    const cn_jval *key = &j->v[k];
    if (key->n == 5 && memcmp(key->s, "start", 5) == 0) *js = &j->v[k + 1];
    else if (key->n == 3 && memcmp(key->s, "end", 3) == 0) *je = &j->v[k + 1];
    else if (key->n == 5 && memcmp(key->s, "token", 5) == 0) *jt = &j->v[k + 1];
    else return 1;
  }
  return 0;
}

/* {"chars": [...], "words": [{"start", "end", "token"?}, ...]} or chars
 * alone with the model's lexicon: seq_parse.c's cn__parse_lattice. */
static int read_lattice(const cn_model *m, cn_line_reader *rd,
                        const cn_limits *lim, cn_instance *in) {
  static const char *const keys[] = {"chars", "words"};
  static const char *const tkeys[] = {"text", "words"};
  const cn_jline *j = &rd->j;
  int32_t at, wat;
  const cn_jval *chars = cn__jline_get(j, 0, "chars", &at);
  const cn_jval *words = cn__jline_get(j, 0, "words", &wat);
  int rc;
  if (chars == NULL) { /* "text": split into rd->cs / rd->cl */
    if (!only_keys(j, 0, tkeys, 2)) return 1;
    rc = read_text(rd, cn__jline_get(j, 0, "text", NULL), true, m->vocab,
                   m->lowercase, lim, in);
    if (rc != 0) return rc;
  } else {
    if (!only_keys(j, 0, keys, 2)) return 1;
    rc = read_items(rd, chars, at, m->vocab, m->lowercase, lim, in);
    if (rc != 0) return rc;
    /* the characters' bytes, for the joined words and the lexicon; the
     * arrays are the ones cn__split_text grows */
    int32_t c1 = rd->text_cap, c2 = rd->text_cap; /* one cap for both */
    if (grow((void **)&rd->cs, &c1, in->n, sizeof(char *)) ||
        grow((void **)&rd->cl, &c2, in->n, sizeof(int32_t)))
      return CN_E_NOMEM;
    rd->text_cap = c1;
    for (int32_t i = 0, q = at + 1; i < in->n; i++, q = j->v[q].next)
      rd->cs[i] = j->v[q].s, rd->cl[i] = j->v[q].n;
  }
  int32_t n = in->n;
  int32_t ns = 0;
  if (words != NULL) {
    if (words->kind != CN_JV_ARR || words->n > lim->max_spans) return 1;
    ns = words->n;
    in->span_start = ALLOC(rd, ns ? ns : 1, int32_t);
    in->span_end = ALLOC(rd, ns ? ns : 1, int32_t);
    in->span_word = ALLOC(rd, ns ? ns : 1, int32_t);
    if (!in->span_start || !in->span_end || !in->span_word ||
        grow((void **)&rd->keys, &rd->keys_cap, ns, sizeof(int64_t)) ||
        grow((void **)&rd->tk, &rd->tk_cap, ns, sizeof(int32_t)))
      return CN_E_NOMEM;
    bool sorted = true; /* the keys ascending as sent: no sort needed */
    for (int32_t k = 0, q = wat + 1; k < ns; k++, q = j->v[q].next) {
      const cn_jval *js = NULL, *je = NULL, *jt = NULL;
      if (word_members(j, q, &js, &je, &jt) != 0) return 1;
      if (js == NULL || je == NULL || js->kind != CN_JV_INT ||
          je->kind != CN_JV_INT || (jt != NULL && jt->kind != CN_JV_STR))
        return 1;
      int64_t b = js->i, e = je->i;
      if (e > n || b >= e || e - b < 2) return 1;
      in->span_start[k] = (int32_t)b;
      in->span_end[k] = (int32_t)e;
      rd->keys[k] = b << 32 | e;
      if (k > 0 && rd->keys[k] <= rd->keys[k - 1]) sorted = false;
      /* span k's word: its "token", else its characters joined */
      rd->tk[k] = jt != NULL ? (int32_t)(jt - j->v) : -1;
    }
    rc = span_words(m, rd, n, in->span_start, in->span_end, ns, in->span_word);
    if (rc != 0) return rc;
    /* a repeated span is refused (jansson's path says which): strictly
     * ascending keys have none, else sorted they sit side by side */
    if (!sorted) {
      qsort(rd->keys, (size_t)ns, sizeof(int64_t), cmp_key);
      for (int32_t k = 1; k < ns; k++)
        if (rd->keys[k] == rd->keys[k - 1]) return 1;
    }
  } else if (m->lexicon != NULL) {
    lex_acc acc = {rd, 0, lim->max_spans};
    rc = cn_lexicon_match(m->lexicon, rd->cs, rd->cl, n, m->lowercase,
                          lex_span, &acc);
    if (rc != 0) return rc == CN_E_NOMEM ? rc : 1;
    ns = acc.n;
    in->span_start = ALLOC(rd, ns ? ns : 1, int32_t);
    in->span_end = ALLOC(rd, ns ? ns : 1, int32_t);
    in->span_word = ALLOC(rd, ns ? ns : 1, int32_t);
    if (!in->span_start || !in->span_end || !in->span_word ||
        grow((void **)&rd->tk, &rd->tk_cap, ns, sizeof(int32_t)))
      return CN_E_NOMEM;
    for (int32_t k = 0; k < ns; k++) {
      in->span_start[k] = rd->sb[k];
      in->span_end[k] = rd->se[k];
      rd->tk[k] = -1;
    }
    rc = span_words(m, rd, n, in->span_start, in->span_end, ns, in->span_word);
    if (rc != 0) return rc;
  } else {
    in->span_word = ALLOC(rd, 1, int32_t);
    if (in->span_word == NULL) return CN_E_NOMEM;
  }
  in->n_spans = ns;
  return 0;
}

/* {"nodes": [{"token", "prev"?}, ...]}: seq_parse.c's cn__parse_dag. */
static int read_dag(const cn_model *m, cn_line_reader *rd,
                    const cn_limits *lim, cn_instance *in) {
  static const char *const keys[] = {"nodes"};
  static const char *const nkeys[] = {"token", "prev"};
  const cn_jline *j = &rd->j;
  int32_t at;
  const cn_jval *nodes = cn__jline_get(j, 0, "nodes", &at);
  if (nodes == NULL || nodes->kind != CN_JV_ARR || !only_keys(j, 0, keys, 1))
    return 1;
  int32_t n = nodes->n;
  if (n == 0 || n > lim->max_seq_len) return 1;
  int64_t edges = 0;
  for (int32_t q = at + 1, i = 0; i < n; i++, q = j->v[q].next) {
    if (j->v[q].kind != CN_JV_OBJ || !only_keys(j, q, nkeys, 2)) return 1;
    const cn_jval *tok = cn__jline_get(j, q, "token", NULL);
    const cn_jval *prev = cn__jline_get(j, q, "prev", NULL);
    if (tok == NULL || tok->kind != CN_JV_STR || tok->n > lim->max_token_len ||
        (prev != NULL && prev->kind != CN_JV_ARR))
      return 1;
    edges += prev != NULL ? prev->n : 0;
  }
  if (edges > lim->max_spans) return 1;
  in->n = n;
  in->ids = ALLOC(rd, n, int32_t);
  in->prev_start = ALLOC(rd, n + 1, int32_t);
  in->prev = ALLOC(rd, edges ? edges : 1, int32_t);
  uint8_t *has_succ = cn__arena_calloc(&rd->arena, (size_t)n, 1);
  if (!in->ids || !in->prev_start || !in->prev || !has_succ) return CN_E_NOMEM;
  int32_t e = 0;
  for (int32_t q = at + 1, i = 0; i < n; i++, q = j->v[q].next) {
    int32_t pat;
    const cn_jval *tok = cn__jline_get(j, q, "token", NULL);
    const cn_jval *prev = cn__jline_get(j, q, "prev", &pat);
    in->ids[i] = cn_vocab_lookup(m->vocab, tok->s, (size_t)tok->n, m->lowercase);
    in->prev_start[i] = e;
    for (int32_t k = 0, p = pat + 1; prev != NULL && k < prev->n;
         k++, p = j->v[p].next) {
      const cn_jval *u = &j->v[p];
      if (u->kind != CN_JV_INT || u->i >= i) return 1;
      for (int32_t r = in->prev_start[i]; r < e; r++)
        if (in->prev[r] == (int32_t)u->i) return 1;
      in->prev[e++] = (int32_t)u->i;
      has_succ[u->i] = 1;
    }
  }
  in->prev_start[n] = e;
  for (int32_t i = 0; i + 1 < n; i++)
    if (!has_succ[i]) return 1;
  return 0;
}

/* Why: a JSON DOM per line (a heap node per value, a hash table per
 * object) cost more than the rest of parsing; this reads the common
 * shapes straight into the instance (the file comment). */
int cn_instance_parse_line(const cn_model *m, cn_line_reader *rd,
                           const char *line, size_t len, const cn_limits *lim,
                           cn_instance **out) {
  cn_limits dflt;
  *out = NULL;
  if (lim == NULL) {
    cn_limits_default(&dflt);
    lim = &dflt;
  }
  int rc = cn__jline_read(&rd->j, line, len);
  if (rc != 0) return rc;
  cn_instance *in = cn__arena_calloc(&rd->arena, 1, sizeof(*in));
  if (in == NULL) return CN_E_NOMEM;
  in->m = m;
  in->kind = m->fam->input;
  in->in_arena = true;
  switch (in->kind) {
    case CN_INPUT_TREE: rc = read_tree(m, rd, lim, in); break;
    case CN_INPUT_SEQUENCE: rc = read_sequence(m, rd, lim, in); break;
    case CN_INPUT_LATTICE: rc = read_lattice(m, rd, lim, in); break;
    case CN_INPUT_DAG: rc = read_dag(m, rd, lim, in); break;
    default: rc = 1;
  }
  if (rc == 0) *out = in;
  return rc;
}
