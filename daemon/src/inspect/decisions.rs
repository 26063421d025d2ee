//! `dsprep inspect STATE --decisions [--plot FILE.svg]`: `[mix.adaptive]`'s decisions from a
//! state directory's lineage, as a table (step, the reports used, per source its reported mean
//! loss and its share) and as a picture: top, each source's share along the steps (a step line,
//! as decided); bottom, each source's mean reported loss at each decision.

use super::plot::{Area, axes, colour, escape, svg_page};
use crate::checkpoint::lineage as lineage_file;
use anyhow::{Context, bail};
use dsprep_mixers::adaptive::Decision;
use std::fmt::Write;
use std::path::Path;

/// The decisions of a stream, with the shares at its start.
pub struct Decisions {
    pub names: Vec<String>,
    /// The shares before the first decision (the recipe's weights as shares).
    pub start: Vec<f64>,
    pub decisions: Vec<Decision>,
}

impl Decisions {
    /// The decisions in `path` (a state directory or a lineage file).
    pub fn read(path: &Path) -> anyhow::Result<Decisions> {
        let lineage = lineage_file::read(path)
            .with_context(|| format!("inspect {}", path.display()))?
            .with_context(|| format!("{} holds no lineage", path.display()))?;
        let Some((k, _)) = lineage.decisions().next() else {
            bail!(
                "{} holds no [mix.adaptive] decisions (its lineage has {} segments)",
                path.display(),
                lineage.segments.len()
            );
        };
        let recipe = lineage.effective_recipe(k);
        let weights: Vec<f64> = recipe.sources.iter().map(|s| s.weight).collect();
        Ok(Decisions {
            names: lineage.source_names(),
            start: dsprep_mixers::mixer::target_shares(&weights),
            decisions: lineage.decisions().map(|(_, d)| d.clone()).collect(),
        })
    }

    fn share(&self, d: &Decision, i: usize) -> f64 {
        d.shares.get(&self.names[i]).copied().unwrap_or(0.0)
    }

    fn loss(&self, d: &Decision, i: usize) -> Option<f64> {
        d.observed.get(&self.names[i]).and_then(|o| o.mean())
    }

    /// One row per decision: its step, the reported steps, per source `share (loss)`.
    pub fn table(&self) -> String {
        let mut out = format!("{:>8} {:>13}", "step", "reports");
        for name in &self.names {
            let _ = write!(out, " {name:>20}");
        }
        out.push('\n');
        for d in &self.decisions {
            let _ = write!(
                out,
                "{:>8} {:>13}",
                d.step,
                format!("{}..{}", d.reports_from, d.reports_to)
            );
            for i in 0..self.names.len() {
                let loss = self.loss(d, i).map_or("-".into(), |l| format!("{l:.3}"));
                let _ = write!(out, " {:>20}", format!("{:.4} ({loss})", self.share(d, i)));
            }
            if let Some(why) = &d.held {
                let _ = write!(out, "  held: {why}");
            }
            if let Some(what) = &d.missing {
                let _ = write!(out, "  without: {what}");
            }
            out.push('\n');
        }
        out
    }
}

/// The shares and the reported loss per source along the steps, as SVG.
pub fn render_decisions_svg(decisions: &Decisions, title: &str) -> String {
    let mut out = svg_page(title);
    let last = decisions.decisions.last().map_or(1, |d| d.step).max(1);
    let end = (last + last / 20).max(1) as f64;
    let x = |area: &Area, step: u64| area.x(step as f64 / end);
    let shares = Area {
        left: 60.0,
        top: 50.0,
        width: 700.0,
        height: 280.0,
    };
    let top = (decisions.decisions.iter())
        .flat_map(|d| d.shares.values().copied())
        .chain(decisions.start.iter().copied())
        .fold(0.0f64, f64::max);
    let scale = (top * 1.1).clamp(0.05, 1.0);
    axes(
        &mut out,
        &shares,
        &format!("token share as decided (0 to {:.0} %)", 100.0 * scale),
    );
    let losses = Area {
        left: 60.0,
        top: 400.0,
        width: 700.0,
        height: 260.0,
    };
    let loss_top = (decisions.decisions.iter())
        .flat_map(|d| (0..decisions.names.len()).filter_map(|i| decisions.loss(d, i)))
        .fold(0.0f64, f64::max)
        .max(1e-9)
        * 1.1;
    axes(
        &mut out,
        &losses,
        &format!("mean reported loss per token (0 to {loss_top:.2})"),
    );
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">step (0 to {})</text>"#,
        losses.x(0.5),
        losses.top + losses.height + 30.0,
        end as u64
    );
    for i in 0..decisions.names.len() {
        // The shares in force: flat until each decision's step, then its share.
        let mut points = vec![format!(
            "{:.1},{:.1}",
            x(&shares, 0),
            shares.y(decisions.start[i] / scale)
        )];
        let mut now = decisions.start[i];
        for d in &decisions.decisions {
            let next = decisions.share(d, i);
            for share in [now, next] {
                points.push(format!(
                    "{:.1},{:.1}",
                    x(&shares, d.step),
                    shares.y(share / scale)
                ));
            }
            now = next;
        }
        points.push(format!("{:.1},{:.1}", shares.x(1.0), shares.y(now / scale)));
        let _ = writeln!(
            out,
            r#"<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>"#,
            colour(i),
            points.join(" ")
        );
        let seen: Vec<String> = (decisions.decisions.iter())
            .filter_map(|d| {
                let loss = decisions.loss(d, i)?;
                Some(format!(
                    "{:.1},{:.1}",
                    x(&losses, d.step),
                    losses.y(loss / loss_top)
                ))
            })
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline fill="none" stroke="{}" stroke-width="1.5" points="{}"/>"#,
            colour(i),
            seen.join(" ")
        );
        let y = 60.0 + 20.0 * i as f64;
        let _ = writeln!(
            out,
            r#"<rect x="780" y="{:.1}" width="14" height="10" fill="{}"/><text x="800" y="{y:.1}">{}</text>"#,
            y - 9.0,
            colour(i),
            escape(&decisions.names[i])
        );
    }
    out.push_str("</svg>\n");
    out
}
