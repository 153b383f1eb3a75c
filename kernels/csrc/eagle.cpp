// One drafting step of the EAGLE head (actors/eagle/head.py, actors/proposers/head_kv.py) as one op:
// its entries fc(embed[token] | feature) + bias, its decoder layer and output norm (decoder_layers),
// then, for the rows that will be drafted from, the reduced-vocabulary LM products and their top-k
// log-probabilities. The same kernels in the same order as the head's step op by op (the same bits),
// without the ~40 Python-side ops and calls between them that cost more than the products at batch 1.
#include "kernels.h"

#include <ATen/ops/empty.h>

#include <cstring>

namespace specray {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> head_step(
    const at::Tensor& tokens, const at::Tensor& feats, const at::Tensor& embed, const at::Tensor& fc,
    const at::Tensor& fc_bias, at::TensorList weights, const at::Tensor& k_cache, const at::Tensor& v_cache,
    const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& slots, const at::Tensor& query_start_loc,
    const at::Tensor& kv_lens, const at::Tensor& block_tables, at::TensorList windows, int64_t h, int64_t kvh,
    double eps, double scale, const at::Tensor& out_norm, const at::Tensor& lm, const at::Tensor& vocab,
    const at::Tensor& score_rows, int64_t top_k) {
  check_f32(feats, "head_step: feats");
  check_f32(embed, "head_step: embed");
  TORCH_CHECK(feats.dim() == 2 && feats.is_contiguous(), "head_step: feats must be a contiguous [N, H], got ",
              feats.sizes());
  const int64_t N = feats.size(0), H = feats.size(1), V = embed.size(0);
  TORCH_CHECK(embed.dim() == 2 && embed.size(1) == H && embed.is_contiguous(), "head_step: embed must be a "
              "contiguous [V, ", H, "], got ", embed.sizes());
  check_i64(tokens, "head_step: tokens");
  check_i64(vocab, "head_step: vocab");
  check_i64(score_rows, "head_step: score_rows");
  TORCH_CHECK(tokens.dim() == 1 && tokens.size(0) == N && tokens.is_contiguous(), "head_step: tokens must be [",
              N, "], got ", tokens.sizes());
  TORCH_CHECK(vocab.dim() == 1 && vocab.is_contiguous() && score_rows.dim() == 1 && score_rows.is_contiguous(),
              "head_step: vocab and score_rows must be contiguous 1-d tensors");
  const int64_t* tok = tokens.const_data_ptr<int64_t>();
  const int64_t R = score_rows.size(0), Vd = vocab.size(0);
  const int64_t* rows = score_rows.const_data_ptr<int64_t>();
  TORCH_CHECK(top_k >= 0 && top_k <= Vd, "head_step: top_k=", top_k, " must be in [0, ", Vd, "] (the draft vocabulary)");
  for (int64_t i = 0; i < R; ++i)  // before anything is written
    TORCH_CHECK(rows[i] >= 0 && rows[i] < N, "head_step: score row ", rows[i], " is not one of the step's ", N,
                " rows");
  for (int64_t i = 0; i < N; ++i)
    TORCH_CHECK(tok[i] >= 0 && tok[i] < V, "head_step: token id ", tok[i], " is outside the embedding's ", V,
                " rows");
  // entries: [N, 2H] rows of (the token's embedding | the feature), then fc
  at::Tensor entry = at::empty({N, 2 * H}, feats.options());
  const float* ep = embed.const_data_ptr<float>();
  const float* fp = feats.const_data_ptr<float>();
  float* xp = entry.mutable_data_ptr<float>();
  for (int64_t i = 0; i < N; ++i) {
    std::memcpy(xp + i * 2 * H, ep + tok[i] * H, H * sizeof(float));
    std::memcpy(xp + i * 2 * H + H, fp + i * H, H * sizeof(float));
  }
  const at::Tensor x = linear(entry, fc, H, fc_bias.numel() > 0 ? std::optional<at::Tensor>(fc_bias) : std::nullopt);
  const at::Tensor out = decoder_layers(x, weights, {k_cache}, {v_cache}, cos, sin, slots, query_start_loc, kv_lens,
                                        block_tables, windows, h, kvh, eps, scale, out_norm);
  // the scored rows' features, their logits over the draft vocabulary and its top-k
  at::Tensor picked = at::empty({R, H}, feats.options());
  const float* op = out.const_data_ptr<float>();
  float* pp = picked.mutable_data_ptr<float>();
  for (int64_t i = 0; i < R; ++i) std::memcpy(pp + i * H, op + rows[i] * H, H * sizeof(float));
  const at::Tensor logits = linear(picked, lm, Vd, std::nullopt);
  auto [logprobs, top] = top_logprobs(logits, top_k);
  const int64_t* vp = vocab.const_data_ptr<int64_t>();
  int64_t* tp = top.mutable_data_ptr<int64_t>();
  for (int64_t i = 0; i < top.numel(); ++i) tp[i] = vp[tp[i]];  // draft-vocabulary rows -> the target's ids
  return {picked, logits, top, logprobs};
}

}  // namespace specray
