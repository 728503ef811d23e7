// Tuning: search spaces and searchers (the part of Ray Tune that decides which
// configurations to try). The Tuner runtime that runs the trials is in
// cairn/tuner.h; schedulers in cairn/tune_schedulers.h; docs/tune.md is the
// guide.
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
//   qloguniform(lo, hi, q)  round(loguniform(lo, hi) / q) * q, kept within
//                        [lo, hi]; lo > 0
//   qrandint(lo, hi, q)  a multiple of q in [lo, hi] (hi inclusive, like
//                        Ray's), uniformly
//   lograndint(lo, hi)   an integer in [lo, hi) whose logarithm is uniform
//                        (floor of loguniform(lo, hi)); lo > 0
//   qlograndint(lo, hi, q)  round(loguniform(lo, hi) / q) * q, kept within
//                        [lo, hi] (hi inclusive); lo > 0
//   randn(mean, sd)      a double from the normal distribution (Box-Muller
//                        over two draw_unit draws); sd > 0
//   qrandn(mean, sd, q)  round(randn(mean, sd) / q) * q
//   sample_from(name)    the value a function computes from the rest of the
//                        trial's configuration (see SampleFunction)
//
// Values inside grid_search and choice are constants: a domain nested inside
// one is refused (kInvalidArgument), as is a domain object with a field its
// kind does not have. The space itself must be a JSON object.
//
// Determinism: sampling draws only from the Rng passed in. Rng is
// std::mt19937_64, whose output sequence the C++ standard fixes, and every
// draw is derived from its raw 64-bit outputs by code in Cairn (no
// std::*_distribution, whose algorithms differ between standard libraries).
// So grid order, choice, randint, qrandint, uniform and quniform are
// bit-identical on every platform with IEEE-754 doubles; the log and normal
// domains go through std::log, std::exp, std::sqrt and std::cos, whose last
// bit may differ between math libraries.
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
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace cairn::tune {

// The tag that marks a domain in a search space.
inline constexpr const char* kDomainTag = "$cairn.domain";

// The random generator every sampling call draws from.
using Rng = std::mt19937_64;

// Ray's sample_from: a value computed by code from the trial's configuration.
// The space holds only a name, {"$cairn.domain": "sample_from", "fn": name},
// so it stays plain JSON that can be saved; the function is given beside it
// (ParamSpace's `functions`, TuneConfig::sample_functions), and given again
// to Tuner::restore, since code is not saved.
//
// A SampleFunction is called once per trial, after the grid and the random
// domains are in place, with the configuration resolved so far (other
// sample_from sites still hold their domain object) and the trial's Rng. It
// returns the value, or nothing when it needs a sample_from value not
// resolved yet: it is called again once the others have been tried. What it
// throws fails the resolution. It runs on the thread that resolves the space
// (the Tuner's driver), one call at a time.
using SampleFunction =
    std::function<std::optional<nlohmann::json>(const nlohmann::json& config, Rng& rng)>;
using SampleFunctions = std::map<std::string, SampleFunction>;

// Domain constructors. They only build the tagged object; the space that
// holds it validates it (so errors can name the key path).
nlohmann::json grid_search(nlohmann::json values);
nlohmann::json choice(nlohmann::json values);
nlohmann::json uniform(double lo, double hi);
nlohmann::json loguniform(double lo, double hi);
nlohmann::json randint(std::int64_t lo, std::int64_t hi);
nlohmann::json quniform(double lo, double hi, double q);
nlohmann::json qloguniform(double lo, double hi, double q);
nlohmann::json qrandint(std::int64_t lo, std::int64_t hi, std::int64_t q = 1);
nlohmann::json lograndint(std::int64_t lo, std::int64_t hi);
nlohmann::json qlograndint(std::int64_t lo, std::int64_t hi, std::int64_t q);
nlohmann::json randn(double mean = 0.0, double sd = 1.0);
nlohmann::json qrandn(double mean, double sd, double q);
// `name` (not empty) is the key of its function in the SampleFunctions.
nlohmann::json sample_from(std::string name);

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
  // when the number of grid points does not fit in std::size_t. A
  // sample_from whose function is not in `functions` is accepted here (a
  // restored space whose trials were all drawn needs none) and refused by
  // require_functions() and resolve().
  explicit ParamSpace(nlohmann::json space, SampleFunctions functions = {});
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
  // Paths of the sample_from domains, in the order their functions are
  // first called.
  std::vector<std::string> computed_paths() const;
  // The names of the functions the sample_from domains ask for, in
  // computed_paths() order (a name used twice appears twice).
  std::vector<std::string> function_names() const;
  // kInvalidArgument naming the key path of the first sample_from whose
  // function was not given.
  void require_functions() const;

  // The configuration at grid point `grid_index` (< grid_size(), else
  // kInvalidArgument) with every random domain sampled from `rng`, in
  // random_paths() order, then every sample_from computed (see
  // SampleFunction), in computed_paths() order, a function that returned
  // nothing being called again after the others. Constants and the nesting
  // are kept. kInvalidArgument naming the key paths when a function is
  // missing or the functions left wait for each other; a function's own
  // exception is rethrown with the key path in front when it is an Error.
  nlohmann::json resolve(std::size_t grid_index, Rng& rng) const;

 private:
  struct Site {
    nlohmann::json::json_pointer pointer;
    nlohmann::json domain;
  };
  void compute(nlohmann::json& config, Rng& rng) const;

  nlohmann::json spec_;
  SampleFunctions functions_;
  std::vector<Site> grid_;
  std::vector<Site> random_;
  std::vector<Site> computed_;
  std::size_t grid_size_ = 1;
};

// One suggestion of the BasicVariantGenerator: the trial's 0-based index in
// the experiment and its configuration.
struct Variant {
  std::size_t index = 0;
  nlohmann::json config;
};

// A search algorithm: suggests a configuration for each new trial and learns
// from finished ones.
//
// suggest() returns the configuration for a new trial `trial_id`, or nothing:
// then finished() says whether the searcher has nothing more to suggest ever
// (true) or only now (false: ask again after a trial completes; a model-based
// searcher waiting for results). save() returns the searcher's whole state as
// JSON; restore(save()) on a searcher built with the same arguments continues
// exactly where the saved one stood, so a restored experiment neither repeats
// nor skips a configuration. restore() throws kInvalidArgument for a state
// this searcher cannot adopt (another kind, another space) and leaves the
// searcher unchanged then. Limiting how many trials run at once is the
// runtime's business, not the searcher's.
class Searcher {
 public:
  virtual ~Searcher() = default;

  virtual std::optional<nlohmann::json> suggest(const std::string& trial_id) = 0;
  virtual bool finished() const = 0;
  // `result` is the trial's last reported result (null if none); `error`
  // says whether the trial failed.
  virtual void on_trial_complete(const std::string& trial_id, const nlohmann::json& result,
                                 bool error) = 0;
  virtual nlohmann::json save() const = 0;
  virtual void restore(const nlohmann::json& state) = 0;
};

// Ray Tune's default search: the grid repeated num_samples times, each
// repetition sampling the random domains anew. Trial k (0-based) is grid point
// k % grid_size() of repetition k / grid_size(); its random domains are drawn
// from an Rng seeded from (seed, k) alone, so the sequence depends only on the
// space, num_samples and seed (and on the sample_from functions, which are
// as deterministic as they are written), and restoring needs no replay.
class BasicVariantGenerator final : public Searcher {
 public:
  // num_samples >= 1; kInvalidArgument otherwise or when
  // grid_size() * num_samples does not fit in std::size_t.
  BasicVariantGenerator(ParamSpace space, std::size_t num_samples, std::uint64_t seed);

  // The next variant, or nothing once all total() have been produced.
  std::optional<Variant> next();
  // The variant with index `index` (< total()), without advancing.
  Variant variant(std::size_t index) const;

  std::size_t total() const { return total_; }
  std::size_t produced() const { return next_; }
  const ParamSpace& space() const { return space_; }

  // Searcher. suggest() throws kInvalidArgument for a trial_id already
  // suggested and not yet completed; on_trial_complete() for one it does not
  // know. The results do not change what is suggested.
  std::optional<nlohmann::json> suggest(const std::string& trial_id) override;
  bool finished() const override { return next_ >= total_; }
  void on_trial_complete(const std::string& trial_id, const nlohmann::json& result,
                         bool error) override;
  // {"searcher": "basic_variant", "version": 1, "seed": "<decimal>",
  //  "num_samples": n, "space": <spec>, "next": k, "live": {trial_id: index}}.
  // restore() requires the same space and num_samples; it adopts the seed.
  nlohmann::json save() const override;
  void restore(const nlohmann::json& state) override;

  // Trials suggested and not yet completed, by id, with their indexes.
  const std::map<std::string, std::size_t>& live() const { return live_; }

 private:
  ParamSpace space_;
  std::size_t num_samples_;
  std::uint64_t seed_;
  std::size_t total_;
  std::size_t next_ = 0;
  std::map<std::string, std::size_t> live_;
};

}  // namespace cairn::tune
