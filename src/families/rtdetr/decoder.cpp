#include "families/rtdetr/decoder.hpp"

#include <c10/util/irange.h>

#include <cmath>
#include <string>

#include <libreyolo/errors.hpp>

#include "core/log.hpp"

namespace libreyolo::models::rtdetr {

namespace F = torch::nn::functional;

MSDeformableAttentionImpl::MSDeformableAttentionImpl(int64_t embed_, int64_t heads_, int64_t levels_, int64_t points_)
    : embed(embed_), heads(heads_), levels(levels_), points(points_) {
  TORCH_CHECK(embed % heads == 0, "deformable attention width ", embed, " is not a multiple of ", heads, " heads");
  const int64_t total = heads * levels * points;
  sampling_offsets = register_module("sampling_offsets", torch::nn::Linear(embed, total * 2));
  attention_weights = register_module("attention_weights", torch::nn::Linear(embed, total));
  value_proj = register_module("value_proj", torch::nn::Linear(embed, embed));
  output_proj = register_module("output_proj", torch::nn::Linear(embed, embed));
  reset_parameters();
}

void MSDeformableAttentionImpl::reset_parameters() {
  torch::NoGradGuard no_grad;
  sampling_offsets->weight.zero_();
  const auto theta = torch::arange(heads, torch::kFloat) * (2.0 * M_PI / static_cast<double>(heads));
  auto dir = torch::stack({theta.cos(), theta.sin()}, -1);  // [heads, 2]
  dir = dir / std::get<0>(dir.abs().max(-1, /*keepdim=*/true));
  auto grid = dir.reshape({heads, 1, 1, 2}).repeat({1, levels, points, 1});
  grid = grid * torch::arange(1, points + 1, torch::kFloat).reshape({1, 1, -1, 1});
  sampling_offsets->bias.copy_(grid.flatten());
  attention_weights->weight.zero_();
  attention_weights->bias.zero_();
  torch::nn::init::xavier_uniform_(value_proj->weight);
  value_proj->bias.zero_();
  torch::nn::init::xavier_uniform_(output_proj->weight);
  output_proj->bias.zero_();
}

torch::Tensor deformable_attention_core(const torch::Tensor& value, const LevelShapes& shapes,
                                        const torch::Tensor& locations, const torch::Tensor& weights) {
  const int64_t b = value.size(0), heads = value.size(2), d = value.size(3);
  const int64_t q = locations.size(1), levels = locations.size(3), points = locations.size(4);
  TORCH_CHECK(static_cast<int64_t>(shapes.size()) == levels, "deformable attention: ", shapes.size(),
              " level shapes for ", levels, " levels");
  const auto grids = locations * 2 - 1;
  std::vector<torch::Tensor> sampled;
  sampled.reserve(levels);
  int64_t start = 0;
  for (const auto l : c10::irange(levels)) {
    const int64_t h = shapes[l][0], w = shapes[l][1];
    // [B, h*w, heads, d] -> [B*heads, d, h, w]
    const auto v = value.narrow(1, start, h * w).flatten(2).permute({0, 2, 1}).reshape({b * heads, d, h, w});
    start += h * w;
    // [B, Q, heads, points, 2] -> [B*heads, Q, points, 2]
    const auto g = grids.select(3, l).permute({0, 2, 1, 3, 4}).flatten(0, 1);
    sampled.push_back(F::grid_sample(
        v, g, F::GridSampleFuncOptions().mode(torch::kBilinear).padding_mode(torch::kZeros).align_corners(false)));
  }
  TORCH_CHECK(start == value.size(1), "deformable attention: level shapes cover ", start, " of ", value.size(1),
              " tokens");
  // [B, Q, heads, levels, points] -> [B*heads, 1, Q, levels*points]
  const auto aw = weights.permute({0, 2, 1, 3, 4}).reshape({b * heads, 1, q, levels * points});
  const auto out = (torch::stack(sampled, -2).flatten(-2) * aw).sum(-1).reshape({b, heads * d, q});
  return out.permute({0, 2, 1});
}

torch::Tensor MSDeformableAttentionImpl::forward(const torch::Tensor& query, const torch::Tensor& ref,
                                                 const torch::Tensor& value, const LevelShapes& shapes) {
  const int64_t b = query.size(0), q = query.size(1), t = value.size(1);
  const auto v = value_proj->forward(value).reshape({b, t, heads, embed / heads});
  const auto off = sampling_offsets->forward(query).reshape({b, q, heads, levels, points, 2});
  auto aw = attention_weights->forward(query).reshape({b, q, heads, levels * points});
  aw = torch::softmax(aw, -1).reshape({b, q, heads, levels, points});
  const auto r = ref.reshape({b, q, 1, 1, 1, 4});
  const auto xy = r.narrow(-1, 0, 2), wh = r.narrow(-1, 2, 2);
  const auto loc = xy + off / static_cast<double>(points) * wh * 0.5;
  return output_proj->forward(deformable_attention_core(v, shapes, loc, aw));
}

DecoderLayerImpl::DecoderLayerImpl(int64_t c, int64_t heads, int64_t ffn, int64_t levels, int64_t points) {
  auto ln = [c] { return torch::nn::LayerNorm(torch::nn::LayerNormOptions({c}).eps(1e-5)); };
  self_attn = register_module("self_attn", MultiheadAttention(c, heads));
  norm1 = register_module("norm1", ln());
  cross_attn = register_module("cross_attn", MSDeformableAttention(c, heads, levels, points));
  norm2 = register_module("norm2", ln());
  linear1 = register_module("linear1", torch::nn::Linear(c, ffn));
  linear2 = register_module("linear2", torch::nn::Linear(ffn, c));
  norm3 = register_module("norm3", ln());
}

torch::Tensor DecoderLayerImpl::forward(const torch::Tensor& tgt, const torch::Tensor& ref, const torch::Tensor& memory,
                                        const LevelShapes& shapes, const torch::Tensor& pos,
                                        const torch::Tensor& attn_mask) {
  const auto qk = tgt + pos;
  auto x = norm1->forward(tgt + self_attn->forward(qk, qk, tgt, attn_mask));
  x = norm2->forward(x + cross_attn->forward(x + pos, ref, memory, shapes));
  const auto y = x + linear2->forward(torch::relu(linear1->forward(x)));
  return norm3->forward(y.clamp(-65504.0, 65504.0));
}

std::pair<torch::Tensor, torch::Tensor> make_anchors(const LevelShapes& shapes, const torch::Device& device) {
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat).device(device);
  std::vector<torch::Tensor> per_level;
  for (const auto l : c10::irange(shapes.size())) {
    const int64_t h = shapes[l][0], w = shapes[l][1];
    const auto yx = torch::meshgrid({torch::arange(h, f32), torch::arange(w, f32)}, "ij");
    const auto cx = (yx[1] + 0.5) / static_cast<double>(w), cy = (yx[0] + 0.5) / static_cast<double>(h);
    const auto size = torch::full_like(cx, 0.05 * std::pow(2.0, static_cast<double>(l)));
    per_level.push_back(torch::stack({cx, cy, size, size}, -1).reshape({1, h * w, 4}));
  }
  auto anchors = torch::cat(per_level, 1);
  const auto valid = ((anchors > 0.01) & (anchors < 0.99)).all(-1, /*keepdim=*/true);
  anchors = torch::log(anchors / (1 - anchors));
  anchors = torch::where(valid, anchors, torch::full_like(anchors, std::numeric_limits<float>::infinity()));
  return {anchors, valid};
}

TransformerImpl::TransformerImpl(const Config& cfg_) : cfg(cfg_) {
  const int64_t c = cfg.dec_hidden;
  auto proj = container();
  for (int i = 0; i < Config::kLevels; ++i)
    input_proj.push_back(proj->register_module(std::to_string(i), ConvNorm(cfg.hidden, c, 1, 1, Act::None)));
  register_module("input_proj", proj);

  auto decoder = container(), list = container();
  for (int l = 0; l < cfg.dec_layers; ++l)
    layers.push_back(list->register_module(std::to_string(l),
                                           DecoderLayer(c, cfg.heads, cfg.dec_ffn, Config::kLevels, cfg.points)));
  decoder->register_module("layers", list);
  register_module("decoder", decoder);

  if (cfg.denoising > 0)
    denoising_class_embed = register_module(
        "denoising_class_embed", torch::nn::Embedding(torch::nn::EmbeddingOptions(cfg.nc + 1, c).padding_idx(cfg.nc)));
  query_pos_head = register_module("query_pos_head", Mlp(4, 2 * c, c, 2));
  auto enc_output = container();
  enc_linear = enc_output->register_module("0", torch::nn::Linear(c, c));
  enc_norm = enc_output->register_module("1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c}).eps(1e-5)));
  register_module("enc_output", enc_output);
  enc_score_head = register_module("enc_score_head", torch::nn::Linear(c, cfg.nc));
  enc_bbox_head = register_module("enc_bbox_head", Mlp(c, c, 4, 3));
  score_heads_ = container();
  auto bbox_heads = container();
  for (int l = 0; l < cfg.dec_layers; ++l) {
    dec_score_head.push_back(score_heads_->register_module(std::to_string(l), torch::nn::Linear(c, cfg.nc)));
    dec_bbox_head.push_back(bbox_heads->register_module(std::to_string(l), Mlp(c, c, 4, 3)));
  }
  register_module("dec_score_head", score_heads_);
  register_module("dec_bbox_head", bbox_heads);
  reset_parameters();
}

void TransformerImpl::reset_parameters() {
  torch::NoGradGuard no_grad;
  const double prior = bias_with_prior(0.01);
  auto zero_last = [](Mlp& m) {
    m->layers.back()->weight.zero_();
    m->layers.back()->bias.zero_();
  };
  enc_score_head->bias.fill_(prior);
  zero_last(enc_bbox_head);
  for (auto& h : dec_score_head) h->bias.fill_(prior);
  for (auto& h : dec_bbox_head) zero_last(h);
  torch::nn::init::xavier_uniform_(enc_linear->weight);
  torch::nn::init::xavier_uniform_(query_pos_head->layers[0]->weight);
  torch::nn::init::xavier_uniform_(query_pos_head->layers[1]->weight);
}

void TransformerImpl::reset_num_classes(int nc) {
  if (nc == cfg.nc) return;
  const int64_t c = cfg.dec_hidden;
  const auto device = enc_score_head->weight.device();
  const double prior = bias_with_prior(0.01);
  torch::NoGradGuard no_grad;
  enc_score_head = replace_module("enc_score_head", torch::nn::Linear(c, nc));
  enc_score_head->bias.fill_(prior);
  enc_score_head->to(device);
  for (size_t l = 0; l < dec_score_head.size(); ++l) {
    dec_score_head[l] = score_heads_->replace_module(std::to_string(l), torch::nn::Linear(c, nc));
    dec_score_head[l]->bias.fill_(prior);
    dec_score_head[l]->to(device);
  }
  if (denoising_class_embed) {
    denoising_class_embed = replace_module(
        "denoising_class_embed", torch::nn::Embedding(torch::nn::EmbeddingOptions(nc + 1, c).padding_idx(nc)));
    denoising_class_embed->to(device);
  }
  cfg.nc = nc;
}

std::pair<torch::Tensor, LevelShapes> TransformerImpl::encoder_memory(const std::array<torch::Tensor, 3>& feats) {
  std::vector<torch::Tensor> tokens;
  LevelShapes shapes;
  for (int i = 0; i < Config::kLevels; ++i) {
    const auto p = input_proj[i]->forward(feats[i]);
    shapes.push_back({p.size(2), p.size(3)});
    tokens.push_back(p.flatten(2).permute({0, 2, 1}));
  }
  return {torch::cat(tokens, 1), shapes};
}

QuerySelection TransformerImpl::select_queries(const torch::Tensor& memory, const LevelShapes& shapes) {
  QuerySelection s;
  std::tie(s.anchors, s.valid) = make_anchors(shapes, memory.device());
  const auto anchors = s.anchors.to(memory.scalar_type());
  // Invalid tokens are zeroed for the proposals only; the decoder reads the unmasked memory.
  const auto out_mem = enc_norm->forward(enc_linear->forward(s.valid.to(memory.scalar_type()) * memory));
  s.enc_logits = enc_score_head->forward(out_mem);
  s.enc_delta = enc_bbox_head->forward(out_mem);
  const auto coord_unact = s.enc_delta + anchors;
  if (memory.size(1) < cfg.queries)
    throw UsageError(strfmt("RT-DETR selects %d queries among the encoder's positions, and an input of %lldx%lld has "
                            "only %lld: use imgsz >= 128",
                            cfg.queries, static_cast<long long>(shapes.back()[1] * 32),
                            static_cast<long long>(shapes.back()[0] * 32), static_cast<long long>(memory.size(1))),
                     "", "config_range_error");
  s.topk_ind = std::get<1>(torch::topk(std::get<0>(s.enc_logits.max(-1)), cfg.queries, 1));
  auto take = [&](const torch::Tensor& t) {
    return t.gather(1, s.topk_ind.unsqueeze(-1).expand({-1, -1, t.size(-1)}));
  };
  s.ref_unact = take(coord_unact);
  s.topk_logits = take(s.enc_logits);
  s.target = take(out_mem).detach();
  return s;
}

DecoderOutputs TransformerImpl::decode(const torch::Tensor& target, const torch::Tensor& ref_unact,
                                       const torch::Tensor& memory, const LevelShapes& shapes,
                                       const torch::Tensor& attn_mask) {
  DecoderOutputs out;
  const int last = cfg.last_layer();
  auto output = target;
  auto ref_detach = torch::sigmoid(ref_unact.detach()).to(output.scalar_type());
  torch::Tensor ref = ref_detach;  // undetached previous box (training's second look)
  for (int i = 0; i < cfg.dec_layers; ++i) {
    const auto pos = query_pos_head->forward(ref_detach);
    output = layers[i]->forward(output, ref_detach, memory, shapes, pos, attn_mask);
    const auto delta = dec_bbox_head[i]->forward(output);
    const auto box = torch::sigmoid(delta + inverse_sigmoid(ref_detach));
    if (is_training()) {
      out.logits.push_back(dec_score_head[i]->forward(output));
      out.boxes.push_back(i == 0 ? box : torch::sigmoid(delta + inverse_sigmoid(ref)));
    } else if (i == last) {
      out.logits.push_back(dec_score_head[i]->forward(output));
      out.boxes.push_back(box);
      break;
    }
    ref = box;
    ref_detach = is_training() ? box.detach() : box;
  }
  return out;
}

std::pair<torch::Tensor, torch::Tensor> TransformerImpl::forward(const std::array<torch::Tensor, 3>& feats,
                                                                 QuerySelection* selection) {
  const auto [memory, shapes] = encoder_memory(feats);
  QuerySelection s = select_queries(memory, shapes);
  auto out = decode(s.target, s.ref_unact, memory, shapes);
  if (selection) *selection = std::move(s);
  return {out.logits.back(), out.boxes.back()};
}

}  // namespace libreyolo::models::rtdetr
