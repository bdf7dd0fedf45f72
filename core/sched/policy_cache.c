/* policy_cache.c - learned policies on disk, so a restart does not learn
 * again.
 *
 * One JSON file per model in a cache directory. The file carries the key
 * of what the policy was learned for (the model's family and vertex types,
 * the bytes of its weights file, the state encoding) and a checksum of its
 * own content. A file that does not parse, fails a check or its checksum is
 * CORRUPT; one whose key differs is STALE. Neither is ever used: callers
 * warn and retrain. Files are written to a temporary name and renamed, so a
 * reader sees the old file or the new one, never half of one.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/model.h"
#include "sched/fsm_impl.h"

#define FORMAT "canopy-fsm"
#define VERSION 1
/* The largest policy file read. The biggest a policy can be: 8 types under
 * `sort`, 109,600 states of ~230 bytes, about 25 MB. */
#define MAX_POLICY_BYTES (64ull << 20)
#define DUMP (JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(17))

/* FNV-1a, 64-bit, fed 8 bytes at a time where it can (weights files run to
 * hundreds of MB; this is a fingerprint, not a defence). */
static uint64_t mix(uint64_t h, const void *data, size_t n) {
  const unsigned char *p = data;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    h = (h ^ w) * 0x100000001b3ull;
  }
  for (; n > 0; n--, p++) h = (h ^ *p) * 0x100000001b3ull;
  return h;
}

static uint64_t mix_str(uint64_t h, const char *s) {
  return mix(h, s, strlen(s) + 1);
}

uint64_t cn__fsm_model_key(const cn_model *m, cn_fsm_encoding enc) {
  uint64_t h = mix_str(0xcbf29ce484222325ull, FORMAT "/1");
  h = mix_str(h, m->fam->name);
  for (int t = 0; t < m->fam->n_types; t++)
    h = mix_str(h, m->fam->type_names[t]);
  if (m->st.bytes != NULL) h = mix(h, m->st.bytes, m->st.n_bytes);
  /* a model described by cells: its description too (two descriptions may
   * share weights and type names, not graphs) */
  char *cells = m->cells != NULL
                    ? json_dumps(json_object_get(m->json, "cells"),
                                 JSON_COMPACT | JSON_SORT_KEYS)
                    : NULL;
  if (cells != NULL) h = mix_str(h, cells);
  free(cells);
  return mix_str(h, cn_fsm_encoding_name(enc));
}

static void hex64(char buf[17], uint64_t v) {
  snprintf(buf, 17, "%016llx", (unsigned long long)v);
}

static json_t *to_json(const cn_fsm *p) {
  char key[17];
  hex64(key, p->key);
  json_t *types = json_array(), *states = json_array();
  for (int t = 0; t < p->n_types; t++)
    json_array_append_new(types, json_string(p->type_names[t]));
  for (uint32_t i = 0; i < p->tab.cap; i++) {
    if (p->tab.keys[i] == 0) continue;
    json_t *q = json_array();
    for (int a = 0; a < p->n_types; a++)
      json_array_append_new(q, json_real(p->tab.q[(size_t)i * p->n_types + a]));
    json_array_append_new(states, json_pack("[I, i, o]",
                                            (json_int_t)p->tab.keys[i],
                                            (int)p->tab.seen[i], q));
  }
  const cn_fsm_stats *s = &p->st;
  return json_pack(
      "{s:s, s:i, s:s, s:s, s:o, s:s, s:s, s:o, s:{s:I, s:I, s:I, s:I, s:I, "
      "s:I, s:I, s:i, s:I, s:i, s:i, s:i, s:f}}",
      "format", FORMAT, "version", VERSION, "key", key, "family", p->family,
      "types", types, "encoding", cn_fsm_encoding_name(p->enc), "executes",
      cn_policy_name(p->executes), "states", states, "stats", "fsm",
      (json_int_t)s->fsm, "agenda", (json_int_t)s->agenda, "depth",
      (json_int_t)s->depth, "sufficient", (json_int_t)s->sufficient,
      "lookahead", (json_int_t)s->lookahead, "lookahead2",
      (json_int_t)s->lookahead2, "lower_bound", (json_int_t)s->lower_bound,
      "graphs", s->graphs,
      "vertices", (json_int_t)s->vertices, "iterations", s->iterations,
      "best_iteration", s->best_iteration, "distilled", s->distilled,
      "seconds", s->seconds);
}

static uint64_t checksum(const json_t *j) {
  char *s = json_dumps(j, DUMP);
  if (s == NULL) return 0;
  uint64_t h = mix_str(0xcbf29ce484222325ull, s);
  free(s);
  return h;
}

/* Whether key can be E(G) of a frontier of n_types types (fsm.c). */
static bool key_valid(cn_fsm_encoding enc, int T, uint32_t key) {
  uint32_t all = (1u << T) - 1;
  if (key == 0) return false;
  if (enc == CN_FSM_ENC_BASE) return (key & ~all) == 0;
  if (enc == CN_FSM_ENC_MAX || enc == CN_FSM_ENC_BOUND) {
    /* E_bound: E_max's bits, then a non-empty subset of the ready types. */
    uint32_t mask = key & 0xff, arg = key >> 8 & 0xf, top = key >> 12;
    if (enc == CN_FSM_ENC_MAX ? top != 0 : top == 0 || (top & ~mask) != 0)
      return false;
    return mask != 0 && (mask & ~all) == 0 && arg >= 1 && arg <= (uint32_t)T &&
           (mask >> (arg - 1) & 1);
  }
  uint32_t used = 0;
  for (; key != 0; key >>= 4) {
    uint32_t d = key & 15;
    if (d == 0 || d > (uint32_t)T || (used >> d & 1)) return false;
    used |= 1u << d;
  }
  return true;
}

static bool types_match(const json_t *types, const cn_model *m) {
  if (!json_is_array(types) ||
      json_array_size(types) != (size_t)m->fam->n_types)
    return false;
  for (int t = 0; t < m->fam->n_types; t++) {
    const char *s = json_string_value(json_array_get(types, (size_t)t));
    if (s == NULL || strcmp(s, m->fam->type_names[t]) != 0) return false;
  }
  return true;
}

#define BAD(...) (rc = cn_err_set(err, CN_E_BAD_MODEL, __VA_ARGS__))

/* The "states" of a policy file into p's Q table: each [key, seen, Q
 * values], checked against the encoding and the T types. */
static int states_from_json(cn_fsm *p, json_t *states, cn_fsm_encoding enc,
                            int T, cn_err *err) {
  int rc = 0;
  size_t i;
  json_t *e;
  json_array_foreach(states, i, e) {
    json_int_t k;
    int seen;
    json_t *q;
    if (json_unpack(e, "[I, i, o]", &k, &seen, &q) != 0 || k <= 0 ||
        k > UINT32_MAX || !key_valid(enc, T, (uint32_t)k) || seen < 0 ||
        seen >= (1 << T) || !json_is_array(q) ||
        json_array_size(q) != (size_t)T ||
        cn__qtab_find(&p->tab, (uint32_t)k) >= 0) {
      BAD("state %zu is not valid", i);
      return rc;
    }
    int64_t s = cn__qtab_get(&p->tab, (uint32_t)k);
    if (s < 0) {
      rc = cn_err_set(err, CN_E_NOMEM, "no memory for the policy");
      return rc;
    }
    p->tab.seen[s] = (uint8_t)seen;
    for (int a = 0; a < T; a++) {
      json_t *x = json_array_get(q, (size_t)a);
      double v = json_number_value(x);
      if (!json_is_number(x) || !isfinite(v)) {
        BAD("state %zu has a bad Q value", i);
        return rc;
      }
      p->tab.q[s * T + a] = v;
    }
  }
  return 0;
}

/* The "stats" of a policy file into p's statistics. */
static int stats_from_json(cn_fsm *p, json_t *stats, cn_err *err) {
  int rc = 0;
  cn_fsm_stats *st = &p->st;
  json_int_t f = 0, ag = 0, de = 0, su = 0, la = 0, la2 = 0, lb = 0, vx = 0;
  if (json_unpack(stats,
                  "{s:I, s:I, s:I, s:I, s?I, s?I, s:I, s:i, s:I, s:i, s:i, "
                  "s:i, s:F}",
                  "fsm", &f, "agenda", &ag, "depth", &de, "sufficient", &su,
                  "lookahead", &la, "lookahead2", &la2,
                  "lower_bound", &lb, "graphs", &st->graphs, "vertices", &vx,
                  "iterations", &st->iterations, "best_iteration",
                  &st->best_iteration, "distilled", &st->distilled,
                  "seconds", &st->seconds) != 0) {
    BAD("bad \"stats\"");
    return rc;
  }
  st->fsm = f, st->agenda = ag, st->depth = de, st->sufficient = su;
  st->lookahead = la;
  st->lookahead2 = la2;
  st->lower_bound = lb, st->vertices = vx;
  return 0;
}

/* Checks everything and rebuilds the policy. *stale: the file is sound but
 * for another key. */
static int from_json(json_t *j, const cn_model *m, cn_fsm_encoding enc,
                     cn_fsm **out, bool *stale, cn_err *err) {
  int rc = 0, T = m->fam->n_types, version = 0;
  const char *format = "", *key = "", *fam = "", *encs = "", *exe = "",
             *sum = "";
  json_t *types = NULL, *states = NULL, *stats = NULL;
  cn_fsm *p = NULL;
  cn_fsm_encoding fe;
  cn_policy_kind pk;
  char want[17];
  *stale = false;
  *out = NULL;
  if (!json_is_object(j) ||
      json_unpack(j, "{s:s, s:i, s:s, s:s, s:o, s:s, s:s, s:o, s:o, s:s}",
                  "format", &format, "version", &version, "key", &key,
                  "family", &fam, "types", &types, "encoding", &encs,
                  "executes", &exe, "states", &states, "stats", &stats,
                  "checksum", &sum) != 0 ||
      strcmp(format, FORMAT) != 0 || version != VERSION) {
    BAD("not a canopy policy file of version %d", VERSION);
    goto out;
  }
  char got[17];
  char *sum_copy = strdup(sum);
  json_object_del(j, "checksum");
  hex64(got, checksum(j));
  bool sum_ok = sum_copy != NULL && strcmp(sum_copy, got) == 0;
  free(sum_copy);
  if (!sum_ok) {
    BAD("checksum mismatch: the file is damaged");
    goto out;
  }
  hex64(want, cn__fsm_model_key(m, enc));
  if (strcmp(key, want) != 0 || strcmp(fam, m->fam->name) != 0 ||
      cn_fsm_encoding_parse(encs, &fe) != 0 || fe != enc ||
      !types_match(types, m)) {
    *stale = true;
    BAD("learned for other weights, types or encoding (%s, key %s; want %s, "
        "key %s)", encs, key, cn_fsm_encoding_name(enc), want);
    goto out;
  }
  if (cn_policy_parse(exe, &pk) != 0 ||
      (pk != CN_POLICY_FSM && pk != CN_POLICY_AGENDA &&
       pk != CN_POLICY_DEPTH && pk != CN_POLICY_SUFFICIENT &&
       pk != CN_POLICY_LOOKAHEAD && pk != CN_POLICY_LOOKAHEAD2) ||
      !json_is_array(states)) {
    BAD("bad \"executes\" or \"states\"");
    goto out;
  }
  if ((p = cn__fsm_new(T, enc)) == NULL) {
    rc = cn_err_set(err, CN_E_NOMEM, "no memory for the policy");
    goto out;
  }
  p->executes = pk;
  p->key = cn__fsm_model_key(m, enc);
  snprintf(p->family, sizeof(p->family), "%s", m->fam->name);
  for (int t = 0; t < T; t++)
    snprintf(p->type_names[t], sizeof(p->type_names[t]), "%s",
             m->fam->type_names[t]);
  if ((rc = states_from_json(p, states, enc, T, err)) != 0) goto out;
  if ((rc = stats_from_json(p, stats, err)) != 0) goto out;
out:
  if (rc != 0) {
    cn_fsm_free(p);
    return rc;
  }
  *out = p;
  return 0;
}

static int fill_json(FILE *f, void *ctx) {
  return json_dumpf(ctx, f, DUMP) != 0 || fputc('\n', f) == EOF ? -1 : 0;
}

int cn_fsm_save(const cn_fsm *p, const char *path, cn_err *err) {
  int rc = 0;
  char tmp[PATH_MAX + 32];
  json_t *j = to_json(p);
  if (j == NULL) return cn_err_set(err, CN_E_NOMEM, "no memory");
  char sum[17];
  hex64(sum, checksum(j));
  json_object_set_new(j, "checksum", json_string(sum));
  snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid());
  /* a fresh regular file: whatever had the name (a FIFO would block the
   * open for ever) is replaced */
  switch (cn__file_write_atomic(path, tmp, true, fill_json, j)) {
  case CN__FW_OK:
    break;
  case CN__FW_CREATE:
  case CN__FW_WRITE:
  case CN__FW_CLOSE:
    rc = cn_err_set(err, CN_E_IO, "cannot write %s: %s", tmp, strerror(errno));
    break;
  case CN__FW_RENAME:
    rc = cn_err_set(err, CN_E_IO, "cannot rename %s to %s: %s", tmp, path,
                    strerror(errno));
    break;
  }
  json_decref(j);
  return rc;
}

/* Loads path; *status: HIT, MISS, STALE or CORRUPT. */
static int load(const cn_model *m, cn_fsm_encoding enc, const char *path,
                cn_fsm **out, int *status, cn_err *err) {
  json_error_t je;
  bool stale = false;
  *out = NULL;
  if (access(path, F_OK) != 0) {
    *status = CN_CACHE_MISS;
    return cn_err_set(err, CN_E_IO, "no policy file %s", path);
  }
  /* opened as a model's files are (base/file.c): a FIFO there blocked
   * start-up for ever, /dev/zero would read for ever; then parsed from the
   * descriptor, so junk stops the parse at its first bad byte rather than
   * being read whole first */
  int fd;
  uint64_t size;
  int orc = cn__open_regular(path, MAX_POLICY_BYTES, &fd, &size, err);
  if (orc != 0) {
    *status = CN_CACHE_CORRUPT;
    char why[sizeof(err->msg)];
    snprintf(why, sizeof(why), "%s", err->msg);
    return cn_err_set(err, CN_E_BAD_MODEL, "policy file: %s", why);
  }
  json_t *j = json_loadfd(fd, JSON_REJECT_DUPLICATES, &je);
  close(fd);
  if (j == NULL) {
    *status = CN_CACHE_CORRUPT;
    return cn_err_set(err, CN_E_BAD_MODEL, "policy file %s: line %d: %s",
                      path, je.line, je.text);
  }
  int rc = from_json(j, m, enc, out, &stale, err);
  json_decref(j);
  if (rc == CN_E_NOMEM) return rc;
  *status = rc == 0 ? CN_CACHE_HIT : stale ? CN_CACHE_STALE : CN_CACHE_CORRUPT;
  if (rc != 0) {
    char why[sizeof(err->msg)];
    snprintf(why, sizeof(why), "%s", err->msg);
    cn_err_set(err, rc, "policy file %s: %s", path, why);
  }
  return rc;
}

int cn_fsm_load(const cn_model *m, cn_fsm_encoding enc, const char *path,
                cn_fsm **out, cn_err *err) {
  int status;
  return load(m, enc, path, out, &status, err);
}

int cn_policy_cache_default_dir(char *buf, size_t cap) {
  const char *e = getenv("CANOPY_POLICY_CACHE"), *x = getenv("XDG_CACHE_HOME"),
             *h = getenv("HOME");
  int n;
  if (e != NULL && *e)
    n = snprintf(buf, cap, "%s", e);
  else if (x != NULL && *x)
    n = snprintf(buf, cap, "%s/canopy/policies", x);
  else if (h != NULL && *h)
    n = snprintf(buf, cap, "%s/.cache/canopy/policies", h);
  else
    n = snprintf(buf, cap, "/tmp/canopy-policies");
  return n < 0 || (size_t)n >= cap ? CN_E_TOO_LARGE : 0;
}

int cn_policy_cache_path(const cn_model *m, const char *dir, char *buf,
                         size_t cap) {
  char dflt[PATH_MAX], real[PATH_MAX];
  if (dir == NULL) {
    if (cn_policy_cache_default_dir(dflt, sizeof(dflt))) return CN_E_TOO_LARGE;
    dir = dflt;
  }
  const char *src = m->dir != NULL ? m->dir : "model";
  if (realpath(src, real) == NULL) snprintf(real, sizeof(real), "%s", src);
  size_t len = strlen(real);
  while (len > 1 && real[len - 1] == '/') real[--len] = '\0';
  const char *base = strrchr(real, '/');
  base = base != NULL && base[1] ? base + 1 : real;
  char name[64];
  size_t k = 0;
  for (; base[k] && k < sizeof(name) - 1; k++) /* a tame file name */
    name[k] = (base[k] == '.' && k == 0) || base[k] == '/' ? '_' : base[k];
  name[k] = '\0';
  uint32_t h = (uint32_t)mix_str(0xcbf29ce484222325ull, real);
  int n = snprintf(buf, cap, "%s/%s-%08x.fsm.json", dir, name, h);
  return n < 0 || (size_t)n >= cap ? CN_E_TOO_LARGE : 0;
}

int cn_policy_cache_load(const cn_model *m, const char *dir,
                         cn_fsm_encoding enc, cn_fsm **out, cn_err *err) {
  char path[PATH_MAX];
  int status = CN_CACHE_MISS;
  *out = NULL;
  if (cn_policy_cache_path(m, dir, path, sizeof(path)) != 0)
    return cn_err_set(err, CN_E_TOO_LARGE, "policy cache path too long");
  int rc = load(m, enc, path, out, &status, err);
  if (rc == CN_E_NOMEM) return rc;
  return status;
}

static int mkdirs(const char *dir) {
  char p[PATH_MAX];
  snprintf(p, sizeof(p), "%s", dir);
  for (char *s = p + 1; *s; s++) {
    if (*s != '/') continue;
    *s = '\0';
    if (mkdir(p, 0755) != 0 && errno != EEXIST) return -1;
    *s = '/';
  }
  return mkdir(p, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

int cn_policy_cache_store(const cn_model *m, const char *dir,
                          const cn_fsm *p, cn_err *err) {
  char path[PATH_MAX], dflt[PATH_MAX];
  if (dir == NULL) {
    if (cn_policy_cache_default_dir(dflt, sizeof(dflt)))
      return cn_err_set(err, CN_E_TOO_LARGE, "policy cache path too long");
    dir = dflt;
  }
  if (mkdirs(dir) != 0)
    return cn_err_set(err, CN_E_IO, "cannot create policy cache %s: %s", dir,
                      strerror(errno));
  if (cn_policy_cache_path(m, dir, path, sizeof(path)) != 0)
    return cn_err_set(err, CN_E_TOO_LARGE, "policy cache path too long");
  return cn_fsm_save(p, path, err);
}
