/* handlers.h - the routes' handlers: requests routed and
 * validated (http.c), infer bodies (infer.c, limits.c, bigparse.c), the
 * Open Inference Protocol (kserve.c) and the model repository (repo.c,
 * repo_control.c).
 * They call down into work.h, request.h and net.h; the connections reach
 * them only through cn__http_handlers. */
#ifndef CANOPY_SERVER_HANDLERS_H
#define CANOPY_SERVER_HANDLERS_H

#include <sys/stat.h>

#include "work.h"

/* http.c: requests and answers */
extern const cn__http_hooks cn__http_handlers;

/* limits.c: the limits on a body's JSON containers and instances, from
 * counts (bodyscan.h): 413 too_large naming the limit, else 0. */
struct cn__body_counts;
int cn__limits_check_counts(const cn__server *s,
                            const struct cn__body_counts *k, cn_err *e);
int cn__limits_too_many_instances(cn_err *e, size_t n, int max);

/* infer.c: parses r->body (and frees it) into r's options and instances */
int cn__infer_parse(cn__req *r, cn_err *e);
/* The same in two steps: the parse (any thread; writes only p; p holds
 * nothing on failure), then, on the loop, p becomes r's. */
int cn__infer_parse_into(const cn__req *r, cn__parsed *p, cn_err *e);
void cn__infer_commit(cn__req *r, cn__parsed *p);
void cn__parsed_free(cn__parsed *p, cn__server *s);
/* parse_time.c (loop thread): a body's parse begins (the monotonic time
 * it began, for cn__parse_end) and ends; its CPU seconds reach the parse
 * stage of model when the loop turn ends. */
double cn__parse_begin(cn__server *s);
void cn__parse_end(cn__server *s, int model, double t0);
/* bigparse.c (loop thread): bodies over CN__BIG_BODY_BYTES are parsed on
 * libuv's threadpool, in two lanes with a FIFO each: medium ones (up to
 * CN__MEDIUM_BODY_BYTES) CN__MEDIUM_PARSES at a time, huge ones
 * CN__BIG_PARSES at a time. The request is WAITING (on s->waiting)
 * meanwhile; `parsed`(r) runs on the loop once its parse ended (r->prc,
 * r->perr, r->parsed), unless it was answered (disconnect, drain)
 * meanwhile. */
#define CN__BIG_BODY_BYTES (16 * 1024)
#define CN__MEDIUM_BODY_BYTES (1024 * 1024)
#define CN__MEDIUM_PARSES 3
#define CN__BIG_PARSES 1
void cn__bigparse_submit(cn__req *r, void (*parsed)(cn__req *r));

/* kserve.c: the Open Inference Protocol (KServe v2) as a mapping onto /v1
 * (docs/api.md) */
/* GET /v2 and GET /v2/models/{model} bodies (new references). */
json_t *cn__kserve_server_meta(void);
json_t *cn__kserve_model_meta(const cn__model_entry *me);
/* kserve_ext.c: Triton's model configuration and statistics extensions
 * (new references): me's configuration; the statistics of me, or of
 * every model serving when me is NULL. */
json_t *cn__kserve_model_config(cn__server *s, const cn__model_entry *me);
json_t *cn__kserve_model_stats(cn__server *s, const cn__model_entry *me);
/* Any thread: of a v2 body of len bytes (inflated), how many are its JSON
 * (Inference-Header-Content-Length; all without it), or 400. */
int cn__kserve_header_len(const cn__req *r, size_t len, size_t *json_len,
                          cn_err *e);
/* Any thread: the v2 body j (and bin_len bytes of binary tensor data
 * after it) as the /v1 request it asks for (*v1, a new reference:
 * {"instances": [...], options}); sets p's v2_id, v2_outputs, v2_binary
 * and v2_topk. On failure *v1 is NULL and e says why (400, or 413 as
 * /v1). */
int cn__kserve_request(const cn__req *r, const json_t *j, const char *bin,
                       size_t bin_len, json_t **v1, cn__parsed *p,
                       cn_err *e);
/* The bytes a v2 answer may add to values, infer.c's bound of its /v1
 * values: classes, binary data, compression. */
long long cn__kserve_answer_extra(const cn__req *r, const cn__parsed *p,
                                  long long values);
/* repo.c, repo_control.c: the model repository: versions, loads,
 * unloads, rescans */
cn__model_slot *cn__repo_find(cn__server *s, const char *name, size_t len);
/* Loop: the model name name most likely meant (the same but for case, or
 * one or two edits away) into out; false: none is near. */
bool cn__repo_nearest(cn__server *s, const char *name, char *out,
                      size_t cap);
/* Start-up: may the load and unload routes run (repo_open), said in the
 * log: with a repository-token, on a loopback host, or with
 * repository-insecure (else anyone on the network could load). */
void cn__repo_guard_init(cn__server *s);
/* Loop: is a load or its queue under way for sl (an unload cancels it)? */
bool cn__repo_busy(const cn__model_slot *sl);
/* Start-up: every model directory, loaded in name order. */
int cn__repo_load_all(cn__server *s, cn_err *err);
void cn__repo_free_all(cn__server *s);
/* After the loop, once the workers stopped: waits for the loads still in
 * flight and settles them as the loop would (the version discarded, the
 * requests that waited on it released). */
void cn__repo_loads_join(cn__server *s);
/* Loop: load (or reload) a model directory on a loader thread; r, if not
 * NULL, is a suspended POST .../load answered when it is done. */
void cn__repo_load_async(cn__server *s, const char *name, cn__req *r);
void cn__repo_unload(cn__server *s, cn__model_slot *sl);
/* Loop: new directories load, changed ones reload, removed ones unload. */
void cn__repo_rescan(cn__server *s, const char *why);
void cn__repo_on_loaded(uv_async_t *a);
json_t *cn__repo_index(cn__server *s);
/* Prometheus text of canopy_model_ready / canopy_model_loads_total. */
char *cn__repo_metrics(cn__server *s);
/* repo.c's slot helpers that repo_control.c's unload and rescan share
 * (loop thread): the slot's directory signature now; free sl for another
 * name when nothing holds it (true: freed); answer every request that
 * joined sl's load with v or err. */
void cn__repo_slot_signature(cn__server *s, cn__model_slot *sl,
                             struct stat sig[2]);
bool cn__repo_slot_free(cn__server *s, cn__model_slot *sl);
void cn__repo_answer_joined(cn__model_slot *sl, cn__model_entry *v,
                            const cn_err *err);

#endif
