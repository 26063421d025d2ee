use super::*;
use crate::recipe::OnMissing;

fn spec(algorithm: Algorithm) -> AdaptiveSpec {
    AdaptiveSpec {
        algorithm,
        every: 10,
        lag: 4,
        min_weight: 0.05,
        max_change: 0.1,
        temperature: 1.0,
        smoothing: 0.9,
        learning_rate: 1.0,
        wait_seconds: 1.0,
        on_missing: OnMissing::Hold,
    }
}

fn observed(losses: &[f64]) -> Vec<Observed> {
    losses
        .iter()
        .map(|&l| Observed {
            loss_sum: l * 1000.0,
            tokens: 1000,
        })
        .collect()
}

#[test]
fn decision_steps_and_the_reports_they_use() {
    let s = spec(Algorithm::Exp3);
    assert_eq!(reported_steps(&s, 10), Some((0, 6)));
    assert_eq!(reported_steps(&s, 20), Some((6, 16)));
    assert_eq!(reported_steps(&s, 15), None);
    assert_eq!(next_decision_step(&s, 0), 10);
    assert_eq!(next_decision_step(&s, 10), 20);
    let late = AdaptiveSpec { lag: 25, ..s };
    assert_eq!(next_decision_step(&late, 0), 30);
    assert_eq!(reported_steps(&late, 20), None);
    assert_eq!(reported_steps(&late, 30), Some((0, 5)));
}

#[test]
fn softmax_moves_toward_the_higher_loss_within_the_bounds() {
    let s = spec(Algorithm::Softmax);
    let current = [0.5, 0.3, 0.2, 0.0];
    let (shares, state) = decide(&s, &current, &[], 0, &observed(&[1.0, 3.0, 1.0, 9.0]));
    assert_eq!(shares[3], 0.0, "a source outside the mix stays out");
    assert!((shares.iter().sum::<f64>() - 1.0).abs() < 1e-12);
    // The largest move is exactly the bound, and it is source 1's, up.
    let moves: Vec<f64> = (0..4).map(|i| shares[i] - current[i]).collect();
    assert!((moves[1] - 0.1).abs() < 1e-12, "{moves:?}");
    assert!(moves[0] < 0.0 && moves[2] < 0.0);
    assert_eq!(state, vec![1.0, 3.0, 1.0, 0.0]);
}

#[test]
fn the_minimum_share_holds() {
    let s = AdaptiveSpec {
        max_change: 1.0,
        temperature: 0.01,
        ..spec(Algorithm::Softmax)
    };
    let (shares, _) = decide(&s, &[0.4, 0.3, 0.3], &[], 0, &observed(&[5.0, 1.0, 1.0]));
    for &share in &shares[1..] {
        assert!((share - 0.05).abs() < 1e-9, "{shares:?}");
    }
    assert!((shares[0] - 0.9).abs() < 1e-9);
}

#[test]
fn exp3_raises_the_source_whose_loss_stays_high() {
    let s = spec(Algorithm::Exp3);
    let (mut shares, mut state) = (vec![1.0 / 3.0; 3], Vec::new());
    for k in 1..=20 {
        let (next, st) = decide(&s, &shares, &state, k * 100, &observed(&[3.0, 1.0, 1.0]));
        assert!((next.iter().sum::<f64>() - 1.0).abs() < 1e-9);
        assert!(next.iter().all(|&w| w >= 0.05 - 1e-12));
        shares = next;
        state = st;
    }
    // Importance weighting settles near where loss ÷ share is even (shares ∝ loss: 0.6).
    assert!(shares[0] > 0.5 && shares[0] < 0.65, "{shares:?}");
    assert!((shares[1] - shares[2]).abs() < 1e-12);
}

#[test]
fn a_source_without_reports_keeps_its_estimate() {
    let s = spec(Algorithm::Exp3);
    let mut seen = observed(&[2.0, 2.0]);
    seen[1].tokens = 0;
    let (_, state) = decide(&s, &[0.5, 0.5], &[7.0, 7.0], 3, &seen);
    assert_eq!(state[1], 7.0);
    assert!((state[0] - (0.9 * 7.0 + 0.1 * 4.0)).abs() < 1e-12);
}
