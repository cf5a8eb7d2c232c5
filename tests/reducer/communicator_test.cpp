// The Gloo communicator over loopback TCP: ranks are threads, each with its
// own communicator, or fork()ed processes where a rank must die. Catch2 is not
// thread-safe, so rank threads only record results; the test thread checks.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <latch>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "reducer/communicator.h"
#ifdef MEMSCOPE_HAVE_NCCL
#include "reducer/nccl_communicator.h"
#endif

namespace memscope::reducer {
namespace {

using namespace std::chrono_literals;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// A fresh directory, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "memscope-reducer-XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path_ = tmpl;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string store() const { return path_ + "/store"; }

 private:
  std::string path_;
};

GlooOptions Options(const TempDir& dir, int rank, int world, std::chrono::milliseconds timeout = 10s) {
  GlooOptions o;
  o.rank = rank;
  o.world_size = world;
  o.store_dir = dir.store();
  o.timeout = timeout;
  return o;
}

// Runs fn(comm) on `world` rank threads; returns each rank's CommError message
// ("" when it raised none). With `gloo_checks_rank` >= 0, that rank offers no
// shared check region, so every rank checks through gloo.
std::vector<std::string> RunRanks(int world, const std::function<void(Communicator&)>& fn,
                                  std::chrono::milliseconds timeout = 10s, int gloo_checks_rank = -1,
                                  int loop_nice = 0) {
  TempDir dir;
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        GlooOptions options = Options(dir, r, world, timeout);
        options.shared_checks = r != gloo_checks_rank;
        options.loop_nice = loop_nice;
        std::unique_ptr<Communicator> comm = CreateGlooCommunicator(options);
        fn(*comm);
      } catch (const CommError& e) {
        errors[r] = e.what();
      } catch (const std::exception& e) {
        errors[r] = std::string("not a CommError: ") + e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return errors;
}

void CheckNoErrors(const std::vector<std::string>& errors) {
  for (std::size_t r = 0; r < errors.size(); ++r) {
    INFO("rank " << r);
    CHECK(errors[r] == "");
  }
}

// Exact IEEE half and bfloat16 bit patterns of small integers.
std::uint16_t Half(int v) {
  switch (v) {
    case 1: return 0x3C00;
    case 2: return 0x4000;
    case 3: return 0x4200;
    case 4: return 0x4400;
    case 10: return 0x4900;
  }
  FAIL("no half for " << v);
  return 0;
}
std::uint16_t BFloat16(int v) {
  switch (v) {
    case 1: return 0x3F80;
    case 2: return 0x4000;
    case 3: return 0x4040;
    case 4: return 0x4080;
    case 10: return 0x4120;
  }
  FAIL("no bfloat16 for " << v);
  return 0;
}

// Each twice: the small integer sums through the ranks' mailboxes, then with
// rank 0 offering no shared region, so every rank sums through gloo.
TEST_CASE("gloo allreduce sums float32 float16 bfloat16 int32 and int64 exactly on 2 and 4 ranks") {
  for (const auto& [world, gloo_checks_rank] : {std::pair{2, -1}, {4, -1}, {2, 0}, {4, 0}}) {
    INFO("world size " << world << ", checks through gloo: " << (gloo_checks_rank >= 0));
    const int total = world * (world + 1) / 2;  // rank r contributes r + 1
    constexpr std::size_t kCount = 1000;
    std::vector<std::vector<float>> f32(world, std::vector<float>(kCount));
    std::vector<std::vector<std::uint16_t>> f16(world, std::vector<std::uint16_t>(kCount));
    std::vector<std::vector<std::uint16_t>> bf16(world, std::vector<std::uint16_t>(3));
    std::vector<std::vector<std::int32_t>> i32(world, std::vector<std::int32_t>(kCount));
    std::vector<std::vector<std::int64_t>> i64(world, std::vector<std::int64_t>(kCount));
    constexpr std::size_t kBig = 300'001;  // uneven segments of ~1 MB
    std::vector<std::vector<float>> big(world, std::vector<float>(kBig));
    std::vector<std::int64_t> one(world);  // one element: most segments are empty
    constexpr std::size_t kBigInt = 9000;  // 72 KB: more than a mailbox, through gloo's ring
    std::vector<std::vector<std::int64_t>> big_i64(world, std::vector<std::int64_t>(kBigInt));
    CheckNoErrors(RunRanks(world, [&](Communicator& comm) {
      const int r = comm.rank();
      for (std::size_t i = 0; i < kCount; ++i) {
        f32[r][i] = static_cast<float>(r + 1) + static_cast<float>(i);
        f16[r][i] = Half(r + 1);
        i32[r][i] = -(r + 1);
        i64[r][i] = (std::int64_t{r + 1} << 40) + static_cast<std::int64_t>(i);
      }
      for (std::uint16_t& b : bf16[r]) b = BFloat16(r + 1);
      for (std::size_t i = 0; i < kBig; ++i) big[r][i] = static_cast<float>((r + 1) * static_cast<int>(i % 7));
      one[r] = r + 1;
      for (std::size_t i = 0; i < kBigInt; ++i) big_i64[r][i] = static_cast<std::int64_t>(i) * (r + 1) - 5000;
      comm.AllreduceSum(f32[r].data(), kCount, DType::kFloat32);
      comm.AllreduceSum(f16[r].data(), kCount, DType::kFloat16);
      comm.AllreduceSum(bf16[r].data(), 3, DType::kBFloat16);
      comm.AllreduceSum(i32[r].data(), kCount, DType::kInt32);
      comm.AllreduceSum(i64[r].data(), kCount, DType::kInt64);
      comm.AllreduceSum(big[r].data(), kBig, DType::kFloat32);
      comm.AllreduceSum(&one[r], 1, DType::kInt64);
      comm.AllreduceSum(big_i64[r].data(), kBigInt, DType::kInt64);
    }, 10s, gloo_checks_rank));
    for (int r = 0; r < world; ++r) {
      INFO("rank " << r);
      std::size_t wrong_f32 = 0, wrong_f16 = 0, wrong_i32 = 0, wrong_i64 = 0, wrong_big = 0;
      for (std::size_t i = 0; i < kCount; ++i) {
        wrong_f32 += f32[r][i] != static_cast<float>(total) + static_cast<float>(world) * static_cast<float>(i);
        wrong_f16 += f16[r][i] != Half(total);
        wrong_i32 += i32[r][i] != -total;
        wrong_i64 += i64[r][i] != (std::int64_t{total} << 40) + world * static_cast<std::int64_t>(i);
      }
      for (std::size_t i = 0; i < kBig; ++i) {
        wrong_big += big[r][i] != static_cast<float>(total * static_cast<int>(i % 7));
      }
      CHECK(wrong_f32 == 0);
      CHECK(wrong_f16 == 0);
      CHECK(wrong_i32 == 0);
      CHECK(wrong_i64 == 0);
      CHECK(wrong_big == 0);
      CHECK(bf16[r] == std::vector<std::uint16_t>(3, BFloat16(total)));
      CHECK(one[r] == total);
      std::size_t wrong_big_i64 = 0;
      for (std::size_t i = 0; i < kBigInt; ++i) {
        wrong_big_i64 += big_i64[r][i] != static_cast<std::int64_t>(i) * total - 5000 * world;
      }
      CHECK(wrong_big_i64 == 0);
    }
  }
}

TEST_CASE("gloo broadcast from root 1 and allgather lay out every rank's elements on 2 and 4 ranks") {
  // Through the mailboxes, then through gloo (rank 0 offers no shared region).
  for (const auto& [world, gloo_checks_rank] : {std::pair{2, -1}, {4, -1}, {2, 0}, {4, 0}}) {
    INFO("world size " << world << ", checks through gloo: " << (gloo_checks_rank >= 0));
    std::vector<std::vector<std::int64_t>> bcast(world, std::vector<std::int64_t>(5));
    std::vector<std::vector<std::int32_t>> gathered(world, std::vector<std::int32_t>(3 * world));
    std::vector<std::vector<float>> in_place(world, std::vector<float>(2 * world, -1.0F));
    CheckNoErrors(RunRanks(world, [&](Communicator& comm) {
      const int r = comm.rank();
      for (int i = 0; i < 5; ++i) bcast[r][i] = r * 100 + i;
      comm.Broadcast(bcast[r].data(), 5, DType::kInt64, 1);
      const std::vector<std::int32_t> mine = {r * 10, r * 10 + 1, r * 10 + 2};
      comm.Allgather(mine.data(), gathered[r].data(), 3, DType::kInt32);
      in_place[r][2 * r] = static_cast<float>(r);  // in == out + rank * count
      in_place[r][2 * r + 1] = 0.5F + static_cast<float>(r);
      comm.Allgather(in_place[r].data() + 2 * r, in_place[r].data(), 2, DType::kFloat32);
      comm.Barrier();
    }, 10s, gloo_checks_rank));
    for (int r = 0; r < world; ++r) {
      INFO("rank " << r);
      CHECK(bcast[r] == std::vector<std::int64_t>{100, 101, 102, 103, 104});
      for (int q = 0; q < world; ++q) {
        for (int j = 0; j < 3; ++j) CHECK(gathered[r][3 * q + j] == q * 10 + j);
        CHECK(in_place[r][2 * q] == static_cast<float>(q));
        CHECK(in_place[r][2 * q + 1] == 0.5F + static_cast<float>(q));
      }
    }
  }
}

// `in` overlapping another rank's chunk of `out`, and a broadcast of 64 KiB
// (a full mailbox) then of 64 KiB + 4 (through gloo), from root 0.
TEST_CASE("gloo allgather from an overlapping input and broadcasts at the mailbox's size and beyond") {
  constexpr std::size_t kFull = 64 * 1024 / 4;
  std::vector<std::vector<std::int32_t>> out(2, std::vector<std::int32_t>(4, -1));
  std::vector<std::vector<std::int32_t>> full(2, std::vector<std::int32_t>(kFull));
  std::vector<std::vector<std::int32_t>> more(2, std::vector<std::int32_t>(kFull + 1));
  CheckNoErrors(RunRanks(2, [&](Communicator& comm) {
    const int r = comm.rank();
    std::vector<std::int32_t>& o = out[r];
    o[2] = 10 * r + 1;  // rank r's input is o[2..3], which is rank 1's chunk
    o[3] = 10 * r + 2;
    comm.Allgather(o.data() + 2, o.data(), 2, DType::kInt32);
    for (std::size_t i = 0; i < kFull; ++i) full[r][i] = static_cast<std::int32_t>(i) + r;
    for (std::size_t i = 0; i <= kFull; ++i) more[r][i] = static_cast<std::int32_t>(i) * 3 + r;
    comm.Broadcast(full[r].data(), kFull, DType::kInt32, 0);
    comm.Broadcast(more[r].data(), kFull + 1, DType::kInt32, 0);
  }));
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK(out[r] == std::vector<std::int32_t>{1, 2, 11, 12});
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < kFull; ++i) wrong += full[r][i] != static_cast<std::int32_t>(i);
    for (std::size_t i = 0; i <= kFull; ++i) wrong += more[r][i] != static_cast<std::int32_t>(i) * 3;
    CHECK(wrong == 0);
  }
}

// Gloo's event loop polls without sleeping while a pair connects or data
// waits for its receive: with loop_nice 10 (a meta run's) it runs at nice
// +10, the ranks' own threads do not; with 0 (the default) all alike.
TEST_CASE("gloo's event-loop thread runs at a lower priority than the rank's threads with loop_nice") {
  const auto nices = [] {
    std::vector<int> v;
    for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
      std::ifstream in(task.path() / "stat");
      std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      std::istringstream fields(stat.substr(stat.rfind(')') + 2));  // from field 3 (state)
      std::string f;
      for (int i = 3; i <= 19 && fields >> f; ++i) {
      }
      v.push_back(std::stoi(f));  // field 19: nice
    }
    return v;
  };
  const std::vector<int> before = nices();
  const int base = *std::max_element(before.begin(), before.end());
  REQUIRE(base < 19);  // a test process already at nice 19 cannot tell the loop apart
  for (int loop_nice : {10, 0}) {
    INFO("loop_nice " << loop_nice);
    std::vector<int> during;
    CheckNoErrors(RunRanks(
        2,
        [&](Communicator& comm) {
          comm.Barrier();
          if (comm.rank() == 0) during = nices();
          comm.Barrier();
        },
        10s, -1, loop_nice));
    const auto lowered = static_cast<std::ptrdiff_t>(loop_nice > 0 ? 2 : 0);  // one loop per rank
    CHECK(std::count(during.begin(), during.end(), std::min(base + 10, 19)) == lowered);
    CHECK(std::count(during.begin(), during.end(), base) == static_cast<std::ptrdiff_t>(during.size()) - lowered);
  }
}

TEST_CASE("gloo barriers on 4 ranks complete") {
  CheckNoErrors(RunRanks(4, [](Communicator& comm) {
    for (int i = 0; i < 5; ++i) comm.Barrier();
  }));
}

TEST_CASE("gloo meta collectives with null data check and move nothing and keep ranks in step") {
  std::vector<std::vector<float>> sums(2, std::vector<float>(4));
  CheckNoErrors(RunRanks(2, [&](Communicator& comm) {
    comm.AllreduceSum(nullptr, 1234, DType::kFloat32);
    comm.Broadcast(nullptr, 1234, DType::kFloat16, 1);
    comm.Allgather(nullptr, nullptr, 1234, DType::kInt64);
    // Still in lockstep: the next real collective sums exactly once.
    std::vector<float>& s = sums[comm.rank()];
    std::fill(s.begin(), s.end(), static_cast<float>(comm.rank() + 1));
    comm.AllreduceSum(s.data(), s.size(), DType::kFloat32);
  }));
  CHECK(sums[0] == std::vector<float>(4, 3.0F));
  CHECK(sums[1] == std::vector<float>(4, 3.0F));
}

// Collectives that move no data are checked in batches: a rank does not wait
// for its peers at each one, only at the next check.
TEST_CASE("gloo meta collectives do not wait for the peers until the next barrier") {
  std::latch rank1_ahead(1);
  CheckNoErrors(RunRanks(
      2,
      [&](Communicator& comm) {
        if (comm.rank() == 0) rank1_ahead.wait();  // rank 0 starts only once rank 1 is 100 collectives ahead
        for (int i = 0; i < 100; ++i) comm.AllreduceSum(nullptr, 1000 + i, DType::kFloat32);
        if (comm.rank() == 1) rank1_ahead.count_down();
        comm.Barrier();
      },
      2s));
}

TEST_CASE("gloo meta mismatch is named at the next check with the number of the collective that differs") {
  const std::vector<std::string> errors = RunRanks(4, [](Communicator& comm) {
    for (int i = 1; i <= 10; ++i) {
      const std::size_t count = comm.rank() == 2 && i == 5 ? 11 : 10;
      comm.AllreduceSum(nullptr, count, DType::kFloat32);
    }
    comm.Barrier();
  });
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r);
    CHECK(errors[r] == "rank " + std::to_string(r) +
                           ": collective mismatch at collective #5: ranks 0, 1, 3 called allreduce(float32, 10 "
                           "elements, meta), rank 2 called allreduce(float32, 11 elements, meta)");
  }
}

// The same checks when one rank (here rank 3, or rank 0 of 2) offers no
// shared region: every rank falls back to gloo's allgather, and the
// mismatch, the barrier and the 256th-collective check behave the same.
TEST_CASE("gloo checks through gloo when a rank offers no shared region: mismatch, barrier and the 256th") {
  const std::vector<std::string> mismatch = RunRanks(
      4,
      [](Communicator& comm) {
        for (int i = 1; i <= 10; ++i) {
          const std::size_t count = comm.rank() == 2 && i == 5 ? 11 : 10;
          comm.AllreduceSum(nullptr, count, DType::kFloat32);
        }
        comm.Barrier();
      },
      10s, 3);
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r);
    CHECK(mismatch[r] == "rank " + std::to_string(r) +
                             ": collective mismatch at collective #5: ranks 0, 1, 3 called allreduce(float32, 10 "
                             "elements, meta), rank 2 called allreduce(float32, 11 elements, meta)");
  }
  CheckNoErrors(RunRanks(
      4,
      [](Communicator& comm) {
        for (int i = 0; i < 600; ++i) comm.AllreduceSum(nullptr, 10, DType::kFloat32);
        comm.Barrier();
      },
      10s, 3));
  std::promise<void> rank1_done;
  std::shared_future<void> done = rank1_done.get_future().share();
  const std::vector<std::string> stopped = RunRanks(
      2,
      [&](Communicator& comm) {
        const int calls = comm.rank() == 0 ? 100 : 300;
        try {
          for (int i = 0; i < calls; ++i) comm.Broadcast(nullptr, 4, DType::kInt64, 0);
        } catch (const CommError&) {
          rank1_done.set_value();
          throw;
        }
        if (comm.rank() == 0) done.wait();
      },
      1s, 0);
  CHECK(stopped[0] == "");
  CHECK(stopped[1] ==
        "rank 1: broadcast #256 timed out after 1 s: rank 0 did not arrive (its last collective: broadcast #100)");
}

// 256 unchecked collectives are a check: rank 1, which calls 300, waits there
// for rank 0, which called 100 and stopped, and names it.
TEST_CASE("gloo meta collectives are checked at least every 256, so a rank that stops calling them is named") {
  std::promise<void> rank1_done;
  std::shared_future<void> done = rank1_done.get_future().share();
  const std::vector<std::string> errors = RunRanks(
      2,
      [&](Communicator& comm) {
        const int calls = comm.rank() == 0 ? 100 : 300;
        try {
          for (int i = 0; i < calls; ++i) comm.Broadcast(nullptr, 4, DType::kInt64, 0);
        } catch (const CommError&) {
          rank1_done.set_value();
          throw;
        }
        if (comm.rank() == 0) done.wait();  // alive, but calls nothing more
      },
      1s);
  CHECK(errors[0] == "");
  CHECK(errors[1] ==
        "rank 1: broadcast #256 timed out after 1 s: rank 0 did not arrive (its last collective: broadcast #100)");
}

// Forks rank 1 of a 2-rank world that connects, runs `body` on its
// communicator and then dies without a destructor (a crash): exit 0, or 3 when
// a call threw. Returns the child's pid.
template <typename Body>
pid_t ForkRankThatCrashes(const TempDir& dir, Body body) {
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    int code = 0;
    try {
      std::unique_ptr<Communicator> comm = CreateGlooCommunicator(Options(dir, 1, 2, 10s));
      body(*comm);
      comm.release();  // a crash: no destructor runs
    } catch (...) {
      code = 3;
    }
    ::_exit(code);
  }
  return child;
}

// A forked rank 1 calls a barrier and three meta collectives, and dies
// without a destructor: rank 0's check names it and its last collective,
// read from the progress file it wrote through its mapping.
TEST_CASE("gloo dead rank after unchecked meta collectives: the next check names it and its last collective") {
  TempDir dir;
  const pid_t child = ForkRankThatCrashes(dir, [](Communicator& comm) {
    comm.Barrier();  // both ends connected
    for (int i = 0; i < 3; ++i) comm.AllreduceSum(nullptr, 8, DType::kFloat32);
  });
  std::string error;
  {
    std::unique_ptr<Communicator> comm = CreateGlooCommunicator(Options(dir, 0, 2, 10s));
    comm->Barrier();
    for (int i = 0; i < 3; ++i) comm->AllreduceSum(nullptr, 8, DType::kFloat32);
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status));
    try {
      comm->Barrier();
    } catch (const CommError& e) {
      error = e.what();
    }
  }
  CHECK(error ==
        "rank 0: rank 1 closed its connection (exited or was killed) during barrier #5 (its last collective: "
        "allreduce #4)");
}

TEST_CASE("gloo collective mismatch: rank 0 calls barrier while rank 1 calls allreduce") {
  std::vector<double> later(2, -1);
  std::vector<std::string> later_errors(2);
  const std::vector<std::string> errors = RunRanks(2, [&](Communicator& comm) {
    comm.Barrier();
    std::vector<float> grad(1234, 1.0F);
    try {
      if (comm.rank() == 0) {
        comm.Barrier();
      } else {
        comm.AllreduceSum(grad.data(), grad.size(), DType::kFloat32);
      }
    } catch (const CommError&) {
      // After a CommError every call fails at once.
      const Clock::time_point start = Clock::now();
      try {
        comm.Barrier();
      } catch (const CommError& e) {
        later_errors[comm.rank()] = e.what();
      }
      later[comm.rank()] = SecondsSince(start);
      throw;
    }
  });
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << errors[r]);
    CHECK_THAT(errors[r], Contains("collective mismatch"));
    CHECK_THAT(errors[r], Contains("rank 0 called barrier"));
    CHECK_THAT(errors[r], Contains("rank 1 called allreduce"));
    CHECK(errors[r] == "rank " + std::to_string(r) +
                           ": collective mismatch at collective #2: rank 0 called barrier, rank 1 called "
                           "allreduce(float32, 1234 elements)");
    CHECK(errors[r].find('\n') == std::string::npos);
    CHECK_THAT(later_errors[r], Contains("unusable after an earlier error") && Contains("collective mismatch"));
    CHECK(later[r] < 0.5);
  }
}

// Rank 2's meta broadcast is not checked at once (it moves no data), the
// others' are: rank 2 joins their check at its barrier, and every rank names
// collective #1.
TEST_CASE("gloo mismatch in dtype count root or meta names what each rank called") {
  const std::vector<std::string> errors = RunRanks(4, [](Communicator& comm) {
    std::vector<std::int64_t> v(8, 1);
    if (comm.rank() == 3) {
      comm.Broadcast(v.data(), 8, DType::kInt64, 2);
    } else if (comm.rank() == 2) {
      comm.Broadcast(nullptr, 8, DType::kInt64, 1);
    } else {
      comm.Broadcast(v.data(), 8, DType::kInt64, 1);
    }
    comm.Barrier();
  });
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r);
    CHECK(errors[r] == "rank " + std::to_string(r) +
                           ": collective mismatch at collective #1: ranks 0, 1 called broadcast(int64, 8 elements, "
                           "root 1), rank 2 called broadcast(int64, 8 elements, root 1, meta), rank 3 called "
                           "broadcast(int64, 8 elements, root 2)");
  }
}

TEST_CASE("gloo missing rank: rank 1 joined the rendezvous but never enters the collective") {
  std::promise<void> rank0_done;
  std::shared_future<void> done = rank0_done.get_future().share();
  double elapsed = -1;
  double later = -1;
  std::string later_error;
  const std::vector<std::string> errors = RunRanks(
      2,
      [&](Communicator& comm) {
        if (comm.rank() == 1) {
          done.wait();  // alive, connected, but never calls the barrier
          return;
        }
        const Clock::time_point start = Clock::now();
        try {
          comm.Barrier();
        } catch (const CommError&) {
          elapsed = SecondsSince(start);
          const Clock::time_point again = Clock::now();
          try {
            comm.AllreduceSum(nullptr, 1, DType::kFloat32);
          } catch (const CommError& e) {
            later_error = e.what();
          }
          later = SecondsSince(again);
          rank0_done.set_value();
          throw;
        }
        rank0_done.set_value();
      },
      2s);
  INFO(errors[0]);
  CHECK(errors[0] ==
        "rank 0: barrier #1 timed out after 2 s: rank 1 did not arrive (its last collective: none "
        "since rendezvous)");
  CHECK(errors[1] == "");
  CHECK(elapsed >= 1.9);
  CHECK(elapsed < 2.0 + 3.0);
  CHECK_THAT(later_error, Contains("unusable"));
  CHECK(later < 0.5);
}

TEST_CASE("gloo missing rank on 4 ranks names the rank that stays behind") {
  std::vector<std::promise<void>> finished(4);
  std::vector<std::shared_future<void>> all;
  for (auto& p : finished) all.push_back(p.get_future().share());
  const std::vector<std::string> errors = RunRanks(
      4,
      [&](Communicator& comm) {
        const int r = comm.rank();
        struct Done {
          std::promise<void>& p;
          ~Done() { p.set_value(); }
        } done{finished[r]};
        std::vector<float> v(16, 1.0F);
        comm.AllreduceSum(v.data(), v.size(), DType::kFloat32);  // #1: everyone
        if (r == 2) {
          for (int q : {0, 1, 3}) all[q].wait();  // stays behind at #1
          return;
        }
        comm.AllreduceSum(v.data(), v.size(), DType::kFloat32);  // #2: rank 2 never comes
      },
      2s);
  CHECK(errors[2] == "");
  for (int r : {0, 1, 3}) {
    INFO("rank " << r << ": " << errors[r]);
    CHECK_THAT(errors[r], StartsWith("rank " + std::to_string(r) + ": allreduce #2"));
    CHECK_THAT(errors[r], Contains("rank 2 did not arrive (its last collective: allreduce #1)"));
  }
}

// A forked rank 1 that exits right after the rendezvous (and one barrier).
TEST_CASE("gloo dead rank: rank 0's next collective names the rank that exited well before the timeout") {
  TempDir dir;
  const pid_t child = ForkRankThatCrashes(dir, [](Communicator& comm) { comm.Barrier(); });
  std::string error;
  double elapsed = -1;
  {
    std::unique_ptr<Communicator> comm = CreateGlooCommunicator(Options(dir, 0, 2, 10s));
    comm->Barrier();
    std::vector<float> grad(1 << 16, 1.0F);
    const Clock::time_point start = Clock::now();
    try {
      comm->AllreduceSum(grad.data(), grad.size(), DType::kFloat32);
    } catch (const CommError& e) {
      error = e.what();
    }
    elapsed = SecondsSince(start);
    CHECK_THROWS_AS(comm->Barrier(), CommError);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  INFO(error);
  CHECK(error ==
        "rank 0: rank 1 closed its connection (exited or was killed) during allreduce #2 (its last "
        "collective: barrier #1)");
  CHECK(elapsed < 3.0);
}

// Rank 3 is a forked process, SIGKILLed while it waits in barrier #2; ranks
// 0-2 are threads that then call allreduce #2. Each must name rank 3, fast,
// whether its own ring neighbour is rank 3 or a rank that failed first.
TEST_CASE("gloo killed rank on 4 ranks: every survivor names it well before the timeout") {
  TempDir dir;
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    try {
      std::unique_ptr<Communicator> comm = CreateGlooCommunicator(Options(dir, 3, 4, 10s));
      comm->Barrier();
      comm->Barrier();  // blocks: the others call allreduce after this process is killed
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(0);
  }
  std::latch entered(3);
  std::latch killed(1);
  std::vector<std::string> errors(3);
  std::vector<double> elapsed(3, -1);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      try {
        std::unique_ptr<Communicator> comm = CreateGlooCommunicator(Options(dir, r, 4, 10s));
        comm->Barrier();
        entered.count_down();
        killed.wait();
        std::vector<float> v(1024, 1.0F);
        const Clock::time_point start = Clock::now();
        try {
          comm->AllreduceSum(v.data(), v.size(), DType::kFloat32);
        } catch (const CommError& e) {
          errors[r] = e.what();
        }
        elapsed[r] = SecondsSince(start);
      } catch (const CommError& e) {
        errors[r] = std::string("setup: ") + e.what();
        entered.count_down();
      }
    });
  }
  entered.wait();
  std::this_thread::sleep_for(200ms);  // rank 3 is in barrier #2 by now
  ::kill(child, SIGKILL);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFSIGNALED(status));
  killed.count_down();
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r << ": " << errors[r]);
    CHECK_THAT(errors[r], StartsWith("rank " + std::to_string(r) +
                                     ": rank 3 closed its connection (exited or was "
                                     "killed) during allreduce #2"));
    CHECK(elapsed[r] < 3.0);
  }
}

// Both ranks loop over 16 MB allreduces until rank 1 is SIGKILLed, most likely
// mid-transfer: rank 0 names it (and is not killed by a SIGPIPE).
TEST_CASE("gloo rank killed during large allreduces: the survivor names it") {
  TempDir dir;
  constexpr std::size_t kCount = 4 << 20;
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    try {
      std::unique_ptr<Communicator> comm = CreateGlooCommunicator(Options(dir, 1, 2, 10s));
      std::vector<float> v(kCount, 1.0F);
      for (;;) comm->AllreduceSum(v.data(), v.size(), DType::kFloat32);
    } catch (...) {
      ::_exit(3);
    }
  }
  std::string error;
  int completed = 0;
  Clock::time_point killed_at{};
  std::atomic<bool> started{false};
  std::thread rank0([&] {
    try {
      std::unique_ptr<Communicator> comm = CreateGlooCommunicator(Options(dir, 0, 2, 10s));
      std::vector<float> v(kCount, 1.0F);
      for (; completed < 1000; ++completed) {
        comm->AllreduceSum(v.data(), v.size(), DType::kFloat32);
        started = true;
      }
    } catch (const CommError& e) {
      error = e.what();
    }
  });
  while (!started) std::this_thread::sleep_for(1ms);
  std::this_thread::sleep_for(100ms);
  ::kill(child, SIGKILL);
  killed_at = Clock::now();
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  rank0.join();
  CHECK(WIFSIGNALED(status));
  INFO(error << " after " << completed << " allreduces");
  CHECK_THAT(error, StartsWith("rank 0: rank 1 closed its connection (exited or was killed) during allreduce #"));
  CHECK(SecondsSince(killed_at) < 3.0);
}

TEST_CASE("gloo rendezvous where rank 1 never starts names it after the timeout") {
  TempDir dir;
  const Clock::time_point start = Clock::now();
  std::string error;
  try {
    CreateGlooCommunicator(Options(dir, 0, 2, 1s));
  } catch (const CommError& e) {
    error = e.what();
  }
  const double elapsed = SecondsSince(start);
  CHECK(error == "rank 0: rendezvous timed out after 1 s: rank 1 never joined (store " + dir.store() + ")");
  CHECK(elapsed >= 1.0);
  CHECK(elapsed < 1.0 + 2.0);
}

TEST_CASE("gloo rendezvous of 4 ranks where ranks 2 and 3 never start names both") {
  TempDir dir;
  std::vector<std::string> msgs(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        CreateGlooCommunicator(Options(dir, r, 4, 1s));
      } catch (const CommError& e) {
        msgs[r] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    CHECK(msgs[r] == "rank " + std::to_string(r) + ": rendezvous timed out after 1 s: ranks 2, 3 never joined (store " +
                         dir.store() + ")");
  }
}

TEST_CASE("gloo with world size 1 runs every collective locally") {
  TempDir dir;
  std::unique_ptr<Communicator> comm = CreateGlooCommunicator(Options(dir, 0, 1));
  CHECK(comm->backend() == "gloo");
  CHECK(comm->world_size() == 1);
  std::vector<float> v = {1.0F, 2.0F};
  comm->AllreduceSum(v.data(), 2, DType::kFloat32);
  comm->Broadcast(v.data(), 2, DType::kFloat32, 0);
  std::vector<float> out(2);
  comm->Allgather(v.data(), out.data(), 2, DType::kFloat32);
  comm->Barrier();
  CHECK(v == std::vector<float>{1.0F, 2.0F});
  CHECK(out == v);
}

TEST_CASE("gloo invalid options and a reused store directory are CommErrors") {
  TempDir dir;
  CHECK_THROWS_AS(CreateGlooCommunicator(Options(dir, 2, 2)), CommError);
  CHECK_THROWS_AS(CreateGlooCommunicator(Options(dir, 0, 0)), CommError);
  GlooOptions no_dir = Options(dir, 0, 1);
  no_dir.store_dir.clear();
  CHECK_THROWS_AS(CreateGlooCommunicator(no_dir), CommError);
  CreateGlooCommunicator(Options(dir, 0, 1)).reset();
  CHECK_THROWS_WITH(CreateGlooCommunicator(Options(dir, 0, 1)), Contains("fresh directory"));
}

TEST_CASE("gloo broadcast with a root outside the world is a CommError on every rank") {
  const std::vector<std::string> errors = RunRanks(2, [](Communicator& comm) {
    std::vector<float> v(3);
    comm.Broadcast(v.data(), 3, DType::kFloat32, 5);
  });
  CHECK_THAT(errors[0], Contains("broadcast #1: root 5 is not a rank of world size 2"));
  CHECK_THAT(errors[1], Contains("broadcast #1: root 5 is not a rank of world size 2"));
}

#ifdef MEMSCOPE_HAVE_NCCL
// No GPU here: creation must fail cleanly. On a GPU machine it must work.
TEST_CASE("nccl communicator without a usable GPU fails with a CommError and not a crash") {
  TempDir dir;
  try {
    std::unique_ptr<Communicator> comm = CreateNcclCommunicator(Options(dir, 0, 1, 5s), 0);
    CHECK(comm->backend() == "nccl");
    comm->AllreduceSum(nullptr, 4, DType::kFloat32);
    comm->Barrier();
  } catch (const CommError& e) {
    CHECK_THAT(e.what(), Contains("rank 0: nccl: "));
  }
}
#endif

}  // namespace
}  // namespace memscope::reducer
