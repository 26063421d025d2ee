//! What the stream chain costs (`dsprep_client::chain`): link windows of `seq_len + 1` u16 ids
//! the way `dsprep pack` and the daemon do (one sha256 of the window, one of 64 bytes), and print
//! windows/s, MB/s and tokens/s on one core. `cargo run --release -p dsprep-client --example
//! chain_cost -- [window_tokens] [windows]`.

use dsprep_client::chain;
use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let window_tokens: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2049);
    let windows: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(200_000);
    // Deterministic filler ids; the hash does not care what they are.
    let bytes: Vec<u8> = (0..window_tokens * 2)
        .map(|i| (i * 7919 % 251) as u8)
        .collect();
    let began = Instant::now();
    let mut at = chain::START;
    for _ in 0..windows {
        at = chain::link(&at, &chain::window_digest(&bytes));
    }
    let secs = began.elapsed().as_secs_f64();
    println!(
        "{windows} windows of {window_tokens} u16 tokens in {secs:.3} s: {:.0} windows/s, \
         {:.0} MB/s, {:.1} M tokens/s on one core (chain {})",
        windows as f64 / secs,
        (windows * bytes.len()) as f64 / secs / 1e6,
        (windows * window_tokens) as f64 / secs / 1e6,
        &chain::to_hex(&at)[..16]
    );
}
