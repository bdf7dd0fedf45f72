/* cpu_ew.h - the cpu backend's copies of the fused elementwise loops, for
 * the tests: each instruction set's copy must give the same bits.
 */
#ifndef CANOPY_CPU_EW_H
#define CANOPY_CPU_EW_H

/* Runs every later ew_program of every cpu context with one copy of the
 * loops: "wide" (vectors of 16: AVX-512, or any non-x86 build), "avx2"
 * (vectors of 8), "base" (x86-64 baseline); NULL: the widest this CPU
 * runs (the default). Returns 0, or -1 where this CPU cannot run it (or
 * the build has no such copy). Not for use while another thread runs a
 * program. */
int cn__cpu_ew_force(const char *name);

#endif
