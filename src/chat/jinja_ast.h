// Syntax tree of a parsed chat template: expressions and statements, each with its source position.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"
#include "chat/jinja_value.h"

namespace dh::chat::jinja {

// Nesting limit for parsing (expressions, blocks) — also bounds the evaluator's recursion.
inline constexpr int kMaxParseDepth = 256;

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,  // literal
    kName,     // name
    kList,     // children: items
    kTuple,    // children: items (evaluates to a list)
    kDict,     // children: key0, value0, key1, value1, ...
    kAttr,     // children[0].name
    kItem,     // children[0][children[1]]
    kSlice,    // children[0][children[1]:children[2]:children[3]] (null parts allowed)
    kCall,     // children[0](children[1..], keyword)
    kFilter,   // children[0] | name(children[1..], keyword)
    kTest,     // children[0] is [not] name(children[1..])
    kUnary,    // name ("-", "+", "not") children[0]
    kBinary,   // children[0] name children[1]; name: + - * / // % ** ~ and or
    kCompare,  // children[0] ops[0] children[1] ops[1] children[2] ... (chained)
    kCond,     // children[1] if children[0] else children[2] (null: undefined)
  };
  Kind kind;
  int line = 0;
  int column = 0;
  int depth = 1;  // height of this subtree, bounded by kMaxParseDepth
  Value literal;
  std::string name;
  bool negated = false;
  std::vector<ExprPtr> children;
  std::vector<std::pair<std::string, ExprPtr>> keyword;
  std::vector<std::string> ops;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // null: required
};

struct Stmt {
  enum class Kind {
    kText,         // text
    kOutput,       // {{ expr }}
    kIf,           // conds[i] -> bodies[i]; else_body
    kFor,          // for targets in expr [if cond] body [else else_body]
    kSet,          // set targets = expr, or set targets[0].attr = expr (attr non-empty)
    kSetBlock,     // set targets[0] | filter_expr = rendered body
    kMacro,        // macro name(params) body
    kCallBlock,    // call(params) expr body: `caller()` renders body
    kFilterBlock,  // filter filter_expr body
    kBreak,
    kContinue,
    kScope,  // body rendered as-is ({% generation %})
  };
  Kind kind;
  int line = 0;
  int column = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr cond;  // for-loop filter
  std::vector<ExprPtr> conds;
  std::vector<Body> bodies;
  Body body;
  Body else_body;
  std::vector<std::string> targets;
  std::string attr;
  std::string name;
  std::vector<MacroParam> params;
};

struct Template {
  Body body;
};

// Parses template source. Errors: "template line L, column C: expected ..., got ...".
// include/import/extends are rejected: templates never load other files.
Result<std::shared_ptr<const Template>> ParseTemplate(std::string_view source);

}  // namespace dh::chat::jinja
