//! SVG charts of benchmark results (plotters): lines over numeric axes
//! (log scales for figures spanning decades) and grouped bars over
//! categories. The legend is drawn in its own column right of the plot,
//! so it never covers data.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

const SIZE: (u32, u32) = (960, 540);
/// Width of the legend column.
const LEGEND_W: u32 = 190;

/// A named line: (x, y) points.
pub type Series = (String, Vec<(f64, f64)>);

/// A named bar series: (category, value) in category order.
pub type Bars = (String, Vec<(String, f64)>);

fn color(i: usize) -> RGBColor {
    COLORS[i % COLORS.len()]
}

/// A tick label that tells neighbouring ticks apart: at most three
/// significant digits, no trailing zeros.
fn tick(v: f64) -> String {
    let a = v.abs();
    let digits = if a >= 100.0 || a == 0.0 {
        0
    } else if a >= 10.0 {
        1
    } else if a >= 1.0 {
        2
    } else {
        3
    };
    let s = format!("{v:.digits$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

fn legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    names: &[&str],
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    for (i, name) in names.iter().enumerate() {
        let y = 60 + 24 * i as i32;
        area.draw(&Rectangle::new(
            [(8, y - 6), (28, y + 6)],
            color(i).filled(),
        ))?;
        area.draw(&Text::new(
            name.to_string(),
            (34, y - 7),
            ("sans-serif", 15),
        ))?;
    }
    Ok(())
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// A titled white canvas: the whole, the plot area and the legend column.
fn canvas<'a>(path: &'a Path, title: &str) -> Result<(Area<'a>, Area<'a>, Area<'a>), String> {
    let err = |e: &dyn std::fmt::Display| format!("chart {}: {e}", path.display());
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let inner = root
        .titled(title, ("sans-serif", 20))
        .map_err(|e| err(&e))?;
    let (plot, side) = inner.split_horizontally(SIZE.0 - LEGEND_W);
    Ok((root, plot, side))
}

/// Draws named series of (x, y) points as lines with markers; both axes on
/// a log scale if `log` (all values must then be positive).
pub fn lines(
    path: &Path,
    title: &str,
    xlabel: &str,
    ylabel: &str,
    series: &[Series],
    log: bool,
) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| format!("chart {}: {e}", path.display());
    let pts = || series.iter().flat_map(|s| s.1.iter().copied());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for (x, y) in pts() {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        return Err(err(&"no data"));
    }
    if log && (x0 <= 0.0 || y0 <= 0.0) {
        return Err(err(&"log scale needs positive values"));
    }
    let (root, plot, side) = canvas(path, title)?;
    let mut builder = ChartBuilder::on(&plot);
    builder
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(64);
    let names: Vec<&str> = series.iter().map(|s| s.0.as_str()).collect();
    // The two coordinate kinds are different types: one body for both.
    macro_rules! draw {
        ($ch:expr) => {{
            let mut ch = $ch;
            ch.configure_mesh()
                .x_desc(xlabel)
                .y_desc(ylabel)
                .x_label_formatter(&|v| tick(*v))
                .y_label_formatter(&|v| tick(*v))
                .draw()
                .map_err(|e| err(&e))?;
            for (i, (_, data)) in series.iter().enumerate() {
                let c = color(i);
                ch.draw_series(LineSeries::new(data.iter().copied(), c.stroke_width(2)))
                    .map_err(|e| err(&e))?;
                ch.draw_series(data.iter().map(|&p| Circle::new(p, 4, c.filled())))
                    .map_err(|e| err(&e))?;
            }
        }};
    }
    if log {
        draw!(builder
            .build_cartesian_2d(
                (x0 / 1.2..x1 * 1.2).log_scale(),
                (y0 / 1.5..y1 * 1.5).log_scale()
            )
            .map_err(|e| err(&e))?);
    } else {
        draw!(builder
            .build_cartesian_2d(
                x0..if x1 > x0 { x1 } else { x0 + 1.0 },
                0.0..(y1 * 1.1).max(1e-9)
            )
            .map_err(|e| err(&e))?);
    }
    legend(&side, &names).map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// Draws grouped bars: one group per category, one bar per series.
pub fn bars(
    path: &Path,
    title: &str,
    xlabel: &str,
    ylabel: &str,
    series: &[Bars],
) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| format!("chart {}: {e}", path.display());
    let cats: Vec<String> = series
        .first()
        .map(|s| s.1.iter().map(|(c, _)| c.clone()).collect())
        .unwrap_or_default();
    if cats.is_empty() {
        return Err(err(&"no data"));
    }
    let y1 = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.1))
        .fold(0.0f64, f64::max);
    let (root, plot, side) = canvas(path, title)?;
    let n = cats.len() as i32;
    let mut ch = ChartBuilder::on(&plot)
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(64)
        // A segmented integer range covers its end too: 0..n-1 is n bins.
        .build_cartesian_2d((0..n - 1).into_segmented(), 0.0..(y1 * 1.1).max(1e-9))
        .map_err(|e| err(&e))?;
    ch.configure_mesh()
        .disable_x_mesh()
        .x_desc(xlabel)
        .y_desc(ylabel)
        .x_labels(cats.len())
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => {
                cats.get(*i as usize).cloned().unwrap_or_default()
            }
            SegmentValue::Last => String::new(),
        })
        .y_label_formatter(&|v| tick(*v))
        .draw()
        .map_err(|e| err(&e))?;
    // Bars of one group share the segment, side by side, with a gap.
    let seg_px = ch.plotting_area().dim_in_pixel().0 as f64 / n as f64;
    let k = series.len().max(1) as f64;
    let gap = seg_px * 0.1;
    let w = (seg_px - 2.0 * gap) / k;
    for (j, (_, data)) in series.iter().enumerate() {
        let c = color(j);
        let left = (gap + j as f64 * w) as u32;
        let right = (gap + (k - 1.0 - j as f64) * w) as u32;
        ch.draw_series(data.iter().enumerate().map(|(i, &(_, y))| {
            let mut r = Rectangle::new(
                [
                    (SegmentValue::Exact(i as i32), 0.0),
                    (SegmentValue::Exact(i as i32 + 1), y),
                ],
                c.filled(),
            );
            r.set_margin(0, 0, left, right);
            r
        }))
        .map_err(|e| err(&e))?;
    }
    let names: Vec<&str> = series.iter().map(|s| s.0.as_str()).collect();
    legend(&side, &names).map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(svg: &str) -> Vec<String> {
        svg.split("<text")
            .skip(1)
            .filter_map(|t| {
                let body = &t[t.find('>')? + 1..];
                Some(body[..body.find("</text>")?].trim().to_string())
            })
            .collect()
    }

    #[test]
    fn ticks_tell_neighbours_apart() {
        let v = [
            0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 10.0, 15.0, 100.0, 150.0, 2000.0,
        ];
        let labels: Vec<String> = v.iter().map(|&x| tick(x)).collect();
        let mut u = labels.clone();
        u.sort();
        u.dedup();
        assert_eq!(u.len(), labels.len(), "{labels:?}");
        assert_eq!(tick(1.5), "1.5");
        assert_eq!(tick(2000.0), "2000");
    }

    #[test]
    fn bars_label_each_category_once_and_lines_draw_log_axes() {
        let dir = std::env::temp_dir().join(format!("vkbench-chart-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cats = ["1 KiB", "4 KiB", "16 KiB", "64 KiB"];
        let bars_path = dir.join("bars.svg");
        let data: Vec<(String, f64)> = cats.iter().map(|c| (c.to_string(), 10.0)).collect();
        bars(&bars_path, "t", "x", "y", &[("s".into(), data)]).unwrap();
        let t = texts(&std::fs::read_to_string(&bars_path).unwrap());
        for c in cats {
            assert_eq!(
                t.iter().filter(|x| x.as_str() == c).count(),
                1,
                "{c}: {t:?}"
            );
        }
        let lines_path = dir.join("lines.svg");
        let s: Vec<Series> = vec![("a".into(), vec![(32.0, 0.6), (8192.0, 120.0)])];
        lines(&lines_path, "t", "x", "y", &s, true).unwrap();
        assert!(lines(
            &lines_path,
            "t",
            "x",
            "y",
            &[("z".into(), vec![(0.0, 1.0)])],
            true
        )
        .is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
