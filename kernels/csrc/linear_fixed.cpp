// y = x W^T + b over a GGUF model's quantized tiles (products.h) with the activations in fixed point:
// each 32 values of a row (one quantized block) as integers p = x / s rounded to the nearest (ties to
// even), s the power of two that puts the block's largest |x| in [2^14, 2^15) (16 bits, the default)
// or in [2^6, 2^7) (8 bits, opt-in; a rounded 128 saturates to 127). The block's sum is then exact
// integer arithmetic, I = sum q p: int16 pairs by AVX-512 VNNI's vpdpwssd (32 products an
// instruction against an fp32 fma's 16), or unsigned weight bytes times signed int8 by vpdpbusd (64;
// Q8_0's q + 128, and 128 sum(p) taken off the sum after). Each output takes per block, in k order,
//     acc = fma(d, float(I) * s, acc);  acc = fma(m, s * sum(p), acc)   (Q4_1; Q8_0 has no m)
// then + b. What differs from the fp32 product (linear.cpp) is the rounding of x to 15-16 bits or 7-8
// bits (relative error below 2^-15 or 2^-7 of the block's largest value), not the weights: an identity
// row gives the dequantized weights' bits (d q exact, + m rounded once), which gguf_weights' binding
// checks. A row's bits depend on that row alone, never on the rows beside it nor on the threads, so
// greedy verification stays exact. SPECRAY_CPU_ACTIVATIONS (kernels/cpu_native.py) picks int16,
// int8 or float32 (the fp32 products), process-wide.
#include <ATen/Parallel.h>

#include <atomic>
#include <cstring>
#include <vector>

#include "kernels.h"
#include "products.h"

namespace specray {
namespace {

std::atomic<int64_t> g_activation_bits{16};  // kernels/cpu_native.py sets it from SPECRAY_CPU_ACTIVATIONS

// rows per register block of TN column tiles: an integer and an fp32 accumulator per row and tile
template <int TN>
constexpr int kRowsFor = TN == 1 ? 11 : 6;
// more rows than this: tile pairs are unpacked once into a scratch every row block reads
constexpr int64_t kScratchRows = 2 * kRowsFor<1>;

// the two fixed-point formats: kPer values of a row per 32-bit lane (int16 pairs, int8 quads), the
// block's largest |x| / s in [2^kE, 2^(kE+1))
template <int kBits>
struct Format;
template <>
struct Format<16> {
  using T = int16_t;
  static constexpr int kPer = 2;
  static constexpr uint32_t kE = 14;
};
template <>
struct Format<8> {
  using T = int8_t;
  static constexpr int kPer = 4;
  static constexpr uint32_t kE = 6;
};
template <int kBits>
constexpr int kSteps = kBlockK / Format<kBits>::kPer;  // lanes of integers per block

// x [M, K] in fixed point, block-major so that a register block's rows sit at fixed offsets from one
// pointer: p [KB][M][32]; s, s * sum(p) and sum(p) [KB][M] (all exact)
template <int kBits>
struct Fixed {
  int64_t M = 0, KB = 0;
  std::vector<typename Format<kBits>::T> p;
  std::vector<float> s, c;
  std::vector<int32_t> sum;
};

inline float from_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline void to_integers(V16 a, float scale, int16_t* out) { vfixed16(a, scale, out); }
inline void to_integers(V16 a, float scale, int8_t* out) { vfixed8(a, scale, out); }

template <int kBits>
void to_fixed(const float* x, int64_t sx, int64_t M, int64_t K, Fixed<kBits>& f) {
  constexpr uint32_t kE = Format<kBits>::kE;
  f.M = M;
  f.KB = K / kBlockK;
  f.p.resize(M * K);
  f.s.resize(M * f.KB);
  f.c.resize(M * f.KB);
  f.sum.resize(M * f.KB);
  at::parallel_for(0, M, M * K >= 16384 ? 1 : M, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m)
      for (int64_t b = 0; b < f.KB; ++b) {
        const float* xb = x + m * sx + b * kBlockK;
        auto* pb = f.p.data() + (b * M + m) * kBlockK;
        const V16 lo = vload(xb), hi = vload(xb + kLanes);
        const bool finite = vfinite(lo) && vfinite(hi);
        const float amax = finite ? vmaxr(vmax(vabs(lo), vabs(hi))) : 0.f;
        uint32_t bits;
        std::memcpy(&bits, &amax, sizeof bits);
        const uint32_t be = (bits >> 23) & 0xFFu;  // amax in [2^(be-127), 2^(be-126)) when normal
        float s = 0.f, c = 0.f;
        int32_t sum = 0;
        if (!finite || be < 15) {  // inf/NaN: every output NaN; below 2^-112: the block counts as 0
          std::memset(pb, 0, kBlockK * sizeof(*pb));
          if (!finite) s = c = from_bits(0x7FC00000u);
        } else {
          s = from_bits((be - kE) << 23);  // 2^(be-127-kE): amax / s in [2^kE, 2^(kE+1))
          const float inv = from_bits((254 + kE - be) << 23);
          to_integers(lo, inv, pb);
          to_integers(hi, inv, pb + kLanes);
          for (int i = 0; i < kBlockK; ++i) sum += pb[i];
          c = s * static_cast<float>(sum);  // |sum| <= 2^20: exact
        }
        f.s[b * M + m] = s;
        f.c[b * M + m] = c;
        f.sum[b * M + m] = sum;
      }
  });
}

// column tiles' weights as lanes of integers: step i of block kb holds k = kPer i .. kPer i + kPer - 1
// (int16 pairs of the signed weights; unsigned bytes for 8 bits, Q8_0's q + 128)
template <typename W, int kBits>
struct TileSteps {
  const W* w;  // [tiles][KB]: the column tiles' blocks
  int64_t KB;
  VI step(int t, int64_t kb, int i) const {
    const W& tile = w[t * KB + kb];
    constexpr bool kQ4 = std::is_same_v<W, Q4_1Tile>;
    if constexpr (kBits == 16) {
      if constexpr (kQ4) return vi_nibble_pairs(tile.q[i]);
      else return vi_i8_pairs(tile.q[2 * i], tile.q[2 * i + 1]);
    } else {
      if constexpr (kQ4) return vi_nibble_quads(tile.q[2 * i]);
      else return vi_u8_quads(tile.q[4 * i]);
    }
  }
  void scale(int t, int64_t kb, V16& d, V16& mn) const { scales_ahead(w + t * KB + kb, d, mn); }
};

// the same steps unpacked once: per tile [KB][steps][16 lanes] int32 and scales [KB][2][16] fp32
template <int kBits>
struct ScratchSteps {
  const int32_t* steps;
  const float* sc;
  int64_t KB;
  VI step(int t, int64_t kb, int i) const { return vi_load(steps + ((t * KB + kb) * kSteps<kBits> + i) * kLanes); }
  void scale(int t, int64_t kb, V16& d, V16& mn) const {
    d = vload(sc + ((t * KB + kb) * 2) * kLanes);
    mn = vload(sc + ((t * KB + kb) * 2 + 1) * kLanes);
  }
};

template <typename W, int kBits>
void unpack(const TileSteps<W, kBits>& src, int tiles, std::vector<int32_t>& steps, std::vector<float>& sc) {
  constexpr int S = kSteps<kBits>;
  const int64_t KB = src.KB;
  steps.resize(tiles * KB * S * kLanes);
  sc.resize(tiles * KB * 2 * kLanes);
  for (int t = 0; t < tiles; ++t)
    for (int64_t kb = 0; kb < KB; ++kb) {
      for (int i = 0; i < S; ++i) vi_store(steps.data() + ((t * KB + kb) * S + i) * kLanes, src.step(t, kb, i));
      V16 d, mn;
      scales(src.w[t * KB + kb], d, mn);
      vstore(sc.data() + ((t * KB + kb) * 2) * kLanes, d);
      vstore(sc.data() + ((t * KB + kb) * 2 + 1) * kLanes, mn);
    }
}

// MR rows (from m0) x TN column tiles (from n0)
template <int MR, int TN, bool kMin, int kBits, typename Src>
inline void fixed_block(const Fixed<kBits>& f, int64_t m0, const Src& src, float* y, int64_t N, int64_t n0,
                        const float* bias) {
  constexpr int S = kSteps<kBits>, kPer = Format<kBits>::kPer;
  const int64_t M = f.M, KB = f.KB;
  V16 acc[MR][TN];
  for (int m = 0; m < MR; ++m)
    for (int t = 0; t < TN; ++t) acc[m][t] = vzero();
  for (int64_t kb = 0; kb < KB; ++kb) {
    VI sum[MR][TN];
    for (int m = 0; m < MR; ++m)
      for (int t = 0; t < TN; ++t) sum[m][t] = vi_zero();
    const auto* pk = f.p.data() + (kb * M + m0) * kBlockK;
    auto lane_step = [&](int i) {
      VI w[TN];
      for (int t = 0; t < TN; ++t) w[t] = src.step(t, kb, i);
      for (int m = 0; m < MR; ++m) {
        int32_t xp;
        std::memcpy(&xp, pk + m * kBlockK + kPer * i, sizeof xp);
        const VI x = vi_set1(xp);
        for (int t = 0; t < TN; ++t) {
          if constexpr (kBits == 16) sum[m][t] = vi_dot2(sum[m][t], w[t], x);
          else sum[m][t] = vi_dot4(sum[m][t], w[t], x);
        }
      }
    };
    if constexpr (MR * TN >= 4) {  // rolled, GCC copied every accumulator between registers once per step
#pragma GCC unroll 16
      for (int i = 0; i < S; ++i) lane_step(i);
    } else {  // a lone row streams the weights: unrolled it was ~5% slower
      for (int i = 0; i < S; ++i) lane_step(i);
    }
    for (int t = 0; t < TN; ++t) {
      V16 d, mn;
      src.scale(t, kb, d, mn);
      for (int m = 0; m < MR; ++m) {
        const int64_t i = kb * M + m0 + m;
        VI exact = sum[m][t];
        if constexpr (kBits == 8 && !kMin) exact = vi_sub(exact, vi_set1(128 * f.sum[i]));  // Q8_0's q + 128
        acc[m][t] = vfma(d, vmul(vi_to_float(exact), vset1(f.s[i])), acc[m][t]);
        if constexpr (kMin) acc[m][t] = vfma(mn, vset1(f.c[i]), acc[m][t]);
      }
    }
  }
  store_block<MR, TN>(acc, y + m0 * N, N, n0, bias);
}

// the last rows < a register block: one block of exactly that many
template <int MR, int TN, bool kMin, int kBits, typename Src>
inline void fixed_tail(int64_t rows, const Fixed<kBits>& f, int64_t m0, const Src& src, float* y, int64_t N,
                       int64_t n0, const float* bias) {
  if constexpr (MR > 0) {
    if (rows == MR) fixed_block<MR, TN, kMin>(f, m0, src, y, N, n0, bias);
    else fixed_tail<MR - 1, TN, kMin>(rows, f, m0, src, y, N, n0, bias);
  }
}

template <int TN, bool kMin, int kBits, typename Src>
void fixed_rows(const Fixed<kBits>& f, int64_t M, const Src& src, float* y, int64_t N, int64_t n0,
                const float* bias) {
  constexpr int R = kRowsFor<TN>;
  int64_t m = 0;
  for (; m + R <= M; m += R) fixed_block<R, TN, kMin>(f, m, src, y, N, n0, bias);
  fixed_tail<R - 1, TN, kMin>(M - m, f, m, src, y, N, n0, bias);
}

template <int kBits, typename W>
void run_fixed(const Fixed<kBits>& f, int64_t M, const W* w, int64_t T, float* y, int64_t N, const float* bias) {
  constexpr bool kMin = std::is_same_v<W, Q4_1Tile>;
  using Tiles = TileSteps<W, kBits>;
  const int64_t KB = f.KB;
  if (M <= kScratchRows) {  // each tile's steps unpacked where they are used: one pass over the weights
    at::parallel_for(0, T, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) fixed_rows<1, kMin>(f, M, Tiles{w + t * KB, KB}, y, N, t * kLanes, bias);
    });
    return;
  }
  at::parallel_for(0, (T + 1) / 2, 1, [&](int64_t p0, int64_t p1) {  // tile pairs, unpacked once each
    std::vector<int32_t> steps;
    std::vector<float> sc;
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t t = 2 * p;
      const Tiles tiles{w + t * KB, KB};
      const int n = t + 1 < T ? 2 : 1;
      unpack(tiles, n, steps, sc);
      const ScratchSteps<kBits> scratch{steps.data(), sc.data(), KB};
      if (n == 2) fixed_rows<2, kMin>(f, M, scratch, y, N, t * kLanes, bias);
      else fixed_rows<1, kMin>(f, M, scratch, y, N, t * kLanes, bias);
    }
  });
}

template <int kBits>
void run_format(const float* x, int64_t sx, int64_t M, int64_t K, const void* packed, int64_t tile_bytes,
                int64_t T, float* y, int64_t N, const float* bias) {
  Fixed<kBits> f;
  to_fixed(x, sx, M, K, f);
  if (tile_bytes == static_cast<int64_t>(sizeof(Q4_1Tile)))
    run_fixed(f, M, static_cast<const Q4_1Tile*>(packed), T, y, N, bias);
  else
    run_fixed(f, M, static_cast<const Q8_0Tile*>(packed), T, y, N, bias);
}

}  // namespace

void set_product_activations(int64_t bits) {
  TORCH_CHECK(bits == 8 || bits == 16 || bits == 32,
              "set_product_activations: bits must be 8 or 16 (fixed point) or 32 (fp32), got ", bits);
  g_activation_bits.store(bits);
}

int64_t product_activations() { return g_activation_bits.load(); }

bool linear_fixed_applies(at::ScalarType packed_type) {
  return packed_type == at::kByte && g_activation_bits.load() != 32;
}

void linear_fixed(const float* x, int64_t sx, int64_t M, int64_t K, const void* packed, int64_t tile_bytes,
                  int64_t T, float* y, int64_t N, const float* bias) {
  if (g_activation_bits.load() == 8) run_format<8>(x, sx, M, K, packed, tile_bytes, T, y, N, bias);
  else run_format<16>(x, sx, M, K, packed, tile_bytes, T, y, N, bias);
}

}  // namespace specray
