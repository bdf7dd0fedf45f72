/* kserve_impl.h - what kserve_answer.c (answers, on the workers) gives
 * kserve.c (metadata, requests): the output tensors and what a model
 * answers. */
#ifndef CANOPY_SERVER_KSERVE_IMPL_H
#define CANOPY_SERVER_KSERVE_IMPL_H

#include "work.h"

/* The output tensors, in the order they are answered (CN__V2_* bits). */
typedef struct cn__v2_output {
  const char *name, *dtype;
  unsigned bit;
} cn__v2_output;
enum { CN__V2_N_OUTPUTS = CN__V2_TENSORS };
extern const cn__v2_output cn__v2_outputs[CN__V2_N_OUTPUTS];

/* What a model's answers hold, from its description (cn_model_describe). */
typedef struct cn__v2_sig {
  const char *family, *input;
  long long classes;  /* LOGITS' width                                   */
  long long hidden;   /* HIDDEN's: "hidden", twice where the input is read
                         both ways (bilstm-tagger, cells "bisequence"); a
                         test checks it against the answers              */
  unsigned outputs;   /* CN__V2_* the model can answer                   */
} cn__v2_sig;
void cn__v2_model_sig(const cn__model_entry *me, cn__v2_sig *g);

/* {"name", "datatype", "shape": [d0] or [d0, d1] (d1 < 0: 1-D)}. */
json_t *cn__v2_tensor_meta(const char *name, const char *dtype, long long d0,
                           long long d1);

#endif
