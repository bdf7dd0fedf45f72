/* fastmath.h - exp, sigmoid and tanh for the fused cell loops.
 *
 * libm's expf/tanhf are scalar calls (tanhf goes through expm1f): in the
 * fused cells they cost more than the batched products themselves (perf,
 * a binary tree LSTM at H=128: 22% of cycles in expm1f/tanhf/expf against
 * 19% in sgemm). These are branch-free and inline, so the loops vectorise.
 * exp: Cody-Waite range reduction x = n·ln2 + r, |r| <= ln2/2, and the
 * Cephes degree-6 polynomial for e^r (relative error about 1e-7), scaled by
 * 2^n built in the exponent bits. tanh(x) = 2σ(2x) - 1, whose absolute
 * error stays near float epsilon around 0 (the contract is absolute,
 * docs/models.md: 1e-4).
 *
 * The same three on vectors of 8 and 16 floats (GCC's vector extension),
 * for the fused loops' blocks: each lane is the scalar function's every
 * operation in the same order (the clamps as selects, the floor as a
 * truncation corrected by one, exact for the clamped range), so a float
 * has the same bits whichever of the two computed it.
 */
#ifndef CANOPY_FASTMATH_H
#define CANOPY_FASTMATH_H

#include <stdint.h>

static inline float cn_exp(float x) {
  x = __builtin_fminf(__builtin_fmaxf(x, -87.3f), 88.3f);
  float n = __builtin_floorf(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693359375f - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  union {
    int32_t i;
    float f;
  } s = {.i = ((int32_t)n + 127) << 23};
  return p * s.f;
}

static inline float cn_sigmoid(float x) { return 1.0f / (1.0f + cn_exp(-x)); }

static inline float cn_tanh(float x) {
  return 2.0f / (1.0f + cn_exp(-2.0f * x)) - 1.0f;
}

typedef float cn_v8 __attribute__((vector_size(32)));
typedef int32_t cn_v8i __attribute__((vector_size(32)));
typedef float cn_v16 __attribute__((vector_size(64)));
typedef int32_t cn_v16i __attribute__((vector_size(64)));

/* m ? x : y lane by lane, m a comparison's all-ones or zeros. */
#define CN_VSEL_(VI, m, x, y) ((__typeof__(x))(((VI)(x) & (m)) | ((VI)(y) & ~(m))))

/* Always inlined: each of cpu.c's copies of the fused loops (one per
 * instruction set) must get its own copy, never a call that passes a
 * vector between code built for different instruction sets (gcc's
 * -Wpsabi). */
#define CN_VINL_ __attribute__((always_inline)) static inline
#define CN_VEC_MATH_(V, VI, S)                                              \
  CN_VINL_ V cn_exp_##S(V x) {                                         \
    V lo = (V){0} - 87.3f, hi = (V){0} + 88.3f;                               \
    x = CN_VSEL_(VI, x > lo, x, lo); /* fmaxf(x, -87.3f) */                 \
    x = CN_VSEL_(VI, x < hi, x, hi); /* fminf(x, 88.3f)  */                 \
    V y = x * 1.44269504088896341f + 0.5f;                                  \
    V n = __builtin_convertvector(__builtin_convertvector(y, VI), V);       \
    n = n - CN_VSEL_(VI, n > y, (V){0} + 1.0f, (V){0}); /* floorf(y) */       \
    V r = x - n * 0.693359375f - n * -2.12194440e-4f;                       \
    V p = (V){0} + 1.9875691500e-4f;                                         \
    p = p * r + 1.3981999507e-3f;                                           \
    p = p * r + 8.3334519073e-3f;                                           \
    p = p * r + 4.1665795894e-2f;                                           \
    p = p * r + 1.6666665459e-1f;                                           \
    p = p * r + 5.0000001201e-1f;                                           \
    p = p * r * r + r + 1.0f;                                               \
    VI e = (__builtin_convertvector(n, VI) + 127) << 23;                    \
    return p * (V)e;                                                        \
  }                                                                         \
  CN_VINL_ V cn_sigmoid_##S(V x) { return 1.0f / (1.0f + cn_exp_##S(-x)); } \
  CN_VINL_ V cn_tanh_##S(V x) {                                        \
    return 2.0f / (1.0f + cn_exp_##S(-2.0f * x)) - 1.0f;                    \
  }                                                                         \
  CN_VINL_ V cn_relu_##S(V x) {                                        \
    return CN_VSEL_(VI, x > 0.0f, x, (V){0});                                \
  }                                                                         \
  CN_VINL_ V cn_step_##S(V x) {                                        \
    return CN_VSEL_(VI, x > 0.0f, (V){0} + 1.0f, (V){0});                     \
  }
CN_VEC_MATH_(cn_v8, cn_v8i, v8)
CN_VEC_MATH_(cn_v16, cn_v16i, v16)
#undef CN_VEC_MATH_
#undef CN_VINL_

static inline float cn_relu(float x) { return x > 0.0f ? x : 0.0f; }
static inline float cn_step(float x) { return x > 0.0f ? 1.0f : 0.0f; }

#endif
