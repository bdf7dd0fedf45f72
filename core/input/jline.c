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

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

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
  /* ' ', '\t', '\n', '\r' as bits of one constant */
  return c <= ' ' && ((0x100002600ull >> c) & 1) != 0;
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

/* The tape doubled (at least 256 values); -1: no memory. Out of line:
 * it runs a few times, then never once the tape has grown. */
static int tape_grow(cn_jline *j) {
  int32_t c = j->cap ? j->cap * 2 : 256;
  cn_jval *t = cn__xrealloc(j->v, (size_t)c, sizeof(*t));
  if (t == NULL) return -1;
  j->v = t;
  j->cap = c;
  return 0;
}

/* The first byte at or after p that is not plain ('"', '\\', a control
 * byte or non-ASCII), or len: 16 bytes a step with SSE2 - the quote, the
 * backslash, and, compared as signed bytes, every byte below 0x20, which
 * takes the controls and the non-ASCII bytes both - or 8 (word_special)
 * elsewhere, while they remain; then byte by byte. */
static inline size_t plain_end(const char *s, size_t len, size_t p) {
#if defined(__SSE2__)
  const __m128i quote = _mm_set1_epi8('"'), bs = _mm_set1_epi8('\\');
  const __m128i sp = _mm_set1_epi8(0x20);
  for (; p + 16 <= len; p += 16) {
    __m128i x = _mm_loadu_si128((const __m128i *)(const void *)(s + p));
    __m128i m = _mm_or_si128(
        _mm_or_si128(_mm_cmpeq_epi8(x, quote), _mm_cmpeq_epi8(x, bs)),
        _mm_cmplt_epi8(x, sp));
    unsigned bits = (unsigned)_mm_movemask_epi8(m);
    if (bits != 0) return p + (size_t)__builtin_ctz(bits);
  }
#endif
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ /* the first byte lowest */
  for (uint64_t w; p + 8 <= len; p += 8) {
    memcpy(&w, s + p, 8);
    uint64_t m = word_special(w);
    if (m != 0) return p + ((size_t)__builtin_ctzll(m) >> 3);
  }
#endif
  while (p < len && str_plain((unsigned char)s[p])) p++;
  return p;
}

/* The rest of a string from s[p], the first byte the fast scan stopped
 * at that is not '"' (an escape, a control byte, non-ASCII, or the end);
 * start is its first byte. Valid UTF-8 is checked where it is; the
 * string still points into the line unless an escape needs decoding,
 * which goes into j->buf (sized by the caller to the line's length, so
 * it never moves while a line is read). Plain runs between are found by
 * plain_end and copied whole. */
static int read_string_rest(cn_jline *j, const char *s, size_t len,
                            size_t start, size_t p, size_t *i,
                            const char **out, int32_t *out_len) {
  for (;;) { /* no escape yet: the bytes stay in the line */
    if (p >= len) return 1; /* unterminated */
    unsigned char c = (unsigned char)s[p];
    if (c == '"') {
      *out = s + start;
      *out_len = (int32_t)(p - start);
      *i = p + 1;
      return 0;
    }
    if (c == '\\') break;
    if (c < 0x20) return 1;
    if (c < 0x80) {
      p++;
    } else {
      int l = utf8_seq((const unsigned char *)s + p, len - p);
      if (l == 0) return 1;
      p += (size_t)l;
    }
    p = plain_end(s, len, p);
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
    size_t q = plain_end(s, len, p);
    memcpy(d, s + p, q - p);
    d += q - p;
    p = q;
  }
  return 1; /* unterminated */
}

/* A string starting after its opening quote at *i; on success *i is past
 * the closing quote. Plain ASCII up to the quote (the common case) is
 * found here (plain_end); anything else goes on in read_string_rest. */
static inline int read_string(cn_jline *j, const char *s, size_t len,
                              size_t *i, const char **out, int32_t *out_len) {
  size_t p = *i, start = p;
  p = plain_end(s, len, p);
  if (__builtin_expect(p < len && s[p] == '"', 1)) {
    *out = s + start;
    *out_len = (int32_t)(p - start);
    *i = p + 1;
    return 0;
  }
  return read_string_rest(j, s, len, start, p, i, out, out_len);
}

/* Why: the tape lets instance_line.c walk a line's values by index,
 * without a heap node per value, and decline to jansson on anything
 * outside the subset (the file comment). Returns 0, 1 (declined) or
 * CN_E_NOMEM.
 *
 * The grammar is a few states, each a label: value (a value is next),
 * key (a member's key, then ':'), after (',' or the closer of the
 * innermost container), close. The tape, its length and the innermost
 * container (its index, kind and count) stay in locals between them: a
 * store to the tape through j would otherwise make every j->v[...] read
 * after it load j->v again. */
int cn__jline_read(cn_jline *j, const char *s, size_t len) {
  int32_t stack[CN_JLINE_MAX_DEPTH];
  int32_t sp = 0;
  size_t i = 0;
  int rc = 1;
  j->n = 0;
  j->buf_used = 0;
  if (len + 1 > j->buf_cap) {
    char *b = realloc(j->buf, len + 1);
    if (b == NULL) return CN_E_NOMEM;
    j->buf = b;
    j->buf_cap = len + 1;
  }
  while (i < len && ws((unsigned char)s[i])) i++;
  if (i == len || s[i] != '{') return 1; /* jansson's own message */
  cn_jval *v = j->v;
  int32_t n = 0, cap = j->cap;
  int32_t top = -1;   /* the innermost open container, -1 before the root */
  bool in_obj = false; /* and whether it is an object */
  int32_t cnt = 0;     /* its members or items so far (its n at close) */
  int32_t cnts[CN_JLINE_MAX_DEPTH]; /* cnt of each container it is in */
  unsigned char c;
#define SKIP_WS()                                                          \
  while (i < len && ws((unsigned char)s[i])) i++
#define PUSH(k)                                                            \
  do {                                                                     \
    if (n == cap) {                                                        \
      if (tape_grow(j) != 0) {                                             \
        rc = CN_E_NOMEM;                                                   \
        goto out;                                                          \
      }                                                                    \
      v = j->v;                                                            \
      cap = j->cap;                                                        \
    }                                                                      \
    (k) = n++;                                                             \
  } while (0)

value: /* a value at s[i] or after whitespace */
  SKIP_WS();
  if (i == len) goto out;
  c = (unsigned char)s[i];
  {
    int32_t k;
    PUSH(k);
    cn_jval *x = &v[k];
    x->next = k + 1;
    if (!in_obj) cnt++; /* an array's item (and the root's count, unused) */
    if (c == '"') {
      i++;
      x->kind = CN_JV_STR;
      int r = read_string(j, s, len, &i, &x->s, &x->n);
      if (r) {
        rc = r;
        goto out;
      }
      goto after;
    }
    if (c >= '0' && c <= '9') {
      /* a fraction or an exponent after the digits is declined by
       * after, which takes none of '.', 'e', 'E' */
      size_t st = i;
      uint64_t y = 0; /* wraps past 18 digits: declined then */
      for (unsigned d; i < len && (d = (unsigned char)s[i] - '0') <= 9; i++)
        y = y * 10 + d;
      if (i - st > 18 || (c == '0' && i - st > 1)) goto out;
      x->kind = CN_JV_INT;
      x->i = (int64_t)y;
      x->n = 0;
      goto after;
    }
    if (c != '{' && c != '[') goto out; /* true, false, null, signs... */
    if (sp == CN_JLINE_MAX_DEPTH) goto out;
    i++;
    in_obj = c == '{';
    x->kind = in_obj ? CN_JV_OBJ : CN_JV_ARR;
    cnts[sp] = cnt; /* the outer container's count, back at close */
    stack[sp++] = top = k;
    cnt = 0;
    SKIP_WS();
    if (i == len) goto out;
    if (s[i] == (in_obj ? '}' : ']')) goto close;
    if (in_obj) goto key;
    goto value;
  }

key: /* a key at s[i] of object top, then ':' */
  if (s[i] != '"') goto out;
  i++;
  {
    int32_t k;
    PUSH(k);
    cn_jval *kv = &v[k];
    kv->kind = CN_JV_STR;
    kv->next = k + 1;
    int r = read_string(j, s, len, &i, &kv->s, &kv->n);
    if (r) {
      rc = r;
      goto out;
    }
    /* a duplicate key: jansson refuses it (JSON_REJECT_DUPLICATES);
     * the keys of the object so far are its members' first entries */
    if (cnt >= 16) goto out;
    for (int32_t q = top + 1; q < k; q = v[v[q].next].next)
      if (v[q].n == kv->n && memcmp(v[q].s, kv->s, (size_t)kv->n) == 0)
        goto out;
    cnt++;
  }
  SKIP_WS();
  if (i == len || s[i] != ':') goto out;
  i++;
  goto value;

after: /* after a value: ',' or the closer of top */
  SKIP_WS();
  if (i == len) goto out;
  c = (unsigned char)s[i];
  if (c == ',') {
    i++;
    if (!in_obj) goto value;
    SKIP_WS();
    if (i == len) goto out;
    goto key;
  }
  if (c != (in_obj ? '}' : ']')) goto out;

close: /* s[i] closes top */
  i++;
  v[top].next = n;
  v[top].n = cnt;
  if (--sp > 0) {
    top = stack[sp - 1];
    in_obj = v[top].kind == CN_JV_OBJ;
    cnt = cnts[sp];
    goto after;
  }
  SKIP_WS();
  rc = i == len ? 0 : 1;
#undef SKIP_WS
#undef PUSH
out:
  j->n = n;
  return rc;
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
