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
  using at::Tensor;
  using std::optional;
  m.def("has_avx512() -> bool", &specray::has_avx512);
  m.def("pack_linear(Tensor weight) -> Tensor", &specray::pack_linear);
  m.def("linear(Tensor x, Tensor packed, int n, Tensor? bias) -> Tensor",
        [](const Tensor& x, const Tensor& packed, int64_t n, const optional<Tensor>& bias) {
          return specray::linear(x, packed, n, bias);
        });
  m.def("set_product_activations(int bits) -> ()", &specray::set_product_activations);
  m.def("product_activations() -> int", &specray::product_activations);
  m.def("rmsnorm(Tensor x, Tensor weight, float eps) -> Tensor",
        [](const Tensor& x, const Tensor& w, double eps) { return specray::rmsnorm(x, w, eps); });
  m.def("rmsnorm_residual(Tensor(a!) x, Tensor residual, Tensor weight, float eps) -> Tensor",
        [](Tensor& x, const Tensor& r, const Tensor& w, double eps) { return specray::rmsnorm_residual(x, r, w, eps); });
  m.def("silu_and_mul(Tensor x) -> Tensor", [](const Tensor& x) { return specray::silu_and_mul(x); });
  m.def("argmax_rows(Tensor x) -> Tensor", &specray::argmax_rows);
  m.def("rope_write_kv(Tensor qkv, Tensor cos, Tensor sin, Tensor slots, Tensor(a!) k_cache, Tensor(b!) v_cache, "
        "int h, int kvh) -> Tensor",
        [](const Tensor& qkv, const Tensor& cos, const Tensor& sin, const Tensor& slots, Tensor& k, Tensor& v,
           int64_t h, int64_t kvh) { return specray::rope_write_kv(qkv, cos, sin, slots, k, v, h, kvh); });
  m.def("copy_kv_slots(Tensor(a!)[] k_caches, Tensor(b!)[] v_caches, Tensor src, Tensor dst) -> ()",
        &specray::copy_kv_slots);
  m.def("paged_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor query_start_loc, Tensor kv_lens, "
        "Tensor block_tables, float scale, Tensor[] windows) -> Tensor",
        [](const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& qsl, const Tensor& lens,
           const Tensor& tables, double scale, at::TensorList windows) {
          return specray::paged_attention(q, k, v, qsl, lens, tables, scale, windows);
        });
  m.def("set_attention_segment(int keys) -> ()", &specray::set_attention_segment);
  m.def("attention_segment() -> int", &specray::attention_segment);
  m.def("decoder_layers(Tensor x, Tensor[] weights, Tensor[] k_caches, Tensor[] v_caches, Tensor cos, Tensor sin, "
        "Tensor slots, Tensor query_start_loc, Tensor kv_lens, Tensor block_tables, Tensor[] windows, "
        "int h, int kvh, float eps, float scale, Tensor final_norm) -> Tensor",
        &specray::decoder_layers);
  m.def("set_phase_timing(bool on) -> bool", &specray::set_phase_timing);
  m.def("phase_times() -> Tensor", &specray::phase_times);
  m.def("sample_logits(Tensor x, float temperature, float u) -> int", &specray::sample_logits);
  m.def("softmax_at(Tensor x, float temperature, int token) -> float", &specray::softmax_at);
  m.def("sample_residual_logits(Tensor x, float temperature, float u, int token, Tensor ids, Tensor q) -> int",
        &specray::sample_residual_logits);
  m.def("top_logprobs(Tensor x, int k) -> (Tensor, Tensor)", &specray::top_logprobs);
  m.def("head_step(Tensor tokens, Tensor feats, Tensor embed, Tensor fc, Tensor fc_bias, Tensor[] weights, "
        "Tensor k_cache, Tensor v_cache, Tensor cos, Tensor sin, Tensor slots, Tensor query_start_loc, "
        "Tensor kv_lens, Tensor block_tables, Tensor[] windows, int h, int kvh, float eps, float scale, "
        "Tensor out_norm, Tensor lm, Tensor vocab, Tensor score_rows, int top_k) -> (Tensor, Tensor, Tensor, Tensor)",
        &specray::head_step);
}
