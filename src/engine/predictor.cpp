#include "engine/predictor.hpp"
#include "core/device.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <filesystem>
#include <glob.h>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "models/loaded_model.hpp"
#include "core/background.hpp"
#include "core/log.hpp"
#include "core/paths.hpp"
#include "core/strings.hpp"
#include "core/env.hpp"
#include "data/gpu_batch.hpp"
#include "data/parallel.hpp"
#include "engine/inference.hpp"
#include "io/image.hpp"
#include "io/sample_image.hpp"
#include "ops/draw.hpp"
#include "ops/image_ops.hpp"
#include "ops/postprocess.hpp"

namespace fs = std::filesystem;

namespace libreyolo::engine {

namespace {

bool is_sample(const std::string& s) {
  std::string l = s;
  for (auto& c : l) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return l == "SAMPLE_IMAGE" || l == "SAMPLE";
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}


std::set<int> parse_classes(const std::string& text) {
  std::set<int> out;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find(',', start);
    std::string part = text.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (!part.empty()) {
      try {
        out.insert(std::stoi(part));
      } catch (const std::exception&) {
        throw UsageError("Invalid value for 'classes': '" + text + "'", "Use class ids like classes=0,2.");
      }
    }
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return out;
}

// One batch of sources decoded and fitted (letterbox or stretch): what the forward and the postprocess need.
struct PreparedBatch {
  std::vector<std::string> sources;     // the readable ones, in order
  std::vector<ops::ImageGeometry> geometry;  // their fit's scales and (height, width)
  std::vector<torch::Tensor> originals;  // their decoded images (host; empty when decoded on the GPU)
  std::vector<std::string> skipped;     // unreadable: "path (why)", in order
  torch::Tensor batch;                  // [n, S, S, 3] uint8 (pinned for a CUDA forward)
  double ms = 0;                        // wall time of the preparation
};

// Decodes and fits sources[first, first + count) on up to `threads` threads, each image
// straight into its slot of one batch tensor (pinned for a CUDA forward; the host allocator's
// cache makes that a reuse after the first batches), so nothing is copied on one thread after the
// decoding: the previous version stacked the canvases and then pinned the stack, two serial copies
// of 39 MB per batch of 32 at 640 px. Results keep the sources' order.
PreparedBatch prepare_batch(const std::vector<ImageSource>& sources, size_t first, size_t count, int size,
                            ops::Fit fit, int threads, bool pin) {
  const auto t0 = std::chrono::steady_clock::now();
  torch::Tensor slots =
      torch::empty({static_cast<int64_t>(count), size, size, 3}, torch::TensorOptions().dtype(torch::kUInt8).pinned_memory(pin));
  uint8_t* base = slots.data_ptr<uint8_t>();
  const int64_t slot_bytes = int64_t(size) * size * 3;
  std::vector<torch::Tensor> images(count);
  std::vector<ops::FitBox> boxes(count);
  std::vector<std::string> errors(count);
  // An unreadable image is skipped; anything else (out of memory, a bug) reaches the caller.
  data::parallel_for(static_cast<int64_t>(count), threads, [&](int64_t k) {
    const auto i = static_cast<size_t>(k);
    try {
      images[i] = load_image(sources[first + i]);
      ops::fit_into(images[i], size, fit, base + k * slot_bytes, &boxes[i]);
    } catch (const Error& e) {
      errors[i] = e.what();
      images[i] = torch::Tensor();
    }
  });
  PreparedBatch b;
  std::vector<int64_t> kept;
  for (size_t i = 0; i < count; ++i) {
    if (!images[i].defined()) {
      b.skipped.push_back(sources[first + i].name + " (" + errors[i] + ")");
      continue;
    }
    kept.push_back(static_cast<int64_t>(i));
    b.sources.push_back(sources[first + i].name);
    b.geometry.push_back({boxes[i].sx, boxes[i].sy, static_cast<int>(images[i].size(0)), static_cast<int>(images[i].size(1))});
    b.originals.push_back(std::move(images[i]));
  }
  if (kept.size() == count) {
    b.batch = slots;
  } else if (!kept.empty()) {  // an unreadable file in this batch: close the gaps (rare)
    b.batch = slots.index_select(0, torch::tensor(kept, torch::kLong));
    if (pin) b.batch = b.batch.pin_memory();
  }
  b.ms = ms_since(t0);
  return b;
}

// prepare_batch on the GPU: each file read and its header probed here, then decoded and
// fitted on the device by `maker` in one call (a one-tile plan per image: the same geometry and
// resize arithmetic as ops::fit_into, pixels equal up to the JPEG decoder).
// What nvJPEG cannot read is decoded on the CPU by the maker; what nothing reads is skipped.
PreparedBatch prepare_batch_gpu(const std::vector<ImageSource>& sources, size_t first, size_t count, int size,
                                ops::Fit fit, data::GpuBatchMaker& maker) {
  const auto t0 = std::chrono::steady_clock::now();
  PreparedBatch b;
  std::vector<data::PlannedSample> samples;
  for (size_t i = 0; i < count; ++i) {
    const std::string& src = sources[first + i].name;  // files only (run_predict)
    try {
      const io::ImageSize is = io::probe_image_size(src);
      const ops::FitBox f = ops::fit_box(is.height, is.width, size, fit);
      const int nh = static_cast<int>(f.height), nw = static_cast<int>(f.width);
      data::PlannedSample s;
      s.plan.num_tiles = 1;
      s.plan.content_w = nw;
      s.plan.content_h = nh;
      s.plan.tiles[0] = {static_cast<int64_t>(samples.size()), nw, nh, 0, 0, 0, 0, nw, nh};
      s.files[0] = data::read_file_bytes(src);
      s.names[0] = src;
      samples.push_back(std::move(s));
      b.sources.push_back(src);
      b.geometry.push_back({f.sx, f.sy, is.height, is.width});
    } catch (const Error& e) {
      b.skipped.push_back(src + " (" + e.what() + ")");
    }
  }
  std::vector<std::pair<int64_t, std::string>> bad;
  while (!samples.empty()) {
    b.batch = maker.make(samples, &bad);
    if (bad.empty()) break;
    // Files that decode nowhere: skipped, the rest planned again (rare).
    std::set<int64_t> drop;
    for (const auto& [index, why] : bad) {
      drop.insert(index);
      b.skipped.push_back(b.sources[static_cast<size_t>(index)] + " (" + why + ")");
    }
    PreparedBatch kept;
    std::vector<data::PlannedSample> left;
    for (size_t k = 0; k < samples.size(); ++k) {
      if (drop.count(static_cast<int64_t>(k))) continue;
      data::PlannedSample s = samples[k];
      s.plan.tiles[0].index = static_cast<int64_t>(left.size());
      left.push_back(std::move(s));
      kept.sources.push_back(b.sources[k]);
      kept.geometry.push_back(b.geometry[k]);
    }
    samples = std::move(left);
    b.sources = std::move(kept.sources);
    b.geometry = std::move(kept.geometry);
    b.batch = torch::Tensor();
  }
  b.ms = ms_since(t0);
  return b;
}

}  // namespace

// The GPU's JPEG decoder for predict (data/gpu_batch.hpp: nvJPEG, the JPEG engines where the GPU
// has them), one per (device, size) for the process: on the H200 one 640x480 JPEG decoded and
// letterboxed on the device took 0.22-0.25 ms against 1.1 ms for libjpeg-turbo on the host plus the
// letterbox and upload (bench_jpeg_decode). Used for CUDA runs that save no pictures (drawing
// needs the host pixels), unless LIBREYOLO_PREDICT_NVJPEG=0.
//
// Creating its handles takes far longer than decoding: 639 ms for the JPEG engines and 120 ms for
// the hybrid decoder on an H200 (bench_predict's jpeg_decoder_start_ms). So a request with `start`
// starts the decoder on a thread of its own and gets null (the host decodes), and every later
// request gets the decoder once it is ready: a first predict never waits for nvJPEG. Callers ask
// without `start` before their first forward and with it after: the handles' creation slows the
// driver calls of a first forward that runs beside it. Null also when the decoder is unavailable
// or failed to start (said once, at debug level: the host path gives the same result).
namespace {

struct StartingDecoder {
  std::future<std::unique_ptr<data::GpuBatchMaker>> start;
  std::unique_ptr<data::GpuBatchMaker> maker;
  bool failed = false;

  // Takes the started decoder once its start has ended (when `wait`, after waiting for it).
  void settle(bool wait) {
    if (maker || failed || !start.valid()) return;
    if (!wait && start.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return;
    try {
      maker = start.get();
      const auto t = maker->start_times();
      log_debug(strfmt("device JPEG decoder (%s) started: engines %.1f ms, hybrid decoder %.1f ms",
                       maker->backend().c_str(), t.hardware_ms, t.hybrid_ms));
    } catch (const std::exception& e) {
      failed = true;
      log_debug(std::string("device JPEG decoder unavailable, decoding on the host: ") + e.what());
    }
  }
};

std::mutex decoders_mu;
// The decoders (never destroyed at exit: they are ended by stop_background_work, core/background.hpp).
std::map<std::pair<int, int>, StartingDecoder>& decoders() {
  static auto* all = [] {
    on_background_stop([] {
      std::lock_guard<std::mutex> lock(decoders_mu);
      for (auto& [key, d] : decoders()) d.settle(true);  // a start in progress finishes
      decoders().clear();
    });
    return new std::map<std::pair<int, int>, StartingDecoder>();
  }();
  return *all;
}

}  // namespace

data::GpuBatchMaker* predict_gpu_decoder(const torch::Device& dev, int size, bool save, bool start) {
  static const bool on = env_switch_on("LIBREYOLO_PREDICT_NVJPEG");
  if (!on || save || !dev.is_cuda() || !data::gpu_loader_available()) return nullptr;
  std::lock_guard<std::mutex> lock(decoders_mu);
  const int index = dev.index() < 0 ? 0 : dev.index();
  StartingDecoder& d = decoders()[{index, size}];
  if (!d.start.valid() && !d.maker && !d.failed) {
    if (!start) return nullptr;
    d.start = std::async(std::launch::async, [index, size] { return std::make_unique<data::GpuBatchMaker>(index, size); });
    return nullptr;
  }
  d.settle(false);
  return d.maker.get();
}

void wait_for_predict_gpu_decoders() {
  std::lock_guard<std::mutex> lock(decoders_mu);
  for (auto& [key, d] : decoders()) d.settle(true);
}

std::vector<std::string> resolve_sources(const std::string& source) {
  if (is_sample(source)) return {"SAMPLE_IMAGE"};
  std::error_code ec;
  if (fs::is_regular_file(source, ec)) return {source};
  if (fs::is_directory(source, ec)) {
    std::vector<std::string> files;
    int64_t unread = 0;
    for (const auto& e : fs::directory_iterator(source, ec)) {
      if (!e.is_regular_file()) continue;
      if (io::has_image_extension(e.path().string())) files.push_back(e.path().string());
      unread += io::has_unread_image_extension(e.path().string());
    }
    std::sort(files.begin(), files.end());
    if (unread > 0)
      log_warn(strfmt("%s: %lld image(s) in formats this build does not read (GIF, TIFF, WebP, ...) are skipped",
                      source.c_str(), static_cast<long long>(unread)));
    if (files.empty())
      throw DataError("No images found in " + source + (unread ? " that this build reads (JPEG, PNG, BMP)" : ""), "",
                      "source_not_found");
    return files;
  }
  if (source.find_first_of("*?[") != std::string::npos) {
    // A pattern the shell did not expand (source=imgs/*.png is one word to the shell).
    std::vector<std::string> files;
    glob_t g{};
    const int rc = ::glob(source.c_str(), 0, nullptr, &g);
    if (rc == 0)
      for (size_t i = 0; i < g.gl_pathc; ++i)
        if (fs::is_regular_file(g.gl_pathv[i], ec) && io::has_image_extension(g.gl_pathv[i]))
          files.push_back(g.gl_pathv[i]);  // glob(3) sorts
    globfree(&g);
    if (files.empty())
      throw DataError("No images match the pattern " + source, "Check the pattern, or pass a file or a directory.",
                      "source_not_found");
    return files;
  }
  throw DataError("Source not found: " + source,
                  "Pass an image file, a directory, a pattern such as 'imgs/*.jpg', or source=SAMPLE_IMAGE.",
                  "source_not_found");
}

std::string saved_image_name(const std::string& source, std::set<std::string>& used) {
  std::string name = "sample.jpg";
  if (source != "SAMPLE_IMAGE") {
    // The source's own file name, so that dup.jpg and dup.png stay apart; formats that cannot
    // be written (bmp, webp, ...) get ".jpg" appended: a.bmp -> a.bmp.jpg.
    name = fs::path(source).filename().string();
    std::string ext = fs::path(source).extension().string();
    ext = lower(ext);
    if (ext != ".jpg" && ext != ".jpeg" && ext != ".png") name += ".jpg";
  }
  // Same file name from two folders (a glob over several): number the later ones.
  const fs::path p(name);
  for (int k = 2; used.count(name); ++k)
    name = p.stem().string() + "_" + std::to_string(k) + p.extension().string();
  used.insert(name);
  return name;
}

std::vector<ImageSource> image_sources(const std::string& source) {
  std::vector<ImageSource> out;
  for (auto& name : resolve_sources(source)) out.push_back({std::move(name), torch::Tensor()});
  return out;
}

torch::Tensor load_image(const ImageSource& source) {
  if (source.pixels.defined()) return source.pixels;
  return source.name == "SAMPLE_IMAGE" ? io::make_sample_image() : io::decode_image(source.name);
}

std::vector<PredictResult> run_predict(models::LoadedModel& impl, const PredictConfig& cfg) {
  return run_predict(impl, cfg, image_sources(cfg.source));
}

std::vector<PredictResult> run_predict(models::LoadedModel& impl, const PredictConfig& cfg,
                                       const std::vector<ImageSource>& sources) {
  if (sources.empty()) throw UsageError("predict: no images given", "", "source_not_found");
  const std::set<int> keep = parse_classes(cfg.classes);
  const int S = cfg.imgsz > 0 ? cfg.imgsz : impl.imgsz;
  const torch::Device dev = impl.device;
  auto& model = *impl.model;
  model.eval();
  InferenceOptions io_opt;
  io_opt.device = dev;
  io_opt.amp = cfg.half;  // float16 autocast on CUDA, as in validation
  if (cfg.half && !dev.is_cuda()) log_info("half=true asks for float16, which is CUDA-only: predicting in float32 on the CPU");
  io_opt.amp_dtype = torch::kHalf;
  io_opt.graphs = impl.graphs.get();
  io_opt.graph_mode = models::parse_graph_mode(cfg.cuda_graph);
  InferenceRunner runner(model, *impl.family, io_opt);
  std::string out_dir;
  if (cfg.save) {
    out_dir = make_run_dir(cfg.project, cfg.name, cfg.exist_ok);
    // The pictures keep their sources' file names: written into a source's own folder they
    // would replace it.
    std::error_code ec;
    for (const auto& src : sources) {
      if (src.pixels.defined() || src.name == "SAMPLE_IMAGE") continue;
      const fs::path folder = fs::path(src.name).parent_path().empty() ? fs::path(".") : fs::path(src.name).parent_path();
      if (fs::equivalent(folder, out_dir, ec))
        throw UsageError("predict save=true would write its pictures into " + out_dir + ", the folder of the image " +
                             src.name + ", replacing it",
                         "Save elsewhere: another project= or name= (or exist_ok=false, which numbers a new folder).",
                         "config_conflict");
    }
  }

  std::vector<PredictResult> results;
  std::set<std::string> used_names;
  std::vector<std::string> skipped;  // unreadable images: warned about, then left out
  // Decoding runs one batch ahead on its own threads, so a folder's next images are read while
  // this batch is on the device (and its detections are drawn and saved).
  const size_t step = static_cast<size_t>(cfg.batch);
  const int threads = std::max(1, std::min(static_cast<int>(std::thread::hardware_concurrency()), cfg.batch));
  const bool pin = dev.is_cuda();
  // One batch in all: prepared on this thread when asked for (no thread to start for one image).
  const auto policy = sources.size() > step ? std::launch::async : std::launch::deferred;
  const ops::Fit fit = impl.family->input.fit;
  // The device decoder reads files: not for the built-in image or pixels already in memory.
  const bool files = std::none_of(sources.begin(), sources.end(), [](const ImageSource& s) {
    return s.pixels.defined() || s.name == "SAMPLE_IMAGE";
  });
  // The decoder is asked to start after the first forward, not before (see predict_gpu_decoder).
  data::GpuBatchMaker* gpu = files ? predict_gpu_decoder(dev, S, cfg.save, /*start=*/false) : nullptr;
  auto start = [&](size_t first) {
    const size_t count = std::min(sources.size() - first, step);
    if (gpu) return std::async(policy, prepare_batch_gpu, std::cref(sources), first, count, S, fit, std::ref(*gpu));
    return std::async(policy, prepare_batch, std::cref(sources), first, count, S, fit, threads, pin);
  };
  std::future<PreparedBatch> ahead = start(0);
  for (size_t first = 0; first < sources.size(); first += step) {
    PreparedBatch prepared = ahead.get();
    if (first + step < sources.size()) ahead = start(first + step);
    for (const std::string& why : prepared.skipped) {
      log_warn("skipping " + why);
      skipped.push_back(why);
    }
    const size_t n = prepared.sources.size();
    if (n == 0) continue;
    const std::vector<torch::Tensor>& originals = prepared.originals;
    const std::vector<ops::ImageGeometry>& geometry = prepared.geometry;
    const std::vector<std::string>& batch_sources = prepared.sources;
    const torch::Tensor& batch = prepared.batch;
    const double pre_ms = prepared.ms;

    auto t1 = std::chrono::steady_clock::now();
    torch::Tensor pred = runner.forward(batch);
    libreyolo::synchronize(dev);
    double inf_ms = ms_since(t1);
    if (files && !gpu) gpu = predict_gpu_decoder(dev, S, cfg.save);  // batches prepared from now on may use it

    // The batch's detections at once (one pass over the device for all images), then per image.
    const auto t_post = std::chrono::steady_clock::now();
    std::vector<models::PostprocessArgs> args;
    for (size_t i = 0; i < n; ++i)
      args.push_back({cfg.conf, cfg.iou, cfg.max_det, geometry[i]});
    std::vector<ops::Detections> dets = runner.postprocess_batch(pred, args);
    const double post_each_ms = ms_since(t_post) / static_cast<double>(n);
    for (size_t i = 0; i < n; ++i) {
      auto t2 = std::chrono::steady_clock::now();
      const int h = geometry[i].orig_h, w = geometry[i].orig_w;
      ops::Detections det = std::move(dets[i]);
      PredictResult r;
      r.source = batch_sources[i];
      r.height = h;
      r.width = w;
      det.boxes = det.boxes.to(torch::kCPU).contiguous();
      det.scores = det.scores.to(torch::kCPU).contiguous();
      det.classes = det.classes.to(torch::kCPU).contiguous();
      if (!keep.empty()) {
        std::vector<int64_t> idx;
        auto cls = det.classes.accessor<int64_t, 1>();
        for (int64_t k = 0; k < det.classes.size(0); ++k)
          if (keep.count(static_cast<int>(cls[k]))) idx.push_back(k);
        auto sel = torch::tensor(idx, torch::kLong);
        det = {det.boxes.index_select(0, sel), det.scores.index_select(0, sel), det.classes.index_select(0, sel)};
      }
      auto b = det.boxes.accessor<float, 2>();
      auto sc = det.scores.accessor<float, 1>();
      auto cl = det.classes.accessor<int64_t, 1>();
      for (int64_t k = 0; k < det.boxes.size(0); ++k) {
        const int c = static_cast<int>(cl[k]);
        Detection d;
        d.x1 = b[k][0];
        d.y1 = b[k][1];
        d.x2 = b[k][2];
        d.y2 = b[k][3];
        d.score = sc[k];
        d.class_id = c;
        d.class_name = c >= 0 && c < static_cast<int>(impl.names.size()) ? impl.names[c] : std::to_string(c);
        r.detections.push_back(std::move(d));
      }
      r.preprocess_ms = pre_ms / static_cast<double>(n);
      r.inference_ms = inf_ms / static_cast<double>(n);
      r.postprocess_ms = post_each_ms + ms_since(t2);
      if (cfg.save) {
        torch::Tensor canvas = originals.at(i).clone();  // saving decodes on the host (predict_gpu_decoder)
        ops::draw_detections(canvas, det, impl.names);
        r.saved_path = (fs::path(out_dir) / saved_image_name(r.source, used_names)).string();
        io::save_image(r.saved_path, canvas);
      }
      results.push_back(std::move(r));
    }
  }
  if (!skipped.empty()) {
    if (results.empty())
      throw DataError(skipped.size() == 1 ? "Cannot read image " + skipped.front()
                                          : "None of the " + std::to_string(skipped.size()) +
                                                " images could be read (first: " + skipped.front() + ")",
                      "Check that the files are valid JPEG/PNG/BMP images.", "data_invalid");
    log_warn(std::to_string(skipped.size()) + " of " + std::to_string(sources.size()) + " images skipped (unreadable)");
  }
  return results;
}

}  // namespace libreyolo::engine
