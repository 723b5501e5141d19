// What the library's ops share: the ONNX Runtime API table, tensor access through the C
// API, the rotary rotation, a vectorizable exp, and the OrtCustomOp table built from a spec.
#pragma once

#include <onnxruntime_c_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <vector>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

// The vector code's instruction sets: AVX-512 (Zen 4/5, Intel server CPUs), else AVX2 with
// FMA (Zen 1-3, Intel client CPUs), else on 64-bit Arm NEON (EP_NEON: every AArch64 CPU has
// it; Jetson Orin's Cortex-A78AE), else portable loops. EP_AVX2 is the AVX2 path: a build
// with AVX-512 never takes it. Only some kernels have a NEON path (decode attention, and
// MatMulInt8's products where __ARM_FEATURE_DOTPROD is on); the rest run their portable
// loops on Arm (docs/jetson.md).
#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
#define EP_AVX2 1
#endif
#if defined(__aarch64__) && defined(__ARM_NEON)
#define EP_NEON 1
#include <arm_neon.h>
#endif

namespace edgeprefill {

// Version 17: CreateKernelV2/KernelComputeV2 (16) and KernelContext_ParallelFor (17).
constexpr uint32_t kApiVersion = 17;
extern const OrtApi* g_api;  // set once by RegisterCustomOps (library.cc)

inline OrtStatus* Fail(const char* message) {
  return g_api->CreateStatus(ORT_INVALID_ARGUMENT, message);
}

#define EP_RETURN_IF_ERROR(expr)            \
  do {                                      \
    OrtStatus* status_ = (expr);            \
    if (status_ != nullptr) return status_; \
  } while (0)

// exp(x) for x <= 0 (scores minus their max): Cephes' expf, branch-free so loops over it
// vectorize; relative error ~1e-7. Every multiply-add is an explicit fma, so the bits do
// not hang on where the compiler contracts a * b + c (-ffp-contract) at each inline site.
inline float ExpNonPositive(float x) {
  x = x < -87.0f ? -87.0f : x;
  const float n = std::fma(x, 1.44269504088896341f, 12582912.0f) - 12582912.0f;  // round
  const float r = std::fma(-n, -2.12194440e-4f, std::fma(-n, 0.693359375f, x));
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  p = std::fma(p * r, r, r) + 1.0f;
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

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

#ifdef EP_AVX2
// ExpNonPositive16's steps, 8 lanes (the same bits lane for lane): its scalef by 2^n is
// exact here too, as a multiply by 2^n built in the exponent bits (n >= -126: a normal).
inline __m256 ExpNonPositive8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i bits = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

// The sum of 8 lanes, as _mm512_reduce_add_ps halves its 16: upper half onto lower.
inline float SumLanes(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

// float32 -> bf16 bits, rounded to nearest even as vcvtne2ps2bf16 does (no NaN expected).
inline uint32_t Bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

// bf16 bits -> the float32 they stand for (exact).
inline float FromBf16(uint16_t x) {
  const uint32_t u = uint32_t{x} << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// `count` floats -> their bf16 roundings (to nearest even), as a bf16 KV cache holds them.
inline void ToBf16(const float* src, int64_t count, uint16_t* dst) {
  int64_t i = 0;
#ifdef __AVX512BF16__
  for (; i + 16 <= count; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_loadu_ps(src + i))));
#endif
  for (; i < count; ++i) dst[i] = static_cast<uint16_t>(Bf16(src[i]));
}

// `count` floats -> ceil(count / 2) bf16 pairs of neighbours, in order: pair i holds
// (src[2i], src[2i + 1]) in one uint32, low half first; an odd count's last high half is 0.
// The layout vdpbf16ps sums over (MatMulBf16's activations, PrefillAttention's keys).
inline void PairUp(const float* src, int64_t count, uint32_t* dst) {
  int64_t i = 0;
#ifdef __AVX512BF16__
  for (; i + 32 <= count; i += 32)
    _mm512_storeu_si512(dst + i / 2, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(
                                         _mm512_loadu_ps(src + i + 16), _mm512_loadu_ps(src + i))));
#endif
  for (; i < count; i += 2)
    dst[i / 2] = Bf16(src[i]) | (i + 1 < count ? Bf16(src[i + 1]) << 16 : 0u);
}

// Rotary over the first `rotary` dims: non-interleaved, the halves rotate against each
// other (GroupQueryAttention's rotary_interleaved=0, transformers' rotate_half), or
// `interleaved`, each pair (2i, 2i + 1) (rotary_interleaved=1: Cohere, GLM, Helium), by
// angle i either way. With partial rotary (Phi-3/Phi-4-mini, StableLM, GPT-NeoX, GLM) the
// dims past `rotary` pass through unchanged. `rotary` 0 (no tables: do_rotary=0) copies x
// as it is; cos and sin are then never read.
inline void Rotate(const float* x, float* out, const float* cos, const float* sin, int64_t d,
                   int64_t rotary, bool interleaved) {
  const int64_t half = rotary / 2;
  // The partner of dim i is i + `step` (the first of a pair at i * `stride`).
  const int64_t stride = interleaved ? 2 : 1, step = interleaved ? 1 : half;
  for (int64_t i = 0; i < half; ++i) {
    const float a = x[i * stride], b = x[i * stride + step];
    out[i * stride] = std::fma(a, cos[i], -(b * sin[i]));  // explicit: see ExpNonPositive
    out[i * stride + step] = std::fma(b, cos[i], a * sin[i]);
  }
  for (int64_t i = rotary; i < d; ++i) out[i] = x[i];
}

// The KV cache the attention ops read and write: float32, or bf16 bits (uint16) where the
// load keeps a bf16 cache (PrefillAttentionBf16KV). Either way the products are float32 or
// bf16 pairs: a bf16 cache's values are exact in float32.
struct Cache {
  void* keys;
  void* values;
  bool bf16;
};

// Writes one token's key, rotated, and its value into the cache at element `at` (a bf16
// cache gets their roundings to nearest even); `rotated`: head_dim floats of scratch. One
// copy for both writers (PrefillAttention's chunk rows, DecodeRows' one-token rows), so a
// position holds the same bits whichever wrote it.
inline void WriteKeyValue(const Cache& cache, int64_t at, const float* key, const float* value,
                          const float* cos, const float* sin, int64_t d, int64_t rotary,
                          bool interleaved, float* rotated) {
  if (cache.bf16) {
    Rotate(key, rotated, cos, sin, d, rotary, interleaved);
    ToBf16(rotated, d, static_cast<uint16_t*>(cache.keys) + at);
    ToBf16(value, d, static_cast<uint16_t*>(cache.values) + at);
    return;
  }
  Rotate(key, static_cast<float*>(cache.keys) + at, cos, sin, d, rotary, interleaved);
  std::memcpy(static_cast<float*>(cache.values) + at, value, d * sizeof(float));
}

// The attributes both attention ops take from their GroupQueryAttention node.
struct Kernel {
  int64_t heads;
  int64_t kv_heads;
  float scale;
  bool bf16;  // optional attribute bf16=1 (--compute bf16): PrefillAttention's products in bf16
  bool bf16_cache = false;  // the KV cache holds bf16 bits (uint16): PrefillAttentionBf16KV
  bool packed = false;  // optional attribute packed=1: PrefillAttention on packed tokens
  bool last = false;  // optional attribute last=1 (with packed=1): only each row's last token out
  int64_t window = 0;  // optional attribute local_window_size (FirstKey); 0: every key
  float softcap = 0.0f;  // optional attribute softcap: scores -> c tanh(scores / c) (soft_cap.h)
  bool interleaved = false;  // optional attribute rotary_interleaved: Rotate's pairs (2i, 2i + 1)
};

// The first key a query at `position` sees under GroupQueryAttention's local_window_size
// `window` (0: no window, key 0): ONNX Runtime's CPU kernel (1.32) shows a query the last
// `window` keys, its own included (measured: tests/test_sliding_window.py).
inline int64_t FirstKey(int64_t position, int64_t window) {
  return window > 0 && position >= window ? position - window + 1 : 0;
}

// Reads num_heads, kv_num_heads and scale into a new Kernel; `op` names the op in errors.
OrtStatus* CreateAttentionKernel(const OrtKernelInfo* info, const char* op, void** kernel);

struct Tensor {
  std::vector<int64_t> dims;
  float* data = nullptr;
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
};

// Whether `t` is shaped exactly `want`.
inline bool HasDims(const Tensor& t, std::initializer_list<int64_t> want) {
  return t.dims == std::vector<int64_t>(want);
}

OrtStatus* Input(OrtKernelContext* context, size_t index, Tensor* tensor);
// Whether the node has input `index` (an optional input: absent, or given as "").
OrtStatus* HasInput(OrtKernelContext* context, size_t index, bool* has);
// The rotary tables cos and sin, inputs `index` and index + 1 (`op` names the op in the
// error): [positions, rotary_dim / 2] each, rotary_dim even and <= head_dim `d`. Both absent
// (GroupQueryAttention's do_rotary=0: NoPE layers, Granite-4.0-H, Nemotron-H) leave
// `rotary` 0, which Rotate takes as no rotation, and the tables' rows unbounded.
struct RotaryTables {
  const float* cos = nullptr;
  const float* sin = nullptr;
  int64_t rotary = 0;     // rotary_dim: 0 without tables
  int64_t positions = 0;  // the tables' rows; without tables, INT64_MAX (no bound)
};
OrtStatus* RotaryInputs(OrtKernelContext* context, size_t index, int64_t d, const char* op,
                        RotaryTables* tables);
// GroupQueryAttention's head_sink, input `index` where the node gives it (gpt-oss): [heads]
// logits, each joining its head's softmax denominator as exp(sink - max) with no value
// (AddSink); `sink` stays null without it.
OrtStatus* SinkInput(OrtKernelContext* context, size_t index, int64_t heads, const char* op,
                     const float** sink);

// A softmax's denominator with a head's sink: `total`, the sum of exp(score - top) over
// the scores (top their max), plus exp(sink - top), the sink's share, which attends to
// nothing. ONNX Runtime 1.32's GroupQueryAttention takes the max over the scores and the
// sink; the weights are the same up to rounding (measured: tests/test_attention_sinks.py).
// A sink far above every score leaves an infinite denominator: weights of 0, as its limit.
inline float AddSink(float total, float top, const float* sink, int64_t head) {
  return sink == nullptr ? total : total + std::exp(sink[head] - top);
}
OrtStatus* Output(OrtKernelContext* context, size_t index, const std::vector<int64_t>& dims,
                  float** data);

// Runs `count` pieces on ONNX Runtime's intra-op pool, or here when there is none (or one).
void ParallelFor(OrtKernelContext* context, void (*fn)(void*, size_t), size_t count, void* data);

// A row-wise op's rows (SwiGlu, SkipRmsNorm): run(job, first, last) over blocks of 16 rows,
// on the pool where the op moves enough floats (rows x width) to pay for its hand-out.
void ForRowBlocks(OrtKernelContext* context, int64_t rows, int64_t width,
                  void (*run)(void* job, int64_t first, int64_t last), void* job);

// Whether a packed projection's product (MatMulBf16, MatMulF32, MatMulInt8: m rows, k x n
// weights) is worth the pool's hand-out: below both bounds, a chunk's multiply-adds and a
// decode step's weight bytes (one row is bound by reading them), it costs more than it saves.
inline bool WorthSplitting(int64_t m, int64_t k, int64_t n) {
  return 2 * m * k * n >= (int64_t{1} << 20) || k * n >= (int64_t{1} << 16);
}

// A packed projection's two passes (MatMulBf16, MatMulF32, MatMulInt8): `prepare` for each
// block of kPrepareRows of the `rows` rows (the activations normalized where the norm is
// inside, then rounded for the product), then `piece` for each of `pieces` (row block,
// panel) pieces; on the pool where `split` says the product is worth it, else here. A null
// `prepare`: the rows are multiplied as they are (MatMulF32 without a norm inside).
void ProjectRows(OrtKernelContext* context, bool split, int64_t rows,
                 void (*prepare)(void*, size_t), size_t pieces, void (*piece)(void*, size_t),
                 void* job);
// Rows per prepare block: finer than the products' row blocks (48), so that the two threads
// get even shares of a chunk's rows (a 256-row chunk: 16 blocks, not 5 of 48 and one of
// 16). With the norm inside, MatMulInt8's K = N = 576 chain ran 7-13% faster than with
// 48-row blocks (docs/benchmarks.md, stop 32).
constexpr int64_t kPrepareRows = 16;

// Output 0 of a row-wise op on input `a` [..., K]: [..., width] (the projections: N;
// SwiGlu: K / 2), and `rows`, the product of a's leading axes.
OrtStatus* RowsOutput(OrtKernelContext* context, const Tensor& a, int64_t width, float** out,
                      int64_t* rows);

// A packed projection's kernel (MatMulBf16, MatMulF32, MatMulInt8; MatMulInt4 beside its
// K): its N attribute, positive (`op` names it in the error), the optional gated (1: the
// weight's columns are an MLP's gate then up, N / 2 a whole number of 64-column panels, and
// the output [..., N / 2] is silu(gate) * up, swiglu.h) and the optional epsilon (the
// SkipRmsNorm before it runs inside: the op takes x, skip and gamma, multiplies
// RMSNorm(x + skip) * gamma, rms_norm.h, and gives x + skip as output 1), read by
// ReadColumns (into a kernel of the op's own) or CreateColumnsKernel (the kernel itself,
// freed by DestroyColumnsKernel).
struct Columns {
  int64_t n;
  bool gated;
  bool norm;      // an epsilon attribute: the rows are x + skip, RMS-normalized (below)
  float epsilon;  // with norm
};
constexpr int64_t kGatedPanel = 64;  // both projections' panel width (their kPanel)
OrtStatus* ReadColumns(const OrtKernelInfo* info, const char* op, Columns* columns);
OrtStatus* CreateColumnsKernel(const OrtKernelInfo* info, const char* op, void** kernel);
void ORT_API_CALL DestroyColumnsKernel(void* kernel);

// A projection's norm inside (Columns::norm): skip and gamma, the inputs at `index` and
// index + 1, and output 1, x + skip. All null without the norm, where the node must give
// neither input nor output 1.
struct NormRows {
  const float* skip = nullptr;
  const float* gamma = nullptr;
  float* sum = nullptr;
  float epsilon = 0.0f;
};
// Reads them for input 0 `a` [..., K] (`op` names the op in the errors).
OrtStatus* NormInputs(OrtKernelContext* context, const Columns& columns, const Tensor& a,
                      size_t index, const char* op, NormRows* norm);

// One op of the library: its name, its inputs (those in `int32_inputs`, a bit mask, are
// int32, those in `uint8_inputs` uint8, those in `uint16_inputs` uint16, those in
// `any_inputs` any type, the rest float; outputs are float but those in `uint16_outputs`)
// and its kernel's life cycle.
struct OpSpec {
  const char* name;
  size_t inputs;
  size_t outputs;
  uint32_t int32_inputs;
  OrtStatus* (*create)(const OrtKernelInfo* info, void** kernel);
  OrtStatus* (*compute)(void* kernel, OrtKernelContext* context);
  void (*destroy)(void* kernel);
  uint32_t uint8_inputs = 0;
  uint32_t optional_inputs = 0;  // a bit mask, like int32_inputs: inputs a node may omit
  uint32_t uint16_inputs = 0;    // bf16 bits (a bf16 KV cache)
  uint32_t uint16_outputs = 0;
  uint32_t any_inputs = 0;  // of any element type: the kernel checks Tensor::type
  uint32_t optional_outputs = 0;  // a bit mask: outputs a node may omit
};

// The OrtCustomOp table first, so ONNX Runtime's `const OrtCustomOp*` leads back to the spec.
struct Op {
  OrtCustomOp table;
  OpSpec spec;
};

Op MakeOp(const OpSpec& spec);

// The create and destroy of an op without attributes or state (SwiGlu, GatedDeltaRule, Mamba2Scan).
OrtStatus* CreateStatelessKernel(const OrtKernelInfo* info, void** kernel);
void ORT_API_CALL DestroyStatelessKernel(void* kernel);

const Op& DecodeAttentionOp();
const Op& PrefillAttentionOp();
const Op& PrefillAttentionBf16KvOp();
const Op& SwiGluOp();
const Op& SkipRmsNormOp();
const Op& MatMulBf16Op();
const Op& MatMulF32Op();
const Op& MatMulInt4Op();
const Op& MatMulInt8Op();
const Op& GatedDeltaRuleOp();
const Op& Mamba2ScanOp();

}  // namespace edgeprefill
