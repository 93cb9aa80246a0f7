#include "data/synthetic.hpp"

#include "core/paths.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <libreyolo/errors.hpp>

#include "core/log.hpp"
#include "data/dataset_yaml.hpp"
#include "data/parallel.hpp"
#include "data/rng.hpp"
#include "io/image.hpp"

namespace fs = std::filesystem;

namespace libreyolo::data {
namespace {

enum Shape { kCircle, kSquare, kTriangle, kCross, kDiamond, kRing, kHexagon, kStar };

// Inside test in the object's frame: u, v in [-1, 1] span the bounding box exactly, and every
// shape touches all four sides of it, so the label is the rectangle itself.
bool inside(int shape, double u, double v) {
  const double au = std::abs(u), av = std::abs(v);
  if (au > 1.0 || av > 1.0) return false;
  switch (shape) {
    case kCircle: return u * u + v * v <= 1.0;
    case kSquare: return true;
    case kTriangle: return au <= (v + 1.0) * 0.5;  // apex at the top, base along the bottom
    case kCross: return au <= 0.3 || av <= 0.3;
    case kDiamond: return au + av <= 1.0;
    case kRing: {
      const double r2 = u * u + v * v;
      return r2 <= 1.0 && r2 >= 0.36;
    }
    case kHexagon: return au <= 1.0 - av * 0.5;  // flat top and bottom
    default: return std::sqrt(au) + std::sqrt(av) <= 1.0;  // four-pointed star
  }
}

void hsv_colour(double h_deg, double s, double v, double rgb[3]) {
  h_deg = std::fmod(std::fmod(h_deg, 360.0) + 360.0, 360.0);
  const double c = v * s;
  const double hp = h_deg / 60.0;
  const double x = c * (1.0 - std::abs(std::fmod(hp, 2.0) - 1.0));
  double r = 0, g = 0, b = 0;
  switch (static_cast<int>(hp)) {
    case 0: r = c, g = x; break;
    case 1: r = x, g = c; break;
    case 2: g = c, b = x; break;
    case 3: g = x, b = c; break;
    case 4: r = x, b = c; break;
    default: r = c, b = x; break;
  }
  const double m = v - c;
  rgb[0] = (r + m) * 255.0;
  rgb[1] = (g + m) * 255.0;
  rgb[2] = (b + m) * 255.0;
}

inline uint8_t to_u8(double x) { return static_cast<uint8_t>(std::clamp(std::lround(x), 0L, 255L)); }

struct Object {
  int cls;
  double x0, y0, x1, y1;
};

// Smooth background: a muted base colour, a low-frequency field bilinearly interpolated from a
// coarse random grid, a few faint lines and pixel noise.
void draw_background(Rng& rng, int W, int H, std::vector<double>& img) {
  double base[3];
  hsv_colour(rng.uniform(0, 360), rng.uniform(0.0, 0.25), rng.uniform(0.35, 0.75), base);
  constexpr int G = 5;
  double grid[G][G][3];
  for (auto& row : grid)
    for (auto& cell : row)
      for (double& c : cell) c = rng.uniform(-35.0, 35.0);
  for (int y = 0; y < H; ++y) {
    const double gy = static_cast<double>(y) / std::max(1, H - 1) * (G - 1);
    const int y0 = std::min(static_cast<int>(gy), G - 2);
    const double fy = gy - y0;
    for (int x = 0; x < W; ++x) {
      const double gx = static_cast<double>(x) / std::max(1, W - 1) * (G - 1);
      const int x0 = std::min(static_cast<int>(gx), G - 2);
      const double fx = gx - x0;
      for (int c = 0; c < 3; ++c) {
        const double f = (1 - fy) * ((1 - fx) * grid[y0][x0][c] + fx * grid[y0][x0 + 1][c]) +
                         fy * ((1 - fx) * grid[y0 + 1][x0][c] + fx * grid[y0 + 1][x0 + 1][c]);
        img[(static_cast<size_t>(y) * W + x) * 3 + c] = base[c] + f;
      }
    }
  }
  const int lines = static_cast<int>(rng.randint(2, 6));
  for (int l = 0; l < lines; ++l) {
    double col[3];
    hsv_colour(rng.uniform(0, 360), rng.uniform(0.0, 0.3), rng.uniform(0.2, 0.9), col);
    const double ax = rng.uniform(0, W), ay = rng.uniform(0, H);
    const double ang = rng.uniform(0, 3.141592653589793);
    const double dx = std::cos(ang), dy = std::sin(ang);
    const double half = rng.uniform(0.5, 1.5);
    const double alpha = rng.uniform(0.2, 0.5);
    for (int y = 0; y < H; ++y)
      for (int x = 0; x < W; ++x) {
        const double d = std::abs((x - ax) * dy - (y - ay) * dx);
        if (d > half) continue;
        double* p = &img[(static_cast<size_t>(y) * W + x) * 3];
        for (int c = 0; c < 3; ++c) p[c] = (1 - alpha) * p[c] + alpha * col[c];
      }
  }
}

void draw_object(Rng& rng, const Object& o, int K, int W, int H, std::vector<double>& img) {
  // Each class has its own hue band (so colour helps, shape decides); saturation and value vary.
  double col[3];
  hsv_colour(o.cls * 360.0 / K + rng.uniform(-25.0, 25.0), rng.uniform(0.55, 1.0),
             rng.uniform(0.55, 1.0), col);
  const double shade = rng.uniform(-20.0, 20.0);  // a linear gradient across the object
  const double cx = (o.x0 + o.x1) / 2, cy = (o.y0 + o.y1) / 2;
  const double hw = (o.x1 - o.x0) / 2, hh = (o.y1 - o.y0) / 2;
  constexpr int kSub = 3;  // 3 x 3 supersampling for smooth edges
  for (int y = static_cast<int>(o.y0); y < std::min(H, static_cast<int>(o.y1) + 1); ++y) {
    for (int x = static_cast<int>(o.x0); x < std::min(W, static_cast<int>(o.x1) + 1); ++x) {
      int hits = 0;
      for (int sy = 0; sy < kSub; ++sy)
        for (int sx = 0; sx < kSub; ++sx) {
          const double u = (x + (sx + 0.5) / kSub - cx) / hw;
          const double v = (y + (sy + 0.5) / kSub - cy) / hh;
          hits += inside(o.cls, u, v);
        }
      if (!hits) continue;
      const double a = static_cast<double>(hits) / (kSub * kSub);
      const double g = shade * ((y - cy) / hh);
      double* p = &img[(static_cast<size_t>(y) * W + x) * 3];
      for (int c = 0; c < 3; ++c) p[c] = (1 - a) * p[c] + a * (col[c] + g);
    }
  }
}

bool overlap(const Object& a, const Object& b) {
  return std::min(a.x1, b.x1) > std::max(a.x0, b.x0) && std::min(a.y1, b.y1) > std::max(a.y0, b.y0);
}

void make_image(const SyntheticOptions& o, uint64_t split_id, int64_t i, const std::string& image_path,
                const std::string& label_path) {
  Rng rng = Rng::for_sample(o.seed, static_cast<int64_t>(split_id), i, 0);
  const int W = o.width, H = o.height;
  std::vector<double> img(static_cast<size_t>(W) * H * 3);
  draw_background(rng, W, H, img);

  const double side = std::min(W, H);
  std::vector<Object> objects;
  const int want = static_cast<int>(rng.randint(o.min_objects, o.max_objects));
  for (int tries = 0; static_cast<int>(objects.size()) < want && tries < 60; ++tries) {
    Object ob;
    ob.cls = static_cast<int>(rng.randint(0, o.num_classes - 1));
    const double s = rng.uniform(o.min_size, o.max_size) * side;
    const double aspect = std::exp(rng.uniform(-0.2, 0.2));  // mild stretching only
    const double w = std::min<double>(W - 2, s * aspect), h = std::min<double>(H - 2, s / aspect);
    ob.x0 = rng.uniform(1.0, W - 1 - w);
    ob.y0 = rng.uniform(1.0, H - 1 - h);
    ob.x1 = ob.x0 + w;
    ob.y1 = ob.y0 + h;
    // Objects do not overlap, so every label is fully visible.
    bool clash = false;
    for (const Object& other : objects) clash = clash || overlap(ob, other);
    if (!clash) objects.push_back(ob);
  }
  for (const Object& ob : objects) draw_object(rng, ob, o.num_classes, W, H, img);

  torch::Tensor out = torch::empty({H, W, 3}, torch::kUInt8);
  uint8_t* p = out.data_ptr<uint8_t>();
  for (size_t k = 0; k < img.size(); ++k) p[k] = to_u8(img[k] + rng.uniform(-6.0, 6.0));
  io::save_image(image_path, out, o.jpeg_quality);

  std::ofstream lf(label_path);
  for (const Object& ob : objects)
    lf << strfmt("%d %.6f %.6f %.6f %.6f\n", ob.cls, (ob.x0 + ob.x1) / 2 / W, (ob.y0 + ob.y1) / 2 / H,
                 (ob.x1 - ob.x0) / W, (ob.y1 - ob.y0) / H);
  if (!lf) throw RuntimeError("cannot write " + label_path);
}

}  // namespace

const std::vector<std::string>& synthetic_class_names() {
  static const std::vector<std::string> names = {"circle", "square",  "triangle", "cross",
                                                 "diamond", "ring", "hexagon",  "star"};
  return names;
}

std::string generate_synthetic_dataset(const std::string& dir, const SyntheticOptions& o) {
  const auto& all_names = synthetic_class_names();
  if (o.num_classes < 1 || o.num_classes > static_cast<int>(all_names.size()))
    throw UsageError(strfmt("synthetic dataset: num_classes must be 1..%zu", all_names.size()));
  if (o.width < 32 || o.height < 32) throw UsageError("synthetic dataset: images must be >= 32x32");
  if (o.min_objects < 0 || o.max_objects < o.min_objects)
    throw UsageError("synthetic dataset: need 0 <= min_objects <= max_objects");
  if (!(o.min_size > 0 && o.max_size >= o.min_size && o.max_size < 0.95))
    throw UsageError("synthetic dataset: need 0 < min_size <= max_size < 0.95");

  const fs::path root = fs::absolute(dir).lexically_normal();
  const std::pair<const char*, int> splits[] = {{"train", o.train_images}, {"val", o.val_images}};
  for (const auto& [split, count] : splits) {
    // The folder holds what was asked for, nothing from an earlier, larger generation in it.
    remove_tree((root / "images" / split).string());
    remove_tree((root / "labels" / split).string());
    fs::create_directories(root / "images" / split);
    fs::create_directories(root / "labels" / split);
  }
  for (uint64_t s = 0; s < 2; ++s) {
    const char* split = splits[s].first;
    parallel_for(splits[s].second, o.threads, [&](int64_t i) {
      const std::string stem = strfmt("%06lld", static_cast<long long>(i));
      make_image(o, s, i, (root / "images" / split / (stem + ".jpg")).string(),
                 (root / "labels" / split / (stem + ".txt")).string());
    });
  }

  const fs::path yaml = root / "data.yaml";
  std::ofstream y(yaml);
  y << "# Synthetic shapes dataset generated by LibreYOLO C++ (seed " << o.seed << ")\n";
  // No 'path': the YAML's folder is the root, so the dataset can be moved as a whole.
  y << "train: images/train\n";
  y << "val: images/val\n";
  y << "nc: " << o.num_classes << "\n";
  y << "names:\n";
  for (int k = 0; k < o.num_classes; ++k) y << "  " << k << ": " << all_names[k] << "\n";
  if (!y) throw RuntimeError("cannot write " + yaml.string());
  return yaml.string();
}

std::string ensure_builtin_dataset(const std::string& root_arg) {
  const fs::path root = root_arg.empty() ? fs::path(datasets_dir()) : fs::path(root_arg);
  const fs::path dir = root / "libreyolo-builtin-v1";
  if (fs::exists(dir / "data.yaml")) return (dir / "data.yaml").string();
  log_info("Generating the built-in dataset in " + dir.string());
  // Generate beside the final place and rename, so an interrupted run leaves nothing half-made.
  const fs::path tmp = root / strfmt(".libreyolo-builtin-v1.tmp%d", static_cast<int>(getpid()));
  remove_tree(tmp.string());
  generate_synthetic_dataset(tmp.string(), SyntheticOptions{});
  std::error_code ec;
  fs::rename(tmp, dir, ec);
  if (ec) {  // another process got there first
    remove_tree(tmp.string());
    if (!fs::exists(dir / "data.yaml"))
      throw RuntimeError("cannot create the built-in dataset in " + dir.string() + ": " + ec.message());
  }
  return (dir / "data.yaml").string();
}

}  // namespace libreyolo::data
