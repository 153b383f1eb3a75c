// What the products share: linear.cpp's (fp32 activations) and linear_fixed.cpp's (fixed-point
// activations over quantized tiles): the tiles of a GGUF model's quantized matrices as
// kernels/gguf_blocks.py packs them, and how a register block of sums is stored.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "vec16.h"

namespace specray {

constexpr int64_t kBlockK = 32;  // k per quantized block (GGUF's QK4_1 and QK8_0)

// 16 columns x 32 k of Q4_1: per column a scale and a minimum (IEEE half), then 16 rows of 16 bytes,
// row p holding k = 2p in each byte's low nibble and k = 2p + 1 in its high one (column j in byte j)
struct Q4_1Tile {
  uint16_t d[kLanes];
  uint16_t m[kLanes];
  uint8_t q[kBlockK / 2][kLanes];
};
// 16 columns x 32 k of Q8_0: per column a scale (IEEE half), then 32 rows of 16 int8 (column j in byte j)
struct Q8_0Tile {
  uint16_t d[kLanes];
  int8_t q[kBlockK][kLanes];
};
static_assert(sizeof(Q4_1Tile) == 320 && sizeof(Q8_0Tile) == 544, "quantized tiles must be packed");

template <typename W>
constexpr bool kQuantized = std::is_same_v<W, Q4_1Tile> || std::is_same_v<W, Q8_0Tile>;

// a tile's scale and (Q4_1) minimum
template <typename W>
inline void scales(const W& tile, V16& d, V16& mn) {
  d = vload_f16(tile.d);
  if constexpr (std::is_same_v<W, Q4_1Tile>) mn = vload_f16(tile.m);
  else mn = vzero();
}

// a tile's scales, after asking for the tile ~4 KB further along its column block (the next tiles a
// product streams)
template <typename W>
inline void scales_ahead(const W* tile, V16& d, V16& mn) {
  constexpr int64_t kAhead = 4096 / sizeof(W) + 1;
  prefetch_bytes(tile + kAhead, sizeof(W));
  scales(*tile, d, mn);
}

// the sums of MR rows x TN tiles (columns n0..), + bias, into y [M, N]
template <int MR, int TN>
inline void store_block(const V16 (&acc)[MR][TN], float* y, int64_t N, int64_t n0, const float* bias) {
  for (int t = 0; t < TN; ++t) {
    const int64_t n = n0 + t * kLanes;
    const int valid = static_cast<int>(std::min<int64_t>(kLanes, N - n));
    const V16 b = bias ? vload_n(bias + n, valid) : vzero();
    for (int m = 0; m < MR; ++m) {
      const V16 out = bias ? vadd(acc[m][t], b) : acc[m][t];
      if (valid == kLanes) vstore(y + m * N + n, out);
      else vstore_n(y + m * N + n, out, valid);
    }
  }
}

}  // namespace specray
