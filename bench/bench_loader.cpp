// Data loader throughput: training images per second (mosaic + HSV + flip at imgsz) by worker
// thread count, over synthetic 1080 x 810 JPEGs generated into a temporary directory.
//
//   bench_loader [--count 256] [--threads 1,2,4] [--imgsz 640] [--batch 16] [--cache none|ram|disk]
//                [--no-mosaic] [--mixup P] [--dir DIR (reuse or keep the images)] [--stages]
//                [--exact-decode] [--gpu]
// Prints one JSON object on stdout. --exact-decode turns reduced decoding off (DatasetOptions::
// reduced_decode): every image decoded at full size and resized as the reference does, mosaic
// tiles included; the default decodes at the JPEG DCT scale covering imgsz.
//
// --stages adds "stages": one pass over the epoch on the calling thread alone (workers = 0) with
// the pipeline's stage timers on (data/stage_timer.hpp), reported as mean milliseconds per
// training sample for each stage (decode, resize, mosaic placement, mosaic drawing,
// letterbox/HSV/flip, mixup, collate, pin; see stage_timer.hpp for what each covers), their
// calls per sample, the measured wall time per
// sample, what the stages leave unaccounted ("other": labels, RNG, bookkeeping) and a hash of
// the batches (to check that a faster build makes the same samples). The timed functions are
// the production ones, called by the loader as in training.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "core/log.hpp"
#include "core/paths.hpp"
#include "data/dataset_yaml.hpp"
#include "data/loader.hpp"
#include "data/stage_timer.hpp"
#include "data/synthetic.hpp"

namespace fs = std::filesystem;
using namespace libreyolo;
using namespace libreyolo::data;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "bench_loader: %s\nusage: bench_loader [--count N] [--threads 1,2,4] [--imgsz S] "
               "[--batch B] [--cache none|ram|disk] [--no-mosaic] [--mixup P] [--dir DIR] [--stages]\n"
               "       [--exact-decode] [--gpu]\n",
               why.c_str());
  std::exit(2);
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    try {
      out.push_back(std::stoi(item));
    } catch (...) {
      usage("bad thread list '" + s + "'");
    }
    if (out.back() < 0) usage("thread counts must be >= 0");
  }
  if (out.empty()) usage("empty thread list");
  return out;
}

// One epoch on the calling thread with the stage timers on; a JSON object.
std::string stage_report(const std::shared_ptr<const YoloDataset>& ds, int batch, bool mosaic, double mixup,
                         bool gpu) {
  LoaderOptions o;
  o.gpu = gpu ? 0 : -1;
  o.batch = batch;
  o.workers = 0;
  o.seed = 1;
  o.augment.mixup_prob = mixup;
  DataLoader loader(ds, o);
  loader.set_mosaic(mosaic);
  loader.set_epoch(0);
  if (!loader.next()) usage("count must be at least one batch");  // warm-up, not timed
  StageTimes times;
  set_stage_sink(&times);
  const auto t0 = Clock::now();
  int64_t images = 0;
  // FNV-1a over every image and target byte of the timed batches (outside the stage timers):
  // equal between two builds means the pipeline's output did not change.
  uint64_t hash = 1469598103934665603ull;
  double hash_s = 0;
  while (auto b = loader.next()) {
    images += b->images.size(0);
    const auto th = Clock::now();
    for (const torch::Tensor& t : {b->images.cpu(), b->targets}) {
      const auto* p = static_cast<const uint8_t*>(t.data_ptr());
      for (size_t i = 0, n = static_cast<size_t>(t.nbytes()); i < n; ++i) hash = (hash ^ p[i]) * 1099511628211ull;
    }
    hash_s += seconds_since(th);
  }
  const double wall = seconds_since(t0) - hash_s;
  set_stage_sink(nullptr);
  if (images == 0) usage("count must be at least two batches for --stages");
  std::string per_stage;
  double accounted = 0;
  for (int k = 0; k < static_cast<int>(Stage::kCount); ++k) {
    const double ms = 1e3 * times.seconds[static_cast<size_t>(k)] / static_cast<double>(images);
    accounted += ms;
    per_stage += strfmt("%s\"%s\": {\"ms_per_sample\": %.4f, \"calls_per_sample\": %.4f}",
                        per_stage.empty() ? "" : ", ", stage_name(static_cast<Stage>(k)), ms,
                        static_cast<double>(times.calls[static_cast<size_t>(k)]) / static_cast<double>(images));
  }
  const double total = 1e3 * wall / static_cast<double>(images);
  return strfmt("{\"threads\": 1, \"images\": %lld, \"pinned\": %s, \"ms_per_sample\": {%s}, "
                "\"other_ms_per_sample\": %.4f, \"wall_ms_per_sample\": %.4f, \"img_per_s\": %.2f, "
                "\"output_hash\": \"%016llx\"}",
                static_cast<long long>(images), loader.pinned() ? "true" : "false", per_stage.c_str(),
                total - accounted, total, 1e3 / total, static_cast<unsigned long long>(hash));
}

}  // namespace

int main(int argc, char** argv) {
  int count = 256, imgsz = 640, batch = 16;
  std::vector<int> threads = {1, 2, 4};
  std::string cache = "none", dir;
  bool mosaic = true, stages = false, exact_decode = false, gpu = false;
  double mixup = 0.0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage("missing value for " + a);
      return argv[++i];
    };
    try {
      if (a == "--count") count = std::stoi(value());
      else if (a == "--threads") threads = parse_list(value());
      else if (a == "--imgsz") imgsz = std::stoi(value());
      else if (a == "--batch") batch = std::stoi(value());
      else if (a == "--cache") cache = value();
      else if (a == "--dir") dir = value();
      else if (a == "--no-mosaic") mosaic = false;
      else if (a == "--mixup") mixup = std::stod(value());
      else if (a == "--stages") stages = true;
      else if (a == "--exact-decode") exact_decode = true;
      else if (a == "--gpu") gpu = true;
      else usage("unknown flag " + a);
    } catch (const std::logic_error&) {
      usage("bad value for " + a);
    }
  }
  if (count < 1 || imgsz < 32 || batch < 1) usage("need count >= 1, imgsz >= 32, batch >= 1");
  if (!(mixup >= 0.0 && mixup <= 1.0)) usage("mixup must be in [0, 1]");
  if (cache != "none" && cache != "ram" && cache != "disk") usage("cache must be none, ram or disk");
  set_log_level(LogLevel::Warning);

  bool temp = false;
  if (dir.empty()) {
    dir = (fs::temp_directory_path() / ("libreyolo_bench_loader_" + std::to_string(getpid()))).string();
    temp = true;
  }
  try {
    const auto t_gen = Clock::now();
    const fs::path yaml = fs::path(dir) / "data.yaml";
    bool generated = false;
    if (!fs::exists(yaml) ||
        list_split_images(load_dataset_yaml(yaml.string()), "train").size() != static_cast<size_t>(count)) {
      SyntheticOptions o;
      o.train_images = count;
      o.val_images = 1;
      o.width = 1080;
      o.height = 810;
      o.num_classes = 8;
      o.max_objects = 8;
      o.min_size = 0.05;
      o.max_size = 0.3;
      generate_synthetic_dataset(dir, o);
      generated = true;
    }
    const double gen_s = seconds_since(t_gen);

    const auto t_index = Clock::now();
    DatasetOptions d;
    d.imgsz = imgsz;
    d.reduced_decode = !exact_decode;
    d.cache = cache == "ram" ? CacheMode::Ram : cache == "disk" ? CacheMode::Disk : CacheMode::None;
    auto ds = std::make_shared<const YoloDataset>(
        list_split_images(load_dataset_yaml(yaml.string()), "train"), d);
    const double index_s = seconds_since(t_index);

    std::string results;
    for (int t : threads) {
      LoaderOptions o;
      o.batch = batch;
      o.workers = t;
      o.seed = 1;
      o.augment.mixup_prob = mixup;
      o.gpu = gpu ? 0 : -1;  // the GPU loader: nvJPEG decode and drawing on device 0
      DataLoader loader(ds, o);
      loader.set_mosaic(mosaic);
      loader.set_epoch(0);
      // The first batch includes thread start-up and first touches of memory: not timed.
      if (!loader.next()) usage("count must be at least one batch");
      const auto t0 = Clock::now();
      int64_t images = 0, batches = 0;
      while (auto b = loader.next()) {
        images += b->images.size(0);
        ++batches;
      }
      const double s = seconds_since(t0);
      results += strfmt("%s{\"workers\": %d, \"batches\": %lld, \"images\": %lld, \"seconds\": %.4f, "
                        "\"img_per_s\": %.2f}",
                        results.empty() ? "" : ", ", t, static_cast<long long>(batches),
                        static_cast<long long>(images), s, images > 0 ? images / s : 0.0);
    }
    const std::string stage_json = stages ? ", \"stages\": " + stage_report(ds, batch, mosaic, mixup, gpu) : "";
    std::printf(
        "{\"bench\": \"loader\", \"count\": %d, \"image_wh\": [1080, 810], \"imgsz\": %d, "
        "\"batch\": %d, \"gpu\": %s, \"mosaic\": %s, \"mixup\": %g, \"cache\": \"%s\", \"exact_decode\": %s, \"generated\": %s, "
        "\"gen_s\": %.3f, \"index_s\": %.3f, \"hardware_threads\": %u, \"results\": [%s]%s}\n",
        count, imgsz, batch, gpu ? "true" : "false", mosaic ? "true" : "false", mixup, cache.c_str(), exact_decode ? "true" : "false", generated ? "true" : "false",
        gen_s, index_s, std::thread::hardware_concurrency(), results.c_str(), stage_json.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_loader: %s\n", e.what());
    if (temp) remove_tree(dir);
    return 1;
  }
  if (temp) remove_tree(dir);
  return 0;
}
