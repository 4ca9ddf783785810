// Attention of query tiles over keys and values read from the paged KV cache (CPU).
//
// Tiles of at most `max_in_place_query` query slots (the caller passes no limit for decode
// tokens, trees and draft levels, and a small one for prefill tiles, so that only a step's
// dummy bucket of those goes here) go through this file's kernel, which reads keys and values
// in place. Why by hand: gathering every tile's keys and values into a dense copy for
// sdpa costs more memory traffic than such tiles' attention itself, and sdpa's fixed cost per
// call is paid in every layer; no library for this torch offers a CPU kernel that reads a
// paged cache in place (flex_attention's CPU template does, but runs decode tiles slower than
// gather + sdpa). Wider tiles (prefill chunks) gather and call sdpa, whose blocked matrix
// products reuse each key across many query rows better than this kernel's 8-row blocks.
//
// Contract (shapes checked below):
//   query       [N, Q, H, D] float32: Q query slots of each of N tiles, H heads
//   key_cache   [S, KVH, D]  float32 or bfloat16: one layer's keys, by cache slot
//   value_cache [S, KVH, D]  same dtype as key_cache
//   key_slots   [N, L] int64: the cache slot of each of a tile's L key positions
//   visible     [N, Q, L] bool: query slot q of tile n attends to key position l
//   max_in_place_query: tiles of more query slots than this gather + sdpa (the same result)
//   returns     [N, Q, H, D] float32; a query slot that sees no key gets zeros
// In place, keys past the last one any of a tile's query slots sees are never read (a bucket's
// key length is its longest context; shorter ones stop at their own), and slots that see no
// key (padding) cost nothing.
// Heads share KV heads in groups of H / KVH (grouped-query attention). Scores and softmax are
// computed in float32 whatever the cache's dtype, like the reference backend.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kKeys = Vec::size();  // keys whose scores one vector holds
constexpr int64_t kScoreRows = 8;       // query rows scored together: independent accumulators
constexpr int64_t kOutRows = 4;         // query rows whose outputs accumulate together ...
constexpr int64_t kOutVecs = 4;         // ... kOutVecs vectors wide

// Keys rounded up to whole score vectors: the row length of scores and masks.
inline int64_t padded_keys(int64_t keys) { return (keys + kKeys - 1) / kKeys * kKeys; }

// A cache row as floats.
inline void to_float(const float* src, float* dst, int64_t dim) { std::copy(src, src + dim, dst); }
inline void to_float(const c10::BFloat16* src, float* dst, int64_t dim) {
  for (int64_t d = 0; d < dim; ++d) dst[d] = static_cast<float>(src[d]);
}

// s[l] = exp(s[l] - top) for l < keys; returns their sum (-inf scores become 0).
inline float exp_shifted(float* s, int64_t keys, float top) {
  const Vec shift(top);
  Vec total(0.f);
  int64_t l = 0;
  for (; l + Vec::size() <= keys; l += Vec::size()) {
    Vec e = (Vec::loadu(s + l) - shift).exp_u20();
    e.store(s + l);
    total = total + e;
  }
  float sum = total.reduce_add();
  for (; l < keys; ++l) {
    s[l] = std::exp(s[l] - top);
    sum += s[l];
  }
  return sum;
}

// Per-thread scratch of one (tile, KV head) task.
struct Scratch {
  std::vector<float> scores;      // [rows, padded keys]: scores, then unnormalised probabilities
  std::vector<float> totals;      // [rows]
  std::vector<float> key_rows;    // [kKeys, dim]: a block of keys, as floats
  std::vector<float> keys_t;      // [dim, kKeys]: the same, transposed
  std::vector<float> values;      // [keys, dim]: the task's values as floats (bfloat16 caches)
  std::vector<const float*> value_rows;  // [keys]
};

// Scores of rows r0 .. r0 + R - 1 (those below `rows`) against one transposed key block
// ([dim, kKeys]) at key offset l0: R independent accumulators share each key load. A block is
// chosen no wider than needed, so the few rows of a decode tile do not pay for eight.
template <int64_t R>
__attribute__((always_inline)) inline void score_block(const float* const* q_rows, int64_t r0, int64_t rows, const float* keys_t, int64_t dim,
                        float scale, const float* const* bias_rows, int64_t l0, float* scores, int64_t padded) {
  const float* q[R];
  for (int64_t i = 0; i < R; ++i) q[i] = q_rows[std::min(r0 + i, rows - 1)];
  Vec acc[R];
  for (int64_t i = 0; i < R; ++i) acc[i] = Vec(0.f);
  for (int64_t d = 0; d < dim; ++d) {
    const Vec k = Vec::loadu(keys_t + d * kKeys);
    for (int64_t i = 0; i < R; ++i) acc[i] = at::vec::fmadd(Vec(q[i][d]), k, acc[i]);
  }
  for (int64_t i = 0; i < std::min(R, rows - r0); ++i)
    at::vec::fmadd(acc[i], Vec(scale), Vec::loadu(bias_rows[r0 + i] + l0)).store(scores + (r0 + i) * padded + l0);
}

// `bias_rows[r]`: row r's additive mask over the padded keys (0 where visible, -inf elsewhere,
// and -inf past `keys`), so that scores are stored a vector at a time.
template <typename T>
void attend_task(const float* const* q_rows, int64_t rows, const T* keys_base, const T* values_base,
                 const int64_t* slots, const float* const* bias_rows, int64_t keys, int64_t row_stride, int64_t dim,
                 float scale, float* const* out_rows, Scratch& w) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const int64_t padded = padded_keys(keys);
  w.scores.resize(rows * padded);
  w.totals.resize(rows);
  w.key_rows.resize(kKeys * dim);
  // A short last block leaves earlier columns in place: finite values (zeros, or keys of the
  // block before), whose scores the -inf past `keys` in every bias row covers.
  w.keys_t.assign(dim * kKeys, 0.f);
  w.value_rows.resize(keys);

  // 1. Scores, kKeys keys at a time: the block is transposed to [dim, kKeys], so a vector of one
  // row's scores is `dim` fused multiply-adds, the rows of a register block sharing each load.
  for (int64_t l0 = 0; l0 < keys; l0 += kKeys) {
    const int64_t block = std::min(kKeys, keys - l0);
    for (int64_t j = 0; j < block; ++j) to_float(keys_base + slots[l0 + j] * row_stride, w.key_rows.data() + j * dim, dim);
    at::vec::transpose_mxn<float>(w.key_rows.data(), dim, w.keys_t.data(), kKeys, block, dim);
    int64_t r0 = 0;
    for (; rows - r0 > kScoreRows / 2; r0 += kScoreRows)
      score_block<kScoreRows>(q_rows, r0, rows, w.keys_t.data(), dim, scale, bias_rows, l0, w.scores.data(), padded);
    if (r0 < rows)  // a few rows left (a decode tile's): half a block
      score_block<kScoreRows / 2>(q_rows, r0, rows, w.keys_t.data(), dim, scale, bias_rows, l0, w.scores.data(), padded);
  }

  // 2. Softmax numerators and totals, per row.
  for (int64_t r = 0; r < rows; ++r) {
    float* s = w.scores.data() + r * padded;
    Vec tops(neg_inf);
    for (int64_t l = 0; l < padded; l += kKeys) tops = at::vec::maximum(tops, Vec::loadu(s + l));
    const float top = tops.reduce_max();
    if (top == neg_inf) {
      std::fill(s, s + keys, 0.f);
      w.totals[r] = 0.f;
    } else {
      w.totals[r] = exp_shifted(s, keys, top);
    }
  }

  // 3. Outputs: probabilities times values, kOutRows rows by kOutVecs vectors of the head at a
  // time in registers; every value row is read as floats (converted once for bfloat16 caches).
  if constexpr (std::is_same_v<T, float>) {
    for (int64_t l = 0; l < keys; ++l) w.value_rows[l] = values_base + slots[l] * row_stride;
  } else {
    w.values.resize(keys * dim);
    for (int64_t l = 0; l < keys; ++l) {
      to_float(values_base + slots[l] * row_stride, w.values.data() + l * dim, dim);
      w.value_rows[l] = w.values.data() + l * dim;
    }
  }
  constexpr int64_t span = kOutVecs * Vec::size();
  for (int64_t r0 = 0; r0 < rows; r0 += kOutRows) {
    const int64_t nr = std::min(kOutRows, rows - r0);
    const float* p[kOutRows];
    for (int64_t i = 0; i < kOutRows; ++i) p[i] = w.scores.data() + std::min(r0 + i, rows - 1) * padded;
    int64_t c0 = 0;
    for (; c0 + span <= dim; c0 += span) {
      Vec acc[kOutRows][kOutVecs];
      for (int64_t i = 0; i < kOutRows; ++i)
        for (int64_t j = 0; j < kOutVecs; ++j) acc[i][j] = Vec(0.f);
      for (int64_t l = 0; l < keys; ++l) {
        const float* v = w.value_rows[l] + c0;
        Vec vv[kOutVecs];
        for (int64_t j = 0; j < kOutVecs; ++j) vv[j] = Vec::loadu(v + j * Vec::size());
        for (int64_t i = 0; i < kOutRows; ++i) {
          const Vec weight(p[i][l]);
          for (int64_t j = 0; j < kOutVecs; ++j) acc[i][j] = at::vec::fmadd(weight, vv[j], acc[i][j]);
        }
      }
      for (int64_t i = 0; i < nr; ++i) {
        const float total = w.totals[r0 + i];
        const Vec inv(total == 0.f ? 0.f : 1.f / total);
        for (int64_t j = 0; j < kOutVecs; ++j) (acc[i][j] * inv).store(out_rows[r0 + i] + c0 + j * Vec::size());
      }
    }
    for (; c0 < dim; ++c0) {  // a head size that is not a multiple of span
      for (int64_t i = 0; i < nr; ++i) {
        float sum = 0.f;
        for (int64_t l = 0; l < keys; ++l) sum += p[i][l] * w.value_rows[l][c0];
        const float total = w.totals[r0 + i];
        out_rows[r0 + i][c0] = total == 0.f ? 0.f : sum / total;
      }
    }
  }
}

template <typename T>
void attend(const at::Tensor& query, const at::Tensor& key_cache, const at::Tensor& value_cache,
            const at::Tensor& key_slots, const at::Tensor& visible, double scale, at::Tensor& out) {
  const int64_t tiles = query.size(0), width = query.size(1), heads = query.size(2), dim = query.size(3);
  const int64_t kv_heads = key_cache.size(1), keys = key_slots.size(1), padded = padded_keys(keys);
  const int64_t group = heads / kv_heads, rows = width * group;
  const float* q_ptr = query.data_ptr<float>();
  const T* k_ptr = key_cache.data_ptr<T>();
  const T* v_ptr = value_cache.data_ptr<T>();
  const int64_t* slot_ptr = key_slots.data_ptr<int64_t>();
  const bool* vis_ptr = visible.data_ptr<bool>();
  float* o_ptr = out.data_ptr<float>();

  // The visibility as additive masks, [N, Q, padded keys]: 0 or -inf; and each query slot's key
  // extent, one past its last visible key (0: it sees none, as padding slots do).
  const float neg_inf = -std::numeric_limits<float>::infinity();
  std::vector<float> bias(tiles * width * padded, neg_inf);
  std::vector<int64_t> extent(tiles * width, 0);
  at::parallel_for(0, tiles * width, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const bool* row = vis_ptr + t * keys;
      int64_t seen = keys;
      while (seen > 0 && !row[seen - 1]) --seen;
      extent[t] = seen;
      for (int64_t l = 0; l < seen; ++l) bias[t * padded + l] = row[l] ? 0.f : neg_inf;
    }
  });

  // One task per (tile, KV head, block of rows): the rows (query slot q, head h of the group:
  // row q * group + h % group) share the keys, so each key and value row is read once per task.
  // A task reads keys only up to its rows' largest extent and skips rows that see no key (their
  // outputs are zeros), so a bucket's padding slots and shorter contexts cost nothing extra.
  // Rows are split into blocks only where there are too few (tile, KV head) pairs to keep every
  // thread busy (a batch of one tree); each block re-reads the keys.
  const int64_t pairs = tiles * kv_heads, threads = at::get_num_threads();
  const int64_t blocks = pairs >= 2 * threads ? 1 : std::min((2 * threads + pairs - 1) / pairs, (rows + kScoreRows - 1) / kScoreRows);
  const int64_t block_rows = ((rows + blocks - 1) / blocks + kScoreRows - 1) / kScoreRows * kScoreRows;
  const int64_t row_blocks = (rows + block_rows - 1) / block_rows;
  at::parallel_for(0, pairs * row_blocks, 1, [&](int64_t begin, int64_t end) {
    Scratch scratch;
    std::vector<const float*> q_rows(block_rows);
    std::vector<float*> out_rows(block_rows);
    std::vector<const float*> bias_rows(block_rows);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t pair = task / row_blocks, first = task % row_blocks * block_rows;
      const int64_t n = pair / kv_heads, g = pair % kv_heads, count = std::min(block_rows, rows - first);
      int64_t live = 0, task_keys = 0;
      for (int64_t i = 0; i < count; ++i) {
        const int64_t r = first + i, slot = n * width + r / group, h = g * group + r % group;
        const int64_t row = (slot * heads + h) * dim, seen = extent[slot];
        if (seen == 0) {
          std::fill(o_ptr + row, o_ptr + row + dim, 0.f);
          continue;
        }
        task_keys = std::max(task_keys, seen);
        q_rows[live] = q_ptr + row;
        out_rows[live] = o_ptr + row;
        bias_rows[live] = bias.data() + slot * padded;
        ++live;
      }
      if (live == 0) continue;
      attend_task<T>(q_rows.data(), live, k_ptr + g * dim, v_ptr + g * dim, slot_ptr + n * keys, bias_rows.data(),
                     task_keys, kv_heads * dim, dim, static_cast<float>(scale), out_rows.data(), scratch);
    }
  });
}

// The reference computation for wide tiles: keys and values gathered into [N, KVH, L, D]
// float32 copies, then sdpa with grouped-query attention (rows that see no key get zeros).
at::Tensor gathered_attention(const at::Tensor& query, const at::Tensor& key_cache, const at::Tensor& value_cache,
                              const at::Tensor& key_slots, const at::Tensor& visible, double scale) {
  const int64_t tiles = query.size(0), keys = key_slots.size(1);
  const auto slots = key_slots.reshape({-1});
  auto gather = [&](const at::Tensor& cache) {  // [N, KVH, L, D] float32
    return cache.index_select(0, slots).view({tiles, keys, cache.size(1), cache.size(2)}).transpose(1, 2).to(at::kFloat);
  };
  const auto out = at::scaled_dot_product_attention(
      query.transpose(1, 2), gather(key_cache), gather(value_cache), visible.unsqueeze(1), 0.0, false, scale,
      query.size(2) != key_cache.size(1));  // [N, H, Q, D]
  return out.transpose(1, 2).contiguous();  // [N, Q, H, D]
}

at::Tensor paged_attention(const at::Tensor& query, const at::Tensor& key_cache, const at::Tensor& value_cache,
                           const at::Tensor& key_slots, const at::Tensor& visible, double scale,
                           int64_t max_in_place_query) {
  TORCH_CHECK(query.dim() == 4 && query.scalar_type() == at::kFloat, "query: [N, Q, H, D] float32");
  TORCH_CHECK(key_cache.dim() == 3 && key_cache.sizes() == value_cache.sizes(), "caches: [S, KVH, D] alike");
  TORCH_CHECK(key_cache.scalar_type() == value_cache.scalar_type(), "caches: one dtype");
  TORCH_CHECK(key_cache.size(2) == query.size(3) && query.size(2) % key_cache.size(1) == 0,
              "query heads must be a multiple of the KV heads, with the same head size");
  TORCH_CHECK(key_slots.dim() == 2 && key_slots.size(0) == query.size(0) && key_slots.scalar_type() == at::kLong,
              "key_slots: [N, L] int64");
  TORCH_CHECK(visible.dim() == 3 && visible.size(0) == query.size(0) && visible.size(1) == query.size(1) &&
                  visible.size(2) == key_slots.size(1) && visible.scalar_type() == at::kBool,
              "visible: [N, Q, L] bool");
  if (query.size(1) > max_in_place_query) return gathered_attention(query, key_cache, value_cache, key_slots, visible, scale);
  auto q = query.contiguous();
  auto k = key_cache.contiguous();
  auto v = value_cache.contiguous();
  auto slots = key_slots.contiguous();
  auto vis = visible.contiguous();
  auto out = at::empty(query.sizes(), query.options());
  if (k.scalar_type() == at::kFloat) {
    attend<float>(q, k, v, slots, vis, scale, out);
  } else {
    TORCH_CHECK(k.scalar_type() == at::kBFloat16, "caches: float32 or bfloat16");
    attend<c10::BFloat16>(q, k, v, slots, vis, scale, out);
  }
  return out;
}

}  // namespace

TORCH_LIBRARY(eagle_serve, m) {
  m.def("paged_attention(Tensor query, Tensor key_cache, Tensor value_cache, Tensor key_slots, "
        "Tensor visible, float scale, int max_in_place_query) -> Tensor");
}

TORCH_LIBRARY_IMPL(eagle_serve, CPU, m) { m.impl("paged_attention", &paged_attention); }
