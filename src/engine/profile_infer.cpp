#include "engine/profile_infer.hpp"

#include <libreyolo/errors.hpp>

#include "core/log.hpp"
#include "core/paths.hpp"
#include "engine/inference.hpp"
#include "engine/predictor.hpp"
#include "io/image.hpp"
#include "io/sample_image.hpp"
#include "ops/image_ops.hpp"
#include "profile/infer.hpp"

namespace libreyolo::engine {

InferenceProfile run_profile_infer(models::LoadedModel& impl, const InferProfileConfig& requested) {
  InferProfileConfig cfg = requested;
  if (cfg.imgsz == 0) cfg.imgsz = impl.imgsz;  // the model's own size
  if (cfg.batch < 1) throw UsageError("profile infer: --batch must be at least 1", "", "config_range_error");
  if (cfg.runs < 2) throw UsageError("profile infer: --runs must be at least 2", "", "config_range_error");
  if (cfg.warmup < 0) throw UsageError("profile infer: --warmup must be >= 0", "", "config_range_error");
  if (cfg.imgsz < 32 || cfg.imgsz % 32 != 0)
    throw UsageError("profile infer: --imgsz must be a positive multiple of 32", "", "config_range_error");
  // Decoded once: the profile measures the fit (letterbox or stretch), forward and postprocess, as 1.6.0's does.
  std::vector<torch::Tensor> images;
  // The same sources as predict, with predict's errors (a folder without images: DataError, exit 3).
  const std::vector<std::string> sources = resolve_sources(cfg.source);
  for (const auto& src : sources) {
    try {
      images.push_back(src == "SAMPLE_IMAGE" ? io::make_sample_image() : io::decode_image(src));
    } catch (const Error& e) {
      log_warn("skipping " + src + ": " + e.what());
    }
  }
  if (images.empty())
    throw DataError("none of the images at " + cfg.source + " could be decoded",
                    "Pass an image, a folder of images, or leave it out for the sample image.", "no_images");

  const torch::Device dev = impl.device;
  auto& model = *impl.model;
  model.eval();
  InferenceOptions io_opt;
  io_opt.device = dev;
  io_opt.amp = cfg.half;
  io_opt.amp_dtype = cfg.amp_dtype == "bfloat16" || cfg.amp_dtype == "bf16" ? torch::kBFloat16 : torch::kHalf;
  io_opt.graphs = impl.graphs.get();
  io_opt.graph_mode = models::parse_graph_mode(cfg.cuda_graph);
  InferenceRunner runner(model, *impl.family, io_opt);

  const int S = cfg.imgsz, B = cfg.batch;
  torch::Tensor batch, pred;
  const ops::Fit fit = impl.family->input.fit;
  std::vector<ops::ImageGeometry> geometry(static_cast<size_t>(B));
  profile::InferStages st;
  st.preprocess = [&](int it) {
    std::vector<torch::Tensor> canvases;
    for (int j = 0; j < B; ++j) {
      const auto& img = images[static_cast<size_t>(it * B + j) % images.size()];
      ops::FitBox box;
      canvases.push_back(ops::fit_image(img, S, fit, &box));
      geometry[static_cast<size_t>(j)] = {box.sx, box.sy, static_cast<int>(img.size(0)), static_cast<int>(img.size(1))};
    }
    batch = torch::stack(canvases);
  };
  st.forward = [&] { pred = runner.forward(batch); };
  st.postprocess = [&] {
    // As predict() does it: the batch's detections at once, then to the host.
    std::vector<models::PostprocessArgs> args;
    for (int j = 0; j < B; ++j) args.push_back({cfg.conf, cfg.iou, cfg.max_det, geometry[static_cast<size_t>(j)]});
    for (ops::Detections& det : runner.postprocess_batch(pred, args)) {
      det.boxes = det.boxes.to(torch::kCPU);
      det.scores = det.scores.to(torch::kCPU);
      det.classes = det.classes.to(torch::kCPU);
    }
  };
  profile::InferOptions po;
  po.warmup = cfg.warmup;
  po.runs = cfg.runs;
  po.batch = B;
  po.trace = cfg.trace;
  const std::string dir = make_run_dir(cfg.project, cfg.name, /*exist_ok=*/false);
  nlohmann::json meta = {{"model", impl.weights.empty() ? impl.family->name + impl.model->size() : impl.weights},
                         {"batch", B},
                         {"imgsz", S},
                         {"half", cfg.half},
                         {"amp_dtype", cfg.amp_dtype},
                         {"device", dev.str()},
                         {"conf", cfg.conf},
                         {"iou", cfg.iou},
                         {"max_det", cfg.max_det},
                         {"cuda_graph", cfg.cuda_graph}};
  const profile::InferReport rep = profile::profile_inference(po, st, dev, meta, dir);
  InferenceProfile out;
  out.save_dir = dir;
  out.profile_path = rep.profile_path;
  out.summary_path = rep.summary_path;
  out.trace_path = rep.trace_path;
  out.bound = rep.bound;
  out.bound_why = rep.bound_why;
  out.report = rep.text;
  out.img_per_s = rep.img_per_s;
  out.p50_ms = rep.latency["p50_ms"].get<double>();
  out.p90_ms = rep.latency["p90_ms"].get<double>();
  out.p99_ms = rep.latency["p99_ms"].get<double>();
  out.preprocess_ms = rep.stages_ms["preprocess"].get<double>();
  out.forward_ms = rep.stages_ms["forward"].get<double>();
  out.postprocess_ms = rep.stages_ms["postprocess"].get<double>();
  return out;
}

}  // namespace libreyolo::engine
