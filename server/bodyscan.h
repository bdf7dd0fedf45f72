/* bodyscan.h - one linear pass over an infer body, before jansson builds
 * it, counting what decides the request's limits and the parse's memory
 * (bodyscan.c). */
#ifndef CANOPY_BODYSCAN_H
#define CANOPY_BODYSCAN_H

#include <stddef.h>

typedef struct cn__body_counts {
  size_t objects;    /* JSON objects, at any depth                      */
  size_t arrays;     /* JSON arrays, at any depth                       */
  size_t instances;  /* elements of the top-level object's "instances"
                        array; 1 when it has no such array             */
} cn__body_counts;

/* Counts b[0..n) (any bytes; it does not validate: on JSON that jansson
 * accepts the counts are exactly jansson's). O(n), no allocation. */
void cn__body_scan(const char *b, size_t n, cn__body_counts *out);

#endif
