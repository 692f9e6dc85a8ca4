//! The runtime serves a GPU's fingerprint with the same levels as a CPU's, from the CUDA
//! families of the one registry — no GPU needed: the records are made for GPU fingerprint
//! rows, as `tune --device cuda:N` writes them, and looked up through `Runtime::open_for`.

use kernels::cuda::{Arch, GpuFingerprint};
use kernels::{default_for, Config, HardwareFingerprint, Kernel, Measurement, Workload};
use runtime::{Level, Runtime};
use tuning_db::{Record, TuningDb};

fn gpu(name: &str, arch: Arch, driver: &str) -> HardwareFingerprint {
    GpuFingerprint::new(name, arch, 132, 80 << 30, driver, "12.4", "12.2").hardware()
}

/// A valid config of `w`'s CUDA family on `hw` that is not its default.
fn other_config(w: &Workload, hw: &HardwareFingerprint) -> (&'static dyn Kernel, Config) {
    let (k, d) = default_for(w, hw).unwrap();
    let c = k.space(w, hw).iter_valid().find(|c| *c != d).unwrap();
    (k, c)
}

fn record(hw: &HardwareFingerprint, w: &Workload, k: &dyn Kernel, c: &Config, s: f64) -> Record {
    let m = Measurement::from_samples(vec![s, s * 1.01, s * 0.99]);
    Record::ok(&hw.id, *w, k.name(), k.version(), c.clone(), m, "test")
}

#[test]
fn a_gpu_fingerprint_is_served_exact_same_arch_nearest_and_default() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gpu.db");
    let h100 = gpu("NVIDIA H100 80GB HBM3", Arch::SM90, "550.54.15");
    let twin = gpu("NVIDIA H100 80GB HBM3", Arch::SM90, "560.1"); // same arch, other driver
    let w: Workload = "gemm:1024x1024x1024".parse().unwrap();
    let (k, c) = other_config(&w, &h100);
    assert_eq!(k.name(), "cuda_gemm_f32");
    {
        let db = TuningDb::open(&path).unwrap();
        db.upsert_fingerprint(&h100).unwrap();
        db.insert(&record(&h100, &w, k, &c, 1e-3)).unwrap();
        // A CPU family's record under the GPU's row is never served there.
        let cpu = kernels::kernel("gemm_packed").unwrap();
        let cpu_config = cpu.default_config(&w, HardwareFingerprint::current());
        db.insert(&record(&h100, &w, cpu, &cpu_config, 1e-9))
            .unwrap();
    }
    let rt = Runtime::open_for(&path, h100.clone()).unwrap();
    rt.set_fallback_check(false);
    let exact = rt.choose(&w).unwrap();
    assert_eq!(
        (exact.level, exact.kernel.name(), &exact.config),
        (Level::Exact, k.name(), &c)
    );
    // No host executable: running is for a device session, and says so.
    let e = exact.run(&[&[], &[]], &mut []).unwrap_err().to_string();
    assert!(e.contains("cuda_gemm_f32") && e.contains("device"), "{e}");

    let near: Workload = "gemm:1024x1024x2048".parse().unwrap();
    let n = rt.choose(&near).unwrap();
    assert_eq!((n.level, &n.config), (Level::NearestShape, &c));
    let far: Workload = "gemm:64x64x64".parse().unwrap();
    let d = rt.choose(&far).unwrap();
    assert_eq!(d.level, Level::Default);
    assert_eq!(d.config, default_for(&far, &h100).unwrap().1);
    let bf16: Workload = "gemm:1024x1024x1024:bf16".parse().unwrap();
    assert_eq!(rt.choose(&bf16).unwrap().kernel.name(), "cuda_gemm_bf16");
    let fused: Workload = "gemm_bias_gelu:64x64x64".parse().unwrap();
    let e = rt.choose(&fused).unwrap_err().to_string();
    assert!(e.contains("gemm_bias_gelu") && e.contains("cuda"), "{e}");

    let rt = Runtime::open_for(&path, twin).unwrap();
    let same = rt.choose(&w).unwrap();
    assert_eq!((same.level, &same.config), (Level::SameArch, &c));
    // An A100 (sm_80) shares nothing with the H100's records.
    let a100 = gpu("NVIDIA A100-SXM4-80GB", Arch::SM80, "550.54.15");
    let rt = Runtime::open_for(&path, a100.clone()).unwrap();
    let other = rt.choose(&w).unwrap();
    assert_eq!(other.level, Level::Default);
    assert_eq!(other.config, default_for(&w, &a100).unwrap().1);
}
