// Helpers shared by the torch.save reader, its zip checks and the writer (not part of the API).
#pragma once
#include <cstddef>
#include <string>

namespace libreyolo::io::detail {

bool valid_utf8(const std::string& s);
// `s` with non-printable bytes replaced, cut at max_len (for error messages).
std::string printable(const std::string& s, size_t max_len);
// Throws ModelError "checkpoint '<name>' is corrupt: <what>".
[[noreturn]] void throw_corrupt(const std::string& name, const std::string& what);

}  // namespace libreyolo::io::detail
