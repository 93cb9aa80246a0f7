// The RT-DETR line's capture seams on the CPU. The network seam pads the denoising group to a
// size fixed by the configured count; what comes out of the seam (every training output and the
// loss with its gradients) must be the training forward's for the same draws, for any batch: with
// several box counts, with none, and with more boxes than the configured count. The head seam
// splits the forward exactly.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "families/rtdetr/dfine.hpp"
#include "families/rtdetr/model.hpp"
#include "loss/loss.hpp"
#include "models/detector.hpp"

namespace {

using libreyolo::models::Detector;
using libreyolo::models::Seam;

struct SeamFamily {
  const char* family;
  const char* size;
  int64_t imgsz;
};

// Normalised xyxy boxes with class ids; rows of class -1 are padding.
torch::Tensor targets_of(const std::vector<std::vector<std::vector<float>>>& images, int64_t slots) {
  auto t = torch::full({static_cast<int64_t>(images.size()), slots, 5}, -1.0f);
  for (size_t b = 0; b < images.size(); ++b)
    for (size_t r = 0; r < images[b].size(); ++r)
      for (int k = 0; k < 5; ++k) t[b][r][k] = images[b][r][k];
  return t;
}

// `count` boxes of class c % nc spread over the image.
std::vector<std::vector<float>> boxes(int count, int nc) {
  std::vector<std::vector<float>> out;
  for (int i = 0; i < count; ++i) {
    const float x = 0.05f + 0.11f * static_cast<float>(i % 8), y = 0.1f + 0.2f * static_cast<float>(i / 8);
    out.push_back({static_cast<float>(i % nc), x, y, x + 0.09f + 0.01f * static_cast<float>(i % 3), y + 0.15f});
  }
  return out;
}

void set_count(Detector& m, int64_t count) {
  if (auto* r = dynamic_cast<libreyolo::models::rtdetr::RtdetrModel*>(&m)) r->denoising_options().count = count;
  if (auto* d = dynamic_cast<libreyolo::models::rtdetr::DfineModel*>(&m)) d->denoising_options().count = count;
}

class RtdetrLineSeams : public ::testing::TestWithParam<SeamFamily> {};

TEST_P(RtdetrLineSeams, NetworkSeamGivesTheTrainingForwardAndItsLoss) {
  const SeamFamily c = GetParam();
  const auto* fam = libreyolo::models::find_family(c.family);
  ASSERT_NE(fam, nullptr);
  torch::manual_seed(0);
  auto m = fam->build(c.size, 3);
  m->train();
  auto loss = fam->make_loss(*m);
  const auto x = torch::rand({2, 3, c.imgsz, c.imgsz});
  const auto params = m->head_parameters(Seam::Network);
  EXPECT_EQ(params.size(), m->parameters().size());

  struct Batch {
    std::string name;
    torch::Tensor targets;
    int64_t count;  // the configured denoising count
  };
  const std::vector<Batch> batches = {
      {"3 and 1 boxes", targets_of({boxes(3, 3), boxes(1, 3)}, 8), 100},
      {"7 and 0 boxes", targets_of({boxes(7, 3), {}}, 8), 100},
      {"no box", targets_of({{}, {}}, 4), 100},
      {"more boxes than the count", targets_of({boxes(6, 3), boxes(2, 3)}, 8), 4},
  };
  std::vector<int64_t> padded_slots;
  for (const auto& b : batches) {
    SCOPED_TRACE(b.name);
    set_count(*m, b.count);
    const auto grads = [&](const torch::Tensor& total) {
      for (auto& p : params) p.mutable_grad() = torch::Tensor();
      total.backward();
      std::vector<torch::Tensor> g;
      for (auto& p : params) g.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
      return g;
    };
    torch::manual_seed(11);  // the denoising draws
    const auto whole = m->forward_train(x, b.targets);
    const auto want = loss->compute(whole, b.targets, c.imgsz, c.imgsz);
    const auto want_grads = grads(want.total);

    torch::manual_seed(11);
    const auto in = m->seam_inputs(Seam::Network, b.targets);
    const auto split = m->train_tail(Seam::Network, m->train_head(Seam::Network, x, in.head), x, b.targets, in);
    const auto have = loss->compute(split, b.targets, c.imgsz, c.imgsz);
    const auto have_grads = grads(have.total);

    ASSERT_EQ(in.head.size(), 3u);
    padded_slots.push_back(in.head[0].size(1));
    ASSERT_EQ(split.size(), whole.size());
    for (size_t i = 0; i < whole.size(); ++i) {
      ASSERT_EQ(split[i].sizes(), whole[i].sizes()) << "output " << i;
      if (!whole[i].is_floating_point()) {
        EXPECT_TRUE(torch::equal(split[i], whole[i])) << "output " << i;
        continue;
      }
      EXPECT_TRUE(torch::isfinite(split[i]).all().item<bool>()) << "output " << i;
      const double scale = std::max(1.0, whole[i].abs().max().item<double>());
      EXPECT_LE((split[i] - whole[i]).abs().max().item<double>(), 1e-4 * scale) << "output " << i;
    }
    const double lw = want.total.item<double>(), lh = have.total.item<double>();
    EXPECT_NEAR(lh, lw, 1e-4 * std::abs(lw)) << lh << " vs " << lw;
    // Every parameter gradient, as a whole: the padding adds nothing.
    double diff = 0, norm = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      diff += (have_grads[i] - want_grads[i]).pow(2).sum().item<double>();
      norm += want_grads[i].pow(2).sum().item<double>();
    }
    EXPECT_GT(norm, 0.0);
    EXPECT_LE(std::sqrt(diff), 1e-3 * std::sqrt(norm)) << "gradient difference " << std::sqrt(diff) << " of "
                                                         << std::sqrt(norm);
  }
  // One shape for every batch of up to `count` boxes per image (the first three), another past it.
  EXPECT_EQ(padded_slots[0], 200);
  EXPECT_EQ(padded_slots[1], 200);
  EXPECT_EQ(padded_slots[2], 200);
  EXPECT_EQ(padded_slots[3], 12);
}

// The head seam (backbone and encoder) splits the training forward exactly, and its parameters
// are the backbone's and the encoder's.
TEST_P(RtdetrLineSeams, HeadSeamSplitsTheTrainingForwardExactly) {
  const SeamFamily c = GetParam();
  const auto* fam = libreyolo::models::find_family(c.family);
  torch::manual_seed(0);
  auto m = fam->build(c.size, 3);
  m->train();
  const auto x = torch::rand({1, 3, c.imgsz, c.imgsz});
  const auto t = targets_of({boxes(2, 3)}, 4);
  torch::manual_seed(5);
  const auto whole = m->forward_train(x, t);
  torch::manual_seed(5);
  const auto in = m->seam_inputs(Seam::Head, t);
  EXPECT_TRUE(in.head.empty());
  const auto head = m->train_head(Seam::Head, x, in.head);
  const auto split = m->train_tail(Seam::Head, head, x, t, in);
  ASSERT_EQ(whole.size(), split.size());
  for (size_t i = 0; i < whole.size(); ++i) EXPECT_TRUE(torch::equal(whole[i], split[i])) << "output " << i;
  size_t named = 0;
  for (const auto& p : m->named_parameters())
    if (p.key().rfind("backbone.", 0) == 0 || p.key().rfind("encoder.", 0) == 0) ++named;
  EXPECT_EQ(m->head_parameters(Seam::Head).size(), named);
  EXPECT_GT(named, 50u);
}

INSTANTIATE_TEST_SUITE_P(Families, RtdetrLineSeams,
                         ::testing::Values(SeamFamily{"rtdetr", "r18", 128}, SeamFamily{"rtdetrv2", "r18", 128},
                                           SeamFamily{"dfine", "n", 256}, SeamFamily{"deim", "n", 256}),
                         [](const ::testing::TestParamInfo<SeamFamily>& i) { return std::string(i.param.family); });

}  // namespace
