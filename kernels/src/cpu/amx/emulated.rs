//! A tile unit in plain Rust: the AMX instructions as the Intel SDM's pseudo-code defines
//! them, on 8 tile registers of 16 rows × 64 bytes, for every CPU. Faults (an invalid
//! configuration, an unconfigured tile, shapes that do not fit) panic with the fault.
//!
//! What the SDM specifies and this follows: `ldtilecfg` and `tilerelease` zero every tile;
//! a load writes the configured rows, each zero past its `colsb` bytes, and zeroes the rows
//! past the configured ones; a store writes only the configured rows × `colsb` bytes;
//! `tdpbusd`/`tdpbssd` add four byte products to each i32 with wrap-around (no saturation);
//! `tdpbf16ps` as the current SDM's pseudo-code has it: per output, the even and the odd
//! products of the bf16 pairs summed over the depth into two f32 partials from zero (FMAs
//! with one rounding each, round to nearest even, input denormals read as zero and output
//! denormals flushed), then their sum added to C. (The Intrinsics Guide's older text adds
//! each product into C in turn, which can round differently.) Whether the real unit rounds
//! exactly so is not something this machine can check, so only the integer instructions are
//! claimed bit-exact: the tests compare the real unit with this one on values where the
//! order cannot matter, and count (not assert) bit differences on random ones.

use super::config::{TileConfig, BYTES_PER_ROW, MAX_ROWS, TILES, TILE_BYTES};
use super::{fault, TileUnit};

/// The emulated tile unit: its 8 KiB of tile registers and the configuration loaded.
#[derive(Clone)]
pub struct Emulated {
    tiles: [[u8; TILE_BYTES]; TILES],
    cfg: TileConfig,
}

impl Default for Emulated {
    fn default() -> Emulated {
        Emulated {
            tiles: [[0; TILE_BYTES]; TILES],
            cfg: TileConfig::released(),
        }
    }
}

impl std::fmt::Debug for Emulated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Emulated").field("cfg", &self.cfg).finish()
    }
}

impl Emulated {
    /// Whether tiles are configured (between `ldtilecfg` and `tilerelease`).
    pub fn configured(&self) -> bool {
        self.cfg.palette() == 1
    }

    /// Row `r` of tile `t` (64 bytes).
    fn row(&self, t: u8, r: usize) -> &[u8] {
        &self.tiles[t as usize][r * BYTES_PER_ROW..(r + 1) * BYTES_PER_ROW]
    }

    /// `C[m][n] += Σ_k Σ_{i<4} fa(A[m][4k+i]) · fb(B[k][4n+i])` in i32 with wrap-around.
    fn dot_bytes(&mut self, c: u8, a: u8, b: u8, fa: fn(u8) -> i32, fb: fn(u8) -> i32) {
        let (m, k4, n4) = (
            self.cfg.rows(c),
            self.cfg.colsb(a) / 4,
            self.cfg.colsb(c) / 4,
        );
        let mut out = [0u8; TILE_BYTES];
        for r in 0..m {
            let (arow, crow) = (self.row(a, r), self.row(c, r));
            for n in 0..n4 {
                let mut acc = i32::from_le_bytes(crow[4 * n..4 * n + 4].try_into().unwrap());
                for k in 0..k4 {
                    let brow = self.row(b, k);
                    for i in 0..4 {
                        let p = fa(arow[4 * k + i]).wrapping_mul(fb(brow[4 * n + i]));
                        acc = acc.wrapping_add(p);
                    }
                }
                out[r * BYTES_PER_ROW + 4 * n..][..4].copy_from_slice(&acc.to_le_bytes());
            }
        }
        // Bytes past colsb in each row, and rows past `m`, are zero.
        self.tiles[c as usize] = out;
    }

    /// The SDM's `tdpbf16ps`: per row, two f32 partial sums per output column, from zero —
    /// the even products `A[m][2k]·B[k][2n]` into one, the odd ones into the other, each an
    /// FMA over k with one rounding (denormals in and out as zero) — then their sum is added
    /// to `C[m][n]` (the sum rounded, then the addition; denormal `C` read as zero).
    fn dot_bf16(&mut self, c: u8, a: u8, b: u8) {
        let (m, k4, n4) = (
            self.cfg.rows(c),
            self.cfg.colsb(a) / 4,
            self.cfg.colsb(c) / 4,
        );
        let bf16 =
            |row: &[u8], i: usize| bf16_daz(u16::from_le_bytes([row[2 * i], row[2 * i + 1]]));
        let mut out = [0u8; TILE_BYTES];
        for r in 0..m {
            let (arow, crow) = (self.row(a, r), self.row(c, r));
            for n in 0..n4 {
                let mut part = [0.0f32; 2];
                for k in 0..k4 {
                    let brow = self.row(b, k);
                    for (i, p) in part.iter_mut().enumerate() {
                        // A product of two bf16 values is exact in f32: one rounding.
                        *p = ftz(bf16(arow, 2 * k + i).mul_add(bf16(brow, 2 * n + i), *p));
                    }
                }
                // A denormal C reads as zero too.
                let c0 = ftz(f32::from_le_bytes(
                    crow[4 * n..4 * n + 4].try_into().unwrap(),
                ));
                let acc = ftz(c0 + ftz(part[0] + part[1]));
                out[r * BYTES_PER_ROW + 4 * n..][..4].copy_from_slice(&acc.to_le_bytes());
            }
        }
        self.tiles[c as usize] = out;
    }
}

/// A bf16 value as f32, denormals read as (signed) zero.
fn bf16_daz(x: u16) -> f32 {
    let bits = (x as u32) << 16;
    if bits & 0x7f80_0000 == 0 {
        f32::from_bits(bits & 0x8000_0000)
    } else {
        f32::from_bits(bits)
    }
}

/// Denormal results flushed to (signed) zero.
fn ftz(x: f32) -> f32 {
    if x.is_subnormal() {
        f32::from_bits(x.to_bits() & 0x8000_0000)
    } else {
        x
    }
}

impl TileUnit for Emulated {
    fn open() -> Option<Emulated> {
        Some(Emulated::default())
    }

    fn int8(&self) -> bool {
        true
    }

    fn bf16(&self) -> bool {
        true
    }

    unsafe fn configure(&mut self, cfg: &TileConfig) {
        fault(cfg.check());
        self.cfg = *cfg;
        self.tiles = [[0; TILE_BYTES]; TILES];
    }

    unsafe fn release(&mut self) {
        self.cfg = TileConfig::released();
        self.tiles = [[0; TILE_BYTES]; TILES];
    }

    unsafe fn zero<const T: u8>(&mut self) {
        fault(self.cfg.check_tile("tilezero", T));
        self.tiles[T as usize] = [0; TILE_BYTES];
    }

    unsafe fn load<const T: u8>(&mut self, src: *const u8, stride: usize) {
        fault(self.cfg.check_tile("tileloadd", T));
        let (rows, colsb) = (self.cfg.rows(T), self.cfg.colsb(T));
        let mut tile = [0u8; TILE_BYTES];
        for r in 0..rows.min(MAX_ROWS) {
            // SAFETY: the caller's contract: `rows` rows of `colsb` bytes `stride` apart are
            // readable from `src`.
            let from = unsafe { std::slice::from_raw_parts(src.add(r * stride), colsb) };
            tile[r * BYTES_PER_ROW..r * BYTES_PER_ROW + colsb].copy_from_slice(from);
        }
        self.tiles[T as usize] = tile;
    }

    unsafe fn store<const T: u8>(&mut self, dst: *mut u8, stride: usize) {
        fault(self.cfg.check_tile("tilestored", T));
        let (rows, colsb) = (self.cfg.rows(T), self.cfg.colsb(T));
        for r in 0..rows {
            let from = &self.row(T, r)[..colsb];
            // SAFETY: the caller's contract: `rows` rows of `colsb` bytes `stride` apart are
            // writable from `dst` (and they are not this unit's own memory).
            let to = unsafe { std::slice::from_raw_parts_mut(dst.add(r * stride), colsb) };
            to.copy_from_slice(from);
        }
    }

    unsafe fn dpbusd<const C: u8, const A: u8, const B: u8>(&mut self) {
        fault(self.cfg.check_dot("tdpbusd", C, A, B));
        self.dot_bytes(C, A, B, |x| x as i32, |y| y as i8 as i32);
    }

    unsafe fn dpbssd<const C: u8, const A: u8, const B: u8>(&mut self) {
        fault(self.cfg.check_dot("tdpbssd", C, A, B));
        self.dot_bytes(C, A, B, |x| x as i8 as i32, |y| y as i8 as i32);
    }

    unsafe fn dpbf16ps<const C: u8, const A: u8, const B: u8>(&mut self) {
        fault(self.cfg.check_dot("tdpbf16ps", C, A, B));
        self.dot_bf16(C, A, B);
    }
}
