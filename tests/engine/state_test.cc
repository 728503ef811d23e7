// State dictionaries saved as safetensors: round trips through local files
// and storage, zero-copy mapped loads, copying loads and their checks.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <numeric>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "cairn/checkpoint.h"
#include "cairn/error.h"
#include "cairn/state.h"
#include "storage/backends.h"
#include "support/temp_dir.h"
#include "util/hash.h"

namespace cairn::testing {
namespace {

namespace fs = std::filesystem;

template <class T>
std::vector<T> iota(size_t n, T start) {
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<T>(start + static_cast<T>(i));
  return v;
}

struct Source {
  std::vector<float> w = iota<float>(12, 0.5f);
  std::vector<double> d = iota<double>(3, -1.0);
  std::vector<uint8_t> b = iota<uint8_t>(5, 1);
  std::vector<int64_t> step{42};
  StateDict state() {
    StateDict s;
    s.add<float>("layer.w", {3, 4}, w);
    s.add<double>("d", {3}, d);
    s.add<uint8_t>("bytes", {5}, b);
    s.add<int64_t>("step", {}, step);
    s.metadata = {{"epoch", 3}, {"lr", 0.001}, {"rng", {1, 2, 3}}};
    s.string_metadata = {{"format", "pt"}};
    return s;
  }
};

struct Target {
  std::vector<float> w = std::vector<float>(12);
  std::vector<double> d = std::vector<double>(3);
  std::vector<uint8_t> b = std::vector<uint8_t>(5);
  std::vector<int64_t> step = std::vector<int64_t>(1);
  StateDict state() {
    StateDict s;
    s.add_mutable<float>("layer.w", {3, 4}, w);
    s.add_mutable<double>("d", {3}, d);
    s.add_mutable<uint8_t>("bytes", {5}, b);
    s.add_mutable<int64_t>("step", {}, step);
    return s;
  }
};

TEST(StateDict, RefusesBytesThatDoNotMatchDtypeAndShape) {
  std::vector<float> v(5);
  StateDict s;
  EXPECT_THROW(s.add<float>("w", {2, 3}, v), Error);
  EXPECT_THROW(s.add<float>("__metadata__", {5}, v), Error);
  s.add<float>("w", {5}, v);
  EXPECT_THROW(s.mutable_bytes("w"), Error);
  EXPECT_THROW(s.entry("nope"), Error);
}

// Copies share their entries until one changes (copy on write): each is
// still an independent value, and the version says when entries are the same.
TEST(StateDict, CopiesAreIndependentAndShareAVersionUntilOneChanges) {
  std::vector<float> a(4, 1.0f), b(2, 2.0f);
  StateDict s;
  EXPECT_EQ(s.entries_version(), 0u);
  s.add<float>("a", {4}, a);
  const uint64_t v1 = s.entries_version();
  EXPECT_NE(v1, 0u);
  StateDict copy = s;
  EXPECT_EQ(copy.entries_version(), v1);
  EXPECT_EQ(&copy.entries(), &s.entries()) << "a copy shares the entries";

  copy.add<float>("b", {2}, b);
  EXPECT_NE(copy.entries_version(), v1);
  EXPECT_EQ(s.entries_version(), v1);
  EXPECT_EQ(s.names(), (std::vector<std::string>{"a"}));
  EXPECT_EQ(copy.names(), (std::vector<std::string>{"a", "b"}));

  s.remove("a");
  EXPECT_TRUE(copy.contains("a"));
  EXPECT_FALSE(s.contains("a"));
  const uint64_t v2 = s.entries_version();
  EXPECT_NE(v2, v1);
  EXPECT_NE(v2, copy.entries_version());
  s.remove("absent");
  EXPECT_EQ(s.entries_version(), v2) << "removing nothing changes nothing";

  // Re-adding the same name, dtype and shape over other memory is a change.
  std::vector<float> c(2, 5.0f);
  StateDict again = copy;
  again.add<float>("b", {2}, c);
  EXPECT_NE(again.entries_version(), copy.entries_version());
  EXPECT_EQ(copy.entry("b").data, reinterpret_cast<std::byte*>(b.data()));

  // A moved-from StateDict is empty, never "the same" as its successor.
  StateDict moved = std::move(again);
  EXPECT_EQ(again.size(), 0u);  // NOLINT(bugprone-use-after-move): valid, empty
  EXPECT_EQ(again.entries_version(), 0u);
  EXPECT_EQ(moved.size(), 2u);
}

TEST(SaveFile, RoundTripsTensorsAndMetadataThroughACopyingLoad) {
  TempDir dir;
  Source src;
  save_file(src.state(), dir / "s.safetensors");
  Target dst;
  StateDict t = dst.state();
  LoadReport r = load_into(dir / "s.safetensors", t);
  EXPECT_TRUE(r.consumed());
  EXPECT_EQ(r.loaded.size(), 4u);
  EXPECT_EQ(dst.w, src.w);
  EXPECT_EQ(dst.d, src.d);
  EXPECT_EQ(dst.b, src.b);
  EXPECT_EQ(dst.step, src.step);
  EXPECT_EQ(t.metadata["epoch"], 3);
  EXPECT_EQ(t.metadata["rng"], nlohmann::json({1, 2, 3}));
  EXPECT_EQ(t.string_metadata.at("format"), "pt");
}

TEST(InMemoryCheckpoint, HoldsACopyOfTheTensorsAndTheDict) {
  Source src;
  Checkpoint c = in_memory_checkpoint(src.state(), {{"epoch", 3}});
  src.w.assign(src.w.size(), -1.0f);  // the checkpoint has its own copy
  EXPECT_EQ(c.to_dict(), (nlohmann::json{{"epoch", 3}}));
  MappedState m = MappedState::open(c.storage(), kStateFileName);
  EXPECT_EQ(m.tensor("layer.w").as<float>()[0], Source().w[0]);
  EXPECT_EQ(m.metadata()["epoch"], 3);
  // Without a dict, only the state.
  Checkpoint plain = in_memory_checkpoint(src.state());
  EXPECT_FALSE(plain.storage().exists(kDictFileName));
  EXPECT_EQ(MappedState::open(plain.storage(), kStateFileName).tensor("layer.w").as<float>()[0],
            -1.0f);
}

std::vector<float> floats_of(const Checkpoint& c, const std::string& name) {
  MappedState m = MappedState::open(c.storage(), kStateFileName);
  auto v = m.tensor(name).as<float>();
  return std::vector<float>(v.begin(), v.end());
}

TEST(StateStager, StagesTheSameFileAsInMemoryCheckpointWithTheDict) {
  Source src;
  StateStager stager;
  Checkpoint staged = stager.stage(src.state(), {{"epoch", 3}});
  Checkpoint plain = in_memory_checkpoint(src.state(), {{"epoch", 3}});
  EXPECT_EQ(staged.storage().get(kStateFileName), plain.storage().get(kStateFileName));
  EXPECT_EQ(staged.to_dict(), (nlohmann::json{{"epoch", 3}}));
  EXPECT_FALSE(stager.stage(src.state()).storage().exists(kDictFileName));
  Checkpoint named = stager.stage(src.state(), nullptr, "rank-1.safetensors");
  EXPECT_EQ(named.storage().get("rank-1.safetensors"), plain.storage().get(kStateFileName));
  EXPECT_FALSE(named.storage().exists(kStateFileName));
}

TEST(StateStager, ReusesABufferOnceNoCheckpointHoldsItAndNeverOneThatIsHeld) {
  Source src;
  StateStager stager(2);
  std::optional<Checkpoint> held = stager.stage(src.state());
  const std::vector<float> first = src.w;
  // Held: the next stage must not write into its buffer.
  src.w.assign(src.w.size(), 7.0f);
  Checkpoint second = stager.stage(src.state());
  EXPECT_EQ(floats_of(*held, "layer.w"), first);
  EXPECT_EQ(floats_of(second, "layer.w"), src.w);
  EXPECT_EQ(stager.stats().allocations, 2u);
  // Released: its buffer is used again, with no allocation.
  held.reset();
  src.w.assign(src.w.size(), 9.0f);
  Checkpoint third = stager.stage(src.state());
  EXPECT_EQ(floats_of(third, "layer.w"), src.w);
  EXPECT_EQ(floats_of(second, "layer.w"), std::vector<float>(src.w.size(), 7.0f));
  EXPECT_EQ(stager.stats().allocations, 2u);
  EXPECT_EQ(stager.stats().stages, 3u);
}

TEST(StateStager, KeepsAtMostMaxBuffersWhenManyCheckpointsAreHeld) {
  Source src;
  StateStager stager(2);
  std::vector<Checkpoint> held;
  for (int i = 0; i < 5; ++i) {
    src.w.assign(src.w.size(), static_cast<float>(i));
    held.push_back(stager.stage(src.state()));
  }
  EXPECT_EQ(stager.stats().buffers, 2u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(floats_of(held[i], "layer.w")[0], static_cast<float>(i)) << i;
  }
}

TEST(SaveFile, TheEmptyTensorNameThatSafetensorsAllowsRoundTrips) {
  TempDir dir;
  std::vector<float> v = {1, 2, 3};
  StateDict s;
  s.add<float>("", {3}, v);
  save_file(s, dir / "e.safetensors");
  std::vector<float> out(3);
  StateDict t;
  t.add_mutable<float>("", {3}, out);
  EXPECT_TRUE(load_into(dir / "e.safetensors", t).consumed());
  EXPECT_EQ(out, v);
}

TEST(SaveFile, LeavesNoTempFileAndReplacesAnExistingFile) {
  TempDir dir;
  Source src;
  save_file(src.state(), dir / "s.safetensors");
  src.w[0] = 99;
  save_file(src.state(), dir / "s.safetensors", SaveOptions{.durable = false});
  size_t n = 0;
  for (auto& e : fs::directory_iterator(dir.path())) (void)e, ++n;
  EXPECT_EQ(n, 1u);
  auto m = MappedState::open(dir / "s.safetensors");
  EXPECT_EQ(m.tensor("layer.w").as<float>()[0], 99.0f);
}

TEST(SaveFile, ParallelSmallBlocksWriteTheSameBytesAsOneBlock) {
  TempDir dir;
  std::vector<float> big = iota<float>(100000, 0.0f);
  StateDict s;
  s.add<float>("big", {100000}, big);
  Source src;
  StateDict small = src.state();
  for (auto& [k, e] : small.entries()) s.add(k, e.dtype, e.shape, {e.data, e.nbytes});
  save_file(s, dir / "a", SaveOptions{.durable = false, .threads = 1, .block_size = 1 << 30});
  save_file(s, dir / "b", SaveOptions{.durable = false, .threads = 4, .block_size = 4096});
  EXPECT_EQ(read_text(dir / "a"), read_text(dir / "b"));
}

ErrorCode code_of_read(const std::filesystem::path& path) {
  try {
    MappedState::read(path, LoadOptions{});
  } catch (const Error& e) {
    return e.code();
  }
  return ErrorCode::kInternal;
}

TEST(MappedState, GivesZeroCopyViewsThatOutliveTheHandleThroughStateDict) {
  TempDir dir;
  Source src;
  save_file(src.state(), dir / "s.safetensors");
  StateDict views;
  {
    auto m = MappedState::open(dir / "s.safetensors");
    auto w = m.tensor("layer.w");
    EXPECT_EQ(w.dtype, DType::kF32);
    EXPECT_EQ(w.shape, (Shape{3, 4}));
    // The view points into the mapping, not a copy.
    EXPECT_GE(w.bytes.data(), m.file_bytes().data());
    EXPECT_LT(w.bytes.data(), m.file_bytes().data() + m.file_bytes().size());
    EXPECT_EQ(m.metadata()["epoch"], 3);
    views = m.state_dict();
  }
  auto w = views.view("layer.w").as<float>();
  EXPECT_TRUE(std::equal(w.begin(), w.end(), src.w.begin()));
  EXPECT_EQ(views.metadata["lr"], 0.001);
  EXPECT_THROW(views.view("layer.w").as<double>(), Error);
}

// Views handed to code that writes to them (a framework's tensors) come from
// a copy-on-write mapping: writes stay in this process, the file is intact.
TEST(MappedState, ACopyOnWriteMappingTakesWritesThatNeverReachTheFile) {
  TempDir dir;
  Source src;
  save_file(src.state(), dir / "s.safetensors");
  const std::string before = read_text(dir / "s.safetensors");
  auto cow = MappedState::open(dir / "s.safetensors", true, MapMode::kCopyOnWrite);
  std::span<std::byte> all = cow.writable_file_bytes();
  auto w = cow.tensor("layer.w");
  const size_t at = static_cast<size_t>(w.bytes.data() - all.data());
  const float changed = 42.5f;
  std::memcpy(all.data() + at, &changed, sizeof changed);
  EXPECT_EQ(cow.tensor("layer.w").as<float>()[0], 42.5f);
  EXPECT_EQ(cow.state_dict().view("layer.w").as<float>()[0], 42.5f);
  EXPECT_EQ(read_text(dir / "s.safetensors"), before);
  EXPECT_EQ(MappedState::open(dir / "s.safetensors").tensor("layer.w").as<float>()[0], src.w[0]);
  // A read-only mapping refuses to hand out writable bytes, naming the file.
  try {
    (void)MappedState::open(dir / "s.safetensors").writable_file_bytes();
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kFailedPrecondition);
    EXPECT_NE(std::string(e.what()).find("s.safetensors"), std::string::npos) << e.what();
  }
  // An object read from a store is memory of its own: writable.
  auto mem = open_storage("memory://cow-test/p");
  save(src.state(), *mem, "s.safetensors");
  EXPECT_EQ(MappedState::open(*mem, "s.safetensors").writable_file_bytes().size(), before.size());
}

// A copying load into memory of its own: one read of the whole file, the
// same tensors as a mapping, writable, and the file's checksum checked.
TEST(MappedState, ReadTakesTheWholeFileIntoMemoryOfItsOwn) {
  TempDir dir;
  Source src;
  save_file(src.state(), dir / "s.safetensors");
  const std::string bytes = read_text(dir / "s.safetensors");
  auto read = MappedState::read(dir / "s.safetensors", LoadOptions{});
  auto mapped = MappedState::open(dir / "s.safetensors");
  EXPECT_EQ(read.names(), mapped.names());
  for (const auto& name : read.names()) {
    auto a = read.tensor(name), b = mapped.tensor(name);
    EXPECT_EQ(a.dtype, b.dtype);
    EXPECT_EQ(a.shape, b.shape);
    EXPECT_TRUE(std::equal(a.bytes.begin(), a.bytes.end(), b.bytes.begin(), b.bytes.end())) << name;
  }
  EXPECT_EQ(read.metadata(), mapped.metadata());
  // Its own memory: writes reach neither the file nor a later read.
  read.writable_file_bytes()[read.header().data_start()] = std::byte{0x7f};
  EXPECT_EQ(read_text(dir / "s.safetensors"), bytes);
  LoadOptions checked;
  checked.expected_xxh3 = xxh3_64(bytes);
  EXPECT_NO_THROW(MappedState::read(dir / "s.safetensors", checked));
  checked.expected_xxh3 = *checked.expected_xxh3 + 1;
  try {
    MappedState::read(dir / "s.safetensors", checked);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruption);
    EXPECT_NE(std::string(e.what()).find("s.safetensors"), std::string::npos) << e.what();
  }
  EXPECT_EQ(code_of_read(dir / "missing.safetensors"), ErrorCode::kNotFound);
  std::filesystem::resize_file(dir / "s.safetensors", bytes.size() - 3);
  EXPECT_EQ(code_of_read(dir / "s.safetensors"), ErrorCode::kCorruption);
}

TEST(MappedState, NamesTheFileAndTensorWhenATensorIsMissing) {
  TempDir dir;
  Source src;
  save_file(src.state(), dir / "s.safetensors");
  auto m = MappedState::open(dir / "s.safetensors");
  try {
    m.tensor("nope");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
    EXPECT_NE(std::string(e.what()).find("\"nope\""), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("s.safetensors"), std::string::npos);
  }
}

TEST(MappedState, RefusesATruncatedFileNamingIt) {
  TempDir dir;
  Source src;
  save_file(src.state(), dir / "s.safetensors");
  fs::resize_file(dir / "s.safetensors", fs::file_size(dir / "s.safetensors") - 3);
  try {
    MappedState::open(dir / "s.safetensors");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruption);
    EXPECT_NE(std::string(e.what()).find("s.safetensors"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("past the end of the file"), std::string::npos)
        << e.what();
  }
  Target dst;
  StateDict t = dst.state();
  EXPECT_THROW(load_into(dir / "s.safetensors", t), Error);
}

TEST(LoadInto, StrictListsMissingUnexpectedAndMismatchedBeforeWritingAnything) {
  TempDir dir;
  Source src;
  save_file(src.state(), dir / "s.safetensors");
  Target dst;
  StateDict t = dst.state();
  t.remove("bytes");  // unexpected in the file
  std::vector<float> extra(2);
  t.add_mutable<float>("extra", {2}, extra);  // missing from the file
  std::vector<float> wrong(3);
  t.add_mutable<float>("d", {3}, wrong);  // dtype differs
  try {
    load_into(dir / "s.safetensors", t);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    std::string msg = e.what();
    EXPECT_NE(msg.find("missing from the file: extra"), std::string::npos) << msg;
    EXPECT_NE(msg.find("unexpected (not in the state): bytes"), std::string::npos) << msg;
    EXPECT_NE(msg.find("d: file F64[3], state F32[3]"), std::string::npos) << msg;
  }
  EXPECT_EQ(dst.w, std::vector<float>(12)) << "a refused load wrote into a buffer";
}

TEST(LoadInto, NonStrictLoadsTheMatchesAndReportsTheRest) {
  TempDir dir;
  Source src;
  save_file(src.state(), dir / "s.safetensors");
  std::vector<float> w(12);
  StateDict t;
  t.add_mutable<float>("layer.w", {3, 4}, w);
  LoadReport r = load_into(dir / "s.safetensors", t, LoadOptions{.strict = false});
  EXPECT_EQ(w, src.w);
  EXPECT_EQ(r.unexpected, (std::vector<std::string>{"bytes", "d", "step"}));
  EXPECT_FALSE(r.consumed());
}

TEST(LoadInto, DetectsAChangedFileByItsChecksum) {
  TempDir dir;
  Source src;
  auto storage = open_storage(dir.str());
  ManifestEntry e = save(src.state(), *storage, "s.safetensors");
  EXPECT_EQ(e.size, fs::file_size(dir / "s.safetensors"));
  EXPECT_EQ(e.xxh3, xxh3_64(read_text(dir / "s.safetensors")));
  Target dst;
  StateDict t = dst.state();
  load_into(*storage, "s.safetensors", t, LoadOptions{.expected_xxh3 = e.xxh3});
  EXPECT_EQ(dst.w, src.w);
  // Flip one data byte: the header still parses, the checksum does not match.
  std::string bytes = read_text(dir / "s.safetensors");
  bytes.back() ^= 1;
  write_text(dir / "s.safetensors", bytes);
  try {
    load_into(*storage, "s.safetensors", t, LoadOptions{.expected_xxh3 = e.xxh3});
    FAIL();
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), ErrorCode::kCorruption);
    EXPECT_NE(std::string(err.what()).find("s.safetensors"), std::string::npos);
    EXPECT_NE(std::string(err.what()).find("checksum"), std::string::npos);
  }
}

TEST(Storage, RoundTripsThroughTheMemoryBackend) {
  clear_memory_bucket("state-test");
  auto storage = open_storage("memory://state-test/x");
  Source src;
  ManifestEntry e = save(src.state(), *storage, "dir/s.safetensors");
  EXPECT_EQ(e.xxh3, xxh3_64(storage->get("dir/s.safetensors")));
  auto m = MappedState::open(*storage, "dir/s.safetensors");
  EXPECT_NE(m.source().find("memory://"), std::string::npos);
  auto w = m.tensor("layer.w").as<float>();
  EXPECT_TRUE(std::equal(w.begin(), w.end(), src.w.begin()));
  Target dst;
  StateDict t = dst.state();
  load_into(*storage, "dir/s.safetensors", t);
  EXPECT_EQ(dst.d, src.d);
  clear_memory_bucket("state-test");
}

TEST(Storage, ASaveRecordsAChecksumPerBlockThatMatchesTheFile) {
  TempDir dir;
  auto storage = open_storage("file://" + dir.str());
  std::vector<float> big((size_t{5} << 20) / 4 + 7);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i % 977);
  StateDict s;
  s.add<float>("big", {big.size()}, big);
  for (IoPath io : {IoPath::kBuffered, IoPath::kDirect}) {
    ManifestEntry e = save(s, *storage, "s.safetensors", {.io = io});
    ASSERT_EQ(e.block_size, kChecksumBlockSize);
    const std::string file = read_text(dir / "s.safetensors");
    ASSERT_EQ(e.block_xxh3.size(), (file.size() + e.block_size - 1) / e.block_size);
    for (size_t b = 0; b < e.block_xxh3.size(); ++b) {
      EXPECT_EQ(e.block_xxh3[b],
                xxh3_64(std::string_view(file).substr(b * e.block_size, e.block_size)))
          << "block " << b;
    }
    EXPECT_EQ(e.xxh3, xxh3_64(file));
  }
}

TEST(SaveCheckpoint, CommitsTheFileWithMetricsAndMetadata) {
  TempDir dir;
  Source src;
  auto cp = Checkpoint::from_directory((dir / "cp").string());
  Manifest m = save_checkpoint(src.state(), cp, {{"loss", 0.25}});
  EXPECT_TRUE(cp.is_committed());
  ASSERT_EQ(m.files.size(), 1u);
  EXPECT_EQ(m.files[0].path, "state.safetensors");
  EXPECT_EQ(m.metrics["loss"], 0.25);
  EXPECT_EQ(cp.get_metadata()["epoch"], 3);
  EXPECT_TRUE(cp.verify().empty());
}

TEST(StateDict, MetadataMustBeAnObjectAndNotShadowTheCairnKey) {
  TempDir dir;
  StateDict s;
  s.metadata = 3;
  EXPECT_THROW(save_file(s, dir / "x"), Error);
  s.metadata = nlohmann::json::object();
  s.string_metadata["cairn.metadata"] = "{}";
  EXPECT_THROW(save_file(s, dir / "x"), Error);
}

TEST(StateDict, MetadataALoadWouldRefuseIsRefusedAtSave) {
  TempDir dir;
  StateDict s;
  nlohmann::json deep = 1;
  for (int i = 0; i < 200; ++i) deep = nlohmann::json::array({std::move(deep)});
  s.metadata = {{"deep", deep}};
  EXPECT_THROW(save_file(s, dir / "x"), Error);
  s.metadata = {{"note", "\xff"}};
  EXPECT_THROW(save_file(s, dir / "x"), Error);
  EXPECT_FALSE(fs::exists(dir / "x"));
}

TEST(MappedState, RefusesCairnMetadataThatIsNotAJsonObject) {
  TempDir dir;
  StateDict s;
  std::vector<float> v(2);
  s.add<float>("w", {2}, v);
  FileLayout l = layout_file({{"w", DType::kF32, {2}}}, {{"cairn.metadata", "[1"}});
  write_text(dir / "x", l.header + std::string(8, '\0'));
  auto m = MappedState::open(dir / "x");
  try {
    m.metadata();
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruption);
    EXPECT_NE(std::string(e.what()).find("cairn.metadata"), std::string::npos);
  }
}

TEST(LoadInto, AHundredThousandTensorsSaveLoadAndMapWithoutQuadraticWork) {
  // Bounds the per-tensor cost of save, load_into (match_state, the reads)
  // and the mapped open: with a linear lookup per tensor this takes minutes.
  // Not timed; it only has to finish.
  constexpr size_t kMany = 100'000;
  auto name = [](size_t i) { return fmt::format("m.{:06d}", i); };
  std::vector<uint8_t> src(kMany);
  for (size_t i = 0; i < kMany; ++i) src[i] = static_cast<uint8_t>(i * 7);
  StateDict s;
  for (size_t i = 0; i < kMany; ++i) s.add<uint8_t>(name(i), {1}, {&src[i], 1});
  TempDir dir;
  save_file(s, dir / "many.safetensors");

  std::vector<uint8_t> dst(kMany, 0);
  StateDict t;
  for (size_t i = 0; i < kMany; ++i) t.add_mutable<uint8_t>(name(i), {1}, {&dst[i], 1});
  LoadReport r = load_into(dir / "many.safetensors", t);
  EXPECT_TRUE(r.consumed()) << r.describe();
  EXPECT_EQ(r.loaded.size(), kMany);
  EXPECT_EQ(dst, src);

  MappedState m = MappedState::open(dir / "many.safetensors");
  EXPECT_EQ(m.header().tensors.size(), kMany);
  EXPECT_EQ(m.tensor(name(kMany - 1)).bytes[0], std::byte{src[kMany - 1]});
  EXPECT_EQ(match_state(m.header(), t).loaded.size(), kMany);
}

}  // namespace
}  // namespace cairn::testing
