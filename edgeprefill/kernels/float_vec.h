// float32 vectors as the projections' tiles use them (matmul_bf16.cc's widening path,
// matmul_f32.cc): one register type per instruction set, the few operations the tiles
// need, and how many accumulators a tile keeps. EP_FLOAT_VEC is defined where one of
// AVX-512F, AVX2 + FMA (EP_AVX2) or NEON (EP_NEON) builds; elsewhere the ops keep their
// portable loops.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernel_common.h"  // <immintrin.h> / <arm_neon.h>, EP_AVX2, EP_NEON

namespace edgeprefill {

#if defined(__AVX512F__)
#define EP_FLOAT_VEC 1
using Vec = __m512;
constexpr int kLanes = 16;
constexpr int kChains = 16;  // accumulators a tile keeps (of the 32 registers)
constexpr int kSliceVecs = 4;  // prefill tiles: 6 rows x 4 vectors (24 + 4 B + 1 A)
inline Vec Zero() { return _mm512_setzero_ps(); }
inline Vec Splat(float x) { return _mm512_set1_ps(x); }
inline Vec Fma(Vec a, Vec b, Vec acc) { return _mm512_fmadd_ps(a, b, acc); }
inline void Store(float* dst, Vec v) { _mm512_storeu_ps(dst, v); }
inline Vec Load(const float* src) { return _mm512_loadu_ps(src); }
#elif defined(EP_AVX2)
#define EP_FLOAT_VEC 1
using Vec = __m256;
constexpr int kLanes = 8;
constexpr int kChains = 8;  // of the 16 registers: the rest hold weights and activations
constexpr int kSliceVecs = 2;  // prefill tiles: 6 rows x 2 vectors (12 + 2 B + 1 A)
inline Vec Zero() { return _mm256_setzero_ps(); }
inline Vec Splat(float x) { return _mm256_set1_ps(x); }
inline Vec Fma(Vec a, Vec b, Vec acc) { return _mm256_fmadd_ps(a, b, acc); }
inline void Store(float* dst, Vec v) { _mm256_storeu_ps(dst, v); }
inline Vec Load(const float* src) { return _mm256_loadu_ps(src); }
#elif defined(EP_NEON)
#define EP_FLOAT_VEC 1
using Vec = float32x4_t;
constexpr int kLanes = 4;
constexpr int kChains = 16;  // of the 32 registers
constexpr int kSliceVecs = 4;  // prefill tiles: 6 rows x 4 vectors (24 + 4 B + 1 A)
inline Vec Zero() { return vdupq_n_f32(0.0f); }
inline Vec Splat(float x) { return vdupq_n_f32(x); }
inline Vec Fma(Vec a, Vec b, Vec acc) { return vfmaq_f32(acc, a, b); }
inline void Store(float* dst, Vec v) { vst1q_f32(dst, v); }
inline Vec Load(const float* src) { return vld1q_f32(src); }
#endif

#ifdef EP_FLOAT_VEC
// A tile's accumulators into rows of out, `columns` of them (a weight's last panel may end
// inside a vector).
template <int kTile, int kVecs>
void StoreTile(const Vec (&acc)[kTile][kVecs], float* out, int64_t n, int64_t columns) {
  for (int r = 0; r < kTile; ++r)
    for (int j = 0; j < kVecs && j * kLanes < columns; ++j) {
      if (columns - j * kLanes >= kLanes) {
        Store(out + r * n + j * kLanes, acc[r][j]);
      } else {
        float lanes[kLanes];
        Store(lanes, acc[r][j]);
        std::copy(lanes, lanes + (columns - j * kLanes), out + r * n + j * kLanes);
      }
    }
}
#endif

}  // namespace edgeprefill
