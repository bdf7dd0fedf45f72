/* serve_harness.c - see serve_harness.h. */
#include "serve_harness.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

const char *th_bin(void) {
  const char *b = getenv("CANOPY_BIN");
  cr_assert(b != NULL, "CANOPY_BIN is not set");
  return b;
}

const char *th_data(void) {
  const char *d = getenv("CANOPY_DATA");
  return d ? d : "data";
}

void th_models(th_daemon *d, const char *const *families) {
  memset(d, 0, sizeof(*d));
  snprintf(d->dir, sizeof(d->dir), "/tmp/canopy-serve-XXXXXX");
  cr_assert(mkdtemp(d->dir) != NULL);
  for (int i = 0; families[i]; i++) {
    char cmd[2048];
    const char *data = strcmp(families[i], "childsum-treelstm") == 0
                           ? "trees-nary.jsonl"
                       : strcmp(families[i], "bilstm-tagger") == 0
                           ? "sequences.jsonl"
                           : "trees-binary.jsonl";
    snprintf(cmd, sizeof(cmd),
             "%s model init %s %s/models/%s --vocab-from %s/%s >/dev/null 2>&1",
             th_bin(), families[i], d->dir, families[i], th_data(), data);
    cr_assert(system(cmd) == 0, "%s", cmd);
  }
}

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof(a);
  cr_assert(bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0);
  getsockname(fd, (struct sockaddr *)&a, &len);
  close(fd);
  return ntohs(a.sin_port);
}

void th_start(th_daemon *d, const char *const *flags) {
  d->port = free_port();
  snprintf(d->log, sizeof(d->log), "%s/serve.log", d->dir);
  char port[16], models[300];
  snprintf(port, sizeof(port), "%d", d->port);
  snprintf(models, sizeof(models), "%s/models", d->dir);
  const char *argv[64] = {th_bin(), "serve", "--port", port,
                          "--models-dir", models};
  int n = 6;
  for (int i = 0; flags && flags[i] && n < 62; i++) argv[n++] = flags[i];
  argv[n] = NULL;
  d->pid = fork();
  cr_assert(d->pid >= 0);
  if (d->pid == 0) {
    /* hermetic: learned policies go to the temp dir, never to ~/.cache */
    char cache[320];
    snprintf(cache, sizeof(cache), "%s/policies", d->dir);
    setenv("CANOPY_POLICY_CACHE", cache, 1);
    FILE *f = freopen(d->log, "w", stderr);
    (void)f;
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  /* polls /healthz until it answers (or the daemon exits) */
  for (double end = th_now() + TH_DEADLINE_S; th_now() < end;) {
    th_resp r;
    if (th_http(d->port, "GET", "/healthz", NULL, NULL, &r) == 0) {
      th_resp_free(&r);
      return;
    }
    int st;
    cr_assert(waitpid(d->pid, &st, WNOHANG) == 0,
              "canopy serve exited early; see %s", d->log);
    usleep(10000);
  }
  cr_assert_fail("canopy serve did not come up in %.0f s; see %s",
                 TH_DEADLINE_S, d->log);
}

int th_stop(th_daemon *d) {
  int st = 0;
  if (d->pid <= 0) return 0;
  kill(d->pid, SIGTERM);
  waitpid(d->pid, &st, 0);
  d->pid = 0;
  int rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  if (rc != 0) { /* the daemon's last words, for the test's log */
    char *log = th_read_file(d->log);
    size_t n = log ? strlen(log) : 0;
    fprintf(stderr, "daemon exit %d (signal %d); its log ends:\n%s\n", rc,
            WIFSIGNALED(st) ? WTERMSIG(st) : 0,
            log ? log + (n > 6000 ? n - 6000 : 0) : "(none)");
    free(log);
  }
  return rc;
}

void th_cleanup(th_daemon *d) {
  if (d->pid > 0) {
    kill(d->pid, SIGKILL);
    waitpid(d->pid, NULL, 0);
  }
  char cmd[300];
  snprintf(cmd, sizeof(cmd), "rm -rf %s", d->dir);
  if (d->dir[0] && system(cmd) != 0) fprintf(stderr, "cannot remove\n");
}

int th_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  struct timeval tv = {.tv_sec = 20};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

static void send_all(int fd, const char *p, size_t n) {
  while (n > 0) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w <= 0) return;
    p += w;
    n -= (size_t)w;
  }
}

void th_send(int fd, const char *method, const char *path, const char *body,
             const char *headers) {
  char head[2048];
  size_t bl = body ? strlen(body) : 0;
  int n = snprintf(head, sizeof(head),
                   "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%s", method, path,
                   headers ? headers : "");
  if (body)
    n += snprintf(head + n, sizeof(head) - (size_t)n,
                  "Content-Type: application/json\r\nContent-Length: "
                  "%zu\r\n",
                  bl);
  n += snprintf(head + n, sizeof(head) - (size_t)n, "\r\n");
  send_all(fd, head, (size_t)n);
  if (body) send_all(fd, body, bl);
}

/* Reads exactly one answer, leaving any that follows in the socket: a
 * head found by peeking (what is consumed is head bytes only), then
 * Content-Length bytes. Reading ahead once dropped a pipelined second
 * answer that arrived in the same segment as the first. */
int th_read(int fd, th_resp *r) {
  memset(r, 0, sizeof(*r));
  size_t cap = 1 << 16, len = 0, hl = 0;
  char *buf = malloc(cap);
  char peek[8192];
  while (hl == 0) {
    ssize_t n = recv(fd, peek, sizeof(peek), MSG_PEEK);
    if (n <= 0) {
      free(buf);
      return -1;
    }
    if (len + (size_t)n + 1 >= cap) buf = realloc(buf, cap = 2 * (len + (size_t)n + 1));
    memcpy(buf + len, peek, (size_t)n);
    size_t from = len > 3 ? len - 3 : 0;
    char *end = memmem(buf + from, len + (size_t)n - from, "\r\n\r\n", 4);
    size_t take = end ? (size_t)(end - buf) + 4 - len : (size_t)n;
    if (recv(fd, buf + len, take, MSG_WAITALL) != (ssize_t)take) {
      free(buf);
      return -1;
    }
    len += take;
    if (end) hl = len;
  }
  size_t copy = hl < sizeof(r->headers) - 1 ? hl : sizeof(r->headers) - 1;
  memcpy(r->headers, buf, copy);
  sscanf(buf, "HTTP/1.1 %d", &r->status);
  char v[32];
  size_t cl = 0;
  if (th_header(r, "Content-Length", v, sizeof(v))) cl = strtoul(v, 0, 10);
  if (hl + cl + 1 >= cap) buf = realloc(buf, cap = hl + cl + 1);
  while (len < hl + cl) {
    ssize_t n = recv(fd, buf + len, hl + cl - len, 0);
    if (n <= 0) break;
    len += (size_t)n;
  }
  r->body = malloc(cl + 1);
  memcpy(r->body, buf + hl, len - hl);
  r->body[len - hl] = '\0';
  r->body_len = len - hl;
  free(buf);
  return 0;
}

int th_http(int port, const char *method, const char *path,
            const char *body, const char *headers, th_resp *r) {
  int fd = th_connect(port);
  if (fd < 0) return -1;
  th_send(fd, method, path, body, headers);
  int rc = th_read(fd, r);
  close(fd);
  return rc;
}

void th_expect_status(int port, const char *method, const char *path,
                      const char *body, int status) {
  th_resp r;
  cr_assert_eq(th_http(port, method, path, body, NULL, &r), 0, "%s %s",
               method, path);
  cr_expect_eq(r.status, status, "%s %s: %d %s", method, path, r.status,
               r.body);
  th_resp_free(&r);
}

const char *th_header(const th_resp *r, const char *name, char *buf,
                      size_t n) {
  size_t nl = strlen(name);
  for (const char *p = strstr(r->headers, "\r\n"); p; p = strstr(p, "\r\n")) {
    p += 2;
    if (strncasecmp(p, name, nl) == 0 && p[nl] == ':') {
      const char *v = p + nl + 1;
      while (*v == ' ') v++;
      size_t k = strcspn(v, "\r\n");
      if (k >= n) k = n - 1;
      memcpy(buf, v, k);
      buf[k] = '\0';
      return buf;
    }
  }
  return NULL;
}

void th_resp_free(th_resp *r) {
  free(r->body);
  r->body = NULL;
}

double th_metric(const char *text, const char *sample) {
  size_t n = strlen(sample);
  for (const char *p = text; p && *p; p = strchr(p, '\n')) {
    if (*p == '\n') p++;
    if (strncmp(p, sample, n) == 0 && p[n] == ' ') return atof(p + n + 1);
  }
  return -1;
}

char *th_read_file(const char *path) {
  FILE *f = fopen(path, "r");
  if (f == NULL) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc((size_t)n + 1);
  size_t got = fread(s, 1, (size_t)n, f);
  s[got] = '\0';
  fclose(f);
  return s;
}

void th_expect_json_near(const json_t *a, const json_t *b, const char *where) {
  if (json_is_number(a) && json_is_number(b)) {
    double x = json_number_value(a), y = json_number_value(b);
    cr_assert(fabs(x - y) <= 1e-5, "%s: %.9g vs %.9g", where, x, y);
    return;
  }
  cr_assert_eq(json_typeof(a), json_typeof(b), "%s: types differ", where);
  if (json_is_array(a)) {
    cr_assert_eq(json_array_size(a), json_array_size(b), "%s", where);
    for (size_t i = 0; i < json_array_size(a); i++)
      th_expect_json_near(json_array_get(a, i), json_array_get(b, i), where);
  } else if (json_is_object(a)) {
    const char *k;
    json_t *v;
    cr_assert_eq(json_object_size(a), json_object_size(b), "%s", where);
    json_object_foreach((json_t *)a, k, v)
      th_expect_json_near(v, json_object_get(b, k), k);
  } else {
    cr_assert(json_equal(a, b), "%s: values differ", where);
  }
}

char *th_trees_body(int n) {
  char path[512];
  snprintf(path, sizeof(path), "%s/trees-binary.jsonl", th_data());
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f, "%s", path);
  size_t cap = 64, len = 0;
  char *b = malloc(cap), line[8192];
  len += (size_t)snprintf(b, cap, "{\"instances\":[");
  for (int k = 0; k < n; k++) {
    if (fgets(line, sizeof(line), f) == NULL) {
      rewind(f);
      cr_assert_not_null(fgets(line, sizeof(line), f));
    }
    line[strcspn(line, "\n")] = '\0';
    size_t need = len + strlen(line) + 4;
    if (need > cap) {
      while (cap < need) cap *= 2;
      b = realloc(b, cap);
    }
    len += (size_t)snprintf(b + len, cap - len, "%s%s", k ? "," : "", line);
  }
  fclose(f);
  snprintf(b + len, cap - len, "]}");
  return b;
}

double th_metric_at(int port, const char *sample) {
  th_resp r;
  cr_assert_eq(th_http(port, "GET", "/metrics", NULL, NULL, &r), 0);
  double v = th_metric(r.body, sample);
  th_resp_free(&r);
  return v;
}

json_t *th_infer_outputs(int port, const char *model, const char *body) {
  char path[300];
  snprintf(path, sizeof(path), "/v1/models/%s/infer", model);
  th_resp r;
  cr_assert_eq(th_http(port, "POST", path, body, NULL, &r), 0);
  cr_assert_eq(r.status, 200, "%d: %s", r.status, r.body);
  json_t *j = json_loads(r.body, 0, NULL);
  cr_assert(j != NULL);
  json_t *outs = json_incref(json_object_get(j, "outputs"));
  json_decref(j);
  th_resp_free(&r);
  return outs;
}

double th_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int th_log_count(const th_daemon *d, const char *needle) {
  char *log = th_read_file(d->log);
  int n = 0;
  size_t k = strlen(needle);
  for (const char *p = log; p && (p = strstr(p, needle)) != NULL; p += k) n++;
  free(log);
  return n;
}

void th_log_wait(const th_daemon *d, const char *needle, int n) {
  for (double end = th_now() + TH_DEADLINE_S; th_now() < end;) {
    if (th_log_count(d, needle) >= n) return;
    usleep(10000);
  }
  cr_assert_fail("waited %.0f s for %d lines with \"%s\" in %s (%d seen)",
                 TH_DEADLINE_S, n, needle, d->log, th_log_count(d, needle));
}

double th_metric_wait(int port, const char *sample, double v) {
  double got = -1;
  for (double end = th_now() + TH_DEADLINE_S; th_now() < end;) {
    if ((got = th_metric_at(port, sample)) >= v) return got;
    usleep(10000);
  }
  cr_assert_fail("waited %.0f s for %s >= %g (it is %g)", TH_DEADLINE_S,
                 sample, v, got);
  return got;
}

int th_local_port(int fd) {
  struct sockaddr_in a;
  socklen_t len = sizeof(a);
  cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
  return ntohs(a.sin_port);
}
