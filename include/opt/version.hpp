// opt: header-only OPT inference. Version, ABI namespace and build-time settings.
#pragma once

#define OPT_VERSION_MAJOR 0
#define OPT_VERSION_MINOR 1
#define OPT_VERSION_PATCH 0

// Everything public lives in opt::v0_1 (an inline namespace), so two versions linked into one host cannot
// silently mix their types.
#define OPT_NAMESPACE_BEGIN namespace opt { inline namespace v0_1 {
#define OPT_NAMESPACE_END } }

// ---- optional settings (define before including any opt header) -------------------------------------------
// Largest safetensors JSON header accepted, in bytes (the format's reference implementation uses 100 MB).
#ifndef OPT_MAX_HEADER_BYTES
#define OPT_MAX_HEADER_BYTES (100u * 1024u * 1024u)
#endif
// Largest number of tensors accepted in one safetensors file.
#ifndef OPT_MAX_TENSORS
#define OPT_MAX_TENSORS 1000000u
#endif

// Largest total of KV cache a Batch (and so generate) may hold, in bytes; checked before anything is allocated.
// opt-125m needs 2 * 12 layers * 768 * 4 bytes = 72 KiB per position (151 MiB for a full 2048-token sequence).
// Batch::set_max_cache_bytes changes it at run time.
#ifndef OPT_MAX_KV_BYTES
#define OPT_MAX_KV_BYTES (size_t(16) << 30)
#endif

// OPT_DASSERT: checks for hot loops, compiled out under NDEBUG. Everything a user can get wrong is checked
// at load or at the API boundary with an opt::error instead.
#ifndef OPT_DASSERT
#ifdef NDEBUG
#define OPT_DASSERT(cond) ((void)0)
#else
#include <cassert>
#define OPT_DASSERT(cond) assert(cond)
#endif
#endif
