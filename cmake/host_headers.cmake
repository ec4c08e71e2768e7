# Header-only libraries for a cross build (MinGW): nlohmann-json, CLI11 and
# cpp-httplib are plain C++ headers, the same for every target, but they live in
# the host's /usr/include next to glibc's headers, which must not be on a
# Windows include path. A folder of symlinks to just those headers, made at
# configure time in the build tree, gives the cross compiler exactly them.
set(QINFER_HOST_INCLUDE "/usr/include" CACHE PATH "where the host's header-only libraries are")
set(_dir ${CMAKE_BINARY_DIR}/host-headers)
file(MAKE_DIRECTORY ${_dir})
foreach(h nlohmann CLI httplib.h)
  if(EXISTS ${QINFER_HOST_INCLUDE}/${h})
    file(CREATE_LINK ${QINFER_HOST_INCLUDE}/${h} ${_dir}/${h} SYMBOLIC)
  else()
    message(WARNING "host header ${QINFER_HOST_INCLUDE}/${h} not found")
  endif()
endforeach()
include_directories(SYSTEM ${_dir})
if(NOT TARGET nlohmann_json::nlohmann_json)
  add_library(nlohmann_json::nlohmann_json INTERFACE IMPORTED)
endif()
unset(_dir)
# cpp-httplib's header is found here too (the server is off in the MinGW build by
# default, since Debian's httplib.h declares what only its Linux library defines).
set(HTTPLIB_INCLUDE_DIR ${CMAKE_BINARY_DIR}/host-headers CACHE PATH "httplib.h for the cross build")
