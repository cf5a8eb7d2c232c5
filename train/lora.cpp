#include "train/lora.h"

#include <cmath>
#include <regex>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/input_file.h"

namespace memscope {
namespace {

using json = nlohmann::json;

struct ConfigError {
  std::string message;
};

bool EndsWithComponent(const std::string& key, const std::string& name) {
  return key == name || absl::EndsWith(key, "." + name);
}

// PEFT's ECMAScript-compatible subset of Python's re: std::regex, matched whole (re.fullmatch).
bool FullMatch(const std::string& pattern, const std::string& key) {
  return std::regex_match(key, std::regex(pattern, std::regex::ECMAScript));
}

// A list of names or a regex (target_modules, exclude_modules); null is none.
void NamesOrRegex(const json& v, const char* field, std::vector<std::string>& list, std::string& regex,
                  bool& is_regex) {
  if (v.is_null()) return;
  if (v.is_string()) {
    regex = v.get<std::string>();
    is_regex = true;
    try {
      std::regex check(regex, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      throw ConfigError{absl::StrCat("field \"", field, "\": \"", regex, "\" is not a regular expression")};
    }
    return;
  }
  if (!v.is_array()) throw ConfigError{absl::StrCat("field \"", field, "\": expected a list of module names or a regex")};
  for (const json& e : v) {
    if (!e.is_string() || e.get<std::string>().empty())
      throw ConfigError{absl::StrCat("field \"", field, "\": expected a list of module names or a regex")};
    list.push_back(e.get<std::string>());
  }
}

// A field that memscope accepts only at its default (null, false, {} or []):
// it changes what PEFT builds in a way not modelled.
void OnlyDefault(const json& c, const char* field, const char* what) {
  if (!c.contains(field)) return;
  const json& v = c[field];
  const bool is_default = v.is_null() || (v.is_boolean() && !v.get<bool>()) || (v.is_object() && v.empty()) ||
                          (v.is_array() && v.empty());
  if (!is_default) throw ConfigError{absl::StrCat("field \"", field, "\": ", v.dump(), " is not modelled (", what, ")")};
}

double Number(const json& c, const char* field, double def) {
  if (!c.contains(field) || c[field].is_null()) return def;
  if (!c[field].is_number()) throw ConfigError{absl::StrCat("field \"", field, "\": expected a number")};
  return c[field].get<double>();
}

bool Flag(const json& c, const char* field) {
  if (!c.contains(field) || c[field].is_null()) return false;
  if (!c[field].is_boolean()) throw ConfigError{absl::StrCat("field \"", field, "\": expected true or false")};
  return c[field].get<bool>();
}

void CheckFields(const json& c) {
  // Fields PEFT writes that change nothing memscope models (names, versions,
  // initialisation, inference flags), or are checked below.
  static const std::set<std::string> known = {
      "r", "lora_alpha", "lora_dropout", "target_modules", "exclude_modules", "bias", "modules_to_save",
      "use_rslora", "fan_in_fan_out", "lora_bias", "peft_type", "task_type", "base_model_name_or_path",
      "revision", "inference_mode", "init_lora_weights", "auto_mapping", "megatron_config", "megatron_core",
      "loftq_config", "runtime_config", "use_dora", "alpha_pattern", "rank_pattern", "layers_to_transform",
      "layers_pattern", "layer_replication", "eva_config", "corda_config", "use_qalora", "qalora_group_size",
      "target_parameters", "trainable_token_indices", "alora_invocation_tokens", "arrow_config",
      "ensure_weight_tying", "peft_version"};
  for (auto it = c.begin(); it != c.end(); ++it) {
    if (known.count(it.key()) == 0) throw ConfigError{absl::StrCat("unknown field \"", it.key(), "\"")};
  }
  OnlyDefault(c, "use_dora", "DoRA");
  OnlyDefault(c, "alpha_pattern", "per-module alphas");
  OnlyDefault(c, "rank_pattern", "per-module ranks");
  OnlyDefault(c, "layers_to_transform", "adapters on some layers only");
  OnlyDefault(c, "layers_pattern", "adapters on some layers only");
  OnlyDefault(c, "layer_replication", "replicated layers");
  OnlyDefault(c, "use_qalora", "QALoRA");
  OnlyDefault(c, "target_parameters", "LoRA on parameters");
  OnlyDefault(c, "trainable_token_indices", "trainable tokens");
  OnlyDefault(c, "alora_invocation_tokens", "activated LoRA");
  OnlyDefault(c, "arrow_config", "Arrow routing");
  OnlyDefault(c, "megatron_config", "Megatron layers");
  OnlyDefault(c, "eva_config", "EVA initialisation");
  OnlyDefault(c, "corda_config", "CorDA initialisation");
}

LoraConfig Parse(const json& c) {
  if (!c.is_object()) throw ConfigError{"expected a JSON object (PEFT's adapter_config.json)"};
  CheckFields(c);
  LoraConfig l;
  if (c.contains("peft_type") && !c["peft_type"].is_null() && c["peft_type"] != "LORA")
    throw ConfigError{absl::StrCat("field \"peft_type\": ", c["peft_type"].dump(), " is not LORA")};
  if (c.contains("r")) {
    if (!c["r"].is_number_integer() || c["r"].get<std::int64_t>() < 1 || c["r"].get<std::int64_t>() > (1 << 20))
      throw ConfigError{"field \"r\": expected a positive integer"};
    l.r = c["r"].get<std::int64_t>();
  }
  l.lora_alpha = Number(c, "lora_alpha", 8);
  l.lora_dropout = Number(c, "lora_dropout", 0);
  if (l.lora_dropout < 0 || l.lora_dropout >= 1) throw ConfigError{"field \"lora_dropout\": expected 0 <= p < 1"};
  l.use_rslora = Flag(c, "use_rslora");
  l.lora_bias = Flag(c, "lora_bias");
  Flag(c, "fan_in_fan_out");  // PEFT resets it to false on nn.Linear (Conv1D is not modelled): no effect
  const std::string bias = c.contains("bias") && c["bias"].is_string() ? c["bias"].get<std::string>() : "none";
  if (c.contains("bias") && !c["bias"].is_null() && (!c["bias"].is_string() || bias != "none"))
    throw ConfigError{absl::StrCat("field \"bias\": ", c["bias"].dump(),
                                   " is not modelled (only \"none\": the base model's biases stay frozen)")};
  if (!c.contains("target_modules") || c["target_modules"].is_null())
    throw ConfigError{"missing field \"target_modules\" (PEFT's defaults per model type are not modelled)"};
  const json& t = c["target_modules"];
  if (t.is_string() && t.get<std::string>() == "all-linear") {
    l.all_linear = true;
  } else {
    NamesOrRegex(t, "target_modules", l.target_list, l.target_regex, l.target_is_regex);
    if (!l.target_is_regex && l.target_list.empty()) throw ConfigError{"field \"target_modules\": an empty list"};
  }
  if (c.contains("exclude_modules"))
    NamesOrRegex(c["exclude_modules"], "exclude_modules", l.exclude_list, l.exclude_regex, l.exclude_is_regex);
  if (c.contains("modules_to_save") && !c["modules_to_save"].is_null()) {
    std::string unused;
    bool regex = false;
    NamesOrRegex(c["modules_to_save"], "modules_to_save", l.modules_to_save, unused, regex);
    if (regex) throw ConfigError{"field \"modules_to_save\": expected a list of module names"};
  }
  if (c.contains("task_type") && c["task_type"].is_string()) {
    const std::string task = c["task_type"].get<std::string>();
    // PeftModelForSequenceClassification / ...TokenClassification save their heads.
    if (task == "SEQ_CLS" || task == "TOKEN_CLS") {
      for (const char* head : {"classifier", "score"}) l.modules_to_save.push_back(head);
    }
  }
  return l;
}

}  // namespace

double LoraConfig::Scaling() const {
  return use_rslora ? lora_alpha / std::sqrt(static_cast<double>(r)) : lora_alpha / static_cast<double>(r);
}

bool LoraConfig::Targets(const std::string& key) const {
  // tuners_utils.check_target_module_exists: exclusions first, then modules
  // to save and what is inside them, then the targets.
  if (exclude_is_regex && FullMatch(exclude_regex, key)) return false;
  for (const std::string& e : exclude_list) {
    if (EndsWithComponent(key, e)) return false;
  }
  for (const std::string& m : modules_to_save) {
    if (EndsWithComponent(key, m) || absl::StrContains(absl::StrCat(".", key, "."), absl::StrCat(".", m, "."))) {
      return false;
    }
  }
  if (all_linear) return true;
  if (target_is_regex) return FullMatch(target_regex, key);
  for (const std::string& t : target_list) {
    if (EndsWithComponent(key, t)) return true;
  }
  return false;
}

bool LoraConfig::Saves(const std::string& key) const {
  for (const std::string& m : modules_to_save) {
    if (absl::EndsWith(key, m)) return true;  // PEFT's _set_trainable: key.endswith(name)
  }
  return false;
}

absl::StatusOr<LoraConfig> ParseLoraConfig(const json& config, std::string_view source) {
  try {
    LoraConfig l = Parse(config);
    l.source = std::string(source);
    return l;
  } catch (const ConfigError& e) {
    return absl::InvalidArgumentError(absl::StrCat("adapter config ", std::string(source), ": ", e.message));
  }
}

absl::StatusOr<LoraConfig> LoadLoraConfig(std::string_view path) {
  absl::StatusOr<std::string> text = ReadInputFile(path, "adapter config", kMaxLoraConfigBytes);
  if (!text.ok()) return text.status();
  json config = json::parse(*text, nullptr, false);
  if (config.is_discarded()) return absl::InvalidArgumentError(absl::StrCat("adapter config ", std::string(path), ": not JSON"));
  return ParseLoraConfig(config, path);
}

}  // namespace memscope
