// The ops of the reference training loop. Each allocates exactly what the
// CUDA op allocates (outputs, then known temporaries), records a Node that
// saves what PyTorch saves for backward (derivatives.yaml), and, in
// ExecMode::kCpu, computes real float32 math. An op without a CPU kernel
// throws TensorError naming itself in kCpu.
//
// Ops that PyTorch implements as a composition (linear on 3-d input, matmul,
// cross_entropy, gelu_new) are compositions here too, so they allocate and
// save what the composition does.
//
// Autocast (AutocastGuard) follows torch.autocast on CUDA: ops of the
// lower-precision list (linear, addmm, mm, bmm, matmul, conv, RNN cells, cuDNN
// RNN, attention) cast floating inputs to the autocast dtype (parameters
// through a cache that lives until the outermost autocast exits); ops of the
// fp32 list (softmax, log_softmax, layer_norm, nll_loss, sum) cast to float32.
#ifndef MEMSCOPE_TENSOR_OPS_H_
#define MEMSCOPE_TENSOR_OPS_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "tensor/autograd.h"
#include "tensor/tensor.h"

namespace memscope {

// torch.autocast(device_type="cuda", dtype=...) on this thread.
class AutocastGuard {
 public:
  explicit AutocastGuard(DType dtype);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;
  static std::optional<DType> current();

 private:
  std::optional<DType> prev_;
};

namespace ops {

// ---- creation and copies
Tensor EmptyLike(const Tensor& t, std::optional<DType> dtype = std::nullopt);
Tensor ZerosLike(const Tensor& t);
Tensor OnesLike(const Tensor& t);
Tensor Clone(const Tensor& t);            // contiguous copy
Tensor Contiguous(const Tensor& t);       // t itself when already contiguous
Tensor To(const Tensor& t, DType dtype);  // t itself when already of that dtype
// Fills with U(-bound, bound) from the context's seed (kCpu; no-op in kMeta).
void UniformInPlace(Tensor& t, float bound);
void FillInPlace(Tensor& t, float value);

// ---- views (no allocation)
Tensor View(const Tensor& t, const Shape& sizes);     // -1 allowed once; throws when not viewable
Tensor Reshape(const Tensor& t, const Shape& sizes);  // a view when possible, else a copy
Tensor Transpose(const Tensor& t, int dim0, int dim1);
Tensor Permute(const Tensor& t, const std::vector<int>& dims);
Tensor T(const Tensor& t);  // 2-d transpose
Tensor Unsqueeze(const Tensor& t, int dim);
Tensor Squeeze(const Tensor& t, int dim);
Tensor Expand(const Tensor& t, const Shape& sizes);
Tensor Narrow(const Tensor& t, int dim, std::int64_t start, std::int64_t length);
Tensor Select(const Tensor& t, int dim, std::int64_t index);
TensorList Split(const Tensor& t, std::int64_t split_size, int dim);
TensorList SplitWithSizes(const Tensor& t, const std::vector<std::int64_t>& sizes, int dim);
Tensor Flatten(const Tensor& t, int start_dim = 0, int end_dim = -1);

// ---- advanced indexing
// x[i0, i1, ...] (aten::index) with int64 index tensors of one shape on x's
// leading dims (negative entries count from the end): the indices' shape
// followed by x's remaining dims, a new tensor. IndexBackward0 saves the
// indices (not x); its backward makes a zero tensor of x's shape and
// accumulates the gradient into it (index_put_ with accumulate=True).
Tensor Index(const Tensor& x, const TensorList& indices);

// ---- elementwise (broadcasting)
Tensor Add(const Tensor& a, const Tensor& b, float alpha = 1);
Tensor Sub(const Tensor& a, const Tensor& b);
Tensor Mul(const Tensor& a, const Tensor& b);
Tensor Div(const Tensor& a, const Tensor& b);
Tensor AddScalar(const Tensor& a, float s);
Tensor MulScalar(const Tensor& a, float s);
Tensor DivScalar(const Tensor& a, float s);
Tensor PowScalar(const Tensor& a, float exponent);
Tensor Relu(const Tensor& x);
Tensor& ReluInPlace(Tensor& x);  // nn.ReLU(inplace=True)
Tensor Gelu(const Tensor& x, bool tanh_approximation = false);
Tensor GeluNew(const Tensor& x);  // HF's gelu_new, composed of 8 ops as in Python
Tensor Tanh(const Tensor& x);
Tensor Sigmoid(const Tensor& x);
Tensor Silu(const Tensor& x);   // F.silu: saves its input
Tensor Rsqrt(const Tensor& x);  // torch.rsqrt: saves its result
// torch.where(condition, a, b); condition is bool.
Tensor Where(const Tensor& condition, const Tensor& a, const Tensor& b);
Tensor Eq(const Tensor& a, float value);  // bool result, no autograd
// x.clamp(lo, hi) of int64 ids (a new contiguous tensor), no autograd.
Tensor ClampInt(const Tensor& x, std::int64_t lo, std::int64_t hi);
// x += y in place with autograd (residual connections).
Tensor& AddInPlaceTracked(Tensor& x, const Tensor& y);

// ---- in place without autograd (optimizers, engine, x.data ops)
void AddInPlace(Tensor& x, const Tensor& y, float alpha = 1);
void MulInPlace(Tensor& x, float s);
void AddScalarInPlace(Tensor& x, float s);
void DivInPlace(Tensor& x, float s);
void AddcmulInPlace(Tensor& x, const Tensor& a, const Tensor& b, float value);
void AddcdivInPlace(Tensor& x, const Tensor& a, const Tensor& b, float value);
void LerpInPlace(Tensor& x, const Tensor& end, float weight);
void ZeroInPlace(Tensor& x);
void CopyInPlace(Tensor& dst, const Tensor& src);
void MaskedFillInPlace(Tensor& x, const Tensor& mask, float value);
Tensor Sqrt(const Tensor& x);  // no autograd (optimizer use)

// ---- reductions
Tensor Sum(const Tensor& x);  // all elements, a 0-d tensor
Tensor SumDims(const Tensor& x, const std::vector<int>& dims, bool keepdim = false);
Tensor Mean(const Tensor& x);
// x.mean(dims, keepdim): one reduced tensor; backward expands the gradient (one full-size tensor).
Tensor MeanDims(const Tensor& x, const std::vector<int>& dims, bool keepdim = false);
// Sums `grad` down to `sizes` (the gradient of a broadcast); `grad` itself when equal.
Tensor SumTo(const Tensor& grad, const Shape& sizes);

// ---- linear algebra
Tensor Mm(const Tensor& a, const Tensor& b);
Tensor Addmm(const Tensor& bias, const Tensor& a, const Tensor& b);
Tensor Bmm(const Tensor& a, const Tensor& b);
Tensor Matmul(const Tensor& a, const Tensor& b);
// F.linear: weight is (out, in); any number of leading input dims.
Tensor Linear(const Tensor& x, const Tensor& weight, const Tensor& bias);

// ---- neural network ops
Tensor Embedding(const Tensor& weight, const Tensor& indices, std::int64_t padding_idx = -1);
Tensor LayerNorm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps = 1e-5f);
// Training-mode batch norm over (N, C, H, W); updates the running buffers.
Tensor BatchNorm2d(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& running_mean, Tensor& running_var,
                   float momentum = 0.1f, float eps = 1e-5f);
Tensor Dropout(const Tensor& x, float p, bool training = true);
// softmax(x, dim, dtype) as SoftMax.cpp does it: with a dtype other than
// x's, a float16 input and float32 go straight to a float32 result
// (_softmax(x, dim, half_to_float=true), CUDA), any other pair converts x
// first (a copy, freed after). Under autocast, a floating input without a
// dtype gets float32 (fp32_set_opt_dtype). The gradient has x's dtype.
Tensor Softmax(const Tensor& x, int dim, std::optional<DType> dtype = std::nullopt);
Tensor LogSoftmax(const Tensor& x, int dim, std::optional<DType> dtype = std::nullopt);
enum class Reduction { kMean, kSum, kNone };
Tensor NllLoss(const Tensor& log_probs, const Tensor& target, Reduction reduction = Reduction::kMean,
               std::int64_t ignore_index = -100);
Tensor CrossEntropy(const Tensor& logits, const Tensor& target, Reduction reduction = Reduction::kMean,
                    std::int64_t ignore_index = -100);
// F.mse_loss(x, target) with reduction mean: saves both; backward one x-sized tensor.
Tensor MseLoss(const Tensor& x, const Tensor& target);
Tensor Conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, int stride = 1, int padding = 0);
Tensor MaxPool2d(const Tensor& x, int kernel, int stride, int padding = 0);
Tensor AdaptiveAvgPool2d(const Tensor& x, std::int64_t out_h, std::int64_t out_w);
Tensor Cat(const TensorList& tensors, int dim);
Tensor Stack(const TensorList& tensors, int dim);
// F.pad with a constant on the last dimension (left, right); no autograd
// needed for the integer inputs it is used on.
Tensor PadLastDim(const Tensor& x, std::int64_t left, std::int64_t right, float value);

// ---- recurrent
// nn.GRUCell on CUDA: two matmuls without bias, then the fused
// cell kernel, which saves its gates and a workspace.
Tensor GruCell(const Tensor& x, const Tensor& h, const Tensor& w_ih, const Tensor& w_hh, const Tensor& b_ih,
               const Tensor& b_hh);
// cuDNN multi-layer (bidirectional) GRU or LSTM over a (T, B, I) or
// packed input of `tokens` rows; `flat_weights` is the module's one
// flattened weight buffer (all layer parameters are views into it).
// Returns output (rows, dirs*H) and the final hidden state (layers*dirs, B, H).
struct RnnResult {
  Tensor output;
  Tensor hy;
  Tensor cy;  // LSTM only
};
RnnResult CudnnRnn(const Tensor& input, const Tensor& flat_weights, const TensorList& weight_views, bool lstm,
                   std::int64_t layers, bool bidirectional, std::int64_t hidden, std::int64_t batch);

// ---- attention
// F.scaled_dot_product_attention(q, k, v, is_causal=True) with the flash
// kernel: q, k, v are (B, H, T, D); saves q, k, v, out and a (B, H, T)
// float32 logsumexp.
Tensor FlashAttention(const Tensor& q, const Tensor& k, const Tensor& v);

}  // namespace ops
}  // namespace memscope

#endif  // MEMSCOPE_TENSOR_OPS_H_
