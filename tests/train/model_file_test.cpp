// Model files (train/model_file.h): the example files of the zoo's models
// record exactly the zoo's events; hand-derived bytes for small files; one-line
// errors naming the layer and the field.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>

#include "absl/strings/str_cat.h"
#include "reducer/communicator.h"
#include "tests/train/train_test_util.h"
#include "train/model_file.h"

namespace memscope {
namespace {

std::string Example(const std::string& name) {
  return absl::StrCat(MEMSCOPE_SOURCE_DIR, "/examples/models/", name, ".json");
}

// Every event but its time: type, flags, category, phase, owner, address, sizes, stream.
bool Same(const Timeline& a, const Event& x, const Timeline& b, const Event& y) {
  return x.type == y.type && x.flags == y.flags && x.category == y.category && x.phase == y.phase &&
         a.str(x.name) == b.str(y.name) && x.addr == y.addr && x.size == y.size &&
         x.requested_size == y.requested_size && x.stream == y.stream;
}

void DumpAround(const Timeline& a, const Timeline& b) {
  std::size_t i = 0;
  while (i < a.events.size() && i < b.events.size() && Same(a, a.events[i], b, b.events[i])) ++i;
  if (i == a.events.size() && i == b.events.size()) return;
  for (const Timeline* t : {&a, &b}) {
    std::cerr << (t == &a ? "zoo" : "file") << ":\n";
    for (std::size_t j = i >= 6 ? i - 6 : 0; j < std::min(t->events.size(), i + 6); ++j) {
      const Event& e = t->events[j];
      std::cerr << (j == i ? "> " : "  ") << j << " type " << static_cast<int>(e.type) << " cat "
                << static_cast<int>(e.category) << " " << t->str(e.name) << " size " << e.size << " req "
                << e.requested_size << " addr " << e.addr << "\n";
    }
  }
}

void CheckSameEvents(const Timeline& a, const Timeline& b) {
  if (std::getenv("DUMP") != nullptr) DumpAround(a, b);
  REQUIRE(a.events.size() == b.events.size());
  for (std::size_t i = 0; i < a.events.size(); ++i) {
    const Event& x = a.events[i];
    const Event& y = b.events[i];
    INFO("event " << i << " owner " << a.str(x.name) << " vs " << b.str(y.name));
    REQUIRE(static_cast<int>(x.type) == static_cast<int>(y.type));
    REQUIRE(x.flags == y.flags);
    REQUIRE(static_cast<int>(x.category) == static_cast<int>(y.category));
    REQUIRE(static_cast<int>(x.phase) == static_cast<int>(y.phase));
    REQUIRE(a.str(x.name) == b.str(y.name));
    REQUIRE(x.addr == y.addr);
    REQUIRE(x.size == y.size);
    REQUIRE(x.requested_size == y.requested_size);
    REQUIRE(x.stream == y.stream);
  }
}

void CheckSameAsZoo(const std::string& name, TrainOptions o, bool ddp = false) {
  o.model = name;
  std::unique_ptr<reducer::Communicator> c1, c2;
  if (ddp) {
    c1 = reducer::CreateLocalCommunicator();
    c2 = reducer::CreateLocalCommunicator();
  }
  const Recorded zoo = RunTraining(o, false, c1.get());
  o.model = "file:" + Example(name);
  const Recorded file = RunTraining(o, false, c2.get());
  CHECK(zoo.result.error.empty());
  CHECK(file.result.error.empty());
  CHECK(zoo.result.parameters == file.result.parameters);
  CHECK(zoo.timeline.events.size() > 100);
  CheckSameEvents(zoo.timeline, file.timeline);
}

TEST_CASE("the example files of the zoo's models record exactly the zoo's events") {
  TrainOptions o;
  o.steps = 2;
  SECTION("mlp") { CheckSameAsZoo("mlp", o); }
  SECTION("cifar-net") { CheckSameAsZoo("cifar-net", o); }
  SECTION("bilstm") {
    o.model_options.batch_size = 4;
    o.model_options.seq_len = 16;
    CheckSameAsZoo("bilstm", o);
  }
  SECTION("resnet50") {
    o.model_options.batch_size = 2;
    CheckSameAsZoo("resnet50", o);
  }
  SECTION("gpt2") {
    o.model_options.batch_size = 1;
    o.model_options.seq_len = 64;
    CheckSameAsZoo("gpt2", o);
  }
}

TEST_CASE("the example files match the zoo under every strategy") {
  TrainOptions o;
  o.steps = 2;
  SECTION("checkpointing, AMP fp16, SGD") {
    o.model_options.checkpoint_activations = true;
    o.amp = DType::kFloat16;
    o.optimizer.kind = OptimizerKind::kSgd;
    o.optimizer.momentum = 0.9f;
    CheckSameAsZoo("mlp", o);
    o.model_options.batch_size = 2;
    CheckSameAsZoo("resnet50", o);
  }
  SECTION("gpt2: flash attention, bf16, checkpointing, grad accumulation, zero_grad zeros") {
    o.model_options.batch_size = 1;
    o.model_options.seq_len = 32;
    o.model_options.attention = AttentionKind::kFlash;
    o.model_options.checkpoint_activations = true;
    o.amp = DType::kBFloat16;
    o.grad_accum = 2;
    o.zero_grad_set_to_none = false;
    CheckSameAsZoo("gpt2", o);
  }
  SECTION("DDP bucket view and copy") {
    reducer::DdpOptions d;
    d.gradient_as_bucket_view = true;
    o.ddp = d;
    CheckSameAsZoo("cifar-net", o, true);
    d.gradient_as_bucket_view = false;
    d.find_unused_parameters = true;
    o.ddp = d;
    o.model_options.batch_size = 1;
    o.model_options.seq_len = 32;
    CheckSameAsZoo("gpt2", o, true);
  }
}

TEST_CASE("all four GPT-2 example files have the zoo's parameter counts") {
  for (const char* name : {"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "resnet101"}) {
    INFO(name);
    absl::StatusOr<std::unique_ptr<Model>> zoo = CreateModel(name, {});
    absl::StatusOr<std::unique_ptr<Model>> file = LoadModelFile(Example(name), {});
    REQUIRE(zoo.ok());
    REQUIRE(file.ok());
    CHECK((*zoo)->NumParameters() == (*file)->NumParameters());
    CHECK((*zoo)->NumParameterTensors() == (*file)->NumParameterTensors());
  }
}

Recorded RunSpec(const nlohmann::json& spec) {
  static int n = 0;
  const std::string path = absl::StrCat("/tmp/memscope-model-file-test-", ::getpid(), "-", n++, ".json");
  {
    std::ofstream out(path);
    out << spec.dump();
  }
  TrainOptions o;
  o.model = "file:" + path;
  o.steps = 1;
  Recorded r = RunTraining(o);
  std::remove(path.c_str());
  return r;
}

std::int64_t Cat(const PhaseRow& row, Category c) { return row.by_category[static_cast<std::size_t>(c)]; }

TEST_CASE("a small file: parameter bytes, a frozen layer and bfloat16 parameters, derived by hand") {
  nlohmann::json spec = {{"format", "memscope.model/1"},
                         {"batch_size", 4},
                         {"input", {{"shape", {100}}}},
                         {"target", {{"classes", 10}}},
                         {"layers",
                          {{{"type", "linear"}, {"name", "frozen"}, {"out", 200}, {"trainable", false}},
                           {{"type", "relu"}},
                           {{"type", "linear"}, {"name", "head"}, {"out", 10}}}}};
  SECTION("float32") {
    const Recorded r = RunSpec(spec);
    REQUIRE(r.result.error.empty());
    CHECK(r.result.parameters == 100 * 200 + 200 + 200 * 10 + 10);
    // Blocks of 512 B: frozen.weight 80,000 B -> 80,384; frozen.bias 800 -> 1,024; head.weight 8,000 -> 8,192;
    // head.bias 40 -> 512.
    CHECK(Cat(Row(r.report, Phase::kModel, kNoStep), Category::kParameter) == 80'384 + 1'024 + 8'192 + 512);
    // Only the head trains: its gradients (8,192 + 512) and Adam's two states of them.
    const PhaseRow& step = Row(r.report, Phase::kStep, 0);
    CHECK(Cat(step, Category::kGradient) == 8'704);
    CHECK(Cat(step, Category::kOptimizerState) == 2 * 8'704);
  }
  SECTION("bfloat16 parameters (and input)") {
    spec["param_dtype"] = "bfloat16";
    const Recorded r = RunSpec(spec);
    REQUIRE(r.result.error.empty());
    // 40,000 -> 40,448; 400 -> 512; 4,000 -> 4,096; 20 -> 512.
    CHECK(Cat(Row(r.report, Phase::kModel, kNoStep), Category::kParameter) == 40'448 + 512 + 4'096 + 512);
    CHECK(Cat(Row(r.report, Phase::kStep, 0), Category::kOptimizerState) == 2 * (4'096 + 512));
    // The input batch: 4 x 100 bfloat16 = 800 B -> 1,024; the int64 labels 32 B -> 512.
    CHECK(Cat(Row(r.report, Phase::kZeroGrad, 0), Category::kInput) == 1'024 + 512);
  }
}

TEST_CASE("tied weights are one parameter, a shared layer runs twice with one set of weights") {
  nlohmann::json spec = {{"format", "memscope.model/1"},
                         {"batch_size", 2},
                         {"seq_len", 8},
                         {"input", {{"shape", {"batch", "seq"}}, {"vocab", 1000}}},
                         {"target", {{"from", "input"}}},
                         {"loss", {{"type", "cross_entropy"}, {"shift", true}}},
                         {"layers",
                          {{{"type", "embedding"}, {"name", "emb"}, {"num", 1000}, {"dim", 64}},
                           {{"type", "linear"}, {"name", "mix"}, {"out", 64}},
                           {{"type", "shared"}, {"ref", "mix"}},
                           {{"type", "linear"}, {"name", "out"}, {"out", 1000}, {"bias", false}, {"tie", "emb"}}}}};
  const Recorded r = RunSpec(spec);
  REQUIRE(r.result.error.empty());
  CHECK(r.result.parameters == 1000 * 64 + 64 * 64 + 64);
  // emb.weight 256,000 B (a multiple of 512), mix 16,384 + 256 -> 512.
  CHECK(Cat(Row(r.report, Phase::kModel, kNoStep), Category::kParameter) == 256'000 + 16'384 + 512);
  CHECK(Cat(Row(r.report, Phase::kStep, 0), Category::kGradient) == 256'000 + 16'384 + 512);
}

std::string Error(const nlohmann::json& spec, ModelOptions options = {}) {
  absl::StatusOr<std::unique_ptr<Model>> m = ModelFromJson(spec, "m.json", options);
  REQUIRE_FALSE(m.ok());
  return std::string(m.status().message());
}

TEST_CASE("malformed model files are one-line errors naming the layer and the field") {
  nlohmann::json base = {{"format", "memscope.model/1"},
                         {"input", {{"shape", {16}}}},
                         {"layers", {{{"type", "linear"}, {"name", "fc1"}, {"out", 8}}}}};
  nlohmann::json s = base;
  s["layers"][0]["type"] = "lineer";
  CHECK(Error(s).find("model file m.json: layers[0] (lineer \"fc1\"): unknown layer type \"lineer\" (linear, ") == 0);
  s = base;
  s["layers"].push_back({{"type", "linear"}, {"name", "fc2"}, {"in", 16}, {"out", 4}});
  CHECK(Error(s) ==
        "model file m.json: layers[1] (linear \"fc2\"): field \"in\": 16 does not match the input's 8 (shape mismatch "
        "with the layer before)");
  s = base;
  s["layers"][0].erase("out");
  CHECK(Error(s) == "model file m.json: layers[0] (linear \"fc1\"): missing field \"out\"");
  s = base;
  s.erase("input");
  CHECK(Error(s) == "model file m.json: missing field \"input\"");
  s = base;
  s["layers"] = {{{"type", "sequential"},
                  {"name", "body"},
                  {"layers", {{{"type", "conv2d"}, {"name", "c"}, {"out", 4}, {"kernel", 3}}}}}};
  CHECK(Error(s) ==
        "model file m.json: layers[0].layers[0] (conv2d \"body.c\"): needs a 4-d input (N, C, H, W), got "
        "[1, 16]");
  s = base;
  s["layers"] = {{{"type", "linear"}, {"name", "a"}, {"out", 16}, {"tie", "b"}},
                 {{"type", "linear"}, {"name", "b"}, {"out", 16}, {"tie", "a"}}};
  CHECK(Error(s) == "model file m.json: layers[0] (linear \"a\"): field \"tie\": a -> b -> a is a cycle");
  s = base;
  s["layers"][0]["stride"] = 2;
  CHECK(Error(s) == "model file m.json: layers[0] (linear \"fc1\"): unknown field \"stride\"");
  s = base;
  s["layers"] = {{{"type", "linear"}, {"out", 8}}, {{"type", "linear"}, {"out", 8}}};
  CHECK(Error(s) ==
        "model file m.json: layers[1] (linear): parameter \"weight\" exists already (give the layer a "
        "\"name\")");
  s = base;
  s["layers"] = {{{"type", "residual"}, {"body", {{{"type", "linear"}, {"name", "x"}, {"out", 4}}}}}};
  CHECK(Error(s) ==
        "model file m.json: layers[0] (residual): shape mismatch: the body gives [1, 4] but the input is "
        "[1, 16]");
  s = base;
  s["target"] = {{"classes", 10}};
  CHECK(Error(s) == "model file m.json: target: field \"classes\": 10 classes but the model's output [1, 8] has 8");
  CHECK(Error(base, ModelOptions{.checkpoint_activations = true}) ==
        "model file m.json: --checkpoint-activations: no layer is marked \"checkpoint\": true");
  s = base;
  s["format"] = "other";
  CHECK(Error(s) == "model file m.json: field \"format\": expected \"memscope.model/1\"");
}

TEST_CASE("last_token, an attention's cache until forward returns and an upcast loss are checked like any layer") {
  // (batch 2, 8 tokens) ids -> embedding -> (2, 8, 3) logits -> each row's last token before the padding.
  nlohmann::json s = {{"format", "memscope.model/1"},
                      {"batch_size", 2},
                      {"seq_len", 8},
                      {"input", {{"shape", {"batch", "seq"}}, {"vocab", 50}}},
                      {"layers",
                       {{{"type", "embedding"}, {"name", "e"}, {"num", 50}, {"dim", 16}},
                        {{"type", "linear"}, {"name", "score"}, {"out", 3}, {"bias", false}},
                        {{"type", "last_token"}, {"pad_token_id", 0}}}}};
  absl::StatusOr<std::unique_ptr<Model>> m = ModelFromJson(s, "m.json", {});
  CHECK(m.ok());
  s["layers"][2].erase("pad_token_id");
  CHECK(Error(s) ==
        "model file m.json: layers[2] (last_token): batch 2 without \"pad_token_id\": transformers refuses it "
        "(\"Cannot handle batch sizes > 1 if no padding token is defined.\")");
  s["batch_size"] = 1;
  CHECK(ModelFromJson(s, "m.json", {}).ok());
  s["layers"][1] = {{"type", "select_token"}, {"index", 0}};
  CHECK(Error(s) == "model file m.json: layers[2] (last_token): needs a 3-d input (batch, tokens, features), got [1, 16]");
  s["layers"][1] = {{"type", "attention"}, {"name", "a"}, {"heads", 2}, {"cache", "later"}};
  CHECK(Error(s) == "model file m.json: layers[1] (attention \"a\"): field \"cache\": use true, false or \"forward\"");
  s["layers"][1]["cache"] = "forward";
  s["layers"][2] = {{"type", "linear"}, {"name", "classifier"}, {"out", 3}};
  s["loss"] = {{"type", "mse"}, {"upcast", true}};
  CHECK(Error(s) == "model file m.json: loss: field \"upcast\": true or false, for cross_entropy");
  s["loss"] = {{"type", "cross_entropy"}, {"upcast", true}};
  CHECK(ModelFromJson(s, "m.json", {}).ok());
}

TEST_CASE("a model file that is not JSON or cannot be read is a one-line error") {
  absl::StatusOr<std::unique_ptr<Model>> m = LoadModelFile("/nonexistent/m.json", {});
  CHECK(m.status().message() == "model file /nonexistent/m.json: cannot be read");
  const std::string path = absl::StrCat("/tmp/memscope-model-file-test-bad-", ::getpid(), ".json");
  {
    std::ofstream out(path);
    out << "{\"format\": ";
  }
  m = LoadModelFile(path, {});
  std::remove(path.c_str());
  REQUIRE_FALSE(m.ok());
  CHECK(m.status().message().find(absl::StrCat("model file ", path, ": not JSON: ")) == 0);
}

}  // namespace
}  // namespace memscope
