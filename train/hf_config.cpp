#include "train/hf_config.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/input_file.h"
#include "train/model_file.h"

namespace memscope {
namespace {

using json = nlohmann::json;

struct ConfigError {
  std::string message;
};

// A config field: an integer (required unless `def`).
std::int64_t Int(const json& c, const char* field, std::optional<std::int64_t> def = std::nullopt) {
  if (!c.contains(field) || c[field].is_null()) {
    if (def) return *def;
    throw ConfigError{absl::StrCat("missing field \"", field, "\"")};
  }
  if (!c[field].is_number_integer() || c[field].get<std::int64_t>() < 0)
    throw ConfigError{absl::StrCat("field \"", field, "\": expected a non-negative integer")};
  return c[field].get<std::int64_t>();
}

double Num(const json& c, const char* field, double def) {
  if (!c.contains(field) || c[field].is_null()) return def;
  if (!c[field].is_number()) throw ConfigError{absl::StrCat("field \"", field, "\": expected a number")};
  return c[field].get<double>();
}

bool Bool(const json& c, const char* field, bool def) {
  if (!c.contains(field) || c[field].is_null()) return def;
  if (!c[field].is_boolean()) throw ConfigError{absl::StrCat("field \"", field, "\": expected true or false")};
  return c[field].get<bool>();
}

std::string Str(const json& c, const char* field, const std::string& def) {
  if (!c.contains(field) || c[field].is_null()) return def;
  if (!c[field].is_string()) throw ConfigError{absl::StrCat("field \"", field, "\": expected a string")};
  return c[field].get<std::string>();
}

// The architecture the config names (the first of "architectures"), or the
// family's first when it names none; one memscope does not build is an error
// that names those it does.
std::string Architecture(const json& c, const std::vector<std::string>& supported) {
  if (!c.contains("architectures") || c["architectures"].is_null()) return supported.front();
  const json& a = c["architectures"];
  if (!a.is_array() || a.empty() || !a[0].is_string())
    throw ConfigError{"field \"architectures\": expected a list of class names"};
  const std::string arch = a[0].get<std::string>();
  if (std::find(supported.begin(), supported.end(), arch) == supported.end()) {
    throw ConfigError{absl::StrCat("field \"architectures\": \"", arch, "\" is not modelled for model_type \"",
                                   c["model_type"].get<std::string>(), "\" (", absl::StrJoin(supported, ", "), ")")};
  }
  return arch;
}

// A classification head's labels and loss (PretrainedConfig: num_labels or
// id2label, default 2; problem_type, by default regression for one label and
// single-label classification otherwise).
struct Labels {
  std::int64_t count = 2;
  bool regression = false;
};
std::int64_t LabelCount(const json& c) {
  std::int64_t count = 2;
  if (c.contains("num_labels") && !c["num_labels"].is_null()) {
    count = Int(c, "num_labels");
  } else if (c.contains("id2label") && c["id2label"].is_object()) {
    count = static_cast<std::int64_t>(c["id2label"].size());
  }
  if (count < 1) throw ConfigError{"field \"num_labels\": expected at least 1"};
  return count;
}
Labels ClassificationLabels(const json& c) {
  Labels l;
  l.count = LabelCount(c);
  const std::string problem = Str(c, "problem_type", l.count == 1 ? "regression" : "single_label_classification");
  if (problem == "multi_label_classification")
    throw ConfigError{"field \"problem_type\": multi_label_classification (BCEWithLogitsLoss) is not modelled"};
  if (problem != "regression" && problem != "single_label_classification")
    throw ConfigError{absl::StrCat("field \"problem_type\": \"", problem,
                                   "\" is not one of regression, single_label_classification")};
  l.regression = problem == "regression";
  return l;
}

// The target and loss of a head over `shape` logits (BertForSequenceClassification's
// CrossEntropyLoss, or MSELoss of logits.squeeze() for regression).
json LabelHead(json layers, const Labels& l, const json& shape) {
  json head = {{"layers", std::move(layers)}};
  if (l.regression) {
    json target_shape = shape;
    target_shape.push_back(l.count);
    head["target"] = {{"shape", target_shape}, {"dtype", "float32"}};
    head["loss"] = {{"type", "mse"}};
  } else {
    head["target"] = {{"shape", shape}, {"classes", l.count}};
    head["loss"] = {{"type", "cross_entropy"}};
  }
  return head;
}

// A *ForTokenClassification head: cross-entropy over every token, whatever
// problem_type says (transformers ignores it there); `upcast`: on
// logits.float() (the loss_function of transformers 4.46's Llama family).
json TokenHead(json layers, std::int64_t labels, bool upcast) {
  json loss = {{"type", "cross_entropy"}};
  if (upcast) loss["upcast"] = true;
  return {{"layers", std::move(layers)},
          {"target", {{"shape", {"batch", "seq"}}, {"classes", labels}}},
          {"loss", std::move(loss)}};
}

// Whether a decoder's `arch` returns past_key_values with its output
// (*ForCausalLM, *ForSequenceClassification); the token-classification and
// question-answering heads build the cache (use_cache) and drop it when
// forward returns.
bool ReturnsCache(const std::string& arch) {
  return !arch.ends_with("ForTokenClassification") && !arch.ends_with("ForQuestionAnswering");
}

// The attention's "cache" field for use_cache and the head `arch`.
json CacheField(bool use_cache, const std::string& arch) {
  if (!use_cache) return false;
  return ReturnsCache(arch) ? json(true) : json("forward");
}

// The head of a decoder's `arch` other than *ForCausalLM (transformers 4.46:
// GPT2For*, LlamaFor*, MistralFor*, Qwen2For*) on the hidden states of its
// trunk (GPT2Model, LlamaModel), which does not run the lm_head: the last
// top-level layer ("heads" of one head).
json DecoderHead(const json& c, const std::string& arch, bool llama) {
  json head;
  if (arch.ends_with("ForQuestionAnswering")) {
    // qa_outputs: Linear(hidden, 2), whatever num_labels says; the loss as BERT's.
    head = {{"layers", {{{"type", "linear"}, {"name", "qa_outputs"}, {"out", 2}}}}, {"loss", {{"type", "span"}}}};
  } else if (arch.ends_with("ForSequenceClassification")) {
    // score: Linear(hidden, num_labels, bias=False) on every token, then the
    // logits of each row's last non-padding token (pooled_logits), which the
    // loss (problem_type) reads.
    const Labels labels = ClassificationLabels(c);
    json last = {{"type", "last_token"}};
    if (c.contains("pad_token_id") && !c["pad_token_id"].is_null()) last["pad_token_id"] = Int(c, "pad_token_id");
    head = LabelHead({{{"type", "linear"}, {"name", "score"}, {"out", labels.count}, {"bias", false}}, last}, labels,
                     {"batch"});
  } else {
    // *ForTokenClassification: dropout (classifier_dropout, else
    // hidden_dropout, else 0.1), then a linear with bias: GPT-2's
    // "classifier", the Llama family's "score".
    const std::int64_t labels = LabelCount(c);
    const double p = Num(c, "classifier_dropout", Num(c, "hidden_dropout", 0.1));
    head = TokenHead({{{"type", "dropout"}, {"p", p}},
                      {{"type", "linear"}, {"name", llama ? "score" : "classifier"}, {"out", labels}}},
                     labels, llama);
  }
  return {{"type", "heads"}, {"heads", json::array({head})}};
}

json Base(const std::string& name, std::int64_t positions) {
  return {{"format", "memscope.model/1"},
          {"name", name},
          {"batch_size", 1},
          {"seq_len", std::min<std::int64_t>(1024, positions)}};
}

// GPT2LMHeadModel and the heads GPT2For{SequenceClassification,
// TokenClassification,QuestionAnswering} (transformers 4.46, eager attention).
json Gpt2(const json& c, const std::string& name) {
  const std::string arch = Architecture(c, {"GPT2LMHeadModel", "GPT2ForSequenceClassification",
                                            "GPT2ForTokenClassification", "GPT2ForQuestionAnswering"});
  const std::int64_t d = Int(c, "n_embd"), layers = Int(c, "n_layer"), heads = Int(c, "n_head");
  const std::int64_t positions = Int(c, "n_positions", 1024), vocab = Int(c, "vocab_size");
  const std::int64_t inner = Int(c, "n_inner", 4 * d);
  const double eps = Num(c, "layer_norm_epsilon", 1e-5);
  const double resid = Num(c, "resid_pdrop", 0.1), embd = Num(c, "embd_pdrop", 0.1), attn = Num(c, "attn_pdrop", 0.1);
  const std::string act = Str(c, "activation_function", "gelu_new");
  // use_cache (default true, and on in training without checkpointing): each
  // attention returns present = (key, value), kept in past_key_values.
  const bool use_cache = Bool(c, "use_cache", true);
  json activation = act == "gelu_new" ? json{{"type", "gelu_new"}}
                    : act == "gelu"   ? json{{"type", "gelu"}}
                    : act == "relu"   ? json{{"type", "relu"}}
                                      : json();
  if (activation.is_null())
    throw ConfigError{absl::StrCat("field \"activation_function\": \"", act, "\" is not modelled")};
  json block = {{"type", "block"},
                {"checkpoint", true},
                {"layers",
                 {{{"type", "residual"},
                   {"keep", true},
                   {"body",
                    {{{"type", "layer_norm"}, {"name", "ln_1"}, {"eps", eps}},
                     {{"type", "attention"},
                      {"name", "attn"},
                      {"heads", heads},
                      {"projection", "fused_conv1d"},
                      {"mask", "buffer"},
                      {"max_positions", positions},
                      {"dropout", attn},
                      {"out_dropout", resid},
                      {"cache", CacheField(use_cache, arch)}}}}},
                  {{"type", "residual"},
                   {"order", "input_first"},
                   {"keep", true},
                   {"body",
                    {{{"type", "layer_norm"}, {"name", "ln_2"}, {"eps", eps}},
                     {{"type", "sequential"},
                      {"name", "mlp"},
                      {"layers",
                       {{{"type", "conv1d"}, {"name", "c_fc"}, {"out", inner}},
                        activation,
                        {{"type", "conv1d"}, {"name", "c_proj"}, {"out", d}}}}},
                     {{"type", "dropout"}, {"p", resid}}}}}}}};
  json spec = Base(name, positions);
  spec["input"] = {{"shape", {"batch", "seq"}}, {"vocab", vocab}};
  // GPT2Model.forward is a block: its locals (the embeddings) live until it returns.
  spec["layers"] = {
      {{"type", "block"},
       {"name", "transformer"},
       {"layers",
        {{{"type", "embedding"},
          {"name", "wte"},
          {"num", vocab},
          {"dim", d},
          {"positions", {{"name", "wpe"}, {"num", positions}}}},
         {{"type", "dropout"}, {"p", embd}},
         {{"type", "repeat"}, {"name", "h"}, {"count", layers}, {"body", block}},
         {{"type", "layer_norm"}, {"name", "ln_f"}, {"eps", eps}}}}}};
  if (arch != "GPT2LMHeadModel") {
    spec["layers"].push_back(DecoderHead(c, arch, false));
    return spec;
  }
  spec["target"] = {{"from", "input"}};
  spec["loss"] = {{"type", "cross_entropy"}, {"shift", true}};
  spec["layers"].push_back(
      {{"type", "linear"}, {"name", "lm_head"}, {"out", vocab}, {"bias", false}, {"tie", "transformer.wte"}});
  return spec;
}

// LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM and their
// *ForSequenceClassification, *ForTokenClassification and
// *ForQuestionAnswering (transformers 4.46, eager attention).
json Llama(const json& c, const std::string& name, const std::string& type) {
  const std::string family = type == "llama" ? "Llama" : type == "mistral" ? "Mistral" : "Qwen2";
  const std::string arch =
      Architecture(c, {family + "ForCausalLM", family + "ForSequenceClassification",
                       family + "ForTokenClassification", family + "ForQuestionAnswering"});
  const std::int64_t d = Int(c, "hidden_size"), layers = Int(c, "num_hidden_layers");
  const std::int64_t heads = Int(c, "num_attention_heads"), kv = Int(c, "num_key_value_heads", heads);
  const std::int64_t head_dim = Int(c, "head_dim", heads > 0 ? d / heads : 0);
  const std::int64_t inner = Int(c, "intermediate_size"), vocab = Int(c, "vocab_size");
  const std::int64_t positions = Int(c, "max_position_embeddings", 2048);
  const double eps = Num(c, "rms_norm_eps", 1e-6);
  const bool tied = Bool(c, "tie_word_embeddings", false);
  // Qwen2 has biases on q, k and v (not o); Llama's attention_bias covers all four.
  const bool qkv_bias = type == "qwen2" ? true : Bool(c, "attention_bias", false);
  const bool o_bias = type == "qwen2" ? false : Bool(c, "attention_bias", false);
  const std::string act = Str(c, "hidden_act", "silu");
  if (act != "silu") throw ConfigError{absl::StrCat("field \"hidden_act\": \"", act, "\" is not modelled (silu)")};
  const double attn_dropout = Num(c, "attention_dropout", 0);
  json block = {
      {"type", "block"},
      {"checkpoint", true},
      {"layers",
       {{{"type", "residual"},
         {"order", "input_first"},
         {"body",
          {{{"type", "rms_norm"}, {"name", "input_layernorm"}, {"eps", eps}},
           {{"type", "attention"},
            {"name", "self_attn"},
            {"heads", heads},
            {"kv_heads", kv},
            {"head_dim", head_dim},
            {"rotary", true},
            {"cache", CacheField(Bool(c, "use_cache", true), arch)},
            {"causal", true},
            {"bias", qkv_bias},
            {"out_bias", o_bias},
            {"dropout", attn_dropout}}}}},
        {{"type", "residual"},
         {"order", "input_first"},
         {"body",
          {{{"type", "rms_norm"}, {"name", "post_attention_layernorm"}, {"eps", eps}},
           {{"type", "gated_mlp"}, {"name", "mlp"}, {"hidden", inner}, {"bias", Bool(c, "mlp_bias", false)}}}}}}}};
  // LlamaForQuestionAnswering and Qwen2's hold the trunk as `transformer`
  // (base_model_prefix), the others (Mistral's too) as `model`.
  const std::string trunk =
      arch.ends_with("ForQuestionAnswering") && type != "mistral" ? "transformer" : "model";
  json spec = Base(name, positions);
  spec["input"] = {{"shape", {"batch", "seq"}}, {"vocab", vocab}};
  // LlamaModel.forward: a block (its locals die when it returns), with the
  // cache position, causal mask and rotary embeddings after embed_tokens.
  spec["layers"] = {{{"type", "block"},
                     {"name", trunk},
                     {"rotary_prologue", head_dim},
                     {"layers",
                      {{{"type", "embedding"}, {"name", "embed_tokens"}, {"num", vocab}, {"dim", d}},
                       {{"type", "repeat"}, {"name", "layers"}, {"count", layers}, {"body", block}},
                       {{"type", "rms_norm"}, {"name", "norm"}, {"eps", eps}}}}}};
  if (!arch.ends_with("ForCausalLM")) {
    spec["layers"].push_back(DecoderHead(c, arch, true));
    return spec;
  }
  json head = {{"type", "linear"}, {"name", "lm_head"}, {"out", vocab}, {"bias", false}};
  if (tied) head["tie"] = "model.embed_tokens";
  spec["target"] = {{"from", "input"}};
  spec["loss"] = {{"type", "cross_entropy"}, {"shift", true}};
  spec["layers"].push_back(head);
  return spec;
}

// BertForPreTraining (bert) and RobertaForMaskedLM (roberta), eager attention.
// The heads of a BERT or RoBERTa `arch` over its trunk (the pooler, when
// the head uses it, is in the trunk: a branch "pooled_output").
json BertHeads(const json& c, const std::string& arch, bool roberta, std::int64_t d, std::int64_t vocab, double eps,
               double p) {
  const std::string prefix = roberta ? "roberta" : "bert";
  const bool pretraining = arch == "BertForPreTraining", masked_lm = arch.ends_with("ForMaskedLM");
  const bool qa = arch.ends_with("ForQuestionAnswering");
  const bool sequence = arch.ends_with("ForSequenceClassification"), token = arch.ends_with("ForTokenClassification");
  const std::string word = prefix + ".embeddings.word_embeddings";
  json mlm = {{{"type", "sequential"},
               {"name", roberta ? "lm_head" : "cls.predictions"},
               {"layers",
                {{{"type", "linear"}, {"name", roberta ? "dense" : "transform.dense"}, {"out", d}},
                 {{"type", "gelu"}},
                 {{"type", "layer_norm"}, {"name", roberta ? "layer_norm" : "transform.LayerNorm"}, {"eps", eps}},
                 {{"type", "linear"}, {"name", "decoder"}, {"out", vocab}, {"tie", word}}}}}};
  json head_list = json::array();
  if (pretraining || masked_lm) {
    head_list.push_back({{"layers", mlm},
                         {"target", {{"shape", {"batch", "seq"}}, {"classes", vocab}}},
                         {"loss", {{"type", "cross_entropy"}}}});
  }
  if (pretraining) {
    // The next-sentence classifier on the pooler's output.
    head_list.push_back({{"layers",
                          {{{"type", "take"}, {"from", "pooled_output"}},
                           {{"type", "linear"}, {"name", "cls.seq_relationship"}, {"out", 2}}}},
                         {"target", {{"shape", {"batch"}}, {"classes", 2}}},
                         {"loss", {{"type", "cross_entropy"}}}});
  }
  if (qa) {
    // qa_outputs: Linear(hidden, num_labels), num_labels 2 (start, end).
    const std::int64_t labels = Int(c, "num_labels", 2);
    if (labels != 2)
      throw ConfigError{absl::StrCat("field \"num_labels\": ", labels, " for question answering (2: start and end)")};
    head_list.push_back({{"layers", {{{"type", "linear"}, {"name", "qa_outputs"}, {"out", 2}}}},
                         {"loss", {{"type", "span"}}}});
  }
  if (token) {
    // *ForTokenClassification: dropout(sequence_output), classifier.
    const std::int64_t labels = LabelCount(c);
    head_list.push_back(TokenHead({{{"type", "dropout"}, {"p", Num(c, "classifier_dropout", p)}},
                                   {{"type", "linear"}, {"name", "classifier"}, {"out", labels}}},
                                  labels, false));
  }
  if (sequence) {
    const Labels labels = ClassificationLabels(c);
    const double classifier_p = Num(c, "classifier_dropout", p);
    json head_layers;
    if (roberta) {
      // RobertaClassificationHead: features[:, 0, :], dropout, dense, tanh, dropout, out_proj.
      head_layers = {{{"type", "select_token"}, {"index", 0}},
                     {{"type", "dropout"}, {"p", classifier_p}},
                     {{"type", "linear"}, {"name", "classifier.dense"}, {"out", d}},
                     {{"type", "tanh"}},
                     {{"type", "dropout"}, {"p", classifier_p}},
                     {{"type", "linear"}, {"name", "classifier.out_proj"}, {"out", labels.count}}};
    } else {
      // BertForSequenceClassification: dropout(pooled_output), classifier.
      head_layers = {{{"type", "take"}, {"from", "pooled_output"}},
                     {{"type", "dropout"}, {"p", classifier_p}},
                     {{"type", "linear"}, {"name", "classifier"}, {"out", labels.count}}};
    }
    head_list.push_back(LabelHead(head_layers, labels, {"batch"}));
  }
  return head_list;
}

// BERT and RoBERTa (transformers 4.4x, eager attention), with the head its
// "architectures" names.
json Bert(const json& c, const std::string& name, bool roberta) {
  const std::string prefix = roberta ? "roberta" : "bert";
  const std::string arch =
      roberta ? Architecture(c, {"RobertaForMaskedLM", "RobertaForSequenceClassification",
                                 "RobertaForTokenClassification", "RobertaForQuestionAnswering"})
              : Architecture(c, {"BertForPreTraining", "BertForMaskedLM", "BertForSequenceClassification",
                                 "BertForTokenClassification", "BertForQuestionAnswering"});
  // BertModel's pooler: for the heads that use it.
  const bool pooler = arch == "BertForPreTraining" || arch.ends_with("ForSequenceClassification");
  const std::int64_t d = Int(c, "hidden_size"), layers = Int(c, "num_hidden_layers");
  const std::int64_t heads = Int(c, "num_attention_heads"), inner = Int(c, "intermediate_size");
  const std::int64_t vocab = Int(c, "vocab_size"), positions = Int(c, "max_position_embeddings", 512);
  const std::int64_t types = Int(c, "type_vocab_size", 2), pad = Int(c, "pad_token_id", roberta ? 1 : 0);
  const double eps = Num(c, "layer_norm_eps", 1e-12), p = Num(c, "hidden_dropout_prob", 0.1);
  const double attn_p = Num(c, "attention_probs_dropout_prob", 0.1);
  const std::string act = Str(c, "hidden_act", "gelu");
  if (act != "gelu") throw ConfigError{absl::StrCat("field \"hidden_act\": \"", act, "\" is not modelled (gelu)")};
  json position_table = {{"name", "position_embeddings"}, {"num", positions}};
  if (roberta) position_table["padding_idx"] = pad;
  json block = {{"type", "block"},
                {"checkpoint", true},
                {"layers",
                 {{{"type", "residual"},
                   {"body",
                    {{{"type", "attention"},
                      {"name", "attention"},
                      {"heads", heads},
                      {"causal", false},
                      {"mask", "additive"},
                      {"dropout", attn_p},
                      {"names", {{"q", "self.query"}, {"k", "self.key"}, {"v", "self.value"}, {"o", "output.dense"}}}},
                     {{"type", "dropout"}, {"p", p}}}},
                   {"then", {{{"type", "layer_norm"}, {"name", "attention.output.LayerNorm"}, {"eps", eps}}}}},
                  {{"type", "residual"},
                   {"body",
                    {{{"type", "linear"}, {"name", "intermediate.dense"}, {"out", inner}},
                     {{"type", "gelu"}},
                     {{"type", "linear"}, {"name", "output.dense"}, {"out", d}},
                     {{"type", "dropout"}, {"p", p}}}},
                   {"then", {{{"type", "layer_norm"}, {"name", "output.LayerNorm"}, {"eps", eps}}}}}}}};
  json trunk = {{"type", "sequential"},
                {"name", prefix},
                {"attention_mask", "extended"},
                {"layers",
                 {{{"type", "block"},
                   {"name", "embeddings"},
                   {"layers",
                    {{{"type", "embedding"},
                      {"name", "word_embeddings"},
                      {"num", vocab},
                      {"dim", d},
                      {"padding_idx", pad},
                      {"positions", position_table},
                      {"token_types", {{"name", "token_type_embeddings"}, {"num", types}}}},
                     {{"type", "layer_norm"}, {"name", "LayerNorm"}, {"eps", eps}},
                     {{"type", "dropout"}, {"p", p}}}}},
                  {{"type", "sequential"},
                   {"name", "encoder"},
                   {"layers", {{{"type", "repeat"}, {"name", "layer"}, {"count", layers}, {"body", block}}}}}}}};
  if (!roberta && pooler) {
    // BertModel's pooler (first token, dense, tanh) runs inside BertModel,
    // before the heads, which take its output (the others build BertModel
    // with add_pooling_layer=False).
    trunk["layers"].push_back({{"type", "branch"},
                               {"as", "pooled_output"},
                               {"layers",
                                {{{"type", "select_token"}, {"index", 0}},
                                 {{"type", "linear"}, {"name", "pooler.dense"}, {"out", d}},
                                 {{"type", "tanh"}}}}});
  }
  json spec = Base(name, positions - (roberta ? 2 : 0));
  spec["input"] = {{"shape", {"batch", "seq"}}, {"vocab", vocab}};
  const json head_list = BertHeads(c, arch, roberta, d, vocab, eps, p);
  spec["layers"] = {trunk, {{"type", "heads"}, {"heads", head_list}}};
  // The output layer LoRA's "all-linear" leaves out: the masked-LM decoder.
  if (arch == "BertForPreTraining" || arch.ends_with("ForMaskedLM"))
    spec["output_layer"] = roberta ? "lm_head.decoder" : "cls.predictions.decoder";
  return spec;
}

}  // namespace

absl::StatusOr<json> HfConfigToModelSpec(const json& config, std::string_view source) {
  const std::string prefix = "Hugging Face config " + std::string(source) + ": ";
  try {
    if (!config.is_object()) throw ConfigError{"expected a JSON object"};
    if (!config.contains("model_type") || !config["model_type"].is_string())
      throw ConfigError{"missing field \"model_type\""};
    const std::string type = config["model_type"].get<std::string>();
    const std::string name = absl::StrCat("hf:", std::string(source));
    if (type == "gpt2") return Gpt2(config, name);
    if (type == "llama" || type == "mistral" || type == "qwen2") return Llama(config, name, type);
    if (type == "bert") return Bert(config, name, false);
    if (type == "roberta") return Bert(config, name, true);
    throw ConfigError{absl::StrCat("field \"model_type\": \"", type,
                                   "\" is not modelled (gpt2, llama, mistral, qwen2, bert, roberta)")};
  } catch (const ConfigError& e) {
    return absl::InvalidArgumentError(prefix + e.message);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(prefix + e.what());
  }
}

absl::StatusOr<std::unique_ptr<Model>> LoadHfConfig(std::string_view path, const ModelOptions& options) {
  const std::string p(path);
  absl::StatusOr<std::string> text = ReadInputFile(p, "Hugging Face config", kMaxHfConfigBytes);
  if (!text.ok()) return text.status();
  json config = json::parse(*text, nullptr, false);
  if (config.is_discarded()) return absl::InvalidArgumentError(absl::StrCat("Hugging Face config ", p, ": not JSON"));
  absl::StatusOr<json> spec = HfConfigToModelSpec(config, p);
  if (!spec.ok()) return spec.status();
  return ModelFromJson(*spec, absl::StrCat("(from Hugging Face config ", p, ")"), options);
}

}  // namespace memscope
