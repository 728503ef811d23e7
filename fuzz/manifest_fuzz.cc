// libFuzzer target: cairn::Manifest::parse on arbitrary text. Any input must
// either parse or be refused with cairn::Error(kCorruption). An accepted
// manifest has only safe relative paths, no duplicates, and survives
// to_json() -> parse() unchanged.
#include <cstddef>
#include <cstdint>
#include <set>
#include <string_view>

#include "cairn/checkpoint.h"
#include "cairn/error.h"

namespace {

void check(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  cairn::Manifest m;
  try {
    m = cairn::Manifest::parse(text, "fuzz/manifest.json");
  } catch (const cairn::Error& e) {
    check(e.code() == cairn::ErrorCode::kCorruption);
    return 0;
  }
  std::set<std::string> paths;
  for (const auto& f : m.files) {
    check(!f.path.empty() && f.path.front() != '/');
    size_t start = 0;
    while (true) {  // no "", "." or ".." component
      size_t slash = f.path.find('/', start);
      std::string_view part = std::string_view(f.path).substr(
          start, slash == std::string::npos ? std::string::npos : slash - start);
      check(!part.empty() && part != "." && part != "..");
      if (slash == std::string::npos) break;
      start = slash + 1;
    }
    check(paths.insert(f.path).second);
  }
  cairn::Manifest again = cairn::Manifest::parse(m.to_json(), "fuzz/roundtrip");
  check(again.files.size() == m.files.size());
  for (size_t i = 0; i < m.files.size(); ++i) {
    check(again.files[i].path == m.files[i].path);
    check(again.files[i].size == m.files[i].size);
    check(again.files[i].xxh3 == m.files[i].xxh3);
  }
  check(again.metrics == m.metrics);
  check(again.layout == m.layout);
  return 0;
}
