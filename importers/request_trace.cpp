#include "importers/request_trace.h"

#include <algorithm>
#include <bit>
#include <fstream>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "base/input_file.h"
#include "nlohmann/json.hpp"

namespace memscope {
namespace {

using nlohmann::json;

class Reader {
 public:
  explicit Reader(std::string source) { trace_.source = std::move(source); }

  absl::Status Line(const std::string& text, std::uint64_t line_no) {
    line_ = line_no;
    std::size_t first = text.find_first_not_of(" \t\r");
    if (first == std::string::npos || text[first] == '#') return absl::OkStatus();
    json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return Error("not valid JSON");
    if (!j.is_object()) return Error("expected a JSON object");
    auto action_it = j.find("action");
    if (action_it == j.end() || !action_it->is_string()) return Error("missing \"action\" (a string)");
    const std::string action = action_it->get<std::string>();
    Request r;
    r.line = line_no;
    if (action == "alloc") {
      r.op = RequestOp::kAlloc;
      absl::StatusOr<std::string> id = Id(j);
      if (!id.ok()) return id.status();
      absl::StatusOr<std::uint64_t> size = Unsigned(j, "size", /*required=*/true);
      if (!size.ok()) return size.status();
      absl::StatusOr<std::uint64_t> stream = Unsigned(j, "stream", false);
      if (!stream.ok()) return stream.status();
      if (live_.contains(*id)) return Error(absl::StrCat("id \"", *id, "\" is already allocated"));
      r.slot = Slot(*id);
      live_.emplace(*id, r.slot);
      r.size = *size;
      r.stream = *stream;
      if (auto c = j.find("category"); c != j.end()) {
        std::optional<Category> category = c->is_string() ? ParseCategory(c->get<std::string>()) : std::nullopt;
        if (!category) {
          return Error(
              "\"category\" must be one of PARAMETER, OPTIMIZER_STATE, INPUT, ACTIVATION, GRADIENT, "
              "AUTOGRAD_DETAIL, TEMPORARY, DDP_BUCKET, COMM_TEMP, OTHER");
        }
        r.category = *category;
      }
      absl::StatusOr<std::uint32_t> owner = Text(j, "owner", false);
      if (!owner.ok()) return owner.status();
      r.text = *owner;
    } else if (action == "free" || action == "record_stream") {
      r.op = action == "free" ? RequestOp::kFree : RequestOp::kRecordStream;
      absl::StatusOr<std::string> id = Id(j);
      if (!id.ok()) return id.status();
      auto it = live_.find(*id);
      if (it == live_.end()) return Error(absl::StrCat(action, " of unknown id \"", *id, "\""));
      r.slot = it->second;
      if (r.op == RequestOp::kFree) {
        live_.erase(it);
      } else {
        absl::StatusOr<std::uint64_t> stream = Unsigned(j, "stream", true);
        if (!stream.ok()) return stream.status();
        r.stream = *stream;
      }
    } else if (action == "empty_cache") {
      r.op = RequestOp::kEmptyCache;
    } else if (action == "sync") {
      r.op = RequestOp::kSync;
      r.stream = kAllStreams;
      if (j.contains("stream")) {
        absl::StatusOr<std::uint64_t> stream = Unsigned(j, "stream", true);
        if (!stream.ok()) return stream.status();
        r.stream = *stream;
      }
    } else if (action == "phase_begin" || action == "phase_end") {
      r.op = action == "phase_begin" ? RequestOp::kPhaseBegin : RequestOp::kPhaseEnd;
      auto p = j.find("phase");
      std::optional<Phase> phase = p != j.end() && p->is_string() ? ParsePhase(p->get<std::string>()) : std::nullopt;
      if (!phase) {
        return Error("\"phase\" must be one of model, ddp, zero_grad, forward, loss, backward, step, user");
      }
      r.phase = *phase;
      if (j.contains("step")) {
        absl::StatusOr<std::uint64_t> step = Unsigned(j, "step", true);
        if (!step.ok()) return step.status();
        r.step = static_cast<std::int64_t>(*step);
      }
      absl::StatusOr<std::uint32_t> label = Text(j, "label", r.phase == Phase::kUser);
      if (!label.ok()) return label.status();
      r.text = *label;
    } else if (action == "mark") {
      r.op = RequestOp::kMark;
      absl::StatusOr<std::uint32_t> mark = Text(j, "text", true);
      if (!mark.ok()) return mark.status();
      r.text = *mark;
    } else {
      return Error(absl::StrCat("unknown action \"", action,
                                "\" (expected alloc, free, record_stream, empty_cache, sync, phase_begin, "
                                "phase_end or mark)"));
    }
    trace_.requests.push_back(r);
    return absl::OkStatus();
  }

  RequestTrace Take() { return std::move(trace_); }

 private:
  absl::Status Error(const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(trace_.source, ":", line_, ": ", what));
  }
  absl::StatusOr<std::string> Id(const json& j) const {
    auto it = j.find("id");
    if (it == j.end()) return Error("missing \"id\"");
    if (it->is_string()) return it->get<std::string>();
    if (it->is_number_integer()) return it->dump();
    return Error("\"id\" must be a string or an integer");
  }
  absl::StatusOr<std::uint64_t> Unsigned(const json& j, const char* key, bool required) const {
    auto it = j.find(key);
    if (it == j.end()) {
      if (required) return Error(absl::StrCat("missing \"", key, "\""));
      return 0;
    }
    if (it->is_number_unsigned()) return it->get<std::uint64_t>();
    if (it->is_number_integer() && it->get<std::int64_t>() >= 0)
      return static_cast<std::uint64_t>(it->get<std::int64_t>());
    return Error(absl::StrCat("\"", key, "\" must be a non-negative integer"));
  }
  // An optional (or required) string field, interned in trace.strings.
  absl::StatusOr<std::uint32_t> Text(const json& j, const char* key, bool required) {
    auto it = j.find(key);
    if (it == j.end()) {
      if (required) return Error(absl::StrCat("missing \"", key, "\""));
      return 0;
    }
    if (!it->is_string()) return Error(absl::StrCat("\"", key, "\" must be a string"));
    const std::string text = it->get<std::string>();
    if (text.empty()) return 0;
    auto [pos, inserted] = texts_.emplace(text, static_cast<std::uint32_t>(trace_.strings.size()));
    if (inserted) trace_.strings.push_back(text);
    return pos->second;
  }
  std::uint32_t Slot(const std::string& id) {
    auto [it, inserted] = slots_.emplace(id, static_cast<std::uint32_t>(trace_.ids.size()));
    if (inserted) trace_.ids.push_back(id);
    return it->second;
  }

  RequestTrace trace_;
  std::uint64_t line_ = 0;
  absl::flat_hash_map<std::string, std::uint32_t> slots_;  // id -> slot (ids keep their slot when reused)
  absl::flat_hash_map<std::string, std::uint32_t> live_;   // allocated ids
  absl::flat_hash_map<std::string, std::uint32_t> texts_;  // strings -> index
};

}  // namespace

absl::StatusOr<RequestTrace> ReadJsonlTrace(std::istream& in, const std::string& source) {
  Reader reader(source);
  std::string text;
  std::uint64_t line = 0;
  std::uint64_t bytes = 0;
  for (LineRead read; (read = ReadBoundedLine(in, text, kMaxTraceLineBytes)) != LineRead::kEnd;) {
    if (absl::Status s = CheckTraceLine(source, ++line, read, bytes += text.size() + 1); !s.ok()) return s;
    if (absl::Status s = reader.Line(text, line); !s.ok()) return s;
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat(source, ": read error after line ", line));
  return reader.Take();
}

absl::Status CheckTraceLine(const std::string& source, std::uint64_t line, LineRead read, std::uint64_t bytes) {
  if (read == LineRead::kTooLong) {
    return absl::InvalidArgumentError(absl::StrCat(source, ":", line, ": a line of more than ",
                                                   kMaxTraceLineBytes >> 20, " MiB (the request trace line limit)"));
  }
  if (bytes > kMaxTraceFileBytes) return InputTooLarge(source, "request trace", 0, kMaxTraceFileBytes);
  return absl::OkStatus();
}

absl::StatusOr<RequestTrace> ReadJsonlTraceFile(const std::string& path) {
  if (absl::Status s = CheckInputFileSize(path, "request trace", kMaxTraceFileBytes); !s.ok()) return s;
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open trace '", path, "'"));
  return ReadJsonlTrace(in, path);
}

std::string RequestTrace::IdOf(std::uint32_t slot) const {
  if (address_ids.empty()) return slot < ids.size() ? ids[slot] : std::string();
  if (slot >= address_ids.size()) return std::string();
  const std::uint64_t addr = address_ids[slot];
  char text[18] = {'0', 'x'};  // absl::Hex's digits, without its formatting machinery
  std::size_t n = 2;
  for (int shift = (addr == 0 ? 0 : (63 - std::countl_zero(addr)) / 4 * 4); shift >= 0; shift -= 4) {
    text[n++] = "0123456789abcdef"[(addr >> shift) & 15];
  }
  return std::string(text, n);
}

std::uint64_t PeakLiveBytes(const RequestTrace& trace) {
  std::vector<std::uint64_t> size(trace.slot_count(), 0);
  std::uint64_t live = 0;
  for (const RequestTrace::StartBlock& b : trace.start_blocks) {  // alive when the trace starts
    size[b.alloc.slot] = b.alloc.size;
    live += b.alloc.size;
  }
  std::uint64_t peak = live;
  for (const Request& r : trace.requests) {
    if (r.op == RequestOp::kAlloc) {
      size[r.slot] = r.size;
      live += r.size;
      peak = std::max(peak, live);
    } else if (r.op == RequestOp::kFree) {
      live -= size[r.slot];
      size[r.slot] = 0;
    }
  }
  return peak;
}

RequestTrace DemoTrace() {
  RequestTrace t;
  t.source = "<embedded demo>";
  std::uint64_t line = 0;
  auto slot = [&](const std::string& id) {
    t.ids.push_back(id);
    return static_cast<std::uint32_t>(t.ids.size() - 1);
  };
  Category category = Category::kOther;
  std::uint32_t owner = 0;
  std::vector<std::uint32_t> layer_owner;  // layer -> index of "layer<l>" in t.strings
  auto set_owner = [&](int layer) {
    t.strings.push_back(absl::StrCat("layer", layer));
    layer_owner.push_back(static_cast<std::uint32_t>(t.strings.size() - 1));
    owner = layer_owner.back();
  };
  auto alloc = [&](std::uint32_t s, std::size_t size) {
    Request r{.op = RequestOp::kAlloc, .slot = s, .size = size, .line = ++line};
    r.category = category;
    r.text = owner;
    t.requests.push_back(r);
  };
  auto free = [&](std::uint32_t s) { t.requests.push_back({.op = RequestOp::kFree, .slot = s, .line = ++line}); };
  auto phase = [&](RequestOp op, Phase p, std::int64_t step) {
    Request r{.op = op, .line = ++line};
    r.phase = p;
    r.step = step;
    t.requests.push_back(r);
  };

  constexpr int kLayers = 12;
  // Parameters: 12 layers of a 24 MiB weight and a 16 KiB bias.
  phase(RequestOp::kPhaseBegin, Phase::kModel, kNoStep);
  category = Category::kParameter;
  for (int l = 0; l < kLayers; ++l) {
    set_owner(l);
    alloc(slot(absl::StrCat("layer", l, ".weight")), 24 * kMiB);
    alloc(slot(absl::StrCat("layer", l, ".bias")), 16 * 1024);
  }
  phase(RequestOp::kPhaseEnd, Phase::kModel, kNoStep);
  // Steps with a batch that grows by one sample each step: the activations
  // of step k are a little larger than those cached by step k-1.
  for (int step = 0; step < 8; ++step) {
    const std::size_t batch = 32 + static_cast<std::size_t>(step);
    std::vector<std::uint32_t> acts;
    phase(RequestOp::kPhaseBegin, Phase::kForward, step);
    for (int l = 0; l < kLayers; ++l) {
      const std::uint32_t a = slot(absl::StrCat("step", step, ".act", l));
      category = Category::kActivation;
      owner = layer_owner[static_cast<std::size_t>(l)];
      alloc(a, batch * (kMiB + 300 * 1024));  // saved activation, ~1.3 MiB per sample
      acts.push_back(a);
      const std::uint32_t tmp = slot(absl::StrCat("step", step, ".tmp", l));
      category = Category::kTemporary;
      alloc(tmp, batch * 96 * 1024);  // workspace, freed at once
      free(tmp);
    }
    phase(RequestOp::kPhaseEnd, Phase::kForward, step);
    phase(RequestOp::kPhaseBegin, Phase::kBackward, step);
    category = Category::kAutogradDetail;
    for (int l = kLayers - 1; l >= 0; --l) {
      owner = layer_owner[static_cast<std::size_t>(l)];
      const std::uint32_t g = slot(absl::StrCat("step", step, ".grad_act", l));
      alloc(g, batch * (kMiB + 300 * 1024));
      free(acts[static_cast<std::size_t>(l)]);
      free(g);
    }
    phase(RequestOp::kPhaseEnd, Phase::kBackward, step);
  }
  return t;
}

}  // namespace memscope
