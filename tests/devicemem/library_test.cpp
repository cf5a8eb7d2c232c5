#include "devicemem/library.h"

#include <catch2/catch.hpp>

namespace memscope {
namespace {

constexpr const char* kSelf = "/opt/memscope/lib/libmemscope-cupti.so";

TEST_CASE("the caching allocator's cudaMalloc is PyTorch's: the first frame past CUPTI, the driver and the runtime") {
  const Attribution a = AttributeFrames({kSelf, "/usr/local/cuda/lib64/libcupti.so.13", "/usr/lib/libcuda.so.1",
                                         "/venv/nvidia/cuda_runtime/lib/libcudart.so.12",
                                         "/venv/torch/lib/libc10_cuda.so", "/venv/torch/lib/libtorch_cuda.so",
                                         "/usr/bin/python3.11"},
                                        kSelf);
  CHECK(a == Attribution{DeviceLibrary::kPytorchAllocator, "/venv/torch/lib/libc10_cuda.so"});
}

TEST_CASE("NCCL, cuBLAS, cuBLASLt and cuDNN are named by their shared objects") {
  CHECK(AttributeFrames({"/usr/lib/libcuda.so.1", "/venv/nvidia/nccl/lib/libnccl.so.2",
                         "/venv/torch/lib/libtorch_cuda.so"}) ==
        Attribution{DeviceLibrary::kNccl, "/venv/nvidia/nccl/lib/libnccl.so.2"});
  CHECK(AttributeFrames({"/usr/lib/libcuda.so.1", "/venv/nvidia/cublas/lib/libcublasLt.so.12",
                         "/venv/nvidia/cublas/lib/libcublas.so.12"}) ==
        Attribution{DeviceLibrary::kCublas, "/venv/nvidia/cublas/lib/libcublasLt.so.12"});
  CHECK(AttributeFrames({"/usr/lib/libcuda.so.1", "/venv/nvidia/cublas/lib/libcublas.so.12"}).library ==
        DeviceLibrary::kCublas);
  CHECK(AttributeFrames({"/usr/lib/libcuda.so.1", "/venv/nvidia/cudnn/lib/libcudnn_engines_precompiled.so.9"})
            .library == DeviceLibrary::kCudnn);
}

TEST_CASE("a frame dladdr could not place is skipped, and any other library is OTHER_LIBRARY") {
  CHECK(AttributeFrames({"/usr/lib/libcuda.so.1", "", "/venv/cupy/_core/core.cpython-311-x86_64-linux-gnu.so"}) ==
        Attribution{DeviceLibrary::kOtherLibrary, "/venv/cupy/_core/core.cpython-311-x86_64-linux-gnu.so"});
}

TEST_CASE("a stack with nothing outside CUDA's own libraries is OTHER_LIBRARY without a path") {
  CHECK(AttributeFrames({kSelf, "/usr/lib/libcupti.so.13", "/usr/lib/libcuda.so.1", "/usr/lib/libnvidia-ptxjitcompiler.so.1"},
                        kSelf) == Attribution{DeviceLibrary::kOtherLibrary, ""});
  CHECK(AttributeFrames({}) == Attribution{});
}

TEST_CASE("the category follows the file name, not the directory") {
  CHECK(ClassifyLibrary("/home/libnccl/libfoo.so") == DeviceLibrary::kOtherLibrary);
  CHECK(ClassifyLibrary("libtorch_cuda.so") == DeviceLibrary::kPytorchAllocator);
  CHECK(ClassifyLibrary("") == DeviceLibrary::kOtherLibrary);
  CHECK(IsCudaOwnLibrary("/usr/local/cuda/lib64/libcudart.so.13"));
  CHECK_FALSE(IsCudaOwnLibrary("/usr/local/cuda/lib64/libcublas.so.13"));
}

TEST_CASE("library names read back") {
  for (int i = 0; i < kNumDeviceLibraries; ++i) {
    const auto library = static_cast<DeviceLibrary>(i);
    CHECK(ParseDeviceLibrary(DeviceLibraryName(library)) == library);
  }
  CHECK(DeviceLibraryName(DeviceLibrary::kOtherLibrary) == "OTHER_LIBRARY");
  CHECK_FALSE(ParseDeviceLibrary("OTHER").has_value());
}

}  // namespace
}  // namespace memscope
