//! The trainers' loss reports (protocol v7): each rank's summed loss and counted tokens per
//! source for a step it trained on. Every accepted report counts in `/metrics` and the progress
//! lines; with `[mix.adaptive]` the book also keeps, per step not yet decided, which ranks
//! reported and the sums, until the decision that uses the step takes them
//! ([`Reports::wait_for`]).
//!
//! Bounded: a rank reports a step once (a second report is ignored and counted), only for a
//! step it fetched (the server checks), and only steps at or above the next decision's first
//! are kept, so the book holds at most the steps between that and the fastest rank.

pub mod pending;
mod phases;

use super::metrics::{Labels, Scrape, labels};
use dsprep_client::protocol::report::SourceLoss;
use dsprep_mixers::adaptive::Observed;
use phases::StepPhases;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Why a report was not taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Refused {
    /// A source the stream does not have.
    Source,
    /// A loss that is NaN, infinite or negative.
    Value,
    /// A step the rank has not fetched.
    NotFetched,
    /// A step a decision has used already (a trainer that rolled back reports it again).
    Decided,
    /// The rank reported the step already.
    Duplicate,
}

impl Refused {
    pub const ALL: [Refused; 5] = [
        Refused::Source,
        Refused::Value,
        Refused::NotFetched,
        Refused::Decided,
        Refused::Duplicate,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Refused::Source => "unknown_source",
            Refused::Value => "bad_value",
            Refused::NotFetched => "not_fetched",
            Refused::Decided => "decided",
            Refused::Duplicate => "duplicate",
        }
    }
}

/// One step's reports so far.
struct StepReports {
    reported: Vec<bool>,
    sums: Vec<Observed>,
}

struct Book {
    /// `[mix.adaptive]`: reports of steps from here on are kept for the next decision (`None`:
    /// no adaptive mix, nothing is kept).
    keep_from: Option<u64>,
    steps: BTreeMap<u64, StepReports>,
    /// Per source: the loss and tokens of every accepted report (what `/metrics` shows), and
    /// since the last progress line.
    total: Vec<Observed>,
    since_line: Vec<Observed>,
    /// Per (segment, phase, source): the loss and tokens of every accepted report, by the
    /// segment and phase of its step ([`StepPhases`]).
    phases: StepPhases,
    by_phase: BTreeMap<(u32, u32, usize), Observed>,
    refused: BTreeMap<Refused, u64>,
    accepted: u64,
}

/// The reports of one daemon's ranks.
pub struct Reports {
    names: Vec<String>,
    ranks: u32,
    /// The global rank of local rank 0 (what messages name), and a node daemon's node.
    first_rank: u32,
    node: Option<u32>,
    book: Mutex<Book>,
    arrived: Condvar,
    closed: AtomicBool,
    /// `[mix.adaptive]`: the shares in force (fractions × 2^32, per source) and the decisions
    /// made, held (on_missing) and their count since start, for `/metrics`.
    shares: Vec<AtomicU64>,
    decisions: AtomicU64,
    held: AtomicU64,
}

/// The reports a decision waited for and did not get.
pub struct Missing {
    /// Per step, the ranks that did not report it (at most a few of each named).
    pub what: String,
}

impl Reports {
    /// The book of `ranks` ranks reporting over the sources `names` (the stream's, in index
    /// order); `keep_from`: with `[mix.adaptive]`, the first step the next decision uses.
    pub fn new(names: Vec<String>, ranks: u32, keep_from: Option<u64>) -> Reports {
        let n = names.len();
        Reports {
            shares: (0..n).map(|_| AtomicU64::new(0)).collect(),
            names,
            ranks,
            first_rank: 0,
            node: None,
            book: Mutex::new(Book {
                keep_from,
                steps: BTreeMap::new(),
                total: vec![Observed::default(); n],
                since_line: vec![Observed::default(); n],
                phases: StepPhases::default(),
                by_phase: BTreeMap::new(),
                refused: BTreeMap::new(),
                accepted: 0,
            }),
            arrived: Condvar::new(),
            closed: AtomicBool::new(false),
            decisions: AtomicU64::new(0),
            held: AtomicU64::new(0),
        }
    }

    /// The node daemon this book is of (0 for a single daemon).
    pub fn node(&self) -> u32 {
        self.node.unwrap_or(0)
    }

    /// The book of node daemon `node`, whose local rank 0 is global rank `first_rank`.
    pub fn of_node(mut self, node: u32, first_rank: u32) -> Reports {
        self.first_rank = first_rank;
        self.node = Some(node);
        self
    }

    fn lock(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The lineage served (once placed): the segments and phases reports are counted in.
    pub fn set_lineage(&self, lineage: &dsprep_mixers::lineage::Lineage, window_tokens: u64) {
        self.lock().phases = StepPhases::new(lineage, window_tokens);
    }

    /// Count a report refused before it reached the book (the server's checks).
    pub fn refuse(&self, why: Refused) {
        *self.lock().refused.entry(why).or_default() += 1;
    }

    /// Take rank `rank`'s report for `step` (the server checked that the rank owns and fetched
    /// it). A refused report changes nothing but its count.
    pub fn accept(&self, rank: u32, step: u64, entries: &[SourceLoss]) -> Result<(), Refused> {
        let mut guard = self.lock();
        let book = &mut *guard;
        let outcome = self.check(book, rank, step, entries);
        match outcome {
            Ok(()) => {
                book.accepted += 1;
                let (segment, phase) = book.phases.of(step);
                for e in entries {
                    let i = usize::from(e.source);
                    let in_phase = book.by_phase.entry((segment, phase, i)).or_default();
                    in_phase.loss_sum += e.loss_sum;
                    in_phase.tokens += e.tokens;
                    for sums in [&mut book.total[i], &mut book.since_line[i]] {
                        sums.loss_sum += e.loss_sum;
                        sums.tokens += e.tokens;
                    }
                }
            }
            Err(why) => *book.refused.entry(why).or_default() += 1,
        }
        drop(guard);
        if outcome.is_ok() {
            self.arrived.notify_all();
        }
        outcome
    }

    fn check(
        &self,
        book: &mut Book,
        rank: u32,
        step: u64,
        entries: &[SourceLoss],
    ) -> Result<(), Refused> {
        if entries
            .iter()
            .any(|e| usize::from(e.source) >= self.names.len())
        {
            return Err(Refused::Source);
        }
        if (entries.iter()).any(|e| !(e.loss_sum.is_finite() && e.loss_sum >= 0.0)) {
            return Err(Refused::Value);
        }
        let Some(keep_from) = book.keep_from else {
            return Ok(());
        };
        if step < keep_from {
            return Err(Refused::Decided);
        }
        let (n, ranks) = (self.names.len(), self.ranks as usize);
        let kept = book.steps.entry(step).or_insert_with(|| StepReports {
            reported: vec![false; ranks],
            sums: vec![Observed::default(); n],
        });
        let slot = kept
            .reported
            .get_mut(rank as usize)
            .ok_or(Refused::NotFetched)?;
        if std::mem::replace(slot, true) {
            return Err(Refused::Duplicate);
        }
        for e in entries {
            let sums = &mut kept.sums[usize::from(e.source)];
            sums.loss_sum += e.loss_sum;
            sums.tokens += e.tokens;
        }
        Ok(())
    }

    /// Wait up to `wait` for every rank's report of each step in `from..to`, then sum what came
    /// per source; `Missing` names what did not come. A step for which `will_not_come(step)` (below
    /// where a resumed daemon's trainers resumed, or past the end of the stream) is not waited
    /// for. Either way, steps below `to` are decided from then on: their reports are no longer
    /// kept.
    pub fn wait_for(
        &self,
        from: u64,
        to: u64,
        wait: Duration,
        will_not_come: impl Fn(u64) -> bool,
    ) -> (Vec<Observed>, Option<Missing>) {
        let deadline = Instant::now() + wait;
        let mut book = self.lock();
        loop {
            let done =
                |step: u64| (book.steps.get(&step)).is_some_and(|s| s.reported.iter().all(|&r| r));
            let complete = (from..to).all(done);
            let hopeless = !complete && (from..to).filter(|&s| !done(s)).all(&will_not_come);
            let now = Instant::now();
            if self.closed.load(Relaxed) && !complete {
                // Stopping: the steps stay in the book, for a graceful stop to keep them.
                let none = vec![Observed::default(); self.names.len()];
                return (none, Some(self.missing(&book, from, to)));
            }
            if complete || hopeless || now >= deadline {
                let mut sums = vec![Observed::default(); self.names.len()];
                for step in book.steps.range(from..to).map(|(_, s)| s) {
                    for (total, s) in sums.iter_mut().zip(&step.sums) {
                        total.loss_sum += s.loss_sum;
                        total.tokens += s.tokens;
                    }
                }
                let missing = (!complete).then(|| self.missing(&book, from, to));
                book.steps = book.steps.split_off(&to);
                book.keep_from = Some(to);
                return (sums, missing);
            }
            let slice = (deadline - now).min(Duration::from_millis(100));
            book = (self.arrived)
                .wait_timeout(book, slice)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn missing(&self, book: &Book, from: u64, to: u64) -> Missing {
        let mut parts = Vec::new();
        for step in from..to {
            let absent: Vec<u32> = match book.steps.get(&step) {
                None => (0..self.ranks).collect(),
                Some(s) => (0..self.ranks)
                    .filter(|&r| !s.reported[r as usize])
                    .collect(),
            };
            if absent.is_empty() {
                continue;
            }
            let ranks = match (absent.len() == self.ranks as usize, self.node) {
                (true, None) => "every rank".to_string(),
                (true, Some(node)) => format!("every rank of node {node}"),
                (false, _) => {
                    let global: Vec<u32> = absent.iter().map(|r| r + self.first_rank).collect();
                    format!("ranks {global:?}")
                }
            };
            parts.push(format!("step {step} from {ranks}"));
        }
        let shown = parts.len().min(4);
        let mut what = parts[..shown].join(", ");
        if parts.len() > shown {
            what.push_str(&format!(" and {} more steps", parts.len() - shown));
        }
        Missing { what }
    }

    /// The next decision uses the reports of steps from `step` on: those below are decided.
    pub fn keep_from(&self, step: u64) {
        let mut book = self.lock();
        book.steps = book.steps.split_off(&step);
        book.keep_from = Some(step);
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Relaxed)
    }

    /// The daemon stops: a decision waiting for reports stops waiting.
    pub fn close(&self) {
        self.closed.store(true, Relaxed);
        self.arrived.notify_all();
    }

    /// A decision was made (`held`: it kept the shares), giving `shares` (per source).
    pub fn decided(&self, shares: &[f64], held: bool) {
        self.set_shares(shares);
        self.decisions.fetch_add(1, Relaxed);
        if held {
            self.held.fetch_add(1, Relaxed);
        }
    }

    /// Set the shares in force (at start).
    pub fn set_shares(&self, shares: &[f64]) {
        for (gauge, &share) in self.shares.iter().zip(shares) {
            gauge.store(share.to_bits(), Relaxed);
        }
    }

    /// The progress line's part: each source's mean loss over the reports since the last line
    /// (empty when none came).
    pub fn progress_part(&self) -> String {
        let mut book = self.lock();
        let since = std::mem::replace(
            &mut book.since_line,
            vec![Observed::default(); self.names.len()],
        );
        let parts: Vec<String> = (self.names.iter().zip(&since))
            .filter_map(|(name, o)| Some(format!("{name} {:.3}", o.mean()?)))
            .collect();
        match parts.is_empty() {
            true => String::new(),
            false => format!(", loss {}", parts.join(" ")),
        }
    }

    /// The loss families of `/metrics`.
    pub(super) fn render(&self, scrape: &mut Scrape) {
        let book = self.lock();
        let per_source = |value: &ValueOf| -> Vec<(Labels, f64)> {
            (self.names.iter().zip(&book.total))
                .map(|(name, o)| (labels(&[("source", name)]), value(o)))
                .collect()
        };
        loss_families(scrape, "dsprep_source_loss", "per source", &per_source);
        let per_phase = |value: &ValueOf| -> Vec<(Labels, f64)> {
            (book.by_phase.iter())
                .filter_map(|(&(segment, phase, source), o)| {
                    let name = self.names.get(source)?;
                    let (segment, phase) = (segment.to_string(), phase.to_string());
                    let set = [("segment", &*segment), ("phase", &*phase), ("source", name)];
                    Some((labels(&set), value(o)))
                })
                .collect()
        };
        let per = "per segment of the lineage, phase of its recipe ([[mix.phase]]; 0: the \
                   [[source]] weights) and source";
        loss_families(scrape, "dsprep_source_phase_loss", per, &per_phase);
        scrape.counter(
            "dsprep_loss_reports",
            "Loss reports taken (protocol v7)",
            [(Labels::new(), book.accepted)],
        );
        scrape.counter(
            "dsprep_loss_reports_refused",
            "Loss reports not taken: unknown_source, bad_value (NaN, infinite or negative), \
             not_fetched (a step the rank has not fetched, or a rank that does not own it), \
             decided (a step a decision used already), duplicate (the rank reported it already)",
            Refused::ALL.map(|why| {
                let n = book.refused.get(&why).copied().unwrap_or(0);
                (labels(&[("reason", why.label())]), n)
            }),
        );
        drop(book);
        if book_is_adaptive(self) {
            scrape.fraction(
                "dsprep_mix_adaptive_share",
                "[mix.adaptive]: each source's token share as last decided",
                (self.names.iter().zip(&self.shares))
                    .map(|(name, s)| (labels(&[("source", name)]), f64::from_bits(s.load(Relaxed))))
                    .collect::<Vec<_>>(),
            );
            scrape.counter(
                "dsprep_mix_adaptive_decisions",
                "[mix.adaptive]: decisions made, held: those that kept the shares (reports missing)",
                [
                    (labels(&[("outcome", "decided")]), self.decisions.load(Relaxed)),
                    (labels(&[("outcome", "held")]), self.held.load(Relaxed)),
                ],
            );
        }
    }
}

/// What one sample of a loss family shows of its sums.
type ValueOf = dyn Fn(&Observed) -> f64;

/// A family of reported loss `per` what its labels say: `{prefix}_sum`, `_tokens` and `_mean`,
/// their samples from `series` (each sample's value taken from its sums by the function given).
fn loss_families(
    scrape: &mut Scrape,
    prefix: &str,
    per: &str,
    series: &dyn Fn(&ValueOf) -> Vec<(Labels, f64)>,
) {
    scrape.fraction(
        &format!("{prefix}_sum"),
        &format!("The trainers' reported loss {per}, summed over every accepted report"),
        series(&|o| o.loss_sum),
    );
    scrape.fraction(
        &format!("{prefix}_tokens"),
        &format!("The tokens the reported loss {per} counts"),
        series(&|o| o.tokens as f64),
    );
    scrape.fraction(
        &format!("{prefix}_mean"),
        &format!("The mean reported loss per token {per} (0 before any report)"),
        series(&|o| o.mean().unwrap_or(0.0)),
    );
}

fn book_is_adaptive(reports: &Reports) -> bool {
    reports.lock().keep_from.is_some()
}

#[cfg(test)]
mod tests;
