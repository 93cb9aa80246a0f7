// The zip side of torch.save files (internal to src/io).
#pragma once
#include <caffe2/serialize/read_adapter_interface.h>

#include <memory>
#include <string>

namespace libreyolo::io::detail {

// PyTorchStreamReader inputs. The memory adapter keeps a reference to `bytes`.
std::shared_ptr<caffe2::serialize::ReadAdapterInterface> memory_adapter(const std::string& bytes);
std::shared_ptr<caffe2::serialize::ReadAdapterInterface> file_adapter(const std::string& path);

// Throws ModelError unless PyTorchStreamReader's constructor will open `in` without failing
// (its failures leak miniz state, so they are caught here first). `name` names the file.
void precheck_archive(const caffe2::serialize::ReadAdapterInterface& in, const std::string& name);

}  // namespace libreyolo::io::detail
