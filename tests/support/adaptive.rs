//! `[mix.adaptive]` runs for the tests (tests/adaptive.rs, tests/adaptive_nodes.rs): the
//! synthetic loss the ranks report, the recipe's table, the decisions a lineage holds, and the
//! seed of the pseudo-random kill points.

use std::path::Path;

/// fineweb-edu's loss stays at 3 nats, c4's falls from 3, the others sit at 2 (source indices
/// in the quickstart's order).
pub const LOSS: &str = "0=3.0,1=3.0:-0.05,2=2.0,3=2.0,4=2.0";

/// The `[mix.adaptive]` table of the tests: `algorithm`, a decision every 3 steps from the
/// reports of the 3 steps 6 before it, `extra` lines.
pub fn adaptive_table(algorithm: &str, extra: &str) -> String {
    format!(
        "\n[mix.adaptive]\nalgorithm = \"{algorithm}\"\nevery = 3\nlag = 6\nwait_seconds = 2\n\
         max_change = 0.2\n{extra}"
    )
}

/// The decisions in the state directory's lineage, as JSON, in order.
pub fn decision_values(state: &Path) -> Vec<serde_json::Value> {
    let lineage: serde_json::Value =
        serde_json::from_slice(&std::fs::read(state.join("lineage.json")).unwrap()).unwrap();
    assert_eq!(lineage["lineage"]["format"], 2, "a lineage with decisions");
    (lineage["lineage"]["segments"].as_array().unwrap().iter())
        .flat_map(|s| s["decisions"].as_array().cloned().unwrap_or_default())
        .collect()
}

/// Decisions in the state directory's lineage: (step, held) each, in order.
pub fn decisions(state: &Path) -> Vec<(u64, bool)> {
    (decision_values(state).iter())
        .map(|d| (d["step"].as_u64().unwrap(), d.get("held").is_some()))
        .collect()
}

/// A seed for the kill points: `DSPREP_TEST_SEED`, else the clock (printed, to rerun a failure).
pub fn seed() -> u64 {
    std::env::var("DSPREP_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH))
                .unwrap()
                .as_nanos() as u64
        })
}
