// ZeroRedundancyOptimizer (train/zero.h): the partition as PyTorch's
// _partition_parameters makes it, the flat buckets of
// parameters_as_bucket_view, and the broadcasts of _sync_params. The same
// figures against real torch 1.13 are in tests/cli/zero_test.py.
#include "train/zero.h"

#include <catch2/catch.hpp>

#include <string>
#include <tuple>
#include <vector>

#include "reducer/communicator.h"
#include "tests/tensor/tensor_test_util.h"

namespace memscope {
namespace {

// Rank `rank` of `world_size`, alone: each broadcast is written down, none
// moves data (the source's bytes stay as they are).
class BroadcastLog final : public reducer::Communicator {
 public:
  BroadcastLog(int rank, int world_size) : rank_(rank), world_size_(world_size) {}
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string backend() const override { return "broadcast-log"; }
  void AllreduceSum(void*, std::size_t, DType) override { FAIL("no allreduce expected"); }
  void Broadcast(void* data, std::size_t count, DType, int root) override { calls.emplace_back(data, count, root); }
  void Allgather(const void*, void*, std::size_t, DType) override { FAIL("no allgather expected"); }
  void Barrier() override {}

  std::vector<std::tuple<void*, std::size_t, int>> calls;  // data, count, root

 private:
  int rank_, world_size_;
};

// A named float32 parameter holding 0, 1, 2, ...
Tensor Param(DeviceContext& ctx, const std::string& name, const Shape& sizes) {
  Tensor t = Tensor::Empty(ctx, sizes);
  t.set_requires_grad(true);
  t.impl()->name = name;
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data()[i] = static_cast<float>(i);
  return t;
}

TEST_CASE("ZeRO partition: largest first, ties in their order, each to the first rank with the fewest elements") {
  // Sorted: 20 (#1), 20 (#2), 10 (#0), 10 (#3), 5 (#4). #1 -> rank 0, #2 ->
  // rank 1, #0 -> rank 0 (20 = 20: the first), #3 -> rank 1, #4 -> rank 0.
  CHECK(ZeroPartition({10, 20, 20, 10, 5}, 2) == std::vector<int>{0, 0, 1, 1, 0});
  // mlp (named_parameters order) on 3 ranks, as torch 1.13 partitions it:
  // layers.1.weight, layers.2.weight, then everything else on rank 2.
  CHECK(ZeroPartition({131072, 512, 262144, 512, 262144, 512, 5120, 10}, 3) ==
        std::vector<int>{2, 2, 0, 2, 1, 2, 2, 2});
  // More ranks than parameters: ranks 1 and 2 own nothing.
  CHECK(ZeroPartition({7}, 3) == std::vector<int>{0});
  CHECK(ZeroPartition({}, 2).empty());
}

TEST_CASE("ZeRO without bucket view: each rank steps its own parameters, and step broadcasts each from its owner") {
  testing::CpuGpu d;
  Tensor a = Param(d.ctx, "a", {7}), b = Param(d.ctx, "b", {3}), c = Param(d.ctx, "c", {2});
  BroadcastLog comm(1, 2);
  ZeroRedundancy zero({&a, &b, &c}, comm, ZeroOptions{});
  CHECK(zero.PartitionNames() == std::vector<std::vector<std::string>>{{"a"}, {"b", "c"}});
  CHECK(zero.owned() == std::vector<Tensor*>{&b, &c});
  CHECK(zero.BucketBytes().empty());
  zero.SyncParams();
  using Call = std::tuple<void*, std::size_t, int>;
  CHECK(comm.calls == std::vector<Call>{{a.raw_data(), 7, 0}, {b.raw_data(), 3, 1}, {c.raw_data(), 2, 1}});
}

TEST_CASE("ZeRO bucket view: one flat bucket per rank holds its parameters, zeros(1) for a rank that owns nothing") {
  testing::CpuGpu d;
  Tensor a = Param(d.ctx, "a", {7}), b = Param(d.ctx, "b", {3});
  CHECK(d.alloc.memory_allocated() == 2 * 512);
  BroadcastLog comm(0, 3);
  ZeroRedundancy zero({&a, &b}, comm, ZeroOptions{.parameters_as_bucket_view = true});
  CHECK(zero.PartitionNames() == std::vector<std::vector<std::string>>{{"a"}, {"b"}, {}});
  // torch.zeros(1) (float32) for rank 2, whose bucket would be empty.
  CHECK(zero.BucketBytes() == std::vector<std::uint64_t>{7 * 4, 3 * 4, 4});
  // The parameters' own blocks are freed: three 512-byte buckets remain.
  CHECK(d.alloc.memory_allocated() == 3 * 512);
  // Each parameter is a view of its bucket, with its values.
  CHECK(a.storage() != b.storage());
  CHECK(a.sizes() == Shape{7});
  CHECK(a.At({6}) == 6.0f);
  CHECK(b.At({2}) == 2.0f);
  zero.SyncParams();
  REQUIRE(comm.calls.size() == 3);  // one broadcast per bucket, from each rank in turn
  CHECK(comm.calls[0] == std::tuple<void*, std::size_t, int>{a.raw_data(), 7, 0});
  CHECK(comm.calls[1] == std::tuple<void*, std::size_t, int>{b.raw_data(), 3, 1});
  CHECK(std::get<1>(comm.calls[2]) == 1);
  CHECK(std::get<2>(comm.calls[2]) == 2);
}

}  // namespace
}  // namespace memscope
