// The kernels, written once for every instruction set. Not a normal header: each ISA header (scalar.hpp,
// avx2.hpp, avx512.hpp, neon.hpp) includes it inside its own namespace, after defining `struct Simd` (its
// vector type V of W f32 lanes and a dozen operations on it) and inside its target region, so the same source
// compiles to scalar, AVX2, AVX-512 and NEON code. It includes nothing itself.
//
// The order of operations, which is what makes every ISA give the same bits (see kernels.hpp):
// - linear: y[i, r] = a sequential FMA chain over k = 0 .. K-1 of x[i, k] * w[r, k] from +0, then + bias,
//   * scale, act, old + v. I8 and I4 (w = q * s per block of columns): per block b, a = the FMA chain of
//   x[i, k] * q[r, k] over the block from +0, and y = fma(a, s[r, b], y) from y = +0, block after block (q is
//   an integer, exact in f32, however an ISA decodes it). Lanes run over output rows r (a panel column), never
//   over k, so the vector width changes how many rows one instruction serves, not what any row computes.
// - attention's q·k and sums: 16 logical lanes (lane l takes elements l, l + 16, ...; a partial last chunk
//   adds +0 products), reduced as lanes (l, l+8), then (l, l+4), (l, l+2), (l, l+1). An F16 or BF16 cache is
//   widened to f32 exactly as it is read; the arithmetic is the F32 cache's.
// - exp, erf, tanh: the polynomials below, with explicit FMAs; the same on every ISA and in the scalar epilogue.
// - A product that feeds an addition is either one FMA or passes through Simd::keep / opaque() first, so a
//   compiler that contracts a * b + c (GCC does, by default, where FMA exists) cannot change a result.

constexpr int W = Simd::W;             // f32 lanes of V
constexpr int VP = int(ops::kPanel) / W;  // vectors per panel column
static_assert(VP * W == int(ops::kPanel), "a panel column is a whole number of vectors");
using V = Simd::V;

#if defined(OPT_K_NO_UNROLL)  // (scalar.hpp: one lane per "vector", where unrolling buys compile time, not speed)
#define OPT_K_UNROLL _Pragma("GCC unroll 1")
#define OPT_K_UNROLL_COLUMNS _Pragma("GCC unroll 1")
#else
#define OPT_K_UNROLL _Pragma("GCC unroll 16")
// A tile's loop over columns, 4 columns an iteration: on the Intel machine (AVX-512, 2 threads) a 512-token f32
// linear of opt-125m took 0.87-0.93x as long as with one column an iteration (the loop's 4 scalar instructions
// among 26 vector ones, and 8 x rows addressed by base + index each), an int8 or bf16 one 0.91-0.93x; 2 columns
// an iteration gave nothing, 8 no more than 4.
#define OPT_K_UNROLL_COLUMNS _Pragma("GCC unroll 4")
#endif
// The small helpers of a tile's inner loop: always inlined (GCC decides otherwise where it likes: with
// OPT_DISABLE_AVX512, load_col<F32> became a call per column and the AVX2 GEMM ran 4x slower)
#define OPT_K_INLINE inline __attribute__((always_inline))

// One lane: the scalar twin of Simd, used by the epilogues (which work on single outputs) and by tails. Its
// operations are the same IEEE operations as every Simd's, lane for lane.
struct One {
  using V = float;
  static V zero() { return 0.0f; }
  static V set1(float v) { return v; }
  static V load(const float* p) { return *p; }
  static V mul(V a, V b) { return a * b; }
  static V add(V a, V b) { return a + b; }
  static V sub(V a, V b) { return a - b; }
  static V div(V a, V b) { return a / b; }
  static V fma(V a, V b, V c) { return std::fma(a, b, c); }
  static V max(V a, V b) { return a > b ? a : b; }
  static V min(V a, V b) { return a < b ? a : b; }
  static V select_lt(V a, V b, V t, V f) { return a < b ? t : f; }
  static V round_even(V x) { return std::nearbyint(x); }
  static V pow2i(V n) {
    uint32_t u = uint32_t(int32_t(n) + 127) << 23;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  static V abs(V x) { return std::fabs(x); }
  static V copysign(V mag, V sgn) { return std::copysign(mag, sgn); }
  static void keep(V& v) { v = opaque(v); }
};

// ---- elementary functions, for any lane type S (Simd or One): the same operations either way ----------------
namespace fn {
constexpr float kExpLo = -87.3f, kExpHi = 88.3f;

// exp(x): Cephes expf (x = n ln2 + r, |r| <= ln2 / 2, degree-6 polynomial), 2^n built in the exponent bits;
// within 2 ulp of std::exp on [-87, 88]; below -87.3 gives +0, above 88.3 saturates at exp(88.3).
template <class S>
inline typename S::V exp(typename S::V x) {
  using T = typename S::V;
  const T t = S::min(S::max(x, S::set1(kExpLo)), S::set1(kExpHi));
  const T n = S::round_even(S::mul(t, S::set1(1.44269504088896341f)));
  T r = S::fma(n, S::set1(-0.693359375f), t);
  r = S::fma(n, S::set1(2.12194440e-4f), r);
  T p = S::set1(1.9875691500e-4f);
  p = S::fma(p, r, S::set1(1.3981999507e-3f));
  p = S::fma(p, r, S::set1(8.3334519073e-3f));
  p = S::fma(p, r, S::set1(4.1665795894e-2f));
  p = S::fma(p, r, S::set1(1.6666665459e-1f));
  p = S::fma(p, r, S::set1(5.0000001201e-1f));
  T rr = S::mul(r, r);
  p = S::fma(p, rr, S::add(r, S::set1(1.0f)));
  T e = S::mul(p, S::pow2i(n));
  e = S::select_lt(x, S::set1(kExpLo), S::zero(), e);
  S::keep(e);
  return e;
}

// erf(x): the rational approximation of Eigen / XLA (x clamped to [-4, 4]; odd degree-13 over even degree-8).
template <class S>
inline typename S::V erf(typename S::V a) {
  using T = typename S::V;
  const T x = S::max(S::min(a, S::set1(4.0f)), S::set1(-4.0f));
  T x2 = S::mul(x, x);
  S::keep(x2);
  T p = S::fma(x2, S::set1(-2.72614225801306e-10f), S::set1(2.77068142495902e-08f));
  p = S::fma(x2, p, S::set1(-2.10102402082508e-06f));
  p = S::fma(x2, p, S::set1(-5.69250639462346e-05f));
  p = S::fma(x2, p, S::set1(-7.34990630326855e-04f));
  p = S::fma(x2, p, S::set1(-2.95459980854025e-03f));
  p = S::fma(x2, p, S::set1(-1.60960333262415e-02f));
  p = S::mul(x, p);
  T q = S::fma(x2, S::set1(-1.45660718464996e-05f), S::set1(-2.13374055278905e-04f));
  q = S::fma(x2, q, S::set1(-1.68282697438203e-03f));
  q = S::fma(x2, q, S::set1(-7.37332916720468e-03f));
  q = S::fma(x2, q, S::set1(-1.42647390514189e-02f));
  T r = S::div(p, q);
  S::keep(r);
  return r;
}

// tanh(x) = sign(x) (1 - e) / (1 + e), e = exp(-2|x|).
template <class S>
inline typename S::V tanh(typename S::V x) {
  using T = typename S::V;
  const T e = exp<S>(S::mul(S::set1(-2.0f), S::abs(x)));
  T r = S::div(S::sub(S::set1(1.0f), e), S::add(S::set1(1.0f), e));
  r = S::copysign(r, x);
  S::keep(r);
  return r;
}
}  // namespace fn

// act(v) lane by lane, for any lane type S: what the linear epilogue and activate() apply.
template <class S>
inline typename S::V act(activation a, typename S::V v) {
  using T = typename S::V;
  const T one = S::set1(1.0f);
  switch (a) {
    case activation::relu: return S::max(v, S::zero());  // v > 0 ? v : 0
    case activation::gelu: {  // 0.5 v (1 + erf(v / sqrt 2))
      const T e = fn::erf<S>(S::mul(v, S::set1(0.70710678118654752f)));
      T h = S::mul(S::set1(0.5f), v);
      S::keep(h);
      return S::mul(h, S::add(one, e));
    }
    case activation::gelu_new: {  // 0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3)))
      T v2 = S::mul(v, v);
      S::keep(v2);
      T v3 = S::mul(v2, v);
      S::keep(v3);
      const T t = fn::tanh<S>(S::mul(S::set1(0.79788456080286536f), S::fma(S::set1(0.044715f), v3, v)));
      T h = S::mul(S::set1(0.5f), v);
      S::keep(h);
      return S::mul(h, S::add(one, t));
    }
    case activation::silu: return S::div(v, S::add(one, fn::exp<S>(S::mul(S::set1(-1.0f), v))));
    case activation::quick_gelu: return S::div(v, S::add(one, fn::exp<S>(S::mul(S::set1(-1.702f), v))));
    case activation::tanh: return fn::tanh<S>(v);
    case activation::sigmoid: return S::div(one, S::add(one, fn::exp<S>(S::mul(S::set1(-1.0f), v))));
  }
  return v;
}

inline float activate1(activation a, float v) { return act<One>(a, v); }

inline void activate(activation a, float* x, int64_t n) {
  int64_t i = 0;
  for (; i + W <= n; i += W) Simd::store(x + i, act<Simd>(a, Simd::load(x + i)));
  for (; i < n; ++i) x[i] = activate1(a, x[i]);
}

// ---- linear: outer-product tiles over panels ------------------------------------------------------------------
inline float finish(const ops::LinearSeg& g, int64_t r, float v, float old) {
  if (g.bias) v = v + g.bias[r];
  if (g.ep.has_scale) v = opaque(v * g.ep.scale);
  if (g.ep.has_act) v = opaque(activate1(g.ep.act, v));
  if (g.ep.residual) v = old + v;
  return v;
}

// The epilogue of kPanel consecutive outputs v[0, 16) of rows [r, r + 16) into y[0, 16): finish() lane by lane.
inline void finish16(const ops::LinearSeg& g, int64_t r, const float* v, float* y) {
  OPT_K_UNROLL
  for (int c = 0; c < VP; ++c) {
    V a = Simd::load(v + c * W);
    if (g.bias) a = Simd::add(a, Simd::load(g.bias + r + c * W));
    if (g.ep.has_scale) {
      a = Simd::mul(a, Simd::set1(g.ep.scale));
      Simd::keep(a);
    }
    if (g.ep.has_act) {
      a = act<Simd>(g.ep.act, a);
      Simd::keep(a);
    }
    if (g.ep.residual) a = Simd::add(Simd::load(y + c * W), a);
    Simd::store(y + c * W, a);
  }
}

// Weights are prefetched into L2, not L1 (locality 2: prefetcht1 on x86, PLDL2KEEP on ARM). On Zen 4 the L1 hint
// (prefetcht0) cut a single GEMV stream to 11-13 GB/s against 19-22 with the L2 hint; out-of-cache GEMVs on 2
// threads went from ~21-25 to ~30-40 GB/s.
constexpr int kPrefetchLocality = 2;
// Bytes of one panel column of weights of type T.
constexpr int64_t col_bytes_c(dtype t) { return int64_t(ops::panel_column_bytes(t)); }
// How far ahead in a panel: 128 columns, at most 2 KiB (f32, the 16-bit types and I8 2 KiB, I4 1 KiB). Counted
// in columns because a column is what the tile consumes per step. On Zen 5 (2 threads, opt-125m, the weights on
// huge pages, 300 paired rounds of whole decode tokens) 128 columns took 0.93-0.96x (I8) and 0.96x (I4) the time
// of 64; 4 KiB took 0.99x (I8), 1.03x (f32) and 1.05x (bf16) the time of 2 KiB. (With the small matrices on 4 KiB
// pages, before, an I8 decode had streamed 27-29 GB/s with 1 KiB against 22-26 with 2 KiB.)
constexpr int64_t prefetch_distance(dtype t) { return std::min<int64_t>(2048, 128 * col_bytes_c(t)); }

// A prefetch into L2 that the compiler keeps (prelude.hpp prefetch_kept).
OPT_K_INLINE void prefetch_l2(const std::byte* a) { prefetch_kept<kPrefetchLocality>(a); }

// Vector v (W weights of consecutive rows) of a panel column, widened to f32 (I8: the integer q).
template <dtype T>
OPT_K_INLINE V load_w(const std::byte* col, int v) {
  const int64_t e = v * W;
  if constexpr (T == dtype::F32) return Simd::load(reinterpret_cast<const float*>(col) + e);
  else if constexpr (T == dtype::F16) return Simd::load_f16(reinterpret_cast<const uint16_t*>(col) + e);
  else if constexpr (T == dtype::BF16) return Simd::load_bf16(reinterpret_cast<const uint16_t*>(col) + e);
  else return Simd::load_i8(reinterpret_cast<const int8_t*>(col) + e);
}

// All VP vectors of one panel column into wv, each kept in a register (not re-loaded and re-widened for each of
// the tile's FMAs). I4: the column's kPanel / 2 bytes decoded at once into the integers q (exact in f32).
template <dtype T>
OPT_K_INLINE void load_col(const std::byte* col, V* wv) {
  // (kept through a local: keep() on the array element itself made GCC store every weight vector to the stack)
  if constexpr (T == dtype::I4) Simd::load_i4(reinterpret_cast<const uint8_t*>(col), wv);
  OPT_K_UNROLL
  for (int v = 0; v < VP; ++v) {
    V t;
    if constexpr (T == dtype::I4) t = wv[v];
    else t = load_w<T>(col, v);
    Simd::keep(t);
    wv[v] = t;
  }
}

// bf16 weights a pair of vectors at a time where the ISA has it (Simd::kBf16PairPanels panels: AVX-512 two, AVX2
// one): one instruction a vector to widen instead of two, the rows in the pair's own lane order (even rows, odd
// rows). The tile's sums then sit in that order and are put back in rows order before they are stored (and out of
// it when a column range continues stored sums). Each output is the same FMA chain in another lane: the same bits.
// (Templates so that ISAs without the pair compile without its functions.)
template <class S = Simd>
OPT_K_INLINE void load_bf16_pair(const std::byte* col, V& even, V& odd) {
  S::load_bf16_pair(reinterpret_cast<const uint16_t*>(col), even, odd);
}
template <class S = Simd>
OPT_K_INLINE void bf16_pair_to_rows(V& a, V& b) { S::bf16_pair_to_rows(a, b); }
template <class S = Simd>
OPT_K_INLINE void rows_to_bf16_pair(V& a, V& b) { S::rows_to_bf16_pair(a, b); }

// Columns [k0, k1) of a tile (k1 < 0: to K; read only by tile<..., kRange = true>). cont: the FMA chains go on
// from the sums a call over the previous columns stored in out (integer weights: out holds the finished blocks so
// far; k0 then starts a block), so a tile split into column chunks makes the same operations in the same order as
// one call.
struct ColumnRange {
  int64_t k0 = 0, k1 = -1;
  bool cont = false;
  // Not null (with pf): instead of its own weights, the call asks for the bytes [share, share + (k1 - k0) * step)
  // as it goes, step bytes a column (a power of two, at most 256; under 64, a line is asked for again in each
  // column that lies in it): its share of the next column chunk (linear_group_chunks, whose calls over one chunk
  // split the next chunk between them)
  const std::byte* share = nullptr;
  int64_t step = 0;
};

// Output rows j < NP * kPanel (panels p0 ..) of tokens m < MR: one sequential FMA chain over k per output;
// out + m * ldo + p * ps receives token m's kPanel outputs of panel p0 + p. The NP * VP weight vectors of a
// column are loaded once and feed MR FMAs each.
// I8 / I4: the chain runs over one block of columns at a time, from +0, on the integer values; the block's sum
// then joins the output as out = fma(sum, scale, out), out starting from +0.
// Not inlined: a tile gets the whole register file to itself (inlined into the loops around it, GCC spilled
// accumulators to the stack).
template <dtype T, int MR, int NP, bool kRange>
__attribute__((noinline)) void tile(const float* x, int64_t ldx, int64_t K, const PackedMatrix& w, int64_t p0,
                                    float* out, int64_t ldo, int64_t ps, bool pf, ColumnRange cr) {
  // all NP * VP weight vectors of a column live at once when the registers allow it; else one panel's at a time
  // (the MR broadcasts then repeat per panel)
  constexpr bool kAllW = MR * NP * VP + NP * VP + 1 <= Simd::kRegs;
  constexpr bool kI8 = ops::has_scales(T);  // integer weights with scales (I8, I4)
  V acc[MR][NP][VP];
  const std::byte* pp[NP];  // column k of panel p0 + p at pp[p] + k * cs[p]
  int64_t cs[NP];
  OPT_K_UNROLL
  for (int p = 0; p < NP; ++p) pp[p] = w.panel(p0 + p), cs[p] = int64_t(w.column_stride(p0 + p));
  // (kRange false: the whole of [0, K), cr unread, the code of a tile before column ranges)
  const int64_t k0 = kRange ? cr.k0 : 0, k1 = kRange && cr.k1 >= 0 ? cr.k1 : K;
  const bool cont = kRange && cr.cont;
  if (kI8 && !cont)
    OPT_K_UNROLL
    for (int m = 0; m < MR; ++m)
      OPT_K_UNROLL
      for (int p = 0; p < NP; ++p)
        OPT_K_UNROLL
        for (int v = 0; v < VP; ++v) Simd::store(out + m * ldo + p * ps + v * W, Simd::zero());
  const int64_t B = kI8 ? w.block : std::max<int64_t>(1, k1 - k0);  // blocks of columns (one for float weights)
  constexpr int64_t kColBytes = col_bytes_c(T);
  // The panels are read as streams of S adjacent panels (S = min(NP, this build's group of T)) when they lie so
  // (a tile over whole groups, or over adjacent panels of one group, the same column stride for each stream): one
  // pointer and stride a stream, the panels at constant offsets from it. Anything else (a file packed in other
  // groups, a tile across a tail group) reads NP streams of one panel. Both read the same values in the same
  // order. (With a pointer, a stride and a prefetch test per panel, an I8 decode tile ran ~60 instructions a
  // column and spilled them to the stack: ~31 GB/s a thread against ~40 for f32.)
  constexpr int kS = int(std::min<int64_t>(NP, ops::panel_group(T)));
  bool adjacent = kS > 1 && p0 % kS == 0;
  OPT_K_UNROLL
  for (int p = 0; p < NP; ++p)
    adjacent = adjacent && w.panel(p0 + p) == pp[p / kS * kS] + (p % kS) * kColBytes && cs[p] == cs[p / kS * kS];
  // bf16 pairs (load_bf16_pair): kPU panels a pair, the pair's 2 vectors at element e = 0, 1 of the flattened
  // [p][v] from panel p (kPU 2: VP 1, the panels p and p + 1; kPU 1: VP 2, panel p's two vectors); 0: not paired.
  // A 2-panel pair needs the panels adjacent in one group (the span below), so `paired` is known at run time.
  constexpr int kPairP = Simd::kBf16PairPanels > 0 ? Simd::kBf16PairPanels : 1;  // (no remainder by 0 below)
  constexpr int kPU = T == dtype::BF16 && kAllW && Simd::kBf16PairPanels > 0 && kPairP * VP == 2 &&
                              NP % kPairP == 0 && kS % kPairP == 0
                          ? kPairP
                          : 0;
  const bool paired = kPU == 1 || (kPU == 2 && adjacent);
  const int64_t g = w.group;
  // columns ahead: prefetch_distance(T) of a panel, or for f32 where f32_prefetch() says, its bytes of a stream
  // when the tile reads whole groups from end to end (not the column chunks of AVX2's and NEON's 3-6 token
  // steps: with 512 bytes there, on Intel, an AVX2 batch-4 f32 step took 1.05-1.07x as long)
  int64_t ahead_cols = prefetch_distance(T) / kColBytes;
  // Intel's one-token I8 tiles over two streams (Simd::kIntDecodeNp), in matrices of 4 MiB and more: the
  // prefetch distance (2 KiB) in the bytes a column of the tile's streams advances (cs: a 4-panel group's 64), not
  // in one panel's (128 columns: 8 KiB of a 4-panel stream). On the Intel machine (AVX-512, 2 threads, alternating
  // runs): opt-1.3b int8 one-row passes over a 40-token cache (its matrices 4-103 MB) took 0.93-0.97x the time
  // with 32 columns (48-51 ms against 51-54), 64 0.96x, 16 0.99x, 256 1.02x, 512 1.05x, and a micro-benchmark of
  // two int8 streams a thread (convert and FMA, 2 threads, 1 GiB) read 34-36 GB/s 2 KiB ahead against 32-34 with
  // 8 KiB; but opt-125m int8 decode (matrices of 0.6-2.4 MB, and a 39 MB LM head) took ~1.05x as long with 32
  // columns everywhere (4.2-4.6 ms against 4.1-4.3), and about as long as before with them only from 4 MiB. I4
  // (its 128 columns: 4 KiB of a stream) showed no difference (opt-1.3b int4 passes 40-43 ms either way) and
  // keeps them.
  if constexpr (MR == 1 && NP == Simd::kIntDecodeNp && T == dtype::I8)
    if (w.value_bytes() >= (size_t(4) << 20)) ahead_cols = std::max<int64_t>(1, prefetch_distance(T) / cs[0]);
  if constexpr (T == dtype::F32 && !kRange) {
    const int64_t sb = f32_prefetch().stream_bytes;
    if (sb > 0 && NP >= g) ahead_cols = std::max<int64_t>(1, sb / (g * kColBytes));
  }
  const bool shared = kRange && cr.share != nullptr;  // (ColumnRange::share: not this call's own weights)
  const int64_t nb = kI8 ? (k1 - k0 + B - 1) / B : 1;  // blocks (k0 starts one; float weights: one pass)
  const int64_t b0 = kI8 ? k0 / B : 0;
  // I8 / I4 scales: each panel's kPanel floats a block, a stream of their own beside the weights. With pf they
  // are asked for kScaleAhead blocks ahead (each block ends on them: unasked, an I8 decode tile spent ~20% of its
  // samples waiting on the scales' loads, opt-125m on Zen 5). 8 blocks, not 2: on the Intel machine (AVX-512, 2
  // threads) an out-of-cache int8 GEMV (six 65536 x 2048 matrices in turn) streamed 28.7-30.1 GB/s against
  // 27.2-28.0 (4: 28.4-28.6, 16-32: 27.8-28.9; no scales at all: 29.5-30.9), an opt-1.3b int8 one-row pass took
  // ~0.98x as long. (Scales inline in the weights' stream, after each block, measured no faster in the library.)
  const float* sc[NP];
  constexpr int64_t kScaleAhead = 8;
  const int64_t b_end = b0 + nb;
  if constexpr (kI8) {
    OPT_K_UNROLL
    for (int p = 0; p < NP; ++p) sc[p] = w.panel_scales(p0 + p);
  }
  const auto prefetch_scales = [&](int64_t b) __attribute__((always_inline)) {
    if constexpr (kI8)
      if (pf && b < b_end)
        OPT_K_UNROLL
        for (int p = 0; p < NP; ++p) prefetch_kept<3>(reinterpret_cast<const std::byte*>(sc[p] + b * ops::kPanel));
  };
  for (int64_t b = b0; b < b0 + kScaleAhead; ++b) prefetch_scales(b);
  for (int64_t bi = 0; bi < nb; ++bi) {
    const int64_t b = b0 + bi, kb = k0 + bi * B;  // b: the block (integer weights)
    prefetch_scales(b + kScaleAhead);
    OPT_K_UNROLL
    for (int m = 0; m < MR; ++m)
      OPT_K_UNROLL
      for (int p = 0; p < NP; ++p)
        OPT_K_UNROLL
        for (int v = 0; v < VP; ++v)
          acc[m][p][v] = !kI8 && cont ? Simd::load(out + m * ldo + p * ps + v * W) : Simd::zero();
    if constexpr (kPU > 0)
      if (cont && paired)  // (bf16: float weights, the sums stored as they are)
        OPT_K_UNROLL
        for (int m = 0; m < MR; ++m)
          OPT_K_UNROLL
          for (int p = 0; p < NP; p += kPU) rows_to_bf16_pair(acc[m][p][0], acc[m][p + 1 / VP][1 % VP]);
    const int64_t ke = std::min(k1, kb + B);
    // the loop over columns without the prefetches (prefetching: std::integral_constant 0), asking for its own
    // weights ahead (1) or for its share of the next chunk (2), over streams of
    // S panels (span: a std::integral_constant): with the prefetches tested per column in one loop, the prefetch
    // code's registers made the loop without them 1.1x as slow (a 512-token prefill)
    const auto columns = [&](auto prefetching, auto span) __attribute__((always_inline)) {
      constexpr int S = decltype(span)::value, NS = NP / S;
      const std::byte* sp[NS];  // stream i: panels p0 + i * S + j, column k at sp[i] + k * ss[i] + j * kColBytes
      int64_t ss[NS];
      // What is prefetched, with pf (a first pass over these weights, from memory; a prefill block's later passes
      // read it from L2, and prefetching there made a 512-token prefill 1.2x as long): each group of panels
      // (PackedMatrix::group) as one stream of whole group columns, asked for by the stream that holds the
      // group's first panel (a decode tile reads whole groups; the 2-panel tiles of more tokens and the tails
      // read a group's panels one tile after the other, the first asking for them all); group 1 is a stream per
      // panel. prefetch_distance(T) / kColBytes columns ahead, each cache line once.
      bool starts[NS];
      OPT_K_UNROLL
      for (int i = 0; i < NS; ++i) {
        sp[i] = pp[i * S], ss[i] = cs[i * S];
        starts[i] = decltype(prefetching)::value == 1 && (p0 + i * S) % g == 0;
      }
      const auto prefetch_col = [&](int64_t k) __attribute__((always_inline)) {  // the lines column k starts
        OPT_K_UNROLL
        for (int i = 0; i < NS; ++i) {
          if (!starts[i]) continue;
          // straight-line code for up to 4 lines a column (a loop here cost an AVX2 batch-4 step ~10%); a group
          // column wider than 256 bytes (f32 in groups over 4, from a file) is prefetched in part
          const std::byte* a = sp[i] + k * ss[i];
          if (ss[i] >= 64) {
            prefetch_l2(a);
            if (ss[i] > 64) prefetch_l2(a + 64);
            if (ss[i] > 128) prefetch_l2(a + 128);
            if (ss[i] > 192) prefetch_l2(a + 192);
          } else if (((k * ss[i]) & 63) < ss[i]) {
            prefetch_l2(a);
          }
        }
      };
      // this call's share of the next chunk: the lines of its column k, straight-line code (as prefetch_col)
      const auto prefetch_share = [&](int64_t k) __attribute__((always_inline)) {
        const std::byte* a = cr.share + (k - k0) * cr.step;
        prefetch_l2(a);  // (steps under 64 bytes too, every column: asking again costs less than the test)
        if (cr.step > 64) prefetch_l2(a + 64);
        if (cr.step > 128) prefetch_l2(a + 128), prefetch_l2(a + 192);
      };
      if constexpr (decltype(prefetching)::value == 1)
        if (bi == 0)
          for (int64_t c = k0; c < std::min(k0 + ahead_cols, K); ++c) prefetch_col(c);
      OPT_K_UNROLL_COLUMNS
      for (int64_t k = kb; k < ke; ++k) {
        // a stream is long and sequential: ask for it ahead_cols columns ahead (one or two streams per core are
        // too few for the hardware prefetcher at decode's rate)
        if constexpr (decltype(prefetching)::value == 2) prefetch_share(k);
        else if constexpr (decltype(prefetching)::value == 1) prefetch_col(k + ahead_cols);
        const auto col = [&](int p) __attribute__((always_inline)) {
          return sp[p / S] + k * ss[p / S] + (p % S) * kColBytes;
        };
        if constexpr (kAllW) {
          V wv[NP][VP];
          if constexpr (kPU > 0 && S % kPairP == 0) {  // (S 1 with kPU 2: panels not adjacent, one at a time)
            OPT_K_UNROLL
            for (int p = 0; p < NP; p += kPU) {
              V e, o;
              load_bf16_pair(col(p), e, o);
              Simd::keep(e);
              Simd::keep(o);
              wv[p][0] = e, wv[p + 1 / VP][1 % VP] = o;
            }
          } else {
            OPT_K_UNROLL
            for (int p = 0; p < NP; ++p) load_col<T>(col(p), wv[p]);
          }
          OPT_K_UNROLL
          for (int m = 0; m < MR; ++m) {
            V xb = Simd::set1(x[m * ldx + k]);
            Simd::keep(xb);
            OPT_K_UNROLL
            for (int p = 0; p < NP; ++p)
              OPT_K_UNROLL
              for (int v = 0; v < VP; ++v) acc[m][p][v] = Simd::fma(xb, wv[p][v], acc[m][p][v]);
          }
        } else {
          OPT_K_UNROLL
          for (int p = 0; p < NP; ++p) {
            V wv[VP];
            load_col<T>(col(p), wv);
            OPT_K_UNROLL
            for (int m = 0; m < MR; ++m) {
              V xb = Simd::set1(x[m * ldx + k]);
              Simd::keep(xb);
              OPT_K_UNROLL
              for (int v = 0; v < VP; ++v) acc[m][p][v] = Simd::fma(xb, wv[v], acc[m][p][v]);
            }
          }
        }
      }
    };
    // (kS 1: adjacent is false, and the two spans are one instantiation.) A loop of its own for the shares, with
    // one prefetch a column and no test: on the AMD Zen 3 (AVX2, 2 threads, 30 alternating rounds, medians of the
    // paired ratios) the shares asked for inside the loop of the own prefetches, a line only in the column that
    // starts it, made GEMVs of 4 rows take 1.12-1.19x as long (int8 3072 x 768 and 768 x 3072 over 8 matrices in
    // L3, and 1 thread; bf16 1.12x, f16 3 rows 1.11x, bf16 6 rows 1.27x) and the 4-row LM heads 1.23-1.43x (int8)
    // and 1.15x (bf16) from memory. f32, whose shares are a line a column or more, the same.
    const auto columns_pf = [&](auto span) __attribute__((always_inline)) {
      if constexpr (kRange)
        if (pf && shared) return columns(std::integral_constant<int, 2>{}, span);
      if (pf) columns(std::integral_constant<int, 1>{}, span);
      else columns(std::integral_constant<int, 0>{}, span);
    };
    if (adjacent) columns_pf(std::integral_constant<int, kS>{});
    else columns_pf(std::integral_constant<int, 1>{});
    if constexpr (kI8) {
      OPT_K_UNROLL
      for (int p = 0; p < NP; ++p) {
        const float* scb = sc[p] + b * ops::kPanel;
        OPT_K_UNROLL
        for (int m = 0; m < MR; ++m)
          OPT_K_UNROLL
          for (int v = 0; v < VP; ++v) {
            float* o = out + m * ldo + p * ps + v * W;
            Simd::store(o, Simd::fma(acc[m][p][v], Simd::load(scb + v * W), Simd::load(o)));
          }
      }
    }
  }
  if constexpr (kPU > 0)
    if (paired)
      OPT_K_UNROLL
      for (int m = 0; m < MR; ++m)
        OPT_K_UNROLL
        for (int p = 0; p < NP; p += kPU) bf16_pair_to_rows(acc[m][p][0], acc[m][p + 1 / VP][1 % VP]);
  if constexpr (!kI8)
    OPT_K_UNROLL
    for (int m = 0; m < MR; ++m)
      OPT_K_UNROLL
      for (int p = 0; p < NP; ++p)
        OPT_K_UNROLL
        for (int v = 0; v < VP; ++v) Simd::store(out + m * ldo + p * ps + v * W, acc[m][p][v]);
}

// A tile of m tokens over np panels: one call when that shape is compiled (Simd::np_for panels, or kNP for a
// full-height tile), else panel by panel. The shapes hold enough independent accumulators to hide the FMA
// latency within the registers.
template <dtype T, int M, bool kRange>
inline void tile_m(int np, const float* x, int64_t ldx, int64_t K, const PackedMatrix& w, int64_t p0, float* out,
                   int64_t ldo, int64_t ps, bool pf, ColumnRange cr) {
  constexpr int NPm = Simd::np_for(M, int(col_bytes_c(T)));
  if constexpr (NPm > 1) {
    if (np == NPm) return tile<T, M, NPm, kRange>(x, ldx, K, w, p0, out, ldo, ps, pf, cr);
  }
  if constexpr (Simd::kNP > 1 && Simd::kNP != NPm) {  // full prefill tiles, and short ones in a block (linear_panels)
    if (np == Simd::kNP) return tile<T, M, Simd::kNP, kRange>(x, ldx, K, w, p0, out, ldo, ps, pf, cr);
  }
  if constexpr (M == 1 && Simd::kIntDecodeNp > 0 && ops::has_scales(T)) {  // (decode_np)
    if (np == Simd::kIntDecodeNp) return tile<T, 1, Simd::kIntDecodeNp, kRange>(x, ldx, K, w, p0, out, ldo, ps, pf, cr);
  }
  // the last panels of a decode chunk that holds fewer than NPm (a matrix whose panels are not a multiple of it)
  if constexpr (M <= 2 && NPm >= 4) {
    if (np == NPm / 2) return tile<T, M, NPm / 2, kRange>(x, ldx, K, w, p0, out, ldo, ps, pf, cr);
  }
  for (int q = 0; q < np; ++q) tile<T, M, 1, kRange>(x, ldx, K, w, p0 + q, out + q * ps, ldo, ps, pf, cr);
}

// Panels of a decode tile of n tokens: Simd::np_for, or for one token of integer weights on Intel
// Simd::kIntDecodeNp where the ISA has it (two streams of panel groups: see avx512.hpp).
template <dtype T>
inline int decode_np(int64_t n) {
  if constexpr (Simd::kIntDecodeNp > 0 && ops::has_scales(T))
    if (n == 1 && on_intel()) return Simd::kIntDecodeNp;
  return Simd::np_for(int(n), int(col_bytes_c(T)));
}

template <dtype T, bool kRange = false>
inline void tile_any(int m, int np, const float* x, int64_t ldx, int64_t K, const PackedMatrix& w, int64_t p0,
                     float* out, int64_t ldo, int64_t ps, bool pf, ColumnRange cr = {}) {
  static_assert(Simd::kMR >= 1 && Simd::kMR <= 8, "tile heights 1..8");
#define OPT_TILE_CASE(M)                                                                  \
  case M:                                                                                 \
    if constexpr (Simd::kMR >= M) return tile_m<T, M, kRange>(np, x, ldx, K, w, p0, out, ldo, ps, pf, cr); \
    break;
  switch (m) {
    OPT_TILE_CASE(1)
    OPT_TILE_CASE(2)
    OPT_TILE_CASE(3)
    OPT_TILE_CASE(4)
    OPT_TILE_CASE(5)
    OPT_TILE_CASE(6)
    OPT_TILE_CASE(7)
    OPT_TILE_CASE(8)
    default: break;
  }
#undef OPT_TILE_CASE
}

// Outputs v (token-major, kPanel per panel: v + q * ps for panel p + q) of np panels from p into token row y.
inline void finish_panels(const ops::LinearSeg& g, int64_t p, int np, const float* v, int64_t ps, float* y) {
  for (int q = 0; q < np; ++q) {
    const int64_t r0 = (p + q) * ops::kPanel;
    const float* vq = v + q * ps;
    if (r0 + ops::kPanel <= g.w.rows) {
      finish16(g, r0, vq, y + r0);
    } else {
      for (int64_t j = 0; r0 + j < g.w.rows; ++j) y[r0 + j] = finish(g, r0 + j, vq[j], y[r0 + j]);
    }
  }
}

// Whole groups of g's panels from p0 (as long as they last in [p0, p1)) for n tokens, each group in column chunks
// that stay in L1 (16 KiB; one tile of up to 4 tokens, which reads each weight once, takes wider ones): in each
// chunk the tokens go in `tiles` tiles of near-equal heights, each over the group's panels np_for(its height) at a
// time, the first tile reading the chunk from memory, the others from L1; the sums go on from chunk to chunk
// (ColumnRange), so every output is the same chain. out holds n * group * kPanel floats. Returns the first panel
// not done.
// The memory is kept busy by the calls themselves: the calls over a chunk split the next chunk (the next group's
// first, at a group's end: groups lie one after the other) into equal shares, each asking for its share as it
// goes (ColumnRange::share); only the range's first call asks for its own chunk. So the next chunk streams in at
// an even rate over the whole of the current one. On an AMD Zen 3 (AVX2 only, 2 threads, GEMVs over 24 matrices
// of 3072 x 768 that do not fit the caches, 6-8 alternating runs, medians): 4 rows f32 358 us a matrix against
// 416, f16 190 against 241, bf16 217 against 257, with the second call alone asking for the whole next chunk (as
// before); a one-row GEMV, which does not come here, ~140. Before that (no call asking while the later ones
// computed from L1), on Zen 5: AVX2 4 rows f32 213-228 and f16 140-144 us against 189-202 and 125-126 with the
// second call asking.
template <dtype T>
inline int64_t linear_group_chunks(const float* x, int64_t n, int64_t tiles, const ops::LinearSeg& g, int64_t p0,
                                   int64_t p1, float* out) {
  const PackedMatrix& w = g.w;
  const int64_t K = w.cols, G = w.group;
  constexpr int64_t P = ops::kPanel;
  const int64_t bk = std::max<int64_t>(1, w.block);  // (integer weights: each chunk starts a block of scales)
  int64_t KC = std::max<int64_t>(1, 16384 / (G * col_bytes_c(T)) / bk) * bk;
  // One tile of up to 4 tokens (16-bit and integer weights: each weight read once, from L2, so the chunk need not
  // stay in L1; I8 tiles of 1-2 tokens over half a group too): chunks of up to 64 KiB of weights whose inputs
  // (n * KC floats) take at most 12 KiB of L1, fewer calls a group. On the AMD Zen 3 (AVX2, 2 threads, 30
  // alternating rounds over 8 matrices that fit L3 but not L2, medians of the paired ratios) 4 rows of 3072 x 768
  // took 0.93-0.94x as long with 768 columns a chunk than with 256 (int8), 0.94x (bf16), 0.97x (f16); 4 rows of
  // 768 x 3072 0.91-0.92x (int8, 1024 columns), 3 rows 0.91x (int8); the 4-row int8 LM head 0.96-0.98x, bf16
  // 0.96x. Not for 5 or 6 tokens: 512 columns took 0.98-1.03x as long, and 1024 (24 KiB of inputs) 1.17x (bf16,
  // 6 rows).
  if (tiles == 1 && n <= 4) {
    const int64_t wide = std::min<int64_t>(65536 / (G * col_bytes_c(T)), 3072 / n) / bk * bk;
    KC = std::max(KC, wide);
  }
  const auto tile_height = [&](int64_t t) { return int(n / tiles + (t < n % tiles ? 1 : 0)); };
  const auto tile_panels = [&](int m) { return int(std::min<int64_t>(G, Simd::np_for(m, int(col_bytes_c(T))))); };
  int64_t calls = 0;  // a chunk's
  for (int64_t t = 0; t < tiles; ++t) {
    const int s = tile_panels(tile_height(t));
    calls += (G + s - 1) / s;
  }
  int64_t p = p0;
  for (; p + G <= p1 && p % G == 0 && w.group_panels(p) == G; p += G) {
    const int64_t cs = int64_t(w.column_stride(p));  // a group column's bytes
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
      const ColumnRange cr{k0, std::min(K, k0 + KC), k0 > 0};
      const bool first = p == p0 && k0 == 0;             // its first call asks for its own chunk
      const bool last = cr.k1 == K && p + 2 * G > p1;      // no next chunk here to ask for
      const int64_t sharers = last ? 0 : first ? calls - 1 : calls;
      // each share: a power of two of bytes a column, at most 256 (16 KiB over 2 calls of 32 columns or more)
      int64_t step = 0;
      if (sharers > 0) {
        const int64_t per_col = (KC * cs / sharers + (cr.k1 - k0) - 1) / (cr.k1 - k0);
        for (step = 1; step < per_col && step < 256;) step *= 2;
      }
      const std::byte* next = w.panel(p) + cr.k1 * cs;  // (past the group's end: the next group's first columns)
      int64_t call = 0;
      for (int64_t t = 0, i = 0; t < tiles; ++t) {
        const int m = tile_height(t), s = tile_panels(m);
        for (int64_t q = 0; q < G; q += s, ++call) {
          ColumnRange c = cr;
          const int64_t share = first ? call - 1 : call;
          if (share >= 0 && sharers > 0) c.share = next + share * step * (cr.k1 - k0), c.step = step;
          tile_any<T, true>(m, s, x + i * K, K, K, w, p + q, out + i * G * P + q * P, G * P, P,
                            share < 0 || sharers > 0, c);
        }
        i += m;
      }
    }
    for (int64_t i = 0; i < n; ++i) finish_panels(g, p, int(G), out + i * G * P, P, g.y + i * g.ldy);
  }
  return p;
}

// One block of panels [b0, b1) of g for n tokens in `tiles` tiles of near-equal heights (linear_panels' prefill
// path), each tile over the block's panels; the weights read from wm, whose panel p - off is g's panel p (a
// widened copy of the block, or g.w itself with off 0). pf: the first tile asks for the block from memory.
template <dtype T>
inline void linear_block_tiles(const float* x, int64_t n, int64_t tiles, int64_t block, const ops::LinearSeg& g,
                               const PackedMatrix& wm, int64_t off, int64_t b0, int64_t b1, float* out, bool pf) {
  constexpr int64_t P = ops::kPanel, kNP = Simd::kNP;
  const int64_t K = wm.cols;
  for (int64_t t = 0, i = 0; t < tiles; ++t) {
    const int m = int(n / tiles + (t < n % tiles ? 1 : 0));
    const int npm = Simd::np_for(m, int(col_bytes_c(T)));
    const int group = m == Simd::kMR || block % npm != 0 ? int(kNP) : npm;
    for (int64_t p = b0; p < b1;) {
      const int np = p + group <= b1 ? group : 1;
      tile_any<T>(m, np, x + i * K, K, K, wm, p - off, out, np * P, P, pf && i == 0);
      for (int mm = 0; mm < m; ++mm) finish_panels(g, p, np, out + mm * np * P, P, g.y + (i + mm) * g.ldy);
      p += np;
    }
    i += m;
  }
}

// Panels [p0, p1) of g for n tokens. Small batches (n <= kMR: decode) run one tile of n tokens over np_for(n)
// panels at a time, streaming those panels once. Larger ones (prefill) take the panels in blocks that stay in L2
// (~256 KiB of weights), and within a block each kMR-token tile of inputs (in L1) passes over every panel of the
// block. Each output is one tile's, so neither choice changes a result.
template <dtype T>
inline void linear_panels(const float* x, int64_t n, const ops::LinearSeg& g, int64_t p0, int64_t p1) {
  const PackedMatrix& w = g.w;
  const int64_t K = w.cols;
  constexpr int64_t P = ops::kPanel;
  alignas(64) float out[Simd::kMR * 8 * P];  // [token of the tile][panel][P]
  // Decode tiles prefetch their weights; f32's only where f32_prefetch() says so (a panel column is a cache line:
  // on Zen 5 the hardware prefetcher keeps up, on Intel it does not). On Zen 5 (2 threads, opt-125m, paired
  // rounds) prefetching made a decode token 0.96x as long (int8, and a batch-4 step), 0.99x (bf16), and 1.05x
  // (f32). But a tile that reads part of a group (AVX2's one-panel tiles of 3-8 tokens) reads every other line,
  // and without the prefetch of the whole group by its first tile an f32 batch-4 step took 1.7x as long.
  const bool decode_prefetch = col_bytes_c(T) < 64 || (T == dtype::F32 && f32_prefetch().decode);
  // A few more tokens than one tile takes well (f32: 5-32, 16-bit weights: 9-16), where a tile spans several
  // panels (AVX-512: a speculative pass of K + 1 rows, a batch of a few sequences, a short prompt): each whole
  // group of panels in column chunks (linear_group_chunks), ceil(n / kMR) (at least 2) tiles of near-equal heights
  // over each chunk. On the Intel machine (2 threads, passes over a 40-token cache) the blocks below (the first
  // tile streaming 256 KiB, the others computing from L2 with the memory idle) took 1.05-1.4x as long: opt-1.3b
  // bf16 9 / 12 / 16 rows 154-167 / 172-184 / 195-205 ms against 148-151 / 164-176 / 188-203 (8 rows: 110-120);
  // opt-125m f32 9 / 16 / 17 / 20 / 32 rows 26.5-28 / 31-33 / 35.5-36.8 / 39-40 / 47.6-48.2 ms against 22-23.5 /
  // 26-27 / 30.8-31.1 / 33.1-34.8 / 44.6-45.1. For f32 this
  // beats one tile of 5-8 tokens streaming the weights as well (5 / 8 rows 21.5 / 24.5 ms against 20.6-20.9 /
  // 21-21.5); 16-bit weights, which each tile widens again, lose with it there (opt-1.3b bf16 5 / 8 rows 98 / 115
  // ms one tile, 124 / 143 two) and from 17 rows (17 / 24 rows 243 / 279-290 ms blocks, 254 / 297-310 chunks).
  if constexpr (Simd::kNP >= 2 && !ops::has_scales(T)) {
    constexpr int64_t kChunkedFrom = col_bytes_c(T) == 64 ? 5 : Simd::kMR + 1;
    constexpr int64_t kChunkedTo = col_bytes_c(T) == 64 ? 4 * Simd::kMR : 2 * Simd::kMR;
    const int64_t G = w.group;
    if (n >= kChunkedFrom && n <= kChunkedTo && (G == 2 || G == 4) && n * G <= Simd::kMR * 8)
      p0 = linear_group_chunks<T>(x, n, std::max<int64_t>(2, (n + Simd::kMR - 1) / Simd::kMR), g, p0, p1, out);
  }
  if (p0 == p1) return;
  if (n <= Simd::kMR) {
    const int group = decode_np<T>(n);
    // One-panel tiles (AVX2 and NEON, 3 tokens and more) would read a panel group one panel at a time, each tile
    // a pass over the group from memory or L2 (an AVX2 batch-4 f32 step took 1.6-1.8x a batch-1 step). Instead a
    // whole group is taken in column chunks that stay in L1 (linear_group_chunks): in each chunk, tiles of 2
    // tokens (and 1) over the group's panels, the first reading the chunk from memory, the others from L1.
    // f32 only in tiles of 2 tokens: for I8 the 2-token tiles widen each weight n / 2 times, and an AVX2 batch-4
    // int8 step took 1.06x as long (f32 0.93x, bf16 0.91x). 16-bit and I8 weights take one tile of all n tokens
    // over each panel of the chunk instead (each weight widened once): on the Intel machine with OPT_ISA=avx2
    // (opt-125m, 2 threads, alternating runs) bf16 passes of 3 / 4 / 6 tokens took 12.9-13.2 / 13.7-13.9 /
    // 15.5-15.7 ms against 13.6 / 14.0-14.2 / 17.0-17.4, f16 13.1-13.4 / 14.0-14.3 / 16.1-16.6 against 13.8-14.0 /
    // 14.7 / 18.1-18.3. I8 on an AMD Zen 3 (AVX2 only, 2 threads, 7 alternating runs of the seed's batch-4 step
    // with a batch-1 step beside each): 9.6-11.4 ms, 1.80-2.08x the batch-1 step, against 12.0-13.0 ms and
    // 2.25-2.42x with one-panel tiles over whole columns (the first panel of a group streaming it from memory,
    // the other three computing from L2 with the memory idle); 6 more pairs an hour later, the machine's compute
    // slower, were mixed (1.96-2.48x against 2.03-2.47x). I4 is not chunked: its batch-4 step took 1.09-1.27x
    // as long so (2 runs; unpacking the nibbles bounds it on AVX2).
    constexpr int kPieceNp = Simd::np_for(2, int(col_bytes_c(T)));
    if constexpr (kPieceNp >= 2 && T != dtype::I4) {
      const int64_t G = w.group;  // 2, 4 or 8 panels: whole tiles of np_for(2) or np_for(1) panels, out holds it
      // (f32: ceil(n / 2) tiles of near-equal heights, 2 tokens each, the last 1 when n is odd; 16-bit, I8: one)
      constexpr bool kOneTile = T != dtype::F32;
      if (group == 1 && n >= 3 && (G == 2 || G == 4 || G == 8))
        p0 = linear_group_chunks<T>(x, n, kOneTile ? 1 : (n + 1) / 2, g, p0, p1, out);
      // I8 tiles of 1-2 tokens over half a group (AVX2 2 tokens, NEON 1 and 2: np_for 2 of a 4-panel group) the
      // same way, one tile over each half of a chunk: else the tile over the second half reads the group again
      // from L2 with the memory idle. On the AMD Zen 3 (AVX2, 2 threads, 16 alternating rounds, medians of the
      // paired ratios) 2 rows of opt-1.3b's layers (4 layers, 200 MB) took 0.80x as long (1.12x a one-row pass,
      // against 1.46x), its int8 LM head 0.78x (1.06x against 1.41x); chunks of 256 columns in place of 1024 gave
      // 0.93x and 0.82x, a whole group column (2048) 0.87x. opt-125m's layers (matrices of 0.6-2.4 MB): 1.0x.
      // (Speculative decoding's draft passes of 2 rows; a Batch of 2 sequences.) I4, bound by unpacking: 1.0x.
      if (T == dtype::I8 && n <= 2 && group < G && G % group == 0 && (G == 4 || G == 8))
        p0 = linear_group_chunks<T>(x, n, 1, g, p0, p1, out);
    }
    for (int64_t p = p0; p < p1;) {
      const int np = p + group <= p1 ? group : group >= 4 && p + group / 2 <= p1 ? group / 2 : 1;
      tile_any<T>(int(n), np, x, K, K, w, p, out, np * P, P, decode_prefetch || np < w.group);
      for (int64_t i = 0; i < n; ++i) finish_panels(g, p, np, out + i * np * P, P, g.y + i * g.ldy);
      p += np;
    }
    return;
  }
  // The tokens go in ceil(n / kMR) tiles of near-equal heights (9 -> 5 + 4, not 8 + 1: a speculative pass's K + 1
  // rows), each over the panels np_for(its height) at a time (kNP for full ones): a 1-token tile over 2 panels
  // keeps 2 FMA chains in flight, and 9 tokens of opt-1.3b bf16 took 1.47x as long as 8 (AVX-512, Zen 5).
  const int64_t tiles = (n + Simd::kMR - 1) / Simd::kMR;
  // panels of a block: ~256 KiB of weights of panel_bytes a panel, whole tiles of kNP panels
  const auto block_of = [](int64_t panel_bytes) {
    constexpr int64_t kNP = Simd::kNP;
    return std::max<int64_t>(kNP, (int64_t(256) * 1024 / std::max<int64_t>(1, panel_bytes)) / kNP * kNP);
  };
  // f16 weights in passes of 16 tiles or more (prefill): each block is widened once into f32 panels (exact: every
  // ISA's f16 conversion gives the same value) and the f32 tiles run over it, instead of every tile widening every
  // weight again (vcvtph2ps: two of the FMA ports' slots a vector on Intel). The same values in the same FMA
  // chains: the same bits. On the Intel machine (AVX-512, 2 threads, alternating runs) a 512-token opt-125m f16
  // prefill took x1.52-1.59 the FMA floor against x1.63-1.69 (f32 in the same runs: x1.47-1.60); passes of 128
  // tokens 0.95-0.97x as long, of 64 the same, of 32 1.06-1.11x (the widening reads the block from memory before
  // any tile computes), hence the 16 tiles. (bf16 widens in one instruction a vector, as pairs; integer weights
  // have their own block-wise chains.)
  if constexpr (T == dtype::F16) {
    if (tiles >= 16) {
      const int64_t block = block_of(K * col_bytes_c(dtype::F32));  // (of the widened panels)
      thread_local ops::aligned_vector<float> wide;
      if (wide.size() < size_t(block * K * P)) wide.assign(size_t(block * K * P), 0.0f);
      for (int64_t b0 = p0; b0 < p1; b0 += block) {
        const int64_t b1 = std::min(p1, b0 + block);
        PackedMatrix wf;  // panels [b0, b1) as panels [0, b1 - b0) of f32 in this build's f32 groups
        wf.type = dtype::F32, wf.data = wide.data(), wf.rows = (b1 - b0) * P, wf.cols = K;
        wf.group = ops::panel_group(dtype::F32);
        // column by column over the block's panels: each group of the source read as one sequential stream
        struct Panel {
          const std::byte* src;
          size_t ss;
          std::byte* dst;
          size_t ds;
        };
        thread_local std::vector<Panel> pan;
        pan.clear();
        for (int64_t q = b0; q < b1; ++q)
          pan.push_back({w.panel(q), w.column_stride(q), const_cast<std::byte*>(wf.panel(q - b0)),
                         wf.column_stride(q - b0)});
        for (int64_t c = 0; c < K; ++c)
          for (const Panel& a : pan) {
            const std::byte* src = a.src + size_t(c) * a.ss;
            float* dst = reinterpret_cast<float*>(a.dst + size_t(c) * a.ds);
            OPT_K_UNROLL
            for (int v = 0; v < VP; ++v) Simd::store(dst + v * W, load_w<dtype::F16>(src, v));
          }
        linear_block_tiles<dtype::F32>(x, n, tiles, block, g, wf, b0, b0, b1, out, false);
      }
      return;
    }
  }
  const int64_t block = block_of(K * col_bytes_c(T));
  for (int64_t b0 = p0; b0 < p1; b0 += block)
    linear_block_tiles<T>(x, n, tiles, block, g, w, 0, b0, std::min(p1, b0 + block), out, true);
}

inline void linear(const float* x, int64_t n, const ops::LinearSeg& g, int64_t p0, int64_t p1) {
  switch (g.w.type) {
    case dtype::F32: return linear_panels<dtype::F32>(x, n, g, p0, p1);
    case dtype::F16: return linear_panels<dtype::F16>(x, n, g, p0, p1);
    case dtype::BF16: return linear_panels<dtype::BF16>(x, n, g, p0, p1);
    case dtype::I8:
      if (g.approximate && linear_i8_approx(x, n, g, p0, p1)) return;
      return linear_panels<dtype::I8>(x, n, g, p0, p1);
    case dtype::I4: return linear_panels<dtype::I4>(x, n, g, p0, p1);
    default: OPT_DASSERT(false);
  }
}

// ---- 16-logical-lane sums -------------------------------------------------------------------------------------
// s[t] = exp(s[t] - mx); the sum over 16 logical lanes (a partial last chunk adds +0), then reduce16.
inline float exp_sub_sum(float* s, int64_t n, float mx) {
  V acc[VP];
  OPT_K_UNROLL
  for (int v = 0; v < VP; ++v) acc[v] = Simd::zero();
  const V m = Simd::set1(mx);
  int64_t t = 0;
  for (; t + 16 <= n; t += 16)
    OPT_K_UNROLL
    for (int v = 0; v < VP; ++v) {
      const V e = fn::exp<Simd>(Simd::sub(Simd::load(s + t + v * W), m));
      Simd::store(s + t + v * W, e);
      acc[v] = Simd::add(acc[v], e);
    }
  if (t < n) {
    alignas(64) float tmp[16];
    for (int j = 0; j < 16; ++j) tmp[j] = t + j < n ? s[t + j] : mx;
    OPT_K_UNROLL
    for (int v = 0; v < VP; ++v) {
      V e = fn::exp<Simd>(Simd::sub(Simd::load(tmp + v * W), m));
      Simd::store(tmp + v * W, e);
    }
    for (int j = 0; j < 16; ++j) {
      if (t + j < n) s[t + j] = tmp[j];
      else tmp[j] = 0.0f;
    }
    OPT_K_UNROLL
    for (int v = 0; v < VP; ++v) acc[v] = Simd::add(acc[v], Simd::load(tmp + v * W));
  }
  return Simd::reduce16(acc);
}

// max over s[0, n) (NaNs ignored; -inf when n == 0). The order of comparisons differs from a sequential scan
// only in which of +0 / -0 it returns, and exp(s - mx) is the same for either.
inline float max_of(const float* s, int64_t n) {
  float mx = -std::numeric_limits<float>::infinity();
  int64_t t = 0;
  if (n >= W) {
    V m = Simd::set1(mx);
    for (; t + W <= n; t += W) m = Simd::max(Simd::load(s + t), m);  // lane: s > m ? s : m
    alignas(64) float l[W];
    Simd::store(l, m);
    for (int i = 0; i < W; ++i) mx = l[i] > mx ? l[i] : mx;
  }
  for (; t < n; ++t) mx = s[t] > mx ? s[t] : mx;
  return mx;
}

// The index of the first largest of s[0, n), the first NaN if there is one; 0 when n <= 0 (what ref::argmax's
// scan returns, in a vector pass): each chunk of kArgmaxChunk values gets its maximum, the first chunk holding the
// largest is scanned for it. Where a NaN or an infinity occurs (x - x is then NaN), the plain scan decides.
constexpr int64_t kArgmaxChunk = 256;
inline int64_t argmax_scan(const float* s, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    const float v = s[i], b = s[best];
    if (b != b) break;              // NaN already chosen
    if (v > b || v != v) best = i;  // larger, or the first NaN
  }
  return best;
}
inline int64_t argmax(const float* s, int64_t n) {
  if (n <= 0) return 0;
  float best = -std::numeric_limits<float>::infinity();
  int64_t best_c = 0;
  bool finite = true;
  V z = Simd::zero();  // the sum of x - x: NaN where some x is NaN or infinite
  for (int64_t c0 = 0; c0 < n; c0 += kArgmaxChunk) {
    const int64_t c1 = std::min(n, c0 + kArgmaxChunk);
    float cm = -std::numeric_limits<float>::infinity();
    int64_t t = c0;
    if (c1 - c0 >= W) {
      V m = Simd::set1(cm);
      for (; t + W <= c1; t += W) {
        const V v = Simd::load(s + t);
        m = Simd::max(v, m);
        z = Simd::add(z, Simd::sub(v, v));
      }
      alignas(64) float l[W];
      Simd::store(l, m);
      for (int i = 0; i < W; ++i) cm = l[i] > cm ? l[i] : cm;
    }
    for (; t < c1; ++t) {
      cm = s[t] > cm ? s[t] : cm;
      finite = finite && s[t] - s[t] == 0.0f;
    }
    if (cm > best || c0 == 0) best = cm, best_c = c0;
  }
  alignas(64) float zl[W];
  Simd::store(zl, z);
  for (int i = 0; i < W; ++i) finite = finite && zl[i] == 0.0f;
  if (!finite) return argmax_scan(s, n);
  const int64_t c1 = std::min(n, best_c + kArgmaxChunk);
  for (int64_t t = best_c; t < c1; ++t)
    if (s[t] == best) return t;
  return argmax_scan(s, n);  // (not reached: the chunk holds its maximum)
}

// s[t] = s[t] * c for t < n.
inline void scale_by(float* s, int64_t n, float c) {
  const V cv = Simd::set1(c);
  int64_t t = 0;
  for (; t + W <= n; t += W) Simd::store(s + t, Simd::mul(Simd::load(s + t), cv));
  for (; t < n; ++t) s[t] = s[t] * c;
}

// ---- attention --------------------------------------------------------------------------------------------------
// A block of up to kQB consecutive query tokens j of one head (query j sees keys [0, len[j]), len[j] = len[0] + j),
// each computed exactly as alone: s_j[t] = q_j · k[t] over 16 logical lanes, p_j = exp(s_j - max) * (1 / sum),
// o_j[d] = the FMA chain over t of p_j[t] * v[t, d] from +0. The block walks the keys in chunks of kKeyChunk
// rows: a chunk's key (then value) rows come from L2 once and serve every query of the block from L1 (prefill is
// bound by those reads otherwise). Queries go kG at a time through the register tiles below.
constexpr int kQB = int(ops::kAttentionScratch), kG = 4;
constexpr int64_t kKeyChunk = 64;

// The cache's element type T (F32, F16 or BF16): Kv<T>::E is what it stores, load() widens W consecutive elements
// and one() a single element to f32. Widening is exact, so every operation after it is the f32 kernel's: an F32
// cache gives the bits it always gave, an F16 or BF16 one the same bits on every ISA.
template <dtype T>
struct Kv;
template <>
struct Kv<dtype::F32> {
  using E = float;
  static V load(const E* p) { return Simd::load(p); }
  static float one(const E* p) { return *p; }
};
template <>
struct Kv<dtype::F16> {
  using E = uint16_t;
  static V load(const E* p) { return Simd::load_f16(p); }
  static float one(const E* p) { return opt::detail::f16_to_f32(*p); }
};
template <>
struct Kv<dtype::BF16> {
  using E = uint16_t;
  static V load(const E* p) { return Simd::load_bf16(p); }
  static float one(const E* p) { return opt::detail::bf16_to_f32(*p); }
};

// s[j][t] = q_j · k[t] for NQ queries and NK keys from t (each score its own chain of 16 lanes over d, then
// reduce16: the same operations whatever NK).
template <dtype T, int NQ, int NK>
inline void attention_scores_nk(const float* q, int64_t qstride, int64_t t, const typename Kv<T>::E* k, int64_t ld,
                                int64_t hd, const float (*qt)[16], float* const* s) {
  const int64_t full = hd / 16 * 16;
  V acc[NK][NQ][VP];
  OPT_K_UNROLL
  for (int i = 0; i < NK; ++i)
    OPT_K_UNROLL
    for (int j = 0; j < NQ; ++j)
      OPT_K_UNROLL
      for (int c = 0; c < VP; ++c) acc[i][j][c] = Simd::zero();
  const typename Kv<T>::E* kr = k + t * ld;
  for (int64_t d = 0; d < full; d += 16)
    OPT_K_UNROLL
    for (int c = 0; c < VP; ++c) {
      V qv[NQ];
      OPT_K_UNROLL
      for (int j = 0; j < NQ; ++j) qv[j] = Simd::load(q + j * qstride + d + c * W);
      OPT_K_UNROLL
      for (int i = 0; i < NK; ++i) {
        const V kv = Kv<T>::load(kr + i * ld + d + c * W);
        OPT_K_UNROLL
        for (int j = 0; j < NQ; ++j) acc[i][j][c] = Simd::fma(qv[j], kv, acc[i][j][c]);
      }
    }
  if (full < hd) {
    alignas(64) float kt[16] = {};
    OPT_K_UNROLL
    for (int i = 0; i < NK; ++i) {
      for (int64_t e = 0; full + e < hd; ++e) kt[e] = Kv<T>::one(kr + i * ld + full + e);
      OPT_K_UNROLL
      for (int c = 0; c < VP; ++c) {
        const V kv = Simd::load(kt + c * W);
        OPT_K_UNROLL
        for (int j = 0; j < NQ; ++j) acc[i][j][c] = Simd::fma(Simd::load(qt[j] + c * W), kv, acc[i][j][c]);
      }
    }
  }
  if constexpr (NK == 4) {
    // a query's four scores at once, stored together (the same reduction of each sum)
    OPT_K_UNROLL
    for (int j = 0; j < NQ; ++j) Simd::reduce16x4(acc[0][j], acc[1][j], acc[2][j], acc[3][j], s[j] + t);
  } else {
    OPT_K_UNROLL
    for (int i = 0; i < NK; ++i) {
      if constexpr (NQ == 4) {
        float r[4];
        Simd::reduce16x4(acc[i][0], acc[i][1], acc[i][2], acc[i][3], r);
        OPT_K_UNROLL
        for (int j = 0; j < 4; ++j) s[j][t + i] = r[j];
      } else {
        OPT_K_UNROLL
        for (int j = 0; j < NQ; ++j) s[j][t + i] = Simd::reduce16(acc[i][j]);
      }
    }
  }
}

// Keys a score pass takes at once: independent chains enough to hide the FMA latency where the registers hold them
// (AVX-512 4 keys x 4 queries; AVX2 and NEON, whose 16 lanes take 2 or 4 registers, one key).
template <int NQ>
constexpr int score_keys() {
  const int nk = (Simd::kRegs - 2 * NQ * VP) / (NQ * VP);
  return nk < 1 ? 1 : nk > 4 ? 4 : nk;
}

// s[j][t] = q_j · k[t] for NQ queries and keys [t0, t1).
template <dtype T, int NQ>
inline void attention_scores(const float* q, int64_t qstride, int64_t t0, int64_t t1, const typename Kv<T>::E* k,
                             int64_t ld, int64_t hd, float* const* s) {
  const int64_t full = hd / 16 * 16;
  // q's partial last 16-lane chunk, zero-padded (the padding adds +0 products)
  alignas(64) float qt[NQ][16] = {};
  if (full < hd)
    for (int j = 0; j < NQ; ++j)
      for (int64_t e = 0; full + e < hd; ++e) qt[j][e] = q[j * qstride + full + e];
  constexpr int NK = Simd::id == isa::scalar ? 1 : score_keys<NQ>();
  int64_t t = t0;
  if constexpr (NK > 1)
    for (; t + NK <= t1; t += NK) attention_scores_nk<T, NQ, NK>(q, qstride, t, k, ld, hd, qt, s);
  for (; t < t1; ++t) attention_scores_nk<T, NQ, 1>(q, qstride, t, k, ld, hd, qt, s);
}

// out[j][d + e], e < DC * 16, of NQ queries: the chain over keys t in [t0, t1) with t < len[j], continued from out
// when t0 > 0 (from +0 otherwise).
template <dtype T, int NQ, int DC>
inline void attention_pv(float* const* s, const int64_t* len, int64_t t0, int64_t t1, const typename Kv<T>::E* v,
                         int64_t ld, int64_t d, float* out, int64_t ostride) {
  V acc[NQ][DC * VP];
  OPT_K_UNROLL
  for (int j = 0; j < NQ; ++j)
    OPT_K_UNROLL
    for (int c = 0; c < DC * VP; ++c) acc[j][c] = t0 > 0 ? Simd::load(out + j * ostride + d + c * W) : Simd::zero();
  // keys every query sees, then those only the later queries see
  const int64_t all = std::min(t1, len[0]);
  for (int64_t t = t0; t < all; ++t) {
    const typename Kv<T>::E* vr = v + t * ld + d;
    OPT_K_UNROLL
    for (int j = 0; j < NQ; ++j) {
      const V pt = Simd::set1(s[j][t]);
      OPT_K_UNROLL
      for (int c = 0; c < DC * VP; ++c) acc[j][c] = Simd::fma(pt, Kv<T>::load(vr + c * W), acc[j][c]);
    }
  }
  for (int64_t t = std::max(t0, all); t < std::min(t1, len[NQ - 1]); ++t) {
    const typename Kv<T>::E* vr = v + t * ld + d;
    OPT_K_UNROLL
    for (int j = 1; j < NQ; ++j)
      if (t < len[j]) {
        const V pt = Simd::set1(s[j][t]);
        OPT_K_UNROLL
        for (int c = 0; c < DC * VP; ++c) acc[j][c] = Simd::fma(pt, Kv<T>::load(vr + c * W), acc[j][c]);
      }
  }
  OPT_K_UNROLL
  for (int j = 0; j < NQ; ++j)
    OPT_K_UNROLL
    for (int c = 0; c < DC * VP; ++c) Simd::store(out + j * ostride + d + c * W, acc[j][c]);
}

// The value pass: queries go kPvG at a time, each pass over the keys computing DC chunks of 16 outputs of every
// query of the group. kPvG and pv_dc(ng) give the most independent accumulator chains that fit the registers
// (those chains hide the FMA latency; each key's values and each query's weight are loaded once per pass).
constexpr int kPvChains = Simd::kRegs - 4 < 28 ? Simd::kRegs - 4 : 28;  // vectors of accumulators
constexpr int kPvG = VP == 2 ? 3 : 4;                                  // AVX2: 3 queries x 32 outputs = 12
constexpr int pv_dc(int ng) {
  const int dc = kPvChains / (ng * VP);
  return dc < 1 ? 1 : dc > 4 ? 4 : dc;
}

// dc chunks from d: one pass of pv_dc(NQ) chunks, or (a head's last few chunks) passes of one chunk each; two
// shapes per group size keep the template instances (and a consumer's compile time) few.
template <dtype T, int NQ>
inline int attention_pv_dc(int dc, float* const* s, const int64_t* len, int64_t t0, int64_t t1,
                           const typename Kv<T>::E* v, int64_t ld, int64_t d, float* out, int64_t ostride) {
  constexpr int DC = pv_dc(NQ);
  if (DC > 1 && dc == DC) {
    attention_pv<T, NQ, DC>(s, len, t0, t1, v, ld, d, out, ostride);
    return DC;
  }
  attention_pv<T, NQ, 1>(s, len, t0, t1, v, ld, d, out, ostride);
  return 1;
}

// ng <= kPvG queries over keys [t0, t1), all whole 16-output chunks of the head.
template <dtype T>
inline void attention_pv_group(int ng, float* const* s, const int64_t* len, int64_t t0, int64_t t1,
                               const typename Kv<T>::E* v, int64_t ld, int64_t hd, float* out, int64_t ostride) {
  static_assert(kPvG >= 1 && kPvG <= 4, "value-pass groups of 1..4 queries");
  for (int64_t d = 0; d + 16 <= hd;) {
    const int dc = int(std::min<int64_t>(pv_dc(ng), (hd - d) / 16));
    int done = 1;
    switch (ng) {
      case 1: done = attention_pv_dc<T, 1>(dc, s, len, t0, t1, v, ld, d, out, ostride); break;
      case 2: if constexpr (kPvG >= 2) done = attention_pv_dc<T, 2>(dc, s, len, t0, t1, v, ld, d, out, ostride); break;
      case 3: if constexpr (kPvG >= 3) done = attention_pv_dc<T, 3>(dc, s, len, t0, t1, v, ld, d, out, ostride); break;
      default: if constexpr (kPvG >= 4) done = attention_pv_dc<T, 4>(dc, s, len, t0, t1, v, ld, d, out, ostride); break;
    }
    d += 16 * done;
  }
}

// scores: kQB rows of (len0 + nq - 1) floats.
template <dtype T>
inline void attention_block(const float* q, int64_t qstride, int nq, int64_t len0, const typename Kv<T>::E* k,
                            const typename Kv<T>::E* v, int64_t ld, int64_t hd, float* out, int64_t ostride,
                            float* scores) {
  const int64_t len_max = len0 + nq - 1;
  float* s[kQB];
  int64_t len[kQB];
  for (int j = 0; j < nq; ++j) s[j] = scores + j * len_max, len[j] = len0 + j;
  // scores: every query of a group against every key of the block (a query's keys beyond its causal window are
  // computed, not used)
  for (int64_t t0 = 0; t0 < len_max; t0 += kKeyChunk) {
    const int64_t t1 = std::min(len_max, t0 + kKeyChunk);
    for (int g = 0; g < nq; g += kG) {
      const float* qg = q + g * qstride;
      switch (std::min(kG, nq - g)) {
        case 1: attention_scores<T, 1>(qg, qstride, t0, t1, k, ld, hd, s + g); break;
        case 2: attention_scores<T, 2>(qg, qstride, t0, t1, k, ld, hd, s + g); break;
        case 3: attention_scores<T, 3>(qg, qstride, t0, t1, k, ld, hd, s + g); break;
        default: attention_scores<T, 4>(qg, qstride, t0, t1, k, ld, hd, s + g); break;
      }
    }
  }
  // softmax per query over its own window
  for (int j = 0; j < nq; ++j) {
    const float inv = 1.0f / exp_sub_sum(s[j], len[j], max_of(s[j], len[j]));
    scale_by(s[j], len[j], inv);
  }
  // values, chunk by chunk of keys
  for (int64_t t0 = 0; t0 < len_max; t0 += kKeyChunk) {
    const int64_t t1 = std::min(len_max, t0 + kKeyChunk);
    for (int g = 0; g < nq; g += kPvG)
      attention_pv_group<T>(std::min(kPvG, nq - g), s + g, len + g, t0, t1, v, ld, hd, out + g * ostride, ostride);
  }
  for (int64_t d = hd / 16 * 16; d < hd; ++d)
    for (int j = 0; j < nq; ++j) {
      float acc = 0.0f;
      for (int64_t t = 0; t < len[j]; ++t) acc = std::fma(s[j][t], Kv<T>::one(v + t * ld + d), acc);
      out[j * ostride + d] = acc;
    }
}

// Causal attention of tokens [i0, i1) x heads [h0, h1) of n new tokens at positions [past, past + n):
// q [n, H] already scaled, k/v the cache of element type T (position t of head h at t * ld + h * hs), token i
// sees positions [0, past + i]; out row stride ld_out;
// scores: kQB * (past + i1) floats of scratch. Tokens go kQB at a time through attention_block.
template <dtype T>
inline void attention_t(const float* q, int64_t past, const void* kp, const void* vp, int64_t ld, int64_t hs,
                        int64_t n_heads, int64_t head_dim, float* out, int64_t ld_out, float* scores, int64_t i0,
                        int64_t i1, int64_t h0, int64_t h1) {
  using E = typename Kv<T>::E;
  const E* k = static_cast<const E*>(kp);
  const E* v = static_cast<const E*>(vp);
  const int64_t H = n_heads * head_dim;
  for (int64_t h = h0; h < h1; ++h)
    for (int64_t i = i0; i < i1; i += kQB) {
      const int nq = int(std::min<int64_t>(kQB, i1 - i));
      attention_block<T>(q + i * H + h * head_dim, H, nq, past + i + 1, k + h * hs, v + h * hs, ld, head_dim,
                         out + i * ld_out + h * head_dim, ld_out, scores);
    }
}

inline void attention(const float* q, int64_t past, dtype kv, const void* k, const void* v, int64_t ld, int64_t hs,
                      int64_t n_heads, int64_t head_dim, float* out, int64_t ld_out, float* scores, int64_t i0,
                      int64_t i1, int64_t h0, int64_t h1) {
  switch (kv) {
    case dtype::F32:
      return attention_t<dtype::F32>(q, past, k, v, ld, hs, n_heads, head_dim, out, ld_out, scores, i0, i1, h0, h1);
    case dtype::F16:
      return attention_t<dtype::F16>(q, past, k, v, ld, hs, n_heads, head_dim, out, ld_out, scores, i0, i1, h0, h1);
    case dtype::BF16:
      return attention_t<dtype::BF16>(q, past, k, v, ld, hs, n_heads, head_dim, out, ld_out, scores, i0, i1, h0, h1);
    default: OPT_DASSERT(false);
  }
}

// ---- LayerNorm ----------------------------------------------------------------------------------------------------
// mean and variance in double over 16 logical lanes (element k to lane k % 16, each lane a sequential sum; the
// variance's terms fma((x - mean), (x - mean), u)), the lanes combined (l, l+8), (l, l+4), (l, l+2), (l, l+1); then
// y = fma((x - mean) * rstd, gamma, beta) in float (* gamma or + beta alone when one of them is absent). Plain
// loops of 16 doubles that the compiler turns into the ISA's vectors (2 x 8 on AVX-512): the same IEEE operations
// on every ISA.
inline double lane_sum16(double* s) {
  for (int w = 8; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) s[l] = s[l] + s[l + w];
  return s[0];
}
inline void layer_norm(const float* x, int64_t n, int64_t d, const float* gamma, const float* beta, float eps,
                       float* y) {
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * d;
    float* yi = y + i * d;
    const int64_t full = d / 16 * 16;
    alignas(64) double s[16] = {};
    for (int64_t k = 0; k < full; k += 16)
      for (int l = 0; l < 16; ++l) s[l] += double(xi[k + l]);
    for (int64_t k = full; k < d; ++k) s[k - full] += double(xi[k]);
    const double mean = lane_sum16(s) / double(d);
    alignas(64) double u[16] = {};
    for (int64_t k = 0; k < full; k += 16)
      for (int l = 0; l < 16; ++l) {
        const double t = double(xi[k + l]) - mean;
        u[l] = std::fma(t, t, u[l]);
      }
    for (int64_t k = full; k < d; ++k) {
      const double t = double(xi[k]) - mean;
      u[k - full] = std::fma(t, t, u[k - full]);
    }
    const double var = lane_sum16(u) / double(d);
    const float rstd = float(1.0 / std::sqrt(var + double(eps)));
    const float m = float(mean);
    const V mv = Simd::set1(m), rv = Simd::set1(rstd);
    int64_t k = 0;
    for (; k + W <= d; k += W) {
      V t = Simd::mul(Simd::sub(Simd::load(xi + k), mv), rv);
      Simd::keep(t);
      if (gamma && beta) t = Simd::fma(t, Simd::load(gamma + k), Simd::load(beta + k));
      else if (gamma) t = Simd::mul(t, Simd::load(gamma + k));
      else if (beta) t = Simd::add(t, Simd::load(beta + k));
      Simd::store(yi + k, t);
    }
    for (; k < d; ++k) {
      const float t = opaque((xi[k] - m) * rstd);
      if (gamma && beta) yi[k] = std::fma(t, gamma[k], beta[k]);
      else if (gamma) yi[k] = t * gamma[k];
      else if (beta) yi[k] = t + beta[k];
      else yi[k] = t;
    }
  }
}

// ---- int8 quantizer -----------------------------------------------------------------------------------------------
inline void quantize_rows(const float* w, int64_t cols, int64_t block, int64_t r0, int64_t r1, int8_t* q,
                          float* scale) {
  const int64_t nb = (cols + block - 1) / block;
  for (int64_t r = r0; r < r1; ++r) {
    const float* row = w + r * cols;
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t k0 = b * block, k1 = std::min(cols, k0 + block);
      float mx = 0;
      for (int64_t k = k0; k < k1; ++k) {
        const float a = std::fabs(row[k]);
        mx = a > mx ? a : mx;
      }
      const float s = mx > 0 ? mx / 127.0f : 1.0f;
      const float inv = 1.0f / s;
      scale[r * nb + b] = s;
      for (int64_t k = k0; k < k1; ++k) {
        const float v = std::nearbyint(row[k] * inv);
        q[r * cols + k] = int8_t(v < -127.0f ? -127.0f : v > 127.0f ? 127.0f : v);
      }
    }
  }
}

// ---- int4 quantizer -----------------------------------------------------------------------------------------------
// Per block: s = max|w| / 8 with the sign that maps the block's extreme (the first of largest magnitude) to -8
// (1 for an all-zero block), q = round(w * (1 / s)) clamped to [-8, 7] (only weights of the other sign beyond
// 15/16 of the extreme's magnitude reach +8 and are clamped); rounding as the int8 quantizer: round to nearest
// even of w * inv. Rows [r0, r1) of w [rows, cols]; q row-major, ceil(cols / 2) bytes a row (see MatrixRef).
inline void quantize_rows_i4(const float* w, int64_t cols, int64_t block, int64_t r0, int64_t r1, uint8_t* q,
                             float* scale) {
  const int64_t nb = (cols + block - 1) / block, rb = (cols + 1) / 2;
  for (int64_t r = r0; r < r1; ++r) {
    const float* row = w + r * cols;
    uint8_t* qr = q + r * rb;
    for (int64_t c = 0; c < rb; ++c) qr[c] = 0x88;  // q = 0 (the odd last column's high nibble stays so)
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t k0 = b * block, k1 = std::min(cols, k0 + block);
      float mx = 0;
      for (int64_t k = k0; k < k1; ++k) {
        const float a = std::fabs(row[k]);
        mx = a > mx ? a : mx;
      }
      float ext = 0;
      for (int64_t k = k0; k < k1 && mx > 0; ++k)
        if (std::fabs(row[k]) == mx) {
          ext = row[k];
          break;
        }
      const float s = mx > 0 ? ext / -8.0f : 1.0f;
      const float inv = 1.0f / s;
      scale[r * nb + b] = s;
      auto code = [inv](float x) {
        const float v = std::nearbyint(x * inv);
        return unsigned(int(v < -8.0f ? -8.0f : v > 7.0f ? 7.0f : v) + 8);
      };
      // whole bytes, and a block's half-used first / last byte (odd block sizes, the odd last column)
      int64_t k = k0;
      if (k < k1 && k % 2 == 1) qr[k / 2] = uint8_t((qr[k / 2] & 0x0Fu) | code(row[k]) << 4), ++k;
      for (; k + 1 < k1; k += 2) qr[k / 2] = uint8_t(code(row[k]) | code(row[k + 1]) << 4);
      if (k < k1) qr[k / 2] = uint8_t((qr[k / 2] & 0xF0u) | code(row[k]));
    }
  }
}

OPT_KERNEL_TABLE_LINKAGE const Table& table() {
  static const Table t = [] {
    Table x;
    x.id = Simd::id;
    x.linear = &linear;
    x.layer_norm = &layer_norm;
    x.attention = &attention;
    x.activate = &activate;
    x.activate1 = &activate1;
    x.exp_sub_sum = &exp_sub_sum;
    x.argmax = &argmax;
    x.quantize_rows = &quantize_rows;
    x.quantize_rows_i4 = &quantize_rows_i4;
    return x;
  }();
  return t;
}

#undef OPT_K_UNROLL
#undef OPT_K_UNROLL_COLUMNS
#undef OPT_K_INLINE
