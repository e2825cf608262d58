// Tree-walking evaluator for parsed chat templates. Sandboxed: the only host functions are
// range, namespace, dict, raise_exception and strftime_now; every render has a step budget, a
// size cap on strings and output, and a recursion cap, so hostile templates end with an error.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

#include "base/status.h"
#include "chat/jinja_ast.h"
#include "chat/jinja_value.h"

namespace dh::chat::jinja {

struct RenderLimits {
  int64_t max_steps = 1'000'000;       // expression evaluations + loop iterations + bytes/1 KiB
  size_t max_string_bytes = 4u << 20;  // output and every string built on the way
  int max_depth = 768;                 // evaluator recursion (expressions, blocks, calls)
  int max_macro_depth = 64;            // nested macro calls
  int64_t max_range = 100'000;         // largest range() (as Jinja's sandbox)
};

// Renders `tmpl` with the variables of `context` (a dict). Errors name the template line and
// column: "template line 3, column 7: ...".
Result<std::string> Render(const std::shared_ptr<const Template>& tmpl, const Value& context,
                           const RenderLimits& limits = {});

// Internal: the evaluator state of one render (jinja_interpreter.cc, jinja_builtins.cc).
class Interpreter {
 public:
  Interpreter(std::shared_ptr<const Template> tmpl, const RenderLimits& limits);
  Result<std::string> Run(const Value& context);

 private:
  struct Scope {
    std::unordered_map<std::string, Value> vars;
    std::shared_ptr<Scope> parent;
  };
  using ScopePtr = std::shared_ptr<Scope>;
  enum class Flow { kNormal, kBreak, kContinue };

  class DepthGuard {
   public:
    explicit DepthGuard(int& d) : d_(++d) {}
    ~DepthGuard() { --d_; }

   private:
    int& d_;
  };

  // Statements.
  Result<Flow> ExecBody(const Body& body, const ScopePtr& scope, std::string& out);
  Result<Flow> ExecStmt(const Stmt& s, const ScopePtr& scope, std::string& out);
  Result<Flow> ExecFor(const Stmt& s, const ScopePtr& scope, std::string& out);
  Status ExecSet(const Stmt& s, const ScopePtr& scope);
  Status Append(std::string& out, std::string_view text);
  Result<std::string> RenderToString(const Body& body, const ScopePtr& scope);

  // Expressions.
  Result<Value> Eval(const Expr& e, const ScopePtr& scope);
  Result<Value> EvalBinary(const Expr& e, const ScopePtr& scope);
  Result<Value> EvalCompare(const Expr& e, const ScopePtr& scope);
  Result<Value> EvalCall(const Expr& e, const ScopePtr& scope, const Value* caller);
  Status EvalArgs(const Expr& e, size_t first, const ScopePtr& scope, CallArgs& args);
  Result<Value> ApplyFilterChain(const Expr& e, Value input, const ScopePtr& scope);
  Value Lookup(const std::string& name, const ScopePtr& scope) const;
  Result<Value> GetAttr(const Value& obj, const std::string& name);
  Result<Value> GetItem(const Value& obj, const Value& key);
  Result<Value> Slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
  Result<ValueList> Iterate(const Value& v);
  Value MakeMacro(const Stmt& s, const ScopePtr& scope);
  Result<Value> CallMacro(const Stmt& s, const ScopePtr& def_scope, CallArgs& args);

  // Operators (jinja_builtins.cc).
  Result<Value> Arith(const std::string& op, const Value& a, const Value& b);
  Result<bool> Contains(const Value& container, const Value& item);

  // Builtins (jinja_builtins.cc).
  void InstallGlobals();
  Result<Value> CallFilter(const std::string& name, const Value& v, CallArgs& args,
                           const ScopePtr& scope);
  Result<bool> CallTest(const std::string& name, const Value& v, CallArgs& args);
  bool HasMethod(const Value& obj, const std::string& name) const;
  Result<Value> CallMethod(const Value& obj, const std::string& name, CallArgs& args);
  Result<Value> CallValue(const Value& f, CallArgs& args);

  // Budget.
  Status Step(int64_t n = 1);
  Status CheckSize(size_t bytes) const;
  Status Err(const Expr& e, std::string_view what) const;
  Status AtPos(int line, int column, Status s) const;

  std::shared_ptr<const Template> tmpl_;
  RenderLimits limits_;
  std::unordered_map<std::string, Value> globals_;
  int64_t steps_ = 0;
  int depth_ = 0;
  int macro_depth_ = 0;
};

}  // namespace dh::chat::jinja
