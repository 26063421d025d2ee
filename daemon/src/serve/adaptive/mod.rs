//! `[mix.adaptive]` in a daemon. The [`Decider`] makes (or, on a node daemon other than node
//! 0, learns) each decision once for the whole daemon; a [`Planner`] per stream — the one
//! stream of a daemon, or each lane a node runs — asks it when that stream reaches the decision's
//! token point, and gives the reader the phase to add before it draws another document.
//!
//! A decision for step `d` waits (up to `wait_seconds`) for the trainers' reports of the steps it
//! uses ([`Reports::wait_for`]); node daemons pool theirs through the state directory
//! ([`pool`]): node 0 decides for every node. It computes the new shares
//! ([`dsprep_mixers::adaptive::decide`]), or keeps them when reports are missing
//! (`on_missing = "hold"`), or decides from those that came (`"reported"`); with `[lanes]` the
//! shares are those the lanes can give ([`Decider::lanes_can_give`]). The decision is written to
//! `lineage.json` before any stream draws a document under it: every byte served under it can be
//! replayed from the lineage.

mod lanes;
mod make;
mod planner;
pub mod pool;

pub use lanes::LaneShape;
pub use planner::Planner;

use super::reports::{Reports, pending};
use super::store::StepStore;
use anyhow::{Context, bail};
use dsprep_mixers::adaptive::{Decision, next_decision_step, reported_steps};
use dsprep_mixers::lanes::lane_shares;
use dsprep_mixers::lineage::Lineage;
use dsprep_mixers::mixer::target_shares;
use dsprep_mixers::recipe::AdaptiveSpec;
use pool::Pool;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

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

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The streams begin from `lineage` (the daemon's course once placed: what their mixers are
    /// built with; node 0 and a single daemon have written it).
    pub fn begin(&self, lineage: &Lineage) -> anyhow::Result<()> {
        let spec = spec_of(lineage)?;
        self.reports.set_shares(&shares_in_force(lineage));
        self.keep_reports_for(&spec, next_after(lineage, &spec));
        self.take_back_pending(lineage);
        let lineage = Arc::new(lineage.clone());
        let mut state = self.lock();
        state.start = Some(Arc::clone(&lineage));
        state.now = Some(lineage);
        Ok(())
    }

    /// This daemon's file of unused reports kept at a graceful stop.
    fn pending_path(&self) -> Option<PathBuf> {
        let state_dir = self.path.parent()?;
        Some(pending::path(state_dir, self.reports.node()))
    }

    /// Take back the reports kept at the last graceful stop, if this daemon serves their ranks.
    fn take_back_pending(&self, lineage: &Lineage) {
        let Some(path) = self.pending_path() else {
            return;
        };
        match pending::take(&path) {
            Ok(None) => {}
            Ok(Some(kept)) => match self.reports.take_back(kept, lineage.segments.len()) {
                Ok(steps) => tracing::info!(
                    "took back the unused loss reports of {steps} steps kept at the last stop"
                ),
                Err(why) => tracing::warn!(
                    "the unused loss reports kept at the last stop are not used: {why}"
                ),
            },
            Err(e) => tracing::warn!("{e:#}"),
        }
    }

    /// The daemon stops gracefully: keep the reports no decision has used, for the daemon that
    /// resumes on these ranks.
    pub fn keep_pending(&self) {
        let Some(start) = self.lock().start.clone() else {
            return; // never began: nothing was reported
        };
        let Some(path) = self.pending_path() else {
            return;
        };
        let kept = self.reports.pending(start.segments.len());
        let steps = kept.steps.len();
        match pending::save(&path, &kept) {
            Ok(()) if steps > 0 => tracing::info!(
                "kept the unused loss reports of {steps} steps in {}",
                path.display()
            ),
            Ok(()) => {}
            Err(e) => tracing::warn!("{e:#} (the next decisions may hold)"),
        }
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
        let step = next_after(&start, &spec);
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
            // The one writer of the lineage skips a decision past the end: it is then in no
            // lineage, and no lane applies it. Another node learns that from node 0 (`learn`).
            let writer = !matches!(self.pool, Pool::Follower { .. });
            if writer && !state.making && self.lanes.is_some() {
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

/// Per source, the shares in force at the end of `lineage`: its newest segment's last
/// decision's, else that segment's recipe's.
fn shares_in_force(lineage: &Lineage) -> Vec<f64> {
    let k = lineage.segments.len() - 1;
    match lineage.segments[k].decisions.last() {
        Some(last) => by_name(&names_of(lineage), &last.shares),
        None => target_shares(&weights_of(&lineage.effective_recipe(k))),
    }
}

/// The step of the first decision after those `lineage` holds.
fn next_after(lineage: &Lineage, spec: &AdaptiveSpec) -> u64 {
    let segment = newest(lineage);
    let after = (segment.decisions.last()).map_or(segment.from_step, |d| d.step);
    next_decision_step(spec, after)
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
