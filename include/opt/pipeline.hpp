// opt/pipeline.hpp: one model across processes or machines (pipeline parallel over MPI). The decoder layers are
// split into contiguous ranges, one per rank (split_layers); rank 0 also holds the embeddings and the LM head
// (stage_options). Each rank loads only its part (LoadOptions::layers / embeddings / head), so it maps and
// touches only its own weights. Rank 0 runs the host program: its Model gets a pipeline::Head as its remote
// layers (Model::set_remote_layers), so forward(), opt::Batch, generate and speculative decoding run unchanged;
// each pass sends the residual stream (the exact float bits) rank to rank, 0 -> 1 -> ... -> last -> 0, and every
// other rank runs a pipeline::Stage, serving passes until rank 0 calls Head::finish(). The result is bit-identical
// to one process's: every rank runs the same operations on the same values (the kernels' results do not depend on
// the thread count or the batch, so any --threads per rank gives the same bits).
//
// split_layers, stage_options, encode_pass and StageCaches need nothing (a test chains stages in one process
// with them); Head and Stage exist only when compiled with MPI: OPT_MPI defined and <mpi.h> on the include path
// (CMake: -DOPT_MPI=ON, the MPI::MPI_CXX target).
//
// The wire: per pass, a header of int64 (kind, chunk count, then per chunk its key, cache size before the pass,
// new tokens, cache capacity, cache element type) and then the [tokens, hidden] floats. A stage keeps one KvCache
// (of its own layers) per key: a chunk whose cache is empty on rank 0 starts a new one, a smaller size rolls the
// stage's back (speculative decoding), and a stage forgets the caches of sequences absent from a pass. So the
// contract is opt::Batch's: every live sequence takes part in every pass.
//
// Micro-batches (Head::lane): independent groups of sequences in flight at once, so that the ranks work on
// different groups at the same time instead of waiting for the one pass in flight. Each group is its own stream
// of passes (the pass kind carries the group; the "every live sequence in every pass" rule holds per group) and
// is driven by its own host thread with its own Model copy (set_remote_layers(head->lane(g))) and Workspace.
// Group 0 is Head::run's: without lanes the wire is what it always was.
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "opt/error.hpp"
#include "opt/model.hpp"

OPT_NAMESPACE_BEGIN

namespace pipeline {

// The layers rank `rank` of `ranks` holds: contiguous ranges in rank order covering [0, n_layers); when the layers
// do not divide evenly the later ranks get one more (rank 0 also runs the embeddings and the head).
inline LayerRange split_layers(int64_t n_layers, int ranks, int rank) {
  if (ranks < 1 || rank < 0 || rank >= ranks)
    throw input_error("pipeline::split_layers: rank " + std::to_string(rank) + " of " + std::to_string(ranks) +
                      " (expected 0 <= rank < ranks)");
  if (n_layers < 0) throw input_error("pipeline::split_layers: " + std::to_string(n_layers) + " layers");
  const int64_t base = n_layers / ranks, extra = n_layers % ranks;  // the last `extra` ranks get base + 1
  auto start = [&](int64_t r) { return r * base + std::max<int64_t>(0, r - (ranks - extra)); };
  return {start(rank), start(rank + 1)};
}

// What rank `rank` of `ranks` loads: `base` (quantization, strictness) with its layers, and the embeddings and
// the head on rank 0 only.
inline LoadOptions stage_options(LoadOptions base, int64_t n_layers, int ranks, int rank) {
  base.layers = split_layers(n_layers, ranks, rank);
  base.embeddings = base.head = rank == 0;
  return base;
}

// The wire format of a pass's header (int64 values): kind (kStop, or kPass + the pass's group), chunk count, then
// per chunk its key (the KvCache's address on rank 0), the cache size before the pass, new tokens, cache
// capacity, cache element type.
namespace wire {
constexpr int64_t kStop = 0, kPass = 1;
constexpr int64_t kFixed = 2, kPerChunk = 5;
constexpr int64_t kMaxGroups = 1024;  // groups 0 .. kMaxGroups - 1 (Head::lane)
}  // namespace wire

// The header of a pass over `chunks` (rank 0's caches) of group `group` (0 <= group < wire::kMaxGroups).
inline void encode_pass(const std::vector<SequenceChunk>& chunks, std::vector<int64_t>& header, int group = 0) {
  header.assign({wire::kPass + group, int64_t(chunks.size())});
  for (const SequenceChunk& ch : chunks)
    header.insert(header.end(), {int64_t(reinterpret_cast<uintptr_t>(ch.cache)), ch.cache->size(), ch.n,
                                 ch.cache->capacity(), int64_t(ch.cache->type())});
}

// The group of the pass `header` (of `len` values; its kind is kPass + group), or -1 for a stop. Throws
// format_error for anything else; `who` names the stage.
inline int pass_group(const int64_t* header, int64_t len, const std::string& who) {
  if (len >= wire::kFixed && header[0] == wire::kStop) return -1;
  if (len < wire::kFixed || header[0] < wire::kPass || header[0] >= wire::kPass + wire::kMaxGroups)
    throw format_error(who + ": a header of " + std::to_string(len) + " values of kind " +
                       (len > 0 ? std::to_string(header[0]) : std::string("none")) + " (expected a stop or a pass of " +
                       "a group below " + std::to_string(wire::kMaxGroups) + ")");
  return int(header[0] - wire::kPass);
}

// A stage's KV caches of one group of sequences (one per sequence), kept in step with rank 0's from the pass
// headers: a chunk whose cache is empty on rank 0 starts a new one, a smaller size rolls the stage's back (rejected
// speculative tokens), and the caches of sequences absent from a pass are dropped (so every live sequence of the
// group must take part in every pass of the group, as in opt::Batch).
class StageCaches {
 public:
  // The chunks of the pass `header` (a pass header of `len` values, of any group) over this stage's caches; `who`
  // names the stage in messages. Throws format_error for a malformed header, input_error for a sequence it cannot
  // follow. `layers`: the stage's (Model::layers()), which its caches hold.
  const std::vector<SequenceChunk>& begin_pass(const Config& c, LayerRange layers, const int64_t* header,
                                               int64_t len, const std::string& who) {
    if (len < wire::kFixed || header[0] < wire::kPass || header[0] >= wire::kPass + wire::kMaxGroups ||
        header[1] < 0 || len != wire::kFixed + wire::kPerChunk * header[1])
      throw format_error(who + ": a pass header of " + std::to_string(len) + " values (expected " +
                         std::to_string(wire::kFixed) + " + " + std::to_string(wire::kPerChunk) + " per chunk)");
    std::map<int64_t, KvCache> live;
    for (int64_t i = 0; i < header[1]; ++i) {
      const int64_t* p = header + wire::kFixed + wire::kPerChunk * i;
      const int64_t key = p[0], size = p[1], n = p[2], capacity = p[3];
      const dtype type = dtype(p[4]);
      if (n <= 0 || size < 0 || live.count(key))
        throw format_error(who + ": chunk " + std::to_string(i) + " of a pass header: " + std::to_string(n) +
                           " tokens at position " + std::to_string(size) + (live.count(key) ? ", a repeated key" : ""));
      auto it = caches_.find(key);
      if (size == 0) {  // a new sequence (or a key reused by one): a fresh cache
        live.emplace(key, KvCache(c, capacity, type, layers));
        continue;
      }
      if (it == caches_.end() || it->second.size() < size || it->second.capacity() != capacity ||
          it->second.type() != type)
        throw input_error(who + ": no cache for a sequence at position " + std::to_string(size) +
                          " (every live sequence takes part in every pass)");
      it->second.truncate(size);  // a rollback on rank 0 (speculative decoding), or nothing
      live.emplace(key, std::move(it->second));
    }
    caches_ = std::move(live);  // the sequences absent from this pass are gone
    chunks_.clear();
    for (int64_t i = 0; i < header[1]; ++i) {
      const int64_t* p = header + wire::kFixed + wire::kPerChunk * i;
      chunks_.push_back({&caches_.at(p[0]), nullptr, p[2]});
    }
    return chunks_;
  }
  size_t sequences() const noexcept { return caches_.size(); }
  size_t bytes() const noexcept {
    size_t b = 0;
    for (const auto& [k, cache] : caches_) b += cache.bytes();
    return b;
  }

 private:
  std::map<int64_t, KvCache> caches_;
  std::vector<SequenceChunk> chunks_;
};

}  // namespace pipeline

OPT_NAMESPACE_END

#if defined(OPT_MPI)
#ifndef OMPI_SKIP_MPICXX  // the C API only: no MPI C++ bindings (removed in MPI-3, noisy under -Wextra)
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

OPT_NAMESPACE_BEGIN

namespace pipeline {

namespace detail {
// headers, hidden states between ranks, hidden states back to rank 0 (kReturnTag + the pass's group)
constexpr int kHeaderTag = 1, kHiddenTag = 2, kReturnTag = 2;

inline void check(int rc, const char* what, int peer) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw io_error(std::string("pipeline: ") + what + " rank " + std::to_string(peer) + " failed: " +
                 std::string(msg, size_t(len)));
}

// Waiting without holding a core: MPI's blocking calls poll in a busy loop, so a stage waiting for the next pass
// (or rank 0 waiting for a pass to come back) would take a core from the ranks computing beside it (several ranks
// on one machine) or burn one while idle (a server between requests). `done()` is tried in a spin for the first
// 50 us, then between sleeps that double from 20 us up to 1 ms: a hand-off is noticed at most ~1 ms late.
template <class Done>
void wait_for(Done done) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  auto nap = std::chrono::microseconds(20);
  while (!done()) {
    if (clock::now() - start < std::chrono::microseconds(50)) continue;
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::microseconds(1000));
  }
}

// A blocking receive that waits with wait_for.
inline int recv(void* buf, int count, MPI_Datatype type, int source, int tag, MPI_Comm comm) {
  MPI_Request req;
  int rc = MPI_Irecv(buf, count, type, source, tag, comm, &req);
  if (rc != MPI_SUCCESS) return rc;
  wait_for([&] {
    int flag = 0;
    rc = MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
    return rc != MPI_SUCCESS || flag;
  });
  return rc;
}

// A duplicate of comm whose MPI errors return (and become io_errors) instead of ending the job.
inline MPI_Comm duplicate(MPI_Comm comm) {
  MPI_Comm dup = MPI_COMM_NULL;
  check(MPI_Comm_dup(comm, &dup), "MPI_Comm_dup with", 0);
  MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
  return dup;
}

// Every rank's part, gathered on rank 0 and checked there: contiguous layers covering the model, the same shape.
inline void handshake(const Model& m, MPI_Comm comm, int rank, int ranks) {
  const Config& c = m.config();
  const int64_t mine[5] = {m.layers().first, m.layers().last, c.num_hidden_layers, c.hidden_size,
                           c.num_attention_heads};
  std::vector<int64_t> all(size_t(rank == 0 ? 5 * ranks : 5));
  check(MPI_Gather(mine, 5, MPI_INT64_T, all.data(), 5, MPI_INT64_T, 0, comm), "MPI_Gather on", rank);
  if (rank != 0) return;
  for (int r = 0; r < ranks; ++r) {
    const int64_t* p = all.data() + 5 * r;
    const std::string who = "pipeline: rank " + std::to_string(r);
    if (p[2] != c.num_hidden_layers || p[3] != c.hidden_size || p[4] != c.num_attention_heads)
      throw config_error(who + " holds a model of " + std::to_string(p[2]) + " layers, hidden " +
                         std::to_string(p[3]) + ", " + std::to_string(p[4]) + " heads; rank 0's has " +
                         std::to_string(c.num_hidden_layers) + ", " + std::to_string(c.hidden_size) + ", " +
                         std::to_string(c.num_attention_heads));
    const int64_t want = r == 0 ? 0 : all[size_t(5 * (r - 1) + 1)];
    if (p[0] != want || p[1] < p[0] || (r + 1 == ranks && p[1] != c.num_hidden_layers))
      throw config_error(who + " holds layers [" + std::to_string(p[0]) + ", " + std::to_string(p[1]) +
                         "), expected [" + std::to_string(want) + ", ...)" +
                         (r + 1 == ranks ? " ending at " + std::to_string(c.num_hidden_layers) : std::string()));
  }
}
// Rank 0 tells rank 1 (which tells the next) that there are no more passes.
inline void send_stop(MPI_Comm comm) {
  const int64_t stop[wire::kFixed] = {wire::kStop, 0};
  check(MPI_Send(stop, int(wire::kFixed), MPI_INT64_T, 1, kHeaderTag, comm), "MPI_Send of the stop to", 1);
}
}  // namespace detail

// Bytes the pipeline moved: every boundary (0 -> 1, ..., last -> 0) carries each pass's hidden states, and the
// boundaries out of rank 0 and between stages its header too.
struct Traffic {
  int64_t passes = 0;
  int64_t tokens = 0;         // rows of hidden states sent per boundary, summed over passes
  int64_t hidden_bytes = 0;   // hidden-state bytes over all boundaries
  int64_t header_bytes = 0;   // header bytes over all boundaries
  int boundaries = 0;         // hand-offs per pass: the number of ranks
  int64_t bytes() const noexcept { return hidden_bytes + header_bytes; }
};

// Rank 0's side: the layers the other ranks hold, as a Model's remote layers (group 0), and as lanes (lane(g)):
// one stream of passes per group of sequences, several of them in flight at once from different host threads.
// Every MPI call the Head makes holds its mutex, so MPI_THREAD_SERIALIZED is enough; a pass waits for its result
// without holding it (other lanes send and receive meanwhile).
class Head : public RemoteLayers, public std::enable_shared_from_this<Head> {
 public:
  // Collective with every other rank's Stage constructor (same comm): checks that the ranks' parts fit together
  // (otherwise the stages are told to stop and a config_error names the rank). comm must have >= 2 ranks.
  Head(const Model& model, MPI_Comm comm) : hidden_(model.config().hidden_size) {
    MPI_Comm_rank(comm, &rank_);
    MPI_Comm_size(comm, &ranks_);
    if (rank_ != 0 || ranks_ < 2)
      throw input_error("pipeline::Head: rank " + std::to_string(rank_) + " of " + std::to_string(ranks_) +
                        " (the head is rank 0 of at least 2)");
    comm_ = detail::duplicate(comm);
    try {
      detail::handshake(model, comm_, rank_, ranks_);
    } catch (const config_error&) {  // the stages passed the handshake and wait for a pass: stop them
      detail::send_stop(comm_);
      MPI_Comm_free(&comm_);
      throw;
    }
    traffic_.boundaries = ranks_;
  }
  Head(const Head&) = delete;
  Head& operator=(const Head&) = delete;
  ~Head() override {
    if (comm_ != MPI_COMM_NULL) {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) MPI_Comm_free(&comm_);
    }
  }

  // A pass of group 0.
  void run(const std::vector<SequenceChunk>& chunks, float* hidden, int64_t rows, int64_t dim) override {
    pass(0, chunks, hidden, rows, dim, nullptr);
  }

  // The remote layers of group `group` (0 <= group < wire::kMaxGroups; 0 is run()'s): for a Model copy of its
  // own (Model::set_remote_layers), driven by one host thread; groups run concurrently, one pass in flight per
  // group. `compute` (optional): the lane unlocks it while its pass is on the other ranks and locks it again
  // before returning, so host threads that hold it around their forward() calls take turns on rank 0 (one of them
  // computes at a time: rank 0 keeps its share of cores while the others work on the other groups). The Head
  // must be owned by a shared_ptr (the lane keeps it alive). The stages keep a group's caches until a pass of the
  // group without them (run with no chunks drops them all) or finish().
  std::shared_ptr<RemoteLayers> lane(int group, std::mutex* compute = nullptr) {
    if (group < 0 || group >= wire::kMaxGroups)
      throw input_error("pipeline::Head::lane: group " + std::to_string(group) + " (expected 0 <= group < " +
                        std::to_string(wire::kMaxGroups) + ")");
    std::shared_ptr<Head> self = weak_from_this().lock();
    if (!self) throw input_error("pipeline::Head::lane: the Head is not owned by a shared_ptr");
    return std::make_shared<Lane>(std::move(self), group, compute);
  }

  // Tells the stages to stop (their Stage::serve_pass returns false); later passes are an input_error. Idempotent.
  // Passes still in flight complete first (the stop follows them).
  void finish() {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    finished_ = true;
    detail::send_stop(comm_);
  }

  Traffic traffic() const {
    std::lock_guard<std::mutex> lock(mu_);
    return traffic_;
  }
  int ranks() const noexcept { return ranks_; }

 private:
  class Lane : public RemoteLayers {
   public:
    Lane(std::shared_ptr<Head> head, int group, std::mutex* compute)
        : head_(std::move(head)), group_(group), compute_(compute) {}
    void run(const std::vector<SequenceChunk>& chunks, float* hidden, int64_t rows, int64_t dim) override {
      head_->pass(group_, chunks, hidden, rows, dim, compute_);
    }

   private:
    std::shared_ptr<Head> head_;
    int group_;
    std::mutex* compute_;
  };

  // Polls `req` (count requests) under the mutex until they complete, without holding it in between.
  int wait_all(MPI_Request* req, int count) {
    int rc = MPI_SUCCESS;
    detail::wait_for([&] {
      std::lock_guard<std::mutex> lock(mu_);
      int flag = 0;
      rc = MPI_Testall(count, req, &flag, MPI_STATUSES_IGNORE);
      return rc != MPI_SUCCESS || flag;
    });
    return rc;
  }

  void pass(int group, const std::vector<SequenceChunk>& chunks, float* hidden, int64_t rows, int64_t dim,
            std::mutex* compute) {
    if (dim != hidden_) throw input_error("pipeline::Head: hidden width " + std::to_string(dim));
    const int count = int(rows * dim);
    std::vector<int64_t> header;
    encode_pass(chunks, header, group);
    MPI_Request req[2];
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finished_) throw input_error("pipeline::Head: a pass after finish()");
      if (!in_flight_.insert(group).second)
        throw input_error("pipeline::Head: a pass of group " + std::to_string(group) +
                          " while another is in flight (one host thread per group)");
      // header and hidden states posted together: rank 1 sees every pass's two messages in a row
      int rc = MPI_Isend(header.data(), int(header.size()), MPI_INT64_T, 1, detail::kHeaderTag, comm_, &req[0]);
      if (rc == MPI_SUCCESS) rc = MPI_Isend(hidden, count, MPI_FLOAT, 1, detail::kHiddenTag, comm_, &req[1]);
      if (rc != MPI_SUCCESS) in_flight_.erase(group);
      detail::check(rc, "MPI_Isend of a pass to", 1);
    }
    struct Away {  // `compute` released while the pass is away, and taken back however it ends
      std::mutex* m;
      explicit Away(std::mutex* mu) : m(mu) {
        if (m) m->unlock();
      }
      ~Away() {
        if (m) m->lock();
      }
    } away(compute);
    struct Landed {  // the group is free again however the pass ends
      Head* h;
      int g;
      ~Landed() {
        std::lock_guard<std::mutex> lock(h->mu_);
        h->in_flight_.erase(g);
      }
    } landed{this, group};
    detail::check(wait_all(req, 2), "MPI_Isend of a pass to", 1);
    {
      std::lock_guard<std::mutex> lock(mu_);
      detail::check(MPI_Irecv(hidden, count, MPI_FLOAT, ranks_ - 1, detail::kReturnTag + group, comm_, &req[0]),
                    "MPI_Irecv of hidden states from", ranks_ - 1);
    }
    detail::check(wait_all(req, 1), "MPI_Recv of hidden states from", ranks_ - 1);
    std::lock_guard<std::mutex> lock(mu_);
    ++traffic_.passes;
    traffic_.tokens += rows;
    traffic_.hidden_bytes += int64_t(ranks_) * rows * dim * int64_t(sizeof(float));
    traffic_.header_bytes += int64_t(ranks_ - 1) * int64_t(header.size() * sizeof(int64_t));
  }

  int64_t hidden_;
  int rank_ = 0, ranks_ = 0;
  MPI_Comm comm_ = MPI_COMM_NULL;
  mutable std::mutex mu_;  // every MPI call on comm_, and the members below
  bool finished_ = false;
  std::set<int> in_flight_;  // the groups with a pass in flight
  Traffic traffic_;
};

// A rank > 0: runs its layers for every pass rank 0 sends, with its own KV caches.
class Stage {
 public:
  // Collective with rank 0's Head constructor (same comm). `model`: this rank's part (stage_options); `ws`: its
  // scratch and threads.
  Stage(const Model& model, Workspace& ws, MPI_Comm comm) : model_(&model), ws_(&ws) {
    MPI_Comm_rank(comm, &rank_);
    MPI_Comm_size(comm, &ranks_);
    if (rank_ == 0) throw input_error("pipeline::Stage: rank 0 is the head (pipeline::Head)");
    comm_ = detail::duplicate(comm);
    detail::handshake(model, comm_, rank_, ranks_);
  }
  Stage(const Stage&) = delete;
  Stage& operator=(const Stage&) = delete;
  ~Stage() {
    if (comm_ != MPI_COMM_NULL) {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) MPI_Comm_free(&comm_);
    }
  }

  // Waits for the next pass from rank - 1, runs this rank's layers and sends the result on (to rank + 1, or back
  // to rank 0 from the last rank). Returns false, having passed the stop on, when rank 0 finished.
  bool serve_pass() {
    const int prev = rank_ - 1, next = rank_ + 1 < ranks_ ? rank_ + 1 : 0;
    MPI_Status st;
    int rc = MPI_SUCCESS;
    detail::wait_for([&] {
      int flag = 0;
      rc = MPI_Iprobe(prev, detail::kHeaderTag, comm_, &flag, &st);
      return rc != MPI_SUCCESS || flag;
    });
    detail::check(rc, "MPI_Iprobe for a header from", prev);
    int len = 0;
    MPI_Get_count(&st, MPI_INT64_T, &len);
    header_.resize(size_t(std::max(len, 0)));
    detail::check(MPI_Recv(header_.data(), len, MPI_INT64_T, prev, detail::kHeaderTag, comm_, MPI_STATUS_IGNORE),
                  "MPI_Recv of a header from", prev);
    const std::string who = "pipeline: rank " + std::to_string(rank_);
    const int group = pass_group(header_.data(), len, who);
    if (group < 0) {  // the stop
      if (next != 0)
        detail::check(MPI_Send(header_.data(), len, MPI_INT64_T, next, detail::kHeaderTag, comm_),
                      "MPI_Send of the stop to", next);
      return false;
    }
    const Config& c = model_->config();
    const std::vector<SequenceChunk>& chunks = groups_[group].begin_pass(c, model_->layers(), header_.data(), len, who);
    int64_t rows = 0;
    for (const SequenceChunk& ch : chunks) rows += ch.n;
    hidden_.resize(size_t(rows * c.hidden_size));
    const int count = int(hidden_.size());
    detail::check(detail::recv(hidden_.data(), count, MPI_FLOAT, prev, detail::kHiddenTag, comm_),
                  "MPI_Recv of hidden states from", prev);
    if (!chunks.empty()) model_->forward_layers(chunks, hidden_.data(), *ws_);
    if (next != 0)
      detail::check(MPI_Send(header_.data(), len, MPI_INT64_T, next, detail::kHeaderTag, comm_),
                    "MPI_Send of a header to", next);
    detail::check(MPI_Send(hidden_.data(), count, MPI_FLOAT, next,
                           next != 0 ? detail::kHiddenTag : detail::kReturnTag + group, comm_),
                  "MPI_Send of hidden states to", next);
    ++passes_;
    return true;
  }

  int64_t passes() const noexcept { return passes_; }
  size_t sequences() const noexcept {  // caches held, over every group
    size_t n = 0;
    for (const auto& [g, caches] : groups_) n += caches.sequences();
    return n;
  }

 private:
  const Model* model_;
  Workspace* ws_;
  int rank_ = 0, ranks_ = 0;
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::vector<int64_t> header_;
  std::map<int, StageCaches> groups_;  // per group of sequences (Head::lane)
  ops::aligned_vector<float> hidden_;
  int64_t passes_ = 0;
};

}  // namespace pipeline

OPT_NAMESPACE_END
#endif  // OPT_MPI
