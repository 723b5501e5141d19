// edgeprefill.MatMulInt8: out = a @ w for per-output-channel int8 weights, each row of a
// quantized to 8 bits on its own: scale = the row's largest magnitude / 127, codes rounded
// to nearest even and offset by 128 (unsigned), products summed in int32 by AVX512-VNNI's
// vpdpbusd (four multiply-adds per lane), each sum scaled by the row's and the column's
// scale in float32. ONNX Runtime's DynamicQuantizeMatMul, which it replaces at load
// (edgeprefill/engines/ort/int8_rows.py), scales a call's whole activation tensor at once,
// so a row's numbers depend on the rows beside it (a prompt's chunking, other sessions'
// rows in a batched decode step); here they do not, at its prefill speed and with faster
// decode steps (docs/benchmarks.md).
//
// Inputs:  0 a [..., K] float
//          1 b [P, K4, 64, 4] uint8 (int8 codes): the [K, N] weight in panels of 64
//            columns; bytes 4 c .. 4 c + 3 of a panel's line i are column c's codes for
//            k = 4 i .. 4 i + 3 (zero past K, N)
//          2 scales [N] float: the columns' scales
//          3 sums [N] int32: each column's sum of codes (takes the activations' +128 out)
//          4 skip [..., K] float, 5 gamma [K] float (both with epsilon, else absent)
// Outputs: 0 out [..., N] float, or [..., N / 2] with gated=1
//          1 sum [..., K] float: a + skip (with epsilon, else absent)
// Attributes: N (int);
//          epsilon (float, optional): the rows multiplied are RMSNorm(a + skip) * gamma,
//          the SkipRmsNorm before this op run inside it (rms_norm.h, the same bits;
//          kernels/rms_norm.py's fold_norms);
//          gated (int, optional): 1 when the weight's columns are an MLP's gate then up (N / 2
//          of each, whole panels): the output is silu(gate) * up, swiglu.h's arithmetic on
//          the same sums, so the same bits as this op then SwiGlu, without writing the N
//          columns out and reading them back (kernels/swiglu.py's fold_gated).
//
// Without AVX512-VNNI the same sums come from AVX2 (below; on a Zen 3 a 256-row chunk
// 1.03-1.08x as long as ONNX Runtime's DynamicQuantizeMatMul, an int8 bundle's prefill
// about as long, a one-row call 0.91-1.07x: docs/benchmarks.md, stop 44; a call of one row
// now reads two panels side by side, RowPair), from NEON's sdot
// on 64-bit Arm with the dot product extension (unmeasured: docs/jetson.md) or portable
// loops, far slower: int8_rows.py switches the op in only on CPUs with VNNI or the AVX2
// path.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernel_common.h"
#include "rms_norm.h"
#include "swiglu.h"

namespace edgeprefill {
namespace {

constexpr int64_t kPanel = 64;     // columns per packed panel: four 16-lane accumulators
static_assert(kPanel == kGatedPanel, "gated=1 is checked against this panel width");
constexpr int64_t kRows = 6;       // rows per register tile: 6 x 4 accumulators + 4 B + 1 A
// Rows per parallel piece: 8 register tiles of 6 rows; AVX2 copies each panel before its
// tiles (Rows below), and 24 tiles of 4 rows share a copy (48 rows: 1-4% slower).
#ifdef EP_AVX2
constexpr int64_t kRowBlock = 96;
#else
constexpr int64_t kRowBlock = 48;
#endif

struct Job {
  const float* a;       // [M, K]
  const int8_t* b;      // [P, K4, 64, 4]
  const float* scales;  // [N]
  const int32_t* sums;  // [N]
  uint32_t* quads;      // [M, K4]: a row's codes + kCodeOffset (below), four to a uint32, in k order
  float* row_scale;     // [M]
  float* out;           // [M, N], or [M, N / 2] when gated
  int64_t m, k, k4, n, panels, row_blocks;
  bool gated;
  NormRows norm;        // the norm inside, or all null
};

// The byte a code is stored as: code + 128 (unsigned) for vpdpbusd and the portable loops,
// the signed code itself for AVX2's sign trick (Sums below), which would otherwise flip
// each row's bytes once per 4 k and row in its inner loop.
#ifdef EP_AVX2
constexpr int kCodeOffset = 0;
#else
constexpr int kCodeOffset = 128;
#endif

void QuantizeRows(const Job& job, int64_t first, int64_t last) {
  std::vector<float> normed(job.norm.skip != nullptr ? job.k : 0);
  for (int64_t r = first; r < last; ++r) {
    const float* a = NormedRow(job.norm, job.a, r, job.k, normed.data());
    float top = 0.0f;
    int64_t i = 0;
#ifdef __AVX512F__
    __m512 tops = _mm512_setzero_ps();
    for (; i + 16 <= job.k; i += 16) tops = _mm512_max_ps(tops, _mm512_abs_ps(_mm512_loadu_ps(a + i)));
    top = _mm512_reduce_max_ps(tops);
#elif defined(EP_AVX2)
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 tops = _mm256_setzero_ps();
    for (; i + 8 <= job.k; i += 8) tops = _mm256_max_ps(tops, _mm256_and_ps(_mm256_loadu_ps(a + i), magnitude));
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, tops);
    for (float lane : lanes) top = std::max(top, lane);
#endif
    for (; i < job.k; ++i) top = std::max(top, std::fabs(a[i]));
    const float scale = top > 0.0f ? top / 127.0f : 1.0f;
    const float inverse = 1.0f / scale;
    job.row_scale[r] = scale;
    uint8_t* q = reinterpret_cast<uint8_t*>(job.quads + r * job.k4);
    i = 0;
#ifdef __AVX512F__
    const __m512 inv = _mm512_set1_ps(inverse);
    for (; i + 16 <= job.k; i += 16) {  // cvtps rounds to nearest even, as nearbyint does
      const __m512i codes = _mm512_add_epi32(
          _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(a + i), inv)), _mm512_set1_epi32(128));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), _mm512_cvtusepi32_epi8(codes));
    }
#elif defined(EP_AVX2)
    const __m256 inv = _mm256_set1_ps(inverse);
    for (; i + 16 <= job.k; i += 16) {  // cvtps rounds to nearest even, as nearbyint does
      const __m256i low = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(a + i), inv));
      const __m256i high = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(a + i + 8), inv));
      const __m256i words = _mm256_packs_epi32(low, high);  // lanes' halves interleaved
      const __m128i bytes = _mm_packs_epi16(_mm256_castsi256_si128(words),
                                            _mm256_extracti128_si256(words, 1));
      // packs took 0-3 low, 0-3 high, 4-7 low, 4-7 high: put the 4-byte groups in k order
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), _mm_shuffle_epi32(bytes, 0xd8));
    }
#endif
    for (; i < job.k; ++i)
      q[i] = static_cast<uint8_t>(static_cast<int>(std::nearbyint(a[i] * inverse)) + kCodeOffset);
    for (; i < job.k4 * 4; ++i) q[i] = kCodeOffset;  // code 0 past K
  }
}

#ifdef __AVX512VNNI__
// kTile rows x 64 columns of int32 sums over the whole K, in 24 named registers: GCC 12
// spilled an array of accumulators to the stack around vpdpbusd (2x slower).
template <int kTile>
void Sums(const uint32_t* quads, int64_t k4, const int8_t* panel, __m512i* out) {
  __m512i a00 = _mm512_setzero_si512(), a01 = a00, a02 = a00, a03 = a00;
  __m512i a10 = a00, a11 = a00, a12 = a00, a13 = a00;
  __m512i a20 = a00, a21 = a00, a22 = a00, a23 = a00;
  __m512i a30 = a00, a31 = a00, a32 = a00, a33 = a00;
  __m512i a40 = a00, a41 = a00, a42 = a00, a43 = a00;
  __m512i a50 = a00, a51 = a00, a52 = a00, a53 = a00;
#define EP_ROW(r)                                                                    \
  if (kTile > r) {                                                                   \
    const __m512i x = _mm512_set1_epi32(static_cast<int>(quads[r * k4 + i]));        \
    a##r##0 = _mm512_dpbusd_epi32(a##r##0, x, b0);                                   \
    a##r##1 = _mm512_dpbusd_epi32(a##r##1, x, b1);                                   \
    a##r##2 = _mm512_dpbusd_epi32(a##r##2, x, b2);                                   \
    a##r##3 = _mm512_dpbusd_epi32(a##r##3, x, b3);                                   \
  }
  for (int64_t i = 0; i < k4; ++i) {
    const int8_t* b = panel + i * kPanel * 4;
    const __m512i b0 = _mm512_loadu_si512(b);
    const __m512i b1 = _mm512_loadu_si512(b + 64);
    const __m512i b2 = _mm512_loadu_si512(b + 128);
    const __m512i b3 = _mm512_loadu_si512(b + 192);
    EP_ROW(0) EP_ROW(1) EP_ROW(2) EP_ROW(3) EP_ROW(4) EP_ROW(5)
  }
#undef EP_ROW
  const __m512i all[24] = {a00, a01, a02, a03, a10, a11, a12, a13, a20, a21, a22, a23,
                           a30, a31, a32, a33, a40, a41, a42, a43, a50, a51, a52, a53};
  for (int q = 0; q < kTile * 4; ++q) out[q] = all[q];
}

// Rows [row, row + kTile) x the panel's columns of out (rows `stride` floats apart): the
// sums, less 128 x each column's code sum, times the row's and the column's scale.
template <int kTile>
void Tile(const Job& job, int64_t row, int64_t p, int64_t columns, float* out, int64_t stride) {
  __m512i sums[kTile * 4];
  Sums<kTile>(job.quads + row * job.k4, job.k4, job.b + p * job.k4 * kPanel * 4, sums);
  const int64_t c0 = p * kPanel;
  for (int r = 0; r < kTile; ++r) {
    const __m512 row_scale = _mm512_set1_ps(job.row_scale[row + r]);
    for (int j = 0; j < 4 && j * 16 < columns; ++j) {
      const int64_t left = columns - j * 16;
      const __mmask16 mask = left >= 16 ? 0xffff : static_cast<__mmask16>((1u << left) - 1);
      const __m512i offset =
          _mm512_slli_epi32(_mm512_maskz_loadu_epi32(mask, job.sums + c0 + j * 16), 7);
      const __m512 scale =
          _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, job.scales + c0 + j * 16), row_scale);
      const __m512 sum = _mm512_cvtepi32_ps(_mm512_sub_epi32(sums[r * 4 + j], offset));
      _mm512_mask_storeu_ps(out + r * stride + j * 16, mask, _mm512_mul_ps(sum, scale));
    }
  }
}

// Rows [first, first + rows) x panel p's columns, into out (row r at out + r * stride).
void Rows(const Job& job, int64_t first, int64_t rows, int64_t p, float* out, int64_t stride) {
  const int64_t columns = std::min(kPanel, job.n - p * kPanel);
  int64_t r = 0;
  for (; r + kRows <= rows; r += kRows)
    Tile<kRows>(job, first + r, p, columns, out + r * stride, stride);
  float* o = out + r * stride;
  switch (rows - r) {
    case 5: Tile<5>(job, first + r, p, columns, o, stride); break;
    case 4: Tile<4>(job, first + r, p, columns, o, stride); break;
    case 3: Tile<3>(job, first + r, p, columns, o, stride); break;
    case 2: Tile<2>(job, first + r, p, columns, o, stride); break;
    case 1: Tile<1>(job, first + r, p, columns, o, stride); break;
    default: break;
  }
}
#elif defined(EP_AVX2)
// AVX2 (Zen 1-3, Intel client CPUs): the same int32 sums, 8 columns to a register, up to 4
// rows x a quarter panel (16 columns) at a time: 8 accumulators, the rest of the 16
// registers for the weights, their magnitudes and a row's codes. vpmaddubsw multiplies
// unsigned by signed bytes and adds neighbours in int16, which saturates on codes + 128
// (up to 2 x 255 x 128); on the signed codes q (-127..127, kCodeOffset 0) times the
// weights w (-128..127) taken as |w| and sign(q, w), a pair is at most 2 x 128 x 127 =
// 32512 in magnitude: exact. vpmaddwd by ones adds each column's two int16 lanes into its
// int32 lane. The sums are those of q x w, which is what VNNI's (q + 128) x w less 128 x
// the column's code sum comes to: the same integers, hence the same float32 bits. Tiles of
// 2 rows x 32 columns took 15-20% longer; 3, 5 or 6 rows x 16 columns, or 6 x 8, no
// shorter. Each 32 products of a row cost 4 instructions (sign, vpmaddubsw, vpmaddwd,
// add), as many as ONNX Runtime's uint8 GEMM here spends (2 x vpmaddwd and add on codes
// widened to int16): this runs near that bound (docs/benchmarks.md, stop 44).
constexpr int kAvx2Rows = 4;
// kTile rows x kGroups x 8 columns of each of U panels: the slices of k4 lines `line` bytes
// apart at lines[u], read side by side (U > 1: one row's decode, RowPair below); panel u's
// sums to out[(u * kTile + r) * kGroups + j].
template <int kTile, int kGroups, int U = 1>
void Sums(const uint32_t* quads, int64_t k4, const int8_t* const (&lines)[U], int64_t line,
          __m256i* out) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i acc[U][kTile][kGroups];
  for (int u = 0; u < U; ++u)
    for (int r = 0; r < kTile; ++r)
      for (int j = 0; j < kGroups; ++j) acc[u][r][j] = _mm256_setzero_si256();
  if constexpr (U > 1) {  // one row: each weight used once, none kept in a register
    static_assert(kTile == 1, "panels side by side are for one row");
    for (int64_t i = 0; i < k4; ++i) {
      const __m256i x = _mm256_set1_epi32(static_cast<int>(quads[i]));
      __m256i w[U][kGroups];
      for (int u = 0; u < U; ++u)
        for (int j = 0; j < kGroups; ++j)
          w[u][j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lines[u] + i * line + 32 * j));
      for (int u = 0; u < U; ++u)
        for (int j = 0; j < kGroups; ++j)
          acc[u][0][j] = _mm256_add_epi32(acc[u][0][j], _mm256_madd_epi16(
              _mm256_maddubs_epi16(_mm256_abs_epi8(w[u][j]), _mm256_sign_epi8(x, w[u][j])), ones));
    }
  } else {  // each weight and its magnitude kept for the tile's rows
    for (int64_t i = 0; i < k4; ++i) {
      const int8_t* b = lines[0] + i * line;
      __m256i w[kGroups], magnitude[kGroups];
      for (int j = 0; j < kGroups; ++j) {
        w[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 32 * j));
        magnitude[j] = _mm256_abs_epi8(w[j]);
      }
      for (int r = 0; r < kTile; ++r) {  // the row's codes for k = 4 i .. 4 i + 3, in every lane
        const __m256i x = _mm256_set1_epi32(static_cast<int>(quads[r * k4 + i]));
        for (int j = 0; j < kGroups; ++j)
          acc[0][r][j] = _mm256_add_epi32(acc[0][r][j], _mm256_madd_epi16(
              _mm256_maddubs_epi16(magnitude[j], _mm256_sign_epi8(x, w[j])), ones));
      }
    }
  }
  for (int u = 0; u < U; ++u)
    for (int r = 0; r < kTile; ++r)
      for (int j = 0; j < kGroups; ++j) out[(u * kTile + r) * kGroups + j] = acc[u][r][j];
}

// Rows [row, row + kTile)'s sums x kGroups x 8 columns (as Sums'), scaled, to out: columns
// c0 .. of the op's, `left` of them before N (rows `stride` floats apart, out at c0).
template <int kTile, int kGroups>
void Store(const Job& job, int64_t row, const __m256i* sums, int64_t c0, int64_t left,
           float* out, int64_t stride) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int j = 0; j < kGroups && j * 8 < left; ++j) {
    const int64_t c = j * 8, count = std::min<int64_t>(8, left - c);
    // The panel's last columns may end before 8: masked loads and stores there.
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)), lane);
    const __m256 scale = count == 8 ? _mm256_loadu_ps(job.scales + c0 + c)
                                    : _mm256_maskload_ps(job.scales + c0 + c, mask);
    for (int r = 0; r < kTile; ++r) {
      const __m256 value = _mm256_mul_ps(_mm256_cvtepi32_ps(sums[r * kGroups + j]),
                                         _mm256_mul_ps(scale, _mm256_set1_ps(job.row_scale[row + r])));
      if (count == 8)
        _mm256_storeu_ps(out + r * stride + c, value);
      else
        _mm256_maskstore_ps(out + r * stride + c, mask, value);
    }
  }
}

// Rows [row, row + kTile) x kGroups x 8 columns from `lines` (as Sums), columns c0 .. of
// the op's, `left` of them before N, into out (rows `stride` floats apart, out at c0).
template <int kTile, int kGroups>
void Tile(const Job& job, int64_t row, const int8_t* lines, int64_t line, int64_t c0,
          int64_t left, float* out, int64_t stride) {
  __m256i sums[kTile * kGroups];
  const int8_t* const one[1] = {lines};
  Sums<kTile, kGroups>(job.quads + row * job.k4, job.k4, one, line, sums);
  Store<kTile, kGroups>(job, row, sums, c0, left, out, stride);
}

// One row x panels p and q (their columns to out_p and out_q), half a panel of each at a
// time, the two read side by side: one Zen 3 core fetches one stream of weights at ~16-19
// GB/s and two far apart at ~22-24, and an int8 decode step took 0.92-0.94x as long so
// (docs/benchmarks.md, stop 60). The sums are Tile<1, 4>'s: the same bits.
void RowPair(const Job& job, int64_t row, int64_t p, int64_t q, float* out_p, float* out_q) {
  const int64_t panel[2] = {p, q};
  float* const out[2] = {out_p, out_q};
  for (int h = 0; h < 2; ++h) {
    const int8_t* const lines[2] = {job.b + p * job.k4 * kPanel * 4 + h * 128,
                                    job.b + q * job.k4 * kPanel * 4 + h * 128};
    __m256i sums[2 * 4];
    Sums<1, 4, 2>(job.quads + row * job.k4, job.k4, lines, kPanel * 4, sums);
    for (int u = 0; u < 2; ++u) {
      const int64_t columns = std::min(kPanel, job.n - panel[u] * kPanel);
      Store<1, 4>(job, row, sums + u * 4, panel[u] * kPanel + h * 32, columns - h * 32,
                  out[u] + h * 32, 0);
    }
  }
}
#define EP_INT8_ROW_PAIRS 1  // RunRowPiece and RunGatedRowPiece below

// Rows [first, first + rows) x panel p's columns, into out (row r at out + r * stride).
// Four or more rows: tiles of 4 rows x a quarter panel (16 columns). A quarter panel's
// 64-byte slices of the 256-byte lines, read in place, fall into a quarter of the L1's
// sets and miss; copied together first (once per row block, for up to 12 row tiles) the
// sums ran 5-10% faster. Fewer rows (decode steps): each row x half a panel, in place.
void Rows(const Job& job, int64_t first, int64_t rows, int64_t p, float* out, int64_t stride) {
  const int64_t columns = std::min(kPanel, job.n - p * kPanel);
  const int8_t* panel = job.b + p * job.k4 * kPanel * 4;
  if (rows < kAvx2Rows) {
    for (int h = 0; h < 2 && h * 32 < columns; ++h)
      for (int64_t r = 0; r < rows; ++r)
        Tile<1, 4>(job, first + r, panel + h * 128, kPanel * 4, p * kPanel + h * 32,
                   std::min<int64_t>(32, columns - h * 32), out + r * stride + h * 32, stride);
    return;
  }
  thread_local std::vector<__m256i> copy;  // the panel by quarters, 64 bytes a line
  copy.resize(static_cast<size_t>(job.k4 * 8));
  for (int64_t i = 0; i < job.k4; ++i)  // in the panel's order: the prefetchers follow it
    for (int q = 0; q < 8; ++q)
      copy[(q / 2) * job.k4 * 2 + i * 2 + q % 2] =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + i * kPanel * 4) + q);
  for (int h = 0; h < 4 && h * 16 < columns; ++h) {
    const int8_t* lines = reinterpret_cast<const int8_t*>(copy.data() + h * job.k4 * 2);
    const int64_t c0 = p * kPanel + h * 16, left = std::min<int64_t>(16, columns - h * 16);
    float* o = out + h * 16;
    int64_t r = 0;
    for (; r + kAvx2Rows <= rows; r += kAvx2Rows)
      Tile<kAvx2Rows, 2>(job, first + r, lines, 64, c0, left, o + r * stride, stride);
    switch (rows - r) {
      case 3: Tile<3, 2>(job, first + r, lines, 64, c0, left, o + r * stride, stride); break;
      case 2: Tile<2, 2>(job, first + r, lines, 64, c0, left, o + r * stride, stride); break;
      case 1: Tile<1, 2>(job, first + r, lines, 64, c0, left, o + r * stride, stride); break;
      default: break;
    }
  }
}
#elif defined(EP_NEON) && defined(__ARM_FEATURE_DOTPROD)
// 64-bit Arm with the dot product extension (optional from Armv8.2-A; Jetson Orin's
// Cortex-A78AE has it): sdot (vdotq_s32) adds four signed byte products into each int32
// lane, as vpdpbusd adds unsigned by signed ones. On the signed codes q (the codes xor
// 0x80, AVX2's Sums' trick) it sums q x w, the integers the other paths sum: the same
// float32 bits. A lane is a column (16 bytes of a panel's line: 4 columns' 4 codes), and
// kTile rows x a quarter panel (16 columns) are 4 kTile accumulators.
template <int kTile>
void QuarterSums(const uint32_t* quads, int64_t k4, const int8_t* panel, int32x4_t* out) {
  int32x4_t acc[kTile][4];
  for (int r = 0; r < kTile; ++r)
    for (int j = 0; j < 4; ++j) acc[r][j] = vdupq_n_s32(0);
  for (int64_t i = 0; i < k4; ++i) {
    const int8_t* b = panel + i * kPanel * 4;
    int8x16_t w[4];
    for (int j = 0; j < 4; ++j) w[j] = vld1q_s8(b + 16 * j);
    for (int r = 0; r < kTile; ++r) {  // the row's signed codes for k = 4 i .. 4 i + 3
      const int8x16_t x = vreinterpretq_s8_u32(vdupq_n_u32(quads[r * k4 + i] ^ 0x80808080u));
      for (int j = 0; j < 4; ++j) acc[r][j] = vdotq_s32(acc[r][j], w[j], x);
    }
  }
  for (int r = 0; r < kTile; ++r)
    for (int j = 0; j < 4; ++j) out[r * 4 + j] = acc[r][j];
}

// Rows [row, row + kTile) x quarter h of panel p (its columns 16 h .. 16 h + 15; `columns`:
// the panel's columns before N) into out (rows `stride` floats apart, out at the panel).
template <int kTile>
void QuarterTile(const Job& job, int64_t row, int64_t p, int h, int64_t columns, float* out,
                 int64_t stride) {
  int32x4_t sums[kTile * 4];
  QuarterSums<kTile>(job.quads + row * job.k4, job.k4, job.b + p * job.k4 * kPanel * 4 + h * 64,
                     sums);
  for (int r = 0; r < kTile; ++r) {
    const float32x4_t row_scale = vdupq_n_f32(job.row_scale[row + r]);
    for (int j = 0; j < 4; ++j) {
      const int64_t c = h * 16 + j * 4, left = std::min<int64_t>(4, columns - c);
      if (left <= 0) break;
      float scale[4] = {}, lanes[4];  // the panel's last columns may end before 4
      std::memcpy(scale, job.scales + p * kPanel + c, left * sizeof(float));
      vst1q_f32(lanes, vmulq_f32(vcvtq_f32_s32(sums[r * 4 + j]),
                                 vmulq_f32(vld1q_f32(scale), row_scale)));
      std::memcpy(out + r * stride + c, lanes, left * sizeof(float));
    }
  }
}

// Rows [first, first + rows) x panel p's columns, into out (row r at out + r * stride).
void Rows(const Job& job, int64_t first, int64_t rows, int64_t p, float* out, int64_t stride) {
  const int64_t columns = std::min(kPanel, job.n - p * kPanel);
  for (int h = 0; h < 4 && h * 16 < columns; ++h) {
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4) QuarterTile<4>(job, first + r, p, h, columns, out + r * stride, stride);
    for (; r < rows; ++r) QuarterTile<1>(job, first + r, p, h, columns, out + r * stride, stride);
  }
}
#else
void Rows(const Job& job, int64_t first, int64_t rows, int64_t p, float* out, int64_t stride) {
  const int64_t columns = std::min(kPanel, job.n - p * kPanel);
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* q = reinterpret_cast<const uint8_t*>(job.quads + (first + r) * job.k4);
    for (int64_t c = 0; c < columns; ++c) {
      int32_t acc = 0;
      for (int64_t i = 0; i < job.k4 * 4; ++i)
        acc += int32_t{q[i]} * job.b[((p * job.k4 + i / 4) * kPanel + c) * 4 + i % 4];
      const int64_t col = p * kPanel + c;
      out[r * stride + c] = static_cast<float>(acc - kCodeOffset * job.sums[col]) *
                            (job.scales[col] * job.row_scale[first + r]);
    }
  }
}
#endif

// Piece i: rows [block * kRowBlock, +kRowBlock) of panel p, i = block * panels + p.
void RunPiece(void* data, size_t index) {
  const Job& job = *static_cast<const Job*>(data);
  const int64_t block = static_cast<int64_t>(index) / job.panels;
  const int64_t p = static_cast<int64_t>(index) % job.panels;
  const int64_t first = block * kRowBlock;
  Rows(job, first, std::min(kRowBlock, job.m - first), p, job.out + first * job.n + p * kPanel,
       job.n);
}

#ifdef EP_INT8_ROW_PAIRS
// A call of one row (a decode step's, one session): piece i is panels i and i + ceil(P /
// 2), side by side where both are there.
void RunRowPiece(void* data, size_t index) {
  const Job& job = *static_cast<const Job*>(data);
  const int64_t p = static_cast<int64_t>(index), q = p + (job.panels + 1) / 2;
  if (q < job.panels)
    RowPair(job, 0, p, q, job.out + p * kPanel, job.out + q * kPanel);
  else
    Rows(job, 0, 1, p, job.out + p * kPanel, job.n);
}

// The same with gated=1: gate panel i and its up panel side by side, then GatedPiece's
// silu(gate) * up on the same sums: the same bits.
void RunGatedRowPiece(void* data, size_t index) {
  const Job& job = *static_cast<const Job*>(data);
  const int64_t p = static_cast<int64_t>(index), halves = job.panels / 2;
  alignas(64) float gate[kPanel], up[kPanel];
  RowPair(job, 0, p, p + halves, gate, up);
  SwiGluRow(gate, up, job.out + p * kPanel, kPanel);
}
#endif

// gated=1: swiglu.h's GatedPiece over this op's panels.
void RunGatedPiece(void* data, size_t index) {
  const Job& job = *static_cast<const Job*>(data);
  GatedPiece<kPanel, kRowBlock>(index, job.m, job.panels, job.out,
                                [&job](int64_t first, int64_t rows, int64_t q, float* dst) {
                                  Rows(job, first, rows, q, dst, kPanel);
                                });
}

void RunQuantize(void* data, size_t index) {
  const Job& job = *static_cast<const Job*>(data);
  const int64_t first = static_cast<int64_t>(index) * kPrepareRows;
  QuantizeRows(job, first, std::min(job.m, first + kPrepareRows));
}

OrtStatus* Compute(void* state, OrtKernelContext* context) {
  const int64_t n = static_cast<Columns*>(state)->n;
  const bool gated = static_cast<Columns*>(state)->gated;
  Tensor a, b, scales, sums;  // b's bytes and sums' int32s behind Tensor's float pointer
  EP_RETURN_IF_ERROR(Input(context, 0, &a));
  EP_RETURN_IF_ERROR(Input(context, 1, &b));
  EP_RETURN_IF_ERROR(Input(context, 2, &scales));
  EP_RETURN_IF_ERROR(Input(context, 3, &sums));
  if (a.dims.empty()) return Fail("MatMulInt8: expects a [..., K]");
  NormRows norm;
  EP_RETURN_IF_ERROR(
      NormInputs(context, *static_cast<Columns*>(state), a, 4, "MatMulInt8", &norm));
  const int64_t k = a.dims.back(), k4 = (k + 3) / 4, panels = (n + kPanel - 1) / kPanel;
  if (b.dims != std::vector<int64_t>{panels, k4, kPanel, 4} || scales.dims != std::vector<int64_t>{n} ||
      sums.dims != std::vector<int64_t>{n})
    return Fail(("MatMulInt8: the packed weight, scales or sums do not fit K=" +
                 std::to_string(k) + ", N=" + std::to_string(n)).c_str());
  float* out = nullptr;
  int64_t m = 0;
  EP_RETURN_IF_ERROR(RowsOutput(context, a, gated ? n / 2 : n, &out, &m));
  if (m == 0) return nullptr;
  std::vector<uint32_t> quads(static_cast<size_t>(m * k4));
  std::vector<float> row_scale(static_cast<size_t>(m));
  Job job{a.data, reinterpret_cast<const int8_t*>(b.data), scales.data,
          reinterpret_cast<const int32_t*>(sums.data),
          quads.data(), row_scale.data(), out, m, k, k4, n, panels,
          (m + kRowBlock - 1) / kRowBlock, gated, norm};
  const bool split = WorthSplitting(m, k, n);
#ifdef EP_INT8_ROW_PAIRS
  if (m == 1) {  // a decode step of one session: two panels side by side
    ProjectRows(context, split, m, RunQuantize, static_cast<size_t>(gated ? panels / 2 : (panels + 1) / 2),
                gated ? RunGatedRowPiece : RunRowPiece, &job);
    return nullptr;
  }
#endif
  const int64_t pieces = job.row_blocks * (gated ? panels / 2 : panels);
  ProjectRows(context, split, m, RunQuantize, static_cast<size_t>(pieces),
              gated ? RunGatedPiece : RunPiece, &job);
  return nullptr;
}

OrtStatus* CreateKernel(const OrtKernelInfo* info, void** kernel) {
  return CreateColumnsKernel(info, "MatMulInt8", kernel);
}

OrtStatus* ORT_API_CALL ComputeKernel(void* kernel, OrtKernelContext* context) {
  return Compute(kernel, context);
}

}  // namespace

const Op& MatMulInt8Op() {
  // inputs: a float, b uint8 (the int8 codes' bytes), scales float, sums int32, skip and
  // gamma float (optional); outputs: out, sum (optional)
  static const Op op = [] {
    OpSpec spec{"MatMulInt8", 6, 2, 0b1000u, CreateKernel, ComputeKernel, DestroyColumnsKernel,
                0b10u};
    spec.optional_inputs = 0b110000u;
    spec.optional_outputs = 0b10u;
    return MakeOp(spec);
  }();
  return op;
}

}  // namespace edgeprefill
