// Hugging Face's sharded layout as pure functions: the shard plan, the file
// names and the index, without I/O.
#include "torch/hf_shards.h"

#include <gtest/gtest.h>

#include "cairn/error.h"

namespace cairn::libtorch_internal {
namespace {

using Plan = std::vector<std::vector<size_t>>;

TEST(HfShards, ShardsCloseBeforeTheTensorThatWouldOverflowThem) {
  EXPECT_EQ(plan_shards({4, 4, 4, 4}, 8), (Plan{{0, 1}, {2, 3}}));
  EXPECT_EQ(plan_shards({4, 4, 4}, 9), (Plan{{0, 1}, {2}}));
  EXPECT_EQ(plan_shards({1, 2, 3}, 100), (Plan{{0, 1, 2}}));
}

TEST(HfShards, ATensorLargerThanTheLimitGetsAShardOfItsOwnListedAtOnce) {
  // As huggingface_hub: the large tensor's shard comes first, and the shard
  // being filled stays open for the tensors after it.
  EXPECT_EQ(plan_shards({2, 50, 2}, 10), (Plan{{1}, {0, 2}}));
  EXPECT_EQ(plan_shards({2, 50, 9, 60, 1}, 10), (Plan{{1}, {0}, {3}, {2, 4}}));
  EXPECT_EQ(plan_shards({50}, 10), (Plan{{0}}));
  EXPECT_EQ(plan_shards({1, 1}, 0), (Plan{{0}, {1}}));
}

TEST(HfShards, TensorsSharingStorageGoWithTheFirstOfThemAndCountOnce) {
  // 0 and 2 share a storage: 2 joins 0's shard and takes no room.
  EXPECT_EQ(plan_shards({4, 4, 4}, 4, {7, 0, 7}), (Plan{{0, 2}, {1}}));
  EXPECT_EQ(plan_shards({4, 4, 4, 4}, 8, {0, 3, 3, 0}), (Plan{{0, 1, 2}, {3}}));
  EXPECT_EQ(plan_shards({4, 4, 4, 4}, 8), (Plan{{0, 1}, {2, 3}}));
}

TEST(HfShards, NoTensorsIsNoShard) { EXPECT_TRUE(plan_shards({}, 10).empty()); }

TEST(HfShards, NamesFollowTransformers) {
  EXPECT_EQ(shard_name("model.safetensors", 2, 5), "model-00002-of-00005.safetensors");
  EXPECT_EQ(shard_name("diffusion_pytorch_model.safetensors", 1, 12),
            "diffusion_pytorch_model-00001-of-00012.safetensors");
  EXPECT_EQ(index_name("model.safetensors"), "model.safetensors.index.json");
}

TEST(HfShards, WeightsFilesAreRecognizedAndOthersAreNot) {
  const std::string w = "model.safetensors";
  EXPECT_TRUE(is_weights_file("model.safetensors", w));
  EXPECT_TRUE(is_weights_file("model.safetensors.index.json", w));
  EXPECT_TRUE(is_weights_file("model-00001-of-00002.safetensors", w));
  EXPECT_FALSE(is_weights_file("model-0000a-of-00002.safetensors", w));
  EXPECT_FALSE(is_weights_file("model-00001.safetensors", w));
  EXPECT_FALSE(is_weights_file("optimizer.safetensors", w));
  EXPECT_FALSE(is_weights_file("model-00001-of-00002.bin", w));
  EXPECT_FALSE(is_weights_file("config.json", w));
}

TEST(HfShards, IndexRoundTripsAndListsEachFileOnce) {
  ShardIndex index;
  index.total_size = 1234;
  index.weight_map = {{"a.weight", "model-00001-of-00002.safetensors"},
                      {"b.weight", "model-00002-of-00002.safetensors"},
                      {"a.bias", "model-00001-of-00002.safetensors"}};
  const std::string text = index_to_json(index);
  EXPECT_NE(text.find("\"total_size\": 1234"), std::string::npos) << text;
  ShardIndex back = parse_index(text, "idx");
  EXPECT_EQ(back.total_size, 1234u);
  EXPECT_EQ(back.weight_map, index.weight_map);
  EXPECT_EQ(back.files(), (std::vector<std::string>{"model-00001-of-00002.safetensors",
                                                    "model-00002-of-00002.safetensors"}));
}

TEST(HfShards, MalformedIndexesAreCorruptionNamingTheSource) {
  for (const char* text :
       {"not json", "[]", "{}", R"({"weight_map": []})", R"({"weight_map": {"a": 3}})",
        R"({"weight_map": {"a": "../x"}})", R"({"weight_map": {"a": "sub/x.safetensors"}})",
        R"({"weight_map": {"a": ""}})"}) {
    try {
      parse_index(text, "dir/model.safetensors.index.json");
      ADD_FAILURE() << "accepted " << text;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kCorruption) << text;
      EXPECT_NE(std::string(e.what()).find("dir/model.safetensors.index.json"), std::string::npos)
          << e.what();
    }
  }
}

TEST(HfShards, AnIndexWithoutMetadataStillLoads) {
  ShardIndex index = parse_index(R"({"weight_map": {"w": "m.safetensors"}})", "idx");
  EXPECT_EQ(index.total_size, 0u);
  EXPECT_EQ(index.files(), std::vector<std::string>{"m.safetensors"});
}

}  // namespace
}  // namespace cairn::libtorch_internal
