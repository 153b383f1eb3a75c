// The row kernels of attention.cpp: one segment of a group of query rows' visible keys, scored,
// turned into a softmax's exponentials and weighed into the values. A row's arithmetic here depends
// only on its own visible keys in the segment, in position order (attention.cpp's module comment).
#pragma once

#include "kernels.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace specray {
namespace attention {

constexpr int64_t kMaxHeadDim = 256;
// query rows (tokens x the KV head's query heads) per work item: up to kMaxRows, so that a sequence's
// token tree (11 tokens x 3 heads in the default model) reads its keys and values once, where the
// batch still makes enough items for every thread; else kNarrowRows, so that one sequence's items
// (a lone verify) are shared out among the threads (2026-11-28, 2-core Xeon VM, 30 layers, cold
// caches: 2 sequences x 11 tree tokens at 1,500 keys 37.6 -> 28.5 ms, at 300 keys 4.3 -> 3.9 ms;
// prefill 5-9% faster; one sequence's tree 2.4 ms at 300 keys with narrow items, 2.6 with wide).
// A row's bits never depend on its item (attention.cpp's module comment).
constexpr int kMaxRows = 48;
constexpr int kNarrowRows = 16;
constexpr int kPVVectors = 24;    // value accumulators per row group (rows x head-dim chunks)

// one query row: keys [0, prefix) visible, then window position c visible where win[c]; its visible
// keys in position order are its list, of count entries. A segment of the list covers key positions
// [lo, hi) (the positions of its first and last entries); part: where the segment's unnormalised
// weighted sum goes, or nullptr when the segment is the row's whole list (its result goes to out)
struct Row {
  const float* q;
  float* out;
  int64_t prefix;
  const uint8_t* win;
  int64_t w;
  int64_t count;
  int64_t lo = 0, hi = 0;
  float* part = nullptr;
  bool visible(int64_t p) const { return p < prefix || (win != nullptr && p - prefix < w && win[p - prefix]); }
  bool sees(int64_t p) const { return p >= lo && p < hi && visible(p); }
  // the key position of list entry i (< count)
  int64_t position(int64_t i) const {
    if (i < prefix) return i;
    for (int64_t c = 0, n = prefix; c < w; ++c)
      if (win[c] && n++ == i) return prefix + c;
    return prefix + w;  // not reached for i < count
  }
  // entries [first, min(first + len, count)) of the list: set lo, hi
  void segment(int64_t first, int64_t len) {
    lo = position(first);
    hi = position(std::min(first + len, count) - 1) + 1;
  }
};

// the caches' elements: fp32, or bf16 (their bits; widened exactly to fp32 on load)
template <typename T>
struct Cache {
  const T* k;
  const T* v;
  int64_t slot_stride;  // elements per cache slot (kvh * d)
  int64_t d;
};

inline V16 vload_elem(const float* p) { return vload(p); }
inline V16 vload_elem(const uint16_t* p) { return vload_bf16(p); }

struct Scratch {
  std::vector<int64_t> slots;  // [keys] cache slot of each key position of the segment
  std::vector<float> scores;   // [rows][keys]: dense scores, then each row's visible list, exp'd
  std::vector<float> parts;    // [rows][segments][d]: a work item's rows' unnormalised segment sums
  std::vector<float> maxes, sums;  // [rows][segments]: their score maxima and exponential sums
  std::vector<float> zeros;    // a zero key for the padding lanes of the last 16-key chunk
  std::vector<uint16_t> zeros16;  // the same for a bf16 cache
  Scratch() : zeros(kMaxHeadDim, 0.f), zeros16(kMaxHeadDim, 0) {}
  const float* zero_key(const float*) const { return zeros.data(); }
  const uint16_t* zero_key(const uint16_t*) const { return zeros16.data(); }
};

inline int lanes_in(int64_t d, int c) { return static_cast<int>(std::min<int64_t>(kLanes, d - c * kLanes)); }

// keys and values are read a key at a time through the block tables (one head's d elements of every
// kvh * d), a pattern the hardware prefetchers follow poorly: each key's lines are asked for this
// many keys ahead
constexpr int64_t kPrefetchKeys = 32;

template <typename T>
inline void prefetch_key(const T* row, int64_t d) { prefetch_bytes(row, d * static_cast<int64_t>(sizeof(T))); }

// scores[r][p] = (q_r . k_p) * scale for the keys at slots[0, keys), 16 keys at a time (Whole: the
// head dim is a multiple of 16, no masked loads)
template <bool Whole, typename T>
void score_rows(const Row* rows, int R, const Cache<T>& cache, const int64_t* slots, int64_t keys, float scale,
                const T* zeros, float* scores) {
  const int64_t d = cache.d;
  const int chunks = static_cast<int>((d + kLanes - 1) / kLanes);
  for (int64_t p0 = 0; p0 < keys; p0 += kLanes) {
    const int n = static_cast<int>(std::min<int64_t>(kLanes, keys - p0));
    for (int64_t a = p0 + kPrefetchKeys; a < std::min(keys, p0 + kPrefetchKeys + kLanes); ++a)
      prefetch_key(cache.k + slots[a] * cache.slot_stride, d);
    const T* kp[kLanes];
    for (int i = 0; i < kLanes; ++i) kp[i] = i < n ? cache.k + slots[p0 + i] * cache.slot_stride : zeros;
    V16 acc[kMaxRows];
    for (int r = 0; r < R; ++r) acc[r] = vzero();
    for (int c = 0; c < chunks; ++c) {
      const int m = Whole ? kLanes : lanes_in(d, c);
      V16 t[kLanes];  // t[j]: dimension c*16 + j of the 16 keys
      for (int i = 0; i < kLanes; ++i) {
        if constexpr (Whole) t[i] = vload_elem(kp[i] + c * kLanes);
        else t[i] = vload_n(kp[i] + c * kLanes, m);  // fp32 caches only (bf16 ones need whole chunks)
      }
      transpose16(t);
      if (m == kLanes) {  // unrolled with constant indices: t stays in registers
        for (int r = 0; r < R; ++r) {
          const float* q = rows[r].q + c * kLanes;
          V16 a = acc[r];
#pragma GCC unroll 16
          for (int j = 0; j < kLanes; ++j) a = vfma(t[j], vset1(q[j]), a);
          acc[r] = a;
        }
      } else {  // the head dim's last, partial chunk: the same fmas, fewer of them
        for (int r = 0; r < R; ++r) {
          const float* q = rows[r].q + c * kLanes;
          V16 a = acc[r];
#pragma GCC unroll 16
          for (int j = 0; j < kLanes; ++j)
            if (j < m) a = vfma(t[j], vset1(q[j]), a);
          acc[r] = a;
        }
      }
    }
    const V16 sc = vset1(scale);
    for (int r = 0; r < R; ++r) vstore_n(scores + r * keys + p0, vmul(acc[r], sc), n);
  }
}

// the row's segment: its scores s (dense, key position base first) compacted in list order to the
// front, exp(s - max) in place; returns their sum (summed 16 at a time, then across lanes: one fixed
// order) and the max
inline float softmax_segment(const Row& row, float* s, int64_t base, float& max) {
  int64_t n = 0;
  const int64_t shared_end = std::min(row.hi, row.prefix);
  if (row.lo < shared_end) {
    if (row.lo == base) n = shared_end - row.lo;  // already in place
    else
      for (int64_t p = row.lo; p < shared_end; ++p) s[n++] = s[p - base];
  }
  for (int64_t p = std::max(row.lo, row.prefix); p < row.hi; ++p)
    if (row.win[p - row.prefix]) s[n++] = s[p - base];
  V16 mx = vset1(-INFINITY);  // the max: exact in any order
  for (int64_t i = 0; i < n; i += kLanes) {
    const int r = static_cast<int>(std::min<int64_t>(kLanes, n - i));
    mx = vmax(mx, vload_or(s + i, r, -INFINITY));
  }
  max = vmaxr(mx);
  const V16 mv = vset1(max);
  V16 total = vzero();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const V16 e = vexp(vsub(vload(s + i), mv));
    vstore(s + i, e);
    total = vadd(total, e);
  }
  if (i < n) {
    const int r = static_cast<int>(n - i);
    const V16 e = vexp(vsub(vload_n(s + i, r), mv));
    vstore_n(s + i, e, r);
    total = vadd(total, vload_n(s + i, r));  // padding lanes are 0, not exp(0 - m)
  }
  return n > 0 ? vsum(total) : 1.f;
}

// chunk c of a key's value: whole when the head dim is a multiple of 16 (no mask in the key loop)
template <int NC, bool Whole, typename T>
inline void load_value(const T* v, int64_t d, V16 (&vv)[NC]) {
  for (int c = 0; c < NC; ++c) {
    if constexpr (Whole) vv[c] = vload_elem(v + c * kLanes);
    else vv[c] = vload_n(v + c * kLanes, lanes_in(d, c));
  }
}

// for G rows at once (their G x NC accumulators in registers), each key's value loaded once for the
// G rows: acc_r = the sum over row r's segment, in order, of e * v; out_r = acc_r / sum_r, or acc_r
// to part_r. slots[p - base]: key position p's cache slot
template <int NC, int G, bool Whole, typename T>
void weigh_group(const Row* rows, const Cache<T>& cache, const int64_t* slots, int64_t base, int64_t keys,
                 const float* exps, const float* sums) {
  const int64_t d = cache.d;
  V16 acc[G][NC];
  int64_t idx[G], first = INT64_MAX, last = 0, all0 = 0, all1 = INT64_MAX;
  for (int g = 0; g < G; ++g) {
    for (int c = 0; c < NC; ++c) acc[g][c] = vzero();
    idx[g] = 0;
    first = std::min(first, rows[g].lo);
    last = std::max(last, rows[g].hi);
    all0 = std::max(all0, rows[g].lo);
    all1 = std::min(all1, std::min(rows[g].prefix, rows[g].hi));
  }
  all1 = std::max(all0, all1);  // keys [all0, all1) are visible to every row: no checks
  const int64_t* sl = slots - base;
  auto checked = [&](int64_t from, int64_t to) {
    for (int64_t p = from; p < to; ++p) {
      V16 vv[NC];
      load_value<NC, Whole>(cache.v + sl[p] * cache.slot_stride, d, vv);
      for (int g = 0; g < G; ++g) {
        if (!rows[g].sees(p)) continue;
        const V16 e = vset1(exps[g * keys + idx[g]++]);
        for (int c = 0; c < NC; ++c) acc[g][c] = vfma(e, vv[c], acc[g][c]);
      }
    }
  };
  checked(first, all0);
  const float* ex[G];
  for (int g = 0; g < G; ++g) ex[g] = exps + g * keys + idx[g] - all0;
  for (int64_t p = all0; p < all1; ++p) {
    if (p + kPrefetchKeys < last) prefetch_key(cache.v + sl[p + kPrefetchKeys] * cache.slot_stride, d);
    V16 vv[NC];
    load_value<NC, Whole>(cache.v + sl[p] * cache.slot_stride, d, vv);
    for (int g = 0; g < G; ++g) {
      const V16 e = vset1(ex[g][p]);
      for (int c = 0; c < NC; ++c) acc[g][c] = vfma(e, vv[c], acc[g][c]);
    }
  }
  for (int g = 0; g < G; ++g) idx[g] += all1 - all0;
  checked(all1, last);
  for (int g = 0; g < G; ++g) {
    if (rows[g].part != nullptr) {
      for (int c = 0; c < NC; ++c) vstore_n(rows[g].part + c * kLanes, acc[g][c], lanes_in(d, c));
      continue;
    }
    const V16 sum = vset1(sums[g]);
    for (int c = 0; c < NC; ++c) vstore_n(rows[g].out + c * kLanes, vdiv(acc[g][c], sum), lanes_in(d, c));
  }
}

// rows in groups of at most kPVVectors / NC (accumulators that fit the registers)
template <int NC, bool Whole, typename T>
void weigh_rows(const Row* rows, int R, const Cache<T>& cache, const int64_t* slots, int64_t base, int64_t keys,
                const float* exps, const float* sums) {
  constexpr int kGroup = kPVVectors / NC < 8 ? kPVVectors / NC : 8;
  for (int r0 = 0; r0 < R; r0 += kGroup) {
    const int G = std::min(kGroup, R - r0);
    const Row* rg = rows + r0;
    const float* e = exps + r0 * keys;
    const float* sm = sums + r0;
    switch (G) {
#define SPECRAY_GROUP(N) \
  case N: if constexpr (N <= kGroup) weigh_group<NC, N, Whole, T>(rg, cache, slots, base, keys, e, sm); break;
      SPECRAY_GROUP(1) SPECRAY_GROUP(2) SPECRAY_GROUP(3) SPECRAY_GROUP(4)
      SPECRAY_GROUP(5) SPECRAY_GROUP(6) SPECRAY_GROUP(7) SPECRAY_GROUP(8)
#undef SPECRAY_GROUP
      default: break;
    }
  }
}

template <bool Whole, typename T>
void weigh_values(const Row* rows, int R, const Cache<T>& cache, const int64_t* slots, int64_t base, int64_t keys,
                  const float* exps, const float* sums) {
  switch ((cache.d + kLanes - 1) / kLanes) {
    case 1: weigh_rows<1, Whole, T>(rows, R, cache, slots, base, keys, exps, sums); break;
    case 2: weigh_rows<2, Whole, T>(rows, R, cache, slots, base, keys, exps, sums); break;
    case 3: weigh_rows<3, Whole, T>(rows, R, cache, slots, base, keys, exps, sums); break;
    case 4: weigh_rows<4, Whole, T>(rows, R, cache, slots, base, keys, exps, sums); break;
    case 5: weigh_rows<5, Whole, T>(rows, R, cache, slots, base, keys, exps, sums); break;
    case 6: weigh_rows<6, Whole, T>(rows, R, cache, slots, base, keys, exps, sums); break;
    case 7: weigh_rows<7, Whole, T>(rows, R, cache, slots, base, keys, exps, sums); break;
    case 8: weigh_rows<8, Whole, T>(rows, R, cache, slots, base, keys, exps, sums); break;
    default: weigh_rows<16, Whole, T>(rows, R, cache, slots, base, keys, exps, sums); break;  // d up to 256
  }
}

}  // namespace attention
}  // namespace specray
