// timeline.html: one offline page (inline CSS and JS, data embedded, no network) that draws the
// profiler window's lanes (steps, phases on CPU and GPU, CPU ops, GPU kernels, memcpy) on a
// canvas with wheel zoom, drag pan and hover, and a panel with the verdict, kernel mix and top
// kernels. The page writes "drawn ..." (or "error: ...") into #lyp-status for headless checks.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace libreyolo::profile {

// The page for a payload {events, flows, lane_rows, total_ms, meta, analysis}.
std::string timeline_html(const nlohmann::json& payload);
// Writes the page; false (and nothing thrown) when the file cannot be written.
bool write_timeline(const std::string& path, const nlohmann::json& payload);

}  // namespace libreyolo::profile
