//! Online mixing (`[mix.adaptive]`): from the loss the trainers reported per source, new token
//! shares for the stream. Plain arithmetic, IO-free: the daemon gathers the reports and writes
//! each [`Decision`] to the stream's lineage before the shares take effect; a replay reads the
//! decisions and never computes them again.
//!
//! A decision's shares become a phase of the mix (`[[mix.phase]]` semantics): they hold from the
//! first document drawn once the stream has `at_tokens` tokens, which is the token the packer
//! starts the decision's step with (`step × global_batch × (seq_len + 1)` tokens of windows;
//! with `best_fit`, whose windows end in padding, the phase begins a little after the step).

use crate::recipe::{AdaptiveSpec, Algorithm, PhaseSpec};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What the trainers reported for one source over the steps a decision uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Observed {
    /// The sum of the per-token loss over the source's counted tokens.
    pub loss_sum: f64,
    /// The tokens whose labels counted.
    pub tokens: u64,
}

impl Observed {
    /// The mean loss per token (`None` without tokens).
    pub fn mean(&self) -> Option<f64> {
        (self.tokens > 0).then(|| self.loss_sum / self.tokens as f64)
    }
}

/// One decision of an adaptive mix, as the lineage records it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Decision {
    /// The step it governs from.
    pub step: u64,
    /// The stream's token count from which its shares hold (see the module's doc).
    pub at_tokens: u64,
    /// The reported steps it used, `from..to`.
    pub reports_from: u64,
    pub reports_to: u64,
    /// Per source name, its token share from here on (every source of the mix).
    pub shares: BTreeMap<String, f64>,
    /// Per source name, what the reports said (sources without tokens are left out).
    pub observed: BTreeMap<String, Observed>,
    /// Why the shares were kept, when the decision held them (`on_missing = "hold"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<String>,
    /// The reports that did not come, when the decision was made from those that did
    /// (`on_missing = "reported"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missing: Option<String>,
    /// The algorithm's state after the decision, per source name (`exp3`: the reward estimate;
    /// `softmax`: the last mean loss seen).
    pub state: BTreeMap<String, f64>,
}

impl Decision {
    /// The decision as a phase of the mix.
    pub fn phase(&self) -> PhaseSpec {
        PhaseSpec {
            at_tokens: self.at_tokens,
            weights: self.shares.clone(),
        }
    }
}

/// The steps whose reports the decision for `step` uses, `from..to`: the `every` steps that end
/// `lag` steps before it (`None`: `step` is not a decision step, or has no steps to use).
pub fn reported_steps(spec: &AdaptiveSpec, step: u64) -> Option<(u64, u64)> {
    if spec.every == 0 || step == 0 || !step.is_multiple_of(spec.every) || step <= spec.lag {
        return None;
    }
    let to = step - spec.lag;
    Some((to.saturating_sub(spec.every), to))
}

/// The first decision step after `step` (`step` itself excluded).
pub fn next_decision_step(spec: &AdaptiveSpec, step: u64) -> u64 {
    let every = spec.every.max(1);
    let mut next = (step / every + 1) * every;
    while next <= spec.lag {
        next += every;
    }
    next
}

/// New shares from `observed` (per source, in the order of `current`), with the bounds of
/// `spec` applied. `state` is the algorithm's state after the previous decision (empty before
/// the first), `step` the step the decision governs (ODM's `t`, the steps trained so far: its
/// exploration falls as `√(ln K / (K t))`). Sources whose current share is 0 take no part and
/// stay at 0. Returns the shares and the next state.
pub fn decide(
    spec: &AdaptiveSpec,
    current: &[f64],
    state: &[f64],
    step: u64,
    observed: &[Observed],
) -> (Vec<f64>, Vec<f64>) {
    let n = current.len();
    let part: Vec<usize> = (0..n).filter(|&i| current[i] > 0.0).collect();
    let k = part.len().max(1) as f64;
    let mut next_state: Vec<f64> = (0..n)
        .map(|i| state.get(i).copied().unwrap_or(0.0))
        .collect();
    let mut target = vec![0.0; n];
    match spec.algorithm {
        Algorithm::Exp3 => {
            // ODM: R̂_i ← α R̂_i + (1 − α) L_i / π_i; π_i = (1 − K γ_t) softmax(η R̂)_i + γ_t with
            // γ_t = min(1/K, √(ln K / (K t))), t the steps so far. ODM's exponent rate is γ too,
            // which at thousands of steps all but freezes the shares: here it is `learning_rate`.
            for &i in &part {
                if let Some(loss) = observed[i].mean() {
                    next_state[i] =
                        spec.smoothing * next_state[i] + (1.0 - spec.smoothing) * loss / current[i];
                }
            }
            let logits: Vec<f64> = part
                .iter()
                .map(|&i| spec.learning_rate * next_state[i])
                .collect();
            let soft = softmax(&logits);
            let t = step.max(1) as f64;
            let gamma = (1.0 / k).min((k.ln() / (k * t)).sqrt());
            for (j, &i) in part.iter().enumerate() {
                target[i] = (1.0 - k * gamma) * soft[j] + gamma;
            }
        }
        Algorithm::Softmax => {
            for &i in &part {
                if let Some(loss) = observed[i].mean() {
                    next_state[i] = loss;
                }
            }
            let logits: Vec<f64> = part
                .iter()
                .map(|&i| next_state[i] / spec.temperature)
                .collect();
            for (j, share) in softmax(&logits).into_iter().enumerate() {
                target[part[j]] = share;
            }
        }
    }
    (bounded(spec, current, &target, &part), next_state)
}

/// `target` within the bounds: every taking part source at least `min_weight`
/// (`m + (1 − K m) × target`), and no share moved more than `max_change` from `current` (the
/// whole move scaled down, so the shares still sum to 1).
fn bounded(spec: &AdaptiveSpec, current: &[f64], target: &[f64], part: &[usize]) -> Vec<f64> {
    let k = part.len() as f64;
    let m = spec.min_weight;
    let floored: Vec<f64> = (0..current.len())
        .map(|i| match part.contains(&i) {
            true => m + (1.0 - k * m) * target[i],
            false => 0.0,
        })
        .collect();
    let largest = part
        .iter()
        .map(|&i| (floored[i] - current[i]).abs())
        .fold(0.0, f64::max);
    let scale = if largest > spec.max_change {
        spec.max_change / largest
    } else {
        1.0
    };
    (0..current.len())
        .map(|i| match part.contains(&i) {
            true => current[i] + scale * (floored[i] - current[i]),
            false => 0.0,
        })
        .collect()
}

/// The softmax of `logits`, shifted by their largest for range.
fn softmax(logits: &[f64]) -> Vec<f64> {
    let top = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let exp: Vec<f64> = logits.iter().map(|l| (l - top).exp()).collect();
    let sum: f64 = exp.iter().sum();
    exp.iter().map(|e| e / sum).collect()
}

#[cfg(test)]
mod tests;
