// 16 fp32 lanes: AVX-512 where the compiler targets it, plain arrays elsewhere (AVX2 machines get
// them vectorised by the compiler). Every operation is defined lane by lane with one rounding
// (fma is fused in both), and the reductions sum in one fixed order, so a kernel's result for a
// row depends only on that row's operands: never on how many rows share a call, nor on threads.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace specray {

constexpr int kLanes = 16;

// ask for the cache lines of [p, p + bytes) ahead of their use
inline void prefetch_bytes(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(c + b, 0, 3);
}

#if defined(__AVX512F__)
constexpr bool kAvx512 = true;

struct V16 {
  __m512 v;
};

inline __mmask16 lanes_mask(int n) { return n >= kLanes ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1); }
inline V16 vzero() { return {_mm512_setzero_ps()}; }
inline V16 vset1(float x) { return {_mm512_set1_ps(x)}; }
inline V16 vload(const float* p) { return {_mm512_loadu_ps(p)}; }
inline V16 vload_n(const float* p, int n) { return {_mm512_maskz_loadu_ps(lanes_mask(n), p)}; }
inline V16 vload_or(const float* p, int n, float fill) {  // lanes past n hold fill
  return {_mm512_mask_loadu_ps(_mm512_set1_ps(fill), lanes_mask(n), p)};
}
inline void vstore(float* p, V16 a) { _mm512_storeu_ps(p, a.v); }
inline void vstore_n(float* p, V16 a, int n) { _mm512_mask_storeu_ps(p, lanes_mask(n), a.v); }
inline V16 vfma(V16 a, V16 b, V16 c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }  // a * b + c, one rounding
inline V16 vadd(V16 a, V16 b) { return {_mm512_add_ps(a.v, b.v)}; }
inline V16 vsub(V16 a, V16 b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline V16 vmul(V16 a, V16 b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline V16 vdiv(V16 a, V16 b) { return {_mm512_div_ps(a.v, b.v)}; }
inline V16 vmax(V16 a, V16 b) { return {_mm512_max_ps(a.v, b.v)}; }
inline V16 vmin(V16 a, V16 b) { return {_mm512_min_ps(a.v, b.v)}; }
inline V16 vround(V16 a) { return {_mm512_roundscale_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)}; }
inline V16 vscale2(V16 a, V16 n) { return {_mm512_scalef_ps(a.v, n.v)}; }  // a * 2^n, n integral
// lanes below `bound` keep a, the others become 0
inline V16 vzero_below(V16 a, V16 x, float bound) {
  return {_mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x.v, _mm512_set1_ps(bound), _CMP_GE_OQ), a.v)};
}
// fixed pairwise order: lanes i and i+8, then i and i+4, i+2, i+1
inline float vsum(V16 a) {
  __m256 h = _mm256_add_ps(_mm512_castps512_ps256(a.v), _mm512_extractf32x8_ps(a.v, 1));
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}
inline float vmaxr(V16 a) { return _mm512_reduce_max_ps(a.v); }
// the first lane equal to m, or -1
inline int vfirst_eq(V16 a, float m) {
  const __mmask16 eq = _mm512_cmp_ps_mask(a.v, _mm512_set1_ps(m), _CMP_EQ_OQ);
  return eq ? __builtin_ctz(static_cast<unsigned>(eq)) : -1;
}
// bit i set where lane i is greater than t (false for NaN lanes)
inline unsigned vgt_mask(V16 a, float t) {
  return static_cast<unsigned>(_mm512_cmp_ps_mask(a.v, _mm512_set1_ps(t), _CMP_GT_OQ));
}
// rows r[0..15] (16 lanes each) -> r[i] holds lane i of every input row: r[i][k] = old r[k][i]
inline void transpose16(V16 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i].v, r[2 * i + 1].v);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i].v, r[2 * i + 1].v);
  }
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i].v = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[4 * i + 1].v = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[4 * i + 2].v = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[4 * i + 3].v = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j) {
      t[8 * i + j] = _mm512_shuffle_f32x4(r[8 * i + j].v, r[8 * i + j + 4].v, 0x88);
      t[8 * i + j + 4] = _mm512_shuffle_f32x4(r[8 * i + j].v, r[8 * i + j + 4].v, 0xdd);
    }
  for (int j = 0; j < 8; ++j) {
    r[j].v = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88);
    r[j + 8].v = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xdd);
  }
}

// 16 bfloat16 values (their bits) widened exactly to fp32
inline V16 vload_bf16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))};
}

// 16 IEEE half-precision values (their bits) widened exactly to fp32
inline V16 vload_f16(const uint16_t* p) {
  return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))};
}
// 16 int32 lanes, each read as two int16 halves where pairs are multiplied (the fixed-point products
// of linear_fixed.cpp): integer arithmetic, so exact and the same in both builds
struct VI {
  __m512i v;
};
inline VI vi_zero() { return {_mm512_setzero_si512()}; }
inline VI vi_set1(int32_t x) { return {_mm512_set1_epi32(x)}; }
// acc + w.lo * x.lo + w.hi * x.hi per lane (int16 halves, signed; no overflow for the callers' ranges)
inline VI vi_dot2(VI acc, VI w, VI x) {
#if defined(__AVX512VNNI__)
  return {_mm512_dpwssd_epi32(acc.v, w.v, x.v)};
#else
  return {_mm512_add_epi32(acc.v, _mm512_madd_epi16(w.v, x.v))};
#endif
}
inline V16 vi_to_float(VI a) { return {_mm512_cvtepi32_ps(a.v)}; }  // rounded to nearest even
inline VI vi_load(const int32_t* p) { return {_mm512_loadu_si512(p)}; }
inline void vi_store(int32_t* p, VI a) { _mm512_storeu_si512(p, a.v); }
// 16 bytes of two 4-bit integers -> per lane the low nibble (low half) and the high one (high half)
inline VI vi_nibble_pairs(const uint8_t* p) {
  const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return {_mm512_and_si512(_mm512_or_si512(b, _mm512_slli_epi32(b, 12)), _mm512_set1_epi32(0x000F000F))};
}
// two rows of 16 int8 -> per lane a[i] (low half) and b[i] (high half), sign-extended
inline VI vi_i8_pairs(const int8_t* a, const int8_t* b) {
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a));
  const __m128i y = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
  const __m256i xy = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_unpacklo_epi8(x, y)), _mm_unpackhi_epi8(x, y), 1);
  return {_mm512_cvtepi8_epi16(xy)};
}
// 16 fp32 times 2^e (exact), rounded to the nearest integer (ties to even), saturated to int16
inline void vfixed16(V16 a, float scale, int16_t* out) {
  const __m512i p = _mm512_cvtps_epi32(_mm512_mul_ps(a.v, _mm512_set1_ps(scale)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_cvtsepi32_epi16(p));
}
// the same saturated to int8
inline void vfixed8(V16 a, float scale, int8_t* out) {
  const __m512i p = _mm512_cvtps_epi32(_mm512_mul_ps(a.v, _mm512_set1_ps(scale)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_cvtsepi32_epi8(p));
}
inline VI vi_sub(VI a, VI b) { return {_mm512_sub_epi32(a.v, b.v)}; }
// acc + the sum of the four products of w's bytes (unsigned) and x's (signed) per lane: VNNI's vpdpbusd
// (the 8-bit products of linear_fixed.cpp), else the same integers by two int16 multiply-adds
inline VI vi_dot4(VI acc, VI w, VI x) {
#if defined(__AVX512VNNI__)
  return {_mm512_dpbusd_epi32(acc.v, w.v, x.v)};
#else
  const __m512i bytes = _mm512_set1_epi32(0x00FF00FF);
  const __m512i w02 = _mm512_and_si512(w.v, bytes), w13 = _mm512_srli_epi16(w.v, 8);
  const __m512i x02 = _mm512_srai_epi16(_mm512_slli_epi16(x.v, 8), 8), x13 = _mm512_srai_epi16(x.v, 8);
  return {_mm512_add_epi32(acc.v, _mm512_add_epi32(_mm512_madd_epi16(w02, x02), _mm512_madd_epi16(w13, x13)))};
#endif
}
// two rows of 16 bytes of two 4-bit integers (32 bytes from p: k = 2r, 2r + 1 in row r's low and high
// nibbles) -> per lane the four k in byte order: row 0's low and high nibble, then row 1's
inline VI vi_nibble_quads(const uint8_t* p) {
  const __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  const __m512i z = _mm512_and_si512(_mm512_or_si512(w, _mm512_slli_epi16(w, 4)), _mm512_set1_epi16(0x0F0F));
  const __m512i lanes = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22,
                                         6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return {_mm512_permutexvar_epi16(lanes, z)};
}
// four rows of 16 int8 (64 bytes from p) -> per lane the four rows' values + 128 (unsigned bytes)
inline VI vi_u8_quads(const int8_t* p) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
#if defined(__AVX512VBMI__)
  const __m512i lanes = _mm512_set_epi8(63, 47, 31, 15, 62, 46, 30, 14, 61, 45, 29, 13, 60, 44, 28, 12, 59, 43, 27,
                                        11, 58, 42, 26, 10, 57, 41, 25, 9, 56, 40, 24, 8, 55, 39, 23, 7, 54, 38, 22,
                                        6, 53, 37, 21, 5, 52, 36, 20, 4, 51, 35, 19, 3, 50, 34, 18, 2, 49, 33, 17, 1,
                                        48, 32, 16, 0);
  return {_mm512_xor_si512(_mm512_permutexvar_epi8(lanes, _mm512_loadu_si512(p)), flip)};
#else
  __m512i q = _mm512_setzero_si512();
  for (int r = 0; r < 4; ++r) {
    const __m512i row = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * r)));
    q = _mm512_or_si512(q, _mm512_slli_epi32(row, 8 * r));
  }
  return {_mm512_xor_si512(q, flip)};
#endif
}
inline V16 vabs(V16 a) { return {_mm512_abs_ps(a.v)}; }
inline bool vfinite(V16 a) { return _mm512_fpclass_ps_mask(a.v, 0x99) == 0; }  // no NaN (0x81) nor inf (0x18)

// 16 bytes, each two 4-bit integers: lo gets the low nibbles, hi the high ones, as fp32 (0..15)
inline void vload_nibbles(const uint8_t* p, V16& lo, V16& hi) {
  const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  lo.v = _mm512_cvtepi32_ps(_mm512_and_si512(b, _mm512_set1_epi32(15)));
  hi.v = _mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4));
}
// 16 int8 values as fp32
inline V16 vload_i8(const int8_t* p) {
  return {_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))))};
}

#else
constexpr bool kAvx512 = false;

struct V16 {
  float v[kLanes];
};

#define SPECRAY_LANES for (int i = 0; i < kLanes; ++i)
inline V16 vzero() { V16 r; SPECRAY_LANES r.v[i] = 0.f; return r; }
inline V16 vset1(float x) { V16 r; SPECRAY_LANES r.v[i] = x; return r; }
inline V16 vload(const float* p) { V16 r; SPECRAY_LANES r.v[i] = p[i]; return r; }
inline V16 vload_n(const float* p, int n) { V16 r; SPECRAY_LANES r.v[i] = i < n ? p[i] : 0.f; return r; }
inline V16 vload_or(const float* p, int n, float fill) { V16 r; SPECRAY_LANES r.v[i] = i < n ? p[i] : fill; return r; }
inline void vstore(float* p, V16 a) { SPECRAY_LANES p[i] = a.v[i]; }
inline void vstore_n(float* p, V16 a, int n) { for (int i = 0; i < n && i < kLanes; ++i) p[i] = a.v[i]; }
inline V16 vfma(V16 a, V16 b, V16 c) { V16 r; SPECRAY_LANES r.v[i] = std::fma(a.v[i], b.v[i], c.v[i]); return r; }
inline V16 vadd(V16 a, V16 b) { V16 r; SPECRAY_LANES r.v[i] = a.v[i] + b.v[i]; return r; }
inline V16 vsub(V16 a, V16 b) { V16 r; SPECRAY_LANES r.v[i] = a.v[i] - b.v[i]; return r; }
inline V16 vmul(V16 a, V16 b) { V16 r; SPECRAY_LANES r.v[i] = a.v[i] * b.v[i]; return r; }
inline V16 vdiv(V16 a, V16 b) { V16 r; SPECRAY_LANES r.v[i] = a.v[i] / b.v[i]; return r; }
inline V16 vmax(V16 a, V16 b) { V16 r; SPECRAY_LANES r.v[i] = a.v[i] > b.v[i] ? a.v[i] : b.v[i]; return r; }
inline V16 vmin(V16 a, V16 b) { V16 r; SPECRAY_LANES r.v[i] = a.v[i] < b.v[i] ? a.v[i] : b.v[i]; return r; }
inline V16 vround(V16 a) { V16 r; SPECRAY_LANES r.v[i] = std::nearbyint(a.v[i]); return r; }
inline V16 vscale2(V16 a, V16 n) { V16 r; SPECRAY_LANES r.v[i] = std::ldexp(a.v[i], static_cast<int>(n.v[i])); return r; }
inline V16 vzero_below(V16 a, V16 x, float bound) { V16 r; SPECRAY_LANES r.v[i] = x.v[i] >= bound ? a.v[i] : 0.f; return r; }
inline float vsum(V16 a) {
  float h[8], q[4];
  for (int i = 0; i < 8; ++i) h[i] = a.v[i] + a.v[i + 8];
  for (int i = 0; i < 4; ++i) q[i] = h[i] + h[i + 4];
  float lo = q[0] + q[2], hi = q[1] + q[3];
  return lo + hi;
}
inline float vmaxr(V16 a) { float m = a.v[0]; for (int i = 1; i < kLanes; ++i) m = a.v[i] > m ? a.v[i] : m; return m; }
inline int vfirst_eq(V16 a, float m) { for (int i = 0; i < kLanes; ++i) if (a.v[i] == m) return i; return -1; }
inline unsigned vgt_mask(V16 a, float t) { unsigned m = 0; SPECRAY_LANES m |= (a.v[i] > t ? 1u : 0u) << i; return m; }
inline void transpose16(V16 r[16]) {
  V16 t[16];
  for (int i = 0; i < kLanes; ++i)
    for (int k = 0; k < kLanes; ++k) t[i].v[k] = r[k].v[i];
  for (int i = 0; i < kLanes; ++i) r[i] = t[i];
}
inline V16 vload_bf16(const uint16_t* p) {
  V16 r;
  SPECRAY_LANES {
    const uint32_t bits = static_cast<uint32_t>(p[i]) << 16;
    std::memcpy(&r.v[i], &bits, sizeof(float));
  }
  return r;
}
// IEEE half (its bits) -> fp32, exactly (subnormals, infinities and NaNs included)
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0x1Fu) {
    bits = sign | 0x7F800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: man * 2^-24, exact in fp32
    const float v = static_cast<float>(man) * 5.9604644775390625e-8f;
    std::memcpy(&bits, &v, sizeof(float));
    bits |= sign;
  }
  float f;
  std::memcpy(&f, &bits, sizeof(float));
  return f;
}
inline V16 vload_f16(const uint16_t* p) { V16 r; SPECRAY_LANES r.v[i] = half_to_float(p[i]); return r; }
inline void vload_nibbles(const uint8_t* p, V16& lo, V16& hi) {
  SPECRAY_LANES {
    lo.v[i] = static_cast<float>(p[i] & 15);
    hi.v[i] = static_cast<float>(p[i] >> 4);
  }
}
inline V16 vload_i8(const int8_t* p) { V16 r; SPECRAY_LANES r.v[i] = static_cast<float>(p[i]); return r; }
struct VI {
  int32_t v[kLanes];
};
inline VI vi_zero() { VI r; SPECRAY_LANES r.v[i] = 0; return r; }
inline VI vi_set1(int32_t x) { VI r; SPECRAY_LANES r.v[i] = x; return r; }
inline int32_t lo16(int32_t x) { return static_cast<int16_t>(static_cast<uint32_t>(x) & 0xFFFFu); }
inline int32_t hi16(int32_t x) { return static_cast<int16_t>(static_cast<uint32_t>(x) >> 16); }
inline VI vi_dot2(VI acc, VI w, VI x) {
  VI r;
  SPECRAY_LANES r.v[i] = static_cast<int32_t>(static_cast<uint32_t>(acc.v[i]) +
                                              static_cast<uint32_t>(lo16(w.v[i]) * lo16(x.v[i]) + hi16(w.v[i]) * hi16(x.v[i])));
  return r;
}
inline V16 vi_to_float(VI a) { V16 r; SPECRAY_LANES r.v[i] = static_cast<float>(a.v[i]); return r; }
inline VI vi_load(const int32_t* p) { VI r; SPECRAY_LANES r.v[i] = p[i]; return r; }
inline void vi_store(int32_t* p, VI a) { SPECRAY_LANES p[i] = a.v[i]; }
inline VI vi_nibble_pairs(const uint8_t* p) { VI r; SPECRAY_LANES r.v[i] = (p[i] & 15) | ((p[i] >> 4) << 16); return r; }
inline VI vi_sub(VI a, VI b) {
  VI r;
  SPECRAY_LANES r.v[i] = static_cast<int32_t>(static_cast<uint32_t>(a.v[i]) - static_cast<uint32_t>(b.v[i]));
  return r;
}
inline VI vi_dot4(VI acc, VI w, VI x) {
  VI r;
  SPECRAY_LANES {
    uint32_t sum = static_cast<uint32_t>(acc.v[i]);
    for (int b = 0; b < 4; ++b)
      sum += static_cast<uint32_t>(static_cast<int32_t>((static_cast<uint32_t>(w.v[i]) >> (8 * b)) & 0xFFu) *
                                   static_cast<int32_t>(static_cast<int8_t>(static_cast<uint32_t>(x.v[i]) >> (8 * b))));
    r.v[i] = static_cast<int32_t>(sum);
  }
  return r;
}
inline VI vi_nibble_quads(const uint8_t* p) {
  VI r;
  SPECRAY_LANES r.v[i] = static_cast<int32_t>((p[i] & 15u) | ((p[i] >> 4) << 8) | ((p[16 + i] & 15u) << 16) |
                                              (static_cast<uint32_t>(p[16 + i] >> 4) << 24));
  return r;
}
inline VI vi_u8_quads(const int8_t* p) {
  VI r;
  SPECRAY_LANES {
    uint32_t q = 0;
    for (int b = 0; b < 4; ++b) q |= ((static_cast<uint32_t>(static_cast<uint8_t>(p[16 * b + i])) ^ 0x80u) << (8 * b));
    r.v[i] = static_cast<int32_t>(q);
  }
  return r;
}
inline VI vi_i8_pairs(const int8_t* a, const int8_t* b) {
  VI r;
  SPECRAY_LANES r.v[i] = static_cast<int32_t>((static_cast<uint32_t>(static_cast<uint16_t>(b[i])) << 16) |
                                              static_cast<uint16_t>(a[i]));
  return r;
}
inline void vfixed16(V16 a, float scale, int16_t* out) {
  SPECRAY_LANES {
    const float p = std::nearbyint(a.v[i] * scale);
    out[i] = static_cast<int16_t>(p > 32767.f ? 32767.f : (p < -32768.f ? -32768.f : p));
  }
}
inline void vfixed8(V16 a, float scale, int8_t* out) {
  SPECRAY_LANES {
    const float p = std::nearbyint(a.v[i] * scale);
    out[i] = static_cast<int8_t>(p > 127.f ? 127.f : (p < -128.f ? -128.f : p));
  }
}
inline V16 vabs(V16 a) { V16 r; SPECRAY_LANES r.v[i] = std::fabs(a.v[i]); return r; }
inline bool vfinite(V16 a) { bool ok = true; SPECRAY_LANES ok = ok && std::isfinite(a.v[i]); return ok; }
#undef SPECRAY_LANES
#endif

// a weight vector of either storage type, as fp32
inline V16 vload_w(const float* p) { return vload(p); }
inline V16 vload_w(const uint16_t* p) { return vload_bf16(p); }

// exp(x) lane by lane (Cephes' expf: x = n ln2 + r, a degree-6 polynomial in r, times 2^n), within
// ~2 ulp of expf over [-87, 88]; 0 below -87.3 (where expf is denormal or 0), +large clamped to 88.4.
inline V16 vexp(V16 x) {
  const V16 hi = vset1(88.3762626647949f), lo = vset1(-88.3762626647949f);
  V16 xc = vmin(vmax(x, lo), hi);
  V16 n = vround(vmul(xc, vset1(1.44269504088896341f)));
  V16 r = vfma(n, vset1(-0.693359375f), xc);
  r = vfma(n, vset1(2.12194440e-4f), r);
  V16 p = vset1(1.9875691500e-4f);
  p = vfma(p, r, vset1(1.3981999507e-3f));
  p = vfma(p, r, vset1(8.3334519073e-3f));
  p = vfma(p, r, vset1(4.1665795894e-2f));
  p = vfma(p, r, vset1(1.6666665459e-1f));
  p = vfma(p, r, vset1(5.0000001201e-1f));
  V16 y = vfma(vmul(p, r), r, vadd(r, vset1(1.f)));
  return vzero_below(vscale2(y, n), x, -87.3f);
}

}  // namespace specray
