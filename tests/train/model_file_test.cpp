// Model files (train/model_file.h): the example files of the zoo's models
// record exactly the zoo's events; hand-derived bytes for small files; one-line
// errors naming the layer and the field.
#include <catch2/catch.hpp>

#include <cstdlib>
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

}  // namespace
}  // namespace memscope
