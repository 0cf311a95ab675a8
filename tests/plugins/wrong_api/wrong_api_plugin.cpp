// A plugin that claims another plugin API version: the host must refuse it before calling
// register (which would abort the test if called).
#include <cstdlib>

#include "refit/plugin.h"

namespace {
void must_not_be_called(refit::Registry&) { std::abort(); }

extern "C" const refit::PluginDescriptor* wrong_api_descriptor() {
  static const refit::PluginDescriptor d{
      999, "test-wrong-api", "0.0.1", REFIT_TORCH_VERSION_STRING, REFIT_CXX11_ABI, &must_not_be_called};
  return &d;
}
}  // namespace

BOOST_DLL_ALIAS(wrong_api_descriptor, refit_plugin_entry)
