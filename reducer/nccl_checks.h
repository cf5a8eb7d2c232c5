// NCCL's checks at communicator creation that need no GPU, so that
// `memscope run --backend nccl` makes them on simulated GPUs (its data then
// moves over Gloo).
//
// ncclCommInitRank allgathers each rank's peer info (src/init.cc, "AllGather1")
// and fails with ncclInvalidUsage when two ranks of one host have the same
// GPU (the same PCI bus id):
//
//   WARN("Duplicate GPU detected : rank %d and rank %d both on CUDA device %lx", rank, i, busId)
//
// where i is the first other rank with this rank's host hash and bus id. PyTorch
// raises it as "NCCL error in: ...: invalid usage ... ncclInvalidUsage: This
// usually reflects invalid usage of NCCL library.\nLast error:\nDuplicate GPU
// detected : ...".
//
//   NcclPeerInfo mine{HostHash(hostname), SimulatedBusId(physical_gpu)};
//   if (std::optional<std::string> e = CheckNcclPeers(comm, rank, mine)) ... // *e: PyTorch's error
#ifndef MEMSCOPE_REDUCER_NCCL_CHECKS_H_
#define MEMSCOPE_REDUCER_NCCL_CHECKS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "reducer/communicator.h"

namespace memscope::reducer {

struct NcclPeerInfo {
  std::uint64_t host_hash = 0;
  std::int64_t bus_id = 0;
};

// The bus id NCCL reads for simulated physical GPU `physical`: GPU N sits at
// PCI 0000:(N+1):00.0, whose bus id NCCL prints as "%lx": (N+1) * 0x1000
// (GPU 0: 1000, GPU 3: 4000).
std::int64_t SimulatedBusId(int physical);

// NCCL's host hash stands for the host name here: equal names, equal hashes.
std::uint64_t HostHash(std::string_view hostname);

// NCCL's WARN line for `rank` among `peers` (indexed by rank), or nullopt when
// no other rank of its host has its GPU.
std::optional<std::string> DuplicateGpuWarning(const std::vector<NcclPeerInfo>& peers, int rank);

// PyTorch's error for that warning: "NCCL error: invalid usage (run with
// NCCL_DEBUG=WARN for details)\nncclInvalidUsage: This usually reflects
// invalid usage of NCCL library.\nLast error:\n" + the warning.
std::string NcclInvalidUsageError(std::string_view warning);

// Allgathers `mine` over `comm` (one allgather of two int64 per rank; a
// collective every rank makes) and returns PyTorch's error when this rank
// shares its GPU with another rank of its host. Throws CommError as
// collectives do.
std::optional<std::string> CheckNcclPeers(Communicator& comm, NcclPeerInfo mine);

}  // namespace memscope::reducer

#endif  // MEMSCOPE_REDUCER_NCCL_CHECKS_H_
