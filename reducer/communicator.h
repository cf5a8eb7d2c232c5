// The collectives DDP needs, behind one interface: Gloo over TCP for CPU ranks
// (GlooCommunicator), NCCL on GPUs (NcclCommunicator, built with CUDA), and a
// single-rank LocalCommunicator.
//
// Every collective is checked: the ranks compare small descriptors (sequence
// number, collective, dtype, count, root) and a mismatch throws CommError
// naming the ranks and what each called, as PyTorch does with
// TORCH_DISTRIBUTED_DEBUG=DETAIL (a rank that skips a barrier). A collective
// that moves data is checked before its data moves; ones that move none are
// checked in batches (at the next barrier, data-moving collective or
// CheckNow(), or after 256 of them). A rank that does not arrive within the
// timeout, or whose connection drops, is a CommError naming it: never a
// silent hang.
//
// `data == nullptr` (meta execution: shapes, no bytes) moves nothing: the
// call is only checked, so mismatches are still found without moving bytes.
#ifndef MEMSCOPE_REDUCER_COMMUNICATOR_H_
#define MEMSCOPE_REDUCER_COMMUNICATOR_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>

#include "tensor/tensor.h"

namespace memscope::reducer {

// A failed collective: timeout, lost peer, mismatch. what() is one line.
class CommError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string backend() const = 0;  // "gloo", "nccl", "local"

  // In-place SUM over all ranks of `count` elements of `dtype` (float32,
  // float16, bfloat16, int32, int64).
  virtual void AllreduceSum(void* data, std::size_t count, DType dtype) = 0;
  // `count` elements from `root` to every rank, in place.
  virtual void Broadcast(void* data, std::size_t count, DType dtype, int root) = 0;
  // Each rank's `count` elements of `in` into out[rank * count ...].
  virtual void Allgather(const void* in, void* out, std::size_t count, DType dtype) = 0;
  virtual void Barrier() = 0;
  // Checks every collective called so far against the other ranks, now (a
  // mismatch or a lost peer throws). For a caller about to move data by other
  // means (NCCL); a no-op where every collective is checked as it is called.
  virtual void CheckNow() {}
};

// World size 1: every collective is a no-op (allgather copies in to out).
std::unique_ptr<Communicator> CreateLocalCommunicator();

// Rank `rank` of a `world_size`-rank job, alone in this process, for meta
// execution (shapes, no bytes): every collective is a no-op, so what a rank
// allocates for it is modelled and nothing is exchanged; a collective with
// data throws CommError (there is no peer to move it to). For planning one
// rank of a large job without its peers (memscope plan --zero).
std::unique_ptr<Communicator> CreateSimulatedCommunicator(int rank, int world_size);

struct GlooOptions {
  int rank = 0;
  int world_size = 1;
  std::string store_dir;               // FileStore rendezvous directory (created if missing)
  std::string hostname = "127.0.0.1";  // interface the TCP transport binds to
  std::chrono::milliseconds timeout{60000};
  // Checks exchange their summaries through the ranks' mapped progress
  // files. False (for tests): this rank offers no mapping, so every rank
  // exchanges them through gloo, as when a file cannot be mapped.
  bool shared_checks = true;
  // Added to the nice value of gloo's event-loop thread (0: as the caller's).
  // The loop polls epoll without sleeping while a pair connects or data
  // waits for its receive; a meta run, whose payloads go through the
  // mailboxes, gives it 10 so that this poll does not take the CPU from the
  // ranks it waits for. A run that moves data through gloo keeps 0 (a loop
  // thread at a lower priority would wait behind the other ranks' work).
  int loop_nice = 0;
  // Non-zero ends the wait for the other ranks to join (a CommError naming
  // the signal): the number of the signal that asked this process to stop
  // (memscope run's Ctrl-C or SIGTERM).
  const std::atomic<int>* interrupt = nullptr;
};

// Rendezvous through the FileStore, full mesh over TCP. Throws CommError.
std::unique_ptr<Communicator> CreateGlooCommunicator(const GlooOptions& options);

}  // namespace memscope::reducer

#endif  // MEMSCOPE_REDUCER_COMMUNICATOR_H_
