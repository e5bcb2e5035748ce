// pipeswap — reading and validating safetensors files.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <pipeswap/detail/message.hpp>
#include <pipeswap/core/dtype.hpp>
#include <pipeswap/error.hpp>
#include <pipeswap/io/detail/posix.hpp>
#include <pipeswap/io/detail/safetensors_rules.hpp>
#include <pipeswap/io/error.hpp>
#include <pipeswap/io/safetensors_format.hpp>

namespace pipeswap::io {

/// One tensor of a validated file. `bytes` points into the buffer or mapping the file was parsed
/// from: read-only, valid as long as that storage; not necessarily aligned for the element type.
struct tensor_view {
  std::string name;
  dtype type = dtype::f32;
  std::vector<std::uint64_t> shape;
  /// data_offsets: [begin, end) relative to the start of the data section.
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  std::span<std::byte const> bytes;

  /// Number of elements (1 for a scalar, 0 for an empty tensor).
  [[nodiscard]] std::uint64_t numel() const noexcept {
    std::uint64_t n = 1;
    for (auto d : shape) n *= d; // cannot overflow: the reader checked it
    return n;
  }
};

/// Runtime knobs of the reader.
struct read_options {
  /// Reject headers longer than this (100 MB by default, like the safetensors package).
  std::uint64_t max_header_size = default_max_header_size;
};

class safetensors_file;

/// A validated safetensors file over bytes owned by someone else.
///
/// parse() checks every rule of the format (docs/checkpoint-format.md, "Validation") before it
/// returns; any violation throws format_error naming the tensor (or "header") and the rule. The
/// view refers to the bytes it was parsed from: keep them alive and unchanged while it is used.
/// Copyable; all members are const and safe to call from several threads.
class safetensors_view {
public:
  /// Validates `file` (a whole safetensors file) and returns its view.
  [[nodiscard]] static safetensors_view parse(std::span<std::byte const> file, read_options const& options = {}) {
    return safetensors_view(file, options, {});
  }

  /// The tensors in file order (by data offset, then name).
  [[nodiscard]] std::span<tensor_view const> tensors() const noexcept { return tensors_; }
  [[nodiscard]] std::size_t size() const noexcept { return tensors_.size(); }
  [[nodiscard]] bool empty() const noexcept { return tensors_.empty(); }

  /// The tensor called `name`, or nullptr.
  [[nodiscard]] tensor_view const* find(std::string_view name) const noexcept {
    auto it = std::lower_bound(by_name_.begin(), by_name_.end(), name,
                               [&](std::size_t i, std::string_view n) { return tensors_[i].name < n; });
    return it != by_name_.end() && tensors_[*it].name == name ? &tensors_[*it] : nullptr;
  }
  [[nodiscard]] bool contains(std::string_view name) const noexcept { return find(name) != nullptr; }
  /// The tensor called `name`; throws invalid_argument if there is none.
  [[nodiscard]] tensor_view const& at(std::string_view name) const {
    if (auto const* t = find(name)) return *t;
    throw invalid_argument("safetensors: " + source_prefix() + "no tensor " + detail::quote(name));
  }

  /// The "__metadata__" strings (empty when absent).
  [[nodiscard]] metadata_map const& metadata() const noexcept { return metadata_; }

  /// N: the header length stored in the first 8 bytes (padding included).
  [[nodiscard]] std::uint64_t header_size() const noexcept { return header_size_; }
  /// Bytes of the data section.
  [[nodiscard]] std::uint64_t data_size() const noexcept { return bytes_.size() - header_length_bytes - header_size_; }
  /// Size of the whole file: 8 + header_size() + data_size().
  [[nodiscard]] std::uint64_t total_size() const noexcept { return bytes_.size(); }
  /// The whole file.
  [[nodiscard]] std::span<std::byte const> bytes() const noexcept { return bytes_; }

private:
  friend class safetensors_file;

  safetensors_view() = default;
  safetensors_view(std::span<std::byte const> file, read_options const& options, std::string source);

  [[nodiscard]] std::string source_prefix() const { return source_.empty() ? "" : source_ + ": "; }

  std::span<std::byte const> bytes_;
  std::uint64_t header_size_ = 0;
  std::vector<tensor_view> tensors_;
  std::vector<std::size_t> by_name_;
  metadata_map metadata_;
  std::string source_;
};

namespace detail {

/// Throws format_error with the message layout of docs/checkpoint-format.md.
class format_reporter {
public:
  explicit format_reporter(std::string_view source) : source_(source) {}

  [[noreturn]] void header(std::string const& rule) const { fail("header: " + rule); }
  [[noreturn]] void tensor(std::string_view name, std::string const& rule) const {
    fail("tensor " + quote(name) + ": " + rule);
  }

private:
  [[noreturn]] void fail(std::string const& text) const {
    std::string what = "safetensors: ";
    if (!source_.empty()) {
      what += source_;
      what += ": ";
    }
    what += text;
    throw format_error(what);
  }
  std::string_view source_;
};

/// "the number -1" / "a string": the JSON value of `v` for messages (never dumps containers, which could
/// be large or deep).
inline std::string json_kind(nlohmann::json const& v) {
  if (v.is_number()) return "the number " + v.dump();
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_null()) return "null";
  if (v.is_array()) return "an array";
  return "an object";
}

/// "data_offsets [b, e]" for messages.
inline std::string offsets_text(tensor_view const& t) {
  return "data_offsets " + format_list(std::vector{t.begin, t.end});
}

/// Parses the header text: JSON with no duplicate key in any object and no container nested deeper
/// than a safetensors header needs (root object → tensor object → shape array).
inline nlohmann::json parse_header_json(std::string_view text, format_reporter const& report) {
  using json = nlohmann::json;
  using event = json::parse_event_t;
  std::vector<std::set<std::string, std::less<>>> keys; // one set per open object
  std::vector<std::string> path;                        // the key that opened each object
  std::string last_top_key;
  auto cb = [&](int depth, event ev, json& v) -> bool {
    switch (ev) {
    case event::object_start:
    case event::array_start:
      if (depth >= 3) {
        report.header("JSON nests containers deeper than a safetensors header has (3 levels)");
      }
      if (ev == event::object_start) {
        keys.emplace_back();
        path.push_back(depth == 0 ? std::string() : last_top_key);
      }
      break;
    case event::object_end:
      keys.pop_back();
      path.pop_back();
      break;
    case event::key: {
      auto const& k = v.get_ref<std::string const&>();
      if (!keys.back().insert(k).second) {
        if (depth == 1) report.header("duplicate key " + quote(k));
        if (path.back() == metadata_key) report.header("duplicate metadata key " + quote(k));
        report.tensor(path.back(), "duplicate field " + quote(k));
      }
      if (depth == 1) last_top_key = k;
      break;
    }
    default: break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), cb, /*allow_exceptions=*/true,
                       /*ignore_comments=*/false);
  } catch (json::exception const& e) {
    std::string_view msg = e.what();
    if (auto p = msg.find("] "); msg.starts_with("[json.exception.") && p != msg.npos) {
      msg.remove_prefix(p + 2);
    }
    report.header("not valid JSON: " + std::string(msg));
  }
}

/// A non-negative integer member of a header array, or a format error.
inline std::uint64_t header_uint(nlohmann::json const& v, std::string_view tensor, std::string const& what,
                                 format_reporter const& report) {
  if (!v.is_number_unsigned()) {
    report.tensor(tensor, what + " is " + json_kind(v) + ", not a non-negative integer");
  }
  return v.get<std::uint64_t>();
}

inline std::string supported_dtypes() {
  std::string s;
  for (dtype t : {dtype::f64, dtype::i64, dtype::f32, dtype::bf16, dtype::f16, dtype::u8}) {
    if (!s.empty()) s += ", ";
    s += name_of(t);
  }
  return s;
}

/// Validates one tensor entry of the header (everything that does not depend on other entries).
inline tensor_view parse_tensor_entry(std::string const& name, nlohmann::json const& v, std::uint64_t data_size,
                                      format_reporter const& report) {
  if (!v.is_object()) report.tensor(name, "entry is " + json_kind(v) + ", not an object");
  for (auto const& [k, _] : v.items()) {
    if (k != "dtype" && k != "shape" && k != "data_offsets") {
      report.tensor(name, "unknown field " + quote(k));
    }
  }
  for (char const* field : {"dtype", "shape", "data_offsets"}) {
    if (!v.contains(field)) report.tensor(name, std::string("missing field \"") + field + "\"");
  }
  tensor_view t;
  t.name = name;

  auto const& dt = v.at("dtype");
  if (!dt.is_string()) report.tensor(name, "\"dtype\" is " + json_kind(dt) + ", not a string");
  auto const& dts = dt.get_ref<std::string const&>();
  if (!parse_dtype(dts, t.type)) {
    if (is_safetensors_dtype_name(dts)) {
      report.tensor(name, "dtype " + quote(dts) + " is not supported (supported: " + supported_dtypes() + ")");
    }
    report.tensor(name, "unknown dtype " + quote(dts));
  }

  auto const& sh = v.at("shape");
  if (!sh.is_array()) report.tensor(name, "\"shape\" is " + json_kind(sh) + ", not an array");
  t.shape.reserve(sh.size());
  for (std::size_t i = 0; i < sh.size(); ++i) {
    t.shape.push_back(header_uint(sh[i], name, pipeswap::detail::message({"shape[", i, "]"}), report));
  }

  auto const& off = v.at("data_offsets");
  if (!off.is_array() || off.size() != 2) {
    if (off.is_array())
      report.tensor(name,
                    pipeswap::detail::message({"\"data_offsets\" is an array of ", off.size(), ", not [begin, end]"}));
    else
      report.tensor(name, pipeswap::detail::message({"\"data_offsets\" is ", json_kind(off), ", not [begin, end]"}));
  }
  t.begin = header_uint(off[0], name, "data_offsets[0]", report);
  t.end = header_uint(off[1], name, "data_offsets[1]", report);
  if (t.end < t.begin) report.tensor(name, offsets_text(t) + " end before they begin");

  std::uint64_t numel = 0;
  std::uint64_t nbytes = 0;
  if (!checked_numel(t.shape, numel)) {
    report.tensor(name, "shape " + format_list(t.shape) + " has more than 2^64 - 1 elements");
  }
  if (!checked_mul(numel, size_of(t.type), nbytes)) {
    report.tensor(name, describe(t.type, t.shape) + " needs more than 2^64 - 1 bytes");
  }
  if (t.end - t.begin != nbytes) {
    report.tensor(name, pipeswap::detail::message({offsets_text(t), " hold ", t.end - t.begin, " bytes but ",
                                                   describe(t.type, t.shape), " needs ", nbytes}));
  }
  if (t.end > data_size) {
    report.tensor(name, pipeswap::detail::message(
                            {offsets_text(t), " end past the data section, which holds ", data_size, " bytes"}));
  }
  return t;
}

inline metadata_map parse_metadata(nlohmann::json const& v, format_reporter const& report) {
  if (!v.is_object()) {
    report.header("\"__metadata__\" is " + json_kind(v) + ", not an object of strings");
  }
  metadata_map m;
  for (auto const& [k, s] : v.items()) {
    if (!s.is_string()) {
      if (v.contains("dtype") && v.contains("data_offsets")) {
        report.header("\"__metadata__\" is reserved for the metadata and cannot name a tensor");
      }
      report.header("metadata " + quote(k) + " is " + json_kind(s) + ", not a string");
    }
    m.emplace(k, s.get<std::string>());
  }
  return m;
}

} // namespace detail

inline safetensors_view::safetensors_view(std::span<std::byte const> file, read_options const& options,
                                          std::string source)
    : bytes_(file), source_(std::move(source)) {
  detail::format_reporter const report(source_);
  if (file.size() < header_length_bytes) {
    report.header(
        pipeswap::detail::message({"file is ", file.size(), " bytes, shorter than the 8-byte header length"}));
  }
  std::uint64_t n = 0;
  for (std::size_t i = header_length_bytes; i-- > 0;) {
    n = (n << 8) | static_cast<std::uint64_t>(file[i]);
  }
  if (n > options.max_header_size) {
    report.header(
        pipeswap::detail::message({"length ", n, " exceeds the limit of ", options.max_header_size, " bytes"}));
  }
  std::uint64_t const after_length = file.size() - header_length_bytes;
  if (n > after_length) {
    report.header(pipeswap::detail::message(
        {"length ", n, " runs past the end of the file (", after_length, " bytes follow the length field)"}));
  }
  header_size_ = n;
  std::string_view const text(reinterpret_cast<char const*>(file.data()) + header_length_bytes, n);
  // nlohmann's parser stops at a NUL byte as if the input ended there; JSON never contains a raw
  // NUL, so reject it here rather than ignore what follows it.
  if (auto p = text.find('\0'); p != text.npos) {
    report.header(pipeswap::detail::message({"NUL byte at header offset ", p}));
  }
  if (auto p = detail::find_invalid_utf8(text); p != detail::no_error) {
    report.header(pipeswap::detail::message({"not valid UTF-8 at header offset ", p}));
  }
  nlohmann::json const root = detail::parse_header_json(text, report);
  if (!root.is_object()) report.header("JSON is " + detail::json_kind(root) + ", not an object");

  std::uint64_t const data_bytes = after_length - n;
  tensors_.reserve(root.size());
  for (auto const& [name, v] : root.items()) {
    if (name == metadata_key) {
      metadata_ = detail::parse_metadata(v, report);
      continue;
    }
    if (name.empty()) report.header("a tensor has an empty name");
    tensors_.push_back(detail::parse_tensor_entry(name, v, data_bytes, report));
  }

  // The byte ranges must tile [0, data_bytes): sorted by offset, each begins where the last ended.
  std::sort(tensors_.begin(), tensors_.end(), [](tensor_view const& a, tensor_view const& b) {
    if (a.begin != b.begin) return a.begin < b.begin;
    if (a.end != b.end) return a.end < b.end;
    return a.name < b.name;
  });
  std::uint64_t pos = 0;
  tensor_view const* prev = nullptr;
  for (auto const& t : tensors_) {
    if (t.begin < pos) {
      report.tensor(t.name, detail::offsets_text(t) + " overlap tensor " + detail::quote(prev->name) + " at " +
                                detail::format_list(std::vector{prev->begin, prev->end}));
    }
    if (t.begin > pos) {
      report.tensor(
          t.name, pipeswap::detail::message({detail::offsets_text(t), " leave bytes [", pos, ", ", t.begin, ") unused ",
                                             (prev ? "after tensor " + detail::quote(prev->name)
                                                   : std::string("at the start of the data section")),
                                             "; the tensors must tile the data section"}));
    }
    pos = t.end;
    prev = &t;
  }
  if (pos != data_bytes) {
    report.header(pipeswap::detail::message({"the tensors cover ", pos, " bytes but the data section holds ",
                                             data_bytes, " (", data_bytes - pos, " trailing bytes)"}));
  }

  auto const* data = file.data() + header_length_bytes + n;
  for (auto& t : tensors_) t.bytes = {data + t.begin, static_cast<std::size_t>(t.end - t.begin)};
  by_name_.resize(tensors_.size());
  for (std::size_t i = 0; i < by_name_.size(); ++i) by_name_[i] = i;
  std::sort(by_name_.begin(), by_name_.end(),
            [&](std::size_t a, std::size_t b) { return tensors_[a].name < tensors_[b].name; });
}

/// How safetensors_file brings a file into memory.
enum class load_mode : std::uint8_t {
  /// Map it read-only (MAP_PRIVATE): no copy, pages read on first touch. If another process
  /// truncates the file in place while it is mapped, touching the lost pages raises SIGBUS;
  /// pipeswap's own writer never does that (it replaces files by rename).
  mmap,
  /// read(2) it into an owned buffer.
  read,
};

/// Runtime knobs of safetensors_file::open.
struct open_options {
  std::uint64_t max_header_size = default_max_header_size;
  load_mode mode = load_mode::mmap;
};

/// A validated safetensors file on disk, owning its mapping or buffer. Move-only; the views it
/// hands out stay valid (moves included) until it is destroyed.
class safetensors_file {
public:
  /// Opens, loads and validates `path`. Throws io_error when a system call fails, format_error
  /// (message prefixed with the path) when the contents break a rule, invalid_argument when `path`
  /// is not a regular file.
  [[nodiscard]] static safetensors_file open(std::filesystem::path const& path, open_options const& options = {}) {
    static constexpr std::string_view prefix = "safetensors: ";
    safetensors_file f;
    f.path_ = path;
    int const fd = detail::retry_eintr([&] { return ::open(path.c_str(), O_RDONLY | O_CLOEXEC); });
    if (fd < 0) detail::throw_io(prefix, "open", path, errno);
    detail::unique_fd file(fd);
    struct stat st {};
    if (::fstat(file.get(), &st) != 0) detail::throw_io(prefix, "fstat", path, errno);
    if (!S_ISREG(st.st_mode)) {
      throw invalid_argument("safetensors: \"" + path.native() + "\" is not a regular file");
    }
    auto const size = static_cast<std::size_t>(st.st_size);
    std::span<std::byte const> bytes;
    if (size == 0) {
      // Nothing to map (mmap rejects length 0); the parser reports the empty file.
    } else if (options.mode == load_mode::mmap) {
      void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, file.get(), 0);
      if (p == MAP_FAILED) detail::throw_io(prefix, "mmap", path, errno);
      f.map_ = detail::mapped_region(p, size);
      bytes = {f.map_.data(), size};
    } else {
      f.buffer_ = std::make_unique_for_overwrite<std::byte[]>(size);
      std::size_t got = 0;
      while (got < size) {
        ssize_t const r =
            ::read(file.get(), f.buffer_.get() + got, std::min<std::size_t>(size - got, std::size_t{1} << 30));
        if (r < 0) {
          if (errno == EINTR) continue;
          detail::throw_io(prefix, "read", path, errno);
        }
        if (r == 0) break; // the file shrank since fstat: validate what is there
        got += static_cast<std::size_t>(r);
      }
      bytes = {f.buffer_.get(), got};
    }
    f.view_ = safetensors_view(bytes, read_options{options.max_header_size}, path.native());
    return f;
  }

  safetensors_file(safetensors_file&&) noexcept = default;
  safetensors_file& operator=(safetensors_file&&) noexcept = default;
  safetensors_file(safetensors_file const&) = delete;
  safetensors_file& operator=(safetensors_file const&) = delete;
  ~safetensors_file() = default;

  /// The validated contents; valid while this object lives.
  [[nodiscard]] safetensors_view const& view() const& noexcept { return view_; }
  safetensors_view const& view() const&& = delete;
  [[nodiscard]] std::filesystem::path const& path() const noexcept { return path_; }

  [[nodiscard]] std::span<tensor_view const> tensors() const noexcept { return view_.tensors(); }
  [[nodiscard]] tensor_view const* find(std::string_view name) const noexcept { return view_.find(name); }
  [[nodiscard]] tensor_view const& at(std::string_view name) const { return view_.at(name); }
  [[nodiscard]] metadata_map const& metadata() const noexcept { return view_.metadata(); }
  [[nodiscard]] std::uint64_t header_size() const noexcept { return view_.header_size(); }
  [[nodiscard]] std::uint64_t data_size() const noexcept { return view_.data_size(); }
  [[nodiscard]] std::uint64_t total_size() const noexcept { return view_.total_size(); }

private:
  safetensors_file() = default;

  std::filesystem::path path_;
  detail::mapped_region map_;
  std::unique_ptr<std::byte[]> buffer_;
  safetensors_view view_;
};

} // namespace pipeswap::io
