// memscope's side of the PyTorch oracle (tests/oracle/torch_oracle.py): reads
// the cases that script wrote (each a memscope model description or a Hugging
// Face config), runs each through forward, loss and backward on a simulated
// GPU in meta mode, and writes the same figures from the allocator's
// requested bytes (tensor storage sizes before the allocator rounds them):
//
//   oracle_memscope CASES.json OUT.json
//
// The protocol is the Python one: the figures are bytes above what was alive
// when forward started (the parameters and the batch); `saved` comes from a
// second forward on a fresh model whose output is dropped while its grad_fn
// is kept.
#include <cstdint>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "allocator/caching_allocator.h"
#include "allocator/sim_device.h"
#include "nlohmann/json.hpp"
#include "tensor/autograd.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"
#include "train/hf_config.h"
#include "train/lora.h"
#include "train/model_file.h"

namespace memscope {
namespace {

using nlohmann::json;

// The model description of a case: its own, or its HF config's.
json CaseSpec(const json& memscope) {
  if (!memscope.contains("hf")) return memscope;
  absl::StatusOr<json> spec = HfConfigToModelSpec(memscope["hf"], "oracle case");
  if (!spec.ok()) throw std::runtime_error(std::string(spec.status().message()));
  json s = *spec;
  for (const char* key : {"batch_size", "seq_len", "param_dtype", "lora"}) {
    if (memscope.contains(key)) s[key] = memscope[key];
  }
  return s;
}

struct Run {
  SimDevice device;
  CachingAllocator allocator{device};
  DeviceContext ctx{allocator, ExecMode::kMeta};
  std::unique_ptr<Model> model;
  Batch batch;
  std::int64_t base = 0;

  Run(const json& case_spec, bool checkpoint) {
    ModelOptions options;
    options.checkpoint_activations = checkpoint;
    // "lora": PEFT's adapter_config.json (memscope run --lora).
    json spec = case_spec;
    if (spec.contains("lora")) {
      absl::StatusOr<LoraConfig> lora = ParseLoraConfig(spec["lora"], "oracle case");
      if (!lora.ok()) throw std::runtime_error(std::string(lora.status().message()));
      options.lora = std::make_shared<const LoraConfig>(*lora);
      spec.erase("lora");
    }
    absl::StatusOr<std::unique_ptr<Model>> m = ModelFromJson(spec, "oracle case", options);
    if (!m.ok()) throw std::runtime_error(std::string(m.status().message()));
    model = std::move(*m);
    model->Materialize(ctx);
    batch = model->MakeBatch(ctx, 0);
    base = Current();
  }
  std::int64_t Current() const { return allocator.GetStats().requested_bytes[0].current; }
  std::int64_t Peak() const { return allocator.GetStats().requested_bytes[0].peak; }
  // Starts a phase: its peak counts from here.
  void Begin() { allocator.ResetPeakStats(); }
  void End(json& out, const std::string& phase) const {
    out[phase + "_peak"] = Peak() - base;
    out[phase + "_end"] = Current() - base;
  }
};

// Forward and loss under torch.autocast (amp: "bf16" or none); the guard
// goes, and with it the cast cache, at the end of the loss.
json Measure(const json& spec, std::optional<DType> amp, bool checkpoint) {
  json out;
  {
    Run run(spec, checkpoint);
    out["parameters"] = run.model->NumParameters();
    out["trainable"] = run.model->NumTrainableParameters();
    run.Begin();
    std::optional<AutocastGuard> autocast;
    if (amp) autocast.emplace(*amp);
    Tensor output = run.model->Forward(run.batch);
    run.End(out, "forward");
    run.Begin();
    Tensor loss = run.model->Loss(output, run.batch);
    autocast.reset();
    run.End(out, "loss");
    run.Begin();
    Backward({loss});
    run.End(out, "backward");
  }
  {
    Run run(spec, checkpoint);
    std::optional<AutocastGuard> autocast;
    if (amp) autocast.emplace(*amp);
    Tensor output = run.model->Forward(run.batch);
    autocast.reset();
    std::vector<std::shared_ptr<Node>> graph = {output.grad_fn()};
    for (const Tensor& other : run.model->OtherOutputs()) graph.push_back(other.grad_fn());
    output = Tensor();
    run.model->ReleaseOutputs();
    out["saved"] = run.Current() - run.base;
  }
  return out;
}

int Main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: oracle_memscope CASES.json OUT.json\n";
    return 2;
  }
  std::ifstream in(argv[1]);
  const json cases = json::parse(in);
  // memscope as the PyTorch release of the oracle where behaviours differ
  // (tensor/autograd.h TorchBehaviour).
  const std::string version = cases.value("torch", "");
  const bool torch1 = version.size() > 1 && version[0] == '1' && version[1] == '.';
  CurrentTorchBehaviour().inplace_accumulation = !torch1;
  CurrentTorchBehaviour().mean_dim_saves_input = torch1;
  json out = json::array();
  for (const json& c : cases["cases"]) {
    json row = {{"name", c["name"]}};
    try {
      std::optional<DType> amp;
      if (c.value("amp", json()).is_string()) amp = c["amp"] == "bf16" ? DType::kBFloat16 : DType::kFloat16;
      // An HF config's gradient_checkpointing (the oracle's switch): --checkpoint-activations.
      const json& m = c["memscope"];
      const bool checkpoint = m.contains("hf") && m["hf"].value("gradient_checkpointing", false);
      row["memscope"] = Measure(CaseSpec(m), amp, checkpoint);
    } catch (const std::exception& e) {
      row["error"] = e.what();
    }
    out.push_back(row);
  }
  std::ofstream(argv[2]) << out.dump(1) << "\n";
  return 0;
}

}  // namespace
}  // namespace memscope

int main(int argc, char** argv) { return memscope::Main(argc, argv); }
