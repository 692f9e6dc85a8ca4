//! Test support: a test of a kernel path this process cannot run says so, and can be made to
//! fail instead.
//!
//! A test whose path needs a CPU feature the machine lacks (AVX512_BF16, AVX-VNNI, AMX, ...)
//! passes after printing `skipped: ...` — never silently. On a machine that is meant to run
//! a path (a Sapphire Rapids runner for AMX), `AUTOKERNEL_REQUIRE_ISA=amx_bf16,amx_int8`
//! (comma-separated feature names as `autokernel hw` prints them, in any case and with or
//! without `_`/`-`; `all` for every one) turns such a skip into a failure, so "the AMX tests
//! passed" cannot mean "they were skipped".

/// Reports that the test of `what` did not run because this process lacks `feature` (a CPU
/// feature name such as `avx512bf16`, `amx_bf16`, `avxvnni`), for the reason `why`: a
/// `skipped:` line on stderr, or a panic where `AUTOKERNEL_REQUIRE_ISA` names the feature
/// (unless `AUTOKERNEL_ISA` caps the process's level: then paths are missing on purpose).
pub fn skipped(what: &str, feature: &str, why: &str) {
    let required = std::env::var("AUTOKERNEL_REQUIRE_ISA").unwrap_or_default();
    // A process capped below the CPU's level (`AUTOKERNEL_ISA`) lacks paths on purpose.
    let capped = std::env::var("AUTOKERNEL_ISA").is_ok_and(|v| !v.trim().is_empty());
    assert!(
        capped || !requires(&required, feature),
        "{what}: AUTOKERNEL_REQUIRE_ISA={required} requires {feature}, but {why}"
    );
    // One write, so lines of tests running in parallel do not interleave.
    let line = format!("{what}: skipped: {why}\n");
    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
}

/// Whether the comma-separated `list` names `feature` (or is `all`).
fn requires(list: &str, feature: &str) -> bool {
    let norm = |s: &str| -> String {
        s.chars()
            .filter(char::is_ascii_alphanumeric)
            .map(|c| c.to_ascii_lowercase())
            .collect()
    };
    list.split(',')
        .map(norm)
        .any(|f| !f.is_empty() && (f == "all" || f == norm(feature)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feature_lists_match_loosely() {
        assert!(requires("amx_bf16, avxvnni", "AMX-BF16"));
        assert!(requires("ALL", "avx512bf16"));
        assert!(requires("avx512_bf16", "AVX512_BF16"));
        assert!(!requires("", "amx_bf16"));
        assert!(!requires("amx_int8", "amx_bf16"));
    }
}
