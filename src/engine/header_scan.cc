// The plain-form scanner of safetensors headers (header_scan.h).
#include "engine/header_scan.h"

#include <cstdint>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "util/json.h"

namespace cairn::format {

namespace {

// One pass over the text; every method returns false as soon as the text
// leaves the plain form, and the scan is abandoned.
class PlainScanner {
 public:
  explicit PlainScanner(std::string_view text) : p_(text.data()), end_(text.data() + text.size()) {}

  bool header(HeaderEntries& out) {
    if (!next('{')) return false;
    // No entry is shorter than "":{"dtype":"U8","shape":[],"data_offsets":[0,0]},
    // so this is room enough; pages never filled are never touched.
    out.tensors.reserve(static_cast<size_t>(end_ - p_) / 48 + 1);
    bool metadata_seen = false;
    if (!next('}')) {
      do {
        std::string_view key;
        if (!string(key) || !next(':')) return false;
        if (key == kMetadataKeyName) {
          if (metadata_seen || !metadata(out.metadata)) return false;
          metadata_seen = true;
        } else if (!entry(key, out.tensors.emplace_back())) {
          return false;
        }
      } while (next(','));
      if (!next('}')) return false;
    }
    skip_whitespace();
    return p_ == end_;
  }

 private:
  void skip_whitespace() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
  }

  // Consumes `c` after optional whitespace, if it is next.
  bool next(char c) {
    skip_whitespace();
    if (p_ == end_ || *p_ != c) return false;
    ++p_;
    return true;
  }

  // A string without escapes or control characters, in well-formed UTF-8:
  // its bytes between the quotes, which are also its value.
  bool string(std::string_view& out) {
    if (!next('"')) return false;
    const char* begin = p_;
    bool ascii = true;
    for (;; ++p_) {
      if (p_ == end_) return false;
      const auto c = static_cast<unsigned char>(*p_);
      if (c == '"') break;
      if (c == '\\' || c < 0x20) return false;
      ascii = ascii && c < 0x80;
    }
    out = std::string_view(begin, static_cast<size_t>(p_ - begin));
    ++p_;
    return ascii || is_valid_utf8(out);
  }

  // A JSON integer without sign, fraction or exponent that fits 64 bits.
  bool integer(uint64_t& out) {
    skip_whitespace();
    if (p_ == end_ || *p_ < '0' || *p_ > '9') return false;
    uint64_t v = 0;
    if (*p_ == '0') {
      ++p_;  // JSON allows no digit after a leading zero
    } else {
      while (p_ < end_ && *p_ >= '0' && *p_ <= '9') {
        if (__builtin_mul_overflow(v, 10u, &v) ||
            __builtin_add_overflow(v, static_cast<uint64_t>(*p_ - '0'), &v)) {
          return false;  // the general parser reads it as a float: not a size
        }
        ++p_;
      }
    }
    if (p_ < end_ && ((*p_ >= '0' && *p_ <= '9') || *p_ == '.' || *p_ == 'e' || *p_ == 'E')) {
      return false;
    }
    out = v;
    return true;
  }

  // "[" integers "]", read into dims_.
  bool integers() {
    dims_.clear();
    if (!next('[')) return false;
    if (next(']')) return true;
    do {
      uint64_t v;
      if (!integer(v)) return false;
      dims_.push_back(v);
    } while (next(','));
    return next(']');
  }

  bool metadata(std::map<std::string, std::string>& out) {
    if (!next('{')) return false;
    if (next('}')) return true;
    do {
      std::string_view key, value;
      if (!string(key) || !next(':') || !string(value)) return false;
      if (!out.emplace(key, value).second) return false;  // a duplicate key
    } while (next(','));
    return next('}');
  }

  bool entry(std::string_view name, TensorInfo& t) {
    t.name.assign(name);
    if (!next('{')) return false;
    bool dtype = false, shape = false, offsets = false;
    do {
      std::string_view key;
      if (!string(key) || !next(':')) return false;
      if (key == "dtype") {
        std::string_view value;
        if (dtype || !string(value)) return false;
        const std::optional<DType> d = parse_dtype(value);
        if (!d) return false;
        t.dtype = *d;
        dtype = true;
      } else if (key == "shape") {
        if (shape || !integers()) return false;
        t.shape.assign(dims_.begin(), dims_.end());  // one allocation of the exact size
        shape = true;
      } else if (key == "data_offsets") {
        if (offsets || !integers() || dims_.size() != 2) return false;
        t.begin = dims_[0];
        t.end = dims_[1];
        offsets = true;
      } else {
        return false;
      }
    } while (next(','));
    return next('}') && dtype && shape && offsets && entry_size_problem(t).empty();
  }

  const char* p_;
  const char* end_;
  std::vector<uint64_t> dims_;  // scratch for the array being read
};

}  // namespace

std::optional<HeaderEntries> scan_plain_header(std::string_view text) {
  HeaderEntries out;
  if (!PlainScanner(text).header(out)) return std::nullopt;
  return out;
}

std::string entry_size_problem(const TensorInfo& t) {
  if (t.end < t.begin) {
    return fmt::format("data_offsets [{}, {}] end before they begin", t.begin, t.end);
  }
  uint64_t n = 1, bytes = 0;
  bool overflow = false;
  for (uint64_t dim : t.shape) overflow = overflow || __builtin_mul_overflow(n, dim, &n);
  overflow = overflow || __builtin_mul_overflow(n, dtype_size(t.dtype), &bytes);
  if (overflow) return fmt::format("shape [{}] is too large", fmt::join(t.shape, ", "));
  if (bytes != t.nbytes()) {
    return fmt::format("{}[{}] needs {} bytes but data_offsets [{}, {}] hold {}",
                       dtype_name(t.dtype), fmt::join(t.shape, ", "), bytes, t.begin, t.end,
                       t.nbytes());
  }
  return "";
}

}  // namespace cairn::format
