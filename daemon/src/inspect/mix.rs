//! `dsprep inspect DIR --mix`: the ledger of a packed directory, read from its windows' document
//! sources (format 3): per source (and per phase of a recipe with phases) the target share, the
//! realized share of tokens and of documents, and the deviation; with `--every N`, the realized
//! share along the stream every `N` tokens (a CSV, or `--plot`'s picture), and per source the
//! histogram of document lengths.
//!
//! It counts what the windows hold (the dropped tail is not in them), span by span: a
//! window's tokens up to its first document start belong to its lead source, then each start's
//! tokens to its source. Phases are counted by `dsprep_mixers::ledger` (a document belongs to the
//! phase in force at its mixing position in its lane's own stream: where it lies in the windows,
//! or with `best_fit` and phases its `doc_positions.u64`), as the pack's manifest is; a
//! lineage's segments likewise (`segments.rs`). Memory: a few counters per source and phase.

use super::fill::{WindowFill, window_fill};
use super::segments::{segment_points, segment_spans};
use anyhow::{Context, bail};
use dsprep_client::{Manifest, PackedDataset};
use dsprep_mixers::ledger::{Counts, PhaseLedger, PhasePoints, ShareLine, share_lines};
use dsprep_mixers::recipe::{LanesSpec, MixUnit};
use std::fmt::Write;
use std::path::Path;

/// A span of the stream with its own target shares: the whole stream, or one phase.
#[derive(Clone, Debug)]
pub struct Span {
    pub name: String,
    /// Where the span begins in the stream: its first document (with lanes, the first lane's),
    /// or its `at_tokens` when the stream never reached it; and where it ends (`None`: the
    /// stream's end).
    pub from: u64,
    pub to: Option<u64>,
    /// With lanes: where the last lane's first document of it starts (none: not every lane
    /// reached it, or no lanes).
    pub all_lanes_from: Option<u64>,
    /// Per source, the target share in the recipe's unit (NaN: none, the whole stream of a
    /// recipe with phases).
    pub targets: Vec<f64>,
    pub counts: Counts,
    /// The counts are the pack's ledger (documents as their recipe drew them), not recounted
    /// from the windows: a lineage's segment in a `best_fit` pack that does not say where each
    /// document was mixed (`inspect/segments.rs`).
    pub as_drawn: bool,
}

/// The ledger of a packed directory.
pub struct MixLedger {
    pub names: Vec<String>,
    /// What the targets are shares of: `"documents"` or `"tokens"`.
    pub unit: String,
    pub spans: Vec<Span>,
    /// With `every`: the realized shares along the stream, one row every `every` tokens (and
    /// one at the end).
    pub rows: Vec<ShareRow>,
    /// Per source, documents by length in tokens: bucket `k` counts lengths in `[2^k, 2^(k+1))`.
    /// A document's length is measured from its start to the next start (the last one, cut by
    /// the end of the windows, is not counted).
    pub lengths: Vec<[u64; LENGTH_BUCKETS]>,
    /// How full the windows are, and the documents they cut.
    pub fill: WindowFill,
}

/// Buckets of the document-length histograms: lengths up to 2^40 tokens.
pub const LENGTH_BUCKETS: usize = 41;

/// The realized shares at a point of the stream.
#[derive(Clone, Debug)]
pub struct ShareRow {
    pub tokens: u64,
    /// Per source, its share of the tokens since the previous row.
    pub span: Vec<f64>,
    /// Per source, its share of every token so far.
    pub total: Vec<f64>,
}

/// About 200 rows along `dir`'s stream: what `--plot` uses when `--every` is not given.
pub fn auto_every(dir: &Path) -> anyhow::Result<u64> {
    let m = dsprep_client::packed::read_manifest(dir)?;
    Ok((m.num_windows * u64::from(m.window_tokens) / 200).max(1))
}

/// The recipe's phases as the manifest records them: where each begins (`at_tokens`, and the
/// lanes), for [`PhasePoints`]. `verify` checks the manifest's ledger with the same points.
pub fn phase_points(m: &Manifest) -> anyhow::Result<PhasePoints> {
    let phases = m.recipe["mix"]["phase"].as_array().cloned();
    let at: Vec<u64> = (phases.unwrap_or_default().iter())
        .map(|p| p["at_tokens"].as_u64())
        .collect::<Option<_>>()
        .context("the manifest's recipe has a phase without at_tokens")?;
    let lanes = match m.recipe.get("lanes") {
        Some(lanes) => Some(
            serde_json::from_value::<LanesSpec>(lanes.clone())
                .context("the manifest's recipe has an unreadable [lanes]")?,
        ),
        None => None,
    };
    Ok(PhasePoints::from_parts(
        at,
        u64::from(m.window_tokens),
        lanes,
    ))
}

/// Read `dir`'s windows once and count; `every` > 0 also takes the shares every `every` tokens.
pub fn mix_ledger(dir: &Path, every: u64) -> anyhow::Result<MixLedger> {
    let dataset = PackedDataset::open(dir)
        .with_context(|| format!("{} is not a valid packed directory", dir.display()))?;
    let m = dataset.manifest();
    if m.doc_sources.is_none() {
        bail!(
            "{}: format {} records no document sources (format 3 does): pack it again with \
             this dsprep to see its mix",
            dir.display(),
            m.format_version
        );
    }
    let names: Vec<String> = m.sources.iter().map(|s| s.name.clone()).collect();
    let n = names.len();
    let unit = m.recipe["mix"]["unit"]
        .as_str()
        .unwrap_or("documents")
        .to_string();
    let points = phase_points(m).with_context(|| dir.display().to_string())?;
    let mut phases = PhaseLedger::new(&points, n);
    let segment_points = segment_points(m, points.num_lanes() > 1);
    let mut segments = segment_points.as_ref().map(|(p, _)| PhaseLedger::new(p, n));
    let mut rows = Vec::new();
    let mut lengths = vec![[0u64; LENGTH_BUCKETS]; n];
    let mut last_start: Option<(u64, usize)> = None;
    let (mut at, mut next_row) = (0u64, every);
    let mut since_row = Counts::new(n);
    let mut whole = Counts::new(n);
    for w in 0..dataset.num_windows() {
        let window = dataset.window(w)?;
        let (Some(sources), Some(lead)) = (window.doc_sources, window.lead_source) else {
            bail!("{}: window {w} has no document sources", dir.display());
        };
        let len = u64::from(window.real_tokens);
        let positions = window.doc_positions.unwrap_or_default();
        phases.add_window_at(&points, w, len, window.doc_starts, sources, lead, positions);
        if let (Some((points, count)), Some(ledger)) = (&segment_points, &mut segments) {
            let positions = count.positions(positions);
            ledger.add_window_at(points, w, len, window.doc_starts, sources, lead, positions);
        }
        let mut cuts = Vec::with_capacity(sources.len() + 2);
        cuts.push((0u64, lead, false));
        let starts = window.doc_starts.iter().zip(sources);
        cuts.extend(starts.map(|(&s, &src)| (u64::from(s), src, true)));
        for (k, &(start, source, starts)) in cuts.iter().enumerate() {
            let end = cuts.get(k + 1).map_or(len, |c| c.0);
            let source = usize::from(source);
            // Unknown (65535, pending in an old checkpoint): its tokens count in no source,
            // but the CSV rows still fall where they should.
            let known = source < n;
            if starts {
                if known {
                    for counts in [&mut whole, &mut since_row] {
                        counts.documents[source] += 1;
                    }
                }
                if let Some((from, s)) = last_start.replace((at + start, source))
                    && s < n
                {
                    let len = at + start - from;
                    lengths[s][(len.max(1).ilog2() as usize).min(LENGTH_BUCKETS - 1)] += 1;
                }
            }
            // The segment's tokens, split where a CSV row falls.
            let (mut from, to) = (at + start, at + end);
            while from < to {
                let cut = if every > 0 { to.min(next_row) } else { to };
                if known {
                    for counts in [&mut whole, &mut since_row] {
                        counts.tokens[source] += cut - from;
                    }
                }
                from = cut;
                if every > 0 && from == next_row {
                    rows.push(ShareRow::new(from, &since_row, &whole));
                    since_row = Counts::new(n);
                    next_row += every;
                }
            }
        }
        at += len;
    }
    if every > 0 && since_row.total_tokens() > 0 {
        rows.push(ShareRow::new(at, &since_row, &whole));
    }
    let mut spans = phase_spans(m, &phases, points.num_lanes() > 1);
    if let (Some(ledger), Some((_, count))) = (&segments, &segment_points) {
        spans.extend(segment_spans(m, ledger, *count));
    }
    if spans.len() > 1 {
        spans.insert(0, whole_span(m, whole));
    }
    Ok(MixLedger {
        names,
        unit,
        spans,
        rows,
        lengths,
        fill: window_fill(&dataset)?,
    })
}

/// The recipe's phases as spans (one span, the whole stream, without phases), with what
/// `phases` counted in each.
fn phase_spans(m: &Manifest, phases: &PhaseLedger, lanes: bool) -> Vec<Span> {
    let recipe_phases = m.recipe["mix"]["phase"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut targets = vec![m.sources.iter().map(|s| s.target_fraction).collect()];
    let mut points = vec![0];
    for phase in &recipe_phases {
        points.push(phase["at_tokens"].as_u64().unwrap_or(u64::MAX));
        let weights: Vec<f64> = m
            .sources
            .iter()
            .map(|s| phase["weights"][&s.name].as_f64().unwrap_or(0.0))
            .collect();
        targets.push(dsprep_mixers::mixer::target_shares(&weights));
    }
    let froms: Vec<u64> = (0..points.len())
        .map(|k| phases.began(k).0.unwrap_or(points[k]))
        .collect();
    (targets.into_iter().enumerate())
        .map(|(k, targets)| Span {
            name: match recipe_phases.is_empty() {
                true => "stream".into(),
                false => format!("phase {k}"),
            },
            from: if k == 0 { 0 } else { froms[k] },
            to: froms.get(k + 1).copied(),
            all_lanes_from: phases.began(k).1.filter(|_| lanes && k > 0),
            targets,
            counts: phases.phases[k].clone(),
            as_drawn: false,
        })
        .collect()
}

fn whole_span(m: &Manifest, counts: Counts) -> Span {
    Span {
        name: "stream".into(),
        from: 0,
        to: None,
        all_lanes_from: None,
        targets: vec![f64::NAN; m.sources.len()],
        counts,
        as_drawn: false,
    }
}

impl ShareRow {
    fn new(tokens: u64, span: &Counts, whole: &Counts) -> Self {
        let shares = |c: &Counts| {
            let total = c.total_tokens();
            c.tokens
                .iter()
                .map(|&t| dsprep_mixers::mixer::share(t, total))
                .collect()
        };
        ShareRow {
            tokens,
            span: shares(span),
            total: shares(whole),
        }
    }
}

impl MixLedger {
    /// The rows as CSV: `tokens`, then each source's share since the previous row
    /// (`span:NAME`), then of every token so far (`total:NAME`).
    pub fn csv(&self) -> String {
        let mut out = String::from("tokens");
        for prefix in ["span", "total"] {
            for name in &self.names {
                let _ = write!(out, ",{prefix}:{name}");
            }
        }
        out.push('\n');
        for row in &self.rows {
            let _ = write!(out, "{}", row.tokens);
            for share in row.span.iter().chain(&row.total) {
                let _ = write!(out, ",{share:.6}");
            }
            out.push('\n');
        }
        out
    }

    /// The table `dsprep inspect --mix` prints.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let unit = match self.unit.as_str() {
            "tokens" => MixUnit::Tokens,
            _ => MixUnit::Documents,
        };
        for span in &self.spans {
            let tokens = span.counts.total_tokens();
            let docs = span.counts.total_documents();
            let to = span.to.map_or("the end".to_string(), |t| t.to_string());
            let lanes = match span.all_lanes_from {
                Some(last) => {
                    format!(" (each lane from its own share of the point: the last from {last})")
                }
                None => String::new(),
            };
            let counted = match span.as_drawn {
                true => {
                    "documents as its recipe drew them (the pack's ledger: its windows do not say where a best_fit document was mixed)"
                }
                false => "document starts in windows",
            };
            let _ = writeln!(
                out,
                "{}: tokens {}..{to}{lanes}, {tokens} tokens and {docs} {counted} (targets are shares of {})",
                span.name, span.from, self.unit
            );
            out.push_str(&ledger_rows(
                &self.names,
                &share_lines(&span.counts, &span.targets, unit),
            ));
        }
        out.push_str(&self.fill.lines());
        out
    }
}

/// A ledger's lines as a table: source, target, realized shares of tokens and of documents,
/// and the deviation in points (`-` where there is no target). `inspect --mix` and the pack
/// summary print it.
pub fn ledger_rows(names: &[String], lines: &[ShareLine]) -> String {
    let mut out = format!(
        "{:<16} {:>9} {:>9} {:>9} {:>8}\n",
        "source", "target", "tokens %", "docs %", "off by"
    );
    for (name, line) in names.iter().zip(lines) {
        let (target, off) = match line.target.is_nan() {
            true => ("-".to_string(), "-".to_string()),
            false => (
                format!("{:.2}%", 100.0 * line.target),
                format!("{:+.2}", 100.0 * line.deviation),
            ),
        };
        let _ = writeln!(
            out,
            "{name:<16} {target:>9} {:>8.2}% {:>8.2}% {off:>8}",
            100.0 * line.token_share,
            100.0 * line.document_share
        );
    }
    out
}
