#include "engine/validator.hpp"
#include "core/env.hpp"
#include "core/device.hpp"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "models/loaded_model.hpp"
#include "core/log.hpp"
#include "core/strings.hpp"
#include "data/dataset_yaml.hpp"
#include "data/loader.hpp"
#include "data/synthetic.hpp"
#include "core/paths.hpp"
#include "engine/inference.hpp"
#include "eval/coco_eval.hpp"
#include "eval/confusion.hpp"
#include "ops/postprocess.hpp"
#include "plots/plots.hpp"

#include <nlohmann/json.hpp>

namespace fs = std::filesystem;

namespace libreyolo::engine {

namespace {
std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> out;
  size_t b = 0;
  for (size_t e; (e = text.find('\n', b)) != std::string::npos; b = e + 1) out.push_back(text.substr(b, e - b));
  if (b < text.size()) out.push_back(text.substr(b));
  return out;
}

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

std::string resolve_data_arg(const std::string& data) {
  if (data != "builtin") return data;
  // Generated once into the cache directory (next to the torch environment) and reused.
  const char* cache = env_get("LIBREYOLO_CACHE");
  const char* home = std::getenv("HOME");
  fs::path base = cache && *cache ? fs::path(cache)
                                  : fs::path(home && *home ? home : "/tmp") / ".cache" / "libreyolo-cpp";
  return data::ensure_builtin_dataset((base / "datasets").string());
}

namespace {
std::string class_name(const std::vector<std::string>& names, int id) {
  return id >= 0 && id < static_cast<int>(names.size()) && !names[id].empty() ? names[id] : std::to_string(id);
}
}  // namespace

std::string format_val_table(const eval::CocoStats& s, const std::vector<std::string>& names) {
  std::string out = strfmt("%22s%11s%11s%11s%11s%11s%11s\n", "Class", "Images", "Instances", "P", "R", "mAP50",
                           "mAP50-95");
  auto row = [&](const std::string& name, int64_t images, int64_t instances, double p, double r, double m50,
                 double m) {
    // Names padded by display columns, so that non-ASCII names keep the numbers aligned.
    out += pad_left(name, 22) + strfmt("%11lld%11lld%11.3f%11.3f%11.3f%11.3f\n", static_cast<long long>(images),
                  static_cast<long long>(instances), p, r, m50, m);
  };
  // COCO's "undefined" (-1: no labels at all) prints as 0, as the table's other empty cells.
  row("all", s.images, s.instances, s.precision, s.recall, std::max(s.stats[1], 0.0), std::max(s.stats[0], 0.0));
  for (const auto& c : s.classes)
    row(class_name(names, c.category), c.images, c.instances, c.precision, c.recall, c.ap50, c.ap50_95);
  return out;
}

std::vector<std::pair<std::string, double>> evaluate_detector(models::Detector& model,
                                                              const models::Family& family,
                                                              std::shared_ptr<const data::YoloDataset> dataset,
                                                              const EvalOptions& opt) {
  return evaluate_detector_report(model, family, std::move(dataset), opt).metrics;
}

EvalReport evaluate_detector_report(models::Detector& model, const models::Family& family,
                                    std::shared_ptr<const data::YoloDataset> dataset, const EvalOptions& opt) {
  data::LoaderOptions lo;
  lo.mode = data::LoaderMode::Val;
  lo.batch = opt.batch;
  lo.workers = opt.workers;
  lo.shuffle = false;
  lo.augment.fit = family.input.fit;
  lo.pin_memory = opt.inference.device.is_cuda();
  data::DataLoader loader(dataset, lo);
  loader.set_epoch(0);

  const bool was_training = model.is_training();
  model.eval();
  InferenceRunner runner(model, family, opt.inference);
  eval::CocoEvaluator evaluator;
  const int nc = model.num_classes();
  std::unique_ptr<eval::ConfusionMatrix> confusion;
  if (!opt.plot_dir.empty() && nc > eval::ConfusionMatrix::kMaxClasses)
    log_info(strfmt("Validation plots: no confusion matrix for %d classes (it is drawn up to %d)", nc,
                    eval::ConfusionMatrix::kMaxClasses));
  else if (!opt.plot_dir.empty() && nc > 0)
    confusion = std::make_unique<eval::ConfusionMatrix>(nc);
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
    libreyolo::synchronize(opt.inference.device);
    double t2 = now_ms();
    t_inf += t2 - t1;
    std::vector<models::PostprocessArgs> args;
    for (size_t i = 0; i < batch->indices.size(); ++i) {
      const auto [h0, w0] = batch->orig_hw[i];
      const ops::FitBox box = ops::fit_box(h0, w0, S, family.input.fit);
      args.push_back({opt.thresholds.conf, opt.thresholds.iou, opt.thresholds.max_det,
                      {box.sx, box.sy, static_cast<int>(h0), static_cast<int>(w0)}});
    }
    std::vector<ops::Detections> dets = runner.postprocess_batch(pred, args);
    for (size_t i = 0; i < batch->indices.size(); ++i) {
      const int64_t idx = batch->indices[i];
      const auto [h0, w0] = batch->orig_hw[i];
      const ops::Detections& det = dets[i];
      torch::Tensor gt = dataset->original_labels(idx);  // [N,5] x1,y1,x2,y2,cls
      const auto det_boxes = det.boxes.to(torch::kCPU), det_scores = det.scores.to(torch::kCPU);
      const auto det_classes = det.classes.to(torch::kCPU);
      evaluator.add_image(idx, h0, w0, gt.slice(1, 0, 4), gt.select(1, 4).to(torch::kLong), det_boxes, det_scores,
                          det_classes);
      if (confusion) {
        // Labels of classes the model does not have cannot be confused with anything it predicts.
        const auto keep = gt.select(1, 4) < nc;
        const auto g = gt.index({keep});
        confusion->add_image(g.slice(1, 0, 4), g.select(1, 4).to(torch::kLong), det_boxes, det_scores, det_classes);
      }
      ++images;
    }
    t0 = now_ms();
    t_post += t0 - t2;
  }
  if (was_training) model.train();
  EvalReport report;
  report.stats = evaluator.evaluate();
  auto& metrics = report.metrics;
  metrics = report.stats.metrics();
  const double n = std::max<int64_t>(images, 1);
  metrics.emplace_back("speed/preprocess_ms", t_pre / n);
  metrics.emplace_back("speed/inference_ms", t_inf / n);
  metrics.emplace_back("speed/postprocess_ms", t_post / n);
  metrics.emplace_back("speed/total_ms", (t_pre + t_inf + t_post) / n);
  metrics.emplace_back("speed/total_s", (t_pre + t_inf + t_post) / 1000.0);
  metrics.emplace_back("speed/images_seen", static_cast<double>(images));
  if (opt.log_table)
    for (const std::string& line : split_lines(format_val_table(report.stats, opt.names))) log_info(line);
  if (!opt.plot_dir.empty()) {
    try {
      report.plots = plots::plot_validation(report.stats, confusion.get(), opt.names, opt.plot_dir);
    } catch (const std::exception& e) {
      log_warn(std::string("Validation plots could not be written to ") + opt.plot_dir + ": " + e.what());
    }
  }
  return report;
}

namespace {

// metrics.json (metrics, per-class rows, settings) and per_class.csv (the table as CSV) in dir.
void write_val_files(const std::string& dir, const ValConfig& cfg, const ValResult& r, double best_conf) {
  nlohmann::json j;
  j["data"] = cfg.data;
  j["split"] = cfg.split;
  j["imgsz"] = cfg.imgsz;
  j["conf"] = cfg.conf;
  j["iou"] = cfg.iou;
  j["best_f1_conf"] = best_conf;
  j["metrics"] = nlohmann::json::object();
  for (const auto& [k, v] : r.metrics) j["metrics"][k] = std::isfinite(v) ? nlohmann::json(v) : nlohmann::json();
  j["classes"] = nlohmann::json::array();
  std::string csv = "class,name,images,instances,precision,recall,mAP50,mAP50-95\n";
  csv += strfmt("-1,all,%lld,%lld,%.6g,%.6g,%.6g,%.6g\n", static_cast<long long>(r.get("val/images")),
                static_cast<long long>(r.get("val/instances")), r.get("metrics/precision"), r.get("metrics/recall"),
                std::max(r.get("metrics/mAP50"), 0.0), std::max(r.get("metrics/mAP50-95"), 0.0));
  for (const auto& c : r.classes) {
    j["classes"].push_back({{"id", c.id}, {"name", c.name}, {"images", c.images}, {"instances", c.instances},
                            {"precision", c.precision}, {"recall", c.recall}, {"mAP50", c.mAP50},
                            {"mAP50-95", c.mAP50_95}});
    std::string name = c.name;
    if (name.find_first_of(",\"\n") != std::string::npos) {
      std::string q = "\"";
      for (char ch : name) q += ch == '"' ? std::string("\"\"") : std::string(1, ch);
      name = q + "\"";
    }
    csv += strfmt("%d,%s,%lld,%lld,%.6g,%.6g,%.6g,%.6g\n", c.id, name.c_str(), static_cast<long long>(c.images),
                  static_cast<long long>(c.instances), c.precision, c.recall, c.mAP50, c.mAP50_95);
  }
  write_file_atomic((fs::path(dir) / "metrics.json").string(), j.dump(2) + "\n");
  write_file_atomic((fs::path(dir) / "per_class.csv").string(), csv);
}

}  // namespace

void check_classes_match(const std::vector<std::string>& model_names, int model_nc,
                         const std::vector<std::string>& data_names, const std::string& data) {
  if (data_names.empty()) return;
  const auto list = [](const std::vector<std::string>& v) {
    std::string out;
    for (size_t i = 0; i < v.size() && i < 8; ++i) out += (i ? ", " : "") + v[i];
    return v.size() > 8 ? out + ", ..." : out;
  };
  if (static_cast<int>(data_names.size()) != model_nc)
    throw DataError(strfmt("the model has %d classes (%s) and the dataset '%s' %zu (%s): metrics by class id "
                           "would compare different things",
                           model_nc, list(model_names).c_str(), data.c_str(), data_names.size(),
                           list(data_names).c_str()),
                    "Validate on a dataset with the model's classes, or train the model on this one.",
                    "class_mismatch");
  std::string differ;
  for (size_t i = 0; i < data_names.size() && i < model_names.size(); ++i)
    if (data_names[i] != model_names[i])
      differ += strfmt("%s%zu: model '%s', dataset '%s'", differ.empty() ? "" : "; ", i, model_names[i].c_str(),
                       data_names[i].c_str());
  if (!differ.empty()) log_warn("class names differ between the model and the dataset (" + differ + "); the metrics use the dataset's");
}

ValResult run_validation(models::LoadedModel& impl, const ValConfig& requested) {
  ValConfig cfg = requested;
  if (cfg.imgsz == 0) cfg.imgsz = impl.imgsz;  // the model's own size
  data::DatasetSpec spec = data::load_dataset_yaml(resolve_data_arg(cfg.data));
  data::DatasetOptions dopt;
  dopt.imgsz = cfg.imgsz;
  dopt.fit = impl.family->input.fit;
  dopt.num_classes = impl.model->num_classes();
  dopt.reduced_decode = cfg.reduced_decode;
  // A model that was never trained has no classes of its own to compare (its metrics say nothing
  // either way): a warning then.
  const bool fresh = impl.weights.empty() && !impl.checkpoint;
  try {
    check_classes_match(impl.names, impl.model->num_classes(), spec.names, cfg.data);
  } catch (const DataError& e) {
    if (!fresh) throw;
    log_warn(std::string(e.what()) + " (an untrained model: validating anyway)");
  }
  auto ds = std::make_shared<data::YoloDataset>(data::list_split_images(spec, cfg.split), dopt);
  if (ds->num_boxes() == 0)
    throw DataError(strfmt("split '%s' of %s: its %lld images have no labels (no label file, or only empty ones), so "
                           "its mAP is undefined; looked for %s first",
                           cfg.split.c_str(), cfg.data.c_str(), static_cast<long long>(ds->size()),
                           data::label_path_for(ds->image_path(0)).c_str()),
                    "Labels go beside the images: .../images/x.jpg -> .../labels/x.txt, one 'class cx cy w h' row per "
                    "object.",
                    "no_labels");
  EvalOptions eo;
  eo.imgsz = cfg.imgsz;
  eo.batch = cfg.batch;
  eo.workers = cfg.workers;
  eo.thresholds = {cfg.conf, cfg.iou, cfg.max_det};
  eo.inference.device = impl.device;
  eo.inference.amp = cfg.half;
  if (cfg.half && !impl.device.is_cuda())
    log_info("half=true asks for float16, which is CUDA-only: validating in float32 on the CPU");
  eo.inference.amp_dtype = torch::kHalf;
  eo.inference.graphs = impl.graphs.get();
  eo.inference.graph_mode = models::parse_graph_mode(cfg.cuda_graph);
  eo.names = !spec.names.empty() ? spec.names : impl.names;
  ValResult r;
  r.save_dir = make_run_dir(cfg.project, cfg.name, cfg.exist_ok);
  eo.plot_dir = r.save_dir;
  log_info("Validating on " + std::to_string(ds->size()) + " images of split '" + cfg.split + "'");
  EvalReport report = evaluate_detector_report(*impl.model, *impl.family, ds, eo);
  r.metrics = std::move(report.metrics);
  r.metrics.emplace_back("val/images", static_cast<double>(report.stats.images));
  r.metrics.emplace_back("val/instances", static_cast<double>(report.stats.instances));
  for (const auto& c : report.stats.classes) {
    const bool named = c.category >= 0 && eo.names.size() > static_cast<size_t>(c.category);
    r.classes.push_back({c.category, named ? eo.names[c.category] : std::to_string(c.category), c.images, c.instances,
                         c.precision, c.recall, c.ap50, c.ap50_95});
  }
  r.table = format_val_table(report.stats, eo.names);
  write_val_files(r.save_dir, cfg, r, report.stats.best_conf);
  log_info(strfmt("Validation - mAP50: %.4f, mAP50-95: %.4f", r.get("metrics/mAP50"), r.get("metrics/mAP50-95")));
  log_info("Results saved to " + r.save_dir);
  return r;
}

}  // namespace libreyolo::engine
