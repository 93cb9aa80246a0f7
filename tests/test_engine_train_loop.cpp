// The train loop on its own (fake steps), the progress line, and the hook-driven trainer seen
// from the public API: user hooks, crash safety (last.pt each epoch, orphan temp files, Ctrl-C),
// resume from the checkpoint's own config, validation of short runs.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <thread>

#include <libreyolo/libreyolo.hpp>

#include "core/interrupt.hpp"
#include "data/synthetic.hpp"
#include "engine/train_hooks.hpp"
#include "engine/train_loop.hpp"
#include "io/checkpoint.hpp"
#include "support.hpp"

extern char** environ;

namespace fs = std::filesystem;
using namespace libreyolo;

namespace {

// Steps over a fixed number of batches; records nothing but counts.
struct FakeSteps : engine::EpochSteps {
  int batches = 3;
  int steps_run = 0;
  std::vector<std::string>* log = nullptr;
  void begin_epoch(TrainState& s) override { s.batch_index = -1; }
  bool has_next(const TrainState& s) const override { return s.batch_index + 1 < batches; }
  bool next_batch(TrainState& s) override {
    if (s.batch_index + 1 >= batches) return false;
    ++s.batch_index;
    s.batch_images = 2;
    return true;
  }
  void run_step(TrainState& s) override {
    ++steps_run;
    if (log) log->push_back("step" + std::to_string(s.epoch) + "." + std::to_string(s.batch_index));
  }
  EpochSummary end_epoch(TrainState& s) override {
    EpochSummary e;
    e.epoch = s.epoch + 1;
    e.loss = 1.0 / e.epoch;
    return e;
  }
};

struct Recorder : TrainHook {
  std::vector<std::string>& log;
  std::string tag;
  bool every_rank = false;
  Recorder(std::vector<std::string>& l, std::string t, bool all = false) : log(l), tag(std::move(t)), every_rank(all) {}
  bool all_ranks() const override { return every_rank; }
  void before_train(TrainState&) override { log.push_back(tag + ":before_train"); }
  void before_epoch(TrainState& s) override { log.push_back(tag + ":before_epoch" + std::to_string(s.epoch)); }
  void before_step(TrainState&) override { log.push_back(tag + ":before_step"); }
  void after_step(TrainState&) override { log.push_back(tag + ":after_step"); }
  void after_epoch(TrainState&, EpochSummary& e) override { log.push_back(tag + ":after_epoch" + std::to_string(e.epoch)); }
  void after_train(TrainState&, TrainResult& r) override {
    log.push_back(tag + ":after_train" + std::to_string(r.epochs.size()));
  }
  void on_exception(TrainState& s, const std::exception&) override {
    log.push_back(tag + std::string(":exception") + (s.interrupted ? "(interrupted)" : ""));
  }
};

TrainState fresh_state(int epochs) {
  static TrainConfig cfg;
  TrainState s;
  s.config = &cfg;
  s.epochs = epochs;
  s.batches_per_epoch = 3;
  return s;
}

int count(const std::vector<std::string>& log, const std::string& item) {
  return static_cast<int>(std::count(log.begin(), log.end(), item));
}

}  // namespace

TEST(TrainLoop, CallsHooksInOrderAroundEpochsAndSteps) {
  std::vector<std::string> log;
  TrainState s = fresh_state(2);
  engine::TrainLoop loop(s);
  loop.add_hook(std::make_shared<Recorder>(log, "a"));
  loop.add_hook(std::make_shared<Recorder>(log, "b"));
  FakeSteps steps;
  steps.log = &log;
  TrainResult r;
  loop.run(steps, r, std::chrono::steady_clock::now());
  ASSERT_EQ(r.epochs.size(), 2u);
  EXPECT_DOUBLE_EQ(r.final_loss, 0.5);
  std::vector<std::string> first = {"a:before_train", "b:before_train", "a:before_epoch0", "b:before_epoch0",
                                    "a:before_step",  "b:before_step",  "step0.0",         "a:after_step",
                                    "b:after_step"};
  ASSERT_GE(log.size(), first.size());
  EXPECT_EQ(std::vector<std::string>(log.begin(), log.begin() + first.size()), first);
  EXPECT_EQ(count(log, "a:before_step"), 6);
  EXPECT_EQ(log.back(), "b:after_train2");
  EXPECT_EQ(count(log, "a:after_epoch2"), 1);
}

TEST(TrainLoop, StopFinishedHooksAddedHooksAndRankGate) {
  std::vector<std::string> log;
  TrainState s = fresh_state(5);
  s.rank = 1;  // a non-zero rank runs only hooks that ask for every rank
  engine::TrainLoop loop(s);
  struct StopAfterTwoSteps : TrainHook {
    int n = 0;
    bool all_ranks() const override { return true; }
    void after_step(TrainState& st) override {
      if (++n == 2) {
        st.stop = true;
        st.stop_reason = "enough";
      }
    }
  };
  // Finishes after its first step and adds a new hook while it runs.
  struct OneShot : TrainHook {
    engine::TrainLoop* loop;
    std::vector<std::string>* log;
    bool done = false;
    bool all_ranks() const override { return true; }
    void after_step(TrainState&) override {
      done = true;
      loop->add_hook(std::make_shared<Recorder>(*log, "late", true));
    }
    bool finished() const override { return done; }
  };
  auto oneshot = std::make_shared<OneShot>();
  oneshot->loop = &loop;
  oneshot->log = &log;
  loop.add_hook(std::make_shared<Recorder>(log, "rank0only"));
  loop.add_hook(oneshot);
  loop.add_hook(std::make_shared<StopAfterTwoSteps>());
  FakeSteps steps;
  TrainResult r;
  loop.run(steps, r, std::chrono::steady_clock::now());
  EXPECT_EQ(steps.steps_run, 2);  // stopped after the second step
  EXPECT_EQ(r.epochs.size(), 0u);  // the epoch it stopped in is abandoned
  EXPECT_EQ(count(log, "rank0only:before_train"), 0);
  // The late hook joined after the first step's call: it sees the second step, not the first.
  EXPECT_EQ(count(log, "late:before_step"), 1);
  EXPECT_EQ(count(log, "late:after_step"), 1);
  EXPECT_EQ(loop.hooks().size(), 3u);  // the one-shot hook is gone
}

TEST(TrainLoop, PhasesReachOnlyObservingHooksAndOnlyWhileOneExists) {
  TrainState s = fresh_state(1);
  engine::TrainLoop loop(s);
  EXPECT_FALSE(loop.observing_phases());
  struct PhaseCounter : TrainHook {
    int begins = 0, ends = 0;
    bool observes_phases() const override { return true; }
    void phase_begin(TrainState&, Phase p) override { begins += p == Phase::Dataload; }
    void phase_end(TrainState&, Phase p) override { ends += p == Phase::Dataload; }
  };
  auto pc = std::make_shared<PhaseCounter>();
  loop.add_hook(pc);
  EXPECT_TRUE(loop.observing_phases());
  FakeSteps steps;
  TrainResult r;
  loop.run(steps, r, std::chrono::steady_clock::now());
  EXPECT_EQ(pc->begins, 3);  // one per batch: no fetch that yields nothing
  EXPECT_EQ(pc->ends, 3);
  EXPECT_STREQ(phase_name(Phase::Loss), "loss");
}

TEST(TrainLoop, InterruptStopsAfterTheStepAndReportsIt) {
  std::vector<std::string> log;
  TrainState s = fresh_state(3);
  engine::TrainLoop loop(s);
  struct Interrupter : TrainHook {
    void after_step(TrainState& st) override {
      if (st.epoch == 1 && st.batch_index == 0) request_interrupt(SIGINT);
    }
  };
  loop.add_hook(std::make_shared<Interrupter>());
  loop.add_hook(std::make_shared<Recorder>(log, "r"));
  FakeSteps steps;
  TrainResult r;
  try {
    loop.run(steps, r, std::chrono::steady_clock::now());
    FAIL() << "no InterruptedError";
  } catch (const InterruptedError& e) {
    EXPECT_EQ(e.exit_code(), 130);
    EXPECT_NE(std::string(e.what()).find("epoch 2 of 3"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(interrupt_requested());  // cleared for the next run
  EXPECT_EQ(steps.steps_run, 4);
  EXPECT_EQ(r.epochs.size(), 1u);
  EXPECT_EQ(log.back(), "r:exception(interrupted)");
}

TEST(TrainProgress, LineShowsBarCountsTimesAndLosses) {
  engine::ProgressLine p;
  p.epoch = 3;
  p.epochs = 40;
  p.done = 9;
  p.total = 20;
  p.elapsed_s = 3.0;
  p.losses = {{"loss", 3.2104}, {"box", 1.25}};
  p.mem_gb = 1.5;
  p.width = 120;
  const std::string bar = engine::format_progress(p, true);
  EXPECT_EQ(bar.rfind("Epoch 3/40  45%|", 0), 0u) << bar;
  EXPECT_NE(bar.find("\u2588"), std::string::npos) << bar;
  EXPECT_NE(bar.find("9/20 [00:03<00:04, 3.00it/s]"), std::string::npos) << bar;
  EXPECT_NE(bar.find("loss 3.21 box 1.25 mem 1.50G"), std::string::npos) << bar;
  const std::string plain = engine::format_progress(p, false);
  EXPECT_EQ(plain.find("\u2588"), std::string::npos) << plain;
  EXPECT_NE(plain.find("9/20"), std::string::npos);
  p.done = 20;
  EXPECT_NE(engine::format_progress(p, true).find("100%"), std::string::npos);
}

TEST(TrainProgress, LossColumnsFollowLibreYoloNaming) {
  EXPECT_EQ(engine::loss_column("box"), "train/box_loss");
  EXPECT_EQ(engine::loss_column("l1_loss"), "train/l1_loss");
  EXPECT_EQ(engine::loss_column("train/iou"), "train/iou");
  EXPECT_EQ(engine::loss_column("obj conf"), "train/obj_conf_loss");
}

// ------------------------------------------------------------------------------------------------
// The trainer through the public API.

namespace {
std::string loop_dataset() {
  static std::string yaml = [] {
    data::SyntheticOptions o;
    o.train_images = 16;
    o.val_images = 4;
    o.width = 64;
    o.height = 64;
    o.num_classes = 2;
    o.threads = 1;
    return data::generate_synthetic_dataset(test::temp_dir("loop_ds"), o);
  }();
  return yaml;
}

Kwargs small_run(const std::string& project, int epochs) {
  return {{"data", loop_dataset()}, {"epochs", std::to_string(epochs)}, {"batch", "8"}, {"imgsz", "64"},
          {"workers", "0"},         {"device", "cpu"},   {"warmup_epochs", "1"},        {"project", project},
          {"name", "run"},          {"exist_ok", "true"}, {"no_aug_epochs", "1"},       {"verbose", "false"},
          {"save_period", "0"}};
}
}  // namespace

TEST(TrainerHooks, UserHookSeesEveryStepAndCanStopTraining) {
  struct Stopper : TrainHook {
    int steps = 0, epochs = 0;
    bool saw_last_pt = false;
    void after_step(TrainState&) override { ++steps; }
    void after_epoch(TrainState& s, EpochSummary& e) override {
      ++epochs;
      // Built-in hooks ran first: the checkpoint of this epoch exists, the losses are named.
      saw_last_pt = fs::exists(fs::path(s.save_dir) / "weights" / "last.pt") && e.loss_term("box", -1) >= 0 &&
                    e.losses.size() == 3;
      s.stop = true;
    }
  };
  auto hook = std::make_shared<Stopper>();
  LibreYOLO model = LibreYOLO::create("yolo9", "t", 80, "cpu");
  TrainResult r = model.train(small_run(test::temp_dir("hooks_user"), 4), {}, {hook});
  EXPECT_EQ(r.epochs.size(), 1u);
  EXPECT_EQ(hook->epochs, 1);
  EXPECT_EQ(hook->steps, 2);  // 16 images, batch 8
  EXPECT_TRUE(hook->saw_last_pt);
}

TEST(TrainerHooks, ShortRunIsValidatedAndKeepsLastAfterEveryEpoch) {
  const std::string project = test::temp_dir("hooks_short");
  // A killed writer's temporary files in the run directory are cleaned up at the next start.
  const fs::path wdir = fs::path(project) / "run" / "weights";
  fs::create_directories(wdir);
  const fs::path orphan = wdir / ".last.pt.tmp.999999.0";
  const fs::path orphan2 = fs::path(project) / "run" / "results.csv.tmp.999998";
  std::ofstream(orphan) << "partial";
  std::ofstream(orphan2) << "partial";
  std::vector<int> last_epoch_seen;
  struct Watch : TrainHook {
    std::vector<int>* seen;
    void after_epoch(TrainState& s, EpochSummary&) override {
      io::Checkpoint ck = io::read_checkpoint((fs::path(s.save_dir) / "weights" / "last.pt").string());
      seen->push_back(static_cast<int>(ck.root->get("epoch")->as_int()));
    }
  };
  auto watch = std::make_shared<Watch>();
  watch->seen = &last_epoch_seen;
  Kwargs kw = small_run(project, 2);
  kw.emplace_back("eval_interval", "10");  // still validated: the last epoch always is
  LibreYOLO model = LibreYOLO::create("yolo9", "t", 80, "cpu");
  TrainResult r = model.train(kw, {}, {watch});
  EXPECT_FALSE(fs::exists(orphan));
  EXPECT_FALSE(fs::exists(orphan2));
  EXPECT_EQ(last_epoch_seen, (std::vector<int>{0, 1}));
  ASSERT_EQ(r.epochs.size(), 2u);
  EXPECT_FALSE(r.epochs[0].validated);
  EXPECT_TRUE(r.epochs[1].validated);
  EXPECT_EQ(r.best_epoch, 2);
  EXPECT_TRUE(fs::exists(wdir / "best.pt"));
}

TEST(TrainerHooks, InterruptKeepsLastAndResumeTakesEverythingFromTheCheckpoint) {
  const std::string project = test::temp_dir("hooks_interrupt");
  struct CtrlC : TrainHook {
    void after_step(TrainState& s) override {
      if (s.epoch == 1 && s.batch_index == 0) request_interrupt(SIGINT);
    }
  };
  LibreYOLO model = LibreYOLO::create("yolo9", "t", 80, "cpu");
  std::string last = (fs::path(project) / "run" / "weights" / "last.pt").string();
  try {
    model.train(small_run(project, 3), {}, {std::make_shared<CtrlC>()});
    FAIL() << "training was not interrupted";
  } catch (const InterruptedError& e) {
    EXPECT_EQ(e.exit_code(), 130);
  }
  ASSERT_TRUE(fs::exists(last));
  EXPECT_EQ(io::read_checkpoint(last).root->get("epoch")->as_int(), 0);

  // resume=true with nothing else: data, epochs and the rest come from the checkpoint.
  LibreYOLO again(last, "cpu");
  TrainResult r = again.train(Kwargs{{"resume", "true"}, {"verbose", "false"}});
  ASSERT_EQ(r.epochs.size(), 2u);
  EXPECT_EQ(r.epochs.front().epoch, 2);
  EXPECT_EQ(r.epochs.back().epoch, 3);

  // A finished run is refused at once, naming the epochs.
  LibreYOLO done(last, "cpu");
  try {
    done.train(Kwargs{{"resume", "true"}, {"verbose", "false"}});
    FAIL() << "resuming a finished run was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("finished epoch 3 of 3"), std::string::npos) << e.what();
  }
}

// The real program under Ctrl-C: it finishes the step, keeps last.pt of the finished epoch, says
// how to resume, and exits 130.

TEST(TrainerCli, CtrlCKeepsLastSaysHowToResumeAndExits130) {
  const std::string project = test::temp_dir("cli_ctrl_c");
  const std::string err_path = project + "/stderr.txt";
  std::vector<std::string> args = {LIBREYOLO_CLI_PATH, "train", "model=yolo9t", "data=" + loop_dataset(),
                                   "epochs=200", "imgsz=64", "batch=8", "device=cpu", "workers=0",
                                   "project=" + project, "name=run", "exist_ok=true", "save_period=0"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  const fs::path last = fs::path(project) / "run" / "weights" / "last.pt";
  // Wait for the first epoch's checkpoint, then press Ctrl-C. Alone on 2 cores the epoch takes
  // seconds; under a loaded machine minutes: wait while the program runs (at most 15 minutes).
  int early = 0;
  bool exited = false;
  for (int i = 0; i < 9000 && !fs::exists(last); ++i) {
    if (::waitpid(pid, &early, WNOHANG) == pid) {
      exited = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_FALSE(exited) << "the program ended before its first epoch (status " << early << ")";
  if (!fs::exists(last)) {  // not left running behind a failed test
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &early, 0);
  }
  ASSERT_TRUE(fs::exists(last)) << "no epoch finished within 15 minutes";
  ::kill(pid, SIGINT);
  int status = 0;
  for (int i = 0; i < 1200; ++i) {  // the step in progress finishes first
    if (::waitpid(pid, &status, WNOHANG) == pid) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (i == 1199) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      FAIL() << "the program did not stop within two minutes of Ctrl-C";
    }
  }
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 130);
  std::ifstream f(err_path);
  const std::string err((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_NE(err.find("Resume with: libreyolo train model=" + last.string() + " resume=true"), std::string::npos) << err;
  EXPECT_TRUE(io::read_checkpoint(last.string()).root->get("epoch")->is_int());
}

TEST(TrainerHooks, ResumeWithChangedOptionsSaysItIsNoLongerExact) {
  const std::string project = test::temp_dir("hooks_resume_changed");
  LibreYOLO model = LibreYOLO::create("yolo9", "t", 80, "cpu");
  Kwargs kw = small_run(project, 1);
  model.train(kw);
  const std::string last = (fs::path(project) / "run" / "weights" / "last.pt").string();
  ASSERT_TRUE(fs::exists(last));
  LibreYOLO again(last, "cpu");
  testing::internal::CaptureStderr();
  TrainResult r = again.train(Kwargs{{"resume", "true"}, {"epochs", "2"}, {"lr0", "0.02"}, {"verbose", "false"}});
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(r.epochs.size(), 1u);
  EXPECT_NE(err.find("Resuming with changed options (lr0 0.01 -> 0.02)"), std::string::npos) << err;
  EXPECT_NE(err.find("no longer an exact continuation"), std::string::npos) << err;
  // More epochs alone is not a change of what the run computes.
  EXPECT_EQ(err.find("epochs 1 -> 2"), std::string::npos) << err;
}
