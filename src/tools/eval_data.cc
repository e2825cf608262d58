// CSV/JSONL readers and the per-task folder layouts of eval_data.h.
#include "tools/eval_data.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "base/mapped_file.h"

namespace dh::tools {
namespace {

namespace fs = std::filesystem;

int LetterIndex(std::string_view s) {
  if (s.size() == 1 && s[0] >= 'A' && s[0] <= 'D') return s[0] - 'A';
  return -1;
}

// The files of `dir` whose names end in `suffix`, sorted.
std::vector<fs::path> FilesWithSuffix(const fs::path& dir, const std::string& suffix) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Columns of a headed CSV, by name (either spelling).
struct Columns {
  int question = -1, answer = -1;
  std::array<int, 4> choice = {-1, -1, -1, -1};
};

Result<Columns> FindColumns(const std::vector<std::string>& header, const std::string& file) {
  Columns c;
  for (size_t i = 0; i < header.size(); ++i) {
    const std::string& h = header[i];
    if (h == "question" || h == "Question") c.question = static_cast<int>(i);
    if (h == "answer" || h == "Answer") c.answer = static_cast<int>(i);
    if (LetterIndex(h) >= 0) c.choice[LetterIndex(h)] = static_cast<int>(i);
  }
  if (c.question < 0 || c.answer < 0 ||
      std::any_of(c.choice.begin(), c.choice.end(), [](int v) { return v < 0; }))
    return InvalidArgument("{}: header: expected columns question, A, B, C, D, answer", file);
  return c;
}

// Reads one split file into items. `headed`: the first record names the columns; otherwise the
// MMLU order question,A,B,C,D,answer.
Result<std::vector<McItem>> LoadMcFile(const fs::path& path, bool headed) {
  const std::string file = path.string();
  auto text = ReadTextFile(file);
  if (!text.ok()) return text.status();
  auto rows = ParseCsv(*text, file, headed ? 0 : 6);
  if (!rows.ok()) return rows.status();
  Columns c{0, 5, {1, 2, 3, 4}};
  size_t first = 0;
  if (headed) {
    if (rows->empty()) return InvalidArgument("{}: expected a header line", file);
    auto found = FindColumns(rows->front(), file);
    if (!found.ok()) return found.status();
    c = *found;
    first = 1;
  }
  std::vector<McItem> items;
  for (size_t r = first; r < rows->size(); ++r) {
    const auto& row = (*rows)[r];
    if (headed && row.size() != rows->front().size())
      return InvalidArgument("{}: record {}: expected {} fields, got {}", file, r + 1,
                             rows->front().size(), row.size());
    McItem item;
    item.question = row[c.question];
    for (int k = 0; k < 4; ++k) item.choices[k] = row[c.choice[k]];
    item.gold = LetterIndex(row[c.answer]);
    if (item.gold < 0)
      return InvalidArgument("{}: record {}: answer '{}': expected one of A, B, C, D", file, r + 1,
                             row[c.answer]);
    items.push_back(std::move(item));
  }
  return items;
}

Status RequireDir(const fs::path& dir, const std::string& what) {
  if (!fs::is_directory(dir))
    return NotFound("{}: no such folder (expected {})", dir.string(), what);
  return Status::Ok();
}

}  // namespace

Result<std::vector<std::vector<std::string>>> ParseCsv(std::string_view text,
                                                       const std::string& name, size_t num_fields) {
  if (text.substr(0, 3) == "\xEF\xBB\xBF") text.remove_prefix(3);
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> row;
  std::string field;
  size_t line = 1, record_line = 1;
  size_t i = 0;
  bool at_record_start = true;
  auto end_record = [&]() -> Status {
    row.push_back(std::move(field));
    field.clear();
    if (num_fields != 0 && row.size() != num_fields)
      return InvalidArgument("{}: line {}: expected {} fields, got {}", name, record_line,
                             num_fields, row.size());
    rows.push_back(std::move(row));
    row.clear();
    at_record_start = true;
    return Status::Ok();
  };
  while (i < text.size()) {
    if (at_record_start) {
      record_line = line;
      at_record_start = false;
      if (text[i] == '\n' || (text[i] == '\r' && i + 1 < text.size() && text[i + 1] == '\n')) {
        i += text[i] == '\r' ? 2 : 1;  // blank line: no record
        ++line;
        at_record_start = true;
        continue;
      }
    }
    if (text[i] == '"' && field.empty()) {
      // Quoted field: runs to the closing quote not followed by another quote.
      ++i;
      bool closed = false;
      while (i < text.size()) {
        if (text[i] == '"') {
          if (i + 1 < text.size() && text[i + 1] == '"') {
            field.push_back('"');
            i += 2;
            continue;
          }
          ++i;
          closed = true;
          break;
        }
        if (text[i] == '\n') ++line;
        field.push_back(text[i++]);
      }
      if (!closed)
        return InvalidArgument("{}: line {}: unterminated quoted field", name, record_line);
      if (i < text.size() && text[i] != ',' && text[i] != '\n' && text[i] != '\r')
        return InvalidArgument("{}: line {}: expected ',' or end of line after a quoted field",
                               name, line);
      continue;
    }
    const char ch = text[i];
    if (ch == ',') {
      row.push_back(std::move(field));
      field.clear();
      ++i;
    } else if (ch == '\n' || (ch == '\r' && i + 1 < text.size() && text[i + 1] == '\n')) {
      i += ch == '\r' ? 2 : 1;
      if (Status st = end_record(); !st.ok()) return st;
      ++line;
    } else {
      field.push_back(ch);
      ++i;
    }
  }
  if (!at_record_start) {
    if (Status st = end_record(); !st.ok()) return st;
  }
  return rows;
}

const char* McTaskName(McTask task) {
  switch (task) {
    case McTask::kMmlu:
      return "mmlu";
    case McTask::kCmmlu:
      return "cmmlu";
    case McTask::kCeval:
      return "ceval";
  }
  return "?";
}

Result<std::vector<McSubject>> LoadMcTask(McTask task, const std::string& dir_text) {
  fs::path dir(dir_text);
  std::string eval_split = "test", eval_suffix, dev_suffix;
  bool headed = true;
  switch (task) {
    case McTask::kMmlu:
      if (!fs::is_directory(dir / "test") && fs::is_directory(dir / "data")) dir /= "data";
      eval_suffix = "_test.csv";
      dev_suffix = "_dev.csv";
      headed = false;
      break;
    case McTask::kCmmlu:
      eval_suffix = dev_suffix = ".csv";
      break;
    case McTask::kCeval:
      eval_split = "val";
      eval_suffix = "_val.csv";
      dev_suffix = "_dev.csv";
      break;
  }
  const std::string layout = fmt::format("{} layout: {}/ and dev/", McTaskName(task), eval_split);
  if (Status st = RequireDir(dir / eval_split, layout); !st.ok()) return st;
  if (Status st = RequireDir(dir / "dev", layout); !st.ok()) return st;
  std::vector<McSubject> subjects;
  for (const fs::path& eval_file : FilesWithSuffix(dir / eval_split, eval_suffix)) {
    const std::string file = eval_file.filename().string();
    McSubject s;
    s.name = file.substr(0, file.size() - eval_suffix.size());
    const fs::path dev_file = dir / "dev" / (s.name + dev_suffix);
    if (!fs::is_regular_file(dev_file))
      return NotFound("{}: missing (the few-shot split for {})", dev_file.string(),
                      eval_file.string());
    auto eval = LoadMcFile(eval_file, headed);
    if (!eval.ok()) return eval.status();
    auto dev = LoadMcFile(dev_file, headed);
    if (!dev.ok()) return dev.status();
    s.eval = std::move(eval).value();
    s.dev = std::move(dev).value();
    subjects.push_back(std::move(s));
  }
  if (subjects.empty())
    return NotFound("{}: no *{} files (expected the {})", (dir / eval_split).string(), eval_suffix,
                    layout);
  return subjects;
}

Result<std::vector<GsmItem>> ParseGsm8kJsonl(std::string_view text, const std::string& name) {
  std::vector<GsmItem> items;
  size_t line_no = 0, pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) continue;
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object())
      return InvalidArgument("{}: line {}: expected a JSON object", name, line_no);
    for (const char* key : {"question", "answer"}) {
      if (!j.contains(key) || !j[key].is_string())
        return InvalidArgument("{}: line {}: expected a string field '{}'", name, line_no, key);
    }
    GsmItem item{j["question"].get<std::string>(), j["answer"].get<std::string>()};
    if (item.answer.find("####") == std::string::npos)
      return InvalidArgument("{}: line {}: answer: expected a solution ending in '#### N'", name,
                             line_no);
    items.push_back(std::move(item));
  }
  return items;
}

Result<std::vector<GsmItem>> LoadGsm8k(const std::string& dir) {
  const std::string file = (fs::path(dir) / "test.jsonl").string();
  auto text = ReadTextFile(file);
  if (!text.ok())
    return NotFound("{}: cannot open file (expected the gsm8k layout: test.jsonl)", file);
  auto items = ParseGsm8kJsonl(*text, file);
  if (!items.ok()) return items.status();
  if (items->empty()) return InvalidArgument("{}: no questions", file);
  return items;
}

}  // namespace dh::tools
