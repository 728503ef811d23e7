// Files for the programs the launcher tests start (no test framework in
// them): a whole file read, and a file written so that a reader polling
// for it never sees it half written.
#pragma once

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace cairn::testing {

// Writes `text` to `p` through a temporary file and a rename.
inline void write_file_atomically(const std::filesystem::path& p, const std::string& text) {
  std::filesystem::path tmp = p;
  tmp += ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
  }
  std::filesystem::rename(tmp, p);
}

// The whole file ("" when it cannot be read).
inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace cairn::testing
