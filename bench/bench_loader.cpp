// Data loader throughput: training images per second (mosaic + HSV + flip at imgsz) by worker
// thread count, over synthetic 1080 x 810 JPEGs generated into a temporary directory.
//
//   bench_loader [--count 256] [--threads 1,2,4] [--imgsz 640] [--batch 16] [--cache none|ram|disk]
//                [--no-mosaic] [--dir DIR (reuse or keep the images)]
// Prints one JSON object on stdout.
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
               "[--batch B] [--cache none|ram|disk] [--no-mosaic] [--dir DIR]\n",
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

}  // namespace

int main(int argc, char** argv) {
  int count = 256, imgsz = 640, batch = 16;
  std::vector<int> threads = {1, 2, 4};
  std::string cache = "none", dir;
  bool mosaic = true;
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
      else usage("unknown flag " + a);
    } catch (const std::logic_error&) {
      usage("bad value for " + a);
    }
  }
  if (count < 1 || imgsz < 32 || batch < 1) usage("need count >= 1, imgsz >= 32, batch >= 1");
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
    std::printf(
        "{\"bench\": \"loader\", \"count\": %d, \"image_wh\": [1080, 810], \"imgsz\": %d, "
        "\"batch\": %d, \"mosaic\": %s, \"cache\": \"%s\", \"generated\": %s, \"gen_s\": %.3f, "
        "\"index_s\": %.3f, \"hardware_threads\": %u, \"results\": [%s]}\n",
        count, imgsz, batch, mosaic ? "true" : "false", cache.c_str(), generated ? "true" : "false",
        gen_s, index_s, std::thread::hardware_concurrency(), results.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_loader: %s\n", e.what());
    if (temp) remove_tree(dir);
    return 1;
  }
  if (temp) remove_tree(dir);
  return 0;
}
