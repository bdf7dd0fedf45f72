/* routes.h - the daemon's routes (docs/api.md). */
#ifndef CANOPY_SERVER_ROUTES_H
#define CANOPY_SERVER_ROUTES_H

#include <jansson.h>

typedef enum {
  CN__RT_NONE = 0,
  CN__RT_LIVE,     /* /healthz, /v2/health/live             GET */
  CN__RT_READY,    /* /readyz, /v2/health/ready             GET */
  CN__RT_METRICS,  /* /metrics                              GET */
  CN__RT_MODELS,   /* /v1/models                            GET */
  CN__RT_MODEL,    /* /v1/models/{model}                    GET */
  CN__RT_INFER,    /* /v1/models/{model}/infer              POST */
  CN__RT_MODEL_READY, /* /v2/models/{model}/ready           GET */
  CN__RT_REPO_INDEX,  /* /v2/repository/index               POST */
  CN__RT_REPO_LOAD,   /* /v2/repository/models/{model}/load   POST */
  CN__RT_REPO_UNLOAD  /* /v2/repository/models/{model}/unload POST */
} cn__route;

struct cn__server;
struct cn__model_entry;
struct cn__model_slot;

/* The route a path names; *sl is the model slot it names, NULL if none
 * or unknown (the caller answers no_such_model); *name, *len the name as
 * written (for a load of a model not seen yet). */
cn__route cn__route_find(struct cn__server *s, const char *path,
                         struct cn__model_slot **sl, const char **name,
                         size_t *len);
/* Body of a GET route; caller frees *body. */
int cn__route_get(struct cn__server *s, cn__route rt,
                  struct cn__model_entry *me, int *status, char **body,
                  const char **ctype);
json_t *cn__model_describe_full(struct cn__server *s,
                                struct cn__model_entry *me);

#endif
