#include "io/state_dict.hpp"

namespace libreyolo::io {

std::string strip_ddp_prefix(std::string key) {
  while (key.rfind("module.", 0) == 0) key.erase(0, 7);
  return key;
}

const torch::Tensor* find_tensor(const StateDict& sd, const std::string& key,
                                 const std::function<std::string(const std::string&)>& canonical) {
  for (const auto& kv : sd)
    if (kv.first == key) return &kv.second;
  for (const auto& kv : sd)
    if (canonical(kv.first) == key) return &kv.second;
  return nullptr;
}

std::optional<int64_t> leading_dim(const StateDict& sd, const std::string& key,
                                   const std::function<std::string(const std::string&)>& canonical) {
  const torch::Tensor* t = find_tensor(sd, key, canonical);
  if (!t || !t->defined() || t->dim() < 1) return std::nullopt;
  return t->size(0);
}

}  // namespace libreyolo::io
