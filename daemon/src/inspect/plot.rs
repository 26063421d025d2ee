//! `dsprep inspect DIR --plot FILE.svg`: the ledger as a picture, [`WIDTH`] × [`HEIGHT`] pixels of
//! SVG. Top: each source's realized share of the tokens along the stream (thick: of every token
//! so far; thin: of the last `--every` tokens) with its target dashed (per phase). Bottom: per
//! source, the histogram of its documents' lengths in tokens (log2 buckets, as a share of the
//! source's documents, so sources of different sizes compare). Right, under the legend, for a
//! padded pack (`best_fit`): the windows by how full of real tokens they are.

use super::fill::{FILL_BUCKETS, WindowFill};
use super::mix::{LENGTH_BUCKETS, MixLedger};
use std::fmt::Write;

pub const WIDTH: u32 = 960;
pub const HEIGHT: u32 = 720;

/// Colours of the sources, in recipe order (repeating past ten).
const PALETTE: [&str; 10] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

/// A panel's plotting area, in pixels.
pub(super) struct Area {
    pub(super) left: f64,
    pub(super) top: f64,
    pub(super) width: f64,
    pub(super) height: f64,
}

impl Area {
    pub(super) fn x(&self, fraction: f64) -> f64 {
        self.left + fraction.clamp(0.0, 1.0) * self.width
    }

    pub(super) fn y(&self, fraction: f64) -> f64 {
        self.top + (1.0 - fraction.clamp(0.0, 1.0)) * self.height
    }
}

/// An SVG page of [`WIDTH`] × [`HEIGHT`] on white, `title` at its top (closed by the caller).
pub(super) fn svg_page(title: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        out,
        r#"<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>"#
    );
    let _ = writeln!(
        out,
        r#"<text x="16" y="22" font-size="15">{}</text>"#,
        escape(title)
    );
    out
}

pub fn render_svg(ledger: &MixLedger, title: &str) -> String {
    let mut out = svg_page(title);
    shares_panel(&mut out, ledger);
    lengths_panel(&mut out, ledger);
    legend(&mut out, ledger);
    if ledger.fill.padded {
        fill_panel(&mut out, &ledger.fill);
    }
    out.push_str("</svg>\n");
    out
}

pub(super) fn colour(source: usize) -> &'static str {
    PALETTE[source % PALETTE.len()]
}

fn shares_panel(out: &mut String, ledger: &MixLedger) {
    let area = Area {
        left: 60.0,
        top: 50.0,
        width: 700.0,
        height: 300.0,
    };
    let end = ledger.rows.last().map_or(1, |r| r.tokens).max(1) as f64;
    let top_share = ledger
        .rows
        .iter()
        .flat_map(|r| r.span.iter().chain(&r.total))
        .chain(
            ledger
                .spans
                .iter()
                .flat_map(|s| s.targets.iter().filter(|t| !t.is_nan())),
        )
        .fold(0.0f64, |a, &b| a.max(b));
    let scale = (top_share * 1.1).clamp(0.05, 1.0);
    axes(
        out,
        &area,
        &format!("share of tokens (0 to {:.0} %)", 100.0 * scale),
    );
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle">tokens of the stream (0 to {})</text>"#,
        area.x(0.5),
        area.top + area.height + 30.0,
        end as u64
    );
    for (i, _) in ledger.names.iter().enumerate() {
        for span in ledger.spans.iter().filter(|s| !s.targets[i].is_nan()) {
            let (from, to) = (
                span.from as f64 / end,
                span.to.map_or(1.0, |t| t as f64 / end),
            );
            let y = area.y(span.targets[i] / scale);
            let _ = writeln!(
                out,
                r#"<line x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{}" stroke-dasharray="6 4" stroke-width="1"/>"#,
                area.x(from),
                area.x(to),
                colour(i)
            );
        }
        for (thick, pick) in [(1.0, false), (2.5, true)] {
            let points: Vec<String> = ledger
                .rows
                .iter()
                .map(|r| {
                    let share = if pick { r.total[i] } else { r.span[i] };
                    format!(
                        "{:.1},{:.1}",
                        area.x(r.tokens as f64 / end),
                        area.y(share / scale)
                    )
                })
                .collect();
            let _ = writeln!(
                out,
                r#"<polyline fill="none" stroke="{}" stroke-width="{thick}" stroke-opacity="{}" points="{}"/>"#,
                colour(i),
                if pick { 1.0 } else { 0.45 },
                points.join(" ")
            );
        }
    }
}

fn lengths_panel(out: &mut String, ledger: &MixLedger) {
    let area = Area {
        left: 60.0,
        top: 420.0,
        width: 700.0,
        height: 240.0,
    };
    let used = |k: usize| ledger.lengths.iter().any(|h| h[k] > 0);
    let first = (0..LENGTH_BUCKETS).find(|&k| used(k)).unwrap_or(0);
    let last = (0..LENGTH_BUCKETS).rev().find(|&k| used(k)).unwrap_or(0);
    let buckets = (last - first + 1) as f64;
    let fractions: Vec<Vec<f64>> = ledger
        .lengths
        .iter()
        .map(|h| {
            let docs: u64 = h.iter().sum();
            h.iter()
                .map(|&c| dsprep_mixers::mixer::share(c, docs))
                .collect()
        })
        .collect();
    let top = fractions
        .iter()
        .flatten()
        .fold(0.0f64, |a, &b| a.max(b))
        .max(0.01);
    axes(
        out,
        &area,
        &format!(
            "share of the source's documents (0 to {:.0} %)",
            100.0 * top
        ),
    );
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle">document length in tokens (buckets of powers of 2)</text>"#,
        area.x(0.5),
        area.top + area.height + 30.0
    );
    let sources = ledger.names.len().max(1) as f64;
    let slot = area.width / buckets;
    for k in first..=last {
        let at = (k - first) as f64;
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="10">{}</text>"#,
            area.left + (at + 0.5) * slot,
            area.top + area.height + 14.0,
            1u64 << k
        );
        for (i, f) in fractions.iter().enumerate() {
            if f[k] == 0.0 {
                continue;
            }
            let width = slot * 0.8 / sources;
            let x = area.left + at * slot + slot * 0.1 + i as f64 * width;
            let y = area.y(f[k] / top);
            let _ = writeln!(
                out,
                r#"<rect x="{x:.1}" y="{y:.1}" width="{width:.1}" height="{:.1}" fill="{}"/>"#,
                area.top + area.height - y,
                colour(i)
            );
        }
    }
}

/// The windows by fill, share of the windows per bucket of [`FILL_BUCKETS`].
fn fill_panel(out: &mut String, fill: &WindowFill) {
    let area = Area {
        left: 790.0,
        top: 440.0,
        width: 150.0,
        height: 220.0,
    };
    let shares: Vec<f64> = (fill.histogram.iter())
        .map(|&c| dsprep_mixers::mixer::share(c, fill.windows))
        .collect();
    let top = shares.iter().fold(0.0f64, |a, &b| a.max(b)).max(0.01);
    axes(out, &area, &format!("windows (0 to {:.0} %)", 100.0 * top));
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle" font-size="11">window fill (0 to 100 %)</text>"#,
        area.x(0.5),
        area.top + area.height + 16.0
    );
    let slot = area.width / FILL_BUCKETS as f64;
    for (k, share) in shares.iter().enumerate().filter(|(_, s)| **s > 0.0) {
        let y = area.y(share / top);
        let _ = writeln!(
            out,
            r##"<rect x="{:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="#555"/>"##,
            area.left + k as f64 * slot,
            slot * 0.9,
            area.top + area.height - y
        );
    }
}

pub(super) fn axes(out: &mut String, area: &Area, label: &str) {
    let (x0, y0, x1, y1) = (
        area.left,
        area.top,
        area.left + area.width,
        area.top + area.height,
    );
    let _ = writeln!(
        out,
        r##"<path d="M{x0} {y0} L{x0} {y1} L{x1} {y1}" fill="none" stroke="#333" stroke-width="1"/>"##
    );
    let _ = writeln!(
        out,
        r#"<text x="{x0}" y="{}" font-size="11">{}</text>"#,
        y0 - 8.0,
        escape(label)
    );
}

fn legend(out: &mut String, ledger: &MixLedger) {
    for (i, name) in ledger.names.iter().enumerate() {
        let y = 60.0 + 20.0 * i as f64;
        let _ = writeln!(
            out,
            r#"<rect x="780" y="{:.1}" width="14" height="10" fill="{}"/><text x="800" y="{y:.1}">{}</text>"#,
            y - 9.0,
            colour(i),
            escape(name)
        );
    }
    let y = 70.0 + 20.0 * ledger.names.len() as f64;
    let _ = writeln!(
        out,
        r#"<text x="780" y="{y:.1}" font-size="10">thick: all tokens so far</text><text x="780" y="{:.1}" font-size="10">thin: the last span</text><text x="780" y="{:.1}" font-size="10">dashed: the target</text>"#,
        y + 14.0,
        y + 28.0
    );
}

/// Text for SVG: `&`, `<`, `>` and quotes escaped.
pub(super) fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
