// The row ops every path shares (rms_norm.h's AddRow/ScaleRow, swiglu.h's SwiGluRow)
// against double references.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "check.h"
#include "rms_norm.h"
#include "swiglu.h"

namespace check {
namespace {

// RMSNorm(x + skip) * gamma over `width` (a tail past 16 included), relative error.
bool RmsNorm(int64_t width) {
  Random random(static_cast<uint64_t>(width));
  const std::vector<float> x = random.Floats(width), skip = random.Floats(width),
                           gamma = random.Floats(width);
  std::vector<float> sum(width), out(width);
  const float squares = edgeprefill::AddRow(x.data(), skip.data(), sum.data(), width);
  edgeprefill::ScaleRow(sum.data(), gamma.data(), edgeprefill::InverseRms(squares, width, 1e-6f),
                        out.data(), width);
  double mean = 0.0;
  for (int64_t i = 0; i < width; ++i) mean += (double{x[i]} + skip[i]) * (double{x[i]} + skip[i]);
  const double inverse = 1.0 / std::sqrt(mean / width + 1e-6);
  double error = 0.0;
  for (int64_t i = 0; i < width; ++i) {
    const double s = double{x[i]} + skip[i], want = s * inverse * gamma[i];
    error = std::max(error, std::fabs(sum[i] - s));  // a float sum of two floats: exact
    error = std::max(error, std::fabs(out[i] - want) / std::max(1e-3, std::fabs(want)));
  }
  // 1e-5: a float32 sum of squares and three float32 products, relative.
  return Verdict(("rms_norm width" + std::to_string(width)).c_str(), error, 1e-5);
}

// silu(gate) * up with gates out to +-30 (both sigmoid branches), relative error.
bool SwiGlu(int64_t width) {
  Random random(static_cast<uint64_t>(width) + 99);
  std::vector<float> gate = random.Floats(width);
  for (float& g : gate) g *= 30.0f;
  const std::vector<float> up = random.Floats(width);
  std::vector<float> out(width);
  edgeprefill::SwiGluRow(gate.data(), up.data(), out.data(), width);
  double error = 0.0;
  for (int64_t i = 0; i < width; ++i) {
    const double g = gate[i], want = g / (1.0 + std::exp(-g)) * up[i];
    error = std::max(error, std::fabs(out[i] - want) / std::max(1e-6, std::fabs(want)));
  }
  // 1e-5: ExpNonPositive's ~1e-7 and a few float32 roundings, relative; ~1e-12 absolute floor
  // where silu underflows toward 0 at large negative gates.
  return Verdict(("swiglu width" + std::to_string(width)).c_str(), error, 1e-5);
}

}  // namespace

bool RowOps() {
  bool ok = RmsNorm(1000);
  ok = SwiGlu(1000) && ok;
  return ok;
}

}  // namespace check
