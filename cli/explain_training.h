// The training-side changes of `memscope explain` for a run memscope
// simulated: the `memscope plan` strategies at the run's per-rank batch on
// the run's device memory (run/plan.h's search, capped at that batch).
// Composed here because explain/ may not use run/ (docs/design.md).
#ifndef MEMSCOPE_CLI_EXPLAIN_TRAINING_H_
#define MEMSCOPE_CLI_EXPLAIN_TRAINING_H_

#include <string>

#include "explain/explain.h"

namespace memscope::cli {

// PATH a run directory whose run.json has a "training" section: fills
// e.training, else e.training_note with why the run's options cannot be
// reconstructed (a capture, a replay, a flag run.json does not give plan).
// Other inputs: nothing.
void AddTrainingChanges(const std::string& path, MemoryExplanation& e);

}  // namespace memscope::cli

#endif  // MEMSCOPE_CLI_EXPLAIN_TRAINING_H_
