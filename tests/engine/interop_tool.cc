// The C++ half of the safetensors interop test (interop_test.py drives it):
//   interop_tool write PATH   writes the reference state with Cairn
//   interop_tool check PATH   checks that PATH (written by Python) holds it,
//                             through both the mapped and the copying load
// The reference state is defined identically in interop_test.py. The
// "-common" modes (write-common, check-common) use the reference without
// its float8 tensors and with "format": "pt": what the cairn Python package
// can write from numpy arrays and a torch bfloat16 tensor
// (python/tests/test_tensors.py).
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/error.h"
#include "cairn/state.h"

namespace {

using cairn::DType;
using cairn::Shape;
using cairn::StateDict;

template <class T>
void add(StateDict& s, const std::string& name, DType dtype, Shape shape, std::vector<T> values) {
  std::vector<std::byte> bytes(values.size() * sizeof(T));
  if (!bytes.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  s.add_owned(name, dtype, std::move(shape), std::move(bytes));
}

StateDict reference(bool common) {
  StateDict s;
  std::vector<float> f32;
  for (int i = 0; i < 6; ++i) f32.push_back(static_cast<float>(i) * 0.5f - 1.0f);
  add(s, "f32", DType::kF32, {2, 3}, f32);
  std::vector<double> f64;
  for (int i = 0; i < 4; ++i) f64.push_back(static_cast<double>(i) / 3.0);
  add(s, "f64", DType::kF64, {4}, f64);
  add<uint16_t>(s, "f16", DType::kF16, {3}, {0x3c00, 0xc000, 0x7bff});
  add<uint16_t>(s, "bf16", DType::kBF16, {2}, {0x3f80, 0x4049});
  add<int8_t>(s, "i8", DType::kI8, {2, 3}, {-3, -2, -1, 0, 1, 2});
  add<uint8_t>(s, "u8", DType::kU8, {5}, {250, 251, 252, 253, 254});
  add<int16_t>(s, "i16", DType::kI16, {2}, {-300, 300});
  add<uint16_t>(s, "u16", DType::kU16, {2}, {65535, 1});
  add<int32_t>(s, "i32", DType::kI32, {2}, {-70000, 70000});
  add<uint32_t>(s, "u32", DType::kU32, {1}, {4000000000u});
  add<int64_t>(s, "i64", DType::kI64, {2}, {-(int64_t{1} << 40), 5});
  add<uint64_t>(s, "u64", DType::kU64, {1}, {uint64_t{1} << 63});
  add<uint8_t>(s, "bool", DType::kBool, {3}, {1, 0, 1});
  if (!common) {
    add<uint8_t>(s, "f8_e4m3", DType::kF8_E4M3, {2}, {0x38, 0xb8});
    add<uint8_t>(s, "f8_e5m2", DType::kF8_E5M2, {1}, {0x3c});
  }
  add<float>(s, "scalar", DType::kF32, {}, {7.5f});
  add<float>(s, "empty", DType::kF32, {0, 4}, {});
  s.metadata = {{"epoch", 3}, {"step", 100}};
  s.string_metadata = {{"format", common ? "pt" : "np"}};
  return s;
}

int fail(const std::string& why) {
  std::fprintf(stderr, "interop_tool: %s\n", why.c_str());
  return 1;
}

int check(const std::string& path, bool common) {
  StateDict want = reference(common);
  auto mapped = cairn::MappedState::open(path);
  if (mapped.names() != want.names()) return fail("tensor names differ");
  for (const auto& [name, e] : want.entries()) {
    auto got = mapped.tensor(name);
    if (got.dtype != e.dtype) return fail(name + ": dtype differs");
    if (got.shape != e.shape) return fail(name + ": shape differs");
    if (got.bytes.size() != e.nbytes ||
        (e.nbytes && std::memcmp(got.bytes.data(), e.data, e.nbytes)))
      return fail(name + ": bytes differ (mapped)");
  }
  if (mapped.metadata() != want.metadata) return fail("metadata differs");
  if (mapped.state_dict().string_metadata != want.string_metadata)
    return fail("__metadata__ differs");

  // Copying load into fresh buffers.
  std::vector<std::vector<std::byte>> buffers;
  StateDict into;
  for (const auto& [name, e] : want.entries()) {
    buffers.emplace_back(e.nbytes);
    into.add_mutable(name, e.dtype, e.shape, buffers.back());
  }
  cairn::load_into(path, into);
  for (const auto& [name, e] : want.entries()) {
    auto got = into.view(name);
    if (e.nbytes && std::memcmp(got.bytes.data(), e.data, e.nbytes))
      return fail(name + ": bytes differ (copied)");
  }
  if (into.metadata != want.metadata) return fail("metadata differs (copied)");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) return fail("usage: interop_tool write|check|write-common|check-common PATH");
  try {
    std::string mode = argv[1];
    const bool common = mode.ends_with("-common");
    if (common) mode.resize(mode.size() - std::string_view("-common").size());
    if (mode == "write") {
      cairn::save_file(reference(common), argv[2]);
      return 0;
    }
    if (mode == "check") return check(argv[2], common);
    return fail("unknown mode " + mode);
  } catch (const std::exception& e) {
    return fail(e.what());
  }
}
