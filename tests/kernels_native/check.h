// What the harness's checks share: seeded random inputs and the one-line verdicts the
// pytest wrapper (tests/test_kernels_native.py) reads.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
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

// Each kernel's checks (check_*.cc): true when all passed.
bool DecodeAttention();
bool MatMulInt8();
bool MatMulBf16();
bool MatMulF32();
bool RowOps();

}  // namespace check
