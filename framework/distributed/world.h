#pragma once
// Where this process stands in a data-parallel job: its rank, the world size and the rendezvous
// point, read from the variables torchrun (or any launcher following its convention) sets.
#include <optional>
#include <string>

namespace refit {

struct World {
  int rank = 0;
  int size = 1;
  int local_rank = 0;        // the rank on this machine: picks the CUDA device
  std::string master_addr;   // the TCPStore's host
  int master_port = 0;       // the TCPStore's port
  bool agent_store = false;  // torchrun's agent hosts the store: every rank connects as a client
};

/// The world described by RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT and
/// TORCHELASTIC_USE_AGENT_STORE, or nullopt when WORLD_SIZE is unset (one process, no launcher).
/// Throws refit::Error naming the variable when one is missing or malformed.
std::optional<World> world_from_environment();

}  // namespace refit
