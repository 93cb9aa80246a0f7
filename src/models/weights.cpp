// Weights in and out of a model, for every family: state_dict as LibreYOLO names it, loading
// with shape checks, and the BatchNorm test shared by the optimizer's groups and freezing.
#include <unordered_map>
#include <unordered_set>

#include "core/log.hpp"
#include "libreyolo/errors.hpp"

#include "models/detector.hpp"

namespace libreyolo::models {

namespace {

// "a, b, c ... and 7 more"
std::string join_some(const std::vector<std::string>& items, size_t limit = 8) {
  std::string out;
  for (size_t i = 0; i < items.size() && i < limit; ++i) {
    if (i) out += ", ";
    out += items[i];
  }
  if (items.size() > limit) out += strfmt(" ... and %zu more", items.size() - limit);
  return out;
}

}  // namespace

LoadReport load_state_dict(torch::nn::Module& model, const io::StateDict& sd, bool strict, bool part) {
  // PyTorch's order: every module's own parameters then its own buffers, modules pre-order.
  const io::StateDict mine = state_dict(model);
  std::unordered_map<std::string, size_t> index;
  index.reserve(mine.size());
  for (size_t i = 0; i < mine.size(); ++i) index.emplace(mine[i].first, i);

  LoadReport report;
  std::vector<bool> seen(mine.size(), false);
  std::vector<std::pair<size_t, const torch::Tensor*>> copies;
  copies.reserve(sd.size());
  for (const auto& [key, value] : sd) {
    auto it = index.find(key);
    if (it == index.end()) {
      report.unexpected.push_back(key);
      continue;
    }
    const torch::Tensor& dst = mine[it->second].second;
    seen[it->second] = true;
    if (!value.defined() || value.sizes() != dst.sizes()) {
      report.shape_mismatch.push_back(
          key + ": checkpoint " + (value.defined() ? c10::str(value.sizes()) : "undefined") +
          " vs model " + c10::str(dst.sizes()));
      continue;
    }
    copies.emplace_back(it->second, &value);
  }
  for (size_t i = 0; i < mine.size(); ++i) {
    if (!seen[i]) report.missing.push_back(mine[i].first);
  }

  std::string problems;
  if (!report.missing.empty() && !part) {
    problems += strfmt("\n  %zu missing: ", report.missing.size()) + join_some(report.missing);
  }
  if (!report.unexpected.empty()) {
    problems += strfmt("\n  %zu unexpected: ", report.unexpected.size()) + join_some(report.unexpected);
  }
  if (!report.shape_mismatch.empty()) {
    problems += strfmt("\n  %zu with a different shape: ", report.shape_mismatch.size()) +
                join_some(report.shape_mismatch, 4);
  }
  // Strict loading checks everything before touching the model, so a failure changes nothing.
  if (strict && !problems.empty()) {
    throw ModelError("weights do not match the model:" + problems,
                     "check the model family, size and class count of the checkpoint",
                     "model_state_mismatch");
  }
  if (!problems.empty()) log_warn("weights only partly match the model:" + problems);

  torch::NoGradGuard no_grad;
  for (const auto& [i, src] : copies) {
    torch::Tensor dst = mine[i].second;
    dst.copy_(*src);
  }
  return report;
}

namespace {

void collect(const torch::nn::Module& m, const std::string& prefix, io::StateDict& out) {
  for (const auto& p : m.named_parameters(/*recurse=*/false)) out.emplace_back(prefix + p.key(), p.value());
  for (const auto& b : m.named_buffers(/*recurse=*/false)) out.emplace_back(prefix + b.key(), b.value());
  for (const auto& c : m.named_children()) collect(*c.value(), prefix + c.key() + ".", out);
}

}  // namespace

io::StateDict state_dict(const torch::nn::Module& model) {
  io::StateDict out;
  collect(model, "", out);
  return out;
}

void check_stride32_input(const torch::Tensor& x, const std::string& network) {
  if (x.dim() != 4 || x.size(1) != 3)
    throw UsageError(network + " expects an input of shape [B, 3, H, W], got " + c10::str(x.sizes()));
  if (x.size(2) % 32 != 0 || x.size(3) % 32 != 0)
    throw UsageError(strfmt("%s needs an input height and width that are multiples of 32, got %lldx%lld",
                            network.c_str(), static_cast<long long>(x.size(3)), static_cast<long long>(x.size(2))));
}

namespace {

template <typename Items>
std::vector<std::pair<std::string, torch::Tensor>> unique_items(const Items& items) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& item : items)
    if (seen.insert(item.value().unsafeGetTensorImpl()).second) out.emplace_back(item.key(), item.value());
  return out;
}

}  // namespace

std::vector<std::pair<std::string, torch::Tensor>> unique_named_parameters(const torch::nn::Module& model) {
  return unique_items(model.named_parameters(/*recurse=*/true));
}

std::vector<std::pair<std::string, torch::Tensor>> unique_named_buffers(const torch::nn::Module& model) {
  return unique_items(model.named_buffers(/*recurse=*/true));
}

bool is_batchnorm(const torch::nn::Module& m) {
  return dynamic_cast<const torch::nn::BatchNorm2dImpl*>(&m) || dynamic_cast<const torch::nn::BatchNorm1dImpl*>(&m) ||
         dynamic_cast<const torch::nn::BatchNorm3dImpl*>(&m);
}

int class_count(int nc, const std::optional<int>& from_weights, const std::string& weights_of) {
  if (nc > 0) return nc;
  if (!from_weights) throw ModelError("cannot tell the class count from the " + weights_of + " weights");
  return *from_weights;
}

}  // namespace libreyolo::models
