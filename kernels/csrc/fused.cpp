// Row-wise small ops of the decoder layer, each one pass over its rows: RMSNorm (with the residual
// add), SiLU-and-multiply, and RoPE fused with the KV-cache write; and the argmax, the top-k
// log-probabilities and a sampled token of logits' rows. Rows are independent: threads
// split rows, and a row's reductions run in one fixed order (vec16.h).
#include "kernels.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace specray {
namespace {

constexpr int64_t kMaxKvWidth = 8192;  // KV heads x head dim of one token (a bf16 cache's staging row)

// grain: rows per thread chunk such that a chunk is at least ~16k elements of work
inline int64_t grain(int64_t width) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(width, 1)); }

// out = s * rsqrt(sum(s^2) / H + eps) * w for one row s [H]
inline void norm_row(const float* s, const float* w, float* out, int64_t H, float eps) {
  V16 acc = vzero();
  int64_t j = 0;
  for (; j + kLanes <= H; j += kLanes) {
    const V16 v = vload(s + j);
    acc = vfma(v, v, acc);
  }
  if (j < H) {
    const V16 v = vload_n(s + j, static_cast<int>(H - j));
    acc = vfma(v, v, acc);
  }
  const float r = 1.f / std::sqrt(vsum(acc) / static_cast<float>(H) + eps);
  const V16 rv = vset1(r);
  for (j = 0; j + kLanes <= H; j += kLanes) vstore(out + j, vmul(vmul(vload(s + j), rv), vload(w + j)));
  if (j < H) {
    const int n = static_cast<int>(H - j);
    vstore_n(out + j, vmul(vmul(vload_n(s + j, n), rv), vload_n(w + j, n)), n);
  }
}

void check_rows(const at::Tensor& t, const char* what) {
  check_f32(t, what);
  TORCH_CHECK(t.dim() == 2 && t.stride(1) == 1, what, " must be [N, H] with contiguous rows, got ", t.sizes(),
              " strides ", t.strides());
}

}  // namespace

at::Tensor rmsnorm(const at::Tensor& x, const at::Tensor& weight, double eps, const at::Tensor& result) {
  check_rows(x, "rmsnorm: x");
  check_f32(weight, "rmsnorm: weight");
  const int64_t N = x.size(0), H = x.size(1);
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == H && weight.is_contiguous(), "rmsnorm: weight must be [", H,
              "], got ", weight.sizes());
  at::Tensor out = result_buffer(result, {N, H}, x, "rmsnorm");
  const float* xp = x.const_data_ptr<float>();
  const float* wp = weight.const_data_ptr<float>();
  float* op = out.mutable_data_ptr<float>();
  const int64_t sx = x.stride(0);
  at::parallel_for(0, N, grain(H), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) norm_row(xp + r * sx, wp, op + r * H, H, static_cast<float>(eps));
  });
  return out;
}

at::Tensor rmsnorm_residual(at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight, double eps,
                            const at::Tensor& result) {
  check_rows(x, "rmsnorm_residual: x");
  check_rows(residual, "rmsnorm_residual: residual");
  check_f32(weight, "rmsnorm_residual: weight");
  const int64_t N = x.size(0), H = x.size(1);
  TORCH_CHECK(residual.size(0) == N && residual.size(1) == H && weight.dim() == 1 && weight.size(0) == H &&
                  weight.is_contiguous(),
              "rmsnorm_residual: x ", x.sizes(), ", residual ", residual.sizes(), ", weight ", weight.sizes(),
              " do not match");
  at::Tensor out = result_buffer(result, {N, H}, x, "rmsnorm_residual");
  float* xp = x.mutable_data_ptr<float>();
  const float* rp = residual.const_data_ptr<float>();
  const float* wp = weight.const_data_ptr<float>();
  float* op = out.mutable_data_ptr<float>();
  const int64_t sx = x.stride(0), sr = residual.stride(0);
  at::parallel_for(0, N, grain(H), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* s = xp + r * sx;
      const float* res = rp + r * sr;
      int64_t j = 0;
      for (; j + kLanes <= H; j += kLanes) vstore(s + j, vadd(vload(s + j), vload(res + j)));
      for (; j < H; ++j) s[j] = s[j] + res[j];
      norm_row(s, wp, op + r * H, H, static_cast<float>(eps));
    }
  });
  return out;
}

namespace {

// torch.argmax's answer for one row, element by element: the first NaN, else the first maximum
int64_t argmax_scalar(const float* x, int64_t V) {
  int64_t best = 0;
  for (int64_t j = 0; j < V; ++j) {
    if (std::isnan(x[j])) return j;
    if (x[j] > x[best]) best = j;
  }
  return best;
}

// one vector pass over x[0, V): whether every value is finite (v - v is 0 for each) and, if so, the
// maximum in m
bool finite_max(const float* x, int64_t V, float& m) {
  const float lowest = -std::numeric_limits<float>::infinity();
  V16 mx = vset1(lowest), bad = vzero();
  int64_t j = 0;
  for (; j + kLanes <= V; j += kLanes) {
    const V16 v = vload(x + j);
    mx = vmax(mx, v);
    bad = vadd(bad, vsub(v, v));
  }
  const int tail = static_cast<int>(V - j);
  if (tail) {
    const V16 v = vload_n(x + j, tail);
    mx = vmax(mx, vload_or(x + j, tail, lowest));
    bad = vadd(bad, vsub(v, v));
  }
  if (!(vsum(bad) == 0.f)) return false;
  m = vmaxr(mx);
  return true;
}

// the same answer in two vector passes (the maximum, then where it first is); rows holding a NaN or
// an infinity take the scalar pass
int64_t argmax_row(const float* x, int64_t V) {
  float m;
  if (!finite_max(x, V, m)) return argmax_scalar(x, V);
  int64_t j = 0;
  for (; j + kLanes <= V; j += kLanes) {
    const int at = vfirst_eq(vload(x + j), m);
    if (at >= 0) return j + at;
  }
  for (; j < V; ++j)
    if (x[j] == m) return j;
  return argmax_scalar(x, V);  // not reached
}

}  // namespace

at::Tensor argmax_rows(const at::Tensor& x) {
  check_rows(x, "argmax_rows: x");
  const int64_t N = x.size(0), V = x.size(1);
  TORCH_CHECK(V > 0, "argmax_rows: rows of 0 values have no argmax");
  at::Tensor out = at::empty({N}, x.options().dtype(at::kLong));
  const float* xp = x.const_data_ptr<float>();
  int64_t* op = out.mutable_data_ptr<int64_t>();
  const int64_t sx = x.stride(0);
  at::parallel_for(0, N, grain(V), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) op[r] = argmax_row(xp + r * sx, V);
  });
  return out;
}

namespace {

// a ranks above b as torch.topk orders values: a NaN above every number, then by value
inline bool ranks_above(float a, float b) { return a > b || (std::isnan(a) && !std::isnan(b)); }

// the k best of x[0, V) (k <= V) -> idx[0, k), best first; equal values keep their order (the lower
// index first). `vector`: no NaN in x, so lanes are screened against the current k-th value first.
void top_indices(const float* x, int64_t V, int64_t k, bool vector, int64_t* idx) {
  int64_t n = 0;
  auto insert = [&](int64_t j) {  // x[j] joins the n best (the k-th leaves when there are k)
    int64_t p = std::min(n, k - 1);
    while (p > 0 && ranks_above(x[j], x[idx[p - 1]])) {
      idx[p] = idx[p - 1];
      --p;
    }
    idx[p] = j;
    n += n < k;
  };
  int64_t j = 0;
  for (; j < k; ++j) insert(j);
  if (vector)
    for (; j + kLanes <= V; j += kLanes)
      for (unsigned m = vgt_mask(vload(x + j), x[idx[k - 1]]); m; m &= m - 1) {
        const int64_t at = j + __builtin_ctz(m);
        if (x[at] > x[idx[k - 1]]) insert(at);  // the k-th value may have risen within this group
      }
  for (; j < V; ++j)
    if (ranks_above(x[j], x[idx[k - 1]])) insert(j);
}

// log(sum(exp(x - m))) over a row whose values are all finite, m its maximum
float log_sum_exp_finite(const float* x, int64_t V, float m) {
  const V16 mv = vset1(m);
  V16 acc = vzero();
  int64_t j = 0;
  for (; j + kLanes <= V; j += kLanes) acc = vadd(acc, vexp(vsub(vload(x + j), mv)));
  float s = vsum(acc);
  for (; j < V; ++j) s += std::exp(x[j] - m);
  return std::log(s);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> top_logprobs(const at::Tensor& x, int64_t k) {
  check_rows(x, "top_logprobs: x");
  const int64_t N = x.size(0), V = x.size(1);
  TORCH_CHECK(k >= 0 && k <= V, "top_logprobs: k=", k, " must be in [0, ", V, "] (the row length)");
  at::Tensor values = at::empty({N, k}, x.options()), indices = at::empty({N, k}, x.options().dtype(at::kLong));
  if (k == 0) return {values, indices};
  const float* xp = x.const_data_ptr<float>();
  float* vp = values.mutable_data_ptr<float>();
  int64_t* ip = indices.mutable_data_ptr<int64_t>();
  const int64_t sx = x.stride(0);
  at::parallel_for(0, N, grain(V), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* row = xp + r * sx;
      float m = -std::numeric_limits<float>::infinity();
      const bool finite = finite_max(row, V, m);
      float lse;  // log-sum-exp less the maximum
      if (finite) {
        lse = log_sum_exp_finite(row, V, m);
      } else {  // torch's answers: NaN everywhere once a NaN or an infinity is involved (-inf alone is fine)
        double s = 0.;
        bool nan = false;
        for (int64_t j = 0; j < V; ++j) {
          nan = nan || std::isnan(row[j]);
          m = row[j] > m ? row[j] : m;
        }
        m = nan ? std::numeric_limits<float>::quiet_NaN() : m;
        for (int64_t j = 0; j < V; ++j) s += std::exp(static_cast<double>(row[j] - m));
        lse = static_cast<float>(std::log(s));
      }
      int64_t* top = ip + r * k;
      top_indices(row, V, k, finite, top);
      for (int64_t i = 0; i < k; ++i) vp[r * k + i] = (row[top[i]] - m) - lse;
    }
  });
  return {values, indices};
}

at::Tensor silu_and_mul(const at::Tensor& x, const at::Tensor& result) {
  check_rows(x, "silu_and_mul: x");
  TORCH_CHECK(x.size(1) % 2 == 0, "silu_and_mul: x's last dim must be even (gate | up), got ", x.size(1));
  const int64_t N = x.size(0), I = x.size(1) / 2;
  at::Tensor out = result_buffer(result, {N, I}, x, "silu_and_mul");
  const float* xp = x.const_data_ptr<float>();
  float* op = out.mutable_data_ptr<float>();
  const int64_t sx = x.stride(0);
  const V16 one = vset1(1.f);
  at::parallel_for(0, N, grain(I), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* g = xp + r * sx;
      const float* u = g + I;
      float* o = op + r * I;
      for (int64_t j = 0; j < I; j += kLanes) {
        const int n = static_cast<int>(std::min<int64_t>(kLanes, I - j));
        const V16 gv = vload_n(g + j, n);
        const V16 silu = vdiv(gv, vadd(one, vexp(vsub(vzero(), gv))));  // g / (1 + exp(-g))
        vstore_n(o + j, vmul(silu, vload_n(u + j, n)), n);
      }
    }
  });
  return out;
}

at::Tensor rope_write_kv(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin,
                         const at::Tensor& slots, at::Tensor& k_cache, at::Tensor& v_cache, int64_t h, int64_t kvh,
                         const at::Tensor& result) {
  check_rows(qkv, "rope_write_kv: qkv");
  check_f32(cos, "rope_write_kv: cos");
  check_f32(sin, "rope_write_kv: sin");
  check_i64(slots, "rope_write_kv: slot_mapping");
  const bool bf16 = check_kv_caches(k_cache, v_cache, "rope_write_kv");
  const int64_t N = qkv.size(0);
  TORCH_CHECK(h > 0 && kvh > 0 && qkv.size(1) % (h + 2 * kvh) == 0, "rope_write_kv: qkv width ", qkv.size(1),
              " is not (h + 2 kvh) * d for h=", h, ", kvh=", kvh);
  const int64_t d = qkv.size(1) / (h + 2 * kvh), half = d / 2;
  TORCH_CHECK(d % 2 == 0, "rope_write_kv: head_dim ", d, " must be even");
  // cos/sin: N rows of d/2 (e.g. [N, d/2], [N, 1, d/2] or [N, 1, 1, d/2]), each row contiguous
  TORCH_CHECK(cos.size(0) == N && sin.size(0) == N && cos.size(-1) == half && sin.size(-1) == half &&
                  cos.numel() == N * half && sin.numel() == N * half && cos.stride(-1) == 1 && sin.stride(-1) == 1,
              "rope_write_kv: cos ", cos.sizes(), " / sin ", sin.sizes(), " must be N=", N, " rows of d/2=", half,
              " contiguous values");
  TORCH_CHECK(slots.dim() == 1 && slots.size(0) == N, "rope_write_kv: slot_mapping must be [", N, "], got ",
              slots.sizes());
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.sizes() == v_cache.sizes() &&
                  k_cache.size(-1) == d && k_cache.size(-2) == kvh,
              "rope_write_kv: caches ", k_cache.sizes(), " / ", v_cache.sizes(), " must be contiguous [..., kvh=", kvh,
              ", d=", d, "]");
  const int64_t num_slots = k_cache.numel() / (kvh * d);
  TORCH_CHECK(!bf16 || kvh * d <= kMaxKvWidth, "rope_write_kv: a bfloat16 cache of ", kvh, " KV heads x ", d,
              " dims is wider than ", kMaxKvWidth);
  at::Tensor q = result_buffer(result, {N, h, d}, qkv, "rope_write_kv");
  const float* src = qkv.const_data_ptr<float>();
  const float* cp = cos.const_data_ptr<float>();
  const float* sp = sin.const_data_ptr<float>();
  const int64_t* slot = slots.const_data_ptr<int64_t>();
  float* qp = q.mutable_data_ptr<float>();
  void* kp = k_cache.mutable_data_ptr();
  void* vp = v_cache.mutable_data_ptr();
  const int64_t sq = qkv.stride(0), sc = cos.stride(0), ss = sin.stride(0);
  for (int64_t i = 0; i < N; ++i)
    TORCH_CHECK(slot[i] < num_slots, "rope_write_kv: slot_mapping[", i, "] = ", slot[i], " is outside the cache's ",
                num_slots, " slots");
  // rotate-half: first half x1 cos - x2 sin, second x2 cos + x1 sin (two roundings each, no fma)
  auto rotate = [half](const float* x, const float* c, const float* s, float* out) {
    for (int64_t j = 0; j < half; ++j) {
      const float x1 = x[j], x2 = x[j + half];
      out[j] = x1 * c[j] - x2 * s[j];
      out[j + half] = x2 * c[j] + x1 * s[j];
    }
  };
  at::parallel_for(0, N, grain((h + 2 * kvh) * d), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* row = src + r * sq;
      const float* c = cp + r * sc;
      const float* s = sp + r * ss;
      for (int64_t j = 0; j < h; ++j) rotate(row + j * d, c, s, qp + (r * h + j) * d);
      if (slot[r] < 0) continue;  // a padded row: nothing written
      const float* v = row + (h + kvh) * d;
      const int64_t at = slot[r] * kvh * d;
      if (!bf16) {
        float* kdst = static_cast<float*>(kp) + at;
        float* vdst = static_cast<float*>(vp) + at;
        for (int64_t j = 0; j < kvh; ++j) rotate(row + (h + j) * d, c, s, kdst + j * d);
        for (int64_t j = 0; j < kvh * d; ++j) vdst[j] = v[j];
        continue;
      }
      // a bf16 cache: the fp32 values rounded to nearest even, as torch's .to(torch.bfloat16)
      float kr[kMaxKvWidth];
      for (int64_t j = 0; j < kvh; ++j) rotate(row + (h + j) * d, c, s, kr + j * d);
      c10::BFloat16* kdst = static_cast<c10::BFloat16*>(kp) + at;
      c10::BFloat16* vdst = static_cast<c10::BFloat16*>(vp) + at;
      for (int64_t j = 0; j < kvh * d; ++j) kdst[j] = c10::BFloat16(kr[j]), vdst[j] = c10::BFloat16(v[j]);
    }
  });
  return q;
}

void copy_kv_slots(at::TensorList k_caches, at::TensorList v_caches, const at::Tensor& src, const at::Tensor& dst) {
  check_i64(src, "copy_kv_slots: src");
  check_i64(dst, "copy_kv_slots: dst");
  TORCH_CHECK(src.dim() == 1 && dst.dim() == 1 && src.size(0) == dst.size(0) && src.is_contiguous() &&
                  dst.is_contiguous(),
              "copy_kv_slots: src ", src.sizes(), " and dst ", dst.sizes(), " must be equal-length contiguous vectors");
  TORCH_CHECK(k_caches.size() == v_caches.size(), "copy_kv_slots: ", k_caches.size(), " K caches but ",
              v_caches.size(), " V caches");
  const int64_t M = src.size(0);
  const int64_t* s = src.const_data_ptr<int64_t>();
  const int64_t* d = dst.const_data_ptr<int64_t>();
  std::vector<const at::Tensor*> caches;
  for (size_t layer = 0; layer < k_caches.size(); ++layer) {
    caches.push_back(&k_caches[layer]);
    caches.push_back(&v_caches[layer]);
  }
  for (const at::Tensor* cache : caches) {  // every check before any write
    check_kv_caches(*cache, *cache, "copy_kv_slots");
    TORCH_CHECK(cache->is_contiguous() && cache->dim() >= 2, "copy_kv_slots: caches must be contiguous [slots..., ",
                "kvh, d], got ", cache->sizes());
    const int64_t slots = cache->numel() / std::max<int64_t>(1, cache->size(-1) * cache->size(-2));
    for (int64_t i = 0; i < M; ++i)
      TORCH_CHECK(s[i] >= 0 && s[i] < slots && d[i] >= 0 && d[i] < slots, "copy_kv_slots: slot ", s[i], " -> ", d[i],
                  " outside the cache's ", slots, " slots");
  }
  std::vector<char> rows;
  for (const at::Tensor* cache : caches) {
    const int64_t width = cache->size(-1) * cache->size(-2) * static_cast<int64_t>(cache->element_size());
    char* base = static_cast<char*>(cache->data_ptr());
    rows.resize(static_cast<size_t>(M * width));
    for (int64_t i = 0; i < M; ++i)  // every source read before any destination is written
      std::memcpy(rows.data() + i * width, base + s[i] * width, static_cast<size_t>(width));
    for (int64_t i = 0; i < M; ++i)
      std::memcpy(base + d[i] * width, rows.data() + i * width, static_cast<size_t>(width));
  }
}

namespace {

// softmax(x / T) of one row, unnormalised: e[j] = exp((x[j] - m) / T) (m: the row's maximum) into e,
// and the sums of each 16 of them (in double) into sums; returns their total, summed in block order
// (NaN where a logit is NaN or +inf; -inf logits have no mass)
double row_exps(const float* x, int64_t V, float inv_t, float* e, double* sums) {
  const float lowest = -std::numeric_limits<float>::infinity();
  const V16 floor = vset1(std::numeric_limits<float>::lowest());
  V16 mx = vset1(lowest), bad = vzero();
  for (int64_t k = 0; k < V; k += kLanes) {
    const V16 v = vload_or(x + k, static_cast<int>(std::min<int64_t>(kLanes, V - k)), lowest);
    mx = vmax(mx, v);
    const V16 w = vmax(floor, v);  // -inf raised to the lowest finite value; NaN (the second operand) kept
    bad = vadd(bad, vsub(w, w));   // 0, or NaN once a lane is NaN or +inf
  }
  if (!(vsum(bad) == 0.f)) return std::numeric_limits<double>::quiet_NaN();
  const V16 m = vset1(vmaxr(mx)), inv = vset1(inv_t);
  double total = 0.;
  for (int64_t b = 0, k = 0; k < V; ++b, k += kLanes) {
    const int n = static_cast<int>(std::min<int64_t>(kLanes, V - k));
    const V16 v = vexp(vmul(vsub(vload_or(x + k, n, lowest), m), inv));  // padding lanes: exp(-inf) = 0
    vstore_n(e + k, v, n);
    sums[b] = static_cast<double>(vsum(v));
    total += sums[b];
  }
  return total;
}

}  // namespace

namespace {

// the first token whose cumulative mass exceeds u * total, e[0, V) unnormalised masses and sums their
// per-16 block sums (in double, total their sum in block order): its block by the block sums, then
// within the block; a token without mass is never drawn. -1 only where no token has mass
int64_t invert_cdf(const float* e, const double* sums, int64_t V, double u, double total) {
  const int64_t blocks = (V + kLanes - 1) / kLanes;
  const double target = u * total;
  double before = 0.;
  int64_t last = -1;  // the last block with mass
  for (int64_t b = 0; b < blocks; ++b) {
    if (sums[b] > 0) last = b;
    if (!(before + sums[b] > target)) {
      before += sums[b];
      continue;
    }
    double cum = before;
    int64_t with_mass = -1;
    for (int64_t j = b * kLanes; j < std::min(V, (b + 1) * kLanes); ++j) {
      if (!(e[j] > 0)) continue;
      with_mass = j;
      cum += e[j];
      if (cum > target) return j;
    }
    return with_mass;  // the block's float sum exceeded the target where its double sum did not
  }
  if (last < 0) return -1;
  // u * total rounded up to the total: the last token with mass
  for (int64_t j = std::min(V, (last + 1) * kLanes) - 1; j >= last * kLanes; --j)
    if (e[j] > 0) return j;
  return -1;  // not reached: a block with mass has a token with mass
}

void check_row(const at::Tensor& x, double temperature, const char* what) {
  check_f32(x, what);
  TORCH_CHECK(x.dim() == 1 && x.stride(0) == 1 && x.numel() > 0, what, " must be a contiguous [V] row of at least "
              "one logit, got ", x.sizes(), " strides ", x.strides());
  TORCH_CHECK(temperature > 0 && std::isfinite(temperature), what, ": temperature must be > 0, got ", temperature);
}

// the row's exponentials and block sums, kept between calls (one row at a time per thread)
struct RowScratch {
  std::vector<float> e;
  std::vector<double> sums;
  double exps(const at::Tensor& x, double temperature) {
    const int64_t V = x.numel(), blocks = (V + kLanes - 1) / kLanes;
    if (static_cast<int64_t>(e.size()) < blocks * kLanes) e.resize(blocks * kLanes);
    if (static_cast<int64_t>(sums.size()) < blocks) sums.resize(blocks);
    return row_exps(x.const_data_ptr<float>(), V, static_cast<float>(1. / temperature), e.data(), sums.data());
  }
};
thread_local RowScratch g_row;
thread_local std::vector<int64_t> g_touched;  // blocks a residual changed

}  // namespace

int64_t sample_logits(const at::Tensor& x, double temperature, double u) {
  check_row(x, temperature, "sample_logits: x");
  TORCH_CHECK(u >= 0 && u < 1, "sample_logits: u must be a uniform draw in [0, 1), got ", u);
  const double total = g_row.exps(x, temperature);
  if (!(total > 0) || !std::isfinite(total)) return -1;  // a NaN or +inf logit, or no mass: the caller's path
  return invert_cdf(g_row.e.data(), g_row.sums.data(), x.numel(), u, total);
}

double softmax_at(const at::Tensor& x, double temperature, int64_t token) {
  check_row(x, temperature, "softmax_at: x");
  const int64_t V = x.numel();
  TORCH_CHECK(token >= 0 && token < V, "softmax_at: token ", token, " is outside the row's ", V, " logits");
  const double total = g_row.exps(x, temperature);
  if (!(total > 0) || !std::isfinite(total)) return -1.;
  return static_cast<double>(g_row.e[token]) / total;
}

int64_t sample_residual_logits(const at::Tensor& x, double temperature, double u, int64_t token, const at::Tensor& ids,
                               const at::Tensor& q) {
  check_row(x, temperature, "sample_residual_logits: x");
  TORCH_CHECK(u >= 0 && u < 1, "sample_residual_logits: u must be a uniform draw in [0, 1), got ", u);
  const int64_t V = x.numel(), S = ids.numel(), blocks = (V + kLanes - 1) / kLanes;
  TORCH_CHECK(token >= 0 && token < V, "sample_residual_logits: token ", token, " is outside the row's ", V,
              " logits");
  if (S > 0) {
    check_i64(ids, "sample_residual_logits: ids");
    check_f32(q, "sample_residual_logits: q");
    TORCH_CHECK(ids.dim() == 1 && ids.is_contiguous() && q.dim() == 1 && q.is_contiguous() && q.numel() == S,
                "sample_residual_logits: ids and q must be contiguous [S] rows of one length, got ", ids.sizes(),
                " and ", q.sizes());
  }
  const double total = g_row.exps(x, temperature);
  if (!(total > 0) || !std::isfinite(total)) return -1;
  float* e = g_row.e.data();
  double* sums = g_row.sums.data();
  // max(0, p - q) times the total, in place: q a delta at token (S = 0) leaves token no mass; else
  // q's mass comes off its tokens. Touched blocks' sums are taken again, in the same order
  std::vector<int64_t>& touched = g_touched;
  touched.clear();
  if (S == 0) {
    e[token] = 0.f;
    touched.push_back(token / kLanes);
  } else {
    const int64_t* id = ids.const_data_ptr<int64_t>();
    const float* qp = q.const_data_ptr<float>();
    for (int64_t i = 0; i < S; ++i) {
      TORCH_CHECK(id[i] >= 0 && id[i] < V, "sample_residual_logits: ids[", i, "] = ", id[i], " is outside the row's ",
                  V, " logits");
      e[id[i]] = std::max(0.f, static_cast<float>(e[id[i]] - static_cast<double>(qp[i]) * total));
      touched.push_back(id[i] / kLanes);
    }
  }
  for (const int64_t b : touched) {  // as row_exps summed a block: its 16 lanes, then across them
    const int n = static_cast<int>(std::min<int64_t>(kLanes, V - b * kLanes));
    sums[b] = static_cast<double>(vsum(vload_n(e + b * kLanes, n)));
  }
  double rest = 0.;
  for (int64_t b = 0; b < blocks; ++b) rest += sums[b];
  if (!(rest > 0)) return -2;  // float error left no residual mass: the caller draws from p
  return invert_cdf(e, sums, V, u, rest);
}

}  // namespace specray
