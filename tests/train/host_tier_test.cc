// The pure parts of the memory tier across hosts (train/host_tier.h): the
// hosts' ring and the plan of a restore from what each host holds.
#include "train/host_tier.h"

#include <gtest/gtest.h>

#include "cairn/checkpoint.h"
#include "cairn/commit.h"
#include "cairn/storage.h"

namespace cairn::train_internal {
namespace {

TEST(HostLayout, HostsAreOrderedByTheirLowestRankAndLedByIt) {
  const HostLayout l = layout_hosts({"b", "b", "a", "c", "a"});
  EXPECT_EQ(l.names, (std::vector<std::string>{"b", "a", "c"}));
  EXPECT_EQ(l.leader, (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(l.host_of, (std::vector<int>{0, 0, 1, 2, 1}));
  EXPECT_EQ(l.next(2), 0);
  EXPECT_EQ(l.prev(0), 2);
}

// The manifest text of a checkpoint holding `files` (name -> bytes), with
// `ranks` (the manifest's "ranks") when given.
std::string manifest_of(const std::map<std::string, std::string>& files,
                        const nlohmann::json& ranks = nullptr) {
  static int made = 0;
  auto storage = open_storage("memory://host-tier-test/" + std::to_string(++made));
  CheckpointWriter w{Checkpoint(storage)};
  for (const auto& [name, bytes] : files) w.write_file(name, bytes);
  if (!ranks.is_null()) w.set_ranks(ranks);
  w.commit(nlohmann::json::object(), 0);
  return storage->get(kManifestKey);
}

HeldCheckpoint held(const std::optional<std::string>& manifest,
                    const std::map<std::string, uint64_t>& files) {
  HeldCheckpoint h;
  h.manifest = manifest;
  h.files = files;
  return h;
}

TEST(PlanRestore, TheNewestWholeCheckpointIsCompletedOnEveryHostFromItsReplica) {
  const std::string m4 = manifest_of({{"shard-0", "aa"}, {"shard-1", "bbb"}});
  // Host 1 lost its memory; host 0 holds its own file and host 1's replica.
  std::vector<Held> by_host(2);
  by_host[0]["checkpoint_000004"] = held(m4, {{"shard-0", 2}, {"shard-1", 3}});
  const RestorePlan plan = plan_restore(by_host);
  ASSERT_TRUE(plan.newest);
  EXPECT_EQ(*plan.newest, "checkpoint_000004");
  EXPECT_TRUE(plan.remove.empty());
  ASSERT_EQ(plan.moves.size(), 2u);
  for (const Move& m : plan.moves) {
    EXPECT_EQ(m.from, 0);
    EXPECT_EQ(m.to, 1);
  }
  EXPECT_EQ(plan.filled, (std::set<int>{1}));
  EXPECT_EQ(plan.control.at(std::string(kManifestKey)), m4);
}

TEST(PlanRestore, ACheckpointNoHostsHoldWholeIsRemovedAndAnOlderOneServes) {
  const std::string m3 = manifest_of({{"a", "1"}, {"b", "22"}});
  const std::string m4 = manifest_of({{"a", "3"}, {"b", "44"}, {"c", "555"}});
  std::vector<Held> by_host(3);
  // Checkpoint 4: "c" was on a host that failed with its replica holder.
  by_host[0]["checkpoint_000004"] = held(m4, {{"a", 1}, {"b", 2}});
  by_host[1]["checkpoint_000004"] = held(std::nullopt, {{"b", 2}});
  by_host[0]["checkpoint_000003"] = held(m3, {{"a", 1}});
  by_host[2]["checkpoint_000003"] = held(m3, {{"b", 2}});
  // An uncommitted leftover goes too.
  by_host[2]["checkpoint_000005"] = held(std::nullopt, {{"a", 1}});
  const RestorePlan plan = plan_restore(by_host);
  ASSERT_TRUE(plan.newest);
  EXPECT_EQ(*plan.newest, "checkpoint_000003");
  EXPECT_EQ(plan.remove, (std::vector<std::string>{"checkpoint_000005", "checkpoint_000004"}));
  // Host 0 lacks b, host 1 lacks both, host 2 lacks a; each from the first
  // holder onward from the host in need.
  std::map<std::pair<int, std::string>, int> from;
  for (const Move& m : plan.moves) from[{m.to, m.file.path}] = m.from;
  EXPECT_EQ(from, (std::map<std::pair<int, std::string>, int>{
                      {{0, "b"}, 2}, {{1, "a"}, 0}, {{1, "b"}, 2}, {{2, "a"}, 0}}));
}

TEST(PlanRestore, AFileOfTheWrongSizeDoesNotCountAndATornManifestIsSkipped) {
  const std::string m = manifest_of({{"a", "xyz"}});
  std::vector<Held> by_host(2);
  by_host[0]["checkpoint_000001"] = held(m.substr(0, m.size() / 2), {{"a", 2}});
  by_host[1]["checkpoint_000001"] = held(m, {{"a", 2}});
  RestorePlan plan = plan_restore(by_host);
  EXPECT_FALSE(plan.newest);
  EXPECT_EQ(plan.remove, (std::vector<std::string>{"checkpoint_000001"}));
  by_host[0]["checkpoint_000001"].files["a"] = 3;
  plan = plan_restore(by_host);
  ASSERT_TRUE(plan.newest);
  ASSERT_EQ(plan.moves.size(), 1u);
  EXPECT_EQ(plan.moves[0].to, 1);
}

TEST(PlanRestore, OnlyPlansForTheNamedCheckpointAndRemovesNothing) {
  const std::string m = manifest_of({{"a", "q"}});
  std::vector<Held> by_host(2);
  by_host[0]["checkpoint_000002"] = held(m, {{"a", 1}});
  by_host[1]["checkpoint_000003"] = held(std::nullopt, {});
  const RestorePlan plan = plan_restore(by_host, "checkpoint_000002");
  ASSERT_TRUE(plan.newest);
  EXPECT_TRUE(plan.remove.empty());
  ASSERT_EQ(plan.moves.size(), 1u);
  EXPECT_EQ(plan.filled, (std::set<int>{1}));
}

// ranks_read_own_files: 4 ranks, two to a host; host 1 (ranks 2 and 3) lost
// its memory, host 0 holds everything (its own files and host 1's replica).
// Host 1 receives only its ranks' files and the file every rank wrote; host
// 0 receives nothing although it lacks nothing anyway; a third host of
// another layout would be completed whole (no map for its size).
TEST(PlanRestore, WithOwnFilesEachHostReceivesOnlyWhatItsRanksWrote) {
  const nlohmann::json ranks = {{"world_size", 4},
                                {"contributed", {0, 1, 2, 3}},
                                {"files",
                                 {{"0", {"common", "s0"}},
                                  {"1", {"common", "s1"}},
                                  {"2", {"common", "s2"}},
                                  {"3", {"common", "s3"}}}}};
  const std::string m =
      manifest_of({{"common", "c"}, {"s0", "00"}, {"s1", "11"}, {"s2", "22"}, {"s3", "33"}}, ranks);
  std::vector<Held> by_host(2);
  by_host[0]["checkpoint_000002"] =
      held(m, {{"common", 1}, {"s0", 2}, {"s1", 2}, {"s2", 2}, {"s3", 2}});
  const HostLayout layout = layout_hosts({"a", "a", "b", "b"});
  const RestorePlan own = plan_restore(by_host, std::nullopt, &layout);
  ASSERT_TRUE(own.newest);
  std::set<std::pair<int, std::string>> moved;
  for (const Move& mv : own.moves) moved.insert({mv.to, mv.file.path});
  EXPECT_EQ(moved, (std::set<std::pair<int, std::string>>{{1, "common"}, {1, "s2"}, {1, "s3"}}));
  EXPECT_EQ(own.filled, (std::set<int>{1}));
  // Without the option host 1 receives every file.
  EXPECT_EQ(plan_restore(by_host).moves.size(), 5u);
  // A launch of another size than the group that saved: every file.
  const HostLayout other = layout_hosts({"a", "b"});
  EXPECT_EQ(plan_restore(by_host, std::nullopt, &other).moves.size(), 5u);
  const Manifest parsed = Manifest::parse(m, "test");
  EXPECT_FALSE(files_by_host(parsed, other));
  const auto wrote = files_by_host(parsed, layout);
  ASSERT_TRUE(wrote);
  EXPECT_EQ((*wrote)[0], (std::set<std::string>{"common", "s0", "s1"}));
}

// A manifest without the map (saved before it was kept): every file.
TEST(PlanRestore, WithOwnFilesAManifestWithoutTheMapCompletesEveryHost) {
  const std::string m =
      manifest_of({{"s0", "00"}, {"s1", "11"}}, {{"world_size", 2}, {"contributed", {0, 1}}});
  std::vector<Held> by_host(2);
  by_host[0]["checkpoint_000001"] = held(m, {{"s0", 2}, {"s1", 2}});
  const HostLayout layout = layout_hosts({"a", "b"});
  EXPECT_EQ(plan_restore(by_host, std::nullopt, &layout).moves.size(), 2u);
}

TEST(HeldJson, RoundTrips) {
  Held h;
  h["checkpoint_000001"] = held(std::string("{}"), {{"x", 4}});
  h["checkpoint_000001"].control[".cairn/metadata.json"] = "{\"k\":1}";
  h["checkpoint_000002"] = held(std::nullopt, {});
  const Held back = held_from_json(held_to_json(h));
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back.at("checkpoint_000001").manifest, std::string("{}"));
  EXPECT_EQ(back.at("checkpoint_000001").files, h["checkpoint_000001"].files);
  EXPECT_EQ(back.at("checkpoint_000001").control, h["checkpoint_000001"].control);
  EXPECT_FALSE(back.at("checkpoint_000002").manifest);
}

}  // namespace
}  // namespace cairn::train_internal
