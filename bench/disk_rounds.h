// Disk rounds (cairn_bench --disk-rounds). Every round: three fio
// sequential writes with O_DIRECT (libaio, 8 in flight, end fsync), each
// replacing the older of two fio files while the other is kept, with a
// StateCheckpointManager save in the default configuration (automatic path,
// max_to_keep=1, the previous checkpoint kept until the new one commits, its
// space freed in the background and waited for untimed) between the first
// two and a save of a second manager that deletes inside the save
// (background_delete=false) between the last two (the two swap places every
// other round); each save is judged against the
// mean of the fio writes around it. Then fio writes buffered and a third
// manager saves with IoPath::kBuffered; fio reads its file cold with O_DIRECT
// and buffered, and Cairn loads the checkpoint cold (automatic and buffered)
// into preallocated buffers. Ratios are taken within a round and reported as
// their median over rounds: the disk's speed drifts by 2x within minutes on
// these machines, so figures from different moments do not compare.
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
