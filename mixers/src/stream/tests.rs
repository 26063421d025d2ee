use super::*;
use crate::doc::VecSource;
use crate::mixer::MixInput;
use crate::recipe::Stopping;
use proptest::prelude::*;

fn stream(
    sizes: &[usize],
    weights: &[f64],
    stopping: Stopping,
    buffer: usize,
    seed: u64,
) -> DocStream<VecSource> {
    let inputs = sizes
        .iter()
        .zip(weights)
        .enumerate()
        .map(|(i, (&n, &w))| MixInput {
            name: format!("s{i}"),
            weight: w,
            // Every third row is empty: cursors count rows, documents skip them.
            source: VecSource::new(
                i as u16,
                (0..n)
                    .map(|k| {
                        if k % 3 == 2 {
                            String::new()
                        } else {
                            format!("s{i}-{k}")
                        }
                    })
                    .collect(),
            ),
        })
        .collect();
    DocStream::new(
        Mixer::new(inputs, stopping, seed),
        Shuffler::new(buffer, seed),
    )
}

fn drain(s: &mut DocStream<VecSource>) -> Vec<Doc> {
    std::iter::from_fn(|| s.next_doc().unwrap()).collect()
}

#[test]
fn a_restored_stream_continues_exactly_and_counts_the_same() {
    let sizes = [40, 7, 90];
    let weights = [0.5, 0.2, 0.3];
    for stopping in [Stopping::FirstExhausted, Stopping::AllExhausted] {
        for buffer in [0, 1, 16] {
            let whole = drain(&mut stream(&sizes, &weights, stopping, buffer, 5));
            for cut in [0, 1, 9, whole.len() / 2, whole.len() - 1, whole.len()] {
                let mut first = stream(&sizes, &weights, stopping, buffer, 5);
                let mut got: Vec<Doc> = (0..cut)
                    .map(|_| first.next_doc().unwrap().unwrap())
                    .collect();
                let state = first.state();
                let mut second = stream(&sizes, &weights, stopping, buffer, 5);
                second.restore(&state).unwrap();
                assert_eq!(second.state(), state, "restore reproduces the state");
                got.extend(drain(&mut second));
                assert_eq!(got, whole, "{stopping:?} buffer {buffer} cut {cut}");
                let counters = |s: &DocStream<VecSource>| -> Vec<_> {
                    s.mixer()
                        .inputs()
                        .iter()
                        .map(|i| i.source.counters())
                        .collect()
                };
                drain(&mut first);
                assert_eq!(counters(&second), counters(&first));
                assert_eq!(second.emitted(), whole.len() as u64);
            }
        }
    }
}

#[test]
fn the_state_refers_to_buffered_documents_not_their_text() {
    let mut s = stream(&[100], &[1.0], Stopping::FirstExhausted, 10, 1);
    for _ in 0..20 {
        s.next_doc().unwrap();
    }
    let state = s.state();
    assert_eq!(state.buffered.len(), 10);
    assert!(!state.draining);
    assert_eq!(
        state.sources[0].counters.documents, 31,
        "20 emitted, 10 buffered, 1 look-ahead"
    );
}

#[test]
fn a_state_for_other_sources_is_refused() {
    let mut s = stream(&[10, 10], &[0.5, 0.5], Stopping::FirstExhausted, 2, 1);
    s.next_doc().unwrap();
    let state = s.state();
    let mut other = stream(&[10], &[1.0], Stopping::FirstExhausted, 2, 1);
    let err = other.restore(&state).unwrap_err().to_string();
    assert_eq!(
        err,
        "cannot restore the stream: the state has 2 sources, the recipe 1"
    );
}

#[test]
fn a_reference_to_a_missing_row_names_the_source() {
    let mut s = stream(&[10], &[1.0], Stopping::FirstExhausted, 4, 1);
    s.next_doc().unwrap();
    let mut state = s.state();
    state.buffered[0].row = 2; // an empty row: not a document
    let err = stream(&[10], &[1.0], Stopping::FirstExhausted, 4, 1)
        .restore(&state)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "source \"s0\": DocPos { source: 0, pass: 0, shard: 0, row: 2, piece: 0 } is not a document of this source"
    );
}

proptest! {
    #[test]
    fn any_cut_resumes_exactly(
        sizes in proptest::collection::vec(1usize..30, 1..4),
        all in any::<bool>(),
        buffer in 0usize..12,
        seed in any::<u64>(),
        cut_frac in 0.0f64..=1.0,
    ) {
        let weights: Vec<f64> = sizes.iter().map(|&n| n as f64).collect();
        let sizes: Vec<usize> = sizes.iter().map(|&n| n * 3).collect(); // at least one document each
        let stopping = if all { Stopping::AllExhausted } else { Stopping::FirstExhausted };
        let whole = drain(&mut stream(&sizes, &weights, stopping, buffer, seed));
        let cut = (whole.len() as f64 * cut_frac) as usize;
        let mut first = stream(&sizes, &weights, stopping, buffer, seed);
        let mut got: Vec<Doc> = (0..cut).map(|_| first.next_doc().unwrap().unwrap()).collect();
        let mut second = stream(&sizes, &weights, stopping, buffer, seed);
        second.restore(&first.state()).unwrap();
        got.extend(drain(&mut second));
        prop_assert_eq!(got, whole);
    }
}

proptest! {
    /// Over one pass of one source, resumed anywhere: every document exactly once.
    #[test]
    fn a_resumed_epoch_emits_every_document_exactly_once(
        n in 1usize..200,
        buffer in 0usize..40,
        seed in any::<u64>(),
        cut_frac in 0.0f64..=1.0,
    ) {
        let total = drain(&mut stream(&[n], &[1.0], Stopping::FirstExhausted, buffer, seed)).len();
        let cut = (total as f64 * cut_frac) as usize;
        let mut first = stream(&[n], &[1.0], Stopping::FirstExhausted, buffer, seed);
        let mut got: Vec<String> = (0..cut).map(|_| first.next_doc().unwrap().unwrap().text).collect();
        let mut second = stream(&[n], &[1.0], Stopping::FirstExhausted, buffer, seed);
        second.restore(&first.state()).unwrap();
        got.extend(drain(&mut second).into_iter().map(|d| d.text));
        let mut want: Vec<String> = (0..n).filter(|k| k % 3 != 2).map(|k| format!("s0-{k}")).collect();
        got.sort();
        want.sort();
        prop_assert_eq!(got, want);
    }
}
