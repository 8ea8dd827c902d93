/**
 * @file chart.hpp
 * @brief Chart data for the simulator tool: C++ writes the points as CSV, `plot_charts.py`
 *        (matplotlib) draws them. One CSV holds one figure: a row per point, with the panel, its
 *        title and axes, and the series it belongs to.
 */
#pragma once

#include <strata/error.hpp>

#include <charconv>
#include <fstream>
#include <string>
#include <vector>

namespace strata::sim {

/// @brief One line of a chart: a label and its points.
struct series {
  std::string label;
  std::vector<double> x, y;
};

/// @brief One panel of a figure.
struct chart {
  /// @brief How the panel is drawn: `cdf` fixes the y axis to [0, 1], `line` starts it at 0.
  enum class kind { line, cdf };
  std::string title, x_label, y_label;
  std::vector<series> lines;
  bool log_x = false;
  kind type = kind::line;
};

namespace detail {
/// @brief A CSV cell: quoted (quotes doubled) when it holds a comma, a quote or a line break.
inline std::string csv_cell(std::string const& s)
{
  if (s.find_first_of(",\"\r\n") == std::string::npos) { return s; }
  std::string q = "\"";
  for (char c : s) {
    q += c;
    if (c == '"') { q += '"'; }
  }
  return q + '"';
}
/// @brief The shortest text that reads back as `v`.
inline std::string number(double v)
{
  char buf[32];
  auto const end = std::to_chars(buf, buf + sizeof buf, v).ptr;
  return {buf, end};
}
}  // namespace detail

/**
 * @brief Writes a figure's data (panels side by side, in order) as CSV for `plot_charts.py`:
 *        `panel,title,x_label,y_label,x_scale,kind,series,x,y`, one row per point.
 * @throw strata::invalid_argument when there is nothing to draw or the file cannot be written
 */
inline void write_chart_csv(std::string const& path, std::vector<chart> const& charts)
{
  STRATA_EXPECTS(!charts.empty(), "write_chart_csv: no charts for ", path);
  std::ofstream out{path};
  STRATA_EXPECTS(out.good(), "write_chart_csv: cannot write ", path);
  out << "panel,title,x_label,y_label,x_scale,kind,series,x,y\n";
  for (std::size_t p = 0; p < charts.size(); ++p) {
    auto const& c = charts[p];
    std::string const head = std::to_string(p) + ',' + detail::csv_cell(c.title) + ',' + detail::csv_cell(c.x_label) +
                             ',' + detail::csv_cell(c.y_label) + ',' + (c.log_x ? "log" : "linear") + ',' +
                             (c.type == chart::kind::cdf ? "cdf" : "line") + ',';
    for (auto const& s : c.lines) {
      STRATA_EXPECTS(s.x.size() == s.y.size(), "write_chart_csv: series '", s.label, "' has ", s.x.size(), " x and ",
                     s.y.size(), " y values");
      for (std::size_t i = 0; i < s.x.size(); ++i) {
        out << head << detail::csv_cell(s.label) << ',' << detail::number(s.x[i]) << ',' << detail::number(s.y[i])
            << '\n';
      }
    }
  }
  out.flush();
  STRATA_EXPECTS(out.good(), "write_chart_csv: cannot write ", path);
}

/// @brief `s` quoted for a POSIX shell.
inline std::string shell_quote(std::string const& s)
{
  std::string q = "'";
  for (char c : s) {
    q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  }
  return q + "'";
}

/// @brief The command that renders chart CSVs to PNGs beside them (`a.csv` -> `a.png`).
inline std::string plot_command(std::string const& script, std::vector<std::string> const& csv_paths)
{
  std::string cmd = "python3 " + shell_quote(script);
  for (auto const& p : csv_paths) {
    cmd += ' ' + shell_quote(p);
  }
  return cmd;
}

}  // namespace strata::sim
