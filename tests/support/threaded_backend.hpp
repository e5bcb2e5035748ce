// A backend with real threads, for running the runtime tests where work is truly asynchronous:
//
//   * one worker thread per stream (the compute stream's included), each running its stream's work
//     in order, after a random delay (jitter: copies up to copy_jitter, kernels up to kernel_jitter);
//   * events are completion flags: record_event enqueues the setting of a flag, wait_event enqueues a
//     wait for it on the stream, synchronize() blocks the host thread until it is set;
//   * "device" memory is host memory: fresh allocations are poisoned (0xA5), released ones poisoned
//     (0x5A) when their stream reaches the release and kept in quarantine until the backend dies,
//     so a read of freed storage sees poison instead of old data (and never touches freed memory);
//   * work items run one at a time (one global lock around each), so streams never race in the C++
//     sense while their order across streams stays random: a missing wait shows as wrong bytes, and
//     a host access that skipped synchronize() shows to ThreadSanitizer as a race with a worker;
//   * drop_waits (a switch, for the self-check): wait_event does nothing, so cross-stream order is
//     left to the jitter; the runtime tests must then fail.
//
// It has no synchronize_device() (the optional capability device_synchronizing), so the code under
// test runs without it. launch(stream, fn) enqueues a host function as a kernel.
// adam_kernels<threaded_backend> runs the host Adam math as kernels on the given stream.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/optim/adam_tensor.hpp>
#include <pipeswap/optim/host_adam_kernels.hpp>

namespace pipeswap::test {

/// The threaded backend's knobs: the most a work item waits before it runs, the jitter's seed, and
/// the self-check switch.
struct threaded_backend_options {
  std::chrono::microseconds copy_jitter{200};
  std::chrono::microseconds kernel_jitter{20};
  std::uint64_t seed = 1;
  bool drop_waits = false;
};

class threaded_backend {
public:
  using backend_concept = pipeswap::backend_tag;
  using error_type = std::runtime_error;
  struct stream_type {
    int id = 0;
    friend bool operator==(stream_type, stream_type) = default;
  };
  struct flag {
    bool set = false;
  };
  struct event_type {
    std::shared_ptr<flag> f; ///< null: a point before any work (complete)
  };
  using device_pointer = pipeswap::device_ptr;

  using options = threaded_backend_options;

  threaded_backend() : threaded_backend(options{}) {}
  explicit threaded_backend(options o) : o_(o) { add_stream(); }
  threaded_backend(threaded_backend const&) = delete;
  threaded_backend& operator=(threaded_backend const&) = delete;
  ~threaded_backend() {
    for (auto& s : streams_) {
      {
        std::lock_guard lk(s->m);
        s->stop = true;
      }
      s->cv.notify_all();
    }
    for (auto& s : streams_) s->worker.join();
    for (auto* p : quarantine_) std::free(p);
    for (auto* p : live_) std::free(p);
  }

  /// The self-check switch: stream waits are dropped from now on.
  void set_drop_waits(bool d) noexcept { o_.drop_waits = d; }

  stream_type current_stream() { return {0}; }
  stream_type new_stream() { return {add_stream()}; }
  stream_type new_stream(std::string const&) { return new_stream(); }

  event_type record_event(stream_type s) {
    auto f = std::make_shared<flag>();
    enqueue(s, task{task::signal, {}, f});
    return {f};
  }
  void wait_event(stream_type s, event_type const& e) {
    if (!e.f || o_.drop_waits) return;
    enqueue(s, task{task::wait, {}, e.f});
  }
  void synchronize(event_type const& e) {
    if (!e.f) return;
    std::unique_lock lk(flags_m_);
    flags_cv_.wait(lk, [&] { return e.f->set; });
  }

  device_pointer allocate_device(std::size_t n, stream_type) {
    if (n == 0) return {};
    return device_pointer(fresh(n));
  }
  void deallocate_device(device_pointer d, std::size_t n, stream_type s) {
    if (!d) return;
    auto* p = d.get<std::byte>();
    enqueue(s, task{task::work, [this, p, n] { retire(p, n); }, {}, false});
  }
  std::byte* allocate_host(std::size_t n) { return n == 0 ? nullptr : fresh(n); }
  void deallocate_host(std::byte* h, std::size_t n) {
    if (h == nullptr) return;
    std::lock_guard lk(run_m_); // host-immediate: no enqueued copy may still use it
    retire(h, n);
  }
  void copy_h2d(device_pointer d, std::byte const* h, std::size_t n, stream_type s) {
    if (n == 0) return;
    auto* dst = d.get<std::byte>();
    enqueue(s, task{task::work, [dst, h, n] { std::memcpy(dst, h, n); }, {}, true});
  }
  void copy_d2h(std::byte* h, device_pointer d, std::size_t n, stream_type s) {
    if (n == 0) return;
    auto const* src = d.get<std::byte const>();
    enqueue(s, task{task::work, [src, h, n] { std::memcpy(h, src, n); }, {}, true});
  }

  /// A host function run as a kernel on stream s.
  void launch(stream_type s, std::function<void()> fn) { enqueue(s, task{task::work, std::move(fn), {}, false}); }

  /// Work items run so far (all streams).
  [[nodiscard]] std::uint64_t items_run() const noexcept { return items_.load(); }

private:
  struct task {
    enum kind_t { work, signal, wait } kind = work;
    std::function<void()> fn;
    std::shared_ptr<flag> f;
    bool copy = false;
  };
  struct stream_state {
    std::mutex m;
    std::condition_variable cv;
    std::deque<task> q;
    bool stop = false;
    std::thread worker;
  };

  int add_stream() {
    auto s = std::make_unique<stream_state>();
    auto* raw = s.get();
    int const id = static_cast<int>(streams_.size());
    std::uint64_t const seed = o_.seed * 1000003u + static_cast<std::uint64_t>(id);
    raw->worker = std::thread([this, raw, seed] { run(*raw, seed); });
    streams_.push_back(std::move(s));
    return id;
  }

  void enqueue(stream_type s, task t) {
    if (s.id < 0 || static_cast<std::size_t>(s.id) >= streams_.size()) {
      throw std::runtime_error("threaded_backend: stream " + std::to_string(s.id) + " does not exist");
    }
    auto& st = *streams_[static_cast<std::size_t>(s.id)];
    {
      std::lock_guard lk(st.m);
      st.q.push_back(std::move(t));
    }
    st.cv.notify_one();
  }

  void run(stream_state& st, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    for (;;) {
      task t;
      {
        std::unique_lock lk(st.m);
        st.cv.wait(lk, [&] { return st.stop || !st.q.empty(); });
        if (st.q.empty()) return; // stopped and drained
        t = std::move(st.q.front());
        st.q.pop_front();
      }
      switch (t.kind) {
      case task::wait: {
        std::unique_lock lk(flags_m_);
        flags_cv_.wait(lk, [&] { return t.f->set; });
        break;
      }
      case task::signal: {
        {
          std::lock_guard lk(flags_m_);
          t.f->set = true;
        }
        flags_cv_.notify_all();
        break;
      }
      case task::work: {
        auto const most = (t.copy ? o_.copy_jitter : o_.kernel_jitter).count();
        if (most > 0)
          std::this_thread::sleep_for(std::chrono::microseconds(rng() % static_cast<std::uint64_t>(most + 1)));
        std::lock_guard lk(run_m_);
        t.fn();
        ++items_;
        break;
      }
      }
    }
  }

  std::byte* fresh(std::size_t n) {
    auto* p = static_cast<std::byte*>(std::malloc(n));
    if (p == nullptr) throw std::runtime_error("threaded_backend: out of memory");
    std::lock_guard lk(run_m_); // orders the poison before every worker's later use
    std::memset(p, 0xA5, n);
    live_.push_back(p);
    return p;
  }
  /// Under run_m_: poisons and quarantines (never freed while the backend lives).
  void retire(std::byte* p, std::size_t n) {
    std::memset(p, 0x5A, n);
    for (auto& q : live_) {
      if (q == p) {
        q = live_.back();
        live_.pop_back();
        quarantine_.push_back(p);
        return;
      }
    }
    quarantine_.push_back(p); // unknown pointer: keep it out of reuse anyway
  }

  options o_;
  std::vector<std::unique_ptr<stream_state>> streams_;
  std::mutex flags_m_;
  std::condition_variable flags_cv_;
  std::mutex run_m_; // one work item at a time
  std::vector<std::byte*> live_, quarantine_;
  std::atomic<std::uint64_t> items_{0};
};

static_assert(pipeswap::backend<threaded_backend>);
static_assert(!pipeswap::device_synchronizing<threaded_backend>);

/// Bytes into and out of the threaded backend's device memory, as work on its compute stream with
/// the host synchronized behind it (the upload() and download() of support/world.hpp's model).
inline void upload(threaded_backend& b, device_ptr d, void const* src, std::size_t n) {
  if (n == 0) return; // nothing to copy, and memcpy may not be given the null a zero-size buffer has
  std::vector<std::byte> v(static_cast<std::byte const*>(src), static_cast<std::byte const*>(src) + n);
  auto s = b.current_stream();
  b.launch(s, [d, v = std::move(v)] { std::memcpy(d.get<std::byte>(), v.data(), v.size()); });
  b.synchronize(b.record_event(s));
}
inline std::vector<std::byte> download(threaded_backend& b, device_ptr d, std::size_t n) {
  if (n == 0) return {};
  auto out = std::make_shared<std::vector<std::byte>>(n);
  auto s = b.current_stream();
  b.launch(s, [d, out, n] { std::memcpy(out->data(), d.get<std::byte const>(), n); });
  b.synchronize(b.record_event(s));
  return *out;
}

} // namespace pipeswap::test

/// The Adam math of host_adam_kernels, run as kernels on the stream it is given.
template <>
struct pipeswap::adam_kernels<pipeswap::test::threaded_backend> {
  using B = pipeswap::test::threaded_backend;
  void update(B& b, B::stream_type s, std::span<adam_tensor<B> const> ts,
              std::span<adam_step_scalars const> scalars) const {
    validate_adam_batch(ts, scalars); // before anything is enqueued
    std::vector<adam_tensor<B>> batch(ts.begin(), ts.end());
    std::vector<adam_step_scalars> sc(scalars.begin(), scalars.end());
    b.launch(s,
             [batch = std::move(batch), sc = std::move(sc), &b, s] { host_adam_kernels<B>{}.update(b, s, batch, sc); });
  }
  void init_master(B& b, B::stream_type s, device_ptr param, device_ptr master, std::size_t numel, dtype type) const {
    b.launch(s, [&b, s, param, master, numel, type] {
      host_adam_kernels<B>{}.init_master(b, s, param, master, numel, type);
    });
  }
};
