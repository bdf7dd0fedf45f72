/* test_devpath.c - the device path of core on a simulated device
 * (tests/devsim.h): for every family, with and without hidden
 * vectors and every output, each run brings to the host exactly the
 * floats its answers print, waits for the device at most twice (plus
 * once per decoder argmax), uploads a batch's index arrays in one copy,
 * allocates nothing when a run of the same size comes again, and answers
 * byte for byte as the plain cpu backend (the simulated kernels read the
 * uploaded copy of the indices, not the host's). */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <stdlib.h>
#include <string.h>

#include "backends.h"
#include "devsim.h"
#include "engine_util.h"

typedef struct one_run {
  json_t *outs;     /* per instance: json_dumps strings as JSON strings */
  cn_run_stats st;
  long long argmax_bytes, argmax_calls, uploads;
  long long copies; /* every upload the simulated device made */
} one_run;

typedef struct started {
  cn_run *r;
  cn_instance **in;
  int *slot;
  size_t s, e;
} started;

/* Adds insts[s, e) to a run and executes it: with async on, on the
 * simulated device, it returns with its answers on their way (the host
 * prepares the next run while the device computes this one). */
static started start_run(cn_backend_ctx *bk, const cn_model *m,
                         const json_t *insts, size_t s, size_t e,
                         unsigned flags, cn_layout layout, bool async) {
  started t = {cn_run_new(m, bk), calloc(e - s, sizeof(cn_instance *)),
               calloc(e - s, sizeof(int)), s, e};
  cn_err err;
  cn_run_set_layout(t.r, layout);
  cn_run_set_async(t.r, async);
  for (size_t i = s; i < e; i++) {
    cn_err_clear(&err);
    cr_assert_eq(cn_instance_parse(m, json_array_get(insts, i), NULL, (int)i,
                                   &t.in[i - s], &err),
                 0, "%s", err.msg);
    t.slot[i - s] = cn_run_add(t.r, t.in[i - s], flags, 0);
    cr_assert_geq(t.slot[i - s], 0);
  }
  cn_err_clear(&err);
  cr_assert_eq(cn_run_exec(t.r, CN_POLICY_AGENDA, &err), 0, "exec: %s",
               err.msg);
  return t;
}

/* Waits for a started run and takes its answers, dumped to strings. */
static one_run finish_run(started *t) {
  one_run o = {json_array(), {0}, 0, 0, 0, 0};
  cn_err err;
  cn_err_clear(&err);
  cr_assert_eq(cn_run_wait(t->r, &err), 0, "wait: %s", err.msg);
  cr_assert_eq(cn_run_wait(t->r, &err), 0, "a second wait is a no-op");
  cn_run_get_stats(t->r, &o.st);
  for (size_t i = t->s; i < t->e; i++) {
    json_t *out = cn_run_output(t->r, t->slot[i - t->s]);
    cr_assert_not_null(out);
    char *txt = json_dumps(out, JSON_COMPACT | JSON_SORT_KEYS |
                                    JSON_REAL_PRECISION(9));
    json_array_append_new(o.outs, json_string(txt));
    free(txt);
    json_decref(out);
  }
  cn_run_free(t->r);
  for (size_t i = 0; i < t->e - t->s; i++) cn_instance_free(t->in[i]);
  free(t->in);
  free(t->slot);
  return o;
}

/* One run of insts[s, e) on bk, waited for at once. */
static one_run run_once(cn_backend_ctx *bk, const cn_model *m,
                        const json_t *insts, size_t s, size_t e,
                        unsigned flags, cn_layout layout) {
  bool sim = !bk->vt->host_memory;
  long long ab = sim ? devsim_argmax_bytes(bk) : 0;
  long long ac = sim ? devsim_argmax_calls(bk) : 0;
  long long up = sim ? devsim_uploads(bk) - devsim_rebuilds(bk) : 0;
  long long all = sim ? devsim_uploads(bk) : 0;
  started t = start_run(bk, m, insts, s, e, flags, layout, false);
  one_run o = finish_run(&t);
  if (sim) {
    o.argmax_bytes = devsim_argmax_bytes(bk) - ab;
    o.argmax_calls = devsim_argmax_calls(bk) - ac;
    o.uploads = devsim_uploads(bk) - devsim_rebuilds(bk) - up;
    o.copies = devsim_uploads(bk) - all;
  }
  return o;
}

ParameterizedTestParameters(devpath, family) {
  return cr_make_param_array(tu_family, tu_families, tu_n_families);
}

ParameterizedTest(tu_family *c, devpath, family, .timeout = 300) {
  cn_backend_ctx *cpu = NULL, *sim = devsim_open();
  cn_err err;
  cn_err_clear(&err);
  cr_assert_eq(cn_backend_open("cpu", 0, &cpu, &err), 0, "%s", err.msg);
  cr_assert_not_null(sim);
  char dir[256];
  int H = strcmp(c->family, "mvrnn") == 0 ? 16 : 32;
  cn_model *m = tu_model(c->family, H, H, c->data, dir, sizeof(dir));
  json_t *in = tu_data_lines(c->data, 48);
  size_t n = json_array_size(in);
  cr_assert_gt(n, 8);
  const unsigned flag_sets[] = {0, CN_OUT_HIDDEN, CN_OUT_ALL | CN_OUT_HIDDEN};
  const size_t runs[][2] = {{0, 1}, {1, 9}, {0, 0}}; /* {0, 0}: all */
  for (int l = 0; l < CN_LAYOUT__COUNT; l++)
    for (size_t f = 0; f < 3; f++)
      for (size_t k = 0; k < 3; k++) {
        size_t s = runs[k][0], e = runs[k][1] ? runs[k][1] : n;
        const char *lay = cn_layout_name((cn_layout)l);
        one_run want = run_once(cpu, m, in, s, e, flag_sets[f], l);
        one_run got = run_once(sim, m, in, s, e, flag_sets[f], l);
        long long floats = 0;
        for (size_t i = 0; i < e - s; i++) {
          const char *a = json_string_value(json_array_get(want.outs, i));
          const char *b = json_string_value(json_array_get(got.outs, i));
          cr_expect_str_eq(b, a, "%s %s flags %u instance %zu: the device "
                           "path answers differently", c->family, lay,
                           flag_sets[f], s + i);
          json_t *o = json_loads(a, 0, NULL);
          floats += tu_answer_floats(o);
          json_decref(o);
        }
        cr_expect_eq(got.st.bytes_to_host - got.argmax_bytes, floats * 4,
                     "%s %s flags %u run [%zu, %zu): %lld bytes to host, "
                     "the answers read %lld", c->family, lay, flag_sets[f],
                     s, e, got.st.bytes_to_host - got.argmax_bytes,
                     floats * 4);
        cr_expect_leq(got.st.device_syncs, 2 + got.argmax_calls,
                      "%s %s: %lld waits for the device in one run (%lld "
                      "argmax)", c->family, lay, got.st.device_syncs,
                      got.argmax_calls);
        cr_expect_gt(got.st.launches, 0);
        /* a batch's index arrays go up in one copy,
         * and the fetch's span table in one more (not counting MV-RNN's
         * pointer arrays with an identity operand, which the device
         * rewrites) */
        cr_expect_leq(got.uploads, got.st.batches + 1,
                      "%s %s flags %u run [%zu, %zu): %lld uploads for "
                      "%lld batches", c->family, lay, flag_sets[f], s, e,
                      got.uploads, (long long)got.st.batches);
        cr_expect_eq(want.st.device_syncs + want.st.bytes_to_host +
                         want.st.launches,
                     0, "cpu counts nothing");
        /* the same run again: nothing allocated */
        one_run again = run_once(sim, m, in, s, e, flag_sets[f], l);
        cr_expect_eq(again.st.device_allocs, 0,
                     "%s %s flags %u run [%zu, %zu): %lld allocations when "
                     "the run comes again", c->family, lay, flag_sets[f], s,
                     e, again.st.device_allocs);
        cr_expect(json_equal(again.outs, got.outs));
        /* warm (no weights to copy): the run's count is its uploads */
        cr_expect_eq(again.st.copies_to_device, again.copies,
                     "%s %s: the run counted %lld copies to the device, "
                     "the device made %lld", c->family, lay,
                     again.st.copies_to_device, again.copies);
        json_decref(want.outs);
        json_decref(got.outs);
        json_decref(again.outs);
      }
  /* idle: the pool goes back */
  cn_backend_counters ctr;
  cn_backend_get_counters(sim, &ctr);
  long long held = ctr.device_bytes;
  cn_backend_release(sim);
  cn_backend_get_counters(sim, &ctr);
  cr_expect_lt(ctr.device_bytes, held, "release gave nothing back");
  json_decref(in);
  cn_model_free(m);
  tu_rmdir(dir);
  cn_backend_close(sim);
  cn_backend_close(cpu);
}

/* lstm-nmt in a decode session (run_decode.c): the outputs equal the cpu
 * backend's, and a session that grows and compacts its arena on the
 * device still answers alike. */
ParameterizedTestParameters(devpath, overlap) {
  return cr_make_param_array(tu_family, tu_families, tu_n_families);
}

/* Four runs on one context, each issued before the one before it is
 * waited for (what `canopy run` does): every run answers byte for byte as
 * the cpu backend, counts only its own transfers and waits, and no answer
 * can be read before its wait (the simulated fetch buffer holds NaN until
 * then, and cn_run_output gives NULL). */
ParameterizedTest(tu_family *c, devpath, overlap, .timeout = 300) {
  cn_backend_ctx *cpu = NULL, *sim = devsim_open();
  cn_err err;
  cn_err_clear(&err);
  cr_assert_eq(cn_backend_open("cpu", 0, &cpu, &err), 0, "%s", err.msg);
  char dir[256];
  int H = strcmp(c->family, "mvrnn") == 0 ? 16 : 32;
  cn_model *m = tu_model(c->family, H, H, c->data, dir, sizeof(dir));
  json_t *in = tu_data_lines(c->data, 40);
  size_t n = json_array_size(in);
  cr_assert_geq(n, 20);
  bool dyn = strcmp(c->family, "lstm-nmt") == 0; /* async is a no-op */
  const size_t runs[][2] = {{0, 9}, {9, 10}, {10, 20}, {0, 20}};
  for (int f = 0; f < 2; f++) {
    unsigned flags = f ? CN_OUT_ALL | CN_OUT_HIDDEN : 0;
    started t[4];
    one_run got[4];
    t[0] = start_run(sim, m, in, runs[0][0], runs[0][1], flags,
                     CN_LAYOUT_PQ, true);
    for (int k = 0; k < 4; k++) {
      if (k + 1 < 4)
        t[k + 1] = start_run(sim, m, in, runs[k + 1][0], runs[k + 1][1],
                             flags, CN_LAYOUT_PQ, true);
      if (!dyn)
        cr_expect_null(cn_run_output(t[k].r, t[k].slot[0]),
                       "%s: an answer before the run's wait", c->family);
      got[k] = finish_run(&t[k]);
    }
    for (int k = 0; k < 4; k++) {
      one_run want = run_once(cpu, m, in, runs[k][0], runs[k][1], flags,
                              CN_LAYOUT_PQ);
      long long floats = 0;
      for (size_t i = 0; i < runs[k][1] - runs[k][0]; i++) {
        const char *a = json_string_value(json_array_get(want.outs, i));
        const char *b = json_string_value(json_array_get(got[k].outs, i));
        cr_expect_str_eq(b, a, "%s flags %u run %d instance %zu: overlapped "
                         "runs answer differently", c->family, flags, k, i);
        json_t *o = json_loads(a, 0, NULL);
        floats += tu_answer_floats(o);
        json_decref(o);
      }
      if (!dyn) {
        cr_expect_eq(got[k].st.bytes_to_host, floats * 4,
                     "%s flags %u run %d: %lld bytes to host, the answers "
                     "read %lld", c->family, flags, k,
                     got[k].st.bytes_to_host, floats * 4);
        cr_expect_leq(got[k].st.device_syncs, 2, "%s run %d: %lld waits",
                      c->family, k, got[k].st.device_syncs);
      }
      json_decref(want.outs);
      json_decref(got[k].outs);
    }
  }
  json_decref(in);
  cn_model_free(m);
  tu_rmdir(dir);
  cn_backend_close(sim);
  cn_backend_close(cpu);
}

Test(devpath, decode_session, .timeout = 300) {
  cn_backend_ctx *cpu = NULL, *sim = devsim_open();
  cn_err err;
  cn_err_clear(&err);
  cr_assert_eq(cn_backend_open("cpu", 0, &cpu, &err), 0, "%s", err.msg);
  char dir[256];
  cn_model *m = tu_model("lstm-nmt", 32, 32, "sequences.jsonl", dir,
                         sizeof(dir));
  json_t *in = tu_data_lines("sequences.jsonl", 200);
  size_t n = json_array_size(in);
  char *text[2][256] = {{0}};
  cr_assert_leq(n, 256);
  cn_backend_ctx *bks[2] = {cpu, sim};
  for (int b = 0; b < 2; b++) {
    cn_decode *d = cn_decode_new(m, bks[b], CN_POLICY_AGENDA, NULL);
    cn_instance **inst = calloc(n, sizeof(*inst));
    size_t added = 0;
    while (added < n || cn_decode_active(d) > 0) {
      for (int k = 0; k < 3 && added < n; k++, added++) { /* a stream */
        cr_assert_eq(cn_instance_parse(m, json_array_get(in, added), NULL,
                                       (int)added, &inst[added], &err),
                     0);
        cr_assert_eq(cn_decode_add(d, inst[added], CN_OUT_HIDDEN, 0),
                     (int)added);
      }
      cr_assert_geq(cn_decode_step(d, &err), 0, "%s", err.msg);
      int done[8], got;
      while ((got = cn_decode_take_done(d, done, 8)) > 0)
        for (int i = 0; i < got; i++) {
          json_t *o = cn_decode_output(d, done[i]);
          cr_assert_not_null(o, "slot %d", done[i]);
          text[b][done[i]] = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS |
                                               JSON_REAL_PRECISION(9));
          json_decref(o);
        }
    }
    cn_decode_free(d);
    for (size_t i = 0; i < n; i++) cn_instance_free(inst[i]);
    free(inst);
  }
  for (size_t i = 0; i < n; i++) {
    cr_assert_not_null(text[1][i]);
    cr_expect_str_eq(text[1][i], text[0][i], "instance %zu", i);
    free(text[0][i]);
    free(text[1][i]);
  }
  json_decref(in);
  cn_model_free(m);
  tu_rmdir(dir);
  cn_backend_close(sim);
  cn_backend_close(cpu);
}

/* The device path's figures on the simulated device (docs/benchmarks.md):
 * a run of (up to) 1,024 instances of CANOPY_DEVPATH_FAMILY (default
 * treelstm) at H = CANOPY_DEVPATH_H (default 128; 512 as on the GPU's
 * tables), root outputs,
 * on a device that stages each batch's indices in one upload and one that
 * does not (CANOPY_CUDA_BATCH_STAGING=0, as the cuda backend). Without
 * fetch_rows every state would come back (Σ state floats); with it, the
 * root logits. Printed; the assertions are only that the answers read less
 * than a hundredth of the states (trees) and that staging the batch
 * makes fewer uploads and the same answers. */
Test(devpath, report, .timeout = 600) {
  const char *hs = getenv("CANOPY_DEVPATH_H");
  const char *fam = getenv("CANOPY_DEVPATH_FAMILY");
  int H = hs != NULL ? atoi(hs) : 128;
  if (fam == NULL) fam = "treelstm";
  const char *data = tu_data_for(fam);
  cr_assert_not_null(data, "no family %s", fam);
  bool tree = strstr(data, "trees-") == data;
  char dir[256];
  cn_model *m = tu_model(fam, H, H, data, dir, sizeof(dir));
  json_t *in = tu_data_lines(data, 1024);
  for (size_t i = 0, have = json_array_size(in); have > 0 &&
       json_array_size(in) < 1024; i = (i + 1) % have) /* the data again */
    json_array_append(in, json_array_get(in, i));
  size_t n = json_array_size(in);
  json_t *answers[2] = {NULL, NULL};
  long long ups[2] = {0, 0};
  for (int staged = 0; staged < 2; staged++) {
    if (!staged) setenv("CANOPY_CUDA_BATCH_STAGING", "0", 1);
    cn_backend_ctx *sim = devsim_open();
    unsetenv("CANOPY_CUDA_BATCH_STAGING");
    one_run w = run_once(sim, m, in, 0, n, 0, CN_LAYOUT_PQ); /* warm */
    json_decref(w.outs);
    long long up0 = devsim_uploads(sim);
    one_run o = run_once(sim, m, in, 0, n, 0, CN_LAYOUT_PQ);
    long long uploads = devsim_uploads(sim) - up0;
    ups[staged] = uploads;
    answers[staged] = o.outs;
    /* the states the old copy-back brought: every vertex's row */
    long long nodes = 0;
    for (size_t i = 0; tree && i < n; i++) {
      const json_t *t = json_array_get(in, i);
      const char *s = json_string_value(json_object_get(t, "tree"));
      for (; s != NULL && *s; s++) nodes += *s == '(';
    }
    long long states = (nodes * 2 * H + (long long)n * 5) * 4;
    char all[64] = "";
    if (tree) snprintf(all, sizeof(all), " (all states: ~%lld)", states);
    fprintf(stderr,
            "devsim %s H=%d run of %zu, indices %s: bytes to host %lld%s, "
            "syncs %lld, allocs %lld, batches %lld, launches %lld (%.2f a "
            "batch), uploads %lld (%.2f a batch), bytes to device %lld\n",
            fam, H, n, staged ? "a batch at once" : "a call at a time",
            o.st.bytes_to_host, all,
            o.st.device_syncs, o.st.device_allocs, o.st.batches,
            o.st.launches, (double)o.st.launches / (double)o.st.batches,
            uploads, (double)uploads / (double)o.st.batches,
            o.st.bytes_to_device);
    if (tree)
      cr_expect_lt(o.st.bytes_to_host * 100, states);
    cn_backend_close(sim);
  }
  cr_expect(json_equal(answers[0], answers[1]));
  cr_expect_lt(ups[1], ups[0]);
  json_decref(answers[0]);
  json_decref(answers[1]);
  json_decref(in);
  cn_model_free(m);
  tu_rmdir(dir);
}
