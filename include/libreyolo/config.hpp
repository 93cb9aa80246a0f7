// Configuration structs of the public API. Every field is also a key=value option of the CLI
// and of the Kwargs overloads (same names as LibreYOLO's Python API). Defaults are the
// reference's recipe of the default family; each family overrides what differs (Family::train_defaults).
#pragma once
#include <string>

namespace libreyolo {

struct TrainConfig {
  // What to train on.
  std::string data;              // data YAML, or "builtin" for the generated shapes dataset
  int epochs = 300;
  int batch = 16;                // global batch; -1 = autobatch
  int imgsz = 640;
  std::string device = "auto";   // auto, cpu, cuda, cuda:N, N, "0,1"
  int workers = 8;               // loader threads (0 = load in the training thread)
  std::string cache = "false";   // false, ram (resized images in memory), disk (beside the images, reused by later runs)
  std::string loader = "auto";  // auto (the CPU loader), cpu, gpu (nvJPEG decode + CUDA augmentation; blend recipes, no mixup or cache)
  // CPU loader: JPEGs decoded at a reduced DCT scale covering the size they are shown at (faster;
  // pixels differ from a full decode + resize, most in fine texture). false: every image decoded
  // in full, the reference's pixels.
  bool reduced_decode = true;
  int seed = 0;
  // CUDA: cuDNN algorithms by heuristics, deterministic ones only, no autotuning, so that a seed
  // gives the same weights from run to run on one machine (autotuning races algorithms in each
  // process; the step is slower without it). The CPU is reproducible for a thread count anyway.
  bool deterministic = false;
  std::string resume;            // "", true (the loaded checkpoint), or a checkpoint path
  bool pretrained = true;        // use the loaded weights (false: fresh init of the same shape)

  // Precision and speed.
  bool amp = true;
  std::string amp_dtype = "float16";  // float16 (dynamic loss scaling) or bfloat16 (no scaler)
  std::string memory_format = "auto"; // auto, channels_last, contiguous
  bool cuda_graph = false;            // replay the whole training step from CUDA graphs (CUDA only)
  std::string cuda_graph_scope = "step";  // the deepest capture the family allows within: step (whole step) > network (network, loss eager) > head (backbone and encoder)

  // Optimisation.
  std::string optimizer = "sgd";      // sgd, adam, adamw
  double lr0 = 0.01;
  double lr_backbone = 0.0;           // the backbone's learning rate where the family's parameter rules name one (0 = lr0)
  double backbone_lr_mult = 0.0;      // or as a fraction of lr0, when lr_backbone is 0 (0 = lr0)
  double momentum = 0.937;
  double warmup_momentum = 0.8;       // SGD momentum at the start of warm-up, rising linearly to `momentum`
  double weight_decay = 5e-4;
  bool nesterov = true;
  std::string scheduler = "linear";   // linear, cos (warmcos), cos_flat, constant
  double warmup_epochs = 3;
  double warmup_lr_start = 1e-4;
  double min_lr_ratio = 0.01;
  int nbs = 0;                        // nominal batch for gradient accumulation (0 = off)
  double clip_max_norm = 0.0;         // 0 = no gradient clipping
  std::string freeze;                 // "", N, or comma-separated module names
  // Weight of the training-only auxiliary branch's loss (a PGI neck and head); 0: no branch.
  double aux_weight = 0.25;

  // Augmentation.
  int no_aug_epochs = 15;
  double mosaic_prob = 1.0;
  double mixup_prob = 0.0;
  double hsv_prob = 1.0;
  double flip_prob = 0.5;
  // The mosaic's random affine (rotation, translation as a fraction of imgsz, shear, scale
  // range "lo,hi") and the scaled-paste mixup's partner scale range.
  double degrees = 0.0;
  double translate = 0.1;
  double shear = 0.0;
  std::string mosaic_scale = "0.5,1.5";
  std::string mixup_scale = "0.5,1.5";

  // EMA, validation, checkpoints.
  bool ema = true;
  double ema_decay = 0.9999;
  double ema_tau = 2000;
  bool val = true;
  int eval_interval = 1;         // validate every N epochs (the last epoch always)
  int patience = 50;
  int save_period = 10;
  bool save_plots = false;
  std::string project = "runs/train";
  std::string name = "exp";  // each family sets its own default (<family>_exp)
  bool exist_ok = false;
  bool sync_bn = true;
  bool verbose = true;  // progress lines

  // Profiler (a window of real steps; the report and four files in the run dir).
  bool profile = false;
  int profile_warmup = 5;            // steps discarded before the window
  int profile_steps = 20;            // steps measured: first half unsynced, second half synced per phase
  bool profile_then_stop = false;    // end training when the window closes
  bool profile_trace = true;         // record the Kineto trace (else the summary only)
  bool profile_open = true;          // open timeline.html when a display exists
};

struct PredictConfig {
  std::string source = "SAMPLE_IMAGE";  // image file, directory, or SAMPLE_IMAGE (built in)
  double conf = 0.25;
  double iou = 0.45;
  int imgsz = 0;                        // 0: the size the model was trained at (640 for a fresh model)
  int max_det = 300;
  std::string classes;                  // "", or comma-separated class ids to keep
  std::string device = "auto";
  bool half = false;                    // float16 autocast on CUDA
  std::string cuda_graph = "false";     // false, true (capture each input shape), auto (on its 3rd use)
  int batch = 1;
  bool save = false;                    // write annotated images
  std::string project = "runs/detect";
  std::string name = "predict";
  bool exist_ok = false;
};

// `libreyolo profile infer` / LibreYOLO::profile_inference.
struct InferProfileConfig {
  std::string source = "SAMPLE_IMAGE";  // image file, directory, or SAMPLE_IMAGE
  int batch = 1;
  int imgsz = 0;                        // 0: the model's own size
  bool half = false;                    // autocast on CUDA
  std::string amp_dtype = "float16";    // float16 or bfloat16 (with half)
  int warmup = 20;
  int runs = 100;                       // measured iterations: half unsynced, half synced per stage
  double conf = 0.25;
  double iou = 0.45;
  int max_det = 300;
  bool trace = true;
  std::string cuda_graph = "false";     // false, true, auto: the forward from CUDA graphs
  std::string project = "runs/profile";
  std::string name = "infer";
};

struct ValConfig {
  std::string data;
  std::string split = "val";
  int batch = 16;
  int imgsz = 0;                 // 0: the model's own size
  double conf = 0.001;
  double iou = 0.6;
  int max_det = 300;
  bool half = false;                    // float16 autocast on CUDA
  std::string cuda_graph = "false";     // false, true, auto: the forward replayed from CUDA graphs
  int workers = 4;
  bool reduced_decode = false;          // true: JPEGs at the reduced DCT scale covering imgsz (faster; not predict's pixels)
  std::string device = "auto";
  std::string project = "runs/val";
  std::string name = "exp";
  bool exist_ok = false;
};

}  // namespace libreyolo
