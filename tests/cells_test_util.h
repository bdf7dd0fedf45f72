/* cells_test_util.h - what the tests of models described by cells share
 * (test_cells_json.c, test_cells_refused.c). */
#ifndef CANOPY_CELLS_TEST_UTIL_H
#define CANOPY_CELLS_TEST_UTIL_H

#include <jansson.h>

#include "internal.h"

/* tests/cells (CANOPY_CELLS). */
const char *cells_dir(void);
/* tests/cells/NAME.json, parsed. */
json_t *cells_json(const char *name);
void copy_file(const char *from, const char *to);
/* dir/c: model.json = j, with dir/m's vocabulary and (unless dir/c has
 * weights already) its weights. Returns the load's code; *out the model
 * or NULL. */
int load_cells(const char *dir, const json_t *j, cn_model **out,
               cn_err *err);

#endif
