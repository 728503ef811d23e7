// LibTorch adapter (include/cairn/torch.h): weights alone, as PyTorch's
// load_state_dict and Hugging Face's save_pretrained/from_pretrained.
//
// Loading checks every tensor of every file first (names across shards,
// shapes, dtypes) and changes nothing on an error; only then are bytes
// copied, converted where asked.
#include <cstring>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>

#include "adapter_tensors.h"
#include "cairn/error.h"
#include "cairn/storage.h"
#include "cairn/torch.h"
#include "hf_shards.h"

namespace cairn::libtorch {
namespace {

using namespace libtorch_internal;  // NOLINT: the adapter's own internals

// The prefixes this adapter's file records ("cairn.torch" metadata), or
// nothing for a file from another writer.
struct Recorded {
  std::string model, optim, rng;
  bool present = false;
};

Recorded recorded_prefixes(const MappedState& file) {
  Recorded r;
  auto it = file.header().metadata.find("cairn.metadata");
  if (it == file.header().metadata.end()) return r;
  nlohmann::json meta = file.metadata();
  auto tm = meta.find("cairn.torch");
  if (tm == meta.end() || !tm->is_object()) return r;
  auto get = [&](const char* key) {
    auto v = tm->find(key);
    return v != tm->end() && v->is_string() ? v->get<std::string>() : std::string();
  };
  r.model = get("model_prefix");
  r.optim = get("optim_prefix");
  r.rng = get("rng_prefix");
  r.present = true;
  return r;
}

struct Source {
  size_t file;
  const TensorInfo* info;
};

LoadStateReport load_from(const std::vector<MappedState>& files, torch::nn::Module& module,
                          const LoadStateOptions& options) {
  LoadStateReport report;
  if (files.empty()) return report;
  report.metadata = files.front().header().metadata;

  // Every file tensor by name; the adapter's optimizer and generator entries
  // set aside.
  std::map<std::string, Source> by_name;
  std::string prefix = options.prefix.value_or("");
  for (size_t f = 0; f < files.size(); ++f) {
    const Recorded rec = recorded_prefixes(files[f]);
    if (f == 0 && !options.prefix && rec.present) prefix = rec.model;
    for (const TensorInfo& info : files[f].header().tensors) {
      if (rec.present && (has_prefix(info.name, rec.optim) || has_prefix(info.name, rec.rng))) {
        continue;
      }
      auto [it, inserted] = by_name.emplace(info.name, Source{f, &info});
      if (!inserted) {
        throw Error(ErrorCode::kCorruption,
                    fmt::format("tensor {} is in both {} and {}", info.name,
                                files[it->second.file].source(), files[f].source()));
      }
    }
  }

  struct Copy {
    torch::Tensor target;
    Source source;
  };
  std::vector<Copy> copies;
  std::vector<std::string> problems;
  std::set<std::string> claimed;
  for (const auto& [name, t] : module_tensors(module)) {
    const std::string full = join(prefix, name);
    check_tensor(t, name);
    auto it = by_name.find(full);
    if (it == by_name.end()) {
      report.missing_keys.push_back(name);
      continue;
    }
    claimed.insert(full);
    const TensorInfo& info = *it->second.info;
    const DType here = *to_cairn(t.scalar_type());
    const std::string where = files[it->second.file].source();
    if (info.shape != shape_of(t)) {
      problems.push_back(fmt::format("{} is {} in {} but {} in the module", full,
                                     shape_str(info.dtype, info.shape), where,
                                     shape_str(here, shape_of(t))));
      continue;
    }
    if (info.dtype != here) {
      if (!options.convert_dtype || !to_torch(info.dtype)) {
        problems.push_back(fmt::format("{} is {} in {} but {} in the module{}", full,
                                       dtype_name(info.dtype), where, dtype_name(here),
                                       options.convert_dtype ? " (no conversion from it)"
                                                             : " (set convert_dtype to convert)"));
        continue;
      }
      report.converted_keys.push_back(name);
    }
    copies.push_back({t, it->second});
  }
  for (const auto& [name, source] : by_name) {
    if (!claimed.count(name)) report.unexpected_keys.push_back(name);
  }
  if (options.strict) {
    for (const std::string& name : report.missing_keys) {
      problems.push_back(fmt::format("{} is missing from the file", join(prefix, name)));
    }
    for (const std::string& name : report.unexpected_keys) {
      problems.push_back(fmt::format("{} is in the file but not in the module", name));
    }
  }
  if (!problems.empty()) {
    std::string msg =
        "loading weights from " + files.front().source() +
        (files.size() > 1 ? fmt::format(" and {} more files", files.size() - 1) : "") + ": ";
    for (size_t i = 0; i < problems.size(); ++i) msg += (i ? "; " : "") + problems[i];
    throw Error(ErrorCode::kInvalidArgument, msg);
  }

  torch::NoGradGuard no_grad;
  for (Copy& c : copies) {
    TensorView v = files[c.source.file].tensor(c.source.info->name);
    if (c.source.info->dtype == *to_cairn(c.target.scalar_type()) && c.target.is_contiguous()) {
      copy_into(c.target, v);
      continue;
    }
    // Through an aligned tensor of the file's dtype; copy_ converts.
    torch::Tensor staged = empty_for(c.source.info->dtype, c.source.info->shape);
    std::memcpy(staged.data_ptr(), v.bytes.data(), v.bytes.size());
    c.target.copy_(staged);
  }
  return report;
}

// "s3://b/x/model.safetensors" -> {"s3://b/x", "model.safetensors"}.
std::pair<std::string, std::string> split_last(std::string_view uri) {
  std::string_view trimmed = uri;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.remove_suffix(1);
  const size_t slash = trimmed.rfind('/');
  if (slash == std::string_view::npos) return {".", std::string(trimmed)};
  return {std::string(trimmed.substr(0, slash == 0 ? 1 : slash)),
          std::string(trimmed.substr(slash + 1))};
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

LoadStateReport load_state_dict(const MappedState& file, torch::nn::Module& module,
                                const LoadStateOptions& options) {
  return load_from({file}, module, options);
}

std::vector<std::string> save_pretrained(std::string_view directory_or_uri,
                                         torch::nn::Module& module,
                                         const PretrainedOptions& options) {
  validate_key(options.weights_name);
  if (options.weights_name.find('/') != std::string::npos) {
    throw Error(ErrorCode::kInvalidArgument, "save_pretrained: weights_name \"" +
                                                 options.weights_name + "\" is not a file name");
  }
  std::shared_ptr<Storage> storage = open_storage(directory_or_uri);
  const auto tensors = module_tensors(module);
  std::vector<uint64_t> sizes;
  std::vector<uint64_t> storages;
  for (const auto& [name, t] : tensors) {
    check_tensor(t, name);
    sizes.push_back(static_cast<uint64_t>(t.numel()) * static_cast<uint64_t>(t.element_size()));
    storages.push_back(storage_id(t));
  }
  const auto shards = plan_shards(sizes, options.max_shard_size, storages);
  const size_t n = std::max<size_t>(shards.size(), 1);

  std::vector<std::string> written;
  ShardIndex index;
  for (size_t k = 0; k < n; ++k) {
    const std::string file =
        n == 1 ? options.weights_name : shard_name(options.weights_name, k + 1, n);
    StateDict state;
    state.string_metadata = options.metadata;
    state.string_metadata["format"] = "pt";
    if (k < shards.size()) {
      for (size_t i : shards[k]) {
        add_tensor(state, tensors[i].first, tensors[i].second);
        index.weight_map[tensors[i].first] = file;
        index.total_size += sizes[i];
      }
    }
    save(state, *storage, file, options.write);
    written.push_back(file);
  }
  if (n > 1) {
    const std::string name = index_name(options.weights_name);
    const std::string text = index_to_json(index);
    auto writer = storage->open_writer(name);
    writer->append(std::as_bytes(std::span(text.data(), text.size())));
    writer->commit();
    written.push_back(name);
  }
  // Weights files of an earlier save that this one does not use. A single
  // file's stale index goes first: loaders prefer an index.
  std::vector<std::string> stale;
  const std::string old_index = index_name(options.weights_name);
  if (n == 1 && storage->exists(old_index)) stale.push_back(old_index);
  const std::set<std::string> keep(written.begin(), written.end());
  for (const std::string& name : storage->list_names("")) {  // one level; folders end in '/'
    if (is_weights_file(name, options.weights_name) && !keep.count(name) && name != old_index) {
      stale.push_back(name);
    }
  }
  for (const std::string& key : stale) storage->remove(key);
  return written;
}

LoadStateReport load_pretrained(std::string_view path_or_uri, torch::nn::Module& module,
                                const LoadStateOptions& options, std::string_view weights_name) {
  std::vector<MappedState> files;
  if (ends_with(path_or_uri, ".safetensors")) {
    auto [parent, name] = split_last(path_or_uri);
    std::shared_ptr<Storage> storage = open_storage(parent);
    files.push_back(MappedState::open(*storage, name));
    return load_from(files, module, options);
  }
  std::shared_ptr<Storage> storage = open_storage(path_or_uri);
  const std::string index_key = index_name(weights_name);
  if (storage->exists(index_key)) {
    const std::string where = storage->uri() + "/" + index_key;
    const ShardIndex index = parse_index(storage->get(index_key), where);
    for (const std::string& file : index.files()) {
      if (!storage->exists(file)) {
        throw Error(ErrorCode::kCorruption,
                    fmt::format("{}: names shard {}, which does not exist", where, file));
      }
      files.push_back(MappedState::open(*storage, file));
    }
    // The index and the shards must agree on where each tensor is.
    const auto shard_files = index.files();
    for (const auto& [tensor, file] : index.weight_map) {
      const size_t f = static_cast<size_t>(
          std::lower_bound(shard_files.begin(), shard_files.end(), file) - shard_files.begin());
      if (!files[f].contains(tensor)) {
        throw Error(ErrorCode::kCorruption,
                    fmt::format("{}: maps {} to {}, which does not hold it", where, tensor, file));
      }
    }
  } else if (storage->exists(weights_name)) {
    files.push_back(MappedState::open(*storage, weights_name));
  } else {
    throw Error(ErrorCode::kNotFound, fmt::format("{}: holds neither {} nor {}", storage->uri(),
                                                  index_key, weights_name));
  }
  return load_from(files, module, options);
}

}  // namespace cairn::libtorch
