// The `refit` command line: parses the arguments and hands them to one verb in cli/commands/.
#include <algorithm>
#include <cstdio>
#include <fstream>

#include <CLI/CLI.hpp>

#include "cli/commands/evaluate.h"
#include "cli/commands/export.h"
#include "cli/commands/inspect.h"
#include "cli/commands/plugins.h"
#include "cli/commands/generate.h"
#include "cli/commands/predict.h"
#include "cli/commands/report.h"
#include "cli/commands/train.h"
#include "cli/commands/validate.h"
#include "cli/commands/version.h"
#include "core/recipe_parser.h"
#include "cuda/cuda_support.h"
#include "distributed/world.h"
#include "memory/host_allocator.h"
#include "precision/bf16_products.h"
#include "run/assembly.h"
#include "run/run_report.h"

namespace {

using namespace refit;

/// Every option of every verb: CLI11 writes into it, the dispatch reads it.
struct Arguments {
  bool version = false;
  std::string recipe;
  std::vector<std::string> overrides;
  bool resume = false;                   // train
  std::size_t host_cache_mib = 1024;     // train
  bool list_parameters = false;          // inspect
  std::string checkpoint;                // export, evaluate, predict
  std::string format = "peft";           // export
  std::string out_dir;                   // export
  std::string export_dtype;              // export
  std::string split = "val";             // evaluate
  std::string input;                     // predict
  std::string predictions;               // predict: --out
  std::vector<std::string> outputs;      // predict
  std::vector<std::string> chain;        // predict: --models
  std::int64_t top_k = 5;                // predict
  std::int64_t batch_size = 0;           // predict
  std::string run_dir;                   // report
  std::vector<std::string> plugin_dirs;  // plugins
  cli::GenerateOptions generation;       // generate
  std::string generate_out;              // generate: --out
  std::string system;                    // generate: --system
  bool raw_prompts = false;              // generate: --no-chat-template
  CLI::App *train, *validate, *inspect, *export_cmd, *evaluate, *predict, *generate, *report, *plugins;
};

void define_verbs(CLI::App& app, Arguments& a) {
  app.require_subcommand(0, 1);
  app.add_flag("--version", a.version, "print refit, LibTorch and CUDA versions");
  auto add_recipe_args = [&](CLI::App* sub) {
    sub->add_option("recipe", a.recipe, "recipe JSON file")->required()->check(CLI::ExistingFile);
    sub->add_option("--set", a.overrides, "override a recipe key, e.g. --set training.seed=3 (repeatable)");
  };
  a.train = app.add_subcommand("train", "train a recipe");
  add_recipe_args(a.train);
  a.train->add_flag("--resume", a.resume,
                    "continue from the run's latest checkpoint (same as --set training.resume=latest)");
  a.train
      ->add_option("--host-cache-mib", a.host_cache_mib,
                   "CPU memory freed tensors may keep for reuse by later steps, in MiB (0: the system allocator)")
      ->capture_default_str();
  a.validate = app.add_subcommand("validate",
                                  "check a recipe: keys, plugins, factory names and configs, models and data built, fields");
  add_recipe_args(a.validate);
  a.inspect = app.add_subcommand("inspect", "build the recipe's models and show parameters, dtypes, memory");
  add_recipe_args(a.inspect);
  a.inspect->add_flag("--parameters", a.list_parameters, "list every parameter: path, trainable, dtype, shape, group");
  a.export_cmd = app.add_subcommand("export", "write a checkpoint's adapters (PEFT layout) or merged weights");
  add_recipe_args(a.export_cmd);
  a.export_cmd->add_option("--checkpoint", a.checkpoint,
                           "checkpoint folder (default: the run's latest; none: the recipe's own weights)");
  a.export_cmd
      ->add_option("--format", a.format,
                   "an adapter's interchange format (peft: adapter_model.safetensors + adapter_config.json) "
                   "or merged (a model with a transformers config: a folder from_pretrained loads)")
      ->capture_default_str();
  a.export_cmd->add_option("--out", a.out_dir, "output folder")->required();
  a.export_cmd
      ->add_option("--dtype", a.export_dtype,
                   "merged: merge in float32 and write this dtype (float32 keeps the whole delta of a bf16 "
                   "base; default: each weight's registered dtype)")
      ->check(CLI::IsMember({"float32", "bfloat16", "float16"}));
  a.report = app.add_subcommand(
      "report", "rebuild a run's report.html and metrics.csv from its folder (metrics.jsonl, summary.json, recipe.json)");
  a.report->add_option("run_dir", a.run_dir, "the run's output folder")->required()->check(CLI::ExistingDirectory);
  a.evaluate =
      app.add_subcommand("evaluate", "score a checkpoint on the recipe's val (objective and evaluators) or test data");
  add_recipe_args(a.evaluate);
  a.evaluate->add_option("--checkpoint", a.checkpoint, "checkpoint folder (default: the run's latest)");
  a.evaluate->add_option("--split", a.split, "val (/data/val and /evaluators) or test (/data/test)")
      ->check(CLI::IsMember({"val", "test"}))
      ->capture_default_str();
  a.predict = app.add_subcommand("predict", "run a checkpoint on inputs and write one prediction per input (JSONL or CSV)");
  add_recipe_args(a.predict);
  a.predict->add_option("--checkpoint", a.checkpoint,
                        "checkpoint folder (default: the run's latest; none: the recipe's own weights)");
  a.predict
      ->add_option("--input", a.input,
                   "data:train, data:val, data:test, sets:NAME, or a dataset component (a .json file or inline JSON: "
                   "{\"type\": ..., \"config\": {...}})")
      ->required();
  a.predict->add_option("--out", a.predictions, "output file: .jsonl (one JSON object a line) or .csv")->required();
  a.predict
      ->add_option("--outputs", a.outputs, "model outputs to write too, e.g. features,logits (model/field: one model's)")
      ->delimiter(',');
  a.predict->add_option("--models", a.chain, "the models to run, in order (default: the objective's)")->delimiter(',');
  a.predict->add_option("--top-k", a.top_k, "classes with their probabilities per input (0: none)")->capture_default_str();
  a.predict->add_option("--batch-size", a.batch_size, "inputs per batch (default: /training/batch_size)");
  a.generate = app.add_subcommand("generate", "generate text from a decoder language model (with its trained adapters)");
  add_recipe_args(a.generate);
  auto& g = a.generation;
  a.generate->add_option("--checkpoint", a.checkpoint,
                         "checkpoint folder (default: the run's latest; none: the recipe's own weights)");
  a.generate->add_option("--prompts", g.prompts, "JSONL of {\"prompt\"} or {\"messages\"}, or plain lines; - for stdin")
      ->capture_default_str();
  a.generate->add_option("--out", a.generate_out, "write completions to this JSONL file (default: stream to the terminal)");
  a.generate->add_option("--model", g.model, "the model to decode with (default: the objective's last)");
  a.generate->add_option("--tokenizer", g.tokenizer, "tokenizer file or folder (default: /data/train/config/tokenizer)");
  a.generate->add_option("--max-new-tokens", g.max_new_tokens, "new tokens at most per prompt")->capture_default_str();
  a.generate->add_option("--temperature", g.sampling.temperature, "0: greedy; above 0: sampling")->capture_default_str();
  a.generate->add_option("--top-k", g.sampling.top_k, "sample from the k most likely tokens (0: all)")
      ->capture_default_str();
  a.generate->add_option("--top-p", g.sampling.top_p, "sample from the smallest set reaching probability p")
      ->capture_default_str();
  a.generate->add_option("--seed", g.sampling.seed, "the sampling generator's seed")->capture_default_str();
  a.generate->add_option("--stop", g.stop, "end a completion at this text (repeatable)");
  a.generate->add_option("--batch-size", g.batch_size, "prompts decoded together (with --out)")->capture_default_str();
  a.generate->add_option("--system", a.system, "a system message for prompts without one");
  a.generate->add_flag("--no-chat-template", a.raw_prompts, "tokenize prompts as they are, without the chat template");
  a.plugins = app.add_subcommand("plugins", "list plugins on the search path and what they register");
  a.plugins->add_option("--path", a.plugin_dirs, "extra plugin folder, searched first (repeatable)");
}

int report_error(const std::exception& e) {
  if (auto* ce = dynamic_cast<const ConfigError*>(&e)) {
    std::fprintf(stderr, "error: %zu problem(s) in the recipe:\n", ce->issues().size());
    for (const auto& i : ce->issues()) std::fprintf(stderr, "  %s\n", i.to_string().c_str());
  } else if (auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    std::fprintf(stderr, "error: %s\n", c10_error->what_without_backtrace());  // c10's backtrace helps no user
  } else {
    std::fprintf(stderr, "error: %s\n", e.what());
  }
  return 1;
}

std::optional<std::filesystem::path> checkpoint_arg(const Arguments& a) {
  if (a.checkpoint.empty()) return std::nullopt;
  return std::filesystem::path(a.checkpoint);
}

std::optional<c10::ScalarType> dtype_arg(const Arguments& a) {
  if (a.export_dtype.empty()) return std::nullopt;
  bool ok = false;
  auto dtype = parse_dtype_name(a.export_dtype, &ok);
  if (!ok) throw Error("--dtype: unknown dtype \"" + a.export_dtype + "\"");
  return dtype;
}

/// The recipe as run: the file (already parsed once by load_recipe) with the overrides applied.
Json recipe_document(const Arguments& a) {
  std::ifstream in(a.recipe);
  Json document = Json::parse(in);
  apply_overrides(document, a.overrides);
  return document;
}

/// The verbs that read a recipe. `assembly` is the caller's, so that it outlives the caller's
/// catch handlers: objects built by plugins (and the plugin libraries they keep loaded) must still
/// exist while an exception from them is reported.
int run_recipe_verb(const Arguments& a, std::unique_ptr<Assembly>& assembly) {
  assembly = std::make_unique<Assembly>(load_recipe(a.recipe, a.overrides));
  if (*a.train) {
    // In a data-parallel run rank 0 alone writes the run folder (docs/distributed.md).
    auto world = world_from_environment();
    if (!world || world->rank == 0) write_run_recipe(assembly->recipe().output_dir, recipe_document(a));
    cli::train(*assembly, stdout);
  } else if (*a.validate) {
    cli::validate(*assembly);
    std::printf("%s: OK (%zu model(s), %zu plugin(s))\n", a.recipe.c_str(), assembly->recipe().models.size(),
                assembly->plugins().loaded().size());
  } else if (*a.inspect) {
    std::printf("%s", cli::inspect(*assembly, a.list_parameters).c_str());
  } else if (*a.export_cmd) {
    for (const auto& f : cli::export_models(*assembly, checkpoint_arg(a), a.format, a.out_dir, dtype_arg(a)))
      std::printf("wrote %s\n", f.c_str());
  } else if (*a.evaluate) {
    cli::evaluate(*assembly, checkpoint_arg(a), a.split, stdout);
  } else if (*a.predict) {
    cli::PredictOptions o;
    o.checkpoint = checkpoint_arg(a);
    o.input = a.input;
    o.out = a.predictions;
    o.outputs = a.outputs;
    o.models = a.chain;
    o.top_k = a.top_k;
    o.batch_size = a.batch_size;
    cli::predict(*assembly, o, stdout);
  } else if (*a.generate) {
    cli::GenerateOptions o = a.generation;
    o.checkpoint = checkpoint_arg(a);
    if (!a.generate_out.empty()) o.out = std::filesystem::path(a.generate_out);
    if (!a.system.empty()) o.system = a.system;
    o.chat_template = !a.raw_prompts;
    cli::generate(*assembly, o, stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"refit: fine-tune frozen backbones (bf16) with fp32 adapters, on LibTorch"};
  Arguments a;
  define_verbs(app, a);
  CLI11_PARSE(app, argc, argv);
  std::unique_ptr<Assembly> assembly;
  try {
    cuda::check_support_setting();
    if (a.version) {
      cli::version(stdout);
      return 0;
    }
    if (a.resume) a.overrides.push_back("training.resume=latest");
    // Before anything allocates a step's tensors: see memory/host_allocator.h for why.
    if (*a.train && a.host_cache_mib > 0)
      install_caching_host_allocator({std::min<std::size_t>(a.host_cache_mib, std::size_t{1} << 30) << 20});
    // Before any model computes: on a CPU without fast bf16 kernels, bf16 products go through
    // fp32 kernels (precision/bf16_products.h).
    precision::configure_bf16_products();
    if (*a.report) {
      cli::report(a.run_dir, stdout);
      return 0;
    }
    if (*a.plugins) {
      cli::plugins(std::vector<std::filesystem::path>(a.plugin_dirs.begin(), a.plugin_dirs.end()), stdout);
      return 0;
    }
    if (*a.train || *a.validate || *a.inspect || *a.export_cmd || *a.evaluate || *a.predict || *a.generate)
      return run_recipe_verb(a, assembly);
    std::printf("%s", app.help().c_str());
    return 0;
  } catch (const std::exception& e) {
    return report_error(e);
  }
}
