// The classifier families (ResNet, MobileNetV4, EfficientNetV2): state-dict names, shapes and dtypes of every size
// against LibreYOLO 1.6.0's (tests/data/<family>_state_dict_<size>_nc1000.tsv) and the parameter
// counts, recognition and sizing from weights, model names, the class-count change, and CPU
// parity with the reference on narrow networks (tests/data/{resnet18n,resnet50n,mobilenetv4n,
// efficientnetv2n}_reference.pt, made by tests/python/make_classify_fixture.py): eval logits, the training-mode
// cross-entropy and every parameter's gradient; the eval transform (Pillow's bicubic resize,
// centre crop, ImageNet normalisation) against the reference's; the loss against cross-entropy.
#include <cmath>
#include <map>

#include "data/classify.hpp"
#include "engine/classify.hpp"
#include "families/resnet/model.hpp"
#include "io/checkpoint.hpp"
#include "libreyolo/errors.hpp"
#include "libreyolo/libreyolo.hpp"
#include "loss/classify.hpp"
#include "models/classifier.hpp"
#include "models/input.hpp"
#include "models/loaded_model.hpp"
#include "support.hpp"

namespace models = libreyolo::models;
namespace resnet = libreyolo::models::resnet;
namespace io = libreyolo::io;
using libreyolo::test::check_rel;

namespace {

const models::Family& family(const std::string& name = "resnet") {
  const models::Family* f = models::find_family(name);
  if (!f) throw std::runtime_error(name + " is not registered");
  return *f;
}

// Every size's state dict equals the reference's listing, in order; parameter counts at nc 1000.
void check_listing(const std::string& fam, const std::vector<std::pair<std::string, int64_t>>& sizes) {
  for (const auto& [size, params] : sizes) {
    auto model = family(fam).build(size, 1000);
    const auto want = libreyolo::test::read_state_dict_tsv(fam + "_state_dict_" + size + "_nc1000.tsv");
    const auto got = models::state_dict(*model);
    ASSERT_EQ(got.size(), want.size()) << fam << size;
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(got[i].first, want[i].key) << fam << size << " entry " << i;
      EXPECT_EQ(got[i].second.sizes().vec(), want[i].shape) << want[i].key;
      EXPECT_EQ(got[i].second.scalar_type() == torch::kLong ? "int64" : "float32", want[i].dtype) << want[i].key;
    }
    int64_t n = 0;
    for (const auto& p : model->parameters()) n += p.numel();
    EXPECT_EQ(n, params) << fam << size;
    EXPECT_EQ(model->family_name(), fam);
    EXPECT_EQ(model->size(), size);
    EXPECT_EQ(model->num_classes(), 1000);
    // Recognised, sized and rebuilt from the weights alone.
    const auto sd = libreyolo::test::reference_state_dict_tsv(fam + "_state_dict_" + size + "_nc1000.tsv");
    EXPECT_EQ(models::detect_family(sd), &family(fam)) << fam << size;
    EXPECT_EQ(family(fam).infer_size(sd).value_or("?"), size);
    EXPECT_EQ(family(fam).infer_num_classes(sd).value_or(0), 1000);
    auto like = family(fam).build_like(sd, 7);
    EXPECT_EQ(like->size(), size);
    EXPECT_EQ(like->num_classes(), 7);
    const auto like_sd = models::state_dict(*like);
    ASSERT_EQ(like_sd.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i)
      if (want[i].key.rfind("fc.", 0) != 0 && want[i].key.rfind("classifier.", 0) != 0)
        EXPECT_EQ(like_sd[i].second.sizes().vec(), want[i].shape) << "build_like " << want[i].key;
  }
}

int64_t parameter_count(torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

std::string fixture_path(const std::string& name) {
  return std::string(LIBREYOLO_SOURCE_DIR) + "/tests/data/" + name + "_reference.pt";
}

io::PyValuePtr fixture(const std::string& name) {
  static std::map<std::string, io::PyValuePtr> cache;
  auto& v = cache[name];
  if (!v) v = io::load_torch_file(fixture_path(name));
  return v;
}

torch::Tensor expected(const std::string& name, const std::string& key) {
  auto v = fixture(name)->get("expect")->get(key);
  if (!v || !v->is_tensor()) throw std::runtime_error(name + ": no tensor " + key);
  return v->tensor;
}

std::shared_ptr<models::Detector> network(const std::string& name) {
  return models::model_from_checkpoint(fixture(name), fixture_path(name))->model;
}

// A parameter's gradient against the fixture's. The bound is 1e-4 relative, or three times the
// reference's own float32 error where a training-mode BatchNorm over a few values (2 x 2 maps)
// makes that larger. A gradient that is zero in exact arithmetic (a BatchNorm shift followed by
// a convolution and a training-mode BatchNorm, which removes any per-channel constant) is
// rounding noise (below 1e-14 in the reference's float64 run) and must be float32 rounding here:
// below 1e-6 absolute, against gradients of order 1e-3 to 1, or three times the reference's own
// float32 value where that is larger (its recorded error times the float64 value it was taken
// against).
void check_grad(const std::string& name, const std::string& key, const torch::Tensor& got) {
  const auto want = expected(name, "grad." + key);
  ASSERT_TRUE(got.defined()) << name << " " << key << " has no gradient";
  const double ref_err = expected(name, "ref_f32_err_grad." + key).item<double>();
  const double want_max = want.abs().max().item<double>();
  if (want_max < 1e-12) {
    EXPECT_LT(got.abs().max().item<double>(), std::max(1e-6, 3 * ref_err * want_max))
        << name << " grad " << key << " (zero in exact arithmetic)";
    std::printf("  %-44s |grad| %.3g (zero in exact arithmetic; reference's float32 %.3g)\n",
                (name + " grad " + key).c_str(), got.abs().max().item<double>(), ref_err * want_max);
    return;
  }
  check_rel(name + " grad " + key, got, want, std::max(libreyolo::test::kParityBound, 3 * ref_err));
}

}  // namespace

TEST(ClassifyResnet, StateDictOfEverySizeEqualsTheReference) {
  check_listing("resnet", {{"18", 11689512}, {"34", 21797672}, {"50", 25557032}, {"101", 44549160}});
  // The detectors' weights are not a ResNet's (RT-DETR's ResNet backbones live under backbone.).
  auto rtdetr = libreyolo::test::reference_state_dict_tsv("rtdetr_state_dict_r18_nc80.tsv");
  EXPECT_FALSE(family().can_load(rtdetr));
  EXPECT_FALSE(family("mobilenetv4").can_load(rtdetr));
  EXPECT_FALSE(family("efficientnetv2").can_load(rtdetr));
}

TEST(ClassifyMobilenetv4, StateDictOfEverySizeEqualsTheReference) {
  check_listing("mobilenetv4", {{"s", 3774024}, {"m", 9715512}, {"l", 32590864}});
  const auto& f = family("mobilenetv4");
  EXPECT_EQ(f.task, "classify");
  EXPECT_EQ(f.input_size("s"), 224);
  EXPECT_EQ(f.input_size("l"), 256);
  EXPECT_DOUBLE_EQ(f.crop_pct("s"), 0.875);
  EXPECT_DOUBLE_EQ(f.crop_pct("m"), 0.95);
  auto model = f.build("s", 1000);
  model->reset_num_classes(4);
  model->eval();
  EXPECT_EQ(models::as_classifier(*model)->logits(torch::randn({1, 3, 64, 64})).sizes().vec(),
            (std::vector<int64_t>{1, 4}));
}

TEST(ClassifyEfficientnetv2, StateDictOfEverySizeEqualsTheReference) {
  check_listing("efficientnetv2", {{"b0", 7139704}, {"b1", 8141052}, {"b2", 10096086}, {"b3", 14358406}});
  const auto& f = family("efficientnetv2");
  EXPECT_EQ(f.task, "classify");
  EXPECT_EQ(f.input_size("b0"), 224);
  EXPECT_EQ(f.input_size("b3"), 300);
  EXPECT_DOUBLE_EQ(f.crop_pct("b2"), 0.890);
  // BatchNorm with TensorFlow's epsilon.
  auto model = f.build("b0", 3);
  for (const auto& m : model->modules(false))
    if (auto* bn = m->as<torch::nn::BatchNorm2d>()) EXPECT_DOUBLE_EQ(bn->options.eps(), 1e-3);
  // The feature map at 224 is 7 x 7 (SAME padding of the stride-2 convolutions).
  model->eval();
  torch::NoGradGuard ng;
  EXPECT_EQ(models::as_classifier(*model)->logits(torch::randn({1, 3, 224, 224})).sizes().vec(),
            (std::vector<int64_t>{1, 3}));
}

TEST(ClassifyResnet, FamilyRecipeAndNames) {
  const auto& f = family();
  EXPECT_EQ(f.task, "classify");
  EXPECT_EQ(f.default_size, "50");
  EXPECT_EQ(f.default_num_classes, 1000);
  EXPECT_TRUE(f.default_amp);
  EXPECT_TRUE(f.capture_train_step);
  EXPECT_TRUE(f.capture_inference);
  ASSERT_TRUE(f.make_loss);
  EXPECT_EQ(f.make_loss(*f.build("18", 3))->term_names(), (std::vector<std::string>{"ce"}));
  EXPECT_EQ(f.input_size("101"), 224);
  EXPECT_DOUBLE_EQ(f.crop_pct("18"), 0.95);
  EXPECT_DOUBLE_EQ(f.input.divisor, 255.0);
  EXPECT_DOUBLE_EQ(f.input.mean[0], 0.485);
  EXPECT_DOUBLE_EQ(f.input.stddev[2], 0.225);
  // A fresh model by name, LibreYOLO's weight-file spelling included.
  libreyolo::LibreYOLO m("LibreResNet18-cls", "cpu");
  const auto info = m.info();
  EXPECT_EQ(info.family, "resnet");
  EXPECT_EQ(info.size, "18");
  EXPECT_EQ(info.task, "classify");
  EXPECT_EQ(info.num_classes, 1000);
  EXPECT_EQ(info.imgsz, 224);
  EXPECT_EQ(info.parameters, 11689512);
}

TEST(ClassifyResnet, ResetNumClassesReplacesOnlyTheHead) {
  auto model = family().build("18", 1000);
  const auto before = models::state_dict(*model);
  model->reset_num_classes(3);
  const auto after = models::state_dict(*model);
  ASSERT_EQ(before.size(), after.size());
  for (size_t i = 0; i < before.size(); ++i) {
    if (before[i].first.rfind("fc.", 0) == 0) continue;
    EXPECT_TRUE(before[i].second.equal(after[i].second)) << before[i].first;
  }
  EXPECT_EQ(libreyolo::test::state_dict_entry(after, "fc.weight").sizes().vec(), (std::vector<int64_t>{3, 512}));
  EXPECT_EQ(model->num_classes(), 3);
  auto x = torch::randn({2, 3, 64, 64});
  model->eval();
  EXPECT_EQ(models::as_classifier(*model)->logits(x).sizes().vec(), (std::vector<int64_t>{2, 3}));
}

TEST(ClassifyParity, EvalLogitsEqualTheReference) {
  for (const std::string name : {"resnet18n", "resnet50n", "mobilenetv4n", "efficientnetv2n"}) {
    auto model = network(name);
    model->eval();
    torch::NoGradGuard ng;
    const auto logits = models::as_classifier(*model)->logits(expected(name, "input"));
    const double bound = std::max(libreyolo::test::kParityBound, 3 * expected(name, "ref_f32_err_eval").item<double>());
    check_rel(name + " eval logits", logits, expected(name, "logits_eval"), bound);
    // decode is the softmax.
    check_rel(name + " probabilities", model->decode({logits}), torch::softmax(expected(name, "logits_eval"), 1), bound);
  }
}

// The fixture's loss is the reference's float64 value. Ours in float64 must equal it to float64
// rounding; ours in float32 to 1e-5 relative, or three times its measured float32 error (against
// our float64 run) where this machine's summation order makes that larger.
TEST(ClassifyParity, TrainingLossAndGradientsEqualTheReference) {
  for (const std::string name : {"resnet18n", "resnet50n", "mobilenetv4n", "efficientnetv2n"}) {
    auto model = network(name);
    const double want = expected(name, "loss_train").item<double>();
    double loss64 = 0;
    {
      auto copy = network(name);
      copy->to(torch::kDouble);
      copy->train();
      torch::NoGradGuard ng;
      loss64 = libreyolo::loss::classification_loss(
                   models::as_classifier(*copy)->logits(expected(name, "input").to(torch::kDouble)),
                   expected(name, "labels"))
                   .item<double>();
    }
    EXPECT_NEAR(loss64, want, 1e-9 * std::abs(want)) << name << " float64";
    model->train();
    const auto loss = libreyolo::loss::classification_loss(models::as_classifier(*model)->logits(expected(name, "input")),
                                                           expected(name, "labels"));
    const double own = std::abs(loss.item<double>() - loss64) / std::abs(loss64);
    EXPECT_NEAR(loss.item<double>(), want, std::max(1e-5, 3 * own) * std::abs(want)) << name;
    std::printf("  %s loss rel err %.3g (own float32 error %.3g)\n", name.c_str(), std::abs(loss.item<double>() - want) / std::abs(want), own);
    loss.backward();
    int checked = 0;
    // Every parameter of the fixture's network has its gradient compared.
    const auto counts = std::map<std::string, int>{
        {"resnet18n", 62}, {"resnet50n", 161}, {"mobilenetv4n", 80}, {"efficientnetv2n", 140}};
    for (const auto& p : model->named_parameters()) {
      check_grad(name, p.key(), p.value().grad());
      ++checked;
    }
    EXPECT_EQ(checked, counts.at(name)) << name;
  }
}

TEST(ClassifyParity, EvalTransformEqualsTheReference) {
  const auto img = expected("resnet18n", "pre.image");
  const auto& f = family();
  for (const auto& [s, crop, key] : std::vector<std::tuple<int, double, std::string>>{
           {32, 0.95, "pre.s32_c950"}, {48, 0.875, "pre.s48_c875"}}) {
    const auto crop_hwc = libreyolo::data::classify_eval_transform(img, s, crop).unsqueeze(0);
    const auto x = libreyolo::models::to_network_input(crop_hwc, f.input, torch::kCPU, false)[0];
    const auto want = expected("resnet18n", key);
    ASSERT_EQ(x.sizes(), want.sizes()) << key;
    // Same 8-bit pixels, then (p / 255 - mean) / std in float32: equal to rounding.
    EXPECT_LE((x - want).abs().max().item<double>(), 1e-5) << key;
  }
}

TEST(ClassifyLoss, MatchesCrossEntropyAndWeights) {
  auto logits = torch::randn({6, 4}, torch::kDouble);
  auto labels = torch::tensor({0, 3, 2, 1, 3, 0}, torch::kLong);
  const auto ce = torch::nn::functional::cross_entropy(logits.to(torch::kFloat), labels);
  EXPECT_NEAR(libreyolo::loss::classification_loss(logits, labels).item<double>(), ce.item<double>(), 1e-6);
  // Soft labels: one-hot gives the same value.
  const auto onehot = torch::one_hot(labels, 4).to(torch::kFloat);
  EXPECT_NEAR(libreyolo::loss::classification_loss(logits, onehot).item<double>(), ce.item<double>(), 1e-6);
  // Class weights: each sample's term times its class weight, then a plain mean.
  const auto w = torch::tensor({1.0f, 2.0f, 0.5f, 3.0f});
  const auto per = torch::nn::functional::cross_entropy(
      logits.to(torch::kFloat), labels, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
  EXPECT_NEAR(libreyolo::loss::classification_loss(logits, labels, w).item<double>(),
              (per * w.index_select(0, labels)).mean().item<double>(), 1e-6);
}

// The classify task's loss as the step runner takes it: the logits as the one raw output, the class
// ids as the targets, one term "ce" equal to the total.
TEST(ClassifyLoss, TrainingLossForTheStepRunner) {
  libreyolo::loss::ClassificationLoss loss;
  auto logits = torch::randn({5, 3});
  auto labels = torch::tensor({0, 2, 1, 1, 0}, torch::kLong);
  const auto out = loss.compute({logits}, labels, 32, 32);
  EXPECT_NEAR(out.total.item<double>(), libreyolo::loss::classification_loss(logits, labels).item<double>(), 1e-7);
  ASSERT_EQ(loss.term_names(), std::vector<std::string>{"ce"});
  EXPECT_EQ(out.term("ce").item<double>(), out.total.item<double>());
  EXPECT_THROW(loss.compute({logits}, torch::zeros({5, 1, 5}), 32, 32), std::invalid_argument);
  EXPECT_THROW(loss.compute({logits, logits}, labels, 32, 32), std::invalid_argument);
}
