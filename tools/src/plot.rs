//! A minimal SVG line chart, written by hand (no plotting dependency).

use std::fmt::Write as _;

/// One line of the chart.
#[derive(Clone, Debug)]
pub struct Series {
    /// The legend label.
    pub name: String,
    /// `(x, y)` points, in x order.
    pub points: Vec<(f64, f64)>,
}

/// The chart's text.
#[derive(Clone, Debug)]
pub struct Chart<'a> {
    /// The title above the plot.
    pub title: &'a str,
    /// A second, smaller line under the title.
    pub subtitle: &'a str,
    /// The x axis label.
    pub x_label: &'a str,
    /// The y axis label.
    pub y_label: &'a str,
    /// Whether x is drawn on a log2 scale (thread counts).
    pub log2_x: bool,
}

const PALETTE: [&str; 8] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
];

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A "nice" upper bound and tick step for `0..=max`.
fn nice_axis(max: f64) -> (f64, f64) {
    if max <= 0.0 || !max.is_finite() {
        return (1.0, 0.2);
    }
    let raw = max / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    ((max / step).ceil() * step, step)
}

fn fmt_tick(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.0}k", v / 1000.0)
    } else if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// Renders `series` as an SVG document.
pub fn line_chart(chart: &Chart<'_>, series: &[Series]) -> String {
    let (w, h) = (900.0, 520.0);
    let (left, right, top, bottom) = (80.0, 290.0, 70.0, 60.0);
    let pw = w - left - right;
    let ph = h - top - bottom;
    let xs: Vec<f64> = {
        let mut v: Vec<f64> = series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0))
            .collect();
        v.sort_by(f64::total_cmp);
        v.dedup();
        v
    };
    let tx = |x: f64| if chart.log2_x { x.max(1e-9).log2() } else { x };
    let (x0, x1) = match (xs.first(), xs.last()) {
        (Some(a), Some(b)) if tx(*b) > tx(*a) => (tx(*a), tx(*b)),
        (Some(a), _) => (tx(*a) - 1.0, tx(*a) + 1.0),
        _ => (0.0, 1.0),
    };
    let y_max = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(0.0f64, f64::max);
    let (y_top, y_step) = nice_axis(y_max * 1.05);
    let px = |x: f64| left + (tx(x) - x0) / (x1 - x0) * pw;
    let py = |y: f64| top + ph - (y / y_top) * ph;

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="28" font-size="16" font-weight="bold">{}</text>"#,
        left,
        escape(chart.title)
    );
    let _ = writeln!(
        s,
        r##"<text x="{}" y="48" fill="#555">{}</text>"##,
        left,
        escape(chart.subtitle)
    );
    // Grid and y ticks.
    let mut y = 0.0;
    while y <= y_top + y_step * 0.01 {
        let yy = py(y);
        let _ = writeln!(
            s,
            r##"<line x1="{left}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#ddd"/>"##,
            left + pw
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            left - 8.0,
            yy + 4.0,
            fmt_tick(y)
        );
        y += y_step;
    }
    // X ticks.
    for x in &xs {
        let xx = px(*x);
        let _ = writeln!(
            s,
            r##"<line x1="{xx:.1}" y1="{top}" x2="{xx:.1}" y2="{:.1}" stroke="#eee"/>"##,
            top + ph
        );
        let _ = writeln!(
            s,
            r#"<text x="{xx:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            top + ph + 18.0,
            fmt_tick(*x)
        );
    }
    // Axes.
    let _ = writeln!(
        s,
        r#"<line x1="{left}" y1="{top}" x2="{left}" y2="{:.1}" stroke="black"/>"#,
        top + ph
    );
    let _ = writeln!(
        s,
        r#"<line x1="{left}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="black"/>"#,
        top + ph,
        left + pw,
        top + ph
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        left + pw / 2.0,
        h - 18.0,
        escape(chart.x_label)
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate(22,{:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
        top + ph / 2.0,
        escape(chart.y_label)
    );
    // Series and legend.
    for (i, ser) in series.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let pts: Vec<String> = ser
            .points
            .iter()
            .map(|(x, y)| format!("{:.1},{:.1}", px(*x), py(*y)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
            pts.join(" ")
        );
        for (x, y) in &ser.points {
            let _ = writeln!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{color}"><title>{}: {} threads, {:.0}/s</title></circle>"#,
                px(*x),
                py(*y),
                escape(&ser.name),
                x,
                y
            );
        }
        let ly = top + 10.0 + i as f64 * 22.0;
        let lx = left + pw + 20.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="3"/>"#,
            lx + 24.0
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}">{}</text>"#,
            lx + 30.0,
            ly + 4.0,
            escape(&ser.name)
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_names_every_series_and_escapes_text() {
        let svg = line_chart(
            &Chart {
                title: "a < b",
                subtitle: "",
                x_label: "threads",
                y_label: "ops/s",
                log2_x: true,
            },
            &[
                Series {
                    name: "one".into(),
                    points: vec![(1.0, 10.0), (2.0, 20.0)],
                },
                Series {
                    name: "two & more".into(),
                    points: vec![(1.0, 5.0), (16.0, 50.0)],
                },
            ],
        );
        assert!(svg.starts_with("<svg"), "{svg}");
        assert!(svg.contains("a &lt; b"), "{svg}");
        assert!(svg.contains("two &amp; more"), "{svg}");
        assert_eq!(svg.matches("<polyline").count(), 2);
    }

    #[test]
    fn nice_axis_covers_the_maximum() {
        let (top, step) = nice_axis(1234.0);
        assert!(top >= 1234.0 && step > 0.0, "{top} {step}");
    }
}
