# refit_add_plugin(<name> SOURCES <files...> [OUTPUT_DIRECTORY <dir>])
# Builds a refit plugin: a MODULE library named librefit_<name>.so that links refit::sdk only.
function(refit_add_plugin name)
  cmake_parse_arguments(ARG "" "OUTPUT_DIRECTORY" "SOURCES" ${ARGN})
  set(target refit_plugin_${name})
  add_library(${target} MODULE ${ARG_SOURCES})
  target_link_libraries(${target} PRIVATE refit::sdk)
  # Only the descriptor entry needs to be visible.
  set_target_properties(${target} PROPERTIES OUTPUT_NAME refit_${name} PREFIX lib
    CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
  # Every plugin built here, in order (refit's own tree: the `refit_runtime` target builds them).
  set_property(GLOBAL APPEND PROPERTY REFIT_PLUGIN_TARGETS ${target})
  if(ARG_OUTPUT_DIRECTORY)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${ARG_OUTPUT_DIRECTORY})
  endif()
endfunction()
