// The cross-process sum (core/cross_process.hpp) of ranks that share one host: small float32
// tensors (SyncBN's statistics and gradient sums, the loss normalisers: hundreds per training
// step, a few KB each) go through peer memory over NVLink (kernels/peer_sum.hpp: one kernel, no
// library collective, capturable in CUDA graphs); anything else through the group's collective.
#pragma once
#include <memory>
#include <string>

#include "core/cross_process.hpp"
#include "dist/group.hpp"
#include "dist/syncs.hpp"

namespace libreyolo::dist {

class PeerSum final : public CrossProcessSum {
 public:
  ~PeerSum() override;
  PeerSum(const PeerSum&) = delete;
  PeerSum& operator=(const PeerSum&) = delete;

  // Collective: every rank of `group` calls it. nullptr (and `why` set) unless every rank is on
  // this host, every peer's buffer could be mapped here and LIBREYOLO_PEER_SUM is not 0.
  static std::shared_ptr<PeerSum> create(const std::shared_ptr<Group>& group, std::string* why);

  int rank() const override { return fallback_.rank(); }
  int world_size() const override { return fallback_.world_size(); }
  void all_reduce_sum(torch::Tensor& t) override;

 private:
  // The sum kernel's arguments, built once: every rank's buffer as mapped here (this rank's own
  // at its index), the row capacity, the wait timeout (dist/peer_sum.cpp).
  struct Mapping;
  explicit PeerSum(std::shared_ptr<Group> group);
  void release();
  GroupSum fallback_;
  int device_ = 0;
  std::unique_ptr<Mapping> mapping_;  // null once released
};

// The cross-process sum a data-parallel run installs: PeerSum where it can be made, else the
// group's collective (GroupSum). `how` says which, and why not the peer path.
std::shared_ptr<CrossProcessSum> make_cross_process_sum(const std::shared_ptr<Group>& group, std::string* how);

}  // namespace libreyolo::dist
