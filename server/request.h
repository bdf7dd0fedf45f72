/* request.h - a request's life after its handler (request.c)
 * and the reference-counted model versions requests and runs hold
 * (versions.c): the layer above the connections that both the batching side
 * and the handlers answer through. */
#ifndef CANOPY_SERVER_REQUEST_H
#define CANOPY_SERVER_REQUEST_H

#include "net.h"

/* request.c: a request's life after its handler (any layer above the
 * connections answers through it) */
void cn__req_unref(cn__req *r);
/* Frees the body, giving its bytes back to max-body-memory (any thread). */
void cn__req_body_free(cn__req *r);
void cn__handle_unref_cb(uv_handle_t *h); /* close_cb: h->data is a req */
/* Answers a waiting request from the loop: closes its handles, records
 * metrics and the log line, writes the answer. Takes over body. */
void cn__req_answer(cn__req *r, int status, char *body, const char *reason);
/* The same with the answer a worker left in r (result, result_status; a
 * 200's result_len bytes of result_ctype with result_head's headers:
 * binary tensor data, compression); 500 when it left none. */
void cn__req_answer_result(cn__req *r);
/* Answers a request that never waited (its handler decided at once). */
void cn__req_answer_now(cn__req *r, int status, char *body,
                        const char *ctype);
/* Reserves r's answer bound (r->answer_bound) of max-answer-memory until
 * r is answered; CN_E_ANSWER_MEMORY (503) when it does not fit (loop). */
int cn__req_reserve_answer(cn__req *r, cn_err *e);
/* A line reader for a request body read without a DOM (infer.c): one kept
 * from an earlier request, else a new one (NULL: no memory). Any thread. */
cn_line_reader *cn__reader_take(cn__server *s);
/* rd's instances are done with: it is reset and kept for the next request
 * (CN__READERS_KEPT at most, and only one that read at most
 * CN__READER_KEEP_BYTES: body_bytes), else freed. Any thread; NULL: none. */
void cn__reader_give(cn__server *s, cn_line_reader *rd, size_t body_bytes);
/* The readers kept, freed (the server's end). */
void cn__readers_free(cn__server *s);

/* /v1's error body {"error": {...}} (instance < 0: none). */
char *cn__error_body(int code, const char *msg, int instance);

/* versions.c: versions are reference counted. A reference to the version
 * new requests get (NULL: none loaded); the last release frees it. */
cn__model_entry *cn__model_retain(cn__model_slot *sl);
void cn__model_release(cn__model_entry *me);

#endif
