/* crf.c - linear-chain CRF decoding (Lafferty et al. 2001) on top of a
 * tagger's emissions, as in the BiLSTM-CRF of Huang et al. 2015 §2.4:
 * docs/models.md bilstm-tagger "crf".
 *
 * With emissions e_t (the per-token logits) and crf.start [C], crf.end [C],
 * crf.trans [C, C] (trans[i, j]: tag j follows tag i, pytorch-crf's
 * transitions[from, to]), a path y_1..y_n scores
 *   start[y_1] + Σ_t e_t[y_t] + Σ_{t≥2} trans[y_{t-1}, y_t] + end[y_n],
 * and the Viterbi recursion finds the best one:
 *   δ_1[j] = start[j] + e_1[j]
 *   δ_t[j] = max_k (δ_{t-1}[k] + trans[k, j]) + e_t[j],  bp_t[j] = argmax_k
 *   y_n = argmax_j (δ_n[j] + end[j]),  y_{t-1} = bp_t[y_t].
 * The DP is float32 in pytorch-crf's order of operations ((δ + trans) + e),
 * so it stays within 1e-4 of a float32 PyTorch decode; the reported score
 * is the chosen path re-summed in double, then rounded to float.
 *
 * Batched across a run: step t advances every instance still at position t
 * together, a row of δ per instance (instances sorted by length, longest
 * first, so the live rows are always a prefix), not one instance after
 * another. The pass runs on the host once per run, after the engine has
 * computed every emission (cn_family.finish). */
#include <stdlib.h>
#include <string.h>

#include "families/families.h"

/* Path score in double, then float (docs/models.md: path_score). */
static float path_score(int C, const float *trans, const float *start,
                        const float *end, int32_t n, const float *const *e,
                        const int32_t *y) {
  double s = (double)start[y[0]] + (double)end[y[n - 1]];
  for (int32_t t = 0; t < n; t++) {
    s += (double)e[t][y[t]];
    if (t > 0) s += (double)trans[(int64_t)y[t - 1] * C + y[t]];
  }
  return (float)s;
}

int cn__crf_viterbi(int C, const float *trans, const float *start,
                    const float *end, int32_t n, const int32_t *len,
                    const float *const *rows, int32_t *tags, float *scores) {
  int rc = CN_E_NOMEM;
  int64_t total = 0, maxlen = 0;
  for (int32_t i = 0; i < n; i++) {
    total += len[i];
    if (len[i] > maxlen) maxlen = len[i];
  }
  int64_t *first = malloc(((size_t)n + 1) * sizeof(int64_t));
  int32_t *order = malloc(((size_t)n + 1) * sizeof(int32_t));
  int32_t *at = cn__xcalloc((size_t)maxlen + 2, sizeof(int32_t));
  float *delta = cn__xcalloc((size_t)n * (size_t)C + 1, sizeof(float));
  float *next = malloc(((size_t)C + 1) * sizeof(float));
  int32_t *bp = cn__xcalloc((size_t)total * (size_t)C + 1, sizeof(int32_t));
  if (first == NULL || order == NULL || at == NULL || delta == NULL ||
      next == NULL || bp == NULL)
    goto out;
  first[0] = 0;
  for (int32_t i = 0; i < n; i++) first[i + 1] = first[i] + len[i];
  /* order: the instances longest first, equal lengths in instance order
   * (a counting sort on key maxlen - len: at[key + 1] counts, then
   * at[key] is where the key's instances start). */
  for (int32_t i = 0; i < n; i++) at[maxlen - len[i] + 1]++;
  for (int64_t q = 1; q <= maxlen + 1; q++) at[q] += at[q - 1];
  for (int32_t i = 0; i < n; i++) order[at[maxlen - len[i]]++] = i;
  /* δ row a belongs to instance order[a]; rows [0, live) have len > t. */
  int32_t live = n;
  while (live > 0 && len[order[live - 1]] < 1) live--;
  for (int32_t a = 0; a < live; a++) {
    const float *e = rows[first[order[a]]];
    float *d = delta + (int64_t)a * C;
    for (int j = 0; j < C; j++) d[j] = start[j] + e[j];
  }
  for (int64_t t = 1; t < maxlen; t++) {
    while (live > 0 && len[order[live - 1]] <= t) live--;
    for (int32_t a = 0; a < live; a++) {
      int32_t i = order[a];
      float *d = delta + (int64_t)a * C;
      int32_t *b = bp + (first[i] + t) * C;
      /* k outer, j inner: a row of trans at a time; a strict > keeps the
       * lowest k among equal maxima (docs/models.md tie rule). */
      for (int j = 0; j < C; j++) next[j] = d[0] + trans[j], b[j] = 0;
      for (int k = 1; k < C; k++) {
        const float *tr = trans + (int64_t)k * C;
        for (int j = 0; j < C; j++) {
          float v = d[k] + tr[j];
          if (v > next[j]) next[j] = v, b[j] = k;
        }
      }
      const float *e = rows[first[i] + t];
      for (int j = 0; j < C; j++) d[j] = next[j] + e[j];
    }
  }
  /* Termination and backtracking, per instance (no arithmetic to batch). */
  for (int32_t a = 0; a < n; a++) {
    int32_t i = order[a], L = len[i];
    scores[i] = 0.0f;
    if (L < 1) continue;
    const float *d = delta + (int64_t)a * C;
    int32_t *y = tags + first[i];
    int best = 0;
    float bv = d[0] + end[0];
    for (int j = 1; j < C; j++)
      if (d[j] + end[j] > bv) bv = d[j] + end[j], best = j;
    y[L - 1] = best;
    for (int32_t t = L - 1; t > 0; t--)
      y[t - 1] = bp[(first[i] + t) * C + y[t]];
    scores[i] = path_score(C, trans, start, end, L, rows + first[i], y);
  }
  rc = 0;
out:
  free(first);
  free(order);
  free(at);
  free(delta);
  free(next);
  free(bp);
  return rc;
}

/* The run's pass: every slot's output rows (host-readable after
 * copy-back), decoded together; the tags land in r->out_tag at the output
 * vertices, the scores in r->out_score per slot. */
int cn__crf_decode_run(cn_run *r, int start, int end, int trans,
                       cn_err *err) {
  int rc = CN_E_NOMEM;
  int32_t n = r->n_slots;
  int64_t total = 0;
  for (int32_t s = 0; s < n; s++) total += r->slots[s].n_out;
  int32_t *len = cn__xcalloc((size_t)n + 1, sizeof(int32_t));
  int32_t *tags = malloc(((size_t)total + 1) * sizeof(int32_t));
  const float **rows = cn__xcalloc((size_t)total + 1, sizeof(float *));
  r->out_tag = malloc(((size_t)r->nv + 1) * sizeof(int32_t));
  r->out_score = malloc(((size_t)n + 1) * sizeof(float));
  if (len == NULL || tags == NULL || rows == NULL || r->out_tag == NULL ||
      r->out_score == NULL)
    goto out;
  int64_t k = 0;
  for (int32_t s = 0; s < n; s++) {
    const cn_run_slot *sl = &r->slots[s];
    len[s] = sl->n_out;
    for (int32_t t = 0; t < sl->n_out; t++)
      rows[k++] = cn__run_state_host(r, sl->out_v0 + t);
  }
  const cn_model *m = r->m;
  rc = cn__crf_viterbi((int)m->dims.C, m->w[trans]->data, m->w[start]->data,
                       m->w[end]->data, n, len, rows, tags, r->out_score);
  if (rc != 0) goto out;
  k = 0;
  for (int32_t s = 0; s < n; s++)
    for (int32_t t = 0; t < r->slots[s].n_out; t++)
      r->out_tag[r->slots[s].out_v0 + t] = tags[k++];
out:
  if (rc != 0) {
    free(r->out_tag);
    free(r->out_score);
    r->out_tag = NULL;
    r->out_score = NULL;
    cn_err_set(err, rc, "no memory for the CRF decoding of %d instances",
               (int)n);
  }
  free(len);
  free(tags);
  free(rows);
  return rc;
}
