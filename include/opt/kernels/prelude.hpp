// What generic.hpp needs before an ISA header includes it inside its namespace (it includes nothing itself).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "opt/kernels/table.hpp"
