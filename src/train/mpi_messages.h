// The JSON of the driver <-> agent protocol (mpi_launch.cc): a worker's
// place, the run's Result and errors as they cross between processes.
// Pure; nlohmann's exceptions for a field of the wrong type reach the
// caller, which names the peer (malformed()).
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "cairn/error.h"
#include "cairn/train.h"

namespace cairn::train_internal {

nlohmann::json context_to_json(const TrainContext& c);
TrainContext context_from_json(const nlohmann::json& j);

nlohmann::json result_to_json(const Result& r);
Result result_from_json(const nlohmann::json& j);

nlohmann::json error_to_json(ErrorCode code, std::string_view message);
// The error `j` describes, its message after `prefix`.
Error error_from_json(const nlohmann::json& j, std::string_view prefix);

// The "t" of a message, "" when it has none or it is not a string (value()
// would throw on a wrong type).
std::string type_of(const nlohmann::json& m);

// kCorruption: a message from `from` did not have the expected fields.
Error malformed(std::string_view from, const nlohmann::json::exception& e);

}  // namespace cairn::train_internal
