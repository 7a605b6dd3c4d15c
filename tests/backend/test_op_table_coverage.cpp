// Every op of resnet_ddp/backend/ops.def has a row in the op-test table (op_table.h), and
// every row names a real op and at least one check: adding an op without a check, or
// renaming one, fails here rather than leaving the op untested on some backend.
#include <catch2/catch.hpp>

#include <set>
#include <string>
#include <vector>

#include "backend/op_table.h"

using namespace rd::test;

namespace {

// The op names, from the list every Backend declaration is generated from.
const std::vector<std::string>& ops_def_names() {
  static const std::vector<std::string> names{
#define RD_BACKEND_OP(name, ...) #name,
#define RD_BACKEND_VIRTUAL(name, ...) #name,
#include "resnet_ddp/backend/ops.def"
  };
  return names;
}

}  // namespace

TEST_CASE("op table: every ops.def op has a row with a check", "[op_table]") {
  REQUIRE(ops_def_names().size() > 30);  // the X-macro expanded
  std::set<std::string> rows;
  for (const OpRow& row : op_table()) {
    INFO("op-test table row " << row.op);
    CHECK(rows.insert(row.op).second);  // one row per op
    CHECK_FALSE(row.checks.empty());
    for (const OpCheck* check : row.checks) CHECK(check != nullptr);
  }
  for (const std::string& op : ops_def_names())
    if (!rows.count(op))
      FAIL_CHECK("ops.def op '" << op << "' has no row in the op-test table (tests/backend/op_table.h)");
  const std::set<std::string> ops(ops_def_names().begin(), ops_def_names().end());
  for (const std::string& row : rows)
    if (!ops.count(row)) FAIL_CHECK("op-test table row '" << row << "' names no ops.def op");
}

TEST_CASE("op table: every check is run by the backends and exercises an op", "[op_table]") {
  std::set<const OpCheck*> in_rows;
  for (const OpRow& row : op_table()) in_rows.insert(row.checks.begin(), row.checks.end());
  const auto& registered = op_checks::all();
  const std::set<const OpCheck*> run(registered.begin(), registered.end());
  for (const OpCheck* check : in_rows)
    if (!run.count(check)) FAIL_CHECK("check '" << check->name << "' is in the table but no backend test runs it");
  for (const OpCheck* check : registered)
    if (!in_rows.count(check)) FAIL_CHECK("check '" << check->name << "' exercises no op of the table");
}
