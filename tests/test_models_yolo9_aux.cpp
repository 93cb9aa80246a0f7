// YOLOv9's PGI auxiliary branch (training only): its tensors and outputs against the reference's
// (tests/data/yolo9_aux_reference.pt, made by tests/python/make_yolo9_aux_fixture.py), the model's
// training forward, and the loss over both heads.
#include <libreyolo/errors.hpp>

#include <set>

#include "io/pickle.hpp"
#include "families/yolo9/loss.hpp"
#include "models/detector.hpp"
#include "families/yolo9/model.hpp"
#include "support.hpp"

using namespace libreyolo;
namespace yolo9 = libreyolo::models::yolo9;

namespace {

io::PyValuePtr fixture() {
  static io::PyValuePtr root =
      io::load_torch_file(std::string(LIBREYOLO_SOURCE_DIR) + "/tests/data/yolo9_aux_reference.pt");
  return root;
}

torch::Tensor tensor(const std::string& key) {
  auto v = fixture()->get(key);
  if (!v || !v->is_tensor()) throw std::runtime_error("fixture has no tensor " + key);
  return v->tensor;
}

// The branch alone, named as in the model ("aux", "aux_head").
struct Branch : torch::nn::Module {
  Branch(const std::string& size, int nc) {
    const auto& cfg = yolo9::size_config(size);
    aux = register_module("aux", yolo9::AuxNeck(cfg));
    head = register_module("aux_head", yolo9::Head(cfg.head_channels(), nc, yolo9::class_hidden_width(size, nc)));
  }
  std::vector<torch::Tensor> forward(const torch::Tensor& b3, const torch::Tensor& b4, const torch::Tensor& b5) {
    return head->forward(aux->forward(b3, b4, b5));
  }
  yolo9::AuxNeck aux{nullptr};
  yolo9::Head head{nullptr};
};

}  // namespace

TEST(Yolo9Aux, TensorsAreNamedAndShapedAsTheReference) {
  const int nc = static_cast<int>(tensor("nc").item<int64_t>());
  yolo9::Yolo9Model model("t", nc);
  ASSERT_TRUE(model.enable_aux(0.25));
  std::map<std::string, std::vector<int64_t>> ours;
  for (const auto& [k, t] : models::state_dict(model))
    if (k.rfind("aux.", 0) == 0 || k.rfind("aux_head.", 0) == 0) ours[k] = t.sizes().vec();
  std::map<std::string, std::vector<int64_t>> ref;
  for (const auto& [k, v] : fixture()->dict)
    if (k->is_string() && (k->s.rfind("aux.", 0) == 0 || k->s.rfind("aux_head.", 0) == 0))
      ref[k->s] = v->tensor.sizes().vec();
  EXPECT_EQ(ours.size(), ref.size());
  for (const auto& [k, shape] : ref) {
    auto it = ours.find(k);
    ASSERT_NE(it, ours.end()) << "missing " << k;
    EXPECT_EQ(it->second, shape) << k;
  }
}

TEST(Yolo9Aux, OutputsMatchTheReferenceInBothModes) {
  const int nc = static_cast<int>(tensor("nc").item<int64_t>());
  Branch branch("t", nc);
  io::StateDict sd;
  for (const auto& [k, v] : fixture()->dict)
    if (k->is_string() && (k->s.rfind("aux.", 0) == 0 || k->s.rfind("aux_head.", 0) == 0))
      sd.emplace_back(k->s, v->tensor);
  models::load_state_dict(branch, sd, /*strict=*/true);
  torch::NoGradGuard ng;
  branch.eval();
  auto maps = branch.forward(tensor("b3"), tensor("b4"), tensor("b5"));
  ASSERT_EQ(maps.size(), 3u);
  for (int i = 0; i < 3; ++i)
    EXPECT_LT(test::rel_err(maps[i], tensor("eval_" + std::to_string(i))), 1e-4) << "eval level " << i;
  branch.train();
  maps = branch.forward(tensor("b3"), tensor("b4"), tensor("b5"));
  for (int i = 0; i < 3; ++i)
    EXPECT_LT(test::rel_err(maps[i], tensor("train_" + std::to_string(i))), 1e-4) << "train level " << i;
}

TEST(Yolo9Aux, TrainingForwardAddsTheAuxiliaryMapsOnlyInTraining) {
  torch::manual_seed(0);
  yolo9::Yolo9Model model("t", 2);
  const auto x = torch::rand({2, 3, 64, 64});
  model.train();
  EXPECT_EQ(model.forward_train(x, {}).size(), 3u);  // no branch yet
  const size_t plain = models::state_dict(model).size();
  ASSERT_TRUE(model.enable_aux(0.25));
  EXPECT_DOUBLE_EQ(model.aux_weight(), 0.25);
  const auto maps = model.forward_train(x, {});
  ASSERT_EQ(maps.size(), 6u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(maps[i].sizes(), maps[i + 3].sizes()) << i;
  // The main maps are those of forward_raw (same weights, BatchNorm in train mode both times).
  const auto raw = model.forward_raw(x);
  for (int i = 0; i < 3; ++i) EXPECT_LT(test::rel_err(raw[i], maps[i]), 1e-5) << i;
  // Gradients reach the auxiliary branch and, through it, the backbone.
  (maps[3].square().mean() + maps[5].square().mean()).backward();
  bool aux_grad = false;
  for (const auto& p : model.named_parameters())
    if (p.key().rfind("aux.", 0) == 0 && p.value().grad().defined() && p.value().grad().abs().sum().item<double>() > 0)
      aux_grad = true;
  EXPECT_TRUE(aux_grad);
  model.eval();
  EXPECT_EQ(model.forward_train(x, {}).size(), 3u);
  // Weight 0 removes it.
  ASSERT_TRUE(model.enable_aux(0));
  EXPECT_EQ(models::state_dict(model).size(), plain);
  model.train();
  EXPECT_EQ(model.forward_train(x, {}).size(), 3u);
}

TEST(Yolo9Aux, LossIsMainPlusWeightedAux) {
  torch::manual_seed(1);
  yolo9::Yolo9Model model("t", 3);
  ASSERT_TRUE(model.enable_aux(0.25));
  model.train();
  const auto maps = model.forward_train(torch::rand({2, 3, 64, 64}), {});
  ASSERT_EQ(maps.size(), 6u);
  auto targets = torch::full({2, 2, 5}, -1.0);
  targets[0][0] = torch::tensor({1.0, 0.1, 0.2, 0.6, 0.7});
  targets[1][0] = torch::tensor({2.0, 0.3, 0.3, 0.5, 0.9});
  targets[1][1] = torch::tensor({0.0, 0.0, 0.0, 0.4, 0.4});
  loss::Yolo9Loss both(3, {8, 16, 32}, 16, 0.25), one(3);
  const auto all = both.compute(maps, targets, 64, 64);
  const auto main = one.compute({maps[0], maps[1], maps[2]}, targets, 64, 64);
  const auto aux = one.compute({maps[3], maps[4], maps[5]}, targets, 64, 64);
  EXPECT_NEAR(all.total.item<double>(), main.total.item<double>() + 0.25 * aux.total.item<double>(), 1e-5);
  EXPECT_TRUE(torch::allclose(all.terms, main.terms + 0.25 * aux.terms, 1e-5, 1e-6));
  EXPECT_DOUBLE_EQ(all.num_fg.item<double>(), main.num_fg.item<double>());
  // Without a weight the loss takes one head's maps only.
  EXPECT_THROW(one.compute(maps, targets, 64, 64), UsageError);
}
