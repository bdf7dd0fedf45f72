/* registry.c - the model families core serves, by model.json "family".
 *
 * The families themselves (core/families/) sit above run/: they build and
 * execute runs. The registry only lists their descriptors, by name, as
 * data: model/ calls a family through its cn_family pointers and never
 * includes families/ (the one link-level reference upward, on purpose:
 * the list of plugins, as ggml-backend-reg.cpp lists its backends). */
#include <string.h>

#include "model/model.h"

/* Defined in core/families/ (declared again in families/families.h). */
extern const cn_family cn__fam_treelstm;
extern const cn_family cn__fam_treelstm_2type;
extern const cn_family cn__fam_treegru;
extern const cn_family cn__fam_childsum;
extern const cn_family cn__fam_mvrnn;
extern const cn_family cn__fam_bilstm;
extern const cn_family cn__fam_latticelstm;
extern const cn_family cn__fam_latticegru;
extern const cn_family cn__fam_nmt;

static const cn_family *const families[] = {
    &cn__fam_treelstm, &cn__fam_treelstm_2type, &cn__fam_treegru,
    &cn__fam_childsum, &cn__fam_mvrnn,    &cn__fam_bilstm,
    &cn__fam_latticelstm, &cn__fam_latticegru, &cn__fam_nmt,
};

const cn_family *cn__family_find(const char *name) {
  if (name == NULL) return NULL;
  for (size_t i = 0; i < CN_ARRAY_SIZE(families); i++)
    if (strcmp(families[i]->name, name) == 0) return families[i];
  return NULL;
}

extern const cn_family cn__fam_cells;
const cn_family *cn__family_cells(void) { return &cn__fam_cells; }

int cn__family_count(void) { return (int)CN_ARRAY_SIZE(families); }

const cn_family *cn__family_at(int i) {
  return i >= 0 && i < (int)CN_ARRAY_SIZE(families) ? families[i] : NULL;
}
