//! Fetch latency and throughput from a warm daemon: `--ranks` client threads (one connection
//! each, ranks 0..ranks of `--world-size`) re-request the steps the daemon holds, round-robin, and
//! time every `batch_at`. Prints one JSON line. Run against `dsprep serve` after it has filled
//! its prefetch window (see tests/bench/serve_bench.sh).
//!
//!   cargo run --release -p dsprep-client --example fetch_bench -- ENDPOINT WORLD_SIZE RANKS HELD_STEPS REQUESTS_PER_RANK
//!
//! Against a daemon serving with CURVE, set DSPREP_CURVE_SERVER_KEY and DSPREP_CURVE_CLIENT_KEY.

use dsprep_client::curve::ClientKeys;
use dsprep_client::{Client, ClientConfig};
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: fetch_bench ENDPOINT WORLD_SIZE RANKS HELD_STEPS REQUESTS_PER_RANK";
    let [endpoint, world, ranks, held, requests] = args.as_slice() else {
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
    // A daemon serving with CURVE: the keys come from DSPREP_CURVE_SERVER_KEY/_CLIENT_KEY.
    let curve = ClientKeys::from_env().unwrap_or_else(|e| panic!("{e}"));
    let curve = &curve;
    let started = Instant::now();
    let results: Vec<(Vec<Duration>, u64)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..ranks)
            .map(|rank| {
                let endpoint = endpoint.clone();
                scope.spawn(move || {
                    let config = ClientConfig {
                        endpoint,
                        rank,
                        world_size: world,
                        recipe_hash: None,
                        timeout: Duration::from_secs(30),
                        attempts: 1,
                        parallel: Default::default(),
                        session: None,
                        curve: curve.clone(),
                    };
                    let mut client = Client::with_config(config).expect("connect");
                    let mut latencies = Vec::with_capacity(requests as usize);
                    let mut bytes = 0u64;
                    for i in 0..requests {
                        let t = Instant::now();
                        let batch = client
                            .batch_at(i % held)
                            .expect("fetch")
                            .expect("a held step");
                        latencies.push(t.elapsed());
                        bytes += batch.tokens().as_bytes().len() as u64;
                    }
                    (latencies, bytes)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("bench thread"))
            .collect()
    });
    let wall = started.elapsed().as_secs_f64();
    let mut all: Vec<Duration> = results
        .iter()
        .flat_map(|(l, _)| l.iter().copied())
        .collect();
    all.sort();
    let pct =
        |p: f64| all[((all.len() as f64 * p) as usize).min(all.len() - 1)].as_secs_f64() * 1e6;
    let bytes: u64 = results.iter().map(|(_, b)| b).sum();
    println!(
        "{{\"endpoint\": {:?}, \"ranks\": {ranks}, \"requests\": {}, \"batch_bytes\": {}, \"p50_us\": {:.1}, \"p99_us\": {:.1}, \"max_us\": {:.1}, \"gb_per_s\": {:.3}, \"batches_per_s\": {:.0}}}",
        endpoint,
        all.len(),
        bytes / all.len() as u64,
        pct(0.50),
        pct(0.99),
        all.last().map(|d| d.as_secs_f64() * 1e6).unwrap_or(0.0),
        bytes as f64 / wall / 1e9,
        all.len() as f64 / wall
    );
}
