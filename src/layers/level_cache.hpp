// A small cache of values that depend only on a multi-scale head's level sizes and device (anchor
// grids, strides): one entry per (sizes, device), most recent last, at most 8 (a training run sees
// one or two shapes; the bound only guards against unbounded growth). Thread-safe.
#pragma once
#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <mutex>
#include <vector>

namespace libreyolo::models {

using LevelSizes = std::vector<std::array<int64_t, 2>>;  // (H, W) per level

template <class Value>
class LevelCache {
 public:
  // The value for the maps' level sizes (their last two dimensions) and device:
  // make(const LevelSizes&, c10::Device) on a miss.
  template <class Make>
  Value get(const std::vector<torch::Tensor>& maps, Make make) {
    LevelSizes sizes;
    sizes.reserve(maps.size());
    for (const auto& m : maps) sizes.push_back({m.size(-2), m.size(-1)});
    const c10::Device device = maps.front().device();
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& e : entries_)
      if (e.sizes == sizes && e.device == device) return e.value;
    Value v = make(sizes, device);
    if (entries_.size() >= 8) entries_.erase(entries_.begin());
    entries_.push_back({sizes, device, v});
    return v;
  }

 private:
  struct Entry {
    LevelSizes sizes;
    c10::Device device;
    Value value;
  };
  std::mutex mutex_;
  std::vector<Entry> entries_;
};

}  // namespace libreyolo::models
