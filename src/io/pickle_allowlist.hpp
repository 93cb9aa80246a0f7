// The pickle reader's allow-list: the only globals a checkpoint may name (io/unpickler.cpp turns
// each into an inert placeholder that REDUCE may "call"). Anything else is refused.
#pragma once
#include <c10/core/ScalarType.h>

#include <optional>
#include <string>

namespace libreyolo::io::detail {

// What an allow-listed GLOBAL stands for.
enum class Callable {
  OrderedDict,
  RebuildTensorV2,
  RebuildTensorV3,
  RebuildParameter,
  RebuildParameterWithState,
  Device,
  Size,
  CodecsEncode,
  Set,
  ByteArray,
  StorageType,  // torch.<Dtype>Storage or torch.storage.UntypedStorage
  Dtype,        // torch.float32 ...
};

struct GlobalInfo {
  Callable kind;
  c10::ScalarType dtype = c10::ScalarType::Byte;
  bool untyped = false;
};

// What module.name stands for, or nullopt when it is not allowed.
std::optional<GlobalInfo> resolve_global(const std::string& module, const std::string& name);

}  // namespace libreyolo::io::detail
