/* grpc.h - the gRPC front end's two halves (docs/api.md "gRPC"):
 *   grpc.c          HTTP/2 connections (nghttp2) on the loop, the gRPC
 *                   framing of each call, its deadlines, drain (GOAWAY);
 *   grpc_service.c  what each method of inference.GRPCInferenceService
 *                   is: the HTTP/1.1 request of the Open Inference
 *                   Protocol (/v2) it makes, and its answer as the
 *                   method's protobuf message and gRPC status.
 * A call is served by handing that HTTP/1.1 request to an in-memory
 * connection (cn__conn_new_mem), so it is routed, limited, batched,
 * answered, counted and logged by the one path /v1 and /v2 take; grpc.c
 * calls grpc_service.c, never the other way. */
#ifndef CANOPY_SERVER_GRPC_H
#define CANOPY_SERVER_GRPC_H

#include <stddef.h>
#include <stdint.h>

#include "net.h"

/* gRPC status codes (grpc/status.h). */
enum {
  CN__GRPC_OK = 0,
  CN__GRPC_CANCELLED = 1,
  CN__GRPC_UNKNOWN = 2,
  CN__GRPC_INVALID_ARGUMENT = 3,
  CN__GRPC_DEADLINE_EXCEEDED = 4,
  CN__GRPC_NOT_FOUND = 5,
  CN__GRPC_ALREADY_EXISTS = 6,
  CN__GRPC_PERMISSION_DENIED = 7,
  CN__GRPC_RESOURCE_EXHAUSTED = 8,
  CN__GRPC_FAILED_PRECONDITION = 9,
  CN__GRPC_UNIMPLEMENTED = 12,
  CN__GRPC_INTERNAL = 13,
  CN__GRPC_UNAVAILABLE = 14,
  CN__GRPC_UNAUTHENTICATED = 16
};

/* What a call carries besides its message: metadata the daemon passes
 * on as HTTP headers ("" when absent). */
typedef struct cn__grpc_meta {
  char request_id[72];     /* x-request-id                             */
  char authorization[512]; /* authorization (repository-token)        */
  long long timeout_ms;    /* grpc-timeout, rounded up (0: none)       */
} cn__grpc_meta;

/* grpc_service.c */
/* The method a :path names (an index), or -1: not one this daemon serves
 * (UNIMPLEMENTED). */
int cn__grpc_method(const char *path);
const char *cn__grpc_method_name(int method);
/* The HTTP/1.1 request (head and body, *out malloc'd, *out_len bytes)
 * the call's message msg makes. Else a gRPC status (INVALID_ARGUMENT for
 * a message that does not decode or holds what /v2 cannot carry) with
 * why in err. */
int cn__grpc_request(int method, const uint8_t *msg, size_t len,
                     const cn__grpc_meta *meta, char **out, size_t *out_len,
                     char *err, size_t cap);
/* The call's answer from the HTTP/1.1 answer (status line, headers,
 * body): 0 (OK) with the packed response message in *msg (malloc'd,
 * *msg_len bytes), or a gRPC status with its message in err. The
 * answer's X-Request-Id goes to id (cap idcap). */
int cn__grpc_answer(int method, const char *http, size_t n, uint8_t **msg,
                    size_t *msg_len, char *err, size_t cap, char *id,
                    size_t idcap);
/* The gRPC status an HTTP status stands for. */
int cn__grpc_status_of_http(int http_status);

#endif
