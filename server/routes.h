/* routes.h - the daemon's routes (docs/api.md). */
#ifndef CANOPY_SERVER_ROUTES_H
#define CANOPY_SERVER_ROUTES_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

typedef enum {
  CN__RT_NONE = 0,
  CN__RT_LIVE,     /* /healthz, /v2/health/live             GET */
  CN__RT_READY,    /* /readyz, /v2/health/ready             GET */
  CN__RT_METRICS,  /* /metrics                              GET */
  CN__RT_MODELS,   /* /v1/models                            GET */
  CN__RT_MODEL,    /* /v1/models/{model}                    GET */
  CN__RT_INFER,    /* /v1/models/{model}/infer              POST;
                      /v2/models/{model}[/versions/{v}]/infer (v2) */
  CN__RT_MODEL_READY, /* /v2/models/{model}[/versions/{v}]/ready GET */
  CN__RT_V2_SERVER,   /* /v2: server metadata (kserve.c)       GET */
  CN__RT_V2_MODEL,    /* /v2/models/{model}[/versions/{v}]     GET */
  CN__RT_REPO_INDEX,  /* /v2/repository/index               POST */
  CN__RT_REPO_LOAD,   /* /v2/repository/models/{model}/load   POST */
  CN__RT_REPO_UNLOAD, /* /v2/repository/models/{model}/unload POST */
  CN__RT_V2_LIVE,     /* /v2/health/live: {"live": true}       GET */
  CN__RT_V2_READY,    /* /v2/health/ready: {"ready": true}     GET */
  CN__RT_V2_CONFIG,   /* /v2/models/{model}[/versions/{v}]/config GET */
  CN__RT_V2_STATS     /* /v2/models[/{model}[/versions/{v}]]/stats GET */
} cn__route;

struct cn__server;
struct cn__model_entry;
struct cn__model_slot;

/* What a path names. */
typedef struct cn__route_match {
  cn__route rt;
  bool v2;              /* a path under /v2 (a route or none): the Open
                           Inference Protocol's, its answers and errors
                           are v2's ({"error": message})                 */
  struct cn__model_slot *slot; /* the model named; NULL if none or
                           unknown (the caller answers no_such_model)    */
  const char *name;     /* the name as written (for a load of a model not
                           seen yet), len bytes; NULL: none              */
  size_t len;
  const char *version;  /* /versions/{v} as written, vlen bytes; NULL:
                           none                                          */
  size_t vlen;
} cn__route_match;

/* The route a path names (CN__RT_NONE: none), into *m; the strings point
 * into path. */
cn__route cn__route_find(struct cn__server *s, const char *path,
                         cn__route_match *m);
/* Body of a GET route; caller frees *body. */
int cn__route_get(struct cn__server *s, cn__route rt,
                  struct cn__model_entry *me, int *status, char **body,
                  const char **ctype);

#endif
