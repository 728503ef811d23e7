// Search-space domains, their validation, and sampling from a ParamSpace.
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <numbers>
#include <stdexcept>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "cairn/error.h"
#include "cairn/tune.h"
#include "tune/domain.h"

namespace cairn::tune {

using nlohmann::json;

namespace {

[[noreturn]] void invalid(const std::string& path, std::string_view what) {
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("search space: {}: {}", path.empty() ? "(root)" : path, what));
}

// "model/layers" for the pointer /model/layers.
std::string path_of(const json::json_pointer& pointer) {
  std::string s = pointer.to_string();
  return s.empty() ? s : s.substr(1);
}

json tagged(const char* kind) { return json{{kDomainTag, kind}}; }

}  // namespace

namespace internal {

bool is_domain(const json& value) { return value.is_object() && value.contains(kDomainTag); }

bool contains_domain(const json& value, std::string_view kind) {
  if (is_domain(value)) return kind.empty() || value[kDomainTag] == kind;
  if (value.is_structured()) {
    for (const auto& item : value) {
      if (contains_domain(item, kind)) return true;
    }
  }
  return false;
}

}  // namespace internal

namespace {

using internal::contains_domain;
using internal::is_domain;

void check_fields(const json& domain, const std::string& path,
                  std::initializer_list<std::string_view> fields) {
  for (const auto& [key, value] : domain.items()) {
    if (key == kDomainTag) continue;
    bool known = false;
    for (auto field : fields) known = known || key == field;
    if (!known) {
      invalid(path, fmt::format("{} domain has no field '{}'",
                                domain[kDomainTag].get<std::string>(), key));
    }
  }
  for (auto field : fields) {
    if (!domain.contains(field)) {
      invalid(path, fmt::format("{} domain lacks field '{}'", domain[kDomainTag].get<std::string>(),
                                field));
    }
  }
}

double finite_number(const json& domain, const char* field, const std::string& path) {
  const json& v = domain.at(field);
  if (!v.is_number()) invalid(path, fmt::format("'{}' must be a number, not {}", field, v.dump()));
  double d = v.get<double>();
  if (!std::isfinite(d)) invalid(path, fmt::format("'{}' must be finite", field));
  return d;
}

std::int64_t integer(const json& domain, const char* field, const std::string& path) {
  const json& v = domain.at(field);
  if (v.is_number_unsigned()) {
    if (v.get<std::uint64_t>() >
        static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      invalid(path, fmt::format("'{}' does not fit in a 64-bit signed integer", field));
    }
    return static_cast<std::int64_t>(v.get<std::uint64_t>());
  }
  if (!v.is_number_integer()) {
    invalid(path, fmt::format("'{}' must be an integer, not {}", field, v.dump()));
  }
  return v.get<std::int64_t>();
}

// The first and last k with k * q in [lo, hi] (q > 0); first > last when
// there is none.
std::pair<std::int64_t, std::int64_t> multiples_in(std::int64_t lo, std::int64_t hi,
                                                   std::int64_t q) {
  auto floor_div = [](std::int64_t a, std::int64_t b) {
    return a / b - ((a % b != 0) && ((a < 0) != (b < 0)));
  };
  return {-floor_div(-lo, q), floor_div(hi, q)};
}

double sample_double(double lo, double hi, double u) {
  double v = lo + (hi - lo) * u;
  if (v < lo) v = lo;
  if (v >= hi) v = std::nextafter(hi, lo);
  return v;
}

}  // namespace

namespace internal {

bool validate_domain(const json& domain, const std::string& path) {
  const json& tag = domain[kDomainTag];
  if (!tag.is_string()) invalid(path, fmt::format("'{}' must be a string", kDomainTag));
  const std::string kind = tag.get<std::string>();
  if (kind == "grid_search" || kind == "choice") {
    check_fields(domain, path, {"values"});
    const json& values = domain["values"];
    if (!values.is_array()) invalid(path, fmt::format("{} values must be an array", kind));
    if (values.empty()) invalid(path, fmt::format("{} needs at least one value", kind));
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (contains_domain(values[i])) {
        invalid(path, fmt::format("{} value {} holds a domain; values must be constants", kind, i));
      }
    }
    return kind == "grid_search";
  }
  if (kind == "uniform" || kind == "loguniform") {
    check_fields(domain, path, {"lo", "hi"});
    double lo = finite_number(domain, "lo", path);
    double hi = finite_number(domain, "hi", path);
    if (!(lo < hi)) invalid(path, fmt::format("{} needs lo < hi, got [{}, {})", kind, lo, hi));
    if (!std::isfinite(hi - lo))
      invalid(path, fmt::format("{} range [{}, {}) is too wide", kind, lo, hi));
    if (kind == "loguniform" && !(lo > 0)) {
      invalid(path, fmt::format("loguniform needs lo > 0, got {}", lo));
    }
    return false;
  }
  if (kind == "randint") {
    check_fields(domain, path, {"lo", "hi"});
    std::int64_t lo = integer(domain, "lo", path);
    std::int64_t hi = integer(domain, "hi", path);
    if (!(lo < hi)) {
      invalid(path, fmt::format("randint needs lo < hi (hi is exclusive), got [{}, {})", lo, hi));
    }
    return false;
  }
  if (kind == "sample_from") {
    check_fields(domain, path, {"fn"});
    const json& fn = domain["fn"];
    if (!fn.is_string() || fn.get_ref<const std::string&>().empty()) {
      invalid(path, "sample_from 'fn' must be a non-empty string (its function's name)");
    }
    return false;
  }
  if (kind == "quniform") {
    check_fields(domain, path, {"lo", "hi", "q"});
    double lo = finite_number(domain, "lo", path);
    double hi = finite_number(domain, "hi", path);
    double q = finite_number(domain, "q", path);
    if (!(lo < hi)) invalid(path, fmt::format("quniform needs lo < hi, got [{}, {}]", lo, hi));
    if (!std::isfinite(hi - lo))
      invalid(path, fmt::format("quniform range [{}, {}] is too wide", lo, hi));
    if (!(q > 0)) invalid(path, fmt::format("quniform needs q > 0, got {}", q));
    if (std::ceil(lo / q) > std::floor(hi / q)) {
      invalid(path, fmt::format("quniform: no multiple of {} lies in [{}, {}]", q, lo, hi));
    }
    return false;
  }
  if (kind == "qloguniform") {
    check_fields(domain, path, {"lo", "hi", "q"});
    double lo = finite_number(domain, "lo", path);
    double hi = finite_number(domain, "hi", path);
    double q = finite_number(domain, "q", path);
    if (!(lo > 0)) invalid(path, fmt::format("qloguniform needs lo > 0, got {}", lo));
    if (!(lo < hi)) invalid(path, fmt::format("qloguniform needs lo < hi, got [{}, {}]", lo, hi));
    if (!(q > 0)) invalid(path, fmt::format("qloguniform needs q > 0, got {}", q));
    if (std::ceil(lo / q) > std::floor(hi / q)) {
      invalid(path, fmt::format("qloguniform: no multiple of {} lies in [{}, {}]", q, lo, hi));
    }
    return false;
  }
  if (kind == "qrandint" || kind == "qlograndint") {
    check_fields(domain, path, {"lo", "hi", "q"});
    std::int64_t lo = integer(domain, "lo", path);
    std::int64_t hi = integer(domain, "hi", path);
    std::int64_t q = integer(domain, "q", path);
    if (!(lo <= hi)) {
      invalid(path, fmt::format("{} needs lo <= hi (hi is inclusive), got [{}, {}]", kind, lo, hi));
    }
    if (!(q > 0)) invalid(path, fmt::format("{} needs q > 0, got {}", kind, q));
    if (kind == "qlograndint" && !(lo > 0)) {
      invalid(path, fmt::format("qlograndint needs lo > 0, got {}", lo));
    }
    if (multiples_in(lo, hi, q).first > multiples_in(lo, hi, q).second) {
      invalid(path, fmt::format("{}: no multiple of {} lies in [{}, {}]", kind, q, lo, hi));
    }
    return false;
  }
  if (kind == "lograndint") {
    check_fields(domain, path, {"lo", "hi"});
    std::int64_t lo = integer(domain, "lo", path);
    std::int64_t hi = integer(domain, "hi", path);
    if (!(lo > 0)) invalid(path, fmt::format("lograndint needs lo > 0, got {}", lo));
    if (!(lo < hi)) {
      invalid(path,
              fmt::format("lograndint needs lo < hi (hi is exclusive), got [{}, {})", lo, hi));
    }
    return false;
  }
  if (kind == "randn" || kind == "qrandn") {
    const bool quantized = kind == "qrandn";
    if (quantized) {
      check_fields(domain, path, {"mean", "sd", "q"});
    } else {
      check_fields(domain, path, {"mean", "sd"});
    }
    finite_number(domain, "mean", path);
    double sd = finite_number(domain, "sd", path);
    if (!(sd > 0)) invalid(path, fmt::format("{} needs sd > 0, got {}", kind, sd));
    if (quantized && !(finite_number(domain, "q", path) > 0)) {
      invalid(path, fmt::format("qrandn needs q > 0, got {}", domain["q"].dump()));
    }
    return false;
  }
  invalid(path, fmt::format("unknown domain '{}'", kind));
}

json sample_domain(const json& domain, Rng& rng) {
  const std::string& kind = domain[kDomainTag].get_ref<const std::string&>();
  if (kind == "sample_from") {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("sample_from('{}') is computed by its function within a search space; "
                            "it cannot be drawn on its own",
                            domain["fn"].get<std::string>()));
  }
  if (kind == "choice") {
    const json& values = domain["values"];
    return values[static_cast<std::size_t>(draw_below(rng, values.size()))];
  }
  if (kind == "randint") {
    auto lo = domain["lo"].get<std::int64_t>();
    auto hi = domain["hi"].get<std::int64_t>();
    std::uint64_t span = static_cast<std::uint64_t>(hi) - static_cast<std::uint64_t>(lo);
    return static_cast<std::int64_t>(static_cast<std::uint64_t>(lo) + draw_below(rng, span));
  }
  if (kind == "qrandint" || kind == "qlograndint" || kind == "lograndint") {
    const auto lo = domain["lo"].get<std::int64_t>();
    const auto hi = domain["hi"].get<std::int64_t>();
    if (kind == "qrandint") {
      // A multiple of q in [lo, hi], uniformly.
      const auto q = domain["q"].get<std::int64_t>();
      const auto [first, last] = multiples_in(lo, hi, q);
      const auto span = static_cast<std::uint64_t>(last - first) + 1;
      return (first + static_cast<std::int64_t>(draw_below(rng, span))) * q;
    }
    // Log-uniform in [lo, hi): lograndint floors it (hi exclusive);
    // qlograndint rounds it to a multiple of q within [lo, hi].
    const double v = std::exp(
        std::log(static_cast<double>(lo)) +
        (std::log(static_cast<double>(hi)) - std::log(static_cast<double>(lo))) * draw_unit(rng));
    if (kind == "lograndint") {
      return std::clamp(static_cast<std::int64_t>(std::floor(v)), lo, hi - 1);
    }
    const auto q = domain["q"].get<std::int64_t>();
    const auto [first, last] = multiples_in(lo, hi, q);
    const auto k = std::clamp(static_cast<std::int64_t>(std::llround(v / static_cast<double>(q))),
                              first, last);
    return k * q;
  }
  if (kind == "randn" || kind == "qrandn") {
    // Box-Muller from two draws, the first kept away from 0.
    const double u1 = 1.0 - draw_unit(rng);
    const double u2 = draw_unit(rng);
    const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
    const double v = domain["mean"].get<double>() + domain["sd"].get<double>() * z;
    if (kind == "randn") return v;
    const double q = domain["q"].get<double>();
    return std::round(v / q) * q;
  }
  double lo = domain["lo"].get<double>();
  double hi = domain["hi"].get<double>();
  if (kind == "uniform") return sample_double(lo, hi, draw_unit(rng));
  if (kind == "loguniform") {
    double v = std::exp(std::log(lo) + (std::log(hi) - std::log(lo)) * draw_unit(rng));
    if (v < lo) v = lo;
    if (v >= hi) v = std::nextafter(hi, lo);
    return v;
  }
  // quniform and qloguniform: round a draw to a multiple of q, kept within
  // [lo, hi].
  double q = domain["q"].get<double>();
  const double drawn = kind == "qloguniform"
                           ? std::exp(std::log(lo) + (std::log(hi) - std::log(lo)) * draw_unit(rng))
                           : sample_double(lo, hi, draw_unit(rng));
  double k = std::round(drawn / q);
  k = std::min(std::max(k, std::ceil(lo / q)), std::floor(hi / q));
  return std::min(std::max(k * q, lo), hi);
}

}  // namespace internal

namespace {
using internal::sample_domain;
using internal::validate_domain;
}  // namespace

json grid_search(json values) {
  json d = tagged("grid_search");
  d["values"] = std::move(values);
  return d;
}

json choice(json values) {
  json d = tagged("choice");
  d["values"] = std::move(values);
  return d;
}

json uniform(double lo, double hi) {
  json d = tagged("uniform");
  d["lo"] = lo;
  d["hi"] = hi;
  return d;
}

json loguniform(double lo, double hi) {
  json d = tagged("loguniform");
  d["lo"] = lo;
  d["hi"] = hi;
  return d;
}

json randint(std::int64_t lo, std::int64_t hi) {
  json d = tagged("randint");
  d["lo"] = lo;
  d["hi"] = hi;
  return d;
}

json quniform(double lo, double hi, double q) {
  json d = tagged("quniform");
  d["lo"] = lo;
  d["hi"] = hi;
  d["q"] = q;
  return d;
}

json qloguniform(double lo, double hi, double q) {
  json d = tagged("qloguniform");
  d["lo"] = lo;
  d["hi"] = hi;
  d["q"] = q;
  return d;
}

json qrandint(std::int64_t lo, std::int64_t hi, std::int64_t q) {
  json d = tagged("qrandint");
  d["lo"] = lo;
  d["hi"] = hi;
  d["q"] = q;
  return d;
}

json lograndint(std::int64_t lo, std::int64_t hi) {
  json d = tagged("lograndint");
  d["lo"] = lo;
  d["hi"] = hi;
  return d;
}

json qlograndint(std::int64_t lo, std::int64_t hi, std::int64_t q) {
  json d = tagged("qlograndint");
  d["lo"] = lo;
  d["hi"] = hi;
  d["q"] = q;
  return d;
}

json randn(double mean, double sd) {
  json d = tagged("randn");
  d["mean"] = mean;
  d["sd"] = sd;
  return d;
}

json qrandn(double mean, double sd, double q) {
  json d = tagged("qrandn");
  d["mean"] = mean;
  d["sd"] = sd;
  d["q"] = q;
  return d;
}

double draw_unit(Rng& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

std::uint64_t draw_below(Rng& rng, std::uint64_t n) {
  if (n == 0) throw std::logic_error("draw_below: n must be positive");
  // Reject the top values that would make some results more likely than
  // others: 2^64 mod n of them.
  const std::uint64_t reject_below = (0 - n) % n;
  for (;;) {
    std::uint64_t x = rng();
    if (x >= reject_below) return x % n;
  }
}

json sample_from(std::string name) {
  json d = tagged("sample_from");
  d["fn"] = std::move(name);
  return d;
}

ParamSpace::ParamSpace(json space, SampleFunctions functions)
    : spec_(std::move(space)), functions_(std::move(functions)) {
  if (!spec_.is_object() || is_domain(spec_)) {
    invalid("", "a search space must be a JSON object of parameters");
  }
  // Depth-first walk, object keys in sorted order (nlohmann::json's), array
  // elements in order.
  auto walk = [&](auto&& self, const json& node, const json::json_pointer& pointer) -> void {
    if (is_domain(node)) {
      const bool grid = validate_domain(node, path_of(pointer));
      const bool computed = node[kDomainTag] == "sample_from";
      (grid ? grid_ : computed ? computed_ : random_).push_back(Site{pointer, node});
      return;
    }
    if (node.is_object()) {
      for (const auto& [key, value] : node.items()) self(self, value, pointer / key);
    } else if (node.is_array()) {
      for (std::size_t i = 0; i < node.size(); ++i) self(self, node[i], pointer / i);
    }
  };
  walk(walk, spec_, json::json_pointer());
  for (const auto& site : grid_) {
    std::size_t n = site.domain["values"].size();
    if (grid_size_ > std::numeric_limits<std::size_t>::max() / n) {
      invalid(path_of(site.pointer), "the grid has more points than can be counted");
    }
    grid_size_ *= n;
  }
}

std::vector<std::string> ParamSpace::grid_paths() const {
  std::vector<std::string> out;
  for (const auto& site : grid_) out.push_back(path_of(site.pointer));
  return out;
}

std::vector<std::string> ParamSpace::random_paths() const {
  std::vector<std::string> out;
  for (const auto& site : random_) out.push_back(path_of(site.pointer));
  return out;
}

std::vector<std::string> ParamSpace::computed_paths() const {
  std::vector<std::string> out;
  for (const auto& site : computed_) out.push_back(path_of(site.pointer));
  return out;
}

std::vector<std::string> ParamSpace::function_names() const {
  std::vector<std::string> out;
  for (const auto& site : computed_) out.push_back(site.domain["fn"].get<std::string>());
  return out;
}

void ParamSpace::require_functions() const {
  for (const auto& site : computed_) {
    const std::string& name = site.domain["fn"].get_ref<const std::string&>();
    const auto it = functions_.find(name);
    if (it == functions_.end() || !it->second) {
      invalid(path_of(site.pointer), fmt::format("sample_from('{}'): its function was not given "
                                                 "(a sample function of that name)",
                                                 name));
    }
  }
}

// Passes over the sites still to compute until all have a value; a pass in
// which every function left returned nothing means they wait for each other.
void ParamSpace::compute(json& config, Rng& rng) const {
  if (computed_.empty()) return;
  require_functions();
  std::vector<const Site*> left;
  for (const auto& site : computed_) left.push_back(&site);
  while (!left.empty()) {
    std::vector<const Site*> next;
    for (const Site* site : left) {
      const SampleFunction& fn = functions_.at(site->domain["fn"].get<std::string>());
      std::optional<json> value;
      try {
        value = fn(config, rng);
      } catch (const Error& e) {
        throw Error(e.code(),
                    fmt::format("search space: {}: sample_from('{}'): {}", path_of(site->pointer),
                                site->domain["fn"].get<std::string>(), e.what()));
      }
      if (value) {
        config[site->pointer] = std::move(*value);
      } else {
        next.push_back(site);
      }
    }
    if (next.size() == left.size()) {
      std::string paths;
      for (const Site* site : next) {
        paths += (paths.empty() ? "" : ", ") + path_of(site->pointer);
      }
      invalid(paths, "these sample_from functions wait for each other's values");
    }
    left = std::move(next);
  }
}

json ParamSpace::resolve(std::size_t grid_index, Rng& rng) const {
  if (grid_index >= grid_size_) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("search space: grid point {} out of range (the grid has {})",
                            grid_index, grid_size_));
  }
  json config = spec_;
  std::size_t rest = grid_index;
  for (const auto& site : grid_) {
    const json& values = site.domain["values"];
    config[site.pointer] = values[rest % values.size()];
    rest /= values.size();
  }
  for (const auto& site : random_) config[site.pointer] = sample_domain(site.domain, rng);
  compute(config, rng);
  return config;
}

}  // namespace cairn::tune
