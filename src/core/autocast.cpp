#include "core/autocast.hpp"

#include <ATen/autocast_mode.h>

namespace libreyolo {

AutocastGuard::AutocastGuard(const torch::Device& device, bool enabled, torch::ScalarType dtype, bool cache)
    : type_(device.type()) {
  if (!enabled) return;
  active_ = true;
  prev_enabled_ = at::autocast::is_autocast_enabled(type_);
  prev_dtype_ = at::autocast::get_autocast_dtype(type_);
  prev_cache_ = at::autocast::is_autocast_cache_enabled();
  at::autocast::set_autocast_enabled(type_, true);
  at::autocast::set_autocast_dtype(type_, dtype);
  at::autocast::increment_nesting();
  at::autocast::set_autocast_cache_enabled(cache);
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(type_, prev_enabled_);
  at::autocast::set_autocast_dtype(type_, prev_dtype_);
  at::autocast::set_autocast_cache_enabled(prev_cache_);
}

}  // namespace libreyolo
