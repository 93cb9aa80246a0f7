// PicoDet's loss against LibreYOLO 1.6.0's on synthetic head maps (tests/data/picodet_loss_reference.pt,
// made by tests/python/make_picodet_loss_fixture.py): the SimOTA assignment (positive, matched row
// and class of every prior), the three terms and the total, and the gradients at the maps; the
// batch holds a 6 x 6 box, an image without boxes and an image of the maximum count, 20 boxes,
// many overlapping.
#include <cstdio>

#include "families/picodet/loss.hpp"
#include "io/pickle.hpp"
#include "libreyolo/errors.hpp"
#include "support.hpp"

namespace io = libreyolo::io;
using libreyolo::models::picodet::PicodetLoss;
using libreyolo::test::rel_err;

namespace {

constexpr int kClasses = 4;

io::PyValuePtr fixture() {
  static io::PyValuePtr root =
      io::load_torch_file(std::string(LIBREYOLO_SOURCE_DIR) + "/tests/data/picodet_loss_reference.pt");
  return root;
}

torch::Tensor expected(const std::string& key) {
  auto v = fixture()->get(key);
  if (!v || !v->is_tensor()) throw std::runtime_error("the PicoDet loss fixture has no tensor " + key);
  return v->tensor;
}

// The head's maps as the network gives them: per level [B, nc + 32, H, W], logits then box logits.
std::vector<torch::Tensor> maps() {
  std::vector<torch::Tensor> raw;
  for (int l = 0; l < 4; ++l) {
    const std::string s = std::to_string(l);
    raw.push_back(torch::cat({expected("cls_" + s), expected("box_" + s)}, 1).requires_grad_(true));
  }
  return raw;
}

}  // namespace

TEST(PicodetLoss, AssignmentTermsAndGradientsMatchTheReference) {
  PicodetLoss loss(kClasses);
  auto raw = maps();
  const auto targets = expected("targets");
  const int64_t size = expected("imgsz").item<int64_t>();
  // The assignment alone: the same positives, rows and classes at every prior.
  const auto flat = loss.flatten(raw);
  auto gt = targets.clone();
  gt.narrow(2, 1, 4).mul_(static_cast<double>(size));
  const auto a = loss.assign(flat.boxes, flat.logits, flat.priors, gt);
  ASSERT_EQ(a.fg.sizes(), expected("fg").sizes());
  EXPECT_TRUE(torch::equal(a.fg, expected("fg"))) << (a.fg != expected("fg")).sum().item<int64_t>()
                                                   << " priors differ in being positive";
  EXPECT_TRUE(torch::equal(torch::where(a.fg, a.gt_index, torch::zeros_like(a.gt_index)), expected("gt_index")));
  EXPECT_TRUE(torch::equal(a.labels, expected("labels")));
  EXPECT_EQ(a.fg.sum().item<int64_t>(), expected("num_pos").item<int64_t>());
  // Every image as the fixture says: the 6 x 6 box (row 2 of image 0) has a positive, the image
  // without boxes none, the crowded one more than its 20 boxes.
  EXPECT_TRUE(((a.gt_index[0] == 2) & a.fg[0]).any().item<bool>());
  EXPECT_EQ(a.fg[1].sum().item<int64_t>(), 0);
  EXPECT_GT(a.fg[2].sum().item<int64_t>(), 20);
  // The terms (float32 sums of a few thousand terms, against the reference's own float32 sums in
  // another order: 1e-4 relative) and the gradients.
  const auto out = loss.compute(raw, targets, size, size);
  for (const std::string term : {"cls", "bbox", "dfl"}) {
    const double want = expected("loss_" + term).item<double>(), have = out.term(term).item<double>();
    EXPECT_LE(std::abs(have - want) / std::abs(want), 1e-4) << term << ": " << have << " vs " << want;
  }
  const double total = out.total.item<double>(), want_total = expected("total").item<double>();
  EXPECT_LE(std::abs(total - want_total) / want_total, 1e-4);
  EXPECT_NEAR(out.num_fg.item<double>(), expected("num_pos").item<double>() / 3.0, 1e-5);  // float32 101 / 3
  out.total.backward();
  double worst = 0;
  for (int l = 0; l < 4; ++l) {
    const std::string s = std::to_string(l);
    const auto g = raw[static_cast<size_t>(l)].grad();
    const double ec = rel_err(g.narrow(1, 0, kClasses), expected("grad_cls_" + s));
    const double eb = rel_err(g.narrow(1, kClasses, 32), expected("grad_box_" + s));
    EXPECT_LE(ec, 1e-3) << "level " << l << " class logits";
    EXPECT_LE(eb, 1e-3) << "level " << l << " box logits";
    worst = std::max({worst, ec, eb});
  }
  std::printf("  %lld positives, total %.6f vs %.6f, worst gradient rel err %.3g\n",
              static_cast<long long>(a.fg.sum().item<int64_t>()), total, want_total, worst);
}

// Without any ground truth: the varifocal loss against zeros (0.75 sigmoid^2 times the BCE) over
// max(0, 1) = 1, box terms 0 with zero gradient, nothing assigned; no rows at all is the same.
TEST(PicodetLoss, NoGroundTruthGivesTheBackgroundLossOnly) {
  PicodetLoss loss(kClasses);
  auto raw = maps();
  auto targets = torch::zeros({3, 4, 5});
  targets.select(2, 0).fill_(-1);
  const auto out = loss.compute(raw, targets, 256, 256);
  EXPECT_EQ(out.term("bbox").item<double>(), 0.0);
  EXPECT_EQ(out.term("dfl").item<double>(), 0.0);
  EXPECT_EQ(out.num_fg.item<double>(), 0.0);
  const auto x = loss.flatten(raw).logits.detach();
  const double want = (torch::binary_cross_entropy_with_logits(x, torch::zeros_like(x), {}, {}, at::Reduction::None) *
                       torch::sigmoid(x).pow(2) * 0.75)
                          .sum()
                          .item<double>();
  EXPECT_NEAR(out.term("cls").item<double>(), want, 1e-5 * want);
  out.total.backward();
  for (const auto& r : raw) EXPECT_EQ(r.grad().narrow(1, kClasses, 32).abs().max().item<double>(), 0.0);
  const auto none = loss.compute(maps(), torch::zeros({3, 0, 5}), 256, 256);
  EXPECT_NEAR(none.total.item<double>(), out.total.item<double>(), 1e-6 * want);
}

TEST(PicodetLoss, RejectsMapsOfTheWrongShape) {
  PicodetLoss loss(kClasses);
  auto raw = maps();
  raw.pop_back();
  EXPECT_THROW(loss.compute(raw, torch::zeros({3, 1, 5}), 256, 256), libreyolo::UsageError);
  EXPECT_THROW(PicodetLoss(0), libreyolo::UsageError);
}
