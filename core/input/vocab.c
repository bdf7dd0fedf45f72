/* vocab.c - token vocabularies: one token a line, line k is id k.
 *
 * Look-up is on the request path (every word of every instance), so it is an
 * open-addressing hash table over ids that hashes and compares the caller's
 * bytes in place, folding ASCII case on the fly when the model asks for it:
 * no allocation, no copy. Tokens live in one pool, NUL-terminated. */
#include <fcntl.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "input/input.h"

/* A vocabulary file is read whole; a bigger one is a mistake (a wrong
 * path, a data file) rather than a vocabulary. */
#define MAX_VOCAB_BYTES (1ull << 30)

/* A table entry: the token's hash beside its id, offset and length, so
 * that a probe reads one entry (a quarter of a cache line) and then, on a
 * hash and length match, the token's bytes - nothing else. A pool is at
 * most MAX_VOCAB_BYTES (cn_vocab_from_list checks its own), so 32 bits
 * hold both. */
typedef struct vocab_slot {
  uint32_t hash;
  int32_t id;       /* -1: empty */
  uint32_t off;     /* the token's offset in pool */
  uint32_t len;     /* and its length */
} vocab_slot;

struct cn_vocab {
  int n;            /* tokens; id k is the k-th */
  char *pool;       /* all tokens, each NUL-terminated */
  size_t *off;      /* n offsets into pool */
  vocab_slot *slots; /* cap entries */
  /* the id of each one-byte string, as is and ASCII-lowercased: a
   * character of a lattice or of "text" is looked up by its byte */
  int32_t byte_id[2][256];
  uint32_t mask;    /* cap - 1, cap a power of two ≥ 1.5 n */
};

static inline unsigned char fold(unsigned char c, bool lower) {
  return lower && c >= 'A' && c <= 'Z' ? (unsigned char)(c + 32) : c;
}

/* fold() of the 8 bytes of w at once: each byte in 'A'..'Z' gains 0x20.
 * A byte below 0x80 plus 0x3f reaches the high bit when it is >= 'A',
 * plus 0x25 when it is > 'Z' (no carry leaves a byte); bytes >= 0x80
 * stay as they are. */
static inline uint64_t fold8(uint64_t w) {
  const uint64_t ones = 0x0101010101010101ull, high = 0x8080808080808080ull;
  uint64_t h = w & ~high;
  uint64_t m = ((h + ones * 0x3f) ^ (h + ones * 0x25)) & ~w & high;
  return w | m >> 2;
}

static inline uint64_t load8(const char *s) {
  uint64_t w;
  memcpy(&w, s, 8);
  return w;
}

static inline uint64_t load4(const char *s) {
  uint32_t w;
  memcpy(&w, s, 4);
  return w;
}

/* The hash of the (optionally folded) bytes, 8 at a time. What it reads
 * of a short string (two overlapping 4-byte words; 3 bytes that cover 1
 * to 3) is a function of its bytes and its length, which the hash
 * starts from; a multiply and a shift mix each word in. */
static inline uint32_t hash(const char *s, size_t len, bool lower) {
  const uint64_t k = 0x9e3779b97f4a7c15ull;
  uint64_t h = (uint64_t)len * k, w;
  size_t i = 0;
  for (; i + 8 <= len; i += 8) {
    w = load8(s + i);
    if (lower) w = fold8(w);
    h = (h ^ w) * k;
    h ^= h >> 32;
  }
  size_t r = len - i;
  if (r == 0 && len > 0) goto done;
  if (r >= 4)
    w = load4(s + i) | load4(s + len - 4) << 32;
  else if (r > 0)
    w = (uint64_t)(unsigned char)s[i] |
        (uint64_t)(unsigned char)s[i + r / 2] << 8 |
        (uint64_t)(unsigned char)s[len - 1] << 16;
  else
    w = 0;
  if (lower) w = fold8(w);
  h = (h ^ w) * k;
done:
  h ^= h >> 29;
  return (uint32_t)((h * 0xbf58476d1ce4e5b9ull) >> 32);
}

/* Whether the token at t, of the same length len, is s[0 .. len),
 * folded when lower: 8 bytes a step, a tail of 4 to 7 as two overlapping
 * 4-byte words, shorter ones byte by byte. It reads len bytes of each. */
static inline bool same(const char *t, const char *s, size_t len,
                        bool lower) {
  size_t i = 0;
  for (; i + 8 <= len; i += 8) {
    uint64_t w = load8(s + i);
    if (lower) w = fold8(w);
    if (w != load8(t + i)) return false;
  }
  if (len - i >= 4) {
    uint64_t w = load4(s + i) | load4(s + len - 4) << 32;
    if (lower) w = fold8(w);
    return w == (load4(t + i) | load4(t + len - 4) << 32);
  }
  for (; i < len; i++)
    if ((unsigned char)t[i] != fold((unsigned char)s[i], lower)) return false;
  return true;
}

/* Finds the slot holding s (whose hash is h), or the empty slot where it
 * would go. */
static inline const vocab_slot *probe_h(const cn_vocab *v, uint32_t h,
                                        const char *s, size_t len,
                                        bool lower) {
  uint32_t i = h & v->mask;
  for (;; i = (i + 1) & v->mask) {
    const vocab_slot *e = &v->slots[i];
    if (e->id < 0 || (e->hash == h && e->len == len &&
                      same(v->pool + e->off, s, len, lower)))
      return e;
  }
}

static const vocab_slot *probe(const cn_vocab *v, const char *s, size_t len,
                               bool lower) {
  return probe_h(v, hash(s, len, lower), s, len, lower);
}

/* Builds the table from tokens already in v->pool / off. A repeated
 * token keeps its first id; later ids still exist (cn_vocab_token answers
 * for them) but are never returned by look-up. */
static int index_tokens(cn_vocab *v) {
  uint32_t cap = 16;
  /* at most 2/3 full: the table of a large vocabulary stays small enough
   * to stay in cache, and each entry holds its hash, so a probe past
   * other entries reads no token */
  while (cap < (uint32_t)v->n + (uint32_t)v->n / 2) cap *= 2;
  v->slots = cn__xcalloc(cap, sizeof(*v->slots));
  if (v->slots == NULL) return CN_E_NOMEM;
  for (uint32_t i = 0; i < cap; i++) v->slots[i].id = -1;
  v->mask = cap - 1;
  for (int id = 0; id < v->n; id++) {
    const char *t = v->pool + v->off[id];
    size_t len = strlen(t);
    vocab_slot *e = (vocab_slot *)probe(v, t, len, false);
    if (e->id < 0)
      *e = (vocab_slot){hash(t, len, false), id, (uint32_t)v->off[id],
                        (uint32_t)len};
  }
  for (int c = 0; c < 256; c++)
    for (int lower = 0; lower < 2; lower++) {
      char b = (char)c;
      int32_t id = probe(v, &b, 1, lower)->id;
      v->byte_id[lower][c] = id < 0 ? 0 : id;
    }
  return 0;
}

void cn_vocab_free(cn_vocab *v) {
  if (v == NULL) return;
  free(v->pool);
  free(v->off);
  free(v->slots);
  free(v);
}

/* Takes ownership of pool (n NUL-terminated tokens back to back). */
static int vocab_from_pool(char *pool, size_t pool_len, int n,
                           cn_vocab **out) {
  int rc = CN_E_NOMEM;
  cn_vocab *v = calloc(1, sizeof(*v));
  if (v == NULL) {
    free(pool);
    goto out;
  }
  v->pool = pool;
  v->n = n;
  v->off = cn__xcalloc((size_t)n, sizeof(*v->off));
  if (v->off == NULL) goto out;
  size_t p = 0;
  for (int id = 0; id < n && p < pool_len; id++) {
    v->off[id] = p;
    p += strlen(pool + p) + 1;
  }
  rc = index_tokens(v);
out:
  if (rc != 0) {
    cn_vocab_free(v);
    v = NULL;
  }
  *out = v;
  return rc;
}

int cn_vocab_from_list(const char *const *tokens, int n, cn_vocab **out) {
  *out = NULL;
  if (n < 0 || (n > 0 && tokens == NULL)) return CN_E_INTERNAL;
  size_t total = 1;
  for (int i = 0; i < n; i++) {
    if (tokens[i] == NULL) return CN_E_INTERNAL;
    total += strlen(tokens[i]) + 1;
  }
  if (total > MAX_VOCAB_BYTES) return CN_E_TOO_LARGE; /* a slot's 32 bits */
  char *pool = malloc(total);
  if (pool == NULL) return CN_E_NOMEM;
  size_t p = 0;
  for (int i = 0; i < n; i++) {
    size_t l = strlen(tokens[i]);
    memcpy(pool + p, tokens[i], l + 1);
    p += l + 1;
  }
  return vocab_from_pool(pool, p, n, out);
}

/* Reads a vocabulary file. The format is strict because a silent shift of
 * one line would shift every id after it: an empty line (other than the
 * final newline) or a NUL byte is an error naming the line. */
int cn_vocab_load(const char *path, cn_vocab **out, cn_err *err) {
  return cn_vocab_load_at(AT_FDCWD, path, path, out, err);
}

int cn_vocab_load_at(int dirfd, const char *rel, const char *path,
                     cn_vocab **out, cn_err *err) {
  int rc = 0;
  char *buf = NULL;
  size_t len = 0;
  *out = NULL;
  /* one spare byte for a last '\n' */
  if ((rc = cn__read_regular_at(dirfd, rel, path, MAX_VOCAB_BYTES, 1, &buf,
                                &len, err)) != 0)
    goto out;
  if (len == 0) {
    rc = cn_err_set(err, CN_E_BAD_MODEL,
                    "%s: the vocabulary is empty (line 1 must be <unk>)",
                    path);
    goto out;
  }
  /* Turn the buffer into the pool in place: each '\n' (and a '\r' before
   * it) becomes the NUL ending that line's token. */
  if (buf[len - 1] != '\n') buf[len++] = '\n'; /* the spare byte */
  size_t w = 0, start = 0;
  int n = 0;
  for (size_t i = 0; i < len; i++) {
    if (buf[i] == '\0') {
      rc = cn_err_set(err, CN_E_BAD_MODEL,
                      "%s: line %d contains a NUL byte", path, n + 1);
      goto out;
    }
    if (buf[i] != '\n') continue;
    size_t end = i;
    if (end > start && buf[end - 1] == '\r') end--;
    if (end == start) {
      rc = cn_err_set(err, CN_E_BAD_MODEL,
                      "%s: line %d is empty (every line is one token; "
                      "line k is id k)", path, n + 1);
      goto out;
    }
    if (n == INT32_MAX / 4) {
      rc = cn_err_set(err, CN_E_BAD_MODEL, "%s: too many lines", path);
      goto out;
    }
    memmove(buf + w, buf + start, end - start);
    w += end - start;
    buf[w++] = '\0';
    n++;
    start = i + 1;
  }
  rc = vocab_from_pool(buf, w, n, out);
  buf = NULL;
  if (rc != 0) cn_err_set(err, rc, "%s: out of memory", path);
out:
  free(buf);
  return rc;
}

int cn_vocab_size(const cn_vocab *v) { return v ? v->n : 0; }

int cn_vocab_lookup(const cn_vocab *v, const char *s, size_t len,
                    bool lowercase) {
  if (v == NULL || v->n == 0) return 0;
  if (len == 1) return v->byte_id[lowercase][(unsigned char)s[0]];
  int32_t id = probe(v, s, len, lowercase)->id;
  return id < 0 ? 0 : id;
}

uint32_t cn__vocab_hash(const char *s, size_t len, bool lowercase) {
  return hash(s, len, lowercase);
}

void cn__vocab_prefetch(const cn_vocab *v, uint32_t h) {
  if (v != NULL && v->n > 0) __builtin_prefetch(&v->slots[h & v->mask]);
}

int cn__vocab_lookup_hashed(const cn_vocab *v, uint32_t h, const char *s,
                            size_t len, bool lowercase) {
  if (v == NULL || v->n == 0) return 0;
  int32_t id = probe_h(v, h, s, len, lowercase)->id;
  return id < 0 ? 0 : id;
}

void cn__vocab_lookup_many(const cn_vocab *v, const char *const *words,
                           const int32_t *lens, int32_t n, bool lowercase,
                           int32_t *ids) {
  if (v == NULL || v->n == 0) {
    for (int32_t k = 0; k < n; k++) ids[k] = 0;
    return;
  }
  uint32_t hs[64];
  for (int32_t k0 = 0; k0 < n; k0 += 64) {
    int32_t k1 = n - k0 > 64 ? k0 + 64 : n;
    for (int32_t k = k0; k < k1; k++) {
      if (lens[k] < 0) continue;
      hs[k - k0] = hash(words[k], (size_t)lens[k], lowercase);
      __builtin_prefetch(&v->slots[hs[k - k0] & v->mask]);
    }
    for (int32_t k = k0; k < k1; k++) {
      if (lens[k] < 0) {
        ids[k] = 0;
        continue;
      }
      int32_t id = probe_h(v, hs[k - k0], words[k], (size_t)lens[k],
                           lowercase)->id;
      ids[k] = id < 0 ? 0 : id;
    }
  }
}

const char *cn_vocab_token(const cn_vocab *v, int id) {
  if (v == NULL || id < 0 || id >= v->n) return NULL;
  return v->pool + v->off[id];
}

typedef struct {
  const char *const *tokens;
  int n;
} vocab_fill;

/* One token a line; a write error shows in ferror (cn__file_write_atomic
 * checks it). */
static int fill_tokens(FILE *f, void *ctx) {
  const vocab_fill *v = ctx;
  for (int i = 0; i < v->n; i++)
    if (fputs(v->tokens[i], f) == EOF || fputc('\n', f) == EOF) break;
  return 0;
}

/* Writes path.tmp and renames it over path, so a reader never sees half a
 * vocabulary. A token that cannot round-trip through the line format
 * (empty, or holding a newline) is refused, naming its id. */
int cn_vocab_write(const char *path, const char *const *tokens, int n,
                   cn_err *err) {
  int rc = 0;
  char *tmp = NULL;
  for (int i = 0; i < n; i++) {
    const char *t = tokens[i];
    if (t == NULL || t[0] == '\0' || strpbrk(t, "\r\n") != NULL) {
      rc = cn_err_set(err, CN_E_INTERNAL,
                      "%s: token %d is empty or holds a line break", path, i);
      goto out;
    }
  }
  size_t pl = strlen(path);
  tmp = malloc(pl + 5);
  if (tmp == NULL) {
    rc = cn_err_set(err, CN_E_NOMEM, "%s: out of memory", path);
    goto out;
  }
  memcpy(tmp, path, pl);
  memcpy(tmp + pl, ".tmp", 5);
  vocab_fill fill = {tokens, n};
  rc = cn__file_write_atomic_err(path, tmp, false, fill_tokens, &fill, err);
out:
  free(tmp);
  return rc;
}

typedef struct ranked {
  const char *s;
  size_t count;
} ranked;

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static int cmp_rank(const void *a, const void *b) {
  const ranked *x = a, *y = b;
  if (x->count != y->count) return x->count > y->count ? -1 : 1;
  return strcmp(x->s, y->s);
}

/* Sorting the bag groups repeats, so counting needs no hash table; sorting
 * the groups by (count desc, bytes) makes ids reproducible across runs. */
int cn__vocab_rank(char **tokens, size_t n, const char *const *specials,
                   int n_specials, int max, const char ***out, int *n_out) {
  int rc = CN_E_NOMEM;
  ranked *r = cn__xcalloc(n, sizeof(*r));
  size_t nr = 0;
  *out = NULL;
  *n_out = 0;
  if (r == NULL) goto out;
  if (n > 0) qsort(tokens, n, sizeof(*tokens), cmp_str); /* NULL if 0 */
  for (size_t i = 0; i < n;) {
    size_t j = i + 1;
    while (j < n && strcmp(tokens[j], tokens[i]) == 0) j++;
    bool skip = tokens[i][0] == '\0' || strpbrk(tokens[i], "\r\n") != NULL;
    for (int k = 0; k < n_specials && !skip; k++)
      skip = strcmp(tokens[i], specials[k]) == 0;
    if (!skip) r[nr++] = (ranked){tokens[i], j - i};
    i = j;
  }
  qsort(r, nr, sizeof(*r), cmp_rank);
  int keep = max > n_specials ? max - n_specials : 0;
  if ((size_t)keep > nr) keep = (int)nr;
  *out = cn__xcalloc((size_t)(n_specials + keep), sizeof(**out));
  if (*out == NULL) goto out;
  for (int k = 0; k < n_specials; k++) (*out)[k] = specials[k];
  for (int k = 0; k < keep; k++) (*out)[n_specials + k] = r[k].s;
  *n_out = n_specials + keep;
  rc = 0;
out:
  free(r);
  return rc;
}
