#pragma once
#include <optional>
#include <string>

#include "common/result.h"

// OpenSSL loaded when first needed, not at start-up (docs/design.md#openssl-on-demand).
// Loading and relocating libssl.so.3 and libcrypto.so.3 costs a process about 1.7 MiB of
// resident memory, yet most jobs use neither TLS, a shared secret nor etcd. ddprun's code
// calls OpenSSL's functions as usual; this module defines each one it calls, and the first
// call of any loads libssl.so.3 (which brings libcrypto.so.3) and forwards to it.

namespace ddprun::rdzv {

/// Loads OpenSSL now, once per process: the configuration of TLS, a secret or etcd calls it so
/// a missing library is reported where the option is read. The error names the library, what
/// needs it and the package to install; `what` says what needs it (e.g. "--rdzv_conf tls_ca").
std::optional<common::Error> load_openssl(const std::string& what);

}  // namespace ddprun::rdzv
