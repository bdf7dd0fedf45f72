/* test_safetensors.c - the weights file reader/writer (core/safetensors.c).
 *
 * Round trips through the writer, then hand-built files that break one rule
 * each: every one must be refused with a message naming the file and the
 * tensor at fault. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

static char dir[64];
static char path[128];

static void setup(void) {
  strcpy(dir, "/tmp/cn_st_XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
  snprintf(path, sizeof(path), "%s/w.safetensors", dir);
}

static void teardown(void) {
  char tmp[160];
  snprintf(tmp, sizeof(tmp), "%s.tmp", path);
  unlink(path);
  unlink(tmp);
  rmdir(dir);
}

TestSuite(safetensors, .init = setup, .fini = teardown);

/* A file with the given header text and data bytes; pad: add spaces to
 * the header so the data section starts at a multiple of 8. */
static void write_hdr(const char *hdr, const void *data, size_t dlen,
                      bool pad) {
  FILE *f = fopen(path, "wb");
  cr_assert_not_null(f);
  uint64_t hl = strlen(hdr), spaces = pad ? (8 - (8 + hl) % 8) % 8 : 0;
  hl += spaces;
  unsigned char b[8];
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)(hl >> (8 * i));
  fwrite(b, 1, 8, f);
  fwrite(hdr, 1, hl - spaces, f);
  for (uint64_t i = 0; i < spaces; i++) fputc(' ', f);
  if (dlen) fwrite(data, 1, dlen, f);
  fclose(f);
}

static void write_raw(const char *hdr, const void *data, size_t dlen) {
  write_hdr(hdr, data, dlen, true);
}

/* Opening must fail with CN_E_BAD_MODEL and a message holding each of the
 * given fragments. */
static void expect_bad(const char *frag1, const char *frag2) {
  cn_safetensors st;
  cn_err e;
  cn_err_clear(&e);
  int rc = cn_safetensors_open(path, &st, &e);
  cr_assert_eq(rc, CN_E_BAD_MODEL, "rc %d, msg: %s", rc, e.msg);
  cr_assert_eq(e.code, CN_E_BAD_MODEL);
  cr_assert_not_null(strstr(e.msg, path), "no file name in: %s", e.msg);
  if (frag1)
    cr_assert_not_null(strstr(e.msg, frag1), "no '%s' in: %s", frag1, e.msg);
  if (frag2)
    cr_assert_not_null(strstr(e.msg, frag2), "no '%s' in: %s", frag2, e.msg);
  cr_assert_null(st.bytes);
  cr_assert_null(st.tensors);
  cn_safetensors_close(&st);
}

static float zeros[64];

Test(safetensors, round_trip) {
  float a[6] = {1, 2, 3, 4, 5, 6}, b[3] = {-1.5f, 0.25f, 1e-7f}, c[24];
  for (int i = 0; i < 24; i++) c[i] = (float)i * 0.5f;
  cn_tensor_out t[] = {
      {"zeta.W", 2, {2, 3}, a}, {"alpha.b", 1, {3}, b},
      {"leaf.M", 3, {2, 3, 4}, c}, {"scalar", 0, {0}, b},
  };
  cn_err e;
  cn_err_clear(&e);
  cr_assert_eq(cn_safetensors_write(path, t, 4, &e), 0, "%s", e.msg);
  cr_assert_neq(access(path, F_OK), -1);
  char tmp[160];
  snprintf(tmp, sizeof(tmp), "%s.tmp", path);
  cr_assert_eq(access(tmp, F_OK), -1, "temporary file left behind");

  /* The data section starts at a multiple of 8. */
  FILE *f = fopen(path, "rb");
  unsigned char lb[8];
  cr_assert_eq(fread(lb, 1, 8, f), 8);
  fclose(f);
  uint64_t hl = 0;
  for (int i = 7; i >= 0; i--) hl = hl << 8 | lb[i];
  cr_assert_eq((8 + hl) % 8, 0, "header length %llu", (unsigned long long)hl);

  cn_safetensors st;
  cr_assert_eq(cn_safetensors_open(path, &st, &e), 0, "%s", e.msg);
  cr_assert_eq(st.n, 4);
  /* Header order is the order written. */
  cr_assert_str_eq(st.tensors[0].name, "zeta.W");
  cr_assert_str_eq(st.tensors[2].name, "leaf.M");
  const cn_tensor *w = cn_safetensors_find(&st, "zeta.W");
  cr_assert_not_null(w);
  cr_assert_eq(w->ndim, 2);
  cr_assert_eq(w->shape[0], 2);
  cr_assert_eq(w->shape[1], 3);
  cr_assert_eq(w->numel, 6);
  cr_assert_arr_eq(w->data, a, sizeof(a));
  const cn_tensor *m = cn_safetensors_find(&st, "leaf.M");
  cr_assert_eq(m->ndim, 3);
  cr_assert_eq(m->shape[2], 4);
  cr_assert_arr_eq(m->data, c, sizeof(c));
  cr_assert_eq(((uintptr_t)m->data) % 4, 0);
  const cn_tensor *s = cn_safetensors_find(&st, "scalar");
  cr_assert_eq(s->ndim, 0);
  cr_assert_eq(s->numel, 1);
  cr_assert_float_eq(s->data[0], -1.5f, 0);
  cr_assert_arr_eq(cn_safetensors_find(&st, "alpha.b")->data, b, sizeof(b));
  cr_assert_null(cn_safetensors_find(&st, "alpha"));
  cn_safetensors_close(&st);
  cn_safetensors_close(&st); /* idempotent */
}

Test(safetensors, metadata_is_skipped) {
  write_raw("{\"__metadata__\":{\"format\":\"pt\"},\"x\":{\"dtype\":\"F32\","
            "\"shape\":[2],\"data_offsets\":[0,8]}}    ", zeros, 8);
  /* header is 80 bytes + 8: aligned */
  cn_safetensors st;
  cn_err e;
  cr_assert_eq(cn_safetensors_open(path, &st, &e), 0, "%s", e.msg);
  cr_assert_eq(st.n, 1);
  cr_assert_not_null(cn_safetensors_find(&st, "x"));
  cr_assert_null(cn_safetensors_find(&st, "__metadata__"));
  cn_safetensors_close(&st);
}

Test(safetensors, truncated_file) {
  float a[16] = {0};
  cn_tensor_out t[] = {{"first", 1, {4}, a}, {"last.W", 2, {3, 4}, a}};
  cn_err e;
  cr_assert_eq(cn_safetensors_write(path, t, 2, &e), 0, "%s", e.msg);
  FILE *f = fopen(path, "rb");
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fclose(f);
  cr_assert_eq(truncate(path, len - 4), 0);
  expect_bad("'last.W'", "cut short");
}

Test(safetensors, shorter_than_length_field) {
  FILE *f = fopen(path, "wb");
  fwrite("\x10\0\0", 1, 3, f);
  fclose(f);
  expect_bad("too short", NULL);
  f = fopen(path, "wb");
  fclose(f);
  expect_bad("0 bytes", NULL);
}

Test(safetensors, header_length_past_eof) {
  FILE *f = fopen(path, "wb");
  unsigned char b[8] = {0xe8, 0x03}; /* 1000 */
  fwrite(b, 1, 8, f);
  fwrite("{}        ", 1, 10, f);
  fclose(f);
  expect_bad("header length 1000", NULL);
  f = fopen(path, "wb");
  unsigned char huge[8] = {0, 0, 0, 0, 0, 0, 0, 0x80};
  fwrite(huge, 1, 8, f);
  fwrite("{}", 1, 2, f);
  fclose(f);
  expect_bad("header length", NULL);
}

Test(safetensors, data_offsets_past_end) {
  write_raw("{\"big\":{\"dtype\":\"F32\",\"shape\":[100],"
            "\"data_offsets\":[0,400]}}      ", zeros, 16);
  expect_bad("'big'", "[0, 400]");
}

Test(safetensors, begin_after_end) {
  write_raw("{\"rev\":{\"dtype\":\"F32\",\"shape\":[0],"
            "\"data_offsets\":[8,4]}}         ", zeros, 16);
  expect_bad("'rev'", NULL);
}

Test(safetensors, wrong_dtype_f16) {
  write_raw("{\"half.W\":{\"dtype\":\"F16\",\"shape\":[4],"
            "\"data_offsets\":[0,8]}}     ", zeros, 8);
  expect_bad("'half.W'", "F16");
}

Test(safetensors, wrong_dtype_i64) {
  write_raw("{\"ok\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
            "\"ids\":{\"dtype\":\"I64\",\"shape\":[1],"
            "\"data_offsets\":[8,16]}}  ", zeros, 16);
  expect_bad("'ids'", "I64");
}

Test(safetensors, bad_json_header) {
  write_raw("{\"x\": {\"dtype\": \"F32\",    ", zeros, 8);
  expect_bad("not a JSON object", NULL);
  write_raw("[1, 2, 3]                     ", zeros, 8);
  expect_bad("not a JSON object", NULL);
}

Test(safetensors, numel_bytes_mismatch) {
  write_raw("{\"odd\":{\"dtype\":\"F32\",\"shape\":[2,3],"
            "\"data_offsets\":[0,16]}}  ", zeros, 32);
  expect_bad("'odd'", "6 F32 values");
}

Test(safetensors, bad_shape) {
  write_raw("{\"neg\":{\"dtype\":\"F32\",\"shape\":[-1,2],"
            "\"data_offsets\":[0,8]}}  ", zeros, 8);
  expect_bad("'neg'", "shape");
  write_raw("{\"five\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1],"
            "\"data_offsets\":[0,4]}}", zeros, 8);
  expect_bad("'five'", "at most 4");
}

Test(safetensors, overlapping_tensors) {
  write_raw("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
            "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}"
            "      ", zeros, 32);
  expect_bad("'a'", "'b'");
  /* Adjacent spans are fine. */
  write_raw("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
            "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16,32]}}"
            "      ", zeros, 32);
  cn_safetensors st;
  cn_err e;
  cr_assert_eq(cn_safetensors_open(path, &st, &e), 0, "%s", e.msg);
  cn_safetensors_close(&st);
}

Test(safetensors, misaligned_data) {
  /* 8 + 63 header bytes: the data section starts at an odd byte. */
  const char *h =
      "{\"mis\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
  char hdr[64];
  snprintf(hdr, sizeof(hdr), "%-63s", h);
  write_hdr(hdr, zeros, 8, false);
  expect_bad("'mis'", "aligned");
  /* 8 + 62: 2-byte aligned only. */
  snprintf(hdr, sizeof(hdr), "%-62s", h);
  write_hdr(hdr, zeros, 8, false);
  expect_bad("'mis'", "file byte 70");
  /* 8 + 60: 4-byte aligned, accepted. */
  snprintf(hdr, sizeof(hdr), "%-60s", h);
  write_hdr(hdr, zeros, 8, false);
  cn_safetensors st;
  cn_err e;
  cr_assert_eq(cn_safetensors_open(path, &st, &e), 0, "%s", e.msg);
  cn_safetensors_close(&st);
}

Test(safetensors, missing_file_is_io) {
  cn_safetensors st;
  cn_err e;
  cr_assert_eq(cn_safetensors_open("/nonexistent/w.safetensors", &st, &e),
               CN_E_IO);
  cr_assert_not_null(strstr(e.msg, "/nonexistent/w.safetensors"));
}

Test(safetensors, write_refuses_duplicate_names) {
  float a[2] = {0};
  cn_tensor_out t[] = {{"x", 1, {2}, a}, {"x", 1, {2}, a}};
  cn_err e;
  cr_assert_neq(cn_safetensors_write(path, t, 2, &e), 0);
  cr_assert_not_null(strstr(e.msg, "'x'"));
  cr_assert_eq(access(path, F_OK), -1);
}

/* The file offset where the data section of the file at path starts. */
static long long data_start(void) {
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f);
  unsigned char b[8];
  cr_assert_eq(fread(b, 1, 8, f), 8u);
  fclose(f);
  unsigned long long hl = 0;
  for (int i = 7; i >= 0; i--) hl = hl << 8 | b[i];
  return 8 + (long long)hl;
}

/* The format has no holes (huggingface/safetensors: the byte buffer is
 * entirely indexed): bytes after the last tensor, between two tensors or
 * before the first are refused, naming the file and the first such byte. */
Test(safetensors, bytes_in_no_tensor) {
  char want[96];
  write_raw("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}",
            zeros, 17);
  snprintf(want, sizeof(want), "bytes %lld to %lld of the file",
           data_start() + 16, data_start() + 16);
  expect_bad(want, "belong to no tensor");
  write_raw("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
            "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[24,40]}}",
            zeros, 40);
  snprintf(want, sizeof(want), "bytes %lld to %lld of the file",
           data_start() + 16, data_start() + 23);
  expect_bad(want, "before 'b'");
  write_raw("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}",
            zeros, 24);
  snprintf(want, sizeof(want), "bytes %lld to %lld of the file",
           data_start(), data_start() + 7);
  expect_bad(want, "no holes");
  /* empty tensors cover nothing and leave no hole */
  write_raw("{\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[16,16]},"
            "\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}",
            zeros, 16);
  cn_safetensors st;
  cn_err e;
  cr_assert_eq(cn_safetensors_open(path, &st, &e), 0, "%s", e.msg);
  cn_safetensors_close(&st);
}

/* Bytes this process has read so far (/proc/self/io rchar). */
static long long bytes_read(void) {
  FILE *f = fopen("/proc/self/io", "r");
  cr_assert_not_null(f);
  char line[128];
  long long v = -1;
  while (fgets(line, sizeof(line), f) != NULL)
    if (sscanf(line, "rchar: %lld", &v) == 1) break;
  fclose(f);
  cr_assert_geq(v, 0);
  return v;
}

/* A valid file extended to 256 MiB (sparse) is refused from its header:
 * its trailing bytes are neither read nor held (a 2 GiB file was read
 * whole and its bytes held while the model served). */
Test(safetensors, trailing_bytes_are_not_read) {
  write_raw("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}",
            zeros, 16);
  cr_assert_eq(truncate(path, 256LL << 20), 0);
  cn_safetensors st;
  cn_err e;
  cn_err_clear(&e);
  long long before = bytes_read();
  int rc = cn_safetensors_open(path, &st, &e);
  long long read = bytes_read() - before;
  cr_assert_eq(rc, CN_E_BAD_MODEL, "%d %s", rc, e.msg);
  cr_assert_not_null(strstr(e.msg, "belong to no tensor"), "%s", e.msg);
  cr_assert_lt(read, 1 << 20, "%lld bytes read to refuse it", read);
  cr_assert_null(st.bytes);
}
