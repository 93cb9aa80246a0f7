#include <ATen/Context.h>
#include <libreyolo/errors.hpp>
#include <set>
#include <thread>
#include <vector>

#include "core/background.hpp"
#include "core/log.hpp"
#include "support.hpp"

TEST(Core, StrfmtFormats) {
  EXPECT_EQ(libreyolo::strfmt("%d-%s-%.2f", 3, "x", 1.5), "3-x-1.50");
  std::string big(5000, 'a');
  EXPECT_EQ(libreyolo::strfmt("%s", big.c_str()).size(), 5000u);
}

TEST(Core, ErrorsCarryExitCodes) {
  EXPECT_EQ(libreyolo::UsageError("x").exit_code(), 2);
  EXPECT_EQ(libreyolo::DataError("x").exit_code(), 3);
  EXPECT_EQ(libreyolo::ModelError("x").exit_code(), 4);
  EXPECT_EQ(libreyolo::RuntimeError("x").exit_code(), 1);
}

#include "core/device.hpp"
#include "core/options.hpp"
#include "core/config_schema.hpp"
#include "core/paths.hpp"

TEST(Device, ParsesTheReferenceTable) {
  using libreyolo::parse_device_list;
  EXPECT_EQ(parse_device_list("0,1"), (std::vector<int>{0, 1}));
  EXPECT_EQ(parse_device_list("[0,1]"), (std::vector<int>{0, 1}));
  EXPECT_EQ(parse_device_list("0,1,2"), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(parse_device_list("cuda:0,1"), (std::vector<int>{1}));
  EXPECT_TRUE(parse_device_list("cuda:0,cuda:1").empty());
  EXPECT_EQ(parse_device_list("0,0"), (std::vector<int>{0, 0}));
  EXPECT_EQ(parse_device_list("cuda:3"), (std::vector<int>{3}));
  EXPECT_EQ(parse_device_list("2"), (std::vector<int>{2}));
  EXPECT_TRUE(parse_device_list("auto").empty());
  EXPECT_TRUE(parse_device_list("CPU").empty());
  EXPECT_TRUE(parse_device_list("cuda").empty());
  EXPECT_TRUE(libreyolo::wants_distributed("0,1"));
  EXPECT_FALSE(libreyolo::wants_distributed("0"));
}

TEST(Device, ResolvesSingleDevices) {
  EXPECT_TRUE(libreyolo::resolve_device("cpu").is_cpu());
  EXPECT_THROW(libreyolo::resolve_device("0,1"), libreyolo::UsageError);
  EXPECT_THROW(libreyolo::resolve_device("gpu"), libreyolo::UsageError);
  if (!torch::cuda::is_available()) {
    EXPECT_TRUE(libreyolo::resolve_device("auto").is_cpu());
    try {
      libreyolo::resolve_device("cuda:0");
      FAIL() << "expected an error";
    } catch (const libreyolo::UsageError& e) {
      EXPECT_EQ(e.code(), "device_not_available");
    }
  }
}

// The cuDNN settings a training run takes (configure_cudnn) and the environment's overrides; the
// process-wide context is put back afterwards.
TEST(Device, ConfiguresCudnnForTrainingFromTheEnvironment) {
  auto& ctx = at::globalContext();
  const bool bench = ctx.benchmarkCuDNN(), det = ctx.deterministicCuDNN();
  const int limit = ctx.benchmarkLimitCuDNN();
  {
    libreyolo::test::ScopedEnv b("LIBREYOLO_CUDNN_BENCHMARK", ""), d("LIBREYOLO_DETERMINISTIC", "");
    EXPECT_TRUE(libreyolo::configure_cudnn(true).empty());
    EXPECT_TRUE(ctx.benchmarkCuDNN());
    EXPECT_EQ(ctx.benchmarkLimitCuDNN(), libreyolo::kAutotuneCandidates);
    libreyolo::configure_cudnn(false);
    EXPECT_FALSE(ctx.benchmarkCuDNN());
  }
  {
    libreyolo::test::ScopedEnv b("LIBREYOLO_CUDNN_BENCHMARK", "0");
    const auto said = libreyolo::configure_cudnn(true);
    ASSERT_EQ(said.size(), 1u);
    EXPECT_NE(said[0].find("no autotuning"), std::string::npos) << said[0];
    EXPECT_FALSE(ctx.benchmarkCuDNN());
  }
  {
    libreyolo::test::ScopedEnv b("LIBREYOLO_CUDNN_BENCHMARK", "6");
    libreyolo::configure_cudnn(false);
    EXPECT_TRUE(ctx.benchmarkCuDNN());
    EXPECT_EQ(ctx.benchmarkLimitCuDNN(), 6);
  }
  {
    libreyolo::test::ScopedEnv b("LIBREYOLO_CUDNN_BENCHMARK", "fast");
    EXPECT_THROW(libreyolo::configure_cudnn(true), libreyolo::UsageError);
  }
  {
    libreyolo::test::ScopedEnv d("LIBREYOLO_DETERMINISTIC", "1");
    const auto said = libreyolo::configure_cudnn(true);
    EXPECT_FALSE(ctx.benchmarkCuDNN());
    EXPECT_TRUE(ctx.deterministicCuDNN());
    ASSERT_FALSE(said.empty());
    EXPECT_NE(said.back().find("deterministic"), std::string::npos);
  }
  {
    // The train option does the same, and a later run without it autotunes again.
    libreyolo::test::ScopedEnv b("LIBREYOLO_CUDNN_BENCHMARK", ""), d("LIBREYOLO_DETERMINISTIC", "");
    const auto said = libreyolo::configure_cudnn(true, /*deterministic=*/true);
    EXPECT_FALSE(ctx.benchmarkCuDNN());
    EXPECT_TRUE(ctx.deterministicCuDNN());
    ASSERT_EQ(said.size(), 1u);
    EXPECT_NE(said[0].find("deterministic=true"), std::string::npos) << said[0];
    EXPECT_TRUE(libreyolo::configure_cudnn(true).empty());
    EXPECT_TRUE(ctx.benchmarkCuDNN());
    EXPECT_FALSE(ctx.deterministicCuDNN());
  }
  ctx.setBenchmarkCuDNN(bench);
  ctx.setDeterministicCuDNN(det);
  ctx.setBenchmarkLimitCuDNN(limit);
}

// The autotuning scope around an inference shape's first run: on with its candidates, the
// environment's overrides honoured, the previous setting back afterwards (also after a throw).
TEST(Device, AutotuneScopeSetsAndRestoresCudnnBenchmark) {
  auto& ctx = at::globalContext();
  const bool bench = ctx.benchmarkCuDNN();
  const int limit = ctx.benchmarkLimitCuDNN();
  ctx.setBenchmarkCuDNN(false);
  ctx.setBenchmarkLimitCuDNN(3);
  {
    libreyolo::test::ScopedEnv b("LIBREYOLO_CUDNN_BENCHMARK", ""), d("LIBREYOLO_DETERMINISTIC", "");
    {
      libreyolo::CudnnAutotuneScope s(libreyolo::kInferenceAutotuneCandidates);
      EXPECT_TRUE(ctx.benchmarkCuDNN());
      EXPECT_EQ(ctx.benchmarkLimitCuDNN(), libreyolo::kInferenceAutotuneCandidates);
    }
    EXPECT_FALSE(ctx.benchmarkCuDNN());
    EXPECT_EQ(ctx.benchmarkLimitCuDNN(), 3);
  }
  {
    libreyolo::test::ScopedEnv b("LIBREYOLO_CUDNN_BENCHMARK", "0");
    libreyolo::CudnnAutotuneScope s(10);
    EXPECT_FALSE(ctx.benchmarkCuDNN());
  }
  {
    libreyolo::test::ScopedEnv b("LIBREYOLO_CUDNN_BENCHMARK", "7");
    libreyolo::CudnnAutotuneScope s(10);
    EXPECT_TRUE(ctx.benchmarkCuDNN());
    EXPECT_EQ(ctx.benchmarkLimitCuDNN(), 7);
  }
  {
    libreyolo::test::ScopedEnv d("LIBREYOLO_DETERMINISTIC", "1");
    libreyolo::CudnnAutotuneScope s(10);
    EXPECT_FALSE(ctx.benchmarkCuDNN());
  }
  {
    const bool det = ctx.deterministicCuDNN();
    ctx.setDeterministicCuDNN(true);
    {
      libreyolo::CudnnAutotuneScope s(10);
      EXPECT_FALSE(ctx.benchmarkCuDNN());
    }
    ctx.setDeterministicCuDNN(det);
  }
  {
    libreyolo::test::ScopedEnv b("LIBREYOLO_CUDNN_BENCHMARK", "x");
    EXPECT_THROW(libreyolo::CudnnAutotuneScope s(10), libreyolo::UsageError);
    EXPECT_FALSE(ctx.benchmarkCuDNN());  // a scope that threw changed nothing
    EXPECT_EQ(ctx.benchmarkLimitCuDNN(), 3);
  }
  ctx.setBenchmarkCuDNN(bench);
  ctx.setBenchmarkLimitCuDNN(limit);
}

TEST(Options, AppliesKeyValuesWithTypes) {
  libreyolo::TrainConfig c;
  libreyolo::train_schema().apply(c, {{"epochs", "7"}, {"lr0", "0.02"}, {"amp", "False"}, {"mosaic", "0.5"},
                                      {"--project", "x/y"}, {"no-aug-epochs", "2"}, {"reduced_decode", "false"}},
                                  "train");
  EXPECT_EQ(c.epochs, 7);
  EXPECT_FALSE(c.reduced_decode);
  libreyolo::ValConfig v;
  EXPECT_FALSE(v.reduced_decode);  // validation decodes as predict does unless asked
  libreyolo::val_schema().apply(v, {{"reduced_decode", "true"}}, "val");
  EXPECT_TRUE(v.reduced_decode);
  EXPECT_DOUBLE_EQ(c.lr0, 0.02);
  EXPECT_FALSE(c.amp);
  EXPECT_DOUBLE_EQ(c.mosaic_prob, 0.5);
  EXPECT_EQ(c.project, "x/y");
  EXPECT_EQ(c.no_aug_epochs, 2);
}

TEST(Options, UnknownKeySuggestsCloseMatch) {
  libreyolo::TrainConfig c;
  try {
    libreyolo::train_schema().apply(c, {{"epcohs", "3"}}, "train");
    FAIL() << "expected UsageError";
  } catch (const libreyolo::UsageError& e) {
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_EQ(e.code(), "config_unknown_key");
    EXPECT_NE(std::string(e.what()).find("Did you mean 'epochs'"), std::string::npos) << e.what();
  }
  try {
    libreyolo::train_schema().apply(c, {{"zzzqqq", "3"}}, "train");
    FAIL();
  } catch (const libreyolo::UsageError& e) {
    EXPECT_EQ(std::string(e.what()).find("Did you mean"), std::string::npos);
  }
}

TEST(Options, BadValuesAndRanges) {
  libreyolo::TrainConfig c;
  EXPECT_THROW(libreyolo::train_schema().apply(c, {{"epochs", "ten"}}, "train"), libreyolo::UsageError);
  EXPECT_THROW(libreyolo::train_schema().apply(c, {{"amp", "maybe"}}, "train"), libreyolo::UsageError);
  EXPECT_THROW(libreyolo::train_schema().apply(c, {{"lr0", "1e999"}}, "train"), libreyolo::UsageError);
  libreyolo::TrainConfig bad;
  bad.imgsz = 100;
  EXPECT_THROW(libreyolo::validate(bad), libreyolo::UsageError);
  bad = {};
  bad.amp_dtype = "float8";
  EXPECT_THROW(libreyolo::validate(bad), libreyolo::UsageError);
  EXPECT_NO_THROW(libreyolo::validate(libreyolo::TrainConfig{}));
  // Values of the right type that the run cannot use are refused before it starts, naming the key.
  const std::vector<std::pair<std::string, std::string>> out_of_range = {
      {"warmup_lr_start", "-1"}, {"ema_tau", "-5"},      {"eval_interval", "-1"},   {"degrees", "-3"},
      {"translate", "1.5"},      {"shear", "-1"},        {"mosaic_scale", "2,1"},   {"mosaic_scale", "0,1"},
      {"mixup_scale", "a,b"},    {"mosaic_scale", "1,2,3"}, {"mosaic_scale", "-0.5"}};
  for (const auto& [key, value] : out_of_range) {
    libreyolo::TrainConfig t;
    libreyolo::train_schema().apply(t, {{key, value}}, "train");
    try {
      libreyolo::validate(t);
      ADD_FAILURE() << key << "=" << value << " accepted";
    } catch (const libreyolo::UsageError& e) {
      EXPECT_EQ(e.code(), "config_range_error") << key << "=" << value;
      EXPECT_NE(std::string(e.what()).find("'" + key + "'"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(libreyolo::parse_scale_range("mosaic_scale", "(0.1, 2.0)"), (std::pair<double, double>{0.1, 2.0}));
  EXPECT_EQ(libreyolo::parse_scale_range("mosaic_scale", "[0.5,1.5]"), (std::pair<double, double>{0.5, 1.5}));
  EXPECT_EQ(libreyolo::parse_scale_range("mosaic_scale", "0.5"), (std::pair<double, double>{0.5, 1.5}));
}

TEST(Options, YamlDumpQuotesWhatNeedsIt) {
  libreyolo::TrainConfig c;
  c.name = "my run: 1";
  std::string y = libreyolo::to_yaml(libreyolo::train_schema(), c);
  EXPECT_NE(y.find("epochs: 300\n"), std::string::npos);
  EXPECT_NE(y.find("name: 'my run: 1'\n"), std::string::npos);
  EXPECT_NE(y.find("resume: ''\n"), std::string::npos);
}

TEST(Core, RunDirectoriesAreNumberedAndNeverShared) {
  // Eight runs asking for the same name at the same instant get eight directories: name,
  // name2, ..., name8 (mkdir is the test-and-create); exist_ok reuses the name.
  const std::string project = libreyolo::test::temp_dir("rundirs") + "/runs";
  std::vector<std::string> got(8);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < got.size(); ++i)
    threads.emplace_back([&, i] { got[i] = libreyolo::make_run_dir(project, "exp", /*exist_ok=*/false); });
  for (auto& t : threads) t.join();
  std::set<std::string> unique(got.begin(), got.end());
  EXPECT_EQ(unique.size(), got.size());
  for (int n = 1; n <= 8; ++n)
    EXPECT_TRUE(unique.count(project + "/exp" + (n == 1 ? std::string() : std::to_string(n)))) << n;
  EXPECT_EQ(libreyolo::make_run_dir(project, "exp", /*exist_ok=*/true), project + "/exp");
}

TEST(Options, OneOptionSetTwiceDifferentlyIsAConflict) {
  libreyolo::TrainConfig c;
  try {
    libreyolo::train_schema().apply(c, {{"mosaic", "0.5"}, {"mosaic_prob", "1.0"}}, "train");
    FAIL() << "expected a conflict";
  } catch (const libreyolo::UsageError& e) {
    EXPECT_EQ(e.code(), "config_conflict");
    EXPECT_NE(std::string(e.what()).find("'mosaic=0.5' and 'mosaic_prob=1.0' both set mosaic_prob"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(libreyolo::train_schema().apply(c, {{"epochs", "3"}, {"epochs", "4"}}, "train"), libreyolo::UsageError);
  // The same value twice says nothing new: accepted.
  EXPECT_NO_THROW(libreyolo::train_schema().apply(c, {{"epochs", "3"}, {"epochs", "3"}}, "train"));
  EXPECT_EQ(c.epochs, 3);
}

// Background work (core/background.hpp) stops when the last hold ends, not before, and a stop
// function runs once per stop.
namespace {
int background_stops = 0;
}
TEST(BackgroundWork, TheLastHoldStopsIt) {
  static const bool registered = [] {
    libreyolo::on_background_stop([] { ++background_stops; });
    return true;
  }();
  (void)registered;
  libreyolo::stop_background_work();  // holds of other tests may be alive: count from here
  const int before = background_stops;
  {
    libreyolo::BackgroundWorkHold a;
    {
      libreyolo::BackgroundWorkHold b = a;
      (void)b;
    }
    EXPECT_EQ(background_stops, before) << "a hold ended while another was alive";
  }
  EXPECT_EQ(background_stops, before + 1);
  libreyolo::stop_background_work();
  EXPECT_EQ(background_stops, before + 2);
}
