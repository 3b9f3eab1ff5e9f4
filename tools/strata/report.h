// Terminal and Markdown output of the strata command: aligned tables, a one-line progress bar, and number
// formats. Debian has no table or progress-bar library (dependencies.md), so these are small and in-house.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace strata::cli {

// A table built row by row and rendered either with fixed-width columns (terminal) or as a Markdown pipe
// table, so the terminal and atk.md show the same cells.
class Table {
 public:
  enum class Align { kLeft, kRight };
  struct Column {
    std::string header;
    Align align = Align::kLeft;
  };
  explicit Table(std::vector<Column> columns) : columns_(std::move(columns)) {}
  void add_row(std::vector<std::string> cells);  // one cell per column
  bool empty() const { return rows_.empty(); }
  std::string text(const std::string& indent = "  ") const;
  std::string markdown() const;

 private:
  std::vector<Column> columns_;
  std::vector<std::vector<std::string>> rows_;
};

// A progress bar on the last line of stdout, redrawn in place with '\r'. It draws only when stdout is a
// terminal: logs and pipes get the lines passed to print_line and nothing else.
class Progress {
 public:
  explicit Progress(int total);
  ~Progress() { clear(); }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  void start(const std::string& what);  // names the step now running
  void advance();                       // the step is done
  void print_line(const std::string& line);  // a line above the bar
  void clear();                         // erases the bar (before printing tables)

 private:
  void draw(bool force);
  bool tty_;
  int total_, done_ = 0;
  std::string what_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point last_draw_{};
};

std::string format_bytes(double bytes);  // "256.0 MiB"
std::string format_ms(double ms);        // 4 significant digits: "0.06412", "25.31", "1234"
std::string utc_now_iso();               // "2026-11-29T14:03:12Z"

}  // namespace strata::cli
