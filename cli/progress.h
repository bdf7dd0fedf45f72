/* progress.h - `canopy run`'s progress line (progress.c). */
#ifndef CANOPY_CLI_PROGRESS_H
#define CANOPY_CLI_PROGRESS_H

#include <stdbool.h>
#include <stdio.h>

/* A progress line on stderr for a long run, so a long run is seen to
 * work rather than hang, only when stderr
 * is a terminal (a log or a pipe reads as before): from `after` seconds
 * in (1, or $CANOPY_PROGRESS_AFTER_S), at most 4 times a second, '\r'
 * rewriting it; erased before a note and before the summary line. */
typedef struct cn__progress {
  bool tty, shown;
  double t0, last, after;
  long long size;  /* the input's bytes when it is a regular file, else 0 */
  FILE *in;
} cn__progress;

void cn__progress_init(cn__progress *p, FILE *in);
/* Erases the line (before a note or the summary). */
void cn__progress_clear(cn__progress *p);
/* Rewrites it with the counts so far (no more than 4 times a second). */
void cn__progress_show(cn__progress *p, long long instances,
                       long long errors);

#endif
