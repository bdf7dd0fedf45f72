/* fuzz_common.h - what the libFuzzer targets share: a CHECK that aborts
 * (libFuzzer reports it as a crash), a private temp directory made once
 * per process, and the small models the parsers and loaders run against.
 * Public headers only, so the targets follow the API, not core/'s
 * layout. */
#ifndef CANOPY_FUZZ_COMMON_H
#define CANOPY_FUZZ_COMMON_H

#include <ftw.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "canopy_core.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                        \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__,   \
              #cond);                                                      \
      abort();                                                             \
    }                                                                      \
  } while (0)

static char fuzz_dir_[256];

static inline int fuzz_rm_(const char *p, const struct stat *sb, int flag,
                           struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(p);
}

static inline void fuzz_cleanup_(void) {
  if (fuzz_dir_[0] != '\0') nftw(fuzz_dir_, fuzz_rm_, 16, FTW_DEPTH | FTW_PHYS);
}

/* A fresh directory under $TMPDIR, made on first use, removed at exit. */
static inline const char *fuzz_tmpdir(void) {
  if (fuzz_dir_[0] == '\0') {
    const char *t = getenv("TMPDIR");
    snprintf(fuzz_dir_, sizeof(fuzz_dir_), "%s/canopy-fuzz-XXXXXX",
             t && *t ? t : "/tmp");
    CHECK(mkdtemp(fuzz_dir_) != NULL);
    atexit(fuzz_cleanup_);
  }
  return fuzz_dir_;
}

/* Writes bytes to path (replacing it). */
static inline void fuzz_write(const char *path, const uint8_t *data,
                              size_t size) {
  FILE *f = fopen(path, "wb");
  CHECK(f != NULL);
  CHECK(size == 0 || fwrite(data, 1, size, f) == size);
  CHECK(fclose(f) == 0);
}

/* Writes a lattice lexicon of a few short words to the temp directory;
 * its path goes to lex. */
static inline void fuzz_lexicon(char *lex, size_t len) {
  snprintf(lex, len, "%s/lexicon.txt", fuzz_tmpdir());
  static const char words[] = "ab\nabc\nba\ncat\nthe\n";
  fuzz_write(lex, (const uint8_t *)words, sizeof(words) - 1);
}

/* Makes a small model of family in dir (H = D = 4, C = 3, seed 1, with the
 * lexicon where not NULL) and loads it into *m where m is not NULL: the
 * valid model each target parses or loads against. */
static inline void fuzz_small_model(const char *family, const char *dir,
                                    const char *lexicon, cn_model **m) {
  cn_model_init_opts o = {.family = family, .dir = dir, .hidden = 4,
                          .embed = 4, .classes = 3, .seed = 1,
                          .lexicon = lexicon};
  cn_err e;
  cn_err_clear(&e);
  CHECK(cn_model_init(&o, &e) == 0);
  if (m != NULL) CHECK(cn_model_load(dir, m, &e) == 0);
}

/* Loads the model in dir as the daemon would: the model (which describes
 * itself), or NULL once the refusal is checked to leave no model and to
 * say why. */
static inline cn_model *fuzz_load(const char *dir) {
  cn_model *m = NULL;
  cn_err e;
  cn_err_clear(&e);
  if (cn_model_load(dir, &m, &e) != 0) {
    CHECK(m == NULL && e.msg[0] != '\0');
    return NULL;
  }
  CHECK(m != NULL);
  json_t *d = cn_model_describe(m);
  CHECK(d != NULL);
  json_decref(d);
  return m;
}

#endif
