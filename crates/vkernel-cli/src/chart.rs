//! SVG line charts of benchmark results (plotters).

use std::path::Path;

use plotters::prelude::*;

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// A named line: (x, y) points.
pub type Series = (String, Vec<(f64, f64)>);

/// Draws named series of (x, y) points as lines, x on a log scale if `log_x`.
pub fn lines(
    path: &Path,
    title: &str,
    xlabel: &str,
    ylabel: &str,
    series: &[Series],
    log_x: bool,
) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| format!("chart {}: {e}", path.display());
    let pts = series.iter().flat_map(|s| s.1.iter());
    let (mut x0, mut x1, mut y1) = (f64::MAX, f64::MIN, 0.0f64);
    for &(x, y) in pts {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        return Err(err(&"no data"));
    }
    if x0 == x1 {
        x1 = x0 + 1.0;
    }
    let root = SVGBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60);
    let y_range = 0.0..(y1 * 1.1).max(1e-9);
    if log_x {
        let mut ch = builder
            .build_cartesian_2d((x0.max(1e-9)..x1).log_scale(), y_range)
            .map_err(|e| err(&e))?;
        ch.configure_mesh()
            .x_desc(xlabel)
            .y_desc(ylabel)
            .draw()
            .map_err(|e| err(&e))?;
        for (i, (name, data)) in series.iter().enumerate() {
            let c = COLORS[i % COLORS.len()];
            ch.draw_series(LineSeries::new(data.iter().copied(), c.stroke_width(2)))
                .map_err(|e| err(&e))?
                .label(name.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c));
            ch.draw_series(data.iter().map(|&p| Circle::new(p, 3, c.filled())))
                .map_err(|e| err(&e))?;
        }
        ch.configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| err(&e))?;
    } else {
        let mut ch = builder
            .build_cartesian_2d(x0..x1, y_range)
            .map_err(|e| err(&e))?;
        ch.configure_mesh()
            .x_desc(xlabel)
            .y_desc(ylabel)
            .draw()
            .map_err(|e| err(&e))?;
        for (i, (name, data)) in series.iter().enumerate() {
            let c = COLORS[i % COLORS.len()];
            ch.draw_series(LineSeries::new(data.iter().copied(), c.stroke_width(2)))
                .map_err(|e| err(&e))?
                .label(name.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c));
        }
        ch.configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
