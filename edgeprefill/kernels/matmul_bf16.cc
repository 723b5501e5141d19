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
// Without AVX512-BF16 the same numbers (bf16 inputs, float32 sums) come from portable
// loops, far slower than fp32: bf16_compute.py says so in `--stats`.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernel_common.h"
#include "rms_norm.h"
#include "swiglu.h"

namespace edgeprefill {
namespace {

constexpr int64_t kPanel = 64;  // columns per packed panel: four 16-lane accumulators
static_assert(kPanel == kGatedPanel, "gated=1 is checked against this panel width");
constexpr int64_t kRows = 6;  // rows per register tile: 6 x 4 accumulators + 4 B + 1 A
constexpr int64_t kRowBlock = 48;  // rows per parallel piece (8 register tiles)
// Below both, the pool's hand-out costs more than it saves: a chunk's multiply-adds, or a
// decode step's weight bytes (one row is bound by reading them).
constexpr int64_t kMinFlopsToSplit = 1 << 20;
constexpr int64_t kMinWeightsToSplit = 1 << 16;

inline float FromBf16(uint32_t h) {
  const uint32_t u = h << 16;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

struct Job {
  const float* a;  // [M, K]
  const uint32_t* b;  // [P, K2, 64]
  uint32_t* pairs;  // [M, K2]: a rounded to bf16 pairs
  float* out;  // [M, N], or [M, N / 2] when gated
  int64_t m, k, k2, n, panels, row_blocks;
  bool gated;
  NormRows norm;  // the norm inside, or all null
};

void ConvertRows(const Job& job, int64_t first, int64_t last) {
  std::vector<float> normed(job.norm.skip != nullptr ? job.k : 0);
  for (int64_t r = first; r < last; ++r)
    PairUp(NormedRow(job.norm, job.a, r, job.k, normed.data()), job.k, job.pairs + r * job.k2);
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
#else
void Rows(const uint32_t* pairs, int64_t k2, const uint32_t* panel, float* out, int64_t n,
          int64_t columns, int64_t rows) {
  std::vector<float> acc(kPanel);
  for (int64_t r = 0; r < rows; ++r) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t i = 0; i < k2; ++i) {
      const uint32_t a = pairs[r * k2 + i];
      const float a0 = FromBf16(a & 0xffffu), a1 = FromBf16(a >> 16);
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
  Rows(job.pairs + first * job.k2, job.k2, job.b + p * job.k2 * kPanel,
       job.out + first * job.n + p * kPanel, job.n, columns, rows);
}

// gated=1: swiglu.h's GatedPiece over this op's panels.
void RunGatedPiece(void* data, size_t index) {
  const Job& job = *static_cast<const Job*>(data);
  GatedPiece<kPanel, kRowBlock>(
      index, job.m, job.panels, job.out,
      [&job](int64_t first, int64_t rows, int64_t q, float* dst) {
        Rows(job.pairs + first * job.k2, job.k2, job.b + q * job.k2 * kPanel, dst, kPanel,
             kPanel, rows);
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
  std::vector<uint32_t> pairs(static_cast<size_t>(m * b.dims[1]));
  Job job{a.data, reinterpret_cast<const uint32_t*>(b.data), pairs.data(), out, m, k,
          b.dims[1], n, b.dims[0], (m + kRowBlock - 1) / kRowBlock, gated, norm};
  const bool split = 2 * m * k * n >= kMinFlopsToSplit || k * n >= kMinWeightsToSplit;
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
