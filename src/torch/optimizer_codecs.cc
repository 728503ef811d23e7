#include "optimizer_codecs.h"

#include <sstream>

#include <c10/util/string_utils.h>
#include <fmt/format.h>
#include <torch/optim.h>

#include "adapter_tensors.h"
#include "cairn/error.h"

namespace cairn::libtorch_internal {
namespace {

namespace optim = torch::optim;
using nlohmann::json;

torch::Tensor scalar_i64(int64_t v) { return torch::full({}, v, torch::kInt64); }
torch::Tensor scalar_f64(double v) { return torch::full({}, v, torch::kFloat64); }

void add_optional(Fields& f, const std::string& name, const torch::Tensor& t) {
  if (t.defined()) f.emplace_back(name, t);
}

// An undefined item (LBFGS's `al` holds some) is counted but not stored.
template <typename List>
void add_list(Fields& f, const std::string& name, const List& list) {
  f.emplace_back(name + ".count", scalar_i64(static_cast<int64_t>(list.size())));
  for (size_t i = 0; i < list.size(); ++i) add_optional(f, name + "." + std::to_string(i), list[i]);
}

c10::optional<int64_t> optional_i64(const json& j) {
  if (j.is_null()) return c10::nullopt;
  return j.get<int64_t>();
}

// ---- options ----

json betas_json(const std::tuple<double, double>& b) { return {std::get<0>(b), std::get<1>(b)}; }
std::tuple<double, double> betas_of(const json& j) {
  return {j.at(0).get<double>(), j.at(1).get<double>()};
}

template <typename O>
const O& as(const optim::OptimizerOptions& o) {
  return static_cast<const O&>(o);
}
template <typename O>
O& as(optim::OptimizerOptions& o) {
  return static_cast<O&>(o);
}
template <typename S>
const S& as(const optim::OptimizerParamState& s) {
  return static_cast<const S&>(s);
}

// Adam and AdamW share their options and state layout.
template <typename Optimizer, typename Options, typename State>
OptimizerCodec adam_like(std::string_view type) {
  return {type,
          [](const optim::Optimizer& o) { return dynamic_cast<const Optimizer*>(&o) != nullptr; },
          [](const optim::OptimizerOptions& base) {
            const auto& o = as<Options>(base);
            return json{{"lr", o.lr()},
                        {"betas", betas_json(o.betas())},
                        {"eps", o.eps()},
                        {"weight_decay", o.weight_decay()},
                        {"amsgrad", o.amsgrad()}};
          },
          [](optim::OptimizerOptions& base, const json& j) {
            auto& o = as<Options>(base);
            o.lr(j.at("lr").get<double>());
            o.betas(betas_of(j.at("betas")));
            o.eps(j.at("eps").get<double>());
            o.weight_decay(j.at("weight_decay").get<double>());
            o.amsgrad(j.at("amsgrad").get<bool>());
          },
          [](const optim::OptimizerParamState& base) {
            const auto& s = as<State>(base);
            Fields f{{"step", scalar_i64(s.step())},
                     {"exp_avg", s.exp_avg()},
                     {"exp_avg_sq", s.exp_avg_sq()}};
            add_optional(f, "max_exp_avg_sq", s.max_exp_avg_sq());
            return f;
          },
          [](FieldReader& r) -> std::unique_ptr<optim::OptimizerParamState> {
            auto s = std::make_unique<State>();
            s->step(r.i64("step"));
            s->exp_avg(r.like_param("exp_avg"));
            s->exp_avg_sq(r.like_param("exp_avg_sq"));
            s->max_exp_avg_sq(r.optional_like_param("max_exp_avg_sq"));
            return s;
          }};
}

const OptimizerCodec kCodecs[] = {
    {"SGD",
     [](const optim::Optimizer& o) { return dynamic_cast<const optim::SGD*>(&o) != nullptr; },
     [](const optim::OptimizerOptions& base) {
       const auto& o = as<optim::SGDOptions>(base);
       return json{{"lr", o.lr()},
                   {"momentum", o.momentum()},
                   {"dampening", o.dampening()},
                   {"weight_decay", o.weight_decay()},
                   {"nesterov", o.nesterov()}};
     },
     [](optim::OptimizerOptions& base, const json& j) {
       auto& o = as<optim::SGDOptions>(base);
       o.lr(j.at("lr").get<double>());
       o.momentum(j.at("momentum").get<double>());
       o.dampening(j.at("dampening").get<double>());
       o.weight_decay(j.at("weight_decay").get<double>());
       o.nesterov(j.at("nesterov").get<bool>());
     },
     [](const optim::OptimizerParamState& base) {
       Fields f;
       add_optional(f, "momentum_buffer", as<optim::SGDParamState>(base).momentum_buffer());
       return f;
     },
     [](FieldReader& r) -> std::unique_ptr<optim::OptimizerParamState> {
       auto s = std::make_unique<optim::SGDParamState>();
       s->momentum_buffer(r.optional_like_param("momentum_buffer"));
       return s;
     }},
    adam_like<optim::Adam, optim::AdamOptions, optim::AdamParamState>("Adam"),
    adam_like<optim::AdamW, optim::AdamWOptions, optim::AdamWParamState>("AdamW"),
    {"RMSprop",
     [](const optim::Optimizer& o) { return dynamic_cast<const optim::RMSprop*>(&o) != nullptr; },
     [](const optim::OptimizerOptions& base) {
       const auto& o = as<optim::RMSpropOptions>(base);
       return json{{"lr", o.lr()},
                   {"alpha", o.alpha()},
                   {"eps", o.eps()},
                   {"weight_decay", o.weight_decay()},
                   {"momentum", o.momentum()},
                   {"centered", o.centered()}};
     },
     [](optim::OptimizerOptions& base, const json& j) {
       auto& o = as<optim::RMSpropOptions>(base);
       o.lr(j.at("lr").get<double>());
       o.alpha(j.at("alpha").get<double>());
       o.eps(j.at("eps").get<double>());
       o.weight_decay(j.at("weight_decay").get<double>());
       o.momentum(j.at("momentum").get<double>());
       o.centered(j.at("centered").get<bool>());
     },
     [](const optim::OptimizerParamState& base) {
       const auto& s = as<optim::RMSpropParamState>(base);
       Fields f{{"step", scalar_i64(s.step())}, {"square_avg", s.square_avg()}};
       add_optional(f, "momentum_buffer", s.momentum_buffer());
       add_optional(f, "grad_avg", s.grad_avg());
       return f;
     },
     [](FieldReader& r) -> std::unique_ptr<optim::OptimizerParamState> {
       auto s = std::make_unique<optim::RMSpropParamState>();
       s->step(r.i64("step"));
       s->square_avg(r.like_param("square_avg"));
       s->momentum_buffer(r.optional_like_param("momentum_buffer"));
       s->grad_avg(r.optional_like_param("grad_avg"));
       return s;
     }},
    {"Adagrad",
     [](const optim::Optimizer& o) { return dynamic_cast<const optim::Adagrad*>(&o) != nullptr; },
     [](const optim::OptimizerOptions& base) {
       const auto& o = as<optim::AdagradOptions>(base);
       return json{{"lr", o.lr()},
                   {"lr_decay", o.lr_decay()},
                   {"weight_decay", o.weight_decay()},
                   {"initial_accumulator_value", o.initial_accumulator_value()},
                   {"eps", o.eps()}};
     },
     [](optim::OptimizerOptions& base, const json& j) {
       auto& o = as<optim::AdagradOptions>(base);
       o.lr(j.at("lr").get<double>());
       o.lr_decay(j.at("lr_decay").get<double>());
       o.weight_decay(j.at("weight_decay").get<double>());
       o.initial_accumulator_value(j.at("initial_accumulator_value").get<double>());
       o.eps(j.at("eps").get<double>());
     },
     [](const optim::OptimizerParamState& base) {
       const auto& s = as<optim::AdagradParamState>(base);
       return Fields{{"step", scalar_i64(s.step())}, {"sum", s.sum()}};
     },
     [](FieldReader& r) -> std::unique_ptr<optim::OptimizerParamState> {
       auto s = std::make_unique<optim::AdagradParamState>();
       s->step(r.i64("step"));
       s->sum(r.like_param("sum"));
       return s;
     }},
    {"LBFGS",
     [](const optim::Optimizer& o) { return dynamic_cast<const optim::LBFGS*>(&o) != nullptr; },
     [](const optim::OptimizerOptions& base) {
       const auto& o = as<optim::LBFGSOptions>(base);
       return json{{"lr", o.lr()},
                   {"max_iter", o.max_iter()},
                   {"max_eval", o.max_eval() ? json(*o.max_eval()) : json(nullptr)},
                   {"tolerance_grad", o.tolerance_grad()},
                   {"tolerance_change", o.tolerance_change()},
                   {"history_size", o.history_size()},
                   {"line_search_fn", o.line_search_fn() ? json(*o.line_search_fn()) : json()}};
     },
     [](optim::OptimizerOptions& base, const json& j) {
       auto& o = as<optim::LBFGSOptions>(base);
       o.lr(j.at("lr").get<double>());
       o.max_iter(j.at("max_iter").get<int64_t>());
       o.max_eval(optional_i64(j.at("max_eval")));
       o.tolerance_grad(j.at("tolerance_grad").get<double>());
       o.tolerance_change(j.at("tolerance_change").get<double>());
       o.history_size(j.at("history_size").get<int64_t>());
       const json& ls = j.at("line_search_fn");
       o.line_search_fn(ls.is_null() ? c10::optional<std::string>()
                                     : c10::optional<std::string>(ls.get<std::string>()));
     },
     [](const optim::OptimizerParamState& base) {
       const auto& s = as<optim::LBFGSParamState>(base);
       Fields f{{"func_evals", scalar_i64(s.func_evals())},
                {"n_iter", scalar_i64(s.n_iter())},
                {"t", scalar_f64(s.t())},
                {"prev_loss", scalar_f64(s.prev_loss())}};
       add_optional(f, "d", s.d());
       add_optional(f, "H_diag", s.H_diag());
       add_optional(f, "prev_flat_grad", s.prev_flat_grad());
       add_list(f, "old_dirs", s.old_dirs());
       add_list(f, "old_stps", s.old_stps());
       add_list(f, "ro", s.ro());
       if (s.al()) add_list(f, "al", *s.al());
       return f;
     },
     [](FieldReader& r) -> std::unique_ptr<optim::OptimizerParamState> {
       auto s = std::make_unique<optim::LBFGSParamState>();
       s->func_evals(r.i64("func_evals"));
       s->n_iter(r.i64("n_iter"));
       s->t(r.f64("t"));
       s->prev_loss(r.f64("prev_loss"));
       s->d(r.optional_tensor("d"));
       s->H_diag(r.optional_tensor("H_diag"));
       s->prev_flat_grad(r.optional_tensor("prev_flat_grad"));
       s->old_dirs(r.list("old_dirs"));
       s->old_stps(r.list("old_stps"));
       s->ro(r.list("ro"));
       auto al = r.optional_list("al");
       s->al(al ? c10::optional<std::vector<torch::Tensor>>(std::move(*al)) : c10::nullopt);
       return s;
     }},
};

}  // namespace

FieldReader::FieldReader(std::map<std::string, torch::Tensor> fields, std::string where,
                         torch::Tensor param, bool on_param_device)
    : fields_(std::move(fields)),
      where_(std::move(where)),
      param_(std::move(param)),
      on_param_device_(on_param_device) {}

torch::Tensor FieldReader::placed(torch::Tensor t) const {
  if (on_param_device_ && t.defined() && t.device() != param_.device())
    return t.to(param_.device());
  return t;
}

void FieldReader::fail(const std::string& field, const std::string& why) const {
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("optimizer state {}: {}", join(where_, field), why));
}

torch::Tensor FieldReader::take(const std::string& field, bool required) {
  auto it = fields_.find(field);
  if (it == fields_.end()) {
    if (required) fail(field, "is missing from the file");
    return {};
  }
  torch::Tensor t = std::move(it->second);
  fields_.erase(it);
  return t;
}

torch::Tensor FieldReader::like_param(const std::string& field) {
  torch::Tensor t = take(field, true);
  if (t.scalar_type() != param_.scalar_type() || t.sizes() != param_.sizes()) {
    fail(field, fmt::format("is {} in the file but {} here",
                            shape_str(*to_cairn(t.scalar_type()), shape_of(t)),
                            shape_str(*to_cairn(param_.scalar_type()), shape_of(param_))));
  }
  return placed(std::move(t));
}

torch::Tensor FieldReader::optional_like_param(const std::string& field) {
  return fields_.count(field) ? like_param(field) : torch::Tensor();
}

torch::Tensor FieldReader::optional_tensor(const std::string& field) {
  torch::Tensor t = take(field, false);
  if (t.defined() && t.scalar_type() != param_.scalar_type()) {
    fail(field, fmt::format("is {} in the file but the parameter is {}",
                            dtype_name(*to_cairn(t.scalar_type())),
                            dtype_name(*to_cairn(param_.scalar_type()))));
  }
  return placed(std::move(t));
}

int64_t FieldReader::i64(const std::string& field) {
  torch::Tensor t = take(field, true);
  if (t.scalar_type() != torch::kInt64 || t.dim() != 0) fail(field, "is not an I64 scalar");
  return t.item<int64_t>();
}

double FieldReader::f64(const std::string& field) {
  torch::Tensor t = take(field, true);
  if (t.scalar_type() != torch::kFloat64 || t.dim() != 0) fail(field, "is not an F64 scalar");
  return t.item<double>();
}

std::deque<torch::Tensor> FieldReader::list(const std::string& field) {
  const int64_t n = i64(field + ".count");
  constexpr int64_t kMaxItems = int64_t{1} << 20;  // far above any history_size in use
  if (n < 0 || n > kMaxItems) fail(field, fmt::format("claims {} items", n));
  std::deque<torch::Tensor> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(optional_tensor(field + "." + std::to_string(i)));
  return out;
}

std::optional<std::vector<torch::Tensor>> FieldReader::optional_list(const std::string& field) {
  if (!fields_.count(field + ".count")) return std::nullopt;
  std::deque<torch::Tensor> items = list(field);
  return std::vector<torch::Tensor>(items.begin(), items.end());
}

void FieldReader::finish() {
  if (fields_.empty()) return;
  std::string names;
  for (const auto& [name, t] : fields_) names += (names.empty() ? "" : ", ") + join(where_, name);
  throw Error(
      ErrorCode::kInvalidArgument,
      fmt::format("optimizer state: {} in the file but not part of this optimizer's state", names));
}

const OptimizerCodec& codec_of(const torch::optim::Optimizer& optimizer) {
  for (const OptimizerCodec& c : kCodecs) {
    if (c.is(optimizer)) return c;
  }
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("optimizer of type {} is not supported (SGD, Adam, AdamW, RMSprop, "
                          "Adagrad and LBFGS are)",
                          c10::demangle(typeid(optimizer).name())));
}

const OptimizerCodec* codec_named(std::string_view type) {
  for (const OptimizerCodec& c : kCodecs) {
    if (c.type == type) return &c;
  }
  return nullptr;
}

namespace {
// LibTorch 1.x keys an optimizer's state by the printed address of the
// parameter's TensorImpl, 2.x by the address itself.
template <class Key>
Key key_of(void* impl);
template <>
[[maybe_unused]] std::string key_of<std::string>(void* impl) {
  std::ostringstream o;
  o << impl;
  return o.str();
}
template <>
[[maybe_unused]] void* key_of<void*>(void* impl) {
  return impl;
}
}  // namespace

StateKey state_key(const torch::Tensor& param) {
  return key_of<StateKey>(static_cast<void*>(param.unsafeGetTensorImpl()));
}

}  // namespace cairn::libtorch_internal
