// Memory by component: what `refit inspect` and a run's header estimate against what `refit train`
// measures, on the quickstart (a frozen bf16 ViT with fp32 LoRA and head, AdamW); and
// activations measured lower with gradient checkpointing.
#include <filesystem>
#include <fstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands/inspect.h"
#include "core/recipe_parser.h"
#include "io/remove_tree.h"
#include "memory/host_allocator.h"
#include "memory/process_memory.h"
#include "run_support.h"
#include "test_support.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_memory_report {

namespace fs = std::filesystem;
using namespace refit;
using Json = nlohmann::json;

namespace {

Json run_quickstart(const fs::path& out, bool checkpointing) {
  io::remove_tree(out);
  install_caching_host_allocator();  // as refit train does: the CPU's activation peak is its count
  Assembly assembly(load_recipe(fs::path(test::source_dir()) / "recipes/quickstart.json",
                                {"training.duration=4:step", "training.batch_size=64", "training.gradient_accumulation=2",
                                 "training.num_workers=0", "output.checkpoints.enabled=false",
                                 std::string("models.0.gradient_checkpointing=") + (checkpointing ? "true" : "false"),
                                 "output.dir=" + out.string()}));
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> devnull(std::fopen("/dev/null", "w"), &std::fclose);
  cli::train(assembly, devnull.get());
  Json s;
  std::ifstream(out / "summary.json") >> s;
  return s["memory"];
}

}  // namespace

TEST_CASE("memory by component: the estimate of weights, gradients and optimizer state is within 10 % of the "
          "measurement, and checkpointing lowers the activations") {
  const fs::path base = fs::temp_directory_path() / "refit-tests" / "memory";
  const Json plain = run_quickstart(base / "plain", false);
  for (const char* part : {"frozen_weights", "trainable_weights", "gradients", "optimizer_state"}) {
    INFO(part);
    const double estimated = plain["estimated"][part].get<double>(), measured = plain["measured"][part].get<double>();
    CHECK(measured > 0);
    CHECK(std::abs(estimated - measured) <= 0.1 * measured);
  }
  // AdamW: two float32 moments per trainable element (and a step count per tensor).
  CHECK(plain["measured"]["optimizer_state"].get<double>() >= 2 * plain["measured"]["trainable_weights"].get<double>());
  // The ViT's activations dwarf its LoRA factors; recomputing the four layers keeps far fewer.
  const double activations = plain["measured"]["activations"].get<double>();
  CHECK(activations > plain["measured"]["trainable_weights"].get<double>());
  const Json recomputed = run_quickstart(base / "recomputed", true);
  CHECK(recomputed["measured"]["activations"].get<double>() < 0.7 * activations);

  // refit inspect states the same estimate, and its activations from one measured batch.
  Assembly assembly(load_recipe(fs::path(test::source_dir()) / "recipes/quickstart.json",
                                {"training.batch_size=64", "output.dir=" + (base / "inspect").string()}));
  const std::string table = cli::inspect(assembly);
  CHECK_THAT(table, Catch::Contains("memory by component") && Catch::Contains("optimizer state") &&
                        Catch::Contains("one training batch of 64"));
}

TEST_CASE("process memory: the resident size grows with a touched buffer, and the machine says what is available") {
  const auto before = resident_bytes();
  REQUIRE(before);
  CHECK(*before > 0);
  // 64 MiB written page by page: resident now, whatever the allocator kept before.
  std::vector<char> buffer(64 << 20);
  for (std::size_t i = 0; i < buffer.size(); i += 4096) buffer[i] = static_cast<char>(i);
  const auto after = resident_bytes();
  REQUIRE(after);
  CHECK(*after - *before >= (60 << 20));
  const auto free = available_bytes();
  REQUIRE(free);
  CHECK(*free > 0);
  volatile char keep = buffer[4096];  // the writes above stay
  (void)keep;
}

}  // namespace refit_test_memory_report
