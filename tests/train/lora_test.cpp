// PEFT LoRA (train/lora.h, --lora): adapter_config.json parsing and its
// errors, target matching as PEFT's check_target_module_exists, parameter
// names and counts as PEFT prints them, and optimizer state for the
// adapters only.
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <string>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "tests/train/train_test_util.h"
#include "train/hf_config.h"
#include "train/lora.h"
#include "train/model_file.h"

namespace memscope {
namespace {

using json = nlohmann::json;

LoraConfig Parse(const json& j) {
  absl::StatusOr<LoraConfig> l = ParseLoraConfig(j, "a.json");
  INFO(l.status().message());
  REQUIRE(l.ok());
  return *l;
}

std::string Error(const json& j) {
  absl::StatusOr<LoraConfig> l = ParseLoraConfig(j, "a.json");
  REQUIRE(!l.ok());
  return std::string(l.status().message());
}

const json kQv = {{"r", 8}, {"lora_alpha", 16}, {"lora_dropout", 0.05}, {"target_modules", {"q_proj", "v_proj"}},
                  {"bias", "none"}, {"task_type", "CAUSAL_LM"}, {"peft_type", "LORA"}};

TEST_CASE("adapter_config.json: the fields PEFT writes") {
  LoraConfig l = Parse(kQv);
  CHECK(l.r == 8);
  CHECK(l.Scaling() == 2.0);
  CHECK(l.lora_dropout == 0.05);
  CHECK(l.target_list == std::vector<std::string>{"q_proj", "v_proj"});
  json rs = kQv;
  rs["use_rslora"] = true;
  rs["r"] = 16;
  CHECK(Parse(rs).Scaling() == 4.0);  // alpha / sqrt(r)
  // What a saved config holds besides (PEFT 0.13): accepted at these values.
  json saved = kQv;
  saved.update({{"alpha_pattern", json::object()}, {"rank_pattern", json::object()}, {"auto_mapping", nullptr},
                {"base_model_name_or_path", "meta-llama/Llama-2-7b-hf"}, {"fan_in_fan_out", false},
                {"inference_mode", true}, {"init_lora_weights", true}, {"layers_pattern", nullptr},
                {"layers_to_transform", nullptr}, {"loftq_config", json::object()}, {"modules_to_save", nullptr},
                {"revision", nullptr}, {"use_dora", false}, {"megatron_config", nullptr},
                {"megatron_core", "megatron.core"}, {"layer_replication", nullptr}});
  CHECK(Parse(saved).r == 8);
  CHECK(Parse(json{{"target_modules", "all-linear"}}).all_linear);
  CHECK(Parse(json{{"target_modules", ".*\\.(q|v)_proj"}}).target_is_regex);
  // A sequence classifier's head is saved (PeftModelForSequenceClassification).
  CHECK(Parse(json{{"target_modules", {"query"}}, {"task_type", "SEQ_CLS"}}).modules_to_save ==
        std::vector<std::string>{"classifier", "score"});
}

TEST_CASE("adapter_config.json: errors are one line naming the field") {
  auto with = [](const char* field, json value) {
    json j = kQv;
    j[field] = std::move(value);
    return Error(j);
  };
  CHECK(with("bias", "all") ==
        "adapter config a.json: field \"bias\": \"all\" is not modelled (only \"none\": the base model's biases stay "
        "frozen)");
  CHECK(with("use_dora", true) == "adapter config a.json: field \"use_dora\": true is not modelled (DoRA)");
  CHECK(with("layers_to_transform", json{0, 1}) ==
        "adapter config a.json: field \"layers_to_transform\": [0,1] is not modelled (adapters on some layers only)");
  CHECK(with("r", 0) == "adapter config a.json: field \"r\": expected a positive integer");
  CHECK(with("lora_dropout", 1.5) == "adapter config a.json: field \"lora_dropout\": expected 0 <= p < 1");
  CHECK(with("target_modules", "(") == "adapter config a.json: field \"target_modules\": \"(\" is not a regular expression");
  CHECK(with("target_modules", 3) ==
        "adapter config a.json: field \"target_modules\": expected a list of module names or a regex");
  CHECK(with("peft_type", "IA3") == "adapter config a.json: field \"peft_type\": \"IA3\" is not LORA");
  CHECK(with("lora_rank", 8) == "adapter config a.json: unknown field \"lora_rank\"");
  CHECK(Error(json{{"r", 8}}) ==
        "adapter config a.json: missing field \"target_modules\" (PEFT's defaults per model type are not modelled)");
  CHECK(Error(json::array()) == "adapter config a.json: expected a JSON object (PEFT's adapter_config.json)");
  CHECK(LoadLoraConfig("/nonexistent/adapter_config.json").status().message() ==
        "adapter config /nonexistent/adapter_config.json: cannot be read");
}

TEST_CASE("target matching as check_target_module_exists") {
  const LoraConfig l = Parse(kQv);
  CHECK(l.Targets("model.layers.0.self_attn.q_proj"));
  CHECK(l.Targets("q_proj"));                            // the whole name
  CHECK_FALSE(l.Targets("model.layers.0.self_attn.xq_proj"));  // a suffix only at a "."
  CHECK_FALSE(l.Targets("model.layers.0.self_attn.k_proj"));
  const LoraConfig re = Parse(json{{"target_modules", ".*layers\\.0\\..*(q|v)_proj"}});
  CHECK(re.Targets("model.layers.0.self_attn.v_proj"));
  CHECK_FALSE(re.Targets("model.layers.1.self_attn.v_proj"));
  CHECK_FALSE(re.Targets("model.layers.0.self_attn.v_proj.x"));  // re.fullmatch
  json ex = kQv;
  ex["exclude_modules"] = {"layers.1.self_attn.q_proj"};
  CHECK_FALSE(Parse(ex).Targets("model.layers.1.self_attn.q_proj"));
  CHECK(Parse(ex).Targets("model.layers.0.self_attn.q_proj"));
  // Modules to save and what is inside them are not targets.
  const LoraConfig saves = Parse(json{{"target_modules", "all-linear"}, {"modules_to_save", {"classifier"}}});
  CHECK_FALSE(saves.Targets("classifier.dense"));
  CHECK(saves.Saves("classifier"));
  CHECK(saves.Targets("bert.encoder.layer.0.attention.self.query"));
}

std::unique_ptr<Model> Build(const std::string& config, const json& lora) {
  ModelOptions o;
  o.lora = std::make_shared<const LoraConfig>(Parse(lora));
  absl::StatusOr<std::unique_ptr<Model>> m =
      LoadHfConfig(absl::StrCat(MEMSCOPE_SOURCE_DIR, "/examples/hf/", config, "/config.json"), o);
  INFO(m.status().message());
  REQUIRE(m.ok());
  return std::move(*m);
}

TEST_CASE("Llama-2-7b with r 8 on q_proj and v_proj: PEFT's print_trainable_parameters") {
  // trainable params: 4,194,304 || all params: 6,742,609,920:
  // 32 layers x 2 projections x (4096 x 8 + 8 x 4096).
  std::unique_ptr<Model> m = Build("Llama-2-7b-hf", kQv);
  CHECK(m->NumTrainableParameters() == 32 * 2 * (4096 * 8 + 8 * 4096));
  CHECK(m->NumTrainableParameters() == 4'194'304);
  CHECK(m->NumParameters() == 6'742'609'920);
  // PEFT's names: PeftModel's base_model.model., base_layer, lora_A.default.
  const std::vector<std::string> names = m->ParameterNames();
  CHECK(names.front() == "base_model.model.model.embed_tokens.weight");
  CHECK(std::find(names.begin(), names.end(), "base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight") !=
        names.end());
  CHECK(std::find(names.begin(), names.end(),
                  "base_model.model.model.layers.31.self_attn.v_proj.lora_B.default.weight") != names.end());
  CHECK(std::find(names.begin(), names.end(), "base_model.model.model.layers.0.self_attn.k_proj.weight") !=
        names.end());
  // The optimizer sees the adapters only.
  CHECK(m->Parameters().size() == 32 * 2 * 2);
}

TEST_CASE("all-linear leaves the output layer alone, other layers are refused") {
  // Llama: 7 linears a layer, lm_head excluded (get_output_embeddings()).
  std::unique_ptr<Model> m = Build("Llama-2-7b-hf", json{{"target_modules", "all-linear"}, {"r", 8}});
  const std::int64_t attn = 4 * (4096 * 8 + 8 * 4096), mlp = 3 * (4096 * 8 + 8 * 11008);
  CHECK(m->NumTrainableParameters() == 32 * (attn + mlp));
  ModelOptions o;
  o.lora = std::make_shared<const LoraConfig>(Parse(json{{"target_modules", "all-linear"}}));
  absl::StatusOr<std::unique_ptr<Model>> gpt2 =
      LoadHfConfig(absl::StrCat(MEMSCOPE_SOURCE_DIR, "/examples/hf/gpt2/config.json"), o);
  REQUIRE(!gpt2.ok());
  CHECK(std::string(gpt2.status().message()).find("\"transformer.h.0.attn.c_attn\": LoRA on conv1d (GPT-2's Conv1D) "
                                                  "layers is not modelled (linear layers only)") != std::string::npos);
  o.lora = std::make_shared<const LoraConfig>(Parse(json{{"target_modules", {"nothing"}}}));
  gpt2 = LoadHfConfig(absl::StrCat(MEMSCOPE_SOURCE_DIR, "/examples/hf/Llama-2-7b-hf/config.json"), o);
  REQUIRE(!gpt2.ok());
  CHECK(std::string(gpt2.status().message()).find("field \"target_modules\": no linear layer of the model matches") !=
        std::string::npos);
}

const json kMlp = {{"format", "memscope.model/1"},
                   {"batch_size", 4},
                   {"input", {{"shape", {100}}}},
                   {"target", {{"classes", 10}}},
                   {"layers",
                    {{{"type", "linear"}, {"name", "fc1"}, {"out", 200}},
                     {{"type", "relu"}},
                     {{"type", "linear"}, {"name", "head"}, {"out", 10}}}}};

Recorded Train(const json& spec, const json& lora) {
  static int n = 0;
  const std::string base = absl::StrCat("/tmp/memscope-lora-test-", ::getpid(), "-", n++);
  std::ofstream(base + ".json") << spec.dump();
  std::ofstream(base + "-adapter.json") << lora.dump();
  TrainOptions o;
  o.model = "file:" + base + ".json";
  o.steps = 1;
  REQUIRE(UseLora(base + "-adapter.json", o.model_options).ok());
  Recorded r = RunTraining(o);
  std::remove((base + ".json").c_str());
  std::remove((base + "-adapter.json").c_str());
  return r;
}

std::int64_t Cat(const PhaseRow& row, Category c) { return row.by_category[static_cast<std::size_t>(c)]; }

TEST_CASE("gradients and Adam state for the adapters only") {
  const Recorded r = Train(kMlp, json{{"r", 4}, {"target_modules", {"fc1"}}});
  REQUIRE(r.result.error.empty());
  CHECK(r.result.parameters == 100 * 200 + 200 + 200 * 10 + 10 + 4 * 100 + 200 * 4);
  // fc1.lora_A.default.weight 1,600 B -> 2,048; lora_B 3,200 B -> 3,584 (blocks of 512 B).
  const PhaseRow& step = Row(r.report, Phase::kStep, 0);
  CHECK(Cat(step, Category::kGradient) == 2'048 + 3'584);
  CHECK(Cat(step, Category::kOptimizerState) == 2 * (2'048 + 3'584));
}

TEST_CASE("modules_to_save: a trainable copy beside the frozen original") {
  const Recorded r = Train(kMlp, json{{"r", 4}, {"target_modules", {"fc1"}}, {"modules_to_save", {"head"}}});
  REQUIRE(r.result.error.empty());
  // head twice (original_module and modules_to_save.default).
  CHECK(r.result.parameters == 100 * 200 + 200 + 2 * (200 * 10 + 10) + 4 * 100 + 200 * 4);
  // The copy trains too: 8,000 B -> 8,192 and 40 B -> 512.
  const PhaseRow& step = Row(r.report, Phase::kStep, 0);
  CHECK(Cat(step, Category::kOptimizerState) == 2 * (2'048 + 3'584 + 8'192 + 512));
}

TEST_CASE("LoRA needs a model file or an HF config, not a zoo model") {
  ModelOptions o;
  o.lora = std::make_shared<const LoraConfig>(Parse(kQv));
  CHECK(CreateModel("mlp", o).status().message() ==
        "--lora applies to a model file or a Hugging Face config (file:, hf:)");
}

}  // namespace
}  // namespace memscope
