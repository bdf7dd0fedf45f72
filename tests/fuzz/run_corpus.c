/* run_corpus.c - runs LLVMFuzzerTestOneInput over every file of the
 * directories (or files) named on the command line, so a fuzz corpus is a
 * regression test in any build, without clang or libFuzzer. Exits non-zero
 * if a path cannot be read or no input was found; a failed check in the
 * target aborts. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Reads one file and feeds it to the target; -1 if it cannot be read. */
static int run_file(const char *path) {
  int rc = -1;
  FILE *f = fopen(path, "rb");
  uint8_t *buf = NULL;
  if (f == NULL) goto out;
  if (fseek(f, 0, SEEK_END) != 0) goto out;
  long n = ftell(f);
  if (n < 0 || fseek(f, 0, SEEK_SET) != 0) goto out;
  buf = malloc((size_t)n + 1);
  if (buf == NULL || fread(buf, 1, (size_t)n, f) != (size_t)n) goto out;
  LLVMFuzzerTestOneInput(buf, (size_t)n);
  rc = 0;
out:
  if (rc) fprintf(stderr, "run_corpus: cannot read %s\n", path);
  free(buf);
  if (f) fclose(f);
  return rc;
}

int main(int argc, char **argv) {
  int ran = 0, bad = 0;
  for (int a = 1; a < argc; a++) {
    struct stat st;
    if (stat(argv[a], &st) != 0) {
      fprintf(stderr, "run_corpus: no such path %s\n", argv[a]);
      bad++;
      continue;
    }
    if (!S_ISDIR(st.st_mode)) {
      bad += run_file(argv[a]) != 0;
      ran++;
      continue;
    }
    DIR *d = opendir(argv[a]);
    if (d == NULL) {
      bad++;
      continue;
    }
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
      if (de->d_name[0] == '.') continue;
      char path[4096];
      snprintf(path, sizeof(path), "%s/%s", argv[a], de->d_name);
      if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
      bad += run_file(path) != 0;
      ran++;
    }
    closedir(d);
  }
  printf("run_corpus: %d inputs, %d unreadable\n", ran, bad);
  return (bad > 0 || ran == 0) ? 1 : 0;
}
