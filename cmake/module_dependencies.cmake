# Each module may include only its own headers and those of the modules below it (and spdlog
# only through common/log.h):
#
#   launcher -> agent -> rendezvous -> metrics -> common        worker_sdk -> common
#   launcher -> store -> common     launcher -> etcd -> rendezvous (its TLS context), common
#
# Included by the top-level CMakeLists.txt, it fails the configure step on an include that points
# the wrong way; run as a script (cmake -DDDPRUN_SOURCE_DIR=... -P cmake/module_dependencies.cmake,
# the test "module dependencies"), it checks the sources as they are now.
cmake_policy(SET CMP0057 NEW)  # if(IN_LIST) when run with -P
set(_ddprun_allowed_common "common")
set(_ddprun_allowed_metrics "common;metrics")
set(_ddprun_allowed_rendezvous "common;metrics;rendezvous")
set(_ddprun_allowed_agent "common;metrics;rendezvous;agent")
set(_ddprun_allowed_launcher "common;metrics;rendezvous;store;etcd;agent;launcher")
set(_ddprun_allowed_store "common;store")
set(_ddprun_allowed_etcd "common;rendezvous;etcd")
set(_ddprun_allowed_worker_sdk "common;ddprun;worker_sdk")
set(_ddprun_modules common metrics rendezvous store etcd agent launcher worker_sdk)

if(NOT DEFINED DDPRUN_SOURCE_DIR)
  set(DDPRUN_SOURCE_DIR "${PROJECT_SOURCE_DIR}")
endif()

set(_ddprun_violations "")
foreach(_module IN LISTS _ddprun_modules)
  file(GLOB_RECURSE _sources "${DDPRUN_SOURCE_DIR}/${_module}/*.h" "${DDPRUN_SOURCE_DIR}/${_module}/*.cpp")
  foreach(_source IN LISTS _sources)
    # spdlog only through common/log.h, which shares fmt's formatting code.
    file(STRINGS "${_source}" _spdlog REGEX "^#include <spdlog/spdlog.h>")
    if(_spdlog AND NOT _source MATCHES "/common/log\\.h$")
      file(RELATIVE_PATH _rel "${DDPRUN_SOURCE_DIR}" "${_source}")
      list(APPEND _ddprun_violations "${_rel}: #include <spdlog/spdlog.h> (include \"common/log.h\")")
    endif()
    file(STRINGS "${_source}" _includes REGEX "^#include \"[a-z_]+/")
    foreach(_line IN LISTS _includes)
      string(REGEX REPLACE "^#include \"([a-z_]+)/.*" "\\1" _target "${_line}")
      if(NOT _target IN_LIST _ddprun_allowed_${_module})
        file(RELATIVE_PATH _rel "${DDPRUN_SOURCE_DIR}" "${_source}")
        string(REPLACE ";" ", " _allowed "${_ddprun_allowed_${_module}}")
        list(APPEND _ddprun_violations "${_rel}: ${_line} (${_module}/ may include only: ${_allowed})")
      endif()
    endforeach()
  endforeach()
endforeach()

if(_ddprun_violations)
  list(JOIN _ddprun_violations "\n  " _text)
  message(FATAL_ERROR "includes against the module dependency direction "
    "(cmake/module_dependencies.cmake):\n  ${_text}")
endif()
