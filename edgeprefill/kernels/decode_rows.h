// The decode attention of one new token per row, as a piece of work both attention ops run:
// DecodeAttention for every row of its call, PrefillAttention for its rows of one valid
// token (a fused step's decode rows). One copy of the code, so that such a row's output
// and cache are the same bits in either op, and the same whichever other rows share the
// call: quantized projections turn float rounding into other codes, so "the same to
// float32 rounding" would still change a session's tokens (engines/ort/fusing.py).
#pragma once

#include <cstdint>
#include <vector>

#include "kernel_common.h"  // Cache

namespace edgeprefill {

class DecodeRows {
 public:
  struct Layout {
    int64_t heads, kv_heads, capacity, head_dim, rotary;  // rotary <= head_dim, even
    float scale;
    int64_t window;  // local_window_size: a row reads keys FirstKey(position) .. position
    float softcap;   // > 0: each score -> softcap tanh(score / softcap) (soft_cap.h)
    const float* sink = nullptr;  // [heads] or null: each head's sink logit (AddSink)
    bool interleaved = false;     // Rotate's pairs (2i, 2i + 1): rotary_interleaved=1
  };
  // Rotates each listed row's query and new key and writes its key and value into the cache
  // at `positions[i]` (the row's past length), then plans the pieces over the keys it
  // sees (with a window, only the window's: the cost is bounded by it). rows[i] is the row's
  // cache slot, tokens[i] where its token is in the call: its packed q/k/v at
  // qkv + tokens[i] * (heads + 2 kv_heads) * head_dim. Keys and values are the
  // [rows, kv_heads, capacity, head_dim] cache; cos and sin the rotary tables
  // ([positions, rotary / 2]).
  DecodeRows(const Layout& layout, const float* qkv, std::vector<int64_t> rows,
             std::vector<int64_t> tokens, std::vector<int64_t> positions, Cache cache,
             const float* cos, const float* sin);
  size_t Pieces() const { return pieces_.size(); }
  void RunPiece(size_t index);  // on any thread, each index once
  // After every piece ran: row i's output [heads * head_dim] to out + tokens[i] * that, or
  // `by_row`, to out + rows[i] * that (PrefillAttention last=1: one output per row).
  void Finish(float* out, bool by_row = false) const;

 private:
  struct Piece {
    int64_t slot, kv, begin, end;  // slot: index into rows_
  };
  Layout layout_;
  std::vector<int64_t> rows_, tokens_, positions_;
  Cache cache_;
  std::vector<float> q_;  // rotated queries [slots, heads, head_dim]
  std::vector<Piece> pieces_;
  int64_t longest_ = 0;
  std::vector<float> scores_;   // [pieces, group, longest]
  std::vector<float> partial_;  // [pieces, group, head_dim + 2]: output, max, sum
  // What every RunPiece* reads and writes for piece `index`: its KV head's keys and values
  // from the piece's first position, its group's rotated queries, its rows of scores_
  // ([group, longest_]) and of partial_ ([group, head_dim + 2]), the group's size and the
  // piece's positions.
  template <typename T>
  struct PieceView {
    const T* keys;
    const T* values;
    const float* q;
    float* scores;
    float* partial;
    int64_t group, length;
  };
  template <typename T>
  PieceView<T> View(size_t index);
  void CapScores(float* scores, int64_t group, int64_t n) const;  // with a softcap
  // Each head's scores -> exp(score - max), its partial_ row -> 0s, the max and the sum.
  void Softmax(float* scores, float* partial, int64_t group, int64_t n) const;
  template <int C, typename T>
  void RunPieceAvx512(size_t index);
  template <typename T>
  void RunPiecePortable(size_t index);
  template <int C>
  void DispatchAvx512(size_t index);  // RunPieceAvx512<C, T> for the cache's element type
  template <int C, typename T>
  void RunPieceAvx2(size_t index);
  template <int C>
  void DispatchAvx2(size_t index);  // RunPieceAvx2<C, T> for the cache's element type
  template <typename T>
  void RunPieceNeon(size_t index);  // head_dim a multiple of 16, read at run time
};

}  // namespace edgeprefill
