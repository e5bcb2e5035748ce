// pipeswap — optimizer checkpoints: save and resume the state of an optimizer_swap runtime.
//
// A checkpoint is one safetensors file (docs/checkpoints.md) that safetensors.torch.load_file opens:
//
//   tensor "state.{param}.{key}"   every state slot of every parameter (key: exp_avg, exp_avg_sq,
//                                  max_exp_avg_sq, master_param), dtype of the slot, shape [numel]
//   metadata "pipeswap.format" = "optimizer_state", "pipeswap.format_version" = "1", and the
//                                  optimizer's metadata() (hyper-parameters, step counts) verbatim
//
//   save_checkpoint(rt, path)        quiesces the runtime (synchronize_host_mirrors), copies the
//                                    state that never leaves the device into a pinned block, and
//                                    writes the file atomically straight from the pinned mirrors
//   save_checkpoint_async(rt, path)  the same snapshot, copied into one heap buffer on the calling
//                                    thread; a background thread writes it; steps may run meanwhile
//   load_checkpoint(rt, path)        validates the whole file against the optimizer first, then
//                                    replaces the state; a failed load changes no value
//
// Checkpoint calls need a runtime between steps (no interrupted step; not from inside step()) and a
// backend that holds bytes. All backend calls are made by the calling thread; the background thread
// of an asynchronous save touches only its own buffer and the file system.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <future>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <pipeswap/detail/message.hpp>
#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/core/event_handle.hpp>
#include <pipeswap/core/pinned_pool.hpp>
#include <pipeswap/error.hpp>
#include <pipeswap/io/atomic_file.hpp>
#include <pipeswap/io/safetensors_format.hpp>
#include <pipeswap/io/safetensors_reader.hpp>
#include <pipeswap/io/safetensors_writer.hpp>
#include <pipeswap/optim/concepts.hpp>
#include <pipeswap/swap/detail/checkpoint_schema.hpp>
#include <pipeswap/swap/optimizer_swap.hpp>
#include <pipeswap/swap/partition.hpp>
#include <pipeswap/optim/state.hpp>
#include <pipeswap/core/transfer.hpp>

namespace pipeswap {

/// The tensor name of a state slot in a checkpoint: "state.{param}.{key}", e.g. "state.3.exp_avg".
inline std::string checkpoint_tensor_name(std::size_t param, state_key key) {
  return detail::message({"state.", param, ".", name_of(key)});
}

/// Runtime knobs of save_checkpoint and save_checkpoint_async.
struct checkpoint_save_options {
  /// Durability (fsync of the file and its directory), write chunk size and the test hook of the
  /// atomic replacement (io::atomic_file).
  io::atomic_file_options file;
  /// Refuse to write a header larger than this.
  std::uint64_t max_header_size = io::default_max_header_size;
};

/// Runtime knobs of load_checkpoint.
struct checkpoint_load_options {
  /// How the file is brought into memory (mapped by default; its bytes are copied into the state).
  io::load_mode mode = io::load_mode::mmap;
  /// Reject headers longer than this.
  std::uint64_t max_header_size = io::default_max_header_size;
};

namespace detail {
struct checkpoint_save_key {
  explicit checkpoint_save_key() = default;
};
} // namespace detail

/// An asynchronous save in progress (save_checkpoint_async). Move-only.
///
/// The snapshot it writes was taken before save_checkpoint_async returned, so later steps do not
/// change the file. get() waits and rethrows the write's exception (io_error, with the previous file
/// at the path intact); wait() only waits. The destructor waits for the write to finish (it never
/// throws; an error nobody asked for with get() is dropped), so a save is never cut off halfway.
class checkpoint_save {
public:
  checkpoint_save() = default;
  checkpoint_save(detail::checkpoint_save_key, std::future<void> done, std::filesystem::path path, std::size_t bytes)
      : done_(std::move(done)), path_(std::move(path)), bytes_(bytes) {}
  checkpoint_save(checkpoint_save&&) noexcept = default;
  checkpoint_save& operator=(checkpoint_save&&) noexcept = default;
  checkpoint_save(checkpoint_save const&) = delete;
  checkpoint_save& operator=(checkpoint_save const&) = delete;
  ~checkpoint_save() = default; // std::async's state: the destructor joins the writer

  /// False for a default-constructed or moved-from handle, and after get().
  [[nodiscard]] bool valid() const noexcept { return done_.valid(); }
  /// True once the file is written (or the write failed); never blocks.
  [[nodiscard]] bool ready() const {
    require("ready");
    return done_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  }
  /// Blocks until the file is written or the write failed.
  void wait() const {
    require("wait");
    done_.wait();
  }
  /// Blocks until the file is written; rethrows the write's exception. Once per save.
  void get() {
    require("get");
    done_.get();
  }
  /// The file being written.
  [[nodiscard]] std::filesystem::path const& path() const noexcept { return path_; }
  /// Size of the snapshot (the whole file), held in heap memory until the write ends.
  [[nodiscard]] std::size_t snapshot_bytes() const noexcept { return bytes_; }

private:
  void require(char const* call) const {
    if (!done_.valid()) {
      throw state_error(std::string("checkpoint_save::") + call +
                        ": the handle holds no save (default-constructed, moved from, or get() "
                        "was called)");
    }
  }

  std::future<void> done_;
  std::filesystem::path path_;
  std::size_t bytes_ = 0;
};

namespace detail {

template <swap_optimizer O, partition_policy P>
void require_checkpointable(optimizer_swap<O, P>& rt, char const* op) {
  if (!holds_bytes(rt.engine().backend())) {
    throw state_error(std::string(op) + ": the backend keeps no bytes (a timing-only simulation), so there is no "
                                        "optimizer state to save or load");
  }
  if (rt.has_interrupted_step()) {
    throw state_error(std::string(op) + ": the runtime has an unfinished step (step() threw, or this call comes from "
                                        "inside step()); finish it with step() or give it up with "
                                        "discard_interrupted_step() first");
  }
}

/// The tensors a checkpoint of `slots` holds, in slot order; names are checked to be distinct.
inline std::vector<checkpoint_entry> checkpoint_entries(std::span<slot_desc const> slots, char const* op) {
  std::vector<checkpoint_entry> out;
  out.reserve(slots.size());
  for (auto const& s : slots) out.push_back({checkpoint_tensor_name(s.param, s.key), s.type, s.numel});
  check_unique_names(out, op);
  return out;
}

inline constexpr std::size_t checkpoint_align(std::size_t n) noexcept { return (n + 63) / 64 * 64; }

/// A pinned block of a pool, given back on destruction with the event of its last copy.
template <backend B>
class pool_block {
public:
  explicit pool_block(pinned_pool<B>& pool) : pool_(pool) {}
  pool_block(pool_block const&) = delete;
  pool_block& operator=(pool_block const&) = delete;
  ~pool_block() {
    try {
      pool_.deallocate(blk, std::move(last_use));
    } catch (...) { // a destructor never throws; the block stays reserved in the pool
    }
  }
  pinned_block blk;
  event_handle<B> last_use; ///< null once the host synchronized with every copy using the block

private:
  pinned_pool<B>& pool_;
};

/// A consistent host image of an optimizer's state, for the duration of a save.
///
/// Construction quiesces the runtime (every swappable piece host-resident, its mirror complete and
/// host-synchronized, device storage released), copies the slots that never leave the device into
/// one pinned block from the engine's pool (transfer_engine::copy_to_host: D2H on the d2h stream
/// behind the compute work, host-synchronized), and declares the host reads to the backend. sources() then points straight
/// at the mirrors and the block (no copy). The destructor gives the block back to the pool.
template <swap_optimizer O, partition_policy P>
class checkpoint_snapshot {
public:
  using B = typename O::backend_type;

  explicit checkpoint_snapshot(optimizer_swap<O, P>& rt)
      : engine_(rt.engine()), b_(engine_.backend()), block_(engine_.pool()), rt_(rt) {
    constexpr char const* op = "checkpoint save";
    require_checkpointable(rt, op);
    auto& opt = rt.optimizer();
    auto const slots = opt.slots();
    auto const entries = checkpoint_entries(slots, op);
    for (auto const& [k, v] : opt.metadata()) {
      if (std::string_view(k).starts_with(checkpoint_reserved_prefix)) {
        throw invalid_argument(std::string(op) + ": the optimizer's metadata key " + io::detail::quote(k) +
                               " uses the prefix reserved for the checkpoint format");
      }
      meta_.emplace(k, v);
    }
    meta_.emplace(checkpoint_format_key, checkpoint_format_name);
    meta_.emplace(checkpoint_version_key, checkpoint_version);

    rt.synchronize_host_mirrors();

    std::vector<std::size_t> offset(slots.size(), 0);
    std::size_t resident = 0;
    for (std::size_t i = 0; i < slots.size(); ++i) {
      auto const& s = slots[i];
      if (rt.is_swappable(i) || s.bytes() == 0) continue;
      offset[i] = resident;
      resident += checkpoint_align(s.bytes());
    }
    if (resident > 0) copy_resident(slots, offset, resident);

    sources_.reserve(slots.size());
    for (std::size_t i = 0; i < slots.size(); ++i) {
      auto const& s = slots[i];
      std::span<std::byte const> bytes;
      if (s.bytes() > 0) {
        if (!rt.is_swappable(i)) {
          bytes = {block_.blk.ptr + offset[i], s.bytes()};
        } else {
          auto const m = rt.host_mirror(i);
          if (m.data() == nullptr || m.size() != s.bytes()) {
            throw state_error(std::string(op) + ": swap slot '" + s.name() +
                              "' is swappable but has no complete host mirror");
          }
          bytes = m;
        }
        note_host_read(b_, bytes.data(), bytes.size());
      }
      sources_.push_back({entries[i].name, s.type, {s.numel}, bytes});
    }
  }

  checkpoint_snapshot(checkpoint_snapshot const&) = delete;
  checkpoint_snapshot& operator=(checkpoint_snapshot const&) = delete;

  [[nodiscard]] std::span<io::tensor_source const> sources() const noexcept { return sources_; }
  [[nodiscard]] io::metadata_map const& metadata() const noexcept { return meta_; }

private:
  void copy_resident(std::span<slot_desc const> slots, std::span<std::size_t const> offset, std::size_t bytes) {
    block_.blk = engine_.pool().allocate(bytes, engine_.d2h());
    std::vector<host_copy<B>> copies;
    for (std::size_t i = 0; i < slots.size(); ++i) {
      if (rt_.is_swappable(i) || slots[i].bytes() == 0) continue;
      copies.push_back({block_.blk.ptr + offset[i], rt_.unswappable_device(i), slots[i].bytes()});
    }
    event_handle<B> in_flight;
    try {
      engine_.copy_to_host(copies, in_flight, "checkpoint save");
    } catch (...) {
      // Copies may be in flight: the block is reused only behind them; without an event to order a
      // reuse, the block stays out of the pool.
      if (in_flight) {
        block_.last_use = in_flight;
      } else {
        block_.blk = {};
      }
      throw;
    }
  }

  transfer_engine<B>& engine_;
  B& b_;
  pool_block<B> block_;
  optimizer_swap<O, P>& rt_;
  std::vector<io::tensor_source> sources_;
  io::metadata_map meta_;
};

/// The non-swappable slots' new device storage, staged from the file before anything is replaced.
template <backend B>
struct staged_upload {
  std::size_t index = 0; ///< of the slot (and its checkpoint entry)
  std::size_t bytes = 0;
  std::size_t offset = 0; ///< in the pinned staging block
  device_pointer_t<B> fresh{};
};

/// Replaces the optimizer's state with the contents of `file` (validated here first); see
/// load_checkpoint. `path` is for messages (empty for bytes in memory).
template <swap_optimizer O, partition_policy P>
void load_checkpoint_view(optimizer_swap<O, P>& rt, io::safetensors_view const& file, std::string_view path) {
  using B = typename O::backend_type;
  constexpr char const* op = "checkpoint load";
  require_checkpointable(rt, op);
  auto& opt = rt.optimizer();
  auto& x = rt.engine();
  auto& b = x.backend();
  auto const slots = opt.slots();
  auto const entries = checkpoint_entries(slots, op);
  auto const meta = check_checkpoint(file, entries, path);

  // Everything is validated. From here each step either succeeds or is undone; no value changes
  // before the commit below.
  rt.synchronize_host_mirrors();

  std::vector<staged_upload<B>> uploads;
  std::size_t resident = 0;
  for (std::size_t i = 0; i < slots.size(); ++i) {
    if (rt.is_swappable(i) || slots[i].bytes() == 0) continue;
    uploads.push_back({i, slots[i].bytes(), resident, {}});
    resident += checkpoint_align(slots[i].bytes());
  }
  pool_block<B> staging(x.pool());
  auto const old_meta = opt.metadata();
  bool meta_touched = false;
  try {
    if (resident > 0) {
      staging.blk = x.pool().allocate_for_host(resident);
      note_host_write(b, staging.blk.ptr, staging.blk.bytes);
      for (auto const& u : uploads) {
        auto const& t = file.at(entries[u.index].name);
        std::memcpy(staging.blk.ptr + u.offset, t.bytes.data(), t.bytes.size());
      }
      for (auto& u : uploads) u.fresh = x.allocate_device(u.bytes);
      std::vector<host_copy<B>> copies;
      for (auto const& u : uploads) copies.push_back({staging.blk.ptr + u.offset, u.fresh, u.bytes});
      x.copy_to_device(copies, staging.last_use, "checkpoint load");
    }
    for (std::size_t i = 0; i < slots.size(); ++i) {
      if (!rt.is_swappable(i) || slots[i].bytes() == 0) continue;
      auto const m = rt.host_mirror(i);
      note_host_write(b, m.data(), m.size());
    }
    meta_touched = true;
    try {
      opt.load_metadata(meta);
    } catch (invalid_argument const& e) {
      throw invalid_argument(checkpoint_subject(path) + ": " + e.what());
    }
  } catch (...) {
    if (meta_touched) {
      try { // the concept says a failing load_metadata changes nothing; do not rely on it
        opt.load_metadata(old_meta);
      } catch (...) {}
    }
    bool const in_flight = std::any_of(uploads.begin(), uploads.end(), [](auto const& u) { return bool(u.fresh); });
    if (in_flight && !staging.last_use) staging.blk = {}; // cannot order a reuse: keep it out of the pool
    for (auto& u : uploads) {
      try {
        x.deallocate_device(u.fresh, u.bytes); // behind the copies that fill it
      } catch (...) {                          // left with the backend
      }
    }
    throw;
  }

  // Commit: nothing below throws.
  for (std::size_t i = 0; i < slots.size(); ++i) {
    if (!rt.is_swappable(i) || slots[i].bytes() == 0) continue;
    auto const& t = file.at(entries[i].name);
    std::memcpy(rt.host_mirror(i).data(), t.bytes.data(), t.bytes.size());
  }
  for (auto& u : uploads) {
    try { // the old storage is released stream-ordered behind the updates that used it
      rt.replace_unswappable(runtime_access{}, u.index, u.fresh);
    } catch (...) { // a conforming backend does not fail here; a commit is never undone
    }
  }
}

} // namespace detail

/// Writes a checkpoint of `rt`'s optimizer to `path`, atomically.
///
/// Quiesces the runtime (every swappable piece ends host-resident with its device storage released,
/// as synchronize_host_mirrors), copies the non-swappable slots device → host into a pinned block of
/// the engine's pool, and writes the file through io::atomic_file straight from the pinned mirrors:
/// temporary file, fsync, rename, fsync of the directory. On any failure the previous file at
/// `path` is intact and the optimizer's state unchanged.
///
/// Throws state_error when `rt` has an unfinished step or its backend holds no bytes;
/// invalid_argument when the optimizer's metadata uses a reserved key or cannot be written;
/// io::io_error when a system call fails; the backend's error when a copy fails.
template <swap_optimizer O, partition_policy P>
void save_checkpoint(optimizer_swap<O, P>& rt, std::filesystem::path const& path,
                     checkpoint_save_options const& options = {}) {
  detail::checkpoint_snapshot<O, P> snap(rt);
  io::safetensors_writer(snap.sources(), snap.metadata(), {options.max_header_size}).save(path, options.file);
}

/// Starts writing a checkpoint of `rt`'s optimizer to `path` and returns before the file is written.
///
/// On the calling thread: the same quiesce and device copies as save_checkpoint, then the whole
/// file is serialized into one heap buffer (snapshot_bytes(): header plus every state byte). Steps
/// may run as soon as this returns; they do not change the file. A background thread writes the
/// buffer through io::atomic_file and frees it; it never calls the backend. A relative `path` is
/// made absolute here, so a later change of the working directory does not move the file. Errors
/// before the return are thrown here (nothing is written); errors of the write come from
/// checkpoint_save::get().
template <swap_optimizer O, partition_policy P>
[[nodiscard]] checkpoint_save save_checkpoint_async(optimizer_swap<O, P>& rt, std::filesystem::path path,
                                                    checkpoint_save_options options = {}) {
  path = std::filesystem::absolute(path);
  std::unique_ptr<std::byte[]> buffer;
  std::size_t size = 0;
  {
    detail::checkpoint_snapshot<O, P> snap(rt);
    io::safetensors_writer const w(snap.sources(), snap.metadata(), {options.max_header_size});
    size = static_cast<std::size_t>(w.total_size());
    buffer = std::make_unique_for_overwrite<std::byte[]>(size);
    w.write_to({buffer.get(), size});
  }
  auto done = std::async(std::launch::async,
                         [buffer = std::move(buffer), size, path, file = std::move(options.file)]() mutable {
                           auto const owned = std::move(buffer); // freed when the write ends
                           io::atomic_file f(path, std::move(file));
                           f.write({owned.get(), size});
                           f.commit();
                         });
  return checkpoint_save(detail::checkpoint_save_key{}, std::move(done), std::move(path), size);
}

/// The checkpoint file of `rt`'s optimizer, in memory (same snapshot and bytes as save_checkpoint).
template <swap_optimizer O, partition_policy P>
[[nodiscard]] std::vector<std::byte> checkpoint_to_bytes(optimizer_swap<O, P>& rt,
                                                         checkpoint_save_options const& options = {}) {
  detail::checkpoint_snapshot<O, P> snap(rt);
  return io::safetensors_writer(snap.sources(), snap.metadata(), {options.max_header_size}).to_bytes();
}

/// Replaces `rt`'s optimizer state with the checkpoint at `path`.
///
/// Validates first, touching nothing: the file's format rules (io::safetensors_file), the format
/// and version metadata, and that the tensors are exactly the optimizer's slots with their dtypes
/// and shapes [numel]. Then quiesces the runtime, stages the non-swappable slots into new device
/// storage (pinned staging block, H2D on the engine's h2d stream), and hands the optimizer's
/// metadata to load_metadata() (which checks the hyper-parameters). Only when all of that succeeded
/// are the mirrors overwritten, the staged storage swapped in and the old storage released. On
/// success every swappable slot is host-resident with its mirror filled and no device storage, and
/// the next step() continues from the loaded state. A failed load leaves every value of the
/// optimizer (state bytes and metadata) as it was, and the runtime usable.
///
/// Throws state_error when `rt` has an unfinished step (give it up with discard_interrupted_step()
/// first) or its backend holds no bytes; io::format_error / invalid_argument naming the file, the
/// tensor or metadata key and the rule for a bad file; io::io_error when the file cannot be read.
template <swap_optimizer O, partition_policy P>
void load_checkpoint(optimizer_swap<O, P>& rt, std::filesystem::path const& path,
                     checkpoint_load_options const& options = {}) {
  detail::require_checkpointable(rt, "checkpoint load");
  auto const f = io::safetensors_file::open(path, {options.max_header_size, options.mode});
  detail::load_checkpoint_view(rt, f.view(), path.native());
}

/// load_checkpoint from a whole checkpoint file held in memory.
template <swap_optimizer O, partition_policy P>
void load_checkpoint_from_bytes(optimizer_swap<O, P>& rt, std::span<std::byte const> file,
                                checkpoint_load_options const& options = {}) {
  detail::require_checkpointable(rt, "checkpoint load");
  auto const v = io::safetensors_view::parse(file, {options.max_header_size});
  detail::load_checkpoint_view(rt, v, {});
}

} // namespace pipeswap
