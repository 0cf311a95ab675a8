# The libFuzzer targets (clang, -fsanitize=fuzzer,address), built by the build like every other
# test executable: each source is one compile step of the build graph, shared by the targets that
# use it, run in parallel with the rest of the build and through ccache, with clang's dependency
# file (a header change recompiles what included it). tests/fuzz/run_fuzz.sh seeds a corpus and
# runs a built target. Included from tests/CMakeLists.txt, so the targets are part of refit_tests.
#
# Without clang++ or its libFuzzer runtime no target is defined, and each fuzz test skips.

find_program(REFIT_FUZZ_CLANG NAMES clang++ DOC "clang++ with libFuzzer, for the fuzz targets")
set(REFIT_FUZZ_DIR ${CMAKE_CURRENT_BINARY_DIR}/fuzz)
set(REFIT_FUZZ_AVAILABLE OFF)
if(REFIT_FUZZ_CLANG)
  file(WRITE ${REFIT_FUZZ_DIR}/probe.cpp "extern \"C\" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }\n")
  execute_process(COMMAND ${REFIT_FUZZ_CLANG} -fsanitize=fuzzer ${REFIT_FUZZ_DIR}/probe.cpp -o ${REFIT_FUZZ_DIR}/probe
                  RESULT_VARIABLE probe_rc OUTPUT_QUIET ERROR_QUIET)
  if(probe_rc EQUAL 0)
    set(REFIT_FUZZ_AVAILABLE ON)
  endif()
endif()
if(NOT REFIT_FUZZ_AVAILABLE)
  message(STATUS "fuzz targets: clang++ with libFuzzer not found (Debian: apt-get install clang); the fuzz tests skip")
  return()
endif()
# Several targets share one object's compile step, which Ninja runs once; Makefile generators
# would run it once per target, at the same time (the presets use Ninja).
if(NOT CMAKE_GENERATOR MATCHES "Ninja")
  message(STATUS "fuzz targets: built with the Ninja generator only (this build: ${CMAKE_GENERATOR}); the fuzz tests skip")
  return()
endif()

set(refit_fuzz_launcher "")
if(CMAKE_CXX_COMPILER_LAUNCHER)
  set(refit_fuzz_launcher ${CMAKE_CXX_COMPILER_LAUNCHER})
endif()
# The optimisation level: the ctest runs are 10 s each, so the test build compiles the targets at
# -O0, in 113 CPU-s instead of 177 at -O1 (the nine other than elf_section, cold, 2-core Xeon
# with AVX512-BF16), for 2.5 times fewer executions a second (fuzz_recipe: 27 k in 10 s instead
# of 67 k). A long campaign (tests/fuzz/run_fuzz.sh for minutes or hours) gains from
# -DREFIT_FUZZ_OPTIMIZE=-O1. Line tables are all a sanitizer report needs (file:line frames) and
# compile a fifth faster than full debug information.
set(REFIT_FUZZ_OPTIMIZE -O0 CACHE STRING "Optimisation flag of the fuzz targets (-O0 for the test build, -O1 for long runs)")
set(refit_fuzz_flags -std=c++17 ${REFIT_FUZZ_OPTIMIZE} -gline-tables-only -fsanitize=fuzzer-no-link,address
    -I${PROJECT_SOURCE_DIR}/framework -I${PROJECT_SOURCE_DIR}/include -I${PROJECT_SOURCE_DIR}/plugins
    -isystem ${TORCH_INSTALL_PREFIX}/include -isystem ${TORCH_INSTALL_PREFIX}/include/torch/csrc/api/include)
set(refit_fuzz_torch_libs -L${TORCH_INSTALL_PREFIX}/lib -ltorch_cpu -lc10 -Wl,-rpath,${TORCH_INSTALL_PREFIX}/lib)

# LibTorch's and nlohmann/json's headers (tests/fuzz/fuzz_pch.h), parsed once for the sources
# that include them through refit's headers: about 5 s of each one's 13-19 s (clang, this flags'
# build, 2-core Intel Xeon). The LibTorch-free sources (the text, GGUF and file readers) compile without it: loading
# it cost them more than it saved (jinja.cpp 10.0 -> 11.3 s). A source missing from this list
# only compiles slower.
set(refit_fuzz_pch_sources framework/core/recipe.cpp framework/core/recipe_parser.cpp framework/io/adapter_files.cpp
    framework/io/safetensors.cpp framework/precision/grad_scaler.cpp framework/train/checkpoint.cpp framework/train/rng.cpp
    plugins/lora/lora.cpp tests/fuzz/fuzz_adapter.cpp tests/fuzz/fuzz_checkpoint.cpp tests/fuzz/fuzz_recipe.cpp
    tests/fuzz/fuzz_safetensors.cpp framework/quant/gguf_blocks.cpp framework/model/gguf_names.cpp tests/fuzz/fuzz_gguf.cpp)
set(refit_fuzz_pch ${REFIT_FUZZ_DIR}/fuzz_pch.h.pch)
# Not through ccache: a cached header from a clone at another path would name that clone's
# fuzz_pch.h, which clang refuses.
add_custom_command(OUTPUT ${refit_fuzz_pch}
  COMMAND ${REFIT_FUZZ_CLANG} ${refit_fuzz_flags} -Xclang -fno-pch-timestamp -x c++-header
          -MD -MF ${refit_fuzz_pch}.d ${PROJECT_SOURCE_DIR}/tests/fuzz/fuzz_pch.h -o ${refit_fuzz_pch}
  DEPENDS ${PROJECT_SOURCE_DIR}/tests/fuzz/fuzz_pch.h
  DEPFILE ${refit_fuzz_pch}.d
  COMMENT "Building the fuzz objects' precompiled header"
  VERBATIM)

# refit_fuzz_object(<source relative to the project> <output variable>): one compile step per
# source, whichever targets use it.
function(refit_fuzz_object source out)
  string(REGEX REPLACE "\\.cpp$" ".o" object "${REFIT_FUZZ_DIR}/obj/${source}")
  get_property(defined GLOBAL PROPERTY "refit_fuzz_object:${source}")
  if(NOT defined)
    set_property(GLOBAL PROPERTY "refit_fuzz_object:${source}" ON)
    get_filename_component(folder ${object} DIRECTORY)
    file(MAKE_DIRECTORY ${folder})
    file(RELATIVE_PATH shown ${CMAKE_BINARY_DIR} ${object})
    set(pch "")
    set(pch_file "")
    if(source IN_LIST refit_fuzz_pch_sources)
      set(pch -include-pch ${refit_fuzz_pch})
      set(pch_file ${refit_fuzz_pch})
    endif()
    add_custom_command(OUTPUT ${object}
      COMMAND ${refit_fuzz_launcher} ${REFIT_FUZZ_CLANG} ${refit_fuzz_flags} ${pch} -MD -MF ${object}.d
              -c ${PROJECT_SOURCE_DIR}/${source} -o ${object}
      DEPENDS ${PROJECT_SOURCE_DIR}/${source} ${pch_file}
      DEPFILE ${object}.d
      COMMENT "Building fuzz object ${shown}"
      VERBATIM)
  endif()
  set(${out} ${object} PARENT_SCOPE)
endfunction()

# refit_fuzz_target(<name> SOURCES <sources...> [LIBS <link arguments...>] [DEPENDS <targets...>]):
# tests/fuzz/fuzz_<name>.cpp and the sources it exercises, instrumented, linked into
# ${REFIT_FUZZ_DIR}/fuzz_<name>.
function(refit_fuzz_target name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "SOURCES;LIBS;DEPENDS")
  set(objects)
  foreach(source tests/fuzz/fuzz_${name}.cpp ${arg_SOURCES})
    refit_fuzz_object(${source} object)
    list(APPEND objects ${object})
  endforeach()
  set(binary ${REFIT_FUZZ_DIR}/fuzz_${name})
  set(file_depends)
  foreach(dependency ${arg_DEPENDS})
    get_target_property(type ${dependency} TYPE)
    if(type STREQUAL "OBJECT_LIBRARY")
      list(APPEND file_depends $<TARGET_OBJECTS:${dependency}>)
    else()
      list(APPEND file_depends $<TARGET_FILE:${dependency}>)
    endif()
  endforeach()
  add_custom_command(OUTPUT ${binary}
    COMMAND ${REFIT_FUZZ_CLANG} -fsanitize=fuzzer,address ${objects} ${arg_LIBS} -o ${binary}
    DEPENDS ${objects} ${arg_DEPENDS} ${file_depends}
    COMMENT "Linking fuzz target fuzz_${name}"
    VERBATIM COMMAND_EXPAND_LISTS)
  add_custom_target(refit_fuzz_${name} ALL DEPENDS ${binary})
endfunction()

# OpenMP-compiled gcc objects (refit_core, the LoRA kernels): the wheel's libgomp, the one its
# LibTorch uses (clang's -fopenmp would bring LLVM's libomp beside it).
set(refit_fuzz_gomp ${TORCH_INSTALL_PREFIX}/lib/libgomp.so.1)
if(NOT EXISTS ${refit_fuzz_gomp})
  set(refit_fuzz_gomp -lgomp)
endif()
set(refit_fuzz_io framework/io/safetensors.cpp framework/io/pread_full.cpp framework/io/atomic_output.cpp framework/io/fault.cpp)
refit_fuzz_target(safetensors SOURCES ${refit_fuzz_io} LIBS ${refit_fuzz_torch_libs})
# The reader, and the blocks a GGUF base is kept in ("dtype": "gguf") against it.
refit_fuzz_target(gguf SOURCES framework/io/gguf.cpp framework/io/pread_full.cpp framework/quant/gguf_blocks.cpp
  framework/model/gguf_names.cpp LIBS ${refit_fuzz_torch_libs})
# The template engine, its value semantics and the conversation renderer (ICU: case mapping).
refit_fuzz_target(chat_template SOURCES plugins/text/jinja.cpp plugins/text/jinja_values.cpp plugins/text/chat_template.cpp
  LIBS ${refit_fuzz_torch_libs} -licuuc)
refit_fuzz_target(recipe SOURCES framework/core/recipe.cpp framework/core/recipe_parser.cpp framework/core/duration.cpp
  LIBS ${refit_fuzz_torch_libs})
# The LoRA layers instrumented; their CPU microkernels (no parsing) are the lora plugin's objects.
refit_fuzz_target(adapter SOURCES framework/io/adapter_files.cpp ${refit_fuzz_io} plugins/lora/lora.cpp
  LIBS $<TARGET_OBJECTS:refit_lora_kernels> ${refit_fuzz_torch_libs} -lre2 ${refit_fuzz_gomp} DEPENDS refit_lora_kernels)
# No LibTorch: the tokenizer library's sources and ICU.
refit_fuzz_target(tokenizer_json SOURCES plugins/text/byte_bpe.cpp plugins/text/byte_bpe_load.cpp
  plugins/text/byte_bpe_split.cpp plugins/text/read_file.cpp LIBS -licui18n -licuuc -licudata)
# No LibTorch: the sentence-transformers settings a bert model folder declares.
refit_fuzz_target(model_folder SOURCES plugins/text/declared_pooling.cpp plugins/text/declared_max_length.cpp
                  plugins/text/read_file.cpp)
# No LibTorch: the per-shape decision store (nlohmann/json, header-only).
refit_fuzz_target(shape_store SOURCES framework/precision/shape_routing.cpp)
# No LibTorch: the ELF section reader that checks librefit_cuda.so's build before loading it.
refit_fuzz_target(elf_section SOURCES framework/cuda/elf_section.cpp)

# The checkpoint reader, the gradient scaler's and the RNG's load_state_dict, instrumented
# (coverage-guided); the rest of the framework from this build's refit_core (libstdc++ is the ABI
# of both compilers; the optimizer's load_state_dict comes from there too: clang before 16
# refuses its lambdas' captures of structured bindings in C++17, which gcc accepts). refit_core
# links the tokenizer library (refit generate) and the GGUF reader, in that order, and is
# compiled with OpenMP (at::parallel_for).
set(refit_fuzz_checkpoint_libs $<TARGET_FILE:refit_core> $<TARGET_FILE:refit_text> $<TARGET_FILE:refit_gguf>
    -licui18n -licuuc -lre2 -ldl -lpthread ${refit_fuzz_torch_libs} ${refit_fuzz_gomp})
refit_fuzz_target(checkpoint SOURCES framework/train/checkpoint.cpp ${refit_fuzz_io}
  framework/precision/grad_scaler.cpp framework/train/rng.cpp
  LIBS ${refit_fuzz_checkpoint_libs} DEPENDS refit_core refit_text refit_gguf)
