// End-to-end training throughput: the real trainer (loader threads, mosaic, EMA, AMP, no
// validation) on synthetic 810x1080 JPEGs, as the reference's 246 ms/iteration (65 img/s) was
// measured (LibreYOLO 1.6.0 on the H200 machine).
//   bench_train_e2e --device cuda [--images 1024] [--epochs 2] [--batch 16] [--imgsz 640]
//                   [--workers 8,16] [--amp-dtype float16|bfloat16] [--model yolo9t] [--dir /tmp/...]
//                   [--profile off,on,off,on] [--cuda-graph off,on]
// --profile runs each worker count once per listed mode, in that order, in this one process:
// "off" is a plain run (no profiler hook at all), "on" runs profile=true (warm-up 5, window 20,
// trace written, then the hook removes itself). Epochs after the first show the cost that stays
// once the window is over (none expected); the first epoch's difference is the window's own cost.
#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include <libreyolo/libreyolo.hpp>

#include "bench_util.hpp"
#include "data/synthetic.hpp"
#include "layers/cudnn_fusion.hpp"

namespace {
// Seconds from the train() call to the end of each of the first steps (device work included):
// the start-up cost a fresh process pays (cuDNN autotuning, graph capture, loader warm-up).
// Also where the first step's time goes: the set-up before the loop (before_train), then each phase of
// the first step, the device synchronised at each phase's end (so a phase holds its own device work).
struct FirstSteps : libreyolo::TrainHook {
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now(), phase_t0;
  std::vector<double> at;
  double setup_s = -1;
  nlohmann::json first_step_phases = nlohmann::json::object();
  torch::Device device{torch::kCPU};
  double since(std::chrono::steady_clock::time_point t) const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  }
  void before_train(libreyolo::TrainState&) override { setup_s = since(t0); }
  bool observes_phases() const override { return at.empty(); }
  void phase_begin(libreyolo::TrainState&, libreyolo::Phase) override {
    if (device.is_cuda()) torch::cuda::synchronize();
    phase_t0 = std::chrono::steady_clock::now();
  }
  void phase_end(libreyolo::TrainState&, libreyolo::Phase p) override {
    if (device.is_cuda()) torch::cuda::synchronize();
    first_step_phases[libreyolo::phase_name(p)] = since(phase_t0);
  }
  void after_step(libreyolo::TrainState&) override {
    if (at.size() >= 5) return;
    if (device.is_cuda()) torch::cuda::synchronize();
    at.push_back(since(t0));
  }
  bool finished() const override { return at.size() >= 5; }
  std::string name() const override { return "first_steps"; }
};
}  // namespace

int main(int argc, char** argv) {
  std::string device = "cpu", workers = "8,16", amp_dtype = "float16", model = "yolo9t", profile = "off",
              graphs = "off";
  std::string dir = (std::filesystem::temp_directory_path() / "libreyolo_e2e_810x1080").string();
  int images = 1024, epochs = 2, batch = 16, imgsz = 640;
  std::vector<std::string> extra;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--device") device = val();
    else if (a == "--images") images = std::stoi(val());
    else if (a == "--epochs") epochs = std::stoi(val());
    else if (a == "--batch") batch = std::stoi(val());
    else if (a == "--imgsz") imgsz = std::stoi(val());
    else if (a == "--workers") workers = val();
    else if (a == "--amp-dtype") amp_dtype = val();
    else if (a == "--model") model = val();
    else if (a == "--dir") dir = val();
    else if (a == "--profile") profile = val();
    else if (a == "--cuda-graph") graphs = val();
    else if (a == "--set") extra.push_back(val());  // key=value: one more training option
    else if (a == "--sizes" || a == "--batches" || a == "--dtypes") val();
    else {
      std::cerr << "unknown argument " << a << "\n";
      return 2;
    }
  }
  libreyolo::data::SyntheticOptions so;
  so.train_images = images;
  so.val_images = 1;
  so.width = 810;
  so.height = 1080;
  so.num_classes = 8;
  so.min_objects = 2;
  so.max_objects = 12;
  so.min_size = 0.05;
  so.max_size = 0.3;
  auto t0 = std::chrono::steady_clock::now();
  std::string yaml = libreyolo::data::generate_synthetic_dataset(dir, so);
  double gen_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  nlohmann::json out = {{"benchmark", "train_e2e"}, {"device", device}, {"model", model}, {"images", images},
                        {"image_size", "810x1080"}, {"batch", batch}, {"imgsz", imgsz}, {"epochs", epochs},
                        {"amp_dtype", amp_dtype}, {"dataset_generation_s", gen_s}, {"runs", nlohmann::json::array()}};
  using libreyolo::bench::split;
  int run_i = 0;
  for (const std::string& w : split(workers)) {
    for (const std::string& gm : split(graphs))
    for (const std::string& mode : split(profile)) {
      if (mode != "off" && mode != "on") {
        std::cerr << "--profile takes off/on items, got " << mode << "\n";
        return 2;
      }
      // Several GPUs ("0,1"): the model is loaded on the CPU and train() spawns one worker per GPU;
      // the epochs then come back in the result (the callbacks run in rank 0's worker).
      const bool multi = device.find(',') != std::string::npos;
      libreyolo::LibreYOLO m(model, multi ? "cpu" : device);
      std::vector<libreyolo::EpochSummary> eps;
      libreyolo::TrainCallbacks cb;
      cb.on_epoch_end = [&](const libreyolo::EpochSummary& e) { eps.push_back(e); };
      const std::string name = "w" + w + "_g" + gm + "_p" + mode + std::to_string(run_i++);
      libreyolo::Kwargs opts = {
          {"data", yaml}, {"epochs", std::to_string(epochs)}, {"batch", std::to_string(batch)},
          {"imgsz", std::to_string(imgsz)}, {"workers", w}, {"device", device}, {"amp", "true"},
          {"amp_dtype", amp_dtype}, {"val", "false"}, {"no_aug_epochs", "0"}, {"ema", "true"},
          {"project", dir + "/runs"}, {"name", name}, {"exist_ok", "true"}, {"verbose", "true"}};
      if (gm == "on") opts.emplace_back("cuda_graph", "true");
      for (const auto& kv : extra) {
        const size_t eq = kv.find('=');
        if (eq != std::string::npos) opts.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
      }
      if (mode == "on") {
        opts.emplace_back("profile", "true");
        opts.emplace_back("profile_open", "false");
      }
      auto first = std::make_shared<FirstSteps>();
      first->device = device == "cpu" ? torch::Device(torch::kCPU) : torch::Device(torch::kCUDA, 0);
      const auto plans_before = libreyolo::models::cudnn_fusion_stats();
      auto r = m.train(opts, cb, {first});
      const auto plans_after = libreyolo::models::cudnn_fusion_stats();
      bool graphed = gm == "on";  // --cuda-graph on, or --set cuda_graph=true
      for (const auto& kv : extra)
        if (kv == "cuda_graph=true" || kv == "cuda_graph=1") graphed = true;
      nlohmann::json run = {{"workers", std::stoi(w)}, {"cuda_graph", graphed}, {"profile", mode},
                            {"run_in_process", run_i}, {"first_steps_s", first->at},
                            {"setup_s", first->setup_s}, {"first_step_phases_s", first->first_step_phases},
                            // cuDNN plans of this run (layers/cudnn_fusion.hpp): how many, how many read
                            // from the disk cache, and the seconds spent choosing (timing) or loading them.
                            {"cudnn_plans", {{"planned", plans_after.fused - plans_before.fused},
                                             {"from_disk", plans_after.loaded - plans_before.loaded},
                                             {"declined", plans_after.declined - plans_before.declined},
                                             // run first on the heuristics' plan while a worker timed
                                             // the candidates, and of those adopted since
                                             {"provisional", plans_after.provisional - plans_before.provisional},
                                             {"adopted", plans_after.adopted - plans_before.adopted},
                                             {"worker_seconds", (plans_after.timing_ms - plans_before.timing_ms) / 1000.0},
                                             {"seconds", (plans_after.build_ms - plans_before.build_ms) / 1000.0}}},
                            {"epochs", nlohmann::json::array()}};
      const int iters = images / batch;
      if (eps.empty()) eps = r.epochs;
      for (const auto& e : eps)
        run["epochs"].push_back({{"epoch", e.epoch}, {"seconds", e.seconds}, {"iteration_ms", 1000.0 * e.seconds / iters},
                                 {"img_per_s", static_cast<double>(iters) * batch / e.seconds}, {"loss", e.loss}});
      if (mode == "on") {
        const std::filesystem::path ps = std::filesystem::path(dir) / "runs" / name / "profile_summary.json";
        if (std::filesystem::exists(ps)) {
          std::ifstream in(ps);
          const auto js = nlohmann::json::parse(in, nullptr, false);
          if (!js.is_discarded()) {
            run["profile_bound"] = js.value("bound", "");
            if (js.contains("real")) run["profile_real"] = js["real"];
          }
        }
      }
      out["runs"].push_back(run);
      std::cerr << run.dump() << "\n";
    }
  }
  std::cout << out.dump(2) << "\n";
  return 0;
}
