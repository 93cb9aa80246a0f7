// RT-DETR's Hungarian matching: the linear assignment solver against brute force (square and
// rectangular both ways, forbidden pairs, ties, empty) and against scipy's choices among tied
// optima (tests/data/rtdetr_lsa_scipy_ties.txt), and the matcher against LibreYOLO 1.6.0's
// recorded cost matrices and scipy assignments of every output level (the narrow fixture),
// from the recorded outputs and from this network's own training forward.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>

#include "families/rtdetr/assignment.hpp"
#include "families/rtdetr/matcher.hpp"
#include "libreyolo/errors.hpp"
#include "rtdetr_fixture.hpp"

namespace rtdetr = libreyolo::models::rtdetr;
using libreyolo::test::check_rel;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The smallest total cost over every way of giving each row of the smaller side its own column
// (rows > cols: every column its own row), by enumeration.
double brute_force_min(const std::vector<double>& c, int64_t r, int64_t k) {
  const bool tall = r > k;
  const int64_t small = tall ? k : r, big = tall ? r : k;
  auto at = [&](int64_t s, int64_t b) { return tall ? c[b * k + s] : c[s * k + b]; };
  std::vector<int64_t> perm(big);
  std::iota(perm.begin(), perm.end(), 0);
  double best = kInf;
  do {  // the first `small` entries of each permutation (repeats are harmless)
    double sum = 0;
    for (int64_t s = 0; s < small; ++s) sum += at(s, perm[s]);
    best = std::min(best, sum);
  } while (std::next_permutation(perm.begin(), perm.end()));
  return best;
}

double total(const std::vector<double>& c, int64_t k, const rtdetr::Assignment& a) {
  double sum = 0;
  for (size_t i = 0; i < a.rows.size(); ++i) sum += c[a.rows[i] * k + a.cols[i]];
  return sum;
}

// Pairs are min(r, k) many, rows ascending, every row and column at most once.
void expect_valid(const rtdetr::Assignment& a, int64_t r, int64_t k) {
  ASSERT_EQ(a.rows.size(), static_cast<size_t>(std::min(r, k)));
  ASSERT_EQ(a.cols.size(), a.rows.size());
  EXPECT_TRUE(std::is_sorted(a.rows.begin(), a.rows.end()));
  std::vector<int> rows(r), cols(k);
  for (size_t i = 0; i < a.rows.size(); ++i) {
    ASSERT_GE(a.rows[i], 0);
    ASSERT_LT(a.rows[i], r);
    ASSERT_GE(a.cols[i], 0);
    ASSERT_LT(a.cols[i], k);
    EXPECT_EQ(++rows[a.rows[i]], 1);
    EXPECT_EQ(++cols[a.cols[i]], 1);
  }
}

}  // namespace

TEST(RtdetrAssignment, EqualsBruteForceOnRandomMatrices) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> uni(-3.0, 5.0);
  std::uniform_int_distribution<int> small_int(0, 3);
  int cases = 0, unique_checked = 0;
  for (int64_t r = 1; r <= 6; ++r)
    for (int64_t k = 1; k <= 6; ++k)
      for (int trial = 0; trial < 12; ++trial) {
        SCOPED_TRACE(std::to_string(r) + " x " + std::to_string(k) + " trial " + std::to_string(trial));
        // Even trials: continuous costs (a unique optimum); odd: small integers (many ties).
        const bool ties = trial % 2 == 1;
        std::vector<double> c(r * k);
        for (auto& x : c) x = ties ? small_int(rng) : uni(rng);
        const auto a = rtdetr::linear_sum_assignment(c, r, k);
        expect_valid(a, r, k);
        const double want = brute_force_min(c, r, k);
        EXPECT_NEAR(total(c, k, a), want, 1e-9);
        ++cases;
        if (ties) continue;
        // Continuous costs: the optimum is unique, so the pairs themselves are the brute force's.
        const auto t = rtdetr::linear_sum_assignment(torch::tensor(c, torch::kDouble).view({r, k}).t().contiguous());
        ASSERT_EQ(t.rows.size(), a.rows.size());
        std::vector<std::pair<int64_t, int64_t>> mine, transposed;
        for (size_t i = 0; i < a.rows.size(); ++i) {
          mine.emplace_back(a.rows[i], a.cols[i]);
          transposed.emplace_back(t.cols[i], t.rows[i]);
        }
        std::sort(transposed.begin(), transposed.end());
        EXPECT_EQ(mine, transposed);
        ++unique_checked;
      }
  std::printf("  %d matrices up to 6 x 6 (%d with a unique optimum, also solved transposed)\n", cases, unique_checked);
}

TEST(RtdetrAssignment, ForbiddenPairsAndEmptyMatrices) {
  // +inf marks a pair that may not be used; the optimum avoids it even when it costs more.
  const std::vector<double> c = {1, kInf, 0, kInf, 2, 5, 0, 4, kInf};
  const auto a = rtdetr::linear_sum_assignment(c, 3, 3);
  expect_valid(a, 3, 3);
  EXPECT_EQ(a.cols, (std::vector<int64_t>{2, 1, 0}));
  EXPECT_DOUBLE_EQ(total(c, 3, a), brute_force_min(c, 3, 3));
  // Random matrices with about a third of the pairs forbidden, against brute force.
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  int feasible = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t r = 2 + trial % 4, k = 2 + (trial / 4) % 4;
    std::vector<double> m(r * k);
    for (auto& x : m) x = uni(rng) < 0.33 ? kInf : uni(rng);
    const double want = brute_force_min(m, r, k);
    if (want == kInf) {
      EXPECT_THROW(rtdetr::linear_sum_assignment(m, r, k), libreyolo::UsageError);
      continue;
    }
    ++feasible;
    const auto got = rtdetr::linear_sum_assignment(m, r, k);
    expect_valid(got, r, k);
    EXPECT_NEAR(total(m, k, got), want, 1e-9);
  }
  EXPECT_GT(feasible, 10);
  // Empty both ways: no pairs.
  for (const auto& [r, k] : std::vector<std::pair<int64_t, int64_t>>{{0, 5}, {5, 0}, {0, 0}}) {
    const auto e = rtdetr::linear_sum_assignment(torch::zeros({r, k}));
    EXPECT_TRUE(e.rows.empty());
    EXPECT_TRUE(e.cols.empty());
  }
  EXPECT_THROW(rtdetr::linear_sum_assignment({1, std::nan(""), 2, 3}, 2, 2), libreyolo::UsageError);
  EXPECT_THROW(rtdetr::linear_sum_assignment({1, -kInf, 2, 3}, 2, 2), libreyolo::UsageError);
  EXPECT_THROW(rtdetr::linear_sum_assignment({1, 2, 3}, 2, 2), libreyolo::UsageError);
  EXPECT_THROW(rtdetr::linear_sum_assignment(torch::zeros({2, 2, 2})), libreyolo::UsageError);
}

// Among several optimal assignments the solver picks the one scipy's linear_sum_assignment
// picks (recorded with scipy 1.17.1 on integer matrices full of ties, both orientations).
TEST(RtdetrAssignment, TiesResolvedAsScipyResolvesThem) {
  const std::string path = std::string(LIBREYOLO_SOURCE_DIR) + "/tests/data/rtdetr_lsa_scipy_ties.txt";
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << "cannot open " << path;
  std::string line;
  int cases = 0, equal = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    int64_t r = 0, k = 0;
    std::istringstream(line) >> r >> k;
    std::vector<double> c(r * k);
    std::getline(in, line);
    std::istringstream costs(line);
    for (auto& x : c) costs >> x;
    std::getline(in, line);
    std::istringstream result(line);
    std::vector<int64_t> rows, cols;
    std::string word;
    bool after_bar = false;
    while (result >> word) {
      if (word == "|") {
        after_bar = true;
        continue;
      }
      (after_bar ? cols : rows).push_back(std::stoll(word));
    }
    const auto a = rtdetr::linear_sum_assignment(c, r, k);
    EXPECT_EQ(a.rows, rows) << "case " << cases << " (" << r << " x " << k << ")";
    EXPECT_EQ(a.cols, cols) << "case " << cases << " (" << r << " x " << k << ")";
    equal += a.rows == rows && a.cols == cols;
    ++cases;
  }
  EXPECT_EQ(cases, 242);
  std::printf("  %d of %d tie-laden matrices assigned as scipy assigns them\n", equal, cases);
}

// Larger than brute force reaches: the total equals the transposed problem's, and no exchange of
// two rows' columns, nor moving one row to an unused column, lowers it (a necessary optimality
// condition that a wrong potential update breaks).
TEST(RtdetrAssignment, LargeRectangularIsLocallyOptimalAndTransposeInvariant) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> uni(0.0, 10.0);
  const int64_t r = 40, k = 300;
  std::vector<double> c(r * k);
  for (auto& x : c) x = uni(rng);
  const auto a = rtdetr::linear_sum_assignment(c, r, k);
  expect_valid(a, r, k);
  const auto t = rtdetr::linear_sum_assignment(torch::tensor(c, torch::kDouble).view({r, k}).t().contiguous());
  double tt = 0;
  for (size_t i = 0; i < t.rows.size(); ++i) tt += c[t.cols[i] * k + t.rows[i]];
  EXPECT_NEAR(total(c, k, a), tt, 1e-9);
  std::vector<char> used(k, 0);
  for (auto j : a.cols) used[j] = 1;
  for (int64_t i = 0; i < r; ++i) {
    const double own = c[i * k + a.cols[i]];
    for (int64_t j = 0; j < k; ++j)
      if (!used[j]) EXPECT_LE(own, c[i * k + j] + 1e-12);
    for (int64_t i2 = i + 1; i2 < r; ++i2)
      EXPECT_LE(own + c[i2 * k + a.cols[i2]], c[i * k + a.cols[i2]] + c[i2 * k + a.cols[i]] + 1e-12);
  }
}

namespace {

// The matched levels in the reference's order: the last decoder layer, decoder layers 0..L-2,
// the encoder top-k; as recorded under `prefix` (train_nodn / train_dn).
std::vector<rtdetr::OutputLevel> recorded_levels(const libreyolo::test::RtdetrFixture& f, const std::string& prefix) {
  std::vector<rtdetr::OutputLevel> levels = {{f.expected(prefix + ".pred_logits"), f.expected(prefix + ".pred_boxes")}};
  for (int i = 0; i < 3; ++i) {
    const std::string p = prefix + ".aux_outputs." + std::to_string(i) + ".";
    levels.push_back({f.expected(p + "pred_logits"), f.expected(p + "pred_boxes")});
  }
  return levels;
}

// Every level's matches equal the recorded ones (query and GT indices, in scipy's order).
void expect_recorded_matches(const libreyolo::test::RtdetrFixture& f, const std::string& prefix, int level,
                             const std::vector<rtdetr::ImageMatch>& got) {
  ASSERT_EQ(got.size(), 2u);
  for (int b = 0; b < 2; ++b) {
    const std::string p = prefix + ".level" + std::to_string(level) + ".img" + std::to_string(b) + ".";
    EXPECT_TRUE(torch::equal(got[b].query, f.expected(p + "pred"))) << p;
    EXPECT_TRUE(torch::equal(got[b].gt, f.expected(p + "gt"))) << p;
  }
}

}  // namespace

TEST(RtdetrMatcher, TargetsFromTheLoaderLayout) {
  LY_REQUIRE_FIXTURES(dir);
  auto f = libreyolo::test::load_rtdetr_fixture(dir);
  const auto gts = rtdetr::split_targets(f.expected("targets_padded"));
  const auto want = f.targets();
  ASSERT_EQ(gts.size(), 2u);
  for (int b = 0; b < 2; ++b) {
    EXPECT_TRUE(torch::equal(gts[b].labels, want[b].labels)) << b;
    EXPECT_TRUE(torch::allclose(gts[b].boxes, want[b].boxes, 0, 1e-7)) << b;
  }
  EXPECT_EQ(gts[0].size(), 7);
  EXPECT_EQ(gts[1].size(), 3);
}

TEST(RtdetrMatcher, CostAndMatchesOfTheRecordedOutputs) {
  LY_REQUIRE_FIXTURES(dir);
  auto f = libreyolo::test::load_rtdetr_fixture(dir);
  const auto gts = f.targets();
  for (const auto& [out, match] :
       std::vector<std::pair<std::string, std::string>>{{"train_nodn", "match_nodn"}, {"train_dn", "match_dn"}}) {
    const auto levels = recorded_levels(f, out);
    for (int l = 0; l < 4; ++l) {
      SCOPED_TRACE(match + " level " + std::to_string(l));
      const auto cost = rtdetr::matching_cost(levels[l].logits, levels[l].boxes, gts);
      check_rel(match + ".level" + std::to_string(l) + ".cost", cost,
                f.expected(match + ".level" + std::to_string(l) + ".cost"), 1e-5);
      expect_recorded_matches(f, match, l, rtdetr::solve_matches(cost, gts));
    }
  }
  // No GT in the batch: no cost, and every image gets no pairs.
  std::vector<rtdetr::ImageTargets> none(2, {torch::zeros({0}, torch::kLong), torch::zeros({0, 4})});
  const auto levels = recorded_levels(f, "train_nodn");
  EXPECT_FALSE(rtdetr::matching_cost(levels[0].logits, levels[0].boxes, none).defined());
  const auto empty = rtdetr::hungarian_match(levels[0].logits, levels[0].boxes, none);
  ASSERT_EQ(empty.size(), 2u);
  EXPECT_EQ(empty[0].size() + empty[1].size(), 0);
}

TEST(RtdetrMatcher, MatchesOfThisNetworksTrainingForward) {
  LY_REQUIRE_FIXTURES(dir);
  auto f = libreyolo::test::load_rtdetr_fixture(dir);
  f.model->train();
  const auto t = f.model->forward_train_outputs(f.input());
  const auto gts = f.targets();
  std::vector<rtdetr::OutputLevel> levels = {{t.logits[2], t.boxes[2]},
                                             {t.logits[0], t.boxes[0]},
                                             {t.logits[1], t.boxes[1]},
                                             {t.enc_topk_logits, t.enc_topk_boxes}};
  int pairs = 0;
  for (int l = 0; l < 4; ++l) {
    SCOPED_TRACE("level " + std::to_string(l));
    const auto m = rtdetr::hungarian_match(levels[l].logits, levels[l].boxes, gts);
    expect_recorded_matches(f, "match_nodn", l, m);
    pairs += static_cast<int>(m[0].size() + m[1].size());
  }
  EXPECT_EQ(pairs, 4 * 10);
  std::printf("  4 levels x 2 images: %d matched pairs, all equal to scipy's\n", pairs);
}

TEST(RtdetrMatcher, LevelsMatchedTogetherEqualLevelByLevel) {
  // Several levels at once (one copy to the host) give each level's own matches: levels of
  // different query counts, one against relabelled targets, one batch without any GT, and
  // images without boxes.
  torch::manual_seed(11);
  const int64_t b = 3, nc = 5;
  std::vector<rtdetr::ImageTargets> gts;
  for (int64_t n : {4, 0, 2}) {
    const auto cxcy = torch::rand({n, 2}) * 0.6 + 0.2, wh = torch::rand({n, 2}) * 0.3 + 0.05;
    gts.push_back({torch::randint(0, nc, {n}, torch::kLong), torch::cat({cxcy, wh}, 1)});
  }
  std::vector<rtdetr::ImageTargets> one_class = gts, none;
  for (auto& g : one_class) g.labels = torch::zeros_like(g.labels);
  for (int64_t i = 0; i < b; ++i) none.push_back({torch::zeros({0}, torch::kLong), torch::zeros({0, 4})});
  const auto level = [&](int64_t q, int64_t classes) {
    return rtdetr::OutputLevel{torch::randn({b, q, classes}), torch::rand({b, q, 4}) * 0.5 + 0.25};
  };
  const std::vector<rtdetr::OutputLevel> levels = {level(12, nc), level(12, nc), level(9, 1), level(12, nc)};
  const std::vector<const std::vector<rtdetr::ImageTargets>*> targets = {&gts, &gts, &one_class, &none};
  const auto together = rtdetr::hungarian_match_levels(levels, targets);
  ASSERT_EQ(together.size(), levels.size());
  int64_t pairs = 0;
  for (size_t l = 0; l < levels.size(); ++l) {
    const auto alone = rtdetr::hungarian_match(levels[l].logits, levels[l].boxes, *targets[l]);
    ASSERT_EQ(together[l].size(), alone.size()) << l;
    for (size_t i = 0; i < alone.size(); ++i) {
      EXPECT_TRUE(torch::equal(together[l][i].query, alone[i].query)) << l << " " << i;
      EXPECT_TRUE(torch::equal(together[l][i].gt, alone[i].gt)) << l << " " << i;
      pairs += alone[i].size();
    }
  }
  EXPECT_EQ(pairs, 3 * 6) << "three levels with six boxes each are matched in full, the fourth has none";
  EXPECT_THROW(rtdetr::hungarian_match_levels(levels, {&gts}), libreyolo::UsageError);
}
