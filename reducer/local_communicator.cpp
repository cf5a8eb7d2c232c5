#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "reducer/communicator.h"

namespace memscope::reducer {
namespace {

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string backend() const override { return "local"; }
  void AllreduceSum(void*, std::size_t, DType) override {}
  void Broadcast(void*, std::size_t, DType, int) override {}
  void Allgather(const void* in, void* out, std::size_t count, DType dtype) override {
    if (in != nullptr && out != nullptr && in != out) std::memcpy(out, in, count * ElementSize(dtype));
  }
  void Barrier() override {}
};

class SimulatedCommunicator final : public Communicator {
 public:
  SimulatedCommunicator(int rank, int world_size) : rank_(rank), world_size_(world_size) {}
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string backend() const override { return "simulated"; }
  // Host-side integers (DDP's shape check, its bucket order, its unused
  // parameter flags) are exchanged as if every rank held this rank's values:
  // the ranks of a data-parallel job run the same program. Tensor data
  // (float) has no peers to come from: meta execution only.
  void AllreduceSum(void* data, std::size_t count, DType dtype) override {
    if (data == nullptr) return;
    if (dtype == DType::kInt64) {
      for (std::size_t i = 0; i < count; ++i) static_cast<std::int64_t*>(data)[i] *= world_size_;
    } else if (dtype == DType::kInt32) {
      for (std::size_t i = 0; i < count; ++i) static_cast<std::int32_t*>(data)[i] *= world_size_;
    } else {
      NoTensorData();
    }
  }
  void Broadcast(void* data, std::size_t, DType dtype, int) override {
    if (data != nullptr && dtype != DType::kInt64 && dtype != DType::kInt32) NoTensorData();
  }
  void Allgather(const void* in, void* out, std::size_t count, DType dtype) override {
    if (in == nullptr || out == nullptr) return;
    if (dtype != DType::kInt64 && dtype != DType::kInt32) NoTensorData();
    const std::size_t bytes = count * ElementSize(dtype);
    for (int r = 0; r < world_size_; ++r)
      std::memmove(static_cast<char*>(out) + static_cast<std::size_t>(r) * bytes, in, bytes);
  }
  void Barrier() override {}

 private:
  [[noreturn]] void NoTensorData() const {
    throw CommError(absl::StrCat("simulated rank ", rank_, " of ", world_size_,
                                 ": a collective of tensor data needs its peers (meta execution only)"));
  }
  int rank_, world_size_;
};

}  // namespace

std::unique_ptr<Communicator> CreateLocalCommunicator() { return std::make_unique<LocalCommunicator>(); }

std::unique_ptr<Communicator> CreateSimulatedCommunicator(int rank, int world_size) {
  return std::make_unique<SimulatedCommunicator>(rank, world_size);
}

}  // namespace memscope::reducer
