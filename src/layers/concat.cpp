#include "layers/concat.hpp"

#include <atomic>

#include "core/env.hpp"

namespace libreyolo::models::common {

namespace {

EnvFlag in_place_flag{"LIBREYOLO_CONCAT_IN_PLACE"};

}  // namespace

void set_concat_in_place(bool on) { in_place_flag.store(on); }
bool concat_in_place() { return in_place_flag.load(); }

bool ChannelConcat::applies(const torch::Tensor& x) {
  return concat_in_place() && !torch::GradMode::is_enabled() && x.dim() == 4;
}

torch::TensorOptions ChannelConcat::options(const torch::Tensor& x, const ConvBnActImpl& producer) {
  return x.options().dtype(fold_compute_dtype(x)).memory_format(fold_memory_format(x, producer.conv->weight));
}

ChannelConcat::ChannelConcat(const torch::Tensor& x, const ConvBnActImpl& producer,
                             const std::vector<int64_t>& channels)
    : ChannelConcat(x.size(0), x.size(2), x.size(3), options(x, producer), channels) {}

ChannelConcat::ChannelConcat(int64_t n, int64_t h, int64_t w, const torch::TensorOptions& options,
                             const std::vector<int64_t>& channels) {
  int64_t total = 0;
  for (int64_t c : channels) total += c;
  whole_ = torch::empty({n, total, h, w}, options);
  int64_t offset = 0;
  for (int64_t c : channels) {
    parts_.push_back(whole_.narrow(1, offset, c));
    offset += c;
  }
}

}  // namespace libreyolo::models::common
