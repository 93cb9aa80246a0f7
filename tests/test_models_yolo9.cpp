// YOLOv9 model: names, shapes, counts, init, outputs, decoding, family rules, weight loading.
#include <ATen/autocast_mode.h>
#include <libreyolo/errors.hpp>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

#include "models/detector.hpp"
#include "families/yolo9/model.hpp"
#include "support.hpp"

using libreyolo::ModelError;
using libreyolo::UsageError;
using libreyolo::io::StateDict;
using libreyolo::models::Detector;
using libreyolo::models::Family;
using libreyolo::models::yolo9::Yolo9Model;
namespace models = libreyolo::models;
namespace yolo9 = libreyolo::models::yolo9;

namespace {

// The reference state_dict listing (key, shape, dtype) written by LibreYOLO itself.
std::vector<libreyolo::test::TsvEntry> read_reference(const std::string& size) {
  return libreyolo::test::read_state_dict_tsv("yolo9_state_dict_" + size + "_nc80.tsv");
}

std::string dtype_name(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kFloat: return "float32";
    case torch::kLong: return "int64";
    default: return std::string(c10::toString(t.scalar_type()));
  }
}

// A state dict with the reference keys and shapes (values irrelevant).
StateDict reference_state_dict(const std::string& size) {
  return libreyolo::test::reference_state_dict_tsv("yolo9_state_dict_" + size + "_nc80.tsv");
}

int64_t count_params(const torch::nn::Module& m, const std::string& prefix = "") {
  int64_t n = 0;
  for (const auto& p : m.named_parameters()) {
    if (p.key().compare(0, prefix.size(), prefix) == 0) n += p.value().numel();
  }
  return n;
}

torch::Tensor param(const torch::nn::Module& m, const std::string& key) {
  const auto params = m.named_parameters();
  const auto* t = params.find(key);
  if (!t) throw std::runtime_error("no parameter " + key);
  return *t;
}

const Family& yolo9_family() {
  const Family* f = models::find_family("yolo9");
  if (!f) throw std::runtime_error("yolo9 family not registered");
  return *f;
}

}  // namespace

// ------------------------------------------------------------------ names, shapes, counts

class Yolo9Sizes : public ::testing::TestWithParam<std::string> {};

TEST_P(Yolo9Sizes, StateDictEqualsReferenceListing) {
  const std::string size = GetParam();
  const auto ref = read_reference(size);
  Yolo9Model model(size, 80);
  const StateDict sd = models::state_dict(model);
  ASSERT_EQ(sd.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_EQ(sd[i].first, ref[i].key) << "entry " << i;
    EXPECT_EQ(sd[i].second.sizes().vec(), ref[i].shape) << ref[i].key;
    EXPECT_EQ(dtype_name(sd[i].second), ref[i].dtype) << ref[i].key;
  }
  // The same names come from the module's own recursive listings.
  std::set<std::string> listed, wanted;
  for (const auto& p : model.named_parameters()) listed.insert(p.key());
  for (const auto& b : model.named_buffers()) listed.insert(b.key());
  for (const auto& e : ref) wanted.insert(e.key);
  EXPECT_EQ(listed, wanted);
  EXPECT_EQ(model.named_parameters().size() + model.named_buffers().size(), ref.size());
}

INSTANTIATE_TEST_SUITE_P(Yolo9, Yolo9Sizes, ::testing::Values("t", "s", "m", "c"));

TEST(Yolo9Model, ParameterCountsMatchReference) {
  struct Row {
    const char* size;
    int64_t total, backbone, neck, head;
  };
  const Row rows[] = {{"t", 2036544, 708720, 729696, 598128},
                      {"s", 7226192, 2820576, 2903744, 1501872},
                      {"m", 20123984, 7935456, 7586048, 4602480},
                      {"c", 25498736, 8985280, 10961152, 5552304}};
  for (const auto& r : rows) {
    Yolo9Model model(r.size, 80);
    EXPECT_EQ(count_params(model), r.total) << r.size;
    EXPECT_EQ(count_params(model, "backbone."), r.backbone) << r.size;
    EXPECT_EQ(count_params(model, "neck."), r.neck) << r.size;
    EXPECT_EQ(count_params(model, "head."), r.head) << r.size;
  }
  const std::pair<int, int64_t> t_counts[] = {
      {1, 1913427}, {2, 1913622}, {20, 1917132}, {100, 2196684}, {200, 2226984}};
  for (const auto& [nc, n] : t_counts) {
    EXPECT_EQ(count_params(Yolo9Model("t", nc)), n) << "t nc=" << nc;
  }
}

TEST(Yolo9Model, ClassHiddenWidthRule) {
  EXPECT_EQ(yolo9::class_hidden_width("t", 80), 80);
  EXPECT_EQ(yolo9::class_hidden_width("t", 64), 64);
  EXPECT_EQ(yolo9::class_hidden_width("t", 3), 64);
  EXPECT_EQ(yolo9::class_hidden_width("t", 200), 100);
  EXPECT_EQ(yolo9::class_hidden_width("s", 80), 128);
  EXPECT_EQ(yolo9::class_hidden_width("m", 80), 240);
  EXPECT_EQ(yolo9::class_hidden_width("c", 100), 256);

  Yolo9Model fresh("t", 3);
  EXPECT_EQ(param(fresh, "head.cv3.0.0.conv.weight").sizes().vec(), (std::vector<int64_t>{64, 64, 3, 3}));
  // A COCO model fine-tuned to 3 classes keeps its hidden width.
  Yolo9Model tuned("t", 3, 80);
  EXPECT_EQ(tuned.class_hidden(), 80);
  EXPECT_EQ(param(tuned, "head.cv3.1.1.conv.weight").sizes().vec(), (std::vector<int64_t>{80, 80, 3, 3}));
  EXPECT_EQ(param(tuned, "head.cv3.2.2.weight").sizes().vec(), (std::vector<int64_t>{3, 80, 1, 1}));
}

TEST(Yolo9Model, RejectsBadArguments) {
  EXPECT_THROW(Yolo9Model("x", 80), UsageError);
  EXPECT_THROW(Yolo9Model("t", 0), UsageError);
  EXPECT_THROW(Yolo9Model("t", 80, 0), UsageError);
  Yolo9Model model("t", 2);
  EXPECT_THROW(model.forward_raw(torch::zeros({1, 1, 64, 64})), UsageError);
  EXPECT_THROW(model.forward_raw(torch::zeros({3, 64, 64})), UsageError);
  EXPECT_THROW(model.decode({torch::zeros({1, 66, 8, 8})}), UsageError);
  EXPECT_THROW(model.decode({torch::zeros({1, 67, 8, 8}), torch::zeros({1, 67, 4, 4}),
                             torch::zeros({1, 80, 2, 2})}),
               UsageError);
  EXPECT_THROW(model.reset_num_classes(0), UsageError);
}

// ------------------------------------------------------------------------------ init

TEST(Yolo9Model, HeadBiasInit) {
  Yolo9Model model("t", 80);
  for (int i = 0; i < 3; ++i) {
    // LibreYOLO's fresh head: -10 on every level for any class count.
    const auto cls_b = param(model, "head.cv3." + std::to_string(i) + ".2.bias");
    EXPECT_EQ(cls_b.min().item<double>(), -10.0);
    EXPECT_EQ(cls_b.max().item<double>(), -10.0);
    const auto box_b = param(model, "head.cv2." + std::to_string(i) + ".2.bias");
    EXPECT_EQ(box_b.numel(), 64);
    EXPECT_TRUE(torch::equal(box_b, torch::ones_like(box_b)));
  }
  Yolo9Model three("t", 3);
  EXPECT_EQ(param(three, "head.cv3.2.2.bias")[0].item<double>(), -10.0);
}

TEST(Yolo9Model, DefaultInitIsPyTorchs) {
  Yolo9Model model("t", 80);
  // BatchNorm: gamma 1, beta 0, running mean 0, running var 1.
  const auto sd = models::state_dict(model);
  for (const auto& [k, v] : sd) {
    auto ends = [&](const std::string& s) {
      return k.size() >= s.size() && k.compare(k.size() - s.size(), s.size(), s) == 0;
    };
    if (ends("bn.weight") || ends("bn.running_var")) EXPECT_TRUE(torch::equal(v, torch::ones_like(v))) << k;
    if (ends("bn.bias") || ends("bn.running_mean")) EXPECT_TRUE(torch::equal(v, torch::zeros_like(v))) << k;
  }
  // Conv weights: kaiming_uniform(a=sqrt(5)) = U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
  const auto w = param(model, "neck.elan_up1.cv1.conv.weight");  // [96, 224, 1, 1]
  const double bound = 1.0 / std::sqrt(224.0);
  EXPECT_LE(w.abs().max().item<double>(), bound);
  EXPECT_NEAR(w.var().item<double>(), bound * bound / 3.0, 0.05 * bound * bound / 3.0);
}

TEST(Yolo9Model, ConvInitMatchesPythonTorchBitForBit) {
  auto py = libreyolo::test::python_with_torch();
  if (!py) GTEST_SKIP() << "no python with torch for the interop check";
  // A file of our own rather than temp_dir(): removing directories at exit crashes with this
  // libtorch build (its exported std::filesystem::remove_all needs a newer libstdc++).
  char path[] = "/tmp/libreyolo_yolo9_init_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  const std::string script =
      "import torch; torch.manual_seed(1234); c = torch.nn.Conv2d(16, 64, 3, groups=4); "
      "torch.cat([c.weight.detach().flatten(), c.bias.detach()]).numpy().tofile('" +
      std::string(path) + "')";
  std::string out;
  const int rc = libreyolo::test::run_command(*py + " -c \"" + script + "\"", &out);
  std::vector<float> ref(64 * 4 * 9 + 64);
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(ref.data()), static_cast<std::streamsize>(ref.size() * 4));
  const bool read_all = in.good();
  std::remove(path);
  ASSERT_EQ(rc, 0) << out;
  ASSERT_TRUE(read_all);
  torch::manual_seed(1234);
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(16, 64, 3).groups(4));
  auto mine = torch::cat({conv->weight.detach().flatten(), conv->bias.detach()});
  auto theirs = torch::from_blob(ref.data(), {static_cast<int64_t>(ref.size())}, torch::kFloat);
  EXPECT_TRUE(torch::equal(mine, theirs));
}

TEST(Yolo9Model, ResetNumClassesReplacesOnlyTheClassOutputs) {
  torch::manual_seed(0);
  Yolo9Model model("t", 80);
  const StateDict before = models::state_dict(model);
  std::vector<torch::Tensor> snapshot;
  for (const auto& kv : before) snapshot.push_back(kv.second.clone());
  model.reset_num_classes(3);
  EXPECT_EQ(model.num_classes(), 3);
  EXPECT_EQ(model.class_hidden(), 80);
  const StateDict after = models::state_dict(model);
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    ASSERT_EQ(after[i].first, before[i].first);  // order kept
    const std::string& k = after[i].first;
    bool replaced = false;
    for (int l = 0; l < 3; ++l) {
      const std::string p = "head.cv3." + std::to_string(l) + ".2.";
      replaced = replaced || k == p + "weight" || k == p + "bias";
    }
    if (replaced) {
      const int64_t want = after[i].first.back() == 't' ? 4 : 1;  // weight [3,80,1,1], bias [3]
      EXPECT_EQ(after[i].second.size(0), 3) << after[i].first;
      EXPECT_EQ(after[i].second.dim(), want) << after[i].first;
    } else {
      EXPECT_TRUE(torch::equal(after[i].second, snapshot[i])) << after[i].first;
    }
  }
  for (int i = 0; i < 3; ++i) {
    const auto b = param(model, "head.cv3." + std::to_string(i) + ".2.bias");
    EXPECT_EQ(b[2].item<double>(), -10.0);
    EXPECT_TRUE(param(model, "head.cv3." + std::to_string(i) + ".2.weight").requires_grad());
  }
  // Same count again: nothing changes.
  const auto w = param(model, "head.cv3.0.2.weight");
  model.reset_num_classes(3);
  EXPECT_TRUE(param(model, "head.cv3.0.2.weight").is_same(w));
  torch::NoGradGuard ng;
  model.eval();
  auto raw = model.forward_raw(torch::rand({1, 3, 64, 64}));
  EXPECT_EQ(raw[0].size(1), 67);
  EXPECT_EQ(model.decode(raw).sizes().vec(), (std::vector<int64_t>{1, 7, 84}));
}

// --------------------------------------------------------------------------- outputs

TEST(Yolo9Model, OutputShapesTrainAndEval) {
  torch::manual_seed(0);
  Yolo9Model model("t", 80);
  auto x = torch::rand({2, 3, 128, 128});
  model.train();
  auto raw = model.forward_raw(x);
  ASSERT_EQ(raw.size(), 3u);
  EXPECT_EQ(raw[0].sizes().vec(), (std::vector<int64_t>{2, 144, 16, 16}));
  EXPECT_EQ(raw[1].sizes().vec(), (std::vector<int64_t>{2, 144, 8, 8}));
  EXPECT_EQ(raw[2].sizes().vec(), (std::vector<int64_t>{2, 144, 4, 4}));
  EXPECT_TRUE(raw[0].requires_grad());
  // A train forward updates BN statistics; an eval forward does not.
  const auto sd = models::state_dict(model);
  torch::Tensor nbt, mean;
  for (const auto& [k, v] : sd) {
    if (k == "backbone.conv0.bn.num_batches_tracked") nbt = v;
    if (k == "backbone.conv0.bn.running_mean") mean = v;
  }
  EXPECT_EQ(nbt.item<int64_t>(), 1);
  const auto mean_after_train = mean.clone();
  EXPECT_GT(mean_after_train.abs().max().item<double>(), 0.0);

  model.eval();
  torch::NoGradGuard ng;
  auto raw_eval = model.forward_raw(x);
  EXPECT_EQ(raw_eval[2].sizes().vec(), (std::vector<int64_t>{2, 144, 4, 4}));
  EXPECT_EQ(nbt.item<int64_t>(), 1);
  EXPECT_TRUE(torch::equal(mean, mean_after_train));
  auto pred = model.decode(raw_eval);
  EXPECT_EQ(pred.sizes().vec(), (std::vector<int64_t>{2, 84, 256 + 64 + 16}));
  EXPECT_EQ(pred.scalar_type(), torch::kFloat);
  auto scores = pred.narrow(1, 4, 80);
  EXPECT_GE(scores.min().item<double>(), 0.0);
  EXPECT_LE(scores.max().item<double>(), 1.0);
  EXPECT_TRUE(torch::equal(model.predict_tensor(x), pred));
}

TEST(Yolo9Model, BackwardReachesEveryParameter) {
  torch::manual_seed(0);
  Yolo9Model model("t", 2);
  model.train();
  auto raw = model.forward_raw(torch::rand({2, 3, 64, 96}));
  (raw[0].pow(2).mean() + raw[1].pow(2).mean() + raw[2].pow(2).mean()).backward();
  for (const auto& p : model.named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_GT(p.value().grad().abs().max().item<double>(), 0.0) << p.key();
  }
}

TEST(Yolo9Model, NonSquareInput) {
  torch::manual_seed(0);
  Yolo9Model model("t", 80);
  model.eval();
  torch::NoGradGuard ng;
  auto raw = model.forward_raw(torch::rand({1, 3, 480, 640}));
  EXPECT_EQ(raw[0].sizes().vec(), (std::vector<int64_t>{1, 144, 60, 80}));
  EXPECT_EQ(raw[1].sizes().vec(), (std::vector<int64_t>{1, 144, 30, 40}));
  EXPECT_EQ(raw[2].sizes().vec(), (std::vector<int64_t>{1, 144, 15, 20}));
  auto pred = model.decode(raw);
  EXPECT_EQ(pred.sizes().vec(), (std::vector<int64_t>{1, 84, 6300}));
  // Each box contains its anchor centre: anchor 80 is the first of P3's second row, centre
  // (4, 12) px; the last anchor is P5's bottom-right cell, centre (624, 464) px.
  auto contains = [&](int64_t a, double cx, double cy) {
    auto b = pred[0].select(1, a);
    return b[0].item<double>() < cx && cx < b[2].item<double>() && b[1].item<double>() < cy &&
           cy < b[3].item<double>();
  };
  EXPECT_TRUE(contains(80, 4.0, 12.0));
  EXPECT_TRUE(contains(6299, 624.0, 464.0));
}

TEST(Yolo9Model, ChannelsLastInputGivesTheSameOutput) {
  torch::manual_seed(0);
  Yolo9Model model("t", 5);
  model.eval();
  torch::NoGradGuard ng;
  auto x = torch::rand({2, 3, 96, 64});
  auto a = model.predict_tensor(x);
  auto b = model.predict_tensor(x.contiguous(torch::MemoryFormat::ChannelsLast));
  EXPECT_LT(libreyolo::test::rel_err(b, a), 1e-5);
}

// Straightforward per-anchor decoding, written independently of the model's vectorised one.
torch::Tensor decode_by_hand(const std::vector<torch::Tensor>& raw, int nc) {
  const int64_t B = raw[0].size(0);
  int64_t A = 0;
  for (const auto& r : raw) A += r.size(2) * r.size(3);
  auto out = torch::zeros({B, 4 + nc, A}, torch::kDouble);
  auto o = out.accessor<double, 3>();
  const int strides[3] = {8, 16, 32};
  for (int64_t b = 0; b < B; ++b) {
    int64_t a = 0;
    for (int l = 0; l < 3; ++l) {
      auto r = raw[l].to(torch::kDouble).contiguous();
      auto acc = r.accessor<double, 4>();
      for (int64_t y = 0; y < r.size(2); ++y) {
        for (int64_t x = 0; x < r.size(3); ++x, ++a) {
          double d[4];
          for (int side = 0; side < 4; ++side) {
            double mx = -1e300, z = 0, e = 0;
            for (int j = 0; j < 16; ++j) mx = std::max(mx, acc[b][side * 16 + j][y][x]);
            for (int j = 0; j < 16; ++j) {
              const double p = std::exp(acc[b][side * 16 + j][y][x] - mx);
              z += p;
              e += p * j;
            }
            d[side] = e / z;
          }
          const double ax = x + 0.5, ay = y + 0.5, s = strides[l];
          o[b][0][a] = (ax - d[0]) * s;
          o[b][1][a] = (ay - d[1]) * s;
          o[b][2][a] = (ax + d[2]) * s;
          o[b][3][a] = (ay + d[3]) * s;
          for (int c = 0; c < nc; ++c) o[b][4 + c][a] = 1.0 / (1.0 + std::exp(-acc[b][64 + c][y][x]));
        }
      }
    }
  }
  return out;
}

TEST(Yolo9Model, DecodeEqualsDirectComputation) {
  torch::manual_seed(3);
  const int nc = 3;
  Yolo9Model model("t", nc);
  // Non-square level maps and strongly varying logits.
  std::vector<torch::Tensor> raw = {torch::randn({2, 67, 4, 6}) * 4, torch::randn({2, 67, 2, 3}) * 4,
                                    torch::randn({2, 67, 1, 2}) * 4};
  auto expect = decode_by_hand(raw, nc);
  auto got = model.decode(raw);
  ASSERT_EQ(got.sizes().vec(), (std::vector<int64_t>{2, 7, 24 + 6 + 2}));
  EXPECT_LT((got.to(torch::kDouble) - expect).abs().max().item<double>(), 1e-4);
  // Channels-last and non-contiguous maps decode the same way; the cached grid is reused.
  std::vector<torch::Tensor> cl;
  for (const auto& r : raw) cl.push_back(r.contiguous(torch::MemoryFormat::ChannelsLast));
  EXPECT_LT((model.decode(cl).to(torch::kDouble) - expect).abs().max().item<double>(), 1e-4);
  // Double maps decode in double.
  std::vector<torch::Tensor> dbl;
  for (const auto& r : raw) dbl.push_back(r.to(torch::kDouble));
  auto got_d = model.decode(dbl);
  EXPECT_EQ(got_d.scalar_type(), torch::kDouble);
  EXPECT_LT((got_d - expect).abs().max().item<double>(), 1e-10);
}

TEST(Yolo9Model, DecodeAcrossShapesUsesTheRightGrid) {
  torch::manual_seed(4);
  Yolo9Model model("t", 1);
  auto maps = [](int64_t h, int64_t w) {
    return std::vector<torch::Tensor>{torch::randn({1, 65, h, w}), torch::randn({1, 65, h / 2, w / 2}),
                                      torch::randn({1, 65, h / 4, w / 4})};
  };
  const auto a = maps(8, 4), b = maps(4, 8), c = maps(4, 4);
  for (const auto* raw : {&a, &b, &a, &c, &b}) {
    EXPECT_LT((model.decode(*raw).to(torch::kDouble) - decode_by_hand(*raw, 1)).abs().max().item<double>(),
              1e-4);
  }
}

TEST(Yolo9Model, DecodeIgnoresAutocast) {
  torch::manual_seed(5);
  Yolo9Model model("t", 2);
  std::vector<torch::Tensor> raw = {torch::randn({1, 66, 4, 4}) * 3, torch::randn({1, 66, 2, 2}) * 3,
                                    torch::randn({1, 66, 1, 1}) * 3};
  const auto plain = model.decode(raw);
  at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
  at::autocast::set_autocast_enabled(at::kCPU, true);
  const auto under_amp = model.decode(raw);
  // bf16 maps, as an autocast forward produces them, still decode to float32 boxes.
  std::vector<torch::Tensor> half;
  for (const auto& r : raw) half.push_back(r.to(torch::kBFloat16));
  const auto from_bf16 = model.decode(half);
  at::autocast::set_autocast_enabled(at::kCPU, false);
  at::autocast::clear_cache();
  EXPECT_TRUE(torch::equal(under_amp, plain));
  EXPECT_EQ(from_bf16.scalar_type(), torch::kFloat);
  std::vector<torch::Tensor> rounded;
  for (const auto& r : half) rounded.push_back(r.to(torch::kFloat));
  EXPECT_TRUE(torch::equal(from_bf16, model.decode(rounded)));
}

// ---------------------------------------------------------------------------- family

TEST(Yolo9Family, Registry) {
  ASSERT_FALSE(models::families().empty());
  const Family& f = yolo9_family();
  EXPECT_EQ(f.name, "yolo9");
  EXPECT_EQ(f.sizes, (std::vector<std::string>{"t", "s", "m", "c"}));
  EXPECT_TRUE(f.default_amp);
  EXPECT_TRUE(f.default_sync_bn);
  EXPECT_EQ(f.task, "detect");
  EXPECT_EQ(models::find_family("nope"), nullptr);
  auto m = f.build("s", 7);
  EXPECT_EQ(m->family_name(), "yolo9");
  EXPECT_EQ(m->size(), "s");
  EXPECT_EQ(m->num_classes(), 7);
  EXPECT_EQ(m->strides(), (std::vector<int64_t>{8, 16, 32}));
}

TEST(Yolo9Family, FreezeGroupsPartitionTheParameters) {
  Yolo9Model model("t", 80);
  const auto groups = model.freeze_groups();
  ASSERT_EQ(groups.size(), 17u);
  EXPECT_EQ(groups[9], "backbone.spp");
  EXPECT_EQ(groups[16], "head");
  std::map<std::string, int> hits;
  for (const auto& p : model.named_parameters()) {
    int n = 0;
    for (const auto& g : groups) {
      if (p.key().compare(0, g.size() + 1, g + ".") == 0) {
        ++n;
        ++hits[g];
      }
    }
    EXPECT_EQ(n, 1) << p.key();
  }
  EXPECT_EQ(hits.size(), groups.size());
}

TEST(Yolo9Family, DetectsSizeAndClassesFromReferenceKeys) {
  const Family& f = yolo9_family();
  for (const std::string size : {"t", "s", "m", "c"}) {
    StateDict sd = reference_state_dict(size);
    EXPECT_EQ(models::detect_family(sd), &f) << size;
    EXPECT_EQ(f.infer_size(sd), size);
    EXPECT_EQ(f.infer_num_classes(sd), 80);
    auto built = f.build_like(sd, 80);
    EXPECT_EQ(built->size(), size);
    EXPECT_NO_THROW(models::load_state_dict(*built, sd, true)) << size;
  }
}

TEST(Yolo9Family, LegacyAndWrappedKeys) {
  const Family& f = yolo9_family();
  StateDict sd = reference_state_dict("t");
  StateDict wrapped;
  for (const auto& [k, v] : sd) {
    std::string key = k.rfind("head.", 0) == 0 ? "detect." + k.substr(5) : k;
    wrapped.emplace_back("module." + key, v);
  }
  wrapped.emplace_back("module.detect.dfl.conv.weight", torch::zeros({1, 16, 1, 1}));
  EXPECT_EQ(models::detect_family(wrapped), &f);
  EXPECT_EQ(f.infer_size(wrapped), "t");
  EXPECT_EQ(f.infer_num_classes(wrapped), 80);
  f.normalize_keys(wrapped);
  ASSERT_EQ(wrapped.size(), sd.size());
  for (size_t i = 0; i < sd.size(); ++i) EXPECT_EQ(wrapped[i].first, sd[i].first);
}

TEST(Yolo9Family, RejectsOtherFamilies) {
  const Family& f = yolo9_family();
  StateDict e2e = reference_state_dict("t");
  e2e.emplace_back("head.one2one_cv2.0.0.conv.weight", torch::zeros({64, 64, 3, 3}));
  EXPECT_FALSE(f.can_load(e2e));
  EXPECT_EQ(models::detect_family(e2e), nullptr);
  StateDict other = {{"backbone.stem.conv.weight", torch::zeros({16, 3, 3, 3})},
                     {"head.cls_preds.0.weight", torch::zeros({80, 64, 1, 1})}};
  EXPECT_EQ(models::detect_family(other), nullptr);
  EXPECT_FALSE(f.infer_size(other).has_value());
  EXPECT_FALSE(f.infer_num_classes(other).has_value());
  EXPECT_THROW(f.build_like(other, 80), ModelError);
  // Legacy class-named keys are recognised.
  StateDict legacy = {{"model.2.RepNCSPELAN4.cv1.conv.weight", torch::zeros({1})}};
  EXPECT_TRUE(f.can_load(legacy));
  // An unknown conv0 width is no size.
  StateDict odd = reference_state_dict("t");
  odd[0].second = torch::zeros({24, 3, 3, 3});
  EXPECT_FALSE(f.infer_size(odd).has_value());
}

TEST(Yolo9Family, BuildLikeKeepsHiddenWidthAndReadsClassCount) {
  const Family& f = yolo9_family();
  // A COCO t model fine-tuned to 3 classes: hc 80, nc 3.
  Yolo9Model tuned("t", 3, 80);
  const StateDict sd = models::state_dict(tuned);
  EXPECT_EQ(f.infer_num_classes(sd), 3);
  auto like = f.build_like(sd, 0);
  EXPECT_EQ(like->num_classes(), 3);
  EXPECT_EQ(dynamic_cast<Yolo9Model&>(*like).class_hidden(), 80);
  EXPECT_NO_THROW(models::load_state_dict(*like, sd, true));
  auto wider = f.build_like(sd, 10);
  EXPECT_EQ(wider->num_classes(), 10);
  EXPECT_EQ(dynamic_cast<Yolo9Model&>(*wider).class_hidden(), 80);
}

// ---------------------------------------------------------------------- weight loading

TEST(Yolo9Load, RoundTripGivesIdenticalOutputs) {
  torch::manual_seed(1);
  Yolo9Model a("t", 4);
  torch::manual_seed(2);
  Yolo9Model b("t", 4);
  // Make the BN statistics non-trivial so that buffers matter too.
  a.train();
  {
    torch::NoGradGuard ng;
    a.forward_raw(torch::rand({2, 3, 64, 64}));
  }
  auto report = models::load_state_dict(b, models::state_dict(a), true);
  EXPECT_TRUE(report.missing.empty() && report.unexpected.empty() && report.shape_mismatch.empty());
  a.eval();
  b.eval();
  torch::NoGradGuard ng;
  auto x = torch::rand({1, 3, 64, 64});
  EXPECT_TRUE(torch::equal(a.predict_tensor(x), b.predict_tensor(x)));
  // Copies, not aliases.
  EXPECT_FALSE(param(a, "backbone.conv0.conv.weight").is_same(param(b, "backbone.conv0.conv.weight")));
}

TEST(Yolo9Load, StrictReportsEveryProblemAndChangesNothing) {
  torch::manual_seed(1);
  Yolo9Model src("t", 80);
  torch::manual_seed(2);
  Yolo9Model dst("t", 80);
  const auto original = param(dst, "backbone.conv1.conv.weight").clone();

  StateDict sd = models::state_dict(src);
  sd.erase(sd.begin() + 2);  // backbone.conv0.bn.bias
  sd.emplace_back("head.extra.weight", torch::zeros({3}));
  for (auto& kv : sd) {
    if (kv.first == "head.cv3.0.2.weight") kv.second = torch::zeros({3, 80, 1, 1});
  }
  try {
    models::load_state_dict(dst, sd, true);
    FAIL() << "strict load accepted a mismatching state dict";
  } catch (const ModelError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("1 missing: backbone.conv0.bn.bias"), std::string::npos) << msg;
    EXPECT_NE(msg.find("1 unexpected: head.extra.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("head.cv3.0.2.weight: checkpoint [3, 80, 1, 1] vs model [80, 80, 1, 1]"),
              std::string::npos)
        << msg;
    EXPECT_EQ(e.exit_code(), 4);
  }
  EXPECT_TRUE(torch::equal(param(dst, "backbone.conv1.conv.weight"), original));

  // Non-strict: everything that fits is copied, the rest is reported.
  auto report = models::load_state_dict(dst, sd, false);
  EXPECT_EQ(report.missing, std::vector<std::string>{"backbone.conv0.bn.bias"});
  EXPECT_EQ(report.unexpected, std::vector<std::string>{"head.extra.weight"});
  ASSERT_EQ(report.shape_mismatch.size(), 1u);
  EXPECT_EQ(report.shape_mismatch[0].rfind("head.cv3.0.2.weight", 0), 0u);
  EXPECT_TRUE(torch::equal(param(dst, "backbone.conv1.conv.weight"),
                           param(src, "backbone.conv1.conv.weight")));
  EXPECT_FALSE(torch::equal(param(dst, "head.cv3.0.2.weight"), torch::zeros({80, 80, 1, 1})));
}
