// NcclCommunicator: the Communicator on GPUs through NCCL, for device
// pointers. Built only when the CUDA toolkit and libnccl are found.
//
// UNTESTED ON GPU: written and compiled on a machine without a GPU; only its
// failure path without a device is exercised by the tests.
//
// A Gloo communicator over `store_options` (CPU, TCP) does the rendezvous:
// rank 0's ncclUniqueId reaches every rank through its Broadcast. It then
// checks every collective: before NCCL moves bytes, the same collective runs
// on Gloo with a null pointer (meta), which exchanges the descriptors, so a
// mismatch or a missing, dead or late rank is a CommError naming it exactly
// as with the Gloo backend, instead of an NCCL hang. The NCCL call runs on
// the communicator's own non-blocking stream and is waited for (polling
// ncclCommGetAsyncError) up to store_options.timeout; past it the NCCL
// communicator is aborted and a CommError thrown. After a CommError the
// communicator is unusable.
#ifndef MEMSCOPE_REDUCER_NCCL_COMMUNICATOR_H_
#define MEMSCOPE_REDUCER_NCCL_COMMUNICATOR_H_

#include <memory>

#include "reducer/communicator.h"

namespace memscope::reducer {

// `device`: the CUDA device this rank uses (cudaSetDevice). Throws CommError.
std::unique_ptr<Communicator> CreateNcclCommunicator(const GlooOptions& store_options, int device);

}  // namespace memscope::reducer

#endif  // MEMSCOPE_REDUCER_NCCL_COMMUNICATOR_H_
