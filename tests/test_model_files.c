/* test_model_files.c - the files a model reads: every path in
 * model.json stays inside its directory, and a load reads one directory
 * whole while it is swapped under it. */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends.h"
#include "families/families.h"
#include "internal.h"
#include "model_test_util.h"

TestSuite(model, .init = tmp_dir_setup, .fini = tmp_dir_teardown);

/* ---- model: the files a model names stay inside its directory -----------
 * Unchecked, "tgt_vocab": "../../outside/secret.txt" would serve a
 * secret's lines as decoded tokens. Absolute paths, '..' past the directory and
 * symlinks that lead out are refused naming the key; a symlink or '..'
 * that stays inside is fine. */
static void init_in(const char *sub, const char *vocab_from, uint64_t seed) {
  cn_model_init_opts o = {.family = "treelstm", .dir = in_dir(sub),
                          .hidden = 8, .embed = 4, .seed = seed,
                          .vocab_from = vocab_from};
  cn_err e;
  cn_err_clear(&e);
  cr_assert_eq(cn_model_init(&o, &e), 0, "%s", e.msg);
}

static void set_key(const char *sub, const char *k, const char *v) {
  char p[300];
  snprintf(p, sizeof(p), "%s/%s/model.json", tmp_dir, sub);
  json_error_t je;
  json_t *j = json_load_file(p, 0, &je);
  cr_assert_not_null(j, "%s", je.text);
  json_object_set_new(j, k, json_string(v));
  cr_assert_eq(json_dump_file(j, p, JSON_INDENT(2)), 0);
  json_decref(j);
}

static int load_sub(const char *sub, cn_model **m, cn_err *e) {
  cn_err_clear(e);
  *m = NULL;
  return cn_model_load(in_dir(sub), m, e);
}

Test(model, paths_in_model_json_stay_inside_the_directory) {
  init_in("m", NULL, 7);
  cr_assert_eq(mkdir(in_dir("m/sub"), 0755), 0);
  /* a secret beside the model directory, shaped as a vocabulary */
  char secret[300];
  snprintf(secret, sizeof(secret), "%s/secret.txt", tmp_dir);
  cr_assert_eq(rename(in_dir("m/vocab.txt"), secret), 0);
  cn_model *m;
  cn_err e;
  static const struct {
    const char *value, *why;
  } bad[] = {{"../secret.txt", "climbs out"},
             {"sub/../../secret.txt", "climbs out"},
             {"/etc/hostname", "absolute path"}};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    set_key("m", "vocab", bad[i].value);
    cr_expect_eq(load_sub("m", &m, &e), CN_E_BAD_MODEL, "%s: %s",
                 bad[i].value, e.msg);
    cr_expect(strstr(e.msg, "key 'vocab'") != NULL, "%s", e.msg);
    cr_expect(strstr(e.msg, bad[i].why) != NULL, "%s", e.msg);
    cn_model_free(m);
  }
  /* a symlink inside that leads out (relative or absolute) */
  const char *links[] = {"../secret.txt", secret};
  for (int i = 0; i < 2; i++) {
    unlink(in_dir("m/v.txt"));
    cr_assert_eq(symlink(links[i], in_dir("m/v.txt")), 0);
    set_key("m", "vocab", "v.txt");
    cr_expect_eq(load_sub("m", &m, &e), CN_E_BAD_MODEL, "%s: %s", links[i],
                 e.msg);
    cr_expect(strstr(e.msg, "key 'vocab'") != NULL, "%s", e.msg);
    cr_expect(strstr(e.msg, "leads outside") != NULL, "%s", e.msg);
    cn_model_free(m);
  }
  /* inside: a plain relative path with '..' that stays in, and a symlink
   * to a file inside */
  char inside[300];
  snprintf(inside, sizeof(inside), "%s/m/sub/real.txt", tmp_dir);
  cr_assert_eq(rename(secret, inside), 0);
  set_key("m", "vocab", "sub/../sub/real.txt");
  cr_expect_eq(load_sub("m", &m, &e), 0, "%s", e.msg);
  cn_model_free(m);
  unlink(in_dir("m/v.txt"));
  cr_assert_eq(symlink("sub/real.txt", in_dir("m/v.txt")), 0);
  set_key("m", "vocab", "v.txt");
  cr_expect_eq(load_sub("m", &m, &e), 0, "%s", e.msg);
  cn_model_free(m);
  /* the weights too: a symlink out of the directory is refused */
  char wout[300];
  snprintf(wout, sizeof(wout), "%s/w.safetensors", tmp_dir);
  cr_assert_eq(rename(in_dir("m/weights.safetensors"), wout), 0);
  cr_assert_eq(symlink(wout, in_dir("m/weights.safetensors")), 0);
  cr_expect_eq(load_sub("m", &m, &e), CN_E_BAD_MODEL, "%s", e.msg);
  cr_expect(strstr(e.msg, "leads outside") != NULL, "%s", e.msg);
  cn_model_free(m);
}

/* ---- model: a load is of one directory, whole ----------------------------
 * Opened by path one after the other, model.json, the vocabulary and the
 * weights could come from two versions when a symlink flips during a load
 * (B's version with A's vocabulary). The directory is opened once: whatever the
 * flips, each load is all A or all B. */
static atomic_int flipping;

static void *flipper(void *arg) {
  (void)arg;
  char tmp[300], link[300];
  snprintf(tmp, sizeof(tmp), "%s/cur.tmp", tmp_dir);
  snprintf(link, sizeof(link), "%s/cur", tmp_dir);
  for (int k = 0; atomic_load(&flipping); k++) {
    unlink(tmp);
    if (symlink(k % 2 ? "b" : "a", tmp) != 0 || rename(tmp, link) != 0)
      break;
  }
  return NULL;
}

Test(model, a_load_racing_a_symlink_flip_is_one_version_whole) {
  /* a: the data's vocabulary; b: the builtin one (another size) */
  init_in("a", data_file("trees-binary.jsonl"), 1);
  init_in("b", NULL, 2);
  set_key("a", "version", "A");
  set_key("b", "version", "B");
  cn_model *m;
  cn_err e;
  cr_assert_eq(load_sub("a", &m, &e), 0, "%s", e.msg);
  int va = cn_vocab_size(m->vocab);
  cn_model_free(m);
  cr_assert_eq(load_sub("b", &m, &e), 0, "%s", e.msg);
  int vb = cn_vocab_size(m->vocab);
  cn_model_free(m);
  cr_assert_neq(va, vb);
  cr_assert_eq(symlink("a", in_dir("cur")), 0);
  atomic_store(&flipping, 1);
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, flipper, NULL), 0);
  int loads[2] = {0, 0};
  for (int i = 0; i < 400; i++) {
    int rc = load_sub("cur", &m, &e);
    cr_expect_eq(rc, 0, "load %d: a torn load: %s", i, e.msg);
    if (rc != 0) continue;
    const char *v = cn_model_named_version(m);
    bool is_a = strcmp(v, "A") == 0;
    loads[is_a ? 0 : 1]++;
    cr_expect_eq(cn_vocab_size(m->vocab), is_a ? va : vb,
                 "load %d: version %s with the other's vocabulary", i, v);
    cn_model_free(m);
  }
  atomic_store(&flipping, 0);
  pthread_join(t, NULL);
  cr_log_info("loads of a: %d, of b: %d", loads[0], loads[1]);
}
