#include "data/classify_loader.hpp"

#include <torch/cuda.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include <libreyolo/errors.hpp>

#include "core/log.hpp"
#include "data/loader.hpp"
#include "data/parallel.hpp"
#include "data/rng.hpp"
#include "io/image.hpp"

namespace libreyolo::data {

ClassifyLoader::ClassifyLoader(const ClassifySplit& split, ClassifyLoaderOptions options)
    : samples_(split.samples), opt_(options) {
  if (opt_.batch < 1) throw UsageError(strfmt("batch must be >= 1 (got %d)", opt_.batch));
  if (opt_.workers < 0) throw UsageError(strfmt("workers must be >= 0 (got %d)", opt_.workers));
  if (opt_.imgsz < 1) throw UsageError(strfmt("imgsz must be >= 1 (got %d)", opt_.imgsz));
  if (opt_.worker_nice < 0) opt_.worker_nice = LoaderOptions::default_worker_nice();
  const int64_t n = static_cast<int64_t>(samples_.size());
  if (n == 0) throw DataError("'" + split.dir + "' has no images", "", "data_empty");
  // Training drops the last partial batch when there is a full one (LibreYOLO's drop_last).
  num_batches_ = opt_.train ? std::max<int64_t>(1, n / opt_.batch) : (n + opt_.batch - 1) / opt_.batch;
  total_samples_ = opt_.train ? std::min(n, num_batches_ * opt_.batch) : n;
  if (opt_.pin_memory) pin_ = torch::cuda::is_available();
  if (opt_.workers > 0) {
    slots_.resize(static_cast<size_t>(prefetch_slots(opt_.prefetch, opt_.workers, opt_.batch)));
    for (int i = 0; i < opt_.workers; ++i) threads_.emplace_back([this] { worker_loop(); });
  }
}

ClassifyLoader::~ClassifyLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    ++generation_;
  }
  work_cv_.notify_all();
  ready_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

std::vector<int64_t> ClassifyLoader::epoch_order(int64_t epoch) const {
  const int64_t n = static_cast<int64_t>(samples_.size());
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
  if (!opt_.train) return order;
  Rng shuffle(opt_.seed * 1000003ull + static_cast<uint64_t>(epoch));  // Fisher-Yates
  for (int64_t i = n - 1; i > 0; --i)
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(shuffle.randint(0, i))]);
  return order;
}

void ClassifyLoader::arm_locked(int64_t epoch) {
  epoch_ = epoch;
  order_ = epoch_order(epoch);
  next_sample_ = next_batch_ = 0;
  for (Slot& s : slots_) s = Slot{};
  ++generation_;
  armed_ = true;
}

void ClassifyLoader::set_epoch(int64_t epoch) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    arm_locked(epoch);
  }
  work_cv_.notify_all();
}

// Under the lock (order_ is read).
void ClassifyLoader::init_slot(Slot& slot, int64_t b) const {
  const int64_t first = b * opt_.batch, count = std::min<int64_t>(opt_.batch, total_samples_ - first);
  slot = Slot{};
  slot.batch = b;
  slot.pending = count;
  const auto opts = torch::TensorOptions().pinned_memory(pin_);
  slot.data.images = torch::empty({count, opt_.imgsz, opt_.imgsz, 3}, opts.dtype(torch::kUInt8));
  slot.data.labels = torch::empty({count}, torch::kLong);
  auto* labels = slot.data.labels.data_ptr<int64_t>();
  for (int64_t j = 0; j < count; ++j) labels[j] = samples_[static_cast<size_t>(order_[static_cast<size_t>(first + j)])].label;
}

void ClassifyLoader::make_sample(int64_t position, int64_t epoch, uint8_t* out) const {
  const ClassifySample& s = samples_[static_cast<size_t>(order_[static_cast<size_t>(position)])];
  const torch::Tensor img = io::decode_image(s.path);
  torch::Tensor t;
  if (opt_.train) {
    Rng rng = Rng::for_sample(opt_.seed, epoch, position, 0);
    t = classify_train_transform(img, opt_.imgsz, opt_.flip_prob, rng);
  } else {
    t = classify_eval_transform(img, opt_.imgsz, opt_.crop_pct);
  }
  t = t.contiguous();
  std::memcpy(out, t.data_ptr<uint8_t>(), static_cast<size_t>(t.numel()));
}

void ClassifyLoader::worker_loop() {
  make_this_thread_nicer(opt_.worker_nice);
  const int64_t B = opt_.batch, window = static_cast<int64_t>(slots_.size());
  const int64_t image_bytes = static_cast<int64_t>(opt_.imgsz) * opt_.imgsz * 3;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] {
      return stop_ || (armed_ && next_sample_ < total_samples_ && next_sample_ / B < next_batch_ + window);
    });
    if (stop_) return;
    const int64_t pos = next_sample_++, b = pos / B, j = pos % B;
    const uint64_t gen = generation_;
    const int64_t epoch = epoch_;
    Slot& slot = slots_[static_cast<size_t>(b % window)];
    torch::Tensor images;  // held so that an epoch switch cannot free it under us
    std::exception_ptr error;
    try {
      if (slot.batch != b) init_slot(slot, b);
      images = slot.data.images;
    } catch (...) {
      error = std::current_exception();
    }
    if (!error) {
      lock.unlock();
      try {
        make_sample(pos, epoch, images.data_ptr<uint8_t>() + j * image_bytes);
      } catch (...) {
        error = std::current_exception();
      }
      images = torch::Tensor();
      lock.lock();
      if (gen != generation_) continue;  // the epoch was re-armed meanwhile: drop the sample
    }
    Slot& done = slots_[static_cast<size_t>(b % window)];
    if (error && !done.error) done.error = error;
    if (--done.pending == 0 || error) ready_cv_.notify_all();
  }
}

std::optional<ClassifyBatch> ClassifyLoader::next() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!armed_) {
    arm_locked(epoch_);
    work_cv_.notify_all();
  }
  if (next_batch_ >= num_batches_) return std::nullopt;
  const int64_t b = next_batch_;
  if (threads_.empty()) {
    Slot slot;
    init_slot(slot, b);
    const int64_t epoch = epoch_;
    ++next_batch_;
    lock.unlock();
    const int64_t image_bytes = static_cast<int64_t>(opt_.imgsz) * opt_.imgsz * 3;
    try {
      for (int64_t j = 0; j < slot.pending; ++j)
        make_sample(b * opt_.batch + j, epoch, slot.data.images.data_ptr<uint8_t>() + j * image_bytes);
    } catch (...) {
      lock.lock();
      next_batch_ = num_batches_;
      throw;
    }
    return std::move(slot.data);
  }
  Slot& slot = slots_[static_cast<size_t>(b % static_cast<int64_t>(slots_.size()))];
  ready_cv_.wait(lock, [&] { return stop_ || (slot.batch == b && (slot.pending == 0 || slot.error)); });
  std::exception_ptr error = stop_ ? std::make_exception_ptr(RuntimeError("data loader stopped")) : slot.error;
  if (error) {
    // No more batches this epoch; samples still in flight are dropped.
    next_batch_ = num_batches_;
    next_sample_ = total_samples_;
    ++generation_;
    std::rethrow_exception(error);
  }
  ClassifyBatch out = std::move(slot.data);
  slot = Slot{};
  ++next_batch_;
  lock.unlock();
  work_cv_.notify_all();
  return out;
}

}  // namespace libreyolo::data
