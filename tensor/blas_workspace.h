// cuBLAS and cuBLASLt workspaces: PyTorch hands cuBLAS a workspace that it
// allocates through the caching allocator, one per (handle, stream), at the
// first cuBLAS call on that stream, and keeps it for the life of the process
// (the handle pool is never torn down). It counts in memory_allocated():
// after one nn.Linear forward on a fresh process, memory_allocated() is the
// output plus 8519680 B (pytorch/pytorch issue #95668, PyTorch 2.0).
//
// The facts, from aten/src/ATen/cuda/CublasHandlePool.cpp (main at commit
// 26a39059, the 2.9 line: the file with the float32Precision API) and
// aten/src/ATen/native/cuda/Blas.cpp:
//
// - cuBLAS workspace (getChosenWorkspaceSize): CUBLAS_WORKSPACE_CONFIG,
//   ":SIZE:COUNT" pairs (SIZE in KiB), total = sum of SIZE * 1024 * COUNT; a
//   value with no such pair warns and uses the default. Default
//   ":4096:2:16:8" = 4096 KiB * 2 + 16 KiB * 8 = 8519680 B (8.125 MiB), since
//   PyTorch 2.0 (pytorch/pytorch#91564); 32 MiB (4096 KiB * 8) on Hopper
//   (compute capability 9.0 exactly). getCurrentCUDABlasHandle() allocates it
//   (setWorkspaceForHandle) the first time a (handle, stream) is used.
// - cuBLASLt workspace (getCUDABlasLtWorkspaceSize): CUBLASLT_WORKSPACE_SIZE
//   in KiB (std::stoi; a value that is not a number warns and uses the
//   default), default 1024 KiB = 1 MiB; limited to the cuBLAS workspace size
//   (unless TORCH_CUBLASLT_UNIFIED_WORKSPACE=0). getCUDABlasLtWorkspace()
//   allocates it per (Lt handle, stream) at the first cuBLASLt call, after
//   the cuBLAS one (on CUDA the Lt handle is the cuBLAS handle, whose getter
//   sets the cuBLAS workspace first). With TORCH_CUBLASLT_UNIFIED_WORKSPACE=1
//   cuBLASLt uses the cuBLAS workspace and allocates none of its own.
// - Which calls are cuBLASLt: addmm with a 1-d bias (nn.Linear with bias, the
//   gemm_and_bias epilogue) when the bias is contiguous, the dtype is a float
//   type and both of mat2's dimensions are > 1 (Blas.cpp useLtInterface, CUDA
//   >= 12.1). mm, bmm and the backward matmuls are cuBLAS.
// - Each workspace is requested after the op's output (the structured
//   kernel allocates `out` before calling cuBLAS).
//
// Older PyTorch differs: pytorch/pytorch#83461 (August 2022) began handing
// cuBLAS a workspace from the allocator, but users saw it in
// memory_allocated() from 2.0 on, not in 1.13 (#95668); before that cuBLAS
// allocated its workspace itself (cudaMalloc, outside the allocator). In 2.6
// and earlier cuBLASLt calls took a temporary workspace per call (#139442).
// memscope models the 2.9 behaviour above. Untested on GPU.
#ifndef MEMSCOPE_TENSOR_BLAS_WORKSPACE_H_
#define MEMSCOPE_TENSOR_BLAS_WORKSPACE_H_

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace memscope {

inline constexpr std::size_t kDefaultCublasWorkspace = 4096 * 1024 * 2 + 16 * 1024 * 8;  // 8519680 B
inline constexpr std::size_t kHopperCublasWorkspace = 4096 * 1024 * 8;                   // 32 MiB
inline constexpr std::size_t kDefaultCublasLtWorkspace = 1024 * 1024;                    // 1 MiB

// Bytes each workspace takes; 0: none is allocated.
struct BlasWorkspaceSizes {
  std::size_t cublas = 0;
  std::size_t cublaslt = 0;
  bool operator==(const BlasWorkspaceSizes&) const = default;
};

// The environment variables PyTorch reads (nullopt: unset).
struct BlasWorkspaceEnv {
  std::optional<std::string> cublas_workspace_config;  // CUBLAS_WORKSPACE_CONFIG
  std::optional<std::string> cublaslt_workspace_size;  // CUBLASLT_WORKSPACE_SIZE
  std::optional<std::string> cublaslt_unified;         // TORCH_CUBLASLT_UNIFIED_WORKSPACE
  static BlasWorkspaceEnv FromEnvironment();
};

// The sizes PyTorch would use on a GPU (`hopper`: compute capability 9.0)
// with these variables. PyTorch's warnings for values it ignores go to
// `warnings` (may be null).
BlasWorkspaceSizes ChooseBlasWorkspaceSizes(const BlasWorkspaceEnv& env, bool hopper,
                                            std::vector<std::string>* warnings);

}  // namespace memscope

#endif  // MEMSCOPE_TENSOR_BLAS_WORKSPACE_H_
