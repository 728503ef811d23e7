// Weights alone, PyTorch / Hugging Face style: load_state_dict strict or not
// with its report, dtype conversion, prefixes, and save_pretrained /
// load_pretrained with Hugging Face's sharded layout both ways.
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "cairn/error.h"
#include "cairn/torch.h"
#include "support/temp_dir.h"
#include "torch/torch_support.h"

namespace cairn::libtorch {
namespace {

namespace fs = std::filesystem;

// A plain safetensors state dict of `tensors`, as another writer would make.
void write_plain(const fs::path& file,
                 const std::vector<std::pair<std::string, torch::Tensor>>& tensors) {
  StateDict state;
  for (const auto& [name, t] : tensors) {
    torch::Tensor c = t.contiguous();
    std::vector<std::byte> bytes(static_cast<size_t>(c.numel() * c.element_size()));
    std::memcpy(bytes.data(), c.data_ptr(), bytes.size());
    Shape shape(c.sizes().begin(), c.sizes().end());
    DType dtype = c.scalar_type() == torch::kFloat64    ? DType::kF64
                  : c.scalar_type() == torch::kInt64    ? DType::kI64
                  : c.scalar_type() == torch::kBFloat16 ? DType::kBF16
                                                        : DType::kF32;
    state.add_owned(name, dtype, shape, std::move(bytes));
  }
  cairn::save_file(state, file);
}

std::vector<std::pair<std::string, torch::Tensor>> tensors_of(Net& net) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& item : net->named_parameters()) out.emplace_back(item.key(), item.value());
  for (const auto& item : net->named_buffers()) out.emplace_back(item.key(), item.value());
  return out;
}

class PretrainedTest : public ::testing::Test {
 protected:
  void SetUp() override { torch::set_num_threads(1); }
  cairn::testing::TempDir dir_;
};

TEST_F(PretrainedTest, APlainStateDictFromAnotherWriterLoadsStrictly) {
  Net a = make_net(1);
  const auto file = dir_ / "plain.safetensors";
  write_plain(file, tensors_of(a));
  Net b = make_net(2);
  LoadStateReport r = load_state_dict(MappedState::open(file), *b);
  EXPECT_TRUE(r.missing_keys.empty());
  EXPECT_TRUE(r.unexpected_keys.empty());
  expect_same_module(a, b);
}

TEST_F(PretrainedTest, NonStrictLoadReportsMissingAndUnexpectedAndLoadsTheRest) {
  Net a = make_net(1);
  auto tensors = tensors_of(a);
  std::erase_if(tensors, [](const auto& p) { return p.first.rfind("fc2.", 0) == 0; });
  tensors.emplace_back("lm_head.weight", torch::ones({3, 3}));
  const auto file = dir_ / "partial.safetensors";
  write_plain(file, tensors);

  Net b = make_net(2);
  const torch::Tensor fc2_before = b->fc2->weight.clone();
  // Strict: an error naming both kinds, and nothing changed.
  try {
    load_state_dict(MappedState::open(file), *b);
    FAIL() << "strict load of a partial file";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("fc2.weight is missing"), std::string::npos) << msg;
    EXPECT_NE(msg.find("lm_head.weight is in the file but not in the module"), std::string::npos)
        << msg;
    EXPECT_NE(msg.find(file.string()), std::string::npos) << msg;
  }
  EXPECT_FALSE(bits_equal(a->fc1->weight, b->fc1->weight));

  LoadStateReport r = load_state_dict(MappedState::open(file), *b, {.strict = false});
  EXPECT_EQ(r.missing_keys, (std::vector<std::string>{"fc2.weight", "fc2.bias"}));
  EXPECT_EQ(r.unexpected_keys, std::vector<std::string>{"lm_head.weight"});
  EXPECT_TRUE(bits_equal(a->fc1->weight, b->fc1->weight));
  EXPECT_TRUE(bits_equal(a->bn->running_mean, b->bn->running_mean));
  EXPECT_TRUE(bits_equal(fc2_before, b->fc2->weight));
}

TEST_F(PretrainedTest, AShapeMismatchIsAnErrorEvenWhenNotStrict) {
  Net a = make_net(1, /*hidden=*/32);
  const auto file = dir_ / "wide.safetensors";
  write_plain(file, tensors_of(a));
  Net b = make_net(2, /*hidden=*/16);
  try {
    load_state_dict(MappedState::open(file), *b, {.strict = false});
    FAIL() << "shape mismatch";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fc1.weight is F32[32, 8]"), std::string::npos)
        << e.what();
  }
}

TEST_F(PretrainedTest, OtherDtypesLoadOnlyWhenConversionIsAsked) {
  Net a = make_net(1);
  auto tensors = tensors_of(a);
  for (auto& [name, t] : tensors) {
    if (t.scalar_type() == torch::kFloat32) t = t.to(torch::kBFloat16);
  }
  const auto file = dir_ / "bf16.safetensors";
  write_plain(file, tensors);
  Net b = make_net(2);
  try {
    load_state_dict(MappedState::open(file), *b);
    FAIL() << "BF16 into F32 without conversion";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fc1.weight is BF16"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("convert_dtype"), std::string::npos) << e.what();
  }
  LoadStateReport r = load_state_dict(MappedState::open(file), *b, {.convert_dtype = true});
  EXPECT_FALSE(r.converted_keys.empty());
  EXPECT_TRUE(
      torch::equal(b->fc1->weight, a->fc1->weight.to(torch::kBFloat16).to(torch::kFloat32)));
  EXPECT_TRUE(bits_equal(b->bn->num_batches_tracked, a->bn->num_batches_tracked));
}

TEST_F(PretrainedTest, APrefixMapsTheFilesNamesToTheModules) {
  Net a = make_net(1);
  auto tensors = tensors_of(a);
  for (auto& [name, t] : tensors) name = "model." + name;
  const auto file = dir_ / "prefixed.safetensors";
  write_plain(file, tensors);
  Net b = make_net(2);
  LoadStateReport r = load_state_dict(MappedState::open(file), *b, {.prefix = "model"});
  EXPECT_TRUE(r.missing_keys.empty());
  expect_same_module(a, b);
}

TEST_F(PretrainedTest, AFullTrainingStateLoadsAsWeightsWithoutItsOptimizerEntries) {
  Net a = make_net(1);
  torch::optim::Adam adam(a->parameters());
  adam.zero_grad();
  torch::mse_loss(a->forward(torch::randn({4, 8})), torch::randn({4, 4})).backward();
  adam.step();
  const auto file = dir_ / "full.safetensors";
  save_file(file, *a, {&adam, nullptr, true});
  Net b = make_net(2);
  LoadStateReport r = load_state_dict(MappedState::open(file), *b);
  EXPECT_TRUE(r.unexpected_keys.empty());
  EXPECT_EQ(r.metadata.at("format"), "pt");
  expect_same_module(a, b);
}

TEST_F(PretrainedTest, SavePretrainedWritesOneFileWhenItFits) {
  Net a = make_net(1);
  const auto out = dir_ / "out";
  auto files = save_pretrained(out.string(), *a);
  EXPECT_EQ(files, std::vector<std::string>{"model.safetensors"});
  EXPECT_FALSE(fs::exists(out / "model.safetensors.index.json"));
  MappedState m = MappedState::open(out / "model.safetensors");
  EXPECT_EQ(m.header().metadata.at("format"), "pt");
  EXPECT_TRUE(m.contains("fc1.weight"));
  Net b = make_net(2);
  load_pretrained(out.string(), *b);
  expect_same_module(a, b);
  Net c = make_net(3);
  load_pretrained((out / "model.safetensors").string(), *c);
  expect_same_module(a, c);
}

TEST_F(PretrainedTest, ShardsAndAnIndexRoundTripAndStaleFilesGo) {
  Net a = make_net(1);
  const auto out = dir_ / "out";
  // fc1.weight is 16*8*4 = 512 bytes: shards of at most 400 bytes.
  auto files = save_pretrained(out.string(), *a, {.max_shard_size = 400});
  ASSERT_GT(files.size(), 2u);
  EXPECT_EQ(files.back(), "model.safetensors.index.json");
  const size_t n = files.size() - 1;
  EXPECT_EQ(files[0], "model-00001-of-0000" + std::to_string(n) + ".safetensors");
  const std::string index = cairn::testing::read_text(out / "model.safetensors.index.json");
  EXPECT_NE(index.find("\"weight_map\""), std::string::npos);
  EXPECT_NE(index.find("\"total_size\""), std::string::npos);

  Net b = make_net(2);
  LoadStateReport r = load_pretrained(out.string(), *b);
  EXPECT_TRUE(r.missing_keys.empty() && r.unexpected_keys.empty());
  expect_same_module(a, b);

  // Saving again unsharded removes the index and the shards.
  save_pretrained(out.string(), *a);
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(out)) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"model.safetensors"});
}

TEST_F(PretrainedTest, AFolderWithoutWeightsOrWithABrokenIndexNamesWhatIsWrong) {
  const auto empty = dir_ / "empty";
  fs::create_directories(empty);
  Net b = make_net(2);
  try {
    load_pretrained(empty.string(), *b);
    FAIL() << "no weights";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
    EXPECT_NE(std::string(e.what()).find("model.safetensors"), std::string::npos) << e.what();
  }

  Net a = make_net(1);
  const auto out = dir_ / "out";
  auto files = save_pretrained(out.string(), *a, {.max_shard_size = 400});
  fs::remove(out / files[1]);
  try {
    load_pretrained(out.string(), *b);
    FAIL() << "a missing shard";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruption);
    EXPECT_NE(std::string(e.what()).find(files[1]), std::string::npos) << e.what();
  }
}

TEST_F(PretrainedTest, ShardsSaveToAndLoadFromAnyStorageUri) {
  Net a = make_net(1);
  save_pretrained("memory://pretrained/run", *a, {.max_shard_size = 400});
  Net b = make_net(2);
  load_pretrained("memory://pretrained/run", *b);
  expect_same_module(a, b);
}

}  // namespace
}  // namespace cairn::libtorch
