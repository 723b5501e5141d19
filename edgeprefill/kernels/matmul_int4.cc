// edgeprefill.MatMulInt4: an int4 bundle's projections for decode steps (one row per
// sequence), in place of com.microsoft.MatMulNBits at accuracy level 4 on the same packed
// weights (edgeprefill/engines/ort/int4_decode.py switches it in). It computes what that
// level computes: each row's activations quantized to int8 per block of 32 (scale = the
// block's largest magnitude / 127, rounded to nearest even), multiplied by the 4-bit
// weights (zero point 8) in int32, each block's sum scaled by both scales in float32. A
// decode step is bound by reading the weights: ONNX Runtime's kernel reads 11-16 GB/s on
// one core of an AMD EPYC (Zen 4), this one unpacks 128 weights per 64-byte load into two
// AVX512-VNNI dot products and keeps up with memory (docs/benchmarks.md).
//
// Inputs:  0 a [..., K] float
//          1 b [N, blocks, 16] uint8   MatMulNBits' layout: per column, blocks of 32 along K,
//            two weights per byte (even k in the low nibble), stored as w / scale + 8
//          2 scales [N * blocks] float (or [N, blocks])
// Output:  0 out [..., N] float
// Attributes: K, N, block_size (32, the only size taken), as MatMulNBits has them.
//
// Without AVX512-VNNI the same numbers come from portable loops (slower than ONNX
// Runtime's kernel: int4_decode.py switches this op in only on CPUs with VNNI).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernel_common.h"

namespace edgeprefill {
namespace {

constexpr int64_t kBlock = 32;    // weights per quantization block (block_size)
constexpr int64_t kGroup = 4;     // blocks per 64-byte load: one AVX-512 register of weights
constexpr int64_t kLanes = 16;    // int32 lanes per register: 4 per block
constexpr int64_t kPiece = 32;    // columns per parallel piece
constexpr int64_t kRowsAtOnce = 8;  // rows sharing one read of the weights

struct Shape {
  int64_t k, n;
};

// One row's activations, quantized and laid out for the weights' registers: per group of
// four blocks, 64 int8 for the even k (the low nibbles) and 64 for the odd k; per lane, 8
// times the sum of the 8 activations it meets (the zero point's share) and its block's scale.
struct Row {
  std::vector<int8_t> even, odd;  // [groups * 64]
  std::vector<int32_t> offset;    // [groups * 16]
  std::vector<float> scale;       // [groups * 16]
};

struct Job {
  Shape shape;
  int64_t blocks, groups, rows;
  const uint8_t* b;  // [N, blocks, 16]
  const float* scales;  // [N * blocks]
  const std::vector<Row>* quantized;
  float* out;  // [rows, N]
};

// One block of activations (count <= 32, zero past it) -> int8, rounded to nearest even
// (the vector conversion under the default rounding mode, as std::nearbyint); its scale.
#ifdef __AVX512F__
float QuantizeBlock(const float* a, int64_t count, int32_t* q) {
  const __mmask16 m0 = static_cast<__mmask16>(count >= 16 ? 0xffff : (1u << count) - 1);
  const __mmask16 m1 = static_cast<__mmask16>(count >= 32 ? 0xffff : count <= 16 ? 0 : (1u << (count - 16)) - 1);
  const __m512 x0 = _mm512_maskz_loadu_ps(m0, a), x1 = _mm512_maskz_loadu_ps(m1, a + 16);
  const float top = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
  const float scale = top / 127.0f;
  const __m512 inverse = _mm512_set1_ps(scale != 0.0f ? 1.0f / scale : 0.0f);
  const __m512i low = _mm512_set1_epi32(-127), high = _mm512_set1_epi32(127);
  _mm512_storeu_si512(q, _mm512_min_epi32(high, _mm512_max_epi32(low, _mm512_cvtps_epi32(_mm512_mul_ps(x0, inverse)))));
  _mm512_storeu_si512(q + 16, _mm512_min_epi32(high, _mm512_max_epi32(low, _mm512_cvtps_epi32(_mm512_mul_ps(x1, inverse)))));
  return scale;
}
#else
float QuantizeBlock(const float* a, int64_t count, int32_t* q) {
  float top = 0.0f;
  for (int64_t i = 0; i < count; ++i) top = std::max(top, std::fabs(a[i]));
  const float scale = top / 127.0f;
  const float inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
  for (int64_t i = 0; i < kBlock; ++i)
    q[i] = i < count ? std::clamp(static_cast<int32_t>(std::nearbyint(a[i] * inverse)), -127, 127) : 0;
  return scale;
}
#endif

void Quantize(const float* a, int64_t k, int64_t groups, Row* row) {
  row->even.assign(groups * 64, 0);
  row->odd.assign(groups * 64, 0);
  row->offset.assign(groups * kLanes, 0);
  row->scale.assign(groups * kLanes, 0.0f);
  int32_t q[kBlock];
  for (int64_t block = 0; block * kBlock < k; ++block) {
    const float scale = QuantizeBlock(a + block * kBlock, std::min(kBlock, k - block * kBlock), q);
    const int64_t at = block / kGroup * 64 + block % kGroup * 16;  // its 16 bytes
    const int64_t lane = block / kGroup * kLanes + block % kGroup * 4;  // its 4 lanes
    for (int64_t j = 0; j < 16; ++j) {
      row->even[at + j] = static_cast<int8_t>(q[2 * j]);
      row->odd[at + j] = static_cast<int8_t>(q[2 * j + 1]);
      row->offset[lane + j / 4] += 8 * (q[2 * j] + q[2 * j + 1]);
    }
    for (int64_t l = 0; l < 4; ++l) row->scale[lane + l] = scale;
  }
}

#ifdef __AVX512VNNI__
// Columns [first, last) for R rows (a compile-time count: the sums stay in registers).
template <int R>
void ColumnsOf(const Job& job, int64_t first, int64_t last, int64_t row0) {
  const int64_t blocks = job.blocks;
  const __m512i nibble = _mm512_set1_epi8(0x0f);
  // Lane l of a group holds block l / 4's scale: index 0,0,0,0,1,1,1,1,...
  const __m512i spread = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  const Row* quantized = job.quantized->data() + row0;
  for (int64_t n = first; n < last; ++n) {
    const uint8_t* column = job.b + n * blocks * 16;
    const float* scales = job.scales + n * blocks;
    __m512 sum[R];
    for (int r = 0; r < R; ++r) sum[r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < job.groups; ++g) {
      const int64_t here = std::min(kGroup, blocks - g * kGroup);
      const __mmask64 bytes = here == kGroup ? ~__mmask64{0} : (__mmask64{1} << (here * 16)) - 1;
      const __m512i w = _mm512_maskz_loadu_epi8(bytes, column + g * 64);
      const __m512i low = _mm512_and_si512(w, nibble);
      const __m512i high = _mm512_and_si512(_mm512_srli_epi16(w, 4), nibble);
      const __m512 wscale = _mm512_permutexvar_ps(
          spread, _mm512_castps128_ps512(_mm_maskz_loadu_ps(static_cast<__mmask8>((1u << here) - 1),
                                                            scales + g * kGroup)));
      for (int r = 0; r < R; ++r) {
        const Row& row = quantized[r];
        __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), low,
                                          _mm512_loadu_si512(row.even.data() + g * 64));
        dot = _mm512_dpbusd_epi32(dot, high, _mm512_loadu_si512(row.odd.data() + g * 64));
        dot = _mm512_sub_epi32(dot, _mm512_loadu_si512(row.offset.data() + g * kLanes));
        const __m512 both = _mm512_mul_ps(wscale, _mm512_loadu_ps(row.scale.data() + g * kLanes));
        sum[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), both, sum[r]);
      }
    }
    for (int r = 0; r < R; ++r) job.out[(row0 + r) * job.shape.n + n] = _mm512_reduce_add_ps(sum[r]);
  }
}

void Columns(const Job& job, int64_t first, int64_t last, int64_t row0, int64_t rows) {
  switch (rows) {
    case 1: ColumnsOf<1>(job, first, last, row0); break;
    case 2: ColumnsOf<2>(job, first, last, row0); break;
    case 3: ColumnsOf<3>(job, first, last, row0); break;
    case 4: ColumnsOf<4>(job, first, last, row0); break;
    case 5: ColumnsOf<5>(job, first, last, row0); break;
    case 6: ColumnsOf<6>(job, first, last, row0); break;
    case 7: ColumnsOf<7>(job, first, last, row0); break;
    default: ColumnsOf<8>(job, first, last, row0); break;
  }
}
#else
void Columns(const Job& job, int64_t first, int64_t last, int64_t row0, int64_t rows) {
  const int64_t blocks = job.blocks;
  for (int64_t r = 0; r < rows; ++r) {
    const Row& row = (*job.quantized)[row0 + r];
    for (int64_t n = first; n < last; ++n) {
      const uint8_t* column = job.b + n * blocks * 16;
      float sum = 0.0f;
      for (int64_t block = 0; block < blocks; ++block) {
        const int64_t at = block / kGroup * 64 + block % kGroup * 16;
        const int64_t lane = block / kGroup * kLanes + block % kGroup * 4;
        for (int64_t l = 0; l < 4; ++l) {  // the vector lanes' sums, in their order
          int32_t dot = 0;
          for (int64_t j = 4 * l; j < 4 * l + 4; ++j) {
            const uint8_t byte = column[block * 16 + j];
            dot += (byte & 0x0f) * row.even[at + j] + (byte >> 4) * row.odd[at + j];
          }
          dot -= row.offset[lane + l];
          sum += static_cast<float>(dot) * (job.scales[n * blocks + block] * row.scale[lane + l]);
        }
      }
      job.out[(row0 + r) * job.shape.n + n] = sum;
    }
  }
}
#endif

void RunPiece(void* data, size_t index) {
  const Job& job = *static_cast<const Job*>(data);
  const int64_t first = static_cast<int64_t>(index) * kPiece;
  const int64_t last = std::min(job.shape.n, first + kPiece);
  for (int64_t r = 0; r < job.rows; r += kRowsAtOnce)
    Columns(job, first, last, r, std::min(kRowsAtOnce, job.rows - r));
}

OrtStatus* Compute(void* state, OrtKernelContext* context) {
  const Shape& shape = *static_cast<Shape*>(state);
  Tensor a, b, scales;
  EP_RETURN_IF_ERROR(Input(context, 0, &a));
  EP_RETURN_IF_ERROR(Input(context, 1, &b));
  EP_RETURN_IF_ERROR(Input(context, 2, &scales));
  const int64_t blocks = (shape.k + kBlock - 1) / kBlock;
  int64_t scale_count = 1;
  for (int64_t d : scales.dims) scale_count *= d;
  if (a.dims.empty() || a.dims.back() != shape.k)
    return Fail(("MatMulInt4: expects activations [..., " + std::to_string(shape.k) + "]").c_str());
  if (b.dims.size() != 3 || b.dims[0] != shape.n || b.dims[1] != blocks || b.dims[2] != 16 ||
      scale_count != shape.n * blocks)
    return Fail("MatMulInt4: the packed weight must be [N, ceil(K / 32), 16] and the scales N x blocks");
  std::vector<int64_t> dims = a.dims;
  dims.back() = shape.n;
  float* out = nullptr;
  EP_RETURN_IF_ERROR(Output(context, 0, dims, &out));
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < a.dims.size(); ++i) rows *= a.dims[i];
  if (rows == 0) return nullptr;
  const int64_t groups = (blocks + kGroup - 1) / kGroup;
  std::vector<Row> quantized(rows);
  for (int64_t r = 0; r < rows; ++r) Quantize(a.data + r * shape.k, shape.k, groups, &quantized[r]);
  Job job{shape, blocks, groups, rows, reinterpret_cast<const uint8_t*>(b.data), scales.data,
          &quantized, out};
  ParallelFor(context, RunPiece, static_cast<size_t>((shape.n + kPiece - 1) / kPiece), &job);
  return nullptr;
}

OrtStatus* CreateKernel(const OrtKernelInfo* info, void** kernel) {
  int64_t k = 0, n = 0, block = 0;
  EP_RETURN_IF_ERROR(g_api->KernelInfoGetAttribute_int64(info, "K", &k));
  EP_RETURN_IF_ERROR(g_api->KernelInfoGetAttribute_int64(info, "N", &n));
  EP_RETURN_IF_ERROR(g_api->KernelInfoGetAttribute_int64(info, "block_size", &block));
  if (k <= 0 || n <= 0 || block != kBlock)
    return Fail("MatMulInt4: K and N must be positive and block_size 32");
  *kernel = new Shape{k, n};
  return nullptr;
}

void ORT_API_CALL DestroyKernel(void* kernel) { delete static_cast<Shape*>(kernel); }

OrtStatus* ORT_API_CALL ComputeKernel(void* kernel, OrtKernelContext* context) {
  return Compute(kernel, context);
}

}  // namespace

const Op& MatMulInt4Op() {
  static const Op op = MakeOp({"MatMulInt4", 3, 1, 0u, CreateKernel, ComputeKernel, DestroyKernel,
                               0b10u});
  return op;
}

}  // namespace edgeprefill
