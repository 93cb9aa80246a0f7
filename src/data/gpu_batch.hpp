// The GPU loader's batch maker (loader=gpu): a batch's JPEG files decoded by nvJPEG on the GPU
// (its hardware decoder where the GPU has one), then every sample drawn from the decoded images
// by one kernel (kernels/render.hpp) following its plan (data/augment.hpp SampleDraw): mosaic,
// letterbox, flip and HSV, straight into a [B, S, S, 3] uint8 batch on the device.
//
// nvJPEG is loaded at run time (libnvjpeg.so.13: the CUDA toolkit's or the nvidia-nvjpeg
// wheel's), so that a binary without it still runs (the CPU loader); LIBREYOLO_NVJPEG names the
// library file explicitly. A file nvJPEG cannot decode (a progressive or CMYK JPEG, PNG, ...) is
// decoded on the CPU and uploaded; one that neither decodes is reported back as corrupt.
#pragma once
#include <torch/types.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/augment.hpp"

namespace libreyolo::data {

// Whether this build and machine can run the GPU loader (CUDA kernels built, nvjpeg.h found at
// build time, libnvjpeg loadable, a CUDA device); else the reason.
bool gpu_loader_available(std::string* why = nullptr);

// One sample to draw: its plan and the bytes of each tile's file (tiles[k] <-> files[k]).
struct PlannedSample {
  SampleDraw plan;
  std::array<std::shared_ptr<const std::vector<uint8_t>>, 4> files;
  std::array<std::string, 4> names;  // for messages
};

class GpuBatchMaker {
 public:
  GpuBatchMaker(int device, int imgsz);  // throws RuntimeError when unavailable (the reason)
  ~GpuBatchMaker();
  GpuBatchMaker(const GpuBatchMaker&) = delete;
  GpuBatchMaker& operator=(const GpuBatchMaker&) = delete;

  // Decodes and draws `samples` into a new [n, S, S, 3] uint8 tensor on the device, on the
  // maker's own stream, and waits for it. Files that do not decode at all are listed in *bad as
  // (dataset index, reason) and the result is then undefined: mark them, re-plan, call again.
  // Thread-safe (calls are serialised).
  torch::Tensor make(const std::vector<PlannedSample>& samples, std::vector<std::pair<int64_t, std::string>>* bad);
  // Decodes whole files into [h, w, 3] uint8 RGB images on the device (what nvJPEG cannot read on
  // the CPU, then uploaded) and waits for them. Files that decode nowhere are listed in *bad as
  // (file index, reason), their images undefined. Thread-safe (calls are serialised).
  std::vector<torch::Tensor> decode(const std::vector<std::shared_ptr<const std::vector<uint8_t>>>& files,
                                    const std::vector<std::string>& names,
                                    std::vector<std::pair<int64_t, std::string>>* bad);
  // "hardware" (the GPU's JPEG engines) or "cuda" (nvJPEG's hybrid decoder).
  std::string backend() const;
  // Images decoded on the CPU because nvJPEG could not, so far.
  int64_t cpu_fallbacks() const;
  // How long the constructor took to create nvJPEG's handles and states (ms): the engines'
  // (hardware; 0 without them) and the hybrid decoder's.
  struct StartTimes {
    double hardware_ms = 0, hybrid_ms = 0;
  };
  StartTimes start_times() const;

 private:
  struct Impl;
  struct Entry;
  void decode_entries(std::vector<Entry>& entries, std::vector<std::pair<int64_t, std::string>>* bad);
  std::unique_ptr<Impl> impl_;
};

// The constructors' times of every GpuBatchMaker made in this process so far, summed.
GpuBatchMaker::StartTimes gpu_batch_maker_start_totals();

// The bytes of a whole file (DataError when it cannot be read).
std::shared_ptr<const std::vector<uint8_t>> read_file_bytes(const std::string& path);

}  // namespace libreyolo::data
