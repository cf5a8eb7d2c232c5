// Linear algebra, neural-network ops, recurrent cells and attention.
#include <array>
#include <cmath>
#include <limits>
#include <random>

#include "tensor/ops.h"
#include "tensor/ops_internal.h"

namespace memscope::ops {

using internal::AutocastFp32;
using internal::AutocastLower;
using internal::ForEachIndex;
using internal::RequireCpuKernel;
using internal::WrapDim;

namespace {

void CheckSameContext(const Tensor& a, const Tensor& b, std::string_view op) {
  if (&a.ctx() != &b.ctx()) throw TensorError(absl::StrCat(std::string(op), ": tensors on different devices"));
}

// out[b] = a[b] @ m[b] for strided 3-d operands (batch may be 1 for mm).
void BatchedMatmulKernel(const Tensor& a, const Tensor& m, Tensor& out) {
  RequireCpuKernel("mm", {&a, &m});
  const bool batched = a.dim() == 3;
  const std::int64_t batch = batched ? a.sizes()[0] : 1;
  const int r = batched ? 1 : 0;
  const std::int64_t n = a.sizes()[r], k = a.sizes()[r + 1], p = m.sizes()[r + 1];
  const float* pa = a.data();
  const float* pm = m.data();
  float* po = out.data();
  const std::int64_t sab = batched ? a.strides()[0] : 0, smb = batched ? m.strides()[0] : 0,
                     sob = batched ? out.strides()[0] : 0;
  const std::int64_t sa0 = a.strides()[r], sa1 = a.strides()[r + 1];
  const std::int64_t sm0 = m.strides()[r], sm1 = m.strides()[r + 1];
  const std::int64_t so0 = out.strides()[r], so1 = out.strides()[r + 1];
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t i = 0; i < n; ++i) {
      for (std::int64_t j = 0; j < p; ++j) {
        double acc = 0;
        for (std::int64_t t = 0; t < k; ++t)
          acc += double(pa[b * sab + i * sa0 + t * sa1]) * pm[b * smb + t * sm0 + j * sm1];
        po[b * sob + i * so0 + j * so1] = static_cast<float>(acc);
      }
    }
  }
}

// `lt`: the call goes to cuBLASLt (addmm's bias epilogue), else cuBLAS.
Tensor MmNoGrad(const Tensor& a, const Tensor& b, bool lt = false) {
  if (a.dim() != 2 || b.dim() != 2 || a.sizes()[1] != b.sizes()[0]) {
    throw TensorError(
        absl::StrCat("mm: shapes ", ShapeText(a.sizes()), " and ", ShapeText(b.sizes()), " cannot be multiplied"));
  }
  CheckSameContext(a, b, "mm");
  Tensor out = Tensor::Empty(a.ctx(), {a.sizes()[0], b.sizes()[1]}, a.dtype());
  a.ctx().UseBlas(lt);  // cuBLAS's workspace, after the output (tensor/blas_workspace.h)
  if (a.ctx().computes()) BatchedMatmulKernel(a, b, out);
  return out;
}

// Gradient of mm's second operand, laid out like it (mm_mat2_backward): a
// column-major mat2 (a transposed weight) gets a column-major gradient, so
// that the weight's gradient ends up contiguous.
Tensor MmMat2Backward(const Tensor& grad, const Tensor& mat1, const Shape& mat2_sizes, const Shape& mat2_strides) {
  if (mat2_strides[0] == 1 && mat2_strides[1] == mat2_sizes[0]) return T(MmNoGrad(T(grad), mat1));
  return MmNoGrad(T(mat1), grad);
}

}  // namespace

// ---------------------------------------------------------------- linear algebra

Tensor Mm(const Tensor& a_in, const Tensor& b_in) {
  // Autocast casts the last argument first (see AutocastLower).
  const Tensor b = AutocastLower(b_in);
  const Tensor a = AutocastLower(a_in);
  Tensor out = MmNoGrad(a, b);
  if (NeedsGrad({&a, &b})) {
    Tensor saved_a = b.requires_grad() ? a.Detach() : Tensor();
    Tensor saved_b = a.requires_grad() ? b.Detach() : Tensor();
    // mat2's sizes and strides are kept even when mat2 is not saved
    // (derivatives.yaml: mm_mat2_backward(grad, self, mat2.sym_sizes(), mat2.sym_strides(), ...)).
    RecordOp("MmBackward0", {&a, &b}, {&out},
             // saved_b before saved_a: captures die last-first, PyTorch frees self (a) first.
             [saved_b, saved_a, b_sizes = b.sizes(), b_strides = b.strides()](Node& n, TensorList& g) {
               TensorList r(2);
               if (saved_b.defined()) {
                 GradTag tag(n, 0);
                 r[0] = MmNoGrad(g[0], T(saved_b));
               }
               if (saved_a.defined()) {
                 GradTag tag(n, 1);
                 r[1] = MmMat2Backward(g[0], saved_a, b_sizes, b_strides);
               }
               return r;
             });
  }
  return out;
}

Tensor Addmm(const Tensor& bias_in, const Tensor& a_in, const Tensor& b_in) {
  // Autocast casts the last argument first (see AutocastLower).
  const Tensor b = AutocastLower(b_in);
  const Tensor a = AutocastLower(a_in);
  const Tensor bias = AutocastLower(bias_in);
  // Blas.cpp's useLtInterface: a contiguous 1-d bias over mat2's columns, a
  // float type, mat2 larger than one row and one column.
  const bool lt = bias.dim() == 1 && bias.is_contiguous() && b.dim() == 2 && bias.sizes()[0] == b.sizes()[1] &&
                  IsFloating(bias.dtype()) && b.sizes()[0] > 1 && b.sizes()[1] > 1;
  Tensor out = MmNoGrad(a, b, lt);
  if (a.ctx().computes()) AddInPlace(out, bias);
  if (NeedsGrad({&bias, &a, &b})) {
    Tensor saved_a = b.requires_grad() ? a.Detach() : Tensor();
    Tensor saved_b = a.requires_grad() ? b.Detach() : Tensor();
    RecordOp("AddmmBackward0", {&bias, &a, &b}, {&out},
             // saved_b before saved_a: captures die last-first, PyTorch frees mat1 (a) first.
             [saved_b, saved_a, bias_sizes = bias.sizes(), b_sizes = b.sizes(), b_strides = b.strides()](
                 Node& n, TensorList& g) {
               // AddmmBackward0 returns the gradient itself for the bias; the
               // engine sums it to the bias's shape afterwards
               // (validate_outputs), so that sum comes after both mms.
               TensorList r(3);
               if (saved_b.defined()) {
                 GradTag tag(n, 1);
                 r[1] = MmNoGrad(g[0], T(saved_b));
               }
               if (saved_a.defined()) {
                 GradTag tag(n, 2);
                 r[2] = MmMat2Backward(g[0], saved_a, b_sizes, b_strides);
               }
               if (n.next_edges[0].fn) {
                 GradTag tag(n, 0);
                 r[0] = SumTo(g[0], bias_sizes);
               }
               return r;
             });
  }
  return out;
}

namespace {
Tensor BmmNoGrad(const Tensor& a, const Tensor& b) {
  if (a.dim() != 3 || b.dim() != 3 || a.sizes()[0] != b.sizes()[0] || a.sizes()[2] != b.sizes()[1]) {
    throw TensorError(
        absl::StrCat("bmm: shapes ", ShapeText(a.sizes()), " and ", ShapeText(b.sizes()), " cannot be multiplied"));
  }
  Tensor out = Tensor::Empty(a.ctx(), {a.sizes()[0], a.sizes()[1], b.sizes()[2]}, a.dtype());
  a.ctx().UseBlas(false);
  if (a.ctx().computes()) BatchedMatmulKernel(a, b, out);
  return out;
}
}  // namespace

Tensor Bmm(const Tensor& a_in, const Tensor& b_in) {
  // Autocast casts the last argument first (see AutocastLower).
  const Tensor b = AutocastLower(b_in);
  const Tensor a = AutocastLower(a_in);
  Tensor out = BmmNoGrad(a, b);
  if (NeedsGrad({&a, &b})) {
    Tensor saved_a = b.requires_grad() ? a.Detach() : Tensor();
    Tensor saved_b = a.requires_grad() ? b.Detach() : Tensor();
    // saved_b before saved_a: captures die last-first, PyTorch frees self (a) first.
    RecordOp("BmmBackward0", {&a, &b}, {&out}, [saved_b, saved_a](Node& n, TensorList& g) {
      TensorList r(2);
      if (saved_b.defined()) {
        GradTag tag(n, 0);
        r[0] = BmmNoGrad(g[0], Transpose(saved_b, 1, 2));
      }
      if (saved_a.defined()) {
        GradTag tag(n, 1);
        r[1] = BmmNoGrad(Transpose(saved_a, 1, 2), g[0]);
      }
      return r;
    });
  }
  return out;
}

Tensor Matmul(const Tensor& a_in, const Tensor& b_in) {
  // Autocast casts the last argument first (see AutocastLower).
  const Tensor b = AutocastLower(b_in);
  const Tensor a = AutocastLower(a_in);
  if (a.dim() == 2 && b.dim() == 2) return Mm(a, b);
  if (a.dim() >= 3 && b.dim() == 2) {
    // Fold the batch into rows: reshape (a copy when not viewable), mm, view back.
    Shape out_sizes(a.sizes().begin(), a.sizes().end() - 1);
    out_sizes.push_back(b.sizes()[1]);
    Tensor folded = Reshape(a, {-1, a.sizes().back()});
    return View(Mm(folded, b), out_sizes);
  }
  if (a.dim() >= 3 && b.dim() >= 3 && a.dim() == b.dim()) {
    Shape batch(a.sizes().begin(), a.sizes().end() - 2);
    const std::int64_t nb = NumElements(batch);
    const std::int64_t n = a.sizes()[a.dim() - 2], k = a.sizes().back(), m = b.sizes().back();
    Tensor a3 = Reshape(a, {nb, n, k});
    Tensor b3 = Reshape(b, {nb, k, m});
    Shape out_sizes = batch;
    out_sizes.push_back(n);
    out_sizes.push_back(m);
    return View(Bmm(a3, b3), out_sizes);
  }
  throw TensorError(absl::StrCat("matmul: unsupported shapes ", ShapeText(a.sizes()), " and ", ShapeText(b.sizes())));
}

Tensor Linear(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in) {
  // Autocast casts the last argument first (see AutocastLower).
  const Tensor bias = AutocastLower(bias_in);
  const Tensor weight = AutocastLower(weight_in);
  const Tensor x = AutocastLower(x_in);
  if (x.dim() == 2 && bias.defined()) return Addmm(bias, x, T(weight));
  if (x.dim() == 3 && bias.defined() && x.is_contiguous()) {
    Tensor out2 = Addmm(bias, View(x, {x.sizes()[0] * x.sizes()[1], x.sizes()[2]}), T(weight));
    return View(out2, {x.sizes()[0], x.sizes()[1], out2.sizes()[1]});
  }
  Tensor out = Matmul(x, T(weight));
  if (bias.defined()) AddInPlaceTracked(out, bias);
  return out;
}

// ---------------------------------------------------------------- nn

Tensor Embedding(const Tensor& weight, const Tensor& indices, std::int64_t padding_idx) {
  Shape sizes = indices.sizes();
  const std::int64_t dim = weight.sizes()[1];
  sizes.push_back(dim);
  // at::embedding: weight.index_select(0, indices.reshape(-1)): a copy of
  // indices that cannot be viewed flat (expanded token-type ids), freed after.
  Tensor flat = Reshape(indices, {-1});
  Tensor out = Tensor::Empty(weight.ctx(), sizes, weight.dtype());
  flat = Tensor();
  if (weight.ctx().computes()) {
    RequireCpuKernel("embedding", {&weight});
    Tensor idx = Contiguous(indices);
    const std::int64_t* pi = idx.data_i64();
    Tensor w = Contiguous(weight);
    for (std::int64_t i = 0; i < idx.numel(); ++i) {
      if (pi[i] < 0 || pi[i] >= weight.sizes()[0]) throw TensorError("embedding: index out of range");
      std::copy_n(w.data() + pi[i] * dim, dim, out.data() + i * dim);
    }
  }
  if (NeedsGrad({&weight})) {
    RecordOp("EmbeddingBackward0", {&weight}, {&out},
             [idx = indices.Detach(), wsizes = weight.sizes(), padding_idx](Node& n, TensorList& g) {
               GradTag tag(n, 0);  // embedding_dense_backward: a dense (V, D) gradient
               Tensor grad_w = Tensor::Zeros(g[0].ctx(), wsizes, g[0].dtype());
               if (g[0].ctx().computes()) {
                 Tensor gc = Contiguous(g[0]);
                 Tensor ic = Contiguous(idx);
                 const std::int64_t d = wsizes[1];
                 for (std::int64_t i = 0; i < ic.numel(); ++i) {
                   const std::int64_t row = ic.data_i64()[i];
                   if (row == padding_idx) continue;
                   for (std::int64_t j = 0; j < d; ++j) grad_w.data()[row * d + j] += gc.data()[i * d + j];
                 }
               }
               return TensorList{grad_w};
             });
  }
  return out;
}

Tensor LayerNorm(const Tensor& x_in, const Tensor& weight, const Tensor& bias, float eps) {
  const Tensor x = AutocastFp32(x_in);
  const std::int64_t d = x.sizes().back();
  const std::int64_t rows = x.numel() / d;
  Shape stat_sizes(x.sizes().begin(), x.sizes().end() - 1);
  stat_sizes.push_back(1);
  Tensor out = Tensor::Empty(x.ctx(), x.sizes(), x.dtype());
  Tensor mean = Tensor::Empty(x.ctx(), stat_sizes, DType::kFloat32);
  Tensor rstd = Tensor::Empty(x.ctx(), stat_sizes, DType::kFloat32);
  if (x.ctx().computes()) {
    RequireCpuKernel("layer_norm", {&x, &weight, &bias});
    Tensor xc = Contiguous(x);
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* px = xc.data() + r * d;
      double m = 0, v = 0;
      for (std::int64_t j = 0; j < d; ++j) m += px[j];
      m /= static_cast<double>(d);
      for (std::int64_t j = 0; j < d; ++j) v += (px[j] - m) * (px[j] - m);
      v /= static_cast<double>(d);
      const double rs = 1.0 / std::sqrt(v + eps);
      mean.data()[r] = static_cast<float>(m);
      rstd.data()[r] = static_cast<float>(rs);
      for (std::int64_t j = 0; j < d; ++j) {
        out.data()[r * d + j] = static_cast<float>((px[j] - m) * rs * weight.data()[j] + bias.data()[j]);
      }
    }
  }
  if (NeedsGrad({&x, &weight, &bias})) {
    RecordOp("NativeLayerNormBackward0", {&x, &weight, &bias}, {&out},
             // Listed last-first: release_variables frees input, weight, mean,
             // rstd in that order, and a closure's captures die in reverse.
             [rstd, mean, w = weight.Detach(), input = x.Detach(), d, rows](Node& n, TensorList& g) {
               TensorList r(3);
               const bool cpu = g[0].ctx().computes();
               Tensor gc = cpu ? Contiguous(g[0]) : g[0];
               Tensor xc = cpu ? Contiguous(input) : input;
               if (n.next_edges[0].fn) {
                 GradTag tag(n, 0);
                 r[0] = Tensor::Empty(g[0].ctx(), input.sizes(), input.dtype());
                 if (cpu) {
                   for (std::int64_t row = 0; row < rows; ++row) {
                     const float m = mean.data()[row], rs = rstd.data()[row];
                     double a = 0, b = 0;
                     for (std::int64_t j = 0; j < d; ++j) {
                       const double gy = gc.data()[row * d + j] * w.data()[j];
                       const double xhat = (xc.data()[row * d + j] - m) * rs;
                       a += gy;
                       b += gy * xhat;
                     }
                     for (std::int64_t j = 0; j < d; ++j) {
                       const double gy = gc.data()[row * d + j] * w.data()[j];
                       const double xhat = (xc.data()[row * d + j] - m) * rs;
                       r[0].data()[row * d + j] = static_cast<float>(rs * (gy - a / d - xhat * b / d));
                     }
                   }
                 }
               }
               for (int k = 1; k <= 2; ++k) {
                 if (!n.next_edges[k].fn) continue;
                 GradTag tag(n, static_cast<std::size_t>(k));
                 r[k] = Tensor::Zeros(g[0].ctx(), {d}, w.dtype());
                 if (cpu) {
                   for (std::int64_t row = 0; row < rows; ++row) {
                     for (std::int64_t j = 0; j < d; ++j) {
                       const float gy = gc.data()[row * d + j];
                       r[k].data()[j] +=
                           k == 2 ? gy : gy * (xc.data()[row * d + j] - mean.data()[row]) * rstd.data()[row];
                     }
                   }
                 }
               }
               return r;
             });
  }
  return out;
}

Tensor BatchNorm2d(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& running_mean, Tensor& running_var,
                   float /*momentum*/, float /*eps*/) {
  if (x.ctx().computes()) throw TensorError("batch_norm: no CPU kernel here; use --exec meta");
  const Tensor& xi = x;  // cudnn batch norm keeps the input dtype (fp32 statistics)
  const std::int64_t c = xi.sizes()[1];
  Tensor out = Tensor::Empty(xi.ctx(), xi.sizes(), xi.dtype());
  Tensor save_mean = Tensor::Empty(xi.ctx(), {c}, DType::kFloat32);
  Tensor save_invstd = Tensor::Empty(xi.ctx(), {c}, DType::kFloat32);
  (void)running_mean;
  (void)running_var;
  if (NeedsGrad({&xi, &weight, &bias})) {
    RecordOp("CudnnBatchNormBackward0", {&xi, &weight, &bias}, {&out},
             [input = xi.Detach(), w = weight.Detach(), save_mean, save_invstd](Node& n, TensorList& g) {
               TensorList r(3);
               if (n.next_edges[0].fn) {
                 GradTag tag(n, 0);
                 r[0] = EmptyLike(input);
               }
               for (int k = 1; k <= 2; ++k) {
                 if (!n.next_edges[k].fn) continue;
                 GradTag tag(n, static_cast<std::size_t>(k));
                 r[k] = EmptyLike(w);
               }
               (void)g;
               return r;
             });
  }
  return out;
}

Tensor Dropout(const Tensor& x, float p, bool training) {
  if (!training || p == 0) return x;
  // Dropout.cu's dropout_cuda: the bool mask first, then the output.
  Tensor mask = Tensor::Empty(x.ctx(), x.sizes(), DType::kBool);
  Tensor out = Tensor::Empty(x.ctx(), x.sizes(), x.dtype());
  const float scale = 1.f / (1.f - p);
  if (x.ctx().computes()) {
    RequireCpuKernel("dropout", {&x});
    std::mt19937_64 rng(x.ctx().next_seed());
    std::bernoulli_distribution keep(1.0 - p);
    Tensor xc = Contiguous(x);
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      const bool k = keep(rng);
      mask.data_u8()[i] = k ? 1 : 0;
      out.data()[i] = k ? xc.data()[i] * scale : 0.f;
    }
  }
  if (NeedsGrad({&x})) {
    RecordOp("NativeDropoutBackward0", {&x}, {&out}, [mask, scale](Node& n, TensorList& g) {
      GradTag tag(n, 0);
      Tensor r = Tensor::Empty(g[0].ctx(), g[0].sizes(), g[0].dtype());
      if (g[0].ctx().computes()) {
        Tensor gc = Contiguous(g[0]);
        for (std::int64_t i = 0; i < r.numel(); ++i) r.data()[i] = mask.data_u8()[i] ? gc.data()[i] * scale : 0.f;
      }
      return TensorList{r};
    });
  }
  return out;
}

namespace {
// Softmax or log-softmax of the last dimension of a contiguous tensor.
void SoftmaxKernel(const Tensor& x, Tensor& out, bool log) {
  RequireCpuKernel(log ? "log_softmax" : "softmax", {&x});
  Tensor xc = Contiguous(x);
  const std::int64_t d = x.sizes().back(), rows = x.numel() / std::max<std::int64_t>(d, 1);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* px = xc.data() + r * d;
    float* po = out.data() + r * d;
    float mx = -std::numeric_limits<float>::infinity();
    for (std::int64_t j = 0; j < d; ++j) mx = std::max(mx, px[j]);
    double s = 0;
    for (std::int64_t j = 0; j < d; ++j) s += std::exp(double(px[j]) - mx);
    for (std::int64_t j = 0; j < d; ++j) {
      po[j] = log ? static_cast<float>(px[j] - mx - std::log(s)) : static_cast<float>(std::exp(double(px[j]) - mx) / s);
    }
  }
}

Tensor SoftmaxImpl(const Tensor& x_in, int dim, bool log, std::optional<DType> dtype) {
  if (WrapDim(dim, x_in.dim()) != x_in.dim() - 1) throw TensorError("softmax: only the last dimension is supported");
  if (!dtype && AutocastGuard::current() && IsFloating(x_in.dtype())) dtype = DType::kFloat32;
  Tensor x = x_in;
  DType out_dtype = x.dtype();
  if (dtype && *dtype != x.dtype()) {
    out_dtype = *dtype;
    const bool half_to_float = x.dtype() == DType::kFloat16 && *dtype == DType::kFloat32;
    if (!half_to_float) x = To(x, *dtype);  // input_.toType(dtype): bfloat16 too
  }
  Tensor out = Tensor::Empty(x.ctx(), x.sizes(), out_dtype);
  if (x.ctx().computes()) SoftmaxKernel(x, out, log);
  if (NeedsGrad({&x})) {
    RecordOp(log ? "LogSoftmaxBackward0" : "SoftmaxBackward0", {&x}, {&out},
             [result = out.Detach(), log, in_dtype = x.dtype(),
              input = CurrentTorchBehaviour().softmax_saves_input ? x.Detach() : Tensor()](Node& n, TensorList& g) {
               GradTag tag(n, 0);  // _softmax_backward_data(grad, result, dim, self's dtype)
               Tensor r = Tensor::Empty(g[0].ctx(), g[0].sizes(), in_dtype);
               if (g[0].ctx().computes()) {
                 Tensor gc = Contiguous(g[0]);
                 const std::int64_t d = r.sizes().back(), rows = r.numel() / std::max<std::int64_t>(d, 1);
                 for (std::int64_t row = 0; row < rows; ++row) {
                   const float* pg = gc.data() + row * d;
                   const float* py = result.data() + row * d;
                   double s = 0;
                   for (std::int64_t j = 0; j < d; ++j) s += log ? pg[j] : double(pg[j]) * py[j];
                   for (std::int64_t j = 0; j < d; ++j) {
                     r.data()[row * d + j] = log ? static_cast<float>(pg[j] - std::exp(double(py[j])) * s)
                                                 : static_cast<float>(py[j] * (pg[j] - s));
                   }
                 }
               }
               return TensorList{r};
             });
  }
  return out;
}
}  // namespace

Tensor Softmax(const Tensor& x, int dim, std::optional<DType> dtype) { return SoftmaxImpl(x, dim, false, dtype); }
Tensor LogSoftmax(const Tensor& x, int dim, std::optional<DType> dtype) { return SoftmaxImpl(x, dim, true, dtype); }

Tensor NllLoss(const Tensor& log_probs_in, const Tensor& target, Reduction reduction, std::int64_t ignore_index) {
  const Tensor log_probs = AutocastFp32(log_probs_in);
  if (log_probs.dim() != 2 || target.dim() != 1 || target.sizes()[0] != log_probs.sizes()[0]) {
    throw TensorError(absl::StrCat("nll_loss: input ", ShapeText(log_probs.sizes()), " and target ",
                                   ShapeText(target.sizes()), " do not match"));
  }
  const std::int64_t n = log_probs.sizes()[0], c = log_probs.sizes()[1];
  Tensor out = reduction == Reduction::kNone ? Tensor::Empty(log_probs.ctx(), {n}, log_probs.dtype())
                                             : Tensor::Empty(log_probs.ctx(), {}, log_probs.dtype());
  Tensor total_weight = Tensor::Empty(log_probs.ctx(), {}, log_probs.dtype());
  if (log_probs.ctx().computes()) {
    RequireCpuKernel("nll_loss", {&log_probs});
    Tensor lp = Contiguous(log_probs);
    Tensor tc = Contiguous(target);
    double sum = 0, count = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t t = tc.data_i64()[i];
      if (t == ignore_index) {
        if (reduction == Reduction::kNone) out.data()[i] = 0;
        continue;
      }
      if (t < 0 || t >= c) throw TensorError("nll_loss: target out of range");
      const float v = -lp.data()[i * c + t];
      if (reduction == Reduction::kNone) out.data()[i] = v;
      sum += v;
      count += 1;
    }
    total_weight.data()[0] = static_cast<float>(count);
    if (reduction == Reduction::kSum) out.data()[0] = static_cast<float>(sum);
    if (reduction == Reduction::kMean) out.data()[0] = static_cast<float>(sum / count);
  }
  if (NeedsGrad({&log_probs})) {
    RecordOp("NllLossBackward0", {&log_probs}, {&out},
             [self = log_probs.Detach(), tgt = target.Detach(), total_weight, reduction, ignore_index, n, c](
                 Node& node, TensorList& g) {
               GradTag tag(node, 0);  // nll_loss_backward: a zero (N, C) tensor with -w at the targets
               Tensor r = Tensor::Zeros(g[0].ctx(), self.sizes(), self.dtype());
               if (g[0].ctx().computes()) {
                 Tensor tc = Contiguous(tgt);
                 const float tw = total_weight.data()[0];
                 for (std::int64_t i = 0; i < n; ++i) {
                   const std::int64_t t = tc.data_i64()[i];
                   if (t == ignore_index) continue;
                   const float gi = reduction == Reduction::kNone ? g[0].data()[i * g[0].strides()[0]] : g[0].data()[0];
                   r.data()[i * c + t] = reduction == Reduction::kMean ? -gi / tw : -gi;
                 }
               }
               return TensorList{r};
             });
  }
  return out;
}

Tensor CrossEntropy(const Tensor& logits, const Tensor& target, Reduction reduction, std::int64_t ignore_index) {
  // cross_entropy_loss (LossNLL.cpp): nll_loss_nd(log_softmax(self, class_dim,
  // self.scalar_type()), ...). The explicit dtype keeps autocast from making
  // log_softmax float32; nll_loss, on autocast's float32 list, then casts
  // the log-probabilities (a float32 copy it saves for backward).
  return NllLoss(LogSoftmax(logits, 1, logits.dtype()), target, reduction, ignore_index);
}

Tensor MseLoss(const Tensor& x_in, const Tensor& target_in) {
  // Autocast's float32 list (KERNEL_CUDA(mse_loss, fp32); CPU's too).
  const Tensor x = AutocastFp32(x_in), target = AutocastFp32(target_in);
  // mse_loss is a structured kernel (Loss.cpp): its meta function allocates
  // the output at the inputs' broadcast shape and, for a reduction,
  // resize_({})s it, which keeps the storage; the 0-d loss therefore holds
  // an input-sized storage until it dies. The elementwise loss is a second
  // input-sized temporary, reduced into it by mean_out. (PyTorch 1.13 on CPU
  // does exactly this: tests/oracle/.)
  Tensor out = Tensor::Empty(x.ctx(), x.sizes(), x.dtype()).AsStrided({}, {}, 0);
  { Tensor elementwise = Tensor::Empty(x.ctx(), x.sizes(), x.dtype()); }
  if (x.ctx().computes()) {
    RequireCpuKernel("mse_loss", {&x, &target});
    Tensor xc = Contiguous(x), tc = Contiguous(target);
    double sum = 0;
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      const double d = xc.data()[i] - tc.data()[i];
      sum += d * d;
    }
    out.data()[0] = static_cast<float>(sum / static_cast<double>(x.numel()));
  }
  if (NeedsGrad({&x})) {
    RecordOp("MseLossBackward0", {&x}, {&out}, [self = x.Detach(), t = target.Detach()](Node& n, TensorList& g) {
      GradTag tag(n, 0);  // 2 * (self - target) * grad / numel
      Tensor r = Tensor::Empty(g[0].ctx(), self.sizes(), self.dtype());
      if (g[0].ctx().computes()) {
        Tensor xc = Contiguous(self), tc = Contiguous(t);
        const float scale = 2.f * g[0].data()[0] / static_cast<float>(self.numel());
        for (std::int64_t i = 0; i < r.numel(); ++i) r.data()[i] = scale * (xc.data()[i] - tc.data()[i]);
      }
      return TensorList{r};
    });
  }
  return out;
}

Tensor Conv2d(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in, int stride, int padding) {
  // Autocast casts the last argument first (see AutocastLower).
  const Tensor bias = AutocastLower(bias_in);
  const Tensor weight = AutocastLower(weight_in);
  const Tensor x = AutocastLower(x_in);
  if (x.dim() != 4 || weight.dim() != 4 || x.sizes()[1] != weight.sizes()[1]) {
    throw TensorError(absl::StrCat("conv2d: input ", ShapeText(x.sizes()), " and weight ", ShapeText(weight.sizes()),
                                   " do not match"));
  }
  const std::int64_t n = x.sizes()[0], ci = x.sizes()[1], h = x.sizes()[2], w = x.sizes()[3];
  const std::int64_t co = weight.sizes()[0], kh = weight.sizes()[2], kw = weight.sizes()[3];
  const std::int64_t oh = (h + 2 * padding - kh) / stride + 1, ow = (w + 2 * padding - kw) / stride + 1;
  if (oh <= 0 || ow <= 0) throw TensorError("conv2d: kernel larger than the padded input");
  Tensor out = Tensor::Empty(x.ctx(), {n, co, oh, ow}, x.dtype());
  // Visits every (input element, weight element, output element) triple.
  auto for_each_tap = [=](auto&& f) {
    for (std::int64_t b = 0; b < n; ++b)
      for (std::int64_t o = 0; o < co; ++o)
        for (std::int64_t y = 0; y < oh; ++y)
          for (std::int64_t xo = 0; xo < ow; ++xo)
            for (std::int64_t i = 0; i < ci; ++i)
              for (std::int64_t u = 0; u < kh; ++u)
                for (std::int64_t v = 0; v < kw; ++v) {
                  const std::int64_t iy = y * stride - padding + u, ix = xo * stride - padding + v;
                  if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
                  f(((b * ci + i) * h + iy) * w + ix, ((o * ci + i) * kh + u) * kw + v,
                    ((b * co + o) * oh + y) * ow + xo);
                }
  };
  if (x.ctx().computes()) {
    RequireCpuKernel("conv2d", {&x, &weight, &bias});
    Tensor xc = Contiguous(x), wc = Contiguous(weight);
    for (std::int64_t i = 0; i < out.numel(); ++i)
      out.data()[i] = bias.defined() ? bias.data()[(i / (oh * ow)) % co] : 0.f;
    for_each_tap(
        [&](std::int64_t xi, std::int64_t wi, std::int64_t oi) { out.data()[oi] += xc.data()[xi] * wc.data()[wi]; });
  }
  if (NeedsGrad({&x, &weight, &bias})) {
    RecordOp("ConvolutionBackward0", {&x, &weight, &bias}, {&out},
             [input = x.Detach(), wt = weight.Detach(), has_bias = bias.defined(), co, oh, ow, for_each_tap](
                 Node& node, TensorList& g) {
               TensorList r(3);
               const bool cpu = g[0].ctx().computes();
               Tensor gc = cpu ? Contiguous(g[0]) : g[0];
               Tensor xc = cpu ? Contiguous(input) : input;
               Tensor wc = cpu ? Contiguous(wt) : wt;
               if (node.next_edges[0].fn) {
                 GradTag tag(node, 0);
                 r[0] = Tensor::Zeros(g[0].ctx(), input.sizes(), input.dtype());
                 if (cpu)
                   for_each_tap([&](std::int64_t xi, std::int64_t wi, std::int64_t oi) {
                     r[0].data()[xi] += gc.data()[oi] * wc.data()[wi];
                   });
               }
               if (node.next_edges[1].fn) {
                 GradTag tag(node, 1);
                 r[1] = Tensor::Zeros(g[0].ctx(), wt.sizes(), wt.dtype());
                 if (cpu)
                   for_each_tap([&](std::int64_t xi, std::int64_t wi, std::int64_t oi) {
                     r[1].data()[wi] += gc.data()[oi] * xc.data()[xi];
                   });
               }
               if (has_bias && node.next_edges[2].fn) {
                 GradTag tag(node, 2);
                 r[2] = Tensor::Zeros(g[0].ctx(), {co}, wt.dtype());
                 if (cpu) {
                   for (std::int64_t i = 0; i < gc.numel(); ++i) r[2].data()[(i / (oh * ow)) % co] += gc.data()[i];
                 }
               }
               return r;
             });
  }
  return out;
}

Tensor MaxPool2d(const Tensor& x, int kernel, int stride, int padding) {
  if (x.dim() != 4) throw TensorError("max_pool2d: expects (N, C, H, W)");
  const std::int64_t n = x.sizes()[0], c = x.sizes()[1], h = x.sizes()[2], w = x.sizes()[3];
  const std::int64_t oh = (h + 2 * padding - kernel) / stride + 1, ow = (w + 2 * padding - kernel) / stride + 1;
  Tensor out = Tensor::Empty(x.ctx(), {n, c, oh, ow}, x.dtype());
  Tensor indices = Tensor::Empty(x.ctx(), {n, c, oh, ow}, DType::kInt64);
  if (x.ctx().computes()) {
    RequireCpuKernel("max_pool2d", {&x});
    Tensor xc = Contiguous(x);
    for (std::int64_t p = 0; p < n * c; ++p)
      for (std::int64_t y = 0; y < oh; ++y)
        for (std::int64_t xo = 0; xo < ow; ++xo) {
          float best = -std::numeric_limits<float>::infinity();
          std::int64_t arg = 0;
          for (int u = 0; u < kernel; ++u)
            for (int v = 0; v < kernel; ++v) {
              const std::int64_t iy = y * stride - padding + u, ix = xo * stride - padding + v;
              if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
              const float val = xc.data()[(p * h + iy) * w + ix];
              if (val > best) {
                best = val;
                arg = iy * w + ix;
              }
            }
          out.data()[(p * oh + y) * ow + xo] = best;
          indices.data_i64()[(p * oh + y) * ow + xo] = arg;
        }
  }
  if (NeedsGrad({&x})) {
    RecordOp("MaxPool2DWithIndicesBackward0", {&x}, {&out},
             [input = x.Detach(), indices, h, w](Node& node, TensorList& g) {
               GradTag tag(node, 0);
               Tensor r = Tensor::Zeros(g[0].ctx(), input.sizes(), input.dtype());
               if (g[0].ctx().computes()) {
                 Tensor gc = Contiguous(g[0]);
                 const std::int64_t per_plane = gc.sizes()[2] * gc.sizes()[3];
                 for (std::int64_t i = 0; i < gc.numel(); ++i)
                   r.data()[(i / per_plane) * h * w + indices.data_i64()[i]] += gc.data()[i];
               }
               return TensorList{r};
             });
  }
  return out;
}

Tensor AdaptiveAvgPool2d(const Tensor& x, std::int64_t out_h, std::int64_t out_w) {
  if (x.dim() != 4) throw TensorError("adaptive_avg_pool2d: expects (N, C, H, W)");
  if (x.ctx().computes()) throw TensorError("adaptive_avg_pool2d: no CPU kernel here; use --exec meta");
  Tensor out = Tensor::Empty(x.ctx(), {x.sizes()[0], x.sizes()[1], out_h, out_w}, x.dtype());
  if (NeedsGrad({&x})) {
    RecordOp("AdaptiveAvgPool2DBackward0", {&x}, {&out}, [self = x.Detach()](Node& node, TensorList&) {
      GradTag tag(node, 0);
      return TensorList{EmptyLike(self)};
    });
  }
  return out;
}

Tensor Cat(const TensorList& tensors, int dim_in) {
  if (tensors.empty()) throw TensorError("cat: no tensors");
  const int dim = WrapDim(dim_in, tensors[0].dim());
  Shape sizes = tensors[0].sizes();
  sizes[dim] = 0;
  DType dtype = tensors[0].dtype();
  for (const Tensor& t : tensors) {
    if (t.dim() != tensors[0].dim()) throw TensorError("cat: tensors of different rank");
    sizes[dim] += t.sizes()[dim];
    dtype = internal::PromoteTypes(dtype, t.dtype());
  }
  Tensor out = Tensor::Empty(tensors[0].ctx(), sizes, dtype);
  std::int64_t start = 0;
  std::vector<std::int64_t> lengths;
  for (const Tensor& t : tensors) {
    if (out.ctx().computes()) {
      Tensor part = out.AsStrided(t.sizes(), out.strides(), start * out.strides()[dim]);
      CopyInPlace(part, t);
    }
    start += t.sizes()[dim];
    lengths.push_back(t.sizes()[dim]);
  }
  std::vector<const Tensor*> inputs;
  for (const Tensor& t : tensors) inputs.push_back(&t);
  bool needs = false;
  for (const Tensor& t : tensors) needs = needs || NeedsGrad({&t});
  if (needs) {
    RecordOp("CatBackward0", inputs, {&out}, [lengths, dim](Node&, TensorList& g) {
      TensorList r;
      std::int64_t s = 0;
      for (std::int64_t len : lengths) {
        r.push_back(g[0].AsStrided(
            [&] {
              Shape sz = g[0].sizes();
              sz[dim] = len;
              return sz;
            }(),
            g[0].strides(), g[0].impl()->offset + s * g[0].strides()[dim]));
        s += len;
      }
      return r;
    });
  }
  return out;
}

Tensor Stack(const TensorList& tensors, int dim) {
  TensorList expanded;
  {
    // unsqueeze views only; the one allocation is cat's.
    for (const Tensor& t : tensors) expanded.push_back(Unsqueeze(t, dim));
  }
  return Cat(expanded, dim);
}

Tensor PadLastDim(const Tensor& x, std::int64_t left, std::int64_t right, float value) {
  Shape sizes = x.sizes();
  sizes.back() += left + right;
  Tensor out = Tensor::Full(x.ctx(), sizes, value, x.dtype());
  if (x.ctx().computes()) {
    Tensor part = out.AsStrided(x.sizes(), out.strides(), left);
    CopyInPlace(part, x);
  }
  return out;
}

// ---------------------------------------------------------------- recurrent

namespace {
void RequireMeta(const Tensor& t, std::string_view op) {
  if (t.ctx().computes()) throw TensorError(absl::StrCat(std::string(op), ": no CPU kernel here; use --exec meta"));
}
}  // namespace

Tensor GruCell(const Tensor& x, const Tensor& h, const Tensor& w_ih, const Tensor& w_hh, const Tensor& b_ih,
               const Tensor& b_hh) {
  RequireMeta(x, "gru_cell");
  // gru_cell(input, hx, w_ih, w_hh, b_ih, b_hh) is on autocast's lower list;
  // its arguments are cast last first (see AutocastLower).
  const Tensor bh = AutocastLower(b_hh);
  const Tensor bi = AutocastLower(b_ih);
  const Tensor whh = AutocastLower(w_hh);
  const Tensor wih = AutocastLower(w_ih);
  const Tensor hx = AutocastLower(h);
  const Tensor xc = AutocastLower(x);
  Tensor igates = Matmul(xc, T(wih));
  Tensor hgates = Matmul(hx, T(whh));
  const std::int64_t b = x.sizes()[0], hidden = h.sizes()[1];
  Tensor hy = Tensor::Empty(x.ctx(), {b, hidden}, igates.dtype());
  Tensor workspace = Tensor::Empty(x.ctx(), {b, 5 * hidden}, igates.dtype());
  if (NeedsGrad({&igates, &hgates, &hx, &bi, &bh})) {
    RecordOp("ThnnFusedGruCellBackward0", {&igates, &hgates, &hx, &bi, &bh}, {&hy},
             [ig = igates.Detach(), hg = hgates.Detach(), hs = hx.Detach(), bi2 = bi.Detach(), bh2 = bh.Detach(),
              workspace](Node& n, TensorList& g) {
               TensorList r(5);
               {
                 GradTag tag(n, 0);
                 r[0] = EmptyLike(ig);
               }
               {
                 GradTag tag(n, 1);
                 r[1] = EmptyLike(hg);
               }
               {
                 GradTag tag(n, 2);
                 r[2] = EmptyLike(hs);
               }
               for (std::size_t k = 3; k < 5; ++k) {
                 if (!n.next_edges[k].fn) continue;
                 GradTag tag(n, k);
                 r[k] = SumDims(k == 3 ? r[0] : r[1], {0});
               }
               (void)g;
               (void)bi2;
               (void)bh2;
               return r;
             });
  }
  return hy;
}

RnnResult CudnnRnn(const Tensor& input, const Tensor& flat_weights, const TensorList& weight_views, bool lstm,
                   std::int64_t layers, bool bidirectional, std::int64_t hidden, std::int64_t batch) {
  RequireMeta(input, "cudnn_rnn");
  const std::int64_t dirs = bidirectional ? 2 : 1;
  const std::int64_t gates = lstm ? 4 : 3;
  const std::int64_t rows = input.sizes()[0];
  DType dtype = input.dtype();
  Tensor x = input;
  Tensor weight_buf = flat_weights;
  if (auto ac = AutocastGuard::current(); ac && IsFloating(dtype)) {
    // AutocastRNN: a fresh low-precision flat copy of all weights per call (not cached).
    x = To(input, *ac);
    weight_buf = EmptyLike(flat_weights, *ac);
    dtype = *ac;
  }
  const std::size_t es = ElementSize(dtype);
  RnnResult result;
  result.output = Tensor::Empty(x.ctx(), {rows, dirs * hidden}, dtype);
  result.hy = Tensor::Empty(x.ctx(), {layers * dirs, batch, hidden}, dtype);
  if (lstm) result.cy = Tensor::Empty(x.ctx(), {layers * dirs, batch, hidden}, dtype);
  // Approximations of cuDNN's sizes (docs/ddp.md): the reserve
  // space keeps every layer's gate activations for backward; the workspace
  // holds one layer's gate pre-activations during the call.
  const std::int64_t reserve_elems = layers * dirs * rows * hidden * (gates + 1);
  Tensor reserve = Tensor::Empty(x.ctx(), {reserve_elems * static_cast<std::int64_t>(es)}, DType::kUInt8);
  {
    ScopedTag tag(Category::kTemporary, ScopedTag::current_owner());
    Tensor workspace = Tensor::Empty(x.ctx(), {dirs * rows * hidden * gates}, dtype);
  }
  std::vector<const Tensor*> inputs{&x};
  for (const Tensor& w : weight_views) inputs.push_back(&w);
  bool needs = NeedsGrad({&x});
  for (const Tensor& w : weight_views) needs = needs || NeedsGrad({&w});
  if (needs) {
    std::vector<Tensor*> outputs{&result.output, &result.hy};
    if (lstm) outputs.push_back(&result.cy);
    RecordOp("CudnnRnnBackward0", inputs, outputs,
             [in = x.Detach(), wb = weight_buf, out = result.output.Detach(), reserve, weight_views, dirs, rows, hidden,
              gates, dtype](Node& n, TensorList&) {
               TensorList r(1 + weight_views.size());
               Tensor workspace;
               {
                 ScopedTag tag(Category::kTemporary, n.owner());
                 workspace = Tensor::Empty(in.ctx(), {dirs * rows * hidden * gates}, dtype);
               }
               if (n.next_edges[0].fn) {
                 GradTag tag(n, 0);
                 r[0] = EmptyLike(in);
               }
               // dw: one flat buffer; each parameter's gradient is a view of it.
               std::int64_t total = 0;
               for (const Tensor& w : weight_views) total += w.numel();
               Tensor dw;
               {
                 GradTag tag(n, 1);
                 dw = Tensor::Empty(in.ctx(), {total}, weight_views.empty() ? dtype : weight_views[0].dtype());
               }
               std::int64_t off = 0;
               for (std::size_t i = 0; i < weight_views.size(); ++i) {
                 r[1 + i] = dw.AsStrided(weight_views[i].sizes(), ContiguousStrides(weight_views[i].sizes()), off);
                 off += weight_views[i].numel();
               }
               (void)wb;  // the captures above are the saved tensors: alive until this node runs
               (void)out;
               (void)reserve;
               return r;
             });
  }
  return result;
}

// ---------------------------------------------------------------- attention

Tensor FlashAttention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in) {
  RequireMeta(q_in, "flash_attention");
  // Autocast casts the last argument first (see AutocastLower).
  const Tensor v = AutocastLower(v_in);
  const Tensor k = AutocastLower(k_in);
  const Tensor q = AutocastLower(q_in);
  // The kernel works in (B, T, H, D) memory and returns its output as the
  // (B, H, T, D) transposed view, so merging heads afterwards copies nothing.
  const Shape& s = q.sizes();
  Tensor out = Tensor::Empty(q.ctx(), {s[0], s[2], s[1], s[3]}, q.dtype());
  out = out.AsStrided(s, {s[2] * s[1] * s[3], s[3], s[1] * s[3], 1}, 0);
  Shape lse_sizes(q.sizes().begin(), q.sizes().end() - 1);
  Tensor logsumexp = Tensor::Empty(q.ctx(), lse_sizes, DType::kFloat32);
  if (NeedsGrad({&q, &k, &v})) {
    RecordOp("ScaledDotProductFlashAttentionBackward0", {&q, &k, &v}, {&out},
             [qs = q.Detach(), ks = k.Detach(), vs = v.Detach(), os = out.Detach(), logsumexp](Node& n, TensorList&) {
               TensorList r(3);
               Tensor softmax_d, dq_accum;
               {
                 ScopedTag tag(Category::kTemporary, n.owner());
                 softmax_d = Tensor::Empty(qs.ctx(), logsumexp.sizes(), DType::kFloat32);
                 dq_accum = Tensor::Empty(qs.ctx(), qs.sizes(), DType::kFloat32);
               }
               const Tensor* src[3] = {&qs, &ks, &vs};
               for (std::size_t i = 0; i < 3; ++i) {
                 GradTag tag(n, i);
                 r[i] = EmptyLike(*src[i]);
               }
               (void)os;
               return r;
             });
  }
  return out;
}

}  // namespace memscope::ops
