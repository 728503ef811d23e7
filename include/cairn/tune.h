// Tuning: search spaces and searchers (the part of Ray Tune that decides which
// configurations to try). The Tuner runtime that runs trials is not part of
// this header yet; see docs/tune.md.
//
// A search space is a JSON document (nested objects and arrays) in which some
// values are *domains*: tagged objects made by the functions below, e.g.
//
//   nlohmann::json space = {
//       {"lr", tune::loguniform(1e-4, 1e-1)},
//       {"model", {{"layers", tune::grid_search({2, 4})}, {"act", "relu"}}}};
//
// Every other value is a constant and is passed through unchanged. A domain
// is encoded as {"$cairn.domain": "<kind>", ...}, so a space can be written
// to and read back from a file as plain JSON. Key paths in messages are the
// JSON pointer without its leading '/': "model/layers", "layers/0".
//
// Domains (as in Ray Tune):
//   grid_search(values)  every value, once per repetition (see ParamSpace)
//   choice(values)       one of the values, uniformly
//   uniform(lo, hi)      a double in [lo, hi)
//   loguniform(lo, hi)   a double in [lo, hi) whose logarithm is uniform; lo > 0
//   randint(lo, hi)      an integer in [lo, hi) (hi exclusive, like Ray)
//   quniform(lo, hi, q)  round(uniform(lo, hi) / q) * q, kept within [lo, hi];
//                        at least one multiple of q must lie in [lo, hi]
//
// Values inside grid_search and choice are constants: a domain nested inside
// one is refused (kInvalidArgument), as is a domain object with a field its
// kind does not have. The space itself must be a JSON object.
//
// Determinism: sampling draws only from the Rng passed in. Rng is
// std::mt19937_64, whose output sequence the C++ standard fixes, and every
// draw is derived from its raw 64-bit outputs by code in Cairn (no
// std::*_distribution, whose algorithms differ between standard libraries).
// So grid order, choice, randint, uniform and quniform are bit-identical on
// every platform with IEEE-754 doubles; loguniform goes through std::log and
// std::exp, whose last bit may differ between math libraries.
//
// Failure: a malformed space (bad bounds, an empty choice, an unknown domain,
// a grid too large to count) is kInvalidArgument naming the key path.
//
// Thread-safety: ParamSpace is immutable after construction; its const
// methods may be called from any number of threads. A searcher is used by one
// thread at a time (the driver); its const methods may run concurrently with
// each other but not with a non-const call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace cairn::tune {

// The tag that marks a domain in a search space.
inline constexpr const char* kDomainTag = "$cairn.domain";

// Domain constructors. They only build the tagged object; the space that
// holds it validates it (so errors can name the key path).
nlohmann::json grid_search(nlohmann::json values);
nlohmann::json choice(nlohmann::json values);
nlohmann::json uniform(double lo, double hi);
nlohmann::json loguniform(double lo, double hi);
nlohmann::json randint(std::int64_t lo, std::int64_t hi);
nlohmann::json quniform(double lo, double hi, double q);

// The random generator every sampling call draws from.
using Rng = std::mt19937_64;

// Portable draws from an Rng (exposed for searchers and tests).
// A double in [0, 1) with 53 random bits.
double draw_unit(Rng& rng);
// An integer in [0, n), unbiased (rejection sampling); n > 0.
std::uint64_t draw_below(Rng& rng, std::uint64_t n);

// A validated search space.
//
// The grid is the cartesian product of every grid_search in the space. Grid
// points are numbered 0 .. grid_size()-1 like an odometer whose first wheel
// turns fastest, as Ray's BasicVariantGenerator does: the grid_search met
// first in a depth-first walk (object keys in sorted order, array elements in
// order) changes on every step. A space without grid_search has one grid
// point.
class ParamSpace {
 public:
  // Throws kInvalidArgument naming the key path for a malformed domain, or
  // when the number of grid points does not fit in std::size_t.
  explicit ParamSpace(nlohmann::json space);
  // ParamSpace({{"lr", uniform(0, 1)}}): a one-key space would otherwise be
  // ambiguous with copying a ParamSpace.
  explicit ParamSpace(nlohmann::json::initializer_list_t space)
      : ParamSpace(nlohmann::json(space)) {}

  const nlohmann::json& spec() const { return spec_; }
  std::size_t grid_size() const { return grid_size_; }
  // Paths of the grid_search domains, in odometer order (first is fastest).
  std::vector<std::string> grid_paths() const;
  // Paths of the randomly sampled domains, in the order they are sampled.
  std::vector<std::string> random_paths() const;

  // The configuration at grid point `grid_index` (< grid_size(), else
  // kInvalidArgument) with every random domain sampled from `rng`, in
  // random_paths() order. Constants and the nesting are kept.
  nlohmann::json resolve(std::size_t grid_index, Rng& rng) const;

 private:
  struct Site {
    nlohmann::json::json_pointer pointer;
    nlohmann::json domain;
  };
  nlohmann::json spec_;
  std::vector<Site> grid_;
  std::vector<Site> random_;
  std::size_t grid_size_ = 1;
};

}  // namespace cairn::tune
