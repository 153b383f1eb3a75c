// Paged attention over a flattened batch on the CPU: prefill chunks, decode tokens and token-tree
// nodes in one call, keys and values read in place through the block tables (no gather into dense
// tensors), GQA without repeating K/V. The caches are fp32, or bf16 (half the bytes a decode step
// streams; each element widened exactly to fp32 as it is loaded, so the arithmetic is the same).
//
// A query row's result depends only on its visible keys in position order (the committed context,
// then its window: causal, or the tree mask's row), never on what else is in the call: its score
// with key p is q . k_p summed over d in order, one fma per dimension; the softmax runs over its
// list of visible scores in one fixed order; the values are summed in list order. So a token-tree
// node gets exactly the bits its token gets in plain decoding, whose visible keys are the same list,
// and a prefill row the bits of the same token decoded. Masked keys add nothing.
//
// A work item is one sequence's KV head with a tile of its query tokens: the g query heads of that
// KV head times up to kMaxRows / g tokens (kNarrowRows / g when the batch would otherwise leave a
// thread idle). Keys go 16 at a time, transposed in registers, so each key is loaded once for all
// the item's rows (scores are R rows x 16 keys of fmas), and values
// once per group of rows. Items are dealt to threads from both ends of the batch, so a causal
// prefill's long and short tiles are shared out evenly.
#include "kernels.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <type_traits>
#include <cstdint>
#include <vector>

namespace specray {
namespace {

constexpr int64_t kMaxHeadDim = 256;
// query rows (tokens x the KV head's query heads) per work item: up to kMaxRows, so that a sequence's
// token tree (11 tokens x 3 heads in the default model) reads its keys and values once, where the
// batch still makes enough items for every thread; else kNarrowRows, so that one sequence's items
// (a lone verify) are shared out among the threads (2026-11-28, 2-core Xeon VM, 30 layers, cold
// caches: 2 sequences x 11 tree tokens at 1,500 keys 37.6 -> 28.5 ms, at 300 keys 4.3 -> 3.9 ms;
// prefill 5-9% faster; one sequence's tree 2.4 ms at 300 keys with narrow items, 2.6 with wide).
// A row's bits never depend on its item (module comment).
constexpr int kMaxRows = 48;
constexpr int kNarrowRows = 16;
constexpr int kPVVectors = 24;    // value accumulators per row group (rows x head-dim chunks)

struct Batch {
  const int64_t* qsl;
  const int64_t* kv_lens;
  const int64_t* tables;
  int64_t table_stride, block_size;
  // sequence b's window mask [q_b, w_b] (True = visible) over its last w_b key positions; w_b = 0: causal
  std::vector<const uint8_t*> masks;
  std::vector<int64_t> win_lens;
};

struct Item {
  int64_t seq, kv_head, tok0, tok1;  // query tokens [tok0, tok1) of sequence seq
};

// one query row: keys [0, prefix) visible, then window position c visible where win[c]
struct Row {
  const float* q;
  float* out;
  int64_t prefix;
  const uint8_t* win;
  int64_t w;
  bool sees(int64_t p) const { return p < prefix || (win != nullptr && p - prefix < w && win[p - prefix]); }
  int64_t end() const {  // one past the last visible key
    if (win != nullptr)
      for (int64_t c = w - 1; c >= 0; --c)
        if (win[c]) return prefix + c + 1;
    return prefix;
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
  std::vector<int64_t> slots;  // [keys] cache slot of each key position
  std::vector<float> scores;   // [rows][keys]: dense scores, then each row's visible list, exp'd
  std::vector<int64_t> counts; // [rows] visible keys of each row
  std::vector<float> zeros;    // a zero key for the padding lanes of the last 16-key chunk
  std::vector<uint16_t> zeros16;  // the same for a bf16 cache
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

// scores[r][p] = (q_r . k_p) * scale for p in [0, keys), 16 keys at a time (Whole: the head dim is a
// multiple of 16, no masked loads)
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

// row r's visible scores, compacted in position order to the front of its scores, exp(s - max)
// in place; returns their sum (summed 16 at a time, then across lanes: one fixed order)
float softmax_row(const Row& row, float* s, int64_t keys, int64_t& count) {
  int64_t n = std::min(row.prefix, keys);
  for (int64_t c = 0; row.win != nullptr && c < row.w && row.prefix + c < keys; ++c)
    if (row.win[c]) s[n++] = s[row.prefix + c];
  count = n;
  V16 mx = vset1(-INFINITY);  // the max: exact in any order
  for (int64_t i = 0; i < n; i += kLanes) {
    const int r = static_cast<int>(std::min<int64_t>(kLanes, n - i));
    mx = vmax(mx, vload_or(s + i, r, -INFINITY));
  }
  const V16 mv = vset1(vmaxr(mx));
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

// out_r = sum over row r's visible keys, in order, of e * v, / sum_r, for G rows at once (their
// G x NC accumulators in registers), each key's value loaded once for the G rows
template <int NC, int G, bool Whole, typename T>
void weigh_group(const Row* rows, const Cache<T>& cache, const int64_t* slots, int64_t keys, const float* exps,
                 const float* sums) {
  const int64_t d = cache.d;
  V16 acc[G][NC];
  int64_t idx[G], last = 0, shared = INT64_MAX;
  for (int g = 0; g < G; ++g) {
    for (int c = 0; c < NC; ++c) acc[g][c] = vzero();
    last = std::max(last, std::min(rows[g].end(), keys));
    shared = std::min(shared, rows[g].prefix);
  }
  shared = std::min(shared, last);  // keys [0, shared) are visible to every row: no checks
  for (int64_t p = 0; p < shared; ++p) {
    if (p + kPrefetchKeys < last) prefetch_key(cache.v + slots[p + kPrefetchKeys] * cache.slot_stride, d);
    V16 vv[NC];
    load_value<NC, Whole>(cache.v + slots[p] * cache.slot_stride, d, vv);
    for (int g = 0; g < G; ++g) {
      const V16 e = vset1(exps[g * keys + p]);
      for (int c = 0; c < NC; ++c) acc[g][c] = vfma(e, vv[c], acc[g][c]);
    }
  }
  for (int g = 0; g < G; ++g) idx[g] = shared;
  for (int64_t p = shared; p < last; ++p) {
    V16 vv[NC];
    load_value<NC, Whole>(cache.v + slots[p] * cache.slot_stride, d, vv);
    for (int g = 0; g < G; ++g) {
      if (!rows[g].sees(p)) continue;
      const V16 e = vset1(exps[g * keys + idx[g]++]);
      for (int c = 0; c < NC; ++c) acc[g][c] = vfma(e, vv[c], acc[g][c]);
    }
  }
  for (int g = 0; g < G; ++g) {
    const V16 sum = vset1(sums[g]);
    for (int c = 0; c < NC; ++c) vstore_n(rows[g].out + c * kLanes, vdiv(acc[g][c], sum), lanes_in(d, c));
  }
}

// rows in groups of at most kPVVectors / NC (accumulators that fit the registers)
template <int NC, bool Whole, typename T>
void weigh_rows(const Row* rows, int R, const Cache<T>& cache, const int64_t* slots, int64_t keys, const float* exps,
                const float* sums) {
  constexpr int kGroup = kPVVectors / NC < 8 ? kPVVectors / NC : 8;
  for (int r0 = 0; r0 < R; r0 += kGroup) {
    const int G = std::min(kGroup, R - r0);
    const Row* rg = rows + r0;
    const float* e = exps + r0 * keys;
    const float* sm = sums + r0;
    switch (G) {
#define SPECRAY_GROUP(N) \
  case N: if constexpr (N <= kGroup) weigh_group<NC, N, Whole, T>(rg, cache, slots, keys, e, sm); break;
      SPECRAY_GROUP(1) SPECRAY_GROUP(2) SPECRAY_GROUP(3) SPECRAY_GROUP(4)
      SPECRAY_GROUP(5) SPECRAY_GROUP(6) SPECRAY_GROUP(7) SPECRAY_GROUP(8)
#undef SPECRAY_GROUP
      default: break;
    }
  }
}

template <bool Whole, typename T>
void weigh_values(const Row* rows, int R, const Cache<T>& cache, const int64_t* slots, int64_t keys,
                  const float* exps, const float* sums) {
  switch ((cache.d + kLanes - 1) / kLanes) {
    case 1: weigh_rows<1, Whole, T>(rows, R, cache, slots, keys, exps, sums); break;
    case 2: weigh_rows<2, Whole, T>(rows, R, cache, slots, keys, exps, sums); break;
    case 3: weigh_rows<3, Whole, T>(rows, R, cache, slots, keys, exps, sums); break;
    case 4: weigh_rows<4, Whole, T>(rows, R, cache, slots, keys, exps, sums); break;
    case 5: weigh_rows<5, Whole, T>(rows, R, cache, slots, keys, exps, sums); break;
    case 6: weigh_rows<6, Whole, T>(rows, R, cache, slots, keys, exps, sums); break;
    case 7: weigh_rows<7, Whole, T>(rows, R, cache, slots, keys, exps, sums); break;
    case 8: weigh_rows<8, Whole, T>(rows, R, cache, slots, keys, exps, sums); break;
    default: weigh_rows<16, Whole, T>(rows, R, cache, slots, keys, exps, sums); break;  // d up to 256
  }
}

template <bool Whole, typename T>
void attend_item(const Batch& bt, const Item& it, const float* q, int64_t sq0, int64_t sq1, float* out, int64_t h,
                 int64_t group, const Cache<T>& cache, float scale, Scratch& sc) {
  const int64_t b = it.seq, qlen = bt.qsl[b + 1] - bt.qsl[b], L = bt.kv_lens[b], bs = bt.block_size;
  const int64_t w = bt.win_lens[b];
  Row rows[kMaxRows];
  int R = 0;
  int64_t keys = 0;
  for (int64_t i = it.tok0; i < it.tok1; ++i) {
    const int64_t qi = i - bt.qsl[b];
    const uint8_t* win = w > 0 ? bt.masks[b] + qi * w : nullptr;
    const int64_t prefix = w > 0 ? L - w : L - qlen + qi + 1;  // causal: every key up to itself
    for (int64_t j = 0; j < group; ++j) {
      const int64_t head = it.kv_head * group + j;
      rows[R] = Row{q + i * sq0 + head * sq1, out + (i * h + head) * cache.d, prefix, win, w};
      keys = std::max(keys, rows[R].end());
      ++R;
    }
  }
  const int64_t* table = bt.tables + b * bt.table_stride;
  sc.slots.resize(keys);
  for (int64_t p0 = 0; p0 < keys; p0 += bs) {  // block by block: no division per key
    const int64_t base = table[p0 / bs] * bs, n = std::min(bs, keys - p0);
    for (int64_t o = 0; o < n; ++o) sc.slots[p0 + o] = base + o;
  }
  sc.scores.resize(static_cast<size_t>(R) * keys + kLanes);
  score_rows<Whole, T>(rows, R, cache, sc.slots.data(), keys, scale, sc.zero_key(cache.k), sc.scores.data());
  float sums[kMaxRows];
  for (int r = 0; r < R; ++r) {
    int64_t count = 0;
    sums[r] = softmax_row(rows[r], sc.scores.data() + r * keys, keys, count);
  }
  weigh_values<Whole, T>(rows, R, cache, sc.slots.data(), keys, sc.scores.data(), sums);
}

void check_batch(const Batch& bt, int64_t B, int64_t N, int64_t max_blocks, int64_t num_blocks) {
  TORCH_CHECK(bt.qsl[0] == 0 && bt.qsl[B] == N, "paged_attention: query_start_loc must run from 0 to N=", N,
              ", got ", bt.qsl[0], "..", bt.qsl[B]);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t qlen = bt.qsl[b + 1] - bt.qsl[b], L = bt.kv_lens[b];
    TORCH_CHECK(qlen >= 0 && L >= qlen && L <= max_blocks * bt.block_size, "paged_attention: sequence ", b, " has ",
                qlen, " queries and kv_len ", L, "; need query count <= kv_len <= ", max_blocks * bt.block_size,
                " (its block table's capacity)");
    const int64_t* table = bt.tables + b * bt.table_stride;
    for (int64_t j = 0; j * bt.block_size < L; ++j)
      TORCH_CHECK(table[j] >= 0 && table[j] < num_blocks, "paged_attention: block_tables[", b, "][", j, "] = ",
                  table[j], " is outside the cache's ", num_blocks, " blocks");
    TORCH_CHECK(bt.win_lens[b] <= L, "paged_attention: sequence ", b, "'s window of ", bt.win_lens[b],
                " keys is longer than its kv_len ", L);
  }
}

// the windows' masks: one per sequence, [q_b, w_b] bool (an empty tensor: causal)
void read_windows(Batch& bt, at::TensorList windows, int64_t B) {
  bt.masks.assign(B, nullptr);
  bt.win_lens.assign(B, 0);
  if (windows.empty()) return;
  TORCH_CHECK(static_cast<int64_t>(windows.size()) == B, "paged_attention: ", windows.size(),
              " window masks for ", B, " sequences; give one per sequence (an empty tensor for causal)");
  for (int64_t b = 0; b < B; ++b) {
    const at::Tensor& w = windows[b];
    if (w.numel() == 0) continue;
    const int64_t qlen = bt.qsl[b + 1] - bt.qsl[b];
    TORCH_CHECK(w.device().is_cpu() && (w.scalar_type() == at::kBool || w.scalar_type() == at::kByte) &&
                    w.dim() == 2 && w.size(0) == qlen && w.is_contiguous(),
                "paged_attention: window mask ", b, " must be a contiguous [q=", qlen, ", w] bool CPU tensor, got ",
                w.sizes(), " ", w.scalar_type());
    bt.masks[b] = static_cast<const uint8_t*>(w.const_data_ptr());
    bt.win_lens[b] = w.size(1);
  }
}

}  // namespace

at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                           const at::Tensor& query_start_loc, const at::Tensor& kv_lens,
                           const at::Tensor& block_tables, double scale, at::TensorList windows,
                           const at::Tensor& result) {
  check_f32(q, "paged_attention: q");
  const bool bf16 = check_kv_caches(k_cache, v_cache, "paged_attention");
  check_i64(query_start_loc, "paged_attention: query_start_loc");
  check_i64(kv_lens, "paged_attention: kv_lens");
  check_i64(block_tables, "paged_attention: block_tables");
  TORCH_CHECK(q.dim() == 3 && q.stride(2) == 1, "paged_attention: q must be [N, h, d] with a contiguous last dim, got ",
              q.sizes(), " strides ", q.strides());
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes() && k_cache.is_contiguous() &&
                  v_cache.is_contiguous(),
              "paged_attention: caches must be contiguous [blocks, block_size, kvh, d] of one shape, got ",
              k_cache.sizes(), " and ", v_cache.sizes());
  const int64_t N = q.size(0), h = q.size(1), d = q.size(2);
  const int64_t num_blocks = k_cache.size(0), bs = k_cache.size(1), kvh = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == d && d <= kMaxHeadDim && kvh > 0 && h % kvh == 0, "paged_attention: q ", q.sizes(),
              " and caches ", k_cache.sizes(), ": need equal head dims (<= ", kMaxHeadDim,
              ") and query heads divisible by KV heads");
  const int64_t B = kv_lens.size(0);
  TORCH_CHECK(query_start_loc.dim() == 1 && query_start_loc.size(0) == B + 1 && block_tables.dim() == 2 &&
                  block_tables.size(0) == B && block_tables.stride(1) == 1 && kv_lens.is_contiguous() &&
                  query_start_loc.is_contiguous(),
              "paged_attention: query_start_loc ", query_start_loc.sizes(), ", kv_lens ", kv_lens.sizes(),
              ", block_tables ", block_tables.sizes(), " do not describe one batch");
  Batch bt{query_start_loc.const_data_ptr<int64_t>(), kv_lens.const_data_ptr<int64_t>(),
           block_tables.const_data_ptr<int64_t>(), block_tables.stride(0), bs, {}, {}};
  read_windows(bt, windows, B);
  check_batch(bt, B, N, block_tables.size(1), num_blocks);
  at::Tensor out = result_buffer(result, {N, h, d}, q, "paged_attention");
  if (N == 0) return out;
  const int64_t group = h / kvh, wide = std::max<int64_t>(1, kMaxRows / group);
  int64_t wide_items = 0;
  for (int64_t b = 0; b < B; ++b) wide_items += kvh * ((bt.qsl[b + 1] - bt.qsl[b] + wide - 1) / wide);
  const int64_t tile = wide_items >= 2 * at::get_num_threads() ? wide : std::max<int64_t>(1, kNarrowRows / group);
  std::vector<Item> items;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < kvh; ++j)
      for (int64_t i = bt.qsl[b]; i < bt.qsl[b + 1]; i += tile) items.push_back({b, j, i, std::min(i + tile, bt.qsl[b + 1])});
  const float* qp = q.const_data_ptr<float>();
  float* op = out.mutable_data_ptr<float>();
  const int64_t sq0 = q.stride(0), sq1 = q.stride(1), count = static_cast<int64_t>(items.size());
  TORCH_CHECK(!bf16 || d % kLanes == 0, "paged_attention: a bfloat16 cache needs a head dim that is a multiple of ",
              kLanes, ", got ", d);
  // head offsets folded in: a slot's key for KV head j starts at k + slot * kvh * d + j * d
  // Whole: the head dim is a multiple of 16, so no load needs a mask (bf16 caches always are)
  auto run = [&](auto cache, auto whole) {
    at::parallel_for(0, count, 1, [&](int64_t i0, int64_t i1) {
      Scratch sc;
      sc.zeros.assign(kMaxHeadDim, 0.f);
      sc.zeros16.assign(kMaxHeadDim, 0);
      for (int64_t idx = i0; idx < i1; ++idx) {
        const Item& it = items[idx % 2 == 0 ? idx / 2 : count - 1 - idx / 2];  // both ends of the batch
        const decltype(cache) head{cache.k + it.kv_head * d, cache.v + it.kv_head * d, cache.slot_stride, d};
        attend_item<decltype(whole)::value>(bt, it, qp, sq0, sq1, op, h, group, head, static_cast<float>(scale), sc);
      }
    });
  };
  if (bf16)
    run(Cache<uint16_t>{static_cast<const uint16_t*>(k_cache.const_data_ptr()),
                        static_cast<const uint16_t*>(v_cache.const_data_ptr()), kvh * d, d},
        std::true_type{});
  else if (d % kLanes == 0)
    run(Cache<float>{k_cache.const_data_ptr<float>(), v_cache.const_data_ptr<float>(), kvh * d, d}, std::true_type{});
  else
    run(Cache<float>{k_cache.const_data_ptr<float>(), v_cache.const_data_ptr<float>(), kvh * d, d}, std::false_type{});
  return out;
}

}  // namespace specray
