//! The encoder against the f64 reference: every sequence of several batch shapes, awkward
//! sequence lengths, one weight packing serving many M, and a planted fault that must fail.

use std::collections::HashSet;

use bert::{batch_input, check, reference_forward, sequence_input, BertConfig, Encoder};
use kernels::cpu::gemm::epilogue::{EpilogueGemm, EpiloguePacked};
use kernels::{Act, Kernel, Workload};
use runtime::Runtime;

/// The most packed layouts any weight needs for the M of `shapes`: the distinct `(NR, KC)`
/// panel layouts of the packed variants the runtime picks per M (at least one: a weight is
/// always packed once). Which variants those are depends on this CPU's defaults; that the
/// encoder packs each weight exactly once per distinct layout does not.
fn layouts_needed(rt: &Runtime, config: &BertConfig, shapes: &[(usize, usize)]) -> usize {
    let (h, f) = (config.hidden, config.ffn);
    let weights = [
        (3 * h, h, Act::Identity),
        (h, h, Act::Identity),
        (f, h, Act::Gelu),
        (h, f, Act::Identity),
    ];
    let layouts = |&(n, k, act): &(usize, usize, Act)| {
        let mut set = HashSet::new();
        for &(batch, seq) in shapes {
            let w = Workload::gemm_bias_act(batch * seq, n, k, act).unwrap();
            let choice = rt.choose(&w).unwrap();
            if choice.kernel.name() == EpiloguePacked.name() {
                let gemm = EpilogueGemm::from_config(&w, &choice.config).unwrap();
                set.insert(gemm.weight_layout());
            }
        }
        set.len().max(1)
    };
    weights.iter().map(layouts).max().unwrap()
}

#[test]
fn every_sequence_matches_the_reference_and_a_fault_does_not() {
    let rt = Runtime::defaults_only();
    let config = BertConfig::tiny();
    let seed = 7;
    let shapes = [(1, 1), (3, 5), (2, 17), (1, 33)];
    let mut encoder = Encoder::load(&rt, config, seed, &shapes).unwrap();
    // One packed copy per distinct panel layout the chosen variants use (on Zen 3: M = 1 and
    // 15 go to the direct family, 34 and 33 share one layout; other CPUs pick other tiles).
    assert_eq!(encoder.max_layouts(), layouts_needed(&rt, &config, &shapes));
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

#[test]
fn a_padded_batch_matches_the_reference_of_each_length() {
    let rt = Runtime::defaults_only();
    let config = BertConfig::tiny();
    let (seed, batch, seq) = (5, 4, 13);
    let encoder = Encoder::load(&rt, config, seed, &[(batch, seq)]).unwrap();
    let input = batch_input(&config, seed, batch, seq);
    let lens = [13, 1, 7, 12];
    let mut scratch = bert::Scratch::default();
    let calls = encoder
        .forward_masked(&rt, (batch, seq), &lens, &input, &mut scratch)
        .unwrap();
    assert_eq!(calls.total(), 5 * config.layers as u64);
    let h = config.hidden;
    for (i, &len) in lens.iter().enumerate() {
        let x = sequence_input(&config, seed, seq, i);
        let want = bert::reference_forward_len(&config, seed, seq, &x, len as usize);
        let got = &scratch.output()[i * seq * h..(i + 1) * seq * h];
        check(got, &want).unwrap_or_else(|a| panic!("sequence {i} of length {len}: {a:?}"));
        if len < 13 {
            // The unmasked reference is another result: the mask is not ignored.
            assert!(check(got, &reference_forward(&config, seed, seq, &x)).is_err());
        }
    }
    let e = encoder
        .forward_masked(&rt, (batch, seq), &lens[..3], &input, &mut scratch)
        .unwrap_err();
    assert!(
        e.to_string().contains("3 key lengths for a batch of 4"),
        "{e}"
    );
}
