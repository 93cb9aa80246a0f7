// A fresh model of every family starts training from the distributions LibreYOLO 1.6.0's does:
// per state-dict tensor, the element count, and the mean and standard deviation within what two
// draws of the same distribution give (five standard errors), constants exactly. The reference's
// figures (tests/data/reference_init_stats.json) come from tests/python/make_init_stats.py: its
// model classes built with no weights, plus the bias priors its trainers give a fresh head.
// Found this way: YOLOv9's class biases (the reference's -10 on every level, not a prior from
// the class count) and the D-FINE line's backbone (the layers' own initialisation, not
// Kaiming-normal).
#include <cmath>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "models/detector.hpp"
#include "support.hpp"

using namespace libreyolo;

namespace {

nlohmann::json reference_stats() {
  std::ifstream in(std::string(LIBREYOLO_SOURCE_DIR) + "/tests/data/reference_init_stats.json");
  return nlohmann::json::parse(in);
}

}  // namespace

class InitStats : public ::testing::TestWithParam<std::string> {};

TEST_P(InitStats, FreshModelsDrawFromTheReferencesDistributions) {
  static const nlohmann::json all = reference_stats();
  const std::string key = GetParam();
  ASSERT_TRUE(all.contains(key)) << key;
  const auto dash = key.find('-');
  const std::string family = key.substr(0, dash), size = key.substr(dash + 1);
  const models::Family* fam = models::find_family(family);
  ASSERT_NE(fam, nullptr) << family;
  torch::manual_seed(0);
  const auto model = fam->build(size, 3);
  std::map<std::string, torch::Tensor> ours;
  for (const auto& [name, t] : models::state_dict(*model)) ours[name] = t;
  int compared = 0;
  for (const auto& row : all.at(key)) {
    const std::string name = row[0];
    const int64_t n = row[1];
    const double mean = row[2], std = row[3];
    const int64_t nonfinite = row[4];
    const auto it = ours.find(name);
    if (it == ours.end()) {
      ADD_FAILURE() << key << ": " << name << " is not in our state dict";
      continue;
    }
    const torch::Tensor all_values = it->second.detach().to(torch::kDouble).flatten();
    ASSERT_EQ(all_values.numel(), n) << key << " " << name;
    const torch::Tensor finite = torch::isfinite(all_values);
    EXPECT_EQ(n - finite.sum().item<int64_t>(), nonfinite) << key << " " << name << ": non-finite values";
    const torch::Tensor v = all_values.index({finite});
    if (v.numel() == 0) continue;
    const double m = v.mean().item<double>(), s = v.std(/*unbiased=*/false).item<double>();
    if (std == 0.0) {  // a constant (every one-element tensor among them)
      EXPECT_NEAR(m, mean, 1e-5 * std::max(1.0, std::abs(mean))) << key << " " << name << " (a constant)";
      EXPECT_LE(s, 1e-6) << key << " " << name << " (a constant)";
    } else {
      const double rn = static_cast<double>(v.numel());
      // Five standard errors of the difference of two independent draws' statistics.
      EXPECT_LE(std::abs(s / std - 1.0), 5.0 / std::sqrt(rn) + 0.02)
          << key << " " << name << ": standard deviation " << s << ", the reference's " << std;
      EXPECT_LE(std::abs(m - mean), 5.0 * std * std::sqrt(2.0 / rn) + 1e-6)
          << key << " " << name << ": mean " << m << ", the reference's " << mean;
    }
    ++compared;
  }
  EXPECT_GT(compared, 50) << key;
}

INSTANTIATE_TEST_SUITE_P(Families, InitStats,
                         ::testing::Values("yolo9-t", "yolox-s", "yolo7-b", "rtmdet-t", "picodet-s", "rtdetrv2-r18",
                                           "dfine-n", "deim-n", "rtdetrv4-s", "resnet-18", "mobilenetv4-s",
                                           "efficientnetv2-b0"),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string s = i.param;
                           for (char& c : s)
                             if (c == '-') c = '_';
                           return s;
                         });
