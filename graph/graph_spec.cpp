// From a GraphSpec (TOML [stages.*] sections or code) to the runtime's stages and edges:
// every check that can fail before anything runs (unknown types and options, missing inputs,
// port types, cycles, workers), with messages that name the file, line, stage and key. Also
// the graph as Graphviz DOT. Nothing here touches the flow graph or the disk.
#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include <oneapi/tbb/info.h>

#include "graph/runtime.h"

namespace pipeline::graph {

namespace {

std::string join(const std::vector<std::string>& v, const std::string& sep = ", ") {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

std::string where(const GraphSpec& g, const StageSpec& s) {
  return (s.where.empty() ? (g.file.empty() ? std::string("graph") : g.file) : s.where) + ": [stages." + s.name + "]";
}

// " (its type from --set stages.read.type=read_tokens)" when a --set chose the stage's type.
std::string set_type(const StageSpec& s) {
  if (!s.resolved || s.resolved->where("type").source != "--set") return "";
  return " (" + s.name + "'s type from " + s.resolved->where("type").str() + ")";
}

// Where the stage's `key` was given: its line, or the --set that gave it; else the stage's section.
std::string where(const GraphSpec& g, const StageSpec& s, const std::string& key) {
  if (s.resolved && s.resolved->was_set(key)) return s.resolved->where(key).str() + ": [stages." + s.name + "]";
  return where(g, s);
}

// Options set from code go through the same check as a config file's (config::check_value):
// defaults filled in, unknown keys, wrong types, ranges and choices rejected.
config::Section resolve_code_options(const StageSpec& s, const StageType& t, const std::string& at) {
  config::Section out("stages." + s.name, at);
  for (const auto& [key, v] : s.values) {
    const config::OptionSpec* o = t.options.find(key);
    if (!o) {
      std::vector<std::string> keys;
      for (const auto& k : t.options.options()) keys.push_back(k.key);
      throw config::ConfigError(at + " unknown option '" + key + "' for stage type " + t.name +
                                "; expected one of: " + (keys.empty() ? "(none)" : join(keys)));
    }
    std::string why;
    auto val = config::check_value(*o, v, why);
    if (!val) throw config::ConfigError(at + " " + key + ": " + why);
    out.set(key, *val, config::Location{"code", 0});
  }
  for (const auto& o : t.options.options()) {
    if (out.has(o.key)) continue;
    if (!o.default_value) throw config::ConfigError(at + " missing required option '" + o.key + "' (" + o.doc + ")");
    out.set(o.key, *o.default_value, config::Location{"default", 0});
  }
  return out;
}

// Reads `type` of a stage section: it decides which schema validates the rest of the section.
std::string section_type(const config::Document& doc, const std::string& section) {
  auto v = doc.peek(section, "type");
  if (auto s = v ? std::get_if<std::string>(&*v) : nullptr) return *s;
  int line = doc.section_line(section);
  std::string at = doc.file() + (line ? ":" + std::to_string(line) : std::string());
  if (!v)
    throw config::ConfigError(at + ": [" + section +
                              "] missing required key 'type' (a string: registered stage type, see `pipeline stages`)");
  throw config::ConfigError(at + ": [" + section + "] type: expected a string naming a stage type, got " +
                            config::value_to_string(*v));
}

std::vector<std::string> known_types() {
  std::vector<std::string> known;
  for (const StageType* k : stage_types()) known.push_back(k->name);
  return known;
}

}  // namespace

GraphSpec GraphSpec::from_config(const config::Document& doc, const std::string& prefix) {
  GraphSpec g;
  g.file = doc.file();
  doc.mark_known(prefix);
  auto names = doc.subsections(prefix);
  if (names.empty())
    throw config::ConfigError(doc.file() + ": no stages: expected sections [" + prefix + ".NAME] with a type");
  for (const auto& name : names) {
    std::string section = prefix + "." + name;
    std::string type_name = section_type(doc, section);
    const StageType* t = find_stage_type(type_name);
    int line = doc.section_line(section);
    if (!t) {
      // Resolved against the common keys only, to locate the `type` key for the message.
      config::Section common = doc.resolve(section, common_stage_schema());
      throw common.error("type", "unknown stage type '" + type_name + "'; known types: " + join(known_types()));
    }
    config::Schema schema = common_stage_schema();
    schema.extend(t->options);
    config::Section sec = doc.resolve(section, schema);
    StageSpec s;
    s.name = name;
    s.type = type_name;
    s.inputs = sec.get_string_list("input");
    s.workers = static_cast<int>(sec.get_int_or_auto("workers").value_or(0));
    s.capacity = static_cast<int>(sec.get_int_or_auto("capacity").value_or(0));
    s.where = doc.file() + (line ? ":" + std::to_string(line) : std::string());
    s.resolved = std::move(sec);
    g.stages.push_back(std::move(s));
  }
  return g;
}

void resolve_graph(Runtime& rt, bool instantiate) {
  const GraphSpec& spec = rt.spec;
  const auto& specs = spec.stages;
  if (specs.empty()) throw config::ConfigError((spec.file.empty() ? "graph" : spec.file) + ": the graph has no stages");
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < specs.size(); ++i)
    if (!index.emplace(specs[i].name, i).second)
      throw config::ConfigError(where(spec, specs[i]) + " a stage named '" + specs[i].name + "' is defined twice");

  // Types, workers and inputs, stage by stage.
  std::vector<const StageType*> types(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const StageSpec& s = specs[i];
    types[i] = find_stage_type(s.type);
    if (!types[i])
      throw config::ConfigError(where(spec, s, "type") + " type: unknown stage type '" + s.type + "'; known types: " +
                                join(known_types()));
    const StageType& t = *types[i];
    if (s.workers < 0)
      throw config::ConfigError(where(spec, s, "workers") + " workers: expected >= 1 or \"auto\", got " + std::to_string(s.workers));
    if (s.capacity < 0)
      throw config::ConfigError(where(spec, s, "capacity") + " capacity: expected >= 1 or \"auto\", got " +
                                std::to_string(s.capacity));
    if (t.max_workers > 0 && s.workers > t.max_workers)
      throw config::ConfigError(where(spec, s, "workers") + " workers: stage type " + t.name + " allows at most " +
                                std::to_string(t.max_workers) + (t.own_thread ? " (it owns a thread)" : "") + ", got " +
                                std::to_string(s.workers));
    if (t.input.none() && !s.inputs.empty())
      throw config::ConfigError(where(spec, s, "input") + " input: stage type " + t.name +
                                " is a source and takes no input, got " + join(s.inputs));
    if (!t.input.none() && s.inputs.empty())
      throw config::ConfigError(where(spec, s, "input") + " input: stage type " + t.name + " needs an input (a stage producing " +
                                t.input.name + ")");
    if (t.ordered && s.inputs.size() > 1)
      throw config::ConfigError(where(spec, s, "input") + " input: stage type " + t.name +
                                " needs ordered input, which a merge of several inputs cannot give; got " +
                                join(s.inputs));
    std::set<std::string> seen;
    for (const auto& in : s.inputs) {
      if (!index.count(in)) {
        std::vector<std::string> names;
        for (const auto& o : specs) names.push_back(o.name);
        throw config::ConfigError(where(spec, s, "input") + " input: no stage named '" + in + "'; stages: " + join(names));
      }
      if (!seen.insert(in).second) throw config::ConfigError(where(spec, s, "input") + " input: '" + in + "' is listed twice");
      if (in == s.name)
        throw config::ConfigError(where(spec, s, "input") + " input: the stage feeds itself (a cycle: " + in + " -> " + in + ")");
    }
  }
  for (size_t i = 0; i < specs.size(); ++i)
    for (const auto& in : specs[i].inputs)
      if (types[index[in]]->output.none())
        throw config::ConfigError(where(spec, specs[i], "input") + " input: '" + in + "' (type " + specs[index[in]].type +
                                  ") is a sink and produces nothing");

  // Cycles: depth-first search; the stages on a cycle are reported in data-flow order.
  std::vector<int> state(specs.size(), 0);  // 0 new, 1 on the stack, 2 done
  std::vector<size_t> stack, order;
  std::function<void(size_t)> visit = [&](size_t i) {
    state[i] = 1;
    stack.push_back(i);
    for (const auto& in : specs[i].inputs) {
      size_t j = index[in];
      if (state[j] == 1) {
        auto it = std::find(stack.begin(), stack.end(), j);
        std::vector<std::string> cyc;
        for (auto k = stack.end(); k != it;) cyc.push_back(specs[*--k].name);
        cyc.push_back(specs[i].name);
        throw config::ConfigError(where(spec, specs[j]) + " the graph has a cycle: " + join(cyc, " -> "));
      }
      if (state[j] == 0) visit(j);
    }
    stack.pop_back();
    state[i] = 2;
    order.push_back(i);  // after all its inputs: topological order
  };
  for (size_t i = 0; i < specs.size(); ++i)
    if (state[i] == 0) visit(i);

  // Stages in topological order, edges, and port types (`any` takes its input's type).
  std::vector<size_t> pos(specs.size());
  for (size_t k = 0; k < order.size(); ++k) pos[order[k]] = k;
  for (size_t k = 0; k < order.size(); ++k) {
    auto st = std::make_unique<StageRt>();
    st->index = k;
    st->spec = specs[order[k]];
    st->type = types[order[k]];
    const StageType& t = *st->type;
    st->kind = t.input.none() ? StageKind::source
               : t.own_thread ? StageKind::own_thread
               : t.timed      ? StageKind::timed
                              : StageKind::cpu;
    rt.stages.push_back(std::move(st));
  }
  for (auto& stp : rt.stages) {
    StageRt& st = *stp;
    for (const auto& in : st.spec.inputs) {
      StageRt& pr = *rt.stages[pos[index[in]]];
      if (static_cast<int>(pr.outputs.size()) >= kMaxOutputs)
        throw config::ConfigError(where(spec, pr.spec) + " feeds more than " + std::to_string(kMaxOutputs) +
                                  " stages (" + st.spec.name + " is one too many); put a stage in between");
      auto e = std::make_unique<EdgeRt>();
      e->producer = pr.index;
      e->consumer = st.index;
      e->out_index = static_cast<int>(pr.outputs.size());
      e->accepts = st.type->accepts;
      pr.outputs.push_back(e.get());
      st.inputs.push_back(e.get());
      rt.edges.push_back(std::move(e));
    }
    // Input type: every producer must match the declared input port (or each other for `any`).
    // Ports match by name (a name stands for one C++ type), so a graph of types that are only
    // declared here, their code not linked in, is checked as fully as one that can run.
    std::type_index in_type = typeid(void);
    std::string in_port;
    for (EdgeRt* e : st.inputs) {
      const StageRt& pr = *rt.stages[e->producer];
      if (pr.out_port == "any") continue;  // a pass-through fed by nothing typed yet
      if (!st.type->input.any() && pr.out_port != st.type->input.name)
        throw config::ConfigError(where(spec, st.spec, "input") + " input: stage '" + st.spec.name + "' (type " + st.type->name +
                                  ") takes port type '" + st.type->input.name + "', but its input '" + pr.spec.name +
                                  "' (type " + pr.type->name + ") produces '" + pr.out_port + "'" + set_type(pr.spec) +
                                  (spec.file.empty() ? std::string()
                                                     : "; a stage that no longer fits leaves the graph with --set stages." +
                                                           st.spec.name + "="));
      if (!in_port.empty() && pr.out_port != in_port)
        throw config::ConfigError(where(spec, st.spec, "input") + " input: the inputs of '" + st.spec.name +
                                  "' carry different types: '" + in_port + "' and '" + pr.out_port + "' (from '" +
                                  pr.spec.name + "')");
      in_type = pr.out_type;
      in_port = pr.out_port;
    }
    if (st.type->output.any()) {
      st.out_type = in_type;
      st.out_port = in_port.empty() ? "any" : in_port;
    } else if (!st.type->output.none()) {
      st.out_type = st.type->output.type;
      st.out_port = st.type->output.name;
    }
    st.checks_out_type = st.out_type != std::type_index(typeid(void));
  }

  // Options, workers and order keeping.
  rt.threads = rt.opts.threads > 0 ? rt.opts.threads : tbb::info::default_concurrency();
  // Workers: "auto" (0) starts at the arena's size. A CPU stage set to "auto", or any CPU stage
  // when the run autotunes, gets worker slots up to twice the cores (at least 4) so that the
  // autotuner can move its concurrency; the slots' bound holds the extra ones back.
  for (auto& stp : rt.stages) {
    StageRt& st = *stp;
    st.options = st.spec.resolved ? *st.spec.resolved : resolve_code_options(st.spec, *st.type, where(spec, st.spec));
    const int type_max = st.type->max_workers > 0 ? st.type->max_workers : 1 << 20;
    int w = std::min(st.spec.workers > 0 ? st.spec.workers : rt.threads, type_max);
    if (st.kind == StageKind::own_thread || st.is_source()) w = 1;
    st.start_workers = std::max(w, 1);
    st.tune_workers = st.kind == StageKind::cpu && type_max > 1 && (st.spec.workers == 0 || rt.opts.autotune);
    st.max_workers = st.tune_workers ? std::min(type_max, std::max({st.start_workers, 2 * rt.threads, 4})) : st.start_workers;
  }
  // A parallel stage whose output reaches an ordered stage keeps its input order (bundles and a
  // sequencer); so does any parallel stage between it and the ordered stage.
  std::vector<bool> feeds_ordered(rt.stages.size(), false);
  for (size_t k = rt.stages.size(); k-- > 0;)
    for (EdgeRt* e : rt.stages[k]->outputs)
      if (rt.stages[e->consumer]->type->ordered || feeds_ordered[e->consumer]) feeds_ordered[k] = true;
  // On a stop request a stage drops its queued inputs when its type says so (train: its cursor
  // is that of its last step), and so does a stage whose every output leads only to such
  // stages: what it would make is dropped anyway, and draining it could take long (a slow stage
  // in front of train, a reader whose documents make many windows each).
  for (size_t k = rt.stages.size(); k-- > 0;) {
    StageRt& st = *rt.stages[k];
    bool all_discard = !st.outputs.empty();
    for (EdgeRt* e : st.outputs) all_discard &= rt.stages[e->consumer]->discard_on_stop;
    st.discard_on_stop = st.type->on_stop == OnStop::discard || all_discard;
  }
  for (auto& stp : rt.stages) {
    StageRt& st = *stp;
    st.ordered_commit = feeds_ordered[st.index] && st.max_workers > 1 && !st.is_source();
    st.renumber_input = st.ordered_commit && st.inputs.size() > 1;
  }
  // Batches (several cheap items per message) go only to single-worker CPU stages: a parallel
  // or own-thread consumer takes items one by one. A source batches when all its consumers take
  // batches, at most half the smallest capacity (two batches fit) and 64 items.
  for (auto& e : rt.edges) {
    const StageRt& c = *rt.stages[e->consumer];
    e->batches = rt.opts.batch && c.kind == StageKind::cpu && c.max_workers == 1;
    // A filter's credit is taken when an item it wants is emitted, where the producer has a
    // thread of its own to wait on (edge.cpp).
    e->on_demand = e->accepts && rt.stages[e->producer]->kind == StageKind::own_thread;
  }
  for (auto& stp : rt.stages) {
    StageRt& st = *stp;
    if (!st.is_source() || st.outputs.empty()) continue;
    int cap = 128;
    bool all = true;
    for (EdgeRt* e : st.outputs) {
      const int c = rt.stages[e->consumer]->spec.capacity;
      cap = std::min(cap, c > 0 ? c : 8);
      all &= e->batches;
    }
    // A source with a thread of its own reads ahead, before its packets are admitted: one item each.
    st.batch_max = all && !st.type->own_thread ? std::max(1, cap / 2) : 1;
  }
  // Capacities: "auto" (0) starts at 8. A tuned edge may grow to 8 times its start (64 to
  // 1024), as the autotuner moves its bound.
  for (auto& e : rt.edges) {
    const StageSpec& c = rt.stages[e->consumer]->spec;
    e->tune_capacity = c.capacity == 0 || rt.opts.autotune;
    e->start_capacity = c.capacity > 0 ? c.capacity : 8;
    e->max_capacity = e->tune_capacity ? std::clamp(8 * e->start_capacity, 64, 1024) : e->start_capacity;
  }

  rt.tracing = rt.opts.stats && rt.opts.trace && !rt.opts.run_dir.empty();
  for (auto& stp : rt.stages) {
    StageRt& st = *stp;
    for (int w = 0; w < st.max_workers; ++w) {
      auto c = std::make_unique<SlotCounters>();
      c->trace_cap = rt.tracing ? rt.opts.trace_events_per_worker : 0;
      if (rt.tracing) c->trace.reserve(std::min<size_t>(c->trace_cap, 4096));
      st.counters.push_back(std::move(c));
    }
    for (int w = st.max_workers - 1; w >= 0; --w) st.free_slots.push_back(w);
  }
  for (auto& e : rt.edges) e->hist.assign(static_cast<size_t>(e->max_capacity) + 1, 0);

  // Instances last: a stage constructor may be expensive (tokenizer vocabulary, model weights).
  if (!instantiate) return;
  for (auto& stp : rt.stages) {
    StageRt& st = *stp;
    StageContext ctx{st.spec.name, st.type->name, st.max_workers, st.options, rt.opts.host};
    if (!st.type->factory)
      throw StageError(st.spec.name,
                       "building: stage type " + st.type->name +
                           " is declared in this program but its implementation is not linked in (the training "
                           "stages need LibTorch: `pipeline run` loads them)",
                       nullptr);
    try {
      st.stage = st.type->factory(ctx);
      st.pool = st.stage->resource_pool();
    } catch (const config::ConfigError&) {
      throw;
    } catch (const std::exception& e) {
      throw StageError(st.spec.name, std::string("building: ") + e.what(), std::current_exception());
    }
    if (st.pool && st.is_source())
      throw StageError(st.spec.name, "building: a source cannot be gated by a ResourcePool", nullptr);
  }
}

std::string graph_dot(const Runtime& rt) {
  std::ostringstream os;
  os << "digraph pipeline {\n  rankdir=LR;\n  node [shape=box, style=\"rounded,filled\", fillcolor=\"#eef3fb\", "
        "fontname=\"Helvetica\"];\n  edge [fontname=\"Helvetica\", fontsize=10];\n";
  for (const auto& p : rt.stages) {
    const StageRt& st = *p;
    os << "  \"" << st.spec.name << "\" [label=\"" << st.spec.name << "\\n" << st.type->name << "  x"
       << (st.spec.workers > 0 || st.kind == StageKind::own_thread || st.is_source() ? std::to_string(st.max_workers)
                                                                                        : "auto");
    if (st.kind == StageKind::own_thread) os << "\\n(own thread)";
    if (st.type->ordered) os << "\\n(ordered input)";
    os << "\"";
    if (st.kind == StageKind::own_thread) os << ", fillcolor=\"#fde2c8\"";
    if (st.is_source()) os << ", shape=invhouse";
    if (st.is_sink()) os << ", shape=house";
    os << "];\n";
  }
  for (const auto& e : rt.edges) {
    const StageRt& from = *rt.stages[e->producer];
    const StageRt& to = *rt.stages[e->consumer];
    os << "  \"" << from.spec.name << "\" -> \"" << to.spec.name << "\" [label=\""
       << (from.out_port.empty() ? "?" : from.out_port) << "\\ncap "
       << (to.spec.capacity > 0 ? std::to_string(to.spec.capacity) : std::string("auto")) << "\"];\n";
  }
  os << "}\n";
  return os.str();
}

namespace {

// "read (read_shards ×1, source)": a stage's name, type, workers and what sets it apart.
std::string text_label(const StageRt& st) {
  std::string out = st.spec.name + " (" + st.type->name + " ×" +
                    (st.spec.workers > 0 || st.kind == StageKind::own_thread || st.is_source()
                         ? std::to_string(st.max_workers)
                         : std::string("auto"));
  if (st.is_source()) out += ", source";
  if (st.kind == StageKind::own_thread) out += ", own thread";
  if (st.type->ordered) out += ", ordered input";
  if (st.is_sink()) out += ", sink";
  return out + ")";
}

std::string capacity_label(const StageRt& consumer) {
  return "cap " + (consumer.spec.capacity > 0 ? std::to_string(consumer.spec.capacity) : std::string("auto"));
}

}  // namespace

std::string graph_text(const Runtime& rt) {
  std::ostringstream os;
  std::vector<bool> shown(rt.stages.size(), false);
  // A chain goes straight down; a stage with several outputs branches, and a branch's stage is
  // drawn on the branch when it is a sink with no other input, further down otherwise.
  for (const auto& first : rt.stages) {
    if (shown[first->index]) continue;
    os << text_label(*first);
    if (!first->inputs.empty()) {
      os << "  input:";
      for (size_t i = 0; i < first->inputs.size(); ++i)
        os << (i ? ", " : " ") << rt.stages[first->inputs[i]->producer]->spec.name;
    }
    os << "\n";
    shown[first->index] = true;
    for (const StageRt* cur = first.get(); !cur->outputs.empty();) {
      const std::string port = cur->out_port.empty() ? "?" : cur->out_port;
      const StageRt& only = *rt.stages[cur->outputs[0]->consumer];
      if (cur->outputs.size() == 1 && only.inputs.size() == 1 && !shown[only.index]) {
        os << "  │ " << port << ", " << capacity_label(only) << "\n  ▼\n" << text_label(only) << "\n";
        shown[only.index] = true;
        cur = &only;
        continue;
      }
      os << "  │ " << port << "\n";
      size_t width = 0;
      for (const EdgeRt* e : cur->outputs) width = std::max(width, capacity_label(*rt.stages[e->consumer]).size());
      for (size_t i = 0; i < cur->outputs.size(); ++i) {
        const StageRt& c = *rt.stages[cur->outputs[i]->consumer];
        const std::string cap = capacity_label(c);
        os << "  " << (i + 1 == cur->outputs.size() ? "└" : "├") << "── " << cap << " ";
        for (size_t d = 0; d < 2 + width - cap.size(); ++d) os << "─";
        os << "▶ ";
        if (c.is_sink() && c.inputs.size() == 1 && !shown[c.index]) {
          os << text_label(c) << "\n";
          shown[c.index] = true;
        } else {
          os << c.spec.name << " (below)\n";
        }
      }
      break;
    }
  }
  return os.str();
}

}  // namespace pipeline::graph
