// A standalone check of the native kernels' row functions against scalar references, with
// no ONNX Runtime: built for this machine, or cross-built for 64-bit Arm and run under
// qemu-aarch64 (tests/test_kernels_native.py). Prints the vector paths compiled in and a
// verdict per check; exits 1 on any failure.
#include <cstdio>

#include "check.h"
#include "kernel_common.h"  // EP_AVX2, EP_NEON

int main() {
  int avx512 = 0, avx2 = 0, neon = 0, dotprod = 0;
#ifdef __AVX512F__
  avx512 = 1;
#endif
#ifdef EP_AVX2
  avx2 = 1;
#endif
#ifdef EP_NEON
  neon = 1;
#endif
#ifdef __ARM_FEATURE_DOTPROD
  dotprod = 1;
#endif
  std::printf("paths avx512=%d avx2=%d neon=%d dotprod=%d\n", avx512, avx2, neon, dotprod);
  bool ok = check::DecodeAttention();
  ok = check::MatMulInt8() && ok;
  ok = check::MatMulBf16() && ok;
  ok = check::MatMulF32() && ok;
  ok = check::RowOps() && ok;
  std::printf(ok ? "all ok\n" : "some FAILED\n");
  return ok ? 0 : 1;
}
