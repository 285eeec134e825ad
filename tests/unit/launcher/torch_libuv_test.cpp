#include "launcher/torch_libuv.h"

#include <catch2/catch.hpp>

using namespace ddprun::launcher;

TEST_CASE("the libuv probe's one word is read, anything else is unknown", "[launcher][unit]") {
  CHECK(parse_libuv_probe("missing\n") == TorchLibuv::Missing);
  CHECK(parse_libuv_probe("available\n") == TorchLibuv::Available);
  CHECK(parse_libuv_probe("not-asked\n") == TorchLibuv::NotAsked);
  CHECK(parse_libuv_probe("unknown\n") == TorchLibuv::Unknown);
  CHECK(parse_libuv_probe("") == TorchLibuv::Unknown);
  CHECK(parse_libuv_probe("Traceback (most recent call last):\n") == TorchLibuv::Unknown);
}

TEST_CASE("a torch without libuv gets the agent store off and USE_LIBUV=0, said in one line",
          "[launcher][unit]") {
  const LibuvAdaptation a = adapt_to_libuv(TorchLibuv::Missing, /*agent_store=*/true, {});
  CHECK(a.agent_store_off);
  CHECK(a.set_use_libuv_0);
  CHECK(a.info ==
        "the workers' torch was built without libuv, which its TCPStore asks for by default: "
        "ddprun turns its agent store off (worker rank 0 hosts the store) and sets USE_LIBUV=0 for "
        "the "
        "workers");
}

TEST_CASE("a torch without libuv under --agent_store off only gets USE_LIBUV=0",
          "[launcher][unit]") {
  const LibuvAdaptation a = adapt_to_libuv(TorchLibuv::Missing, /*agent_store=*/false, {});
  CHECK_FALSE(a.agent_store_off);
  CHECK(a.set_use_libuv_0);
  CHECK_THAT(a.info, Catch::EndsWith(": ddprun sets USE_LIBUV=0 for the workers"));
}

TEST_CASE("USE_LIBUV=1 from the user is replaced where torch has no libuv", "[launcher][unit]") {
  const LibuvAdaptation a =
      adapt_to_libuv(TorchLibuv::Missing, /*agent_store=*/false, {{"USE_LIBUV", "1"}});
  CHECK(a.set_use_libuv_0);
}

TEST_CASE("with the store off and USE_LIBUV=0 already nothing changes and nothing is said",
          "[launcher][unit]") {
  const LibuvAdaptation a =
      adapt_to_libuv(TorchLibuv::Missing, /*agent_store=*/false, {{"USE_LIBUV", "0"}});
  CHECK_FALSE(a.agent_store_off);
  CHECK_FALSE(a.set_use_libuv_0);
  CHECK(a.info.empty());
}

TEST_CASE("a torch with libuv, an older torch or no answer change nothing", "[launcher][unit]") {
  for (TorchLibuv probed : {TorchLibuv::Available, TorchLibuv::NotAsked, TorchLibuv::Unknown}) {
    const LibuvAdaptation a = adapt_to_libuv(probed, /*agent_store=*/true, {});
    CHECK_FALSE(a.agent_store_off);
    CHECK_FALSE(a.set_use_libuv_0);
    CHECK(a.info.empty());
  }
}

TEST_CASE("a --no_python command is probed when it names a Python interpreter",
          "[launcher][unit]") {
  CHECK(names_python_interpreter("python3"));
  CHECK(names_python_interpreter("/usr/bin/python3.13"));
  CHECK(names_python_interpreter("python"));
  CHECK_FALSE(names_python_interpreter("/usr/bin/python3-config"));
  CHECK_FALSE(names_python_interpreter("./train"));
  CHECK_FALSE(names_python_interpreter("/opt/pythonic/bin/train"));
}
