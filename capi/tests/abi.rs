//! The exported functions called from Rust as C would call them: every bad argument is a
//! status code with a message, never a crash; the database paths (a file that cannot be
//! read, a reload that fails, one that succeeds) and the thread and precision options.

mod common;

use std::ffi::{c_char, c_int, CStr, CString};
use std::ptr::{null, null_mut};

use autokernel::*;

fn last_error() -> String {
    // SAFETY: never NULL, NUL-terminated.
    unsafe { CStr::from_ptr(autokernel_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// Asserts `status` is `code` and the thread's message contains `text`.
fn expect(status: c_int, code: c_int, text: &str) {
    let msg = last_error();
    assert_eq!(status, code, "status {status}, message: {msg}");
    assert!(msg.contains(text), "message '{msg}' lacks '{text}'");
}

fn open(db: Option<&CStr>, threads: u32, precision: Option<&CStr>) -> *mut AutokernelRuntime {
    let mut rt = null_mut();
    // SAFETY: valid C strings or NULL; a writable out-pointer.
    let st = unsafe {
        autokernel_runtime_open(
            db.map_or(null(), CStr::as_ptr),
            threads,
            precision.map_or(null(), CStr::as_ptr),
            &mut rt,
        )
    };
    assert_eq!(st, AUTOKERNEL_OK, "{}", last_error());
    rt
}

/// Takes a string returned by the library.
fn take(s: *mut c_char) -> Option<String> {
    if s.is_null() {
        return None;
    }
    // SAFETY: a NUL-terminated string from the library, freed once below.
    let text = unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned();
    unsafe { autokernel_string_free(s) };
    Some(text)
}

#[test]
fn null_and_misshapen_arguments_are_status_codes() {
    let rt = open(None, 0, None);
    let x = vec![1.0f32; 64];
    let mut c = vec![0.0f32; 64];
    let mut level: c_int = -1;
    // SAFETY (all calls): pointers into live buffers with their true lengths, or NULL.
    unsafe {
        let st = autokernel_runtime_gemm(
            rt,
            2,
            3,
            4,
            x.as_ptr(),
            8,
            x.as_ptr(),
            12,
            c.as_mut_ptr(),
            6,
            &mut level,
        );
        expect(st, AUTOKERNEL_OK, "");
        assert_eq!((level, c[0]), (AUTOKERNEL_LEVEL_DEFAULT, 4.0));

        let st = autokernel_runtime_gemm(
            null(),
            2,
            3,
            4,
            x.as_ptr(),
            8,
            x.as_ptr(),
            12,
            c.as_mut_ptr(),
            6,
            null_mut(),
        );
        expect(st, AUTOKERNEL_INVALID_ARGUMENT, "rt is NULL");
        let st = autokernel_runtime_gemm(
            rt,
            2,
            3,
            4,
            null(),
            8,
            x.as_ptr(),
            12,
            c.as_mut_ptr(),
            6,
            null_mut(),
        );
        expect(st, AUTOKERNEL_INVALID_ARGUMENT, "a is NULL");
        let st = autokernel_runtime_gemm(
            rt,
            2,
            3,
            4,
            x.as_ptr(),
            7,
            x.as_ptr(),
            12,
            c.as_mut_ptr(),
            6,
            null_mut(),
        );
        expect(st, AUTOKERNEL_SHAPE, "'a' has 7 elements");
        let st = autokernel_runtime_gemm(
            rt,
            0,
            3,
            4,
            x.as_ptr(),
            0,
            x.as_ptr(),
            12,
            c.as_mut_ptr(),
            0,
            null_mut(),
        );
        expect(st, AUTOKERNEL_SHAPE, "at least 1");
        let odd = (x.as_ptr() as *const u8).add(2) as *const f32;
        let st = autokernel_runtime_gemm(
            rt,
            2,
            3,
            4,
            odd,
            8,
            x.as_ptr(),
            12,
            c.as_mut_ptr(),
            6,
            null_mut(),
        );
        expect(st, AUTOKERNEL_INVALID_ARGUMENT, "a is not aligned");
        // The output inside an input.
        let p = c.as_mut_ptr();
        let st =
            autokernel_runtime_gemm(rt, 2, 3, 4, p, 8, x.as_ptr(), 12, p.add(2), 6, null_mut());
        expect(st, AUTOKERNEL_INVALID_ARGUMENT, "c overlaps a");

        let st = autokernel_runtime_attention(
            rt,
            1,
            1,
            4,
            16,
            1,
            x.as_ptr(),
            64,
            x.as_ptr(),
            63,
            x.as_ptr(),
            64,
            c.as_mut_ptr(),
            64,
            &mut level,
        );
        expect(st, AUTOKERNEL_SHAPE, "'k' has 63 elements");
        let st = autokernel_runtime_attention(
            rt,
            1,
            1,
            4,
            16,
            1,
            x.as_ptr(),
            64,
            x.as_ptr(),
            64,
            x.as_ptr(),
            64,
            c.as_mut_ptr(),
            64,
            &mut level,
        );
        expect(st, AUTOKERNEL_OK, "");
        assert!((c[0] - 1.0).abs() < 1e-6);

        // Masked: q = k = v = x; with key length 4 the same as unmasked; with key length 1
        // every query sees only key 0, so each output row is v's row 0.
        let y: Vec<f32> = (0..64).map(|i| (i % 7) as f32 * 0.1).collect();
        // Raw pointers: one call below passes key lengths that lie inside the output.
        let masked_raw = |lens: *const i32, n: usize, out: *mut f32| {
            autokernel_runtime_attention_masked(
                rt,
                1,
                1,
                4,
                16,
                0,
                lens,
                n,
                y.as_ptr(),
                64,
                y.as_ptr(),
                64,
                y.as_ptr(),
                64,
                out,
                64,
                null_mut(),
            )
        };
        let masked =
            |lens: &[i32], out: &mut [f32]| masked_raw(lens.as_ptr(), lens.len(), out.as_mut_ptr());
        let mut one = vec![0f32; 64];
        expect(masked(&[1], &mut one), AUTOKERNEL_OK, "");
        for row in one.chunks(16) {
            assert_eq!(row, &y[..16]);
        }
        // Key lengths inside the output are refused (they would be overwritten mid-call).
        let mut out = vec![0f32; 64];
        let o = out.as_mut_ptr();
        let inside = o.wrapping_add(5).cast::<i32>();
        // SAFETY: one i32 inside `out` (raw pointers only: the call must refuse, not read it).
        inside.write(1);
        let st = masked_raw(inside.cast_const(), 1, o);
        expect(st, AUTOKERNEL_INVALID_ARGUMENT, "o overlaps key_lens");
        let (mut full, mut plain) = (vec![0f32; 64], vec![0f32; 64]);
        expect(masked(&[4], &mut full), AUTOKERNEL_OK, "");
        let st = autokernel_runtime_attention(
            rt,
            1,
            1,
            4,
            16,
            0,
            y.as_ptr(),
            64,
            y.as_ptr(),
            64,
            y.as_ptr(),
            64,
            plain.as_mut_ptr(),
            64,
            null_mut(),
        );
        expect(st, AUTOKERNEL_OK, "");
        assert_eq!(full, plain);
        expect(masked(&[5], &mut full), AUTOKERNEL_SHAPE, "");
        expect(masked(&[1, 1], &mut full), AUTOKERNEL_SHAPE, "key_lens");

        let mut json = null_mut();
        let st = autokernel_runtime_lookup(rt, c"gemm:1x2".as_ptr(), &mut json);
        expect(st, AUTOKERNEL_INVALID_ARGUMENT, "bad workload 'gemm:1x2'");
        assert!(json.is_null());
        let st = autokernel_runtime_lookup(rt, null(), &mut json);
        expect(st, AUTOKERNEL_INVALID_ARGUMENT, "workload is NULL");
        let st = autokernel_runtime_lookup(rt, c"gemm:2x3x4".as_ptr(), null_mut());
        expect(st, AUTOKERNEL_INVALID_ARGUMENT, "json_out is NULL");

        let mut counts = AutokernelLookupCounts::default();
        expect(
            autokernel_runtime_lookups(rt, &mut counts),
            AUTOKERNEL_OK,
            "",
        );
        assert_eq!(
            counts,
            AutokernelLookupCounts {
                defaults: 5, // gemm, attention, and the three masked-test calls
                f32: 5,
                ..Default::default()
            }
        );
        expect(
            autokernel_runtime_lookups(rt, null_mut()),
            AUTOKERNEL_INVALID_ARGUMENT,
            "out is NULL",
        );
        autokernel_runtime_free(rt);
        autokernel_runtime_free(null_mut());
    }
}

#[test]
fn packed_weights_check_their_arguments_and_serve_any_m() {
    let rt = open(None, 1, None);
    let (n, k) = (5, 3);
    let w: Vec<f32> = (0..n * k).map(|i| i as f32 * 0.25 - 1.0).collect();
    let bias = vec![0.5f32; n];
    let ms = [2usize];
    let mut packed = null_mut();
    // SAFETY (all calls): pointers into live buffers with their true lengths, or NULL.
    unsafe {
        let st = autokernel_weight_pack(
            rt,
            n,
            k,
            7,
            w.as_ptr(),
            w.len(),
            ms.as_ptr(),
            1,
            &mut packed,
        );
        expect(st, AUTOKERNEL_INVALID_ARGUMENT, "act = 7");
        assert!(packed.is_null());
        let st = autokernel_weight_pack(
            rt,
            n,
            k,
            AUTOKERNEL_ACT_RELU,
            w.as_ptr(),
            w.len(),
            ms.as_ptr(),
            0,
            &mut packed,
        );
        expect(st, AUTOKERNEL_INVALID_ARGUMENT, "ms_len is 0");
        let st = autokernel_weight_pack(
            rt,
            n,
            k,
            AUTOKERNEL_ACT_RELU,
            w.as_ptr(),
            w.len() - 1,
            ms.as_ptr(),
            1,
            &mut packed,
        );
        expect(st, AUTOKERNEL_SHAPE, "'b' has 14 elements");
        let st = autokernel_weight_pack(
            rt,
            n,
            k,
            AUTOKERNEL_ACT_RELU,
            w.as_ptr(),
            w.len(),
            ms.as_ptr(),
            1,
            &mut packed,
        );
        expect(st, AUTOKERNEL_OK, "");

        for m in [1usize, 2, 9] {
            let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 - 3.0).collect();
            let mut c = vec![f32::NAN; m * n];
            let mut level = -1;
            let st = autokernel_runtime_linear(
                rt,
                packed,
                m,
                a.as_ptr(),
                a.len(),
                bias.as_ptr(),
                n,
                c.as_mut_ptr(),
                c.len(),
                &mut level,
            );
            expect(st, AUTOKERNEL_OK, "");
            for i in 0..m {
                for j in 0..n {
                    let z: f32 = (0..k).map(|p| a[i * k + p] * w[p * n + j]).sum::<f32>() + 0.5;
                    assert!((c[i * n + j] - z.max(0.0)).abs() < 1e-5, "m={m} ({i},{j})");
                }
            }
        }
        let mut c = vec![0.0f32; 2 * n];
        let a = vec![1.0f32; 2 * k];
        let st = autokernel_runtime_linear(
            rt,
            packed,
            0,
            a.as_ptr(),
            0,
            bias.as_ptr(),
            n,
            c.as_mut_ptr(),
            0,
            null_mut(),
        );
        expect(st, AUTOKERNEL_SHAPE, "m = 0");
        // No bias: NULL with length 0 (it had been refused as a NULL buffer).
        let st = autokernel_runtime_linear(
            rt,
            packed,
            2,
            a.as_ptr(),
            2 * k,
            null(),
            0,
            c.as_mut_ptr(),
            2 * n,
            null_mut(),
        );
        expect(st, AUTOKERNEL_OK, "");
        for j in 0..n {
            let z: f32 = (0..k).map(|p| w[p * n + j]).sum();
            assert!((c[j] - z.max(0.0)).abs() < 1e-5, "no bias ({j})");
        }
        let st = autokernel_runtime_linear(
            rt,
            packed,
            2,
            a.as_ptr(),
            2 * k,
            bias.as_ptr(),
            n,
            c.as_mut_ptr(),
            2 * n - 1,
            null_mut(),
        );
        expect(
            st,
            AUTOKERNEL_SHAPE,
            "'c' has 9 elements, m = 2 rows of 5 need 10",
        );
        let st = autokernel_runtime_linear(
            rt,
            null(),
            2,
            a.as_ptr(),
            2 * k,
            bias.as_ptr(),
            n,
            c.as_mut_ptr(),
            2 * n,
            null_mut(),
        );
        expect(st, AUTOKERNEL_INVALID_ARGUMENT, "w is NULL");
        autokernel_weight_free(packed);
        autokernel_weight_free(null_mut());
        autokernel_runtime_free(rt);
    }
}

/// `autokernel_weight_info` describes a weight: its shape and activation, what serves its
/// first M, and the copies it holds (an int8-only weight keeps no f32 panels).
#[test]
fn weight_info_says_what_a_weight_holds() {
    let (n, k) = (67, 65);
    let w: Vec<f32> = (0..n * k).map(|i| (i % 13) as f32 * 0.1 - 0.6).collect();
    let ms = [16usize];
    for (precision, dtype, f32_layouts) in [(c"f32", "f32", true), (c"int8", "i8", false)] {
        let rt = open(None, 1, Some(precision));
        let mut packed = null_mut();
        let mut json = null_mut();
        // SAFETY (all calls): pointers into live buffers with their true lengths, or NULL.
        unsafe {
            let st = autokernel_weight_pack(
                rt,
                n,
                k,
                AUTOKERNEL_ACT_GELU_ERF,
                w.as_ptr(),
                w.len(),
                ms.as_ptr(),
                1,
                &mut packed,
            );
            expect(st, AUTOKERNEL_OK, "");
            expect(autokernel_weight_info(packed, &mut json), AUTOKERNEL_OK, "");
            let v: serde_json::Value = serde_json::from_str(&take(json).unwrap()).unwrap();
            assert_eq!(
                (v["in_features"].as_u64(), v["out_features"].as_u64()),
                (Some(65), Some(67))
            );
            assert_eq!(v["act"], "gelu_erf");
            let want = match dtype {
                "f32" => "gemm_bias_gelu_erf:16x67x65".to_string(),
                d => format!("gemm_bias_gelu_erf:16x67x65:{d}"),
            };
            assert_eq!(v["workload"], want.as_str(), "{v}");
            assert_eq!(v["dtypes"], serde_json::json!([dtype]), "{v}");
            assert_eq!(v["level"], "default", "{v}");
            assert!(v["config"].is_object(), "{v}");
            let layouts = v["layouts"].as_array().unwrap();
            assert_eq!(!layouts.is_empty(), f32_layouts, "{v}");
            assert_eq!(v["copies"].as_u64(), Some(1), "{v}");
            let bytes = v["bytes"].as_u64().unwrap() as usize;
            let per = if f32_layouts { 4 } else { 1 };
            assert!(
                bytes >= per * n * k && bytes < 2 * per * n * k + 4096,
                "{v}"
            );
            let st = autokernel_weight_info(null(), &mut json);
            expect(st, AUTOKERNEL_INVALID_ARGUMENT, "w is NULL");
            assert!(json.is_null());
            let st = autokernel_weight_info(packed, null_mut());
            expect(st, AUTOKERNEL_INVALID_ARGUMENT, "json_out is NULL");
            autokernel_weight_free(packed);
            autokernel_runtime_free(rt);
        }
    }
}

#[test]
fn an_empty_database_path_is_refused() {
    let mut rt = null_mut();
    // SAFETY: valid C strings, a writable out-pointer.
    let st = unsafe { autokernel_runtime_open(c"".as_ptr(), 0, null(), &mut rt) };
    expect(st, AUTOKERNEL_INVALID_ARGUMENT, "db_path is empty");
    assert!(rt.is_null());
}

#[test]
fn a_bad_database_serves_defaults_until_a_reload_finds_a_good_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    std::fs::write(&path, b"not a database").unwrap();
    let cpath = CString::new(path.to_str().unwrap()).unwrap();
    let rt = open(Some(&cpath), 0, None);
    let mut err = null_mut();
    // SAFETY (all calls): a live runtime, writable out-pointers, strings from the library.
    unsafe {
        expect(
            autokernel_runtime_load_error(rt, &mut err),
            AUTOKERNEL_OK,
            "",
        );
        let err = take(err).expect("a load error");
        assert!(err.contains("t.db"), "{err}");
        expect(autokernel_runtime_reload(rt), AUTOKERNEL_DATABASE, "t.db");

        std::fs::remove_file(&path).unwrap();
        let configs = common::tuned_db(&path, &["gemm:24x24x24"], 0);
        expect(autokernel_runtime_reload(rt), AUTOKERNEL_OK, "");
        let mut none = null_mut();
        expect(
            autokernel_runtime_load_error(rt, &mut none),
            AUTOKERNEL_OK,
            "",
        );
        assert!(none.is_null());
        let mut json = null_mut();
        let st = autokernel_runtime_lookup(rt, c"gemm:24x24x24".as_ptr(), &mut json);
        expect(st, AUTOKERNEL_OK, "");
        let j: serde_json::Value = serde_json::from_str(&take(json).unwrap()).unwrap();
        assert_eq!(j["level"], "exact");
        assert_eq!(j["device"], "cpu");
        assert_eq!(j["config"], serde_json::to_value(&configs[0].1).unwrap());
        autokernel_runtime_free(rt);
    }
    let rt = open(None, 0, None);
    // SAFETY: a live runtime.
    unsafe {
        expect(
            autokernel_runtime_reload(rt),
            AUTOKERNEL_DATABASE,
            "no database",
        );
        autokernel_runtime_free(rt);
    }
}

#[test]
fn threads_and_precision_are_checked() {
    let mut rt = null_mut();
    let too_many = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32 + 1;
    // SAFETY (all calls): NULL or valid C strings; writable out-pointers.
    unsafe {
        let st = autokernel_runtime_open(null(), too_many, null(), &mut rt);
        expect(
            st,
            AUTOKERNEL_INVALID_ARGUMENT,
            &format!("threads = {too_many}"),
        );
        assert!(rt.is_null());
        let st = autokernel_runtime_open(null(), 0, c"fp8".as_ptr(), &mut rt);
        expect(st, AUTOKERNEL_INVALID_ARGUMENT, "unknown precision 'fp8'");
        let st = autokernel_runtime_open(null(), 0, c"f32".as_ptr(), null_mut());
        expect(st, AUTOKERNEL_INVALID_ARGUMENT, "out is NULL");
    }
    // Every policy name opens; int8 serves an f32 GEMM in int8 (its default here).
    for p in [c"bf16", c"int8", c"auto", c""] {
        let rt = open(None, 0, Some(p));
        // SAFETY: a live runtime.
        unsafe { autokernel_runtime_free(rt) };
    }
    let rt = open(None, 0, Some(c"int8"));
    let mut json = null_mut();
    // SAFETY: a live runtime, valid strings, a writable out-pointer.
    unsafe {
        let st = autokernel_runtime_lookup(rt, c"gemm:8x8x8".as_ptr(), &mut json);
        expect(st, AUTOKERNEL_OK, "");
        let j: serde_json::Value = serde_json::from_str(&take(json).unwrap()).unwrap();
        assert_eq!(j["served_as"], "gemm:8x8x8:i8");
        // A budget no default can meet (nothing measured): f32 again.
        let st = autokernel_runtime_set_precision(rt, c"int8".as_ptr(), 1e-3);
        expect(st, AUTOKERNEL_OK, "");
        let st = autokernel_runtime_lookup(rt, c"gemm:8x8x8".as_ptr(), &mut json);
        expect(st, AUTOKERNEL_OK, "");
        let j: serde_json::Value = serde_json::from_str(&take(json).unwrap()).unwrap();
        assert_eq!(j["served_as"], "gemm:8x8x8");
        let st = autokernel_runtime_set_precision(rt, c"int4".as_ptr(), -1.0);
        expect(st, AUTOKERNEL_INVALID_ARGUMENT, "unknown precision 'int4'");
        // Names are case-insensitive, surrounding spaces ignored (as the header says).
        let st = autokernel_runtime_set_precision(rt, c" INT8 ".as_ptr(), -1.0);
        expect(st, AUTOKERNEL_OK, "");
        let st = autokernel_runtime_lookup(rt, c"gemm:8x8x8".as_ptr(), &mut json);
        expect(st, AUTOKERNEL_OK, "");
        let j: serde_json::Value = serde_json::from_str(&take(json).unwrap()).unwrap();
        assert_eq!(j["served_as"], "gemm:8x8x8:i8");
        let st = autokernel_runtime_set_precision(null(), c"int8".as_ptr(), -1.0);
        expect(st, AUTOKERNEL_INVALID_ARGUMENT, "rt");
        for bad in [f64::NAN, f64::INFINITY] {
            let st = autokernel_runtime_set_precision(rt, c"int8".as_ptr(), bad);
            expect(st, AUTOKERNEL_INVALID_ARGUMENT, "max_rel_err");
        }
        // A budget with f32 (NULL is f32 too) would change nothing: refused, as in Python.
        for f32 in [c"f32".as_ptr(), null()] {
            let st = autokernel_runtime_set_precision(rt, f32, 1e-2);
            expect(st, AUTOKERNEL_INVALID_ARGUMENT, "serves f32 only");
        }
        expect(
            autokernel_runtime_set_precision(rt, null(), -1.0),
            AUTOKERNEL_OK,
            "",
        );
        autokernel_runtime_free(rt);
    }
    // A runtime of one thread serves this machine's one-thread fingerprint.
    let rt = open(None, 1, Some(c"f32"));
    let mut json = null_mut();
    // SAFETY: a live runtime, a valid string, a writable out-pointer.
    unsafe {
        let st = autokernel_runtime_lookup(rt, c"gemm:8x8x8".as_ptr(), &mut json);
        expect(st, AUTOKERNEL_OK, "");
        let j: serde_json::Value = serde_json::from_str(&take(json).unwrap()).unwrap();
        let one = kernels::HardwareFingerprint::current().with_cores(1);
        assert_eq!(j["fingerprint"], one.id.as_str());
        autokernel_runtime_free(rt);
    }
}

#[test]
fn version_and_status_names_are_static_strings() {
    // SAFETY: static NUL-terminated strings.
    let version = unsafe { CStr::from_ptr(autokernel_version()) };
    assert_eq!(version.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
    let name = unsafe { CStr::from_ptr(autokernel_status_name(AUTOKERNEL_DATABASE)) };
    assert_eq!(name.to_str().unwrap(), "AUTOKERNEL_DATABASE");
}

#[test]
fn attention_on_qkv_rows_and_layer_norm_in_place() {
    let rt = open(None, 0, None);
    let (b, s, heads, d) = (2usize, 5usize, 3usize, 4usize);
    let (hid, n) = (heads * d, b * s * heads * d);
    let qkv: Vec<f32> = (0..3 * n)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 40.0)
        .collect();
    // The reference: heads split by hand, the [b, h, s, d] entry point, merged by hand.
    let split = |part: usize| -> Vec<f32> {
        let mut t = vec![0f32; n];
        for (bi, hi, si, j) in (0..b * heads * s * d)
            .map(|i| (i / (heads * s * d), i / (s * d) % heads, i / d % s, i % d))
        {
            t[((bi * heads + hi) * s + si) * d + j] =
                qkv[(bi * s + si) * 3 * hid + part * hid + hi * d + j];
        }
        t
    };
    let (q, k, v) = (split(0), split(1), split(2));
    let lens = [5i32, 2];
    for masked in [false, true] {
        let mut ctx = vec![0f32; n];
        // SAFETY (all calls): pointers into live buffers with their true lengths, or NULL.
        let st = unsafe {
            autokernel_runtime_attention_masked(
                rt,
                b,
                heads,
                s,
                d,
                0,
                if masked { lens.as_ptr() } else { null() },
                if masked { 2 } else { 0 },
                q.as_ptr(),
                n,
                k.as_ptr(),
                n,
                v.as_ptr(),
                n,
                ctx.as_mut_ptr(),
                n,
                null_mut(),
            )
        };
        if !masked {
            // The masked entry point wants its lengths: the unmasked one is the reference.
            assert_ne!(st, AUTOKERNEL_OK);
            let st = unsafe {
                autokernel_runtime_attention(
                    rt,
                    b,
                    heads,
                    s,
                    d,
                    0,
                    q.as_ptr(),
                    n,
                    k.as_ptr(),
                    n,
                    v.as_ptr(),
                    n,
                    ctx.as_mut_ptr(),
                    n,
                    null_mut(),
                )
            };
            expect(st, AUTOKERNEL_OK, "");
        }
        let mut want = vec![0f32; n];
        for (row, dst) in want.chunks_mut(hid).enumerate() {
            for hi in 0..heads {
                let src = ((row / s * heads + hi) * s + row % s) * d;
                dst[hi * d..][..d].copy_from_slice(&ctx[src..][..d]);
            }
        }
        let mut got = vec![f32::NAN; n];
        let mut level: c_int = -1;
        let (lp, ll) = if masked {
            (lens.as_ptr(), 2)
        } else {
            (null(), 0)
        };
        let st = unsafe {
            autokernel_runtime_attention_qkv(
                rt,
                b,
                s,
                heads,
                d,
                0,
                lp,
                ll,
                qkv.as_ptr(),
                3 * n,
                got.as_mut_ptr(),
                n,
                &mut level,
            )
        };
        expect(st, AUTOKERNEL_OK, "");
        assert_eq!(got, want, "masked {masked}");
        assert_eq!(level, AUTOKERNEL_LEVEL_DEFAULT);
    }
    let mut small = vec![0f32; n - 1];
    let st = unsafe {
        autokernel_runtime_attention_qkv(
            rt,
            b,
            s,
            heads,
            d,
            0,
            null(),
            0,
            qkv.as_ptr(),
            3 * n,
            small.as_mut_ptr(),
            n - 1,
            null_mut(),
        )
    };
    expect(st, AUTOKERNEL_SHAPE, "'o' has 119 elements");

    // LayerNorm of x + r, in place, against f64; then the bad arguments.
    let h = 6;
    let x0: Vec<f32> = (0..4 * h).map(|i| (i % 7) as f32 * 0.5 - 1.0).collect();
    let r: Vec<f32> = (0..4 * h).map(|i| (i % 3) as f32 * 0.25).collect();
    let (g, be) = (vec![2.0f32; h], vec![0.5f32; h]);
    let mut x = x0.clone();
    let st = unsafe {
        autokernel_add_layer_norm(
            x.as_mut_ptr(),
            x.len(),
            r.as_ptr(),
            r.len(),
            g.as_ptr(),
            be.as_ptr(),
            h,
            1e-5,
        )
    };
    expect(st, AUTOKERNEL_OK, "");
    for row in 0..4 {
        let v: Vec<f64> = (0..h)
            .map(|j| f64::from(x0[row * h + j]) + f64::from(r[row * h + j]))
            .collect();
        let mean = v.iter().sum::<f64>() / h as f64;
        let var = v.iter().map(|a| (a - mean).powi(2)).sum::<f64>() / h as f64;
        for j in 0..h {
            let want = (v[j] - mean) / (var + 1e-5).sqrt() * 2.0 + 0.5;
            assert!((f64::from(x[row * h + j]) - want).abs() < 1e-5);
        }
    }
    let st = unsafe {
        autokernel_add_layer_norm(
            x.as_mut_ptr(),
            x.len() - 1,
            null(),
            0,
            g.as_ptr(),
            be.as_ptr(),
            h,
            1e-5,
        )
    };
    expect(st, AUTOKERNEL_SHAPE, "'x'");
    let st = unsafe {
        autokernel_add_layer_norm(
            x.as_mut_ptr(),
            x.len(),
            x.as_ptr(),
            x.len(),
            g.as_ptr(),
            be.as_ptr(),
            h,
            1e-5,
        )
    };
    assert_eq!(st, AUTOKERNEL_INVALID_ARGUMENT, "{}", last_error());
    let st = unsafe {
        autokernel_add_layer_norm(null_mut(), 4, null(), 0, g.as_ptr(), be.as_ptr(), h, 1e-5)
    };
    expect(st, AUTOKERNEL_INVALID_ARGUMENT, "x is NULL");
    let st = unsafe {
        autokernel_add_layer_norm(
            x.as_mut_ptr(),
            0,
            null(),
            0,
            g.as_ptr(),
            be.as_ptr(),
            0,
            1e-5,
        )
    };
    expect(st, AUTOKERNEL_SHAPE, "h = 0");
    // No rows: an empty batch, nothing to do.
    let st = unsafe {
        autokernel_add_layer_norm(
            x.as_mut_ptr(),
            0,
            null(),
            0,
            g.as_ptr(),
            be.as_ptr(),
            h,
            1e-5,
        )
    };
    assert_eq!(st, AUTOKERNEL_OK, "{}", last_error());
    // An epsilon that is not a positive finite number is refused, x left as it was.
    let before = x.clone();
    for eps in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        let st = unsafe {
            autokernel_add_layer_norm(
                x.as_mut_ptr(),
                x.len(),
                null(),
                0,
                g.as_ptr(),
                be.as_ptr(),
                h,
                eps,
            )
        };
        expect(st, AUTOKERNEL_INVALID_ARGUMENT, "eps");
        assert_eq!(x, before);
    }
    // SAFETY: a live runtime, freed once.
    unsafe { autokernel_runtime_free(rt) };
}
