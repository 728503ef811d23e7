// Disk rounds (cairn_bench --disk-rounds): in every round, fio writes with
// O_DIRECT (libaio, 8 in flight) and buffered while its previous file is
// still on disk; then Cairn's StateCheckpointManager saves with the
// automatic (direct) path and with buffered I/O, keeping the previous
// checkpoint as every manager save does; then fio reads its file cold with
// O_DIRECT and buffered, and Cairn loads the checkpoint cold (automatic and
// buffered) into preallocated buffers. Ratios are taken within a round and
// reported as their median over rounds: the disk's speed drifts by 2x within
// an hour on these machines, so figures from different moments do not
// compare.
#pragma once

#include <functional>

#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "cairn/state.h"

namespace cairn::bench {

// `state` is saved, `target` loaded into; `same()` says whether the target's
// bytes equal the state's. Returns {"gbps": {...}, "ratios": [...], ...}.
nlohmann::json run_disk_rounds(const Options& opts, const std::vector<TensorSpec>& specs,
                               const StateDict& state, StateDict& target,
                               const std::function<bool()>& same);

}  // namespace cairn::bench
