// The `refit` command line: train, validate, inspect, export, evaluate, report, plugins, --version.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>

#include <CLI/CLI.hpp>
#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/cuda.h>
#include <torch/headeronly/version.h>

#include "core/plugin_loader.h"
#include "core/recipe.h"
#include "memory/host_allocator.h"
#include "memory/process_malloc.h"
#include "precision/bf16_products.h"
#include "refit/version.h"
#include "distributed/world.h"
#include "run/run_report.h"
#include "run/session.h"

namespace {

using namespace refit;

int report(const std::exception& e) {
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

void print_version() {
  std::printf("refit %s (plugin API %u)\nLibTorch %s, C++11 ABI %d\n", kVersion, kPluginApiVersion,
              host_torch_version().c_str(), host_cxx11_abi());
  try {
    const auto& hooks = at::detail::getCUDAHooks();
    if (hooks.versionCUDART() > 0) {
      int v = static_cast<int>(hooks.versionCUDART());
      std::printf("CUDA runtime (LibTorch build) %d.%d, ", v / 1000, (v % 1000) / 10);
    }
  } catch (const std::exception&) {
    std::printf("CUDA: not in this LibTorch build, ");
  }
  std::printf("CUDA devices: %zu\n", static_cast<std::size_t>(torch::cuda::device_count()));
  std::printf("malloc: %s\n", process_malloc().c_str());
  std::printf("CPU bf16 products: %s\n", precision::configure_bf16_products().describe().c_str());
}

/// The recipe as run: the file (already parsed once by load_recipe) with the overrides applied.
Json recipe_document(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  Json document = Json::parse(in);
  apply_overrides(document, overrides);
  return document;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"refit: fine-tune frozen backbones (bf16) with fp32 adapters, on LibTorch"};
  app.require_subcommand(0, 1);
  bool version = false;
  app.add_flag("--version", version, "print refit, LibTorch and CUDA versions");

  std::string recipe_path;
  std::vector<std::string> overrides;
  auto add_recipe_args = [&](CLI::App* sub) {
    sub->add_option("recipe", recipe_path, "recipe JSON file")->required()->check(CLI::ExistingFile);
    sub->add_option("--set", overrides, "override a recipe key, e.g. --set training.seed=3 (repeatable)");
  };
  CLI::App* train = app.add_subcommand("train", "train a recipe");
  add_recipe_args(train);
  bool resume = false;
  train->add_flag("--resume", resume, "continue from the run's latest checkpoint (same as --set training.resume=latest)");
  std::size_t host_cache_mib = 1024;
  train->add_option("--host-cache-mib", host_cache_mib,
                    "CPU memory freed tensors may keep for reuse by later steps, in MiB (0: the system allocator)")
      ->capture_default_str();
  CLI::App* validate = app.add_subcommand(
      "validate", "check a recipe: keys, plugins, factory names and configs, models and data built, fields");
  add_recipe_args(validate);
  CLI::App* inspect = app.add_subcommand("inspect", "build the recipe's models and show parameters, dtypes, memory");
  add_recipe_args(inspect);
  bool list_parameters = false;
  inspect->add_flag("--parameters", list_parameters, "list every parameter: path, trainable, dtype, shape, group");
  CLI::App* export_cmd = app.add_subcommand("export", "write a checkpoint's adapters (PEFT layout) or merged weights");
  add_recipe_args(export_cmd);
  std::string checkpoint, format = "peft", out_dir;
  export_cmd->add_option("--checkpoint", checkpoint, "checkpoint folder (default: the run's latest)");
  export_cmd->add_option("--format", format, "peft (adapter_model.safetensors + adapter_config.json) or merged")
      ->check(CLI::IsMember({"peft", "merged"}));
  export_cmd->add_option("--out", out_dir, "output folder")->required();
  std::string export_dtype;
  export_cmd->add_option("--dtype", export_dtype,
                         "merged: merge in float32 and write this dtype (float32 keeps the whole delta of a bf16 "
                         "base; default: each weight's registered dtype)")
      ->check(CLI::IsMember({"float32", "bfloat16", "float16"}));
  CLI::App* report_cmd = app.add_subcommand(
      "report", "rebuild a run's report.html and metrics.csv from its folder (metrics.jsonl, summary.json, recipe.json)");
  std::string run_dir;
  report_cmd->add_option("run_dir", run_dir, "the run's output folder")->required()->check(CLI::ExistingDirectory);
  CLI::App* evaluate_cmd =
      app.add_subcommand("evaluate", "score a checkpoint on the recipe's val (objective and evaluators) or test data");
  add_recipe_args(evaluate_cmd);
  evaluate_cmd->add_option("--checkpoint", checkpoint, "checkpoint folder (default: the run's latest)");
  std::string split = "val";
  evaluate_cmd->add_option("--split", split, "val (/data/val and /evaluators) or test (/data/test)")
      ->check(CLI::IsMember({"val", "test"}))
      ->capture_default_str();
  CLI::App* plugins = app.add_subcommand("plugins", "list plugins on the search path and what they register");
  std::vector<std::string> plugin_dirs;
  plugins->add_option("--path", plugin_dirs, "extra plugin folder, searched first (repeatable)");

  CLI11_PARSE(app, argc, argv);
  // The session outlives the catch handlers below: objects built by plugins (and the plugin
  // libraries they keep loaded) must still exist while an exception from them is reported.
  std::unique_ptr<Session> session;
  try {
    if (version) {
      print_version();
      return 0;
    }
    if (resume) overrides.push_back("training.resume=latest");
    // Before anything allocates a step's tensors: see memory/host_allocator.h for why.
    if (*train && host_cache_mib > 0)
      install_caching_host_allocator({std::min<std::size_t>(host_cache_mib, std::size_t{1} << 30) << 20});
    // Before any model computes: on a CPU without fast bf16 kernels, bf16 products go through
    // fp32 kernels (precision/bf16_products.h).
    precision::configure_bf16_products();
    if (*train || *validate || *inspect || *export_cmd || *evaluate_cmd) session = std::make_unique<Session>(load_recipe(recipe_path, overrides));
    if (*report_cmd) {
      write_run_report(run_dir);
      std::printf("wrote %s and %s\n", (std::filesystem::path(run_dir) / "report.html").c_str(),
                  (std::filesystem::path(run_dir) / "metrics.csv").c_str());
      return 0;
    }
    if (*train) {
      // In a data-parallel run rank 0 alone writes the run folder (docs/distributed.md).
      auto world = world_from_environment();
      if (!world || world->rank == 0) write_run_recipe(session->recipe().output_dir, recipe_document(recipe_path, overrides));
      session->train(stdout);
      return 0;
    }
    if (*validate) {
      session->validate_built();
      std::printf("%s: OK (%zu model(s), %zu plugin(s))\n", recipe_path.c_str(), session->recipe().models.size(),
                  session->plugins().loaded().size());
      return 0;
    }
    if (*inspect) {
      std::printf("%s", session->inspect(list_parameters).c_str());
      return 0;
    }
    if (*export_cmd) {
      std::optional<std::filesystem::path> ck;
      if (!checkpoint.empty()) ck = std::filesystem::path(checkpoint);
      std::optional<c10::ScalarType> dtype;
      if (!export_dtype.empty()) {
        bool ok = false;
        dtype = parse_dtype_name(export_dtype, &ok);
        if (!ok) throw Error("--dtype: unknown dtype \"" + export_dtype + "\"");
      }
      for (const auto& f : session->export_models(ck, format, out_dir, dtype)) std::printf("wrote %s\n", f.c_str());
      return 0;
    }
    if (*evaluate_cmd) {
      std::optional<std::filesystem::path> ck;
      if (!checkpoint.empty()) ck = std::filesystem::path(checkpoint);
      session->evaluate(ck, split, stdout);
      return 0;
    }
    if (*plugins) {
      Registry registry;
      register_builtins(registry);
      PluginLoader loader(registry);
      std::vector<std::filesystem::path> dirs(plugin_dirs.begin(), plugin_dirs.end());
      std::printf("search path:\n");
      for (const auto& d : PluginLoader::search_path(dirs)) std::printf("  %s\n", d.c_str());
      loader.load_all(dirs);
      for (const auto& p : loader.loaded()) {
        std::printf("\n%s %s  (API %u, LibTorch %s, C++11 ABI %d)\n  %s\n", p.name.c_str(), p.version.c_str(),
                    p.api_version, p.torch_version.c_str(), p.cxx11_abi, p.path.c_str());
        for (const auto& r : p.registered) std::printf("  %-10s %s\n", r.first.c_str(), r.second.c_str());
      }
      std::printf("\nrefit (built-in)\n");
      for (const auto& n : registry.objectives.all())
        if (n.second.provenance.plugin == "refit (built-in)") std::printf("  %-10s %s\n", "objective", n.first.c_str());
      for (const auto& n : registry.evaluators.all())
        if (n.second.provenance.plugin == "refit (built-in)") std::printf("  %-10s %s\n", "evaluator", n.first.c_str());
      return 0;
    }
    std::printf("%s", app.help().c_str());
    return 0;
  } catch (const std::exception& e) {
    return report(e);
  }
}
