//! `[mix.adaptive]` in a daemon. The [`Decider`] makes (or, on a node daemon other than node
//! 0, learns) each decision once for the whole daemon; a [`Planner`] per stream — the one
//! stream of a daemon, or each lane a node runs — asks it when that stream reaches the decision's
//! token point, and gives the reader the phase to add before it draws another document.
//!
//! A decision for step `d` waits (up to `wait_seconds`) for the trainers' reports of the steps it
//! uses ([`Reports::wait_for`]); node daemons pool theirs through the state directory
//! ([`pool`]): node 0 decides for every node. It computes the new shares
//! ([`dsprep_mixers::adaptive::decide`]), or keeps them when reports are missing
//! (`on_missing = "hold"`); with `[lanes]` the shares are those the lanes can give
//! ([`Decider::lanes_can_give`]). The decision is written to `lineage.json` before any stream draws a
//! document under it: every byte served under it can be replayed from the lineage.

mod planner;
pub mod pool;

pub use planner::Planner;

use super::nodes::progress::{Gate, LaneProgress};
use super::reports::Reports;
use super::store::StepStore;
use crate::checkpoint::lineage as lineage_file;
use anyhow::{Context, bail};
use dsprep_mixers::adaptive::{Decision, Observed, decide, next_decision_step, reported_steps};
use dsprep_mixers::lanes::lane_shares;
use dsprep_mixers::lineage::Lineage;
use dsprep_mixers::mixer::target_shares;
use dsprep_mixers::recipe::{AdaptiveSpec, OnMissing};
use pool::Pool;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// The lanes a node's streams are: which sources each lane holds (`present[lane][source]`),
/// and how the daemon learns where the stream ends (its own lanes that ended, and with more
/// nodes the lanes' shared progress): a decision past the end is never waited for.
pub struct LaneShape {
    pub spec: dsprep_mixers::LanesSpec,
    pub present: Vec<Vec<bool>>,
    pub global_batch: u64,
    pub progress: Option<Arc<LaneProgress>>,
    /// Per lane this daemon runs that ended: its blocks.
    pub ended: Mutex<BTreeMap<u32, u64>>,
}

impl LaneShape {
    /// The first stream window past the end, as far as this daemon's own lanes know it.
    fn end_window(&self) -> Option<u64> {
        let ended = self.ended.lock().unwrap_or_else(|p| p.into_inner());
        let (count, k) = (
            u64::from(self.spec.count),
            u64::from(self.spec.block_windows),
        );
        (ended.iter())
            .map(|(&lane, &blocks)| (blocks * count + u64::from(lane)) * k)
            .min()
    }
}

/// A decision as the streams take it: from which of the stream's tokens on its weights hold
/// (per source), and with lanes each lane's own weights (the lanes' share solver's).
pub struct Made {
    pub step: u64,
    pub at_tokens: u64,
    pub weights: Vec<f64>,
    pub lane_weights: Vec<Vec<f64>>,
}

/// The decisions of a daemon's newest segment, shared by its streams.
pub struct Decider {
    /// The state directory's lineage file: written at each decision (node 0, a single daemon),
    /// or read until it holds node 0's (the other nodes).
    path: PathBuf,
    reports: Arc<Reports>,
    /// Where the trainers resumed: reports of earlier steps will not come.
    store: Arc<StepStore>,
    window_tokens: u64,
    pool: Pool,
    lanes: Option<LaneShape>,
    state: Mutex<State>,
    changed: Condvar,
    /// The streams' consumer is gone (the stream ended, or the daemon stops): a decision waited
    /// for from node 0 is no longer needed.
    stopped: AtomicBool,
}

#[derive(Default)]
struct State {
    /// The lineage the streams began with (what their mixers were built with) and as now.
    start: Option<Arc<Lineage>>,
    now: Option<Arc<Lineage>>,
    /// A stream is making (or learning) a decision: the others wait for it.
    making: bool,
    /// The decisions streams asked for lately, ready for the next stream that asks.
    recent: Vec<Arc<Made>>,
}

impl Decider {
    pub fn new(
        path: PathBuf,
        reports: Arc<Reports>,
        store: Arc<StepStore>,
        window_tokens: u64,
        pool: Pool,
        lanes: Option<LaneShape>,
    ) -> Decider {
        Decider {
            path,
            reports,
            store,
            window_tokens,
            pool,
            lanes,
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            stopped: AtomicBool::new(false),
        }
    }

    /// Nothing the streams make from now on is served (the producer has stopped taking their
    /// windows): decisions are no longer waited for, and a stream asking gets none.
    pub fn stop(&self) {
        self.stopped.store(true, Relaxed);
        self.changed.notify_all();
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Relaxed)
    }

    /// Lane `lane` of this daemon ended after `blocks` blocks: the stream ends by then.
    pub fn lane_ended(&self, lane: u32, blocks: u64) {
        if let Some(lanes) = &self.lanes {
            let mut ended = lanes.ended.lock().unwrap_or_else(|p| p.into_inner());
            ended.insert(lane, blocks);
        }
        self.changed.notify_all();
    }

    /// Whether the stream is known to end before `step` (no rank trains on it, so no report of
    /// it comes, and no decision for it is needed).
    fn past_end(&self, step: u64) -> bool {
        let (Some(lanes), Some(start)) = (&self.lanes, self.lock().start.clone()) else {
            return false;
        };
        if lanes
            .end_window()
            .is_some_and(|end| start.window_of_step(step) >= end)
        {
            return true;
        }
        (lanes.progress.as_ref())
            .is_some_and(|p| matches!(p.gate(step, lanes.global_batch), Gate::End(_)))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The streams begin from `lineage` (the daemon's course once placed: what their mixers are
    /// built with; node 0 and a single daemon have written it).
    pub fn begin(&self, lineage: &Lineage) -> anyhow::Result<()> {
        let spec = spec_of(lineage)?;
        let segment = newest(lineage);
        let names = names_of(lineage);
        let shares = match segment.decisions.last() {
            Some(last) => by_name(&names, &last.shares),
            None => target_shares(&weights_of(
                &lineage.effective_recipe(lineage.segments.len() - 1),
            )),
        };
        self.reports.set_shares(&shares);
        let after = segment
            .decisions
            .last()
            .map_or(segment.from_step, |d| d.step);
        self.keep_reports_for(&spec, next_decision_step(&spec, after));
        let lineage = Arc::new(lineage.clone());
        let mut state = self.lock();
        state.start = Some(Arc::clone(&lineage));
        state.now = Some(lineage);
        Ok(())
    }

    /// The lineage the streams began with.
    fn start(&self) -> anyhow::Result<Arc<Lineage>> {
        let state = self.lock();
        (state.start.clone()).context("internal error: [mix.adaptive] asked before its lineage")
    }

    /// The first decision a stream built from the starting lineage makes: its step and the
    /// stream's token point of it, and the spec.
    fn first(&self) -> anyhow::Result<(u64, u64, AdaptiveSpec)> {
        let start = self.start()?;
        let spec = spec_of(&start)?;
        let segment = newest(&start);
        let after = segment
            .decisions
            .last()
            .map_or(segment.from_step, |d| d.step);
        let step = next_decision_step(&spec, after);
        Ok((step, self.at_tokens(&start, step), spec))
    }

    /// The stream's token count from which the decision for `step` holds.
    fn at_tokens(&self, lineage: &Lineage, step: u64) -> u64 {
        lineage.window_of_step(step) * self.window_tokens
    }

    fn keep_reports_for(&self, spec: &AdaptiveSpec, next: u64) {
        if let Some((from, _)) = reported_steps(spec, next) {
            self.reports.keep_from(from);
        }
    }

    /// The decision for `step`: made once for the whole daemon (node 0 and a single daemon make
    /// it and write it; other nodes wait for node 0's), then given to every stream that asks.
    /// `None` once [`Decider::stop`] was called.
    pub fn decision(&self, step: u64) -> anyhow::Result<Option<Arc<Made>>> {
        let mut state = self.lock();
        loop {
            if self.is_stopped() {
                return Ok(None);
            }
            if !state.making && self.lanes.is_some() {
                drop(state);
                if self.past_end(step) {
                    return Ok(None);
                }
                state = self.lock();
            }
            if let Some(made) = state.recent.iter().find(|m| m.step == step) {
                return Ok(Some(Arc::clone(made)));
            }
            let now =
                (state.now.clone()).context("internal error: a decision before its lineage")?;
            if let Some(d) = newest(&now).decisions.iter().find(|d| d.step == step) {
                let made = Arc::new(self.made_of(&now, d)?);
                state.recent.push(Arc::clone(&made));
                if state.recent.len() > 4 {
                    state.recent.remove(0);
                }
                return Ok(Some(made));
            }
            if state.making {
                state = (self.changed.wait(state)).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            state.making = true;
            drop(state);
            let result = match &self.pool {
                Pool::Follower { .. } => self.learn(step, &now),
                _ => self.make(step, &now),
            };
            state = self.lock();
            state.making = false;
            self.changed.notify_all();
            match result? {
                Some(next) => state.now = Some(Arc::new(next)),
                None => return Ok(None),
            }
        }
    }

    /// What the streams take of decision `d` of `lineage`.
    fn made_of(&self, lineage: &Lineage, d: &Decision) -> anyhow::Result<Made> {
        let recipe = lineage.effective_recipe(lineage.segments.len() - 1);
        let weights = recipe.weights_of(&d.phase());
        let lane_weights = match &self.lanes {
            None => Vec::new(),
            Some(lanes) => match lane_shares(&lanes.present, &weights) {
                Ok(s) => s.weights,
                Err(lane) => bail!(
                    "the decision for step {} leaves lane {lane} no source to draw from",
                    d.step
                ),
            },
        };
        Ok(Made {
            step: d.step,
            at_tokens: d.at_tokens,
            weights,
            lane_weights,
        })
    }

    /// Node 0 or a single daemon: wait for the reports, decide, write the decision to the
    /// lineage; the lineage with it (`None`: the stream ends before `step`).
    fn make(&self, step: u64, now: &Lineage) -> anyhow::Result<Option<Lineage>> {
        let spec = spec_of(now)?;
        let (from, to) = reported_steps(&spec, step).context("a decision step has reports")?;
        let wait = Duration::from_secs_f64(spec.wait_seconds);
        let ranks_at = self.store.slowest();
        let will_not_come = |s: u64| s < self.store.placed_at() || self.past_end(s);
        let local = (self.reports).wait_for(from, to, wait, will_not_come);
        let gone = || self.past_end(step);
        let (seen, missing) = (self.pool).gather(now, step, local, wait, &self.reports, gone);
        if self.reports.is_closed() {
            bail!("the daemon is stopping: the decision for step {step} is not made");
        }
        if self.past_end(step) {
            return Ok(None); // no rank gets step `step`: nothing to decide
        }
        let k = now.segments.len() - 1;
        let names = names_of(now);
        let last = now.segments[k].decisions.last();
        let current: Vec<f64> = match last {
            Some(d) => by_name(&names, &d.shares),
            None => target_shares(&weights_of(&now.effective_recipe(k))),
        };
        let state = last.map_or_else(Vec::new, |d| by_name(&names, &d.state));
        let some_came = seen.iter().any(|o| o.tokens > 0);
        let usable = match (&missing, spec.on_missing) {
            (None, _) => Ok(()),
            (Some(_), OnMissing::Reported) if some_came => Ok(()),
            (Some(what), mode) => Err(self.why_held(&spec, mode, what, step, ranks_at)),
        };
        let decided = usable.and_then(|()| {
            let (wanted, state) = decide(&spec, &current, &state, step, &seen);
            let shares = (self.lanes_can_give(wanted))
                .map_err(|e| format!("the algorithm wanted {e}, which the lanes cannot give"))?;
            Ok((shares, state))
        });
        let (shares, state, seen, held) = match decided {
            Ok((shares, state)) => (shares, state, seen, None),
            Err(why) => {
                let state = if state.is_empty() {
                    vec![0.0; names.len()]
                } else {
                    state
                };
                let none = vec![Observed::default(); names.len()];
                (current.clone(), state, none, Some(why))
            }
        };
        let missing = missing.filter(|_| held.is_none());
        let decision = Decision {
            step,
            at_tokens: self.at_tokens(now, step),
            reports_from: from,
            reports_to: to,
            shares: names.iter().cloned().zip(shares.iter().copied()).collect(),
            observed: (names.iter().zip(&seen))
                .filter(|(_, o)| o.tokens > 0)
                .map(|(n, o)| (n.clone(), *o))
                .collect(),
            held: held.clone(),
            missing: missing.clone(),
            state: names.iter().cloned().zip(state).collect(),
        };
        let mut next = now.clone();
        next.segments[k].decisions.push(decision);
        lineage_file::write(&self.path, &next)
            .context("writing a [mix.adaptive] decision to the lineage")?;
        self.pool.decided(k, step);
        self.reports.decided(&shares, held.is_some());
        self.keep_reports_for(&spec, next_decision_step(&spec, step));
        log_decision(
            step,
            (from, to),
            &names,
            &current,
            &shares,
            &seen,
            held.as_deref(),
        );
        if let Some(what) = &missing {
            tracing::warn!(
                "mix decision for step {step} made from the reports that came (on_missing = \
                 \"reported\"), without: {what}"
            );
        }
        Ok(Some(next))
    }

    /// Another node: give node 0 this node's reports for the decision, then wait for the
    /// decision in the lineage; the lineage with it (`None`: stopped meanwhile).
    fn learn(&self, step: u64, now: &Lineage) -> anyhow::Result<Option<Lineage>> {
        let spec = spec_of(now)?;
        let (from, to) = reported_steps(&spec, step).context("a decision step has reports")?;
        let wait = Duration::from_secs_f64(spec.wait_seconds);
        let will_not_come = |s: u64| s < self.store.placed_at() || self.past_end(s);
        let local = (self.reports).wait_for(from, to, wait, will_not_come);
        self.pool.send(now, step, (from, to), local)?;
        let stopped = || self.is_stopped() || self.past_end(step);
        let Some(next) =
            (self.pool).await_decision(&self.path, now, step, &self.reports, stopped)?
        else {
            return Ok(None);
        };
        let names = names_of(&next);
        if let Some(d) = newest(&next).decisions.iter().find(|d| d.step == step) {
            self.reports
                .decided(&by_name(&names, &d.shares), d.held.is_some());
        }
        self.keep_reports_for(&spec, next_decision_step(&spec, step));
        Ok(Some(next))
    }

    /// Why a decision keeps the shares: `what` did not come within `wait_seconds` (and with
    /// `on_missing = "reported"`, nothing came at all); and when the stream needed the decision
    /// more than `lag` steps before the slowest rank (`ranks_at`), by how much.
    fn why_held(
        &self,
        spec: &AdaptiveSpec,
        mode: OnMissing,
        what: &str,
        step: u64,
        ranks_at: u64,
    ) -> String {
        let mut why = match mode {
            OnMissing::Hold => format!(
                "on_missing = \"hold\": after {:.1} s no report of {what}",
                spec.wait_seconds
            ),
            OnMissing::Reported => format!(
                "on_missing = \"reported\": after {:.1} s no report at all ({what})",
                spec.wait_seconds
            ),
        };
        let ahead = step.saturating_sub(ranks_at);
        if ahead > spec.lag {
            why.push_str(&format!(
                "; the stream needed this decision while the slowest rank here was at step \
                 {ranks_at}, {ahead} steps before it (best_fit's pool and each lane's pipeline \
                 read ahead of the ranks): with a lag above {ahead} the reports come first"
            ));
        }
        why
    }

    /// With `[lanes]`, the shares nearest to `wanted` that the lanes can give: a source held by
    /// few lanes cannot have more than those lanes' tokens. The lanes' share solver's shares of
    /// the stream for `wanted` (`wanted` itself when every lane holds every source).
    /// `Err` says why it cannot (a lane left without a source of positive share: the decision
    /// then holds).
    fn lanes_can_give(&self, wanted: Vec<f64>) -> Result<Vec<f64>, String> {
        let Some(lanes) = &self.lanes else {
            return Ok(wanted);
        };
        match lane_shares(&lanes.present, &wanted) {
            Ok(s) if s.adjusted => Ok(s.global),
            Ok(_) => Ok(wanted),
            Err(lane) => Err(format!(
                "shares that leave lane {lane} no source to draw from"
            )),
        }
    }
}

/// The newest segment (a lineage has one at least).
fn newest(lineage: &Lineage) -> &dsprep_mixers::lineage::Segment {
    &lineage.segments[lineage.segments.len() - 1]
}

/// The newest segment's `[mix.adaptive]`.
fn spec_of(lineage: &Lineage) -> anyhow::Result<AdaptiveSpec> {
    let k = lineage.segments.len() - 1;
    match lineage.effective_recipe(k).mix.adaptive {
        Some(spec) => Ok(spec),
        None => bail!("the lineage's newest segment has no [mix.adaptive]"),
    }
}

/// The sources of the newest segment's effective recipe, in index order.
fn names_of(lineage: &Lineage) -> Vec<String> {
    let recipe = lineage.effective_recipe(lineage.segments.len() - 1);
    recipe.sources.iter().map(|s| s.name.clone()).collect()
}

/// The recipe's `[[source]]` weights, in index order.
fn weights_of(recipe: &dsprep_mixers::Recipe) -> Vec<f64> {
    recipe.sources.iter().map(|s| s.weight).collect()
}

/// Per name in `names`, its value in `map` (0 when absent).
fn by_name(names: &[String], map: &BTreeMap<String, f64>) -> Vec<f64> {
    names
        .iter()
        .map(|n| map.get(n).copied().unwrap_or(0.0))
        .collect()
}

/// One log line of a decision: each source's share before and after, with its reported loss.
fn log_decision(
    step: u64,
    (from, to): (u64, u64),
    names: &[String],
    before: &[f64],
    after: &[f64],
    seen: &[Observed],
    held: Option<&str>,
) {
    let parts: Vec<String> = (0..names.len())
        .filter(|&i| before[i] > 0.0 || after[i] > 0.0)
        .map(|i| {
            let loss = seen[i]
                .mean()
                .map_or(String::new(), |l| format!(" (loss {l:.3})"));
            format!("{} {:.4} → {:.4}{loss}", names[i], before[i], after[i])
        })
        .collect();
    match held {
        None => tracing::info!(
            "mix decision for step {step} from the reports of steps {from}..{to}: {}",
            parts.join(", ")
        ),
        Some(why) => tracing::warn!("mix decision for step {step} holds the shares: {why}"),
    }
}
