#pragma once
// What must not change between a run and its resume. A checkpoint records, per recipe key (a
// JSON pointer), the value the run had; a resume whose recipe differs in one of them would not
// continue the same run (another batch size changes every later batch; another dtype or model
// changes what the saved tensors mean), so it is refused with the key named, unless the recipe
// lists that key in /training/resume_allow_changes.
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/recipe.h"
#include "precision/mode.h"

namespace refit {

using ResumeFingerprint = std::map<std::string, std::string>;  // JSON pointer -> canonical value

/// The fingerprint of `recipe` run under `precision`: /training/batch_size,
/// /training/gradient_accumulation, /training/precision, /training/seed, /training/shuffle,
/// /training/drop_last, /data/train (type and config), and per model /models/<i> (name, type,
/// config, weights, adapters, inputs), /models/<i>/trainable, /models/<i>/dtype,
/// /models/<i>/parameters (the rules' match, trainable, dtype) and /models/<i>/ema.
ResumeFingerprint resume_fingerprint(const Recipe& recipe, Precision precision);

/// Throws refit::Error naming every key whose value in `saved` differs from `current` (or is
/// missing from it), except keys listed in `allowed`. Keys only in `current` (a newer refit
/// fingerprints more) are not an error.
void check_resume_fingerprint(const ResumeFingerprint& saved, const ResumeFingerprint& current,
                              const std::vector<std::string>& allowed, const std::filesystem::path& checkpoint);

}  // namespace refit
