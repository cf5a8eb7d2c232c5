// memscope run's request (run/run_request.h): a rank's command line carries
// the options given, and MakeRankPlan names the option it refuses.
#include <catch2/catch.hpp>

#include "run/run_request.h"

namespace memscope {
namespace {

TEST_CASE("run request: a rank's command line carries the defaults and the options given") {
  RunRequest r;
  r.model = "mlp";
  r.steps = 2;
  r.batch_size = 8;
  r.lr = 0.5;
  r.find_unused = true;
  r.out = "dir";
  r.alloc_conf = "expandable_segments:True";
  r.alloc_conf_given = true;
  r.checkpoint_step = 1;
  r.checkpoint_step_given = true;
  const std::vector<std::string> expected = {"run",
                                             "--model",
                                             "mlp",
                                             "--steps",
                                             "2",
                                             "--optimizer",
                                             "adam",
                                             "--optimizer-impl",
                                             "foreach",
                                             "--momentum",
                                             "0.90000000000000002",
                                             "--ddp",
                                             "copy",
                                             "--comm-hook",
                                             "none",
                                             "--timeout",
                                             "60",
                                             "--zero-grad",
                                             "none",
                                             "--device-memory",
                                             "80GiB",
                                             "--exec",
                                             "meta",
                                             "--amp",
                                             "none",
                                             "--grad-accum",
                                             "1",
                                             "--attention",
                                             "math",
                                             "--torch-version",
                                             "2.9",
                                             "--out",
                                             "dir",
                                             "--batch-size",
                                             "8",
                                             "--lr",
                                             "0.5",
                                             "--find-unused-parameters",
                                             "--alloc-conf",
                                             "expandable_segments:True",
                                             "--checkpoint-step",
                                             "1"};
  CHECK(ToArgs(r, "copy") == expected);
  r.model_file = "m.json";
  CHECK(ToArgs(r, "view")[2] == "file:m.json");
  CHECK(ToArgs(r, "view")[12] == "view");
}

TEST_CASE("run request: MakeRankPlan names the option it refuses") {
  RunRequest r;
  r.model = "mlp";
  r.zero_grad = "sometimes";
  absl::StatusOr<RankPlan> plan = MakeRankPlan(r, "auto", 1);
  REQUIRE(!plan.ok());
  CHECK(plan.status().message() == "--zero-grad 'sometimes': use none (set_to_none=True) or zeros");
  r.zero_grad = "zeros";
  r.find_unused = true;
  plan = MakeRankPlan(r, "auto", 1);
  REQUIRE(!plan.ok());
  CHECK(plan.status().message() ==
        "DDP options (--bucket-cap-mb, --find-unused-parameters, --static-graph, --comm-hook, "
        "--no-broadcast-buffers) need --ddp copy or view");
  plan = MakeRankPlan(r, "auto", 2);
  REQUIRE(plan.ok());
  CHECK(plan->ddp == "copy");
  CHECK(!plan->train.zero_grad_set_to_none);
  REQUIRE(plan->train.ddp.has_value());
  CHECK(plan->train.ddp->find_unused_parameters);
  CHECK(plan->device_memory == 80ULL << 30);
}

TEST_CASE("run request: --scenario is parsed against the run's ranks and steps") {
  absl::StatusOr<Scenario> sc = ParseScenario("kill:1:2", 2, 3);
  REQUIRE(sc.ok());
  CHECK(sc->kind == Scenario::Kind::kKill);
  CHECK(sc->rank == 1);
  CHECK(sc->step == 2);
  CHECK(ParseScenario("kill:2:0", 2, 3).status().message() ==
        "--scenario 'kill:2:0': rank 2 is not a rank of --world-size 2");
}

}  // namespace
}  // namespace memscope
