// Nested results named as Ray flattens them ("eval/loss"): what the stop
// criteria, get_best_result and the schedulers look up (tune/experiment.h).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tune/experiment.h"

namespace cairn::tune::tuner_internal {
namespace {

using json = nlohmann::json;

TEST(ResultNames, ASlashNameReachesANestedNumberAndAFlatKeyComesFirst) {
  const json row = {{"loss", 1.5},
                    {"eval", {{"loss", 0.25}, {"deep", {{"x", 3}}}, {"note", "text"}}},
                    {"eval/loss", 9.0}};
  EXPECT_EQ(number_at(row, "loss"), 1.5);
  EXPECT_EQ(number_at(row, "eval/loss"), 9.0);  // a key spelled so is taken as it is
  EXPECT_EQ(number_at(row, "eval/deep/x"), 3.0);
  EXPECT_FALSE(number_at(row, "eval/note"));  // not a number
  EXPECT_FALSE(number_at(row, "eval/missing"));
  EXPECT_FALSE(number_at(row, "eval/deep"));  // an object
  EXPECT_FALSE(number_at(row, "loss/x"));     // loss is no object
  EXPECT_FALSE(number_at(json{{"a", {{"b", NAN}}}}, "a/b"));
}

TEST(ResultNames, FlatKeysAreAddedForNestedNumbersOnly) {
  const json row = {{"step", 2},
                    {"eval", {{"loss", 0.25}, {"deep", {{"x", 3}}}, {"note", "text"}}},
                    {"eval/loss", 9.0}};
  const json flat = with_flat_keys(row);
  EXPECT_EQ(flat["step"], 2);
  EXPECT_EQ(flat["eval"], row["eval"]);  // the nested object stays
  EXPECT_EQ(flat["eval/loss"], 9.0);     // an existing key is kept
  EXPECT_EQ(flat["eval/deep/x"], 3);
  EXPECT_FALSE(flat.contains("eval/note"));
  EXPECT_EQ(with_flat_keys(json(5)), json(5));
}

}  // namespace
}  // namespace cairn::tune::tuner_internal
