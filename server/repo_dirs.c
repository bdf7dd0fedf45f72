/* repo_dirs.c - the models directory as the repository reads it
 * (repo_dirs.h). */
#include "repo_dirs.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "server.h"

/* The files a rescan watches: model.json and the weights. An atomic
 * rename of a new directory, or a rewrite of either file, changes them. */
void cn__dirs_signature(const char *dir, struct stat sig[2]) {
  char p[2200];
  memset(sig, 0, 2 * sizeof(struct stat));
  snprintf(p, sizeof(p), "%s/model.json", dir);
  if (stat(p, &sig[0]) != 0) memset(&sig[0], 0, sizeof(sig[0]));
  snprintf(p, sizeof(p), "%s/weights.safetensors", dir);
  if (stat(p, &sig[1]) != 0) memset(&sig[1], 0, sizeof(sig[1]));
}

bool cn__dirs_same(const struct stat a[2], const struct stat b[2]) {
  for (int i = 0; i < 2; i++)
    if (a[i].st_dev != b[i].st_dev || a[i].st_ino != b[i].st_ino ||
        a[i].st_size != b[i].st_size ||
        a[i].st_mtim.tv_sec != b[i].st_mtim.tv_sec ||
        a[i].st_mtim.tv_nsec != b[i].st_mtim.tv_nsec)
      return false;
  return true;
}

/* Why name can name no model, or NULL: a name is a metrics label, a JSON
 * string and a log value. A control character (a byte below 0x20, or
 * 0x7f) would split a log line or a metrics series; bytes that are not
 * UTF-8 make the exposition invalid (promtool, and so Prometheus, drop
 * every series of the scrape) and a JSON answer cannot hold them (the
 * name was silently left out). what (cap bytes) says which byte. */
const char *cn__dirs_name_flaw(const char *name, char *what, size_t cap) {
  for (const unsigned char *p = (const unsigned char *)name; *p; p++)
    if (*p < 0x20 || *p == 0x7f) {
      snprintf(what, cap, "holds a control character (byte 0x%02x)", *p);
      return what;
    }
  long at = cn__utf8_bad_at(name);
  if (at < 0) return NULL;
  snprintf(what, cap, "is not UTF-8 (byte 0x%02x at offset %ld)",
           (unsigned char)name[at], at);
  return what;
}

/* Does models-dir/name hold a model.json (a file, or anything)? */
bool cn__dirs_present(const char *models_dir, const char *name) {
  char mj[1200];
  struct stat st;
  snprintf(mj, sizeof(mj), "%s/%s/model.json", models_dir, name);
  return stat(mj, &st) == 0;
}

static int cmp_names(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

void cn__dirs_free_unservable(cn__unservable *b, int n) {
  for (int i = 0; i < n; i++) free(b[i].name);
  free(b);
}

static int cmp_unservable(const void *a, const void *b) {
  return strcmp(((const cn__unservable *)a)->name,
                ((const cn__unservable *)b)->name);
}

/* The subdirectories of models-dir that hold a model.json, sorted. Those
 * that cannot be served go to *bad (sorted) when it is not NULL. */
int cn__dirs_list(const char *dir, char ***out, cn__unservable **bad,
                  int *n_bad) {
  *out = NULL;
  if (bad != NULL) {
    *bad = NULL;
    *n_bad = 0;
  }
  DIR *d = opendir(dir);
  if (d == NULL) return -1;
  /* every name, however many (the repository serves the first
   * CN__MAX_MODELS of them in sorted order: a cut here would make that
   * readdir's order) */
  int cap = CN__MAX_MODELS, n = 0;
  char **names = malloc((size_t)cap * sizeof(char *));
  struct dirent *de;
  while (names != NULL && (de = readdir(d)) != NULL) {
    char p[4400];
    struct stat st;
    /* hidden (a write in progress: canopy-import's .NAME.xxxx), and the
     * lost+found of a volume's root (root's 0700, never a model) */
    if (de->d_name[0] == '.' || strcmp(de->d_name, "lost+found") == 0)
      continue;
    snprintf(p, sizeof(p), "%s/%s/model.json", dir, de->d_name);
    /* stat follows a symlink to a regular file, and never blocks */
    int serr = stat(p, &st) != 0 ? errno : 0;
    struct stat ls;
    bool dangling = serr == ENOENT && lstat(p, &ls) == 0;
    /* a plain file beside the models (a README) is no directory */
    if (serr == ENOTDIR) continue;
    size_t len = strlen(de->d_name);
    char flaw[80];
    const char *bad_name = cn__dirs_name_flaw(de->d_name, flaw, sizeof(flaw));
    if (serr == 0 && len < CN__NAME_MAX && S_ISREG(st.st_mode) &&
        bad_name == NULL) {
      if (n == cap) {
        char **t = realloc(names, (size_t)cap * 2 * sizeof(char *));
        if (t == NULL) continue;
        names = t;
        cap *= 2;
      }
      if ((names[n] = strdup(de->d_name)) != NULL) n++;
      continue;
    }
    if (bad == NULL) continue;
    cn__unservable *t = realloc(*bad, (size_t)(*n_bad + 1) * sizeof(*t));
    if (t == NULL) continue;
    *bad = t;
    cn__unservable *u = &t[*n_bad];
    if ((u->name = strdup(de->d_name)) == NULL) continue;
    (*n_bad)++;
    u->not_model = false;
    if (serr == ENOENT && !dangling) {
      u->not_model = true;
      snprintf(u->why, sizeof(u->why), "'%.200s' holds no model.json: not "
               "a model", p);
      snprintf(u->fix, sizeof(u->fix), "move it out of models-dir");
    } else if (serr != 0) {
      snprintf(u->why, sizeof(u->why), "cannot read '%.200s': %s", p,
               dangling ? "a symbolic link to nothing" : strerror(serr));
      snprintf(u->fix, sizeof(u->fix), serr == EACCES
               ? "let the daemon's user read it (chmod 0755 the directory)"
               : "fix it");
    } else if (len >= CN__NAME_MAX) {
      snprintf(u->why, sizeof(u->why), "the directory's name has %zu bytes; "
               "a model name has at most %d", len, CN__NAME_MAX - 1);
      snprintf(u->fix, sizeof(u->fix), "rename it");
    } else if (bad_name != NULL) {
      snprintf(u->why, sizeof(u->why), "the directory's name %s; a model "
               "name is UTF-8 with no control character (it names metrics "
               "series, JSON answers and log lines)", bad_name);
      snprintf(u->fix, sizeof(u->fix), "rename it");
    } else {
      snprintf(u->why, sizeof(u->why), "'model.json' is not a regular file "
               "(%s)", cn_file_kind(st.st_mode));
      snprintf(u->fix, sizeof(u->fix), "replace it");
    }
  }
  closedir(d);
  if (names == NULL) return -1;
  qsort(names, (size_t)n, sizeof(char *), cmp_names);
  if (bad != NULL && *n_bad > 1)
    qsort(*bad, (size_t)*n_bad, sizeof(**bad), cmp_unservable);
  *out = names;
  return n;
}

/* One record for the log, the name cut to 60 bytes and "..." (the
 * formatter quotes and escapes it and the reason: one line a record). */
void cn__dirs_log_unservable(const cn__unservable *u) {
  char cut[72];
  snprintf(cut, sizeof(cut), "%.60s%s", u->name,
           strlen(u->name) > 60 ? "..." : "");
  if (u->not_model)
    CN_LOG(CN_LOG_WARN, "msg=not-a-model model=%s reason=\"%s\"", cut,
           u->why);
  else
    CN_LOG(CN_LOG_ERROR, "msg=model-load-failed model=%s error=\"%s\"",
           cut, u->why);
}

void cn__dirs_free_names(char **names, int n) {
  for (int i = 0; i < n; i++) free(names[i]);
  free(names);
}

