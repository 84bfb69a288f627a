// Data-parallel pieces in one process (label torch): torchrun's environment and its errors, a
// two-rank Gloo group joined from two threads (rank 0 hosting the store, as without torchrun's
// agent): collectives, the gradient reducer against a hand-averaged gradient, start-up errors as
// sentences, failures named by rank; checkpoint cursors per rank; merging the ranks' statistics
// and naming a straggler.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <future>
#include <map>
#include <thread>

#include <torch/torch.h>

#include "model/dist/dist_env.h"
#include "model/dist/dist_group.h"
#include "model/dist/dist_reducer.h"
#include "runner/data_parallel.h"
#include "runner/rank_stats.h"
#include "stages/types.h"
#include "test_util.h"

// After the torch headers: c10 defines a glog-style CHECK macro that doctest must override.
#include <doctest/doctest.h>

using namespace pipeline;
using test_util::contains;
using test_util::env_of;
using test_util::error_of;
using test_util::free_port;

namespace {

dist::LaunchEnv env_for(int rank, int world, uint16_t port) {
  dist::LaunchEnv e;
  e.rank = rank;
  e.world_size = world;
  e.local_rank = rank;
  e.local_world_size = world;
  e.master_addr = "127.0.0.1";
  e.master_port = port;
  e.agent_store = false;
  e.hosts_store = rank == 0;  // rank 0 hosts the store
  return e;
}

dist::GroupOptions quick(std::string fingerprint = "same") {
  dist::GroupOptions o;
  o.timeout = std::chrono::seconds(20);
  o.heartbeat_timeout = std::chrono::seconds(2);
  o.config_fingerprint = std::move(fingerprint);
  return o;
}

// Runs f(rank, group) on two threads, each rank with its own group.
template <class F>
void two_ranks(F f, dist::GroupOptions o0 = quick(), dist::GroupOptions o1 = quick()) {
  const auto port = free_port();
  auto r1 = std::async(std::launch::async, [&] {
    auto g = dist::Group::join(env_for(1, 2, port), o1);
    f(1, *g);
  });
  auto g = dist::Group::join(env_for(0, 2, port), o0);
  f(0, *g);
  r1.get();
}

}  // namespace

TEST_CASE("torchrun's environment: none without a rank's variables; a partial one and every bad value named") {
  CHECK(!dist::launch_env(env_of({})));
  std::map<std::string, std::string> ok = {{"WORLD_SIZE", "4"},       {"RANK", "3"},          {"LOCAL_RANK", "1"},
                                           {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "nodeA"}, {"MASTER_PORT", "29500"},
                                           {"TORCHELASTIC_USE_AGENT_STORE", "True"}, {"TORCHELASTIC_RUN_ID", "x"}};
  auto e = dist::launch_env(env_of(ok));
  REQUIRE(e);
  CHECK(e->rank == 3);
  CHECK(e->local_rank == 1);
  CHECK(e->agent_store);
  CHECK(e->torchrun());
  CHECK(contains(e->str(), "rank 3 of 4 (local rank 1 of 2), store at nodeA:29500 (torchrun's agent)"));
  auto bad = [&](const std::string& key, const std::string& value) {
    auto vars = ok;
    if (value.empty())
      vars.erase(key);
    else
      vars[key] = value;
    return error_of([&] { dist::launch_env(env_of(vars)); });
  };
  CHECK(contains(bad("WORLD_SIZE", "two"), "WORLD_SIZE is \"two\": expected an integer from 1"));
  CHECK(contains(bad("RANK", "4"), "RANK is 4 but WORLD_SIZE is 4"));
  CHECK(contains(bad("RANK", ""), "WORLD_SIZE, LOCAL_WORLD_SIZE set, but RANK is not"));
  CHECK(contains(bad("MASTER_ADDR", ""), "but MASTER_ADDR is not"));
  // A partial environment is an error naming every missing variable, never a silent single process.
  auto partial = error_of([&] { dist::launch_env(env_of({{"RANK", "0"}, {"LOCAL_RANK", "0"}})); });
  CHECK(contains(partial, "a partial torchrun environment: RANK, LOCAL_RANK set, but WORLD_SIZE, MASTER_ADDR, MASTER_PORT are not"));
  CHECK(contains(partial, "to train as one process, unset RANK, LOCAL_RANK"));
  auto no_store = error_of(
      [&] { dist::launch_env(env_of({{"RANK", "0"}, {"LOCAL_RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}})); });
  CHECK(contains(no_store, "but MASTER_ADDR is not"));
  CHECK(contains(error_of([&] { dist::launch_env(env_of({{"WORLD_SIZE", "2"}, {"RANK", "1"}})); }),
                 "but MASTER_ADDR, MASTER_PORT are not"));
  // The store's address alone (exported for other tools) is no launch.
  CHECK(!dist::launch_env(env_of({{"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}})));
  CHECK(contains(bad("MASTER_PORT", "70000"), "MASTER_PORT is \"70000\""));
  CHECK(contains(bad("LOCAL_RANK", "2"), "LOCAL_RANK is 2 but LOCAL_WORLD_SIZE is 2"));
  // By hand, without LOCAL_*: one rank per machine.
  auto plain = dist::launch_env(env_of({{"WORLD_SIZE", "2"}, {"RANK", "1"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}}));
  REQUIRE(plain);
  CHECK(plain->local_rank == 1);
  CHECK(!plain->agent_store);
}

TEST_CASE("two ranks: collectives, the store, and the reducer's average equals the mean gradient") {
  at::set_num_threads(1);
  torch::manual_seed(3);
  auto w0 = torch::randn({5, 3});
  auto xs = std::vector<torch::Tensor>{torch::randn({4, 5}), torch::randn({4, 5})};  // one batch per rank
  // The reference: the mean of the two ranks' gradients, computed in one process.
  auto ref = torch::zeros({5, 3});
  for (const auto& x : xs) {
    auto w = w0.clone().requires_grad_(true);
    x.matmul(w).pow(2).sum().backward();
    ref += w.grad() / 2;
  }
  std::vector<torch::Tensor> grads(2);
  two_ranks([&](int rank, dist::Group& g) {
    CHECK(g.rank() == rank);
    auto t = torch::full({3}, static_cast<float>(rank + 1));
    g.allreduce_sum(t)->wait();
    CHECK(torch::equal(t, torch::full({3}, 3.0f)));
    auto f = torch::tensor({static_cast<int64_t>(rank * 7)});
    g.allreduce_max(f)->wait();
    CHECK(f.item<int64_t>() == 7);
    g.set("hello/" + std::to_string(rank), "from " + std::to_string(rank));
    CHECK(g.get("hello/" + std::to_string(1 - rank)) == "from " + std::to_string(1 - rank));
    // Rank 1 starts from other weights: the broadcast makes them rank 0's.
    auto w = (rank == 0 ? w0.clone() : torch::zeros({5, 3})).requires_grad_(true);
    {
      torch::NoGradGuard no_grad;  // an in-place write into a leaf
      g.broadcast({w}, 0);
    }
    CHECK(torch::equal(w.detach(), w0));
    dist::GradientReducer reducer(g, {w});
    CHECK(reducer.bucket_sizes() == std::vector<int64_t>{15 * 4});
    // Two steps: the second after the buckets were rebuilt; plus a micro-batch that does not sync.
    for (int step = 0; step < 2; ++step) {
      w.mutable_grad() = torch::Tensor();
      auto half = xs[static_cast<size_t>(rank)].narrow(0, 0, 2), rest = xs[static_cast<size_t>(rank)].narrow(0, 2, 2);
      auto l1 = half.matmul(w).pow(2).sum();
      reducer.before_backward(l1, /*sync=*/false);
      l1.backward();
      reducer.before_forward();
      auto l2 = rest.matmul(w).pow(2).sum();
      reducer.before_backward(l2, /*sync=*/true);
      l2.backward();
      grads[static_cast<size_t>(rank)] = w.grad().clone();
      CHECK(torch::allclose(w.grad(), ref, 1e-5, 1e-6));
    }
  });
  CHECK(torch::equal(grads[0], grads[1]));
}

TEST_CASE("start-up errors read as sentences") {
  SUBCASE("a rank that never comes") {
    auto o = quick();
    o.timeout = std::chrono::seconds(2);
    auto e = error_of([&] { dist::Group::join(env_for(0, 2, free_port()), o); });
    CHECK(contains(e, "rank 1 of 2 did not join within 2 s"));
    CHECK(contains(e, "WORLD_SIZE (2)"));
  }
  SUBCASE("the port is taken") {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(fd, 1) == 0);
    socklen_t n = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
    auto e = error_of([&] { dist::Group::join(env_for(0, 2, ntohs(a.sin_port)), quick()); });
    ::close(fd);
    CHECK(contains(e, "could not host the rendezvous store on port " + std::to_string(ntohs(a.sin_port))));
    CHECK(contains(e, "the port is in use"));
  }
  SUBCASE("ranks that disagree on the world size or the configuration") {
    const auto port = free_port();
    auto o = quick("run.seed = 1\ntraining.steps = 8\n");
    auto other = std::async(std::launch::async, [&] {
      return error_of([&] { dist::Group::join(env_for(1, 2, port), quick("run.seed = 1\ntraining.steps = 9\n")); });
    });
    auto e0 = error_of([&] { dist::Group::join(env_for(0, 2, port), o); });
    auto e1 = other.get();
    // Rank 1 finds the difference (rank 0's configuration is the reference); rank 0 learns it at once.
    CHECK(contains(e1, "rank 1's configuration differs from rank 0's (training.steps = 9 here, training.steps = 8 on rank 0)"));
    CHECK(contains(e0, "rank 1 failed: rank 1's configuration differs"));
  }
}

TEST_CASE("a failing rank is named: at once through its record, or by its silence") {
  two_ranks([&](int rank, dist::Group& g) {
    if (rank == 1) {
      g.record_exit("stage 'read': disk on fire");
      return;
    }
    // Rank 0 waits for something rank 1 will never send: the wait ends with rank 1's failure.
    auto t0 = std::chrono::steady_clock::now();
    auto e = error_of([&] { g.get("never"); });
    CHECK(contains(e, "rank 1 failed: stage 'read': disk on fire"));
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
    CHECK(contains(g.diagnose(), "rank 1 failed: stage 'read': disk on fire"));
  });
  // Silence: rank 1 leaves without a record; its heartbeat stops and rank 0's watch reports it.
  const auto port = free_port();
  std::promise<std::string> reported;
  auto r1 = std::async(std::launch::async, [&] { dist::Group::join(env_for(1, 2, port), quick()); });
  auto g0 = dist::Group::join(env_for(0, 2, port), quick());
  r1.get();  // rank 1's group is gone: no more heartbeats, no exit record
  g0->watch([&](const std::string& why) { reported.set_value(why); });
  auto f = reported.get_future();
  REQUIRE(f.wait_for(std::chrono::seconds(15)) == std::future_status::ready);
  CHECK(contains(f.get(), "rank 1 stopped responding: no heartbeat for 2 s"));
  CHECK(contains(g0->diagnose(), "rank 1 is gone"));
}

TEST_CASE("checkpoint cursors: one per rank, refused for another number of ranks") {
  stages::DataCursor c;
  c.pos.pos.shard = 0;
  c.pos.pos.item = 9;
  c.skip = 4;
  std::string single = "{\"step\":3,\"cursor\":" + c.to_json() + "}";
  CHECK(stages::checkpoint_cursor(single, 0, 1, "ck").skip == 4);
  auto e = error_of([&] { stages::checkpoint_cursor(single, 0, 2, "ck"); });
  CHECK(contains(e, "ck was written by a run of 1 process (no data parallel), and this run has 2 ranks"));
  CHECK(contains(e, "resume it with `pipeline run --resume` without torchrun"));
  stages::DataCursor c1 = c;
  c1.pos.pos.item = 11;
  std::string two = "{\"step\":3,\"cursor\":" + c.to_json() + ",\"world_size\":2,\"cursors\":[" + c.to_json() + "," +
                    c1.to_json() + "]}";
  CHECK(stages::checkpoint_cursor(two, 1, 2, "ck").pos.pos.item == 11);
  e = error_of([&] { stages::checkpoint_cursor(two, 0, 4, "ck"); });
  CHECK(contains(e, "written by a run of 2 ranks, and this run has 4 ranks"));
  CHECK(contains(e, "torchrun and 2 ranks in all"));
  e = error_of([&] { stages::checkpoint_cursor(two, 0, 1, "ck"); });
  CHECK(contains(e, "written by a run of 2 ranks, and this run has 1 process"));
}

TEST_CASE("checkpoint cursors in every rank's terms: one start for any number of ranks, the batch kept") {
  auto cursor = [](uint64_t doc, uint64_t token) {
    stages::DataCursor c;
    c.pos.pos.item = doc;  // (the reader position only matters to a mix)
    c.has_next = true;
    c.next = {{0, 0, doc, doc}, token};
    return c;
  };
  // Two ranks: rank 0 (even documents) goes on with token 5 of document 8, rank 1 with document 5.
  std::string two = "{\"step\":3,\"grad_accum\":3,\"cursor\":" + cursor(8, 5).to_json() +
                    ",\"world_size\":2,\"cursors\":[" + cursor(8, 5).to_json() + "," + cursor(5, 0).to_json() + "]}";
  for (int world : {1, 3, 2}) {
    auto start = stages::checkpoint_cursor(two, 0, world, "ck");
    REQUIRE(start.done);
    REQUIRE(start.done->layers.size() == 1);
    CHECK(start.done->layers[0].world == 2);
    CHECK(start.done->consumed({0, 0, 6, 6}) == datasets::DataProgress::kAll);
    CHECK(start.done->consumed({0, 0, 8, 8}) == 5);
    CHECK(start.done->consumed({0, 0, 7, 7}) == 0);
    CHECK(start.pos.pos.item == 5);  // the rank furthest behind
  }
  // A run that resumed carries what was consumed before it ("earlier", on rank 0's cursor).
  auto own = cursor(12, 1);
  own.done = stages::checkpoint_cursor(two, 0, 3, "ck").done;
  std::string one = "{\"step\":5,\"grad_accum\":6,\"cursor\":" + own.to_json() + "}";
  auto again = stages::checkpoint_cursor(one, 0, 2, "ck");
  REQUIRE(again.done);
  CHECK(again.done->layers.size() == 1);  // everything before document 12 is consumed: the older layer says no more
  CHECK(again.done->consumed({0, 0, 12, 12}) == 1);
  CHECK(again.done->consumed({0, 0, 11, 11}) == datasets::DataProgress::kAll);
  // The global batch: 2 ranks x 3 micro-batches, shared by the new ranks; refused where it does not divide.
  stages::TrainingSection t;
  t.grad_accum = 1;  // the config's: the checkpoint's "grad_accum" wins
  t.batch_size = 4;
  t.seq_len = 16;
  CHECK(stages::resumed_batch(two, 1, t, "ck").grad_accum == 6);
  CHECK(stages::resumed_batch(two, 3, t, "ck").grad_accum == 2);
  CHECK(stages::resumed_batch(two, 6, t, "ck").grad_accum == 1);
  auto e = error_of([&] { stages::resumed_batch(two, 4, t, "ck"); });
  CHECK(contains(e, "ck trains 6 micro-batches of 4x16 tokens a step (2 ranks x grad_accum 3), which 4 ranks cannot "
                    "share evenly: resume it on 1, 2, 3 or 6 ranks (grad_accum 6, 3, 2 or 1)"));
  // Cursors of a checkpoint written before every rank's terms: at the start, any number of ranks.
  stages::DataCursor fresh;
  std::string old = "{\"step\":1,\"cursor\":" + fresh.to_json() + "}";
  CHECK(!stages::checkpoint_cursor(old, 0, 3, "ck").done);
}

namespace {

graph::StageStats stage(const std::string& name, const std::string& type, double busy, double starved, bool own_thread) {
  graph::StageStats s;
  s.name = name;
  s.type = type;
  s.own_thread = own_thread;
  s.wall_s = 10;
  s.busy_s = 10 * busy;
  s.starved_s = 10 * starved;
  s.items_in = 100;
  return s;
}

graph::Snapshot rank_snapshot(double tokenize_busy, double train_starved) {
  graph::Snapshot s;
  s.status = "done";
  s.stages = {stage("read", "read_shards", 0.05, 0, false), stage("tokenize", "tokenize", tokenize_busy, 0, false),
              stage("h2d", "h2d", 0.1, 0.8, true), stage("train", "train", 1 - train_starved, train_starved, true)};
  graph::QueueStats q;
  q.consumer = "train";
  q.producers = {"h2d"};
  q.capacity = 4;
  q.full = 0.9;
  s.queues = {q};
  return s;
}

}  // namespace

TEST_CASE("rank statistics: merged with a rank per row, shown per rank for device stages, straggler named") {
  auto merged = stages::merge_rank_snapshots({rank_snapshot(0.3, 0.02), rank_snapshot(1.0, 0.4)});
  REQUIRE(merged.stages.size() == 8);
  CHECK(merged.stages[0].rank == 0);
  CHECK(merged.stages[7].rank == 1);
  // The JSON keeps the ranks (pipeline stats reads it back).
  auto back = graph::snapshot_from_json(graph::to_json(merged));
  REQUIRE(back.stages.size() == 8);
  CHECK(back.stages[5].rank == 1);
  auto rows = stages::rank_rows(back);
  std::vector<std::string> names;
  for (const auto& s : rows.stages) names.push_back(s.name);
  CHECK(names == std::vector<std::string>{"read", "tokenize", "h2d", "train", "h2d@1", "train@1"});
  auto v = stages::analyze_ranks(back);
  CHECK(v.kind == "straggler");
  CHECK(contains(v.text, "rank 1: tokenize: busy 100% with 1 worker"));
  CHECK(contains(v.text, "its train waited for input 40% of the time (rank 0: 2%)"));
  CHECK(contains(v.suggestion, "on rank 1: try more tokenize workers"));
  REQUIRE(!v.notes.empty());
  CHECK(contains(v.notes[0], "rank 0 alone: train: busy 98%"));
  // Balanced ranks: no straggler, rank 0's own verdict.
  auto even = stages::analyze_ranks(stages::merge_rank_snapshots({rank_snapshot(0.3, 0.02), rank_snapshot(0.3, 0.03)}));
  CHECK(even.kind != "straggler");
  CHECK(even.stage == "train");
  // A single process's snapshot (no ranks) is judged as before.
  CHECK(stages::analyze_ranks(rank_snapshot(0.3, 0.02)).stage == "train");
  // A snapshot that carries its engine's verdict keeps it for rank 0.
  auto tracked = merged;
  tracked.verdict.kind = "stage";
  tracked.verdict.text = "h2d: as the engine judged it";
  CHECK(contains(stages::analyze_ranks(tracked).notes[0], "rank 0 alone: h2d: as the engine judged it"));
}

TEST_CASE("rank statistics: the straggler is judged on the steady state when the ranks have one") {
  // Over the whole run rank 1 waited most (40%: a slow start); in the steady state rank 0 waits
  // 30% and rank 1 does not wait at all, so rank 0 is the one the others wait for.
  auto r0 = rank_snapshot(1.0, 0.02), r1 = rank_snapshot(0.3, 0.4);
  r0.stages[3].steady.seconds = r1.stages[3].steady.seconds = 5;
  r0.stages[3].steady.starved = 0.3;
  r1.stages[3].steady.starved = 0.0;
  auto v = stages::analyze_ranks(stages::merge_rank_snapshots({r0, r1}));
  CHECK(v.kind == "straggler");
  CHECK(contains(v.text, "rank 0: "));
  CHECK(contains(v.text, "its train waited for input 30% of the time (rank 1: 0%)"));
}
