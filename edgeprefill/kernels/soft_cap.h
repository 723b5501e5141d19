// Soft-capped attention scores (Gemma 2: GroupQueryAttention's softcap attribute): each
// scaled score x becomes cap * tanh(x / cap), before the mask and the softmax, as ONNX
// Runtime's kernel caps them. Both attention ops run it on their score blocks.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernel_common.h"  // ExpNonPositive*, <immintrin.h>

namespace edgeprefill {

// tanh(y) to ~1.5e-7 relative: below |y| = 1/2 its Taylor series to y^13 (the next term is
// < 5e-8 there), above it (1 - e) / (1 + e) with e = exp(-2|y|) <= 0.37, which cancels
// nothing. Every multiply-add an explicit fma, as ExpNonPositive.
constexpr float kTanhSeries[6] = {-1.0f / 3, 2.0f / 15, -17.0f / 315, 62.0f / 2835,
                                  -1382.0f / 155925, 21844.0f / 6081075};
constexpr float kTanhSplit = 0.5f;

inline float Tanh(float y) {
  const float y2 = y * y;
  if (std::fabs(y) < kTanhSplit) {
    float p = kTanhSeries[5];
    for (int k = 4; k >= 0; --k) p = std::fma(p, y2, kTanhSeries[k]);
    return std::fma(p * y2, y, y);
  }
  const float e = ExpNonPositive(-2.0f * std::fabs(y));
  return std::copysign((1.0f - e) / (1.0f + e), y);
}

#ifdef __AVX512F__
inline __m512 Tanh16(__m512 y) {  // Tanh, 16 lanes
  const __m512 y2 = _mm512_mul_ps(y, y), a = _mm512_abs_ps(y);
  __m512 p = _mm512_set1_ps(kTanhSeries[5]);
  for (int k = 4; k >= 0; --k) p = _mm512_fmadd_ps(p, y2, _mm512_set1_ps(kTanhSeries[k]));
  const __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(p, y2), y, y);
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 e = ExpNonPositive16(_mm512_mul_ps(a, _mm512_set1_ps(-2.0f)));
  const __m512 large = _mm512_div_ps(_mm512_sub_ps(one, e), _mm512_add_ps(one, e));
  const __m512i sign = _mm512_and_si512(_mm512_castps_si512(y), _mm512_set1_epi32(INT32_MIN));
  const __m512 signed_large = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(large), sign));
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, _mm512_set1_ps(kTanhSplit), _CMP_LT_OQ),
                              signed_large, small);
}
#endif

#ifdef EP_AVX2
inline __m256 Tanh8(__m256 y) {  // Tanh, 8 lanes
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 y2 = _mm256_mul_ps(y, y), a = _mm256_andnot_ps(sign, y);
  __m256 p = _mm256_set1_ps(kTanhSeries[5]);
  for (int k = 4; k >= 0; --k) p = _mm256_fmadd_ps(p, y2, _mm256_set1_ps(kTanhSeries[k]));
  const __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(p, y2), y, y);
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 e = ExpNonPositive8(_mm256_mul_ps(a, _mm256_set1_ps(-2.0f)));
  const __m256 large = _mm256_or_ps(
      _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e)), _mm256_and_ps(sign, y));
  return _mm256_blendv_ps(large, small, _mm256_cmp_ps(a, _mm256_set1_ps(kTanhSplit), _CMP_LT_OQ));
}
#endif

// x[0 .. n) = cap * tanh(x / cap); cap > 0.
inline void SoftCap(float* x, int64_t n, float cap) {
  const float inverse = 1.0f / cap;
  int64_t i = 0;
#ifdef __AVX512F__
  const __m512 cap16 = _mm512_set1_ps(cap), inverse16 = _mm512_set1_ps(inverse);
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(x + i, _mm512_mul_ps(cap16, Tanh16(_mm512_mul_ps(_mm512_loadu_ps(x + i), inverse16))));
#elif defined(EP_AVX2)
  const __m256 cap8 = _mm256_set1_ps(cap), inverse8 = _mm256_set1_ps(inverse);
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(x + i, _mm256_mul_ps(cap8, Tanh8(_mm256_mul_ps(_mm256_loadu_ps(x + i), inverse8))));
#endif
  for (; i < n; ++i) x[i] = cap * Tanh(x[i] * inverse);
}

}  // namespace edgeprefill
