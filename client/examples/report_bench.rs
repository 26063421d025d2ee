//! What loss reports (protocol v7) cost a trainer: `--ranks` client threads re-request the steps
//! a warm daemon holds, round-robin (as fetch_bench does), and with `report` after each fetch
//! compute the batch's loss per source (`ServedBatch::per_source_loss` over a per-token loss of
//! `rows × seq_len` values) and send it (`Client::report`); with `send`, send the first batch's
//! report after each fetch (the wire and the daemon's part alone, no helper on these cores).
//! Times every fetch, every helper call and every send; prints one JSON line. The daemon answers a step's second report as a
//! duplicate: the same path, decoded, checked and counted.
//!
//!   cargo run --release -p dsprep-client --example report_bench -- ENDPOINT WORLD_SIZE RANKS HELD_STEPS REQUESTS_PER_RANK fetch|report|send

use dsprep_client::{Client, ClientConfig};
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: report_bench ENDPOINT WORLD_SIZE RANKS HELD_STEPS REQUESTS_PER_RANK fetch|report|send";
    let [endpoint, world, ranks, held, requests, mode] = args.as_slice() else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let number = |s: &str| -> u64 {
        s.parse()
            .unwrap_or_else(|_| panic!("{usage}: {s:?} is not a number"))
    };
    let (world, ranks, held, requests) = (
        number(world) as u32,
        number(ranks) as u32,
        number(held),
        number(requests),
    );
    // (report after each fetch, compute the report each time)
    let (report, compute) = match mode.as_str() {
        "fetch" => (false, false),
        "report" => (true, true),
        "send" => (true, false),
        other => panic!("{usage}: {other:?}"),
    };
    type Times = (Vec<Duration>, Vec<Duration>, Vec<Duration>);
    let results: Vec<Times> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..ranks)
            .map(|rank| {
                let endpoint = endpoint.clone();
                scope.spawn(move || {
                    let config = ClientConfig {
                        endpoint,
                        rank,
                        world_size: world,
                        recipe_hash: None,
                        timeout: Duration::from_secs(60),
                        attempts: 1,
                        parallel: Default::default(),
                        session: None,
                        curve: None,
                    };
                    let mut client = Client::with_config(config).expect("connect");
                    let (mut fetch, mut helper, mut send) = (Vec::new(), Vec::new(), Vec::new());
                    let (mut loss, mut first) = (Vec::new(), None);
                    for i in 0..requests {
                        let t = Instant::now();
                        let batch = client
                            .batch_at(i % held)
                            .expect("fetch")
                            .expect("a held step");
                        fetch.push(t.elapsed());
                        if report {
                            let seq_len = batch.header.window_tokens as usize - 1;
                            loss.resize(batch.rows() * seq_len, 2.5f32);
                            let entries = match (&first, compute) {
                                (Some(entries), false) => Vec::clone(entries),
                                _ => {
                                    let t = Instant::now();
                                    let entries =
                                        batch.per_source_loss(&loss).expect("document sources");
                                    helper.push(t.elapsed());
                                    entries
                                }
                            };
                            first.get_or_insert_with(|| entries.clone());
                            let t = Instant::now();
                            assert!(client.report(batch.step(), &entries).expect("report"));
                            send.push(t.elapsed());
                        }
                    }
                    (fetch, helper, send)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("bench thread"))
            .collect()
    });
    let pct = |times: &mut Vec<Duration>, p: f64| -> f64 {
        times.sort();
        times
            .get(((times.len() as f64 * p) as usize).min(times.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1e6)
    };
    let mut fetch: Vec<Duration> = results.iter().flat_map(|r| r.0.iter().copied()).collect();
    let mut helper: Vec<Duration> = results.iter().flat_map(|r| r.1.iter().copied()).collect();
    let mut send: Vec<Duration> = results.iter().flat_map(|r| r.2.iter().copied()).collect();
    println!(
        "{{\"mode\": {mode:?}, \"ranks\": {ranks}, \"requests\": {}, \"fetch_p50_us\": {:.1}, \"fetch_p99_us\": {:.1}, \"helper_p50_us\": {:.1}, \"helper_p99_us\": {:.1}, \"send_p50_us\": {:.1}, \"send_p99_us\": {:.1}}}",
        fetch.len(),
        pct(&mut fetch, 0.5),
        pct(&mut fetch, 0.99),
        pct(&mut helper, 0.5),
        pct(&mut helper, 0.99),
        pct(&mut send, 0.5),
        pct(&mut send, 0.99),
    );
}
