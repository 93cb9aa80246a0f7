// Multi-threaded batch loader over a YoloDataset (LibreYOLO's DataLoader + DistributedSampler +
// collate).
//
// Workers are threads that claim single samples in order and write them straight into the
// batch tensors; batches come out in order. Every sample's randomness comes from
// (seed, epoch, position in the epoch's shared permutation), so the output depends on the seed only,
// not on the number of workers or their timing.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "data/augment.hpp"
#include "data/batch.hpp"
#include "data/dataset.hpp"
#include "data/gpu_batch.hpp"

namespace libreyolo::data {

enum class LoaderMode { Train, Val };

struct LoaderOptions {
  LoaderMode mode = LoaderMode::Train;
  int batch = 16;    // per-rank batch size
  int workers = 0;   // threads; 0 = samples are made on the thread that calls next()
  int prefetch = 2;  // batches made ahead of the consumer (raised to keep all workers busy)
  bool pin_memory = false;  // page-locked batches; only honoured when CUDA is available
  bool shuffle = true;      // Train only; Val never shuffles
  // Default: Train drops the last partial batch when the rank sees >= batch samples; Val never.
  std::optional<bool> drop_last;
  int rank = 0, world = 1;  // sharding like torch's DistributedSampler
  // Shards are padded by wrap-around to the same length on every rank (DistributedSampler with
  // drop_last=False). false truncates instead (drop_last=True, the reference's choice when the
  // dataset has at least world_size images): every rank then sees floor(n / world).
  bool pad_shards = true;
  uint64_t seed = 0;  // shuffle order: seed + epoch; augmentation: (seed, epoch, global position)
  // Worker threads run this much nicer than the thread that made the loader (Linux niceness,
  // capped at 19), so that when the cores are oversubscribed (several training processes, each
  // with its workers) the training thread, which launches the GPU work, is not the one that
  // waits for a core. Default: LIBREYOLO_LOADER_NICE, else 5; 0 leaves them as they are.
  int worker_nice = default_worker_nice();
  static int default_worker_nice();
  AugmentOptions augment;  // augment.imgsz is taken from the dataset
  // >= 0: the GPU loader on this CUDA device (data/gpu_batch.hpp): workers plan samples and read
  // files; each batch is decoded (nvJPEG) and drawn there, and Batch::images is a CUDA tensor.
  // Same samples and targets as the CPU loader with DatasetOptions::reduced_decode = false (pixels
  // differ only by the JPEG decoder). A blend recipe without mixup, no dataset cache
  // (gpu_loader_supports says why not).
  int gpu = -1;
};

// Whether the GPU loader covers this dataset and recipe; else the reason.
bool gpu_loader_supports(const YoloDataset& dataset, const LoaderOptions& options, std::string* why);

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const YoloDataset> dataset, LoaderOptions options);
  ~DataLoader();  // stops and joins the workers, also mid-epoch
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Starts epoch `epoch` (reshuffles; workers begin prefetching at once). Call before each epoch;
  // the first next() without it starts epoch 0.
  void set_epoch(int64_t epoch);
  // Mosaic (and mixup) on or off: the reference's close_mosaic(). Applies to the armed epoch if
  // none of its batches has been taken yet, otherwise from the next set_epoch.
  void set_mosaic(bool on);
  bool mosaic() const;

  // The next batch of the epoch, or nullopt once the epoch is over. A sample that failed rethrows
  // its exception here (the epoch is then over; set_epoch starts a new one).
  std::optional<Batch> next();

  int64_t size() const { return num_batches_; }                 // batches per epoch
  int64_t samples_per_epoch() const { return total_samples_; }  // after drop_last
  bool drop_last() const { return drop_last_; }
  bool pinned() const { return pin_; }
  // The GPU loader's JPEG decoder ("hardware" or "cuda"); empty for the CPU loader.
  std::string gpu_decoder() const { return gpu_ ? gpu_->backend() : std::string(); }
  const YoloDataset& dataset() const { return *dataset_; }
  const LoaderOptions& options() const { return opt_; }
  // Dataset indices this rank visits in `epoch`, in order (before drop_last).
  std::vector<int64_t> epoch_indices(int64_t epoch) const;

 private:
  struct Slot {
    int64_t batch = -1;
    Batch data;
    int64_t pending = 0;
    std::exception_ptr error;
    // GPU loader: each sample's plan and files; the batch is ready once `drawn`.
    std::vector<PlannedSample> planned;
    bool drawn = false;
  };
  void arm_locked(int64_t epoch);
  void init_slot_locked(Slot& slot, int64_t b);
  void make_sample(int64_t position, int64_t index, int64_t epoch, bool mosaic, uint8_t* image,
                   float* targets) const;
  // GPU loader: sample `position`'s plan, files and targets.
  void plan_sample(int64_t position, int64_t index, int64_t epoch, bool mosaic, float* targets,
                   PlannedSample* out) const;
  // GPU loader: the batch's pixels from its plans; samples whose files turn out corrupt are
  // re-planned (their neighbours replace them, as on the CPU) until every file decodes.
  torch::Tensor draw_batch(std::vector<PlannedSample>& planned, int64_t first_position, int64_t epoch,
                           bool mosaic, const std::vector<int64_t>& indices, float* targets) const;
  void worker_loop();
  std::optional<Batch> next_inline(bool* last);
  void end_epoch_locked();  // after an error: no more batches until set_epoch

  std::shared_ptr<const YoloDataset> dataset_;
  LoaderOptions opt_;
  int S_ = 0;
  bool pin_ = false;
  bool drop_last_ = false;
  int64_t per_rank_ = 0;
  int64_t num_batches_ = 0;
  int64_t total_samples_ = 0;

  mutable std::mutex mu_;
  std::condition_variable work_cv_, ready_cv_;
  bool stop_ = false;
  bool armed_ = false;
  bool mosaic_ = true;
  bool epoch_mosaic_ = true;
  int64_t epoch_ = 0;
  uint64_t generation_ = 0;  // bumped whenever an epoch is (re)armed or aborted
  std::vector<int64_t> order_;
  int64_t next_sample_ = 0;  // next position to claim
  int64_t next_batch_ = 0;   // next batch to hand out
  std::vector<Slot> slots_;  // batch b lives in slots_[b % slots_.size()]
  std::exception_ptr fatal_;
  int64_t unreadable_at_start_ = 0;
  std::vector<std::thread> threads_;
  std::unique_ptr<GpuBatchMaker> gpu_;
};

}  // namespace libreyolo::data
