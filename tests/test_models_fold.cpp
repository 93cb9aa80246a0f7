// BatchNorm folded into the convolutions for inference (layers/fold.hpp), on the CPU:
// whole YOLOv9-t and YOLOX-n eval forwards folded against unfolded with random BatchNorm state
// (NCHW and channels_last, float32 and bfloat16 autocast), RepConvN merged into one 3x3
// convolution, the folds following every kind of change to their sources, in-place refreshes
// that keep the folded tensors' storage (what a captured graph relies on), the fallback when
// autograd would record, and the parity fixtures with folding on and off. Errors are printed.
#include <ATen/autocast_mode.h>
#include <ATen/record_function.h>

#include <atomic>
#include <cstring>
#include <functional>

#include <libreyolo/libreyolo.hpp>

#include "fold_check.hpp"
#include "io/pickle.hpp"
#include "layers/concat.hpp"
#include "layers/conv.hpp"
#include "models/detector.hpp"
#include "families/rtdetr/dfine.hpp"
#include "families/rtdetr/hgnetv2.hpp"
#include "families/rtdetr/model.hpp"
#include "families/yolo9/blocks.hpp"
#include "support.hpp"
#include "yolo9_fixture.hpp"

using namespace libreyolo;
namespace common = libreyolo::models::common;
using test::FoldSwitch;
using test::randomize_batch_norms;
using test::rel_err;

namespace {

std::shared_ptr<models::Detector> build(const std::string& family, const std::string& size, uint64_t seed) {
  torch::manual_seed(static_cast<int64_t>(seed));
  const models::Family* fam = models::find_family(family);
  if (!fam) throw std::runtime_error("no family " + family);
  auto m = fam->build(size, 80);
  randomize_batch_norms(*m, seed);
  m->eval();
  return m;
}

void to_channels_last(torch::nn::Module& m) {
  torch::NoGradGuard ng;
  for (auto& p : m.parameters())
    if (p.dim() == 4) p.set_data(p.contiguous(torch::MemoryFormat::ChannelsLast));
}

struct Outputs {
  std::vector<torch::Tensor> raw;
  torch::Tensor pred;
};

Outputs run(models::Detector& m, const torch::Tensor& x, bool fold) {
  FoldSwitch s(fold);
  torch::NoGradGuard ng;
  Outputs o;
  for (const auto& r : m.forward_raw(x)) o.raw.push_back(r.to(torch::kFloat));
  o.pred = m.predict_tensor(x).to(torch::kFloat);
  return o;
}

// Worst relative error (max |a-b| / max |b|) over the raw maps, and over the predictions.
std::pair<double, double> errors(const Outputs& a, const Outputs& b) {
  double raw = 0;
  for (size_t i = 0; i < b.raw.size(); ++i) raw = std::max(raw, rel_err(a.raw.at(i), b.raw[i]));
  return {raw, rel_err(a.pred, b.pred)};
}

struct FoldCount {
  int convs = 0, folded = 0, rep = 0, rep_folded = 0, rep_children_folded = 0;
};

FoldCount count_folds(torch::nn::Module& m) {
  FoldCount c;
  for (const auto& sub : m.modules(false)) {
    if (auto* conv = dynamic_cast<common::ConvBnActImpl*>(sub.get())) {
      ++c.convs;
      c.folded += conv->has_fold();
    }
    if (auto* r = dynamic_cast<models::yolo9::RepConvNImpl*>(sub.get())) {
      ++c.rep;
      c.rep_folded += r->has_fold();
      c.rep_children_folded += r->conv1->has_fold() + r->conv2->has_fold();
    }
  }
  return c;
}

void expect_whole_model_fold(const std::string& family, const std::string& size, bool channels_last) {
  auto m = build(family, size, 11);
  if (channels_last) to_channels_last(*m);
  torch::manual_seed(3);
  auto x = torch::rand({2, 3, 128, 128}) * (family == "yolox" ? 255.0 : 1.0);
  if (channels_last) x = x.contiguous(torch::MemoryFormat::ChannelsLast);
  const Outputs ref = run(*m, x, false);
  EXPECT_EQ(count_folds(*m).folded, 0);  // the unfolded run built none
  const Outputs got = run(*m, x, true);
  const auto [raw, pred] = errors(got, ref);
  const FoldCount c = count_folds(*m);
  std::cout << "[ REPORT   ] " << family << "-" << size << (channels_last ? " channels_last" : " NCHW")
            << " fp32 folded vs unfolded: raw maps rel err " << raw << ", predictions " << pred << " (" << c.folded
            << " of " << c.convs << " Conv+BN blocks folded, " << c.rep_folded << " of " << c.rep
            << " RepConvN merged)\n";
  // Every block took the folded path: the RepConvN ones as one merged convolution (their
  // branches build no folds of their own), every other one by itself.
  EXPECT_EQ(c.rep_folded, c.rep);
  EXPECT_EQ(c.rep_children_folded, 0);
  EXPECT_EQ(c.folded, c.convs - 2 * c.rep);
  EXPECT_GT(c.folded, 0);
  // float32: the folded weights are rounded once from float64; the sum order of the convolution
  // differs. Measured ~1e-7..1e-6 of the output scale.
  EXPECT_LE(raw, 1e-5);
  EXPECT_LE(pred, 1e-5);
  // And the same again (the cached folds, not a rebuild).
  const Outputs again = run(*m, x, true);
  for (size_t i = 0; i < got.raw.size(); ++i) EXPECT_TRUE(torch::equal(again.raw[i], got.raw[i]));
}

}  // namespace

TEST(FoldBn, Yolo9tFoldedEqualsUnfolded) { expect_whole_model_fold("yolo9", "t", false); }
TEST(FoldBn, Yolo9tFoldedEqualsUnfoldedChannelsLast) { expect_whole_model_fold("yolo9", "t", true); }
TEST(FoldBn, YoloxNFoldedEqualsUnfolded) { expect_whole_model_fold("yolox", "n", false); }
TEST(FoldBn, YoloxNFoldedEqualsUnfoldedChannelsLast) { expect_whole_model_fold("yolox", "n", true); }

// bfloat16 autocast on the CPU: folded and unfolded both against the float32 forward; folding
// must not make the low-precision result worse than the unfolded one is.
TEST(FoldBn, Yolo9tBf16AutocastNoWorseThanUnfolded) {
  auto m = build("yolo9", "t", 5);
  torch::manual_seed(4);
  const auto x = torch::rand({1, 3, 96, 96});
  const Outputs ref = run(*m, x, false);
  auto bf16 = [&](bool fold) {
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    at::autocast::set_autocast_enabled(at::kCPU, true);
    Outputs o = run(*m, x, fold);
    at::autocast::set_autocast_enabled(at::kCPU, false);
    at::autocast::clear_cache();
    return o;
  };
  const Outputs unfolded = bf16(false), folded = bf16(true);
  const auto eu = errors(unfolded, ref), ef = errors(folded, ref);
  std::cout << "[ REPORT   ] yolo9-t bf16 autocast vs fp32: unfolded raw " << eu.first << " pred " << eu.second
            << "; folded raw " << ef.first << " pred " << ef.second << "\n";
  EXPECT_GT(eu.first, 0.0);  // it really ran in bfloat16
  EXPECT_LE(ef.first, 2.0 * eu.first);
  EXPECT_LE(ef.second, 2.0 * eu.second + 1e-3);
}

// Concatenations assembled in place (layers/concat.hpp, and the neck's, which the backbone's levels
// are written into) against torch::cat: the same bits for YOLOv9-t, folded and unfolded, NCHW and
// channels_last, float32 and bfloat16 autocast (on the CPU each part is copied into its slice, exactly what
// torch::cat does). Also: with autograd recording the blocks keep torch::cat (no slice of a shared tensor in
// the graph).
namespace {

struct InPlaceCase {
  bool channels_last, bf16, fold;
};

void expect_in_place_equals_cat(const std::string& size, int nc, const std::vector<InPlaceCase>& cases) {
  auto m = build("yolo9", size, nc);
  torch::manual_seed(6);
  for (const auto [channels_last, bf16, fold] : cases) {
    auto x = torch::rand({2, 3, 96, 64});
    if (channels_last) {
      to_channels_last(*m);
      x = x.contiguous(torch::MemoryFormat::ChannelsLast);
    }
    auto once = [&](bool in_place) {
      const bool was = common::concat_in_place();
      common::set_concat_in_place(in_place);
      if (bf16) {
        at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
        at::autocast::set_autocast_enabled(at::kCPU, true);
      }
      Outputs o = run(*m, x, fold);
      at::autocast::set_autocast_enabled(at::kCPU, false);
      at::autocast::clear_cache();
      common::set_concat_in_place(was);
      return o;
    };
    const Outputs cat = once(false), in_place = once(true);
    SCOPED_TRACE((channels_last ? "channels_last" : "NCHW") + std::string(bf16 ? " bf16" : " fp32") +
                 (fold ? " folded" : " unfolded"));
    for (size_t i = 0; i < cat.raw.size(); ++i) EXPECT_TRUE(torch::equal(in_place.raw[i], cat.raw[i])) << i;
    EXPECT_TRUE(torch::equal(in_place.pred, cat.pred));
    EXPECT_GT(in_place.pred.abs().sum().item<double>(), 0.0);
  }
}

}  // namespace

TEST(ConcatInPlace, Yolo9tEqualsTorchCatBitForBit) {
  std::vector<InPlaceCase> cases;
  for (bool channels_last : {false, true})
    for (bool bf16 : {false, true})
      for (bool fold : {true, false}) cases.push_back({channels_last, bf16, fold});
  expect_in_place_equals_cat("t", 21, cases);
  auto x = torch::rand({1, 3, 64, 64});
  EXPECT_FALSE(common::ChannelConcat::applies(x));  // autograd records here
  {
    torch::NoGradGuard ng;
    EXPECT_EQ(common::ChannelConcat::applies(x), common::concat_in_place());
  }
  // The switch: off means torch::cat even without autograd.
  const bool was = common::concat_in_place();
  common::set_concat_in_place(false);
  {
    torch::NoGradGuard ng;
    EXPECT_FALSE(common::ChannelConcat::applies(x));
  }
  common::set_concat_in_place(was);
}

// YOLOv9-c downsamples with ADown (both halves written into the result or the neck's
// concatenation) and has RepNCSP bottlenecks: the same bits as torch::cat too.
TEST(ConcatInPlace, Yolo9cEqualsTorchCatBitForBit) {
  expect_in_place_equals_cat("c", 7, {{false, false, true}, {true, true, true}});
}

namespace {

std::atomic<int>& cat_calls() {
  static std::atomic<int> n{0};
  return n;
}

// torch::cat calls (aten::cat through the dispatcher) made on this thread while `body` runs, by
// the library itself: not those inside another ATen op (a CPU grouped convolution without oneDNN,
// taken with one intra-op thread, concatenates its groups' outputs).
int count_cats(const std::function<void()>& body) {
  cat_calls() = 0;
  static thread_local int depth = 0;
  depth = 0;
  const auto handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback(
          [](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
            if (depth == 0 && std::strcmp(fn.name(), "aten::cat") == 0) ++cat_calls();
            ++depth;
            return nullptr;
          },
          [](const at::RecordFunction&, at::ObserverContext*) { --depth; })
          .scopes({at::RecordScope::FUNCTION}));
  body();
  at::removeCallback(handle);
  return cat_calls().load();
}

}  // namespace

// The in-place inference forward concatenates nothing with torch::cat: every concatenation of
// YOLOv9-t and -c (the blocks', the neck's, the head's) is assembled by its producers; with the
// switch off the same forward does call torch::cat (the counter sees them).
TEST(ConcatInPlace, InferenceForwardCallsNoTorchCat) {
  for (const std::string size : {"t", "c"}) {
    auto m = build("yolo9", size, 9);
    const auto x = torch::rand({1, 3, 64, 64});
    torch::NoGradGuard ng;
    const bool was = common::concat_in_place();
    common::set_concat_in_place(true);
    const int in_place = count_cats([&] { m->forward_raw(x); });
    common::set_concat_in_place(false);
    const int copied = count_cats([&] { m->forward_raw(x); });
    common::set_concat_in_place(was);
    EXPECT_EQ(in_place, 0) << "YOLOv9-" << size;
    EXPECT_GT(copied, 10) << "YOLOv9-" << size;
  }
}

// The head's output convolutions run from cached weights when assembled in place: after an
// in-place edit of one (a version bump, as load_state_dict or an optimizer step makes) and a
// train/eval round trip, the in-place forward still equals torch::cat's.
TEST(ConcatInPlace, HeadOutputFoldFollowsWeightEdits) {
  auto m = build("yolo9", "t", 23);
  torch::manual_seed(7);
  const auto x = torch::rand({1, 3, 64, 64});
  const bool was = common::concat_in_place();
  auto once = [&](bool in_place) {
    common::set_concat_in_place(in_place);
    Outputs o = run(*m, x, true);
    common::set_concat_in_place(was);
    return o;
  };
  (void)once(true);  // builds the folds
  {
    torch::NoGradGuard ng;
    int edited = 0;
    for (const auto& item : m->named_parameters())
      if (item.key() == "head.cv3.0.2.weight") item.value().mul_(1.5), ++edited;
    ASSERT_EQ(edited, 1);
  }
  m->train();
  m->eval();
  const Outputs in_place = once(true), cat = once(false);
  for (size_t i = 0; i < cat.raw.size(); ++i) EXPECT_TRUE(torch::equal(in_place.raw[i], cat.raw[i])) << i;
}

// The pieces: a ConvBnAct writing into a channel slice and adding a residual equals the block's
// plain result plus the residual, copied there, and the slice is what it returns.
TEST(ConcatInPlace, ConvOutputWritesSliceAndAddsResidual) {
  torch::manual_seed(8);
  common::ConvBnAct conv(8, 8, 3);
  randomize_batch_norms(*conv, 3);
  conv->eval();
  torch::NoGradGuard ng;
  const auto x = torch::rand({2, 8, 10, 12});
  const auto r = torch::rand({2, 8, 10, 12});
  auto whole = torch::zeros({2, 24, 10, 12});
  const auto slice = whole.narrow(1, 8, 8);
  const auto expect = conv->forward(x) + r;
  const auto got = conv->forward(x, {&slice, &r});
  EXPECT_TRUE(torch::equal(got, expect));
  EXPECT_EQ(got.data_ptr(), slice.data_ptr());
  EXPECT_TRUE(torch::equal(whole.narrow(1, 8, 8), expect));
  EXPECT_EQ(whole.narrow(1, 0, 8).abs().sum().item<double>(), 0.0);  // nothing else written
  EXPECT_EQ(whole.narrow(1, 16, 8).abs().sum().item<double>(), 0.0);
}

TEST(FoldBn, RepConvNIsOneConvolution) {
  torch::manual_seed(1);
  models::yolo9::RepConvN r(8, 16);
  randomize_batch_norms(*r, 2);
  r->eval();
  const auto x = torch::randn({2, 8, 11, 13});
  torch::Tensor ref, got;
  {
    FoldSwitch off(false);
    torch::NoGradGuard ng;
    ref = r->forward(x);
  }
  {
    FoldSwitch on(true);
    torch::NoGradGuard ng;
    got = r->forward(x);
  }
  EXPECT_TRUE(r->has_fold());
  EXPECT_FALSE(r->conv1->has_fold());
  EXPECT_FALSE(r->conv2->has_fold());
  EXPECT_LE(rel_err(got, ref), 1e-6);
}

namespace {

// Folded vs unfolded on one block in fp32: the two are different op sequences, and the CPU
// convolution's rounding depends on its threading (measured up to 1.02e-6 under ctest -j2, about
// 2e-7 alone). A stale fold is off by far more (the changes below move outputs by > 1e-3).
constexpr double kBlockTol = 1e-5;

struct Block {
  common::ConvBnAct c{8, 16, 3, 1};
  torch::Tensor x;
  Block() {
    torch::manual_seed(9);
    randomize_batch_norms(*c, 9);
    c->eval();
    x = torch::randn({2, 8, 12, 12});
  }
  torch::Tensor folded() {
    FoldSwitch on(true);
    torch::NoGradGuard ng;
    return c->forward(x);
  }
  torch::Tensor unfolded() {
    torch::NoGradGuard ng;
    return c->forward_unfolded(x);
  }
  // The folded output equals the unfolded one of the current state, and differs from `before`.
  void expect_follows(const torch::Tensor& before, const char* what) {
    const auto f = folded(), u = unfolded();
    EXPECT_LE(rel_err(f, u), kBlockTol) << what;
    EXPECT_GT((f - before).abs().max().item<double>(), 1e-3) << what << ": the change did not show";
  }
};

}  // namespace

TEST(FoldBn, FoldFollowsInPlaceChanges) {
  Block b;
  auto y = b.folded();
  ASSERT_TRUE(b.c->has_fold());
  ASSERT_LE(rel_err(y, b.unfolded()), kBlockTol);
  {
    torch::NoGradGuard ng;
    b.c->bn->running_var.mul_(3.0);
  }
  b.expect_follows(y, "running_var *= 3");
  y = b.folded();
  {
    torch::NoGradGuard ng;
    b.c->bn->running_mean.add_(0.5);
  }
  b.expect_follows(y, "running_mean += 0.5");
  y = b.folded();
  {
    torch::NoGradGuard ng;
    b.c->bn->weight.mul_(-1.0);
  }
  b.expect_follows(y, "gamma *= -1");
  y = b.folded();
  {
    torch::InferenceMode im;  // in-place on an ordinary tensor inside inference mode
    b.c->bn->bias.add_(1.0);
  }
  b.expect_follows(y, "beta += 1 under InferenceMode");
  y = b.folded();
  {
    torch::NoGradGuard ng;
    b.c->conv->weight.mul_(0.5);
  }
  b.expect_follows(y, "conv weight *= 0.5");
}

TEST(FoldBn, FoldFollowsLoadsReplacementsAndDtype) {
  Block b;
  auto y = b.folded();
  // load_state_dict: another block's weights (copied in place).
  {
    common::ConvBnAct other(8, 16, 3, 1);
    randomize_batch_norms(*other, 77);
    models::load_state_dict(*b.c, models::state_dict(*other), /*strict=*/true);
  }
  b.expect_follows(y, "load_state_dict");
  y = b.folded();
  // set_data: a new tensor behind the same parameter (what moving device or format does).
  {
    torch::NoGradGuard ng;
    b.c->conv->weight.set_data(b.c->conv->weight.detach().clone() * 2.0);
  }
  b.expect_follows(y, "set_data");
  // Another dtype: the folds are rebuilt in float64.
  b.c->to(torch::kDouble);
  b.x = b.x.to(torch::kDouble);
  const auto f = b.folded(), u = b.unfolded();
  EXPECT_EQ(f.scalar_type(), torch::kDouble);
  EXPECT_LE(rel_err(f, u), 1e-12);
}

TEST(FoldBn, FoldFollowsTrainingAndModeSwitches) {
  Block b;
  auto y = b.folded();
  b.c->train();
  {
    // A training forward moves the running statistics (the fused node or the composed ops).
    auto x = (b.x * 2.0 + 1.0).requires_grad_(true);
    b.c->forward(x).sum().backward();
  }
  b.c->eval();
  b.expect_follows(y, "train forward, then eval");
  // train() and back with no change in between: still equal.
  b.c->train();
  b.c->eval();
  EXPECT_LE(rel_err(b.folded(), b.unfolded()), kBlockTol);
  // eval() on an eval block (every predict() does it) keeps the fold; a real switch recomputes it.
  const uint64_t before = common::fold_computations();
  b.c->eval();
  b.folded();
  EXPECT_EQ(common::fold_computations(), before);
  b.c->train();
  b.c->eval();
  b.folded();
  EXPECT_GT(common::fold_computations(), before);
}

// Writes that no version counter sees (a replayed CUDA graph of a training update) need
// note_weights_changed(); the training step runner calls it once per update.
TEST(FoldBn, WritesBehindVersionCountersNeedNoteWeightsChanged) {
  Block b;
  const auto y = b.folded();
  {
    auto& mean = b.c->bn->running_mean;
    std::vector<float> v(static_cast<size_t>(mean.numel()), 1.5f);
    std::memcpy(mean.data_ptr<float>(), v.data(), v.size() * sizeof(float));
  }
  // Not seen yet: the fold is still the old one (this is why the note exists).
  EXPECT_TRUE(torch::equal(b.folded(), y));
  common::note_weights_changed();
  b.expect_follows(y, "raw write + note_weights_changed");
}

// A refresh writes into the existing tensors, so a captured forward reads the new values; a
// change of shape reallocates and says so.
TEST(FoldBn, RefreshKeepsStorageOrReportsReallocation) {
  Block b;
  common::FoldedConv fc;
  const std::vector<common::FoldSource> src{b.c->fold_source()};
  const auto& w = fc.get(src, torch::kFloat, at::MemoryFormat::ChannelsLast);
  EXPECT_TRUE(w.weight.is_contiguous(at::MemoryFormat::ChannelsLast));
  const void* wp = w.weight.data_ptr();
  const void* bp = w.bias32.data_ptr();
  const auto w_before = w.weight.clone();
  {
    torch::NoGradGuard ng;
    b.c->bn->running_var.mul_(4.0);
  }
  EXPECT_TRUE(fc.refresh(src));
  EXPECT_EQ(w.weight.data_ptr(), wp);
  EXPECT_EQ(w.bias32.data_ptr(), bp);
  // The new fold, computed here from the definition.
  {
    torch::NoGradGuard ng;
    const auto& bn = *b.c->bn;
    const auto s = bn.weight / (bn.running_var + bn.options.eps()).sqrt();
    EXPECT_LE(rel_err(w.weight, b.c->conv->weight * s.view({-1, 1, 1, 1})), 1e-6);
    EXPECT_LE(rel_err(w.bias32, bn.bias - bn.running_mean * s), 1e-6);
    EXPECT_GT((w.weight - w_before).abs().max().item<double>(), 1e-3);
  }
  EXPECT_TRUE(fc.refresh(src));  // nothing changed: nothing to do
  {
    torch::NoGradGuard ng;
    b.c->conv->weight.set_data(torch::randn({16, 8, 1, 1}));
  }
  EXPECT_FALSE(fc.refresh(src));
  EXPECT_TRUE(fc.empty());
  // The whole-network form: a reallocation anywhere is reported.
  common::FoldedLayers layers;
  (void)b.folded();
  EXPECT_TRUE(layers.refresh(*b.c));
  {
    torch::NoGradGuard ng;
    b.c->conv->weight.set_data(torch::randn({16, 8, 3, 3}));
  }
  EXPECT_FALSE(layers.refresh(*b.c));
}

// With autograd recording (grad mode on and something requiring grad) the unfolded ops run, so
// gradients reach the BatchNorm parameters.
TEST(FoldBn, AutogradFallsBackToUnfolded) {
  Block b;
  FoldSwitch on(true);
  auto y = b.c->forward(b.x);
  EXPECT_TRUE(y.requires_grad());
  EXPECT_FALSE(b.c->has_fold());
  y.sum().backward();
  EXPECT_TRUE(b.c->bn->weight.grad().defined());
  // Nothing requiring grad: folds even with grad mode on.
  for (auto& p : b.c->parameters()) p.requires_grad_(false);
  (void)b.c->forward(b.x);
  EXPECT_TRUE(b.c->has_fold());
}

TEST(FoldBn, SwitchOffRunsUnfolded) {
  Block b;
  FoldSwitch off(false);
  torch::NoGradGuard ng;
  (void)b.c->forward(b.x);
  EXPECT_FALSE(b.c->has_fold());
}

// The reference fixtures with folding on and off (the parity tests themselves run folded, the default).
TEST(FoldBn, Yolo9ParityFixtureFoldedAndUnfolded) {
  LY_REQUIRE_FIXTURES(dir);
  auto f = test::load_yolo9_fixture(dir);
  f.model->eval();
  const auto want = f.expected("eval_predictions");
  double e[2];
  for (int fold = 0; fold < 2; ++fold) {
    const Outputs o = run(*f.model, f.expected("input"), fold == 1);
    e[fold] = std::max(rel_err(o.pred.narrow(1, 0, 4), want.narrow(1, 0, 4)),
                       rel_err(test::score_logits(o.pred.narrow(1, 4, 80)), test::score_logits(want.narrow(1, 4, 80))));
  }
  std::cout << "[ REPORT   ] yolo9-t parity fixture, worst rel err (boxes, score logits): unfolded " << e[0]
            << ", folded " << e[1] << "\n";
  EXPECT_LE(e[0], 1e-4);
  EXPECT_LE(e[1], 1e-4);
}

namespace {

// The float64 forward of the same model: what both float32 forwards approximate.
Outputs run_float64(models::Detector& m, const torch::Tensor& x) {
  m.to(torch::kDouble);
  Outputs o = run(m, x.to(torch::kDouble), false);
  m.to(torch::kFloat);
  return o;
}

}  // namespace

// YOLOX-n parity fixture: a fresh (untrained) model on 0-255 inputs whose eval forward amplifies
// float32 rounding; the unfolded forward reproduces the Python reference's float32 operations
// bit for bit, the folded one rounds differently. Both against the float64 forward: folding
// must not be less accurate than the unfolded forward.
TEST(FoldBn, YoloxParityFixtureAgainstFloat64) {
  LY_REQUIRE_FIXTURES(dir);
  auto ck = io::load_torch_file(dir + "/yoloxn_nc80_s320.pt");
  auto expect = io::load_torch_file(dir + "/yoloxn_nc80_s320_expect.pt");
  auto weights = io::to_state_dict(*ck->get("model"));
  const models::Family* fam = models::detect_family(weights);
  ASSERT_NE(fam, nullptr);
  fam->normalize_keys(weights);
  auto m = fam->build_like(weights, static_cast<int>(ck->get("nc")->as_int("nc")));
  models::load_state_dict(*m, weights, /*strict=*/true);
  m->eval();
  const auto x = expect->get("input")->tensor;
  const Outputs unfolded = run(*m, x, false), folded = run(*m, x, true);
  const Outputs truth = run_float64(*m, x);
  const auto eu = errors(unfolded, truth), ef = errors(folded, truth), d = errors(folded, unfolded);
  std::cout << "[ REPORT   ] yolox-n parity fixture vs float64: unfolded raw " << eu.first << " pred " << eu.second
            << "; folded raw " << ef.first << " pred " << ef.second << "; folded vs unfolded raw " << d.first
            << " pred " << d.second << "\n";
  EXPECT_LE(ef.first, 2.0 * eu.first + 1e-6);
  EXPECT_LE(ef.second, 2.0 * eu.second + 1e-6);
}

// The RT-DETR line's convolution + norm blocks folded for inference (rtdetr/blocks.hpp NormFold):
// RT-DETR r18 (frozen norms in its PResNet backbone, BatchNorm2d in its encoder) and D-FINE-n
// (HGNetv2, the LAB affine after its ReLUs) with random norm state, folded against unfolded. The
// backbone's and encoder's maps are compared (the decoder's top-k query selection turns a
// rounding step into another query on a near tie), every block folded, the folds refreshed after
// a change to a frozen norm's buffers.
namespace {
void randomize_frozen_norms(torch::nn::Module& m, uint64_t seed) {
  torch::NoGradGuard ng;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (const auto& sub : m.modules(/*include_self=*/false))
    if (auto* bn = dynamic_cast<models::rtdetr::FrozenBatchNorm2dImpl*>(sub.get())) {
      const int64_t c = bn->running_mean.size(0);
      bn->running_mean.copy_(at::normal(0.0, 0.5, {c}, gen));
      bn->running_var.copy_(at::rand({c}, gen) * 2.0 + 0.25);
      bn->weight.copy_(at::rand({c}, gen) + 0.5);
      bn->bias.copy_(at::normal(0.0, 0.3, {c}, gen));
    }
}

std::pair<int, int> rtdetr_folds(torch::nn::Module& m) {
  int blocks = 0, folded = 0;
  for (const auto& sub : m.modules(false)) {
    if (auto* c = dynamic_cast<models::rtdetr::ConvNormImpl*>(sub.get())) {
      ++blocks;
      folded += c->has_fold();
    }
    if (auto* c = dynamic_cast<models::rtdetr::HgConvImpl*>(sub.get())) {
      ++blocks;
      folded += c->has_fold();
    }
  }
  return {blocks, folded};
}

template <class Model>
void expect_rtdetr_line_fold(const std::string& family, const std::string& size) {
  auto m = build(family, size, 5);
  randomize_frozen_norms(*m, 6);
  auto* model = dynamic_cast<Model*>(m.get());
  ASSERT_NE(model, nullptr) << family;
  torch::manual_seed(4);
  const auto x = torch::rand({1, 3, 256, 256});
  torch::NoGradGuard ng;
  const auto maps = [&](bool fold) {
    FoldSwitch s(fold);
    const auto t = model->forward_trace(x);
    std::vector<torch::Tensor> out(t.backbone.begin(), t.backbone.end());
    out.insert(out.end(), t.encoder.begin(), t.encoder.end());
    return out;
  };
  const auto ref = maps(false);
  EXPECT_EQ(rtdetr_folds(*m).second, 0);
  const auto got = maps(true);
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, rel_err(got[i], ref[i]));
  const auto [blocks, folded] = rtdetr_folds(*m);
  std::cout << "[ REPORT   ] " << family << "-" << size << " fp32 folded vs unfolded: backbone and encoder maps rel err "
            << worst << " (" << folded << " of " << blocks << " conv+norm blocks folded)\n";
  EXPECT_GT(blocks, 0);
  EXPECT_EQ(folded, blocks);
  EXPECT_LE(worst, 1e-5);
  // A frozen norm's buffer edited in place: the next folded forward follows it.
  randomize_frozen_norms(*m, 7);
  randomize_batch_norms(*m, 8);
  const auto ref2 = maps(false);
  const auto got2 = maps(true);
  for (size_t i = 0; i < ref2.size(); ++i) EXPECT_LE(rel_err(got2[i], ref2[i]), 1e-5) << i;
}
}  // namespace

TEST(FoldBn, RtdetrR18FoldedEqualsUnfolded) { expect_rtdetr_line_fold<models::rtdetr::RtdetrModel>("rtdetr", "r18"); }
TEST(FoldBn, DfineNFoldedEqualsUnfolded) { expect_rtdetr_line_fold<models::rtdetr::DfineModel>("dfine", "n"); }

// In training, a frozen block (frozen norm, nothing recorded for autograd: a frozen backbone
// stage) runs folded, equal to its unfolded forward; once its convolution trains, or with a
// BatchNorm2d (batch statistics, running statistics written), it runs unfolded.
TEST(FoldBn, RtdetrFrozenBlocksFoldInTrainingOthersDoNot) {
  namespace rt = models::rtdetr;
  torch::manual_seed(3);
  rt::ConvNorm frozen(4, 8, 3, 2, rt::Act::ReLU, /*frozen=*/true);
  randomize_frozen_norms(*frozen, 9);
  frozen->conv->weight.requires_grad_(false);
  frozen->train();
  const auto x = torch::rand({2, 4, 16, 16});
  torch::Tensor ref;
  {
    FoldSwitch off(false);
    ref = frozen->forward(x);
  }
  EXPECT_FALSE(frozen->has_fold());
  const auto got = frozen->forward(x);
  EXPECT_TRUE(frozen->has_fold());
  EXPECT_LE(rel_err(got, ref), 1e-5);
  EXPECT_FALSE(got.requires_grad());

  // Its convolution trains: unfolded (the gradient reaches the weight).
  rt::ConvNorm trains(4, 8, 3, 2, rt::Act::ReLU, /*frozen=*/true);
  trains->train();
  const auto y = trains->forward(x);
  EXPECT_FALSE(trains->has_fold());
  ASSERT_TRUE(y.requires_grad());
  y.sum().backward();
  EXPECT_TRUE(trains->conv->weight.grad().defined());

  // A BatchNorm2d in training uses its batch statistics and writes its running ones.
  rt::ConvNorm bn(4, 8, 3, 2, rt::Act::ReLU, /*frozen=*/false);
  bn->train();
  torch::NoGradGuard ng;
  const auto before = bn->norm->running_mean.clone();
  bn->forward(x);
  EXPECT_FALSE(bn->has_fold());
  EXPECT_FALSE(torch::equal(before, bn->norm->running_mean));
}

// Every predict() puts the model in eval mode; for a model already in eval mode that must not
// retire its folds (a float64 refold of every layer per call: it doubled RT-DETR r18's graphed
// predict on an H100). Every family: after the first predict, further ones compute no fold.
TEST(FoldBn, RepeatedPredictsRefoldNothingInAnyFamily) {
  for (const models::Family* f : models::families()) {
    SCOPED_TRACE(f->name);
    torch::manual_seed(0);
    LibreYOLO m = LibreYOLO::create(f->name, f->sizes.front(), 3, "cpu");
    const Kwargs kw = {{"imgsz", "256"}};
    m.predict("SAMPLE_IMAGE", kw);
    const uint64_t before = common::fold_computations();
    m.predict("SAMPLE_IMAGE", kw);
    m.predict("SAMPLE_IMAGE", kw);
    EXPECT_EQ(common::fold_computations(), before);
  }
}
