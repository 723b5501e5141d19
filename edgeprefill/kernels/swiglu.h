// silu(gate) * up, row by row: the arithmetic of SwiGlu (swiglu.cc) and of the gated
// projections (MatMulInt8, MatMulBf16, MatMulF32 and MatMulInt4 with gated=1), which apply
// it to their gate and up panels before writing anything out. One definition, so both give
// the same bits.
//
// silu(g) = g * sigmoid(g), with sigmoid(g) = 1 / (1 + e^-g) for g >= 0 and e^g / (1 + e^g)
// below, both from e^-|g| <= 1 (ExpNonPositive), so nothing overflows at any g. Lanes run
// 16 at a time and the tail (width % 16) one by one: a caller that splits a row must split
// it at multiples of 16 to keep every element on the same path.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernel_common.h"

namespace edgeprefill {

inline float Silu(float g) {
  const float e = ExpNonPositive(-std::fabs(g));
  const float r = 1.0f / (1.0f + e);
  return g * (g >= 0.0f ? r : e * r);
}

inline void SwiGluRow(const float* gate, const float* up, float* out, int64_t width) {
  int64_t i = 0;
#ifdef __AVX512F__
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 sign = _mm512_set1_ps(-0.0f);
  for (; i + 16 <= width; i += 16) {
    const __m512 g = _mm512_loadu_ps(gate + i);
    const __m512 e = ExpNonPositive16(_mm512_or_ps(g, sign));  // e^-|g|
    const __m512 r = _mm512_div_ps(one, _mm512_add_ps(one, e));
    const __mmask16 negative = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_LT_OQ);
    const __m512 sigmoid = _mm512_mask_mul_ps(r, negative, e, r);
    _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_mul_ps(g, sigmoid), _mm512_loadu_ps(up + i)));
  }
#elif defined(EP_AVX2)
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (; i + 16 <= width; i += 16)  // 16 lanes as two halves: the same tail as AVX-512's
    for (int64_t h = i; h < i + 16; h += 8) {
      const __m256 g = _mm256_loadu_ps(gate + h);
      const __m256 e = ExpNonPositive8(_mm256_or_ps(g, sign));  // e^-|g|
      const __m256 r = _mm256_div_ps(one, _mm256_add_ps(one, e));
      const __m256 negative = _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_LT_OQ);
      const __m256 sigmoid = _mm256_blendv_ps(r, _mm256_mul_ps(e, r), negative);
      _mm256_storeu_ps(out + h, _mm256_mul_ps(_mm256_mul_ps(g, sigmoid), _mm256_loadu_ps(up + h)));
    }
#endif
  for (; i < width; ++i) out[i] = Silu(gate[i]) * up[i];
}

// Piece `index` of a gated projection (MatMulInt8, MatMulBf16, MatMulF32, MatMulInt4 with
// gated=1) over M rows and `panels` panels of kPanel columns, gate then up: rows
// [block * kRowBlock, +kRowBlock) of gate panel p and up panel p + panels / 2, index =
// block * (panels / 2) + p. panel(first, rows, q, dst) computes rows [first, first + rows)
// of panel q into dst (rows kPanel floats apart); both stay here (24 KB at 48 x 64) until
// silu(gate) * up goes to out [M, N / 2]: the N columns are never written out.
template <int64_t kPanel, int64_t kRowBlock, typename Panel>
inline void GatedPiece(size_t index, int64_t m, int64_t panels, float* out, const Panel& panel) {
  const int64_t halves = panels / 2;
  const int64_t block = static_cast<int64_t>(index) / halves;
  const int64_t p = static_cast<int64_t>(index) % halves;
  const int64_t first = block * kRowBlock, rows = std::min(kRowBlock, m - first);
  alignas(64) float gate[kRowBlock * kPanel], up[kRowBlock * kPanel];
  panel(first, rows, p, gate);
  panel(first, rows, p + halves, up);
  const int64_t width = halves * kPanel;
  for (int64_t r = 0; r < rows; ++r)
    SwiGluRow(gate + r * kPanel, up + r * kPanel, out + (first + r) * width + p * kPanel, kPanel);
}

}  // namespace edgeprefill
