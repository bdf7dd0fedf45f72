/* run_output.c - what a run's answers read: the states a family's reads()
 * names, brought to the host after the last batch (cn__run_copy_back), and
 * the family's output() per instance, checked for non-finite values.
 * Calls no other file of run/.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run/run_api.h"

const float *cn__run_state_host_at(const cn_run *r, int32_t v, int col) {
  if (r->bk->vt->host_memory) return r->arena + r->state_off[v] + col;
  /* the spans are sorted by vertex, one per vertex */
  int64_t lo = 0, hi = r->n_spans;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (r->spans[mid].v < v)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (r->host == NULL || lo == r->n_spans || r->spans[lo].v != v ||
      col < r->spans[lo].lo || col >= r->spans[lo].hi)
    return NULL; /* not named by the family's reads(): its bug */
  return r->host + r->spans[lo].at + (col - r->spans[lo].lo);
}

void cn__run_need(cn_run *r, int32_t v, int col, int width) {
  if (width <= 0 || v < 0 || v >= r->nv) return;
  if (r->n_spans == r->cap_spans) {
    int64_t c = r->cap_spans ? 2 * r->cap_spans : 256;
    cn_run_span *p = cn__xrealloc(r->spans, (size_t)c, sizeof(*p));
    if (p == NULL) {
      r->need_failed = true;
      return;
    }
    r->spans = p;
    r->cap_spans = c;
  }
  r->spans[r->n_spans++] = (cn_run_span){v, col, col + width, 0};
}

static int backend_status(cn_run *r, cn_err *err) {
  return r->bk->vt->status != NULL ? r->bk->vt->status(r->bk, err) : 0;
}

static int span_cmp(const void *a, const void *b) {
  const cn_run_span *x = a, *y = b;
  return (x->v > y->v) - (x->v < y->v);
}

/* Device backends: the answers read a few rows of the run's
 * states (root logits, requested hidden vectors, CRF emissions), so only
 * those come back: the family's reads() names them, they are sorted and
 * merged per vertex, and the backend gathers them on the device into its
 * own host buffer in one transfer with one wait. No host memory of the
 * arena's size, and nothing else crosses the bus. */
int cn__run_fetch_start(cn_run *r, const int *slots, int n, cn_err *err) {
  int rc = backend_status(r, err);
  if (rc != 0 || r->bk->vt->host_memory) return rc;
  cn_backend_ctx *bk = r->bk;
  r->host = NULL;
  r->fetching = false;
  r->n_spans = 0;
  r->need_failed = false;
  int count = slots != NULL ? n : r->n_slots;
  for (int i = 0; i < count; i++) {
    int s = slots != NULL ? slots[i] : i;
    if (s >= 0 && s < r->n_slots) r->fam->reads(r, s);
  }
  if (r->need_failed)
    return cn_err_set(err, CN_E_NOMEM, "no memory for the run's results");
  if (r->n_spans > 1)
    qsort(r->spans, (size_t)r->n_spans, sizeof(cn_run_span), span_cmp);
  int64_t k = 0;
  for (int64_t i = 0; i < r->n_spans; i++) {
    cn_run_span sp = r->spans[i];
    if (k > 0 && r->spans[k - 1].v == sp.v) { /* one span per vertex */
      cn_run_span *q = &r->spans[k - 1];
      if (sp.lo < q->lo) q->lo = sp.lo;
      if (sp.hi > q->hi) q->hi = sp.hi;
      continue;
    }
    r->spans[k++] = sp;
  }
  r->n_spans = k;
  if (k > INT32_MAX / 2)
    return cn_err_set(err, CN_E_TOO_LARGE, "too many result rows (%lld)",
                      (long long)k);
  if (2 * k > r->cap_fetch) {
    int64_t *p = cn__xrealloc(r->fetch_idx, (size_t)(2 * k), sizeof(int64_t));
    if (p == NULL)
      return cn_err_set(err, CN_E_NOMEM, "no memory for the run's results");
    r->fetch_idx = p;
    r->cap_fetch = 2 * k;
  }
  int64_t *off = r->fetch_idx, *len = r->fetch_idx + k, at = 0;
  for (int64_t i = 0; i < k; i++) {
    cn_run_span *sp = &r->spans[i];
    off[i] = r->state_off[sp->v] + sp->lo;
    len[i] = sp->hi - sp->lo;
    sp->at = at;
    at += len[i];
  }
  bool split = bk->vt->fetch_start != NULL && bk->vt->fetch_wait != NULL;
  const float *h = split ? bk->vt->fetch_start(bk, r->arena, off, len, (int)k)
                         : bk->vt->fetch_rows(bk, r->arena, off, len, (int)k);
  rc = backend_status(r, err);
  if (rc == 0 && h == NULL)
    rc = cn_err_set(err, CN_E_BACKEND, "backend '%s' could not copy the "
                    "run's results back", bk->vt->name);
  if (rc == 0) {
    r->host = h;
    r->fetching = split;
  }
  return rc;
}

int cn__run_fetch_wait(cn_run *r, cn_err *err) {
  if (!r->fetching) return 0;
  r->fetching = false;
  cn_backend_ctx *bk = r->bk;
  int rc = bk->vt->fetch_wait(bk, r->host);
  int st = backend_status(r, err);
  if (st != 0) rc = st;
  else if (rc != 0)
    rc = cn_err_set(err, CN_E_BACKEND, "backend '%s' could not copy the "
                    "run's results back", bk->vt->name);
  if (rc != 0) r->host = NULL;
  return rc;
}

int cn__run_copy_back(cn_run *r, const int *slots, int n, cn_err *err) {
  int rc = cn__run_fetch_start(r, slots, n, err);
  return rc != 0 ? rc : cn__run_fetch_wait(r, err);
}

json_t *cn_run_output(const cn_run *r, int slot) {
  if (slot < 0 || slot >= r->n_slots || !r->executed || !r->finished)
    return NULL; /* not executed, or on its way (cn_run_wait) */
  return r->fam->output(r, slot);
}

/* The answer of a slot written once into the output buffer: the family's
 * write() where it has one (every float by cn_f32_json, no json_t in
 * between), else its output() printed by cn_buf_json. A non-finite value
 * leaves b as it was and fails with cn_output_check's error. */
int cn_run_write_output(const cn_run *r, int slot, cn_buf *b, cn_err *err) {
  if (slot < 0 || slot >= r->n_slots || !r->executed || !r->finished)
    return cn_err_set(err, CN_E_INTERNAL, "slot %d has no output", slot);
  size_t at = b->len;
  if (r->fam->write != NULL) {
    char field[128] = "";
    int rc = r->fam->write(r, slot, b, field, sizeof(field));
    if (rc == 0 && b->failed) rc = CN_E_NOMEM;
    if (rc == 0) return 0;
    b->len = at;
    if (b->p != NULL) b->p[at] = '\0';
    if (rc == CN_E_NOMEM)
      return cn_err_set(err, rc, "no memory for the answer");
    return cn_err_set(err, CN_E_NON_FINITE, "the model computed a "
                      "non-finite value (NaN or infinity) for '%s'; JSON "
                      "cannot hold it (the weights or this input overflow)",
                      field);
  }
  json_t *o = r->fam->output(r, slot);
  int rc = cn_output_check(o, err);
  if (rc == 0) cn_buf_json(b, o);
  json_decref(o);
  if (rc == 0 && b->failed)
    rc = cn_err_set(err, CN_E_NOMEM, "no memory for the answer");
  return rc;
}

/* The first null under v (an output holds null only for a non-finite
 * value): true, with its field's path in path ("nodes[3].logits"). */
static bool find_null(const json_t *v, char *path, size_t at, size_t cap) {
  if (json_is_object(v)) {
    const char *k;
    const json_t *e;
    json_object_foreach((json_t *)v, k, e) {
      int n = snprintf(path + at, cap - at, "%s%s", at ? "." : "", k);
      size_t next = n < 0 ? at : at + (size_t)n;
      if (next >= cap) next = cap - 1;
      if (json_is_null(e) || find_null(e, path, next, cap)) return true;
      path[at] = '\0';
    }
    return false;
  }
  if (json_is_array(v)) {
    size_t i;
    const json_t *e;
    json_array_foreach(v, i, e) {
      if (json_is_null(e)) return true; /* a number of this array's */
      if (!json_is_object(e) && !json_is_array(e)) continue;
      int n = snprintf(path + at, cap - at, "[%zu]", i);
      size_t next = n < 0 ? at : at + (size_t)n;
      if (next >= cap) next = cap - 1;
      if (find_null(e, path, next, cap)) {
        /* a row of numbers ("logits" per token): name the array itself */
        if (json_is_array(e)) path[at] = '\0';
        return true;
      }
      path[at] = '\0';
    }
  }
  return false;
}

int cn_output_check(const json_t *o, cn_err *err) {
  char path[128] = "";
  if (o == NULL || !find_null(o, path, 0, sizeof(path))) return 0;
  return cn_err_set(err, CN_E_NON_FINITE, "the model computed a non-finite "
                    "value (NaN or infinity) for '%s'; JSON cannot hold it "
                    "(the weights or this input overflow)", path);
}
