// eagle_serve::int4_linear: a linear layer over a weight held two ways, chosen by the number of
// input rows (worker/int4_linear.py has the contract and why).
//
//   x             [N, in]  bfloat16, contiguous
//   weight4       the 4-bit weight, in one of two layouts (`tiles`):
//                 false: packed by aten::_convert_weight_to_int4pack_for_cpu; `scales` is then
//                        [in / group, out, 2] bfloat16 (scale, zero) and `zeros` is unused;
//                 true:  AMX tiles, [out / 16, in / 32, 16, 16] uint8 (see dequant_tile), with
//                        `scales` and `zeros` [out / 16, in / 32, 16] bfloat16; group is 32
//   dense         [out, in] bfloat16: the same weights dequantized, (q - 8) * scale + zero
//                 rounded to bfloat16 (or oneDNN-packed when `dense_packed`)
//   returns       [N, out] bfloat16
//
// N <= row_limit reads the 4-bit weight, larger N runs the dense weight through oneDNN. aten's
// kernel (`tiles` false) takes longer as N grows; the tile kernel below dequantizes each 32 x 16 block of the weight once into bfloat16,
// exactly the dense weight's values, and multiplies it with up to 32 rows on AMX, so its time
// hardly grows up to 32 rows.
// Written as a C++ operator so that a compiled graph calls it without returning to Python.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#if defined(__x86_64__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define EAGLE_AMX 1
#endif

#include <cstring>

namespace {

#ifdef EAGLE_AMX
constexpr int kTileK = 32;  // input features per tile: one quantization group
constexpr int kTileN = 16;  // output features per tile

// AMX's tile configuration (palette 1): rows and bytes per row of each of the 16 tile registers.
struct TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

bool request_amx() {
  // Linux: a process must ask for the AMX tile state before using it.
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

__attribute__((target("avx512f,avx512bw,avx512bf16")))
// One tile of the weight, output features n0..n0+15 by input features k0..k0+31, dequantized into
// the bfloat16 layout AMX multiplies with (16 rows of 32 values: row r holds, for each output
// feature c, its weights at inputs k0 + 2r and k0 + 2r + 1, so value j of the row is feature
// c = j / 2 at input k0 + 2r + j % 2).
//   nib    16 rows x 16 bytes: byte b holds value b in its low nibble, value b + 16 in its high one
//   scale  16 bfloat16, one per output feature (the tile is one group); zero likewise
//   out    [16, 32] bfloat16, 64-byte aligned: (q - 8) * scale + zero, computed in float32 (the
//          product is exact, so one rounding) and rounded to nearest even, as the dense weight is
void dequant_tile(const uint8_t* nib, const at::BFloat16* scale, const at::BFloat16* zero, uint16_t* out) {
  __m512 sf = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scale))), 16));
  __m512 zf = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(zero))), 16));
  const __m512i lo_idx = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  const __m512i hi_idx = _mm512_set_epi32(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8);
  const __m512 s_lo = _mm512_permutexvar_ps(lo_idx, sf), s_hi = _mm512_permutexvar_ps(hi_idx, sf);
  const __m512 z_lo = _mm512_permutexvar_ps(lo_idx, zf), z_hi = _mm512_permutexvar_ps(hi_idx, zf);
  // q - 8 for q = 0..15; vpermps reads only the low 4 bits of each index
  const __m512 centred = _mm512_set_ps(7, 6, 5, 4, 3, 2, 1, 0, -1, -2, -3, -4, -5, -6, -7, -8);
  for (int r = 0; r < 16; ++r) {
    const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(nib + r * 16)));
    const __m512 qlo = _mm512_permutexvar_ps(bytes, centred);
    const __m512 qhi = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), centred);
    const __m512 wlo = _mm512_fmadd_ps(qlo, s_lo, z_lo);
    const __m512 whi = _mm512_fmadd_ps(qhi, s_hi, z_hi);
    _mm512_store_si512(reinterpret_cast<__m512i*>(out + r * 32), (__m512i)_mm512_cvtne2ps_pbh(whi, wlo));
  }
}

// Output feature tiles begin..end of out[M, N] = x[M, K] @ W.T, M <= 32: each weight tile is
// dequantized once and multiplied with rows 0-15 and 16-31 of x (two accumulator tiles).
void amx_range(int64_t begin, int64_t end, const uint16_t* xp, const uint8_t* np, const at::BFloat16* sp,
               const at::BFloat16* zp, at::BFloat16* op, int64_t M, int64_t K, int64_t KB, int64_t N) {
  const int m0 = M > 16 ? 16 : M, m1 = M > 16 ? M - 16 : 0;
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof(cfg));
  cfg.palette_id = 1;
  cfg.rows[0] = m0; cfg.colsb[0] = 64;
  cfg.rows[1] = m1 ? m1 : 1; cfg.colsb[1] = 64;
  cfg.rows[2] = 16; cfg.colsb[2] = 64;
  cfg.rows[3] = m0; cfg.colsb[3] = 64;
  cfg.rows[4] = m1 ? m1 : 1; cfg.colsb[4] = 64;
  _tile_loadconfig(&cfg);
  alignas(64) uint16_t btile[16 * 32];
  alignas(64) float ctile[32 * 16];
  for (int64_t nb = begin; nb < end; ++nb) {
    _tile_zero(0);
    _tile_zero(1);
    for (int64_t kb = 0; kb < KB; ++kb) {
      const int64_t t = nb * KB + kb;
      dequant_tile(np + t * 256, sp + t * 16, zp + t * 16, btile);
      _tile_loadd(2, btile, 64);
      _tile_loadd(3, xp + kb * kTileK, K * 2);
      _tile_dpbf16ps(0, 3, 2);
      if (m1) {
        _tile_loadd(4, xp + 16 * K + kb * kTileK, K * 2);
        _tile_dpbf16ps(1, 4, 2);
      }
    }
    _tile_stored(0, ctile, 64);
    if (m1) _tile_stored(1, ctile + 16 * 16, 64);
    for (int m = 0; m < M; ++m) {
      __m512 v = _mm512_load_ps(ctile + m * 16);
      __m256bh b = _mm512_cvtneps_pbh(v);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(op + m * N + nb * kTileN), (__m256i)b);
    }
  }
  _tile_release();
}

at::Tensor tile_mm(const at::Tensor& x, const at::Tensor& nibbles, const at::Tensor& scales, const at::Tensor& zeros) {
  static const bool amx_ok = request_amx();
  TORCH_CHECK(amx_ok, "int4_linear: the AMX tile state is unavailable to this process");
  const int64_t M = x.size(0), K = x.size(1);
  const int64_t NB = nibbles.size(0), KB = nibbles.size(1);
  TORCH_CHECK(M >= 1 && M <= 32, "int4_linear: the tile kernel takes 1 to 32 rows, got ", M);
  TORCH_CHECK(K == KB * kTileK && x.is_contiguous() && x.scalar_type() == at::kBFloat16,
              "int4_linear: x must be contiguous bfloat16 [rows, ", KB * kTileK, "]");
  auto out = at::empty({M, NB * kTileN}, x.options());
  const uint16_t* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  const uint8_t* np = nibbles.data_ptr<uint8_t>();
  const at::BFloat16* sp = scales.data_ptr<at::BFloat16>();
  const at::BFloat16* zp = zeros.data_ptr<at::BFloat16>();
  at::BFloat16* op = out.data_ptr<at::BFloat16>();
  const int64_t N = NB * kTileN;
  at::parallel_for(0, NB, 1, [&](int64_t begin, int64_t end) {
    amx_range(begin, end, xp, np, sp, zp, op, M, K, KB, N);
  });
  return out;
}
#endif

at::Tensor int4_linear(const at::Tensor& x, const at::Tensor& weight4, const at::Tensor& scales,
                       const at::Tensor& zeros, bool tiles, const at::Tensor& dense, bool dense_packed,
                       int64_t group, int64_t row_limit) {
  if (x.size(0) <= row_limit) {
    if (!tiles) {
      return at::_weight_int4pack_mm_for_cpu(x, weight4, group, scales);
    }
#ifdef EAGLE_AMX
    return tile_mm(x, weight4, scales, zeros);
#else
    TORCH_CHECK(false, "int4_linear: the tile kernel needs an x86-64 CPU with AMX");
#endif
  }
  if (!dense_packed) {
    return at::linear(x, dense);
  }
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                         c10::string_view, c10::List<std::optional<at::Scalar>>,
                                         std::optional<c10::string_view>)>();
  return op.call(x, dense, std::nullopt, "none", c10::List<std::optional<at::Scalar>>(), std::nullopt);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(eagle_serve, m) {
  m.def("int4_linear(Tensor x, Tensor weight4, Tensor scales, Tensor zeros, bool tiles, Tensor dense, "
        "bool dense_packed, int group, int row_limit) -> Tensor");
}

TORCH_LIBRARY_IMPL(eagle_serve, CPU, m) { m.impl("int4_linear", &int4_linear); }

// A packed `dense` is an opaque oneDNN tensor, which dispatches to this key.
TORCH_LIBRARY_IMPL(eagle_serve, MkldnnCPU, m) { m.impl("int4_linear", &int4_linear); }
