// Helpers shared by the pickle reader, writer and checkpoint view (not part of the API).
#pragma once
#include <cstdint>
#include <string>

#include "io/pickle.hpp"

namespace libreyolo::io::detail {

// Appends a canonical identity of a hashable value (None, bool, int, float, str, bytes, tuple
// of those) to `out`, with Python's equalities (True == 1 == 1.0). False when unhashable or when
// the identity would exceed max_len bytes.
bool append_key_id(const PyValue& v, std::string& out, size_t max_len = SIZE_MAX, int depth = 0);
bool valid_utf8(const std::string& s);
// `s` with non-printable bytes replaced, cut at max_len (for error messages).
std::string printable(const std::string& s, size_t max_len);
// Throws ModelError "checkpoint '<name>' is corrupt: <what>".
[[noreturn]] void throw_corrupt(const std::string& name, const std::string& what);

}  // namespace libreyolo::io::detail
