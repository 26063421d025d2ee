//! `dsprep inspect DIR --mix`: the ledger of a packed directory, read from its windows' document
//! sources (format 3): per source (and per phase of a recipe with phases) the target share, the
//! realized share of tokens and of documents, and the deviation; with `--every N`, the realized
//! share along the stream every `N` tokens (a CSV, or `--plot`'s picture), and per source the
//! histogram of document lengths.
//!
//! It counts what the windows hold (the dropped tail is not in them), segment by segment: a
//! window's tokens up to its first document start belong to its lead source, then each start's
//! tokens to its source. Memory: one counter per source.

use anyhow::{Context, bail};
use dsprep_client::{Manifest, PackedDataset};
use std::fmt::Write;
use std::path::Path;

/// Per source: tokens and document starts counted over a span of the stream.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub tokens: Vec<u64>,
    pub documents: Vec<u64>,
}

impl Counts {
    fn new(sources: usize) -> Self {
        Counts {
            tokens: vec![0; sources],
            documents: vec![0; sources],
        }
    }

    fn total_tokens(&self) -> u64 {
        self.tokens.iter().sum()
    }
}

/// A span of the stream with its own target shares: the whole stream, or one phase.
#[derive(Clone, Debug)]
pub struct Span {
    pub name: String,
    /// Tokens of the stream before the span, and its end (`None`: the stream's end). A phase's
    /// span begins where its first document does: at its `at_tokens`, or after the document that
    /// crosses that point.
    pub from: u64,
    pub to: Option<u64>,
    /// Per source, the target share in the recipe's unit.
    pub targets: Vec<f64>,
    pub counts: Counts,
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
    let mut spans = phase_spans(m);
    let mut rows = Vec::new();
    let mut lengths = vec![[0u64; LENGTH_BUCKETS]; n];
    let mut last_start: Option<(u64, usize)> = None;
    let (mut at, mut next_row) = (0u64, every);
    let mut since_row = Counts::new(n);
    let mut whole = Counts::new(n);
    let mut phase = 0usize;
    for w in 0..dataset.num_windows() {
        let window = dataset.window(w)?;
        let (Some(sources), Some(lead)) = (window.doc_sources, window.lead_source) else {
            bail!("{}: window {w} has no document sources", dir.display());
        };
        let len = window.tokens.len() as u64;
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
                // A phase begins with the first document that starts at or after its point.
                while spans
                    .get(phase + 1)
                    .is_some_and(|next| at + start >= next.from)
                {
                    spans[phase].to = Some(at + start);
                    phase += 1;
                    spans[phase].from = at + start;
                }
                if known {
                    for counts in [&mut whole, &mut since_row, &mut spans[phase].counts] {
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
                    for counts in [&mut whole, &mut since_row, &mut spans[phase].counts] {
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
    if spans.len() > 1 {
        spans.insert(0, whole_span(m, whole));
    } else if let Some(only) = spans.first_mut() {
        only.counts = whole;
    }
    Ok(MixLedger {
        names,
        unit,
        spans,
        rows,
        lengths,
    })
}

/// The recipe's phases as spans (one span, the whole stream, without phases).
fn phase_spans(m: &Manifest) -> Vec<Span> {
    let n = m.sources.len();
    let base: Vec<f64> = m.sources.iter().map(|s| s.target_fraction).collect();
    let phases = m.recipe["mix"]["phase"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut spans = vec![Span {
        name: if phases.is_empty() {
            "stream".into()
        } else {
            "phase 0".into()
        },
        from: 0,
        to: None,
        targets: base,
        counts: Counts::new(n),
    }];
    for (k, phase) in phases.iter().enumerate() {
        let at = phase["at_tokens"].as_u64().unwrap_or(u64::MAX);
        let weights: Vec<f64> = m
            .sources
            .iter()
            .map(|s| phase["weights"][&s.name].as_f64().unwrap_or(0.0))
            .collect();
        let total: f64 = weights.iter().sum();
        spans.push(Span {
            name: format!("phase {}", k + 1),
            from: at,
            to: None,
            targets: weights
                .iter()
                .map(|w| if total > 0.0 { w / total } else { 0.0 })
                .collect(),
            counts: Counts::new(n),
        });
    }
    spans
}

fn whole_span(m: &Manifest, counts: Counts) -> Span {
    Span {
        name: "stream".into(),
        from: 0,
        to: None,
        targets: vec![f64::NAN; m.sources.len()],
        counts,
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
        for span in &self.spans {
            let tokens = span.counts.total_tokens();
            let docs: u64 = span.counts.documents.iter().sum();
            let to = span.to.map_or("the end".to_string(), |t| t.to_string());
            let _ = writeln!(
                out,
                "{}: tokens {}..{to}, {tokens} tokens and {docs} document starts in windows (targets are shares of {})",
                span.name, span.from, self.unit
            );
            let _ = writeln!(
                out,
                "{:<16} {:>9} {:>9} {:>9} {:>8}",
                "source", "target", "tokens %", "docs %", "off by"
            );
            for (i, name) in self.names.iter().enumerate() {
                let t = dsprep_mixers::mixer::share(span.counts.tokens[i], tokens);
                let d = dsprep_mixers::mixer::share(span.counts.documents[i], docs);
                let realized = if self.unit == "tokens" { t } else { d };
                let target = span.targets[i];
                let (target, off) = match target.is_nan() {
                    true => ("-".to_string(), "-".to_string()),
                    false => (
                        format!("{:.2}%", 100.0 * target),
                        format!("{:+.2}", 100.0 * (realized - target)),
                    ),
                };
                let _ = writeln!(
                    out,
                    "{name:<16} {target:>9} {:>8.2}% {:>8.2}% {off:>8}",
                    100.0 * t,
                    100.0 * d
                );
            }
        }
        out
    }
}
