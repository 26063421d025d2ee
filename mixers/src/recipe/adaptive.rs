//! `[mix.adaptive]`: online mixing from the trainers' per-source loss. The settings and their
//! checks; the algorithms are `crate::adaptive`'s.

use serde::{Deserialize, Serialize};

/// `[mix.adaptive]`: every `every` steps the daemon decides new token shares from the loss the
/// trainers reported for the `every` steps that end `lag` steps before the decision's step, and
/// writes the decision to the stream's lineage before it takes effect.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AdaptiveSpec {
    pub algorithm: Algorithm,
    /// Steps between decisions: decisions are made for steps `every`, `2 × every`, … (those
    /// above `lag`).
    pub every: u64,
    /// Steps between the last reported step a decision uses and the step it governs. Must
    /// exceed the daemon's prefetch, so that the reports are in before the step is made.
    pub lag: u64,
    /// The least token share any source of the mix keeps (0 to 1 / sources).
    #[serde(default = "default_min_weight")]
    pub min_weight: f64,
    /// The most a source's share may move in one decision, in share points (0 to 1].
    #[serde(default = "default_max_change")]
    pub max_change: f64,
    /// `softmax`: shares ∝ exp(loss / temperature).
    #[serde(default = "default_temperature")]
    pub temperature: f64,
    /// `exp3`: how much of the running reward estimate each decision keeps (ODM's smoothing α).
    #[serde(default = "default_smoothing")]
    pub smoothing: f64,
    /// `exp3`: the rate η of the exponent, shares ∝ exp(η × reward estimate) (per nat of loss ÷
    /// share).
    #[serde(default = "default_learning_rate")]
    pub learning_rate: f64,
    /// How long the daemon waits for the reports a decision needs, in seconds, before it makes
    /// the `on_missing` decision.
    #[serde(default = "default_wait_seconds")]
    pub wait_seconds: f64,
    #[serde(default)]
    pub on_missing: OnMissing,
}

/// How new shares are computed from the reported loss.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    /// Online Data Mixing (Albalak et al. 2023, arXiv 2312.02406): EXP3 with each source's mean
    /// loss as its reward, importance-weighted by its share and smoothed, ODM's exploration
    /// rate, and the exponent's rate as its own setting (`learning_rate`).
    Exp3,
    /// Shares ∝ exp(mean loss / temperature).
    Softmax,
}

impl Algorithm {
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Exp3 => "exp3",
            Algorithm::Softmax => "softmax",
        }
    }
}

/// What a decision does when reports it needs did not come within `wait_seconds`.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum OnMissing {
    /// Keep the shares in force (the decision is still logged, saying why).
    #[default]
    Hold,
    /// Decide from the reports that did come (a rank that never reports does not freeze the
    /// mix); with none at all, keep the shares. The decision records what was missing.
    Reported,
}

fn default_min_weight() -> f64 {
    0.01
}
fn default_max_change() -> f64 {
    0.1
}
fn default_temperature() -> f64 {
    1.0
}
fn default_smoothing() -> f64 {
    0.9
}
fn default_learning_rate() -> f64 {
    1.0
}
fn default_wait_seconds() -> f64 {
    60.0
}

/// The problems of `[mix.adaptive]` in a recipe with `sources` sources taking part, each with
/// its field path.
pub(super) fn adaptive_problems(spec: &AdaptiveSpec, sources: usize) -> Vec<(String, String)> {
    let mut problems = Vec::new();
    let mut fail = |field: &str, why: String| problems.push((format!("mix.adaptive.{field}"), why));
    if spec.every == 0 {
        fail("every", "must be at least 1 step".into());
    }
    if spec.lag == 0 {
        fail(
            "lag",
            "must be at least 1 step (and above the daemon's prefetch)".into(),
        );
    }
    let most = 1.0 / sources.max(1) as f64;
    if !(spec.min_weight.is_finite() && spec.min_weight >= 0.0 && spec.min_weight <= most) {
        fail(
            "min_weight",
            format!(
                "must be between 0 and 1 / {sources} sources = {most}, got {}",
                spec.min_weight
            ),
        );
    }
    if !(spec.max_change.is_finite() && spec.max_change > 0.0 && spec.max_change <= 1.0) {
        fail(
            "max_change",
            format!("must be above 0 and at most 1, got {}", spec.max_change),
        );
    }
    if !(spec.temperature.is_finite() && spec.temperature > 0.0) {
        fail(
            "temperature",
            format!("must be above 0, got {}", spec.temperature),
        );
    }
    if !(spec.smoothing.is_finite() && (0.0..1.0).contains(&spec.smoothing)) {
        fail(
            "smoothing",
            format!("must be at least 0 and below 1, got {}", spec.smoothing),
        );
    }
    if !(spec.learning_rate.is_finite() && spec.learning_rate > 0.0) {
        fail(
            "learning_rate",
            format!("must be above 0, got {}", spec.learning_rate),
        );
    }
    if !(spec.wait_seconds.is_finite() && spec.wait_seconds >= 0.0 && spec.wait_seconds <= 86_400.0)
    {
        fail(
            "wait_seconds",
            format!("must be between 0 and 86400, got {}", spec.wait_seconds),
        );
    }
    problems
}
