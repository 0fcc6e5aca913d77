#pragma once
// Timelines: a step drawn as one row per stage, forwards and backwards in two
// colours with their micro-batch numbers, idle time as the grey between them;
// a schedule's gathers and gradient reductions (sharding actions) in a strip
// under their worker's row.
// Several blocks share one time axis, so a prediction drawn above the
// measured step shows where the two part. Written as SVG, which any browser
// shows and any converter turns into a bitmap.

#include "plugin/core/step_result.h"
#include "schedules/simulate.h"

#include <cstdint>
#include <string>
#include <vector>

namespace conveyor {

struct TimelineBar {
  schedules::Action action;
  double start = 0, end = 0;  // seconds since the step began
};

struct TimelineBlock {
  std::string title;                         // "predicted: 0.215 s, bubble 20.1%"
  std::vector<std::vector<TimelineBar>> rows;  // per stage, or per worker
  std::string row_name = "stage";              // what a row is: "stage", or "worker" with virtual stages
  // Per row: its sharding actions (gathers, reductions), drawn as a thin
  // strip under the row. Empty: none.
  std::vector<std::vector<schedules::ShardTiming>> sharding;
};

TimelineBlock timeline_block(const schedules::Simulation& simulation, const std::string& title);
// Throws std::invalid_argument when the step has no trace (PipelineOptions::trace off).
TimelineBlock timeline_block(const StepResult& step, const std::string& title);

std::string timeline_svg(const std::vector<TimelineBlock>& blocks);
// Written atomically; `path` must end in ".svg" (std::invalid_argument names the
// ways to a PNG otherwise).
void write_timeline(const std::string& path, const std::vector<TimelineBlock>& blocks);

// --- the drawing, as rectangles and text --------------------------------------
struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
  friend bool operator==(const Rgb&, const Rgb&) = default;
};
struct SceneRect {
  int x = 0, y = 0, w = 0, h = 0;
  Rgb color;
};
struct SceneText {
  int x = 0, y = 0;  // top left
  std::string text;
  Rgb color;
  bool centred = false;  // x is the centre
};
struct Scene {
  int width = 0, height = 0;
  std::vector<SceneRect> rects;  // drawn in order
  std::vector<SceneText> texts;  // over the rectangles, in monospace, kGlyphWidth x kGlyphHeight a character
};
constexpr int kGlyphWidth = 12, kGlyphHeight = 14;  // a character's cell in the scene
Scene timeline_scene(const std::vector<TimelineBlock>& blocks);

}  // namespace conveyor
