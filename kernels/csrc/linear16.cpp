// y = x W^T + b over a GGUF model's quantized tiles (products.h) with the activations in 16-bit fixed
// point: each 32 values of a row (one quantized block) as integers p = x / s rounded to the nearest
// (ties to even), s the power of two that puts the block's largest |x| in [2^14, 2^15). The block's
// sum is then exact integer arithmetic, I = sum q p (int16 pairs: AVX-512 VNNI's vpdpwssd, 32
// products an instruction against an fp32 fma's 16), and each output takes per block, in k order,
//     acc = fma(d, float(I) * s, acc);  acc = fma(m, s * sum(p), acc)   (Q4_1; Q8_0 has no m)
// then + b. What differs from the fp32 product (linear.cpp) is the rounding of x to 15-16 bits
// (relative error below 2^-15 of the block's largest value), not the weights: an identity row gives
// the dequantized weights' bits (d q exact, + m rounded once), which gguf_weights' binding checks.
// A row's bits depend on that row alone, never on the rows beside it nor on the threads, so greedy
// verification stays exact. The fp32 stream and the fp32 products remain (SPECRAY_CPU_ACTIVATIONS).
#include <ATen/Parallel.h>

#include <atomic>
#include <cstring>
#include <vector>

#include "kernels.h"
#include "products.h"

namespace specray {
namespace {

std::atomic<int64_t> g_activation_bits{16};  // kernels/cpu_native.py sets it from SPECRAY_CPU_ACTIVATIONS

constexpr int kRows = 11;  // rows per register block: 11 integer and 11 fp32 accumulators
// more rows than this: a tile's pairs are unpacked once into a scratch every row block reads
constexpr int64_t kScratchRows = 2 * kRows;

// x [M, K] in fixed point: p [M, K] int16; per row and block the scale s and s * sum(p) (both exact)
struct Fixed16 {
  int64_t K = 0, KB = 0;
  std::vector<int16_t> p;
  std::vector<float> s, c;
};

inline float from_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

void to_fixed16(const float* x, int64_t sx, int64_t M, int64_t K, Fixed16& f) {
  f.K = K;
  f.KB = K / kBlockK;
  f.p.resize(M * K);
  f.s.resize(M * f.KB);
  f.c.resize(M * f.KB);
  at::parallel_for(0, M, M * K >= 16384 ? 1 : M, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m)
      for (int64_t b = 0; b < f.KB; ++b) {
        const float* xb = x + m * sx + b * kBlockK;
        int16_t* pb = f.p.data() + m * K + b * kBlockK;
        const V16 lo = vload(xb), hi = vload(xb + kLanes);
        const bool finite = vfinite(lo) && vfinite(hi);
        const float amax = finite ? vmaxr(vmax(vabs(lo), vabs(hi))) : 0.f;
        uint32_t bits;
        std::memcpy(&bits, &amax, sizeof bits);
        const uint32_t be = (bits >> 23) & 0xFFu;  // amax in [2^(be-127), 2^(be-126)) when normal
        float s = 0.f, c = 0.f;
        if (!finite || be < 15) {  // inf/NaN: every output NaN; below 2^-112: the block counts as 0
          std::memset(pb, 0, kBlockK * sizeof(int16_t));
          if (!finite) s = c = from_bits(0x7FC00000u);
        } else {
          s = from_bits((be - 14) << 23);  // 2^(be-141): amax / s in [2^14, 2^15)
          const float inv = from_bits((268 - be) << 23);
          vfixed16(lo, inv, pb);
          vfixed16(hi, inv, pb + kLanes);
          int32_t sum = 0;
          for (int i = 0; i < kBlockK; ++i) sum += pb[i];
          c = s * static_cast<float>(sum);  // |sum| <= 2^20: exact
        }
        f.s[m * f.KB + b] = s;
        f.c[m * f.KB + b] = c;
      }
  });
}

// a tile column's weights as int16 pairs: pair p of block kb holds k = 2p (low half) and 2p + 1
template <typename W>
struct TilePairs {
  const W* w;  // [KB]: the column tile's blocks
  VI pair(int64_t kb, int p) const {
    if constexpr (std::is_same_v<W, Q4_1Tile>) return vi_nibble_pairs(w[kb].q[p]);
    else return vi_i8_pairs(w[kb].q[2 * p], w[kb].q[2 * p + 1]);
  }
  void scale(int64_t kb, V16& d, V16& mn) const {
    constexpr int64_t kAhead = 4096 / sizeof(W) + 1;
    const char* ahead = reinterpret_cast<const char*>(w + kb + kAhead);
    for (size_t line = 0; line < sizeof(W); line += 64) __builtin_prefetch(ahead + line, 0, 3);
    scales(w[kb], d, mn);
  }
};

// the same pairs unpacked once ([KB][16 pairs][16 lanes] int32, scales [KB][2][16] fp32)
struct ScratchPairs {
  const int32_t* pairs;
  const float* sc;
  VI pair(int64_t kb, int p) const { return vi_load(pairs + (kb * (kBlockK / 2) + p) * kLanes); }
  void scale(int64_t kb, V16& d, V16& mn) const {
    d = vload(sc + kb * 2 * kLanes);
    mn = vload(sc + (kb * 2 + 1) * kLanes);
  }
};

template <typename W>
void unpack(const TilePairs<W>& src, int64_t KB, std::vector<int32_t>& pairs, std::vector<float>& sc) {
  pairs.resize(KB * (kBlockK / 2) * kLanes);
  sc.resize(KB * 2 * kLanes);
  for (int64_t kb = 0; kb < KB; ++kb) {
    for (int p = 0; p < kBlockK / 2; ++p) vi_store(pairs.data() + (kb * (kBlockK / 2) + p) * kLanes, src.pair(kb, p));
    V16 d, mn;
    scales(src.w[kb], d, mn);
    vstore(sc.data() + kb * 2 * kLanes, d);
    vstore(sc.data() + (kb * 2 + 1) * kLanes, mn);
  }
}

// MR rows (from m0) x one column tile (n0..n0 + 15)
template <int MR, bool kMin, typename Src>
inline void fixed_block(const Fixed16& f, int64_t m0, const Src& src, float* y, int64_t N, int64_t n0,
                        const float* bias) {
  const int64_t K = f.K, KB = f.KB;
  V16 acc[MR][1];
  for (int m = 0; m < MR; ++m) acc[m][0] = vzero();
  for (int64_t kb = 0; kb < KB; ++kb) {
    VI sum[MR];
    for (int m = 0; m < MR; ++m) sum[m] = vi_zero();
    const int16_t* pk = f.p.data() + m0 * K + kb * kBlockK;
    for (int p = 0; p < kBlockK / 2; ++p) {
      const VI w = src.pair(kb, p);
      for (int m = 0; m < MR; ++m) {
        int32_t xp;
        std::memcpy(&xp, pk + m * K + 2 * p, sizeof xp);
        sum[m] = vi_dot2(sum[m], w, vi_set1(xp));
      }
    }
    V16 d, mn;
    src.scale(kb, d, mn);
    for (int m = 0; m < MR; ++m) {
      const int64_t i = (m0 + m) * KB + kb;
      acc[m][0] = vfma(d, vmul(vi_to_float(sum[m]), vset1(f.s[i])), acc[m][0]);
      if constexpr (kMin) acc[m][0] = vfma(mn, vset1(f.c[i]), acc[m][0]);
    }
  }
  store_block<MR, 1>(acc, y + m0 * N, N, n0, bias);
}

template <bool kMin, typename Src>
void fixed_rows(const Fixed16& f, int64_t M, const Src& src, float* y, int64_t N, int64_t n0, const float* bias) {
  int64_t m = 0;
  for (; m + kRows <= M; m += kRows) fixed_block<kRows, kMin>(f, m, src, y, N, n0, bias);
  switch (M - m) {
    case 1: fixed_block<1, kMin>(f, m, src, y, N, n0, bias); break;
    case 2: fixed_block<2, kMin>(f, m, src, y, N, n0, bias); break;
    case 3: fixed_block<3, kMin>(f, m, src, y, N, n0, bias); break;
    case 4: fixed_block<4, kMin>(f, m, src, y, N, n0, bias); break;
    case 5: fixed_block<5, kMin>(f, m, src, y, N, n0, bias); break;
    case 6: fixed_block<6, kMin>(f, m, src, y, N, n0, bias); break;
    case 7: fixed_block<7, kMin>(f, m, src, y, N, n0, bias); break;
    case 8: fixed_block<8, kMin>(f, m, src, y, N, n0, bias); break;
    case 9: fixed_block<9, kMin>(f, m, src, y, N, n0, bias); break;
    case 10: fixed_block<10, kMin>(f, m, src, y, N, n0, bias); break;
    default: break;
  }
}

template <typename W>
void run_fixed(const Fixed16& f, int64_t M, const W* w, int64_t T, float* y, int64_t N, const float* bias) {
  constexpr bool kMin = std::is_same_v<W, Q4_1Tile>;
  const int64_t KB = f.KB;
  at::parallel_for(0, T, 1, [&](int64_t t0, int64_t t1) {
    std::vector<int32_t> pairs;
    std::vector<float> sc;
    for (int64_t t = t0; t < t1; ++t) {
      const TilePairs<W> tile{w + t * KB};
      if (M > kScratchRows) {
        unpack(tile, KB, pairs, sc);
        fixed_rows<kMin>(f, M, ScratchPairs{pairs.data(), sc.data()}, y, N, t * kLanes, bias);
      } else {
        fixed_rows<kMin>(f, M, tile, y, N, t * kLanes, bias);
      }
    }
  });
}

}  // namespace

void set_product_activations(int64_t bits) {
  TORCH_CHECK(bits == 16 || bits == 32, "set_product_activations: bits must be 16 (fixed point) or 32 (fp32), got ",
              bits);
  g_activation_bits.store(bits);
}

int64_t product_activations() { return g_activation_bits.load(); }

bool linear16_applies(at::ScalarType packed_type) {
  return packed_type == at::kByte && g_activation_bits.load() == 16;
}

void linear16(const float* x, int64_t sx, int64_t M, int64_t K, const void* packed, int64_t tile_bytes, int64_t T,
              float* y, int64_t N, const float* bias) {
  Fixed16 f;
  to_fixed16(x, sx, M, K, f);
  if (tile_bytes == static_cast<int64_t>(sizeof(Q4_1Tile)))
    run_fixed(f, M, static_cast<const Q4_1Tile*>(packed), T, y, N, bias);
  else
    run_fixed(f, M, static_cast<const Q8_0Tile*>(packed), T, y, N, bias);
}

}  // namespace specray
