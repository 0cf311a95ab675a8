#pragma once
#include "refit/registry.h"

namespace refit {

/// Registers the built-in "causal_lm" objective: next-token cross-entropy of a decoder language
/// model. The data's "labels" are the input ids with -100 wherever no loss is taken (prompts,
/// padding, the first token of each packed sample); the objective shifts them (position t
/// predicts label t+1), as transformers' models do. The loss is a sum over target tokens and
/// count() is their number, so the loop's normaliser is the token count of the whole
/// accumulation window and of every rank: k micro-batches of different lengths give the
/// gradient of one batch holding all their tokens. A model that returns its final hidden states
/// and its "lm_head_weight" gets the cross-entropy in chunks of rows (chunked_cross_entropy.h);
/// one that returns logits gets it directly. Metrics: next-token "accuracy" and, at evaluation,
/// "perplexity" = exp(mean token loss).
void register_causal_lm_objective(Registry& registry);

}  // namespace refit
