// Hugging Face configs (train/hf_config.h): the published parameter counts of
// the configs in examples/hf/, and a training step of each family.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/train/train_test_util.h"
#include "train/hf_config.h"
#include "train/model_file.h"

namespace memscope {
namespace {

std::string Config(const std::string& name) {
  return absl::StrCat(MEMSCOPE_SOURCE_DIR, "/examples/hf/", name, "/config.json");
}

std::int64_t Count(const std::string& name) {
  absl::StatusOr<std::unique_ptr<Model>> m = LoadHfConfig(Config(name), {});
  INFO(name << ": " << m.status().message());
  REQUIRE(m.ok());
  return (*m)->NumParameters();
}

TEST_CASE("Hugging Face configs have the published parameter counts") {
  // model.num_parameters() of each model in transformers.
  CHECK(Count("gpt2") == 124'439'808);               // GPT2LMHeadModel, lm_head tied
  CHECK(Count("bert-base-uncased") == 109'514'298);  // BertForMaskedLM, as its config names
  CHECK(Count("roberta-base") == 124'697'433);       // RobertaForMaskedLM
  CHECK(Count("Llama-2-7b-hf") == 6'738'415'616);
  CHECK(Count("Meta-Llama-3-8B") == 8'030'261'248);  // grouped-query attention, 8 KV heads
  CHECK(Count("Mistral-7B-v0.1") == 7'241'732'096);
  CHECK(Count("Qwen2-0.5B") == 494'032'768);  // q/k/v biases, tied embeddings
}

TEST_CASE("the GPT-2 config builds the zoo's gpt2: the same events") {
  TrainOptions o;
  o.steps = 2;
  o.model_options.batch_size = 1;
  o.model_options.seq_len = 32;
  o.model = "gpt2";
  const Recorded zoo = RunTraining(o);
  o.model = "hf:" + Config("gpt2");
  const Recorded hf = RunTraining(o);
  REQUIRE(zoo.timeline.events.size() == hf.timeline.events.size());
  std::size_t same = 0;
  for (std::size_t i = 0; i < zoo.timeline.events.size(); ++i) {
    const Event& a = zoo.timeline.events[i];
    const Event& b = hf.timeline.events[i];
    same +=
        a.type == b.type && a.size == b.size && a.addr == b.addr && zoo.timeline.str(a.name) == hf.timeline.str(b.name);
  }
  CHECK(same == zoo.timeline.events.size());
}

TEST_CASE("a training step of each family runs, with parameters + gradients + Adam state at the end") {
  for (const char* name : {"Qwen2-0.5B", "bert-base-uncased", "roberta-base"}) {
    INFO(name);
    TrainOptions o;
    o.model = absl::StrCat("hf:", Config(name));
    o.steps = 2;
    o.model_options.batch_size = 2;
    o.model_options.seq_len = 16;
    const Recorded r = RunTraining(o);
    REQUIRE(r.result.error.empty());
    CHECK(r.result.steps_done == 2);
    // After the step: parameters, gradients and Adam's two states are alive (4 x float32 parameters) plus
    // small blocks and the last output; the blocks round each tensor up to 512 B.
    const std::int64_t params = r.result.parameters * 4;
    const std::int64_t end = Row(r.report, Phase::kStep, 1).allocated;
    CHECK(end >= 4 * params);
    CHECK(end < 4 * params + 64 * static_cast<std::int64_t>(kTestMiB));
  }
}

nlohmann::json ConfigJson(const std::string& name) {
  std::ifstream in(Config(name));
  return nlohmann::json::parse(in);
}

// The parameter count of a config's model, and whether it has `parameter`.
std::int64_t CountAs(nlohmann::json config, const std::string& parameter = "") {
  absl::StatusOr<nlohmann::json> spec = HfConfigToModelSpec(config, "c.json");
  INFO(spec.status().message());
  REQUIRE(spec.ok());
  absl::StatusOr<std::unique_ptr<Model>> m = ModelFromJson(*spec, "c.json", {});
  REQUIRE(m.ok());
  if (!parameter.empty()) {
    const std::vector<std::string> names = (*m)->ParameterNames();
    CHECK(std::find(names.begin(), names.end(), parameter) != names.end());
  }
  return (*m)->NumParameters();
}

TEST_CASE("the config's architectures picks the head: transformers' parameter counts of each") {
  nlohmann::json bert = ConfigJson("bert-base-uncased");  // names BertForMaskedLM
  bert.erase("architectures");
  CHECK(CountAs(bert) == 110'106'428);  // no architectures: BertForPreTraining, as before
  bert["architectures"] = {"BertForPreTraining"};
  CHECK(CountAs(bert, "cls.seq_relationship.weight") == 110'106'428);
  bert["architectures"] = {"BertForMaskedLM"};  // no pooler, no next-sentence head
  CHECK(CountAs(bert, "cls.predictions.transform.dense.weight") == 109'514'298);
  bert["architectures"] = {"BertForSequenceClassification"};  // pooler + dropout + classifier (2 labels)
  CHECK(CountAs(bert, "classifier.weight") == 109'483'778);
  bert["num_labels"] = 5;
  CHECK(CountAs(bert) == 109'483'778 + 3 * 768 + 3);
  bert["architectures"] = {"BertForTokenClassification"};  // no pooler
  CHECK(CountAs(bert) == 109'483'778 + 3 * 768 + 3 - (768 * 768 + 768));
  bert.erase("num_labels");
  bert["architectures"] = {"BertForQuestionAnswering"};  // no pooler; qa_outputs: 768 -> 2
  CHECK(CountAs(bert, "qa_outputs.weight") == 109'483'778 - (768 * 768 + 768));
  nlohmann::json roberta = ConfigJson("roberta-base");
  roberta["architectures"] = {"RobertaForSequenceClassification"};  // RobertaClassificationHead
  CHECK(CountAs(roberta, "classifier.out_proj.weight") == 124'647'170);
  roberta["architectures"] = {"RobertaForQuestionAnswering"};  // RobertaModel without its pooler + qa_outputs (1,538)
  CHECK(CountAs(roberta, "qa_outputs.bias") == 124'647'170 - (768 * 768 + 768) - (768 * 2 + 2) + 1'538);
}

TEST_CASE("an architecture memscope does not build, or a loss it does not model, is refused") {
  nlohmann::json bert = ConfigJson("bert-base-uncased");
  auto error = [](const nlohmann::json& config) {
    absl::StatusOr<nlohmann::json> s = HfConfigToModelSpec(config, "c.json");
    REQUIRE_FALSE(s.ok());
    return std::string(s.status().message());
  };
  bert["architectures"] = {"BertForNextSentencePrediction"};
  CHECK(error(bert) ==
        "Hugging Face config c.json: field \"architectures\": \"BertForNextSentencePrediction\" is not modelled for "
        "model_type \"bert\" (BertForPreTraining, BertForMaskedLM, BertForSequenceClassification, "
        "BertForTokenClassification, BertForQuestionAnswering)");
  bert["architectures"] = {"BertForQuestionAnswering"};
  bert["num_labels"] = 3;
  CHECK(error(bert) == "Hugging Face config c.json: field \"num_labels\": 3 for question answering (2: start and end)");
  bert.erase("num_labels");
  bert["architectures"] = {"BertForSequenceClassification"};
  bert["problem_type"] = "multi_label_classification";
  CHECK(error(bert) ==
        "Hugging Face config c.json: field \"problem_type\": multi_label_classification (BCEWithLogitsLoss) is not "
        "modelled");
  bert["problem_type"] = "regression";
  bert["num_labels"] = 1;
  CHECK(HfConfigToModelSpec(bert, "c.json")->at("layers")[1]["heads"][0]["loss"]["type"] == "mse");
  nlohmann::json gpt2 = ConfigJson("gpt2");
  gpt2["architectures"] = {"GPT2ForQuestionAnswering"};
  CHECK(error(gpt2) ==
        "Hugging Face config c.json: field \"architectures\": \"GPT2ForQuestionAnswering\" is not modelled for "
        "model_type \"gpt2\" (GPT2LMHeadModel)");
}

// A Qwen2-0.5B step under --attention `kind` (bf16 autocast when `amp`) on a
// GPU of compute capability `sm`: the run's error, or what is allocated after forward.
std::pair<std::string, std::int64_t> AttentionRun(AttentionKind kind, bool amp, int sm) {
  TrainOptions o;
  o.model = absl::StrCat("hf:", Config("Qwen2-0.5B"));
  o.steps = 1;
  o.model_options.batch_size = 2;
  o.model_options.seq_len = 64;
  o.model_options.attention = kind;
  o.model_options.compute_capability = sm;
  if (amp) o.amp = DType::kBFloat16;
  const Recorded r = RunTraining(o);
  return {r.result.error, r.result.error.empty() ? Row(r.report, Phase::kForward, 0).allocated : 0};
}

TEST_CASE("attention sdpa runs the flash kernel where PyTorch picks it, and refuses the memory-efficient one") {
  CHECK(ParseAttention("eager").value() == AttentionKind::kMath);
  CHECK(ParseAttention("flash_attention_2").value() == AttentionKind::kFlash);
  CHECK(ParseAttention("sdpa").value() == AttentionKind::kSdpa);
  CHECK(ParseAttention("xformers").status().message() ==
        "--attention 'xformers': use eager (or math), sdpa, or flash_attention_2 (or flash)");
  const auto flash = AttentionRun(AttentionKind::kFlash, true, 90);
  REQUIRE(flash.first.empty());
  CHECK(AttentionRun(AttentionKind::kSdpa, true, 90) == flash);  // bf16 on sm90: flash
  CHECK(AttentionRun(AttentionKind::kSdpa, true, 0) == flash);   // no --gpu: the default device, sm80
  CHECK(AttentionRun(AttentionKind::kMath, true, 90).second > flash.second);
  CHECK(AttentionRun(AttentionKind::kSdpa, false, 90).first ==
        "--attention sdpa: PyTorch would run the memory-efficient kernel for float32 inputs (flash needs float16 "
        "or bfloat16: --amp or a half-precision model), which memscope does not model; use --attention eager or "
        "flash_attention_2");
  CHECK(AttentionRun(AttentionKind::kSdpa, true, 75).first ==
        "--attention sdpa: PyTorch would run the memory-efficient kernel for sm75 (flash needs sm80 or later), which "
        "memscope does not model; use --attention eager or flash_attention_2");
}

TEST_CASE("dtype loads the parameters in that dtype: a config equals its description with param_dtype") {
  ModelOptions bf16;
  REQUIRE(UseDType("bfloat16", bf16).ok());
  CHECK(bf16.param_dtype == DType::kBFloat16);
  CHECK(UseDType("fp8", bf16).message() == "--dtype 'fp8': use float32, float16 or bfloat16");
  bf16.param_dtype = DType::kBFloat16;
  CHECK(CreateModel("resnet50", bf16).status().message() ==
        "--dtype applies to model files, Hugging Face configs and gpt2*, not resnet50");
  // Qwen2-0.5B under --dtype bfloat16 records what its description with "param_dtype": "bfloat16" records.
  nlohmann::json spec = *HfConfigToModelSpec(ConfigJson("Qwen2-0.5B"), "c.json");
  spec["param_dtype"] = "bfloat16";
  const std::string file =
      (std::filesystem::temp_directory_path() / absl::StrCat("memscope-qwen2-bf16-", getpid(), ".json")).string();
  std::ofstream(file) << spec.dump();
  auto run = [](const std::string& model, std::optional<DType> dtype) {
    TrainOptions o;
    o.model = model;
    o.steps = 1;
    o.model_options.batch_size = 1;
    o.model_options.seq_len = 32;
    o.model_options.param_dtype = dtype;
    const Recorded r = RunTraining(o);
    REQUIRE(r.result.error.empty());
    return std::vector<std::uint64_t>{Row(r.report, Phase::kForward, 0).max_allocated,
                                      Row(r.report, Phase::kBackward, 0).max_allocated,
                                      Row(r.report, Phase::kStep, 0).allocated};
  };
  const std::vector<std::uint64_t> pure = run(absl::StrCat("hf:", Config("Qwen2-0.5B")), DType::kBFloat16);
  CHECK(pure == run(absl::StrCat("file:", file), std::nullopt));
  CHECK(pure != run(absl::StrCat("hf:", Config("Qwen2-0.5B")), std::nullopt));
  std::filesystem::remove(file);
}

TEST_CASE("Hugging Face config errors name the config and the field") {
  auto error = [](const nlohmann::json& config) {
    absl::StatusOr<nlohmann::json> s = HfConfigToModelSpec(config, "c.json");
    REQUIRE_FALSE(s.ok());
    return std::string(s.status().message());
  };
  CHECK(error({{"model_type", "t5"}}) ==
        "Hugging Face config c.json: field \"model_type\": \"t5\" is not modelled (gpt2, llama, mistral, qwen2, bert, "
        "roberta)");
  CHECK(error({{"model_type", "llama"}, {"hidden_size", 64}}) ==
        "Hugging Face config c.json: missing field \"num_hidden_layers\"");
  CHECK(error(nlohmann::json::array()) == "Hugging Face config c.json: expected a JSON object");
}

}  // namespace
}  // namespace memscope
