// A Llama-family model's decoder layers and final norm in one op: the same kernels, in the same order,
// as the layer-by-layer forward of actors/model/llama.py on the native backend (so the same bits),
// without a Python call, a module call or a fresh tensor per kernel. Buffers are made once per call
// and reused by every layer.
//
// weights: kWeightsPerLayer tensors per layer, in this order (an empty tensor for an absent bias):
//   input norm [H], qkv packed, qkv bias [(h + 2 kvh) d], o packed, o bias [H],
//   post-attention norm [H], gate_up packed, gate_up bias [2I], down packed, down bias [H]
// (packed: kernels/cpu_native.py pack_linear, fp32 or bf16, or kernels/gguf_blocks.py quantized tiles).
//
// Phase timing (set_phase_timing, phase_times; benchmarks/step_phases.py): when on, the calling thread's
// wall time in each phase of every layer is summed per phase (kernels.h's Phase order). Off, a phase
// costs one relaxed load of a flag; on, two clock reads per phase (~300 per call of 30 layers).
#include "kernels.h"

#include <ATen/ops/empty.h>

#include <array>
#include <atomic>
#include <chrono>

namespace specray {
namespace {

constexpr int64_t kWeightsPerLayer = 10;

std::atomic<bool> g_timing{false};
std::array<std::atomic<int64_t>, kPhases> g_phase_ns{};

// marks the end of each phase: the time since the previous mark goes to that phase
class PhaseClock {
 public:
  PhaseClock() : on_(g_timing.load(std::memory_order_relaxed)) {
    if (on_) last_ = std::chrono::steady_clock::now();
  }
  void mark(Phase phase) {
    if (!on_) return;
    const auto now = std::chrono::steady_clock::now();
    g_phase_ns[phase].fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(now - last_).count(),
                                std::memory_order_relaxed);
    last_ = now;
  }

 private:
  bool on_;
  std::chrono::steady_clock::time_point last_;
};

std::optional<at::Tensor> bias_of(const at::Tensor& t) {
  return t.numel() > 0 ? std::optional<at::Tensor>(t) : std::nullopt;
}

}  // namespace

at::Tensor decoder_layers(const at::Tensor& x, at::TensorList weights, at::TensorList k_caches,
                          at::TensorList v_caches, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& slots,
                          const at::Tensor& query_start_loc, const at::Tensor& kv_lens, const at::Tensor& block_tables,
                          at::TensorList windows, int64_t h, int64_t kvh, double eps, double scale,
                          const at::Tensor& final_norm) {
  check_f32(x, "decoder_layers: x");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "decoder_layers: x must be a contiguous [N, H], got ", x.sizes());
  const int64_t layers = static_cast<int64_t>(k_caches.size());
  TORCH_CHECK(layers > 0 && static_cast<int64_t>(v_caches.size()) == layers &&
                  static_cast<int64_t>(weights.size()) == layers * kWeightsPerLayer,
              "decoder_layers: ", weights.size(), " weights and ", k_caches.size(), " / ", v_caches.size(),
              " caches: need ", kWeightsPerLayer, " weights and one K and one V cache per layer");
  const int64_t N = x.size(0), H = x.size(1), d = k_caches[0].size(-1), qkv_width = (h + 2 * kvh) * d;
  const int64_t I = packed_in_features(weights[8]);  // down's input width
  // buffers every layer reuses; a and b take turns holding the residual stream
  auto buffer = [&](std::initializer_list<int64_t> shape) { return at::empty(shape, x.options()); };
  at::Tensor normed = buffer({N, H}), qkv = buffer({N, qkv_width}), q = buffer({N, h, d}), attn = buffer({N, h, d});
  at::Tensor gate_up = buffer({N, 2 * I}), act = buffer({N, I}), a = buffer({N, H}), b = buffer({N, H});
  const at::Tensor attn_rows = attn.view({N, h * d});  // o_proj's input: the heads side by side
  at::Tensor residual = x;  // layer 0: the embeddings; its input norm has no residual to add
  PhaseClock clock;
  rmsnorm(x, weights[0], eps, normed);
  for (int64_t l = 0; l < layers; ++l) {
    const at::Tensor* w = weights.data() + l * kWeightsPerLayer;
    if (l > 0) {  // b: the previous layer's MLP output; the sum becomes the residual stream
      rmsnorm_residual(b, residual, w[0], eps, normed);
      residual = b;
    }
    clock.mark(kNorms);
    linear(normed, w[1], qkv_width, bias_of(w[2]), qkv);
    clock.mark(kQkv);
    at::Tensor k = k_caches[l], v = v_caches[l];
    rope_write_kv(qkv, cos, sin, slots, k, v, h, kvh, q);
    clock.mark(kRopeKv);
    paged_attention(q, k, v, query_start_loc, kv_lens, block_tables, scale, windows, attn);
    clock.mark(kAttention);
    linear(attn_rows, w[3], H, bias_of(w[4]), a);
    clock.mark(kO);
    rmsnorm_residual(a, residual, w[5], eps, normed);
    residual = a;
    clock.mark(kNorms);
    linear(normed, w[6], 2 * I, bias_of(w[7]), gate_up);
    clock.mark(kGateUp);
    silu_and_mul(gate_up, act);
    clock.mark(kSiluMul);
    linear(act, w[8], H, bias_of(w[9]), b);
    clock.mark(kDown);
  }
  at::Tensor out = rmsnorm_residual(b, residual, final_norm, eps);
  clock.mark(kNorms);
  return out;
}

bool set_phase_timing(bool on) { return g_timing.exchange(on); }

at::Tensor phase_times() {
  at::Tensor out = at::empty({kPhases}, at::kDouble);
  double* p = out.mutable_data_ptr<double>();
  for (int i = 0; i < kPhases; ++i) p[i] = static_cast<double>(g_phase_ns[i].exchange(0)) * 1e-9;
  return out;
}

}  // namespace specray
