// Hugging Face configs: a model's config.json (as published on the Hub)
// turned into a model description (train/model_file.h) of the model
// transformers builds from it, for training:
//
//   model_type gpt2                    GPT2LMHeadModel (lm_head tied to wte),
//                                      GPT2ForSequenceClassification, GPT2ForTokenClassification,
//                                      GPT2ForQuestionAnswering
//   llama, mistral, qwen2              *ForCausalLM: RMSNorm, rotary embeddings, SwiGLU MLP,
//                                      grouped-query attention, tied or untied lm_head;
//                                      *ForSequenceClassification (the last non-padding token's
//                                      logits), *ForTokenClassification, *ForQuestionAnswering
//   bert                               BertForPreTraining (masked LM + next sentence heads),
//                                      BertForMaskedLM, BertForSequenceClassification,
//                                      BertForTokenClassification
//   roberta                            RobertaForMaskedLM, RobertaForSequenceClassification,
//                                      RobertaForTokenClassification
//
// The head is the config's "architectures" (its first class; without one,
// the family's first above); another class is an error naming these.
// Parameter names and counts are transformers' own (tests/train/hf_config_test.cpp
// checks the published counts). Nothing is downloaded: the config is a local file.
#ifndef MEMSCOPE_TRAIN_HF_CONFIG_H_
#define MEMSCOPE_TRAIN_HF_CONFIG_H_

#include <cstdint>
#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "train/models.h"

namespace memscope {

// The model description (format memscope.model/1) of a config.json's model.
// Defaults: batch 1, sequence min(1024, max positions). Errors name the
// config and the field (an unknown model_type, a missing size).
absl::StatusOr<nlohmann::json> HfConfigToModelSpec(const nlohmann::json& config, std::string_view source);

// The largest config.json read (docs/model-files.md; real ones are a few KiB).
inline constexpr std::uint64_t kMaxHfConfigBytes = std::uint64_t{16} << 20;

// Reads a config.json (at most kMaxHfConfigBytes) and builds its model
// (ModelFromJson with `options`).
absl::StatusOr<std::unique_ptr<Model>> LoadHfConfig(std::string_view path, const ModelOptions& options);

}  // namespace memscope

#endif  // MEMSCOPE_TRAIN_HF_CONFIG_H_
