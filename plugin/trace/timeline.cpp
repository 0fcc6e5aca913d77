#include "plugin/trace/timeline.h"

#include "plugin/support/atomic_file.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>
#include <stdexcept>

namespace conveyor {

namespace {

constexpr int kWidth = 1000, kMinLeft = 100, kRight = 20, kRow = 26, kGap = 4, kTitle = 24, kAxis = 30;
constexpr int kLink = 8;  // the sharding strip's height
constexpr Rgb kBackground{255, 255, 255}, kIdle{232, 232, 232}, kForward{76, 120, 168}, kBackward{245, 133, 24},
    kInk{40, 40, 40}, kOnBar{255, 255, 255}, kGather{84, 162, 75}, kReduce{178, 121, 162};

bool has_sharding(const TimelineBlock& b) {
  return std::any_of(b.sharding.begin(), b.sharding.end(), [](const auto& row) { return !row.empty(); });
}

double end_of(const TimelineBlock& b) {
  double end = 0;
  for (const auto& row : b.rows) {
    for (const auto& bar : row) end = std::max(end, bar.end);
  }
  for (const auto& row : b.sharding) {
    for (const auto& bar : row) end = std::max(end, bar.end);
  }
  return end;
}

// A round tick spacing giving about `count` ticks over `span` seconds.
double tick_step(double span, int count) {
  const double raw = span / count;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * power >= raw) return m * power;
  }
  return 10 * power;
}

std::string milliseconds(double seconds) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(seconds < 0.01 ? 1 : 0) << seconds * 1e3 << " ms";
  return os.str();
}

std::string hex(const Rgb& c) {
  std::ostringstream os;
  os << "#" << std::hex << std::setfill('0') << std::setw(2) << int(c.r) << std::setw(2) << int(c.g) << std::setw(2)
     << int(c.b);
  return os.str();
}

std::string escaped(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else out += c;
  }
  return out;
}

}  // namespace

TimelineBlock timeline_block(const schedules::Simulation& sim, const std::string& title) {
  TimelineBlock block{title, {}};
  // The simulator's rows are its workers: stages, unless a worker runs several.
  if (sim.busy.size() != sim.stage_busy.size()) block.row_name = "worker";
  for (const auto& stage : sim.timeline) {
    block.rows.emplace_back();
    for (const auto& t : stage) block.rows.back().push_back({t.action, t.start, t.end});
  }
  block.sharding = sim.sharding;
  return block;
}

TimelineBlock timeline_block(const StepResult& step, const std::string& title) {
  bool any = false;
  for (const auto& row : step.trace) any = any || !row.empty();
  if (!any) {
    throw std::invalid_argument("conveyor: the step has no trace to draw: build the pipeline with "
                                "PipelineOptions().trace(true) (the default)");
  }
  TimelineBlock block{title, {}};
  for (const auto& stage : step.trace) {
    block.rows.emplace_back();
    for (const auto& e : stage) block.rows.back().push_back({e.action, e.start_us * 1e-6, e.end_us * 1e-6});
  }
  return block;
}

Scene timeline_scene(const std::vector<TimelineBlock>& blocks) {
  if (blocks.empty()) throw std::invalid_argument("conveyor: a timeline needs at least one step to draw");
  double span = 0;
  for (const auto& b : blocks) span = std::max(span, end_of(b));
  if (span <= 0) span = 1e-3;
  // The rows' labels ("stage 3", "worker 12") fit left of the bars.
  int left = kMinLeft;
  for (const auto& b : blocks) {
    const std::string widest = b.row_name + " " + std::to_string(b.rows.size());
    left = std::max(left, 16 + kGlyphWidth * static_cast<int>(widest.size()));
  }
  const double px_per_second = (kWidth - left - kRight) / span;
  const auto x_of = [&](double t) { return left + static_cast<int>(std::lround(t * px_per_second)); };
  Scene scene;
  scene.width = kWidth;
  int y = 8;
  for (const auto& b : blocks) {
    scene.texts.push_back({8, y + 4, b.title, kInk, false});
    y += kTitle;
    for (size_t k = 0; k < b.rows.size(); ++k) {
      scene.texts.push_back({8, y + (kRow - kGlyphHeight) / 2, b.row_name + " " + std::to_string(k), kInk, false});
      scene.rects.push_back({left, y, x_of(span) - left, kRow, kIdle});
      for (const auto& bar : b.rows[k]) {
        const int x0 = x_of(bar.start), x1 = std::max(x_of(bar.end), x0 + 1);
        const bool fwd = bar.action.kind == schedules::ActionKind::kForward;
        scene.rects.push_back({x0, y, x1 - x0, kRow, fwd ? kForward : kBackward});
        const std::string label = std::to_string(bar.action.microbatch);
        if (x1 - x0 >= static_cast<int>(label.size()) * kGlyphWidth + 4) {
          scene.texts.push_back({(x0 + x1) / 2, y + (kRow - kGlyphHeight) / 2, label, kOnBar, true});
        }
      }
      y += kRow;
      if (k < b.sharding.size() && has_sharding(b)) {
        // The worker's link: gathers and reductions (a RESHARD takes no time: not drawn).
        y += 1;
        for (const auto& bar : b.sharding[k]) {
          if (bar.action.kind == schedules::ShardKind::kReshard) continue;
          const int x0 = x_of(bar.start), x1 = std::max(x_of(bar.end), x0 + 1);
          scene.rects.push_back(
              {x0, y, x1 - x0, kLink, bar.action.kind == schedules::ShardKind::kUnshard ? kGather : kReduce});
        }
        y += kLink;
      }
      y += kGap;
    }
    y += kGap * 2;
  }
  // The time axis, and a legend.
  scene.rects.push_back({left, y, x_of(span) - left, 1, kInk});
  const double step = tick_step(span, 6);
  for (double t = 0; t <= span * 1.0001; t += step) {
    scene.rects.push_back({x_of(t), y, 1, 5, kInk});
    scene.texts.push_back({x_of(t), y + 8, milliseconds(t), kInk, true});
  }
  y += kAxis - 4;
  scene.rects.push_back({left, y + 2, 12, 12, kForward});
  scene.texts.push_back({left + 18, y + 1, "forward", kInk, false});
  scene.rects.push_back({left + 130, y + 2, 12, 12, kBackward});
  scene.texts.push_back({left + 148, y + 1, "backward (n: micro-batch)", kInk, false});
  scene.rects.push_back({left + 470, y + 2, 12, 12, kIdle});
  scene.texts.push_back({left + 488, y + 1, "idle", kInk, false});
  if (std::any_of(blocks.begin(), blocks.end(), has_sharding)) {
    y += kGlyphHeight + 6;
    scene.rects.push_back({left, y + 2, 12, 12, kGather});
    scene.texts.push_back({left + 18, y + 1, "UNSHARD (gather)", kInk, false});
    scene.rects.push_back({left + 250, y + 2, 12, 12, kReduce});
    scene.texts.push_back({left + 268, y + 1, "REDUCE_GRAD (reduce across replicas)", kInk, false});
  }
  scene.height = y + kGlyphHeight + 8;
  return scene;
}

std::string timeline_svg(const std::vector<TimelineBlock>& blocks) {
  const Scene scene = timeline_scene(blocks);
  std::ostringstream os;
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << scene.width << "\" height=\"" << scene.height
     << "\" viewBox=\"0 0 " << scene.width << " " << scene.height << "\">\n";
  os << "<rect width=\"100%\" height=\"100%\" fill=\"" << hex(kBackground) << "\"/>\n";
  for (const auto& r : scene.rects) {
    os << "<rect x=\"" << r.x << "\" y=\"" << r.y << "\" width=\"" << r.w << "\" height=\"" << r.h << "\" fill=\""
       << hex(r.color) << "\"/>\n";
  }
  for (const auto& t : scene.texts) {
    os << "<text x=\"" << t.x << "\" y=\"" << t.y + kGlyphHeight - 2 << "\" fill=\"" << hex(t.color)
       << "\" font-family=\"monospace\" font-size=\"15\"" << (t.centred ? " text-anchor=\"middle\"" : "") << ">"
       << escaped(t.text) << "</text>\n";
  }
  os << "</svg>\n";
  return os.str();
}

void write_timeline(const std::string& path, const std::vector<TimelineBlock>& blocks) {
  const auto ends_with = [&](const std::string& suffix) {
    return path.size() >= suffix.size() && path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (!ends_with(".svg")) {
    throw std::invalid_argument("conveyor: timelines are drawn as SVG, so '" + path +
                                "' must end in .svg; for a PNG, convert the SVG (rsvg-convert, from Debian's "
                                "librsvg2-bin) or, from Python, draw StepResult.trace with matplotlib");
  }
  const std::string svg = timeline_svg(blocks);
  write_atomically(path, [&](std::ostream& out) { out << svg; });
}

void StepResult::write_timeline(const std::string& path) const {
  conveyor::write_timeline(path, {timeline_block(*this, "measured: " + milliseconds(wall_seconds) + ", bubble " +
                                                            std::to_string(static_cast<int>(std::lround(
                                                                100 * bubble_fraction))) + "%")});
}

}  // namespace conveyor
