//! Split rows (`oversize = "split"`) in the stream: pieces leave in order past every shuffle
//! buffer, nothing is lost, and a cut anywhere (in the middle of a split row too) resumes exactly.

use super::*;
use crate::doc::{ByteTokens, VecSource};
use crate::mixer::MixInput;
use crate::recipe::Stopping;
use crate::split::pieces;

/// Piece size of the splitting sources below.
const LIMIT: usize = 40;

/// Source `i`'s rows: `rows[i]` texts; every row over [`LIMIT`] is split.
fn texts(rows: &[Vec<usize>]) -> Vec<Vec<String>> {
    rows.iter()
        .enumerate()
        .map(|(i, lens)| {
            lens.iter()
                .enumerate()
                .map(|(k, &len)| {
                    let words = format!("{i}/{k} ");
                    let mut text = words.repeat(len / words.len() + 1);
                    text.truncate(len);
                    text
                })
                .collect()
        })
        .collect()
}

fn sources(rows: &[Vec<usize>]) -> Vec<VecSource> {
    texts(rows)
        .into_iter()
        .enumerate()
        .map(|(i, t)| VecSource::new(i as u16, t).splitting(LIMIT))
        .collect()
}

fn by_documents(rows: &[Vec<usize>], stopping: Stopping, buffer: usize) -> DocStream<VecSource> {
    let inputs = sources(rows)
        .into_iter()
        .enumerate()
        .map(|(i, source)| MixInput {
            name: format!("s{i}"),
            weight: 1.0 + i as f64,
            source,
        })
        .collect();
    DocStream::new(Mixer::new(inputs, stopping, 9), Shuffler::new(buffer, 9))
}

fn by_tokens(
    rows: &[Vec<usize>],
    stopping: Stopping,
    buffer: usize,
) -> DocStream<ByteTokens<VecSource>> {
    let inputs = sources(rows)
        .into_iter()
        .enumerate()
        .map(|(i, source)| MixInput {
            name: format!("s{i}"),
            weight: 1.0,
            source: ByteTokens::new(source),
        })
        .collect();
    DocStream::new(
        Mixer::by_tokens(inputs, stopping, 9, buffer, Vec::new()),
        Shuffler::new(0, 9),
    )
}

fn drain<S: DocSource>(s: &mut DocStream<S>) -> Vec<Doc> {
    std::iter::from_fn(|| s.next_doc().unwrap()).collect()
}

/// Source 0 has short rows, source 1 rows up to 6 pieces long (some fit whole).
fn rows() -> Vec<Vec<usize>> {
    vec![
        (0..60).map(|k| 5 + k % 17).collect(),
        (0..25).map(|k| [12, 90, 230, 35, 41][k % 5]).collect(),
    ]
}

#[test]
fn a_split_rows_pieces_leave_in_order_past_the_shuffle_buffer_and_lose_nothing() {
    let rows = rows();
    let all = texts(&rows);
    let mut stream = by_documents(&rows, Stopping::AllExhausted, 16);
    let docs = drain(&mut stream);
    // Per (source, pass, row): the texts in stream order.
    let mut seen: std::collections::BTreeMap<(u16, u32, u64), Vec<(u32, String)>> =
        Default::default();
    for d in &docs {
        seen.entry((d.pos.source, d.pos.pass, d.pos.row))
            .or_default()
            .push((d.pos.piece, d.text.clone()));
    }
    let mut split_rows = 0;
    for ((source, _, row), got) in &seen {
        let text = &all[*source as usize][*row as usize];
        if text.len() > LIMIT {
            split_rows += 1;
            let want: Vec<(u32, String)> = pieces(text, LIMIT)
                .enumerate()
                .map(|(k, p)| (k as u32 + 1, p.to_string()))
                .collect();
            assert!(want.len() > 1);
            assert_eq!(got, &want, "row {row}: every piece once, in order");
        } else {
            assert_eq!(got, &vec![(0, text.clone())], "row {row}: whole");
        }
    }
    assert!(split_rows >= 20, "{split_rows}");
    // Whole rows are shuffled, pieces are not: a row's pieces come one after the other, no
    // other row's piece between them (the global buffer may let out whole rows of the same
    // source between them: it holds rows drawn earlier).
    let from_1: Vec<&Doc> = docs.iter().filter(|d| d.pos.source == 1).collect();
    let pieces_1: Vec<DocPos> = from_1
        .iter()
        .map(|d| d.pos)
        .filter(DocPos::is_piece)
        .collect();
    for pair in pieces_1.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if b.piece > 1 {
            assert_eq!((a.row, a.piece + 1), (b.row, b.piece), "{a:?} then {b:?}");
        }
    }
    // In tokens each source has its own buffer, and nothing of the source comes between pieces.
    let docs = drain(&mut by_tokens(&rows, Stopping::AllExhausted, 16));
    let from_1: Vec<DocPos> = docs
        .iter()
        .map(|d| d.pos)
        .filter(|p| p.source == 1)
        .collect();
    for pair in from_1.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if b.piece > 1 {
            assert_eq!((a.row, a.piece + 1), (b.row, b.piece), "{a:?} then {b:?}");
        }
    }
    // Counted as read: what was emitted, and the mixer's look-ahead.
    let c = stream.mixer().inputs()[1].source.counters();
    let ahead = stream.state().mixer.peeked[1].map_or(0, |p| p.piece);
    assert_eq!(c.split_pieces, pieces_1.len() as u64 + u64::from(ahead > 0));
    assert_eq!(
        c.rows_split,
        pieces_1.iter().filter(|p| p.piece == 1).count() as u64 + u64::from(ahead == 1)
    );
    assert!(c.rows_split > 0 && c.rows_split < c.split_pieces);
}

#[test]
fn every_cut_resumes_exactly_in_documents_and_in_tokens_mid_split_included() {
    let rows = rows();
    for stopping in [Stopping::FirstExhausted, Stopping::AllExhausted] {
        for buffer in [0, 7] {
            let whole = drain(&mut by_documents(&rows, stopping, buffer));
            let mut mid_split = 0;
            for cut in 0..=whole.len() {
                let mut first = by_documents(&rows, stopping, buffer);
                let mut got: Vec<Doc> = (0..cut)
                    .map(|_| first.next_doc().unwrap().unwrap())
                    .collect();
                let state = first.state();
                assert!(state.buffered.iter().all(|p| !p.is_piece()));
                mid_split += usize::from(state.sources.iter().any(|c| c.piece > 0));
                let mut second = by_documents(&rows, stopping, buffer);
                second.restore(&state).unwrap();
                assert_eq!(second.state(), state);
                got.extend(drain(&mut second));
                assert_eq!(got, whole, "{stopping:?} buffer {buffer} cut {cut}");
            }
            assert!(
                mid_split > 10,
                "cuts in the middle of a split row: {mid_split}"
            );

            let whole = drain(&mut by_tokens(&rows, stopping, buffer));
            for cut in 0..=whole.len() {
                let mut first = by_tokens(&rows, stopping, buffer);
                let mut got: Vec<Doc> = (0..cut)
                    .map(|_| first.next_doc().unwrap().unwrap())
                    .collect();
                let state = first.state();
                let mut second = by_tokens(&rows, stopping, buffer);
                second.restore(&state).unwrap();
                got.extend(drain(&mut second));
                assert_eq!(got, whole, "tokens {stopping:?} buffer {buffer} cut {cut}");
            }
        }
    }
}

/// What `split` is for in a mix in tokens: a source of long documents, cut into pieces, no
/// longer takes spans of the stream to itself. Whole, each of its documents is a run of up to
/// 2,000 tokens of one source; split, the other source's documents come between its pieces.
#[test]
fn in_tokens_split_pieces_keep_every_span_near_its_share() {
    let short: Vec<usize> = (0..3000).map(|k| 10 + k % 11).collect();
    let long: Vec<usize> = (0..30).map(|k| 1_000 + (k * 37) % 1_001).collect();
    let worst_span = |docs: &[Doc], span: u64| -> f64 {
        // The share of source 1 over consecutive spans of `span` tokens, furthest from 1/2.
        let (mut at, mut in_span, mut of_1, mut worst) = (0u64, 0u64, 0u64, 0.0f64);
        for d in docs {
            let n = d.tokens.as_ref().map_or(0, |t| t.len() as u64);
            at += n;
            in_span += n;
            if d.pos.source == 1 {
                of_1 += n;
            }
            if in_span >= span {
                worst = worst.max((of_1 as f64 / in_span as f64 - 0.5).abs());
                (in_span, of_1) = (0, 0);
            }
        }
        assert!(at > 20 * span);
        worst
    };
    let whole_rows = vec![short.clone(), long.clone()];
    let whole = {
        let inputs = texts(&whole_rows)
            .into_iter()
            .enumerate()
            .map(|(i, t)| MixInput {
                name: format!("s{i}"),
                weight: 1.0,
                source: ByteTokens::new(VecSource::new(i as u16, t)),
            })
            .collect();
        let mut s = DocStream::new(
            Mixer::by_tokens(inputs, Stopping::FirstExhausted, 9, 0, Vec::new()),
            Shuffler::new(0, 9),
        );
        drain(&mut s)
    };
    let split = drain(&mut by_tokens(&whole_rows, Stopping::FirstExhausted, 0));
    let (w, s) = (worst_span(&whole, 2_000), worst_span(&split, 2_000));
    assert!(w > 0.2, "whole documents: {w}");
    // Each source stays within one document of its share at every point (two sources), so a
    // span's share is off by at most two pieces' worth.
    let bound = 2.0 * LIMIT as f64 / 2_000.0;
    assert!(s <= bound, "pieces of {LIMIT} bytes: {s} > {bound}");
}
