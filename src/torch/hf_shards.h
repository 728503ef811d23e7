// Hugging Face's sharded weights layout, as pure functions (no I/O, no
// LibTorch): which tensors go into which shard, the shard and index file
// names, and the index file's JSON both ways.
//
//   model-00001-of-00002.safetensors, model-00002-of-00002.safetensors
//   model.safetensors.index.json:
//     {"metadata": {"total_size": 123}, "weight_map": {"fc.weight": "model-00001-of-00002..."}}
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace cairn::libtorch_internal {

// Tensors in state_dict order, split as huggingface_hub's
// split_torch_state_dict_into_shards (which transformers' save_pretrained
// uses) splits them, so that the same model gives the same files with the
// same names in each:
//   - a tensor larger than `max_shard_size` bytes gets a shard of its own,
//     listed at once, while the shard being filled stays open;
//   - otherwise the open shard is closed when the tensor would take it past
//     `max_shard_size`, and the tensor opens the next one;
//   - tensors with the same nonzero `storage_ids` entry (views of one
//     storage, tied weights) go into the shard of the first of them, and
//     only the first one's size counts.
// Returns the tensors' positions, shard by shard, in file order (none for no
// tensors). `storage_ids` may be empty (no storage shared).
std::vector<std::vector<size_t>> plan_shards(const std::vector<uint64_t>& sizes,
                                             uint64_t max_shard_size,
                                             const std::vector<uint64_t>& storage_ids = {});

// "model-00002-of-00005.safetensors" for k = 2 (1-based), n = 5 and
// weights_name "model.safetensors".
std::string shard_name(std::string_view weights_name, size_t k, size_t n);
// "model.safetensors.index.json".
std::string index_name(std::string_view weights_name);
// True for `weights_name`, its index, and any "<stem>-NNNNN-of-NNNNN<ext>".
bool is_weights_file(std::string_view name, std::string_view weights_name);

struct ShardIndex {
  uint64_t total_size = 0;
  std::map<std::string, std::string> weight_map;  // tensor name -> shard file
  // The shard files named, each once, in name order.
  std::vector<std::string> files() const;
};

// The index as transformers writes it (two-space indents, keys sorted).
std::string index_to_json(const ShardIndex& index);
// Parses an index. Throws cairn::Error(kCorruption) naming `source` when it
// is not JSON, has no "weight_map" object, maps a name to a non-string, or
// names a file that is not a plain file name in the same folder.
ShardIndex parse_index(std::string_view text, std::string_view source);

}  // namespace cairn::libtorch_internal
