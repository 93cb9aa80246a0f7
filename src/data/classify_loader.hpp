// Batches of a class-folder split for the classify task, made ahead of the training thread.
//
// Worker threads claim single samples in order (decode, then the training or evaluation
// transform of data/classify.hpp) and write them straight into the batch tensor; batches come
// out in order while the caller's step runs. A training sample's draws come from (seed, epoch,
// position in the epoch's order), the order from (seed, epoch): the batches depend on the seed
// only, not on the number of workers or their timing.
#pragma once
#include <torch/torch.h>

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "data/classify.hpp"

namespace libreyolo::data {

struct ClassifyLoaderOptions {
  // true: shuffled each epoch, the training transform, the last partial batch dropped when there
  // is a full one; false: the split's order, the evaluation transform, every sample.
  bool train = true;
  int batch = 32;
  int workers = 0;   // threads; 0 = samples are made on the thread that calls next()
  int prefetch = 2;  // batches made ahead of the consumer (raised to keep all workers busy)
  int imgsz = 224;
  double flip_prob = 0.5;  // training transform
  double crop_pct = 1.0;   // evaluation transform
  uint64_t seed = 0;
  bool pin_memory = false;  // page-locked batches; only honoured when CUDA is available
  int worker_nice = 5;      // as LoaderOptions::worker_nice (data/loader.hpp)
};

struct ClassifyBatch {
  torch::Tensor images;  // [B, S, S, 3] uint8 RGB
  torch::Tensor labels;  // [B] int64
};

class ClassifyLoader {
 public:
  ClassifyLoader(const ClassifySplit& split, ClassifyLoaderOptions options);
  ~ClassifyLoader();  // stops and joins the workers, also mid-epoch
  ClassifyLoader(const ClassifyLoader&) = delete;
  ClassifyLoader& operator=(const ClassifyLoader&) = delete;

  // Starts epoch `epoch` (its order; workers begin at once). The first next() without it starts
  // epoch 0.
  void set_epoch(int64_t epoch);
  // The next batch, or nullopt once the epoch is over. A sample that failed (an unreadable image)
  // rethrows its exception here; the epoch is then over.
  std::optional<ClassifyBatch> next();

  int64_t size() const { return num_batches_; }  // batches per epoch
  // The split's sample indices in `epoch`'s order (before the last partial batch is dropped).
  std::vector<int64_t> epoch_order(int64_t epoch) const;

 private:
  struct Slot {
    int64_t batch = -1;
    ClassifyBatch data;
    int64_t pending = 0;
    std::exception_ptr error;
  };
  void arm_locked(int64_t epoch);
  void init_slot(Slot& slot, int64_t b) const;
  void make_sample(int64_t position, int64_t epoch, uint8_t* out) const;
  void worker_loop();

  std::vector<ClassifySample> samples_;
  ClassifyLoaderOptions opt_;
  bool pin_ = false;
  int64_t num_batches_ = 0, total_samples_ = 0;

  mutable std::mutex mu_;
  std::condition_variable work_cv_, ready_cv_;
  bool stop_ = false, armed_ = false;
  int64_t epoch_ = 0;
  uint64_t generation_ = 0;  // bumped whenever an epoch is (re)armed or ended by an error
  std::vector<int64_t> order_;
  int64_t next_sample_ = 0, next_batch_ = 0;
  std::vector<Slot> slots_;  // batch b lives in slots_[b % slots_.size()]
  std::vector<std::thread> threads_;
};

}  // namespace libreyolo::data
