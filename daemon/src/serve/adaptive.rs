//! `[mix.adaptive]` in a daemon: the reader's [`MixDecider`]. When the stream reaches the token
//! point of the next decision step, it waits (up to `wait_seconds`) for the trainers' reports of
//! the steps the decision uses ([`Reports::wait_for`]), computes the new shares
//! ([`dsprep_mixers::adaptive::decide`]), or keeps them when reports are missing
//! (`on_missing = "hold"`), and writes the decision to `lineage.json` before the reader draws
//! another document: every byte served under it can be replayed from the lineage.

use super::reports::Reports;
use super::store::StepStore;
use crate::checkpoint::lineage as lineage_file;
use crate::driver::pipeline::MixDecider;
use anyhow::{Context, bail};
use dsprep_mixers::adaptive::{Decision, Observed, decide, next_decision_step, reported_steps};
use dsprep_mixers::lineage::Lineage;
use dsprep_mixers::mixer::target_shares;
use dsprep_mixers::recipe::AdaptiveSpec;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The decisions of a daemon's newest segment.
pub struct Decider {
    /// The state directory's lineage file: read at each decision, written with it.
    path: PathBuf,
    reports: Arc<Reports>,
    /// Where the trainers resumed: reports of earlier steps will not come.
    store: Arc<StepStore>,
    window_tokens: u64,
    /// The token point of the next decision (0 before the first call).
    next_at: AtomicU64,
    next_step: Mutex<Option<u64>>,
}

impl Decider {
    pub fn new(
        path: PathBuf,
        reports: Arc<Reports>,
        store: Arc<StepStore>,
        window_tokens: u64,
    ) -> Decider {
        Decider {
            path,
            reports,
            store,
            window_tokens,
            next_at: AtomicU64::new(0),
            next_step: Mutex::new(None),
        }
    }

    fn read(&self) -> anyhow::Result<(Lineage, AdaptiveSpec)> {
        let Some(lineage) = lineage_file::read(&self.path)? else {
            bail!(
                "{} is gone: [mix.adaptive] writes its decisions there",
                self.path.display()
            );
        };
        let k = lineage.segments.len() - 1;
        let Some(spec) = lineage.effective_recipe(k).mix.adaptive else {
            bail!("the lineage's newest segment has no [mix.adaptive]");
        };
        Ok((lineage, spec))
    }

    /// The step the next decision governs, after the lineage's last one, and its token point;
    /// the reports of steps it does not use are ignored from then on.
    fn plan_next(&self, lineage: &Lineage, spec: &AdaptiveSpec) -> u64 {
        let k = lineage.segments.len() - 1;
        let segment = &lineage.segments[k];
        let after = (segment.decisions.last()).map_or(segment.from_step, |d| d.step);
        if let Some(last) = segment.decisions.last() {
            let recipe = lineage.effective_recipe(k);
            let names: Vec<String> = recipe.sources.iter().map(|s| s.name.clone()).collect();
            self.reports.set_shares(&by_name(&names, &last.shares));
        }
        let step = next_decision_step(spec, after);
        if let Some((from, _)) = reported_steps(spec, step) {
            self.reports.keep_from(from);
        }
        self.next_at
            .store(lineage.window_of_step(step) * self.window_tokens, Relaxed);
        step
    }

    /// Make the decision for `step`, write it, and give its phase and the lineage with it (the
    /// daemon is the lineage's one writer while it runs: read once per decision, then written).
    fn decide(&self, step: u64) -> anyhow::Result<((u64, Vec<f64>), Lineage, AdaptiveSpec)> {
        let (mut lineage, spec) = self.read()?;
        let (from, to) = reported_steps(&spec, step).context("a decision step has reports")?;
        let wait = Duration::from_secs_f64(spec.wait_seconds);
        let observed = (self.reports).wait_for(from, to, wait, || self.store.placed_at());
        if self.reports.is_closed() {
            bail!("the daemon is stopping: the decision for step {step} is not made");
        }
        let k = lineage.segments.len() - 1;
        let recipe = lineage.effective_recipe(k);
        let names: Vec<String> = recipe.sources.iter().map(|s| s.name.clone()).collect();
        let segment = &lineage.segments[k];
        let last = segment.decisions.last();
        let current: Vec<f64> = match last {
            Some(d) => by_name(&names, &d.shares),
            None => target_shares(&recipe.sources.iter().map(|s| s.weight).collect::<Vec<_>>()),
        };
        let state = last.map_or_else(Vec::new, |d| by_name(&names, &d.state));
        let (shares, state, seen, held) = match observed {
            Ok(seen) => {
                let (shares, state) = decide(&spec, &current, &state, step, &seen);
                (shares, state, seen, None)
            }
            Err(missing) => {
                let why = format!(
                    "on_missing = \"hold\": after {:.1} s no report of {}",
                    spec.wait_seconds, missing.what
                );
                let state = if state.is_empty() {
                    vec![0.0; names.len()]
                } else {
                    state
                };
                (
                    current.clone(),
                    state,
                    vec![Observed::default(); names.len()],
                    Some(why),
                )
            }
        };
        let at_tokens = lineage.window_of_step(step) * self.window_tokens;
        let decision = Decision {
            step,
            at_tokens,
            reports_from: from,
            reports_to: to,
            shares: names.iter().cloned().zip(shares.iter().copied()).collect(),
            observed: (names.iter().zip(&seen))
                .filter(|(_, o)| o.tokens > 0)
                .map(|(n, o)| (n.clone(), *o))
                .collect(),
            held: held.clone(),
            state: names.iter().cloned().zip(state).collect(),
        };
        let phase = decision.phase();
        lineage.segments[k].decisions.push(decision);
        lineage_file::write(&self.path, &lineage)
            .context("writing a [mix.adaptive] decision to the lineage")?;
        self.reports.decided(&shares, held.is_some());
        log_decision(
            step,
            from,
            to,
            &names,
            &current,
            &shares,
            &seen,
            held.as_deref(),
        );
        Ok(((at_tokens, recipe.weights_of(&phase)), lineage, spec))
    }
}

/// Per name in `names`, its value in `map` (0 when absent).
fn by_name(names: &[String], map: &BTreeMap<String, f64>) -> Vec<f64> {
    names
        .iter()
        .map(|n| map.get(n).copied().unwrap_or(0.0))
        .collect()
}

#[allow(clippy::too_many_arguments)] // one log line of a decision's parts
fn log_decision(
    step: u64,
    from: u64,
    to: u64,
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

impl MixDecider for Decider {
    fn before_draw(&self, tokens: u64) -> anyhow::Result<Vec<(u64, Vec<f64>)>> {
        let due = self.next_at.load(Relaxed);
        if due > 0 && tokens < due {
            return Ok(Vec::new());
        }
        let mut next = self.next_step.lock().unwrap_or_else(|p| p.into_inner());
        let mut step = match *next {
            Some(step) => step,
            None => {
                let (lineage, spec) = self.read()?;
                self.plan_next(&lineage, &spec)
            }
        };
        let mut phases = Vec::new();
        while tokens >= self.next_at.load(Relaxed) {
            let (phase, lineage, spec) = self.decide(step)?;
            phases.push(phase);
            step = self.plan_next(&lineage, &spec);
        }
        *next = Some(step);
        Ok(phases)
    }
}
