// CPU trainings share the cores: each registration lowers the others' share, an ended one (or
// one whose process is gone) gives its share back.
#include <gtest/gtest.h>

#include <sched.h>
#include <unistd.h>

#include <filesystem>
#include <algorithm>
#include <fstream>
#include <memory>
#include <regex>

#include "core/cpu_share.hpp"
#include "data/synthetic.hpp"
#include "support.hpp"

using namespace libreyolo;
namespace fs = std::filesystem;

TEST(CpuShare, TrainingsSplitTheCoresAndGiveThemBack) {
  const std::string folder = test::temp_dir("cpu_share");
  auto a = std::make_unique<CpuShare>(4, folder);
  EXPECT_EQ(a->trainings(), 1);
  EXPECT_EQ(a->cores(), 4);
  {
    CpuShare b(4, folder);
    EXPECT_EQ(a->trainings(), 2);
    EXPECT_EQ(a->cores(), 2);
    EXPECT_EQ(b.cores(), 2);
    CpuShare c(4, folder), d(4, folder), e(4, folder);
    EXPECT_EQ(a->cores(), 1);  // never below one
  }
  EXPECT_EQ(a->cores(), 4);
  // A registration left by a process that no longer runs is removed, not counted: the largest
  // pid the kernel hands out, plus one, is never a running process.
  long pid_max = 4194304;
  std::ifstream("/proc/sys/kernel/pid_max") >> pid_max;
  const fs::path stale = fs::path(folder) / (std::to_string(pid_max + 1) + ".0");
  std::ofstream(stale) << "2\n";
  EXPECT_EQ(a->trainings(), 1);
  EXPECT_FALSE(fs::exists(stale));
  // A running process's registration counts (this process's own pid, another number).
  const fs::path other = fs::path(folder) / (std::to_string(getpid()) + ".999999");
  std::ofstream(other) << "2\n";
  EXPECT_EQ(a->trainings(), 2);
  fs::remove(other);
  a.reset();
  EXPECT_TRUE(fs::is_empty(folder)) << "a training's registration outlives it";
}

TEST(CpuShare, AvailableCoresFollowTheAffinityMask) {
  cpu_set_t saved;
  ASSERT_EQ(sched_getaffinity(0, sizeof(saved), &saved), 0);
  const int n = available_cores();
  EXPECT_EQ(n, CPU_COUNT(&saved));
  // Pinned to one core, the process has one.
  cpu_set_t one;
  CPU_ZERO(&one);
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &saved)) {
      CPU_SET(c, &one);
      break;
    }
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  EXPECT_EQ(available_cores(), 1);
  ASSERT_EQ(sched_setaffinity(0, sizeof(saved), &saved), 0);
}

// The trainer takes its share: with another CPU training registered (a registration of this test's
// own, running, process), a training plans half the cores and says so, and, unless the environment
// already has OpenMP's waiting threads sleep, says how to.
TEST(CpuShare, ATrainingTakesItsShareWhenAnotherRuns) {
  const std::string tmp = test::temp_dir("cpu_share_cli");
  data::SyntheticOptions o;
  o.train_images = 4;
  o.val_images = 2;
  o.width = o.height = 64;
  o.num_classes = 2;
  o.threads = 1;
  const std::string yaml = data::generate_synthetic_dataset((fs::path(tmp) / "data").string(), o);
  const CpuShare probe(1);  // the folder every training registers in
  const fs::path other = fs::path(probe.folder()) / (std::to_string(getpid()) + ".424242");
  std::ofstream(other) << "1\n";
  const std::string train = "LIBREYOLO_CPU_SHARE=1 '" + std::string(LIBREYOLO_CLI_PATH) + "' train model=yolo9t data=" +
                            yaml + " imgsz=64 batch=2 workers=0 device=cpu project=" + tmp + "/runs --dry-run";
  // Without OMP_WAIT_POLICY in its environment, the run says to set it; with it, it does not.
  std::string out, passive;
  const int rc = test::run_command("env -u OMP_WAIT_POLICY " + train, &out);
  const int rc_passive = test::run_command("OMP_WAIT_POLICY=PASSIVE " + train, &passive);
  fs::remove(other);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(rc_passive, 0) << passive;
  EXPECT_NE(out.find("OMP_WAIT_POLICY=PASSIVE"), std::string::npos) << out;
  EXPECT_EQ(passive.find("OMP_WAIT_POLICY"), std::string::npos) << passive;
  // This probe, the fake registration and the training itself: three, or more while other CPU
  // trainings of this user run (another test's, beside this one); the share follows the count.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("shared by ([0-9]+) trainings"))) << out;
  const int trainings = std::stoi(m[1].str());
  EXPECT_GE(trainings, 3) << out;
  EXPECT_NE(out.find("CPU training on " + std::to_string(std::max(1, available_cores() / trainings)) + " core"),
            std::string::npos)
      << out;
}
