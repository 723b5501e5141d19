// edgeprefill.PrefillAttention: causal grouped-query attention of a chunk of tokens per row
// over a fixed-capacity KV cache, flash-attention style (library.cc registers it).
//
// It computes what com.microsoft.GroupQueryAttention computes for a chunk of S > 1 tokens
// (packed q/k/v, rotary inside or none, the chunk's keys and values written into the
// cache at the row's past length) without the S x total score matrix GroupQueryAttention
// writes out per query head: one piece of work is a block of queries of ALL query heads of
// one KV group, which walks the keys block by block (a key block is read once for the whole
// group), keeps a running max and sum per query (online softmax), and stops at the causal
// diagonal. Pieces (row, KV head, query block) run on ONNX Runtime's intra-op pool, one KV
// head after another, the longest first within it. The inner products are register-blocked
// AVX-512 with the (query, head) pairs as vector lanes (AVX2 + FMA where the build has no
// AVX-512, else a portable loop nest).
//
// A row's past length is GroupQueryAttention's: 0 when total_sequence_length == S (a first
// prompt; the row's valid tokens are its first seqlens_k + 1, the rest padding whose output
// is never used), else seqlens_k + 1 - S. Unlike GroupQueryAttention, rows with different
// past lengths may share one call.
//
// Inputs:  0 qkv [B, S, (H + 2 KV) * D] float   packed projection of the chunk
//          1 past_key [B, KV, cap, D] float       the cache (bound in place)
//          2 past_value [B, KV, cap, D] float
//          3 seqlens_k [B] int32                  row's total length - 1, padding included
//          4 total_sequence_length [] int32
//          5 cos [P, R / 2] float, 6 sin [P, R / 2] float   rotary tables (R <= D;
//                                               optional: neither is do_rotary=0)
//          7 valid_lens [B] int32 (optional)    each row's valid tokens, the rest padding:
//                                               they are not computed nor written to the
//                                               cache, and their output rows are zero; a
//                                               row of one valid token is DecodeAttention's
//                                               (decode_rows.h), bit for bit
//          8 past_lens [B] int32 (with packed=1) each row's past length
//          9 head_sink [H] float (optional)     each head's sink logit (gpt-oss): it joins
//                                               the softmax's denominator (AddSink)
// Outputs: 0 out [B, S, H * D] float, 1 present_key, 2 present_value (same shape as past;
//          when bound to the past buffers nothing is copied, else the past is copied first)
// Attributes: num_heads, kv_num_heads (int), scale (float), bf16 (int, optional: 1 runs the
//          chunk's two products on bf16 operands), packed (int, optional: 1 takes the
//          call's valid tokens packed row after row, qkv [1, T, ...] with T = the sum of
//          valid_lens, and gives out [1, T, H * D]: the graph's own packing (export/tokens.py)
//          without the copies that spread qkv to [B, S, ...] and gather the output back;
//          it needs valid_lens and past_lens), last (int, optional, with packed=1: 1 gives
//          out [1, B, H * D], each row's last valid token only, the same bits; a row of no
//          valid token gets what the graph's GatherND at its index (valid tokens before
//          it, less one) would: the last valid token before it, else the call's last. The
//          last layer's attention, whose other outputs nothing reads: kernels/graph.py's
//          fold_last), local_window_size (int, optional: GroupQueryAttention's sliding
//          window, FirstKey in kernel_common.h; a piece then walks only the key blocks its
//          queries' windows touch), softcap (float, optional: each scaled score ->
//          softcap tanh(score / softcap) before the mask, soft_cap.h; Gemma 2),
//          rotary_interleaved (int, optional: 1 rotates pairs (2i, 2i + 1), not halves:
//          Rotate in kernel_common.h; Cohere, GLM, Helium).
//
// edgeprefill.PrefillAttentionBf16KV is the same op over a bf16 KV cache: past and present
// key and value are uint16 tensors of bf16 bits, each written rounded to nearest even. It
// needs bf16=1. With AVX512-BF16 a chunk's products then read the keys straight from the
// cache (they are already the bf16 pairs the products take) and pair only the values;
// without it (the products in float32) a chunk's rows read a float32 copy of the cache's
// values made once per call (Widen: exact, as a bf16 value is a float32 one). Either way
// its rows of one valid token read half the bytes a float32 cache takes (decode_rows.h).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <time.h>
#include <type_traits>
#include <utility>
#include <vector>

#include "decode_rows.h"
#include "kernel_common.h"  // <immintrin.h> where AVX-512 or AVX2 is on
#include "soft_cap.h"

namespace edgeprefill {
namespace {

// A piece's queries are laid out as the columns of its tiles: column m is query m / group,
// head m % group of the KV group, so the group's heads share every key and value read.
// The blocking is chosen per CPU at build time (edgeprefill/kernels/build.py, tiling_flags):
// a piece's buffers (queries, scores, probabilities, output: ~44 KB at 96 columns and 64
// keys) must stay in the L1 data cache, so CPUs with 48 KB of it (Intel since Ice Lake)
// take 96 columns x 64 keys in 4-row tiles, those with 32 KB (AMD Zen 4) 48 columns x 128
// keys in 8-row tiles: there the fp32 kernel ran 1.3x faster and the bf16 one 1.1x
// (docs/benchmarks.md). Experiments compile others with -DEP_COLUMNS=.. -DEP_KEY_BLOCK=..
// -DEP_TILE_ROWS=.. (rows x vectors <= 24 accumulators) and time them with
// `benchmarks/prefill_attention.py --library`.
#ifndef EP_COLUMNS
#define EP_COLUMNS 96
#define EP_KEY_BLOCK 64
#define EP_TILE_ROWS 4
#endif
constexpr int64_t kColumns = EP_COLUMNS;     // columns a piece aims for
constexpr int64_t kMaxColumns = 96;          // columns a piece may have (6 AVX-512 vectors)
constexpr int64_t kKeyBlock = EP_KEY_BLOCK;  // keys per step of the online softmax
constexpr int kVec = 16;
constexpr int kTileRows = EP_TILE_ROWS;      // register tile rows (x up to 6 vectors)
// A column's running max before it has seen a key: finite, as a window may hide a whole key
// block from it (RunPiece); exp(kNoScore - score) clamps to the same ~0 as exp(-inf).
constexpr float kNoScore = -3.0e38f;

struct Shape {
  int64_t rows, chunk, kv_heads, capacity, head_dim, group, rotary;
  int64_t block;  // queries per piece: as many as fill kColumns columns with the group's heads
                  // (one query when a group is wider: up to kMaxColumns)
};

struct Piece {
  int64_t row, kv, first;  // first query of the block
  int64_t work;            // keys x queries, to order the pieces longest first
};

// EDGEPREFILL_PREFILL_PROFILE=1: each call prints one line to stderr with where its time
// went (cache write, the pool's wall time, per thread: pieces, busy time, how late its first
// piece started), to tell the kernel's own rate from the pool's hand-out and wake-up.
struct PieceTime {
  int64_t start, end;  // ns, steady clock
  int64_t cpu;         // ns the thread ran (under load, wall time includes preemption)
  size_t thread;       // hash of the thread id
};

int64_t ThreadCpu() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return int64_t{t.tv_sec} * 1000000000 + t.tv_nsec;
}

int64_t Now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool Profiling() {
  static const bool on = [] {
    const char* v = std::getenv("EDGEPREFILL_PREFILL_PROFILE");
    return v != nullptr && v[0] != '\0' && v[0] != '0';
  }();
  return on;
}

struct Job {
  Shape shape;
  float scale;
  const float* qkv;
  const float* keys;
  const float* values;
  int64_t stride;  // positions per (row, KV head) of keys and values: capacity, or Widen's span
  const float* cos;
  const float* sin;
  const int64_t* past;  // per row
  const int64_t* valid;  // per row: the chunk's valid tokens (the rest is padding)
  const int64_t* first;  // per row: where its token 0 is in qkv and out (row x S, or packed)
  float* out;
  bool bf16;  // the products on bf16 pairs (Product<uint32_t>), where UsesBf16 allows
  bool last = false;  // only each row's last valid token out, to out + row (attribute last=1)
  int64_t window = 0;  // local_window_size: a query sees keys FirstKey(position) .. position
  float softcap = 0.0f;  // > 0: each score -> softcap tanh(score / softcap), before the mask
  const float* sink = nullptr;  // [heads] or null: each head's sink logit (AddSink)
  bool interleaved = false;  // Rotate's pairs (2i, 2i + 1): rotary_interleaved=1
  // bf16: the cache's keys [rows, kv, key_span, D/2] and values [rows, kv, span/2, D] paired
  // once per call for all pieces (span: the longest row's past + valid tokens, even). A
  // bf16 cache is its own key pairs (key_span = capacity): only the values are paired.
  uint32_t* key_pairs = nullptr;
  uint32_t* value_pairs = nullptr;
  int64_t span = 0;
  int64_t key_span = 0;
  const uint16_t* values16 = nullptr;  // a bf16 cache's values (keys, values: nullptr)
  std::vector<Piece> pieces;
  std::vector<PieceTime> times;  // per piece, only when profiling
};

// out[r][0..16C) = sum_b x[r * xa + b * xb] * y[b][0..16C) for R rows, plus out's old
// value times `rescale` (per column) if that is given: every product of the kernel.
// Scores: x = keys (r = key, b = head dim), y = the queries transposed. Output: x = values
// (r = head dim, b = key), y = the probabilities (keys x columns), rescale = the online
// softmax's factor for what the earlier key blocks left.
#ifdef __AVX512F__
// A tile's accumulators to start from: zero, or out's old value times `rescale` per column.
template <int R, int C>
inline void StartTile(__m512 (&acc)[R][C], const float* out, int64_t os, const float* rescale) {
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c)
      acc[r][c] = rescale != nullptr ? _mm512_mul_ps(_mm512_loadu_ps(out + r * os + c * kVec),
                                                      _mm512_loadu_ps(rescale + c * kVec))
                                     : _mm512_setzero_ps();
}
#endif

template <int R, int C>
void Tile(const float* x, int64_t xa, int64_t xb, const float* y, int64_t ys, float* out,
          int64_t os, int64_t n, const float* rescale) {
#ifdef __AVX512F__
  __m512 acc[R][C];
  StartTile(acc, out, os, rescale);
  for (int64_t b = 0; b < n; ++b) {
    __m512 yv[C];
    for (int c = 0; c < C; ++c) yv[c] = _mm512_loadu_ps(y + b * ys + c * kVec);
    for (int r = 0; r < R; ++r) {
      const __m512 broadcast = _mm512_set1_ps(x[r * xa + b * xb]);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(broadcast, yv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(out + r * os + c * kVec, acc[r][c]);
#else
  float acc[R][C * kVec];
  for (int r = 0; r < R; ++r)
    for (int k = 0; k < C * kVec; ++k) acc[r][k] = rescale != nullptr ? out[r * os + k] * rescale[k] : 0.0f;
  for (int64_t b = 0; b < n; ++b)
    for (int r = 0; r < R; ++r) {
      const float broadcast = x[r * xa + b * xb];
      for (int k = 0; k < C * kVec; ++k) acc[r][k] += broadcast * y[b * ys + k];
    }
  for (int r = 0; r < R; ++r)
    for (int k = 0; k < C * kVec; ++k) out[r * os + k] = acc[r][k];
#endif
}

#ifdef __AVX512BF16__
// --compute bf16: the same two products with bf16 operands and float32 sums (vdpbf16ps,
// two multiply-adds per lane), the operands rounded as they are used: the cache stays
// float32. Pairs run along the summed axis: x[r * xa + b * xb] and y[b * ys ..] hold the
// bf16 pair (b = 2i, 2i + 1) in one uint32, low half first; n2 = pairs.
template <int R, int C>
void Tile(const uint32_t* x, int64_t xa, int64_t xb, const uint32_t* y, int64_t ys,
          float* out, int64_t os, int64_t n2, const float* rescale) {
  __m512 acc[R][C];
  StartTile(acc, out, os, rescale);
  for (int64_t b = 0; b < n2; ++b) {
    __m512bh yv[C];
    for (int c = 0; c < C; ++c)
      yv[c] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(y + b * ys + c * kVec));
    for (int r = 0; r < R; ++r) {
      const __m512bh pair = reinterpret_cast<__m512bh>(
          _mm512_set1_epi32(static_cast<int>(x[r * xa + b * xb])));
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], pair, yv[c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(out + r * os + c * kVec, acc[r][c]);
}
#endif

// Tile<R, C> for the operands' type (float, or uint32 bf16 pairs), C = c vectors.
template <int R, typename T>
void TileRow(int c, const T* x, int64_t xa, int64_t xb, const T* y, int64_t ys, float* out,
             int64_t os, int64_t n, const float* rescale) {
  switch (c) {
    case 6: Tile<R, 6>(x, xa, xb, y, ys, out, os, n, rescale); break;
    case 5: Tile<R, 5>(x, xa, xb, y, ys, out, os, n, rescale); break;
    case 4: Tile<R, 4>(x, xa, xb, y, ys, out, os, n, rescale); break;
    case 3: Tile<R, 3>(x, xa, xb, y, ys, out, os, n, rescale); break;
    case 2: Tile<R, 2>(x, xa, xb, y, ys, out, os, n, rescale); break;
    default: Tile<R, 1>(x, xa, xb, y, ys, out, os, n, rescale); break;
  }
}

#ifdef EP_AVX2
// Tile's product with AVX2 + FMA for R rows x 16 columns (two 8-lane vectors): the 16 ymm
// registers hold 2R accumulators, the two y vectors and the broadcast, so a tile is 16
// columns wide and ProductAvx2 walks the columns strip by strip. Each output is the same
// chain as in Tile (start, then one fma per b in order), only the tiling differs.
template <int R>
void TileAvx2(const float* x, int64_t xa, int64_t xb, const float* y, int64_t ys, float* out,
              int64_t os, int64_t n, const float* rescale) {
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 2; ++c)
      acc[r][c] = rescale != nullptr ? _mm256_mul_ps(_mm256_loadu_ps(out + r * os + 8 * c),
                                                      _mm256_loadu_ps(rescale + 8 * c))
                                     : _mm256_setzero_ps();
  for (int64_t b = 0; b < n; ++b) {
    const __m256 y0 = _mm256_loadu_ps(y + b * ys), y1 = _mm256_loadu_ps(y + b * ys + 8);
    for (int r = 0; r < R; ++r) {
      const __m256 broadcast = _mm256_broadcast_ss(x + r * xa + b * xb);
      acc[r][0] = _mm256_fmadd_ps(broadcast, y0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(broadcast, y1, acc[r][1]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 2; ++c) _mm256_storeu_ps(out + r * os + 8 * c, acc[r][c]);
}

// TileAvx2's rows: 12 accumulators + 2 y + 1 broadcast. On a Zen 3 (2 threads, chunk 256
// at past 1,792) 6 rows ran ~1.3x faster than 4 (docs/benchmarks.md); -DEP_AVX2_ROWS=1..6
// compiles others.
#ifndef EP_AVX2_ROWS
#define EP_AVX2_ROWS 6
#endif
constexpr int kAvx2Rows = EP_AVX2_ROWS;

// Product for float operands with AVX2: row blocks of kAvx2Rows (the rest in one smaller
// tile), each across the columns 16 at a time.
void ProductAvx2(int64_t rows, int64_t columns, const float* x, int64_t xa, int64_t xb,
                 const float* y, float* out, int64_t n, const float* rescale) {
  for (int64_t r = 0; r < rows; r += kAvx2Rows) {
    const int64_t left = std::min<int64_t>(kAvx2Rows, rows - r);
    for (int64_t c = 0; c < columns; c += kVec) {
      const float* scale = rescale != nullptr ? rescale + c : nullptr;
      float* o = out + r * columns + c;
      switch (left) {
        case 6: TileAvx2<6>(x + r * xa, xa, xb, y + c, columns, o, columns, n, scale); break;
        case 5: TileAvx2<5>(x + r * xa, xa, xb, y + c, columns, o, columns, n, scale); break;
        case 4: TileAvx2<4>(x + r * xa, xa, xb, y + c, columns, o, columns, n, scale); break;
        case 3: TileAvx2<3>(x + r * xa, xa, xb, y + c, columns, o, columns, n, scale); break;
        case 2: TileAvx2<2>(x + r * xa, xa, xb, y + c, columns, o, columns, n, scale); break;
        default: TileAvx2<1>(x + r * xa, xa, xb, y + c, columns, o, columns, n, scale); break;
      }
    }
  }
}
#endif

// out[rows][columns] = X . y (+ out x rescale), in register tiles; `columns` is a multiple
// of 16, <= 96; n is the summed length (in pairs for bf16 operands).
template <typename T>
void Product(int64_t rows, int64_t columns, const T* x, int64_t xa, int64_t xb, const T* y,
             float* out, int64_t n, const float* rescale) {
#ifdef EP_AVX2
  if constexpr (std::is_same_v<T, float>) {
    ProductAvx2(rows, columns, x, xa, xb, y, out, n, rescale);
    return;
  }
#endif
  const int c = static_cast<int>(columns / kVec);
  int64_t r = 0;
  for (; r + kTileRows <= rows; r += kTileRows)
    TileRow<kTileRows>(c, x + r * xa, xa, xb, y, columns, out + r * columns, columns, n, rescale);
  for (; r < rows; ++r)
    TileRow<1>(c, x + r * xa, xa, xb, y, columns, out + r * columns, columns, n, rescale);
}

#ifdef __AVX512BF16__
// 16 lanes of two neighbouring rows -> their bf16 pairs (low row in the low half), as
// PairRows writes them.
inline __m512i PairVectors(__m512 low, __m512 high) {
  alignas(64) static const uint16_t kInterleave[32] = {
      0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
      8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i both = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(high, low));
  return _mm512_permutexvar_epi16(_mm512_load_si512(kInterleave), both);
}

// rows x width floats (row stride `stride`, width a multiple of 16) -> ceil(rows / 2) x
// width pairs of vertical neighbours (row 2j, row 2j + 1; a missing last row is zero).
void PairRows(const float* src, int64_t stride, int64_t rows, int64_t width, uint32_t* dst) {
  for (int64_t j = 0; 2 * j < rows; ++j) {
    const float* low = src + 2 * j * stride;
    const bool pair = 2 * j + 1 < rows;
    for (int64_t c = 0; c < width; c += kVec) {
      const __m512 high = pair ? _mm512_loadu_ps(low + stride + c) : _mm512_setzero_ps();
      _mm512_storeu_si512(dst + j * width + c, PairVectors(_mm512_loadu_ps(low + c), high));
    }
  }
}

// PairRows for bf16 rows (a bf16 cache's values): the same pairs, nothing to round.
void PairRows16(const uint16_t* src, int64_t stride, int64_t rows, int64_t width, uint32_t* dst) {
  for (int64_t j = 0; 2 * j < rows; ++j) {
    const uint16_t* low = src + 2 * j * stride;
    const bool pair = 2 * j + 1 < rows;
    for (int64_t c = 0; c < width; c += kVec) {
      const __m512i l = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(low + c)));
      const __m512i h = pair ? _mm512_cvtepu16_epi32(_mm256_loadu_si256(
                                   reinterpret_cast<const __m256i*>(low + stride + c)))
                             : _mm512_setzero_si512();
      _mm512_storeu_si512(dst + j * width + c, _mm512_or_si512(l, _mm512_slli_epi32(h, 16)));
    }
  }
}
#endif

// Whether a call runs the bf16 products: asked for and built with AVX512-BF16 (the head
// size is a multiple of 16, as the values are paired 16 dims at a time: CheckShapes).
bool UsesBf16(bool asked) {
#ifdef __AVX512BF16__
  return asked;
#else
  (void)asked;
  return false;
#endif
}

// One key block of the online softmax for 16 columns. scores[j * stride] holds key k0 + j's
// scores; a column sees the keys from its low (lows[], FirstKey: 0 without a window) up to
// its position. They become exp(score - new max), 0 where masked; the running max, sum and
// the factor for the earlier output are updated. A column that sees no key of the block
// keeps its max (a finite floor at first, kNoScore), sum and output (factor 1).
#ifdef __AVX512F__
// Below the diagonal and inside every window (every column sees the whole block) nothing
// needs masking.
inline bool Inside(int64_t n, int64_t k0, __m512i position, __m512i low) {
  return k0 + n - 1 <= _mm512_reduce_min_epi32(position) && k0 >= _mm512_reduce_max_epi32(low);
}

// The columns that see `key`: low <= key <= position.
inline __mmask16 Seen(int64_t key, __m512i position, __m512i low) {
  const __m512i k = _mm512_set1_epi32(static_cast<int32_t>(key));
  return _mm512_mask_cmple_epi32_mask(_mm512_cmple_epi32_mask(low, k), k, position);
}

// The largest score each column sees in the block.
inline __m512 BlockTop(const float* scores, int64_t stride, int64_t n, int64_t k0,
                       __m512i position, __m512i low, bool inside) {
  __m512 block_top = _mm512_set1_ps(-INFINITY);
  if (inside) {
    __m512 other = block_top;  // two chains: max has a latency of 4
    int64_t j = 0;
    for (; j + 1 < n; j += 2) {
      block_top = _mm512_max_ps(block_top, _mm512_loadu_ps(scores + j * stride));
      other = _mm512_max_ps(other, _mm512_loadu_ps(scores + (j + 1) * stride));
    }
    if (j < n) block_top = _mm512_max_ps(block_top, _mm512_loadu_ps(scores + j * stride));
    return _mm512_max_ps(block_top, other);
  }
  for (int64_t j = 0; j < n; ++j) {
    const __mmask16 seen = Seen(k0 + j, position, low);
    block_top = _mm512_mask_max_ps(block_top, seen, block_top, _mm512_loadu_ps(scores + j * stride));
  }
  return block_top;
}

void SoftmaxStep(float* scores, int64_t stride, int64_t n, int64_t k0, const int32_t* positions,
                 const int32_t* lows, float* top, float* total, float* rescale) {
  const __m512i position = _mm512_loadu_si512(positions), low = _mm512_loadu_si512(lows);
  const bool inside = Inside(n, k0, position, low);
  const __m512 old_top = _mm512_loadu_ps(top);
  const __m512 block_top = BlockTop(scores, stride, n, k0, position, low, inside);
  const __m512 new_top = _mm512_max_ps(old_top, block_top);
  const __m512 factor = ExpNonPositive16(_mm512_sub_ps(old_top, new_top));
  __m512 sum = _mm512_setzero_ps();
  if (inside) {
    __m512 other = sum;
    int64_t j = 0;
    for (; j + 1 < n; j += 2) {
      const __m512 e0 = ExpNonPositive16(_mm512_sub_ps(_mm512_loadu_ps(scores + j * stride), new_top));
      const __m512 e1 = ExpNonPositive16(_mm512_sub_ps(_mm512_loadu_ps(scores + (j + 1) * stride), new_top));
      _mm512_storeu_ps(scores + j * stride, e0);
      _mm512_storeu_ps(scores + (j + 1) * stride, e1);
      sum = _mm512_add_ps(sum, e0);
      other = _mm512_add_ps(other, e1);
    }
    for (; j < n; ++j) {
      const __m512 e = ExpNonPositive16(_mm512_sub_ps(_mm512_loadu_ps(scores + j * stride), new_top));
      _mm512_storeu_ps(scores + j * stride, e);
      sum = _mm512_add_ps(sum, e);
    }
    sum = _mm512_add_ps(sum, other);
  }
  for (int64_t j = 0; j < n && !inside; ++j) {
    const __mmask16 seen = Seen(k0 + j, position, low);
    const __m512 e = _mm512_maskz_mov_ps(
        seen, ExpNonPositive16(_mm512_sub_ps(_mm512_loadu_ps(scores + j * stride), new_top)));
    _mm512_storeu_ps(scores + j * stride, e);
    sum = _mm512_add_ps(sum, e);
  }
  _mm512_storeu_ps(top, new_top);
  _mm512_storeu_ps(total, _mm512_fmadd_ps(_mm512_loadu_ps(total), factor, sum));
  _mm512_storeu_ps(rescale, factor);
}

#ifdef __AVX512BF16__
// exp(x) for x <= 0 to ~8e-5 relative: 2^(x log2 e) with a cubic for 2^f, f in [-1/2, 1/2].
// Enough where the probabilities are then rounded to bf16 (2^-9 relative).
inline __m512 ExpForBf16(__m512 x) {
  const __m512 t = _mm512_mul_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(1.44269504088896341f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(0.055088767f), f, _mm512_set1_ps(0.242604656f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.693276283f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.999928905f));
  return _mm512_scalef_ps(p, n);
}

// SoftmaxStep for the bf16 products: the probabilities (exp by ExpForBf16) go straight into
// bf16 pairs of neighbouring keys (pairs[(j / 2) * pair_stride], as PairRows lays them out),
// without writing the float32 probabilities back and reading them again.
void SoftmaxStepPairs(const float* scores, int64_t stride, int64_t n, int64_t k0,
                      const int32_t* positions, const int32_t* lows, float* top, float* total,
                      float* rescale, uint32_t* pairs, int64_t pair_stride) {
  const __m512i position = _mm512_loadu_si512(positions), low = _mm512_loadu_si512(lows);
  const bool inside = Inside(n, k0, position, low);
  const __m512 old_top = _mm512_loadu_ps(top);
  const __m512 new_top = _mm512_max_ps(old_top, BlockTop(scores, stride, n, k0, position, low, inside));
  const __m512 factor = ExpForBf16(_mm512_sub_ps(old_top, new_top));
  __m512 sum = _mm512_setzero_ps(), sum1 = sum;
  for (int64_t j = 0; j < n; j += 2) {
    __m512 e0 = ExpForBf16(_mm512_sub_ps(_mm512_loadu_ps(scores + j * stride), new_top));
    __m512 e1 = j + 1 < n ? ExpForBf16(_mm512_sub_ps(_mm512_loadu_ps(scores + (j + 1) * stride), new_top))
                          : _mm512_setzero_ps();
    if (!inside) {
      e0 = _mm512_maskz_mov_ps(Seen(k0 + j, position, low), e0);
      e1 = _mm512_maskz_mov_ps(Seen(k0 + j + 1, position, low), e1);
    }
    sum = _mm512_add_ps(sum, e0);
    sum1 = _mm512_add_ps(sum1, e1);
    _mm512_storeu_si512(pairs + (j / 2) * pair_stride, PairVectors(e0, e1));
  }
  _mm512_storeu_ps(top, new_top);
  _mm512_storeu_ps(total, _mm512_fmadd_ps(_mm512_loadu_ps(total), factor, _mm512_add_ps(sum, sum1)));
  _mm512_storeu_ps(rescale, factor);
}
#endif
#elif defined(EP_AVX2)
// SoftmaxStep's AVX-512 code for 8 columns (SoftmaxStep runs it on both halves of its 16);
// the masks are compare results, and a masked score is zeroed (exp) or -inf (max) by them.
inline bool Inside8(int64_t n, int64_t k0, __m256i position, __m256i low) {
  __m128i first = _mm_min_epi32(_mm256_castsi256_si128(position), _mm256_extracti128_si256(position, 1));
  first = _mm_min_epi32(first, _mm_shuffle_epi32(first, 0x4E));
  first = _mm_min_epi32(first, _mm_shuffle_epi32(first, 0xB1));
  __m128i last = _mm_max_epi32(_mm256_castsi256_si128(low), _mm256_extracti128_si256(low, 1));
  last = _mm_max_epi32(last, _mm_shuffle_epi32(last, 0x4E));
  last = _mm_max_epi32(last, _mm_shuffle_epi32(last, 0xB1));
  return k0 + n - 1 <= _mm_cvtsi128_si32(first) && k0 >= _mm_cvtsi128_si32(last);
}

// All ones in the lanes that see `key` (low <= key <= position).
inline __m256 Seen8(int64_t key, __m256i position, __m256i low) {
  const __m256i k = _mm256_set1_epi32(static_cast<int32_t>(key));
  const __m256i outside = _mm256_or_si256(_mm256_cmpgt_epi32(k, position), _mm256_cmpgt_epi32(low, k));
  return _mm256_castsi256_ps(_mm256_xor_si256(outside, _mm256_set1_epi32(-1)));
}

inline __m256 BlockTop8(const float* scores, int64_t stride, int64_t n, int64_t k0,
                        __m256i position, __m256i low, bool inside) {
  const __m256 lowest = _mm256_set1_ps(-INFINITY);
  __m256 block_top = lowest;
  if (inside) {
    __m256 other = block_top;  // two chains, as BlockTop
    int64_t j = 0;
    for (; j + 1 < n; j += 2) {
      block_top = _mm256_max_ps(block_top, _mm256_loadu_ps(scores + j * stride));
      other = _mm256_max_ps(other, _mm256_loadu_ps(scores + (j + 1) * stride));
    }
    if (j < n) block_top = _mm256_max_ps(block_top, _mm256_loadu_ps(scores + j * stride));
    return _mm256_max_ps(block_top, other);
  }
  for (int64_t j = 0; j < n; ++j) {
    const __m256 score = _mm256_blendv_ps(lowest, _mm256_loadu_ps(scores + j * stride),
                                          Seen8(k0 + j, position, low));
    block_top = _mm256_max_ps(block_top, score);
  }
  return block_top;
}

void SoftmaxStep8(float* scores, int64_t stride, int64_t n, int64_t k0, const int32_t* positions,
                  const int32_t* lows, float* top, float* total, float* rescale) {
  const __m256i position = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(positions));
  const __m256i low = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lows));
  const bool inside = Inside8(n, k0, position, low);
  const __m256 old_top = _mm256_loadu_ps(top);
  const __m256 new_top = _mm256_max_ps(old_top, BlockTop8(scores, stride, n, k0, position, low, inside));
  const __m256 factor = ExpNonPositive8(_mm256_sub_ps(old_top, new_top));
  __m256 sum = _mm256_setzero_ps();
  if (inside) {
    __m256 other = sum;
    int64_t j = 0;
    for (; j + 1 < n; j += 2) {
      const __m256 e0 = ExpNonPositive8(_mm256_sub_ps(_mm256_loadu_ps(scores + j * stride), new_top));
      const __m256 e1 = ExpNonPositive8(_mm256_sub_ps(_mm256_loadu_ps(scores + (j + 1) * stride), new_top));
      _mm256_storeu_ps(scores + j * stride, e0);
      _mm256_storeu_ps(scores + (j + 1) * stride, e1);
      sum = _mm256_add_ps(sum, e0);
      other = _mm256_add_ps(other, e1);
    }
    for (; j < n; ++j) {
      const __m256 e = ExpNonPositive8(_mm256_sub_ps(_mm256_loadu_ps(scores + j * stride), new_top));
      _mm256_storeu_ps(scores + j * stride, e);
      sum = _mm256_add_ps(sum, e);
    }
    sum = _mm256_add_ps(sum, other);
  }
  for (int64_t j = 0; j < n && !inside; ++j) {
    const __m256 e = _mm256_and_ps(
        Seen8(k0 + j, position, low),
        ExpNonPositive8(_mm256_sub_ps(_mm256_loadu_ps(scores + j * stride), new_top)));
    _mm256_storeu_ps(scores + j * stride, e);
    sum = _mm256_add_ps(sum, e);
  }
  _mm256_storeu_ps(top, new_top);
  _mm256_storeu_ps(total, _mm256_fmadd_ps(_mm256_loadu_ps(total), factor, sum));
  _mm256_storeu_ps(rescale, factor);
}

void SoftmaxStep(float* scores, int64_t stride, int64_t n, int64_t k0, const int32_t* positions,
                 const int32_t* lows, float* top, float* total, float* rescale) {
  for (int half = 0; half < kVec; half += 8)
    SoftmaxStep8(scores + half, stride, n, k0, positions + half, lows + half, top + half,
                 total + half, rescale + half);
}
#else
void SoftmaxStep(float* scores, int64_t stride, int64_t n, int64_t k0, const int32_t* positions,
                 const int32_t* lows, float* top, float* total, float* rescale) {
  for (int l = 0; l < kVec; ++l) {
    const auto seen = [&](int64_t j) { return lows[l] <= k0 + j && k0 + j <= positions[l]; };
    float block_top = -INFINITY;
    for (int64_t j = 0; j < n; ++j)
      if (seen(j)) block_top = std::max(block_top, scores[j * stride + l]);
    const float new_top = std::max(top[l], block_top);
    rescale[l] = ExpNonPositive(top[l] - new_top);  // top[l] = kNoScore: a clamped ~0
    float sum = 0.0f;
    for (int64_t j = 0; j < n; ++j) {
      const float e = seen(j) ? ExpNonPositive(scores[j * stride + l] - new_top) : 0.0f;
      scores[j * stride + l] = e;
      sum += e;
    }
    top[l] = new_top;
    total[l] = total[l] * rescale[l] + sum;
  }
}
#endif

// A row of one valid token (a decode row beside a prefill chunk) is not this op's pieces:
// DecodeRows (decode_rows.h) computes it, cache write included, with DecodeAttention's own
// code, so its output and cache are the same bits as in a decode call (float32 products
// under bf16 too), whatever else shares the call.
inline bool OneToken(const Job& job, int64_t row) { return job.valid[row] == 1; }

// A row of more than one valid token: this op's pieces compute it.
inline bool ChunkRow(const Job& job, int64_t row) { return job.valid[row] > 1; }

// The end of the longest chunk row (its past + valid tokens), 0 in a decode step: what a
// call pairs (bf16 products) or widens (a bf16 cache without them) of the cache.
inline int64_t ChunkEnd(const Job& job) {
  int64_t end = 0;
  for (int64_t row = 0; row < job.shape.rows; ++row)
    if (ChunkRow(job, row)) end = std::max(end, job.past[row] + job.valid[row]);
  return end;
}

// Whether a row's products run on bf16 pairs (its cache is paired for the call).
inline bool PairedRow(const Job& job, int64_t row) { return job.bf16 && ChunkRow(job, row); }

// One piece: a block of queries of the KV group's heads over the keys they see: 0 (with a
// window, its first query's FirstKey, down to a key block's start) .. its last position.
// Without a window every column sees key 0, so after the first key block every running max
// is a score; with one, a column may see none of the first blocks: its max starts at a
// finite floor, so that such a block leaves it as it was (exp(floor - floor) = 1, not NaN).
void RunPiece(void* data, size_t index) {
  const Job& job = *static_cast<const Job*>(data);
  const Shape& s = job.shape;
  const Piece& piece = job.pieces[index];
  const int64_t started = job.times.empty() ? 0 : Now();
  const int64_t cpu_started = job.times.empty() ? 0 : ThreadCpu();
  const int64_t d = s.head_dim, g = s.group, half = s.rotary / 2;
  const int64_t heads = s.kv_heads * g, width = (heads + 2 * s.kv_heads) * d;
  const int64_t past = job.past[piece.row];
  const int64_t queries = std::min(s.block, job.valid[piece.row] - piece.first);
  const int64_t used = queries * g;
  const int64_t columns = (used + kVec - 1) / kVec * kVec;
  const int64_t first_position = past + piece.first;

  std::vector<float> buffer(columns * (2 * d + kKeyBlock + 3) + d);
  float* qt = buffer.data();                  // [D, columns] rotated, scaled queries
  float* ot = qt + d * columns;               // [D, columns] unnormalized output
  float* scores = ot + d * columns;           // [keys, columns]
  float* top = scores + kKeyBlock * columns;  // [columns] running max
  float* total = top + columns;               // [columns] running sum
  float* rescale = total + columns;           // [columns]
  float* rotated = rescale + columns;         // [D]
  std::vector<int32_t> positions(columns), lows(columns);
  for (int64_t m = 0; m < columns; ++m) {
    // Padding columns repeat the last query's position: finite scores, never written out.
    const int64_t i = std::min(m / g, queries - 1);
    positions[m] = static_cast<int32_t>(first_position + i);
    lows[m] = static_cast<int32_t>(FirstKey(first_position + i, job.window));
    if (m >= used) {
      for (int64_t k = 0; k < d; ++k) qt[k * columns + m] = 0.0f;
      continue;
    }
    const int64_t position = first_position + i;
    const float* packed = job.qkv + (job.first[piece.row] + piece.first + i) * width;
    Rotate(packed + (piece.kv * g + m % g) * d, rotated, job.cos + position * half,
           job.sin + position * half, d, s.rotary, job.interleaved);
    for (int64_t k = 0; k < d; ++k) qt[k * columns + m] = rotated[k] * job.scale;
  }
  std::fill(ot, ot + d * columns, 0.0f);
  std::fill(top, top + columns, kNoScore);
  std::fill(total, total + columns, 0.0f);
#ifdef __AVX512BF16__
  // bf16: the queries paired once ([D/2, columns]); per key block the probabilities
  // ([n/2, columns], by the softmax); the keys and values were paired once per call (RunPairs).
  const bool bf16 = PairedRow(job, piece.row);
  std::vector<uint32_t> pairs(bf16 ? (d + kKeyBlock + 2) / 2 * columns : 0);
  uint32_t* q2 = pairs.data();
  uint32_t* p2 = q2 + d / 2 * columns;
  if (bf16) PairRows(qt, columns, d, columns, q2);
#endif

  const int64_t head = piece.row * s.kv_heads + piece.kv;
  // float32 keys and values: the cache's, or Widen's copy of a bf16 one (with bf16 products
  // a bf16 cache is read as pairs only)
  const float* keys = job.keys != nullptr ? job.keys + head * job.stride * d : nullptr;
  const float* values = job.values != nullptr ? job.values + head * job.stride * d : nullptr;
  const int64_t end = first_position + queries;  // keys [start, end) are seen by some query
  // At a key block's start, as without a window (bf16: an even key, a pair's first).
  const int64_t start = FirstKey(first_position, job.window) / kKeyBlock * kKeyBlock;
  for (int64_t k0 = start; k0 < end; k0 += kKeyBlock) {
    const int64_t n = std::min(kKeyBlock, end - k0);
#ifdef __AVX512BF16__
    if (bf16) {
      Product(n, columns, job.key_pairs + (head * job.key_span + k0) * d / 2, d / 2, 1, q2,
              scores, d / 2, nullptr);
      if (job.softcap > 0.0f) SoftCap(scores, n * columns, job.softcap);
      for (int64_t c = 0; c < columns; c += kVec)
        SoftmaxStepPairs(scores + c, columns, n, k0, positions.data() + c, lows.data() + c,
                         top + c, total + c, rescale + c, p2 + c, columns);
      Product(d, columns, job.value_pairs + (head * job.span + k0) / 2 * d, 1, d, p2, ot,
              (n + 1) / 2, rescale);
      continue;
    }
#endif
    Product(n, columns, keys + k0 * d, d, 1, qt, scores, d, nullptr);
    if (job.softcap > 0.0f) SoftCap(scores, n * columns, job.softcap);
    for (int64_t c = 0; c < columns; c += kVec)
      SoftmaxStep(scores + c, columns, n, k0, positions.data() + c, lows.data() + c, top + c,
                  total + c, rescale + c);
    Product(d, columns, values + k0 * d, 1, d, scores, ot, n, rescale);
  }
  for (int64_t m = 0; m < used; ++m) {
    const int64_t i = m / g, h = m % g;
    if (job.last && piece.first + i != job.valid[piece.row] - 1) continue;
    const int64_t token = job.last ? piece.row : job.first[piece.row] + piece.first + i;
    float* out = job.out + (token * heads + piece.kv * g + h) * d;
    const float inverse = 1.0f / AddSink(total[m], top[m], job.sink, piece.kv * g + h);
    for (int64_t k = 0; k < d; ++k) out[k] = ot[k * columns + m] * inverse;
  }
  if (!job.times.empty()) {
    const_cast<Job&>(job).times[index] = {started, Now(), ThreadCpu() - cpu_started,
                                          std::hash<std::thread::id>{}(std::this_thread::get_id())};
  }
}

void Report(const Job& job, int64_t begin, int64_t written, int64_t pooled, int64_t end) {
  const Shape& s = job.shape;
  struct Thread { size_t id; int64_t pieces, busy, cpu, first; };
  std::vector<Thread> threads;
  double flop = 0;
  for (size_t i = 0; i < job.times.size(); ++i) {
    const PieceTime& t = job.times[i];
    flop += 4.0 * s.head_dim * s.group * static_cast<double>(job.pieces[i].work);
    auto it = std::find_if(threads.begin(), threads.end(), [&](const Thread& x) { return x.id == t.thread; });
    if (it == threads.end()) {
      threads.push_back({t.thread, 0, 0, 0, t.start});
      it = threads.end() - 1;
    }
    it->pieces += 1;
    it->busy += t.end - t.start;
    it->cpu += t.cpu;
    it->first = std::min(it->first, t.start);
  }
  int64_t busy = 0, cpu = 0;
  for (const Thread& t : threads) busy += t.busy, cpu += t.cpu;
  std::fprintf(stderr,
               "prefill-profile chunk %lld past0 %lld pieces %zu: call %.3f ms, cache write %.3f, "
               "pool %.3f, pieces %.1f GFLOP/s cpu, %.1f busy, %.1f wall;",
               static_cast<long long>(s.chunk), static_cast<long long>(job.past[0]),
               job.times.size(), (end - begin) / 1e6, (written - begin) / 1e6, (end - pooled) / 1e6,
               cpu > 0 ? flop / cpu : 0.0, busy > 0 ? flop / busy : 0.0, flop / (end - pooled));
  for (const Thread& t : threads)
    std::fprintf(stderr, " [%lld pieces, busy %.3f ms, cpu %.3f, first at +%.3f]",
                 static_cast<long long>(t.pieces), t.busy / 1e6, t.cpu / 1e6, (t.first - pooled) / 1e6);
  std::fprintf(stderr, "\n");
}

OrtStatus* CheckShapes(const Kernel& kernel, const Tensor& qkv, const Tensor& past_k,
                       const Tensor& past_v, const Tensor& seqlens, const Tensor& total,
                       int64_t rotary, Shape* shape) {
  if (qkv.dims.size() != 3)
    return Fail("PrefillAttention: qkv must be [rows, chunk, (heads + 2 kv_heads) * head_dim]");
  if (kernel.packed && qkv.dims[0] != 1)
    return Fail("PrefillAttention: packed=1 takes qkv as [1, tokens, (heads + 2 kv_heads) * head_dim]");
  if (past_k.dims.size() != 4 || past_k.dims != past_v.dims)
    return Fail("PrefillAttention: past key and value must both be [rows, kv_heads, capacity, head_dim]");
  const int64_t d = past_k.dims[3];
  const int64_t rows = kernel.packed ? past_k.dims[0] : qkv.dims[0];
  if (past_k.dims[0] != rows || past_k.dims[1] != kernel.kv_heads ||
      qkv.dims[2] != (kernel.heads + 2 * kernel.kv_heads) * d)
    return Fail("PrefillAttention: qkv and the cache disagree on rows, heads or head_dim");
  if (d % kVec != 0 || kernel.heads % kernel.kv_heads != 0)
    return Fail("PrefillAttention: head_dim must be a multiple of 16 and heads of kv_heads");
  if (seqlens.dims.size() != 1 || seqlens.dims[0] != rows)
    return Fail("PrefillAttention: seqlens_k must be [rows]");
  if (!(total.dims.empty() || (total.dims.size() == 1 && total.dims[0] == 1)))
    return Fail("PrefillAttention: total_sequence_length must be a scalar");
  const int64_t group = kernel.heads / kernel.kv_heads;
  if (group > kMaxColumns)
    return Fail("PrefillAttention: at most 96 query heads per KV head");
  *shape = {rows, qkv.dims[1], kernel.kv_heads, past_k.dims[2], d, group,
            rotary, std::max<int64_t>(1, kColumns / group)};
  return nullptr;
}

// Input 7, valid_lens, where the graph gives it: each row's valid tokens (0 .. chunk).
OrtStatus* ValidLens(OrtKernelContext* context, const Shape& s, int64_t* valid) {
  bool given = false;
  EP_RETURN_IF_ERROR(HasInput(context, 7, &given));
  if (!given) return nullptr;  // every token valid
  Tensor lens;
  EP_RETURN_IF_ERROR(Input(context, 7, &lens));
  if (lens.dims.size() != 1 || lens.dims[0] != s.rows)
    return Fail("PrefillAttention: valid_lens must be [rows]");
  const int32_t* data = reinterpret_cast<const int32_t*>(lens.data);
  for (int64_t row = 0; row < s.rows; ++row) {
    if (data[row] < 0 || data[row] > s.chunk)
      return Fail("PrefillAttention: a row's valid_lens is outside 0 .. chunk");
    valid[row] = data[row];
  }
  return nullptr;
}

// Each row's past length and where its token 0 is in qkv and out. Unpacked: the past from
// seqlens_k and total_sequence_length (as GroupQueryAttention), token 0 at row x S. Packed:
// the past from input 8 (past_lens), token 0 after the valid tokens of the rows before.
OrtStatus* Places(OrtKernelContext* context, const Kernel& kernel, const Shape& s,
                  const Tensor& seqlens_t, const Tensor& total_t,
                  const std::vector<int64_t>& valid, std::vector<int64_t>* past,
                  std::vector<int64_t>* first) {
  if (!kernel.packed) {
    const int32_t* seqlens = reinterpret_cast<const int32_t*>(seqlens_t.data);
    const int64_t total = *reinterpret_cast<const int32_t*>(total_t.data);
    for (int64_t row = 0; row < s.rows; ++row) {
      (*past)[row] = total == s.chunk ? 0 : int64_t{seqlens[row]} + 1 - s.chunk;
      (*first)[row] = row * s.chunk;
    }
    return nullptr;
  }
  bool valid_given = false, past_given = false;
  EP_RETURN_IF_ERROR(HasInput(context, 7, &valid_given));
  EP_RETURN_IF_ERROR(HasInput(context, 8, &past_given));
  if (!valid_given || !past_given)
    return Fail("PrefillAttention: packed=1 needs valid_lens (input 7) and past_lens (input 8)");
  Tensor lens;
  EP_RETURN_IF_ERROR(Input(context, 8, &lens));
  if (lens.dims.size() != 1 || lens.dims[0] != s.rows)
    return Fail("PrefillAttention: past_lens must be [rows]");
  const int32_t* data = reinterpret_cast<const int32_t*>(lens.data);
  int64_t next = 0;
  for (int64_t row = 0; row < s.rows; ++row) {
    (*past)[row] = data[row];
    (*first)[row] = next;
    next += valid[row];
  }
  if (next != s.chunk)
    return Fail("PrefillAttention: packed=1 takes as many qkv tokens as valid_lens sums to");
  return nullptr;
}

// The output rows of padding tokens: zero (no piece computes them).
void ZeroPadding(const Job& job) {
  const Shape& s = job.shape;
  const int64_t width = s.kv_heads * s.group * s.head_dim;
  for (int64_t row = 0; row < s.rows; ++row)
    if (job.valid[row] < s.chunk)
      std::memset(job.out + (row * s.chunk + job.valid[row]) * width, 0,
                  static_cast<size_t>((s.chunk - job.valid[row]) * width) * sizeof(float));
}

// Writes the chunk's rotated keys and its values into the cache at each row's past length
// (not a one-token row's: DecodeRows writes it); a bf16 cache gets their bf16 roundings.
void WriteCache(const Job& job, const Cache& cache) {
  const Shape& s = job.shape;
  const int64_t d = s.head_dim, half = s.rotary / 2, heads = s.kv_heads * s.group;
  const int64_t width = (heads + 2 * s.kv_heads) * d;
  std::vector<float> rotated(d);
  for (int64_t row = 0; row < s.rows; ++row)
    for (int64_t token = 0; token < (OneToken(job, row) ? 0 : job.valid[row]); ++token) {
      const int64_t position = job.past[row] + token;
      const float* packed = job.qkv + (job.first[row] + token) * width;
      for (int64_t kv = 0; kv < s.kv_heads; ++kv) {
        const int64_t at = ((row * s.kv_heads + kv) * s.capacity + position) * d;
        WriteKeyValue(cache, at, packed + (heads + kv) * d,
                      packed + (heads + s.kv_heads + kv) * d, job.cos + position * half,
                      job.sin + position * half, d, s.rotary, job.interleaved, rotated.data());
      }
    }
}

// A bf16 cache without bf16 products: each chunk row's keys and values [0, span) as float32
// into keys and values ([rows, kv_heads, span, head_dim]; other rows' left unwritten, never
// read), after WriteCache, so that the chunk's own keys are their bf16 roundings, as every
// later step reads them.
void Widen(const Job& job, const Cache& cache, int64_t span, float* keys, float* values) {
  const Shape& s = job.shape;
  const int64_t d = s.head_dim;
  for (int64_t row = 0; row < s.rows; ++row) {
    if (!ChunkRow(job, row)) continue;
    for (int64_t kv = 0; kv < s.kv_heads; ++kv) {
      const int64_t head = row * s.kv_heads + kv;
      const int64_t count = (job.past[row] + job.valid[row]) * d;
      for (const auto& [from, to] :
           {std::pair{cache.keys, keys}, std::pair{cache.values, values}}) {
        const uint16_t* bits = static_cast<const uint16_t*>(from) + head * s.capacity * d;
        float* out = to + head * span * d;
        for (int64_t i = 0; i < count; ++i) out[i] = FromBf16(bits[i]);
      }
    }
  }
}

// last=1: a row of no valid token gets what GatherND at its packed index (the valid tokens
// of the rows before it, less one; -1 is the call's last token) gives the stock graph: the
// output of the nearest row before it with a valid token, else of the last such row.
void CopyToEmptyRows(const Job& job) {
  const Shape& s = job.shape;
  const int64_t width = s.kv_heads * s.group * s.head_dim;
  int64_t last_valid = -1;
  for (int64_t row = 0; row < s.rows; ++row)
    if (job.valid[row] > 0) last_valid = row;
  int64_t before = last_valid;  // -1: no row has a valid token, and no output is read
  for (int64_t row = 0; row < s.rows; ++row) {
    if (job.valid[row] > 0) {
      before = row;
    } else if (before >= 0) {
      std::memcpy(job.out + row * width, job.out + before * width, width * sizeof(float));
    } else {
      std::memset(job.out + row * width, 0, width * sizeof(float));
    }
  }
}

// The pieces of every row of more than one valid token (DecodeRows computes the others).
std::vector<Piece> Plan(const Job& job) {
  const Shape& s = job.shape;
  std::vector<Piece> pieces;
  for (int64_t row = 0; row < s.rows; ++row)
    // last=1: only the query block of the row's last token, at the same block boundaries as
    // all of them, so that token's output is the same bits.
    for (int64_t first = job.last ? (job.valid[row] - 1) / s.block * s.block : 0;
         first < (OneToken(job, row) ? 0 : job.valid[row]); first += s.block) {
      const int64_t queries = std::min(s.block, job.valid[row] - first);
      const int64_t last_key = job.past[row] + first + queries;  // keys [lowest, last_key)
      const int64_t work = queries * (last_key - FirstKey(last_key - queries, job.window));
      for (int64_t kv = 0; kv < s.kv_heads; ++kv) pieces.push_back({row, kv, first, work});
    }
  // The pool hands pieces out in order. One (row, KV head) after another, so the threads
  // share its keys and values while they are in cache (one head's 2,048 positions are 1 MB),
  // and within it the longest first, so the short ones fill the gaps at the end.
  std::stable_sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) {
    if (a.row != b.row || a.kv != b.kv) return a.row != b.row ? a.row < b.row : a.kv < b.kv;
    return a.work > b.work;
  });
  return pieces;
}

#ifdef __AVX512BF16__
constexpr int64_t kPairBlock = 256;  // keys per piece of the pairing pass

// The pairing pass's buffer, kept by the calling thread between calls: allocated afresh,
// its pages were faulted in again on every call (0.70 ms of a 4 ms call at past 1,792 on a
// Zen 4 VM, 0.16-0.27 ms kept; a 2,048-token int8 prefill 2.5% faster). Up to kKeptPairs
// uint32s (16 MiB) stay between calls; a larger call's buffer goes when it returns.
constexpr size_t kKeptPairs = size_t{4} << 20;

struct PairBuffer {
  uint32_t* data;
  std::unique_ptr<uint32_t[]> once;  // a buffer too large to keep
};

PairBuffer Pairs(size_t count) {
  thread_local std::unique_ptr<uint32_t[]> kept;
  thread_local size_t kept_size = 0;
  if (count > kKeptPairs) {
    std::unique_ptr<uint32_t[]> once(new uint32_t[count]);
    uint32_t* data = once.get();
    return {data, std::move(once)};
  }
  if (kept_size < count) {
    kept.reset();  // the old buffer goes before the larger one comes
    kept.reset(new uint32_t[count]);
    kept_size = count;
  }
  return {kept.get(), nullptr};
}

// Piece i of the pairing pass: (row, KV head, block of kPairBlock keys), keys and values.
void RunPairs(void* data, size_t index) {
  const Job& job = *static_cast<const Job*>(data);
  const Shape& s = job.shape;
  const int64_t blocks = job.span / kPairBlock + 1, d = s.head_dim;
  const int64_t head = static_cast<int64_t>(index) / blocks;  // row * kv_heads + kv
  const int64_t k0 = static_cast<int64_t>(index) % blocks * kPairBlock;
  const int64_t row = head / s.kv_heads;
  const int64_t end = job.past[row] + job.valid[row];
  if (k0 >= end || !PairedRow(job, row)) return;
  const int64_t n = std::min(kPairBlock, end - k0);
  const int64_t cache = head * s.capacity * d;
  uint32_t* value_pairs = job.value_pairs + (head * job.span + k0) / 2 * d;
  if (job.values16 != nullptr) {  // a bf16 cache: its keys are already pairs
    PairRows16(job.values16 + cache + k0 * d, d, n, d, value_pairs);
    return;
  }
  PairUp(job.keys + cache + k0 * d, n * d, job.key_pairs + (head * job.span + k0) * d / 2);
  PairRows(job.values + cache + k0 * d, d, n, d, value_pairs);
}
#endif

struct Both {
  Job* job;
  DecodeRows* decode;
};

void RunBoth(void* data, size_t index) {
  Both& both = *static_cast<Both*>(data);
  const size_t chunk_pieces = both.job->pieces.size();
  if (index < chunk_pieces)
    RunPiece(both.job, index);
  else
    both.decode->RunPiece(index - chunk_pieces);
}

OrtStatus* Compute(const Kernel& kernel, OrtKernelContext* context) {
  Tensor qkv, past_k, past_v, seqlens_t, total_t;
  EP_RETURN_IF_ERROR(Input(context, 0, &qkv));
  EP_RETURN_IF_ERROR(Input(context, 1, &past_k));
  EP_RETURN_IF_ERROR(Input(context, 2, &past_v));
  EP_RETURN_IF_ERROR(Input(context, 3, &seqlens_t));
  EP_RETURN_IF_ERROR(Input(context, 4, &total_t));
  if (past_k.dims.size() != 4)
    return Fail("PrefillAttention: past key and value must both be [rows, kv_heads, capacity, head_dim]");
  RotaryTables rotary;
  EP_RETURN_IF_ERROR(RotaryInputs(context, 5, past_k.dims[3], "PrefillAttention", &rotary));
  const float* sink = nullptr;
  EP_RETURN_IF_ERROR(SinkInput(context, 9, kernel.heads, "PrefillAttention", &sink));
  Shape s;
  EP_RETURN_IF_ERROR(CheckShapes(kernel, qkv, past_k, past_v, seqlens_t, total_t, rotary.rotary, &s));
  std::vector<int64_t> valid(s.rows, s.chunk), past(s.rows), first(s.rows);
  EP_RETURN_IF_ERROR(ValidLens(context, s, valid.data()));
  EP_RETURN_IF_ERROR(Places(context, kernel, s, seqlens_t, total_t, valid, &past, &first));
  for (int64_t row = 0; row < s.rows; ++row) {
    const int64_t end = past[row] + valid[row];
    if (past[row] < 0 || end > s.capacity || end > rotary.positions)
      return Fail("PrefillAttention: a row's chunk is outside the cache or the rotary table");
  }

  if (kernel.bf16_cache && !kernel.bf16)
    return Fail("PrefillAttentionBf16KV: a bf16 KV cache needs bf16=1");
  const int64_t d = s.head_dim, heads = kernel.heads;
  float *out = nullptr, *keys = nullptr, *values = nullptr;
  std::vector<int64_t> out_dims{s.rows, s.chunk, heads * d};
  if (kernel.packed) out_dims = {1, kernel.last ? s.rows : s.chunk, heads * d};
  EP_RETURN_IF_ERROR(Output(context, 0, out_dims, &out));
  EP_RETURN_IF_ERROR(Output(context, 1, past_k.dims, &keys));
  EP_RETURN_IF_ERROR(Output(context, 2, past_v.dims, &values));
  const size_t cache_bytes = static_cast<size_t>(s.rows * s.kv_heads * s.capacity * d) *
                             (kernel.bf16_cache ? sizeof(uint16_t) : sizeof(float));
  if (keys != past_k.data) std::memcpy(keys, past_k.data, cache_bytes);
  if (values != past_v.data) std::memcpy(values, past_v.data, cache_bytes);
  const Cache cache{keys, values, kernel.bf16_cache};

  const int64_t begin = Profiling() ? Now() : 0;
  Job job{s, kernel.scale, qkv.data, cache.bf16 ? nullptr : keys, cache.bf16 ? nullptr : values,
          s.capacity, rotary.cos, rotary.sin, past.data(), valid.data(), first.data(), out,
          UsesBf16(kernel.bf16),
          kernel.last, kernel.window, kernel.softcap, sink, kernel.interleaved};
  if (!kernel.packed) ZeroPadding(job);  // packed: no padding rows
  WriteCache(job, cache);
  if (cache.bf16 && !job.bf16) {  // a bf16 cache's chunk rows as float32 (Widen)
    const int64_t span = ChunkEnd(job);
    if (span > 0) {  // not in a decode step
      // Kept from call to call on this thread: a fresh buffer's pages fault in every call.
      thread_local std::vector<float> widened;
      const size_t count = static_cast<size_t>(s.rows * s.kv_heads * span * d);
      if (widened.size() < 2 * count) widened.resize(2 * count);
      Widen(job, cache, span, widened.data(), widened.data() + count);
      job.keys = widened.data();
      job.values = widened.data() + count;
      job.stride = span;
    }
  }
#ifdef __AVX512BF16__
  // Not zeroed (1.5 MB a call at 2,048 positions): only what RunPairs writes is ever read.
  PairBuffer pairs{nullptr, nullptr};
  if (job.bf16) {
    job.span = ChunkEnd(job);
    job.span += job.span & 1;  // even: whole pairs
  }
  if (job.span > 0) {  // not in a decode step: no row to pair, and no pass on the pool
    const size_t count = static_cast<size_t>(s.rows * s.kv_heads * job.span * d / 2);
    pairs = Pairs(cache.bf16 ? count : 2 * count);
    job.value_pairs = pairs.data;
    job.key_pairs = cache.bf16 ? static_cast<uint32_t*>(cache.keys) : pairs.data + count;
    job.key_span = cache.bf16 ? s.capacity : job.span;
    job.values16 = cache.bf16 ? static_cast<const uint16_t*>(cache.values) : nullptr;
    ParallelFor(context, RunPairs, static_cast<size_t>(s.rows * s.kv_heads * (job.span / kPairBlock + 1)), &job);
  }
#endif
  std::vector<int64_t> one_token, tokens, positions;
  for (int64_t row = 0; row < s.rows; ++row)
    if (OneToken(job, row)) {
      one_token.push_back(row);
      tokens.push_back(first[row]);
      positions.push_back(past[row]);
    }
  DecodeRows decode({heads, s.kv_heads, s.capacity, d, s.rotary, kernel.scale, kernel.window,
                     kernel.softcap, sink, kernel.interleaved}, qkv.data,
                    std::move(one_token), std::move(tokens), std::move(positions), cache,
                    rotary.cos, rotary.sin);
  job.pieces = Plan(job);
  if (Profiling()) job.times.resize(job.pieces.size());
  const int64_t pooled = Profiling() ? Now() : 0;
  Both both{&job, &decode};  // one pass of the pool: the chunk's pieces, then the decode rows'
  ParallelFor(context, RunBoth, job.pieces.size() + decode.Pieces(), &both);
  decode.Finish(out, kernel.last);  // last=1: each decode row's output at its row
  if (kernel.last) CopyToEmptyRows(job);
  if (Profiling()) Report(job, begin, pooled, pooled, Now());
  return nullptr;
}

OrtStatus* CreateKernel(const OrtKernelInfo* info, void** kernel) {
  return CreateAttentionKernel(info, "PrefillAttention", kernel);
}

OrtStatus* CreateBf16KvKernel(const OrtKernelInfo* info, void** kernel) {
  EP_RETURN_IF_ERROR(CreateAttentionKernel(info, "PrefillAttentionBf16KV", kernel));
  static_cast<Kernel*>(*kernel)->bf16_cache = true;
  return nullptr;
}

OrtStatus* ORT_API_CALL ComputeKernel(void* kernel, OrtKernelContext* context) {
  return Compute(*static_cast<Kernel*>(kernel), context);
}

void ORT_API_CALL DestroyKernel(void* kernel) { delete static_cast<Kernel*>(kernel); }

}  // namespace

const Op& PrefillAttentionOp() {
  OpSpec spec{"PrefillAttention", 10, 3, (1u << 3) | (1u << 4) | (1u << 7) | (1u << 8),
              CreateKernel, ComputeKernel, DestroyKernel};
  spec.optional_inputs = (1u << 5) | (1u << 6) | (1u << 7) | (1u << 8) | (1u << 9);
  static const Op op = MakeOp(spec);
  return op;
}

const Op& PrefillAttentionBf16KvOp() {
  OpSpec spec{"PrefillAttentionBf16KV", 10, 3, (1u << 3) | (1u << 4) | (1u << 7) | (1u << 8),
              CreateBf16KvKernel, ComputeKernel, DestroyKernel};
  spec.optional_inputs = (1u << 5) | (1u << 6) | (1u << 7) | (1u << 8) | (1u << 9);
  spec.uint16_inputs = spec.uint16_outputs = (1u << 1) | (1u << 2);
  static const Op op = MakeOp(spec);
  return op;
}

}  // namespace edgeprefill
