// The activation functions a linear layer's epilogue can apply (OPTConfig's activation_function values).
#pragma once
#include "opt/version.hpp"

OPT_NAMESPACE_BEGIN

enum class activation { relu, gelu, gelu_new, silu, quick_gelu, tanh, sigmoid };

OPT_NAMESPACE_END
