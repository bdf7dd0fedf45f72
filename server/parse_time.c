/* parse_time.c - the parse stage's CPU seconds for the bodies the loop
 * thread parses (http.c infer_ready), read from the thread's CPU clock
 * twice a loop turn rather than twice a body.
 *
 * That clock (CLOCK_THREAD_CPUTIME_ID) is a system call, about 1 us on a
 * busy machine: two reads a body made a fifth of a small body's parse. A
 * loop turn reads it at its first parse and at its end (a check handle,
 * which runs after every I/O callback of the turn); each parse is timed by
 * the monotonic clock (no system call), and counts its wall time times
 * the turn's CPU over wall ratio (at most 1). So the stage stays CPU
 * seconds (a preemption inside a parse is not counted as parse), and
 * canopy_http_seconds_total, the loop's CPU less it, is as before.
 */
#include "handlers.h"

/* The turn's parses into the metrics. */
static void parse_turn_end(cn__server *s) {
  if (!s->parse_open) return;
  double cpu = cn_thread_cpu_s() - s->parse_cpu0;
  double wall = cn_now_s() - s->parse_wall0;
  double k = wall > 0 && cpu < wall ? cpu / wall : 1.0;
  for (int i = 0; i < s->parse_n; i++)
    cn__metrics_stage(&s->metrics, s->parse_model[i], CN__STAGE_PARSE,
                      s->parse_wall[i] * (k > 0 ? k : 0), true);
  s->parse_n = 0;
  s->parse_open = false;
}

static void on_parse_check(uv_check_t *h) {
  uv_check_stop(h);
  parse_turn_end(h->data);
}

/* The turn's first parse reads the CPU clock and arms the check that
 * ends the turn; the others only read the monotonic clock. */
double cn__parse_begin(cn__server *s) {
  if (s->parse_open) return cn_now_s();
  s->parse_cpu0 = cn_thread_cpu_s();
  s->parse_wall0 = cn_now_s();
  s->parse_open = true;
  uv_check_start(&s->parse_check, on_parse_check);
  return s->parse_wall0;
}

/* The parse's wall time, added to its model's in this turn. */
void cn__parse_end(cn__server *s, int model, double t0) {
  double w = cn_now_s() - t0;
  for (int i = 0; i < s->parse_n; i++)
    if (s->parse_model[i] == model) {
      s->parse_wall[i] += w;
      return;
    }
  if (s->parse_n == CN__PARSE_MODELS) { /* many models: a turn of its own */
    double cpu0 = s->parse_cpu0, wall0 = s->parse_wall0;
    parse_turn_end(s);
    s->parse_cpu0 = cpu0; /* the rest of the turn goes on from its start */
    s->parse_wall0 = wall0;
    s->parse_open = true;
  }
  s->parse_model[s->parse_n] = model;
  s->parse_wall[s->parse_n++] = w;
}
