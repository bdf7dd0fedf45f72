/* serve_harness.h - start the real `canopy serve` on a free port against
 * freshly initialised models, and talk HTTP/1.1 to it over plain sockets
 * (redis start_server / pipewire PWTEST_ARG_DAEMON style). */
#ifndef CANOPY_TEST_SERVE_HARNESS_H
#define CANOPY_TEST_SERVE_HARNESS_H

#include <jansson.h>
#include <stdbool.h>
#include <sys/types.h>

typedef struct th_daemon {
  pid_t pid;
  int port;
  char dir[256];    /* temp dir: models/ and the daemon's log */
  char log[300];
} th_daemon;

typedef struct th_resp {
  int status;
  char headers[4096];
  char *body;       /* NUL-terminated; free with th_resp_free */
  size_t body_len;
} th_resp;

const char *th_bin(void);
const char *th_data(void);
/* {"instances": [...]} of the first n trees of the data's
 * trees-binary.jsonl (from the start again when it runs out); malloc'd. */
char *th_trees_body(int n);
/* A temp dir holding models/<family> for each listed family. */
void th_models(th_daemon *d, const char *const *families);
/* Starts the daemon with models-dir and port set plus extra flags
 * (NULL-terminated) and waits for /healthz. */
void th_start(th_daemon *d, const char *const *flags);
/* SIGTERM, wait; returns the exit status (or -1 if killed). */
int th_stop(th_daemon *d);
void th_cleanup(th_daemon *d);

int th_connect(int port);
void th_send(int fd, const char *method, const char *path, const char *body,
             const char *headers);
/* Reads one response; returns 0, or -1 on EOF / error. */
int th_read(int fd, th_resp *r);
int th_http(int port, const char *method, const char *path,
            const char *body, const char *headers, th_resp *r);
/* th_http on a fresh connection, expected to be answered `status` (a
 * test failure otherwise, naming the body). */
void th_expect_status(int port, const char *method, const char *path,
                      const char *body, int status);
const char *th_header(const th_resp *r, const char *name, char *buf,
                      size_t n);
void th_resp_free(th_resp *r);
/* Value of one sample line of a /metrics exposition ("name{labels}"). */
double th_metric(const char *text, const char *sample);
/* The same, read from the daemon on port's GET /metrics. */
double th_metric_at(int port, const char *sample);
/* Asserts two JSON values have the same shape, equal strings and numbers
 * within 1e-5; `where` names the field in the failure message. */
void th_expect_json_near(const json_t *a, const json_t *b, const char *where);
char *th_read_file(const char *path);
/* POSTs body to /v1/models/<model>/infer, asserts 200 and returns its
 * "outputs" (a new reference). */
json_t *th_infer_outputs(int port, const char *model, const char *body);

/* Waiting on what the daemon does, never on the clock: each polls (10 ms
 * apart) until the event is seen, and fails the test with what it waited
 * for after TH_DEADLINE_S, a guard against a hang, not a timing. */
#define TH_DEADLINE_S 60.0
/* How many times needle occurs in the daemon's log. */
int th_log_count(const th_daemon *d, const char *needle);
/* Waits until needle occurs at least n times in the daemon's log. */
void th_log_wait(const th_daemon *d, const char *needle, int n);
/* Waits until the sample of /metrics is at least v; returns it. */
double th_metric_wait(int port, const char *sample, double v);
/* The local TCP port of a connected socket: the daemon's debug lines
 * name a connection by it (peer=PORT). */
int th_local_port(int fd);
/* A monotonic clock, seconds. */
double th_now(void);

#endif
