// How every command reports a failure: a JSON object on stdout under --json, else two lines on
// stderr ("Error [code]: message", then the suggestion when there is one).
#pragma once
#include <ostream>

#include <libreyolo/errors.hpp>

namespace libreyolo {

void report_error(const Error& e, bool as_json, std::ostream& out, std::ostream& err);

}  // namespace libreyolo
