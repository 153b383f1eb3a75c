// The torch ops of kernels/cpu_native.py: torch.ops.specray_cpu.<name> (SPECRAY_NS).
#include <torch/library.h>

#include "kernels.h"

namespace specray {

bool has_avx512() { return kAvx512; }

}  // namespace specray

#ifndef SPECRAY_NS
#define SPECRAY_NS specray_cpu
#endif
// an indirection, so that SPECRAY_NS expands before TORCH_LIBRARY pastes it (tests build a second
// copy under another namespace)
#define SPECRAY_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)

SPECRAY_LIBRARY(SPECRAY_NS, m) {
  m.def("has_avx512() -> bool", &specray::has_avx512);
  m.def("pack_linear(Tensor weight) -> Tensor", &specray::pack_linear);
  m.def("linear(Tensor x, Tensor packed, int n, Tensor? bias) -> Tensor", &specray::linear);
  m.def("rmsnorm(Tensor x, Tensor weight, float eps) -> Tensor", &specray::rmsnorm);
  m.def("rmsnorm_residual(Tensor(a!) x, Tensor residual, Tensor weight, float eps) -> Tensor",
        &specray::rmsnorm_residual);
  m.def("silu_and_mul(Tensor x) -> Tensor", &specray::silu_and_mul);
  m.def("rope_write_kv(Tensor qkv, Tensor cos, Tensor sin, Tensor slots, Tensor(a!) k_cache, Tensor(b!) v_cache, "
        "int h, int kvh) -> Tensor",
        &specray::rope_write_kv);
  m.def("paged_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor query_start_loc, Tensor kv_lens, "
        "Tensor block_tables, float scale, Tensor? win_lens=None, Tensor? row_start=None, Tensor? mask=None) -> Tensor",
        &specray::paged_attention);
}
