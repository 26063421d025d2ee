//! One stream's side of `[mix.adaptive]`: the reader's [`MixDecider`]. It knows the token point,
//! in this stream's own tokens, of the next decision — the daemon's stream, or one lane's share
//! of the stream before that point (`lane_tokens_before`, as `[[mix.phase]]` points are) — and
//! when the reader reaches it, takes the decision from the [`Decider`] and gives its phase: the
//! decision's weights, or the lane's own weights for them.

use super::Decider;
use crate::driver::pipeline::MixDecider;
use anyhow::Context;
use dsprep_mixers::adaptive::next_decision_step;
use dsprep_mixers::lanes::lane_tokens_before;
use dsprep_mixers::recipe::AdaptiveSpec;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

/// The decisions of one stream (the daemon's, or lane `lane`'s).
pub struct Planner {
    decider: Arc<Decider>,
    lane: Option<u32>,
    /// This stream's token point of the next decision (`u64::MAX` before the first call).
    due: AtomicU64,
    /// The next decision's step, and the spec (after the first call).
    next: Mutex<Option<(u64, AdaptiveSpec)>>,
    /// No decision is coming any more: the stream ended before the next, or its windows are no
    /// longer taken.
    done: AtomicBool,
}

impl Planner {
    /// The planner of the daemon's one stream (`lane` `None`) or of lane `lane`.
    pub fn new(decider: Arc<Decider>, lane: Option<u32>) -> Planner {
        Planner {
            decider,
            lane,
            due: AtomicU64::new(u64::MAX),
            next: Mutex::new(None),
            done: AtomicBool::new(false),
        }
    }

    /// This stream's own token count at the stream's token `at`.
    fn own_point(&self, at: u64) -> u64 {
        match (self.lane, &self.decider.lanes) {
            (Some(lane), Some(lanes)) => {
                lane_tokens_before(&lanes.spec, self.decider.window_tokens, lane, at)
            }
            _ => at,
        }
    }
}

impl MixDecider for Planner {
    fn before_draw(&self, tokens: u64) -> anyhow::Result<Vec<(u64, Vec<f64>)>> {
        let due = self.due.load(Relaxed);
        if (due != u64::MAX && tokens < due) || self.done.load(Relaxed) {
            return Ok(Vec::new());
        }
        let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
        let (mut step, spec) = match next.take() {
            Some(next) => next,
            None => {
                let (step, at, spec) = self.decider.first()?;
                self.due.store(self.own_point(at), Relaxed);
                (step, spec)
            }
        };
        let mut phases = Vec::new();
        while tokens >= self.due.load(Relaxed) {
            let due = self.due.load(Relaxed);
            tracing::debug!(lane = ?self.lane, tokens, step, due, "a mix decision is due");
            let Some(made) = self.decider.decision(step)? else {
                self.done.store(true, Relaxed); // nothing drawn from here on is served
                break;
            };
            let weights = match self.lane {
                Some(lane) => (made.lane_weights.get(lane as usize).cloned())
                    .with_context(|| format!("lane {lane} has no weights in the decision"))?,
                None => made.weights.clone(),
            };
            phases.push((self.own_point(made.at_tokens), weights));
            step = next_decision_step(&spec, step);
            let start = self.decider.start()?;
            let at = self.decider.at_tokens(&start, step);
            self.due.store(self.own_point(at), Relaxed);
        }
        *next = Some((step, spec));
        Ok(phases)
    }
}
