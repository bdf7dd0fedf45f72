/* fuzz_model.c - libFuzzer target for model directories: model.json and
 * weights.safetensors (docs/models.md). The first byte picks which file
 * the rest replaces in an otherwise valid treelstm directory (even:
 * weights.safetensors, odd: model.json); cn_model_load must then load the
 * whole model or refuse it with an error, never crash, leak or read out of
 * bounds (the safetensors header's offsets, shapes and dtypes, tensor
 * names and sizes, every model.json key, NaN and Inf weights). */
#include "canopy_core.h"
#include "fuzz_common.h"

static char dir[512];

static void make_model(void) {
  snprintf(dir, sizeof(dir), "%s/m", fuzz_tmpdir());
  fuzz_small_model("treelstm", dir, NULL, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (dir[0] == '\0') make_model();
  if (size == 0) return 0;
  char path[600], keep[600];
  const char *file = data[0] & 1 ? "model.json" : "weights.safetensors";
  snprintf(path, sizeof(path), "%s/%s", dir, file);
  snprintf(keep, sizeof(keep), "%s/%s.good", dir, file);
  /* the valid file is kept aside once and put back after each input */
  if (access(keep, F_OK) != 0) CHECK(rename(path, keep) == 0);
  FILE *g = fopen(keep, "rb");
  CHECK(g != NULL);
  fuzz_write(path, data + 1, size - 1);
  cn_model_free(fuzz_load(dir));
  /* restore the valid file */
  char buf[1 << 16];
  FILE *o = fopen(path, "wb");
  CHECK(o != NULL);
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), g)) > 0)
    CHECK(fwrite(buf, 1, n, o) == n);
  fclose(o);
  fclose(g);
  return 0;
}
