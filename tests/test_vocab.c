/* test_vocab.c - vocabularies: loading, lookup, writing, ranking. */
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

TestSuite(vocab, .init = tmp_dir_setup, .fini = tmp_dir_teardown);

/* ---- vocab --------------------------------------------------------------*/
Test(vocab, load_lookup_lowercase_unk) {
  put("v.txt", "<unk>\nthe\nThe\nfilm\r\nthe\n");
  cn_vocab *v;
  cn_err e;
  cr_assert_eq(cn_vocab_load(in_dir("v.txt"), &v, &e), 0, "%s", e.msg);
  cr_assert_eq(cn_vocab_size(v), 5);
  cr_assert_eq(cn_vocab_lookup(v, "the", 3, false), 1);
  cr_assert_eq(cn_vocab_lookup(v, "The", 3, false), 2);
  cr_assert_eq(cn_vocab_lookup(v, "THE", 3, true), 1);
  cr_assert_eq(cn_vocab_lookup(v, "The", 3, true), 1);
  cr_assert_eq(cn_vocab_lookup(v, "film", 4, false), 3, "\\r not stripped");
  cr_assert_eq(cn_vocab_lookup(v, "FiLm", 4, true), 3);
  cr_assert_eq(cn_vocab_lookup(v, "films", 4, false), 3, "length ignored");
  cr_assert_eq(cn_vocab_lookup(v, "films", 5, false), 0);
  cr_assert_eq(cn_vocab_lookup(v, "", 0, false), 0);
  cr_assert_eq(cn_vocab_lookup(v, "<unk>", 5, false), 0);
  cr_assert_str_eq(cn_vocab_token(v, 3), "film");
  cr_assert_str_eq(cn_vocab_token(v, 4), "the"); /* duplicate keeps its id */
  cr_assert_null(cn_vocab_token(v, 5));
  cr_assert_null(cn_vocab_token(v, -1));
  cn_vocab_free(v);
}

Test(vocab, no_final_newline_and_many_tokens) {
  FILE *f = fopen(in_dir("big.txt"), "wb");
  fputs("<unk>", f);
  for (int i = 1; i < 5000; i++) fprintf(f, "\ntok%d", i);
  fclose(f);
  cn_vocab *v;
  cn_err e;
  cr_assert_eq(cn_vocab_load(in_dir("big.txt"), &v, &e), 0, "%s", e.msg);
  cr_assert_eq(cn_vocab_size(v), 5000);
  char b[16];
  for (int i = 1; i < 5000; i++) {
    int n = snprintf(b, sizeof(b), "TOK%d", i);
    cr_assert_eq(cn_vocab_lookup(v, b, (size_t)n, true), i);
    cr_assert_eq(cn_vocab_lookup(v, b, (size_t)n, false), 0);
  }
  cn_vocab_free(v);
}

Test(vocab, empty_line_is_an_error_naming_it) {
  put("v.txt", "<unk>\na\n\nb\n");
  cn_vocab *v = (cn_vocab *)1;
  cn_err e;
  cr_assert_eq(cn_vocab_load(in_dir("v.txt"), &v, &e), CN_E_BAD_MODEL);
  cr_assert_null(v);
  cr_assert_not_null(strstr(e.msg, "line 3"), "%s", e.msg);
  cr_assert_not_null(strstr(e.msg, "v.txt"), "%s", e.msg);
  put("v.txt", "<unk>\na\n\r\n");
  cr_assert_eq(cn_vocab_load(in_dir("v.txt"), &v, &e), CN_E_BAD_MODEL);
  cr_assert_not_null(strstr(e.msg, "line 3"), "%s", e.msg);
  put("v.txt", "");
  cr_assert_eq(cn_vocab_load(in_dir("v.txt"), &v, &e), CN_E_BAD_MODEL);
  cr_assert_eq(cn_vocab_load(in_dir("none.txt"), &v, &e), CN_E_IO);
  cr_assert_not_null(strstr(e.msg, "none.txt"), "%s", e.msg);
}

Test(vocab, write_then_load_and_from_list) {
  const char *toks[] = {"<unk>", "b", "a", "Ça"};
  cn_err e;
  cr_assert_eq(cn_vocab_write(in_dir("w.txt"), toks, 4, &e), 0, "%s", e.msg);
  cr_assert_str_eq(slurp(in_dir("w.txt")), "<unk>\nb\na\nÇa\n");
  cn_vocab *v, *l;
  cr_assert_eq(cn_vocab_load(in_dir("w.txt"), &v, &e), 0);
  cr_assert_eq(cn_vocab_from_list(toks, 4, &l), 0);
  for (int i = 0; i < 4; i++) {
    cr_assert_eq(cn_vocab_lookup(v, toks[i], strlen(toks[i]), false), i);
    cr_assert_eq(cn_vocab_lookup(l, toks[i], strlen(toks[i]), false), i);
  }
  cn_vocab_free(v);
  cn_vocab_free(l);
  const char *bad[] = {"<unk>", "a\nb"};
  cr_assert_neq(cn_vocab_write(in_dir("x.txt"), bad, 2, &e), 0);
  cr_assert_eq(access(in_dir("x.txt"), F_OK), -1);
}

Test(vocab, rank_by_count_then_bytes) {
  char *bag[] = {strdup("b"), strdup("a"), strdup("c"), strdup("b"),
                 strdup("<unk>"), strdup("a"), strdup(""), strdup("d"),
                 strdup("b")};
  const char *sp[] = {"<unk>"};
  const char **out;
  int n;
  cr_assert_eq(cn__vocab_rank(bag, 9, sp, 1, 4, &out, &n), 0);
  cr_assert_eq(n, 4);
  cr_assert_str_eq(out[0], "<unk>");
  cr_assert_str_eq(out[1], "b"); /* 3 */
  cr_assert_str_eq(out[2], "a"); /* 2 */
  cr_assert_str_eq(out[3], "c"); /* 1, before d */
  free(out);
  for (int i = 0; i < 9; i++) free(bag[i]);
}

/* cn__vocab_lookup_many against cn_vocab_lookup word by word, and both
 * against a linear search of the token list (the reference): tokens of
 * every length around the 4- and 8-byte steps of the comparison, the
 * same bytes in other case, one byte more or less, unknown words, a
 * negative length; 300 words, so several blocks of 64. */
Test(vocab, lookup_many_against_linear_search) {
  enum { NT = 200, NW = 300 };
  char tok[NT][24];
  const char *toks[NT];
  unsigned seed = 7;
  for (int i = 0; i < NT; i++) {
    int l = 1 + i % 19;
    for (int c = 0; c < l; c++) tok[i][c] = "abcXYZ._-"[rand_r(&seed) % 9];
    tok[i][l] = '\0';
    snprintf(tok[i] + (l > 3 ? l - 3 : l), 4, "%03d", i % 1000);
    toks[i] = tok[i];
  }
  toks[0] = "<unk>";
  cn_vocab *v;
  cr_assert_eq(cn_vocab_from_list(toks, NT, &v), 0);
  char buf[NW][32];
  const char *w[NW];
  int32_t len[NW], ids[NW];
  for (int lower = 0; lower < 2; lower++) {
    for (int k = 0; k < NW; k++) {
      const char *t = toks[rand_r(&seed) % NT];
      size_t l = strlen(t);
      memcpy(buf[k], t, l + 1);
      int how = rand_r(&seed) % 5;
      if (how == 1) for (size_t c = 0; c < l; c++) /* other case */
          if (buf[k][c] >= 'a' && buf[k][c] <= 'z') buf[k][c] -= 32;
      if (how == 2) buf[k][l++] = 'q';           /* one byte more */
      if (how == 3 && l > 1) l--;                /* one byte less */
      w[k] = buf[k];
      len[k] = how == 4 && k % 2 ? -1 : (int32_t)l;
    }
    cn__vocab_lookup_many(v, w, len, NW, lower, ids);
    for (int k = 0; k < NW; k++) {
      int want = 0;
      for (int i = 1; len[k] >= 0 && i < NT && want == 0; i++) {
        if (strlen(toks[i]) != (size_t)len[k]) continue;
        int same = 1;
        for (int32_t c = 0; c < len[k] && same; c++) {
          char x = w[k][c];
          if (lower && x >= 'A' && x <= 'Z') x += 32;
          same = x == toks[i][c];
        }
        if (same) want = i;
      }
      cr_assert_eq(ids[k], want, "word %d '%.*s' lower %d: %d, want %d", k,
                   len[k] < 0 ? 0 : len[k], w[k], lower, ids[k], want);
      if (len[k] >= 0)
        cr_assert_eq(cn_vocab_lookup(v, w[k], (size_t)len[k], lower), want);
    }
  }
  cn_vocab_free(v);
}
