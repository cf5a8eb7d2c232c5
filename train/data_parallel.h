// torch.nn.DataParallel: one process, N simulated GPUs, the module on the
// first (device_ids[0], also the output_device). Each step, as
// torch/nn/parallel/data_parallel.py does in DataParallel.forward:
//
//   inputs = scatter(batch, device_ids)        # chunk along dim 0; chunk 0 is a view, the others copies
//   replicas = replicate(module, device_ids)   # Broadcast.apply: device 0's replica is the module itself
//                                              # (views), the others' parameters new 10 MiB coalesced buffers
//   outputs = parallel_apply(replicas, inputs) # each replica's forward on its own device
//   output = gather(outputs, output_device)    # one new tensor on device 0
//   loss = criterion(output, target)           # on device 0
//   loss.backward()                            # Gather's backward scatters the gradient back; each replica's
//                                              # gradients are held until Broadcast's backward
//                                              # (ReduceAddCoalesced) sums them onto device 0 as .grad
//   optimizer.step()                           # the module's parameters and state: device 0 only
//
// So device 0 holds the gathered output, the loss, the reduced gradients and
// the optimizer state, and runs out of memory first. Memory follows
// torch/nn/parallel/{replicate,comm,_functions}.py and
// torch/csrc/cuda/comm.cpp (NCCL available: broadcast and reduce allocate
// one result per device, no staging copies).
#ifndef MEMSCOPE_TRAIN_DATA_PARALLEL_H_
#define MEMSCOPE_TRAIN_DATA_PARALLEL_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "recording/recorder.h"
#include "tensor/tensor.h"
#include "train/trainer.h"

namespace memscope {

// The coalescing buffer of comm.broadcast_coalesced and reduce_add_coalesced
// (buffer_size=10485760).
inline constexpr std::size_t kDataParallelBufferSize = 10485760;

struct DataParallelResult {
  TrainResult train;
  int oom_device = -1;                    // the device whose allocation failed (train.oom)
  std::vector<std::int64_t> chunk_sizes;  // torch.chunk of the batch: one per device used
};

// torch.chunk(n, chunks) sizes: ceil(n / chunks) each, the last smaller;
// fewer than `chunks` when n is small (DataParallel then uses fewer devices).
std::vector<std::int64_t> ChunkSizes(std::int64_t n, int chunks);

// The errors TrainDataParallel would return for these options, before
// anything is allocated or recorded.
absl::Status CheckDataParallelOptions(const TrainOptions& options, int devices, bool cpu);

// Trains `options` (the model, optimizer, amp, steps; --batch-size is the
// global batch DataParallel scatters) under DataParallel over `devices`
// (device 0 holds the module), marking phases on every recorder (one per
// device; entries may be null). Errors: fewer than 2 devices, DDP or
// gradient accumulation asked for, a cuDNN RNN model, an input that is not
// batch-first. An OOM ends the run and is in the result.
absl::StatusOr<DataParallelResult> TrainDataParallel(const TrainOptions& options,
                                                     const std::vector<DeviceContext*>& devices,
                                                     const std::vector<Recorder*>& recorders);

}  // namespace memscope

#endif  // MEMSCOPE_TRAIN_DATA_PARALLEL_H_
