//! A laned stream's lane points: per lane, where each segment of the stream's lineage
//! (`lineage.json`) takes over in that lane ([`LanePoint`]), in
//! `lineage.lanes/lane-NNNNN.json` of the state directory. Each file is written by the node
//! daemon that runs its lane (one writer: the lane's lock), atomically, when the lane first
//! runs past a change, with the sha256 of its content beside it; a torn or hand-edited file is
//! refused by name. `dsprep pack --lineage` reads every lane's.

use crate::files::write_atomic;
use anyhow::Context;
use dsprep_mixers::lineage::LanePoint;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// The folder of lane points in a state directory.
pub const LANE_POINTS_DIR: &str = "lineage.lanes";

#[derive(Serialize, Deserialize)]
struct PointsFile {
    sha256: String,
    lane: u32,
    points: Vec<LanePoint>,
}

/// Lane `lane`'s points file in `state_dir`.
pub fn path_in(state_dir: &Path, lane: u32) -> PathBuf {
    state_dir
        .join(LANE_POINTS_DIR)
        .join(format!("lane-{lane:05}.json"))
}

fn digest(lane: u32, points: &[LanePoint]) -> String {
    let body = serde_json::to_vec(&(lane, points)).expect("points always serialize");
    hex::encode(Sha256::digest(body))
}

/// Write lane `lane`'s points (atomically).
pub fn write(state_dir: &Path, lane: u32, points: &[LanePoint]) -> anyhow::Result<()> {
    let path = path_in(state_dir, lane);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let file = PointsFile {
        sha256: digest(lane, points),
        lane,
        points: points.to_vec(),
    };
    let mut bytes = serde_json::to_vec_pretty(&file).expect("a points file always serializes");
    bytes.push(b'\n');
    write_atomic(&path, &bytes).with_context(|| format!("cannot write {}", path.display()))
}

/// Lane `lane`'s points, checked; empty when it has none yet.
pub fn read(state_dir: &Path, lane: u32) -> anyhow::Result<Vec<LanePoint>> {
    let path = path_in(state_dir, lane);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let refuse = |why: &str| {
        anyhow::anyhow!(
            "lane points {} are not usable: {why}; they are never trusted so (remove the file: \
             the lane's node daemon finds its points again by running the lane)",
            path.display()
        )
    };
    let file: PointsFile = serde_json::from_slice(&bytes)
        .map_err(|_| refuse("not a lane points file: torn, or edited by hand"))?;
    if file.lane != lane {
        return Err(refuse(&format!("they are lane {}'s", file.lane)));
    }
    if digest(file.lane, &file.points) != file.sha256 {
        return Err(refuse(
            "their content does not match their sha256: edited by hand or torn",
        ));
    }
    Ok(file.points)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_round_trip_and_an_edit_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        assert!(read(dir.path(), 3).unwrap().is_empty());
        let points = vec![LanePoint {
            recipe_hash: "ab".into(),
            from_step: 0,
            window: 0,
            documents: 0,
        }];
        write(dir.path(), 3, &points).unwrap();
        assert_eq!(read(dir.path(), 3).unwrap(), points);
        let path = path_in(dir.path(), 3);
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replace("\"ab\"", "\"ac\"")).unwrap();
        let e = read(dir.path(), 3).unwrap_err().to_string();
        assert!(
            e.contains(&path.display().to_string()) && e.contains("sha256"),
            "{e}"
        );
    }
}
