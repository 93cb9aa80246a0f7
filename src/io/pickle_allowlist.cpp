#include "io/pickle_allowlist.hpp"

#include <unordered_map>

namespace libreyolo::io::detail {

std::optional<GlobalInfo> resolve_global(const std::string& module, const std::string& name) {
  using ST = c10::ScalarType;
  if (module == "collections" && name == "OrderedDict") return GlobalInfo{Callable::OrderedDict};
  if (module == "torch._utils") {
    if (name == "_rebuild_tensor_v2") return GlobalInfo{Callable::RebuildTensorV2};
    if (name == "_rebuild_tensor_v3") return GlobalInfo{Callable::RebuildTensorV3};
    if (name == "_rebuild_parameter") return GlobalInfo{Callable::RebuildParameter};
    if (name == "_rebuild_parameter_with_state") {
      return GlobalInfo{Callable::RebuildParameterWithState};
    }
    return std::nullopt;
  }
  if (module == "_codecs" && name == "encode") return GlobalInfo{Callable::CodecsEncode};
  if (module == "builtins") {
    if (name == "set" || name == "frozenset") return GlobalInfo{Callable::Set};
    if (name == "bytearray") return GlobalInfo{Callable::ByteArray};
    return std::nullopt;
  }
  if (module == "torch.storage" && name == "UntypedStorage") {
    return GlobalInfo{Callable::StorageType, ST::Byte, true};
  }
  if (module == "torch" || module == "torch.cuda") {
    static const std::unordered_map<std::string, ST> storages = {
        {"DoubleStorage", ST::Double},      {"FloatStorage", ST::Float},
        {"HalfStorage", ST::Half},          {"BFloat16Storage", ST::BFloat16},
        {"LongStorage", ST::Long},          {"IntStorage", ST::Int},
        {"ShortStorage", ST::Short},        {"CharStorage", ST::Char},
        {"ByteStorage", ST::Byte},          {"BoolStorage", ST::Bool},
        {"ComplexFloatStorage", ST::ComplexFloat}, {"ComplexDoubleStorage", ST::ComplexDouble},
    };
    if (auto it = storages.find(name); it != storages.end()) {
      return GlobalInfo{Callable::StorageType, it->second, false};
    }
  }
  if (module == "torch") {
    if (name == "device") return GlobalInfo{Callable::Device};
    if (name == "Size") return GlobalInfo{Callable::Size};
    static const std::unordered_map<std::string, ST> dtypes = {
        {"float32", ST::Float},         {"float64", ST::Double},
        {"float16", ST::Half},          {"bfloat16", ST::BFloat16},
        {"int64", ST::Long},            {"int32", ST::Int},
        {"int16", ST::Short},           {"int8", ST::Char},
        {"uint8", ST::Byte},            {"bool", ST::Bool},
        {"complex32", ST::ComplexHalf}, {"complex64", ST::ComplexFloat},
        {"complex128", ST::ComplexDouble}, {"uint16", ST::UInt16},
        {"uint32", ST::UInt32},         {"uint64", ST::UInt64},
        {"float8_e4m3fn", ST::Float8_e4m3fn}, {"float8_e5m2", ST::Float8_e5m2},
        {"float8_e4m3fnuz", ST::Float8_e4m3fnuz}, {"float8_e5m2fnuz", ST::Float8_e5m2fnuz},
    };
    if (auto it = dtypes.find(name); it != dtypes.end()) {
      return GlobalInfo{Callable::Dtype, it->second, false};
    }
  }
  return std::nullopt;
}

}  // namespace libreyolo::io::detail
