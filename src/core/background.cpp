#include "core/background.hpp"

#include <atomic>
#include <mutex>
#include <vector>

namespace libreyolo {

namespace {

std::mutex& stops_mutex() {
  static std::mutex m;
  return m;
}
// Never destroyed: a hold may end during static destruction.
std::vector<std::function<void()>>& stops() {
  static auto* all = new std::vector<std::function<void()>>();
  return *all;
}
std::atomic<long> holds{0};

}  // namespace

void on_background_stop(std::function<void()> stop) {
  std::lock_guard<std::mutex> lock(stops_mutex());
  stops().push_back(std::move(stop));
}

void stop_background_work() {
  std::vector<std::function<void()>> all;
  {
    std::lock_guard<std::mutex> lock(stops_mutex());
    all = stops();
  }
  for (const auto& stop : all) stop();
}

BackgroundWorkHold::BackgroundWorkHold() { ++holds; }
BackgroundWorkHold::BackgroundWorkHold(const BackgroundWorkHold&) { ++holds; }
BackgroundWorkHold::~BackgroundWorkHold() {
  if (--holds == 0) stop_background_work();
}

}  // namespace libreyolo
