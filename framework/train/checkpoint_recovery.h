#pragma once
// What a run does with its checkpoint folder before its first step.
#include <filesystem>

#include "train/retention.h"

namespace refit {

/// At the start of a run (after a resume has loaded its checkpoint): removes what a killed run
/// left under root — `.deleting-*` folders (a retention delete cut short: each checkpoint is
/// renamed out of the way before it is removed), the temporary folders and files of processes
/// no longer alive, empty `step-N` folders — and applies the retention policy, which a kill may
/// have interrupted. The checkpoint `latest` names is never deleted.
void recover_checkpoints(const std::filesystem::path& root, const RetentionPolicy& policy);

}  // namespace refit
