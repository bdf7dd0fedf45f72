/* input.h - the file and text formats core/ reads and writes (input/),
 * none of which knows what a model is: bracketed and JSON trees,
 * vocabularies, lexicons, safetensors. Depends on base/ only. */
#ifndef CANOPY_INPUT_H
#define CANOPY_INPUT_H

#include <jansson.h>

#include "base/base.h"

/* ---- parsed trees (tree_parse.c) ---------------------------------------
 * Nodes are numbered in pre-order (the order their opening bracket
 * appears). Node i's children are children[first_child .. +n_children], in
 * order. Strings (word, label) point into the tree's own pool and are NOT
 * NUL-terminated; use the lengths. A leaf has a word and no children; an
 * internal node has children and no word. The tree owns all its memory. */
typedef struct cn_tree_node {
  int32_t parent;      /* -1 for the root */
  int32_t first_child; /* index into cn_tree.children */
  int32_t n_children;
  int32_t depth;       /* root = 1 */
  const char *word;    /* leaves only, else NULL */
  int32_t word_len;
  const char *label;   /* may be NULL (no label) */
  int32_t label_len;
  int8_t type;         /* JSON "type": 'a', 'b', or 0 when absent */
  int64_t offset;      /* byte offset of the node in a bracketed string, or -1 */
} cn_tree_node;

typedef struct cn_tree {
  int32_t n_nodes;
  cn_tree_node *nodes;
  int32_t *children;   /* n_nodes - 1 entries */
  char *pool;          /* backing store for words and labels */
  int32_t height;      /* max node depth */
} cn_tree;

/* Parse a bracketed (Penn / SST) tree string of len bytes (docs/api.md "Details
 * that are part of the contract"). Iterative: no recursion, so deep input
 * cannot overflow the stack. Limits: max_nodes, max_depth, max_token_len.
 * On error returns CN_E_BAD_TREE (or CN_E_TOO_LARGE for a limit) with
 * err->offset = byte offset of the problem and err->node when known. */
int cn_tree_parse_bracketed(const char *s, size_t len, const cn_limits *lim,
                            cn_tree *out, cn_err *err);
/* Parse a JSON NODE tree ({"word"} or {"label", "type", "children"}).
 * Iterative. Errors name the node by pre-order index (err->node). */
int cn_tree_parse_json(const json_t *root, const cn_limits *lim, cn_tree *out,
                       cn_err *err);
void cn_tree_free(cn_tree *t);
/* A tree parsed again and again into the same arrays (t's nodes, children
 * and pool, the parser's stack), grown to the largest and kept: what a
 * reader of many lines copies each tree out of. Zero-initialise. */
typedef struct cn_tree_scratch {
  cn_tree t;
  int32_t node_cap, child_cap, stack_cap;
  size_t pool_cap;
  void *stack;
} cn_tree_scratch;
/* cn_tree_parse_bracketed into sc->t, with the same results and errors. */
int cn__tree_parse_bracketed_scratch(const char *s, size_t len,
                                     const cn_limits *lim, cn_tree_scratch *sc,
                                     cn_err *err);
/* The same with words and labels pointing into s itself, no copy: for a
 * caller done with them before s goes. */
int cn__tree_parse_bracketed_view(const char *s, size_t len,
                                  const cn_limits *lim, cn_tree_scratch *sc,
                                  cn_err *err);
void cn__tree_scratch_free(cn_tree_scratch *sc);

/* ---- vocabularies (vocab.c) --------------------------------------------
 * One token a line; line k is id k; id 0 is <unk>. Open-addressing hash. */
typedef struct cn_vocab cn_vocab;
int cn_vocab_load(const char *path, cn_vocab **out, cn_err *err);
/* The same for rel below the open directory dirfd, never outside it
 * (cn__open_regular_at); path names it in messages. */
int cn_vocab_load_at(int dirfd, const char *rel, const char *path,
                     cn_vocab **out, cn_err *err);
/* Builds a vocabulary from an array of tokens (copied). */
int cn_vocab_from_list(const char *const *tokens, int n, cn_vocab **out);
void cn_vocab_free(cn_vocab *v);
int cn_vocab_size(const cn_vocab *v);
/* Id of token s[0..len), 0 (<unk>) if absent. lowercase: ASCII A-Z folded
 * before look-up (the stored tokens are used as they are). */
int cn_vocab_lookup(const cn_vocab *v, const char *s, size_t len,
                    bool lowercase);
/* The same in two steps, for a reader with many words at hand: the hash
 * of each (cn__vocab_hash) and its table entry asked for
 * (cn__vocab_prefetch) first, so that the look-ups that follow
 * (cn__vocab_lookup_hashed, with that hash) find their entries in cache
 * rather than miss one after another. */
uint32_t cn__vocab_hash(const char *s, size_t len, bool lowercase);
void cn__vocab_prefetch(const cn_vocab *v, uint32_t h);
int cn__vocab_lookup_hashed(const cn_vocab *v, uint32_t h, const char *s,
                            size_t len, bool lowercase);
/* The ids of n words at once, words[k] of lens[k] bytes (a negative
 * length: an unknown word, id 0), into ids: the two steps above inside
 * vocab.c, 64 words at a time, with no call per word. */
void cn__vocab_lookup_many(const cn_vocab *v, const char *const *words,
                           const int32_t *lens, int32_t n, bool lowercase,
                           int32_t *ids);
const char *cn_vocab_token(const cn_vocab *v, int id); /* NULL if out of range */
/* Writes one token a line. */
int cn_vocab_write(const char *path, const char *const *tokens, int n,
                   cn_err *err);
/* Ranks a bag of tokens (repeats counted; the array is sorted in place) by
 * descending count, then bytewise. *out (malloc'd, *n_out entries) lists
 * the specials first, then at most max - n_specials distinct tokens; it
 * points into specials and tokens, copying nothing. Specials, empty tokens
 * and tokens holding a line break are left out of the ranking. */
int cn__vocab_rank(char **tokens, size_t n, const char *const *specials,
                   int n_specials, int max, const char ***out, int *n_out);

/* ---- lexicon (lexicon.c) --------------------------------------------------
 * A byte trie of the lexicon's words, built once per model at load. */
typedef struct cn_lexicon cn_lexicon;
/* The lexicon is read whole into a trie; a bigger file is a mistake. */
#define CN__MAX_LEXICON_BYTES (1ull << 30)
int cn_lexicon_load(const char *path, cn_lexicon **out, cn_err *err);
int cn_lexicon_load_at(int dirfd, const char *rel, const char *path,
                       cn_lexicon **out, cn_err *err);
int cn_lexicon_from_list(const char *const *words, int n, cn_lexicon **out);
void cn_lexicon_free(cn_lexicon *lx);
/* Every span [b, e), e - b >= 2, whose joined characters (chars[i] of
 * len[i] bytes; ASCII-lowercased when lowercase) are a lexicon word, in
 * (start, end) order. Calls emit(ctx, b, e) per span; stops early and
 * returns its non-zero result. Work is O(n · longest word). */
int cn_lexicon_match(const cn_lexicon *lx, const char *const *chars,
                     const int32_t *len, int32_t n, bool lowercase,
                     int (*emit)(void *ctx, int32_t b, int32_t e), void *ctx);

/* ---- safetensors (safetensors.c) ---------------------------------------
 * A .safetensors file read whole into memory of its own (never a mapping of
 * the file: what happens to the file afterwards cannot change or break a
 * loaded model); every tensor's header entry is checked (dtype, shape
 * product × dtype size == byte span, offsets inside the data section, no
 * overlap) before any is used. Its SHA-256 is computed on the first
 * cn_safetensors_sha256: `canopy run` never asks for it, and hashing costs
 * ~2 ms a MB on a core. */
typedef struct cn_tensor {
  char name[96];
  int ndim;
  int64_t shape[4];
  int64_t numel;
  const float *data; /* into the file's bytes; F32 only */
} cn_tensor;

typedef struct cn_safetensors {
  void *bytes;       /* the whole file, 64-byte aligned, owned */
  size_t n_bytes;
  char sha256[65];   /* of the file, lowercase hex (cn_safetensors_sha256) */
  _Atomic int sha256_state; /* 0 not computed, 1 being computed, 2 done */
  int n;
  cn_tensor *tensors;
} cn_safetensors;

int cn_safetensors_open(const char *path, cn_safetensors *st, cn_err *err);
int cn_safetensors_open_at(int dirfd, const char *rel, const char *path,
                           cn_safetensors *st, cn_err *err);
/* The file's SHA-256 in lowercase hex, computed on the first call; any
 * thread may call it, and the others wait for the first. */
const char *cn_safetensors_sha256(cn_safetensors *st);
const cn_tensor *cn_safetensors_find(const cn_safetensors *st,
                                     const char *name);
void cn_safetensors_close(cn_safetensors *st);

/* Tensor to write: name, shape, data (numel floats). */
typedef struct cn_tensor_out {
  const char *name;
  int ndim;
  int64_t shape[4];
  const float *data;
} cn_tensor_out;
int cn_safetensors_write(const char *path, const cn_tensor_out *t, int n,
                         cn_err *err);


/* ---- one JSON line, read in one pass (jline.c) ---------------------------
 * A subset of JSON (objects, arrays, strings, non-negative integers) read
 * into a flat array of values; anything outside it is declined, for the
 * caller to read with jansson. Values are in document order; an object's
 * members are key, value pairs; next is the index after a value's whole
 * subtree. Strings are not NUL-terminated. Reused line after line. */
#define CN_JLINE_MAX_DEPTH 32
typedef enum { CN_JV_OBJ = 1, CN_JV_ARR, CN_JV_STR, CN_JV_INT } cn_jv_kind;
typedef struct cn_jval {
  int32_t kind;    /* cn_jv_kind */
  int32_t n;       /* object: members; array: items; string: bytes */
  int32_t next;    /* the index after this value and everything in it */
  const char *s;   /* string: its bytes (in the line, or decoded) */
  int64_t i;       /* integer */
} cn_jval;
typedef struct cn_jline {
  cn_jval *v;
  int32_t n, cap;
  char *buf;       /* decoded strings */
  size_t buf_used, buf_cap;
} cn_jline;
/* Reads s[0 .. len) (one JSON object) onto the tape; the root is v[0].
 * Returns 0, 1 when the line is outside the subset (nothing to trust in
 * j then), or CN_E_NOMEM. Strings may point into s: keep s alive. */
int cn__jline_read(cn_jline *j, const char *s, size_t len);
/* The value of member key of object v[obj] (NULL: none); *at (may be
 * NULL) gets its index. */
const cn_jval *cn__jline_get(const cn_jline *j, int32_t obj, const char *key,
                             int32_t *at);
void cn__jline_free(cn_jline *j);

#endif /* CANOPY_INPUT_H */
