#include <cmath>

#include <libreyolo/errors.hpp>

#include "engine/amp.hpp"
#include "engine/ema.hpp"
#include "engine/optimizer.hpp"
#include "engine/schedule.hpp"
#include "models/detector.hpp"
#include "support.hpp"

using namespace libreyolo;

TEST(Schedule, LinearMatchesReferenceExample) {
  // The reference's example: ipe = 100, 300 epochs, warmup 3 epochs.
  engine::LrSchedule s;
  s.lr0 = 0.01;
  s.warmup_iters = 300;
  s.total_iters = 30000;
  EXPECT_NEAR(s.at(0), 1e-4, 1e-12);
  EXPECT_NEAR(s.at(150), 5.05e-3, 1e-12);
  EXPECT_NEAR(s.at(300), 1e-2, 1e-12);
  EXPECT_NEAR(s.at(15000), 5.1e-3, 1e-5);
  EXPECT_NEAR(s.at(30000), 1e-4, 1e-12);
}

TEST(Schedule, CosineEndsAtMinAndWarmupClampsStart) {
  engine::LrSchedule s;
  s.shape = engine::LrShape::Cosine;
  s.lr0 = 1e-5;  // below warmup_lr_start: start is clamped to lr0
  s.warmup_iters = 10;
  s.total_iters = 110;
  EXPECT_NEAR(s.at(0), 1e-5, 1e-15);
  EXPECT_NEAR(s.at(110), 1e-7, 1e-15);
  EXPECT_NEAR(s.at(60), 1e-7 + 0.5 * (1e-5 - 1e-7), 1e-15);
}

// Scheduler names: the generic ones for every model, a family's own only for its models, and an
// unknown one is a usage error naming what is accepted.
TEST(Schedule, NamesSelectShapesAndFamiliesAddTheirOwn) {
  EXPECT_EQ(engine::lr_shape("linear"), engine::LrShape::Linear);
  EXPECT_EQ(engine::lr_shape("cos"), engine::LrShape::Cosine);
  EXPECT_EQ(engine::lr_shape("warmcos"), engine::LrShape::Cosine);
  EXPECT_EQ(engine::lr_shape("cos_flat"), engine::LrShape::CosineFlat);
  const std::vector<std::pair<std::string, std::string>> names = {{"steps_then_flat", "cos_flat"}};
  EXPECT_EQ(engine::lr_shape("steps_then_flat", names), engine::LrShape::CosineFlat);
  EXPECT_THROW(engine::lr_shape("steps_then_flat"), UsageError);
  try {
    engine::lr_shape("cosine", names);
    FAIL() << "an unknown scheduler name was accepted";
  } catch (const UsageError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'cosine'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cos_flat"), std::string::npos) << msg;
    EXPECT_NE(msg.find("steps_then_flat"), std::string::npos) << msg;
  }
  // Every name a registered family declares stands for a generic shape.
  for (const models::Family* f : models::families())
    for (const auto& [name, generic] : f->scheduler_names)
      EXPECT_EQ(engine::lr_shape(name, f->scheduler_names), engine::lr_shape(generic)) << f->name << " " << name;
}

TEST(Schedule, ConstantHoldsLr0AfterItsWarmUp) {
  EXPECT_EQ(engine::lr_shape("constant"), engine::LrShape::Constant);
  engine::LrSchedule s;
  s.shape = engine::LrShape::Constant;
  s.lr0 = 1e-4;
  s.min_lr_ratio = 0.01;
  s.total_iters = 1000;
  for (const long long it : {0LL, 1LL, 500LL, 999LL, 1000LL}) EXPECT_DOUBLE_EQ(s.at(it), 1e-4) << it;
  s.warmup_iters = 10;
  s.warmup_lr_start = 0.0;
  EXPECT_DOUBLE_EQ(s.at(0), 0.0);
  EXPECT_DOUBLE_EQ(s.at(5), 5e-5);
  EXPECT_DOUBLE_EQ(s.at(10), 1e-4);
  EXPECT_DOUBLE_EQ(s.at(900), 1e-4);
}

TEST(Schedule, MomentumWarmsUpLinearly) {
  engine::LrSchedule s;
  s.warmup_iters = 100;
  s.total_iters = 1000;
  s.momentum = 0.937;
  s.warmup_momentum = 0.8;
  EXPECT_NEAR(s.momentum_at(0), 0.8, 1e-12);
  EXPECT_NEAR(s.momentum_at(50), 0.8685, 1e-12);
  EXPECT_NEAR(s.momentum_at(100), 0.937, 1e-12);
  EXPECT_NEAR(s.momentum_at(500), 0.937, 1e-12);
  s.warmup_iters = 0;
  EXPECT_NEAR(s.momentum_at(0), 0.937, 1e-12);
}

namespace {
struct TinyNet : torch::nn::Module {
  TinyNet() {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 3).bias(false)));
    bn = register_module("bn", torch::nn::BatchNorm2d(4));
    head = register_module("head", torch::nn::Conv2d(torch::nn::Conv2dOptions(4, 2, 1)));
  }
  torch::Tensor forward(torch::Tensor x) { return head(torch::silu(bn(conv(x)))); }
  torch::nn::Conv2d conv{nullptr}, head{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
};
}  // namespace

TEST(Optimizer, ParamGroupsFollowTheReferenceRule) {
  TinyNet net;
  auto groups = engine::make_param_groups(net, 5e-4);
  ASSERT_EQ(groups.size(), 3u);
  ASSERT_EQ(groups[0].params.size(), 1u);  // bn.weight
  EXPECT_TRUE(groups[0].params[0].is_same(net.bn->weight));
  EXPECT_EQ(groups[0].weight_decay, 0.0);
  ASSERT_EQ(groups[1].params.size(), 2u);  // conv.weight, head.weight
  EXPECT_TRUE(groups[1].params[0].is_same(net.conv->weight));
  EXPECT_EQ(groups[1].weight_decay, 5e-4);
  ASSERT_EQ(groups[2].params.size(), 2u);  // bn.bias, head.bias
  EXPECT_TRUE(groups[2].params[0].is_same(net.bn->bias));
}

TEST(Optimizer, FamilyRulesGroupParametersByNameWithTheirOwnLearningRate) {
  // TinyNet's names: conv.weight, bn.weight, bn.bias, head.weight, head.bias. "conv" plays a
  // backbone, "bn" its norm; the head's bias goes without decay, the rest by the last rule.
  TinyNet net;
  const std::vector<models::ParamRule> rules = {{{"conv"}, {}, true, true},
                                                {{"bn"}, {}, false, true},
                                                {{"head"}, {"bias"}, false, false},
                                                {{}, {}, true, false}};
  const auto groups = engine::make_param_groups(net, 1e-4, rules, 0.05);
  ASSERT_EQ(groups.size(), 4u);
  EXPECT_EQ(groups[0].params.size(), 1u);  // conv.weight: backbone, decayed
  EXPECT_DOUBLE_EQ(groups[0].lr_ratio, 0.05);
  EXPECT_EQ(groups[0].weight_decay, 1e-4);
  EXPECT_EQ(groups[1].params.size(), 2u);  // bn.weight, bn.bias: backbone, no decay
  EXPECT_DOUBLE_EQ(groups[1].lr_ratio, 0.05);
  EXPECT_EQ(groups[1].weight_decay, 0.0);
  EXPECT_TRUE(groups[2].params[0].is_same(net.head->weight));  // the catch-all rule
  EXPECT_EQ(groups[2].weight_decay, 1e-4);
  EXPECT_TRUE(groups[3].params[0].is_same(net.head->bias));
  EXPECT_EQ(groups[3].weight_decay, 0.0);
  EXPECT_DOUBLE_EQ(groups[3].lr_ratio, 1.0);

  // AdamW's first step moves every parameter by about lr (its own group's) against the sign of
  // its gradient; a group given no decay keeps 0 (not torch's 0.01 default).
  engine::OptimizerOptions o;
  o.name = "adamw";
  o.lr = 1e-2;
  o.weight_decay = 1e-4;
  o.rules = rules;
  o.lr_backbone = 5e-4;
  auto opt = engine::make_optimizer(net, o);
  EXPECT_EQ(opt->groups()[1].weight_decay, 0.0);
  const auto conv0 = net.conv->weight.detach().clone(), head0 = net.head->bias.detach().clone();
  opt->zero_grad();
  net.forward(torch::randn({2, 3, 8, 8})).sum().backward();
  opt->step();
  const double conv_move = (net.conv->weight.detach() - conv0).abs().max().item<double>();
  const double head_move = (net.head->bias.detach() - head0).abs().max().item<double>();
  EXPECT_NEAR(head_move, 1e-2, 1e-4);
  EXPECT_NEAR(conv_move, 5e-4, 1e-5);
  // The state dict says each group's rate; loading it gives back the schedule's lr.
  opt->set_lr(2e-2);
  const auto sd = opt->state_dict();
  EXPECT_DOUBLE_EQ(sd->get("param_groups")->items[0]->get("lr")->as_float("lr"), 2e-2 * 0.05);
  EXPECT_DOUBLE_EQ(sd->get("param_groups")->items[2]->get("lr")->as_float("lr"), 2e-2);
  auto other = engine::make_optimizer(net, o);
  other->load_state_dict(*sd);
  EXPECT_DOUBLE_EQ(other->lr(), 2e-2);
  EXPECT_DOUBLE_EQ(other->group_lr(1).item<double>(), 2e-2 * 0.05);
}

// SGD with Nesterov momentum and decay, against the textbook update written out in double.
// SGD (lr 0.05, weight decay 0.01) with momentum momenta[k] at step k, against the update written
// out in doubles; momentum and warmup_momentum are the optimizer's options.
static void expect_sgd_formula(bool nesterov, double momentum, double warmup_momentum, const std::vector<double>& momenta,
                        uint64_t seed) {
  torch::manual_seed(seed);
  TinyNet net;
  engine::OptimizerOptions o;
  o.lr = 0.05;
  o.momentum = momentum;
  o.warmup_momentum = warmup_momentum;
  o.weight_decay = 0.01;
  o.nesterov = nesterov;
  auto opt = engine::make_optimizer(net, o);
  torch::Tensor w = net.conv->weight.detach().to(torch::kDouble).clone();
  torch::Tensor buf = torch::zeros_like(w);
  for (size_t step = 0; step < momenta.size(); ++step) {
    const double m = momenta[step];
    opt->set_momentum(m);
    auto x = torch::randn({2, 3, 6, 6});
    opt->zero_grad();
    net.forward(x).square().mean().backward();
    auto g = net.conv->weight.grad().to(torch::kDouble) + 0.01 * w;
    buf = m * buf + g;  // the first step stores g (buf starts at zero)
    w = w - 0.05 * (nesterov ? g + m * buf : buf);
    opt->step();
    EXPECT_LT(test::rel_err(net.conv->weight, w), 1e-5) << "nesterov " << nesterov << " step " << step;
  }
  // The state dict reports the momentum of the next update.
  auto sd = opt->state_dict();
  EXPECT_NEAR(sd->get("param_groups")->items[0]->get("momentum")->as_float("momentum"), momenta.back(), 1e-12);
}

TEST(Optimizer, SgdMatchesNesterovFormula) { expect_sgd_formula(true, 0.9, 0.9, {0.9, 0.9, 0.9}, 1); }

// Momentum warm-up: set_momentum() between steps, for both update rules, against the formula
// with the momentum of each step; the steps after warm-up take the plain update.
TEST(Optimizer, SgdFollowsAChangingMomentum) {
  for (const bool nesterov : {true, false}) expect_sgd_formula(nesterov, 0.937, 0.8, {0.8, 0.85, 0.9, 0.937, 0.937}, 2);
}

TEST(Optimizer, FoundInfSkipsAStepWithWarmupMomentum) {
  TinyNet net;
  engine::OptimizerOptions o;
  o.warmup_momentum = 0.8;
  auto opt = engine::make_optimizer(net, o);
  opt->set_momentum(0.85);
  net.forward(torch::randn({1, 3, 5, 5})).sum().backward();
  opt->step();  // buffers now non-zero
  const auto before = net.conv->weight.detach().clone();
  std::vector<torch::Tensor> bufs;
  for (const auto& t : opt->state_tensors()) bufs.push_back(t.clone());
  opt->step(torch::ones({}));
  EXPECT_TRUE(torch::equal(before, net.conv->weight));
  const auto after = opt->state_tensors();
  ASSERT_EQ(after.size(), bufs.size());
  for (size_t i = 0; i < bufs.size(); ++i) EXPECT_TRUE(torch::equal(bufs[i], after[i])) << i;
}

TEST(Optimizer, FoundInfSkipsTheStep) {
  TinyNet net;
  auto opt = engine::make_optimizer(net, {});
  net.forward(torch::randn({1, 3, 5, 5})).sum().backward();
  auto before = net.conv->weight.detach().clone();
  opt->step(torch::ones({}));
  EXPECT_TRUE(torch::equal(before, net.conv->weight));
  opt->step(torch::zeros({}));
  EXPECT_FALSE(torch::equal(before, net.conv->weight));
}

TEST(Optimizer, StateDictRoundTripContinuesIdentically) {
  torch::manual_seed(2);
  for (const char* name : {"sgd", "adamw", "adam"}) {
    TinyNet a, b;
    {
      torch::NoGradGuard ng;
      for (size_t i = 0; i < a.parameters().size(); ++i) b.parameters()[i].copy_(a.parameters()[i]);
    }
    engine::OptimizerOptions o;
    o.name = name;
    auto oa = engine::make_optimizer(a, o);
    auto ob = engine::make_optimizer(b, o);
    auto x = torch::randn({2, 3, 6, 6});
    auto run = [&](TinyNet& n, engine::Optimizer& opt) {
      opt.zero_grad();
      n.forward(x).square().mean().backward();
      opt.step();
    };
    run(a, *oa);
    run(b, *ob);
    auto sd = oa->state_dict();
    ASSERT_TRUE(sd->get("state") && sd->get("param_groups"));
    EXPECT_EQ(sd->get("param_groups")->items.size(), 3u);
    auto ob2 = engine::make_optimizer(b, o);
    ob2->load_state_dict(*sd);
    run(a, *oa);
    run(b, *ob2);
    EXPECT_TRUE(torch::allclose(a.conv->weight, b.conv->weight, 1e-6, 1e-7))
        << name << " max diff " << (a.conv->weight - b.conv->weight).abs().max().item<double>();
  }
}

TEST(Optimizer, UnknownNameIsUsageError) {
  TinyNet net;
  engine::OptimizerOptions o;
  o.name = "lion";
  EXPECT_THROW(engine::make_optimizer(net, o), UsageError);
}

TEST(Ema, DecayRampAndUpdate) {
  auto net = std::make_shared<TinyNet>();
  auto copy = std::make_shared<TinyNet>();
  engine::ModelEMA ema(copy, *net, 0.9999, 2000.0);
  EXPECT_NEAR(ema.decay_at(100), 0.9999 * (1 - std::exp(-0.05)), 1e-12);
  EXPECT_NEAR(ema.decay_at(2000), 0.9999 * (1 - std::exp(-1.0)), 1e-12);
  auto e0 = copy->conv->weight.detach().clone();
  auto m0 = net->conv->weight.detach().clone();
  ema.update(*net);
  double d = ema.decay_at(1);
  EXPECT_TRUE(torch::allclose(copy->conv->weight, d * e0 + (1 - d) * m0, 1e-6, 1e-7));
  // BN running statistics are averaged too; num_batches_tracked (integer) is not touched.
  net->bn->running_mean.fill_(1.0);
  net->bn->num_batches_tracked.fill_(7);
  ema.update(*net);
  d = ema.decay_at(2);
  EXPECT_NEAR(copy->bn->running_mean[0].item<double>(), (1 - d) * 1.0, 1e-6);
  EXPECT_EQ(copy->bn->num_batches_tracked.item<int64_t>(), 0);
  TinyNet other;
  EXPECT_THROW(ema.update(other), RuntimeError);
}

TEST(Amp, PlanOnCpuIsFp32) {
  auto p = engine::plan_amp(true, "bfloat16", torch::Device(torch::kCPU));
  EXPECT_FALSE(p.enabled);
  EXPECT_FALSE(p.scaler);
}

// AdamW against the textbook update in double (decoupled decay, bias correction).
TEST(Optimizer, AdamWMatchesFormula) {
  torch::manual_seed(3);
  TinyNet net;
  engine::OptimizerOptions o;
  o.name = "adamw";
  o.lr = 0.01;
  o.weight_decay = 0.05;
  auto opt = engine::make_optimizer(net, o);
  auto w = net.conv->weight.detach().to(torch::kDouble).clone();
  torch::Tensor m = torch::zeros_like(w), v = torch::zeros_like(w);
  for (int t = 1; t <= 3; ++t) {
    opt->zero_grad();
    net.forward(torch::randn({2, 3, 6, 6})).square().mean().backward();
    auto g = net.conv->weight.grad().to(torch::kDouble);
    w = w * (1 - 0.01 * 0.05);
    m = 0.9 * m + 0.1 * g;
    v = 0.999 * v + 0.001 * g * g;
    auto mh = m / (1 - std::pow(0.9, t));
    auto vh = v / (1 - std::pow(0.999, t));
    w = w - 0.01 * mh / (vh.sqrt() + 1e-8);
    opt->step();
    EXPECT_LT(test::rel_err(net.conv->weight, w), 1e-5) << "step " << t;
  }
}
