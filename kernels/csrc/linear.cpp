// y = x W^T + b over a weight packed once into column tiles: packed [T, K, 16] holds output columns
// 16t..16t+15 for every k (zero past N), so a tile streams as one contiguous run. The packed weight
// is fp32, or bf16 (half the bytes to stream; each value widened exactly to fp32 before its fma,
// so x, the sums and y stay fp32). Every output is
// fma(w[k], x[k], acc) for k = 0..K-1 in order, then + b: a row's bits do not depend on how many
// rows share the call (greedy verification checks drafts against exactly what decoding computes),
// nor on the thread count. Rows go through in register blocks of up to 12 rows x 2 tiles, so the
// weights are read from memory once per call for any row count; threads split the tiles.
//
// The packed weight can also be a GGUF model's own quantized blocks (uint8 [T, K / 32, bytes], one
// struct below per 16 columns x 32 k): Q4_1 (w = d q + m, 5 bits a weight) or Q8_0 (w = d q, 8.5).
// Each weight is rebuilt in fp32 right before its fma with the same rounding as the dequantization
// that produced the fp32 model (gguf's d * q exact, then + m rounded once: one fma), so the product
// has the fp32 packed weight's bits while streaming 6.4x (Q4_1) or 3.8x (Q8_0) fewer bytes.
#include "kernels.h"
#include "products.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <type_traits>
#include <vector>

namespace specray {
namespace {

constexpr int kRowBlock = 12;  // 12 rows x 2 tiles: 24 accumulators + 2 weight registers of 32
// quantized tiles also hold scales and minimums in registers: 12 rows spill (2026-11-27, 2-core Xeon VM,
// Q4_1 decoder matrices: 11 rows 10.5 ms a pass, 12 rows 13.3 with blocks of 12, 13.5 as 11 + 1)
constexpr int kQuantRowBlock = 11;
// each k reads one 64-byte line per tile; prefetching 64 lines (4 KB) ahead keeps enough loads in
// flight once a block's FMAs slow the loop down (8-12 rows: ~15% faster on the 2-core Xeon VM)
constexpr int64_t kPrefetchLines = 64;

// elements of W one tile (16 columns) spans over K
template <typename W>
constexpr int64_t tile_elems(int64_t K) {
  if constexpr (kQuantized<W>) return K / kBlockK;
  else return K * kLanes;
}

// acc[m][t] = fma(w[t], x[m][k], acc[m][t]) for every row m: one k of every product's fixed order
template <int MR, int TN>
inline void fma_rows(V16 (&acc)[MR][TN], const V16 (&w)[TN], const float* x, int64_t sx, int64_t k) {
  for (int m = 0; m < MR; ++m) {
    const V16 xb = vset1(x[m * sx + k]);
    for (int t = 0; t < TN; ++t) acc[m][t] = vfma(w[t], xb, acc[m][t]);
  }
}

template <int MR, int TN, typename W>
inline void block(const float* x, int64_t sx, const W* w, int64_t K, float* y, int64_t N, int64_t n0,
                  const float* bias) {
  V16 acc[MR][TN];
  for (int m = 0; m < MR; ++m)
    for (int t = 0; t < TN; ++t) acc[m][t] = vzero();
  for (int64_t k = 0; k < K; ++k) {
    V16 wv[TN];
    for (int t = 0; t < TN; ++t) {
      __builtin_prefetch(w + (t * K + k + kPrefetchLines) * kLanes, 0, 3);
      wv[t] = vload_w(w + (t * K + k) * kLanes);
    }
    fma_rows<MR, TN>(acc, wv, x, sx, k);
  }
  store_block<MR, TN>(acc, y, N, n0, bias);
}

// A quantized tile's weights at k0 .. k0 + kStep - 1 rebuilt in fp32 (16 columns each), rounded as the
// dequantization that made the fp32 model: Q4_1 d q + m (d q exact: one fma), Q8_0 d q (exact).
inline void rebuild(const Q4_1Tile& tile, int k0, V16 d, V16 mn, V16 (&w)[2]) {
  V16 q0, q1;
  vload_nibbles(tile.q[k0 / 2], q0, q1);
  w[0] = vfma(q0, d, mn);
  w[1] = vfma(q1, d, mn);
}
inline void rebuild(const Q8_0Tile& tile, int k0, V16 d, V16 /*mn*/, V16 (&w)[1]) {
  w[0] = vmul(vload_i8(tile.q[k0]), d);
}
template <typename W>
constexpr int kStep = std::is_same_v<W, Q4_1Tile> ? 2 : 1;  // k a rebuild yields
// block's contract over quantized tiles: each k's 16 weights rebuilt in fp32, then the same fma order
template <int MR, int TN, typename W>
inline void qblock(const float* x, int64_t sx, const W* w, int64_t K, float* y, int64_t N, int64_t n0,
                   const float* bias) {
  const int64_t KB = K / kBlockK;
  V16 acc[MR][TN];
  for (int m = 0; m < MR; ++m)
    for (int t = 0; t < TN; ++t) acc[m][t] = vzero();
  for (int64_t kb = 0; kb < KB; ++kb) {
    const W* tile[TN];
    V16 d[TN], mn[TN];
    for (int t = 0; t < TN; ++t) {
      tile[t] = w + t * KB + kb;
      scales_ahead(tile[t], d[t], mn[t]);
    }
    const float* xk = x + kb * kBlockK;
    for (int k0 = 0; k0 < kBlockK; k0 += kStep<W>) {
      V16 wk[TN][kStep<W>];
      for (int t = 0; t < TN; ++t) rebuild(*tile[t], k0, d[t], mn[t], wk[t]);
      for (int s = 0; s < kStep<W>; ++s) {  // per accumulator: k0, then k0 + 1, as the fp32 order
        V16 ws[TN];
        for (int t = 0; t < TN; ++t) ws[t] = wk[t][s];
        fma_rows<MR, TN>(acc, ws, xk, sx, k0 + s);
      }
    }
  }
  store_block<MR, TN>(acc, y, N, n0, bias);
}

template <int MR, int TN, typename W>
inline void any_block(const float* x, int64_t sx, const W* w, int64_t K, float* y, int64_t N, int64_t n0,
                      const float* bias) {
  if constexpr (kQuantized<W>) qblock<MR, TN, W>(x, sx, w, K, y, N, n0, bias);
  else block<MR, TN, W>(x, sx, w, K, y, N, n0, bias);
}

template <typename W>
constexpr int row_block() { return kQuantized<W> ? kQuantRowBlock : kRowBlock; }

template <int TN, typename W>
void rows(int64_t M, const float* x, int64_t sx, const W* w, int64_t K, float* y, int64_t N, int64_t n0,
          const float* bias) {
  int64_t m = 0;
  constexpr int R = row_block<W>();
  for (; m + R <= M; m += R) any_block<R, TN, W>(x + m * sx, sx, w, K, y + m * N, N, n0, bias);
  const float* xm = x + m * sx;
  float* ym = y + m * N;
  switch (M - m) {
    case 1: any_block<1, TN, W>(xm, sx, w, K, ym, N, n0, bias); break;
    case 2: any_block<2, TN, W>(xm, sx, w, K, ym, N, n0, bias); break;
    case 3: any_block<3, TN, W>(xm, sx, w, K, ym, N, n0, bias); break;
    case 4: any_block<4, TN, W>(xm, sx, w, K, ym, N, n0, bias); break;
    case 5: any_block<5, TN, W>(xm, sx, w, K, ym, N, n0, bias); break;
    case 6: any_block<6, TN, W>(xm, sx, w, K, ym, N, n0, bias); break;
    case 7: any_block<7, TN, W>(xm, sx, w, K, ym, N, n0, bias); break;
    case 8: any_block<8, TN, W>(xm, sx, w, K, ym, N, n0, bias); break;
    case 9: any_block<9, TN, W>(xm, sx, w, K, ym, N, n0, bias); break;
    case 10: any_block<10, TN, W>(xm, sx, w, K, ym, N, n0, bias); break;
    case 11: any_block<11, TN, W>(xm, sx, w, K, ym, N, n0, bias); break;
    default: break;
  }
}

}  // namespace

namespace {

template <typename E>
void pack_tiles(const E* src, E* dst, int64_t N, int64_t K) {
  const int64_t tiles = (N + kLanes - 1) / kLanes;
  at::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t k = 0; k < K; ++k)
        for (int j = 0; j < kLanes; ++j) {
          const int64_t n = t * kLanes + j;
          dst[(t * K + k) * kLanes + j] = n < N ? src[n * K + k] : E(0);
        }
  });
}

// quantized tiles [n_tiles][K / 32] -> the fp32 packed layout [n_tiles][K][16], each weight rebuilt as
// qblock rebuilds it (the same values, so the same products)
template <typename W>
void dequantize_tiles(const W* w, int64_t n_tiles, int64_t K, float* out) {
  const int64_t KB = K / kBlockK;
  for (int64_t t = 0; t < n_tiles; ++t)
    for (int64_t kb = 0; kb < KB; ++kb) {
      const W& tile = w[t * KB + kb];
      float* o = out + (t * K + kb * kBlockK) * kLanes;
      V16 d, mn;
      scales(tile, d, mn);
      for (int k0 = 0; k0 < kBlockK; k0 += kStep<W>) {
        V16 wk[kStep<W>];
        rebuild(tile, k0, d, mn, wk);
        for (int s = 0; s < kStep<W>; ++s) vstore(o + (k0 + s) * kLanes, wk[s]);
      }
    }
}

template <typename W>
void run_linear(const float* xp, int64_t sx, int64_t M, const W* wp, int64_t K, int64_t T, float* yp, int64_t N,
                const float* bp) {
  // Quantized tiles and more rows than two register blocks: each tile pair is rebuilt once into an
  // fp32 scratch (in cache) that every row block then reads, instead of once per row block (c=64 decode
  // and prefill chunks: the fp32 kernel's arithmetic with 1/6 of its memory traffic).
  const bool rebuild = kQuantized<W> && M > 2 * row_block<W>();
  at::parallel_for(0, (T + 1) / 2, 1, [&](int64_t p0, int64_t p1) {
    std::vector<float> scratch(rebuild ? 2 * K * kLanes : 0);
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t t = 2 * p, n_tiles = std::min<int64_t>(2, T - t);
      const W* wt = wp + t * tile_elems<W>(K);
      if constexpr (kQuantized<W>) {
        if (rebuild) {
          dequantize_tiles(wt, n_tiles, K, scratch.data());
          if (n_tiles == 2) rows<2, float>(M, xp, sx, scratch.data(), K, yp, N, t * kLanes, bp);
          else rows<1, float>(M, xp, sx, scratch.data(), K, yp, N, t * kLanes, bp);
          continue;
        }
      }
      if (n_tiles == 2) rows<2, W>(M, xp, sx, wt, K, yp, N, t * kLanes, bp);
      else rows<1, W>(M, xp, sx, wt, K, yp, N, t * kLanes, bp);
    }
  });
}

}  // namespace

at::Tensor pack_linear(const at::Tensor& weight) {
  TORCH_CHECK(weight.device().is_cpu() && (weight.scalar_type() == at::kFloat || weight.scalar_type() == at::kBFloat16),
              "pack_linear: weight must be a float32 or bfloat16 CPU tensor, got ", weight.scalar_type(), " on ",
              weight.device());
  TORCH_CHECK(weight.dim() == 2, "pack_linear: weight must be [out, in], got ", weight.sizes());
  const at::Tensor w = weight.contiguous();
  const int64_t N = w.size(0), K = w.size(1), T = (N + kLanes - 1) / kLanes;
  at::Tensor packed = at::empty({T, K, kLanes}, w.options());
  if (w.scalar_type() == at::kFloat) pack_tiles(w.const_data_ptr<float>(), packed.mutable_data_ptr<float>(), N, K);
  else pack_tiles(static_cast<const uint16_t*>(w.const_data_ptr()), static_cast<uint16_t*>(packed.mutable_data_ptr()), N, K);
  return packed;
}

int64_t packed_in_features(const at::Tensor& packed) {
  if (packed.scalar_type() == at::kByte) return packed.size(1) * kBlockK;
  return packed.size(1);
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, int64_t N, const std::optional<at::Tensor>& bias,
                  const at::Tensor& out) {
  check_f32(x, "linear: x");
  const auto type = packed.scalar_type();
  TORCH_CHECK(packed.device().is_cpu() && (type == at::kFloat || type == at::kBFloat16 || type == at::kByte),
              "linear: the packed weight must be float32, bfloat16 or uint8 (quantized tiles) on CPU, got ", type);
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, "linear: x must be [M, K] with contiguous rows, got ",
              x.sizes(), " strides ", x.strides());
  const int64_t tile_bytes = type == at::kByte && packed.dim() == 3 ? packed.size(2) : 0;
  TORCH_CHECK(type != at::kByte || tile_bytes == sizeof(Q4_1Tile) || tile_bytes == sizeof(Q8_0Tile),
              "linear: a quantized packed weight must be uint8 [tiles, K / 32, ", sizeof(Q4_1Tile), " (Q4_1) or ",
              sizeof(Q8_0Tile), " (Q8_0)], got ", packed.sizes());
  TORCH_CHECK(packed.dim() == 3 && (type == at::kByte || packed.size(2) == kLanes) && packed.is_contiguous() &&
                  packed_in_features(packed) == x.size(1) && packed.size(0) * kLanes >= N &&
                  packed.size(0) * kLanes < N + kLanes,
              "linear: packed weight ", packed.sizes(), " does not fit x ", x.sizes(), " and N=", N);
  if (bias) {
    check_f32(*bias, "linear: bias");
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == N && bias->is_contiguous(), "linear: bias must be [", N,
                "], got ", bias->sizes());
  }
  const int64_t M = x.size(0), K = x.size(1), T = packed.size(0);
  at::Tensor y = result_buffer(out, {M, N}, x, "linear");
  if (M == 0 || N == 0) return y;
  const float* xp = x.const_data_ptr<float>();
  const float* bp = bias ? bias->const_data_ptr<float>() : nullptr;
  float* yp = y.mutable_data_ptr<float>();
  const void* wp = packed.const_data_ptr();
  if (linear_fixed_applies(type)) {
    linear_fixed(xp, x.stride(0), M, K, wp, tile_bytes, T, yp, N, bp);
    return y;
  }
  if (type == at::kFloat)
    run_linear(xp, x.stride(0), M, static_cast<const float*>(wp), K, T, yp, N, bp);
  else if (type == at::kBFloat16)
    run_linear(xp, x.stride(0), M, static_cast<const uint16_t*>(wp), K, T, yp, N, bp);
  else if (tile_bytes == sizeof(Q4_1Tile))
    run_linear(xp, x.stride(0), M, static_cast<const Q4_1Tile*>(wp), K, T, yp, N, bp);
  else
    run_linear(xp, x.stride(0), M, static_cast<const Q8_0Tile*>(wp), K, T, yp, N, bp);
  return y;
}

}  // namespace specray
