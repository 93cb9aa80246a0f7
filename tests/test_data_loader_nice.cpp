// DataLoader worker threads run nicer than the training thread (LoaderOptions::worker_nice).
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <libreyolo/errors.hpp>
#include <sstream>
#include <thread>

#include "data/dataset_yaml.hpp"
#include "data/loader.hpp"
#include "data/synthetic.hpp"
#include "support.hpp"

namespace fs = std::filesystem;
using namespace libreyolo;
using namespace libreyolo::data;

namespace {

std::shared_ptr<const YoloDataset> tiny_dataset() {
  SyntheticOptions o;
  o.train_images = 8;
  o.val_images = 2;
  o.width = 64;
  o.height = 48;
  o.seed = 7;
  const DatasetSpec spec = load_dataset_yaml(generate_synthetic_dataset(test::temp_dir("loader_nice_ds"), o));
  DatasetOptions d;
  d.imgsz = 64;
  d.num_classes = spec.nc;
  return std::make_shared<const YoloDataset>(list_split_images(spec, "train"), d);
}

// Niceness of every thread of this process (field 19 of /proc/self/task/<tid>/stat).
std::vector<int> thread_nice_values() {
  std::vector<int> out;
  for (const auto& e : fs::directory_iterator("/proc/self/task")) {
    std::ifstream f(e.path() / "stat");
    std::string line;
    std::getline(f, line);
    const auto close = line.rfind(')');  // the command name may contain spaces
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    std::string field;
    // Fields after the name start at 3 (state); nice is field 19.
    for (int i = 3; i <= 19 && rest >> field; ++i)
      if (i == 19) out.push_back(std::stoi(field));
  }
  return out;
}

int count_equal(const std::vector<int>& v, int x) { return static_cast<int>(std::count(v.begin(), v.end(), x)); }

}  // namespace

TEST(DataLoaderNice, WorkersRunNicerThanTheTrainingThread) {
  const int base = getpriority(PRIO_PROCESS, 0);
  if (base + 3 > 19) GTEST_SKIP() << "this process already runs at niceness " << base;
  auto ds = tiny_dataset();
  const int before = count_equal(thread_nice_values(), base + 3);
  LoaderOptions o;
  o.batch = 2;
  o.workers = 3;
  o.worker_nice = 3;
  DataLoader loader(ds, o);
  (void)loader.next();  // the workers have started once a batch came out
  int nicer = 0;
  for (int i = 0; i < 200 && (nicer = count_equal(thread_nice_values(), base + 3) - before) < 3; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(nicer, 3);
  EXPECT_EQ(getpriority(PRIO_PROCESS, 0), base) << "the calling thread keeps its priority";
}

TEST(DataLoaderNice, ZeroLeavesWorkersAloneAndOutOfRangeIsRefused) {
  const int base = getpriority(PRIO_PROCESS, 0);
  auto ds = tiny_dataset();
  const auto before = thread_nice_values();
  LoaderOptions o;
  o.batch = 2;
  o.workers = 2;
  o.worker_nice = 0;
  {
    DataLoader loader(ds, o);
    (void)loader.next();
    const auto during = thread_nice_values();
    EXPECT_EQ(count_equal(during, base), count_equal(before, base) + 2);
  }
  o.worker_nice = 20;
  EXPECT_THROW(DataLoader(ds, o), UsageError);
  o.worker_nice = -1;
  EXPECT_THROW(DataLoader(ds, o), UsageError);
}
