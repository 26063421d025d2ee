use super::*;
use crate::doc::VecSource;
use proptest::prelude::*;

fn texts(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

fn mixer(sizes: &[usize], weights: &[f64], stopping: Stopping, seed: u64) -> Mixer<VecSource> {
    let inputs = sizes
        .iter()
        .zip(weights)
        .enumerate()
        .map(|(i, (&n, &w))| MixInput {
            name: format!("s{i}"),
            weight: w,
            source: VecSource::new(i as u16, texts(&format!("s{i}-"), n)),
        })
        .collect();
    Mixer::new(inputs, stopping, seed)
}

fn drain(m: &mut Mixer<VecSource>) -> Vec<Doc> {
    let mut out = Vec::new();
    while let Some(doc) = m.next_doc().unwrap() {
        out.push(doc);
    }
    out
}

#[test]
fn first_exhausted_ends_on_the_last_document_of_a_source() {
    let mut m = mixer(&[5, 1000], &[0.5, 0.5], Stopping::FirstExhausted, 1);
    let docs = drain(&mut m);
    let last = docs.last().unwrap();
    assert_eq!(
        last.text, "s0-4",
        "the stream ends right after source 0's last document"
    );
    assert_eq!(docs.iter().filter(|d| d.pos.source == 0).count(), 5);
    assert_eq!(m.emitted()[0], 5);
    assert!(m.next_doc().unwrap().is_none());
}

#[test]
fn all_exhausted_restarts_until_every_source_has_finished_once() {
    let mut m = mixer(&[3, 50], &[0.5, 0.5], Stopping::AllExhausted, 2);
    let docs = drain(&mut m);
    let last = docs.last().unwrap();
    assert_eq!(
        last.text, "s1-49",
        "ends right after the larger source's last document"
    );
    assert_eq!(
        docs.iter().filter(|d| d.pos.source == 1).count(),
        50,
        "the larger source is read exactly once"
    );
    let small: Vec<&Doc> = docs.iter().filter(|d| d.pos.source == 0).collect();
    assert!(small.len() > 3, "the smaller source is oversampled");
    for (k, doc) in small.iter().enumerate() {
        assert_eq!(
            doc.text,
            format!("s0-{}", k % 3),
            "restarts replay the same order"
        );
        assert_eq!(doc.pos.pass as usize, k / 3);
    }
}

#[test]
fn zero_weight_sources_are_never_read() {
    let mut m = mixer(&[10, 10], &[1.0, 0.0], Stopping::AllExhausted, 3);
    let docs = drain(&mut m);
    assert_eq!(docs.len(), 10);
    assert!(docs.iter().all(|d| d.pos.source == 0));
    assert_eq!(m.inputs()[1].source.counters().rows_read, 0);
}

#[test]
fn an_empty_source_is_an_error_naming_it() {
    let mut m = mixer(&[0, 10], &[1.0, 1.0], Stopping::FirstExhausted, 0);
    let err = m.next_doc().unwrap_err().to_string();
    assert_eq!(
        err,
        "source \"s0\" has no documents (every row was empty or filtered out)"
    );
}

#[test]
fn realized_mix_converges_to_the_weights() {
    let mut m = mixer(
        &[100_000, 100_000, 100_000],
        &[0.6, 0.3, 0.1],
        Stopping::FirstExhausted,
        4,
    );
    for _ in 0..60_000 {
        m.next_doc().unwrap();
    }
    let e = m.emitted();
    let total: u64 = e.iter().sum();
    for (count, want) in e.iter().zip([0.6, 0.3, 0.1]) {
        let got = *count as f64 / total as f64;
        assert!((got - want).abs() < 0.01, "{got} vs {want}");
    }
}

proptest! {
    #[test]
    fn same_seed_same_stream(seed in any::<u64>(), a in 1usize..40, b in 1usize..40) {
        let one: Vec<Doc> = drain(&mut mixer(&[a, b], &[0.3, 0.7], Stopping::AllExhausted, seed));
        let two: Vec<Doc> = drain(&mut mixer(&[a, b], &[0.3, 0.7], Stopping::AllExhausted, seed));
        prop_assert_eq!(one, two);
    }

    #[test]
    fn first_exhausted_emits_each_document_at_most_once_in_source_order(
        seed in any::<u64>(), sizes in proptest::collection::vec(1usize..30, 1..5)
    ) {
        let weights = vec![1.0; sizes.len()];
        let mut m = mixer(&sizes, &weights, Stopping::FirstExhausted, seed);
        let docs = drain(&mut m);
        let finished: Vec<usize> = (0..sizes.len()).filter(|&i| m.emitted()[i] as usize == sizes[i]).collect();
        prop_assert_eq!(finished.len(), 1, "exactly one source ran out");
        prop_assert_eq!(docs.last().unwrap().pos.source as usize, finished[0]);
        for i in 0..sizes.len() {
            let rows: Vec<u64> = docs.iter().filter(|d| d.pos.source as usize == i).map(|d| d.pos.row).collect();
            prop_assert_eq!(rows, (0..m.emitted()[i]).collect::<Vec<_>>());
        }
    }

    #[test]
    fn all_exhausted_reads_every_document_at_least_once(
        seed in any::<u64>(), sizes in proptest::collection::vec(1usize..30, 1..5)
    ) {
        let weights = vec![1.0; sizes.len()];
        let docs = drain(&mut mixer(&sizes, &weights, Stopping::AllExhausted, seed));
        for (i, &n) in sizes.iter().enumerate() {
            let first_pass = docs.iter().filter(|d| d.pos.source as usize == i && d.pos.pass == 0).count();
            prop_assert_eq!(first_pass, n);
        }
        let last = docs.last().unwrap();
        prop_assert_eq!(last.pos.row as usize, sizes[last.pos.source as usize] - 1);
    }
}
