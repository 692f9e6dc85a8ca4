//! The encoder against the f64 reference: every sequence of several batch shapes, awkward
//! sequence lengths, one weight packing serving many M, and a planted fault that must fail.

use bert::{batch_input, check, reference_forward, sequence_input, BertConfig, Encoder};
use runtime::Runtime;

#[test]
fn every_sequence_matches_the_reference_and_a_fault_does_not() {
    let rt = Runtime::defaults_only();
    let config = BertConfig::tiny();
    let seed = 7;
    let shapes = [(1, 1), (3, 5), (2, 17), (1, 33)];
    let mut encoder = Encoder::load(&rt, config, seed, &shapes).unwrap();
    // M = 1 and 5 are served by the direct family (a row-major copy), 34 and 33 by one
    // packed layout.
    assert_eq!(encoder.max_layouts(), 1);
    let h = config.hidden;
    for &(batch, seq) in &shapes {
        let input = batch_input(&config, seed, batch, seq);
        let (out, calls) = encoder.forward(&rt, batch, seq, &input).unwrap();
        assert_eq!(calls.total(), 5 * config.layers as u64);
        for i in 0..batch {
            let want =
                reference_forward(&config, seed, seq, &sequence_input(&config, seed, seq, i));
            let got = &out[i * seq * h..(i + 1) * seq * h];
            let a = check(got, &want).unwrap_or_else(|a| panic!("{batch}x{seq} seq {i}: {a:?}"));
            assert!(a.max_abs_err < bert::TOLERANCE / 10.0, "{a:?}");
        }
    }
    // A shape not given at load: planned on first use.
    let (batch, seq) = (2, 9);
    let input = batch_input(&config, seed, batch, seq);
    let (out, _) = encoder.forward(&rt, batch, seq, &input).unwrap();
    let want = reference_forward(&config, seed, seq, &sequence_input(&config, seed, seq, 1));
    check(&out[seq * h..], &want).unwrap();
    // One bias value off by 0.1 in the last layer: one output column moves by ~0.1.
    encoder.plant_fault(0.1);
    let (out, _) = encoder.forward(&rt, batch, seq, &input).unwrap();
    let e = check(&out[seq * h..], &want).unwrap_err();
    assert!(e.max_abs_err > 10.0 * bert::TOLERANCE, "{e:?}");
}

#[test]
fn bad_shapes_are_errors() {
    let rt = Runtime::defaults_only();
    let config = BertConfig::tiny();
    assert!(Encoder::load(&rt, config, 1, &[]).is_err());
    assert!(Encoder::load(&rt, config, 1, &[(0, 4)]).is_err());
    let mut bad = config;
    bad.heads = 5;
    let e = Encoder::load(&rt, bad, 1, &[(1, 4)]).unwrap_err();
    assert!(e.to_string().contains("not a multiple"), "{e}");
    let enc = Encoder::load(&rt, config, 1, &[(1, 4)]).unwrap();
    let e = enc.forward(&rt, 1, 4, &[0.0; 10]).unwrap_err();
    assert!(e.to_string().contains("input has 10 values"), "{e}");
    assert!(enc.forward(&rt, 0, 4, &[]).is_err());
}

#[test]
fn the_workload_list_is_deduplicated() {
    let c = BertConfig::bert_base();
    let ws = c.workload_list(&[(1, 128), (8, 128), (1, 128)]);
    assert_eq!(ws.len(), 10);
    let keys: Vec<String> = ws.iter().map(|w| w.key()).collect();
    assert!(
        keys.contains(&"gemm_bias:128x2304x768".to_string()),
        "{keys:?}"
    );
    assert!(keys.contains(&"gemm_bias_gelu:1024x3072x768".to_string()));
    assert!(keys.contains(&"attention:8x12x128x64".to_string()));
    assert!(keys.contains(&"gemm_bias:128x768x3072".to_string()));
    // 12 layers × ~0.1 M parameters short of 85 M.
    assert!(
        (85_000_000..86_000_000).contains(&c.parameters()),
        "{}",
        c.parameters()
    );
}
