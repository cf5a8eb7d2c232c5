#include "reducer/nccl_checks.h"

#include <catch2/catch.hpp>

using namespace memscope;
using namespace memscope::reducer;

TEST_CASE("NCCL's duplicate-GPU check: equal host and bus id, named as NCCL's init.cc does") {
  const std::uint64_t a = HostHash("node-a"), b = HostHash("node-b");
  CHECK(a != b);
  CHECK(HostHash("node-a") == a);
  CHECK(SimulatedBusId(0) == 0x1000);
  CHECK(SimulatedBusId(3) == 0x4000);
  // Ranks 0 and 2 on GPU 0 of node a; rank 1 on GPU 1; rank 3 on GPU 0 of node b.
  const std::vector<NcclPeerInfo> peers = {
      {a, SimulatedBusId(0)}, {a, SimulatedBusId(1)}, {a, SimulatedBusId(0)}, {b, SimulatedBusId(0)}};
  CHECK(DuplicateGpuWarning(peers, 0) == "Duplicate GPU detected : rank 0 and rank 2 both on CUDA device 1000");
  CHECK(DuplicateGpuWarning(peers, 2) == "Duplicate GPU detected : rank 2 and rank 0 both on CUDA device 1000");
  CHECK_FALSE(DuplicateGpuWarning(peers, 1));
  CHECK_FALSE(DuplicateGpuWarning(peers, 3));  // another host
  CHECK(NcclInvalidUsageError("W") ==
        "NCCL error: invalid usage (run with NCCL_DEBUG=WARN for details)\nncclInvalidUsage: This usually reflects "
        "invalid usage of NCCL library.\nLast error:\nW");
}

TEST_CASE("CheckNcclPeers exchanges the peer infos over the communicator") {
  std::unique_ptr<Communicator> comm = CreateLocalCommunicator();  // one rank: no duplicate possible
  CHECK_FALSE(CheckNcclPeers(*comm, {HostHash("h"), SimulatedBusId(0)}));
}
