// The CPU kernels of kernels/cpu_native.py, registered as torch ops in the namespace specray_cpu
// (ops.cpp). fp32 only; each kernel's pure-torch reference is named in cpu_native.py.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <optional>

#include "vec16.h"

namespace specray {

inline void check_f32(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat, what, " must be a float32 CPU tensor, got ",
              t.scalar_type(), " on ", t.device());
}

inline void check_i64(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kLong && t.dim() >= 1, what,
              " must be an int64 CPU tensor, got ", t.scalar_type(), " on ", t.device());
}

// linear.cpp
at::Tensor pack_linear(const at::Tensor& weight);
at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, int64_t N, const std::optional<at::Tensor>& bias);

// fused.cpp
at::Tensor rmsnorm(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor rmsnorm_residual(at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight, double eps);
at::Tensor silu_and_mul(const at::Tensor& x);
at::Tensor rope_write_kv(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin,
                         const at::Tensor& slots, at::Tensor& k_cache, at::Tensor& v_cache, int64_t h, int64_t kvh);

// attention.cpp
at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                           const at::Tensor& query_start_loc, const at::Tensor& kv_lens,
                           const at::Tensor& block_tables, double scale, const std::optional<at::Tensor>& win_lens,
                           const std::optional<at::Tensor>& row_start, const std::optional<at::Tensor>& mask);

}  // namespace specray
