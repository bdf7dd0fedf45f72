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

void cn__body_scan(const char *b, size_t n, cn__body_counts *out) {
  size_t depth = 0;        /* containers open                          */
  bool top_obj = false;    /* the first value is an object             */
  bool in_str = false;
  int esc = 0;             /* 0; 1 after '\'; 2..5: \u hex digits read */
  unsigned u = 0;          /* the \u code point being read             */
  /* a string at depth 1 of the top object, decoded as it goes and
   * compared with "instances" (a key may spell it with escapes) */
  bool kstr = false, kmatch = false;
  size_t kpos = 0;
  bool key_is_inst = false; /* the last such string was "instances"    */
  bool pending = false;     /* after "instances": at depth 1           */
  bool in_inst = false;     /* inside the instances array (depth 2)    */
  bool inst_nonempty = false;
  size_t inst_commas = 0;
  bool found = false;
  size_t instances = 0;
  size_t objects = 0, arrays = 0;

  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)b[i];
    if (in_str) {
      if (esc == 0) {
        if (ch == '"') {
          in_str = false;
          if (kstr) key_is_inst = kmatch && kpos == KEY_LEN;
          kstr = false;
          continue;
        }
        if (ch == '\\') {
          esc = 1;
          continue;
        }
        if (kstr && kmatch) {
          if (kpos < KEY_LEN && (char)ch == KEY[kpos]) kpos++;
          else kmatch = false;
        }
        continue;
      }
      if (esc == 1) {
        if (ch == 'u') {
          esc = 2;
          u = 0;
          continue;
        }
        esc = 0;
        const char *d = simple_escape(ch);
        if (kstr && kmatch) {
          if (d != NULL && kpos < KEY_LEN && d[0] == KEY[kpos]) kpos++;
          else kmatch = false;
        }
        continue;
      }
      /* esc 2..5: the four hex digits of \uXXXX */
      int h = hexval(ch);
      if (h < 0) { /* not JSON: jansson refuses it; go on as a plain byte */
        esc = 0;
        if (kstr) kmatch = false;
        if (ch == '"') {
          in_str = false;
          kstr = false;
          key_is_inst = false;
        }
        continue;
      }
      u = u * 16 + (unsigned)h;
      if (++esc == 6) {
        esc = 0;
        if (kstr && kmatch) {
          if (u < 0x80 && kpos < KEY_LEN && (char)u == KEY[kpos]) kpos++;
          else kmatch = false;
        }
      }
      continue;
    }
    if (ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r') continue;
    /* a value or punctuation outside strings */
    if (in_inst && depth == 2) {
      if (ch == ',') inst_commas++;
      else if (ch != ']') inst_nonempty = true;
    }
    if (depth == 1 && top_obj) {
      if (ch == ':') {
        pending = key_is_inst;
        continue;
      }
      if (ch == '[' && pending) {
        in_inst = true;
        inst_nonempty = false;
        inst_commas = 0;
      }
      if (ch != '"') key_is_inst = false;
      pending = false;
    }
    switch (ch) {
      case '"':
        in_str = true;
        esc = 0;
        kstr = depth == 1 && top_obj;
        kmatch = true;
        kpos = 0;
        break;
      case '{':
        if (depth == 0 && objects == 0 && arrays == 0) top_obj = true;
        objects++;
        depth++;
        break;
      case '[':
        arrays++;
        depth++;
        break;
      case '}':
      case ']':
        if (depth > 0) depth--;
        if (in_inst && depth == 1) {
          size_t k = inst_nonempty ? inst_commas + 1 : 0;
          /* a second "instances" is a duplicate key, which jansson
           * refuses; keep the larger */
          if (!found || k > instances) instances = k;
          found = true;
          in_inst = false;
        }
        break;
      default:
        break;
    }
  }
  out->objects = objects;
  out->arrays = arrays;
  out->instances = found ? instances : 1;
}
