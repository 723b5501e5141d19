// MatMulF32's products (matmul_f32.cc, included here for its functions in an unnamed
// namespace) against float64 sums, on the path this build has (AVX-512F, AVX2, NEON; else
// portable), and each row's bits the same whether it is multiplied alone (a decode row's
// tile) or among others (decode tiles of several rows, a prefill chunk's tiles over blocks
// of K).
#include <cstdint>
#include <vector>

#include "check.h"
#include "matmul_f32.cc"

namespace check {
namespace {

// out = a @ w for w [K, N] float, through the op's panels and pieces.
std::vector<float> Product(const std::vector<float>& a, const std::vector<float>& w, int64_t m,
                           int64_t k, int64_t n) {
  namespace ep = edgeprefill;
  const int64_t panels = (n + ep::kPanel - 1) / ep::kPanel;
  std::vector<float> packed(panels * ep::kPanel * k, 0.0f);  // [P, 4, K, 16]
  for (int64_t i = 0; i < k; ++i)
    for (int64_t c = 0; c < n; ++c) {
      const int64_t p = c / ep::kPanel, s = c % ep::kPanel / ep::kStrip;
      packed[((p * (ep::kPanel / ep::kStrip) + s) * k + i) * ep::kStrip + c % ep::kStrip] =
          w[i * n + c];
    }
  std::vector<float> out(m * n);
  ep::Job job{a.data(), packed.data(), out.data(), m, k, n, panels,
              (m + ep::kRowBlock - 1) / ep::kRowBlock, false, ep::NormRows{}, nullptr};
  for (int64_t piece = 0; piece < job.row_blocks * panels; ++piece)
    ep::RunPiece(&job, static_cast<size_t>(piece));
  return out;
}

double Exact(float x) { return x; }

}  // namespace

bool MatMulF32() {
  // Tails everywhere: rows (decode tiles of 3; prefill tiles of 6, 6, 1), K past one block,
  // the last panel ending inside a strip and a vector.
  const bool decode = CheckProducts("matmul_f32 m3_k203_n150", 3, 203, 150, Product, Exact,
                                    2e-6);
  return CheckProducts("matmul_f32 m13_k300_n150", 13, 300, 150, Product, Exact, 2e-6) &&
         decode;
}

}  // namespace check
