// BasicVariantGenerator: the grid repeated num_samples times, random domains
// sampled per trial from an Rng seeded from (seed, trial index).
#include <charconv>
#include <limits>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "cairn/error.h"
#include "cairn/tune.h"

namespace cairn::tune {

using nlohmann::json;

namespace {

constexpr const char* kSearcherName = "basic_variant";
constexpr int kStateVersion = 1;

[[noreturn]] void invalid(std::string_view what) {
  throw Error(ErrorCode::kInvalidArgument, fmt::format("BasicVariantGenerator: {}", what));
}

[[noreturn]] void bad_state(std::string_view what) {
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("BasicVariantGenerator: restoring state: {}", what));
}

// SplitMix64's output function: a bijection that spreads every input bit.
std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::size_t checked_total(const ParamSpace& space, std::size_t num_samples) {
  if (num_samples == 0) invalid("num_samples must be at least 1");
  if (space.grid_size() > std::numeric_limits<std::size_t>::max() / num_samples) {
    invalid(fmt::format("{} grid points x {} samples is more trials than can be counted",
                        space.grid_size(), num_samples));
  }
  return space.grid_size() * num_samples;
}

// Parsed JSON holds a non-negative integer as unsigned, one built in code
// (state["next"] = 3) as signed: both are accepted.
bool is_count(const json& v) {
  return v.is_number_unsigned() || (v.is_number_integer() && v.get<std::int64_t>() >= 0);
}

std::size_t size_field(const json& state, const char* field) {
  if (!state.contains(field) || !is_count(state[field])) {
    bad_state(fmt::format("'{}' must be a non-negative integer", field));
  }
  return state[field].get<std::size_t>();
}

}  // namespace

BasicVariantGenerator::BasicVariantGenerator(ParamSpace space, std::size_t num_samples,
                                             std::uint64_t seed)
    : space_(std::move(space)),
      num_samples_(num_samples),
      seed_(seed),
      total_(checked_total(space_, num_samples)) {}

Variant BasicVariantGenerator::variant(std::size_t index) const {
  if (index >= total_) {
    invalid(fmt::format("trial index {} out of range (the experiment has {})", index, total_));
  }
  Rng rng(mix(mix(seed_) ^ static_cast<std::uint64_t>(index)));
  return Variant{index, space_.resolve(index % space_.grid_size(), rng)};
}

std::optional<Variant> BasicVariantGenerator::next() {
  if (next_ >= total_) return std::nullopt;
  Variant v = variant(next_);
  ++next_;
  return v;
}

std::optional<json> BasicVariantGenerator::suggest(const std::string& trial_id) {
  if (live_.contains(trial_id)) {
    invalid(fmt::format("trial '{}' was already suggested and has not completed", trial_id));
  }
  std::optional<Variant> v = next();
  if (!v) return std::nullopt;
  live_.emplace(trial_id, v->index);
  return std::move(v->config);
}

void BasicVariantGenerator::on_trial_complete(const std::string& trial_id, const json& /*result*/,
                                              bool /*error*/) {
  if (live_.erase(trial_id) == 0) {
    invalid(fmt::format("on_trial_complete: unknown trial '{}'", trial_id));
  }
}

json BasicVariantGenerator::save() const {
  json live = json::object();
  for (const auto& [id, index] : live_) live[id] = index;
  // The seed is a decimal string: JSON readers other than nlohmann's often
  // hold numbers as doubles, which cannot carry 64 bits.
  return json{{"searcher", kSearcherName},     {"version", kStateVersion},
              {"seed", std::to_string(seed_)}, {"num_samples", num_samples_},
              {"space", space_.spec()},        {"next", next_},
              {"live", std::move(live)}};
}

void BasicVariantGenerator::restore(const json& state) {
  if (!state.is_object()) bad_state("not a JSON object");
  if (state.value("searcher", json()) != kSearcherName) {
    bad_state(fmt::format("not a {} searcher's state", kSearcherName));
  }
  if (state.value("version", json()) != kStateVersion) {
    bad_state(fmt::format("unsupported version {}", state.value("version", json()).dump()));
  }
  if (!state.contains("space") || state["space"] != space_.spec()) {
    bad_state("saved with a different search space");
  }
  if (size_field(state, "num_samples") != num_samples_) {
    bad_state(fmt::format("saved with num_samples {}, this searcher has {}",
                          state["num_samples"].dump(), num_samples_));
  }
  if (!state.contains("seed") || !state["seed"].is_string()) bad_state("'seed' must be a string");
  const std::string& text = state["seed"].get_ref<const std::string&>();
  std::uint64_t seed = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), seed);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) {
    bad_state(fmt::format("'seed' is not a 64-bit unsigned decimal: '{}'", text));
  }
  std::size_t next = size_field(state, "next");
  if (next > total_) bad_state(fmt::format("'next' {} exceeds the {} trials", next, total_));
  if (!state.contains("live") || !state["live"].is_object()) bad_state("'live' must be an object");
  std::map<std::string, std::size_t> live;
  for (const auto& [id, index] : state["live"].items()) {
    if (!is_count(index) || index.get<std::size_t>() >= next) {
      bad_state(
          fmt::format("live trial '{}' has index {}, not one already suggested", id, index.dump()));
    }
    live.emplace(id, index.get<std::size_t>());
  }
  seed_ = seed;
  next_ = next;
  live_ = std::move(live);
}

}  // namespace cairn::tune
