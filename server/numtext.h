/* numtext.h - numbers of an answer's stats as text, fast: see numtext.c. */
#ifndef CANOPY_SERVER_NUMTEXT_H
#define CANOPY_SERVER_NUMTEXT_H

#include <stdbool.h>

#include "canopy_core.h"

/* x written into b exactly as cn_buf_double writes it (the same bytes for
 * every double), without snprintf for 1e-4 <= x < 1e9. */
void cn__buf_ms(cn_buf *b, double x);

#endif
