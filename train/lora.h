// LoRA fine-tuning as PEFT does it (huggingface/peft, src/peft/tuners/lora):
// a PEFT adapter_config.json read into the settings the model builder
// (train/model_file.cpp) applies: which linear layers get adapters
// (lora_A.default: Linear(in, r), lora_B.default: Linear(r, out)), their
// scaling and dropout, and the modules_to_save (a trainable copy beside the
// frozen original). Everything else of the base model is frozen. Documented
// in docs/model-files.md ("LoRA (PEFT)").
#ifndef MEMSCOPE_TRAIN_LORA_H_
#define MEMSCOPE_TRAIN_LORA_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace memscope {

struct LoraConfig {
  std::string source;  // the file, for errors
  std::int64_t r = 8;
  double lora_alpha = 8;
  double lora_dropout = 0;
  bool use_rslora = false;
  bool lora_bias = false;  // lora_B gets a bias
  // target_modules: a list of names (a module whose name is one, or ends
  // with "." + one), a regex (re.fullmatch), or "all-linear" (every linear
  // but the output layer).
  std::vector<std::string> target_list;
  std::string target_regex;
  bool target_is_regex = false;
  bool all_linear = false;
  // exclude_modules: the same forms (a list or a regex).
  std::vector<std::string> exclude_list;
  std::string exclude_regex;
  bool exclude_is_regex = false;
  // modules_to_save (with task_type SEQ_CLS or TOKEN_CLS, PEFT adds
  // "classifier" and "score").
  std::vector<std::string> modules_to_save;

  // lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora.
  double Scaling() const;
  // Whether a module (its name in the base model, without PeftModel's
  // "base_model.model." prefix) is a target: excluded modules and modules to
  // save are not; "all-linear" is decided by the builder.
  bool Targets(const std::string& key) const;
  // Whether a module is one of modules_to_save (PEFT: the name ends with one).
  bool Saves(const std::string& key) const;
};

// An adapter_config.json's settings. Errors (one line, naming `source` and
// the field): not an object, a field of the wrong type, a value memscope
// does not model (bias other than "none", use_dora, layers_to_transform, ...),
// an unknown field.
absl::StatusOr<LoraConfig> ParseLoraConfig(const nlohmann::json& config, std::string_view source);

// The largest adapter_config.json read (docs/model-files.md; real ones are
// under 1 KiB).
inline constexpr std::uint64_t kMaxLoraConfigBytes = std::uint64_t{16} << 20;

// Reads (at most kMaxLoraConfigBytes) and parses an adapter_config.json.
absl::StatusOr<LoraConfig> LoadLoraConfig(std::string_view path);

}  // namespace memscope

#endif  // MEMSCOPE_TRAIN_LORA_H_
