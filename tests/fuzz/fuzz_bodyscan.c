/* fuzz_bodyscan.c - libFuzzer target for the daemon's pre-count of an
 * infer body (server/bodyscan.c): on any bytes it must stay in bounds and
 * terminate; on every body jansson accepts (with the daemon's flags) its
 * counts of objects, arrays and "instances" elements must be exactly
 * jansson's, since infer.c refuses bodies on them before jansson runs. */
#include <jansson.h>

#include "bodyscan.h"
#include "fuzz_common.h"

static void count(const json_t *v, size_t *obj, size_t *arr) {
  if (json_is_object(v)) {
    (*obj)++;
    const char *k;
    json_t *c;
    json_object_foreach((json_t *)v, k, c) count(c, obj, arr);
  } else if (json_is_array(v)) {
    (*arr)++;
    size_t i;
    json_t *c;
    json_array_foreach(v, i, c) count(c, obj, arr);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  cn__body_counts k;
  cn__body_scan((const char *)data, size, &k);
  CHECK(k.objects + k.arrays <= size);
  json_t *j = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES,
                         NULL);
  if (j == NULL) return 0;
  size_t obj = 0, arr = 0;
  count(j, &obj, &arr);
  const json_t *insts = json_is_object(j) ? json_object_get(j, "instances")
                                          : NULL;
  size_t n = json_is_array(insts) ? json_array_size(insts) : 1;
  if (k.objects != obj || k.arrays != arr || k.instances != n) {
    fprintf(stderr, "scan: %zu objects %zu arrays %zu instances; jansson: "
            "%zu %zu %zu\n", k.objects, k.arrays, k.instances, obj, arr, n);
    CHECK(0);
  }
  json_decref(j);
  return 0;
}
