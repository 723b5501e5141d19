// edgeprefill.GatedDeltaRule: Qwen3.5's Gated DeltaNet recurrence over a chunk, in place
// of the `Scan` the exporter writes for it (export/gated_delta.py; the load-time rewrite
// is kernels/gated_delta.py). Inputs: the initial state S [B, H, dk, dv], q and k
// [B, C, H, dk], v [B, C, H, dv], decay and beta [B, C, H], all float32, a row's padding
// already neutral (decay 1, beta 0: S stays as it is). Outputs: the final S and the
// per-token outputs [B, C, H, dv]. Per (row, head), per token, the Scan body's steps in
// its order:
//
//   S *= decay;  kv = k S;  delta = (v - kv) * beta;  S += k (x) delta;  o = q S
//
// The Scan runs its body's ~14 nodes once per token, each over all B x H states, so
// every token streams every state (B x H x dk x dv floats, 1 MB at 16 heads of 128 x 128)
// through memory several times. Here one piece of the pool owns one (row, head) for the
// whole chunk: its S (64 KB at 128 x 128) stays in L2 across the tokens, and each token
// makes two passes over it (the decay with k S, then the update with q S). The dv-wide
// loops are plain C++ that -O3 -march=native vectorizes (an explicit AVX2 tile and L1
// column blocks measured no faster end to end, docs/benchmarks.md). The sums over dk may
// run in another order than the Scan's MatMul: the same to float rounding
// (tests/test_gated_delta_kernel.py).

#include <cstdint>
#include <cstring>
#include <vector>

#include "kernel_common.h"

namespace edgeprefill {
namespace {

struct Job {
  const float* initial;  // [B, H, dk, dv]
  const float* q;        // [B, C, H, dk]
  const float* k;        // [B, C, H, dk]
  const float* v;        // [B, C, H, dv]
  const float* decay;    // [B, C, H]
  const float* beta;     // [B, C, H]
  float* state;          // [B, H, dk, dv]: the final S, updated in place
  float* out;            // [B, C, H, dv]
  int64_t chunk, heads, dk, dv;
};

// One token on one head's S [dk, dv]: `kv` is scratch of dv floats.
inline void Step(float* __restrict s, const float* __restrict q, const float* __restrict k,
                 const float* __restrict v, float decay, float beta, float* __restrict kv,
                 float* __restrict o, int64_t dk, int64_t dv) {
  for (int64_t j = 0; j < dv; ++j) kv[j] = 0.0f;
  for (int64_t i = 0; i < dk; ++i) {  // S *= decay, and kv = k S from the decayed rows
    float* __restrict row = s + i * dv;
    const float ki = k[i];
    for (int64_t j = 0; j < dv; ++j) {
      row[j] *= decay;
      kv[j] += ki * row[j];
    }
  }
  for (int64_t j = 0; j < dv; ++j) {
    kv[j] = (v[j] - kv[j]) * beta;  // delta, in kv's place
    o[j] = 0.0f;
  }
  for (int64_t i = 0; i < dk; ++i) {  // S += k (x) delta, and o = q S from the new rows
    float* __restrict row = s + i * dv;
    const float ki = k[i], qi = q[i];
    for (int64_t j = 0; j < dv; ++j) {
      row[j] += ki * kv[j];
      o[j] += qi * row[j];
    }
  }
}

// Piece `index`: (row, head) = divmod(index, heads), all the chunk's tokens.
void RunHead(void* data, size_t index) {
  const Job& job = *static_cast<const Job*>(data);
  const int64_t b = static_cast<int64_t>(index) / job.heads;
  const int64_t h = static_cast<int64_t>(index) % job.heads;
  const int64_t dk = job.dk, dv = job.dv, heads = job.heads;
  const int64_t size = dk * dv;
  float* s = job.state + static_cast<int64_t>(index) * size;
  std::memcpy(s, job.initial + static_cast<int64_t>(index) * size, size * sizeof(float));
  std::vector<float> kv(static_cast<size_t>(dv));
  for (int64_t t = 0; t < job.chunk; ++t) {
    const int64_t token = (b * job.chunk + t) * heads + h;  // index into [B, C, H]
    Step(s, job.q + token * dk, job.k + token * dk, job.v + token * dv, job.decay[token],
         job.beta[token], kv.data(), job.out + token * dv, dk, dv);
  }
}

OrtStatus* Compute(void*, OrtKernelContext* context) {
  Tensor s, q, k, v, decay, beta;
  EP_RETURN_IF_ERROR(Input(context, 0, &s));
  EP_RETURN_IF_ERROR(Input(context, 1, &q));
  EP_RETURN_IF_ERROR(Input(context, 2, &k));
  EP_RETURN_IF_ERROR(Input(context, 3, &v));
  EP_RETURN_IF_ERROR(Input(context, 4, &decay));
  EP_RETURN_IF_ERROR(Input(context, 5, &beta));
  if (s.dims.size() != 4 || q.dims.size() != 4)
    return Fail("GatedDeltaRule: the state must be [B, H, dk, dv] and q [B, C, H, dk]");
  const int64_t rows = s.dims[0], heads = s.dims[1], dk = s.dims[2], dv = s.dims[3];
  const int64_t chunk = q.dims[1];
  if (!HasDims(q, {rows, chunk, heads, dk}) || !HasDims(k, {rows, chunk, heads, dk}) ||
      !HasDims(v, {rows, chunk, heads, dv}) || !HasDims(decay, {rows, chunk, heads}) ||
      !HasDims(beta, {rows, chunk, heads}))
    return Fail("GatedDeltaRule: q, k [B, C, H, dk], v [B, C, H, dv] and decay, beta "
                "[B, C, H] must agree with the state [B, H, dk, dv]");
  Job job{s.data, q.data, k.data, v.data, decay.data, beta.data, nullptr, nullptr,
          chunk, heads, dk, dv};
  EP_RETURN_IF_ERROR(Output(context, 0, s.dims, &job.state));
  EP_RETURN_IF_ERROR(Output(context, 1, {rows, chunk, heads, dv}, &job.out));
  ParallelFor(context, RunHead, static_cast<size_t>(rows * heads), &job);
  return nullptr;
}

OrtStatus* ORT_API_CALL ComputeKernel(void* kernel, OrtKernelContext* context) {
  return Compute(kernel, context);
}

}  // namespace

const Op& GatedDeltaRuleOp() {
  static const Op op =
      MakeOp({"GatedDeltaRule", 6, 2, 0u, CreateStatelessKernel, ComputeKernel,
              DestroyStatelessKernel});
  return op;
}

}  // namespace edgeprefill
