#pragma once
#include <string>

namespace libreyolo {
// project/name, or with exist_ok=false and the directory present, the first free of
// project/name2, name3, ... (LibreYOLO's run directory rule). Creates the directory.
std::string make_run_dir(const std::string& project, const std::string& name, bool exist_ok);
// Throws RuntimeError (output_not_writable) unless `dir` exists as a writable directory or could
// be created (a directory can be made in its nearest existing ancestor: one is made and removed).
void check_dir_creatable(const std::string& dir);
// Removes a directory tree (no error if absent). Use this, not std::filesystem::remove_all:
// libtorch.so exports its own copy of remove_all whose weak references are unresolved, and a
// call that binds to it jumps to address 0.
void remove_tree(const std::string& path);
// Writes `content` to `path` through a temporary file and a rename (never half-written).
void write_file_atomic(const std::string& path, const std::string& content);
// Removes the temporary files that an atomic write killed midway left in `dir` (`X.tmp.<pid>` and
// `.X.tmp.<pid>.<n>`) whose process is gone. Returns how many it removed.
int remove_orphan_temp_files(const std::string& dir);
}  // namespace libreyolo
