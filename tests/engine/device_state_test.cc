// Device-resident state without a GPU: the engine saves and loads tensors
// that live in a fake device's memory (tests/support/fake_device.h), which
// the CPU cannot touch, with the ordering, pinning and fallbacks a CUDA
// device gets.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "cairn/async_save.h"
#include "cairn/error.h"
#include "cairn/manager.h"
#include "cairn/sharded.h"
#include "cairn/state.h"
#include "support/errors.h"
#include "support/fake_device.h"
#include "support/temp_dir.h"

namespace cairn::testing {
namespace {

using std::chrono::milliseconds;

std::vector<std::byte> random_bytes(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> out(n);
  for (auto& b : out) b = static_cast<std::byte>(rng() & 0xff);
  return out;
}

// A file's bytes, for comparisons.
std::string file_bytes(const std::filesystem::path& p) { return read_text(p); }

std::vector<std::byte> tensor_bytes(const MappedState& file, const std::string& name) {
  TensorView v = file.tensor(name);
  return {v.bytes.begin(), v.bytes.end()};
}

// The same tensors twice: in host memory and in the fake device's memory.
struct Twin {
  std::shared_ptr<FakeDevice> device;
  std::map<std::string, std::vector<std::byte>> host;
  std::map<std::string, std::span<std::byte>> on_device;
  StateDict host_state, device_state;

  // Tensors named "t<i>" of the given F32 element counts.
  Twin(std::shared_ptr<FakeDevice> d, const std::vector<size_t>& elements, unsigned seed = 1)
      : device(std::move(d)) {
    for (size_t i = 0; i < elements.size(); ++i) {
      const std::string name = "t" + std::to_string(i);
      auto& h = host[name] = random_bytes(elements[i] * 4, seed + static_cast<unsigned>(i));
      host_state.add_mutable(name, DType::kF32, {elements[i]}, h);
      std::span<std::byte> dev = device->allocate(h.size());
      device->write(dev, h);
      on_device[name] = dev;
      device_state.add_device(name, DType::kF32, {elements[i]}, dev, device, nullptr, true);
    }
    host_state.metadata = device_state.metadata = {{"step", 7}};
  }
};

TEST(DeviceState, SyncSavesOfDeviceTensorsWriteTheBytesOfTheSameHostState) {
  auto device = FakeDevice::create(size_t{64} << 20);
  device->set_copy_delay(std::chrono::microseconds(200));
  Twin twin(device, {1000, 1, 0, 300000, 17});
  TempDir dir;
  for (IoPath io : {IoPath::kBuffered, IoPath::kAuto}) {
    SaveOptions o;
    o.io = io;
    save_file(twin.host_state, dir / "host.safetensors", o);
    save_file(twin.device_state, dir / "device.safetensors", o);
    EXPECT_EQ(file_bytes(dir / "host.safetensors"), file_bytes(dir / "device.safetensors"));
  }
  // Through a Storage and a checkpoint commit, too.
  auto cp_host = Checkpoint::from_directory((dir / "cp_host").string());
  auto cp_device = Checkpoint::from_directory((dir / "cp_device").string());
  Manifest a = save_checkpoint(twin.host_state, cp_host);
  Manifest b = save_checkpoint(twin.device_state, cp_device);
  EXPECT_EQ(a.files.at(0).xxh3, b.files.at(0).xxh3);
  EXPECT_GT(device->counters().to_host, 0u);
}

TEST(DeviceState, ReservedSyncStagingIsPinnedOnceAndReusedUntilReleased) {
  release_device_staging();
  auto device = FakeDevice::create(size_t{16} << 20);
  Twin twin(device, {200000, 9});
  reserve_device_staging(twin.device_state);
  EXPECT_EQ(device->counters().pins, 1u);
  TempDir dir;
  for (int i = 0; i < 3; ++i) save_file(twin.device_state, dir / "s.safetensors");
  save_file(twin.host_state, dir / "h.safetensors");
  EXPECT_EQ(file_bytes(dir / "s.safetensors"), file_bytes(dir / "h.safetensors"));
  EXPECT_EQ(device->counters().pins, 1u);
  EXPECT_EQ(device->counters().unpinned_copies, 0u);
  release_device_staging();
  EXPECT_EQ(device->counters().unpins, 1u);
  // A host-only state reserves nothing.
  reserve_device_staging(twin.host_state);
  EXPECT_EQ(device->counters().pins, 1u);
}

TEST(DeviceState, AsyncSnapshotHoldsTheBytesAfterQueuedWorkAndBeforeLaterWork) {
  auto device = FakeDevice::create(size_t{16} << 20);
  device->set_copy_delay(std::chrono::microseconds(500));
  Twin twin(device, {250000, 64});
  std::span<std::byte> t0 = twin.on_device["t0"];
  TempDir dir;
  AsyncSaver saver;
  // A slow kernel queued before the save: the snapshot must wait for it.
  device->enqueue_fill(t0, std::byte{0x22}, milliseconds(100));
  SaveHandle h = saver.save(twin.device_state, Checkpoint::from_directory((dir / "a").string()));
  // Work queued after save() returns must not reach the file.
  device->enqueue_fill(t0, std::byte{0x33});
  h.wait();
  device->drain();
  MappedState file = MappedState::open(h.checkpoint().storage(), kStateFileName);
  EXPECT_EQ(tensor_bytes(file, "t0"), std::vector<std::byte>(t0.size(), std::byte{0x22}));
  EXPECT_EQ(tensor_bytes(file, "t1"), twin.host["t1"]);
  EXPECT_EQ(device->read(t0), std::vector<std::byte>(t0.size(), std::byte{0x33}));
}

TEST(DeviceState, AsyncSaverPinsItsStagingOnceAndCopiesIntoPinnedMemoryFromThenOn) {
  auto device = FakeDevice::create(size_t{16} << 20);
  Twin twin(device, {100000, 3});
  TempDir dir;
  {
    AsyncSaver saver;
    for (int i = 0; i < 4; ++i) {
      saver.save(twin.device_state, Checkpoint::from_directory((dir / std::to_string(i)).string()))
          .wait();
    }
    AsyncSaver::Stats s = saver.stats();
    EXPECT_EQ(s.staging_allocations, 1u);
    EXPECT_EQ(s.staging_pinned_bytes, s.staging_bytes);
    FakeDevice::Counters c = device->counters();
    EXPECT_EQ(c.pins, 1u);
    EXPECT_EQ(c.unpinned_copies, 0u);
    EXPECT_EQ(c.to_host, 8u);  // two tensors a save
    // A larger state: the buffer is replaced, the old one unpinned.
    Twin bigger(device, {1000000}, 9);
    saver.save(bigger.device_state, Checkpoint::from_directory((dir / "big").string())).wait();
    EXPECT_EQ(device->counters().pins, 2u);
    EXPECT_EQ(device->counters().unpins, 1u);
    MappedState file = MappedState::open(
        Checkpoint::from_directory((dir / "big").string()).storage(), kStateFileName);
    EXPECT_EQ(tensor_bytes(file, "t0"), bigger.host["t0"]);
  }
  // The saver's buffers are unpinned with it.
  EXPECT_EQ(device->counters().unpins, device->counters().pins);
}

TEST(DeviceState, ReserveOfADeviceStatePinsAheadOfTheFirstSave) {
  auto device = FakeDevice::create(size_t{16} << 20);
  Twin twin(device, {100000});
  TempDir dir;
  AsyncSaver saver;
  saver.reserve(twin.device_state);
  EXPECT_EQ(device->counters().pins, 1u);
  EXPECT_GT(saver.stats().staging_pinned_bytes, 0u);
  saver.save(twin.device_state, Checkpoint::from_directory((dir / "a").string())).wait();
  EXPECT_EQ(saver.stats().staging_allocations, 1u);
  EXPECT_EQ(device->counters().pins, 1u);
  EXPECT_EQ(device->counters().unpinned_copies, 0u);
}

TEST(DeviceState, ADeviceThatRefusesToPinStillSavesAndLoads) {
  auto device = FakeDevice::create(size_t{16} << 20);
  device->refuse_pin(true);
  Twin twin(device, {100000, 5});
  TempDir dir;
  AsyncSaver saver;
  saver.save(twin.device_state, Checkpoint::from_directory((dir / "a").string())).wait();
  EXPECT_EQ(saver.stats().staging_pinned_bytes, 0u);
  MappedState file =
      MappedState::open(Checkpoint::from_directory((dir / "a").string()).storage(), kStateFileName);
  EXPECT_EQ(tensor_bytes(file, "t0"), twin.host["t0"]);
  device->write(twin.on_device["t0"], std::vector<std::byte>(400000));
  LoadReport r = load_into(file.source(), twin.device_state);
  EXPECT_EQ(r.loaded.size(), 2u);
  EXPECT_EQ(device->read(twin.on_device["t0"]), twin.host["t0"]);
}

TEST(DeviceState, LoadIntoDeviceTensorsCopiesEveryByteThroughBounceBuffers) {
  auto device = FakeDevice::create(size_t{256} << 20);
  device->set_copy_delay(std::chrono::microseconds(300));
  // Larger than two bounce buffers, so they are reused while copies run.
  Twin twin(device, {size_t{40} << 20, 1000, size_t{5} << 20, 1});
  TempDir dir;
  auto cp = Checkpoint::from_directory((dir / "cp").string());
  Manifest m = save_checkpoint(twin.host_state, cp);
  const std::string path = (dir / "cp" / std::string(kStateFileName)).string();
  for (const char* mode : {"plain", "whole file checksum", "block checksums", "direct"}) {
    SCOPED_TRACE(mode);
    for (auto& [name, dev] : twin.on_device) device->write(dev, std::vector<std::byte>(dev.size()));
    LoadOptions o;
    if (std::string(mode) == "whole file checksum") o.expected_xxh3 = m.files.at(0).xxh3;
    if (std::string(mode) == "block checksums") o.expect(m.files.at(0));
    if (std::string(mode) == "direct") o.io = IoPath::kDirect;
    IoReport report;
    o.report = &report;
    StateDict target = twin.device_state;
    try {
      load_into(path, target, o);
    } catch (const Error& e) {
      // A file system without O_DIRECT refuses kDirect.
      ASSERT_EQ(std::string(mode), "direct") << e.what();
      continue;
    }
    for (auto& [name, dev] : twin.on_device) EXPECT_EQ(device->read(dev), twin.host[name]) << name;
    EXPECT_EQ(target.metadata, twin.host_state.metadata);
    EXPECT_NE(report.reason.find("bounce"), std::string::npos) << report.reason;
  }
}

TEST(DeviceState, AMixedStateRoundTripsThroughAManagerAndAsyncSaves) {
  auto device = FakeDevice::create(size_t{16} << 20);
  Twin twin(device, {5000, 7});
  std::vector<float> host_part(100, 2.5f);
  StateDict state = twin.device_state;
  state.add_mutable<float>("host", {100}, host_part);
  TempDir dir;
  CheckpointManager manager(dir.str(), CheckpointConfig{});
  AsyncSaver saver;
  SaveHandle h = saver.save(state, manager, {{"loss", 0.5}});
  h.wait();
  std::fill(host_part.begin(), host_part.end(), 0.0f);
  for (auto& [name, dev] : twin.on_device) device->write(dev, std::vector<std::byte>(dev.size()));
  const CheckpointRecord rec = *manager.latest();
  LoadOptions o;
  o.expect(rec.checkpoint.manifest().files.at(0));
  load_into(rec.checkpoint.storage(), kStateFileName, state, o);
  EXPECT_EQ(host_part, std::vector<float>(100, 2.5f));
  for (auto& [name, dev] : twin.on_device) EXPECT_EQ(device->read(dev), twin.host[name]);
}

TEST(DeviceState, ALoadThatDoesNotMatchChangesNoDeviceTensor) {
  auto device = FakeDevice::create(size_t{16} << 20);
  Twin twin(device, {1000, 10});
  TempDir dir;
  save_file(twin.host_state, dir / "s.safetensors");
  StateDict wrong;
  std::span<std::byte> dev = device->allocate(4000);
  device->write(dev, std::vector<std::byte>(4000, std::byte{9}));
  wrong.add_device("t0", DType::kF32, {1000}, dev, device, nullptr, true);
  std::span<std::byte> dev1 = device->allocate(44);
  wrong.add_device("t1", DType::kF32, {11}, dev1, device, nullptr, true);
  expect_error_naming(ErrorCode::kInvalidArgument, "t1",
                      [&] { load_into(dir / "s.safetensors", wrong); });
  EXPECT_EQ(device->read(dev), std::vector<std::byte>(4000, std::byte{9}));
  EXPECT_EQ(device->counters().to_device, 0u);
}

TEST(DeviceState, ACorruptFileIsReportedNamingTheFileAndBlock) {
  auto device = FakeDevice::create(size_t{16} << 20);
  Twin twin(device, {300000});
  TempDir dir;
  auto cp = Checkpoint::from_directory((dir / "cp").string());
  Manifest m = save_checkpoint(twin.host_state, cp);
  const auto path = dir / "cp" / std::string(kStateFileName);
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(600000);
    f.put('\x7f');
  }
  LoadOptions whole;
  whole.expected_xxh3 = m.files.at(0).xxh3;
  expect_error_naming(ErrorCode::kCorruption, path.string(),
                      [&] { load_into(path, twin.device_state, whole); });
  LoadOptions blocks;
  blocks.expect(m.files.at(0));
  blocks.expected_xxh3.reset();
  const std::string message =
      error_message_of([&] { load_into(path, twin.device_state, blocks); }, ErrorCode::kCorruption);
  EXPECT_NE(message.find(path.string()), std::string::npos) << message;
  EXPECT_NE(message.find("block"), std::string::npos) << message;
}

TEST(DeviceState, AFailedDeviceCopyFailsTheSaveNamingTheDeviceAndCommitsNothing) {
  auto device = FakeDevice::create(size_t{16} << 20);
  Twin twin(device, {1000});
  TempDir dir;
  CheckpointManager manager(dir.str(), CheckpointConfig{});
  AsyncSaver saver;
  saver.save(twin.device_state, manager).wait();
  device->fail_copies(true);
  std::string m =
      error_message_of([&] { (void)saver.save(twin.device_state, manager); }, ErrorCode::kIO);
  EXPECT_NE(m.find("fake:0"), std::string::npos) << m;
  EXPECT_NE(m.find(manager.uri()), std::string::npos) << m;
  m = error_message_of([&] { save_file(twin.device_state, dir / "x.safetensors"); },
                       ErrorCode::kIO);
  EXPECT_NE(m.find("fake:0"), std::string::npos) << m;
  EXPECT_NE(m.find((dir / "x.safetensors").string()), std::string::npos) << m;
  EXPECT_FALSE(std::filesystem::exists(dir / "x.safetensors"));
  device->fail_copies(false);
  saver.save(twin.device_state, manager).wait();
  EXPECT_EQ(manager.history().size(), 2u);
}

TEST(DeviceState, StagedInMemoryCheckpointsCopyDeviceTensors) {
  auto device = FakeDevice::create(size_t{16} << 20);
  Twin twin(device, {2000, 3});
  StateStager stager;
  Checkpoint cp = stager.stage(twin.device_state);
  MappedState file = MappedState::open(cp.storage(), kStateFileName);
  EXPECT_EQ(tensor_bytes(file, "t0"), twin.host["t0"]);
  EXPECT_EQ(tensor_bytes(file, "t1"), twin.host["t1"]);
}

TEST(DeviceState, ShardedSavesAndLoadsOfDeviceShards) {
  auto device = FakeDevice::create(size_t{16} << 20);
  // Two ranks, each holding half the rows of an 8x100 F32 tensor.
  std::vector<std::vector<std::byte>> halves = {random_bytes(1600, 3), random_bytes(1600, 4)};
  std::vector<ShardedPart> parts;
  for (int r = 0; r < 2; ++r) {
    std::span<std::byte> dev = device->allocate(1600);
    device->write(dev, halves[r]);
    ShardedPart p;
    p.rank = r;
    p.state.add_device("w", DType::kF32, {4, 100}, dev, device, nullptr, true);
    p.specs["w"] = ShardSpec{{8, 100}, {static_cast<uint64_t>(4 * r), 0}};
    parts.push_back(std::move(p));
  }
  TempDir dir;
  auto cp = Checkpoint::from_directory((dir / "cp").string());
  AsyncSaver saver;
  saver.save_sharded(parts, cp).wait();
  // Read back whole into one device tensor.
  ShardedReader reader(cp);
  std::span<std::byte> whole = device->allocate(3200);
  StateDict target;
  target.add_device("w", DType::kF32, {8, 100}, whole, device, nullptr, true);
  reader.load(target, {});
  std::vector<std::byte> want = halves[0];
  want.insert(want.end(), halves[1].begin(), halves[1].end());
  EXPECT_EQ(device->read(whole), want);
}

TEST(DeviceState, DeviceViewsCannotBeReadOnTheCpu) {
  auto device = FakeDevice::create(1 << 20);
  Twin twin(device, {10});
  expect_error_naming(ErrorCode::kFailedPrecondition, "fake:0",
                      [&] { (void)twin.device_state.view("t0").as<float>(); });
  StateDict s;
  std::vector<std::byte> b(4);
  expect_invalid_argument([&] { s.add_device("x", DType::kF32, {1}, b, nullptr, nullptr, true); },
                          "x");
  EXPECT_TRUE(twin.device_state.has_device_entries());
  EXPECT_FALSE(twin.host_state.has_device_entries());
}

}  // namespace
}  // namespace cairn::testing
