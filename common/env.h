#pragma once
#include <map>
#include <string>

// The process environment as a value, shared by the agent (which builds each worker's
// environment from its own) and the worker SDK (which reads its context from it).

namespace ddprun::common {

/// Environment variables by name, as `environ` holds them.
using EnvMap = std::map<std::string, std::string>;

/// The current process environment as a map (entries without '=' are skipped).
EnvMap current_environment();

}  // namespace ddprun::common
