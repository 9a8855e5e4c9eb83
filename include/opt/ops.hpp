// The kernels (opt::ops): see opt/kernels/kernels.hpp. This header is the short name for them.
#pragma once
#include "opt/kernels/kernels.hpp"
