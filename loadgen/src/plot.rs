//! `--plot`: output throughput and TTFT p50/p99 against concurrency, as a PNG.
//!
//! Text needs a TrueType font, registered at run time from the system (Debian's
//! DejaVu by default, `$PAGODA_PLOT_FONT` to override). Without one the chart is
//! drawn without any text rather than failing.

use super::report::LevelSummary;
use plotters::prelude::*;
use std::path::Path;
use std::sync::OnceLock;

const FONT_CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/freefont/FreeSans.ttf",
];

/// Registers a system font as "sans-serif" once; false when none loads.
fn font_available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        let env = std::env::var("PAGODA_PLOT_FONT").ok();
        for p in env
            .iter()
            .map(String::as_str)
            .chain(FONT_CANDIDATES.iter().copied())
        {
            if let Ok(bytes) = std::fs::read(p) {
                // The font registry wants 'static bytes; one font per process.
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return true;
                }
            }
        }
        false
    })
}

/// Draws two panels side by side into `path` (PNG).
pub fn draw(path: &Path, levels: &[LevelSummary], title: &str) -> anyhow::Result<()> {
    anyhow::ensure!(!levels.is_empty(), "nothing to plot");
    let text = font_available();
    if !text {
        eprintln!(
            "bench serve: no TrueType font found (set PAGODA_PLOT_FONT); plotting without text"
        );
    }
    let root = BitMapBackend::new(path, (1200, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let root = if text {
        root.titled(&format!("pagoda bench serve: {title}"), ("sans-serif", 22))
            .map_err(err)?
    } else {
        root
    };
    let (left, right) = root.split_horizontally(600);

    // Log-scaled concurrency axis, padded so a single level still has a range.
    let cmin = levels.iter().map(|l| l.concurrency).min().unwrap_or(1) as f64;
    let cmax = levels.iter().map(|l| l.concurrency).max().unwrap_or(1) as f64;
    let xr = (cmin / 1.5).max(0.5)..(cmax * 1.5);

    let tput: Vec<(f64, f64)> = levels
        .iter()
        .map(|l| (l.concurrency as f64, l.output_throughput))
        .collect();
    let ymax = tput.iter().map(|p| p.1).fold(1.0, f64::max) * 1.15;
    panel(
        &left,
        text,
        "output tok/s",
        xr.clone(),
        0.0..ymax,
        &[("output tok/s", &tput, BLUE)],
    )?;

    let p50: Vec<(f64, f64)> = levels
        .iter()
        .map(|l| (l.concurrency as f64, l.ttft_ms.p50))
        .collect();
    let p99: Vec<(f64, f64)> = levels
        .iter()
        .map(|l| (l.concurrency as f64, l.ttft_ms.p99))
        .collect();
    let ymax = p99.iter().chain(&p50).map(|p| p.1).fold(1.0, f64::max) * 1.15;
    panel(
        &right,
        text,
        "TTFT (ms)",
        xr,
        0.0..ymax,
        &[("TTFT p50", &p50, GREEN), ("TTFT p99", &p99, RED)],
    )?;
    root.present().map_err(err)?;
    Ok(())
}

/// A named series of (concurrency, value) points and its colour.
type Series<'a> = (&'a str, &'a Vec<(f64, f64)>, RGBColor);

type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;

fn panel(
    area: &Area<'_>,
    text: bool,
    ylabel: &str,
    xr: std::ops::Range<f64>,
    yr: std::ops::Range<f64>,
    series: &[Series<'_>],
) -> anyhow::Result<()> {
    let mut b = ChartBuilder::on(area);
    b.margin(15);
    if text {
        b.x_label_area_size(40).y_label_area_size(70);
    }
    let mut chart = b.build_cartesian_2d(xr.log_scale(), yr).map_err(err)?;
    {
        let mut mesh = chart.configure_mesh();
        if text {
            mesh.x_desc("concurrency")
                .y_desc(ylabel)
                .x_label_formatter(&|x| format!("{x:.0}"));
        } else {
            mesh.x_labels(0).y_labels(0);
        }
        mesh.draw().map_err(err)?;
    }
    for (name, pts, color) in series {
        let color = *color;
        let line = chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
            .map_err(err)?;
        if text {
            line.label(*name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        }
        chart
            .draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled())))
            .map_err(err)?;
    }
    if text {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
    }
    Ok(())
}

fn err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow::anyhow!("plot: {e}")
}
