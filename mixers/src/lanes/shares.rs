//! Per-lane weights that hold the recipe's shares of the whole stream when some sources are
//! missing from some lanes (a source with fewer units than lanes).
//!
//! A lane mixes only the sources it holds units of. The stream takes the same number of windows
//! from every lane, so in a mix in tokens a source's share of the stream is the mean of its
//! shares in the lanes. When every source of a phase is in every lane, each lane keeps the
//! recipe's weights as written (the bytes of such recipes do not change). Otherwise the lanes'
//! shares `s[l][i]` solve
//!
//! ```text
//! s[l][i] = 0 where lane l has no unit of source i,   Σ_i s[l][i] = 1 in every lane,
//! mean over lanes of s[l][i] = p_i                    (the recipe's share of source i)
//! ```
//!
//! by iterative proportional fitting from `s[l][i] = p_i` where present: the solution of the form
//! `p_i · x_i · y_l`, the least change from the recipe's shares in relative entropy. It runs a
//! bounded number of rounds in a fixed order with plain `f64` arithmetic, so every process (node
//! daemons, pack parts, plan) gets the same weights. When no solution exists — a source in `k` of
//! `L` lanes whose share is above `k / L` cannot reach it even with those lanes to itself — the
//! fitting ends after its rounds, and [`LaneShares::global`] says what the lanes will give.

/// Rounds of fitting at most (a solution is usually reached in a few dozen).
const MAX_ROUNDS: usize = 5000;
/// How close every source's mean share must come to its target to stop early.
const TOLERANCE: f64 = 1e-13;

/// The weights each lane's mixer uses for one phase.
#[derive(Clone, Debug, PartialEq)]
pub struct LaneShares {
    /// Per lane, per source: the lane's weights (the recipe's own when not `adjusted`).
    pub weights: Vec<Vec<f64>>,
    /// Per source: its share of the stream under these weights (the mean of the lanes' shares).
    pub global: Vec<f64>,
    /// Whether any lane's weights differ from the recipe's.
    pub adjusted: bool,
    /// Per source: its share of the stream when every lane mixes the sources it holds by the
    /// recipe's weights instead (what a mix in documents does: there it is the mean of the lanes'
    /// shares of documents, an estimate, as lanes emit equal tokens, not equal documents).
    pub as_dealt: Vec<f64>,
}

/// The lanes' weights for a phase of `weights` (one per source), given `present[lane][source]`:
/// whether the lane holds units of the source. `Err(lane)` names a lane that holds no source of
/// positive weight (it would have nothing to give in this phase).
pub fn lane_shares(present: &[Vec<bool>], weights: &[f64]) -> Result<LaneShares, usize> {
    let total: f64 = weights.iter().sum();
    let targets: Vec<f64> = weights
        .iter()
        .map(|&w| if total > 0.0 { w / total } else { 0.0 })
        .collect();
    let takes_part = |lane: &Vec<bool>, i: usize| lane[i] && weights[i] > 0.0;
    if let Some(lane) = present
        .iter()
        .position(|lane| !(0..weights.len()).any(|i| takes_part(lane, i)))
    {
        return Err(lane);
    }
    let everywhere =
        (0..weights.len()).all(|i| weights[i] == 0.0 || present.iter().all(|lane| lane[i]));
    if everywhere {
        return Ok(LaneShares {
            weights: vec![weights.to_vec(); present.len()],
            global: targets.clone(),
            adjusted: false,
            as_dealt: targets,
        });
    }
    let lanes = present.len() as f64;
    let mut s: Vec<Vec<f64>> = present
        .iter()
        .map(|lane| {
            (0..weights.len())
                .map(|i| if takes_part(lane, i) { targets[i] } else { 0.0 })
                .collect()
        })
        .collect();
    let normalize_lanes = |s: &mut Vec<Vec<f64>>| {
        for lane in s.iter_mut() {
            let sum: f64 = lane.iter().sum();
            lane.iter_mut().for_each(|x| *x /= sum);
        }
    };
    let column_sums = |s: &Vec<Vec<f64>>| -> Vec<f64> {
        (0..weights.len())
            .map(|i| s.iter().map(|lane| lane[i]).sum())
            .collect()
    };
    normalize_lanes(&mut s);
    let as_dealt = column_sums(&s).iter().map(|sum| sum / lanes).collect();
    for _ in 0..MAX_ROUNDS {
        let sums = column_sums(&s);
        let worst = (0..weights.len())
            .map(|i| (sums[i] / lanes - targets[i]).abs())
            .fold(0.0, f64::max);
        if worst <= TOLERANCE {
            break;
        }
        for lane in s.iter_mut() {
            for (i, x) in lane.iter_mut().enumerate() {
                if sums[i] > 0.0 {
                    *x *= lanes * targets[i] / sums[i];
                }
            }
        }
        normalize_lanes(&mut s);
    }
    let global = column_sums(&s).iter().map(|sum| sum / lanes).collect();
    Ok(LaneShares {
        weights: s,
        global,
        adjusted: true,
        as_dealt,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mean_share(shares: &LaneShares, i: usize) -> f64 {
        let lanes = shares.weights.len() as f64;
        shares
            .weights
            .iter()
            .map(|w| w[i] / w.iter().sum::<f64>())
            .sum::<f64>()
            / lanes
    }

    #[test]
    fn sources_in_every_lane_keep_the_recipe_weights_exactly() {
        let present = vec![vec![true, true, false]; 4];
        // Source 2 has weight 0 and no units: it does not count as missing.
        let shares = lane_shares(&present, &[0.4, 0.15, 0.0]).unwrap();
        assert!(!shares.adjusted);
        assert_eq!(shares.weights, vec![vec![0.4, 0.15, 0.0]; 4]);
    }

    /// The quickstart's deal over 8 lanes (fineweb-edu, c4, zyda-2, the-stack-v2, finemath):
    /// every source's mean share over the lanes is its target, and a lane gives nothing of a
    /// source it does not hold.
    #[test]
    fn missing_sources_are_made_up_by_the_lanes_that_hold_them() {
        let rows = [
            [1, 0, 0, 1, 0],
            [1, 0, 1, 0, 1],
            [1, 0, 1, 0, 1],
            [1, 1, 1, 0, 1],
            [1, 0, 1, 0, 1],
            [1, 0, 0, 1, 0],
            [1, 1, 1, 0, 1],
            [1, 1, 1, 1, 1],
        ];
        let present: Vec<Vec<bool>> = rows
            .iter()
            .map(|r| r.iter().map(|&x| x == 1).collect())
            .collect();
        let weights = [0.40, 0.15, 0.30, 0.10, 0.05];
        let shares = lane_shares(&present, &weights).unwrap();
        assert!(shares.adjusted);
        // Without the adjustment, c4 (in 3 lanes of 8) would give 6.0 % of the tokens, not 15 %.
        assert!(
            (shares.as_dealt[1] - 0.0604).abs() < 1e-4,
            "{:?}",
            shares.as_dealt
        );
        for (i, &w) in weights.iter().enumerate() {
            assert!((mean_share(&shares, i) - w).abs() < 1e-12, "source {i}");
            assert!((shares.global[i] - w).abs() < 1e-12, "source {i}");
        }
        for (lane, row) in rows.iter().enumerate() {
            for (i, &held) in row.iter().enumerate() {
                assert_eq!(shares.weights[lane][i] > 0.0, held == 1, "lane {lane} {i}");
            }
        }
        // The same inputs give the same weights, bit for bit.
        assert_eq!(lane_shares(&present, &weights).unwrap(), shares);
    }

    #[test]
    fn a_share_no_deal_can_reach_is_reported_and_a_lane_without_sources_refused() {
        // Source 1 is in one lane of 4 but wants half the stream: at most a quarter is possible.
        let present = vec![
            vec![true, true],
            vec![true, false],
            vec![true, false],
            vec![true, false],
        ];
        let shares = lane_shares(&present, &[1.0, 1.0]).unwrap();
        assert!(
            (shares.global[1] - 0.25).abs() < 1e-3,
            "{:?}",
            shares.global
        );
        assert!((shares.global.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        let present = vec![vec![true, false], vec![false, true]];
        assert_eq!(lane_shares(&present, &[1.0, 0.0]), Err(1));
    }
}
