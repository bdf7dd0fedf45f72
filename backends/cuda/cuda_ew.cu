/* cuda_ew.cu - ew_program: the fused elementwise kernel of a compiled
 * vertex function (core/cell/cell.h), one launch per program.
 */
#include <stdio.h>
#include <string.h>

#include "cuda_internal.h"

typedef long long ll;

/* ---- ew_program: one fused elementwise kernel per compiled program ----
 *
 * Upload. Usually none: the off arrays and segments are in the batch's
 * staged index words (stage_indices), and a slot table of at most 48
 * slots with at most 48 instructions goes by value, as the kernel's
 * parameters (k_ew_program_inline). What is left goes in one staging
 * block, built in place in the pinned ring (cu_stage_reserve) and sent
 * with ONE cudaMemcpyAsync (cu_stage_commit):
 *   [slot table: T cn_ew_slot][off arrays: n int64 each][insn array][seg]
 * (the table and instructions only when too big to go by value). T =
 * max(n_slots, tmp_slot + 1). The slot table is the caller's, except
 * that each `off` is replaced by the device address of its copy (known
 * before the copy: the ring's device twin mirrors the host words), and
 * the tmp slot's entry is zeroed. base pointers are device pointers
 * already and go as they are. The instructions are copied byte for byte
 * (cn_ew_insn has the same layout on host and device); the host validates
 * every operand's slot first, so the kernel never indexes out of range.
 *
 * Geometry. Block = (G, R) threads: threadIdx.y picks one of R rows the
 * block works on, threadIdx.x strides over an instruction's columns
 * (G = the widest instruction rounded up to a warp, at most 256; R =
 * 256 / G, at most n). Blocks grid-stride over chunks of R rows. For each
 * chunk the threads first resolve every slot's row pointer into shared
 * memory (rp[row][slot]: base + off[r] or base + r·ld; NULL when off[r] <
 * 0, which makes reads zeros and skips writes), then run the instructions
 * in order with a __syncthreads() after each one, because an instruction
 * may read columns that other threads of the same row wrote in an earlier
 * one (at a different column offset). The loop bounds are uniform across
 * the block (rows past n idle but still reach every barrier).
 *
 * Scratch (the tmp slot). Dynamic shared memory per block is R · (T
 * pointers + tmp_width floats), kept within the default 48 KiB (no opt-in
 * attribute): R halves until it fits; if even R = 1 does not fit (tmp_width
 * · 4 close to or above 48 KiB), tmp moves to a device scratch of n ·
 * tmp_width floats from the pool (c->ew_tmp: grown to a bigger pool block
 * when a launch needs more, never freed on the hot path; stream order
 * makes the reuse safe), and the shared memory holds only the pointers.
 * Only a program with more than ~6000 slots cannot run at all (reported).
 *
 * Arithmetic as in the cpu backend: IEEE a / b, expf, tanhf, and σ(x) =
 * 1 / (1 + expf(-x)). Within one instruction every column is read and then
 * written by one thread, so d may alias a or b column for column (d = a +
 * b in place); a destination that partially overlaps a source of the SAME
 * instruction at a shifted column range would race (core's compiler does
 * not emit that). Rows must not write what other rows of the same launch
 * read (independent vertices of one batch).
 */

#define EW_THREADS 256
#define EW_SMEM ((size_t)48 << 10)

__device__ __forceinline__ void ew_operand(float *const *rp,
                                           const cn_ew_arg &x,
                                           const float **p, float *k) {
  *p = NULL;
  *k = 0.0f;
  if (x.slot < 0)
    *k = x.k;
  else if (rp[x.slot] != NULL)
    *p = rp[x.slot] + x.col;
}

/* The op expressions' functions (core/backend.h CN_EW_OPS), as the cpu
 * backend defines them (σ through expf, no fast math). */
__device__ __forceinline__ float cn_ew_sigmoid(float x) { return sigm(x); }
__device__ __forceinline__ float cn_ew_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ float cn_ew_exp(float x) { return expf(x); }
__device__ __forceinline__ float cn_ew_relu(float x) {
  return x > 0.0f ? x : 0.0f;
}
__device__ __forceinline__ float cn_ew_step(float x) {
  return x > 0.0f ? 1.0f : 0.0f;
}

/* Each op of the list as a function of one float of each operand. */
#define EW_FN(NAME, ARITY, EXPR)                                          \
  __device__ __forceinline__ float ew_f_##NAME(float a, float b) {        \
    return (EXPR);                                                        \
  }
CN_EW_OPS(EW_FN)
#undef EW_FN

/* Instructions [i0, i1) for this thread's row (live: the row takes part;
 * every thread reaches every barrier). Each op of the list is a loop over
 * this thread's columns; b is read only by an op that has one (otherwise
 * its slot may be garbage). */
__device__ __forceinline__ void ew_insns(const cn_ew_insn *__restrict__ insn,
                                         int i0, int i1, float *const *rp,
                                         bool live, int tx, int G) {
  for (int i = i0; i < i1; i++) {
    const int op = insn[i].op, w = insn[i].width;
    const int ds = insn[i].d.slot;
    float *pd = live && w > 0 && ds >= 0 ? rp[ds] : NULL;
    /* No destination row (off < 0, or a constant): nothing to do. */
    if (pd != NULL) {
      pd += insn[i].d.col;
      const float *pa, *pb = NULL;
      float ka, kb = 0.0f;
      ew_operand(rp, insn[i].a, &pa, &ka);
      switch (op) {
#define EW_CASE(NAME, ARITY, EXPR)                                        \
  case CN_EW_##NAME:                                                      \
    if (ARITY == 2) ew_operand(rp, insn[i].b, &pb, &kb);                  \
    for (int j = tx; j < w; j += G)                                       \
      pd[j] = ew_f_##NAME(pa ? pa[j] : ka,                                \
                          ARITY == 2 ? (pb ? pb[j] : kb) : 0.0f);         \
    break;
        CN_EW_OPS(EW_CASE)
#undef EW_CASE
        default: break;
      }
    }
    __syncthreads();
  }
}

/* The row pointer of slot s at row (or edge) i; NULL: a missing row. */
__device__ __forceinline__ float *ew_slot_row(const cn_ew_slot *slots, int s,
                                              ll i) {
  const cn_ew_slot sl = slots[s];
  int64_t o = sl.off != NULL ? sl.off[i] : (int64_t)i * sl.ld;
  return o >= 0 && sl.base != NULL ? sl.base + o : NULL;
}

/* The program's body: both kernels below run it, the slot table and the
 * instructions read from the staging ring or from the kernel's own
 * parameters. */
__device__ __forceinline__ void
ew_program_body(const cn_ew_insn *__restrict__ insn, int n_insn,
                const cn_ew_slot *__restrict__ slots, int n_slots,
                int tmp_slot, int tmp_width, int tmp_shared,
                float *tmp_global, int n, int eb, int ee, int eslot0,
                const int64_t *__restrict__ seg) {
  extern __shared__ __align__(16) unsigned char ew_smem[];
  const int G = (int)blockDim.x, R = (int)blockDim.y;
  const int tx = (int)threadIdx.x, ty = (int)threadIdx.y;
  const bool loop = ee > eb;
  float **rp = (float **)ew_smem + (size_t)ty * n_slots;
  float *tsh = tmp_shared ? (float *)((float **)ew_smem + (size_t)R * n_slots) +
                                (size_t)ty * tmp_width
                          : NULL;
  for (ll r0 = (ll)blockIdx.x * R; r0 < n; r0 += (ll)gridDim.x * R) {
    const ll r = r0 + ty;
    const bool live = r < n;
    if (live)
      for (int s = tx; s < n_slots; s += G) {
        float *q = NULL;
        if (s == tmp_slot) {
          if (tmp_width > 0)
            q = tmp_shared ? tsh : tmp_global + r * (ll)tmp_width;
        } else if (!loop || s < eslot0) { /* edge rows: per edge, below */
          q = ew_slot_row(slots, s, r);
        }
        rp[s] = q;
      }
    __syncthreads();
    if (!loop) {
      ew_insns(insn, 0, n_insn, rp, live, tx, G);
      continue;
    }
    ew_insns(insn, 0, eb, rp, live, tx, G);
    /* The segment loop: rows of the block have different edge counts, so
     * it runs to the longest, a row idling (but reaching every barrier)
     * once its own edges are done. */
    const ll sb = live ? seg[r] : 0, se = live ? seg[r + 1] : 0;
    for (ll k = 0; __syncthreads_or(sb + k < se); k++) {
      const bool act = sb + k < se;
      if (act)
        for (int s = eslot0 + tx; s < n_slots; s += G)
          if (s != tmp_slot) rp[s] = ew_slot_row(slots, s, sb + k);
      __syncthreads();
      ew_insns(insn, eb, ee, rp, act, tx, G);
    }
    ew_insns(insn, ee, n_insn, rp, live, tx, G);
  }
}

__global__ void __launch_bounds__(EW_THREADS)
    k_ew_program(const cn_ew_insn *__restrict__ insn, int n_insn,
                 const cn_ew_slot *__restrict__ slots, int n_slots,
                 int tmp_slot, int tmp_width, int tmp_shared,
                 float *tmp_global, int n, int eb, int ee, int eslot0,
                 const int64_t *__restrict__ seg) {
  ew_program_body(insn, n_insn, slots, n_slots, tmp_slot, tmp_width,
                  tmp_shared, tmp_global, n, eb, ee, eslot0, seg);
}

/* A slot table and instructions small enough to go by value, as the
 * kernel's parameters (__grid_constant__: read where they are, no copy
 * per thread), so a launch whose index arrays the batch staged uploads
 * nothing. 3,264 bytes: within the 4 KiB every CUDA
 * version takes. */
#define EW_INLINE_SLOTS 48
#define EW_INLINE_INSNS 48
typedef struct ew_inline {
  cn_ew_slot slots[EW_INLINE_SLOTS];
  cn_ew_insn insn[EW_INLINE_INSNS];
} ew_inline;

__global__ void __launch_bounds__(EW_THREADS)
    k_ew_program_inline(const __grid_constant__ ew_inline P, int n_insn,
                        int n_slots, int tmp_slot, int tmp_width,
                        int tmp_shared, float *tmp_global, int n, int eb,
                        int ee, int eslot0,
                        const int64_t *__restrict__ seg) {
  ew_program_body(P.insn, n_insn, P.slots, n_slots, tmp_slot, tmp_width,
                  tmp_shared, tmp_global, n, eb, ee, eslot0, seg);
}

/* An operand's slot is a constant (< 0), a real slot, or the tmp slot. */
static bool ew_slot_ok(const cn_ew_prog *p, int slot) {
  return slot < 0 || slot < p->n_slots || slot == p->tmp_slot;
}

static size_t even_words(size_t bytes) {
  size_t w = (bytes + 7) / 8;
  return (w + 1) & ~(size_t)1;
}

/* Checks every operand (the kernel indexes rp[] with them); the widest
 * instruction's width, 0 when every one is empty, or -1 after reporting
 * a malformed one. */
static int ew_validate(cu_ctx *c, const cn_ew_prog *p) {
  int maxw = 0;
  for (int i = 0; i < p->n_insn; i++) {
    const cn_ew_insn *in = &p->insn[i];
    if (in->op >= CN_EW__COUNT || !ew_slot_ok(p, in->d.slot) ||
        !ew_slot_ok(p, in->a.slot) ||
        (cn_ew_binary(in->op) && !ew_slot_ok(p, in->b.slot))) {
      char why[96];
      snprintf(why, sizeof(why),
               "instruction %d: bad op %d or slot (%d, %d, %d) of %d", i,
               (int)in->op, (int)in->d.slot, (int)in->a.slot,
               (int)in->b.slot, p->n_slots);
      cu_fail(c, __FILE__, __LINE__, "ew_program", why);
      return -1;
    }
    if (in->width > maxw) maxw = in->width;
  }
  return maxw;
}

/* A launch's shape (see the comment above k_ew_program): G threads a row,
 * R rows a block, tmp in shared memory or not, smem bytes of it. False
 * after reporting a table too big for any block. */
typedef struct ew_geometry {
  int G, R;
  bool tmp_shared;
  size_t smem;
} ew_geometry;

static bool ew_shape(cu_ctx *c, int T, int tmp_width, int maxw, int n,
                     ew_geometry *g) {
  g->G = (maxw + 31) / 32 * 32;
  if (g->G > EW_THREADS) g->G = EW_THREADS;
  g->R = EW_THREADS / g->G;
  if (g->R > n) g->R = n;
  g->tmp_shared = tmp_width > 0;
  for (;;) {
    size_t row = (size_t)T * sizeof(float *) +
                 (g->tmp_shared ? (size_t)tmp_width * sizeof(float) : 0);
    g->smem = (size_t)g->R * row;
    if (g->smem <= EW_SMEM) return true;
    if (g->R > 1) {
      g->R /= 2;
    } else if (g->tmp_shared) {
      g->tmp_shared = false;
    } else {
      cu_fail(c, __FILE__, __LINE__, "ew_program",
              "too many slots for one block's shared memory");
      return false;
    }
  }
}

/* The device scratch for tmp when it is not in shared memory: n rows of
 * tmp_width floats, the context's block grown to whole pool classes
 * (powers of two, so growth is rare). NULL after reporting. */
static float *ew_tmp_global(cu_ctx *c, int n, int tmp_width) {
  size_t need = (size_t)n * (size_t)tmp_width * sizeof(float);
  if (c->ew_tmp_bytes < need) {
    size_t cls = 4096;
    while (cls < need) cls <<= 1;
    cu_pool_put(c, c->ew_tmp); /* stream order: safe to hand back */
    c->ew_tmp = (float *)cu_pool_get(c, cls);
    c->ew_tmp_bytes = c->ew_tmp != NULL ? cls : 0;
    if (c->ew_tmp == NULL) {
      cu_fail(c, __FILE__, __LINE__, "cudaMalloc(ew_program scratch)",
              "out of device memory");
      return NULL;
    }
  }
  return c->ew_tmp;
}

/* Where the staging block's parts go, in words from its start:
 *   [slot table][off arrays (an edge slot's seg[n] long)][insns][seg]
 * each only when it is not staged already (the batch's index words) or
 * passed by value (inl: the table and the instructions). */
typedef struct ew_layout {
  size_t w_slots, insn_at, seg_at, words;
} ew_layout;

static ew_layout ew_plan_words(const cu_ctx *c, const cn_ew_prog *p,
                               const cn_ew_slot *slots, int n, int T,
                               bool inl, int tmp_slot, bool loop, int64_t E) {
  ew_layout L;
  L.w_slots = inl ? 0 : even_words((size_t)T * sizeof(cn_ew_slot));
  L.words = L.w_slots;
  for (int s = 0; s < p->n_slots; s++) {
    if (s == tmp_slot || slots[s].off == NULL) continue;
    int64_t len = loop && s >= p->edge_slot0 ? E : n;
    if (cu_staged(c, slots[s].off, len) == NULL)
      L.words += even_words((size_t)len * sizeof(int64_t));
  }
  L.insn_at = L.words;
  if (!inl) L.words += even_words((size_t)p->n_insn * sizeof(cn_ew_insn));
  L.seg_at = L.words;
  if (loop && cu_staged(c, p->seg, n + 1) == NULL)
    L.words += even_words((size_t)(n + 1) * sizeof(int64_t));
  return L;
}

/* Writes the slot table (each off a device address: staged, or copied
 * into the block at hs, whose device twin is ds), the instructions and
 * the segments; returns the segments' device address (NULL: no loop). */
static const int64_t *ew_fill(cu_ctx *c, const cn_ew_prog *p,
                              const cn_ew_slot *slots, int n, int T,
                              int tmp_slot, bool loop, int64_t E,
                              const ew_layout *L, cn_ew_slot *tab,
                              cn_ew_insn *insn, int64_t *hs, int64_t *ds) {
  size_t o = L->w_slots;
  for (int s = 0; s < T; s++) {
    tab[s].base = NULL;
    tab[s].ld = 0;
    tab[s].off = NULL;
    if (s >= p->n_slots || s == tmp_slot) continue;
    tab[s].base = slots[s].base;
    tab[s].ld = slots[s].ld;
    if (slots[s].off != NULL) {
      int64_t len = loop && s >= p->edge_slot0 ? E : n;
      const int64_t *d = cu_staged(c, slots[s].off, len);
      if (d == NULL) {
        memcpy(hs + o, slots[s].off, (size_t)len * sizeof(int64_t));
        d = ds + o;
        o += even_words((size_t)len * sizeof(int64_t));
      }
      tab[s].off = d;
    }
  }
  memcpy(insn, p->insn, (size_t)p->n_insn * sizeof(cn_ew_insn));
  const int64_t *dseg = NULL;
  if (loop && (dseg = cu_staged(c, p->seg, n + 1)) == NULL) {
    memcpy(hs + L->seg_at, p->seg, (size_t)(n + 1) * sizeof(int64_t));
    dseg = ds + L->seg_at;
  }
  return dseg;
}

/* The program's launch: validate, shape, scratch, upload (at most one
 * copy), one kernel. */
void cu_ew_program(cn_backend_ctx *bk, const cn_ew_prog *p,
                   const cn_ew_slot *slots, int n) {
  cu_ctx *c = cu_of(bk);
  if (n <= 0 || p == NULL || p->n_insn <= 0 || !cu_enter(c)) return;
  if (p->n_slots < 0 || p->tmp_slot > INT16_MAX ||
      (p->n_slots > 0 && slots == NULL)) {
    cu_fail(c, __FILE__, __LINE__, "ew_program", "malformed program");
    return;
  }
  const int tmp_slot = p->tmp_slot >= 0 ? p->tmp_slot : -1;
  const int tmp_width = tmp_slot >= 0 && p->tmp_width > 0 ? p->tmp_width : 0;
  const int T = p->n_slots > tmp_slot + 1 ? p->n_slots : tmp_slot + 1;
  const int maxw = ew_validate(c, p);
  if (maxw <= 0) return; /* malformed (reported), or every one empty */
  ew_geometry g;
  if (!ew_shape(c, T, tmp_width, maxw, n, &g)) return;
  float *tmp_global = NULL;
  if (tmp_width > 0 && !g.tmp_shared &&
      (tmp_global = ew_tmp_global(c, n, tmp_width)) == NULL)
    return;

  /* The table and instructions go by value when small enough (and the
   * batch staged its index words); the rest in one staging block. */
  const bool loop = p->edge_end > p->edge_begin && p->seg != NULL;
  const int64_t E = loop ? p->seg[n] : 0;
  const bool inl = c->batch_staging && T <= EW_INLINE_SLOTS &&
                   p->n_insn <= EW_INLINE_INSNS;
  ew_layout L = ew_plan_words(c, p, slots, n, T, inl, tmp_slot, loop, E);
  if (c->sb_host != NULL && L.words > 0 && !cu_stage_fits(c, L.words)) {
    cu_batch_end(c); /* the ring moves on: every array of its own */
    L = ew_plan_words(c, p, slots, n, T, inl, tmp_slot, loop, E);
  }
  int64_t *hs = NULL, *ds = NULL;
  if (L.words > 0 && !cu_stage_reserve(c, L.words, &hs, &ds)) return;
  ew_inline P; /* the table and instructions, when they go by value */
  cn_ew_slot *tab = inl ? P.slots : (cn_ew_slot *)hs;
  cn_ew_insn *insn = inl ? P.insn : (cn_ew_insn *)(hs + L.insn_at);
  const int64_t *dseg =
      ew_fill(c, p, slots, n, T, tmp_slot, loop, E, &L, tab, insn, hs, ds);
  if (!cu_stage_commit(c, hs, L.words)) return;

  unsigned grid = cu_blocks(n, g.R);
  if (grid > 65535u * 8u) grid = 65535u * 8u; /* grid-stride beyond */
  dim3 block((unsigned)g.G, (unsigned)g.R);
  int eb = loop ? p->edge_begin : 0, ee = loop ? p->edge_end : 0;
  if (inl)
    k_ew_program_inline<<<grid, block, g.smem, c->stream>>>(
        P, p->n_insn, T, tmp_slot, tmp_width, g.tmp_shared ? 1 : 0,
        tmp_global, n, eb, ee, p->edge_slot0, dseg);
  else
    k_ew_program<<<grid, block, g.smem, c->stream>>>(
        (const cn_ew_insn *)(ds + L.insn_at), p->n_insn,
        (const cn_ew_slot *)ds, T, tmp_slot, tmp_width, g.tmp_shared ? 1 : 0,
        tmp_global, n, eb, ee, p->edge_slot0, dseg);
  CN_CUDA_LAUNCHED(c);
}
