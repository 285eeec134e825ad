#pragma once
// The standby hand-over protocol, shared by the agent (agent/standby_pool.h), the C++ worker SDK
// (WorkerContext::from_env) and the Python bootstrap (agent/python/ddprun_standby.py, which
// spells the same values). See docs/design.md, "Standby workers".

namespace ddprun::common {

/// Tells a process it is a standby, and names the descriptor its hand-over arrives on.
inline constexpr const char* kStandbyFdVariable = "DDPRUN_STANDBY_FD";

/// What a standby writes back once it has read a whole, valid hand-over: from then on it is
/// the worker. A standby that never writes it (still loading, or gone) is discarded.
inline constexpr char kStandbyAck = '\x06';  // ASCII ACK

/// Names the descriptor of a Python zygote's control socket (agent/python_zygote.h): a
/// SOCK_SEQPACKET pair on which the zygote says {"ready": pid} once it has imported torch, and
/// answers each fork request ({"env": {...}} with the standby's hand-over descriptor and its
/// stdout and stderr pipes attached) with {"pid": n} or {"error": "..."}.
inline constexpr const char* kZygoteFdVariable = "DDPRUN_ZYGOTE_FD";

/// The largest fork request the zygote reads (the standby's whole environment).
inline constexpr int kZygoteRequestMax = 4 << 20;

}  // namespace ddprun::common
