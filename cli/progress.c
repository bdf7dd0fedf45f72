/* progress.c - `canopy run`'s progress line on a terminal:
 * what it shows and when is in progress.h. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "canopy_core.h"
#include "progress.h"


void cn__progress_init(cn__progress *p, FILE *in) {
  memset(p, 0, sizeof(*p));
  p->tty = isatty(STDERR_FILENO);
  p->t0 = cn_now_s();
  p->after = 1.0;
  const char *a = getenv("CANOPY_PROGRESS_AFTER_S");
  if (a != NULL && a[0] != '\0') p->after = atof(a);
  p->in = in;
  struct stat st;
  if (fstat(fileno(in), &st) == 0 && S_ISREG(st.st_mode))
    p->size = (long long)st.st_size;
}

void cn__progress_clear(cn__progress *p) {
  if (p->shown) fputs("\r\033[K", stderr);
  p->shown = false;
}

void cn__progress_show(cn__progress *p, long long instances,
                       long long errors) {
  double now = cn_now_s();
  if (!p->tty || now - p->t0 < p->after || now - p->last < 0.25) return;
  p->last = now;
  char pct[32] = "";
  long pos = p->size > 0 ? ftell(p->in) : -1;
  if (pos >= 0)
    snprintf(pct, sizeof(pct), ", %.0f%% read", 100.0 * (double)pos /
             (double)p->size);
  fprintf(stderr, "\r\033[Kcanopy run: %lld instances, %lld errors, "
          "%.0f/s%s", instances, errors,
          (double)instances / (now - p->t0), pct);
  fflush(stderr);
  p->shown = true;
}
