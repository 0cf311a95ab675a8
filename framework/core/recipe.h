#pragma once
// A recipe's parts, as plain values: what the loop, the model registry and the data read. The
// JSON parser that fills them is core/recipe_parser.h (only the assembly and the CLI include
// it). Every key is documented in docs/recipes.md.
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "refit/config.h"
#include "refit/model_spec.h"
#include "precision/grad_scaler.h"
#include "precision/mode.h"
#include "core/duration.h"

namespace refit {

/// A `{ "type": ..., "config": {...} }` entry resolved later against the registry.
struct ComponentSpec {
  std::string type;
  std::string type_pointer;  // JSON pointer of the "type" key, for unknown-type errors
  std::optional<ConfigReader> config;
};

/// A model that is an exponential moving average of another (a DINO/BYOL teacher, "model EMA"):
/// built like its source (same factory, config, weights and adapters), its frozen parameters
/// share the source's storage, its copies of the source's trainable parameters are updated
/// after every optimizer update that was not skipped:  ema = m * ema + (1 - m) * source, with m
/// going from `momentum` to `final_momentum` over the run (cosine, as DINO's teacher).
struct EmaSpec {
  std::string of;  // the source model's name (declared earlier in /models)
  double momentum = 0.996;
  double final_momentum = 1.0;
  std::string schedule = "cosine";  // cosine, constant
};

struct ModelEntry {
  ModelSpec spec;
  std::optional<EmaSpec> ema;  // set: an EMA model (no type/config/weights/adapters of its own)
  ComponentSpec component;
  std::optional<std::filesystem::path> weights;
  std::vector<ComponentSpec> adapters;
  std::vector<std::optional<std::filesystem::path>> adapter_loads;  // PEFT-layout folder to load, per adapter
  std::map<std::string, std::string> inputs;                        // "inputs": model field -> data field it is read from
  std::optional<std::string> gradient_checkpointing;  // regex of the blocks recomputed in the backward (true: ".*")
  // weight_decay_exempt of /models/<i>/optimizer and of each recipe rule's optimizer (by index
  // in spec.rules; a rule with a group): true "1d_and_bias", false "none", unset: inherited.
  std::optional<bool> exempt_1d_and_bias;
  std::vector<std::optional<bool>> rule_exempt_1d_and_bias;
  std::string pointer;  // "/models/0"
};

enum class NonFinitePolicy { skip, raise };

/// What the learning-rate schedule counts: optimizer updates that were applied (a skipped,
/// non-finite window holds the schedule, as Accelerate's scheduler does), or iterations
/// (updates attempted, skipped ones included: a PyTorch loop calling scheduler.step() after
/// scaler.step()).
enum class ScheduleCounts { applied_updates, iterations };

struct OptimizerSpec {
  std::string type = "adamw";  // adamw, adam, sgd
  double lr = 1e-3;
  double weight_decay = 0.01;
  std::pair<double, double> betas{0.9, 0.999};
  double eps = 1e-8;
  double momentum = 0.0;  // sgd
  bool nesterov = false;  // sgd
  bool fused = true;      // adam/adamw: one ATen fused kernel per group (_fused_adam(w)_)
  // Parameters that are 1-D (biases, norm scales, LayerScale) or named "...bias" get no weight
  // decay: each group's are moved to a group "<group>.no_decay" with weight_decay 0 (as HF
  // Trainer and timm do). /optimizer/weight_decay_exempt "none" turns this off; per group by
  // /models/<i>/optimizer or /models/<i>/parameters/<j>/optimizer (ModelEntry).
  bool exempt_1d_and_bias = true;
};

struct SchedulerSpec {
  std::string type = "constant";  // constant, linear, cosine, step
  std::int64_t warmup = 0;        // optimizer iterations of linear warmup
  double min_lr_ratio = 0.0;      // cosine/linear floor as a fraction of the base lr
  std::int64_t step_size = 1;     // step: iterations between decays
  double gamma = 0.1;             // step: decay factor
};

/// `/training/early_stopping`: stop when the validation metric has not improved for `patience`
/// evaluations (train/early_stopping.h).
struct EarlyStoppingSpec {
  bool enabled = false;  // the object is present
  std::string metric = "loss";
  bool maximize = false;      // "mode": "max"
  std::int64_t patience = 3;  // evaluations without improvement before the run stops
  double min_delta = 0;       // an improvement is larger than this
  bool restore_best = false;  // the final weights (checkpoint, export) are the best evaluated ones
};

/// `/training/distributed`: how a run launched by torchrun talks to its other ranks (see
/// docs/distributed.md). Without a launcher (no WORLD_SIZE) none of it applies.
struct DistributedSpec {
  std::string backend = "auto";  // "auto" (NCCL on CUDA, Gloo otherwise), "gloo" or "nccl"
  double timeout_s = 300;        // a rank that stops answering fails the others after this long
  std::int64_t bucket_mib = 25;  // gradients travel in flat buckets of at most this size
};

struct TrainingSpec {
  Duration duration{1, TimeUnit::epoch};
  std::int64_t batch_size = 32;
  std::int64_t gradient_accumulation = 1;
  std::uint64_t seed = 0;
  std::optional<Precision> precision;  // unset: "auto" (see docs/precision.md)
  std::string device = "auto";
  std::optional<Duration> eval_every;
  std::optional<Duration> checkpoint_every;
  std::int64_t log_every = 10;  // steps between progress lines
  std::optional<double> clip_grad_norm;
  std::optional<double> clip_grad_value;
  NonFinitePolicy non_finite = NonFinitePolicy::skip;
  ScheduleCounts schedule_counts = ScheduleCounts::applied_updates;
  bool drop_last = true;
  bool shuffle = true;
  int num_workers = 1;                            // data loader threads (0: load on the loop's thread)
  int prefetch = 4;                               // batches computed ahead
  GradScalerOptions grad_scaler;                  // used in fp16-mixed only
  std::string resume;                             // "", "latest", or a checkpoint directory
  std::vector<std::string> resume_allow_changes;  // fingerprint keys a resume may change (train/resume_fingerprint.h)
  bool eval_at_start = false;                     // evaluate once before the first step (a "before" figure)
  bool cuda_graph = false;                        // capture the training step as a CUDA graph and replay it
  std::int64_t cuda_graph_warmup = 3;             // eager steps before the capture
  DistributedSpec distributed;
  EarlyStoppingSpec early_stopping;
};

struct CheckpointSpec {
  bool enabled = true;         // write checkpoints (when due and at the end)
  std::int64_t keep_last = 0;  // 0 = no limit
  std::int64_t keep_best = 0;
  std::string metric = "loss";
  bool maximize = false;
};

struct Recipe {
  std::string name;
  std::filesystem::path file;      // empty for in-memory recipes
  std::filesystem::path base_dir;  // relative paths resolve against this

  std::vector<std::string> plugins;
  std::vector<std::filesystem::path> plugin_paths;
  std::vector<ModelEntry> models;
  ComponentSpec train_data;
  std::optional<ComponentSpec> val_data;
  std::optional<ComponentSpec> test_data;
  ComponentSpec objective;
  OptimizerSpec optimizer;
  SchedulerSpec scheduler;
  TrainingSpec training;
  std::vector<ComponentSpec> callbacks;
  std::vector<ComponentSpec> evaluators;
  std::vector<std::pair<std::string, ComponentSpec>> data_sets;  // /data/sets/<name>, labelled sets for evaluators
  std::filesystem::path output_dir;
  CheckpointSpec checkpoints;
  bool tensorboard = true;  // /output/tensorboard: a TensorBoard event file in output_dir
  bool memory_log = false;  // /output/memory_log: memory.jsonl, the memory of every step

  std::shared_ptr<ConfigIssues> issues;  // problems found so far (plugin configs add theirs)
};

/// Optimizer group name -> whether it exempts 1-D parameters and biases from weight decay, for
/// the groups whose recipe entries set /optimizer/weight_decay_exempt themselves (a rule's
/// group inherits its model's setting); other groups follow /optimizer.
std::map<std::string, bool> weight_decay_exemptions(const Recipe& recipe);

c10::ScalarType parse_dtype_name(const std::string& s, bool* ok);
const char* dtype_name(c10::ScalarType t);

}  // namespace refit
