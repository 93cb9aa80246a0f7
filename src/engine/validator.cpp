#include "engine/validator.hpp"
#include "core/device.hpp"

#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "models/loaded_model.hpp"
#include "core/log.hpp"
#include "data/dataset_yaml.hpp"
#include "data/loader.hpp"
#include "data/synthetic.hpp"
#include "engine/inference.hpp"
#include "eval/coco_eval.hpp"
#include "ops/postprocess.hpp"

namespace fs = std::filesystem;

namespace libreyolo::engine {

namespace {
double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

std::string resolve_data_arg(const std::string& data) {
  if (data != "builtin") return data;
  // Generated once into the cache directory (next to the torch environment) and reused.
  const char* cache = std::getenv("LIBREYOLO_CACHE");
  const char* home = std::getenv("HOME");
  fs::path base = cache && *cache ? fs::path(cache)
                                  : fs::path(home && *home ? home : "/tmp") / ".cache" / "libreyolo-cpp";
  return data::ensure_builtin_dataset((base / "datasets").string());
}

std::vector<std::pair<std::string, double>> evaluate_detector(models::Detector& model,
                                                              const models::Family& family,
                                                              std::shared_ptr<const data::YoloDataset> dataset,
                                                              const EvalOptions& opt) {
  data::LoaderOptions lo;
  lo.mode = data::LoaderMode::Val;
  lo.batch = opt.batch;
  lo.workers = opt.workers;
  lo.shuffle = false;
  lo.pin_memory = opt.device.is_cuda();
  data::DataLoader loader(dataset, lo);
  loader.set_epoch(0);

  const bool was_training = model.is_training();
  model.eval();
  InferenceOptions io_opt;
  io_opt.device = opt.device;
  io_opt.amp = opt.amp;
  io_opt.amp_dtype = opt.amp_dtype;
  InferenceRunner runner(model, family, io_opt);
  eval::CocoEvaluator evaluator;
  double t_pre = 0, t_inf = 0, t_post = 0;
  int64_t images = 0;
  const int S = opt.imgsz;
  double t0 = now_ms();
  while (true) {
    auto batch = loader.next();
    if (!batch) break;
    double t1 = now_ms();
    t_pre += t1 - t0;
    torch::Tensor pred = runner.forward(batch->images);
    libreyolo::synchronize(opt.device);
    double t2 = now_ms();
    t_inf += t2 - t1;
    for (size_t i = 0; i < batch->indices.size(); ++i) {
      const int64_t idx = batch->indices[i];
      const auto [h0, w0] = batch->orig_hw[i];
      const double ratio = std::min(static_cast<double>(S) / h0, static_cast<double>(S) / w0);
      ops::Detections det = runner.postprocess(pred[static_cast<int64_t>(i)],
                                               {opt.conf, opt.iou, opt.max_det, ratio, static_cast<int>(h0),
                                                static_cast<int>(w0)});
      torch::Tensor gt = dataset->original_labels(idx);  // [N,5] x1,y1,x2,y2,cls
      evaluator.add_image(idx, h0, w0, gt.slice(1, 0, 4), gt.select(1, 4).to(torch::kLong),
                          det.boxes.to(torch::kCPU), det.scores.to(torch::kCPU), det.classes.to(torch::kCPU));
      ++images;
    }
    t0 = now_ms();
    t_post += t0 - t2;
  }
  if (was_training) model.train();
  auto stats = evaluator.evaluate();
  auto metrics = stats.metrics();
  const double n = std::max<int64_t>(images, 1);
  metrics.emplace_back("speed/preprocess_ms", t_pre / n);
  metrics.emplace_back("speed/inference_ms", t_inf / n);
  metrics.emplace_back("speed/postprocess_ms", t_post / n);
  metrics.emplace_back("speed/total_ms", (t_pre + t_inf + t_post) / n);
  metrics.emplace_back("speed/total_s", (t_pre + t_inf + t_post) / 1000.0);
  metrics.emplace_back("speed/images_seen", static_cast<double>(images));
  return metrics;
}

ValResult run_validation(models::LoadedModel& impl, const ValConfig& cfg) {
  data::DatasetSpec spec = data::load_dataset_yaml(resolve_data_arg(cfg.data));
  data::DatasetOptions dopt;
  dopt.imgsz = cfg.imgsz;
  dopt.num_classes = impl.model->num_classes();
  auto ds = std::make_shared<data::YoloDataset>(data::list_split_images(spec, cfg.split), dopt);
  EvalOptions eo;
  eo.imgsz = cfg.imgsz;
  eo.batch = cfg.batch;
  eo.workers = cfg.workers;
  eo.conf = cfg.conf;
  eo.iou = cfg.iou;
  eo.max_det = cfg.max_det;
  eo.device = impl.device;
  eo.amp = cfg.half;
  eo.amp_dtype = torch::kHalf;
  log_info("Validating on " + std::to_string(ds->size()) + " images of split '" + cfg.split + "'");
  ValResult r;
  r.metrics = evaluate_detector(*impl.model, *impl.family, ds, eo);
  log_info(strfmt("Validation - mAP50: %.4f, mAP50-95: %.4f", r.get("metrics/mAP50"), r.get("metrics/mAP50-95")));
  return r;
}

}  // namespace libreyolo::engine
