/* test_arena.c - memory by liveness, with freed rows poisoned
 * (docs/memory.md): the offset allocator against brute force on random
 * interval sets, every planned run's rows checked for overlap among the
 * rows alive at each batch, and every family's answers, under several
 * policies and both layouts, with reuse and poisoning against the arena
 * that keeps every row: byte for byte. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cells_test_util.h"
#include "engine_util.h"
#include "internal.h"

/* ---- the allocator against brute force ----------------------------------- */

typedef struct blk {
  int t0, t1;        /* taken before step t0, given back after step t1 */
  int64_t size, off; /* floats, multiples of 16 */
  int64_t freed;     /* its front given back so far (partial frees)    */
} blk;

static uint64_t rng = 88172645463325252ull;
static uint64_t next_rand(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

/* Free ranges sorted, disjoint, not adjacent, below the top. */
static void check_free_list(const cn_offset_alloc *a) {
  for (int i = 0; i < a->n; i++) {
    cr_assert_gt(a->len[i], 0);
    cr_assert_leq(a->lo[i] + a->len[i], a->top);
    if (i > 0)
      cr_assert_gt(a->lo[i], a->lo[i - 1] + a->len[i - 1],
                   "free ranges %d and %d touch or overlap", i - 1, i);
  }
  if (a->n > 0) cr_assert_lt(a->lo[a->n - 1] + a->len[a->n - 1], a->top);
}

Test(arena, allocator_against_brute_force) {
  for (int round = 0; round < 400; round++) {
    int n = 1 + (int)(next_rand() % 40), steps = 1 + (int)(next_rand() % 30);
    blk *b = calloc((size_t)n, sizeof(blk));
    for (int i = 0; i < n; i++) {
      b[i].t0 = (int)(next_rand() % (uint64_t)steps);
      b[i].t1 = b[i].t0 + (int)(next_rand() % (uint64_t)(steps - b[i].t0));
      b[i].size = 16 * (int64_t)(1 + next_rand() % 64);
    }
    cn_offset_alloc a = {0};
    int64_t max_live = 0;
    for (int t = 0; t < steps; t++) {
      /* given back after step t - 1: in two pieces, front first, as the
       * planner frees a block's rows group by group */
      for (int i = 0; i < n; i++) {
        if (b[i].t1 != t - 1) continue;
        int64_t half = 16 * (int64_t)(next_rand() % (uint64_t)(b[i].size / 16));
        cr_assert_eq(cn__oalloc_free(&a, b[i].off, half), 0);
        cr_assert_eq(cn__oalloc_free(&a, b[i].off + half, b[i].size - half),
                     0);
        check_free_list(&a);
      }
      for (int i = 0; i < n; i++)
        if (b[i].t0 == t) {
          cr_assert_eq(cn__oalloc_alloc(&a, b[i].size, &b[i].off), 0);
          check_free_list(&a);
        }
      /* brute force: the blocks alive at step t never overlap, and all
       * lie under the peak */
      int64_t live = 0;
      for (int i = 0; i < n; i++) {
        if (b[i].t0 > t || b[i].t1 < t) continue;
        live += b[i].size;
        cr_assert_eq(b[i].off % 16, 0);
        cr_assert_leq(b[i].off + b[i].size, a.peak);
        for (int j = i + 1; j < n; j++) {
          if (b[j].t0 > t || b[j].t1 < t) continue;
          cr_assert(b[i].off + b[i].size <= b[j].off ||
                        b[j].off + b[j].size <= b[i].off,
                    "round %d step %d: blocks %d [%lld, +%lld) and %d "
                    "[%lld, +%lld) overlap", round, t, i,
                    (long long)b[i].off, (long long)b[i].size, j,
                    (long long)b[j].off, (long long)b[j].size);
        }
      }
      cr_assert_eq(a.live, live);
      if (live > max_live) max_live = live;
    }
    cr_assert_geq(a.peak, max_live, "peak below the live sum");
    cr_assert_eq(a.peak_live, max_live);
    /* everything back: nothing left held, the top at 0 */
    for (int i = 0; i < n; i++)
      if (b[i].t1 == steps - 1)
        cr_assert_eq(cn__oalloc_free(&a, b[i].off, b[i].size), 0);
    cr_assert_eq(a.live, 0);
    cr_assert_eq(a.top, 0);
    cr_assert_eq(a.n, 0);
    cn__oalloc_done(&a);
    free(b);
  }
}

/* A block freed in a different order than taken, merging both sides. */
Test(arena, allocator_merges_and_lowers_the_top) {
  cn_offset_alloc a = {0};
  int64_t x, y, z, w;
  cn__oalloc_alloc(&a, 32, &x);
  cn__oalloc_alloc(&a, 16, &y);
  cn__oalloc_alloc(&a, 48, &z);
  cr_assert(x == 0 && y == 32 && z == 48 && a.top == 96);
  cn__oalloc_free(&a, x, 32);
  cn__oalloc_free(&a, z, 48); /* reaches the top: the top comes down */
  cr_assert_eq(a.top, 48);
  cr_assert_eq(a.n, 1);
  cn__oalloc_alloc(&a, 16, &w); /* best fit: the hole at 0 */
  cr_assert_eq(w, 0);
  cn__oalloc_alloc(&a, 64, &w); /* nothing fits: the top grows */
  cr_assert_eq(w, 48);
  cn__oalloc_free(&a, y, 16); /* merges with [16, 32) */
  cr_assert_eq(a.n, 1);
  cr_assert(a.lo[0] == 16 && a.len[0] == 32);
  cr_assert_eq(a.peak, 112);
  cn__oalloc_done(&a);
}

/* ---- planned runs ----------------------------------------------------------- */

/* Brute force over an executed run's plan: each launch's rows consecutive
 * (a batch's, or under a memory budget each slice's),
 * and at every batch the rows alive then (taken at or before it, last
 * read at or after it; the rows the answers read alive to the end) are
 * disjoint and inside the state region. Returns the most floats alive. */
static int64_t check_plan(cn_run *r, const char *what) {
  int32_t B = r->n_batches, nv = r->nv;
  int32_t *bof = malloc((size_t)nv * sizeof(int32_t));
  int32_t *death = malloc((size_t)nv * sizeof(int32_t));
  for (int32_t b = 0; b < B; b++) {
    const cn_run_batch *bt = &r->batches[b];
    int64_t w = r->state_floats[bt->type];
    int32_t rows = r->mem_budget > 0 ? r->slice_rows[b] : bt->n;
    for (int32_t i = 0; i < bt->n; i++) {
      int32_t v = r->order[bt->start + i], i0 = i / rows * rows;
      bof[v] = death[v] = b;
      cr_assert_eq(r->state_off[v],
                   r->state_off[r->order[bt->start + i0]] + (i - i0) * w,
                   "%s: batch %d's rows are not consecutive", what, b);
    }
  }
  for (int32_t v = 0; v < nv; v++) {
    int k;
    const int32_t *in = cn__run_inputs(r, v, &k);
    for (int q = 0; q < k; q++)
      if (bof[v] > death[in[q]]) death[in[q]] = bof[v];
  }
  r->n_spans = 0;
  for (int s = 0; s < r->n_slots; s++) r->fam->reads(r, s);
  for (int64_t i = 0; i < r->n_spans; i++) death[r->spans[i].v] = B;
  r->n_spans = 0;
  int64_t (*iv)[2] = malloc((size_t)nv * sizeof(*iv)), most = 0;
  for (int32_t b = 0; b < B; b++) {
    int n = 0;
    int64_t sum = 0;
    for (int32_t v = 0; v < nv; v++)
      if (bof[v] <= b && death[v] >= b) {
        int64_t w = r->state_floats[r->vtype[v]];
        iv[n][0] = r->state_off[v];
        iv[n][1] = r->state_off[v] + w;
        sum += w;
        cr_assert_leq(iv[n][1], r->scratch_off, "%s: a row past the states",
                      what);
        n++;
      }
    if (sum > most) most = sum;
    for (int i = 1; i < n; i++) /* insertion sort by offset */
      for (int j = i; j > 0 && iv[j][0] < iv[j - 1][0]; j--) {
        int64_t t0 = iv[j][0], t1 = iv[j][1];
        iv[j][0] = iv[j - 1][0], iv[j][1] = iv[j - 1][1];
        iv[j - 1][0] = t0, iv[j - 1][1] = t1;
      }
    for (int i = 1; i < n; i++)
      cr_assert_leq(iv[i - 1][1], iv[i][0],
                    "%s: at batch %d two live rows overlap ([%lld, %lld) "
                    "and [%lld, %lld))", what, b, (long long)iv[i - 1][0],
                    (long long)iv[i - 1][1], (long long)iv[i][0],
                    (long long)iv[i][1]);
  }
  /* every range freed after batch `at` holds only rows dead by then */
  for (int64_t e = 0; e < r->n_frees; e++) {
    const cn_arena_free *fr = &r->frees[e];
    cr_assert_lt(fr->at, B);
    for (int32_t v = 0; v < nv; v++) {
      int64_t lo = r->state_off[v], hi = lo + r->state_floats[r->vtype[v]];
      if (bof[v] <= fr->at && death[v] > fr->at)
        cr_assert(hi <= fr->off || lo >= fr->off + fr->len,
                  "%s: the range [%lld, +%lld) freed after batch %d holds "
                  "vertex %d (batch %d, last read %d)", what,
                  (long long)fr->off, (long long)fr->len, fr->at, v, bof[v],
                  death[v]);
    }
  }
  free(iv);
  free(bof);
  free(death);
  return most;
}

typedef struct outcome {
  json_t *outs; /* the dumps of every instance's output */
  cn_run_stats st;
  bool finite;
  int rc;       /* cn_run_exec's (only CN_E_OVER_BUDGET comes back) */
  char msg[320];
} outcome;

static const cn_family *fake_fam; /* run_all: a family to swap in */
static long long budget;          /* run_all: a memory budget (0: none) */

/* One run of every instance with the arena mode given; outputs dumped to
 * strings (9 significant digits: a float exactly). */
static outcome run_all(const cn_model *m, const json_t *insts,
                       cn_policy_kind pol, unsigned flags, cn_layout layout,
                       bool reuse, bool poison, int64_t slice,
                       const char *what) {
  outcome o = {json_array(), {0}, true, 0, ""};
  cn_backend_ctx *bk = tu_cpu();
  cn_err err;
  cn_err_clear(&err);
  size_t n = json_array_size(insts);
  cn_instance **in = calloc(n, sizeof(*in));
  cn_run *r = cn_run_new(m, bk);
  if (fake_fam != NULL) r->fam = fake_fam;
  cn_run_set_layout(r, layout);
  cn_run_set_arena_reuse(r, reuse);
  cn_run_set_poison(r, poison);
  r->scratch_slice = slice; /* a batch's rows a few at a time */
  cn_run_set_memory_budget(r, budget);
  for (size_t i = 0; i < n; i++) {
    cr_assert_eq(cn_instance_parse(m, json_array_get(insts, i), NULL, (int)i,
                                   &in[i], &err),
                 0, "%s", err.msg);
    cr_assert_eq(cn_run_add(r, in[i], flags, 0), (int)i);
  }
  o.rc = cn_run_exec(r, pol, &err);
  if (o.rc == CN_E_OVER_BUDGET && budget > 0) {
    snprintf(o.msg, sizeof(o.msg), "%s", err.msg);
    n = 0; /* no outputs */
  } else {
    cr_assert_eq(o.rc, 0, "%s: %s", what, err.msg);
  }
  cn_run_get_stats(r, &o.st);
  if (r->reused) {
    int64_t most = check_plan(r, what);
    cr_assert_geq((int64_t)o.st.state_bytes, most * 4,
                  "%s: the state region is below the most alive at once",
                  what);
  }
  for (size_t i = 0; i < n; i++) {
    json_t *out = cn_run_output(r, (int)i);
    cr_assert_not_null(out);
    if (cn_output_check(out, &err) != 0) o.finite = false;
    char *txt = json_dumps(out, JSON_COMPACT | JSON_SORT_KEYS |
                                    JSON_REAL_PRECISION(9));
    json_array_append_new(o.outs, json_string(txt));
    free(txt);
    json_decref(out);
  }
  cn_run_free(r);
  n = json_array_size(insts);
  for (size_t i = 0; i < n; i++) cn_instance_free(in[i]);
  free(in);
  cn_backend_close(bk);
  return o;
}

static const cn_policy_kind policies[] = {CN_POLICY_DEPTH, CN_POLICY_AGENDA,
                                          CN_POLICY_SUFFICIENT,
                                          CN_POLICY_PLAN};

/* Every policy, output set and layout: reuse with poisoning answers as
 * the arena that keeps every row, byte for byte. Returns the share of
 * state bytes reuse saved. */
static double compare_all(const cn_model *m, const json_t *in,
                          const char *name, bool dynamic) {
  const unsigned flag_sets[] = {0, CN_OUT_HIDDEN, CN_OUT_ALL | CN_OUT_HIDDEN};
  const cn_layout layouts[] = {CN_LAYOUT_PQ, CN_LAYOUT_NAIVE};
  size_t saved = 0, total = 0;
  for (size_t p = 0; p < CN_ARRAY_SIZE(policies); p++)
    for (size_t f = 0; f < 3; f++)
      for (size_t l = 0; l < 2; l++) {
        char what[160];
        snprintf(what, sizeof(what), "%s policy %s flags %u layout %s", name,
                 cn_policy_name(policies[p]), flag_sets[f],
                 cn_layout_name(layouts[l]));
        /* want: every row kept, each batch at once; got: rows reused,
         * freed ones poisoned, and every batch executed a few rows at a
         * time (CN__SCRATCH_SLICE_* made tiny) */
        outcome want = run_all(m, in, policies[p], flag_sets[f], layouts[l],
                               false, false, 0, what);
        outcome got = run_all(m, in, policies[p], flag_sets[f], layouts[l],
                              true, true, 256, what);
        cr_expect(want.finite, "%s: a non-finite answer without reuse", what);
        cr_expect(got.finite, "%s: a non-finite answer with reuse and "
                  "poisoning: a row was read after its space was reused",
                  what);
        for (size_t i = 0; i < json_array_size(want.outs); i++)
          cr_expect_str_eq(json_string_value(json_array_get(got.outs, i)),
                           json_string_value(json_array_get(want.outs, i)),
                           "%s instance %zu: reuse answers differently", what,
                           i);
        /* the memory order keeps the policy's batches or merges some */
        cr_expect_eq(want.st.batches, got.st.policy_batches, "%s", what);
        cr_expect_leq(got.st.batches, want.st.batches, "%s", what);
        cr_expect_eq(want.st.state_bytes, want.st.state_bytes_total);
        cr_expect_eq(got.st.state_bytes_total, want.st.state_bytes_total);
        cr_expect_leq(got.st.state_bytes, got.st.state_bytes_total, "%s: %zu > %zu", what, got.st.state_bytes, got.st.state_bytes_total);
        cr_expect_leq(got.st.arena_bytes, want.st.arena_bytes);
        saved += got.st.state_bytes_total - got.st.state_bytes;
        total += got.st.state_bytes_total;
        json_decref(want.outs);
        json_decref(got.outs);
      }
  cr_log_info("%s: reuse saved %zu of %zu state bytes", name, saved, total);
  if (dynamic)
    cr_expect_eq(saved, 0, "%s: a growing graph keeps today's arena", name);
  return total > 0 ? (double)saved / (double)total : 0;
}

Test(arena, every_family_poisoned_equals_no_reuse, .timeout = 300) {
  for (size_t k = 0; k < tu_n_families; k++) {
    char dir[256];
    const tu_family *c = &tu_families[k];
    int H = strcmp(c->family, "mvrnn") == 0 ? 8 : 16;
    cn_model *m = tu_model(c->family, H, H, c->data, dir, sizeof(dir));
    json_t *in = tu_data_lines(c->data, 16);
    compare_all(m, in, c->family, strcmp(c->family, "lstm-nmt") == 0);
    json_decref(in);
    cn_model_free(m);
    tu_rmdir(dir);
  }
}

/* A memory budget: at 60% and 35% of the arena the
 * memory order reaches without one, every planned family fits or says it
 * cannot, answers as without a budget byte for byte with freed rows
 * poisoned, and the policy's batches are where it started. One instance
 * under a budget it cannot meet is refused with the budget named. */
Test(arena, budget_fits_and_answers_alike, .timeout = 300) {
  for (size_t k = 0; k < tu_n_families; k++) {
    const tu_family *c = &tu_families[k];
    if (strcmp(c->family, "lstm-nmt") == 0) continue; /* a growing graph */
    char dir[256], what[160];
    int H = strcmp(c->family, "mvrnn") == 0 ? 8 : 16;
    cn_model *m = tu_model(c->family, H, H, c->data, dir, sizeof(dir));
    json_t *in = tu_data_lines(c->data, 64);
    budget = 0;
    outcome want = run_all(m, in, CN_POLICY_SUFFICIENT, 0, CN_LAYOUT_PQ,
                           true, false, 0, c->family);
    const double shares[] = {0.6, 0.35};
    for (size_t q = 0; q < 2; q++) {
      budget = (long long)(shares[q] * (double)want.st.arena_bytes);
      snprintf(what, sizeof(what), "%s budget %lld (%.0f%%)", c->family,
               budget, shares[q] * 100);
      outcome got = run_all(m, in, CN_POLICY_SUFFICIENT, 0, CN_LAYOUT_PQ,
                            true, true, 0, what);
      if (got.rc == CN_E_OVER_BUDGET) {
        cr_log_info("%s: refused: %s", what, got.msg);
        cr_expect(strstr(got.msg, "budget") != NULL, "%s", got.msg);
        cr_expect_lt(shares[q], 0.5, "%s: refused at 60%%: %s", what,
                     got.msg);
        json_decref(got.outs);
        continue;
      }
      cr_log_info("%s: arena %zu, batches %lld (policy %lld)", what,
                  got.st.arena_bytes, got.st.batches, got.st.policy_batches);
      cr_expect_leq((long long)got.st.arena_bytes, budget, "%s", what);
      cr_expect(got.finite, "%s: a row read after reuse", what);
      cr_expect_eq(got.st.policy_batches, want.st.policy_batches, "%s", what);
      for (size_t i = 0; i < json_array_size(want.outs); i++)
        cr_expect_str_eq(json_string_value(json_array_get(got.outs, i)),
                         json_string_value(json_array_get(want.outs, i)),
                         "%s instance %zu", what, i);
      json_decref(got.outs);
    }
    /* one instance, a budget it cannot meet */
    json_t *one = json_array();
    json_array_append(one, json_array_get(in, 0));
    budget = 256;
    outcome no = run_all(m, one, CN_POLICY_SUFFICIENT, 0, CN_LAYOUT_PQ,
                         true, false, 0, "one instance over budget");
    cr_expect_eq(no.rc, CN_E_OVER_BUDGET, "%s", c->family);
    cr_expect(strstr(no.msg, "memory budget is 256 bytes") != NULL, "%s: %s",
              c->family, no.msg);
    budget = 0;
    json_decref(no.outs);
    json_decref(one);
    json_decref(want.outs);
    json_decref(in);
    cn_model_free(m);
    tu_rmdir(dir);
  }
}

/* bilstm-tagger with a CRF: finish() reads every emission row. */
Test(arena, crf_poisoned_equals_no_reuse) {
  char dir[256], data[512], mdir[300];
  snprintf(dir, sizeof(dir), "/tmp/canopy-arena-XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
  snprintf(data, sizeof(data), "%s/sequences.jsonl", getenv("CANOPY_DATA"));
  snprintf(mdir, sizeof(mdir), "%s/m", dir);
  cn_model_init_opts o = {.family = "bilstm-tagger", .dir = mdir,
                          .hidden = 16, .embed = 16, .classes = 5,
                          .vocab_from = data, .seed = 7, .crf = true};
  cn_err err;
  cn_err_clear(&err);
  cr_assert_eq(cn_model_init(&o, &err), 0, "%s", err.msg);
  cn_model *m = NULL;
  cr_assert_eq(cn_model_load(mdir, &m, &err), 0, "%s", err.msg);
  json_t *in = tu_data_lines("sequences.jsonl", 24);
  compare_all(m, in, "bilstm-tagger crf", false);
  json_decref(in);
  cn_model_free(m);
  tu_rmdir(dir);
}

/* Models described by cells (cells_family.c): a tree, a sequence, a DAG. */
Test(arena, cells_poisoned_equals_no_reuse, .timeout = 300) {
  static const struct {
    const char *family, *data;
  } cs[] = {{"treelstm", "trees-binary.jsonl"},
            {"bilstm-tagger", "sequences.jsonl"},
            {"latticegru", "dags.jsonl"}};
  for (size_t k = 0; k < CN_ARRAY_SIZE(cs); k++) {
    char dir[256], name[64];
    cn_model *ref = tu_model(cs[k].family, 16, 16, cs[k].data, dir,
                             sizeof(dir));
    json_t *j = cells_json(cs[k].family);
    cn_model *m = NULL;
    cn_err e;
    cr_assert_eq(load_cells(dir, j, &m, &e), 0, "%s: %s", cs[k].family,
                 e.msg);
    json_t *in = tu_data_lines(cs[k].data, 24);
    snprintf(name, sizeof(name), "%s as cells", cs[k].family);
    compare_all(m, in, name, false);
    json_decref(in);
    json_decref(j);
    cn_model_free(m);
    cn_model_free(ref);
    tu_rmdir(dir);
  }
}

/* A test that can fail: a family whose reads() names nothing lets its
 * output rows be freed after their batch; poisoning turns the answers
 * non-finite, while without poisoning the freed rows still hold finite
 * values (their own or another vertex's) and the answers would pass. */
static void reads_nothing(cn_run *r, int slot) { (void)r, (void)slot; }

Test(arena, poisoning_catches_a_read_after_free) {
  char dir[256];
  cn_model *m = tu_model("treelstm", 16, 16, "trees-binary.jsonl", dir,
                         sizeof(dir));
  json_t *in = tu_data_lines("trees-binary.jsonl", 16);
  cn_family fake = *m->fam;
  fake.reads = reads_nothing;
  fake_fam = &fake;
  outcome quiet = run_all(m, in, CN_POLICY_AGENDA, 0, CN_LAYOUT_PQ, true,
                          false, 0, "reads nothing");
  outcome loud = run_all(m, in, CN_POLICY_AGENDA, 0, CN_LAYOUT_PQ, true,
                         true, 0, "reads nothing, poisoned");
  fake_fam = NULL;
  outcome want = run_all(m, in, CN_POLICY_AGENDA, 0, CN_LAYOUT_PQ, false,
                         false, 0, "reference");
  cr_expect(quiet.finite, "unpoisoned, the freed rows still look fine");
  cr_expect(want.finite);
  cr_expect(!loud.finite, "poisoned, the freed output rows read NaN");
  json_decref(quiet.outs);
  json_decref(loud.outs);
  json_decref(want.outs);
  json_decref(in);
  cn_model_free(m);
  tu_rmdir(dir);
}

/* docs/memory.md's figure at test size: a tree family's live states are
 * well under all its states. */
Test(arena, trees_need_less_than_all_states) {
  char dir[256];
  cn_model *m = tu_model("treelstm", 16, 16, "trees-binary.jsonl", dir,
                         sizeof(dir));
  json_t *in = tu_data_lines("trees-binary.jsonl", 200);
  outcome o = run_all(m, in, CN_POLICY_SUFFICIENT, 0, CN_LAYOUT_PQ, true,
                      false, 0, "treelstm x200");
  cr_expect_lt(o.st.state_bytes, o.st.state_bytes_total * 3 / 4,
               "%zu of %zu state bytes", o.st.state_bytes,
               o.st.state_bytes_total);
  /* with batches a few rows at a time the scratch shrinks to a slice's,
   * and the answers stay byte for byte */
  outcome s = run_all(m, in, CN_POLICY_SUFFICIENT, 0, CN_LAYOUT_PQ, true,
                      false, 256, "treelstm x200, sliced");
  cr_expect_lt(s.st.arena_bytes - s.st.state_bytes,
               o.st.arena_bytes - o.st.state_bytes,
               "sliced scratch %zu, whole %zu",
               s.st.arena_bytes - s.st.state_bytes,
               o.st.arena_bytes - o.st.state_bytes);
  for (size_t i = 0; i < json_array_size(o.outs); i++)
    cr_expect_str_eq(json_string_value(json_array_get(s.outs, i)),
                     json_string_value(json_array_get(o.outs, i)),
                     "instance %zu: slicing answers differently", i);
  json_decref(s.outs);
  json_decref(o.outs);
  json_decref(in);
  cn_model_free(m);
  tu_rmdir(dir);
}
