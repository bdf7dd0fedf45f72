/* jline.c - one line of JSON read in a single pass into a flat array of
 * values (a "tape"), for the instance lines `canopy run` reads by the
 * thousand (model/instance_line.c).
 *
 * It reads a subset of JSON and says so rather than guess: objects,
 * arrays, strings and non-negative integers of at most 18 digits without
 * a leading zero. Anything else - true, false, null, a fraction, an
 * exponent, a sign, a \u escape, a control byte, invalid UTF-8, a
 * duplicate key, nesting deeper than CN_JLINE_MAX_DEPTH - makes it
 * decline (1), and the caller reads the line with jansson instead, which
 * also writes every error message. So whatever it accepts, jansson
 * (json_loadb with JSON_REJECT_DUPLICATES) accepts too and reads as the
 * same values (tests/test_instance_line.c and the fuzz target
 * fuzz_jline check it against jansson).
 *
 * Strings without escapes point into the line; those with escapes are
 * decoded into the reader's own buffer. The tape and that buffer grow to
 * the largest line and are reused: no allocation per line once warm.
 */
#include <stdlib.h>
#include <string.h>

#include "input/input.h"

/* Bytes that end a run of plain string bytes: '"', '\\', controls and
 * non-ASCII (checked one by one as UTF-8). */
static inline bool str_plain(unsigned char c) {
  return c >= 0x20 && c < 0x80 && c != '"' && c != '\\';
}

/* The bytes of w (first byte lowest) that are not plain: '"', '\\', a
 * control byte (< 0x20) or non-ASCII (>= 0x80), each marked by its high
 * bit: the byte-wise zero test on w ^ '"', w ^ '\\', and w less 0x20,
 * or a high bit. No byte is missed; a borrow may mark a byte above a
 * marked one, never below, so the lowest mark is exact (and the mask is
 * 0 exactly when all 8 are plain). */
static inline uint64_t word_special(uint64_t w) {
  const uint64_t ones = 0x0101010101010101ull, high = 0x8080808080808080ull;
  uint64_t q = w ^ (ones * '"'), b = w ^ (ones * '\\');
  uint64_t t = ((q - ones) & ~q) | ((b - ones) & ~b) | ((w - ones * 0x20) & ~w);
  return (t | w) & high;
}

static inline bool ws(unsigned char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Length of the valid UTF-8 sequence at s[0 .. n), or 0 when it is not
 * one: the rules jansson's utf8_check_full applies (no overlong forms, no
 * surrogates, nothing above U+10FFFF). */
static int utf8_seq(const unsigned char *s, size_t n) {
  unsigned c = s[0];
  int len;
  uint32_t cp;
  if (c < 0xc2) return 0; /* continuation or overlong lead */
  if (c < 0xe0) len = 2, cp = c & 0x1f;
  else if (c < 0xf0) len = 3, cp = c & 0x0f;
  else if (c < 0xf5) len = 4, cp = c & 0x07;
  else return 0;
  if ((size_t)len > n) return 0;
  for (int i = 1; i < len; i++) {
    if ((s[i] & 0xc0) != 0x80) return 0;
    cp = cp << 6 | (s[i] & 0x3f);
  }
  if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
      (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff)
    return 0;
  return len;
}

/* Room for one more value on the tape; -1: no memory. */
static int32_t tape_push(cn_jline *j) {
  if (j->n == j->cap) {
    int32_t c = j->cap ? j->cap * 2 : 256;
    cn_jval *t = cn__xrealloc(j->v, (size_t)c, sizeof(*t));
    if (t == NULL) return -1;
    j->v = t;
    j->cap = c;
  }
  return j->n++;
}

/* A string starting after its opening quote at *i; on success *i is past
 * the closing quote. Escapes other than \uXXXX are decoded into j->buf
 * (sized by the caller to the line's length, so it never moves while a
 * line is read). */
static int read_string(cn_jline *j, const char *s, size_t len, size_t *i,
                       const char **out, int32_t *out_len) {
  size_t p = *i, start = p;
  /* eight bytes at a time while none ends the run (long strings: a
   * tree's text), then byte by byte */
  for (uint64_t w; p + 8 <= len; p += 8) {
    memcpy(&w, s + p, 8);
    uint64_t m = word_special(w);
    if (m != 0) {
      p += (size_t)__builtin_ctzll(m) >> 3;
      goto found;
    }
  }
  while (p < len && str_plain((unsigned char)s[p])) p++;
found:
  if (p < len && s[p] == '"') { /* the common case: nothing to decode */
    *out = s + start;
    *out_len = (int32_t)(p - start);
    *i = p + 1;
    return 0;
  }
  char *d = j->buf + j->buf_used, *d0 = d;
  memcpy(d, s + start, p - start);
  d += p - start;
  while (p < len) {
    unsigned char c = (unsigned char)s[p];
    if (c == '"') {
      *out = d0;
      *out_len = (int32_t)(d - d0);
      j->buf_used += (size_t)(d - d0);
      *i = p + 1;
      return 0;
    }
    if (c == '\\') {
      if (p + 1 >= len) return 1;
      char e;
      switch (s[p + 1]) {
        case '"': e = '"'; break;
        case '\\': e = '\\'; break;
        case '/': e = '/'; break;
        case 'b': e = '\b'; break;
        case 'f': e = '\f'; break;
        case 'n': e = '\n'; break;
        case 'r': e = '\r'; break;
        case 't': e = '\t'; break;
        default: return 1; /* \u and invalid escapes: jansson's */
      }
      *d++ = e;
      p += 2;
    } else if (c < 0x20) {
      return 1;
    } else if (c < 0x80) {
      *d++ = (char)c;
      p++;
    } else {
      int l = utf8_seq((const unsigned char *)s + p, len - p);
      if (l == 0) return 1;
      memcpy(d, s + p, (size_t)l);
      d += l;
      p += (size_t)l;
    }
  }
  return 1; /* unterminated */
}

/* Why: the tape lets instance_line.c walk a line's values by index,
 * without a heap node per value, and decline to jansson on anything
 * outside the subset (the file comment). Returns 0, 1 (declined) or
 * CN_E_NOMEM. */
int cn__jline_read(cn_jline *j, const char *s, size_t len) {
  int32_t stack[CN_JLINE_MAX_DEPTH];
  int32_t sp = 0;
  size_t i = 0;
  j->n = 0;
  j->buf_used = 0;
  if (len + 1 > j->buf_cap) {
    char *b = realloc(j->buf, len + 1);
    if (b == NULL) return CN_E_NOMEM;
    j->buf = b;
    j->buf_cap = len + 1;
  }
  /* expect: 0 a value, 1 a key or '}' (after '{'), 2 ',' or a closer,
   * 3 a value or ']' (after '['), 4 a key (after ',' in an object) */
  int expect = 0;
  while (i < len && ws((unsigned char)s[i])) i++;
  if (i == len || s[i] != '{') return 1; /* jansson's own message */
  for (;;) {
    while (i < len && ws((unsigned char)s[i])) i++;
    if (i == len) return 1;
    unsigned char c = (unsigned char)s[i];
    int32_t top = sp > 0 ? stack[sp - 1] : -1;
    if (expect == 2) {
      if (c == ',') {
        i++;
        expect = j->v[top].kind == CN_JV_OBJ ? 4 : 0;
        continue;
      }
      if ((c == '}' && j->v[top].kind == CN_JV_OBJ) ||
          (c == ']' && j->v[top].kind == CN_JV_ARR)) {
        i++;
        j->v[top].next = j->n;
        sp--;
        if (sp == 0) break;
        expect = 2;
        continue;
      }
      return 1;
    }
    if ((expect == 1 && c == '}') || (expect == 3 && c == ']')) {
      i++;
      j->v[top].next = j->n;
      sp--;
      if (sp == 0) break;
      expect = 2;
      continue;
    }
    if (expect == 1 || expect == 4) { /* a key, then ':' */
      if (c != '"') return 1;
      i++;
      int32_t k = tape_push(j);
      if (k < 0) return CN_E_NOMEM;
      cn_jval *kv = &j->v[k];
      kv->kind = CN_JV_STR;
      kv->next = k + 1;
      int rc = read_string(j, s, len, &i, &kv->s, &kv->n);
      if (rc) return rc;
      /* a duplicate key: jansson refuses it (JSON_REJECT_DUPLICATES);
       * the keys of the object so far are its members' first entries */
      cn_jval *o = &j->v[top];
      if (o->n >= 16) return 1;
      for (int32_t q = top + 1; q < k; q = j->v[j->v[q].next].next)
        if (j->v[q].n == kv->n && memcmp(j->v[q].s, kv->s, (size_t)kv->n) == 0)
          return 1;
      o->n++;
      while (i < len && ws((unsigned char)s[i])) i++;
      if (i == len || s[i] != ':') return 1;
      i++;
      expect = 0;
      continue;
    }
    /* a value (expect 0 or 3) */
    int32_t k = tape_push(j);
    if (k < 0) return CN_E_NOMEM;
    cn_jval *v = &j->v[k];
    v->next = k + 1;
    if (top >= 0 && j->v[top].kind == CN_JV_ARR) j->v[top].n++;
    if (c == '"') {
      i++;
      v->kind = CN_JV_STR;
      int rc = read_string(j, s, len, &i, &v->s, &v->n);
      if (rc) return rc;
      expect = 2;
    } else if (c >= '0' && c <= '9') {
      size_t st = i;
      int64_t x = 0;
      for (; i < len && s[i] >= '0' && s[i] <= '9'; i++)
        if (i - st < 18) x = x * 10 + (s[i] - '0'); /* longer: declined */
      if ((s[st] == '0' && i - st > 1) || i - st > 18) return 1;
      if (i < len && (s[i] == '.' || s[i] == 'e' || s[i] == 'E')) return 1;
      v->kind = CN_JV_INT;
      v->i = x;
      v->n = 0;
      expect = 2;
    } else if (c == '{' || c == '[') {
      if (sp == CN_JLINE_MAX_DEPTH) return 1;
      i++;
      v->kind = c == '{' ? CN_JV_OBJ : CN_JV_ARR;
      v->n = 0;
      stack[sp++] = k;
      expect = c == '{' ? 1 : 3;
    } else {
      return 1; /* true, false, null, signs, garbage: jansson's */
    }
  }
  while (i < len && ws((unsigned char)s[i])) i++;
  return i == len ? 0 : 1;
}

const cn_jval *cn__jline_get(const cn_jline *j, int32_t obj, const char *key,
                             int32_t *at) {
  size_t kl = strlen(key);
  const cn_jval *o = &j->v[obj];
  int32_t q = obj + 1;
  for (int32_t m = 0; m < o->n; m++) {
    const cn_jval *k = &j->v[q];
    if ((size_t)k->n == kl && memcmp(k->s, key, kl) == 0) {
      if (at != NULL) *at = q + 1;
      return &j->v[q + 1];
    }
    q = j->v[q + 1].next;
  }
  return NULL;
}

void cn__jline_free(cn_jline *j) {
  free(j->v);
  free(j->buf);
  memset(j, 0, sizeof(*j));
}
