// Recursive-descent parser for the Jinja subset, with Jinja2's operator precedence. An explicit
// depth counter turns hostile nesting ("((((...", 1000 nested ifs) into an error, not a crash.
// Over 700 lines on purpose: one grammar, one precedence ladder and one statement table read best
// in one file; splitting it would scatter the mutual recursion across headers.
#include <initializer_list>

#include "chat/jinja_ast.h"
#include "chat/jinja_lexer.h"

namespace dh::chat::jinja {
namespace {

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  Result<Body> ParseAll() {
    std::string end;
    return ParseBody({}, &end);
  }

 private:
  // RAII nesting counter; check ok() right after constructing.
  class Depth {
   public:
    explicit Depth(int& d) : d_(++d) {}
    ~Depth() { --d_; }
    bool ok() const { return d_ <= kMaxParseDepth; }

   private:
    int& d_;
  };

  const Token& Peek(size_t ahead = 0) const {
    size_t i = std::min(pos_ + ahead, t_.size() - 1);
    return t_[i];
  }
  const Token& Next() {
    const Token& t = t_[pos_];
    if (pos_ + 1 < t_.size()) ++pos_;
    return t;
  }
  bool IsOp(std::string_view op, size_t ahead = 0) const {
    return Peek(ahead).kind == TokenKind::kOp && Peek(ahead).text == op;
  }
  bool IsName(std::string_view name, size_t ahead = 0) const {
    return Peek(ahead).kind == TokenKind::kName && Peek(ahead).text == name;
  }

  static std::string Describe(const Token& t) {
    switch (t.kind) {
      case TokenKind::kText:
        return "template text";
      case TokenKind::kVarBegin:
        return "'{{'";
      case TokenKind::kVarEnd:
        return "'}}'";
      case TokenKind::kBlockBegin:
        return "'{%'";
      case TokenKind::kBlockEnd:
        return "'%}'";
      case TokenKind::kName:
        return "name '" + t.text + "'";
      case TokenKind::kString:
        return "a string";
      case TokenKind::kInt:
      case TokenKind::kFloat:
        return "number " + t.text;
      case TokenKind::kOp:
        return "'" + t.text + "'";
      case TokenKind::kEof:
        return "end of template";
    }
    return "?";
  }

  Status ErrorAt(const Token& t, std::string_view what) const {
    return InvalidArgument("template line {}, column {}: {}", t.line, t.column, what);
  }
  Status Expected(std::string_view what) const {
    return ErrorAt(Peek(), fmt::format("expected {}, got {}", what, Describe(Peek())));
  }
  Status TooDeep() const {
    return ErrorAt(Peek(), fmt::format("nesting deeper than {} levels", kMaxParseDepth));
  }

  Status ExpectOp(std::string_view op) {
    if (!IsOp(op)) return Expected(fmt::format("'{}'", op));
    Next();
    return Status::Ok();
  }
  Status ExpectKind(TokenKind kind, std::string_view what) {
    if (Peek().kind != kind) return Expected(what);
    Next();
    return Status::Ok();
  }
  Status ExpectBlockEnd() { return ExpectKind(TokenKind::kBlockEnd, "'%}'"); }
  Result<std::string> ExpectName() {
    if (Peek().kind != TokenKind::kName) return Expected("a name");
    return Next().text;
  }

  ExprPtr MakeExpr(Expr::Kind kind, const Token& at) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = at.line;
    e->column = at.column;
    return e;
  }
  StmtPtr MakeStmt(Stmt::Kind kind, const Token& at) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->line = at.line;
    s->column = at.column;
    return s;
  }

  // Records the subtree height; long operator or filter chains build deep trees without deep
  // parser recursion, so the height is checked here as well.
  Status Seal(Expr& e) const {
    int d = 0;
    for (const auto& c : e.children) {
      if (c) d = std::max(d, c->depth);
    }
    for (const auto& kv : e.keyword) d = std::max(d, kv.second->depth);
    e.depth = d + 1;
    if (e.depth > kMaxParseDepth) {
      return InvalidArgument("template line {}, column {}: expression nested deeper than {} levels",
                             e.line, e.column, kMaxParseDepth);
    }
    return Status::Ok();
  }

  static bool IsClosingTag(std::string_view name) {
    return name == "elif" || name == "else" || name.substr(0, 3) == "end";
  }

  // Parses statements until a block tag named in `ends` (which is consumed up to its name; the
  // name goes to *found). With no `ends`, parses to the end of the template.
  Result<Body> ParseBody(std::initializer_list<std::string_view> ends, std::string* found) {
    Depth depth(depth_);
    if (!depth.ok()) return TooDeep();
    Body body;
    while (true) {
      const Token& t = Peek();
      if (t.kind == TokenKind::kEof) {
        if (ends.size() == 0) return body;
        std::string names;
        for (auto e : ends) names += (names.empty() ? "" : " or ") + fmt::format("'{{% {} %}}'", e);
        return ErrorAt(t, fmt::format("unexpected end of template, expected {}", names));
      }
      if (t.kind == TokenKind::kText) {
        auto s = MakeStmt(Stmt::Kind::kText, t);
        s->text = Next().text;
        body.push_back(std::move(s));
      } else if (t.kind == TokenKind::kVarBegin) {
        auto s = MakeStmt(Stmt::Kind::kOutput, Next());
        DH_ASSIGN_OR_RETURN(s->expr, ParseTuple(true));
        DH_RETURN_IF_ERROR(ExpectKind(TokenKind::kVarEnd, "'}}'"));
        body.push_back(std::move(s));
      } else if (t.kind == TokenKind::kBlockBegin) {
        const Token& name = Peek(1);
        if (name.kind == TokenKind::kName) {
          for (auto e : ends) {
            if (name.text == e) {
              Next();
              *found = Next().text;
              return body;
            }
          }
        }
        if (name.kind == TokenKind::kName && IsClosingTag(name.text)) {
          std::string names;
          for (auto e : ends)
            names += (names.empty() ? "" : " or ") + fmt::format("'{{% {} %}}'", e);
          return ErrorAt(name, fmt::format("unexpected '{{% {} %}}', expected {}", name.text,
                                           names.empty() ? "no closing tag here" : names));
        }
        DH_ASSIGN_OR_RETURN(StmtPtr s, ParseStatement());
        body.push_back(std::move(s));
      } else {
        return ErrorAt(t, fmt::format("unexpected {}", Describe(t)));
      }
    }
  }

  Result<StmtPtr> ParseStatement() {
    Next();  // {%
    const Token& tag = Peek();
    if (tag.kind != TokenKind::kName) return Expected("a statement name");
    std::string name = Next().text;
    if (name == "if") return ParseIf(tag);
    if (name == "for") return ParseFor(tag);
    if (name == "set") return ParseSet(tag);
    if (name == "macro") return ParseMacro(tag);
    if (name == "call") return ParseCallBlock(tag);
    if (name == "filter") return ParseFilterBlock(tag);
    if (name == "generation") {
      auto s = MakeStmt(Stmt::Kind::kScope, tag);
      DH_RETURN_IF_ERROR(ExpectBlockEnd());
      std::string end;
      DH_ASSIGN_OR_RETURN(s->body, ParseBody({"endgeneration"}, &end));
      DH_RETURN_IF_ERROR(ExpectBlockEnd());
      return s;
    }
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) return ErrorAt(tag, fmt::format("'{}' outside a for loop", name));
      auto s = MakeStmt(name == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue, tag);
      DH_RETURN_IF_ERROR(ExpectBlockEnd());
      return s;
    }
    if (name == "include" || name == "import" || name == "from" || name == "extends" ||
        name == "block") {
      return ErrorAt(tag, fmt::format("'{}' is not supported: chat templates cannot load other "
                                      "templates or files",
                                      name));
    }
    return ErrorAt(tag, fmt::format("unknown statement '{}'", name));
  }

  Result<StmtPtr> ParseIf(const Token& tag) {
    auto s = MakeStmt(Stmt::Kind::kIf, tag);
    std::string end = "elif";
    while (end == "elif") {
      DH_ASSIGN_OR_RETURN(ExprPtr cond, ParseTuple(true));
      DH_RETURN_IF_ERROR(ExpectBlockEnd());
      DH_ASSIGN_OR_RETURN(Body body, ParseBody({"elif", "else", "endif"}, &end));
      s->conds.push_back(std::move(cond));
      s->bodies.push_back(std::move(body));
    }
    if (end == "else") {
      DH_RETURN_IF_ERROR(ExpectBlockEnd());
      DH_ASSIGN_OR_RETURN(s->else_body, ParseBody({"endif"}, &end));
    }
    DH_RETURN_IF_ERROR(ExpectBlockEnd());
    return s;
  }

  Result<StmtPtr> ParseFor(const Token& tag) {
    auto s = MakeStmt(Stmt::Kind::kFor, tag);
    bool paren = IsOp("(");
    if (paren) Next();
    do {
      DH_ASSIGN_OR_RETURN(std::string target, ExpectName());
      s->targets.push_back(std::move(target));
    } while (IsOp(",") && (Next(), true));
    if (paren) DH_RETURN_IF_ERROR(ExpectOp(")"));
    if (!IsName("in")) return Expected("'in'");
    Next();
    DH_ASSIGN_OR_RETURN(s->expr, ParseTuple(false));
    if (IsName("if")) {
      Next();
      DH_ASSIGN_OR_RETURN(s->cond, ParseExpression());
    }
    if (IsName("recursive")) return ErrorAt(Peek(), "recursive for loops are not supported");
    DH_RETURN_IF_ERROR(ExpectBlockEnd());
    std::string end;
    ++loop_depth_;
    auto body = ParseBody({"else", "endfor"}, &end);
    --loop_depth_;
    if (!body.ok()) return body.status();
    s->body = std::move(body).value();
    if (end == "else") {
      DH_RETURN_IF_ERROR(ExpectBlockEnd());
      DH_ASSIGN_OR_RETURN(s->else_body, ParseBody({"endfor"}, &end));
    }
    DH_RETURN_IF_ERROR(ExpectBlockEnd());
    return s;
  }

  Result<StmtPtr> ParseSet(const Token& tag) {
    auto s = MakeStmt(Stmt::Kind::kSet, tag);
    DH_ASSIGN_OR_RETURN(std::string first, ExpectName());
    s->targets.push_back(std::move(first));
    if (IsOp(".")) {
      Next();
      DH_ASSIGN_OR_RETURN(s->attr, ExpectName());
    } else {
      while (IsOp(",")) {
        Next();
        DH_ASSIGN_OR_RETURN(std::string more, ExpectName());
        s->targets.push_back(std::move(more));
      }
    }
    if (IsOp("=")) {
      Next();
      DH_ASSIGN_OR_RETURN(s->expr, ParseTuple(true));
      DH_RETURN_IF_ERROR(ExpectBlockEnd());
      return s;
    }
    if (s->targets.size() != 1 || !s->attr.empty()) return Expected("'='");
    s->kind = Stmt::Kind::kSetBlock;
    if (IsOp("|")) {
      DH_ASSIGN_OR_RETURN(s->expr, ParseFilterChain(nullptr));
    }
    DH_RETURN_IF_ERROR(ExpectBlockEnd());
    std::string end;
    DH_ASSIGN_OR_RETURN(s->body, ParseBody({"endset"}, &end));
    DH_RETURN_IF_ERROR(ExpectBlockEnd());
    return s;
  }

  Status ParseParams(std::vector<MacroParam>& params) {
    DH_RETURN_IF_ERROR(ExpectOp("("));
    while (!IsOp(")")) {
      MacroParam p;
      DH_ASSIGN_OR_RETURN(p.name, ExpectName());
      if (IsOp("=")) {
        Next();
        DH_ASSIGN_OR_RETURN(p.default_value, ParseExpression());
      }
      params.push_back(std::move(p));
      if (!IsOp(",")) break;
      Next();
    }
    return ExpectOp(")");
  }

  Result<StmtPtr> ParseMacro(const Token& tag) {
    auto s = MakeStmt(Stmt::Kind::kMacro, tag);
    DH_ASSIGN_OR_RETURN(s->name, ExpectName());
    DH_RETURN_IF_ERROR(ParseParams(s->params));
    DH_RETURN_IF_ERROR(ExpectBlockEnd());
    std::string end;
    int saved_loops = loop_depth_;
    loop_depth_ = 0;
    auto body = ParseBody({"endmacro"}, &end);
    loop_depth_ = saved_loops;
    if (!body.ok()) return body.status();
    s->body = std::move(body).value();
    if (Peek().kind == TokenKind::kName) Next();  // {% endmacro name %}
    DH_RETURN_IF_ERROR(ExpectBlockEnd());
    return s;
  }

  Result<StmtPtr> ParseCallBlock(const Token& tag) {
    auto s = MakeStmt(Stmt::Kind::kCallBlock, tag);
    if (IsOp("(")) DH_RETURN_IF_ERROR(ParseParams(s->params));
    DH_ASSIGN_OR_RETURN(s->expr, ParseExpression());
    if (s->expr->kind != Expr::Kind::kCall)
      return ErrorAt(tag, "expected a macro call after 'call'");
    DH_RETURN_IF_ERROR(ExpectBlockEnd());
    std::string end;
    DH_ASSIGN_OR_RETURN(s->body, ParseBody({"endcall"}, &end));
    DH_RETURN_IF_ERROR(ExpectBlockEnd());
    return s;
  }

  Result<StmtPtr> ParseFilterBlock(const Token& tag) {
    auto s = MakeStmt(Stmt::Kind::kFilterBlock, tag);
    Token bar{TokenKind::kOp, "|", 0, 0, tag.line, tag.column};
    // The first filter has no leading '|': parse it as if it had one.
    DH_ASSIGN_OR_RETURN(s->expr, ParseOneFilter(nullptr, bar));
    if (IsOp("|")) {
      DH_ASSIGN_OR_RETURN(s->expr, ParseFilterChain(std::move(s->expr)));
    }
    DH_RETURN_IF_ERROR(ExpectBlockEnd());
    std::string end;
    DH_ASSIGN_OR_RETURN(s->body, ParseBody({"endfilter"}, &end));
    DH_RETURN_IF_ERROR(ExpectBlockEnd());
    return s;
  }

  // ---- Expressions ----

  bool IsTupleEnd() const {
    const Token& t = Peek();
    return t.kind == TokenKind::kVarEnd || t.kind == TokenKind::kBlockEnd ||
           t.kind == TokenKind::kEof || (t.kind == TokenKind::kOp && t.text == ")") ||
           (t.kind == TokenKind::kName &&
            (t.text == "in" || t.text == "if" || t.text == "recursive"));
  }

  // expression (',' expression)* — a tuple when there is a comma.
  Result<ExprPtr> ParseTuple(bool with_cond) {
    const Token& start = Peek();
    auto one = [&]() -> Result<ExprPtr> { return with_cond ? ParseExpression() : ParseOr(); };
    DH_ASSIGN_OR_RETURN(ExprPtr first, one());
    if (!IsOp(",")) return first;
    auto tuple = MakeExpr(Expr::Kind::kTuple, start);
    tuple->children.push_back(std::move(first));
    while (IsOp(",")) {
      Next();
      if (IsTupleEnd()) break;
      DH_ASSIGN_OR_RETURN(ExprPtr e, one());
      tuple->children.push_back(std::move(e));
    }
    return tuple;
  }

  Result<ExprPtr> ParseExpression() {
    Depth depth(depth_);
    if (!depth.ok()) return TooDeep();
    const Token& start = Peek();
    DH_ASSIGN_OR_RETURN(ExprPtr e, ParseOr());
    while (IsName("if")) {
      Next();
      auto cond = MakeExpr(Expr::Kind::kCond, start);
      DH_ASSIGN_OR_RETURN(ExprPtr test, ParseOr());
      cond->children.push_back(std::move(test));
      cond->children.push_back(std::move(e));
      if (IsName("else")) {
        Next();
        DH_ASSIGN_OR_RETURN(ExprPtr other, ParseExpression());
        cond->children.push_back(std::move(other));
      } else {
        cond->children.push_back(nullptr);
      }
      DH_RETURN_IF_ERROR(Seal(*cond));
      e = std::move(cond);
    }
    return e;
  }

  Result<ExprPtr> Binary(std::string op, ExprPtr l, ExprPtr r, const Token& at) {
    auto e = MakeExpr(Expr::Kind::kBinary, at);
    e->name = std::move(op);
    e->children.push_back(std::move(l));
    e->children.push_back(std::move(r));
    DH_RETURN_IF_ERROR(Seal(*e));
    return e;
  }

  Result<ExprPtr> ParseOr() {
    DH_ASSIGN_OR_RETURN(ExprPtr l, ParseAnd());
    while (IsName("or")) {
      const Token& at = Next();
      DH_ASSIGN_OR_RETURN(ExprPtr r, ParseAnd());
      DH_ASSIGN_OR_RETURN(l, Binary("or", std::move(l), std::move(r), at));
    }
    return l;
  }

  Result<ExprPtr> ParseAnd() {
    DH_ASSIGN_OR_RETURN(ExprPtr l, ParseNot());
    while (IsName("and")) {
      const Token& at = Next();
      DH_ASSIGN_OR_RETURN(ExprPtr r, ParseNot());
      DH_ASSIGN_OR_RETURN(l, Binary("and", std::move(l), std::move(r), at));
    }
    return l;
  }

  Result<ExprPtr> ParseNot() {
    if (IsName("not")) {
      Depth depth(depth_);
      if (!depth.ok()) return TooDeep();
      auto e = MakeExpr(Expr::Kind::kUnary, Next());
      e->name = "not";
      DH_ASSIGN_OR_RETURN(ExprPtr operand, ParseNot());
      e->children.push_back(std::move(operand));
      DH_RETURN_IF_ERROR(Seal(*e));
      return e;
    }
    return ParseCompare();
  }

  Result<ExprPtr> ParseCompare() {
    const Token& start = Peek();
    DH_ASSIGN_OR_RETURN(ExprPtr first, ParseMath1());
    ExprPtr cmp;
    while (true) {
      std::string op;
      const Token& t = Peek();
      if (t.kind == TokenKind::kOp && (t.text == "==" || t.text == "!=" || t.text == "<" ||
                                       t.text == "<=" || t.text == ">" || t.text == ">=")) {
        op = t.text;
        Next();
      } else if (IsName("in")) {
        op = "in";
        Next();
      } else if (IsName("not") && IsName("in", 1)) {
        op = "not in";
        Next();
        Next();
      } else {
        break;
      }
      if (!cmp) {
        cmp = MakeExpr(Expr::Kind::kCompare, start);
        cmp->children.push_back(std::move(first));
      }
      DH_ASSIGN_OR_RETURN(ExprPtr r, ParseMath1());
      cmp->ops.push_back(std::move(op));
      cmp->children.push_back(std::move(r));
    }
    if (!cmp) return first;
    DH_RETURN_IF_ERROR(Seal(*cmp));
    return cmp;
  }

  Result<ExprPtr> ParseMath1() {
    DH_ASSIGN_OR_RETURN(ExprPtr l, ParseConcat());
    while (IsOp("+") || IsOp("-")) {
      const Token& at = Next();
      DH_ASSIGN_OR_RETURN(ExprPtr r, ParseConcat());
      DH_ASSIGN_OR_RETURN(l, Binary(at.text, std::move(l), std::move(r), at));
    }
    return l;
  }

  Result<ExprPtr> ParseConcat() {
    DH_ASSIGN_OR_RETURN(ExprPtr l, ParseMath2());
    while (IsOp("~")) {
      const Token& at = Next();
      DH_ASSIGN_OR_RETURN(ExprPtr r, ParseMath2());
      DH_ASSIGN_OR_RETURN(l, Binary("~", std::move(l), std::move(r), at));
    }
    return l;
  }

  Result<ExprPtr> ParseMath2() {
    DH_ASSIGN_OR_RETURN(ExprPtr l, ParsePow());
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const Token& at = Next();
      DH_ASSIGN_OR_RETURN(ExprPtr r, ParsePow());
      DH_ASSIGN_OR_RETURN(l, Binary(at.text, std::move(l), std::move(r), at));
    }
    return l;
  }

  Result<ExprPtr> ParsePow() {
    DH_ASSIGN_OR_RETURN(ExprPtr l, ParseUnary(true));
    while (IsOp("**")) {
      const Token& at = Next();
      DH_ASSIGN_OR_RETURN(ExprPtr r, ParseUnary(true));
      DH_ASSIGN_OR_RETURN(l, Binary("**", std::move(l), std::move(r), at));
    }
    return l;
  }

  Result<ExprPtr> ParseUnary(bool with_filter) {
    Depth depth(depth_);
    if (!depth.ok()) return TooDeep();
    ExprPtr e;
    if (IsOp("-") || IsOp("+")) {
      e = MakeExpr(Expr::Kind::kUnary, Peek());
      e->name = Next().text;
      DH_ASSIGN_OR_RETURN(ExprPtr operand, ParseUnary(false));
      e->children.push_back(std::move(operand));
      DH_RETURN_IF_ERROR(Seal(*e));
    } else {
      DH_ASSIGN_OR_RETURN(e, ParsePrimary());
      DH_ASSIGN_OR_RETURN(e, ParsePostfix(std::move(e)));
    }
    if (with_filter) return ParseFilterTestCall(std::move(e));
    return e;
  }

  Result<ExprPtr> ParsePrimary() {
    const Token& t = Peek();
    switch (t.kind) {
      case TokenKind::kName: {
        Next();
        auto e = MakeExpr(Expr::Kind::kLiteral, t);
        if (t.text == "true" || t.text == "True")
          e->literal = Value::Bool(true);
        else if (t.text == "false" || t.text == "False")
          e->literal = Value::Bool(false);
        else if (t.text == "none" || t.text == "None")
          e->literal = Value::None();
        else {
          e->kind = Expr::Kind::kName;
          e->name = t.text;
        }
        return e;
      }
      case TokenKind::kString: {
        auto e = MakeExpr(Expr::Kind::kLiteral, t);
        std::string s;
        while (Peek().kind == TokenKind::kString) s += Next().text;
        e->literal = Value::String(std::move(s));
        return e;
      }
      case TokenKind::kInt: {
        auto e = MakeExpr(Expr::Kind::kLiteral, Next());
        e->literal = Value::Int(t.int_value);
        return e;
      }
      case TokenKind::kFloat: {
        auto e = MakeExpr(Expr::Kind::kLiteral, Next());
        e->literal = Value::Float(t.float_value);
        return e;
      }
      case TokenKind::kOp:
        if (t.text == "(") {
          Next();
          if (IsOp(")")) {
            Next();
            return MakeExpr(Expr::Kind::kTuple, t);
          }
          DH_ASSIGN_OR_RETURN(ExprPtr e, ParseTuple(true));
          DH_RETURN_IF_ERROR(ExpectOp(")"));
          return e;
        }
        if (t.text == "[") {
          auto e = MakeExpr(Expr::Kind::kList, Next());
          while (!IsOp("]")) {
            DH_ASSIGN_OR_RETURN(ExprPtr item, ParseExpression());
            e->children.push_back(std::move(item));
            if (!IsOp(",")) break;
            Next();
          }
          DH_RETURN_IF_ERROR(ExpectOp("]"));
          DH_RETURN_IF_ERROR(Seal(*e));
          return e;
        }
        if (t.text == "{") {
          auto e = MakeExpr(Expr::Kind::kDict, Next());
          while (!IsOp("}")) {
            DH_ASSIGN_OR_RETURN(ExprPtr key, ParseExpression());
            DH_RETURN_IF_ERROR(ExpectOp(":"));
            DH_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression());
            e->children.push_back(std::move(key));
            e->children.push_back(std::move(value));
            if (!IsOp(",")) break;
            Next();
          }
          DH_RETURN_IF_ERROR(ExpectOp("}"));
          DH_RETURN_IF_ERROR(Seal(*e));
          return e;
        }
        break;
      default:
        break;
    }
    return Expected("an expression");
  }

  Status ParseCallArgs(Expr& call) {
    DH_RETURN_IF_ERROR(ExpectOp("("));
    while (!IsOp(")")) {
      if (Peek().kind == TokenKind::kName && IsOp("=", 1)) {
        std::string key = Next().text;
        Next();
        DH_ASSIGN_OR_RETURN(ExprPtr v, ParseExpression());
        call.keyword.emplace_back(std::move(key), std::move(v));
      } else {
        if (!call.keyword.empty())
          return ErrorAt(Peek(), "positional argument after keyword argument");
        DH_ASSIGN_OR_RETURN(ExprPtr v, ParseExpression());
        call.children.push_back(std::move(v));
      }
      if (!IsOp(",")) break;
      Next();
    }
    return ExpectOp(")");
  }

  Result<ExprPtr> ParsePostfix(ExprPtr e) {
    while (true) {
      if (IsOp(".")) {
        const Token& at = Next();
        if (Peek().kind == TokenKind::kInt) {
          auto item = MakeExpr(Expr::Kind::kItem, at);
          auto index = MakeExpr(Expr::Kind::kLiteral, Peek());
          index->literal = Value::Int(Next().int_value);
          item->children.push_back(std::move(e));
          item->children.push_back(std::move(index));
          DH_RETURN_IF_ERROR(Seal(*item));
          e = std::move(item);
          continue;
        }
        auto attr = MakeExpr(Expr::Kind::kAttr, at);
        DH_ASSIGN_OR_RETURN(attr->name, ExpectName());
        attr->children.push_back(std::move(e));
        DH_RETURN_IF_ERROR(Seal(*attr));
        e = std::move(attr);
      } else if (IsOp("[")) {
        DH_ASSIGN_OR_RETURN(e, ParseSubscript(std::move(e)));
      } else if (IsOp("(")) {
        auto call = MakeExpr(Expr::Kind::kCall, Peek());
        call->children.push_back(std::move(e));
        DH_RETURN_IF_ERROR(ParseCallArgs(*call));
        DH_RETURN_IF_ERROR(Seal(*call));
        e = std::move(call);
      } else {
        return e;
      }
    }
  }

  Result<ExprPtr> ParseSubscript(ExprPtr obj) {
    const Token& at = Next();  // [
    ExprPtr parts[3];
    bool is_slice = false;
    for (int i = 0; i < 3; ++i) {
      if (!IsOp(":") && !IsOp("]")) {
        DH_ASSIGN_OR_RETURN(parts[i], ParseExpression());
      }
      if (i < 2 && IsOp(":")) {
        Next();
        is_slice = true;
      } else {
        break;
      }
    }
    DH_RETURN_IF_ERROR(ExpectOp("]"));
    if (!is_slice) {
      if (!parts[0]) return ErrorAt(at, "empty subscript");
      auto e = MakeExpr(Expr::Kind::kItem, at);
      e->children.push_back(std::move(obj));
      e->children.push_back(std::move(parts[0]));
      DH_RETURN_IF_ERROR(Seal(*e));
      return e;
    }
    auto e = MakeExpr(Expr::Kind::kSlice, at);
    e->children.push_back(std::move(obj));
    for (auto& p : parts) e->children.push_back(std::move(p));
    DH_RETURN_IF_ERROR(Seal(*e));
    return e;
  }

  // One `| name(args)` applied to `operand` (null for filter blocks).
  Result<ExprPtr> ParseOneFilter(ExprPtr operand, const Token& at) {
    auto f = MakeExpr(Expr::Kind::kFilter, at);
    DH_ASSIGN_OR_RETURN(f->name, ExpectName());
    f->children.push_back(std::move(operand));
    if (IsOp("(")) DH_RETURN_IF_ERROR(ParseCallArgs(*f));
    DH_RETURN_IF_ERROR(Seal(*f));
    return f;
  }

  Result<ExprPtr> ParseFilterChain(ExprPtr operand) {
    while (IsOp("|")) {
      const Token& at = Next();
      DH_ASSIGN_OR_RETURN(operand, ParseOneFilter(std::move(operand), at));
    }
    return operand;
  }

  Result<ExprPtr> ParseFilterTestCall(ExprPtr e) {
    while (true) {
      if (IsOp("|")) {
        DH_ASSIGN_OR_RETURN(e, ParseFilterChain(std::move(e)));
      } else if (IsName("is")) {
        auto test = MakeExpr(Expr::Kind::kTest, Next());
        if (IsName("not")) {
          Next();
          test->negated = true;
        }
        DH_ASSIGN_OR_RETURN(test->name, ExpectName());
        test->children.push_back(std::move(e));
        const Token& t = Peek();
        if (IsOp("(")) {
          DH_RETURN_IF_ERROR(ParseCallArgs(*test));
        } else if ((t.kind == TokenKind::kName && t.text != "else" && t.text != "or" &&
                    t.text != "and" && t.text != "if" && t.text != "in" && t.text != "not" &&
                    t.text != "is") ||
                   t.kind == TokenKind::kString || t.kind == TokenKind::kInt ||
                   t.kind == TokenKind::kFloat || IsOp("[") || IsOp("{")) {
          DH_ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
          DH_ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
          test->children.push_back(std::move(arg));
        }
        DH_RETURN_IF_ERROR(Seal(*test));
        e = std::move(test);
      } else if (IsOp("(")) {
        auto call = MakeExpr(Expr::Kind::kCall, Peek());
        call->children.push_back(std::move(e));
        DH_RETURN_IF_ERROR(ParseCallArgs(*call));
        DH_RETURN_IF_ERROR(Seal(*call));
        e = std::move(call);
      } else {
        return e;
      }
    }
  }

  std::vector<Token> t_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

Result<std::shared_ptr<const Template>> ParseTemplate(std::string_view source) {
  DH_ASSIGN_OR_RETURN(std::vector<Token> tokens, Tokenize(source));
  Parser parser(std::move(tokens));
  DH_ASSIGN_OR_RETURN(Body body, parser.ParseAll());
  auto tmpl = std::make_shared<Template>();
  tmpl->body = std::move(body);
  return std::shared_ptr<const Template>(std::move(tmpl));
}

}  // namespace dh::chat::jinja
