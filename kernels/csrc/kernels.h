// The CPU kernels of kernels/cpu_native.py, registered as torch ops in the namespace specray_cpu
// (ops.cpp). fp32 only; each kernel's pure-torch reference is named in cpu_native.py.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <optional>
#include <tuple>

#include "vec16.h"

namespace specray {

inline void check_f32(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat, what, " must be a float32 CPU tensor, got ",
              t.scalar_type(), " on ", t.device());
}

// a layer's K and V caches: float32 or bfloat16 CPU tensors of one dtype; returns whether bfloat16
inline bool check_kv_caches(const at::Tensor& k, const at::Tensor& v, const char* what) {
  const bool bf16 = k.scalar_type() == at::kBFloat16;
  TORCH_CHECK(k.device().is_cpu() && v.device().is_cpu() && (k.scalar_type() == at::kFloat || bf16) &&
                  v.scalar_type() == k.scalar_type(),
              what, ": the caches must be float32 or bfloat16 CPU tensors of one dtype, got ", k.scalar_type(), " and ",
              v.scalar_type());
  return bf16;
}

inline void check_i64(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kLong && t.dim() >= 1, what,
              " must be an int64 CPU tensor, got ", t.scalar_type(), " on ", t.device());
}

// Each kernel writes into ``out`` when it is given (defined: checked to have the result's shape and
// contiguous; layers.cpp reuses buffers this way), else into a new tensor; it returns the result.

// out: the result's buffer, given or made
inline at::Tensor result_buffer(const at::Tensor& out, at::IntArrayRef shape, const at::Tensor& like, const char* what) {
  if (!out.defined()) return at::empty(shape, like.options());
  TORCH_CHECK(out.sizes() == shape && out.is_contiguous() && out.scalar_type() == at::kFloat, what,
              ": the output buffer ", out.sizes(), " is not a contiguous float32 ", shape);
  return out;
}

// linear.cpp
at::Tensor pack_linear(const at::Tensor& weight);
// K of a packed weight: [T, K, 16] fp32/bf16, or [T, K / 32, tile bytes] uint8 (quantized tiles)
int64_t packed_in_features(const at::Tensor& packed);
at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, int64_t N, const std::optional<at::Tensor>& bias,
                  const at::Tensor& out = at::Tensor());

// linear_fixed.cpp: products over quantized tiles with fixed-point activations, process-wide: 16 bits
// (the default), 8 bits, or 32 (the fp32 products of linear.cpp)
void set_product_activations(int64_t bits);
int64_t product_activations();
bool linear_fixed_applies(at::ScalarType packed_type);
void linear_fixed(const float* x, int64_t sx, int64_t M, int64_t K, const void* packed, int64_t tile_bytes,
                  int64_t T, float* y, int64_t N, const float* bias);

// fused.cpp
at::Tensor rmsnorm(const at::Tensor& x, const at::Tensor& weight, double eps, const at::Tensor& out = at::Tensor());
at::Tensor rmsnorm_residual(at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight, double eps,
                            const at::Tensor& out = at::Tensor());
at::Tensor silu_and_mul(const at::Tensor& x, const at::Tensor& out = at::Tensor());
// x [N, V] -> int64 [N]: torch.argmax(x, -1) (the first maximum; the first NaN where there is one)
at::Tensor argmax_rows(const at::Tensor& x);
// x [N, V] -> (values [N, k], indices [N, k] int64): torch.log_softmax(x, -1).topk(k), best first; equal
// values in index order
std::tuple<at::Tensor, at::Tensor> top_logprobs(const at::Tensor& x, int64_t k);
// one token drawn from softmax(x / temperature) of a row x [V] fp32 by inverting its CDF at u in [0, 1);
// -1 where the row has a NaN or +inf logit or no mass (the caller's torch path decides then)
int64_t sample_logits(const at::Tensor& x, double temperature, double u);
// softmax(x / temperature)[token] of a row x [V] fp32; -1 where the row has a NaN or +inf logit or no mass
double softmax_at(const at::Tensor& x, double temperature, int64_t token);
// one token drawn from norm(max(0, p - q)), p = softmax(x / temperature) of a row x [V] fp32 and q a
// proposal with mass q [S] fp32 on the tokens ids [S] int64 (S = 0: a delta at token), by inverting the
// residual's CDF at u in [0, 1); -1 as sample_logits, -2 where float error leaves the residual no mass
int64_t sample_residual_logits(const at::Tensor& x, double temperature, double u, int64_t token, const at::Tensor& ids,
                               const at::Tensor& q);
at::Tensor rope_write_kv(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin,
                         const at::Tensor& slots, at::Tensor& k_cache, at::Tensor& v_cache, int64_t h, int64_t kvh,
                         const at::Tensor& out = at::Tensor());
// copy the K/V rows of cache slots src [M] to slots dst [M] in every layer's caches, all sources read
// before any destination is written (actors.model.attention.copy_kv_slots)
void copy_kv_slots(at::TensorList k_caches, at::TensorList v_caches, const at::Tensor& src, const at::Tensor& dst);

// attention.cpp
at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                           const at::Tensor& query_start_loc, const at::Tensor& kv_lens,
                           const at::Tensor& block_tables, double scale, at::TensorList windows,
                           const at::Tensor& out = at::Tensor());
// the visible-list entries per segment of attention's arithmetic, process-wide (0: whole rows)
void set_attention_segment(int64_t keys);
int64_t attention_segment();

// layers.cpp
// the phases of decoder_layers that phase timing tells apart (kNorms: the RMSNorms with their residual
// adds, the final norm's included)
enum Phase : int { kNorms, kQkv, kRopeKv, kAttention, kO, kGateUp, kSiluMul, kDown, kPhases };
at::Tensor decoder_layers(const at::Tensor& x, at::TensorList weights, at::TensorList k_caches,
                          at::TensorList v_caches, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& slots,
                          const at::Tensor& query_start_loc, const at::Tensor& kv_lens, const at::Tensor& block_tables,
                          at::TensorList windows, int64_t h, int64_t kvh, double eps, double scale,
                          const at::Tensor& final_norm);
// phase timing of decoder_layers calls, process-wide: on or off (returns the setting before); the
// seconds per phase summed since the last read, as float64 [kPhases] (and set back to zero)
bool set_phase_timing(bool on);
at::Tensor phase_times();

// eagle.cpp: the EAGLE head's drafting step -> (features of score_rows [R, H], their logits [R, Vd],
// top-k target ids [R, k] int64 (vocab's entries), their log-probabilities [R, k])
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> head_step(
    const at::Tensor& tokens, const at::Tensor& feats, const at::Tensor& embed, const at::Tensor& fc,
    const at::Tensor& fc_bias, at::TensorList weights, const at::Tensor& k_cache, const at::Tensor& v_cache,
    const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& slots, const at::Tensor& query_start_loc,
    const at::Tensor& kv_lens, const at::Tensor& block_tables, at::TensorList windows, int64_t h, int64_t kvh,
    double eps, double scale, const at::Tensor& out_norm, const at::Tensor& lm, const at::Tensor& vocab,
    const at::Tensor& score_rows, int64_t top_k);

}  // namespace specray
