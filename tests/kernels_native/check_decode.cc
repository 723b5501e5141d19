// DecodeRows (decode_rows.h: DecodeAttention's work, and PrefillAttention's one-token rows)
// against attention computed in double from the same cache: the new key and value it wrote,
// then each row's output.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "check.h"
#include "decode_rows.h"
#include "kernel_common.h"

namespace check {
namespace {

constexpr int64_t kHeads = 4, kKvHeads = 2, kCapacity = 320;
const std::vector<int64_t> kPositions = {0, 37, 300};  // 301 keys: two pieces, key tails

struct Case {
  const char* name;
  int64_t head_dim, rotary;
  bool interleaved, bf16;
  int64_t window;
  float softcap;
  bool sink;
};

// The cache element at `at` as float.
float CacheAt(const std::vector<float>& f, const std::vector<uint16_t>& b, bool bf16, int64_t at) {
  return bf16 ? edgeprefill::FromBf16(b[at]) : f[at];
}

// x rotated by angle table row (cos, sin), in double: halves against each other, or pairs.
std::vector<double> Rotated(const float* x, const float* cos, const float* sin, const Case& c) {
  std::vector<double> out(x, x + c.head_dim);
  const int64_t half = c.rotary / 2;
  for (int64_t i = 0; i < half; ++i) {
    const int64_t a = c.interleaved ? 2 * i : i, b = c.interleaved ? 2 * i + 1 : i + half;
    out[a] = double{x[a]} * cos[i] - double{x[b]} * sin[i];
    out[b] = double{x[b]} * cos[i] + double{x[a]} * sin[i];
  }
  return out;
}

bool Run(const Case& c) {
  const int64_t d = c.head_dim, rows = static_cast<int64_t>(kPositions.size());
  const int64_t width = (kHeads + 2 * kKvHeads) * d, group = kHeads / kKvHeads;
  const float scale = 4.0f / std::sqrt(static_cast<float>(d));  // peaked softmaxes
  Random random(static_cast<uint64_t>(d) * 7 + c.bf16);
  const std::vector<float> qkv = random.Floats(rows * width);
  std::vector<float> angles = random.Floats(kCapacity * (c.rotary / 2)), cos(angles.size()),
                     sin(angles.size());
  for (size_t i = 0; i < angles.size(); ++i) {
    cos[i] = std::cos(3.0f * angles[i]);
    sin[i] = std::sin(3.0f * angles[i]);
  }
  const size_t cache_size = rows * kKvHeads * kCapacity * d;
  std::vector<float> keys = random.Floats(cache_size), values = random.Floats(cache_size);
  std::vector<uint16_t> keys16(cache_size), values16(cache_size);
  edgeprefill::ToBf16(keys.data(), cache_size, keys16.data());
  edgeprefill::ToBf16(values.data(), cache_size, values16.data());
  const std::vector<float> sinks = random.Floats(kHeads);

  edgeprefill::DecodeRows::Layout layout{kHeads, kKvHeads, kCapacity, d, c.rotary, scale,
                                         c.window, c.softcap, c.sink ? sinks.data() : nullptr,
                                         c.interleaved};
  edgeprefill::Cache cache = c.bf16 ? edgeprefill::Cache{keys16.data(), values16.data(), true}
                                    : edgeprefill::Cache{keys.data(), values.data(), false};
  std::vector<int64_t> slots = {0, 1, 2};
  edgeprefill::DecodeRows work(layout, qkv.data(), slots, slots, kPositions, cache, cos.data(),
                               sin.data());
  for (size_t piece = 0; piece < work.Pieces(); ++piece) work.RunPiece(piece);
  std::vector<float> out(rows * kHeads * d);
  work.Finish(out.data());

  // The new keys' and values' error (absolute below 1, relative above), the outputs'. A
  // float cache: the rotation's two float32 roundings (<= 2.4e-7 at these magnitudes); a
  // bf16 cache adds its own rounding to 8 significant bits, 2^-8 relative at most.
  double written = 0.0, attended = 0.0;
  const double key_tolerance = c.bf16 ? 1.0 / 256 + 1e-6 : 1e-6;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t p = kPositions[r];
    const float* packed = qkv.data() + r * width;
    const float* row_cos = cos.data() + p * (c.rotary / 2);
    const float* row_sin = sin.data() + p * (c.rotary / 2);
    for (int64_t kv = 0; kv < kKvHeads; ++kv) {
      const int64_t base = (r * kKvHeads + kv) * kCapacity * d;
      const std::vector<double> key = Rotated(packed + (kHeads + kv) * d, row_cos, row_sin, c);
      for (int64_t k = 0; k < d; ++k) {
        const double got = CacheAt(keys, keys16, c.bf16, base + p * d + k);
        const double value = packed[(kHeads + kKvHeads + kv) * d + k];
        written = std::max(written, std::fabs(got - key[k]) / std::max(1.0, std::fabs(key[k])));
        written = std::max(written, std::fabs(CacheAt(values, values16, c.bf16, base + p * d + k) -
                                              value) / std::max(1.0, std::fabs(value)));
      }
    }
    for (int64_t h = 0; h < kHeads; ++h) {
      const int64_t base = (r * kKvHeads + h / group) * kCapacity * d;
      const std::vector<double> q = Rotated(packed + h * d, row_cos, row_sin, c);
      const int64_t first = c.window > 0 && p >= c.window ? p - c.window + 1 : 0;
      std::vector<double> scores;
      for (int64_t j = first; j <= p; ++j) {
        double dot = 0.0;
        for (int64_t k = 0; k < d; ++k) dot += q[k] * CacheAt(keys, keys16, c.bf16, base + j * d + k);
        dot *= scale;
        scores.push_back(c.softcap > 0.0f ? c.softcap * std::tanh(dot / c.softcap) : dot);
      }
      const double top = *std::max_element(scores.begin(), scores.end());
      double total = c.sink ? std::exp(double{sinks[h]} - top) : 0.0;
      std::vector<double> sum(d, 0.0);
      for (int64_t j = first; j <= p; ++j) {
        const double w = std::exp(scores[j - first] - top);
        total += w;
        for (int64_t k = 0; k < d; ++k) sum[k] += w * CacheAt(values, values16, c.bf16, base + j * d + k);
      }
      for (int64_t k = 0; k < d; ++k)
        attended = std::max(attended, std::fabs(out[(r * kHeads + h) * d + k] - sum[k] / total));
    }
  }
  // 1e-5: float32 sums of up to 576 products and 301 weighted values, in another order than
  // the double reference's, differ from it by a few float32 ulps of the sums (~1e-6 here); a
  // wrong lane, key or head errs by ~1e-1.
  const std::string name = std::string("decode_attention ") + c.name;
  const bool ok = Verdict((name + " cache").c_str(), written, key_tolerance);
  return Verdict((name + " output").c_str(), attended, 1e-5) && ok;
}

}  // namespace

bool DecodeAttention() {
  const Case cases[] = {
      {"d64", 64, 64, false, false, 0, 0.0f, false},
      {"d48_portable_on_x86", 48, 48, false, false, 0, 0.0f, false},
      {"d128_bf16_cache", 128, 128, false, true, 0, 0.0f, false},
      {"d80_window_softcap_sink_interleaved", 80, 32, true, false, 100, 30.0f, true},
      {"d576_mla", 576, 64, false, false, 0, 0.0f, false},
  };
  bool ok = true;
  for (const Case& c : cases) ok = Run(c) && ok;
  return ok;
}

}  // namespace check
