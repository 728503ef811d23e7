// Runs a small Trainer whose metrics are nested and hold strings that CSV
// must quote, for history_reader_test.py to read its result files back.
// Usage: history_tool [--tune] STORAGE_PATH; prints the experiment folder,
// or with --tune runs the same loop as the one trial of a Tuner and prints
// the trial's folder.
#include <cstdio>
#include <cstring>

#include "cairn/train.h"
#include "cairn/tuner.h"

int main(int argc, char** argv) {
  const bool tune = argc == 3 && std::strcmp(argv[1], "--tune") == 0;
  if (argc != 2 && !tune) {
    std::fprintf(stderr, "usage: %s [--tune] STORAGE_PATH\n", argv[0]);
    return 2;
  }
  const char* storage = argv[argc - 1];
  auto loop = [](const nlohmann::json&) {
    for (int i = 0; i < 4; ++i) {
      nlohmann::json m = {{"loss", 1.0 / (i + 1)},
                          {"step", i * 10},
                          {"eval", {{"acc", 0.25 * i}, {"inner", {{"n", -i}}}}},
                          {"note", "a,b \"q\"\nline " + std::to_string(i)},
                          {"done", i == 3}};
      if (i >= 2) m["late"] = i;  // a column that appears later
      std::optional<cairn::Checkpoint> ckpt;
      if (i % 2 == 1) ckpt = cairn::Checkpoint::from_dict({{"i", i}});
      cairn::train::report(m, ckpt);
    }
  };
  cairn::RunConfig run;
  run.name = "history";
  run.storage_path = storage;
  if (tune) {
    cairn::tune::ResultGrid grid = cairn::tune::Tuner(loop, {{"unused", 1}}, {}, run).fit();
    if (grid.size() != 1 || grid[0].error) {
      std::fprintf(stderr, "the trial failed: %s\n", grid[0].error.value_or("?").c_str());
      return 1;
    }
    std::printf("%s\n", grid[0].path.c_str());
    return 0;
  }
  cairn::Result r = cairn::Trainer(loop, {}, cairn::ScalingConfig{.num_workers = 1}, run).fit();
  if (r.error) {
    std::fprintf(stderr, "%s\n", r.error->c_str());
    return 1;
  }
  std::printf("%s\n", r.path.c_str());
  return 0;
}
