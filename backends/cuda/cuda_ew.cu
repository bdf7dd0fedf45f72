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

#define EW_UNARY(expr)                                                    \
  for (int j = tx; j < w; j += G) {                                       \
    float a = pa ? pa[j] : ka;                                            \
    pd[j] = (expr);                                                       \
  }                                                                       \
  break
#define EW_BINARY(expr)                                                   \
  for (int j = tx; j < w; j += G) {                                       \
    float a = pa ? pa[j] : ka;                                            \
    float b = pb ? pb[j] : kb;                                            \
    pd[j] = (expr);                                                       \
  }                                                                       \
  break

/* Instructions [i0, i1) for this thread's row (live: the row takes part;
 * every thread reaches every barrier). */
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
      if (op == CN_EW_ADD || op == CN_EW_SUB || op == CN_EW_MUL ||
          op == CN_EW_DIV) /* b is unused (maybe garbage) otherwise */
        ew_operand(rp, insn[i].b, &pb, &kb);
      switch (op) {
        case CN_EW_MOV: EW_UNARY(a);
        case CN_EW_ADD: EW_BINARY(a + b);
        case CN_EW_SUB: EW_BINARY(a - b);
        case CN_EW_MUL: EW_BINARY(a * b);
        case CN_EW_DIV: EW_BINARY(a / b);
        case CN_EW_SIGMOID: EW_UNARY(sigm(a));
        case CN_EW_TANH: EW_UNARY(tanhf(a));
        case CN_EW_EXP: EW_UNARY(expf(a));
        case CN_EW_RELU: EW_UNARY(fmaxf(a, 0.0f));
        case CN_EW_STEP: EW_UNARY(a > 0.0f ? 1.0f : 0.0f);
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

#undef EW_UNARY
#undef EW_BINARY

static bool ew_binary(int op) {
  return op == CN_EW_ADD || op == CN_EW_SUB || op == CN_EW_MUL ||
         op == CN_EW_DIV;
}

/* An operand's slot is a constant (< 0), a real slot, or the tmp slot. */
static bool ew_slot_ok(const cn_ew_prog *p, int slot) {
  return slot < 0 || slot < p->n_slots || slot == p->tmp_slot;
}

static size_t even_words(size_t bytes) {
  size_t w = (bytes + 7) / 8;
  return (w + 1) & ~(size_t)1;
}

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

  /* Validate every operand (the kernel indexes rp[] with them). */
  int maxw = 0;
  for (int i = 0; i < p->n_insn; i++) {
    const cn_ew_insn *in = &p->insn[i];
    if (in->op > CN_EW_STEP || !ew_slot_ok(p, in->d.slot) ||
        !ew_slot_ok(p, in->a.slot) ||
        (ew_binary(in->op) && !ew_slot_ok(p, in->b.slot))) {
      char why[96];
      snprintf(why, sizeof(why),
               "instruction %d: bad op %d or slot (%d, %d, %d) of %d", i,
               (int)in->op, (int)in->d.slot, (int)in->a.slot,
               (int)in->b.slot, p->n_slots);
      cu_fail(c, __FILE__, __LINE__, "ew_program", why);
      return;
    }
    if (in->width > maxw) maxw = in->width;
  }
  if (maxw <= 0) return; /* every instruction is empty */

  /* Geometry and shared memory (see the comment above k_ew_program). */
  int G = (maxw + 31) / 32 * 32;
  if (G > EW_THREADS) G = EW_THREADS;
  int R = EW_THREADS / G;
  if (R > n) R = n;
  bool tmp_shared = tmp_width > 0;
  size_t smem;
  for (;;) {
    size_t row = (size_t)T * sizeof(float *) +
                 (tmp_shared ? (size_t)tmp_width * sizeof(float) : 0);
    smem = (size_t)R * row;
    if (smem <= EW_SMEM) break;
    if (R > 1) {
      R /= 2;
    } else if (tmp_shared) {
      tmp_shared = false;
    } else {
      cu_fail(c, __FILE__, __LINE__, "ew_program",
              "too many slots for one block's shared memory");
      return;
    }
  }

  /* Device scratch for tmp when it is not in shared memory. */
  float *tmp_global = NULL;
  if (tmp_width > 0 && !tmp_shared) {
    size_t need = (size_t)n * (size_t)tmp_width * sizeof(float);
    if (c->ew_tmp_bytes < need) {
      /* Whole pool classes (powers of two), so growth is rare. */
      size_t cls = 4096;
      while (cls < need) cls <<= 1;
      need = cls;
      cu_pool_put(c, c->ew_tmp); /* stream order: safe to hand back */
      c->ew_tmp = (float *)cu_pool_get(c, need);
      c->ew_tmp_bytes = c->ew_tmp != NULL ? need : 0;
      if (c->ew_tmp == NULL) {
        cu_fail(c, __FILE__, __LINE__, "cudaMalloc(ew_program scratch)",
                "out of device memory");
        return;
      }
    }
    tmp_global = c->ew_tmp;
  }

  /* The slot table (each off a device address), the instructions and
   * the segments: the off arrays and segments the staged batch holds are
   * read there; the rest, and the table and instructions when they are
   * too big to go by value, in one staging block:
   *   [slot table][off arrays (an edge slot's seg[n] long)][insns][seg] */
  const bool loop = p->edge_end > p->edge_begin && p->seg != NULL;
  const int64_t E = loop ? p->seg[n] : 0;
  const bool inl = c->batch_staging && T <= EW_INLINE_SLOTS &&
                   p->n_insn <= EW_INLINE_INSNS;
  const size_t w_slots = inl ? 0 : even_words((size_t)T * sizeof(cn_ew_slot));
  size_t words = 0, insn_at = 0, seg_at = 0;
  for (int pass = 0; pass < 2; pass++) {
    words = w_slots;
    for (int s = 0; s < p->n_slots; s++) {
      if (s == tmp_slot || slots[s].off == NULL) continue;
      int64_t len = loop && s >= p->edge_slot0 ? E : n;
      if (cu_staged(c, slots[s].off, len) == NULL)
        words += even_words((size_t)len * sizeof(int64_t));
    }
    insn_at = words;
    if (!inl) words += even_words((size_t)p->n_insn * sizeof(cn_ew_insn));
    seg_at = words;
    if (loop && cu_staged(c, p->seg, n + 1) == NULL)
      words += even_words((size_t)(n + 1) * sizeof(int64_t));
    if (c->sb_host == NULL || words == 0 || cu_stage_fits(c, words)) break;
    cu_batch_end(c); /* the ring moves on: every array of its own */
  }
  int64_t *hs = NULL, *ds = NULL;
  if (words > 0 && !cu_stage_reserve(c, words, &hs, &ds)) return;
  ew_inline P; /* the table and instructions, when they go by value */
  cn_ew_slot *tab = inl ? P.slots : (cn_ew_slot *)hs;
  size_t o = w_slots;
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
  const int64_t *dseg = NULL;
  if (loop && (dseg = cu_staged(c, p->seg, n + 1)) == NULL) {
    memcpy(hs + seg_at, p->seg, (size_t)(n + 1) * sizeof(int64_t));
    dseg = ds + seg_at;
  }
  if (inl)
    memcpy(P.insn, p->insn, (size_t)p->n_insn * sizeof(cn_ew_insn));
  else
    memcpy(hs + insn_at, p->insn, (size_t)p->n_insn * sizeof(cn_ew_insn));
  if (!cu_stage_commit(c, hs, words)) return;

  unsigned grid = cu_blocks(n, R);
  if (grid > 65535u * 8u) grid = 65535u * 8u; /* grid-stride beyond */
  if (inl)
    k_ew_program_inline<<<grid, dim3((unsigned)G, (unsigned)R), smem,
                          c->stream>>>(
        P, p->n_insn, T, tmp_slot, tmp_width, tmp_shared ? 1 : 0,
        tmp_global, n, loop ? p->edge_begin : 0, loop ? p->edge_end : 0,
        p->edge_slot0, dseg);
  else
    k_ew_program<<<grid, dim3((unsigned)G, (unsigned)R), smem, c->stream>>>(
        (const cn_ew_insn *)(ds + insn_at), p->n_insn,
        (const cn_ew_slot *)ds, T, tmp_slot, tmp_width, tmp_shared ? 1 : 0,
        tmp_global, n, loop ? p->edge_begin : 0, loop ? p->edge_end : 0,
        p->edge_slot0, dseg);
  CN_CUDA_LAUNCHED(c);
}
