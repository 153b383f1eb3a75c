// Paged attention over a flattened batch on the CPU: prefill chunks, decode tokens and token-tree
// nodes in one call, keys and values read in place through the block tables (no gather into dense
// tensors), GQA without repeating K/V.
//
// One work item is one (query token, query head). Its visible keys are listed in position order
// (committed context, then the window: causal, or the tree mask's row) and everything after that
// depends only on that list: scores q.k * scale one key at a time, softmax over the list in one
// fixed order, the values summed in list order. So a node of a token tree gets exactly the bits
// its token would get in plain decoding, whose visible keys are the same list; masked keys are
// never touched. Items are dealt to threads from both ends of the batch, so that a causal prefill's
// long rows and short rows are shared out evenly.
#include "kernels.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <vector>

namespace specray {
namespace {

constexpr int64_t kMaxHeadDim = 256;

struct Batch {
  const int64_t* qsl;
  const int64_t* kv_lens;
  const int64_t* tables;
  int64_t table_stride, block_size;
  const int64_t* win_lens;   // nullptr: every sequence causal over its new tokens
  const int64_t* row_start;
  const uint8_t* mask;
  int64_t mask_stride;
};

// the flat cache slots of the keys (token i of sequence b) sees, in position order
void visible_slots(const Batch& bt, int64_t b, int64_t qi, std::vector<int64_t>& slots) {
  const int64_t qlen = bt.qsl[b + 1] - bt.qsl[b], L = bt.kv_lens[b], bs = bt.block_size;
  const int64_t* table = bt.tables + b * bt.table_stride;
  const int64_t w = bt.win_lens ? bt.win_lens[b] : 0;
  const int64_t prefix = w > 0 ? L - w : L - qlen + qi + 1;  // keys every query of b sees (causal: up to itself)
  slots.clear();
  for (int64_t p = 0; p < prefix; p += bs) {
    const int64_t base = table[p / bs] * bs, end = std::min(bs, prefix - p);
    for (int64_t o = 0; o < end; ++o) slots.push_back(base + o);
  }
  if (w > 0) {
    const uint8_t* row = bt.mask + (bt.row_start[b] + qi) * bt.mask_stride;
    for (int64_t c = 0; c < w; ++c)
      if (row[c]) {
        const int64_t p = prefix + c;
        slots.push_back(table[p / bs] * bs + p % bs);
      }
  }
}

struct Head {
  const float* k;
  const float* v;
  int64_t slot_stride;  // floats per cache slot (kvh * d)
  int64_t d;
};

// out [d] = softmax(q.K^T * scale) V over the listed slots
void attend_one(const float* q, const Head& hd, const std::vector<int64_t>& slots, float scale,
                std::vector<float>& scores, float* out) {
  const int64_t d = hd.d, n = static_cast<int64_t>(slots.size());
  const int chunks = static_cast<int>((d + kLanes - 1) / kLanes);
  V16 qv[kMaxHeadDim / kLanes];
  for (int c = 0; c < chunks; ++c) qv[c] = vload_n(q + c * kLanes, static_cast<int>(std::min<int64_t>(kLanes, d - c * kLanes)));
  scores.resize(n);
  float m = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    const float* k = hd.k + slots[i] * hd.slot_stride;
    V16 acc = vmul(qv[0], vload_n(k, static_cast<int>(std::min<int64_t>(kLanes, d))));
    for (int c = 1; c < chunks; ++c)
      acc = vfma(qv[c], vload_n(k + c * kLanes, static_cast<int>(std::min<int64_t>(kLanes, d - c * kLanes))), acc);
    const float s = vsum(acc) * scale;
    scores[i] = s;
    m = s > m ? s : m;
  }
  const V16 mv = vset1(m);
  V16 total = vzero();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const V16 e = vexp(vsub(vload(scores.data() + i), mv));
    vstore(scores.data() + i, e);
    total = vadd(total, e);
  }
  if (i < n) {
    const int r = static_cast<int>(n - i);
    const V16 e = vexp(vsub(vload_n(scores.data() + i, r), mv));
    vstore_n(scores.data() + i, e, r);
    total = vadd(total, vload_n(scores.data() + i, r));  // padding lanes are 0, not exp(0 - m)
  }
  V16 acc[kMaxHeadDim / kLanes];
  for (int c = 0; c < chunks; ++c) acc[c] = vzero();
  for (int64_t j = 0; j < n; ++j) {
    const float* v = hd.v + slots[j] * hd.slot_stride;
    const V16 e = vset1(scores[j]);
    for (int c = 0; c < chunks; ++c)
      acc[c] = vfma(e, vload_n(v + c * kLanes, static_cast<int>(std::min<int64_t>(kLanes, d - c * kLanes))), acc[c]);
  }
  const V16 sum = vset1(n > 0 ? vsum(total) : 1.f);
  for (int c = 0; c < chunks; ++c)
    vstore_n(out + c * kLanes, vdiv(acc[c], sum), static_cast<int>(std::min<int64_t>(kLanes, d - c * kLanes)));
}

void check_batch(const Batch& bt, int64_t B, int64_t N, int64_t max_blocks, int64_t num_blocks,
                 int64_t mask_rows, int64_t mask_width) {
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
    if (bt.win_lens && bt.win_lens[b] > 0) {
      const int64_t w = bt.win_lens[b];
      TORCH_CHECK(w <= L && w <= mask_width && bt.row_start[b] >= 0 && bt.row_start[b] + qlen <= mask_rows,
                  "paged_attention: sequence ", b, "'s window of ", w, " keys (rows from ", bt.row_start[b],
                  ") does not fit kv_len ", L, " or the mask's ", mask_rows, " x ", mask_width);
    }
  }
}

}  // namespace

at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                           const at::Tensor& query_start_loc, const at::Tensor& kv_lens,
                           const at::Tensor& block_tables, double scale, const std::optional<at::Tensor>& win_lens,
                           const std::optional<at::Tensor>& row_start, const std::optional<at::Tensor>& mask) {
  check_f32(q, "paged_attention: q");
  check_f32(k_cache, "paged_attention: k_cache");
  check_f32(v_cache, "paged_attention: v_cache");
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
  const bool tree = win_lens.has_value();
  TORCH_CHECK(tree == row_start.has_value() && tree == mask.has_value(),
              "paged_attention: win_lens, row_start and mask come together");
  Batch bt{query_start_loc.const_data_ptr<int64_t>(), kv_lens.const_data_ptr<int64_t>(),
           block_tables.const_data_ptr<int64_t>(), block_tables.stride(0), bs, nullptr, nullptr, nullptr, 0};
  int64_t mask_rows = 0, mask_width = 0;
  if (tree) {
    check_i64(*win_lens, "paged_attention: win_lens");
    check_i64(*row_start, "paged_attention: row_start");
    TORCH_CHECK(win_lens->size(0) == B && row_start->size(0) == B && win_lens->is_contiguous() &&
                    row_start->is_contiguous() && mask->dim() == 2 && mask->stride(1) == 1 &&
                    (mask->scalar_type() == at::kBool || mask->scalar_type() == at::kByte),
                "paged_attention: win_lens ", win_lens->sizes(), " / row_start ", row_start->sizes(), " / mask ",
                mask->sizes(), " ", mask->scalar_type(), ": need [B] int64 twice and a [R, W] bool mask");
    bt.win_lens = win_lens->const_data_ptr<int64_t>();
    bt.row_start = row_start->const_data_ptr<int64_t>();
    bt.mask = static_cast<const uint8_t*>(mask->const_data_ptr());
    bt.mask_stride = mask->stride(0);
    mask_rows = mask->size(0);
    mask_width = mask->size(1);
  }
  check_batch(bt, B, N, block_tables.size(1), num_blocks, mask_rows, mask_width);
  at::Tensor out = at::empty({N, h, d}, q.options());
  if (N == 0) return out;
  std::vector<int64_t> seq_of(N);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = bt.qsl[b]; i < bt.qsl[b + 1]; ++i) seq_of[i] = b;
  const float* qp = q.const_data_ptr<float>();
  float* op = out.mutable_data_ptr<float>();
  const int64_t sq0 = q.stride(0), sq1 = q.stride(1), group = h / kvh, items = N * h;
  const float* kc = k_cache.const_data_ptr<float>();
  const float* vc = v_cache.const_data_ptr<float>();
  at::parallel_for(0, items, 1, [&](int64_t i0, int64_t i1) {
    std::vector<int64_t> slots;
    std::vector<float> scores;
    for (int64_t idx = i0; idx < i1; ++idx) {
      const int64_t item = idx % 2 == 0 ? idx / 2 : items - 1 - idx / 2;  // both ends of the batch
      const int64_t i = item / h, head = item % h, b = seq_of[i], kv = head / group;
      visible_slots(bt, b, i - bt.qsl[b], slots);
      const Head hd{kc + kv * d, vc + kv * d, kvh * d, d};
      attend_one(qp + i * sq0 + head * sq1, hd, slots, static_cast<float>(scale), scores, op + (i * h + head) * d);
    }
  });
  return out;
}

}  // namespace specray
