/* backend.h - the one narrow interface between core/ and a compute backend.
 *
 * core/ plans every buffer and decides every batch; a backend only moves
 * bytes and runs kernels on memory it allocated. All pointers passed to the
 * compute entries are backend memory (host memory for cpu, device memory for
 * cuda). Matrices are row-major float32. Weight matrices are stored [out, in]
 * (nn.Linear), so every product is C = A · Wᵀ.
 *
 * A context belongs to one thread at a time (one worker: one context, one
 * CUDA stream). Compute calls may be asynchronous; sync() waits for them.
 */
#ifndef CANOPY_BACKEND_H
#define CANOPY_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "canopy_core.h"

typedef struct cn_backend_vt cn_backend_vt;

/* Every backend context starts with this header (its own fields follow). */
struct cn_backend_ctx {
  const cn_backend_vt *vt;
  long long kernels; /* compute calls issued, for run statistics */
  cn_backend_counters ctr; /* kept by the backend */
};

/* ---- the fused elementwise program of a compiled vertex function ----
 * Operands are (slot, col): row r of slot s starts at
 *   base + (off != NULL ? off[r] : r · ld)
 * and the operand reads/writes floats [col, col + width) of that row. off
 * is a HOST index array (the run's staging, valid until the batch returns);
 * off[r] < 0 reads as a zero row (a missing child) and is never written.
 * ld = 0 with off = NULL is one row shared by every r (a bias). The slot
 * numbered tmp_slot has base NULL: the backend's own per-row scratch of
 * tmp_width floats (values that never leave the kernel). slot < 0 in an
 * operand is the constant k. Every operand of an instruction has its
 * width; instructions run in order, each over its whole width, row by row
 * (so a later instruction may read what an earlier one wrote in the same
 * row, at any column). */
/* The instruction set, written once: X(NAME, ARITY, EXPR) for each op,
 * in the order of its number (CN_EW_MOV = 0, ...). EXPR computes one float
 * of d from the floats a and b of the operands (b only when ARITY is 2);
 * a backend expands the list where it runs the ops (cpu_ew.c's row loops,
 * cuda_ew.cu's kernel), after defining the functions EXPR calls:
 * cn_ew_sigmoid(x) = 1/(1+e^-x), cn_ew_tanh(x) and cn_ew_exp(x), each to
 * the accuracy of docs/models.md; cn_ew_relu(x) = x > 0 ? x : 0 and
 * cn_ew_step(x) = x > 0 ? 1 : 0, exactly (a NaN gives 0: STEP is a mask
 * for a choice made per element). */
#define CN_EW_OPS(X)                                      \
  X(MOV, 1, a)                  /* d = a            */    \
  X(ADD, 2, a + b)              /* d = a + b        */    \
  X(SUB, 2, a - b)              /* d = a - b        */    \
  X(MUL, 2, a * b)              /* d = a * b        */    \
  X(DIV, 2, a / b)              /* d = a / b        */    \
  X(SIGMOID, 1, cn_ew_sigmoid(a)) /* d = 1/(1+e^-a) */    \
  X(TANH, 1, cn_ew_tanh(a))     /* d = tanh(a)      */    \
  X(EXP, 1, cn_ew_exp(a))       /* d = e^a          */    \
  X(RELU, 1, cn_ew_relu(a))     /* d = max(a, 0)    */    \
  X(STEP, 1, cn_ew_step(a))     /* d = a > 0 ? 1 : 0 */

enum cn_ew_op {
#define CN_EW_ENUM_(NAME, ARITY, EXPR) CN_EW_##NAME,
  CN_EW_OPS(CN_EW_ENUM_)
#undef CN_EW_ENUM_
  CN_EW__COUNT /* the number of ops; not an op */
};

/* Whether op reads its b operand (otherwise b may hold anything). */
static inline bool cn_ew_binary(int op) {
  switch (op) {
#define CN_EW_BIN_(NAME, ARITY, EXPR) case CN_EW_##NAME: return ARITY == 2;
    CN_EW_OPS(CN_EW_BIN_)
#undef CN_EW_BIN_
  default: return false;
  }
}

typedef struct cn_ew_arg {
  int16_t slot; /* < 0: the constant k */
  int32_t col;
  float k;
} cn_ew_arg;

typedef struct cn_ew_insn {
  uint8_t op;     /* enum cn_ew_op */
  int32_t width;
  cn_ew_arg d, a, b;
} cn_ew_insn;

typedef struct cn_ew_slot {
  float *base;
  int64_t ld;
  const int64_t *off;
} cn_ew_slot;

typedef struct cn_ew_prog {
  int n_insn;
  const cn_ew_insn *insn;
  int n_slots;
  int tmp_slot;  /* -1: none */
  int tmp_width; /* floats of per-row scratch */
  /* A segment loop (segment ops fused, when edge_end > edge_begin): for
   * each row r, instructions [0, edge_begin) run, then [edge_begin,
   * edge_end) once per edge e = seg[r] .. seg[r + 1] - 1 in order (seg: a
   * host array of n + 1), then the rest. In the loop, slots >= edge_slot0
   * (other than tmp_slot) are rows of the edges: row e, their off arrays
   * seg[n] long; every other slot stays row r (an accumulator: d = d + x
   * sums over the segment). */
  int edge_begin, edge_end, edge_slot0;
  const int64_t *seg;
} cn_ew_prog;

/* One part of a product over a concatenation (gemm_rows): K columns of
 * the left operand whose row r lies at base + off[r] (off != NULL: a HOST
 * index array as above; off[r] < 0 reads zeros) or at base + r·ld (off ==
 * NULL), multiplied by W's K columns (rows of W ldw floats apart). */
#define CN_GEMM_PARTS 8
typedef struct cn_gemm_part {
  const float *base;
  const int64_t *off;
  int64_t ld;
  int K;
  const float *W;
  int ldw;
} cn_gemm_part;

struct cn_backend_vt {
  const char *name;
  /* true when backend memory is ordinary host memory (cpu): core then reads
   * results and index arrays in place instead of copying them. */
  bool host_memory;
  void (*close)(cn_backend_ctx *bk);
  /* Optional: gives back memory kept for reuse between runs (cpu: the
   * spare run arenas). A daemon's idle worker calls it. */
  void (*release)(cn_backend_ctx *bk);

  /* ---- memory ---- */
  /* Backend memory for a run arena; NULL on failure. */
  void *(*alloc)(cn_backend_ctx *bk, size_t bytes);
  void (*free)(cn_backend_ctx *bk, void *p);
  /* Optional: a run (or decoding session) is about to bind the weights of
   * model `uid` (weights() for each tensor). What the backend derived from
   * the weights of another uid's runs may be stale: that model may be
   * freed and its memory another model's. uid 0: a model of unknown
   * identity, nothing derived from an earlier run may be used. (cpu: the
   * packed copies it made.) */
  void (*run_begins)(cn_backend_ctx *bk, uint64_t uid);
  /* A backend copy of a model tensor, made once per (context, tensor) and
   * kept until close (cpu: the host pointer itself). */
  const float *(*weights)(cn_backend_ctx *bk, const float *host, size_t n);
  void (*to_device)(cn_backend_ctx *bk, void *dst, const void *src, size_t n);
  void (*to_host)(cn_backend_ctx *bk, void *dst, const void *src, size_t n);
  void (*sync)(cn_backend_ctx *bk);
  /* Brings n spans of backend memory to the host after all work issued so
   * far: span k is len[k] floats at base + off[k] (off, len: host arrays),
   * packed one after the other. Returns their host address: a buffer the
   * backend owns and grows, valid until the next fetch_rows on this
   * context, its release() or close. One wait for the device, whatever n
   * (n = 0 just waits). NULL on failure (status() says why). Required
   * when host_memory is false; core reads in place otherwise. */
  const float *(*fetch_rows)(cn_backend_ctx *bk, const float *base,
                             const int64_t *off, const int64_t *len, int n);
  /* Optional, both or neither: fetch_rows in two
   * halves, so the host can prepare the next run while the device
   * computes this one. fetch_start issues the gather and the copy after
   * all work issued so far and returns at once; the buffer it returns
   * holds the rows once fetch_wait(bk, buf) has returned 0 (-1: failed,
   * status() says why). A context keeps two fetch buffers and uses them
   * in turn: a buffer stays valid until the second fetch after its own
   * (fetch_rows counts as one). Starting a fetch waits for the one
   * that last used its buffer, if nobody did. */
  const float *(*fetch_start)(cn_backend_ctx *bk, const float *base,
                              const int64_t *off, const int64_t *len, int n);
  int (*fetch_wait)(cn_backend_ctx *bk, const float *buf);
  /* Optional (a device, where each copy is a command the stream runs in
   * order between kernels): the index arrays of the batch
   * about to launch, `words` int64 at host (HOST memory; pointer arrays
   * and slot tables among them), all written before its first compute
   * call: uploaded in one copy. Until the next stage_indices, a compute
   * call's host index array (off, idx, seg, a pointer array) that lies
   * inside [host, host + words) is read from that copy, so the host must
   * not change those words meanwhile; any other array is staged by the
   * call itself, as without it. words = 0 ends the batch's copy. */
  void (*stage_indices)(cn_backend_ctx *bk, const int64_t *host,
                        size_t words);

  /* ---- compute ---- */
  /* C[M,N] = A[M,K] · W[N,K]ᵀ + beta·C (+ bias[N] broadcast over rows when
   * bias != NULL). */
  void (*gemm)(cn_backend_ctx *bk, int M, int N, int K, const float *A,
               int lda, const float *W, int ldw, const float *bias,
               float beta, float *C, int ldc);
  /* Optional: C[M,N] = Σ_q A_q · W_qᵀ + beta·C (+ bias) over n_parts ≤
   * CN_GEMM_PARTS parts, each part's rows read where they lie: the product
   * of a concatenation computed as a sum of partial products, so nothing
   * copies the rows together first (Serenity §3.3's identity rewriting;
   * XNNPACK's indirect GEMM). Each element must equal what gemm gives for
   * the parts' rows copied side by side and W_q side by side, so a batch's
   * answers do not depend on which path ran. Without it core gathers the
   * parts into its scratch and calls gemm (cn__run_gemm_rows). */
  void (*gemm_rows)(cn_backend_ctx *bk, int M, int N, int n_parts,
                    const cn_gemm_part *parts, const float *bias, float beta,
                    float *C, int ldc);
  /* For r < count: C_r[M,N] = A_r[M,K] · B_r[K,N] (+ beta·C_r), with
   * A_r = A + r·sa etc. (cublasSgemmStridedBatched shape; B not transposed). */
  void (*gemm_strided)(cn_backend_ctx *bk, int count, int M, int N, int K,
                       const float *A, int lda, long long sa, const float *B,
                       int ldb, long long sb, float beta, float *C, int ldc,
                       long long sc);
  /* For r < count: C_r[M,N] = Σ_{t < terms} A_{t,r}[M,K] · B_{t,r}[K,N]
   * (+ beta·C_r): each operand given by a HOST array of pointers (device
   * pointers on a device; one may repeat: a weight shared by the batch),
   * A and B term-major (A[t·count + r]), C count long. The terms of one
   * output are summed in term order, C_r accumulated in place (a device
   * may run one batched product per term).
   * Per-vertex products (core/cell/cell.h CN_IR_BMM: MV-RNN's matrices).
   * A_r (B_r) may be NULL: the identity, M = K and lda = K (K = N and
   * ldb = N), so C_r is the other operand (+ beta·C_r), added exactly.
   * Each element summed in one fixed order whatever count is, as gemm. */
  void (*gemm_batched)(cn_backend_ctx *bk, int count, int terms, int M,
                       int N, int K, const float *const *A, int lda,
                       const float *const *B, int ldb, float beta,
                       float *const *C, int ldc);
  /* dst[r, 0:width] = base[idx[r] : idx[r] + width], or zeros when
   * idx[r] < 0; rows of dst are ldd floats apart. */
  void (*gather)(cn_backend_ctx *bk, float *dst, int ldd, const float *base,
                 const int64_t *idx, int n, int width);
  /* dst[r, 0:width] = Σ_{k in seg[r] .. seg[r+1]} base[idx[k] : + width]
   * (zeros for an empty segment), divided by the segment's length when
   * mean != 0. */
  void (*gather_sum)(cn_backend_ctx *bk, float *dst, int ldd,
                     const float *base, const int64_t *idx,
                     const int64_t *seg, int n, int width, int mean);

  /* ---- argmax (decoding) ---- */
  /* out[r] = argmax of row r of X[n, w] (lowest index on a tie), or -1
   * where the row holds a NaN or an infinity (its argmax would be a
   * made-up token), written to HOST memory (the decoder needs it to
   * decide what runs next). */
  void (*argmax_rows)(cn_backend_ctx *bk, int n, int w, const float *X,
                      int ld, int32_t *out);

  /* ---- compiled vertex functions (core/cell/) ----
   * dst[r, 0:width] = src[r, 0:width] for r < n (rows ldd / lds floats
   * apart): the gathers and scatters a layout could not avoid. */
  void (*copy_rows)(cn_backend_ctx *bk, float *dst, int ldd, const float *src,
                    int lds, int n, int width);
  /* One fused elementwise kernel (Cavs' fusion): runs p's instructions in
   * order on each of n rows; see cn_ew_prog above. */
  void (*ew_program)(cn_backend_ctx *bk, const struct cn_ew_prog *p,
                     const struct cn_ew_slot *slots, int n);

  /* ---- errors ---- */
  /* Compute calls return nothing, so an asynchronous backend (cuda) keeps
   * its first failure and reports it here: 0, or a CN_E_BACKEND code with
   * err filled, clearing it. NULL when the backend cannot fail (cpu). Core
   * asks after each run's sync(). */
  int (*status)(cn_backend_ctx *bk, cn_err *err);
};

/* Convenience wrapper that counts kernels. */
#define CN_BK(bk, op, ...) ((bk)->kernels++, (bk)->vt->op((bk), __VA_ARGS__))

#endif /* CANOPY_BACKEND_H */
