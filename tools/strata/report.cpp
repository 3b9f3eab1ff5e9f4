#include "report.h"

#include <fmt/format.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <stdexcept>

namespace strata::cli {

// ---------------------------------------------------------------------------------------------- Table
void Table::add_row(std::vector<std::string> cells) {
  if (cells.size() != columns_.size())
    throw std::logic_error(fmt::format("Table: row has {} cells, the table {} columns", cells.size(), columns_.size()));
  rows_.push_back(std::move(cells));
}

std::string Table::text(const std::string& indent) const {
  std::vector<size_t> width(columns_.size());
  for (size_t c = 0; c < columns_.size(); ++c) {
    width[c] = columns_[c].header.size();
    for (const auto& r : rows_) width[c] = std::max(width[c], r[c].size());
  }
  auto line = [&](const std::vector<std::string>& cells) {
    std::string s = indent;
    for (size_t c = 0; c < cells.size(); ++c) {
      if (c) s += "  ";
      s += columns_[c].align == Align::kRight ? fmt::format("{:>{}}", cells[c], width[c])
                                              : fmt::format("{:<{}}", cells[c], width[c]);
    }
    while (!s.empty() && s.back() == ' ') s.pop_back();
    return s + "\n";
  };
  std::vector<std::string> headers, rules;
  for (size_t c = 0; c < columns_.size(); ++c) {
    headers.push_back(columns_[c].header);
    rules.emplace_back(width[c], '-');
  }
  std::string out = line(headers) + line(rules);
  for (const auto& r : rows_) out += line(r);
  return out;
}

std::string Table::markdown() const {
  auto row = [](const std::vector<std::string>& cells) {
    std::string line = "|";
    for (const auto& cell : cells) {
      line += ' ';
      for (char ch : cell) line += ch == '|' ? std::string("\\|") : std::string(1, ch);
      line += " |";
    }
    return line + "\n";
  };
  std::vector<std::string> headers, rules;
  for (const auto& c : columns_) {
    headers.push_back(c.header);
    rules.push_back(c.align == Align::kRight ? "---:" : "---");
  }
  std::string out = row(headers) + row(rules);
  for (const auto& r : rows_) out += row(r);
  return out;
}

// ---------------------------------------------------------------------------------------------- Progress
Progress::Progress(int total) : tty_(isatty(STDOUT_FILENO) == 1), total_(std::max(total, 1)) {}

void Progress::start(const std::string& what) {
  what_ = what;
  draw(false);
}

void Progress::advance() {
  done_ = std::min(done_ + 1, total_);
  draw(done_ == total_);
}

void Progress::print_line(const std::string& line) {
  clear();
  std::fputs((line + "\n").c_str(), stdout);
  std::fflush(stdout);
  draw(true);
}

void Progress::clear() {
  if (!drawn_) return;
  std::fputs("\r\033[K", stdout);  // carriage return, erase to end of line
  std::fflush(stdout);
  drawn_ = false;
}

void Progress::draw(bool force) {
  if (!tty_) return;
  // Redrawing costs a write per case; conformance cases take microseconds, so cap it at ~20 per second.
  const auto now = std::chrono::steady_clock::now();
  if (!force && drawn_ && now - last_draw_ < std::chrono::milliseconds(50)) return;
  last_draw_ = now;
  winsize ws{};
  const int columns = ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 ? ws.ws_col : 100;
  constexpr int kBarWidth = 28;
  const int filled = static_cast<int>(static_cast<int64_t>(kBarWidth) * done_ / total_);
  std::string s = fmt::format("\r[{}{}] {:>3}% {}/{} {}", std::string(filled, '#'), std::string(kBarWidth - filled, '.'),
                              100 * done_ / total_, done_, total_, what_);
  // One character short of the width: writing the last column makes some terminals wrap, and then '\r'
  // would no longer return to the bar's line.
  if (static_cast<int>(s.size()) > columns) s.resize(static_cast<size_t>(columns));
  std::fputs(s.c_str(), stdout);
  std::fputs("\033[K", stdout);
  std::fflush(stdout);
  drawn_ = true;
}

// ---------------------------------------------------------------------------------------------- formats
std::string format_bytes(double bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 4) {
    bytes /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.1f} {}", bytes, kUnits[u]);
}

std::string format_ms(double ms) {
  if (!(ms > 0)) return fmt::format("{}", ms);
  const int digits = static_cast<int>(std::floor(std::log10(ms))) + 1;  // before the decimal point
  return fmt::format("{:.{}f}", ms, std::max(0, 4 - digits));
}

std::string utc_now_iso() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace strata::cli
