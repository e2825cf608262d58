// Evaluation of statements and expressions with Jinja2 semantics: for-loops get a fresh scope per
// iteration, `set` writes to the innermost scope, macros see the scope they were defined in.
#include "chat/jinja_interpreter.h"

#include <algorithm>

#include "base/checked_math.h"

namespace dh::chat::jinja {

Interpreter::Interpreter(std::shared_ptr<const Template> tmpl, const RenderLimits& limits)
    : tmpl_(std::move(tmpl)), limits_(limits) {
  InstallGlobals();
}

Result<std::string> Interpreter::Run(const Value& context) {
  auto root = std::make_shared<Scope>();
  if (context.is_dict()) {
    for (const auto& [k, v] : context.dict().items()) root->vars[k] = v;
  }
  std::string out;
  DH_ASSIGN_OR_RETURN(Flow flow, ExecBody(tmpl_->body, root, out));
  (void)flow;
  return out;
}

Result<std::string> Render(const std::shared_ptr<const Template>& tmpl, const Value& context,
                           const RenderLimits& limits) {
  Interpreter interpreter(tmpl, limits);
  return interpreter.Run(context);
}

Status Interpreter::Step(int64_t n) {
  steps_ += n;
  if (steps_ > limits_.max_steps) {
    return ResourceExhausted("template exceeded its budget of {} evaluation steps",
                             limits_.max_steps);
  }
  return Status::Ok();
}

Status Interpreter::CheckSize(size_t bytes) const {
  if (bytes > limits_.max_string_bytes) {
    return ResourceExhausted("template built a string of {} bytes, over the limit of {}", bytes,
                             limits_.max_string_bytes);
  }
  return Status::Ok();
}

Status Interpreter::AtPos(int line, int column, Status s) const {
  if (s.ok() || s.message().rfind("template line ", 0) == 0) return s;
  return Status(s.code(),
                fmt::format("template line {}, column {}: {}", line, column, s.message()));
}

Status Interpreter::Err(const Expr& e, std::string_view what) const {
  return InvalidArgument("template line {}, column {}: {}", e.line, e.column, what);
}

Status Interpreter::Append(std::string& out, std::string_view text) {
  DH_RETURN_IF_ERROR(CheckSize(out.size() + text.size()));
  DH_RETURN_IF_ERROR(Step(static_cast<int64_t>(text.size() >> 10)));
  out.append(text);
  return Status::Ok();
}

Result<std::string> Interpreter::RenderToString(const Body& body, const ScopePtr& scope) {
  std::string out;
  DH_ASSIGN_OR_RETURN(Flow flow, ExecBody(body, scope, out));
  (void)flow;
  return out;
}

Result<Interpreter::Flow> Interpreter::ExecBody(const Body& body, const ScopePtr& scope,
                                                std::string& out) {
  for (const StmtPtr& s : body) {
    DH_ASSIGN_OR_RETURN(Flow flow, ExecStmt(*s, scope, out));
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

Result<Interpreter::Flow> Interpreter::ExecStmt(const Stmt& s, const ScopePtr& scope,
                                                std::string& out) {
  DepthGuard guard(depth_);
  if (depth_ > limits_.max_depth) {
    return AtPos(s.line, s.column,
                 ResourceExhausted("template nesting deeper than {} levels", limits_.max_depth));
  }
  DH_RETURN_IF_ERROR(Step());
  switch (s.kind) {
    case Stmt::Kind::kText:
      DH_RETURN_IF_ERROR(Append(out, s.text));
      break;
    case Stmt::Kind::kOutput: {
      DH_ASSIGN_OR_RETURN(Value v, Eval(*s.expr, scope));
      auto text = ToStr(v);
      if (!text.ok()) return AtPos(s.line, s.column, text.status());
      DH_RETURN_IF_ERROR(Append(out, *text));
      break;
    }
    case Stmt::Kind::kIf: {
      for (size_t i = 0; i < s.conds.size(); ++i) {
        DH_ASSIGN_OR_RETURN(Value c, Eval(*s.conds[i], scope));
        if (c.Truthy()) return ExecBody(s.bodies[i], scope, out);
      }
      return ExecBody(s.else_body, scope, out);
    }
    case Stmt::Kind::kFor:
      return ExecFor(s, scope, out);
    case Stmt::Kind::kSet:
      DH_RETURN_IF_ERROR(ExecSet(s, scope));
      break;
    case Stmt::Kind::kSetBlock: {
      DH_ASSIGN_OR_RETURN(std::string text, RenderToString(s.body, scope));
      Value v = Value::String(std::move(text));
      if (s.expr) {
        DH_ASSIGN_OR_RETURN(v, ApplyFilterChain(*s.expr, std::move(v), scope));
      }
      scope->vars[s.targets[0]] = std::move(v);
      break;
    }
    case Stmt::Kind::kMacro:
      scope->vars[s.name] = MakeMacro(s, scope);
      break;
    case Stmt::Kind::kCallBlock: {
      const Stmt* block = &s;
      ScopePtr call_scope = scope;
      Value caller =
          Value::Function("caller", [this, block, call_scope](CallArgs& args) -> Result<Value> {
            auto inner = std::make_shared<Scope>();
            inner->parent = call_scope;
            for (size_t i = 0; i < block->params.size(); ++i) {
              if (i < args.positional.size()) {
                inner->vars[block->params[i].name] = args.positional[i];
              } else if (block->params[i].default_value) {
                DH_ASSIGN_OR_RETURN(inner->vars[block->params[i].name],
                                    Eval(*block->params[i].default_value, inner));
              }
            }
            DH_ASSIGN_OR_RETURN(std::string text, RenderToString(block->body, inner));
            return Value::String(std::move(text));
          });
      DH_ASSIGN_OR_RETURN(Value v, EvalCall(*s.expr, scope, &caller));
      DH_ASSIGN_OR_RETURN(std::string text, ToStr(v));
      DH_RETURN_IF_ERROR(Append(out, text));
      break;
    }
    case Stmt::Kind::kFilterBlock: {
      DH_ASSIGN_OR_RETURN(std::string text, RenderToString(s.body, scope));
      DH_ASSIGN_OR_RETURN(Value v,
                          ApplyFilterChain(*s.expr, Value::String(std::move(text)), scope));
      DH_ASSIGN_OR_RETURN(std::string filtered, ToStr(v));
      DH_RETURN_IF_ERROR(Append(out, filtered));
      break;
    }
    case Stmt::Kind::kBreak:
      return Flow::kBreak;
    case Stmt::Kind::kContinue:
      return Flow::kContinue;
    case Stmt::Kind::kScope:
      return ExecBody(s.body, scope, out);
  }
  return Flow::kNormal;
}

Result<ValueList> Interpreter::Iterate(const Value& v) {
  // Charged before materializing: a 4 MiB string would become 4M one-character values.
  if (v.is_string()) DH_RETURN_IF_ERROR(Step(static_cast<int64_t>(v.str().size())));
  if (v.is_list()) DH_RETURN_IF_ERROR(Step(static_cast<int64_t>(v.list().size() >> 4)));
  if (v.is_dict()) DH_RETURN_IF_ERROR(Step(static_cast<int64_t>(v.dict().size())));
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return ValueList{};
    case Value::Kind::kList:
      return v.list();
    case Value::Kind::kDict: {
      ValueList keys;
      for (const auto& kv : v.dict().items()) keys.push_back(Value::String(kv.first));
      return keys;
    }
    case Value::Kind::kString: {
      ValueList chars;
      for (std::string_view c : SplitCodePoints(v.str()))
        chars.push_back(Value::String(std::string(c)));
      return chars;
    }
    default:
      return InvalidArgument("{} is not iterable", v.TypeName());
  }
}

namespace {

Status BindTargets(const std::vector<std::string>& targets, const Value& item,
                   std::unordered_map<std::string, Value>& vars) {
  if (targets.size() == 1) {
    vars[targets[0]] = item;
    return Status::Ok();
  }
  if (!item.is_list() || item.list().size() != targets.size()) {
    return InvalidArgument("cannot unpack {} into {} names", item.TypeName(), targets.size());
  }
  for (size_t i = 0; i < targets.size(); ++i) vars[targets[i]] = item.list()[i];
  return Status::Ok();
}

}  // namespace

Result<Interpreter::Flow> Interpreter::ExecFor(const Stmt& s, const ScopePtr& scope,
                                               std::string& out) {
  DH_ASSIGN_OR_RETURN(Value iterable, Eval(*s.expr, scope));
  auto all = Iterate(iterable);
  if (!all.ok()) return AtPos(s.line, s.column, all.status());
  ValueList items;
  if (s.cond) {
    for (Value& item : *all) {
      DH_RETURN_IF_ERROR(Step());
      auto probe = std::make_shared<Scope>();
      probe->parent = scope;
      DH_RETURN_IF_ERROR(AtPos(s.line, s.column, BindTargets(s.targets, item, probe->vars)));
      DH_ASSIGN_OR_RETURN(Value keep, Eval(*s.cond, probe));
      if (keep.Truthy()) items.push_back(std::move(item));
    }
  } else {
    items = std::move(all).value();
  }
  if (items.empty()) return ExecBody(s.else_body, scope, out);
  const int64_t n = static_cast<int64_t>(items.size());
  // One loop object per loop, advanced in place (as Jinja's LoopContext is).
  auto index = std::make_shared<int64_t>(0);
  Value loop = Value::Dict();
  ValueDict& d = loop.dict();
  d.Set("length", Value::Int(n));
  d.Set("depth", Value::Int(1));
  d.Set("depth0", Value::Int(0));
  d.Set("cycle", Value::Function("loop.cycle", [index](CallArgs& args) -> Result<Value> {
          if (args.positional.empty()) return InvalidArgument("loop.cycle() needs arguments");
          return args.positional[static_cast<size_t>(*index) % args.positional.size()];
        }));
  for (int64_t i = 0; i < n; ++i) {
    DH_RETURN_IF_ERROR(Step());
    *index = i;
    auto inner = std::make_shared<Scope>();
    inner->parent = scope;
    DH_RETURN_IF_ERROR(AtPos(s.line, s.column, BindTargets(s.targets, items[i], inner->vars)));
    d.Set("index", Value::Int(i + 1));
    d.Set("index0", Value::Int(i));
    d.Set("revindex", Value::Int(n - i));
    d.Set("revindex0", Value::Int(n - i - 1));
    d.Set("first", Value::Bool(i == 0));
    d.Set("last", Value::Bool(i == n - 1));
    d.Set("previtem", i > 0 ? items[i - 1] : Value::Undefined("loop.previtem"));
    d.Set("nextitem", i + 1 < n ? items[i + 1] : Value::Undefined("loop.nextitem"));
    inner->vars.emplace("loop", loop);
    DH_ASSIGN_OR_RETURN(Flow flow, ExecBody(s.body, inner, out));
    if (flow == Flow::kBreak) break;
  }
  return Flow::kNormal;
}

Status Interpreter::ExecSet(const Stmt& s, const ScopePtr& scope) {
  DH_ASSIGN_OR_RETURN(Value v, Eval(*s.expr, scope));
  if (!s.attr.empty()) {
    Value target = Lookup(s.targets[0], scope);
    if (!target.is_dict() || !target.dict().is_namespace) {
      return AtPos(s.line, s.column,
                   InvalidArgument("cannot assign attribute '{}' of '{}': not a namespace()",
                                   s.attr, s.targets[0]));
    }
    auto copy = DeepCopy(v);
    if (!copy.ok()) return AtPos(s.line, s.column, copy.status());
    target.dict().Set(s.attr, std::move(copy).value());
    return Status::Ok();
  }
  return AtPos(s.line, s.column, BindTargets(s.targets, v, scope->vars));
}

Value Interpreter::Lookup(const std::string& name, const ScopePtr& scope) const {
  for (const Scope* sc = scope.get(); sc; sc = sc->parent.get()) {
    auto it = sc->vars.find(name);
    if (it != sc->vars.end()) return it->second;
  }
  auto g = globals_.find(name);
  if (g != globals_.end()) return g->second;
  return Value::Undefined(name);
}

Value Interpreter::MakeMacro(const Stmt& s, const ScopePtr& scope) {
  const Stmt* macro = &s;
  std::weak_ptr<Scope> weak = scope;  // the defining scope owns the macro: avoid a cycle
  return Value::Function(s.name, [this, macro, weak](CallArgs& args) -> Result<Value> {
    ScopePtr def_scope = weak.lock();
    if (!def_scope) return Internal("macro '{}' called after its scope ended", macro->name);
    return CallMacro(*macro, def_scope, args);
  });
}

Result<Value> Interpreter::CallMacro(const Stmt& s, const ScopePtr& def_scope, CallArgs& args) {
  if (macro_depth_ >= limits_.max_macro_depth) {
    return AtPos(s.line, s.column,
                 ResourceExhausted("macro calls nested deeper than {} levels (recursion?)",
                                   limits_.max_macro_depth));
  }
  if (args.positional.size() > s.params.size()) {
    return InvalidArgument("macro '{}' takes {} arguments, got {}", s.name, s.params.size(),
                           args.positional.size());
  }
  auto inner = std::make_shared<Scope>();
  inner->parent = def_scope;
  for (size_t i = 0; i < args.positional.size(); ++i)
    inner->vars[s.params[i].name] = args.positional[i];
  for (auto& keyword : args.keyword) {
    // Named references, not a structured binding: clang 14 cannot capture bindings in lambdas.
    const std::string& key = keyword.first;
    Value& value = keyword.second;
    if (key == "caller") {
      inner->vars["caller"] = value;
      continue;
    }
    auto it = std::find_if(s.params.begin(), s.params.end(),
                           [&](const MacroParam& p) { return p.name == key; });
    if (it == s.params.end()) {
      return InvalidArgument("macro '{}' has no parameter '{}'", s.name, key);
    }
    inner->vars[key] = value;
  }
  for (const MacroParam& p : s.params) {
    if (inner->vars.count(p.name)) continue;
    if (p.default_value) {
      DH_ASSIGN_OR_RETURN(inner->vars[p.name], Eval(*p.default_value, inner));
    } else {
      inner->vars[p.name] = Value::Undefined(p.name);
    }
  }
  ++macro_depth_;
  auto text = RenderToString(s.body, inner);
  --macro_depth_;
  if (!text.ok()) return text.status();
  return Value::String(std::move(text).value());
}

Status Interpreter::EvalArgs(const Expr& e, size_t first, const ScopePtr& scope, CallArgs& args) {
  for (size_t i = first; i < e.children.size(); ++i) {
    DH_ASSIGN_OR_RETURN(Value v, Eval(*e.children[i], scope));
    args.positional.push_back(std::move(v));
  }
  for (const auto& [key, expr] : e.keyword) {
    DH_ASSIGN_OR_RETURN(Value v, Eval(*expr, scope));
    args.keyword.emplace_back(key, std::move(v));
  }
  return Status::Ok();
}

Result<Value> Interpreter::CallValue(const Value& f, CallArgs& args) {
  if (!f.is_callable()) {
    if (f.is_undefined()) return InvalidArgument("'{}' is undefined", f.undefined_name());
    return InvalidArgument("{} is not callable", f.TypeName());
  }
  return f.callable().fn(args);
}

Result<Value> Interpreter::EvalCall(const Expr& e, const ScopePtr& scope, const Value* caller) {
  CallArgs args;
  const Expr& callee = *e.children[0];
  Value result;
  if (callee.kind == Expr::Kind::kAttr) {
    DH_ASSIGN_OR_RETURN(Value obj, Eval(*callee.children[0], scope));
    DH_RETURN_IF_ERROR(EvalArgs(e, 1, scope, args));
    if (caller) args.keyword.emplace_back("caller", *caller);
    if (HasMethod(obj, callee.name)) {
      auto r = CallMethod(obj, callee.name, args);
      if (!r.ok()) return AtPos(e.line, e.column, r.status());
      return r;
    }
    auto f = GetAttr(obj, callee.name);
    if (!f.ok()) return AtPos(e.line, e.column, f.status());
    auto r = CallValue(*f, args);
    if (!r.ok()) return AtPos(e.line, e.column, r.status());
    return r;
  }
  DH_ASSIGN_OR_RETURN(Value f, Eval(callee, scope));
  DH_RETURN_IF_ERROR(EvalArgs(e, 1, scope, args));
  if (caller) args.keyword.emplace_back("caller", *caller);
  auto r = CallValue(f, args);
  if (!r.ok()) return AtPos(e.line, e.column, r.status());
  return r;
}

Result<Value> Interpreter::ApplyFilterChain(const Expr& e, Value input, const ScopePtr& scope) {
  if (e.children[0]) {
    DH_ASSIGN_OR_RETURN(input, ApplyFilterChain(*e.children[0], std::move(input), scope));
  }
  CallArgs args;
  DH_RETURN_IF_ERROR(EvalArgs(e, 1, scope, args));
  auto r = CallFilter(e.name, input, args, scope);
  if (!r.ok()) return AtPos(e.line, e.column, r.status());
  return r;
}

Result<Value> Interpreter::GetAttr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) return InvalidArgument("'{}' is undefined", obj.undefined_name());
  if (obj.is_dict()) {
    if (const Value* v = obj.dict().Find(name)) return *v;
  }
  if (HasMethod(obj, name)) {
    Value self = obj;
    return Value::Function(
        name, [this, self, name](CallArgs& args) { return CallMethod(self, name, args); });
  }
  return Value::Undefined(name);
}

Result<Value> Interpreter::GetItem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) return InvalidArgument("'{}' is undefined", obj.undefined_name());
  if (obj.is_dict()) {
    if (key.is_string()) {
      if (const Value* v = obj.dict().Find(key.str())) return *v;
      return Value::Undefined(key.str());
    }
    return Value::Undefined("item");
  }
  if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.is_bool() ? key.bool_value() : key.int_value();
    if (obj.is_list()) {
      int64_t n = static_cast<int64_t>(obj.list().size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::Undefined("item");
      return obj.list()[static_cast<size_t>(i)];
    }
    // Indexing splits the whole string into code points: charge 1 step per 16 bytes.
    DH_RETURN_IF_ERROR(Step(static_cast<int64_t>(obj.str().size() >> 4)));
    auto chars = SplitCodePoints(obj.str());
    int64_t n = static_cast<int64_t>(chars.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::Undefined("item");
    return Value::String(std::string(chars[static_cast<size_t>(i)]));
  }
  if (key.is_string()) return GetAttr(obj, key.str());
  return Value::Undefined("item");
}

Result<Value> Interpreter::Slice(const Value& obj, const Value& start_v, const Value& stop_v,
                                 const Value& step_v) {
  auto as_index = [](const Value& v, const char* what) -> Result<std::optional<int64_t>> {
    if (v.is_undefined() || v.is_none()) return std::optional<int64_t>();
    if (v.is_int()) return std::optional<int64_t>(v.int_value());
    if (v.is_bool()) return std::optional<int64_t>(v.bool_value());
    return InvalidArgument("slice {} must be an integer, got {}", what, v.TypeName());
  };
  DH_ASSIGN_OR_RETURN(auto start, as_index(start_v, "start"));
  DH_ASSIGN_OR_RETURN(auto stop, as_index(stop_v, "stop"));
  DH_ASSIGN_OR_RETURN(auto step_opt, as_index(step_v, "step"));
  int64_t step = step_opt.value_or(1);
  if (step == 0) return InvalidArgument("slice step cannot be zero");
  std::vector<std::string_view> chars;
  int64_t n;
  if (obj.is_list()) {
    n = static_cast<int64_t>(obj.list().size());
  } else if (obj.is_string()) {
    DH_RETURN_IF_ERROR(Step(static_cast<int64_t>(obj.str().size() >> 4)));
    chars = SplitCodePoints(obj.str());
    n = static_cast<int64_t>(chars.size());
  } else {
    return InvalidArgument("cannot slice {}", obj.TypeName());
  }
  // Python's slice.indices().
  auto clamp = [&](std::optional<int64_t> v, int64_t def) {
    if (!v) return def;
    int64_t x = *v;
    if (x < 0) x += n;
    if (step > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  int64_t lo = clamp(start, step > 0 ? 0 : n - 1);
  int64_t hi = clamp(stop, step > 0 ? n : -1);
  ValueList items;
  std::string s;
  for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step) {
    if (obj.is_list())
      items.push_back(obj.list()[static_cast<size_t>(i)]);
    else
      s.append(chars[static_cast<size_t>(i)]);
  }
  DH_RETURN_IF_ERROR(Step(static_cast<int64_t>(items.size() + (s.size() >> 10))));
  if (obj.is_list()) return Value::List(std::move(items));
  return Value::String(std::move(s));
}

Result<Value> Interpreter::Eval(const Expr& e, const ScopePtr& scope) {
  DepthGuard guard(depth_);
  if (depth_ > limits_.max_depth) {
    return Err(e, fmt::format("template nesting deeper than {} levels", limits_.max_depth));
  }
  DH_RETURN_IF_ERROR(Step());
  switch (e.kind) {
    case Expr::Kind::kLiteral:
      return e.literal;
    case Expr::Kind::kName:
      return Lookup(e.name, scope);
    case Expr::Kind::kList:
    case Expr::Kind::kTuple: {
      ValueList items;
      for (const ExprPtr& c : e.children) {
        DH_ASSIGN_OR_RETURN(Value v, Eval(*c, scope));
        items.push_back(std::move(v));
      }
      return Value::List(std::move(items));
    }
    case Expr::Kind::kDict: {
      Value d = Value::Dict();
      for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
        DH_ASSIGN_OR_RETURN(Value k, Eval(*e.children[i], scope));
        if (!k.is_string()) return Err(*e.children[i], "dict keys must be strings");
        DH_ASSIGN_OR_RETURN(Value v, Eval(*e.children[i + 1], scope));
        d.dict().Set(k.str(), std::move(v));
      }
      return d;
    }
    case Expr::Kind::kAttr: {
      DH_ASSIGN_OR_RETURN(Value obj, Eval(*e.children[0], scope));
      auto r = GetAttr(obj, e.name);
      if (!r.ok()) return AtPos(e.line, e.column, r.status());
      return r;
    }
    case Expr::Kind::kItem: {
      DH_ASSIGN_OR_RETURN(Value obj, Eval(*e.children[0], scope));
      DH_ASSIGN_OR_RETURN(Value key, Eval(*e.children[1], scope));
      auto r = GetItem(obj, key);
      if (!r.ok()) return AtPos(e.line, e.column, r.status());
      return r;
    }
    case Expr::Kind::kSlice: {
      DH_ASSIGN_OR_RETURN(Value obj, Eval(*e.children[0], scope));
      Value parts[3];
      for (int i = 0; i < 3; ++i) {
        if (e.children[1 + i]) {
          DH_ASSIGN_OR_RETURN(parts[i], Eval(*e.children[1 + i], scope));
        }
      }
      auto r = Slice(obj, parts[0], parts[1], parts[2]);
      if (!r.ok()) return AtPos(e.line, e.column, r.status());
      return r;
    }
    case Expr::Kind::kCall:
      return EvalCall(e, scope, nullptr);
    case Expr::Kind::kFilter: {
      DH_ASSIGN_OR_RETURN(Value v, Eval(*e.children[0], scope));
      CallArgs args;
      DH_RETURN_IF_ERROR(EvalArgs(e, 1, scope, args));
      auto r = CallFilter(e.name, v, args, scope);
      if (!r.ok()) return AtPos(e.line, e.column, r.status());
      return r;
    }
    case Expr::Kind::kTest: {
      DH_ASSIGN_OR_RETURN(Value v, Eval(*e.children[0], scope));
      CallArgs args;
      DH_RETURN_IF_ERROR(EvalArgs(e, 1, scope, args));
      auto r = CallTest(e.name, v, args);
      if (!r.ok()) return AtPos(e.line, e.column, r.status());
      return Value::Bool(*r != e.negated);
    }
    case Expr::Kind::kUnary: {
      DH_ASSIGN_OR_RETURN(Value v, Eval(*e.children[0], scope));
      if (e.name == "not") return Value::Bool(!v.Truthy());
      if (!v.is_number()) {
        return Err(e, fmt::format("bad operand type for unary {}: {}", e.name, v.TypeName()));
      }
      if (e.name == "+") return v.is_bool() ? Value::Int(v.bool_value()) : v;
      if (v.is_float()) return Value::Float(-v.float_value());
      int64_t x = v.is_bool() ? v.bool_value() : v.int_value();
      if (x == INT64_MIN) return Err(e, "integer overflow");
      return Value::Int(-x);
    }
    case Expr::Kind::kBinary:
      return EvalBinary(e, scope);
    case Expr::Kind::kCompare:
      return EvalCompare(e, scope);
    case Expr::Kind::kCond: {
      DH_ASSIGN_OR_RETURN(Value c, Eval(*e.children[0], scope));
      if (c.Truthy()) return Eval(*e.children[1], scope);
      if (e.children[2]) return Eval(*e.children[2], scope);
      return Value::Undefined("conditional");
    }
  }
  return Err(e, "unknown expression");
}

Result<Value> Interpreter::EvalBinary(const Expr& e, const ScopePtr& scope) {
  DH_ASSIGN_OR_RETURN(Value l, Eval(*e.children[0], scope));
  if (e.name == "and") return l.Truthy() ? Eval(*e.children[1], scope) : Result<Value>(l);
  if (e.name == "or") return l.Truthy() ? Result<Value>(l) : Eval(*e.children[1], scope);
  DH_ASSIGN_OR_RETURN(Value r, Eval(*e.children[1], scope));
  auto v = Arith(e.name, l, r);
  if (!v.ok()) return AtPos(e.line, e.column, v.status());
  return v;
}

Result<Value> Interpreter::EvalCompare(const Expr& e, const ScopePtr& scope) {
  DH_ASSIGN_OR_RETURN(Value l, Eval(*e.children[0], scope));
  for (size_t i = 0; i < e.ops.size(); ++i) {
    DH_ASSIGN_OR_RETURN(Value r, Eval(*e.children[i + 1], scope));
    const std::string& op = e.ops[i];
    // Comparing or searching long strings and lists costs in proportion to their size.
    for (const Value* v : {&l, &r}) {
      if (v->is_string()) DH_RETURN_IF_ERROR(Step(static_cast<int64_t>(v->str().size() >> 10)));
      if (v->is_list()) DH_RETURN_IF_ERROR(Step(static_cast<int64_t>(v->list().size() >> 4)));
    }
    Result<bool> ok = false;
    if (op == "==")
      ok = ValuesEqual(l, r);
    else if (op == "!=")
      ok = !ValuesEqual(l, r);
    else if (op == "<")
      ok = ValueLess(l, r);
    else if (op == ">")
      ok = ValueLess(r, l);
    else if (op == "<=") {
      auto gt = ValueLess(r, l);
      ok = gt.ok() ? Result<bool>(!*gt) : gt;
    } else if (op == ">=") {
      auto lt = ValueLess(l, r);
      ok = lt.ok() ? Result<bool>(!*lt) : lt;
    } else if (op == "in")
      ok = Contains(r, l);
    else if (op == "not in") {
      auto in = Contains(r, l);
      ok = in.ok() ? Result<bool>(!*in) : in;
    }
    if (!ok.ok()) return AtPos(e.line, e.column, ok.status());
    if (!*ok) return Value::Bool(false);
    l = std::move(r);
  }
  return Value::Bool(true);
}

}  // namespace dh::chat::jinja
