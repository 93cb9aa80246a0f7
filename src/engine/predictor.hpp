// predict(): decode, letterbox, batch, forward, decode boxes, class-aware NMS, draw and save.
#pragma once
#include <torch/torch.h>

#include <set>
#include <string>
#include <vector>

#include <libreyolo/config.hpp>
#include <libreyolo/libreyolo.hpp>

#include "models/loaded_model.hpp"

namespace libreyolo::data {
class GpuBatchMaker;
}

namespace libreyolo::engine {

// The image files a `source` names: a file, a directory (sorted, non-recursive), a glob(3)
// pattern such as "imgs/*.png" (sorted; image files only), or SAMPLE_IMAGE. Throws DataError
// (source_not_found) when there is nothing.
std::vector<std::string> resolve_sources(const std::string& source);

// The file name an annotated image is saved under: the source's file name (extension kept, so
// dup.jpg and dup.png stay apart; ".jpg" appended for formats that cannot be written), made
// unique against `used` ("x.jpg" again -> "x_2.jpg") and added to it. SAMPLE_IMAGE -> sample.jpg.
std::string saved_image_name(const std::string& source, std::set<std::string>& used);

// One image to predict on: a file, SAMPLE_IMAGE, or pixels already in memory ([H, W, 3] uint8
// RGB, defined) which `name` only names.
struct ImageSource {
  std::string name;
  torch::Tensor pixels;
};
// resolve_sources as ImageSources (files).
std::vector<ImageSource> image_sources(const std::string& source);
// Its pixels: the ones in memory, the built-in image, or the file decoded (DataError if unreadable).
torch::Tensor load_image(const ImageSource& source);

// The process's GPU JPEG decoder for predict on `dev` (one per device and size), or null: not a
// CUDA device, pictures to save (drawing needs the host pixels), LIBREYOLO_PREDICT_NVJPEG=0, or
// no nvJPEG in this build or machine, or the decoder not started yet or still starting (a request
// with `start` starts it on a thread of its own; the host decodes until it is ready).
data::GpuBatchMaker* predict_gpu_decoder(const torch::Device& dev, int size, bool save, bool start = true);
// Waits until every decoder predict_gpu_decoder has started is ready (or has failed): for tests
// and benchmarks that must measure the device decoder from their first timed call.
void wait_for_predict_gpu_decoders();

// Images that cannot be decoded are skipped with a warning and a final "N of M images skipped"
// line; when none could be read: DataError (source_not_found). The first form reads cfg.source,
// the second the given images (cfg.source unused).
std::vector<PredictResult> run_predict(models::LoadedModel& impl, const PredictConfig& cfg);
std::vector<PredictResult> run_predict(models::LoadedModel& impl, const PredictConfig& cfg,
                                       const std::vector<ImageSource>& sources);

}  // namespace libreyolo::engine
