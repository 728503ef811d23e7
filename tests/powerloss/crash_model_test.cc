// The crash-state generator on small hand-written traces: it must find the
// states that break a protocol missing an fsync, and never invent a state
// that a correct protocol could not survive.
#include "powerloss/crash_model.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace cairn::powerloss {
namespace {

std::string write_rec(uint64_t ino, uint64_t off, const std::string& data) {
  return "write " + std::to_string(ino) + " " + std::to_string(off) + " " +
         std::to_string(data.size()) + "\n" + data + "\n";
}

// Every state at every crash point, with `samples` random ones per point.
std::vector<CrashState> all_states(const CrashStates& states, int samples = 64) {
  std::mt19937_64 rng(7);
  std::vector<CrashState> out;
  for (size_t p : states.crash_points()) {
    auto some = states.states_at(p, samples, rng);
    out.insert(out.end(), some.begin(), some.end());
  }
  return out;
}

// The atomic replace of "d/a": temp file, write, fsync, rename, fsync dir.
std::string atomic_replace(bool fsync_file, bool fsync_dir) {
  std::string t = "create 100 d/.a.tmp\nopen 100 241 d/.a.tmp\n";
  t += write_rec(100, 0, std::string(1500, 'n'));
  if (fsync_file) t += "fsync 100\n";
  t += "rename d/.a.tmp d/a\n";
  if (fsync_dir) t += "fsyncdir d\n";
  t += "mark done\n";
  return t;
}

Image old_a() {
  Image img;
  img.dirs = {"", "d"};
  img.files["d/a"] = "old";
  return img;
}

TEST(CrashModel, ParsesEveryRecordKind) {
  Image initial = old_a();
  std::string t = "mkdir d/e\ncreate 7 d/e/f%20g\nopen 7 241 d/e/f%20g\n" +
                  write_rec(7, 3, "xy\nz") +
                  "falloc 7 0 0 4096\ntrunc 7 10\nfdatasync 7\nlink d/e/f%20g d/h\n"
                  "unlink d/h\nrename d/e/f%20g d/i\nfsyncdir d\nopen 9 4241 d/a\nsync\n"
                  "rmdir d/e\nmark committed%201\n";
  Trace trace = parse_trace(t, initial);
  ASSERT_EQ(trace.ops.size(), 13u);
  EXPECT_EQ(trace.ops[1].kind, OpKind::kCreate);
  EXPECT_EQ(trace.ops[1].path, "d/e/f g");
  EXPECT_EQ(trace.ops[2].kind, OpKind::kWrite);
  EXPECT_EQ(trace.ops[2].data, "xy\nz");
  EXPECT_EQ(trace.ops[2].offset, 3u);
  EXPECT_EQ(trace.ops[2].inode, trace.ops[1].inode);
  EXPECT_EQ(trace.ops[3].kind, OpKind::kFallocate);
  EXPECT_EQ(trace.ops[5].kind, OpKind::kFsync);
  EXPECT_EQ(trace.ops.back().path, "committed 1");
  EXPECT_EQ(trace.direct_opens, 1);
}

TEST(CrashModel, RejectsMalformedTraces) {
  Image initial = old_a();
  EXPECT_THROW(parse_trace("write 1 0 3\nab", initial), std::runtime_error);  // cut short
  EXPECT_THROW(parse_trace("fsync 42\n", initial), std::runtime_error);       // never opened
  EXPECT_THROW(parse_trace("bogus\n", initial), std::runtime_error);
  EXPECT_THROW(parse_trace("rename d/nope d/x\n", initial), std::runtime_error);
  EXPECT_THROW(parse_trace("mkdir d/x", initial), std::runtime_error);  // no end of line
}

TEST(CrashModel, AReusedInodeNumberIsANewFile) {
  Image initial;
  std::string t = "create 5 a\nopen 5 241 a\n" + write_rec(5, 0, "first") +
                  "fsync 5\nunlink a\ncreate 5 b\nopen 5 241 b\n" + write_rec(5, 0, "second") +
                  "fsync 5\nsync\n";
  Trace trace = parse_trace(t, initial);
  CrashStates states(trace, initial, Model::kExt4Ordered);
  Image end = states.issued(trace.ops.size());
  EXPECT_EQ(end.files.size(), 1u);
  EXPECT_EQ(end.files["b"], "second");
}

TEST(CrashModel, AtomicReplaceWithBothFsyncsLeavesOldOrNewWhole) {
  Image initial = old_a();
  Trace trace = parse_trace(atomic_replace(true, true), initial);
  CrashStates states(trace, initial, Model::kExt4Ordered);
  const auto all = all_states(states);
  bool saw_new = false;
  for (const auto& s : all) {
    ASSERT_TRUE(s.image.files.count("d/a")) << states.describe(s.choice);
    const std::string& a = s.image.files.at("d/a");
    EXPECT_TRUE(a == "old" || a == std::string(1500, 'n')) << states.describe(s.choice);
    saw_new |= a != "old";
  }
  EXPECT_TRUE(saw_new);
  // After the directory fsync the new content is the only one.
  std::mt19937_64 rng(1);
  for (const auto& s : states.states_at(trace.ops.size(), 32, rng)) {
    if (s.choice.crash_point == trace.ops.size()) {
      EXPECT_EQ(s.image.files.at("d/a"), std::string(1500, 'n')) << states.describe(s.choice);
    }
  }
}

TEST(CrashModel, RenameWithoutFsyncOfTheFileCanExposeATornFile) {
  Image initial = old_a();
  Trace trace = parse_trace(atomic_replace(false, true), initial);
  CrashStates states(trace, initial, Model::kExt4Ordered);
  bool empty = false, torn = false;
  for (const auto& s : all_states(states)) {
    const std::string& a = s.image.files.at("d/a");
    empty |= a.empty();
    torn |= !a.empty() && a != "old" && a != std::string(1500, 'n');
  }
  EXPECT_TRUE(empty);
  EXPECT_TRUE(torn);
}

TEST(CrashModel, RenameWithoutFsyncOfTheDirectoryMayBeLost) {
  Image initial = old_a();
  Trace trace = parse_trace(atomic_replace(true, false), initial);
  CrashStates states(trace, initial, Model::kExt4Ordered);
  std::mt19937_64 rng(1);
  bool old = false, fresh = false;
  for (const auto& s : states.states_at(trace.ops.size(), 8, rng)) {
    old |= s.image.files.at("d/a") == "old";
    fresh |= s.image.files.at("d/a") != "old";
  }
  EXPECT_TRUE(old);
  EXPECT_TRUE(fresh);
}

TEST(CrashModel, Ext4KeepsDirectoryOperationsInOrderAndPerDirectoryDoesNot) {
  Image initial;
  initial.dirs = {"", "x", "y"};
  initial.files = {{"x/a", "1"}, {"y/b", "2"}};
  const std::string t = "unlink x/a\nunlink y/b\nmark end\n";
  Trace trace = parse_trace(t, initial);
  for (Model model : {Model::kExt4Ordered, Model::kPerDirectory}) {
    CrashStates states(trace, initial, model);
    bool b_gone_a_kept = false;
    for (const auto& s : all_states(states)) {
      b_gone_a_kept |= s.image.files.count("x/a") && !s.image.files.count("y/b");
    }
    EXPECT_EQ(b_gone_a_kept, model == Model::kPerDirectory);
  }
}

TEST(CrashModel, UnsyncedAppendsMayBeLostOrTornButSyncedOnesStay) {
  Image initial;
  std::string t = "create 3 f\nopen 3 241 f\n" + write_rec(3, 0, std::string(600, 'a')) +
                  "fsync 3\nsync\n" + write_rec(3, 600, std::string(2000, 'b')) + "mark end\n";
  Trace trace = parse_trace(t, initial);
  CrashStates states(trace, initial, Model::kExt4Ordered);
  std::mt19937_64 rng(3);
  bool lost = false, torn = false, whole = false;
  for (const auto& s : states.states_at(trace.ops.size(), 64, rng)) {
    if (s.choice.crash_point <= 4) continue;  // the cut fell before the sync
    const std::string& f = s.image.files.at("f");
    ASSERT_GE(f.size(), 600u);
    EXPECT_EQ(f.substr(0, 600), std::string(600, 'a'));
    if (f.size() == 600) lost = true;
    if (f.size() == 2600 && f.substr(600) == std::string(2000, 'b')) whole = true;
    if (f.size() > 600 && f.substr(600) != std::string(f.size() - 600, 'b')) torn = true;
  }
  EXPECT_TRUE(lost);
  EXPECT_TRUE(whole);
  EXPECT_TRUE(torn);  // a hole of zeros where a sector was lost
}

TEST(CrashModel, FallocateExtendsWithZerosUnlessKeepSize) {
  Image initial;
  std::string t = "create 3 f\nopen 3 241 f\nfalloc 3 0 0 8192\nfalloc 3 1 0 65536\n" +
                  write_rec(3, 0, "hi") + "fsync 3\n";
  Trace trace = parse_trace(t, initial);
  CrashStates states(trace, initial, Model::kExt4Ordered);
  Image end = states.issued(trace.ops.size());
  ASSERT_EQ(end.files["f"].size(), 8192u);
  EXPECT_EQ(end.files["f"].substr(0, 3), std::string("hi\0", 3));
}

TEST(CrashModel, TheSameSeedGivesTheSameStates) {
  Image initial = old_a();
  Trace trace = parse_trace(atomic_replace(false, false), initial);
  CrashStates states(trace, initial, Model::kPerDirectory);
  std::mt19937_64 a(11), b(11);
  auto sa = states.states_at(trace.ops.size(), 16, a);
  auto sb = states.states_at(trace.ops.size(), 16, b);
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) EXPECT_EQ(sa[i].image, sb[i].image);
}

TEST(CrashModel, ADirectoryRemovedTakesItsUnsyncedChildrenWithIt) {
  Image initial;
  initial.dirs = {"", "c"};
  initial.files = {{"c/m", "1"}};
  Trace trace = parse_trace("unlink c/m\nfsyncdir c\nrmdir c\nfsyncdir \n", initial);
  CrashStates states(trace, initial, Model::kPerDirectory);
  for (const auto& s : all_states(states)) {
    if (!s.image.dirs.count("c")) {
      EXPECT_FALSE(s.image.files.count("c/m"));
    }
  }
}

}  // namespace
}  // namespace cairn::powerloss
