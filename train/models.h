// The model zoo of the reference training loop. Each model mirrors the
// Python code people run (torchvision, Hugging Face, the PyTorch tutorials,
// the seeds' own code) op for op, including which tensors Python variables
// keep alive, because that is what decides memory.
#ifndef MEMSCOPE_TRAIN_MODELS_H_
#define MEMSCOPE_TRAIN_MODELS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "train/lora.h"
#include "train/module.h"

namespace memscope {

// --attention: math (HF "eager": the attention's ops one by one), flash
// (SDPA's flash kernel, or the flash_attention_2 package: the same
// tensors), sdpa (scaled_dot_product_attention: the backend PyTorch picks,
// see AttentionRunner).
enum class AttentionKind { kMath, kFlash, kSdpa };
// "math" or "eager", "flash" or "flash_attention_2", "sdpa"; else an error
// naming them.
absl::StatusOr<AttentionKind> ParseAttention(std::string_view name);

struct ModelOptions {
  std::int64_t batch_size = 0;                     // 0: the model's default
  std::int64_t seq_len = 0;                        // 0: the model's default (text models)
  std::int64_t width = 0;                          // mlp
  std::int64_t depth = 0;                          // mlp
  AttentionKind attention = AttentionKind::kMath;  // gpt2*, HF configs, model files
  // The GPU's compute capability x 10 (--gpu's kind; 0: not given, taken as
  // sm80, the default 80 GiB device): what SDPA's backend choice needs.
  int compute_capability = 0;
  bool checkpoint_activations = false;
  // PEFT LoRA (--lora adapter_config.json): adapters on the targeted linear
  // layers of a model file or HF config, the rest frozen; null: none.
  std::shared_ptr<const LoraConfig> lora = nullptr;
  // --dtype: the parameters' dtype, as model.to(dtype) or
  // from_pretrained(torch_dtype=dtype) loads them (float buffers keep
  // theirs), for model files (over their param_dtype), HF configs and the
  // gpt2 zoo models; nullopt: the model's own (float32).
  std::optional<DType> param_dtype = std::nullopt;
};

// One training batch: inputs and targets, on the device (INPUT).
struct Batch {
  Tensor input;
  Tensor target;
};

class Model : public Module {
 public:
  using Module::Module;
  virtual std::string_view name() const = 0;
  // A new batch for `step` (fixed synthetic data in --exec cpu). With a data
  // shard set (DistributedSampler), the global batch of batch_size x
  // world_size samples is generated and this rank takes rows
  // [rank * batch_size, (rank + 1) * batch_size): world size N at batch B sees
  // exactly the samples one process sees at batch N x B.
  virtual Batch MakeBatch(DeviceContext& ctx, std::int64_t step) = 0;
  void set_data_shard(int rank, int world_size) {
    shard_rank_ = rank;
    shard_world_ = world_size;
  }
  virtual Tensor Forward(const Batch& batch) = 0;
  virtual Tensor Loss(const Tensor& output, const Batch& batch) = 0;
  // The outputs Forward keeps for Loss besides its result (a model's other
  // heads), and dropping them, as Python drops a forward's outputs.
  virtual TensorList OtherOutputs() const { return {}; }
  virtual void ReleaseOutputs() {}
  std::int64_t batch_size() const { return batch_size_; }

 protected:
  std::int64_t batch_size_ = 1;
  int shard_rank_ = 0;
  int shard_world_ = 1;
};

struct ModelInfo {
  std::string name;
  std::string description;  // what it is and its default input
  bool cpu = false;         // has CPU kernels for every op (--exec cpu)
  bool checkpointing = false;
};
std::vector<ModelInfo> ListModels();

// Builds a model (no device memory yet: call Materialize). Errors name the
// unknown model or the invalid option.
absl::StatusOr<std::unique_ptr<Model>> CreateModel(std::string_view name, const ModelOptions& options);

// --dtype NAME: float32, float16 or bfloat16 into options.param_dtype ("":
// the model's own). Errors name the option and the choices.
absl::Status UseDType(std::string_view name, ModelOptions& options);

// --lora FILE: reads PEFT's adapter_config.json into options.lora ("" leaves
// it null). Errors: the file's (train/lora.h), prefixed "--lora: ".
absl::Status UseLora(std::string_view adapter_config, ModelOptions& options);

}  // namespace memscope

#endif  // MEMSCOPE_TRAIN_MODELS_H_
