// MatMulBf16's products (matmul_bf16.cc, included here for its functions in an unnamed
// namespace) against the float64 sums of the same bf16-rounded operands, on the path this
// build has (AVX512-BF16; else the widening one: AVX-512F, AVX2, NEON; else portable), and
// each row's bits the same whether it is multiplied alone (a decode row's tile) or among
// others (a prefill chunk's).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "check.h"
#include "matmul_bf16.cc"

namespace check {
namespace {

// out = bf16(a) @ bf16(w) for w [K, N] float, through the op's packing and pieces.
std::vector<float> Product(const std::vector<float>& a, const std::vector<float>& w, int64_t m,
                           int64_t k, int64_t n) {
  namespace ep = edgeprefill;
  const int64_t k2 = (k + 1) / 2, panels = (n + ep::kPanel - 1) / ep::kPanel;
  std::vector<uint32_t> packed(panels * k2 * ep::kPanel, 0);  // [P, K2, 64] bf16 pairs
  for (int64_t i = 0; i < k; ++i)
    for (int64_t c = 0; c < n; ++c)
      packed[(c / ep::kPanel * k2 + i / 2) * ep::kPanel + c % ep::kPanel] |=
          ep::Bf16(w[i * n + c]) << (16 * (i % 2));
  std::vector<uint32_t> pairs(m * k2 * ep::kWordsPerPair);
  std::vector<float> out(m * n);
  ep::Job job{a.data(), packed.data(), pairs.data(), out.data(), m, k, k2, n, panels,
              (m + ep::kRowBlock - 1) / ep::kRowBlock, false, ep::NormRows{}};
  ep::ConvertRows(job, 0, m);
  for (int64_t piece = 0; piece < job.row_blocks * panels; ++piece)
    ep::RunPiece(&job, static_cast<size_t>(piece));
  return out;
}

double Rounded(float x) { return edgeprefill::FromBf16(edgeprefill::Bf16(x)); }

bool Run(const char* name, int64_t m, int64_t k, int64_t n) {
  Random random(static_cast<uint64_t>(m * k + n));
  const std::vector<float> a = random.Floats(m * k), w = random.Floats(k * n);
  const std::vector<float> out = Product(a, w, m, k, n);
  double error = 0.0;  // largest |got - exact| relative to the sum of |products|
  int64_t differ = 0;  // outputs whose bits differ from the row multiplied alone
  for (int64_t r = 0; r < m; ++r) {
    const std::vector<float> row(a.begin() + r * k, a.begin() + (r + 1) * k);
    const std::vector<float> alone = Product(row, w, 1, k, n);
    for (int64_t c = 0; c < n; ++c) {
      double exact = 0.0, magnitude = 0.0;
      for (int64_t i = 0; i < k; ++i) {
        exact += Rounded(a[r * k + i]) * Rounded(w[i * n + c]);
        magnitude += std::fabs(Rounded(a[r * k + i]) * Rounded(w[i * n + c]));
      }
      error = std::max(error, std::fabs(out[r * n + c] - exact) / magnitude);
      differ += std::memcmp(&out[r * n + c], &alone[c], sizeof alone[c]) != 0;
    }
  }
  const bool close = Verdict((std::string(name) + " relative_error").c_str(), error, 1e-5);
  // AVX512-BF16's tiles of several rows and of one sum the same pairs the same way too.
  return Verdict((std::string(name) + " rows_differing_from_alone").c_str(), differ, 0.0) &&
         close;
}

}  // namespace

bool MatMulBf16() {
  return Run("matmul_bf16 m13_k203_n150", 13, 203, 150);  // tails: rows, odd K, panel, slice
}

}  // namespace check
