/* test_bodyscan.c - the daemon's pre-count of an infer body
 * (server/bodyscan.c): objects, arrays and "instances" elements, with the
 * cases a byte scanner gets wrong (brackets and quotes inside strings,
 * escaped keys, a value spelled "instances", nested "instances" keys). */
#include <criterion/criterion.h>
#include <string.h>

#include "bodyscan.h"

static cn__body_counts scan(const char *s) {
  cn__body_counts k;
  memset(&k, 0xab, sizeof(k));
  cn__body_scan(s, strlen(s), &k);
  return k;
}

#define EXPECT(s, o, a, n)                                                 \
  do {                                                                     \
    cn__body_counts k_ = scan(s);                                          \
    cr_expect_eq(k_.objects, (size_t)(o), "%s: objects %zu", s,            \
                 k_.objects);                                              \
    cr_expect_eq(k_.arrays, (size_t)(a), "%s: arrays %zu", s, k_.arrays);  \
    cr_expect_eq(k_.instances, (size_t)(n), "%s: instances %zu", s,        \
                 k_.instances);                                            \
  } while (0)

Test(bodyscan, instances_array) {
  EXPECT("{\"instances\":[{},{},{}]}", 4, 1, 3);
  EXPECT(" { \"instances\" : [ ] } ", 1, 1, 0);
  EXPECT("{\"instances\":[1]}", 1, 1, 1);
  EXPECT("{\"instances\":[[1,2],{\"a\":[3,4]}],\"outputs\":\"all\"}", 2, 3,
         2);
}

Test(bodyscan, single_instance_is_one) {
  EXPECT("{\"tree\":\"(a b)\"}", 1, 0, 1);
  EXPECT("{\"tokens\":[\"a\",\"b\"]}", 1, 1, 1);
  EXPECT("[{},{}]", 2, 1, 1); /* not an object: jansson's error decides */
  EXPECT("", 0, 0, 1);
}

Test(bodyscan, strings_hide_brackets_and_quotes) {
  EXPECT("{\"instances\":[{\"tree\":\"( { [ ] } , \\\" , \\\\\"}]}", 2, 1,
         1);
  EXPECT("{\"tokens\":[\"[\",\"{\",\"\\\\\",\",\"]}", 1, 1, 1);
}

Test(bodyscan, the_key_only) {
  /* the key spelled with escapes is the key */
  EXPECT("{\"instan\\u0063es\":[1,2]}", 1, 1, 2);
  EXPECT("{\"\\u0069nstances\":[1,2,3]}", 1, 1, 3);
  /* not the key: a value, a longer or shorter key, a nested key */
  EXPECT("{\"a\":\"instances\",\"b\":[1,2]}", 1, 1, 1);
  EXPECT("{\"instancesx\":[1,2]}", 1, 1, 1);
  EXPECT("{\"instance\":[1,2]}", 1, 1, 1);
  EXPECT("{\"x\":{\"instances\":[1,2,3]},\"instances\":[7]}", 2, 2, 1);
  EXPECT("{\"instances\":{\"a\":[1]}}", 2, 1, 1);
}

Test(bodyscan, any_bytes) {
  /* not JSON: finite counts, no crash (the sanitizer builds check bounds) */
  const char *junk[] = {"]]]]}}}", "\"\\u12", "\"\\uZZ\"[", "{\"instances\":[",
                        "{\"instances\":[1,2", "\"\\", "{{{{[[[["};
  for (size_t i = 0; i < sizeof(junk) / sizeof(junk[0]); i++) {
    cn__body_counts k = scan(junk[i]);
    cr_expect_leq(k.objects + k.arrays, strlen(junk[i]));
  }
  char buf[256];
  for (int i = 0; i < 256; i++) buf[i] = (char)i;
  cn__body_counts k;
  cn__body_scan(buf, sizeof(buf), &k);
  cr_expect_leq(k.objects + k.arrays, sizeof(buf));
}
