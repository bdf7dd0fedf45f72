/* main.c - canopy-load: options, the request schedule and the report.
 *
 *   canopy-load --port P --path /v1/models/M/infer --bodies FILE.jsonl
 *               --rate R --duration S [--connections N] [--poisson]
 *
 * The schedule: request k is due at t0 + k/R (uniform) or after
 * exponential gaps of mean 1/R (--poisson, seeded). A 1 ms timer moves
 * every request that has come due into a queue; a free keep-alive
 * connection takes the oldest. The schedule never looks at the server,
 * so a slow server makes the queue, and the latencies, grow (latency runs
 * from the due time, as wrk2 measures it) instead of slowing the offered
 * rate. Requests still queued when the duration ends are reported as
 * not sent; those in flight get --drain-s to finish. --closed drops the
 * schedule: every connection sends again as soon as it is answered (a
 * closed loop, for measuring a peak; latency then runs from the write).
 *
 * stdout: one JSON line (the report); stderr: a summary for people.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "load.h"

static const char *err_names[LD_E_COUNT] = {"connect", "write", "reset",
                                            "parse", "timeout", "unfinished"};

static void usage(FILE *f) {
  fprintf(f,
          "usage: canopy-load --port P --path PATH --bodies FILE --rate R "
          "--duration S\n"
          "                   [--host 127.0.0.1] [--connections 64] "
          "[--poisson] [--seed 1]\n"
          "                   [--timeout-s 30] [--drain-s 10]\n"
          "       canopy-load --closed ... (no --rate): a closed loop, each "
          "connection\n                   sending again once answered "
          "(for a peak)\n"
          "Open loop: POST one body of FILE (one JSON body a line, in turn) "
          "at R requests/s\nfor S seconds over N keep-alive connections; "
          "latency runs from each request's\ndue time. One JSON line on "
          "stdout, a summary on stderr.\n");
}

/* ---- the queue of due requests (a ring of due times) ------------------ */

static int due_push(ld_load *L, uint64_t t) {
  if (L->due_len == L->due_cap) {
    size_t cap = L->due_cap ? 2 * L->due_cap : 1024;
    uint64_t *d = malloc(cap * sizeof(*d));
    if (d == NULL) return -1;
    for (size_t i = 0; i < L->due_len; i++)
      d[i] = L->due[(L->due_head + i) % L->due_cap];
    free(L->due);
    L->due = d;
    L->due_cap = cap;
    L->due_head = 0;
  }
  L->due[(L->due_head + L->due_len) % L->due_cap] = t;
  L->due_len++;
  return 0;
}

static uint64_t due_pop(ld_load *L) {
  uint64_t t = L->due[L->due_head];
  L->due_head = (L->due_head + 1) % L->due_cap;
  L->due_len--;
  return t;
}

/* ---- the schedule ----------------------------------------------------- */

static double uniform01(ld_load *L) { /* xorshift64*, (0, 1] */
  uint64_t x = L->seed;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  L->seed = x;
  return ((x * 2685821657736338717ull) >> 11) * (1.0 / 9007199254740992.0) +
         (1.0 / 9007199254740992.0);
}

static void advance(ld_load *L) {
  if (L->poisson)
    L->next_due += (uint64_t)(-log(uniform01(L)) / L->rate * 1e9);
  else
    L->next_due = L->t0 + (uint64_t)((double)L->scheduled / L->rate * 1e9);
}

/* Send queued requests on idle connections; open closed ones while more
 * requests wait than connections are opening. */
static void ld_dispatch(ld_load *L) {
  if (!L->started || L->finished) return;
  uint64_t now = uv_hrtime();
  if (now >= L->t_end) return; /* what is still queued was not sent */
  if (L->closed_loop) { /* the answer frees the connection for the next */
    while (L->n_idle > 0) {
      L->scheduled++;
      ld_conn_send(L, &L->conns[L->idle[L->n_idle - 1]], now);
    }
    now = uv_hrtime();
    while (L->n_closed > 0 &&
           now >= L->backoff_until)
      ld_conn_connect(L, &L->conns[L->closed[--L->n_closed]]);
    return;
  }
  while (L->due_len > 0 && L->n_idle > 0)
    ld_conn_send(L, &L->conns[L->idle[L->n_idle - 1]], due_pop(L));
  while (L->due_len > (size_t)L->n_connecting && L->n_closed > 0 &&
         now >= L->backoff_until)
    ld_conn_connect(L, &L->conns[L->closed[--L->n_closed]]);
}

static void finish(ld_load *L, uint64_t now) {
  L->finished = 1;
  L->t_done = now;
  L->errors[LD_E_UNFINISHED] += (uint64_t)L->n_busy;
  uv_timer_stop(&L->tick);
  uv_close((uv_handle_t *)&L->tick, NULL);
  for (int i = 0; i < L->n_conns; i++) ld_conn_close(L, &L->conns[i]);
}

static void on_tick(uv_timer_t *t) {
  ld_load *L = t->data;
  uint64_t now = uv_hrtime();
  while (!L->closed_loop && L->next_due < L->t_end && L->next_due <= now) {
    if (due_push(L, L->next_due) != 0) {
      fprintf(stderr, "canopy-load: out of memory\n");
      exit(1);
    }
    L->scheduled++;
    advance(L);
  }
  ld_dispatch(L);
  static unsigned ticks;
  if (++ticks % 100 == 0) ld_conns_check_timeouts(L, now);
  if (now >= L->t_end &&
      (L->n_busy == 0 || now >= L->t_end + (uint64_t)(L->drain_s * 1e9)))
    finish(L, now);
}

/* The first connections are open (or failed): the clock starts. */
static void start(ld_load *L) {
  L->started = 1;
  L->t0 = uv_hrtime();
  L->next_due = L->t0;
  if (L->poisson) advance(L);
  L->t_end = L->t0 + (uint64_t)(L->duration_s * 1e9);
  uv_timer_start(&L->tick, on_tick, 0, 1);
}

static void ld_on_idle(ld_load *L, ld_conn *c) {
  if (!L->started && L->n_connecting == 0) start(L);
  ld_dispatch(L);
}

static void ld_on_closed(ld_load *L, ld_conn *c) {
  if (!L->started && L->n_connecting == 0 && !L->finished) start(L);
  ld_dispatch(L);
}

static void ld_record(ld_load *L, ld_conn *c, int status,
                      uint64_t now) {
  L->responses++;
  if (status < 0 || status >= 600) status = 0;
  L->status[status]++;
  if (status == 429 && c->retry_after) L->retry_after_429++;
  if (status == 200) {
    if (L->n_lat == L->lat_cap) {
      size_t cap = L->lat_cap ? 2 * L->lat_cap : 4096;
      uint64_t *p = realloc(L->lat200, cap * sizeof(*p));
      if (p == NULL) return; /* the count stays right; one sample lost */
      L->lat200 = p;
      L->lat_cap = cap;
    }
    L->lat200[L->n_lat++] = now - c->t_due;
  }
}

/* ---- input and report ------------------------------------------------- */

/* Each non-empty line of path becomes one prepared POST. */
static int load_bodies(ld_load *L, const char *path, const char *url) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    fprintf(stderr, "canopy-load: %s: %s\n", path, strerror(errno));
    return -1;
  }
  char *line = NULL;
  size_t cap = 0, n_cap = 0;
  ssize_t len;
  while ((len = getline(&line, &cap, f)) >= 0) {
    while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
      line[--len] = '\0';
    if (len == 0) continue;
    if (L->n_reqs == n_cap) {
      n_cap = n_cap ? 2 * n_cap : 256;
      uv_buf_t *r = realloc(L->reqs, n_cap * sizeof(*r));
      if (r == NULL) goto oom;
      L->reqs = r;
    }
    char head[1024];
    int hn = snprintf(head, sizeof(head),
                      "POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: "
                      "application/json\r\nContent-Length: %zd\r\n\r\n",
                      url, L->host, L->port, len);
    if (hn < 0 || (size_t)hn >= sizeof(head)) {
      fprintf(stderr, "canopy-load: --path is too long\n");
      goto fail;
    }
    char *req = malloc((size_t)hn + (size_t)len);
    if (req == NULL) goto oom;
    memcpy(req, head, (size_t)hn);
    memcpy(req + hn, line, (size_t)len);
    L->reqs[L->n_reqs++] = uv_buf_init(req, (unsigned)(hn + len));
  }
  free(line);
  fclose(f);
  if (L->n_reqs == 0) {
    fprintf(stderr, "canopy-load: %s holds no body\n", path);
    return -1;
  }
  return 0;
oom:
  fprintf(stderr, "canopy-load: out of memory reading %s\n", path);
fail:
  free(line);
  fclose(f);
  return -1;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static double pct_ms(const ld_load *L, double p) {
  size_t i = (size_t)(p / 100.0 * (double)L->n_lat);
  if (i >= L->n_lat) i = L->n_lat - 1;
  return (double)L->lat200[i] / 1e6;
}

static void report(ld_load *L) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  double cpu = (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
               (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
  double el = L->t_done > L->t0 ? (double)(L->t_done - L->t0) / 1e9 : 0;
  if (L->n_lat) qsort(L->lat200, L->n_lat, sizeof(*L->lat200), cmp_u64);
  uint64_t n_err = 0;
  for (int i = 0; i < LD_E_COUNT; i++) n_err += L->errors[i];

  printf("{\"offered_rps\": %.3f, \"duration_s\": %.3f, \"elapsed_s\": %.3f, "
         "\"connections\": %d, \"poisson\": %s, \"closed\": %s, "
         "\"scheduled\": %llu, "
         "\"sent\": %llu, \"not_sent\": %llu, \"responses\": %llu, "
         "\"sent_rps\": %.3f, \"achieved_rps\": %.3f, \"goodput_rps\": %.3f, "
         "\"status\": {",
         L->rate, L->duration_s, el, L->n_conns, L->poisson ? "true" : "false",
         L->closed_loop ? "true" : "false",
         (unsigned long long)L->scheduled, (unsigned long long)L->sent,
         (unsigned long long)L->due_len, (unsigned long long)L->responses,
         (double)L->sent / L->duration_s,
         el > 0 ? (double)L->responses / el : 0,
         el > 0 ? (double)L->status[200] / el : 0);
  const char *sep = "";
  for (int s = 0; s < 600; s++)
    if (L->status[s]) {
      printf("%s\"%d\": %llu", sep, s, (unsigned long long)L->status[s]);
      sep = ", ";
    }
  printf("}, \"retry_after_429\": %llu, \"latency_ms_200\": ",
         (unsigned long long)L->retry_after_429);
  if (L->n_lat)
    printf("{\"p50\": %.3f, \"p99\": %.3f, \"max\": %.3f}", pct_ms(L, 50),
           pct_ms(L, 99), (double)L->lat200[L->n_lat - 1] / 1e6);
  else
    printf("null");
  printf(", \"errors\": {");
  for (int i = 0; i < LD_E_COUNT; i++)
    printf("%s\"%s\": %llu", i ? ", " : "", err_names[i],
           (unsigned long long)L->errors[i]);
  printf("}, \"cpu_s\": %.3f}\n", cpu);
  fflush(stdout);

  fprintf(stderr,
          "canopy-load: offered %.0f req/s for %.1f s over %d connections "
          "(%s)\n  scheduled %llu, sent %llu, not sent %llu; answered %llu "
          "in %.2f s (%.0f req/s, 200s %.0f/s)\n",
          L->rate, L->duration_s, L->n_conns,
          L->closed_loop ? "closed loop" : L->poisson ? "poisson" : "uniform",
          (unsigned long long)L->scheduled, (unsigned long long)L->sent,
          (unsigned long long)L->due_len, (unsigned long long)L->responses, el,
          el > 0 ? (double)L->responses / el : 0,
          el > 0 ? (double)L->status[200] / el : 0);
  fprintf(stderr, "  status:");
  for (int s = 0; s < 600; s++)
    if (L->status[s])
      fprintf(stderr, " %d x%llu", s, (unsigned long long)L->status[s]);
  fprintf(stderr, "; 429 with Retry-After %llu\n",
          (unsigned long long)L->retry_after_429);
  if (L->n_lat)
    fprintf(stderr, "  200 latency from the %s: p50 %.2f ms, p99 %.2f ms, "
            "max %.2f ms\n", L->closed_loop ? "write" : "due time",
            pct_ms(L, 50), pct_ms(L, 99),
            (double)L->lat200[L->n_lat - 1] / 1e6);
  fprintf(stderr, "  errors %llu", (unsigned long long)n_err);
  for (int i = 0; i < LD_E_COUNT; i++)
    if (L->errors[i])
      fprintf(stderr, " (%s %llu)", err_names[i],
              (unsigned long long)L->errors[i]);
  fprintf(stderr, "; client CPU %.2f s\n", cpu);
}

static int num(const char *s, double lo, double hi, const char *flag,
               double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !(v >= lo && v <= hi)) {
    fprintf(stderr, "canopy-load: %s wants a number in [%g, %g], not '%s'\n",
            flag, lo, hi, s);
    return -1;
  }
  *out = v;
  return 0;
}

int main(int argc, char **argv) {
  static ld_load L;
  const char *path = NULL, *bodies = NULL;
  double port = 0, conns = 64, seed = 1;
  L.host = "127.0.0.1";
  L.timeout_s = 30;
  L.drain_s = 10;
  static const struct option opts[] = {
      {"host", 1, 0, 'h'},    {"port", 1, 0, 'p'},
      {"path", 1, 0, 'u'},    {"bodies", 1, 0, 'b'},
      {"rate", 1, 0, 'r'},    {"duration", 1, 0, 'd'},
      {"connections", 1, 0, 'c'}, {"poisson", 0, 0, 'P'},
      {"seed", 1, 0, 's'},    {"timeout-s", 1, 0, 't'},
      {"drain-s", 1, 0, 'D'}, {"closed", 0, 0, 'C'},
      {"help", 0, 0, 'H'},
      {0, 0, 0, 0}};
  int o, bad = 0;
  while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    switch (o) {
    case 'h': L.host = optarg; break;
    case 'p': bad |= num(optarg, 1, 65535, "--port", &port); break;
    case 'u': path = optarg; break;
    case 'b': bodies = optarg; break;
    case 'r': bad |= num(optarg, 0.001, 1e7, "--rate", &L.rate); break;
    case 'd': bad |= num(optarg, 0.001, 86400, "--duration", &L.duration_s);
      break;
    case 'c': bad |= num(optarg, 1, 60000, "--connections", &conns); break;
    case 'P': L.poisson = 1; break;
    case 'C': L.closed_loop = 1; break;
    case 's': bad |= num(optarg, 0, 1e15, "--seed", &seed); break;
    case 't': bad |= num(optarg, 0.001, 86400, "--timeout-s", &L.timeout_s);
      break;
    case 'D': bad |= num(optarg, 0, 86400, "--drain-s", &L.drain_s); break;
    case 'H': usage(stdout); return 0;
    default: bad = 1;
    }
  }
  if (!bad && (optind < argc || !path || !bodies || port == 0 ||
               (L.rate == 0 && !L.closed_loop) || L.duration_s == 0)) {
    fprintf(stderr, "canopy-load: --port, --path, --bodies, --duration and "
            "--rate (or --closed) are required\n");
    bad = 1;
  }
  if (bad) {
    usage(stderr);
    return 2;
  }
  L.port = (int)port;
  L.n_conns = (int)conns;
  L.seed = (uint64_t)seed * 0x9E3779B97F4A7C15ull + 1;
  int rc = strchr(L.host, ':')
               ? uv_ip6_addr(L.host, L.port, (struct sockaddr_in6 *)&L.addr)
               : uv_ip4_addr(L.host, L.port, (struct sockaddr_in *)&L.addr);
  if (rc != 0) {
    fprintf(stderr, "canopy-load: --host wants a numeric address, not '%s'\n",
            L.host);
    return 2;
  }
  if (load_bodies(&L, bodies, path) != 0) return 2;
  L.loop = uv_default_loop();
  L.on_idle = ld_on_idle;
  L.on_closed = ld_on_closed;
  L.on_response = ld_record;
  if (ld_conns_init(&L) != 0) {
    fprintf(stderr, "canopy-load: out of memory\n");
    return 1;
  }
  uv_timer_init(L.loop, &L.tick);
  L.tick.data = &L;
  /* every connection first; the clock starts when they have answered */
  while (L.n_closed > 0) ld_conn_connect(&L, &L.conns[L.closed[--L.n_closed]]);
  if (L.n_connecting == 0 && !L.started) start(&L);
  uv_run(L.loop, UV_RUN_DEFAULT);
  report(&L);
  return 0;
}
