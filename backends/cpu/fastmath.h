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

#endif
