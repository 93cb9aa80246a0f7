// Work the library runs on threads of its own between a user's calls: cuDNN plans built in the
// background (layers/cudnn_fusion.cpp) and the device JPEG decoder being started
// (engine/predictor.cpp). Such a thread may be inside a library loaded after it started (nvrtc
// compiling a kernel, nvJPEG creating a handle) when the process ends; the static objects of that
// library are destroyed first at exit, and the thread then crashes the process. So the work stops
// while the program still runs: when the last LibreYOLO object goes (BackgroundWorkHold) and when
// the CLI returns. Stopping lets what is in progress finish (well under a second) and drops what
// is queued; a later call starts it again as needed.
#pragma once
#include <functional>

namespace libreyolo {

// Registers how to stop one kind of background work (called once per kind, at its first use).
void on_background_stop(std::function<void()> stop);

// Stops all of it (every registered function, in registration order); safe to call at any time.
void stop_background_work();

// Held by every live model facade: when the last hold ends, stop_background_work().
class BackgroundWorkHold {
 public:
  BackgroundWorkHold();
  BackgroundWorkHold(const BackgroundWorkHold&);
  BackgroundWorkHold& operator=(const BackgroundWorkHold&) = default;
  ~BackgroundWorkHold();
};

}  // namespace libreyolo
