// Model files: a user's own model as a JSON description (format
// "memscope.model/1", documented in docs/model-files.md), built into the
// same Module tree and the same ops the zoo uses, so that a file describing a
// zoo model allocates exactly what the zoo model allocates
// (examples/models/, tests/train/model_file_test.cpp).
//
//   {"format": "memscope.model/1", "name": "tiny", "batch_size": 64,
//    "input": {"shape": ["batch", 256]}, "target": {"shape": ["batch"], "classes": 10},
//    "loss": {"type": "cross_entropy"},
//    "layers": [{"type": "linear", "name": "fc1", "out": 512}, {"type": "relu"},
//               {"type": "linear", "name": "head", "out": 10}]}
//
// Shapes are checked while building: an error names the layer (its place in
// the file, its type and its module path) and the field.
#ifndef MEMSCOPE_TRAIN_MODEL_FILE_H_
#define MEMSCOPE_TRAIN_MODEL_FILE_H_

#include <cstdint>
#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "train/models.h"

namespace memscope {

// Builds the model a description holds; `source` names it in errors (the
// file's path). options: batch_size and seq_len replace the file's defaults,
// attention picks the kernel of every attention layer,
// checkpoint_activations wraps the layers marked "checkpoint": true.
absl::StatusOr<std::unique_ptr<Model>> ModelFromJson(const nlohmann::json& spec, std::string_view source,
                                                     const ModelOptions& options);

// The largest model file read (docs/model-files.md): a description of
// layers, far beyond any real model's.
inline constexpr std::uint64_t kMaxModelFileBytes = std::uint64_t{64} << 20;

// Reads and builds a model file. Errors: the file cannot be read, is over
// kMaxModelFileBytes, is not JSON, or does not describe a model
// (ModelFromJson's errors).
absl::StatusOr<std::unique_ptr<Model>> LoadModelFile(std::string_view path, const ModelOptions& options);

}  // namespace memscope

#endif  // MEMSCOPE_TRAIN_MODEL_FILE_H_
