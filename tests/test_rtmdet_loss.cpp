// RTMDet's loss against LibreYOLO 1.6.0's on synthetic head maps (tests/data/rtmdet_loss_reference.pt,
// made by tests/python/make_rtmdet_loss_fixture.py): per case the assignment (class, IoU metric and
// box of every prior), both terms and the total, and the gradients at the maps; the cases hold a
// 6 x 6 box, an image without boxes and a crowded image of 20 overlapping boxes.
#include <cstdio>

#include "families/rtmdet/loss.hpp"
#include "io/pickle.hpp"
#include "libreyolo/errors.hpp"
#include "support.hpp"

namespace io = libreyolo::io;
using libreyolo::models::rtmdet::RtmdetLoss;
using libreyolo::test::rel_err;

namespace {

io::PyValuePtr fixture() {
  static io::PyValuePtr root =
      io::load_torch_file(std::string(LIBREYOLO_SOURCE_DIR) + "/tests/data/rtmdet_loss_reference.pt");
  return root;
}

torch::Tensor expected(const std::string& key) {
  auto v = fixture()->get("expect")->get(key);
  if (!v || !v->is_tensor()) throw std::runtime_error("the RTMDet loss fixture has no tensor " + key);
  return v->tensor;
}

// The head's maps as the network gives them: per level [B, 4 + nc, H, W], distances then logits.
std::vector<torch::Tensor> maps() {
  std::vector<torch::Tensor> raw;
  for (int l = 0; l < 3; ++l) {
    const std::string s = std::to_string(l);
    raw.push_back(torch::cat({expected("reg_" + s), expected("cls_" + s)}, 1).requires_grad_(true));
  }
  return raw;
}

class RtmdetLossCase : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(RtmdetLossCase, AssignmentTermsAndGradientsMatchTheReference) {
  const std::string c = GetParam() + ".";
  RtmdetLoss loss(3);
  auto raw = maps();
  const auto targets = expected(c + "targets");
  // The assignment alone.
  const auto flat = loss.flatten(raw);
  auto gt = targets.clone();
  gt.narrow(2, 1, 4).mul_(320.0);
  const auto a = loss.assign(flat.boxes, flat.logits, flat.priors, gt);
  const auto want_labels = expected(c + "labels");
  EXPECT_TRUE(torch::equal(a.labels, want_labels))
      << (a.labels != want_labels).sum().item<int64_t>() << " priors assigned differently";
  EXPECT_LE((a.metrics - expected(c + "metrics")).abs().max().item<double>(), 1e-5);
  EXPECT_LE((a.boxes - expected(c + "boxes")).abs().max().item<double>(), 1e-4);
  const int64_t positives = a.fg.sum().item<int64_t>();
  EXPECT_GT(positives, 0);
  // The terms and the gradients.
  const auto out = loss.compute(raw, targets, 320, 320);
  for (const std::string term : {"cls", "bbox"}) {
    const double want = expected(c + "loss_" + term).item<double>(), have = out.term(term).item<double>();
    EXPECT_LE(std::abs(have - want) / std::abs(want), 1e-5) << term << ": " << have << " vs " << want;
  }
  const double total = out.total.item<double>(), want_total = expected(c + "total").item<double>();
  EXPECT_LE(std::abs(total - want_total) / want_total, 1e-5);
  out.total.backward();
  double worst = 0;
  for (int l = 0; l < 3; ++l) {
    const std::string s = std::to_string(l);
    const auto g = raw[static_cast<size_t>(l)].grad();
    const double er = rel_err(g.narrow(1, 0, 4), expected(c + "grad_reg_" + s));
    const double ec = rel_err(g.narrow(1, 4, 3), expected(c + "grad_cls_" + s));
    EXPECT_LE(er, 1e-4) << "level " << l << " distances";
    EXPECT_LE(ec, 1e-4) << "level " << l << " logits";
    worst = std::max({worst, er, ec});
  }
  std::printf("  %s: %lld positives, total %.6f vs %.6f, worst gradient rel err %.3g\n", GetParam().c_str(),
              static_cast<long long>(positives), total, want_total, worst);
}

INSTANTIATE_TEST_SUITE_P(Rtmdet, RtmdetLossCase, ::testing::Values("two", "empty", "crowd"));

// Without any ground truth the loss is the quality focal loss against zeros over max(0, 1) = 1,
// the box term 0 with zero gradient, and nothing is assigned.
TEST(RtmdetLoss, NoGroundTruthGivesTheBackgroundLossOnly) {
  RtmdetLoss loss(3);
  auto raw = maps();
  auto targets = torch::full({2, 4, 5}, 0.0);
  targets.select(2, 0).fill_(-1);
  const auto out = loss.compute(raw, targets, 320, 320);
  EXPECT_EQ(out.term("bbox").item<double>(), 0.0);
  EXPECT_EQ(out.num_fg.item<double>(), 0.0);
  const auto flat = loss.flatten(raw);
  const auto x = flat.logits.detach();
  const double want = (torch::binary_cross_entropy_with_logits(x, torch::zeros_like(x), {}, {}, at::Reduction::None) *
                       torch::sigmoid(x).pow(2))
                          .sum()
                          .item<double>();
  EXPECT_NEAR(out.term("cls").item<double>(), want, 1e-5 * want);
  // No rows at all is the same.
  const auto none = loss.compute(maps(), torch::zeros({2, 0, 5}), 320, 320);
  EXPECT_NEAR(none.total.item<double>(), out.total.item<double>(), 1e-6 * want);
}

TEST(RtmdetLoss, RejectsMapsOfTheWrongShape) {
  RtmdetLoss loss(3);
  auto raw = maps();
  raw.pop_back();
  EXPECT_THROW(loss.compute(raw, torch::zeros({2, 1, 5}), 320, 320), libreyolo::UsageError);
  EXPECT_THROW(RtmdetLoss(0), libreyolo::UsageError);
}
