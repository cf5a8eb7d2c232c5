#include "load/manifest.h"

#include <cmath>
#include <filesystem>
#include <limits>

#include "absl/strings/str_cat.h"
#include "base/input_file.h"
#include "exporters/report.h"
#include "load/output_file.h"

namespace memscope {
namespace {

using nlohmann::json;

// Optional fields: written only when set, read only when present.
template <typename T>
void PutOptional(json& j, const char* key, const std::optional<T>& v) {
  if (v) j[key] = *v;
}
template <typename T>
void GetOptional(const json& j, const char* key, std::optional<T>& v) {
  if (j.contains(key)) v = j.at(key).get<T>();
}
template <typename T>
void GetIfPresent(const json& j, const char* key, T& v) {
  if (j.contains(key)) v = j.at(key).get<T>();
}

// Losses per step: a loss that diverged (inf, nan) is null, as JSON has no
// such numbers; null reads back as nan.
json LossesJson(const std::vector<float>& losses) {
  json j = json::array();
  for (float l : losses) j.push_back(std::isfinite(l) ? json(l) : json(nullptr));
  return j;
}
std::vector<float> LossesFromJson(const json& j) {
  std::vector<float> losses;
  for (const json& l : j) losses.push_back(l.is_null() ? std::numeric_limits<float>::quiet_NaN() : l.get<float>());
  return losses;
}

}  // namespace

std::optional<std::pair<std::size_t, float>> FirstDivergedLoss(const std::vector<float>& losses) {
  for (std::size_t i = 0; i < losses.size(); ++i) {
    if (!std::isfinite(losses[i])) return std::make_pair(i, losses[i]);
  }
  return std::nullopt;
}

namespace {

// Written whole or not at all, never through a symlink (run/output_file.h).
absl::Status WriteText(const std::string& path, const std::string& text) { return WriteOutputFile(path, text); }

json ManifestRankJson(const ManifestRank& r) {
  json j = {{"rank", r.rank}, {"timeline", r.timeline}, {"status", r.status}};
  PutOptional(j, "exit_code", r.exit_code);
  PutOptional(j, "error", r.error);
  PutOptional(j, "steps_done", r.steps_done);
  PutOptional(j, "signal", r.signal);
  PutOptional(j, "how", r.how);
  return j;
}

ManifestRank ManifestRankFromJson(const json& j) {
  ManifestRank r;
  r.rank = j.at("rank").get<int>();
  r.timeline = j.at("timeline").get<std::string>();
  r.status = j.at("status").get<std::string>();
  GetOptional(j, "exit_code", r.exit_code);
  GetOptional(j, "error", r.error);
  GetOptional(j, "steps_done", r.steps_done);
  GetOptional(j, "signal", r.signal);
  GetOptional(j, "how", r.how);
  return r;
}

void PutTraining(json& j, const TrainingManifest& t) {
  j.update({{"model", t.model},
            {"parameters", t.parameters},
            {"steps", t.steps},
            {"steps_done", t.steps_done},
            {"batch_size", t.batch_size},
            {"optimizer", t.optimizer},
            {"optimizer_impl", t.optimizer_impl},
            {"zero_grad", t.zero_grad},
            {"amp", t.amp},
            {"checkpoint_activations", t.checkpoint_activations},
            {"grad_accum", t.grad_accum},
            {"attention", t.attention},
            {"exec", t.exec},
            {"ddp", t.ddp},
            {"seconds", t.seconds},
            {"losses", LossesJson(t.losses)}});
  if (!t.torch_version.empty()) j["torch_version"] = t.torch_version;
  if (!t.zero.empty()) j["zero"] = t.zero;
  if (t.seq_len != 0) j["seq_len"] = t.seq_len;
  if (t.width != 0) j["width"] = t.width;
  if (t.depth != 0) j["depth"] = t.depth;
  if (!t.dtype.empty()) j["dtype"] = t.dtype;
  if (!t.lora.empty()) j["lora"] = t.lora;
  if (!t.gpu.empty()) j["gpu"] = t.gpu;
  if (t.ddp_options) {
    const TrainingManifest::Ddp& d = *t.ddp_options;
    j["bucket_cap_mb"] = d.bucket_cap_mb ? json(*d.bucket_cap_mb) : json(nullptr);
    j["find_unused_parameters"] = d.find_unused_parameters;
    j["static_graph"] = d.static_graph;
    j["comm_hook"] = d.comm_hook;
    j["broadcast_buffers"] = d.broadcast_buffers;
  }
  if (t.data_parallel) {
    const TrainingManifest::DataParallel& d = *t.data_parallel;
    j["data_parallel"] = {
        {"module", "torch.nn.DataParallel"}, {"device_ids", d.device_ids},
        {"output_device", d.output_device},  {"global_batch", d.global_batch},
        {"chunk_sizes", d.chunk_sizes},      {"ranks", "rank R is device cuda:R of this one process"}};
  }
}

TrainingManifest TrainingFromJson(const json& j) {
  TrainingManifest t;
  t.model = j.at("model").get<std::string>();
  t.parameters = j.at("parameters").get<std::int64_t>();
  t.steps = j.at("steps").get<std::int64_t>();
  t.steps_done = j.at("steps_done").get<std::int64_t>();
  t.batch_size = j.at("batch_size").get<std::int64_t>();
  t.optimizer = j.at("optimizer").get<std::string>();
  t.optimizer_impl = j.at("optimizer_impl").get<std::string>();
  t.zero_grad = j.at("zero_grad").get<std::string>();
  t.amp = j.at("amp").get<std::string>();
  t.checkpoint_activations = j.at("checkpoint_activations").get<bool>();
  t.grad_accum = j.at("grad_accum").get<std::int64_t>();
  t.attention = j.at("attention").get<std::string>();
  t.exec = j.at("exec").get<std::string>();
  t.ddp = j.at("ddp").get<std::string>();
  t.seconds = j.at("seconds").get<double>();
  t.losses = LossesFromJson(j.at("losses"));
  GetIfPresent(j, "seq_len", t.seq_len);
  GetIfPresent(j, "width", t.width);
  GetIfPresent(j, "depth", t.depth);
  GetIfPresent(j, "dtype", t.dtype);
  GetIfPresent(j, "lora", t.lora);
  GetIfPresent(j, "gpu", t.gpu);
  if (j.contains("torch_version")) t.torch_version = j.at("torch_version").get<std::string>();
  if (j.contains("zero")) t.zero = j.at("zero").get<std::string>();
  if (j.contains("comm_hook")) {
    TrainingManifest::Ddp d;
    if (!j.at("bucket_cap_mb").is_null()) d.bucket_cap_mb = j.at("bucket_cap_mb").get<double>();
    d.find_unused_parameters = j.at("find_unused_parameters").get<bool>();
    d.static_graph = j.at("static_graph").get<bool>();
    d.comm_hook = j.at("comm_hook").get<std::string>();
    d.broadcast_buffers = j.at("broadcast_buffers").get<bool>();
    t.ddp_options = d;
  }
  if (j.contains("data_parallel")) {
    const json& dp = j.at("data_parallel");
    TrainingManifest::DataParallel d;
    d.device_ids = dp.at("device_ids").get<std::vector<int>>();
    d.output_device = dp.at("output_device").get<int>();
    d.global_batch = dp.at("global_batch").get<std::int64_t>();
    d.chunk_sizes = dp.at("chunk_sizes").get<std::vector<std::int64_t>>();
    t.data_parallel = std::move(d);
  }
  return t;
}

}  // namespace

json RankStatus::ToJson() const {
  json j = {{"rank", rank},
            {"status", status},
            {"exit_code", exit_code},
            {"error", error},
            {"parameters", parameters},
            {"steps_done", steps_done},
            {"seconds", seconds},
            {"losses", LossesJson(losses)}};
  if (ddp) j["ddp"] = DdpJson(*ddp);
  if (device) {
    json others = json::array();
    for (const auto& [physical, bytes] : device->other_contexts) {
      others.push_back({{"physical", physical}, {"bytes", bytes}});
    }
    j["device"] = {{"ordinal", device->ordinal},
                   {"physical", device->physical},
                   {"how", device->how},
                   {"context_bytes", device->context_bytes},
                   {"nccl_bytes", device->nccl_bytes},
                   {"other_contexts", others}};
  }
  if (checkpoint) {
    j["checkpoint"] = {{"step", checkpoint->step},
                       {"saved", checkpoint->saved},
                       {"state_bytes", checkpoint->state_bytes},
                       {"map_location", checkpoint->map_location},
                       {"loaded_onto", checkpoint->loaded_onto},
                       {"loaded", checkpoint->loaded}};
    if (checkpoint->load_physical >= 0) {
      j["checkpoint"]["load_gpu"] = {{"physical", checkpoint->load_physical},
                                     {"used", checkpoint->gpu_used},
                                     {"used_by_rank", checkpoint->gpu_used_by_rank}};
    }
  }
  return j;
}

absl::StatusOr<RankStatus> RankStatus::FromJson(const json& j) {
  try {
    RankStatus s;
    s.rank = j.at("rank").get<int>();
    s.status = j.at("status").get<std::string>();
    s.exit_code = j.at("exit_code").get<int>();
    s.error = j.at("error").get<std::string>();
    s.parameters = j.at("parameters").get<std::int64_t>();
    s.steps_done = j.at("steps_done").get<std::int64_t>();
    s.seconds = j.at("seconds").get<double>();
    s.losses = LossesFromJson(j.at("losses"));
    if (j.contains("ddp")) {
      absl::StatusOr<DdpBuckets> ddp = DdpFromJson(j.at("ddp"));
      if (!ddp.ok()) return absl::InvalidArgumentError(absl::StrCat("not a rank status: ", ddp.status().message()));
      s.ddp = std::move(*ddp);
    }
    if (j.contains("device")) {
      const json& d = j.at("device");
      s.device = RankDevice{d.at("ordinal").get<int>(),
                            d.at("physical").get<int>(),
                            d.at("how").get<std::string>(),
                            d.value("context_bytes", std::uint64_t{0}),
                            d.value("nccl_bytes", std::uint64_t{0}),
                            {}};
      if (d.contains("other_contexts")) {
        for (const json& o : d.at("other_contexts")) {
          s.device->other_contexts.emplace_back(o.at("physical").get<int>(), o.at("bytes").get<std::uint64_t>());
        }
      }
    }
    if (j.contains("checkpoint")) {
      const json& c = j.at("checkpoint");
      RankCheckpoint k;
      k.step = c.at("step").get<std::int64_t>();
      k.saved = c.at("saved").get<bool>();
      k.state_bytes = c.at("state_bytes").get<std::uint64_t>();
      k.map_location = c.at("map_location").get<std::string>();
      k.loaded_onto = c.at("loaded_onto").get<std::string>();
      k.loaded = c.at("loaded").get<bool>();
      s.checkpoint = k;
      if (c.contains("load_gpu")) {
        const json& g = c.at("load_gpu");
        s.checkpoint->load_physical = g.at("physical").get<int>();
        s.checkpoint->gpu_used = g.at("used").get<std::uint64_t>();
        s.checkpoint->gpu_used_by_rank = g.at("used_by_rank").get<std::vector<std::uint64_t>>();
      }
    }
    return s;
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("not a rank status: ", e.what()));
  }
}

absl::Status RankStatus::Write(const std::string& path) const {
  return WriteText(path, ToJson().dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

std::optional<RankStatus> RankStatus::Read(const std::string& path) {
  absl::StatusOr<std::string> text = ReadInputFile(path, "rank status", kMaxManifestBytes);
  if (!text.ok()) return std::nullopt;
  const json j = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return std::nullopt;
  absl::StatusOr<RankStatus> s = FromJson(j);
  if (!s.ok()) return std::nullopt;
  return *std::move(s);
}

json RunManifest::ToJson() const {
  json ranks_json = json::array();
  for (const ManifestRank& r : ranks) ranks_json.push_back(ManifestRankJson(r));
  json j = {{"schema", kRunSchema},     {"generator", generator},   {"command", command},
            {"world_size", world_size}, {"alloc_conf", alloc_conf}, {"device_memory", device_memory},
            {"ranks", ranks_json}};
  if (training) PutTraining(j, *training);
  if (source) j["source"] = *source;
  if (capture) {
    j["capture"] = {{"argv", capture->argv},
                    {"exit_status", capture->exit_status},
                    {"signal", capture->signal ? json(*capture->signal) : json(nullptr)},
                    {"max_entries", capture->max_entries}};
  }
  if (failure) j["failure"] = {{"rank", failure->rank}, {"message", failure->message}};
  if (interrupted) j["interrupted"] = *interrupted;
  return j;
}

absl::StatusOr<RunManifest> RunManifest::FromJson(const json& j) {
  if (!j.is_object() || !j.contains("schema") || j["schema"] != kRunSchema) {
    return absl::InvalidArgumentError(absl::StrCat("is not a run manifest (", kRunSchema, ")"));
  }
  try {
    RunManifest m;
    m.generator = j.at("generator").get<std::string>();
    m.command = j.at("command").get<std::string>();
    m.world_size = j.at("world_size").get<int>();
    m.alloc_conf = j.at("alloc_conf").get<std::string>();
    m.device_memory = j.at("device_memory").get<std::uint64_t>();
    for (const json& r : j.at("ranks")) m.ranks.push_back(ManifestRankFromJson(r));
    if (j.contains("model")) m.training = TrainingFromJson(j);
    GetOptional(j, "source", m.source);
    if (j.contains("capture")) {
      const json& c = j.at("capture");
      CaptureManifest capture;
      capture.argv = c.at("argv").get<std::vector<std::string>>();
      capture.exit_status = c.at("exit_status").get<int>();
      if (!c.at("signal").is_null()) capture.signal = c.at("signal").get<int>();
      capture.max_entries = c.at("max_entries").get<std::uint64_t>();
      m.capture = std::move(capture);
    }
    if (j.contains("failure")) {
      m.failure = RunFailure{j["failure"].at("rank").get<int>(), j["failure"].at("message").get<std::string>()};
    }
    GetOptional(j, "interrupted", m.interrupted);
    return m;
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("is not a valid run manifest: ", e.what()));
  }
}

absl::Status RunManifest::Write(const std::string& path) const {
  return WriteText(path, ToJson().dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

absl::StatusOr<RunManifest> RunManifest::Read(const std::string& path) {
  absl::StatusOr<std::string> text = ReadInputFile(path, "run.json", kMaxManifestBytes);
  if (!text.ok()) return text.status();
  const json j = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat("'", path, "' is not valid JSON"));
  absl::StatusOr<RunManifest> m = FromJson(j);
  if (!m.ok()) return absl::InvalidArgumentError(absl::StrCat("'", path, "' ", m.status().message()));
  return m;
}

}  // namespace memscope
