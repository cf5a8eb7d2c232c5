#include "train/model_file.h"

#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "allocator/alloc_tag.h"
#include "base/input_file.h"

namespace memscope {
namespace {

using json = nlohmann::json;

// Thrown while building; ModelFromJson turns it into an InvalidArgumentError.
struct SpecError {
  std::string message;
};

// What flows between layers while building: the activation's shape (with
// the batch) and dtype.
struct Sig {
  Shape shape;
  DType dtype = DType::kFloat32;
};

// Per forward pass: what HF models compute once per
// forward and share between layers (the causal mask, rotary cos/sin).
struct ForwardState {
  Tensor causal_mask;
  // BertModel's additive mask (B, 1, 1, T), made by the sequential that has
  // "attention_mask": "extended" and alive while it runs.
  Tensor extended_mask;
  Tensor cos, sin;
  // What Python locals keep until forward returns (`x, _ = self.lstm(x)`: the final states).
  TensorList locals;
  // The results of "branch" layers, by name, for a later "take".
  std::map<std::string, Tensor> branches;
  // The keys and values of attention layers with "cache" (use_cache: HF's
  // past_key_values), which outlive forward with its output...
  TensorList cache;
  // ...or, with "cache": "forward", die when forward returns (a head that
  // does not return past_key_values: *ForTokenClassification, *ForQuestionAnswering).
  TensorList forward_cache;
  // The model's input (the token ids a "last_token" layer reads).
  Tensor input;
};

// One layer's forward. Run takes its input by value so that it can drop it
// as early as the Python code does (`x = f(x)` frees the old x).
class Runner {
 public:
  virtual ~Runner() = default;
  virtual Tensor Run(Tensor x, ForwardState& s) = 0;
};
using RunnerPtr = std::unique_ptr<Runner>;

// A module that only groups children (nn.Sequential, nn.ModuleList, a named container).
class Group : public Module {
 public:
  using Module::Module;
};

// ------------------------------------------------------------------ runners

class SequentialRunner final : public Runner {
 public:
  SequentialRunner(std::vector<RunnerPtr> children, std::string tag, bool tagged, bool extended_mask = false,
                   std::int64_t rotary_head_dim = 0, bool causal_mask = false)
      : children_(std::move(children)),
        tag_(std::move(tag)),
        tagged_(tagged),
        extended_mask_(extended_mask),
        rotary_head_dim_(rotary_head_dim),
        causal_mask_(causal_mask) {}
  Tensor Run(Tensor x, ForwardState& s) override {
    std::optional<ScopedTag> tag;
    if (tagged_) tag.emplace(Category::kActivation, tag_);
    // A block is a module's forward: the Python locals its layers keep
    // (ForwardState::locals) die when it returns.
    const std::size_t locals = s.locals.size();
    Tensor ones;
    if (extended_mask_) {
      // BertModel.forward without an attention_mask: ones (B, T), then
      // get_extended_attention_mask: (1.0 - mask[:, None, None, :]) * finfo.min
      // (rsub's result is freed, the product kept); both live until it returns.
      NoGradGuard no_grad;
      ones = Tensor::Full(x.ctx(), {x.sizes()[0], x.sizes()[1]}, 1);
      s.extended_mask = ops::MulScalar(Tensor::Zeros(x.ctx(), {x.sizes()[0], 1, 1, x.sizes()[1]}),
                                       std::numeric_limits<float>::lowest());
    }
    TensorList prologue;
    for (std::size_t i = 0; i < children_.size(); ++i) {
      x = children_[i]->Run(std::move(x), s);
      if (i == 0 && rotary_head_dim_ > 0) prologue = LlamaPrologue(x, s);
    }
    if (tagged_ && s.locals.size() > locals) s.locals.resize(locals);
    if (extended_mask_) s.extended_mask = Tensor();
    if (rotary_head_dim_ > 0) s.causal_mask = s.cos = s.sin = Tensor();
    return x;
  }

 private:
  // LlamaModel.forward after inputs_embeds (transformers 4.46): cache_position
  // = arange(T); the eager causal mask (_prepare_4d_causal_attention_mask_with_cache_position:
  // full (T, T + 1) of finfo.min, triu, *= arange(T + 1) > cache_position);
  // position_embeddings = LlamaRotaryEmbedding(x, position_ids): cos and sin
  // of (1, T, head_dim). All alive until the model returns; returns what
  // holds them beside the state.
  TensorList LlamaPrologue(const Tensor& x, ForwardState& s) const {
    NoGradGuard no_grad;
    DeviceContext& ctx = x.ctx();
    const std::int64_t b = x.sizes()[0], t = x.sizes()[1], hd = rotary_head_dim_;
    Tensor cache_position = Tensor::Empty(ctx, {t}, DType::kInt64);
    if (causal_mask_) {
      Tensor full = Tensor::Full(ctx, {t, t + 1}, std::numeric_limits<float>::lowest(), x.dtype());
      Tensor mask = Tensor::Empty(ctx, {t, t + 1}, x.dtype());  // triu
      full = Tensor();
      {
        Tensor arange = Tensor::Empty(ctx, {t + 1}, DType::kInt64);
        Tensor greater = Tensor::Empty(ctx, {t, t + 1}, DType::kBool);  // mask *= greater, in place
        arange = Tensor();  // the expression's temporaries, in order
      }
      s.causal_mask = ops::Expand(ops::View(mask, {1, 1, t, t + 1}), {b, 1, t, t + 1});
    }
    {
      // inv_freq[None, :, None] @ position_ids[:, None, :].float(), transposed; cat; cos, sin; * scaling.
      Tensor positions = Tensor::Empty(ctx, {1, 1, t}, DType::kFloat32);
      Tensor freqs = Tensor::Empty(ctx, {1, hd / 2, t}, DType::kFloat32);
      Tensor emb = Tensor::Empty(ctx, {1, t, hd}, DType::kFloat32);
      Tensor cos = Tensor::Empty(ctx, {1, t, hd}, DType::kFloat32);
      Tensor sin = Tensor::Empty(ctx, {1, t, hd}, DType::kFloat32);
      cos = Tensor::Empty(ctx, {1, t, hd}, DType::kFloat32);
      sin = Tensor::Empty(ctx, {1, t, hd}, DType::kFloat32);
      s.cos = ops::To(cos, x.dtype());
      s.sin = ops::To(sin, x.dtype());
      positions = Tensor();  // the function's locals die in their order
      freqs = Tensor();
      emb = Tensor();
    }
    return {x, cache_position, s.causal_mask, s.cos, s.sin};  // x: inputs_embeds, a local too
  }

  std::vector<RunnerPtr> children_;
  std::string tag_;
  bool tagged_;
  bool extended_mask_;
  std::int64_t rotary_head_dim_;
  bool causal_mask_;
};

// torch.utils.checkpoint around a layer (with --checkpoint-activations).
class CheckpointRunner final : public Runner {
 public:
  explicit CheckpointRunner(RunnerPtr inner) : inner_(std::move(inner)) {}
  // The layer's other arguments (the attention masks, rotary cos and sin)
  // are the checkpoint's inputs too: kept until backward recomputes with
  // them, as torch.utils.checkpoint(layer, hidden_states, attention_mask, ...)
  // keeps its arguments.
  Tensor Run(Tensor x, ForwardState& s) override {
    Runner* r = inner_.get();
    ForwardState* st = &s;
    auto args = std::make_shared<ForwardState>();
    args->causal_mask = s.causal_mask;
    args->extended_mask = s.extended_mask;
    args->cos = s.cos;
    args->sin = s.sin;
    args->input = s.input;
    auto forward_done = std::make_shared<bool>(false);
    return Checkpoint(
        [r, st, args, forward_done](const Tensor& in) {
          if (!*forward_done) {
            *forward_done = true;
            return r->Run(in, *st);
          }
          ForwardState again = *args;  // the recomputation in backward
          return r->Run(in, again);
        },
        x);
  }

 private:
  RunnerPtr inner_;
};

// A parameterless layer with a name: its ops are attributed to its path.
class TagRunner final : public Runner {
 public:
  TagRunner(std::string path, RunnerPtr inner) : path_(std::move(path)), inner_(std::move(inner)) {}
  Tensor Run(Tensor x, ForwardState& s) override {
    ScopedTag tag(Category::kActivation, path_);
    return inner_->Run(std::move(x), s);
  }

 private:
  std::string path_;
  RunnerPtr inner_;
};

class FnRunner final : public Runner {
 public:
  explicit FnRunner(std::function<Tensor(Tensor)> fn) : fn_(std::move(fn)) {}
  Tensor Run(Tensor x, ForwardState&) override { return fn_(std::move(x)); }

 private:
  std::function<Tensor(Tensor)> fn_;
};

class StateFnRunner final : public Runner {
 public:
  explicit StateFnRunner(std::function<Tensor(Tensor, ForwardState&)> fn) : fn_(std::move(fn)) {}
  Tensor Run(Tensor x, ForwardState& s) override { return fn_(std::move(x), s); }

 private:
  std::function<Tensor(Tensor, ForwardState&)> fn_;
};

// A linear layer whose weight is another layer's (tied weights): only its
// bias, when it has one, is its own.
class TiedLinear final : public Module {
 public:
  TiedLinear(std::string path, std::int64_t out, bool bias)
      : Module(std::move(path)), bias_(bias ? &Param("bias", {out}, {0, 0}) : nullptr) {}
  Tensor Forward(const Tensor& x) const {
    ScopedTag tag(Category::kActivation, path());
    return ops::Linear(x, *weight, bias_ ? *bias_ : Tensor());
  }
  Tensor* weight = nullptr;  // set once every layer is built

 private:
  Tensor* bias_;
};

// PEFT's lora.Linear around an nn.Linear (peft/tuners/lora/layer.py):
// base_layer, then lora_A.default = Linear(in, r, bias=False) and
// lora_B.default = Linear(r, out, bias=lora_bias), registered in that order.
// forward: result = base_layer(x); x = _cast_input_dtype(x, lora_A's dtype);
// result = result + lora_B(lora_A(dropout(x))) * scaling;
// result.to(the base result's dtype). dropout is nn.Identity at p = 0.
class LoraLinear final : public Module {
 public:
  LoraLinear(std::string path, std::int64_t in, std::int64_t out, bool bias, const LoraConfig& l)
      : Module(std::move(path)),
        base_(Add<Linear>("base_layer", in, out, bias)),
        a_group_(Add<Group>("lora_A")),
        a_(a_group_.Add<Linear>("default", in, l.r, false)),
        b_group_(Add<Group>("lora_B")),
        b_(b_group_.Add<Linear>("default", l.r, out, l.lora_bias)),
        scaling_(static_cast<float>(l.Scaling())),
        dropout_(static_cast<float>(l.lora_dropout)) {}
  Tensor Forward(const Tensor& x) {
    ScopedTag tag(Category::kActivation, path());
    Tensor result = base_.Forward(x);
    const DType result_dtype = result.dtype();
    Tensor input = ops::To(x, a_.weight().dtype());  // a local until forward returns
    // Python frees each call's argument once the call returns.
    Tensor dropped = dropout_ > 0 ? ops::Dropout(input, dropout_) : input;
    Tensor a = a_.Forward(dropped);
    dropped = Tensor();
    Tensor b = b_.Forward(a);
    a = Tensor();
    Tensor scaled = ops::MulScalar(b, scaling_);
    b = Tensor();
    result = ops::Add(result, scaled);
    scaled = Tensor();
    return ops::To(result, result_dtype);
  }
  Tensor& base_weight() { return base_.weight(); }
  // The adapters (trainable, float32: PEFT's autocast_adapter_dtype).
  Module& lora_a() { return a_group_; }
  Module& lora_b() { return b_group_; }

 private:
  Linear& base_;
  Group& a_group_;
  Linear& a_;
  Group& b_group_;
  Linear& b_;
  float scaling_, dropout_;
};

// LlamaRMSNorm: weight * (x * rsqrt(mean(x^2) + eps)), in float32.
class RmsNorm final : public Module {
 public:
  RmsNorm(std::string path, std::int64_t dim, float eps)
      : Module(std::move(path)), weight_(Param("weight", {dim}, {0, 1})), eps_(eps) {}
  Tensor Forward(const Tensor& in) const {
    ScopedTag tag(Category::kActivation, path());
    const DType input_dtype = in.dtype();
    Tensor x = ops::To(in, DType::kFloat32);
    Tensor variance = ops::MeanDims(ops::PowScalar(x, 2), {-1}, true);
    x = ops::Mul(x, ops::Rsqrt(ops::AddScalar(variance, eps_)));
    return ops::Mul(weight_, ops::To(x, input_dtype));  // variance, a local, dies after
  }

 private:
  Tensor& weight_;
  float eps_;
};

// The module of an attention layer: its projections are children; GPT-2's
// causal-mask buffer (bool, 1 x 1 x P x P, persistent=False) is its own.
class AttentionModule final : public Module {
 public:
  AttentionModule(std::string path, std::int64_t mask_positions)
      : Module(std::move(path)),
        mask_(mask_positions > 0 ? &Buffer("bias", {1, 1, mask_positions, mask_positions}, DType::kBool, 1) : nullptr) {
  }
  Tensor* mask() const { return mask_; }

 private:
  Tensor* mask_;
};

// LlamaRotaryEmbedding's inv_freq (head_dim / 2 float32; persistent=False,
// moved to the GPU with the model).
class RotaryBuffer final : public Module {
 public:
  RotaryBuffer(std::string path, std::int64_t head_dim) : Module(std::move(path)) {
    Buffer("inv_freq", {head_dim / 2}, DType::kFloat32);
  }
};

// BertEmbeddings' position_ids and token_type_ids ((1, max positions) int64
// buffers; persistent=False, yet moved to the GPU by model.cuda()).
class BertIdBuffers final : public Module {
 public:
  BertIdBuffers(std::string path, std::int64_t positions)
      : Module(std::move(path)),
        position_ids(Buffer("position_ids", {1, positions}, DType::kInt64)),
        token_type_ids(Buffer("token_type_ids", {1, positions}, DType::kInt64)) {}
  Tensor& position_ids;
  Tensor& token_type_ids;
};

// BertEmbeddings.forward (transformers 4.4x): the ids are slices of the
// buffers (no allocation); embedding() reshapes the expanded token-type ids
// (a copy); words + token types, += positions in place; the three lookups
// are locals until the embeddings module returns.
class BertEmbeddingRunner final : public Runner {
 public:
  // `position_padding` >= 0: RoBERTa, whose position ids count the
  // non-padding tokens (create_position_ids_from_input_ids).
  BertEmbeddingRunner(EmbeddingLayer* words, EmbeddingLayer* positions, EmbeddingLayer* token_types,
                      BertIdBuffers* ids, std::int64_t position_padding)
      : words_(words), positions_(positions), token_types_(token_types), ids_(ids), padding_(position_padding) {}
  Tensor Run(Tensor x, ForwardState& s) override {
    const std::int64_t b = x.sizes()[0], t = x.sizes()[1];
    Tensor roberta_positions = padding_ >= 0 ? RobertaPositionIds(x) : Tensor();
    Tensor inputs_embeds = words_->Forward(x);
    Tensor token_type_embeddings =
        token_types_->Forward(ops::Expand(ops::Narrow(ids_->token_type_ids, 1, 0, t), {b, t}));
    Tensor e = ops::Add(inputs_embeds, token_type_embeddings);
    s.locals.push_back(inputs_embeds);
    s.locals.push_back(token_type_embeddings);
    if (positions_ != nullptr) {
      Tensor position_embeddings = positions_->Forward(
          roberta_positions.defined() ? roberta_positions : ops::Narrow(ids_->position_ids, 1, 0, t));
      ops::AddInPlaceTracked(e, position_embeddings);
      s.locals.push_back(position_embeddings);
    }
    return e;
  }

 private:
  // mask = ids.ne(pad).int(); incremental = (cumsum(mask, 1).type_as(mask) + 0) * mask;
  // incremental.long() + pad: each step a (B, T) tensor, the locals freed on return.
  Tensor RobertaPositionIds(const Tensor& ids) const {
    NoGradGuard no_grad;
    DeviceContext& ctx = ids.ctx();
    const Shape bt = ids.sizes();
    Tensor ne = Tensor::Empty(ctx, bt, DType::kBool);
    Tensor mask = Tensor::Empty(ctx, bt, DType::kInt32);  // .int()
    ne = Tensor();
    Tensor cumsum = Tensor::Empty(ctx, bt, DType::kInt64);
    { Tensor as_int64 = Tensor::Empty(ctx, bt, DType::kInt64); }  // cumsum's self.to(result dtype)
    Tensor typed = Tensor::Empty(ctx, bt, DType::kInt32);         // .type_as(mask)
    cumsum = Tensor();
    Tensor plus = Tensor::Empty(ctx, bt, DType::kInt32);  // + past_key_values_length
    typed = Tensor();
    Tensor incremental = Tensor::Empty(ctx, bt, DType::kInt32);  // * mask
    plus = Tensor();
    Tensor as_long = Tensor::Empty(ctx, bt, DType::kInt64);
    Tensor positions = Tensor::Empty(ctx, bt, DType::kInt64);  // + padding_idx
    as_long = Tensor();
    if (ctx.computes()) {
      Tensor c = ops::Contiguous(ids);
      for (std::int64_t row = 0; row < bt[0]; ++row) {
        std::int64_t count = 0;
        for (std::int64_t col = 0; col < bt[1]; ++col) {
          const std::int64_t id = c.data_i64()[row * bt[1] + col];
          count += id != padding_ ? 1 : 0;
          positions.data_i64()[row * bt[1] + col] = (id != padding_ ? count : 0) + padding_;
        }
      }
    }
    return positions;
  }

  EmbeddingLayer *words_, *positions_, *token_types_;
  BertIdBuffers* ids_;
  std::int64_t padding_;
};

struct AttentionSpec {
  std::int64_t heads = 1, kv_heads = 1, head_dim = 1;
  AttentionKind kernel = AttentionKind::kMath;
  int compute_capability = 0;  // for kSdpa (ModelOptions)
  bool fused = false;  // GPT-2's c_attn (one Conv1D) instead of q, k, v projections
  bool causal = true;
  bool rotary = false;
  bool additive_mask = false;  // BERT's eager path: ForwardState::extended_mask
  bool cache = false;          // use_cache: keys and values kept (ForwardState::cache)
  bool cache_returned = true;  // ...with the output, else until forward returns (ForwardState::forward_cache)
  float dropout = 0;
  float out_dropout = 0;  // dropout after the output projection, inside the layer (GPT-2's resid_dropout)
  Tensor* mask_buffer = nullptr;  // GPT-2 eager path
  std::function<Tensor(const Tensor&)> q, k, v, qkv, o;
};

class AttentionRunner final : public Runner {
 public:
  explicit AttentionRunner(AttentionSpec a) : a_(std::move(a)) {}

  // scaled_dot_product_attention's choice (sdp_utils.cpp, 2.x: flash first,
  // then memory-efficient, then math): flash needs sm80 or later, float16 or
  // bfloat16 inputs (after autocast), a head size of at most 256 (192 for
  // training on sm86 and sm89) and no attention mask (transformers passes
  // none for an unpadded batch: is_causal, or BERT's all-ones mask dropped).
  // The memory-efficient kernel is not modelled: refused, naming why flash
  // was not picked.
  bool SdpaPicksFlash(const Tensor& q) const {
    const int sm = a_.compute_capability > 0 ? a_.compute_capability : 80;
    const DType dtype = AutocastGuard::current().value_or(q.dtype());
    std::string why;
    if (sm < 80) {
      why = absl::StrCat("sm", sm, " (flash needs sm80 or later)");
    } else if (dtype != DType::kFloat16 && dtype != DType::kBFloat16) {
      why = absl::StrCat(std::string(DTypeName(dtype)),
                         " inputs (flash needs float16 or bfloat16: --amp or a half-precision model)");
    } else if (a_.head_dim > ((sm == 86 || sm == 89) ? 192 : 256)) {
      why = absl::StrCat("head size ", a_.head_dim, " (flash takes at most ", (sm == 86 || sm == 89) ? 192 : 256,
                         " here)");
    } else {
      return true;
    }
    throw TensorError(absl::StrCat("--attention sdpa: PyTorch would run the memory-efficient kernel for ", why,
                                   ", which memscope does not model; use --attention eager or flash_attention_2"));
  }

  Tensor Run(Tensor x, ForwardState& s) override {
    const std::int64_t b = x.sizes()[0], t = x.sizes()[1];
    const std::int64_t h = a_.heads, kvh = a_.kv_heads, hd = a_.head_dim;
    auto split_heads = [&](const Tensor& y, std::int64_t heads) {
      return ops::Permute(ops::View(y, {b, t, heads, hd}), {0, 2, 1, 3});
    };
    Tensor q, k, v;
    if (a_.fused) {
      TensorList qkv = ops::Split(a_.qkv(x), h * hd, 2);
      x = Tensor();
      q = split_heads(qkv[0], h);
      k = split_heads(qkv[1], h);
      v = split_heads(qkv[2], h);
      qkv.clear();
    } else {
      q = split_heads(a_.q(x), h);
      k = split_heads(a_.k(x), kvh);
      v = split_heads(a_.v(x), kvh);
      x = Tensor();
    }
    // Locals of the attention's forward, alive until it returns (GPT-2:
    // query, key, value, views of c_attn's output).
    Tensor q_local = a_.fused ? q : Tensor(), k_local = a_.fused ? k : Tensor(), v_local = a_.fused ? v : Tensor();
    TensorList& cache = a_.cache_returned ? s.cache : s.forward_cache;
    if (a_.cache && !a_.rotary) {  // present = (key, value)
      cache.push_back(k);
      cache.push_back(v);
    }
    if (a_.rotary) {
      if (!s.cos.defined()) {
        // LlamaRotaryEmbedding: cos and sin of (1, T, head_dim), float32, cast to the activations' dtype.
        NoGradGuard no_grad;
        s.cos = ops::To(Tensor::Empty(q.ctx(), {1, t, hd}, DType::kFloat32), q.dtype());
        s.sin = ops::To(Tensor::Empty(q.ctx(), {1, t, hd}, DType::kFloat32), q.dtype());
      }
      // q * cos + rotate_half(q) * sin; rotate_half = cat(-x2, x1)
      auto rotate = [&](const Tensor& y) {
        Tensor c = ops::Unsqueeze(s.cos, 1), sn = ops::Unsqueeze(s.sin, 1);
        Tensor x1 = ops::Narrow(y, 3, 0, hd / 2), x2 = ops::Narrow(y, 3, hd / 2, hd - hd / 2);
        Tensor qc = ops::Mul(y, c);
        Tensor rh = ops::Cat({ops::MulScalar(x2, -1), x1}, 3);
        Tensor rs = ops::Mul(rh, sn);
        rh = Tensor();  // a temporary of the expression
        return ops::Add(qc, rs);
      };
      q = rotate(q);
      k = rotate(k);
      if (a_.cache) {  // DynamicCache.update keeps the rotated key and the value
        cache.push_back(k);
        cache.push_back(v);
      }
    }
    if (kvh < h) {  // repeat_kv: expand + reshape (a copy)
      auto repeat = [&](const Tensor& y) {
        return ops::Reshape(ops::Expand(ops::Unsqueeze(y, 2), {b, kvh, h / kvh, t, hd}), {b, h, t, hd});
      };
      k = repeat(k);
      v = repeat(v);
    }
    Tensor context, probs;  // locals of the attention's forward, alive until it returns
    if (a_.kernel == AttentionKind::kFlash || (a_.kernel == AttentionKind::kSdpa && SdpaPicksFlash(q))) {
      context = ops::FlashAttention(q, k, v);
    } else if (a_.mask_buffer != nullptr) {
      // HF GPT-2's eager attention (transformers 4.3x-4.4x), as the zoo's gpt2.
      Tensor w = ops::Matmul(q, ops::Transpose(k, -1, -2));
      w = ops::Div(w, Tensor::Full(w.ctx(), {}, std::sqrt(static_cast<double>(hd)), w.dtype()));
      Tensor causal = ops::Narrow(ops::Narrow(*a_.mask_buffer, 2, 0, t), 3, 0, t);
      Tensor mask_value = Tensor::Full(w.ctx(), {}, -3.4e38, w.dtype());
      w = ops::Where(causal, w, mask_value);
      w = ops::To(ops::Softmax(w, -1), v.dtype());  // attn_weights.type(value.dtype)
      w = ops::Dropout(w, a_.dropout);
      context = ops::Matmul(w, v);
    } else if (a_.additive_mask) {
      return BertEager(std::move(q), std::move(k), std::move(v), s, b, t);
    } else {
      // eager_attention_forward: matmul * scaling (+ the additive causal
      // mask), softmax in float32 cast back, dropout, matmul.
      Tensor w = ops::MulScalar(ops::Matmul(q, ops::Transpose(k, -1, -2)),
                                static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd))));
      if (a_.causal) {
        if (!s.causal_mask.defined()) {
          NoGradGuard no_grad;
          s.causal_mask = Tensor::Full(w.ctx(), {1, 1, t, t}, 0, w.dtype());
        }
        // The model's mask may be wider (LlamaModel's (T, T + 1)): attention_mask[..., :T].
        w = ops::Add(w, ops::Narrow(s.causal_mask, 3, 0, t));
      }
      const DType dtype = q.dtype();
      probs = ops::To(ops::Softmax(w, -1, DType::kFloat32), dtype);  // softmax(w, -1, dtype=float32).to(q.dtype)
      w = Tensor();
      probs = ops::Dropout(probs, a_.dropout);
      context = ops::Matmul(probs, v);
    }
    Tensor out = ops::View(ops::Contiguous(ops::Permute(context, {0, 2, 1, 3})), {b, t, h * hd});
    context = Tensor();
    out = a_.o(out);
    if (a_.out_dropout > 0) out = ops::Dropout(out, a_.out_dropout);
    // Python frees a function's locals in the order they were first bound.
    q = Tensor();
    k = Tensor();
    v = Tensor();
    q_local = k_local = v_local = Tensor();
    probs = Tensor();
    return out;
  }

 private:
  // BertSelfAttention.forward (transformers 4.4x, eager): scores / sqrt(d)
  // + the extended mask, softmax, dropout, matmul; its locals (the
  // projections, the masked scores, the probabilities) live until it
  // returns, after the context's contiguous copy. Then BertSelfOutput.
  Tensor BertEager(Tensor q, Tensor k, Tensor v, ForwardState& s, std::int64_t b, std::int64_t t) {
    if (!s.extended_mask.defined())
      throw TensorError("attention with \"mask\": \"additive\" needs an enclosing \"attention_mask\"");
    const std::int64_t h = a_.heads, hd = a_.head_dim;
    Tensor scores = ops::DivScalar(ops::Matmul(q, ops::Transpose(k, -1, -2)),
                                   static_cast<float>(std::sqrt(static_cast<double>(hd))));
    scores = ops::Add(scores, s.extended_mask);
    Tensor probs = ops::Dropout(ops::Softmax(scores, -1), a_.dropout);
    Tensor context = ops::Matmul(probs, v);
    context = ops::Contiguous(ops::Permute(context, {0, 2, 1, 3}));
    Tensor out = ops::View(context, {b, t, h * hd});
    // Python frees a function's locals in the order they were first bound.
    q = Tensor();
    k = Tensor();
    v = Tensor();
    scores = Tensor();
    probs = Tensor();
    context = Tensor();
    return a_.o(out);
  }

  AttentionSpec a_;
};

class ResidualRunner final : public Runner {
 public:
  ResidualRunner(RunnerPtr body, RunnerPtr shortcut, RunnerPtr then, bool inplace, bool input_first, bool keep)
      : body_(std::move(body)),
        shortcut_(std::move(shortcut)),
        then_(std::move(then)),
        inplace_(inplace),
        input_first_(input_first),
        keep_(keep) {}
  Tensor Run(Tensor x, ForwardState& s) override {
    // Declared first, so that it dies after the body's output (Python's
    // `residual` local outlives the block's `out`).
    Tensor identity;
    Tensor out = body_->Run(x, s);
    identity = shortcut_ ? shortcut_->Run(x, s) : x;
    x = Tensor();
    if (inplace_) {
      ops::AddInPlaceTracked(out, identity);
      return then_ ? then_->Run(std::move(out), s) : out;
    }
    Tensor sum = input_first_ ? ops::Add(identity, out) : ops::Add(out, identity);
    // "keep": the body's output is a local of the enclosing block (GPT2Block's
    // attn_output and feed_forward_hidden_states), alive until it returns.
    if (keep_) s.locals.push_back(out);
    // "then": layers applied to the sum in the same Python expression, while
    // the body's output is still a local (BertSelfOutput's
    // LayerNorm(hidden_states + input_tensor)).
    return then_ ? then_->Run(std::move(sum), s) : sum;
  }

 private:
  RunnerPtr body_, shortcut_, then_;
  bool inplace_, input_first_, keep_;
};

// A side computation on the layer's input, kept for a later TakeRunner; the
// input goes on unchanged.
class BranchRunner final : public Runner {
 public:
  BranchRunner(RunnerPtr body, std::string as) : body_(std::move(body)), as_(std::move(as)) {}
  Tensor Run(Tensor x, ForwardState& s) override {
    s.branches[as_] = body_->Run(x, s);
    return x;
  }

 private:
  RunnerPtr body_;
  std::string as_;
};

class TakeRunner final : public Runner {
 public:
  explicit TakeRunner(std::string from) : from_(std::move(from)) {}
  Tensor Run(Tensor, ForwardState& s) override { return s.branches.at(from_); }

 private:
  std::string from_;
};

// transformers' *ForSequenceClassification of a decoder (4.46): the logits
// of each row's last non-padding token, logits[arange(batch), sequence_lengths].
// With a pad_token_id, sequence_lengths = (eq(ids, pad).int().argmax(-1) - 1)
// % tokens, each step a new tensor and the one before freed; without one
// (batch 1 only) the index is -1, which Python applies as select(1, -1)
// before indexing the rows. The row and token indices stay saved by
// IndexBackward0; the logits die when it returns.
class LastTokenRunner final : public Runner {
 public:
  explicit LastTokenRunner(std::optional<std::int64_t> pad) : pad_(pad) {}
  Tensor Run(Tensor logits, ForwardState& s) override {
    const std::int64_t b = logits.sizes()[0], t = logits.sizes()[1];
    Tensor sequence_lengths, rows;
    {
      NoGradGuard no_grad;
      DeviceContext& ctx = logits.ctx();
      if (pad_) {
        Tensor eq = ops::Eq(s.input, static_cast<float>(*pad_));
        Tensor as_int = Tensor::Empty(ctx, {b, t}, DType::kInt32);  // .int()
        eq = Tensor();
        Tensor argmax = Tensor::Empty(ctx, {b}, DType::kInt64);
        as_int = Tensor();
        Tensor minus_one = Tensor::Empty(ctx, {b}, DType::kInt64);
        argmax = Tensor();
        sequence_lengths = Tensor::Empty(ctx, {b}, DType::kInt64);  // % tokens
        minus_one = Tensor();
        if (ctx.computes()) {
          for (std::int64_t row = 0; row < b; ++row) {
            std::int64_t first_pad = 0;  // argmax of all zeros: 0
            for (std::int64_t col = t - 1; col >= 0; --col) {
              if (s.input.data_i64()[row * s.input.strides()[0] + col * s.input.strides()[1]] == *pad_) first_pad = col;
            }
            sequence_lengths.data_i64()[row] = ((first_pad - 1) % t + t) % t;
          }
        }
      }
      rows = Tensor::Empty(ctx, {b}, DType::kInt64);  // torch.arange(batch)
      if (ctx.computes()) {
        for (std::int64_t row = 0; row < b; ++row) rows.data_i64()[row] = row;
      }
    }
    if (pad_) return ops::Index(logits, {rows, sequence_lengths});
    return ops::Index(ops::Select(logits, 1, -1), {rows});
  }

 private:
  std::optional<std::int64_t> pad_;
};

// Runs a layer defined earlier again (shared weights).
class SharedRunner final : public Runner {
 public:
  explicit SharedRunner(Runner* target) : target_(target) {}
  Tensor Run(Tensor x, ForwardState& s) override { return target_->Run(std::move(x), s); }

 private:
  Runner* target_;
};

// ------------------------------------------------------------------ the model

struct TargetSpec {
  bool from_input = false;
  Shape shape;
  DType dtype = DType::kInt64;
};

struct LossSpec {
  bool mse = false;
  bool span = false;  // question answering: start and end positions over the tokens
  bool shift = false;  // causal LM: labels shifted by one, logits.float()
  bool upcast = false;  // logits.float() after the view (transformers' ForTokenClassification loss)
  ops::Reduction reduction = ops::Reduction::kMean;
  std::int64_t ignore_index = -100;
};

struct Head {
  RunnerPtr runner;
  TargetSpec target;
  LossSpec loss;
};

class FileModel final : public Model {
 public:
  // `root`: the path of the model's own module ("base_model.model" inside PEFT's PeftModel).
  FileModel(std::string name, std::string root) : Model(std::move(root)), name_(std::move(name)) {}
  std::string_view name() const override { return name_; }

  Batch MakeBatch(DeviceContext& ctx, std::int64_t) override {
    Batch b;
    {
      ScopedTag tag(Category::kInput, "batch");
      b.input = Tensor::Empty(ctx, input_shape_, input_dtype_);
      extra_targets_.clear();
      for (std::size_t i = 0; i < heads_.size(); ++i) {
        const TargetSpec& t = heads_[i].target;
        Tensor target = t.from_input ? b.input : Tensor::Empty(ctx, t.shape, t.dtype);
        if (i == 0) {
          b.target = target;
        } else {
          extra_targets_.push_back(target);
        }
      }
    }
    return b;
  }

  Tensor Forward(const Batch& batch) override {
    state_ = ForwardState{};
    state_.input = batch.input;
    extra_outputs_.clear();
    Tensor trunk = trunk_->Run(batch.input, state_);
    Tensor first;
    for (std::size_t i = 0; i < heads_.size(); ++i) {
      Tensor out = heads_[i].runner ? heads_[i].runner->Run(trunk, state_) : trunk;
      if (i == 0) {
        first = out;
      } else {
        extra_outputs_.push_back(out);
      }
    }
    trunk = Tensor();
    // The keys and values kept (use_cache) go out with the output: the
    // previous forward's are freed once this one has returned.
    cache_ = std::move(state_.cache);
    state_ = ForwardState{};
    return first;
  }

  Tensor Loss(const Tensor& output, const Batch& batch) override {
    Tensor total = HeadLoss(heads_[0].loss, output, batch.target);
    for (std::size_t i = 1; i < heads_.size(); ++i) {
      total = ops::Add(total, HeadLoss(heads_[i].loss, extra_outputs_[i - 1], extra_targets_[i - 1]));
    }
    return total;
  }

  TensorList OtherOutputs() const override { return extra_outputs_; }
  void ReleaseOutputs() override {
    extra_outputs_.clear();
    cache_.clear();
  }

  void set_batch_size(std::int64_t b) { batch_size_ = b; }
  std::string name_;
  Shape input_shape_;
  DType input_dtype_ = DType::kFloat32;
  RunnerPtr trunk_;
  std::vector<Head> heads_;

 private:
  static Tensor HeadLoss(const LossSpec& l, const Tensor& output, const Tensor& target) {
    ScopedTag tag(Category::kActivation, "loss");
    if (l.mse) return ops::MseLoss(output, target);
    if (l.span) return SpanLoss(output, target);
    const std::int64_t classes = output.sizes().back();
    if (l.shift) {
      // HF ForCausalLMLoss: logits.float(); labels padded with -100 (a local
      // until it returns) and shifted; cross-entropy, mean over the rest.
      const std::int64_t seq = target.sizes()[1];
      Tensor logits = ops::To(output, DType::kFloat32);
      Tensor labels = ops::PadLastDim(target, 0, 1, -100);
      Tensor shift_labels = ops::Contiguous(ops::Narrow(labels, 1, 1, seq));
      return ops::CrossEntropy(ops::View(logits, {-1, classes}), ops::View(shift_labels, {-1}), l.reduction,
                               l.ignore_index);
    }
    Tensor logits = output.dim() > 2 ? ops::View(output, {-1, classes}) : output;
    Tensor labels = target.dim() > 1 ? ops::View(target, {-1}) : target;
    if (l.upcast) logits = ops::To(logits, DType::kFloat32);
    return ops::CrossEntropy(logits, labels, l.reduction, l.ignore_index);
  }

  // *ForQuestionAnswering (transformers 4.4x): logits.split(1, dim=-1), each
  // squeeze(-1).contiguous() (a copy); the (batch, 2) target's start and end
  // positions clamped to [0, tokens] (new tensors); CrossEntropyLoss with
  // ignore_index = tokens on each; (start_loss + end_loss) / 2. transformers
  // splits the logits at the end of forward; here it is the loss's start.
  static Tensor SpanLoss(const Tensor& output, const Tensor& target) {
    const std::int64_t tokens = output.sizes()[1];
    Tensor start_logits = ops::Contiguous(ops::Select(output, 2, 0));
    Tensor end_logits = ops::Contiguous(ops::Select(output, 2, 1));
    Tensor start_positions = ops::ClampInt(ops::Select(target, 1, 0), 0, tokens);
    Tensor end_positions = ops::ClampInt(ops::Select(target, 1, 1), 0, tokens);
    Tensor start_loss = ops::CrossEntropy(start_logits, start_positions, ops::Reduction::kMean, tokens);
    Tensor end_loss = ops::CrossEntropy(end_logits, end_positions, ops::Reduction::kMean, tokens);
    return ops::DivScalar(ops::Add(start_loss, end_loss), 2);
  }

  ForwardState state_;
  TensorList extra_targets_, extra_outputs_;
  TensorList cache_;  // past_key_values of the last forward (use_cache)
};

// ------------------------------------------------------------------ building

std::string ShapeOf(const Shape& s) { return ShapeText(s); }

std::optional<DType> ParseDType(const std::string& s) {
  if (s == "float32") return DType::kFloat32;
  if (s == "float16") return DType::kFloat16;
  if (s == "bfloat16") return DType::kBFloat16;
  if (s == "int64") return DType::kInt64;
  return std::nullopt;
}

class Builder {
 public:
  Builder(FileModel& root, const ModelOptions& o, std::int64_t batch, std::int64_t seq, bool has_seq)
      : root_(root), options_(o), batch_(batch), seq_(seq), has_seq_(has_seq), lora_(o.lora.get()) {}

  // The layer "target_modules": "all-linear" leaves alone (PEFT: the output
  // embeddings, PreTrainedModel.get_output_embeddings()), "" for none.
  void set_output_layer(std::string path) { output_layer_ = std::move(path); }

  // After building, with an adapter config: every parameter frozen but the
  // adapters and the modules_to_save copies; the adapters in float32 (PEFT's
  // autocast_adapter_dtype). Errors: no layer is a target.
  void ApplyLora() {
    if (lora_ == nullptr) return;
    if (lora_modules_.empty()) {
      throw SpecError{absl::StrCat("adapter config ", lora_->source, ": field \"target_modules\": no linear layer of the model matches")};
    }
    root_.SetRequiresGrad(false);
    for (LoraLinear* m : lora_modules_) {
      for (Module* adapter : {&m->lora_a(), &m->lora_b()}) {
        adapter->SetRequiresGrad(true);
        adapter->SetParameterDType(DType::kFloat32);
      }
    }
    for (Module* m : saved_copies_) m->SetRequiresGrad(true);
  }

  // A list of layers run in order; `where` is its place in the file ("layers").
  RunnerPtr BuildList(const json& list, const std::string& where, Module& parent, Sig& sig, DType pdtype) {
    if (!list.is_array()) throw SpecError{absl::StrCat(where, ": expected a list of layers")};
    std::vector<RunnerPtr> children;
    for (std::size_t i = 0; i < list.size(); ++i) {
      children.push_back(Build(list[i], absl::StrCat(where, "[", i, "]"), parent, sig, pdtype, std::nullopt));
    }
    return std::make_unique<SequentialRunner>(std::move(children), "", false);
  }

  // One layer. `forced_name` names the copies of a repeat.
  RunnerPtr Build(const json& spec, const std::string& where, Module& parent, Sig& sig, DType pdtype,
                  std::optional<std::string> forced_name) {
    if (!spec.is_object()) throw SpecError{absl::StrCat(where, ": expected an object with a \"type\"")};
    if (!spec.contains("type") || !spec["type"].is_string())
      throw SpecError{absl::StrCat(where, ": missing field \"type\"")};
    const std::string type = spec["type"].get<std::string>();
    std::string name;
    if (forced_name) {
      if (spec.contains("name"))
        throw SpecError{absl::StrCat(where, " (", type, "): field \"name\": a repeat names its copies by index")};
      name = *forced_name;
    } else if (spec.contains("name")) {
      if (!spec["name"].is_string())
        throw SpecError{absl::StrCat(where, " (", type, "): field \"name\": expected a string")};
      name = spec["name"].get<std::string>();
    }
    Ctx c{spec, where, type, name, parent, pdtype, ""};
    if (lora_ != nullptr && !name.empty() && !in_saved_copy_ && lora_->Saves(Key(c.Path()))) return SavedCopy(c, sig);
    if (spec.contains("dtype")) {
      const std::optional<DType> d =
          spec["dtype"].is_string() ? ParseDType(spec["dtype"].get<std::string>()) : std::nullopt;
      if (!d || !IsFloating(*d)) c.Fail("field \"dtype\": use float32, float16 or bfloat16");
      c.pdtype = *d;
    }
    const std::size_t first_module = created_.size();
    const Sig in = sig;
    RunnerPtr r = BuildType(c, sig);
    // Settings that apply to every parameter of the layer.
    if (spec.contains("trainable")) {
      if (!spec["trainable"].is_boolean()) c.Fail("field \"trainable\": expected true or false");
      if (!spec["trainable"].get<bool>()) {
        for (std::size_t i = first_module; i < created_.size(); ++i) created_[i]->SetRequiresGrad(false);
      }
    }
    if (c.pdtype != DType::kFloat32) {  // the file's or this layer's "dtype" (parameters start as float32)
      for (std::size_t i = first_module; i < created_.size(); ++i) created_[i]->SetParameterDType(c.pdtype);
    }
    if (spec.contains("checkpoint")) {
      if (!spec["checkpoint"].is_boolean()) c.Fail("field \"checkpoint\": expected true or false");
      if (spec["checkpoint"].get<bool>()) {
        any_checkpoint_ = true;
        if (options_.checkpoint_activations) r = std::make_unique<CheckpointRunner>(std::move(r));
      }
    }
    const std::string path = c.Path();
    if (!name.empty()) {
      layers_[path] = Built{r.get(), in, sig};
    }
    return r;
  }

  // Ties wait until every layer exists (a tie may name a later layer).
  void ResolveTies() {
    for (auto& [path, tie] : ties_) {
      std::vector<std::string> chain = {path};
      std::string target = tie.target;
      while (true) {
        for (const std::string& seen : chain) {
          if (seen == target) {
            chain.push_back(target);
            throw SpecError{absl::StrCat(tie.where, " (linear \"", path,
                                         "\"): field \"tie\": ", absl::StrJoin(chain, " -> "), " is a cycle")};
          }
        }
        chain.push_back(target);
        auto next = ties_.find(target);
        if (next == ties_.end()) break;
        target = next->second.target;
      }
      auto w = weights_.find(target);
      if (w == weights_.end()) {
        throw SpecError{absl::StrCat(tie.where, " (linear \"", path,
                                     "\"): field \"tie\": no linear or embedding layer \"", tie.target, "\"")};
      }
      if (w->second.shape != tie.shape) {
        throw SpecError{absl::StrCat(tie.where, " (linear \"", path, "\"): field \"tie\": \"", target,
                                     "\"'s weight is ", ShapeOf(w->second.shape), ", this layer needs ",
                                     ShapeOf(tie.shape))};
      }
      tie.module->weight = w->second.tensor;
    }
  }

  bool any_checkpoint() const { return any_checkpoint_; }

  Shape ParseShape(const json& j, const std::string& what, bool prepend_batch) const {
    if (!j.is_array() || j.empty()) throw SpecError{absl::StrCat(what, ": expected a list of sizes")};
    Shape s;
    bool batch = false;
    for (const json& e : j) {
      if (e.is_string() && e.get<std::string>() == "batch") {
        s.push_back(batch_);
        batch = true;
      } else if (e.is_string() && e.get<std::string>() == "seq") {
        if (!has_seq_) throw SpecError{absl::StrCat(what, ": \"seq\" needs \"seq_len\" in the file or --seq-len")};
        s.push_back(seq_);
      } else if (e.is_number_integer() && e.get<std::int64_t>() > 0) {
        s.push_back(e.get<std::int64_t>());
      } else {
        throw SpecError{
            absl::StrCat(what, ": ", e.dump(), " is not a size (a positive integer, \"batch\" or \"seq\")")};
      }
    }
    if (!batch && prepend_batch) s.insert(s.begin(), batch_);
    return s;
  }

 private:
  struct Ctx {
    const json& spec;
    std::string where, type, name;
    Module& parent;
    DType pdtype;
    std::string module_path;  // set once the layer's module exists

    [[noreturn]] void Fail(const std::string& msg) const {
      const std::string p = Path();
      throw SpecError{absl::StrCat(where, " (", type, p.empty() ? "" : absl::StrCat(" \"", p, "\""), "): ", msg)};
    }
    std::string Path() const {
      if (!module_path.empty()) return module_path;
      if (name.empty()) return parent.path();
      return parent.path().empty() ? name : absl::StrCat(parent.path(), ".", name);
    }
    void Allow(std::initializer_list<const char*> fields) const {
      static const std::set<std::string> common = {"type", "name", "checkpoint", "trainable", "dtype", "comment"};
      for (auto it = spec.begin(); it != spec.end(); ++it) {
        if (common.count(it.key()) != 0) continue;
        bool ok = false;
        for (const char* f : fields) ok = ok || it.key() == f;
        if (!ok) Fail(absl::StrCat("unknown field \"", it.key(), "\""));
      }
    }
    std::int64_t Int(const char* field, std::optional<std::int64_t> def = std::nullopt, std::int64_t min = 1) const {
      if (!spec.contains(field)) {
        if (def) return *def;
        Fail(absl::StrCat("missing field \"", field, "\""));
      }
      const json& v = spec[field];
      if (!v.is_number_integer() || v.get<std::int64_t>() < min)
        Fail(absl::StrCat("field \"", field, "\": expected an integer >= ", min));
      return v.get<std::int64_t>();
    }
    double Num(const char* field, double def) const {
      if (!spec.contains(field)) return def;
      if (!spec[field].is_number()) Fail(absl::StrCat("field \"", field, "\": expected a number"));
      return spec[field].get<double>();
    }
    bool Bool(const char* field, bool def) const {
      if (!spec.contains(field)) return def;
      if (!spec[field].is_boolean()) Fail(absl::StrCat("field \"", field, "\": expected true or false"));
      return spec[field].get<bool>();
    }
    std::string Str(const char* field, const std::string& def) const {
      if (!spec.contains(field)) return def;
      if (!spec[field].is_string()) Fail(absl::StrCat("field \"", field, "\": expected a string"));
      return spec[field].get<std::string>();
    }
  };

  struct Built {
    Runner* runner;
    Sig in, out;
  };
  struct Weight {
    Tensor* tensor;
    Shape shape;
  };
  struct Tie {
    std::string where, target;
    Shape shape;
    TiedLinear* module;
  };

  // PEFT's ModulesToSaveWrapper (modules_to_save): the layer as
  // original_module (frozen) and its copy, modules_to_save.default
  // (trainable), which forward runs.
  RunnerPtr SavedCopy(Ctx& c, Sig& sig) {
    Group& wrapper = Create<Group>(c, c.parent, c.name);
    json copy = c.spec;
    copy.erase("name");
    in_saved_copy_ = true;
    Sig original = sig;
    kept_runners_.push_back(Build(copy, c.where, wrapper, original, c.pdtype, "original_module"));
    Module& saved = wrapper.Add<Group>("modules_to_save");
    created_.push_back(&saved);
    RunnerPtr r = Build(copy, c.where, saved, sig, c.pdtype, "default");
    in_saved_copy_ = false;
    saved_copies_.push_back(&saved);
    return r;
  }

  // The module that holds a layer called `name` under `parent`: a dotted
  // name ("attention.output.dense") goes through (new) groups.
  Module& Holder(Ctx& c, Module& parent, const std::string& name, std::string* last) {
    std::vector<std::string> parts = absl::StrSplit(name, '.');
    for (const std::string& p : parts) {
      if (p.empty()) c.Fail(absl::StrCat("field \"name\": \"", name, "\" has an empty component"));
    }
    Module* m = &parent;
    for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
      Module* child = m->FindChild(parts[i]);
      if (child == nullptr) {
        child = &m->Add<Group>(parts[i]);
        created_.push_back(child);
      }
      m = child;
    }
    *last = parts.back();
    return *m;
  }

  // Creates a layer's module (at the parent's own path when unnamed).
  template <class M, class... A>
  M& Create(Ctx& c, Module& parent, const std::string& name, A&&... args) {
    M* m = nullptr;
    if (name.empty()) {
      m = &parent.AddInline<M>(std::forward<A>(args)...);
    } else {
      std::string last;
      Module& holder = Holder(c, parent, name, &last);
      if (holder.FindChild(last) != nullptr)
        c.Fail(absl::StrCat("field \"name\": \"", holder.path().empty() ? last : holder.path() + "." + last,
                            "\" is used twice"));
      m = &holder.Add<M>(last, std::forward<A>(args)...);
    }
    created_.push_back(m);
    if constexpr (!std::is_same_v<M, Linear> && !std::is_same_v<M, LoraLinear>) {
      if (!m->ParameterNames().empty()) {
        const char* kind = std::is_same_v<M, Conv1D> ? "conv1d (GPT-2's Conv1D)"
                           : std::is_same_v<M, TiedLinear> ? "tied linear"
                                                           : nullptr;
        CheckNotTargeted(c, *m, kind);
      }
    }
    for (const std::string& p : m->ParameterNames()) {
      if (!param_names_.insert(p).second) {
        c.Fail(absl::StrCat("parameter \"", p, "\" exists already (give the layer a \"name\")"));
      }
    }
    return *m;
  }

  void NeedDims(Ctx& c, const Sig& sig, std::size_t dims, const char* what) const {
    if (sig.shape.size() != dims)
      c.Fail(absl::StrCat("needs a ", dims, "-d input (", what, "), got ", ShapeOf(sig.shape)));
  }
  void NeedFloat(Ctx& c, const Sig& sig) const {
    if (!IsFloating(sig.dtype))
      c.Fail(absl::StrCat("needs a floating-point input, got ", std::string(DTypeName(sig.dtype)),
                          " (token ids go to an embedding)"));
  }
  std::int64_t CheckIn(Ctx& c, std::int64_t actual, const char* field) const {
    if (c.spec.contains(field)) {
      const std::int64_t given = c.Int(field);
      if (given != actual)
        c.Fail(absl::StrCat("field \"", field, "\": ", given, " does not match the input's ", actual,
                            " (shape mismatch with the layer before)"));
    }
    return actual;
  }

  RunnerPtr Activation(Ctx& c, Sig& sig) {
    NeedFloat(c, sig);
    const std::string& t = c.type;
    std::function<Tensor(Tensor)> fn;
    if (t == "relu") {
      c.Allow({"inplace"});
      if (c.Bool("inplace", false)) {
        fn = [](Tensor x) {
          ops::ReluInPlace(x);
          return x;
        };
      } else {
        fn = [](Tensor x) { return ops::Relu(x); };
      }
    } else if (t == "gelu") {
      c.Allow({"approximate"});
      const std::string a = c.Str("approximate", "none");
      if (a != "none" && a != "tanh") c.Fail("field \"approximate\": use none or tanh");
      const bool tanh = a == "tanh";
      fn = [tanh](Tensor x) { return ops::Gelu(x, tanh); };
    } else if (t == "gelu_new") {
      c.Allow({});
      fn = [](Tensor x) { return ops::GeluNew(x); };
    } else if (t == "tanh") {
      c.Allow({});
      fn = [](Tensor x) { return ops::Tanh(x); };
    } else if (t == "sigmoid") {
      c.Allow({});
      fn = [](Tensor x) { return ops::Sigmoid(x); };
    } else {
      c.Allow({});
      fn = [](Tensor x) { return ops::Silu(x); };
    }
    return std::make_unique<FnRunner>(std::move(fn));
  }

  // A parameterless layer: attributed to its path when it has a name.
  RunnerPtr Functional(Ctx& c, RunnerPtr r) {
    if (c.name.empty()) return r;
    return std::make_unique<TagRunner>(c.Path(), std::move(r));
  }

  RunnerPtr BuildType(Ctx& c, Sig& sig) {
    const std::string& t = c.type;
    if (t == "sequential" || t == "block" || t == "repeat" || t == "residual" || t == "shared") {
      return Container(c, sig);
    }
    if (t == "branch" || t == "take") {
      return Branch(c, sig);
    }
    if (t == "linear" || t == "conv1d" || t == "conv2d" || t == "batch_norm2d" || t == "layer_norm" ||
        t == "rms_norm") {
      return WithParameters(c, sig);
    }
    if (t == "embedding") return Embedding(c, sig);
    if (t == "lstm" || t == "gru") return Rnn(c, sig);
    if (t == "dropout") {
      c.Allow({"p"});
      const double p = c.Num("p", 0.5);
      if (p < 0 || p >= 1) c.Fail("field \"p\": expected 0 <= p < 1");
      const float pf = static_cast<float>(p);
      return Functional(c, std::make_unique<FnRunner>([pf](Tensor x) { return ops::Dropout(x, pf); }));
    }
    if (t == "relu" || t == "gelu" || t == "gelu_new" || t == "tanh" || t == "sigmoid" || t == "silu") {
      return Functional(c, Activation(c, sig));
    }
    if (t == "max_pool2d" || t == "adaptive_avg_pool2d" || t == "flatten" || t == "reshape" || t == "select_token") {
      return Shaping(c, sig);
    }
    if (t == "attention") return Attention(c, sig);
    if (t == "gated_mlp") return GatedMlp(c, sig);
    if (t == "last_token") return LastToken(c, sig);
    if (t == "heads") c.Fail("\"heads\" may only be the last of the top-level layers");
    c.Fail(absl::StrCat(
        "unknown layer type \"", t,
        "\" (linear, conv1d, conv2d, batch_norm2d, layer_norm, rms_norm, embedding, lstm, gru, dropout, relu, gelu, "
        "gelu_new, tanh, sigmoid, silu, max_pool2d, adaptive_avg_pool2d, flatten, reshape, select_token, last_token, "
        "attention, gated_mlp, sequential, block, repeat, residual, shared, branch, take, heads)"));
  }

  // The module of a container's layers: a group of its own when it is named, else its parent's.
  Module& ContainerModule(Ctx& c) {
    Module* m = &c.parent;
    if (!c.name.empty()) {
      m = &Create<Group>(c, c.parent, c.name);
      c.module_path = m->path();
    }
    return *m;
  }

  // branch {"as", "layers"}: its layers run on the input and their result is
  // kept under "as"; the input goes on (BertModel's pooler, whose output the
  // next-sentence head takes). take {"from"}: a branch's result, in its place.
  RunnerPtr Branch(Ctx& c, Sig& sig) {
    if (c.type == "branch") {
      c.Allow({"as", "layers"});
      const std::string as = c.Str("as", "");
      if (as.empty()) c.Fail("missing field \"as\"");
      if (!c.spec.contains("layers")) c.Fail("missing field \"layers\"");
      Sig out = sig;
      RunnerPtr body = BuildList(c.spec["layers"], c.where + ".layers", c.parent, out, c.pdtype);
      if (!branches_.emplace(as, out).second) c.Fail(absl::StrCat("field \"as\": \"", as, "\" is used twice"));
      return std::make_unique<BranchRunner>(std::move(body), as);
    }
    c.Allow({"from"});
    const std::string from = c.Str("from", "");
    auto it = branches_.find(from);
    if (it == branches_.end()) c.Fail(absl::StrCat("field \"from\": no branch \"", from, "\" before this layer"));
    sig = it->second;
    return std::make_unique<TakeRunner>(from);
  }

  // A layer of layers: sequential, block, repeat, residual, or shared (another named layer again).
  RunnerPtr Container(Ctx& c, Sig& sig) {
    const std::string& t = c.type;
    if (t == "sequential" || t == "block") {
      c.Allow({"layers", "attention_mask", "rotary_prologue"});
      if (!c.spec.contains("layers")) c.Fail("missing field \"layers\"");
      const std::string mask = c.Str("attention_mask", "none");
      if (mask != "none" && mask != "extended")
        c.Fail("field \"attention_mask\": use none or extended (BertModel's additive mask of an all-ones attention_mask)");
      if (mask == "extended" && (sig.shape.size() != 2 || sig.dtype != DType::kInt64))
        c.Fail(absl::StrCat("field \"attention_mask\": needs (batch, tokens) ids, got ", ShapeOf(sig.shape)));
      Module* m = &ContainerModule(c);
      std::vector<RunnerPtr> children;
      const json& list = c.spec["layers"];
      if (!list.is_array()) c.Fail("field \"layers\": expected a list of layers");
      for (std::size_t i = 0; i < list.size(); ++i) {
        children.push_back(Build(list[i], absl::StrCat(c.where, ".layers[", i, "]"), *m, sig, c.pdtype, std::nullopt));
      }
      // "rotary_prologue": head_dim: LlamaModel's cache position, eager causal
      // mask and rotary cos/sin after the first layer (the embedding), and its
      // inv_freq buffer (rotary_emb, registered last).
      const std::int64_t rotary = c.spec.contains("rotary_prologue") ? c.Int("rotary_prologue") : 0;
      if (rotary > 0) Create<RotaryBuffer>(c, *m, "rotary_emb", rotary);
      return std::make_unique<SequentialRunner>(std::move(children), m->path(), t == "block", mask == "extended",
                                                rotary, options_.attention == AttentionKind::kMath);
    }
    if (t == "repeat") {
      c.Allow({"count", "start", "body"});
      const std::int64_t count = c.Int("count");
      if (count > 100000) c.Fail("field \"count\": at most 100000 copies");
      const std::int64_t start = c.Int("start", 0, 0);
      if (!c.spec.contains("body")) c.Fail("missing field \"body\"");
      Module* m = &ContainerModule(c);
      std::vector<RunnerPtr> children;
      for (std::int64_t i = 0; i < count; ++i) {
        children.push_back(Build(c.spec["body"], absl::StrCat(c.where, ".body (copy ", start + i, ")"), *m, sig,
                                 c.pdtype, absl::StrCat(start + i)));
      }
      return std::make_unique<SequentialRunner>(std::move(children), "", false);
    }
    if (t == "residual") {
      c.Allow({"body", "shortcut", "add", "order", "then", "keep"});
      if (!c.spec.contains("body")) c.Fail("missing field \"body\"");
      Module* m = &ContainerModule(c);
      const Sig in = sig;
      Sig body_sig = sig;
      RunnerPtr body = BuildList(c.spec["body"], c.where + ".body", *m, body_sig, c.pdtype);
      Sig id_sig = in;
      RunnerPtr shortcut;
      if (c.spec.contains("shortcut"))
        shortcut = BuildList(c.spec["shortcut"], c.where + ".shortcut", *m, id_sig, c.pdtype);
      if (body_sig.shape != id_sig.shape) {
        c.Fail(absl::StrCat("shape mismatch: the body gives ", ShapeOf(body_sig.shape), " but the ",
                            shortcut ? "shortcut gives " : "input is ", ShapeOf(id_sig.shape)));
      }
      const std::string add = c.Str("add", "out_of_place");
      if (add != "out_of_place" && add != "inplace") c.Fail("field \"add\": use out_of_place or inplace");
      const std::string order = c.Str("order", "body_first");
      if (order != "body_first" && order != "input_first") c.Fail("field \"order\": use body_first or input_first");
      sig = body_sig;
      RunnerPtr then;
      if (c.spec.contains("then")) then = BuildList(c.spec["then"], c.where + ".then", *m, sig, c.pdtype);
      return std::make_unique<ResidualRunner>(std::move(body), std::move(shortcut), std::move(then),
                                              add == "inplace", order == "input_first", c.Bool("keep", false));
    }
    // shared: a named layer before this one, again
    c.Allow({"ref"});
    const std::string ref = c.Str("ref", "");
    auto it = layers_.find(ref);
    if (it == layers_.end()) c.Fail(absl::StrCat("field \"ref\": no named layer \"", ref, "\" before this one"));
    if (it->second.in.shape != sig.shape)
      c.Fail(absl::StrCat("shape mismatch: \"", ref, "\" takes ", ShapeOf(it->second.in.shape), ", the input is ",
                          ShapeOf(sig.shape)));
    sig = it->second.out;
    return std::make_unique<SharedRunner>(it->second.runner);
  }

  // A layer with parameters of its own: linear, conv1d, conv2d, batch_norm2d, layer_norm, rms_norm.
  RunnerPtr WithParameters(Ctx& c, Sig& sig) {
    const std::string& t = c.type;
    if (t == "linear") {
      c.Allow({"in", "out", "bias", "tie"});
      NeedFloat(c, sig);
      const std::int64_t in = CheckIn(c, sig.shape.back(), "in");
      const std::int64_t out = c.Int("out");
      const bool bias = c.Bool("bias", true);
      sig.shape.back() = out;
      if (c.spec.contains("tie")) {
        TiedLinear& m = Create<TiedLinear>(c, c.parent, c.name, out, bias);
        c.module_path = m.path();
        ties_[m.path()] = Tie{c.where, c.Str("tie", ""), Shape{out, in}, &m};
        TiedLinear* p = &m;
        return std::make_unique<FnRunner>([p](Tensor x) { return p->Forward(x); });
      }
      std::function<Tensor(const Tensor&)> f = NewLinear(c, c.parent, c.name, in, out, bias);
      c.module_path = created_.back()->path();
      return std::make_unique<FnRunner>([f](Tensor x) { return f(x); });
    }
    if (t == "conv1d") {
      c.Allow({"in", "out"});
      NeedFloat(c, sig);
      const std::int64_t in = CheckIn(c, sig.shape.back(), "in");
      const std::int64_t out = c.Int("out");
      sig.shape.back() = out;
      Conv1D& m = Create<Conv1D>(c, c.parent, c.name, in, out);
      c.module_path = m.path();
      Conv1D* p = &m;
      return std::make_unique<FnRunner>([p](Tensor x) { return p->Forward(x); });
    }
    if (t == "conv2d") {
      c.Allow({"in", "out", "kernel", "stride", "padding", "bias"});
      NeedFloat(c, sig);
      NeedDims(c, sig, 4, "N, C, H, W");
      const std::int64_t in = CheckIn(c, sig.shape[1], "in");
      const std::int64_t out = c.Int("out"), k = c.Int("kernel"), stride = c.Int("stride", 1),
                         pad = c.Int("padding", 0, 0);
      for (int d : {2, 3}) {
        const std::int64_t o = (sig.shape[static_cast<std::size_t>(d)] + 2 * pad - k) / stride + 1;
        if (sig.shape[static_cast<std::size_t>(d)] + 2 * pad < k || o < 1)
          c.Fail(absl::StrCat("kernel ", k, " does not fit the input ", ShapeOf(sig.shape)));
        sig.shape[static_cast<std::size_t>(d)] = o;
      }
      sig.shape[1] = out;
      Conv2dLayer& m = Create<Conv2dLayer>(c, c.parent, c.name, in, out, static_cast<int>(k), static_cast<int>(stride),
                                           static_cast<int>(pad), c.Bool("bias", true));
      c.module_path = m.path();
      Conv2dLayer* p = &m;
      return std::make_unique<FnRunner>([p](Tensor x) { return p->Forward(x); });
    }
    if (t == "batch_norm2d") {
      c.Allow({"channels"});
      NeedFloat(c, sig);
      NeedDims(c, sig, 4, "N, C, H, W");
      const std::int64_t ch = CheckIn(c, sig.shape[1], "channels");
      BatchNorm2dLayer& m = Create<BatchNorm2dLayer>(c, c.parent, c.name, ch);
      c.module_path = m.path();
      BatchNorm2dLayer* p = &m;
      return std::make_unique<FnRunner>([p](Tensor x) { return p->Forward(x); });
    }
    // layer_norm or rms_norm
    c.Allow({"dim", "eps"});
    NeedFloat(c, sig);
    const std::int64_t dim = CheckIn(c, sig.shape.back(), "dim");
    if (t == "layer_norm") {
      LayerNormLayer& m = Create<LayerNormLayer>(c, c.parent, c.name, dim, static_cast<float>(c.Num("eps", 1e-5)));
      c.module_path = m.path();
      LayerNormLayer* p = &m;
      return std::make_unique<FnRunner>([p](Tensor x) { return p->Forward(x); });
    }
    RmsNorm& m = Create<RmsNorm>(c, c.parent, c.name, dim, static_cast<float>(c.Num("eps", 1e-6)));
    c.module_path = m.path();
    RmsNorm* p = &m;
    return std::make_unique<FnRunner>([p](Tensor x) { return p->Forward(x); });
  }

  // An lstm or gru layer (cuDNN's).
  RunnerPtr Rnn(Ctx& c, Sig& sig) {
    const std::string& t = c.type;
    c.Allow({"in", "hidden", "layers", "bidirectional", "batch_first"});
    NeedFloat(c, sig);
    NeedDims(c, sig, 3, c.Bool("batch_first", false) ? "batch, time, features" : "time, batch, features");
    const std::int64_t in = CheckIn(c, sig.shape[2], "in");
    const std::int64_t hidden = c.Int("hidden"), layers = c.Int("layers", 1);
    const bool bidir = c.Bool("bidirectional", false), batch_first = c.Bool("batch_first", false);
    CudnnRnnLayer& m = Create<CudnnRnnLayer>(c, c.parent, c.name, t == "lstm", in, hidden, layers, bidir);
    c.module_path = m.path();
    const std::int64_t features = hidden * (bidir ? 2 : 1);
    sig.shape[2] = features;
    CudnnRnnLayer* p = &m;
    return std::make_unique<StateFnRunner>([p, batch_first, features](Tensor x, ForwardState& s) {
      // cuDNN runs time-major: a batch_first input is transposed into a contiguous copy.
      if (batch_first) x = ops::Contiguous(ops::Transpose(x, 0, 1));
      const std::int64_t steps = x.sizes()[0], batch = x.sizes()[1];
      ops::RnnResult r = p->Forward(ops::View(x, {-1, x.sizes()[2]}), batch);
      x = Tensor();
      // The (h, c) tuple dies last item first, as CPython's tuple does.
      if (r.cy.defined()) s.locals.push_back(r.cy);
      s.locals.push_back(r.hy);
      Tensor out = ops::View(r.output, {steps, batch, features});
      return batch_first ? ops::Transpose(out, 0, 1) : out;
    });
  }

  // A parameterless layer that changes the shape: max_pool2d, adaptive_avg_pool2d, flatten, reshape, select_token.
  RunnerPtr Shaping(Ctx& c, Sig& sig) {
    const std::string& t = c.type;
    if (t == "max_pool2d") {
      c.Allow({"kernel", "stride", "padding"});
      NeedDims(c, sig, 4, "N, C, H, W");
      const std::int64_t k = c.Int("kernel"), stride = c.Int("stride", k), pad = c.Int("padding", 0, 0);
      if (2 * pad > k) c.Fail("field \"padding\": at most half the kernel");
      for (int d : {2, 3}) {
        const std::int64_t size = sig.shape[static_cast<std::size_t>(d)];
        if (size + 2 * pad < k) c.Fail(absl::StrCat("kernel ", k, " does not fit the input ", ShapeOf(sig.shape)));
        sig.shape[static_cast<std::size_t>(d)] = (size + 2 * pad - k) / stride + 1;
      }
      const int ki = static_cast<int>(k), si = static_cast<int>(stride), pi = static_cast<int>(pad);
      return Functional(c,
                        std::make_unique<FnRunner>([ki, si, pi](Tensor x) { return ops::MaxPool2d(x, ki, si, pi); }));
    }
    if (t == "adaptive_avg_pool2d") {
      c.Allow({"output"});
      NeedDims(c, sig, 4, "N, C, H, W");
      std::int64_t oh = 1, ow = 1;
      if (c.spec.contains("output")) {
        const json& o = c.spec["output"];
        if (!o.is_array() || o.size() != 2 || !o[0].is_number_integer() || !o[1].is_number_integer() ||
            o[0].get<std::int64_t>() < 1 || o[1].get<std::int64_t>() < 1)
          c.Fail("field \"output\": expected [height, width]");
        oh = o[0].get<std::int64_t>();
        ow = o[1].get<std::int64_t>();
      }
      sig.shape[2] = oh;
      sig.shape[3] = ow;
      return Functional(c,
                        std::make_unique<FnRunner>([oh, ow](Tensor x) { return ops::AdaptiveAvgPool2d(x, oh, ow); }));
    }
    if (t == "flatten") {
      c.Allow({"start_dim"});
      const std::int64_t start = c.Int("start_dim", 1, 0);
      if (start >= static_cast<std::int64_t>(sig.shape.size()))
        c.Fail(absl::StrCat("field \"start_dim\": the input ", ShapeOf(sig.shape), " has ", sig.shape.size(), " dims"));
      Shape s(sig.shape.begin(), sig.shape.begin() + start);
      std::int64_t rest = 1;
      for (std::size_t i = static_cast<std::size_t>(start); i < sig.shape.size(); ++i) rest *= sig.shape[i];
      s.push_back(rest);
      sig.shape = s;
      const int sd = static_cast<int>(start);
      return Functional(c, std::make_unique<FnRunner>([sd](Tensor x) { return ops::Flatten(x, sd); }));
    }
    if (t == "reshape") {
      c.Allow({"shape"});
      if (!c.spec.contains("shape")) c.Fail("missing field \"shape\"");
      Shape s;
      int infer = -1;
      std::int64_t known = 1;
      for (const json& e : c.spec["shape"]) {
        if (e.is_number_integer() && e.get<std::int64_t>() == -1 && infer < 0) {
          infer = static_cast<int>(s.size());
          s.push_back(-1);
          continue;
        }
        Shape one = ParseShape(json::array({e}), c.where + " field \"shape\"", false);
        s.push_back(one[0]);
        known *= one[0];
      }
      const std::int64_t n = NumElements(sig.shape);
      if (infer >= 0) {
        if (n % known != 0) c.Fail(absl::StrCat("field \"shape\": ", ShapeOf(sig.shape), " cannot be reshaped to it"));
        s[static_cast<std::size_t>(infer)] = n / known;
      }
      if (NumElements(s) != n)
        c.Fail(absl::StrCat("field \"shape\": ", ShapeOf(s), " has not the ", n, " elements of ", ShapeOf(sig.shape)));
      sig.shape = s;
      return Functional(c, std::make_unique<FnRunner>([s](Tensor x) { return ops::Reshape(x, s); }));
    }
    // select_token
    c.Allow({"index"});
    NeedDims(c, sig, 3, "batch, tokens, features");
    const std::int64_t index = c.Int("index", 0, 0);
    if (index >= sig.shape[1]) c.Fail(absl::StrCat("field \"index\": the input has ", sig.shape[1], " tokens"));
    sig.shape = {sig.shape[0], sig.shape[2]};
    // x[:, index]: a slice of dim 0 (whole, but a node of its own) and a select; each backward makes a zero tensor.
    return Functional(c, std::make_unique<FnRunner>(
                             [index](Tensor x) { return ops::Select(ops::Narrow(x, 0, 0, x.sizes()[0]), 1, index); }));
  }

  // last_token {"pad_token_id"}: (batch, tokens, features) to (batch,
  // features), each row's last token before the first padding token, as a
  // decoder's *ForSequenceClassification pools its logits (LastTokenRunner).
  RunnerPtr LastToken(Ctx& c, Sig& sig) {
    c.Allow({"pad_token_id"});
    NeedDims(c, sig, 3, "batch, tokens, features");
    std::optional<std::int64_t> pad;
    if (c.spec.contains("pad_token_id")) pad = c.Int("pad_token_id", std::nullopt, 0);
    if (pad) {
      const Shape& ids = root_.input_shape_;
      if (root_.input_dtype_ != DType::kInt64 || ids.size() != 2 || ids[0] != sig.shape[0] || ids[1] != sig.shape[1])
        c.Fail(absl::StrCat("field \"pad_token_id\": needs the model's input to be the (batch, tokens) ids of the ",
                            ShapeOf(sig.shape), " input"));
    } else if (sig.shape[0] > 1) {
      c.Fail(absl::StrCat("batch ", sig.shape[0],
                          " without \"pad_token_id\": transformers refuses it (\"Cannot handle batch sizes > 1 if no "
                          "padding token is defined.\")"));
    }
    sig.shape = {sig.shape[0], sig.shape[2]};
    return Functional(c, std::make_unique<LastTokenRunner>(pad));
  }

  RunnerPtr Embedding(Ctx& c, Sig& sig) {
    c.Allow({"num", "dim", "padding_idx", "positions", "token_types"});
    if (sig.dtype != DType::kInt64)
      c.Fail(absl::StrCat("needs token ids (an int64 input), got ", std::string(DTypeName(sig.dtype))));
    const std::int64_t num = c.Int("num"), dim = c.Int("dim");
    const std::int64_t padding = c.spec.contains("padding_idx") ? c.Int("padding_idx", 0, 0) : -1;
    EmbeddingLayer& m = Create<EmbeddingLayer>(c, c.parent, c.name, num, dim, padding);
    c.module_path = m.path();
    weights_[m.path()] = Weight{&m.weight(), Shape{num, dim}};
    // Extra tables added to the tokens' embedding: {"name", "num", "padding_idx"}.
    auto table = [&](const char* field) -> EmbeddingLayer* {
      if (!c.spec.contains(field)) return nullptr;
      const json& p = c.spec[field];
      if (!p.is_object() || !p.contains("name") || !p["name"].is_string() || !p.contains("num") ||
          !p["num"].is_number_integer() || p["num"].get<std::int64_t>() < 1)
        c.Fail(absl::StrCat("field \"", field, "\": expected {\"name\": ..., \"num\": ...}"));
      const std::int64_t pad =
          p.contains("padding_idx") && p["padding_idx"].is_number_integer() ? p["padding_idx"].get<std::int64_t>() : -1;
      EmbeddingLayer& e =
          Create<EmbeddingLayer>(c, c.parent, p["name"].get<std::string>(), p["num"].get<std::int64_t>(), dim, pad);
      return &e;
    };
    EmbeddingLayer* positions = table("positions");  // registered before token types, as BertEmbeddings does
    EmbeddingLayer* token_types = table("token_types");
    if (positions != nullptr) {
      if (sig.shape.size() != 2) c.Fail(absl::StrCat("positions need (batch, tokens) ids, got ", ShapeOf(sig.shape)));
      const std::int64_t max = c.spec["positions"]["num"].get<std::int64_t>();
      if (sig.shape[1] > max)
        c.Fail(absl::StrCat("field \"positions\": ", max, " positions, the sequence has ", sig.shape[1]));
    }
    sig.shape.push_back(dim);
    sig.dtype = c.pdtype;
    EmbeddingLayer* p = &m;
    if (token_types != nullptr) {
      const std::int64_t max = positions != nullptr ? c.spec["positions"]["num"].get<std::int64_t>() : sig.shape[1];
      BertIdBuffers& ids = Create<BertIdBuffers>(c, c.parent, "", max);
      // Position ids counted from the tokens (RoBERTa) when the position table has a padding index.
      const json& pt = c.spec.contains("positions") ? c.spec["positions"] : json();
      const std::int64_t position_padding =
          pt.is_object() && pt.contains("padding_idx") && pt["padding_idx"].is_number_integer()
              ? pt["padding_idx"].get<std::int64_t>()
              : -1;
      return std::make_unique<BertEmbeddingRunner>(p, positions, token_types, &ids, position_padding);
    }
    return std::make_unique<StateFnRunner>([p, positions](Tensor x, ForwardState& s) {
      if (positions == nullptr) return p->Forward(x);
      // GPT2Model.forward: position_ids = arange(T).unsqueeze(0), then
      // inputs_embeds = wte(ids), position_embeds = wpe(position_ids), their
      // sum; all three are locals until the enclosing block returns.
      Tensor position_ids = Tensor::Empty(x.ctx(), {1, x.sizes()[1]}, DType::kInt64);
      Tensor inputs_embeds = p->Forward(x);
      Tensor position_embeds = positions->Forward(position_ids);
      Tensor sum = ops::Add(inputs_embeds, position_embeds);
      s.locals.insert(s.locals.end(), {position_ids, inputs_embeds, position_embeds});
      return sum;
    });
  }

  // A projection of an attention or MLP layer: Linear (or GPT-2's Conv1D) named `name` under `m`.
  std::function<Tensor(const Tensor&)> Projection(Ctx& c, Module& m, const std::string& name, std::int64_t in,
                                                  std::int64_t out, bool bias, bool conv1d) {
    Ctx sub{c.spec, c.where, c.type, name, m, c.pdtype, ""};
    if (conv1d) {
      Conv1D& p = Create<Conv1D>(sub, m, name, in, out);
      return [&p](const Tensor& x) { return p.Forward(x); };
    }
    return NewLinear(sub, m, name, in, out, bias);
  }

  // The name PEFT matches a module by: its path in the base model (without
  // PeftModel's "base_model.model.").
  std::string Key(const std::string& path) const {
    const std::string& root = root_.path();
    if (root.empty()) return path;
    if (path == root) return "";
    return path.substr(root.size() + 1);
  }
  static std::string PathOf(const Module& parent, const std::string& name) {
    if (name.empty()) return parent.path();
    return parent.path().empty() ? name : absl::StrCat(parent.path(), ".", name);
  }

  // nn.Linear, or PEFT's lora.Linear around it when the adapter config targets it.
  std::function<Tensor(const Tensor&)> NewLinear(Ctx& c, Module& parent, const std::string& name, std::int64_t in,
                                                 std::int64_t out, bool bias) {
    const std::string key = Key(PathOf(parent, name));
    if (lora_ != nullptr && !key.empty() && !(lora_->all_linear && key == output_layer_) && lora_->Targets(key)) {
      LoraLinear& m = Create<LoraLinear>(c, parent, name, in, out, bias, *lora_);
      lora_modules_.push_back(&m);
      weights_[m.path()] = Weight{&m.base_weight(), Shape{out, in}};
      LoraLinear* p = &m;
      return [p](const Tensor& x) { return p->Forward(x); };
    }
    Linear& m = Create<Linear>(c, parent, name, in, out, bias);
    weights_[m.path()] = Weight{&m.weight(), Shape{out, in}};
    return [&m](const Tensor& x) { return m.Forward(x); };
  }

  // A layer other than a linear that the adapter config targets: LoRA on it is not modelled.
  // `linear_kind`: what all-linear would target too (names the layer kind), else null.
  void CheckNotTargeted(Ctx& c, const Module& m, const char* linear_kind) const {
    if (lora_ == nullptr) return;
    const std::string key = Key(m.path());
    if (key.empty() || (lora_->all_linear && key == output_layer_) || !lora_->Targets(key)) return;
    if (lora_->all_linear && linear_kind == nullptr) return;
    c.Fail(absl::StrCat("adapter config ", lora_->source, ": field \"target_modules\" matches \"", key,
                        "\": LoRA on ", linear_kind != nullptr ? linear_kind : c.type.c_str(),
                        " layers is not modelled (linear layers only)"));
  }

  std::string ProjName(Ctx& c, const char* role, const std::string& def) {
    if (!c.spec.contains("names")) return def;
    const json& n = c.spec["names"];
    if (!n.is_object()) c.Fail("field \"names\": expected an object such as {\"q\": \"q_proj\"}");
    if (!n.contains(role)) return def;
    if (!n[role].is_string()) c.Fail(absl::StrCat("field \"names\": \"", role, "\" must be a string"));
    return n[role].get<std::string>();
  }

  RunnerPtr Attention(Ctx& c, Sig& sig) {
    c.Allow({"heads", "kv_heads", "head_dim", "projection", "bias", "out_bias", "causal", "mask", "max_positions",
             "rotary", "dropout", "out_dropout", "cache", "names"});
    NeedFloat(c, sig);
    NeedDims(c, sig, 3, "batch, tokens, features");
    const std::int64_t d = sig.shape[2];
    AttentionSpec a;
    a.kernel = options_.attention;
    a.compute_capability = options_.compute_capability;
    a.heads = c.Int("heads");
    a.kv_heads = c.Int("kv_heads", a.heads);
    if (a.heads % a.kv_heads != 0)
      c.Fail(absl::StrCat("field \"kv_heads\": ", a.kv_heads, " does not divide heads ", a.heads));
    if (!c.spec.contains("head_dim") && d % a.heads != 0)
      c.Fail(absl::StrCat("field \"heads\": ", a.heads, " does not divide the input's ", d, " features"));
    a.head_dim = c.Int("head_dim", d / a.heads);
    const std::string projection = c.Str("projection", "separate");
    if (projection != "separate" && projection != "fused_conv1d")
      c.Fail("field \"projection\": use separate (q, k, v, o linears) or fused_conv1d (GPT-2's c_attn, c_proj)");
    a.fused = projection == "fused_conv1d";
    if (a.fused && a.kv_heads != a.heads) c.Fail("field \"kv_heads\": fused_conv1d has one head count");
    a.causal = c.Bool("causal", true);
    a.rotary = c.Bool("rotary", false);
    const double p = c.Num("dropout", 0);
    if (p < 0 || p >= 1) c.Fail("field \"dropout\": expected 0 <= p < 1");
    a.dropout = static_cast<float>(p);
    const double out_p = c.Num("out_dropout", 0);
    if (out_p < 0 || out_p >= 1) c.Fail("field \"out_dropout\": expected 0 <= p < 1");
    a.out_dropout = static_cast<float>(out_p);
    // use_cache: HF turns it off under gradient checkpointing. "forward": the
    // cache lives until forward returns (the head does not return past_key_values).
    if (c.spec.contains("cache") && c.spec["cache"].is_string()) {
      if (c.spec["cache"] != "forward") c.Fail("field \"cache\": use true, false or \"forward\"");
      a.cache = true;
      a.cache_returned = false;
    } else {
      a.cache = c.Bool("cache", false);
    }
    a.cache = a.cache && !options_.checkpoint_activations;
    const std::string mask = c.Str("mask", "none");
    if (mask != "none" && mask != "buffer" && mask != "additive")
      c.Fail("field \"mask\": use none, buffer (GPT-2's bool buffer \"bias\") or additive (BERT's extended mask)");
    a.additive_mask = mask == "additive";
    if (a.additive_mask && (a.fused || a.rotary || a.kv_heads != a.heads))
      c.Fail("field \"mask\": additive is BERT's attention (separate q, k, v; no rotary; no grouped heads)");
    std::int64_t positions = 0;
    if (mask == "buffer") {
      positions = c.Int("max_positions");
      if (sig.shape[1] > positions)
        c.Fail(absl::StrCat("field \"max_positions\": ", positions, ", the sequence has ", sig.shape[1]));
    }
    AttentionModule& m = Create<AttentionModule>(c, c.parent, c.name, positions);
    c.module_path = m.path();
    a.mask_buffer = m.mask();
    const bool bias = c.Bool("bias", true), out_bias = c.Bool("out_bias", bias);
    const std::int64_t inner = a.heads * a.head_dim, kv = a.kv_heads * a.head_dim;
    if (a.fused) {
      a.qkv = Projection(c, m, ProjName(c, "qkv", "c_attn"), d, 3 * inner, true, true);
      a.o = Projection(c, m, ProjName(c, "o", "c_proj"), inner, d, true, true);
    } else {
      a.q = Projection(c, m, ProjName(c, "q", "q_proj"), d, inner, bias, false);
      a.k = Projection(c, m, ProjName(c, "k", "k_proj"), d, kv, bias, false);
      a.v = Projection(c, m, ProjName(c, "v", "v_proj"), d, kv, bias, false);
      a.o = Projection(c, m, ProjName(c, "o", "o_proj"), inner, d, out_bias, false);
    }
    return std::make_unique<AttentionRunner>(std::move(a));
  }

  // LlamaMLP: down(act(gate(x)) * up(x)).
  RunnerPtr GatedMlp(Ctx& c, Sig& sig) {
    c.Allow({"hidden", "activation", "bias", "names"});
    NeedFloat(c, sig);
    const std::int64_t d = sig.shape.back(), hidden = c.Int("hidden");
    const std::string act = c.Str("activation", "silu");
    if (act != "silu" && act != "gelu" && act != "gelu_tanh")
      c.Fail("field \"activation\": use silu, gelu or gelu_tanh");
    const bool bias = c.Bool("bias", false);
    Module* m = &c.parent;
    if (!c.name.empty()) {
      m = &Create<Group>(c, c.parent, c.name);
      c.module_path = m->path();
    }
    auto gate = Projection(c, *m, ProjName(c, "gate", "gate_proj"), d, hidden, bias, false);
    auto up = Projection(c, *m, ProjName(c, "up", "up_proj"), d, hidden, bias, false);
    auto down = Projection(c, *m, ProjName(c, "down", "down_proj"), hidden, d, bias, false);
    return std::make_unique<FnRunner>([gate, up, down, act](Tensor x) {
      Tensor g = gate(x);
      g = act == "silu" ? ops::Silu(g) : ops::Gelu(g, act == "gelu_tanh");
      Tensor u = up(x);
      x = Tensor();
      Tensor h = ops::Mul(g, u);
      g = u = Tensor();
      return down(h);
    });
  }

  FileModel& root_;
  const ModelOptions& options_;
  std::int64_t batch_, seq_;
  bool has_seq_;
  bool any_checkpoint_ = false;
  std::vector<Module*> created_;
  std::set<std::string> param_names_;
  std::map<std::string, Built> layers_;
  std::map<std::string, Sig> branches_;  // "branch" results by name (what a "take" gives)
  std::map<std::string, Weight> weights_;
  std::map<std::string, Tie> ties_;
  const LoraConfig* lora_;
  std::string output_layer_;
  std::vector<LoraLinear*> lora_modules_;
  std::vector<Module*> saved_copies_;  // modules_to_save.default of each ModulesToSaveWrapper
  bool in_saved_copy_ = false;
  std::vector<RunnerPtr> kept_runners_;  // the original modules' (never run)
};

void CheckKeys(const json& spec, std::initializer_list<const char*> allowed, const std::string& where) {
  for (auto it = spec.begin(); it != spec.end(); ++it) {
    bool ok = false;
    for (const char* f : allowed) ok = ok || it.key() == f;
    if (!ok) throw SpecError{absl::StrCat(where, ": unknown field \"", it.key(), "\"")};
  }
}

LossSpec ParseLoss(const json& j, const std::string& where) {
  LossSpec l;
  if (j.is_null()) return l;
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    throw SpecError{absl::StrCat(where, ": expected {\"type\": \"cross_entropy\", \"mse\" or \"span\"}")};
  CheckKeys(j, {"type", "shift", "upcast", "reduction", "ignore_index", "comment"}, where);
  const std::string type = j["type"].get<std::string>();
  if (type == "mse") {
    l.mse = true;
  } else if (type == "span") {
    l.span = true;
    if (j.contains("shift") || j.contains("upcast") || j.contains("reduction") || j.contains("ignore_index"))
      throw SpecError{absl::StrCat(where, ": \"span\" takes no shift, upcast, reduction or ignore_index")};
    return l;
  } else if (type != "cross_entropy") {
    throw SpecError{
        absl::StrCat(where, ": field \"type\": unknown loss \"", type, "\" (cross_entropy, mse or span)")};
  }
  if (j.contains("shift")) {
    if (!j["shift"].is_boolean()) throw SpecError{absl::StrCat(where, ": field \"shift\": expected true or false")};
    l.shift = j["shift"].get<bool>();
  }
  if (j.contains("upcast")) {
    if (!j["upcast"].is_boolean() || l.mse)
      throw SpecError{absl::StrCat(where, ": field \"upcast\": true or false, for cross_entropy")};
    l.upcast = j["upcast"].get<bool>();
  }
  if (j.contains("reduction")) {
    const std::string r = j["reduction"].is_string() ? j["reduction"].get<std::string>() : "";
    if (r == "sum") {
      l.reduction = ops::Reduction::kSum;
    } else if (r != "mean") {
      throw SpecError{absl::StrCat(where, ": field \"reduction\": use mean or sum")};
    }
  }
  if (j.contains("ignore_index")) {
    if (!j["ignore_index"].is_number_integer())
      throw SpecError{absl::StrCat(where, ": field \"ignore_index\": expected an integer")};
    l.ignore_index = j["ignore_index"].get<std::int64_t>();
  }
  return l;
}

// The target of a head given its output and loss; `j` may be null (the default target).
TargetSpec ParseTarget(const json& j, const std::string& where, const Builder& b, const Sig& out, const LossSpec& loss,
                       const Shape& input_shape, DType input_dtype) {
  TargetSpec t;
  if (loss.span) {  // (batch, tokens, 2) logits; (batch, 2) int64 start and end positions
    if (out.shape.size() != 3 || out.shape[2] != 2)
      throw SpecError{absl::StrCat(where, ": span needs (batch, tokens, 2) outputs, got ", ShapeOf(out.shape))};
    if (!j.is_null()) throw SpecError{absl::StrCat(where, ": span's target is (batch, 2) positions; give none")};
    t.shape = {out.shape[0], 2};
    return t;
  }
  if (loss.mse) {
    if (!IsFloating(out.dtype)) throw SpecError{absl::StrCat(where, ": mse needs a floating-point output")};
    t.shape = out.shape;
    t.dtype = out.dtype;
  } else {
    if (out.shape.size() < 2)
      throw SpecError{absl::StrCat(where, ": cross_entropy needs (..., classes) outputs, got ", ShapeOf(out.shape))};
    t.shape = Shape(out.shape.begin(), out.shape.end() - 1);
    t.dtype = DType::kInt64;
  }
  if (!j.is_null()) {
    if (!j.is_object()) throw SpecError{absl::StrCat(where, ": expected an object")};
    CheckKeys(j, {"from", "shape", "dtype", "classes", "comment"}, where);
    if (j.contains("from")) {
      if (!j["from"].is_string() || j["from"].get<std::string>() != "input")
        throw SpecError{absl::StrCat(where, ": field \"from\": only \"input\" (labels = the input ids)")};
      t.from_input = true;
      t.shape = input_shape;
      t.dtype = input_dtype;
    } else {
      if (j.contains("shape")) t.shape = b.ParseShape(j["shape"], absl::StrCat(where, ": field \"shape\""), true);
      if (j.contains("dtype")) {
        const std::optional<DType> d =
            j["dtype"].is_string() ? ParseDType(j["dtype"].get<std::string>()) : std::nullopt;
        if (!d) throw SpecError{absl::StrCat(where, ": field \"dtype\": use float32, float16, bfloat16 or int64")};
        t.dtype = *d;
      }
    }
    if (j.contains("classes")) {
      if (!j["classes"].is_number_integer() || loss.mse)
        throw SpecError{absl::StrCat(where, ": field \"classes\": an integer, for cross_entropy")};
      if (j["classes"].get<std::int64_t>() != out.shape.back())
        throw SpecError{absl::StrCat(where, ": field \"classes\": ", j["classes"].get<std::int64_t>(),
                                     " classes but the model's output ", ShapeOf(out.shape), " has ",
                                     out.shape.back())};
    }
  }
  if (loss.mse) {
    if (t.shape != out.shape)
      throw SpecError{absl::StrCat(where, ": shape mismatch: the target is ", ShapeOf(t.shape), ", the output ",
                                   ShapeOf(out.shape))};
  } else {
    if (t.dtype != DType::kInt64) throw SpecError{absl::StrCat(where, ": cross_entropy needs int64 class ids")};
    if (loss.shift) {
      if (t.shape.size() != 2 || out.shape.size() != 3 || t.shape[0] != out.shape[0] || t.shape[1] != out.shape[1])
        throw SpecError{
            absl::StrCat(where, ": \"shift\" needs (batch, tokens) labels and (batch, tokens, vocab) outputs; got ",
                         ShapeOf(t.shape), " and ", ShapeOf(out.shape))};
    } else if (NumElements(t.shape) * out.shape.back() != NumElements(out.shape)) {
      throw SpecError{
          absl::StrCat(where, ": shape mismatch: ", ShapeOf(t.shape), " labels for outputs ", ShapeOf(out.shape))};
    }
  }
  return t;
}

// The output layer ("output_layer", else the last top-level layer when it is
// a named linear): what LoRA's "all-linear" leaves alone.
std::string OutputLayer(const json& spec) {
  if (spec.contains("output_layer")) {
    if (!spec["output_layer"].is_string()) throw SpecError{"field \"output_layer\": expected a layer's path (or \"\")"};
    return spec["output_layer"].get<std::string>();
  }
  const json& layers = spec["layers"];
  if (layers.is_array() && !layers.empty() && layers.back().is_object() && layers.back().value("type", json()) == "linear" &&
      layers.back().contains("name") && layers.back()["name"].is_string())
    return layers.back()["name"].get<std::string>();
  return "";
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> ModelFromJson(const json& spec, std::string_view source,
                                                     const ModelOptions& options) {
  const std::string prefix = "model file " + std::string(source) + ": ";
  try {
    if (!spec.is_object()) throw SpecError{"expected a JSON object"};
    CheckKeys(
        spec,
        {"format", "name", "batch_size", "seq_len", "param_dtype", "input", "target", "loss", "layers", "output_layer",
         "comment"},
        "top level");
    if (!spec.contains("format") || spec["format"] != "memscope.model/1")
      throw SpecError{"field \"format\": expected \"memscope.model/1\""};
    for (const char* f : {"input", "layers"}) {
      if (!spec.contains(f)) throw SpecError{absl::StrCat("missing field \"", f, "\"")};
    }
    auto positive = [&](const char* f, std::int64_t def) {
      if (!spec.contains(f)) return def;
      if (!spec[f].is_number_integer() || spec[f].get<std::int64_t>() < 1)
        throw SpecError{absl::StrCat("field \"", f, "\": expected a positive integer")};
      return spec[f].get<std::int64_t>();
    };
    const std::int64_t batch = options.batch_size > 0 ? options.batch_size : positive("batch_size", 1);
    const std::int64_t file_seq = positive("seq_len", 0);
    const std::int64_t seq = options.seq_len > 0 ? options.seq_len : file_seq;
    DType pdtype = DType::kFloat32;
    if (spec.contains("param_dtype")) {
      const std::optional<DType> d =
          spec["param_dtype"].is_string() ? ParseDType(spec["param_dtype"].get<std::string>()) : std::nullopt;
      if (!d || !IsFloating(*d)) throw SpecError{"field \"param_dtype\": use float32, float16 or bfloat16"};
      pdtype = *d;
    }
    if (options.param_dtype) pdtype = *options.param_dtype;  // --dtype
    const std::string name =
        spec.contains("name") && spec["name"].is_string() ? spec["name"].get<std::string>() : std::string(source);
    // PEFT's PeftModel holds the model as base_model.model.
    auto model = std::make_unique<FileModel>(name, options.lora ? "base_model.model" : "");
    Builder b(*model, options, batch, seq, seq > 0);
    b.set_output_layer(OutputLayer(spec));

    const json& input = spec["input"];
    if (!input.is_object() || !input.contains("shape")) throw SpecError{"input: missing field \"shape\""};
    CheckKeys(input, {"shape", "dtype", "vocab", "comment"}, "input");
    model->input_shape_ = b.ParseShape(input["shape"], "input: field \"shape\"", true);
    model->input_dtype_ = pdtype;
    if (input.contains("vocab")) model->input_dtype_ = DType::kInt64;
    if (input.contains("dtype")) {
      const std::optional<DType> d =
          input["dtype"].is_string() ? ParseDType(input["dtype"].get<std::string>()) : std::nullopt;
      if (!d) throw SpecError{"input: field \"dtype\": use float32, float16, bfloat16 or int64"};
      model->input_dtype_ = *d;
    }
    Sig sig{model->input_shape_, model->input_dtype_};

    // The layers; a last "heads" layer splits into heads with a loss each.
    const json& layers = spec["layers"];
    if (!layers.is_array() || layers.empty()) throw SpecError{"field \"layers\": expected a non-empty list"};
    json trunk = layers;
    json heads;
    if (layers.back().is_object() && layers.back().value("type", "") == "heads") {
      heads = layers.back();
      trunk.erase(trunk.size() - 1);
      if (spec.contains("loss") || spec.contains("target"))
        throw SpecError{"with \"heads\", each head has its own \"loss\" and \"target\""};
    }
    model->trunk_ = b.BuildList(trunk, "layers", *model, sig, pdtype);
    if (heads.is_null()) {
      Head h;
      h.loss = ParseLoss(spec.value("loss", json()), "loss");
      h.target =
          ParseTarget(spec.value("target", json()), "target", b, sig, h.loss, model->input_shape_, model->input_dtype_);
      model->heads_.push_back(std::move(h));
    } else {
      const std::string where = absl::StrCat("layers[", layers.size() - 1, "] (heads)");
      CheckKeys(heads, {"type", "heads", "comment"}, where);
      if (!heads.contains("heads") || !heads["heads"].is_array() || heads["heads"].empty())
        throw SpecError{absl::StrCat(where, ": field \"heads\": expected a non-empty list")};
      for (std::size_t i = 0; i < heads["heads"].size(); ++i) {
        const json& hj = heads["heads"][i];
        const std::string hw = absl::StrCat(where, ".heads[", i, "]");
        if (!hj.is_object()) throw SpecError{absl::StrCat(hw, ": expected an object")};
        CheckKeys(hj, {"layers", "loss", "target", "comment"}, hw);
        Sig hs = sig;
        Head h;
        if (hj.contains("layers")) h.runner = b.BuildList(hj["layers"], hw + ".layers", *model, hs, pdtype);
        h.loss = ParseLoss(hj.value("loss", json()), hw + ".loss");
        h.target = ParseTarget(hj.value("target", json()), hw + ".target", b, hs, h.loss, model->input_shape_,
                               model->input_dtype_);
        model->heads_.push_back(std::move(h));
      }
    }
    b.ResolveTies();
    b.ApplyLora();
    if (options.checkpoint_activations && !b.any_checkpoint())
      throw SpecError{"--checkpoint-activations: no layer is marked \"checkpoint\": true"};
    model->set_batch_size(batch);
    return std::unique_ptr<Model>(std::move(model));
  } catch (const SpecError& e) {
    return absl::InvalidArgumentError(prefix + e.message);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(prefix + e.what());
  }
}

absl::StatusOr<std::unique_ptr<Model>> LoadModelFile(std::string_view path, const ModelOptions& options) {
  absl::StatusOr<std::string> text = ReadInputFile(path, "model file", kMaxModelFileBytes);
  if (!text.ok()) return text.status();
  json spec = json::parse(*text, nullptr, false);
  if (spec.is_discarded()) {
    // Parse again for the position of the error.
    try {
      json again = json::parse(*text);
    } catch (const json::parse_error& e) {
      return absl::InvalidArgumentError(absl::StrCat("model file ", std::string(path), ": not JSON: ", e.what()));
    }
    return absl::InvalidArgumentError(absl::StrCat("model file ", std::string(path), ": not JSON"));
  }
  return ModelFromJson(spec, path, options);
}

}  // namespace memscope
