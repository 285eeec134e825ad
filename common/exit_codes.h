#pragma once
/// Exit statuses of the ddprun binary. docs/design.md#exit-codes lists them for users.
/// A failed job exits with its root-cause worker's code (128+N for signal N) unless
/// one of the agent's own codes below applies.
namespace ddprun::common {

inline constexpr int kExitSuccess = 0;
/// A flag, PET_ variable or argument was invalid; nothing was started.
inline constexpr int kExitUsage = 64;
/// Rendezvous failed (closed, timeout, connection or state error).
inline constexpr int kExitRendezvous = 69;
/// The agent itself failed (could not create pipes, log directories, ...).
inline constexpr int kExitInternal = 70;
/// Workers failed more often than --max_restarts allowed (only when max_restarts > 0).
inline constexpr int kExitRestartsExhausted = 75;
/// Do not requeue: the job ended on a failure that a new run would meet again (the same failure
/// in a crash loop, --crash_loop_stop; or an exit code of --fatal_exit_codes).
inline constexpr int kExitDoNotRequeue = 78;

}  // namespace ddprun::common
