// See nccl_communicator.h. Untested on GPU.
#include "reducer/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>
#include <thread>
#include <utility>

namespace memscope::reducer {
namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t NcclType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return ncclFloat32;
    case DType::kFloat16: return ncclFloat16;
    case DType::kBFloat16: return ncclBfloat16;
    case DType::kInt32: return ncclInt32;
    case DType::kInt64: return ncclInt64;
    case DType::kBool:
    case DType::kUInt8: return ncclUint8;
  }
  return ncclUint8;
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::unique_ptr<Communicator> gloo, int device, std::chrono::milliseconds timeout)
      : gloo_(std::move(gloo)), device_(device), timeout_(timeout) {}

  ~NcclCommunicator() override {
    if (comm_ != nullptr) {
      if (broken_.empty()) {
        ncclCommDestroy(comm_);
      } else {
        ncclCommAbort(comm_);
      }
    }
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  int rank() const override { return gloo_->rank(); }
  int world_size() const override { return gloo_->world_size(); }
  std::string backend() const override { return "nccl"; }

  void Init() {
    const std::string me = Me();
    if (cudaError_t err = cudaSetDevice(device_); err != cudaSuccess) {
      throw CommError(me + "cudaSetDevice(" + std::to_string(device_) + ") failed: " + cudaGetErrorString(err));
    }
    ncclUniqueId id{};
    if (rank() == 0) {
      if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
        throw CommError(me + "ncclGetUniqueId failed: " + ncclGetErrorString(r));
      }
    }
    gloo_->Broadcast(&id, sizeof id, DType::kUInt8, 0);
    seq_ = 1;  // that broadcast was the Gloo communicator's collective #1
    if (cudaError_t err = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking); err != cudaSuccess) {
      throw CommError(me + "cudaStreamCreate failed: " + cudaGetErrorString(err));
    }
    if (ncclResult_t r = ncclCommInitRank(&comm_, world_size(), id, rank()); r != ncclSuccess) {
      comm_ = nullptr;
      throw CommError(me + "ncclCommInitRank failed: " + ncclGetErrorString(r));
    }
  }

  void AllreduceSum(void* data, std::size_t count, DType dtype) override {
    Begin();
    gloo_->AllreduceSum(nullptr, count, dtype);  // the descriptor (rejects dtypes it cannot sum)
    gloo_->CheckNow();                           // checked before NCCL moves anything
    if (data == nullptr || count == 0) return;
    Run("allreduce", ncclAllReduce(data, data, count, NcclType(dtype), ncclSum, comm_, stream_));
  }

  void Broadcast(void* data, std::size_t count, DType dtype, int root) override {
    Begin();
    gloo_->Broadcast(nullptr, count, dtype, root);
    gloo_->CheckNow();
    if (data == nullptr || count == 0) return;
    Run("broadcast", ncclBroadcast(data, data, count, NcclType(dtype), root, comm_, stream_));
  }

  void Allgather(const void* in, void* out, std::size_t count, DType dtype) override {
    Begin();
    gloo_->Allgather(nullptr, nullptr, count, dtype);
    gloo_->CheckNow();
    if (in == nullptr || out == nullptr || count == 0) return;
    Run("allgather", ncclAllGather(in, out, count, NcclType(dtype), comm_, stream_));
  }

  void Barrier() override {
    Begin();
    gloo_->Barrier();  // NCCL collectives are waited for, so a CPU barrier is a device barrier
  }

 private:
  std::string Me() const { return "rank " + std::to_string(rank()) + ": nccl: "; }

  // The Gloo communicator numbers the same collectives: one check each.
  void Begin() {
    if (!broken_.empty()) throw CommError(Me() + "communicator unusable after an earlier error: " + broken_);
    ++seq_;
  }

  [[noreturn]] void Fail(const std::string& message) {
    broken_ = message;
    throw CommError(message);
  }

  void Run(const char* kind, ncclResult_t launched) {
    const std::string what = std::string(kind) + " #" + std::to_string(seq_);
    if (launched != ncclSuccess) {
      Fail(Me() + what + " failed to launch: " + ncclGetErrorString(launched) + " (" + ncclGetLastError(comm_) + ")");
    }
    const Clock::time_point deadline = Clock::now() + timeout_;
    for (;;) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) Fail(Me() + what + " failed: " + cudaGetErrorString(q));
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
        Fail(Me() + what + " failed: " + ncclGetErrorString(async));
      }
      if (Clock::now() >= deadline) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
        Fail(Me() + what + " did not complete within " + std::to_string(timeout_.count()) +
             " ms although every rank entered it (NCCL communicator aborted)");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  std::unique_ptr<Communicator> gloo_;
  const int device_;
  const std::chrono::milliseconds timeout_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::uint64_t seq_ = 0;
  std::string broken_;
};

}  // namespace

std::unique_ptr<Communicator> CreateNcclCommunicator(const GlooOptions& store_options, int device) {
  auto comm = std::make_unique<NcclCommunicator>(CreateGlooCommunicator(store_options), device, store_options.timeout);
  comm->Init();
  return comm;
}

}  // namespace memscope::reducer
