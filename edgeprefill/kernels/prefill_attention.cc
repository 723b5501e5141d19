// edgeprefill.PrefillAttention: causal grouped-query attention of a chunk of tokens per row
// over a fixed-capacity KV cache, flash-attention style (library.cc registers it).
//
// It computes what com.microsoft.GroupQueryAttention computes for a chunk of S > 1 tokens
// (packed q/k/v, non-interleaved rotary inside, the chunk's keys and values written into the
// cache at the row's past length) without the S x total score matrix GroupQueryAttention
// writes out per query head: one piece of work is a block of queries of ALL query heads of
// one KV group, which walks the keys block by block (a key block is read once for the whole
// group), keeps a running max and sum per query (online softmax), and stops at the causal
// diagonal. Pieces (row, KV head, query block) run on ONNX Runtime's intra-op pool, the
// longest first. The inner products are register-blocked AVX-512 (a portable loop nest
// where the build has no AVX-512).
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
//          5 cos [P, R / 2] float, 6 sin [P, R / 2] float   rotary tables (R <= D)
// Outputs: 0 out [B, S, H * D] float, 1 present_key, 2 present_value (same shape as past;
//          when bound to the past buffers nothing is copied, else the past is copied first)
// Attributes: num_heads, kv_num_heads (int), scale (float).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "kernel_common.h"

namespace edgeprefill {
namespace {

constexpr int64_t kQueryBlock = 32;  // queries per piece (x the group's heads = tile rows)
constexpr int64_t kKeyBlock = 64;    // keys per step: 4 AVX-512 registers of scores
constexpr int kTileRows = 6;         // register block: 6 rows x 4 vectors = 24 accumulators
constexpr int kVec = 16;

struct Kernel {
  int64_t heads;
  int64_t kv_heads;
  float scale;
};

struct Shape {
  int64_t rows, chunk, kv_heads, capacity, head_dim, group, rotary;
};

struct Piece {
  int64_t row, kv, first;  // first query of the block
  int64_t work;            // keys x queries, to order the pieces longest first
};

struct Job {
  Shape shape;
  float scale;
  const float* qkv;
  const float* keys;
  const float* values;
  const float* cos;
  const float* sin;
  const int64_t* past;  // per row
  float* out;
  std::vector<Piece> pieces;
};

// scores[r][0..64) = q[r] . kt[:, 0..64) for R rows; kt is [D][64] (keys transposed).
template <int R>
void ScoreTile(const float* q, const float* kt, float* scores, int64_t d) {
#ifdef __AVX512F__
  __m512 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t k = 0; k < d; ++k) {
    const float* krow = kt + k * kKeyBlock;
    const __m512 k0 = _mm512_loadu_ps(krow), k1 = _mm512_loadu_ps(krow + 16);
    const __m512 k2 = _mm512_loadu_ps(krow + 32), k3 = _mm512_loadu_ps(krow + 48);
    for (int r = 0; r < R; ++r) {
      const __m512 b = _mm512_set1_ps(q[r * d + k]);
      acc[r][0] = _mm512_fmadd_ps(b, k0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(b, k1, acc[r][1]);
      acc[r][2] = _mm512_fmadd_ps(b, k2, acc[r][2]);
      acc[r][3] = _mm512_fmadd_ps(b, k3, acc[r][3]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) _mm512_storeu_ps(scores + r * kKeyBlock + c * kVec, acc[r][c]);
#else
  float acc[R][kKeyBlock] = {};
  for (int64_t k = 0; k < d; ++k)
    for (int r = 0; r < R; ++r) {
      const float b = q[r * d + k];
      for (int j = 0; j < kKeyBlock; ++j) acc[r][j] += b * kt[k * kKeyBlock + j];
    }
  for (int r = 0; r < R; ++r) std::memcpy(scores + r * kKeyBlock, acc[r], sizeof acc[r]);
#endif
}

// out[r][c0..c0+16C) += sum_j p[r][j] v[j][c0..]: R rows, C vectors of the head dims.
template <int R, int C>
void ValueTile(const float* p, const float* v, float* out, int64_t n, int64_t d) {
#ifdef __AVX512F__
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_loadu_ps(out + r * d + c * kVec);
  for (int64_t j = 0; j < n; ++j) {
    __m512 vv[C];
    for (int c = 0; c < C; ++c) vv[c] = _mm512_loadu_ps(v + j * d + c * kVec);
    for (int r = 0; r < R; ++r) {
      const __m512 b = _mm512_set1_ps(p[r * kKeyBlock + j]);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(b, vv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(out + r * d + c * kVec, acc[r][c]);
#else
  for (int64_t j = 0; j < n; ++j)
    for (int r = 0; r < R; ++r) {
      const float b = p[r * kKeyBlock + j];
      for (int k = 0; k < C * kVec; ++k) out[r * d + k] += b * v[j * d + k];
    }
#endif
}

template <int R>
void ValueRows(const float* p, const float* v, float* out, int64_t n, int64_t d) {
  for (int64_t c0 = 0; c0 < d; c0 += 4 * kVec) {
    switch (std::min<int64_t>(4, (d - c0) / kVec)) {
      case 4: ValueTile<R, 4>(p, v + c0, out + c0, n, d); break;
      case 3: ValueTile<R, 3>(p, v + c0, out + c0, n, d); break;
      case 2: ValueTile<R, 2>(p, v + c0, out + c0, n, d); break;
      default: ValueTile<R, 1>(p, v + c0, out + c0, n, d); break;
    }
  }
}

// Applies a row-blocked kernel to `rows` rows: full tiles of kTileRows, then the rest.
template <template <int> class F, typename... Args>
void ForRowTiles(int64_t rows, int64_t q_stride, int64_t out_stride, const float* q, float* out,
                 Args... args) {
  int64_t r = 0;
  for (; r + kTileRows <= rows; r += kTileRows)
    F<kTileRows>::Run(q + r * q_stride, out + r * out_stride, args...);
  switch (rows - r) {
    case 5: F<5>::Run(q + r * q_stride, out + r * out_stride, args...); break;
    case 4: F<4>::Run(q + r * q_stride, out + r * out_stride, args...); break;
    case 3: F<3>::Run(q + r * q_stride, out + r * out_stride, args...); break;
    case 2: F<2>::Run(q + r * q_stride, out + r * out_stride, args...); break;
    case 1: F<1>::Run(q + r * q_stride, out + r * out_stride, args...); break;
    default: break;
  }
}

template <int R>
struct Scores {
  static void Run(const float* q, float* scores, const float* kt, int64_t d) {
    ScoreTile<R>(q, kt, scores, d);
  }
};

template <int R>
struct Values {
  static void Run(const float* p, float* out, const float* v, int64_t n, int64_t d) {
    ValueRows<R>(p, v, out, n, d);
  }
};

#ifdef __AVX512F__
inline __m512 ExpNonPositive16(__m512 x) {  // ExpNonPositive, 16 lanes
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}
#endif

// One query row's step of the online softmax over a key block: scores[0..valid) become
// exp(score - new max), the rest 0; returns their sum; `top` is updated, and the factor
// the row's earlier output and sum must be scaled by is returned in *rescale.
inline float SoftmaxStep(float* scores, int64_t valid, float* top, float* rescale) {
#ifdef __AVX512F__
  __m512 m = _mm512_set1_ps(-INFINITY);
  for (int64_t j = 0; j < kKeyBlock; j += kVec) {
    const int64_t left = std::clamp<int64_t>(valid - j, 0, kVec);
    const __mmask16 mask = static_cast<__mmask16>((1u << left) - 1u);
    m = _mm512_mask_max_ps(m, mask, m, _mm512_loadu_ps(scores + j));
  }
  const float block_top = _mm512_reduce_max_ps(m);
  const float new_top = std::max(*top, block_top);
  *rescale = *top == -INFINITY ? 0.0f : ExpNonPositive(*top - new_top);
  *top = new_top;
  const __m512 shift = _mm512_set1_ps(new_top);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < kKeyBlock; j += kVec) {
    const int64_t left = std::clamp<int64_t>(valid - j, 0, kVec);
    const __mmask16 mask = static_cast<__mmask16>((1u << left) - 1u);
    const __m512 e = _mm512_maskz_mov_ps(
        mask, ExpNonPositive16(_mm512_sub_ps(_mm512_loadu_ps(scores + j), shift)));
    _mm512_storeu_ps(scores + j, e);
    sum = _mm512_add_ps(sum, e);
  }
  return _mm512_reduce_add_ps(sum);
#else
  float block_top = -INFINITY;
  for (int64_t j = 0; j < valid; ++j) block_top = std::max(block_top, scores[j]);
  const float new_top = std::max(*top, block_top);
  *rescale = *top == -INFINITY ? 0.0f : ExpNonPositive(*top - new_top);
  *top = new_top;
  float sum = 0.0f;
  for (int64_t j = 0; j < kKeyBlock; ++j) {
    const float e = ExpNonPositive(scores[j] - new_top);
    scores[j] = j < valid ? e : 0.0f;
    sum += scores[j];
  }
  return sum;
#endif
}

void RunPiece(void* data, size_t index) {
  const Job& job = *static_cast<const Job*>(data);
  const Shape& s = job.shape;
  const Piece& piece = job.pieces[index];
  const int64_t d = s.head_dim, g = s.group, half = s.rotary / 2;
  const int64_t heads = s.kv_heads * g, width = (heads + 2 * s.kv_heads) * d;
  const int64_t past = job.past[piece.row];
  const int64_t queries = std::min(kQueryBlock, s.chunk - piece.first);
  const int64_t rows = queries * g;  // tile row m = query (m / g), head (m % g) of the group

  std::vector<float> buffer(rows * d * 2 + rows * kKeyBlock + d * kKeyBlock + rows * 2);
  float* q = buffer.data();          // [rows, D] rotated, scaled queries
  float* acc = q + rows * d;          // [rows, D] unnormalized output
  float* scores = acc + rows * d;     // [rows, 64]
  float* kt = scores + rows * kKeyBlock;  // [D, 64] the key block transposed
  float* top = kt + d * kKeyBlock;    // [rows] running max
  float* total = top + rows;          // [rows] running sum
  for (int64_t i = 0; i < queries; ++i) {
    const int64_t token = piece.first + i, position = past + token;
    const float* packed = job.qkv + (piece.row * s.chunk + token) * width;
    for (int64_t h = 0; h < g; ++h) {
      float* row = q + (i * g + h) * d;
      Rotate(packed + (piece.kv * g + h) * d, row, job.cos + position * half,
             job.sin + position * half, d, s.rotary);
      for (int64_t k = 0; k < d; ++k) row[k] *= job.scale;
    }
  }
  std::fill(acc, acc + rows * d, 0.0f);
  std::fill(top, top + rows, -INFINITY);
  std::fill(total, total + rows, 0.0f);

  const int64_t cache_offset = (piece.row * s.kv_heads + piece.kv) * s.capacity * d;
  const float* keys = job.keys + cache_offset;
  const float* values = job.values + cache_offset;
  const int64_t first_position = past + piece.first;
  const int64_t end = first_position + queries;  // keys [0, end) are seen by some query
  for (int64_t k0 = 0; k0 < end; k0 += kKeyBlock) {
    const int64_t n = std::min(kKeyBlock, end - k0);
    for (int64_t j = 0; j < n; ++j)
      for (int64_t k = 0; k < d; ++k) kt[k * kKeyBlock + j] = keys[(k0 + j) * d + k];
    for (int64_t j = n; j < kKeyBlock; ++j)
      for (int64_t k = 0; k < d; ++k) kt[k * kKeyBlock + j] = 0.0f;
    ForRowTiles<Scores>(rows, d, kKeyBlock, q, scores, kt, d);
    for (int64_t m = 0; m < rows; ++m) {
      // Causal: the query at position p sees keys 0..p.
      const int64_t valid = std::min(n, first_position + m / g + 1 - k0);
      float* p = scores + m * kKeyBlock;
      if (valid <= 0) {
        std::fill(p, p + kKeyBlock, 0.0f);
        continue;
      }
      float rescale = 1.0f;
      const float sum = SoftmaxStep(p, valid, top + m, &rescale);
      total[m] = total[m] * rescale + sum;
      if (rescale != 1.0f)
        for (int64_t k = 0; k < d; ++k) acc[m * d + k] *= rescale;
    }
    ForRowTiles<Values>(rows, kKeyBlock, d, scores, acc, values + k0 * d, n, d);
  }
  for (int64_t i = 0; i < queries; ++i) {
    float* out = job.out + ((piece.row * s.chunk + piece.first + i) * heads + piece.kv * g) * d;
    for (int64_t h = 0; h < g; ++h) {
      const float inverse = 1.0f / total[i * g + h];
      for (int64_t k = 0; k < d; ++k) out[h * d + k] = acc[(i * g + h) * d + k] * inverse;
    }
  }
}

OrtStatus* CheckShapes(const Kernel& kernel, const Tensor& qkv, const Tensor& past_k,
                       const Tensor& past_v, const Tensor& seqlens, const Tensor& total,
                       const Tensor& cos, const Tensor& sin, Shape* shape) {
  if (qkv.dims.size() != 3)
    return Fail("PrefillAttention: qkv must be [rows, chunk, (heads + 2 kv_heads) * head_dim]");
  if (past_k.dims.size() != 4 || past_k.dims != past_v.dims)
    return Fail("PrefillAttention: past key and value must both be [rows, kv_heads, capacity, head_dim]");
  const int64_t d = past_k.dims[3];
  if (past_k.dims[0] != qkv.dims[0] || past_k.dims[1] != kernel.kv_heads ||
      qkv.dims[2] != (kernel.heads + 2 * kernel.kv_heads) * d)
    return Fail("PrefillAttention: qkv and the cache disagree on rows, heads or head_dim");
  if (d % kVec != 0 || kernel.heads % kernel.kv_heads != 0)
    return Fail("PrefillAttention: head_dim must be a multiple of 16 and heads of kv_heads");
  if (seqlens.dims.size() != 1 || seqlens.dims[0] != qkv.dims[0])
    return Fail("PrefillAttention: seqlens_k must be [rows]");
  if (!(total.dims.empty() || (total.dims.size() == 1 && total.dims[0] == 1)))
    return Fail("PrefillAttention: total_sequence_length must be a scalar");
  if (cos.dims.size() != 2 || cos.dims != sin.dims || cos.dims[1] < 1 || cos.dims[1] * 2 > d)
    return Fail("PrefillAttention: cos and sin must be [positions, rotary_dim / 2], rotary_dim <= head_dim");
  *shape = {qkv.dims[0], qkv.dims[1], kernel.kv_heads, past_k.dims[2], d,
            kernel.heads / kernel.kv_heads, 2 * cos.dims[1]};
  return nullptr;
}

// Writes the chunk's rotated keys and its values into the cache at each row's past length.
void WriteCache(const Job& job, float* keys, float* values) {
  const Shape& s = job.shape;
  const int64_t d = s.head_dim, half = s.rotary / 2, heads = s.kv_heads * s.group;
  const int64_t width = (heads + 2 * s.kv_heads) * d;
  for (int64_t row = 0; row < s.rows; ++row)
    for (int64_t token = 0; token < s.chunk; ++token) {
      const int64_t position = job.past[row] + token;
      const float* packed = job.qkv + (row * s.chunk + token) * width;
      for (int64_t kv = 0; kv < s.kv_heads; ++kv) {
        const int64_t at = ((row * s.kv_heads + kv) * s.capacity + position) * d;
        Rotate(packed + (heads + kv) * d, keys + at, job.cos + position * half,
               job.sin + position * half, d, s.rotary);
        std::memcpy(values + at, packed + (heads + s.kv_heads + kv) * d, d * sizeof(float));
      }
    }
}

std::vector<Piece> Plan(const Shape& s, const int64_t* past) {
  std::vector<Piece> pieces;
  for (int64_t row = 0; row < s.rows; ++row)
    for (int64_t first = 0; first < s.chunk; first += kQueryBlock) {
      const int64_t queries = std::min(kQueryBlock, s.chunk - first);
      const int64_t work = queries * (past[row] + first + (queries + 1) / 2);
      for (int64_t kv = 0; kv < s.kv_heads; ++kv) pieces.push_back({row, kv, first, work});
    }
  // Longest first: the pool hands pieces out in order, so the short ones fill the gaps.
  std::stable_sort(pieces.begin(), pieces.end(),
                   [](const Piece& a, const Piece& b) { return a.work > b.work; });
  return pieces;
}

OrtStatus* Compute(const Kernel& kernel, OrtKernelContext* context) {
  Tensor qkv, past_k, past_v, seqlens_t, total_t, cos, sin;
  EP_RETURN_IF_ERROR(Input(context, 0, &qkv));
  EP_RETURN_IF_ERROR(Input(context, 1, &past_k));
  EP_RETURN_IF_ERROR(Input(context, 2, &past_v));
  EP_RETURN_IF_ERROR(Input(context, 3, &seqlens_t));
  EP_RETURN_IF_ERROR(Input(context, 4, &total_t));
  EP_RETURN_IF_ERROR(Input(context, 5, &cos));
  EP_RETURN_IF_ERROR(Input(context, 6, &sin));
  Shape s;
  EP_RETURN_IF_ERROR(CheckShapes(kernel, qkv, past_k, past_v, seqlens_t, total_t, cos, sin, &s));
  const int32_t* seqlens = reinterpret_cast<const int32_t*>(seqlens_t.data);
  const int64_t total = *reinterpret_cast<const int32_t*>(total_t.data);
  std::vector<int64_t> past(s.rows);
  for (int64_t row = 0; row < s.rows; ++row) {
    past[row] = total == s.chunk ? 0 : int64_t{seqlens[row]} + 1 - s.chunk;
    if (past[row] < 0 || past[row] + s.chunk > s.capacity || past[row] + s.chunk > cos.dims[0])
      return Fail("PrefillAttention: a row's chunk is outside the cache or the rotary table");
  }

  const int64_t d = s.head_dim, heads = kernel.heads;
  float *out = nullptr, *keys = nullptr, *values = nullptr;
  EP_RETURN_IF_ERROR(Output(context, 0, {s.rows, s.chunk, heads * d}, &out));
  EP_RETURN_IF_ERROR(Output(context, 1, past_k.dims, &keys));
  EP_RETURN_IF_ERROR(Output(context, 2, past_v.dims, &values));
  const size_t cache_floats = static_cast<size_t>(s.rows * s.kv_heads * s.capacity * d);
  if (keys != past_k.data) std::memcpy(keys, past_k.data, cache_floats * sizeof(float));
  if (values != past_v.data) std::memcpy(values, past_v.data, cache_floats * sizeof(float));

  Job job{s, kernel.scale, qkv.data, keys, values, cos.data, sin.data, past.data(), out, {}};
  WriteCache(job, keys, values);
  job.pieces = Plan(s, past.data());
  ParallelFor(context, RunPiece, job.pieces.size(), &job);
  return nullptr;
}

OrtStatus* CreateKernel(const OrtKernelInfo* info, void** kernel) {
  int64_t heads = 0, kv_heads = 0;
  float scale = 0.0f;
  EP_RETURN_IF_ERROR(g_api->KernelInfoGetAttribute_int64(info, "num_heads", &heads));
  EP_RETURN_IF_ERROR(g_api->KernelInfoGetAttribute_int64(info, "kv_num_heads", &kv_heads));
  EP_RETURN_IF_ERROR(g_api->KernelInfoGetAttribute_float(info, "scale", &scale));
  if (heads <= 0 || kv_heads <= 0 || heads % kv_heads != 0)
    return Fail("PrefillAttention: num_heads must be a positive multiple of kv_num_heads");
  *kernel = new Kernel{heads, kv_heads, scale};
  return nullptr;
}

OrtStatus* ORT_API_CALL ComputeKernel(void* kernel, OrtKernelContext* context) {
  return Compute(*static_cast<Kernel*>(kernel), context);
}

void ORT_API_CALL DestroyKernel(void* kernel) { delete static_cast<Kernel*>(kernel); }

}  // namespace

const Op& PrefillAttentionOp() {
  static const Op op = MakeOp({"PrefillAttention", 7, 3, (1u << 3) | (1u << 4), CreateKernel,
                               ComputeKernel, DestroyKernel});
  return op;
}

}  // namespace edgeprefill
