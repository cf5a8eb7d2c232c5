#include "train/models.h"

#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "allocator/alloc_tag.h"
#include "train/hf_config.h"
#include "train/model_file.h"

namespace memscope {
namespace {

using ops::Reduction;

// A module that only groups children (nn.Sequential, nn.ModuleList).
class Group : public Module {
 public:
  using Module::Module;
};

Tensor InputTensor(DeviceContext& ctx, const Shape& shape, DType dtype) {
  ScopedTag tag(Category::kInput, "batch");
  return Tensor::Empty(ctx, shape, dtype);
}

// ------------------------------------------------------------------ mlp

class Mlp final : public Model {
 public:
  Mlp(std::int64_t in, std::int64_t width, std::int64_t depth, std::int64_t classes, std::int64_t batch,
      bool checkpoint)
      : Model(""), in_(in), classes_(classes), checkpoint_(checkpoint) {
    batch_size_ = batch;
    std::int64_t prev = in;
    for (std::int64_t i = 0; i < depth; ++i) {
      hidden_.push_back(&Add<Linear>("layers." + std::to_string(i), prev, width));
      prev = width;
    }
    head_ = &Add<Linear>("head", prev, classes);
  }
  std::string_view name() const override { return "mlp"; }

  Batch MakeBatch(DeviceContext& ctx, std::int64_t step) override {
    Batch b{InputTensor(ctx, {batch_size_, in_}, DType::kFloat32), InputTensor(ctx, {batch_size_}, DType::kInt64)};
    if (ctx.computes()) {
      // Four fixed global batches; labels from a fixed random linear teacher.
      std::mt19937_64 rng(1000 + static_cast<std::uint64_t>(step % 4));
      std::uniform_real_distribution<float> u(-1, 1);
      const std::int64_t first = shard_rank_ * batch_size_ * in_;  // this rank's rows
      for (std::int64_t i = 0; i < batch_size_ * shard_world_ * in_; ++i) {
        const float v = u(rng);
        if (i >= first && i < first + b.input.numel()) b.input.data()[i - first] = v;
      }
      std::mt19937_64 teacher_rng(7);
      std::vector<float> teacher(static_cast<std::size_t>(classes_ * in_));
      for (float& w : teacher) w = u(teacher_rng);
      for (std::int64_t r = 0; r < batch_size_; ++r) {
        std::int64_t best = 0;
        float best_v = -1e30f;
        for (std::int64_t c = 0; c < classes_; ++c) {
          float v = 0;
          for (std::int64_t j = 0; j < in_; ++j)
            v += teacher[static_cast<std::size_t>(c * in_ + j)] * b.input.data()[r * in_ + j];
          if (v > best_v) {
            best_v = v;
            best = c;
          }
        }
        b.target.data_i64()[r] = best;
      }
    }
    return b;
  }

  Tensor Forward(const Batch& batch) override {
    Tensor x = batch.input;
    for (Linear* layer : hidden_) {
      auto block = [layer](const Tensor& in) { return ops::Relu(layer->Forward(in)); };
      x = checkpoint_ ? Checkpoint(block, x) : block(x);
    }
    return head_->Forward(x);
  }

  Tensor Loss(const Tensor& output, const Batch& batch) override {
    ScopedTag tag(Category::kActivation, "loss");
    return ops::CrossEntropy(output, batch.target);
  }

 private:
  std::int64_t in_, classes_;
  bool checkpoint_;
  std::vector<Linear*> hidden_;
  Linear* head_;
};

// ------------------------------------------------------------------ cifar-net

// The Net of the PyTorch CIFAR-10 tutorial.
class CifarNet final : public Model {
 public:
  explicit CifarNet(std::int64_t batch)
      : Model(""),
        conv1_(Add<Conv2dLayer>("conv1", 3, 6, 5)),
        conv2_(Add<Conv2dLayer>("conv2", 6, 16, 5)),
        fc1_(Add<Linear>("fc1", 16 * 5 * 5, 120)),
        fc2_(Add<Linear>("fc2", 120, 84)),
        fc3_(Add<Linear>("fc3", 84, 10)) {
    batch_size_ = batch;
  }
  std::string_view name() const override { return "cifar-net"; }

  Batch MakeBatch(DeviceContext& ctx, std::int64_t step) override {
    Batch b{InputTensor(ctx, {batch_size_, 3, 32, 32}, DType::kFloat32),
            InputTensor(ctx, {batch_size_}, DType::kInt64)};
    if (ctx.computes()) {
      // Two fixed global batches of random images with fixed labels.
      std::mt19937_64 rng(2000 + static_cast<std::uint64_t>(step % 2));
      std::uniform_real_distribution<float> u(-1, 1);
      const std::int64_t first = shard_rank_ * b.input.numel();  // this rank's images
      for (std::int64_t i = 0; i < b.input.numel() * shard_world_; ++i) {
        const float v = u(rng);
        if (i >= first && i < first + b.input.numel()) b.input.data()[i - first] = v;
      }
      const std::int64_t global = batch_size_ * shard_world_;
      for (std::int64_t i = 0; i < batch_size_; ++i) {
        b.target.data_i64()[i] = (shard_rank_ * batch_size_ + i + (step % 2) * global) % 10;
      }
    }
    return b;
  }

  Tensor Forward(const Batch& batch) override {
    // x = self.pool(F.relu(self.conv1(x))): CPython frees the conv output as
    // soon as relu has returned, before the pool runs.
    Tensor x = ops::Relu(conv1_.Forward(batch.input));
    x = ops::MaxPool2d(x, 2, 2);
    x = ops::Relu(conv2_.Forward(x));
    x = ops::MaxPool2d(x, 2, 2);
    x = ops::Flatten(x, 1);
    x = ops::Relu(fc1_.Forward(x));
    x = ops::Relu(fc2_.Forward(x));
    return fc3_.Forward(x);
  }

  Tensor Loss(const Tensor& output, const Batch& batch) override {
    ScopedTag tag(Category::kActivation, "loss");
    return ops::CrossEntropy(output, batch.target);
  }

 private:
  Conv2dLayer& conv1_;
  Conv2dLayer& conv2_;
  Linear& fc1_;
  Linear& fc2_;
  Linear& fc3_;
};

// ------------------------------------------------------------------ resnet

// torchvision's Bottleneck (ResNet v1.5: the stride on the 3x3 conv).
class Bottleneck final : public Module {
 public:
  Bottleneck(std::string path, std::int64_t in, std::int64_t width, int stride, bool downsample)
      : Module(std::move(path)),
        conv1_(Add<Conv2dLayer>("conv1", in, width, 1, 1, 0, false)),
        bn1_(Add<BatchNorm2dLayer>("bn1", width)),
        conv2_(Add<Conv2dLayer>("conv2", width, width, 3, stride, 1, false)),
        bn2_(Add<BatchNorm2dLayer>("bn2", width)),
        conv3_(Add<Conv2dLayer>("conv3", width, width * 4, 1, 1, 0, false)),
        bn3_(Add<BatchNorm2dLayer>("bn3", width * 4)) {
    if (downsample) {
      Group& ds = Add<Group>("downsample");
      ds_conv_ = &ds.Add<Conv2dLayer>("0", in, width * 4, 1, stride, 0, false);
      ds_bn_ = &ds.Add<BatchNorm2dLayer>("1", width * 4);
    }
  }
  Tensor Forward(const Tensor& x) {
    ScopedTag tag(Category::kActivation, path());
    Tensor identity = x;
    Tensor out = conv1_.Forward(x);
    out = bn1_.Forward(out);
    ops::ReluInPlace(out);
    out = conv2_.Forward(out);
    out = bn2_.Forward(out);
    ops::ReluInPlace(out);
    out = conv3_.Forward(out);
    out = bn3_.Forward(out);
    if (ds_conv_) identity = ds_bn_->Forward(ds_conv_->Forward(x));
    ops::AddInPlaceTracked(out, identity);
    ops::ReluInPlace(out);
    return out;
  }

 private:
  Conv2dLayer& conv1_;
  BatchNorm2dLayer& bn1_;
  Conv2dLayer& conv2_;
  BatchNorm2dLayer& bn2_;
  Conv2dLayer& conv3_;
  BatchNorm2dLayer& bn3_;
  Conv2dLayer* ds_conv_ = nullptr;
  BatchNorm2dLayer* ds_bn_ = nullptr;
};

class ResNet final : public Model {
 public:
  ResNet(std::string model_name, const std::vector<int>& blocks, std::int64_t batch, bool checkpoint)
      : Model(""),
        name_(std::move(model_name)),
        checkpoint_(checkpoint),
        conv1_(Add<Conv2dLayer>("conv1", 3, 64, 7, 2, 3, false)),
        bn1_(Add<BatchNorm2dLayer>("bn1", 64)) {
    batch_size_ = batch;
    std::int64_t in = 64;
    for (int l = 0; l < 4; ++l) {
      Group& layer = Add<Group>("layer" + std::to_string(l + 1));
      const std::int64_t width = 64LL << l;
      std::vector<Bottleneck*> stage;
      for (int b = 0; b < blocks[static_cast<std::size_t>(l)]; ++b) {
        const int stride = (b == 0 && l > 0) ? 2 : 1;
        stage.push_back(&layer.Add<Bottleneck>(std::to_string(b), in, width, stride, b == 0));
        in = width * 4;
      }
      layers_.push_back(stage);
    }
    fc_ = &Add<Linear>("fc", 2048, 1000);
  }
  std::string_view name() const override { return name_; }

  Batch MakeBatch(DeviceContext& ctx, std::int64_t) override {
    return {InputTensor(ctx, {batch_size_, 3, 224, 224}, DType::kFloat32),
            InputTensor(ctx, {batch_size_}, DType::kInt64)};
  }

  Tensor Forward(const Batch& batch) override {
    Tensor x = conv1_.Forward(batch.input);
    x = bn1_.Forward(x);
    ops::ReluInPlace(x);
    {
      ScopedTag tag(Category::kActivation, "maxpool");
      x = ops::MaxPool2d(x, 3, 2, 1);
    }
    for (auto& stage : layers_) {
      auto run = [&stage](const Tensor& in) {
        Tensor y = in;
        for (Bottleneck* b : stage) y = b->Forward(y);
        return y;
      };
      x = checkpoint_ ? Checkpoint(run, x) : run(x);
    }
    {
      ScopedTag tag(Category::kActivation, "avgpool");
      x = ops::Flatten(ops::AdaptiveAvgPool2d(x, 1, 1), 1);
    }
    return fc_->Forward(x);
  }

  Tensor Loss(const Tensor& output, const Batch& batch) override {
    ScopedTag tag(Category::kActivation, "loss");
    return ops::CrossEntropy(output, batch.target);
  }

 private:
  std::string name_;
  bool checkpoint_;
  Conv2dLayer& conv1_;
  BatchNorm2dLayer& bn1_;
  std::vector<std::vector<Bottleneck*>> layers_;
  Linear* fc_ = nullptr;
};

// ------------------------------------------------------------------ seq2seq-attn

// A user's attention-based seq2seq and its arguments (hidden 1000, input 500,
// attention 1000, vocab 30000, batch 80, length 50), line for line.
constexpr std::int64_t kPadId = 0;

// pack_padded_sequence(x, lens, batch_first=True) with every length equal:
// the packed data is a new (T*B, I) tensor; its backward allocates the
// padded (T, B, I) gradient.
Tensor PackPadded(const Tensor& x) {
  const std::int64_t b = x.sizes()[0], t = x.sizes()[1], i = x.sizes()[2];
  Tensor data = Tensor::Empty(x.ctx(), {t * b, i}, x.dtype());
  if (NeedsGrad({&x})) {
    RecordOp("PackPaddedSequenceBackward0", {&x}, {&data}, [b, t, i](Node& n, TensorList& g) {
      GradTag tag(n, 0);
      Tensor padded = Tensor::Zeros(g[0].ctx(), {t, b, i}, g[0].dtype());
      return TensorList{ops::Transpose(padded, 0, 1)};
    });
  }
  return data;
}

// pad_packed_sequence(x, batch_first=True, total_length=T): a new (T, B, F)
// tensor returned transposed to (B, T, F); its backward is one slice of the
// gradient's size.
Tensor PadPacked(const Tensor& data, std::int64_t batch, std::int64_t total_length) {
  const std::int64_t f = data.sizes()[1];
  Tensor out = Tensor::Empty(data.ctx(), {total_length, batch, f}, data.dtype());
  if (NeedsGrad({&data})) {
    RecordOp("PadPackedSequenceBackward0", {&data}, {&out}, [sizes = data.sizes()](Node& n, TensorList& g) {
      GradTag tag(n, 0);
      return TensorList{Tensor::Empty(g[0].ctx(), sizes, g[0].dtype())};
    });
  }
  return ops::Transpose(out, 0, 1);
}

class Encoder final : public Module {
 public:
  explicit Encoder(std::string path)
      : Module(std::move(path)),
        rnn_(Add<CudnnRnnLayer>("rnn", false, 500, 1000, 1, true)),
        embedding_(Add<EmbeddingLayer>("embedding", 30000, 500, kPadId)) {}
  struct State {
    Tensor feature, hidden, mask;
  };
  State Forward(const Tensor& input) {
    ScopedTag tag(Category::kActivation, path());
    const std::int64_t batch = input.sizes()[0], total_length = input.sizes()[1];
    State s;
    s.mask = ops::Eq(input, kPadId);
    Tensor lens;
    {
      // lens = input.size(1) - mask.sum(1); lens.tolist() reads it on the host.
      Tensor sum = Tensor::Empty(input.ctx(), {batch}, DType::kInt64);
      lens = Tensor::Empty(input.ctx(), {batch}, DType::kInt64);
    }
    Tensor x = embedding_.Forward(input);
    x = PackPadded(x);
    ops::RnnResult r = rnn_.Forward(x, batch);
    x = PadPacked(r.output, batch, total_length);
    s.feature = x;
    s.hidden = ops::Select(r.hy, 0, 1);  // hx[1]: the last state of the backward RNN
    return s;
  }

 private:
  CudnnRnnLayer& rnn_;
  EmbeddingLayer& embedding_;
};

class Attention final : public Module {
 public:
  Attention(std::string path, std::int64_t query_size, std::int64_t attention_size)
      : Module(std::move(path)),
        map_query_(Add<Linear>("map_query", query_size, attention_size)),
        v_(Add<Linear>("v", attention_size, 1)) {}
  std::pair<Tensor, Tensor> Forward(const Tensor& query, const Tensor& keys, const Tensor& values, const Tensor& mask) {
    ScopedTag tag(Category::kActivation, path());
    Tensor x = ops::Add(keys, ops::Unsqueeze(map_query_.Forward(query), 1));
    x = ops::Squeeze(v_.Forward(ops::Tanh(x)), -1);
    {
      Tensor data = x.Detach();  // x.data.masked_fill_(mask, -inf)
      ops::MaskedFillInPlace(data, mask, -INFINITY);
    }
    x = ops::Softmax(x, -1);
    Tensor output = ops::Squeeze(ops::Bmm(ops::Unsqueeze(x, 1), values), 1);
    return {output, x};
  }

 private:
  Linear& map_query_;
  Linear& v_;
};

class Decoder final : public Module {
 public:
  explicit Decoder(std::string path)
      : Module(std::move(path)),
        embedding_(Add<EmbeddingLayer>("embedding", 30000, 500, kPadId)),
        cell0_(Add<GRUCellLayer>("cell0", 500, 1000)),
        attention_(Add<Attention>("attention", 1000, 1000)),
        cell1_(Add<GRUCellLayer>("cell1", 2000, 1000)) {
    Group& generator = Add<Group>("generator");
    readout_ = &generator.Add<Group>("0").Add<Linear>("0", 500 + 1000 + 2000, 500);
    logit_ = &generator.Add<Linear>("1", 500, 30000);
  }
  Tensor Forward(const Tensor& inputs, const Tensor& keys, const Tensor& values, const Tensor& mask, Tensor h) {
    ScopedTag tag(Category::kActivation, path());
    Tensor x = embedding_.Forward(inputs);
    TensorList hs, ctxs;
    for (const Tensor& xi_full : ops::Split(x, 1, 1)) {
      Tensor x_i = ops::Squeeze(xi_full, 1);
      h = cell0_.Forward(x_i, h);
      Tensor ctx = attention_.Forward(h, keys, values, mask).first;
      h = cell1_.Forward(ctx, h);
      hs.push_back(h);
      ctxs.push_back(ctx);
    }
    Tensor hs_t = ops::Stack(hs, 1);
    hs.clear();
    Tensor ctxs_t = ops::Stack(ctxs, 1);
    ctxs.clear();
    Tensor readout = ops::Tanh(readout_->Forward(ops::Cat({x, hs_t, ctxs_t}, -1)));
    return logit_->Forward(readout);
  }

 private:
  EmbeddingLayer& embedding_;
  GRUCellLayer& cell0_;
  Attention& attention_;
  GRUCellLayer& cell1_;
  Linear* readout_ = nullptr;
  Linear* logit_ = nullptr;
};

class Seq2SeqAttn final : public Model {
 public:
  Seq2SeqAttn(std::int64_t batch, std::int64_t length) : Model(""), length_(length) {
    batch_size_ = batch;
    encoder_ = &Add<Encoder>("encoder");
    decoder_ = &Add<Decoder>("decoder");
    Group& bridge = Add<Group>("bridge");
    map_k_ = &bridge.Add<Group>("map_k").Add<Linear>("0", 2000, 1000);
    dec_init_ = &bridge.Add<Group>("dec_init").Add<Linear>("0", 1000, 1000);
  }
  std::string_view name() const override { return "seq2seq-attn"; }

  Batch MakeBatch(DeviceContext& ctx, std::int64_t) override {
    // torch.ones(B, T).long().cuda() * 2, for x and for y
    Batch b;
    for (Tensor* t : {&b.input, &b.target}) {
      Tensor ones = InputTensor(ctx, {batch_size_, length_}, DType::kInt64);
      *t = InputTensor(ctx, {batch_size_, length_}, DType::kInt64);
    }
    return b;
  }

  Tensor Forward(const Batch& batch) override {
    Tensor key, value, mask, hidden;
    {
      Encoder::State enc = encoder_->Forward(batch.input);
      ScopedTag tag(Category::kActivation, "bridge");
      key = ops::Tanh(map_k_->Forward(enc.feature));
      hidden = ops::Tanh(dec_init_->Forward(enc.hidden));
      value = enc.feature;
      mask = enc.mask;
    }  // del enc_state
    Tensor input_y;
    {
      ScopedTag tag(Category::kActivation, "");
      // F.pad(input_y, [1, 0], value=eos_id)[:, :-1]
      input_y = ops::Narrow(ops::PadLastDim(batch.target, 1, 0, 1), 1, 0, length_);
    }
    return decoder_->Forward(input_y, key, value, mask, hidden);
  }

  Tensor Loss(const Tensor& output, const Batch& batch) override {
    ScopedTag tag(Category::kActivation, "loss");
    // CrossEntropyLoss(ignore_index=pad_id, reduction='sum') on logit.view(-1, V), then / batch_size
    Tensor logit = ops::View(output, {-1, output.sizes().back()});
    Tensor loss = ops::CrossEntropy(logit, ops::View(batch.target, {-1}), Reduction::kSum, kPadId);
    return ops::DivScalar(loss, static_cast<float>(batch_size_));
  }

 private:
  std::int64_t length_;
  Encoder* encoder_ = nullptr;
  Decoder* decoder_ = nullptr;
  Linear* map_k_ = nullptr;
  Linear* dec_init_ = nullptr;
};

// ------------------------------------------------------------------ bilstm

// A 2-layer bidirectional LSTM tagger whose parameters come to 1140.4 MiB,
// the size of a user's model that doubled under DDP ("1140.xx" MiB; with the
// blocks' unsplit remainders the model holds 1141.2 MiB, and 2281.6 MiB once
// wrapped: the user's 2281.xx).
class BiLstm final : public Model {
 public:
  BiLstm(std::int64_t batch, std::int64_t length)
      : Model(""),
        length_(length),
        embedding_(Add<EmbeddingLayer>("embedding", kVocab, 1024)),
        lstm_(Add<CudnnRnnLayer>("lstm", true, 1024, 2048, 2, true)),
        classifier_(Add<Linear>("classifier", 4096, kVocab)) {
    batch_size_ = batch;
  }
  static constexpr std::int64_t kVocab = 28880;
  std::string_view name() const override { return "bilstm"; }

  Batch MakeBatch(DeviceContext& ctx, std::int64_t) override {
    return {InputTensor(ctx, {length_, batch_size_}, DType::kInt64),
            InputTensor(ctx, {length_, batch_size_}, DType::kInt64)};
  }

  Tensor Forward(const Batch& batch) override {
    Tensor x = embedding_.Forward(batch.input);  // (T, B, E)
    ops::RnnResult r = lstm_.Forward(ops::View(x, {-1, x.sizes()[2]}), batch_size_);
    return classifier_.Forward(r.output);  // (T*B, V)
  }

  Tensor Loss(const Tensor& output, const Batch& batch) override {
    ScopedTag tag(Category::kActivation, "loss");
    return ops::CrossEntropy(output, ops::View(batch.target, {-1}));
  }

 private:
  std::int64_t length_;
  EmbeddingLayer& embedding_;
  CudnnRnnLayer& lstm_;
  Linear& classifier_;
};

// ------------------------------------------------------------------ gpt2

// The zoo's GPT-2 sizes are Hugging Face configs: the model is the one
// `--model hf:config.json` builds (train/hf_config.h), so there is one
// GPT-2, checked against PyTorch by tests/oracle/.
absl::StatusOr<std::unique_ptr<Model>> Gpt2(std::string_view name, const ModelOptions& o) {
  struct Size {
    std::int64_t layers, dim, heads, batch;
  };
  const Size size = name == "gpt2"          ? Size{12, 768, 12, 8}
                    : name == "gpt2-medium" ? Size{24, 1024, 16, 4}
                    : name == "gpt2-large"  ? Size{36, 1280, 20, 2}
                                            : Size{48, 1600, 25, 1};
  const nlohmann::json config = {{"model_type", "gpt2"},     {"architectures", {"GPT2LMHeadModel"}},
                                 {"vocab_size", 50257},      {"n_positions", 1024},
                                 {"n_embd", size.dim},       {"n_layer", size.layers},
                                 {"n_head", size.heads}};
  absl::StatusOr<nlohmann::json> spec = HfConfigToModelSpec(config, name);
  if (!spec.ok()) return spec.status();
  (*spec)["name"] = std::string(name);
  (*spec)["batch_size"] = size.batch;
  return ModelFromJson(*spec, name, o);
}

}  // namespace

std::vector<ModelInfo> ListModels() {
  return {
      {"mlp", "multi-layer perceptron: 256 inputs, --depth 3 hidden layers of --width 512, 10 classes; batch 64", true,
       true},
      {"cifar-net", "the PyTorch CIFAR-10 tutorial Net: 2 conv + 3 linear layers; batch 4 of 3x32x32", true, false},
      {"resnet50", "torchvision ResNet-50; batch 32 of 3x224x224", false, true},
      {"resnet101", "torchvision ResNet-101; batch 32 of 3x224x224", false, true},
      {"seq2seq-attn", "GRU encoder-decoder with attention (hidden 1000), vocab 30000; batch 80, length 50", false,
       false},
      {"bilstm", "embedding + 2-layer bidirectional LSTM tagger (1140.4 MiB of parameters); batch 32, length 128",
       false, false},
      {"gpt2", "Hugging Face GPT-2 (124M), tied lm_head; batch 8, sequence 1024", false, true},
      {"gpt2-medium", "GPT-2 medium (355M); batch 4, sequence 1024", false, true},
      {"gpt2-large", "GPT-2 large (774M); batch 2, sequence 1024", false, true},
      {"gpt2-xl", "GPT-2 XL (1.56B); batch 1, sequence 1024", false, true},
  };
}

absl::StatusOr<AttentionKind> ParseAttention(std::string_view name) {
  if (name == "math" || name == "eager") return AttentionKind::kMath;
  if (name == "flash" || name == "flash_attention_2") return AttentionKind::kFlash;
  if (name == "sdpa") return AttentionKind::kSdpa;
  return absl::InvalidArgumentError(absl::StrCat("--attention '", std::string(name),
                                                 "': use eager (or math), sdpa, or flash_attention_2 (or flash)"));
}

absl::Status UseDType(std::string_view name, ModelOptions& options) {
  if (name.empty()) return absl::OkStatus();
  if (name == "float32") {
    options.param_dtype = DType::kFloat32;
  } else if (name == "float16") {
    options.param_dtype = DType::kFloat16;
  } else if (name == "bfloat16") {
    options.param_dtype = DType::kBFloat16;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--dtype '", std::string(name), "': use float32, float16 or bfloat16"));
  }
  return absl::OkStatus();
}

absl::Status UseLora(std::string_view adapter_config, ModelOptions& options) {
  if (adapter_config.empty()) return absl::OkStatus();
  absl::StatusOr<LoraConfig> l = LoadLoraConfig(adapter_config);
  if (!l.ok()) return absl::InvalidArgumentError(absl::StrCat("--lora: ", l.status().message()));
  options.lora = std::make_shared<const LoraConfig>(std::move(*l));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Model>> CreateModel(std::string_view name, const ModelOptions& o) {
  auto or_default = [](std::int64_t v, std::int64_t d) { return v > 0 ? v : d; };
  if (name.substr(0, 5) == "file:") {
    if (o.width > 0 || o.depth > 0) return absl::InvalidArgumentError("--width and --depth apply to mlp only");
    return LoadModelFile(name.substr(5), o);
  }
  if (name.substr(0, 3) == "hf:") {
    if (o.width > 0 || o.depth > 0) return absl::InvalidArgumentError("--width and --depth apply to mlp only");
    return LoadHfConfig(name.substr(3), o);
  }
  if (o.lora) return absl::InvalidArgumentError("--lora applies to a model file or a Hugging Face config (file:, hf:)");
  if (o.param_dtype && name.substr(0, 4) != "gpt2") {
    return absl::InvalidArgumentError(
        absl::StrCat("--dtype applies to model files, Hugging Face configs and gpt2*, not ", std::string(name)));
  }
  const std::vector<ModelInfo> zoo = ListModels();
  const ModelInfo* info = nullptr;
  for (const ModelInfo& m : zoo) {
    if (m.name == name) info = &m;
  }
  if (info == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown model '", std::string(name), "' (memscope models lists them)"));
  }
  if (o.checkpoint_activations && !info->checkpointing) {
    return absl::InvalidArgumentError(absl::StrCat("--checkpoint-activations is not offered for ", std::string(name),
                                                   " (mlp, resnet50/101 and gpt2* have it)"));
  }
  if ((o.width > 0 || o.depth > 0) && name != "mlp") {
    return absl::InvalidArgumentError("--width and --depth apply to mlp only");
  }
  if (o.seq_len > 1024 && name.substr(0, 4) == "gpt2") {
    return absl::InvalidArgumentError("--seq-len: GPT-2 has 1024 positions");
  }
  if (name == "mlp") {
    return std::make_unique<Mlp>(256, or_default(o.width, 512), or_default(o.depth, 3), 10,
                                 or_default(o.batch_size, 64), o.checkpoint_activations);
  }
  if (name == "cifar-net") return std::make_unique<CifarNet>(or_default(o.batch_size, 4));
  if (name == "resnet50") {
    return std::make_unique<ResNet>("resnet50", std::vector<int>{3, 4, 6, 3}, or_default(o.batch_size, 32),
                                    o.checkpoint_activations);
  }
  if (name == "resnet101") {
    return std::make_unique<ResNet>("resnet101", std::vector<int>{3, 4, 23, 3}, or_default(o.batch_size, 32),
                                    o.checkpoint_activations);
  }
  if (name == "seq2seq-attn")
    return std::make_unique<Seq2SeqAttn>(or_default(o.batch_size, 80), or_default(o.seq_len, 50));
  if (name == "bilstm") return std::make_unique<BiLstm>(or_default(o.batch_size, 32), or_default(o.seq_len, 128));
  return Gpt2(name, o);
}

}  // namespace memscope
