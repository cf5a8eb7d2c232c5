#include "allocator/device_ledger.h"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "allocator/caching_allocator.h"
#include "allocator/sim_device.h"

using namespace memscope;

TEST_CASE("two simulated devices on one ledger share the GPU's capacity") {
  std::shared_ptr<DeviceLedger> ledger = DeviceLedger::InMemory();
  SimDevice rank0({.capacity = 16 * kGiB, .index = 0});
  SimDevice rank1({.capacity = 16 * kGiB, .index = 0});
  REQUIRE(rank0.UseLedger(ledger, 0, 0).ok());
  REQUIRE(rank1.UseLedger(ledger, 0, 1).ok());
  auto a = rank0.Malloc(10 * kGiB);
  REQUIRE(a.ok());
  // Alone, rank 1's 10 GiB would fit in 16; beside rank 0's it does not.
  auto b = rank1.Malloc(10 * kGiB);
  CHECK(absl::IsResourceExhausted(b.status()));
  CHECK(b.status().message() == "simulated GPU 0 is out of memory");
  CHECK(ledger->Used(0) == 10 * kGiB);
  CHECK(ledger->UsedBy(0, 0) == 10 * kGiB);
  CHECK(ledger->UsedBy(0, 1) == 0);
  // cudaMemGetInfo counts every process: both see 6 GiB free.
  CHECK(rank0.MemoryInfo().free_bytes == 6 * kGiB);
  CHECK(rank1.MemoryInfo().free_bytes == 6 * kGiB);
  CHECK(rank1.MemoryInfo().total_bytes == 16 * kGiB);
  auto c = rank1.Malloc(6 * kGiB);  // exactly what is left
  REQUIRE(c.ok());
  CHECK(rank0.MemoryInfo().free_bytes == 0);
  CHECK(absl::IsResourceExhausted(rank0.Malloc(512).status()));
  CHECK(rank0.Free(*a).ok());
  CHECK(ledger->Used(0) == 6 * kGiB);
  CHECK(ledger->UsedBy(0, 0) == 0);
  CHECK(ledger->UsedBy(0, 1) == 6 * kGiB);
  CHECK(rank0.used_bytes() == 0);
  CHECK(rank1.used_bytes() == 6 * kGiB);
}

TEST_CASE("a ledger keeps devices apart by physical id, and pages count too") {
  std::shared_ptr<DeviceLedger> ledger = DeviceLedger::InMemory();
  SimDevice gpu0({.capacity = 64 * kMiB, .index = 0});
  SimDevice gpu1({.capacity = 64 * kMiB, .index = 1});
  REQUIRE(gpu0.UseLedger(ledger, 0, 0).ok());
  REQUIRE(gpu1.UseLedger(ledger, 1, 1).ok());
  CHECK(gpu0.Malloc(40 * kMiB).ok());
  CHECK(gpu1.Malloc(40 * kMiB).ok());  // another GPU: its own 64 MiB
  auto base = gpu1.ReserveAddress(128 * kMiB);
  REQUIRE(base.ok());
  CHECK(gpu1.MapPage(*base, 20 * kMiB).ok());
  CHECK(absl::IsResourceExhausted(gpu1.MapPage(*base + 20 * kMiB, 20 * kMiB)));
  CHECK(ledger->Used(0) == 40 * kMiB);
  CHECK(ledger->Used(1) == 60 * kMiB);
  CHECK(gpu1.UnmapPage(*base, 20 * kMiB).ok());
  CHECK(ledger->Used(1) == 40 * kMiB);
  CHECK(gpu1.MapPage(*base, 2 * kMiB).ok());
  CHECK(gpu1.ReleaseAddress(*base, 128 * kMiB).ok());  // releases its mapped pages
  CHECK(ledger->Used(1) == 40 * kMiB);
}

TEST_CASE("a destroyed device returns what it held to the ledger, as a process's exit does") {
  std::shared_ptr<DeviceLedger> ledger = DeviceLedger::InMemory();
  {
    SimDevice gpu({.capacity = 64 * kMiB});
    REQUIRE(gpu.UseLedger(ledger, 3, 2).ok());
    CachingAllocator allocator(gpu);
    CHECK(allocator.Malloc(30 * kMiB).ok());  // never freed
    CHECK(ledger->Used(3) == 30 * kMiB);
    CHECK(ledger->UsedBy(3, 2) == 30 * kMiB);
  }
  CHECK(ledger->Used(3) == 0);
  CHECK(ledger->UsedBy(3, 2) == 0);
}

TEST_CASE("UseLedger refuses a device out of range or one that already allocated") {
  std::shared_ptr<DeviceLedger> ledger = DeviceLedger::InMemory();
  SimDevice gpu({.capacity = 64 * kMiB});
  CHECK(gpu.UseLedger(ledger, DeviceLedger::kMaxDevices, 0).message() ==
        "physical GPU 256: the simulation has GPUs 0 to 255");
  CHECK(gpu.UseLedger(ledger, -1, 0).code() == absl::StatusCode::kInvalidArgument);
  CHECK(gpu.Malloc(512).ok());
  CHECK(gpu.UseLedger(ledger, 0, 0).code() == absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("the allocator's OOM on a shared device reports the device's free bytes, every process included") {
  std::shared_ptr<DeviceLedger> ledger = DeviceLedger::InMemory();
  SimDevice other({.capacity = 100 * kMiB, .index = 0});
  SimDevice mine({.capacity = 100 * kMiB, .index = 0});
  REQUIRE(other.UseLedger(ledger, 0, 1).ok());
  REQUIRE(mine.UseLedger(ledger, 0, 0).ok());
  REQUIRE(other.Malloc(60 * kMiB).ok());
  CachingAllocator allocator(mine);
  auto p = allocator.Malloc(50 * kMiB);
  REQUIRE(absl::IsResourceExhausted(p.status()));
  const std::string message(p.status().message());
  CHECK(message.rfind("CUDA out of memory. Tried to allocate 50.00 MiB. GPU 0 has a total capacity of 100.00 MiB of "
                      "which 40.00 MiB is free.",
                      0) == 0);
}

TEST_CASE("a ledger file is shared by processes: a child's charge is seen by the parent") {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("memscope-ledger-test-" + std::to_string(::getpid()))).string();
  std::filesystem::remove(path);
  auto ledger = DeviceLedger::Open(path);
  REQUIRE(ledger.ok());
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    auto mine = DeviceLedger::Open(path);
    bool ok =
        mine.ok() && (*mine)->TryCharge(0, 1, 7 * kMiB, 10 * kMiB) && !(*mine)->TryCharge(0, 1, 4 * kMiB, 10 * kMiB);
    std::_Exit(ok ? 0 : 1);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK((*ledger)->Used(0) == 7 * kMiB);
  CHECK((*ledger)->UsedBy(0, 1) == 7 * kMiB);
  CHECK_FALSE((*ledger)->TryCharge(0, 0, 4 * kMiB, 10 * kMiB));
  CHECK((*ledger)->TryCharge(0, 0, 3 * kMiB, 10 * kMiB));
  // Opened again (a late rank), it holds the same counts.
  auto again = DeviceLedger::Open(path);
  REQUIRE(again.ok());
  CHECK((*again)->Used(0) == 10 * kMiB);
  std::filesystem::remove(path);
}

TEST_CASE("a ledger that cannot be written whole (a full disk) is an error at Open, and nothing is left mapped") {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("memscope-full-ledger-" + std::to_string(::getpid()))).string();
  std::filesystem::remove(path);
  // In a child: files may grow to 64 KiB only (RLIMIT_FSIZE, SIGXFSZ
  // ignored: write() fails with EFBIG), as on a disk with 64 KiB free.
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    std::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{64 << 10, 64 << 10};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    auto ledger = DeviceLedger::Open(path);
    const bool named = !ledger.ok() && ledger.status().message() ==
                                           "cannot write device ledger '" + path + "': File too large";
    std::_Exit(named && !std::filesystem::exists(path) ? 0 : 1);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  std::filesystem::remove(path);
}

TEST_CASE("a file that is not a ledger is refused, by name") {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("memscope-not-ledger-" + std::to_string(::getpid()))).string();
  {
    std::FILE* f = std::fopen(path.c_str(), "w");
    std::fputs("hello\n", f);
    std::fclose(f);
  }
  auto ledger = DeviceLedger::Open(path);
  CHECK(ledger.status().message() ==
        "device ledger '" + path + "': not a memscope device ledger (6 bytes, expected 264256)");
  std::filesystem::remove(path);
}

TEST_CASE("memory outside the allocator (a CUDA context) counts against the GPU and its ledger") {
  std::shared_ptr<DeviceLedger> ledger = DeviceLedger::InMemory();
  {
    SimDevice gpu({.capacity = 100 * kMiB});
    REQUIRE(gpu.UseLedger(ledger, 0, 0).ok());
    CHECK(gpu.ChargeOutside(30 * kMiB).ok());
    CHECK(gpu.outside_bytes() == 30 * kMiB);
    CHECK(gpu.used_bytes() == 0);  // allocations only
    CHECK(gpu.MemoryInfo().free_bytes == 70 * kMiB);
    CHECK(ledger->Used(0) == 30 * kMiB);
    CHECK(absl::IsResourceExhausted(gpu.Malloc(71 * kMiB).status()));
    CHECK(gpu.Malloc(70 * kMiB).ok());
    CHECK(absl::IsResourceExhausted(gpu.ChargeOutside(512)));
  }
  CHECK(ledger->Used(0) == 0);  // the process ended: its context went with it
  SimDevice alone({.capacity = 100 * kMiB});
  CHECK(alone.ChargeOutside(40 * kMiB).ok());
  CHECK(alone.MemoryInfo().free_bytes == 60 * kMiB);
  CHECK(absl::IsResourceExhausted(alone.Malloc(61 * kMiB).status()));
}
