// Runs a small Trainer whose metrics are nested and hold strings that CSV
// must quote, for history_reader_test.py to read its result files back.
// Usage: history_tool STORAGE_PATH; prints the experiment folder.
#include <cstdio>

#include "cairn/train.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s STORAGE_PATH\n", argv[0]);
    return 2;
  }
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
  run.storage_path = argv[1];
  cairn::Result r = cairn::Trainer(loop, {}, cairn::ScalingConfig{.num_workers = 1}, run).fit();
  if (r.error) {
    std::fprintf(stderr, "%s\n", r.error->c_str());
    return 1;
  }
  std::printf("%s\n", r.path.c_str());
  return 0;
}
