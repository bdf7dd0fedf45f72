/* model_test_util.h - a fresh temporary directory per test and files
 * in it, for the tests of model directories and vocabularies
 * (test_model.c, test_model_files.c, test_vocab.c). */
#ifndef CANOPY_MODEL_TEST_UTIL_H
#define CANOPY_MODEL_TEST_UTIL_H

/* The test's directory, made by tmp_dir_setup, removed by
 * tmp_dir_teardown (a TestSuite's .init and .fini). */
extern char tmp_dir[64];
void tmp_dir_setup(void);
void tmp_dir_teardown(void);
/* tmp_dir/name; the last four results stay valid. */
const char *in_dir(const char *name);
/* Writes text to tmp_dir/name. */
void put(const char *name, const char *text);
/* A file's text (at most 64 KiB), valid until the next call. */
char *slurp(const char *path);
/* $CANOPY_DATA/name: the shared data (meson test sets it). */
const char *data_file(const char *name);

#endif
