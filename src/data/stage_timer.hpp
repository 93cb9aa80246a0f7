// Optional per-stage timing of the data pipeline, for bench_loader --stages.
//
// The production functions (decode, resize, mosaic, transform, collate) open a StageScope at
// their stage boundaries. With no sink installed on the calling thread (always, outside the
// benchmark) a scope costs one thread-local load and a branch. With a sink installed, each
// stage's time is accumulated exclusively: a nested scope (a decode inside the mixup's partner
// load) pauses the enclosing one, so the stages add up to the wall time they cover.
#pragma once
#include <array>
#include <chrono>
#include <cstdint>

namespace libreyolo::data {

enum class Stage : int {
  Decode,           // encoded file to pixels (io::decode_image*)
  Resize,           // decoded image to imgsz on its longest side
  MosaicPlace,      // mosaic geometry: tile placement, the affine, boxes
  MosaicDraw,       // the mosaic's S x S image sampled from its tiles through the affine, with
                    // HSV and flip (the 2S canvas itself is not built)
  Transform,        // letterbox + HSV + flip (apply_transform)
  Mixup,            // the mixup blend itself (its partner's load and transform count above)
  Collate,          // batch tensors allocated and filled in (per batch, not per sample)
  Pin,              // the same allocation when it is page-locked (CUDA available)
  Read,             // GPU loader: a file's bytes read for the GPU decoder
  GpuDecode,        // GPU loader: a batch's JPEGs decoded by nvJPEG (GPU time included)
  GpuDraw,          // GPU loader: a batch drawn from its decoded images (GPU time included)
  kCount
};

inline const char* stage_name(Stage s) {
  static constexpr const char* kNames[] = {"decode",    "resize", "mosaic_place", "mosaic_draw",
                                           "transform", "mixup",  "collate",      "pin",
                                           "read",      "gpu_decode", "gpu_draw"};
  return kNames[static_cast<int>(s)];
}

struct StageTimes {
  std::array<double, static_cast<size_t>(Stage::kCount)> seconds{};
  std::array<int64_t, static_cast<size_t>(Stage::kCount)> calls{};
};

namespace stage_detail {
using Clock = std::chrono::steady_clock;
struct ThreadState {
  StageTimes* sink = nullptr;
  int active = -1;  // stage being timed, -1 = none
  Clock::time_point since;
};
inline thread_local ThreadState tls;
}  // namespace stage_detail

// Installs `sink` for the calling thread (nullptr removes it). The sink is not synchronised:
// one per thread.
inline void set_stage_sink(StageTimes* sink) {
  stage_detail::tls = stage_detail::ThreadState{};
  stage_detail::tls.sink = sink;
}

class StageScope {
 public:
  explicit StageScope(Stage s) {
    auto& t = stage_detail::tls;
    if (!t.sink) return;
    on_ = true;
    const auto now = stage_detail::Clock::now();
    if (t.active >= 0) t.sink->seconds[static_cast<size_t>(t.active)] += seconds(now - t.since);
    outer_ = t.active;
    t.active = static_cast<int>(s);
    t.since = now;
    t.sink->calls[static_cast<size_t>(s)] += 1;
  }
  ~StageScope() {
    if (!on_) return;
    auto& t = stage_detail::tls;
    const auto now = stage_detail::Clock::now();
    if (t.sink && t.active >= 0) t.sink->seconds[static_cast<size_t>(t.active)] += seconds(now - t.since);
    t.active = outer_;
    t.since = now;
  }
  StageScope(const StageScope&) = delete;
  StageScope& operator=(const StageScope&) = delete;

 private:
  static double seconds(stage_detail::Clock::duration d) { return std::chrono::duration<double>(d).count(); }
  bool on_ = false;
  int outer_ = -1;
};

}  // namespace libreyolo::data
