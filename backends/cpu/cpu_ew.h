/* cpu_ew.h - the cpu backend's fused elementwise programs (cpu_ew.c):
 * what cpu.c calls, and the copies of the loops the tests force (each
 * instruction set's copy must give the same bits).
 */
#ifndef CANOPY_CPU_EW_H
#define CANOPY_CPU_EW_H

#include <stdint.h>

#include "backend.h"

/* What one cpu context keeps for its programs between calls: the per-row
 * scratch and constant rows, and the operands resolved per instruction.
 * Zeroed to start; grown as programs need; cn__cpu_ew_ws_free frees it. */
typedef struct cn__cpu_ew_ws {
  float *ew;
  int64_t n_ew;
  struct ew_step *ew_steps;
  int n_ew_steps;
} cn__cpu_ew_ws;

/* backend.h's ew_program over n rows: zero is a row of at least
 * cn__cpu_ew_widest(p) zeros, read for a missing input row. */
void cn__cpu_ew_program(cn__cpu_ew_ws *ws, const float *zero,
                        const cn_ew_prog *p, const cn_ew_slot *slots, int n);
/* The widest instruction of p, in floats (at least 1). */
int cn__cpu_ew_widest(const cn_ew_prog *p);
void cn__cpu_ew_ws_free(cn__cpu_ew_ws *ws);

/* Runs every later ew_program of every cpu context with one copy of the
 * loops: "wide" (vectors of 16: AVX-512, or any non-x86 build), "avx2"
 * (vectors of 8), "base" (x86-64 baseline); NULL: the widest this CPU
 * runs (the default). Returns 0, or -1 where this CPU cannot run it (or
 * the build has no such copy). Not for use while another thread runs a
 * program. */
int cn__cpu_ew_force(const char *name);

#endif
