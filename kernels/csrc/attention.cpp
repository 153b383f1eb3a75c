// Paged attention over a flattened batch on the CPU: prefill chunks, decode tokens and token-tree
// nodes in one call, keys and values read in place through the block tables (no gather into dense
// tensors), GQA without repeating K/V. The caches are fp32, or bf16 (half the bytes a decode step
// streams; each element widened exactly to fp32 as it is loaded, so the arithmetic is the same).
//
// A query row's result depends only on its visible keys in position order (the committed context,
// then its window: causal, or the tree mask's row), never on what else is in the call, nor on the
// threads: its list of visible keys is cut into segments of g_segment entries (list entries
// [0, 512), [512, 1024), ...). In a segment its score with key p is q . k_p summed over d in order,
// one fma per dimension; the softmax's exponentials are taken against the segment's max and summed
// in one fixed order; the values are summed in list order. A row of one segment divides by its sum;
// a longer row's segments are merged in order (merge_segments), whoever computed them. So a
// token-tree node gets exactly the bits its token gets in plain decoding, whose visible keys are the
// same list, and a prefill row the bits of the same token decoded. Masked keys add nothing.
//
// Work items: a sequence's KV head with a tile of its query tokens (the g query heads of that KV
// head times up to kMaxRows / g tokens, or kNarrowRows / g when wide tiles' items, counted segment
// by segment, would leave a thread idle) and one segment of them; each thread takes a contiguous run
// of about equal work, so it reads consecutive key ranges of every KV head of its sequences (a
// slot's heads lie together in the cache; a decode step at 2,000 keys measured 16-20% faster so
// than with each head's whole context read after another). Long rows' segments are merged after.
// Where those rows' partial sums would take large buffers (a long prefill), an item takes all its
// rows' segments instead and merges them itself, items dealt from both ends of the batch so that a
// causal prefill's long and short tiles are shared out evenly. Keys go 16 at a time, transposed in
// registers, so each key is loaded once for all the item's rows (scores are R rows x 16 keys of
// fmas), and values once per group of rows (attention_rows.h).
#include "attention_rows.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace specray {
namespace {

using namespace attention;

// visible-list entries per segment: 512 (set_attention_segment; 0: a row is one segment, the
// arithmetic before segments). 2026-11-28, 2-core Xeon VM, default model, a decode step toggled
// inside one process (benchmarks.attention_segments): 256, 512 and 1,024 against whole rows, 512 the
// best (BENCHMARKS "Attention in segments")
std::atomic<int64_t> g_segment{512};

// one-segment items (long rows' segments merged after the call's items) need [long row segments][d]
// floats of buffers; past this many, items take all their rows' segments (a long prefill)
constexpr int64_t kSplitFloats = int64_t{1} << 20;

struct Batch {
  const int64_t* qsl;
  const int64_t* kv_lens;
  const int64_t* tables;
  int64_t table_stride, block_size;
  // sequence b's window mask [q_b, w_b] (True = visible) over its last w_b key positions; w_b = 0: causal
  std::vector<const uint8_t*> masks;
  std::vector<int64_t> win_lens;
};

// query row i of the batch's flattened tokens (sequence b): its prefix, window and list length
Row token_row(const Batch& bt, int64_t b, int64_t i) {
  const int64_t qlen = bt.qsl[b + 1] - bt.qsl[b], L = bt.kv_lens[b], w = bt.win_lens[b], qi = i - bt.qsl[b];
  if (w == 0) return Row{nullptr, nullptr, L - qlen + qi + 1, nullptr, 0, L - qlen + qi + 1};  // causal
  const uint8_t* win = bt.masks[b] + qi * w;
  int64_t count = L - w;
  for (int64_t c = 0; c < w; ++c) count += win[c] != 0;
  return Row{nullptr, nullptr, L - w, win, w, count};
}

int64_t segments_of(int64_t count, int64_t S) { return (count + S - 1) / S; }

// a row's segments merged in order: out = sum_k acc_k e^(m_k - M) / sum_k l_k e^(m_k - M), M = max_k m_k.
// One function for every caller, so the bits never depend on which path computed the segments
__attribute__((noinline)) void merge_segments(const float* acc, const float* maxes, const float* sums, int64_t n,
                                              int64_t d, float* out) {
  float M = -INFINITY;
  for (int64_t k = 0; k < n; ++k) M = std::max(M, maxes[k]);
  const int chunks = static_cast<int>((d + kLanes - 1) / kLanes);
  V16 a[kMaxHeadDim / kLanes];
  for (int c = 0; c < chunks; ++c) a[c] = vzero();
  float total = 0.f;
  for (int64_t k = 0; k < n; ++k) {
    const float f = std::exp(maxes[k] - M);
    total = std::fma(sums[k], f, total);
    const V16 fv = vset1(f);
    for (int c = 0; c < chunks; ++c) a[c] = vfma(fv, vload_n(acc + k * d + c * kLanes, lanes_in(d, c)), a[c]);
  }
  const V16 tv = vset1(total);
  for (int c = 0; c < chunks; ++c) vstore_n(out + c * kLanes, vdiv(a[c], tv), lanes_in(d, c));
}

struct Item {
  int64_t seq, kv_head, tok0, tok1;  // query tokens [tok0, tok1) of sequence seq
  int64_t seg;                       // the one segment it computes, or -1: all of its rows' segments
};

struct Call {  // what every item of one call shares
  const Batch& bt;
  const float* q;
  int64_t sq0, sq1;
  float* out;
  int64_t h, group, S;
  float scale;
  // one-segment items: where each long row's segments go ([token][head][segment][d], maxima, sums)
  float* parts;
  float* maxes;
  float* sums;
  const int64_t* part_of;  // [token] first segment index of the token's rows, or -1: a one-segment row
  const int64_t* nseg;     // [token] segments of the token's rows
};

// the rows of segment k among rows[0, R): those whose list reaches it, with their key range set;
// part(r) gives row r's destination for the segment (nullptr: its result)
template <typename Part>
int segment_rows(const Row* rows, int R, int64_t k, int64_t S, Row* out, int* which, Part part) {
  int n = 0;
  for (int r = 0; r < R; ++r) {
    if (rows[r].count <= k * S) continue;
    out[n] = rows[r];
    out[n].segment(k * S, S);
    out[n].part = part(r);
    which[n++] = r;
  }
  return n;
}

// one segment of R rows (key ranges set): their maxima and exponential sums
template <bool Whole, typename T>
void attend_segment(const Call& cl, int64_t b, Row* rows, int R, const Cache<T>& cache, Scratch& sc, float* maxes,
                    float* sums) {
  int64_t base = INT64_MAX, top = 0;
  for (int r = 0; r < R; ++r) base = std::min(base, rows[r].lo), top = std::max(top, rows[r].hi);
  const int64_t keys = top - base, bs = cl.bt.block_size;
  const int64_t* table = cl.bt.tables + b * cl.bt.table_stride;
  sc.slots.resize(keys);
  for (int64_t p = base; p < top;) {  // block by block: no division per key
    const int64_t off = p % bs, n = std::min(bs - off, top - p), first = table[p / bs] * bs + off;
    for (int64_t o = 0; o < n; ++o) sc.slots[p - base + o] = first + o;
    p += n;
  }
  sc.scores.resize(static_cast<size_t>(R) * keys + kLanes);
  score_rows<Whole, T>(rows, R, cache, sc.slots.data(), keys, cl.scale, sc.zero_key(cache.k), sc.scores.data());
  for (int r = 0; r < R; ++r) sums[r] = softmax_segment(rows[r], sc.scores.data() + r * keys, base, maxes[r]);
  weigh_values<Whole, T>(rows, R, cache, sc.slots.data(), base, keys, sc.scores.data(), sums);
}

// the item's rows (their queries, results, lists); returns how many
int item_rows(const Call& cl, const Item& it, int64_t d, Row* rows) {
  int R = 0;
  for (int64_t i = it.tok0; i < it.tok1; ++i) {
    const Row tok = token_row(cl.bt, it.seq, i);
    for (int64_t j = 0; j < cl.group; ++j) {
      const int64_t head = it.kv_head * cl.group + j;
      rows[R] = tok;
      rows[R].q = cl.q + i * cl.sq0 + head * cl.sq1;
      rows[R].out = cl.out + (i * cl.h + head) * d;
      ++R;
    }
  }
  return R;
}

template <bool Whole, typename T>
void attend_item(const Call& cl, const Item& it, const Cache<T>& cache, Scratch& sc) {
  const int64_t d = cache.d, S = cl.S;
  Row rows[kMaxRows], seg[kMaxRows];
  int which[kMaxRows];
  float maxes[kMaxRows], sums[kMaxRows];
  const int R = item_rows(cl, it, d, rows);
  for (int r = 0; r < R && it.seg <= 0; ++r)  // a window row that sees no key at all: zeros
    if (rows[r].count == 0) std::fill(rows[r].out, rows[r].out + d, 0.f);
  if (it.seg >= 0) {  // one segment; long rows' partial results go to the call's buffers, merged after
    const int64_t k = it.seg;
    auto slot = [&](int r) {  // row r's segment k in the call's buffers: its index there, or -1
      const int64_t tok = it.tok0 + r / cl.group, head = it.kv_head * cl.group + r % cl.group;
      return cl.part_of[tok] < 0 ? int64_t{-1} : cl.part_of[tok] + head * cl.nseg[tok] + k;
    };
    const int n = segment_rows(rows, R, k, S, seg, which, [&](int r) {
      const int64_t at = slot(r);
      return at < 0 ? nullptr : cl.parts + at * d;
    });
    if (n == 0) return;
    attend_segment<Whole, T>(cl, it.seq, seg, n, cache, sc, maxes, sums);
    for (int r = 0; r < n; ++r) {
      const int64_t at = slot(which[r]);
      if (at >= 0) cl.maxes[at] = maxes[r], cl.sums[at] = sums[r];
    }
    return;
  }
  int64_t most = 0;  // every segment of the item's rows; long rows' partial results in the scratch
  for (int r = 0; r < R; ++r) most = std::max(most, segments_of(rows[r].count, S));
  if (most > 1) {
    sc.parts.resize(static_cast<size_t>(R) * most * d);
    sc.maxes.resize(static_cast<size_t>(R) * most);
    sc.sums.resize(static_cast<size_t>(R) * most);
  }
  for (int64_t k = 0; k < most; ++k) {
    const int n = segment_rows(rows, R, k, S, seg, which, [&](int r) {
      return segments_of(rows[r].count, S) > 1 ? sc.parts.data() + (r * most + k) * d : nullptr;
    });
    attend_segment<Whole, T>(cl, it.seq, seg, n, cache, sc, maxes, sums);
    for (int r = 0; r < n; ++r)
      if (seg[r].part != nullptr) sc.maxes[which[r] * most + k] = maxes[r], sc.sums[which[r] * most + k] = sums[r];
  }
  for (int r = 0; r < R; ++r) {
    const int64_t n = segments_of(rows[r].count, S);
    if (n > 1)
      merge_segments(sc.parts.data() + r * most * d, sc.maxes.data() + r * most, sc.sums.data() + r * most, n, d,
                     rows[r].out);
  }
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
  TORCH_CHECK(!bf16 || d % kLanes == 0, "paged_attention: a bfloat16 cache needs a head dim that is a multiple of ",
              kLanes, ", got ", d);
  const int64_t group = h / kvh, wide = std::max<int64_t>(1, kMaxRows / group), threads = at::get_num_threads();
  const int64_t segment = g_segment.load(), S = segment > 0 ? segment : INT64_MAX / 4;
  // tokens' list lengths and segment counts; one-segment items unless the long rows' buffers would be large
  std::vector<int64_t> listed(N), nseg(N), part_of(N, -1), most(B, 1);
  int64_t long_rows = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = bt.qsl[b]; i < bt.qsl[b + 1]; ++i) {
      listed[i] = token_row(bt, b, i).count;
      nseg[i] = segments_of(listed[i], S);
      most[b] = std::max(most[b], nseg[i]);
      if (nseg[i] > 1) part_of[i] = long_rows, long_rows += h * nseg[i];
    }
  const bool split = long_rows > 0 && long_rows * d <= kSplitFloats;
  int64_t wide_items = 0;  // items of wide tiles (and one segment each when split)
  for (int64_t b = 0; b < B; ++b)
    wide_items += kvh * ((bt.qsl[b + 1] - bt.qsl[b] + wide - 1) / wide) * (split ? most[b] : 1);
  const int64_t tile = wide_items >= 2 * threads ? wide : std::max<int64_t>(1, kNarrowRows / group);
  std::vector<Item> items;
  std::vector<int64_t> cut{0};  // split: thread t's items [cut[t], cut[t + 1])
  std::vector<double> work;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = bt.qsl[b]; i < bt.qsl[b + 1]; i += tile) {
      const int64_t i1 = std::min(i + tile, bt.qsl[b + 1]);
      int64_t segs = 1;
      for (int64_t t = i; t < i1 && split; ++t) segs = std::max(segs, nseg[t]);
      for (int64_t k = 0; k < segs; ++k)
        for (int64_t j = 0; j < kvh; ++j) {
          items.push_back({b, j, i, i1, split ? k : -1});
          if (!split) continue;
          double keys = 16;  // a rough fixed cost per item, in keys
          for (int64_t t = i; t < i1; ++t) keys += std::clamp<double>(listed[t] - k * S, 0, S);
          work.push_back(keys);
        }
    }
  const int64_t count = static_cast<int64_t>(items.size());
  if (split) {  // contiguous runs of about equal work
    double total = 0, run = 0;
    for (double x : work) total += x;
    for (int64_t i = 0; i < count; ++i) {
      const double target = total * static_cast<double>(cut.size()) / threads;
      if (static_cast<int64_t>(cut.size()) < threads && run + work[i] / 2 > target) cut.push_back(i);
      run += work[i];
    }
    while (static_cast<int64_t>(cut.size()) <= threads) cut.push_back(count);
  }
  std::vector<float> parts(split ? long_rows * d : 0), maxes(split ? long_rows : 0), sums(split ? long_rows : 0);
  const Call cl{bt,          q.const_data_ptr<float>(), q.stride(0),  q.stride(1),   out.mutable_data_ptr<float>(),
                h,           group,                     S,            static_cast<float>(scale),
                parts.data(), maxes.data(),             sums.data(),  part_of.data(), nseg.data()};
  // head offsets folded in: a slot's key for KV head j starts at k + slot * kvh * d + j * d
  // Whole: the head dim is a multiple of 16, so no load needs a mask (bf16 caches always are)
  auto run = [&](auto cache, auto whole) {
    auto one = [&](const Item& it, Scratch& sc) {
      const decltype(cache) head{cache.k + it.kv_head * d, cache.v + it.kv_head * d, cache.slot_stride, d};
      attend_item<decltype(whole)::value>(cl, it, head, sc);
    };
    if (split) {
      at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
        Scratch sc;
        for (int64_t idx = cut[t0]; idx < cut[t1]; ++idx) one(items[idx], sc);
      });
      return;
    }
    at::parallel_for(0, count, 1, [&](int64_t i0, int64_t i1) {
      Scratch sc;
      for (int64_t idx = i0; idx < i1; ++idx)
        one(items[idx % 2 == 0 ? idx / 2 : count - 1 - idx / 2], sc);  // both ends of the batch
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
  if (split)  // the long rows' segments, merged in order
    for (int64_t i = 0; i < N; ++i)
      for (int64_t j = 0; part_of[i] >= 0 && j < h; ++j) {
        const int64_t at = part_of[i] + j * nseg[i];
        merge_segments(parts.data() + at * d, maxes.data() + at, sums.data() + at, nseg[i], d,
                       cl.out + (i * h + j) * d);
      }
  return out;
}

void set_attention_segment(int64_t keys) {
  TORCH_CHECK(keys >= 0 && keys % kLanes == 0, "set_attention_segment: keys must be 0 (whole rows) or a positive "
              "multiple of ", kLanes, ", got ", keys);
  g_segment.store(keys);
}

int64_t attention_segment() { return g_segment.load(); }

}  // namespace specray
