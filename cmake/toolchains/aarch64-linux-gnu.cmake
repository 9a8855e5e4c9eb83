# Cross build for aarch64 Linux with Debian's g++-aarch64-linux-gnu; the programs run under qemu-user.
#   apt-get install -y g++-aarch64-linux-gnu qemu-user
#   dpkg --add-architecture arm64 && apt-get update
#   apt-get download libsimdjson-dev:arm64 libsimdjson14:arm64 && for d in *.deb; do dpkg -x $d SYSROOT; done
#   cmake -S . -B build-arm64 -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/aarch64-linux-gnu.cmake -DOPT_AARCH64_SYSROOT=SYSROOT
# (installing libsimdjson-dev:arm64 itself would remove the amd64 one: the two packages conflict.) Header-only
# dependencies (Eigen, nlohmann/json, doctest, CLI11) are architecture-independent and come from the host.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(OPT_AARCH64_SYSROOT "$ENV{OPT_AARCH64_SYSROOT}" CACHE PATH "Folder the arm64 packages (libsimdjson) were unpacked into with dpkg -x")
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES OPT_AARCH64_SYSROOT)
if(NOT OPT_AARCH64_SYSROOT)
  message(FATAL_ERROR "aarch64 toolchain: set -DOPT_AARCH64_SYSROOT=<folder with the unpacked arm64 libsimdjson packages>")
endif()
set(simdjson_DIR "${OPT_AARCH64_SYSROOT}/usr/lib/aarch64-linux-gnu/cmake/simdjson" CACHE PATH "arm64 simdjson")
set(CMAKE_FIND_ROOT_PATH "${OPT_AARCH64_SYSROOT}" /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
# ctest runs the test programs through qemu; the arm64 C++ runtime lives in /usr/aarch64-linux-gnu
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64;-L;/usr/aarch64-linux-gnu)
