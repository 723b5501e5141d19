// The residual add and RMS norm of one row: the arithmetic of SkipRmsNorm (rms_norm.cc) and
// of the projections that run it before their product (MatMulInt8, MatMulBf16, MatMulF32
// and MatMulInt4 with an epsilon attribute), which keep the normalized row to themselves.
// One definition, so both give the same bits.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernel_common.h"

namespace edgeprefill {

// sum = x + skip; returns the sum of its squares (16 lanes, then halved to one).
inline float AddRow(const float* x, const float* skip, float* sum, int64_t width) {
  int64_t i = 0;
  float squares = 0.0f;
#ifdef __AVX512F__
  __m512 acc = _mm512_setzero_ps();
  for (; i + 16 <= width; i += 16) {
    const __m512 s = _mm512_add_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(skip + i));
    _mm512_storeu_ps(sum + i, s);
    acc = _mm512_fmadd_ps(s, s, acc);
  }
  if (i < width) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (width - i)) - 1u);
    const __m512 s = _mm512_add_ps(_mm512_maskz_loadu_ps(tail, x + i),
                                   _mm512_maskz_loadu_ps(tail, skip + i));
    _mm512_mask_storeu_ps(sum + i, tail, s);
    acc = _mm512_fmadd_ps(s, s, acc);
  }
  squares = _mm512_reduce_add_ps(acc);
#elif defined(EP_AVX2)
  __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};  // 16 running sums
  for (; i + 8 <= width; i += 8) {
    const __m256 s = _mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(skip + i));
    _mm256_storeu_ps(sum + i, s);
    acc[i / 8 % 2] = _mm256_fmadd_ps(s, s, acc[i / 8 % 2]);
  }
  if (i < width) {  // the tail: lanes past `width` load and add 0
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i tail = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(width - i)), lane);
    const __m256 s = _mm256_add_ps(_mm256_maskload_ps(x + i, tail), _mm256_maskload_ps(skip + i, tail));
    _mm256_maskstore_ps(sum + i, tail, s);
    acc[i / 8 % 2] = _mm256_fmadd_ps(s, s, acc[i / 8 % 2]);
  }
  squares = SumLanes(_mm256_add_ps(acc[0], acc[1]));
#else
  // 16 running sums, as the vector path keeps, each an explicit fma: the compiler may
  // vectorize this however it likes without moving a bit (it cannot reorder the sums, and
  // a * b + c it might contract in one unrolled copy and not in another: ExpNonPositive).
  float lanes[16] = {};
  for (; i < width; i += 16) {
    const int64_t n = std::min<int64_t>(16, width - i);
    for (int64_t l = 0; l < n; ++l) {
      sum[i + l] = x[i + l] + skip[i + l];
      lanes[l] = std::fma(sum[i + l], sum[i + l], lanes[l]);
    }
  }
  for (const float lane : lanes) squares += lane;
#endif
  return squares;
}

// out = sum * scale * gamma
inline void ScaleRow(const float* sum, const float* gamma, float scale, float* out, int64_t width) {
  int64_t i = 0;
#ifdef __AVX512F__
  const __m512 s = _mm512_set1_ps(scale);
  for (; i + 16 <= width; i += 16)
    _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(sum + i), s),
                                            _mm512_loadu_ps(gamma + i)));
#elif defined(EP_AVX2)
  const __m256 s = _mm256_set1_ps(scale);
  for (; i + 8 <= width; i += 8)
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(sum + i), s),
                                            _mm256_loadu_ps(gamma + i)));
#endif
  for (; i < width; ++i) out[i] = sum[i] * scale * gamma[i];
}

// 1 / sqrt(mean of the squares + epsilon): the row's scale.
inline float InverseRms(float squares, int64_t width, float epsilon) {
  return 1.0f / std::sqrt(squares / static_cast<float>(width) + epsilon);
}

// Row r of a projection's input [rows, width]: `a` itself, or with the norm inside
// (norm.skip set) the normalized x + skip, left in `scratch` (width floats), x + skip
// written to norm.sum.
inline const float* NormedRow(const NormRows& norm, const float* a, int64_t r, int64_t width,
                              float* scratch) {
  if (norm.skip == nullptr) return a + r * width;
  float* sum = norm.sum + r * width;
  const float squares = AddRow(a + r * width, norm.skip + r * width, sum, width);
  ScaleRow(sum, norm.gamma, InverseRms(squares, width, norm.epsilon), scratch, width);
  return scratch;
}

}  // namespace edgeprefill
