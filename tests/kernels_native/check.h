// What the harness's checks share: seeded random inputs and the one-line verdicts the
// pytest wrapper (tests/test_kernels_native.py) reads.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace check {

// Uniform floats in [-1, 1) from a fixed seed (xorshift): the same inputs on every CPU.
class Random {
 public:
  explicit Random(uint64_t seed) : state_(seed * 2654435761u + 1) {}
  float Next() {
    state_ ^= state_ << 13;
    state_ ^= state_ >> 7;
    state_ ^= state_ << 17;
    return static_cast<float>(state_ >> 40) / static_cast<float>(1 << 23) - 1.0f;
  }
  std::vector<float> Floats(size_t count) {
    std::vector<float> v(count);
    for (float& x : v) x = Next();
    return v;
  }

 private:
  uint64_t state_;
};

// Prints "ok NAME error=E tolerance=T" or "FAIL NAME ..." and returns whether `error` (the
// largest error, or a count of differing outputs) is within `tolerance`.
inline bool Verdict(const char* name, double error, double tolerance) {
  const bool ok = error <= tolerance;
  std::printf("%s %s error=%.3g tolerance=%.3g\n", ok ? "ok" : "FAIL", name, error, tolerance);
  return ok;
}

// A float projection's `product(a, w, m, k, n)` (out = a @ w for a [m, k], w [k, n]) on
// seeded inputs: its largest error against the float64 sums of operand(a) x operand(w)
// (the operands as the kernel multiplies them), relative to the sum of the products'
// magnitudes, within `tolerance`; and each row's outputs the same bits as that row
// multiplied alone. Two verdicts, "NAME relative_error" and "NAME rows_differing_from_alone".
template <class Product, class Operand>
bool CheckProducts(const char* name, int64_t m, int64_t k, int64_t n, Product product,
                   Operand operand, double tolerance) {
  Random random(static_cast<uint64_t>(m * k + n));
  const std::vector<float> a = random.Floats(m * k), w = random.Floats(k * n);
  const std::vector<float> out = product(a, w, m, k, n);
  double error = 0.0;
  int64_t differ = 0;
  for (int64_t r = 0; r < m; ++r) {
    const std::vector<float> row(a.begin() + r * k, a.begin() + (r + 1) * k);
    const std::vector<float> alone = product(row, w, 1, k, n);
    for (int64_t c = 0; c < n; ++c) {
      double exact = 0.0, magnitude = 0.0;
      for (int64_t i = 0; i < k; ++i) {
        const double term = operand(a[r * k + i]) * operand(w[i * n + c]);
        exact += term;
        magnitude += std::fabs(term);
      }
      error = std::max(error, std::fabs(out[r * n + c] - exact) / magnitude);
      differ += std::memcmp(&out[r * n + c], &alone[c], sizeof alone[c]) != 0;
    }
  }
  const bool close = Verdict((std::string(name) + " relative_error").c_str(), error, tolerance);
  return Verdict((std::string(name) + " rows_differing_from_alone").c_str(), differ, 0.0) &&
         close;
}

// Each kernel's checks (check_*.cc): true when all passed.
bool DecodeAttention();
bool MatMulInt8();
bool MatMulBf16();
bool MatMulF32();
bool RowOps();

}  // namespace check
