// The kernels' plain Eigen references (opt::ref): see opt/kernels/reference.hpp.
#pragma once
#include "opt/kernels/reference.hpp"
