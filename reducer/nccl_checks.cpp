#include "reducer/nccl_checks.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace memscope::reducer {

std::int64_t SimulatedBusId(int physical) { return (static_cast<std::int64_t>(physical) + 1) * 0x1000; }

std::uint64_t HostHash(std::string_view hostname) {
  // FNV-1a: stable across processes (std::hash need not be).
  std::uint64_t h = 1469598103934665603ULL;
  for (char c : hostname) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ULL;
  }
  return h;
}

std::optional<std::string> DuplicateGpuWarning(const std::vector<NcclPeerInfo>& peers, int rank) {
  if (rank < 0 || rank >= static_cast<int>(peers.size())) return std::nullopt;
  const NcclPeerInfo& me = peers[static_cast<std::size_t>(rank)];
  for (int i = 0; i < static_cast<int>(peers.size()); ++i) {
    const NcclPeerInfo& p = peers[static_cast<std::size_t>(i)];
    if (i != rank && p.host_hash == me.host_hash && p.bus_id == me.bus_id) {
      return absl::StrFormat("Duplicate GPU detected : rank %d and rank %d both on CUDA device %x", rank, i,
                             static_cast<std::uint64_t>(me.bus_id));
    }
  }
  return std::nullopt;
}

std::string NcclInvalidUsageError(std::string_view warning) {
  return absl::StrCat(
      "NCCL error: invalid usage (run with NCCL_DEBUG=WARN for details)\n"
      "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.\nLast error:\n",
      std::string(warning));
}

std::optional<std::string> CheckNcclPeers(Communicator& comm, NcclPeerInfo mine) {
  const int n = comm.world_size();
  std::int64_t in[2] = {static_cast<std::int64_t>(mine.host_hash), mine.bus_id};
  std::vector<std::int64_t> out(static_cast<std::size_t>(n) * 2);
  comm.Allgather(in, out.data(), 2, DType::kInt64);
  std::vector<NcclPeerInfo> peers(static_cast<std::size_t>(n));
  for (std::size_t r = 0; r < peers.size(); ++r) {
    peers[r] = {static_cast<std::uint64_t>(out[2 * r]), out[2 * r + 1]};
  }
  std::optional<std::string> warning = DuplicateGpuWarning(peers, comm.rank());
  if (!warning) return std::nullopt;
  return NcclInvalidUsageError(*warning);
}

}  // namespace memscope::reducer
