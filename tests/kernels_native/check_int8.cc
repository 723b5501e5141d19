// MatMulInt8's quantization and products (matmul_int8.cc, included here for its functions
// in an unnamed namespace; the harness links every other source but that one) against the
// integer arithmetic its header states, from an unpacked [K, N] weight: every path (VNNI,
// AVX2, NEON sdot, portable) sums the same integers, so the outputs must match to the bit.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "check.h"
#include "matmul_int8.cc"

namespace check {
namespace {

bool Run(const char* name, int64_t m, int64_t k, int64_t n) {
  namespace ep = edgeprefill;
  Random random(static_cast<uint64_t>(m * k * n));
  const std::vector<float> a = random.Floats(m * k), scales = random.Floats(n);
  std::vector<int8_t> w(k * n);  // [K, N]
  for (int8_t& x : w) x = static_cast<int8_t>(std::lround(127.5f * random.Next()));
  // Packed as the op takes it: [P, K4, 64, 4], zero past K and N; and the columns' code sums.
  const int64_t k4 = (k + 3) / 4, panels = (n + ep::kPanel - 1) / ep::kPanel;
  std::vector<int8_t> packed(panels * k4 * ep::kPanel * 4, 0);
  std::vector<int32_t> sums(n, 0);
  for (int64_t i = 0; i < k; ++i)
    for (int64_t c = 0; c < n; ++c) {
      packed[((c / ep::kPanel * k4 + i / 4) * ep::kPanel + c % ep::kPanel) * 4 + i % 4] = w[i * n + c];
      sums[c] += w[i * n + c];
    }
  std::vector<uint32_t> quads(m * k4);
  std::vector<float> row_scale(m), out(m * n);
  ep::Job job{a.data(), packed.data(), scales.data(), sums.data(), quads.data(),
              row_scale.data(), out.data(), m, k, k4, n, panels,
              (m + ep::kRowBlock - 1) / ep::kRowBlock, false, ep::NormRows{}};
  ep::QuantizeRows(job, 0, m);
  for (int64_t piece = 0; piece < job.row_blocks * panels; ++piece)
    ep::RunPiece(&job, static_cast<size_t>(piece));

  int64_t differ = 0;  // outputs whose bits differ
  for (int64_t r = 0; r < m; ++r) {
    float top = 0.0f;
    for (int64_t i = 0; i < k; ++i) top = std::max(top, std::fabs(a[r * k + i]));
    const float scale = top > 0.0f ? top / 127.0f : 1.0f, inverse = 1.0f / scale;
    for (int64_t c = 0; c < n; ++c) {
      int32_t acc = 0;
      for (int64_t i = 0; i < k; ++i)
        acc += static_cast<int32_t>(std::nearbyint(a[r * k + i] * inverse)) * w[i * n + c];
      // Compared as bits: GCC's -ffp-contract=fast would fuse `got - a * b` into one FMA,
      // which skips want's own rounding (a difference of an ulp where there is none).
      const float want = static_cast<float>(acc) * (scales[c] * scale);
      differ += std::memcmp(&out[r * n + c], &want, sizeof want) != 0;
    }
  }
  return Verdict((std::string(name) + " outputs_differing").c_str(), differ, 0.0);
}

}  // namespace

bool MatMulInt8() {
  bool ok = Run("matmul_int8 m7_k203_n150", 7, 203, 150);  // tails: rows, K, panel, quarter
  ok = Run("matmul_int8 m50_k256_n128", 50, 256, 128) && ok;  // two row blocks, whole panels
  return ok;
}

}  // namespace check
