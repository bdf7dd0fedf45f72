/* model.h - a loaded model and its instances (model/): the family
 * interface (cn_family: what a family gives a run), the bound weights and
 * vocabularies, the compiled cells, the registry of families, and the
 * parsed INSTANCE forms. Depends on base/, input/ and cell/. */
#ifndef CANOPY_MODEL_H
#define CANOPY_MODEL_H

#include "base/base.h"
#include "cell/cell.h"
#include "input/input.h"

/* ---- families (core/families/) ------------------------------------------- */
typedef struct cn_run cn_run;
typedef struct cn_family cn_family;
struct cn_ir;  /* core/cell/cell.h */
struct cn_cell;

/* Sizes a family's tensor shapes are written in. */
typedef struct cn_dims {
  int64_t H, D, C, V;     /* hidden, embed, classes, vocab                  */
  int64_t Vw, Dw, Vt, K;  /* word vocab/embed, target vocab, mvrnn matrices */
  bool crf;               /* model.json "crf": the family's CRF tensors too
                             (bilstm-tagger, docs/models.md)               */
} cn_dims;

enum {
  CN_INIT_LINEAR = 0, /* U(-1/√fan_in, 1/√fan_in), fan_in = last dim        */
  CN_INIT_BIAS,       /* U(-1/√H, 1/√H)                                     */
  CN_INIT_EMBED,      /* N(0, 1) scaled to unit-ish rows: U(-1, 1)·√3/√D…   */
  CN_INIT_MATRICES,   /* identity + small noise, per [K, H, H] slice        */
  CN_INIT_SCORES      /* U(-0.1, 0.1): CRF scores, as pytorch-crf's
                         CRF.reset_parameters                              */
};

typedef struct cn_tensor_spec {
  const char *name;
  int ndim;
  int64_t shape[3]; /* -1: any size ≥ 1 (checked as such) */
  int init;
} cn_tensor_spec;

struct cn_family {
  const char *name;
  cn_input_kind input;
  int n_types;
  const char *type_names[CN_MAX_TYPES];
  bool has_classes; /* has an output layer with C classes */
  /* accepts model.json "crf" (docs/models.md, bilstm-tagger) */
  bool crf;
  int max_arity;    /* trees: most children per node (0: lim->max_children) */
  /* The tensors of the family at these sizes, in binding order; returns
   * their number (≤ CN_MAX_TENSORS). */
  int (*tensors)(const cn_dims *d, cn_tensor_spec *out);
  /* The graph grows while it runs (lstm-nmt decoding): decoded() adds the
   * vertices of later steps; build() reserves their count in r->reserve. */
  bool dynamic;
  /* Adds the instance's vertices to the run; returns 0 or an error. */
  int (*build)(cn_run *r, int slot);
  /* Vertices build() will add for this instance (upper bound for families
   * whose graph is decided at run time; max_decode_len 0: default). */
  int64_t (*count)(const cn_instance *in, unsigned flags, int max_decode_len);
  /* Floats of per-vertex state (the vertex's row in its type buffer). */
  int64_t (*state_floats)(const cn_model *m, int type);
  /* Optional: after each batch's cell ran, what a dynamic family decides
   * from its results on the host (lstm-nmt: the argmax of the projection's
   * logits, then each instance's next step). A type whose state_floats()
   * is 0 keeps no row in the arena: its cell's results are out (n rows of
   * ld floats in the batch's scratch), read here and then gone. */
  void (*decoded)(cn_run *r, int type, const int32_t *verts, int n,
                  const float *out, int ld);
  /* After every batch ran and the states are host-readable
   * (cn__run_state_host): one pass over the whole run on the host, e.g.
   * bilstm-tagger's CRF decoding of every instance together. Fills
   * r->out_tag / r->out_score; returns 0 or an error. NULL: none. */
  int (*finish)(cn_run *r, cn_err *err);
  /* Writes the per-instance output object (docs/api.md). */
  json_t *(*output)(const cn_run *r, int slot);
  /* output()'s object written straight into b, key for key the same
   * JSON (cn_run_write_output), with no json_t in between: 0, or
   * CN_E_NON_FINITE with field naming the first non-finite value's field
   * as cn_output_check does ("nodes[3].logits"). NULL: output() and
   * cn_buf_json stand in. */
  int (*write)(const cn_run *r, int slot, cn_buf *b, char *field,
               size_t cap);
  /* Names, with cn__run_need, every state span output() and finish()
   * read for this slot: a device backend copies back exactly these
   * and no more. It mirrors output() field by field, as answer_bound. */
  void (*reads)(cn_run *r, int slot);
  /* An upper bound on the bytes of output()'s JSON for this instance,
   * flags and max_decode_len (cn_model_answer_bound); it mirrors output()
   * field by field, so the two change together. */
  int64_t (*answer_bound)(const cn_model *m, const cn_instance *in,
                          unsigned flags, int max_decode_len);
  /* The vertex function of every type as op IR (core/cell/cell.h),
   * compiled at load for every layout; returns 0 (non-zero: the family's
   * bug, refused at load). */
  int (*cell)(const cn_model *m, int type, struct cn_ir *g);
};

/* model.c: the most bytes string s prints as in JSON: quotes, and each
 * byte jansson escapes at its escaped length ("\\n": 2, "\\u001f": 6;
 * '/' counted as escaped too); other bytes, UTF-8 included, as they are. */
int64_t cn__json_string_bound(const char *s);

/* registry.c: the family of a model.json "family" name (NULL: none), and
 * the registered families by index. */
const cn_family *cn__family_find(const char *name);
/* registry.c: the template of "family": "cells" (core/families/cells_family.c):
 * its callbacks read the model's cn_cells; the loader copies it into the
 * model with the types the model.json names. Not among the families by
 * index (it has no tensors of its own to init). */
const cn_family *cn__family_cells(void);
int cn__family_count(void);
const cn_family *cn__family_at(int i);
/* model.c: "treelstm, treegru, ..." (every registered family) into buf. */
void cn__family_names(char *buf, size_t cap);
/* model.c: whether the family sizes a tensor by Vw (word_vocab) or by Vt
 * (tgt_vocab), i.e. which extra vocabularies its model.json must name. */
void cn__family_needs(const cn_family *fam, bool *word, bool *tgt);

/* ---- models (model.c) ---------------------------------------------------*/

struct cn_model {
  /* unique among the models this process loads (never 0 once loaded): a
   * backend may keep what it derives from the weights under it */
  uint64_t uid;
  char *dir;
  int dirfd;              /* the directory, open while it loads; else -1 */
  const cn_family *fam;
  json_t *json;           /* model.json, kept for describe() */
  cn_dims dims;
  cn_vocab *vocab;        /* input tokens / characters */
  cn_vocab *word_vocab;   /* latticelstm */
  cn_vocab *tgt_vocab;    /* lstm-nmt */
  char **labels;          /* C names or NULL */
  int n_labels;
  bool lowercase;
  char **type_b_labels;   /* treelstm-2type */
  int n_type_b_labels;
  int max_decode_len;     /* lstm-nmt */
  /* the longest label (labels) and target token (tgt_vocab, "<unk>"
   * included) as JSON strings, quotes and escapes counted: for
   * cn_model_answer_bound */
  int64_t json_label_max, json_token_max;
  cn_lexicon *lexicon;    /* latticelstm: loaded from lexicon_path      */
  char *lexicon_path;     /* latticelstm: model.json "lexicon", joined to dir;
                             NULL when absent */
  cn_safetensors st;
  int n_tensors;
  const cn_tensor *w[CN_MAX_TENSORS]; /* in the family's spec order */
  /* compiled vertex functions (core/cell/cell.h): [layout][type], one
   * for every type */
  struct cn_cell *cell[CN_LAYOUT__COUNT][CN_MAX_TYPES];
  /* "family": "cells" (cells_json.c): the description, and the family
   * record made from it (fam points there); NULL for a built-in family */
  struct cn_cells *cells;
  cn_family *own_fam;
};

/* The model's compiled cell of a type for a layout. */
static inline const cn_cell *cn__model_cell(const cn_model *m, cn_layout l,
                                            int type) {
  return m->cell[l][type];
}
/* model.c: cn__cell_compile_weights with model m's tensors and names. */
int cn__cell_compile(const cn_model *m, int type, const cn_ir *g, int layout,
                     cn_cell **out, cn_err *err);

/* ---- models described by cells (cells_json.c, docs/cells.md) -------------*/
typedef enum cn_cells_structure {
  CN_CELLS_TREE,
  CN_CELLS_SEQUENCE,
  CN_CELLS_BISEQUENCE, /* types: forward, backward                         */
  CN_CELLS_DAG
} cn_cells_structure;

typedef enum cn_cells_when {
  CN_WHEN_LEAF,
  CN_WHEN_INTERNAL,
  CN_WHEN_LABELS,   /* internal tree nodes with a listed label            */
  CN_WHEN_STEP,
  CN_WHEN_FORWARD,
  CN_WHEN_BACKWARD,
  CN_WHEN_NODE
} cn_cells_when;

typedef struct cn_cells_type {
  char name[32];
  int when;          /* cn_cells_when */
  char **labels;     /* CN_WHEN_LABELS, owned */
  int n_labels;
  int n_ops;         /* JSON ops */
  struct cn_ir *ir;  /* the lowered op graph, owned                       */
} cn_cells_type;

typedef struct cn_cells {
  int structure;     /* cn_cells_structure */
  int arity;         /* trees: most children, 0: any                       */
  int state;         /* floats of every non-output vertex's state          */
  int h0, hw;        /* "hidden": state columns [h0, h0 + hw) are "h"      */
  int n_types;       /* described types; the output type is type n_types   */
  cn_cells_type type[CN_MAX_TYPES - 1];
  int leaf, internal;/* trees: the leaf and the internal type              */
  int out_c0, out_w; /* output: state columns it reads (per direction)     */
  struct cn_ir *out_ir;
} cn_cells;

/* Reads m->json "cells" against the opened weights (m->st) and vocabulary
 * (m->dims.V): checks it in full (docs/cells.md "Tensors" lists what is
 * refused), lowers each type's ops into the op IR, binds m->w in the order
 * the ops first name the tensors, and makes m->own_fam (m->fam) from the
 * cells template. file names model.json in errors. */
int cn__cells_load(cn_model *m, const char *file, cn_err *err);
void cn__cells_free(cn_cells *c);
/* A tree node's vertex type in a cells model (docs/cells.md). */
int cn__cells_tree_type(const cn_model *m, const cn_tree_node *nd);

/* ---- instances (instance.c) ---------------------------------------------*/
struct cn_instance {
  const cn_model *m;
  cn_input_kind kind;
  cn_tree tree;           /* CN_INPUT_TREE; a line reader's (in_arena)
                             has n_nodes, height and children, no nodes
                             or pool: only cn__tree_finish read them */
  int32_t *ids;           /* per node: word id (trees), token ids (seq)... */
  uint8_t *node_type;     /* trees: per node vertex type (family's index) */
  /* trees: node i's children are tree.children[child_start[i] ..
   * child_start[i + 1]) (n + 1 entries): the nodes' first_child and
   * n_children in 4 bytes a node, for what walks a run's trees long
   * after they were parsed (cn__tree_build) */
  int32_t *child_start;
  int32_t n;              /* tree nodes / tokens / chars / DAG nodes */
  /* lattices: word spans [start, end) and their word_vocab ids, sorted by
   * (end, start); DAGs: predecessors of node j are
   * prev[prev_start[j] .. prev_start[j + 1]). */
  int32_t n_spans;
  int32_t *span_start, *span_end, *span_word;
  int32_t *prev_start, *prev;
  int32_t n_unknown_labels; /* trees: cn_instance_unknown_labels        */
  bool in_arena;          /* every array above is a line reader's
                             (instance_line.c): cn_instance_free leaves it */
};

/* instance.c: a parsed tree's word ids and cell kinds into in->ids and
 * in->node_type (allocated here when NULL), the arity checked. */
int cn__tree_finish(const cn_model *m, const cn_limits *lim, bool from_json,
                    cn_instance *in, cn_err *err);

/* ---- sequences, lattices, DAGs (seq_parse.c) ----------------------------
 * Parse the non-tree INSTANCE forms of docs/api.md into *in (kind already set).
 * Errors: CN_E_BAD_INSTANCE / CN_E_BAD_LATTICE / CN_E_TOO_LARGE with the
 * offending token, span or node in err->node. */
int cn__parse_sequence(const cn_model *m, const json_t *inst,
                       const cn_limits *lim, cn_instance *in, cn_err *err);
int cn__parse_lattice(const cn_model *m, const json_t *inst,
                      const cn_limits *lim, cn_instance *in, cn_err *err);
int cn__parse_dag(const cn_model *m, const json_t *inst, const cn_limits *lim,
                  cn_instance *in, cn_err *err);
/* "text" split as cn__parse_sequence (words at Unicode whitespace) or
 * cn__parse_lattice (chars: code points) split it, into (*ps)[i],
 * (*pl)[i], arrays grown to *cap and kept by the caller. Returns the
 * count, -1 past max items, -2 out of memory. */
int32_t cn__split_text(const char *s, size_t len, bool chars, int32_t max,
                       const char ***ps, int32_t **pl, int32_t *cap);

#endif /* CANOPY_MODEL_H */
