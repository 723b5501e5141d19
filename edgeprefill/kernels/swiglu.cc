// edgeprefill.SwiGlu: out = silu(gate) * up, where the input is the gated MLP's packed
// projection [..., 2 I] with gate = [..., :I] and up = [..., I:]. It replaces the four
// nodes the exporter writes for it (Split, Sigmoid, Mul, Mul; ONNX Runtime fuses the middle
// two into QuickGelu): one pass over the projection instead of three, no copy of the two
// halves, and three fewer nodes per layer in every decode step. Its arithmetic is
// swiglu.h's; where the native projection makes gate and up, the projection applies it
// itself (gated=1, kernels/swiglu.py's fold_gated) and this op is not in the graph.

#include <cstdint>

#include "kernel_common.h"
#include "swiglu.h"

namespace edgeprefill {
namespace {

struct Job {
  const float* x;  // [rows, 2 * width]
  float* out;      // [rows, width]
  int64_t width;
};

void RunRows(void* data, int64_t first, int64_t last) {
  const Job& job = *static_cast<const Job*>(data);
  for (int64_t r = first; r < last; ++r) {
    const float* x = job.x + r * 2 * job.width;
    SwiGluRow(x, x + job.width, job.out + r * job.width, job.width);
  }
}

OrtStatus* Compute(void*, OrtKernelContext* context) {
  Tensor x;
  EP_RETURN_IF_ERROR(Input(context, 0, &x));
  if (x.dims.empty() || x.dims.back() % 2 != 0)
    return Fail("SwiGlu: the input's last axis must hold gate and up, of equal width");
  float* out = nullptr;
  int64_t rows = 0;
  EP_RETURN_IF_ERROR(RowsOutput(context, x, x.dims.back() / 2, &out, &rows));
  Job job{x.data, out, x.dims.back() / 2};
  ForRowBlocks(context, rows, job.width, RunRows, &job);
  return nullptr;
}

OrtStatus* ORT_API_CALL ComputeKernel(void* kernel, OrtKernelContext* context) {
  return Compute(kernel, context);
}

}  // namespace

const Op& SwiGluOp() {
  static const Op op = MakeOp({"SwiGlu", 1, 1, 0u, CreateStatelessKernel, ComputeKernel,
                               DestroyStatelessKernel});
  return op;
}

}  // namespace edgeprefill
