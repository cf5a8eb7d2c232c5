// Which library asked the CUDA driver for a block of device memory: the
// calling library of a cudaMalloc / cuMemAlloc / cuMemCreate / ..., found
// from the allocating thread's stack (devicemem/injection.cpp takes it with
// backtrace() and dladdr() at the API call) as the shared object of the
// first frame outside CUDA's own libraries (libcuda, libcudart, libcupti,
// libnvidia-*, and memscope's injection library itself).
//
//   AttributeFrames({"/usr/lib/libcupti.so.13", "/usr/lib/libcuda.so.1",
//                    "/venv/torch/lib/libc10_cuda.so", "/venv/torch/lib/libtorch_cuda.so"})
//     -> {DeviceLibrary::kPytorchAllocator, "/venv/torch/lib/libc10_cuda.so"}
//
// The category is a function of the library's path alone (ClassifyLibrary),
// so a device timeline stores only the path (the owner of each allocation)
// and every reader derives the category the same way.
#ifndef MEMSCOPE_DEVICEMEM_LIBRARY_H_
#define MEMSCOPE_DEVICEMEM_LIBRARY_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace memscope {

// What device memory outside PyTorch's tensors is for. These are not
// allocator Categories (allocator/alloc_tag.h: what a block of the caching
// allocator holds): a device allocation is a whole driver allocation,
// attributed to the library that made it.
enum class DeviceLibrary : unsigned char {
  kPytorchAllocator,  // libc10_cuda / libtorch_cuda: the caching allocator's segments (and torch's own cudaMallocs)
  kNccl,              // libnccl: communicator buffers, channels, proxies
  kCublas,            // libcublas, libcublasLt: workspaces, handles
  kCudnn,             // libcudnn*: workspaces, handles
  kOtherLibrary,      // any other library, or a stack without one outside CUDA's own
};
inline constexpr int kNumDeviceLibraries = 5;
// "PYTORCH_ALLOCATOR", "NCCL", "CUBLAS", "CUDNN", "OTHER_LIBRARY".
std::string_view DeviceLibraryName(DeviceLibrary library);
std::optional<DeviceLibrary> ParseDeviceLibrary(std::string_view name);

// The category of the shared object at `path`, by its file name:
// libc10_cuda* / libtorch_cuda* -> PYTORCH_ALLOCATOR, libnccl* -> NCCL,
// libcublas* (libcublasLt too) -> CUBLAS, libcudnn* -> CUDNN, else
// OTHER_LIBRARY (an empty path too).
DeviceLibrary ClassifyLibrary(std::string_view path);

// Whether `path` is one of CUDA's own libraries, skipped when looking for
// the caller: libcuda, libcudart, libcupti, libnvidia-*, libnvrtc*.
bool IsCudaOwnLibrary(std::string_view path);

struct Attribution {
  DeviceLibrary library = DeviceLibrary::kOtherLibrary;
  std::string path;  // the calling library's shared object; "" when no frame was outside CUDA's own
  bool operator==(const Attribution&) const = default;
};

// The caller of a device allocation from its stack's shared objects,
// innermost frame first (an empty entry: a frame dladdr could not place).
// Frames in CUDA's own libraries, in `self` (the injection library's own
// path) and unplaced ones are skipped; the first other frame's object is
// the caller. None: OTHER_LIBRARY with an empty path.
Attribution AttributeFrames(const std::vector<std::string>& objects, std::string_view self = {});

}  // namespace memscope

#endif  // MEMSCOPE_DEVICEMEM_LIBRARY_H_
