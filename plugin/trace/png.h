#pragma once
// A small RGB raster that writes itself as a PNG, with a built-in 5x7 font,
// so that pictures need no image library: the pixels go through a palette,
// PNG's "Up" filter and a deflate stream of runs (fixed Huffman codes), which
// suits drawings of flat rectangles.

#include "plugin/trace/timeline.h"

#include <cstdint>
#include <string>
#include <vector>

namespace conveyor {

class Raster {
 public:
  Raster(int width, int height, Rgb background);
  void fill(int x, int y, int w, int h, Rgb color);  // clipped to the raster
  // Text in the 5x7 font at twice its size (cells of kGlyphWidth x kGlyphHeight);
  // letters are drawn as capitals, characters without a glyph as blanks.
  void text(int x, int y, const std::string& text, Rgb color);
  // Throws std::runtime_error beyond 256 colours.
  std::vector<uint8_t> png() const;

  int width() const { return width_; }
  int height() const { return height_; }
  Rgb at(int x, int y) const { return pixels_[static_cast<size_t>(y) * width_ + x]; }

 private:
  int width_, height_;
  std::vector<Rgb> pixels_;
};

// The zlib stream (RFC 1950) of `data`: deflate with fixed Huffman codes and
// runs (matches at distance 1), then the Adler-32 checksum.
std::vector<uint8_t> zlib_runs(const std::vector<uint8_t>& data);
uint32_t crc32(const uint8_t* data, size_t size, uint32_t crc = 0);

}  // namespace conveyor
