/**
 * @file sim/plot.hpp
 * @brief Line charts written as PNG files, with no dependency: a raster canvas, a 3x5 pixel font,
 *        and a PNG encoder (deflate with fixed Huffman codes, matching runs of equal pixels and rows).
 */
#pragma once

#include <strata/error.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace strata::sim {

/// @brief An RGB raster.
class canvas {
 public:
  canvas(int width, int height) : w_{width}, h_{height}, rgb_(std::size_t(width) * std::size_t(height) * 3, 255) {}
  [[nodiscard]] int width() const noexcept { return w_; }
  [[nodiscard]] int height() const noexcept { return h_; }

  void pixel(int x, int y, std::uint32_t color)
  {
    if (x < 0 || y < 0 || x >= w_ || y >= h_) { return; }
    std::size_t const i = (std::size_t(y) * std::size_t(w_) + std::size_t(x)) * 3;
    rgb_[i] = std::uint8_t(color >> 16);
    rgb_[i + 1] = std::uint8_t(color >> 8);
    rgb_[i + 2] = std::uint8_t(color);
  }
  void rect(int x, int y, int w, int h, std::uint32_t color)
  {
    for (int j = y; j < y + h; ++j) {
      for (int i = x; i < x + w; ++i) {
        pixel(i, j, color);
      }
    }
  }
  /// A line of width `thick` (Bresenham, squares at each step).
  void line(double x0, double y0, double x1, double y1, std::uint32_t color, int thick = 1)
  {
    int const steps = int(std::max(std::abs(x1 - x0), std::abs(y1 - y0))) + 1;
    for (int s = 0; s <= steps; ++s) {
      double const t = double(s) / steps;
      int const x = int(std::lround(x0 + (x1 - x0) * t)), y = int(std::lround(y0 + (y1 - y0) * t));
      rect(x - thick / 2, y - thick / 2, thick, thick, color);
    }
  }
  /// Text in a 3x5 font (upper case; unknown characters are blank), `scale` pixels per dot.
  void text(int x, int y, std::string const& s, std::uint32_t color, int scale = 2)
  {
    for (char ch : s) {
      auto const& g = glyph(ch);
      for (int r = 0; r < 5; ++r) {
        for (int c = 0; c < 3; ++c) {
          if ((g[std::size_t(r)] >> (2 - c)) & 1) { rect(x + c * scale, y + r * scale, scale, scale, color); }
        }
      }
      x += 4 * scale;
    }
  }
  static int text_width(std::string const& s, int scale = 2) { return int(s.size()) * 4 * scale - scale; }

  /**
   * @brief Writes the image as a PNG (8-bit RGB).
   * @throw strata::error when the file cannot be written
   */
  void write_png(std::string const& path) const
  {
    std::vector<std::uint8_t> raw;
    raw.reserve(rgb_.size() + std::size_t(h_));
    for (int y = 0; y < h_; ++y) {
      raw.push_back(0);  // filter: none
      raw.insert(raw.end(), rgb_.begin() + std::ptrdiff_t(std::size_t(y) * std::size_t(w_) * 3),
                 rgb_.begin() + std::ptrdiff_t(std::size_t(y + 1) * std::size_t(w_) * 3));
    }
    std::vector<std::uint8_t> z{0x78, 0x01};
    deflate_fixed(raw, std::size_t(w_) * 3 + 1, z);
    std::uint32_t a = 1, b = 0;
    for (auto v : raw) {
      a = (a + v) % 65521;
      b = (b + a) % 65521;
    }
    put32(z, (b << 16) | a);
    std::vector<std::uint8_t> png{0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    std::vector<std::uint8_t> ihdr;
    put32(ihdr, std::uint32_t(w_));
    put32(ihdr, std::uint32_t(h_));
    ihdr.insert(ihdr.end(), {8, 2, 0, 0, 0});
    chunk(png, "IHDR", ihdr);
    chunk(png, "IDAT", z);
    chunk(png, "IEND", {});
    std::ofstream out{path, std::ios::binary};
    out.write(reinterpret_cast<char const*>(png.data()), std::streamsize(png.size()));
    if (!out) { throw error(strata::detail::concat("strata: cannot write ", path)); }
  }

 private:
  /// Deflate with the fixed Huffman codes; matches at distance 3 (the pixel before) or one row up.
  static void deflate_fixed(std::vector<std::uint8_t> const& in, std::size_t row, std::vector<std::uint8_t>& out)
  {
    std::uint32_t bits = 0;
    int count = 0;
    auto put = [&](std::uint32_t v, int n) {  // LSB first
      bits |= v << count;
      count += n;
      while (count >= 8) {
        out.push_back(std::uint8_t(bits));
        bits >>= 8;
        count -= 8;
      }
    };
    auto huff = [&](std::uint32_t code, int n) {  // Huffman codes go most significant bit first
      std::uint32_t r = 0;
      for (int i = 0; i < n; ++i) {
        r |= ((code >> i) & 1u) << (n - 1 - i);
      }
      put(r, n);
    };
    auto literal = [&](std::uint32_t v) {
      if (v < 144) {
        huff(0x30 + v, 8);
      } else if (v < 256) {
        huff(0x190 + v - 144, 9);
      } else if (v < 280) {
        huff(v - 256, 7);
      } else {
        huff(0xc0 + v - 280, 8);
      }
    };
    static constexpr std::uint16_t len_base[] = {3,  4,  5,  6,  7,  8,  9,  10, 11,  13,  15,  17,  19,  23, 27,
                                                 31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
    static constexpr std::uint8_t len_extra[] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2,
                                                 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
    static constexpr std::uint16_t dist_base[] = {1,    2,    3,    4,    5,    7,    9,    13,    17,    25,
                                                  33,   49,   65,   97,   129,  193,  257,  385,   513,   769,
                                                  1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
    static constexpr std::uint8_t dist_extra[] = {0, 0, 0, 0, 1, 1, 2, 2,  3,  3,  4,  4,  5,  5,  6,
                                                  6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};
    put(1, 1);  // final block
    put(1, 2);  // fixed Huffman codes
    std::size_t i = 0;
    while (i < in.size()) {
      std::size_t best = 0, dist = 0;
      for (std::size_t d : {std::size_t{3}, row}) {
        if (d > i || d > 32768) { continue; }
        std::size_t n = 0;
        while (n < 258 && i + n < in.size() && in[i + n] == in[i + n - d]) {
          ++n;
        }
        if (n > best) {
          best = n;
          dist = d;
        }
      }
      if (best < 3) {
        literal(in[i++]);
        continue;
      }
      std::size_t c = 28;
      while (len_base[c] > best) {
        --c;
      }
      literal(257 + std::uint32_t(c));
      put(std::uint32_t(best - len_base[c]), len_extra[c]);
      std::size_t dc = 29;
      while (dist_base[dc] > dist) {
        --dc;
      }
      huff(std::uint32_t(dc), 5);
      put(std::uint32_t(dist - dist_base[dc]), dist_extra[dc]);
      i += best;
    }
    literal(256);
    if (count > 0) { out.push_back(std::uint8_t(bits)); }
  }

  static void put32(std::vector<std::uint8_t>& v, std::uint32_t x)
  {
    for (int s = 24; s >= 0; s -= 8) {
      v.push_back(std::uint8_t(x >> s));
    }
  }
  static std::uint32_t crc(std::vector<std::uint8_t> const& data)
  {
    static std::array<std::uint32_t, 256> const table = [] {
      std::array<std::uint32_t, 256> t{};
      for (std::uint32_t n = 0; n < 256; ++n) {
        std::uint32_t c = n;
        for (int k = 0; k < 8; ++k) {
          c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
        }
        t[n] = c;
      }
      return t;
    }();
    std::uint32_t c = 0xffffffffu;
    for (auto v : data) {
      c = table[(c ^ v) & 0xff] ^ (c >> 8);
    }
    return c ^ 0xffffffffu;
  }
  static void chunk(std::vector<std::uint8_t>& png, char const* type, std::vector<std::uint8_t> const& data)
  {
    put32(png, std::uint32_t(data.size()));
    std::vector<std::uint8_t> body(type, type + 4);
    body.insert(body.end(), data.begin(), data.end());
    png.insert(png.end(), body.begin(), body.end());
    put32(png, crc(body));
  }
  static std::array<std::uint8_t, 5> const& glyph(char ch)
  {
    static std::array<std::uint8_t, 5> const blank{};
    static std::string const chars = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,%-_()/:=+";
    static std::array<std::array<std::uint8_t, 5>, 47> const font{{
        {2, 5, 7, 5, 5}, {6, 5, 6, 5, 6}, {3, 4, 4, 4, 3}, {6, 5, 5, 5, 6}, {7, 4, 6, 4, 7}, {7, 4, 6, 4, 4},
        {3, 4, 5, 5, 3}, {5, 5, 7, 5, 5}, {7, 2, 2, 2, 7}, {1, 1, 1, 5, 2}, {5, 5, 6, 5, 5}, {4, 4, 4, 4, 7},
        {5, 7, 7, 5, 5}, {6, 5, 5, 5, 5}, {2, 5, 5, 5, 2}, {6, 5, 6, 4, 4}, {2, 5, 5, 6, 3}, {6, 5, 6, 5, 5},
        {3, 4, 2, 1, 6}, {7, 2, 2, 2, 2}, {5, 5, 5, 5, 7}, {5, 5, 5, 5, 2}, {5, 5, 7, 7, 5}, {5, 5, 2, 5, 5},
        {5, 5, 2, 2, 2}, {7, 1, 2, 4, 7}, {7, 5, 5, 5, 7}, {2, 6, 2, 2, 7}, {6, 1, 2, 4, 7}, {6, 1, 2, 1, 6},
        {5, 5, 7, 1, 1}, {7, 4, 6, 1, 6}, {3, 4, 7, 5, 7}, {7, 1, 2, 2, 2}, {7, 5, 7, 5, 7}, {7, 5, 7, 1, 6},
        {0, 0, 0, 0, 2}, {0, 0, 0, 2, 4}, {5, 1, 2, 4, 5}, {0, 0, 7, 0, 0}, {0, 0, 0, 0, 7}, {1, 2, 2, 2, 1},
        {4, 2, 2, 2, 4}, {1, 1, 2, 4, 4}, {0, 2, 0, 2, 0}, {0, 7, 0, 7, 0}, {0, 2, 7, 2, 0},
    }};
    char const u = (ch >= 'a' && ch <= 'z') ? char(ch - 'a' + 'A') : ch;
    auto const at = chars.find(u);
    return at == std::string::npos ? blank : font[at];
  }

  int w_, h_;
  std::vector<std::uint8_t> rgb_;
};

/// @brief One line of a chart.
struct series {
  std::string label;
  std::vector<double> x, y;
  std::uint32_t color = 0x1f77b4;
};

/// @brief A line chart with axes, ticks, a title and a legend.
struct chart {
  std::string title, x_label, y_label;
  std::vector<series> lines;
  bool log_x = false;

  /// @brief Draws the chart into the rectangle (x, y, w, h) of `c`.
  void draw(canvas& c, int x, int y, int w, int h) const
  {
    int const left = x + 70, right = x + w - 20, top = y + 40, bottom = y + h - 60;
    double x0 = 1e300, x1 = -1e300, y0 = 0, y1 = -1e300;
    for (auto const& s : lines) {
      for (std::size_t i = 0; i < s.x.size(); ++i) {
        double const xv = log_x ? std::log10(std::max(s.x[i], 1e-9)) : s.x[i];
        x0 = std::min(x0, xv);
        x1 = std::max(x1, xv);
        y1 = std::max(y1, s.y[i]);
      }
    }
    if (!(x1 > x0)) { x1 = x0 + 1; }
    if (!(y1 > y0)) { y1 = y0 + 1; }
    y1 *= 1.05;
    auto px = [&](double v) {
      return left + (right - left) * ((log_x ? std::log10(std::max(v, 1e-9)) : v) - x0) / (x1 - x0);
    };
    auto py = [&](double v) { return bottom - (bottom - top) * (v - y0) / (y1 - y0); };
    c.text(x + (w - canvas::text_width(title)) / 2, y + 12, title, 0x000000);
    c.line(left, bottom, right, bottom, 0x000000);
    c.line(left, top, left, bottom, 0x000000);
    for (int k = 0; k <= 5; ++k) {
      double const xv = x0 + (x1 - x0) * k / 5, yv = y0 + (y1 - y0) * k / 5;
      double const xt = log_x ? std::pow(10.0, xv) : xv;
      int const xp = int(left + (right - left) * k / 5), yp = int(bottom - (bottom - top) * k / 5);
      c.line(xp, bottom, xp, bottom + 4, 0x000000);
      c.line(left - 4, yp, left, yp, 0x000000);
      c.line(xp, top, xp, bottom - 1, 0xe8e8e8);
      c.line(left + 1, yp, right, yp, 0xe8e8e8);
      std::string const xs = number(xt), ys = number(yv);
      c.text(xp - canvas::text_width(xs) / 2, bottom + 10, xs, 0x333333);
      c.text(left - 8 - canvas::text_width(ys), yp - 5, ys, 0x333333);
    }
    c.text(left + (right - left - canvas::text_width(x_label)) / 2, bottom + 32, x_label, 0x000000);
    c.text(x + 6, top - 22, y_label, 0x000000);
    for (auto const& s : lines) {
      for (std::size_t i = 1; i < s.x.size(); ++i) {
        c.line(px(s.x[i - 1]), py(s.y[i - 1]), px(s.x[i]), py(s.y[i]), s.color, 2);
      }
      if (s.x.size() == 1) { c.rect(int(px(s.x[0])) - 2, int(py(s.y[0])) - 2, 5, 5, s.color); }
    }
    int ly = top + 6;
    for (auto const& s : lines) {
      c.rect(right - 170, ly + 3, 16, 4, s.color);
      c.text(right - 148, ly, s.label, 0x000000);
      ly += 16;
    }
  }

  static std::string number(double v)
  {
    char buf[32];
    double const a = std::abs(v);
    if (a >= 1000) {
      std::snprintf(buf, sizeof buf, "%.0f", v);
    } else if (a >= 10) {
      std::snprintf(buf, sizeof buf, "%.1f", v);
    } else if (a >= 0.1 || a == 0) {
      std::snprintf(buf, sizeof buf, "%.2f", v);
    } else if (a >= 0.001) {
      std::snprintf(buf, sizeof buf, "%.3f", v);
    } else {
      std::snprintf(buf, sizeof buf, "%.0e", v);
    }
    return buf;
  }
};

/**
 * @brief Writes charts side by side (`columns` per row) into one PNG.
 * @throw strata::error when the file cannot be written
 */
inline void write_charts_png(std::string const& path, std::vector<chart> const& charts, int columns = 3,
                             int chart_width = 560, int chart_height = 380)
{
  STRATA_EXPECTS(!charts.empty() && columns > 0, "write_charts_png: nothing to draw");
  int const rows = (int(charts.size()) + columns - 1) / columns;
  int const cols = std::min<int>(columns, int(charts.size()));
  canvas c{cols * chart_width, rows * chart_height};
  for (std::size_t i = 0; i < charts.size(); ++i) {
    charts[i].draw(c, int(i % std::size_t(columns)) * chart_width, int(i / std::size_t(columns)) * chart_height,
                   chart_width, chart_height);
  }
  c.write_png(path);
}

/// @brief Colours for strategies and systems, in a fixed order.
inline constexpr std::uint32_t palette[] = {0x1f77b4, 0xff7f0e, 0x2ca02c, 0xd62728, 0x9467bd, 0x8c564b, 0xe377c2};

}  // namespace strata::sim
