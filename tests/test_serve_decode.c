/* test_serve_decode.c - continuous decoding end to end (docs/daemon.md):
 * lstm-nmt requests sent together to a one-worker daemon join its decode
 * session in flight and are answered as their instances finish, with
 * outputs equal, bit for bit, to `canopy run` over the same sentences; a
 * short request sent behind a long one is answered first. The order of
 * events is fixed by the daemon's counters (a request is sent once the
 * sessions counter shows its session running), never by a clock. */
#include <criterion/criterion.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "serve_harness.h"

static th_daemon d;
static const char *INFER = "/v1/models/nmt/infer";
static const char *const no_models[] = {NULL};

static void teardown(void) { th_cleanup(&d); }

/* ---- a model whose outputs vary in length ----
 * A freshly initialised decoder settles on one token; scaled up, its
 * output follows its state, and with </s> favoured sentences stop after 4
 * to 50 steps (as in tests/test_decode.c). The weights file is edited in
 * place through its safetensors header. */
static FILE *wf;
static json_t *whdr;
static long wbase;

static void weights_open(const char *mdir) {
  char path[600];
  snprintf(path, sizeof(path), "%s/weights.safetensors", mdir);
  wf = fopen(path, "r+b");
  cr_assert_not_null(wf, "%s", path);
  unsigned char n8[8];
  cr_assert_eq(fread(n8, 1, 8, wf), 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = n << 8 | n8[i];
  char *h = malloc(n + 1);
  cr_assert_eq(fread(h, 1, n, wf), n);
  h[n] = '\0';
  json_error_t je;
  whdr = json_loads(h, 0, &je);
  cr_assert_not_null(whdr, "%s", je.text);
  free(h);
  wbase = 8 + (long)n;
}

static float *tensor(const char *name, long *off, size_t *n) {
  json_t *t = json_object_get(whdr, name);
  cr_assert_not_null(t, "%s", name);
  json_t *o = json_object_get(t, "data_offsets");
  *off = wbase + (long)json_integer_value(json_array_get(o, 0));
  *n = (size_t)(json_integer_value(json_array_get(o, 1)) -
                json_integer_value(json_array_get(o, 0))) / 4;
  float *v = malloc(*n * sizeof(float));
  cr_assert_eq(fseek(wf, *off, SEEK_SET), 0);
  cr_assert_eq(fread(v, 4, *n, wf), *n);
  return v;
}

static void put(long off, const float *v, size_t n) {
  cr_assert_eq(fseek(wf, off, SEEK_SET), 0);
  cr_assert_eq(fwrite(v, 4, n, wf), n);
}

static void scale(const char *name, float k) {
  long off;
  size_t n;
  float *v = tensor(name, &off, &n);
  for (size_t i = 0; i < n; i++) v[i] *= k;
  put(off, v, n);
  free(v);
}

/* models/nmt (H 32) beside models/<others>, and ref.jsonl: `canopy run`
 * over the first n sentences, hidden states included. */
static void make_models(int n, const char *const *others) {
  th_models(&d, others);
  char cmd[2048], mdir[400];
  snprintf(mdir, sizeof(mdir), "%s/models", d.dir);
  mkdir(mdir, 0755);
  snprintf(mdir, sizeof(mdir), "%s/models/nmt", d.dir);
  snprintf(cmd, sizeof(cmd),
           "%s model init lstm-nmt %s --hidden 32 --embed 32 --seed 7 "
           "--vocab-from %s/sequences.jsonl >/dev/null 2>&1",
           th_bin(), mdir, th_data());
  cr_assert_eq(system(cmd), 0, "%s", cmd);
  weights_open(mdir);
  scale("proj.W", 8.0f);
  scale("tgt_embed", 4.0f);
  scale("dec.W_hh", 4.0f);
  long off;
  size_t nb;
  float *b = tensor("proj.b", &off, &nb);
  b[2] += 1.0f; /* </s> */
  put(off, b, nb);
  free(b);
  fclose(wf);
  json_decref(whdr);
  snprintf(cmd, sizeof(cmd),
           "head -n %d %s/sequences.jsonl > %s/in.jsonl && "
           "%s run --model %s --input %s/in.jsonl --return-hidden "
           "> %s/ref.jsonl 2>/dev/null",
           n, th_data(), d.dir, th_bin(), mdir, d.dir, d.dir);
  cr_assert_eq(system(cmd), 0, "%s", cmd);
}

static void make_model(int n) { make_models(n, no_models); }

static json_t *lines(const char *name) {
  char path[400];
  snprintf(path, sizeof(path), "%s/%s", d.dir, name);
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f, "%s", path);
  json_t *a = json_array();
  char *line = NULL;
  size_t cap = 0;
  while (getline(&line, &cap, f) > 0) {
    json_error_t je;
    json_t *j = json_loads(line, 0, &je);
    cr_assert_not_null(j, "%s: %s", path, je.text);
    json_array_append_new(a, j);
  }
  free(line);
  fclose(f);
  return a;
}

static size_t out_len(const json_t *ref, size_t i) {
  return json_array_size(
      json_object_get(json_array_get(ref, i), "output_ids"));
}

/* {"instances": [in[i], ... in[i + k - 1]], "return_hidden": true} */
static char *body_of(const json_t *in, size_t i, size_t k, int max_len) {
  json_t *insts = json_array();
  for (size_t j = 0; j < k; j++)
    json_array_append(insts, json_array_get(in, i + j));
  json_t *b = json_pack("{s:o, s:b}", "instances", insts, "return_hidden", 1);
  if (max_len > 0)
    json_object_set_new(b, "max_decode_len", json_integer(max_len));
  char *s = json_dumps(b, JSON_COMPACT);
  json_decref(b);
  return s;
}

static double metric_of(const char *sample) {
  return th_metric_at(d.port, sample);
}

#define N_SENT 90

/* A request of the sentences that decode to their cap (50 steps), each
 * eight times (at most 384): a session that outlasts any short request by
 * hundreds of steps. */
static char *long_body(const json_t *in, const json_t *ref) {
  json_t *longs = json_array();
  for (size_t i = 0; i < json_array_size(ref); i++)
    if (out_len(ref, i) >= 50 && json_array_size(longs) < 48)
      json_array_append(longs, json_array_get(in, i));
  size_t nl = json_array_size(longs);
  cr_assert_geq(nl, 8, "sentences that run to the cap");
  for (size_t r = 0; r < 7; r++)
    for (size_t i = 0; i < nl; i++)
      json_array_append(longs, json_array_get(longs, i));
  char *b = body_of(longs, 0, json_array_size(longs), 0);
  json_decref(longs);
  return b;
}

/* Sends the long request on a new connection and waits until its decode
 * session has started (the sessions counter: an order, not a clock). */
static int start_long(const json_t *in, const json_t *ref) {
  char *b = long_body(in, ref);
  int fd = th_connect(d.port);
  th_send(fd, "POST", INFER, b, NULL);
  free(b);
  cr_assert_eq(th_metric_wait(d.port, "canopy_decode_sessions_total", 1), 1);
  return fd;
}

/* A long request starts a session on the one worker; then 60 requests
 * (one to three sentences each) sent at once join it in flight; every
 * output equals `canopy run`'s exactly (json_equal: the same floats). */
Test(serve_decode, concurrent_requests_equal_canopy_run, .fini = teardown,
     .timeout = 120) {
  make_model(N_SENT);
  json_t *in = lines("in.jsonl"), *ref = lines("ref.jsonl");
  cr_assert_eq(json_array_size(ref), N_SENT);
  size_t lo = 1000, hi = 0;
  for (size_t i = 0; i < N_SENT; i++) {
    size_t n = out_len(ref, i);
    lo = n < lo ? n : lo;
    hi = n > hi ? n : hi;
  }
  cr_assert_lt(lo + 10, hi, "output lengths vary (%zu..%zu)", lo, hi);
  const char *flags[] = {"--workers", "1", "--max-instances", "4096", NULL};
  th_start(&d, flags);
  int fl = start_long(in, ref);
  int fd[N_SENT];
  size_t at[N_SENT], cnt[N_SENT];
  int nreq = 0;
  for (size_t i = 0; i < N_SENT; nreq++) {
    size_t k = nreq % 4 == 3 ? 3 : 1;
    if (i + k > N_SENT) k = N_SENT - i;
    at[nreq] = i;
    cnt[nreq] = k;
    char *b = body_of(in, i, k, 0);
    fd[nreq] = th_connect(d.port);
    th_send(fd[nreq], "POST", INFER, b, NULL);
    free(b);
    i += k;
  }
  for (int q = 0; q < nreq; q++) {
    th_resp r;
    cr_assert_eq(th_read(fd[q], &r), 0);
    close(fd[q]);
    cr_assert_eq(r.status, 200, "%s", r.body);
    json_error_t je;
    json_t *o = json_loads(r.body, 0, &je);
    cr_assert_not_null(o, "%s", je.text);
    json_t *outs = json_object_get(o, "outputs");
    cr_assert_eq(json_array_size(outs), cnt[q]);
    for (size_t k = 0; k < cnt[q]; k++)
      cr_expect(json_equal(json_array_get(outs, k),
                           json_array_get(ref, at[q] + k)),
                "sentence %zu differs from canopy run", at[q] + k);
    json_decref(o);
    th_resp_free(&r);
  }
  th_resp lr;
  cr_assert_eq(th_read(fl, &lr), 0);
  cr_expect_eq(lr.status, 200);
  th_resp_free(&lr);
  close(fl);
  cr_expect_geq(metric_of("canopy_decode_sessions_total"), 1);
  double joined = metric_of("canopy_decode_joined_instances_total");
  /* the long request decodes for hundreds of steps after the others were
   * sent: they joined it (all of them, unless this machine stalled the
   * test between two sends for that long) */
  cr_expect_gt(joined, 0, "no sentence joined the session in flight");
  cr_log_info("%g of %d sentences joined in flight", joined, N_SENT);
  cr_expect_gt(metric_of("canopy_decode_early_instances_total"), 0);
  json_decref(in);
  json_decref(ref);
  cr_expect_eq(th_stop(&d), 0);
}

/* A long request (sentences that decode to their cap, 50 steps) starts a
 * session; a one-sentence request that emits </s> within a few steps is
 * sent once the session runs. With continuous decoding the short one
 * joins the long one's session and is answered first, while the long one
 * still decodes (the early metric counts it); with whole-run decoding and
 * one worker it would wait for the long run to end. */
Test(serve_decode, early_eos_is_answered_before_its_run_ends,
     .fini = teardown, .timeout = 120) {
  make_model(N_SENT);
  json_t *in = lines("in.jsonl"), *ref = lines("ref.jsonl");
  int shorts = -1;
  for (size_t i = 0; i < N_SENT && shorts < 0; i++)
    if (out_len(ref, i) > 0 && out_len(ref, i) < 10) shorts = (int)i;
  cr_assert_geq(shorts, 0, "a sentence that stops early");
  char *sb = body_of(in, (size_t)shorts, 1, 0);
  const char *flags[] = {"--workers", "1", "--max-instances", "4096", NULL};
  th_start(&d, flags);
  int fl = start_long(in, ref), fs = th_connect(d.port);
  th_send(fs, "POST", INFER, sb, NULL);
  /* whichever answer comes first (both, if this process was held up
   * long enough: then the early counter below still tells) */
  struct pollfd p[2] = {{.fd = fl, .events = POLLIN},
                        {.fd = fs, .events = POLLIN}};
  cr_assert_eq(poll(p, 2, 60000) > 0, 1);
  cr_expect(p[1].revents & POLLIN, "the short request is answered first");
  th_resp r;
  cr_assert_eq(th_read(fs, &r), 0);
  cr_assert_eq(r.status, 200, "%s", r.body);
  json_t *o = json_loads(r.body, 0, NULL);
  cr_expect(json_equal(json_array_get(json_object_get(o, "outputs"), 0),
                       json_array_get(ref, (size_t)shorts)));
  json_int_t run_s = json_integer_value(
      json_object_get(json_object_get(o, "stats"), "run"));
  json_decref(o);
  th_resp_free(&r);
  cr_assert_eq(th_read(fl, &r), 0);
  cr_assert_eq(r.status, 200, "%s", r.body);
  /* one session: the same run number (the long request's run) */
  o = json_loads(r.body, 0, NULL);
  json_int_t run_l = json_integer_value(
      json_object_get(json_object_get(o, "stats"), "run"));
  cr_expect(run_l >= 1 && run_s == run_l, "runs %lld and %lld",
            (long long)run_s, (long long)run_l);
  json_decref(o);
  th_resp_free(&r);
  close(fl);
  close(fs);
  cr_expect_geq(metric_of("canopy_decode_early_instances_total"), 1);
  free(sb);
  json_decref(in);
  json_decref(ref);
  cr_expect_eq(th_stop(&d), 0);
}

/* continuous-decoding false: runs as before, no session. */
Test(serve_decode, switch_off_runs_whole, .fini = teardown, .timeout = 60) {
  make_model(8);
  json_t *in = lines("in.jsonl"), *ref = lines("ref.jsonl");
  const char *flags[] = {"--continuous-decoding", "false", NULL};
  th_start(&d, flags);
  char *b = body_of(in, 0, 8, 0);
  th_resp r;
  cr_assert_eq(th_http(d.port, "POST", INFER, b, NULL, &r), 0);
  cr_assert_eq(r.status, 200, "%s", r.body);
  json_t *o = json_loads(r.body, 0, NULL);
  for (size_t k = 0; k < 8; k++)
    cr_expect(json_equal(json_array_get(json_object_get(o, "outputs"), k),
                         json_array_get(ref, k)));
  json_decref(o);
  th_resp_free(&r);
  free(b);
  cr_expect_eq(metric_of("canopy_decode_sessions_total"), 0);
  cr_expect_eq(metric_of("canopy_runs_total"), 1);
  json_decref(in);
  json_decref(ref);
  cr_expect_eq(th_stop(&d), 0);
}

/* A session stops taking joins once another model's run waits in the
 * queue: with one worker decoding a long request, a treelstm request
 * queued behind it is served before an lstm-nmt request sent after it,
 * which starts a second session instead of joining the first (else a
 * steady lstm-nmt stream would keep the worker from treelstm). */
Test(serve_decode, another_models_run_ends_the_joins, .fini = teardown,
     .timeout = 120) {
  const char *const tree[] = {"treelstm", NULL};
  make_models(N_SENT, tree);
  json_t *in = lines("in.jsonl"), *ref = lines("ref.jsonl");
  int shorts = -1;
  for (size_t i = 0; i < N_SENT && shorts < 0; i++)
    if (out_len(ref, i) > 0 && out_len(ref, i) < 10) shorts = (int)i;
  cr_assert_geq(shorts, 0);
  const char *flags[] = {"--workers", "1", "--max-instances", "4096", NULL};
  th_start(&d, flags);
  int fl = start_long(in, ref);
  int ft = th_connect(d.port);
  th_send(ft, "POST", "/v1/models/treelstm/infer",
          "{\"instances\":[{\"tree\":\"(3 (2 It) (4 (2 is) (2 fine)))\"}]}",
          NULL);
  /* the worker is busy: the tree's window closes after max-delay-us and
   * its run is queued */
  const char *md = "canopy_window_closes_total{reason=\"max_delay\"}";
  th_metric_wait(d.port, md, 1);
  char *sb = body_of(in, (size_t)shorts, 1, 0);
  int fs = th_connect(d.port);
  th_send(fs, "POST", INFER, sb, NULL);
  free(sb);
  struct pollfd p[2] = {{.fd = ft, .events = POLLIN},
                        {.fd = fs, .events = POLLIN}};
  cr_assert_eq(poll(p, 2, 60000) > 0, 1);
  cr_expect(p[0].revents & POLLIN, "the tree is answered first");
  th_resp r;
  int fds[3] = {ft, fs, fl};
  for (int k = 0; k < 3; k++) {
    cr_assert_eq(th_read(fds[k], &r), 0);
    cr_expect_eq(r.status, 200, "%s", r.body);
    if (k == 1) {
      json_t *o = json_loads(r.body, 0, NULL);
      cr_expect(json_equal(json_array_get(json_object_get(o, "outputs"), 0),
                           json_array_get(ref, (size_t)shorts)));
      json_decref(o);
    }
    th_resp_free(&r);
    close(fds[k]);
  }
  /* the later request did not join the first session: it waited behind
   * the tree (one worker, queue order) and started a session of its own */
  cr_expect_eq(metric_of("canopy_decode_sessions_total"), 2,
               "the later request started a session of its own");
  json_decref(in);
  json_decref(ref);
  cr_expect_eq(th_stop(&d), 0);
}

/* Decoding over logits that overflow (finite weights: proj.W row 0 at
 * +3.4e38, row 1 at -3.4e38, proj.b at FLT_MAX, so one of logits 0 and 1
 * is infinite at every step) once answered 200 with tokens picked by an
 * argmax over infinities. The step's output id is null, and the request
 * 500 non_finite naming output_ids; the other instance of a request fails
 * with it, and the daemon serves on. */
Test(serve_decode, non_finite_logits_are_an_error, .fini = teardown,
     .timeout = 60) {
  make_model(2);
  char mdir[400];
  snprintf(mdir, sizeof(mdir), "%s/models/nmt", d.dir);
  weights_open(mdir);
  long off;
  size_t n;
  float *w = tensor("proj.W", &off, &n);
  json_t *shape = json_object_get(json_object_get(whdr, "proj.W"), "shape");
  size_t cols = (size_t)json_integer_value(json_array_get(shape, 1));
  for (size_t k = 0; k < 2 * cols; k++) w[k] = k < cols ? 3.4e38f : -3.4e38f;
  put(off, w, n);
  free(w);
  float *b = tensor("proj.b", &off, &n);
  for (size_t k = 0; k < n; k++) b[k] = 3.4028235e38f;
  put(off, b, n);
  free(b);
  fclose(wf);
  json_decref(whdr);
  /* the warm-up would refuse the model at load (test_serve_warmup): the
   * request path is what is checked here */
  const char *nowarm[] = {"--warmup", "false", NULL};
  th_start(&d, nowarm);
  json_t *in = lines("in.jsonl");
  char *body = body_of(in, 0, 2, 0);
  for (int round = 0; round < 2; round++) {
    th_resp r;
    cr_assert_eq(th_http(d.port, "POST", INFER, body, NULL, &r), 0);
    cr_expect_eq(r.status, 500, "%s", r.body);
    json_t *j = json_loads(r.body, 0, NULL);
    json_t *e = json_object_get(j, "error");
    cr_expect_str_eq(json_string_value(json_object_get(e, "code")),
                     "non_finite", "%s", r.body);
    const char *msg = json_string_value(json_object_get(e, "message"));
    cr_expect(msg != NULL && strstr(msg, "'output_ids'") != NULL, "%s",
              r.body);
    json_decref(j);
    th_resp_free(&r);
  }
  free(body);
  json_decref(in);
  th_resp r;
  cr_assert_eq(th_http(d.port, "GET", "/healthz", NULL, NULL, &r), 0);
  cr_expect_eq(r.status, 200);
  th_resp_free(&r);
  cr_expect_eq(th_stop(&d), 0);
}
