/* err.c - the error table (canopy_core.h CN_ERRNO_MAP) and error details. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "canopy_core.h"

#define IDX(e) ((e) - CN__ERR_FIRST - 1)

static const struct {
  const char *code;
  int status;
  const char *msg;
} err_table[] = {
#define XX(name, code, status, msg) {code, status, msg},
    CN_ERRNO_MAP(XX)
#undef XX
};

static int known(int e) { return e > CN__ERR_FIRST && e < CN__ERR_LAST; }

const char *cn_err_code(int e) {
  return known(e) ? err_table[IDX(e)].code : "internal";
}

int cn_err_http_status(int e) {
  if (e == CN_OK) return 200;
  return known(e) ? err_table[IDX(e)].status : 500;
}

const char *cn_err_default_msg(int e) {
  return known(e) ? err_table[IDX(e)].msg : "internal error";
}

void cn_err_clear(cn_err *e) {
  if (e == NULL) return;
  e->code = CN_OK;
  e->instance = -1;
  e->node = -1;
  e->offset = -1;
  e->msg[0] = '\0';
}

int cn_err_set(cn_err *e, int code, const char *fmt, ...) {
  if (e == NULL) return code;
  e->code = code;
  if (fmt == NULL) {
    snprintf(e->msg, sizeof(e->msg), "%s", cn_err_default_msg(code));
  } else {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
    va_end(ap);
  }
  return code;
}

/* A message quotes what the client sent (a model name from the path, a
 * token), which need not be UTF-8, or is cut mid-character: jansson
 * refuses such a string, and the error would have no message. Then every
 * byte outside ASCII becomes '?'. */
static json_t *message_json(const char *m) {
  json_t *j = json_string(m);
  if (j != NULL) return j;
  char ascii[sizeof(((cn_err *)0)->msg)];
  size_t n = 0;
  for (; m[n] != '\0' && n + 1 < sizeof(ascii); n++)
    ascii[n] = (unsigned char)m[n] < 0x80 ? m[n] : '?';
  ascii[n] = '\0';
  return json_string(ascii);
}

json_t *cn_err_to_json(const cn_err *e) {
  json_t *o = json_object();
  json_object_set_new(o, "code", json_string(cn_err_code(e->code)));
  json_object_set_new(o, "message",
                      message_json(e->msg[0] ? e->msg
                                             : cn_err_default_msg(e->code)));
  if (e->instance >= 0)
    json_object_set_new(o, "instance", json_integer(e->instance));
  if (e->node >= 0) json_object_set_new(o, "node", json_integer(e->node));
  if (e->offset >= 0) json_object_set_new(o, "offset", json_integer(e->offset));
  json_t *w = json_object();
  json_object_set_new(w, "error", o);
  return w;
}

void cn_limits_default(cn_limits *l) {
  l->max_nodes = 4096;
  l->max_depth = 512;
  l->max_token_len = 256;
  l->max_children = 256;
  l->max_seq_len = 1024;
  l->max_spans = 8192;
}
