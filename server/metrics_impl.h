/* metrics_impl.h - what the two halves of the metrics share: the HTTP
 * statuses counted one by one (their index is a request counter's slot).
 *   metrics.c       the counters and their updates;
 *   metrics_text.c  the /metrics page written from them. */
#ifndef CANOPY_SERVER_METRICS_IMPL_H
#define CANOPY_SERVER_METRICS_IMPL_H

#include "metrics.h"

static const int statuses[] = {200, 400, 401, 403, 404, 405, 408, 413,
                               414, 429, 431, 499, 501,
                               500, 503, 504, 0 /* other */};
#define CN__N_STATUS ((int)(sizeof(statuses) / sizeof(statuses[0])))

#endif
