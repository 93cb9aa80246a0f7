#include "core/error_report.hpp"

#include <nlohmann/json.hpp>

namespace libreyolo {

void report_error(const Error& e, bool as_json, std::ostream& out, std::ostream& err) {
  if (as_json) {
    nlohmann::json j = {{"schema_version", 1}, {"error", e.code()}, {"message", e.what()}};
    j["suggestion"] = e.suggestion().empty() ? nlohmann::json(nullptr) : nlohmann::json(e.suggestion());
    out << j.dump() << "\n";
    return;
  }
  err << "Error [" << e.code() << "]: " << e.what() << "\n";
  if (!e.suggestion().empty()) err << "  Suggestion: " << e.suggestion() << "\n";
}

}  // namespace libreyolo
