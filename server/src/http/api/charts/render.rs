//! Drawing a chart with plotters, as SVG text or PNG bytes, on the axes of `axis.rs`.

use super::axis::Axis;
use super::layout::XUnit;
use super::ChartError;
use crate::http::palette;
use plotters::prelude::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Svg,
    Png,
}

impl Format {
    /// Splits `train/loss.svg` into (`train/loss`, Svg).
    pub fn split(file: &str) -> Option<(&str, Format)> {
        if let Some(k) = file.strip_suffix(".svg") {
            Some((k, Format::Svg))
        } else {
            file.strip_suffix(".png").map(|k| (k, Format::Png))
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Svg => "image/svg+xml",
            Format::Png => "image/png",
        }
    }
}

/// One line of a chart.
pub struct Line {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// What to draw: the lines and how their axes read.
pub struct Chart {
    pub title: String,
    pub lines: Vec<Line>,
    pub log_y: bool,
    pub x_unit: XUnit,
}

/// The `i`-th line's colour: the dashboard's one palette, as a plotters colour.
fn series_color(i: usize) -> RGBColor {
    let (r, g, b) = palette::rgb(i);
    RGBColor(r, g, b)
}

/// Renders to SVG text or PNG bytes. Runs on the blocking pool from handlers: text layout and
/// rasterising are CPU work.
pub fn render(chart: &Chart, size: (u32, u32), format: Format) -> Result<Vec<u8>, ChartError> {
    match format {
        Format::Svg => {
            let mut out = String::new();
            {
                let backend = SVGBackend::with_string(&mut out, size);
                draw(backend.into_drawing_area(), chart, size)?;
            }
            Ok(out.into_bytes())
        }
        Format::Png => {
            let mut rgb = vec![0u8; size.0 as usize * size.1 as usize * 3];
            {
                let backend = BitMapBackend::with_buffer(&mut rgb, size);
                draw(backend.into_drawing_area(), chart, size)?;
            }
            let mut png = Vec::new();
            image::ImageEncoder::write_image(
                image::codecs::png::PngEncoder::new(&mut png),
                &rgb,
                size.0,
                size.1,
                image::ColorType::Rgb8,
            )
            .map_err(|e| ChartError::Render(e.to_string()))?;
            Ok(png)
        }
    }
}

/// The points a chart can place: finite, and positive on a log axis.
fn drawable(p: &(f64, f64), log_y: bool) -> bool {
    p.0.is_finite() && p.1.is_finite() && (!log_y || p.1 > 0.0)
}

/// A line's drawable points as runs between NaN points (each NaN is a gap).
fn segments(points: &[(f64, f64)], log_y: bool) -> Vec<Vec<(f64, f64)>> {
    points
        .split(|p| p.1.is_nan())
        .map(|run| run.iter().copied().filter(|p| drawable(p, log_y)).collect())
        .filter(|run: &Vec<(f64, f64)>| !run.is_empty())
        .collect()
}

/// The x and y axes for the lines' drawable points; `width` sets how many x ticks fit.
pub fn axes(chart: &Chart, width: u32) -> (Axis, Axis) {
    let mut x = (f64::INFINITY, f64::NEG_INFINITY);
    let mut y = (f64::INFINITY, f64::NEG_INFINITY);
    for p in chart.lines.iter().flat_map(|l| l.points.iter()) {
        if drawable(p, chart.log_y) {
            x = (x.0.min(p.0), x.1.max(p.0));
            y = (y.0.min(p.1), y.1.max(p.1));
        }
    }
    if !x.0.is_finite() {
        x = (0.0, 1.0);
    }
    let x_ticks = (width as usize / 100).clamp(2, 12);
    (
        Axis::steps(x.0, x.1, x_ticks),
        Axis::values(y.0, y.1, chart.log_y),
    )
}

fn draw<DB: DrawingBackend>(
    area: DrawingArea<DB, plotters::coord::Shift>,
    chart: &Chart,
    size: (u32, u32),
) -> Result<(), ChartError>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| ChartError::Render(e.to_string());
    area.fill(&WHITE).map_err(err)?;
    let (x_axis, y_axis) = axes(chart, size.0);
    // The bottom of the value axis, where NaN marks sit.
    let y_lo = y_axis.lo;
    let ink = RGBColor(0x1c, 0x24, 0x30);
    let grid = RGBColor(0xe7, 0xea, 0xef);
    let axis = RGBColor(0x5f, 0x6b, 0x7a);
    // Room for the widest y label (about 7 px a character at 12 px), never clipped.
    let widest = y_axis.labels.iter().map(|l| l.len()).max().unwrap_or(1) as u32;
    let mut builder = ChartBuilder::on(&area);
    builder
        .caption(&chart.title, ("sans-serif", 18).into_font().color(&ink))
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(16 + 7 * widest);
    let mut plot = builder.build_cartesian_2d(x_axis, y_axis).map_err(err)?;
    plot.configure_mesh()
        .light_line_style(grid)
        .bold_line_style(grid)
        .axis_style(axis)
        .label_style(("sans-serif", 12).into_font().color(&axis))
        .axis_desc_style(("sans-serif", 12).into_font().color(&axis))
        .x_desc(chart.x_unit.caption())
        .draw()
        .map_err(err)?;
    let nan_mark = RGBColor(0xc0, 0x1c, 0x28);
    for (i, line) in chart.lines.iter().enumerate() {
        let color = series_color(i);
        let legend = move |(x, y): (i32, i32)| {
            PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(3))
        };
        let mut labelled = false;
        for pts in segments(&line.points, chart.log_y) {
            let series = if pts.len() == 1 {
                // A lone point has no segment to stroke: a dot shows it.
                plot.draw_series(pts.into_iter().map(|p| Circle::new(p, 4, color.filled())))
                    .map_err(err)?
            } else {
                plot.draw_series(LineSeries::new(pts, color.stroke_width(2)))
                    .map_err(err)?
            };
            if !labelled {
                series.label(line.label.clone()).legend(legend);
                labelled = true;
            }
        }
        // A NaN point is a gap in the line, marked by a triangle on the x axis.
        let nans = line
            .points
            .iter()
            .filter(|p| p.0.is_finite() && p.1.is_nan())
            .map(|p| TriangleMarker::new((p.0, y_lo), 5, nan_mark.filled()));
        let marks = plot.draw_series(nans).map_err(err)?;
        if !labelled {
            marks.label(line.label.clone()).legend(legend);
        }
    }
    if chart.lines.len() > 1 || chart.lines.iter().any(|l| !l.label.is_empty()) {
        plot.configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(grid)
            .label_font(("sans-serif", 12).into_font().color(&ink))
            .draw()
            .map_err(err)?;
    }
    area.present().map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chart(points: Vec<(f64, f64)>, log_y: bool) -> Chart {
        Chart {
            title: "t".into(),
            lines: vec![Line {
                label: String::new(),
                points,
            }],
            log_y,
            x_unit: XUnit::Step,
        }
    }

    fn svg(c: &Chart) -> String {
        let bytes = render(c, (640, 300), Format::Svg).unwrap_or_default();
        String::from_utf8(bytes).unwrap_or_default()
    }

    /// The texts of an SVG's `<text>` elements, trimmed.
    fn texts(svg: &str) -> Vec<String> {
        svg.split("<text")
            .skip(1)
            .filter_map(|t| t.split_once('>'))
            .filter_map(|(_, rest)| rest.split_once("</text>"))
            .map(|(text, _)| text.trim().to_string())
            .collect()
    }

    #[test]
    fn an_all_zero_series_is_labelled_with_zero_not_rounding_noise() {
        let c = chart((0..10).map(|s| (s as f64, 0.0)).collect(), false);
        let text = svg(&c);
        let labels = texts(&text);
        assert!(
            !text.contains("e-16"),
            "rounding noise in a label: {labels:?}"
        );
        for l in ["-1", "-0.5", "0", "0.5", "1"] {
            assert!(
                labels.iter().any(|t| t == l),
                "label {l} missing: {labels:?}"
            );
        }
        assert!(text.contains("<polyline"), "the line is drawn");
    }

    #[test]
    fn a_single_point_is_drawn_as_a_dot_on_whole_step_ticks() {
        let c = chart(vec![(40.0, 2.5)], false);
        let (x, _) = axes(&c, 640);
        assert_eq!(x.labels, ["39", "40", "41"]);
        let text = svg(&c);
        assert!(text.contains("<circle"), "a dot for the point");
    }

    #[test]
    fn a_log_chart_has_y_labels_in_both_formats() {
        let c = chart(
            (1..200).map(|s| (s as f64, 10.0 / s as f64)).collect(),
            true,
        );
        let (_, y) = axes(&c, 640);
        assert_eq!(y.labels, ["0.1", "1", "10"]);
        let labels = texts(&svg(&c));
        for l in &y.labels {
            assert!(labels.contains(l), "label {l} missing: {labels:?}");
        }
        let png = render(&c, (640, 300), Format::Png).unwrap_or_default();
        // The PNG has ink left of the plot, where the y labels go (the axis line sits at the
        // label area's right edge, so columns well left of it hold only label text).
        let img = image::load_from_memory(&png).map(|i| i.to_rgb8());
        let img = img.unwrap_or_else(|e| panic!("the PNG decodes: {e}"));
        let (w, h) = img.dimensions();
        assert_eq!((w, h), (640, 300));
        let inked = (14..46)
            .flat_map(|x| (30..260).map(move |y| (x, y)))
            .filter(|(x, y)| img.get_pixel(*x, *y).0.iter().any(|c| *c < 160))
            .count();
        assert!(inked > 20, "no y labels in the PNG ({inked} dark pixels)");
    }

    #[test]
    fn titles_in_any_script_render_to_png() {
        let mut c = chart(vec![(0.0, 1.0), (1.0, 2.0)], false);
        c.title = "損失 · 🚀 · ∑ · \u{202e}rtl · \u{fffd}".into();
        let png = render(&c, (320, 200), Format::Png);
        assert!(png.is_ok_and(|p| p.starts_with(b"\x89PNG")));
    }

    #[test]
    fn a_nan_point_is_a_marked_gap_in_the_line() {
        let points = (0..10)
            .map(|s| (s as f64, if s == 5 { f64::NAN } else { s as f64 }))
            .collect();
        let c = chart(points, false);
        let (_, y) = axes(&c, 640);
        assert_eq!(
            (y.lo <= 0.0, y.hi >= 9.0),
            (true, true),
            "NaN leaves the range alone"
        );
        let text = svg(&c);
        let whole = svg(&chart(
            (0..10).map(|s| (s as f64, s as f64)).collect(),
            false,
        ));
        // Grid lines are polylines too: the gap adds exactly one line.
        let lines = |svg: &str| svg.matches("<polyline").count();
        assert_eq!(
            lines(&text),
            lines(&whole) + 1,
            "one line each side of the gap"
        );
        assert!(
            text.to_ascii_lowercase().contains("#c01c28"),
            "the NaN is marked"
        );
        assert!(!whole.to_ascii_lowercase().contains("#c01c28"));
    }

    #[test]
    fn a_system_metric_chart_says_its_x_axis_is_seconds() {
        let mut c = chart(vec![(0.0, 1.0), (5.0, 2.0)], false);
        c.x_unit = XUnit::Seconds;
        assert!(svg(&c).contains("time since start (s)"));
    }
}
