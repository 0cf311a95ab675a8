#pragma once
// The plugin boundary. A plugin is a MODULE library that exports exactly one entry,
// `refit_plugin_entry` (a Boost.DLL alias of a differently named function), returning a
// descriptor. The host checks the descriptor's versions before it calls anything else.
//
//   static void register_my_plugin(refit::Registry& r) { r.models.add(...); }
//   REFIT_PLUGIN("my-plugin", "1.0.0", register_my_plugin)
#include <boost/dll/alias.hpp>
#include <torch/headeronly/version.h>

#include "refit/registry.h"
#include "refit/version.h"

namespace refit {

/// Plain C layout. `api_version` stays the first field in every future API version so that a
/// host can always read it before trusting anything else.
struct PluginDescriptor {
  unsigned api_version;
  const char* name;
  const char* version;
  const char* torch_version;  // LibTorch the plugin was compiled against, "2.11.0"
  int cxx11_abi;              // _GLIBCXX_USE_CXX11_ABI it was compiled with
  void (*register_fn)(Registry&);
};

/// Name of the exported symbol the host looks up.
inline constexpr const char* kPluginEntrySymbol = "refit_plugin_entry";

#define REFIT_DETAIL_STR2(x) #x
#define REFIT_DETAIL_STR(x) REFIT_DETAIL_STR2(x)
/// LibTorch version string of the headers being compiled against.
#define REFIT_TORCH_VERSION_STRING \
  REFIT_DETAIL_STR(TORCH_VERSION_MAJOR) "." REFIT_DETAIL_STR(TORCH_VERSION_MINOR) "." REFIT_DETAIL_STR(TORCH_VERSION_PATCH)

#ifdef _GLIBCXX_USE_CXX11_ABI
#define REFIT_CXX11_ABI _GLIBCXX_USE_CXX11_ABI
#else
#define REFIT_CXX11_ABI 0
#endif

}  // namespace refit

/// Defines the plugin's descriptor and exports it. The alias name differs from the function
/// name on purpose: BOOST_DLL_ALIAS(f, f) would export a pointer to itself.
#define REFIT_PLUGIN(NAME, VERSION, REGISTER_FN)                                                               \
  extern "C" const ::refit::PluginDescriptor* refit_plugin_descriptor_impl() {                                 \
    static const ::refit::PluginDescriptor descriptor{                                                         \
        ::refit::kPluginApiVersion, NAME, VERSION, REFIT_TORCH_VERSION_STRING, REFIT_CXX11_ABI, &REGISTER_FN}; \
    return &descriptor;                                                                                        \
  }                                                                                                            \
  BOOST_DLL_ALIAS(refit_plugin_descriptor_impl, refit_plugin_entry)
