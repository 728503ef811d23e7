// Test support: a temporary directory removed (with everything in it) when
// the object goes out of scope.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace cairn::testing {

class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }
  std::filesystem::path operator/(const std::string& rel) const { return path_ / rel; }

 private:
  std::filesystem::path path_;
};

// Writes `bytes` to `path`, creating parent directories.
void write_text(const std::filesystem::path& path, const std::string& bytes);
std::string read_text(const std::filesystem::path& path);
// A JSON Lines file (result.json) as one value per non-empty line.
std::vector<nlohmann::json> read_json_lines(const std::filesystem::path& path);

}  // namespace cairn::testing
