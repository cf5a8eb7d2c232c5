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
  gpt2["architectures"] = {"GPT2DoubleHeadsModel"};
  CHECK(error(gpt2) ==
        "Hugging Face config c.json: field \"architectures\": \"GPT2DoubleHeadsModel\" is not modelled for "
        "model_type \"gpt2\" (GPT2LMHeadModel, GPT2ForSequenceClassification, GPT2ForTokenClassification, "
        "GPT2ForQuestionAnswering)");
  nlohmann::json qwen2 = ConfigJson("Qwen2-0.5B");
  qwen2["architectures"] = {"LlamaForSequenceClassification"};
  CHECK(error(qwen2) ==
        "Hugging Face config c.json: field \"architectures\": \"LlamaForSequenceClassification\" is not modelled "
        "for model_type \"qwen2\" (Qwen2ForCausalLM, Qwen2ForSequenceClassification, Qwen2ForTokenClassification, "
        "Qwen2ForQuestionAnswering)");
  qwen2["architectures"] = {"Qwen2ForSequenceClassification"};
  qwen2["problem_type"] = "multi_label_classification";
  CHECK(error(qwen2) ==
        "Hugging Face config c.json: field \"problem_type\": multi_label_classification (BCEWithLogitsLoss) is not "
        "modelled");
}

// The description's heads of a config: the "heads" layer's, or the top level's loss.
nlohmann::json Heads(const nlohmann::json& config) {
  absl::StatusOr<nlohmann::json> spec = HfConfigToModelSpec(config, "c.json");
  REQUIRE(spec.ok());
  const nlohmann::json& last = spec->at("layers").back();
  return last.value("type", "") == "heads" ? last["heads"] : nlohmann::json::array({{{"loss", spec->at("loss")}}});
}

TEST_CASE("the heads of GPT-2 and the Llama family: transformers' parameter counts and names of each") {
  // The oracle's small configs (tests/oracle/torch_oracle.py); the counts are
  // sum(p.numel() for p in model.parameters()) of tests/oracle/hf_models.py's modules.
  const nlohmann::json gpt2 = {{"model_type", "gpt2"}, {"vocab_size", 128}, {"n_embd", 64},
                               {"n_layer", 1},         {"n_head", 4},       {"n_positions", 32}};
  auto as = [](nlohmann::json config, const std::string& arch) {
    config["architectures"] = {arch};
    return config;
  };
  CHECK(CountAs(as(gpt2, "GPT2LMHeadModel")) == 60'352);  // lm_head tied to wte
  CHECK(CountAs(as(gpt2, "GPT2ForSequenceClassification"), "score.weight") == 60'480);  // no bias
  CHECK(CountAs(as(gpt2, "GPT2ForTokenClassification"), "classifier.bias") == 60'482);
  CHECK(CountAs(as(gpt2, "GPT2ForQuestionAnswering"), "qa_outputs.bias") == 60'482);
  nlohmann::json three = as(gpt2, "GPT2ForTokenClassification");
  three["num_labels"] = 3;
  CHECK(CountAs(three) == 60'547);
  const nlohmann::json llama = {{"model_type", "llama"},    {"vocab_size", 128},          {"hidden_size", 64},
                                {"num_hidden_layers", 1},   {"num_attention_heads", 4},   {"num_key_value_heads", 2},
                                {"intermediate_size", 96},  {"max_position_embeddings", 64}};
  CHECK(CountAs(as(llama, "LlamaForCausalLM"), "lm_head.weight") == 47'296);
  CHECK(CountAs(as(llama, "LlamaForSequenceClassification"), "score.weight") == 39'232);
  CHECK(CountAs(as(llama, "LlamaForTokenClassification"), "score.bias") == 39'234);
  // LlamaForQuestionAnswering and Qwen2's hold LlamaModel as `transformer`, Mistral's as `model`.
  CHECK(CountAs(as(llama, "LlamaForQuestionAnswering"), "transformer.embed_tokens.weight") == 39'234);
  nlohmann::json mistral = llama, qwen2 = llama;
  mistral["model_type"] = "mistral";
  qwen2["model_type"] = "qwen2";
  CHECK(CountAs(as(mistral, "MistralForSequenceClassification"), "model.norm.weight") == 39'232);
  CHECK(CountAs(as(mistral, "MistralForTokenClassification")) == 39'234);
  CHECK(CountAs(as(mistral, "MistralForQuestionAnswering"), "model.embed_tokens.weight") == 39'234);
  CHECK(CountAs(as(qwen2, "Qwen2ForSequenceClassification"), "model.layers.0.self_attn.q_proj.bias") == 39'360);
  CHECK(CountAs(as(qwen2, "Qwen2ForTokenClassification")) == 39'362);
  CHECK(CountAs(as(qwen2, "Qwen2ForQuestionAnswering"), "transformer.layers.0.self_attn.k_proj.bias") == 39'362);
  // The published models: their trunks (GPT2Model, LlamaModel) and a head of 2 labels, no lm_head.
  CHECK(CountAs(as(ConfigJson("gpt2"), "GPT2ForSequenceClassification")) == 124'439'808 + 768 * 2);
  CHECK(CountAs(as(ConfigJson("Llama-2-7b-hf"), "LlamaForTokenClassification")) ==
        6'738'415'616 - 32'000 * 4096 + 4096 * 2 + 2);
  CHECK(CountAs(as(ConfigJson("Qwen2-0.5B"), "Qwen2ForQuestionAnswering")) == 494'032'768 + 896 * 2 + 2);
}

TEST_CASE("the decoder heads' losses: pooled logits by problem_type, tokens on logits.float() (Llama), spans") {
  nlohmann::json llama = ConfigJson("Llama-2-7b-hf");
  llama["architectures"] = {"LlamaForSequenceClassification"};
  llama["num_labels"] = 1;  // regression: MSELoss on pooled_logits
  CHECK(Heads(llama)[0]["loss"] == nlohmann::json{{"type", "mse"}});
  CHECK(Heads(llama)[0]["layers"][1] == nlohmann::json{{"type", "last_token"}});  // no pad_token_id: batch 1 only
  llama["pad_token_id"] = 0;
  CHECK(Heads(llama)[0]["layers"][1]["pad_token_id"] == 0);
  llama["architectures"] = {"LlamaForTokenClassification"};  // cross-entropy whatever problem_type says
  CHECK(Heads(llama)[0]["loss"] == nlohmann::json{{"type", "cross_entropy"}, {"upcast", true}});
  nlohmann::json gpt2 = ConfigJson("gpt2");
  gpt2["architectures"] = {"GPT2ForTokenClassification"};  // no .float() in modeling_gpt2.py
  CHECK(Heads(gpt2)[0]["loss"] == nlohmann::json{{"type", "cross_entropy"}});
  gpt2["architectures"] = {"GPT2ForQuestionAnswering"};
  gpt2["num_labels"] = 5;  // qa_outputs has 2 outputs whatever num_labels says
  CHECK(Heads(gpt2)[0]["loss"] == nlohmann::json{{"type", "span"}});
  CHECK(Heads(gpt2)[0]["layers"][0]["out"] == 2);
}

// A config written to a temporary file.
std::string ConfigFile(const nlohmann::json& config, const std::string& name) {
  const std::string path =
      (std::filesystem::temp_directory_path() / absl::StrCat("memscope-", name, "-", getpid(), ".json")).string();
  std::ofstream(path) << config.dump();
  return path;
}

TEST_CASE("GPT2ForSequenceClassification without a pad_token_id takes a batch of 1 only, as transformers") {
  nlohmann::json gpt2 = ConfigJson("gpt2");
  gpt2["architectures"] = {"GPT2ForSequenceClassification"};
  const std::string path = ConfigFile(gpt2, "gpt2-no-pad");
  ModelOptions options;
  options.batch_size = 2;
  options.seq_len = 16;
  absl::StatusOr<std::unique_ptr<Model>> m = LoadHfConfig(path, options);
  REQUIRE_FALSE(m.ok());
  CHECK(m.status().message() ==
        absl::StrCat("model file (from Hugging Face config ", path,
                     "): layers[1] (heads).heads[0].layers[1] (last_token): batch 2 without \"pad_token_id\": "
                     "transformers refuses it (\"Cannot handle batch sizes > 1 if no padding token is defined.\")"));
  options.batch_size = 1;
  CHECK(LoadHfConfig(path, options).ok());
  gpt2["pad_token_id"] = 50256;
  options.batch_size = 2;
  CHECK(LoadHfConfig(ConfigFile(gpt2, "gpt2-pad"), options).ok());
}

// What is allocated after the first forward of Qwen2-0.5B with the head `arch` (batch 2, 16 tokens).
std::int64_t Qwen2HeadForward(const std::string& arch, bool use_cache) {
  nlohmann::json qwen2 = ConfigJson("Qwen2-0.5B");
  qwen2["architectures"] = {arch};
  qwen2["pad_token_id"] = 151643;
  qwen2["use_cache"] = use_cache;
  TrainOptions o;
  o.model = "hf:" + ConfigFile(qwen2, arch);
  o.steps = 1;
  o.model_options.batch_size = 2;
  o.model_options.seq_len = 16;
  const Recorded r = RunTraining(o);
  INFO(arch << ": " << r.result.error);
  REQUIRE(r.result.error.empty());
  CHECK(r.result.steps_done == 1);
  return static_cast<std::int64_t>(Row(r.report, Phase::kForward, 0).allocated);
}

TEST_CASE("a decoder's sequence classifier keeps past_key_values with its output, the other heads drop them") {
  // use_cache: 24 layers x (the rotated key, v_proj's output), each 2 x 2 KV heads x 16 tokens x 64 float32
  // (16,384 B); grouped-query attention repeats them into copies, so only the cache holds them.
  CHECK(Qwen2HeadForward("Qwen2ForSequenceClassification", true) -
            Qwen2HeadForward("Qwen2ForSequenceClassification", false) ==
        24 * 2 * 16'384);
  CHECK(Qwen2HeadForward("Qwen2ForTokenClassification", true) == Qwen2HeadForward("Qwen2ForTokenClassification", false));
  CHECK(Qwen2HeadForward("Qwen2ForQuestionAnswering", true) == Qwen2HeadForward("Qwen2ForQuestionAnswering", false));
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
