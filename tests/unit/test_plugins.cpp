// Plugin loading: descriptor checks before any plugin code runs, factories usable, duplicates
// refused naming both plugins, libraries kept loaded while their objects live.
#include <dlfcn.h>
#include <stdlib.h>

#include "core/plugin_loader.h"
#include "refit/version.h"
#include "data_support.h"
#include "test_support.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_plugins {

using namespace refit;

namespace {
std::string plugin_file(const std::string& name) { return test::test_plugin_dir() + "/librefit_" + name + ".so"; }

bool is_loaded(const std::string& file) {
  void* h = dlopen(file.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (!h) return false;
  dlclose(h);
  return true;
}
}  // namespace

TEST_CASE("a plugin built in the test tree is loaded and its factories are used") {
  Registry registry;
  PluginLoader loader(registry);
  const PluginInfo& info = loader.load("test_good", {test::test_plugin_dir()});
  CHECK(info.name == "test-good");
  CHECK(info.version == "1.2.3");
  CHECK(info.api_version == kPluginApiVersion);
  CHECK(info.torch_version == host_torch_version());
  CHECK(info.registered.size() ==
        6);  // test_stop_after, test_net, test_lora, test_batchnorm_net, test_poisoned, test_constant

  auto issues = std::make_shared<ConfigIssues>();
  ConfigReader cfg(Json{{"in", 4}, {"out", 3}}, "/models/0/config", issues);
  auto build = registry.models.parse("test_net", "/models/0/type", cfg);
  REQUIRE(build);
  auto model = test::tensor_model(build(BuildContext{}));
  CHECK(model->forward(torch::ones({2, 4})).sizes() == torch::IntArrayRef({2, 3}));
  CHECK(registry.models.find("test_net")->provenance.plugin == "test-good");
}

TEST_CASE("a plugin with another API version is refused naming both versions, before register runs") {
  Registry registry;
  PluginLoader loader(registry);
  // register_fn of this plugin calls abort(): reaching it would kill the test.
  CHECK_THROWS_WITH(loader.load(plugin_file("test_wrong_api")),
                    Catch::Contains("plugin API version 999") &&
                        Catch::Contains("provides API version " + std::to_string(kPluginApiVersion)));
  CHECK(registry.models.names().empty());
}

TEST_CASE("duplicate factory names across plugins are an error naming both plugins") {
  Registry registry;
  PluginLoader loader(registry);
  loader.load(plugin_file("test_good"));
  CHECK_THROWS_WITH(loader.load(plugin_file("test_duplicate")), Catch::Contains("duplicate model factory \"test_net\"") &&
                                                                    Catch::Contains("\"test-good\"") &&
                                                                    Catch::Contains("\"test-duplicate\""));
}

TEST_CASE("a missing plugin's error lists every place searched, REFIT_PLUGIN_PATH included") {
  setenv("REFIT_PLUGIN_PATH", "/opt/refit-a:/opt/refit-b", 1);
  // Unset however the case ends: the file's later cases run in the same process (tests/CMakeLists.txt).
  struct Unset {
    ~Unset() { unsetenv("REFIT_PLUGIN_PATH"); }
  } unset;
  Registry registry;
  PluginLoader loader(registry);
  try {
    loader.load("ghost", {"/recipes/plugins"});
    FAIL("no error");
  } catch (const Error& e) {
    std::string m = e.what();
    auto a = m.find("/recipes/plugins/librefit_ghost.so"), b = m.find("/opt/refit-a/librefit_ghost.so"),
         c = m.find("/opt/refit-b/librefit_ghost.so");
    CHECK(a != std::string::npos);
    CHECK(b != std::string::npos);
    CHECK(c != std::string::npos);
    CHECK((a < b && b < c));  // recipe folders first, then REFIT_PLUGIN_PATH in order
  }
}

TEST_CASE("the library stays loaded while an object it created lives, and unloads after") {
  const std::string file = plugin_file("test_good");
  REQUIRE_FALSE(is_loaded(file));
  std::shared_ptr<TensorModel> survivor;
  {
    Registry registry;
    PluginLoader loader(registry);
    loader.load(file);
    auto issues = std::make_shared<ConfigIssues>();
    survivor = test::tensor_model(
        registry.models.parse("test_net", "/t", ConfigReader(Json::object(), "/c", issues))(BuildContext{}));
  }  // registry and loader gone: only the model holds the library now
  CHECK(is_loaded(file));
  CHECK(survivor->forward(torch::ones({1, 4})).size(1) == 2);  // its code still runs
  survivor.reset();
  CHECK_FALSE(is_loaded(file));
}

}  // namespace refit_test_plugins
