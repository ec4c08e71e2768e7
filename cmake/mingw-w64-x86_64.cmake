# Cross-compiles the CPU build for 64-bit Windows with Debian's MinGW-w64
# (packages mingw-w64, g++-mingw-w64-x86-64-posix). The -posix compilers give
# std::thread and std::mutex (winpthreads); -static links libgcc, libstdc++ and
# winpthread into qinfer.exe, so it runs on a bare Windows (or wine) without
# any MinGW DLLs beside it.
#
#   cmake -S . -B build-mingw -DCMAKE_TOOLCHAIN_FILE=cmake/mingw-w64-x86_64.cmake \
#         -DQINFER_CUDA=OFF -DQINFER_TESTS=OFF -DQINFER_BENCH=OFF
set(CMAKE_SYSTEM_NAME Windows)
set(CMAKE_SYSTEM_PROCESSOR x86_64)

set(QINFER_MINGW_PREFIX x86_64-w64-mingw32)
set(CMAKE_C_COMPILER ${QINFER_MINGW_PREFIX}-gcc-posix)
set(CMAKE_CXX_COMPILER ${QINFER_MINGW_PREFIX}-g++-posix)
set(CMAKE_RC_COMPILER ${QINFER_MINGW_PREFIX}-windres)

# Libraries and headers come from the MinGW sysroot only: the host's
# /usr/include holds glibc headers that break a Windows build. The few
# header-only libraries we use are reached through cmake/host_headers.cmake.
set(CMAKE_FIND_ROOT_PATH /usr/${QINFER_MINGW_PREFIX})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
# pkg-config: only .pc files of the MinGW sysroot, never the host's Linux libraries.
set(ENV{PKG_CONFIG_LIBDIR} /usr/${QINFER_MINGW_PREFIX}/lib/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "")

# -D__USE_MINGW_ANSI_STDIO=1: MinGW's own C99 printf family (%zu, %lld), not
# msvcrt's. -muse-unaligned-vector-move: GCC cannot align the stack to 32/64
# bytes under the Windows x64 ABI, so AVX/AVX-512 spills with aligned moves
# can fault (GCC bug 54412); the assembler makes every such move unaligned.
set(CMAKE_C_FLAGS_INIT "-D__USE_MINGW_ANSI_STDIO=1 -Wa,-muse-unaligned-vector-move")
set(CMAKE_CXX_FLAGS_INIT "-D__USE_MINGW_ANSI_STDIO=1 -Wa,-muse-unaligned-vector-move")
set(CMAKE_EXE_LINKER_FLAGS_INIT "-static -static-libgcc -static-libstdc++")
# Run cross-built helper programs (try_run, gtest discovery) under wine if asked.
find_program(QINFER_WINE wine)
if(QINFER_WINE)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${QINFER_WINE})
endif()
