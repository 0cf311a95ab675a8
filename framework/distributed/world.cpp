#include "distributed/world.h"

#include <cerrno>
#include <cstdlib>
#include <limits>

#include "refit/error.h"

namespace refit {

namespace {

const char* variable(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

int integer_variable(const char* name, long lo, long hi, std::optional<int> fallback = std::nullopt) {
  const char* v = variable(name);
  if (!v) {
    if (fallback) return *fallback;
    throw Error(std::string("distributed: ") + name +
                " is not set (WORLD_SIZE is: launch every rank with "
                "torchrun, or set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT)");
  }
  errno = 0;
  char* end = nullptr;
  long n = std::strtol(v, &end, 10);
  if (errno != 0 || end == v || *end != '\0' || n < lo || n > hi)
    throw Error(std::string("distributed: ") + name + "=\"" + v + "\" is not an integer in [" + std::to_string(lo) + ", " +
                std::to_string(hi) + "]");
  return static_cast<int>(n);
}

}  // namespace

std::optional<World> world_from_environment() {
  if (!variable("WORLD_SIZE")) return std::nullopt;
  World w;
  w.size = integer_variable("WORLD_SIZE", 1, 1 << 20);
  w.rank = integer_variable("RANK", 0, w.size - 1);
  w.local_rank = integer_variable("LOCAL_RANK", 0, w.size - 1, 0);
  const char* addr = variable("MASTER_ADDR");
  if (!addr && w.size > 1) throw Error("distributed: MASTER_ADDR is not set (the host of rank 0 or of torchrun's store)");
  w.master_addr = addr ? addr : "127.0.0.1";
  w.master_port = integer_variable("MASTER_PORT", 1, 65535, w.size > 1 ? std::nullopt : std::optional<int>(29500));
  const char* agent = variable("TORCHELASTIC_USE_AGENT_STORE");
  w.agent_store = agent && std::string(agent) == "True";
  return w;
}

}  // namespace refit
