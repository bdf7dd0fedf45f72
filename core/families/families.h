/* families.h - the family descriptors, and helpers the tree families share. */
#ifndef CANOPY_FAMILIES_H
#define CANOPY_FAMILIES_H

#include "run/run_api.h"

extern const cn_family cn__fam_treelstm;
extern const cn_family cn__fam_treelstm_2type;
extern const cn_family cn__fam_treegru;
extern const cn_family cn__fam_childsum;
extern const cn_family cn__fam_mvrnn;
extern const cn_family cn__fam_bilstm;
extern const cn_family cn__fam_latticelstm;
extern const cn_family cn__fam_latticegru;
extern const cn_family cn__fam_nmt;
extern const cn_family cn__fam_cells; /* the template (cells_family.c) */

/* ---- tree families (answers.c) ---- */
/* The descriptor of a tree classifier (treelstm, treelstm-2type, treegru,
 * childsum-treelstm, mvrnn): tree input, an output layer over classes, and
 * the count, output, write, reads and answer bound of answers.c. What
 * each family has of its own is given: its name, the most children per
 * node (0: the limit's), its tensors, build(), state_floats() and cell(),
 * then its type names, the output type last (n_types is their number).
 * What the five share is set here only, so a field every tree family
 * needs is added in one place. */
#define CN__TREE_FAMILY(NAME, ARITY, TENSORS, BUILD, STATE_FLOATS, CELL, ...) \
  {                                                                         \
      .name = (NAME),                                                       \
      .input = CN_INPUT_TREE,                                               \
      .n_types = (int)(sizeof((const char *[]){__VA_ARGS__}) /              \
                       sizeof(const char *)),                               \
      .type_names = {__VA_ARGS__},                                          \
      .has_classes = true,                                                  \
      .max_arity = (ARITY),                                                 \
      .tensors = (TENSORS),                                                 \
      .build = (BUILD),                                                     \
      .count = cn__tree_count,                                              \
      .state_floats = (STATE_FLOATS),                                       \
      .output = cn__tree_output_h,                                          \
      .write = cn__tree_write_h,                                            \
      .reads = cn__tree_reads_h,                                            \
      .answer_bound = cn__tree_answer_bound,                                \
      .cell = (CELL),                                                       \
  }

typedef struct cn_tree_types {
  int leaf, internal_a, internal_b, output; /* internal_b < 0: one kind */
  bool by_node_type; /* every node's type is inst->node_type[i] (cells)  */
} cn_tree_types;

/* Adds the vertices of a tree instance: one per node, built children first
 * (reverse pre-order), then one output vertex per requested node (the root,
 * or every node in pre-order). A node's inputs are its children, in order. */
int cn__tree_build(cn_run *r, int slot, const cn_tree_types *tt);
/* A DAG instance's node vertices (inputs: the predecessors) and one
 * output vertex at its sink (latticegru.c). */
int cn__dag_build(cn_run *r, int slot, int node_type, int out_type);
/* build() of the families with types {leaf, internal, output}. */
int cn__tree_build3(cn_run *r, int slot);
/* output() of the tree families: "h" is the first H floats of the root. */
json_t *cn__tree_output_h(const cn_run *r, int slot);
/* Vertices of a tree instance: its nodes, plus one output per node
 * (outputs=all) or one for the root. */
int64_t cn__tree_count(const cn_instance *in, unsigned flags, int max_decode);
/* The per-instance object: logits/label/label_name of the root, "nodes"
 * for outputs=all, "h" (the first h_floats of the root's state). */
json_t *cn__tree_output(const cn_run *r, int slot, int h_floats);
/* reads() of the tree families (cn__tree_output, h_floats of the root). */
void cn__tree_reads(cn_run *r, int slot, int h_floats);
void cn__tree_reads_h(cn_run *r, int slot);
/* The logits rows cn__tagger_output reads (hidden rows: the family's). */
void cn__tagger_reads(cn_run *r, int slot);
/* Taggers' per-token object: "logits" and "tags" per position (output
 * vertices out_v0 .. + n_out), "tag_names" when the model has labels, and
 * "h" per position from hidden(r, slot, i, buf) when CN_OUT_HIDDEN. The
 * tags are the run's decoded ones (r->out_tag, with "path_score" from
 * r->out_score) when the family's finish() pass made them, else each
 * token's argmax. */
json_t *cn__tagger_output(const cn_run *r, int slot, int h_floats,
                          void (*hidden)(const cn_run *r, int slot, int i,
                                         float *buf));
/* The classifier's object: logits, label, label_name of one output row. */
json_t *cn__logits_object(const cn_run *r, json_t *o, const float *z);
/* o["nodes"]: the classifier's object of each of the slot's output
 * vertices, in order (outputs=all of a tree). */
void cn__logits_nodes(const cn_run *r, int slot, json_t *o);
/* The same objects written straight into b (family write()): 0, or
 * CN_E_NON_FINITE with the field named as cn_output_check names it. */
int cn__tree_write(const cn_run *r, int slot, int h_floats, cn_buf *b,
                   char *field, size_t cap);
int cn__tree_write_h(const cn_run *r, int slot, cn_buf *b, char *field,
                     size_t cap);
int cn__tagger_write(const cn_run *r, int slot, int h_floats,
                     void (*hidden)(const cn_run *r, int slot, int i,
                                    float *buf),
                     cn_buf *b, char *field, size_t cap);
/* cn__logits_object's keys, without the braces; false on a non-finite
 * logit. */
bool cn__logits_write(const cn_run *r, cn_buf *b, const float *z);
/* ---- linear-chain CRF decoding (crf.c) ---- */
/* Viterbi over n instances at once (docs/models.md bilstm-tagger "crf"):
 * instance i has len[i] ≥ 0 tokens whose emissions (C floats each) are
 * rows[first_i + t], first_i = Σ_{k<i} len[k]. trans is [C, C] row-major,
 * trans[a·C + b] the score of tag b following tag a; start, end [C].
 * Writes the best path to tags[first_i ..] (ties: lowest previous tag at
 * each backpointer, lowest final tag) and its score, re-summed in double
 * and rounded to float, to scores[i] (0 for an empty instance). Returns 0
 * or CN_E_NOMEM. */
int cn__crf_viterbi(int C, const float *trans, const float *start,
                    const float *end, int32_t n, const int32_t *len,
                    const float *const *rows, int32_t *tags, float *scores);
/* A finish() pass: decodes every slot of the run together from its
 * output vertices' host rows, with the model's tensors start, end, trans
 * (indices into m->w); fills r->out_tag and r->out_score. */
int cn__crf_decode_run(cn_run *r, int start, int end, int trans,
                       cn_err *err);

/* ---- vertex functions as op IR (ir_common.c, core/cell/cell.h) ---- */
struct cn_ir;
/* logits = out.W [h_1; ...; h_n_in] + out.b, h_k = first H floats of
 * input edge k. */
int cn__ir_output_layer(const cn_model *m, struct cn_ir *g, int n_in, int W,
                        int B);
/* An LSTM vertex's outputs from its output gate o (after σ) and cell c:
 * h = o ⊙ tanh(c) at column 0, c at H; state_floats 2H. Returns 0. */
int cn__ir_lstm_state(struct cn_ir *g, int o, int c, int H);
/* nn.LSTMCell on x = E[vaux], previous [h | c] = input edge 0. */
int cn__ir_lstm_cell(const cn_model *m, struct cn_ir *g, int E, int Wih,
                     int Whh, int bih, int bhh);
/* nn.GRUCell on IR nodes x and hp; output h at column 0. */
int cn__ir_gru_cell(const cn_model *m, struct cn_ir *g, int x, int hp,
                    int Wih, int Whh, int bih, int bhh);

/* ---- answer bounds (cn_model_answer_bound): each mirrors an output
 * helper above, counting every character it can print ---- */
/* An array of n floats: brackets, commas, CN_JSON_FLOAT_MAX each. */
int64_t cn__bound_floats(int64_t n);
/* An integer in [0, max]. */
int64_t cn__bound_int(int64_t max);
/* cn__logits_object's object, braces included. */
int64_t cn__bound_logits_object(const cn_model *m);
/* cn__tree_output for a tree of n nodes. */
int64_t cn__bound_tree(const cn_model *m, int64_t n, unsigned flags,
                       int64_t h_floats);
/* cn__tagger_output for n positions. */
int64_t cn__bound_tagger(const cn_model *m, int64_t n, unsigned flags,
                         int64_t h_floats);
/* answer_bound of the families whose output is cn__tree_output_h. */
int64_t cn__tree_answer_bound(const cn_model *m, const cn_instance *in,
                              unsigned flags, int max_decode_len);

/* JSON helpers: a non-finite float becomes null (cn_output_check). */
json_t *cn__json_float(double x);
json_t *cn__json_floats(const float *x, int64_t n);
int cn__argmax(const float *x, int n);

#endif
