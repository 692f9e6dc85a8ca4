//! Prints the largest output error of BERT-base against the f64 reference for one
//! sequence (defaults only): `cargo run --release -p bert --example bert_error -- 128`.

use bert::{batch_input, check, reference_forward, BertConfig, Encoder};
use runtime::Runtime;

fn main() {
    let seq: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(32);
    let rt = Runtime::defaults_only();
    let config = BertConfig::bert_base();
    let enc = Encoder::load(&rt, config, 1, &[(1, seq)]).expect("load");
    let input = batch_input(&config, 1, 1, seq);
    let t = std::time::Instant::now();
    let (out, calls) = enc.forward(&rt, 1, seq, &input).expect("forward");
    let fwd = t.elapsed();
    let t = std::time::Instant::now();
    let want = reference_forward(&config, 1, seq, &input);
    let refs = t.elapsed();
    println!(
        "seq {seq}: load {:.2}s forward {fwd:?} reference {refs:?} calls {calls:?} {:?}",
        enc.load_seconds(),
        check(&out, &want)
    );
}
