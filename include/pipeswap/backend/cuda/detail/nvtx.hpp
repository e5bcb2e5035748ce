// pipeswap — internal: the label of the CUDA backend's next work, as an NVTX range when available.
//
// NVTX3 is header-only and ships with the toolkit (<nvtx3/nvToolsExt.h>); it costs a branch when no
// profiler is attached. Define PIPESWAP_CUDA_NO_NVTX to compile it out.
#pragma once

#include <string>
#include <string_view>

#if !defined(PIPESWAP_CUDA_NO_NVTX) && defined(__has_include)
#  if __has_include(<nvtx3/nvToolsExt.h>)
#    include <nvtx3/nvToolsExt.h>
#    define PIPESWAP_CUDA_HAS_NVTX 1
#  endif
#endif
#ifndef PIPESWAP_CUDA_HAS_NVTX
#  define PIPESWAP_CUDA_HAS_NVTX 0
#endif

namespace pipeswap::cuda::detail {

/// The current label and its NVTX range in the "pipeswap" domain. The range is a process range
/// (start/end), not a push/pop pair, so it may end on another thread than it started on.
class label_range {
public:
  label_range() = default;
  label_range(label_range const&) = delete;
  label_range& operator=(label_range const&) = delete;
  ~label_range() { end(); }

  /// Ends the current range and, unless `label` is empty, opens one named `label`.
  void set(std::string_view label) {
    end();
    text_.assign(label);
    if (text_.empty()) return;
#if PIPESWAP_CUDA_HAS_NVTX
    nvtxEventAttributes_t a{};
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = text_.c_str();
    id_ = nvtxDomainRangeStartEx(domain(), &a);
    open_ = true;
#endif
  }

  [[nodiscard]] std::string const& text() const noexcept { return text_; }

private:
  void end() noexcept {
#if PIPESWAP_CUDA_HAS_NVTX
    if (open_) nvtxDomainRangeEnd(domain(), id_);
    open_ = false;
#endif
  }

#if PIPESWAP_CUDA_HAS_NVTX
  static nvtxDomainHandle_t domain() noexcept {
    static nvtxDomainHandle_t const d = nvtxDomainCreateA("pipeswap");
    return d;
  }
  nvtxRangeId_t id_ = 0;
  bool open_ = false;
#endif
  std::string text_;
};

} // namespace pipeswap::cuda::detail
