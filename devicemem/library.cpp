#include "devicemem/library.h"

namespace memscope {
namespace {

constexpr std::string_view kLibraryNames[kNumDeviceLibraries] = {"PYTORCH_ALLOCATOR", "NCCL", "CUBLAS", "CUDNN",
                                                                 "OTHER_LIBRARY"};

// The file name of a path ("libnccl.so.2" of "/usr/lib/libnccl.so.2").
std::string_view FileName(std::string_view path) {
  const std::size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

}  // namespace

std::string_view DeviceLibraryName(DeviceLibrary library) {
  const auto i = static_cast<std::size_t>(library);
  return i < kNumDeviceLibraries ? kLibraryNames[i] : "OTHER_LIBRARY";
}

std::optional<DeviceLibrary> ParseDeviceLibrary(std::string_view name) {
  for (int i = 0; i < kNumDeviceLibraries; ++i) {
    if (kLibraryNames[i] == name) return static_cast<DeviceLibrary>(i);
  }
  return std::nullopt;
}

DeviceLibrary ClassifyLibrary(std::string_view path) {
  const std::string_view name = FileName(path);
  if (name.starts_with("libc10_cuda") || name.starts_with("libtorch_cuda")) return DeviceLibrary::kPytorchAllocator;
  if (name.starts_with("libnccl")) return DeviceLibrary::kNccl;
  if (name.starts_with("libcublas")) return DeviceLibrary::kCublas;
  if (name.starts_with("libcudnn")) return DeviceLibrary::kCudnn;
  return DeviceLibrary::kOtherLibrary;
}

bool IsCudaOwnLibrary(std::string_view path) {
  const std::string_view name = FileName(path);
  for (std::string_view own : {"libcuda.", "libcudart.", "libcudart_static", "libcupti.", "libnvidia-", "libnvrtc"}) {
    if (name.starts_with(own)) return true;
  }
  return false;
}

Attribution AttributeFrames(const std::vector<std::string>& objects, std::string_view self) {
  for (const std::string& object : objects) {
    if (object.empty() || IsCudaOwnLibrary(object) || (!self.empty() && object == self)) continue;
    return {ClassifyLibrary(object), object};
  }
  return {};
}

}  // namespace memscope
