/* fuzz_config.c - libFuzzer target for the configuration file parser
 * (`key value` lines, config/config.c): any bytes are loaded over the
 * defaults; a file is either taken whole or refused with a message naming
 * the line, never a crash, leak or overflow (long lines, quotes, NULs). */
#include "config.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static char path[512];
  if (path[0] == '\0')
    snprintf(path, sizeof(path), "%s/canopy.conf", fuzz_tmpdir());
  fuzz_write(path, data, size);
  cn_config c;
  cn_config_defaults(&c);
  cn_err e;
  cn_err_clear(&e);
  if (cn_config_load_file(&c, path, &e) != 0) CHECK(e.msg[0] != '\0');
  else CHECK(c.serve.workers >= 1 && c.serve.port >= 0);
  return 0;
}
