// The run's result rows in the experiment folder (one reader and writer of
// them for train/ and tune/), as Ray Train writes it:
// result.json (one JSON object a line), progress.csv (the same rows
// flattened) and a TensorBoard event file. The encoders and parsers are pure
// functions, apart from RunResults, which does the I/O.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cairn/manager.h"
#include "cairn/storage.h"
#include "experiment/layout.h"

namespace cairn::experiment {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), continuing from
// `crc` (0 to start): crc32c("123456789") == 0xE3069283.
uint32_t crc32c(std::string_view data, uint32_t crc = 0);
// TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t masked_crc32c(std::string_view data);
// One TFRecord: uint64 length, masked CRC of those 8 bytes, the data, masked
// CRC of the data (integers little-endian).
std::string tfrecord(std::string_view data);

// tensorflow.Event protobufs, encoded by hand. The first record of an event
// file: {wall_time, file_version: "brain.Event:2"}.
std::string encode_file_version_event(double wall_time);
// {wall_time, step, summary {value {tag, simple_value}}...}.
std::string encode_scalars_event(double wall_time, int64_t step,
                                 const std::vector<std::pair<std::string, float>>& values);

// `metrics` with nested objects flattened into one level, their keys joined
// with "/": {"a": {"b": 1}} -> {"a/b": 1}. Arrays and other values are kept
// as they are; an empty nested object disappears.
nlohmann::json flatten_metrics(const nlohmann::json& metrics);
// The numbers (not booleans) of flatten_metrics(metrics), for TensorBoard.
std::vector<std::pair<std::string, float>> numeric_scalars(const nlohmann::json& metrics);
// What a result row's TensorBoard event holds, as Ray's TensorBoard logger
// writes it: every numeric key of the row (the user's metrics and the
// row's own, iterations_since_restore and time_this_iter_s among them)
// except the axes training_iteration, timestamp and time_total_s; at the
// step timesteps_total when the row has it, else training_iteration.
std::vector<std::pair<std::string, float>> tensorboard_scalars(const nlohmann::json& row);
int64_t tensorboard_step(const nlohmann::json& row);

// One CSV field (RFC 4180): null is empty, a string is itself, anything else
// its JSON text; quoted (with '"' doubled) when it holds ',', '"', CR or LF,
// or starts or ends with a space.
std::string csv_field(const nlohmann::json& value);
// One CSV record, ending in "\n", of the fields named by `header` in a
// flattened row; a column the row lacks is empty.
std::string csv_record(const std::vector<std::string>& header, const nlohmann::json& flat_row);
// The header of `rows` (flattened): every key in order of first appearance.
// Extends `header` in place and returns whether it grew.
bool extend_header(std::vector<std::string>& header, const nlohmann::json& flat_row);

// result.json's text read back. Every line ending in '\n' must be a JSON
// object (kCorruption naming `where` and the line otherwise; empty lines are
// skipped); whatever follows the last '\n' is a line torn by a crash while it
// was appended, and is ignored. `complete_bytes` is the length of the text up
// to and including the last '\n'.
struct ParsedResults {
  std::vector<nlohmann::json> rows;
  size_t complete_bytes = 0;
};
ParsedResults parse_result_lines(std::string_view text, std::string_view where);

// Reads result.json of the experiment at `experiment` (none: empty).
std::vector<nlohmann::json> read_result_rows(Storage& experiment);

// Writes the history of one driver's run into the experiment folder. On
// opening it reads result.json (dropping a torn last line), rewrites
// progress.csv from it and starts a new event file; each record() then
// appends one round. On a local file system an append writes only the new
// line (O_APPEND); on other backends, which cannot append, the object is
// replaced whole. progress.csv is rewritten whole only when a round brings
// keys it has no column for. Not thread-safe.
class RunResults {
 public:
  using Clock = std::function<double()>;  // seconds since the Unix epoch
  RunResults(std::shared_ptr<Storage> experiment, Clock clock);
  ~RunResults();
  RunResults(const RunResults&) = delete;
  RunResults& operator=(const RunResults&) = delete;

  // Appends one reported round: `metrics` (rank 0's) with training_iteration
  // (`iteration` when given, else the row's number: 1, 2, ...), timestamp,
  // time_total_s, time_this_iter_s (since the previous row of this object, or
  // since it was made), iterations_since_restore (rows of this object since
  // `attempt` last changed: 1, 2, ...), checkpoint_dir_name (or null) and
  // attempt. `reported_at` (seconds since the epoch) is the timestamp of a
  // round reported before now (a backfilled row); the clock's time otherwise.
  // Throws cairn::Error naming the file that could not be written; the next
  // record() then rewrites that file whole.
  void record(const nlohmann::json& metrics, const std::optional<std::string>& checkpoint_dir_name,
              int attempt, std::optional<int64_t> iteration = std::nullopt,
              std::optional<double> reported_at = std::nullopt);

  // A driver killed between a report's commit and its row leaves a
  // committed checkpoint that no row names: writes its row now from the
  // metrics committed with it (timestamped with its commit, the attempt of
  // the last row), so that the history holds every committed result once.
  // Candidates among `committed` (the experiment's checkpoints, in index
  // order): those newer than every checkpoint a row names; with
  // `by_iteration` (the Tuner's trials, whose checkpoints carry their
  // training_iteration), only those whose training_iteration is past the
  // last row's, each written at its own. A checkpoint copied from another
  // trial (metadata kClonedFromKey) was not reported here: no row. Logs each
  // row it writes at info level, naming `experiment_uri`.
  void backfill(const std::vector<CheckpointRecord>& committed, bool by_iteration,
                const std::string& experiment_uri);

  // Every row of result.json, this run's and those of earlier drivers.
  const std::vector<nlohmann::json>& rows() const { return rows_; }
  const std::string& event_file() const { return event_key_; }

 private:
  struct Appender;
  void append(Appender& file, std::string_view data, const std::function<std::string()>& whole);
  std::string csv_text() const;

  std::shared_ptr<Storage> storage_;
  Clock clock_;
  double opened_at_ = 0.0;
  double time_before_ = 0.0;           // time_total_s of the last row of earlier drivers
  std::optional<double> last_row_at_;  // when this object recorded its last row
  int attempt_ = -1;                   // the attempt of the last row
  int64_t since_restore_ = 0;
  std::vector<nlohmann::json> rows_;
  std::vector<std::string> header_;
  std::string events_;  // the event file's bytes (kept where it cannot be appended to)
  std::string event_key_;
  std::unique_ptr<Appender> results_, progress_, event_;
};

}  // namespace cairn::experiment
