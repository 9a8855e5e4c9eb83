// Eigen/Core, safe to include after <resolv.h>: glibc's resolv.h defines the macro _res, a parameter name inside
// Eigen's product kernels (cpp-httplib includes resolv.h, so a host that includes it first would not compile).
#pragma once
#pragma push_macro("_res")
#undef _res
#include <Eigen/Core>
#pragma pop_macro("_res")
