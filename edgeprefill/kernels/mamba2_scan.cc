// edgeprefill.Mamba2Scan: a Mamba-2 mixer's SSM recurrence over a chunk, in place of the
// `Scan` the exporter writes for it (export/mamba2.py; the load-time rewrite is
// kernels/mamba2_scan.py). Inputs: the initial state h [B, H, P, N] (P the head's width,
// N the state size), dtx = dt x [B, C, H, P], B and C per head [B, C, H, N], decay =
// exp(dt A) [B, C, H], all float32, a row's padding already neutral (dt = 0: decay 1, dtx
// 0, so h stays as it is). Outputs: the final h and the per-token y = h C [B, C, H, P]
// (D x is added after, outside). Per (row, head), per token, the Scan body's steps:
//
//   h = h * decay + dtx (x) B;   y = h C
//
// The Scan runs its body's 9 nodes once per token, each over all B x H states, so every
// token streams every state (48 heads of 64 x 128 floats, 1.5 MB at Granite-4.0-H-1B's
// widths) through memory several times. Here one piece of the pool owns one (row, head)
// for the whole chunk: its h (32 KB at 64 x 128) stays in cache across the tokens, and
// each token makes one pass over it, updating a row of h and summing it against C.
//
// h is the Scan's to the bit: each element is rounded as its Mul, Mul and Add round it
// (h * decay, dtx * B, their sum), never fused into a multiply-add (hence fp-contract=off
// on the functions that update it; GCC's default would fuse them). y's sum over N runs in
// 16 lanes, another order than the Scan's MatMul: the same to float rounding
// (tests/test_mamba2_kernel.py).

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernel_common.h"

// h's update rounded as the Scan's separate Mul, Mul and Add (the header says why): GCC
// per function; clang (whose attribute this is not) by the pragma in Step.
#if defined(__clang__)
#define EP_SEPARATE_ROUNDING
#else
#define EP_SEPARATE_ROUNDING __attribute__((optimize("fp-contract=off")))
#endif

namespace edgeprefill {
namespace {

constexpr int64_t kLanes = 16;  // y's partial sums: two AVX2 or one AVX-512 register

struct Job {
  const float* initial;  // [B, H, P, N]
  const float* dtx;      // [B, C, H, P]
  const float* b;        // [B, C, H, N]
  const float* c;        // [B, C, H, N]
  const float* decay;    // [B, C, H]
  float* state;          // [B, H, P, N]: the final h, updated in place
  float* out;            // [B, C, H, P]
  int64_t chunk, heads, p, n;
};

// The sum of the lanes, halving: the same order wherever it runs.
inline float SumLanes16(float* lanes) {
  for (int64_t width = kLanes / 2; width > 0; width /= 2)
    for (int64_t j = 0; j < width; ++j) lanes[j] += lanes[j + width];
  return lanes[0];
}

// One token on one head's h [P, N]: each row i of h becomes h[i] * decay + dtx[i] * B,
// and y[i] its sum against C.
EP_SEPARATE_ROUNDING inline void Step(float* __restrict h, const float* __restrict dtx,
                                      const float* __restrict b, const float* __restrict c,
                                      float decay, float* __restrict y, int64_t p, int64_t n) {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
  for (int64_t i = 0; i < p; ++i) {
    float* __restrict row = h + i * n;
    const float x = dtx[i];
    float lanes[kLanes] = {};
    int64_t j = 0;
    for (; j + kLanes <= n; j += kLanes)
      for (int64_t l = 0; l < kLanes; ++l) {
        const float v = row[j + l] * decay + x * b[j + l];
        row[j + l] = v;
        lanes[l] = std::fma(v, c[j + l], lanes[l]);
      }
    float tail = 0.0f;
    for (; j < n; ++j) {
      const float v = row[j] * decay + x * b[j];
      row[j] = v;
      tail = std::fma(v, c[j], tail);
    }
    y[i] = SumLanes16(lanes) + tail;
  }
}

// Piece `index`: (row, head) = divmod(index, heads), all the chunk's tokens.
EP_SEPARATE_ROUNDING void RunHead(void* data, size_t index) {
  const Job& job = *static_cast<const Job*>(data);
  const int64_t row = static_cast<int64_t>(index) / job.heads;
  const int64_t head = static_cast<int64_t>(index) % job.heads;
  const int64_t p = job.p, n = job.n, size = p * n;
  float* h = job.state + static_cast<int64_t>(index) * size;
  std::memcpy(h, job.initial + static_cast<int64_t>(index) * size, size * sizeof(float));
  for (int64_t t = 0; t < job.chunk; ++t) {
    const int64_t token = (row * job.chunk + t) * job.heads + head;  // index into [B, C, H]
    Step(h, job.dtx + token * p, job.b + token * n, job.c + token * n, job.decay[token],
         job.out + token * p, p, n);
  }
}

OrtStatus* Compute(void*, OrtKernelContext* context) {
  Tensor h, dtx, b, c, decay;
  EP_RETURN_IF_ERROR(Input(context, 0, &h));
  EP_RETURN_IF_ERROR(Input(context, 1, &dtx));
  EP_RETURN_IF_ERROR(Input(context, 2, &b));
  EP_RETURN_IF_ERROR(Input(context, 3, &c));
  EP_RETURN_IF_ERROR(Input(context, 4, &decay));
  if (h.dims.size() != 4 || dtx.dims.size() != 4)
    return Fail("Mamba2Scan: the state must be [B, H, P, N] and dtx [B, C, H, P]");
  const int64_t rows = h.dims[0], heads = h.dims[1], p = h.dims[2], n = h.dims[3];
  const int64_t chunk = dtx.dims[1];
  if (!HasDims(dtx, {rows, chunk, heads, p}) || !HasDims(b, {rows, chunk, heads, n}) ||
      !HasDims(c, {rows, chunk, heads, n}) || !HasDims(decay, {rows, chunk, heads}))
    return Fail("Mamba2Scan: dtx [B, C, H, P], B and C [B, C, H, N] and decay [B, C, H] "
                "must agree with the state [B, H, P, N]");
  Job job{h.data, dtx.data, b.data, c.data, decay.data, nullptr, nullptr, chunk, heads, p, n};
  EP_RETURN_IF_ERROR(Output(context, 0, h.dims, &job.state));
  EP_RETURN_IF_ERROR(Output(context, 1, {rows, chunk, heads, p}, &job.out));
  ParallelFor(context, RunHead, static_cast<size_t>(rows * heads), &job);
  return nullptr;
}

OrtStatus* ORT_API_CALL ComputeKernel(void* kernel, OrtKernelContext* context) {
  return Compute(kernel, context);
}

}  // namespace

const Op& Mamba2ScanOp() {
  static const Op op = MakeOp({"Mamba2Scan", 5, 2, 0u, CreateStatelessKernel, ComputeKernel,
                               DestroyStatelessKernel});
  return op;
}

}  // namespace edgeprefill
