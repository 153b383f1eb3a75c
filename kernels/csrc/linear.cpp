// y = x W^T + b over a weight packed once into column tiles: packed [T, K, 16] holds output columns
// 16t..16t+15 for every k (zero past N), so a tile streams as one contiguous run. The packed weight
// is fp32, or bf16 (half the bytes to stream; each value widened exactly to fp32 before its fma,
// so x, the sums and y stay fp32). Every output is
// fma(w[k], x[k], acc) for k = 0..K-1 in order, then + b: a row's bits do not depend on how many
// rows share the call (greedy verification checks drafts against exactly what decoding computes),
// nor on the thread count. Rows go through in register blocks of up to 12 rows x 2 tiles, so the
// weights are read from memory once per call for any row count; threads split the tiles.
#include "kernels.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <algorithm>

namespace specray {
namespace {

constexpr int kRowBlock = 12;  // 12 rows x 2 tiles: 24 accumulators + 2 weight registers of 32
// each k reads one 64-byte line per tile; prefetching 64 lines (4 KB) ahead keeps enough loads in
// flight once a block's FMAs slow the loop down (8-12 rows: ~15% faster on the 2-core Xeon VM)
constexpr int64_t kPrefetchLines = 64;

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
    for (int m = 0; m < MR; ++m) {
      const V16 xb = vset1(x[m * sx + k]);
      for (int t = 0; t < TN; ++t) acc[m][t] = vfma(wv[t], xb, acc[m][t]);
    }
  }
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

template <int TN, typename W>
void rows(int64_t M, const float* x, int64_t sx, const W* w, int64_t K, float* y, int64_t N, int64_t n0,
          const float* bias) {
  int64_t m = 0;
  for (; m + kRowBlock <= M; m += kRowBlock) block<kRowBlock, TN, W>(x + m * sx, sx, w, K, y + m * N, N, n0, bias);
  const float* xm = x + m * sx;
  float* ym = y + m * N;
  switch (M - m) {
    case 1: block<1, TN, W>(xm, sx, w, K, ym, N, n0, bias); break;
    case 2: block<2, TN, W>(xm, sx, w, K, ym, N, n0, bias); break;
    case 3: block<3, TN, W>(xm, sx, w, K, ym, N, n0, bias); break;
    case 4: block<4, TN, W>(xm, sx, w, K, ym, N, n0, bias); break;
    case 5: block<5, TN, W>(xm, sx, w, K, ym, N, n0, bias); break;
    case 6: block<6, TN, W>(xm, sx, w, K, ym, N, n0, bias); break;
    case 7: block<7, TN, W>(xm, sx, w, K, ym, N, n0, bias); break;
    case 8: block<8, TN, W>(xm, sx, w, K, ym, N, n0, bias); break;
    case 9: block<9, TN, W>(xm, sx, w, K, ym, N, n0, bias); break;
    case 10: block<10, TN, W>(xm, sx, w, K, ym, N, n0, bias); break;
    case 11: block<11, TN, W>(xm, sx, w, K, ym, N, n0, bias); break;
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

template <typename W>
void run_linear(const float* xp, int64_t sx, int64_t M, const W* wp, int64_t K, int64_t T, float* yp, int64_t N,
                const float* bp) {
  at::parallel_for(0, (T + 1) / 2, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t t = 2 * p;
      if (t + 1 < T) rows<2, W>(M, xp, sx, wp + t * K * kLanes, K, yp, N, t * kLanes, bp);
      else rows<1, W>(M, xp, sx, wp + t * K * kLanes, K, yp, N, t * kLanes, bp);
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

at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, int64_t N, const std::optional<at::Tensor>& bias,
                  const at::Tensor& out) {
  check_f32(x, "linear: x");
  TORCH_CHECK(packed.device().is_cpu() && (packed.scalar_type() == at::kFloat || packed.scalar_type() == at::kBFloat16),
              "linear: the packed weight must be float32 or bfloat16 on CPU, got ", packed.scalar_type());
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, "linear: x must be [M, K] with contiguous rows, got ",
              x.sizes(), " strides ", x.strides());
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == kLanes && packed.is_contiguous() &&
                  packed.size(1) == x.size(1) && packed.size(0) * kLanes >= N && packed.size(0) * kLanes < N + kLanes,
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
  if (packed.scalar_type() == at::kFloat)
    run_linear(xp, x.stride(0), M, packed.const_data_ptr<float>(), K, T, yp, N, bp);
  else
    run_linear(xp, x.stride(0), M, static_cast<const uint16_t*>(packed.const_data_ptr()), K, T, yp, N, bp);
  return y;
}

}  // namespace specray
