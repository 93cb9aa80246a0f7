// A short training run against LibreYOLO 1.6.0's, step by step (tests/data/<family>_trajectory_
// reference.pt, made by tests/python/make_trajectory_fixture.py): the same start weights (PicoDet's
// parity network; a fresh YOLOv9-t kept in the fixture), the same batches, the family's recipe
// through the trainer's own step runner (parameter groups, optimizer, schedule, EMA). The loss is
// the fixture's smooth probe (the mean of (x - 0.5)^2 over the training forward's outputs), within
// three times the noise floor the fixture recorded per step (the run again with every update
// perturbed by one rounding, on 1 to 3 threads): an error in the update rule shows in the first
// steps, before that floor grows. Checked at every step: the learning rate and momentum the step
// used, the probe's value; after the last step: each parameter's group (its weight decay), the
// EMA's update count, and that the tensors the reference moved (and only those) moved.
#include <cmath>
#include <cstdio>
#include <map>

#include <libreyolo/libreyolo.hpp>

#include "engine/ema.hpp"
#include "engine/step.hpp"
#include "io/pickle.hpp"
#include "loss/loss.hpp"
#include "models/detector.hpp"
#include "support.hpp"

namespace engine = libreyolo::engine;
namespace io = libreyolo::io;
namespace models = libreyolo::models;

namespace {

// The fixture's probe: sum over every output value of (x - 0.5)^2, over their count.
class ProbeLoss final : public libreyolo::TrainingLoss {
 public:
  libreyolo::LossOutput compute(const std::vector<torch::Tensor>& raw, const torch::Tensor&, int64_t,
                                int64_t) override {
    torch::Tensor sum;
    int64_t n = 0;
    for (const auto& x : raw) {
      const auto s = (x.to(torch::kFloat) - 0.5).pow(2).sum();
      sum = sum.defined() ? sum + s : s;
      n += x.numel();
    }
    libreyolo::LossOutput out;
    out.total = sum / static_cast<double>(n);
    out.terms = out.total.detach().reshape({1});
    out.num_fg = torch::zeros({});
    out.names = &names_;
    return out;
  }
  const std::vector<std::string>& term_names() const override { return names_; }

 private:
  std::vector<std::string> names_{"probe"};
};

struct Fixture {
  io::PyValuePtr root;
  torch::Tensor get(const std::string& key) const {
    auto v = root->get(key);
    if (!v || !v->is_tensor()) throw std::runtime_error("the trajectory fixture has no tensor " + key);
    return v->tensor;
  }
  const std::vector<io::PyValuePtr>& list(const std::string& key) const {
    auto v = root->get(key);
    if (!v || v->kind != io::PyValue::Kind::List) throw std::runtime_error("the trajectory fixture has no list " + key);
    return v->items;
  }
};

// A float-state tensor of `m` by name (parameters and floating-point buffers).
std::map<std::string, torch::Tensor> float_state(const torch::nn::Module& m) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& [k, v] : models::state_dict(m))
    if (v.is_floating_point()) out[k] = v.detach();
  return out;
}

// How far `got` is from `want` in units of the bound max(floor * scale, 3 * spread): at most 1 passes.
double in_bounds(double got, double want, double spread, double scale, double floor_rel) {
  const double bound = std::max(floor_rel * scale, 3.0 * spread);
  return std::abs(got - want) / bound;
}

}  // namespace

class Trajectory : public ::testing::TestWithParam<std::string> {};

TEST_P(Trajectory, TheRecipeTrainsAsTheReferenceStepByStep) {
  const std::string family = GetParam();
  const Fixture fx{io::load_torch_file(std::string(LIBREYOLO_SOURCE_DIR) + "/tests/data/" + family +
                                       "_trajectory_reference.pt")};
  const auto images = fx.get("images");
  const int64_t distinct = images.size(0), batch = images.size(1), imgsz = images.size(2);
  const int64_t steps = fx.get("lr").size(0);
  const models::Family* fam = models::find_family(family);
  ASSERT_NE(fam, nullptr);

  // The start state: another fixture's network, or this fixture's own (float16 values, flat); the
  // network of its widths and class count.
  const auto start_file = fx.root->get("start");
  ASSERT_TRUE(start_file && start_file->is_string());
  io::StateDict start;
  if (!start_file->s.empty()) {
    start = io::to_state_dict(
        *io::load_torch_file(std::string(LIBREYOLO_SOURCE_DIR) + "/tests/data/" + start_file->s)->get("model"));
  } else {
    const auto& names = fx.list("start_names");
    const auto& shapes = fx.list("start_shapes");
    const auto values = fx.get("start_values").to(torch::kFloat);
    ASSERT_EQ(names.size(), shapes.size());
    int64_t at = 0;
    for (size_t i = 0; i < names.size(); ++i) {
      std::vector<int64_t> shape;
      for (const auto& d : shapes[i]->items) shape.push_back(d->as_int());
      const int64_t n = c10::multiply_integers(shape);
      start.emplace_back(names[i]->as_string(), values.narrow(0, at, n).reshape(shape).clone());
      at += n;
    }
    ASSERT_EQ(at, values.numel());
  }
  auto model = fam->build_like(start, 0);
  // The integer buffers (BatchNorm's batch counts) a fresh network's, where the start has none.
  const std::map<std::string, torch::Tensor> given(start.begin(), start.end());
  io::StateDict full = models::state_dict(*model);
  for (auto& [k, v] : full)
    if (auto it = given.find(k); it != given.end()) v = it->second;
  models::load_state_dict(*model, full, /*strict=*/true);
  model->train();
  auto ema_model = fam->build_like(start, 0);
  models::load_state_dict(*ema_model, full, true);
  const auto start_state = float_state(*model);
  std::map<std::string, torch::Tensor> start_copy;
  for (const auto& [k, v] : start_state) start_copy[k] = v.clone();
  EXPECT_EQ(start_copy.size(), fx.list("state_names").size());

  // The family's recipe as a user gets it, for the fixture's run length.
  const int64_t per_epoch = fx.get("per_epoch").item<int64_t>();
  libreyolo::TrainConfig cfg =
      libreyolo::LibreYOLO(fam->name + "-" + fam->default_size, "cpu")
          .check_train({{"data", "builtin"}, {"epochs", std::to_string(fx.get("epochs").item<int64_t>())},
                        {"batch", std::to_string(batch)}, {"imgsz", std::to_string(imgsz)}});
  engine::ModelEMA ema(ema_model, *model, cfg.ema_decay, cfg.ema_tau);
  auto setup = engine::make_step_runner(cfg, model, std::make_unique<ProbeLoss>(), &ema, torch::kCPU,
                                        engine::AmpPlan{}, false, per_epoch, fam);
  ASSERT_EQ(setup.accumulate, 1);
  auto& runner = *setup.runner;

  const auto want_lr = fx.get("lr"), want_momentum = fx.get("momentum");
  const auto want_loss = fx.get("loss"), spread_loss = fx.get("spread_loss");
  const auto no_boxes = torch::full({batch, 1, 5}, -1.0);
  double worst_loss = 0;
  for (int64_t it = 0; it < steps; ++it) {
    EXPECT_NEAR(runner.optimizer().lr(), want_lr[it].item<double>(), 1e-12) << "step " << it;
    EXPECT_NEAR(setup.schedule.momentum_at(runner.global_step()), want_momentum[it].item<double>(), 1e-12)
        << "step " << it;
    const auto out = runner.forward_backward(images[it % distinct], no_boxes);
    const double got = out.total.item<double>();
    const double want = want_loss[it].item<double>();
    // floor: float32 sums of ~1e5 values in another order (1e-6 of the value)
    const double r = in_bounds(got, want, spread_loss[it].item<double>(), std::abs(want), 1e-6);
    worst_loss = std::max(worst_loss, r);
    EXPECT_LE(r, 1.0) << "step " << it << ": probe " << got << " vs the reference's " << want << " (spread "
                      << spread_loss[it].item<double>() << ")";
    runner.optimizer_step();
  }
  EXPECT_EQ(ema.updates(), fx.get("ema_updates").item<int64_t>());

  // Which parameters carry the weight decay: the reference's group 1.
  std::map<const c10::TensorImpl*, double> decay_of;
  for (const auto& g : runner.optimizer().groups())
    for (const auto& p : g.params) decay_of[p.unsafeGetTensorImpl()] = g.weight_decay;
  std::map<std::string, int64_t> want_group;
  const auto& param_names = fx.list("param_names");
  const auto groups = fx.get("group");
  for (size_t i = 0; i < param_names.size(); ++i) want_group[param_names[i]->as_string()] = groups[static_cast<int64_t>(i)].item<int64_t>();
  int groups_checked = 0;
  for (const auto& item : model->named_parameters()) {
    const std::string& k = item.key();
    ASSERT_TRUE(want_group.count(k)) << k << " is not a parameter of the reference's network";
    ASSERT_TRUE(decay_of.count(item.value().unsafeGetTensorImpl())) << k << " is in no optimizer group";
    EXPECT_DOUBLE_EQ(decay_of[item.value().unsafeGetTensorImpl()], want_group[k] == 1 ? cfg.weight_decay : 0.0) << k;
    ++groups_checked;
  }
  EXPECT_EQ(groups_checked, static_cast<int>(param_names.size()));
  EXPECT_GT(groups_checked, 0);

  // Every state tensor the reference moved, ours moved; the ones it left where they were (a
  // BatchNorm bias whose every path ends in another training-mode BatchNorm, which subtracts it
  // again: a zero gradient in exact arithmetic), ours moved by rounding at most.
  int unmoved = 0;
  std::map<std::string, size_t> index;
  const auto& state_names = fx.list("state_names");
  for (size_t i = 0; i < state_names.size(); ++i) index[state_names[i]->as_string()] = i;
  auto check_moved = [&](const std::map<std::string, torch::Tensor>& state, const torch::Tensor& moves,
                         const std::string& which) {
    for (const auto& [k, v] : state) {
      ASSERT_TRUE(index.count(k)) << k << " is not in the reference's state";
      const double want = moves[static_cast<int64_t>(index[k])].item<double>();
      const auto move = v.to(torch::kDouble) - start_copy.at(k).to(torch::kDouble);
      if (want > 0) {
        EXPECT_GT(move.pow(2).sum().item<double>(), 0.0)
            << which << " " << k << " did not move; the reference's moved by " << std::sqrt(want);
      } else {
        ++unmoved;
        const double scale = start_copy.at(k).abs().max().item<double>() + 1.0;
        EXPECT_LE(move.abs().max().item<double>(), 1e-6 * scale) << which << " " << k << " moved; the reference's did not";
      }
    }
  };
  check_moved(float_state(*model), fx.get("final"), "network");
  check_moved(float_state(*ema_model), fx.get("ema"), "EMA");
  std::printf("  %s: %lld steps, worst probe %.2f of its bound; %d state tensors unmoved on both sides\n",
              family.c_str(), static_cast<long long>(steps), worst_loss, unmoved);
}

INSTANTIATE_TEST_SUITE_P(Families, Trajectory, ::testing::Values("picodet", "yolo9"),
                         [](const auto& info) { return info.param; });
