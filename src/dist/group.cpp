#include "dist/group.hpp"
#include "core/env.hpp"

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if LIBREYOLO_GLOO
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#if LIBREYOLO_NCCL
#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL
#endif
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <libreyolo/errors.hpp>

#include "core/log.hpp"

namespace libreyolo::dist {

namespace {

using Clock = std::chrono::steady_clock;

std::optional<std::string> env_text(const char* name) {
  const char* v = std::getenv(name);
  if (!v) return std::nullopt;
  return std::string(v);
}

int env_int(const char* name, std::optional<int> fallback) {
  auto v = env_text(name);
  if (!v) {
    if (fallback) return *fallback;
    throw UsageError(std::string("LOCAL_RANK is set but ") + name +
                         " is not: this looks like a torchrun launch with an incomplete environment",
                     "Launch with torchrun (torchrun --nproc_per_node=N ...), or unset LOCAL_RANK.", "config_invalid");
  }
  char* end = nullptr;
  const long x = std::strtol(v->c_str(), &end, 10);
  if (v->empty() || *end != '\0' || x < 0 || x > 1000000)
    throw UsageError(std::string(name) + "=" + *v + " is not a non-negative integer", "", "config_invalid");
  return static_cast<int>(x);
}

[[noreturn]] void fatal(const std::string& message) {
  log_error(message);
  std::fflush(nullptr);
  std::_Exit(1);
}

}  // namespace

std::optional<RankEnv> rank_env_from_environment() {
  if (!env_text("LOCAL_RANK")) return std::nullopt;
  RankEnv e;
  e.local_rank = env_int("LOCAL_RANK", std::nullopt);
  e.rank = env_int("RANK", std::nullopt);
  e.world_size = env_int("WORLD_SIZE", std::nullopt);
  e.local_world_size = env_int("LOCAL_WORLD_SIZE", e.world_size);
  e.master_addr = env_text("MASTER_ADDR").value_or("127.0.0.1");
  e.master_port = env_int("MASTER_PORT", 29500);
  e.agent_store = env_text("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
  e.spawned = env_get("LIBREYOLO_DDP_WORKER") != nullptr;
  if (e.world_size < 1 || e.rank >= e.world_size)
    throw UsageError(strfmt("RANK=%d is outside WORLD_SIZE=%d", e.rank, e.world_size), "", "config_invalid");
  if (e.local_world_size < 1 || e.local_rank >= e.local_world_size)
    throw UsageError(strfmt("LOCAL_RANK=%d is outside LOCAL_WORLD_SIZE=%d", e.local_rank, e.local_world_size), "",
                     "config_invalid");
  if (e.master_port < 1 || e.master_port > 65535)
    throw UsageError(strfmt("MASTER_PORT=%d is not a port", e.master_port), "", "config_invalid");
  return e;
}

void check_global_batch(int batch, int world_size) {
  if (world_size <= 1 || batch % world_size == 0) return;
  const int lower = (batch / world_size) * world_size, higher = lower + world_size;
  throw UsageError(strfmt("batch=%d is the global batch and must be divisible by world_size=%d: each rank trains at "
                          "batch / world_size, so this value would silently train at a different global batch than "
                          "requested",
                          batch, world_size),
                   lower > 0 ? strfmt("Use batch=%d or batch=%d.", lower, higher) : strfmt("Use batch=%d.", higher),
                   "config_invalid");
}

std::string backend_unavailable(const torch::Device& device) {
  if (device.is_cuda()) {
#if LIBREYOLO_NCCL
    return "";
#else
    return "this build has no NCCL (nccl.h was not found when it was configured)";
#endif
  }
  if (device.is_cpu()) {
#if LIBREYOLO_GLOO
    return "";
#else
    return "this build has no Gloo (its headers were not found when it was configured; scripts/env.sh fetches them)";
#endif
  }
  return "no process-group backend for " + device.str();
}

// ------------------------------------------------------------------------------------------------

struct Group::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;
  // Watchdog.
  c10::intrusive_ptr<c10d::Store> hb_store;
  std::thread watchdog;
  std::mutex mutex;
  std::condition_variable cv;
  bool stop = false;
  bool shut = false;
};

Group::Group(const RankEnv& env, const torch::Device& device)
    : env_(env), device_(device), impl_(std::make_unique<Impl>()) {}

std::shared_ptr<Group> Group::create(const RankEnv& env, const torch::Device& device,
                                     std::chrono::milliseconds timeout) {
  if (auto why = backend_unavailable(device); !why.empty())
    throw RuntimeError("Multi-process training on " + device.str() + " is not possible: " + why);
  std::shared_ptr<Group> g(new Group(env, device));
  Impl& im = *g->impl_;
  const auto connect_timeout = std::chrono::minutes(5);
  try {
    c10d::TCPStoreOptions o;
    o.port = static_cast<uint16_t>(env.master_port);
    o.isServer = !env.agent_store && env.rank == 0;
    o.numWorkers = env.world_size;
    o.waitWorkers = false;
    o.timeout = connect_timeout;
    im.store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, o);
    c10d::TCPStoreOptions h;
    h.port = static_cast<uint16_t>(env.master_port);
    h.isServer = false;
    h.timeout = std::chrono::seconds(30);
    im.hb_store = c10::make_intrusive<c10d::PrefixStore>(
        "libreyolo/watchdog", c10::make_intrusive<c10d::TCPStore>(env.master_addr, h));
  } catch (const std::exception& e) {
    throw RuntimeError(strfmt("Rank %d could not reach the rendezvous at %s:%d: %s", env.rank, env.master_addr.c_str(),
                              env.master_port, e.what()),
                       "Check MASTER_ADDR / MASTER_PORT and that rank 0 (or torchrun's agent) is running.");
  }
  auto prefix = c10::make_intrusive<c10d::PrefixStore>("libreyolo/default_pg", im.store);
  if (device.is_cuda()) {
#if LIBREYOLO_NCCL
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(device.index()));
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = timeout;
    im.backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(prefix, env.rank, env.world_size, opts);
    g->backend_name_ = "nccl";
#endif
  } else {
#if LIBREYOLO_GLOO
    auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
    if (auto ifname = env_text("GLOO_SOCKET_IFNAME"))
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(*ifname));
    else
      opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    im.backend = c10::make_intrusive<c10d::ProcessGroupGloo>(prefix, env.rank, env.world_size, opts);
    g->backend_name_ = "gloo";
#endif
  }

  // The watchdog (see the header). Ranks that have not beaten yet get a start-up grace.
  im.watchdog = std::thread([&im, env] {
    const auto beat = std::chrono::seconds(2), stale = std::chrono::seconds(30), startup = std::chrono::seconds(180);
    const auto start = Clock::now();
    std::vector<int64_t> last(static_cast<size_t>(env.world_size), 0);
    std::vector<Clock::time_point> changed(static_cast<size_t>(env.world_size), start);
    std::optional<Clock::time_point> failing;
    const auto key = [](const char* what, int r) { return std::string(what) + std::to_string(r); };
    std::unique_lock<std::mutex> lock(im.mutex);
    while (!im.stop) {
      lock.unlock();
      try {
        im.hb_store->add(key("beat/", env.rank), 1);
        const auto now = Clock::now();
        for (int r = 0; r < env.world_size; ++r) {
          if (r == env.rank || im.hb_store->add(key("done/", r), 0) > 0) continue;
          const int64_t v = im.hb_store->add(key("beat/", r), 0);
          auto& seen = last[static_cast<size_t>(r)];
          auto& when = changed[static_cast<size_t>(r)];
          if (v != seen) {
            seen = v;
            when = now;
          } else if (now - when > (v == 0 ? startup : stale)) {
            lock.lock();
            if (im.stop) break;
            fatal(strfmt("Multi-GPU training: rank %d has not been heard from for %lld s (it died or hangs); "
                         "rank %d stops too",
                         r, static_cast<long long>(std::chrono::duration_cast<std::chrono::seconds>(now - when).count()),
                         env.rank));
          }
        }
        failing.reset();
      } catch (const std::exception& e) {
        if (!failing) failing = Clock::now();
        if (Clock::now() - *failing > std::chrono::seconds(15)) {
          lock.lock();
          if (im.stop) break;
          fatal(strfmt("Multi-GPU training: rank %d lost the rendezvous store at %s:%d (rank 0 or the launcher "
                       "ended): %s",
                       env.rank, env.master_addr.c_str(), env.master_port, e.what()));
        }
      }
      lock.lock();
      if (im.stop) break;
      im.cv.wait_for(lock, beat, [&] { return im.stop; });
    }
  });
  return g;
}

Group::~Group() { shutdown(); }

void Group::shutdown(bool finished) {
  Impl& im = *impl_;
  if (im.shut) return;
  im.shut = true;
  try {
    if (finished) im.hb_store->add("done/" + std::to_string(env_.rank), 1);
  } catch (const std::exception&) {
  }
  {
    std::lock_guard<std::mutex> lock(im.mutex);
    im.stop = true;
  }
  im.cv.notify_all();
  if (im.watchdog.joinable()) im.watchdog.join();
  if (!finished && im.backend) {
    // Ending on an error: collectives may still be queued that no peer will ever match, and a
    // shutdown would wait for them (with the heartbeat already stopped, so no peer would notice).
    // The process is about to exit: leave the backend to it.
    new c10::intrusive_ptr<c10d::Backend>(std::move(im.backend));
    return;
  }
  try {
    if (im.backend) im.backend->shutdown();
  } catch (const std::exception&) {
    // Gloo has nothing to shut down explicitly.
  }
  im.backend.reset();
}

void Group::all_reduce_sum(std::vector<torch::Tensor>& tensors) {
  for (auto& t : tensors) {
    std::vector<at::Tensor> one{t};
    impl_->backend->allreduce(one)->wait();
  }
}

void Group::broadcast(torch::Tensor& t, int src) {
  std::vector<at::Tensor> one{t};
  c10d::BroadcastOptions o;
  o.rootRank = src;
  impl_->backend->broadcast(one, o)->wait();
}

void Group::barrier() {
  auto t = torch::ones({1}, torch::TensorOptions().dtype(torch::kFloat).device(device_));
  std::vector<torch::Tensor> v{t};
  all_reduce_sum(v);
  (void)t.item<float>();  // the host waits for the device too
}

int64_t Group::broadcast_int(int64_t value, int src) {
  auto t = torch::full({1}, value, torch::TensorOptions().dtype(torch::kLong).device(device_));
  broadcast(t, src);
  return t.item<int64_t>();
}

bool Group::broadcast_flag(bool value, int src) { return broadcast_int(value ? 1 : 0, src) != 0; }

std::string Group::broadcast_string(const std::string& value, int src) {
  const int64_t n = broadcast_int(static_cast<int64_t>(value.size()), src);
  if (n == 0) return "";
  auto bytes = torch::zeros({n}, torch::kUInt8);
  if (env_.rank == src) std::memcpy(bytes.data_ptr<uint8_t>(), value.data(), static_cast<size_t>(n));
  auto t = bytes.to(device_);
  broadcast(t, src);
  t = t.to(torch::kCPU);
  return std::string(reinterpret_cast<const char*>(t.data_ptr<uint8_t>()), static_cast<size_t>(n));
}

}  // namespace libreyolo::dist
