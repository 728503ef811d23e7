// Single-domain validation and sampling, shared by ParamSpace (space.cc) and
// Population Based Training's explore step (pbt_scheduler.cc), and the check of
// a "max"/"min" mode shared by the schedulers and the Tuner. Internal to
// cairn_tune; the public contract of domains is in include/cairn/tune.h.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "cairn/tune.h"

namespace cairn::tune::internal {

// kInvalidArgument naming `field` unless `mode` is "max", "min" or empty.
void check_mode(const std::string& mode, std::string_view field);

// Whether `value` is a domain: an object holding kDomainTag.
bool is_domain(const nlohmann::json& value);

// Whether `value` is or holds a domain (of `kind`, when given) at any depth.
bool contains_domain(const nlohmann::json& value, std::string_view kind = {});

// Throws kInvalidArgument ("search space: <path>: ...") unless `domain` (an
// object with the tag) is well formed. Returns whether it is a grid_search.
bool validate_domain(const nlohmann::json& domain, const std::string& path);

// One value drawn from a validated domain other than grid_search.
nlohmann::json sample_domain(const nlohmann::json& domain, Rng& rng);

}  // namespace cairn::tune::internal
