// edgeprefill.MatMulInt4: an int4 bundle's projections for decode steps (one row per
// sequence), in place of com.microsoft.MatMulNBits at accuracy level 4 on the same 4-bit
// weights, repacked at load (edgeprefill/engines/ort/int4_decode.py switches it in). It
// computes what that level computes: each row's activations quantized to int8 per block of
// 32 (scale = the block's largest magnitude / 127, rounded to nearest even), multiplied by
// the 4-bit weights (zero point 8) in int32, each block's sum scaled by both scales in
// float32. A decode step is bound by reading the weights: ONNX Runtime's kernel reads 11-16
// GB/s on one core of an AMD EPYC (Zen 4). Here each int32 lane of a register is one output
// column: a 64-byte load holds 8 weights of 16 columns, its low and high nibbles go to two
// AVX512-VNNI dot products against a broadcast quad of activations, and no sum ever crosses
// lanes (docs/benchmarks.md).
//
// Inputs:  0 a [..., K] float
//          1 b [T, blocks, 4, 64] uint8: T = ceil(N / 16) tiles of 16 columns, blocks of 32
//            along K; in part h of a block, byte 4 c + i holds column c's codes (w / scale
//            + 8) for k = 8 h + i (low nibble) and k = 8 h + 4 + i (high nibble)
//          2 scales [T, blocks, 16] float, or float16 where the load found every scale
//            exact in float16 (0 past N): 2 bytes a scale instead of 4, a tenth of the
//            bytes a decode step reads (export/quantize.py's half_exact)
//          3 skip [..., K] float, 4 gamma [K] float (both with epsilon, else absent)
// Outputs: 0 out [..., N] float, or [..., N / 2] with gated=1
//          1 sum [..., K] float: a + skip (with epsilon, else absent)
// Attributes: K, N (int);
//          epsilon (float, optional): the rows quantized are RMSNorm(a + skip) * gamma, the
//          SkipRmsNorm before this op run inside it (rms_norm.h, the same bits;
//          kernels/rms_norm.py's fold_norms);
//          gated (int, optional): 1 when the weight's columns are an MLP's gate then up (N / 2
//          of each, N a multiple of 128): the output is silu(gate) * up, swiglu.h's
//          arithmetic on the same sums, so the same bits as this op then SwiGlu; a piece
//          reads a gate tile and its up tile, two streams a core fetches side by side
//          (kernels/swiglu.py's fold_gated). A decode step's layer runs two nodes fewer.
//
// Without AVX512-VNNI the same int32 sums come from AVX2 (vpmaddubsw on the 4-bit codes,
// which cannot saturate: below), hence the same float32 bits; a decode step 4-15% shorter
// than with MatMulNBits on a Zen 3, and a call of one row reads four tiles far apart side
// by side (StreamsOf: a core fetches several streams faster than one). Elsewhere (no AVX2,
// or AVX-512 without VNNI) from portable loops, slower than ONNX Runtime's kernel:
// int4_decode.py switches this op in only where the build has VNNI or AVX2 code
// (cpu_has_int_kernels).

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

constexpr int64_t kBlock = 32;      // weights per quantization block (block_size)
constexpr int64_t kTile = 16;       // columns per tile: one int32 lane each
constexpr int64_t kTileBytes = 256;  // a tile's block: 16 columns x 32 weights x 4 bits
constexpr int64_t kPiece = 2;       // tiles per parallel piece (32 columns)
constexpr int64_t kRowsAtOnce = 8;  // rows sharing one read of the weights

// The node's K and its columns (N, gated, the norm inside: kernel_common.h's Columns).
struct Kernel {
  int64_t k;
  Columns columns;
};

// One row's activations quantized as accuracy level 4 does: int8 per block of 32, in k
// order (zero past K); per block its scale and 8 x the sum of its int8 values (the weights'
// zero point 8, taken out of the unsigned products).
struct Row {
  std::vector<int8_t> q;        // [blocks * 32]
  std::vector<float> scale;     // [blocks]
  std::vector<int32_t> offset;  // [blocks]
};

struct Job {
  int64_t k, n;  // n: the weight's columns (the output's, or twice them with gated)
  int64_t blocks, tiles, rows;
  const uint8_t* b;  // [tiles, blocks, 4, 64]
  const void* scales;  // [tiles, blocks, 16]: float, or float16 bits when `half`
  bool half;
  const std::vector<Row>* quantized;
  float* out;  // [rows, N], or [rows, N / 2] with gated
};

// float16 bits -> the float32 they stand for (exact; the scales are normal numbers).
inline float FromHalf(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16, exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  uint32_t bits = sign;
  if (exponent == 0x1fu)
    bits |= 0x7f800000u | (mantissa << 13);  // inf, NaN
  else if (exponent != 0)
    bits |= ((exponent + 112u) << 23) | (mantissa << 13);
  else if (mantissa != 0)  // subnormal: mantissa * 2^-24, exact in float32
    return (sign ? -1.0f : 1.0f) * std::ldexp(static_cast<float>(mantissa), -24);
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline float Scale(const float* p) { return *p; }
inline float Scale(const uint16_t* p) { return FromHalf(*p); }

// One block of activations (count <= 32) -> int8 rounded to nearest even (the vector
// conversion under the default rounding mode, as std::nearbyint); returns its scale.
#ifdef __AVX512F__
float QuantizeBlock(const float* a, int64_t count, int8_t* q) {
  const __mmask16 m0 = static_cast<__mmask16>(count >= 16 ? 0xffff : (1u << count) - 1);
  const __mmask16 m1 = static_cast<__mmask16>(count >= 32 ? 0xffff : count <= 16 ? 0 : (1u << (count - 16)) - 1);
  const __m512 x0 = _mm512_maskz_loadu_ps(m0, a), x1 = _mm512_maskz_loadu_ps(m1, a + 16);
  const float top = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
  const float scale = top / 127.0f;
  const __m512 inverse = _mm512_set1_ps(scale != 0.0f ? 1.0f / scale : 0.0f);
  const __m512i low = _mm512_set1_epi32(-127), high = _mm512_set1_epi32(127);
  const __m512i q0 = _mm512_min_epi32(high, _mm512_max_epi32(low, _mm512_cvtps_epi32(_mm512_mul_ps(x0, inverse))));
  const __m512i q1 = _mm512_min_epi32(high, _mm512_max_epi32(low, _mm512_cvtps_epi32(_mm512_mul_ps(x1, inverse))));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(q0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtepi32_epi8(q1));
  return scale;
}
#else
float QuantizeBlock(const float* a, int64_t count, int8_t* q) {
  float top = 0.0f;
  for (int64_t i = 0; i < count; ++i) top = std::max(top, std::fabs(a[i]));
  const float scale = top / 127.0f;
  const float inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
  for (int64_t i = 0; i < kBlock; ++i)
    q[i] = static_cast<int8_t>(
        i < count ? std::clamp(static_cast<int32_t>(std::nearbyint(a[i] * inverse)), -127, 127) : 0);
  return scale;
}
#endif

void Quantize(const float* a, int64_t k, int64_t blocks, Row* row) {
  row->q.assign(blocks * kBlock, 0);
  row->scale.assign(blocks, 0.0f);
  row->offset.assign(blocks, 0);
  for (int64_t block = 0; block < blocks; ++block) {
    int8_t* q = row->q.data() + block * kBlock;
    row->scale[block] = QuantizeBlock(a + block * kBlock, std::min(kBlock, k - block * kBlock), q);
    int32_t sum = 0;
    for (int64_t i = 0; i < kBlock; ++i) sum += q[i];
    row->offset[block] = 8 * sum;
  }
}

#ifdef __AVX512VNNI__
// A tile block's 16 column scales as float32.
inline __m512 Scales16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 Scales16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// Tiles [first, last) for R rows (a compile-time count: the sums stay in registers) with
// scales of type S, into `out`: row row0 + r's column 16 (t - first) + c at
// out[r * ld + 16 (t - first) + c]. Lane c of every register is column 16 t + c: no sum
// across lanes.
template <int R, typename S>
void TilesOf(const Job& job, int64_t first, int64_t last, int64_t row0, float* out, int64_t ld) {
  const __m512i nibble = _mm512_set1_epi8(0x0f);
  const Row* rows = job.quantized->data() + row0;
  const S* scales = static_cast<const S*>(job.scales);
  for (int64_t t = first; t < last; ++t) {
    __m512 sum[R];
    for (int r = 0; r < R; ++r) sum[r] = _mm512_setzero_ps();
    for (int64_t block = 0; block < job.blocks; ++block) {
      const uint8_t* w = job.b + (t * job.blocks + block) * kTileBytes;
      __m512i dot[R];
      for (int r = 0; r < R; ++r) dot[r] = _mm512_setzero_si512();
      for (int half = 0; half < 4; ++half) {  // 8 weights of each column: two quads of k
        const __m512i packed = _mm512_loadu_si512(w + half * 64);
        const __m512i low = _mm512_and_si512(packed, nibble);
        const __m512i high = _mm512_and_si512(_mm512_srli_epi16(packed, 4), nibble);
        for (int r = 0; r < R; ++r) {
          const int32_t* quads = reinterpret_cast<const int32_t*>(rows[r].q.data() + block * kBlock);
          dot[r] = _mm512_dpbusd_epi32(dot[r], low, _mm512_set1_epi32(quads[2 * half]));
          dot[r] = _mm512_dpbusd_epi32(dot[r], high, _mm512_set1_epi32(quads[2 * half + 1]));
        }
      }
      const __m512 wscale = Scales16(scales + (t * job.blocks + block) * kTile);
      for (int r = 0; r < R; ++r) {
        const __m512 value = _mm512_cvtepi32_ps(_mm512_sub_epi32(dot[r], _mm512_set1_epi32(rows[r].offset[block])));
        sum[r] = _mm512_fmadd_ps(_mm512_mul_ps(value, _mm512_set1_ps(rows[r].scale[block])), wscale, sum[r]);
      }
    }
    const int64_t columns = std::min(kTile, job.n - t * kTile);
    const __mmask16 mask = static_cast<__mmask16>(columns == kTile ? 0xffff : (1u << columns) - 1);
    for (int r = 0; r < R; ++r)
      _mm512_mask_storeu_ps(out + r * ld + (t - first) * kTile, mask, sum[r]);
  }
}

template <typename S>
void TilesWith(const Job& job, int64_t first, int64_t last, int64_t row0, int64_t rows,
               float* out, int64_t ld) {
  switch (rows) {
    case 1: TilesOf<1, S>(job, first, last, row0, out, ld); break;
    case 2: TilesOf<2, S>(job, first, last, row0, out, ld); break;
    case 3: TilesOf<3, S>(job, first, last, row0, out, ld); break;
    case 4: TilesOf<4, S>(job, first, last, row0, out, ld); break;
    case 5: TilesOf<5, S>(job, first, last, row0, out, ld); break;
    case 6: TilesOf<6, S>(job, first, last, row0, out, ld); break;
    case 7: TilesOf<7, S>(job, first, last, row0, out, ld); break;
    default: TilesOf<8, S>(job, first, last, row0, out, ld); break;
  }
}
#elif defined(EP_AVX2)
// AVX2 (Zen 1-3, Intel client CPUs): the same int32 sums, 8 columns to a register (the
// 32-byte halves of a 64-byte part). vpmaddubsw multiplies the unsigned nibbles by the
// int8 activations and adds neighbours into int16 lanes: at most 2 x 15 x 127 = 3810 in
// magnitude, and a block's 8 of those per lane (4 parts, low and high) at most 30480 <
// 32767, so no lane saturates. vpmaddwd by ones then adds each column's two int16 lanes
// into its int32 lane: VNNI's vpdpbusd sums exactly, hence its float32 arithmetic and bits.
inline __m256 Scales8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 Scales8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Block `block` of the tile whose block starts at w, for R rows: each column's int16 sums
// in dot[g][r] (lane c of register g is the tile's column 8 g + c, two lanes each).
template <int R>
inline void BlockDots(const uint8_t* w, const Row* rows, int64_t block, __m256i (&dot)[2][R]) {
  const __m256i nibble = _mm256_set1_epi8(0x0f);
  for (int g = 0; g < 2; ++g)
    for (int r = 0; r < R; ++r) dot[g][r] = _mm256_setzero_si256();
  for (int half = 0; half < 4; ++half)
    for (int g = 0; g < 2; ++g) {
      const __m256i packed =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + half * 64 + g * 32));
      const __m256i low = _mm256_and_si256(packed, nibble);
      const __m256i high = _mm256_and_si256(_mm256_srli_epi16(packed, 4), nibble);
      for (int r = 0; r < R; ++r) {
        const int32_t* quads = reinterpret_cast<const int32_t*>(rows[r].q.data() + block * kBlock);
        dot[g][r] = _mm256_add_epi16(dot[g][r], _mm256_maddubs_epi16(low, _mm256_set1_epi32(quads[2 * half])));
        dot[g][r] = _mm256_add_epi16(dot[g][r], _mm256_maddubs_epi16(high, _mm256_set1_epi32(quads[2 * half + 1])));
      }
    }
}

// A block's int16 sums into the float32 sums: each column's int32 sum less the zero
// points', times the row's scale, then fma'd with the column's scale (`scales`: the tile's
// 16 for this block).
template <int R, typename S>
inline void AddBlock(const __m256i (&dot)[2][R], const Row* rows, int64_t block, const S* scales,
                     __m256 (&sum)[2][R]) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int g = 0; g < 2; ++g) {
    const __m256 wscale = Scales8(scales + g * 8);
    for (int r = 0; r < R; ++r) {
      const __m256i dot32 = _mm256_madd_epi16(dot[g][r], ones);
      const __m256 value = _mm256_cvtepi32_ps(_mm256_sub_epi32(dot32, _mm256_set1_epi32(rows[r].offset[block])));
      sum[g][r] = _mm256_fmadd_ps(_mm256_mul_ps(value, _mm256_set1_ps(rows[r].scale[block])), wscale, sum[g][r]);
    }
  }
}

// Tile t's sums for R rows to `to` (row r at to + r * ld), its columns past N not written:
// they are not ours.
template <int R>
inline void StoreTile(const __m256 (&sum)[2][R], const Job& job, int64_t t, float* to, int64_t ld) {
  for (int g = 0; g < 2; ++g) {
    const int64_t columns = std::min<int64_t>(8, job.n - t * kTile - g * 8);
    for (int r = 0; r < R && columns > 0; ++r) {
      float* at = to + r * ld + g * 8;
      if (columns == 8) {
        _mm256_storeu_ps(at, sum[g][r]);
      } else {
        alignas(32) float lanes[8];
        _mm256_store_ps(lanes, sum[g][r]);
        std::memcpy(at, lanes, columns * sizeof(float));
      }
    }
  }
}

template <int R>
inline void ZeroSums(__m256 (&sum)[2][R]) {
  for (int g = 0; g < 2; ++g)
    for (int r = 0; r < R; ++r) sum[g][r] = _mm256_setzero_ps();
}

// Tiles [first, last) for R rows into `out` (as above), one tile after another.
template <int R, typename S>
void TilesOf(const Job& job, int64_t first, int64_t last, int64_t row0, float* out, int64_t ld) {
  const Row* rows = job.quantized->data() + row0;
  const S* scales = static_cast<const S*>(job.scales);
  for (int64_t t = first; t < last; ++t) {
    __m256 sum[2][R];
    ZeroSums(sum);
    for (int64_t block = 0; block < job.blocks; ++block) {
      __m256i dot[2][R];
      BlockDots<R>(job.b + (t * job.blocks + block) * kTileBytes, rows, block, dot);
      AddBlock<R, S>(dot, rows, block, scales + (t * job.blocks + block) * kTile, sum);
    }
    StoreTile<R>(sum, job, t, out + (t - first) * kTile, ld);
  }
}

// One row over kStreams tiles at once, block by block (tile[u]'s columns to dst[u]): the
// tiles lie far apart in the weight, so a core reads kStreams streams side by side. One
// Zen 3 core fetches a single stream at ~15-17 GB/s and four at ~25, and MatMulInt4 reads
// a decode row's weights 1.1-1.4x as fast this way as a tile at a time (one thread;
// docs/benchmarks.md, stop 60). The same sums in the same order as TilesOf<1>: the same
// bits.
constexpr int kStreams = 4;
template <typename S>
void StreamsOf(const Job& job, const int64_t (&tile)[kStreams], float* const (&dst)[kStreams]) {
  const Row* row = job.quantized->data();
  const S* scales = static_cast<const S*>(job.scales);
  __m256 sum[kStreams][2][1];
  for (int u = 0; u < kStreams; ++u) ZeroSums(sum[u]);
  for (int64_t block = 0; block < job.blocks; ++block)
    for (int u = 0; u < kStreams; ++u) {
      const int64_t at = tile[u] * job.blocks + block;
      __m256i dot[2][1];
      BlockDots<1>(job.b + at * kTileBytes, row, block, dot);
      AddBlock<1, S>(dot, row, block, scales + at * kTile, sum[u]);
    }
  for (int u = 0; u < kStreams; ++u) StoreTile<1>(sum[u], job, tile[u], dst[u], 0);
}

void Streams(const Job& job, const int64_t (&tile)[kStreams], float* const (&dst)[kStreams]) {
  if (job.half)
    StreamsOf<uint16_t>(job, tile, dst);
  else
    StreamsOf<float>(job, tile, dst);
}
#define EP_INT4_STREAMS 1  // RunRowPiece and RunGatedRowPiece below

// Up to 4 rows at once: 2 x 4 float sums and 2 x 4 int16 sums fill AVX2's 16 registers.
template <typename S>
void TilesWith(const Job& job, int64_t first, int64_t last, int64_t row0, int64_t rows,
               float* out, int64_t ld) {
  for (; rows > 0; row0 += 4, rows -= 4, out += 4 * ld) {
    switch (rows) {
      case 1: TilesOf<1, S>(job, first, last, row0, out, ld); break;
      case 2: TilesOf<2, S>(job, first, last, row0, out, ld); break;
      case 3: TilesOf<3, S>(job, first, last, row0, out, ld); break;
      default: TilesOf<4, S>(job, first, last, row0, out, ld); break;
    }
  }
}
#else
// The same sums, lane by lane: per column and block, the 4 bytes of each 64-byte part.
template <typename S>
void TilesWith(const Job& job, int64_t first, int64_t last, int64_t row0, int64_t rows,
               float* out, int64_t ld) {
  const S* scales = static_cast<const S*>(job.scales);
  for (int64_t r = row0; r < row0 + rows; ++r) {
    const Row& row = (*job.quantized)[r];
    for (int64_t t = first; t < last; ++t)
      for (int64_t c = 0; c < kTile && t * kTile + c < job.n; ++c) {
        float sum = 0.0f;
        for (int64_t block = 0; block < job.blocks; ++block) {
          const uint8_t* w = job.b + (t * job.blocks + block) * kTileBytes;
          const int8_t* q = row.q.data() + block * kBlock;
          int32_t dot = 0;
          for (int64_t half = 0; half < 4; ++half)
            for (int64_t i = 0; i < 4; ++i) {
              const uint8_t byte = w[half * 64 + c * 4 + i];
              dot += (byte & 0x0f) * q[8 * half + i] + (byte >> 4) * q[8 * half + 4 + i];
            }
          const float value = static_cast<float>(dot - row.offset[block]) * row.scale[block];
          sum += value * Scale(scales + (t * job.blocks + block) * kTile + c);
        }
        out[(r - row0) * ld + (t - first) * kTile + c] = sum;
      }
  }
}
#endif

// Tiles [first, last) of rows [row0, row0 + rows) into out (row r - row0 at out + (r - row0)
// ld, tile t's columns from 16 (t - first)).
void Tiles(const Job& job, int64_t first, int64_t last, int64_t row0, int64_t rows, float* out,
           int64_t ld) {
  if (job.half)
    TilesWith<uint16_t>(job, first, last, row0, rows, out, ld);
  else
    TilesWith<float>(job, first, last, row0, rows, out, ld);
}

void RunPiece(void* data, size_t index) {
  const Job& job = *static_cast<const Job*>(data);
  const int64_t first = static_cast<int64_t>(index) * kPiece;
  const int64_t last = std::min(job.tiles, first + kPiece);
  for (int64_t r = 0; r < job.rows; r += kRowsAtOnce)
    Tiles(job, first, last, r, std::min(kRowsAtOnce, job.rows - r),
          job.out + r * job.n + first * kTile, job.n);
}

#ifdef EP_INT4_STREAMS
// A call of one row (a decode step's, one session): piece i reads tiles i, i + Q, i + 2 Q,
// ... (Q = ceil(T / kStreams)) side by side where all kStreams are there, else each alone.
void RunRowPiece(void* data, size_t index) {
  const Job& job = *static_cast<const Job*>(data);
  const int64_t apart = (job.tiles + kStreams - 1) / kStreams, first = static_cast<int64_t>(index);
  if (first + (kStreams - 1) * apart < job.tiles) {
    int64_t tile[kStreams];
    float* dst[kStreams];
    for (int u = 0; u < kStreams; ++u) {
      tile[u] = first + u * apart;
      dst[u] = job.out + tile[u] * kTile;
    }
    Streams(job, tile, dst);
    return;
  }
  for (int64_t t = first; t < job.tiles; t += apart)
    Tiles(job, t, t + 1, 0, 1, job.out + t * kTile, job.n);
}

// The same with gated=1: piece i reads gate tiles i, i + Q, ... (Q = ceil(G / (kStreams /
// 2)), G = T / 2 gate tiles, a whole number of pieces since N is a multiple of 128) and their
// up tiles G further, then writes silu(gate) * up for those columns: swiglu.h's arithmetic
// on the same sums as GatedPiece's, the same bits.
void RunGatedRowPiece(void* data, size_t index) {
  const Job& job = *static_cast<const Job*>(data);
  constexpr int kGates = kStreams / 2;
  const int64_t gates = job.tiles / 2, apart = (gates + kGates - 1) / kGates;
  const int64_t first = static_cast<int64_t>(index);
  alignas(32) float gate[kGates * kTile], up[kGates * kTile];
  if (first + (kGates - 1) * apart < gates) {
    int64_t tile[kStreams];
    float* dst[kStreams];
    for (int u = 0; u < kGates; ++u) {
      tile[u] = first + u * apart;
      tile[kGates + u] = tile[u] + gates;
      dst[u] = gate + u * kTile;
      dst[kGates + u] = up + u * kTile;
    }
    Streams(job, tile, dst);
    for (int u = 0; u < kGates; ++u)
      SwiGluRow(gate + u * kTile, up + u * kTile, job.out + tile[u] * kTile, kTile);
    return;
  }
  for (int64_t t = first; t < gates; t += apart) {
    Tiles(job, t, t + 1, 0, 1, gate, kTile);
    Tiles(job, t + gates, t + gates + 1, 0, 1, up, kTile);
    SwiGluRow(gate, up, job.out + t * kTile, kTile);
  }
}
#endif

// gated=1: swiglu.h's GatedPiece, a panel being a piece's kPiece tiles (N a multiple of
// 128: whole pieces, no partial tile), a row block kRowsAtOnce rows.
constexpr int64_t kPieceColumns = kPiece * kTile;
void RunGatedPiece(void* data, size_t index) {
  const Job& job = *static_cast<const Job*>(data);
  GatedPiece<kPieceColumns, kRowsAtOnce>(
      index, job.rows, job.tiles / kPiece, job.out,
      [&job](int64_t first, int64_t rows, int64_t q, float* dst) {
        Tiles(job, q * kPiece, (q + 1) * kPiece, first, rows, dst, kPieceColumns);
      });
}

OrtStatus* Compute(void* state, OrtKernelContext* context) {
  const Kernel& kernel = *static_cast<Kernel*>(state);
  const int64_t k = kernel.k, n = kernel.columns.n;
  const bool gated = kernel.columns.gated;
  Tensor a, b, scales;
  EP_RETURN_IF_ERROR(Input(context, 0, &a));
  EP_RETURN_IF_ERROR(Input(context, 1, &b));
  EP_RETURN_IF_ERROR(Input(context, 2, &scales));
  const int64_t blocks = (k + kBlock - 1) / kBlock, tiles = (n + kTile - 1) / kTile;
  if (a.dims.empty() || a.dims.back() != k)
    return Fail(("MatMulInt4: expects activations [..., " + std::to_string(k) + "]").c_str());
  NormRows norm;
  EP_RETURN_IF_ERROR(NormInputs(context, kernel.columns, a, 3, "MatMulInt4", &norm));
  const bool half = scales.type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
  if (b.dims != std::vector<int64_t>{tiles, blocks, 4, 64} ||
      scales.dims != std::vector<int64_t>{tiles, blocks, kTile} ||
      !(half || scales.type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT))
    return Fail("MatMulInt4: the weights must be packed by int4_decode.py ([N/16, K/32, 4, 64] "
                "uint8, [N/16, K/32, 16] float or float16 scales)");
  float* out = nullptr;
  int64_t rows = 0;
  EP_RETURN_IF_ERROR(RowsOutput(context, a, gated ? n / 2 : n, &out, &rows));
  if (rows == 0) return nullptr;
  std::vector<Row> quantized(rows);
  std::vector<float> normed(norm.skip != nullptr ? k : 0);
  for (int64_t r = 0; r < rows; ++r)
    Quantize(NormedRow(norm, a.data, r, k, normed.data()), k, blocks, &quantized[r]);
  Job job{k, n, blocks, tiles, rows, reinterpret_cast<const uint8_t*>(b.data), scales.data,
          half, &quantized, out};
#ifdef EP_INT4_STREAMS
  if (rows == 1) {  // a decode step of one session: kStreams tiles side by side
    const int64_t width = gated ? kStreams / 2 : kStreams, tiles_read = gated ? tiles / 2 : tiles;
    ParallelFor(context, gated ? RunGatedRowPiece : RunRowPiece,
                static_cast<size_t>((tiles_read + width - 1) / width), &job);
    return nullptr;
  }
#endif
  const int64_t pieces = (tiles + kPiece - 1) / kPiece;
  ParallelFor(context, gated ? RunGatedPiece : RunPiece,
              static_cast<size_t>(gated ? (rows + kRowsAtOnce - 1) / kRowsAtOnce * (pieces / 2)
                                        : pieces),
              &job);
  return nullptr;
}

OrtStatus* CreateKernel(const OrtKernelInfo* info, void** kernel) {
  int64_t k = 0;
  EP_RETURN_IF_ERROR(g_api->KernelInfoGetAttribute_int64(info, "K", &k));
  if (k <= 0) return Fail("MatMulInt4: K must be positive");
  Columns columns;
  EP_RETURN_IF_ERROR(ReadColumns(info, "MatMulInt4", &columns));
  *kernel = new Kernel{k, columns};
  return nullptr;
}

void ORT_API_CALL DestroyKernel(void* kernel) { delete static_cast<Kernel*>(kernel); }

OrtStatus* ORT_API_CALL ComputeKernel(void* kernel, OrtKernelContext* context) {
  return Compute(kernel, context);
}

}  // namespace

const Op& MatMulInt4Op() {
  static const Op op = [] {
    // inputs: a, b (uint8), scales (float or float16), skip and gamma (optional, float);
    // outputs: out, sum (optional)
    OpSpec spec{"MatMulInt4", 5, 2, 0u, CreateKernel, ComputeKernel, DestroyKernel, 0b10u};
    spec.any_inputs = 0b100u;
    spec.optional_inputs = 0b11000u;
    spec.optional_outputs = 0b10u;
    return MakeOp(spec);
  }();
  return op;
}

}  // namespace edgeprefill
