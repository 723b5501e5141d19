// MatMulBf16's products (matmul_bf16.cc, included here for its functions in an unnamed
// namespace) against the float64 sums of the same bf16-rounded operands, on the path this
// build has (AVX512-BF16; else the widening one: AVX-512F, AVX2, NEON; else portable), and
// each row's bits the same whether it is multiplied alone (a decode row's tile) or among
// others (a prefill chunk's).
#include <cstdint>
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

}  // namespace

bool MatMulBf16() {
  // tails: rows, odd K, panel, slice; AVX512-BF16's tiles of several rows and of one sum
  // the same pairs the same way too
  return CheckProducts("matmul_bf16 m13_k203_n150", 13, 203, 150, Product, Rounded, 1e-5);
}

}  // namespace check
