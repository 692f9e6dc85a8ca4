//! The 64-byte tile configuration `ldtilecfg` loads (palette 1), and the rules under which the
//! hardware faults (Intel SDM, `LDTILECFG`: `#GP`; the AMX tile operations: `#UD`), written
//! once: [`super::Tiles`] checks them before anything runs, [`super::Emulated`] raises them.
//!
//! Layout: byte 0 the palette, byte 1 `start_row`, bytes 2–15 reserved (zero), bytes 16–47
//! `colsb` of tiles 0–15 as little-endian u16 (only 0–7 exist in palette 1; the rest zero),
//! bytes 48–63 `rows` of tiles 0–15 (likewise).

use thiserror::Error;

/// Tile registers in palette 1.
pub const TILES: usize = 8;
/// Most rows a tile has in palette 1.
pub const MAX_ROWS: usize = 16;
/// Most bytes in a tile row in palette 1.
pub const BYTES_PER_ROW: usize = 64;
/// Bytes of one tile register.
pub const TILE_BYTES: usize = MAX_ROWS * BYTES_PER_ROW;

/// An operation the hardware would fault on (or, for `bounds`, one that would touch memory
/// outside the slice it was given).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("AMX {kind} in {op}: {reason}")]
pub struct TileFault {
    /// `#GP` (configuration), `#UD` (tile operation), or `bounds`.
    pub kind: &'static str,
    /// The instruction.
    pub op: &'static str,
    /// What does not fit.
    pub reason: String,
}

fn gp(reason: String) -> TileFault {
    TileFault {
        kind: "#GP",
        op: "ldtilecfg",
        reason,
    }
}

fn ud(op: &'static str, reason: String) -> TileFault {
    TileFault {
        kind: "#UD",
        op,
        reason,
    }
}

/// A tile configuration: the 64-byte, 64-aligned memory operand of `ldtilecfg`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C, align(64))]
pub struct TileConfig {
    bytes: [u8; 64],
}

impl Default for TileConfig {
    fn default() -> TileConfig {
        TileConfig::new()
    }
}

impl TileConfig {
    /// Palette 1 with no tile configured.
    pub fn new() -> TileConfig {
        let mut bytes = [0u8; 64];
        bytes[0] = 1;
        TileConfig { bytes }
    }

    /// Palette 0: the initial state (no tiles), what `tilerelease` returns to.
    pub fn released() -> TileConfig {
        TileConfig { bytes: [0; 64] }
    }

    /// These 64 bytes as a configuration (valid or not: see [`TileConfig::check`]).
    pub fn from_bytes(bytes: [u8; 64]) -> TileConfig {
        TileConfig { bytes }
    }

    /// The 64 bytes `ldtilecfg` reads.
    pub fn as_bytes(&self) -> &[u8; 64] {
        &self.bytes
    }

    /// This configuration with tile `t` shaped `rows × colsb` bytes. Panics if `t` is not a
    /// tile register or a value does not fit its field ([`TileConfig::check`] judges the rest).
    pub fn tile(mut self, t: u8, rows: usize, colsb: usize) -> TileConfig {
        let t = t as usize;
        assert!(t < TILES, "tmm{t}: palette 1 has tmm0..tmm7");
        self.bytes[48 + t] = u8::try_from(rows).expect("rows fit a byte");
        let colsb = u16::try_from(colsb).expect("colsb fits 16 bits");
        self.bytes[16 + 2 * t..18 + 2 * t].copy_from_slice(&colsb.to_le_bytes());
        self
    }

    /// The palette (0: released, 1: the one tiles use).
    pub fn palette(&self) -> u8 {
        self.bytes[0]
    }

    /// Rows of tile `t` (0 for tiles not configured).
    pub fn rows(&self, t: u8) -> usize {
        if (t as usize) < TILES {
            self.bytes[48 + t as usize] as usize
        } else {
            0
        }
    }

    /// Bytes per row of tile `t` (0 for tiles not configured).
    pub fn colsb(&self, t: u8) -> usize {
        let t = t as usize;
        if t < TILES {
            u16::from_le_bytes([self.bytes[16 + 2 * t], self.bytes[17 + 2 * t]]) as usize
        } else {
            0
        }
    }

    /// `ldtilecfg`'s checks: palette 0 or 1, reserved bytes zero, rows ≤ 16 and colsb ≤ 64
    /// per tile, rows and colsb both zero (tile unused) or both non-zero. A non-zero
    /// `start_row` (legal after an interrupted load) is refused too: nothing here resumes one.
    pub fn check(&self) -> Result<(), TileFault> {
        let b = &self.bytes;
        match b[0] {
            0 => {
                return Ok(());
            }
            1 => {}
            p => return Err(gp(format!("palette {p} (palettes 0 and 1 exist)"))),
        }
        if b[1] != 0 {
            return Err(gp(format!("start_row {} (only 0 is used here)", b[1])));
        }
        let reserved = [2..16, 16 + 2 * TILES..48, 48 + TILES..64];
        if let Some(i) = reserved.into_iter().flatten().find(|&i| b[i] != 0) {
            return Err(gp(format!("reserved byte {i} is {} (must be 0)", b[i])));
        }
        for t in 0..TILES as u8 {
            let (rows, colsb) = (self.rows(t), self.colsb(t));
            if rows > MAX_ROWS || colsb > BYTES_PER_ROW {
                return Err(gp(format!(
                    "tmm{t} is {rows} rows × {colsb} bytes (at most {MAX_ROWS} × {BYTES_PER_ROW})"
                )));
            }
            if (rows == 0) != (colsb == 0) {
                return Err(gp(format!(
                    "tmm{t} is {rows} rows × {colsb} bytes (both zero or neither)"
                )));
            }
        }
        Ok(())
    }

    /// That tiles are configured and `t` is one of them (`#UD` otherwise).
    pub fn check_tile(&self, op: &'static str, t: u8) -> Result<(), TileFault> {
        if self.palette() != 1 {
            return Err(ud(op, "tiles are not configured".into()));
        }
        if t as usize >= TILES || self.rows(t) == 0 {
            return Err(ud(op, format!("tmm{t} is not configured")));
        }
        Ok(())
    }

    /// That a load or store of tile `t`, rows `stride` bytes apart, stays within `len` bytes.
    pub fn check_memory(
        &self,
        op: &'static str,
        t: u8,
        len: usize,
        stride: usize,
    ) -> Result<(), TileFault> {
        self.check_tile(op, t)?;
        let (rows, colsb) = (self.rows(t), self.colsb(t));
        let end = (rows - 1)
            .checked_mul(stride)
            .and_then(|x| x.checked_add(colsb));
        match end {
            Some(end) if end <= len => Ok(()),
            _ => Err(TileFault {
                kind: "bounds",
                op,
                reason: format!(
                    "tmm{t}: {rows} rows of {colsb} bytes, {stride} apart, need more than the \
                     {len} bytes given"
                ),
            }),
        }
    }

    /// The shape rules of `tdpbusd`/`tdpbssd`/`tdpbf16ps tmmC, tmmA, tmmB`: three distinct
    /// configured tiles, C `M × 4N` bytes, A `M × 4K`, B `K × 4N` (rows of 4-byte groups).
    pub fn check_dot(&self, op: &'static str, c: u8, a: u8, b: u8) -> Result<(), TileFault> {
        for t in [c, a, b] {
            self.check_tile(op, t)?;
        }
        if c == a || c == b || a == b {
            return Err(ud(op, format!("tmm{c}, tmm{a}, tmm{b} are not distinct")));
        }
        let shape = |t| (self.rows(t), self.colsb(t));
        let ((cm, cn), (am, ak), (bk, bn)) = (shape(c), shape(a), shape(b));
        let fits = cn % 4 == 0 && ak % 4 == 0 && cm == am && ak / 4 == bk && cn == bn;
        if fits {
            Ok(())
        } else {
            Err(ud(
                op,
                format!(
                    "shapes do not fit: tmm{c} {cm}×{cn}, tmm{a} {am}×{ak}, tmm{b} {bk}×{bn} \
                     (rows × bytes; need C M×4N, A M×4K, B K×4N)"
                ),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_is_palette_colsb_then_rows() {
        let c = TileConfig::new().tile(0, 16, 64).tile(7, 3, 12);
        let b = c.as_bytes();
        assert_eq!(std::mem::align_of::<TileConfig>(), 64);
        assert_eq!(std::mem::size_of::<TileConfig>(), 64);
        assert_eq!((b[0], b[1]), (1, 0));
        assert_eq!((b[16], b[17], b[30], b[31]), (64, 0, 12, 0));
        assert_eq!((b[48], b[55]), (16, 3));
        assert_eq!(
            (c.rows(7), c.colsb(7), c.rows(3), c.colsb(3)),
            (3, 12, 0, 0)
        );
        assert_eq!(c.check(), Ok(()));
        assert_eq!(TileConfig::released().check(), Ok(()));
    }

    #[test]
    fn invalid_configurations_are_general_protection_faults() {
        let bad = |c: TileConfig, what: &str| {
            let e = c.check().unwrap_err();
            assert_eq!(e.kind, "#GP");
            assert!(e.reason.contains(what), "{e}");
        };
        bad(TileConfig::new().tile(2, 17, 64), "at most 16 × 64");
        bad(TileConfig::new().tile(2, 16, 65), "at most 16 × 64");
        bad(TileConfig::new().tile(2, 0, 64), "both zero or neither");
        bad(TileConfig::new().tile(2, 4, 0), "both zero or neither");
        for (i, what) in [(0, "palette 2"), (1, "start_row"), (9, "reserved byte 9")] {
            let mut b = *TileConfig::new().as_bytes();
            b[i] = 2;
            bad(TileConfig::from_bytes(b), what);
        }
        for i in [32, 47, 56, 63] {
            let mut b = *TileConfig::new().as_bytes();
            b[i] = 1;
            bad(TileConfig::from_bytes(b), &format!("reserved byte {i}"));
        }
    }

    #[test]
    fn operations_check_tiles_extents_and_shapes() {
        let c = TileConfig::new()
            .tile(0, 16, 64)
            .tile(1, 16, 64)
            .tile(2, 16, 64)
            .tile(3, 8, 32)
            .tile(4, 8, 64);
        assert_eq!(c.check_dot("tdpbusd", 0, 1, 2), Ok(()));
        // C 8×32 = A 8×64 · B 16×32: M = 8, K = 16, N = 8.
        assert_eq!(c.check_dot("tdpbusd", 3, 4, 1).unwrap_err().kind, "#UD");
        let c2 = c.tile(5, 16, 32);
        assert_eq!(c2.check_dot("tdpbusd", 3, 4, 5), Ok(()));
        assert!(c.check_dot("tdpbusd", 0, 0, 2).is_err(), "not distinct");
        assert!(c.check_dot("tdpbusd", 0, 1, 6).is_err(), "tmm6 unused");
        assert!(c.check_dot("tdpbusd", 0, 4, 2).is_err(), "rows differ");
        let odd = TileConfig::new().tile(0, 2, 6).tile(1, 2, 8).tile(2, 2, 6);
        assert!(odd.check_dot("tdpbusd", 0, 1, 2).is_err(), "colsb not 4N");
        assert!(TileConfig::released().check_tile("tilezero", 0).is_err());
        // 16 rows of 64 bytes, 100 apart: 15·100 + 64 bytes.
        assert_eq!(c.check_memory("tileloadd", 0, 1564, 100), Ok(()));
        let e = c.check_memory("tileloadd", 0, 1563, 100).unwrap_err();
        assert_eq!(e.kind, "bounds");
        assert!(c.check_memory("tileloadd", 0, 1 << 20, usize::MAX).is_err());
    }
}
