// edgeprefill.SkipRmsNorm: the residual add and the RMS norm after it, in place of
// com.microsoft.SkipSimplifiedLayerNormalization (without bias) as the exporter writes it
// between a layer's blocks (export/flavors.py). ONNX Runtime's CPU kernel for it runs one
// scalar loop per row: ~160 us per 256 x 576 call on one core of a Zen 4 VM. This op, bound
// by moving the rows (x, skip, sum, out: 2.4 MB), takes ~73 there, ~40 on two cores. A
// prefill chunk runs two per layer.
//
// Inputs:  0 x [..., H] float, 1 skip [..., H] float (the same shape), 2 gamma [H] float
// Outputs: 0 out [..., H] = sum / sqrt(mean(sum^2) + epsilon) * gamma
//          1 sum [..., H] = x + skip (the residual stream)
// Attribute: epsilon (float).
//
// Each row is one piece of work on one thread, with the same sums in the same order
// whatever the rows around it: a row's numbers do not depend on its batch-mates. The row
// arithmetic is rms_norm.h's; where a native projection reads the norm's output, the
// projection runs it itself (kernels/rms_norm.py's fold_norms) and this op is not in the graph.

#include <cstdint>

#include "kernel_common.h"
#include "rms_norm.h"

namespace edgeprefill {
namespace {

struct Job {
  const float* x;
  const float* skip;
  const float* gamma;
  float* out;
  float* sum;
  int64_t width;
  float epsilon;
};

void RunRows(void* data, int64_t first, int64_t last) {
  const Job& job = *static_cast<const Job*>(data);
  const int64_t w = job.width;
  for (int64_t r = first; r < last; ++r) {
    float* sum = job.sum + r * w;
    const float squares = AddRow(job.x + r * w, job.skip + r * w, sum, w);
    ScaleRow(sum, job.gamma, InverseRms(squares, w, job.epsilon), job.out + r * w, w);
  }
}

OrtStatus* Compute(void* kernel, OrtKernelContext* context) {
  Tensor x, skip, gamma;
  EP_RETURN_IF_ERROR(Input(context, 0, &x));
  EP_RETURN_IF_ERROR(Input(context, 1, &skip));
  EP_RETURN_IF_ERROR(Input(context, 2, &gamma));
  if (x.dims.empty() || skip.dims != x.dims || gamma.dims != std::vector<int64_t>{x.dims.back()})
    return Fail("SkipRmsNorm: x and skip must have one shape [..., H] and gamma be [H]");
  float *out = nullptr, *sum = nullptr;
  int64_t rows = 0;
  EP_RETURN_IF_ERROR(RowsOutput(context, x, x.dims.back(), &out, &rows));
  EP_RETURN_IF_ERROR(Output(context, 1, x.dims, &sum));
  Job job{x.data, skip.data, gamma.data, out, sum, x.dims.back(), *static_cast<float*>(kernel)};
  ForRowBlocks(context, rows, job.width, RunRows, &job);
  return nullptr;
}

OrtStatus* CreateKernel(const OrtKernelInfo* info, void** kernel) {
  float epsilon = 0.0f;
  EP_RETURN_IF_ERROR(g_api->KernelInfoGetAttribute_float(info, "epsilon", &epsilon));
  if (!(epsilon >= 0.0f)) return Fail("SkipRmsNorm: epsilon must be >= 0");
  *kernel = new float(epsilon);
  return nullptr;
}

void ORT_API_CALL DestroyKernel(void* kernel) { delete static_cast<float*>(kernel); }

OrtStatus* ORT_API_CALL ComputeKernel(void* kernel, OrtKernelContext* context) {
  return Compute(kernel, context);
}

}  // namespace

const Op& SkipRmsNormOp() {
  static const Op op = MakeOp({"SkipRmsNorm", 3, 2, 0u, CreateKernel, ComputeKernel,
                               DestroyKernel});
  return op;
}

}  // namespace edgeprefill
