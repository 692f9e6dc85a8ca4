//! `AUTOKERNEL_LINGER_US=0`: helpers leave as soon as their loop has no items left, and loops
//! still run every item, from the caller's thread and from a runtime's own pool. The only
//! test of its binary: the setting is read once per process, before the first loop.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kernels::cpu::pool::{for_each, within, OwnPool, Workers};
use kernels::cpu::{linger, LINGER_ENV};

#[test]
fn loops_run_every_item_with_lingering_off() {
    std::env::set_var(LINGER_ENV, "0");
    assert_eq!(linger(), Ok(Duration::ZERO));
    let own = Arc::new(OwnPool::new(2).unwrap());
    for round in 0..200 {
        let sum = AtomicUsize::new(0);
        let add = |i: usize| {
            sum.fetch_add(i, Ordering::Relaxed);
        };
        for_each(2, (0..64).collect(), add);
        within(&Workers::Pool(own.clone()), || {
            for_each(2, (0..64).collect(), add)
        });
        if round % 50 == 0 {
            // Calls after a gap find no helper awake and must not wait for one.
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(sum.into_inner(), 2 * 2016, "round {round}");
    }
}
