// edgeprefill.MatMulBf16: out = bf16(a) @ bf16(b), products summed in float32. It replaces
// a float32 bundle's projections at load when the user asks for bf16 compute
// (edgeprefill/engines/ort/bf16_compute.py): the weights are rounded to bf16 once, the
// activations on each call, and AVX512-BF16's vdpbf16ps does two multiply-adds per lane
// where an fp32 FMA does one. On a Zen 4 core that is 2x ONNX Runtime's fp32 MatMul for a
// prefill chunk (both near their instruction's peak, docs/benchmarks.md) and half the
// weight bytes for a decode step.
//
// Inputs:  0 a [..., K] float
//          1 b [P, K2, 64] int32: the [K, N] weight, rounded to bf16 and packed by
//            bf16_compute.py in panels of 64 columns (P = ceil(N / 64), K2 = ceil(K / 2));
//            each int32 holds the bf16 pair (k = 2 i, k = 2 i + 1) of one column, low half
//            first, zero past K, N
//          2 skip [..., K] float, 3 gamma [K] float (both with epsilon, else absent)
// Outputs: 0 out [..., N] float, or [..., N / 2] with gated=1
//          1 sum [..., K] float: a + skip (with epsilon, else absent)
// Attributes: N (int), the weight's true column count; epsilon (float, optional): the rows
//          multiplied are RMSNorm(a + skip) * gamma, the SkipRmsNorm before this op run
//          inside it (rms_norm.h, the same bits; kernels/rms_norm.py's fold_norms);
//          gated (int, optional): 1 when the
//          columns are an MLP's gate then up (N / 2 of each, whole panels): the output is
//          silu(gate) * up, swiglu.h's arithmetic on the same sums, so the same bits as this
//          op then SwiGlu, without the N columns' round trip (kernels/swiglu.py's fold_gated).
//
// Without AVX512-BF16 (AVX-512F alone, AVX2 with FMA, NEON) each packed pair is widened to
// two float32 vectors (a bf16 is the top half of a float: the low half shifted up, the high
// half masked) and multiplied by the activations, rounded to bf16 and kept as floats, with
// fp32 FMAs: the same operands and float32 sums, a prefill chunk at the fp32 FMA rate (no
// faster than ONNX Runtime's fp32 MatMul) and a decode step reading half the weight bytes.
// Elsewhere, portable loops, far slower than fp32: bf16_compute.py says which in `--stats`.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "float_vec.h"
#include "kernel_common.h"
#include "rms_norm.h"
#include "swiglu.h"

namespace edgeprefill {
namespace {

constexpr int64_t kPanel = 64;  // columns per packed panel: four 16-lane accumulators
static_assert(kPanel == kGatedPanel, "gated=1 is checked against this panel width");
#ifdef __AVX512BF16__
constexpr int64_t kRows = 6;  // rows per register tile: 6 x 4 accumulators + 4 B + 1 A
constexpr int64_t kWordsPerPair = 1;  // an activation pair as vdpbf16ps takes it
#else
constexpr int64_t kRows = 4;  // rows per register tile of the widening path (below)
constexpr int64_t kWordsPerPair = 2;  // an activation pair as two floats, bf16-rounded
#endif
constexpr int64_t kRowBlock = 48;  // rows per parallel piece (8 register tiles)

inline float FromBf16(uint32_t h) {
  const uint32_t u = h << 16;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

struct Job {
  const float* a;  // [M, K]
  const uint32_t* b;  // [P, K2, 64]
  uint32_t* pairs;  // [M, K2 * kWordsPerPair]: a rounded to bf16, as pairs or as floats
  float* out;  // [M, N], or [M, N / 2] when gated
  int64_t m, k, k2, n, panels, row_blocks;
  bool gated;
  NormRows norm;  // the norm inside, or all null
};

void ConvertRows(const Job& job, int64_t first, int64_t last) {
  std::vector<float> normed(job.norm.skip != nullptr ? job.k : 0);
  const int64_t stride = job.k2 * kWordsPerPair;
  for (int64_t r = first; r < last; ++r) {
    const float* row = NormedRow(job.norm, job.a, r, job.k, normed.data());
    if constexpr (kWordsPerPair == 1) {
      PairUp(row, job.k, job.pairs + r * stride);
    } else {  // the widening path multiplies floats: each one's bf16 value, 0 past K
      float* dst = reinterpret_cast<float*>(job.pairs + r * stride);
      for (int64_t i = 0; i < job.k; ++i) dst[i] = FromBf16(Bf16(row[i]));
      std::fill(dst + job.k, dst + stride, 0.0f);
    }
  }
}

#ifdef __AVX512BF16__
// rows x 64 columns of out from rows of pairs and one panel: the whole K in registers.
template <int kTile>
void Tile(const uint32_t* pairs, int64_t k2, const uint32_t* panel, float* out, int64_t n,
          int64_t columns) {
  __m512 acc[kTile][4];
  for (int r = 0; r < kTile; ++r)
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_ps();
  for (int64_t i = 0; i < k2; ++i) {
    const uint32_t* b = panel + i * kPanel;
    const __m512bh b0 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b));
    const __m512bh b1 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b + 16));
    const __m512bh b2 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b + 32));
    const __m512bh b3 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b + 48));
    for (int r = 0; r < kTile; ++r) {
      const __m512bh a = reinterpret_cast<__m512bh>(
          _mm512_set1_epi32(static_cast<int>(pairs[r * k2 + i])));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], a, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], a, b1);
      acc[r][2] = _mm512_dpbf16_ps(acc[r][2], a, b2);
      acc[r][3] = _mm512_dpbf16_ps(acc[r][3], a, b3);
    }
  }
  for (int r = 0; r < kTile; ++r)
    for (int j = 0; j < 4 && j * 16 < columns; ++j) {
      const int64_t left = columns - j * 16;
      const __mmask16 mask = left >= 16 ? 0xffff : static_cast<__mmask16>((1u << left) - 1);
      _mm512_mask_storeu_ps(out + r * n + j * 16, mask, acc[r][j]);
    }
}

void Rows(const uint32_t* pairs, int64_t k2, const uint32_t* panel, float* out, int64_t n,
          int64_t columns, int64_t rows) {
  int64_t r = 0;
  for (; r + kRows <= rows; r += kRows) Tile<kRows>(pairs + r * k2, k2, panel, out + r * n, n, columns);
  const uint32_t* p = pairs + r * k2;
  float* o = out + r * n;
  switch (rows - r) {
    case 5: Tile<5>(p, k2, panel, o, n, columns); break;
    case 4: Tile<4>(p, k2, panel, o, n, columns); break;
    case 3: Tile<3>(p, k2, panel, o, n, columns); break;
    case 2: Tile<2>(p, k2, panel, o, n, columns); break;
    case 1: Tile<1>(p, k2, panel, o, n, columns); break;
    default: break;
  }
}
#elif defined(__AVX512F__) || defined(EP_AVX2) || defined(EP_NEON)
// The widening path, on float_vec.h's vectors: Widen splits kLanes packed pairs into the
// low (even k) and high (odd k) weights as floats.
#if defined(__AVX512F__)
inline void Widen(const uint32_t* b, Vec* low, Vec* high) {
  const __m512i v = _mm512_loadu_si512(b);
  *low = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
  *high = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(-65536)));
}
#elif defined(EP_AVX2)
inline void Widen(const uint32_t* b, Vec* low, Vec* high) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
  *low = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  *high = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(-65536)));
}
#else  // EP_NEON
inline void Widen(const uint32_t* b, Vec* low, Vec* high) {
  const uint32x4_t v = vld1q_u32(b);
  *low = vreinterpretq_f32_u32(vshlq_n_u32(v, 16));
  *high = vreinterpretq_f32_u32(vandq_u32(v, vdupq_n_u32(0xffff0000u)));
}
#endif
// A tile of kTile rows spans kChains / kTile vectors of columns (at most the panel): each
// accumulator is a chain of dependent FMAs, and with fewer than kChains of them a decode
// row would wait on the FMA's latency instead of its throughput.
constexpr int Vectors(int rows) {
  return kChains / rows < kPanel / kLanes ? kChains / rows : kPanel / kLanes;
}

// kTile rows x up to Vectors(kTile) * kLanes columns of out, from rows of bf16-valued floats
// (k2 pairs each) and the panel's columns from `panel` on: the whole K in registers.
template <int kTile>
void Tile(const float* rows, int64_t k2, const uint32_t* panel, float* out, int64_t n,
          int64_t columns) {
  constexpr int kVecs = Vectors(kTile);
  Vec acc[kTile][kVecs];
  for (int r = 0; r < kTile; ++r)
    for (int j = 0; j < kVecs; ++j) acc[r][j] = Zero();
  // Registers besides the accumulators: the widened weights of every vector, or the
  // broadcast activations of every row, whichever are fewer (else the tile spills).
  for (int64_t i = 0; i < k2; ++i) {
    if constexpr (kVecs < kTile) {
      Vec low[kVecs], high[kVecs];
      for (int j = 0; j < kVecs; ++j) Widen(panel + i * kPanel + j * kLanes, &low[j], &high[j]);
      for (int r = 0; r < kTile; ++r) {
        const Vec a0 = Splat(rows[r * 2 * k2 + 2 * i]);
        const Vec a1 = Splat(rows[r * 2 * k2 + 2 * i + 1]);
        for (int j = 0; j < kVecs; ++j) acc[r][j] = Fma(a1, high[j], Fma(a0, low[j], acc[r][j]));
      }
    } else {
      Vec a0[kTile], a1[kTile];
      for (int r = 0; r < kTile; ++r) {
        a0[r] = Splat(rows[r * 2 * k2 + 2 * i]);
        a1[r] = Splat(rows[r * 2 * k2 + 2 * i + 1]);
      }
      for (int j = 0; j < kVecs; ++j) {
        Vec low, high;
        Widen(panel + i * kPanel + j * kLanes, &low, &high);
        for (int r = 0; r < kTile; ++r) acc[r][j] = Fma(a1[r], high, Fma(a0[r], low, acc[r][j]));
      }
    }
  }
  StoreTile<kTile, kVecs>(acc, out, n, columns);
}

// Tiles of kTile rows over the panel's `columns`, for rows [0, count) of `a`.
template <int kTile>
void TileRows(const float* a, int64_t k2, const uint32_t* panel, float* out, int64_t n,
              int64_t columns, int64_t count) {
  constexpr int64_t kWidth = Vectors(kTile) * kLanes;
  for (int64_t r = 0; r < count; r += kTile)
    for (int64_t c = 0; c < columns; c += kWidth)
      Tile<kTile>(a + r * 2 * k2, k2, panel + c, out + r * n + c, n,
                  std::min(kWidth, columns - c));
}

// Prefill rows (kSliceRows or more): each kSlice columns' weights are widened once into
// `slice` ([2 k2, kSlice] floats, in k order), then 6-row tiles of fp32 FMAs read them as
// a fp32 GEMM reads its packed weights, at the FMA's rate. Each sum runs over k in the same
// order as Tile's (k = 2i, then 2i + 1), so a row gets the same bits either way.
constexpr int64_t kSlice = kSliceVecs * kLanes;
constexpr int64_t kSliceRows = 6;
static_assert(kPanel % kSlice == 0, "a panel is whole slices");

template <int kTile>
void SliceTile(const float* a, int64_t k, const float* slice, float* out, int64_t n,
               int64_t columns) {
  Vec acc[kTile][kSliceVecs];
  for (int r = 0; r < kTile; ++r)
    for (int j = 0; j < kSliceVecs; ++j) acc[r][j] = Zero();
  for (int64_t i = 0; i < k; ++i) {
    Vec b[kSliceVecs];
    for (int j = 0; j < kSliceVecs; ++j) b[j] = Load(slice + i * kSlice + j * kLanes);
    for (int r = 0; r < kTile; ++r) {
      const Vec x = Splat(a[r * k + i]);
      for (int j = 0; j < kSliceVecs; ++j) acc[r][j] = Fma(x, b[j], acc[r][j]);
    }
  }
  StoreTile<kTile, kSliceVecs>(acc, out, n, columns);
}

void SliceRows(const float* a, int64_t k2, const uint32_t* panel, float* out, int64_t n,
               int64_t columns, int64_t rows) {
  thread_local std::vector<float> slice;
  const int64_t k = 2 * k2;
  slice.resize(static_cast<size_t>(k * kSlice));
  for (int64_t c = 0; c < columns; c += kSlice) {
    for (int64_t i = 0; i < k2; ++i)
      for (int j = 0; j < kSliceVecs; ++j) {
        Vec low, high;
        Widen(panel + i * kPanel + c + j * kLanes, &low, &high);
        Store(slice.data() + 2 * i * kSlice + j * kLanes, low);
        Store(slice.data() + (2 * i + 1) * kSlice + j * kLanes, high);
      }
    const int64_t width = std::min(kSlice, columns - c);
    int64_t r = 0;
    for (; r + kSliceRows <= rows; r += kSliceRows)
      SliceTile<kSliceRows>(a + r * k, k, slice.data(), out + r * n + c, n, width);
    const float* x = a + r * k;
    float* o = out + r * n + c;
    switch (rows - r) {
      case 5: SliceTile<5>(x, k, slice.data(), o, n, width); break;
      case 4: SliceTile<4>(x, k, slice.data(), o, n, width); break;
      case 3: SliceTile<3>(x, k, slice.data(), o, n, width); break;
      case 2: SliceTile<2>(x, k, slice.data(), o, n, width); break;
      case 1: SliceTile<1>(x, k, slice.data(), o, n, width); break;
      default: break;
    }
  }
}

void Rows(const uint32_t* pairs, int64_t k2, const uint32_t* panel, float* out, int64_t n,
          int64_t columns, int64_t rows) {
  const float* a = reinterpret_cast<const float*>(pairs);
  if (rows >= kSliceRows) return SliceRows(a, k2, panel, out, n, columns, rows);
  // Decode rows: the packed pairs widened as they are read, once per tile.
  const int64_t whole = rows - rows % kRows;
  TileRows<kRows>(a, k2, panel, out, n, columns, whole);
  a += whole * 2 * k2;
  out += whole * n;
  switch (rows - whole) {
    case 3: TileRows<3>(a, k2, panel, out, n, columns, 3); break;
    case 2: TileRows<2>(a, k2, panel, out, n, columns, 2); break;
    case 1: TileRows<1>(a, k2, panel, out, n, columns, 1); break;
    default: break;
  }
}
#else
void Rows(const uint32_t* pairs, int64_t k2, const uint32_t* panel, float* out, int64_t n,
          int64_t columns, int64_t rows) {
  const float* a = reinterpret_cast<const float*>(pairs);  // bf16 values as floats
  std::vector<float> acc(kPanel);
  for (int64_t r = 0; r < rows; ++r) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t i = 0; i < k2; ++i) {
      const float a0 = a[r * 2 * k2 + 2 * i], a1 = a[r * 2 * k2 + 2 * i + 1];
      const uint32_t* b = panel + i * kPanel;
      for (int64_t j = 0; j < columns; ++j)
        acc[j] += a0 * FromBf16(b[j] & 0xffffu) + a1 * FromBf16(b[j] >> 16);
    }
    std::copy(acc.begin(), acc.begin() + columns, out + r * n);
  }
}
#endif

// Piece i: rows [block * kRowBlock, +kRowBlock) of panel p, i = block * panels + p (a
// thread's run of pieces reuses one block of rows, in L2, across the panels).
void RunPiece(void* data, size_t index) {
  const Job& job = *static_cast<const Job*>(data);
  const int64_t block = static_cast<int64_t>(index) / job.panels;
  const int64_t p = static_cast<int64_t>(index) % job.panels;
  const int64_t first = block * kRowBlock;
  const int64_t rows = std::min(kRowBlock, job.m - first);
  const int64_t columns = std::min(kPanel, job.n - p * kPanel);
  Rows(job.pairs + first * job.k2 * kWordsPerPair, job.k2,
       job.b + p * job.k2 * kPanel, job.out + first * job.n + p * kPanel, job.n, columns, rows);
}

// gated=1: swiglu.h's GatedPiece over this op's panels.
void RunGatedPiece(void* data, size_t index) {
  const Job& job = *static_cast<const Job*>(data);
  GatedPiece<kPanel, kRowBlock>(
      index, job.m, job.panels, job.out,
      [&job](int64_t first, int64_t rows, int64_t q, float* dst) {
        Rows(job.pairs + first * job.k2 * kWordsPerPair, job.k2,
             job.b + q * job.k2 * kPanel, dst, kPanel, kPanel, rows);
      });
}

void RunConvert(void* data, size_t index) {
  const Job& job = *static_cast<const Job*>(data);
  const int64_t first = static_cast<int64_t>(index) * kPrepareRows;
  ConvertRows(job, first, std::min(job.m, first + kPrepareRows));
}

OrtStatus* Compute(void* state, OrtKernelContext* context) {
  const int64_t n = static_cast<Columns*>(state)->n;
  const bool gated = static_cast<Columns*>(state)->gated;
  Tensor a, b;
  EP_RETURN_IF_ERROR(Input(context, 0, &a));
  EP_RETURN_IF_ERROR(Input(context, 1, &b));
  if (a.dims.empty() || b.dims.size() != 3 || b.dims[2] != kPanel)
    return Fail("MatMulBf16: expects a [..., K] and a packed weight [P, K2, 64]");
  const int64_t k = a.dims.back();
  NormRows norm;
  EP_RETURN_IF_ERROR(
      NormInputs(context, *static_cast<Columns*>(state), a, 2, "MatMulBf16", &norm));
  if (b.dims[1] != (k + 1) / 2 || b.dims[0] != (n + kPanel - 1) / kPanel)
    return Fail(("MatMulBf16: the packed weight " + std::to_string(b.dims[0]) + "x" +
                 std::to_string(b.dims[1]) + "x64 does not fit K=" + std::to_string(k) +
                 ", N=" + std::to_string(n)).c_str());
  float* out = nullptr;
  int64_t m = 0;
  EP_RETURN_IF_ERROR(RowsOutput(context, a, gated ? n / 2 : n, &out, &m));
  if (m == 0) return nullptr;
  std::vector<uint32_t> pairs(static_cast<size_t>(m * b.dims[1] * kWordsPerPair));
  Job job{a.data, reinterpret_cast<const uint32_t*>(b.data), pairs.data(), out, m, k,
          b.dims[1], n, b.dims[0], (m + kRowBlock - 1) / kRowBlock, gated, norm};
  const bool split = WorthSplitting(m, k, n);
  const int64_t pieces = job.row_blocks * (gated ? job.panels / 2 : job.panels);
  ProjectRows(context, split, m, RunConvert, static_cast<size_t>(pieces),
              gated ? RunGatedPiece : RunPiece, &job);
  return nullptr;
}

OrtStatus* CreateKernel(const OrtKernelInfo* info, void** kernel) {
  return CreateColumnsKernel(info, "MatMulBf16", kernel);
}

OrtStatus* ORT_API_CALL ComputeKernel(void* kernel, OrtKernelContext* context) {
  return Compute(kernel, context);
}

}  // namespace

const Op& MatMulBf16Op() {
  // inputs: a float, b int32 (bf16 pairs), skip and gamma float (optional); outputs: out,
  // sum (optional)
  static const Op op = [] {
    OpSpec spec{"MatMulBf16", 4, 2, 0b10u, CreateKernel, ComputeKernel, DestroyColumnsKernel};
    spec.optional_inputs = 0b1100u;
    spec.optional_outputs = 0b10u;
    return MakeOp(spec);
  }();
  return op;
}

}  // namespace edgeprefill
