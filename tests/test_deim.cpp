// DEIM and RT-DETRv4, the D-FINE line's two other families (their parity with the reference is in
// test_dfine_parity.cpp, DfineLineParity/deim): names and sizes, the network (D-FINE's tensors,
// SiLU in the decoder), the recipe (DEIM's learning rates with the backbone's fraction by size,
// RT-DETRv4's own rate, decay and length, AMP off with its reason), the loss terms, a short run
// whose checkpoint loads back as its family, and how weights without a family name are told apart
// (raw RT-DETRv4 files by their distillation projector; DEIMv2's, which this build has no family
// for, refused as no family's).
#include <cmath>
#include <filesystem>

#include <libreyolo/errors.hpp>
#include <libreyolo/libreyolo.hpp>

#include "data/synthetic.hpp"
#include "families/rtdetr/dfine.hpp"
#include "io/checkpoint.hpp"
#include "io/pickle.hpp"
#include "loss/loss.hpp"
#include "models/detector.hpp"
#include "models/loaded_model.hpp"
#include "support.hpp"

namespace fs = std::filesystem;
namespace models = libreyolo::models;
namespace rtdetr = libreyolo::models::rtdetr;

namespace {

std::string synthetic_yaml(const std::string& tag, int train_images, int side = 128) {
  libreyolo::data::SyntheticOptions o;
  o.train_images = train_images;
  o.val_images = 2;
  o.width = o.height = side;
  o.num_classes = 2;
  o.threads = 1;
  return libreyolo::data::generate_synthetic_dataset(libreyolo::test::temp_dir(tag) + "/data", o);
}

}  // namespace

TEST(DeimFamilies, NamesSizesAndNetworks) {
  const models::Family* deim = models::find_family("deim");
  const models::Family* v4 = models::find_family("rtdetrv4");
  ASSERT_NE(deim, nullptr);
  ASSERT_NE(v4, nullptr);
  EXPECT_EQ(deim->sizes, (std::vector<std::string>{"n", "s", "m", "l", "x"}));
  EXPECT_EQ(v4->sizes, (std::vector<std::string>{"s", "m", "l", "x"}));
  for (const char* name : {"deim-s", "deims", "LibreDEIMn", "rtdetrv4-s", "rtdetrv4m"}) {
    libreyolo::LibreYOLO m(name, "cpu");
    const std::string fam = m.info().family;
    EXPECT_TRUE(fam == "deim" || fam == "rtdetrv4") << name << " -> " << fam;
  }
  EXPECT_EQ(libreyolo::LibreYOLO("rtdetrv4-l", "cpu").info().family, "rtdetrv4");
  EXPECT_THROW(libreyolo::LibreYOLO("rtdetrv4-n", "cpu"), libreyolo::Error);
  // D-FINE's tensors under D-FINE's names (the reference's size-s listing), SiLU in the decoder.
  const auto listing = libreyolo::test::read_state_dict_tsv("dfine_state_dict_s_nc80.tsv");
  for (const models::Family* f : {deim, v4}) {
    auto m = f->build("s", 80);
    const auto* net = dynamic_cast<rtdetr::DfineModel*>(m.get());
    ASSERT_NE(net, nullptr) << f->name;
    EXPECT_TRUE(net->config().silu) << f->name;
    const auto sd = models::state_dict(*m);
    ASSERT_EQ(sd.size(), listing.size()) << f->name;
    for (size_t i = 0; i < sd.size(); ++i) {
      EXPECT_EQ(sd[i].first, listing[i].key) << f->name << " " << i;
      EXPECT_EQ(sd[i].second.sizes().vec(), listing[i].shape) << sd[i].first;
    }
    EXPECT_EQ(f->make_loss(*m)->term_names(), (std::vector<std::string>{"mal", "bbox", "giou", "fgl", "ddf"}));
  }
  EXPECT_FALSE(dynamic_cast<rtdetr::DfineModel*>(models::find_family("dfine")->build("s", 80).get())->config().silu);
}

TEST(DeimFamilies, RecipesBySizeAndAmpOffWithTheReason) {
  // 256 px: size n's two levels need 300 encoder positions.
  const std::string yaml = synthetic_yaml("deim_recipe", 2, 256);
  const libreyolo::Kwargs base = {{"data", yaml}, {"device", "cpu"}, {"workers", "0"}, {"imgsz", "256"}};
  struct Want {
    const char* family;
    const char* size;
    double lr0, weight_decay, backbone_mult;
    int epochs;
  };
  for (const Want& w : {Want{"deim", "n", 1e-4, 1e-4, 0.5, 132}, Want{"deim", "m", 1e-4, 1e-4, 0.1, 132},
                        Want{"deim", "x", 1e-4, 1e-4, 0.01, 132}, Want{"rtdetrv4", "s", 5e-4, 1.25e-4, 0.5, 58},
                        Want{"rtdetrv4", "l", 5e-4, 1.25e-4, 0.05, 58}}) {
    libreyolo::LibreYOLO model = libreyolo::LibreYOLO::create(w.family, w.size, 2, "cpu");
    const auto info = model.info();
    EXPECT_FALSE(info.amp_default) << w.family;
    EXPECT_NE(info.amp_default_reason.find("65504"), std::string::npos) << info.amp_default_reason;
    const auto cfg = model.check_train(base);
    const std::string what = std::string(w.family) + "-" + w.size;
    EXPECT_FALSE(cfg.amp) << what;
    EXPECT_EQ(cfg.optimizer, "adamw") << what;
    EXPECT_DOUBLE_EQ(cfg.lr0, w.lr0) << what;
    EXPECT_DOUBLE_EQ(cfg.weight_decay, w.weight_decay) << what;
    EXPECT_DOUBLE_EQ(cfg.backbone_lr_mult, w.backbone_mult) << what;
    EXPECT_DOUBLE_EQ(cfg.lr_backbone, 0.0) << what;
    EXPECT_EQ(cfg.epochs, w.epochs) << what;
    EXPECT_EQ(cfg.no_aug_epochs, 12) << what;
    EXPECT_EQ(cfg.scheduler, "flat_cosine") << what;
    EXPECT_DOUBLE_EQ(cfg.min_lr_ratio, 0.05) << what;
    // The caller's values win over the size's (each dry run measures the network's memory with
    // five forwards: checked on the first of each family only).
    if (std::string(w.size) != "n" && std::string(w.size) != "s") continue;
    auto mine = base;
    mine.emplace_back("backbone_lr_mult", "0.25");
    mine.emplace_back("amp", "true");
    const auto given = model.check_train(mine);
    EXPECT_DOUBLE_EQ(given.backbone_lr_mult, 0.25) << what;
    EXPECT_TRUE(given.amp) << what;
  }
}

TEST(DeimFamilies, AShortRunSavesACheckpointThatLoadsBackAsItsFamily) {
  const std::string yaml = synthetic_yaml("deim_train", 4);
  const std::string project = libreyolo::test::temp_dir("deim_runs");
  libreyolo::LibreYOLO model = libreyolo::LibreYOLO::create("deim", "s", 2, "cpu");
  const libreyolo::Kwargs kw = {{"data", yaml},       {"epochs", "1"},      {"batch", "2"},     {"imgsz", "128"},
                                {"workers", "0"},     {"device", "cpu"},    {"project", project}, {"name", "run"},
                                {"exist_ok", "true"}, {"verbose", "false"}, {"save_period", "0"}};
  const auto r = model.train(kw);
  ASSERT_EQ(r.epochs.size(), 1u);
  EXPECT_TRUE(std::isfinite(r.epochs[0].loss));
  EXPECT_GT(r.epochs[0].loss_term("mal", -1), 0.0);
  EXPECT_LT(r.epochs[0].loss_term("vfl", -1), 0.0) << "DEIM has no varifocal term";
  const fs::path last = fs::path(project) / "run" / "weights" / "last.pt";
  ASSERT_TRUE(fs::exists(last));
  const auto ck = libreyolo::io::read_checkpoint(last.string());
  EXPECT_EQ(ck.root->get("model_family")->as_string(), "deim");
  libreyolo::LibreYOLO trained(last.string(), "cpu");
  EXPECT_EQ(trained.info().family, "deim");
  EXPECT_EQ(trained.info().size, "s");
  EXPECT_EQ(trained.info().num_classes, 2);
}

TEST(DeimFamilies, WeightsWithoutAFamilyName) {
  // D-FINE-keyed weights are D-FINE's: DEIM's and RT-DETRv4's differ only in activations, which
  // the weights do not record (their checkpoints name the family).
  auto sd = models::state_dict(*models::find_family("deim")->build("s", 3));
  EXPECT_EQ(models::detect_family(sd), models::find_family("dfine"));
  // A raw RT-DETRv4 training file keeps its distillation projector: RT-DETRv4's; the projector is
  // dropped on loading and the rest loads strictly.
  sd.emplace_back("encoder.feature_projector.0.weight", torch::zeros({4, 4}));
  sd.emplace_back("encoder.feature_projector.0.bias", torch::zeros({4}));
  const models::Family* f = models::detect_family(sd);
  ASSERT_EQ(f, models::find_family("rtdetrv4"));
  EXPECT_FALSE(models::find_family("dfine")->can_load(sd));
  EXPECT_FALSE(models::find_family("deim")->can_load(sd));
  auto cleaned = sd;
  f->normalize_keys(cleaned);
  EXPECT_EQ(cleaned.size(), sd.size() - 2);
  auto m = f->build_like(cleaned, 0);
  EXPECT_NO_THROW(models::load_state_dict(*m, cleaned, /*strict=*/true));
  EXPECT_EQ(m->num_classes(), 3);
  EXPECT_EQ(f->infer_size(cleaned), std::optional<std::string>("s"));
}

// This build has no DEIMv2 family. Its weights (every size's listing from LibreYOLO 1.6.0,
// tests/python/make_deimv2_state_dicts.py: HGNetv2 or DINOv3 backbones under the DEIM decoder's
// keys) are claimed by no family, and loading them says so: with their model_family, that the
// family is not supported; without one, that no family recognises them (not a D-FINE error about
// widths or the class count).
TEST(DeimFamilies, DeimV2WeightsAreRefusedWithAClearMessage) {
  const auto refusal = [](const libreyolo::io::PyValuePtr& root) -> std::string {
    try {
      models::model_from_checkpoint(root, "deimv2.pt");
    } catch (const libreyolo::ModelError& e) {
      return std::string(e.code()) + ": " + e.what();
    }
    return "loaded";
  };
  for (const std::string size : {"atto", "femto", "pico", "n", "s", "m", "l", "x"}) {
    const auto sd = libreyolo::test::reference_state_dict_tsv("deimv2_state_dict_" + size + "_nc80.tsv");
    const models::Family* f = models::detect_family(sd);
    EXPECT_EQ(f, nullptr) << size << " taken for " << f->name << "'s";
    libreyolo::io::CheckpointMeta meta;
    meta.family = "deimv2";
    meta.size = size;
    meta.task = "detect";
    meta.nc = 80;
    meta.names = std::vector<std::string>(80, "c");
    meta.imgsz = 640;
    const auto named = libreyolo::io::make_checkpoint(sd, meta);
    EXPECT_EQ(refusal(named), "model_family_mismatch: deimv2.pt: model_family 'deimv2' is not supported by this build")
        << size;
    auto raw = libreyolo::io::PyValue::new_dict();
    raw->dict.emplace_back(libreyolo::io::PyValue::from_string("model"), named->get("model"));
    EXPECT_EQ(refusal(raw), "model_load_failed: deimv2.pt: cannot tell which model family these weights belong to")
        << size;
  }
}
