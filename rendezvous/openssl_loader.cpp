#include "rendezvous/openssl_loader.h"

#include <dlfcn.h>
#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace ddprun::rdzv {

namespace {

/// The library OpenSSL 3 installs as (Debian's libssl3); its handle resolves libcrypto's
/// functions too, as libssl depends on it.
constexpr const char* kLibrary = "libssl.so.3";

struct Loaded {
  void* handle = nullptr;
  std::string error;  ///< dlerror()'s text when the load failed
};

const Loaded& loaded() {
  static const Loaded library = [] {
    Loaded l;
    l.handle = ::dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
    if (l.handle == nullptr) {
      const char* why = ::dlerror();
      l.error = why ? why : "unknown error";
    }
    return l;
  }();
  return library;
}

std::string failure(const std::string& what, const std::string& why) {
  return "cannot load OpenSSL (" + std::string(kLibrary) + "), which " + what + " needs: " + why +
         "; install Debian's libssl3 package";
}

/// OpenSSL's own `name`, resolved in the loaded library (never this module's definition of the
/// same name). Past load_openssl() this cannot fail for the functions below, all in OpenSSL 3's
/// ABI; if it does, the process cannot go on and says why.
template <typename Fn>
Fn resolve(const char* name) {
  const Loaded& library = loaded();
  void* symbol = library.handle ? ::dlsym(library.handle, name) : nullptr;
  if (symbol == nullptr) {
    const std::string why = library.handle ? std::string(name) + " is missing" : library.error;
    std::fprintf(stderr, "ddprun: %s\n", failure("TLS, a secret or etcd", why).c_str());
    std::abort();
  }
  Fn fn;
  static_assert(sizeof fn == sizeof symbol);
  std::memcpy(&fn, &symbol, sizeof fn);
  return fn;
}

}  // namespace

std::optional<common::Error> load_openssl(const std::string& what) {
  const Loaded& library = loaded();
  if (library.handle == nullptr) return common::Error{failure(what, library.error)};
  return std::nullopt;
}

}  // namespace ddprun::rdzv

// One definition per OpenSSL function ddprun calls, with OpenSSL's own declaration (a
// signature that differs from the header's does not compile). Each resolves its target once.
#define DDPRUN_OPENSSL(ret, name, params, args)                             \
  extern "C" ret name params {                                              \
    static const auto real = ddprun::rdzv::resolve<decltype(&name)>(#name); \
    return real args;                                                       \
  }

// libcrypto
DDPRUN_OPENSSL(int, ASN1_TIME_to_tm, (const ASN1_TIME* s, struct tm* tm), (s, tm))
DDPRUN_OPENSSL(long, BIO_ctrl, (BIO * b, int cmd, long larg, void* parg), (b, cmd, larg, parg))
DDPRUN_OPENSSL(size_t, BIO_ctrl_pending, (BIO * b), (b))
DDPRUN_OPENSSL(int, BIO_free, (BIO * a), (a))
DDPRUN_OPENSSL(int, BIO_new_bio_pair, (BIO * *bio1, size_t writebuf1, BIO** bio2, size_t writebuf2),
               (bio1, writebuf1, bio2, writebuf2))
DDPRUN_OPENSSL(int, BIO_read, (BIO * b, void* data, int dlen), (b, data, dlen))
DDPRUN_OPENSSL(int, BIO_write, (BIO * b, const void* data, int dlen), (b, data, dlen))
DDPRUN_OPENSSL(int, CRYPTO_memcmp, (const void* in_a, const void* in_b, size_t len),
               (in_a, in_b, len))
DDPRUN_OPENSSL(void, ERR_clear_error, (void), ())
DDPRUN_OPENSSL(unsigned long, ERR_get_error, (void), ())
// Boost 1.83's Asio (Debian 13) names the library in its SSL error messages; 1.74's does not.
DDPRUN_OPENSSL(const char*, ERR_lib_error_string, (unsigned long e), (e))
DDPRUN_OPENSSL(const char*, ERR_reason_error_string, (unsigned long e), (e))
DDPRUN_OPENSSL(int, EVP_DecodeBlock, (unsigned char* t, const unsigned char* f, int n), (t, f, n))
DDPRUN_OPENSSL(int, EVP_EncodeBlock, (unsigned char* t, const unsigned char* f, int n), (t, f, n))
DDPRUN_OPENSSL(const EVP_MD*, EVP_sha256, (void), ())
DDPRUN_OPENSSL(unsigned char*, HMAC,
               (const EVP_MD* evp_md, const void* key, int key_len, const unsigned char* data,
                size_t data_len, unsigned char* md, unsigned int* md_len),
               (evp_md, key, key_len, data, data_len, md, md_len))
DDPRUN_OPENSSL(unsigned char*, SHA256, (const unsigned char* d, size_t n, unsigned char* md),
               (d, n, md))
DDPRUN_OPENSSL(int, X509_cmp_current_time, (const ASN1_TIME* s), (s))
DDPRUN_OPENSSL(const ASN1_TIME*, X509_get0_notAfter, (const X509* x), (x))
DDPRUN_OPENSSL(const ASN1_TIME*, X509_get0_notBefore, (const X509* x), (x))
DDPRUN_OPENSSL(int, X509_VERIFY_PARAM_set1_ip_asc, (X509_VERIFY_PARAM * param, const char* ipasc),
               (param, ipasc))
DDPRUN_OPENSSL(const char*, X509_verify_cert_error_string, (long n), (n))

// libssl
DDPRUN_OPENSSL(int, SSL_CTX_check_private_key, (const SSL_CTX* ctx), (ctx))
DDPRUN_OPENSSL(long, SSL_CTX_ctrl, (SSL_CTX * ctx, int cmd, long larg, void* parg),
               (ctx, cmd, larg, parg))
DDPRUN_OPENSSL(void, SSL_CTX_free, (SSL_CTX * ctx), (ctx))
DDPRUN_OPENSSL(X509*, SSL_CTX_get0_certificate, (const SSL_CTX* ctx), (ctx))
DDPRUN_OPENSSL(void*, SSL_CTX_get_default_passwd_cb_userdata, (SSL_CTX * ctx), (ctx))
DDPRUN_OPENSSL(void*, SSL_CTX_get_ex_data, (const SSL_CTX* ssl, int idx), (ssl, idx))
DDPRUN_OPENSSL(SSL_verify_cb, SSL_CTX_get_verify_callback, (const SSL_CTX* ctx), (ctx))
DDPRUN_OPENSSL(int, SSL_CTX_load_verify_locations,
               (SSL_CTX * ctx, const char* CAfile, const char* CApath), (ctx, CAfile, CApath))
DDPRUN_OPENSSL(SSL_CTX*, SSL_CTX_new, (const SSL_METHOD* meth), (meth))
DDPRUN_OPENSSL(void, SSL_CTX_set_client_CA_list, (SSL_CTX * ctx, STACK_OF(X509_NAME) * name_list),
               (ctx, name_list))
DDPRUN_OPENSSL(void, SSL_CTX_set_default_passwd_cb_userdata, (SSL_CTX * ctx, void* u), (ctx, u))
DDPRUN_OPENSSL(int, SSL_CTX_set_ex_data, (SSL_CTX * ssl, int idx, void* data), (ssl, idx, data))
DDPRUN_OPENSSL(uint64_t, SSL_CTX_set_options, (SSL_CTX * ctx, uint64_t op), (ctx, op))
DDPRUN_OPENSSL(void, SSL_CTX_set_verify, (SSL_CTX * ctx, int mode, SSL_verify_cb callback),
               (ctx, mode, callback))
DDPRUN_OPENSSL(int, SSL_CTX_use_PrivateKey_file, (SSL_CTX * ctx, const char* file, int type),
               (ctx, file, type))
DDPRUN_OPENSSL(int, SSL_CTX_use_certificate_chain_file, (SSL_CTX * ctx, const char* file),
               (ctx, file))
DDPRUN_OPENSSL(int, SSL_accept, (SSL * ssl), (ssl))
DDPRUN_OPENSSL(int, SSL_connect, (SSL * ssl), (ssl))
DDPRUN_OPENSSL(long, SSL_ctrl, (SSL * ssl, int cmd, long larg, void* parg), (ssl, cmd, larg, parg))
DDPRUN_OPENSSL(void, SSL_free, (SSL * ssl), (ssl))
DDPRUN_OPENSSL(X509_VERIFY_PARAM*, SSL_get0_param, (SSL * ssl), (ssl))
DDPRUN_OPENSSL(int, SSL_get_error, (const SSL* s, int ret_code), (s, ret_code))
DDPRUN_OPENSSL(void*, SSL_get_ex_data, (const SSL* ssl, int idx), (ssl, idx))
DDPRUN_OPENSSL(int, SSL_get_shutdown, (const SSL* ssl), (ssl))
DDPRUN_OPENSSL(long, SSL_get_verify_result, (const SSL* ssl), (ssl))
DDPRUN_OPENSSL(STACK_OF(X509_NAME) *, SSL_load_client_CA_file, (const char* file), (file))
DDPRUN_OPENSSL(SSL*, SSL_new, (SSL_CTX * ctx), (ctx))
DDPRUN_OPENSSL(int, SSL_read, (SSL * ssl, void* buf, int num), (ssl, buf, num))
DDPRUN_OPENSSL(int, SSL_set1_host, (SSL * s, const char* hostname), (s, hostname))
DDPRUN_OPENSSL(void, SSL_set_bio, (SSL * s, BIO* rbio, BIO* wbio), (s, rbio, wbio))
DDPRUN_OPENSSL(int, SSL_set_ex_data, (SSL * ssl, int idx, void* data), (ssl, idx, data))
DDPRUN_OPENSSL(int, SSL_write, (SSL * ssl, const void* buf, int num), (ssl, buf, num))
DDPRUN_OPENSSL(const SSL_METHOD*, TLS_client_method, (void), ())
DDPRUN_OPENSSL(const SSL_METHOD*, TLS_method, (void), ())
DDPRUN_OPENSSL(const SSL_METHOD*, TLS_server_method, (void), ())
