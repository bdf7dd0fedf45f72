/* model_test_util.c - see model_test_util.h. */
#include <criterion/criterion.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model_test_util.h"

char tmp_dir[64];

static int rm_one(const char *p, const struct stat *sb, int flag,
                  struct FTW *ftw) {
  return remove(p);
}

void tmp_dir_setup(void) {
  strcpy(tmp_dir, "/tmp/cn_model_XXXXXX");
  cr_assert_not_null(mkdtemp(tmp_dir));
}

void tmp_dir_teardown(void) {
  nftw(tmp_dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

const char *in_dir(const char *name) {
  static char p[4][256];
  static int k;
  k = (k + 1) % 4;
  snprintf(p[k], sizeof(p[k]), "%s/%s", tmp_dir, name);
  return p[k];
}

void put(const char *name, const char *text) {
  FILE *f = fopen(in_dir(name), "wb");
  cr_assert_not_null(f);
  fputs(text, f);
  fclose(f);
}

char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f, "cannot open %s", path);
  static char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  buf[n] = '\0';
  fclose(f);
  return buf;
}

const char *data_file(const char *name) {
  static char p[512];
  const char *d = getenv("CANOPY_DATA");
  cr_assert_not_null(d, "set CANOPY_DATA to the data directory (meson test sets it to the checkout's data/)");
  snprintf(p, sizeof(p), "%s/%s", d, name);
  return p;
}
