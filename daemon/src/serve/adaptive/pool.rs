//! Node daemons pool their trainers' loss reports for a decision through the shared state
//! directory, once per decision (never per step). Node 0 decides for every node:
//!
//! - **Every other node**, when its streams reach a decision's token point, waits (up to
//!   `wait_seconds`) for its own ranks' reports of the steps the decision uses and writes their
//!   sums — or which of its ranks did not report — to
//!   `adaptive-reports/seg<K>-step<STEP>-node<N>.json` (atomic), then waits for the decision in
//!   `lineage.json`.
//! - **Node 0** waits for its own ranks the same way, then up to `wait_seconds` more for the
//!   other nodes' files; it sums them in node order, decides (or holds, naming the nodes and
//!   ranks it lacked), writes the lineage and removes the files it has used.
//!
//! A file of an earlier segment or an older step is never used for another decision: its name
//! says which it is for.

use super::{names_of, newest};
use crate::checkpoint::lineage as lineage_file;
use crate::files::{patiently, write_atomic};
use crate::serve::reports::{Missing, Reports};
use anyhow::{Context, bail};
use dsprep_mixers::adaptive::Observed;
use dsprep_mixers::lineage::Lineage;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How often a node looks for the files it waits for.
const POLL: Duration = Duration::from_millis(50);
/// How long another node, done waiting for a decision (the stream ends before its step), gives
/// node 0's write of it, if node 0 was making it, before it looks at the lineage a last time.
const LAST_LOOK: Duration = Duration::from_secs(1);
/// How long another node waits for node 0's decision before it says so (then 4 × as long
/// again, each time).
const SAY_AFTER: Duration = Duration::from_secs(30);

/// Where a daemon's decisions come from.
pub enum Pool {
    /// One daemon serves every rank: it decides from its own reports.
    Alone,
    /// Node 0 of `nodes`: decides from its reports and the other nodes' files in `dir`.
    Leader { dir: PathBuf, nodes: u32 },
    /// Node `node`: writes its sums to `dir` and follows node 0's decisions.
    Follower { dir: PathBuf, node: u32 },
}

/// One node's reports for one decision, as the file says them.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeReports {
    node: u32,
    segment: usize,
    step: u64,
    reports_from: u64,
    reports_to: u64,
    /// Per source name, the sums of the reports of the node's ranks that came.
    sums: BTreeMap<String, Observed>,
    /// What the node's ranks did not report (when some did not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    missing: Option<String>,
}

impl Pool {
    /// Node `node` of `nodes` with the state directory `state_dir` (created here: the folder of
    /// the nodes' files).
    pub fn of_node(state_dir: &Path, node: u32, nodes: u32) -> anyhow::Result<Pool> {
        if nodes <= 1 {
            return Ok(Pool::Alone);
        }
        let dir = state_dir.join("adaptive-reports");
        patiently(&dir, "create", || std::fs::create_dir_all(&dir))?;
        Ok(match node {
            0 => Pool::Leader { dir, nodes },
            _ => Pool::Follower { dir, node },
        })
    }

    fn file(dir: &Path, segment: usize, step: u64, node: u32) -> PathBuf {
        dir.join(format!("seg{segment}-step{step:012}-node{node:05}.json"))
    }

    /// Node 0 or a single daemon: the sums of every rank's reports for the decision for `step`
    /// that came (`local`: this daemon's ranks'), and what did not. Node 0 waits up to `wait`
    /// for the other nodes' files, and no longer once `gone()` (the stream ends before `step`).
    pub fn gather(
        &self,
        lineage: &Lineage,
        step: u64,
        local: (Vec<Observed>, Option<Missing>),
        wait: Duration,
        reports: &Reports,
        gone: impl Fn() -> bool,
    ) -> (Vec<Observed>, Option<String>) {
        let (mut sums, local_missing) = local;
        let mut missing: Vec<String> = local_missing.map(|m| m.what).into_iter().collect();
        let Pool::Leader { dir, nodes } = self else {
            return (sums, missing.pop());
        };
        let k = lineage.segments.len() - 1;
        let deadline = Instant::now() + wait;
        let mut heard: BTreeMap<u32, NodeReports> = BTreeMap::new();
        let mut said = std::collections::BTreeSet::new();
        loop {
            for node in 1..*nodes {
                if heard.contains_key(&node) {
                    continue;
                }
                match read(&Pool::file(dir, k, step, node)) {
                    Ok(Some(r)) => {
                        heard.insert(node, r);
                    }
                    Ok(None) => {}
                    Err(e) if said.insert(node) => tracing::warn!("{e} (waited past)"),
                    Err(_) => {}
                }
            }
            if heard.len() + 1 == *nodes as usize
                || Instant::now() >= deadline
                || reports.is_closed()
                || gone()
            {
                break;
            }
            std::thread::sleep(POLL);
        }
        let names = names_of(lineage);
        for node in 1..*nodes {
            let Some(file) = heard.get(&node) else {
                missing.push(format!(
                    "node {node} (no word from it within {:.1} s)",
                    wait.as_secs_f64()
                ));
                continue;
            };
            missing.extend(file.missing.clone());
            for (total, name) in sums.iter_mut().zip(&names) {
                let o = file.sums.get(name).copied().unwrap_or_default();
                total.loss_sum += o.loss_sum;
                total.tokens += o.tokens;
            }
        }
        let missing = (!missing.is_empty()).then(|| missing.join("; "));
        (sums, missing)
    }

    /// Another node: write its reports for the decision for `step` for node 0.
    pub fn send(
        &self,
        lineage: &Lineage,
        step: u64,
        (from, to): (u64, u64),
        (sums, missing): (Vec<Observed>, Option<Missing>),
    ) -> anyhow::Result<()> {
        let Pool::Follower { dir, node } = self else {
            return Ok(());
        };
        let sums = names_of(lineage).into_iter().zip(sums).collect();
        let missing = missing.map(|m| m.what);
        let k = lineage.segments.len() - 1;
        let file = NodeReports {
            node: *node,
            segment: k,
            step,
            reports_from: from,
            reports_to: to,
            sums,
            missing,
        };
        let path = Pool::file(dir, k, step, *node);
        let bytes = serde_json::to_vec_pretty(&file).context("a node's reports as JSON")?;
        patiently(&path, "write", || write_atomic(&path, &bytes))
    }

    /// Another node: wait for node 0's decision for `step` in the lineage at `path`, and give
    /// the lineage with it. It keeps waiting, saying so, as for node 0's window digests: node 0
    /// may be restarting, or its ranks paused (node 0 decides when its own streams need it).
    /// `None` once `stopped()`: the stream ended before the decision's step (node 0 never makes
    /// it then), and nothing this node makes is served any more.
    pub fn await_decision(
        &self,
        path: &Path,
        now: &Lineage,
        step: u64,
        reports: &Reports,
        stopped: impl Fn() -> bool,
    ) -> anyhow::Result<Option<Lineage>> {
        let began = Instant::now();
        let mut say_at = SAY_AFTER;
        // Read again only when the file changed (node 0 replaces it whole: its size or time
        // moves), so a long lineage is not parsed every poll.
        let seen = std::cell::Cell::new(None);
        let decided = || -> anyhow::Result<Option<Lineage>> {
            let stamp = std::fs::metadata(path)
                .ok()
                .map(|m| (m.len(), m.modified().ok()));
            if stamp.is_some() && seen.replace(stamp) == stamp {
                return Ok(None);
            }
            Ok(lineage_file::read(path)?.filter(|lineage| {
                lineage.segments.len() == now.segments.len()
                    && newest(lineage).decisions.iter().any(|d| d.step == step)
            }))
        };
        loop {
            if let Some(lineage) = decided()? {
                return Ok(Some(lineage));
            }
            if stopped() {
                // Node 0 may have found the decision due just before it learned of the end, as
                // this node learned of it: what node 0 writes is what every lane applies.
                std::thread::sleep(LAST_LOOK);
                return decided();
            }
            if reports.is_closed() {
                bail!("the daemon is stopping: the decision for step {step} is not known");
            }
            if began.elapsed() >= say_at {
                tracing::warn!(
                    "waiting {} s for node 0's mix decision for step {step} in {} (is node 0's \
                     daemon running? It decides for every node)",
                    began.elapsed().as_secs(),
                    path.display()
                );
                say_at *= 4;
            }
            std::thread::sleep(POLL);
        }
    }

    /// Node 0 made the decision for `step` of segment `segment`: the files it used, and any of
    /// earlier decisions or segments, are removed.
    pub fn decided(&self, segment: usize, step: u64) {
        let Pool::Leader { dir, .. } = self else {
            return;
        };
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some((seg, at)) = parse_name(&name.to_string_lossy()) else {
                continue;
            };
            if seg < segment || (seg == segment && at <= step) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

/// `seg<K>-step<STEP>-node<N>.json`: its segment and step.
fn parse_name(name: &str) -> Option<(usize, u64)> {
    let rest = name.strip_prefix("seg")?.strip_suffix(".json")?;
    let (seg, rest) = rest.split_once("-step")?;
    let (step, _) = rest.split_once("-node")?;
    Some((seg.parse().ok()?, step.parse().ok()?))
}

/// A node's file, if it is there; why it does not read, if it does not.
fn read(path: &Path) -> Result<Option<NodeReports>, String> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| format!("{} does not read as a node's reports: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use dsprep_mixers::test_fixtures::recipe;

    #[test]
    fn names_say_their_segment_and_step() {
        let path = Pool::file(Path::new("/s"), 2, 45, 3);
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        assert_eq!(name, "seg2-step000000000045-node00003.json");
        assert_eq!(parse_name(&name), Some((2, 45)));
        assert_eq!(parse_name("seg2-step45.json"), None);
        assert_eq!(parse_name("other.json"), None);
    }

    fn observed(loss_sum: f64, tokens: u64) -> Vec<Observed> {
        vec![Observed { loss_sum, tokens }]
    }

    /// Three nodes: node 0 sums its own reports and the others'; node 2's file says which of its
    /// ranks were silent (and sums those that were not), and a decision without node 1's file
    /// names it. Used files are removed.
    #[test]
    fn node_0_sums_every_node_and_names_what_is_missing() {
        let tmp = tempfile::tempdir().unwrap();
        let lineage = Lineage::start(recipe(), "/r".into(), 6, 1);
        let leader = Pool::of_node(tmp.path(), 0, 3).unwrap();
        let node = |n: u32| Pool::of_node(tmp.path(), n, 3).unwrap();
        let reports = Reports::new(vec!["a".into()], 2, Some(0));
        let wait = Duration::from_millis(100);
        let all = |sums| (sums, None);
        node(1)
            .send(&lineage, 9, (0, 3), all(observed(6.0, 3)))
            .unwrap();
        node(2)
            .send(&lineage, 9, (0, 3), all(observed(1.5, 1)))
            .unwrap();
        let no = || false;
        let got = leader.gather(&lineage, 9, all(observed(2.0, 1)), wait, &reports, no);
        assert_eq!(got, (observed(9.5, 5), None));

        let silent = Missing {
            what: "step 3 from every rank of node 2".into(),
        };
        // Node 1's file does not read (a torn copy from elsewhere): waited past, named as silent.
        std::fs::write(
            Pool::file(&tmp.path().join("adaptive-reports"), 0, 12, 1),
            b"{",
        )
        .unwrap();
        let partly = (observed(0.5, 1), Some(silent));
        node(2).send(&lineage, 12, (3, 6), partly).unwrap();
        let got = leader.gather(&lineage, 12, all(observed(2.0, 1)), wait, &reports, no);
        let what = "node 1 (no word from it within 0.1 s); step 3 from every rank of node 2";
        assert_eq!(got, (observed(2.5, 2), Some(what.to_string())));
        leader.decided(0, 12);
        let left: Vec<_> = std::fs::read_dir(tmp.path().join("adaptive-reports"))
            .unwrap()
            .collect();
        assert!(left.is_empty(), "{left:?}");
        assert!(matches!(
            Pool::of_node(tmp.path(), 0, 1).unwrap(),
            Pool::Alone
        ));
    }
}
