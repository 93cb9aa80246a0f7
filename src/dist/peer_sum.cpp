#include "dist/peer_sum.hpp"
#include "core/env.hpp"

#include <unistd.h>

#include <cstdlib>
#include <exception>

#ifdef LIBREYOLO_CUDA_KERNELS
#include <c10/cuda/CUDAStream.h>

#include "kernels/peer_sum.hpp"
#endif

namespace libreyolo::dist {

namespace {

#ifdef LIBREYOLO_CUDA_KERNELS
// Floats per rank row: the largest SyncBN exchange ([world, 2C+1] rows) of the supported models is
// a few thousand; larger tensors take the group's collective.
constexpr int64_t kCapacity = 32768;
// A wait for a peer this long ends the kernel with an error (the process group's own timeout);
// a rank that dies is caught much sooner by the group's heartbeat.
constexpr uint64_t kWaitTimeoutNs = 3ull * 3600ull * 1000000000ull;

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "?";
  return buf;
}
#endif

}  // namespace

struct PeerSum::Mapping {
#ifdef LIBREYOLO_CUDA_KERNELS
  kernels::PeerSumArgs args;
#endif
};

PeerSum::PeerSum(std::shared_ptr<Group> group) : fallback_(std::move(group)) {}

std::shared_ptr<PeerSum> PeerSum::create(const std::shared_ptr<Group>& group, std::string* why) {
  const auto fail = [&](const std::string& reason) -> std::shared_ptr<PeerSum> {
    if (why) *why = reason;
    return nullptr;
  };
  if (!group->device().is_cuda()) return fail("not on CUDA");
#ifndef LIBREYOLO_CUDA_KERNELS
  return fail("this build has no CUDA kernels");
#else
  const int world = group->world_size(), me = group->rank();
  if (world > kernels::kPeerSumMaxWorld)
    return fail("more than " + std::to_string(kernels::kPeerSumMaxWorld) + " ranks");
  const char* env = env_get("LIBREYOLO_PEER_SUM");
  // Every step below is collective and taken by every rank, whatever this rank found so far, so
  // that all ranks agree on the outcome.
  std::string reason = env && std::string(env) == "0" ? "LIBREYOLO_PEER_SUM=0" : "";
  // torchrun's contract: LOCAL_WORLD_SIZE processes on this node.
  if (reason.empty() && group->env().local_world_size != world) reason = "the ranks span more than one node";
  const std::string host = host_name();
  for (int r = 0; r < world; ++r)
    if (group->broadcast_string(host, r) != host && reason.empty()) reason = "the ranks are on more than one host";
  std::shared_ptr<PeerSum> ps(new PeerSum(group));
  ps->device_ = group->device().index();
  ps->mapping_ = std::make_unique<Mapping>();
  kernels::PeerSumArgs& a = ps->mapping_->args;
  a.rank = me;
  a.world = world;
  a.capacity = kCapacity;
  a.timeout_ns = kWaitTimeoutNs;
  std::string handle;
  if (reason.empty()) {
    a.base[me] = kernels::peer_sum_alloc(ps->device_, kernels::peer_sum_buffer_bytes(world, kCapacity), &reason);
    if (a.base[me] && !kernels::peer_sum_handle(a.base[me], &handle, &reason)) handle.clear();
  }
  for (int r = 0; r < world; ++r) {
    const std::string h = group->broadcast_string(reason.empty() ? handle : std::string(), r);
    if (r == me || !reason.empty()) continue;
    if (h.empty()) {
      reason = "rank " + std::to_string(r) + " has no peer buffer";
      continue;
    }
    a.base[r] = kernels::peer_sum_open(ps->device_, h, &reason);
  }
  bool all_ok = true;
  for (int r = 0; r < world; ++r) all_ok = group->broadcast_flag(reason.empty(), r) && all_ok;
  if (!all_ok) {
    ps->release();
    return fail(reason.empty() ? "another rank could not map every peer's buffer" : reason);
  }
  return ps;
#endif
}

void PeerSum::release() {
#ifdef LIBREYOLO_CUDA_KERNELS
  if (!mapping_) return;
  const kernels::PeerSumArgs& a = mapping_->args;
  for (int r = 0; r < a.world; ++r)
    if (r != a.rank && a.base[r]) kernels::peer_sum_close(a.base[r]);
  kernels::peer_sum_free(a.base[a.rank]);
#endif
  mapping_.reset();
}

PeerSum::~PeerSum() {
  // Ending on an error, a sum may still wait for a peer that will never come: freeing would wait
  // for it. The process is about to end; its buffers go with it.
  if (std::uncaught_exceptions() == 0) release();
}

void PeerSum::all_reduce_sum(torch::Tensor& t) {
#ifdef LIBREYOLO_CUDA_KERNELS
  if (mapping_ && t.is_cuda() && t.scalar_type() == torch::kFloat && t.is_contiguous() &&
      t.numel() <= mapping_->args.capacity && t.device().index() == device_) {
    kernels::peer_sum_float(t.data_ptr<float>(), t.numel(), mapping_->args,
                            c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_)).stream());
    return;
  }
#endif
  fallback_.all_reduce_sum(t);
}

std::shared_ptr<CrossProcessSum> make_cross_process_sum(const std::shared_ptr<Group>& group, std::string* how) {
  std::string why;
  if (group->device().is_cuda()) {
    if (auto ps = PeerSum::create(group, &why)) {
      if (how) *how = "through peer memory (NVLink)";
      return ps;
    }
  }
  if (how) *how = "through " + group->backend_name() + (why.empty() ? "" : " (" + why + ")");
  return std::make_shared<GroupSum>(group);
}

}  // namespace libreyolo::dist
