/* answer_parts.c - parts of a /v1 answer that both a run's answers (worker.c)
 * and a decode session's (decode.c) hold, the text of an answer that is
 * still a json_t, and the compression both give an answer (/v1's or v2's)
 * whose client asked for it.
 */
#include <stdlib.h>
#include <string.h>

#include "encoding.h"
#include "numtext.h"
#include "work.h"

/* stats.unknown_labels (models that type tree nodes by label): the
 * request's bracket labels the model does not list. */
static long long labels_unknown(const cn__req *r) {
  long long n = 0;
  for (int i = 0; i < r->n_inst; i++) n += cn_instance_unknown_labels(r->inst[i]);
  return n;
}

/* stats.unknown_tokens: the request's words that are not in the model's
 * vocabulary (read as '<unk>', so a client learns that its
 * tokenisation or casing does not match the model's); with
 * "unknown_positions": true, stats.unknown_positions lists them, one
 * array an instance (cn_instance_unknown's positions). */
void cn__stats_unknown(json_t *st, const cn__req *r) {
  long long total = 0;
  json_t *all = (r->flags & CN_OUT_UNKNOWN) ? json_array() : NULL;
  for (int i = 0; i < r->n_inst; i++) {
    int n = cn_instance_unknown(r->inst[i], NULL, 0);
    total += n;
    if (all == NULL) continue;
    int32_t *pos = n > 0 ? malloc((size_t)n * sizeof(*pos)) : NULL;
    json_t *a = json_array();
    if (pos != NULL) cn_instance_unknown(r->inst[i], pos, n);
    for (int k = 0; pos != NULL && k < n; k++)
      json_array_append_new(a, json_integer(pos[k]));
    free(pos);
    json_array_append_new(all, a);
  }
  json_object_set_new(st, "unknown_tokens", json_integer(total));
  if (cn_model_reads_labels(r->me->model))
    json_object_set_new(st, "unknown_labels", json_integer(labels_unknown(r)));
  if (all != NULL) json_object_set_new(st, "unknown_positions", all);
}

/* Accept-Encoding gzip or deflate: the answer goes out compressed, done
 * here on the worker that laid it out rather than on the loop, which
 * every connection shares. Only a 200's: an error stays plain JSON, as
 * the few bytes of a message gain nothing. Without memory for it the
 * answer goes out as it is. */
void cn__answer_compress(cn__req *r) {
  if (r->answer_enc == CN__ENC_NONE || r->result == NULL ||
      r->result_status != 200)
    return;
  size_t n = r->result_len ? r->result_len : strlen(r->result), zn;
  char *z;
  if (cn__deflate(r->answer_enc, r->result, n, &z, &zn) != 0) return;
  free(r->result);
  r->result = z;
  r->result_len = zn;
  size_t hl = strlen(r->result_head);
  snprintf(r->result_head + hl, sizeof(r->result_head) - hl,
           "Content-Encoding: %s\r\nVary: Accept-Encoding\r\n",
           cn__enc_name(r->answer_enc));
}

void cn__stats_unknown_write(cn_buf *b, const cn__req *r) {
  long long total = 0;
  for (int i = 0; i < r->n_inst; i++)
    total += cn_instance_unknown(r->inst[i], NULL, 0);
  cn_buf_puts(b, ",\"unknown_tokens\":");
  cn_buf_int(b, total);
  if (cn_model_reads_labels(r->me->model)) {
    cn_buf_puts(b, ",\"unknown_labels\":");
    cn_buf_int(b, labels_unknown(r));
  }
  if (!(r->flags & CN_OUT_UNKNOWN)) return;
  cn_buf_puts(b, ",\"unknown_positions\":[");
  for (int i = 0; i < r->n_inst; i++) {
    int n = cn_instance_unknown(r->inst[i], NULL, 0);
    int32_t *pos = n > 0 ? malloc((size_t)n * sizeof(*pos)) : NULL;
    if (i > 0) cn_buf_puts(b, ",");
    cn_buf_puts(b, "[");
    if (pos != NULL) cn_instance_unknown(r->inst[i], pos, n);
    for (int k = 0; pos != NULL && k < n; k++) {
      if (k > 0) cn_buf_puts(b, ",");
      cn_buf_int(b, pos[k]);
    }
    free(pos);
    cn_buf_puts(b, "]");
  }
  cn_buf_puts(b, "]");
}

void cn__answer_head(cn_buf *b, const cn__model_entry *me) {
  cn_buf_puts(b, "{\"model\":");
  cn_buf_string(b, me->name);
  cn_buf_puts(b, ",\"model_version\":");
  cn_buf_string(b, me->version);
  cn_buf_puts(b, ",\"outputs\":[");
}

/* The stats every answer of a run shares, compute_ms through
 * run_instances: written once a run (worker.c) and copied into each of
 * its answers, or written here for one answer (decode.c). */
void cn__answer_run_text(cn_buf *b, const cn__answer_stats *st) {
  cn_buf_puts(b, ",\"compute_ms\":");
  cn_buf_double(b, st->compute_ms);
  cn_buf_puts(b, ",\"batches\":");
  cn_buf_int(b, st->batches);
  cn_buf_puts(b, ",\"lower_bound\":");
  cn_buf_int(b, st->lower_bound);
  if (st->continuous) cn_buf_puts(b, ",\"continuous\":true");
  /* which requests shared the run: the same number */
  cn_buf_puts(b, ",\"run\":");
  cn_buf_int(b, (long long)st->run);
  if (st->run_requests >= 0) {
    cn_buf_puts(b, ",\"run_requests\":");
    cn_buf_int(b, st->run_requests);
    cn_buf_puts(b, ",\"run_instances\":");
    cn_buf_int(b, st->run_instances);
  }
}

/* Why: the stats are the same keys in the same order whether an answer
 * is written as text (/v1) or built as a json_t (v2): one list of them,
 * the two forms side by side. Only queue_ms and the unknown words are
 * the request's own; the rest is the run's (cn__answer_run_text). */
void cn__answer_tail(cn_buf *b, const cn__answer_stats *st,
                     const cn__req *r) {
  cn_buf_puts(b, "],\"stats\":{\"queue_ms\":");
  cn__buf_ms(b, st->queue_ms);
  if (st->run_text != NULL) cn_buf_put(b, st->run_text, st->run_text_len);
  else cn__answer_run_text(b, st);
  cn__stats_unknown_write(b, r);
  cn_buf_puts(b, "}}");
}

json_t *cn__answer_stats_json(const cn__answer_stats *st, const cn__req *r) {
  json_t *o = json_object();
  json_object_set_new(o, "queue_ms", json_real(st->queue_ms));
  json_object_set_new(o, "compute_ms", json_real(st->compute_ms));
  json_object_set_new(o, "batches", json_integer(st->batches));
  json_object_set_new(o, "lower_bound", json_integer(st->lower_bound));
  if (st->continuous) json_object_set_new(o, "continuous", json_true());
  json_object_set_new(o, "run", json_integer((json_int_t)st->run));
  if (st->run_requests >= 0) {
    json_object_set_new(o, "run_requests", json_integer(st->run_requests));
    json_object_set_new(o, "run_instances",
                        json_integer(st->run_instances));
  }
  cn__stats_unknown(o, r);
  return o;
}

char *cn__answer_dump(const json_t *j) {
  cn_buf b = {0};
  cn_buf_json(&b, j);
  if (b.failed) cn_buf_free(&b);
  return b.p;
}
