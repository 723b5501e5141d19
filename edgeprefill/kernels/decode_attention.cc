// edgeprefill.DecodeAttention: grouped-query attention of ONE new token per row over a
// fixed-capacity KV cache, as an ONNX Runtime custom op (library.cc registers it).
//
// It computes what com.microsoft.GroupQueryAttention computes for a chunk of one token
// (packed q/k/v, rotary inside or none, cache written at each row's position), but
// reads each KV head once for its whole query group instead of once per query head, and
// splits every row's positions into pieces run on ONNX Runtime's intra-op pool (a
// flash-decoding style max/sum merge joins the pieces). With AVX-512 (or AVX2 + FMA) and a
// head size of 32, 64, 80, 96, 128, 256, 288 or 576 (the last two: multi-head latent
// attention, absorbed) a piece runs RunPieceAvx512 (RunPieceAvx2); on 64-bit Arm, any head
// size (a multiple of 16) runs RunPieceNeon; else the portable loops.
// The work is DecodeRows (decode_rows.h), which PrefillAttention runs for its rows of one
// valid token too; a row's split depends on its own length only, so its output is the same
// bits whichever rows share the call.
//
// Inputs:  0 qkv [B, 1, (H + 2 KV) * D] float   packed projection of the new token
//          1 past_key [B, KV, cap, D] float       the cache (bound in place)
//          2 past_value [B, KV, cap, D] float
//          3 positions [B] int32                  the new token's position = row's past length
//          4 cos [P, R / 2] float, 5 sin [P, R / 2] float   rotary tables (R <= D;
//                                               optional: neither is do_rotary=0)
//          6 head_sink [H] float (optional)     each head's sink logit (gpt-oss): it joins
//                                               the softmax's denominator (AddSink)
// Outputs: 0 out [B, 1, H * D] float, 1 present_key, 2 present_value (same shape as past;
//          when bound to the past buffers nothing is copied, else the past is copied first)
// Attributes: num_heads, kv_num_heads (int), scale (float), local_window_size (int,
//          optional: GroupQueryAttention's sliding window, FirstKey in kernel_common.h; a
//          row then reads only the window's keys), softcap (float, optional: each scaled
//          score -> softcap tanh(score / softcap), soft_cap.h), rotary_interleaved (int,
//          optional: 1 rotates pairs (2i, 2i + 1), not halves: Rotate in kernel_common.h).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "decode_rows.h"
#include "kernel_common.h"
#include "soft_cap.h"

namespace edgeprefill {
namespace {

constexpr int kLanes = 16;  // accumulators per dot product: one AVX-512 register, two AVX2
constexpr int64_t kMinPiece = 128;  // positions per parallel piece, at least
constexpr int64_t kTargetPieces = 16;  // pieces per row to aim for (load balance)

// A cache element as float32: a float, or bf16 bits.
inline float Scalar(const float* p) { return *p; }
inline float Scalar(const uint16_t* p) { return FromBf16(*p); }

template <typename T>
inline float Dot(const float* a, const T* b, int64_t n) {
  float acc[kLanes] = {};
  for (int64_t i = 0; i < n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += a[i + l] * Scalar(b + i + l);
  for (int width = kLanes / 2; width > 0; width /= 2)
    for (int l = 0; l < width; ++l) acc[l] += acc[l + width];
  return acc[0];
}

#ifdef __AVX512F__
// The widest head (16 * C) whose query the key pass keeps in C registers beside 16 sums: up
// to 256. Wider (MLA's 288 and 576) it loads the query a vector at a time.
constexpr int kQueryInRegisters = 16;

// 16 cache elements as float32.
inline __m512 Load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 Load16(const uint16_t* p) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

// q . key over head_dim = 16 * C, left as 16 partial sums.
template <int C, typename T>
inline __m512 Dot16(const __m512* query, const T* key) {
  __m512 acc = _mm512_mul_ps(query[0], Load16(key));
  for (int c = 1; c < C; ++c) acc = _mm512_fmadd_ps(query[c], Load16(key + 16 * c), acc);
  return acc;
}

// Lane k of the result = the sum of acc[k]'s 16 lanes: 15 shuffle-adds for 16 sums instead
// of a 4-step reduction each. Each step halves the vectors and the partials per key.
inline __m512 SumLanes16(const __m512* acc) {
  __m512 b[8], c[4], e[2];
  for (int k = 0; k < 8; ++k)  // 256-bit halves: 8 partials per key, two keys per vector
    b[k] = _mm512_add_ps(_mm512_shuffle_f32x4(acc[2 * k], acc[2 * k + 1], 0x44),
                         _mm512_shuffle_f32x4(acc[2 * k], acc[2 * k + 1], 0xEE));
  for (int k = 0; k < 4; ++k)  // 128-bit blocks: 4 partials, block i of c[k] = key 4k + i
    c[k] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * k], b[2 * k + 1], 0x88),
                         _mm512_shuffle_f32x4(b[2 * k], b[2 * k + 1], 0xDD));
  for (int k = 0; k < 2; ++k)  // inside blocks: 2 partials
    e[k] = _mm512_add_ps(_mm512_shuffle_ps(c[2 * k], c[2 * k + 1], 0x44),
                         _mm512_shuffle_ps(c[2 * k], c[2 * k + 1], 0xEE));
  const __m512 sums = _mm512_add_ps(_mm512_shuffle_ps(e[0], e[1], 0x88),
                                    _mm512_shuffle_ps(e[0], e[1], 0xDD));
  // Lane 4i + m now holds key 4m + i: transpose the 4 x 4 layout back.
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(order, sums);
}
#endif

#ifdef EP_AVX2
// 8 cache elements as float32.
inline __m256 Load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 Load8(const uint16_t* p) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}

// Lane k of the result = the sum of acc[k]'s 8 lanes (SumLanes16's idea, 8 keys).
inline __m256 SumLanes8(const __m256* acc) {
  const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]), _mm256_hadd_ps(acc[2], acc[3]));
  const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(acc[4], acc[5]), _mm256_hadd_ps(acc[6], acc[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

#endif

#ifdef EP_NEON
// 4 cache elements as float32.
inline float32x4_t Load4(const float* p) { return vld1q_f32(p); }
inline float32x4_t Load4(const uint16_t* p) {
  return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16));
}

// Lane k of the result = the sum of acc[k]'s 4 lanes (SumLanes8's idea, 4 keys).
inline float32x4_t SumLanes4(const float32x4_t* acc) {
  return vpaddq_f32(vpaddq_f32(acc[0], acc[1]), vpaddq_f32(acc[2], acc[3]));
}
#endif

// The value pass's vectors per sweep for head_dim = 8 * C (AVX2) or 16 * C (AVX-512's
// heads wider than 256): at most 8 accumulators (with two chains below 8, as an FMA's
// latency is 4 cycles), a divisor of C.
constexpr int ValuePass(int c) { return c <= 8 ? c : c % 8 == 0 ? 8 : c % 6 == 0 ? 6 : 5; }

}  // namespace

DecodeRows::DecodeRows(const Layout& layout, const float* qkv, std::vector<int64_t> rows,
                       std::vector<int64_t> tokens, std::vector<int64_t> positions, Cache cache,
                       const float* cos, const float* sin)
    : layout_(layout), rows_(std::move(rows)), tokens_(std::move(tokens)),
      positions_(std::move(positions)), cache_(cache) {
  const Layout& s = layout_;
  const int64_t d = s.head_dim, heads = s.heads, half = s.rotary / 2;
  const int64_t width = (heads + 2 * s.kv_heads) * d;
  const int64_t group = heads / s.kv_heads;
  // Rotate q and the new k, write k and v at each row's position.
  q_.resize(rows_.size() * heads * d);
  std::vector<float> rotated(d);
  for (size_t i = 0; i < rows_.size(); ++i) {
    const int64_t row = rows_[i], position = positions_[i];
    const float* packed = qkv + tokens_[i] * width;
    const float* c = cos + position * half;
    const float* n = sin + position * half;
    for (int64_t h = 0; h < heads; ++h)
      Rotate(packed + h * d, q_.data() + (i * heads + h) * d, c, n, d, s.rotary, s.interleaved);
    for (int64_t kv = 0; kv < s.kv_heads; ++kv) {
      const int64_t at = ((row * s.kv_heads + kv) * s.capacity + position) * d;
      WriteKeyValue(cache, at, packed + (heads + kv) * d, packed + (heads + s.kv_heads + kv) * d,
                    c, n, d, s.rotary, s.interleaved, rotated.data());
    }
  }
  // Each (row, KV head) split over its positions so that the pool has enough pieces. The
  // split depends on the row's own length only, not on the other rows of the call: the
  // pieces' sums are merged in their order, so a row's output is the same bits in any call.
  const int64_t wanted = std::max<int64_t>(1, (kTargetPieces + s.kv_heads - 1) / s.kv_heads);
  for (size_t i = 0; i < rows_.size(); ++i) {
    const int64_t start = FirstKey(positions_[i], s.window), end = positions_[i] + 1;
    const int64_t length = end - start;
    const int64_t count = std::max<int64_t>(1, std::min(wanted, length / kMinPiece));
    const int64_t step = (length + count - 1) / count;
    for (int64_t kv = 0; kv < s.kv_heads; ++kv)
      for (int64_t begin = start; begin < end; begin += step)
        pieces_.push_back({static_cast<int64_t>(i), kv, begin, std::min(end, begin + step)});
  }
  for (const Piece& piece : pieces_) longest_ = std::max(longest_, piece.end - piece.begin);
  scores_.resize(pieces_.size() * group * longest_);
  partial_.resize(pieces_.size() * group * (d + 2));
}

template <typename T>
DecodeRows::PieceView<T> DecodeRows::View(size_t index) {
  const Layout& s = layout_;
  const Piece& piece = pieces_[index];
  const int64_t d = s.head_dim, g = s.heads / s.kv_heads;
  const int64_t at = ((rows_[piece.slot] * s.kv_heads + piece.kv) * s.capacity + piece.begin) * d;
  return {static_cast<const T*>(cache_.keys) + at, static_cast<const T*>(cache_.values) + at,
          q_.data() + (piece.slot * s.heads + piece.kv * g) * d,
          scores_.data() + index * g * longest_, partial_.data() + index * g * (d + 2), g,
          piece.end - piece.begin};
}

// Each query head's n scores of a piece (rows of scores_, longest_ apart) soft-capped,
// where the layer caps them (Gemma 2), before their softmax.
void DecodeRows::CapScores(float* scores, int64_t group, int64_t n) const {
  if (layout_.softcap <= 0.0f) return;
  for (int64_t h = 0; h < group; ++h) SoftCap(scores + h * longest_, n, layout_.softcap);
}

// Each query head's n scores (rows of scores_) -> their exponentials less the max, one by
// one, and its row of partial_ set to zeros, the max and the sum of the exponentials.
void DecodeRows::Softmax(float* scores, float* partial, int64_t group, int64_t n) const {
  const int64_t d = layout_.head_dim;
  for (int64_t h = 0; h < group; ++h) {
    float* row = scores + h * longest_;
    float top = row[0];
    for (int64_t j = 1; j < n; ++j) top = std::max(top, row[j]);
    float sum = 0.0f;
    for (int64_t j = 0; j < n; ++j) {
      row[j] = ExpNonPositive(row[j] - top);
      sum += row[j];
    }
    float* acc = partial + h * (d + 2);
    std::fill(acc, acc + d, 0.0f);
    acc[d] = top;
    acc[d + 1] = sum;
  }
}

// One parallel piece: a KV head of a row over positions [begin, end). It leaves, per query
// head of the group, the running max, the sum of exponentials and the unnormalized output.
template <typename T>
void DecodeRows::RunPiecePortable(size_t index) {
  const Layout& s = layout_;
  const int64_t d = s.head_dim;
  const auto [keys, values, q, scores, out, g, n] = View<T>(index);
  for (int64_t j = 0; j < n; ++j) {  // each key row is read once for the whole group
    const T* key = keys + j * d;
    for (int64_t h = 0; h < g; ++h) scores[h * longest_ + j] = Dot(q + h * d, key, d) * s.scale;
  }
  CapScores(scores, g, n);
  Softmax(scores, out, g, n);
  for (int64_t j = 0; j < n; ++j) {  // each value row is read once for the whole group
    const T* value = values + j * d;
    for (int64_t h = 0; h < g; ++h) {
      const float weight = scores[h * longest_ + j];
      float* acc = out + h * (d + 2);
      for (int64_t k = 0; k < d; ++k) acc[k] += weight * Scalar(value + k);
    }
  }
}

#ifdef __AVX512F__
// The same piece with head_dim = 16 * C. Keys and values are read in blocks of 16 rows that
// every query head of the group uses while the block is in L1: the piece's rows come from
// L2 or memory once, not once per head. The portable loops above ran ~3x slower here (gcc
// kept each dot product's 16 partial sums on the stack; the value loop had a run-time length).
template <int C, typename T>
void DecodeRows::RunPieceAvx512(size_t index) {
  const Layout& s = layout_;
  const int64_t d = 16 * C, stride = longest_;  // d: the head_dim RunPiece dispatched on
  const auto [keys, values, q, scores, partial, g, n] = View<T>(index);
  const __m512 scale = _mm512_set1_ps(s.scale);

  int64_t j = 0;
  for (; j + 16 <= n; j += 16)
    for (int64_t h = 0; h < g; ++h) {
      __m512 acc[16];
      if constexpr (C <= kQueryInRegisters) {
        __m512 query[C];
        for (int c = 0; c < C; ++c) query[c] = _mm512_loadu_ps(q + h * d + 16 * c);
        for (int k = 0; k < 16; ++k) acc[k] = Dot16<C>(query, keys + (j + k) * d);
      } else {  // the query a vector at a time: 16 sums + 1, no spills (RunPieceAvx2's order)
        const __m512 first = _mm512_loadu_ps(q + h * d);
        for (int k = 0; k < 16; ++k) acc[k] = _mm512_mul_ps(first, Load16(keys + (j + k) * d));
        for (int c = 1; c < C; ++c) {
          const __m512 query = _mm512_loadu_ps(q + h * d + 16 * c);
          for (int k = 0; k < 16; ++k)
            acc[k] = _mm512_fmadd_ps(query, Load16(keys + (j + k) * d + 16 * c), acc[k]);
        }
      }
      _mm512_storeu_ps(scores + h * stride + j, _mm512_mul_ps(SumLanes16(acc), scale));
    }
  for (; j < n; ++j)
    for (int64_t h = 0; h < g; ++h) {
      __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(q + h * d), Load16(keys + j * d));
      for (int c = 1; c < C; ++c)
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + h * d + 16 * c), Load16(keys + j * d + 16 * c), acc);
      scores[h * stride + j] = _mm512_reduce_add_ps(acc) * s.scale;
    }
  CapScores(scores, g, n);

  for (int64_t h = 0; h < g; ++h) {  // softmax of each head's scores over the piece
    float* row = scores + h * stride;
    __m512 top16 = _mm512_set1_ps(-INFINITY);
    for (j = 0; j + 16 <= n; j += 16) top16 = _mm512_max_ps(top16, _mm512_loadu_ps(row + j));
    const __mmask16 tail = static_cast<__mmask16>((1u << (n - j)) - 1u);
    top16 = _mm512_mask_max_ps(top16, tail, top16, _mm512_maskz_loadu_ps(tail, row + j));
    const float top = _mm512_reduce_max_ps(top16);
    const __m512 top_v = _mm512_set1_ps(top);
    __m512 sum16 = _mm512_setzero_ps();
    for (j = 0; j + 16 <= n; j += 16) {
      const __m512 e = ExpNonPositive16(_mm512_sub_ps(_mm512_loadu_ps(row + j), top_v));
      _mm512_storeu_ps(row + j, e);
      sum16 = _mm512_add_ps(sum16, e);
    }
    const __m512 e = ExpNonPositive16(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, row + j), top_v));
    _mm512_mask_storeu_ps(row + j, tail, e);
    sum16 = _mm512_add_ps(sum16, _mm512_maskz_mov_ps(tail, e));
    float* out = partial + h * (d + 2);
    std::fill(out, out + d, 0.0f);
    out[d] = top;
    out[d + 1] = _mm512_reduce_add_ps(sum16);
  }

  // Heads up to 256 wide sweep all C vectors at once, wider ones ValuePass(C) at a time
  // (2 C accumulators would spill: 72 at 576).
  constexpr int kPass = C <= kQueryInRegisters ? C : ValuePass(C);
  for (j = 0; j < n; j += 16) {
    const int64_t m = std::min<int64_t>(16, n - j);
    const T* block = values + j * d;
    for (int64_t h = 0; h < g; ++h) {
      const float* weights = scores + h * stride + j;
      float* out = partial + h * (d + 2);
      for (int c0 = 0; c0 < C; c0 += kPass) {
        __m512 even[kPass], odd[kPass];  // two chains: an FMA's latency is 4 cycles
        for (int c = 0; c < kPass; ++c) {
          even[c] = _mm512_loadu_ps(out + 16 * (c0 + c));
          odd[c] = _mm512_setzero_ps();
        }
        int64_t k = 0;
        for (; k + 2 <= m; k += 2) {
          const __m512 w0 = _mm512_set1_ps(weights[k]), w1 = _mm512_set1_ps(weights[k + 1]);
          for (int c = 0; c < kPass; ++c) {
            even[c] = _mm512_fmadd_ps(w0, Load16(block + k * d + 16 * (c0 + c)), even[c]);
            odd[c] = _mm512_fmadd_ps(w1, Load16(block + (k + 1) * d + 16 * (c0 + c)), odd[c]);
          }
        }
        if (k < m) {
          const __m512 w0 = _mm512_set1_ps(weights[k]);
          for (int c = 0; c < kPass; ++c)
            even[c] = _mm512_fmadd_ps(w0, Load16(block + k * d + 16 * (c0 + c)), even[c]);
        }
        for (int c = 0; c < kPass; ++c)
          _mm512_storeu_ps(out + 16 * (c0 + c), _mm512_add_ps(even[c], odd[c]));
      }
    }
  }
}
#endif

#ifdef EP_AVX2
// RunPieceAvx512 with AVX2 + FMA, head_dim = 8 * C: keys 8 at a time (each key's dot
// product 8 partial sums, C fmas in order), the values in sweeps of ValuePass(C) vectors.
template <int C, typename T>
void DecodeRows::RunPieceAvx2(size_t index) {
  const Layout& s = layout_;
  const int64_t d = 8 * C, stride = longest_;  // d: the head_dim RunPiece dispatched on
  const auto [keys, values, q, scores, partial, g, n] = View<T>(index);
  const __m256 scale = _mm256_set1_ps(s.scale);

  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int64_t h = 0; h < g; ++h) {
      __m256 acc[8];
      const __m256 first = _mm256_loadu_ps(q + h * d);
      for (int k = 0; k < 8; ++k) acc[k] = _mm256_mul_ps(first, Load8(keys + (j + k) * d));
      for (int c = 1; c < C; ++c) {
        const __m256 query = _mm256_loadu_ps(q + h * d + 8 * c);
        for (int k = 0; k < 8; ++k)
          acc[k] = _mm256_fmadd_ps(query, Load8(keys + (j + k) * d + 8 * c), acc[k]);
      }
      _mm256_storeu_ps(scores + h * stride + j, _mm256_mul_ps(SumLanes8(acc), scale));
    }
  for (; j < n; ++j)
    for (int64_t h = 0; h < g; ++h) {
      __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(q + h * d), Load8(keys + j * d));
      for (int c = 1; c < C; ++c)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * d + 8 * c), Load8(keys + j * d + 8 * c), acc);
      scores[h * stride + j] = SumLanes(acc) * s.scale;
    }
  CapScores(scores, g, n);

  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int64_t h = 0; h < g; ++h) {  // softmax of each head's scores over the piece
    float* row = scores + h * stride;
    __m256 top8 = _mm256_set1_ps(-INFINITY);
    for (j = 0; j + 8 <= n; j += 8) top8 = _mm256_max_ps(top8, _mm256_loadu_ps(row + j));
    const __m256i tail = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n - j)), lane);
    const __m256 last = _mm256_maskload_ps(row + j, tail);
    top8 = _mm256_max_ps(top8, _mm256_blendv_ps(top8, last, _mm256_castsi256_ps(tail)));
    __m128 top4 = _mm_max_ps(_mm256_castps256_ps128(top8), _mm256_extractf128_ps(top8, 1));
    top4 = _mm_max_ps(top4, _mm_movehl_ps(top4, top4));
    const float top = _mm_cvtss_f32(_mm_max_ss(top4, _mm_movehdup_ps(top4)));
    const __m256 top_v = _mm256_set1_ps(top);
    __m256 sum8 = _mm256_setzero_ps();
    for (j = 0; j + 8 <= n; j += 8) {
      const __m256 e = ExpNonPositive8(_mm256_sub_ps(_mm256_loadu_ps(row + j), top_v));
      _mm256_storeu_ps(row + j, e);
      sum8 = _mm256_add_ps(sum8, e);
    }
    const __m256 e = _mm256_and_ps(_mm256_castsi256_ps(tail),
                                   ExpNonPositive8(_mm256_sub_ps(last, top_v)));
    _mm256_maskstore_ps(row + j, tail, e);
    sum8 = _mm256_add_ps(sum8, e);
    float* out = partial + h * (d + 2);
    std::fill(out, out + d, 0.0f);
    out[d] = top;
    out[d + 1] = SumLanes(sum8);
  }

  constexpr int kPass = ValuePass(C);
  constexpr bool kTwoChains = kPass < 8;
  for (j = 0; j < n; j += 8) {
    const int64_t m = std::min<int64_t>(8, n - j);
    const T* block = values + j * d;
    for (int64_t h = 0; h < g; ++h) {
      const float* weights = scores + h * stride + j;
      float* out = partial + h * (d + 2);
      for (int c0 = 0; c0 < C; c0 += kPass) {
        __m256 even[kPass], odd[kPass];
        for (int c = 0; c < kPass; ++c) {
          even[c] = _mm256_loadu_ps(out + 8 * (c0 + c));
          odd[c] = _mm256_setzero_ps();
        }
        int64_t k = 0;
        for (; kTwoChains && k + 2 <= m; k += 2) {
          const __m256 w0 = _mm256_set1_ps(weights[k]), w1 = _mm256_set1_ps(weights[k + 1]);
          for (int c = 0; c < kPass; ++c) {
            even[c] = _mm256_fmadd_ps(w0, Load8(block + k * d + 8 * (c0 + c)), even[c]);
            odd[c] = _mm256_fmadd_ps(w1, Load8(block + (k + 1) * d + 8 * (c0 + c)), odd[c]);
          }
        }
        for (; k < m; ++k) {
          const __m256 w0 = _mm256_set1_ps(weights[k]);
          for (int c = 0; c < kPass; ++c)
            even[c] = _mm256_fmadd_ps(w0, Load8(block + k * d + 8 * (c0 + c)), even[c]);
        }
        for (int c = 0; c < kPass; ++c)
          _mm256_storeu_ps(out + 8 * (c0 + c), kTwoChains ? _mm256_add_ps(even[c], odd[c]) : even[c]);
      }
    }
  }
}

template <int C>
void DecodeRows::DispatchAvx2(size_t index) {
  if (cache_.bf16)
    RunPieceAvx2<C, uint16_t>(index);
  else
    RunPieceAvx2<C, float>(index);
}
#endif

#ifdef EP_NEON
// RunPieceAvx2's two passes with NEON (64-bit Arm), head_dim a multiple of 16 read at run
// time: keys 8 at a time (8 dot products of 4 partial sums each, 8 independent FMA chains),
// values in sweeps of 16 floats with two chains. The softmax between them is the portable
// one. The sums run in another order than RunPiecePortable's 16 lanes: the same numbers to
// float32 rounding, not the same bits (as RunPieceAvx2's).
template <typename T>
void DecodeRows::RunPieceNeon(size_t index) {
  const Layout& s = layout_;
  const int64_t d = s.head_dim, stride = longest_;
  const auto [keys, values, q, scores, partial, g, n] = View<T>(index);
  const float32x4_t scale = vdupq_n_f32(s.scale);

  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int64_t h = 0; h < g; ++h) {
      const float* query = q + h * d;
      float32x4_t acc[8];
      const float32x4_t first = vld1q_f32(query);
      for (int k = 0; k < 8; ++k) acc[k] = vmulq_f32(first, Load4(keys + (j + k) * d));
      for (int64_t c = 4; c < d; c += 4) {
        const float32x4_t x = vld1q_f32(query + c);
        for (int k = 0; k < 8; ++k) acc[k] = vfmaq_f32(acc[k], x, Load4(keys + (j + k) * d + c));
      }
      vst1q_f32(scores + h * stride + j, vmulq_f32(SumLanes4(acc), scale));
      vst1q_f32(scores + h * stride + j + 4, vmulq_f32(SumLanes4(acc + 4), scale));
    }
  for (; j < n; ++j)
    for (int64_t h = 0; h < g; ++h) {
      float32x4_t acc = vmulq_f32(vld1q_f32(q + h * d), Load4(keys + j * d));
      for (int64_t c = 4; c < d; c += 4)
        acc = vfmaq_f32(acc, vld1q_f32(q + h * d + c), Load4(keys + j * d + c));
      scores[h * stride + j] = vaddvq_f32(acc) * s.scale;
    }
  CapScores(scores, g, n);
  Softmax(scores, partial, g, n);

  for (j = 0; j < n; j += 8) {  // 8 value rows at a time, used by every head of the group
    const int64_t m = std::min<int64_t>(8, n - j);
    const T* block = values + j * d;
    for (int64_t h = 0; h < g; ++h) {
      const float* weights = scores + h * stride + j;
      float* out = partial + h * (d + 2);
      for (int64_t c0 = 0; c0 < d; c0 += 16) {
        float32x4_t even[4], odd[4];  // two chains over the rows: an FMA's latency
        for (int c = 0; c < 4; ++c) {
          even[c] = vld1q_f32(out + c0 + 4 * c);
          odd[c] = vdupq_n_f32(0.0f);
        }
        int64_t k = 0;
        for (; k + 2 <= m; k += 2)
          for (int c = 0; c < 4; ++c) {
            even[c] = vfmaq_n_f32(even[c], Load4(block + k * d + c0 + 4 * c), weights[k]);
            odd[c] = vfmaq_n_f32(odd[c], Load4(block + (k + 1) * d + c0 + 4 * c), weights[k + 1]);
          }
        if (k < m)
          for (int c = 0; c < 4; ++c)
            even[c] = vfmaq_n_f32(even[c], Load4(block + k * d + c0 + 4 * c), weights[k]);
        for (int c = 0; c < 4; ++c) vst1q_f32(out + c0 + 4 * c, vaddq_f32(even[c], odd[c]));
      }
    }
  }
}
#endif

#ifdef __AVX512F__
template <int C>
void DecodeRows::DispatchAvx512(size_t index) {
  if (cache_.bf16)
    RunPieceAvx512<C, uint16_t>(index);
  else
    RunPieceAvx512<C, float>(index);
}
#endif

void DecodeRows::RunPiece(size_t index) {
#ifdef __AVX512F__
  switch (layout_.head_dim) {  // the head sizes of the model families edgeprefill exports
    case 32: return DispatchAvx512<2>(index);
    case 64: return DispatchAvx512<4>(index);
    case 80: return DispatchAvx512<5>(index);
    case 96: return DispatchAvx512<6>(index);
    case 128: return DispatchAvx512<8>(index);
    case 256: return DispatchAvx512<16>(index);
    case 288: return DispatchAvx512<18>(index);  // MLA absorbed: MiniCPM3 (32 + 256)
    case 576: return DispatchAvx512<36>(index);  // DeepSeek-V2/V3, Youtu, GLM-4.7-Flash (64 + 512)
    default: break;
  }
#elif defined(EP_AVX2)
  switch (layout_.head_dim) {
    case 32: return DispatchAvx2<4>(index);
    case 64: return DispatchAvx2<8>(index);
    case 80: return DispatchAvx2<10>(index);
    case 96: return DispatchAvx2<12>(index);
    case 128: return DispatchAvx2<16>(index);
    case 256: return DispatchAvx2<32>(index);
    case 288: return DispatchAvx2<36>(index);
    case 576: return DispatchAvx2<72>(index);
    default: break;
  }
#elif defined(EP_NEON)
  if (layout_.head_dim % 16 == 0)  // every head both ops accept (their CheckShapes)
    return cache_.bf16 ? RunPieceNeon<uint16_t>(index) : RunPieceNeon<float>(index);
#endif
  if (cache_.bf16)
    RunPiecePortable<uint16_t>(index);
  else
    RunPiecePortable<float>(index);
}

// Merges the pieces of each query head: out = sum_p e^(m_p - M) acc_p / sum_p e^(m_p - M) l_p.
void DecodeRows::Finish(float* out, bool by_row) const {
  const Layout& s = layout_;
  const int64_t d = s.head_dim, g = s.heads / s.kv_heads, heads = s.heads;
  const size_t slots = rows_.size();
  std::vector<float> top(slots * heads, -INFINITY);
  std::vector<float> total(slots * heads, 0.0f);
  std::vector<float> sum(slots * heads * d, 0.0f);
  for (size_t i = 0; i < pieces_.size(); ++i)
    for (int64_t h = 0; h < g; ++h) {
      const int64_t at = pieces_[i].slot * heads + pieces_[i].kv * g + h;
      top[at] = std::max(top[at], partial_[(i * g + h) * (d + 2) + d]);
    }
  for (size_t i = 0; i < pieces_.size(); ++i)
    for (int64_t h = 0; h < g; ++h) {
      const int64_t at = pieces_[i].slot * heads + pieces_[i].kv * g + h;
      const float* acc = partial_.data() + (i * g + h) * (d + 2);
      const float weight = std::exp(acc[d] - top[at]);
      total[at] += weight * acc[d + 1];
      for (int64_t k = 0; k < d; ++k) sum[at * d + k] += weight * acc[k];
    }
  for (size_t slot = 0; slot < slots; ++slot) {
    float* row = out + (by_row ? rows_[slot] : tokens_[slot]) * heads * d;
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t at = slot * heads + h;
      const float denominator = AddSink(total[at], top[at], s.sink, h);
      for (int64_t k = 0; k < d; ++k) row[h * d + k] = sum[at * d + k] / denominator;
    }
  }
}

namespace {

void RunDecodePiece(void* data, size_t index) { static_cast<DecodeRows*>(data)->RunPiece(index); }

struct Shape {
  int64_t rows, kv_heads, capacity, head_dim, group;
};

OrtStatus* CheckShapes(const Kernel& kernel, const Tensor& qkv, const Tensor& past_k,
                       const Tensor& past_v, const Tensor& positions, Shape* shape) {
  if (qkv.dims.size() != 3 || qkv.dims[1] != 1)
    return Fail("DecodeAttention: qkv must be [rows, 1, (heads + 2 kv_heads) * head_dim]");
  if (past_k.dims.size() != 4 || past_k.dims != past_v.dims)
    return Fail("DecodeAttention: past key and value must both be [rows, kv_heads, capacity, head_dim]");
  const int64_t d = past_k.dims[3];
  if (past_k.dims[0] != qkv.dims[0] || past_k.dims[1] != kernel.kv_heads ||
      qkv.dims[2] != (kernel.heads + 2 * kernel.kv_heads) * d)
    return Fail("DecodeAttention: qkv and the cache disagree on rows, heads or head_dim");
  if (d % kLanes != 0 || kernel.heads % kernel.kv_heads != 0)
    return Fail("DecodeAttention: head_dim must be a multiple of 16 and heads of kv_heads");
  if (positions.dims.size() != 1 || positions.dims[0] != qkv.dims[0])
    return Fail("DecodeAttention: positions must be [rows]");
  *shape = {qkv.dims[0], kernel.kv_heads, past_k.dims[2], d, kernel.heads / kernel.kv_heads};
  return nullptr;
}

OrtStatus* Compute(const Kernel& kernel, OrtKernelContext* context) {
  Tensor qkv, past_k, past_v, positions_t;
  EP_RETURN_IF_ERROR(Input(context, 0, &qkv));
  EP_RETURN_IF_ERROR(Input(context, 1, &past_k));
  EP_RETURN_IF_ERROR(Input(context, 2, &past_v));
  EP_RETURN_IF_ERROR(Input(context, 3, &positions_t));
  Shape s;
  EP_RETURN_IF_ERROR(CheckShapes(kernel, qkv, past_k, past_v, positions_t, &s));
  RotaryTables rotary;
  EP_RETURN_IF_ERROR(RotaryInputs(context, 4, s.head_dim, "DecodeAttention", &rotary));
  const float* sink = nullptr;
  EP_RETURN_IF_ERROR(SinkInput(context, 6, kernel.heads, "DecodeAttention", &sink));
  const int32_t* positions = reinterpret_cast<const int32_t*>(positions_t.data);
  for (int64_t row = 0; row < s.rows; ++row)
    if (positions[row] < 0 || positions[row] >= s.capacity || positions[row] >= rotary.positions)
      return Fail("DecodeAttention: a row's position is outside the cache or the rotary table");

  const int64_t d = s.head_dim, heads = kernel.heads;
  float *out = nullptr, *keys = nullptr, *values = nullptr;
  EP_RETURN_IF_ERROR(Output(context, 0, {s.rows, 1, heads * d}, &out));
  EP_RETURN_IF_ERROR(Output(context, 1, past_k.dims, &keys));
  EP_RETURN_IF_ERROR(Output(context, 2, past_v.dims, &values));
  const size_t cache_floats = static_cast<size_t>(s.rows * s.kv_heads * s.capacity * d);
  if (keys != past_k.data) std::memcpy(keys, past_k.data, cache_floats * sizeof(float));
  if (values != past_v.data) std::memcpy(values, past_v.data, cache_floats * sizeof(float));

  std::vector<int64_t> rows(s.rows), at(positions, positions + s.rows);
  for (int64_t row = 0; row < s.rows; ++row) rows[row] = row;  // row r's token is token r
  DecodeRows work({heads, s.kv_heads, s.capacity, d, rotary.rotary, kernel.scale, kernel.window,
                   kernel.softcap, sink, kernel.interleaved},
                  qkv.data, rows, rows, std::move(at), {keys, values, false}, rotary.cos, rotary.sin);
  ParallelFor(context, RunDecodePiece, work.Pieces(), &work);
  work.Finish(out);
  return nullptr;
}

OrtStatus* CreateKernel(const OrtKernelInfo* info, void** kernel) {
  EP_RETURN_IF_ERROR(CreateAttentionKernel(info, "DecodeAttention", kernel));
  const Kernel& made = *static_cast<Kernel*>(*kernel);
  if (made.packed || made.last) {  // its output is [B, 1, H * D], one row per sequence
    delete static_cast<Kernel*>(*kernel);
    *kernel = nullptr;
    return Fail("DecodeAttention: packed and last are PrefillAttention's attributes");
  }
  return nullptr;
}

OrtStatus* ORT_API_CALL ComputeKernel(void* kernel, OrtKernelContext* context) {
  return Compute(*static_cast<Kernel*>(kernel), context);
}

void ORT_API_CALL DestroyKernel(void* kernel) { delete static_cast<Kernel*>(kernel); }

}  // namespace

const Op& DecodeAttentionOp() {
  OpSpec spec{"DecodeAttention", 7, 3, 1u << 3, CreateKernel, ComputeKernel, DestroyKernel};
  // No rotary tables: do_rotary=0; no head_sink: no attention sinks.
  spec.optional_inputs = (1u << 4) | (1u << 5) | (1u << 6);
  static const Op op = MakeOp(spec);
  return op;
}

}  // namespace edgeprefill
