// edgeprefill.MatMulF32: out = a @ b in float32, the weight in panels. It replaces a float32
// bundle's projections at load where the native kernels run (edgeprefill/engines/ort/
// f32_projections.py): a decode step reads each weight once for its few rows, and ONNX
// Runtime's MatMul (MLAS) reads a [1 x K] . [K x N] product at about half the bandwidth a
// BLAS GEMV gets on the same cores (25 against 48 GB/s on a Zen 3, docs/benchmarks.md).
// Here a decode row streams its panels through as many accumulators as the registers
// allow, and several rows share each weight they read.
//
// Inputs:  0 a [..., K] float
//          1 b [P, 4, K, 16] float: the [K, N] weight in panels of 64 columns (P = ceil(N /
//            64)), each stored as four column strips of 16, a strip's K rows one after
//            another (64 bytes each: a tile streams whole cache lines), zero past N
//          2 skip [..., K] float, 3 gamma [K] float (both with epsilon, else absent)
// Outputs: 0 out [..., N] float, or [..., N / 2] with gated=1
//          1 sum [..., K] float: a + skip (with epsilon, else absent)
// Attributes: N, epsilon, gated as MatMulBf16's (matmul_bf16.cc): the SkipRmsNorm before
//          and the SwiGlu after it run inside, the same bits as those ops around this one.
//
// Every output is one float32 accumulator summing k = 0, 1, ..., K - 1 with FMAs, whichever
// path computes it (a decode tile, a prefill tile over blocks of K, the portable loop), so
// a row gets the same bits alone, beside other rows or in a prefill chunk.

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "float_vec.h"
#include "kernel_common.h"
#include "rms_norm.h"
#include "swiglu.h"

namespace edgeprefill {
namespace {

constexpr int64_t kPanel = 64;  // columns per panel
constexpr int64_t kStrip = 16;  // columns per strip: a strip's row is one 64-byte line
static_assert(kPanel == kGatedPanel, "gated=1 is checked against this panel width");
constexpr int64_t kRowBlock = 48;  // rows per parallel piece

struct Job {
  const float* a;  // [M, K]: the rows multiplied (normed into `normed` with the norm inside)
  const float* b;  // [P, 4, K, 16]
  float* out;  // [M, N], or [M, N / 2] when gated
  int64_t m, k, n, panels, row_blocks;
  bool gated;
  NormRows norm;  // the norm inside, or all null
  float* normed;  // [M, K] with the norm inside
};

#ifdef EP_FLOAT_VEC
constexpr int64_t kDecodeRows = 4;  // rows per decode tile; 6 or more rows take the slices
constexpr int64_t kSliceRows = 6;
constexpr int64_t kSlice = kSliceVecs * kLanes;  // columns per prefill tile
// Prefill tiles can run over K in blocks (the sums go through `out` between blocks, which
// keeps their order and bits); kKBlock is past any model's K, so today they run it whole.
constexpr int64_t kKBlock = 100000;
static_assert(kPanel % kSlice == 0, "a panel is whole slices");

// A decode tile of kTile rows spans kChains / kTile vectors of columns (at most the panel):
// with fewer chains of dependent FMAs one row would wait on the FMA's latency.
constexpr int Vectors(int rows) {
  return kChains / rows < kPanel / kLanes ? kChains / rows : kPanel / kLanes;
}

// Column c's weight of row 0 in a panel of K rows (a vector's kLanes columns never cross a
// strip: kStrip is a multiple of every kLanes).
static_assert(kStrip % kLanes == 0, "a vector stays in its strip");
inline const float* At(const float* panel, int64_t k, int64_t c) {
  return panel + (c / kStrip) * k * kStrip + c % kStrip;
}

// kTile rows x up to Vectors(kTile) * kLanes columns of out from the panel's columns from
// `panel` on: the whole K in registers, each weight read once for all the tile's rows.
// `ahead`: the panel whose lines a tile one strip wide asks for meanwhile (Ahead()).
template <int kTile>
void Tile(const float* a, int64_t k, const float* panel, int64_t c0, float* out, int64_t n,
          int64_t columns, const float* ahead) {
  constexpr int kVecs = Vectors(kTile);
  Vec acc[kTile][kVecs];
  for (int r = 0; r < kTile; ++r)
    for (int j = 0; j < kVecs; ++j) acc[r][j] = Zero();
  const float* column[kVecs];  // each vector's first weight: its strip, its lanes
  for (int j = 0; j < kVecs; ++j) column[j] = At(panel, k, c0 + j * kLanes);
  // A tile one strip wide (AVX2's 3 and 4 rows; NEON's 4, unmeasured) reads a single
  // stream, which one Zen 3 core's hardware fetches at ~15 GB/s where the four of a 1-row
  // tile get ~21, and its arithmetic then adds to the stream's time; asking for the next
  // strip beside it (a second stream) or for lines further on in the same strip did not
  // change that. So the panel's four tiles ask for the next panel's lines across its four
  // strips in turn, one line per k: four streams in flight, the next panel in L2 by the
  // time its tiles start (4 rows 1.05-1.25x faster, 3 rows 1.15-1.35x; docs/benchmarks.md,
  // stop 58).
  constexpr bool kAhead = kVecs * kLanes == kStrip;
  constexpr uint64_t kStrips = kPanel / kStrip;
  const float* strip[kStrips];  // the strips of `ahead`
  for (uint64_t s = 0; s < kStrips; ++s) strip[s] = ahead + s * k * kStrip;
  const uint64_t asked = static_cast<uint64_t>(c0 / kStrip * k);  // by the tiles before
  for (int64_t i = 0; i < k; ++i) {
    if constexpr (kAhead) {
      const uint64_t line = asked + static_cast<uint64_t>(i);
      __builtin_prefetch(strip[line % kStrips] + line / kStrips * kStrip, 0, 2);
    }
    Vec b[kVecs];
    for (int j = 0; j < kVecs; ++j) b[j] = Load(column[j] + i * kStrip);
    for (int r = 0; r < kTile; ++r) {
      const Vec x = Splat(a[r * k + i]);
      for (int j = 0; j < kVecs; ++j) acc[r][j] = Fma(x, b[j], acc[r][j]);
    }
  }
  StoreTile<kTile, kVecs>(acc, out, n, columns);
}

template <int kTile>
void TileRows(const float* a, int64_t k, const float* panel, float* out, int64_t n,
              int64_t columns, int64_t count, const float* ahead) {
  constexpr int64_t kWidth = Vectors(kTile) * kLanes;
  for (int64_t r = 0; r < count; r += kTile)
    for (int64_t c = 0; c < columns; c += kWidth)
      Tile<kTile>(a + r * k, k, panel, c, out + r * n + c, n, std::min(kWidth, columns - c),
                  ahead);
}

// kTile rows x kSlice columns over k in [k0, k1), starting from 0 or from what out holds.
template <int kTile>
void SliceTile(const float* a, int64_t k, int64_t k0, int64_t k1, const float* panel,
               int64_t c0, float* out, int64_t n, int64_t columns) {
  Vec acc[kTile][kSliceVecs];
  for (int r = 0; r < kTile; ++r)
    for (int j = 0; j < kSliceVecs; ++j) {
      if (k0 == 0) {
        acc[r][j] = Zero();
      } else if (columns - j * kLanes >= kLanes) {
        acc[r][j] = Load(out + r * n + j * kLanes);
      } else {
        float lanes[kLanes] = {};
        for (int64_t c = j * kLanes; c < columns; ++c) lanes[c - j * kLanes] = out[r * n + c];
        acc[r][j] = Load(lanes);
      }
    }
  const float* column[kSliceVecs];
  for (int j = 0; j < kSliceVecs; ++j) column[j] = At(panel, k, c0 + j * kLanes);
  for (int64_t i = k0; i < k1; ++i) {
    Vec b[kSliceVecs];
    for (int j = 0; j < kSliceVecs; ++j) b[j] = Load(column[j] + i * kStrip);
    for (int r = 0; r < kTile; ++r) {
      const Vec x = Splat(a[r * k + i]);
      for (int j = 0; j < kSliceVecs; ++j) acc[r][j] = Fma(x, b[j], acc[r][j]);
    }
  }
  StoreTile<kTile, kSliceVecs>(acc, out, n, columns);
}

template <int kTile>
void SliceTiles(const float* a, int64_t k, int64_t k0, int64_t k1, const float* panel,
                int64_t c0, float* out, int64_t n, int64_t columns, int64_t rows) {
  int64_t r = 0;
  for (; r + kTile <= rows; r += kTile)
    SliceTile<kTile>(a + r * k, k, k0, k1, panel, c0, out + r * n, n, columns);
  const float* x = a + r * k;
  float* o = out + r * n;
  switch (rows - r) {
    case 5: SliceTile<5>(x, k, k0, k1, panel, c0, o, n, columns); break;
    case 4: SliceTile<4>(x, k, k0, k1, panel, c0, o, n, columns); break;
    case 3: SliceTile<3>(x, k, k0, k1, panel, c0, o, n, columns); break;
    case 2: SliceTile<2>(x, k, k0, k1, panel, c0, o, n, columns); break;
    case 1: SliceTile<1>(x, k, k0, k1, panel, c0, o, n, columns); break;
    default: break;
  }
}

void Rows(const float* a, int64_t k, const float* panel, float* out, int64_t n,
          int64_t columns, int64_t rows, const float* ahead) {
  if (rows >= kSliceRows) {  // prefill: 6-row tiles over each slice (K whole: kKBlock)
    for (int64_t c = 0; c < columns; c += kSlice)
      for (int64_t k0 = 0; k0 < k; k0 += kKBlock)
        SliceTiles<kSliceRows>(a, k, k0, std::min(k, k0 + kKBlock), panel, c, out + c, n,
                               std::min(kSlice, columns - c), rows);
    return;
  }
  const int64_t whole = rows - rows % kDecodeRows;
  TileRows<kDecodeRows>(a, k, panel, out, n, columns, whole, ahead);
  a += whole * k;
  out += whole * n;
  switch (rows - whole) {
    case 3: TileRows<3>(a, k, panel, out, n, columns, 3, ahead); break;
    case 2: TileRows<2>(a, k, panel, out, n, columns, 2, ahead); break;
    case 1: TileRows<1>(a, k, panel, out, n, columns, 1, ahead); break;
    default: break;
  }
}
#else
void Rows(const float* a, int64_t k, const float* panel, float* out, int64_t n,
          int64_t columns, int64_t rows, const float* /*ahead*/) {
  std::vector<float> acc(kPanel);
  for (int64_t r = 0; r < rows; ++r) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t i = 0; i < k; ++i)
      for (int64_t j = 0; j < columns; ++j)
        acc[j] += a[r * k + i] * panel[(j / kStrip) * k * kStrip + i * kStrip + j % kStrip];
    std::copy(acc.begin(), acc.begin() + columns, out + r * n);
  }
}
#endif

const float* RowsOf(const Job& job) { return job.norm.skip != nullptr ? job.normed : job.a; }

// Panel p of b, and the panel its decode tiles ask for ahead (Tile): the next one, which
// the next piece (or, gated, the one after) multiplies; the last panel asks for its own
// lines (in cache or on their way: nothing past the weight is fetched).
const float* Panel(const Job& job, int64_t p) { return job.b + p * job.k * kPanel; }
const float* Ahead(const Job& job, int64_t p) {
  return Panel(job, std::min(p + 1, job.panels - 1));
}

// Piece i: rows [block * kRowBlock, +kRowBlock) of panel p, i = block * panels + p.
void RunPiece(void* data, size_t index) {
  const Job& job = *static_cast<const Job*>(data);
  const int64_t block = static_cast<int64_t>(index) / job.panels;
  const int64_t p = static_cast<int64_t>(index) % job.panels;
  const int64_t first = block * kRowBlock;
  Rows(RowsOf(job) + first * job.k, job.k, Panel(job, p), job.out + first * job.n + p * kPanel,
       job.n, std::min(kPanel, job.n - p * kPanel), std::min(kRowBlock, job.m - first),
       Ahead(job, p));
}

// gated=1: swiglu.h's GatedPiece over this op's panels.
void RunGatedPiece(void* data, size_t index) {
  const Job& job = *static_cast<const Job*>(data);
  GatedPiece<kPanel, kRowBlock>(
      index, job.m, job.panels, job.out,
      [&job](int64_t first, int64_t rows, int64_t q, float* dst) {
        Rows(RowsOf(job) + first * job.k, job.k, Panel(job, q), dst, kPanel, kPanel, rows,
             Ahead(job, q));
      });
}

// With the norm inside: rows [index * kPrepareRows, +kPrepareRows) normalized into `normed`.
void RunNorm(void* data, size_t index) {
  const Job& job = *static_cast<const Job*>(data);
  const int64_t first = static_cast<int64_t>(index) * kPrepareRows;
  for (int64_t r = first; r < std::min(job.m, first + kPrepareRows); ++r)
    NormedRow(job.norm, job.a, r, job.k, job.normed + r * job.k);
}

OrtStatus* Compute(void* state, OrtKernelContext* context) {
  const Columns& columns = *static_cast<Columns*>(state);
  const int64_t n = columns.n;
  Tensor a, b;
  EP_RETURN_IF_ERROR(Input(context, 0, &a));
  EP_RETURN_IF_ERROR(Input(context, 1, &b));
  if (a.dims.empty() || b.dims.size() != 4 || b.dims[1] != kPanel / kStrip ||
      b.dims[3] != kStrip)
    return Fail("MatMulF32: expects a [..., K] and a weight in panels [P, 4, K, 16]");
  const int64_t k = a.dims.back();
  NormRows norm;
  EP_RETURN_IF_ERROR(NormInputs(context, columns, a, 2, "MatMulF32", &norm));
  if (b.dims[2] != k || b.dims[0] != (n + kPanel - 1) / kPanel)
    return Fail(("MatMulF32: the weight's panels " + std::to_string(b.dims[0]) + "x4x" +
                 std::to_string(b.dims[2]) + "x16 do not fit K=" + std::to_string(k) +
                 ", N=" + std::to_string(n)).c_str());
  float* out = nullptr;
  int64_t m = 0;
  EP_RETURN_IF_ERROR(RowsOutput(context, a, columns.gated ? n / 2 : n, &out, &m));
  if (m == 0) return nullptr;
  std::vector<float> normed(norm.skip != nullptr ? static_cast<size_t>(m * k) : 0);
  Job job{a.data, b.data, out, m, k, n, b.dims[0], (m + kRowBlock - 1) / kRowBlock,
          columns.gated, norm, normed.data()};
  const bool split = WorthSplitting(m, k, n);
  const int64_t pieces = job.row_blocks * (columns.gated ? job.panels / 2 : job.panels);
  ProjectRows(context, split, m, norm.skip != nullptr ? RunNorm : nullptr,
              static_cast<size_t>(pieces), columns.gated ? RunGatedPiece : RunPiece, &job);
  return nullptr;
}

OrtStatus* CreateKernel(const OrtKernelInfo* info, void** kernel) {
  return CreateColumnsKernel(info, "MatMulF32", kernel);
}

OrtStatus* ORT_API_CALL ComputeKernel(void* kernel, OrtKernelContext* context) {
  return Compute(kernel, context);
}

}  // namespace

const Op& MatMulF32Op() {
  // inputs: a, b (panels), skip and gamma (optional), all float; outputs: out, sum (optional)
  static const Op op = [] {
    OpSpec spec{"MatMulF32", 4, 2, 0u, CreateKernel, ComputeKernel, DestroyColumnsKernel};
    spec.optional_inputs = 0b1100u;
    spec.optional_outputs = 0b10u;
    return MakeOp(spec);
  }();
  return op;
}

}  // namespace edgeprefill
