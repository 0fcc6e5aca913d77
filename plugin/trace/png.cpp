#include "plugin/trace/png.h"

#include "plugin/errors.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <stdexcept>

namespace conveyor {

namespace {

// 5x7 glyphs, row by row, '#' set.
struct Glyph {
  char c;
  const char* rows[7];
};
constexpr Glyph kFont[] = {
    {'0', {" ### ", "#   #", "#  ##", "# # #", "##  #", "#   #", " ### "}},
    {'1', {"  #  ", " ##  ", "  #  ", "  #  ", "  #  ", "  #  ", " ### "}},
    {'2', {" ### ", "#   #", "    #", "   # ", "  #  ", " #   ", "#####"}},
    {'3', {"#####", "   # ", "  #  ", "   # ", "    #", "#   #", " ### "}},
    {'4', {"   # ", "  ## ", " # # ", "#  # ", "#####", "   # ", "   # "}},
    {'5', {"#####", "#    ", "#### ", "    #", "    #", "#   #", " ### "}},
    {'6', {"  ## ", " #   ", "#    ", "#### ", "#   #", "#   #", " ### "}},
    {'7', {"#####", "    #", "   # ", "  #  ", " #   ", " #   ", " #   "}},
    {'8', {" ### ", "#   #", "#   #", " ### ", "#   #", "#   #", " ### "}},
    {'9', {" ### ", "#   #", "#   #", " ####", "    #", "   # ", " ##  "}},
    {'A', {" ### ", "#   #", "#   #", "#####", "#   #", "#   #", "#   #"}},
    {'B', {"#### ", "#   #", "#   #", "#### ", "#   #", "#   #", "#### "}},
    {'C', {" ### ", "#   #", "#    ", "#    ", "#    ", "#   #", " ### "}},
    {'D', {"#### ", "#   #", "#   #", "#   #", "#   #", "#   #", "#### "}},
    {'E', {"#####", "#    ", "#    ", "#### ", "#    ", "#    ", "#####"}},
    {'F', {"#####", "#    ", "#    ", "#### ", "#    ", "#    ", "#    "}},
    {'G', {" ### ", "#   #", "#    ", "# ###", "#   #", "#   #", " ####"}},
    {'H', {"#   #", "#   #", "#   #", "#####", "#   #", "#   #", "#   #"}},
    {'I', {" ### ", "  #  ", "  #  ", "  #  ", "  #  ", "  #  ", " ### "}},
    {'J', {"  ###", "   # ", "   # ", "   # ", "   # ", "#  # ", " ##  "}},
    {'K', {"#   #", "#  # ", "# #  ", "##   ", "# #  ", "#  # ", "#   #"}},
    {'L', {"#    ", "#    ", "#    ", "#    ", "#    ", "#    ", "#####"}},
    {'M', {"#   #", "## ##", "# # #", "# # #", "#   #", "#   #", "#   #"}},
    {'N', {"#   #", "#   #", "##  #", "# # #", "#  ##", "#   #", "#   #"}},
    {'O', {" ### ", "#   #", "#   #", "#   #", "#   #", "#   #", " ### "}},
    {'P', {"#### ", "#   #", "#   #", "#### ", "#    ", "#    ", "#    "}},
    {'Q', {" ### ", "#   #", "#   #", "#   #", "# # #", "#  # ", " ## #"}},
    {'R', {"#### ", "#   #", "#   #", "#### ", "# #  ", "#  # ", "#   #"}},
    {'S', {" ####", "#    ", "#    ", " ### ", "    #", "    #", "#### "}},
    {'T', {"#####", "  #  ", "  #  ", "  #  ", "  #  ", "  #  ", "  #  "}},
    {'U', {"#   #", "#   #", "#   #", "#   #", "#   #", "#   #", " ### "}},
    {'V', {"#   #", "#   #", "#   #", "#   #", "#   #", " # # ", "  #  "}},
    {'W', {"#   #", "#   #", "#   #", "# # #", "# # #", "# # #", " # # "}},
    {'X', {"#   #", "#   #", " # # ", "  #  ", " # # ", "#   #", "#   #"}},
    {'Y', {"#   #", "#   #", " # # ", "  #  ", "  #  ", "  #  ", "  #  "}},
    {'Z', {"#####", "    #", "   # ", "  #  ", " #   ", "#    ", "#####"}},
    {'.', {"     ", "     ", "     ", "     ", "     ", " ##  ", " ##  "}},
    {',', {"     ", "     ", "     ", "     ", " ##  ", "  #  ", " #   "}},
    {':', {"     ", " ##  ", " ##  ", "     ", " ##  ", " ##  ", "     "}},
    {'-', {"     ", "     ", "     ", "#####", "     ", "     ", "     "}},
    {'%', {"##   ", "##  #", "   # ", "  #  ", " #   ", "#  ##", "   ##"}},
    {'(', {"   # ", "  #  ", " #   ", " #   ", " #   ", "  #  ", "   # "}},
    {')', {" #   ", "  #  ", "   # ", "   # ", "   # ", "  #  ", " #   "}},
    {'/', {"     ", "    #", "   # ", "  #  ", " #   ", "#    ", "     "}},
    {'=', {"     ", "     ", "#####", "     ", "#####", "     ", "     "}},
    {'+', {"     ", "  #  ", "  #  ", "#####", "  #  ", "  #  ", "     "}},
    {'x', {"     ", "     ", "#   #", " # # ", "  #  ", " # # ", "#   #"}},
};

const Glyph* glyph_of(char c) {
  if (c == 'x') return &kFont[std::size(kFont) - 1];  // the multiplication sign reads better small
  const char upper = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (const Glyph& g : kFont) {
    if (g.c == upper) return &g;
  }
  return nullptr;
}

uint32_t adler32(const std::vector<uint8_t>& data) {
  uint32_t a = 1, b = 0;
  for (uint8_t byte : data) {
    a = (a + byte) % 65521;
    b = (b + a) % 65521;
  }
  return (b << 16) | a;
}

// Deflate's bit stream: values LSB first, Huffman codes MSB first.
class BitWriter {
 public:
  void bits(uint32_t value, int count) {
    for (int i = 0; i < count; ++i) put((value >> i) & 1);
  }
  void code(uint32_t code, int length) {
    for (int i = length - 1; i >= 0; --i) put((code >> i) & 1);
  }
  std::vector<uint8_t> finish() {
    if (used_) out_.push_back(current_);
    used_ = 0;
    return std::move(out_);
  }

 private:
  void put(uint32_t bit) {
    current_ |= static_cast<uint8_t>(bit << used_);
    if (++used_ == 8) out_.push_back(current_), current_ = 0, used_ = 0;
  }
  std::vector<uint8_t> out_;
  uint8_t current_ = 0;
  int used_ = 0;
};

// A literal/length symbol in the fixed Huffman code.
void fixed_symbol(BitWriter& w, int symbol) {
  if (symbol < 144) w.code(0x30 + symbol, 8);
  else if (symbol < 256) w.code(0x190 + symbol - 144, 9);
  else if (symbol < 280) w.code(symbol - 256, 7);
  else w.code(0xC0 + symbol - 280, 8);
}

void length_symbol(BitWriter& w, int length) {
  static constexpr std::array<int, 29> kBase = {3,  4,  5,  6,  7,  8,  9,  10, 11,  13,  15,  17,  19,  23, 27,
                                                31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
  static constexpr std::array<int, 29> kExtra = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2,
                                                 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
  int i = 28;
  while (kBase[i] > length) --i;
  fixed_symbol(w, 257 + i);
  w.bits(length - kBase[i], kExtra[i]);
}

void chunk(std::vector<uint8_t>& png, const char* type, const std::vector<uint8_t>& data) {
  const auto be32 = [&](uint32_t v) {
    for (int s = 24; s >= 0; s -= 8) png.push_back(static_cast<uint8_t>(v >> s));
  };
  be32(static_cast<uint32_t>(data.size()));
  const size_t start = png.size();
  png.insert(png.end(), type, type + 4);
  png.insert(png.end(), data.begin(), data.end());
  be32(crc32(png.data() + start, png.size() - start));
}

}  // namespace

uint32_t crc32(const uint8_t* data, size_t size, uint32_t crc) {
  crc = ~crc;
  for (size_t i = 0; i < size; ++i) {
    crc ^= data[i];
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

std::vector<uint8_t> zlib_runs(const std::vector<uint8_t>& data) {
  BitWriter w;
  w.bits(1, 1);  // the final block
  w.bits(1, 2);  // fixed Huffman codes
  for (size_t i = 0; i < data.size();) {
    fixed_symbol(w, data[i]);
    size_t run = 0;
    while (run < 258 && i + 1 + run < data.size() && data[i + 1 + run] == data[i]) ++run;
    if (run >= 3) {
      length_symbol(w, static_cast<int>(run));
      w.code(0, 5);  // distance 1
      i += 1 + run;
    } else {
      ++i;
    }
  }
  fixed_symbol(w, 256);
  std::vector<uint8_t> out = {0x78, 0x01};
  const std::vector<uint8_t> deflated = w.finish();
  out.insert(out.end(), deflated.begin(), deflated.end());
  const uint32_t adler = adler32(data);
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(adler >> s));
  return out;
}

Raster::Raster(int width, int height, Rgb background)
    : width_(width), height_(height), pixels_(static_cast<size_t>(width) * height, background) {
  check_argument(width >= 1 && height >= 1, "conveyor: a raster needs a positive size, got ", width, "x", height);
}

void Raster::fill(int x, int y, int w, int h, Rgb color) {
  for (int j = std::max(0, y); j < std::min(height_, y + h); ++j) {
    for (int i = std::max(0, x); i < std::min(width_, x + w); ++i) pixels_[static_cast<size_t>(j) * width_ + i] = color;
  }
}

void Raster::text(int x, int y, const std::string& text, Rgb color) {
  for (size_t n = 0; n < text.size(); ++n) {
    const Glyph* g = glyph_of(text[n]);
    if (!g) continue;
    const int left = x + static_cast<int>(n) * kGlyphWidth;
    for (int row = 0; row < 7; ++row) {
      for (int col = 0; col < 5; ++col) {
        if (g->rows[row][col] == '#') fill(left + 2 * col, y + 2 * row, 2, 2, color);
      }
    }
  }
}

std::vector<uint8_t> Raster::png() const {
  std::vector<Rgb> palette;
  std::vector<uint8_t> indices(pixels_.size());
  for (size_t i = 0; i < pixels_.size(); ++i) {
    auto it = std::find(palette.begin(), palette.end(), pixels_[i]);
    if (it == palette.end()) {
      if (palette.size() == 256) throw std::runtime_error("conveyor: a PNG of more than 256 colours");
      palette.push_back(pixels_[i]);
      it = palette.end() - 1;
    }
    indices[i] = static_cast<uint8_t>(it - palette.begin());
  }
  // Each row: filter "Up" (the difference from the row above), so repeated rows are runs of zeros.
  std::vector<uint8_t> filtered;
  filtered.reserve(indices.size() + height_);
  for (int y = 0; y < height_; ++y) {
    filtered.push_back(2);
    for (int x = 0; x < width_; ++x) {
      const size_t i = static_cast<size_t>(y) * width_ + x;
      filtered.push_back(static_cast<uint8_t>(indices[i] - (y > 0 ? indices[i - width_] : 0)));
    }
  }
  std::vector<uint8_t> png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  std::vector<uint8_t> header;
  for (uint32_t v : {static_cast<uint32_t>(width_), static_cast<uint32_t>(height_)}) {
    for (int s = 24; s >= 0; s -= 8) header.push_back(static_cast<uint8_t>(v >> s));
  }
  header.insert(header.end(), {8, 3, 0, 0, 0});  // 8-bit palette indices
  chunk(png, "IHDR", header);
  std::vector<uint8_t> plte;
  for (const Rgb& c : palette) plte.insert(plte.end(), {c.r, c.g, c.b});
  chunk(png, "PLTE", plte);
  chunk(png, "IDAT", zlib_runs(filtered));
  chunk(png, "IEND", {});
  return png;
}

}  // namespace conveyor
