// libFuzzer target: the safetensors header parser on arbitrary file images.
// Any input must either parse into a header whose invariants hold or be
// refused with cairn::Error(kCorruption); nothing else (crash, leak,
// undefined behaviour, another exception) is allowed. A parsed header must
// lay out again into a file that parses to the same tensors. The parser's
// plain-form scanner must never change an outcome: parsing without it gives
// the same header or the same error.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "cairn/error.h"
#include "cairn/safetensors.h"
#include "engine/header_scan.h"

namespace {

void check(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

// The general parser alone on the same file, as parse_file_header() reads it.
void check_general_agrees(std::span<const std::byte> file, const cairn::SafetensorsHeader* h,
                          const std::string& error) {
  if (file.size() < 8) return;
  uint64_t n;
  try {
    n = cairn::parse_header_length(file.first<8>(), file.size(), "fuzz.safetensors");
  } catch (const cairn::Error&) {
    return;  // refused before any parser ran
  }
  std::string_view text(reinterpret_cast<const char*>(file.data()) + 8, n);
  try {
    cairn::SafetensorsHeader g =
        cairn::format::parse_header_general(text, file.size(), "fuzz.safetensors");
    check(h != nullptr && g.metadata == h->metadata && g.by_name == h->by_name &&
          g.tensors.size() == h->tensors.size());
    for (size_t i = 0; i < g.tensors.size(); ++i) {
      const cairn::TensorInfo &a = g.tensors[i], &b = h->tensors[i];
      check(a.name == b.name && a.dtype == b.dtype && a.shape == b.shape && a.begin == b.begin &&
            a.end == b.end);
    }
  } catch (const cairn::Error& e) {
    check(h == nullptr && error == e.what());
  }
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const std::byte> file(reinterpret_cast<const std::byte*>(data), size);
  cairn::SafetensorsHeader h;
  try {
    h = cairn::parse_file_header(file, "fuzz.safetensors");
  } catch (const cairn::Error& e) {
    check(e.code() == cairn::ErrorCode::kCorruption);
    check_general_agrees(file, nullptr, e.what());
    return 0;
  }
  check_general_agrees(file, &h, "");
  // Invariants of an accepted header.
  check(h.file_size() == size);
  check(h.header_size <= cairn::kMaxHeaderSize);
  uint64_t expected = 0;
  std::vector<cairn::TensorDescriptor> descriptors;
  for (const auto& t : h.tensors) {
    check(t.begin == expected);
    check(t.end >= t.begin);
    check(cairn::byte_size(t.dtype, t.shape) == t.nbytes());
    expected = t.end;
    descriptors.push_back({t.name, t.dtype, t.shape});
  }
  check(expected == h.data_size);
  // Round trip through the writer's layout.
  cairn::FileLayout l;
  try {
    l = cairn::layout_file(descriptors, h.metadata);
  } catch (const cairn::Error& e) {
    // Only a tensor named "" or names/metadata that cannot be re-encoded are
    // refused by the writer but accepted by the reader.
    check(e.code() == cairn::ErrorCode::kInvalidArgument);
    return 0;
  }
  std::string again = l.header;
  again.resize(again.size() + l.parsed.data_size);
  cairn::SafetensorsHeader h2 = cairn::parse_file_header(
      {reinterpret_cast<const std::byte*>(again.data()), again.size()}, "fuzz.roundtrip");
  check(h2.tensors.size() == h.tensors.size());
  check(h2.metadata == h.metadata);
  for (const auto& t : h.tensors) {
    const cairn::TensorInfo* u = h2.find(t.name);
    check(u != nullptr && u->dtype == t.dtype && u->shape == t.shape);
  }
  return 0;
}
