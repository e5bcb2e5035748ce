// A small real model for the pipeline executor: a stack of residual MLP blocks,
//   y = x + W2 · tanh(W1 · x + b1) + b2,
// split into pipeline stages of `blocks` blocks each, with a mean-squared-error loss on the last
// stage. Forward and backward are real float math, enqueued as kernels on the backend B through one
// customization point, stage_device<B>: on the mock backend each kernel declares the bytes it reads
// and writes (so the hazard checker sees every byte move); on a backend whose launch(stream, fn) runs
// a host function as a kernel and whose device addresses are host memory (the tests' threaded
// backend), the same body runs on plain pointers; the CUDA tests run it on host copies of the
// declared bytes, in stream order. The math is written once, over an accessor with read<T>(p, n) and
// write<T>(p, n).
// Every value (weights, inputs, targets) is a pure function of the seed, the step, the stage and the
// micro-batch, so a run on any number of ranks trains exactly the same model on the same data.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/backend/mock.hpp>
#include <pipeswap/exec/stage.hpp>

namespace pipeline_train {

namespace ps = pipeswap;
namespace mock = pipeswap::mock;

struct model_config {
  std::size_t dim = 64;     ///< width of the residual stream (the stage boundary)
  std::size_t hidden = 128; ///< width of each block's hidden layer
  std::size_t rows = 32;    ///< rows of one micro-batch
  int blocks = 2;           ///< blocks per stage
  int stages = 4;           ///< stages of the model
  int micro = 8;            ///< micro-batches per step
  std::uint64_t seed = 1;
};

/// A reproducible value in [-0.5, 0.5) for (seed, a, b, c, i).
inline float noise(std::uint64_t seed, std::uint64_t a, std::uint64_t b, std::uint64_t c, std::uint64_t i) {
  std::uint64_t z = seed * 0x9E3779B97F4A7C15ull ^ (a + 1) * 0xBF58476D1CE4E5B9ull ^ (b + 7) * 0x94D049BB133111EBull ^
                    (c + 13) * 0xD6E8FEB86659FD93ull ^ (i + 0x632BE59BD9B4E019ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) / 16777216.0f - 0.5f;
}

template <class B>
inline constexpr bool is_mock_backend = std::is_same_v<B, mock::backend>;

/// A byte range a kernel reads or writes.
using region = mock::region;

/// What a kernel body sees on a backend whose device addresses are host memory: the same read<T>
/// and write<T> spans as mock::kernel_context, over plain pointers.
struct host_access {
  template <class T>
  [[nodiscard]] std::span<T const> read(ps::device_ptr p, std::size_t n) const {
    return {p.get<T const>(), n};
  }
  template <class T>
  [[nodiscard]] std::span<T> write(ps::device_ptr p, std::size_t n) const {
    return {p.get<T>(), n};
  }
};

/// How the stage's kernels and its host transfers run on backend B: launch(b, s, label, reads,
/// writes, body) enqueues `body(k)` as a kernel on stream s, where k has read<T>(p, n) and
/// write<T>(p, n) and the body touches only the declared `reads` and `writes`; upload and download
/// move bytes between the host and device memory, ordered after the work enqueued on s (the host
/// waits). This primary template serves a backend whose launch(stream, fn) runs a host function as a
/// kernel and whose device addresses are host memory (the tests' threaded backend): the body runs on
/// plain pointers, and the description is not built. The mock's specialisation follows; another
/// backend specialises it before it instantiates a stage (the CUDA tests' does,
/// tests/support/cuda_host_kernel.hpp).
template <class B>
struct stage_device {
  static constexpr bool available = requires(B & b, ps::stream_t<B> s, void (*fn)()) { b.launch(s, fn); };

  template <class Body>
  static void launch(B& b, ps::stream_t<B> s, std::string const&, std::vector<region> const&,
                     std::vector<region> const&, Body body) {
    b.launch(s, [body = std::move(body)] { body(host_access{}); });
  }
  static void upload(B& b, ps::stream_t<B> s, ps::device_ptr d, std::span<std::byte const> bytes) {
    auto v = std::make_shared<std::vector<std::byte>>(bytes.begin(), bytes.end());
    b.launch(s, [d, v] { std::memcpy(d.get<std::byte>(), v->data(), v->size()); });
    b.synchronize(b.record_event(s));
  }
  static std::vector<std::byte> download(B& b, ps::stream_t<B> s, ps::device_ptr d, std::size_t n) {
    auto out = std::make_shared<std::vector<std::byte>>(n);
    b.launch(s, [d, out] { std::memcpy(out->data(), d.get<std::byte const>(), out->size()); });
    b.synchronize(b.record_event(s));
    return std::move(*out);
  }
};

/// On the mock each kernel is described by its label, reads and writes (the hazard checker's view),
/// and the host reads and writes device memory directly.
template <>
struct stage_device<mock::backend> {
  static constexpr bool available = true;

  template <class Body>
  static void launch(mock::backend& b, mock::stream s, std::string label, std::vector<region> reads,
                     std::vector<region> writes, Body body) {
    b.launch(s, mock::kernel_desc{std::move(label), std::move(reads), std::move(writes), {}},
             [body = std::move(body)](mock::kernel_context const& k) { body(k); });
  }
  static void upload(mock::backend& b, mock::stream, ps::device_ptr d, std::span<std::byte const> bytes) {
    b.write_device(d, bytes);
  }
  static std::vector<std::byte> download(mock::backend& b, mock::stream, ps::device_ptr d, std::size_t n) {
    return b.read_device(d, n);
  }
};

/// Whether a stage runs on B: stage_device<B> serves it.
template <class B>
concept stage_backend = stage_device<B>::available;

template <class B, class Body>
void launch(B& b, ps::stream_t<B> s, std::string label, std::vector<region> reads, std::vector<region> writes,
            Body body) {
  stage_device<B>::launch(b, s, std::move(label), std::move(reads), std::move(writes), std::move(body));
}

template <class B>
void upload(B& b, ps::stream_t<B> s, ps::device_ptr d, std::span<std::byte const> bytes) {
  stage_device<B>::upload(b, s, d, bytes);
}

template <class B>
std::vector<std::byte> download(B& b, ps::stream_t<B> s, ps::device_ptr d, std::size_t n) {
  return stage_device<B>::download(b, s, d, n);
}

/// One pipeline stage of the model on backend B: its blocks' weights and gradients on the device.
template <stage_backend B>
class mlp_stage {
public:
  using stage_concept = ps::exec::stage_tag;
  using stream = ps::stream_t<B>;
  using fwd_args = ps::exec::forward_args<B>;
  using bwd_args = ps::exec::backward_args<B>;

  /// A weight tensor and its gradient.
  struct tensor {
    ps::device_ptr param, grad;
    std::size_t numel = 0;
  };

  mlp_stage(B& b, model_config cfg, int stage) : b_(b), c_(cfg), stage_(stage) {
    auto const s = b_.current_stream();
    for (int j = 0; j < c_.blocks; ++j) {
      for (std::size_t n : {c_.hidden * c_.dim, c_.hidden, c_.dim * c_.hidden, c_.dim}) {
        tensor t{b_.allocate_device(4 * n, s), b_.allocate_device(4 * n, s), n};
        std::vector<float> v(n);
        auto const k = tensors_.size();
        float const scale = (k % 2 == 0) ? 1.0f / std::sqrt(static_cast<float>(k % 4 == 0 ? c_.dim : c_.hidden)) : 0.1f;
        for (std::size_t i = 0; i < n; ++i) v[i] = scale * noise(c_.seed, 1000 + stage_, k, 0, i);
        upload(b_, s, t.param, std::as_bytes(std::span(v)));
        tensors_.push_back(t);
      }
    }
    if (last()) loss_ = b_.allocate_device(4 * static_cast<std::size_t>(c_.micro), s);
  }
  mlp_stage(mlp_stage const&) = delete;
  mlp_stage& operator=(mlp_stage const&) = delete;
  ~mlp_stage() {
    try {
      auto const s = b_.current_stream();
      for (auto& t : tensors_) {
        b_.deallocate_device(t.param, 4 * t.numel, s);
        b_.deallocate_device(t.grad, 4 * t.numel, s);
      }
      if (loss_) b_.deallocate_device(loss_, 4 * static_cast<std::size_t>(c_.micro), s);
    } catch (...) {}
  }

  [[nodiscard]] std::size_t input_bytes() const { return 4 * c_.rows * c_.dim; }
  [[nodiscard]] std::size_t output_bytes() const { return 4 * c_.rows * c_.dim; }
  [[nodiscard]] std::vector<tensor> const& tensors() const noexcept { return tensors_; }
  [[nodiscard]] int index() const noexcept { return stage_; }
  [[nodiscard]] bool last() const noexcept { return stage_ + 1 == c_.stages; }
  /// Last stage: the device buffer of per-micro-batch losses of the current step.
  [[nodiscard]] ps::device_ptr losses() const noexcept { return loss_; }

  /// Zeroes the gradients and advances the data to the next step.
  void begin_step(B& b, stream s) {
    ++step_;
    std::vector<region> writes;
    for (auto const& t : tensors_) writes.push_back({t.grad, 4 * t.numel});
    launch(b, s, "zero grads s" + std::to_string(stage_), {}, std::move(writes), [ts = tensors_](auto const& k) {
      for (auto const& t : ts) {
        auto g = k.template write<float>(t.grad, t.numel);
        std::fill(g.begin(), g.end(), 0.0f);
      }
    });
  }

  void forward(fwd_args& f) {
    auto& b = f.backend;
    auto const s = f.stream;
    std::size_t const R = c_.rows, D = c_.dim, H = c_.hidden;
    ps::device_ptr x = f.input.ptr;
    if (stage_ == 0) { // data loading: the micro-batch's input rows
      x = b.allocate_device(4 * R * D, s);
      launch(b, s, label("load", f.micro), {}, {{x, 4 * R * D}},
             [x, n = R * D, seed = c_.seed, step = step_, m = f.micro](auto const& k) {
               auto v = k.template write<float>(x, n);
               for (std::size_t i = 0; i < n; ++i) v[i] = 2.0f * noise(seed, 1, step, static_cast<std::uint64_t>(m), i);
             });
      f.save(x, 4 * R * D);
    }
    for (int j = 0; j < c_.blocks; ++j) {
      auto const& w1 = tensors_[4 * j];
      auto const& b1 = tensors_[4 * j + 1];
      auto const& w2 = tensors_[4 * j + 2];
      auto const& b2 = tensors_[4 * j + 3];
      auto const a = b.allocate_device(4 * R * H, s);
      bool const to_output = j + 1 == c_.blocks && f.output.ptr;
      auto const y = to_output ? f.output.ptr : b.allocate_device(4 * R * D, s);
      launch(b, s, label("fwd b" + std::to_string(j), f.micro),
             {{x, 4 * R * D}, {w1.param, 4 * H * D}, {b1.param, 4 * H}, {w2.param, 4 * D * H}, {b2.param, 4 * D}},
             {{a, 4 * R * H}, {y, 4 * R * D}}, [=](auto const& k) {
               auto X = k.template read<float>(x, R * D);
               auto W1 = k.template read<float>(w1.param, H * D);
               auto B1 = k.template read<float>(b1.param, H);
               auto W2 = k.template read<float>(w2.param, D * H);
               auto B2 = k.template read<float>(b2.param, D);
               auto A = k.template write<float>(a, R * H);
               auto Y = k.template write<float>(y, R * D);
               for (std::size_t r = 0; r < R; ++r) {
                 for (std::size_t h = 0; h < H; ++h) {
                   float acc = B1[h];
                   for (std::size_t i = 0; i < D; ++i) acc += W1[h * D + i] * X[r * D + i];
                   A[r * H + h] = std::tanh(acc);
                 }
                 for (std::size_t o = 0; o < D; ++o) {
                   float acc = B2[o];
                   for (std::size_t h = 0; h < H; ++h) acc += W2[o * H + h] * A[r * H + h];
                   Y[r * D + o] = X[r * D + o] + acc;
                 }
               }
             });
      f.save(a, 4 * R * H);
      if (!to_output) f.save(y, 4 * R * D);
      x = y;
    }
    if (last()) { // the loss of this micro-batch
      auto const slot = loss_ + 4 * static_cast<std::size_t>(f.micro);
      launch(b, s, label("loss", f.micro), {{x, 4 * R * D}}, {{slot, 4}},
             [=, seed = c_.seed, step = step_, m = f.micro](auto const& k) {
               auto Y = k.template read<float>(x, R * D);
               float sum = 0;
               for (std::size_t i = 0; i < R * D; ++i) {
                 float const e = Y[i] - target(seed, step, m, i);
                 sum += e * e;
               }
               k.template write<float>(slot, 1)[0] = sum / static_cast<float>(R * D);
             });
    }
  }

  void backward(bwd_args& g) {
    auto& b = g.backend;
    auto const s = g.stream;
    std::size_t const R = c_.rows, D = c_.dim, H = c_.hidden;
    // The saved buffers, in save order: [x0 on stage 0], then per block a_j and y_j (the last block's
    // y only on the last stage).
    std::size_t at = 0;
    ps::device_ptr const x0 = stage_ == 0 ? g.saved[at++].ptr : g.input.ptr;
    std::vector<ps::device_ptr> xs{x0}, as;
    for (int j = 0; j < c_.blocks; ++j) {
      as.push_back(g.saved[at++].ptr);
      if (j + 1 < c_.blocks || last()) xs.push_back(g.saved[at++].ptr);
    }
    std::vector<ps::device_ptr> temps;
    ps::device_ptr dy = g.grad_output.ptr;
    if (last()) { // d loss / d y of the mean over micro-batches of the per-micro-batch MSE
      dy = b.allocate_device(4 * R * D, s);
      temps.push_back(dy);
      auto const y = xs.back();
      float const scale = 2.0f / static_cast<float>(R * D) / static_cast<float>(c_.micro);
      launch(b, s, label("loss grad", g.micro), {{y, 4 * R * D}}, {{dy, 4 * R * D}},
             [=, seed = c_.seed, step = step_, m = g.micro](auto const& k) {
               auto Y = k.template read<float>(y, R * D);
               auto G = k.template write<float>(dy, R * D);
               for (std::size_t i = 0; i < R * D; ++i) G[i] = scale * (Y[i] - target(seed, step, m, i));
             });
    }
    for (int j = c_.blocks - 1; j >= 0; --j) {
      auto const& w1 = tensors_[4 * j];
      auto const& b1 = tensors_[4 * j + 1];
      auto const& w2 = tensors_[4 * j + 2];
      auto const& b2 = tensors_[4 * j + 3];
      auto const x = xs[static_cast<std::size_t>(j)];
      auto const a = as[static_cast<std::size_t>(j)];
      ps::device_ptr dx{};
      if (j > 0) {
        dx = b.allocate_device(4 * R * D, s);
        temps.push_back(dx);
      } else if (g.grad_input.ptr) {
        dx = g.grad_input.ptr;
      }
      std::vector<region> writes{{w1.grad, 4 * H * D}, {b1.grad, 4 * H}, {w2.grad, 4 * D * H}, {b2.grad, 4 * D}};
      if (dx) writes.push_back({dx, 4 * R * D});
      launch(b, s, label("bwd b" + std::to_string(j), g.micro),
             {{x, 4 * R * D}, {a, 4 * R * H}, {dy, 4 * R * D}, {w1.param, 4 * H * D}, {w2.param, 4 * D * H}},
             std::move(writes), [=](auto const& k) {
               auto X = k.template read<float>(x, R * D);
               auto A = k.template read<float>(a, R * H);
               auto DY = k.template read<float>(dy, R * D);
               auto W1 = k.template read<float>(w1.param, H * D);
               auto W2 = k.template read<float>(w2.param, D * H);
               auto GW1 = k.template write<float>(w1.grad, H * D);
               auto GB1 = k.template write<float>(b1.grad, H);
               auto GW2 = k.template write<float>(w2.grad, D * H);
               auto GB2 = k.template write<float>(b2.grad, D);
               std::vector<float> dh(R * H);
               for (std::size_t r = 0; r < R; ++r) {
                 for (std::size_t h = 0; h < H; ++h) {
                   float da = 0;
                   for (std::size_t o = 0; o < D; ++o) da += DY[r * D + o] * W2[o * H + h];
                   float const av = A[r * H + h];
                   dh[r * H + h] = da * (1.0f - av * av);
                 }
               }
               for (std::size_t r = 0; r < R; ++r) {
                 for (std::size_t o = 0; o < D; ++o) {
                   GB2[o] += DY[r * D + o];
                   for (std::size_t h = 0; h < H; ++h) GW2[o * H + h] += DY[r * D + o] * A[r * H + h];
                 }
                 for (std::size_t h = 0; h < H; ++h) {
                   GB1[h] += dh[r * H + h];
                   for (std::size_t i = 0; i < D; ++i) GW1[h * D + i] += dh[r * H + h] * X[r * D + i];
                 }
               }
               if (dx) {
                 auto DX = k.template write<float>(dx, R * D);
                 for (std::size_t r = 0; r < R; ++r) {
                   for (std::size_t i = 0; i < D; ++i) {
                     float acc = DY[r * D + i];
                     for (std::size_t h = 0; h < H; ++h) acc += dh[r * H + h] * W1[h * D + i];
                     DX[r * D + i] = acc;
                   }
                 }
               }
             });
      dy = dx;
    }
    for (auto t : temps) b.deallocate_device(t, 4 * R * D, s);
  }

private:
  static float target(std::uint64_t seed, std::uint64_t step, int m, std::size_t i) {
    return noise(seed, 2, step, static_cast<std::uint64_t>(m), i);
  }
  std::string label(std::string what, int micro) const {
    return what + " s" + std::to_string(stage_) + " m" + std::to_string(micro);
  }

  B& b_;
  model_config c_;
  int stage_;
  std::uint64_t step_ = 0;
  std::vector<tensor> tensors_;
  ps::device_ptr loss_{};
};

static_assert(ps::exec::stage<mlp_stage<mock::backend>, mock::backend>);

} // namespace pipeline_train
