/* bodyscan.c - counts the containers and instances of an infer body in
 * one pass over its bytes, so that a body that no valid request could be
 * is refused before jansson turns 3 bytes of "{}," into ~230 bytes of
 * json_t and hashtable (infer.c).
 *
 * Why hand-written and not a streaming library: yajl (libyajl-dev) has a
 * SAX interface that would give the same counts, but it validates and
 * decodes every string and number on the way, only for jansson to do it
 * all again right after; the counts need only strings skipped (with their
 * escapes) and brackets, commas and one key matched: some eighty lines,
 * no allocation and no new dependency. The pass does not validate:
 * jansson still does, and decides every error but the two 413s. On bytes
 * that are not JSON the counts are whatever they are, always finite and
 * computed in O(n); tests/fuzz/fuzz_bodyscan.c checks they equal
 * jansson's on every input jansson accepts. */
#include "bodyscan.h"

#include <stdbool.h>
#include <string.h>

static const char KEY[] = "instances";
#define KEY_LEN (sizeof(KEY) - 1)

static int hexval(unsigned char ch) {
  if (ch >= '0' && ch <= '9') return ch - '0';
  if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
  if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
  return -1;
}

static const char *simple_escape(unsigned char ch) {
  switch (ch) {
    case '"': return "\"";
    case '\\': return "\\";
    case '/': return "/";
    case 'b': return "\b";
    case 'f': return "\f";
    case 'n': return "\n";
    case 'r': return "\r";
    case 't': return "\t";
    default: return NULL;
  }
}

/* The scanner's state between bytes. */
typedef struct scan {
  size_t depth;            /* containers open                          */
  bool top_obj;            /* the first value is an object             */
  bool in_str;
  int esc;                 /* 0; 1 after '\'; 2..5: \u hex digits read */
  unsigned u;              /* the \u code point being read             */
  /* a string at depth 1 of the top object, decoded as it goes and
   * compared with "instances" (a key may spell it with escapes) */
  bool kstr, kmatch;
  size_t kpos;
  bool key_is_inst;        /* the last such string was "instances"     */
  bool pending;            /* after "instances": at depth 1            */
  bool in_inst;            /* inside the instances array (depth 2)     */
  bool inst_nonempty;
  size_t inst_commas;
  bool found;
  size_t instances;
  size_t objects, arrays;
} scan;

/* One decoded character c of a candidate key (-1: one that cannot be a
 * character of "instances") compared with the next of KEY. */
static inline void key_char(scan *s, int c) {
  if (!s->kstr || !s->kmatch) return;
  if (c >= 0 && s->kpos < KEY_LEN && (char)c == KEY[s->kpos]) s->kpos++;
  else s->kmatch = false;
}

/* A byte inside a string: its end, an escape, or a character. */
static inline void string_byte(scan *s, unsigned char ch) {
  if (s->esc == 0) {
    if (ch == '"') {
      s->in_str = false;
      if (s->kstr) s->key_is_inst = s->kmatch && s->kpos == KEY_LEN;
      s->kstr = false;
      return;
    }
    if (ch == '\\') {
      s->esc = 1;
      return;
    }
    key_char(s, ch);
    return;
  }
  if (s->esc == 1) {
    if (ch == 'u') {
      s->esc = 2;
      s->u = 0;
      return;
    }
    s->esc = 0;
    const char *d = simple_escape(ch);
    key_char(s, d != NULL ? (unsigned char)d[0] : -1);
    return;
  }
  /* esc 2..5: the four hex digits of \uXXXX */
  int h = hexval(ch);
  if (h < 0) { /* not JSON: jansson refuses it; go on as a plain byte */
    s->esc = 0;
    if (s->kstr) s->kmatch = false;
    if (ch == '"') {
      s->in_str = false;
      s->kstr = false;
      s->key_is_inst = false;
    }
    return;
  }
  s->u = s->u * 16 + (unsigned)h;
  if (++s->esc == 6) {
    s->esc = 0;
    key_char(s, s->u < 0x80 ? (int)s->u : -1);
  }
}

/* Inside the instances array, at its own depth: a comma separates two
 * instances; anything else but its ']' means it has one. */
static inline void instance_byte(scan *s, unsigned char ch) {
  if (!s->in_inst || s->depth != 2) return;
  if (ch == ',') s->inst_commas++;
  else if (ch != ']') s->inst_nonempty = true;
}

/* At depth 1 of the top object: a ':' after the key "instances" makes
 * the value pending, and a '[' as that value opens the instances array.
 * True when the byte is used up (the ':'). */
static inline bool top_key_byte(scan *s, unsigned char ch) {
  if (s->depth != 1 || !s->top_obj) return false;
  if (ch == ':') {
    s->pending = s->key_is_inst;
    return true;
  }
  if (ch == '[' && s->pending) {
    s->in_inst = true;
    s->inst_nonempty = false;
    s->inst_commas = 0;
  }
  if (ch != '"') s->key_is_inst = false;
  s->pending = false;
  return false;
}

/* A string's start, or a container opened or closed (counted, and the
 * instances array's count taken when it closes). */
static inline void structure_byte(scan *s, unsigned char ch) {
  switch (ch) {
    case '"':
      s->in_str = true;
      s->esc = 0;
      s->kstr = s->depth == 1 && s->top_obj;
      s->kmatch = true;
      s->kpos = 0;
      break;
    case '{':
      if (s->depth == 0 && s->objects == 0 && s->arrays == 0)
        s->top_obj = true;
      s->objects++;
      s->depth++;
      break;
    case '[':
      s->arrays++;
      s->depth++;
      break;
    case '}':
    case ']':
      if (s->depth > 0) s->depth--;
      if (s->in_inst && s->depth == 1) {
        size_t k = s->inst_nonempty ? s->inst_commas + 1 : 0;
        /* a second "instances" is a duplicate key, which jansson
         * refuses; keep the larger */
        if (!s->found || k > s->instances) s->instances = k;
        s->found = true;
        s->in_inst = false;
      }
      break;
    default:
      break;
  }
}

/* One pass, each byte handed to the one step that reads it; the helpers
 * are static inline, so this stays one loop with the state in registers. */
void cn__body_scan(const char *b, size_t n, cn__body_counts *out) {
  scan s = {0};
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)b[i];
    if (s.in_str) {
      /* the bytes of a string that cannot be the key "instances", up to
       * its next '"' or '\\', change nothing: skipped at memchr's speed
       * (an instance's tree or text is most of a body's bytes) */
      if (s.esc == 0 && !s.kstr && ch != '"' && ch != '\\') {
        const char *q = memchr(b + i, '"', n - i);
        size_t end = q != NULL ? (size_t)(q - b) : n;
        const char *bs = memchr(b + i, '\\', end - i);
        if (bs != NULL) end = (size_t)(bs - b);
        if (end >= n) break;
        i = end;
        ch = (unsigned char)b[i];
      }
      string_byte(&s, ch);
      continue;
    }
    if (ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r') continue;
    /* a value or punctuation outside strings */
    instance_byte(&s, ch);
    if (top_key_byte(&s, ch)) continue;
    structure_byte(&s, ch);
  }
  out->objects = s.objects;
  out->arrays = s.arrays;
  out->instances = s.found ? s.instances : 1;
}
