#include "data/loader.hpp"
#include "core/env.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/cuda.h>
#ifdef LIBREYOLO_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <libreyolo/errors.hpp>

#include "core/log.hpp"
#include "data/parallel.hpp"
#include "data/stage_timer.hpp"

namespace libreyolo::data {

int LoaderOptions::default_worker_nice() {
  const char* v = env_get("LIBREYOLO_LOADER_NICE");
  if (v && *v) {
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (end && *end == '\0' && n >= 0 && n <= 19) return static_cast<int>(n);
    log_warn(strfmt("LIBREYOLO_LOADER_NICE=%s ignored: expected 0..19", v));
  }
  return 5;
}

bool gpu_loader_supports(const YoloDataset& dataset, const LoaderOptions& options, std::string* why) {
  if (dataset.cached() || dataset.disk_cached()) {
    if (why) *why = "the dataset is cached (cache=ram/disk): its resized images are read on the CPU";
    return false;
  }
  if (options.mode == LoaderMode::Train && !plannable(options.augment, why)) {
    if (why) *why += " is drawn on the CPU only";
    return false;
  }
  return gpu_loader_available(why);
}

// Linux: setpriority on a thread id changes that thread only.
void make_this_thread_nicer(int by) {
  if (by <= 0) return;
  const auto tid = static_cast<id_t>(syscall(SYS_gettid));
  errno = 0;
  const int now = getpriority(PRIO_PROCESS, tid);
  if (now == -1 && errno != 0) return;
  if (setpriority(PRIO_PROCESS, tid, std::min(19, now + by)) != 0)
    log_debug(strfmt("loader worker: could not lower its priority (errno %d)", errno));
}

DataLoader::DataLoader(std::shared_ptr<const YoloDataset> dataset, LoaderOptions options)
    : dataset_(std::move(dataset)), opt_(std::move(options)) {
  if (!dataset_) throw UsageError("DataLoader needs a dataset");
  if (opt_.batch < 1) throw UsageError(strfmt("batch must be >= 1 (got %d)", opt_.batch));
  if (opt_.workers < 0) throw UsageError(strfmt("workers must be >= 0 (got %d)", opt_.workers));
  if (opt_.worker_nice < 0 || opt_.worker_nice > 19)
    throw UsageError(strfmt("worker_nice must be in 0..19 (got %d)", opt_.worker_nice));
  if (opt_.world < 1 || opt_.rank < 0 || opt_.rank >= opt_.world)
    throw UsageError(strfmt("invalid rank %d for world size %d", opt_.rank, opt_.world));
  if (opt_.augment.max_labels < 1) throw UsageError("max_labels must be >= 1");
  S_ = dataset_->imgsz();
  opt_.augment.imgsz = S_;

  if (opt_.gpu >= 0) {
    std::string why;
    if (!gpu_loader_supports(*dataset_, opt_, &why)) throw UsageError("loader=gpu: " + why);
    gpu_ = std::make_unique<GpuBatchMaker>(opt_.gpu, S_);
  }
  if (opt_.pin_memory) {
    pin_ = torch::cuda::is_available();
    if (!pin_) log_debug("pin_memory ignored: no CUDA device");
  }
  const int64_t n = dataset_->size();
  per_rank_ = opt_.world == 1 ? n
              : opt_.pad_shards ? (n + opt_.world - 1) / opt_.world
                                : n / opt_.world;
  if (per_rank_ == 0)
    throw DataError(strfmt("%lld images cannot be split over %d ranks", static_cast<long long>(n),
                           opt_.world));
  drop_last_ = opt_.drop_last.value_or(opt_.mode == LoaderMode::Train && per_rank_ >= opt_.batch);
  num_batches_ = drop_last_ ? per_rank_ / opt_.batch : (per_rank_ + opt_.batch - 1) / opt_.batch;
  total_samples_ = drop_last_ ? num_batches_ * opt_.batch : per_rank_;

  if (opt_.workers > 0) {
    slots_.resize(static_cast<size_t>(prefetch_slots(opt_.prefetch, opt_.workers, opt_.batch)));
    threads_.reserve(static_cast<size_t>(opt_.workers));
    for (int i = 0; i < opt_.workers; ++i) threads_.emplace_back([this] { worker_loop(); });
  }
}

DataLoader::~DataLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    ++generation_;
  }
  work_cv_.notify_all();
  ready_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

std::vector<int64_t> DataLoader::epoch_indices(int64_t epoch) const {
  const int64_t n = dataset_->size();
  std::vector<int64_t> all(static_cast<size_t>(n));
  if (opt_.mode == LoaderMode::Train && opt_.shuffle) {
    // torch.randperm with a generator seeded seed + epoch: the permutation DistributedSampler
    // draws for the same seed and epoch.
    auto gen = at::detail::createCPUGenerator(opt_.seed + static_cast<uint64_t>(epoch));
    const torch::Tensor perm = torch::randperm(n, gen, torch::kLong);
    std::copy_n(perm.data_ptr<int64_t>(), n, all.begin());
  } else {
    for (int64_t i = 0; i < n; ++i) all[static_cast<size_t>(i)] = i;
  }
  if (opt_.world == 1) return all;
  const int64_t total = per_rank_ * opt_.world;
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(per_rank_));
  for (int64_t k = opt_.rank; k < total; k += opt_.world) mine.push_back(all[static_cast<size_t>(k % n)]);
  return mine;
}

bool DataLoader::mosaic() const {
  std::lock_guard<std::mutex> lock(mu_);
  return mosaic_;
}

void DataLoader::arm_locked(int64_t epoch) {
  epoch_ = epoch;
  epoch_mosaic_ = mosaic_;
  order_ = epoch_indices(epoch);
  order_.resize(static_cast<size_t>(total_samples_));
  next_sample_ = 0;
  next_batch_ = 0;
  fatal_ = nullptr;
  for (Slot& s : slots_) s = Slot{};
  ++generation_;
  armed_ = true;
  unreadable_at_start_ = dataset_->num_unreadable();
}

void DataLoader::end_epoch_locked() {
  next_batch_ = num_batches_;
  next_sample_ = total_samples_;
  ++generation_;  // samples still in flight are dropped
}

void DataLoader::set_epoch(int64_t epoch) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    arm_locked(epoch);
  }
  work_cv_.notify_all();
}

void DataLoader::set_mosaic(bool on) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    mosaic_ = on;
    if (!armed_ || next_batch_ > 0 || epoch_mosaic_ == on) return;
    arm_locked(epoch_);  // nothing handed out yet: redo the prefetched samples in the new mode
  }
  work_cv_.notify_all();
}

void DataLoader::make_sample(int64_t position, int64_t index, int64_t epoch, bool mosaic,
                             uint8_t* image, float* targets) const {
  if (opt_.mode == LoaderMode::Val) {
    make_val_sample(*dataset_, index, opt_.augment.max_labels, image, targets, opt_.augment.fit);
    return;
  }
  // Keyed by the sample's place in the whole epoch (the permutation every rank shares), not by
  // its place on this rank: ranks draw different streams, and N ranks with batch B/N augment
  // exactly what one process with batch B would.
  const int64_t global_position = position * opt_.world + opt_.rank;
  Rng rng = Rng::for_sample(opt_.seed, epoch, global_position, 0);
  make_train_sample(*dataset_, index, mosaic, opt_.augment, rng, image, targets);
}

void DataLoader::plan_sample(int64_t position, int64_t index, int64_t epoch, bool mosaic, float* targets,
                             PlannedSample* out) const {
  if (opt_.mode == LoaderMode::Val) {
    out->plan = plan_val_sample(*dataset_, index, opt_.augment.max_labels, targets, opt_.augment.fit);
  } else {
    Rng rng = Rng::for_sample(opt_.seed, epoch, position * opt_.world + opt_.rank, 0);  // as make_sample
    out->plan = plan_train_sample(*dataset_, index, mosaic, opt_.augment, rng, targets);
  }
  StageScope timed(Stage::Read);
  for (int k = 0; k < out->plan.num_tiles; ++k) {
    const std::string& path = dataset_->image_path(out->plan.tiles[static_cast<size_t>(k)].index);
    out->names[static_cast<size_t>(k)] = path;
    try {
      out->files[static_cast<size_t>(k)] = read_file_bytes(path);
    } catch (const DataError&) {
      out->files[static_cast<size_t>(k)] = std::make_shared<const std::vector<uint8_t>>();  // the decoder reports it
    }
  }
}

torch::Tensor DataLoader::draw_batch(std::vector<PlannedSample>& planned, int64_t first_position, int64_t epoch,
                                     bool mosaic, const std::vector<int64_t>& indices, float* targets) const {
  const int64_t target_floats = static_cast<int64_t>(opt_.augment.max_labels) * 5;
  std::vector<std::pair<int64_t, std::string>> bad;
  for (;;) {
    torch::Tensor images = gpu_->make(planned, &bad);
    if (bad.empty()) return images;
    for (const auto& [index, why] : bad) dataset_->mark_unreadable(index, why);
    for (size_t j = 0; j < planned.size(); ++j) {
      bool hit = false;
      for (int k = 0; k < planned[j].plan.num_tiles; ++k)
        for (const auto& b : bad) hit = hit || planned[j].plan.tiles[static_cast<size_t>(k)].index == b.first;
      if (hit)
        plan_sample(first_position + static_cast<int64_t>(j), indices[j], epoch, mosaic,
                    targets + static_cast<int64_t>(j) * target_floats, &planned[j]);
    }
  }
}

void DataLoader::init_slot_locked(Slot& slot, int64_t b) {
  // Samples are written straight into these tensors: allocating them is the whole collate (and,
  // when they are page-locked, the whole pinning).
  StageScope timed(pin_ ? Stage::Pin : Stage::Collate);
  const int64_t count = std::min<int64_t>(opt_.batch, total_samples_ - b * opt_.batch);
  auto opts = torch::TensorOptions().pinned_memory(pin_);
  slot = Slot{};
  slot.batch = b;
  slot.pending = count;
  if (gpu_)
    slot.planned.resize(static_cast<size_t>(count));
  else
    slot.data.images = torch::empty({count, S_, S_, 3}, opts.dtype(torch::kUInt8));
  slot.data.targets = torch::empty({count, opt_.augment.max_labels, 5}, opts.dtype(torch::kFloat32));
  slot.data.orig_hw.resize(static_cast<size_t>(count));
  slot.data.indices.resize(static_cast<size_t>(count));
}

void DataLoader::worker_loop() {
  make_this_thread_nicer(opt_.worker_nice);
  const int64_t B = opt_.batch;
  const int64_t window = static_cast<int64_t>(slots_.size());
  const int64_t image_bytes = static_cast<int64_t>(S_) * S_ * 3;
  const int64_t target_floats = static_cast<int64_t>(opt_.augment.max_labels) * 5;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] {
      return stop_ || (armed_ && !fatal_ && next_sample_ < total_samples_ &&
                       next_sample_ / B < next_batch_ + window);
    });
    if (stop_) return;
    const int64_t pos = next_sample_++;
    const int64_t b = pos / B, j = pos % B;
    const uint64_t gen = generation_;
    Slot& slot = slots_[static_cast<size_t>(b % window)];
    torch::Tensor images, targets;  // held here so an epoch switch cannot free them under us
    PlannedSample* planned = nullptr;
    try {
      if (slot.batch != b) init_slot_locked(slot, b);
      images = slot.data.images;
      targets = slot.data.targets;
      if (gpu_) planned = &slot.planned[static_cast<size_t>(j)];
    } catch (...) {
      fatal_ = std::current_exception();
      ready_cv_.notify_all();
      continue;
    }
    const int64_t index = order_[static_cast<size_t>(pos)];
    slot.data.indices[static_cast<size_t>(j)] = index;
    slot.data.orig_hw[static_cast<size_t>(j)] = dataset_->original_hw(index);
    const int64_t epoch = epoch_;
    const bool mosaic = epoch_mosaic_;
    lock.unlock();

    std::exception_ptr error;
    try {
      if (planned)  // the slot's plans only change under the lock or by their one owner
        plan_sample(pos, index, epoch, mosaic, targets.data_ptr<float>() + j * target_floats, planned);
      else
        make_sample(pos, index, epoch, mosaic, images.data_ptr<uint8_t>() + j * image_bytes,
                    targets.data_ptr<float>() + j * target_floats);
    } catch (...) {
      error = std::current_exception();
    }
    images = torch::Tensor();

    lock.lock();
    if (gen != generation_) {  // the epoch was re-armed meanwhile: drop the sample
      targets = torch::Tensor();
      continue;
    }
    Slot& done = slots_[static_cast<size_t>(b % window)];
    if (error && !done.error) done.error = error;
    if (--done.pending == 0) {
      if (gpu_ && !done.error) {
        // The batch's last sample: this worker draws the whole batch on the GPU.
        std::vector<PlannedSample> plans = std::move(done.planned);
        const std::vector<int64_t> indices = done.data.indices;
        lock.unlock();
        torch::Tensor pixels;
        try {
          pixels = draw_batch(plans, b * B, epoch, mosaic, indices, targets.data_ptr<float>());
        } catch (...) {
          error = std::current_exception();
        }
        lock.lock();
        targets = torch::Tensor();
        if (gen != generation_) continue;
        Slot& drawn = slots_[static_cast<size_t>(b % window)];
        drawn.data.images = std::move(pixels);
        if (error) drawn.error = error;
      }
      done.drawn = true;
      ready_cv_.notify_all();
    }
    targets = torch::Tensor();
  }
}

std::optional<Batch> DataLoader::next_inline(bool* last) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!armed_) arm_locked(epoch_);
  if (next_batch_ >= num_batches_) return std::nullopt;
  const int64_t b = next_batch_++;
  *last = next_batch_ == num_batches_;
  Slot slot;
  init_slot_locked(slot, b);
  const int64_t epoch = epoch_;
  const bool mosaic = epoch_mosaic_;
  const int64_t image_bytes = static_cast<int64_t>(S_) * S_ * 3;
  const int64_t target_floats = static_cast<int64_t>(opt_.augment.max_labels) * 5;
  lock.unlock();
  uint8_t* images = gpu_ ? nullptr : slot.data.images.data_ptr<uint8_t>();
  float* targets = slot.data.targets.data_ptr<float>();
  try {
    for (int64_t j = 0; j < slot.pending; ++j) {
      const int64_t pos = b * opt_.batch + j;
      const int64_t index = order_[static_cast<size_t>(pos)];
      slot.data.indices[static_cast<size_t>(j)] = index;
      slot.data.orig_hw[static_cast<size_t>(j)] = dataset_->original_hw(index);
      if (gpu_)
        plan_sample(pos, index, epoch, mosaic, targets + j * target_floats, &slot.planned[static_cast<size_t>(j)]);
      else
        make_sample(pos, index, epoch, mosaic, images + j * image_bytes, targets + j * target_floats);
    }
    if (gpu_) slot.data.images = draw_batch(slot.planned, b * opt_.batch, epoch, mosaic, slot.data.indices, targets);
  } catch (...) {
    lock.lock();
    end_epoch_locked();
    throw;
  }
  return std::move(slot.data);
}

std::optional<Batch> DataLoader::next() {
  std::optional<Batch> out;
  bool last = false;
  if (threads_.empty()) {
    out = next_inline(&last);
  } else {
    std::unique_lock<std::mutex> lock(mu_);
    if (!armed_) {
      arm_locked(epoch_);
      work_cv_.notify_all();
    }
    if (next_batch_ >= num_batches_) return std::nullopt;
    const int64_t b = next_batch_;
    Slot& slot = slots_[static_cast<size_t>(b % static_cast<int64_t>(slots_.size()))];
    ready_cv_.wait(lock, [&] { return stop_ || fatal_ || (slot.batch == b && slot.pending == 0 && slot.drawn); });
    std::exception_ptr error = fatal_ ? fatal_ : slot.error;
    if (stop_) error = std::make_exception_ptr(RuntimeError("data loader stopped"));
    if (error) {
      end_epoch_locked();
      std::rethrow_exception(error);
    }
    out = std::move(slot.data);
    slot = Slot{};
    last = ++next_batch_ == num_batches_;
    lock.unlock();
    work_cv_.notify_all();
  }
#ifdef LIBREYOLO_CUDA
  if (out && out->images.is_cuda()) {
    // Drawn on the GPU loader's stream (finished there); the step reads it on the caller's
    // stream, so its memory is not reused before that stream is past it.
    out->images.record_stream(c10::cuda::getCurrentCUDAStream(out->images.device().index()));
  }
#endif
  if (last) {
    const int64_t found = dataset_->num_unreadable() - unreadable_at_start_;
    if (found > 0)
      log_warn(strfmt("%lld corrupt images found this epoch were replaced by their neighbours",
                      static_cast<long long>(found)));
  }
  return out;
}

}  // namespace libreyolo::data
