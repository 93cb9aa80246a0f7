// The pictures of a run directory, drawn with the project's own raster code (no plotting
// library): results.png, labels.jpg, train_batch*.jpg, confusion_matrix.png and the
// PR / F1 / P / R curves. Each function writes one image (PNG or JPEG by extension, parent
// directories created) and throws DataError for unusable input, UsageError for bad shapes.
#pragma once
#include <torch/types.h>

#include <string>
#include <vector>

namespace libreyolo::data {
class YoloDataset;
}
namespace libreyolo::eval {
struct CocoStats;
class ConfusionMatrix;
}  // namespace libreyolo::eval

namespace libreyolo::plots {

// A grid of line charts over the epochs of a run's results.csv: one per loss column (every
// "train/..." column, in header order), then metrics/precision, metrics/recall, metrics/mAP50
// and metrics/mAP50-95 (detect), metrics/accuracy_top1 and metrics/accuracy_top5 (classify) where present, then the learning rates ("lr/..." columns, together).
// Empty cells (epochs without validation) are left out of the lines. DataError when the file
// cannot be read or has no epoch rows or no such column.
void plot_results_csv(const std::string& csv, const std::string& png);

// Statistics of a dataset's labels: instances per class (bars, names below), box centres (x, y)
// and box sizes (w, h) as scatter plots, and the outlines of up to 500 boxes drawn around one
// centre. labels: [N, 5] rows (class, cx, cy, w, h) normalised to [0, 1].
void plot_labels(const torch::Tensor& labels, const std::vector<std::string>& names,
                 const std::string& jpg);
// The same for every box of a dataset (in its original image sizes).
void plot_labels(const data::YoloDataset& dataset, const std::vector<std::string>& names,
                 const std::string& jpg);

// A mosaic of up to 16 training images as the loader yields them, with their boxes and class
// names: images [B, S, S, 3] uint8 RGB (CPU), targets [B, T, 5] rows (class, x1, y1, x2, y2)
// normalised to [0, 1], class -1 = padding. The mosaic is scaled down to at most 1920 pixels.
void plot_train_batch(const torch::Tensor& images, const torch::Tensor& targets,
                      const std::vector<std::string>& names, const std::string& jpg);

// The normalised confusion matrix (each true column sums to 1) as a heat map with the values,
// class names on both axes and a "background" row and column.
void plot_confusion_matrix(const eval::ConfusionMatrix& cm, const std::vector<std::string>& names,
                           const std::string& png);
// The same picture for classification: counts [nc x nc] (predicted row, true column), no
// background row or column.
void plot_confusion_matrix(const std::vector<int64_t>& counts, const std::vector<std::string>& names,
                           const std::string& png);

// Precision over recall at IoU .50 per class (COCO's interpolated curve) and their mean, the
// legend giving each class's AP50 and the mAP50.
void plot_pr_curve(const eval::CocoStats& stats, const std::vector<std::string>& names,
                   const std::string& png);

enum class Curve { F1, Precision, Recall };
// F1, precision or recall over the confidence threshold per class, and the mean over classes
// with its best value and the confidence where it is reached.
void plot_conf_curve(const eval::CocoStats& stats, const std::vector<std::string>& names,
                     Curve which, const std::string& png);

// The validation pictures into dir: confusion_matrix.png (when `cm` is given), PR_curve.png,
// F1_curve.png, P_curve.png, R_curve.png. Returns the files written.
std::vector<std::string> plot_validation(const eval::CocoStats& stats,
                                         const eval::ConfusionMatrix* cm,
                                         const std::vector<std::string>& names,
                                         const std::string& dir);

}  // namespace libreyolo::plots
