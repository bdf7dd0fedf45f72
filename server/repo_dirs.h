/* repo_dirs.h - the models directory as the repository reads it: which
 * subdirectories hold a model, which cannot be served and why, and the
 * files a rescan watches (repo.c decides what to load). Any thread. */
#ifndef CANOPY_SERVER_REPO_DIRS_H
#define CANOPY_SERVER_REPO_DIRS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/stat.h>

/* A subdirectory of models-dir that looks like a model but cannot be
 * served: its name is too long (CN__NAME_MAX bytes or more: the model's
 * name is its directory's) or not a name (cn__dirs_name_flaw), its
 * model.json is not a regular file (a
 * directory, a FIFO, a device), or the daemon cannot reach it (a
 * directory it may not enter: mkdtemp's 0700 under another user;
 * a dangling symbolic link). Each is a load that failed. A directory
 * with no model.json at all is no model: only logged (not_model). */
typedef struct {
  char *name;
  char why[300];   /* "the directory's name has 130 bytes; ..." */
  char fix[48];    /* what strict-startup's message tells a person to do */
  bool not_model;  /* no model.json: a warning, not a failed load */
} cn__unservable;

/* The subdirectories of dir that hold a model.json, sorted (-1: dir
 * cannot be read). Those that cannot be served go to *bad (sorted) when
 * bad is not NULL. */
int cn__dirs_list(const char *dir, char ***out, cn__unservable **bad,
                  int *n_bad);
void cn__dirs_free_names(char **names, int n);
void cn__dirs_free_unservable(cn__unservable *b, int n);
/* One log record: a warning (no model.json) or a failed load. */
void cn__dirs_log_unservable(const cn__unservable *u);
/* Does models_dir/name hold a model.json (a file, or anything)? */
bool cn__dirs_present(const char *models_dir, const char *name);
/* Why name can name no model ("holds a control character (byte 0x0a)",
 * "is not UTF-8 (byte 0xff at offset 3)", written into what), or NULL. */
const char *cn__dirs_name_flaw(const char *name, char *what, size_t cap);
/* The stat of dir's model.json and weights (zeros where absent), and
 * whether two such are the same files unchanged. */
void cn__dirs_signature(const char *dir, struct stat sig[2]);
bool cn__dirs_same(const struct stat a[2], const struct stat b[2]);

#endif
