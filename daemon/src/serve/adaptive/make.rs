//! How a decision is made (node 0, a single daemon) or learned from node 0 (the other node
//! daemons), and why one keeps the shares: the [`Decider`]'s side that waits for reports.

use super::{Decider, by_name, names_of, newest, shares_in_force, spec_of};
use crate::checkpoint::lineage as lineage_file;
use anyhow::{Context, bail};
use dsprep_mixers::adaptive::{Decision, Observed, decide, next_decision_step, reported_steps};
use dsprep_mixers::lineage::Lineage;
use dsprep_mixers::recipe::{AdaptiveSpec, OnMissing};
use std::time::Duration;

impl Decider {
    /// Node 0 or a single daemon: wait for the reports, decide, write the decision to the
    /// lineage; the lineage with it (`None`: the stream ends before `step`).
    pub(super) fn make(&self, step: u64, now: &Lineage) -> anyhow::Result<Option<Lineage>> {
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
        let current = shares_in_force(now);
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
    pub(super) fn learn(&self, step: u64, now: &Lineage) -> anyhow::Result<Option<Lineage>> {
        let spec = spec_of(now)?;
        let (from, to) = reported_steps(&spec, step).context("a decision step has reports")?;
        let wait = Duration::from_secs_f64(spec.wait_seconds);
        let will_not_come = |s: u64| s < self.store.placed_at() || self.past_end(s);
        let local = (self.reports).wait_for(from, to, wait, will_not_come);
        if self.reports.is_closed() {
            bail!("the daemon is stopping: its reports for step {step} are kept, not sent");
        }
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
