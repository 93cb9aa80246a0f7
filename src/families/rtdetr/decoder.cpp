#include "families/rtdetr/decoder.hpp"

#include <c10/util/irange.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include <libreyolo/errors.hpp>

#include "core/log.hpp"

namespace libreyolo::models::rtdetr {

namespace F = torch::nn::functional;

MSDeformableAttentionImpl::MSDeformableAttentionImpl(int64_t embed_, int64_t heads_, std::vector<int64_t> points_,
                                                     Sampling sampling_, bool scale_buffer)
    : embed(embed_),
      heads(heads_),
      levels(static_cast<int64_t>(points_.size())),
      total_points(0),
      points(std::move(points_)),
      sampling(sampling_) {
  TORCH_CHECK(embed % heads == 0, "deformable attention width ", embed, " is not a multiple of ", heads, " heads");
  TORCH_CHECK(levels > 0, "deformable attention without levels");
  std::vector<float> scale;
  for (const int64_t n : points) {
    TORCH_CHECK(n > 0, "deformable attention: ", n, " sampling points on a level");
    total_points += n;
    scale.insert(scale.end(), static_cast<size_t>(n), 1.0f / static_cast<float>(n));
  }
  if (!scale_buffer)
    TORCH_CHECK(std::all_of(points.begin(), points.end(), [&](int64_t n) { return n == points[0]; }),
                "deformable attention: per-level point counts need the num_points_scale layout");
  if (scale_buffer) num_points_scale = register_buffer("num_points_scale", torch::tensor(scale, torch::kFloat));
  const int64_t total = heads * total_points;
  sampling_offsets = register_module("sampling_offsets", torch::nn::Linear(embed, total * 2));
  attention_weights = register_module("attention_weights", torch::nn::Linear(embed, total));
  value_proj = register_module("value_proj", torch::nn::Linear(embed, embed));
  output_proj = register_module("output_proj", torch::nn::Linear(embed, embed));
  reset_parameters();
  // Discrete sampling has no gradient with respect to the locations.
  if (sampling == Sampling::Discrete)
    for (auto& p : sampling_offsets->parameters()) p.set_requires_grad(false);
}

void MSDeformableAttentionImpl::reset_parameters() {
  torch::NoGradGuard no_grad;
  sampling_offsets->weight.zero_();
  const auto theta = torch::arange(heads, torch::kFloat) * (2.0 * M_PI / static_cast<double>(heads));
  auto dir = torch::stack({theta.cos(), theta.sin()}, -1);  // [heads, 2]
  dir = dir / std::get<0>(dir.abs().max(-1, /*keepdim=*/true));
  std::vector<torch::Tensor> index;  // 1..n within each level
  for (const int64_t n : points) index.push_back(torch::arange(1, n + 1, torch::kFloat));
  auto grid = dir.reshape({heads, 1, 2}).repeat({1, total_points, 1});
  grid = grid * torch::cat(index).reshape({1, -1, 1});
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
  const std::vector<int64_t> points(static_cast<size_t>(locations.size(3)), locations.size(4));
  return deformable_attention_core(value, shapes, locations.flatten(3, 4), weights.flatten(3, 4), points,
                                   Sampling::Bilinear);
}

torch::Tensor deformable_attention_core(const torch::Tensor& value, const LevelShapes& shapes,
                                        const torch::Tensor& locations, const torch::Tensor& weights,
                                        const std::vector<int64_t>& points, Sampling sampling) {
  const int64_t b = value.size(0), heads = value.size(2), d = value.size(3);
  const int64_t q = locations.size(1), total = locations.size(3);
  TORCH_CHECK(shapes.size() == points.size(), "deformable attention: ", shapes.size(), " level shapes for ",
              points.size(), " levels");
  TORCH_CHECK(std::accumulate(points.begin(), points.end(), int64_t{0}) == total, "deformable attention: ", total,
              " sampling points, the levels have another count");
  const auto grids = sampling == Sampling::Bilinear ? locations * 2 - 1 : locations;
  std::vector<torch::Tensor> sampled;
  sampled.reserve(points.size());
  int64_t start = 0, first = 0;
  for (const auto l : c10::irange(points.size())) {
    const int64_t h = shapes[l][0], w = shapes[l][1], n = points[l];
    // [B, h*w, heads, d] -> [B*heads, d, h, w]
    const auto v = value.narrow(1, start, h * w).flatten(2).permute({0, 2, 1}).reshape({b * heads, d, h, w});
    start += h * w;
    // [B, Q, heads, n, 2] -> [B*heads, Q, n, 2]
    const auto g = grids.narrow(3, first, n).permute({0, 2, 1, 3, 4}).flatten(0, 1);
    first += n;
    if (sampling == Sampling::Bilinear) {
      sampled.push_back(F::grid_sample(
          v, g, F::GridSampleFuncOptions().mode(torch::kBilinear).padding_mode(torch::kZeros).align_corners(false)));
      continue;
    }
    // The cell (int(x * w + 0.5), int(y * h + 0.5)) (truncation), clamped to [0, h - 1] as the
    // reference clamps both coordinates (and x to w - 1, where the reference would index outside).
    const auto scale = torch::tensor({static_cast<double>(w), static_cast<double>(h)}, g.options());
    const auto cell = (g * scale + 0.5).to(torch::kLong).clamp(0, h - 1);
    const auto x = cell.select(-1, 0).clamp_max(w - 1), y = cell.select(-1, 1);
    const auto flat = (y * w + x).reshape({b * heads, 1, q * n}).expand({-1, d, -1});
    sampled.push_back(v.flatten(2).gather(2, flat).reshape({b * heads, d, q, n}));
  }
  TORCH_CHECK(start == value.size(1), "deformable attention: level shapes cover ", start, " of ", value.size(1),
              " tokens");
  // [B, Q, heads, P] -> [B*heads, 1, Q, P]
  const auto aw = weights.permute({0, 2, 1, 3}).reshape({b * heads, 1, q, total});
  const auto out = (torch::cat(sampled, -1) * aw).sum(-1).reshape({b, heads * d, q});
  return out.permute({0, 2, 1});
}

torch::Tensor MSDeformableAttentionImpl::forward(const torch::Tensor& query, const torch::Tensor& ref,
                                                 const torch::Tensor& value, const LevelShapes& shapes) {
  const int64_t b = query.size(0), q = query.size(1), t = value.size(1);
  const auto v = value_proj->forward(value).reshape({b, t, heads, embed / heads});
  const auto off = sampling_offsets->forward(query).reshape({b, q, heads, total_points, 2});
  auto aw = attention_weights->forward(query).reshape({b, q, heads, total_points});
  aw = torch::softmax(aw, -1);
  const auto r = ref.reshape({b, q, 1, 1, 4});
  const auto xy = r.narrow(-1, 0, 2), wh = r.narrow(-1, 2, 2);
  const auto scaled = num_points_scale.defined() ? off * num_points_scale.to(query.scalar_type()).unsqueeze(-1)
                                                 : off / static_cast<double>(points[0]);
  const auto loc = xy + scaled * wh * 0.5;
  return output_proj->forward(deformable_attention_core(v, shapes, loc, aw, points, sampling));
}

DecoderLayerImpl::DecoderLayerImpl(const Config& cfg) : clamp(cfg.v2.ffn_clamp) {
  const int64_t c = cfg.dec_hidden;
  auto ln = [c] { return torch::nn::LayerNorm(torch::nn::LayerNormOptions({c}).eps(1e-5)); };
  self_attn = register_module("self_attn", MultiheadAttention(c, cfg.heads));
  norm1 = register_module("norm1", ln());
  cross_attn = register_module("cross_attn", MSDeformableAttention(c, cfg.heads, cfg.points_per_level(),
                                                                   cfg.v2.sampling, cfg.v2.points_scale_buffer));
  norm2 = register_module("norm2", ln());
  linear1 = register_module("linear1", torch::nn::Linear(c, cfg.dec_ffn));
  linear2 = register_module("linear2", torch::nn::Linear(cfg.dec_ffn, c));
  norm3 = register_module("norm3", ln());
  if (cfg.v2.xavier_ffn_init) {
    torch::NoGradGuard no_grad;
    torch::nn::init::xavier_uniform_(linear1->weight);
    torch::nn::init::xavier_uniform_(linear2->weight);
  }
}

torch::Tensor DecoderLayerImpl::forward(const torch::Tensor& tgt, const torch::Tensor& ref, const torch::Tensor& memory,
                                        const LevelShapes& shapes, const torch::Tensor& pos,
                                        const torch::Tensor& attn_mask) {
  const auto qk = tgt + pos;
  auto x = norm1->forward(tgt + self_attn->forward(qk, qk, tgt, attn_mask));
  x = norm2->forward(x + cross_attn->forward(x + pos, ref, memory, shapes));
  const auto y = x + linear2->forward(torch::relu(linear1->forward(x)));
  return norm3->forward(clamp ? y.clamp(-65504.0, 65504.0) : y);
}

std::pair<torch::Tensor, torch::Tensor> make_anchors(const LevelShapes& shapes, const torch::Device& device,
                                                     double invalid) {
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
  anchors = torch::where(valid, anchors, torch::full_like(anchors, invalid));
  return {anchors, valid};
}

TransformerImpl::TransformerImpl(const Config& cfg_) : cfg(cfg_) {
  const int64_t c = cfg.dec_hidden;
  if (cfg.v2.anchor_size > 0) {
    const int64_t side = cfg.v2.anchor_size;
    if (side % 32 != 0)
      throw UsageError(strfmt("RT-DETR: anchors for an input of %lld, not a multiple of 32", static_cast<long long>(side)));
    LevelShapes shapes;
    for (const int64_t stride : {8, 16, 32}) shapes.push_back({side / stride, side / stride});
    auto [a, v] = make_anchors(shapes, torch::kCPU);
    anchors = register_buffer("anchors", a);
    valid_mask = register_buffer("valid_mask", v);
  }
  auto proj = container();
  for (int i = 0; i < Config::kLevels; ++i)
    input_proj.push_back(proj->register_module(std::to_string(i), ConvNorm(cfg.hidden, c, 1, 1, Act::None)));
  register_module("input_proj", proj);

  auto decoder = container(), list = container();
  for (int l = 0; l < cfg.dec_layers; ++l) layers.push_back(list->register_module(std::to_string(l), DecoderLayer(cfg)));
  decoder->register_module("layers", list);
  register_module("decoder", decoder);

  if (cfg.denoising > 0)
    denoising_class_embed = register_module(
        "denoising_class_embed", torch::nn::Embedding(torch::nn::EmbeddingOptions(cfg.nc + 1, c).padding_idx(cfg.nc)));
  query_pos_head = register_module("query_pos_head", Mlp(4, 2 * c, c, 2));
  auto enc_output = container();
  enc_linear = enc_output->register_module(cfg.v2.named_enc_output ? "proj" : "0", torch::nn::Linear(c, c));
  enc_norm = enc_output->register_module(cfg.v2.named_enc_output ? "norm" : "1",
                                         torch::nn::LayerNorm(torch::nn::LayerNormOptions({c}).eps(1e-5)));
  register_module("enc_output", enc_output);
  enc_score_head = register_module("enc_score_head", torch::nn::Linear(c, enc_classes(cfg.nc)));
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

int64_t TransformerImpl::enc_classes(int nc) const { return cfg.v2.query_select == QuerySelect::Agnostic ? 1 : nc; }

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
  if (cfg.v2.xavier_ffn_init)
    for (auto& p : input_proj) torch::nn::init::xavier_uniform_(p->conv->weight);
}

void TransformerImpl::reset_num_classes(int nc) {
  if (nc == cfg.nc) return;
  const int64_t c = cfg.dec_hidden;
  const auto device = enc_score_head->weight.device();
  const double prior = bias_with_prior(0.01);
  torch::NoGradGuard no_grad;
  enc_score_head = replace_module("enc_score_head", torch::nn::Linear(c, enc_classes(nc)));
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
  // The eval forward at the anchors' input size reads them from the buffers.
  bool buffered = anchors.defined() && !is_training() && shapes.size() == static_cast<size_t>(Config::kLevels);
  for (size_t l = 0; buffered && l < shapes.size(); ++l) {
    const int64_t side = cfg.v2.anchor_size >> (3 + l);
    buffered = shapes[l][0] == side && shapes[l][1] == side;
  }
  if (buffered) {
    s.anchors = anchors.to(memory.device());
    s.valid = valid_mask.to(memory.device());
  } else {
    std::tie(s.anchors, s.valid) = make_anchors(shapes, memory.device());
  }
  const auto anchors_m = s.anchors.to(memory.scalar_type());
  // Invalid tokens are zeroed for the proposals only; the decoder reads the unmasked memory.
  const auto out_mem = enc_norm->forward(enc_linear->forward(s.valid.to(memory.scalar_type()) * memory));
  s.enc_logits = enc_score_head->forward(out_mem);
  s.enc_delta = enc_bbox_head->forward(out_mem);
  const auto coord_unact = s.enc_delta + anchors_m;
  const bool one_to_many = cfg.v2.query_select == QuerySelect::OneToMany;
  const int64_t candidates = memory.size(1) * (one_to_many ? s.enc_logits.size(-1) : 1);
  if (candidates < cfg.queries)
    throw UsageError(strfmt("RT-DETR selects %d queries among the encoder's positions, and an input of %lldx%lld has "
                            "only %lld: use imgsz >= 128",
                            cfg.queries, static_cast<long long>(shapes.back()[1] * 32),
                            static_cast<long long>(shapes.back()[0] * 32), static_cast<long long>(memory.size(1))),
                     "", "config_range_error");
  switch (cfg.v2.query_select) {
    case QuerySelect::BestClass:
      s.topk_ind = std::get<1>(torch::topk(std::get<0>(s.enc_logits.max(-1)), cfg.queries, 1));
      break;
    case QuerySelect::OneToMany:  // a token once per selected (token, class) pair
      s.topk_ind = torch::div(std::get<1>(torch::topk(s.enc_logits.flatten(1), cfg.queries, 1)),
                              s.enc_logits.size(-1), "floor");
      break;
    case QuerySelect::Agnostic:
      s.topk_ind = std::get<1>(torch::topk(s.enc_logits.squeeze(-1), cfg.queries, 1));
      break;
  }
  if (forced_topk_ind.defined()) s.topk_ind = forced_topk_ind.to(s.topk_ind.device());
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
