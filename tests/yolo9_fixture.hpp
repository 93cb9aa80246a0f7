// Loads the YOLOv9 parity fixtures (fixtures/README.md) through the library's own checkpoint
// reader and family registry, as a user's checkpoint would be loaded.
#pragma once
#include <torch/torch.h>

#include <memory>
#include <stdexcept>
#include <string>

#include "io/pickle.hpp"
#include "models/detector.hpp"

namespace libreyolo::test {

struct Yolo9Fixture {
  io::PyValuePtr checkpoint;
  io::StateDict weights;  // normalised checkpoint["model"]
  io::PyValuePtr expect;
  std::shared_ptr<models::Detector> model;  // on the CPU, float32, weights loaded (strict)

  torch::Tensor expected(const std::string& key) const {
    auto v = expect->get(key);
    if (!v || !v->is_tensor()) throw std::runtime_error("fixture lacks tensor " + key);
    return v->tensor;
  }
};

inline Yolo9Fixture load_yolo9_fixture(const std::string& dir) {
  Yolo9Fixture f;
  f.checkpoint = io::load_torch_file(dir + "/yolo9t_nc80_s320.pt");
  f.expect = io::load_torch_file(dir + "/yolo9t_nc80_s320_expect.pt");
  auto sd = f.checkpoint->get("model");
  if (!sd) throw std::runtime_error("checkpoint has no 'model'");
  f.weights = io::to_state_dict(*sd);
  const models::Family* family = models::detect_family(f.weights);
  if (!family) throw std::runtime_error("checkpoint not recognised as any family");
  family->normalize_keys(f.weights);
  const int nc = static_cast<int>(f.checkpoint->get("nc")->as_int("nc"));
  f.model = family->build_like(f.weights, nc);
  models::load_state_dict(*f.model, f.weights, /*strict=*/true);
  return f;
}

// The class logits behind sigmoid scores: the scores of an untrained head are ~1e-5, so
// comparing them relatively would measure float32 rounding of exp(), not the model.
inline torch::Tensor score_logits(const torch::Tensor& p) {
  auto d = p.to(torch::kDouble);
  return torch::log(d) - torch::log1p(-d);
}

}  // namespace libreyolo::test
